/* A collaboration of `crowdtrain-agent join` processes on hosts of the
 * network-namespace test bed (tests/harness/ct_net.h), as test_hosts runs
 * several of them at once: starting the agents with a volunteer's command
 * line, noting when each learnt its reachability, reaping them, and reading
 * their step logs' hole-punching counts. */
#ifndef CT_HOSTRUN_H
#define CT_HOSTRUN_H

#include <sys/types.h>

#include "ct_net.h"

#define CT_HOSTRUN_MAX 8

struct ct_hostrun {
    const char *run;
    long nsteps; /* the run's steps; 0: the test's default */
    int eval;    /* evaluate at the end (the others train with --no-eval) */
    int relay_free; /* the run's relay_traffic: "ignored" (the schedule then gives
                       relayed agents parts as if they were direct) */
    const char *extra_of[CT_HOSTRUN_MAX][7]; /* flags of agent i alone (NULL-terminated) */
    int n;
    int host[CT_HOSTRUN_MAX];
    char dir[CT_HOSTRUN_MAX][256], log[CT_HOSTRUN_MAX][320], steps[CT_HOSTRUN_MAX][320];
    pid_t pid[CT_HOSTRUN_MAX];
    double t0;                       /* when the agents were started (monotonic s) */
    double reach_at[CT_HOSTRUN_MAX]; /* when each printed its reachability line */
    int status[CT_HOSTRUN_MAX];      /* exit status once reaped, -1 before */
};

double ct_hostrun_now(void); /* monotonic seconds */
/* Starts the agents on their hosts of net; extra0, extra1 (may be NULL)
 * are flags for all of them. A run that trains to its accuracy (eval)
 * evaluates at the end and takes a 100 ms round window and a 30 ms
 * gathering margin (defaults 300 and 150: the window is sized for the
 * Internet's delays, which the test bed does not have; at the defaults 500
 * steps took 0.55 s each, 0.45 s of them waiting). */
int ct_hostrun_start(struct ct_hostrun *c, const struct ct_net *net, const char *extra0, const char *extra1);
/* Notes when each agent printed its reachability line. */
void ct_hostrun_watch(struct ct_hostrun *c);
/* Reaps the agents that exited (status); how many are still running. */
int ct_hostrun_reap(struct ct_hostrun *c);
/* SIGKILLs the agents still running; ct_hostrun_cleanup also removes
 * their directories unless CT_KEEP_LOGS is set. */
void ct_hostrun_stop(struct ct_hostrun *c);
void ct_hostrun_cleanup(struct ct_hostrun *c);

/* Hole punching as one agent's step log saw it ("punched",
 * "relayed_aggs"): the most relayed aggregators reached through a punched
 * hole in one step, the most relayed aggregators, the first step with a
 * punched one, and how many steps from then on (after) had one (held). */
struct ct_punch_log {
    long most, relayed_aggs, first, held, after;
};
int ct_punch_log_read(const char *steplog, struct ct_punch_log *out);

#endif
