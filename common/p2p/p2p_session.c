/* Session frames and the HELLO key exchange (see p2p_session.h and
 * docs/protocol.md, "Sessions"). OpenSSL does the X25519, HKDF and GMAC
 * (AES-256-GCM over additional data only, NIST SP 800-38D). */
#include "p2p/p2p_session.h"
#include "p2p/p2p_frame.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

static const char SALT[] = "crowdtrain-p2p-v1 session";

static uint64_t get_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static uint8_t *put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

int p2p_session_parse(const uint8_t *payload, size_t len, struct p2p_session_msg *m)
{
    memset(m, 0, sizeof *m);
    if (len < P2P_SESSION_FIELDS_LEN + P2P_SESSION_TAG_LEN || len > P2P_FRAME_MAX_PAYLOAD)
        return CM_EPARSE;
    m->kind = payload[0];
    m->type = (uint32_t)get_be(payload + 1, 4);
    m->request_id = get_be(payload + 5, 8);
    m->status = (int32_t)(uint32_t)get_be(payload + 13, 4);
    if ((m->kind != 1 && m->kind != 2) || m->status > 0 || m->status < -100000)
        return CM_EPARSE;
    m->body = payload + P2P_SESSION_FIELDS_LEN;
    m->body_len = len - P2P_SESSION_FIELDS_LEN - P2P_SESSION_TAG_LEN;
    m->tag = payload + len - P2P_SESSION_TAG_LEN;
    return CM_OK;
}

int p2p_mac_init(struct p2p_mac *m, const uint8_t key[P2P_SESSION_KEY_LEN])
{
    m->seq = 0;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (!c)
        return CM_ENOMEM;
    if (EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
        EVP_CIPHER_CTX_free(c);
        return CM_EINTERNAL;
    }
    m->evp = c;
    return CM_OK;
}

void p2p_mac_cleanup(struct p2p_mac *m)
{
    EVP_CIPHER_CTX_free(m->evp);
    m->evp = NULL;
}

/* GMAC of the concatenated pieces under the key with IV = 0^32 || seq (big
 * endian): GCM's additional data may be fed in pieces, the tag is that of
 * the concatenation. */
static int gmac_iov(struct p2p_mac *m, const struct p2p_iov *v, size_t n, uint8_t tag[16])
{
    EVP_CIPHER_CTX *c = m->evp;
    uint8_t iv[12] = {0};
    put_be(iv + 4, m->seq, 8);
    int ol;
    if (EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) != 1)
        return CM_EINTERNAL;
    for (size_t i = 0; i < n; i++)
        if (v[i].len && (v[i].len > 0x7fffffff ||
                         EVP_EncryptUpdate(c, NULL, &ol, v[i].base, (int)v[i].len) != 1))
            return CM_EINTERNAL;
    if (EVP_EncryptFinal_ex(c, tag, &ol) != 1 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) != 1)
        return CM_EINTERNAL;
    return CM_OK;
}

static int gmac(struct p2p_mac *m, const uint8_t *data, size_t len, uint8_t tag[16])
{
    struct p2p_iov one = {data, len};
    return gmac_iov(m, &one, 1, tag);
}

int p2p_session_seal(struct p2p_mac *m, uint32_t kind, uint32_t type, uint64_t request_id,
                     int32_t status, const struct p2p_iov *body, size_t n,
                     uint8_t head[P2P_SESSION_HEAD_LEN], uint8_t tag[P2P_SESSION_TAG_LEN])
{
    size_t body_len = 0;
    if (n > P2P_SESSION_SEAL_MAX_IOV)
        return CM_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (body[i].len > P2P_FRAME_MAX_PAYLOAD)
            return CM_ETOOBIG;
        body_len += body[i].len;
    }
    size_t plen = P2P_SESSION_FIELDS_LEN + body_len + P2P_SESSION_TAG_LEN;
    if (plen > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    if (!m->evp || m->seq == UINT64_MAX)
        return CM_ESTATE;
    p2p_frame_write_hdr(head, plen);
    head[3] = P2P_FRAME_F_SESSION;
    uint8_t *p = head + P2P_FRAME_HDR_LEN;
    *p++ = (uint8_t)kind;
    p = put_be(p, type, 4);
    p = put_be(p, request_id, 8);
    put_be(p, (uint32_t)status, 4);
    struct p2p_iov v[1 + P2P_SESSION_SEAL_MAX_IOV];
    v[0] = (struct p2p_iov){head, P2P_SESSION_HEAD_LEN};
    for (size_t i = 0; i < n; i++)
        v[1 + i] = body[i];
    int rc = gmac_iov(m, v, 1 + n, tag);
    if (rc)
        return rc;
    m->seq++;
    return CM_OK;
}

int p2p_session_build(struct p2p_mac *m, uint32_t kind, uint32_t type, uint64_t request_id,
                      int32_t status, const struct p2p_iov *body, size_t n, uint8_t **out,
                      size_t *out_len)
{
    size_t body_len = 0;
    for (size_t i = 0; i < n; i++) {
        if (body[i].len > P2P_FRAME_MAX_PAYLOAD)
            return CM_ETOOBIG;
        body_len += body[i].len;
    }
    size_t plen = P2P_SESSION_FIELDS_LEN + body_len + P2P_SESSION_TAG_LEN;
    if (plen > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    if (!m->evp || m->seq == UINT64_MAX)
        return CM_ESTATE;
    uint8_t *b = malloc(P2P_FRAME_HDR_LEN + plen);
    if (!b)
        return CM_ENOMEM;
    p2p_frame_write_hdr(b, plen);
    b[3] = P2P_FRAME_F_SESSION;
    uint8_t *p = b + P2P_FRAME_HDR_LEN;
    *p++ = (uint8_t)kind;
    p = put_be(p, type, 4);
    p = put_be(p, request_id, 8);
    p = put_be(p, (uint32_t)status, 4);
    for (size_t i = 0; i < n; i++) {
        if (body[i].len)
            memcpy(p, body[i].base, body[i].len);
        p += body[i].len;
    }
    int rc = gmac(m, b, (size_t)(p - b), p);
    if (rc) {
        free(b);
        return rc;
    }
    m->seq++;
    *out = b;
    *out_len = P2P_FRAME_HDR_LEN + plen;
    return CM_OK;
}

int p2p_mac_verify(struct p2p_mac *m, const uint8_t *frame, size_t len)
{
    if (!m->evp || len < P2P_FRAME_HDR_LEN + P2P_SESSION_FIELDS_LEN + P2P_SESSION_TAG_LEN ||
        m->seq == UINT64_MAX)
        return CM_EBADSIG;
    uint8_t tag[16];
    int rc = gmac(m, frame, len - P2P_SESSION_TAG_LEN, tag);
    if (rc)
        return rc;
    if (CRYPTO_memcmp(tag, frame + len - P2P_SESSION_TAG_LEN, 16))
        return CM_EBADSIG;
    m->seq++;
    return CM_OK;
}

int p2p_kx_new(struct p2p_kx *k)
{
    memset(k, 0, sizeof *k);
    EVP_PKEY *p = EVP_PKEY_Q_keygen(NULL, NULL, "X25519");
    size_t len = P2P_KX_LEN;
    if (!p || EVP_PKEY_get_raw_public_key(p, k->pub, &len) != 1 || len != P2P_KX_LEN) {
        EVP_PKEY_free(p);
        return CM_EINTERNAL;
    }
    k->pkey = p;
    return CM_OK;
}

void p2p_kx_cleanup(struct p2p_kx *k)
{
    EVP_PKEY_free(k->pkey);
    k->pkey = NULL;
}

int p2p_kx_derive(const struct p2p_kx *mine, const uint8_t peer_eph[P2P_KX_LEN],
                  const uint8_t init_pub[32], const uint8_t resp_pub[32],
                  const uint8_t init_eph[P2P_KX_LEN], const uint8_t resp_eph[P2P_KX_LEN],
                  const uint8_t nonce[16], uint8_t k_i2r[P2P_SESSION_KEY_LEN],
                  uint8_t k_r2i[P2P_SESSION_KEY_LEN])
{
    int rc = CM_EINTERNAL;
    uint8_t secret[32], okm[2 * P2P_SESSION_KEY_LEN], info[4 * 32 + 16];
    size_t slen = sizeof secret;
    EVP_PKEY *peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer_eph, P2P_KX_LEN);
    EVP_PKEY_CTX *dc = peer ? EVP_PKEY_CTX_new(mine->pkey, NULL) : NULL;
    EVP_KDF *kdf = NULL;
    EVP_KDF_CTX *kc = NULL;
    if (!dc || EVP_PKEY_derive_init(dc) != 1 || EVP_PKEY_derive_set_peer(dc, peer) != 1 ||
        EVP_PKEY_derive(dc, secret, &slen) != 1 || slen != sizeof secret) {
        /* OpenSSL refuses an all-zero secret (a low-order peer point). */
        rc = CM_EAUTH;
        goto out;
    }
    memcpy(info, init_pub, 32);
    memcpy(info + 32, resp_pub, 32);
    memcpy(info + 64, init_eph, 32);
    memcpy(info + 96, resp_eph, 32);
    memcpy(info + 128, nonce, 16);
    kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    kc = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
    if (!kc)
        goto out;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, secret, sizeof secret),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)SALT, sizeof SALT - 1),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, sizeof info),
        OSSL_PARAM_construct_end(),
    };
    if (EVP_KDF_derive(kc, okm, sizeof okm, params) != 1)
        goto out;
    memcpy(k_i2r, okm, P2P_SESSION_KEY_LEN);
    memcpy(k_r2i, okm + P2P_SESSION_KEY_LEN, P2P_SESSION_KEY_LEN);
    rc = CM_OK;
out:
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(okm, sizeof okm);
    EVP_KDF_CTX_free(kc);
    EVP_KDF_free(kdf);
    EVP_PKEY_CTX_free(dc);
    EVP_PKEY_free(peer);
    return rc;
}
