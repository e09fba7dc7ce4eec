/* POST /api/v1/session (log in with a password or an identity-provider
 * token), DELETE /api/v1/session (log out), GET /api/v1/me.
 *
 * Guessing is throttled per username and per client address over a sliding
 * window kept in PostgreSQL, so every coordinator of a database enforces the
 * same limit. Unknown usernames cost the same argon2id work as known ones. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/idp.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"

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

COORD_DB_STMT(S_FAILS, 3,
              "SELECT (SELECT count(*) FROM login_failures WHERE username = $1 "
              "        AND at > now() - make_interval(secs => $3)),"
              "       (SELECT count(*) FROM login_failures WHERE client_ip = $2 "
              "        AND at > now() - make_interval(secs => $3))");
COORD_DB_STMT(S_FAIL_ADD, 2, "INSERT INTO login_failures (username, client_ip) VALUES ($1, $2)");
COORD_DB_STMT(S_FAIL_CLEAR, 1, "DELETE FROM login_failures WHERE username = $1");
COORD_DB_STMT(S_USER_BY_NAME, 1,
              "SELECT id, role, password_hash, disabled FROM users WHERE username = $1");
COORD_DB_STMT(S_SESSION_DEL, 1, "DELETE FROM sessions WHERE token_hash = $1");

/* Per-address limit is wider than per-user: many volunteers may share a NAT. */
#define IP_FAILURE_FACTOR 10

static int throttled(struct coord_req *req, struct coord_resp *resp, const char *username)
{
    const struct coord_config *cfg = req->srv->cfg;
    char win[24];
    snprintf(win, sizeof win, "%ld", cfg->login_window);
    const char *params[] = {username, req->client_ip, win};
    PGresult *r = coord_db_exec(req->db, &S_FAILS, params, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "login throttle lookup failed");
        return 1;
    }
    long by_user = atol(PQgetvalue(r, 0, 0)), by_ip = atol(PQgetvalue(r, 0, 1));
    PQclear(r);
    if (by_user >= cfg->login_max_failures ||
        by_ip >= cfg->login_max_failures * IP_FAILURE_FACTOR) {
        coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_THROTTLED);
        coord_resp_error(resp, 429, "throttled",
                         "too many failed logins; try again in %ld seconds", cfg->login_window);
        snprintf(resp->retry_after, sizeof resp->retry_after, "%ld", cfg->login_window);
        CM_LOGW("auth", "login throttled for user '%s' from %s", username, req->client_ip);
        return 1;
    }
    return 0;
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
    if (!coord_req_db(req, resp) || throttled(req, resp, username))
        return;
    const char *params[] = {username};
    PGresult *r = coord_db_exec(req->db, &S_USER_BY_NAME, params, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "user lookup failed");
        return;
    }
    int found = PQntuples(r) == 1;
    pthread_once(&g_dummy_once, make_dummy_hash);
    const char *hash = found && !PQgetisnull(r, 0, 2) ? PQgetvalue(r, 0, 2) : g_dummy_hash;
    int ok = coord_password_verify(hash, password) == CM_OK && found &&
             strcmp(PQgetvalue(r, 0, 3), "f") == 0;
    if (!ok) {
        PQclear(r);
        const char *fp[] = {username, req->client_ip};
        PGresult *f = coord_db_exec(req->db, &S_FAIL_ADD, fp, NULL);
        PQclear(f);
        coord_metrics_event(req->srv->metrics, COORD_EV_LOGIN_FAILED);
        coord_resp_error(resp, 401, "bad_credentials", "wrong username or password");
        return;
    }
    int64_t uid = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    char role[16];
    snprintf(role, sizeof role, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    PGresult *c = coord_db_exec(req->db, &S_FAIL_CLEAR, params, NULL);
    PQclear(c);
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
    if (!coord_req_db(req, resp) || throttled(req, resp, provider))
        return;
    struct coord_idp_identity id;
    int rc = coord_idp_userinfo(cfg, token, &id);
    if (rc == CM_EAUTH) {
        const char *fp[] = {provider, req->client_ip};
        PGresult *f = coord_db_exec(req->db, &S_FAIL_ADD, fp, NULL);
        PQclear(f);
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
