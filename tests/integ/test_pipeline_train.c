/* ct-timeout: 300 */
/* Pipeline stages trained by real agents (issue 19; seed
 * 003_f3537b728458fcc1.txt §2; docs/pipelines.md, "Stage agents"):
 * PostgreSQL, the coordinator and three `crowdtrain-agent pipeline`
 * processes on loopback, with the command line a volunteer types, on a run
 * whose config cuts a tiny byte GPT (3 layers) into 3 stages. The agents
 * report their measured speed, the coordinator assigns the stages and
 * signs the assignment, each agent verifies it, builds its stage and
 * trains: activations forward, their gradients back, the tied embedding's
 * gradient between the first and the last stage, the global norm for
 * clipping.
 *
 * Checked: every agent ran a different stage for all the steps; the last
 * stage's loss at every step equals `train --local`'s loss of the same
 * recipe (same seed and data order: the first stage reads the data as the
 * single process does) within EQ_TOL, and the loss fell; every stage's
 * gradient norm equals the others' at every step (they clip with one
 * number). A pipeline whose messages were lost, or whose tied embedding
 * were not shared, would differ from the single process within a step or
 * two. On a second run, 2 stages x 2 replicas (four agents): the agents of
 * a stage average its gradients, every replica of a stage holds the same
 * parameters at every step, and the loss is again the single process's.
 * Churn, on a third run of 2 x 2 that may go on with one pipeline: one of
 * the four agents killed with SIGKILL mid-run; the others re-schedule and
 * finish, and every step's loss is still the single process's. After the
 * first two runs, GET /pipeline/stages (the dashboard's page) shows every
 * slot with its agent's key, steps and measured step times. The
 * assignment's signature and decoder have their own tests
 * (tests/unit/sched/test_dtfm_payload.c, tests/fuzz/fuzz_pipeline.c). The
 * second test starts the agents again: their new addresses replace the
 * first run's on the DHT, which a stage must read again when a neighbour
 * does not answer where it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "ct_harness.h"
#include "ct_pipeline.h"

#define NAGENTS 3
#define STAGES 3
#define STEPS 12
#define RUN "gpt-pipe"
#define RUN2 "gpt-pipe-replicas"
#define NAGENTS2 4
#define RUN3 "gpt-pipe-churn"
/* |pipeline - single process| per step: the stages compute the same
 * products in the same order; only the clipping norm (three partial sums
 * added) and the tied embedding's gradient (first + last stage) are summed
 * differently. Measured: equal in all six decimals the step logs keep. */
#define EQ_TOL 2e-6
#define EQ_TOL_REPLICAS 1e-5 /* measured: equal in six decimals too */

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[NAGENTS][256], g_dirs2[NAGENTS2][256], g_dirs3[NAGENTS2][256];
static char g_data[256];
static char g_recipe[300];

/* The recipe: a byte GPT of 3 layers (tests/harness/ct_pipeline.h). */
static json_t *recipe(void)
{
    return ct_pipeline_recipe(g_data, 3, STEPS, 11);
}

static int create_run(const char *name, json_t *cfg)
{
    return ct_pipeline_create_run(&g_c, g_org, name, "tiny byte GPT in stages", cfg);
}

/* NAGENTS2 volunteers PREFIX0.. on run, logged in with state dirs dirs. */
static int volunteers(const char *run, const char *prefix, char (*dirs)[256])
{
    for (int i = 0; i < NAGENTS2; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s%d", prefix, i);
        if (ct_volunteer_account(&g_c, g_org, run, name, dirs[i]) != 0)
            return -1;
        const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--ca-cert", g_c.ca,
                              "--username", name, "--password-stdin", "--config-dir", dirs[i], NULL};
        char *out = NULL;
        int lrc = ct_run(argv, "volunteer-pw\n", &out, 60);
        if (lrc != 0)
            fprintf(stderr, "login of %s: %s\n", name, out ? out : "");
        free(out);
        if (lrc != 0)
            return -1;
    }
    return 0;
}

static int setup(void **state)
{
    (void)state;
    if (ct_pipeline_backbone(&g_pg, &g_c, &g_org, "pipedata", g_data, sizeof g_data) != 0)
        return -1;
    json_t *cfg = recipe();
    if (!cfg)
        return -1;
    snprintf(g_recipe, sizeof g_recipe, "%.250s/local.json", g_data);
    if (json_dump_file(cfg, g_recipe, 0) != 0)
        return -1;
    json_object_set_new(cfg, "pipeline",
                        json_pack("{s:i, s:i, s:f}", "stages", STAGES, "replicas", 1, "gradient_bytes", 1e6));
    if (create_run(RUN, cfg) != 0)
        return -1;
    /* the second run: 2 stages x 2 replicas, four other volunteers */
    if (!(cfg = recipe()))
        return -1;
    json_object_set_new(cfg, "pipeline",
                        json_pack("{s:i, s:i, s:f}", "stages", 2, "replicas", 2, "gradient_bytes", 1e6));
    if (create_run(RUN2, cfg) != 0 || volunteers(RUN2, "rep", g_dirs2) != 0)
        return -1;
    /* the third: the same, ready to go on with one pipeline, reports live 10 s */
    if (!(cfg = recipe()))
        return -1;
    json_object_set_new(cfg, "pipeline",
                        json_pack("{s:i, s:i, s:i, s:i, s:f}", "stages", 2, "replicas", 2, "min_replicas", 1,
                                  "liveness_s", 10, "gradient_bytes", 1e6));
    if (create_run(RUN3, cfg) != 0 || volunteers(RUN3, "churn", g_dirs3) != 0)
        return -1;
    return ct_volunteers(&g_c, g_org, RUN, NAGENTS, g_dirs);
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    if (!getenv("CT_KEEP_LOGS")) {
        for (int i = 0; i < NAGENTS; i++)
            ct_rmrf(g_dirs[i]);
        for (int i = 0; i < NAGENTS2; i++) {
            if (g_dirs2[i][0])
                ct_rmrf(g_dirs2[i]);
            if (g_dirs3[i][0])
                ct_rmrf(g_dirs3[i]);
        }
        ct_rmrf(g_data);
    }
    free(g_org);
    return rc;
}

static pid_t spawn_stage_in(const char *run, const char *dir, const char *log, const char *steplog,
                            const char *timeout_ms)
{
    const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", run, "--config-dir", dir,
                          "--listen-ip", "127.0.0.1", "--device", "cpu", "--step-log", steplog, "--wait-s",
                          "120", "--stage-timeout-ms", timeout_ms, NULL};
    return ct_spawn(argv, log);
}

static pid_t spawn_stage(int i, const char *log, const char *steplog, const char *timeout_ms)
{
    return spawn_stage_in(RUN, g_dirs[i], log, steplog, timeout_ms);
}

struct slog {
    int n, stage, replica;
    double loss[STEPS + 2], norm[STEPS + 2], loss_t[STEPS + 2]; /* loss_t: t_ms of the line with the loss */
    char hash[STEPS + 2][17];
    int max_in_flight; /* most micro-batches a step had in flight */
};

static int read_slog(const char *path, struct slog *s)
{
    memset(s, 0, sizeof *s);
    s->stage = s->replica = -1;
    for (int k = 0; k < STEPS + 2; k++)
        s->loss[k] = s->norm[k] = NAN;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j)
            continue;
        long step = (long)json_integer_value(json_object_get(j, "step"));
        if (step >= 1 && step <= STEPS) {
            s->n++;
            json_t *st = json_object_get(j, "stage"), *l = json_object_get(j, "loss");
            if (json_is_integer(st))
                s->stage = (int)json_integer_value(st);
            json_t *rp = json_object_get(j, "replica");
            if (json_is_integer(rp))
                s->replica = (int)json_integer_value(rp);
            const char *h = json_string_value(json_object_get(j, "hash"));
            snprintf(s->hash[step], sizeof s->hash[step], "%s", h ? h : "");
            if (json_is_number(l)) {
                s->loss[step] = json_number_value(l);
                s->loss_t[step] = json_number_value(json_object_get(j, "t_ms"));
            }
            json_t *gn = json_object_get(j, "grad_norm");
            if (json_is_number(gn))
                s->norm[step] = json_number_value(gn);
            long fl = (long)json_integer_value(json_object_get(j, "in_flight"));
            s->max_in_flight = fl > s->max_in_flight ? (int)fl : s->max_in_flight;
        }
        json_decref(j);
    }
    fclose(f);
    return 0;
}

/* Every stage agent's contribution reports (docs/accounting.md, "Pipeline
 * stages"): n devices, each with `steps` reports of `share` samples (its
 * pipeline's samples / S), all of them verified by its neighbours, none
 * flagged. The reporters post in the background and flush on exit. */
static void expect_stage_credit(const char *run, int n, int steps, double share)
{
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/%s/contributions", run);
    json_t *peers = NULL;
    struct ct_resp r = {0};
    for (int tries = 0; tries < 50; tries++) {
        ct_resp_free(&r);
        assert_int_equal(ct_http(&g_c, "GET", path, g_org, NULL, &r), 0);
        assert_int_equal(r.status, 200);
        peers = json_object_get(r.json, "peers");
        size_t full = 0;
        for (size_t i = 0; i < json_array_size(peers); i++)
            full += json_integer_value(json_object_get(json_array_get(peers, i), "steps")) == steps;
        if (full == (size_t)n)
            break;
        usleep(200000);
    }
    assert_int_equal(json_array_size(peers), n);
    for (int i = 0; i < n; i++) {
        json_t *row = json_array_get(peers, (size_t)i);
        double claimed = json_number_value(json_object_get(row, "claimed_samples"));
        double verified = json_number_value(json_object_get(row, "verified_samples"));
        printf("stage agent %d: %lld reports, claimed %.3f, verified %.3f samples\n", i,
               (long long)json_integer_value(json_object_get(row, "reports")), claimed, verified);
        assert_int_equal(json_integer_value(json_object_get(row, "steps")), steps);
        assert_true(fabs(claimed - steps * share) < 1e-6);
        assert_true(fabs(verified - claimed) < 1e-6);
        assert_int_equal(json_integer_value(json_object_get(row, "flagged_reports")), 0);
    }
    ct_resp_free(&r);
}

/* GET /pipeline/stages, the dashboard's Pipeline page, after the run: one
 * slot per (replica, stage) with the assignment's key (GET /pipeline) and
 * its owner, every agent's `steps` steps (the newest report's step is
 * steps - 1: reports name the step before it is applied), positive median
 * step times and samples/s, a stage's throughput the sum of its replicas',
 * a measured step time over the steps every slot reported, and the
 * assignment's predicted one with its split. */
static void expect_stages_view(const char *run, int stages, int replicas, int steps, double share)
{
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/%s/pipeline", run);
    struct ct_resp a = {0}, r = {0};
    assert_int_equal(ct_http(&g_c, "GET", path, NULL, NULL, &a), 0);
    assert_int_equal(a.status, 200);
    json_t *asg = json_object_get(json_object_get(a.json, "pipeline"), "assignment");
    snprintf(path, sizeof path, "/api/v1/runs/%s/pipeline/stages", run);
    assert_int_equal(ct_http(&g_c, "GET", path, NULL, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    ct_resp_free(&r);
    assert_int_equal(ct_http(&g_c, "GET", path, g_org, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    printf("pipeline/stages: %s\n", r.body);
    json_t *j = r.json, *slots = json_object_get(j, "slots"), *tp = json_object_get(j, "throughput");
    assert_int_equal(json_integer_value(json_object_get(j, "version")),
                     json_integer_value(json_object_get(a.json, "version")));
    assert_int_equal(json_integer_value(json_object_get(j, "stages")), stages);
    assert_int_equal(json_integer_value(json_object_get(j, "replicas")), replicas);
    assert_int_equal(json_array_size(slots), (size_t)(stages * replicas));
    assert_int_equal(json_array_size(tp), (size_t)stages);
    double stage_sps[64] = {0};
    for (int k = 0; k < stages * replicas; k++) {
        json_t *s = json_array_get(slots, (size_t)k);
        int i = k / stages, st = k % stages;
        assert_int_equal(json_integer_value(json_object_get(s, "replica")), i);
        assert_int_equal(json_integer_value(json_object_get(s, "stage")), st);
        assert_string_equal(json_string_value(json_object_get(s, "peer_public_key")),
                            json_string_value(json_array_get(json_array_get(asg, (size_t)i), (size_t)st)));
        const char *user = json_string_value(json_object_get(s, "username"));
        assert_non_null(user);
        assert_true(user[0] != '\0');
        assert_int_equal(json_integer_value(json_object_get(s, "steps")), steps);
        assert_int_equal(json_integer_value(json_object_get(s, "step")), steps - 1);
        assert_int_equal(json_integer_value(json_object_get(s, "reports")), steps < 20 ? steps : 20);
        assert_true(json_number_value(json_object_get(s, "round_ms")) > 0);
        assert_true(json_number_value(json_object_get(s, "sps")) > 0);
        assert_true(fabs(json_number_value(json_object_get(s, "verified_samples")) - steps * share) < 1e-6);
        stage_sps[st] += json_number_value(json_object_get(s, "sps"));
    }
    for (int st = 0; st < stages; st++) {
        json_t *t = json_array_get(tp, (size_t)st);
        assert_int_equal(json_integer_value(json_object_get(t, "replicas")), replicas);
        assert_true(fabs(json_number_value(json_object_get(t, "sps")) - stage_sps[st]) < 1e-9 * stage_sps[st]);
    }
    json_t *m = json_object_get(j, "measured"), *pr = json_object_get(j, "predicted");
    assert_int_equal(json_integer_value(json_object_get(m, "steps")), steps < 20 ? steps : 20);
    double measured = json_number_value(json_object_get(m, "step_s"));
    assert_true(measured > 0 && measured < 60);
    json_t *want = json_object_get(json_object_get(a.json, "pipeline"), "predicted");
    static const char *const parts[] = {"total_s", "dp_s", "pp_s", "compute_s"};
    for (size_t k = 0; k < 4; k++)
        assert_true(json_number_value(json_object_get(pr, parts[k])) ==
                    json_number_value(json_object_get(want, parts[k])));
    assert_true(json_number_value(json_object_get(pr, "total_s")) > 0);
    assert_true(json_number_value(json_object_get(j, "random_mean_s")) > 0);
    printf("%s: measured %.3f s per step, predicted %.3f s\n", run, measured,
           json_number_value(json_object_get(pr, "total_s")));
    ct_resp_free(&r);
    ct_resp_free(&a);
}

/* The single process on the same recipe (once: both tests compare with it). */
static void single_process(struct slog *local)
{
    static struct slog done;
    static int have;
    if (!have) {
        char local_log[320];
        snprintf(local_log, sizeof local_log, "%.250s/local.steps", g_data);
        ct_pipeline_train_local(g_recipe, local_log);
        assert_int_equal(read_slog(local_log, &done), 0);
        assert_int_equal(done.n, STEPS);
        have = 1;
    }
    *local = done;
}

static void test_stages_match_single_process(void **state)
{
    (void)state;
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    pid_t pids[NAGENTS];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/pipeline.log", g_dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/pipeline.steps", g_dirs[i]);
        pids[i] = spawn_stage(i, logs[i], steplogs[i], "60000");
        assert_true(pids[i] > 0);
    }
    for (int i = 0; i < NAGENTS; i++) {
        int st = ct_wait(pids[i], 240);
        if (st != 0) {
            char *l = ct_read_file(logs[i], NULL);
            fprintf(stderr, "agent %d exited with %d; its log:\n%s\n", i, st, l ? l : "");
            free(l);
        }
        assert_int_equal(st, 0);
    }
    static struct slog local, s[NAGENTS];
    single_process(&local);
    int seen[STAGES] = {0}, last = -1;
    for (int i = 0; i < NAGENTS; i++) {
        assert_int_equal(read_slog(steplogs[i], &s[i]), 0);
        assert_int_equal(s[i].n, STEPS);
        assert_true(s[i].stage >= 0 && s[i].stage < STAGES);
        seen[s[i].stage]++;
        if (s[i].stage == STAGES - 1)
            last = i;
    }
    for (int j = 0; j < STAGES; j++)
        assert_int_equal(seen[j], 1); /* each stage ran by one agent */
    assert_true(last >= 0);
    /* 1F1B (stage_step.c): stage j keeps at most S - j micro-batches in
       flight, the last one; the first stage started a second micro-batch
       before the first one's gradient came back (the stages overlapped) */
    for (int i = 0; i < NAGENTS; i++) {
        printf("stage %d: at most %d micro-batches in flight\n", s[i].stage, s[i].max_in_flight);
        assert_true(s[i].max_in_flight >= 1 && s[i].max_in_flight <= STAGES - s[i].stage);
        if (s[i].stage == 0)
            assert_true(s[i].max_in_flight >= 2);
    }
    double worst = 0;
    printf("step  pipeline  single    |diff|   grad norm\n");
    for (int k = 1; k <= STEPS; k++) {
        double d = fabs(s[last].loss[k] - local.loss[k]);
        worst = fmax(worst, d);
        printf("%4d  %.6f  %.6f  %.1e  %.4f\n", k, s[last].loss[k], local.loss[k], d, s[last].norm[k]);
        assert_true(isfinite(s[last].loss[k]));
        assert_true(d <= EQ_TOL);
        for (int i = 0; i < NAGENTS; i++) /* one clipping norm for all stages */
            assert_true(s[i].norm[k] == s[last].norm[k]);
    }
    printf("largest |pipeline - single process| loss difference over %d steps: %.2e\n", STEPS, worst);
    assert_true(s[last].loss[STEPS] < s[last].loss[1] - 1.0);
    expect_stage_credit(RUN, NAGENTS, STEPS, 16.0 / STAGES);
    expect_stages_view(RUN, STAGES, 1, STEPS, 16.0 / STAGES);
}

/* Two pipelines of two stages: pipeline i takes micro-batches i and i + 2
 * of each step, and the two agents of each stage average its gradients
 * with the butterfly all-reduce. Every replica of a stage holds the same
 * parameters at every step (hash), and the loss is the single process's
 * within EQ_TOL_REPLICAS: the replicas' gradients are summed in another
 * order (each its own micro-batches, then their mean in double), and the
 * loss sums travel as fp32. */
static void test_replicas_average(void **state)
{
    (void)state;
    char logs[NAGENTS2][320], steplogs[NAGENTS2][320];
    pid_t pids[NAGENTS2];
    for (int i = 0; i < NAGENTS2; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/pipeline.log", g_dirs2[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/pipeline.steps", g_dirs2[i]);
        pids[i] = spawn_stage_in(RUN2, g_dirs2[i], logs[i], steplogs[i], "60000");
        assert_true(pids[i] > 0);
    }
    for (int i = 0; i < NAGENTS2; i++) {
        int st = ct_wait(pids[i], 240);
        if (st != 0) {
            char *l = ct_read_file(logs[i], NULL);
            fprintf(stderr, "agent %d exited with %d; its log:\n%s\n", i, st, l ? l : "");
            free(l);
        }
        assert_int_equal(st, 0);
    }
    static struct slog local, s[NAGENTS2];
    single_process(&local);
    int slot[2][2] = {{-1, -1}, {-1, -1}};
    for (int i = 0; i < NAGENTS2; i++) {
        assert_int_equal(read_slog(steplogs[i], &s[i]), 0);
        assert_int_equal(s[i].n, STEPS);
        assert_true(s[i].stage >= 0 && s[i].stage < 2 && s[i].replica >= 0 && s[i].replica < 2);
        assert_int_equal(slot[s[i].replica][s[i].stage], -1); /* each slot ran by one agent */
        slot[s[i].replica][s[i].stage] = i;
    }
    double worst = 0;
    printf("step  replica 0  replica 1  single    |diff|\n");
    for (int k = 1; k <= STEPS; k++) {
        for (int j = 0; j < 2; j++) /* the replicas of a stage: the same parameters */
            assert_string_equal(s[slot[0][j]].hash[k], s[slot[1][j]].hash[k]);
        double l0 = s[slot[0][1]].loss[k], l1 = s[slot[1][1]].loss[k];
        double d = fabs(l0 - local.loss[k]);
        worst = fmax(worst, d);
        printf("%4d  %.6f   %.6f   %.6f  %.1e\n", k, l0, l1, local.loss[k], d);
        assert_true(l0 == l1);
        assert_true(d <= EQ_TOL_REPLICAS);
        for (int i = 0; i < NAGENTS2; i++)
            assert_true(s[i].norm[k] == s[0].norm[k]);
    }
    printf("largest |2 x 2 pipelines - single process| loss difference over %d steps: %.2e\n", STEPS, worst);
    assert_true(s[slot[0][1]].loss[STEPS] < s[slot[0][1]].loss[1] - 1.0);
    expect_stage_credit(RUN2, NAGENTS2, STEPS, 16.0 / 2 / 2); /* a pipeline's 8 samples, 2 stages */
    expect_stages_view(RUN2, 2, 2, STEPS, 16.0 / 2 / 2);
    /* The first assignment was solved with every pair's round trip (the
       agents measure them before their first capability report,
       agent/pipe/rtt.c): each of the 4 devices in its inputs has a round
       trip to each of the other 3, and no throughput (the links' rates
       stand in for it). */
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM pipelines p JOIN runs r ON r.id = p.run_id, "
                                  "jsonb_array_elements(p.inputs->'devices') d, jsonb_array_elements(d->'pairs') q "
                                  "WHERE r.name = '" RUN2 "' AND p.version = 1 AND (q->>'rtt_ms')::float8 > 0 "
                                  "AND NOT q ? 'mbps'",
                                  &v),
                     0);
    assert_int_equal(v, NAGENTS2 * (NAGENTS2 - 1));
}

/* Churn (issue 19): 2 stages x 2 replicas with min_replicas 1 and
 * liveness_s 10, every frame delayed 30 ms (so a step takes a while), the
 * agents' speeds declared (400, 300, 200, 100 samples/s); once every agent
 * took 3 steps, the other agent of the slowest one's stage is killed with
 * SIGKILL. The others find a neighbour gone, the coordinator drops the dead
 * agent once its capability report expires and gives the one pipeline left
 * to the two fastest, which held the same stage: one of them takes the
 * other stage and loads its state from the slowest, now a spare that
 * serves it; they agree on the step to go on from and finish. Every step's
 * loss (the last line a step has) is again the single process's: the
 * re-scheduling lost no update and repeated none. */
static void test_churn(void **state)
{
    (void)state;
    char logs[NAGENTS2][320], steplogs[NAGENTS2][320];
    pid_t pids[NAGENTS2];
    for (int i = 0; i < NAGENTS2; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/churn.log", g_dirs3[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/churn.steps", g_dirs3[i]);
        char sps[16];
        snprintf(sps, sizeof sps, "%d", 400 - 100 * i); /* agent 3 the slowest */
        const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", RUN3, "--config-dir", g_dirs3[i],
                              "--listen-ip", "127.0.0.1", "--device", "cpu", "--step-log", steplogs[i], "--wait-s",
                              "90", "--stage-timeout-ms", "3000", "--latency-ms", "30", "--samples-per-s", sps,
                              NULL};
        pids[i] = ct_spawn(argv, logs[i]);
        assert_true(pids[i] > 0);
    }
    /* The victim: the other agent of the slowest agent's stage. The
       coordinator then gives the two slots to the two fastest left, which
       held the other stage: one of them must take the slowest's stage and
       load its state from the slowest, now a spare. */
    int victim = -1;
    for (int t = 0; t < 1200 && victim < 0; t++) {
        int ready = 0;
        struct slog sl[NAGENTS2];
        for (int i = 0; i < NAGENTS2; i++)
            ready += read_slog(steplogs[i], &sl[i]) == 0 && sl[i].n >= 3;
        for (int i = 0; ready == NAGENTS2 && i < NAGENTS2 - 1; i++)
            if (sl[i].stage == sl[NAGENTS2 - 1].stage)
                victim = i;
        if (victim < 0)
            usleep(100000);
    }
    assert_true(victim >= 0);
    struct slog before;
    read_slog(steplogs[victim], &before);
    kill(pids[victim], SIGKILL);
    waitpid(pids[victim], NULL, 0);
    pids[victim] = 0;
    printf("killed agent %d (stage %d of pipeline %d) after its step %d\n", victim, before.stage, before.replica,
           before.n);
    /* two of the three left finish the run; the third, a spare, serves its
       state and ends once it sees every member finish */
    int finished[NAGENTS2] = {0};
    for (int i = 0; i < NAGENTS2; i++)
        if (pids[i] > 0) {
            int st = ct_wait(pids[i], 180);
            finished[i] = 1 + st;
            pids[i] = 0;
        }
    static struct slog local, s[NAGENTS2];
    single_process(&local);
    int done = 0, last = -1, moved = 0;
    for (int i = 0; i < NAGENTS2; i++) {
        if (!finished[i])
            continue;
        char *l = ct_read_file(logs[i], NULL);
        if (finished[i] != 1)
            fprintf(stderr, "agent %d exited with %d; its log:\n%s\n", i, finished[i] - 1, l ? l : "");
        assert_int_equal(finished[i], 1);
        assert_int_equal(read_slog(steplogs[i], &s[i]), 0);
        if (i == NAGENTS2 - 1) { /* the slowest: the spare, which served its stage */
            assert_non_null(strstr(l, "(this agent is its spare)"));
            assert_non_null(strstr(l, "while this agent was a spare"));
            free(l);
            continue;
        }
        assert_non_null(strstr(l, "re-scheduled: assignment version"));
        moved += strstr(l, "state after step") != NULL;
        free(l);
        done++;
        if (s[i].stage == 1)
            last = i;
    }
    assert_int_equal(done, 2);
    assert_int_equal(moved, 1); /* one took the other stage, with the spare's state */
    assert_true(last >= 0);
    /* each step's loss: the newest line with one in any log (a step begun
       before the kill was taken again after the re-scheduling) */
    struct slog dead;
    read_slog(steplogs[victim], &dead);
    printf("step  after churn  single\n");
    for (int k = 1; k <= STEPS; k++) {
        double loss = NAN, t = -1;
        for (int i = 0; i <= NAGENTS2; i++) {
            const struct slog *x = i < NAGENTS2 ? &s[i] : &dead;
            if ((i == NAGENTS2 || finished[i]) && isfinite(x->loss[k]) && x->loss_t[k] > t) {
                loss = x->loss[k];
                t = x->loss_t[k];
            }
        }
        printf("%4d  %.6f     %.6f\n", k, loss, local.loss[k]);
        assert_true(isfinite(loss));
        assert_true(fabs(loss - local.loss[k]) <= EQ_TOL_REPLICAS);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_match_single_process),
        cmocka_unit_test(test_replicas_average),
        cmocka_unit_test(test_churn),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
