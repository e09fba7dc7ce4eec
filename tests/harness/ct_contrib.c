/* The contribution-accounting tests' fixture (ct_contrib.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "ct_contrib.h"


struct ct_pg g_pg;
struct ct_coord g_c;
char *g_org, *g_aud, *g_vol1, *g_vol2, *g_mal;
struct cm_ed25519 g_key[NPEERS];
char *g_tok[NPEERS];
char g_pass_id[NPEERS][24];

long ctc_req(const char *method, const char *path, const char *bearer, const char *body)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

json_t *ctc_get_json(const char *path, const char *bearer)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", path, bearer, NULL, &r);
    if (r.status != 200)
        fail_msg("GET %s: %ld %s", path, r.status, r.body ? r.body : "");
    json_t *j = json_incref(r.json);
    ct_resp_free(&r);
    return j;
}

char *ctc_make_user(const char *name, const char *role)
{
    char body[200];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"role\":\"%s\",\"password\":\"" PW "\"}",
             name, role);
    if (ctc_req("POST", "/api/v1/users", g_org, body) != 201)
        return NULL;
    return ct_login(&g_c, name, PW);
}

int ctc_get_pass(int i, const char *run, const char *bearer, const char *user)
{
    struct ct_resp r;
    int ok = ct_pass_request(&g_c, bearer, run, user, &g_key[i], &r) == 201;
    if (ok) {
        g_tok[i] = strdup(json_string_value(json_object_get(r.json, "access_token")));
        snprintf(g_pass_id[i], sizeof g_pass_id[i], "%s",
                 json_string_value(json_object_get(r.json, "pass_id")));
    }
    ct_resp_free(&r);
    return ok ? 0 : -1;
}

int ct_contrib_setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || !(g_org = ct_login(&g_c, "org", PW)))
        return -1;
    if (!(g_aud = ctc_make_user("aud", "auditor")) ||
        !(g_vol1 = ctc_make_user("vol1", "volunteer")) ||
        !(g_vol2 = ctc_make_user("vol2", "volunteer")) ||
        !(g_mal = ctc_make_user("mallory", "volunteer")))
        return -1;
    if (ctc_req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"r1\",\"target_batch_size\":256,\"config\":{\"steps\":100}}") != 201 ||
        ctc_req("POST", "/api/v1/runs", g_org,
                "{\"name\":\"r2\",\"target_batch_size\":256}") != 201 ||
        ctc_req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"r3\",\"target_batch_size\":256,\"config\":{\"steps\":3}}") != 201)
        return -1;
    const char *allow[] = {"/api/v1/runs/r1/allowlist/vol1", "/api/v1/runs/r1/allowlist/vol2",
                           "/api/v1/runs/r1/allowlist/mallory", "/api/v1/runs/r2/allowlist/vol1",
                           "/api/v1/runs/r3/allowlist/vol1"};
    for (int i = 0; i < 5; i++)
        if (ctc_req("PUT", allow[i], g_org, NULL) != 201)
            return -1;
    for (int i = 0; i < NPEERS; i++)
        if (cm_ed25519_generate(&g_key[i]) != CM_OK)
            return -1;
    const char *owner[NPEERS] = {g_vol1, g_vol1, g_vol1, g_vol2, g_vol2, g_mal, g_vol2, g_vol1,
                                 g_vol1, g_vol1};
    const char *owner_name[NPEERS] = {"vol1", "vol1", "vol1", "vol2",  "vol2",
                                      "mallory", "vol2", "vol1", "vol1", "vol1"};
    for (int i = 0; i < NPEERS; i++)
        if (ctc_get_pass(i, i == OTHER_RUN ? "r2" : i >= F1 ? "r3" : "r1", owner[i],
                         owner_name[i]) != 0)
            return -1;
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/r1/passes/%s/revoke", g_pass_id[REVOKED]);
    if (ctc_req("POST", path, g_org, "{\"reason\":\"test\"}") != 200)
        return -1;
    return 0;
}

int ct_contrib_teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NPEERS; i++) {
        cm_ed25519_cleanup(&g_key[i]);
        free(g_tok[i]);
    }
    free(g_org);
    free(g_aud);
    free(g_vol1);
    free(g_vol2);
    free(g_mal);
    return rc;
}

/* --- building reports ----------------------------------------------------- */

void ctc_round_id(int n, uint8_t out[32])
{
    char s[32];
    snprintf(s, sizeof s, "round-%d", n);
    cm_sha256(s, strlen(s), out);
}

/* A report of peer `me` at `step` in round `rnd`: it saw members[k] do seen[k]. */
void ctc_build(struct peer_report *r, int me, int64_t step, int rnd, double samples,
                  const int *members, const double *seen, size_t n)
{
    memset(r, 0, sizeof *r);
    r->step = step;
    snprintf(r->group, sizeof r->group, "g%d", rnd);
    ctc_round_id(rnd, r->round_id);
    r->samples = samples;
    r->compute_s = samples / 100.0;
    r->loss = 2.0 - 0.1 * (double)step + 0.01 * me;
    r->sps = 100;
    r->round_ms = 150;
    r->parts = 4;
    r->parts_averaged = 4;
    r->n_members = n;
    for (size_t k = 0; k < n; k++) {
        memcpy(r->members[k].pub, g_key[members[k]].pub, 32);
        r->members[k].samples = seen[k];
    }
}

/* Signs raw payload bytes with key `signer` and the pass of `pass_of`; posts
 * to run `run`. Returns the status; *code gets the error code (or ""). */
long ctc_post_raw(const char *run, int signer, int pass_of, const char *payload, char code[40])
{
    char *body = NULL;
    assert_int_equal(peer_report_sign(&g_key[signer], g_tok[pass_of], payload, strlen(payload),
                                      &body),
                     CM_OK);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/reports", run);
    struct ct_resp r;
    ct_http(&g_c, "POST", path, NULL, body, &r);
    free(body);
    long s = r.status;
    const char *c = json_string_value(json_object_get(json_object_get(r.json, "error"), "code"));
    if (code)
        snprintf(code, 40, "%s", c ? c : "");
    ct_resp_free(&r);
    return s;
}

char *ctc_encode(const struct peer_report *r, const char *run, int me)
{
    static char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len = 0;
    assert_int_equal(peer_report_encode(r, run, g_key[me].pub, 1763800000, buf, sizeof buf, &len),
                     CM_OK);
    return buf;
}

long ctc_post(const struct peer_report *r, int me, char code[40])
{
    return ctc_post_raw("r1", me, me, ctc_encode(r, "r1", me), code);
}

void ctc_expect_post(const struct peer_report *r, int me, long status, const char *code)
{
    char c[40];
    long s = ctc_post(r, me, c);
    if (s != status || (code && strcmp(c, code) != 0))
        fail_msg("peer %d step %lld: expected %ld %s, got %ld %s", me, (long long)r->step, status,
                 code ? code : "", s, c);
}

long ctc_scalar(const char *sql)
{
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return v;
}

/* Rows of contributions/steps for one step, keyed by peer. */
json_t *ctc_step_row(int64_t step, int peer)
{
    char path[160], pk[64];
    snprintf(path, sizeof path, "/api/v1/runs/r1/contributions/steps?from=%lld&to=%lld",
             (long long)step, (long long)step);
    cm_b64url_encode(g_key[peer].pub, 32, pk);
    json_t *j = ctc_get_json(path, g_aud), *row, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(j, "rows"), i, row) if (!strcmp(
        json_string_value(json_object_get(row, "peer_public_key")), pk)) found = json_incref(row);
    json_decref(j);
    return found;
}

double ctc_num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* --- tests -------------------------------------------------------------------- */
