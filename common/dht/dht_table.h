/* Kademlia routing table (seed 002_2b00836ea4b30f79.txt, section 2.4 and
 * Appendix B): 256 buckets by XOR distance from our id, at most k = 20
 * contacts each in least-recently-seen order, plus a replacement cache of
 * up to k newer contacts per bucket. A contact that fails to answer is
 * replaced by the newest live replacement (or dropped after 2 failures when
 * there is none), instead of pinging the oldest on every insert. */
#ifndef DHT_TABLE_H
#define DHT_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "dht/dht_types.h"

struct dht_bucket {
    struct dht_contact *c; /* n live contacts, oldest first */
    struct dht_contact *repl; /* nrepl replacements, oldest first */
    uint8_t n, nrepl;
    int64_t last_lookup_ms;
};

struct dht_table {
    uint8_t self[DHT_ID_LEN];
    struct dht_bucket b[256];
    size_t count;
};

void dht_table_init(struct dht_table *t, const uint8_t self[DHT_ID_LEN], int64_t now_ms);
void dht_table_cleanup(struct dht_table *t);
/* A contact answered or asked us: insert or refresh it. */
int dht_table_seen(struct dht_table *t, const struct dht_contact *c, int64_t now_ms);
/* A contact failed to answer. */
void dht_table_failed(struct dht_table *t, const uint8_t id[DHT_ID_LEN]);
/* Up to max contacts closest to target, nearest first; returns how many. */
size_t dht_table_closest(const struct dht_table *t, const uint8_t target[DHT_ID_LEN],
                         struct dht_contact *out, size_t max);
/* Same, skipping contacts that failed their last request: what a node
 * tells others, so a dead peer stops spreading through FIND_NODE answers. */
size_t dht_table_closest_ex(const struct dht_table *t, const uint8_t target[DHT_ID_LEN],
                            struct dht_contact *out, size_t max, int healthy_only);
size_t dht_table_bytes(const struct dht_table *t);

#endif
