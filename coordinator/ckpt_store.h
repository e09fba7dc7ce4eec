/* The storage mechanism both kinds of checkpoint upload share
 * (api_checkpoints.c: a run's training state; api_expert_ckpt.c: single
 * experts): the body streams into a locked temporary in the target
 * directory while cm_ckpt_stream verifies it and hashes it; once complete
 * and equal to the announced SHA-256 it is fsync'ed, and the caller inserts
 * its row and renames it to <sha256>.ckpt under the directory's flock.
 * What each kind checks beyond that (steps, shapes, rate limits, trust)
 * stays with its caller. */
#ifndef COORD_CKPT_STORE_H
#define COORD_CKPT_STORE_H

#include "coordinator/api.h"
#include "ckpt/ckpt.h"

#include <stdint.h>

/* Temporary files of uploads in progress, in the target directory. */
#define COORD_UPLOAD_PREFIX ".upload-"

struct coord_upload {
    char dir[4300], tmp[4400];
    char expect[65]; /* the announced SHA-256 */
    int fd;
    struct cm_ckpt_stream ver;
    uint64_t bytes, max_bytes;
};

/* 1 when s is 64 lowercase hex digits. */
int coord_hex64_valid(const char *s);

/* Sets up u for a body of at most max bytes announced as sha; 1, or 0 with
 * a 500 in resp. coord_upload_cleanup releases it either way. */
int coord_upload_init(struct coord_upload *u, const char *sha, uint64_t max, struct coord_resp *resp);
/* Creates parent (when not NULL) and dir, then the locked temporary in dir
 * (the start-up sweep skips a locked file); 1, or 0 with a 500 in resp. */
int coord_upload_open(struct coord_upload *u, const char *parent, const char *dir, struct coord_resp *resp);
/* Closes and removes the temporary at once (a refused upload keeps nothing
 * on disk while the rest of its body is discarded). */
void coord_upload_drop_tmp(struct coord_upload *u);
void coord_upload_cleanup(struct coord_upload *u);

/* A chunk's size limit and format check; CM_OK, or the error with
 * *too_big set when it is the size (the body's or the header's declared
 * total, 413) rather than the format; the temporary is dropped on error. */
int coord_upload_check_chunk(struct coord_upload *u, const char *data, size_t len, int *too_big);
/* Appends a checked chunk to the temporary; CM_OK, or CM_EIO (logged, the
 * temporary dropped). */
int coord_upload_write(struct coord_upload *u, const char *data, size_t len);

/* At the body's end, after the caller answered its own faults: the chunk
 * error, an empty body, the stream's trailer, the announced hash, fsync.
 * 1 with info, got (file hash) and params (parameter hash) filled, or 0
 * with the response set. */
int coord_upload_verify(struct coord_upload *u, int chunk_err, struct coord_resp *resp,
                        struct cm_ckpt_stream_info *info, char got[65], char params[65]);
/* Closes the temporary and renames it to <dir>/<got>.ckpt, then fsyncs the
 * directory; 0 (the temporary is now the content-addressed file), or -1. */
int coord_upload_rename(struct coord_upload *u, const char *got);

/* Deletes <dir>/<sha>.ckpt unless refs (run_id, sha -> count) finds a row
 * of the run still naming it. */
void coord_ckpt_unlink_unreferenced(struct coord_db_conn *db, struct coord_db_stmt *refs,
                                    const char *run_id, const char *dir, const char *sha);

/* Answers 200 with the file at path (its size and hash as recorded, the
 * step in X-Checkpoint-Step), or 503 when it is missing or its size is
 * wrong. */
void coord_ckpt_serve(struct coord_resp *resp, const char *path, const char *sha, uint64_t size,
                      long long step);

/* At start-up, in <dir>/<run>[/<sub>] of every run directory under dir:
 * removes upload temporaries nobody holds locked and .ckpt files that
 * refs_sql ($1 run name, $2 sha -> count) says no row names; logs the
 * count as "<what> file(s)". */
int coord_ckpt_sweep(PGconn *pg, const char *dir, const char *sub, const char *refs_sql,
                     const char *what);

#endif
