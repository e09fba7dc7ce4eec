/* Hole punching (p2p_relay.h; docs/protocol.md "Hole punching"; seed
 * 000_02cc6b5d62a616fc.txt section 3.3, technique 1, and Appendix E): a TCP
 * simultaneous open between two peers behind NAT, coordinated through a
 * path both already have (the responder's relay circuit).
 *
 * The initiator binds a socket to an ephemeral port Lx and sends PUNCH
 * {its public address, Lx} to the responder (through the relay). The
 * responder binds Ly, starts connecting from Ly to the initiator's public
 * address and port Lx, and answers {its public address, Ly}; the initiator
 * then connects from Lx to that. Behind port-preserving ("cone-like") NATs
 * each side's connection leaves from the port it announced, so each
 * router lets the other's SYN in once its own went out: the connection
 * opens directly. Both sides try again from the same port every 50 ms
 * until the deadline (a router that answers an early SYN with a reset
 * ends that try). Behind a NAT that picks a random port per connection
 * ("symmetric") the announced port is not where the connection leaves
 * from, the punch times out, and the caller keeps the relay.
 *
 * Two peers behind the same router (the same public address) cannot meet
 * through it unless it hairpins, which home routers rarely do; they meet on
 * the router's own network instead. The offer carries the sender's address
 * there (local_ip); the responder listens at its own for the initiator's
 * connection, from the offered address only, and answers where. */
#include "p2p/p2p_relay.h"
#include "p2p/p2p_msg.h"
#include "p2p/p2p_internal.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

#define PUNCH_TICK_MS 50
#define PUNCH_RESPONDER_MS 5000

struct p2p_punch {
    struct p2p_punch *next;
    struct p2p_host *h;
    struct p2p_conn *c;         /* the try in progress */
    uv_timer_t timer;
    int initiator, finished, have_peer;
    unsigned refs;              /* the timer's handle and the offer request */
    uint16_t port;              /* ours */
    struct sockaddr_storage peer_ep; /* where to connect to (the peer's public address, its port) */
    struct sockaddr_storage target;  /* initiator: the address the peer is announced at */
    uv_tcp_t *lst;                   /* responder on the same network: listening */
    struct sockaddr_storage allow;   /* ... for a connection from this address */
    uint8_t pub[CM_ED25519_PUB_LEN];
    int64_t deadline_ms, t0_ms;
    p2p_punch_cb cb;
    void *arg;
};

static int set_ip(struct sockaddr_storage *dst, int *has, const struct sockaddr *ip)
{
    if (!ip || (ip->sa_family != AF_INET && ip->sa_family != AF_INET6))
        return CM_EINVAL;
    memcpy(dst, ip, p2p__addr_len(ip));
    *has = 1;
    return CM_OK;
}

int p2p_host_set_public_ip(struct p2p_host *h, const struct sockaddr *ip)
{
    return h ? set_ip(&h->public_ip, &h->has_public_ip, ip) : CM_EINVAL;
}

int p2p_host_set_local_ip(struct p2p_host *h, const struct sockaddr *ip)
{
    return h ? set_ip(&h->local_ip, &h->has_local_ip, ip) : CM_EINVAL;
}

static void punch_unref(struct p2p_punch *p)
{
    if (--p->refs == 0)
        free(p);
}

static void timer_closed(uv_handle_t *hd)
{
    struct p2p_punch *p = hd->data;
    struct p2p_host *h = p->h;
    punch_unref(p);
    p2p__host_handle_closed(h);
}

static void listener_closed(uv_handle_t *hd)
{
    struct p2p_punch *p = hd->data;
    struct p2p_host *h = p->h;
    free(hd);
    punch_unref(p);
    p2p__host_handle_closed(h);
}

/* Ends the punch once: the try in progress (not connected) closes, the
 * initiator's callback runs. */
static void punch_finish(struct p2p_punch *p, int status, const struct sockaddr *direct)
{
    if (p->finished)
        return;
    p->finished = 1;
    struct p2p_host *h = p->h;
    for (struct p2p_punch **pp = &h->punches; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (p->c) {
        struct p2p_conn *c = p->c;
        p->c = NULL;
        c->punch = NULL;
        if (status != CM_OK)
            p2p__conn_close(c, CM_ECLOSED);
    }
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, timer_closed);
    if (p->lst) {
        uv_close((uv_handle_t *)p->lst, listener_closed);
        p->lst = NULL;
    }
    if (p->initiator && p->cb && !h->closing)
        p->cb(p->arg, status, direct, p2p_now_ms() - p->t0_ms);
}

static void try_connect(struct p2p_punch *p);

static void on_connected(uv_connect_t *req, int status)
{
    struct p2p_conn *c = req->data;
    struct p2p_punch *p = c->punch;
    if (c->state == C_CLOSING || !p)
        return;
    if (status < 0) { /* this try failed (a reset, unreachable): the tick tries again */
        p->c = NULL;
        c->punch = NULL;
        p2p__conn_close(c, CM_ECONN);
        return;
    }
    c->state = C_OPEN;
    c->connected = 1;
    c->punched = 1;
    memcpy(c->punch_pub, p->pub, CM_ED25519_PUB_LEN);
    uv_tcp_nodelay(&c->tcp, 1);
    c->punch = NULL;
    p->c = NULL;
    struct sockaddr_storage direct = c->remote;
    if (p->initiator) {
        /* an ordinary outgoing connection from now on, found by the
           address the peer is announced at (ahead of the relayed one):
           requests to it go this way; when it dies, the transport's resend
           opens the relayed path again */
        c->relay = P2P_RL_NONE;
        c->remote = p->target;
        struct p2p_host *h = c->h;
        if (h->conns != c) {
            if (c->hprev)
                c->hprev->hnext = c->hnext;
            if (c->hnext)
                c->hnext->hprev = c->hprev;
            c->hprev = NULL;
            c->hnext = h->conns;
            h->conns->hprev = c;
            h->conns = c;
        }
    } else {
        c->relay = P2P_RL_CIRCUIT; /* served like an accepted connection */
    }
    p2p__read_start(c);
    punch_finish(p, CM_OK, (struct sockaddr *)&direct);
}

/* One try: a fresh socket bound to our announced port, connecting to the
 * peer's. */
static int bind_conn(struct p2p_punch *p, struct p2p_conn **out)
{
    struct p2p_host *h = p->h;
    struct p2p_ctx *ctx = h->ctx;
    struct p2p_conn *c = p2p__conn_alloc(h, p->initiator);
    if (!c)
        return CM_ENOMEM;
    c->relay = p->initiator ? P2P_RL_PUNCHING : P2P_RL_PUNCH_IN;
    c->state = C_CONNECTING;
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    a.ss_family = h->public_ip.ss_family;
    p2p__addr_set_port(&a, p->port);
    int e = uv_tcp_bind(&c->tcp, (struct sockaddr *)&a, 0);
    if (e) {
        c->state = C_OPEN;
        p2p__conn_close(c, CM_EIO);
        return CM_EIO;
    }
    c->has_fd = 1;
    ctx->fds++;
    if (!p->port) {
        struct sockaddr_storage b;
        int blen = sizeof b;
        uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&b, &blen);
        p->port = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port
                                               : ((struct sockaddr_in6 *)&b)->sin6_port);
    }
    c->punch = p;
    p->c = c;
    *out = c;
    return CM_OK;
}

static void try_connect(struct p2p_punch *p)
{
    struct p2p_conn *c = p->c;
    if (!c && bind_conn(p, &c) != CM_OK)
        return; /* the tick tries again */
    c->remote = p->peer_ep;
    c->creq.data = c;
    c->h->ctx->st.conns_opened++;
    if (uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&p->peer_ep, on_connected)) {
        p->c = NULL;
        c->punch = NULL;
        c->state = C_OPEN;
        p2p__conn_close(c, CM_ECONN);
    }
}

static void tick(uv_timer_t *t)
{
    struct p2p_punch *p = t->data;
    if (p->finished)
        return;
    if (p2p_now_ms() >= p->deadline_ms) {
        punch_finish(p, CM_ETIMEOUT, NULL);
        return;
    }
    if (p->have_peer && !p->c)
        try_connect(p);
}

static struct p2p_punch *punch_new(struct p2p_host *h, int initiator, uint32_t timeout_ms)
{
    struct p2p_punch *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->h = h;
    p->initiator = initiator;
    p->refs = 1; /* the timer */
    p->t0_ms = p2p_now_ms();
    p->deadline_ms = p->t0_ms + timeout_ms;
    uv_timer_init(h->ctx->loop, &p->timer);
    p->timer.data = p;
    h->nhandles++;
    uv_timer_start(&p->timer, tick, PUNCH_TICK_MS, PUNCH_TICK_MS);
    p->next = h->punches;
    h->punches = p;
    return p;
}

static int endpoint(const uint8_t *ip, size_t iplen, uint16_t port, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    if (iplen == 4) {
        struct sockaddr_in *a = (struct sockaddr_in *)out;
        a->sin_family = AF_INET;
        memcpy(&a->sin_addr, ip, 4);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
        a->sin6_family = AF_INET6;
        memcpy(&a->sin6_addr, ip, 16);
    }
    p2p__addr_set_port(out, port);
    return CM_OK;
}

/* The address bytes of a, and their count (4 or 16). */
static size_t ip_bytes(const struct sockaddr_storage *a, uint8_t ip[16])
{
    if (a->ss_family == AF_INET) {
        memcpy(ip, &((const struct sockaddr_in *)a)->sin_addr, 4);
        return 4;
    }
    memcpy(ip, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
    return 16;
}

/* Somebody's address: not loopback, unspecified or multicast. */
static int ip_usable(const uint8_t *ip, size_t len)
{
    static const uint8_t v6_loop[16] = {[15] = 1}, v6_any[16] = {0};
    if (len == 4)
        return ip[0] != 127 && ip[0] != 0 && ip[0] < 224;
    return len == 16 && memcmp(ip, v6_loop, 16) && memcmp(ip, v6_any, 16) && ip[0] != 0xff;
}

static int same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    uint8_t x[16], y[16];
    size_t n = ip_bytes(a, x);
    return a->ss_family == b->ss_family && ip_bytes(b, y) == n && !memcmp(x, y, n);
}

/* The responder on the initiator's network: the one connection it waits
 * for, from the initiator's offered address (anyone else's is closed). */
static void on_lan_conn(uv_stream_t *srv, int status)
{
    struct p2p_punch *p = srv->data;
    struct p2p_host *h = p->h;
    if (status < 0 || p->finished || h->closing)
        return;
    struct p2p_conn *c = p2p__conn_accept(h, srv);
    if (!c)
        return;
    if (!same_ip(&c->remote, &p->allow)) {
        p2p__conn_close(c, CM_EPERM);
        return;
    }
    c->punched = 1;
    memcpy(c->punch_pub, p->pub, CM_ED25519_PUB_LEN);
    c->relay = P2P_RL_CIRCUIT; /* served like an accepted connection */
    uv_tcp_nodelay(&c->tcp, 1);
    p2p__read_start(c);
    punch_finish(p, CM_OK, (struct sockaddr *)&c->remote);
}

/* Listens at our address on our network, on a fresh port (p->port). */
static int lan_listen(struct p2p_punch *p)
{
    struct p2p_host *h = p->h;
    uv_tcp_t *t = calloc(1, sizeof *t);
    if (!t)
        return CM_ENOMEM;
    uv_tcp_init(h->ctx->loop, t);
    t->data = p;
    h->nhandles++;
    p->refs++; /* listener_closed */
    p->lst = t;
    struct sockaddr_storage a = h->local_ip;
    p2p__addr_set_port(&a, 0);
    struct sockaddr_storage b;
    int blen = sizeof b;
    if (uv_tcp_bind(t, (struct sockaddr *)&a, 0) || uv_listen((uv_stream_t *)t, 4, on_lan_conn) ||
        uv_tcp_getsockname(t, (struct sockaddr *)&b, &blen))
        return CM_EIO; /* the caller's punch_finish closes it */
    p->port = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port
                                           : ((struct sockaddr_in6 *)&b)->sin6_port);
    return CM_OK;
}

/* The responder: start connecting to the initiator (or, behind our own
 * router, listen for it on our network), answer with where. */
int p2p__punch_serve(struct p2p_conn *c, const struct p2p_peer *from, const uint8_t *body, size_t len,
                     uint8_t **resp, size_t *rlen)
{
    struct p2p_host *h = c->h;
    struct p2p_punch_offer in;
    if (!h->has_public_ip)
        return CM_EUNSUPPORTED;
    if (p2p_punch_parse(body, len, &in))
        return CM_EPARSE;
    if ((in.iplen == 4) != (h->public_ip.ss_family == AF_INET))
        return CM_EUNSUPPORTED;
    /* nobody's public address: loopback, unspecified, multicast */
    if (!ip_usable(in.ip, in.iplen))
        return CM_EPARSE;
    /* the requester is behind our own router: a punch would need the
       router to hairpin; we meet on its network when both of us know our
       address there (else the relay stays; the initiator gives up on our
       answer's address too) */
    uint8_t own[16];
    size_t ownlen = ip_bytes(&h->public_ip, own);
    int lan = ownlen == in.iplen && !memcmp(own, in.ip, in.iplen);
    if (lan && (!in.local_iplen || !h->has_local_ip || !ip_usable(in.local_ip, in.local_iplen) ||
                (in.local_iplen == 4) != (h->local_ip.ss_family == AF_INET)))
        return CM_ECONN;
    /* A punch makes us send SYNs, for a few seconds, to an address the
       requester names (or wait for a connection from one): it cannot be
       checked (the request comes through a relay), so a run member could
       point them anywhere. Bounded: 4 at once per requester, 16 in all. */
    size_t mine = 0, all = 0;
    for (struct p2p_punch *q = h->punches; q; q = q->next) {
        mine += !q->initiator && !memcmp(q->pub, from->pub, CM_ED25519_PUB_LEN);
        all += !q->initiator;
    }
    if (mine >= 4 || all >= 16)
        return CM_EBUSY;
    struct p2p_punch *p = punch_new(h, 0, PUNCH_RESPONDER_MS);
    if (!p)
        return CM_ENOMEM;
    memcpy(p->pub, from->pub, CM_ED25519_PUB_LEN);
    struct p2p_punch_offer ans;
    memset(&ans, 0, sizeof ans);
    ans.iplen = ip_bytes(&h->public_ip, ans.ip);
    int rc;
    if (lan) {
        endpoint(in.local_ip, in.local_iplen, 0, &p->allow);
        rc = lan_listen(p);
        ans.local_iplen = ip_bytes(&h->local_ip, ans.local_ip);
    } else {
        endpoint(in.ip, in.iplen, in.port, &p->peer_ep);
        struct p2p_conn *pc;
        rc = bind_conn(p, &pc);
    }
    ans.port = p->port;
    if (rc == CM_OK)
        rc = p2p_punch_encode(&ans, resp, rlen);
    if (rc != CM_OK) {
        punch_finish(p, rc, NULL);
        return rc;
    }
    if (!lan) {
        p->have_peer = 1;
        try_connect(p);
    }
    return CM_OK;
}

static void offer_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body, size_t len)
{
    struct p2p_punch *p = arg;
    (void)from;
    struct p2p_punch_offer ans;
    if (!p->finished) {
        uint8_t me[16];
        size_t melen = 0;
        if (status == CM_OK && p2p_punch_parse(body, len, &ans) == CM_OK && ip_usable(ans.ip, ans.iplen))
            melen = ip_bytes(&p->h->public_ip, me);
        if (melen && melen == ans.iplen && !memcmp(me, ans.ip, ans.iplen)) {
            /* behind our own router: the connection would have to turn
               back at it (hairpinning), which home routers rarely do. When
               the peer listens on the router's network, connect there;
               else the relay stays, without 3 s of SYNs first */
            if (ans.local_iplen && ip_usable(ans.local_ip, ans.local_iplen) && p->h->has_local_ip) {
                endpoint(ans.local_ip, ans.local_iplen, ans.port, &p->peer_ep);
                p->have_peer = 1;
                try_connect(p);
            } else {
                punch_finish(p, CM_ECONN, NULL);
            }
        } else if (melen) {
            endpoint(ans.ip, ans.iplen, ans.port, &p->peer_ep);
            p->have_peer = 1;
            try_connect(p);
        } else {
            punch_finish(p, status ? status : CM_EPROTO, NULL);
        }
    }
    punch_unref(p);
}

int p2p_host_punch(struct p2p_host *h, const struct sockaddr *target, const uint8_t pub[CM_ED25519_PUB_LEN],
                   uint32_t timeout_ms, p2p_punch_cb cb, void *arg)
{
    if (!h || !target || !pub || !cb || h->closing || !h->has_public_ip ||
        (target->sa_family != AF_INET && target->sa_family != AF_INET6))
        return CM_EINVAL;
    struct p2p_punch *p = punch_new(h, 1, timeout_ms ? timeout_ms : 3000);
    if (!p)
        return CM_ENOMEM;
    memcpy(&p->target, target, p2p__addr_len(target));
    memcpy(p->pub, pub, CM_ED25519_PUB_LEN);
    p->cb = cb;
    p->arg = arg;
    struct p2p_conn *c;
    uint8_t *body = NULL;
    size_t blen = 0;
    struct p2p_punch_offer offer;
    memset(&offer, 0, sizeof offer);
    offer.iplen = ip_bytes(&h->public_ip, offer.ip);
    if (h->has_local_ip && (h->local_ip.ss_family == AF_INET) == (offer.iplen == 4))
        offer.local_iplen = ip_bytes(&h->local_ip, offer.local_ip);
    int rc = bind_conn(p, &c);
    offer.port = p->port;
    if (rc == CM_OK)
        rc = p2p_punch_encode(&offer, &body, &blen);
    if (rc == CM_OK) {
        p->refs++;
        rc = p2p_request(h, target, pub, P2P_MSG_PUNCH, body, blen, timeout_ms ? timeout_ms : 3000,
                         offer_done, p);
        if (rc)
            p->refs--;
    }
    free(body);
    if (rc) {
        p->cb = NULL;
        punch_finish(p, rc, NULL);
        return rc;
    }
    return CM_OK;
}

void p2p__punch_conn_closed(struct p2p_conn *c)
{
    struct p2p_punch *p = c->punch;
    c->punch = NULL;
    if (p && p->c == c)
        p->c = NULL; /* the tick tries again, or the deadline ends it */
}

void p2p__punch_host_close(struct p2p_host *h)
{
    while (h->punches)
        punch_finish(h->punches, CM_ECLOSED, NULL);
}

size_t p2p_host_punched(const struct p2p_host *h)
{
    size_t n = 0;
    for (const struct p2p_conn *c = h ? h->conns : NULL; c; c = c->hnext) {
        if (!c->punched || c->state != C_OPEN)
            continue;
        /* peers, not connections: both sides of a pair may have punched */
        const struct p2p_conn *d = h->conns;
        while (d != c && !(d->punched && d->state == C_OPEN && !memcmp(d->punch_pub, c->punch_pub, CM_ED25519_PUB_LEN)))
            d = d->hnext;
        n += d == c;
    }
    return n;
}

int p2p_host_punched_to(const struct p2p_host *h, const struct sockaddr *target)
{
    for (const struct p2p_conn *c = h ? h->conns : NULL; c; c = c->hnext)
        if (c->punched && c->outgoing && c->state == C_OPEN && p2p__addr_equal(&c->remote, target))
            return 1;
    return 0;
}
