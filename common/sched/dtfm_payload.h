/* The signed pipeline assignment on the wire (docs/protocol.md, "Pipeline
 * schedules"; seed 003_f3537b728458fcc1.txt §2-3): the coordinator's
 * encoder, the strict bounded decoder agents run on the bytes they
 * verified (a pure function, fuzzed by tests/fuzz/fuzz_pipeline.c), and
 * the Ed25519 signature with its domain-separation prefix
 * "crowdtrain-pipeline/1\n".
 *
 * A peer verifies the signature over the payload bytes before decoding
 * them, and never re-serializes: dtfm_payload_verify, then
 * dtfm_payload_decode. */
#ifndef DTFM_PAYLOAD_H
#define DTFM_PAYLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define DTFM_PAYLOAD_FORMAT "crowdtrain-pipeline/1"
#define DTFM_PAYLOAD_MAX (1u << 20)  /* largest payload a decoder accepts */
#define DTFM_PAYLOAD_MAX_SLOTS 256   /* stages x replicas */
#define DTFM_PAYLOAD_MAX_SPARES 256
#define DTFM_PAYLOAD_RUN_MAX 64

struct dtfm_payload {
    char run[DTFM_PAYLOAD_RUN_MAX + 1];
    int64_t version, issued_at, valid_from, valid_until;
    char kid[CM_KID_LEN + 1];
    size_t stages, replicas;             /* S in 1..64, D in 1..64, S x D <= 256 */
    double act_bytes, grad_bytes;        /* c_PP and c_DP the solve used */
    uint8_t (*assign)[CM_ED25519_PUB_LEN]; /* replicas x stages, row-major: replica i, stage j */
    uint8_t (*spares)[CM_ED25519_PUB_LEN];
    size_t nspares;
    double total_s, dp_s, pp_s, compute_s; /* predicted seconds per step */
    double random_mean_s;
};

/* Parses payload bytes. Strict: one JSON object of at most
 * DTFM_PAYLOAD_MAX bytes, exactly the documented fields (no others, no
 * duplicates), format DTFM_PAYLOAD_FORMAT (CM_EVERSION otherwise), a valid
 * run name and key id, valid_from < valid_until, version >= 1, D rows of S
 * keys (base64url of 32 bytes), every key once over the assignment and the
 * spares, finite non-negative numbers. CM_OK and *out filled (release with
 * dtfm_payload_cleanup), or an error code with a sentence in err and *out
 * empty. */
int dtfm_payload_decode(const char *buf, size_t len, struct dtfm_payload *out, char *err, size_t cap);
/* The payload bytes, fields in the documented order, compact (*json heap,
 * not NUL-counted in *len). CM_EINVAL for a payload the decoder would
 * refuse. */
int dtfm_payload_encode(const struct dtfm_payload *p, char **json, size_t *len);
void dtfm_payload_cleanup(struct dtfm_payload *p);

/* The tasklet a peer holds: its replica (pipeline) and stage. CM_OK, or
 * CM_ENOTFOUND when the key has no slot (a spare, or not in the run). */
int dtfm_payload_find(const struct dtfm_payload *p, const uint8_t key[CM_ED25519_PUB_LEN], size_t *replica,
                      size_t *stage);

/* Signed bytes = DTFM_PAYLOAD_FORMAT "\n" || payload. */
int dtfm_payload_sign(const struct cm_ed25519 *key, const void *payload, size_t len,
                      uint8_t sig[CM_ED25519_SIG_LEN]);
/* CM_OK, CM_EBADSIG, or CM_EINVAL. */
int dtfm_payload_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *payload, size_t len,
                        const uint8_t sig[CM_ED25519_SIG_LEN]);

#endif
