/* The test bed of the `crowdtrain-agent join` tests (tests/integ/test_join*.c):
 * PostgreSQL and the coordinator on one host of a network-namespace switch
 * (tests/harness/ct_net.h; on loopback where namespaces cannot be made),
 * an organizer, and CT_JOIN_AGENTS volunteers each logged in from a host of
 * its own, with what those tests share: runs made from the Fashion-MNIST
 * recipe, agents started with a volunteer's command line, and the agents'
 * console lines read back. */
#ifndef CT_JOIN_H
#define CT_JOIN_H

#include <sys/types.h>

#include "ct_harness.h"
#include "ct_net.h"

#define CT_JOIN_AGENTS 4

/* The round window and gathering margin of the agents. One switch or
   loopback: announcements propagate in milliseconds (the margin grows by
   itself when they do not: 3x the agent's slowest recent announcement). */
#define CT_JOIN_WINDOW_MS "100"
#define CT_JOIN_MARGIN_MS "30"

struct ct_join {
    struct ct_pg pg;
    struct ct_coord c;
    struct ct_net net;
    int hosts;                   /* agents on hosts of their own (else loopback) */
    int host[CT_JOIN_AGENTS];    /* agent i's host in net */
    char *org;                   /* the organizer's session */
    char dirs[CT_JOIN_AGENTS][256];
    long target;                 /* target batch of the next run created; 0: the recipe's */
    double lr;                   /* its learning rate; 0: the recipe's */
};

/* Hosts, PostgreSQL, the coordinator (passes live 90 s, so agents renew
 * them during a run), the organizer, run `run` of `steps` steps (0: the
 * recipe's) and the volunteers vol0.. allowed on it, logged in where their
 * agents run. Exits 77 when PostgreSQL or Fashion-MNIST is missing. */
int ct_join_setup(struct ct_join *j, const char *run, long steps);
/* Stops all of it; the volunteers' directories are removed unless
 * CT_KEEP_LOGS is set. Returns the coordinator's exit status check. */
int ct_join_teardown(struct ct_join *j);
/* The recipe as a run's body, with j->target and j->lr. */
char *ct_join_run_body(const struct ct_join *j, const char *name, long steps);
/* Creates the run and allows vol0.. on it; 0 or -1. */
int ct_join_create_run(struct ct_join *j, const char *name, long steps);
/* Agent i (on host j->host[i]) of run `run` with the state dir `dir`, as a
 * volunteer types it (no address flags on a host of its own). */
pid_t ct_join_spawn(const struct ct_join *j, const char *dir, int i, const char *run, const char *log,
                    const char *steplog, const char *const *extra, const char *window_ms, const char *margin_ms);
/* The step an agent's console log shows last (its progress line), or -1;
 * 1 once it shows `step` within timeout_s, else 0; the test accuracy of its
 * final evaluation, or -1. */
long ct_join_last_step(const char *log);
int ct_join_wait_step(const char *log, long step, int timeout_s);
double ct_join_accuracy(const char *log);

#endif
