/* Local record store (see dht_store.h): a chained hash table of keys, each
 * with an optional plain record and an array of dictionary entries. */
#include "dht/dht_store.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

struct dht_author {
    struct dht_author *next;
    uint8_t pub[32];
    size_t n;
};

struct dht_kv {
    struct dht_kv *next;
    uint8_t key[DHT_ID_LEN];
    int has_plain;
    struct dht_record plain;
    struct dht_record *dict;
    size_t ndict, cap;
};

int dht_store_init(struct dht_store *s, size_t max_records, size_t max_per_key, int64_t max_ttl_ms)
{
    memset(s, 0, sizeof *s);
    s->nbuckets = 64;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (!s->buckets)
        return CM_ENOMEM;
    s->max_records = max_records ? max_records : 65536;
    s->max_per_key = max_per_key ? max_per_key : 1024;
    s->max_ttl_ms = max_ttl_ms ? max_ttl_ms : 7LL * 24 * 3600 * 1000;
    s->max_per_author = s->max_records / 4 ? s->max_records / 4 : 1;
    s->nauthor_buckets = 256;
    if (!(s->authors = calloc(s->nauthor_buckets, sizeof *s->authors))) {
        free(s->buckets);
        s->buckets = NULL;
        return CM_ENOMEM;
    }
    return CM_OK;
}

static void kv_free(struct dht_kv *kv)
{
    if (kv->has_plain)
        dht_record_cleanup(&kv->plain);
    for (size_t i = 0; i < kv->ndict; i++)
        dht_record_cleanup(&kv->dict[i]);
    free(kv->dict);
    free(kv);
}

void dht_store_cleanup(struct dht_store *s)
{
    for (size_t i = 0; i < s->nbuckets; i++)
        for (struct dht_kv *kv = s->buckets ? s->buckets[i] : NULL, *n; kv; kv = n) {
            n = kv->next;
            kv_free(kv);
        }
    free(s->buckets);
    s->buckets = NULL;
    s->nrecords = 0;
    for (size_t i = 0; s->authors && i < s->nauthor_buckets; i++)
        for (struct dht_author *a = s->authors[i], *n; a; a = n) {
            n = a->next;
            free(a);
        }
    free(s->authors);
    s->authors = NULL;
}

/* The author's record count (created at 0 when `create`). */
static struct dht_author *author_get(struct dht_store *s, const uint8_t *pub, int create)
{
    size_t i = ((size_t)pub[0] | (size_t)pub[1] << 8) % s->nauthor_buckets;
    for (struct dht_author *a = s->authors[i]; a; a = a->next)
        if (!memcmp(a->pub, pub, 32))
            return a;
    if (!create)
        return NULL;
    struct dht_author *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    memcpy(a->pub, pub, 32);
    a->next = s->authors[i];
    s->authors[i] = a;
    return a;
}

static void author_dec(struct dht_store *s, const uint8_t *pub)
{
    size_t i = ((size_t)pub[0] | (size_t)pub[1] << 8) % s->nauthor_buckets;
    for (struct dht_author **pp = &s->authors[i]; *pp; pp = &(*pp)->next) {
        struct dht_author *a = *pp;
        if (memcmp(a->pub, pub, 32))
            continue;
        if (a->n && --a->n == 0) { /* authors with nothing stored cost nothing */
            *pp = a->next;
            free(a);
        }
        return;
    }
}

static size_t slot_of(const struct dht_store *s, const uint8_t *key)
{
    uint64_t v;
    memcpy(&v, key, sizeof v);
    return (size_t)(v % s->nbuckets);
}

static struct dht_kv *find(const struct dht_store *s, const uint8_t *key)
{
    for (struct dht_kv *kv = s->buckets[slot_of(s, key)]; kv; kv = kv->next)
        if (!memcmp(kv->key, key, DHT_ID_LEN))
            return kv;
    return NULL;
}

static void grow(struct dht_store *s)
{
    size_t nb = s->nbuckets * 2;
    struct dht_kv **b = calloc(nb, sizeof *b);
    if (!b)
        return; /* keep the old table: slower, still correct */
    size_t old = s->nbuckets;
    struct dht_kv **ob = s->buckets;
    s->buckets = b;
    s->nbuckets = nb;
    for (size_t i = 0; i < old; i++)
        for (struct dht_kv *kv = ob[i], *n; kv; kv = n) {
            n = kv->next;
            size_t j = slot_of(s, kv->key);
            kv->next = b[j];
            b[j] = kv;
        }
    free(ob);
}

int dht_store_put(struct dht_store *s, const struct dht_record *r, int64_t now_ms)
{
    if (r->expires_ms <= now_ms)
        return CM_EEXPIRED;
    if (r->expires_ms > now_ms + s->max_ttl_ms)
        return CM_ERANGE;
    struct dht_kv *kv = find(s, r->key);
    struct dht_record *slot = NULL;
    if (kv) {
        if (r->subkey_len == 0) {
            if (kv->has_plain)
                slot = &kv->plain;
        } else {
            for (size_t i = 0; i < kv->ndict && !slot; i++) {
                struct dht_record *d = &kv->dict[i];
                if (d->subkey_len == r->subkey_len && !memcmp(d->author, r->author, 32) &&
                    !memcmp(d->subkey, r->subkey, r->subkey_len))
                    slot = d;
            }
        }
    }
    if (slot) {
        /* Newest wins: a record replaces one with an earlier expiration. */
        if (slot->expires_ms >= r->expires_ms)
            return CM_ESTATE;
        struct dht_author *na = NULL;
        int other = memcmp(slot->author, r->author, 32) != 0;
        if (other) {
            na = author_get(s, r->author, 1);
            if (!na)
                return CM_ENOMEM;
            if (na->n >= s->max_per_author)
                return CM_ETOOBIG;
        }
        struct dht_record copy;
        if (dht_record_copy(&copy, r))
            return CM_ENOMEM;
        if (other) {
            author_dec(s, slot->author);
            na->n++;
        }
        dht_record_cleanup(slot);
        *slot = copy;
        return CM_OK;
    }
    if (s->nrecords >= s->max_records)
        return CM_ETOOBIG;
    struct dht_author *au = author_get(s, r->author, 1);
    if (!au)
        return CM_ENOMEM;
    if (au->n >= s->max_per_author)
        return CM_ETOOBIG;
    if (!kv) {
        if (!(kv = calloc(1, sizeof *kv)))
            return CM_ENOMEM;
        memcpy(kv->key, r->key, DHT_ID_LEN);
        size_t j = slot_of(s, r->key);
        kv->next = s->buckets[j];
        s->buckets[j] = kv;
    }
    if (r->subkey_len == 0) {
        if (dht_record_copy(&kv->plain, r))
            return CM_ENOMEM;
        kv->has_plain = 1;
    } else {
        if (kv->ndict >= s->max_per_key)
            return CM_ETOOBIG;
        if (kv->ndict == kv->cap) {
            size_t nc = kv->cap ? kv->cap * 2 : 4;
            struct dht_record *d = realloc(kv->dict, nc * sizeof *d);
            if (!d)
                return CM_ENOMEM;
            kv->dict = d;
            kv->cap = nc;
        }
        if (dht_record_copy(&kv->dict[kv->ndict], r))
            return CM_ENOMEM;
        kv->ndict++;
    }
    s->nrecords++;
    au->n++;
    if (s->nrecords > s->nbuckets * 2)
        grow(s);
    return CM_OK;
}

size_t dht_store_get(const struct dht_store *s, const uint8_t key[DHT_ID_LEN], int64_t now_ms,
                     const struct dht_record **out, size_t max)
{
    const struct dht_kv *kv = find(s, key);
    size_t n = 0;
    if (!kv)
        return 0;
    if (kv->has_plain && kv->plain.expires_ms > now_ms && n < max)
        out[n++] = &kv->plain;
    for (size_t i = 0; i < kv->ndict && n < max; i++)
        if (kv->dict[i].expires_ms > now_ms)
            out[n++] = &kv->dict[i];
    return n;
}

size_t dht_store_purge(struct dht_store *s, int64_t now_ms)
{
    size_t removed = 0;
    for (size_t b = 0; b < s->nbuckets; b++) {
        struct dht_kv **pp = &s->buckets[b];
        while (*pp) {
            struct dht_kv *kv = *pp;
            if (kv->has_plain && kv->plain.expires_ms <= now_ms) {
                author_dec(s, kv->plain.author);
                dht_record_cleanup(&kv->plain);
                kv->has_plain = 0;
                removed++;
            }
            size_t w = 0;
            for (size_t i = 0; i < kv->ndict; i++) {
                if (kv->dict[i].expires_ms <= now_ms) {
                    author_dec(s, kv->dict[i].author);
                    dht_record_cleanup(&kv->dict[i]);
                    removed++;
                } else {
                    kv->dict[w++] = kv->dict[i];
                }
            }
            kv->ndict = w;
            if (!kv->has_plain && kv->ndict == 0) {
                *pp = kv->next;
                kv_free(kv);
            } else {
                pp = &kv->next;
            }
        }
    }
    s->nrecords -= removed;
    return removed;
}

size_t dht_store_bytes(const struct dht_store *s)
{
    size_t n = s->nbuckets * sizeof *s->buckets;
    for (size_t b = 0; b < s->nbuckets; b++)
        for (const struct dht_kv *kv = s->buckets[b]; kv; kv = kv->next) {
            n += sizeof *kv + kv->cap * sizeof(struct dht_record);
            if (kv->has_plain)
                n += kv->plain.value_len + kv->plain.subkey_len;
            for (size_t i = 0; i < kv->ndict; i++)
                n += kv->dict[i].value_len + kv->dict[i].subkey_len;
        }
    return n;
}
