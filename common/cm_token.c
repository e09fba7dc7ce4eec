/* Access-pass tokens as compact JWS with EdDSA (see cm_token.h). The parser
 * is a pure function over bytes, fuzzed by tests/fuzz/fuzz_token.c. */
#include "cm_token.h"
#include "cm_err.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int cm_name_valid(const char *s)
{
    size_t n = 0;
    if (!s || !*s || *s == '.' || *s == '-')
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        if (!ok || n >= CM_NAME_MAX)
            return 0;
    }
    return 1;
}

static char *b64_of(const void *p, size_t n)
{
    char *s = malloc(cm_b64url_encoded_len(n) + 1);
    if (s)
        cm_b64url_encode(p, n, s);
    return s;
}

int cm_token_sign(const struct cm_ed25519 *key, const struct cm_pass_claims *c, char **out)
{
    *out = NULL;
    if (!cm_name_valid(c->username) || !cm_name_valid(c->run) || !c->pass_id[0] ||
        c->expires_at <= c->issued_at)
        return CM_EINVAL;
    char kid[CM_KID_LEN + 1], pk[64];
    cm_key_id(key->pub, kid);
    cm_b64url_encode(c->peer_public_key, CM_ED25519_PUB_LEN, pk);

    /* Field order is fixed (JSON_PRESERVE_ORDER) only for readability; the
     * signature covers the encoded bytes, so verifiers never re-serialize. */
    json_t *h = json_pack("{s:s, s:s, s:s}", "alg", "EdDSA", "typ", CM_TOKEN_TYP, "kid", kid);
    json_t *p = json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:I}", "ver", 1, "jti", c->pass_id,
                          "sub", c->username, "run", c->run, "pk", pk, "iat",
                          (json_int_t)c->issued_at, "exp", (json_int_t)c->expires_at);
    char *hs = h ? json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    char *ps = p ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(h);
    json_decref(p);
    char *hb = hs ? b64_of(hs, strlen(hs)) : NULL;
    char *pb = ps ? b64_of(ps, strlen(ps)) : NULL;
    free(hs);
    free(ps);
    int rc = CM_ENOMEM;
    char *tok = NULL;
    if (hb && pb) {
        size_t hl = strlen(hb), pl = strlen(pb);
        size_t sl = cm_b64url_encoded_len(CM_ED25519_SIG_LEN);
        tok = malloc(hl + 1 + pl + 1 + sl + 1);
        if (tok) {
            memcpy(tok, hb, hl);
            tok[hl] = '.';
            memcpy(tok + hl + 1, pb, pl);
            uint8_t sig[CM_ED25519_SIG_LEN];
            rc = cm_ed25519_sign(key, tok, hl + 1 + pl, sig);
            if (rc == CM_OK) {
                tok[hl + 1 + pl] = '.';
                cm_b64url_encode(sig, sizeof sig, tok + hl + 1 + pl + 1);
                if (strlen(tok) > CM_TOKEN_MAX_LEN)
                    rc = CM_ETOOBIG;
            }
        }
    }
    free(hb);
    free(pb);
    if (rc != CM_OK) {
        free(tok);
        return rc;
    }
    *out = tok;
    return CM_OK;
}

static json_t *decode_json_part(const char *p, size_t len)
{
    uint8_t buf[CM_TOKEN_MAX_LEN];
    size_t n = 0;
    if (cm_b64url_decode(p, len, buf, sizeof buf, &n) != CM_OK)
        return NULL;
    json_error_t e;
    json_t *j = json_loadb((const char *)buf, n, JSON_REJECT_DUPLICATES, &e);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int copy_str(json_t *obj, const char *key, char *dst, size_t cap)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return CM_EPARSE;
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n == 0 || n >= cap || memchr(s, '\0', n))
        return CM_EPARSE;
    memcpy(dst, s, n + 1);
    return CM_OK;
}

int cm_token_parse(const char *tok, size_t len, struct cm_pass_claims *c,
                   uint8_t sig[CM_ED25519_SIG_LEN], size_t *signed_len)
{
    memset(c, 0, sizeof *c);
    if (len == 0 || len > CM_TOKEN_MAX_LEN)
        return len ? CM_ETOOBIG : CM_EPARSE;
    const char *d1 = memchr(tok, '.', len);
    if (!d1)
        return CM_EPARSE;
    const char *d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - tok));
    if (!d2 || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - tok)))
        return CM_EPARSE;
    size_t sl = len - (size_t)(d2 + 1 - tok), got = 0;
    if (cm_b64url_decode(d2 + 1, sl, sig, CM_ED25519_SIG_LEN, &got) != CM_OK ||
        got != CM_ED25519_SIG_LEN)
        return CM_EPARSE;

    int rc = CM_EPARSE;
    json_t *h = decode_json_part(tok, (size_t)(d1 - tok));
    json_t *p = h ? decode_json_part(d1 + 1, (size_t)(d2 - d1 - 1)) : NULL;
    if (!h || !p)
        goto out;
    json_t *alg = json_object_get(h, "alg"), *typ = json_object_get(h, "typ");
    if (!json_is_string(alg) || strcmp(json_string_value(alg), "EdDSA") != 0 ||
        !json_is_string(typ) || strcmp(json_string_value(typ), CM_TOKEN_TYP) != 0)
        goto out;
    if (copy_str(h, "kid", c->kid, sizeof c->kid) != CM_OK)
        goto out;
    json_t *ver = json_object_get(p, "ver");
    if (!json_is_integer(ver)) {
        goto out;
    }
    if (json_integer_value(ver) != 1) {
        rc = CM_EVERSION;
        goto out;
    }
    c->version = 1;
    char pk[64];
    size_t pkn = 0;
    if (copy_str(p, "jti", c->pass_id, sizeof c->pass_id) != CM_OK ||
        copy_str(p, "sub", c->username, sizeof c->username) != CM_OK ||
        copy_str(p, "run", c->run, sizeof c->run) != CM_OK ||
        copy_str(p, "pk", pk, sizeof pk) != CM_OK || !cm_name_valid(c->username) ||
        !cm_name_valid(c->run))
        goto out;
    if (cm_b64url_decode(pk, strlen(pk), c->peer_public_key, CM_ED25519_PUB_LEN, &pkn) != CM_OK ||
        pkn != CM_ED25519_PUB_LEN)
        goto out;
    json_t *iat = json_object_get(p, "iat"), *exp = json_object_get(p, "exp");
    if (!json_is_integer(iat) || !json_is_integer(exp))
        goto out;
    c->issued_at = json_integer_value(iat);
    c->expires_at = json_integer_value(exp);
    if (c->expires_at <= c->issued_at)
        goto out;
    *signed_len = (size_t)(d2 - tok);
    rc = CM_OK;
out:
    json_decref(h);
    json_decref(p);
    return rc;
}

int cm_token_verify(const char *tok, size_t len, const uint8_t (*keys)[CM_ED25519_PUB_LEN],
                    size_t n, int64_t now, int64_t skew, struct cm_pass_claims *c)
{
    uint8_t sig[CM_ED25519_SIG_LEN];
    size_t signed_len = 0;
    int rc = cm_token_parse(tok, len, c, sig, &signed_len);
    if (rc != CM_OK)
        return rc;
    rc = CM_EBADSIG;
    for (size_t i = 0; i < n; i++) {
        char kid[CM_KID_LEN + 1];
        cm_key_id(keys[i], kid);
        if (strcmp(kid, c->kid) != 0)
            continue;
        rc = cm_ed25519_verify(keys[i], tok, signed_len, sig);
        break;
    }
    if (rc != CM_OK)
        return rc;
    if (now >= c->expires_at + skew)
        return CM_EEXPIRED;
    if (c->issued_at > now + skew)
        return CM_EINVAL;
    return CM_OK;
}
