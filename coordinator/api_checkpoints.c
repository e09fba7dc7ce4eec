/* Checkpoints of a run's full training state (seed 000 §3.3): every K steps
 * one peer uploads it (PUT, streamed to disk while hashing, never held in
 * memory); newcomers and restarted peers download the newest.
 *
 * Durability and visibility: the body goes to a temporary file in the run's
 * directory; only when all of it arrived, its SHA-256 equals the one the
 * uploader announced (X-Checkpoint-SHA256), and it is fsync'ed and renamed
 * to its content address <sha256>.ckpt is a row inserted — so a partial or
 * corrupt upload is never visible, and a crash at any point leaves at most an
 * unreferenced file. The newest --checkpoint-keep rows are kept per run;
 * files no row references any more are deleted. */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "cm_err.h"
#include "cm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_STEP (1LL << 62)

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

static int hex64_valid(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

/* Whether the caller may read or write this run's checkpoints: organizers
 * and auditors always (auditors read only, enforced by the caller), others
 * when allowlisted. Sets resp on refusal. Fills run_id. */
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
    int open = !strcmp(PQgetvalue(r, 0, 1), "open");
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

struct upload {
    struct coord_server *srv;
    char run[CM_NAME_MAX + 1];
    char run_id[24];
    long long step;
    char expect[65];
    char dir[4096];
    char tmp[4200];
    int fd;
    struct cm_sha256_ctx sha;
    uint64_t bytes, max_bytes;
};

static void upload_free(struct upload *u)
{
    if (u->fd >= 0)
        close(u->fd);
    if (u->tmp[0])
        unlink(u->tmp);
    cm_sha256_cleanup(&u->sha);
    free(u);
}

COORD_DB_STMT(S_CK_GET_STEP, 2, "SELECT sha256 FROM checkpoints WHERE run_id = $1 AND step = $2");

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
    if (!hex64_valid(sha)) {
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
    if (!run_access(req, resp, run_id, 1))
        return NULL;
    char steps[24];
    snprintf(steps, sizeof steps, "%lld", step);
    const char *p[] = {run_id, steps};
    PGresult *r = coord_db_exec(req->db, &S_CK_GET_STEP, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return NULL;
    }
    if (PQntuples(r) == 1) {
        int same = !strcmp(PQgetvalue(r, 0, 0), sha);
        PQclear(r);
        if (same)
            coord_resp_json(resp, 200, json_pack("{s:s, s:I, s:s, s:b}", "run", req->params[0],
                                                 "step", (json_int_t)step, "sha256", sha,
                                                 "already_stored", 1));
        else
            coord_resp_error(resp, 409, "conflict",
                             "step %lld of run '%s' already has a different checkpoint", step,
                             req->params[0]);
        return NULL;
    }
    PQclear(r);

    struct upload *u = calloc(1, sizeof *u);
    if (!u) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return NULL;
    }
    u->fd = -1;
    u->srv = req->srv;
    u->step = step;
    u->max_bytes = max;
    snprintf(u->run, sizeof u->run, "%s", req->params[0]);
    snprintf(u->run_id, sizeof u->run_id, "%s", run_id);
    snprintf(u->expect, sizeof u->expect, "%s", sha);
    snprintf(u->dir, sizeof u->dir, "%s/%s", cfg->checkpoint_dir, u->run);
    if (mkdir(u->dir, 0700) != 0 && errno != EEXIST) {
        CM_LOGE("ckpt", "mkdir %s: %s", u->dir, strerror(errno));
        coord_resp_error(resp, 500, "internal", "cannot store checkpoints");
        upload_free(u);
        return NULL;
    }
    snprintf(u->tmp, sizeof u->tmp, "%s/.upload-XXXXXX", u->dir);
    u->fd = mkstemp(u->tmp);
    if (u->fd < 0 || cm_sha256_init(&u->sha) != CM_OK) {
        CM_LOGE("ckpt", "creating %s: %s", u->tmp, strerror(errno));
        if (u->fd < 0)
            u->tmp[0] = '\0';
        coord_resp_error(resp, 500, "internal", "cannot store checkpoints");
        upload_free(u);
        return NULL;
    }
    return u;
}

static int ck_chunk(void *ctx, const char *data, size_t len)
{
    struct upload *u = ctx;
    if (u->bytes + len > u->max_bytes)
        return CM_ETOOBIG;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(u->fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            CM_LOGE("ckpt", "writing %s: %s", u->tmp, strerror(errno));
            return CM_EIO;
        }
        off += (size_t)w;
    }
    u->bytes += len;
    return cm_sha256_update(&u->sha, data, len);
}

static void ck_abort(void *ctx)
{
    upload_free(ctx);
}

COORD_DB_STMT(S_CK_INSERT, 5,
              "INSERT INTO checkpoints (run_id, step, sha256, size_bytes, uploaded_by) "
              "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run_id, step) DO NOTHING RETURNING id");
COORD_DB_STMT(S_CK_PRUNE, 2,
              "DELETE FROM checkpoints WHERE run_id = $1 AND id NOT IN (SELECT id FROM checkpoints "
              "WHERE run_id = $1 ORDER BY step DESC LIMIT $2) RETURNING sha256");
COORD_DB_STMT(S_CK_REFS, 2, "SELECT count(*) FROM checkpoints WHERE run_id = $1 AND sha256 = $2");

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static void ck_end(void *ctx, struct coord_req *req, struct coord_resp *resp, int chunk_err)
{
    struct upload *u = ctx;
    uint8_t h[CM_SHA256_LEN];
    char got[65], final[4300];
    if (chunk_err == CM_ETOOBIG) {
        coord_resp_error(resp, 413, "body_too_large", "checkpoints are limited to %ld MiB",
                         req->srv->cfg->checkpoint_max_mb);
        goto out;
    }
    if (chunk_err != CM_OK) {
        coord_resp_error(resp, 500, "internal", "storing the upload failed: %s", cm_strerror(chunk_err));
        goto out;
    }
    if (u->bytes == 0) {
        coord_resp_error(resp, 400, "invalid_request", "the checkpoint is empty");
        goto out;
    }
    if (cm_sha256_final(&u->sha, h) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "hashing failed");
        goto out;
    }
    cm_hex_encode(h, sizeof h, got);
    if (strcmp(got, u->expect) != 0) {
        coord_resp_error(resp, 422, "checksum_mismatch",
                         "the upload's SHA-256 is %s, not the announced %s; nothing was stored", got,
                         u->expect);
        goto out;
    }
    snprintf(final, sizeof final, "%s/%s.ckpt", u->dir, got);
    if (fsync(u->fd) != 0 || close(u->fd) != 0) {
        u->fd = -1;
        coord_resp_error(resp, 500, "internal", "could not make the checkpoint durable");
        goto out;
    }
    u->fd = -1;
    if (rename(u->tmp, final) != 0 || fsync_dir(u->dir) != 0) {
        coord_resp_error(resp, 500, "internal", "could not store the checkpoint");
        goto out;
    }
    u->tmp[0] = '\0'; /* now the content-addressed file; keep it */
    if (!coord_req_db(req, resp))
        goto out;
    char steps[24], size[24], uid[24], keep[24];
    snprintf(steps, sizeof steps, "%lld", u->step);
    snprintf(size, sizeof size, "%" PRIu64, u->bytes);
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    snprintf(keep, sizeof keep, "%ld", req->srv->cfg->checkpoint_keep);
    const char *p[] = {u->run_id, steps, got, size, uid};
    if (coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    PGresult *r = coord_db_exec(req->db, &S_CK_INSERT, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    int inserted = PQntuples(r) == 1;
    PQclear(r);
    if (!inserted) {
        /* Another upload of the same step won the race; ours is the same
         * content or a conflict. */
        coord_db_cmd(req->db, "ROLLBACK");
        const char *q[] = {u->run_id, steps};
        r = coord_db_exec(req->db, &S_CK_GET_STEP, q, NULL);
        int same = r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), got);
        PQclear(r);
        if (same)
            coord_resp_json(resp, 200, json_pack("{s:s, s:I, s:s, s:b}", "run", u->run, "step",
                                                 (json_int_t)u->step, "sha256", got,
                                                 "already_stored", 1));
        else
            coord_resp_error(resp, 409, "conflict", "step %lld already has a different checkpoint",
                             u->step);
        goto out;
    }
    const char *pp[] = {u->run_id, keep};
    r = coord_db_exec(req->db, &S_CK_PRUNE, pp, NULL);
    json_t *pruned = json_array();
    for (int i = 0; r && i < PQntuples(r); i++)
        json_array_append_new(pruned, json_string(PQgetvalue(r, i, 0)));
    PQclear(r);
    if (!r || coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        json_decref(pruned);
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    /* Delete files no remaining row refers to (a hash may serve two steps). */
    size_t i;
    json_t *e;
    json_array_foreach(pruned, i, e) {
        const char *old = json_string_value(e);
        const char *q[] = {u->run_id, old};
        r = coord_db_exec(req->db, &S_CK_REFS, q, NULL);
        if (r && !strcmp(PQgetvalue(r, 0, 0), "0")) {
            char path[4300];
            snprintf(path, sizeof path, "%s/%s.ckpt", u->dir, old);
            unlink(path);
        }
        PQclear(r);
    }
    CM_LOGI("ckpt", "%s stored step %lld of run %s (%" PRIu64 " bytes, sha256 %.16s...)",
            req->user.username, u->step, u->run, u->bytes, got);
    coord_resp_json(resp, 201, json_pack("{s:s, s:I, s:s, s:I, s:o}", "run", u->run, "step",
                                         (json_int_t)u->step, "sha256", got, "size_bytes",
                                         (json_int_t)u->bytes, "pruned", pruned));
out:
    upload_free(u);
}

const struct coord_stream_ops api_checkpoint_upload = {ck_begin, ck_chunk, ck_end, ck_abort};

COORD_DB_STMT(S_CK_LIST, 1,
              "SELECT c.step, c.sha256, c.size_bytes, extract(epoch from c.uploaded_at)::bigint, "
              "coalesce(u.username, '') FROM checkpoints c LEFT JOIN users u ON u.id = c.uploaded_by "
              "WHERE c.run_id = $1 ORDER BY c.step DESC");

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
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(a, json_pack("{s:I, s:s, s:I, s:I, s:s}", "step",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 0), NULL, 10),
                                           "sha256", PQgetvalue(r, i, 1), "size_bytes",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10),
                                           "uploaded_at",
                                           (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10),
                                           "uploaded_by", PQgetvalue(r, i, 4)));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "run", req->params[0], "checkpoints", a));
}

COORD_DB_STMT(S_CK_LATEST, 1,
              "SELECT step, sha256, size_bytes FROM checkpoints WHERE run_id = $1 "
              "ORDER BY step DESC LIMIT 1");
COORD_DB_STMT(S_CK_STEP, 2,
              "SELECT step, sha256, size_bytes FROM checkpoints WHERE run_id = $1 AND step = $2");

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
        coord_resp_error(resp, 404, "not_found", latest ? "run '%s' has no checkpoint yet"
                                                        : "run '%s' has no checkpoint at that step",
                         req->params[0]);
        return;
    }
    char sha[65], path[4400];
    long long got_step = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    uint64_t size = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    snprintf(sha, sizeof sha, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    snprintf(path, sizeof path, "%s/%s/%s.ckpt", req->srv->cfg->checkpoint_dir, req->params[0], sha);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != size) {
        if (fd >= 0)
            close(fd);
        CM_LOGE("ckpt", "%s: missing or wrong size (is --checkpoint-dir shared by all coordinators?)", path);
        coord_resp_error(resp, 503, "checkpoint_unavailable",
                         "the checkpoint is recorded but its file is not on this coordinator");
        return;
    }
    resp->has_fd = 1;
    resp->fd = fd;
    resp->fd_len = size;
    resp->content_type = "application/octet-stream";
    resp->status = 200;
    snprintf(resp->hdr_name[0], sizeof resp->hdr_name[0], "X-Checkpoint-SHA256");
    snprintf(resp->hdr_value[0], sizeof resp->hdr_value[0], "%s", sha);
    snprintf(resp->hdr_name[1], sizeof resp->hdr_name[1], "X-Checkpoint-Step");
    snprintf(resp->hdr_value[1], sizeof resp->hdr_value[1], "%lld", got_step);
}
