/* Beam search for the best live experts of a batch over the DHT: Algorithm 1
 * "SelectExperts" of seed 002_2b00836ea4b30f79.txt (Appendix C), run for a
 * whole batch at once.
 *
 * Input: per sample and grid dimension the gating scores g_i(x) (the d
 * gating heads, section 3.2), float scores[B][d][M]; k; a beam width W >= k;
 * an optional ban list (experts or servers that failed: section 3.1 asks
 * that a dead expert stop being used within one call, so a caller bans it
 * and searches again). Output per sample: up to k experts with the summed
 * score g(x, f) = sum_i g_i(x)[u_i], best first, each with its server.
 *
 * The core is a pure state machine, so any lookup backend can drive it:
 *
 *     moe_beam_new(...)                  // the first keys are wanted
 *     while (!moe_beam_done(b)) {
 *         for each i < moe_beam_nwanted(b): look up moe_beam_wanted(b, i)
 *         as each answer arrives: moe_beam_feed(b, prefix, status, entries, n)
 *     }                                  // the last feed of a round starts the next
 *     moe_beam_result(b, sample, &picks)
 *
 * A round's keys are the union over the batch, each key once; they can all
 * be looked up at once. Per sample, level by level (prefix length 1 .. d):
 * the candidates are the first indices (length 1) or the active suffixes of
 * the previous level's beam; the W best candidates not known dead are taken,
 * and those not yet looked up are wanted. A dead one (key missing, lookup
 * failed, no live entry) is replaced by the next candidate in a further
 * round, so a sample's beam holds W live prefixes whenever that many exist
 * among its candidates. Level 1 is not looked up as a whole: the seed's
 * Algorithm 1 starts from all M first indices and we query the keys of the
 * W best directly. The deepest prefix keys carry the servers (moe_dht.h), so
 * the last level needs no lookup; for d = 2 one round suffices when the
 * first W first indices are alive.
 *
 * Guarantees (tests/unit/moe/test_moe_beam.c checks them against brute
 * force): every expert returned is declared by a live entry, not banned and
 * has a server that is not banned; results are sorted by score (ties: the
 * smaller uid first), without duplicates; and each sample's result is the
 * top k of the experts under its final beam. When W is at least the number
 * of candidates at every level the result equals the global top k over all
 * live experts. */
#ifndef MOE_BEAM_H
#define MOE_BEAM_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe_dht.h"
#include "moe/moe_grid.h"

#define MOE_BEAM_MAX_K 64
#define MOE_BEAM_MAX_WIDTH 1024
#define MOE_BEAM_MAX_BATCH 65536

/* Experts and servers to avoid (copied by moe_beam_new). */
struct moe_ban {
    const struct moe_uid *uids;
    size_t nuids;
    const uint8_t (*servers)[32]; /* servers' Ed25519 keys */
    size_t nservers;
};

struct moe_pick {
    struct moe_uid uid;
    float score;
    int server; /* index for moe_beam_server() */
};

struct moe_beam_stats {
    unsigned rounds;    /* rounds of lookups issued */
    size_t lookups;     /* keys fed */
    size_t failed;      /* of which missing or failed */
    size_t entries;     /* entries fed */
};

struct moe_beam;

/* scores: B * d * M floats, sample-major (copied). width 0: k. CM_EINVAL for
 * a bad grid, k outside 1..MOE_BEAM_MAX_K, width < k or > MOE_BEAM_MAX_WIDTH,
 * B outside 1..MOE_BEAM_MAX_BATCH, a non-finite score or an invalid banned
 * uid. */
int moe_beam_new(const struct moe_grid *g, const float *scores, size_t batch, int k, int width,
                 const struct moe_ban *ban, struct moe_beam **out);
void moe_beam_free(struct moe_beam *b);

int moe_beam_done(const struct moe_beam *b);
/* Current round (1 for the first); it changes when a round's last key is fed. */
unsigned moe_beam_round(const struct moe_beam *b);
/* Keys of the current round (prefixes; moe_key_format gives the DHT key).
 * The pointer is borrowed and valid until the next moe_beam_feed. */
size_t moe_beam_nwanted(const struct moe_beam *b);
const struct moe_uid *moe_beam_wanted(const struct moe_beam *b, size_t i);
/* 1 while prefix is wanted in this round and not yet fed. */
int moe_beam_is_pending(const struct moe_beam *b, const struct moe_uid *prefix);

/* The answer for one wanted prefix: status CM_OK with its entries (as
 * moe_dht_entries gives them; borrowed), anything else for a missing key or
 * a failed lookup (the prefix counts as dead). CM_EINVAL, changing nothing,
 * when prefix is not pending or an entry does not fit the grid. */
int moe_beam_feed(struct moe_beam *b, const struct moe_uid *prefix, int status,
                  const struct moe_entry *e, size_t ne);

/* Results of sample s (after done): *out borrowed, best first. */
size_t moe_beam_result(const struct moe_beam *b, size_t s, const struct moe_pick **out);
const struct moe_server *moe_beam_server(const struct moe_beam *b, int i);
void moe_beam_get_stats(const struct moe_beam *b, struct moe_beam_stats *out);
const struct moe_grid *moe_beam_grid(const struct moe_beam *b);

/* ---- drivers (moe_beam_dht.c) ------------------------------------------ */

/* A short-lived cache of prefix lookups (thread-safe), so repeated searches
 * (a trainer's next batch, a search again after banning a dead expert) skip
 * the DHT. An entry lives min(ttl, the records' own expiry); only found keys
 * are cached, so a dead expert lives at most ttl_ms in it. */
struct moe_cache;
int moe_cache_new(uint32_t ttl_ms, size_t max_keys, struct moe_cache **out);
void moe_cache_free(struct moe_cache *c);
void moe_cache_stats(struct moe_cache *c, uint64_t *hits, uint64_t *misses);

/* Blocking search on a started node (dht_node_start): each round's lookups
 * run at once (dht_get from up to 64 worker threads), each bounded by what
 * is left of deadline_ms. cache may be NULL. CM_ETIMEOUT when the deadline
 * passes before the search is done (b keeps what it learnt). */
int moe_beam_search(struct dht_node *node, const char *run, struct moe_beam *b,
                    uint32_t deadline_ms, struct moe_cache *cache);

/* In-loop search (dht_node_new, one loop): all of a round's dht_get_async
 * at once; cb(arg, status, b) runs once on the loop, with CM_OK when done or
 * CM_ETIMEOUT after deadline_ms. b must outlive the callback. */
typedef void (*moe_beam_cb)(void *arg, int status, struct moe_beam *b);
int moe_beam_search_async(struct dht_node *node, const char *run, struct moe_beam *b,
                          uint32_t deadline_ms, moe_beam_cb cb, void *arg);

#endif
