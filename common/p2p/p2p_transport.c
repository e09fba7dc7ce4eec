/* Non-blocking TCP transport for signed peer messages on libuv (see
 * p2p_transport.h). Framing and envelope decoding are pure functions in
 * p2p_frame.c / p2p_envelope.c; the transport itself is three files sharing
 * p2p_internal.h. This one holds the lifecycle: the context (its timers,
 * budgets and stats), the sweep of idle connections and slow frames, and the
 * hosts (listening, accepting). Connections, their queues and the bandwidth
 * caps are in p2p_conn.c; requests, responses and deferred replies in
 * p2p_request.c. Authentication follows seed 000_02cc6b5d62a616fc.txt,
 * Appendix H.4. */
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

uint64_t p2p__now_ns(void)
{
    return uv_hrtime();
}

int64_t p2p_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t p2p__mono_ms(void)
{
    return (int64_t)(uv_hrtime() / 1000000);
}

/* ---- ctx --------------------------------------------------------------- */

static void sweep_cb(uv_timer_t *t);

int p2p_ctx_new(const struct p2p_ctx_config *cfg, struct p2p_ctx **out)
{
    if (!cfg->loop || cfg->n_latency_rules > P2P_MAX_LATENCY_RULES ||
        (cfg->n_latency_rules && !cfg->latency_rules))
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
    p2p_rate_init(&c->up, cfg->max_upload_mbps, p2p__now_ns());
    p2p_rate_init(&c->down, cfg->max_download_mbps, p2p__now_ns());
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
    if (cfg->n_latency_rules)
        memcpy(c->lat_rules, cfg->latency_rules, cfg->n_latency_rules * sizeof *c->lat_rules);
    c->n_lat_rules = cfg->n_latency_rules;
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

void p2p__ctx_release(struct p2p_ctx *c)
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
    p2p__ctx_release(c);
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
    p2p_rate_init(&ctx->up, up_mbps, p2p__now_ns());
    p2p_rate_init(&ctx->down, down_mbps, p2p__now_ns());
}

void p2p_ctx_set_pacing(struct p2p_ctx *ctx, double up_mbps, double down_mbps)
{
    p2p_rate_init_burst(&ctx->up, up_mbps, P2P_PACE_BURST_S, p2p__now_ns());
    p2p_rate_init_burst(&ctx->down, down_mbps, P2P_PACE_BURST_S, p2p__now_ns());
}

void p2p_ctx_set_latency(struct p2p_ctx *ctx, uint32_t latency_ms)
{
    ctx->latency_ms = latency_ms;
}

/* ---- sweeping: idle connections and slow frames ------------------------ */

static void sweep_cb(uv_timer_t *t)
{
    struct p2p_ctx *ctx = t->data;
    int64_t now = p2p__mono_ms();
    /* Connections waiting for a descriptor get one idle connection closed
     * each, wherever it sits in the LRU list (p2p__evict_one looks only at the
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
            p2p__conn_drop(c, P2P_REJ_MALFORMED, "frame not completed in time");
        } else if (c->close_flushed && now - c->last_active_ms > 10000) {
            p2p__conn_close(c, CM_ETIMEOUT); /* its reader stopped reading */
        } else if (c->relay == P2P_RL_RAW && c->wq_bytes > 0 && now - c->progress_ms > 30000) {
            /* a circuit side whose reader stopped reading: what it holds
               is freed (both sides close) */
            p2p__conn_close(c, CM_ETIMEOUT);
        } else if (idle && now - c->last_active_ms > (int64_t)ctx->idle_ms) {
            p2p__conn_close(c, CM_ECLOSED);
        } else if (idle && waiting) {
            waiting--;
            ctx->st.conns_evicted++;
            p2p__conn_close(c, CM_ECLOSED);
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
    struct p2p_conn *c = p2p__conn_accept(h, srv);
    if (!c)
        return;
    /* A flood of connections: over the host's inbound cap, or over the
     * process budget with nothing idle to evict, the newcomer is closed. */
    if (h->n_inbound > h->max_inbound) {
        /* Over the host's inbound cap: the least recently active idle
         * inbound connection makes room (a flood of idle connections cannot
         * lock honest peers out); with none idle, the newcomer is refused. */
        struct p2p_conn *old = NULL;
        for (struct p2p_conn *x = h->conns; x; x = x->hnext)
            if (x != c && !x->outgoing && !x->relay && !x->relay_uncounted && x->state == C_OPEN &&
                x->wq_bytes == 0 && x->rx_len == 0 && x->n_deferred == 0 &&
                (!old || x->last_active_ms < old->last_active_ms))
                old = x;
        if (!old) {
            ctx->st.conns_refused++;
            p2p__conn_close(c, CM_EBUSY);
            return;
        }
        ctx->st.conns_evicted++;
        p2p__conn_close(old, CM_ECLOSED);
    }
    if (ctx->fds > ctx->max_conns && p2p__evict_one(ctx)) {
        ctx->st.conns_refused++;
        p2p__conn_close(c, CM_EBUSY);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    p2p__read_start(c);
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
    p2p__host_handle_closed(hd->data);
}

void p2p_host_close(struct p2p_host *h)
{
    if (!h || h->closing)
        return;
    h->closing = 1;
    h->ctx->nhosts--;
    while (h->conns) {
        h->conns->graceful = 1;
        p2p__conn_close(h->conns, CM_ECLOSED);
    }
    p2p__relay_host_close(h);
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
