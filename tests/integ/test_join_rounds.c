/* ct-timeout: 900 */
/* How peers come into and keep to a collaboration's rounds (issue 5; seed
 * 000 §3.2), with real `crowdtrain-agent join` processes on hosts of their
 * own (tests/harness/ct_join.h; loopback where namespaces cannot be made):
 *
 *  - newcomers: three agents arriving at once at a run one agent trained
 *    alone take its state, though they outnumber it (no fork at step 1);
 *  - with --delayed-updates the averaging overlaps the next accumulation and
 *    the peers still stay identical;
 *  - volunteers whose clocks are seconds off still average every step
 *    together.
 * Training to accuracy, chaos and faults are in test_join.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_join.h"
#include "ct_steps.h"

#define NAGENTS CT_JOIN_AGENTS

/* Under AddressSanitizer the agents run ~3x slower: shorter runs. */
#if defined(__SANITIZE_ADDRESS__)
#define SHORT_RUN 1
#else
#define SHORT_RUN 0
#endif

static struct ct_join g_j;
static int g_teardown_failed;

/* Agent i on run `run`, with this file's round window and margin. */
static pid_t spawn_agent(int i, const char *run, const char *log, const char *steplog, const char *const *extra)
{
    return ct_join_spawn(&g_j, g_j.dirs[i], i, run, log, steplog, extra, CT_JOIN_WINDOW_MS, CT_JOIN_MARGIN_MS);
}

/* One agent trains alone on the first run before the others start
   (test_newcomers); the other tests make runs of their own. */
static int setup(void **state);
static int teardown(void **state)
{
    (void)state;
    int rc = ct_join_teardown(&g_j);
    g_teardown_failed = rc != 0;
    return rc;
}

/* ---- newcomers outnumbering the collaboration ------------------------------ */

/* One agent trains alone (a volunteer who started the run) until step
 * NEW_AT; then three newcomers start at once. At step 0 they outnumber it,
 * and counted as peers at a step they once were the collaboration: they
 * stepped 0 -> 1 among themselves, a fork (the veteran then even took their
 * state, losing its steps). A newcomer takes the state of a peer that
 * applied a round (accum.c, misplaced): every step has one hash, and no
 * newcomer's first own step is at or before the veteran's step when they
 * came. */
/* 20 steps once left a newcomer no round of its own: a fresh clone's run
   ended while it was still taking the others' state (its step log had
   only synced steps); the passing runs took their first own step 2-3
   steps after arriving */
#define NEW_STEPS (SHORT_RUN ? 20 : 40)
#define NEW_AT 4

static void test_newcomers(void **state)
{
    (void)state;
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    const char *extra[] = {"--no-eval", NULL};
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/new.log", g_j.dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/new.steps", g_j.dirs[i]);
    }
    pids[0] = spawn_agent(0, "fmnist-new", logs[0], steplogs[0], extra);
    assert_true(pids[0] > 0);
    assert_true(ct_join_wait_step(logs[0], NEW_AT, 120));
    long at = ct_join_last_step(logs[0]);
    for (int i = 1; i < NAGENTS; i++) {
        pids[i] = spawn_agent(i, "fmnist-new", logs[i], steplogs[i], extra);
        assert_true(pids[i] > 0);
    }
    for (int i = 0; i < NAGENTS; i++)
        assert_int_equal(ct_wait(pids[i], 900), 0);
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    ct_steps_fold(steplogs[0], &st, "veteran");
    long first_new = NEW_STEPS + 1;
    for (int i = 1; i < NAGENTS; i++) {
        long f = ct_steps_fold(steplogs[i], &st, "newcomer");
        printf("newcomer %d: first step of its own %ld (the veteran was at %ld when they came)\n", i, f, at);
        if (f <= at) {
            char *log = ct_read_file(logs[i], NULL);
            const char *tail = log && strlen(log) > 3000 ? log + strlen(log) - 3000 : log;
            printf("newcomer %d's log ends:\n%s\n", i, tail ? tail : "(none)");
            free(log);
        }
        assert_true(f > at);
        first_new = f < first_new ? f : first_new;
    }
    assert_int_equal(st.mismatches, 0);
    /* and they trained together: from the newcomers' first step on, no
       round was one agent's alone, and most held all four (a member whose
       micro-batch runs over the 100 ms window joins the next round: under
       the sanitizers 2 of 9 rounds missed one) */
    int all_in = 0, alone = 0;
    for (long k = first_new; k <= NEW_STEPS; k++) {
        all_in += st.members[k] == NAGENTS;
        alone += st.members[k] < 2;
    }
    long rounds = NEW_STEPS - first_new + 1;
    printf("newcomers: rounds of all %d from step %ld: %d of %ld, of one agent alone: %d\n", NAGENTS, first_new,
           all_in, rounds, alone);
    assert_true(first_new <= NEW_STEPS - 4);
    assert_int_equal(alone, 0);
    assert_true(all_in >= 2 * rounds / 3);
}

/* ---- delayed parameter updates --------------------------------------------- */

#define DPU_STEPS (SHORT_RUN ? 20 : 40)

static void test_delayed_updates(void **state)
{
    (void)state;
    /* Once opt-in (CT_TEST_DPU=1): of 8 runs, 1 failed (two agents ran
       ahead as a pair and the two others, catching up with a round always
       in flight, never joined them: steps here take 0.3 s) and 1 took 56 s
       instead of 13. The peers that announced a round first publish the
       next step at once, and the others took them for a collaboration
       ahead of them instead of joining the round (docs/collaboration.md,
       "Delayed parameter updates"). Earlier failures, also mended: a split
       at start-up persisted (the divergence check compared hashes at the
       progress step), and peers that had joined ahead of a round in flight
       which was then declined waited minutes for the same missing state. */
    /* A larger batch, so computing a step takes about as long as averaging
       it (what delayed updates are for) and a peer that starts late has the
       time to load a state before the collaboration's next round. */
    g_j.target = 8192;
    /* one step of staleness: the recipe's learning rate (tuned without it)
       makes the loss jump for a while; a smaller one trains smoothly. 0.002
       was not small enough: the loss fell to ~1.1 by step 11, bounced back
       to ~2.0 by step 16 and came down again, so where step 20 (the
       sanitizer build's last) fell in that bounce decided the check below
       (nine runs: 1.45-1.89 against the bound 1.85; one fresh-clone
       make test failed on it). With 0.001 the descent is smooth: 0.92-0.93
       at step 20 in five sanitizer runs, 0.73-0.76 at step 40 in three
       normal ones, every round with all four members. */
    g_j.lr = 0.001;
    int crc = ct_join_create_run(&g_j, "fmnist-dpu", DPU_STEPS);
    g_j.target = 0;
    g_j.lr = 0;
    assert_int_equal(crc, 0);
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/dpu.log", g_j.dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/dpu.steps", g_j.dirs[i]);
        const char *extra[] = {"--no-eval", "--delayed-updates", NULL};
        pids[i] = spawn_agent(i, "fmnist-dpu", logs[i], steplogs[i], extra);
    }
    for (int i = 0; i < NAGENTS; i++)
        assert_int_equal(ct_wait(pids[i], 900), 0);
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < NAGENTS; i++)
        ct_steps_fold(steplogs[i], &st, "agent");
    if (getenv("CT_KEEP_LOGS"))
        for (int i = 0; i < NAGENTS; i++) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "cp %s /tmp/dpu-%d.steps; cp %s /tmp/dpu-%d.log", steplogs[i], i,
                     logs[i], i);
            if (system(cmd) != 0)
                printf("could not keep the logs\n");
        }
    assert_int_equal(st.mismatches, 0);
    assert_int_equal(st.nan_losses, 0);
    for (long k = 1; k <= DPU_STEPS; k++)
        if (!st.hash[k][0])
            fail_msg("no agent logged step %ld", k);
    /* The collaboration trained together, not one peer alone while the
       others waited: once everyone is in (the first steps may precede a
       slow starter), the rounds had all or all but one of the agents. A
       run once passed the checks above with one agent taking steps 3-40
       alone while the three others were stuck fetching states. */
    int together = 0;
    for (long k = 1; k <= DPU_STEPS; k++)
        together += st.members[k] >= NAGENTS - 1;
    printf("delayed updates: %d of %d steps had at least %d members\n", together, DPU_STEPS, NAGENTS - 1);
    assert_true(together >= DPU_STEPS * 3 / 4);
    /* and it did not stall: healthy runs take 13 s from the first step to
       the last here; a run whose peers waited on each other's states took
       205 s (and still passed the checks above) */
    printf("delayed updates: steps 1-%d took %.1f s\n", DPU_STEPS, st.span_s);
    assert_true(st.span_s < 90);
    /* the averaging (gathering the members, the all-reduce, the outcome
       agreement) ran under the next accumulation: the step loop waited for
       the rounds less than they took, by at least half the computing done
       meanwhile (here computing is much shorter than a round, so the loop
       still waits most of a round) */
    double wait = 0, round = 0, compute = 0;
    FILE *f = fopen(steplogs[0], "r");
    assert_non_null(f);
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        wait += json_number_value(json_object_get(j, "wait_s"));
        round += json_number_value(json_object_get(j, "round_s"));
        compute += json_number_value(json_object_get(j, "compute_s"));
        json_decref(j);
    }
    fclose(f);
    printf("delayed updates: rounds took %.2f s in all, the loop waited %.2f s for them, computing "
           "took %.2f s\n", round, wait, compute);
    if (round == 0 || wait > round - 0.5 * compute) {
        char *t = ct_read_file(steplogs[0], NULL);
        printf("%s\n", t ? t : "");
        free(t);
    }
    assert_true(round > 0);
    assert_true(compute > 0);
    assert_true(wait <= round - 0.5 * compute);
    double first = st.loss_sum[1] / st.samples[1], last = st.loss_sum[DPU_STEPS] / st.samples[DPU_STEPS];
    printf("loss %.3f at step 1, %.3f at step %d\n", first, last, DPU_STEPS);
    assert_true(last < 0.8 * first);
}

/* ---- volunteers' clocks set wrong ------------------------------------------ */

/* A round's members are the peers that announce within a window (150 ms
 * here) of the first, by the times the announcers wrote: a volunteer whose
 * clock is seconds off would never be in the others' window. The agents
 * read the coordinator's clock (GET /api/v1/time) and write its time: one
 * agent's clock set 3 s ahead and another's 2 s behind (a test-only
 * setting of the agent), all four still average every step together. */
#define CLOCK_STEPS 20

static void test_clock_skew(void **state)
{
    (void)state;
    assert_int_equal(ct_join_create_run(&g_j, "fmnist-clock", CLOCK_STEPS), 0);
    static const char *const skew[NAGENTS] = {NULL, "20000", "-15000", NULL};
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/clock.log", g_j.dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/clock.steps", g_j.dirs[i]);
        const char *extra[] = {"--no-eval", NULL};
        if (skew[i])
            setenv("CROWDTRAIN_TEST_CLOCK_SKEW_MS", skew[i], 1);
        pids[i] = spawn_agent(i, "fmnist-clock", logs[i], steplogs[i], extra);
        unsetenv("CROWDTRAIN_TEST_CLOCK_SKEW_MS");
    }
    for (int i = 0; i < NAGENTS; i++)
        assert_int_equal(ct_wait(pids[i], 600), 0);
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < NAGENTS; i++)
        ct_steps_fold(steplogs[i], &st, "agent");
    assert_int_equal(st.mismatches, 0);
    /* each skewed agent took part in the rounds (its own step log: the
       round's members), not in states fetched after rounds without it */
    for (int i = 1; i <= 2; i++) {
        static struct ct_steps mine;
        memset(&mine, 0, sizeof mine);
        ct_steps_fold(steplogs[i], &mine, "skewed agent");
        int all = 0;
        for (long k = 1; k <= CLOCK_STEPS; k++)
            all += mine.members[k] == NAGENTS;
        printf("agent %d (clock %s ms): %d of %d steps averaged with all %d agents\n", i, skew[i], all,
               CLOCK_STEPS, NAGENTS);
        assert_true(all >= CLOCK_STEPS * 3 / 4);
        char *log = ct_read_file(logs[i], NULL);
        assert_non_null(log);
        assert_non_null(strstr(log, i == 1 ? "clock: this machine's is 20.0 s ahead of the coordinator's"
                                           : "clock: this machine's is 15.0 s behind the coordinator's"));
        free(log);
    }
}

static int setup(void **state)
{
    (void)state;
    return ct_join_setup(&g_j, "fmnist-new", NEW_STEPS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_newcomers),
        cmocka_unit_test(test_delayed_updates),
        cmocka_unit_test(test_clock_skew),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
