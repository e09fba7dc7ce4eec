/* See ct_argrp.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/ct_argrp.h"
#include "cm_err.h"

int argrp_in_place;

uint64_t argrp_rng = 0x9e3779b97f4a7c15ull;
double argrp_urand(void)
{
    argrp_rng ^= argrp_rng << 13;
    argrp_rng ^= argrp_rng >> 7;
    argrp_rng ^= argrp_rng << 17;
    return (double)(argrp_rng >> 11) / 9007199254740992.0;
}

void argrp_on_done(void *arg, const struct ar_result *r)
{
    struct argrp_peer *p = arg;
    assert_false(p->done); /* exactly once */
    p->done = 1;
    p->res = *r;
    assert_true(r->n_parts <= AR_MAX_MEMBERS && r->n_excluded <= 256);
    memcpy(p->parts, r->parts, r->n_parts * sizeof *r->parts);
    memcpy(p->excl, r->excluded, r->n_excluded * sizeof *r->excluded);
    p->res.parts = p->parts;
    p->res.excluded = p->excl;
}

/* A group of m peers. listen[i] = 0: client mode. up_mbps[i] > 0 caps that
 * peer's upload (and download) to slow it down. */
void argrp_init(struct argrp *g, size_t m, size_t n, const double *frac, const int *sends,
                     const int *listen, const double *mbps)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(uv_loop_init(&g->loop), 0);
    assert_int_equal(p2p_tk_init(&g->tk, "arrun"), 0);
    g->m = m;
    g->n = n;
    for (size_t i = 0; i < m; i++) {
        struct argrp_peer *p = &g->p[i];
        char user[32], pid[24];
        snprintf(user, sizeof user, "peer%zu", i);
        snprintf(pid, sizeof pid, "%zu", i + 1);
        assert_int_equal(p2p_tk_peer_new(&g->tk, user, pid, 3600, &p->id), 0);
        struct p2p_ctx_config cc = {.loop = &g->loop, .auth = p2p_tk_auth_config(&g->tk)};
        if (mbps && mbps[i] > 0)
            cc.max_upload_mbps = cc.max_download_mbps = mbps[i];
        assert_int_equal(p2p_ctx_new(&cc, &p->ctx), 0);
        struct ar_engine_config ec = {.ctx = p->ctx, .key = &p->id.key, .token = p->id.token,
                                      .listen_ip = listen[i] ? "127.0.0.1" : NULL};
        assert_int_equal(ar_engine_new(&ec, &p->eng), 0);
        p->alive = 1;
        struct ar_member *mb = &g->mem[i];
        memcpy(mb->pub, p->id.key.pub, 32);
        mb->fraction = frac[i];
        mb->sends = sends[i];
        if (listen[i]) {
            char a[64];
            snprintf(a, sizeof a, "127.0.0.1:%u", ar_engine_port(p->eng));
            assert_int_equal(p2p_addr_parse(a, &mb->addr), 0);
        }
        g->w[i] = sends[i] == AR_SENDS_FULL ? (double)(1 + (int)(argrp_urand() * 100)) : 0;
        if (sends[i]) {
            p->buf = malloc(n * sizeof(float));
            p->orig = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++)
                p->buf[j] = (float)((argrp_urand() * 2 - 1) * (1 + i));
            memcpy(p->orig, p->buf, n * sizeof(float));
        }
    }
    g->base = (struct ar_round_config){.step = 42, .group_id = (const uint8_t *)"grp-a",
                                       .group_id_len = 5, .members = g->mem, .n_members = m,
                                       .n = n, .comp = AR_COMP_NONE, .chunk_elems = 1024,
                                       .deadline_ms = 20000, .stall_ms = 1500, .linger_ms = 3000,
                                       .in_place = argrp_in_place, .done = argrp_on_done};
}

void argrp_kill(struct argrp *g, size_t i)
{
    struct argrp_peer *p = &g->p[i];
    if (!p->alive)
        return;
    ar_engine_free(p->eng); /* its host closes: it has disappeared */
    p->eng = NULL;
    p->alive = 0;
}

void argrp_cleanup(struct argrp *g)
{
    for (size_t i = 0; i < g->m; i++)
        argrp_kill(g, i);
    for (size_t i = 0; i < g->m; i++)
        p2p_ctx_free(g->p[i].ctx);
    uv_run(&g->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&g->loop), 0);
    for (size_t i = 0; i < g->m; i++) {
        p2p_tk_peer_cleanup(&g->p[i].id);
        free(g->p[i].buf);
        free(g->p[i].orig);
    }
    p2p_tk_cleanup(&g->tk);
}

int argrp_start(struct argrp *g, size_t i)
{
    struct ar_round_config c = g->base;
    c.my_index = i;
    c.buf = g->p[i].buf;
    c.weight = g->w[i];
    c.arg = &g->p[i];
    g->p[i].started = 1;
    return ar_round_start(g->p[i].eng, &c, &g->p[i].round);
}

static void argrp_keepalive(uv_timer_t *t)
{
    (void)t;
}

/* Starts peer i at start_ms[i] (negative: never), kills peer kill_i at
 * kill_ms, and runs until every live started peer is done. */
void argrp_run(struct argrp *g, const int *start_ms, int kill_i, int kill_ms, int limit_ms)
{
    uv_timer_t ka;
    uv_timer_init(&g->loop, &ka);
    uv_timer_start(&ka, argrp_keepalive, 1, 1);
    int64_t t0 = p2p_now_ms();
    for (;;) {
        int64_t el = p2p_now_ms() - t0;
        int pending = 0;
        for (size_t i = 0; i < g->m; i++) {
            struct argrp_peer *p = &g->p[i];
            int at = start_ms ? start_ms[i] : 0;
            if (p->alive && !p->started && at >= 0 && el >= at)
                assert_int_equal(argrp_start(g, i), 0);
            if (p->alive && (!p->started ? at >= 0 : !p->done))
                pending = 1;
        }
        if (kill_i >= 0 && el >= kill_ms && g->p[kill_i].alive) {
            argrp_kill(g, (size_t)kill_i);
            continue;
        }
        if (!pending && (kill_i < 0 || !g->p[kill_i].alive))
            break;
        assert_true(el < limit_ms);
        uv_run(&g->loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&ka);
    uv_close((uv_handle_t *)&ka, NULL);
    uv_run(&g->loop, UV_RUN_NOWAIT);
}

/* Weighted mean at element j over the senders in mask. */
double argrp_mean_at(const struct argrp *g, uint64_t mask, size_t j, double *wsum)
{
    double s = 0, w = 0;
    for (size_t i = 0; i < g->m; i++)
        if ((mask >> i) & 1) {
            s += g->w[i] * (double)g->p[i].orig[j];
            w += g->w[i];
        }
    if (wsum)
        *wsum = w;
    return s / w;
}

uint64_t argrp_senders(const struct argrp *g)
{
    uint64_t m = 0;
    for (size_t i = 0; i < g->m; i++)
        if (g->mem[i].sends == AR_SENDS_FULL)
            m |= 1ull << i;
    return m;
}

int argrp_close_to(double got, double want, double tol_rel)
{
    return fabs(got - want) <= tol_rel * fabs(want) + 1e-30;
}

/* Every live sender ends with the same bytes in the averaged parts. */
void argrp_assert_identical(const struct argrp *g, const struct argrp_peer *ref)
{
    for (size_t i = 0; i < g->m; i++) {
        const struct argrp_peer *p = &g->p[i];
        if (!p->alive || !p->buf || p == ref)
            continue;
        for (size_t k = 0; k < ref->res.n_parts; k++)
            if (ref->parts[k].averaged && p->parts[k].averaged)
                assert_memory_equal(p->buf + ref->parts[k].offset,
                                    ref->buf + ref->parts[k].offset,
                                    ref->parts[k].len * sizeof(float));
    }
}

void argrp_check_exact(struct argrp *g, uint64_t mask)
{
    double W = 0;
    argrp_mean_at(g, mask, 0, &W);
    for (size_t i = 0; i < g->m; i++) {
        struct argrp_peer *p = &g->p[i];
        if (!p->alive || !p->started)
            continue;
        assert_true(p->done);
        if (!p->buf)
            continue;
        assert_int_equal(p->res.status, 0);
        assert_int_equal(p->res.n_averaged, p->res.n_parts);
        for (size_t k = 0; k < p->res.n_parts; k++) {
            assert_true(p->parts[k].averaged);
            if (p->parts[k].len)
                assert_true(fabs(p->parts[k].weight - W) < 1e-9 * W);
        }
        for (size_t j = 0; j < g->n; j++)
            if (!argrp_close_to(p->buf[j], argrp_mean_at(g, mask, j, NULL), 3e-7))
                fail_msg("peer %zu elem %zu: got %.9g want %.9g", i, j, p->buf[j],
                         argrp_mean_at(g, mask, j, NULL));
        argrp_assert_identical(g, p);
    }
}
