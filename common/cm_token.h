/* Access passes (seed 000, Appendix H.4): the token a coordinator gives a
 * volunteer's agent, binding {username, peer public key, run, issued,
 * expiry} under the coordinator's Ed25519 signature. Peers present it on
 * every request; any peer checks it against the coordinator's public key.
 *
 * Encoding: a JWS in compact serialization (RFC 7515) with alg "EdDSA"
 * (RFC 8037), so any standard Ed25519 or JOSE implementation can verify it:
 *     base64url(header) "." base64url(payload) "." base64url(signature)
 * and the signed bytes are the ASCII of the first two parts with the dot.
 * docs/protocol.md describes the exact fields. */
#ifndef CM_TOKEN_H
#define CM_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define CM_TOKEN_MAX_LEN 2048
#define CM_NAME_MAX 64 /* usernames and run names */
#define CM_PASS_ID_MAX 40
#define CM_TOKEN_TYP "crowdtrain-pass+jwt"

struct cm_pass_claims {
    int version; /* 1 */
    char username[CM_NAME_MAX + 1];
    char run[CM_NAME_MAX + 1];
    char pass_id[CM_PASS_ID_MAX + 1]; /* "jti" */
    char kid[CM_KID_LEN + 1];         /* key id of the signing coordinator key */
    uint8_t peer_public_key[CM_ED25519_PUB_LEN];
    int64_t issued_at;  /* unix seconds, "iat" */
    int64_t expires_at; /* unix seconds, "exp" */
};

/* Names: 1..64 characters of [A-Za-z0-9_.-], not starting with '.' or '-'. */
int cm_name_valid(const char *s);

/* Signs the claims with the coordinator key; *out is a heap string the
 * caller frees. The claims' kid is ignored and derived from the key. */
int cm_token_sign(const struct cm_ed25519 *coord_key, const struct cm_pass_claims *claims,
                  char **out);

/* Pure parser for network bytes: splits and decodes a token without checking
 * the signature. On success fills claims, the signature, and the length of
 * the signed prefix (header "." payload). Rejects anything malformed. */
int cm_token_parse(const char *tok, size_t len, struct cm_pass_claims *claims,
                   uint8_t sig[CM_ED25519_SIG_LEN], size_t *signed_len);

/* Full check: parse, find the key whose kid matches among `keys` (n of
 * them), verify the signature, and check time: CM_EEXPIRED when now >=
 * expires_at + skew, CM_EINVAL when issued_at > now + skew. */
int cm_token_verify(const char *tok, size_t len, const uint8_t (*keys)[CM_ED25519_PUB_LEN],
                    size_t n, int64_t now, int64_t skew, struct cm_pass_claims *claims);

#endif
