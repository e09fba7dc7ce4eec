/* Peer keys as the unit organizers act on (issue 22, findings 4 and 7).
 * A key belongs to the first user who proved to hold it (api_passes.c mints
 * passes for its holder only; sql/007_peer_keys.sql). Organizers can revoke
 * a key (every live pass for it, in every run, is revoked, so peers drop it
 * through the revocation lists, and no new pass is minted for it) and
 * release it (its live passes are revoked and the key is free again, for
 * whoever next proves to hold it). docs/protocol.md, "Pass requests". */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The key's row, created blocked and ownerless when nobody claimed it yet;
 * returns whether it was not revoked before. */
COORD_DB_STMT(S_KEY_BLOCK, 3,
              "INSERT INTO peer_keys AS k (peer_public_key, user_id, revoked_at, revoked_by, revoke_reason) "
              "VALUES ($1, NULL, now(), $2, $3) ON CONFLICT (peer_public_key) DO UPDATE SET "
              "revoked_at = coalesce(k.revoked_at, now()), revoked_by = coalesce(k.revoked_by, $2), "
              "revoke_reason = coalesce(k.revoke_reason, $3) "
              "RETURNING coalesce((SELECT revoked_at IS NULL FROM peer_keys WHERE peer_public_key = $1), true)");
/* Runs after the key row is locked (S_KEY_BLOCK or S_KEY_RELEASE), so a
 * pass minted concurrently is either seen here or refused there. */
COORD_DB_STMT(S_KEY_PASSES_REVOKE, 3,
              "UPDATE passes SET revoked_at = now(), revoked_by = $2, revoke_reason = $3 "
              "WHERE peer_public_key = $1 AND revoked_at IS NULL AND expires_at > now() RETURNING id");

/* Runs s with (key, actor, reason), or only the first s->nparams of them;
 * *count is the rows returned (S_KEY_BLOCK: whether newly revoked). */
static int exec_count(struct coord_req *req, struct coord_db_stmt *s, const uint8_t pk[CM_ED25519_PUB_LEN],
                      const char *actor, const char *reason, int *count)
{
    const char *p[] = {(const char *)pk, actor, reason};
    const int lens[] = {CM_ED25519_PUB_LEN, 0, 0};
    const int fmts[] = {1, 0, 0};
    PGresult *r = coord_db_exec_bin(req->db, s, p, lens, fmts, NULL);
    if (!r)
        return CM_EDB;
    *count = PQntuples(r);
    if (s == &S_KEY_BLOCK)
        *count = *count == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return CM_OK;
}

int api_peer_key_block(struct coord_req *req, const uint8_t pk[CM_ED25519_PUB_LEN], const char *reason,
                       int *newly, int *passes)
{
    char actor[24];
    snprintf(actor, sizeof actor, "%lld", (long long)req->user.id);
    int rc = exec_count(req, &S_KEY_BLOCK, pk, actor, reason, newly);
    if (rc == CM_OK)
        rc = exec_count(req, &S_KEY_PASSES_REVOKE, pk, actor, reason, passes);
    for (int i = 0; rc == CM_OK && i < *passes; i++)
        coord_metrics_event(req->srv->metrics, COORD_EV_PASS_REVOKED);
    return rc;
}

/* The {} parameter i as a raw peer key, or 0 with 404 set. */
static int key_param(struct coord_req *req, struct coord_resp *resp, int i, uint8_t pk[CM_ED25519_PUB_LEN])
{
    size_t n = 0;
    const char *s = i < req->nparams ? req->params[i] : "";
    if (cm_b64url_decode(s, strlen(s), pk, CM_ED25519_PUB_LEN, &n) != CM_OK || n != CM_ED25519_PUB_LEN) {
        coord_resp_error(resp, 404, "not_found",
                         "no such peer key (the path takes the base64url of the 32-byte key)");
        return 0;
    }
    return 1;
}

COORD_DB_STMT(S_KEY_GET, 1,
              "SELECT u.username, extract(epoch from k.claimed_at)::bigint, "
              "coalesce(extract(epoch from k.revoked_at)::bigint, 0), coalesce(k.revoke_reason, ''), "
              "(SELECT count(*) FROM passes p WHERE p.peer_public_key = $1 AND p.revoked_at IS NULL "
              "AND p.expires_at > now()) FROM peer_keys k LEFT JOIN users u ON u.id = k.user_id "
              "WHERE k.peer_public_key = $1");

void api_peer_key_get(struct coord_req *req, struct coord_resp *resp)
{
    uint8_t pk[CM_ED25519_PUB_LEN];
    if (!key_param(req, resp, 0, pk) || !coord_req_db(req, resp))
        return;
    const char *p[] = {(const char *)pk};
    const int lens[] = {CM_ED25519_PUB_LEN};
    const int fmts[] = {1};
    PGresult *r = coord_db_exec_bin(req->db, &S_KEY_GET, p, lens, fmts, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "nobody holds this peer key and it is not revoked");
        return;
    }
    json_t *o = json_pack("{s:s, s:I, s:I}", "peer_public_key", req->params[0], "claimed_at",
                          (json_int_t)strtoll(PQgetvalue(r, 0, 1), NULL, 10), "live_passes",
                          (json_int_t)strtoll(PQgetvalue(r, 0, 4), NULL, 10));
    json_object_set_new(o, "username", PQgetisnull(r, 0, 0) ? json_null() : json_string(PQgetvalue(r, 0, 0)));
    long long revoked = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    if (revoked) {
        json_object_set_new(o, "revoked_at", json_integer(revoked));
        json_object_set_new(o, "revoke_reason", json_string(PQgetvalue(r, 0, 3)));
    }
    PQclear(r);
    coord_resp_json(resp, 200, o);
}

/* Commits with an audit entry, or sets 500. */
static int commit_audit(struct coord_req *req, struct coord_resp *resp, const char *action, json_t *details)
{
    char target[96];
    snprintf(target, sizeof target, "peer-key/%s", req->params[0]);
    int ok = coord_audit(req, action, target, details) == CM_OK && coord_db_cmd(req->db, "COMMIT") == CM_OK;
    json_decref(details);
    if (!ok)
        coord_resp_error(resp, 500, "internal", "could not record the change");
    return ok;
}

void api_peer_key_revoke(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {{"reason", CM_J_STRING, 0, 0, 512}};
    uint8_t pk[CM_ED25519_PUB_LEN];
    if (!key_param(req, resp, 0, pk) || !coord_req_check(req, resp, F, 1))
        return;
    const char *reason = json_string_value(json_object_get(req->json, "reason"));
    if (!reason)
        reason = "key revoked by an organizer";
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int newly = 0, passes = 0;
    if (api_peer_key_block(req, pk, reason, &newly, &passes) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (!commit_audit(req, resp, "peer_key.revoke",
                      json_pack("{s:s, s:i}", "reason", reason, "passes_revoked", passes)))
        return;
    CM_LOGI("passes", "%s revoked peer key %s (%d live passes)", req->user.username, req->params[0], passes);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:i}", "peer_public_key", req->params[0], "already_revoked",
                              !newly, "passes_revoked", passes));
}

COORD_DB_STMT(S_KEY_RELEASE, 1, "DELETE FROM peer_keys WHERE peer_public_key = $1 RETURNING 1");

void api_peer_key_release(struct coord_req *req, struct coord_resp *resp)
{
    uint8_t pk[CM_ED25519_PUB_LEN];
    if (!key_param(req, resp, 0, pk))
        return;
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    char actor[24];
    snprintf(actor, sizeof actor, "%lld", (long long)req->user.id);
    const char *why = "key released by an organizer";
    int released = 0, passes = 0;
    if (exec_count(req, &S_KEY_RELEASE, pk, actor, why, &released) != CM_OK ||
        (released && exec_count(req, &S_KEY_PASSES_REVOKE, pk, actor, why, &passes) != CM_OK)) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (!released) {
        coord_resp_error(resp, 404, "not_found", "nobody holds this peer key and it is not revoked");
        return;
    }
    if (!commit_audit(req, resp, "peer_key.release", json_pack("{s:i}", "passes_revoked", passes)))
        return;
    for (int i = 0; i < passes; i++)
        coord_metrics_event(req->srv->metrics, COORD_EV_PASS_REVOKED);
    CM_LOGI("passes", "%s released peer key %s (%d live passes revoked)", req->user.username,
            req->params[0], passes);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:i}", "peer_public_key", req->params[0], "released", 1,
                              "passes_revoked", passes));
}
