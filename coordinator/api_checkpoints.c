/* Checkpoints of a run's full training state (seed 000 §3.3): every K steps
 * one peer uploads it (PUT, streamed to disk while verified, never held in
 * memory); newcomers and restarted peers download the newest.
 *
 * Trust (docs/checkpoints.md, "Trust"; issue 22): an upload is checked
 * before it is stored: its step against the run's verified progress (before
 * the body is read), the format's header, sections and trailer as the bytes
 * pass (cm_ckpt_stream), the header's step against the URL's. A stored
 * upload is a candidate; it is *vouched* (served as `latest`, counted for
 * retention) when most verified members of the step that produced it attest
 * its parameter hash in their signed contribution reports, or when an
 * organizer uploaded it. The view checkpoint_trust (sql/008) decides.
 *
 * Durability and visibility: the body goes to a temporary file in the run's
 * directory (locked while written, so a start-up sweep of another
 * coordinator leaves it alone); only when all of it arrived and verified and
 * its SHA-256 equals the one the uploader announced (X-Checkpoint-SHA256) is
 * a row inserted and the file renamed to its content address <sha256>.ckpt,
 * under the run directory's lock. A refused or losing upload's file is
 * removed at once; a crash leaves at most a temporary or unreferenced file,
 * which coord_checkpoints_sweep removes at start-up. The newest
 * --checkpoint-keep vouched checkpoints are kept per run, with the
 * candidates above them; files no row references any more are deleted. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/ckpt_store.h"
#include "ckpt/ckpt.h"
#include "cm_err.h"
#include "cm_log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEP (1LL << 62)   /* what the URL may say; the range check is below */
#define STEP_LIMIT (1LL << 53) /* the highest step a report may carry */
/* A volunteer's checkpoint may be this far beyond the run's verified
 * progress (the highest step other members corroborated): its uploader
 * sends it right after the round whose reports vouch for it, and those
 * reports travel in the background. */
#define STEP_AHEAD 100
/* Unvouched checkpoints one volunteer may hold in a run at once. */
#define CANDIDATES_PER_USER 2

static int parse_step(const char *s, long long *out)
{
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+')
        return 0;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 0 || v > MAX_STEP)
        return 0;
    *out = v;
    return 1;
}

/* Whether the caller may read or write this run's checkpoints: organizers
 * and auditors always (auditors read only, enforced by the caller), others
 * when allowlisted. Sets resp on refusal. Fills run_id. Writing needs an
 * open run, or (write == 2) a finished one: the final state is uploaded
 * after the last round, whose reports may have finished the run already
 * (the caller bounds the step by the run's last). */
COORD_DB_STMT(S_CK_ACCESS, 2,
              "SELECT r.id, r.status, EXISTS (SELECT 1 FROM run_allowlist a WHERE a.run_id = r.id "
              "AND a.username = $2) FROM runs r WHERE r.name = $1");

static int run_access(struct coord_req *req, struct coord_resp *resp, char run_id[24], int write)
{
    if (!coord_req_db(req, resp))
        return 0;
    const char *p[] = {req->params[0], req->user.username};
    PGresult *r = coord_db_exec(req->db, &S_CK_ACCESS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no such run");
        return 0;
    }
    int allow = !strcmp(PQgetvalue(r, 0, 2), "t");
    snprintf(run_id, 24, "%s", PQgetvalue(r, 0, 0));
    int open = !strcmp(PQgetvalue(r, 0, 1), "open") ||
               (write == 2 && !strcmp(PQgetvalue(r, 0, 1), "finished"));
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
    if (write && !open) {
        coord_resp_error(resp, 409, "run_not_open", "run '%s' is not open", req->params[0]);
        return 0;
    }
    return 1;
}

/* Why an upload was refused while its body streamed. */
enum upload_fault { FAULT_NONE, FAULT_FORMAT, FAULT_STEP, FAULT_TOO_BIG, FAULT_IO };

struct upload {
    struct coord_server *srv;
    char run[CM_NAME_MAX + 1];
    char run_id[24];
    long long step;
    int trusted; /* an organizer's upload: vouched by its uploader */
    struct coord_upload up;
    enum upload_fault fault;
    int fault_rc;
    uint64_t header_step;
};

static void upload_free(struct upload *u)
{
    coord_upload_cleanup(&u->up);
    free(u);
}

/* What decides whether an upload at (run, step) with this hash by this
 * user may start: the run's verified progress (highest corroborated step,
 * or an organizer's checkpoint), its configured length, and what is stored
 * at the step already. */
COORD_DB_STMT(S_CK_PLAN, 4,
              "SELECT greatest((SELECT max(s.step) FROM contrib_seen s WHERE s.run_id = $1), "
              "  (SELECT max(k.step) FROM checkpoints k WHERE k.run_id = $1 AND k.trusted)), "
              "(SELECT CASE WHEN jsonb_typeof(r.config->'steps') = 'number' "
              "  THEN (r.config->>'steps')::numeric END FROM runs r WHERE r.id = $1), "
              "EXISTS (SELECT 1 FROM checkpoints WHERE run_id = $1 AND step = $2 AND sha256 = $3), "
              "EXISTS (SELECT 1 FROM checkpoint_trust WHERE run_id = $1 AND step = $2 AND vouched "
              "  AND sha256 <> $3), "
              "EXISTS (SELECT 1 FROM checkpoints WHERE run_id = $1 AND step = $2 AND uploaded_by = $4 "
              "  AND sha256 <> $3), "
              "(SELECT count(*) FROM checkpoint_trust WHERE run_id = $1 AND uploaded_by = $4 "
              "  AND NOT vouched), "
              "(SELECT max(step) FROM checkpoint_trust WHERE run_id = $1 AND vouched), "
              "(SELECT status = 'finished' FROM runs WHERE id = $1)");

static void *ck_begin(struct coord_req *req, struct coord_resp *resp)
{
    const struct coord_config *cfg = req->srv->cfg;
    long long step = 0;
    if (!api_name_param(req, resp, 0, "run"))
        return NULL;
    if (req->nparams < 2 || !parse_step(req->params[1], &step)) {
        coord_resp_error(resp, 400, "invalid_request", "the step must be an integer 0..2^62");
        return NULL;
    }
    const char *sha = coord_req_header(req, "X-Checkpoint-SHA256");
    if (!coord_hex64_valid(sha)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "send the file's SHA-256 as 64 lowercase hex digits in X-Checkpoint-SHA256");
        return NULL;
    }
    uint64_t max = (uint64_t)cfg->checkpoint_max_mb << 20;
    const char *cl = coord_req_header(req, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > max) {
        coord_resp_error(resp, 413, "body_too_large", "checkpoints are limited to %ld MiB",
                         cfg->checkpoint_max_mb);
        return NULL;
    }
    char run_id[24];
    if (!run_access(req, resp, run_id, 2))
        return NULL;
    int trusted = (req->user.role & COORD_ROLE_ORGANIZER) != 0;
    char steps[24], uid[24];
    snprintf(steps, sizeof steps, "%lld", step);
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {run_id, steps, sha, uid};
    PGresult *r = coord_db_exec(req->db, &S_CK_PLAN, p, NULL);
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 500, "internal", "database error");
        return NULL;
    }
    long long progress = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    long long total = PQgetisnull(r, 0, 1) ? -1 : (long long)strtod(PQgetvalue(r, 0, 1), NULL);
    int same = !strcmp(PQgetvalue(r, 0, 2), "t"), vouched_other = !strcmp(PQgetvalue(r, 0, 3), "t");
    int mine_other = !strcmp(PQgetvalue(r, 0, 4), "t");
    long long candidates = strtoll(PQgetvalue(r, 0, 5), NULL, 10);
    long long newest = PQgetisnull(r, 0, 6) ? -1 : strtoll(PQgetvalue(r, 0, 6), NULL, 10);
    int finished = !strcmp(PQgetvalue(r, 0, 7), "t");
    PQclear(r);
    if (same) {
        coord_resp_json(resp, 200, json_pack("{s:s, s:I, s:s, s:b}", "run", req->params[0],
                                             "step", (json_int_t)step, "sha256", sha,
                                             "already_stored", 1));
        return NULL;
    }
    if (finished && total < 0) { /* finished by an organizer: no final state to come */
        coord_resp_error(resp, 409, "run_not_open", "run '%s' is not open", req->params[0]);
        return NULL;
    }
    long long limit = trusted ? STEP_LIMIT : progress + STEP_AHEAD;
    if (total >= 0 && total < limit)
        limit = total;
    if (step > limit) {
        coord_resp_error(resp, 422, "step_out_of_range",
                         "step %lld is beyond what run '%s' can have reached: at most %lld (%s)", step,
                         req->params[0], limit,
                         total >= 0 && limit == total ? "its last step"
                         : trusted ? "the largest step" : "its verified progress + 100");
        return NULL;
    }
    if (vouched_other || mine_other) {
        coord_resp_error(resp, 409, "conflict",
                         vouched_other ? "step %lld of run '%s' already has a different, vouched checkpoint"
                                       : "you already uploaded a different checkpoint for step %lld of run '%s'",
                         step, req->params[0]);
        return NULL;
    }
    if (!trusted && step <= newest) {
        /* retention would drop it at once (S_CK_PRUNE) */
        coord_resp_error(resp, 409, "stale",
                         "run '%s' has a vouched checkpoint of step %lld already; a candidate must "
                         "be newer", req->params[0], newest);
        return NULL;
    }
    if (!trusted && candidates >= CANDIDATES_PER_USER) {
        coord_resp_error(resp, 409, "too_many_candidates",
                         "you hold %lld checkpoints of run '%s' that its members have not vouched "
                         "for yet (at most %d)", candidates, req->params[0], CANDIDATES_PER_USER);
        return NULL;
    }

    struct upload *u = calloc(1, sizeof *u);
    if (!u) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return NULL;
    }
    u->srv = req->srv;
    u->step = step;
    u->trusted = trusted;
    snprintf(u->run, sizeof u->run, "%s", req->params[0]);
    snprintf(u->run_id, sizeof u->run_id, "%s", run_id);
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint_dir, u->run);
    if (!coord_upload_init(&u->up, sha, max, resp) || !coord_upload_open(&u->up, NULL, dir, resp)) {
        upload_free(u);
        return NULL;
    }
    return u;
}

static int ck_chunk(void *ctx, const char *data, size_t len)
{
    struct upload *u = ctx;
    int too_big, rc = coord_upload_check_chunk(&u->up, data, len, &too_big);
    uint64_t declared = 0;
    if (rc != CM_OK) {
        u->fault = too_big ? FAULT_TOO_BIG : FAULT_FORMAT;
        u->fault_rc = rc;
        return rc;
    }
    if (cm_ckpt_stream_header(&u->up.ver, &u->header_step, &declared) &&
        u->header_step != (uint64_t)u->step) {
        u->fault = FAULT_STEP;
        coord_upload_drop_tmp(&u->up);
        return CM_EPARSE;
    }
    if ((rc = coord_upload_write(&u->up, data, len)) != CM_OK)
        u->fault = FAULT_IO;
    return rc;
}

static void ck_abort(void *ctx)
{
    upload_free(ctx);
}

COORD_DB_STMT(S_CK_INSERT, 7,
              "INSERT INTO checkpoints (run_id, step, sha256, size_bytes, uploaded_by, params_sha256, "
              "trusted) VALUES ($1, $2, $3, $4, $5, decode($6, 'hex'), $7) ON CONFLICT DO NOTHING "
              "RETURNING id");
COORD_DB_STMT(S_CK_GET_STEP, 3,
              "SELECT 1 FROM checkpoints WHERE run_id = $1 AND step = $2 AND sha256 = $3");
/* Retention: the newest `keep` vouched checkpoints, and the candidates
 * above the newest vouched one (they may still be vouched); every other
 * row goes. A candidate never pushes a vouched checkpoint out. */
COORD_DB_STMT(S_CK_PRUNE, 2,
              "WITH v AS MATERIALIZED (SELECT id, step, vouched FROM checkpoint_trust WHERE run_id = $1), "
              "keep AS (SELECT id FROM v WHERE vouched ORDER BY step DESC LIMIT $2), "
              "top AS (SELECT max(step) AS s FROM v WHERE vouched) "
              "DELETE FROM checkpoints d USING v WHERE d.id = v.id "
              "AND d.id NOT IN (SELECT id FROM keep) AND (v.vouched OR v.step <= (SELECT s FROM top)) "
              "RETURNING d.sha256");
COORD_DB_STMT(S_CK_REFS, 2, "SELECT count(*) FROM checkpoints WHERE run_id = $1 AND sha256 = $2");
COORD_DB_STMT(S_CK_VOUCHED, 1, "SELECT vouched FROM checkpoint_trust WHERE id = $1");

static void ck_end(void *ctx, struct coord_req *req, struct coord_resp *resp, int chunk_err)
{
    struct upload *u = ctx;
    struct cm_ckpt_stream_info info;
    char got[65], params[65];
    int lock = -1;
    if (u->fault == FAULT_STEP) {
        coord_resp_error(resp, 422, "step_mismatch",
                         "the file's header says step %llu, the URL step %lld; nothing was stored",
                         (unsigned long long)u->header_step, u->step);
        goto out;
    }
    if (u->fault == FAULT_FORMAT) {
        coord_resp_error(resp, 422, "invalid_checkpoint",
                         "not a valid checkpoint file (docs/checkpoints.md): %s; nothing was stored",
                         cm_strerror(u->fault_rc));
        goto out;
    }
    if (chunk_err == CM_ETOOBIG || u->fault == FAULT_TOO_BIG) {
        coord_resp_error(resp, 413, "body_too_large", "checkpoints are limited to %ld MiB",
                         req->srv->cfg->checkpoint_max_mb);
        goto out;
    }
    if (!coord_upload_verify(&u->up, chunk_err, resp, &info, got, params) || !coord_req_db(req, resp))
        goto out;
    char steps[24], size[24], uid[24], keep[24], id[24];
    snprintf(steps, sizeof steps, "%lld", u->step);
    snprintf(size, sizeof size, "%" PRIu64, u->up.bytes);
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    snprintf(keep, sizeof keep, "%ld", req->srv->cfg->checkpoint_keep);
    const char *p[] = {u->run_id, steps, got, size, uid, params, u->trusted ? "t" : "f"};
    if ((lock = coord__dir_lock(u->up.dir)) < 0 || coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not store the checkpoint");
        goto out;
    }
    PGresult *r = coord_db_exec(req->db, &S_CK_INSERT, p, NULL);
    if (!r) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    int inserted = PQntuples(r) == 1;
    if (inserted)
        snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (!inserted) {
        /* A concurrent upload won: the same content (a retry), or another
           of this uploader's for the step. Ours is removed at once. */
        coord_db_cmd(req->db, "ROLLBACK");
        const char *q[] = {u->run_id, steps, got};
        r = coord_db_exec(req->db, &S_CK_GET_STEP, q, NULL);
        int same = r && PQntuples(r) == 1;
        PQclear(r);
        if (same)
            coord_resp_json(resp, 200, json_pack("{s:s, s:I, s:s, s:b}", "run", u->run, "step",
                                                 (json_int_t)u->step, "sha256", got,
                                                 "already_stored", 1));
        else
            coord_resp_error(resp, 409, "conflict", "step %lld already has a different checkpoint of yours",
                             u->step);
        goto out;
    }
    if (coord_upload_rename(&u->up, got) != 0) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "could not store the checkpoint");
        goto out;
    }
    const char *pp[] = {u->run_id, keep};
    r = coord_db_exec(req->db, &S_CK_PRUNE, pp, NULL);
    json_t *pruned = json_array();
    for (int i = 0; r && i < PQntuples(r); i++)
        json_array_append_new(pruned, json_string(PQgetvalue(r, i, 0)));
    PQclear(r);
    if (!r || coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        coord_db_cmd(req->db, "ROLLBACK");
        json_decref(pruned);
        coord_ckpt_unlink_unreferenced(req->db, &S_CK_REFS, u->run_id, u->up.dir, got);
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    /* Delete files no remaining row refers to (a hash may serve two steps). */
    size_t i;
    json_t *e;
    json_array_foreach(pruned, i, e)
        coord_ckpt_unlink_unreferenced(req->db, &S_CK_REFS, u->run_id, u->up.dir, json_string_value(e));
    /* The reports that vouch for it may have arrived before it did. */
    const char *vp[] = {id};
    r = coord_db_exec(req->db, &S_CK_VOUCHED, vp, NULL);
    int vouched = r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    CM_LOGI("ckpt", "%s stored step %lld of run %s (%" PRIu64 " bytes, sha256 %.16s..., %s)",
            req->user.username, u->step, u->run, u->up.bytes, got,
            vouched ? "vouched" : "a candidate until its members vouch for it");
    coord_resp_json(resp, 201, json_pack("{s:s, s:I, s:s, s:s, s:I, s:b, s:o}", "run", u->run,
                                         "step", (json_int_t)u->step, "sha256", got,
                                         "params_sha256", params, "size_bytes",
                                         (json_int_t)u->up.bytes, "vouched", vouched, "pruned", pruned));
out:
    coord__dir_unlock(lock);
    upload_free(u);
}

const struct coord_stream_ops api_checkpoint_upload = {ck_begin, ck_chunk, ck_end, ck_abort};

COORD_DB_STMT(S_CK_LIST, 1,
              "SELECT c.step, c.sha256, c.size_bytes, extract(epoch from c.uploaded_at)::bigint, "
              "coalesce(u.username, ''), c.vouched, c.vouchers, c.attesting, c.trusted "
              "FROM checkpoint_trust c LEFT JOIN users u ON u.id = c.uploaded_by "
              "WHERE c.run_id = $1 ORDER BY c.step DESC, c.id");

/* Vouched checkpoints under "checkpoints" (newest first: what an agent
 * compares its step with), candidates under "candidates". */
void api_checkpoints_list(struct coord_req *req, struct coord_resp *resp)
{
    char run_id[24];
    if (!api_name_param(req, resp, 0, "run") || !run_access(req, resp, run_id, 0))
        return;
    const char *p[] = {run_id};
    PGresult *r = coord_db_exec(req->db, &S_CK_LIST, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array(), *cand = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        int vouched = !strcmp(PQgetvalue(r, i, 5), "t");
        json_array_append_new(
            vouched ? a : cand,
            json_pack("{s:I, s:s, s:I, s:I, s:s, s:b, s:I, s:I, s:b}", "step",
                      (json_int_t)strtoll(PQgetvalue(r, i, 0), NULL, 10), "sha256",
                      PQgetvalue(r, i, 1), "size_bytes",
                      (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10), "uploaded_at",
                      (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "uploaded_by",
                      PQgetvalue(r, i, 4), "vouched", vouched, "vouchers",
                      (json_int_t)strtoll(PQgetvalue(r, i, 6), NULL, 10), "attesting",
                      (json_int_t)strtoll(PQgetvalue(r, i, 7), NULL, 10), "organizer",
                      !strcmp(PQgetvalue(r, i, 8), "t")));
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o, s:o}", "run", req->params[0], "checkpoints", a,
                                         "candidates", cand));
}

COORD_DB_STMT(S_CK_LATEST, 1,
              "SELECT step, sha256, size_bytes FROM checkpoint_trust WHERE run_id = $1 AND vouched "
              "ORDER BY step DESC LIMIT 1");
COORD_DB_STMT(S_CK_STEP, 2,
              "SELECT step, sha256, size_bytes FROM checkpoint_trust WHERE run_id = $1 AND step = $2 "
              "AND vouched ORDER BY id LIMIT 1");

void api_checkpoints_get(struct coord_req *req, struct coord_resp *resp)
{
    char run_id[24];
    long long step = 0;
    int latest = req->nparams > 1 && !strcmp(req->params[1], "latest");
    if (!api_name_param(req, resp, 0, "run"))
        return;
    if (!latest && (req->nparams < 2 || !parse_step(req->params[1], &step))) {
        coord_resp_error(resp, 400, "invalid_request", "use a step number or 'latest'");
        return;
    }
    if (!run_access(req, resp, run_id, 0))
        return;
    char steps[24];
    snprintf(steps, sizeof steps, "%lld", step);
    const char *p[] = {run_id, steps};
    PGresult *r = coord_db_exec(req->db, latest ? &S_CK_LATEST : &S_CK_STEP, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", latest ? "run '%s' has no vouched checkpoint yet"
                                                        : "run '%s' has no vouched checkpoint at that step",
                         req->params[0]);
        return;
    }
    char sha[65], path[4400];
    long long got_step = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    uint64_t size = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    snprintf(sha, sizeof sha, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    snprintf(path, sizeof path, "%s/%s/%s.ckpt", req->srv->cfg->checkpoint_dir, req->params[0], sha);
    coord_ckpt_serve(resp, path, sha, size, got_step);
}

/* --- start-up sweep ---------------------------------------------------------------- */

int coord_checkpoints_sweep(PGconn *pg, const char *dir)
{
    return coord_ckpt_sweep(pg, dir, NULL,
                            "SELECT count(*) FROM checkpoints c JOIN runs r ON r.id = c.run_id "
                            "WHERE r.name = $1 AND c.sha256 = $2",
                            "checkpoint");
}
