/* The transport's connections (see p2p_transport.c for the whole): their
 * life from allocation to close, the connection and descriptor budgets
 * (eviction, waiting for a descriptor), the write queues with the bandwidth
 * caps and the emulated link latency, reading and reassembling frames, and
 * connecting. What a received frame means is p2p_request.c's concern
 * (p2p__handle_frame). */
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
/* Frames up to this size go out at once on a capped upload, the bucket
 * going into debt if it must (conn_flush). */
#define URGENT_FRAME 4096u

/* ---- connections ------------------------------------------------------- */

static void conn_flush(struct p2p_conn *c);

void p2p__host_handle_closed(struct p2p_host *h)
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
    p2p__host_handle_closed(h);
}

/* Unlinks p from its connection and calls its callback once. */
void p2p__pending_finish(struct pending *p, int status, const struct p2p_peer *from,
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

void p2p__pending_attach(struct pending *p, struct p2p_conn *c)
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
    struct p2p_conn *c = h->closing ? NULL : p2p__conn_get(h, (struct sockaddr *)&p->addr, &rc);
    if (!c) {
        pending_finish_detached(p, err);
        return;
    }
    p->retried = 1;
    p->id = h->next_id++;
    cm_random_bytes(p->nonce, P2P_NONCE_LEN);
    h->ctx->st.retries++;
    struct p2p_iov one = {p->body, p->blen};
    if (p2p__send_envelope(c, P2P_KIND_REQUEST, p->type, p->id,
                           p->has_expect ? p->expect_pub : NULL, p->nonce, 0, &one, 1) ||
        c->state == C_CLOSING) {
        pending_finish_detached(p, err);
        return;
    }
    p2p__pending_attach(p, c);
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
    p2p__host_handle_closed(h);
    if (had_fd)
        ctx->fds--;
    ctx->conn_handles--;
    if (ctx->freeing)
        p2p__ctx_release(ctx);
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

void p2p__conn_close(struct p2p_conn *c, int err)
{
    if (c->state == C_CLOSING)
        return;
    struct p2p_host *h = c->h;
    struct p2p_ctx *ctx = h->ctx;
    c->state = C_CLOSING;
    if (c->relay || c->circ || c->splice_next || c->pre || c->punch)
        p2p__relay_conn_closed(c);
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
            p2p__pending_finish(p, err, NULL, NULL, 0);
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
    if (!c->outgoing && !c->relay_uncounted)
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
void p2p__conn_drop(struct p2p_conn *c, enum p2p_reject why, const char *detail)
{
    char a[80];
    p2p_addr_format((const struct sockaddr *)&c->remote, a, sizeof a);
    char msg[160];
    snprintf(msg, sizeof msg, "%s from %s", detail, a);
    p2p_auth_count(&c->h->ctx->auth, why, msg);
    c->h->ctx->st.drops++;
    p2p__conn_close(c, CM_EPROTO);
}

/* Closes the least recently active idle connection of the process. */
int p2p__evict_one(struct p2p_ctx *ctx)
{
    /* The list is kept in activity order, so the first idle connection
     * from the head is the least recently used one; the scan is bounded
     * so a budget full of busy connections costs little. */
    struct p2p_conn *best = NULL;
    int scanned = 0;
    for (struct p2p_conn *c = ctx->conns; c && scanned < 256; c = c->cnext, scanned++)
        if (c->state == C_OPEN && c->n_pend == 0 && c->n_deferred == 0 && !c->relay &&
            !c->relay_uncounted && c->wq_bytes == 0 && c->rx_len == 0) {
            best = c;
            break;
        }
    if (!best)
        return CM_EBUSY;
    ctx->st.conns_evicted++;
    p2p__conn_close(best, CM_ECLOSED);
    return CM_OK;
}

struct p2p_conn *p2p__conn_alloc(struct p2p_host *h, int outgoing)
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
    c->last_active_ms = p2p__mono_ms();
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

struct p2p_conn *p2p__conn_accept(struct p2p_host *h, uv_stream_t *srv)
{
    struct p2p_conn *c = p2p__conn_alloc(h, 0);
    if (!c)
        return NULL;
    c->state = C_OPEN;
    if (uv_accept(srv, (uv_stream_t *)&c->tcp)) {
        p2p__conn_close(c, CM_ECONN);
        return NULL;
    }
    c->connected = 1;
    c->has_fd = 1;
    h->ctx->fds++;
    int len = sizeof c->remote;
    uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->remote, &len);
    h->ctx->st.conns_accepted++;
    return c;
}

/* Marks activity: the connection moves to the tail of the LRU list. */
static void conn_touch(struct p2p_conn *c)
{
    struct p2p_ctx *ctx = c->h->ctx;
    c->last_active_ms = p2p__mono_ms();
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
    while (n_wait-- && (c = ctx->wait_head) && p2p_rate_available(&ctx->up, p2p__now_ns()) > 0) {
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
                       p2p_rate_wait_ms(&ctx->up, rate_quantum(&ctx->up), p2p__now_ns()), 0);
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
            p2p__conn_close(c, CM_ECONN);
        } else if (c->relay == P2P_RL_RAW) {
            p2p__relay_drained(c);
        } else if (c->bp_paused && c->wq_bytes < c->h->ctx->max_queue / 2) {
            c->bp_paused = 0;
            p2p__read_start(c);
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
        size_t avail = p2p_rate_available(&ctx->up, p2p__now_ns());
        size_t q = rate_quantum(&ctx->up);
        /* A small frame not yet started (a DHT answer, a Ping, an
         * acknowledgement, an outcome) goes out now, the bucket taking the
         * debt: behind the all-reduce's chunks in the upload's queue, a 4
         * Mbit/s peer's DHT answers waited 0.4-1.5 s, its partners'
         * gatherings read the round's members that much later, and its
         * rounds waited for them in steps of half a gradient (CI's
         * test_schedule_follow failure). The debt is repaid before the
         * bulk frames write again, so the long-run rate stays exact. */
        int urgent = p2p_rate_limited(&ctx->up) && f->off == 0 && f->len <= URGENT_FRAME;
        /* Capped: write a quantum at a time (or the frame's end), not
         * whatever trickle has accrued: fewer, larger writes. */
        if (!urgent && (avail == 0 || (p2p_rate_limited(&ctx->up) && avail < (n < q ? n : q)))) {
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
                uv_timer_start(
                    &ctx->up_timer, up_timer_cb,
                    p2p_rate_wait_ms(&ctx->up, rate_quantum(&ctx->up), p2p__now_ns()), 0);
            }
            return;
        }
        if (p2p_rate_limited(&ctx->up) && !urgent) {
            /* Slice so the long-run rate is exact at byte granularity. */
            if (n > avail)
                n = avail;
            if (n > WRITE_SLICE)
                n = WRITE_SLICE;
        }
        struct wreq *r = malloc(sizeof *r);
        if (!r) {
            p2p__conn_close(c, CM_ENOMEM);
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
            p2p__conn_close(c, CM_ECONN);
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

/* The emulated one-way delay of c's frames: a rule's for its remote
 * address, else the context's. */
static uint32_t conn_latency(const struct p2p_conn *c)
{
    const struct p2p_ctx *ctx = c->h->ctx;
    long r = ctx->n_lat_rules
                 ? p2p_latency_rules_match(ctx->lat_rules, ctx->n_lat_rules, (const struct sockaddr *)&c->remote)
                 : -1;
    return r >= 0 ? (uint32_t)r : ctx->latency_ms;
}

static void delay_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    int64_t now = p2p__mono_ms();
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

int p2p__conn_send(struct p2p_conn *c, uint8_t *buf, size_t len)
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
    uint32_t lat = conn_latency(c);
    if (lat) {
        /* Emulated latency (benchmarks of home links and regions; netem is
         * not available everywhere): the frame waits, then queues as
         * usual. Different connections may wait differently (rules by
         * network): the queue stays in due order, and a connection's
         * frames, all with one delay, keep theirs. */
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
        d->due_ms = p2p__mono_ms() + lat;
        if (!ctx->dq_tail || ctx->dq_tail->due_ms <= d->due_ms) {
            if (ctx->dq_tail)
                ctx->dq_tail->next = d;
            else
                ctx->dq_head = d;
            ctx->dq_tail = d;
        } else {
            struct delayed **pp = &ctx->dq_head;
            while ((*pp)->due_ms <= d->due_ms)
                pp = &(*pp)->next;
            d->next = *pp;
            *pp = d;
        }
        if (ctx->dq_head == d)
            uv_timer_start(&ctx->delay_timer, delay_cb, lat, 0);
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
int p2p__conn_send_parts(struct p2p_conn *c, const struct p2p_iov *parts, size_t np)
{
    struct p2p_ctx *ctx = c->h->ctx;
    size_t total = 0, done = 0;
    for (size_t i = 0; i < np; i++)
        total += parts[i].len;
    if (c->state == C_OPEN && !c->wq_head && !conn_latency(c) && !p2p_rate_limited(&ctx->up) &&
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
        p2p__conn_close(c, CM_ENOMEM);
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
    return p2p__conn_send(c, buf, total - done);
}

/* ---- reading ----------------------------------------------------------- */

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    struct p2p_conn *c = hd->data;
    struct p2p_ctx *ctx = c->h->ctx;
    (void)suggested;
    size_t want = RX_CHUNK;
    if (p2p_rate_limited(&ctx->down)) {
        size_t avail = p2p_rate_available(&ctx->down, p2p__now_ns());
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
    if (p2p_rate_available(&ctx->down, p2p__now_ns()) < rate_quantum(&ctx->down)) {
        ctx->down_timer_armed = 1;
        uv_timer_start(&ctx->down_timer, down_timer_cb,
                       p2p_rate_wait_ms(&ctx->down, rate_quantum(&ctx->down), p2p__now_ns()), 0);
        return;
    }
    ctx->down_paused = 0;
    for (struct p2p_conn *c = ctx->conns; c; c = c->cnext)
        p2p__read_start(c);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

void p2p__read_start(struct p2p_conn *c)
{
    if (c->state != C_OPEN || c->reading || c->bp_paused || c->h->ctx->down_paused)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
        c->reading = 1;
}

void p2p__read_stop(struct p2p_conn *c)
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
        p2p__conn_drop(c, P2P_REJ_MALFORMED, "receive memory limit reached");
        return;
    }
    if (nread < 0) {
        p2p__conn_close(c, nread == UV_EOF ? CM_ECLOSED : CM_ECONN);
        return;
    }
    if (c->state != C_OPEN)
        return;
    ctx->st.bytes_received += (uint64_t)nread;
    conn_touch(c);
    if (p2p_rate_limited(&ctx->down)) {
        p2p_rate_consume(&ctx->down, (size_t)nread);
        if (p2p_rate_available(&ctx->down, p2p__now_ns()) < rate_quantum(&ctx->down)) {
            /* Pause every connection of the process until the bucket
             * refills; the kernel's receive window then throttles the
             * senders, which is what a slow home link does. */
            ctx->down_paused = 1;
            for (struct p2p_conn *x = ctx->conns; x; x = x->cnext)
                p2p__read_stop(x);
            if (!ctx->down_timer_armed) {
                ctx->down_timer_armed = 1;
                uv_timer_start(
                    &ctx->down_timer, down_timer_cb,
                    p2p_rate_wait_ms(&ctx->down, rate_quantum(&ctx->down), p2p__now_ns()), 0);
            }
        }
    }
    if (c->relay == P2P_RL_RAW) { /* a relay's circuit: bytes, not frames */
        p2p__relay_bytes(c, (const uint8_t *)buf->base, (size_t)nread);
        return;
    }
    uint8_t *data;
    size_t dlen;
    int shared = buf->base == (char *)ctx->rxbuf;
    if (shared) {
        c->frame_start_ms = p2p__mono_ms();
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
            p2p__conn_drop(c, P2P_REJ_MALFORMED,
                           rc == CM_EVERSION ? "unsupported protocol version"
                           : rc == CM_ETOOBIG ? "oversized frame"
                                         : "bad frame header");
            return;
        }
        p2p__handle_frame(c, payload - P2P_FRAME_HDR_LEN, plen);
        off += used;
        c->frame_start_ms = p2p__mono_ms();
        if (c->relay == P2P_RL_RAW && c->state == C_OPEN) {
            /* spliced by the frame just served (an ACCEPT): the rest is
               the circuit's */
            if (dlen > off)
                p2p__relay_bytes(c, data + off, dlen - off);
            if (!shared) {
                ctx->rx_held -= c->rx_cap;
                free(c->rx);
                c->rx = NULL;
                c->rx_cap = c->rx_len = 0;
            }
            return;
        }
    }
    if (c->state != C_OPEN)
        return;
    size_t left = dlen - off;
    if (shared) {
        if (left) { /* keep the partial frame on the connection */
            if (ctx->rx_held + left > ctx->max_rx_held) {
                p2p__conn_drop(c, P2P_REJ_MALFORMED, "receive memory limit reached");
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
                p2p__conn_close(c, CM_ENOMEM);
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

/* ---- connecting ------------------------------------------------------- */

static void on_connect(uv_connect_t *req, int status)
{
    struct p2p_conn *c = req->data;
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        p2p__conn_close(c, CM_ECONN);
        return;
    }
    c->state = C_OPEN;
    c->connected = 1;
    uv_tcp_nodelay(&c->tcp, 1);
    p2p__read_start(c);
    conn_flush(c);
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
        c->state = C_OPEN; /* so p2p__conn_close runs its full path */
        p2p__conn_close(c, CM_ECONN);
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

struct p2p_conn *p2p__conn_get(struct p2p_host *h, const struct sockaddr *addr, int *rc)
{
    for (struct p2p_conn *c = h->conns; c; c = c->hnext)
        if (c->outgoing && !c->relay && c->state != C_CLOSING && p2p__addr_equal(&c->remote, addr))
            return c;
    return p2p__conn_new(h, addr, rc);
}

struct p2p_conn *p2p__conn_new(struct p2p_host *h, const struct sockaddr *addr, int *rc)
{
    struct p2p_ctx *ctx = h->ctx;
    struct p2p_conn *c = p2p__conn_alloc(h, 1);
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
        p2p__evict_one(ctx);
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

void p2p__conn_close_flushed(struct p2p_conn *c)
{
    if (c->state == C_CLOSING)
        return;
    if (c->state != C_OPEN || c->wq_bytes == 0) {
        c->graceful = 1;
        p2p__conn_close(c, CM_ECLOSED);
        return;
    }
    c->close_flushed = 1;
    p2p__read_stop(c);
    c->bp_paused = 1; /* stays unread */
}
