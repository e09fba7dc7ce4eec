/* Internal layout of struct dht_node, shared by dht_node.c (the in-loop
 * protocol) and dht_service.c (the threaded wrapper). Not a public header. */
#ifndef DHT_NODE_INTERNAL_H
#define DHT_NODE_INTERNAL_H

#include <pthread.h>
#include <uv.h>

#include "dht/dht_node.h"
#include "dht/dht_store.h"
#include "dht/dht_table.h"

struct dht__own {
    struct dht__own *next;
    struct dht_record rec;
};

struct dht__lookup;
struct dht__job;

/* Where a key's records were found last time (dht_node.c, "holder
 * hints"): the next get of that key asks those nodes first. */
#define DHT_HINT_SLOTS 1024
#define DHT_HINT_HOLDERS 3
#define DHT_HINT_TTL_MS 60000
struct dht__hint {
    uint8_t key[DHT_ID_LEN];
    struct dht_contact c[DHT_HINT_HOLDERS];
    uint8_t n;
    int64_t expires_ms;
};

struct dht_node {
    struct p2p_ctx *ctx;
    struct p2p_host *host;
    const struct cm_ed25519 *key;
    uint8_t id[DHT_ID_LEN];
    struct dht_table table;
    struct dht_store store;
    struct dht__own *own;
    struct dht__lookup *lookups;
    struct dht__hint *hints; /* DHT_HINT_SLOTS, allocated at the first get that found records */
    size_t lookup_handles; /* lookups whose timer handle is not closed yet */
    uint32_t rpc_timeout_ms, refresh_ms, republish_ms;
    p2p_request_cb on_other; /* cfg: message types that are not the DHT's */
    void *on_other_arg;
    uv_timer_t timer;
    int64_t last_refresh_ms, last_republish_ms, last_purge_ms;
    int closing;
    int serving; /* listens: holds records for others */
    struct dht_node_stats st;
    /* threaded mode */
    int threaded;
    pthread_t thread;
    uv_loop_t *uvloop;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dht__job *jobs;
    int ready, start_rc, stopping;
};

/* A peer that talked to us (as a request's sender or an answer's): into
 * the routing table when it listens. */
void dht__seen_peer(struct dht_node *n, const struct p2p_peer *p);

#endif
