/* Large round buffers kept between rounds (ar_internal.h, struct ar__pool).
 *
 * A round of an n-float buffer allocates about 1.5 n floats' worth of big
 * arrays (the aggregator's double sums and encoded results, the puller's
 * staging areas). Fresh memory costs a page fault per 4 KiB on first touch,
 * for 25.6 M floats about 40,000 faults per round and peer, which was a
 * tenth of an uncapped round's CPU time. The engine keeps the last round's
 * arrays for the next one instead. A round may outlive its engine (it is
 * freed when libuv closes its timer), so the pool is reference-counted. */
#include "ar/ar_internal.h"

#include <stdlib.h>
#include <string.h>

/* Each block starts with its capacity; the header keeps 16-byte alignment. */
struct blk {
    size_t cap;
    size_t pad;
};

struct ar__pool *ar__pool_new(void)
{
    struct ar__pool *pl = calloc(1, sizeof *pl);
    if (pl)
        pl->refs = 1;
    return pl;
}

static void pool_release(struct ar__pool *pl)
{
    if (--pl->refs)
        return;
    for (size_t i = 0; i < AR__POOL_SLOTS; i++)
        free(pl->slot[i]);
    for (size_t i = 0; i < pl->n_spare; i++)
        free(pl->spare[i]);
    free(pl);
}

void *ar__pool_chunk_get(struct ar__pool *pl, size_t bytes)
{
    if (pl && pl->n_spare && pl->spare_bytes == bytes)
        return pl->spare[--pl->n_spare];
    return malloc(bytes ? bytes : 1);
}

void ar__pool_chunk_put(struct ar__pool *pl, void *p, size_t bytes)
{
    if (!p)
        return;
    /* Kept while the engine lives (it asks again), up to the cap; a new
     * size (another chunk setting) replaces the kept ones. */
    if (pl && pl->refs >= 2 && pl->n_spare && pl->spare_bytes != bytes) {
        for (size_t i = 0; i < pl->n_spare; i++)
            free(pl->spare[i]);
        pl->n_spare = 0;
    }
    if (!pl || pl->refs < 2 || pl->n_spare == AR__POOL_SPARES ||
        (pl->n_spare + 1) * bytes > AR__POOL_SPARE_BYTES) {
        free(p);
        return;
    }
    pl->spare_bytes = bytes;
    pl->spare[pl->n_spare++] = p;
}

void ar__pool_ref(struct ar__pool *pl)
{
    pl->refs++;
}

void ar__pool_unref(struct ar__pool *pl)
{
    if (pl)
        pool_release(pl);
}

void *ar__pool_get(struct ar__pool *pl, size_t bytes, int zero)
{
    size_t best = AR__POOL_SLOTS;
    for (size_t i = 0; pl && i < AR__POOL_SLOTS; i++) {
        struct blk *b = pl->slot[i];
        if (b && b->cap >= bytes && (best == AR__POOL_SLOTS || b->cap < pl->slot[best]->cap))
            best = i;
    }
    struct blk *b;
    if (best < AR__POOL_SLOTS) {
        b = pl->slot[best];
        pl->slot[best] = NULL;
        if (zero)
            memset(b + 1, 0, bytes);
    } else {
        b = zero ? calloc(1, sizeof *b + bytes) : malloc(sizeof *b + bytes);
        if (!b)
            return NULL;
        b->cap = bytes;
    }
    return b + 1;
}

void ar__pool_put(struct ar__pool *pl, void *p)
{
    if (!p)
        return;
    struct blk *b = (struct blk *)p - 1;
    if (!pl || pl->refs < 2) { /* the engine is gone: nobody will ask again */
        free(b);
        return;
    }
    /* Keep it in a free slot, or in place of the smallest kept block. */
    size_t low = 0;
    for (size_t i = 0; i < AR__POOL_SLOTS; i++) {
        if (!pl->slot[i]) {
            pl->slot[i] = b;
            return;
        }
        if (pl->slot[i]->cap < pl->slot[low]->cap)
            low = i;
    }
    if (pl->slot[low]->cap < b->cap) {
        free(pl->slot[low]);
        pl->slot[low] = b;
    } else {
        free(b);
    }
}
