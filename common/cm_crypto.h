/* Cryptographic primitives used across Crowdtrain, all on OpenSSL 3 EVP:
 * Ed25519 keys (coordinator signing key, peer keys), SHA-256, secure random
 * bytes, base64url and hex codecs, and constant-time comparison.
 *
 * Node ids, token key ids and content addresses are all derived from SHA-256
 * (seed 000, Appendix H.4; seed 002, Appendix B). */
#ifndef CM_CRYPTO_H
#define CM_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define CM_ED25519_PUB_LEN 32
#define CM_ED25519_SIG_LEN 64
#define CM_SHA256_LEN 32

/* An Ed25519 key pair (or a public key only, when has_private is 0).
 * Caller-owned: cm_ed25519_cleanup() releases the OpenSSL object. */
struct cm_ed25519 {
    uint8_t pub[CM_ED25519_PUB_LEN];
    int has_private;
    void *pkey; /* EVP_PKEY *, opaque here so callers need no OpenSSL headers */
};

int cm_random_bytes(void *buf, size_t n);
void cm_sha256(const void *data, size_t len, uint8_t out[CM_SHA256_LEN]);

/* Incremental SHA-256 for streams (checkpoints, shards). */
struct cm_sha256_ctx {
    void *md; /* EVP_MD_CTX * */
};
int cm_sha256_init(struct cm_sha256_ctx *c);
int cm_sha256_update(struct cm_sha256_ctx *c, const void *data, size_t len);
/* Writes the digest and releases the context (also on error). */
int cm_sha256_final(struct cm_sha256_ctx *c, uint8_t out[CM_SHA256_LEN]);
void cm_sha256_cleanup(struct cm_sha256_ctx *c);

int cm_ed25519_generate(struct cm_ed25519 *k);
int cm_ed25519_from_public(struct cm_ed25519 *k, const uint8_t pub[CM_ED25519_PUB_LEN]);
/* Loads a PKCS#8 PEM private key; refuses files readable by group/others
 * (CM_EPERM) unless allow_loose_mode. */
int cm_ed25519_load(struct cm_ed25519 *k, const char *path, int allow_loose_mode);
/* Writes the private key as PKCS#8 PEM with mode 0600, atomically
 * (temporary file, fsync, rename). */
int cm_ed25519_save(const struct cm_ed25519 *k, const char *path);
/* Loads `path` if it exists, else generates and saves a new key there. */
int cm_ed25519_load_or_create(struct cm_ed25519 *k, const char *path, int *created);
void cm_ed25519_cleanup(struct cm_ed25519 *k);

int cm_ed25519_sign(const struct cm_ed25519 *k, const void *msg, size_t len,
                    uint8_t sig[CM_ED25519_SIG_LEN]);
/* CM_OK when the signature is valid, CM_EBADSIG when not. */
int cm_ed25519_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *msg, size_t len,
                      const uint8_t sig[CM_ED25519_SIG_LEN]);

/* CM_OK when pub is a usable peer identity; CM_EINVAL when it encodes a
 * point of small order (the eight points of order 1, 2, 4 or 8, which
 * include the all-zero key: signatures under them can be forged without
 * any private key) or is not canonical (y >= 2^255 - 19, a second spelling
 * of some point). */
int cm_ed25519_pub_check(const uint8_t pub[CM_ED25519_PUB_LEN]);

/* base64url without padding (RFC 4648 §5). encoded length = ceil(4n/3). */
size_t cm_b64url_encoded_len(size_t n);
/* Writes a NUL-terminated string; `out` holds at least encoded_len + 1. */
void cm_b64url_encode(const void *in, size_t n, char *out);
/* Decodes exactly `len` characters; rejects padding, whitespace and any
 * character outside the alphabet, and non-canonical trailing bits.
 * On success *outlen is the decoded size (at most cap). */
int cm_b64url_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *outlen);

void cm_hex_encode(const void *in, size_t n, char *out /* 2n + 1 */);
int cm_hex_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *outlen);

/* Constant-time equality of two equal-length buffers: 1 if equal. */
int cm_ct_equal(const void *a, const void *b, size_t n);

/* Short key id: base64url of the first 12 bytes of SHA-256(pub), 16 chars. */
#define CM_KID_LEN 16
void cm_key_id(const uint8_t pub[CM_ED25519_PUB_LEN], char out[CM_KID_LEN + 1]);

#endif
