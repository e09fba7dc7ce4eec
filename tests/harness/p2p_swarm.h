/* An in-process DHT swarm for tests and benchmarks: N nodes, each with its
 * own key, access token and listening socket on 127.0.0.1, all on one libuv
 * loop and one p2p_ctx (real sockets, real signed protocol). */
#ifndef P2P_SWARM_H
#define P2P_SWARM_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "dht/dht_node.h"
#include "tests/harness/p2p_testkit.h"

struct p2p_swarm {
    uv_loop_t loop;
    struct p2p_tk own_tk, *tk;
    struct p2p_ctx *ctx;
    size_t n;
    struct p2p_tk_peer *peers;
    struct dht_node **nodes; /* NULL once killed */
    int *alive;
    char listen_ip[64];
    size_t join_failures; /* joins that failed the first time (then retried once) */
};

struct p2p_swarm_opts {
    uint32_t rpc_timeout_ms;   /* 0: 2000 */
    uint32_t refresh_ms, republish_ms;
    size_t join_batch;         /* nodes joining at once; 0: 32 */
    double up_mbps, down_mbps;
    const char *listen_ip;     /* NULL: 127.0.0.1 */
    struct p2p_tk *tk;         /* coordinator to mint passes with; NULL: a new one */
    const char *name_prefix;   /* user names, so swarms in other processes differ */
};

/* Raises RLIMIT_NOFILE to the hard limit; returns the new soft limit. */
size_t p2p_swarm_raise_fd_limit(void);
int p2p_swarm_init(struct p2p_swarm *s, size_t n, const struct p2p_swarm_opts *o);
/* Every node but the first bootstraps from node 0; a node whose join
 * fails tries once more. CM_OK when every node joined. */
int p2p_swarm_join(struct p2p_swarm *s, size_t batch);
/* Every node (node 0 included) bootstraps from an outside address. */
int p2p_swarm_join_addr(struct p2p_swarm *s, const struct sockaddr_storage *boot, size_t batch);
void p2p_swarm_kill(struct p2p_swarm *s, size_t i);
void p2p_swarm_cleanup(struct p2p_swarm *s);
/* Runs the loop until *counter >= target or timeout; returns 0 if reached. */
int p2p_swarm_run_until(struct p2p_swarm *s, const int *counter, int target, int timeout_ms);

#endif
