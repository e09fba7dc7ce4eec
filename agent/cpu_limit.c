/* The volunteer's CPU limit: a bucket of core-seconds drained by the
 * process's CPU time (design and accuracy in cpu_limit.h). */
#include "agent/cpu_limit.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

void agent_cpu_limit_init(struct agent_cpu_limit *l, double percent, int ncpu)
{
    l->cores = percent > 0 && ncpu > 0 ? percent / 100.0 * ncpu : 0;
    agent_cpu_limit_restart(l);
}

void agent_cpu_limit_restart(struct agent_cpu_limit *l)
{
    l->tokens = 0;
    l->wall = l->cpu = 0;
    l->started = 0;
}

int agent_cpu_limit_threads(double percent, int ncpu)
{
    if (!(percent > 0) || ncpu < 1)
        return 0;
    int t = (int)ceil(percent / 100.0 * ncpu - 1e-9);
    return t < 1 ? 1 : t > ncpu ? ncpu : t;
}

int agent_cpu_count(void)
{
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

double agent_cpu_limit_account(struct agent_cpu_limit *l, double wall_s, double cpu_s)
{
    if (!(l->cores > 0))
        return 0;
    if (!l->started) {
        /* no credit at the start: the first window is held to the budget too */
        l->started = 1;
        l->wall = wall_s;
        l->cpu = cpu_s;
        l->tokens = 0;
        return 0;
    }
    double dw = wall_s - l->wall, dc = cpu_s - l->cpu;
    if (dw > 0)
        l->wall = wall_s;
    if (dc > 0)
        l->cpu = cpu_s;
    l->tokens += l->cores * (dw > 0 ? dw : 0) - (dc > 0 ? dc : 0);
    double cap = l->cores * AGENT_CPU_BURST_S;
    if (l->tokens > cap)
        l->tokens = cap;
    return l->tokens < 0 ? -l->tokens / l->cores : 0;
}

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

double agent_cpu_limit_wait_s(struct agent_cpu_limit *l)
{
    if (!(l->cores > 0))
        return 0;
    return agent_cpu_limit_account(l, clock_s(CLOCK_MONOTONIC), clock_s(CLOCK_PROCESS_CPUTIME_ID));
}

void agent_cpu_limit_pace(struct agent_cpu_limit *l, const volatile sig_atomic_t *stop)
{
    double w;
    while ((w = agent_cpu_limit_wait_s(l)) > 0 && !(stop && *stop))
        usleep((useconds_t)(w > 0.1 ? 100000 : w * 1e6 + 1));
}

void agent_cpu_limit_apply(struct agent_cpu_limit *l, double percent, int *threads)
{
    /* no more compute threads than the budget's cores */
    int ncpu = agent_cpu_count(), t = agent_cpu_limit_threads(percent, ncpu);
    if (*threads == 0 || *threads > t)
        *threads = t;
    agent_cpu_limit_init(l, percent, ncpu);
    printf("CPU limit: %g%% of %d cores (%.2f cores' worth): %d compute thread%s, paced between "
           "micro-batches\n", percent, ncpu, l->cores, *threads, *threads == 1 ? "" : "s");
}
