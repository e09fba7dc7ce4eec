/* The transport's messages (see p2p_transport.c for the whole): sending
 * envelopes and session frames on a connection, serving requests (the
 * built-in types, the HELLO handshake), deferred replies (p2p_reply_defer /
 * p2p_reply_finish), dispatching received requests and responses, and the
 * requester's side: pending requests with their deadlines and retries,
 * starting a session, p2p_request. Authentication follows seed
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

/* A connection is upgraded to a session (p2p_session.h) once it has carried
 * this many requests or bytes of request bodies: bulk transfers get cheap
 * MACs, one-shot RPCs (most DHT traffic) do not pay for a handshake. */
#define SESSION_AFTER_REQUESTS 4
#define SESSION_AFTER_BYTES (256u * 1024u)


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
int p2p__send_envelope(struct p2p_conn *c, uint32_t kind, uint32_t type, uint64_t id,
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
        return p2p__conn_send_parts(c, parts, np);
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
    return p2p__conn_send(c, frame, flen);
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
        p2p__send_envelope(c, P2P_KIND_RESPONSE, m->type, m->id, cl->peer_public_key, nonce, status,
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
    if (m->type >= P2P_MSG_RELAY_RESERVE && m->type <= P2P_MSG_RELAY_ACCEPT) {
        status = p2p__relay_serve(c, &pe, m->type, m->body, m->blen, &rp.body, &rp.len);
    } else if (m->type == P2P_MSG_PUNCH) {
        status = p2p__punch_serve(c, &pe, m->body, m->blen, &rp.body, &rp.len);
    } else if (h->on_request_reply && m->type != P2P_MSG_PING && m->type != P2P_MSG_STREAM_CHUNK) {
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
        p2p__send_envelope(c, P2P_KIND_RESPONSE, m->type, m->id, cl->peer_public_key, nonce, status,
                           parts, rp.tail_len ? 2 : 1);
    free(rp.body);
    if (c->splice_next) { /* an accepted circuit: from now on, bytes */
        p2p__relay_splice(c);
        return;
    }
    /* Backpressure: a peer that asks faster than we can answer stops being
     * read until its responses drain. */
    if (c->state == C_OPEN && c->wq_bytes > ctx->max_queue && !c->bp_paused) {
        c->bp_paused = 1;
        ctx->st.backpressure_pauses++;
        p2p__read_stop(c);
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
        rc = p2p__send_envelope(c, P2P_KIND_RESPONSE, d->type, d->id, d->peer, d->nonce, status,
                                body, n);
        struct p2p_ctx *ctx = c->h->ctx;
        if (c->state == C_OPEN && c->wq_bytes > ctx->max_queue && !c->bp_paused) {
            c->bp_paused = 1;
            ctx->st.backpressure_pauses++;
            p2p__read_stop(c);
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
        p2p__conn_close(c, CM_EAUTH);
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
        p2p__conn_close(c, CM_EAUTH);
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
        p2p__pending_finish(p, CM_EAUTH, NULL, NULL, 0);
        ctx->st.drops++;
        p2p__conn_close(c, CM_EAUTH);
        return;
    }
    if (session_update(c, &cl)) /* fails p (the connection closed) */
        return;
    struct p2p_peer pe;
    fill_peer(c, env->listen_port, &cl, &pe);
    p2p__pending_finish(p, env->status, &pe, env->body, env->body_len);
}

static void handle_payload(struct p2p_conn *c, const uint8_t *p, size_t n)
{
    struct p2p_envelope env;
    if (p2p_envelope_parse(p, n, &env)) {
        p2p__conn_drop(c, P2P_REJ_MALFORMED, "undecodable envelope");
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
        p2p__conn_drop(c, P2P_REJ_MALFORMED, "session frame without a session");
        return;
    }
    if (p2p_session_parse(frame + P2P_FRAME_HDR_LEN, flen - P2P_FRAME_HDR_LEN, &sm)) {
        p2p__conn_drop(c, P2P_REJ_MALFORMED, "undecodable session frame");
        return;
    }
    if (p2p_mac_verify(&c->srx, frame, flen)) {
        p2p__conn_drop(c, P2P_REJ_SIGNATURE, "bad session tag");
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
            p2p__pending_finish(p, CM_EAUTH, NULL, NULL, 0);
        ctx->st.drops++;
        p2p__conn_close(c, CM_EAUTH);
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
    p2p__pending_finish(p, sm.status, &pe, sm.body, sm.body_len);
}

void p2p__handle_frame(struct p2p_conn *c, const uint8_t *frame, size_t plen)
{
    if (frame[3] & P2P_FRAME_F_SESSION)
        handle_session(c, frame, P2P_FRAME_HDR_LEN + plen);
    else
        handle_payload(c, frame + P2P_FRAME_HDR_LEN, plen);
}

/* ---- requests ---------------------------------------------------------- */


static void pending_timeout(uv_timer_t *t)
{
    struct pending *p = t->data;
    p->host->ctx->st.timeouts++;
    p2p__pending_finish(p, CM_ETIMEOUT, NULL, NULL, 0);
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
    int rc = p2p__send_envelope(c, P2P_KIND_REQUEST, type, p->id, peer_pub, p->nonce, 0, body, n);
    if (rc || c->state == C_CLOSING) { /* C_CLOSING: the write failed at once */
        free(p->body);
        free(p);
        return rc ? rc : CM_ECONN;
    }
    uv_timer_init(h->ctx->loop, &p->timer);
    p->timer.data = p;
    h->nhandles++;
    uv_timer_start(&p->timer, pending_timeout, timeout_ms, 0);
    p2p__pending_attach(p, c);
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
    struct p2p_conn *c = p2p__conn_get(h, addr, &rc);
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

int p2p__request_on_conn(struct p2p_host *h, struct p2p_conn *c, const struct sockaddr *addr,
                         const uint8_t *peer_pub, uint32_t type, const uint8_t *body, size_t len,
                         uint32_t timeout_ms, p2p_response_cb cb, void *arg)
{
    struct p2p_iov one = {body, len};
    return request_on(h, c, addr, peer_pub, type, &one, 1, timeout_ms, cb, arg, 0, 0, NULL);
}
