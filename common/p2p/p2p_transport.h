/* Peer-to-peer transport: non-blocking TCP on a libuv loop, carrying signed
 * request/response envelopes (p2p_envelope.h) in frames (p2p_frame.h).
 *
 * Objects:
 *   struct p2p_ctx   one per process (or per test swarm): the loop, the
 *                    upload/download token buckets (the caps are per process),
 *                    the connection budget (file descriptors), the receiver's
 *                    auth state (revocations, replay cache). Hosts share it.
 *   struct p2p_host  one identity (key + access token) with an optional
 *                    listening socket. Many hosts may share one ctx and loop;
 *                    the in-process DHT swarms of the tests and benchmarks do.
 *
 * Sessions: a connection that has carried a few requests (or enough
 * bytes) is upgraded by a signed X25519 handshake; from then on its frames
 * are authenticated by a per-connection MAC instead of a signature each
 * (p2p_session.h, docs/protocol.md "Sessions"). The peer's pass is still
 * checked on every message (expiry, revocation).
 *
 * Behaviour: outgoing connections are reused per remote address; every
 * request has a deadline; a request whose reused connection is closed or
 * reset before its answer is sent once more on a fresh connection (the peer
 * may have closed it as idle at the same moment); a connection carries requests both ways; when the
 * process reaches its connection budget the least recently used idle
 * connection is closed; a connection with more than max_conn_queue bytes
 * waiting to be written refuses new requests (CM_EBUSY) and stops reading
 * (backpressure); a peer that sends a malformed frame, an unknown protocol
 * version, an oversized frame or a message that fails authentication is
 * dropped (its connection closed) while every other connection carries on.
 * Large payloads travel as streams of chunks (p2p_stream_send), each chunk a
 * signed request, with a window of chunks in flight.
 *
 * SIGPIPE: p2p_ctx_new() sets SIGPIPE to ignored when it has the default
 * disposition (libuv writes with write(2); a vanished peer must not kill us).
 *
 * Threading: everything here runs on the ctx's loop thread, except
 * p2p_auth_set_revoked() on ctx->auth. */
#ifndef P2P_TRANSPORT_H
#define P2P_TRANSPORT_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "cm_crypto.h"
#include "cm_token.h"
#include "p2p/p2p_envelope.h"
#include "p2p/p2p_session.h"

/* Message types (mirrors enum Ctp2p__MsgType in p2p.proto). */
enum p2p_msg_type {
    P2P_MSG_PING = 1,
    P2P_MSG_STREAM_CHUNK = 2,
    P2P_MSG_HELLO = 3, /* session handshake (p2p_session.h); internal to the transport */
    P2P_MSG_RELAY_RESERVE = 4, /* circuit relays (p2p_relay.h); served by the transport */
    P2P_MSG_RELAY_WAIT = 5,
    P2P_MSG_RELAY_ACCEPT = 6,
    P2P_MSG_PUNCH = 7, /* hole punching (p2p_relay.h); served by the transport */
    P2P_MSG_DHT_FIND_NODE = 16,
    P2P_MSG_DHT_FIND_VALUE = 17,
    P2P_MSG_DHT_STORE = 18,
};

#define P2P_STREAM_CHUNK_MAX (256u * 1024u)

/* Emulated latency toward one network (benchmarks of regions: hosts in
 * network namespaces share one machine, and netem is not available
 * everywhere): frames sent on a connection whose remote address lies in
 * net/bits wait ms before they queue. The first matching rule wins; other
 * connections wait the context's latency_ms. */
#define P2P_MAX_LATENCY_RULES 8
struct p2p_latency_rule {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t net[16];  /* network address (4 bytes for AF_INET) */
    uint8_t bits;     /* prefix length */
    uint32_t ms;      /* one-way delay, 0-10000 */
};
/* Parses "CIDR=MS[,CIDR=MS...]" (e.g. "10.77.0.0/25=40,fd00::/64=5"; a bare
 * address is a /32 or /128), at most cap rules, MS from 0 to 10000. CM_OK
 * with *n set, or CM_EINVAL with the reason in err. */
int p2p_latency_rules_parse(const char *s, struct p2p_latency_rule *out, size_t cap, size_t *n, char *err,
                            size_t errcap);
/* The rule's delay for addr, or -1 when no rule matches (IPv4-mapped IPv6
 * addresses match IPv4 rules). */
long p2p_latency_rules_match(const struct p2p_latency_rule *r, size_t n, const struct sockaddr *addr);

struct p2p_ctx_config {
    uv_loop_t *loop;          /* borrowed; the caller runs it */
    double max_upload_mbps;   /* 0: unlimited */
    double max_download_mbps; /* 0: unlimited */
    size_t max_conns;         /* 0: derived from RLIMIT_NOFILE */
    uint32_t idle_timeout_ms; /* 0: 60 s; idle connections are closed */
    uint32_t frame_timeout_ms;/* 0: 30 s; a started frame must complete within */
    size_t max_conn_queue;    /* 0: 8 MiB of unsent bytes per connection */
    size_t max_rx_buffered;   /* 0: 64 MiB of partial frames, all connections together */
    uint32_t latency_ms;      /* emulated one-way latency added to every frame sent (0: none) */
    const struct p2p_latency_rule *latency_rules; /* copied; toward some networks instead (above) */
    size_t n_latency_rules;   /* at most P2P_MAX_LATENCY_RULES */
    int no_sessions;          /* 1: never upgrade connections to sessions (p2p_session.h):
                                 every frame is a signed envelope */
    struct p2p_auth_config auth;
};

struct p2p_ctx;
struct p2p_host;

/* Who sent a request or response; valid during the callback only. */
struct p2p_peer {
    uint8_t pub[CM_ED25519_PUB_LEN];
    struct sockaddr_storage addr; /* connection's remote IP with the peer's listen port */
    uint32_t listen_port;         /* 0: peer does not accept connections */
    const struct cm_pass_claims *claims;
};

/* Request handler: returns 0 or a negative status for the response; may set
 * *resp to a malloc'd body (owned by the transport afterwards). */
typedef int (*p2p_request_cb)(void *arg, struct p2p_host *h, const struct p2p_peer *from,
                              uint32_t type, const uint8_t *body, size_t len, uint8_t **resp,
                              size_t *resp_len);
/* A reply in two pieces: body (malloc'd, owned by the transport afterwards,
 * may be NULL) followed by tail (borrowed: it must stay valid until the
 * handler returns, the transport builds the frame before anything else
 * runs). Lets a handler answer with bulk data it keeps without copying it
 * into a fresh body first. */
struct p2p_reply {
    uint8_t *body;
    size_t len;
    const uint8_t *tail;
    size_t tail_len;
};
typedef int (*p2p_request_reply_cb)(void *arg, struct p2p_host *h, const struct p2p_peer *from,
                                    uint32_t type, const uint8_t *body, size_t len,
                                    struct p2p_reply *reply);
/* Stream chunk handler: data borrowed for the call. Return 0 to accept. */
typedef int (*p2p_chunk_cb)(void *arg, struct p2p_host *h, const struct p2p_peer *from,
                            uint64_t stream_id, uint64_t offset, uint64_t total_len,
                            const uint8_t *data, size_t len, int last);
/* Completion of p2p_request: status is the responder's status, or a local
 * error (CM_ETIMEOUT, CM_ECONN, CM_ECLOSED, CM_EAUTH...). from is NULL on
 * local errors. Called exactly once, never from inside p2p_request. */
typedef void (*p2p_response_cb)(void *arg, int status, const struct p2p_peer *from,
                                const uint8_t *body, size_t len);

struct p2p_host_config {
    const struct cm_ed25519 *key; /* borrowed, must outlive the host */
    const char *token;            /* copied */
    const char *listen_ip;        /* NULL: no listening socket (client mode) */
    uint16_t listen_port;         /* 0: ephemeral */
    uint16_t advertise_port;      /* port to announce; 0: the bound port */
    uint32_t max_inbound;         /* 0: 512 */
    p2p_request_cb on_request;
    p2p_request_reply_cb on_request_reply; /* instead of on_request when set */
    p2p_chunk_cb on_chunk;
    void *arg;
};

struct p2p_stats {
    uint64_t requests_sent, requests_served, responses_ok, timeouts;
    uint64_t bytes_sent, bytes_received;
    uint64_t conns_opened, conns_accepted, conns_evicted, conns_refused, drops;
    uint64_t retries; /* requests sent again after their connection died under them */
    uint64_t conns_waited; /* connections that waited for a descriptor (budget reached) */
    uint64_t backpressure_pauses; /* times a peer's connection stopped being read */
    uint64_t sessions; /* connections upgraded to session frames (either side) */
};

int p2p_ctx_new(const struct p2p_ctx_config *cfg, struct p2p_ctx **out);
/* Frees the ctx; all its hosts must be closed and the loop run until their
 * handles are closed. */
void p2p_ctx_free(struct p2p_ctx *ctx);
struct p2p_auth *p2p_ctx_auth(struct p2p_ctx *ctx);
uv_loop_t *p2p_ctx_loop(struct p2p_ctx *ctx);
void p2p_ctx_stats(const struct p2p_ctx *ctx, struct p2p_stats *out);
size_t p2p_ctx_conn_count(const struct p2p_ctx *ctx);
/* Changes the caps at run time (mbps <= 0: unlimited). */
void p2p_ctx_set_rates(struct p2p_ctx *ctx, double up_mbps, double down_mbps);
/* The same for pacing just under a link's measured rates (`join --pace`):
 * the buckets hold P2P_PACE_BURST_S of traffic instead of 100 ms, so a lull
 * (a window waiting for its acknowledgements) is not made up by a burst
 * that queues in the router's buffer. On 8 namespace hosts at 100 Mbit/s,
 * paced at 0.92 of the link, the all-reduce took 16.2-16.3 s with 5-10 ms
 * buckets and 16.9-17.4 s with 100 ms ones; 2 ms lost tokens to late
 * timers (19.7 s), 20 ms 16.7 s (docs/averaging.md). */
#define P2P_PACE_BURST_S 0.01
void p2p_ctx_set_pacing(struct p2p_ctx *ctx, double up_mbps, double down_mbps);
/* Changes the emulated one-way latency for frames sent from now on
 * (benchmarks: a swarm joins fast, then measures with WAN-like delays). */
void p2p_ctx_set_latency(struct p2p_ctx *ctx, uint32_t latency_ms);

int p2p_host_new(struct p2p_ctx *ctx, const struct p2p_host_config *cfg, struct p2p_host **out);
/* Fails every pending request (callbacks run before this returns, with
 * CM_ECLOSED), closes every connection and the listener; no callback runs
 * afterwards. The memory is released once libuv has closed the handles. */
void p2p_host_close(struct p2p_host *h);
uint16_t p2p_host_port(const struct p2p_host *h);
const uint8_t *p2p_host_pub(const struct p2p_host *h);
struct p2p_ctx *p2p_host_ctx(struct p2p_host *h);
/* Replaces the host's token (after a pass renewal). */
int p2p_host_set_token(struct p2p_host *h, const char *token);

/* Sends a request to addr (IPv4 or IPv6 with port). peer_pub is the key the
 * responder must prove; NULL is allowed only for P2P_MSG_PING, which is how
 * a bootstrap address's key is learnt. body is copied. */
int p2p_request(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                uint32_t type, const uint8_t *body, size_t len, uint32_t timeout_ms,
                p2p_response_cb cb, void *arg);

/* Like p2p_request with the body gathered from n pieces (copied once,
 * straight into the frame), and without the transport's single resend on a
 * fresh connection (which would need a copy of the body): for bulk senders
 * that retry themselves. */
int p2p_request_iov(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                    uint32_t type, const struct p2p_iov *body, size_t n, uint32_t timeout_ms,
                    p2p_response_cb cb, void *arg);

/* Sends `len` bytes (borrowed until done runs) as a stream of chunks of at
 * most chunk_size bytes (0: 64 KiB), with up to `window` chunks in flight
 * (0: 4). done(arg, status, NULL, NULL, 0) runs once at the end. */
int p2p_stream_send(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                    uint64_t stream_id, const uint8_t *data, size_t len, size_t chunk_size,
                    unsigned window, uint32_t chunk_timeout_ms, p2p_response_cb done, void *arg);

/* Deferred replies. A request handler (on_request or on_request_reply)
 * whose answer is computed elsewhere -- on a worker thread, after other
 * requests join it in a batch (agent/moe/moe_server.h) -- calls
 * p2p_reply_defer(h) while it runs: the transport then sends nothing when
 * the handler returns (its status is ignored, a body it set is freed) and
 * the handler's owner answers later, on the loop thread, with
 * p2p_reply_finish() exactly once, which frees the handle. A second defer
 * in the same call returns the same handle; outside a handler it returns
 * NULL (and on out of memory: the handler should then answer at once).
 * The requester's deadline still bounds its wait; when the connection
 * closed before the answer (the requester went away, the host closed),
 * finish sends nothing and returns CM_ECLOSED. A connection that owes
 * answers is not closed as idle. body: n pieces (at most
 * P2P_SESSION_SEAL_MAX_IOV), copied into the frame. */
struct p2p_deferred;
struct p2p_deferred *p2p_reply_defer(struct p2p_host *h);
int p2p_reply_finish(struct p2p_deferred *d, int status, const struct p2p_iov *body, size_t n);

/* Helpers. */
int64_t p2p_now_ms(void);
/* Parses "host:port" / "[v6]:port" with a numeric address or a name (a
 * name is looked up within P2P_RESOLVE_MS: CM_ENOTFOUND or CM_ETIMEOUT). */
#define P2P_RESOLVE_MS 3000
int p2p_addr_parse(const char *s, struct sockaddr_storage *out);
void p2p_addr_format(const struct sockaddr *a, char *out, size_t cap);

#endif
