/* The storage mechanism of checkpoint uploads, shared by api_checkpoints.c
 * and api_expert_ckpt.c (ckpt_store.h). */
#include "coordinator/ckpt_store.h"
#include "cm_err.h"
#include "cm_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int coord_hex64_valid(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

int coord__fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* The directory's lock: held from the row's insert to the last unlink,
 * so a file is never removed while a row that names it is being written
 * (two uploads of the same content, a prune, the start-up sweep). flock
 * works across coordinators sharing --checkpoint-dir on one machine. */
int coord__dir_lock(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

void coord__dir_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

/* ---- upload ------------------------------------------------------------- */

int coord_upload_init(struct coord_upload *u, const char *sha, uint64_t max, struct coord_resp *resp)
{
    u->fd = -1;
    u->tmp[0] = '\0';
    u->bytes = 0;
    u->max_bytes = max;
    snprintf(u->expect, sizeof u->expect, "%s", sha);
    if (cm_ckpt_stream_init(&u->ver, max) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return 0;
    }
    return 1;
}

int coord_upload_open(struct coord_upload *u, const char *parent, const char *dir, struct coord_resp *resp)
{
    snprintf(u->dir, sizeof u->dir, "%s", dir);
    if ((parent && mkdir(parent, 0700) != 0 && errno != EEXIST) ||
        (mkdir(u->dir, 0700) != 0 && errno != EEXIST)) {
        CM_LOGE("ckpt", "mkdir %s: %s", u->dir, strerror(errno));
        coord_resp_error(resp, 500, "internal", "cannot store checkpoints");
        return 0;
    }
    snprintf(u->tmp, sizeof u->tmp, "%s/" COORD_UPLOAD_PREFIX "XXXXXX", u->dir);
    u->fd = mkostemp(u->tmp, O_CLOEXEC);
    /* held while the upload lives: the start-up sweep skips a locked file */
    if (u->fd < 0 || flock(u->fd, LOCK_EX | LOCK_NB) != 0) {
        CM_LOGE("ckpt", "creating %s: %s", u->tmp, strerror(errno));
        if (u->fd < 0)
            u->tmp[0] = '\0';
        coord_resp_error(resp, 500, "internal", "cannot store checkpoints");
        return 0;
    }
    return 1;
}

void coord_upload_drop_tmp(struct coord_upload *u)
{
    if (u->fd >= 0)
        close(u->fd);
    u->fd = -1;
    if (u->tmp[0])
        unlink(u->tmp);
    u->tmp[0] = '\0';
}

void coord_upload_cleanup(struct coord_upload *u)
{
    coord_upload_drop_tmp(u);
    cm_ckpt_stream_cleanup(&u->ver);
}

int coord_upload_check_chunk(struct coord_upload *u, const char *data, size_t len, int *too_big)
{
    *too_big = 0;
    if (u->bytes + len > u->max_bytes) {
        *too_big = 1;
        coord_upload_drop_tmp(u);
        return CM_ETOOBIG;
    }
    int rc = cm_ckpt_stream_update(&u->ver, data, len);
    if (rc != CM_OK) {
        /* the header's total size (offset 16, docs/checkpoints.md) above
           the limit is 413; every other refusal says the file is malformed */
        uint64_t declared = 0;
        for (int i = 0; i < 8 && u->ver.received >= CM_CKPT_HEADER_BYTES; i++)
            declared |= (uint64_t)u->ver.head[16 + i] << (8 * i);
        *too_big = rc == CM_ETOOBIG && declared > u->max_bytes;
        coord_upload_drop_tmp(u);
    }
    return rc;
}

int coord_upload_write(struct coord_upload *u, const char *data, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(u->fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            CM_LOGE("ckpt", "writing %s: %s", u->tmp, strerror(errno));
            coord_upload_drop_tmp(u);
            return CM_EIO;
        }
        off += (size_t)w;
    }
    u->bytes += len;
    return CM_OK;
}

int coord_upload_verify(struct coord_upload *u, int chunk_err, struct coord_resp *resp,
                        struct cm_ckpt_stream_info *info, char got[65], char params[65])
{
    int rc;
    if (chunk_err != CM_OK) {
        coord_resp_error(resp, 500, "internal", "storing the upload failed: %s", cm_strerror(chunk_err));
        return 0;
    }
    if (u->bytes == 0) {
        coord_resp_error(resp, 400, "invalid_request", "the checkpoint is empty");
        return 0;
    }
    if ((rc = cm_ckpt_stream_final(&u->ver, info)) != CM_OK) {
        coord_resp_error(resp, 422, "invalid_checkpoint",
                         "not a valid checkpoint file (docs/checkpoints.md): %s; nothing was stored",
                         rc == CM_EPARSE ? "shorter than its header declares" : cm_strerror(rc));
        return 0;
    }
    cm_hex_encode(info->file_sha256, sizeof info->file_sha256, got);
    cm_hex_encode(info->params_sha256, sizeof info->params_sha256, params);
    if (strcmp(got, u->expect) != 0) {
        coord_resp_error(resp, 422, "checksum_mismatch",
                         "the upload's SHA-256 is %s, not the announced %s; nothing was stored", got,
                         u->expect);
        return 0;
    }
    if (fsync(u->fd) != 0) {
        coord_resp_error(resp, 500, "internal", "could not make the checkpoint durable");
        return 0;
    }
    return 1;
}

int coord_upload_rename(struct coord_upload *u, const char *got)
{
    char final[4500];
    snprintf(final, sizeof final, "%s/%s.ckpt", u->dir, got);
    close(u->fd);
    u->fd = -1;
    if (rename(u->tmp, final) != 0 || coord__fsync_dir(u->dir) != 0)
        return -1;
    u->tmp[0] = '\0'; /* now the content-addressed file */
    return 0;
}

void coord_ckpt_unlink_unreferenced(struct coord_db_conn *db, struct coord_db_stmt *refs,
                                    const char *run_id, const char *dir, const char *sha)
{
    const char *q[] = {run_id, sha};
    PGresult *r = coord_db_exec(db, refs, q, NULL);
    if (r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "0")) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s.ckpt", dir, sha);
        unlink(path);
    }
    PQclear(r);
}

/* ---- reading ------------------------------------------------------------ */

void coord_ckpt_serve(struct coord_resp *resp, const char *path, const char *sha, uint64_t size,
                      long long step)
{
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
    snprintf(resp->hdr_value[1], sizeof resp->hdr_value[1], "%lld", step);
}

/* ---- start-up sweep ----------------------------------------------------- */

/* Removes what uploads left behind in one directory: temporary files
 * nobody holds locked (their upload died with its process) and .ckpt files
 * no row of the run names (a crash between the rename and the commit, or a
 * run deleted since). Returns the number of files removed. */
static int sweep_dir(PGconn *pg, const char *xdir, const char *run, const char *refs_sql)
{
    int lock = coord__dir_lock(xdir);
    DIR *d = lock >= 0 ? opendir(xdir) : NULL;
    if (!d) {
        coord__dir_unlock(lock);
        return 0;
    }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", xdir, e->d_name);
        size_t n = strlen(e->d_name);
        if (!strncmp(e->d_name, COORD_UPLOAD_PREFIX, strlen(COORD_UPLOAD_PREFIX))) {
            int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(path) == 0)
                removed++;
            if (fd >= 0)
                close(fd);
        } else if (n == 64 + 5 && !strcmp(e->d_name + 64, ".ckpt")) {
            char sha[65];
            memcpy(sha, e->d_name, 64);
            sha[64] = '\0';
            if (!coord_hex64_valid(sha))
                continue;
            const char *p[] = {run, sha};
            PGresult *r = PQexecParams(pg, refs_sql, 2, NULL, p, NULL, NULL, 0);
            if (PQresultStatus(r) == PGRES_TUPLES_OK && !strcmp(PQgetvalue(r, 0, 0), "0") &&
                unlink(path) == 0)
                removed++;
            PQclear(r);
        }
    }
    closedir(d);
    coord__dir_unlock(lock);
    return removed;
}

int coord_ckpt_sweep(PGconn *pg, const char *dir, const char *sub, const char *refs_sql,
                     const char *what)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? CM_OK : CM_EIO;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (cm_name_valid(e->d_name)) {
            char xdir[4300];
            if (sub)
                snprintf(xdir, sizeof xdir, "%s/%s/%s", dir, e->d_name, sub);
            else
                snprintf(xdir, sizeof xdir, "%s/%s", dir, e->d_name);
            removed += sweep_dir(pg, xdir, e->d_name, refs_sql);
        }
    closedir(d);
    if (removed)
        CM_LOGI("ckpt", "removed %d %s file%s left by interrupted or refused uploads", removed, what,
                removed == 1 ? "" : "s");
    return CM_OK;
}
