/* A volunteer's CPU limit (`--max-cpu-percent P` of `join` and `train
 * --local`; docs/collaboration.md, "Resource limits"): the agent uses at
 * most about P % of the machine's CPU time, all cores counted (P = 25 on a
 * machine of 8 cores: two cores' worth), measured over the whole process
 * (compute threads, the network thread's averaging, the data stream).
 *
 * Two parts. The CPU backend gets ceil(P/100 x cores) compute threads, so
 * no more cores than the budget are busy at once. A duty cycle then holds
 * the average: a bucket of core-seconds refills at the budget's rate
 * (P/100 x cores per second of wall time, at most AGENT_CPU_BURST_S
 * seconds' worth kept) and is drained by the process's CPU time
 * (CLOCK_PROCESS_CPUTIME_ID); when it is empty the caller pauses until the
 * debt is paid. The callers check between units of work (a micro-batch, a
 * local step): work already started (an averaging round the other peers
 * wait for) runs to its end and is paid for afterwards. Over any window of
 * T seconds of training the agent's CPU time is then at most
 * budget x (T + AGENT_CPU_BURST_S) plus one unit of work.
 *
 * Not thread-safe: one caller (the training thread). */
#ifndef AGENT_CPU_LIMIT_H
#define AGENT_CPU_LIMIT_H

#include <signal.h>

/* Credit kept while under the budget, in seconds of the budget. */
#define AGENT_CPU_BURST_S 1.0

struct agent_cpu_limit {
    double cores;   /* the budget in cores (P/100 x online CPUs); 0: no limit */
    double tokens;  /* core-seconds that may still be used (negative: the debt) */
    double wall, cpu; /* at the last update, seconds */
    int started;
};

/* A limit of `percent` (0: none; else (0, 100]) of `ncpu` cores. */
void agent_cpu_limit_init(struct agent_cpu_limit *l, double percent, int ncpu);
/* Compute threads for the budget: ceil(percent/100 x ncpu), at least 1
   (0 when there is no limit: the backend's default, one per core). */
int agent_cpu_limit_threads(double percent, int ncpu);
/* A role's --max-cpu-percent (> 0): *threads capped at the budget's cores
   (0 = all becomes that), l initialised, and the limit said on stdout. */
void agent_cpu_limit_apply(struct agent_cpu_limit *l, double percent, int *threads);
/* Online CPUs (at least 1). */
int agent_cpu_count(void);

/* Accounts wall and process CPU time (seconds, any origin, nondecreasing)
 * since the last call and returns how long to stay idle to pay the debt (0:
 * none). The first call only starts the count. Pure: the tests feed it
 * times. */
double agent_cpu_limit_account(struct agent_cpu_limit *l, double wall_s, double cpu_s);
/* The same with the clocks read now. 0 when there is no limit. */
double agent_cpu_limit_wait_s(struct agent_cpu_limit *l);
/* Forgets the history (after a pause: idle time earns no credit beyond the
   burst anyway, but a fresh start is simpler to reason about). */
void agent_cpu_limit_restart(struct agent_cpu_limit *l);
/* Sleeps until the debt is paid, in slices of at most 100 ms, returning
   early when *stop becomes nonzero (Ctrl-C). No-op without a limit. */
void agent_cpu_limit_pace(struct agent_cpu_limit *l, const volatile sig_atomic_t *stop);

#endif
