/* Checkpoints: the training state in one self-verifying file.
 *
 * A checkpoint holds the parameters (one flat float32 slab), the optimizer
 * state (named float32 buffers: "adam.m", "adam.v", ...), the step, the RNG
 * state (opaque bytes) and the run config (a JSON string). The file ends with
 * the SHA-256 of everything before it; the header carries the total size, so
 * a reader (or an HTTP upload handler, through cm_ckpt_stream) knows where
 * the trailer is before the bytes arrive. Layout: docs/checkpoints.md.
 *
 * Writing is atomic (temporary file in the same directory, fsync, rename,
 * fsync of the directory): a crash leaves the old file or the new one.
 * Reading checks magic, version, every length against the file size and the
 * limits below, then the hash; it fills a fresh struct, so a corrupt or
 * truncated file changes nothing the caller holds.
 *
 * Catching up from the newest state is step 2 of the training protocol
 * (DESIGN.md; seed 000_02cc6b5d62a616fc.txt, §3, and Appendix H). */
#ifndef CM_CKPT_H
#define CM_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define CM_CKPT_MAGIC "CTCKPT\r\n"  /* 8 bytes */
#define CM_CKPT_VERSION 1
#define CM_CKPT_HEADER_BYTES 64
#define CM_CKPT_TRAILER_BYTES 32    /* SHA-256 */

/* Sanity limits a reader enforces (a writer refuses to exceed them too). */
#define CM_CKPT_MAX_NAME 64          /* optimizer buffer name, bytes */
#define CM_CKPT_MAX_BUFS 64          /* optimizer buffers */
#define CM_CKPT_MAX_CONFIG (16u << 20)
#define CM_CKPT_MAX_RNG (1u << 20)
#define CM_CKPT_MAX_FLOATS (1ull << 36) /* per buffer: 256 GiB of float32 */

struct cm_ckpt_buf {
    char name[CM_CKPT_MAX_NAME + 1]; /* NUL-terminated, non-empty, unique */
    float *data;                     /* count floats */
    uint64_t count;
};

/* For cm_ckpt_write the pointers are borrowed from the caller. A struct
 * filled by cm_ckpt_read / cm_ckpt_parse owns them: release with
 * cm_ckpt_cleanup. */
struct cm_ckpt {
    uint64_t step;
    float *params;
    uint64_t n_params;
    struct cm_ckpt_buf *opt;   /* n_opt entries */
    uint32_t n_opt;
    uint8_t *rng;
    uint32_t rng_len;
    char *config;              /* JSON text; NUL-terminated when read */
    uint32_t config_len;       /* bytes, without the NUL */
};

/* Writes c to path atomically. If sha256_out is not NULL it receives the
 * SHA-256 of the whole file (the content address the coordinator uses).
 * CM_EINVAL if c breaks the limits, CM_EIO on write failure (the old file
 * is left as it was). */
int cm_ckpt_write(const char *path, const struct cm_ckpt *c, uint8_t sha256_out[32]);

/* Size in bytes of the file cm_ckpt_write would produce, or 0 if c is
 * invalid. */
uint64_t cm_ckpt_encoded_size(const struct cm_ckpt *c);

/* Reads and verifies path into *out (zeroed first; owned on success,
 * untouched memory-wise on error). Errors: CM_EIO (cannot read), CM_EPARSE
 * (bad magic, truncated, lengths inconsistent with the file size),
 * CM_EVERSION, CM_ETOOBIG (a limit exceeded), CM_ECHECKSUM (hash mismatch),
 * CM_ENOMEM. The reason is logged. */
int cm_ckpt_read(const char *path, struct cm_ckpt *out);

/* Pure variant over a buffer (the fuzz target); same checks, copies out. */
int cm_ckpt_parse(const uint8_t *buf, size_t len, struct cm_ckpt *out);

void cm_ckpt_cleanup(struct cm_ckpt *c);

/* Finds an optimizer buffer by name; borrowed pointer or NULL. */
const struct cm_ckpt_buf *cm_ckpt_find(const struct cm_ckpt *c, const char *name);

/* ---- Streaming verification (HTTP upload/download of a checkpoint) ----
 * Feed the bytes in any chunking; the header is checked as soon as its 64
 * bytes are in, every byte past the declared total size is an error, and
 * final() checks the trailer hash. It also yields the SHA-256 of the whole
 * file, for content addressing. Nothing is buffered beyond 64 + 32 bytes. */
struct cm_ckpt_stream {
    uint64_t received;
    uint64_t total;            /* from the header, 0 until known */
    uint64_t max_total;
    uint8_t head[CM_CKPT_HEADER_BYTES];
    uint8_t tail[CM_CKPT_TRAILER_BYTES]; /* the trailer as it arrives */
    void *body_hash;           /* SHA-256 over [0, total - 32) */
    void *file_hash;           /* SHA-256 over [0, total) */
    int failed;
};
/* max_total bounds the declared size (CM_ETOOBIG above it). */
int cm_ckpt_stream_init(struct cm_ckpt_stream *s, uint64_t max_total);
/* CM_EPARSE / CM_EVERSION / CM_ETOOBIG as soon as the bytes prove it. */
int cm_ckpt_stream_update(struct cm_ckpt_stream *s, const void *data, size_t len);
/* CM_EPARSE if fewer bytes than declared arrived, CM_ECHECKSUM if the
 * trailer does not match. On success file_sha256 (may be NULL) gets the hash
 * of the whole file and *step the header's step (may be NULL). Releases the
 * hash contexts in every case. */
int cm_ckpt_stream_final(struct cm_ckpt_stream *s, uint8_t file_sha256[32], uint64_t *step);
void cm_ckpt_stream_cleanup(struct cm_ckpt_stream *s);

/* SHA-256 of a whole file, streamed (no full read into memory). */
int cm_ckpt_file_sha256(const char *path, uint8_t out[32], uint64_t *size);

#endif
