/* ct-serial: its deadlines and kills are timed */
/* Butterfly all-reduce over real loopback sockets: several averaging engines
 * in one process on one libuv loop, each with its own host and key, tokens
 * minted here from a throwaway coordinator key. Checks the exact weighted
 * mean for groups of 2..8 with uneven fractions, client-mode and
 * aggregate-only members, a sender and an aggregator killed mid-round, bad
 * senders (NaN, absurd norm, a lying length) excluded and reported, the
 * three wire compressions within their bounds, bit-identical results on all
 * members, and the answers for unknown, early and finished rounds
 * (seed 000_02cc6b5d62a616fc.txt, section 3.2 and Appendix C). */
/* ct-timeout: 180 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ar/ar.h"
#include "ar/ar_codec.h"
#include "ar/ar_msg.h"
#include "cm_err.h"
#include "p2p/p2p_relay.h"
#include "tests/harness/p2p_testkit.h"

#define MAXP 8

struct peer {
    struct p2p_tk_peer id;
    struct p2p_ctx *ctx;
    struct ar_engine *eng;
    struct ar_round *round;
    float *buf, *orig;
    int done, alive, started;
    struct ar_result res;
    struct ar_part_report parts[AR_MAX_MEMBERS];
    struct ar_exclusion excl[256];
};

struct grp {
    uv_loop_t loop;
    struct p2p_tk tk;
    size_t m, n;
    struct peer p[MAXP];
    struct ar_member mem[MAXP];
    double w[MAXP];
    struct ar_round_config base;
};

/* Rounds of the group write fetched averages straight into the buffer
 * (ar_round_config.in_place, what the agent uses) instead of staging parts. */
static int g_in_place;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void on_done(void *arg, const struct ar_result *r)
{
    struct peer *p = arg;
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
static void grp_init(struct grp *g, size_t m, size_t n, const double *frac, const int *sends,
                     const int *listen, const double *mbps)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(uv_loop_init(&g->loop), 0);
    assert_int_equal(p2p_tk_init(&g->tk, "arrun"), 0);
    g->m = m;
    g->n = n;
    for (size_t i = 0; i < m; i++) {
        struct peer *p = &g->p[i];
        char user[16], pid[16];
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
        g->w[i] = sends[i] == AR_SENDS_FULL ? (double)(1 + (int)(urand() * 100)) : 0;
        if (sends[i]) {
            p->buf = malloc(n * sizeof(float));
            p->orig = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++)
                p->buf[j] = (float)((urand() * 2 - 1) * (1 + i));
            memcpy(p->orig, p->buf, n * sizeof(float));
        }
    }
    g->base = (struct ar_round_config){.step = 42, .group_id = (const uint8_t *)"grp-a",
                                       .group_id_len = 5, .members = g->mem, .n_members = m,
                                       .n = n, .comp = AR_COMP_NONE, .chunk_elems = 1024,
                                       .deadline_ms = 20000, .stall_ms = 1500, .linger_ms = 3000,
                                       .in_place = g_in_place, .done = on_done};
}

static void kill_peer(struct grp *g, size_t i)
{
    struct peer *p = &g->p[i];
    if (!p->alive)
        return;
    ar_engine_free(p->eng); /* its host closes: it has disappeared */
    p->eng = NULL;
    p->alive = 0;
}

static void grp_cleanup(struct grp *g)
{
    for (size_t i = 0; i < g->m; i++)
        kill_peer(g, i);
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

static int start_peer(struct grp *g, size_t i)
{
    struct ar_round_config c = g->base;
    c.my_index = i;
    c.buf = g->p[i].buf;
    c.weight = g->w[i];
    c.arg = &g->p[i];
    g->p[i].started = 1;
    return ar_round_start(g->p[i].eng, &c, &g->p[i].round);
}

static void keepalive(uv_timer_t *t)
{
    (void)t;
}

/* Starts peer i at start_ms[i] (negative: never), kills peer kill_i at
 * kill_ms, and runs until every live started peer is done. */
static void grp_run(struct grp *g, const int *start_ms, int kill_i, int kill_ms, int limit_ms)
{
    uv_timer_t ka;
    uv_timer_init(&g->loop, &ka);
    uv_timer_start(&ka, keepalive, 1, 1);
    int64_t t0 = p2p_now_ms();
    for (;;) {
        int64_t el = p2p_now_ms() - t0;
        int pending = 0;
        for (size_t i = 0; i < g->m; i++) {
            struct peer *p = &g->p[i];
            int at = start_ms ? start_ms[i] : 0;
            if (p->alive && !p->started && at >= 0 && el >= at)
                assert_int_equal(start_peer(g, i), 0);
            if (p->alive && (!p->started ? at >= 0 : !p->done))
                pending = 1;
        }
        if (kill_i >= 0 && el >= kill_ms && g->p[kill_i].alive) {
            kill_peer(g, (size_t)kill_i);
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
static double mean_at(const struct grp *g, uint64_t mask, size_t j, double *wsum)
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

static uint64_t senders_mask(const struct grp *g)
{
    uint64_t m = 0;
    for (size_t i = 0; i < g->m; i++)
        if (g->mem[i].sends == AR_SENDS_FULL)
            m |= 1ull << i;
    return m;
}

static int close_to(double got, double want, double tol_rel)
{
    return fabs(got - want) <= tol_rel * fabs(want) + 1e-30;
}

/* Every live sender ends with the same bytes in the averaged parts. */
static void assert_identical(const struct grp *g, const struct peer *ref)
{
    for (size_t i = 0; i < g->m; i++) {
        const struct peer *p = &g->p[i];
        if (!p->alive || !p->buf || p == ref)
            continue;
        for (size_t k = 0; k < ref->res.n_parts; k++)
            if (ref->parts[k].averaged && p->parts[k].averaged)
                assert_memory_equal(p->buf + ref->parts[k].offset,
                                    ref->buf + ref->parts[k].offset,
                                    ref->parts[k].len * sizeof(float));
    }
}

static void check_exact(struct grp *g, uint64_t mask)
{
    double W = 0;
    mean_at(g, mask, 0, &W);
    for (size_t i = 0; i < g->m; i++) {
        struct peer *p = &g->p[i];
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
            if (!close_to(p->buf[j], mean_at(g, mask, j, NULL), 3e-7))
                fail_msg("peer %zu elem %zu: got %.9g want %.9g", i, j, p->buf[j],
                         mean_at(g, mask, j, NULL));
        assert_identical(g, p);
    }
}

static void test_exact_mean_2_to_8(void **s)
{
    (void)s;
    for (size_t m = 2; m <= 8; m++) {
        struct grp g;
        double frac[MAXP];
        int sends[MAXP], listen[MAXP];
        for (size_t i = 0; i < m; i++) {
            frac[i] = 1.0 + (double)i * 0.7; /* uneven */
            sends[i] = listen[i] = 1;
        }
        grp_init(&g, m, 30011 + 977 * m, frac, sends, listen, NULL);
        grp_run(&g, NULL, -1, 0, 20000);
        check_exact(&g, senders_mask(&g));
        /* the uneven split is what the schedule asked for */
        assert_true(g.p[0].parts[m - 1].len > g.p[0].parts[0].len);
        assert_true(g.p[0].res.bytes_sent > 0 && g.p[0].res.bytes_received > 0);
        grp_cleanup(&g);
    }
}

/* Aggregators behind NAT, reached through a relay (p2p_relay.h, issue
 * 17): peers 2 and 3 accept no connections and reserve ports at peer 0's
 * averaging host; with those addresses they aggregate their parts like
 * the others, and every member gets the exact mean. */
struct relayed {
    int done, status;
    struct sockaddr_storage adv;
};

static void on_relayed(void *arg, int status, const struct sockaddr *adv)
{
    struct relayed *r = arg;
    r->done = 1;
    r->status = status;
    if (status == CM_OK)
        memcpy(&r->adv, adv, sizeof(struct sockaddr_in));
}

static void test_relayed_aggregators(void **s)
{
    (void)s;
    struct grp g;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 0, 0};
    grp_init(&g, 4, 40013, frac, sends, listen, NULL);
    assert_int_equal(p2p_host_relay_enable(ar_engine_host(g.p[0].eng), NULL), 0);
    struct relayed rl[4] = {{0}};
    for (size_t i = 2; i < 4; i++) {
        assert_int_equal(p2p_host_relay_use(ar_engine_host(g.p[i].eng), (struct sockaddr *)&g.mem[0].addr,
                                            g.mem[0].pub, 3000, on_relayed, &rl[i]),
                         0);
        for (int64_t t0 = p2p_now_ms(); !rl[i].done && p2p_now_ms() - t0 < 3000;)
            uv_run(&g.loop, UV_RUN_NOWAIT);
        assert_int_equal(rl[i].status, CM_OK);
        memcpy(&g.mem[i].addr, &rl[i].adv, sizeof(struct sockaddr_in));
    }
    for (int round = 0; round < 2; round++) { /* the second on the circuits of the first */
        for (size_t i = 0; i < 4; i++) {
            g.p[i].done = g.p[i].started = 0;
            if (round)
                memcpy(g.p[i].buf, g.p[i].orig, g.n * sizeof(float));
        }
        g.base.step = 42 + (uint64_t)round;
        grp_run(&g, NULL, -1, 0, 20000);
        check_exact(&g, senders_mask(&g));
        assert_int_equal(g.p[0].res.n_parts, 4);
    }
    struct p2p_relay_stats rs, xs;
    p2p_host_relay_stats(ar_engine_host(g.p[0].eng), &rs);
    p2p_host_relay_stats(ar_engine_host(g.p[2].eng), &xs);
    printf("relay: %llu circuits, %llu bytes; peer 2 accepted %llu\n", (unsigned long long)rs.circuits,
           (unsigned long long)rs.bytes, (unsigned long long)xs.accepted);
    assert_true(rs.bytes > 2 * g.n / 4 * sizeof(float));
    assert_true(xs.accepted >= 1);
    grp_cleanup(&g);
}

/* In place: the same exact, bit-identical means with client-mode,
 * aggregate-only and pull-only members, and the same bytes as staged. */
static void test_in_place_exact(void **s)
{
    (void)s;
    double frac[] = {1, 2, 0, 1, 1, 0};
    int sends[] = {1, 1, 1, AR_SENDS_NONE, 1, AR_SENDS_PULL}, listen[] = {1, 1, 0, 1, 1, 1};
    float *staged[6] = {0};
    for (int mode = 0; mode < 2; mode++) {
        struct grp g;
        g_in_place = mode;
        rng = 0x1234567ull; /* the same gradients and weights in both modes */
        grp_init(&g, 6, 70001, frac, sends, listen, NULL);
        g_in_place = 0;
        for (size_t i = 0; i < 6; i++)
            if (g.p[i].buf && sends[i] == AR_SENDS_PULL)
                memset(g.p[i].buf, 0xff, g.n * sizeof(float)); /* NaN: must not be read */
        grp_run(&g, NULL, -1, 0, 20000);
        check_exact(&g, senders_mask(&g));
        for (size_t i = 0; i < 6; i++) {
            if (!g.p[i].buf)
                continue;
            if (!mode) {
                staged[i] = malloc(g.n * sizeof(float));
                memcpy(staged[i], g.p[i].buf, g.n * sizeof(float));
            } else {
                assert_memory_equal(g.p[i].buf, staged[i], g.n * sizeof(float));
                free(staged[i]);
            }
        }
        grp_cleanup(&g);
    }
}

/* A group of one (a peer alone in its step): done on the next loop turn,
 * the buffer unchanged bit for bit (its own weighted mean). */
static void test_group_of_one(void **s)
{
    (void)s;
    double frac[] = {1};
    int sends[] = {1}, listen[] = {1};
    struct grp g;
    grp_init(&g, 1, 5000, frac, sends, listen, NULL);
    grp_run(&g, NULL, -1, 0, 5000);
    assert_true(g.p[0].done);
    assert_int_equal(g.p[0].res.status, 0);
    assert_int_equal(g.p[0].res.n_averaged, 1);
    assert_memory_equal(g.p[0].buf, g.p[0].orig, g.n * sizeof(float));
    assert_int_equal(g.p[0].res.bytes_sent, 0);
    grp_cleanup(&g);
}

/* A buffer smaller than one alignment unit per aggregator: some parts are
 * empty; nothing waits for them and the mean is still exact. */
static void test_tiny_buffer(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct grp g;
    grp_init(&g, 4, 300, frac, sends, listen, NULL);
    grp_run(&g, NULL, -1, 0, 20000);
    check_exact(&g, 0xf);
    int empty = 0;
    for (size_t k = 0; k < g.p[0].res.n_parts; k++)
        empty += g.p[0].parts[k].len == 0;
    assert_true(empty >= 1);
    assert_true(g.p[0].res.ms_total < 5000);
    grp_cleanup(&g);
}

static void test_client_and_aux(void **s)
{
    (void)s;
    /* 0,1: ordinary; 2: client mode (sends, cannot aggregate);
     * 3: aggregate-only auxiliary peer (no gradient, no buffer). */
    double frac[] = {1, 1, 0, 2};
    int sends[] = {1, 1, 1, 0}, listen[] = {1, 1, 0, 1};
    struct grp g;
    grp_init(&g, 4, 40000, frac, sends, listen, NULL);
    grp_run(&g, NULL, -1, 0, 20000);
    check_exact(&g, senders_mask(&g));
    struct peer *aux = &g.p[3];
    assert_true(aux->done);
    assert_int_equal(aux->res.status, 0);
    assert_int_equal(aux->res.n_parts, 3);
    assert_true(aux->parts[2].averaged); /* its own part */
    assert_int_equal(aux->parts[2].aggregator, 3);
    assert_int_equal(aux->parts[2].counted, 0x7);
    assert_true(aux->parts[2].len > aux->parts[0].len); /* fraction 2 vs 1 */
    /* a client-mode member asked to aggregate is refused up front */
    struct ar_round_config c = g.base;
    struct ar_member mem2[4];
    memcpy(mem2, g.mem, sizeof mem2);
    mem2[2].fraction = 1;
    c.members = mem2;
    c.step = 43;
    c.my_index = 2;
    c.buf = g.p[2].buf;
    c.weight = 1;
    c.arg = &g.p[2];
    assert_int_equal(ar_round_start(g.p[2].eng, &c, NULL), CM_EINVAL);
    grp_cleanup(&g);
}

/* Pull-only members (sends = AR_SENDS_PULL: told not to compute, still
 * applying the step): they contribute nothing, whatever their buffer holds,
 * and end with the senders' exact weighted mean, bit-identical to the
 * senders'; one of them aggregates a part, one is in client mode. */
static void test_pull_only(void **s)
{
    (void)s;
    double frac[] = {1, 1, 0, 1.5, 0};
    int sends[] = {AR_SENDS_FULL, AR_SENDS_FULL, AR_SENDS_FULL, AR_SENDS_PULL, AR_SENDS_PULL};
    int listen[] = {1, 1, 0, 1, 0};
    struct grp g;
    grp_init(&g, 5, 50000, frac, sends, listen, NULL);
    grp_run(&g, NULL, -1, 0, 20000);
    check_exact(&g, 0x7); /* the mean of members 0-2 only, on all five */
    for (size_t i = 3; i < 5; i++) {
        assert_true(g.p[i].done);
        assert_int_equal(g.p[i].res.status, 0);
        assert_int_equal(g.p[i].res.n_averaged, 3);
        assert_true(g.p[i].res.bytes_received > 0);
    }
    assert_int_equal(g.p[3].parts[2].aggregator, 3);
    assert_int_equal(g.p[3].parts[2].counted, 0x7);
    assert_int_equal(g.p[0].parts[2].counted, 0x7); /* nobody counted the pull-only ones */
    /* a pull-only member needs a buffer; an unknown role and a round with
       nobody sending are refused */
    struct ar_round_config c = g.base;
    c.step = 43;
    c.my_index = 4;
    c.buf = NULL;
    c.arg = &g.p[4];
    assert_int_equal(ar_round_start(g.p[4].eng, &c, NULL), CM_EINVAL);
    struct ar_member mem2[5];
    memcpy(mem2, g.mem, sizeof mem2);
    mem2[1].sends = 3;
    c.members = mem2;
    c.buf = g.p[4].buf;
    assert_int_equal(ar_round_start(g.p[4].eng, &c, NULL), CM_EINVAL);
    for (size_t i = 0; i < 5; i++)
        mem2[i].sends = AR_SENDS_PULL;
    assert_int_equal(ar_round_start(g.p[4].eng, &c, NULL), CM_EINVAL);
    grp_cleanup(&g);
}

static void test_bad_config(void **s)
{
    (void)s;
    double frac[] = {1, 1};
    int sends[] = {1, 1}, listen[] = {1, 1};
    struct grp g;
    grp_init(&g, 2, 1000, frac, sends, listen, NULL);
    struct ar_round_config c = g.base;
    c.my_index = 0;
    c.buf = g.p[0].buf;
    c.weight = 1;
    c.arg = &g.p[0];
    struct ar_round_config b = c;
    b.my_index = 1; /* not my key */
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    b = c;
    b.weight = NAN;
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    b = c;
    b.buf = NULL;
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    b = c;
    b.chunk_elems = 100; /* not a multiple of the Q8 block */
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    b = c;
    b.comp = 5;
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    struct ar_member dup[2];
    memcpy(dup, g.mem, sizeof dup);
    memcpy(dup[1].pub, dup[0].pub, 32);
    b = c;
    b.members = dup;
    assert_int_equal(ar_round_start(g.p[0].eng, &b, NULL), CM_EINVAL);
    /* the same round twice */
    assert_int_equal(ar_round_start(g.p[0].eng, &c, NULL), 0);
    assert_int_equal(ar_round_start(g.p[0].eng, &c, NULL), CM_EEXISTS);
    /* cancel: done runs at once with CM_ECLOSED, the buffer is untouched */
    ar_round_cancel(g.p[0].round ? g.p[0].round : NULL);
    grp_cleanup(&g);
    assert_true(g.p[0].done);
    assert_int_equal(g.p[0].res.status, CM_ECLOSED);
}

/* The training loop runs one round per step on the same engines: the next
 * round starts while the previous one may still linger on aggregators, and
 * a finished round cannot be started again. */
static void test_consecutive_rounds(void **s)
{
    (void)s;
    double frac[] = {1, 3, 2};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 12345, frac, sends, listen, NULL);
    for (int step = 0; step < 3; step++) {
        g.base.step = 100 + (uint64_t)step;
        for (size_t i = 0; i < 3; i++) {
            struct peer *p = &g.p[i];
            p->done = p->started = 0;
            g.w[i] = 1 + step + (double)i;
            for (size_t j = 0; j < g.n; j++)
                p->buf[j] = (float)((urand() * 2 - 1) * (1 + step));
            memcpy(p->orig, p->buf, g.n * sizeof(float));
        }
        grp_run(&g, NULL, -1, 0, 20000);
        check_exact(&g, 0x7);
        if (step == 0) {
            /* pass renewal between steps: fresh tokens, same keys */
            for (size_t i = 0; i < 3; i++) {
                struct cm_pass_claims c = {.version = 1};
                int64_t now = (int64_t)time(NULL);
                c.issued_at = now - 10;
                c.expires_at = now + 600;
                snprintf(c.username, sizeof c.username, "peer%zu", i);
                snprintf(c.run, sizeof c.run, "%s", g.tk.run);
                snprintf(c.pass_id, sizeof c.pass_id, "r%zu", i);
                memcpy(c.peer_public_key, g.p[i].id.key.pub, 32);
                char *tok;
                assert_int_equal(cm_token_sign(&g.tk.coord, &c, &tok), 0);
                assert_int_equal(ar_engine_set_token(g.p[i].eng, tok), 0);
                free(g.p[i].id.token);
                g.p[i].id.token = tok;
            }
            /* the old passes are revoked: a host still using one would be refused */
            const char *old[] = {"1", "2", "3"};
            for (size_t i = 0; i < 3; i++)
                assert_int_equal(p2p_auth_set_revoked(p2p_ctx_auth(g.p[i].ctx), old, 3,
                                                      (int64_t)time(NULL)),
                                 0);
        }
    }
    /* step 101 is over: starting it again is refused */
    g.base.step = 101;
    assert_int_equal(start_peer(&g, 0), CM_EEXISTS);
    grp_cleanup(&g);
}

/* Members start at different times: early data is refused with "not
 * started" and retried until the aggregator starts. */
static void test_staggered_start(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 20000, frac, sends, listen, NULL);
    int start[] = {0, 150, 300};
    grp_run(&g, start, -1, 0, 20000);
    check_exact(&g, senders_mask(&g));
    grp_cleanup(&g);
}

/* A sender that never shows up is dropped after stall_ms; the mean
 * renormalizes over the others. Its part (it aggregates too) is lost. */
static void test_sender_never_starts(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 0};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct grp g;
    grp_init(&g, 4, 30000, frac, sends, listen, NULL);
    int start[] = {0, 0, 0, -1};
    grp_run(&g, start, -1, 0, 20000);
    check_exact(&g, 0x7);
    for (size_t i = 0; i < 3; i++)
        for (size_t k = 0; k < 3; k++)
            assert_int_equal(g.p[i].parts[k].dropped, 0x8);
    grp_cleanup(&g);
}

/* Four members, the fourth never there: the three others lost its part
 * (status why, their local values kept), dropped it as a sender, averaged
 * the other three parts exactly over themselves, and were done within
 * max_ms. */
static void check_fourth_lost(struct grp *g, int why, double max_ms)
{
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g->p[i];
        assert_int_equal(p->res.status, why);
        assert_int_equal(p->res.n_averaged, 3);
        assert_false(p->parts[3].averaged);
        assert_int_equal(p->parts[3].status, why);
        assert_memory_equal(p->buf + p->parts[3].offset, p->orig + p->parts[3].offset,
                            p->parts[3].len * sizeof(float));
        for (size_t k = 0; k < 3; k++) {
            assert_int_equal(p->parts[k].dropped, 0x8);
            for (size_t j = p->parts[k].offset; j < p->parts[k].offset + p->parts[k].len; j++)
                assert_true(close_to(p->buf[j], mean_at(g, 0x7, j, NULL), 3e-7));
        }
        assert_true(p->res.ms_total < max_ms);
    }
}

/* An aggregator whose engine lives but never starts the round: its
 * "round unknown" answers do not count as alive, so the others give its
 * part up after stall_ms, not at the deadline. */
static void test_aggregator_never_starts(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct grp g;
    grp_init(&g, 4, 30000, frac, sends, listen, NULL);
    int start[] = {0, 0, 0, -1};
    grp_run(&g, start, -1, 0, 20000);
    check_fourth_lost(&g, CM_ETIMEOUT, 5000); /* deadline is 20 s */
    grp_cleanup(&g);
}

/* A member that starts later than stall_ms (its previous group round lost
 * a peer) is still waited for when start_wait_ms covers it: its "round
 * unknown" answers keep the others trying, and the aggregators keep its
 * place as a sender. The same start without start_wait_ms drops it. */
static void test_late_start_within_start_wait(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 20000, frac, sends, listen, NULL);
    g.base.start_wait_ms = 4000; /* stall_ms 1500 */
    int start[] = {0, 0, 2500};
    grp_run(&g, start, -1, 0, 20000);
    check_exact(&g, senders_mask(&g));
    grp_cleanup(&g);

    grp_init(&g, 3, 20000, frac, sends, listen, NULL);
    grp_run(&g, start, -1, 0, 20000);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(g.p[i].res.n_averaged, 2);
        assert_false(g.p[i].parts[2].averaged);
        assert_int_equal(g.p[i].parts[0].dropped, 0x4);
    }
    grp_cleanup(&g);
}

/* Members known gone (cfg.gone, e.g. unreachable in an earlier group round)
 * are not waited for: their parts fail at once with CM_ECONN and they are
 * dropped as senders at once, so the round ends long before stall_ms. */
static void test_gone_members_not_waited_for(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct grp g;
    grp_init(&g, 4, 30000, frac, sends, listen, NULL);
    g.base.stall_ms = 8000;
    g.base.gone = 0x8;
    int start[] = {0, 0, 0, -1};
    grp_run(&g, start, -1, 0, 20000);
    check_fourth_lost(&g, CM_ECONN, 4000); /* stall is 8 s */
    grp_cleanup(&g);
}

/* The round deadline bounds everything, even with a long stall limit:
 * aggregators stop waiting for a silent sender at 4/5 of it, so the other
 * parts are still averaged; the part of an aggregator that never starts is
 * given up at the deadline. */
static void test_deadline(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 20000, frac, sends, listen, NULL);
    g.base.deadline_ms = 800;
    g.base.stall_ms = 30000;
    int start[] = {0, 0, -1};
    int64_t t0 = p2p_now_ms();
    grp_run(&g, start, -1, 0, 5000);
    int64_t took = p2p_now_ms() - t0;
    assert_true(took >= 750 && took < 3000); /* the missing part waits for the deadline */
    for (size_t i = 0; i < 2; i++) {
        struct peer *p = &g.p[i];
        assert_int_equal(p->res.status, CM_ETIMEOUT);
        assert_int_equal(p->res.n_averaged, 2);
        assert_false(p->parts[2].averaged);
        assert_int_equal(p->parts[2].status, CM_ETIMEOUT);
        assert_memory_equal(p->buf + p->parts[2].offset, p->orig + p->parts[2].offset,
                            p->parts[2].len * sizeof(float));
        for (size_t j = 0; j < p->parts[2].offset; j++)
            assert_true(close_to(p->buf[j], mean_at(&g, 0x3, j, NULL), 3e-7));
    }
    grp_cleanup(&g);
}

/* A sender (not an aggregator) killed while its slow upload is under way:
 * dropped after stall_ms; chunks it delivered keep it, the others are
 * averaged without it; every chunk is one of the two exact means. */
static void test_sender_killed_mid_round(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 0};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    double mbps[] = {0, 0, 0, 4}; /* 0.5 MB/s: its 3 x 256 KiB take ~1.5 s */
    struct grp g;
    grp_init(&g, 4, 196608, frac, sends, listen, mbps);
    grp_run(&g, NULL, 3, 500, 20000);
    int with = 0, without = 0;
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_equal(p->res.status, 0);
        for (size_t k = 0; k < 3; k++) {
            const struct ar_part_report *pr = &p->parts[k];
            assert_true(pr->averaged);
            assert_int_equal(pr->dropped, 0x8);
            assert_true(pr->weight <= pr->weight_max);
            for (size_t c0 = pr->offset; c0 < pr->offset + pr->len; c0 += 1024) {
                size_t c1 = c0 + 1024 < pr->offset + pr->len ? c0 + 1024 : pr->offset + pr->len;
                int inc = close_to(p->buf[c0], mean_at(&g, 0xf, c0, NULL), 3e-7);
                for (size_t j = c0; j < c1; j++)
                    assert_true(close_to(p->buf[j], mean_at(&g, inc ? 0xf : 0x7, j, NULL), 3e-7));
                if (i == 0)
                    inc ? with++ : without++;
            }
        }
        assert_identical(&g, p);
    }
    assert_true(without > 0); /* it really left part-way */
    assert_true(g.p[0].res.ms_total < 10000);
    grp_cleanup(&g);
}

/* An aggregator killed while it serves (its download is slow): its part
 * stays local on every survivor, the other parts are averaged over the
 * senders heard from. */
/* Each chunk of a part that was not averaged, in place: either exactly
 * the local values or an average the aggregator returned (of the senders
 * in one of the masks), never anything else (nothing non-finite). */
static void check_lost_in_place(const struct grp *g, const struct peer *p, size_t off, size_t len,
                                const uint64_t *masks, size_t n_masks, double other)
{
    size_t local = 0;
    for (size_t c = off; c < off + len; c += 1024) {
        size_t end = c + 1024 < off + len ? c + 1024 : off + len;
        if (!memcmp(p->buf + c, p->orig + c, (end - c) * sizeof(float))) {
            local++;
            continue;
        }
        for (size_t j = c; j < end; j++) {
            int ok = other != 0 && p->buf[j] == (float)other;
            for (size_t q = 0; q < n_masks && !ok; q++)
                ok = close_to(p->buf[j], mean_at(g, masks[q], j, NULL), 3e-7);
            if (!ok)
                fail_msg("elem %zu of a lost part: %.9g is neither local nor an average", j,
                         p->buf[j]);
        }
    }
    assert_true(local > 0); /* the part was lost before its end */
}

static void run_aggregator_killed(int in_place)
{
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    double mbps[] = {0, 0, 0, 4};
    struct grp g;
    g_in_place = in_place;
    grp_init(&g, 4, 262144, frac, sends, listen, mbps);
    g_in_place = 0;
    grp_run(&g, NULL, 3, 400, 20000);
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_not_equal(p->res.status, 0);
        assert_int_equal(p->res.n_averaged, 3);
        const struct ar_part_report *lost = &p->parts[3];
        assert_false(lost->averaged);
        assert_int_not_equal(lost->status, 0);
        /* the lost part keeps exactly the local values (in place: chunk by
           chunk, local or the dead aggregator's average) */
        if (in_place)
            check_lost_in_place(&g, p, lost->offset, lost->len, (uint64_t[]){0xf, 0x7}, 2, 0);
        else
            assert_memory_equal(p->buf + lost->offset, p->orig + lost->offset,
                                lost->len * sizeof(float));
        for (size_t k = 0; k < 3; k++) {
            const struct ar_part_report *pr = &p->parts[k];
            assert_true(pr->averaged);
            uint64_t mask = pr->counted | pr->partial;
            assert_int_equal(pr->counted & 0x7, 0x7);
            for (size_t j = pr->offset; j < pr->offset + pr->len; j += 1024) {
                /* each chunk: with or without the dead member */
                int inc = close_to(p->buf[j], mean_at(&g, 0xf, j, NULL), 3e-7);
                assert_true(inc ? (mask & 0x8) != 0
                                : close_to(p->buf[j], mean_at(&g, 0x7, j, NULL), 3e-7));
            }
        }
        assert_identical(&g, p);
    }
    grp_cleanup(&g);
}

/* The in-place flag of a test registered twice (cmocka prestate). */
static int g_staged = 0, g_placed = 1;
static int mode_of(void **s)
{
    return *(const int *)*s;
}

static void test_aggregator_killed(void **s)
{
    run_aggregator_killed(mode_of(s));
}

static void test_bad_senders_excluded(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1, 1}, listen[] = {1, 1, 1, 1, 1};
    struct grp g;
    grp_init(&g, 5, 25600, frac, sends, listen, NULL);
    /* member 3: a NaN at the start of every part; member 4: an absurd norm. */
    size_t np, off[5], len[5];
    uint32_t own[5];
    assert_int_equal(ar_partition(g.mem, 5, g.n, AR_ALIGN, &np, own, off, len), 0);
    for (size_t k = 0; k < np; k++) {
        g.p[3].buf[off[k]] = NAN;
        for (size_t j = 0; j < 1024; j++)
            g.p[4].buf[off[k] + j] = 1e30f;
    }
    g.base.max_norm = 1e6;
    grp_run(&g, NULL, -1, 0, 20000);
    /* members 0..2 get the exact mean over themselves; 3 and 4 excluded
     * everywhere, by every aggregator, with their reasons */
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g.p[i];
        int nan_seen = 0, norm_seen = 0;
        for (size_t x = 0; x < p->res.n_excluded; x++) {
            if (p->excl[x].member == 3 && p->excl[x].reason == AR_EXCL_NONFINITE)
                nan_seen++;
            if (p->excl[x].member == 4 && p->excl[x].reason == AR_EXCL_NORM)
                norm_seen++;
        }
        assert_int_equal(nan_seen, 5);
        assert_int_equal(norm_seen, 5);
        for (size_t k = 0; k < 5; k++)
            assert_int_equal(p->parts[k].excluded, 0x18);
    }
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g.p[i];
        for (size_t j = 0; j < g.n; j++)
            assert_true(close_to(p->buf[j], mean_at(&g, 0x7, j, NULL), 3e-7));
    }
    grp_cleanup(&g);
}

/* A NaN in the middle of a part: the sender is excluded and its earlier
 * chunks are taken out of every chunk not yet final; only chunks already
 * final (and maybe returned) keep it, and the report says so (`partial`). */
static void test_nan_mid_part(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 3 * 8192, frac, sends, listen, NULL);
    g.base.window = 1; /* chunks in order */
    g.p[2].buf[5 * 1024 + 3] = NAN; /* part 0, chunk 5 */
    /* member 1 starts late, so member 2's chunks 0..5 reach aggregator 0
     * before any of part 0 can be final: all of them are taken out again */
    grp_run(&g, (int[]){0, 400, 0}, -1, 0, 20000);
    struct peer *p = &g.p[0];
    assert_int_equal(p->parts[0].excluded, 0x4);
    int with = 0;
    for (size_t c = 0; c < 8; c++) {
        size_t j0 = c * 1024;
        int inc = close_to(p->buf[j0], mean_at(&g, 0x7, j0, NULL), 3e-7);
        assert_true(c < 5 || !inc);
        with += inc;
        for (size_t j = j0; j < j0 + 1024; j++)
            assert_true(close_to(p->buf[j], mean_at(&g, inc ? 0x7 : 0x3, j, NULL), 3e-7));
    }
    assert_int_equal(with, 0);
    assert_int_equal(p->parts[0].partial, 0);
    assert_int_equal(p->parts[0].counted, 0x3);
    assert_true(p->parts[0].weight == p->parts[0].weight_max);
    /* the other parts: member 2 was fine there */
    assert_int_equal(p->parts[1].counted, 0x7);
    assert_identical(&g, p);
    grp_cleanup(&g);
}

/* Every sender turns out bad: a chunk with nobody left in it has no average,
 * so the part is not averaged anywhere (local values kept), reported with
 * CM_ENOTFOUND, and nothing waits for a deadline. */
static void test_all_senders_excluded(void **s)
{
    (void)s;
    double frac[] = {1, 0, 0};
    int sends[] = {0, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 8192, frac, sends, listen, NULL);
    g.base.window = 1;
    g.p[1].buf[3 * 1024] = g.p[1].orig[3 * 1024] = NAN;
    g.p[2].buf[3 * 1024 + 1] = g.p[2].orig[3 * 1024 + 1] = INFINITY;
    grp_run(&g, (int[]){0, 0, 300}, -1, 0, 20000);
    for (size_t i = 0; i < 3; i++) {
        struct peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_equal(p->res.status, CM_ENOTFOUND);
        assert_false(p->parts[0].averaged);
        assert_true(p->res.ms_total < 10000);
        if (p->buf)
            assert_memory_equal(p->buf, p->orig, g.n * sizeof(float));
    }
    assert_int_equal(g.p[0].parts[0].excluded, 0x6);
    grp_cleanup(&g);
}

struct reply {
    int done, status;
};
static void on_reply(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                     size_t len)
{
    struct reply *r = arg;
    (void)from, (void)body, (void)len;
    r->done = 1;
    r->status = status;
}

static int raw_send(struct grp *g, struct p2p_host *h, size_t to, uint32_t type,
                    const uint8_t *body, size_t len)
{
    struct reply r = {0};
    assert_int_equal(p2p_request(h, (struct sockaddr *)&g->mem[to].addr, g->mem[to].pub, type,
                                 body, len, 3000, on_reply, &r),
                     0);
    int64_t end = p2p_now_ms() + 5000;
    while (!r.done && p2p_now_ms() < end)
        uv_run(&g->loop, UV_RUN_ONCE);
    assert_true(r.done);
    return r.status;
}

/* A member whose chunk lies about its length is excluded (reason "size");
 * unknown rounds are refused as "not started", finished ones as such,
 * strangers as not members. */
static void test_lying_length_and_round_states(void **s)
{
    (void)s;
    double frac[] = {1, 1, 0};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    grp_init(&g, 3, 8192, frac, sends, listen, NULL);
    /* member 2 does not run an engine round: a raw host with its key speaks for it */
    struct p2p_host *raw;
    struct p2p_host_config hc = {.key = &g.p[2].id.key, .token = g.p[2].id.token};
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &raw), 0);
    struct ar_round_config c = g.base;
    uint8_t rid[32];
    assert_int_equal(ar_round_id(&c, rid), 0);
    uint8_t payload[4 * 1024];
    memset(payload, 0, sizeof payload);
    struct ar_data_msg d = {.part = 0, .chunk = 0, .weight = 5, .encoding = AR_COMP_NONE,
                            .count = 1024, .payload = payload, .payload_len = sizeof payload};
    memcpy(d.round, rid, 32);
    uint8_t *body;
    size_t blen;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    /* before member 0 started: "not started", retry later */
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_EBUSY);
    free(body);
    assert_int_equal(start_peer(&g, 0), 0);
    assert_int_equal(start_peer(&g, 1), 0);
    d.count = 1000; /* the payload still holds 1024 values: a lie */
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_ERANGE);
    free(body);
    grp_run(&g, (int[]){0, 0, -1}, -1, 0, 20000);
    struct peer *p = &g.p[0];
    assert_int_equal(p->parts[0].excluded, 0x4);
    int found = 0;
    for (size_t x = 0; x < p->res.n_excluded; x++)
        found |= p->excl[x].member == 2 && p->excl[x].reason == AR_EXCL_SIZE;
    assert_true(found);
    check_exact(&g, 0x3);
    /* finished (lingering or forgotten): definite refusal */
    d.count = 1024;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    int st = raw_send(&g, raw, 0, AR_MSG_DATA, body, blen);
    assert_true(st == CM_ESTATE || st == CM_ERANGE);
    /* an unknown round id */
    body[2] ^= 0x55; /* inside the round id bytes */
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_EBUSY);
    free(body);
    /* a stranger (valid token, not a member) */
    struct p2p_tk_peer stranger;
    assert_int_equal(p2p_tk_peer_new(&g.tk, "eve", "99", 3600, &stranger), 0);
    struct p2p_host *eh;
    hc.key = &stranger.key;
    hc.token = stranger.token;
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &eh), 0);
    struct ar_fetch_msg f = {.part = 0, .chunk = 0};
    memcpy(f.round, rid, 32);
    assert_int_equal(ar_fetch_build(&f, &body, &blen), 0);
    st = raw_send(&g, eh, 0, AR_MSG_FETCH, body, blen);
    assert_true(st == CM_EPERM || st == CM_ESTATE);
    free(body);
    p2p_host_close(eh);
    p2p_host_close(raw);
    p2p_tk_peer_cleanup(&stranger);
    grp_cleanup(&g);
}

/* A hostile aggregator (member 2, a raw host with its key): it accepts
 * chunks and claims every chunk is ready, then returns NaN averages (from
 * chunk nan_from on; 0.5 before). The honest members refuse them: that part
 * stays local (in place: the chunks before hold the valid 0.5), the others
 * are averaged. It also sends a chunk whose count and payload agree but are
 * not what the round's split says: excluded for "size". */
struct fake {
    struct grp *g;
    size_t off[MAXP], len[MAXP];
    uint32_t own[MAXP];
    int fetches;
    uint32_t nan_from;
};

static int fake_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from,
                           uint32_t type, const uint8_t *body, size_t len, uint8_t **resp,
                           size_t *rlen)
{
    struct fake *f = arg;
    (void)h, (void)from;
    if (type == AR_MSG_DATA) {
        struct ar_data_msg d;
        if (ar_data_parse(body, len, &d))
            return CM_EPARSE;
        ar_data_cleanup(&d);
        return ar_ack_build(1000, resp, rlen) ? CM_ENOMEM : CM_OK;
    }
    if (type != AR_MSG_FETCH)
        return CM_EUNSUPPORTED;
    struct ar_fetch_msg q;
    if (ar_fetch_parse(body, len, &q) || q.part != 2)
        return CM_EINVAL;
    size_t lo = (size_t)q.chunk * 1024, cnt = f->len[2] - lo < 1024 ? f->len[2] - lo : 1024;
    float vals[1024];
    uint8_t enc[4 * 1024];
    for (size_t i = 0; i < cnt; i++)
        vals[i] = i == 7 && q.chunk >= f->nan_from ? NAN : 0.5f;
    ar_codec_encode(AR_COMP_NONE, vals, cnt, enc, sizeof enc);
    struct ar_result_msg r;
    memset(&r, 0, sizeof r);
    memcpy(r.round, q.round, 32);
    r.part = 2;
    r.chunk = q.chunk;
    r.weight = 10;
    r.counted = 0x7;
    r.encoding = AR_COMP_NONE;
    r.count = (uint32_t)cnt;
    r.payload = enc;
    r.payload_len = 4 * cnt;
    f->fetches++;
    return ar_result_build(&r, resp, rlen) ? CM_ENOMEM : CM_OK;
}

static void run_hostile_aggregator(int in_place)
{
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct grp g;
    g_in_place = in_place;
    grp_init(&g, 3, 8192, frac, sends, listen, NULL);
    g_in_place = 0;
    kill_peer(&g, 2); /* its engine goes; a raw host with its key takes the address */
    struct fake f = {.g = &g, .nan_from = in_place ? 1 : 0};
    size_t np;
    assert_int_equal(ar_partition(g.mem, 3, g.n, AR_ALIGN, &np, f.own, f.off, f.len), 0);
    struct p2p_host *raw;
    struct p2p_host_config hc = {.key = &g.p[2].id.key, .token = g.p[2].id.token,
                                 .listen_ip = "127.0.0.1", .on_request = fake_on_request,
                                 .arg = &f};
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &raw), 0);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", p2p_host_port(raw));
    assert_int_equal(p2p_addr_parse(a, &g.mem[2].addr), 0);
    assert_int_equal(start_peer(&g, 0), 0);
    assert_int_equal(start_peer(&g, 1), 0);
    /* a consistent but wrong-sized chunk to aggregator 0 */
    uint8_t rid[32];
    assert_int_equal(ar_round_id(&g.base, rid), 0);
    uint8_t payload[4 * 512];
    memset(payload, 0, sizeof payload);
    struct ar_data_msg d = {.part = 0, .chunk = 0, .weight = 5, .encoding = AR_COMP_NONE,
                            .count = 512, .payload = payload, .payload_len = sizeof payload};
    memcpy(d.round, rid, 32);
    uint8_t *body;
    size_t blen;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_ERANGE);
    free(body);
    grp_run(&g, (int[]){0, 0, -1}, -1, 0, 20000);
    assert_true(f.fetches > 0);
    for (size_t i = 0; i < 2; i++) {
        struct peer *p = &g.p[i];
        assert_int_equal(p->res.status, CM_EPROTO);
        assert_false(p->parts[2].averaged);
        assert_int_equal(p->parts[2].status, CM_EPROTO);
        if (in_place)
            check_lost_in_place(&g, p, f.off[2], f.len[2], NULL, 0, 0.5);
        else
            assert_memory_equal(p->buf + f.off[2], p->orig + f.off[2],
                                f.len[2] * sizeof(float));
        for (size_t j = 0; j < f.off[2]; j++)
            assert_true(close_to(p->buf[j], mean_at(&g, 0x3, j, NULL), 3e-7));
    }
    assert_int_equal(g.p[0].parts[0].excluded, 0x4);
    int found = 0;
    for (size_t x = 0; x < g.p[0].res.n_excluded; x++)
        found |= g.p[0].excl[x].member == 2 && g.p[0].excl[x].reason == AR_EXCL_SIZE &&
                 g.p[0].excl[x].part == 0;
    assert_true(found);
    p2p_host_close(raw);
    grp_cleanup(&g);
}

static void test_hostile_aggregator_and_wrong_size(void **s)
{
    run_hostile_aggregator(mode_of(s));
}

static void run_comp(int comp, int in_place)
{
    double frac[] = {1, 2, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct grp g;
    g_in_place = in_place;
    grp_init(&g, 4, 50000, frac, sends, listen, NULL);
    g_in_place = 0;
    g.base.comp = comp;
    grp_run(&g, NULL, -1, 0, 20000);
    const uint64_t all = 0xf;
    for (size_t i = 0; i < 4; i++) {
        struct peer *p = &g.p[i];
        assert_int_equal(p->res.status, 0);
        assert_int_equal(p->res.n_averaged, 4);
        assert_identical(&g, p);
        for (size_t blk = 0; blk < g.n; blk += AR_Q8_BLOCK) {
            size_t end = blk + AR_Q8_BLOCK < g.n ? blk + AR_Q8_BLOCK : g.n;
            /* Documented bounds (ar_codec.h), applied to both encodings:
             * every sender's chunk and the returned average. Part and
             * chunk boundaries are multiples of the block, so the blocks
             * here are the encoder's blocks. */
            double smax = 0, amax = 0;
            for (size_t j = blk; j < end; j++) {
                for (size_t q = 0; q < 4; q++)
                    smax = fmax(smax, fabs(g.p[q].orig[j]));
                amax = fmax(amax, fabs(mean_at(&g, all, j, NULL)));
            }
            for (size_t j = blk; j < end; j++) {
                double want = mean_at(&g, all, j, NULL), err = fabs(p->buf[j] - want), bound;
                if (comp == AR_COMP_FP16) {
                    double sw = 0, W = 0;
                    for (size_t q = 0; q < 4; q++) {
                        sw += g.w[q] * fabs(g.p[q].orig[j]);
                        W += g.w[q];
                    }
                    bound = 0x1p-11 * (sw / W) * (1 + 0x1p-11) + 0x1p-11 * fabs(want) + 0x1p-24;
                } else {
                    double in = smax / 254 + smax * 0x1p-22;
                    bound = in + (amax + in) / 254 + (amax + in) * 0x1p-22 + 1e-12;
                }
                if (!(err <= bound))
                    fail_msg("comp %d peer %zu elem %zu: err %.3g > bound %.3g", comp, i, j, err,
                             bound);
            }
        }
    }
    /* Compression really shrinks the bytes moved. */
    uint64_t b = g.p[0].res.bytes_sent;
    assert_true(comp == AR_COMP_FP16 ? b < 2 * 50000 * 4 * 3 / 4 * 0.6
                                     : b < 2 * 50000 * 4 * 3 / 4 * 0.35);
    grp_cleanup(&g);
}

/* Both encodings staged and in place (where each aggregator decodes its
 * own part chunk by chunk: the same bytes as the others fetch). */
static void test_fp16(void **s)
{
    (void)s;
    run_comp(AR_COMP_FP16, 0);
    run_comp(AR_COMP_FP16, 1);
}

static void test_q8(void **s)
{
    (void)s;
    run_comp(AR_COMP_Q8, 0);
    run_comp(AR_COMP_Q8, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_mean_2_to_8),
        cmocka_unit_test(test_in_place_exact),
        cmocka_unit_test(test_relayed_aggregators),
        cmocka_unit_test(test_group_of_one),
        cmocka_unit_test(test_tiny_buffer),
        cmocka_unit_test(test_client_and_aux),
        cmocka_unit_test(test_pull_only),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_consecutive_rounds),
        cmocka_unit_test(test_staggered_start),
        cmocka_unit_test(test_sender_never_starts),
        cmocka_unit_test(test_aggregator_never_starts),
        cmocka_unit_test(test_late_start_within_start_wait),
        cmocka_unit_test(test_gone_members_not_waited_for),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_sender_killed_mid_round),
        cmocka_unit_test_prestate(test_aggregator_killed, &g_staged),
        cmocka_unit_test_prestate(test_aggregator_killed, &g_placed),
        cmocka_unit_test(test_bad_senders_excluded),
        cmocka_unit_test(test_nan_mid_part),
        cmocka_unit_test(test_all_senders_excluded),
        cmocka_unit_test(test_lying_length_and_round_states),
        cmocka_unit_test_prestate(test_hostile_aggregator_and_wrong_size, &g_staged),
        cmocka_unit_test_prestate(test_hostile_aggregator_and_wrong_size, &g_placed),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
