/* Runs and their allowlists. Anyone may read a run's public description
 * (name, status, model summary, target batch size); its config is shown to
 * logged-in users; organizers create and change runs and keep allowlists.
 * Every change is written to the audit log in the same transaction. */
#include "agent/train/train_config.h"
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/backbone.h"
#include "cm_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TARGET_BATCH 1000000000LL

int api_name_param(struct coord_req *req, struct coord_resp *resp, int i, const char *what)
{
    if (i >= req->nparams || !cm_name_valid(req->params[i])) {
        coord_resp_error(resp, 404, "not_found", "no such %s", what);
        return 0;
    }
    return 1;
}

static json_t *run_json(PGresult *r, int i, int with_config)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I}", "name", PQgetvalue(r, i, 0), "status",
                          PQgetvalue(r, i, 1), "description", PQgetvalue(r, i, 2),
                          "model_summary", PQgetvalue(r, i, 3), "target_batch_size",
                          (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "created_at",
                          (json_int_t)strtoll(PQgetvalue(r, i, 5), NULL, 10));
    if (with_config && j) {
        json_t *c = json_loads(PQgetvalue(r, i, 6), 0, NULL);
        json_object_set_new(j, "config", c ? c : json_object());
    }
    return j;
}

#define RUN_COLS                                                                     \
    "name, status, description, model_summary, target_batch_size, "                 \
    "extract(epoch from created_at)::bigint, config::text"

COORD_DB_STMT(S_RUNS, 0, "SELECT " RUN_COLS " FROM runs ORDER BY created_at, id");
COORD_DB_STMT(S_RUN, 1, "SELECT " RUN_COLS " FROM runs WHERE name = $1");

void api_runs_list(struct coord_req *req, struct coord_resp *resp)
{
    if (!coord_req_db(req, resp))
        return;
    PGresult *r = coord_db_exec(req->db, &S_RUNS, NULL, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(a, run_json(r, i, 0));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:o}", "runs", a));
}

void api_runs_get(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return;
    PGresult *r = api_run_row(req, resp, &S_RUN);
    if (!r)
        return;
    coord_resp_json(resp, 200, run_json(r, 0, req->authenticated));
    PQclear(r);
}

static int valid_status(const char *s)
{
    return s && (!strcmp(s, "open") || !strcmp(s, "paused") || !strcmp(s, "finished"));
}

/* A config with a model is a recipe every agent must load: it is parsed
 * here by the agents' own parser (agent/train/train_config.c; the roles
 * take out "collaboration" and "pipeline" first, so does this), so a recipe
 * no agent could train (a warm-up as long as the run, an unknown key, a
 * head that does not divide the width) is refused at creation with the
 * message a volunteer would otherwise see at every join. The declared
 * model_parameters, which schedules are computed from, must be the model's
 * count. 1 when valid; else 0 with err set. */
static int recipe_valid(const json_t *cfg, char *err, size_t errlen)
{
    if (!json_object_get(cfg, "model"))
        return 1;
    json_t *c = json_deep_copy(cfg);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    json_t *collab = json_incref(json_object_get(c, "collaboration"));
    int pipeline = json_object_get(c, "pipeline") != NULL;
    json_object_del(c, "collaboration");
    json_object_del(c, "pipeline");
    char *text = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    struct agent_train_config *tc = malloc(sizeof *tc); /* paths make it large */
    char why[256] = "";
    int rc = text && tc ? agent_train_config_parse(text, strlen(text), NULL, tc, why, sizeof why)
                        : CM_ENOMEM;
    free(text);
    if (rc != CM_OK) {
        free(tc);
        json_decref(collab);
        snprintf(err, errlen, "field 'config': the training recipe: %s", why[0] ? why : cm_strerror(rc));
        return 0;
    }
    json_t *mp = json_object_get(collab, "model_parameters");
    if (!mp)
        mp = json_object_get(cfg, "model_parameters");
    size_t n = tc->kind == KERN_MODEL_MLP    ? kern_mlp_param_count(&tc->mlp)
               : tc->kind == KERN_MODEL_DMOE ? kern_dmoe_param_count(&tc->dmoe)
                                             : kern_tfm_param_count(&tc->tfm);
    free(tc);
    int ok = 1;
    /* a pipeline's stages hold parts of the model: api_pipeline.c checks those */
    if (mp && !pipeline && (!json_is_integer(mp) || json_integer_value(mp) != (json_int_t)n)) {
        snprintf(err, errlen,
                 "field 'config': model_parameters must be the model's parameter count, %zu", n);
        ok = 0;
    }
    json_decref(collab);
    return ok;
}

/* The parts of a run's config the coordinator itself acts on are checked
 * before anything is stored: config.pipeline (api_pipeline.c), and the
 * training recipe (above). */
static int config_valid(const json_t *cfg, long long target_batch, struct coord_resp *resp)
{
    char err[400];
    if (cfg && (api_pipeline_config_check(cfg, target_batch, err, sizeof err) != CM_OK ||
                !recipe_valid(cfg, err, sizeof err))) {
        coord_resp_error(resp, 400, "invalid_request", "%s", err);
        return 0;
    }
    return 1;
}

static const struct cm_json_field RUN_FIELDS[] = {
    {"name", CM_J_STRING, 1, 1, CM_NAME_MAX},
    {"target_batch_size", CM_J_INT, 1, 1, MAX_TARGET_BATCH},
    {"description", CM_J_STRING, 0, 0, 4096},
    {"model_summary", CM_J_STRING, 0, 0, 1024},
    {"status", CM_J_STRING, 0, 1, 16},
    {"config", CM_J_OBJECT, 0, 1, 0},
};

COORD_DB_STMT(S_RUN_NEW, 7,
              "INSERT INTO runs (name, target_batch_size, description, model_summary, status, "
              "config, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7) "
              "ON CONFLICT (name) DO NOTHING RETURNING " RUN_COLS);

static int commit_with_audit(struct coord_req *req, struct coord_resp *resp, const char *action,
                             const char *target, json_t *details)
{
    int ok = coord_audit(req, action, target, details) == CM_OK &&
             coord_db_cmd(req->db, "COMMIT") == CM_OK;
    json_decref(details);
    if (!ok)
        coord_resp_error(resp, 500, "internal", "could not record the change");
    return ok;
}

void api_runs_create(struct coord_req *req, struct coord_resp *resp)
{
    if (!coord_req_check(req, resp, RUN_FIELDS, sizeof RUN_FIELDS / sizeof RUN_FIELDS[0]))
        return;
    json_t *j = req->json;
    const char *name = json_string_value(json_object_get(j, "name"));
    const char *status = json_string_value(json_object_get(j, "status"));
    if (!cm_name_valid(name)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'name': 1-64 characters of A-Z a-z 0-9 _ . -");
        return;
    }
    if (status && !valid_status(status)) {
        coord_resp_error(resp, 400, "invalid_request", "field 'status': open, paused or finished");
        return;
    }
    json_t *cfg = json_object_get(j, "config");
    if (!config_valid(cfg, json_integer_value(json_object_get(j, "target_batch_size")), resp))
        return;
    char *cfg_s = cfg ? json_dumps(cfg, JSON_COMPACT) : strdup("{}");
    char tbs[24], uid[24];
    snprintf(tbs, sizeof tbs, "%lld",
             (long long)json_integer_value(json_object_get(j, "target_batch_size")));
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *desc = json_string_value(json_object_get(j, "description"));
    const char *model = json_string_value(json_object_get(j, "model_summary"));
    const char *p[] = {name, tbs, desc ? desc : "", model ? model : "", status ? status : "open",
                       cfg_s ? cfg_s : "{}", uid};
    if (!coord_req_db(req, resp)) {
        free(cfg_s);
        return;
    }
    PGresult *r = NULL;
    if (coord_db_cmd(req->db, "BEGIN") == CM_OK)
        r = coord_db_exec(req->db, &S_RUN_NEW, p, NULL);
    free(cfg_s);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 409, "exists", "a run named '%s' exists", name);
        return;
    }
    json_t *out = run_json(r, 0, 1);
    PQclear(r);
    if (!commit_with_audit(req, resp, "run.create", name, json_pack("{s:s}", "target_batch_size", tbs))) {
        json_decref(out);
        return;
    }
    snprintf(resp->location, sizeof resp->location, "/api/v1/runs/%s", name);
    coord_backbone_poke();
    coord_resp_json(resp, 201, out);
}

COORD_DB_STMT(S_RUN_UPDATE, 6,
              "UPDATE runs SET status = coalesce($2, status), description = coalesce($3, "
              "description), model_summary = coalesce($4, model_summary), target_batch_size = "
              "coalesce($5::bigint, target_batch_size), config = coalesce($6::jsonb, config) "
              "WHERE name = $1 RETURNING " RUN_COLS);

void api_runs_update(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"target_batch_size", CM_J_INT, 0, 1, MAX_TARGET_BATCH},
        {"description", CM_J_STRING, 0, 0, 4096},
        {"model_summary", CM_J_STRING, 0, 0, 1024},
        {"status", CM_J_STRING, 0, 1, 16},
        {"config", CM_J_OBJECT, 0, 1, 0},
    };
    if (!api_name_param(req, resp, 0, "run") || !coord_req_check(req, resp, F, 5))
        return;
    json_t *j = req->json;
    if (json_object_size(j) == 0) {
        coord_resp_error(resp, 400, "invalid_request", "nothing to change");
        return;
    }
    const char *status = json_string_value(json_object_get(j, "status"));
    if (status && !valid_status(status)) {
        coord_resp_error(resp, 400, "invalid_request", "field 'status': open, paused or finished");
        return;
    }
    char tbs[24];
    json_t *t = json_object_get(j, "target_batch_size");
    if (t)
        snprintf(tbs, sizeof tbs, "%lld", (long long)json_integer_value(t));
    json_t *cfg = json_object_get(j, "config");
    if (!config_valid(cfg, t ? json_integer_value(t) : 0, resp))
        return;
    char *cfg_s = cfg ? json_dumps(cfg, JSON_COMPACT) : NULL;
    const char *p[] = {req->params[0], status, json_string_value(json_object_get(j, "description")),
                       json_string_value(json_object_get(j, "model_summary")), t ? tbs : NULL,
                       cfg_s};
    PGresult *r = NULL;
    if (coord_req_db(req, resp) && coord_db_cmd(req->db, "BEGIN") == CM_OK)
        r = coord_db_exec(req->db, &S_RUN_UPDATE, p, NULL);
    free(cfg_s);
    if (!r) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no such run");
        return;
    }
    json_t *out = run_json(r, 0, 1);
    PQclear(r);
    if (!commit_with_audit(req, resp, "run.update", req->params[0], json_deep_copy(j))) {
        json_decref(out);
        return;
    }
    if (status)
        coord_backbone_poke();
    coord_resp_json(resp, 200, out);
}

COORD_DB_STMT(S_ALLOW_LIST, 1,
              "SELECT a.username, extract(epoch from a.added_at)::bigint, u.id IS NOT NULL "
              "FROM runs r JOIN run_allowlist a ON a.run_id = r.id "
              "LEFT JOIN users u ON u.username = a.username WHERE r.name = $1 ORDER BY a.username");
COORD_DB_STMT(S_RUN_ID, 1, "SELECT id FROM runs WHERE name = $1");

static int run_exists(struct coord_req *req, struct coord_resp *resp, char id[24])
{
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_RUN_ID, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    int ok = PQntuples(r) == 1;
    if (ok)
        snprintf(id, 24, "%s", PQgetvalue(r, 0, 0));
    else
        coord_resp_error(resp, 404, "not_found", "no such run");
    PQclear(r);
    return ok;
}

void api_allowlist_list(struct coord_req *req, struct coord_resp *resp)
{
    char rid[24];
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp) ||
        !run_exists(req, resp, rid))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_ALLOW_LIST, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(a, json_pack("{s:s, s:I, s:b}", "username", PQgetvalue(r, i, 0),
                                           "added_at",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10),
                                           "has_account", !strcmp(PQgetvalue(r, i, 2), "t")));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "run", req->params[0], "allowlist", a));
}

COORD_DB_STMT(S_ALLOW_ADD, 3,
              "INSERT INTO run_allowlist (run_id, username, added_by) VALUES ($1, $2, $3) "
              "ON CONFLICT DO NOTHING RETURNING username");

void api_allowlist_put(struct coord_req *req, struct coord_resp *resp)
{
    char rid[24], uid[24];
    if (!api_name_param(req, resp, 0, "run"))
        return;
    if (req->nparams < 2 || !cm_name_valid(req->params[1])) {
        coord_resp_error(resp, 400, "invalid_request",
                         "usernames are 1-64 characters of A-Z a-z 0-9 _ . -");
        return;
    }
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK ||
        !run_exists(req, resp, rid)) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {rid, req->params[1], uid};
    PGresult *r = coord_db_exec(req->db, &S_ALLOW_ADD, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int added = PQntuples(r) == 1;
    PQclear(r);
    char target[160];
    snprintf(target, sizeof target, "%s/%s", req->params[0], req->params[1]);
    if (added && !commit_with_audit(req, resp, "allowlist.add", target, NULL))
        return;
    coord_resp_json(resp, added ? 201 : 200,
                    json_pack("{s:s, s:s, s:b}", "run", req->params[0], "username", req->params[1],
                              "added", added));
}

COORD_DB_STMT(S_ALLOW_DEL, 2,
              "DELETE FROM run_allowlist WHERE run_id = $1 AND username = $2 RETURNING username");
/* Removing someone from the allowlist also revokes their passes for the run
 * that are still valid, so they leave the swarm as soon as peers refresh. */
COORD_DB_STMT(S_REVOKE_USER, 3,
              "UPDATE passes p SET revoked_at = now(), revoked_by = $3, "
              "revoke_reason = 'removed from allowlist' FROM users u "
              "WHERE p.run_id = $1 AND p.user_id = u.id AND u.username = $2 "
              "AND p.revoked_at IS NULL AND p.expires_at > now() RETURNING p.id");

void api_allowlist_delete(struct coord_req *req, struct coord_resp *resp)
{
    char rid[24], uid[24];
    if (!api_name_param(req, resp, 0, "run"))
        return;
    if (req->nparams < 2 || !cm_name_valid(req->params[1])) {
        coord_resp_error(resp, 404, "not_found", "no such user on the allowlist");
        return;
    }
    if (!coord_req_db(req, resp) || coord_db_cmd(req->db, "BEGIN") != CM_OK ||
        !run_exists(req, resp, rid)) {
        if (!resp->status)
            coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {rid, req->params[1]};
    PGresult *r = coord_db_exec(req->db, &S_ALLOW_DEL, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int removed = PQntuples(r) == 1;
    PQclear(r);
    if (!removed) {
        coord_resp_error(resp, 404, "not_found", "'%s' is not on the allowlist of '%s'",
                         req->params[1], req->params[0]);
        return;
    }
    const char *p3[] = {rid, req->params[1], uid};
    r = coord_db_exec(req->db, &S_REVOKE_USER, p3, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int revoked = PQntuples(r);
    PQclear(r);
    char target[160];
    snprintf(target, sizeof target, "%s/%s", req->params[0], req->params[1]);
    if (!commit_with_audit(req, resp, "allowlist.remove", target,
                           json_pack("{s:i}", "passes_revoked", revoked)))
        return;
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:s, s:i}", "run", req->params[0], "username", req->params[1],
                              "passes_revoked", revoked));
}
