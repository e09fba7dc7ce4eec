/* Private to the transport's files (p2p_transport.c, p2p_conn.c,
 * p2p_request.c, p2p_addr.c, p2p_stream.c): the structures they share and
 * their cross-file helpers. Not part of the public API: include it only from
 * common/p2p/. */
#ifndef P2P_INTERNAL_H
#define P2P_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "cm_crypto.h"
#include "cm_token.h"
#include "p2p/p2p_envelope.h"
#include "p2p/p2p_rate.h"
#include "p2p/p2p_session.h"
#include "p2p/p2p_transport.h"

/* ---- addresses (p2p_addr.c) --------------------------------------------- */

int p2p__addr_equal(const struct sockaddr_storage *a, const struct sockaddr *b);
socklen_t p2p__addr_len(const struct sockaddr *a);
void p2p__addr_set_port(struct sockaddr_storage *a, uint16_t port);

/* ---- shared state ------------------------------------------------------- */

#define RX_CHUNK (256u * 1024u)

/* C_WAITING: no descriptor yet; the process is at its budget and the
 * connection starts as soon as a closing one releases its descriptor. */
enum conn_state { C_WAITING, C_CONNECTING, C_OPEN, C_CLOSING };

struct wframe {
    struct wframe *next;
    uint8_t *buf;
    size_t len, off;
    int inflight, orphan;
};

struct p2p_conn;
struct p2p_relay;
struct p2p_relay_client;
struct relay_circ;
struct p2p_punch;

/* A frame held back by the emulated link latency (ctx->latency_ms). */
struct delayed {
    struct delayed *next;
    struct p2p_conn *c;
    struct wframe *f;
    int64_t due_ms;
};

struct wreq {
    uv_write_t w;
    struct p2p_conn *c;
    struct wframe *f;
    size_t n;
};

struct pending {
    struct pending *next, *prev;
    uint64_t id;
    uint8_t nonce[P2P_NONCE_LEN];
    uint8_t expect_pub[CM_ED25519_PUB_LEN];
    int has_expect;
    p2p_response_cb cb;
    void *arg;
    uv_timer_t timer;
    struct p2p_conn *conn;
    struct p2p_host *host;
    /* kept to send again once if the connection dies under the request */
    uint32_t type;
    uint8_t *body;
    size_t blen;
    int retried;
    int internal; /* a HELLO: not counted in the stats */
    struct sockaddr_storage addr;
};

/* The initiator's side of a handshake in progress. */
struct hello {
    struct p2p_conn *c;
    struct p2p_kx kx;
    uint8_t nonce[P2P_NONCE_LEN];
};

struct p2p_conn {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_shutdown_t sreq;
    int connected, graceful, has_fd;
    int punched; /* opened by a hole punch (p2p_punch.c), either side */
    struct p2p_conn *fdnext; /* ctx's queue of connections waiting for a descriptor */
    struct p2p_host *h;
    int outgoing;
    enum conn_state state;
    struct sockaddr_storage remote;
    uint8_t *rx;
    size_t rx_len, rx_cap;
    int64_t frame_start_ms, last_active_ms;
    struct wframe *wq_head, *wq_tail;
    size_t wq_bytes;
    struct pending *pend;
    size_t n_pend;
    int reading, bp_paused, in_wait;
    struct p2p_conn *hprev, *hnext; /* host's list */
    struct p2p_conn *cprev, *cnext; /* ctx's list */
    struct p2p_conn *wnext;         /* ctx's upload wait queue */
    /* session (p2p_session.h): once tx_on, frames we send are session
     * frames; once rx_on, session frames are accepted from the peer, whose
     * key, pass and listening port the handshake established */
    int tx_on, rx_on, tx_resign, hello_tried;
    struct hello *hello; /* our HELLO in flight */
    uint32_t n_requests;
    size_t request_bytes;
    struct p2p_mac stx, srx;
    uint8_t peer_pub[CM_ED25519_PUB_LEN];
    uint32_t peer_port;
    struct cm_pass_claims peer_claims;
    struct p2p_deferred *deferred; /* answers a handler took over (p2p_reply_defer) */
    size_t n_deferred;
    /* relays (p2p_relay.c): what the connection is to a circuit */
    int relay;                  /* enum p2p_relay_role */
    int relay_dialer;           /* at a relay: the dialer's side (counts one circuit) */
    int relay_uncounted;        /* at a relay: a circuit's side, bounded by the relay's limits,
                                   not by the host's inbound cap (n_inbound) */
    int close_flushed;          /* close once the write queue has drained */
    struct p2p_conn *splice;    /* at a relay: the other side of the circuit */
    struct p2p_conn *splice_next; /* at a relay: spliced once the ACCEPT answer is out */
    struct relay_circ *circ;    /* at a relay: the circuit waiting for its accept */
    int64_t progress_ms;        /* at a relay: when a write of ours last completed */
    uint8_t *pre;               /* the dialer's bytes that arrived before the accept */
    size_t pre_len;
    struct p2p_punch *punch;    /* a hole punch's try in progress (p2p_punch.c) */
    uint8_t punch_pub[CM_ED25519_PUB_LEN]; /* punched: the peer the punch was with */
};

/* What a connection is to a relay circuit (p2p_relay.c). */
enum p2p_relay_role {
    P2P_RL_NONE = 0,
    P2P_RL_RAW,       /* at a relay: bytes are forwarded (or held until the accept) */
    P2P_RL_ACCEPTING, /* at the reserving peer: our ACCEPT is in flight; never reused */
    P2P_RL_CIRCUIT,   /* at the reserving peer: served as an inbound connection */
    P2P_RL_PUNCHING,  /* a hole punch's initiator, not connected yet: never reused */
    P2P_RL_PUNCH_IN,  /* a hole punch's responder, not connected yet */
};

/* An answer a request handler took over (p2p_reply_defer): what the
 * response envelope needs, and the connection it goes back on (NULL once
 * that connection closed). */
struct p2p_deferred {
    struct p2p_deferred *next, *prev;
    struct p2p_conn *c;
    uint32_t type;
    uint64_t id;
    uint8_t nonce[P2P_NONCE_LEN];
    uint8_t peer[CM_ED25519_PUB_LEN];
};

/* The request a handler is running for, while it runs (p2p_reply_defer). */
struct serving {
    struct p2p_conn *c;
    const struct msg_in *m;
    const uint8_t *peer;
    struct p2p_deferred *taken;
};

struct p2p_ctx {
    uv_loop_t *loop;
    struct p2p_auth auth;
    struct p2p_rate up, down;
    int down_paused;
    uv_timer_t up_timer, down_timer, sweep_timer;
    int up_timer_armed, down_timer_armed, timers_open;
    struct p2p_conn *conns, *conns_tail; /* least recently active first */
    size_t nconns, max_conns;
    size_t fds; /* descriptors held by connections, closing ones included */
    size_t conn_handles; /* connection handles not yet closed */
    size_t rx_held, max_rx_held; /* bytes of partial frames held by connections */
    uint32_t latency_ms;          /* emulated one-way delay of every frame sent */
    struct p2p_latency_rule lat_rules[P2P_MAX_LATENCY_RULES]; /* or this toward some networks */
    size_t n_lat_rules;
    uv_timer_t delay_timer;
    struct delayed *dq_head, *dq_tail; /* in due order (a connection's frames keep theirs) */
    int freeing;
    struct p2p_conn *fdwait_head, *fdwait_tail;
    uint8_t *rxbuf; /* shared read buffer: a connection keeps bytes only for a partial frame */
    struct p2p_conn *wait_head, *wait_tail;
    uint32_t idle_ms, frame_ms;
    size_t max_queue;
    size_t nhosts;
    int no_sessions;
    struct p2p_stats st;
};

struct p2p_host {
    struct p2p_ctx *ctx;
    const struct cm_ed25519 *key;
    char *token;
    uv_tcp_t listener;
    int listening;
    uint16_t port, advertise_port;
    uint32_t max_inbound, n_inbound;
    p2p_request_cb on_request;
    p2p_request_reply_cb on_request_reply;
    p2p_chunk_cb on_chunk;
    void *arg;
    struct p2p_conn *conns;
    uint64_t next_id;
    int closing;
    size_t nhandles;
    struct serving *serving; /* set during a request handler */
    struct p2p_relay *relay;           /* p2p_host_relay_enable */
    struct p2p_relay_client *rclient;  /* p2p_host_relay_use */
    uint64_t relay_accepted, relay_accept_failed; /* circuits we accepted (p2p_relay_stats) */
    struct sockaddr_storage public_ip; /* p2p_host_set_public_ip (hole punching) */
    int has_public_ip;
    struct sockaddr_storage local_ip; /* p2p_host_set_local_ip (peers behind one router) */
    int has_local_ip;
    struct p2p_punch *punches;         /* in progress */
};

/* ---- clocks and lifecycle (p2p_transport.c) ----------------------------- */

uint64_t p2p__now_ns(void);
int64_t p2p__mono_ms(void);
void p2p__ctx_release(struct p2p_ctx *c);

/* ---- connections, frame I/O (p2p_conn.c) -------------------------------- */

void p2p__host_handle_closed(struct p2p_host *h);
void p2p__pending_finish(struct pending *p, int status, const struct p2p_peer *from,
                         const uint8_t *body, size_t len);
void p2p__pending_attach(struct pending *p, struct p2p_conn *c);
void p2p__conn_close(struct p2p_conn *c, int err);
void p2p__conn_drop(struct p2p_conn *c, enum p2p_reject why, const char *detail);
int p2p__evict_one(struct p2p_ctx *ctx);
struct p2p_conn *p2p__conn_alloc(struct p2p_host *h, int outgoing);
/* An incoming connection taken from listener srv for h: open, its peer's
 * address in remote; NULL when it could not be taken (closed then). */
struct p2p_conn *p2p__conn_accept(struct p2p_host *h, uv_stream_t *srv);
int p2p__conn_send(struct p2p_conn *c, uint8_t *buf, size_t len);
int p2p__conn_send_parts(struct p2p_conn *c, const struct p2p_iov *parts, size_t np);
void p2p__read_start(struct p2p_conn *c);
void p2p__read_stop(struct p2p_conn *c);
struct p2p_conn *p2p__conn_get(struct p2p_host *h, const struct sockaddr *addr, int *rc);
/* A fresh outgoing connection, never one that exists. */
struct p2p_conn *p2p__conn_new(struct p2p_host *h, const struct sockaddr *addr, int *rc);
/* Closes c once what it has queued is written (a relay's circuit side). */
void p2p__conn_close_flushed(struct p2p_conn *c);

/* ---- relays (p2p_relay.c) ----------------------------------------------- */

/* Serves RELAY_* requests (inside the serving context: may defer). */
int p2p__relay_serve(struct p2p_conn *c, const struct p2p_peer *from, uint32_t type,
                     const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen);
/* After the answer to an ACCEPT went out on c: splice c to its dialer. */
void p2p__relay_splice(struct p2p_conn *c);
/* Bytes read on a P2P_RL_RAW connection. */
void p2p__relay_bytes(struct p2p_conn *c, const uint8_t *data, size_t n);
/* c is closing: its circuit, its partner, its held bytes. */
void p2p__relay_conn_closed(struct p2p_conn *c);
/* A write on c completed: resume its partner's reading when c drained. */
void p2p__relay_drained(struct p2p_conn *c);
/* The host is closing (its connections are closed already). */
void p2p__relay_host_close(struct p2p_host *h);
/* Hole punching (p2p_punch.c): the responder's side of a PUNCH; a try's
 * connection closing; the host closing. */
int p2p__punch_serve(struct p2p_conn *c, const struct p2p_peer *from, const uint8_t *body, size_t len,
                     uint8_t **resp, size_t *rlen);
void p2p__punch_conn_closed(struct p2p_conn *c);
void p2p__punch_host_close(struct p2p_host *h);

/* ---- requests and responses (p2p_request.c) ----------------------------- */

int p2p__send_envelope(struct p2p_conn *c, uint32_t kind, uint32_t type, uint64_t id,
                       const uint8_t *recipient, uint8_t nonce[P2P_NONCE_LEN], int32_t status,
                       const struct p2p_iov *body, size_t n);
void p2p__handle_frame(struct p2p_conn *c, const uint8_t *frame, size_t plen);
/* Sends a request on this very connection (no reuse, no resend). */
int p2p__request_on_conn(struct p2p_host *h, struct p2p_conn *c, const struct sockaddr *addr,
                         const uint8_t *peer_pub, uint32_t type, const uint8_t *body, size_t len,
                         uint32_t timeout_ms, p2p_response_cb cb, void *arg);

#endif
