/* Session frames: per-connection message authentication after a signed
 * handshake, so that bulk traffic (averaging chunks) costs a MAC per message
 * instead of an Ed25519 signature and a SHA-256 of the body on both sides.
 *
 * Handshake (docs/protocol.md, "Sessions"): the connecting peer sends a
 * HELLO request carrying an ephemeral X25519 public key; the responder
 * answers with its own. Both messages are ordinary signed envelopes, so the
 * exchange is bound to both access passes, both identity keys and the
 * request's nonce. Each side derives two AES-256 keys with HKDF-SHA256 over
 * the X25519 secret and the transcript: one per direction.
 *
 * After the handshake a side may send session frames: frame header with flag
 * P2P_FRAME_F_SESSION, then kind, type, request id, status, body and a
 * 16-byte GMAC tag (AES-256-GCM with empty plaintext) over the frame header
 * and everything before the tag. The GCM nonce is the frame's sequence
 * number in its direction (implicit, counted by both sides), so a replayed,
 * dropped, reordered or modified frame fails the tag and the connection is
 * dropped. Signed envelopes stay valid on a session connection (used before
 * the handshake completes and after a pass renewal).
 *
 * Parsing is a pure function (fuzzed by tests/fuzz/fuzz_p2p_session.c); the
 * MAC state is per connection and direction. */
#ifndef P2P_SESSION_H
#define P2P_SESSION_H

#include <stddef.h>
#include <stdint.h>

#define P2P_FRAME_F_SESSION 1
#define P2P_SESSION_FIELDS_LEN 17 /* kind(1) type(4) request_id(8) status(4) */
#define P2P_SESSION_TAG_LEN 16
/* frame header (8) + fields: what precedes the body */
#define P2P_SESSION_HEAD_LEN (8 + P2P_SESSION_FIELDS_LEN)
#define P2P_KX_LEN 32 /* X25519 public key */
#define P2P_SESSION_KEY_LEN 32

/* A decoded session frame payload; body and tag point into the input. */
struct p2p_session_msg {
    uint32_t kind, type;
    uint64_t request_id;
    int32_t status;
    const uint8_t *body;
    size_t body_len;
    const uint8_t *tag;
};

/* Pure parser of a session frame's payload (after the 8-byte frame header):
 * kind 1 or 2, status 0 or a plausible negative code (as for envelopes),
 * payload at least fields + tag. CM_EPARSE otherwise. The tag is not
 * checked here (p2p_mac_verify). */
int p2p_session_parse(const uint8_t *payload, size_t len, struct p2p_session_msg *m);

/* One direction's MAC state: key schedule and sequence number. */
struct p2p_mac {
    void *evp; /* EVP_CIPHER_CTX */
    uint64_t seq;
};

int p2p_mac_init(struct p2p_mac *m, const uint8_t key[P2P_SESSION_KEY_LEN]);
void p2p_mac_cleanup(struct p2p_mac *m);

/* A piece of a message body (bodies may be gathered from several). */
struct p2p_iov {
    const void *base;
    size_t len;
};

/* Builds a complete session frame (header, fields, body, tag) with the next
 * sequence number; the body is the concatenation of the n pieces. *out is
 * heap memory the caller frees. */
int p2p_session_build(struct p2p_mac *m, uint32_t kind, uint32_t type, uint64_t request_id,
                      int32_t status, const struct p2p_iov *body, size_t n, uint8_t **out,
                      size_t *out_len);

/* The same frame without copying the body: writes the frame header and
 * fields (P2P_SESSION_HEAD_LEN bytes) to head and the tag to tag, with the
 * next sequence number; the frame on the wire is head || body pieces ||
 * tag, bit-identical to what p2p_session_build makes. At most
 * P2P_SESSION_SEAL_MAX_IOV pieces (CM_EINVAL otherwise). */
#define P2P_SESSION_SEAL_MAX_IOV 4
int p2p_session_seal(struct p2p_mac *m, uint32_t kind, uint32_t type, uint64_t request_id,
                     int32_t status, const struct p2p_iov *body, size_t n,
                     uint8_t head[P2P_SESSION_HEAD_LEN], uint8_t tag[P2P_SESSION_TAG_LEN]);

/* Checks the tag of a complete frame (frame = header + payload, len bytes)
 * against the next sequence number, which it consumes on success.
 * CM_EBADSIG on a mismatch. */
int p2p_mac_verify(struct p2p_mac *m, const uint8_t *frame, size_t len);

/* Ephemeral X25519 key of one handshake. */
struct p2p_kx {
    void *pkey; /* EVP_PKEY */
    uint8_t pub[P2P_KX_LEN];
};

int p2p_kx_new(struct p2p_kx *k);
void p2p_kx_cleanup(struct p2p_kx *k);

/* Derives the two directional keys of a session: HKDF-SHA256 with the
 * X25519 secret as input key material, salt "crowdtrain-p2p-v1 session" and
 * info = initiator's identity key, responder's identity key, initiator's and
 * responder's ephemeral keys, the HELLO request's nonce. k_i2r protects what
 * the initiator sends, k_r2i what the responder sends. CM_EAUTH when the
 * peer's key is a low-order point (all-zero secret). */
int p2p_kx_derive(const struct p2p_kx *mine, const uint8_t peer_eph[P2P_KX_LEN],
                  const uint8_t init_pub[32], const uint8_t resp_pub[32],
                  const uint8_t init_eph[P2P_KX_LEN], const uint8_t resp_eph[P2P_KX_LEN],
                  const uint8_t nonce[16], uint8_t k_i2r[P2P_SESSION_KEY_LEN],
                  uint8_t k_r2i[P2P_SESSION_KEY_LEN]);

#endif
