/* Access passes (seed 000_02cc6b5d62a616fc.txt, Appendix H.4). An
 * authenticated, allowlisted user's agent sends its Ed25519 public key and
 * receives a token binding {username, peer key, run, issued, expiry} under
 * this coordinator's signing key, plus the keys that verify it and the
 * bootstrap peers. Asking again before expiry renews (a new pass). Every pass
 * is a row in `passes`; organizers revoke, and the revocation list is
 * public. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/backbone.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_passreq.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How far a signed pass request's time may be from ours, either way
 * (docs/protocol.md, "Pass requests"). A (key, nonce) pair is accepted once
 * for good, so the window only bounds how long a captured request is worth
 * anything and how much clock skew agents may have. */
#define PASS_REQUEST_WINDOW_S 300

/* Accounts that proved in this process that they hold a key: (user, key)
 * pairs whose signed request verified and minted a pass. A later request of
 * the same account for the same key proves nothing new - the key is already
 * the account's (peer_keys), and a pass is worth nothing without the private
 * key - so its signature is not checked again, which halves the CPU a pass
 * renewal costs (an Ed25519 verification is ~100 us here). A request from a
 * remembered pair may not claim a key: if the key has no holder any more
 * (an organizer released it), the signature is checked before it is
 * claimed again. Direct-mapped; a collision only costs a verification. */
#define POP_CACHE_SLOTS 4096
static struct {
    int64_t user_id;
    uint8_t key[CM_ED25519_PUB_LEN];
} g_pop[POP_CACHE_SLOTS];
static pthread_mutex_t g_pop_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t pop_slot(int64_t user_id, const uint8_t *key)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)user_id;
    for (int i = 0; i < CM_ED25519_PUB_LEN; i++)
        h = (h ^ key[i]) * 1099511628211ull;
    return (size_t)(h % POP_CACHE_SLOTS);
}

static int pop_proven(int64_t user_id, const uint8_t *key)
{
    size_t i = pop_slot(user_id, key);
    pthread_mutex_lock(&g_pop_mu);
    int hit = g_pop[i].user_id == user_id && user_id != 0 &&
              !memcmp(g_pop[i].key, key, CM_ED25519_PUB_LEN);
    pthread_mutex_unlock(&g_pop_mu);
    return hit;
}

static void pop_remember(int64_t user_id, const uint8_t *key)
{
    size_t i = pop_slot(user_id, key);
    pthread_mutex_lock(&g_pop_mu);
    g_pop[i].user_id = user_id;
    memcpy(g_pop[i].key, key, CM_ED25519_PUB_LEN);
    pthread_mutex_unlock(&g_pop_mu);
}

/* The published keys change only when a coordinator with a new key starts;
 * a short cache keeps the pass path at one statement. */
#define KEYS_CACHE_S 30
static pthread_mutex_t g_keys_mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *g_keys;
static time_t g_keys_at;

COORD_DB_STMT(S_KEY_LIST, 0, "SELECT encode(public_key, 'hex') FROM signing_keys ORDER BY created_at");

static json_t *coordinator_keys(struct coord_req *req)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&g_keys_mu);
    if (!g_keys || now - g_keys_at >= KEYS_CACHE_S) {
        PGresult *r = coord_db_exec(req->db, &S_KEY_LIST, NULL, NULL);
        if (r) {
            json_t *a = json_array();
            for (int i = 0; i < PQntuples(r); i++) {
                uint8_t raw[CM_ED25519_PUB_LEN];
                size_t n = 0;
                const char *hex = PQgetvalue(r, i, 0);
                char b64[64];
                if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) == CM_OK && n == sizeof raw) {
                    cm_b64url_encode(raw, sizeof raw, b64);
                    json_array_append_new(a, json_string(b64));
                }
            }
            PQclear(r);
            json_decref(g_keys);
            g_keys = a;
            g_keys_at = now;
        }
    }
    json_t *out = g_keys ? json_deep_copy(g_keys) : json_array();
    pthread_mutex_unlock(&g_keys_mu);
    return out;
}

/* Configured bootstrap peers first, then the backbone nodes of the run. */
static json_t *bootstrap_list(struct coord_req *req)
{
    const struct coord_config *cfg = req->srv->cfg;
    json_t *a = coord_backbone_bootstrap(req);
    if (!cfg->bootstrap)
        return a;
    char *copy = strdup(cfg->bootstrap), *save = NULL;
    size_t at = 0;
    for (char *t = copy ? strtok_r(copy, ", ", &save) : NULL; t; t = strtok_r(NULL, ", ", &save))
        json_array_insert_new(a, at++, json_string(t));
    free(copy);
    return a;
}

/* One statement mints a pass, so the common case costs one round trip:
 * `ok` is the run if the caller may act in it; `ins` claims the key for the
 * caller when nobody holds it; `cur` reads its holder otherwise, FOR SHARE so
 * a concurrent key revocation (which updates the row) either waits for this
 * pass to commit and then revokes it, or commits first and this statement
 * sees it revoked; the pass is written only for the key's holder, and at
 * most once per (key, nonce) of a signed request. $9: the request's
 * signature was checked, so it may claim an unheld key. */
COORD_DB_STMT(S_PASS_NEW, 9,
              "WITH ok AS (SELECT r.id FROM runs r JOIN run_allowlist a ON a.run_id = r.id "
              "AND a.username = $7 "
              /* a disabled account gets no pass, even through a session cached elsewhere */
              "JOIN users u ON u.id = $2 AND NOT u.disabled "
              "WHERE r.name = $1 AND r.status = 'open'), "
              "ins AS (INSERT INTO peer_keys (peer_public_key, user_id) SELECT $3, $2 FROM ok WHERE $9 "
              "ON CONFLICT (peer_public_key) DO NOTHING RETURNING user_id, false AS revoked), "
              "cur AS (SELECT user_id, revoked_at IS NOT NULL AS revoked FROM peer_keys "
              "WHERE peer_public_key = $3 FOR SHARE), "
              "k AS (SELECT * FROM ins UNION ALL SELECT * FROM cur), "
              "p AS (INSERT INTO passes (run_id, user_id, peer_public_key, kid, issued_at, expires_at, "
              "request_nonce) SELECT ok.id, $2, $3, $4, to_timestamp($5), to_timestamp($6), $8 "
              "FROM ok, (SELECT * FROM k LIMIT 1) k1 WHERE k1.user_id = $2 AND NOT k1.revoked "
              "ON CONFLICT (peer_public_key, request_nonce) DO NOTHING RETURNING id) "
              "SELECT (SELECT id FROM p), EXISTS (SELECT 1 FROM ok), "
              "(SELECT user_id FROM k LIMIT 1), (SELECT revoked FROM k LIMIT 1)");
/* The common case, a key its caller already holds: one plain INSERT ...
 * SELECT, the same conditions as S_PASS_NEW (allowlisted, enabled, open run,
 * the caller's unrevoked key FOR SHARE, one pass per (key, nonce)) without
 * its claim and diagnosis. No row: S_PASS_NEW claims the key or says why. */
COORD_DB_STMT(S_PASS_MINT, 8,
              "INSERT INTO passes (run_id, user_id, peer_public_key, kid, issued_at, expires_at, "
              "request_nonce) SELECT r.id, $2, k.peer_public_key, $4, to_timestamp($5), "
              "to_timestamp($6), $8 FROM runs r "
              "JOIN run_allowlist a ON a.run_id = r.id AND a.username = $7 "
              "JOIN users u ON u.id = $2 AND NOT u.disabled "
              "JOIN peer_keys k ON k.peer_public_key = $3 AND k.user_id = $2 AND k.revoked_at IS NULL "
              "WHERE r.name = $1 AND r.status = 'open' FOR SHARE OF k "
              "ON CONFLICT (peer_public_key, request_nonce) DO NOTHING RETURNING id");
COORD_DB_STMT(S_PASS_WHY, 2,
              "SELECT r.status, EXISTS (SELECT 1 FROM run_allowlist a WHERE a.run_id = r.id "
              "AND a.username = $2), "
              "EXISTS (SELECT 1 FROM users u WHERE u.username = $2 AND u.disabled) "
              "FROM runs r WHERE r.name = $1");

/* Why the caller may not act for run params[0] (after a query that
 * required an allowlisted caller, an open run and, with need_pass, a pass):
 * sets 404 (no run), 403 (not allowlisted; no pass), 409 (not open). */
static void refusal(struct coord_req *req, struct coord_resp *resp, int need_pass)
{
    const char *wp[] = {req->params[0], req->user.username};
    PGresult *r = coord_db_exec(req->db, &S_PASS_WHY, wp, NULL);
    if (!r)
        coord_resp_error(resp, 500, "internal", "database error");
    else if (PQntuples(r) != 1)
        coord_resp_error(resp, 404, "not_found", "no such run");
    else if (strcmp(PQgetvalue(r, 0, 2), "t") == 0) /* disabled after this session was cached */
        coord_resp_error(resp, 403, "account_disabled", "the account '%s' is disabled",
                         req->user.username);
    else if (strcmp(PQgetvalue(r, 0, 1), "t") != 0)
        coord_resp_error(resp, 403, "not_allowlisted", "'%s' is not on the allowlist of run '%s'; ask its organizers",
                         req->user.username, req->params[0]);
    else if (strcmp(PQgetvalue(r, 0, 0), "open") != 0 || !need_pass)
        coord_resp_error(resp, 409, "run_not_open", "run '%s' is %s, not open", req->params[0],
                         PQgetvalue(r, 0, 0));
    else
        coord_resp_error(resp, 403, "no_pass",
                         "'%s' holds no valid (unrevoked, unexpired) pass for this peer key in run '%s'; get one "
                         "with POST /api/v1/runs/%s/passes",
                         req->user.username, req->params[0], req->params[0]);
    if (r)
        PQclear(r);
}

/* Why a signed, well-formed pass request minted nothing, from S_PASS_NEW's
 * last three columns (run usable, key holder, key revoked). */
static void mint_refusal(struct coord_req *req, struct coord_resp *resp, PGresult *r)
{
    int run_ok = !strcmp(PQgetvalue(r, 0, 1), "t");
    int has_holder = !PQgetisnull(r, 0, 2);
    long long holder = has_holder ? strtoll(PQgetvalue(r, 0, 2), NULL, 10) : 0;
    int revoked = !PQgetisnull(r, 0, 3) && !strcmp(PQgetvalue(r, 0, 3), "t");
    if (!run_ok)
        refusal(req, resp, 0);
    else if (revoked)
        coord_resp_error(resp, 403, "key_revoked",
                         "this peer key is revoked: no pass is issued for it until an organizer "
                         "releases it");
    else if (has_holder && holder != (long long)req->user.id)
        coord_resp_error(resp, 409, "key_owned",
                         "this peer key belongs to another user; a key has one owner (an organizer "
                         "can release it)");
    else if (!has_holder)
        coord_resp_error(resp, 409, "conflict", "the key was claimed at the same moment; try again");
    else
        coord_resp_error(resp, 409, "replayed_request",
                         "this signed request was used before; sign a new one (fresh nonce)");
}

/* 1: the request's signature is the peer key's; 0: resp holds the refusal. */
static int pass_request_verified(struct coord_req *req, struct coord_resp *resp,
                                 const struct cm_passreq *pr)
{
    if (cm_passreq_verify(req->params[0], req->user.username, pr) == CM_OK)
        return 1;
    coord_resp_error(resp, 403, "bad_signature",
                     "field 'signature': not a signature by this peer key over the request for run "
                     "'%s' and user '%s' (docs/protocol.md, \"Pass requests\")",
                     req->params[0], req->user.username);
    return 0;
}

void api_passes_create(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run"))
        return;
    struct cm_passreq pr;
    char err[256] = "";
    if (cm_passreq_from_json(req->json, &pr, err, sizeof err) != CM_OK) {
        coord_resp_error(resp, 400, "invalid_request", "%s", err);
        return;
    }
    if (cm_ed25519_pub_check(pr.peer_public_key) != CM_OK) {
        coord_resp_error(resp, 400, "weak_key",
                         "field 'peer_public_key': a point of small order (e.g. all zeros) or a "
                         "non-canonical encoding is not a usable Ed25519 key; generate a key pair");
        return;
    }
    int64_t iat = (int64_t)time(NULL);
    if (pr.timestamp < iat - PASS_REQUEST_WINDOW_S || pr.timestamp > iat + PASS_REQUEST_WINDOW_S) {
        coord_resp_error(resp, 400, "stale_request",
                         "field 'timestamp': %lld is more than %d s from the coordinator's clock "
                         "(%lld); check the clock and sign a new request",
                         (long long)pr.timestamp, PASS_REQUEST_WINDOW_S, (long long)iat);
        return;
    }
    int verified = 0;
    if (!pop_proven(req->user.id, pr.peer_public_key)) {
        if (!pass_request_verified(req, resp, &pr))
            return;
        verified = 1;
    }
    if (!coord_req_db(req, resp))
        return;
    const struct coord_config *cfg = req->srv->cfg;
    const uint8_t *pk = pr.peer_public_key;
    int64_t exp = iat + cfg->pass_ttl;
    char uid[24], iats[24], exps[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    snprintf(iats, sizeof iats, "%lld", (long long)iat);
    snprintf(exps, sizeof exps, "%lld", (long long)exp);
    const char *p[] = {req->params[0], uid, (const char *)pk, req->srv->kid, iats, exps,
                       req->user.username, (const char *)pr.nonce, verified ? "t" : "f"};
    const int lens[] = {0, 0, CM_ED25519_PUB_LEN, 0, 0, 0, 0, CM_PASSREQ_NONCE_LEN, 0};
    const int fmts[] = {0, 0, 1, 0, 0, 0, 0, 1, 0};
    PGresult *r = coord_db_exec_bin(req->db, &S_PASS_MINT, p, lens, fmts, NULL);
    if (!r || PQntuples(r) != 1) { /* one row = the pass id, as S_PASS_NEW's first column */
        if (r)
            PQclear(r);
        r = coord_db_exec_bin(req->db, &S_PASS_NEW, p, lens, fmts, NULL);
    }
    /* The run is usable but the key has no row we could see: nobody holds
     * it (and we did not check the signature, so we could not claim it), or
     * another request claimed it while ours ran (our snapshot predates its
     * commit). Once more, with the signature checked and a snapshot that
     * sees the claim. */
    for (int again = 0; again < 2 && r && PQntuples(r) == 1 && PQgetisnull(r, 0, 0) &&
                        !strcmp(PQgetvalue(r, 0, 1), "t") && PQgetisnull(r, 0, 2) &&
                        PQgetisnull(r, 0, 3);
         again++) {
        PQclear(r);
        if (!verified) {
            if (!pass_request_verified(req, resp, &pr))
                return;
            verified = 1;
            p[8] = "t";
        }
        r = coord_db_exec_bin(req->db, &S_PASS_NEW, p, lens, fmts, NULL);
    }
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0)) {
        if (PQntuples(r) == 1)
            mint_refusal(req, resp, r);
        else
            coord_resp_error(resp, 500, "internal", "database error");
        PQclear(r);
        return;
    }
    struct cm_pass_claims c = {0};
    snprintf(c.pass_id, sizeof c.pass_id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (verified)
        pop_remember(req->user.id, pk);
    snprintf(c.username, sizeof c.username, "%s", req->user.username);
    snprintf(c.run, sizeof c.run, "%s", req->params[0]);
    memcpy(c.peer_public_key, pk, CM_ED25519_PUB_LEN);
    c.issued_at = iat;
    c.expires_at = exp;
    char *tok = NULL;
    if (cm_token_sign(&req->srv->signing_key, &c, &tok) != CM_OK) {
        /* The row exists but no token left the coordinator: harmless. */
        coord_resp_error(resp, 500, "internal", "could not sign the pass");
        return;
    }
    char pub[64];
    cm_b64url_encode(req->srv->signing_key.pub, CM_ED25519_PUB_LEN, pub);
    coord_metrics_event(req->srv->metrics, COORD_EV_PASS_ISSUED);
    coord_resp_json(resp, 201,
                    json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:s, s:s, s:I, s:I}", "pass_id",
                              c.pass_id, "access_token", tok, "coordinator_public_key", pub,
                              "kid", req->srv->kid, "coordinator_keys", coordinator_keys(req),
                              "bootstrap", bootstrap_list(req), "username", c.username, "run",
                              c.run, "issued_at", (json_int_t)iat, "expires_at", (json_int_t)exp));
    free(tok);
}

COORD_DB_STMT(S_PASSES, 2,
              "SELECT p.id, u.username, encode(p.peer_public_key, 'hex'), "
              "extract(epoch from p.issued_at)::bigint, extract(epoch from p.expires_at)::bigint, "
              "coalesce(extract(epoch from p.revoked_at)::bigint, 0), coalesce(p.revoke_reason, ''), p.kid "
              "FROM passes p JOIN runs r ON r.id = p.run_id JOIN users u ON u.id = p.user_id "
              "WHERE r.name = $1 AND ($2 = 'all' OR (p.revoked_at IS NULL AND p.expires_at > now())) "
              "ORDER BY p.id DESC LIMIT 10000");
COORD_DB_STMT(S_RUN_EXISTS, 1, "SELECT 1 FROM runs WHERE name = $1");

PGresult *api_run_row(struct coord_req *req, struct coord_resp *resp, struct coord_db_stmt *stmt)
{
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, stmt, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return NULL;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no such run");
        return NULL;
    }
    return r;
}

int api_run_known(struct coord_req *req, struct coord_resp *resp)
{
    PGresult *r = api_run_row(req, resp, &S_RUN_EXISTS);
    PQclear(r);
    return r != NULL;
}

COORD_DB_STMT(S_PEER_PASS, 4,
              "SELECT p.id, r.id FROM passes p JOIN runs r ON r.id = p.run_id "
              "JOIN run_allowlist a ON a.run_id = r.id AND a.username = $4 "
              "WHERE r.name = $1 AND p.user_id = $2 AND p.peer_public_key = $3 "
              "AND p.revoked_at IS NULL AND p.expires_at > now() AND r.status = 'open' "
              "ORDER BY p.id DESC LIMIT 1");

int api_peer_pass(struct coord_req *req, struct coord_resp *resp, const uint8_t pk[CM_ED25519_PUB_LEN],
                  char pass_id[24], char run_id[24])
{
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {req->params[0], uid, (const char *)pk, req->user.username};
    const int lens[] = {0, 0, CM_ED25519_PUB_LEN, 0};
    const int fmts[] = {0, 0, 1, 0};
    PGresult *r = coord_db_exec_bin(req->db, &S_PEER_PASS, p, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        refusal(req, resp, 1);
        return 0;
    }
    snprintf(pass_id, 24, "%s", PQgetvalue(r, 0, 0));
    snprintf(run_id, 24, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    return 1;
}

void api_passes_list(struct coord_req *req, struct coord_resp *resp)
{
    const char *state = coord_req_query(req, "state");
    if (state && strcmp(state, "all") != 0 && strcmp(state, "active") != 0) {
        coord_resp_error(resp, 400, "invalid_request", "'state' is 'active' or 'all'");
        return;
    }
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp) || !api_run_known(req, resp))
        return;
    const char *p[] = {req->params[0], state ? state : "all"};
    PGresult *r = coord_db_exec(req->db, &S_PASSES, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        uint8_t raw[CM_ED25519_PUB_LEN];
        size_t n = 0;
        char b64[64] = "";
        const char *hex = PQgetvalue(r, i, 2);
        if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) == CM_OK && n == sizeof raw)
            cm_b64url_encode(raw, sizeof raw, b64);
        long long revoked = strtoll(PQgetvalue(r, i, 5), NULL, 10);
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s}", "pass_id", PQgetvalue(r, i, 0),
                              "username", PQgetvalue(r, i, 1), "peer_public_key", b64, "issued_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "expires_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "kid",
                              PQgetvalue(r, i, 7));
        if (revoked) {
            json_object_set_new(o, "revoked_at", json_integer(revoked));
            json_object_set_new(o, "revoke_reason", json_string(PQgetvalue(r, i, 6)));
        }
        json_array_append_new(a, o);
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "run", req->params[0], "passes", a));
}

COORD_DB_STMT(S_REVOKE, 4,
              "UPDATE passes p SET revoked_at = coalesce(p.revoked_at, now()), "
              "revoked_by = coalesce(p.revoked_by, $3), "
              "revoke_reason = coalesce(p.revoke_reason, $4) FROM runs r "
              "WHERE p.id = $1 AND r.id = p.run_id AND r.name = $2 "
              "RETURNING extract(epoch from p.revoked_at)::bigint, "
              "(SELECT revoked_at IS NULL FROM passes WHERE id = $1), encode(p.peer_public_key, 'hex'), "
              "p.user_id, r.id");
/* scope "user": the pass's user leaves the run's allowlist (so mints
 * nothing more there) and their other live passes of the run are revoked. */
COORD_DB_STMT(S_REVOKE_USER_RUN, 4,
              "WITH gone AS (DELETE FROM run_allowlist a USING users u WHERE a.run_id = $1 "
              "AND a.username = u.username AND u.id = $2 RETURNING 1), "
              "rv AS (UPDATE passes SET revoked_at = now(), revoked_by = $3, revoke_reason = $4 "
              "WHERE run_id = $1 AND user_id = $2 AND revoked_at IS NULL AND expires_at > now() "
              "RETURNING 1) SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM rv)");

/* What a revocation reaches: this pass only; its peer key (every live pass
 * for it in every run, and no new pass until an organizer releases it: the
 * default, so a revoked device cannot come straight back); or its user in
 * this run (their live passes, and their place on the allowlist). */
enum revoke_scope { SCOPE_PASS, SCOPE_KEY, SCOPE_USER };

void api_passes_revoke(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {{"reason", CM_J_STRING, 0, 0, 512},
                                             {"scope", CM_J_STRING, 0, 1, 8}};
    if (!api_name_param(req, resp, 0, "run") || !coord_req_check(req, resp, F, 2))
        return;
    const char *sc = json_string_value(json_object_get(req->json, "scope"));
    enum revoke_scope scope = !sc || !strcmp(sc, "key") ? SCOPE_KEY
                              : !strcmp(sc, "pass")     ? SCOPE_PASS
                              : !strcmp(sc, "user")     ? SCOPE_USER
                                                        : (enum revoke_scope)-1;
    if ((int)scope < 0) {
        coord_resp_error(resp, 400, "invalid_request", "field 'scope': 'key' (default), 'pass' or 'user'");
        return;
    }
    char *end = NULL;
    long long id = req->nparams > 1 ? strtoll(req->params[1], &end, 10) : 0;
    if (id <= 0 || *end) {
        coord_resp_error(resp, 404, "not_found", "no such pass");
        return;
    }
    const char *reason = json_string_value(json_object_get(req->json, "reason"));
    if (!reason)
        reason = "revoked by an organizer";
    char ids[24], uid[24];
    snprintf(ids, sizeof ids, "%lld", id);
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    const char *p[] = {ids, req->params[0], uid, reason};
    PGresult *r = coord_db_exec(req->db, &S_REVOKE, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no pass %lld in run '%s'", id, req->params[0]);
        return;
    }
    /* The sub-select sees the row before this statement: true = newly revoked. */
    int newly = !strcmp(PQgetvalue(r, 0, 1), "t");
    long long at = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    uint8_t pk[CM_ED25519_PUB_LEN];
    size_t pkn = 0;
    const char *pkhex = PQgetvalue(r, 0, 2);
    int pk_ok = cm_hex_decode(pkhex, strlen(pkhex), pk, sizeof pk, &pkn) == CM_OK && pkn == sizeof pk;
    char holder[24], run_id[24];
    snprintf(holder, sizeof holder, "%s", PQgetvalue(r, 0, 3));
    snprintf(run_id, sizeof run_id, "%s", PQgetvalue(r, 0, 4));
    PQclear(r);
    /* changed: the key was newly blocked, or the user newly left the allowlist */
    int changed = 0, others = 0, rc = CM_OK;
    if (scope == SCOPE_KEY) {
        rc = pk_ok ? api_peer_key_block(req, pk, reason, &changed, &others) : CM_EDB;
    } else if (scope == SCOPE_USER) {
        const char *pu[] = {run_id, holder, uid, reason};
        PGresult *ru = coord_db_exec(req->db, &S_REVOKE_USER_RUN, pu, NULL);
        if (ru && PQntuples(ru) == 1) {
            changed = strcmp(PQgetvalue(ru, 0, 0), "0") != 0;
            others = atoi(PQgetvalue(ru, 0, 1));
            for (int i = 0; i < others; i++)
                coord_metrics_event(req->srv->metrics, COORD_EV_PASS_REVOKED);
        } else {
            rc = CM_EDB;
        }
        PQclear(ru);
    }
    if (rc != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    char target[96];
    snprintf(target, sizeof target, "%s/pass/%lld", req->params[0], id);
    if (newly || changed || others) {
        json_t *d = json_pack("{s:s, s:s, s:i}", "reason", reason, "scope",
                              scope == SCOPE_KEY ? "key" : scope == SCOPE_USER ? "user" : "pass",
                              "passes_revoked", others);
        int ok = coord_audit(req, "pass.revoke", target, d) == CM_OK &&
                 coord_db_cmd(req->db, "COMMIT") == CM_OK;
        json_decref(d);
        if (!ok) {
            coord_resp_error(resp, 500, "internal", "could not record the revocation");
            return;
        }
        if (newly)
            coord_metrics_event(req->srv->metrics, COORD_EV_PASS_REVOKED);
        CM_LOGI("passes", "%s revoked pass %lld of run %s (scope %s, %d more passes)", req->user.username,
                id, req->params[0], sc ? sc : "key", others);
    }
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:I, s:b, s:s, s:i}", "pass_id", ids, "revoked_at", (json_int_t)at,
                              "already_revoked", !newly, "scope",
                              scope == SCOPE_KEY ? "key" : scope == SCOPE_USER ? "user" : "pass",
                              "passes_revoked", others));
}

COORD_DB_STMT(S_REVOCATIONS, 1,
              "SELECT p.id, extract(epoch from p.revoked_at)::bigint, "
              "extract(epoch from p.expires_at)::bigint FROM passes p JOIN runs r ON r.id = p.run_id "
              "WHERE r.name = $1 AND p.revoked_at IS NOT NULL AND p.expires_at > now() ORDER BY p.id");

void api_revocations(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp) || !api_run_known(req, resp))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_REVOCATIONS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(a, json_pack("{s:s, s:I, s:I}", "pass_id", PQgetvalue(r, i, 0),
                                           "revoked_at",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10),
                                           "expires_at",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10)));
    PQclear(r);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:I, s:o}", "run", req->params[0], "generated_at",
                              (json_int_t)time(NULL), "revoked", a));
}
