/* ct-timeout: 180 */
/* Integration tests of pipeline schedules (seed 003_f3537b728458fcc1.txt §3,
 * DT-FM; coordinator/api_pipeline.c): a real PostgreSQL and the real
 * coordinator over HTTPS. A bad config.pipeline is refused when a run is
 * created or changed, naming the field, and nothing is stored; a run
 * without one answers 422 not_pipeline; too few live devices 409
 * not_enough_peers; with four peers in two regions (fast links inside,
 * slow across) the served assignment verifies under the published key over
 * the documented bytes, places every chosen peer once, beats the random
 * baseline and is the layout worked out by hand below; unchanged inputs
 * keep the version, a faster fifth peer is in the next one (5 s after the
 * last solve), and changed figures of the same peers are solved again 30 s
 * after it, starting from the previous partition; while another
 * coordinator holds the run's solve, a GET serves what is stored or answers
 * 503 rather than waiting. With config.pipeline.search "random" the
 * assignment is the seed's random permutation of the chosen devices, the
 * same on a re-solve, another for another seed, and costlier than DT-FM's
 * on the two regions. GET /pipeline/stages (the dashboard's page): its
 * roles and its answer while there is no assignment (its figures:
 * test_pipeline_train, test_dashboard). Fewer replicas when devices leave,
 * and the reports' liveness: tests/integ/test_pipeline_replicas.c; the
 * fetch-and-verify of an assignment both use: tests/harness/ct_pipeline.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libpq-fe.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "sched/dtfm.h"
#include "sched/dtfm_payload.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "ct_pipeline.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol;
static int g_teardown_failed;

#define PW "a-long-password"
#define NPEERS 6 /* A, B (region 1), C, D (region 2), E (fast, region 1), Z (no compute) */
enum { A, B, C, D, E, Z };
static struct cm_ed25519 g_peer[NPEERS];
static char g_pk[NPEERS][64];

/* The two-region run: 100 MB of gradients per stage, 1 MB of activations
 * per micro-batch, 64 samples per step. */
#define PIPE_CONFIG                                                                               \
    "{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1e6,"                        \
    "\"gradient_bytes\":1e8,\"seed\":7}}"

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    return ct_status(&g_c, method, path, bearer, body);
}

/* status and error code as expected, and the message containing `says`. */
static void expect(const char *method, const char *path, const char *bearer, const char *body,
                   long status, const char *code, const char *says)
{
    ct_expect(&g_c, method, path, bearer, body, status, code, says);
}

static long scalar(const char *sql)
{
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return v;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || !(g_org = ct_login(&g_c, "org", PW)))
        return -1;
    if (req("POST", "/api/v1/users", g_org,
            "{\"username\":\"vol\",\"role\":\"volunteer\",\"password\":\"" PW "\"}") != 201 ||
        !(g_vol = ct_login(&g_c, "vol", PW)))
        return -1;
    if (req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"plain\",\"target_batch_size\":64,\"config\":{\"model_parameters\":1000}}") !=
            201 ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"pipe\",\"target_batch_size\":64,\"config\":" PIPE_CONFIG "}") != 201 ||
        req("PUT", "/api/v1/runs/pipe/allowlist/vol", g_org, NULL) != 201)
        return -1;
    for (int i = 0; i < NPEERS; i++) {
        char body[1024];
        if (cm_ed25519_generate(&g_peer[i]) != CM_OK)
            return -1;
        cm_b64url_encode(g_peer[i].pub, CM_ED25519_PUB_LEN, g_pk[i]);
        if (ct_pass_body("pipe", "vol", &g_peer[i], body, sizeof body) != 0 ||
            req("POST", "/api/v1/runs/pipe/passes", g_vol, body) != 201)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NPEERS; i++)
        cm_ed25519_cleanup(&g_peer[i]);
    free(g_org);
    free(g_vol);
    g_teardown_failed = rc != 0;
    return rc;
}

static int region(int p)
{
    return p == C || p == D ? 2 : 1;
}

/* A capability report: 1000 Mbit/s and a 2 ms round trip measured to the
 * peers of its region, 10 Mbit/s and 100 ms to the others (of A-E). */
static void report_to(const char *run, int i, double samples)
{
    char body[2048], path[128];
    int o = snprintf(body, sizeof body,
                     "{\"peer_public_key\":\"%s\",\"samples_per_s\":%g,\"upload_mbps\":1000,"
                     "\"download_mbps\":1000,\"accepts_inbound\":true,\"pairs\":[",
                     g_pk[i], samples);
    int first = 1;
    for (int j = A; j <= E; j++) {
        if (j == i)
            continue;
        o += snprintf(body + o, sizeof body - (size_t)o,
                      "%s{\"peer_public_key\":\"%s\",\"mbps\":%d,\"rtt_ms\":%d}", first ? "" : ",",
                      g_pk[j], region(i) == region(j) ? 1000 : 10, region(i) == region(j) ? 2 : 100);
        first = 0;
    }
    snprintf(body + o, sizeof body - (size_t)o, "]}");
    snprintf(path, sizeof path, "/api/v1/runs/%s/capabilities", run);
    expect("POST", path, g_vol, body, 200, NULL, NULL);
}

static void report(int i, double samples)
{
    report_to("pipe", i, samples);
}

static void test_config_validated(void **state)
{
    (void)state;
    static const struct {
        const char *config, *field;
    } bad[] = {
        {"{\"pipeline\":3}", "config.pipeline"},
        {"{\"pipeline\":{\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1}}",
         "config.pipeline.stages"},
        {"{\"pipeline\":{\"stages\":0,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1}}",
         "config.pipeline.stages"},
        {"{\"pipeline\":{\"stages\":65,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1}}",
         "config.pipeline.stages"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":\"two\",\"activation_bytes\":1,"
         "\"gradient_bytes\":1}}",
         "config.pipeline.replicas"},
        {"{\"pipeline\":{\"stages\":20,\"replicas\":13,\"activation_bytes\":1,\"gradient_bytes\":1}}",
         "at most 256 devices"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"gradient_bytes\":1}}",
         "config.pipeline.activation_bytes"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":-1,\"gradient_bytes\":1}}",
         "config.pipeline.activation_bytes"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1e15,"
         "\"gradient_bytes\":1}}",
         "config.pipeline.activation_bytes"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1}}",
         "config.pipeline.gradient_bytes"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":0}}",
         "config.pipeline.gradient_bytes"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"compression\":\"q8\"}}",
         "config.pipeline.compression"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"compression\":16}}",
         "config.pipeline.compression"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"seed\":-1}}",
         "config.pipeline.seed"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"seed\":1.5}}",
         "config.pipeline.seed"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"min_replicas\":0}}",
         "config.pipeline.min_replicas"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"min_replicas\":3}}",
         "config.pipeline.min_replicas"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"min_replicas\":1.5}}",
         "config.pipeline.min_replicas"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"min_replicas\":\"1\"}}",
         "config.pipeline.min_replicas"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"liveness_s\":9}}",
         "config.pipeline.liveness_s"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"liveness_s\":121}}",
         "config.pipeline.liveness_s"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"liveness_s\":30.5}}",
         "config.pipeline.liveness_s"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"liveness_s\":null}}",
         "config.pipeline.liveness_s"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"search\":\"best\"}}",
         "config.pipeline.search"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"search\":\"Random\"}}",
         "config.pipeline.search"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"search\":1}}",
         "config.pipeline.search"},
        {"{\"pipeline\":{\"stages\":2,\"replicas\":2,\"activation_bytes\":1,\"gradient_bytes\":1,"
         "\"search\":null}}",
         "config.pipeline.search"},
    };
    long runs = scalar("SELECT count(*) FROM runs");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"name\":\"bad%zu\",\"target_batch_size\":64,\"config\":%s}",
                 i, bad[i].config);
        expect("POST", "/api/v1/runs", g_org, body, 400, "invalid_request", bad[i].field);
        /* ... and the same config in a PATCH leaves the run as it was */
        snprintf(body, sizeof body, "{\"config\":%s}", bad[i].config);
        expect("PATCH", "/api/v1/runs/plain", g_org, body, 400, "invalid_request", bad[i].field);
    }
    assert_int_equal(scalar("SELECT count(*) FROM runs"), runs);
    assert_int_equal(scalar("SELECT count(*) FROM runs WHERE name = 'plain' AND "
                            "config = '{\"model_parameters\":1000}'::jsonb"),
                     1);
    /* Defaults from the model: a transformer's activations and the
     * parameter count's gradients. */
    expect("POST", "/api/v1/runs", g_org,
           "{\"name\":\"gptpipe\",\"target_batch_size\":64,\"config\":{"
           "\"steps\":100,\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},\"model_parameters\":"
           "1000000,\"model\":{\"type\":\"gpt\",\"vocab\":256,\"context\":128,\"layers\":4,"
           "\"heads\":4,\"d_model\":64},\"pipeline\":{\"stages\":4,\"replicas\":2}}}",
           201, NULL, NULL);
}

/* GET /pipeline/stages (the dashboard's Pipeline page) while the run has no
 * assignment: who may read it, and the waiting state (3 of 2 x 2 devices
 * live; the peer that cannot compute is not one). */
static void expect_stages_waiting(void)
{
    expect("GET", "/api/v1/runs/pipe/pipeline/stages", NULL, NULL, 401, NULL, NULL);
    expect("GET", "/api/v1/runs/nope/pipeline/stages", g_org, NULL, 404, "not_found", NULL);
    expect("GET", "/api/v1/runs/plain/pipeline/stages", g_org, NULL, 422, "not_pipeline", NULL);
    char *out = NULL;
    assert_int_equal(req("POST", "/api/v1/users", g_org,
                         "{\"username\":\"outsider\",\"role\":\"volunteer\",\"password\":\"" PW
                         "\"}"),
                     201);
    assert_non_null(out = ct_login(&g_c, "outsider", PW));
    expect("GET", "/api/v1/runs/pipe/pipeline/stages", out, NULL, 403, "not_allowlisted", NULL);
    free(out);
    struct ct_resp r;
    assert_int_equal(ct_http(&g_c, "GET", "/api/v1/runs/pipe/pipeline/stages", g_vol, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(json_is_null(json_object_get(r.json, "version")));
    assert_true(json_is_null(json_object_get(r.json, "predicted")));
    assert_true(json_is_null(json_object_get(r.json, "measured")));
    assert_int_equal(json_array_size(json_object_get(r.json, "slots")), 0);
    assert_int_equal(json_integer_value(json_object_get(r.json, "stages")), 2);
    assert_int_equal(json_integer_value(json_object_get(r.json, "replicas")), 2);
    assert_int_equal(json_integer_value(json_object_get(r.json, "live_devices")), 3);
    ct_resp_free(&r);
}

static void test_not_pipeline_and_too_few(void **state)
{
    (void)state;
    expect("GET", "/api/v1/runs/nope/pipeline", NULL, NULL, 404, "not_found", NULL);
    expect("GET", "/api/v1/runs/plain/pipeline", NULL, NULL, 422, "not_pipeline", NULL);
    expect("GET", "/api/v1/runs/pipe/pipeline", NULL, NULL, 409, "not_enough_peers",
           "needs 4 devices (2 stages x min_replicas 2), 0 live");
    report(A, 100);
    report(B, 100);
    report(C, 100);
    /* a peer that cannot compute is no device */
    char body[512];
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":0,\"upload_mbps\":10000,"
             "\"download_mbps\":10000,\"accepts_inbound\":true}",
             g_pk[Z]);
    expect("POST", "/api/v1/runs/pipe/capabilities", g_vol, body, 200, NULL, NULL);
    expect("GET", "/api/v1/runs/pipe/pipeline", NULL, NULL, 409, "not_enough_peers",
           "needs 4 devices (2 stages x min_replicas 2), 3 live");
    assert_int_equal(scalar("SELECT count(*) FROM pipelines"), 0);
    expect_stages_waiting();
}

static void fetch_verified_run(const char *run, size_t stages, size_t replicas, struct ct_served *sv)
{
    ct_pipeline_fetch_verified(&g_c, run, stages, replicas, sv);
}

static void fetch_verified(struct ct_served *sv)
{
    fetch_verified_run("pipe", 2, 2, sv);
}

/* Which of our peers a key is, or -1. */
static int peer_of(const char *k64)
{
    for (int i = 0; i < NPEERS; i++)
        if (k64 && !strcmp(k64, g_pk[i]))
            return i;
    return -1;
}

/* slot[i][j] = our peer at replica i, stage j; each chosen peer exactly once. */
static void layout(const json_t *p, int slot[2][2])
{
    json_t *asg = json_object_get(p, "assignment");
    assert_int_equal(json_array_size(asg), 2);
    int seen[NPEERS] = {0};
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(asg, i);
        assert_int_equal(json_array_size(row), 2);
        for (size_t j = 0; j < 2; j++) {
            int q = peer_of(json_string_value(json_array_get(row, j)));
            assert_true(q >= 0);
            assert_int_not_equal(q, Z);
            assert_int_equal(seen[q]++, 0);
            slot[i][j] = q;
        }
    }
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* By hand, with dtfm.h's formulas; the delay alpha is half the reported
 * round trip: 1 ms inside a region, 50 ms across.
 * c_DP = 1e8 bytes, D = 2: one data-parallel pair costs 2 (alpha + 8e8 / 2 / beta);
 * c_PP = 1e6 bytes: one pipeline hop 2 (alpha + 8e6 / beta).
 * The stages of a pipeline exchange their norms after the averaging: the
 * pipeline term gains the largest one-way delay inside a pipeline.
 *  - each region a data-parallel group (a stage), pipelines cross regions:
 *    dp = 2 (0.001 + 0.4) = 0.802 s, pp = 2 (0.05 + 0.8) + 0.05 = 1.75 s;
 *  - each region a pipeline, stages' groups cross regions:
 *    dp = 2 (0.05 + 40) = 80.1 s, pp = 2 (0.001 + 0.008) + 0.001 = 0.019 s;
 * (the third partition, {A, D} / {B, C}, is as bad as the second.) Compute:
 * 64 samples / (2 replicas x 2 stages) / 100 samples/s = 0.16 s per stage,
 * and the stages compute in turn: 0.32 s either way.
 * So the first: 2.872 s against 80.439 s. */
static void test_two_regions(void **state)
{
    (void)state;
    report(D, 100);
    struct ct_served sv;
    fetch_verified(&sv);
    assert_true(sv.solved_now);
    assert_int_equal(sv.version, 1);
    int slot[2][2];
    layout(sv.p, slot);
    for (int j = 0; j < 2; j++) /* each stage's group is one region */
        assert_int_equal(region(slot[0][j]), region(slot[1][j]));
    for (int i = 0; i < 2; i++) /* each pipeline crosses */
        assert_int_not_equal(region(slot[i][0]), region(slot[i][1]));
    assert_int_equal(json_array_size(json_object_get(sv.p, "spares")), 0);
    const json_t *pr = json_object_get(sv.p, "predicted");
    assert_true(fabs(num(pr, "dp_s") - 0.802) < 1e-9);
    assert_true(fabs(num(pr, "pp_s") - 1.75) < 1e-9);
    assert_true(fabs(num(pr, "compute_s") - 0.32) < 1e-9);
    assert_true(fabs(num(pr, "total_s") - 2.872) < 1e-9);
    assert_true(num(pr, "total_s") < num(sv.p, "random_mean_s"));
    assert_true(fabs(num(sv.p, "activation_bytes") - 1e6) < 1e-3);
    assert_true(fabs(num(sv.p, "gradient_bytes") - 1e8) < 1e-3);
    json_decref(sv.p);
    /* Stored with its inputs, result and solve time. */
    assert_int_equal(scalar("SELECT count(*) FROM pipelines WHERE version = 1 AND solve_ms > 0 "
                            "AND length(signature) = 64 AND "
                            "jsonb_array_length(inputs->'devices') = 4 AND "
                            "jsonb_array_length(result->'partition') = 4"),
                     1);
}

static void test_stable_then_faster_peer(void **state)
{
    (void)state;
    struct ct_served sv;
    /* Unchanged inputs (a re-report with the same figures): the same version. */
    report(B, 100);
    fetch_verified(&sv);
    assert_int_equal(sv.version, 1);
    assert_false(sv.solved_now);
    json_decref(sv.p);

    /* A faster fifth peer in region 1: the four fastest are E and, of the
     * equally fast A-D, the three lowest keys; the fourth is a spare. Within
     * the hysteresis after the last solve, the stored one is served... */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET created_at = now()"), 0);
    report(E, 200);
    fetch_verified(&sv);
    assert_int_equal(sv.version, 1);
    json_decref(sv.p);
    /* ... and once it has passed (moved back rather than slept through), a
     * new version has E in. */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET created_at = created_at - "
                                       "interval '10 seconds'"),
                     0);
    fetch_verified(&sv);
    assert_int_equal(sv.version, 2);
    assert_true(sv.solved_now);
    int slot[2][2], inE = 0, spare = A;
    layout(sv.p, slot);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            inE |= slot[i][j] == E;
    assert_true(inE);
    for (int q = B; q <= D; q++)
        if (memcmp(g_peer[q].pub, g_peer[spare].pub, 32) > 0)
            spare = q;
    json_t *spares = json_object_get(sv.p, "spares");
    assert_int_equal(json_array_size(spares), 1);
    assert_int_equal(peer_of(json_string_value(json_array_get(spares, 0))), spare);
    /* (when E's region holds three of the four, every assignment costs the
       same, and the mean of 20 equal costs may round a last bit below) */
    assert_true(num(json_object_get(sv.p, "predicted"), "total_s") <=
                num(sv.p, "random_mean_s") * (1 + 1e-12));
    json_decref(sv.p);
    assert_int_equal(scalar("SELECT count(*) FROM pipelines"), 2);
    /* ... and that one stays while nothing changes. */
    fetch_verified(&sv);
    assert_int_equal(sv.version, 2);
    assert_false(sv.solved_now);
    json_decref(sv.p);

    /* Only a figure changes (the same devices): 10 s after the last solve
     * is inside the 30 s window for that, so the assignment stays ... */
    report(E, 210);
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET created_at = created_at - "
                                       "interval '10 seconds'"),
                     0);
    fetch_verified(&sv);
    assert_int_equal(sv.version, 2);
    json_decref(sv.p);
    /* ... and after it, the re-solve starts from the previous partition. */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET created_at = created_at - "
                                       "interval '30 seconds'"),
                     0);
    fetch_verified(&sv);
    assert_int_equal(sv.version, 3);
    assert_true(sv.solved_now);
    json_decref(sv.p);
    assert_int_equal(scalar("SELECT count(*) FROM pipelines WHERE version = 3 AND "
                            "(result->>'warm_start')::boolean AND "
                            "(result->>'generations')::int = 200"),
                     1);
    assert_int_equal(scalar("SELECT count(*) FROM pipelines WHERE version = 2 AND "
                            "NOT (result->>'warm_start')::boolean"),
                     1);
}

/* Allowlists vol on run, and A-D get passes and report to it. */
static void join_four(const char *run)
{
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/allowlist/vol", run);
    assert_int_equal(req("PUT", path, g_org, NULL), 201);
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", run);
    for (int i = A; i <= D; i++) {
        char body[1024];
        assert_int_equal(ct_pass_body(run, "vol", &g_peer[i], body, sizeof body), 0);
        assert_int_equal(req("POST", path, g_vol, body), 201);
        report_to(run, i, 100);
    }
}

/* The sizes a config leaves out come from its model (docs/pipelines.md):
 * activations ceil(B / D) x context x d_model x 4 bytes, gradients
 * model_parameters x 4 / S. */
static void test_defaults_from_model(void **state)
{
    (void)state;
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"gpt22\",\"target_batch_size\":63,\"config\":{"
                         "\"steps\":100,\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},"
                         "\"model_parameters\":1000000,\"model\":{\"type\":\"gpt\",\"vocab\":256,"
                         "\"context\":128,\"layers\":4,\"heads\":4,\"d_model\":64},"
                         "\"pipeline\":{\"stages\":2,\"replicas\":2}}}"),
                     201);
    join_four("gpt22");
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/gpt22/pipeline", NULL, NULL, &r);
    if (r.status != 200)
        fail_msg("GET gpt22 pipeline: %ld %s", r.status, r.body ? r.body : "");
    json_t *p = json_object_get(r.json, "pipeline");
    assert_true(num(p, "activation_bytes") == 32.0 * 128 * 64 * 4); /* ceil(63 / 2) = 32 */
    assert_true(num(p, "gradient_bytes") == 2e6);
    ct_resp_free(&r);    /* with fp16 activations (pipeline.compression), half the bytes */
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"gpt22h\",\"target_batch_size\":63,\"config\":{"
                         "\"steps\":100,\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},"
                         "\"model_parameters\":1000000,\"model\":{\"type\":\"gpt\",\"vocab\":256,"
                         "\"context\":128,\"layers\":4,\"heads\":4,\"d_model\":64},"
                         "\"pipeline\":{\"stages\":2,\"replicas\":2,\"compression\":\"fp16\"}}}"),
                     201);
    join_four("gpt22h");
    ct_http(&g_c, "GET", "/api/v1/runs/gpt22h/pipeline", NULL, NULL, &r);
    if (r.status != 200)
        fail_msg("GET gpt22h pipeline: %ld %s", r.status, r.body ? r.body : "");
    p = json_object_get(r.json, "pipeline");
    assert_true(num(p, "activation_bytes") == 32.0 * 128 * 64 * 2);
    ct_resp_free(&r);
}

/* ---- config.pipeline.search "random" (issue 19: DT-FM against a random
 * assignment on real hosts) ---- */

/* The two-region run of PIPE_CONFIG with a seed and a search. */
static void rnd_config(char *buf, size_t cap, const char *wrap_name, unsigned long long seed,
                       const char *search)
{
    snprintf(buf, cap,
             "{%s%s%s\"target_batch_size\":64,\"config\":{\"pipeline\":{\"stages\":2,"
             "\"replicas\":2,\"activation_bytes\":1e6,\"gradient_bytes\":1e8,\"seed\":%llu,"
             "\"search\":\"%s\"}}}",
             wrap_name ? "\"name\":\"" : "", wrap_name ? wrap_name : "", wrap_name ? "\"," : "",
             seed, search);
}

/* What the coordinator must serve for search "random" and seed: the
 * devices (A-D) in key order, permuted by dtfm_random_assignment from a
 * splitmix64 state equal to the seed. slot[i][j] = our peer at replica i,
 * stage j. */
static void rnd_expected(uint64_t seed, int slot[2][2])
{
    int order[4] = {A, B, C, D};
    for (int i = 1; i < 4; i++) /* by key */
        for (int k = i; k > 0 && memcmp(g_peer[order[k - 1]].pub, g_peer[order[k]].pub, 32) > 0;
             k--) {
            int t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    double delay[16] = {0}, bw[16];
    for (int i = 0; i < 16; i++)
        bw[i] = 1e9;
    struct dtfm_problem prob = {2, 2, delay, bw, 1, 1, NULL, NULL};
    struct dtfm_model *m = NULL;
    const char *why = "";
    assert_int_equal(dtfm_model_new(&prob, &m, &why), CM_OK);
    uint32_t asg[4];
    uint64_t rng = seed;
    dtfm_random_assignment(m, &rng, asg);
    dtfm_model_free(m);
    for (int k = 0; k < 4; k++)
        slot[k / 2][k % 2] = order[asg[k]];
}

/* The cost model's seconds for a layout of A-D as it is (dtfm.h; the
 * numbers of test_two_regions): a stage's pair inside a region 0.802 s,
 * across 80.1 s; a pipeline hop inside 0.018 s, across 1.7 s; compute
 * 0.32 s (0.16 s per stage, in turn). */
static double rnd_cost(int slot[2][2], double *dp, double *pp)
{
    *dp = 0;
    *pp = 0;
    for (int j = 0; j < 2; j++)
        *dp = fmax(*dp, region(slot[0][j]) == region(slot[1][j]) ? 0.802 : 80.1);
    for (int i = 0; i < 2; i++)
        *pp = fmax(*pp, region(slot[i][0]) == region(slot[i][1]) ? 0.019 : 1.75); /* with the norms */
    return *dp + *pp + 0.32;
}

static int same_layout(int a[2][2], int b[2][2])
{
    return a[0][0] == b[0][0] && a[0][1] == b[0][1] && a[1][0] == b[1][0] && a[1][1] == b[1][1];
}

/* 1 when run rnd's stored version v satisfies cond (SQL over the row), else 0. */
static long rnd_row(long long v, const char *cond)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pipelines p JOIN runs r ON r.id = p.run_id WHERE r.name = "
             "'rnd' AND p.version = %lld AND %s",
             v, cond);
    return scalar(sql);
}

/* rnd's solves moved s seconds back (past the 30 s for changed inputs of
 * the same devices). */
static void rnd_solved_earlier(int s)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE pipelines SET created_at = created_at - interval '%d seconds' WHERE run_id "
             "= (SELECT id FROM runs WHERE name = 'rnd')",
             s);
    assert_int_equal(ct_pg_exec(&g_pg, sql), 0);
}

/* search "random": the served assignment is the seed's uniformly random
 * permutation of the chosen devices (a valid one: each of A-D once), its
 * predicted cost that permutation's as it is, the same on a re-solve with
 * the same seed, another with another seed; changing the search re-solves,
 * and DT-FM's assignment of the same devices costs less. */
static void test_random_search(void **state)
{
    (void)state;
    /* Seeds, from the keys (fresh each run): s1 one whose assignment is
     * not DT-FM's layout (each stage's group one region; one in three
     * assignments is), s2 the next one with another assignment. */
    unsigned long long s1 = 1, s2;
    int want1[2][2], want2[2][2], slot[2][2];
    double dp, pp;
    for (;; s1++) {
        rnd_expected(s1, want1);
        if (rnd_cost(want1, &dp, &pp) > 2.872 + 1e-6)
            break;
        assert_true(s1 < 100);
    }
    for (s2 = s1 + 1;; s2++) {
        rnd_expected(s2, want2);
        if (!same_layout(want1, want2))
            break;
        assert_true(s2 < s1 + 100);
    }
    char body[512];
    rnd_config(body, sizeof body, "rnd", s1, "random");
    expect("POST", "/api/v1/runs", g_org, body, 201, NULL, NULL);
    join_four("rnd");

    struct ct_served sv;
    fetch_verified_run("rnd", 2, 2, &sv);
    assert_int_equal(sv.version, 1);
    assert_true(sv.solved_now);
    layout(sv.p, slot); /* each chosen peer once */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            assert_true(slot[i][j] >= A && slot[i][j] <= D);
    assert_true(same_layout(slot, want1));
    const json_t *pr = json_object_get(sv.p, "predicted");
    double want_total = rnd_cost(slot, &dp, &pp);
    double random_total = num(pr, "total_s");
    assert_true(fabs(num(pr, "dp_s") - dp) < 1e-9);
    assert_true(fabs(num(pr, "pp_s") - pp) < 1e-9);
    assert_true(fabs(num(pr, "compute_s") - 0.32) < 1e-9);
    assert_true(fabs(random_total - want_total) < 1e-9);
    assert_true(num(sv.p, "random_mean_s") > 2.872);
    assert_int_equal(json_array_size(json_object_get(sv.p, "spares")), 0);
    json_decref(sv.p);
    assert_int_equal(rnd_row(1, "result->>'search' = 'random' AND "
                                "NOT (result->>'warm_start')::boolean AND "
                                "(result->>'generations')::int = 0 AND "
                                "jsonb_array_length(result->'partition') = 4 AND "
                                "inputs->'run'->>'search' = 'random'"),
                     1);

    /* The same inputs solved again (its validity running out): the same
     * assignment, not warm-started. */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET valid_until = now() + interval "
                                       "'60 seconds' WHERE run_id = (SELECT id FROM runs WHERE "
                                       "name = 'rnd')"),
                     0);
    fetch_verified_run("rnd", 2, 2, &sv);
    assert_int_equal(sv.version, 2);
    assert_true(sv.solved_now);
    layout(sv.p, slot);
    assert_true(same_layout(slot, want1));
    assert_true(num(json_object_get(sv.p, "predicted"), "total_s") == random_total);
    json_decref(sv.p);
    assert_int_equal(rnd_row(2, "result->>'search' = 'random' AND "
                                "NOT (result->>'warm_start')::boolean"),
                     1);

    /* Another seed: a change of inputs (solved again after 30 s, the
     * devices being the same), another assignment. */
    rnd_config(body, sizeof body, NULL, s2, "random");
    expect("PATCH", "/api/v1/runs/rnd", g_org, body, 200, NULL, NULL);
    fetch_verified_run("rnd", 2, 2, &sv);
    assert_int_equal(sv.version, 2);
    json_decref(sv.p);
    rnd_solved_earlier(40);
    fetch_verified_run("rnd", 2, 2, &sv);
    assert_int_equal(sv.version, 3);
    layout(sv.p, slot);
    assert_true(same_layout(slot, want2));
    assert_false(same_layout(slot, want1));
    assert_true(fabs(num(json_object_get(sv.p, "predicted"), "total_s") -
                     rnd_cost(slot, &dp, &pp)) < 1e-9);
    json_decref(sv.p);

    /* The search changed to DT-FM's, seed s1 again: solved again (the
     * search is an input), each stage's group one region, and the random
     * assignment of s1 costs more than this one. */
    rnd_config(body, sizeof body, NULL, s1, "dtfm");
    expect("PATCH", "/api/v1/runs/rnd", g_org, body, 200, NULL, NULL);
    rnd_solved_earlier(40);
    fetch_verified_run("rnd", 2, 2, &sv);
    assert_int_equal(sv.version, 4);
    assert_true(sv.solved_now);
    layout(sv.p, slot);
    for (int j = 0; j < 2; j++)
        assert_int_equal(region(slot[0][j]), region(slot[1][j]));
    double dtfm_total = num(json_object_get(sv.p, "predicted"), "total_s");
    assert_true(fabs(dtfm_total - 2.872) < 1e-9);
    assert_true(random_total >= dtfm_total);
    assert_true(random_total > dtfm_total + 1); /* s1 was picked so */
    json_decref(sv.p);
    assert_int_equal(rnd_row(4, "result->>'search' = 'dtfm' AND "
                                "(result->>'generations')::int = 200 AND "
                                "inputs->'run'->>'search' = 'dtfm'"),
                     1);
}

/* The run rep3: 2 stages x 3 replicas, at least 2, reports living 10 s. */
/* The advisory lock class of pipeline solves (coordinator/api_pipeline.c). */
#define PIPE_LOCK_SQL(run)                                                                         \
    "SELECT pg_advisory_lock(596449, (SELECT id FROM runs WHERE name = '" run "')::int)"

static void pg_ok(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(pg));
    PQclear(r);
}

/* Another coordinator solving the run (its advisory lock held, here by
 * the test's own session): a GET does not wait for that solve on a
 * database connection. It serves the stored assignment, or, when the run
 * has none yet, answers 503 solving; once the lock is free it solves. */
static void test_other_solver(void **state)
{
    (void)state;
    PGconn *pg = PQconnectdb(g_pg.url);
    assert_int_equal(PQstatus(pg), CONNECTION_OK);
    pg_ok(pg, PIPE_LOCK_SQL("pipe"));
    report(E, 220);
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE pipelines SET created_at = created_at - "
                                       "interval '40 seconds'"),
                     0);
    struct ct_served sv;
    fetch_verified(&sv);
    assert_int_equal(sv.version, 3);
    assert_false(sv.solved_now);
    json_decref(sv.p);

    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"pipe2\",\"target_batch_size\":64,\"config\":" PIPE_CONFIG
                         "}"),
                     201);
    join_four("pipe2");
    pg_ok(pg, PIPE_LOCK_SQL("pipe2"));
    expect("GET", "/api/v1/runs/pipe2/pipeline", NULL, NULL, 503, "solving", NULL);
    assert_int_equal(scalar("SELECT count(*) FROM pipelines p JOIN runs r ON r.id = p.run_id "
                            "WHERE r.name = 'pipe2'"),
                     0);

    pg_ok(pg, "SELECT pg_advisory_unlock_all()");
    fetch_verified(&sv);
    assert_int_equal(sv.version, 4);
    assert_true(sv.solved_now);
    json_decref(sv.p);
    expect("GET", "/api/v1/runs/pipe2/pipeline", NULL, NULL, 200, NULL, NULL);
    PQfinish(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validated),
        cmocka_unit_test(test_not_pipeline_and_too_few),
        cmocka_unit_test(test_two_regions),
        cmocka_unit_test(test_stable_then_faster_peer),
        cmocka_unit_test(test_other_solver),
        cmocka_unit_test(test_defaults_from_model),
        cmocka_unit_test(test_random_search),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
