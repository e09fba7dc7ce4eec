/* Circuit relays (p2p_relay.h; docs/protocol.md "Relays"; seed
 * 000_02cc6b5d62a616fc.txt section 3.3, technique 2): the relay's side
 * (reservations with their lent ports, circuits, splicing) and the
 * reserving side (RESERVE, the WAIT loop, accepting circuits). */
#include "p2p/p2p_relay.h"
#include "p2p/p2p_msg.h"
#include "p2p/p2p_internal.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

/* Bytes a circuit side may have queued towards its partner before the
 * partner's reading pauses (its sender then waits on TCP flow control). */
#define RELAY_QUEUE (512u * 1024u)
/* Bytes a dialer may send before its circuit is accepted: reading pauses
 * beyond (one read more at most, RX_CHUNK). */
#define RELAY_PRE_MAX (64u * 1024u)
#define RELAY_TICK_MS 500

struct relay_circ {
    struct relay_circ *next;
    uint64_t id;
    struct relay_resv *rv;
    struct p2p_conn *dialer;
    int64_t t0_ms;
    int announced;
};

struct relay_resv {
    struct relay_resv *next;
    struct p2p_relay *r;
    struct p2p_host *h; /* the relay may be freed before the port's handle closes */
    uint8_t owner[32];
    uv_tcp_t lis;
    uint16_t port;
    struct p2p_deferred *wait; /* the owner's WAIT, held open */
    int64_t wait_ms, seen_ms;
    struct relay_circ *pend;
    uint32_t n_pend;
    int dropped;
};

struct p2p_relay {
    struct p2p_host *h;
    struct p2p_relay_limits lim;
    struct relay_resv *resv;
    uint32_t n_resv, n_circ;
    uv_timer_t timer;
    int closing;
    struct p2p_relay_stats st;
};

struct p2p_relay_client {
    struct p2p_host *h;
    struct sockaddr_storage relay;
    uint8_t relay_pub[32];
    uint32_t timeout_ms;
    uint16_t port;
    int reserved, dead;
    unsigned refs; /* requests in flight (their callbacks hold this struct) */
    p2p_relay_cb cb;
    void *arg;
};

static struct p2p_relay_stats g_none;

/* ---- the relay's side ---------------------------------------------------- */

static void relay_lim_defaults(struct p2p_relay_limits *l)
{
    if (!l->max_reservations)
        l->max_reservations = 16;
    if (!l->max_per_peer)
        l->max_per_peer = 4;
    if (!l->max_circuits)
        l->max_circuits = 128;
    if (!l->max_pending)
        l->max_pending = 8;
    if (!l->max_per_ip)
        l->max_per_ip = 48; /* peers behind one NAT share an address: 16 refused two of them
                               their circuits to four relayed peers (test_hosts) */
    if (!l->accept_ms)
        l->accept_ms = 5000;
    if (!l->wait_ms)
        l->wait_ms = 15000;
    if (!l->idle_ms)
        l->idle_ms = 20000;
}

/* Answers the owner's WAIT with the circuits it has not heard of (or
 * with none when `empty_ok`). */
static void resv_announce(struct relay_resv *rv, int empty_ok)
{
    if (!rv->wait)
        return;
    uint64_t ids[P2P_RELAY_MAX_ANNOUNCE];
    size_t n = 0;
    for (struct relay_circ *x = rv->pend; x && n < P2P_RELAY_MAX_ANNOUNCE; x = x->next)
        if (!x->announced)
            ids[n++] = x->id;
    if (!n && !empty_ok)
        return;
    uint8_t *body = NULL;
    size_t blen = 0;
    int rc = p2p_relay_circuits_encode(ids, n, &body, &blen);
    struct p2p_iov one = {body, blen};
    struct p2p_deferred *d = rv->wait;
    rv->wait = NULL;
    rv->seen_ms = p2p__mono_ms();
    if (p2p_reply_finish(d, rc, &one, rc ? 0 : 1) == CM_OK)
        for (struct relay_circ *x = rv->pend; x; x = x->next)
            for (size_t i = 0; i < n; i++)
                if (x->id == ids[i])
                    x->announced = 1;
    free(body);
}

static void resv_lis_closed(uv_handle_t *hd)
{
    struct relay_resv *rv = hd->data;
    struct p2p_host *h = rv->h;
    free(rv);
    p2p__host_handle_closed(h);
}

/* Drops a reservation: its port closes, circuits waiting for an accept
 * close; spliced circuits carry on until they end. */
static void resv_drop(struct relay_resv *rv)
{
    struct p2p_relay *r = rv->r;
    for (struct relay_resv **pp = &r->resv; *pp; pp = &(*pp)->next)
        if (*pp == rv) {
            *pp = rv->next;
            break;
        }
    r->n_resv--;
    rv->dropped = 1;
    if (rv->wait) {
        p2p_reply_finish(rv->wait, CM_ECLOSED, NULL, 0);
        rv->wait = NULL;
    }
    while (rv->pend) /* closing the dialer unlinks its circuit (relay_conn_closed) */
        p2p__conn_close(rv->pend->dialer, CM_ECLOSED);
    uv_close((uv_handle_t *)&rv->lis, resv_lis_closed);
}

static void relay_tick(uv_timer_t *t)
{
    struct p2p_relay *r = t->data;
    int64_t now = p2p__mono_ms();
    for (struct relay_resv *rv = r->resv, *next; rv; rv = next) {
        next = rv->next;
        for (struct relay_circ *x = rv->pend, *xn; x; x = xn) {
            xn = x->next;
            if (now - x->t0_ms > (int64_t)r->lim.accept_ms) {
                r->st.circuits_expired++;
                p2p__conn_close(x->dialer, CM_ETIMEOUT);
            }
        }
        /* the owner's connection closed under its WAIT: it is gone */
        if (rv->wait && !rv->wait->c) {
            resv_drop(rv);
            continue;
        }
        if (rv->wait && now - rv->wait_ms > (int64_t)r->lim.wait_ms)
            resv_announce(rv, 1);
        if (!rv->wait && now - rv->seen_ms > (int64_t)r->lim.idle_ms)
            resv_drop(rv);
    }
}

static int same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET)
        return !memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                       &((const struct sockaddr_in *)b)->sin_addr, 4);
    return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
}

/* A connection to a lent port: a circuit, held until the owner accepts. */
static void resv_on_conn(uv_stream_t *srv, int status)
{
    struct relay_resv *rv = srv->data;
    struct p2p_relay *r = rv->r;
    struct p2p_host *h = r->h;
    struct p2p_ctx *ctx = h->ctx;
    if (status < 0 || h->closing || rv->dropped)
        return;
    struct p2p_conn *c = p2p__conn_accept(h, srv);
    if (!c)
        return;
    uint32_t from_ip = 0;
    for (struct p2p_conn *o = h->conns; o; o = o->hnext)
        from_ip += o != c && o->relay_dialer && same_ip(&o->remote, &c->remote);
    struct relay_circ *x = NULL;
    if (r->n_circ >= r->lim.max_circuits || from_ip >= r->lim.max_per_ip || rv->n_pend >= r->lim.max_pending ||
        (ctx->fds > ctx->max_conns && p2p__evict_one(ctx)) || !(x = calloc(1, sizeof *x))) {
        r->st.circuits_refused++;
        ctx->st.conns_refused++;
        char who[80];
        p2p_addr_format((const struct sockaddr *)&c->remote, who, sizeof who);
        uint64_t k = r->st.circuits_refused; /* 1st, 2nd, 4th, 8th...: a flood logs little */
        if ((k & (k - 1)) == 0)
            CM_LOGW("p2p", "relay: circuit from %s refused (%u from there, %u of %u in all; %llu "
                    "refused so far)", who, from_ip, r->n_circ, r->lim.max_circuits,
                    (unsigned long long)k);
        p2p__conn_close(c, CM_EBUSY);
        return;
    }
    if (c->state != C_OPEN) { /* the budget's eviction took this very connection */
        free(x);
        r->st.circuits_refused++;
        return;
    }
    do
        cm_random_bytes(&x->id, sizeof x->id);
    while (!x->id);
    x->rv = rv;
    x->dialer = c;
    x->t0_ms = p2p__mono_ms();
    x->next = rv->pend;
    rv->pend = x;
    rv->n_pend++;
    c->relay = P2P_RL_RAW;
    c->relay_dialer = 1;
    c->relay_uncounted = 1; /* the relay's limits bound circuits, not the inbound cap */
    h->n_inbound--;
    c->circ = x;
    r->n_circ++;
    r->st.circuits++;
    uv_tcp_nodelay(&c->tcp, 1);
    p2p__read_start(c);
    resv_announce(rv, 0);
}

static int serve_reserve(struct p2p_relay *r, const struct p2p_peer *from, uint8_t **resp,
                         size_t *rlen)
{
    struct p2p_host *h = r->h;
    uint32_t mine = 0;
    struct relay_resv *stale = NULL;
    for (struct relay_resv *rv = r->resv; rv; rv = rv->next)
        if (!memcmp(rv->owner, from->pub, 32)) {
            mine++;
            if (!rv->wait)
                stale = rv;
        }
    /* a peer that reserves again after giving up on a reservation (there is
       no release message) gets the one it no longer waits on replaced */
    if (mine >= r->lim.max_per_peer && stale) {
        resv_drop(stale);
        mine--;
    }
    if (r->n_resv >= r->lim.max_reservations || mine >= r->lim.max_per_peer) {
        r->st.reservations_refused++;
        return CM_EBUSY;
    }
    struct sockaddr_storage a;
    int alen = sizeof a;
    if (uv_tcp_getsockname(&h->listener, (struct sockaddr *)&a, &alen))
        return CM_EIO;
    p2p__addr_set_port(&a, 0);
    struct relay_resv *rv = calloc(1, sizeof *rv);
    if (!rv)
        return CM_ENOMEM;
    rv->r = r;
    rv->h = h;
    memcpy(rv->owner, from->pub, 32);
    rv->seen_ms = p2p__mono_ms();
    uv_tcp_init(h->ctx->loop, &rv->lis);
    rv->lis.data = rv;
    h->nhandles++;
    int e = uv_tcp_bind(&rv->lis, (struct sockaddr *)&a, 0);
    if (!e)
        e = uv_listen((uv_stream_t *)&rv->lis, 64, resv_on_conn);
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (!e)
        e = uv_tcp_getsockname(&rv->lis, (struct sockaddr *)&bound, &blen);
    if (e) {
        CM_LOGW("p2p", "relay: cannot lend a port: %s", uv_strerror(e));
        uv_close((uv_handle_t *)&rv->lis, resv_lis_closed);
        return CM_EIO;
    }
    rv->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                : ((struct sockaddr_in6 *)&bound)->sin6_port);
    int rc = p2p_relay_port_encode(rv->port, resp, rlen);
    if (rc) {
        uv_close((uv_handle_t *)&rv->lis, resv_lis_closed);
        return rc;
    }
    rv->next = r->resv;
    r->resv = rv;
    r->n_resv++;
    r->st.reservations++;
    char who[80];
    p2p_addr_format((const struct sockaddr *)&from->addr, who, sizeof who);
    CM_LOGI("p2p", "relay: lent port %u to a peer at %s", rv->port, who);
    return CM_OK;
}

static struct relay_resv *find_resv(struct p2p_relay *r, const uint8_t owner[32], uint16_t port)
{
    for (struct relay_resv *rv = r->resv; rv; rv = rv->next)
        if (rv->port == port && !memcmp(rv->owner, owner, 32))
            return rv;
    return NULL;
}

static int serve_wait(struct p2p_relay *r, const struct p2p_peer *from, const uint8_t *body,
                      size_t len)
{
    uint16_t port;
    if (p2p_relay_port_parse(body, len, &port))
        return CM_EPARSE;
    struct relay_resv *rv = find_resv(r, from->pub, port);
    if (!rv)
        return CM_ENOTFOUND;
    if (rv->wait) /* a second WAIT replaces the first, which is answered empty */
        resv_announce(rv, 1);
    struct p2p_deferred *d = p2p_reply_defer(r->h);
    if (!d)
        return CM_ENOMEM;
    rv->wait = d;
    rv->wait_ms = rv->seen_ms = p2p__mono_ms();
    resv_announce(rv, 0); /* circuits that arrived in between */
    return CM_OK;
}

static int serve_accept(struct p2p_relay *r, struct p2p_conn *c, const struct p2p_peer *from,
                        const uint8_t *body, size_t len)
{
    uint64_t id;
    if (p2p_relay_accept_parse(body, len, &id))
        return CM_EPARSE;
    struct relay_circ *x = NULL, **px = NULL;
    for (struct relay_resv *rv = r->resv; rv && !x; rv = rv->next) {
        if (memcmp(rv->owner, from->pub, 32))
            continue;
        for (px = &rv->pend; *px; px = &(*px)->next)
            if ((*px)->id == id) {
                x = *px;
                break;
            }
    }
    if (!x)
        return CM_ENOTFOUND;
    /* The connection becomes the circuit's: it must carry nothing else
     * (a fresh, inbound connection without a session or owed answers). */
    if (c->outgoing || c->relay || c->rx_on || c->tx_on || c->hello || c->n_pend ||
        c->n_deferred || c->splice_next)
        return CM_ESTATE;
    *px = x->next;
    x->rv->n_pend--;
    struct p2p_conn *d = x->dialer;
    d->circ = NULL;
    free(x);
    c->splice_next = d;
    return CM_OK;
}

int p2p__relay_serve(struct p2p_conn *c, const struct p2p_peer *from, uint32_t type,
                     const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct p2p_relay *r = c->h->relay;
    if (!r || r->closing)
        return CM_EUNSUPPORTED;
    switch (type) {
    case P2P_MSG_RELAY_RESERVE: return serve_reserve(r, from, resp, rlen);
    case P2P_MSG_RELAY_WAIT: return serve_wait(r, from, body, len);
    case P2P_MSG_RELAY_ACCEPT: return serve_accept(r, c, from, body, len);
    default: return CM_EUNSUPPORTED;
    }
}

void p2p__relay_splice(struct p2p_conn *c)
{
    struct p2p_conn *d = c->splice_next;
    c->splice_next = NULL;
    if (c->state != C_OPEN)
        return;
    if (!d || d->state != C_OPEN) {
        p2p__conn_close_flushed(c);
        return;
    }
    c->relay = P2P_RL_RAW;
    c->splice = d;
    d->splice = c;
    if (!c->outgoing && !c->relay_uncounted) {
        c->relay_uncounted = 1;
        c->h->n_inbound--;
    }
    if (d->pre_len) {
        struct p2p_relay *r = c->h->relay;
        if (r)
            r->st.bytes += d->pre_len;
        uint8_t *b = d->pre;
        size_t n = d->pre_len;
        d->pre = NULL;
        d->pre_len = 0;
        p2p__conn_send(c, b, n);
    }
    if (d->bp_paused && c->wq_bytes < RELAY_QUEUE / 2) {
        d->bp_paused = 0;
        p2p__read_start(d);
    }
}

void p2p__relay_bytes(struct p2p_conn *c, const uint8_t *data, size_t n)
{
    if (!n || c->state != C_OPEN)
        return;
    struct p2p_conn *p = c->splice;
    if (!p) { /* waiting for the accept: hold, and pause beyond a bound */
        if (c->pre_len + n > RELAY_PRE_MAX + RX_CHUNK) {
            p2p__conn_drop(c, P2P_REJ_MALFORMED, "relay: too much data before the circuit opened");
            return;
        }
        uint8_t *b = realloc(c->pre, c->pre_len + n);
        if (!b) {
            p2p__conn_close(c, CM_ENOMEM);
            return;
        }
        memcpy(b + c->pre_len, data, n);
        c->pre = b;
        c->pre_len += n;
        if (c->pre_len >= RELAY_PRE_MAX) {
            c->bp_paused = 1;
            p2p__read_stop(c);
        }
        return;
    }
    uint8_t *b = malloc(n);
    if (!b) {
        p2p__conn_close(c, CM_ENOMEM);
        return;
    }
    memcpy(b, data, n);
    if (p->wq_bytes == 0)
        p->progress_ms = p2p__mono_ms(); /* its queue starts now */
    struct p2p_relay *r = c->h->relay;
    if (r)
        r->st.bytes += n;
    if (p2p__conn_send(p, b, n)) {
        p2p__conn_close(c, CM_ENOMEM);
        return;
    }
    if (p->state == C_OPEN && p->wq_bytes > RELAY_QUEUE) {
        c->bp_paused = 1;
        p2p__read_stop(c);
    }
}

void p2p__relay_drained(struct p2p_conn *c)
{
    c->last_active_ms = c->progress_ms = p2p__mono_ms(); /* a write completed: progress */
    if (c->close_flushed && c->wq_bytes == 0) {
        c->graceful = 1;
        p2p__conn_close(c, CM_ECLOSED);
        return;
    }
    struct p2p_conn *p = c->splice;
    if (p && p->bp_paused && !p->close_flushed && c->wq_bytes < RELAY_QUEUE / 2) {
        p->bp_paused = 0;
        p2p__read_start(p);
    }
}

void p2p__relay_conn_closed(struct p2p_conn *c)
{
    struct p2p_relay *r = c->h->relay;
    if (c->punch)
        p2p__punch_conn_closed(c);
    if (c->circ) { /* a circuit still waiting for its accept */
        struct relay_circ *x = c->circ;
        for (struct relay_circ **pp = &x->rv->pend; *pp; pp = &(*pp)->next)
            if (*pp == x) {
                *pp = x->next;
                break;
            }
        x->rv->n_pend--;
        free(x);
        c->circ = NULL;
    }
    if (c->splice_next) { /* accepted, not yet spliced: the dialer goes too */
        struct p2p_conn *d = c->splice_next;
        c->splice_next = NULL;
        p2p__conn_close(d, CM_ECLOSED);
    }
    if (c->splice) { /* the other side delivers what it has, then closes */
        struct p2p_conn *p = c->splice;
        c->splice = NULL;
        p->splice = NULL;
        p2p__conn_close_flushed(p);
    }
    if (c->relay_dialer) {
        c->relay_dialer = 0;
        if (r && r->n_circ)
            r->n_circ--;
    }
    free(c->pre);
    c->pre = NULL;
    c->pre_len = 0;
}

static void relay_timer_closed(uv_handle_t *hd)
{
    struct p2p_relay *r = hd->data;
    struct p2p_host *h = r->h;
    free(r);
    p2p__host_handle_closed(h);
}

int p2p_host_relay_enable(struct p2p_host *h, const struct p2p_relay_limits *lim)
{
    if (!h || !h->listening || h->closing)
        return CM_EINVAL;
    struct p2p_relay_limits l = lim ? *lim : (struct p2p_relay_limits){0};
    relay_lim_defaults(&l);
    if (h->relay) {
        h->relay->lim = l;
        return CM_OK;
    }
    struct p2p_relay *r = calloc(1, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    r->h = h;
    r->lim = l;
    uv_timer_init(h->ctx->loop, &r->timer);
    r->timer.data = r;
    h->nhandles++;
    uv_timer_start(&r->timer, relay_tick, RELAY_TICK_MS, RELAY_TICK_MS);
    h->relay = r;
    return CM_OK;
}

/* ---- the reserving side -------------------------------------------------- */

static void client_unref(struct p2p_relay_client *cl)
{
    if (--cl->refs == 0 && cl->dead)
        free(cl);
}

/* The reservation is over: tell the owner once (unless it dropped it). */
static void client_lost(struct p2p_relay_client *cl, int status)
{
    if (cl->dead)
        return;
    struct p2p_host *h = cl->h;
    cl->dead = 1;
    if (h->rclient == cl)
        h->rclient = NULL;
    if (!h->closing)
        cl->cb(cl->arg, status ? status : CM_ECLOSED, NULL);
}

static void wait_next(struct p2p_relay_client *cl);

struct accept_req {
    struct p2p_relay_client *cl;
    struct p2p_conn *c;
};

static void accept_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                        size_t len)
{
    struct accept_req *a = arg;
    struct p2p_relay_client *cl = a->cl;
    struct p2p_conn *c = a->c; /* alive: a request finishes before its connection is freed */
    (void)from, (void)body, (void)len;
    free(a);
    if (status == CM_OK && c->state == C_OPEN) {
        /* from now on the dialer's: served as an inbound connection */
        c->relay = P2P_RL_CIRCUIT;
        c->outgoing = 0;
        c->h->n_inbound++;
        c->h->relay_accepted++;
    } else {
        cl->h->relay_accept_failed++;
        if (c->state == C_OPEN)
            p2p__conn_close(c, CM_ECLOSED);
    }
    client_unref(cl);
}

static void accept_circuit(struct p2p_relay_client *cl, uint64_t id)
{
    struct p2p_host *h = cl->h;
    int rc = CM_OK;
    uint8_t *body = NULL;
    size_t blen = 0;
    struct accept_req *a = malloc(sizeof *a);
    struct p2p_conn *c = a ? p2p__conn_new(h, (struct sockaddr *)&cl->relay, &rc) : NULL;
    if (!c || p2p_relay_accept_encode(id, &body, &blen)) {
        free(a);
        if (c)
            p2p__conn_close(c, CM_ENOMEM);
        cl->h->relay_accept_failed++;
        return;
    }
    c->relay = P2P_RL_ACCEPTING; /* never picked for our own requests */
    a->cl = cl;
    a->c = c;
    cl->refs++;
    rc = p2p__request_on_conn(h, c, (struct sockaddr *)&cl->relay, cl->relay_pub,
                              P2P_MSG_RELAY_ACCEPT, body, blen, cl->timeout_ms, accept_done, a);
    free(body);
    if (rc) {
        free(a);
        cl->h->relay_accept_failed++;
        client_unref(cl);
        if (c->state != C_CLOSING)
            p2p__conn_close(c, CM_ECLOSED);
    }
}

static void wait_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                      size_t len)
{
    struct p2p_relay_client *cl = arg;
    (void)from;
    uint64_t ids[P2P_RELAY_MAX_ANNOUNCE];
    size_t n = 0;
    if (!cl->dead) {
        if (status == CM_OK && p2p_relay_circuits_parse(body, len, ids, &n) == CM_OK) {
            for (size_t i = 0; i < n && !cl->h->closing; i++)
                accept_circuit(cl, ids[i]);
            wait_next(cl);
        } else {
            client_lost(cl, status ? status : CM_EPROTO);
        }
    }
    client_unref(cl);
}

static void wait_next(struct p2p_relay_client *cl)
{
    if (cl->dead || cl->h->closing)
        return;
    uint8_t *body;
    size_t blen;
    if (p2p_relay_port_encode(cl->port, &body, &blen)) {
        client_lost(cl, CM_ENOMEM);
        return;
    }
    cl->refs++;
    /* the relay answers within its wait_ms (15 s by default) */
    int rc = p2p_request(cl->h, (struct sockaddr *)&cl->relay, cl->relay_pub, P2P_MSG_RELAY_WAIT,
                         body, blen, 30000 + cl->timeout_ms, wait_done, cl);
    free(body);
    if (rc) {
        client_lost(cl, rc);
        client_unref(cl);
    }
}

static void reserve_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                         size_t len)
{
    struct p2p_relay_client *cl = arg;
    (void)from;
    uint16_t port = 0;
    if (!cl->dead) {
        if (status == CM_OK && p2p_relay_port_parse(body, len, &port) == CM_OK) {
            cl->port = port;
            cl->reserved = 1;
            struct sockaddr_storage adv = cl->relay;
            p2p__addr_set_port(&adv, port);
            wait_next(cl);
            if (!cl->dead && !cl->h->closing)
                cl->cb(cl->arg, CM_OK, (struct sockaddr *)&adv);
        } else {
            client_lost(cl, status ? status : CM_EPROTO);
        }
    }
    client_unref(cl);
}

int p2p_host_relay_use(struct p2p_host *h, const struct sockaddr *relay,
                       const uint8_t relay_pub[32], uint32_t timeout_ms, p2p_relay_cb cb,
                       void *arg)
{
    if (!h || !relay || !relay_pub || !cb || h->closing ||
        (relay->sa_family != AF_INET && relay->sa_family != AF_INET6))
        return CM_EINVAL;
    if (h->rclient)
        return CM_ESTATE;
    struct p2p_relay_client *cl = calloc(1, sizeof *cl);
    if (!cl)
        return CM_ENOMEM;
    cl->h = h;
    memcpy(&cl->relay, relay, p2p__addr_len(relay));
    memcpy(cl->relay_pub, relay_pub, 32);
    cl->timeout_ms = timeout_ms ? timeout_ms : 5000;
    cl->cb = cb;
    cl->arg = arg;
    cl->refs = 1;
    int rc = p2p_request(h, relay, relay_pub, P2P_MSG_RELAY_RESERVE, NULL, 0, cl->timeout_ms,
                         reserve_done, cl);
    if (rc) {
        free(cl);
        return rc;
    }
    h->rclient = cl;
    return CM_OK;
}

void p2p_host_relay_drop(struct p2p_host *h)
{
    struct p2p_relay_client *cl = h ? h->rclient : NULL;
    if (!cl)
        return;
    h->rclient = NULL;
    cl->dead = 1;
    /* its requests still hold it (their callbacks see `dead`) */
    if (cl->refs == 0)
        free(cl);
}

int p2p_host_relay_active(const struct p2p_host *h)
{
    return h && h->rclient && h->rclient->reserved && !h->rclient->dead;
}

void p2p_host_relay_stats(const struct p2p_host *h, struct p2p_relay_stats *out)
{
    *out = g_none;
    if (h->relay) {
        *out = h->relay->st;
        out->live_reservations = h->relay->n_resv;
        out->live_circuits = h->relay->n_circ;
    }
    out->accepted = h->relay_accepted;
    out->accept_failed = h->relay_accept_failed;
}

void p2p__relay_host_close(struct p2p_host *h)
{
    p2p__punch_host_close(h);
    p2p_host_relay_drop(h);
    struct p2p_relay *r = h->relay;
    if (!r)
        return;
    r->closing = 1;
    while (r->resv)
        resv_drop(r->resv);
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, relay_timer_closed);
    h->relay = NULL;
}
