/* Proof of possession for access passes (issue 22, finding 4): an agent
 * asks for a pass with a request signed by the peer key the pass will bind,
 * so nobody obtains a pass for a key whose private part they lack.
 *
 * The signed bytes (docs/protocol.md, "Pass requests", byte for byte):
 *     "crowdtrain-pass-request/1" LF run LF username LF b64url(peer key) LF
 *     decimal Unix seconds LF b64url(16-byte nonce)
 * LF is 0x0A; names cannot contain it (cm_name_valid), so the fields are
 * unambiguous. The coordinator checks the time against a freshness window
 * and refuses a (key, nonce) it has seen; see coordinator/api_passes.c. */
#ifndef CM_PASSREQ_H
#define CM_PASSREQ_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define CM_PASSREQ_TAG "crowdtrain-pass-request/1"
#define CM_PASSREQ_NONCE_LEN 16
/* tag + 2 names + key + 20-digit time + nonce + 5 LF, rounded up */
#define CM_PASSREQ_BYTES_MAX 320
/* Timestamps beyond this (year ~285 million) are refused: 2^53, what
 * every JSON implementation holds exactly. */
#define CM_PASSREQ_TS_MAX 9007199254740992LL

struct cm_passreq {
    uint8_t peer_public_key[CM_ED25519_PUB_LEN];
    int64_t timestamp; /* Unix seconds, 0..CM_PASSREQ_TS_MAX */
    uint8_t nonce[CM_PASSREQ_NONCE_LEN];
    uint8_t signature[CM_ED25519_SIG_LEN];
};

/* Writes the signed bytes for (run, username, r's key, time and nonce) into
 * out (no NUL added); *len is their length. CM_EINVAL when a name is not
 * valid or the time is out of range, CM_ETOOBIG when cap is short. */
int cm_passreq_signed_bytes(const char *run, const char *username, const struct cm_passreq *r,
                            uint8_t *out, size_t cap, size_t *len);

/* Fills r for `key` (which must hold its private part): its public key, the
 * time ts, a fresh random nonce and the signature. */
int cm_passreq_sign(const struct cm_ed25519 *key, const char *run, const char *username,
                    int64_t ts, struct cm_passreq *r);

/* The request body {"peer_public_key", "timestamp", "nonce", "signature"}
 * (owned by the caller), or NULL when out of memory. */
json_t *cm_passreq_to_json(const struct cm_passreq *r);

/* Pure decoder of a request body (network bytes already parsed as one JSON
 * object): exactly the four fields, strings in canonical base64url of the
 * right decoded length, the time an integer in range. CM_EINVAL with a
 * sentence for the client in err otherwise. Checks neither the key's order
 * nor the signature. */
int cm_passreq_from_json(const json_t *obj, struct cm_passreq *r, char *err, size_t cap);

/* CM_OK when r's key is a usable identity (cm_ed25519_pub_check) and r's
 * signature verifies over the signed bytes for (run, username); CM_EINVAL
 * for a weak key or bad names, CM_EBADSIG for a wrong signature. */
int cm_passreq_verify(const char *run, const char *username, const struct cm_passreq *r);

#endif
