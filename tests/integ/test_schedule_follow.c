/* ct-timeout: 900 */
/* Agents follow adaptive-averaging schedules (issue 7; seed
 * 000_02cc6b5d62a616fc.txt §3.2): PostgreSQL, the coordinator and four real
 * `crowdtrain-agent join` processes on loopback train the Fashion-MNIST MLP,
 * two of them capped at FAST_MBPS and two at SLOW_MBPS (up and down, the
 * volunteer's --max-upload-mbps / --max-download-mbps). They report their
 * capabilities, get the signed schedule, plan each round with the version
 * the members announce, and write --step-log files.
 *
 * Checked: the run gets a schedule of all four peers which predicts rounds
 * under 0.8x of even all-reduce's; the rounds use it (sched_version in
 * the step logs); every agent holds the same parameters at every step; and
 * the measured averaging time of those rounds (the slowest member's
 * round_ms per step, median over the steps) is within 1.2x of what the LP
 * predicts for that schedule (1 / network_rate of its stored result:
 * bandwidth-only, no latency). Even all-reduce would take about 1.5x as
 * long here, so following the schedule is what makes the bound hold.
 *
 * It was opt-in for a while: the agents' pair probes shared the links with
 * the averaging (and with each other) and read 0.6-2.2 Mbit/s on 4 Mbit/s
 * links, or 71 Mbit/s on 40 with a token bucket's burst in a short probe;
 * the coordinator's role search stopped peers for gains below 0.1 %; and
 * at ties the LP could give the slow peers 25-60 % of the aggregation. With
 * quiet-time probes, compute roles only in runs that ask for them and the
 * tie-break towards fast aggregators, the stored schedules predict 1,881 ms
 * and the rounds take 1.05-1.06x that (6 runs in a row). Not always:
 * CI once failed the 1.2 bound, and runs here gave 1.04-1.14 and once
 * 1.55. The step logs' sent_kb/received_kb showed no resent bytes; a fast
 * aggregator started its all-reduce 0.5-2.9 s after the slow peers
 * because its gathering's DHT reads waited 0.4-2.1 s for the slow peers'
 * answers, queued behind their averaging at their 4 Mbit/s upload; the
 * slow peers' rounds took that much longer, in steps of half a gradient
 * (0.94 s). Small frames now go ahead of bulk ones (p2p_conn.c), the
 * gathering counts as quiet time for the probes but for its last 250 ms,
 * and 5 runs in a row gave 1.05 with every step's slowest round within
 * 1,954-2,040 ms.
 *
 * The three collaborations of this file (group rounds, the pull-only role
 * and the schedule's rounds, each on a run of its own) are started together
 * by setup and checked by one test each. The links of the schedule's and
 * the pull-only runs are capped, and all three together use about half of
 * one core (the whole test: 65 CPU-s in the normal build, 115 under the
 * sanitizers), so they barely meet: run one after another they took
 * 206-230 s, most of it waiting on the caps; together 130-140 s, and 86-96 s
 * since the schedule's run has 30 steps (SF_STEPS). Under the sanitizers
 * the rounds stayed bandwidth-bound (ratio 1.05 there too), but make test
 * neared its 25 minutes: that build runs the group rounds and the pull-only
 * role only (about 45 s instead of 88). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "sched/sched.h"

/* The schedule's rounds are a measurement of time (measured / predicted
 * within 1.2x) and the longest of the three runs (80 s of the file's 86 s);
 * the sanitizer build runs the other two, which follow schedules too (the
 * LP's roles, a group schedule) and check lockstep, and leaves the timing to
 * the normal build (it had checked a looser 1.5 there). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
#define MAX_RATIO 1.2

#define NAGENTS 4
/* 40 steps in both builds for the group rounds and the pull-only role */
#define STEPS 40
/* 30 for the schedule's rounds, the longest run (2.6 s a step at these
   caps): the pairs its check needs are measured in the run's first half
   minute (pair probes from 10-20 s after joining, agent/peer/caps.c; in
   five runs every peer's pairs were in the schedule solved 31 s after the
   first report, and the run lasts ~80 s), and the median is over 28 steps
   instead of 38 (1.05 in six runs, as with 40). With 30 steps the run once
   ended before a second peer had measured a pair, when the probes began
   20-30 s after joining (capability reports with measured pairs 1 of 4).
   The file took 112-117 s with 40 steps, 86-96 s with 30. */
#define SF_STEPS 30
#define MAXSTEPS 80
#define FAST_MBPS 40.0
#define SLOW_MBPS 4.0
#define RUN "fmnist-sched"
/* MLP 784-256-128-10 of examples/fmnist-collab.json */
#define MLP_PARAMS (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static int g_teardown_failed;

/* One collaboration of this file: its run, its agents' state dirs, logs
 * and step logs, their processes. */
#define MAXAGENTS (NAGENTS + 1)
struct collab {
    const char *test; /* the test that checks it */
    const char *run;
    int n;            /* agents */
    int started;
    char dirs[MAXAGENTS][256], logs[MAXAGENTS][320], steplogs[MAXAGENTS][320];
    pid_t pids[MAXAGENTS];
};
static struct collab g_po, g_gr, g_sf;

/* The run's body; roles: config.collaboration.compute_roles, NULL: unset;
 * group_size: config.collaboration.group_size, 0: unset. */
static char *run_body_named(const char *name, const char *roles, int group_size)
{
    json_t *cfg = ct_fmnist_recipe(!strcmp(name, RUN) ? SF_STEPS : STEPS);
    if (!cfg)
        return NULL;
    /* what the coordinator needs to schedule: the gradient's size (the bits follow the
       collaboration's compression, "none": 32) */
    json_object_set_new(json_object_get(cfg, "collaboration"), "model_parameters",
                        json_integer(MLP_PARAMS));
    if (roles)
        json_object_set_new(json_object_get(cfg, "collaboration"), "compute_roles",
                            json_string(roles));
    if (group_size)
        json_object_set_new(json_object_get(cfg, "collaboration"), "group_size",
                            json_integer(group_size));
    char *s = ct_run_body(name, cfg);
    json_decref(cfg);
    return s;
}

static int create_run(const char *name, const char *roles, int group_size)
{
    char *body = run_body_named(name, roles, group_size);
    if (!body)
        return -1;
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    long st = r.status;
    ct_resp_free(&r);
    return st == 201 ? 0 : -1;
}

/* Starts agent i of a collaboration: `crowdtrain-agent join` as a volunteer
 * types it, with the test's windows and its own extra options (NULL-ended). */
static int spawn(struct collab *c, int i, const char *log_tag, const char *steps_name,
                 const char *const *extra)
{
    snprintf(c->logs[i], sizeof c->logs[i], "build/test-logs/%s-agent%d.log", log_tag, i);
    if (steps_name) {
        char dir[256];
        memcpy(dir, c->dirs[i], sizeof dir);
        snprintf(c->steplogs[i], sizeof c->steplogs[i], "%.250s/%s", dir, steps_name);
    }
    const char *argv[32] = {ct_bin("crowdtrain-agent"), "join", "--run", c->run, "--config-dir", c->dirs[i],
                            "--listen-ip", "127.0.0.1", "--device", "cpu", "--round-window-ms", "400",
                            "--outcome-window-ms", "1000", "--stall-ms", "8000", "--no-eval"};
    int n = 0;
    while (argv[n])
        n++;
    if (steps_name) {
        argv[n++] = "--step-log";
        argv[n++] = c->steplogs[i];
    }
    for (int k = 0; extra && extra[k] && n < 31; k++)
        argv[n++] = extra[k];
    argv[n] = NULL;
    c->pids[i] = ct_spawn(argv, c->logs[i]);
    return c->pids[i] > 0 ? 0 : -1;
}

/* Whether CT_TEST_FILTER (cmocka's filter, a glob) selects a test: the
 * collaborations of tests filtered out are not started. */
static int selected(const char *test)
{
    const char *f = getenv("CT_TEST_FILTER");
    return !f || fnmatch(f, test, 0) == 0;
}

/* Readies a collaboration of n agents checked by `test` on a new run
 * (compute_roles `roles`, NULL: unset; group_size, 0: unset): its
 * volunteers logged in, each in a state dir. 1: spawn its agents now; 0:
 * its test is filtered out; -1: error. */
static int prepare(struct collab *c, const char *test, const char *run, int n, const char *roles,
                   int group_size)
{
    c->test = test;
    c->run = run;
    c->n = n;
    if (!selected(test))
        return 0;
    if (create_run(run, roles, group_size) != 0 || ct_volunteers(&g_c, g_org, run, n, c->dirs) != 0)
        return -1;
    c->started = 1;
    return 1;
}

/* The compute role (test_pull_only_role): three agents, the third with a
 * 2 Mbit/s upload. */
#define PO_RUN "fmnist-po"
#define PO_AGENTS 3
static int start_pull_only(void)
{
    struct collab *c = &g_po;
    int rc = prepare(c, "test_pull_only_role", PO_RUN, PO_AGENTS, "lp", 0);
    for (int i = 0; rc > 0 && i < c->n; i++) {
        const char *slow[] = {"--max-upload-mbps", "2", NULL};
        if (spawn(c, i, "pull_only", "po.steps", i == 2 ? slow : NULL) != 0)
            return -1;
    }
    return rc < 0 ? -1 : 0;
}

/* Group rounds (test_group_rounds): four agents and an aggregate-only
 * peer (the seed's auxiliary peer; it joins the last round of each step
 * and aggregates there). */
#define GR_RUN "fmnist-groups"
static int start_groups(void)
{
    struct collab *c = &g_gr;
    int rc = prepare(c, "test_group_rounds", GR_RUN, NAGENTS + 1, NULL, 2);
    for (int i = 0; rc > 0 && i < c->n; i++) {
        const char *aux[] = {"--aggregate-only", NULL};
        if (spawn(c, i, "groups", i < NAGENTS ? "groups.steps" : NULL, i < NAGENTS ? NULL : aux) != 0)
            return -1;
    }
    return rc < 0 ? -1 : 0;
}

/* The schedule's rounds (test_agents_follow_schedule): two agents capped
 * at FAST_MBPS and two at SLOW_MBPS, up and down. */
static int start_follow(void)
{
    struct collab *c = &g_sf;
    int rc = prepare(c, "test_agents_follow_schedule", RUN, NAGENTS, NULL, 0);
    for (int i = 0; rc > 0 && i < c->n; i++) {
        char mbps[16];
        snprintf(mbps, sizeof mbps, "%g", i < 2 ? FAST_MBPS : SLOW_MBPS);
        const char *caps[] = {"--max-upload-mbps", mbps, "--max-download-mbps", mbps, NULL};
        if (spawn(c, i, "schedule_follow", "sched.steps", caps) != 0)
            return -1;
    }
    return rc < 0 ? -1 : 0;
}

/* Waits for a collaboration's agents (all but `skip`, -1: none) to finish
 * the run; how many failed. */
static int wait_agents(struct collab *c, int skip, int timeout_s)
{
    int failed = 0;
    for (int i = 0; i < c->n; i++)
        if (i != skip && c->pids[i] > 0) {
            if (ct_wait(c->pids[i], timeout_s) != 0) {
                fprintf(stderr, "agent %d failed; its log: %s\n", i, c->logs[i]);
                failed++;
            }
            c->pids[i] = 0;
        }
    return failed;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    /* the schedule's rounds first (the longest), the group rounds last:
       their test, the first, watches for step 12 to kill an agent there */
    if ((!SANITIZED && start_follow() != 0) || start_pull_only() != 0 || start_groups() != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    struct collab *all[] = {&g_po, &g_gr, &g_sf};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < all[k]->n; i++)
            if (all[k]->pids[i] > 0) { /* a test that failed before waiting for it */
                kill(all[k]->pids[i], SIGKILL);
                waitpid(all[k]->pids[i], NULL, 0);
            }
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int k = 0; k < 3; k++)
        for (int i = 0; all[k]->started && i < all[k]->n; i++)
            if (!getenv("CT_KEEP_LOGS"))
                ct_rmrf(all[k]->dirs[i]);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

/* Per step: the slowest member's round_ms, the schedule version, the hash. */
struct steps {
    double round_ms[MAXSTEPS + 1];
    double samples[MAXSTEPS + 1]; /* of the last file folded */
    long long version[MAXSTEPS + 1];
    char hash[MAXSTEPS + 1][65];
    long long group_rounds[MAXSTEPS + 1], group_senders[MAXSTEPS + 1]; /* of the last file folded */
    long long group_last[MAXSTEPS + 1];
    double loss[MAXSTEPS + 1];
    int agreed[MAXSTEPS + 1];
    int mismatches, version_mismatches;
};

static void fold(const char *path, struct steps *st)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j)
            continue;
        long step = (long)json_integer_value(json_object_get(j, "step"));
        const char *h = json_string_value(json_object_get(j, "hash"));
        if (step >= 0 && step <= MAXSTEPS && h && strlen(h) == 64 &&
            !json_is_true(json_object_get(j, "synced"))) {
            if (!st->hash[step][0])
                snprintf(st->hash[step], sizeof st->hash[step], "%s", h);
            else if (strcmp(st->hash[step], h) != 0) {
                st->mismatches++;
                fprintf(stderr, "%s: step %ld hash %.16s differs from %.16s\n", path, step, h,
                        st->hash[step]);
            }
            long long v = json_integer_value(json_object_get(j, "sched_version"));
            if (st->version[step] && st->version[step] != v)
                st->version_mismatches++;
            st->version[step] = v;
            st->round_ms[step] =
                fmax(st->round_ms[step], json_number_value(json_object_get(j, "round_ms")));
            st->samples[step] = json_number_value(json_object_get(j, "samples"));
            st->group_rounds[step] = json_integer_value(json_object_get(j, "group_rounds"));
            st->group_senders[step] = json_integer_value(json_object_get(j, "group_senders"));
            st->group_last[step] = json_integer_value(json_object_get(j, "group_last"));
            st->loss[step] = json_number_value(json_object_get(j, "loss"));
            st->agreed[step] = (int)json_integer_value(json_object_get(j, "agreed"));
        }
        json_decref(j);
    }
    fclose(f);
}

/* The LP's predicted round time of a version (organizer's view of the
 * stored result) and how many peers it lists; the fast peers' share. */
static int version_info(long long v, double *predicted_ms, int *npeers, double *fast_share)
{
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/" RUN "/schedules/%lld", v);
    struct ct_resp r;
    ct_http(&g_c, "GET", path, g_org, NULL, &r);
    if (r.status != 200) {
        ct_resp_free(&r);
        return -1;
    }
    json_t *res = json_object_get(r.json, "result");
    double rate = json_number_value(json_object_get(res, "network_rate"));
    *predicted_ms = rate > 0 ? 1000 / rate : INFINITY;
    json_t *peers = json_object_get(res, "peers");
    *npeers = (int)json_array_size(peers);
    /* fast peers: those whose reported upload is FAST_MBPS */
    json_t *in = json_object_get(json_object_get(r.json, "inputs"), "peers");
    double fast = 0;
    size_t i;
    json_t *e;
    json_array_foreach(in, i, e) {
        json_t *pl = json_array_get(peers, i);
        double up = json_number_value(json_object_get(e, "upload_mbps"));
        if (up == FAST_MBPS)
            fast += json_number_value(json_object_get(pl, "fraction"));
        /* what the LP was given and what it made of it, for the record */
        printf("  peer %zu: up %g down %g Mbit/s, samples/s %.0f, computes %d, aggregates %.4f; "
               "pairs (Mbit/s):", i, up, json_number_value(json_object_get(e, "download_mbps")),
               json_number_value(json_object_get(e, "samples_per_s")),
               json_is_true(json_object_get(pl, "compute")),
               json_number_value(json_object_get(pl, "fraction")));
        size_t k;
        json_t *q;
        json_array_foreach(json_object_get(e, "pairs"), k, q)
            printf(" %.2f", json_number_value(json_object_get(q, "mbps")));
        printf("\n");
    }
    *fast_share = fast;
    ct_resp_free(&r);
    return 0;
}


static void test_agents_follow_schedule(void **state)
{
    (void)state;
    struct collab *c = &g_sf;
    assert_true(c->started);
    int failed = wait_agents(c, -1, 800);
    assert_int_equal(failed, 0);

    static struct steps st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < NAGENTS; i++)
        fold(c->steplogs[i], &st);
    assert_int_equal(st.mismatches, 0);
    assert_int_equal(st.version_mismatches, 0); /* every member planned with one version */

    /* Rounds planned with a schedule of all four peers. */
    double ratio[MAXSTEPS + 1], meas[MAXSTEPS + 1];
    size_t n = 0, followed = 0;
    long long seen_v = -1;
    double pred = 0, fast_share = 0;
    int npeers = 0;
    for (long k = 1; k <= SF_STEPS; k++) {
        if (st.version[k] <= 0 || !(st.round_ms[k] > 0))
            continue;
        followed++;
        if (st.version[k] != seen_v) {
            assert_int_equal(version_info(st.version[k], &pred, &npeers, &fast_share), 0);
            seen_v = st.version[k];
            printf("schedule v%lld: %d peers, fast peers aggregate %.1f %%, LP round %.0f ms\n",
                   seen_v, npeers, 100 * fast_share, pred);
        }
        if (npeers != NAGENTS)
            continue;
        /* The schedule beats even all-reduce (same bandwidth-only model:
           the slow peers move 2 x 3/4 of the gradient at SLOW_MBPS) by
           letting the fast peers aggregate. How much they take is not
           unique: with the measured pairwise rows the LP's optimum often
           lets the slow peers aggregate a third or more at the same
           predicted time (another vertex of the same optimum; 41 % for
           the fast peers seen), so the share is printed, and the
           prediction is what is checked. */
        assert_true(pred < 0.8 * (2 * 0.75 * MLP_PARAMS * 32.0 / (SLOW_MBPS * 1e6) * 1000));
        meas[n] = st.round_ms[k];
        ratio[n++] = st.round_ms[k] / pred;
    }
    printf("%zu of %d steps followed a schedule, %zu with all %d peers\n", followed, SF_STEPS,
           n, NAGENTS);
    assert_true(n >= 8);
    double med = ct_median(ratio, n), mm = ct_median(meas, n);
    /* even all-reduce among the four, in the same bandwidth-only model: the slow
       peers send and receive 2 x 3/4 of the gradient at SLOW_MBPS */
    double ar_ms = 2 * 0.75 * MLP_PARAMS * 32.0 / (SLOW_MBPS * 1e6) * 1000;
    printf("measured round (slowest member, median) %.0f ms; LP %.0f ms; ratio %.2f (median of "
           "per-step ratios); even all-reduce would need %.0f ms\n",
           mm, pred, med, ar_ms);
    if (!(med <= MAX_RATIO && med >= 0.8)) { /* >= 0.8: the caps do hold */
        /* the figures in the failure line itself (a CI log keeps little
           more than it): the slowest member's round of each step */
        char steps[MAXSTEPS * 8] = "";
        size_t at = 0;
        for (size_t i = 0; i < n && at + 8 < sizeof steps; i++)
            at += (size_t)snprintf(steps + at, sizeof steps - at, " %.0f", meas[i]);
        fail_msg("measured / predicted round %.2f (median over %zu steps, LP %.0f ms), outside "
                 "[0.8, %.1f]; slowest member's round_ms per step:%s",
                 med, n, pred, MAX_RATIO, steps);
    }
    /* The agents measured pairwise throughput to other peers and reported
       it: every pair within what the caps allow (the slower side's cap,
       plus the token buckets' burst), the fast peers' pairs faster than the
       slow peers' cap. */
    long with_pairs = -1, over = -1, fast_ok = -1;
    /* this run's reports only (the pull-only test's run shares the database) */
#define IN_RUN(col) "WHERE " col " = (SELECT id FROM runs WHERE name = '" RUN "') "
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM capabilities " IN_RUN("run_id")
                                  "AND jsonb_array_length(report->'pairs') > 0",
                                  &with_pairs), 0);
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM capabilities c, "
                                  "jsonb_array_elements(c.report->'pairs') p " IN_RUN("c.run_id")
                                  "AND (p->>'mbps')::float8 > 1.5 * (c.report->>'upload_mbps')::float8",
                                  &over), 0);
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM capabilities a "
                                  "JOIN capabilities b ON b.run_id = a.run_id "
                                  "JOIN jsonb_array_elements(a.report->'pairs') p "
                                  "ON p->>'peer' = translate(rtrim(encode(b.peer_public_key, 'base64'), '='), '+/', '-_') "
                                  IN_RUN("a.run_id") "AND (a.report->>'upload_mbps')::float8 = 40 "
                                  "AND (b.report->>'upload_mbps')::float8 = 40 "
                                  "AND (p->>'mbps')::float8 > 4 * 1.5",
                                  &fast_ok), 0);
    if (over) {
        long v = 0;
        char q[512];
        for (int k = 0; k < 8; k++) {
            snprintf(q, sizeof q,
                     "SELECT (1000 * (p->>'mbps')::float8)::bigint * 100000 + (c.report->>'upload_mbps')::float8::bigint "
                     "FROM capabilities c, jsonb_array_elements(c.report->'pairs') p " IN_RUN("c.run_id")
                     "ORDER BY 1 OFFSET %d LIMIT 1", k);
            if (ct_pg_scalar(&g_pg, q, &v) == 0)
                printf("pair: %.3f Mbit/s from a peer capped at %ld\n", (double)(v / 100000) / 1000, v % 100000);
        }
    }
    /* and each pair's round trip (a few Pings after its probe): on one
       machine's namespaces well under a second, never absent everywhere */
    long with_rtt = -1, rtt_us = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM capabilities c, "
                                  "jsonb_array_elements(c.report->'pairs') p " IN_RUN("c.run_id")
                                  "AND (p->>'rtt_ms')::float8 > 0 AND (p->>'rtt_ms')::float8 < 1000",
                                  &with_rtt), 0);
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT coalesce((1000 * percentile_cont(0.5) WITHIN GROUP "
                                  "(ORDER BY (p->>'rtt_ms')::float8))::bigint, -1) FROM capabilities c, "
                                  "jsonb_array_elements(c.report->'pairs') p " IN_RUN("c.run_id"),
                                  &rtt_us), 0);
    printf("capability reports with measured pairs: %ld of %d; pairs above the caps: %ld; fast-to-fast "
           "pairs measured above the slow cap: %ld; pairs with a round trip: %ld (median %.2f ms)\n",
           with_pairs, NAGENTS, over, fast_ok, with_rtt, (double)rtt_us / 1000);
    assert_true(with_pairs >= 2);
    assert_true(with_rtt >= 1);
    assert_int_equal(over, 0);
}

/* The compute role (issue 7): a run with compute_roles "lp" and three
 * agents, one of them with a 2 Mbit/s upload (and the default 1 Gbit/s
 * down). Its sending would hold every aggregator to 2 Mbit/s, so the LP
 * tells it not to compute; it then averages pull-only: it computes nothing
 * (samples 0 in its step log), takes the others' average and applies the
 * step, and every agent holds the same parameters at every step. */
static void test_pull_only_role(void **state)
{
    (void)state;
    struct collab *c = &g_po;
    assert_true(c->started);
    int failed = wait_agents(c, -1, 600);
    assert_int_equal(failed, 0);
    char (*steplogs)[320] = c->steplogs;
    static struct steps st, po;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < PO_AGENTS; i++)
        fold(steplogs[i], &st);
    if (st.mismatches)
        for (int i = 0; i < PO_AGENTS; i++) {
            char dst[320];
            snprintf(dst, sizeof dst, "build/test-logs/pull_only-agent%d.steps", i);
            char *t = ct_read_file(steplogs[i], NULL);
            FILE *f = t ? fopen(dst, "w") : NULL;
            if (f) {
                fputs(t, f);
                fclose(f);
            }
            free(t);
        }
    assert_int_equal(st.mismatches, 0); /* identical parameters at every step */
    memset(&po, 0, sizeof po);
    fold(steplogs[2], &po);
    /* the slow uploader: steps planned with a schedule, taken without samples */
    int pull_steps = 0, computed_after = 0;
    for (long k = 1; k <= STEPS; k++) {
        if (po.version[k] > 0 && po.hash[k][0] && po.samples[k] == 0)
            pull_steps++;
        if (pull_steps && po.samples[k] > 0)
            computed_after++;
    }
    printf("the 2 Mbit/s uploader took %d of %d steps pull-only (%d computed after its first)\n",
           pull_steps, STEPS, computed_after);
    assert_true(pull_steps >= STEPS / 3);
    /* and the coordinator's schedule said so */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/" PO_RUN "/schedule", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
    long no_compute = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM schedules s JOIN runs ru ON ru.id = s.run_id, "
                                  "jsonb_array_elements(s.result->'peers') p "
                                  "WHERE ru.name = '" PO_RUN "' AND (p->>'compute')::boolean = false",
                                  &no_compute), 0);
    assert_true(no_compute >= 1);
}


/* Group all-reduce (seed 000 §3.2, Appendix C; agent/dp/groups.h): a run
 * whose organizer fixes config.collaboration.group_size = 2 gets schedules
 * with m = 2, and four agents then average each step in two rounds with two
 * senders each (pairs {0, 2} and {1, 3} in key order, then one member of
 * each pair sending for it to all four) instead of one all-reduce with four
 * senders, with an aggregate-only peer joining every last round. At step 12
 * or later one agent is killed (SIGKILL) in the middle of things; the three
 * others go on in groups of their own. Checked: the
 * schedule says m = 2, most steps ran two rounds of two senders, before and
 * after the death, every agent holds the same parameters at every step,
 * every block of the gradient was averaged in most steps, and the loss
 * falls. */
static void test_group_rounds(void **state)
{
    (void)state;
    struct collab *c = &g_gr;
    assert_true(c->started);
    pid_t *pids = c->pids;
    char (*steplogs)[320] = c->steplogs;
    /* A failure: the last agent dies (SIGKILL) once its steps are averaged
       in groups; the three others go on in groups of their own ({a, c}, {b},
       then one group with two senders), and the round it died in loses at
       most its parts. */
    long killed_at = -1;
    for (int t = 0; t < 1200 && killed_at < 0; t++) {
        static struct steps k3;
        memset(&k3, 0, sizeof k3);
        FILE *f = fopen(steplogs[NAGENTS - 1], "r");
        if (f) {
            fclose(f);
            fold(steplogs[NAGENTS - 1], &k3);
        }
        for (long k = 1; k <= STEPS && killed_at < 0; k++)
            if (k >= 12 && k3.group_rounds[k] == 2)
                killed_at = k;
        if (killed_at < 0)
            usleep(100000);
    }
    assert_true(killed_at > 0);
    kill(pids[NAGENTS - 1], SIGKILL);
    waitpid(pids[NAGENTS - 1], NULL, 0);
    pids[NAGENTS - 1] = 0;
    int failed = wait_agents(c, NAGENTS - 1, 600);
    assert_int_equal(failed, 0);
    static struct steps st, one[NAGENTS];
    memset(&st, 0, sizeof st);
    for (int i = 0; i < NAGENTS; i++) {
        fold(steplogs[i], &st);
        memset(&one[i], 0, sizeof one[i]);
        fold(steplogs[i], &one[i]);
    }
    assert_int_equal(st.mismatches, 0); /* identical parameters at every step, the dead one's too */
    int grouped = 0, whole = 0, after = 0;
    for (long k = 1; k <= STEPS; k++) {
        int pairs = 0;
        for (int i = 0; i < NAGENTS - 1; i++)
            pairs += one[i].hash[k][0] && one[i].group_rounds[k] == 2 && one[i].group_senders[k] == 2;
        after += k > killed_at + 1 && pairs == NAGENTS - 1;
        if (pairs == NAGENTS - 1) {
            grouped++;
            whole += st.agreed[k] == 64;
        }
    }
    double first = 0, last = 0;
    int nf = 0, nl = 0;
    for (long k = 1; k <= STEPS; k++) {
        if (!isfinite(st.loss[k]) || st.loss[k] <= 0)
            continue;
        if (k <= 5)
            first += st.loss[k], nf++;
        if (k > STEPS - 5)
            last += st.loss[k], nl++;
    }
    printf("%d of %d steps averaged in two rounds of two senders by the %d surviving agents (%d after "
           "the fourth died at step %ld), %d of them with every block; loss %.3f -> %.3f\n",
           grouped, STEPS, NAGENTS - 1, after, killed_at, whole, nf ? first / nf : 0,
           nl ? last / nl : 0);
    assert_true(grouped >= STEPS / 2);
    assert_true(after >= (STEPS - killed_at - 1) * 3 / 4); /* the three go on in groups */
    assert_true(whole >= grouped * 3 / 4);
    assert_true(nf > 0 && nl > 0 && last / nl < 0.8 * (first / nf));
    long m = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT (s.result->>'group_size')::int FROM schedules s JOIN runs ru "
                                  "ON ru.id = s.run_id WHERE ru.name = '" GR_RUN "' "
                                  "ORDER BY s.version DESC LIMIT 1",
                                  &m),
                     0);
    assert_int_equal(m, 2);
    /* the auxiliary peer was in the last round of the grouped steps: five
       members before the death, four after */
    int with_aux = 0;
    for (long k = 1; k <= STEPS; k++)
        with_aux += one[0].group_rounds[k] == 2 &&
                    one[0].group_last[k] == (k <= killed_at ? NAGENTS + 1 : NAGENTS);
    printf("%d grouped steps had the aggregate-only peer in their last round\n", with_aux);
    assert_true(with_aux >= grouped * 3 / 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_rounds),
        cmocka_unit_test(test_pull_only_role),
#if !SANITIZED
        cmocka_unit_test(test_agents_follow_schedule),
#endif
    };
    if (SANITIZED) {
        (void)test_agents_follow_schedule;
        printf("sanitizer build: test_agents_follow_schedule (a timing measurement) runs in the normal build only\n");
    }
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
