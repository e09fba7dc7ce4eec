/* Expert declarations on the DHT (seed 002_2b00836ea4b30f79.txt, section
 * 3.3 "DHT Node" and Appendix C; docs/experts.md, "DHT records").
 *
 * Every prefix key of a declared expert ("moe.<run>.ffn.3.*") holds a
 * dictionary entry per server (the entry's author is the server's DHT key,
 * subkey MOE_DHT_SUBKEY) whose value lists the server's active suffixes
 * under that prefix. The deepest prefix key (length d - 1; for d = 1 the
 * root key "moe.<run>.ffn.*") is a leaf record: its suffixes are whole
 * experts and it also carries the server's "ip:port" and Ed25519 key, so
 * the last level of the beam search needs no lookup per expert. Prefix keys
 * of length 1 .. d - 2 are inner records (suffixes only). The DHT's
 * expirations stand in for the seed's timestamps: a server declares with an
 * expiry, its node republishes until then, and expired entries are never
 * returned.
 *
 * Record value (big endian):
 *   u8  version (1)     u8 kind (1 inner, 2 leaf)
 *   u16 M (grid size)   u16 count (1 .. M)
 *   count x u16 index (strictly increasing, < M)
 *   leaf only: u8 addr_len (3 .. MOE_ADDR_MAX), addr ("host:port"), u8[32] key
 * and nothing after. moe_rec_decode is pure and strict (fuzzed by
 * tests/fuzz/fuzz_moe_dht.c). */
#ifndef MOE_DHT_H
#define MOE_DHT_H

#include <stddef.h>
#include <stdint.h>

#include "dht/dht_node.h"
#include "moe/moe_grid.h"

#define MOE_REC_VERSION 1
#define MOE_REC_INNER 1
#define MOE_REC_LEAF 2
#define MOE_ADDR_MAX 63
#define MOE_REC_MAX (6 + 2 * MOE_MAX_SIZE + 1 + MOE_ADDR_MAX + 32)
#define MOE_DHT_SUBKEY "experts"

/* Where an expert is served. */
struct moe_server {
    char addr[MOE_ADDR_MAX + 1]; /* "host:port", NUL terminated */
    uint8_t pub[32];             /* the server's Ed25519 key */
};

/* A decoded record value. */
struct moe_rec {
    int kind;
    int size;                             /* M */
    int count;                            /* suffixes set in `child` */
    uint64_t child[MOE_MAX_SIZE / 64];    /* bit i: suffix i is active */
    struct moe_server server;             /* leaf only */
};

/* One server's entry under a key, as the read side sees it. */
struct moe_entry {
    uint8_t author[32]; /* the DHT record's author */
    int64_t expires_ms;
    struct moe_rec rec;
};

/* 1 when suffix i (0 <= i < MOE_MAX_SIZE) is set in r. */
int moe_rec_has(const struct moe_rec *r, int i);

/* "host:port" with host a DNS name or IPv4 ([A-Za-z0-9.-]) or "[v6]" and a
 * port 1..65535 without leading zeros. */
int moe_addr_check(const char *addr);
/* Encodes r into out (cap >= MOE_REC_MAX always suffices). */
int moe_rec_encode(const struct moe_rec *r, uint8_t *out, size_t cap, size_t *len);
/* Decodes exactly len bytes; *out is written only on CM_OK. */
int moe_rec_decode(const uint8_t *buf, size_t len, struct moe_rec *out);

/* ---- declaring ------------------------------------------------------------ */

/* The records a server publishes for a set of experts: one (key, value) per
 * distinct prefix key. */
struct moe_decl_item {
    struct moe_uid prefix;
    char key[MOE_KEY_MAX];
    size_t klen;
    uint8_t value[MOE_REC_MAX];
    size_t vlen;
};
struct moe_decl {
    struct moe_decl_item *items; /* owned */
    size_t n;
};

/* Builds the records for uids[0..n) hosted at srv. CM_EINVAL for an invalid
 * uid, a duplicate uid, a bad address or run; nothing is built then. */
int moe_decl_build(const char *run, const struct moe_grid *g, const struct moe_uid *uids,
                   size_t n, const struct moe_server *srv, struct moe_decl *out);
void moe_decl_cleanup(struct moe_decl *d);

/* Declares uids on a started node (dht_node_start): one blocking dht_put per
 * distinct key, up to 16 at once from worker threads, each bounded by what
 * is left of deadline_ms. A declaration replaces this node's previous entry
 * under each key it touches, so declare the server's whole set at once.
 * *keys_ok (may be NULL) gets how many keys at least one node stored.
 * CM_OK when every key was stored somewhere; else the first failure. */
int moe_dht_declare(struct dht_node *node, const char *run, const struct moe_grid *g,
                    const struct moe_uid *uids, size_t n, const struct moe_server *srv,
                    int64_t expires_ms, uint32_t deadline_ms, size_t *keys_ok);

/* In-loop version (dht_node_new): all puts at once; cb(arg, status, keys_ok)
 * runs once, on the loop, after every put completed. */
typedef void (*moe_declare_cb)(void *arg, int status, size_t keys_ok);
int moe_dht_declare_async(struct dht_node *node, const char *run, const struct moe_grid *g,
                          const struct moe_uid *uids, size_t n, const struct moe_server *srv,
                          int64_t expires_ms, moe_declare_cb cb, void *arg);

/* ---- reading -------------------------------------------------------------- */

/* The entries of a get result for `prefix` of g: dictionary entries with
 * subkey MOE_DHT_SUBKEY whose value decodes, has the grid's M and the kind
 * the prefix's depth calls for (leaf for length d - 1, inner above). The
 * rest (plain values, other subkeys, malformed or foreign values) is
 * skipped and counted in *skipped (may be NULL). *out is malloc'ed (free it),
 * NULL when *n == 0. */
int moe_dht_entries(const struct moe_grid *g, const struct moe_uid *prefix,
                    const struct dht_result *res, struct moe_entry **out, size_t *n,
                    size_t *skipped);

/* Blocking read of one prefix key on a started node: CM_OK with entries
 * (possibly none), CM_ENOTFOUND when the key has no live record, or the
 * lookup's error. */
int moe_dht_get_prefix(struct dht_node *node, const char *run, const struct moe_grid *g,
                       const struct moe_uid *prefix, uint32_t deadline_ms,
                       struct moe_entry **out, size_t *n);

/* The servers of one expert (blocking: a get of its leaf key). *out gets up
 * to max servers, freshest declaration first; CM_ENOTFOUND when none. */
int moe_dht_find_expert(struct dht_node *node, const char *run, const struct moe_grid *g,
                        const struct moe_uid *uid, uint32_t deadline_ms,
                        struct moe_server *out, size_t max, size_t *n);

#endif
