/* Non-blocking TCP transport for signed peer messages on libuv (see
 * p2p_transport.h). Framing and envelope decoding are pure functions in
 * p2p_frame.c / p2p_envelope.c; this file owns sockets, queues, deadlines,
 * the connection budget and the bandwidth caps. Authentication follows seed
 * 000_02cc6b5d62a616fc.txt, Appendix H.4. */
#include "p2p/p2p_transport.h"
#include "p2p/p2p.pb-c.h"
#include "p2p/p2p_frame.h"
#include "p2p/p2p_msg.h"
#include "p2p/p2p_rate.h"
#include "p2p/p2p_session.h"
#include "p2p/p2p_internal.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"

#define WRITE_SLICE (64u * 1024u)
#define RX_CHUNK (256u * 1024u)
/* A connection is upgraded to a session (p2p_session.h) once it has carried
 * this many requests or bytes of request bodies: bulk transfers get cheap
 * MACs, one-shot RPCs (most DHT traffic) do not pay for a handshake. */
#define SESSION_AFTER_REQUESTS 4
#define SESSION_AFTER_BYTES (256u * 1024u)

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
    uv_timer_t delay_timer;
    struct delayed *dq_head, *dq_tail; /* in due order: the delay is constant */
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
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

int64_t p2p_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
    return (int64_t)(uv_hrtime() / 1000000);
}

/* ---- ctx --------------------------------------------------------------- */

static void sweep_cb(uv_timer_t *t);

int p2p_ctx_new(const struct p2p_ctx_config *cfg, struct p2p_ctx **out)
{
    if (!cfg->loop)
        return CM_EINVAL;
    struct p2p_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CM_ENOMEM;
    int rc = p2p_auth_init(&c->auth, &cfg->auth);
    if (rc) {
        free(c);
        return rc;
    }
    c->loop = cfg->loop;
    if (!(c->rxbuf = malloc(RX_CHUNK))) {
        p2p_auth_cleanup(&c->auth);
        free(c);
        return CM_ENOMEM;
    }
    /* libuv writes with write(2), which raises SIGPIPE when a peer has
     * gone; a server must not die of that. Only the default disposition is
     * changed, a handler the program installed is kept. */
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
    p2p_rate_init(&c->up, cfg->max_upload_mbps, now_ns());
    p2p_rate_init(&c->down, cfg->max_download_mbps, now_ns());
    c->idle_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms : 60000;
    c->frame_ms = cfg->frame_timeout_ms ? cfg->frame_timeout_ms : 30000;
    c->max_queue = cfg->max_conn_queue ? cfg->max_conn_queue : 8u << 20;
    c->max_rx_held = cfg->max_rx_buffered ? cfg->max_rx_buffered : 64u << 20;
    c->max_conns = cfg->max_conns;
    if (!c->max_conns) {
        /* Each connection is one descriptor; keep a quarter of the limit
         * (and at least 64) for listeners, files and libraries. */
        struct rlimit rl;
        size_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (size_t)rl.rlim_cur : 1024;
        c->max_conns = lim > 256 ? lim - lim / 4 : 64;
    }
    c->latency_ms = cfg->latency_ms;
    c->no_sessions = cfg->no_sessions;
    uv_timer_init(c->loop, &c->up_timer);
    uv_timer_init(c->loop, &c->down_timer);
    uv_timer_init(c->loop, &c->sweep_timer);
    uv_timer_init(c->loop, &c->delay_timer);
    c->up_timer.data = c->down_timer.data = c->sweep_timer.data = c->delay_timer.data = c;
    uv_unref((uv_handle_t *)&c->up_timer);
    uv_unref((uv_handle_t *)&c->down_timer);
    uv_unref((uv_handle_t *)&c->sweep_timer);
    uv_unref((uv_handle_t *)&c->delay_timer);
    uv_timer_start(&c->sweep_timer, sweep_cb, 1000, 1000);
    c->timers_open = 4;
    *out = c;
    return CM_OK;
}

static void ctx_release(struct p2p_ctx *c)
{
    /* Connection handles of closed hosts may close after the ctx timers:
     * the ctx goes when the last of them has. */
    if (c->freeing && c->timers_open == 0 && c->conn_handles == 0) {
        p2p_auth_cleanup(&c->auth);
        free(c->rxbuf);
        free(c);
    }
}

static void ctx_timer_closed(uv_handle_t *hd)
{
    struct p2p_ctx *c = hd->data;
    c->timers_open--;
    ctx_release(c);
}

void p2p_ctx_free(struct p2p_ctx *ctx)
{
    if (!ctx)
        return;
    /* The timers close asynchronously; the ctx is released in their close
     * callbacks, so the caller should run the loop once more. */
    ctx->freeing = 1;
    uv_close((uv_handle_t *)&ctx->up_timer, ctx_timer_closed);
    uv_close((uv_handle_t *)&ctx->down_timer, ctx_timer_closed);
    uv_close((uv_handle_t *)&ctx->sweep_timer, ctx_timer_closed);
    uv_close((uv_handle_t *)&ctx->delay_timer, ctx_timer_closed);
}

struct p2p_auth *p2p_ctx_auth(struct p2p_ctx *ctx)
{
    return &ctx->auth;
}

uv_loop_t *p2p_ctx_loop(struct p2p_ctx *ctx)
{
    return ctx->loop;
}

void p2p_ctx_stats(const struct p2p_ctx *ctx, struct p2p_stats *out)
{
    *out = ctx->st;
}

size_t p2p_ctx_conn_count(const struct p2p_ctx *ctx)
{
    return ctx->nconns;
}

void p2p_ctx_set_rates(struct p2p_ctx *ctx, double up_mbps, double down_mbps)
{
    p2p_rate_init(&ctx->up, up_mbps, now_ns());
    p2p_rate_init(&ctx->down, down_mbps, now_ns());
}

void p2p_ctx_set_latency(struct p2p_ctx *ctx, uint32_t latency_ms)
{
    ctx->latency_ms = latency_ms;
}

/* ---- connections ------------------------------------------------------- */

static void conn_flush(struct p2p_conn *c);
static void conn_close(struct p2p_conn *c, int err);
static void read_start(struct p2p_conn *c);

static void host_handle_closed(struct p2p_host *h)
{
    if (--h->nhandles == 0 && h->closing) {
        free(h->token);
        free(h);
    }
}

static void pending_timer_closed(uv_handle_t *hd)
{
    struct pending *p = hd->data;
    struct p2p_host *h = p->host;
    free(p->body);
    free(p);
    host_handle_closed(h);
}

/* Unlinks p from its connection and calls its callback once. */
static void pending_finish(struct pending *p, int status, const struct p2p_peer *from,
                           const uint8_t *body, size_t len)
{
    struct p2p_conn *c = p->conn;
    if (p->prev)
        p->prev->next = p->next;
    else
        c->pend = p->next;
    if (p->next)
        p->next->prev = p->prev;
    c->n_pend--;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, pending_timer_closed);
    if (status == CM_OK && from && !p->internal)
        c->h->ctx->st.responses_ok++;
    p->cb(p->arg, status, from, body, len);
}

/* Completes a request that is attached to no connection. */
static void pending_finish_detached(struct pending *p, int status)
{
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, pending_timer_closed);
    p->cb(p->arg, status, NULL, NULL, 0);
}

static struct p2p_conn *conn_get(struct p2p_host *h, const struct sockaddr *addr, int *rc);
static int send_envelope(struct p2p_conn *c, uint32_t kind, uint32_t type, uint64_t id,
                         const uint8_t *recipient, uint8_t nonce[P2P_NONCE_LEN], int32_t status,
                         const struct p2p_iov *body, size_t n);

static void pending_attach(struct pending *p, struct p2p_conn *c)
{
    p->conn = c;
    p->prev = NULL;
    p->next = c->pend;
    if (c->pend)
        c->pend->prev = p;
    c->pend = p;
    c->n_pend++;
}

/* A reused connection can die under a request the peer never read: the
 * peer closed it as idle or to stay within its budget at the same moment
 * (the keep-alive race every HTTP client knows). Such a request is sent once
 * more on a fresh connection, with a fresh nonce, within its deadline. */
static void pending_retry(struct pending *p, int err)
{
    struct p2p_host *h = p->host;
    int rc = CM_OK;
    struct p2p_conn *c = h->closing ? NULL : conn_get(h, (struct sockaddr *)&p->addr, &rc);
    if (!c) {
        pending_finish_detached(p, err);
        return;
    }
    p->retried = 1;
    p->id = h->next_id++;
    cm_random_bytes(p->nonce, P2P_NONCE_LEN);
    h->ctx->st.retries++;
    struct p2p_iov one = {p->body, p->blen};
    if (send_envelope(c, P2P_KIND_REQUEST, p->type, p->id, p->has_expect ? p->expect_pub : NULL,
                      p->nonce, 0, &one, 1) ||
        c->state == C_CLOSING) {
        pending_finish_detached(p, err);
        return;
    }
    pending_attach(p, c);
}

static void conn_start_waiting(struct p2p_ctx *ctx);

static void conn_handle_closed(uv_handle_t *hd)
{
    struct p2p_conn *c = hd->data;
    struct p2p_host *h = c->h;
    struct p2p_ctx *ctx = h->ctx;
    int had_fd = c->has_fd;
    ctx->rx_held -= c->rx_cap;
    free(c->rx);
    p2p_mac_cleanup(&c->stx);
    p2p_mac_cleanup(&c->srx);
    free(c);
    host_handle_closed(h);
    if (had_fd)
        ctx->fds--;
    ctx->conn_handles--;
    if (ctx->freeing)
        ctx_release(ctx);
    else if (had_fd)
        conn_start_waiting(ctx);
}

static void wait_remove(struct p2p_ctx *ctx, struct p2p_conn *c)
{
    if (!c->in_wait)
        return;
    struct p2p_conn **pp = &ctx->wait_head, *prev = NULL;
    while (*pp && *pp != c) {
        prev = *pp;
        pp = &(*pp)->wnext;
    }
    if (*pp) {
        *pp = c->wnext;
        if (ctx->wait_tail == c)
            ctx->wait_tail = prev;
    }
    c->in_wait = 0;
    c->wnext = NULL;
}

static void conn_shutdown_done(uv_shutdown_t *req, int status)
{
    struct p2p_conn *c = req->data;
    (void)status;
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
}

static void conn_close(struct p2p_conn *c, int err)
{
    if (c->state == C_CLOSING)
        return;
    struct p2p_host *h = c->h;
    struct p2p_ctx *ctx = h->ctx;
    c->state = C_CLOSING;
    struct pending *retry = NULL;
    int may_retry = c->outgoing && c->connected && !h->closing &&
                    (err == CM_ECLOSED || err == CM_ECONN);
    while (c->pend) {
        struct pending *p = c->pend;
        if (may_retry && !p->retried) {
            c->pend = p->next;
            if (c->pend)
                c->pend->prev = NULL;
            c->n_pend--;
            p->next = retry;
            retry = p;
        } else {
            pending_finish(p, err, NULL, NULL, 0);
        }
    }
    for (struct wframe *f = c->wq_head, *n; f; f = n) {
        n = f->next;
        if (f->inflight) {
            f->orphan = 1;
        } else {
            free(f->buf);
            free(f);
        }
    }
    c->wq_head = c->wq_tail = NULL;
    /* Answers still owed on this connection can no longer be sent: their
     * owners learn it from p2p_reply_finish (CM_ECLOSED). */
    for (struct p2p_deferred *d = c->deferred, *dn; d; d = dn) {
        dn = d->next;
        d->c = NULL;
        d->next = d->prev = NULL;
    }
    c->deferred = NULL;
    c->n_deferred = 0;
    for (struct delayed **pp = &ctx->dq_head, *prev = NULL; *pp;) {
        struct delayed *d = *pp;
        if (d->c != c) {
            prev = d;
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        if (ctx->dq_tail == d)
            ctx->dq_tail = prev;
        free(d->f->buf);
        free(d->f);
        free(d);
    }
    wait_remove(ctx, c);
    if (!c->has_fd && c->outgoing) { /* still queued for a descriptor? */
        struct p2p_conn **pp = &ctx->fdwait_head, *prev = NULL;
        while (*pp && *pp != c) {
            prev = *pp;
            pp = &(*pp)->fdnext;
        }
        if (*pp) {
            *pp = c->fdnext;
            if (ctx->fdwait_tail == c)
                ctx->fdwait_tail = prev;
        }
    }
    if (c->hprev)
        c->hprev->hnext = c->hnext;
    else
        h->conns = c->hnext;
    if (c->hnext)
        c->hnext->hprev = c->hprev;
    if (c->cprev)
        c->cprev->cnext = c->cnext;
    else
        ctx->conns = c->cnext;
    if (c->cnext)
        c->cnext->cprev = c->cprev;
    else
        ctx->conns_tail = c->cprev;
    ctx->nconns--;
    if (!c->outgoing)
        h->n_inbound--;
    /* Graceful (host shutdown): writes already handed to the kernel are
     * delivered, then FIN, then close. Otherwise close at once. */
    int shut = 0;
    if (c->graceful && c->connected) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->sreq.data = c;
        shut = uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, conn_shutdown_done) == 0;
    }
    if (!shut)
        uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    while (retry) {
        struct pending *p = retry;
        retry = p->next;
        pending_retry(p, err);
    }
}

/* Drops an offending peer: counts it under `why` and closes its connection. */
static void conn_drop(struct p2p_conn *c, enum p2p_reject why, const char *detail)
{
    char a[80];
    p2p_addr_format((const struct sockaddr *)&c->remote, a, sizeof a);
    char msg[160];
    snprintf(msg, sizeof msg, "%s from %s", detail, a);
    p2p_auth_count(&c->h->ctx->auth, why, msg);
    c->h->ctx->st.drops++;
    conn_close(c, CM_EPROTO);
}

/* Closes the least recently active idle connection of the process. */
static int evict_one(struct p2p_ctx *ctx)
{
    /* The list is kept in activity order, so the first idle connection
     * from the head is the least recently used one; the scan is bounded
     * so a budget full of busy connections costs little. */
    struct p2p_conn *best = NULL;
    int scanned = 0;
    for (struct p2p_conn *c = ctx->conns; c && scanned < 256; c = c->cnext, scanned++)
        if (c->state == C_OPEN && c->n_pend == 0 && c->wq_bytes == 0 && c->rx_len == 0) {
            best = c;
            break;
        }
    if (!best)
        return CM_EBUSY;
    ctx->st.conns_evicted++;
    conn_close(best, CM_ECLOSED);
    return CM_OK;
}

static struct p2p_conn *conn_alloc(struct p2p_host *h, int outgoing)
{
    struct p2p_ctx *ctx = h->ctx;
    struct p2p_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (uv_tcp_init(ctx->loop, &c->tcp)) {
        free(c);
        return NULL;
    }
    c->tcp.data = c;
    c->h = h;
    ctx->conn_handles++;
    c->outgoing = outgoing;
    c->last_active_ms = mono_ms();
    h->nhandles++;
    c->hnext = h->conns;
    if (h->conns)
        h->conns->hprev = c;
    h->conns = c;
    c->cprev = ctx->conns_tail;
    if (ctx->conns_tail)
        ctx->conns_tail->cnext = c;
    else
        ctx->conns = c;
    ctx->conns_tail = c;
    ctx->nconns++;
    if (!outgoing)
        h->n_inbound++;
    return c;
}

/* Marks activity: the connection moves to the tail of the LRU list. */
static void conn_touch(struct p2p_conn *c)
{
    struct p2p_ctx *ctx = c->h->ctx;
    c->last_active_ms = mono_ms();
    if (ctx->conns_tail == c)
        return;
    if (c->cprev)
        c->cprev->cnext = c->cnext;
    else
        ctx->conns = c->cnext;
    c->cnext->cprev = c->cprev;
    c->cprev = ctx->conns_tail;
    c->cnext = NULL;
    ctx->conns_tail->cnext = c;
    ctx->conns_tail = c;
}

/* ---- writing ----------------------------------------------------------- */

/* How much a capped direction waits to accrue before the next write or read
 * round: 2 ms of traffic (at least a packet, at most the bucket). Waking for
 * every 1500 bytes cost a timer, a write or read per connection and, for
 * reads, a pause and resume of every connection about every millisecond;
 * the long-run rate is the bucket's either way. */
static size_t rate_quantum(const struct p2p_rate *r)
{
    double q = r->bytes_per_s * 0.002;
    if (q > r->burst)
        q = r->burst;
    return q < 1500 ? 1500 : (size_t)q;
}

static void up_timer_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    ctx->up_timer_armed = 0;
    /* Serve waiting connections in FIFO order until the bucket is empty;
     * a connection that still has data goes back to the tail. */
    struct p2p_conn *c;
    size_t n_wait = 0;
    for (c = ctx->wait_head; c; c = c->wnext)
        n_wait++;
    /* Each waiting connection once: one that cannot write yet queues again. */
    while (n_wait-- && (c = ctx->wait_head) && p2p_rate_available(&ctx->up, now_ns()) > 0) {
        ctx->wait_head = c->wnext;
        if (!ctx->wait_head)
            ctx->wait_tail = NULL;
        c->in_wait = 0;
        c->wnext = NULL;
        conn_flush(c);
    }
    if (ctx->wait_head && !ctx->up_timer_armed) {
        ctx->up_timer_armed = 1;
        uv_timer_start(&ctx->up_timer, up_timer_cb,
                       p2p_rate_wait_ms(&ctx->up, rate_quantum(&ctx->up), now_ns()), 0);
    }
}

static void write_cb(uv_write_t *w, int status)
{
    struct wreq *r = (struct wreq *)w;
    struct wframe *f = r->f;
    struct p2p_conn *c = r->c;
    f->inflight--;
    /* A frame leaves the queue once fully handed to libuv (or orphaned by
     * a close); it is freed when its last slice is written. */
    if (f->inflight == 0 && (f->orphan || f->off == f->len)) {
        free(f->buf);
        free(f);
    }
    if (c->state != C_CLOSING) {
        c->wq_bytes -= r->n;
        if (status < 0) {
            conn_close(c, CM_ECONN);
        } else if (c->bp_paused && c->wq_bytes < c->h->ctx->max_queue / 2) {
            c->bp_paused = 0;
            read_start(c);
        }
    }
    free(r);
}

static void conn_flush(struct p2p_conn *c)
{
    struct p2p_ctx *ctx = c->h->ctx;
    if (c->state != C_OPEN)
        return;
    while (c->wq_head) {
        struct wframe *f = c->wq_head;
        size_t n = f->len - f->off;
        size_t avail = p2p_rate_available(&ctx->up, now_ns());
        size_t q = rate_quantum(&ctx->up);
        /* Capped: write a quantum at a time (or the frame's end), not
         * whatever trickle has accrued: fewer, larger writes. */
        if (avail == 0 || (p2p_rate_limited(&ctx->up) && avail < (n < q ? n : q))) {
            if (!c->in_wait) {
                c->in_wait = 1;
                if (ctx->wait_tail)
                    ctx->wait_tail->wnext = c;
                else
                    ctx->wait_head = c;
                ctx->wait_tail = c;
            }
            if (!ctx->up_timer_armed) {
                ctx->up_timer_armed = 1;
                uv_timer_start(&ctx->up_timer, up_timer_cb,
                               p2p_rate_wait_ms(&ctx->up, rate_quantum(&ctx->up), now_ns()), 0);
            }
            return;
        }
        if (p2p_rate_limited(&ctx->up)) {
            /* Slice so the long-run rate is exact at byte granularity. */
            if (n > avail)
                n = avail;
            if (n > WRITE_SLICE)
                n = WRITE_SLICE;
        }
        struct wreq *r = malloc(sizeof *r);
        if (!r) {
            conn_close(c, CM_ENOMEM);
            return;
        }
        r->c = c;
        r->f = f;
        r->n = n;
        uv_buf_t b = uv_buf_init((char *)f->buf + f->off, (unsigned)n);
        f->off += n;
        f->inflight++;
        p2p_rate_consume(&ctx->up, n);
        ctx->st.bytes_sent += n;
        if (f->off == f->len) {
            c->wq_head = f->next;
            if (!c->wq_head)
                c->wq_tail = NULL;
            f->next = NULL;
        }
        int rc = uv_write(&r->w, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
        if (rc) {
            f->inflight--;
            free(r);
            conn_close(c, CM_ECONN);
            return;
        }
    }
}

/* Queues a complete frame (ownership of buf passes to the connection). */
static void conn_enqueue(struct p2p_conn *c, struct wframe *f)
{
    if (c->wq_tail)
        c->wq_tail->next = f;
    else
        c->wq_head = f;
    c->wq_tail = f;
}

static void delay_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    int64_t now = mono_ms();
    while (ctx->dq_head && ctx->dq_head->due_ms <= now) {
        struct delayed *d = ctx->dq_head;
        ctx->dq_head = d->next;
        if (!ctx->dq_head)
            ctx->dq_tail = NULL;
        conn_enqueue(d->c, d->f);
        conn_flush(d->c);
        free(d);
    }
    if (ctx->dq_head)
        uv_timer_start(&ctx->delay_timer, delay_cb, (uint64_t)(ctx->dq_head->due_ms - now), 0);
}

static int conn_send(struct p2p_conn *c, uint8_t *buf, size_t len)
{
    struct p2p_ctx *ctx = c->h->ctx;
    struct wframe *f = calloc(1, sizeof *f);
    if (!f) {
        free(buf);
        return CM_ENOMEM;
    }
    f->buf = buf;
    f->len = len;
    c->wq_bytes += len;
    conn_touch(c);
    if (ctx->latency_ms) {
        /* Emulated latency (benchmarks of home links; netem is not
         * available everywhere): the frame waits, then queues as usual. */
        struct delayed *d = malloc(sizeof *d);
        if (!d) {
            c->wq_bytes -= len;
            free(buf);
            free(f);
            return CM_ENOMEM;
        }
        d->next = NULL;
        d->c = c;
        d->f = f;
        d->due_ms = mono_ms() + ctx->latency_ms;
        if (ctx->dq_tail) {
            ctx->dq_tail->next = d;
        } else {
            ctx->dq_head = d;
            uv_timer_start(&ctx->delay_timer, delay_cb, ctx->latency_ms, 0);
        }
        ctx->dq_tail = d;
        return CM_OK;
    }
    conn_enqueue(c, f);
    conn_flush(c);
    return CM_OK;
}

/* Sends a frame given in pieces (borrowed, only for the duration of the
 * call). When nothing is queued on the connection (ours or libuv's) and the
 * upload is neither capped nor delayed, the pieces are written to the socket
 * straight from where they are (no copy of a chunk into a frame buffer);
 * whatever the socket does not take at once is copied into one frame and
 * queued as usual, so no queued frame ever refers to the caller's memory. */
static int conn_send_parts(struct p2p_conn *c, const struct p2p_iov *parts, size_t np)
{
    struct p2p_ctx *ctx = c->h->ctx;
    size_t total = 0, done = 0;
    for (size_t i = 0; i < np; i++)
        total += parts[i].len;
    if (c->state == C_OPEN && !c->wq_head && !ctx->latency_ms && !p2p_rate_limited(&ctx->up) &&
        np <= 8 && total <= UINT32_MAX) {
        uv_buf_t b[8];
        for (size_t i = 0; i < np; i++)
            b[i] = uv_buf_init((char *)parts[i].base, (unsigned)parts[i].len);
        /* UV_EAGAIN when the socket is full or libuv still has writes queued
         * (order is kept); any other error is met again by the queued write,
         * which closes the connection. */
        int w = uv_try_write((uv_stream_t *)&c->tcp, b, (unsigned)np);
        if (w > 0) {
            done = (size_t)w;
            ctx->st.bytes_sent += done;
        }
        if (done == total) {
            conn_touch(c);
            return CM_OK;
        }
    }
    uint8_t *buf = malloc(total - done);
    if (!buf) {
        /* The frame's sequence number is spent (and part of it may be on
         * the wire): the stream cannot go on. */
        conn_close(c, CM_ENOMEM);
        return CM_ENOMEM;
    }
    size_t skip = done, off = 0;
    for (size_t i = 0; i < np; i++) {
        size_t l = parts[i].len;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(buf + off, (const uint8_t *)parts[i].base + skip, l - skip);
        off += l - skip;
        skip = 0;
    }
    return conn_send(c, buf, total - done);
}

/* ---- reading ----------------------------------------------------------- */

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    struct p2p_conn *c = hd->data;
    struct p2p_ctx *ctx = c->h->ctx;
    (void)suggested;
    size_t want = RX_CHUNK;
    if (p2p_rate_limited(&ctx->down)) {
        size_t avail = p2p_rate_available(&ctx->down, now_ns());
        want = avail < 1024 ? 1024 : avail > RX_CHUNK ? RX_CHUNK : avail;
    }
    if (c->rx_len == 0) {
        /* Whole frames are handled straight from the shared buffer, so an
         * idle connection holds no receive memory. */
        buf->base = (char *)ctx->rxbuf;
        buf->len = want;
        return;
    }
    /* Read no further than the end of the frame in progress: the buffer then
     * holds exactly one partial frame, and the next frames are decoded from
     * the shared buffer again. */
    size_t need = P2P_FRAME_HDR_LEN - (c->rx_len < P2P_FRAME_HDR_LEN ? c->rx_len : 0);
    struct p2p_frame_hdr fh;
    if (c->rx_len >= P2P_FRAME_HDR_LEN && p2p_frame_parse_hdr(c->rx, c->rx_len, &fh) == CM_OK &&
        P2P_FRAME_HDR_LEN + (size_t)fh.length > c->rx_len)
        need = P2P_FRAME_HDR_LEN + (size_t)fh.length - c->rx_len;
    size_t whole = need; /* room for the rest of the frame: one allocation per frame */
    if (need && want > need)
        want = need;
    if (c->rx_cap - c->rx_len < want) {
        size_t ncap = c->rx_len + (whole > want ? whole : want);
        size_t room = ctx->max_rx_held > ctx->rx_held ? ctx->max_rx_held - ctx->rx_held : 0;
        if (ncap - c->rx_cap > room) {
            /* Partial frames of all connections together are bounded: this
             * one reads what is left of the bound, and when nothing is left
             * it is refused (read_cb drops it on UV_ENOBUFS). */
            if (room == 0) {
                buf->base = NULL;
                buf->len = 0;
                return;
            }
            ncap = c->rx_cap + room;
        }
        uint8_t *n = realloc(c->rx, ncap);
        if (!n) {
            buf->base = NULL;
            buf->len = 0;
            return;
        }
        c->rx = n;
        ctx->rx_held += ncap - c->rx_cap;
        c->rx_cap = ncap;
    }
    if (want > c->rx_cap - c->rx_len)
        want = c->rx_cap - c->rx_len;
    buf->base = (char *)c->rx + c->rx_len;
    buf->len = want;
}

static void down_timer_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    ctx->down_timer_armed = 0;
    if (p2p_rate_available(&ctx->down, now_ns()) < rate_quantum(&ctx->down)) {
        ctx->down_timer_armed = 1;
        uv_timer_start(&ctx->down_timer, down_timer_cb,
                       p2p_rate_wait_ms(&ctx->down, rate_quantum(&ctx->down), now_ns()), 0);
        return;
    }
    ctx->down_paused = 0;
    for (struct p2p_conn *c = ctx->conns; c; c = c->cnext)
        read_start(c);
}

static void handle_frame(struct p2p_conn *c, const uint8_t *frame, size_t plen);
static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void read_start(struct p2p_conn *c)
{
    if (c->state != C_OPEN || c->reading || c->bp_paused || c->h->ctx->down_paused)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
        c->reading = 1;
}

static void read_stop(struct p2p_conn *c)
{
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct p2p_conn *c = s->data;
    struct p2p_ctx *ctx = c->h->ctx;
    (void)buf;
    if (nread == 0)
        return;
    if (nread == UV_ENOBUFS && c->state == C_OPEN) {
        conn_drop(c, P2P_REJ_MALFORMED, "receive memory limit reached");
        return;
    }
    if (nread < 0) {
        conn_close(c, nread == UV_EOF ? CM_ECLOSED : CM_ECONN);
        return;
    }
    if (c->state != C_OPEN)
        return;
    ctx->st.bytes_received += (uint64_t)nread;
    conn_touch(c);
    if (p2p_rate_limited(&ctx->down)) {
        p2p_rate_consume(&ctx->down, (size_t)nread);
        if (p2p_rate_available(&ctx->down, now_ns()) < rate_quantum(&ctx->down)) {
            /* Pause every connection of the process until the bucket
             * refills; the kernel's receive window then throttles the
             * senders, which is what a slow home link does. */
            ctx->down_paused = 1;
            for (struct p2p_conn *x = ctx->conns; x; x = x->cnext)
                read_stop(x);
            if (!ctx->down_timer_armed) {
                ctx->down_timer_armed = 1;
                uv_timer_start(&ctx->down_timer, down_timer_cb,
                               p2p_rate_wait_ms(&ctx->down, rate_quantum(&ctx->down), now_ns()), 0);
            }
        }
    }
    uint8_t *data;
    size_t dlen;
    int shared = buf->base == (char *)ctx->rxbuf;
    if (shared) {
        c->frame_start_ms = mono_ms();
        data = ctx->rxbuf;
        dlen = (size_t)nread;
    } else {
        c->rx_len += (size_t)nread;
        data = c->rx;
        dlen = c->rx_len;
    }
    size_t off = 0;
    while (c->state == C_OPEN) {
        const uint8_t *payload;
        size_t plen, used;
        int rc = p2p_frame_next(data + off, dlen - off, &payload, &plen, &used);
        if (rc == 1)
            break;
        if (rc < 0) {
            conn_drop(c, P2P_REJ_MALFORMED,
                      rc == CM_EVERSION ? "unsupported protocol version"
                      : rc == CM_ETOOBIG ? "oversized frame"
                                         : "bad frame header");
            return;
        }
        handle_frame(c, payload - P2P_FRAME_HDR_LEN, plen);
        off += used;
        c->frame_start_ms = mono_ms();
    }
    if (c->state != C_OPEN)
        return;
    size_t left = dlen - off;
    if (shared) {
        if (left) { /* keep the partial frame on the connection */
            if (ctx->rx_held + left > ctx->max_rx_held) {
                conn_drop(c, P2P_REJ_MALFORMED, "receive memory limit reached");
                return;
            }
            /* Room for the whole frame when its header is in, so the rest
             * is read in place without growing (and copying) again. */
            size_t cap = left;
            struct p2p_frame_hdr fh;
            if (p2p_frame_parse_hdr(data + off, left, &fh) == CM_OK &&
                P2P_FRAME_HDR_LEN + (size_t)fh.length > left &&
                ctx->rx_held + P2P_FRAME_HDR_LEN + fh.length <= ctx->max_rx_held)
                cap = P2P_FRAME_HDR_LEN + (size_t)fh.length;
            uint8_t *n = realloc(c->rx, cap);
            if (!n) {
                conn_close(c, CM_ENOMEM);
                return;
            }
            memcpy(n, data + off, left);
            c->rx = n;
            ctx->rx_held += cap - c->rx_cap;
            c->rx_cap = cap;
            c->rx_len = left;
        }
        return;
    }
    if (off) {
        memmove(c->rx, c->rx + off, left);
        c->rx_len = left;
    }
    if (c->rx_len == 0) {
        ctx->rx_held -= c->rx_cap;
        free(c->rx);
        c->rx = NULL;
        c->rx_cap = 0;
    }
}

/* What the dispatch needs of a received message, signed or session. */
struct msg_in {
    uint32_t kind, type;
    uint64_t id;
    int32_t status;
    const uint8_t *body;
    size_t blen;
    uint8_t nonce[P2P_NONCE_LEN]; /* signed: the envelope's; session: the tag's first bytes */
    uint32_t listen_port;
};

static void fill_peer(struct p2p_conn *c, uint32_t listen_port, const struct cm_pass_claims *cl,
                      struct p2p_peer *pe)
{
    memcpy(pe->pub, cl->peer_public_key, 32);
    pe->addr = c->remote;
    pe->listen_port = listen_port;
    if (listen_port)
        p2p__addr_set_port(&pe->addr, (uint16_t)listen_port);
    pe->claims = cl;
}

/* Builds and queues one frame: a session frame once the connection has a
 * session (unless a pass renewal asks for one signed envelope first, which
 * carries the new token to the peer), a signed envelope otherwise. For a
 * session frame, nonce receives the first bytes of its tag: a signed
 * response to it echoes them (see msg_in). */
static int send_envelope(struct p2p_conn *c, uint32_t kind, uint32_t type, uint64_t id,
                         const uint8_t *recipient, uint8_t nonce[P2P_NONCE_LEN], int32_t status,
                         const struct p2p_iov *body, size_t n)
{
    struct p2p_host *h = c->h;
    uint8_t *frame;
    size_t flen;
    int rc;
    if (c->tx_on && !c->tx_resign) {
        uint8_t head[P2P_SESSION_HEAD_LEN], tag[P2P_SESSION_TAG_LEN];
        if (n > P2P_SESSION_SEAL_MAX_IOV)
            return CM_EINVAL;
        rc = p2p_session_seal(&c->stx, kind, type, id, status, body, n, head, tag);
        if (rc)
            return rc;
        memcpy(nonce, tag, P2P_NONCE_LEN);
        struct p2p_iov parts[2 + P2P_SESSION_SEAL_MAX_IOV];
        size_t np = 0;
        parts[np++] = (struct p2p_iov){head, sizeof head};
        for (size_t i = 0; i < n; i++)
            if (body[i].len)
                parts[np++] = body[i];
        parts[np++] = (struct p2p_iov){tag, sizeof tag};
        return conn_send_parts(c, parts, np);
    }
    /* A signed envelope hashes and packs one contiguous body. */
    const uint8_t *b = n ? body[0].base : NULL;
    size_t blen = n ? body[0].len : 0;
    uint8_t *gathered = NULL;
    if (n > 1) {
        blen = 0;
        for (size_t i = 0; i < n; i++)
            blen += body[i].len;
        if (blen > P2P_FRAME_MAX_PAYLOAD)
            return CM_ETOOBIG;
        if (!(gathered = malloc(blen ? blen : 1)))
            return CM_ENOMEM;
        for (size_t i = 0, off = 0; i < n; off += body[i].len, i++)
            if (body[i].len)
                memcpy(gathered + off, body[i].base, body[i].len);
        b = gathered;
    }
    struct p2p_envelope_out o = {
        .kind = kind, .type = type, .request_id = id, .token = h->token,
        .recipient = recipient, .time_ms = p2p_now_ms(), .listen_port = h->advertise_port,
        .status = status, .body = b, .body_len = blen,
    };
    memcpy(o.nonce, nonce, P2P_NONCE_LEN);
    rc = p2p_envelope_build(h->key, &o, &frame, &flen);
    free(gathered);
    if (rc)
        return rc;
    c->tx_resign = 0;
    return conn_send(c, frame, flen);
}

static int serve_builtin(struct p2p_conn *c, const struct p2p_peer *pe, uint32_t type,
                         const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct p2p_host *h = c->h;
    if (type == P2P_MSG_PING) {
        Ctp2p__Pong pong = CTP2P__PONG__INIT;
        uint8_t ip[16];
        if (c->remote.ss_family == AF_INET) {
            memcpy(ip, &((struct sockaddr_in *)&c->remote)->sin_addr, 4);
            pong.observed_ip.len = 4;
        } else {
            memcpy(ip, &((struct sockaddr_in6 *)&c->remote)->sin6_addr, 16);
            pong.observed_ip.len = 16;
        }
        pong.observed_ip.data = ip;
        *rlen = ctp2p__pong__get_packed_size(&pong);
        *resp = malloc(*rlen ? *rlen : 1);
        if (!*resp)
            return CM_ENOMEM;
        ctp2p__pong__pack(&pong, *resp);
        return CM_OK;
    }
    if (type == P2P_MSG_STREAM_CHUNK) {
        if (!h->on_chunk)
            return CM_EUNSUPPORTED;
        struct p2p_chunk ch;
        if (p2p_chunk_parse(body, len, &ch))
            return CM_EPARSE;
        int rc = h->on_chunk(h->arg, h, pe, ch.stream_id, ch.offset, ch.total_len, ch.data, ch.len,
                             ch.last);
        p2p_chunk_cleanup(&ch);
        return rc;
    }
    if (!h->on_request)
        return CM_EUNSUPPORTED;
    return h->on_request(h->arg, h, pe, type, body, len, resp, rlen);
}

/* The responder's side of a HELLO (signed, already checked): derive the
 * keys, answer with our ephemeral key (signed), then switch both directions
 * to session frames. The initiator's frames after its HELLO may already be
 * session frames once it has our answer. */
static void serve_hello(struct p2p_conn *c, const struct msg_in *m, const struct cm_pass_claims *cl)
{
    struct p2p_ctx *ctx = c->h->ctx;
    int status = CM_OK;
    struct p2p_kx kx = {0};
    uint8_t ki[P2P_SESSION_KEY_LEN], kr[P2P_SESSION_KEY_LEN];
    struct p2p_mac tx = {0}, rx = {0};
    if (ctx->no_sessions)
        status = CM_EUNSUPPORTED;
    else if (c->tx_on || c->rx_on || c->hello)
        status = CM_ESTATE; /* one session per connection; ours is on its way */
    else if (m->blen != P2P_KX_LEN)
        status = CM_EPARSE;
    else if ((status = p2p_kx_new(&kx)) == CM_OK &&
             (status = p2p_kx_derive(&kx, m->body, cl->peer_public_key, c->h->key->pub, m->body,
                                     kx.pub, m->nonce, ki, kr)) == CM_OK &&
             (status = p2p_mac_init(&rx, ki)) == CM_OK)
        status = p2p_mac_init(&tx, kr);
    uint8_t nonce[P2P_NONCE_LEN];
    memcpy(nonce, m->nonce, P2P_NONCE_LEN);
    struct p2p_iov one = {kx.pub, P2P_KX_LEN};
    if (c->state == C_OPEN)
        send_envelope(c, P2P_KIND_RESPONSE, m->type, m->id, cl->peer_public_key, nonce, status,
                      &one, status ? 0 : 1);
    p2p_kx_cleanup(&kx);
    OPENSSL_cleanse(ki, sizeof ki);
    OPENSSL_cleanse(kr, sizeof kr);
    if (status || c->state != C_OPEN) {
        p2p_mac_cleanup(&tx);
        p2p_mac_cleanup(&rx);
        return;
    }
    c->stx = tx;
    c->srx = rx;
    c->tx_on = c->rx_on = 1;
    memcpy(c->peer_pub, cl->peer_public_key, 32);
    c->peer_claims = *cl;
    c->peer_port = m->listen_port;
    ctx->st.sessions++;
}

static void serve_request(struct p2p_conn *c, const struct msg_in *m,
                          const struct cm_pass_claims *cl)
{
    struct p2p_host *h = c->h;
    struct p2p_ctx *ctx = h->ctx;
    if (m->type == P2P_MSG_HELLO) {
        serve_hello(c, m, cl);
        return;
    }
    struct p2p_peer pe;
    fill_peer(c, m->listen_port, cl, &pe);
    struct p2p_reply rp = {0};
    int status;
    struct serving sv = {c, m, cl->peer_public_key, NULL}, *outer = h->serving;
    h->serving = &sv;
    if (h->on_request_reply && m->type != P2P_MSG_PING && m->type != P2P_MSG_STREAM_CHUNK) {
        status = h->on_request_reply(h->arg, h, &pe, m->type, m->body, m->blen, &rp);
    } else {
        status = serve_builtin(c, &pe, m->type, m->body, m->blen, &rp.body, &rp.len);
    }
    h->serving = outer;
    if (status > 0)
        status = CM_EINTERNAL;
    ctx->st.requests_served++;
    if (sv.taken) { /* the handler answers later (p2p_reply_finish) */
        free(rp.body);
        return;
    }
    uint8_t nonce[P2P_NONCE_LEN];
    memcpy(nonce, m->nonce, P2P_NONCE_LEN);
    struct p2p_iov parts[2] = {{rp.body, rp.body ? rp.len : 0}, {rp.tail, rp.tail_len}};
    if (c->state == C_OPEN)
        send_envelope(c, P2P_KIND_RESPONSE, m->type, m->id, cl->peer_public_key, nonce, status,
                      parts, rp.tail_len ? 2 : 1);
    free(rp.body);
    /* Backpressure: a peer that asks faster than we can answer stops being
     * read until its responses drain. */
    if (c->state == C_OPEN && c->wq_bytes > ctx->max_queue && !c->bp_paused) {
        c->bp_paused = 1;
        ctx->st.backpressure_pauses++;
        read_stop(c);
    }
}

/* ---- deferred replies (p2p_transport.h) -------------------------------- */

struct p2p_deferred *p2p_reply_defer(struct p2p_host *h)
{
    struct serving *sv = h ? h->serving : NULL;
    if (!sv)
        return NULL;
    if (sv->taken)
        return sv->taken;
    struct p2p_deferred *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    struct p2p_conn *c = sv->c;
    d->c = c;
    d->type = sv->m->type;
    d->id = sv->m->id;
    memcpy(d->nonce, sv->m->nonce, P2P_NONCE_LEN);
    memcpy(d->peer, sv->peer, CM_ED25519_PUB_LEN);
    d->next = c->deferred;
    if (c->deferred)
        c->deferred->prev = d;
    c->deferred = d;
    c->n_deferred++;
    sv->taken = d;
    return d;
}

int p2p_reply_finish(struct p2p_deferred *d, int status, const struct p2p_iov *body, size_t n)
{
    if (!d)
        return CM_EINVAL;
    struct p2p_conn *c = d->c;
    int rc = CM_ECLOSED;
    if (c) {
        if (d->prev)
            d->prev->next = d->next;
        else
            c->deferred = d->next;
        if (d->next)
            d->next->prev = d->prev;
        c->n_deferred--;
    }
    if (c && c->state == C_OPEN) {
        if (status > 0)
            status = CM_EINTERNAL;
        rc = send_envelope(c, P2P_KIND_RESPONSE, d->type, d->id, d->peer, d->nonce, status, body,
                           n);
        struct p2p_ctx *ctx = c->h->ctx;
        if (c->state == C_OPEN && c->wq_bytes > ctx->max_queue && !c->bp_paused) {
            c->bp_paused = 1;
            ctx->st.backpressure_pauses++;
            read_stop(c);
        }
    }
    free(d);
    return rc;
}

/* A signed envelope on a connection with a session must come from the
 * session's peer; it brings the peer's current pass (after a renewal). */
static int session_update(struct p2p_conn *c, const struct cm_pass_claims *cl)
{
    if (!c->rx_on)
        return CM_OK;
    if (!cm_ct_equal(cl->peer_public_key, c->peer_pub, 32)) {
        p2p_auth_count(&c->h->ctx->auth, P2P_REJ_SENDER,
                       "signed by another key than the session's");
        c->h->ctx->st.drops++;
        conn_close(c, CM_EAUTH);
        return CM_EAUTH;
    }
    c->peer_claims = *cl;
    return CM_OK;
}

static void handle_request(struct p2p_conn *c, struct p2p_envelope *env)
{
    struct p2p_host *h = c->h;
    struct p2p_ctx *ctx = h->ctx;
    struct cm_pass_claims cl;
    enum p2p_reject why;
    if (p2p_auth_check_request(&ctx->auth, env, h->key->pub, p2p_now_ms(), &cl, &why)) {
        ctx->st.drops++;
        conn_close(c, CM_EAUTH);
        return;
    }
    if (session_update(c, &cl))
        return;
    struct msg_in m = {.kind = env->kind, .type = env->type, .id = env->request_id,
                       .status = env->status, .body = env->body, .blen = env->body_len,
                       .listen_port = env->listen_port};
    memcpy(m.nonce, env->nonce, P2P_NONCE_LEN);
    serve_request(c, &m, &cl);
}

static void handle_response(struct p2p_conn *c, struct p2p_envelope *env)
{
    struct p2p_ctx *ctx = c->h->ctx;
    struct pending *p = c->pend;
    while (p && p->id != env->request_id)
        p = p->next;
    if (!p)
        return; /* late answer to a request that timed out */
    struct cm_pass_claims cl;
    enum p2p_reject why;
    if (p2p_auth_check_response(&ctx->auth, env, c->h->key->pub, p->nonce,
                                p->has_expect ? p->expect_pub : NULL, p2p_now_ms(), &cl, &why)) {
        pending_finish(p, CM_EAUTH, NULL, NULL, 0);
        ctx->st.drops++;
        conn_close(c, CM_EAUTH);
        return;
    }
    if (session_update(c, &cl)) /* fails p (the connection closed) */
        return;
    struct p2p_peer pe;
    fill_peer(c, env->listen_port, &cl, &pe);
    pending_finish(p, env->status, &pe, env->body, env->body_len);
}

static void handle_payload(struct p2p_conn *c, const uint8_t *p, size_t n)
{
    struct p2p_envelope env;
    if (p2p_envelope_parse(p, n, &env)) {
        conn_drop(c, P2P_REJ_MALFORMED, "undecodable envelope");
        return;
    }
    if (env.kind == P2P_KIND_REQUEST)
        handle_request(c, &env);
    else
        handle_response(c, &env);
    p2p_envelope_cleanup(&env);
}

/* A session frame: the tag proves it comes from the session's peer, in
 * order, unmodified; the peer's pass is checked again (expiry, revocation)
 * as for every signed message. */
static void handle_session(struct p2p_conn *c, const uint8_t *frame, size_t flen)
{
    struct p2p_ctx *ctx = c->h->ctx;
    struct p2p_session_msg sm;
    if (!c->rx_on) {
        conn_drop(c, P2P_REJ_MALFORMED, "session frame without a session");
        return;
    }
    if (p2p_session_parse(frame + P2P_FRAME_HDR_LEN, flen - P2P_FRAME_HDR_LEN, &sm)) {
        conn_drop(c, P2P_REJ_MALFORMED, "undecodable session frame");
        return;
    }
    if (p2p_mac_verify(&c->srx, frame, flen)) {
        conn_drop(c, P2P_REJ_SIGNATURE, "bad session tag");
        return;
    }
    enum p2p_reject why;
    struct pending *p = NULL;
    if (sm.kind == P2P_KIND_RESPONSE) {
        for (p = c->pend; p && p->id != sm.request_id;)
            p = p->next;
        if (!p)
            return; /* late answer to a request that timed out */
    }
    if (p2p_auth_check_claims(&ctx->auth, &c->peer_claims, p2p_now_ms(), &why) ||
        (p && p->has_expect && !cm_ct_equal(p->expect_pub, c->peer_pub, 32))) {
        if (p)
            pending_finish(p, CM_EAUTH, NULL, NULL, 0);
        ctx->st.drops++;
        conn_close(c, CM_EAUTH);
        return;
    }
    struct msg_in m = {.kind = sm.kind, .type = sm.type, .id = sm.request_id,
                       .status = sm.status, .body = sm.body, .blen = sm.body_len,
                       .listen_port = c->peer_port};
    memcpy(m.nonce, sm.tag, P2P_NONCE_LEN);
    if (sm.kind == P2P_KIND_REQUEST) {
        serve_request(c, &m, &c->peer_claims);
        return;
    }
    struct p2p_peer pe;
    fill_peer(c, c->peer_port, &c->peer_claims, &pe);
    pending_finish(p, sm.status, &pe, sm.body, sm.body_len);
}

static void handle_frame(struct p2p_conn *c, const uint8_t *frame, size_t plen)
{
    if (frame[3] & P2P_FRAME_F_SESSION)
        handle_session(c, frame, P2P_FRAME_HDR_LEN + plen);
    else
        handle_payload(c, frame + P2P_FRAME_HDR_LEN, plen);
}

/* ---- sweeping: idle connections and slow frames ------------------------ */

static void sweep_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    int64_t now = mono_ms();
    /* Connections waiting for a descriptor get one idle connection closed
     * each, wherever it sits in the LRU list (evict_one looks only at the
     * head, which may be all busy). */
    size_t waiting = 0;
    for (struct p2p_conn *w = ctx->fdwait_head; w; w = w->fdnext)
        waiting++;
    for (struct p2p_conn *c = ctx->conns, *n; c; c = n) {
        n = c->cnext;
        if (c->state != C_OPEN)
            continue;
        int idle = c->n_pend == 0 && c->n_deferred == 0 && c->wq_bytes == 0 && c->rx_len == 0;
        if (c->rx_len > 0 && now - c->frame_start_ms > (int64_t)ctx->frame_ms) {
            conn_drop(c, P2P_REJ_MALFORMED, "frame not completed in time");
        } else if (idle && now - c->last_active_ms > (int64_t)ctx->idle_ms) {
            conn_close(c, CM_ECLOSED);
        } else if (idle && waiting) {
            waiting--;
            ctx->st.conns_evicted++;
            conn_close(c, CM_ECLOSED);
        }
    }
}

/* ---- hosts ------------------------------------------------------------- */

static void listener_closed(uv_handle_t *hd);

static void on_connection(uv_stream_t *srv, int status)
{
    struct p2p_host *h = srv->data;
    struct p2p_ctx *ctx = h->ctx;
    if (status < 0 || h->closing)
        return;
    struct p2p_conn *c = conn_alloc(h, 0);
    if (!c)
        return;
    if (uv_accept(srv, (uv_stream_t *)&c->tcp)) {
        c->state = C_OPEN;
        conn_close(c, CM_ECONN);
        return;
    }
    c->state = C_OPEN;
    c->connected = 1;
    c->has_fd = 1;
    ctx->fds++;
    int len = sizeof c->remote;
    uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->remote, &len);
    ctx->st.conns_accepted++;
    /* A flood of connections: over the host's inbound cap, or over the
     * process budget with nothing idle to evict, the newcomer is closed. */
    if (h->n_inbound > h->max_inbound) {
        /* Over the host's inbound cap: the least recently active idle
         * inbound connection makes room (a flood of idle connections cannot
         * lock honest peers out); with none idle, the newcomer is refused. */
        struct p2p_conn *old = NULL;
        for (struct p2p_conn *x = h->conns; x; x = x->hnext)
            if (x != c && !x->outgoing && x->state == C_OPEN && x->wq_bytes == 0 &&
                x->rx_len == 0 && (!old || x->last_active_ms < old->last_active_ms))
                old = x;
        if (!old) {
            ctx->st.conns_refused++;
            conn_close(c, CM_EBUSY);
            return;
        }
        ctx->st.conns_evicted++;
        conn_close(old, CM_ECLOSED);
    }
    if (ctx->fds > ctx->max_conns && evict_one(ctx)) {
        ctx->st.conns_refused++;
        conn_close(c, CM_EBUSY);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    read_start(c);
}

int p2p_host_new(struct p2p_ctx *ctx, const struct p2p_host_config *cfg, struct p2p_host **out)
{
    if (!cfg->key || !cfg->key->has_private || !cfg->token ||
        strlen(cfg->token) > CM_TOKEN_MAX_LEN)
        return CM_EINVAL;
    struct p2p_host *h = calloc(1, sizeof *h);
    if (!h || !(h->token = strdup(cfg->token))) {
        free(h);
        return CM_ENOMEM;
    }
    h->ctx = ctx;
    h->key = cfg->key;
    h->max_inbound = cfg->max_inbound ? cfg->max_inbound : 512;
    h->on_request = cfg->on_request;
    h->on_request_reply = cfg->on_request_reply;
    h->on_chunk = cfg->on_chunk;
    h->arg = cfg->arg;
    cm_random_bytes(&h->next_id, sizeof h->next_id);
    if (cfg->listen_ip) {
        struct sockaddr_storage a;
        char s[300];
        snprintf(s, sizeof s, strchr(cfg->listen_ip, ':') ? "[%s]:1" : "%s:1", cfg->listen_ip);
        if (p2p_addr_parse(s, &a)) {
            free(h->token);
            free(h);
            return CM_EINVAL;
        }
        p2p__addr_set_port(&a, cfg->listen_port);
        uv_tcp_init(ctx->loop, &h->listener);
        h->listener.data = h;
        h->nhandles++;
        int rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&a, 0);
        if (!rc)
            rc = uv_listen((uv_stream_t *)&h->listener, 511, on_connection);
        if (rc) {
            CM_LOGE("p2p", "cannot listen on %s:%u: %s", cfg->listen_ip, cfg->listen_port,
                    uv_strerror(rc));
            /* the host is freed when libuv has closed the listener */
            h->closing = 1;
            uv_close((uv_handle_t *)&h->listener, listener_closed);
            return rc == UV_EADDRINUSE ? CM_EEXISTS : CM_EIO;
        }
        struct sockaddr_storage bound;
        int blen = sizeof bound;
        uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &blen);
        h->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                   : ((struct sockaddr_in6 *)&bound)->sin6_port);
        h->listening = 1;
    }
    h->advertise_port = cfg->advertise_port ? cfg->advertise_port : h->port;
    ctx->nhosts++;
    *out = h;
    return CM_OK;
}

static void listener_closed(uv_handle_t *hd)
{
    host_handle_closed(hd->data);
}

void p2p_host_close(struct p2p_host *h)
{
    if (!h || h->closing)
        return;
    h->closing = 1;
    h->ctx->nhosts--;
    while (h->conns) {
        h->conns->graceful = 1;
        conn_close(h->conns, CM_ECLOSED);
    }
    if (h->listening) {
        h->listening = 0;
        uv_close((uv_handle_t *)&h->listener, listener_closed);
    }
    if (h->nhandles == 0) {
        free(h->token);
        free(h);
    }
}

uint16_t p2p_host_port(const struct p2p_host *h)
{
    return h->port;
}

struct p2p_ctx *p2p_host_ctx(struct p2p_host *h)
{
    return h->ctx;
}

const uint8_t *p2p_host_pub(const struct p2p_host *h)
{
    return h->key->pub;
}

int p2p_host_set_token(struct p2p_host *h, const char *token)
{
    if (!token || strlen(token) > CM_TOKEN_MAX_LEN)
        return CM_EINVAL;
    char *t = strdup(token);
    if (!t)
        return CM_ENOMEM;
    free(h->token);
    h->token = t;
    /* Our sessions' peers hold our old pass (so will a handshake in flight,
     * signed with it): the next frame on each is a signed envelope with the
     * new token (p2p_session.h). */
    for (struct p2p_conn *c = h->conns; c; c = c->hnext)
        if (c->tx_on || c->hello)
            c->tx_resign = 1;
    return CM_OK;
}

/* ---- requests ---------------------------------------------------------- */

static void on_connect(uv_connect_t *req, int status)
{
    struct p2p_conn *c = req->data;
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        conn_close(c, CM_ECONN);
        return;
    }
    c->state = C_OPEN;
    c->connected = 1;
    uv_tcp_nodelay(&c->tcp, 1);
    read_start(c);
    conn_flush(c);
}

static void pending_timeout(uv_timer_t *t)
{
    struct pending *p = t->data;
    p->host->ctx->st.timeouts++;
    pending_finish(p, CM_ETIMEOUT, NULL, NULL, 0);
}

/* Opens the connection's socket; closes it (failing its requests) when
 * that fails at once. */
static int conn_connect(struct p2p_conn *c)
{
    struct p2p_ctx *ctx = c->h->ctx;
    c->state = C_CONNECTING;
    c->creq.data = c;
    int e = uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&c->remote, on_connect);
    if (e) {
        CM_LOGW("p2p", "connect: %s", uv_strerror(e));
        c->state = C_OPEN; /* so conn_close runs its full path */
        conn_close(c, CM_ECONN);
        return CM_ECONN;
    }
    c->has_fd = 1;
    ctx->fds++;
    ctx->st.conns_opened++;
    return CM_OK;
}

static void conn_start_waiting(struct p2p_ctx *ctx)
{
    while (ctx->fdwait_head && ctx->fds < ctx->max_conns) {
        struct p2p_conn *c = ctx->fdwait_head;
        ctx->fdwait_head = c->fdnext;
        if (!ctx->fdwait_head)
            ctx->fdwait_tail = NULL;
        c->fdnext = NULL;
        conn_connect(c);
    }
}

static struct p2p_conn *conn_get(struct p2p_host *h, const struct sockaddr *addr, int *rc)
{
    struct p2p_ctx *ctx = h->ctx;
    for (struct p2p_conn *c = h->conns; c; c = c->hnext)
        if (c->outgoing && c->state != C_CLOSING && p2p__addr_equal(&c->remote, addr))
            return c;
    struct p2p_conn *c = conn_alloc(h, 1);
    if (!c) {
        *rc = CM_ENOMEM;
        return NULL;
    }
    memcpy(&c->remote, addr, p2p__addr_len(addr));
    if (ctx->fds >= ctx->max_conns) {
        /* At the descriptor budget (closing connections still hold theirs):
         * make room by closing the least recently used idle connection and
         * start this one when a descriptor is released. Its requests keep
         * their deadlines meanwhile. */
        evict_one(ctx);
        c->state = C_WAITING;
        if (ctx->fdwait_tail)
            ctx->fdwait_tail->fdnext = c;
        else
            ctx->fdwait_head = c;
        ctx->fdwait_tail = c;
        ctx->st.conns_waited++;
        return c;
    }
    if ((*rc = conn_connect(c)))
        return NULL;
    return c;
}

/* Sends one request on c and attaches its pending entry. internal: a HELLO
 * (never retried on another connection, not counted). */
static int request_on(struct p2p_host *h, struct p2p_conn *c, const struct sockaddr *addr,
                      const uint8_t *peer_pub, uint32_t type, const struct p2p_iov *body,
                      size_t n, uint32_t timeout_ms, p2p_response_cb cb, void *arg, int internal,
                      int keep, struct pending **out)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += body[i].len;
    struct pending *p = calloc(1, sizeof *p);
    if (!p)
        return CM_ENOMEM;
    p->id = h->next_id++;
    p->cb = cb;
    p->arg = arg;
    p->host = h;
    p->conn = c;
    if (peer_pub) {
        memcpy(p->expect_pub, peer_pub, 32);
        p->has_expect = 1;
    }
    p->type = type;
    p->blen = len;
    p->internal = internal;
    p->retried = !keep; /* without a copy of the body it cannot be sent again */
    memcpy(&p->addr, addr, p2p__addr_len(addr));
    if (len && keep && !(p->body = malloc(len))) {
        free(p);
        return CM_ENOMEM;
    }
    for (size_t i = 0, off = 0; keep && i < n; off += body[i].len, i++)
        if (body[i].len)
            memcpy(p->body + off, body[i].base, body[i].len);
    cm_random_bytes(p->nonce, P2P_NONCE_LEN);
    if (out)
        *out = p;
    int rc = send_envelope(c, P2P_KIND_REQUEST, type, p->id, peer_pub, p->nonce, 0, body, n);
    if (rc || c->state == C_CLOSING) { /* C_CLOSING: the write failed at once */
        free(p->body);
        free(p);
        return rc ? rc : CM_ECONN;
    }
    uv_timer_init(h->ctx->loop, &p->timer);
    p->timer.data = p;
    h->nhandles++;
    uv_timer_start(&p->timer, pending_timeout, timeout_ms, 0);
    pending_attach(p, c);
    if (!internal)
        h->ctx->st.requests_sent++;
    return CM_OK;
}

/* The initiator's side of a HELLO: on a signed answer from the expected
 * key, derive the keys and switch both directions to session frames. Any
 * failure leaves the connection with signed envelopes. */
static void hello_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                       size_t len)
{
    struct hello *hs = arg;
    struct p2p_conn *c = hs->c; /* alive: pendings finish before their connection is freed */
    if (c->hello == hs)
        c->hello = NULL;
    uint8_t ki[P2P_SESSION_KEY_LEN], kr[P2P_SESSION_KEY_LEN];
    struct p2p_mac tx = {0}, rx = {0};
    if (status == CM_OK && from && len == P2P_KX_LEN && c->state == C_OPEN && !c->tx_on &&
        p2p_kx_derive(&hs->kx, body, c->h->key->pub, from->pub, hs->kx.pub, body, hs->nonce, ki,
                      kr) == CM_OK &&
        p2p_mac_init(&tx, ki) == CM_OK && p2p_mac_init(&rx, kr) == CM_OK) {
        c->stx = tx;
        c->srx = rx;
        c->tx_on = c->rx_on = 1;
        memcpy(c->peer_pub, from->pub, 32);
        c->peer_claims = *from->claims;
        c->peer_port = from->listen_port;
        c->h->ctx->st.sessions++;
    } else {
        p2p_mac_cleanup(&tx);
        p2p_mac_cleanup(&rx);
    }
    OPENSSL_cleanse(ki, sizeof ki);
    OPENSSL_cleanse(kr, sizeof kr);
    p2p_kx_cleanup(&hs->kx);
    free(hs);
}

/* Starts the handshake on a busy outgoing connection (once). */
static void hello_start(struct p2p_host *h, struct p2p_conn *c, const struct sockaddr *addr,
                        const uint8_t *peer_pub, uint32_t timeout_ms)
{
    struct hello *hs = calloc(1, sizeof *hs);
    if (!hs)
        return;
    hs->c = c;
    struct pending *p = NULL;
    struct p2p_iov one = {hs->kx.pub, P2P_KX_LEN};
    if (p2p_kx_new(&hs->kx) ||
        request_on(h, c, addr, peer_pub, P2P_MSG_HELLO, &one, 1, timeout_ms, hello_done, hs, 1, 0,
                   &p)) {
        p2p_kx_cleanup(&hs->kx);
        free(hs);
        c->n_requests = 0; /* try again after as many requests */
        c->request_bytes = 0;
        return;
    }
    memcpy(hs->nonce, p->nonce, P2P_NONCE_LEN);
    c->hello = hs;
    c->hello_tried = 1;
}

/* Shared by p2p_request and p2p_request_iov. */
static int request_start(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                         uint32_t type, const struct p2p_iov *body, size_t n, uint32_t timeout_ms,
                         p2p_response_cb cb, void *arg, int keep)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += body[i].len;
    if (h->closing)
        return CM_ECLOSED;
    if (!cb || !addr || (!peer_pub && type != P2P_MSG_PING) || len > P2P_FRAME_MAX_PAYLOAD - 4096 ||
        (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) || timeout_ms == 0 ||
        type == P2P_MSG_HELLO)
        return CM_EINVAL;
    int rc = CM_OK;
    struct p2p_conn *c = conn_get(h, addr, &rc);
    if (!c)
        return rc;
    if (c->wq_bytes > h->ctx->max_queue)
        return CM_EBUSY;
    c->n_requests++;
    c->request_bytes += len;
    if (peer_pub && !h->ctx->no_sessions && !c->hello_tried && c->state != C_CLOSING &&
        (c->n_requests >= SESSION_AFTER_REQUESTS || c->request_bytes >= SESSION_AFTER_BYTES))
        hello_start(h, c, addr, peer_pub, timeout_ms);
    if (c->state == C_CLOSING)
        return CM_ECONN;
    return request_on(h, c, addr, peer_pub, type, body, n, timeout_ms, cb, arg, 0, keep, NULL);
}

int p2p_request(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                uint32_t type, const uint8_t *body, size_t len, uint32_t timeout_ms,
                p2p_response_cb cb, void *arg)
{
    struct p2p_iov one = {body, len};
    return request_start(h, addr, peer_pub, type, &one, 1, timeout_ms, cb, arg, 1);
}

int p2p_request_iov(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                    uint32_t type, const struct p2p_iov *body, size_t n, uint32_t timeout_ms,
                    p2p_response_cb cb, void *arg)
{
    return request_start(h, addr, peer_pub, type, body, n, timeout_ms, cb, arg, 0);
}
