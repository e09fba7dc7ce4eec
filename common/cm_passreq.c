/* Pass requests signed by the peer key: the canonical signed bytes, the
 * signing side (agents, tests, benchmarks) and the pure decoder the
 * coordinator runs on request bodies. See cm_passreq.h and
 * docs/protocol.md, "Pass requests". */
#include "cm_passreq.h"
#include "cm_err.h"
#include "cm_json.h"
#include "cm_token.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int cm_passreq_signed_bytes(const char *run, const char *username, const struct cm_passreq *r,
                            uint8_t *out, size_t cap, size_t *len)
{
    if (!run || !username || !cm_name_valid(run) || !cm_name_valid(username) || r->timestamp < 0 ||
        r->timestamp > CM_PASSREQ_TS_MAX)
        return CM_EINVAL;
    char pk[64], nonce[32];
    cm_b64url_encode(r->peer_public_key, CM_ED25519_PUB_LEN, pk);
    cm_b64url_encode(r->nonce, CM_PASSREQ_NONCE_LEN, nonce);
    int n = snprintf((char *)out, cap, CM_PASSREQ_TAG "\n%s\n%s\n%s\n%" PRId64 "\n%s", run, username,
                     pk, r->timestamp, nonce);
    if (n < 0 || (size_t)n >= cap)
        return CM_ETOOBIG;
    *len = (size_t)n;
    return CM_OK;
}

int cm_passreq_sign(const struct cm_ed25519 *key, const char *run, const char *username,
                    int64_t ts, struct cm_passreq *r)
{
    memset(r, 0, sizeof *r);
    memcpy(r->peer_public_key, key->pub, CM_ED25519_PUB_LEN);
    r->timestamp = ts;
    int rc = cm_random_bytes(r->nonce, sizeof r->nonce);
    if (rc != CM_OK)
        return rc;
    uint8_t msg[CM_PASSREQ_BYTES_MAX];
    size_t n = 0;
    if ((rc = cm_passreq_signed_bytes(run, username, r, msg, sizeof msg, &n)) != CM_OK)
        return rc;
    return cm_ed25519_sign(key, msg, n, r->signature);
}

json_t *cm_passreq_to_json(const struct cm_passreq *r)
{
    char pk[64], nonce[32], sig[96];
    cm_b64url_encode(r->peer_public_key, CM_ED25519_PUB_LEN, pk);
    cm_b64url_encode(r->nonce, CM_PASSREQ_NONCE_LEN, nonce);
    cm_b64url_encode(r->signature, CM_ED25519_SIG_LEN, sig);
    return json_pack("{s:s, s:I, s:s, s:s}", "peer_public_key", pk, "timestamp",
                     (json_int_t)r->timestamp, "nonce", nonce, "signature", sig);
}

/* Decodes field `name` (already checked to be a string) to exactly n bytes. */
static int b64_field(const json_t *obj, const char *name, uint8_t *out, size_t n, const char *what,
                     char *err, size_t cap)
{
    const char *s = json_string_value(json_object_get(obj, name));
    size_t got = 0;
    if (!s || cm_b64url_decode(s, strlen(s), out, n, &got) != CM_OK || got != n) {
        snprintf(err, cap, "field '%s': base64url (no padding) of %s", name, what);
        return CM_EINVAL;
    }
    return CM_OK;
}

int cm_passreq_from_json(const json_t *obj, struct cm_passreq *r, char *err, size_t cap)
{
    static const struct cm_json_field F[] = {
        {"peer_public_key", CM_J_STRING, 1, 43, 43},
        {"timestamp", CM_J_INT, 1, 0, CM_PASSREQ_TS_MAX},
        {"nonce", CM_J_STRING, 1, 22, 22},
        {"signature", CM_J_STRING, 1, 86, 86},
    };
    memset(r, 0, sizeof *r);
    if (!json_is_object(obj)) {
        snprintf(err, cap, "the body is a JSON object");
        return CM_EINVAL;
    }
    int rc = cm_json_check(obj, F, sizeof F / sizeof F[0], err, cap);
    if (rc == CM_OK)
        rc = b64_field(obj, "peer_public_key", r->peer_public_key, CM_ED25519_PUB_LEN,
                       "a 32-byte Ed25519 public key", err, cap);
    if (rc == CM_OK)
        rc = b64_field(obj, "nonce", r->nonce, CM_PASSREQ_NONCE_LEN, "16 random bytes", err, cap);
    if (rc == CM_OK)
        rc = b64_field(obj, "signature", r->signature, CM_ED25519_SIG_LEN,
                       "the 64-byte Ed25519 signature over the request (docs/protocol.md)", err, cap);
    if (rc != CM_OK)
        return CM_EINVAL;
    r->timestamp = (int64_t)json_integer_value(json_object_get(obj, "timestamp"));
    return CM_OK;
}

int cm_passreq_verify(const char *run, const char *username, const struct cm_passreq *r)
{
    if (cm_ed25519_pub_check(r->peer_public_key) != CM_OK)
        return CM_EINVAL;
    uint8_t msg[CM_PASSREQ_BYTES_MAX];
    size_t n = 0;
    int rc = cm_passreq_signed_bytes(run, username, r, msg, sizeof msg, &n);
    if (rc != CM_OK)
        return rc;
    return cm_ed25519_verify(r->peer_public_key, msg, n, r->signature);
}
