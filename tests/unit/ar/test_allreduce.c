/* ct-serial: its deadlines are timed */
/* Butterfly all-reduce over real loopback sockets (tests/harness/ct_argrp.h:
 * several averaging engines in one process on one libuv loop, each with its
 * own host and key, tokens minted here from a throwaway coordinator key):
 * the exact weighted mean for groups of 2..8 with uneven fractions, in
 * place and staged, relayed aggregators, client-mode, aggregate-only and
 * pull-only members, bad configurations, consecutive rounds, and the wire
 * compressions within their bounds, bit-identical on all members (seed
 * 000_02cc6b5d62a616fc.txt, section 3.2 and Appendix C). Failures are in
 * test_allreduce_faults.c. */
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
#include "tests/harness/ct_argrp.h"
#include "tests/harness/p2p_testkit.h"

static void test_exact_mean_2_to_8(void **s)
{
    (void)s;
    for (size_t m = 2; m <= 8; m++) {
        struct argrp g;
        double frac[MAXP];
        int sends[MAXP], listen[MAXP];
        for (size_t i = 0; i < m; i++) {
            frac[i] = 1.0 + (double)i * 0.7; /* uneven */
            sends[i] = listen[i] = 1;
        }
        argrp_init(&g, m, 30011 + 977 * m, frac, sends, listen, NULL);
        argrp_run(&g, NULL, -1, 0, 20000);
        argrp_check_exact(&g, argrp_senders(&g));
        /* the uneven split is what the schedule asked for */
        assert_true(g.p[0].parts[m - 1].len > g.p[0].parts[0].len);
        assert_true(g.p[0].res.bytes_sent > 0 && g.p[0].res.bytes_received > 0);
        argrp_cleanup(&g);
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
    struct argrp g;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 0, 0};
    argrp_init(&g, 4, 40013, frac, sends, listen, NULL);
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
        argrp_run(&g, NULL, -1, 0, 20000);
        argrp_check_exact(&g, argrp_senders(&g));
        assert_int_equal(g.p[0].res.n_parts, 4);
    }
    struct p2p_relay_stats rs, xs;
    p2p_host_relay_stats(ar_engine_host(g.p[0].eng), &rs);
    p2p_host_relay_stats(ar_engine_host(g.p[2].eng), &xs);
    printf("relay: %llu circuits, %llu bytes; peer 2 accepted %llu\n", (unsigned long long)rs.circuits,
           (unsigned long long)rs.bytes, (unsigned long long)xs.accepted);
    assert_true(rs.bytes > 2 * g.n / 4 * sizeof(float));
    assert_true(xs.accepted >= 1);
    argrp_cleanup(&g);
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
        struct argrp g;
        argrp_in_place = mode;
        argrp_rng = 0x1234567ull; /* the same gradients and weights in both modes */
        argrp_init(&g, 6, 70001, frac, sends, listen, NULL);
        argrp_in_place = 0;
        for (size_t i = 0; i < 6; i++)
            if (g.p[i].buf && sends[i] == AR_SENDS_PULL)
                memset(g.p[i].buf, 0xff, g.n * sizeof(float)); /* NaN: must not be read */
        argrp_run(&g, NULL, -1, 0, 20000);
        argrp_check_exact(&g, argrp_senders(&g));
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
        argrp_cleanup(&g);
    }
}

/* A group of one (a peer alone in its step): done on the next loop turn,
 * the buffer unchanged bit for bit (its own weighted mean). */
static void test_group_of_one(void **s)
{
    (void)s;
    double frac[] = {1};
    int sends[] = {1}, listen[] = {1};
    struct argrp g;
    argrp_init(&g, 1, 5000, frac, sends, listen, NULL);
    argrp_run(&g, NULL, -1, 0, 5000);
    assert_true(g.p[0].done);
    assert_int_equal(g.p[0].res.status, 0);
    assert_int_equal(g.p[0].res.n_averaged, 1);
    assert_memory_equal(g.p[0].buf, g.p[0].orig, g.n * sizeof(float));
    assert_int_equal(g.p[0].res.bytes_sent, 0);
    argrp_cleanup(&g);
}

/* A buffer smaller than one alignment unit per aggregator: some parts are
 * empty; nothing waits for them and the mean is still exact. */
static void test_tiny_buffer(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct argrp g;
    argrp_init(&g, 4, 300, frac, sends, listen, NULL);
    argrp_run(&g, NULL, -1, 0, 20000);
    argrp_check_exact(&g, 0xf);
    int empty = 0;
    for (size_t k = 0; k < g.p[0].res.n_parts; k++)
        empty += g.p[0].parts[k].len == 0;
    assert_true(empty >= 1);
    assert_true(g.p[0].res.ms_total < 5000);
    argrp_cleanup(&g);
}

static void test_client_and_aux(void **s)
{
    (void)s;
    /* 0,1: ordinary; 2: client mode (sends, cannot aggregate);
     * 3: aggregate-only auxiliary peer (no gradient, no buffer). */
    double frac[] = {1, 1, 0, 2};
    int sends[] = {1, 1, 1, 0}, listen[] = {1, 1, 0, 1};
    struct argrp g;
    argrp_init(&g, 4, 40000, frac, sends, listen, NULL);
    argrp_run(&g, NULL, -1, 0, 20000);
    argrp_check_exact(&g, argrp_senders(&g));
    struct argrp_peer *aux = &g.p[3];
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
    argrp_cleanup(&g);
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
    struct argrp g;
    argrp_init(&g, 5, 50000, frac, sends, listen, NULL);
    argrp_run(&g, NULL, -1, 0, 20000);
    argrp_check_exact(&g, 0x7); /* the mean of members 0-2 only, on all five */
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
    argrp_cleanup(&g);
}

static void test_bad_config(void **s)
{
    (void)s;
    double frac[] = {1, 1};
    int sends[] = {1, 1}, listen[] = {1, 1};
    struct argrp g;
    argrp_init(&g, 2, 1000, frac, sends, listen, NULL);
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
    argrp_cleanup(&g);
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
    struct argrp g;
    argrp_init(&g, 3, 12345, frac, sends, listen, NULL);
    for (int step = 0; step < 3; step++) {
        g.base.step = 100 + (uint64_t)step;
        for (size_t i = 0; i < 3; i++) {
            struct argrp_peer *p = &g.p[i];
            p->done = p->started = 0;
            g.w[i] = 1 + step + (double)i;
            for (size_t j = 0; j < g.n; j++)
                p->buf[j] = (float)((argrp_urand() * 2 - 1) * (1 + step));
            memcpy(p->orig, p->buf, g.n * sizeof(float));
        }
        argrp_run(&g, NULL, -1, 0, 20000);
        argrp_check_exact(&g, 0x7);
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
    assert_int_equal(argrp_start(&g, 0), CM_EEXISTS);
    argrp_cleanup(&g);
}

/* Members start at different times: early data is refused with "not
 * started" and retried until the aggregator starts. */
static void run_comp(int comp, int in_place)
{
    double frac[] = {1, 2, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct argrp g;
    argrp_in_place = in_place;
    argrp_init(&g, 4, 50000, frac, sends, listen, NULL);
    argrp_in_place = 0;
    g.base.comp = comp;
    argrp_run(&g, NULL, -1, 0, 20000);
    const uint64_t all = 0xf;
    for (size_t i = 0; i < 4; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_int_equal(p->res.status, 0);
        assert_int_equal(p->res.n_averaged, 4);
        argrp_assert_identical(&g, p);
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
                amax = fmax(amax, fabs(argrp_mean_at(&g, all, j, NULL)));
            }
            for (size_t j = blk; j < end; j++) {
                double want = argrp_mean_at(&g, all, j, NULL), err = fabs(p->buf[j] - want), bound;
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
    argrp_cleanup(&g);
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
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
