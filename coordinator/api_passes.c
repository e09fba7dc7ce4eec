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

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

COORD_DB_STMT(S_PASS_NEW, 7,
              "INSERT INTO passes (run_id, user_id, peer_public_key, kid, issued_at, expires_at) "
              "SELECT r.id, $2, $3, $4, to_timestamp($5), to_timestamp($6) FROM runs r "
              "JOIN run_allowlist a ON a.run_id = r.id AND a.username = $7 "
              /* a disabled account gets no pass, even through a session cached elsewhere */
              "JOIN users u ON u.id = $2 AND NOT u.disabled "
              "WHERE r.name = $1 AND r.status = 'open' RETURNING id");
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

void api_passes_create(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"peer_public_key", CM_J_STRING, 1, 1, 128},
    };
    if (!api_name_param(req, resp, 0, "run") || !coord_req_check(req, resp, F, 1))
        return;
    const char *pk_s = json_string_value(json_object_get(req->json, "peer_public_key"));
    uint8_t pk[CM_ED25519_PUB_LEN];
    size_t n = 0;
    if (cm_b64url_decode(pk_s, strlen(pk_s), pk, sizeof pk, &n) != CM_OK || n != sizeof pk) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'peer_public_key': base64url (no padding) of a 32-byte Ed25519 "
                         "public key");
        return;
    }
    if (!coord_req_db(req, resp))
        return;
    const struct coord_config *cfg = req->srv->cfg;
    int64_t iat = (int64_t)time(NULL), exp = iat + cfg->pass_ttl;
    char uid[24], iats[24], exps[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    snprintf(iats, sizeof iats, "%lld", (long long)iat);
    snprintf(exps, sizeof exps, "%lld", (long long)exp);
    const char *p[] = {req->params[0], uid, (const char *)pk, req->srv->kid, iats, exps,
                       req->user.username};
    const int lens[] = {0, 0, CM_ED25519_PUB_LEN, 0, 0, 0, 0};
    const int fmts[] = {0, 0, 1, 0, 0, 0, 0};
    PGresult *r = coord_db_exec_bin(req->db, &S_PASS_NEW, p, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        refusal(req, resp, 0);
        return;
    }
    struct cm_pass_claims c = {0};
    snprintf(c.pass_id, sizeof c.pass_id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    snprintf(c.username, sizeof c.username, "%s", req->user.username);
    snprintf(c.run, sizeof c.run, "%s", req->params[0]);
    memcpy(c.peer_public_key, pk, sizeof pk);
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

int api_run_known(struct coord_req *req, struct coord_resp *resp)
{
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_RUN_EXISTS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    int ok = PQntuples(r) == 1;
    PQclear(r);
    if (!ok)
        coord_resp_error(resp, 404, "not_found", "no such run");
    return ok;
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
              "(SELECT revoked_at IS NULL FROM passes WHERE id = $1)");

void api_passes_revoke(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {{"reason", CM_J_STRING, 0, 0, 512}};
    if (!api_name_param(req, resp, 0, "run") || !coord_req_check(req, resp, F, 1))
        return;
    char *end = NULL;
    long long id = req->nparams > 1 ? strtoll(req->params[1], &end, 10) : 0;
    if (id <= 0 || *end) {
        coord_resp_error(resp, 404, "not_found", "no such pass");
        return;
    }
    const char *reason = json_string_value(json_object_get(req->json, "reason"));
    char ids[24], uid[24];
    snprintf(ids, sizeof ids, "%lld", id);
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    const char *p[] = {ids, req->params[0], uid, reason ? reason : "revoked by an organizer"};
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
    PQclear(r);
    char target[96];
    snprintf(target, sizeof target, "%s/pass/%lld", req->params[0], id);
    if (newly) {
        json_t *d = json_pack("{s:s}", "reason", reason ? reason : "");
        int ok = coord_audit(req, "pass.revoke", target, d) == CM_OK &&
                 coord_db_cmd(req->db, "COMMIT") == CM_OK;
        json_decref(d);
        if (!ok) {
            coord_resp_error(resp, 500, "internal", "could not record the revocation");
            return;
        }
        coord_metrics_event(req->srv->metrics, COORD_EV_PASS_REVOKED);
        CM_LOGI("passes", "%s revoked pass %lld of run %s", req->user.username, id, req->params[0]);
    }
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:I, s:b}", "pass_id", ids, "revoked_at", (json_int_t)at,
                              "already_revoked", !newly));
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
