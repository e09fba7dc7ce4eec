/* Checkpoints of single experts of a run's decentralized mixture-of-experts
 * layer (Learning@home, seed 002_2b00836ea4b30f79.txt §3.3: expert servers
 * are volunteers that come and go; issue 18): an expert server uploads each
 * expert it hosts every model.experts.serve.checkpoint_every_s, and a server
 * that takes over an expert whose server left loads the newest one
 * (agent/moe/serve.c; docs/checkpoints.md, "Expert checkpoints").
 *
 *   PUT /api/v1/runs/{run}/experts/{uid}/checkpoint   streamed upload
 *   GET /api/v1/runs/{run}/experts/{uid}/checkpoint   the newest file
 *   GET /api/v1/runs/{run}/experts                    uids, newest of each
 *   GET /api/v1/runs/{run}/experts/servers            who declares each uid now
 *
 * What an upload must be (before anything is stored): the run's model is
 * dmoe and uid is an expert of its grid (prefix, grid_dims, grid_size);
 * the file is a valid checkpoint (cm_ckpt_stream, as the bytes pass) of
 * exactly the expert block's layout (moe_ckpt.h: parameter count, the two
 * moment buffers, no RNG; the header is checked as soon as it is in, so a
 * wrong shape is refused before its body arrives); every value finite; its
 * config names this uid; its SHA-256 the one announced. An uploader may
 * store one checkpoint of a uid per half checkpoint period (429).
 *
 * Trust: no averaging round covers an expert, so nothing vouches for these
 * files the way reports vouch for the run's checkpoints; docs/architecture.md
 * ("Threat model") says what a malicious server can still do.
 *
 * Storage as in api_checkpoints.c, by the same code (ckpt_store.c): a locked temporary in
 * <checkpoint-dir>/<run>/experts/, fsync'ed, a row inserted and the file
 * renamed to <sha256>.ckpt under the directory's flock, the newest
 * EXPERT_KEEP rows per uid kept (files no row names are deleted);
 * coord_expert_ckpt_sweep removes what a crash left at start-up. */
#include "coordinator/api.h"
#include "coordinator/backbone.h"
#include "coordinator/run_cache.h"
#include "coordinator/ckpt_store.h"
#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"
#include "moe/moe_ckpt.h"
#include "moe/moe_grid.h"

#include <inttypes.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPERT_KEEP 2                 /* newest checkpoints kept per uid */
#define EXPERT_DIR "experts"          /* under the run's checkpoint directory */
#define CKPT_EVERY_DEFAULT_S 60       /* model.experts.serve.checkpoint_every_s */

/* The expert layout a run's config implies (agent/train/train_config.c
 * parses the same fields strictly for the agents; here only what an upload
 * is checked against). */
struct xrun {
    struct moe_grid grid;
    int C, F;
    long every_s;
};

static int int_in(json_t *v, long lo, long hi, long *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return 0;
    *out = (long)json_integer_value(v);
    return 1;
}

/* 1 with *x filled when config is a dmoe model whose grid the DHT holds. */
static int xrun_parse(const char *config, struct xrun *x)
{
    json_t *root = json_loads(config, 0, NULL);
    json_t *m = json_object_get(root, "model"), *e = json_object_get(m, "experts");
    json_t *serve = json_object_get(e, "serve"), *hidden = json_object_get(m, "hidden");
    json_t *type = json_object_get(m, "type"), *pre = json_object_get(serve, "prefix");
    long d = 0, size = 0, C = 0, F = 0, every = CKPT_EVERY_DEFAULT_S;
    int ok = json_is_string(type) && !strcmp(json_string_value(type), "dmoe") &&
             int_in(json_object_get(m, "grid_dims"), 1, MOE_MAX_DIMS, &d) &&
             int_in(json_object_get(m, "grid_size"), 2, MOE_MAX_SIZE, &size) &&
             json_array_size(hidden) > 0 &&
             int_in(json_array_get(hidden, json_array_size(hidden) - 1), 1, 65536, &C) &&
             int_in(json_object_get(e, "hidden"), 1, 65536, &F) &&
             (!json_object_get(serve, "checkpoint_every_s") ||
              int_in(json_object_get(serve, "checkpoint_every_s"), 1, 86400, &every)) &&
             (!pre || json_is_string(pre)) &&
             moe_grid_init(&x->grid, pre ? json_string_value(pre) : "ffn", (int)d, (int)size) == CM_OK;
    json_decref(root);
    x->C = (int)C;
    x->F = (int)F;
    x->every_s = every;
    return ok;
}

/* The caller's access to run params[0] and its expert layout; params[1]
 * (when want_uid) must be an expert of the grid. Sets resp on refusal. */
COORD_DB_STMT(S_XC_ACCESS, 2,
              "SELECT r.id, r.status, EXISTS (SELECT 1 FROM run_allowlist a WHERE a.run_id = r.id "
              "AND a.username = $2), r.config::text FROM runs r WHERE r.name = $1");

static int xrun_access(struct coord_req *req, struct coord_resp *resp, int write, int want_uid,
                       char run_id[24], struct xrun *x)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return 0;
    const char *p[] = {req->params[0], req->user.username};
    PGresult *r = coord_db_exec(req->db, &S_XC_ACCESS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no such run");
        return 0;
    }
    snprintf(run_id, 24, "%s", PQgetvalue(r, 0, 0));
    int allow = !strcmp(PQgetvalue(r, 0, 2), "t"), open = !strcmp(PQgetvalue(r, 0, 1), "open");
    int dmoe = xrun_parse(PQgetvalue(r, 0, 3), x);
    PQclear(r);
    unsigned role = req->user.role;
    if (write && role == COORD_ROLE_AUDITOR) {
        coord_resp_error(resp, 403, "forbidden", "auditors cannot upload checkpoints");
        return 0;
    }
    if (!allow && !(role & (COORD_ROLE_ORGANIZER | COORD_ROLE_AUDITOR))) {
        coord_resp_error(resp, 403, "not_allowlisted", "'%s' is not on the allowlist of run '%s'",
                         req->user.username, req->params[0]);
        return 0;
    }
    if (!dmoe) {
        coord_resp_error(resp, 422, "not_dmoe",
                         "run '%s' has no mixture-of-experts layer (its model is not a dmoe whose "
                         "grid expert servers can declare)", req->params[0]);
        return 0;
    }
    if (write && !open) {
        coord_resp_error(resp, 409, "run_not_open", "run '%s' is not open", req->params[0]);
        return 0;
    }
    struct moe_uid u;
    if (want_uid && (req->nparams < 2 || moe_uid_parse(&x->grid, req->params[1], &u) != CM_OK)) {
        coord_resp_error(resp, 404, "unknown_expert",
                         "'%.64s' is not an expert of run '%s' (uids %s.i.j..., %d dimension%s of %d)",
                         req->nparams > 1 ? req->params[1] : "", req->params[0], x->grid.name,
                         x->grid.dims, x->grid.dims == 1 ? "" : "s", x->grid.size);
        return 0;
    }
    return 1;
}

/* ---- upload ------------------------------------------------------------- */

enum xfault { XF_NONE, XF_FORMAT, XF_SHAPE, XF_TOO_BIG, XF_IO };

struct xupload {
    char run[CM_NAME_MAX + 1], run_id[24], uid[MOE_UID_TEXT_MAX];
    int C, F;
    double min_gap;  /* seconds between two stored uploads of the uid by this uploader */
    struct coord_upload up;
    enum xfault fault;
    int fault_rc;
    char why[256];
};

static void xu_free(struct xupload *u)
{
    coord_upload_cleanup(&u->up);
    free(u);
}

/* Seconds since this uploader's newest checkpoint of the uid (NULL: none),
 * and whether the same content is stored for it already. */
COORD_DB_STMT(S_XC_PLAN, 4,
              "SELECT extract(epoch from now() - (SELECT max(uploaded_at) FROM expert_checkpoints "
              "  WHERE run_id = $1 AND uid = $2 AND uploaded_by = $3)), "
              "EXISTS (SELECT 1 FROM expert_checkpoints WHERE run_id = $1 AND uid = $2 AND sha256 = $4)");

static void *xc_begin(struct coord_req *req, struct coord_resp *resp)
{
    const struct coord_config *cfg = req->srv->cfg;
    char run_id[24];
    struct xrun x;
    if (!xrun_access(req, resp, 1, 1, run_id, &x))
        return NULL;
    const char *sha = coord_req_header(req, "X-Checkpoint-SHA256");
    if (!coord_hex64_valid(sha)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "send the file's SHA-256 as 64 lowercase hex digits in X-Checkpoint-SHA256");
        return NULL;
    }
    uint64_t max = moe_ckpt_max_bytes(x.C, x.F);
    const char *cl = coord_req_header(req, "Content-Length");
    if (!max || (cl && strtoull(cl, NULL, 10) > max)) {
        coord_resp_error(resp, 413, "body_too_large",
                         "a checkpoint of one expert of run '%s' is at most %" PRIu64 " bytes", req->params[0], max);
        return NULL;
    }
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {run_id, req->params[1], uid, sha};
    PGresult *r = coord_db_exec(req->db, &S_XC_PLAN, p, NULL);
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 500, "internal", "database error");
        return NULL;
    }
    double since = PQgetisnull(r, 0, 0) ? -1 : strtod(PQgetvalue(r, 0, 0), NULL);
    int same = !strcmp(PQgetvalue(r, 0, 1), "t");
    PQclear(r);
    if (same) {
        coord_resp_json(resp, 200, json_pack("{s:s, s:s, s:s, s:b}", "run", req->params[0], "uid",
                                             req->params[1], "sha256", sha, "already_stored", 1));
        return NULL;
    }
    /* Rate limit: an honest server uploads once per checkpoint period; a
       faulty or hostile one must not churn the uid's newest checkpoints. */
    double min_gap = (double)x.every_s / 2.0;
    if (since >= 0 && since < min_gap) {
        coord_resp_error(resp, 429, "too_many_uploads",
                         "you uploaded a checkpoint of %s %.1f s ago; at most one per %.0f s "
                         "(half of model.experts.serve.checkpoint_every_s)", req->params[1], since, min_gap);
        return NULL;
    }
    struct xupload *u = calloc(1, sizeof *u);
    if (!u) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return NULL;
    }
    u->C = x.C;
    u->F = x.F;
    u->min_gap = min_gap;
    snprintf(u->run, sizeof u->run, "%s", req->params[0]);
    snprintf(u->run_id, sizeof u->run_id, "%s", run_id);
    snprintf(u->uid, sizeof u->uid, "%s", req->params[1]);
    char rdir[4200], dir[4300];
    snprintf(rdir, sizeof rdir, "%s/%s", cfg->checkpoint_dir, u->run);
    snprintf(dir, sizeof dir, "%s/" EXPERT_DIR, rdir);
    if (!coord_upload_init(&u->up, sha, max, resp) || !coord_upload_open(&u->up, rdir, dir, resp)) {
        xu_free(u);
        return NULL;
    }
    return u;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int xc_chunk(void *ctx, const char *data, size_t len)
{
    struct xupload *u = ctx;
    if (u->fault)
        return CM_EPARSE;
    int had_header = u->up.ver.received >= CM_CKPT_HEADER_BYTES;
    int too_big, rc = coord_upload_check_chunk(&u->up, data, len, &too_big);
    if (rc != CM_OK) {
        u->fault = too_big ? XF_TOO_BIG : XF_FORMAT;
        u->fault_rc = rc;
        return rc;
    }
    if (!had_header && cm_ckpt_stream_header(&u->up.ver, NULL, NULL)) {
        /* the layout's counts are in the header (docs/checkpoints.md): a
           wrong shape is refused before its body arrives */
        const uint8_t *h = u->up.ver.head;
        uint64_t n = moe_ckpt_nparams(u->C, u->F), np = le(h + 32, 8);
        uint32_t nopt = (uint32_t)le(h + 40, 4), rng = (uint32_t)le(h + 44, 4), cfg = (uint32_t)le(h + 48, 4);
        if (np != n || nopt != 2 || rng != 0 || cfg > MOE_CKPT_CONFIG_MAX) {
            snprintf(u->why, sizeof u->why,
                     "%" PRIu64 " parameters and %u optimizer buffers (RNG %u bytes, config %u bytes); "
                     "an expert of width %d and hidden %d has %" PRIu64 " parameters and 2 buffers, no "
                     "RNG, a config of at most %d bytes", np, nopt, rng, cfg, u->C, u->F, n,
                     MOE_CKPT_CONFIG_MAX);
            u->fault = XF_SHAPE;
            coord_upload_drop_tmp(&u->up);
            return CM_EINVAL;
        }
    }
    if ((rc = coord_upload_write(&u->up, data, len)) != CM_OK)
        u->fault = XF_IO;
    return rc;
}

static void xc_abort(void *ctx)
{
    xu_free(ctx);
}

/* The rate limit again, inside the insert's transaction and serialized
 * per (run, uid, uploader): two uploads that passed the check on their
 * headers at once cannot both be stored. */
COORD_DB_STMT(S_XC_GAP, 3,
              "SELECT pg_advisory_xact_lock(hashtext('expert-ckpt/' || $1::text || '/' || $2::text || '/' || "
              "  $3::text)), "
              "extract(epoch from clock_timestamp() - (SELECT max(uploaded_at) FROM expert_checkpoints "
              "  WHERE run_id = $1::bigint AND uid = $2::text AND uploaded_by = $3::bigint))");
COORD_DB_STMT(S_XC_INSERT, 7,
              "INSERT INTO expert_checkpoints (run_id, uid, step, sha256, params_sha256, size_bytes, "
              "uploaded_by) VALUES ($1, $2, $3, $4, decode($5, 'hex'), $6, $7) RETURNING id");
/* Keeps the newest EXPERT_KEEP rows of the uid; the deleted rows' files go
 * once no row names them. */
COORD_DB_STMT(S_XC_PRUNE, 3,
              "DELETE FROM expert_checkpoints d WHERE d.run_id = $1 AND d.uid = $2 AND d.id NOT IN "
              "(SELECT id FROM expert_checkpoints WHERE run_id = $1 AND uid = $2 ORDER BY id DESC "
              "LIMIT $3) RETURNING d.sha256");
COORD_DB_STMT(S_XC_REFS, 2, "SELECT count(*) FROM expert_checkpoints WHERE run_id = $1 AND sha256 = $2");

/* The values: the stream verified the format; the file is bounded by the
 * expert's size (a few MiB), so it is read back whole to check every
 * value and the config. */
static int xc_check_values(struct xupload *u)
{
    struct cm_ckpt c;
    int rc = cm_ckpt_read(u->up.tmp, &c);
    if (rc != CM_OK) {
        snprintf(u->why, sizeof u->why, "reading it back: %s", cm_strerror(rc));
        return rc;
    }
    rc = moe_ckpt_check(&c, u->uid, u->C, u->F, u->why, sizeof u->why);
    cm_ckpt_cleanup(&c);
    return rc;
}

static void xc_end(void *ctx, struct coord_req *req, struct coord_resp *resp, int chunk_err)
{
    struct xupload *u = ctx;
    struct cm_ckpt_stream_info info;
    char got[65], params[65];
    int lock = -1, rc;
    if (u->fault == XF_SHAPE) {
        coord_resp_error(resp, 422, "wrong_shape", "not a checkpoint of expert %s: %s; nothing was stored",
                         u->uid, u->why);
        goto out;
    }
    if (u->fault == XF_FORMAT) {
        coord_resp_error(resp, 422, "invalid_checkpoint",
                         "not a valid checkpoint file (docs/checkpoints.md): %s; nothing was stored",
                         cm_strerror(u->fault_rc));
        goto out;
    }
    if (chunk_err == CM_ETOOBIG || u->fault == XF_TOO_BIG) {
        coord_resp_error(resp, 413, "body_too_large", "a checkpoint of expert %s is at most %" PRIu64 " bytes",
                         u->uid, u->up.max_bytes);
        goto out;
    }
    if (!coord_upload_verify(&u->up, chunk_err, resp, &info, got, params))
        goto out;
    if ((rc = xc_check_values(u)) != CM_OK) {
        coord_resp_error(resp, 422, rc == CM_EINVAL ? "wrong_shape" : "invalid_checkpoint",
                         "not a usable checkpoint of expert %s: %s; nothing was stored", u->uid, u->why);
        goto out;
    }
    if (!coord_req_db(req, resp))
        goto out;
    char steps[24], size[24], by[24], keep[8], id[24];
    snprintf(steps, sizeof steps, "%" PRIu64, info.step);
    snprintf(size, sizeof size, "%" PRIu64, u->up.bytes);
    snprintf(by, sizeof by, "%lld", (long long)req->user.id);
    snprintf(keep, sizeof keep, "%d", EXPERT_KEEP);
    if (info.step > (uint64_t)INT64_MAX) {
        coord_resp_error(resp, 422, "invalid_checkpoint", "step %" PRIu64 " is out of range", info.step);
        goto out;
    }
    if ((lock = coord__dir_lock(u->up.dir)) < 0 || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not store the checkpoint");
        goto out;
    }
    const char *gp[] = {u->run_id, u->uid, by};
    PGresult *r = coord_db_exec(req->db, &S_XC_GAP, gp, NULL);
    double since = r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 1) ? strtod(PQgetvalue(r, 0, 1), NULL) : -1;
    if (!r) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    PQclear(r);
    if (since >= 0 && since < u->min_gap) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 429, "too_many_uploads",
                         "another upload of yours of %s was stored %.1f s ago; at most one per %.0f s", u->uid,
                         since, u->min_gap);
        goto out;
    }
    const char *p[] = {u->run_id, u->uid, steps, got, params, size, by};
    r = coord_db_exec(req->db, &S_XC_INSERT, p, NULL);
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (coord_upload_rename(&u->up, got) != 0) { /* a row names it once committed */
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "could not store the checkpoint");
        goto out;
    }
    const char *pp[] = {u->run_id, u->uid, keep};
    r = coord_db_exec(req->db, &S_XC_PRUNE, pp, NULL);
    json_t *pruned = json_array();
    for (int i = 0; r && i < PQntuples(r); i++)
        json_array_append_new(pruned, json_string(PQgetvalue(r, i, 0)));
    int pruned_ok = r != NULL;
    PQclear(r);
    if (!pruned_ok || coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        coord_db_cmd(req->db, "ROLLBACK");
        json_decref(pruned);
        coord_ckpt_unlink_unreferenced(req->db, &S_XC_REFS, u->run_id, u->up.dir, got);
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(pruned, i, e)
        coord_ckpt_unlink_unreferenced(req->db, &S_XC_REFS, u->run_id, u->up.dir, json_string_value(e));
    CM_LOGI("ckpt", "%s stored expert %s of run %s at step %" PRIu64 " (%" PRIu64 " bytes, sha256 %.16s...)",
            req->user.username, u->uid, u->run, info.step, u->up.bytes, got);
    coord_resp_json(resp, 201, json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:o}", "run", u->run, "uid", u->uid,
                                         "step", (json_int_t)info.step, "sha256", got, "params_sha256",
                                         params, "size_bytes", (json_int_t)u->up.bytes, "pruned", pruned));
out:
    coord__dir_unlock(lock);
    xu_free(u);
}

const struct coord_stream_ops api_expert_ckpt_upload = {xc_begin, xc_chunk, xc_end, xc_abort};

/* ---- reading ------------------------------------------------------------ */

COORD_DB_STMT(S_XC_NEWEST, 2,
              "SELECT step, sha256, size_bytes, extract(epoch from uploaded_at)::bigint "
              "FROM expert_checkpoints WHERE run_id = $1 AND uid = $2 ORDER BY id DESC LIMIT 1");

void api_expert_ckpt_get(struct coord_req *req, struct coord_resp *resp)
{
    char run_id[24];
    struct xrun x;
    if (!xrun_access(req, resp, 0, 1, run_id, &x))
        return;
    const char *p[] = {run_id, req->params[1]};
    PGresult *r = coord_db_exec(req->db, &S_XC_NEWEST, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "expert %s of run '%s' has no checkpoint yet", req->params[1],
                         req->params[0]);
        return;
    }
    char sha[65], path[4500];
    long long step = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    uint64_t size = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    snprintf(sha, sizeof sha, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    snprintf(path, sizeof path, "%s/%s/" EXPERT_DIR "/%s.ckpt", req->srv->cfg->checkpoint_dir, req->params[0],
             sha);
    coord_ckpt_serve(resp, path, sha, size, step);
}

COORD_DB_STMT(S_XC_LIST, 1,
              "SELECT DISTINCT ON (c.uid) c.uid, c.step, c.sha256, c.size_bytes, "
              "extract(epoch from c.uploaded_at)::bigint, coalesce(u.username, '') "
              "FROM expert_checkpoints c LEFT JOIN users u ON u.id = c.uploaded_by "
              "WHERE c.run_id = $1 ORDER BY c.uid, c.id DESC");

void api_expert_ckpt_list(struct coord_req *req, struct coord_resp *resp)
{
    char run_id[24];
    struct xrun x;
    if (!xrun_access(req, resp, 0, 0, run_id, &x))
        return;
    const char *p[] = {run_id};
    PGresult *r = coord_db_exec(req->db, &S_XC_LIST, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(
            a, json_pack("{s:s, s:I, s:s, s:I, s:I, s:s}", "uid", PQgetvalue(r, i, 0), "step",
                         (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10), "sha256", PQgetvalue(r, i, 2),
                         "size_bytes", (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "uploaded_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "uploaded_by",
                         PQgetvalue(r, i, 5)));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:s, s:o}", "run", req->params[0], "prefix", x.grid.name,
                                         "experts", a));
}

/* ---- live servers --------------------------------------------------------- */

/* Pages poll every few seconds: one DHT read per run per 3 s. */
static struct coord_run_cache g_servers = COORD_RUN_CACHE_INIT(3);
#define SERVERS_DEADLINE_MS 3000

void api_expert_servers(struct coord_req *req, struct coord_resp *resp)
{
    char run_id[24];
    struct xrun x;
    if (!xrun_access(req, resp, 0, 0, run_id, &x))
        return;
    const char *run = req->params[0];
    if (coord_run_cache_serve(&g_servers, run, resp))
        return;
    json_t *ex = NULL;
    int complete = 0;
    int rc = coord_backbone_moe_servers(run, &x.grid, SERVERS_DEADLINE_MS, &ex, &complete);
    if (rc == CM_ENOTFOUND) {
        coord_resp_error(resp, 409, "no_backbone",
                         "this coordinator runs no DHT node for run '%s' (the run is not open, or the "
                         "DHT is off)", run);
        return;
    }
    if (rc == CM_ERANGE) {
        coord_resp_error(resp, 422, "grid_too_large",
                         "run '%s' has more than %d leaf keys (grid of %d dimensions of %d): too many to read "
                         "for one page", run, COORD_MOE_MAX_LEAVES, x.grid.dims, x.grid.size);
        return;
    }
    if (rc != CM_OK) {
        coord_resp_error(resp, 500, "internal", "reading the DHT: %s", cm_strerror(rc));
        return;
    }
    /* distinct servers, by key */
    json_t *keys = json_object();
    size_t i;
    json_t *e;
    json_array_foreach(ex, i, e) {
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(e, "servers"), k, s)
            json_object_set(keys, json_string_value(json_object_get(s, "peer")), json_true());
    }
    json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:b, s:I, s:I, s:o}", "run", run, "prefix", x.grid.name,
                             "grid_dims", x.grid.dims, "grid_size", x.grid.size, "complete", complete,
                             "servers", (json_int_t)json_object_size(keys), "read_at", (json_int_t)time(NULL),
                             "experts", ex);
    json_decref(keys);
    if (!body) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    coord_run_cache_store(&g_servers, run, body);
    coord_resp_json(resp, 200, body);
}

/* ---- start-up sweep ----------------------------------------------------- */

int coord_expert_ckpt_sweep(PGconn *pg, const char *dir)
{
    return coord_ckpt_sweep(pg, dir, EXPERT_DIR,
                            "SELECT count(*) FROM expert_checkpoints c JOIN runs r ON r.id = c.run_id "
                            "WHERE r.name = $1 AND c.sha256 = $2",
                            "expert checkpoint");
}
