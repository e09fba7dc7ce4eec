/* The collaborative agent's network side: one thread running a libuv loop
 * with the process's p2p context (bandwidth caps), a Kademlia DHT node and
 * the averaging engine. The training thread talks to it through blocking
 * calls that queue a job on the loop and wait for its completion; every
 * call is bounded (DHT lookups by their RPC deadlines, rounds by theirs). */
#ifndef AGENT_PEER_NET_H
#define AGENT_PEER_NET_H

#include <stddef.h>
#include <stdint.h>

#include "ar/ar.h"
#include "dht/dht_node.h"
#include "p2p/p2p_probe.h"
#include "p2p/p2p_transport.h"
#include "cm_crypto.h"

struct peer_net_config {
    const struct cm_ed25519 *key; /* borrowed, outlives the net */
    const char *token;
    const char *run;
    const uint8_t (*coord_keys)[CM_ED25519_PUB_LEN];
    size_t n_coord_keys;
    const char *listen_ip; /* NULL: client mode (no inbound connections) */
    uint16_t dht_port, ar_port; /* 0: ephemeral */
    double max_upload_mbps, max_download_mbps; /* 0: unlimited */
    const char *const *bootstrap;
    size_t n_bootstrap;
    /* Requests of types the net does not serve itself, on the state host
       (the role's messages: the expert server's, docs/experts.md); runs on
       the loop thread; NULL: refused (CM_EPROTO). */
    p2p_request_cb on_other;
    void *on_other_arg;
    /* Emulated one-way delay added to every frame this agent sends (a test
       and benchmark knob: netem is not available, docs/p2p.md); 0: none. */
    uint32_t latency_ms;
    /* ... and toward some networks instead (p2p_latency_rule; borrowed) */
    const struct p2p_latency_rule *latency_rules;
    size_t n_latency_rules;
};

struct peer_net;

int peer_net_start(const struct peer_net_config *cfg, struct peer_net **out);
void peer_net_stop(struct peer_net *n);
/* Joins the DHT through these "ip:port" nodes (what peer_net_start does
 * with cfg->bootstrap; a start with none leaves the node out of everyone's
 * routing table until this). Waits for the bootstrap. */
int peer_net_bootstrap(struct peer_net *n, const char *const *addrs, size_t count);
uint16_t peer_net_ar_port(const struct peer_net *n);
uint16_t peer_net_dht_port(const struct peer_net *n); /* 0 in client mode */

/* A record read from the DHT: author and value (heap). */
struct peer_record {
    uint8_t author[CM_ED25519_PUB_LEN];
    uint8_t *value;
    size_t len;
};
void peer_records_free(struct peer_record *r, size_t n);

/* Stores my entry (subkey "p") under key, expiring ttl_ms from now. */
int peer_net_put(struct peer_net *n, const char *key, const void *value, size_t len, int64_t ttl_ms);
/* Reads every live entry of key. *out is heap (peer_records_free). */
int peer_net_get(struct peer_net *n, const char *key, struct peer_record **out, size_t *count);

/* One averaging round; cfg->done/arg are set by this call. The summary is
 * copied out of the engine's result. */
struct peer_round_summary {
    int status;
    size_t n_parts, n_averaged;
    double weight; /* smallest total weight over the averaged parts */
    size_t n_excluded;
    uint32_t excluded[AR_MAX_MEMBERS];
    int excluded_reason[AR_MAX_MEMBERS];
    double ms_total;
    uint64_t bytes_sent, bytes_received;
    uint8_t round_id[AR_ROUND_ID_LEN];
    uint64_t averaged_mask;          /* bit k: part k committed (parts <= 64) */
    size_t part_off[AR_MAX_MEMBERS], part_len[AR_MAX_MEMBERS]; /* elements */
    uint32_t part_owner[AR_MAX_MEMBERS]; /* member index of each part's aggregator */
    int part_status[AR_MAX_MEMBERS];     /* CM_OK, or why the part was not averaged */
};
int peer_net_allreduce(struct peer_net *n, struct ar_round_config *cfg, struct peer_round_summary *out);

/* Replaces the access token of the DHT node and the averaging engine (after
 * a pass renewal). */
int peer_net_set_token(struct peer_net *n, const char *token);

/* ---- state transfer (late joiners, peers behind or diverged) ----------
 * Every peer that accepts connections serves its newest training state on
 * a third p2p host (message P2P type PEER_MSG_STATE, docs/protocol.md,
 * "State transfer"): the training thread publishes a snapshot (the bytes of
 * a checkpoint file) when someone asked for a newer step than the one
 * published; requesters fetch it in chunks and check its SHA-256. */
#define PEER_MSG_STATE 48
#define PEER_STATE_CHUNK (192u * 1024u)
uint16_t peer_net_state_port(const struct peer_net *n);
/* Hands over a snapshot (bytes owned by the net afterwards) of `step`. */
void peer_net_state_publish(struct peer_net *n, int64_t step, uint8_t *bytes, size_t len);
/* The lowest step someone asked for and the snapshot does not have yet
 * (-1: nobody waits); reset by a snapshot of that step or later, after
 * which those who want a later one ask again. */
int64_t peer_net_state_wanted(const struct peer_net *n);
/* Fetches a peer's state of at least min_step into dest (written to
 * dest.part, checked, renamed); *step_out = its step. Gives up after
 * deadline_ms, or after ready_ms (when not 0) without the peer having such
 * a state ready. CM_EBUSY: the peer did not produce it in time. idle(arg,
 * moving) (if given) runs before every request (each poll while the peer
 * prepares it, each chunk; moving: 1 once the peer had it ready and its
 * chunks come, 0 before): the caller serves its own state there, since
 * peers waiting on each other's states would otherwise each wait out the
 * other's deadline; when it returns nonzero the fetch stops with
 * CM_ECANCELED (Ctrl-C) and nothing is written. */
int peer_net_state_fetch(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN],
                         int64_t min_step, const char *dest, int64_t *step_out, uint32_t deadline_ms,
                         uint32_t ready_ms, int (*idle)(void *arg, int moving), void *arg);

/* Pairwise throughput (capability reports, docs/schedules.md): the probe
 * message PEER_MSG_PROBE carries up to PEER_PROBE_CHUNK bytes the peer's
 * state host reads and drops. peer_net_probe sends up to `bytes` in such
 * messages, two in flight, and returns the rate in Mbit/s of what was
 * acknowledged, counting only the time when *busy (if given) was 0: while
 * it is set, the probe sends nothing and waits. It measures at most
 * budget_ms of such quiet time and gives up after deadline_ms (CM_ETIMEOUT
 * when it measured nothing), sooner once *stop (if given) is set; a probe
 * the host refuses midway (CM_EBUSY) returns what it measured. The state host
 * serves one prober at a time: a probe message from another peer within
 * PEER_PROBE_HOLD_MS of the current prober's last gets CM_EBUSY (probe
 * again later). */
#define PEER_MSG_PROBE P2P_MSG_PROBE /* p2p/p2p_probe.h, shared with the backbone */
#define PEER_PROBE_CHUNK P2P_PROBE_CHUNK
#define PEER_PROBE_HOLD_MS P2P_PROBE_HOLD_MS
int peer_net_probe(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN],
                   size_t bytes, uint32_t budget_ms, uint32_t deadline_ms, const int *busy,
                   const int *stop, double *mbps);

/* The link's own rate (docs/schedules.md, "Measured links"): like
 * peer_net_probe, against a host with a fat link (the coordinator's DHT
 * backbone node, p2p/p2p_probe.h), with 32 KiB messages, from 2 in flight
 * up to about 50 ms of the rate measured so far (at most 64), so a fast
 * path fills and a slow one holds little queued: our upload (down = 0) or
 * our download (down = 1, the host sends). */
int peer_net_link_probe(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int down,
                        size_t bytes, uint32_t budget_ms, uint32_t deadline_ms, const int *busy,
                        const int *stop, double *mbps);
/* The round trip to the peer at addr: the smallest of `count` (1..16)
 * Pings after one that may open the connection, in milliseconds, as the
 * transport delivers them (the peer's loop and our job queue included). */
#define PEER_RTT_TIMEOUT_MS 2000
int peer_net_rtt(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int count,
                 double *rtt_ms);

/* The key of the peer at addr (a Ping, which needs none), for probes of
 * a bootstrap address. */
int peer_net_key_of(struct peer_net *n, const char *addr, uint8_t pub[CM_ED25519_PUB_LEN]);

/* Runs fn(arg, n) on the net's loop thread and returns once it has run
 * (CM_ECLOSED, without running it, when the net stops). fn must not block:
 * it starts asynchronous work (the DHT's dht_*_async calls on
 * peer_net_dht(n), p2p requests from peer_net_host(n)) whose callbacks,
 * also on the loop, tell the caller by their own means. */
int peer_net_call(struct peer_net *n, void (*fn)(void *arg, struct peer_net *n), void *arg);
/* Caps this agent's traffic (Mbit/s, <= 0: none) from now on; waits until
 * the loop took them. */
int peer_net_set_rates(struct peer_net *n, double up_mbps, double down_mbps);
/* The same with short buckets, for pacing under the measured link
 * (p2p_ctx_set_pacing). */
int peer_net_set_pacing(struct peer_net *n, double up_mbps, double down_mbps);
/* The loop-thread objects, for fn above only: the DHT node, and the host
 * that serves state (and on_other's types) and sends requests. */
struct dht_node *peer_net_dht(struct peer_net *n);
struct p2p_host *peer_net_host(struct peer_net *n);

/* Relays (docs/p2p.md, "Relays"). A reachable agent lends ports on its
 * state host (default limits of p2p_relay.h). An unreachable one reserves
 * a port for its averaging host and one for its state host at the relay
 * whose state host is at `relay` with key `pub`; on success the two
 * addresses that now lead to us ("ip:port"), which we announce. Blocks
 * until both are reserved (or timeout_ms). peer_net_relay_lost: nonzero
 * (the reason) once either reservation was lost since; use another relay
 * then. Thread-safe. */
#define PEER_RELAY_ADDR_MAX 64
struct p2p_relay_stats;
int peer_net_relay_offer(struct peer_net *n);
int peer_net_relay_use(struct peer_net *n, const char *relay, const uint8_t pub[CM_ED25519_PUB_LEN],
                       uint32_t timeout_ms, char ar_adv[PEER_RELAY_ADDR_MAX],
                       char st_adv[PEER_RELAY_ADDR_MAX]);
int peer_net_relay_lost(struct peer_net *n);
void peer_net_relay_drop(struct peer_net *n);
/* What our state host relayed for others, and circuits we accepted. */
void peer_net_relay_stats(struct peer_net *n, struct p2p_relay_stats *out);

/* Hole punching (docs/p2p.md, "Hole punching"; common/p2p/p2p_relay.h).
 * peer_net_set_public_ip: the address the coordinator sees us at, which
 * punches need on both sides (and which makes us answer punches).
 * peer_net_set_local_ip: our address on our own network, so peers behind
 * the same router meet there instead of through a relay.
 * peer_net_punch: in the background, a direct connection from our
 * averaging host to the relayed averaging address `addr` of the peer with
 * key pub; from then on our requests to addr go over it (the relay again
 * when it dies). One try per peer and address at a time; after a failure
 * (a symmetric NAT) the next try waits PEER_PUNCH_RETRY_S, doubling.
 * peer_net_punch_state: where that stands. Thread-safe. */
enum { PEER_PUNCH_NONE, PEER_PUNCH_TRYING, PEER_PUNCH_DIRECT, PEER_PUNCH_FAILED };
#define PEER_PUNCH_TIMEOUT_MS 3000
#define PEER_PUNCH_RETRY_S 60.0
int peer_net_set_public_ip(struct peer_net *n, const char *ip);
int peer_net_set_local_ip(struct peer_net *n, const char *ip);
void peer_net_punch(struct peer_net *n, const uint8_t pub[CM_ED25519_PUB_LEN], const char *addr);
int peer_net_punch_state(struct peer_net *n, const uint8_t pub[CM_ED25519_PUB_LEN], const char *addr);
/* Open connections of the averaging host that punches made, either side
 * (p2p_host_punched); 0 when the net is not running. Thread-safe. */
size_t peer_net_punched(struct peer_net *n);

/* Replaces the revocation list the receivers check. Thread-safe. */
void peer_net_set_revoked(struct peer_net *n, const char *const *ids, size_t count, int64_t generated_at);

#endif
