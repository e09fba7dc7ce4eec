/* Accounts (organizers create, disable and enable them and end their
 * sessions; organizers and auditors list them) and the audit log. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "cm_err.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void api_users_create(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"username", CM_J_STRING, 1, 1, CM_NAME_MAX},
        {"role", CM_J_STRING, 1, 1, 16},
        {"password", CM_J_STRING, 1, COORD_PASSWORD_MIN, COORD_PASSWORD_MAX},
    };
    if (!coord_req_check(req, resp, F, sizeof F / sizeof F[0]))
        return;
    const char *username = json_string_value(json_object_get(req->json, "username"));
    const char *role_s = json_string_value(json_object_get(req->json, "role"));
    const char *password = json_string_value(json_object_get(req->json, "password"));
    unsigned role = coord_role_parse(role_s);
    if (!cm_name_valid(username)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'username': 1-64 characters of A-Z a-z 0-9 _ . -, "
                         "not starting with . or -");
        return;
    }
    if (!role) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'role': one of organizer, auditor, volunteer");
        return;
    }
    if (!coord_req_db(req, resp))
        return;
    if (coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int64_t id = 0;
    int rc = coord_user_create(req->db, username, role, password, &id);
    if (rc == CM_EEXISTS) {
        coord_resp_error(resp, 409, "exists",
                         "the username '%s' is taken (usernames are unique ignoring case)", username);
        return; /* released connection rolls back */
    }
    json_t *d = json_pack("{s:s}", "role", role_s);
    if (rc != CM_OK || coord_audit(req, "user.create", username, d) != CM_OK ||
        coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        json_decref(d);
        coord_resp_error(resp, 500, "internal", "could not create the account");
        return;
    }
    json_decref(d);
    coord_resp_json(resp, 201,
                    json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "username", username,
                              "role", role_s));
}

COORD_DB_STMT(S_USERS, 0,
              "SELECT id, username, role, disabled, extract(epoch from created_at)::bigint, "
              "password_hash IS NULL FROM users ORDER BY id");

void api_users_list(struct coord_req *req, struct coord_resp *resp)
{
    if (!coord_req_db(req, resp))
        return;
    PGresult *r = coord_db_exec(req->db, &S_USERS, NULL, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(
            a, json_pack("{s:I, s:s, s:s, s:b, s:I, s:s}", "id",
                         (json_int_t)strtoll(PQgetvalue(r, i, 0), NULL, 10), "username",
                         PQgetvalue(r, i, 1), "role", PQgetvalue(r, i, 2), "disabled",
                         !strcmp(PQgetvalue(r, i, 3), "t"), "created_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "login",
                         !strcmp(PQgetvalue(r, i, 5), "t") ? "identity-provider" : "password"));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:o}", "users", a));
}

/* The account named by params[0]: 1, or 0 with 404 set. */
static int user_param(struct coord_req *req, struct coord_resp *resp)
{
    if (req->nparams < 1 || !cm_name_valid(req->params[0])) {
        coord_resp_error(resp, 404, "not_found", "no such user");
        return 0;
    }
    return 1;
}

/* PATCH /api/v1/users/{username} {"disabled": bool}. Disabling ends the
 * account's sessions and revokes its live passes in the same transaction,
 * and this coordinator forgets its cached sessions after the commit. */
void api_users_update(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {{"disabled", CM_J_BOOL, 1, 1, 0}};
    if (!user_param(req, resp) || !coord_req_check(req, resp, F, 1))
        return;
    int disabled = json_is_true(json_object_get(req->json, "disabled"));
    if (disabled && !strcmp(req->params[0], req->user.username)) {
        coord_resp_error(resp, 409, "self", "an organizer cannot disable their own account");
        return;
    }
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    struct coord_user_change ch;
    int rc = coord_user_set_disabled(req->db, req->params[0], disabled, req->user.id, &ch);
    if (rc == CM_ENOTFOUND) {
        coord_resp_error(resp, 404, "not_found", "no user '%s'", req->params[0]);
        return;
    }
    json_t *d = json_pack("{s:I, s:I}", "sessions_ended", (json_int_t)ch.sessions_ended,
                          "passes_revoked", (json_int_t)ch.passes_revoked);
    int ok = rc == CM_OK &&
             (!ch.changed ||
              coord_audit(req, disabled ? "user.disable" : "user.enable", req->params[0], d) == CM_OK) &&
             coord_db_cmd(req->db, "COMMIT") == CM_OK;
    json_decref(d);
    if (!ok) {
        coord_resp_error(resp, 500, "internal", "could not change the account");
        return;
    }
    if (disabled)
        coord_session_forget_user(ch.user_id, NULL);
    if (ch.changed)
        CM_LOGI("auth", "%s %s '%s' (%ld sessions ended, %ld passes revoked)", req->user.username,
                disabled ? "disabled" : "enabled", req->params[0], ch.sessions_ended,
                ch.passes_revoked);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:b, s:I, s:I}", "username", req->params[0], "disabled",
                              disabled, "changed", ch.changed, "sessions_ended",
                              (json_int_t)ch.sessions_ended, "passes_revoked",
                              (json_int_t)ch.passes_revoked));
}

/* DELETE /api/v1/users/{username}/sessions: logs the account out everywhere. */
void api_users_sessions_end(struct coord_req *req, struct coord_resp *resp)
{
    if (!user_param(req, resp))
        return;
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    struct coord_user_change ch;
    int rc = coord_user_sessions_end(req->db, req->params[0], &ch);
    if (rc == CM_ENOTFOUND) {
        coord_resp_error(resp, 404, "not_found", "no user '%s'", req->params[0]);
        return;
    }
    json_t *d = json_pack("{s:I}", "sessions_ended", (json_int_t)ch.sessions_ended);
    int ok = rc == CM_OK && coord_audit(req, "user.sessions_end", req->params[0], d) == CM_OK &&
             coord_db_cmd(req->db, "COMMIT") == CM_OK;
    json_decref(d);
    if (!ok) {
        coord_resp_error(resp, 500, "internal", "could not end the sessions");
        return;
    }
    coord_session_forget_user(ch.user_id, NULL);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:I}", "username", req->params[0], "sessions_ended",
                              (json_int_t)ch.sessions_ended));
}

COORD_DB_STMT(S_AUDIT_LIST, 2,
              "SELECT id, extract(epoch from at)::bigint, actor, action, target, details::text, "
              "client_ip FROM audit_log WHERE id < $1 ORDER BY id DESC LIMIT $2");

void api_audit_list(struct coord_req *req, struct coord_resp *resp)
{
    const char *before = coord_req_query(req, "before");
    const char *limit = coord_req_query(req, "limit");
    char *end = NULL;
    long long b = before ? strtoll(before, &end, 10) : 9223372036854775807LL;
    if (before && (*end || b <= 0)) {
        coord_resp_error(resp, 400, "invalid_request", "'before' must be a positive audit id");
        return;
    }
    long l = limit ? strtol(limit, &end, 10) : 100;
    if (limit && (*end || l < 1 || l > 1000)) {
        coord_resp_error(resp, 400, "invalid_request", "'limit' must be 1..1000");
        return;
    }
    char bs[24], ls[24];
    snprintf(bs, sizeof bs, "%lld", b);
    snprintf(ls, sizeof ls, "%ld", l);
    if (!coord_req_db(req, resp))
        return;
    const char *p[] = {bs, ls};
    PGresult *r = coord_db_exec(req->db, &S_AUDIT_LIST, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *details = json_loads(PQgetvalue(r, i, 5), 0, NULL);
        json_array_append_new(
            a, json_pack("{s:I, s:I, s:s, s:s, s:s, s:o, s:s}", "id",
                         (json_int_t)strtoll(PQgetvalue(r, i, 0), NULL, 10), "at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10), "actor",
                         PQgetvalue(r, i, 2), "action", PQgetvalue(r, i, 3), "target",
                         PQgetvalue(r, i, 4), "details", details ? details : json_object(),
                         "client_ip", PQgetvalue(r, i, 6)));
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:o}", "entries", a));
}
