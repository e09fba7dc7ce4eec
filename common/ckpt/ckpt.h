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
 * the sections are walked as they pass (config without NUL, optimizer
 * buffer names 1..64 bytes, unique, counts within the limits, all of it
 * tiling the file exactly up to the trailer): the verifier accepts exactly
 * what cm_ckpt_parse accepts (tests/fuzz/fuzz_ckpt.c), without buffering
 * more than the header, the trailer and the buffer names. final() checks
 * the trailer hash and yields the SHA-256 of the whole file (the content
 * address) and of the parameter section (the hash agents attest in their
 * contribution reports: docs/checkpoints.md, "Trust"). */
enum cm_ckpt_section {
    CM_CKPT_SEC_HEADER, CM_CKPT_SEC_CONFIG, CM_CKPT_SEC_RNG, CM_CKPT_SEC_PARAMS,
    CM_CKPT_SEC_NAMELEN, CM_CKPT_SEC_NAME, CM_CKPT_SEC_COUNT, CM_CKPT_SEC_DATA, CM_CKPT_SEC_DONE
};
struct cm_ckpt_stream {
    uint64_t received;
    uint64_t total;            /* from the header, 0 until known */
    uint64_t max_total;
    uint8_t head[CM_CKPT_HEADER_BYTES];
    uint8_t tail[CM_CKPT_TRAILER_BYTES]; /* the trailer as it arrives */
    void *body_hash;           /* SHA-256 over [0, total - 32) */
    void *file_hash;           /* SHA-256 over [0, total) */
    void *params_hash;         /* SHA-256 over the parameter section */
    int failed;
    /* the section walk */
    enum cm_ckpt_section sec;
    uint64_t sec_left;         /* bytes of the current section still to come */
    uint8_t field[8];          /* a name length or count as it arrives */
    uint32_t opt_i, name_len;
    char names[CM_CKPT_MAX_BUFS][CM_CKPT_MAX_NAME + 1];
};
/* What a verified stream was. */
struct cm_ckpt_stream_info {
    uint8_t file_sha256[32];   /* the whole file, trailer included */
    uint8_t params_sha256[32]; /* the 4 x n_params bytes of parameters */
    uint64_t step;
    uint64_t n_params;
};
/* max_total bounds the declared size (CM_ETOOBIG above it). */
int cm_ckpt_stream_init(struct cm_ckpt_stream *s, uint64_t max_total);
/* CM_EPARSE / CM_EVERSION / CM_ETOOBIG as soon as the bytes prove it. */
int cm_ckpt_stream_update(struct cm_ckpt_stream *s, const void *data, size_t len);
/* 1 once the header is in and valid, with its step and declared size
 * (either may be NULL); 0 before. Lets a handler refuse a wrong step before
 * the body arrives. */
int cm_ckpt_stream_header(const struct cm_ckpt_stream *s, uint64_t *step, uint64_t *total);
/* CM_EPARSE if fewer bytes than declared arrived, CM_ECHECKSUM if the
 * trailer does not match. On success *info (may be NULL) is filled.
 * Releases the hash contexts in every case. */
int cm_ckpt_stream_final(struct cm_ckpt_stream *s, struct cm_ckpt_stream_info *info);
void cm_ckpt_stream_cleanup(struct cm_ckpt_stream *s);

/* SHA-256 of a whole file, streamed (no full read into memory). */
int cm_ckpt_file_sha256(const char *path, uint8_t out[32], uint64_t *size);

#endif
