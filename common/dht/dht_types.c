/* Ids, distances, addresses and record signatures (see dht_types.h). */
#include "dht/dht_types.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"

void dht_id_of_pub(const uint8_t pub[32], uint8_t id[DHT_ID_LEN])
{
    cm_sha256(pub, 32, id);
}

void dht_key_id(const void *key, size_t len, uint8_t id[DHT_ID_LEN])
{
    cm_sha256(key, len, id);
}

int dht_id_cmp_dist(const uint8_t *target, const uint8_t *a, const uint8_t *b)
{
    for (int i = 0; i < DHT_ID_LEN; i++) {
        uint8_t da = a[i] ^ target[i], db = b[i] ^ target[i];
        if (da != db)
            return da < db ? -1 : 1;
    }
    return 0;
}

int dht_id_bucket(const uint8_t *self, const uint8_t *id)
{
    for (int i = 0; i < DHT_ID_LEN; i++) {
        uint8_t x = self[i] ^ id[i];
        if (x)
            return 255 - (i * 8 + __builtin_clz((unsigned)x) - 24);
    }
    return -1;
}

void dht_id_random_in_bucket(const uint8_t *self, int bucket, uint8_t out[DHT_ID_LEN])
{
    /* Same bits as self above `bucket`, bit `bucket` flipped, random below. */
    cm_random_bytes(out, DHT_ID_LEN);
    int flip = 255 - bucket; /* bit position from the most significant end */
    for (int bit = 0; bit < flip; bit++) {
        int byte = bit / 8, m = 0x80 >> (bit % 8);
        out[byte] = (uint8_t)((out[byte] & ~m) | (self[byte] & m));
    }
    int byte = flip / 8, m = 0x80 >> (flip % 8);
    out[byte] = (uint8_t)((out[byte] & ~m) | (~self[byte] & m));
}

int dht_addr_from_sockaddr(const struct sockaddr *sa, struct dht_addr *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)sa;
        out->family = 4;
        out->port = ntohs(a->sin_port);
        memcpy(out->ip, &a->sin_addr, 4);
        return CM_OK;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)sa;
        out->family = 6;
        out->port = ntohs(a->sin6_port);
        memcpy(out->ip, &a->sin6_addr, 16);
        return CM_OK;
    }
    return CM_EINVAL;
}

void dht_addr_to_sockaddr(const struct dht_addr *a, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    if (a->family == 4) {
        struct sockaddr_in *s = (void *)out;
        s->sin_family = AF_INET;
        s->sin_port = htons(a->port);
        memcpy(&s->sin_addr, a->ip, 4);
    } else {
        struct sockaddr_in6 *s = (void *)out;
        s->sin6_family = AF_INET6;
        s->sin6_port = htons(a->port);
        memcpy(&s->sin6_addr, a->ip, 16);
    }
}

static uint8_t *tbs_of(const struct dht_record *r, size_t *len)
{
    static const char CTX[17] = "crowdtrain-dht-v1";
    size_t n = sizeof CTX + DHT_ID_LEN + 4 + r->subkey_len + 4 + r->value_len + 8;
    uint8_t *b = malloc(n), *p = b;
    if (!b)
        return NULL;
    memcpy(p, CTX, sizeof CTX);
    p += sizeof CTX;
    memcpy(p, r->key, DHT_ID_LEN);
    p += DHT_ID_LEN;
    for (int i = 3; i >= 0; i--)
        *p++ = (uint8_t)(r->subkey_len >> (8 * i));
    if (r->subkey_len)
        memcpy(p, r->subkey, r->subkey_len);
    p += r->subkey_len;
    for (int i = 3; i >= 0; i--)
        *p++ = (uint8_t)(r->value_len >> (8 * i));
    if (r->value_len)
        memcpy(p, r->value, r->value_len);
    p += r->value_len;
    for (int i = 7; i >= 0; i--)
        *p++ = (uint8_t)((uint64_t)r->expires_ms >> (8 * i));
    *len = n;
    return b;
}

int dht_record_sign(struct dht_record *r, const void *author_key)
{
    const struct cm_ed25519 *k = author_key;
    size_t n;
    uint8_t *b = tbs_of(r, &n);
    if (!b)
        return CM_ENOMEM;
    memcpy(r->author, k->pub, 32);
    int rc = cm_ed25519_sign(k, b, n, r->sig);
    free(b);
    return rc;
}

int dht_record_verify(const struct dht_record *r)
{
    size_t n;
    uint8_t *b = tbs_of(r, &n);
    if (!b)
        return CM_ENOMEM;
    int rc = cm_ed25519_verify(r->author, b, n, r->sig);
    free(b);
    return rc;
}

int dht_record_copy(struct dht_record *dst, const struct dht_record *src)
{
    *dst = *src;
    dst->subkey = NULL;
    dst->value = NULL;
    if (src->subkey_len && !(dst->subkey = malloc(src->subkey_len)))
        return CM_ENOMEM;
    if (src->value_len && !(dst->value = malloc(src->value_len))) {
        free(dst->subkey);
        dst->subkey = NULL;
        return CM_ENOMEM;
    }
    if (src->subkey_len)
        memcpy(dst->subkey, src->subkey, src->subkey_len);
    if (src->value_len)
        memcpy(dst->value, src->value, src->value_len);
    return CM_OK;
}

void dht_record_cleanup(struct dht_record *r)
{
    free(r->subkey);
    free(r->value);
    r->subkey = NULL;
    r->value = NULL;
}
