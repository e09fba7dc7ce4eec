/* What agent/peer/net.c (the network thread and its jobs) and
 * agent/peer/net_probe.c (throughput probes and round trips) share; not for
 * other callers. */
#ifndef AGENT_PEER_NET_INT_H
#define AGENT_PEER_NET_INT_H

#include "agent/peer/net.h"
#include "p2p/p2p_probe.h"

#include <pthread.h>
#include <uv.h>

#define JOB_GRACE_MS 120000 /* an upper bound no operation reaches: they have their own deadlines */

enum job_kind { JOB_PUT, JOB_GET, JOB_ROUND, JOB_BOOT, JOB_TOKEN, JOB_REQ, JOB_CALL };

struct job {
    struct job *next;
    enum job_kind kind;
    int refs, done, rc;
    char key[256];
    uint8_t *value;
    size_t len;
    int64_t expires_ms;
    struct sockaddr_storage *addrs;
    size_t naddrs;
    struct peer_record *recs;
    size_t nrecs;
    struct ar_round_config round;
    struct peer_round_summary sum;
    struct peer_net *net;
    uint8_t peer_pub[CM_ED25519_PUB_LEN]; /* JOB_REQ; with no_key, the responder's */
    int no_key;                           /* JOB_REQ: a Ping to learn the key */
    uint32_t type, timeout_ms;
    uint8_t *resp;
    size_t resp_len;
    void (*fn)(void *arg, struct peer_net *n); /* JOB_CALL */
    void *fn_arg;
};

/* One of our reservations at a relay (net_relay.c); under relay_mu. */
struct peer_relay_slot {
    struct peer_net *net;
    int reserved, lost, status;
    char adv[PEER_RELAY_ADDR_MAX];
};

/* A peer we punched (or try to punch) a hole to (net_punch.c); under
 * relay_mu. */
#define PEER_PUNCH_MAX 64
struct peer_punch {
    struct peer_net *net;
    uint8_t pub[CM_ED25519_PUB_LEN];
    struct sockaddr_storage addr; /* its relayed averaging address */
    int state;                    /* PEER_PUNCH_* of net.h */
    double retry_at;              /* mono s: a failed one is tried again from then */
    double checked_at;            /* mono s: a direct one's connection last seen open */
    int fails;
};

struct peer_net {
    uv_loop_t loop;
    uv_async_t async;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *jobs;
    int stopping, ready, start_rc;
    struct p2p_ctx *ctx;
    struct dht_node *dht;
    struct ar_engine *ar;
    uint16_t ar_port;
    struct p2p_host *st_host; /* state transfer: serves snapshots, fetches */
    uint16_t st_port;
    uint16_t dht_port; /* 0 in client mode */
    struct p2p_probe_hold probe; /* the peer probing us now (loop thread only) */
    p2p_request_cb on_other;  /* the role's message types on the state host (cfg) */
    void *on_other_arg;
    pthread_mutex_t st_mu;    /* guards the snapshot below (loop and training threads) */
    uint8_t *st_bytes;
    size_t st_len;
    int64_t st_step, st_wanted;
    uint8_t st_sha[CM_SHA256_LEN];
    const struct peer_net_config *cfg; /* during start only */
    pthread_mutex_t relay_mu;
    struct peer_relay_slot relay_ar, relay_st;
    struct peer_punch punch[PEER_PUNCH_MAX]; /* under relay_mu */
    int public_ip_set;                       /* loop thread */
};

/* Queues a job on the loop (CM_ECLOSED when the net stops); waits for it
 * (bounded by JOB_GRACE_MS: its operation has its own deadline); drops the
 * caller's reference. */
int net__enqueue(struct peer_net *n, struct job *j);
int net__wait_job(struct peer_net *n, struct job *j);
void net__release(struct peer_net *n, struct job *j);
/* One request on the state host, waited for; *resp (heap) is the answer. */
int net__request(struct peer_net *n, const struct sockaddr_storage *addr, const uint8_t *pub,
                 uint32_t type, const uint8_t *body, size_t len, uint32_t timeout_ms,
                 uint8_t **resp, size_t *resp_len);

#endif
