/* Routing table (see dht_table.h). */
#include "dht/dht_table.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

void dht_table_init(struct dht_table *t, const uint8_t self[DHT_ID_LEN], int64_t now_ms)
{
    memset(t, 0, sizeof *t);
    memcpy(t->self, self, DHT_ID_LEN);
    for (int i = 0; i < 256; i++)
        t->b[i].last_lookup_ms = now_ms;
}

void dht_table_cleanup(struct dht_table *t)
{
    for (int i = 0; i < 256; i++) {
        free(t->b[i].c);
        free(t->b[i].repl);
        t->b[i].c = t->b[i].repl = NULL;
        t->b[i].n = t->b[i].nrepl = 0;
    }
    t->count = 0;
}

static int find_in(const struct dht_contact *a, int n, const uint8_t *id)
{
    for (int i = 0; i < n; i++)
        if (!memcmp(a[i].id, id, DHT_ID_LEN))
            return i;
    return -1;
}

int dht_table_seen(struct dht_table *t, const struct dht_contact *c, int64_t now_ms)
{
    int bi = dht_id_bucket(t->self, c->id);
    if (bi < 0)
        return CM_EINVAL; /* ourselves */
    struct dht_bucket *b = &t->b[bi];
    struct dht_contact nc = *c;
    nc.last_seen_ms = now_ms;
    nc.fails = 0;
    int i = find_in(b->c, b->n, c->id);
    if (i >= 0) { /* move to the tail (most recently seen) */
        memmove(&b->c[i], &b->c[i + 1], (size_t)(b->n - i - 1) * sizeof nc);
        b->c[b->n - 1] = nc;
        return CM_OK;
    }
    if (!b->c && !(b->c = malloc(DHT_K * sizeof *b->c)))
        return CM_ENOMEM;
    if (b->n < DHT_K) {
        b->c[b->n++] = nc;
        t->count++;
        return CM_OK;
    }
    /* Full: keep it as a replacement (newest last, oldest dropped). */
    if (!b->repl && !(b->repl = malloc(DHT_K * sizeof *b->repl)))
        return CM_ENOMEM;
    i = find_in(b->repl, b->nrepl, c->id);
    if (i >= 0) {
        memmove(&b->repl[i], &b->repl[i + 1], (size_t)(b->nrepl - i - 1) * sizeof nc);
        b->nrepl--;
    } else if (b->nrepl == DHT_K) {
        memmove(&b->repl[0], &b->repl[1], (size_t)(DHT_K - 1) * sizeof nc);
        b->nrepl--;
    }
    b->repl[b->nrepl++] = nc;
    return CM_OK;
}

void dht_table_failed(struct dht_table *t, const uint8_t id[DHT_ID_LEN])
{
    int bi = dht_id_bucket(t->self, id);
    if (bi < 0)
        return;
    struct dht_bucket *b = &t->b[bi];
    int i = find_in(b->c, b->n, id);
    if (i < 0) {
        int r = find_in(b->repl, b->nrepl, id);
        if (r >= 0) {
            memmove(&b->repl[r], &b->repl[r + 1], (size_t)(b->nrepl - r - 1) * sizeof *b->repl);
            b->nrepl--;
        }
        return;
    }
    b->c[i].fails++;
    if (b->nrepl == 0 && b->c[i].fails < 2)
        return;
    memmove(&b->c[i], &b->c[i + 1], (size_t)(b->n - i - 1) * sizeof *b->c);
    b->n--;
    t->count--;
    if (b->nrepl) {
        b->c[b->n++] = b->repl[--b->nrepl];
        t->count++;
    }
}

size_t dht_table_closest(const struct dht_table *t, const uint8_t target[DHT_ID_LEN],
                         struct dht_contact *out, size_t max)
{
    return dht_table_closest_ex(t, target, out, max, 0);
}

size_t dht_table_closest_ex(const struct dht_table *t, const uint8_t target[DHT_ID_LEN],
                            struct dht_contact *out, size_t max, int healthy_only)
{
    /* Insertion into a sorted array of at most max: the table holds at
     * most a few hundred contacts, so this stays cheap. */
    size_t n = 0;
    for (int bi = 0; bi < 256; bi++) {
        const struct dht_bucket *b = &t->b[bi];
        for (int i = 0; i < b->n; i++) {
            const struct dht_contact *c = &b->c[i];
            if (healthy_only && c->fails)
                continue;
            if (n == max && dht_id_cmp_dist(target, c->id, out[n - 1].id) >= 0)
                continue;
            size_t pos = n < max ? n : max - 1;
            while (pos > 0 && dht_id_cmp_dist(target, c->id, out[pos - 1].id) < 0) {
                out[pos] = out[pos - 1];
                pos--;
            }
            out[pos] = *c;
            if (n < max)
                n++;
        }
    }
    return n;
}

size_t dht_table_bytes(const struct dht_table *t)
{
    size_t n = sizeof *t;
    for (int i = 0; i < 256; i++)
        n += (t->b[i].c ? DHT_K : 0) * sizeof(struct dht_contact) +
             (t->b[i].repl ? DHT_K : 0) * sizeof(struct dht_contact);
    return n;
}
