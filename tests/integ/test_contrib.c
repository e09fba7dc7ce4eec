/* ct-timeout: 180 */
/* Integration tests of contribution accounting (docs/accounting.md; seed
 * 000_02cc6b5d62a616fc.txt §4.3, H.4; coordinator/api_contrib*.c) against a
 * real PostgreSQL and the real coordinator over HTTPS. Simulated agents hold
 * real passes (users, a run, passes through the API) and sign reports with
 * the agent's own encoder (agent/peer/report.c):
 *  - an honest round adds up: verified == claimed, and a claim becomes
 *    verified only once another member's report corroborates it;
 *  - an inflating peer is flagged and gets nothing verified; a peer others
 *    excluded for bad data gets nothing verified and is listed in flags;
 *  - bad signature, wrong key, revoked pass, wrong run, negative or absurd
 *    counts, malformed JSON, unknown fields, a huge body, a step that cannot
 *    have happened: refused, and nothing changes in the database;
 *  - a retry is "already recorded", a different payload for the same step a
 *    conflict, neither counted twice;
 *  - CSV equals the JSON; volunteers see only their own; auditors read but
 *    cannot write; the curve and stats add up; the agent's background
 *    reporter delivers;
 *  - checkpoints (issue 22): a checkpoint is served as latest only when most
 *    verified members of its step attest its parameter hash; forged and
 *    far-future uploads never are, and do not move the report window;
 *  - a run's status follows its verified progress: after its last step it
 *    is finished, and a finished or paused run takes no new reports; the
 *    public curve and stats show verified figures only;
 *  - ALBERT's heads (sop_loss, mlm_accuracy) are stored and averaged in the
 *    curve, null where absent; malformed ones are refused, nothing stored.
 * The fixture (users, runs, passes) and the report helpers are in
 * tests/harness/ct_contrib.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "agent/peer/report.h"
#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_contrib.h"
#include "ct_harness.h"

static void test_honest_round_adds_up(void **state)
{
    (void)state;
    const int m[] = {V1A, V1B, V2A};
    const double s[] = {64, 32, 128};
    struct peer_report r;
    ctc_build(&r, V1A, 1, 1, 64, m, s, 3);
    ctc_expect_post(&r, V1A, 201, NULL);
    /* Alone so far: claimed, not verified. */
    json_t *row = ctc_step_row(1, V1A);
    assert_non_null(row);
    assert_true(ctc_num(row, "claimed_samples") == 64 && ctc_num(row, "verified_samples") == 0);
    assert_int_equal(json_integer_value(json_object_get(row, "observers")), 0);
    json_decref(row);
    ctc_build(&r, V1B, 1, 1, 32, m, s, 3);
    ctc_expect_post(&r, V1B, 201, NULL);
    ctc_build(&r, V2A, 1, 1, 128, m, s, 3);
    ctc_expect_post(&r, V2A, 201, NULL);
    double sum = 0;
    for (int k = 0; k < 3; k++) {
        row = ctc_step_row(1, m[k]);
        assert_non_null(row);
        assert_true(ctc_num(row, "verified_samples") == s[k]);
        assert_true(ctc_num(row, "claimed_samples") == s[k]);
        assert_int_equal(json_integer_value(json_object_get(row, "observers")), 2);
        assert_false(json_is_true(json_object_get(row, "inflated")));
        sum += ctc_num(row, "verified_samples");
        json_decref(row);
    }
    assert_true(sum == 64 + 32 + 128);
    /* The SQL view gives the same verified total. */
    assert_int_equal(ctc_scalar("SELECT sum(verified_samples)::bigint FROM contrib_claims WHERE step = 1"),
                     224);
}

static void test_inflating_peer_flagged(void **state)
{
    (void)state;
    const int m[] = {V1A, MAL, V1B};
    const double honest[] = {64, 50, 32}, claimed[] = {64, 500, 32};
    struct peer_report r;
    ctc_build(&r, V1A, 2, 2, 64, m, honest, 3);
    ctc_expect_post(&r, V1A, 201, NULL);
    ctc_build(&r, MAL, 2, 2, 500, m, claimed, 3);
    ctc_expect_post(&r, MAL, 201, NULL);
    ctc_build(&r, V1B, 2, 2, 32, m, honest, 3);
    ctc_expect_post(&r, V1B, 201, NULL);
    json_t *row = ctc_step_row(2, MAL);
    assert_non_null(row);
    assert_true(json_is_true(json_object_get(row, "inflated")));
    assert_true(ctc_num(row, "verified_samples") == 0);
    assert_true(ctc_num(row, "seen_max") == 50);
    json_decref(row);
    /* Mallory vouching 500 for V1A changes nothing for V1A: the least observation counts. */
    row = ctc_step_row(2, V1A);
    assert_true(ctc_num(row, "verified_samples") == 64 && ctc_num(row, "seen_max") == 64);
    json_decref(row);
    json_t *f = ctc_get_json("/api/v1/runs/r1/flags", g_aud), *p;
    size_t i;
    int seen = 0;
    json_array_foreach(json_object_get(f, "peers"), i, p)
    {
        if (strcmp(json_string_value(json_object_get(p, "username")), "mallory") == 0) {
            seen = 1;
            assert_int_equal(json_integer_value(json_object_get(p, "inflated_claims")), 1);
        }
    }
    assert_true(seen);
    json_decref(f);
}

static void test_excluded_peer_not_verified(void **state)
{
    (void)state;
    const int m[] = {V1A, V1B, MAL};
    const double s[] = {64, 32, 10};
    struct peer_report r;
    for (int k = 0; k < 3; k++) {
        ctc_build(&r, m[k], 3, 3, s[k], m, s, 3);
        if (m[k] != MAL) {
            memcpy(r.excluded[0].pub, g_key[MAL].pub, 32);
            snprintf(r.excluded[0].reason, sizeof r.excluded[0].reason, "nonfinite");
            r.n_excluded = 1;
        }
        ctc_expect_post(&r, m[k], 201, NULL);
    }
    json_t *row = ctc_step_row(3, MAL);
    assert_true(json_is_true(json_object_get(row, "excluded")));
    assert_false(json_is_true(json_object_get(row, "inflated")));
    assert_true(ctc_num(row, "verified_samples") == 0);
    json_decref(row);
    row = ctc_step_row(3, V1A);
    assert_true(ctc_num(row, "verified_samples") == 64);
    json_decref(row);
    json_t *f = ctc_get_json("/api/v1/runs/r1/flags", g_org), *p;
    size_t i;
    int seen = 0;
    json_array_foreach(json_object_get(f, "peers"), i, p)
    {
        if (!strcmp(json_string_value(json_object_get(p, "username")), "mallory")) {
            seen = 1;
            assert_int_equal(json_integer_value(json_object_get(p, "excluded_reports")), 2);
            assert_int_equal(json_integer_value(json_object_get(p, "excluded_by")), 2);
        }
    }
    assert_true(seen);
    assert_int_equal(json_array_size(json_object_get(f, "exclusions")), 2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(f, "exclusions"), 0),
                                          "reason")),
        "nonfinite");
    json_decref(f);
}

static long db_state(void)
{
    return ctc_scalar("SELECT (SELECT count(*) FROM contrib_reports) * 1000000 + "
                  "(SELECT coalesce(sum(observers), 0) FROM contrib_seen) * 1000 + "
                  "(SELECT count(*) FROM contrib_exclusions) + "
                  "(SELECT count(*) FROM contrib_conflicts) * 100");
}

static void expect_raw(const char *run, int signer, int pass_of, const char *payload, long status,
                       const char *code)
{
    char c[40];
    long s = ctc_post_raw(run, signer, pass_of, payload, c);
    if (s != status || strcmp(c, code) != 0)
        fail_msg("%s: expected %ld %s, got %ld %s", payload, status, code, s, c);
}

static void test_bad_reports_change_nothing(void **state)
{
    (void)state;
    long before = db_state();
    const int m[] = {V1A, V1C};
    const double s[] = {64, 16};
    struct peer_report r;
    ctc_build(&r, V1C, 4, 4, 16, m, s, 2);
    /* Signed with another key than the pass's. */
    expect_raw("r1", V1A, V1C, ctc_encode(&r, "r1", V1C), 401, "bad_signature");
    /* Payload names another peer than the pass (signed correctly). */
    expect_raw("r1", V1C, V1C, ctc_encode(&r, "r1", V1A), 403, "wrong_peer");
    /* A pass of run r2 used on r1, and a payload for r2 posted to r1. */
    expect_raw("r1", OTHER_RUN, OTHER_RUN, ctc_encode(&r, "r1", OTHER_RUN), 403, "wrong_run");
    expect_raw("r1", V1C, V1C, ctc_encode(&r, "r2", V1C), 403, "wrong_run");
    /* Revoked pass. */
    ctc_build(&r, REVOKED, 4, 4, 16, m, s, 2);
    expect_raw("r1", REVOKED, REVOKED, ctc_encode(&r, "r1", REVOKED), 403, "pass_revoked");
    /* A step that cannot have happened yet. */
    ctc_build(&r, V1C, 5000000, 4, 16, m, s, 2);
    expect_raw("r1", V1C, V1C, ctc_encode(&r, "r1", V1C), 422, "step_out_of_range");

    /* Hand-made payloads: negative, absurd, non-numbers, unknown fields, too many members. */
    char pk[64], other[64], rnd[65];
    uint8_t rid[32];
    ctc_round_id(4, rid);
    cm_hex_encode(rid, 32, rnd);
    cm_b64url_encode(g_key[V1C].pub, 32, pk);
    cm_b64url_encode(g_key[V1A].pub, 32, other);
    const char *bad[] = {
        "\"samples\":-1,\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1",
        "\"samples\":1e12,\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1",
        "\"samples\":\"16\",\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1",
        "\"samples\":16,\"compute_s\":1e9,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1",
        "\"samples\":16,\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":2",
        "\"samples\":16,\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1,"
        "\"bonus\":1",
        "\"samples\":16,\"compute_s\":1,\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1,"
        "\"loss\":-3",
    };
    char payload[4096];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(payload, sizeof payload,
                 "{\"format\":\"crowdtrain-report/1\",\"run\":\"r1\",\"peer\":\"%s\",\"step\":4,"
                 "\"group\":\"g4\",\"round\":\"%s\",%s,\"members\":{\"%s\":16},\"excluded\":[],"
                 "\"t\":1}",
                 pk, rnd, bad[k], other);
        expect_raw("r1", V1C, V1C, payload, 400, "invalid_report");
    }
    /* Member count above 64. */
    int n = snprintf(payload, sizeof payload,
                     "{\"format\":\"crowdtrain-report/1\",\"run\":\"r1\",\"peer\":\"%s\","
                     "\"step\":4,\"group\":\"g4\",\"round\":\"%s\",\"samples\":16,\"compute_s\":1,"
                     "\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1,\"members\":{",
                     pk, rnd);
    for (int k = 0; k < 65; k++) {
        uint8_t key[32] = {0};
        char kb[64];
        key[0] = (uint8_t)k;
        key[1] = 7;
        cm_b64url_encode(key, 32, kb);
        n += snprintf(payload + n, sizeof payload - (size_t)n, "%s\"%s\":1", k ? "," : "", kb);
    }
    snprintf(payload + n, sizeof payload - (size_t)n, "},\"excluded\":[],\"t\":1}");
    expect_raw("r1", V1C, V1C, payload, 400, "invalid_report");
    expect_raw("r1", V1C, V1C, "not json at all", 400, "invalid_report");

    /* Envelope problems. */
    struct ct_resp resp;
    ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, "{\"pass\": ", &resp);
    assert_int_equal(resp.status, 400);
    ct_resp_free(&resp);
    ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL,
            "{\"pass\":\"a.b.c\",\"payload\":\"e30\",\"sig\":"
            "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}",
            &resp);
    assert_int_equal(resp.status, 401);
    ct_resp_free(&resp);
    /* A flipped signature byte. */
    char *body = NULL;
    ctc_build(&r, V1C, 4, 4, 16, m, s, 2);
    const char *pl = ctc_encode(&r, "r1", V1C);
    assert_int_equal(peer_report_sign(&g_key[V1C], g_tok[V1C], pl, strlen(pl), &body), CM_OK);
    json_t *b = json_loads(body, 0, NULL);
    char sig[100];
    snprintf(sig, sizeof sig, "%s", json_string_value(json_object_get(b, "sig")));
    sig[10] = sig[10] == 'A' ? 'B' : 'A';
    json_object_set_new(b, "sig", json_string(sig));
    char *tampered = json_dumps(b, JSON_COMPACT);
    ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, tampered, &resp);
    assert_int_equal(resp.status, 401);
    ct_resp_free(&resp);
    /* Unknown envelope field. */
    json_object_set_new(b, "sig", json_string(json_string_value(json_object_get(b, "sig"))));
    json_object_set_new(b, "extra", json_true());
    free(tampered);
    tampered = json_dumps(b, JSON_COMPACT);
    ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, tampered, &resp);
    assert_int_equal(resp.status, 400);
    ct_resp_free(&resp);
    free(tampered);
    json_decref(b);
    free(body);
    /* A huge body. */
    size_t big = 2u << 20; /* above 1 MiB curl asks 100-continue, so the 413 arrives cleanly */
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    huge[big] = '\0';
    ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, huge, &resp);
    assert_int_equal(resp.status, 413);
    ct_resp_free(&resp);
    /* Oversized but below 1 MiB: curl sends it at once. The coordinator
       reads and drops it and then answers 413; answering first and closing
       on the unread body reset the connection in about half the tries. */
    huge[(512u << 10) - 1] = '}';
    huge[512u << 10] = '\0';
    for (int i = 0; i < 6; i++) {
        ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, huge, &resp);
        assert_int_equal(resp.status, 413);
        ct_resp_free(&resp);
    }
    free(huge);
    assert_int_equal(db_state(), before);
    /* The same report, properly signed, is accepted afterwards. */
    ctc_expect_post(&r, V1C, 201, NULL);
}

static void test_retry_not_counted_twice(void **state)
{
    (void)state;
    const int m[] = {V1A, V1B, V2A};
    const double s[] = {64, 32, 128};
    struct peer_report r;
    ctc_build(&r, V1A, 1, 1, 64, m, s, 3);
    long before = db_state();
    ctc_expect_post(&r, V1A, 200, NULL);
    ctc_expect_post(&r, V1A, 200, NULL);
    assert_int_equal(db_state(), before);
    /* A different payload for the same step: a conflict, kept aside. */
    ctc_build(&r, V1A, 1, 1, 6400, m, s, 3);
    ctc_expect_post(&r, V1A, 409, "conflicting_report");
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_conflicts"), 1);
    assert_int_equal(ctc_scalar("SELECT sum(verified_samples)::bigint FROM contrib_claims WHERE step = 1"),
                     224);
    assert_int_equal(ctc_scalar("SELECT sum(observers) FROM contrib_seen WHERE step = 1"), 6);
}

/* Splits one CSV line (no quoted commas in our data) into fields. */
static size_t split(char *line, char **f, size_t max)
{
    size_t n = 0;
    for (char *save = NULL, *t = strtok_r(line, ",", &save); t && n < max;
         t = strtok_r(NULL, ",", &save))
        f[n++] = t;
    return n;
}

/* A field as a spreadsheet reads it: quotes removed ("" is one "), and the
 * ' the export puts before a leading = + - @ (a base64url key may start
 * with -) dropped. In place; returns 1 when that guard was there. */
static int unfield(char *f)
{
    size_t n = strlen(f);
    if (n >= 2 && f[0] == '"' && f[n - 1] == '"') {
        size_t w = 0;
        for (size_t i = 1; i + 1 < n; i++) {
            f[w++] = f[i];
            if (f[i] == '"' && f[i + 1] == '"')
                i++;
        }
        f[w] = 0;
    }
    if (f[0] == '\'' && f[1] && strchr("=+-@", f[1])) {
        memmove(f, f + 1, strlen(f));
        return 1;
    }
    return 0;
}

static void test_csv_equals_api(void **state)
{
    (void)state;
    json_t *j = ctc_get_json("/api/v1/runs/r1/contributions", g_aud);
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/r1/contributions?format=csv", g_aud, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(r.body);
    char *save = NULL, *line = strtok_r(r.body, "\r\n", &save);
    assert_string_equal(line, "username,peer_public_key,reports,steps,claimed_samples,"
                              "verified_samples,compute_s,flagged_reports,first_at,last_at,"
                              "expert_samples,expert_samples_clipped");
    json_t *peers = json_object_get(j, "peers");
    size_t rows = 0;
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        char *f[16];
        assert_int_equal(split(line, f, 16), 12);
        json_t *p = json_array_get(peers, rows++);
        assert_non_null(p);
        for (int k = 0; k < 2; k++) {
            int guarded = unfield(f[k]);
            assert_int_equal(guarded, f[k][0] && strchr("=+-@", f[k][0]) != NULL);
        }
        assert_string_equal(f[0], json_string_value(json_object_get(p, "username")));
        assert_string_equal(f[1], json_string_value(json_object_get(p, "peer_public_key")));
        assert_int_equal(strtoll(f[2], NULL, 10), json_integer_value(json_object_get(p, "reports")));
        assert_int_equal(strtoll(f[3], NULL, 10), json_integer_value(json_object_get(p, "steps")));
        assert_true(strtod(f[4], NULL) == ctc_num(p, "claimed_samples"));
        assert_true(strtod(f[5], NULL) == ctc_num(p, "verified_samples"));
        assert_true(strtod(f[6], NULL) == ctc_num(p, "compute_s"));
        assert_int_equal(strtoll(f[7], NULL, 10),
                         json_integer_value(json_object_get(p, "flagged_reports")));
        assert_true(strtod(f[10], NULL) == ctc_num(p, "expert_samples"));
        assert_true(strtod(f[11], NULL) == ctc_num(p, "expert_samples_clipped"));
    }
    assert_int_equal(rows, json_array_size(peers));
    assert_true(rows >= 5);
    ct_resp_free(&r);
    /* Totals add up to the per-peer rows, and to the SQL views. */
    double v = 0;
    size_t i;
    json_t *p;
    json_array_foreach(peers, i, p) v += ctc_num(p, "verified_samples");
    assert_true(v == ctc_num(json_object_get(j, "totals"), "verified_samples"));
    assert_int_equal((long)v, ctc_scalar("SELECT sum(verified_samples)::bigint FROM contrib_user_totals "
                                     "WHERE run = 'r1'"));
    json_decref(j);
    /* Accept: text/csv works too; by=user gives one row per user. */
    const char *h[] = {"Accept: text/csv", NULL};
    ct_http_raw(&g_c, "GET", "/api/v1/runs/r1/contributions?by=user", h, NULL, 0, &r);
    assert_int_equal(r.status, 401); /* no bearer in the raw call: still refused */
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/r1/contributions?format=csv&by=user", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "username,peers,reports"));
    assert_non_null(strstr(r.body, "\r\nmallory,"));
    ct_resp_free(&r);
}

static void test_roles(void **state)
{
    (void)state;
    assert_int_equal(ctc_req("GET", "/api/v1/runs/r1/contributions", g_vol1, NULL), 403);
    assert_int_equal(ctc_req("GET", "/api/v1/runs/r1/contributions/steps", g_vol1, NULL), 403);
    assert_int_equal(ctc_req("GET", "/api/v1/runs/r1/flags", g_mal, NULL), 403);
    assert_int_equal(ctc_req("GET", "/api/v1/runs/r1/contributions", NULL, NULL), 401);
    /* Auditors read but cannot write. */
    assert_int_equal(ctc_req("PUT", "/api/v1/runs/r1/allowlist/aud", g_aud, NULL), 403);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/r1/passes/%s/revoke", g_pass_id[V1A]);
    assert_int_equal(ctc_req("POST", path, g_aud, "{}"), 403);
    assert_int_equal(ctc_req("POST", "/api/v1/runs/r1/reports", g_aud, "{}"), 400);
    /* A volunteer sees only their own contributions. */
    json_t *me = ctc_get_json("/api/v1/me/contributions", g_vol2);
    assert_string_equal(json_string_value(json_object_get(me, "username")), "vol2");
    json_t *runs = json_object_get(me, "runs");
    assert_int_equal(json_array_size(runs), 1);
    json_t *run = json_array_get(runs, 0);
    assert_string_equal(json_string_value(json_object_get(run, "run")), "r1");
    assert_true(ctc_num(run, "verified_samples") == 128);
    json_t *peers = json_object_get(run, "peers");
    assert_int_equal(json_array_size(peers), 1);
    char pk[64];
    cm_b64url_encode(g_key[V2A].pub, 32, pk);
    assert_string_equal(json_string_value(json_object_get(json_array_get(peers, 0),
                                                          "peer_public_key")),
                        pk);
    char *text = json_dumps(me, 0);
    assert_null(strstr(text, "vol1"));
    assert_null(strstr(text, "mallory"));
    free(text);
    json_decref(me);
    /* Public curve and stats carry no usernames. */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/r1/stats", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.body, "vol1"));
    ct_resp_free(&r);
}

static void test_curve_and_stats(void **state)
{
    (void)state;
    json_t *c = ctc_get_json("/api/v1/runs/r1/curve", NULL);
    json_t *pts = json_object_get(c, "points");
    /* steps 1-3 are verified; step 4 was claimed by V1C alone (nobody
       corroborated it): not a public figure */
    assert_int_equal(json_array_size(pts), 3);
    json_t *p1 = json_array_get(pts, 0);
    assert_int_equal(json_integer_value(json_object_get(p1, "step")), 1);
    /* Step 1: losses 2 - 0.1 + 0.01 * peer, weighted by samples 64, 32, 128. */
    double want = (64 * (1.9 + 0.01 * V1A) + 32 * (1.9 + 0.01 * V1B) + 128 * (1.9 + 0.01 * V2A)) /
                  224;
    assert_true(fabs(ctc_num(p1, "loss") - want) < 1e-9);
    assert_true(ctc_num(p1, "samples") == 224);
    assert_true(ctc_num(p1, "peers") == 3);
    json_decref(c);
    c = ctc_get_json("/api/v1/runs/r1/curve?max_points=2", NULL);
    assert_true(json_array_size(json_object_get(c, "points")) <= 2);
    assert_true(json_integer_value(json_object_get(c, "bucket")) >= 2);
    json_decref(c);
    assert_int_equal(ctc_req("GET", "/api/v1/runs/r1/curve?max_points=0", NULL, NULL), 400);
    assert_int_equal(ctc_req("GET", "/api/v1/runs/nope/curve", NULL, NULL), 404);

    json_t *s = ctc_get_json("/api/v1/runs/r1/stats", NULL);
    assert_int_equal(json_integer_value(json_object_get(s, "current_step")), 3);
    assert_int_equal(json_integer_value(json_object_get(s, "total_steps")), 100);
    json_t *t = json_object_get(s, "totals");
    assert_int_equal(json_integer_value(json_object_get(t, "reports")),
                     ctc_scalar("SELECT count(*) FROM contrib_reports"));
    assert_true(json_array_size(json_object_get(s, "active_peers")) >= 1);
    assert_true(ctc_num(s, "avg_round_ms") == 150);
    json_decref(s);
    struct ct_resp r;
    ct_http(&g_c, "GET", "/metrics", NULL, NULL, &r);
    assert_non_null(strstr(r.body, "crowdtrain_reports_total{result=\"recorded\"}"));
    assert_null(strstr(r.body, "crowdtrain_reports_total{result=\"rejected\"} 0\n"));
    assert_non_null(strstr(r.body, "crowdtrain_report_exclusions_total 2\n"));
    ct_resp_free(&r);
}

/* The agent's background reporter delivers to the real coordinator. */
static void test_agent_reporter(void **state)
{
    (void)state;
    struct peer_reporter *rp = NULL;
    assert_int_equal(peer_reporter_start(g_c.url, g_c.ca, "r1", &g_key[V2B], g_tok[V2B], &rp),
                     CM_OK);
    const int m[] = {V2B, V1C};
    const double s[] = {8, 16};
    struct peer_report r;
    for (int step = 5; step < 8; step++) {
        ctc_build(&r, V2B, step, 100 + step, 8, m, s, 2);
        assert_int_equal(peer_reporter_submit(rp, &r), CM_OK);
    }
    assert_int_equal(peer_reporter_set_token(rp, g_tok[V2B]), CM_OK);
    assert_int_equal(peer_reporter_stop(rp, 20000), 0);
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_reports WHERE step BETWEEN 5 AND 7"), 3);
}

/* --- checkpoints vouched by the members' reports (issue 22) ------------------ */

/* A real checkpoint file of `step` whose n parameters derive from seed;
 * heap, *len bytes; its SHA-256 (hex) and its parameters' SHA-256. */
static uint8_t *make_ckpt(uint64_t step, unsigned seed, size_t *len, char hex[65], uint8_t params[32])
{
    uint8_t *b = ct_make_ckpt(g_c.dir, step, seed, 1000, len, hex, params);
    assert_non_null(b);
    return b;
}

static long put_ckpt_in(const char *run, const char *bearer, const char *step, const uint8_t *b,
                        size_t len, const char *hex, json_t **out)
{
    char path[128], auth[256], shah[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints/%s", run, step);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", hex);
    /* the answer to a refusal on the headers comes before the body is sent */
    const char *h[] = {auth, shah, "Content-Type: application/octet-stream", "Expect: 100-continue", NULL};
    struct ct_resp r;
    ct_http_raw(&g_c, "PUT", path, h, b, len, &r);
    long s = r.status;
    if (out)
        *out = json_incref(r.json);
    ct_resp_free(&r);
    return s;
}

static long put_ckpt(const char *bearer, const char *step, const uint8_t *b, size_t len,
                     const char *hex, json_t **out)
{
    return put_ckpt_in("r1", bearer, step, b, len, hex, out);
}

/* The SHA-256 of what GET .../checkpoints/latest serves ("" when 404). */
static void latest_sha(char hex[65])
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/r1/checkpoints/latest", g_vol2, NULL, &r);
    hex[0] = '\0';
    if (r.status == 200) {
        uint8_t h[32];
        cm_sha256(r.body, r.len, h);
        cm_hex_encode(h, 32, hex);
    } else {
        assert_int_equal(r.status, 404);
    }
    ct_resp_free(&r);
}

/* Members m[0..n) report one round at `step`, each attesting params[k]. */
static void round_attesting(int64_t step, int rnd, const int *m, size_t n, const uint8_t (*params)[32])
{
    double s[8];
    for (size_t k = 0; k < n; k++)
        s[k] = 16;
    struct peer_report r;
    for (size_t k = 0; k < n; k++) {
        ctc_build(&r, m[k], step, rnd, 16, m, s, n);
        memcpy(r.params, params[k], 32);
        r.has_params = 1;
        ctc_expect_post(&r, m[k], 201, NULL);
    }
}

static void test_checkpoint_vouched_by_members(void **state)
{
    (void)state;
    char hon[65], forged[65], got[65], hex[65];
    uint8_t hon_p[32], forged_p[32], p[32];
    size_t len, flen;
    json_t *j = NULL;
    uint8_t *hb = make_ckpt(21, 1, &len, hon, hon_p);
    uint8_t *fb = make_ckpt(21, 666, &flen, forged, forged_p);
    /* the round of step 20 makes the state of step 21: three honest members
       attest its hash, mallory (in the round too) another */
    const int m[] = {V1A, V1B, V2A, MAL};
    uint8_t att[4][32];
    memcpy(att[0], hon_p, 32);
    memcpy(att[1], hon_p, 32);
    memcpy(att[2], hon_p, 32);
    memcpy(att[3], forged_p, 32);
    round_attesting(20, 20, m, 4, (const uint8_t(*)[32])att);
    /* mallory's upload first: stored as a candidate, not served */
    assert_int_equal(put_ckpt(g_mal, "21", fb, flen, forged, &j), 201);
    assert_false(json_is_true(json_object_get(j, "vouched")));
    json_decref(j);
    latest_sha(got);
    assert_string_equal(got, "");
    /* the honest one is not locked out by it, and is vouched at once */
    assert_int_equal(put_ckpt(g_vol1, "21", hb, len, hon, &j), 201);
    assert_true(json_is_true(json_object_get(j, "vouched")));
    json_decref(j);
    latest_sha(got);
    assert_string_equal(got, hon);
    free(fb);
    /* a valid file at the next step nobody's reports vouch for: a candidate */
    fb = make_ckpt(22, 667, &flen, forged, p);
    assert_int_equal(put_ckpt(g_mal, "22", fb, flen, forged, &j), 201);
    assert_false(json_is_true(json_object_get(j, "vouched")));
    json_decref(j);
    latest_sha(got);
    assert_string_equal(got, hon);
    free(fb);
    /* at most two unvouched candidates per volunteer (the one at step 21
       went when the honest one there was vouched) */
    fb = make_ckpt(23, 668, &flen, forged, p);
    assert_int_equal(put_ckpt(g_mal, "23", fb, flen, forged, NULL), 201);
    free(fb);
    fb = make_ckpt(24, 670, &flen, forged, p);
    assert_int_equal(put_ckpt(g_mal, "24", fb, flen, forged, &j), 409);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "too_many_candidates");
    json_decref(j);
    free(fb);
    /* far-future steps are refused, and do not move the report window */
    fb = make_ckpt(4611686018427387904ull, 669, &flen, forged, p);
    assert_int_equal(put_ckpt(g_mal, "4611686018427387904", fb, flen, forged, NULL), 422);
    free(fb);
    fb = make_ckpt(9007199254740992ull, 669, &flen, forged, p);
    assert_int_equal(put_ckpt(g_org, "9007199254740992", fb, flen, forged, NULL), 422); /* past "steps" */
    free(fb);
    const int mm[] = {MAL, V1C};
    const double ss[] = {8, 8};
    struct peer_report r;
    ctc_build(&r, MAL, (int64_t)1 << 53, 77, 8, mm, ss, 2);
    ctc_expect_post(&r, MAL, 422, "step_out_of_range");
    /* the listing: vouched ones, then candidates */
    json_t *l = ctc_get_json("/api/v1/runs/r1/checkpoints", g_aud);
    json_t *ck = json_object_get(l, "checkpoints");
    assert_int_equal(json_array_size(ck), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ck, 0), "sha256")), hon);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ck, 0), "vouchers")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ck, 0), "attesting")), 4);
    assert_int_equal(json_array_size(json_object_get(l, "candidates")), 2);
    json_decref(l);
    /* uploaded before its round's reports: a candidate, latest once they vouch */
    free(hb);
    hb = make_ckpt(31, 2, &len, hex, p);
    assert_int_equal(put_ckpt(g_vol2, "31", hb, len, hex, &j), 201);
    assert_false(json_is_true(json_object_get(j, "vouched")));
    json_decref(j);
    latest_sha(got);
    assert_string_equal(got, hon);
    const int m3[] = {V1A, V2A};
    uint8_t att3[2][32];
    memcpy(att3[0], p, 32);
    memcpy(att3[1], p, 32);
    round_attesting(30, 30, m3, 2, (const uint8_t(*)[32])att3);
    latest_sha(got);
    assert_string_equal(got, hex);
    free(hb);
}

/* One report of run r3 by key `me` at `step` in a round with `other`. */
static long post_r3(int me, int other, int64_t step, char code[40])
{
    const int m[] = {me, other};
    const double s[] = {10, 10};
    struct peer_report r;
    ctc_build(&r, me, step, 300 + (int)step, 10, m, s, 2);
    return ctc_post_raw("r3", me, me, ctc_encode(&r, "r3", me), code);
}

static const char *run_status(const char *run)
{
    static char st[32];
    char path[64];
    snprintf(path, sizeof path, "/api/v1/runs/%s", run);
    json_t *j = ctc_get_json(path, g_org);
    const char *s = json_string_value(json_object_get(j, "status"));
    if (!s)
        s = json_string_value(json_object_get(json_object_get(j, "run"), "status"));
    snprintf(st, sizeof st, "%s", s ? s : "");
    json_decref(j);
    return st;
}

static void test_run_status_follows_verified_progress(void **state)
{
    (void)state;
    char code[40];
    /* paused: no reports */
    assert_int_equal(ctc_req("PATCH", "/api/v1/runs/r3", g_org, "{\"status\":\"paused\"}"), 200);
    assert_int_equal(post_r3(F1, F2, 0, code), 409);
    assert_string_equal(code, "run_not_open");
    assert_int_equal(ctc_req("PATCH", "/api/v1/runs/r3", g_org, "{\"status\":\"open\"}"), 200);
    for (int64_t step = 0; step < 2; step++) {
        assert_int_equal(post_r3(F1, F2, step, code), 201);
        assert_int_equal(post_r3(F2, F1, step, code), 201);
    }
    assert_string_equal(run_status("r3"), "open");
    /* a claim alone at the last step (config "steps" 3: step 2 makes the
       state of step 3) is not progress; corroborated, it is */
    assert_int_equal(post_r3(F1, F2, 2, code), 201);
    assert_string_equal(run_status("r3"), "open");
    assert_int_equal(post_r3(F2, F1, 2, code), 201);
    assert_string_equal(run_status("r3"), "finished");
    json_t *s = ctc_get_json("/api/v1/runs/r3/stats", NULL);
    assert_int_equal(json_integer_value(json_object_get(s, "current_step")), 2);
    json_decref(s);
    /* finished: a step of its own may still come in (a straggler of the last
       round, retried), a new one may not */
    assert_int_equal(post_r3(F2, F1, 2, code), 200);
    assert_int_equal(post_r3(F1, F2, 3, code), 409);
    assert_string_equal(code, "run_not_open");
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_reports c JOIN runs r ON r.id = c.run_id "
                            "WHERE r.name = 'r3' AND c.step = 3"), 0);
    /* the final state, uploaded after the last round, is still taken; nothing past it */
    char hex[65];
    uint8_t p[32];
    size_t len;
    uint8_t *b = make_ckpt(3, 5, &len, hex, p);
    assert_int_equal(put_ckpt_in("r3", g_vol1, "3", b, len, hex, NULL), 201);
    free(b);
    b = make_ckpt(4, 5, &len, hex, p);
    assert_int_equal(put_ckpt_in("r3", g_vol1, "4", b, len, hex, NULL), 422);
    free(b);
}

/* One volunteer's unverified claim (issue 22: samples 1e9 at step 1000 of a
 * run of 100) shows in no public figure. */
static void test_public_figures_verified_only(void **state)
{
    (void)state;
    json_t *s0 = ctc_get_json("/api/v1/runs/r1/stats", NULL);
    json_t *c0 = ctc_get_json("/api/v1/runs/r1/curve", NULL);
    const int m[] = {MAL, V1C};
    const double seen[] = {1e9, 1e9};
    struct peer_report r;
    ctc_build(&r, MAL, 99, 999, 1e9, m, seen, 2);
    r.compute_s = 60;
    ctc_expect_post(&r, MAL, 201, NULL);
    json_t *s1 = ctc_get_json("/api/v1/runs/r1/stats", NULL);
    json_t *c1 = ctc_get_json("/api/v1/runs/r1/curve", NULL);
    assert_int_equal(json_integer_value(json_object_get(s1, "current_step")),
                     json_integer_value(json_object_get(s0, "current_step")));
    assert_true(json_integer_value(json_object_get(s1, "current_step")) < 99);
    assert_true(ctc_num(s1, "samples_per_s") == ctc_num(s0, "samples_per_s"));
    assert_true(ctc_num(json_object_get(s1, "totals"), "verified_samples") ==
                ctc_num(json_object_get(s0, "totals"), "verified_samples"));
    assert_true(json_equal(json_object_get(c1, "points"), json_object_get(c0, "points")));
    json_decref(s0);
    json_decref(s1);
    json_decref(c0);
    json_decref(c1);
}

/* ALBERT's heads (issue 20): sop_loss and mlm_accuracy are stored, the
 * curve gives their verified-samples-weighted means per step (and per
 * bucket) next to the loss, null where no report had them; wrong types or
 * out-of-range values are refused with the field named, storing nothing. */
static void albert_report(struct peer_report *r, int me, int64_t step, double samples, double sop,
                          double acc)
{
    const int m[] = {V1A, V1B, V2A};
    const double s[] = {64, 32, 128};
    ctc_build(r, me, step, 600 + (int)step, samples, m, s, 3);
    r->loss = 6.5;
    r->has_sop_loss = !isnan(sop);
    r->sop_loss = sop;
    r->has_mlm_accuracy = !isnan(acc);
    r->mlm_accuracy = acc;
}

static json_t *curve_point(const char *query, int64_t step)
{
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/r1/curve?%s", query);
    json_t *c = ctc_get_json(path, NULL), *p, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(c, "points"), i, p) if (json_integer_value(
        json_object_get(p, "step")) == step) found = json_incref(p);
    json_decref(c);
    return found;
}

static void test_albert_heads(void **state)
{
    (void)state;
    struct peer_report r;
    /* step 60: all three with both heads */
    const double sop60[] = {0.70, 0.66, 0.60}, acc60[] = {0.10, 0.25, 0.5};
    const int who[] = {V1A, V1B, V2A};
    const double smp[] = {64, 32, 128};
    for (int k = 0; k < 3; k++) {
        albert_report(&r, who[k], 60, smp[k], sop60[k], acc60[k]);
        const char *pl = ctc_encode(&r, "r1", who[k]);
        assert_non_null(strstr(pl, "\"sop_loss\":"));
        assert_non_null(strstr(pl, "\"mlm_accuracy\":"));
        ctc_expect_post(&r, who[k], 201, NULL);
    }
    /* step 61: V2A's report without them (an agent before them) */
    albert_report(&r, V1A, 61, 64, 0.5, 0.2);
    ctc_expect_post(&r, V1A, 201, NULL);
    albert_report(&r, V1B, 61, 32, 0.8, 0.35);
    ctc_expect_post(&r, V1B, 201, NULL);
    albert_report(&r, V2A, 61, 128, NAN, NAN);
    ctc_expect_post(&r, V2A, 201, NULL);
    /* step 62: nobody has them */
    for (int k = 0; k < 3; k++) {
        albert_report(&r, who[k], 62, smp[k], NAN, NAN);
        ctc_expect_post(&r, who[k], 201, NULL);
    }
    /* stored as sent */
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_reports WHERE step = 60 "
                                "AND sop_loss IS NOT NULL AND mlm_accuracy IS NOT NULL"),
                     3);
    assert_int_equal(ctc_scalar("SELECT round(mlm_accuracy * 1000)::bigint FROM contrib_claims "
                            "WHERE step = 60 AND claimed_samples = 128"), 500);
    assert_int_equal(
        ctc_scalar("SELECT count(*) FROM contrib_reports WHERE step = 61 AND sop_loss IS NULL"), 1);
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_reports WHERE step = 62 AND "
                            "(sop_loss IS NOT NULL OR mlm_accuracy IS NOT NULL)"), 0);
    /* the curve's weighted means */
    json_t *p = curve_point("from=60&to=62", 60);
    assert_non_null(p);
    double w_sop = (64 * 0.70 + 32 * 0.66 + 128 * 0.60) / 224;
    double w_acc = (64 * 0.10 + 32 * 0.25 + 128 * 0.5) / 224;
    assert_true(fabs(ctc_num(p, "sop_loss") - w_sop) < 1e-12);
    assert_true(fabs(ctc_num(p, "mlm_accuracy") - w_acc) < 1e-12);
    assert_true(fabs(ctc_num(p, "loss") - 6.5) < 1e-12);
    json_decref(p);
    p = curve_point("from=60&to=62", 61);
    assert_non_null(p);
    assert_true(fabs(ctc_num(p, "sop_loss") - (64 * 0.5 + 32 * 0.8) / 96) < 1e-12);
    assert_true(fabs(ctc_num(p, "mlm_accuracy") - (64 * 0.2 + 32 * 0.35) / 96) < 1e-12);
    assert_true(ctc_num(p, "samples") == 224); /* all three count for the samples */
    json_decref(p);
    p = curve_point("from=60&to=62", 62);
    assert_non_null(p);
    assert_true(json_is_null(json_object_get(p, "sop_loss")));
    assert_true(json_is_null(json_object_get(p, "mlm_accuracy")));
    json_decref(p);
    /* a step of another model's reports: the keys are there, null */
    p = curve_point("from=1&to=1", 1);
    assert_non_null(p);
    assert_true(json_is_null(json_object_get(p, "sop_loss")) &&
                json_is_null(json_object_get(p, "mlm_accuracy")));
    json_decref(p);
    /* one bucket of steps 60 and 61: weighted over both */
    p = curve_point("from=60&to=61&max_points=1", 61);
    assert_non_null(p);
    assert_true(fabs(ctc_num(p, "sop_loss") - (64 * 0.70 + 32 * 0.66 + 128 * 0.60 + 64 * 0.5 + 32 * 0.8) / 320) <
                1e-12);
    json_decref(p);

    /* refused, naming the field; nothing stored */
    long before = db_state();
    char pk[64], other[64], rnd[65];
    uint8_t rid[32];
    ctc_round_id(663, rid);
    cm_hex_encode(rid, 32, rnd);
    cm_b64url_encode(g_key[V1C].pub, 32, pk);
    cm_b64url_encode(g_key[V1A].pub, 32, other);
    const char *bad[] = {"\"sop_loss\":\"0.7\"", "\"sop_loss\":-1",       "\"sop_loss\":2e6",
                         "\"sop_loss\":null",    "\"mlm_accuracy\":1.5",  "\"mlm_accuracy\":-0.1",
                         "\"mlm_accuracy\":true", "\"mlm_accuracy\":[0.5]"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char payload[2048];
        snprintf(payload, sizeof payload,
                 "{\"format\":\"crowdtrain-report/1\",\"run\":\"r1\",\"peer\":\"%s\",\"step\":63,"
                 "\"group\":\"g\",\"round\":\"%s\",\"samples\":16,\"compute_s\":1,\"loss\":6,%s,"
                 "\"sps\":1,\"round_ms\":1,\"parts\":1,\"parts_averaged\":1,\"members\":{\"%s\":16},"
                 "\"excluded\":[],\"t\":1}",
                 pk, rnd, bad[k], other);
        char *body = NULL;
        assert_int_equal(peer_report_sign(&g_key[V1C], g_tok[V1C], payload, strlen(payload), &body), CM_OK);
        struct ct_resp resp;
        ct_http(&g_c, "POST", "/api/v1/runs/r1/reports", NULL, body, &resp);
        free(body);
        json_t *e = json_object_get(resp.json, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        const char *field = strstr(bad[k], "sop_loss") ? "sop_loss" : "mlm_accuracy";
        if (resp.status != 400 || !code || strcmp(code, "invalid_report") || !msg || !strstr(msg, field))
            fail_msg("%s: %ld %s", bad[k], resp.status, resp.body ? resp.body : "");
        ct_resp_free(&resp);
    }
    assert_int_equal(db_state(), before);
    assert_int_equal(ctc_scalar("SELECT count(*) FROM contrib_reports WHERE step = 63"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_round_adds_up),
        cmocka_unit_test(test_inflating_peer_flagged),
        cmocka_unit_test(test_excluded_peer_not_verified),
        cmocka_unit_test(test_bad_reports_change_nothing),
        cmocka_unit_test(test_retry_not_counted_twice),
        cmocka_unit_test(test_csv_equals_api),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_curve_and_stats),
        cmocka_unit_test(test_agent_reporter),
        cmocka_unit_test(test_checkpoint_vouched_by_members),
        cmocka_unit_test(test_run_status_follows_verified_progress),
        cmocka_unit_test(test_public_figures_verified_only),
        cmocka_unit_test(test_albert_heads),
    };
    return cmocka_run_group_tests(tests, ct_contrib_setup, ct_contrib_teardown);
}
