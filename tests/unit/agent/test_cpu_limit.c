/* Unit tests for agent/cpu_limit.c, the volunteer's --max-cpu-percent:
 * the budget in cores and compute threads; the bucket holds a process that
 * computes flat out to the budget over any window (the waits it asks for),
 * keeps at most AGENT_CPU_BURST_S of credit from idle time, gives a process
 * under the budget no wait, and counts CPU time spent between checks (an
 * averaging round) as debt paid afterwards. Fed synthetic clocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "agent/cpu_limit.h"

static void test_budget_and_threads(void **state)
{
    (void)state;
    struct agent_cpu_limit l;
    agent_cpu_limit_init(&l, 25, 8);
    assert_true(fabs(l.cores - 2.0) < 1e-12);
    agent_cpu_limit_init(&l, 0, 8);
    assert_true(l.cores == 0);
    assert_true(agent_cpu_limit_account(&l, 0, 0) == 0 && agent_cpu_limit_account(&l, 1, 5) == 0);
    assert_int_equal(agent_cpu_limit_threads(25, 8), 2);
    assert_int_equal(agent_cpu_limit_threads(25, 2), 1);  /* half a core: one thread */
    assert_int_equal(agent_cpu_limit_threads(30, 8), 3);  /* 2.4 cores: 3 */
    assert_int_equal(agent_cpu_limit_threads(1, 2), 1);
    assert_int_equal(agent_cpu_limit_threads(100, 16), 16);
    assert_int_equal(agent_cpu_limit_threads(0, 16), 0);  /* no limit: the backend's default */
}

/* A process with `threads` busy threads computing units of `unit` wall
 * seconds, waiting what the limit asks between them, for `total` seconds;
 * returns its CPU time over [from, total]. */
static double simulate(struct agent_cpu_limit *l, double threads, double unit, double total, double from)
{
    double wall = 0, cpu = 0, cpu_from = -1;
    agent_cpu_limit_account(l, wall, cpu);
    while (wall < total) {
        if (cpu_from < 0 && wall >= from)
            cpu_from = cpu;
        wall += unit;
        cpu += threads * unit;
        double w = agent_cpu_limit_account(l, wall, cpu);
        wall += w; /* idle: no CPU */
    }
    return cpu - (cpu_from < 0 ? 0 : cpu_from);
}

static void test_flat_out_held_to_budget(void **state)
{
    (void)state;
    struct agent_cpu_limit l;
    /* 25 % of 4 cores = 1 core; two threads busy, 10 ms micro-batches */
    agent_cpu_limit_init(&l, 25, 4);
    double cpu = simulate(&l, 2, 0.01, 60, 0);
    assert_true(cpu <= 1.0 * 60 + 0.02 + 1e-9);
    assert_true(cpu >= 1.0 * 60 * 0.98);
    /* any later window: at most the budget plus the burst plus one unit */
    agent_cpu_limit_init(&l, 25, 4);
    cpu = simulate(&l, 2, 0.01, 40, 30);
    assert_true(cpu <= 1.0 * (10 + AGENT_CPU_BURST_S) + 0.02 + 1e-9);
    assert_true(cpu >= 1.0 * 10 * 0.95);
}

static void test_idle_credit_is_capped(void **state)
{
    (void)state;
    struct agent_cpu_limit l;
    agent_cpu_limit_init(&l, 50, 2); /* one core */
    assert_true(agent_cpu_limit_account(&l, 100, 10) == 0); /* starts the count */
    /* an hour idle earns AGENT_CPU_BURST_S of credit, no more */
    assert_true(agent_cpu_limit_account(&l, 3700, 10) == 0);
    assert_true(fabs(l.tokens - AGENT_CPU_BURST_S) < 1e-9);
    /* 3 CPU-s at once then owe 2 s of idleness */
    double w = agent_cpu_limit_account(&l, 3700, 13);
    assert_true(fabs(w - 2.0) < 1e-9);
}

static void test_under_budget_never_waits(void **state)
{
    (void)state;
    struct agent_cpu_limit l;
    agent_cpu_limit_init(&l, 50, 2); /* one core */
    double wall = 0, cpu = 0;
    agent_cpu_limit_account(&l, wall, cpu);
    for (int i = 0; i < 1000; i++) {
        wall += 0.01;
        cpu += 0.009; /* 0.9 of a core */
        assert_true(agent_cpu_limit_account(&l, wall, cpu) == 0);
    }
}

static void test_round_paid_afterwards(void **state)
{
    (void)state;
    struct agent_cpu_limit l;
    agent_cpu_limit_init(&l, 25, 2); /* half a core */
    agent_cpu_limit_account(&l, 0, 0);
    /* a round of 2 s wall that used 1.6 CPU-s (the network thread averaging),
       no check in between: 1.6 - 0.5 x 2 = 0.6 core-s owed, 1.2 s of waiting */
    double w = agent_cpu_limit_account(&l, 2, 1.6);
    assert_true(fabs(w - 1.2) < 1e-9);
    /* waiting it out (no CPU) clears it */
    assert_true(agent_cpu_limit_account(&l, 3.2, 1.6) == 0);
    /* clocks that step back (a restart of the count, a bad read) add nothing */
    assert_true(agent_cpu_limit_account(&l, 3.0, 1.0) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_threads),
        cmocka_unit_test(test_flat_out_held_to_budget),
        cmocka_unit_test(test_idle_credit_is_capped),
        cmocka_unit_test(test_under_budget_never_waits),
        cmocka_unit_test(test_round_paid_afterwards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
