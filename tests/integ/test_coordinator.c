/* ct-timeout: 300 */
/* Integration tests of crowdtrain-coordinator: a real PostgreSQL, the real
 * binary, HTTPS through libcurl. Passes go only to authenticated,
 * allowlisted users and verify against the published keys; revocations are
 * listed; bad input of every kind gets a clear JSON error and changes
 * nothing; throttling, restarts after kill -9, two coordinators on one
 * database. Start and stop (SIGTERM, the certificate, a newer schema) are in
 * test_coordinator_stop.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_passreq.h"
#include "cm_token.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol, *g_aud; /* session tokens */

#define ORG_PW "organizer-password"
#define VOL_PW "volunteer-password"

static json_t *jget(const struct ct_resp *r, const char *k)
{
    return json_object_get(r->json, k);
}

static const char *err_code(const struct ct_resp *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

/* Every error answer is {"error":{"code","message"}} with a non-empty message. */
static void assert_error(const struct ct_resp *r, long status, const char *code)
{
    if (r->status != status || !err_code(r) || strcmp(err_code(r), code) != 0)
        fail_msg("expected %ld %s, got %ld %s", status, code, r->status, r->body ? r->body : "(none)");
    const char *msg = json_string_value(json_object_get(json_object_get(r->json, "error"), "message"));
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
}

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

static void pubkey_b64(const struct cm_ed25519 *k, char out[64])
{
    cm_b64url_encode(k->pub, CM_ED25519_PUB_LEN, out);
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0)
        return -1;
    if (ct_create_user(g_pg.url, "org", "organizer", ORG_PW) != 0)
        return -1;
    if (ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", ORG_PW);
    if (!g_org)
        return -1;
    const char *users[][2] = {{"vol", "volunteer"}, {"aud", "auditor"}, {"outsider", "volunteer"}};
    for (size_t i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"username\":\"%s\",\"role\":\"%s\",\"password\":\"%s\"}",
                 users[i][0], users[i][1], VOL_PW);
        if (req("POST", "/api/v1/users", g_org, body) != 201)
            return -1;
    }
    g_vol = ct_login(&g_c, "vol", VOL_PW);
    g_aud = ct_login(&g_c, "aud", VOL_PW);
    if (!g_vol || !g_aud)
        return -1;
    if (req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"fmnist\",\"target_batch_size\":4096,\"model_summary\":\"MLP\"}") != 201 ||
        req("PUT", "/api/v1/runs/fmnist/allowlist/vol", g_org, NULL) != 201)
        return -1;
    return 0;
}

/* cmocka does not count a failed group teardown in its exit status. */
static int g_teardown_failed;

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    free(g_org);
    free(g_vol);
    free(g_aud);
    g_teardown_failed = rc != 0;
    return rc;
}

/* Fetches the published keys into keys[]; returns how many. */
static size_t published_keys(const struct ct_coord *c, uint8_t keys[][32], size_t cap)
{
    struct ct_resp r;
    ct_http(c, "GET", "/api/v1/keys", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    size_t n = 0, i;
    json_t *k;
    json_array_foreach(jget(&r, "keys"), i, k) {
        const char *pk = json_string_value(json_object_get(k, "public_key"));
        size_t got = 0;
        if (n < cap && pk && cm_b64url_decode(pk, strlen(pk), keys[n], 32, &got) == CM_OK && got == 32)
            n++;
    }
    ct_resp_free(&r);
    return n;
}

/* A pass of run fmnist for `peer`, asked as `user` (whose session bearer is). */
static char *get_pass_as(const struct ct_coord *c, const char *bearer, const char *user,
                         const struct cm_ed25519 *peer, long *status)
{
    struct ct_resp r;
    *status = ct_pass_request(c, bearer, "fmnist", user, peer, &r);
    const char *t = json_string_value(jget(&r, "access_token"));
    char *out = t ? strdup(t) : NULL;
    ct_resp_free(&r);
    return out;
}

static void test_pass_issued_only_to_allowlisted(void **state)
{
    (void)state;
    struct cm_ed25519 peer;
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    long st = 0;

    /* not logged in */
    char *t = get_pass_as(&g_c, NULL, "vol", &peer, &st);
    assert_null(t);
    assert_int_equal(st, 401);
    /* logged in but not allowlisted */
    char *outsider = ct_login(&g_c, "outsider", VOL_PW);
    assert_non_null(outsider);
    t = get_pass_as(&g_c, outsider, "outsider", &peer, &st);
    assert_null(t);
    assert_int_equal(st, 403);
    /* unknown run */
    struct ct_resp r;
    char body[512];
    assert_int_equal(ct_pass_body("nope", "vol", &peer, body, sizeof body), 0);
    ct_http(&g_c, "POST", "/api/v1/runs/nope/passes", g_vol, body, &r);
    assert_error(&r, 404, "not_found");
    ct_resp_free(&r);

    /* allowlisted volunteer: the token verifies against the published key */
    t = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_int_equal(st, 201);
    assert_non_null(t);
    uint8_t keys[8][32];
    size_t nk = published_keys(&g_c, keys, 8);
    assert_true(nk >= 1);
    struct cm_pass_claims c;
    assert_int_equal(cm_token_verify(t, strlen(t), (const uint8_t(*)[32])keys, nk, time(NULL), 60, &c), CM_OK);
    assert_string_equal(c.username, "vol");
    assert_string_equal(c.run, "fmnist");
    assert_memory_equal(c.peer_public_key, peer.pub, 32);
    assert_true(c.expires_at > c.issued_at);
    /* a tampered token does not */
    t[strlen(t) - 3] = t[strlen(t) - 3] == 'A' ? 'B' : 'A';
    assert_int_not_equal(cm_token_verify(t, strlen(t), (const uint8_t(*)[32])keys, nk, time(NULL), 60, &c), CM_OK);
    free(t);

    /* an organizer who is not allowlisted gets no pass either */
    t = get_pass_as(&g_c, g_org, "org", &peer, &st);
    assert_null(t);
    assert_int_equal(st, 403);

    /* paused run: no pass, and the run says why */
    assert_int_equal(req("PATCH", "/api/v1/runs/fmnist", g_org, "{\"status\":\"paused\"}"), 200);
    t = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_null(t);
    assert_int_equal(st, 409);
    assert_int_equal(req("PATCH", "/api/v1/runs/fmnist", g_org, "{\"status\":\"open\"}"), 200);

    /* every pass is recorded */
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist/passes", g_aud, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(json_array_size(jget(&r, "passes")) >= 1);
    ct_resp_free(&r);
    free(outsider);
    cm_ed25519_cleanup(&peer);
}

static void test_revocation_listed(void **state)
{
    (void)state;
    struct cm_ed25519 peer;
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    long st;
    char *t = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_non_null(t);
    struct cm_pass_claims c;
    uint8_t sig[64];
    size_t sl;
    assert_int_equal(cm_token_parse(t, strlen(t), &c, sig, &sl), CM_OK);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/fmnist/passes/%s/revoke", c.pass_id);
    /* volunteers and auditors cannot revoke */
    assert_int_equal(req("POST", path, g_vol, NULL), 403);
    assert_int_equal(req("POST", path, g_aud, NULL), 403);
    /* scope "pass": this pass only (the key may be given a new one) */
    struct ct_resp r;
    ct_http(&g_c, "POST", path, g_org, "{\"reason\":\"test\",\"scope\":\"pass\"}", &r);
    assert_int_equal(r.status, 200);
    assert_false(json_is_true(jget(&r, "already_revoked")));
    ct_resp_free(&r);
    ct_http(&g_c, "POST", path, g_org, "{\"scope\":\"pass\"}", &r);
    assert_int_equal(r.status, 200);
    assert_true(json_is_true(jget(&r, "already_revoked")));
    ct_resp_free(&r);

    ct_http(&g_c, "GET", "/api/v1/runs/fmnist/revocations", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    int found = 0;
    size_t i;
    json_t *e;
    json_array_foreach(jget(&r, "revoked"), i, e)
        found |= !strcmp(json_string_value(json_object_get(e, "pass_id")), c.pass_id);
    assert_true(found);
    ct_resp_free(&r);

    /* an unknown pass is a 404 and the audit log has the revocation */
    assert_int_equal(req("POST", "/api/v1/runs/fmnist/passes/999999/revoke", g_org, NULL), 404);
    ct_http(&g_c, "GET", "/api/v1/audit", g_aud, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(json_object_get(json_array_get(jget(&r, "entries"), 0), "action")),
                        "pass.revoke");
    ct_resp_free(&r);

    /* removing a user from the allowlist revokes their live passes */
    char *t2 = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_non_null(t2);
    ct_http(&g_c, "DELETE", "/api/v1/runs/fmnist/allowlist/vol", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(json_integer_value(jget(&r, "passes_revoked")) >= 1);
    ct_resp_free(&r);
    free(get_pass_as(&g_c, g_vol, "vol", &peer, &st));
    assert_int_equal(st, 403);
    assert_int_equal(req("PUT", "/api/v1/runs/fmnist/allowlist/vol", g_org, NULL), 201);
    free(t);
    free(t2);
    cm_ed25519_cleanup(&peer);
}

/* ---- proof of possession (issue 22, finding 4) ---- */

/* POSTs a pass request built from pr (signed or not by the caller). */
static long post_passreq(const char *bearer, const char *run, const struct cm_passreq *pr, struct ct_resp *r)
{
    json_t *j = cm_passreq_to_json(pr);
    char *body = json_dumps(j, JSON_COMPACT);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", run);
    ct_http(&g_c, "POST", path, bearer, body, r);
    free(body);
    json_decref(j);
    return r->status;
}

/* A second allowlisted volunteer of fmnist; its session token (heap). */
static char *second_volunteer(const char *name)
{
    char body[256], path[128];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"%s\"}", name,
             VOL_PW);
    snprintf(path, sizeof path, "/api/v1/runs/fmnist/allowlist/%s", name);
    assert_int_equal(req("POST", "/api/v1/users", g_org, body), 201);
    assert_int_equal(req("PUT", path, g_org, NULL), 201);
    char *t = ct_login(&g_c, name, VOL_PW);
    assert_non_null(t);
    return t;
}

static void test_pass_needs_proof_of_possession(void **state)
{
    (void)state;
    struct cm_ed25519 victim, thief;
    assert_int_equal(cm_ed25519_generate(&victim), CM_OK);
    assert_int_equal(cm_ed25519_generate(&thief), CM_OK);
    struct ct_resp r;
    /* the request of before (the key alone) proves nothing: refused */
    char pk[64], body[128];
    pubkey_b64(&victim, pk);
    snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\"}", pk);
    ct_http(&g_c, "POST", "/api/v1/runs/fmnist/passes", g_vol, body, &r);
    assert_error(&r, 400, "invalid_request");
    ct_resp_free(&r);
    /* the victim's key, signed by a key the requester does hold */
    struct cm_passreq pr;
    assert_int_equal(cm_passreq_sign(&thief, "fmnist", "vol", (int64_t)time(NULL), &pr), CM_OK);
    memcpy(pr.peer_public_key, victim.pub, 32);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 403, "bad_signature");
    ct_resp_free(&r);
    /* a signature by the right key for another user, or another run */
    assert_int_equal(cm_passreq_sign(&victim, "fmnist", "outsider", (int64_t)time(NULL), &pr), CM_OK);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 403, "bad_signature");
    ct_resp_free(&r);
    assert_int_equal(cm_passreq_sign(&victim, "other", "vol", (int64_t)time(NULL), &pr), CM_OK);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 403, "bad_signature");
    ct_resp_free(&r);
    /* a request signed an hour ago (or ahead) is stale */
    assert_int_equal(cm_passreq_sign(&victim, "fmnist", "vol", (int64_t)time(NULL) - 3600, &pr), CM_OK);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 400, "stale_request");
    ct_resp_free(&r);
    assert_int_equal(cm_passreq_sign(&victim, "fmnist", "vol", (int64_t)time(NULL) + 3600, &pr), CM_OK);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 400, "stale_request");
    ct_resp_free(&r);
    /* a good request mints once; the same bytes again are a replay */
    assert_int_equal(cm_passreq_sign(&victim, "fmnist", "vol", (int64_t)time(NULL), &pr), CM_OK);
    assert_int_equal(post_passreq(g_vol, "fmnist", &pr, &r), 201);
    ct_resp_free(&r);
    post_passreq(g_vol, "fmnist", &pr, &r);
    assert_error(&r, 409, "replayed_request");
    ct_resp_free(&r);
    /* none of the refusals minted a pass: one row for this key */
    char q[256], hex[65];
    cm_hex_encode(victim.pub, 32, hex);
    snprintf(q, sizeof q, "SELECT count(*) FROM passes WHERE peer_public_key = '\\x%s'", hex);
    long n = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, q, &n), 0);
    assert_int_equal(n, 1);
    cm_ed25519_cleanup(&victim);
    cm_ed25519_cleanup(&thief);
}

static void test_pass_refuses_weak_keys(void **state)
{
    (void)state;
    static const char *weak[] = {
        "0000000000000000000000000000000000000000000000000000000000000000", /* all zero, order 4 */
        "0100000000000000000000000000000000000000000000000000000000000000", /* identity */
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", /* order 2 */
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", /* order 8 */
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa", /* order 8 */
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", /* y = p */
    };
    for (size_t i = 0; i < sizeof weak / sizeof weak[0]; i++) {
        struct cm_passreq pr;
        memset(&pr, 0, sizeof pr);
        size_t n = 0;
        assert_int_equal(cm_hex_decode(weak[i], 64, pr.peer_public_key, 32, &n), CM_OK);
        /* the unsigned form of the request (accepted before issue 22) */
        struct ct_resp r;
        char pk[64], body[128];
        cm_b64url_encode(pr.peer_public_key, 32, pk);
        snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\"}", pk);
        ct_http(&g_c, "POST", "/api/v1/runs/fmnist/passes", g_vol, body, &r);
        assert_int_equal(r.status, 400);
        ct_resp_free(&r);
        /* signed: R = identity, S = 0 satisfies the verification equation of
         * the identity key for any message; refused for the key itself */
        pr.timestamp = (int64_t)time(NULL);
        assert_int_equal(cm_random_bytes(pr.nonce, sizeof pr.nonce), CM_OK);
        pr.signature[0] = 1;
        post_passreq(g_vol, "fmnist", &pr, &r);
        assert_error(&r, 400, "weak_key");
        ct_resp_free(&r);
    }
    long n = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM passes WHERE peer_public_key IN "
                                  "('\\x0000000000000000000000000000000000000000000000000000000000000000', "
                                  "'\\x0100000000000000000000000000000000000000000000000000000000000000')",
                                  &n),
                     0);
    assert_int_equal(n, 0);
}

/* A key belongs to one user; revoking by key stops minting; release frees it. */
static void test_key_has_one_owner_and_revocation_blocks_it(void **state)
{
    (void)state;
    char *vol2 = second_volunteer("vol2");
    struct cm_ed25519 k;
    assert_int_equal(cm_ed25519_generate(&k), CM_OK);
    char pk[64], path[192];
    pubkey_b64(&k, pk);
    struct ct_resp r;
    /* vol proves to hold k first: it is vol's */
    assert_int_equal(ct_pass_request(&g_c, g_vol, "fmnist", "vol", &k, &r), 201);
    char first[32];
    snprintf(first, sizeof first, "%s", json_string_value(jget(&r, "pass_id")));
    ct_resp_free(&r);
    /* vol2 with a valid signature by k (as if the key had leaked) is refused */
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k, &r), 409);
    assert_error(&r, 409, "key_owned");
    ct_resp_free(&r);
    /* the owner renews */
    assert_int_equal(ct_pass_request(&g_c, g_vol, "fmnist", "vol", &k, &r), 201);
    ct_resp_free(&r);
    snprintf(path, sizeof path, "/api/v1/peer-keys/%s", pk);
    ct_http(&g_c, "GET", path, g_aud, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(jget(&r, "username")), "vol");
    assert_int_equal(json_integer_value(jget(&r, "live_passes")), 2);
    ct_resp_free(&r);
    assert_int_equal(req("GET", path, g_vol, NULL), 403);

    /* revoking one pass (default scope: its key) revokes the key's other
     * live pass and blocks minting for the key at once */
    snprintf(path, sizeof path, "/api/v1/runs/fmnist/passes/%s/revoke", first);
    ct_http(&g_c, "POST", path, g_org, "{\"reason\":\"stolen device\"}", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(jget(&r, "scope")), "key");
    assert_int_equal(json_integer_value(jget(&r, "passes_revoked")), 1);
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, g_vol, "fmnist", "vol", &k, &r), 403);
    assert_error(&r, 403, "key_revoked");
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k, &r), 403);
    ct_resp_free(&r);
    /* both passes are on the public revocation list that peers gossip */
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist/revocations", NULL, NULL, &r);
    long listed = 0;
    long n = -1;
    char q[256], hex[65];
    cm_hex_encode(k.pub, 32, hex);
    size_t i;
    json_t *e;
    json_array_foreach(jget(&r, "revoked"), i, e) {
        snprintf(q, sizeof q, "SELECT count(*) FROM passes WHERE id = %s AND peer_public_key = '\\x%s'",
                 json_string_value(json_object_get(e, "pass_id")), hex);
        assert_int_equal(ct_pg_scalar(&g_pg, q, &n), 0);
        listed += n;
    }
    ct_resp_free(&r);
    assert_int_equal(listed, 2);

    /* release: the key is free again, for whoever proves to hold it */
    snprintf(path, sizeof path, "/api/v1/peer-keys/%s/release", pk);
    assert_int_equal(req("POST", path, g_vol, NULL), 403);
    assert_int_equal(req("POST", path, g_org, NULL), 200);
    assert_int_equal(req("POST", path, g_org, NULL), 404);
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k, &r), 201);
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, g_vol, "fmnist", "vol", &k, &r), 409);
    ct_resp_free(&r);
    /* vol proved once to hold k, so its renewals are not verified again; but
     * once the key is free, claiming it takes a valid signature, also from
     * vol: a request signed by another key but naming k is refused */
    assert_int_equal(req("POST", path, g_org, NULL), 200);
    struct cm_ed25519 other;
    assert_int_equal(cm_ed25519_generate(&other), CM_OK);
    char forged[512], opk[64];
    assert_int_equal(ct_pass_body("fmnist", "vol", &other, forged, sizeof forged), 0);
    pubkey_b64(&other, opk);
    char *at = strstr(forged, opk);
    assert_non_null(at);
    memcpy(at, pk, strlen(pk));
    cm_ed25519_cleanup(&other);
    ct_http(&g_c, "POST", "/api/v1/runs/fmnist/passes", g_vol, forged, &r);
    assert_error(&r, 403, "bad_signature");
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k, &r), 201);
    ct_resp_free(&r);

    /* a key can be revoked before anyone holds it */
    struct cm_ed25519 k2;
    assert_int_equal(cm_ed25519_generate(&k2), CM_OK);
    char pk2[64];
    pubkey_b64(&k2, pk2);
    snprintf(path, sizeof path, "/api/v1/peer-keys/%s/revoke", pk2);
    assert_int_equal(req("POST", path, g_vol, "{}"), 403);
    ct_http(&g_c, "POST", path, g_org, "{\"reason\":\"known bad\"}", &r);
    assert_int_equal(r.status, 200);
    assert_false(json_is_true(jget(&r, "already_revoked")));
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, g_vol, "fmnist", "vol", &k2, &r), 403);
    assert_error(&r, 403, "key_revoked");
    ct_resp_free(&r);
    snprintf(path, sizeof path, "/api/v1/peer-keys/%s", pk2);
    ct_http(&g_c, "GET", path, g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(json_is_null(jget(&r, "username")));
    assert_string_equal(json_string_value(jget(&r, "revoke_reason")), "known bad");
    ct_resp_free(&r);
    assert_int_equal(req("GET", "/api/v1/peer-keys/not-a-key", g_org, NULL), 404);

    /* scope "user": the pass's user leaves the run's allowlist */
    struct cm_ed25519 k3;
    assert_int_equal(cm_ed25519_generate(&k3), CM_OK);
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k3, &r), 201);
    snprintf(path, sizeof path, "/api/v1/runs/fmnist/passes/%s/revoke",
             json_string_value(jget(&r, "pass_id")));
    ct_resp_free(&r);
    ct_http(&g_c, "POST", path, g_org, "{\"scope\":\"user\"}", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(jget(&r, "passes_revoked")), 1); /* k's pass of vol2 */
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, vol2, "fmnist", "vol2", &k3, &r), 403);
    assert_error(&r, 403, "not_allowlisted");
    ct_resp_free(&r);
    assert_int_equal(req("POST", path, g_org, "{\"scope\":\"everything\"}"), 400);
    cm_ed25519_cleanup(&k);
    cm_ed25519_cleanup(&k2);
    cm_ed25519_cleanup(&k3);
    free(vol2);
}

/* Counts rows the bad requests must not change. */
static void snapshot(long counts[4])
{
    struct ct_resp r;
    const char *paths[] = {"/api/v1/runs", "/api/v1/users", "/api/v1/audit?limit=1000",
                           "/api/v1/runs/fmnist/allowlist"};
    const char *keys[] = {"runs", "users", "entries", "allowlist"};
    for (int i = 0; i < 4; i++) {
        ct_http(&g_c, "GET", paths[i], g_org, NULL, &r);
        assert_int_equal(r.status, 200);
        counts[i] = (long)json_array_size(jget(&r, keys[i]));
        ct_resp_free(&r);
    }
}

static void test_bad_input_changes_nothing(void **state)
{
    (void)state;
    long before[4], after[4];
    snapshot(before);
    struct {
        const char *method, *path, *body;
        int who; /* 0 none, 1 org, 2 vol, 3 aud, 4 forged */
        long status;
        const char *code;
    } cases[] = {
        {"POST", "/api/v1/runs", "{\"name\":\"x\",", 1, 400, "malformed_json"},
        {"POST", "/api/v1/runs", "[1,2]", 1, 400, "malformed_json"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"name\":\"y\",\"target_batch_size\":1}", 1, 400, "malformed_json"},
        {"POST", "/api/v1/runs", "", 1, 400, "malformed_json"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\"} trailing", 1, 400, "malformed_json"},
        {"POST", "/api/v1/runs", "{\"name\":5,\"target_batch_size\":1}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":\"10\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":0}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":-5}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1,\"extra\":1}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x'; DROP TABLE runs;--\",\"target_batch_size\":1}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"fmnist\",\"target_batch_size\":1}", 1, 409, "exists"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1,\"status\":\"bogus\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1}", 2, 403, "forbidden"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1}", 3, 403, "forbidden"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1}", 0, 401, "unauthenticated"},
        {"POST", "/api/v1/runs", "{\"name\":\"x\",\"target_batch_size\":1}", 4, 401, "unauthenticated"},
        {"PATCH", "/api/v1/runs/fmnist", "{\"status\":\"open\"}", 2, 403, "forbidden"},
        {"PATCH", "/api/v1/runs/fmnist", "{}", 1, 400, "invalid_request"},
        {"PATCH", "/api/v1/runs/nope", "{\"status\":\"open\"}", 1, 404, "not_found"},
        {"POST", "/api/v1/users", "{\"username\":\"a b\",\"role\":\"volunteer\",\"password\":\"longenough\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/users", "{\"username\":\"newbie\",\"role\":\"admin\",\"password\":\"longenough\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/users", "{\"username\":\"newbie\",\"role\":\"volunteer\",\"password\":\"short\"}", 1, 400, "invalid_request"},
        {"POST", "/api/v1/users", "{\"username\":\"vol\",\"role\":\"volunteer\",\"password\":\"longenough\"}", 1, 409, "exists"},
        {"POST", "/api/v1/users", "{\"username\":\"newbie\",\"role\":\"organizer\",\"password\":\"longenough\"}", 2, 403, "forbidden"},
        {"POST", "/api/v1/users", "{\"username\":\"newbie\",\"role\":\"organizer\",\"password\":\"longenough\"}", 3, 403, "forbidden"},
        {"GET", "/api/v1/users", NULL, 2, 403, "forbidden"},
        {"GET", "/api/v1/audit", NULL, 2, 403, "forbidden"},
        {"GET", "/api/v1/audit?limit=0", NULL, 1, 400, "invalid_request"},
        {"PUT", "/api/v1/runs/fmnist/allowlist/outsider", NULL, 2, 403, "forbidden"},
        {"PUT", "/api/v1/runs/fmnist/allowlist/outsider", NULL, 3, 403, "forbidden"},
        {"PUT", "/api/v1/runs/fmnist/allowlist/x'%20OR%20'1'='1", NULL, 1, 400, "invalid_request"},
        {"PUT", "/api/v1/runs/nope/allowlist/outsider", NULL, 1, 404, "not_found"},
        {"PUT", "/api/v1/runs/fmnist/allowlist/outsider", "{}", 1, 400, "unexpected_body"},
        {"DELETE", "/api/v1/runs/fmnist/allowlist/nobody", NULL, 1, 404, "not_found"},
        {"GET", "/api/v1/runs/fmnist/allowlist", NULL, 2, 403, "forbidden"},
        {"POST", "/api/v1/runs/fmnist/passes", "{\"peer_public_key\":\"AAAA\"}", 2, 400, "invalid_request"},
        {"POST", "/api/v1/runs/fmnist/passes", "{\"peer_public_key\":\"!!!\"}", 2, 400, "invalid_request"},
        {"POST", "/api/v1/runs/fmnist/passes", "{\"peer_public_key\":12}", 2, 400, "invalid_request"},
        {"POST", "/api/v1/runs/fmnist/passes", "{}", 2, 400, "invalid_request"},
        {"POST", "/api/v1/runs/fmnist/passes/abc/revoke", NULL, 1, 404, "not_found"},
        {"GET", "/api/v1/runs/fmnist/passes?state=weird", NULL, 1, 400, "invalid_request"},
        {"GET", "/api/v1/runs/no'pe", NULL, 0, 404, "not_found"},
        {"GET", "/api/v1/nothing", NULL, 0, 404, "not_found"},
        {"DELETE", "/api/v1/runs", NULL, 1, 405, "method_not_allowed"},
        {"PUT", "/api/v1/health", NULL, 0, 405, "method_not_allowed"},
        {"POST", "/api/v1/session", "{\"username\":\"org\"}", 0, 400, "invalid_request"},
        {"POST", "/api/v1/session", "{\"username\":\"org\",\"password\":\"x\",\"provider\":\"p\"}", 0, 400, "invalid_request"},
        {"POST", "/api/v1/session", "{\"provider\":\"nope\",\"token\":\"t\"}", 0, 400, "unknown_provider"},
        {"GET", "/api/v1/me", NULL, 4, 401, "unauthenticated"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *who = cases[i].who == 1 ? g_org : cases[i].who == 2 ? g_vol : cases[i].who == 3 ? g_aud
                          : cases[i].who == 4 ? "cts_forgedforgedforgedforgedforgedforgedforged" : NULL;
        struct ct_resp r;
        ct_http(&g_c, cases[i].method, cases[i].path, who, cases[i].body, &r);
        if (r.status != cases[i].status || !err_code(&r) || strcmp(err_code(&r), cases[i].code))
            fail_msg("case %zu %s %s %s: expected %ld %s, got %ld %s", i, cases[i].method,
                     cases[i].path, cases[i].body ? cases[i].body : "", cases[i].status,
                     cases[i].code, r.status, r.body ? r.body : "");
        assert_error(&r, cases[i].status, cases[i].code);
        ct_resp_free(&r);
    }
    /* A body over the limit is refused before it is read. */
    size_t big = 2u << 20;
    char *b = malloc(big + 1);
    memset(b, 'a', big);
    b[0] = '{';
    b[big] = '\0';
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, b, &r);
    assert_error(&r, 413, "body_too_large");
    ct_resp_free(&r);
    free(b);
    /* An expired session is refused. */
    assert_int_equal(ct_pg_exec(&g_pg, "INSERT INTO sessions (token_hash, user_id, expires_at) "
                                       "SELECT sha256('cts_expiredexpiredexpired'), id, now() - interval '1 second' "
                                       "FROM users WHERE username = 'org'"), 0);
    ct_http(&g_c, "GET", "/api/v1/me", "cts_expiredexpiredexpired", NULL, &r);
    assert_error(&r, 401, "unauthenticated");
    ct_resp_free(&r);

    snapshot(after);
    assert_memory_equal(before, after, sizeof before);

    /* SQL metacharacters in free-text fields are data, stored verbatim. */
    const char *evil = "{\"name\":\"evil\",\"target_batch_size\":7,\"description\":\"'; DROP TABLE runs; --\\\" \\\\ $1 %s\"}";
    assert_int_equal(req("POST", "/api/v1/runs", g_org, evil), 201);
    ct_http(&g_c, "GET", "/api/v1/runs/evil", NULL, NULL, &r);
    assert_string_equal(json_string_value(jget(&r, "description")), "'; DROP TABLE runs; --\" \\ $1 %s");
    ct_resp_free(&r);
    assert_int_equal(req("GET", "/api/v1/runs/fmnist", NULL, NULL), 200);
}

/* A run's training recipe is checked at creation and on PATCH by the
 * agents' own parser: a recipe no agent could load is refused with the
 * message a volunteer would see at join, and nothing is stored. */
#define MLP_RECIPE(sched, extra)                                                                   \
    "{\"model\":{\"type\":\"mlp\",\"inputs\":784,\"hidden\":[32],\"classes\":10},"              \
    "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.001},\"schedule\":" sched ","                    \
    "\"batch_size\":32,\"steps\":100,\"data\":{\"train\":\"fmnist/train.json\"}" extra "}"
static void test_recipe_checked(void **state)
{
    (void)state;
    static const struct {
        const char *config, *says;
    } bad[] = {
        /* the warm-up as long as the run: no step would decay */
        {MLP_RECIPE("{\"type\":\"linear\",\"warmup_steps\":100}", ""), "total_steps > warmup_steps"},
        {MLP_RECIPE("{\"type\":\"linear\",\"warmup_steps\":10}", ",\"optimiser\":{}"), "optimiser"},
        {"{\"model\":{\"type\":\"gpt\",\"vocab\":256,\"context\":64,\"layers\":2,\"heads\":3,"
         "\"d_model\":64},\"batch_size\":8,\"steps\":10,\"data\":{\"train\":\"t.json\"}}",
         "n_head must divide d_model"},
        {"{\"model\":{\"type\":\"mlp\",\"inputs\":784,\"hidden\":[32],\"classes\":10},\"batch_size\":8,"
         "\"steps\":10}", "data"},
        /* the declared size schedules are computed from must be the model's */
        {MLP_RECIPE("{\"type\":\"constant\"}", ",\"collaboration\":{\"model_parameters\":1000}"),
         "model's parameter count, 25450"},
        {MLP_RECIPE("{\"type\":\"constant\"}", ",\"collaboration\":{\"model_parameters\":\"25450\"}"),
         "model's parameter count, 25450"},
    };
    long before[4], after[4];
    snapshot(before);
    struct ct_resp r0;
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist", g_org, NULL, &r0);
    assert_int_equal(r0.status, 200);
    char *cfg0 = json_dumps(jget(&r0, "config"), JSON_COMPACT | JSON_SORT_KEYS);
    ct_resp_free(&r0);
    char body[2048];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct ct_resp r;
        snprintf(body, sizeof body, "{\"name\":\"recipe%zu\",\"target_batch_size\":64,\"config\":%s}", i,
                 bad[i].config);
        ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
        const char *msg = json_string_value(json_object_get(jget(&r, "error"), "message"));
        if (r.status != 400 || !msg ||
            (!strstr(msg, "training recipe") && !strstr(msg, "model_parameters")) ||
            !strstr(msg, bad[i].says))
            fail_msg("case %zu: expected 400 naming '%s', got %ld %s", i, bad[i].says, r.status,
                     r.body ? r.body : "");
        ct_resp_free(&r);
        /* the same recipe on an existing run changes nothing either */
        snprintf(body, sizeof body, "{\"config\":%s}", bad[i].config);
        ct_http(&g_c, "PATCH", "/api/v1/runs/fmnist", g_org, body, &r);
        if (r.status != 400 || !strstr(r.body, bad[i].says))
            fail_msg("PATCH case %zu: expected 400 naming '%s', got %ld %s", i, bad[i].says, r.status,
                     r.body ? r.body : "");
        ct_resp_free(&r);
    }
    snapshot(after);
    assert_memory_equal(before, after, sizeof before);
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist", g_org, NULL, &r0);
    char *cfg1 = json_dumps(jget(&r0, "config"), JSON_COMPACT | JSON_SORT_KEYS);
    ct_resp_free(&r0);
    assert_non_null(cfg0);
    assert_non_null(cfg1);
    assert_string_equal(cfg0, cfg1);
    free(cfg0);
    free(cfg1);
    /* what agents load is accepted: the coordinator's own keys beside the recipe, the
       right count, and a run whose recipe comes later */
    snprintf(body, sizeof body, "{\"name\":\"recipe-ok\",\"target_batch_size\":64,\"config\":%s}",
             MLP_RECIPE("{\"type\":\"cosine\",\"warmup_steps\":10}",
                        ",\"collaboration\":{\"model_parameters\":25450,\"compression\":\"fp16\"}"));
    assert_int_equal(req("POST", "/api/v1/runs", g_org, body), 201);
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"recipe-later\",\"target_batch_size\":64,\"config\":"
                         "{\"collaboration\":{\"model_parameters\":1000}}}"),
                     201);
}
#undef MLP_RECIPE

static void test_login_throttled(void **state)
{
    (void)state;
    /* default: 10 failures per username in the window */
    for (int i = 0; i < 10; i++) {
        struct ct_resp r;
        ct_http(&g_c, "POST", "/api/v1/session", NULL, "{\"username\":\"aud\",\"password\":\"wrong-guess\"}", &r);
        assert_error(&r, 401, "bad_credentials");
        ct_resp_free(&r);
    }
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/session", NULL, "{\"username\":\"aud\",\"password\":\"" VOL_PW "\"}", &r);
    assert_error(&r, 429, "throttled");
    ct_resp_free(&r);
    /* other users are not affected */
    char *t = ct_login(&g_c, "vol", VOL_PW);
    assert_non_null(t);
    free(t);
    /* after the window the right password works again */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE login_failures SET at = at - interval '1 hour'"), 0);
    t = ct_login(&g_c, "aud", VOL_PW);
    assert_non_null(t);
    free(t);
}

static void test_logout(void **state)
{
    (void)state;
    char *t = ct_login(&g_c, "vol", VOL_PW);
    assert_non_null(t);
    assert_int_equal(req("GET", "/api/v1/me", t, NULL), 200);
    assert_int_equal(req("DELETE", "/api/v1/session", t, NULL), 204);
    assert_int_equal(req("GET", "/api/v1/me", t, NULL), 401);
    free(t);
}

static void test_kill9_restart_loses_nothing(void **state)
{
    (void)state;
    struct cm_ed25519 peer;
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    long st;
    assert_int_equal(req("POST", "/api/v1/runs", g_org, "{\"name\":\"durable\",\"target_batch_size\":64}"), 201);
    char *t = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_non_null(t);
    uint8_t keys_before[8][32];
    size_t nb = published_keys(&g_c, keys_before, 8);

    assert_int_equal(ct_coord_stop(&g_c, SIGKILL), 128 + SIGKILL);
    assert_int_equal(ct_coord_start(&g_c, g_pg.url, g_c.dir, NULL), 0);

    /* the run, the sessions, the key and the revocation state all survived */
    assert_int_equal(req("GET", "/api/v1/runs/durable", NULL, NULL), 200);
    assert_int_equal(req("GET", "/api/v1/me", g_vol, NULL), 200);
    uint8_t keys_after[8][32];
    size_t na = published_keys(&g_c, keys_after, 8);
    assert_int_equal(na, nb);
    assert_memory_equal(keys_before, keys_after, na * 32);
    struct cm_pass_claims c;
    assert_int_equal(cm_token_verify(t, strlen(t), (const uint8_t(*)[32])keys_after, na, time(NULL), 60, &c), CM_OK);
    free(t);
    t = get_pass_as(&g_c, g_vol, "vol", &peer, &st);
    assert_int_equal(st, 201);
    free(t);
    cm_ed25519_cleanup(&peer);
}

static void test_two_coordinators_one_database(void **state)
{
    (void)state;
    struct ct_coord b = {0};
    assert_int_equal(ct_coord_start(&b, g_pg.url, NULL, NULL), 0);
    /* a write through A is read through B and vice versa */
    assert_int_equal(req("POST", "/api/v1/runs", g_org, "{\"name\":\"shared\",\"target_batch_size\":8}"), 201);
    struct ct_resp r;
    ct_http(&b, "GET", "/api/v1/runs/shared", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
    ct_http(&b, "PUT", "/api/v1/runs/shared/allowlist/vol", g_org, NULL, &r);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/shared/allowlist", g_org, NULL, &r);
    assert_int_equal(json_array_size(jget(&r, "allowlist")), 1);
    ct_resp_free(&r);
    /* both keys are published by both; B's pass verifies with A's list */
    uint8_t ka[8][32], kb[8][32];
    size_t na = published_keys(&g_c, ka, 8), nb = published_keys(&b, kb, 8);
    assert_int_equal(na, 2);
    assert_int_equal(nb, 2);
    assert_memory_equal(ka, kb, 64);
    struct cm_ed25519 peer;
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    assert_int_equal(ct_pass_request(&b, g_vol, "shared", "vol", &peer, &r), 201);
    const char *t = json_string_value(jget(&r, "access_token"));
    struct cm_pass_claims c;
    assert_int_equal(cm_token_verify(t, strlen(t), (const uint8_t(*)[32])ka, na, time(NULL), 60, &c), CM_OK);
    assert_int_equal(json_array_size(jget(&r, "coordinator_keys")), 2);
    ct_resp_free(&r);
    /* a revocation made on A is listed by B */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/shared/passes/%s/revoke", c.pass_id);
    assert_int_equal(req("POST", path, g_org, NULL), 200);
    ct_http(&b, "GET", "/api/v1/runs/shared/revocations", NULL, NULL, &r);
    assert_int_equal(json_array_size(jget(&r, "revoked")), 1);
    ct_resp_free(&r);
    cm_ed25519_cleanup(&peer);
    assert_int_equal(ct_coord_cleanup(&b), 0);
}

static void test_health_metrics_openapi(void **state)
{
    (void)state;
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(jget(&r, "database")), "ok");
    ct_resp_free(&r);
    /* the coordinator's clock (agents correct theirs by it): the same
       machine's, in ms */
    struct timespec t0, t1;
    clock_gettime(CLOCK_REALTIME, &t0);
    ct_http(&g_c, "GET", "/api/v1/time", NULL, NULL, &r);
    clock_gettime(CLOCK_REALTIME, &t1);
    assert_int_equal(r.status, 200);
    assert_true(json_is_integer(jget(&r, "time_ms")));
    long long ms = (long long)json_integer_value(jget(&r, "time_ms"));
    assert_true(ms >= (long long)t0.tv_sec * 1000 + t0.tv_nsec / 1000000 &&
                ms <= (long long)t1.tv_sec * 1000 + t1.tv_nsec / 1000000);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/metrics", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "crowdtrain_http_requests_total{method=\"GET\",route=\"/api/v1/health\",status=\"200\"}"));
    assert_non_null(strstr(r.body, "crowdtrain_http_request_duration_seconds_bucket"));
    assert_non_null(strstr(r.body, "crowdtrain_db_pool_connections 8"));
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/openapi.json", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(jget(&r, "openapi")), "3.0.3");
    assert_non_null(json_object_get(jget(&r, "paths"), "/api/v1/runs/{run}/passes"));
    ct_resp_free(&r);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pass_issued_only_to_allowlisted),
        cmocka_unit_test(test_revocation_listed),
        cmocka_unit_test(test_pass_needs_proof_of_possession),
        cmocka_unit_test(test_pass_refuses_weak_keys),
        cmocka_unit_test(test_key_has_one_owner_and_revocation_blocks_it),
        cmocka_unit_test(test_bad_input_changes_nothing),
        cmocka_unit_test(test_recipe_checked),
        cmocka_unit_test(test_login_throttled),
        cmocka_unit_test(test_logout),
        cmocka_unit_test(test_health_metrics_openapi),
        cmocka_unit_test(test_kill9_restart_loses_nothing),
        cmocka_unit_test(test_two_coordinators_one_database),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
