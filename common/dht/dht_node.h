/* Kademlia DHT node (seed 002_2b00836ea4b30f79.txt, section 2.4, 3.3 and
 * Appendix B; Maymounkov & Mazieres 2002): k = 20, alpha = 3, PING,
 * FIND_NODE, FIND_VALUE and STORE over signed p2p envelopes, bucket refresh,
 * republishing of the records this node published, expiration times on all
 * values (the latest expiration wins), and dictionary values whose entries
 * are owned and signed by their authors.
 *
 * Two ways to run a node:
 *
 * 1. In a loop you run (tests, benchmarks, swarms of thousands of nodes in
 *    one process sharing one p2p_ctx): dht_node_new() / dht_node_free(),
 *    with the asynchronous calls dht_*_async(). Everything on the loop thread.
 *
 * 2. In its own thread with its own libuv loop (the agent; the
 *    coordinator's backbone node in `crowdtrain-coordinator serve`):
 *
 *        struct dht_config cfg = {
 *            .key = &node_key,            // Ed25519 key, outlives the node
 *            .token = access_token,       // the coordinator mints one for its
 *                                         // own node key with cm_token_sign()
 *            .listen_ip = "0.0.0.0", .listen_port = 31337,
 *            .ctx = {.auth = {.run = "fmnist", .coord_keys = keys,
 *                             .n_coord_keys = 1}},
 *        };
 *        struct dht_node *node;
 *        int rc = dht_node_start(&cfg, &node);  // returns once listening
 *        ...  dht_put(node, ...), dht_get(node, ...) from any thread ...
 *        dht_node_stop(node);                   // joins the thread, frees all
 *
 *    The blocking calls marshal onto the node's loop and wait at most their
 *    deadline; they are safe from any number of threads.
 *
 * Keys are arbitrary byte strings (for example "progress.fmnist"); the DHT
 * locates them by SHA-256. Values are at most DHT_MAX_VALUE bytes. */
#ifndef DHT_NODE_H
#define DHT_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"
#include "dht/dht_types.h"
#include "p2p/p2p_transport.h"

struct p2p_relay_limits;

struct dht_config {
    const struct cm_ed25519 *key; /* borrowed; must outlive the node */
    const char *token;            /* copied */
    const char *listen_ip;        /* NULL: client mode (no inbound connections) */
    uint16_t listen_port;         /* 0: ephemeral */
    uint16_t advertise_port;      /* 0: the bound port */
    uint32_t rpc_timeout_ms;      /* 0: 3000 */
    uint32_t refresh_interval_ms; /* 0: 15 min; buckets without lookups are refreshed */
    uint32_t republish_interval_ms; /* 0: 10 min; own records are stored again */
    size_t max_records;           /* 0: 65536 */
    /* Requests of other types on the node's host (the coordinator's
       backbone answers throughput probes, p2p/p2p_probe.h); NULL: refused
       (CM_EUNSUPPORTED). Runs on the node's loop. */
    p2p_request_cb on_other;
    void *on_other_arg;
    /* Non-NULL (and a listening node): the node's host lends relay ports
       with these limits (p2p/p2p_relay.h; the coordinator's backbone). */
    const struct p2p_relay_limits *relay;
    /* dht_node_start only: the process context (caps, auth) it creates. */
    struct p2p_ctx_config ctx;
    /* dht_node_start only: "host:port" peers to bootstrap from. */
    const char *const *bootstrap;
    size_t n_bootstrap;
};

struct dht_node;

/* The outcome of a lookup, a get or a put. Pointers are valid during the
 * callback only (or until dht_result_cleanup for the blocking calls). */
struct dht_result {
    int status;               /* CM_OK, CM_ENOTFOUND (get: no live record), ... */
    struct dht_record *rec;   /* get: live records, merged (newest per entry) */
    size_t nrec;
    struct dht_contact *closest; /* find_node: nearest nodes that answered */
    size_t nclosest;
    int hops;                 /* lookup depth of the answer: 1 = a contact from our own
                                 table answered, 2 = one learnt from those, ...; 0 = our
                                 own store (get), for find_node the closest node's depth */
    int contacted;            /* nodes asked */
    int stored;               /* put: nodes that accepted the record */
};

typedef void (*dht_cb)(void *arg, const struct dht_result *res);

struct dht_node_stats {
    uint64_t lookups, lookup_hops, rpcs_sent, rpcs_failed, rpcs_served, refreshes, republished;
    size_t routing_contacts, records;
    size_t approx_bytes; /* routing table + store + node structs */
};

/* ---- in-loop API (loop thread only) ------------------------------------ */

int dht_node_new(struct p2p_ctx *ctx, const struct dht_config *cfg, struct dht_node **out);
/* Stops the node: pending operations complete with CM_ECLOSED (their
 * callbacks run inside this call), the host closes; memory is released
 * once the loop has closed the handles. */
void dht_node_free(struct dht_node *n);
uint16_t dht_node_port(const struct dht_node *n);
const uint8_t *dht_node_id(const struct dht_node *n);
void dht_node_get_stats(const struct dht_node *n, struct dht_node_stats *out);
struct p2p_host *dht_node_host(struct dht_node *n);

/* Pings each address (learning its key), then looks up our own id. */
int dht_bootstrap_async(struct dht_node *n, const struct sockaddr_storage *addrs, size_t naddrs,
                        dht_cb cb, void *arg);
/* Adds a known contact directly (tests, or a peer learnt elsewhere). */
int dht_node_add_contact(struct dht_node *n, const uint8_t pub[32], const struct sockaddr *addr);
int dht_find_node_async(struct dht_node *n, const uint8_t target[DHT_ID_LEN], dht_cb cb,
                        void *arg);
/* Signs and stores key/subkey -> value (subkey NULL or empty: plain value)
 * on the k nodes closest to SHA-256(key), and republishes it until it
 * expires. res->stored says how many nodes accepted it. */
int dht_put_async(struct dht_node *n, const void *key, size_t klen, const void *subkey,
                  size_t sklen, const void *value, size_t vlen, int64_t expires_ms, dht_cb cb,
                  void *arg);
/* Finds the live records of key: the plain value with the latest
 * expiration and every dictionary entry (newest per author and subkey). */
int dht_get_async(struct dht_node *n, const void *key, size_t klen, dht_cb cb, void *arg);
/* The same with flags. DHT_GET_GRACE: answer a quarter of the first
 * remote source's round trip after it (at least 5 ms), with the records of every source that
 * answered by then, instead of waiting for three sources (a read that
 * must be fast rather than complete: the beam search's prefix reads, where
 * an expert missed now is found on the next search; not for records every
 * reader must see, like round announcements). */
#define DHT_GET_GRACE 1u
int dht_get_async_ex(struct dht_node *n, const void *key, size_t klen, unsigned flags, dht_cb cb, void *arg);
/* Runs one refresh / republish pass now (normally timer driven). */
void dht_node_refresh_now(struct dht_node *n);
void dht_node_republish_now(struct dht_node *n);

/* ---- threaded API ------------------------------------------------------ */

/* Starts a node in its own thread and loop, with its own p2p_ctx from
 * cfg->ctx (its loop field is ignored), bootstraps from cfg->bootstrap when
 * given (failure to reach them is logged, not fatal: others may bootstrap
 * from us), and returns once the node listens. */
int dht_node_start(const struct dht_config *cfg, struct dht_node **out);
void dht_node_stop(struct dht_node *n);

/* Blocking calls for started nodes, from any thread; deadline_ms bounds the
 * wait (CM_ETIMEOUT). CM_ESTATE on a node made with dht_node_new. */
int dht_put(struct dht_node *n, const void *key, size_t klen, const void *subkey, size_t sklen,
            const void *value, size_t vlen, int64_t expires_ms, uint32_t deadline_ms,
            int *stored);
/* On CM_OK fills *res (records owned by it; free with dht_result_cleanup). */
int dht_get(struct dht_node *n, const void *key, size_t klen, uint32_t deadline_ms,
            struct dht_result *res);
int dht_get_ex(struct dht_node *n, const void *key, size_t klen, unsigned flags, uint32_t deadline_ms,
               struct dht_result *res);
/* Picks the plain value out of a get result: NULL when there is none. */
const struct dht_record *dht_result_plain(const struct dht_result *res);
void dht_result_cleanup(struct dht_result *res);
/* Dial-back (docs/p2p.md, "Reachability"): pings every address at once
 * from the node's host, each request addressed to and answered only by the
 * holder of `pub`, with its own deadline. status[i] gets CM_OK when that
 * key answered at addrs[i], else why not (CM_ECONN refused or unreachable,
 * CM_ETIMEOUT, CM_EAUTH/CM_ECLOSED: someone else answered); ms[i] (may be
 * NULL) the milliseconds until then. Returns CM_OK once every ping ended. */
int dht_ping(struct dht_node *n, const struct sockaddr_storage *addrs, size_t naddrs,
             const uint8_t pub[32], uint32_t timeout_ms, int *status, uint32_t *ms);
/* Bootstraps a started node from "host:port" strings. */
int dht_bootstrap(struct dht_node *n, const char *const *addrs, size_t naddrs,
                  uint32_t deadline_ms);
int dht_stats(struct dht_node *n, struct dht_node_stats *out, struct p2p_stats *net);
/* The p2p context of a started node (to set caps or revocations). */
struct p2p_ctx *dht_node_ctx(struct dht_node *n);

#endif
