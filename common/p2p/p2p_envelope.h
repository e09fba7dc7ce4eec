/* Signed envelopes: the authentication layer of every peer request and
 * response (seed 000_02cc6b5d62a616fc.txt, Appendix H.4).
 *
 * A request carries the sender's access token, the recipient's public key,
 * the sender's time, a random nonce and an Ed25519 signature by the key named
 * in the token over all of it plus the body. A response carries the
 * responder's token, echoes the request's nonce, names the requester's key as
 * recipient, and is signed the same way. The exact signed bytes are in
 * docs/protocol.md ("Signed envelopes").
 *
 * struct p2p_auth holds what a receiver checks against: the coordinator keys,
 * the run, the clock-skew window, a bounded replay cache, a cache of verified
 * tokens and the revocation list, plus one counter per rejection reason.
 * Parsing is a pure function (fuzzed by tests/fuzz/fuzz_p2p_envelope.c);
 * checking is separate so a test can drive each rejection on its own. */
#ifndef P2P_ENVELOPE_H
#define P2P_ENVELOPE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"
#include "cm_token.h"

#define P2P_NONCE_LEN 16
#define P2P_KIND_REQUEST 1
#define P2P_KIND_RESPONSE 2
#define P2P_DEFAULT_SKEW_MS 60000
#define P2P_MAX_COORD_KEYS 8

/* A decoded envelope. Pointers are borrowed from the decoder's storage and
 * live until p2p_envelope_cleanup(). */
struct p2p_envelope {
    uint32_t kind; /* P2P_KIND_* */
    uint32_t type;
    uint64_t request_id;
    const char *token;
    size_t token_len;
    int has_recipient; /* 0 only for key-discovery PINGs, see p2p_auth_check */
    uint8_t recipient[CM_ED25519_PUB_LEN];
    int64_t time_ms;
    uint8_t nonce[P2P_NONCE_LEN];
    uint32_t listen_port;
    int32_t status;
    const uint8_t *body;
    size_t body_len;
    uint8_t sig[CM_ED25519_SIG_LEN];
    void *pb_; /* owned unpacked protobuf message */
};

/* Fields of an envelope to build; body is borrowed. */
struct p2p_envelope_out {
    uint32_t kind, type;
    uint64_t request_id;
    const char *token; /* sender's token */
    const uint8_t *recipient; /* NULL: none (key-discovery PING only) */
    int64_t time_ms;
    uint8_t nonce[P2P_NONCE_LEN];
    uint32_t listen_port;
    int32_t status;
    const uint8_t *body;
    size_t body_len;
};

/* Pure parser: decodes one envelope payload (without the frame header) and
 * bounds every field: kind 1 or 2, token 1..CM_TOKEN_MAX_LEN, recipient 0 or
 * 32 bytes, nonce 16, signature 64, port <= 65535, body within the frame
 * limit. CM_EPARSE on anything else. On success call p2p_envelope_cleanup. */
int p2p_envelope_parse(const uint8_t *buf, size_t len, struct p2p_envelope *env);
void p2p_envelope_cleanup(struct p2p_envelope *env);

/* Serializes and signs `o` with `key` into a complete frame (header plus
 * envelope). *out is heap memory the caller frees. */
int p2p_envelope_build(const struct cm_ed25519 *key, const struct p2p_envelope_out *o,
                       uint8_t **out, size_t *out_len);

/* The bytes the signature covers (fixed size, see docs/protocol.md). */
#define P2P_SIGNED_LEN (17 + 1 + 4 + 8 + 8 + 4 + 4 + 32 + 16 + 32 + 32)
void p2p_envelope_signed_bytes(uint32_t kind, uint32_t type, uint64_t request_id, int64_t time_ms,
                               uint32_t listen_port, int32_t status, const uint8_t *recipient,
                               const uint8_t nonce[P2P_NONCE_LEN], const char *token,
                               size_t token_len, const uint8_t *body, size_t body_len,
                               uint8_t out[P2P_SIGNED_LEN]);

/* Why a message was rejected; each has a counter in p2p_auth. */
enum p2p_reject {
    P2P_REJ_MALFORMED = 0, /* undecodable frame or envelope */
    P2P_REJ_TOKEN,         /* token invalid: bad format, unknown key, bad coordinator signature */
    P2P_REJ_EXPIRED,       /* token expired (or issued in the future) */
    P2P_REJ_REVOKED,       /* token's pass id on the revocation list */
    P2P_REJ_RUN,           /* token for another run */
    P2P_REJ_SIGNATURE,     /* envelope signature does not verify under the token's peer key */
    P2P_REJ_RECIPIENT,     /* recipient key is not ours */
    P2P_REJ_SKEW,          /* time outside the skew window */
    P2P_REJ_REPLAY,        /* nonce seen before (or older than the replay watermark) */
    P2P_REJ_NONCE,         /* response does not echo our request's nonce */
    P2P_REJ_SENDER,        /* response signed by another peer than the one we asked */
    P2P_REJ_COUNT
};
const char *p2p_reject_name(enum p2p_reject r);

struct p2p_auth_config {
    const char *run;                 /* tokens must be for this run */
    const uint8_t (*coord_keys)[CM_ED25519_PUB_LEN];
    size_t n_coord_keys;             /* 1..P2P_MAX_COORD_KEYS */
    int64_t skew_ms;                 /* 0: P2P_DEFAULT_SKEW_MS */
    size_t replay_capacity;          /* 0: 65536 nonces */
    size_t token_cache_capacity;     /* 0: 4096 tokens */
};

struct p2p_replay_entry;
struct p2p_token_slot;

/* Receiver-side verification state, shared by every host of a process.
 * Checks run on the event loop; the revocation list and the counters may be
 * read or replaced from other threads. */
struct p2p_auth {
    char run[CM_NAME_MAX + 1];
    uint8_t coord_keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t n_coord_keys;
    int64_t skew_ms;
    /* replay cache: ring of nonces in arrival order + hash chains */
    struct p2p_replay_entry *ring;
    int32_t *heads;
    size_t ring_cap, ring_len, ring_pos, n_heads;
    int64_t replay_watermark_ms; /* newest time among evicted nonces */
    /* verified-token cache, direct-mapped by SHA-256 of the token */
    struct p2p_token_slot *tokens;
    size_t n_tokens;
    /* revocation list: sorted pass ids */
    pthread_mutex_t rev_mu;
    char **revoked;
    size_t n_revoked;
    int64_t rev_generated_at;
    uint64_t rejects[P2P_REJ_COUNT];
};

int p2p_auth_init(struct p2p_auth *a, const struct p2p_auth_config *cfg);
void p2p_auth_cleanup(struct p2p_auth *a);

/* Replaces the revocation list (pass ids, copied). Thread-safe. A list older
 * than the one in place (generated_at) is ignored. */
int p2p_auth_set_revoked(struct p2p_auth *a, const char *const *pass_ids, size_t n,
                         int64_t generated_at);
int p2p_auth_is_revoked(struct p2p_auth *a, const char *pass_id);

/* Verifies a token (signature against the coordinator keys, time, run,
 * revocation), with a cache of signature checks. */
int p2p_auth_check_token(struct p2p_auth *a, const char *tok, size_t len, int64_t now_ms,
                         struct cm_pass_claims *claims, enum p2p_reject *why);

/* Re-checks the claims of a token verified earlier (a session's peer, see
 * p2p_session.h): not expired (within the skew window), not revoked. */
int p2p_auth_check_claims(struct p2p_auth *a, const struct cm_pass_claims *claims, int64_t now_ms,
                          enum p2p_reject *why);

/* Checks a received request addressed to `self_pub`: token, revocation, run,
 * signature under the token's peer key, recipient, time window, nonce
 * (recorded only when everything else passed). A PING may leave the
 * recipient empty: it is how a peer learns the key behind a bootstrap
 * address; every other type must name us. On rejection returns a negative
 * code, sets *why, counts and logs it. */
int p2p_auth_check_request(struct p2p_auth *a, const struct p2p_envelope *env,
                           const uint8_t self_pub[CM_ED25519_PUB_LEN], int64_t now_ms,
                           struct cm_pass_claims *claims, enum p2p_reject *why);

/* Checks a response to our request with nonce `nonce`; `expect_pub` is the
 * key of the peer we asked (NULL when unknown: bootstrap PING). */
int p2p_auth_check_response(struct p2p_auth *a, const struct p2p_envelope *env,
                            const uint8_t self_pub[CM_ED25519_PUB_LEN],
                            const uint8_t nonce[P2P_NONCE_LEN], const uint8_t *expect_pub,
                            int64_t now_ms, struct cm_pass_claims *claims, enum p2p_reject *why);

/* Counts and logs a rejection (also used by the transport for MALFORMED). */
void p2p_auth_count(struct p2p_auth *a, enum p2p_reject why, const char *detail);
uint64_t p2p_auth_rejects(const struct p2p_auth *a, enum p2p_reject why);

#endif
