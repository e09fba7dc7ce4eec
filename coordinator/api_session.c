/* POST /api/v1/session (log in with a password or an identity-provider
 * token), DELETE /api/v1/session (log out), GET /api/v1/me, and the
 * caller's own account: PUT /api/v1/me/password, DELETE /api/v1/me/sessions.
 *
 * Guessing is throttled over a sliding window kept in PostgreSQL, so every
 * coordinator of a database enforces the same limits: per (username,
 * address), per address, and per username from all addresses together,
 * where an address the owner has logged in from stays open
 * (docs/architecture.md, "Login throttling"). Unknown usernames cost the same
 * argon2id work as known ones. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/idp.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A real argon2id hash of a random string, made once: verifying against it
 * for unknown users makes "no such user" as slow as "wrong password". */
static char g_dummy_hash[COORD_HASH_MAX];
static pthread_once_t g_dummy_once = PTHREAD_ONCE_INIT;

static void make_dummy_hash(void)
{
    uint8_t r[16];
    char pw[40];
    cm_random_bytes(r, sizeof r);
    cm_b64url_encode(r, sizeof r, pw);
    if (coord_password_hash(pw, g_dummy_hash) != CM_OK)
        g_dummy_hash[0] = '\0';
}

/* login_attempt (sql/006_accounts_admin.sql) checks the limits and records
 * the attempt as a failure under advisory locks, in one statement: parallel
 * guesses cannot slip past the limit between a count and an insert. */
COORD_DB_STMT(S_ATTEMPT, 6, "SELECT login_attempt($1, $2, $3, $4, $5, $6)");
COORD_DB_STMT(S_ATTEMPT_DROP, 1, "DELETE FROM login_failures WHERE id = $1");
/* A right password forgives this address's failures for the username and
 * makes the address known to it. */
COORD_DB_STMT(S_LOGIN_OK, 2,
              "WITH f AS (DELETE FROM login_failures WHERE username = $1 AND client_ip = $2) "
              "INSERT INTO login_known (username, client_ip) VALUES ($1, $2) "
              "ON CONFLICT (username, client_ip) DO UPDATE SET last_ok = now()");
COORD_DB_STMT(S_USER_BY_NAME, 1,
              "SELECT id, role, password_hash, disabled FROM users WHERE username = $1");
COORD_DB_STMT(S_SESSION_DEL, 1, "DELETE FROM sessions WHERE token_hash = $1");

/* Per-address limit is wider than per-(user, address): many volunteers may
 * share a NAT. The per-username limit over all addresses is as wide, and
 * does not apply to addresses the owner has logged in from. */
#define IP_FAILURE_FACTOR 10
#define USER_FAILURE_FACTOR 10

/* The address failures are counted under: IPv4 as it is, IPv6 by its /64
 * (one host commonly holds a whole /64, so counting single IPv6 addresses
 * would give it 2^64 budgets). */
static void throttle_addr(const char *ip, char out[64])
{
    struct in6_addr a6;
    snprintf(out, 64, "%s", ip);
    if (inet_pton(AF_INET6, ip, &a6) != 1)
        return;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
        inet_ntop(AF_INET, &a6.s6_addr[12], out, 64);
        return;
    }
    memset(&a6.s6_addr[8], 0, 8);
    char net[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a6, net, sizeof net);
    snprintf(out, 64, "%s/64", net);
}

/* Admits one login attempt for key (a username, or "idp:<provider>" with
 * per_key 0: no per-key budget) from the caller's address. 1 with the id of
 * the attempt, recorded as a failure until login_succeeded or attempt_drop;
 * 0 with 429 (or 500) set. */
static int login_admit(struct coord_req *req, struct coord_resp *resp, const char *key, int per_key,
                       char attempt[24])
{
    const struct coord_config *cfg = req->srv->cfg;
    char addr[64], win[24], mpair[24], mip[24], mkey[24];
    throttle_addr(req->client_ip, addr);
    snprintf(win, sizeof win, "%ld", cfg->login_window);
    snprintf(mpair, sizeof mpair, "%ld", cfg->login_max_failures);
    snprintf(mip, sizeof mip, "%ld", cfg->login_max_failures * IP_FAILURE_FACTOR);
    snprintf(mkey, sizeof mkey, "%ld", per_key ? cfg->login_max_failures * USER_FAILURE_FACTOR : 0);
    const char *params[] = {key, addr, win, mpair, mip, mkey};
    PGresult *r = coord_db_exec(req->db, &S_ATTEMPT, params, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "login throttle lookup failed");
        return 0;
    }
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    if (v > 0) {
        snprintf(attempt, 24, "%lld", v);
        return 1;
    }
    coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_THROTTLED);
    const char *why = v == -1   ? "too many failed logins for this account from your address"
                      : v == -2 ? "too many failed logins from your address"
                                : "too many failed logins for this account from addresses it has "
                                  "not logged in from (an address you logged in from before "
                                  "still works)";
    coord_resp_error(resp, 429, "throttled", "%s; try again in %ld seconds", why, cfg->login_window);
    snprintf(resp->retry_after, sizeof resp->retry_after, "%ld", cfg->login_window);
    CM_LOGW("auth", "login throttled (%lld) for '%s' from %s", v, key, req->client_ip);
    return 0;
}

/* The attempt was not a guess (the server failed, or the provider could not
 * be asked): it does not count. */
static void attempt_drop(struct coord_req *req, const char attempt[24])
{
    const char *p[] = {attempt};
    PGresult *r = coord_db_exec(req->db, &S_ATTEMPT_DROP, p, NULL);
    PQclear(r);
}

static void login_succeeded(struct coord_req *req, const char *username)
{
    char addr[64];
    throttle_addr(req->client_ip, addr);
    const char *p[] = {username, addr};
    PGresult *r = coord_db_exec(req->db, &S_LOGIN_OK, p, NULL);
    PQclear(r);
}

/* Checks `password` against the account `username` (the dummy hash when it
 * does not exist). 1: right, and the account is enabled and has a password
 * (uid and role filled when non-NULL); 0: not; -1 with 500 set. */
static int password_right(struct coord_req *req, struct coord_resp *resp, const char *username,
                          const char *password, int64_t *uid, char role[16])
{
    const char *params[] = {username};
    PGresult *r = coord_db_exec(req->db, &S_USER_BY_NAME, params, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "user lookup failed");
        return -1;
    }
    int found = PQntuples(r) == 1;
    pthread_once(&g_dummy_once, make_dummy_hash);
    const char *hash = found && !PQgetisnull(r, 0, 2) ? PQgetvalue(r, 0, 2) : g_dummy_hash;
    int ok = coord_password_verify(hash, password) == CM_OK && found && !PQgetisnull(r, 0, 2) &&
             strcmp(PQgetvalue(r, 0, 3), "f") == 0;
    if (ok) {
        if (uid)
            *uid = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        if (role)
            snprintf(role, 16, "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return ok;
}

static void session_response(struct coord_req *req, struct coord_resp *resp, int64_t uid,
                             const char *username, const char *role)
{
    char token[64];
    int64_t exp = 0;
    if (coord_session_create(req->db, uid, req->srv->cfg->session_ttl, token, &exp) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not create a session");
        return;
    }
    coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_OK);
    coord_resp_json(resp, 201,
                    json_pack("{s:s, s:s, s:I, s:s, s:s}", "token", token, "token_type", "Bearer",
                              "expires_at", (json_int_t)exp, "username", username, "role", role));
}

static void login_password(struct coord_req *req, struct coord_resp *resp)
{
    const char *username = json_string_value(json_object_get(req->json, "username"));
    const char *password = json_string_value(json_object_get(req->json, "password"));
    if (!username || !password) {
        coord_resp_error(resp, 400, "invalid_request",
                         "send {\"username\", \"password\"} or {\"provider\", \"token\"}");
        return;
    }
    if (!cm_name_valid(username)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'username': 1-64 characters of A-Z a-z 0-9 _ . -");
        return;
    }
    char attempt[24];
    if (!coord_req_db(req, resp) || !login_admit(req, resp, username, 1, attempt))
        return;
    int64_t uid = 0;
    char role[16];
    int ok = password_right(req, resp, username, password, &uid, role);
    if (ok < 0) {
        attempt_drop(req, attempt);
        return;
    }
    if (!ok) {
        coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_FAILED);
        coord_resp_error(resp, 401, "bad_credentials", "wrong username or password");
        return;
    }
    login_succeeded(req, username);
    session_response(req, resp, uid, username, role);
}

static void login_provider(struct coord_req *req, struct coord_resp *resp)
{
    const struct coord_config *cfg = req->srv->cfg;
    const char *provider = json_string_value(json_object_get(req->json, "provider"));
    const char *token = json_string_value(json_object_get(req->json, "token"));
    if (!token) {
        coord_resp_error(resp, 400, "invalid_request", "missing field 'token'");
        return;
    }
    if (!cfg->idp_userinfo_url || !cfg->idp_name || strcmp(provider, cfg->idp_name) != 0) {
        coord_resp_error(resp, 400, "unknown_provider",
                         "this coordinator has no identity provider named '%.64s'", provider);
        return;
    }
    /* Tokens are the provider's to guess-proof: only the per-address limits
     * apply, so bad tokens from some addresses never lock out the rest. */
    char key[CM_NAME_MAX + 8], attempt[24];
    snprintf(key, sizeof key, "idp:%s", provider);
    if (!coord_req_db(req, resp) || !login_admit(req, resp, key, 0, attempt))
        return;
    struct coord_idp_identity id;
    int rc = coord_idp_userinfo(cfg, token, &id);
    if (rc != CM_EAUTH)
        attempt_drop(req, attempt);
    if (rc == CM_EAUTH) {
        coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_FAILED);
        coord_resp_error(resp, 401, "bad_credentials", "the identity provider rejected the token");
        return;
    }
    if (rc != CM_OK) {
        coord_resp_error(resp, 502, "provider_error",
                         "the identity provider could not be asked or gave an unusable answer: %s",
                         cm_strerror(rc));
        return;
    }
    int64_t uid = 0;
    char username[CM_NAME_MAX + 1], role[16];
    rc = coord_idp_map(req, cfg->idp_name, &id, &uid, username, role);
    if (rc == CM_EEXISTS) {
        coord_resp_error(resp, 409, "username_taken",
                         "the username '%s' belongs to a local account; an organizer must link it",
                         id.username);
        return;
    }
    if (rc == CM_EPERM) {
        coord_resp_error(resp, 403, "account_disabled", "this account is disabled");
        return;
    }
    if (rc != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not map the identity to an account");
        return;
    }
    session_response(req, resp, uid, username, role);
}

void api_session_create(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"username", CM_J_STRING, 0, 1, CM_NAME_MAX},
        {"password", CM_J_STRING, 0, 1, COORD_PASSWORD_MAX},
        {"provider", CM_J_STRING, 0, 1, CM_NAME_MAX},
        {"token", CM_J_STRING, 0, 1, 4096},
    };
    if (!coord_req_check(req, resp, F, sizeof F / sizeof F[0]))
        return;
    if (json_object_get(req->json, "provider")) {
        if (json_object_get(req->json, "username") || json_object_get(req->json, "password")) {
            coord_resp_error(resp, 400, "invalid_request",
                             "send either {username, password} or {provider, token}, not both");
            return;
        }
        login_provider(req, resp);
    } else {
        if (json_object_get(req->json, "token")) {
            coord_resp_error(resp, 400, "invalid_request", "'token' goes with 'provider'");
            return;
        }
        login_password(req, resp);
    }
}

void api_session_delete(struct coord_req *req, struct coord_resp *resp)
{
    const char *authz = coord_req_header(req, "Authorization");
    const char *tok = authz + 7; /* authenticated: "Bearer " was checked */
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(tok, strlen(tok), h);
    const char *params[] = {(const char *)h};
    const int lens[] = {CM_SHA256_LEN};
    const int fmts[] = {1};
    coord_session_forget(h);
    struct coord_db_conn *db = coord_req_db(req, resp);
    if (!db)
        return;
    PGresult *r = coord_db_exec_bin(db, &S_SESSION_DEL, params, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "could not end the session");
        return;
    }
    PQclear(r);
    resp->status = 204;
}

void api_me(struct coord_req *req, struct coord_resp *resp)
{
    coord_resp_json(resp, 200,
                    json_pack("{s:I, s:s, s:s}", "id", (json_int_t)req->user.id, "username",
                              req->user.username, "role", coord_role_name(req->user.role)));
}

/* The SHA-256 of the caller's own bearer token (authenticated: "Bearer " was checked). */
static void own_token_hash(struct coord_req *req, uint8_t h[CM_SHA256_LEN])
{
    const char *tok = coord_req_header(req, "Authorization") + 7;
    cm_sha256(tok, strlen(tok), h);
}

COORD_DB_STMT(S_PASSWORD_SET, 3,
              "WITH u AS (UPDATE users SET password_hash = $2 WHERE id = $1 RETURNING id), "
              "d AS (DELETE FROM sessions WHERE user_id IN (SELECT id FROM u) "
              "      AND token_hash <> $3 RETURNING 1) "
              "SELECT count(*) FROM d");
COORD_DB_STMT(S_OTHERS_END, 2,
              "WITH d AS (DELETE FROM sessions WHERE user_id = $1 AND token_hash <> $2 RETURNING 1) "
              "SELECT count(*) FROM d");

/* Changes the caller's password (the old one is required and counts as a
 * login attempt) and ends the caller's other sessions: whoever else held one
 * may have learned the old password. */
void api_me_password(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"old_password", CM_J_STRING, 1, 1, COORD_PASSWORD_MAX},
        {"new_password", CM_J_STRING, 1, COORD_PASSWORD_MIN, COORD_PASSWORD_MAX},
    };
    if (!coord_req_check(req, resp, F, sizeof F / sizeof F[0]))
        return;
    const char *old_pw = json_string_value(json_object_get(req->json, "old_password"));
    const char *new_pw = json_string_value(json_object_get(req->json, "new_password"));
    char attempt[24];
    if (!coord_req_db(req, resp) || !login_admit(req, resp, req->user.username, 1, attempt))
        return;
    int64_t uid = 0;
    int ok = password_right(req, resp, req->user.username, old_pw, &uid, NULL);
    if (ok < 0) {
        attempt_drop(req, attempt);
        return;
    }
    if (!ok || uid != req->user.id) {
        coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_FAILED);
        coord_resp_error(resp, 403, "wrong_password",
                         "'old_password' is not this account's password (accounts of an identity "
                         "provider have none)");
        return;
    }
    char hash[COORD_HASH_MAX], uids[24];
    uint8_t mine[CM_SHA256_LEN];
    own_token_hash(req, mine);
    snprintf(uids, sizeof uids, "%lld", (long long)req->user.id);
    if (coord_password_hash(new_pw, hash) != CM_OK || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        attempt_drop(req, attempt);
        coord_resp_error(resp, 500, "internal", "could not change the password");
        return;
    }
    const char *p[] = {uids, hash, (const char *)mine};
    const int lens[] = {0, 0, CM_SHA256_LEN};
    const int fmts[] = {0, 0, 1};
    PGresult *r = coord_db_exec_bin(req->db, &S_PASSWORD_SET, p, lens, fmts, NULL);
    long ended = r ? atol(PQgetvalue(r, 0, 0)) : 0;
    PQclear(r);
    json_t *d = json_pack("{s:i}", "sessions_ended", (int)ended);
    int done = r && coord_audit(req, "user.password", req->user.username, d) == CM_OK &&
               coord_db_cmd(req->db, "COMMIT") == CM_OK;
    json_decref(d);
    if (!done) {
        coord_db_cmd(req->db, "ROLLBACK");
        attempt_drop(req, attempt);
        coord_resp_error(resp, 500, "internal", "could not change the password");
        return;
    }
    coord_session_forget_user(req->user.id, mine);
    login_succeeded(req, req->user.username);
    CM_LOGI("auth", "'%s' changed their password; %ld other sessions ended", req->user.username, ended);
    coord_resp_json(resp, 200, json_pack("{s:I}", "sessions_ended", (json_int_t)ended));
}

/* Ends every session of the caller but the one making this request. */
void api_me_sessions_end(struct coord_req *req, struct coord_resp *resp)
{
    uint8_t mine[CM_SHA256_LEN];
    own_token_hash(req, mine);
    char uids[24];
    snprintf(uids, sizeof uids, "%lld", (long long)req->user.id);
    if (!coord_req_db(req, resp))
        return;
    const char *p[] = {uids, (const char *)mine};
    const int lens[] = {0, CM_SHA256_LEN};
    const int fmts[] = {0, 1};
    PGresult *r = coord_db_exec_bin(req->db, &S_OTHERS_END, p, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "could not end the sessions");
        return;
    }
    long ended = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    coord_session_forget_user(req->user.id, mine);
    coord_resp_json(resp, 200, json_pack("{s:I}", "sessions_ended", (json_int_t)ended));
}
