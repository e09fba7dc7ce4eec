/* Password hashing, sessions and the audit log (see auth.h). */
#include "coordinator/auth.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"

#include <argon2.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARGON_T 2
#define ARGON_M_KIB 19456
#define ARGON_P 1
#define ARGON_SALT 16
#define ARGON_HASH 32

unsigned coord_role_parse(const char *s)
{
    if (!s)
        return 0;
    if (!strcmp(s, "organizer"))
        return COORD_ROLE_ORGANIZER;
    if (!strcmp(s, "auditor"))
        return COORD_ROLE_AUDITOR;
    if (!strcmp(s, "volunteer"))
        return COORD_ROLE_VOLUNTEER;
    return 0;
}

const char *coord_role_name(unsigned role)
{
    switch (role) {
    case COORD_ROLE_ORGANIZER: return "organizer";
    case COORD_ROLE_AUDITOR: return "auditor";
    case COORD_ROLE_VOLUNTEER: return "volunteer";
    default: return "unknown";
    }
}

int coord_password_hash(const char *password, char out[COORD_HASH_MAX])
{
    uint8_t salt[ARGON_SALT];
    int rc = cm_random_bytes(salt, sizeof salt);
    if (rc != CM_OK)
        return rc;
    int a = argon2id_hash_encoded(ARGON_T, ARGON_M_KIB, ARGON_P, password, strlen(password), salt,
                                  sizeof salt, ARGON_HASH, out, COORD_HASH_MAX);
    if (a != ARGON2_OK) {
        CM_LOGE("auth", "argon2id: %s", argon2_error_message(a));
        return a == ARGON2_MEMORY_ALLOCATION_ERROR ? CM_ENOMEM : CM_ECRYPTO;
    }
    return CM_OK;
}

int coord_password_verify(const char *encoded, const char *password)
{
    if (!encoded || strncmp(encoded, "$argon2id$", 10) != 0)
        return CM_EAUTH;
    int a = argon2id_verify(encoded, password, strlen(password));
    if (a == ARGON2_OK)
        return CM_OK;
    if (a != ARGON2_VERIFY_MISMATCH)
        CM_LOGW("auth", "argon2id verify: %s", argon2_error_message(a));
    return CM_EAUTH;
}

COORD_DB_STMT(S_SESSION_NEW, 3,
              "INSERT INTO sessions (token_hash, user_id, expires_at) "
              "VALUES ($1, $2, now() + make_interval(secs => $3)) "
              "RETURNING extract(epoch from expires_at)::bigint");

int coord_session_create(struct coord_db_conn *db, int64_t user_id, long ttl_s, char token_out[64],
                         int64_t *expires_at)
{
    uint8_t raw[32], h[CM_SHA256_LEN];
    int rc = cm_random_bytes(raw, sizeof raw);
    if (rc != CM_OK)
        return rc;
    char b64[48];
    cm_b64url_encode(raw, sizeof raw, b64);
    snprintf(token_out, 64, "%s%s", COORD_SESSION_PREFIX, b64);
    cm_sha256(token_out, strlen(token_out), h);
    char uid[24], ttl[24];
    snprintf(uid, sizeof uid, "%lld", (long long)user_id);
    snprintf(ttl, sizeof ttl, "%ld", ttl_s);
    const char *params[] = {(const char *)h, uid, ttl};
    const int lens[] = {CM_SHA256_LEN, 0, 0};
    const int fmts[] = {1, 0, 0};
    PGresult *r = coord_db_exec_bin(db, &S_SESSION_NEW, params, lens, fmts, NULL);
    if (!r)
        return CM_EDB;
    *expires_at = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return CM_OK;
}

/* A small cache of recently verified sessions, so hot paths (pass issuance,
 * authenticated reads) skip one database round trip. An entry lives at most
 * SESSION_CACHE_S seconds and never past the session's expiry; logging out
 * through this coordinator evicts at once, through another coordinator of
 * the same database within SESSION_CACHE_S. Direct-mapped by token hash. */
#define SESSION_CACHE_S 5
#define SESSION_CACHE_SLOTS 4096
struct session_slot {
    uint8_t hash[CM_SHA256_LEN];
    struct coord_user user;
    int64_t valid_until; /* monotonic seconds */
};
static struct session_slot g_sessions[SESSION_CACHE_SLOTS];
static pthread_mutex_t g_sessions_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec;
}

static struct session_slot *slot_of(const uint8_t h[CM_SHA256_LEN])
{
    uint32_t i;
    memcpy(&i, h, sizeof i);
    return &g_sessions[i % SESSION_CACHE_SLOTS];
}

static int session_cached(const uint8_t h[CM_SHA256_LEN], struct coord_user *out)
{
    int hit = 0;
    pthread_mutex_lock(&g_sessions_mu);
    struct session_slot *s = slot_of(h);
    if (s->valid_until > mono_s() && cm_ct_equal(s->hash, h, CM_SHA256_LEN)) {
        *out = s->user;
        hit = 1;
    }
    pthread_mutex_unlock(&g_sessions_mu);
    return hit;
}

static void session_remember(const uint8_t h[CM_SHA256_LEN], const struct coord_user *u,
                             int64_t seconds_left)
{
    if (seconds_left <= 0)
        return;
    pthread_mutex_lock(&g_sessions_mu);
    struct session_slot *s = slot_of(h);
    memcpy(s->hash, h, CM_SHA256_LEN);
    s->user = *u;
    s->valid_until = mono_s() + (seconds_left < SESSION_CACHE_S ? seconds_left : SESSION_CACHE_S);
    pthread_mutex_unlock(&g_sessions_mu);
}

void coord_session_forget(const uint8_t h[CM_SHA256_LEN])
{
    pthread_mutex_lock(&g_sessions_mu);
    struct session_slot *s = slot_of(h);
    if (cm_ct_equal(s->hash, h, CM_SHA256_LEN))
        s->valid_until = 0;
    pthread_mutex_unlock(&g_sessions_mu);
}

void coord_session_forget_user(int64_t user_id, const uint8_t keep[CM_SHA256_LEN])
{
    pthread_mutex_lock(&g_sessions_mu);
    for (size_t i = 0; i < SESSION_CACHE_SLOTS; i++) {
        struct session_slot *s = &g_sessions[i];
        if (s->valid_until && s->user.id == user_id &&
            !(keep && cm_ct_equal(s->hash, keep, CM_SHA256_LEN)))
            s->valid_until = 0;
    }
    pthread_mutex_unlock(&g_sessions_mu);
}

/* Which requests may take their session from the cache: reads, and pass
 * issuance, whose statement checks the account itself (api_passes.c). Every
 * other write asks the database, so an account disabled or a session ended
 * through any coordinator stops there at once, not within SESSION_CACHE_S. */
static int cache_allowed(const struct coord_req *req)
{
    if (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD"))
        return 1;
    size_t n = strlen(req->path);
    return !strcmp(req->method, "POST") && n > 7 && !strcmp(req->path + n - 7, "/passes");
}

COORD_DB_STMT(S_SESSION_GET, 1,
              "SELECT u.id, u.username, u.role, "
              "extract(epoch from s.expires_at - now())::bigint "
              "FROM sessions s JOIN users u ON u.id = s.user_id "
              "WHERE s.token_hash = $1 AND s.expires_at > now() AND NOT u.disabled");

int coord_auth_bearer(struct coord_req *req, struct coord_resp *resp, const char *authz)
{
    if (!authz) {
        coord_resp_error(resp, 401, "unauthenticated",
                         "log in first: send 'Authorization: Bearer <token>' from POST /api/v1/session");
        return 0;
    }
    const char *tok = NULL;
    if (!strncasecmp(authz, "Bearer ", 7))
        tok = authz + 7;
    size_t tl = tok ? strlen(tok) : 0;
    if (!tok || tl < 8 || tl > 128 || strncmp(tok, COORD_SESSION_PREFIX, 4) != 0) {
        coord_resp_error(resp, 401, "unauthenticated", "malformed bearer token");
        return 0;
    }
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(tok, tl, h);
    if (cache_allowed(req) && session_cached(h, &req->user)) {
        req->authenticated = 1;
        return 1;
    }
    struct coord_db_conn *db = coord_req_db(req, resp);
    if (!db)
        return 0;
    const char *params[] = {(const char *)h};
    const int lens[] = {CM_SHA256_LEN};
    const int fmts[] = {1};
    PGresult *r = coord_db_exec_bin(db, &S_SESSION_GET, params, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "session lookup failed");
        return 0;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 401, "unauthenticated", "the session is unknown or has expired");
        return 0;
    }
    req->user.id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    snprintf(req->user.username, sizeof req->user.username, "%s", PQgetvalue(r, 0, 1));
    req->user.role = coord_role_parse(PQgetvalue(r, 0, 2));
    req->authenticated = 1;
    session_remember(h, &req->user, strtoll(PQgetvalue(r, 0, 3), NULL, 10));
    PQclear(r);
    return 1;
}

COORD_DB_STMT(S_AUDIT, 6,
              "INSERT INTO audit_log (actor_id, actor, action, target, details, client_ip) "
              "VALUES ($1, $2, $3, $4, $5, $6)");

int coord_audit(struct coord_req *req, const char *action, const char *target, json_t *details)
{
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    char *d = details ? json_dumps(details, JSON_COMPACT) : NULL;
    const char *params[] = {req->authenticated ? uid : NULL,
                            req->authenticated ? req->user.username : "anonymous",
                            action,
                            target ? target : "",
                            d ? d : "{}",
                            req->client_ip};
    PGresult *r = req->db ? coord_db_exec(req->db, &S_AUDIT, params, NULL) : NULL;
    free(d);
    if (!r)
        return CM_EDB;
    PQclear(r);
    return CM_OK;
}

COORD_DB_STMT(S_USER_NEW, 3,
              "INSERT INTO users (username, role, password_hash) VALUES ($1, $2, $3) "
              "ON CONFLICT DO NOTHING RETURNING id"); /* exact or any case (users_username_ci) */

int coord_user_create(struct coord_db_conn *db, const char *username, unsigned role,
                      const char *password, int64_t *id_out)
{
    char hash[COORD_HASH_MAX];
    if (!cm_name_valid(username) || !coord_role_name(role))
        return CM_EINVAL;
    int rc = coord_password_hash(password, hash);
    if (rc != CM_OK)
        return rc;
    const char *params[] = {username, coord_role_name(role), hash};
    PGresult *r = coord_db_exec(db, &S_USER_NEW, params, NULL);
    if (!r)
        return CM_EDB;
    int n = PQntuples(r);
    if (n == 1 && id_out)
        *id_out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return n == 1 ? CM_OK : CM_EEXISTS;
}

COORD_DB_STMT(S_USER_DISABLE, 2,
              "WITH u AS (UPDATE users SET disabled = true WHERE username = $1 RETURNING id), "
              "s AS (DELETE FROM sessions WHERE user_id IN (SELECT id FROM u) RETURNING 1), "
              "p AS (UPDATE passes SET revoked_at = now(), revoked_by = $2, "
              "      revoke_reason = 'account disabled' WHERE user_id IN (SELECT id FROM u) "
              "      AND revoked_at IS NULL AND expires_at > now() RETURNING 1) "
              /* the sub-select sees the row before this statement */
              "SELECT u.id, (SELECT NOT disabled FROM users WHERE id = u.id), "
              "(SELECT count(*) FROM s), (SELECT count(*) FROM p) FROM u");
COORD_DB_STMT(S_USER_ENABLE, 1,
              "WITH u AS (UPDATE users SET disabled = false WHERE username = $1 RETURNING id) "
              "SELECT u.id, (SELECT disabled FROM users WHERE id = u.id), 0, 0 FROM u");

int coord_user_set_disabled(struct coord_db_conn *db, const char *username, int disabled,
                            int64_t actor_id, struct coord_user_change *out)
{
    memset(out, 0, sizeof *out);
    char actor[24];
    snprintf(actor, sizeof actor, "%lld", (long long)actor_id);
    const char *p[] = {username, actor_id ? actor : NULL};
    PGresult *r = coord_db_exec(db, disabled ? &S_USER_DISABLE : &S_USER_ENABLE, p, NULL);
    if (!r)
        return CM_EDB;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return CM_ENOTFOUND;
    }
    out->user_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    out->changed = !strcmp(PQgetvalue(r, 0, 1), "t");
    out->sessions_ended = atol(PQgetvalue(r, 0, 2));
    out->passes_revoked = atol(PQgetvalue(r, 0, 3));
    PQclear(r);
    return CM_OK;
}

COORD_DB_STMT(S_USER_SESSIONS_END, 1,
              "WITH u AS (SELECT id FROM users WHERE username = $1), "
              "s AS (DELETE FROM sessions WHERE user_id IN (SELECT id FROM u) RETURNING 1) "
              "SELECT u.id, (SELECT count(*) FROM s) FROM u");

int coord_user_sessions_end(struct coord_db_conn *db, const char *username,
                            struct coord_user_change *out)
{
    memset(out, 0, sizeof *out);
    const char *p[] = {username};
    PGresult *r = coord_db_exec(db, &S_USER_SESSIONS_END, p, NULL);
    if (!r)
        return CM_EDB;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return CM_ENOTFOUND;
    }
    out->user_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    out->sessions_ended = atol(PQgetvalue(r, 0, 1));
    out->changed = out->sessions_ended > 0;
    PQclear(r);
    return CM_OK;
}
