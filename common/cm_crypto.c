/* OpenSSL-backed implementations of the primitives in cm_crypto.h. OpenSSL
 * errors are logged once here and mapped to CM_ECRYPTO. */
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int ossl_fail(const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    CM_LOGE("crypto", "%s: %s", what, e ? buf : "unknown OpenSSL error");
    ERR_clear_error();
    return CM_ECRYPTO;
}

int cm_random_bytes(void *buf, size_t n)
{
    if (n > (size_t)INT32_MAX)
        return CM_EINVAL;
    if (RAND_bytes(buf, (int)n) != 1)
        return ossl_fail("RAND_bytes");
    return CM_OK;
}

void cm_sha256(const void *data, size_t len, uint8_t out[CM_SHA256_LEN])
{
    unsigned int olen = 0;
    /* EVP_Digest with SHA-256 cannot fail short of memory exhaustion inside
     * OpenSSL; in that case the output is zeroed so nothing silently matches. */
    if (EVP_Digest(data, len, out, &olen, EVP_sha256(), NULL) != 1 || olen != CM_SHA256_LEN) {
        ossl_fail("EVP_Digest");
        memset(out, 0, CM_SHA256_LEN);
    }
}

int cm_sha256_init(struct cm_sha256_ctx *c)
{
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    if (!m)
        return CM_ENOMEM;
    if (EVP_DigestInit_ex(m, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(m);
        return ossl_fail("EVP_DigestInit_ex");
    }
    c->md = m;
    return CM_OK;
}

int cm_sha256_update(struct cm_sha256_ctx *c, const void *data, size_t len)
{
    if (!c->md)
        return CM_ESTATE;
    if (EVP_DigestUpdate(c->md, data, len) != 1)
        return ossl_fail("EVP_DigestUpdate");
    return CM_OK;
}

int cm_sha256_final(struct cm_sha256_ctx *c, uint8_t out[CM_SHA256_LEN])
{
    if (!c->md)
        return CM_ESTATE;
    unsigned int olen = 0;
    int ok = EVP_DigestFinal_ex(c->md, out, &olen) == 1 && olen == CM_SHA256_LEN;
    cm_sha256_cleanup(c);
    return ok ? CM_OK : ossl_fail("EVP_DigestFinal_ex");
}

void cm_sha256_cleanup(struct cm_sha256_ctx *c)
{
    if (c->md)
        EVP_MD_CTX_free(c->md);
    c->md = NULL;
}

static int fill_public(struct cm_ed25519 *k)
{
    size_t len = CM_ED25519_PUB_LEN;
    if (EVP_PKEY_get_raw_public_key(k->pkey, k->pub, &len) != 1 || len != CM_ED25519_PUB_LEN)
        return ossl_fail("EVP_PKEY_get_raw_public_key");
    return CM_OK;
}

int cm_ed25519_generate(struct cm_ed25519 *k)
{
    memset(k, 0, sizeof *k);
    EVP_PKEY *p = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!p)
        return ossl_fail("Ed25519 keygen");
    k->pkey = p;
    k->has_private = 1;
    int rc = fill_public(k);
    if (rc != CM_OK)
        cm_ed25519_cleanup(k);
    return rc;
}

int cm_ed25519_from_public(struct cm_ed25519 *k, const uint8_t pub[CM_ED25519_PUB_LEN])
{
    memset(k, 0, sizeof *k);
    EVP_PKEY *p = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, CM_ED25519_PUB_LEN);
    if (!p)
        return ossl_fail("Ed25519 public key");
    k->pkey = p;
    memcpy(k->pub, pub, CM_ED25519_PUB_LEN);
    return CM_OK;
}

int cm_ed25519_load(struct cm_ed25519 *k, const char *path, int allow_loose_mode)
{
    memset(k, 0, sizeof *k);
    struct stat st;
    if (stat(path, &st) != 0)
        return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    if (!allow_loose_mode && (st.st_mode & 077)) {
        CM_LOGE("crypto", "%s: private key is accessible by group or others (mode %03o); chmod 600 it",
                path, (unsigned)(st.st_mode & 0777));
        return CM_EPERM;
    }
    FILE *f = fopen(path, "r");
    if (!f)
        return CM_EIO;
    EVP_PKEY *p = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!p)
        return ossl_fail("reading Ed25519 private key");
    if (EVP_PKEY_get_id(p) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(p);
        CM_LOGE("crypto", "%s: not an Ed25519 key", path);
        return CM_EINVAL;
    }
    k->pkey = p;
    k->has_private = 1;
    int rc = fill_public(k);
    if (rc != CM_OK)
        cm_ed25519_cleanup(k);
    return rc;
}

int cm_ed25519_save(const struct cm_ed25519 *k, const char *path)
{
    if (!k->has_private)
        return CM_EINVAL;
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return CM_EINVAL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        CM_LOGE("crypto", "%s: %s", tmp, strerror(errno));
        return CM_EIO;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return CM_EIO;
    }
    int ok = PEM_write_PrivateKey(f, k->pkey, NULL, NULL, 0, NULL, NULL) == 1;
    ok = ok && fflush(f) == 0 && fsync(fd) == 0;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        CM_LOGE("crypto", "writing %s failed", path);
        return CM_EIO;
    }
    return CM_OK;
}

int cm_ed25519_load_or_create(struct cm_ed25519 *k, const char *path, int *created)
{
    if (created)
        *created = 0;
    int rc = cm_ed25519_load(k, path, 0);
    if (rc != CM_ENOTFOUND)
        return rc;
    rc = cm_ed25519_generate(k);
    if (rc != CM_OK)
        return rc;
    rc = cm_ed25519_save(k, path);
    if (rc != CM_OK) {
        cm_ed25519_cleanup(k);
        return rc;
    }
    if (created)
        *created = 1;
    return CM_OK;
}

void cm_ed25519_cleanup(struct cm_ed25519 *k)
{
    if (k->pkey)
        EVP_PKEY_free(k->pkey);
    k->pkey = NULL;
    k->has_private = 0;
}

int cm_ed25519_sign(const struct cm_ed25519 *k, const void *msg, size_t len,
                    uint8_t sig[CM_ED25519_SIG_LEN])
{
    if (!k->has_private || !k->pkey)
        return CM_EINVAL;
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    if (!m)
        return CM_ENOMEM;
    size_t slen = CM_ED25519_SIG_LEN;
    int ok = EVP_DigestSignInit(m, NULL, NULL, NULL, k->pkey) == 1 &&
             EVP_DigestSign(m, sig, &slen, msg, len) == 1 && slen == CM_ED25519_SIG_LEN;
    EVP_MD_CTX_free(m);
    return ok ? CM_OK : ossl_fail("Ed25519 sign");
}

int cm_ed25519_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *msg, size_t len,
                      const uint8_t sig[CM_ED25519_SIG_LEN])
{
    EVP_PKEY *p = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, CM_ED25519_PUB_LEN);
    if (!p) {
        ERR_clear_error();
        return CM_EBADSIG;
    }
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    if (!m) {
        EVP_PKEY_free(p);
        return CM_ENOMEM;
    }
    int ok = EVP_DigestVerifyInit(m, NULL, NULL, NULL, p) == 1 &&
             EVP_DigestVerify(m, sig, CM_ED25519_SIG_LEN, msg, len) == 1;
    EVP_MD_CTX_free(m);
    EVP_PKEY_free(p);
    ERR_clear_error();
    return ok ? CM_OK : CM_EBADSIG;
}

/* The y coordinates of the eight points of order dividing 8 (RFC 8032,
 * little-endian, sign bit clear): 0 (order 4), 1 (the identity), p - 1
 * (order 2) and the two y of the points of order 8. The sign bit only picks
 * x, so both spellings of each are refused. Same list as libsodium's
 * ge25519_has_small_order, checked against a direct computation of the
 * 8-torsion subgroup. */
static const uint8_t SMALL_ORDER_Y[5][CM_ED25519_PUB_LEN] = {
    {0},
    {0x01},
    {0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
    {0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98, 0xf0,
     0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05},
    {0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67, 0x0f,
     0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a},
};

int cm_ed25519_pub_check(const uint8_t pub[CM_ED25519_PUB_LEN])
{
    uint8_t y[CM_ED25519_PUB_LEN];
    memcpy(y, pub, sizeof y);
    y[31] &= 0x7f;
    /* y >= p = 2^255 - 19: bytes 1..30 all 0xff, byte 31 0x7f, byte 0 >= 0xed */
    int high = y[31] == 0x7f && y[0] >= 0xed;
    for (int i = 1; i < 31 && high; i++)
        high = y[i] == 0xff;
    if (high)
        return CM_EINVAL;
    for (size_t k = 0; k < sizeof SMALL_ORDER_Y / sizeof SMALL_ORDER_Y[0]; k++)
        if (!memcmp(y, SMALL_ORDER_Y[k], sizeof y))
            return CM_EINVAL;
    return CM_OK;
}

static const char B64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

size_t cm_b64url_encoded_len(size_t n)
{
    return (n / 3) * 4 + (n % 3 == 0 ? 0 : n % 3 + 1);
}

void cm_b64url_encode(const void *in, size_t n, char *out)
{
    const uint8_t *p = in;
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = B64URL[v >> 18 & 63];
        out[o++] = B64URL[v >> 12 & 63];
        out[o++] = B64URL[v >> 6 & 63];
        out[o++] = B64URL[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        out[o++] = B64URL[v >> 18 & 63];
        out[o++] = B64URL[v >> 12 & 63];
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        out[o++] = B64URL[v >> 18 & 63];
        out[o++] = B64URL[v >> 12 & 63];
        out[o++] = B64URL[v >> 6 & 63];
    }
    out[o] = '\0';
}

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

int cm_b64url_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *outlen)
{
    if (len % 4 == 1)
        return CM_EPARSE;
    size_t need = len / 4 * 3 + (len % 4 ? len % 4 - 1 : 0);
    if (need > cap)
        return CM_ETOOBIG;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_val((unsigned char)in[i]);
        if (v < 0)
            return CM_EPARSE;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0) /* non-canonical: leftover bits must be zero */
        return CM_EPARSE;
    *outlen = o;
    return CM_OK;
}

void cm_hex_encode(const void *in, size_t n, char *out)
{
    static const char H[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = H[p[i] >> 4];
        out[2 * i + 1] = H[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_val(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int cm_hex_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *outlen)
{
    if (len % 2)
        return CM_EPARSE;
    if (len / 2 > cap)
        return CM_ETOOBIG;
    for (size_t i = 0; i < len; i += 2) {
        int hi = hex_val((unsigned char)in[i]), lo = hex_val((unsigned char)in[i + 1]);
        if (hi < 0 || lo < 0)
            return CM_EPARSE;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    *outlen = len / 2;
    return CM_OK;
}

int cm_ct_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

void cm_key_id(const uint8_t pub[CM_ED25519_PUB_LEN], char out[CM_KID_LEN + 1])
{
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(pub, CM_ED25519_PUB_LEN, h);
    cm_b64url_encode(h, 12, out);
}
