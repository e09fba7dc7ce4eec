/* A node's local record store: for each key, at most one plain value (the
 * one with the latest expiration wins) and a dictionary of entries keyed by
 * (author, subkey), so a peer can only replace its own entries — progress
 * records, expert prefixes (seed 002_2b00836ea4b30f79.txt, Appendix C) and
 * group announcements rely on that. Expired records are never returned and
 * are purged periodically. Bounded: total records, entries per key, TTL.
 * Single-threaded: used on its node's loop. */
#ifndef DHT_STORE_H
#define DHT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "dht/dht_types.h"

struct dht_kv;
struct dht_author;

struct dht_store {
    struct dht_kv **buckets;
    size_t nbuckets;
    size_t nrecords, max_records, max_per_key, max_per_author;
    int64_t max_ttl_ms;
    /* records held per author, so one peer cannot fill the store */
    struct dht_author **authors;
    size_t nauthor_buckets;
};

/* 0 for any limit: defaults (65536 records, 1024 entries per key, 7 days,
 * and at most a quarter of max_records from any one author). */
int dht_store_init(struct dht_store *s, size_t max_records, size_t max_per_key, int64_t max_ttl_ms);
void dht_store_cleanup(struct dht_store *s);

/* Stores a copy of r (its signature must already be verified). CM_OK when
 * stored or replaced; CM_ESTATE when an entry with a later or equal
 * expiration is kept; CM_EEXPIRED when already expired; CM_ERANGE when it
 * expires beyond the TTL limit; CM_ETOOBIG when the store, the key or the
 * author's share is full. */
int dht_store_put(struct dht_store *s, const struct dht_record *r, int64_t now_ms);

/* Borrowed pointers to the live records of a key (plain value first, then
 * dictionary entries), at most max; returns how many. Valid until the next
 * put or purge. */
size_t dht_store_get(const struct dht_store *s, const uint8_t key[DHT_ID_LEN], int64_t now_ms,
                     const struct dht_record **out, size_t max);

size_t dht_store_purge(struct dht_store *s, int64_t now_ms);
/* Approximate heap bytes held (for memory-per-node figures). */
size_t dht_store_bytes(const struct dht_store *s);

#endif
