/* Unit tests for common/sched/sched_lp.c: the four special cases of seed
 * 000_02cc6b5d62a616fc.txt §3.2 (all-reduce, parameter server, BytePS;
 * the fourth, m = 2, is in test_sched_group.c), client mode, determinism,
 * bad input, and the LP optimum checked against an independent computation:
 * the O(n^3) form of (5) (constraint (4) written out for every i, j, k, no
 * auxiliary variables) solved by a dense textbook simplex written here, plus
 * an exhaustive search over every binary role assignment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "sched/sched.h"
#include "sched/sched_internal.h"

#define G_RESNET50 (25557032.0 * 32 / 1e6) /* ResNet-50 fp32 gradient, Mbit (bench/dedloc_table1.json) */

static void peer_set(struct sched_peer *p, int id, double s, double up, double down, int inbound)
{
    memset(p, 0, sizeof *p);
    p->key[0] = (uint8_t)id;
    p->key[1] = (uint8_t)(id >> 8);
    p->key[31] = 0x5a;
    p->samples_per_s = s;
    p->up_mbps = up;
    p->down_mbps = down;
    p->inbound = inbound;
}

static void solve_ok(struct sched_peer *pp, size_t n, double B, double G, struct sched_solution *s)
{
    struct sched_problem p = {pp, n, B, G};
    char err[256] = "";
    int rc = sched_solve(&p, s, err, sizeof err);
    if (rc != CM_OK)
        fail_msg("sched_solve: %s (%s)", cm_strerror(rc), err);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += s->peers[i].share;
    assert_int_equal(total, SCHED_SHARE_TOTAL);
    assert_true(s->steps_per_s <= s->xi * (1 + 1e-6));
}

/* §3.2 case 1: homogeneous reliable peers -> all-reduce with even parts. */
static void test_homogeneous_allreduce(void **state)
{
    (void)state;
    struct sched_peer pp[16];
    for (size_t n = 3; n <= 16; n = n < 4 ? 4 : n * 2) {
        for (size_t i = 0; i < n; i++)
            peer_set(&pp[i], (int)i + 1, 100, 1000, 1000, 1);
        struct sched_solution s;
        solve_ok(pp, n, 4096, G_RESNET50, &s);
        for (size_t i = 0; i < n; i++) {
            assert_true(s.peers[i].compute);
            /* even parts: 1e9 / n, up to the one unit of rounding */
            long d = (long)s.peers[i].share - (long)(SCHED_SHARE_TOTAL / n);
            if (labs(d) > 1)
                fail_msg("n=%zu peer %zu share %u, expected %u", n, i, s.peers[i].share,
                         SCHED_SHARE_TOTAL / (unsigned)n);
        }
        /* all-reduce bound: each peer sends and receives (n-1)/n of the gradient twice */
        double ar = (double)n * 1000 / (2.0 * (double)(n - 1)) / G_RESNET50;
        assert_true(fabs(s.network_rate - ar) < 1e-6 * ar);
        assert_true(fabs(s.steps_per_s - fmin(ar, n * 100 / 4096.0)) < 1e-6);
        sched_solution_cleanup(&s);
    }
}

/* §3.2 case 2: one very high-bandwidth peer without compute -> parameter server. */
static void test_parameter_server(void **state)
{
    (void)state;
    struct sched_peer pp[9];
    for (int i = 0; i < 8; i++)
        peer_set(&pp[i], i + 1, 100, 1000, 1000, 1);
    peer_set(&pp[8], 99, 0, 10000, 10000, 1);
    struct sched_solution s;
    solve_ok(pp, 9, 4096, G_RESNET50, &s);
    assert_int_equal(s.peers[8].share, SCHED_SHARE_TOTAL);
    assert_false(s.peers[8].compute);
    for (int i = 0; i < 8; i++) {
        assert_true(s.peers[i].compute);
        assert_int_equal(s.peers[i].share, 0);
    }
    /* Workers are limited by their own 1 Gbit/s: one gradient up, one down per step. */
    assert_true(fabs(s.network_rate - 1000 / G_RESNET50) < 1e-6);
    sched_solution_cleanup(&s);

    /* Setup D of seed Table 1 (bench/dedloc_table1.json): 16 x 0.2 Gbit/s + one 2.5 Gbit/s
     * peer without GPU. The 2.5 Gbit/s peer cannot carry everyone alone, but takes the
     * largest part by far. */
    struct sched_peer d[17];
    for (int i = 0; i < 16; i++)
        peer_set(&d[i], i + 1, 100, 200, 200, 1);
    peer_set(&d[16], 99, 0, 2500, 2500, 1);
    solve_ok(d, 17, 4096, G_RESNET50, &s);
    assert_false(s.peers[16].compute);
    assert_true(s.peers[16].share > SCHED_SHARE_TOTAL / 2);
    for (int i = 0; i < 16; i++)
        assert_true(s.peers[i].share < s.peers[16].share / 8);
    /* Better than the pure parameter server (2500/16 Mbit/s per worker) and than all-reduce. */
    assert_true(s.steps_per_s > 2500.0 / 16 / G_RESNET50);
    assert_true(s.steps_per_s > 16 * 200 / 30.0 / G_RESNET50);
    double searched = s.steps_per_s;
    sched_solution_cleanup(&s);
    /* Every GPU peer computing (no role search): still a parameter server, not faster. */
    struct sched_problem all = {d, 17, 4096, G_RESNET50, 1};
    char err[256];
    assert_int_equal(sched_solve(&all, &s, err, sizeof err), CM_OK);
    for (int i = 0; i < 16; i++)
        assert_true(s.peers[i].compute);
    assert_true(s.peers[16].share > SCHED_SHARE_TOTAL / 2);
    assert_true(s.steps_per_s <= searched * (1 + 1e-9));
    assert_true(s.network_rate > 2500.0 / 16 / G_RESNET50);
    sched_solution_cleanup(&s);
}

/* §3.2 case 3: peers with the same bandwidth but no accelerator -> BytePS-style
 * aggregators, the GPU peers only send and receive. */
static void test_byteps(void **state)
{
    (void)state;
    struct sched_peer pp[16];
    for (int i = 0; i < 8; i++)
        peer_set(&pp[i], i + 1, 100, 1000, 1000, 1);
    for (int i = 8; i < 16; i++)
        peer_set(&pp[i], i + 1, 0, 1000, 1000, 1);
    struct sched_solution s;
    solve_ok(pp, 16, 4096, G_RESNET50, &s);
    for (int i = 0; i < 8; i++) {
        assert_true(s.peers[i].compute);
        assert_int_equal(s.peers[i].share, 0);
    }
    for (int i = 8; i < 16; i++) {
        assert_false(s.peers[i].compute);
        assert_true(labs((long)s.peers[i].share - (long)(SCHED_SHARE_TOTAL / 8)) <= 1);
    }
    /* Twice the all-reduce rate of the 8 GPU peers alone. */
    assert_true(fabs(s.network_rate - 1000 / G_RESNET50) < 1e-6);
    sched_solution_cleanup(&s);
}

/* Client-mode peers (no inbound connections) never aggregate; their gradients still count. */
static void test_client_mode(void **state)
{
    (void)state;
    struct sched_peer pp[6];
    for (int i = 0; i < 6; i++)
        peer_set(&pp[i], i + 1, 100, 1000, 1000, i % 2);
    struct sched_solution s;
    solve_ok(pp, 6, 4096, G_RESNET50, &s);
    for (int i = 0; i < 6; i++) {
        assert_true(s.peers[i].compute);
        if (i % 2 == 0)
            assert_int_equal(s.peers[i].share, 0);
        else
            assert_true(labs((long)s.peers[i].share - (long)(SCHED_SHARE_TOTAL / 3)) <= 1);
    }
    sched_solution_cleanup(&s);
}

/* Measured pair throughput t_ij limits a pair: a slow link to one aggregator shrinks its part. */
static void test_pair_limits(void **state)
{
    (void)state;
    struct sched_peer pp[4];
    struct sched_link slow[] = {{3, 20}};
    for (int i = 0; i < 4; i++)
        peer_set(&pp[i], i + 1, 1000, 1000, 1000, 1);
    pp[0].links = slow; /* peer 0 -> peer 3 runs at 20 Mbit/s */
    pp[0].nlinks = 1;
    struct sched_solution s;
    solve_ok(pp, 4, 16384, G_RESNET50, &s); /* compute-bound: everyone computes */
    for (int i = 0; i < 4; i++)
        assert_true(s.peers[i].compute);
    assert_true(s.peers[3].share < s.peers[1].share);
    assert_true(s.peers[0].up_used_mbps <= 1000 * (1 + 1e-6));
    sched_solution_cleanup(&s);
}

/* The best network rate reached on a face: a client-mode GPU peer at
 * 10 Mbit/s and two no-GPU aggregators, one at 100 and one at 5 Mbit/s.
 * Every split with the slow one taking 0-50 % moves the gradient at the
 * client's 10 Mbit/s; the plan must be the one that leaves the slow link
 * out (the second stage in sched_roles.c), whatever the peers' order. */
static void test_tie_prefers_fast_aggregator(void **state)
{
    (void)state;
    for (int order = 0; order < 2; order++) {
        struct sched_peer pp[3];
        int fast = order ? 2 : 1, slow = order ? 1 : 2;
        peer_set(&pp[0], 1, 100, 10, 10, 0);
        peer_set(&pp[fast], 2, 0, 100, 100, 1);
        peer_set(&pp[slow], 3, 0, 5, 5, 1);
        struct sched_solution s;
        solve_ok(pp, 3, 64, 10, &s);
        assert_true(fabs(s.network_rate - 1.0) < 1e-9); /* 10 Mbit/s / 10 Mbit */
        assert_int_equal(s.peers[fast].share, SCHED_SHARE_TOTAL);
        assert_int_equal(s.peers[slow].share, 0);
        assert_int_equal(s.peers[0].share, 0);
        sched_solution_cleanup(&s);
    }
}

/* Third stage: equal aggregators get equal parts. Setup C of the seed's
 * Table 1 (8 GPU peers at 1 Gbit/s, 16 at 200 Mbit/s, everyone sending):
 * the slow peers' links are full with their own gradient and its average,
 * so only the fast ones aggregate; any split among them reaches the same
 * rate, and the second stage's costs are equal for them too. GLPK's vertex
 * gave five 18 % and one 9 % (their uploads at 99 %, two peers idle); the
 * balancing stage gives each 1/8. */
static void test_tie_spreads_equal_aggregators(void **state)
{
    (void)state;
    struct sched_peer pp[24];
    for (int i = 0; i < 24; i++)
        peer_set(&pp[i], i + 1, 1e6, i < 8 ? 1000 : 200, i < 8 ? 1000 : 200, 1);
    struct sched_problem p = {pp, 24, 4096, 25557032.0 * 32 / 1e6, 1};
    struct sched_solution s;
    char err[256];
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_OK);
    for (int i = 0; i < 24; i++) {
        assert_true(s.peers[i].compute);
        if (i < 8)
            assert_true(fabs(s.peers[i].fraction - 0.125) < 1e-6);
        else
            assert_int_equal(s.peers[i].share, 0);
    }
    /* the rate is the slow peers' bound: their gradient out and back */
    assert_true(fabs(s.network_rate - 200 / p.gradient_mbit) < 1e-6 * s.network_rate);
    sched_solution_cleanup(&s);
}

/* role_gain: a peer stops computing only for that much more throughput.
 * Four GPU peers at 100/100 Mbit/s and one with 100 down but 20 Mbit/s up:
 * its sending holds every aggregator back, so the exact optimum (gain 0)
 * stops it (network-bound, it keeps a single sender: 4.25x the steps/s of
 * everyone computing); at role_gain 0.05 it still stops, at 10 (more than
 * any gain here) everyone computes, as with all_compute; a bad threshold
 * is refused. */
static void test_role_gain(void **state)
{
    (void)state;
    struct sched_peer pp[5];
    for (int i = 0; i < 4; i++)
        peer_set(&pp[i], i + 1, 1000, 100, 100, 1);
    peer_set(&pp[4], 5, 1000, 20, 100, 1);
    struct sched_problem p = {pp, 5, 64, 10};
    struct sched_solution s;
    char err[256];
    p.all_compute = 1;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_OK);
    double all_on = s.steps_per_s;
    sched_solution_cleanup(&s);
    p.all_compute = 0;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_OK);
    double gain = s.steps_per_s / all_on - 1;
    assert_false(s.peers[4].compute);
    sched_solution_cleanup(&s);
    assert_true(gain > SCHED_ROLE_GAIN && gain < 10);
    p.role_gain = SCHED_ROLE_GAIN;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_OK);
    assert_false(s.peers[4].compute);
    assert_true(s.steps_per_s > all_on * (1 + SCHED_ROLE_GAIN));
    sched_solution_cleanup(&s);
    p.role_gain = 10;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_OK);
    for (int i = 0; i < 5; i++)
        assert_true(s.peers[i].compute);
    assert_true(fabs(s.steps_per_s - all_on) <= 1e-9 * all_on);
    sched_solution_cleanup(&s);
    p.role_gain = -0.1;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_ERANGE);
    p.role_gain = NAN;
    assert_int_equal(sched_solve(&p, &s, err, sizeof err), CM_ERANGE);
}

static void test_deterministic(void **state)
{
    (void)state;
    struct sched_peer pp[24];
    for (int i = 0; i < 24; i++) /* setup C: 8 x 1 Gbit/s + 16 x 0.2 Gbit/s */
        peer_set(&pp[i], i + 1, 100, i < 8 ? 1000 : 200, i < 8 ? 1000 : 200, 1);
    struct sched_solution a, b;
    solve_ok(pp, 24, 4096, G_RESNET50, &a);
    solve_ok(pp, 24, 4096, G_RESNET50, &b);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(&a.xi, &b.xi, sizeof a.xi);
    assert_memory_equal(&a.steps_per_s, &b.steps_per_s, sizeof a.steps_per_s);
    for (size_t i = 0; i < a.n; i++) {
        assert_int_equal(a.peers[i].share, b.peers[i].share);
        assert_memory_equal(&a.peers[i].fraction, &b.peers[i].fraction, sizeof(double));
        assert_int_equal(a.peers[i].compute, b.peers[i].compute);
    }
    /* The 1 Gbit/s peers carry most of the aggregation (seed §4.1, setup C). */
    uint64_t fast = 0;
    for (int i = 0; i < 8; i++)
        fast += a.peers[i].share;
    assert_true(fast > SCHED_SHARE_TOTAL / 2);
    sched_solution_cleanup(&a);
    sched_solution_cleanup(&b);
}

static void expect_bad(struct sched_peer *pp, size_t n, double B, double G, int code,
                       const char *needle)
{
    struct sched_problem p = {pp, n, B, G};
    struct sched_solution s;
    char err[256] = "";
    int rc = sched_solve(&p, &s, err, sizeof err);
    if (rc != code)
        fail_msg("expected %s, got %s (%s)", cm_err_name(code), cm_err_name(rc), err);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
    assert_null(s.peers);
}

static void test_bad_input(void **state)
{
    (void)state;
    struct sched_peer pp[3];
    for (int i = 0; i < 3; i++)
        peer_set(&pp[i], i + 1, 100, 1000, 1000, 1);
    expect_bad(pp, 0, 4096, 100, CM_EINVAL, "no peers");
    expect_bad(pp, SCHED_MAX_PEERS + 1, 4096, 100, CM_ETOOBIG, "at most");
    expect_bad(pp, 3, NAN, 100, CM_ENUMERIC, "finite");
    expect_bad(pp, 3, 4096, -1, CM_ERANGE, "gradient size");
    expect_bad(pp, 3, 0, 100, CM_ERANGE, "batch");
    pp[1].up_mbps = NAN;
    expect_bad(pp, 3, 4096, 100, CM_ENUMERIC, "peer 1: upload");
    pp[1].up_mbps = -5;
    expect_bad(pp, 3, 4096, 100, CM_ERANGE, "peer 1: upload");
    pp[1].up_mbps = 1000;
    pp[2].down_mbps = 0;
    expect_bad(pp, 3, 4096, 100, CM_ERANGE, "peer 2: download");
    pp[2].down_mbps = 1000;
    pp[0].samples_per_s = INFINITY;
    expect_bad(pp, 3, 4096, 100, CM_ENUMERIC, "samples");
    pp[0].samples_per_s = -1;
    expect_bad(pp, 3, 4096, 100, CM_ERANGE, "samples");
    pp[0].samples_per_s = 100;
    struct sched_link self[] = {{0, 100}}, unknown[] = {{7, 100}}, neg[] = {{1, -1}};
    pp[0].links = self;
    pp[0].nlinks = 1;
    expect_bad(pp, 3, 4096, 100, CM_EINVAL, "itself");
    pp[0].links = unknown;
    expect_bad(pp, 3, 4096, 100, CM_EINVAL, "unknown");
    pp[0].links = neg;
    expect_bad(pp, 3, 4096, 100, CM_ERANGE, "pair");
    pp[0].nlinks = SCHED_MAX_LINKS + 1;
    expect_bad(pp, 3, 4096, 100, CM_ETOOBIG, "pair throughputs");
    pp[0].nlinks = 0;
    pp[0].links = NULL;
    pp[2].key[0] = pp[1].key[0];
    expect_bad(pp, 3, 4096, 100, CM_EINVAL, "same public key");
    pp[2].key[0] = 3;
    for (int i = 0; i < 3; i++)
        pp[i].samples_per_s = 0;
    expect_bad(pp, 3, 4096, 100, CM_EINVAL, "compute");
    for (int i = 0; i < 3; i++) {
        pp[i].samples_per_s = 10;
        pp[i].inbound = 0;
    }
    expect_bad(pp, 3, 4096, 100, CM_EINVAL, "inbound");
    for (int i = 0; i < 3; i++)
        pp[i].inbound = 1;
    /* relays: itself, unknown, a client-mode peer, a relayed peer */
    uint32_t bad_relay[][3] = {{0, 2, 0}, {0, 4, 0}, {0, 3, 0}, {0, 3, 2}};
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 3; i++)
            pp[i].relay = bad_relay[k][i];
        pp[2].inbound = k != 2;
        expect_bad(pp, 3, 4096, 100, CM_EINVAL, "relay");
    }
    for (int i = 0; i < 3; i++)
        pp[i].relay = 0;
    pp[2].inbound = 1;
    pp[1].relay_direct = 1.5;
    expect_bad(pp, 3, 4096, 100, CM_ERANGE, "relay_direct");
    pp[1].relay_direct = NAN;
    expect_bad(pp, 3, 4096, 100, CM_ENUMERIC, "relay_direct");
    pp[1].relay_direct = 0;
    struct sched_solution s;
    assert_int_equal(sched_solve(NULL, &s, NULL, 0), CM_EINVAL);
}

/* A relayed peer (seed 000 §3.3): its traffic with anyone but its relay
 * crosses the relay's link twice. Three peers of 100 Mbit/s both ways,
 * network-bound, gradient 1 Mbit: all-reduce does 75 steps/s (4 h <= 100
 * per peer, h = 25). With peer 1 relayed by peer 0 the relay's rows gain
 * T = 2 (h_1 + h_2): 2 h_0 + 3 (h_1 + h_2) <= 100, so the best plan is the
 * relay aggregating everything, 50 steps/s; both of its links full. */
/* Every peer computes (sched_problem.all_compute), compute never binds. */
static void solve_all(struct sched_peer *pp, size_t n, struct sched_solution *s)
{
    struct sched_problem p = {pp, n, 1, 1, 1, 0};
    char err[256] = "";
    int rc = sched_solve(&p, s, err, sizeof err);
    if (rc != CM_OK)
        fail_msg("sched_solve: %s (%s)", cm_strerror(rc), err);
}

static void test_relayed_peer(void **state)
{
    (void)state;
    struct sched_peer pp[3];
    for (int i = 0; i < 3; i++)
        peer_set(&pp[i], i + 1, 1e6, 100, 100, 1);
    struct sched_solution s;
    solve_all(pp, 3, &s);
    if (fabs(s.network_rate - 75) >= 1e-6)
        fail_msg("network rate %.9g, xi %.9g", s.network_rate, s.xi);
    sched_solution_cleanup(&s);
    pp[1].relay = 1;
    solve_all(pp, 3, &s);
    assert_true(fabs(s.network_rate - 50) < 1e-6);
    assert_int_equal(s.peers[0].share, SCHED_SHARE_TOTAL);
    assert_true(fabs(s.peers[0].up_used_mbps - 100) < 1e-6);
    assert_true(fabs(s.peers[0].down_used_mbps - 100) < 1e-6);
    sched_solution_cleanup(&s);
    /* two peers only: all the relayed peer's traffic is with its relay, and
       crosses its link once, as without the relay */
    /* three quarters of its traffic through punched holes: a quarter
       crosses the relay (with half, 2 h_0 + 2 (h_1 + h_2) <= 100 still caps
       it at 50); all of it: as without a relay */
    pp[1].relay_direct = 0.75;
    solve_all(pp, 3, &s);
    assert_true(s.network_rate > 50 + 1e-6 && s.network_rate < 75 - 1e-6);
    sched_solution_cleanup(&s);
    pp[1].relay_direct = 1;
    solve_all(pp, 3, &s);
    assert_true(fabs(s.network_rate - 75) < 1e-6);
    sched_solution_cleanup(&s);
    pp[1].relay_direct = 0;
    pp[1].relay = 0;
    solve_all(pp, 2, &s);
    double alone = s.network_rate;
    sched_solution_cleanup(&s);
    pp[1].relay = 1;
    solve_all(pp, 2, &s);
    assert_true(fabs(s.network_rate - alone) < 1e-6 * alone);
    sched_solution_cleanup(&s);
}

/* ---- Independent check: a dense simplex over the O(n^3) formulation. ---- */

/* max c^T x s.t. A x <= b, x >= 0, with b >= 0 (the origin is feasible, so no
 * phase 1). Bland's rule, so it cannot cycle. A is m x nv, row-major. */
static double dense_simplex(int m, int nv, const double *A, const double *b, const double *c,
                            double *x)
{
    int w = nv + m + 1;
    double *T = calloc((size_t)(m + 1) * w, sizeof *T);
    int *basis = calloc((size_t)m, sizeof *basis);
    assert_non_null(T);
    assert_non_null(basis);
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < nv; j++)
            T[i * w + j] = A[i * nv + j];
        T[i * w + nv + i] = 1;
        T[i * w + w - 1] = b[i];
        basis[i] = nv + i;
    }
    for (int j = 0; j < nv; j++)
        T[m * w + j] = -c[j];
    for (int iter = 0; iter < 100000; iter++) {
        int e = -1;
        for (int j = 0; j < nv + m; j++)
            if (T[m * w + j] < -1e-12) {
                e = j;
                break;
            }
        if (e < 0)
            break;
        int l = -1;
        double best = INFINITY;
        for (int i = 0; i < m; i++) {
            double a = T[i * w + e];
            if (a > 1e-12) {
                double r = T[i * w + w - 1] / a;
                if (r < best - 1e-15 || (fabs(r - best) <= 1e-15 && l >= 0 && basis[i] < basis[l])) {
                    best = r;
                    l = i;
                }
            }
        }
        assert_true(l >= 0); /* our LPs are bounded */
        double piv = T[l * w + e];
        for (int j = 0; j < w; j++)
            T[l * w + j] /= piv;
        for (int i = 0; i <= m; i++) {
            if (i == l || T[i * w + e] == 0)
                continue;
            double f = T[i * w + e];
            for (int j = 0; j < w; j++)
                T[i * w + j] -= f * T[l * w + j];
        }
        basis[l] = e;
    }
    if (x) {
        memset(x, 0, (size_t)nv * sizeof *x);
        for (int i = 0; i < m; i++)
            if (basis[i] < nv)
                x[basis[i]] = T[i * w + w - 1];
    }
    double opt = T[m * w + w - 1];
    free(T);
    free(basis);
    return opt;
}

/* Problem (5) with (4) written out for all i, j, k, in the units of the
 * library (rates / G). fixed: NULL for 0 <= c <= 1, else c_i = fixed[i]. */
static double reference_optimum(const struct sched_peer *pp, int n, double B, double G,
                                const int *fixed)
{
    enum { MAXV = 512, MAXR = 1536 };
    int xi = 0, nv = 1, cI[10], aI[10][10], gI[10][10], hI[10];
    double total = 0;
    for (int i = 0; i < n; i++)
        total += pp[i].samples_per_s / B;
    for (int i = 0; i < n; i++) {
        cI[i] = (pp[i].samples_per_s > 0 && !fixed) ? nv++ : -1;
        hI[i] = pp[i].inbound ? nv++ : -1;
        for (int j = 0; j < n; j++) {
            gI[i][j] = (pp[i].inbound && pp[j].samples_per_s > 0) ? nv++ : -1;
            aI[j][i] = (pp[i].inbound && j != i && pp[j].samples_per_s > 0) ? nv++ : -1;
        }
    }
    assert_true(nv <= MAXV);
    double *A = calloc((size_t)MAXR * nv, sizeof *A), b[MAXR], c[MAXV] = {0};
    assert_non_null(A);
    int m = 0;
#define ROW(rhs) (assert_true(m < MAXR), b[m] = (rhs), &A[(size_t)(m++) * nv])
    double *r = ROW(0); /* xi <= sum s c / B */
    r[xi] = 1;
    for (int i = 0; i < n; i++) {
        if (pp[i].samples_per_s <= 0)
            continue;
        if (fixed)
            b[m - 1] += fixed[i] * pp[i].samples_per_s / B;
        else
            r[cI[i]] = -pp[i].samples_per_s / B;
    }
    r = ROW(0); /* xi <= sum h */
    r[xi] = 1;
    for (int i = 0; i < n; i++)
        if (hI[i] >= 0)
            r[hI[i]] = -1;
    for (int i = 0; i < n; i++) {
        if (cI[i] >= 0)
            ROW(1)[cI[i]] = 1;
        if (hI[i] < 0)
            continue;
        double Mi = fmax(pp[i].up_mbps / G, total);
        for (int j = 0; j < n; j++) {
            if (gI[i][j] < 0)
                continue;
            r = ROW(0); /* h_i <= g_ij */
            r[hI[i]] = 1;
            r[gI[i][j]] = -1;
            ROW(Mi)[gI[i][j]] = 1; /* g_ij <= M_i */
            for (int k = 0; k < n; k++) {
                if (aI[k][i] < 0)
                    continue;
                /* (4): g_ij <= a_ki + (1 - c_k) M_i */
                if (fixed) {
                    r = ROW((1 - fixed[k]) * Mi);
                } else {
                    r = ROW(Mi);
                    r[cI[k]] = Mi;
                }
                r[gI[i][j]] = 1;
                r[aI[k][i]] = -1;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        double *d = ROW(pp[i].down_mbps / G), *u = ROW(pp[i].up_mbps / G);
        for (int j = 0; j < n; j++) {
            if (j == i)
                continue;
            if (aI[j][i] >= 0)
                d[aI[j][i]] = 1;
            if (gI[j][i] >= 0)
                d[gI[j][i]] = 1;
            if (aI[i][j] >= 0)
                u[aI[i][j]] = 1;
            if (gI[i][j] >= 0)
                u[gI[i][j]] = 1;
        }
        for (size_t l = 0; l < pp[i].nlinks; l++) {
            int j = (int)pp[i].links[l].to;
            r = ROW(pp[i].links[l].mbps / G);
            if (aI[i][j] >= 0)
                r[aI[i][j]] = 1;
            if (gI[i][j] >= 0)
                r[gI[i][j]] = 1;
        }
    }
#undef ROW
    assert_true(m <= MAXR);
    c[xi] = 1;
    double opt = dense_simplex(m, nv, A, b, c, NULL);
    free(A);
    return opt;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void test_independent_optimum(void **state)
{
    (void)state;
    int checked = 0;
    for (int trial = 0; trial < 60; trial++) {
        int n = 2 + trial % 3;
        struct sched_peer pp[4];
        struct sched_link links[4][2];
        int any_s = 0, any_in = 0;
        for (int i = 0; i < n; i++) {
            double s = urand() < 0.25 ? 0 : 10 + 990 * urand();
            int inbound = urand() < 0.8;
            peer_set(&pp[i], i + 1, s, 10 + 2000 * urand(), 10 + 2000 * urand(), inbound);
            any_s |= s > 0;
            any_in |= inbound;
            if (urand() < 0.3) {
                links[i][0].to = (uint32_t)((i + 1) % n);
                links[i][0].mbps = 5 + 500 * urand();
                pp[i].links = links[i];
                pp[i].nlinks = 1;
            }
        }
        if (!any_s || !any_in)
            continue;
        double B = 256 + 4096 * urand(), G = 50 + 800 * urand();
        struct sched_solution s;
        solve_ok(pp, (size_t)n, B, G, &s);
        /* The relaxation (5): GLPK on the O(n^2) model vs the dense simplex on O(n^3). */
        double ref = reference_optimum(pp, n, B, G, NULL);
        if (fabs(s.xi - ref) > 1e-6 * fmax(1, ref))
            fail_msg("trial %d (n=%d): GLPK xi %.12g, reference %.12g", trial, n, s.xi, ref);
        /* Roles: exhaustive over every binary c. The plan is the exact optimum for its
         * own roles, never above the best binary assignment, and reaches it here. */
        double best = 0;
        int on[4], mine[4];
        for (int i = 0; i < n; i++)
            mine[i] = s.peers[i].compute;
        for (int mask = 0; mask < (1 << n); mask++) {
            int valid = 1;
            for (int i = 0; i < n; i++) {
                on[i] = (mask >> i) & 1;
                if (on[i] && pp[i].samples_per_s <= 0)
                    valid = 0;
            }
            if (valid)
                best = fmax(best, reference_optimum(pp, n, B, G, on));
        }
        double own = reference_optimum(pp, n, B, G, mine);
        if (fabs(s.steps_per_s - own) > 1e-6 * fmax(1, own))
            fail_msg("trial %d: plan %.12g, reference for its roles %.12g", trial,
                     s.steps_per_s, own);
        assert_true(best <= ref * (1 + 1e-9) + 1e-12);
        if (s.steps_per_s < best * (1 - 1e-6))
            fail_msg("trial %d (n=%d): plan %.12g below the best binary roles %.12g", trial, n,
                     s.steps_per_s, best);
        sched_solution_cleanup(&s);
        checked++;
    }
    assert_true(checked >= 40);

    /* Beyond 8 capable peers the roles come from a heuristic search: check the
     * relaxation, the plan's exactness for its roles, and that it beats every peer computing. */
    for (int trial = 0; trial < 4; trial++) {
        const int n = 10;
        struct sched_peer pp[10];
        for (int i = 0; i < n; i++)
            peer_set(&pp[i], i + 1, 10 + 990 * urand(), 10 + 2000 * urand(),
                     10 + 2000 * urand(), i != 3);
        double B = 256 + 4096 * urand(), G = 50 + 800 * urand();
        struct sched_solution s;
        solve_ok(pp, n, B, G, &s);
        double ref = reference_optimum(pp, n, B, G, NULL);
        if (fabs(s.xi - ref) > 1e-6 * fmax(1, ref))
            fail_msg("n=10 trial %d: GLPK xi %.12g, reference %.12g", trial, s.xi, ref);
        int mine[10], all[10];
        for (int i = 0; i < n; i++) {
            mine[i] = s.peers[i].compute;
            all[i] = 1;
        }
        double own = reference_optimum(pp, n, B, G, mine);
        double every = reference_optimum(pp, n, B, G, all);
        if (fabs(s.steps_per_s - own) > 1e-6 * fmax(1, own))
            fail_msg("n=10 trial %d: plan %.12g, reference for its roles %.12g", trial,
                     s.steps_per_s, own);
        assert_true(s.steps_per_s >= every * (1 - 1e-6));
        sched_solution_cleanup(&s);
    }
}

/* The role search re-solves its fixed-role LPs warm, rewriting rows of one
 * GLPK problem (sched_roles.c); each value must equal a cold build and solve
 * of the same roles, along a sequence of single flips and random jumps. */
static void test_warm_matches_cold(void **state)
{
    (void)state;
    enum { N = 40 };
    static struct sched_peer pp[N];
    static struct sched_link links[N][4];
    double scale_s[N], M[N], *tmin = malloc(sizeof(double) * N * N);
    unsigned char on[N];
    assert_non_null(tmin);
    for (int trial = 0; trial < 6; trial++) {
        int n = 8 + trial * 6;
        double G = 100 + 900 * urand(), B = 1024, total = 0;
        for (int i = 0; i < n; i++) {
            double s = urand() < 0.2 ? 0 : 10 + 290 * urand();
            peer_set(&pp[i], i + 1, s, 20 + 980 * urand(), 20 + 980 * urand(), urand() < 0.8);
            for (int l = 0; l < 3; l++) {
                links[i][l].to = (uint32_t)((i + 1 + l * 3) % n);
                links[i][l].mbps = 10 + 500 * urand();
            }
            pp[i].links = links[i];
            pp[i].nlinks = 3;
        }
        pp[0].inbound = 1;
        pp[0].samples_per_s = 100;
        /* from the second trial on, some peers relayed by peers 0-2 */
        for (int i = 0; i < 3; i++)
            pp[i].inbound = 1;
        for (int i = 3; trial > 0 && i < n; i++)
            if (urand() < 0.25) {
                pp[i].relay = (uint32_t)(1 + i % 3);
                pp[i].relay_direct = urand() < 0.5 ? 0 : urand();
            }
        for (int i = 0; i < n; i++) {
            scale_s[i] = pp[i].samples_per_s / B;
            total += scale_s[i];
        }
        for (int i = 0; i < n * n; i++)
            tmin[i] = INFINITY;
        for (int i = 0; i < n; i++) {
            M[i] = fmax(pp[i].up_mbps / G, total);
            for (size_t l = 0; l < pp[i].nlinks; l++) {
                size_t j = pp[i].links[l].to;
                tmin[i * n + j] = fmin(tmin[i * n + j], pp[i].links[l].mbps / G);
            }
        }
        struct sched_problem p = {pp, (size_t)n, B, G, 0};
        struct sched__ctx x = {&p, scale_s, M, tmin, 0, 0};
        struct sched__warm *w = NULL;
        assert_int_equal(sched__warm_new(&x, &w), CM_OK);
        for (int i = 0; i < n; i++)
            on[i] = pp[i].samples_per_s > 0;
        for (int step = 0; step < 40; step++) {
            if (step % 10 == 9) { /* a jump */
                for (int i = 0; i < n; i++)
                    on[i] = pp[i].samples_per_s > 0 && urand() < 0.5;
            } else { /* a flip */
                int k = (int)(urand() * n);
                if (pp[k].samples_per_s > 0)
                    on[k] ^= 1;
            }
            double warm = -1, cold = -1;
            assert_int_equal(sched__warm_eval(w, on, &warm), CM_OK);
            assert_int_equal(sched__roles_eval(&x, on, NULL, &cold), CM_OK);
            if (fabs(warm - cold) > 1e-9 * fmax(1, fabs(cold)))
                fail_msg("n=%d step %d: warm %.15g, cold %.15g", n, step, warm, cold);
        }
        sched__warm_free(w);
        /* the whole solve: no link over its capacity, relays' traffic
           counted, and relays never make the run faster */
        struct sched_solution s, s0;
        solve_ok(pp, (size_t)n, B, G, &s);
        for (int i = 0; i < n; i++)
            if (s.peers[i].up_used_mbps > pp[i].up_mbps * (1 + 1e-6) + 1e-9 ||
                s.peers[i].down_used_mbps > pp[i].down_mbps * (1 + 1e-6) + 1e-9)
                fail_msg("n=%d peer %d (relay %u): uses %g up of %g, %g down of %g", n, i, pp[i].relay,
                         s.peers[i].up_used_mbps, pp[i].up_mbps, s.peers[i].down_used_mbps, pp[i].down_mbps);
        for (int i = 0; i < n; i++) {
            pp[i].relay = 0;
            pp[i].relay_direct = 0;
        }
        solve_ok(pp, (size_t)n, B, G, &s0);
        assert_true(s.network_rate <= s0.network_rate * (1 + 1e-6));
        sched_solution_cleanup(&s);
        sched_solution_cleanup(&s0);
    }
    free(tmin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_homogeneous_allreduce),
        cmocka_unit_test(test_parameter_server),
        cmocka_unit_test(test_byteps),
        cmocka_unit_test(test_client_mode),
        cmocka_unit_test(test_pair_limits),
        cmocka_unit_test(test_tie_prefers_fast_aggregator),
        cmocka_unit_test(test_tie_spreads_equal_aggregators),
        cmocka_unit_test(test_role_gain),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_relayed_peer),
        cmocka_unit_test(test_independent_optimum),
        cmocka_unit_test(test_warm_matches_cold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
