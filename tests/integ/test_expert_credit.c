/* ct-timeout: 180 */
/* Integration tests of the expert servers' credit (docs/accounting.md,
 * "Expert servers"; sql/011_expert_credit.sql; coordinator/api_contrib*.c)
 * against a real PostgreSQL and the real coordinator over HTTPS. Simulated
 * trainers of a dmoe run (k = 2) sign reports with the agent's encoder,
 * attesting samples for expert servers that hold passes of the run:
 *  - a server's expert_samples is the sum over verified trainer reports of
 *    what they attest, and nothing before the report is verified;
 *  - a report attesting more than k x its samples is scaled down to the
 *    cap, and the clipping is in the run's flags;
 *  - an attestation for a key without a pass in the run (or for the
 *    reporter itself) is ignored and flagged;
 *  - malformed `experts` (not an object, bad key, negative, out of range,
 *    not a number, 65 entries, a duplicate key) are refused with 400 and
 *    nothing is stored; a report without the field is stored as before;
 *  - the CSV, the volunteer's own totals and the leaderboard agree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/peer/report.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"

#define PW "a-long-password"
#define K 2 /* the run's experts per sample */
enum { T1, T2, S1, S2, S3, UNK, NKEYS };

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_aud, *g_tr, *g_alice, *g_bob;
static struct cm_ed25519 g_key[NKEYS];
static char *g_tok[NKEYS];

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

static json_t *get_json(const char *path, const char *bearer)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", path, bearer, NULL, &r);
    if (r.status != 200)
        fail_msg("GET %s: %ld %s", path, r.status, r.body ? r.body : "");
    json_t *j = json_incref(r.json);
    ct_resp_free(&r);
    return j;
}

static char *make_user(const char *name, const char *role)
{
    char body[200];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"role\":\"%s\",\"password\":\"" PW "\"}",
             name, role);
    if (req("POST", "/api/v1/users", g_org, body) != 201)
        return NULL;
    return ct_login(&g_c, name, PW);
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
    if (!(g_aud = make_user("aud", "auditor")) || !(g_tr = make_user("trainer", "volunteer")) ||
        !(g_alice = make_user("alice", "volunteer")) || !(g_bob = make_user("bob", "volunteer")))
        return -1;
    if (req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"moe\",\"target_batch_size\":128,\"config\":{\"steps\":1000,"
            "\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},"
            "\"model\":{\"type\":\"dmoe\",\"inputs\":784,\"hidden\":[128],\"classes\":10,"
            "\"grid_dims\":2,\"grid_size\":4,\"k\":2,\"experts\":{\"hidden\":64}}}}") != 201)
        return -1;
    const char *allow[] = {"/api/v1/runs/moe/allowlist/trainer", "/api/v1/runs/moe/allowlist/alice",
                           "/api/v1/runs/moe/allowlist/bob"};
    for (int i = 0; i < 3; i++)
        if (req("PUT", allow[i], g_org, NULL) != 201)
            return -1;
    for (int i = 0; i < NKEYS; i++)
        if (cm_ed25519_generate(&g_key[i]) != CM_OK)
            return -1;
    /* UNK holds no pass of the run */
    const char *owner[] = {g_tr, g_tr, g_alice, g_bob, g_alice};
    const char *name[] = {"trainer", "trainer", "alice", "bob", "alice"};
    for (int i = 0; i < UNK; i++) {
        struct ct_resp r;
        int ok = ct_pass_request(&g_c, owner[i], "moe", name[i], &g_key[i], &r) == 201;
        if (ok)
            g_tok[i] = strdup(json_string_value(json_object_get(r.json, "access_token")));
        ct_resp_free(&r);
        if (!ok)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NKEYS; i++) {
        cm_ed25519_cleanup(&g_key[i]);
        free(g_tok[i]);
    }
    free(g_org);
    free(g_aud);
    free(g_tr);
    free(g_alice);
    free(g_bob);
    return rc;
}

/* --- reports ---------------------------------------------------------------- */

/* A trainer's report at `step` (round of T1 and T2, each seeing the other do
 * `samples`), attesting att[i] samples for server srv[i]. */
static void build(struct peer_report *r, int64_t step, double samples, const int *srv,
                  const double *att, size_t n)
{
    memset(r, 0, sizeof *r);
    r->step = step;
    snprintf(r->group, sizeof r->group, "all");
    char rid[32];
    snprintf(rid, sizeof rid, "round-%lld", (long long)step);
    cm_sha256(rid, strlen(rid), r->round_id);
    r->samples = samples;
    r->compute_s = 1;
    r->loss = 1;
    r->sps = 100;
    r->round_ms = 100;
    r->parts = 1;
    r->parts_averaged = 1;
    r->n_members = 2;
    memcpy(r->members[0].pub, g_key[T1].pub, 32);
    memcpy(r->members[1].pub, g_key[T2].pub, 32);
    r->members[0].samples = r->members[1].samples = samples;
    r->n_experts = n;
    for (size_t i = 0; i < n; i++) {
        memcpy(r->experts[i].pub, g_key[srv[i]].pub, 32);
        r->experts[i].samples = att[i];
    }
}

static char *encode(const struct peer_report *r, int me)
{
    static char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len = 0;
    assert_int_equal(peer_report_encode(r, "moe", g_key[me].pub, 1763800000, buf, sizeof buf, &len),
                     CM_OK);
    return buf;
}

/* Posts payload signed by `me`; the status, *code the error code (or ""). */
static long post_raw(int me, const char *payload, char code[40], char msg[200])
{
    char *body = NULL;
    assert_int_equal(peer_report_sign(&g_key[me], g_tok[me], payload, strlen(payload), &body),
                     CM_OK);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs/moe/reports", NULL, body, &r);
    free(body);
    long s = r.status;
    json_t *e = json_object_get(r.json, "error");
    const char *c = json_string_value(json_object_get(e, "code"));
    const char *m = json_string_value(json_object_get(e, "message"));
    if (code)
        snprintf(code, 40, "%s", c ? c : "");
    if (msg)
        snprintf(msg, 200, "%s", m ? m : "");
    ct_resp_free(&r);
    return s;
}

static void post(int me, int64_t step, double samples, const int *srv, const double *att, size_t n)
{
    struct peer_report r;
    build(&r, step, samples, srv, att, n);
    char code[40];
    long s = post_raw(me, encode(&r, me), code, NULL);
    if (s != 201)
        fail_msg("trainer %d step %lld: %ld %s", me, (long long)step, s, code);
}

static long scalar(const char *sql)
{
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return v;
}

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static json_t *row_of(json_t *rows, const char *field, const char *value)
{
    size_t i;
    json_t *o;
    json_array_foreach(rows, i, o)
    {
        const char *v = json_string_value(json_object_get(o, field));
        if (v && !strcmp(v, value))
            return o;
    }
    return NULL;
}

/* expert_samples (or _clipped when clipped) of a user in GET .../contributions. */
static double user_expert(const char *user, int clipped)
{
    json_t *j = get_json("/api/v1/runs/moe/contributions", g_aud);
    json_t *u = row_of(json_object_get(j, "users"), "username", user);
    double v = u ? num(u, clipped ? "expert_samples_clipped" : "expert_samples") : -1;
    json_decref(j);
    return v;
}

static double peer_expert(int key)
{
    char k[48];
    cm_b64url_encode(g_key[key].pub, 32, k);
    json_t *j = get_json("/api/v1/runs/moe/contributions", g_aud);
    json_t *p = row_of(json_object_get(j, "peers"), "peer_public_key", k);
    double v = p ? num(p, "expert_samples") : -1;
    json_decref(j);
    return v;
}

/* The run's flags for key: field's value (0 when the key is not listed). */
static double flag_of(int key, const char *field)
{
    char k[48];
    cm_b64url_encode(g_key[key].pub, 32, k);
    json_t *j = get_json("/api/v1/runs/moe/flags", g_aud);
    json_t *p = row_of(json_object_get(j, "peers"), "peer_public_key", k);
    double v = p ? num(p, field) : 0;
    json_decref(j);
    return v;
}

/* --- tests ------------------------------------------------------------------ */

static void test_verified_attestations_credit_servers(void **state)
{
    (void)state;
    const int s12[] = {S1, S2}, s1[] = {S1};
    const double a1[] = {64, 64}, a2[] = {100};
    post(T1, 1, 64, s12, a1, 2);
    /* T1's report is not verified until T2's corroborates it */
    assert_true(user_expert("alice", 0) <= 0);
    post(T2, 1, 64, s1, a2, 1);
    assert_true(user_expert("alice", 0) == 164);
    assert_true(user_expert("bob", 0) == 64);
    assert_true(peer_expert(S1) == 164 && peer_expert(S2) == 64);
    assert_true(user_expert("alice", 1) == 0);
    /* a server owner without reports: a row of their own, report figures 0 */
    json_t *j = get_json("/api/v1/runs/moe/contributions", g_org);
    json_t *u = row_of(json_object_get(j, "users"), "username", "alice");
    assert_non_null(u);
    assert_int_equal(json_integer_value(json_object_get(u, "reports")), 0);
    assert_true(num(u, "verified_samples") == 0);
    assert_true(num(json_object_get(j, "totals"), "expert_samples") == 228);
    u = row_of(json_object_get(j, "users"), "username", "trainer");
    assert_true(num(u, "verified_samples") == 128 && num(u, "expert_samples") == 0);
    json_decref(j);
    /* the SQL view gives the same */
    assert_int_equal(scalar("SELECT expert_samples::bigint FROM contrib_expert_user_totals "
                            "WHERE run = 'moe' AND username = 'alice'"),
                     164);
}

static void test_inflated_attestation_clipped_and_flagged(void **state)
{
    (void)state;
    /* 10 samples, k = 2: at most 20 attested; 40 is scaled by 1/2 */
    const int s12[] = {S1, S2};
    const double a[] = {30, 10};
    double alice = user_expert("alice", 0), bob = user_expert("bob", 0);
    post(T1, 2, 10, s12, a, 2);
    post(T2, 2, 10, NULL, NULL, 0);
    assert_true(user_expert("alice", 0) == alice + 15);
    assert_true(user_expert("bob", 0) == bob + 5);
    assert_true(user_expert("alice", 1) == 15 && user_expert("bob", 1) == 5);
    assert_true(flag_of(T1, "clipped_expert_reports") == 1);
    assert_true(flag_of(T1, "clipped_expert_samples") == 20);
    assert_true(flag_of(T2, "clipped_expert_reports") == 0);
}

static void test_unknown_server_ignored_and_flagged(void **state)
{
    (void)state;
    /* UNK holds no pass of the run; T1 naming itself is no attestation */
    const int srv[] = {UNK, T1, S2};
    const double a[] = {50, 7, 5};
    double bob = user_expert("bob", 0);
    post(T1, 3, 10, srv, a, 3);
    post(T2, 3, 10, NULL, NULL, 0);
    assert_true(user_expert("bob", 0) == bob + 5); /* under the cap: the others do not count */
    assert_true(peer_expert(UNK) == -1);           /* not listed */
    assert_true(user_expert("trainer", 0) == 0);
    assert_true(flag_of(T1, "ignored_expert_attestations") == 2);
    assert_true(flag_of(T1, "clipped_expert_reports") == 1); /* still the one of step 2 */
}

/* The payload of a valid report with `experts` replaced by text x. */
static char *with_experts(int64_t step, const char *x)
{
    static char out[PEER_REPORT_PAYLOAD_MAX + 4096];
    struct peer_report r;
    build(&r, step, 10, NULL, NULL, 0);
    const char *p = encode(&r, T1), *t = strstr(p, ",\"t\":");
    assert_non_null(t);
    snprintf(out, sizeof out, "%.*s,\"experts\":%s%s", (int)(t - p), p, x, t);
    return out;
}

static void test_malformed_experts_refused(void **state)
{
    (void)state;
    char k1[48], k2[48];
    cm_b64url_encode(g_key[S1].pub, 32, k1);
    cm_b64url_encode(g_key[S2].pub, 32, k2);
    char bad[10][200];
    snprintf(bad[0], sizeof bad[0], "[]");
    snprintf(bad[1], sizeof bad[1], "5");
    snprintf(bad[2], sizeof bad[2], "{\"not-a-key\":5}");
    snprintf(bad[3], sizeof bad[3], "{\"%s\":-1}", k1);
    snprintf(bad[4], sizeof bad[4], "{\"%s\":\"NaN\"}", k1);
    snprintf(bad[5], sizeof bad[5], "{\"%s\":1e10}", k1);
    snprintf(bad[6], sizeof bad[6], "{\"%s\":null}", k1);
    snprintf(bad[7], sizeof bad[7], "{\"%s\":1,\"%s\":2}", k1, k1);
    snprintf(bad[8], sizeof bad[8], "{\"%s\":1e999}", k1);
    snprintf(bad[9], sizeof bad[9], "{\"%s\":{\"%s\":1}}", k1, k2);
    long before = scalar("SELECT count(*) FROM contrib_reports");
    for (int i = 0; i < 10; i++) {
        char code[40], msg[200];
        long s = post_raw(T1, with_experts(50 + i, bad[i]), code, msg);
        if (s != 400)
            fail_msg("experts %s: %ld %s", bad[i], s, code);
        if (i >= 2 && i != 8 && i != 7 && !strstr(msg, "experts"))
            fail_msg("experts %s: message '%s' does not name the field", bad[i], msg);
    }
    /* 65 entries: one too many (64 is accepted) */
    char many[65 * 64 + 4];
    size_t at = 0;
    many[at++] = '{';
    for (int i = 0; i < 65; i++) {
        uint8_t pub[32];
        char k[48];
        memset(pub, 0, sizeof pub);
        pub[0] = (uint8_t)i;
        cm_b64url_encode(pub, 32, k);
        at += (size_t)snprintf(many + at, sizeof many - at, "%s\"%s\":1", i ? "," : "", k);
    }
    snprintf(many + at, sizeof many - at, "}");
    char code[40], msg[200];
    assert_int_equal(post_raw(T1, with_experts(70, many), code, msg), 400);
    assert_non_null(strstr(msg, "64"));
    assert_int_equal(scalar("SELECT count(*) FROM contrib_reports"), before);
    /* 64 entries pass (the unknown keys are then ignored and flagged) */
    char *last = strrchr(many, ',');
    snprintf(last, sizeof many - (size_t)(last - many), "}");
    assert_int_equal(post_raw(T1, with_experts(71, many), code, msg), 201);
    assert_int_equal(scalar("SELECT count(*) FROM contrib_reports"), before + 1);
    /* an empty object is accepted and stores nothing */
    assert_int_equal(post_raw(T1, with_experts(72, "{}"), code, msg), 201);
    assert_int_equal(scalar("SELECT count(*) FROM contrib_reports WHERE step = 72 AND experts IS NULL"), 1);
}

static void test_report_without_field_unchanged(void **state)
{
    (void)state;
    struct peer_report r;
    build(&r, 80, 10, NULL, NULL, 0);
    const char *p = encode(&r, T1);
    assert_null(strstr(p, "experts"));
    char code[40];
    assert_int_equal(post_raw(T1, p, code, NULL), 201);
    assert_int_equal(scalar("SELECT count(*) FROM contrib_reports WHERE step = 80 "
                            "AND experts IS NULL AND samples = 10"),
                     1);
    /* the agent's encoder writes the field in the documented place, and the
       coordinator reads it back identically (the direct read and the JSON one) */
    const int s1[] = {S1};
    const double a[] = {12.5};
    build(&r, 81, 10, s1, a, 1);
    p = encode(&r, T2);
    assert_non_null(strstr(p, "],\"experts\":{\""));
    assert_int_equal(post_raw(T2, p, code, NULL), 201);
    char hex[65], sql[300];
    cm_hex_encode(g_key[S1].pub, 32, hex);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM contrib_reports WHERE step = 81 AND "
             "(experts->>'%s')::float8 = 12.5 AND (SELECT count(*) FROM jsonb_object_keys(experts)) = 1",
             hex);
    assert_int_equal(scalar(sql), 1);
}

static void test_csv_me_and_leaderboard_agree(void **state)
{
    (void)state;
    double alice = user_expert("alice", 0), clipped = user_expert("alice", 1);
    assert_true(alice > 0);
    /* CSV by user */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/moe/contributions?format=csv&by=user", g_aud, NULL, &r);
    assert_int_equal(r.status, 200);
    char line[200];
    snprintf(line, sizeof line, "\r\nalice,0,0,0,0,0,0,0,");
    const char *a = strstr(r.body, line);
    assert_non_null(a);
    char *end = strstr(a + 2, "\r\n");
    assert_non_null(end);
    *end = '\0';
    const char *c2 = strrchr(a, ','), *c1 = c2 - 1;
    while (*c1 != ',')
        c1--;
    assert_true(strtod(c1 + 1, NULL) == alice && strtod(c2 + 1, NULL) == clipped);
    ct_resp_free(&r);
    /* alice's own */
    json_t *j = get_json("/api/v1/me/contributions", g_alice);
    json_t *run = row_of(json_object_get(j, "runs"), "run", "moe");
    assert_non_null(run);
    assert_true(num(run, "expert_samples") == alice && num(run, "expert_samples_clipped") == clipped);
    char k[48];
    cm_b64url_encode(g_key[S1].pub, 32, k);
    json_t *p = row_of(json_object_get(run, "peers"), "peer_public_key", k);
    assert_non_null(p);
    assert_true(num(p, "expert_samples") == alice); /* S3 was never attested */
    json_decref(j);
    /* the trainer's own: no expert samples */
    j = get_json("/api/v1/me/contributions", g_tr);
    run = row_of(json_object_get(j, "runs"), "run", "moe");
    assert_true(num(run, "expert_samples") == 0 && num(run, "verified_samples") > 0);
    json_decref(j);
    /* the leaderboard shows expert samples next to training samples */
    j = get_json("/api/v1/runs/moe/leaderboard", g_bob);
    json_t *u = row_of(json_object_get(j, "users"), "username", "alice");
    assert_non_null(u);
    assert_true(num(u, "expert_samples") == alice && num(u, "verified_samples") == 0);
    u = row_of(json_object_get(j, "users"), "username", "trainer");
    assert_true(num(u, "expert_samples") == 0 && num(u, "verified_samples") > 0);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verified_attestations_credit_servers),
        cmocka_unit_test(test_inflated_attestation_clipped_and_flagged),
        cmocka_unit_test(test_unknown_server_ignored_and_flagged),
        cmocka_unit_test(test_malformed_experts_refused),
        cmocka_unit_test(test_report_without_field_unchanged),
        cmocka_unit_test(test_csv_me_and_leaderboard_agree),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
