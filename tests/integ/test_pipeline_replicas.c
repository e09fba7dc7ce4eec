/* ct-timeout: 180 */
/* Pipeline runs that go on when devices leave (issue 19; seed
 * 003_f3537b728458fcc1.txt lists fault tolerance as future work;
 * coordinator/api_pipeline.c, coordinator/api_caps.c): a real PostgreSQL
 * and the real coordinator over HTTPS, capability reports of synthetic
 * peers.
 *
 *  - fewer replicas: config.pipeline.min_replicas is validated; a run's
 *    first assignment needs S x D devices; later, with m eligible devices,
 *    the coordinator solves for D' = min(D, m / S) pipelines while
 *    D' >= min_replicas (spares as usual, activation_bytes for D'), else 409
 *    not_enough_peers naming the minimum; D' grows back with the devices.
 *  - liveness: a pipeline run's capability reports live
 *    config.pipeline.liveness_s (report_ttl_s says so; others 120 s), and a
 *    device that stops reporting is out of the next assignment once that
 *    has passed.
 * The other pipeline tests (validation, two regions, re-solving, random
 * search, two coordinators): tests/integ/test_pipeline.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "ct_pipeline.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol;
static int g_teardown_failed;

#define PW "a-long-password"
#define NREP 6 /* R0 (fastest) ... R5: the devices of run rep3 */
static struct cm_ed25519 g_rep[NREP];
static char g_rk[NREP][64];

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    return ct_status(&g_c, method, path, bearer, body);
}

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

static void fetch_verified_run(const char *run, size_t stages, size_t replicas, struct ct_served *sv)
{
    ct_pipeline_fetch_verified(&g_c, run, stages, replicas, sv);
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
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
        !(g_vol = ct_login(&g_c, "vol", PW)) ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"plain\",\"target_batch_size\":64,\"config\":{\"model_parameters\":1000}}") != 201)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NREP; i++)
        cm_ed25519_cleanup(&g_rep[i]);
    free(g_org);
    free(g_vol);
    g_teardown_failed = rc != 0;
    return rc;
}

#define REP3_CONFIG                                                                                \
    "{\"steps\":100,\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},"              \
    "\"model_parameters\":1000000,\"model\":{\"type\":\"gpt\",\"vocab\":256,\"context\":128,"   \
    "\"layers\":4,\"heads\":4,\"d_model\":64},\"pipeline\":{\"stages\":2,\"replicas\":3,"          \
    "\"min_replicas\":2,\"liveness_s\":10,\"seed\":3}}"
#define REP3_SAMPLE_BYTES (128.0 * 64 * 4) /* context x d_model x fp32 */

static double rep_speed(int i)
{
    return 160 - 10 * i;
}

/* A capability report of key k64 to run without pairs (bandwidth from the
 * declared figures); its expires_at, and the report_ttl_s it was given. */
static long long report_key(const char *run, const char *k64, double samples, long *ttl_s)
{
    char body[512], path[128];
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":%g,\"upload_mbps\":1000,"
             "\"download_mbps\":1000,\"accepts_inbound\":true}",
             k64, samples);
    snprintf(path, sizeof path, "/api/v1/runs/%s/capabilities", run);
    struct ct_resp r;
    ct_http(&g_c, "POST", path, g_vol, body, &r);
    if (r.status != 200)
        fail_msg("POST %s: %ld %s", path, r.status, r.body ? r.body : "");
    json_t *exp = json_object_get(r.json, "expires_at"), *ttl = json_object_get(r.json, "report_ttl_s");
    assert_true(json_is_integer(exp) && json_is_integer(ttl));
    if (ttl_s)
        *ttl_s = (long)json_integer_value(ttl);
    long long e = json_integer_value(exp);
    ct_resp_free(&r);
    return e;
}

static int rep_of(const char *k64)
{
    for (int i = 0; i < NREP; i++)
        if (k64 && !strcmp(k64, g_rk[i]))
            return i;
    return -1;
}

/* Which of R0-R5 the assignment places (each once), as bits. */
static unsigned rep_assigned(const json_t *p)
{
    unsigned mask = 0;
    size_t i, j;
    json_t *row, *k;
    json_array_foreach(json_object_get(p, "assignment"), i, row) {
        json_array_foreach(row, j, k) {
            int q = rep_of(json_string_value(k));
            assert_true(q >= 0);
            assert_false(mask & (1u << q));
            mask |= 1u << q;
        }
    }
    return mask;
}

/* The spares, as R numbers in their order, -1 ended. */
static void rep_spares(const json_t *p, int *out, size_t cap)
{
    size_t i;
    json_t *k;
    json_t *sp = json_object_get(p, "spares");
    assert_true(json_array_size(sp) < cap);
    json_array_foreach(sp, i, k) {
        out[i] = rep_of(json_string_value(k));
        assert_true(out[i] >= 0);
    }
    out[json_array_size(sp)] = -1;
}

/* R_i's report has expired: moved back as if made 11 s ago, past
 * liveness_s (10 s; test_liveness waits for it once). */
static void rep_gone(int i)
{
    char sql[640];
    snprintf(sql, sizeof sql,
             "UPDATE capabilities SET first_reported_at = first_reported_at - interval '11 s', "
             "reported_at = reported_at - interval '11 s', expires_at = expires_at - "
             "interval '11 s' WHERE run_id = "
             "(SELECT id FROM runs WHERE name = 'rep3') AND translate(rtrim(encode("
             "peer_public_key, 'base64'), '='), '+/', '-_') = '%s'",
             g_rk[i]);
    assert_int_equal(ct_pg_exec(&g_pg, sql), 0);
}

/* rep3's solves s seconds earlier (10: past the 5 s for a changed device
 * set; 40: past the 30 s for other changes, a spare's among them). */
static void rep3_solved_earlier(int s)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE pipelines SET created_at = created_at - interval '%d seconds' WHERE run_id "
             "= (SELECT id FROM runs WHERE name = 'rep3')",
             s);
    assert_int_equal(ct_pg_exec(&g_pg, sql), 0);
}

static long rep3_inputs_replicas(long long version)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT (p.inputs->'run'->>'replicas')::int FROM pipelines p JOIN runs r ON r.id = "
             "p.run_id WHERE r.name = 'rep3' AND p.version = %lld",
             version);
    return scalar(sql);
}

/* With fewer than S x D live devices the coordinator solves for D' =
 * min(D, floor(live / S)) replicas while D' >= min_replicas, once the run
 * has had an assignment (the first waits for S x D): the payload's
 * replicas is D', the fastest S x D' devices are chosen and the rest are
 * spares, the derived activation size is ceil(B / D') samples' worth, and
 * a change of D' either way is a new version. Below min_replicas: 409
 * naming it. */
static void test_fewer_replicas(void **state)
{
    (void)state;
    /* The derived activations are bounded for min_replicas' micro-batch,
     * the largest a solve can use: ceil(1000 / 4) x 2^20 x 2^20 x 4 is over
     * 1e15, ceil(1000 / 64) x ... is not. Such a model is no recipe an agent
     * could train (context and width above 65,536), so once past the
     * pipeline's bound the run is refused by the recipe check. */
#define BIGACT(min)                                                                                \
    "{\"name\":\"bigact\",\"target_batch_size\":1000,\"config\":{\"model_parameters\":1000,"     \
    "\"model\":{\"type\":\"gpt\",\"context\":1048576,\"d_model\":1048576},\"pipeline\":{"       \
    "\"stages\":1,\"replicas\":64" min "}}}"
    expect("POST", "/api/v1/runs", g_org, BIGACT(",\"min_replicas\":4"), 400, "invalid_request",
           "config.pipeline.activation_bytes");
    expect("POST", "/api/v1/runs", g_org, BIGACT(""), 400, "invalid_request",
           "the training recipe");
#undef BIGACT
    char body[1024];

    expect("POST", "/api/v1/runs", g_org,
           "{\"name\":\"rep3\",\"target_batch_size\":64,\"config\":" REP3_CONFIG "}", 201, NULL,
           NULL);
    assert_int_equal(req("PUT", "/api/v1/runs/rep3/allowlist/vol", g_org, NULL), 201);
    for (int i = 0; i < NREP; i++) {
        assert_int_equal(cm_ed25519_generate(&g_rep[i]), CM_OK);
        cm_b64url_encode(g_rep[i].pub, CM_ED25519_PUB_LEN, g_rk[i]);
        assert_int_equal(ct_pass_body("rep3", "vol", &g_rep[i], body, sizeof body), 0);
        assert_int_equal(req("POST", "/api/v1/runs/rep3/passes", g_vol, body), 201);
    }
    /* A first assignment waits for all S x D: agents start as they come. */
    for (int i = 0; i < 4; i++)
        report_key("rep3", g_rk[i], rep_speed(i), NULL);
    expect("GET", "/api/v1/runs/rep3/pipeline", NULL, NULL, 409, "not_enough_peers",
           "needs 6 devices (2 stages x 3 replicas) for its first assignment, 4 live");
    for (int i = 4; i < NREP; i++)
        report_key("rep3", g_rk[i], rep_speed(i), NULL);

    /* 6 devices: 3 replicas, ceil(64 / 3) = 22 samples per micro-batch. */
    struct ct_served sv;
    int sp[NREP + 1];
    fetch_verified_run("rep3", 2, 3, &sv);
    assert_int_equal(sv.version, 1);
    assert_int_equal(rep_assigned(sv.p), 0x3f);
    assert_int_equal(json_array_size(json_object_get(sv.p, "spares")), 0);
    assert_true(num(sv.p, "activation_bytes") == 22 * REP3_SAMPLE_BYTES);
    json_decref(sv.p);
    assert_int_equal(rep3_inputs_replicas(1), 3);

    /* R5 gone, 5 live: 2 replicas of the four fastest, R4 the spare;
     * 32 samples per micro-batch. */
    rep_gone(5);
    rep3_solved_earlier(10);
    fetch_verified_run("rep3", 2, 2, &sv);
    assert_int_equal(sv.version, 2);
    assert_true(sv.solved_now);
    assert_int_equal(rep_assigned(sv.p), 0x0f);
    rep_spares(sv.p, sp, NREP + 1);
    assert_int_equal(sp[0], 4);
    assert_int_equal(sp[1], -1);
    assert_true(num(sv.p, "activation_bytes") == 32 * REP3_SAMPLE_BYTES);
    json_decref(sv.p);
    assert_int_equal(rep3_inputs_replicas(2), 2);
    /* ... served as it is while nothing changes */
    fetch_verified_run("rep3", 2, 2, &sv);
    assert_int_equal(sv.version, 2);
    assert_false(sv.solved_now);
    json_decref(sv.p);

    /* R4 gone too, 4 live: still 2 replicas of the same devices, no spare
     * (only the spares changed: solved again after 30 s, not 5). */
    rep_gone(4);
    rep3_solved_earlier(10);
    fetch_verified_run("rep3", 2, 2, &sv);
    assert_int_equal(sv.version, 2);
    json_decref(sv.p);
    rep3_solved_earlier(40);
    fetch_verified_run("rep3", 2, 2, &sv);
    assert_int_equal(sv.version, 3);
    assert_int_equal(rep_assigned(sv.p), 0x0f);
    assert_int_equal(json_array_size(json_object_get(sv.p, "spares")), 0);
    json_decref(sv.p);

    /* 3 live: fewer than 2 stages x min_replicas 2; nothing new stored. */
    rep_gone(3);
    rep3_solved_earlier(10);
    expect("GET", "/api/v1/runs/rep3/pipeline", NULL, NULL, 409, "not_enough_peers",
           "needs 4 devices (2 stages x min_replicas 2), 3 live");
    assert_int_equal(scalar("SELECT max(version) FROM pipelines p JOIN runs r ON r.id = "
                            "p.run_id WHERE r.name = 'rep3'"),
                     3);

    /* Back to 6: 3 replicas again. */
    for (int i = 3; i < NREP; i++)
        report_key("rep3", g_rk[i], rep_speed(i), NULL);
    fetch_verified_run("rep3", 2, 3, &sv);
    assert_int_equal(sv.version, 4);
    assert_true(sv.solved_now);
    assert_int_equal(rep_assigned(sv.p), 0x3f);
    assert_true(num(sv.p, "activation_bytes") == 22 * REP3_SAMPLE_BYTES);
    json_decref(sv.p);
    assert_int_equal(rep3_inputs_replicas(4), 3);
}

/* How long the newest capability report of run lives, from the table. */
static long stored_ttl(const char *run)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT min(extract(epoch from c.expires_at - c.reported_at))::int FROM capabilities "
             "c JOIN runs r ON r.id = c.run_id WHERE r.name = '%s' AND c.expires_at > now()",
             run);
    return scalar(sql);
}

/* A pipeline run's reports live config.pipeline.liveness_s (others
 * API_CAP_TTL_S, 120 s), and a stage agent that stops reporting (killed)
 * is out of the next assignment once that has passed. */
static void test_liveness(void **state)
{
    (void)state;
    long ttl = 0;
    long long now = (long long)time(NULL);
    /* a run without a pipeline */
    char body[1024];
    assert_int_equal(req("PUT", "/api/v1/runs/plain/allowlist/vol", g_org, NULL), 201);
    assert_int_equal(ct_pass_body("plain", "vol", &g_rep[0], body, sizeof body), 0);
    assert_int_equal(req("POST", "/api/v1/runs/plain/passes", g_vol, body), 201);
    long long exp = report_key("plain", g_rk[0], 100, &ttl);
    assert_int_equal(ttl, 120);
    assert_true(exp >= now + 119 && exp <= (long long)time(NULL) + 121);
    assert_int_equal(stored_ttl("plain"), 120);
    /* a pipeline run without liveness_s */
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"nolive\",\"target_batch_size\":64,\"config\":{\"pipeline\":"
                         "{\"stages\":2,\"replicas\":2,\"activation_bytes\":1e6,\"gradient_bytes\":1e8}}}"),
                     201);
    assert_int_equal(req("PUT", "/api/v1/runs/nolive/allowlist/vol", g_org, NULL), 201);
    assert_int_equal(ct_pass_body("nolive", "vol", &g_rep[1], body, sizeof body), 0);
    assert_int_equal(req("POST", "/api/v1/runs/nolive/passes", g_vol, body), 201);
    now = (long long)time(NULL);
    exp = report_key("nolive", g_rk[1], 100, &ttl);
    assert_int_equal(ttl, 120);
    assert_true(exp >= now + 119 && exp <= (long long)time(NULL) + 121);
    /* rep3: liveness_s 10 */
    now = (long long)time(NULL);
    long long exp0 = report_key("rep3", g_rk[0], rep_speed(0), &ttl);
    assert_int_equal(ttl, 10);
    assert_true(exp0 >= now + 9 && exp0 <= (long long)time(NULL) + 11);
    for (int i = 1; i < NREP; i++) {
        report_key("rep3", g_rk[i], rep_speed(i), &ttl);
        assert_int_equal(ttl, 10);
    }
    assert_int_equal(stored_ttl("rep3"), 10);
    struct ct_served sv;
    fetch_verified_run("rep3", 2, 3, &sv);
    long long v = sv.version;
    assert_int_equal(rep_assigned(sv.p), 0x3f);
    json_decref(sv.p);

    /* R0 stops reporting; the others go on (one report 4 s before R0's
     * expires). Once it has expired, the next GET solves without it. */
    while ((long long)time(NULL) < exp0 - 4)
        sleep(1);
    for (int i = 1; i < NREP; i++)
        report_key("rep3", g_rk[i], rep_speed(i), NULL);
    while ((long long)time(NULL) < exp0 + 1)
        sleep(1);
    fetch_verified_run("rep3", 2, 2, &sv);
    assert_int_equal(sv.version, v + 1);
    assert_true(sv.solved_now);
    assert_int_equal(rep_assigned(sv.p), 0x1e); /* R1-R4 */
    int sp[NREP + 1];
    rep_spares(sv.p, sp, NREP + 1);
    assert_int_equal(sp[0], 5);
    assert_int_equal(sp[1], -1);
    json_decref(sv.p);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fewer_replicas),
        cmocka_unit_test(test_liveness),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
