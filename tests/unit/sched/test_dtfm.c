/* Unit tests for common/sched/dtfm_cost.c: DT-FM's cost model (seed
 * 003_f3537b728458fcc1.txt) on values computed by hand (§2's
 * symmetrization, eq. 2-4), its parts (bottleneck matching, open-loop TSP)
 * against brute force, the assignment a partition cost produces, the
 * compute term, 1F1B micro-batches, the tied embedding and the norms'
 * exchange. The search is in test_dtfm_search.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "sched/dtfm.h"
#include "sched/dtfm_int.h"
#include "tests/unit/sched/dtfm_testkit.h"

/* ---- 1. the cost model by hand ---- */

/* 2 stages x 2 replicas. act_bytes = 1e6 (8e6 bits), grad_bytes = 4e6
 * (8 * 4e6 / 2 replicas = 16e6 bits), so pp = 2 (a + 8e6/b) and
 * dp = 2 (a + 16e6/b). Symmetrized pairs (§2: mean delay, mean bandwidth):
 *   (0,1) a 0.1  b 16e6: pp 1.2  dp 2.2
 *   (0,2) a 0.2  b  8e6: pp 2.4  dp 4.4
 *   (0,3) a 0.05 b 32e6: pp 0.6  dp 1.1
 *   (1,2) a 0.1  b 32e6: pp 0.7  dp 1.2
 *   (1,3) 1->3: 0.1 s, 4e6; 3->1: 0.5 s, 12e6 -> a 0.3 b 8e6: pp 2.6 dp 4.6
 *   (2,3) a 0.25 b 16e6: pp 1.5  dp 2.5
 * With groups of two, eq. 2 is the pair's dp; eq. 3 is the better of the
 * two matchings' worse edge; eq. 4 with two groups is that one edge:
 *   {0,1}{2,3}: dp max(2.2, 2.5) = 2.5; pp min(max(2.4, 2.6), max(0.6, 0.7)) = 0.7; 3.2
 *   {0,2}{1,3}: dp max(4.4, 4.6) = 4.6; pp min(max(1.2, 1.5), max(0.6, 0.7)) = 0.7; 5.3
 *   {0,3}{1,2}: dp max(1.1, 1.2) = 1.2; pp min(max(1.2, 1.5), max(2.4, 2.6)) = 1.5; 2.7 */
static void hand_instance(struct inst *in)
{
    inst_alloc(in, 2, 2, 0);
    static const struct {
        int a, b;
        double dab, dba, bab, bba;
    } links[] = {
        {0, 1, 0.1, 0.1, 16e6, 16e6}, {0, 2, 0.2, 0.2, 8e6, 8e6},   {0, 3, 0.05, 0.05, 32e6, 32e6},
        {1, 2, 0.1, 0.1, 32e6, 32e6}, {1, 3, 0.1, 0.5, 4e6, 12e6}, {2, 3, 0.25, 0.25, 16e6, 16e6},
    };
    for (size_t k = 0; k < sizeof links / sizeof links[0]; k++) {
        in->delay[links[k].a * 4 + links[k].b] = links[k].dab;
        in->delay[links[k].b * 4 + links[k].a] = links[k].dba;
        in->bw[links[k].a * 4 + links[k].b] = links[k].bab;
        in->bw[links[k].b * 4 + links[k].a] = links[k].bba;
    }
    for (size_t d = 0; d < 4; d++) /* the diagonal is ignored, whatever it holds */
        in->bw[d * 4 + d] = d == 0 ? NAN : -1;
    in->p.act_bytes = 1e6;
    in->p.grad_bytes = 4e6;
    inst_model(in);
}

static void test_cost_by_hand(void **state)
{
    (void)state;
    struct inst in;
    hand_instance(&in);
    static const struct {
        uint16_t group[4];
        double dp, pp;
    } want[] = {
        {{0, 0, 1, 1}, 2.5, 0.7},
        {{0, 1, 0, 1}, 4.6, 0.7},
        {{0, 1, 1, 0}, 1.2, 1.5},
        {{1, 0, 0, 1}, 1.2, 1.5}, /* labels do not matter */
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        struct dtfm_cost c;
        uint32_t assign[4];
        assert_int_equal(dtfm_cost_partition(in.m, want[k].group, &c, assign), CM_OK);
        assert_close(c.dp, want[k].dp);
        assert_close(c.pp, want[k].pp);
        assert_close(c.compute, 0);
        assert_close(c.total, want[k].dp + want[k].pp);
        assert_int_equal(dtfm_assignment_check(in.m, assign), CM_OK);
    }
    /* {0,1}{2,3}'s assignment uses the matching 0-3, 1-2 (either direction). */
    struct dtfm_cost c;
    uint32_t assign[4];
    assert_int_equal(dtfm_cost_partition(in.m, want[0].group, &c, assign), CM_OK);
    for (size_t i = 0; i < 2; i++) {
        uint32_t x = assign[i * 2], y = assign[i * 2 + 1];
        assert_true((x ^ y) == 3); /* {0,3} or {1,2} */
    }

    /* An explicit assignment as it is (assign[i * stages + j]): replica 0
     * runs 1 then 3, replica 1 runs 0 then 2. Stage groups {1,0} (dp 2.2)
     * and {3,2} (dp 2.5); pipeline edges 1-3 (2.6, the asymmetric pair) and
     * 0-2 (2.4): pp 2.6, total 5.1. */
    static const uint32_t explicit_assign[4] = {1, 3, 0, 2};
    assert_int_equal(dtfm_cost_assignment(in.m, explicit_assign, &c), CM_OK);
    assert_close(c.dp, 2.5);
    assert_close(c.pp, 2.6);
    assert_close(c.compute, 0);
    assert_close(c.total, 5.1);
    inst_free(&in);
}

/* ---- 2. eq. 3, the bottleneck matching ---- */

static double match_max(const struct dtfm_model *m, const uint32_t *a, const uint32_t *b, const uint32_t *match)
{
    double worst = 0;
    for (size_t k = 0; k < m->replicas; k++)
        worst = fmax(worst, m->pp[(size_t)a[k] * m->n + b[match[k]]]);
    return worst;
}

/* The test's own matching (plain arrays, not bit sets): is there a perfect
 * matching of a to b using only edges of cost < t? */
static int kuhn(const struct dtfm_model *m, const uint32_t *a, const uint32_t *b, double t, size_t k,
                uint8_t *seen, int *mate)
{
    for (size_t l = 0; l < m->replicas; l++) {
        if (seen[l] || !(m->pp[(size_t)a[k] * m->n + b[l]] < t))
            continue;
        seen[l] = 1;
        if (mate[l] < 0 || kuhn(m, a, b, t, (size_t)mate[l], seen, mate)) {
            mate[l] = (int)k;
            return 1;
        }
    }
    return 0;
}

static int matching_below(const struct dtfm_model *m, const uint32_t *a, const uint32_t *b, double t)
{
    int mate[DTFM_MAX_REPLICAS];
    for (size_t l = 0; l < m->replicas; l++)
        mate[l] = -1;
    for (size_t k = 0; k < m->replicas; k++) {
        uint8_t seen[DTFM_MAX_REPLICAS] = {0};
        if (!kuhn(m, a, b, t, k, seen, mate))
            return 0;
    }
    return 1;
}

static void test_bottleneck_brute_force(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed0003;
    static const size_t big[] = {7, 8, 13, 32, 63, 64};
    for (size_t r = 1; r <= 6 + sizeof big / sizeof big[0]; r++) {
        size_t rr = r <= 6 ? r : big[r - 7];
        for (int trial = 0; trial < (rr <= 6 ? 40 : 4); trial++) {
            struct inst in;
            inst_random(&in, 3, rr, 0, trial & 1, &rng);
            /* two disjoint random groups out of 3 x rr devices */
            uint32_t dev[3 * DTFM_MAX_REPLICAS], match[DTFM_MAX_REPLICAS];
            for (size_t d = 0; d < in.n; d++)
                dev[d] = (uint32_t)d;
            shuffle32(dev, in.n, &rng);
            const uint32_t *a = dev, *b = dev + rr;
            double v = dtfm_bottleneck(in.m, a, b, match);
            assert_true(is_perm(match, rr));
            assert_true(match_max(in.m, a, b, match) == v);
            assert_true(v == dtfm_bottleneck(in.m, a, b, NULL));
            if (rr <= 6) {
                uint32_t perm[DTFM_MAX_REPLICAS];
                for (size_t k = 0; k < rr; k++)
                    perm[k] = (uint32_t)k;
                double best = INFINITY;
                do
                    best = fmin(best, match_max(in.m, a, b, perm));
                while (next_perm(perm, rr));
                if (best != v)
                    fail_msg("r=%zu trial %d: bottleneck %.17g, brute force %.17g", rr, trial, v, best);
            } else if (matching_below(in.m, a, b, v)) {
                /* optimal iff no perfect matching avoids every edge >= v */
                fail_msg("r=%zu trial %d: a matching below %.17g exists", rr, trial, v);
            }
            inst_free(&in);
        }
    }
}

/* ---- 3. eq. 4, the open-loop TSP ---- */

static double path_of(const double *w, size_t s, const uint32_t *order)
{
    double c = 0;
    for (size_t i = 1; i < s; i++)
        c += w[order[i - 1] * s + order[i]];
    return c;
}

/* The test's own Held-Karp (value only). */
static double held_karp(const double *w, size_t s)
{
    size_t full = (size_t)1 << s;
    double *best = malloc(full * s * sizeof *best);
    assert_non_null(best);
    for (size_t i = 0; i < full * s; i++)
        best[i] = INFINITY;
    for (size_t v = 0; v < s; v++)
        best[((size_t)1 << v) * s + v] = 0;
    for (size_t mask = 1; mask < full; mask++)
        for (size_t v = 0; v < s; v++)
            if (mask >> v & 1 && best[mask * s + v] < INFINITY)
                for (size_t u = 0; u < s; u++)
                    if (!(mask >> u & 1)) {
                        double *t = &best[(mask | (size_t)1 << u) * s + u];
                        *t = fmin(*t, best[mask * s + v] + w[v * s + u]);
                    }
    double r = INFINITY;
    for (size_t v = 0; v < s; v++)
        r = fmin(r, best[(full - 1) * s + v]);
    free(best);
    return r;
}

static void random_weights(double *w, size_t s, int ties, uint64_t *rng)
{
    for (size_t i = 0; i < s; i++) {
        w[i * s + i] = 0;
        for (size_t j = i + 1; j < s; j++)
            w[i * s + j] = w[j * s + i] = ties ? (double)(1 + rnd(rng) % 3) : unif(rng, 0.01, 1);
    }
}

static void test_tsp_exact(void **state)
{
    (void)state;
    uint64_t rng = 0x75b0003;
    double w[DTFM_TSP_EXACT_MAX * DTFM_TSP_EXACT_MAX];
    uint32_t order[DTFM_MAX_STAGES], perm[DTFM_MAX_STAGES];
    for (size_t s = 1; s <= DTFM_TSP_EXACT_MAX; s++)
        for (int trial = 0; trial < (s <= 7 ? 20 : 4); trial++) {
            random_weights(w, s, trial & 1, &rng);
            double v = dtfm_tsp_open(w, s, order);
            assert_true(is_perm(order, s));
            assert_close(path_of(w, s, order), v);
            double best = INFINITY;
            if (s <= 8) { /* every permutation */
                for (size_t i = 0; i < s; i++)
                    perm[i] = (uint32_t)i;
                do
                    best = fmin(best, path_of(w, s, perm));
                while (next_perm(perm, s));
            } else { /* up to the exact limit: the test's Held-Karp */
                best = held_karp(w, s);
            }
            if (fabs(v - best) > 1e-9 * fmax(1, best))
                fail_msg("s=%zu trial %d: tsp %.17g, optimum %.17g", s, trial, v, best);
        }
}

/* Above DTFM_TSP_EXACT_MAX: nearest neighbour from every start, then 2-opt. */
static void test_tsp_heuristic(void **state)
{
    (void)state;
    uint64_t rng = 0x75b1003;
    double w[16 * 16];
    uint32_t order[DTFM_MAX_STAGES], ident[16];
    for (size_t s = DTFM_TSP_EXACT_MAX + 1; s <= 16; s++)
        for (int trial = 0; trial < 6; trial++) {
            random_weights(w, s, trial & 1, &rng);
            double v = dtfm_tsp_open(w, s, order);
            assert_true(is_perm(order, s));
            assert_close(path_of(w, s, order), v);
            for (size_t i = 0; i < s; i++)
                ident[i] = (uint32_t)i;
            assert_true(v <= path_of(w, s, ident) + 1e-12);
            /* nearest neighbour from node 0 */
            uint32_t nn[16];
            uint8_t used[16] = {0};
            nn[0] = 0;
            used[0] = 1;
            for (size_t i = 1; i < s; i++) {
                size_t pick = s;
                for (size_t u = 0; u < s; u++)
                    if (!used[u] && (pick == s || w[nn[i - 1] * s + u] < w[nn[i - 1] * s + pick]))
                        pick = u;
                nn[i] = (uint32_t)pick;
                used[pick] = 1;
            }
            assert_true(v <= path_of(w, s, nn) + 1e-12);
            /* the result is 2-opt optimal: no segment reversal improves it */
            for (size_t i = 0; i + 1 < s; i++)
                for (size_t j = i + 1; j < s; j++) {
                    uint32_t t[16];
                    memcpy(t, order, s * sizeof *t);
                    reverse32(t, i, j);
                    assert_true(path_of(w, s, t) >= v - 1e-9);
                }
        }
}

/* ---- 4. the assignment of a partition ---- */

/* Stage j's devices, sorted, must be exactly some group's members (members
 * are sorted by dtfm_members), each group used once. */
static void check_stages_are_groups(const struct inst *in, const uint16_t *group, const uint32_t *assign)
{
    uint8_t used[DTFM_MAX_STAGES] = {0};
    for (size_t j = 0; j < in->s; j++) {
        uint16_t g = group[assign[j]];
        assert_false(used[g]);
        used[g] = 1;
        for (size_t i = 0; i < in->r; i++)
            assert_int_equal(group[assign[i * in->s + j]], g);
    }
}

static void test_partition_assignment(void **state)
{
    (void)state;
    uint64_t rng = 0xa551003;
    const size_t s = 4, r = 3;
    uint32_t perms[6][3], p[3] = {0, 1, 2};
    for (size_t k = 0; k < 6; k++) {
        memcpy(perms[k], p, sizeof p);
        next_perm(p, 3);
    }
    for (int trial = 0; trial < 20; trial++) {
        int compute = trial % 2;
        struct inst in;
        inst_random(&in, s, r, compute, trial % 4 == 3, &rng);
        uint16_t group[12];
        uint32_t assign[12], members[12];
        random_partition(s, r, &rng, group);
        assert_int_equal(dtfm_partition_check(in.m, group), CM_OK);
        struct dtfm_cost pc, ac;
        assert_int_equal(dtfm_cost_partition(in.m, group, &pc, assign), CM_OK);
        assert_int_equal(dtfm_assignment_check(in.m, assign), CM_OK);
        check_stages_are_groups(&in, group, assign);
        assert_int_equal(dtfm_cost_assignment(in.m, assign, &ac), CM_OK);
        assert_close(ac.dp, pc.dp);
        assert_close(ac.pp, pc.pp);
        assert_close(ac.compute, pc.compute);
        assert_close(ac.total, pc.total);
        /* Every assignment with these stage groups: all group orders, and
         * for each stage after the first, all ways to pair its devices with
         * the replicas. Without a compute term the partition's cost is their
         * minimum (its pipeline structure is the best one, §3.3); with one,
         * the stage order is chosen for pp first, so it is at least that. */
        dtfm_members(in.m, group, members);
        uint32_t order[4] = {0, 1, 2, 3};
        double brute = INFINITY;
        do
            for (size_t code = 0; code < 6 * 6 * 6; code++) {
                uint32_t t[12];
                for (size_t j = 0, c = code; j < s; j++) {
                    const uint32_t *pj = perms[j == 0 ? 0 : c % 6];
                    if (j > 0)
                        c /= 6;
                    for (size_t i = 0; i < r; i++)
                        t[i * s + j] = members[order[j] * r + pj[i]];
                }
                struct dtfm_cost tc;
                assert_int_equal(dtfm_cost_assignment(in.m, t, &tc), CM_OK);
                brute = fmin(brute, tc.total);
            }
        while (next_perm(order, s));
        if (compute)
            assert_true(pc.total >= brute - 1e-9);
        else if (fabs(pc.total - brute) > 1e-9 * fmax(1, brute))
            fail_msg("trial %d: partition cost %.17g, best assignment %.17g", trial, pc.total, brute);
        inst_free(&in);
    }
}

/* ---- 5. the compute term ---- */

static void test_compute_term(void **state)
{
    (void)state;
    struct inst in;
    inst_alloc(&in, 2, 1, 1);
    for (size_t k = 0; k < 4; k++) {
        in.delay[k] = 0.01;
        in.bw[k] = 1e9;
    }
    in.work[0] = 10;
    in.work[1] = 1;
    in.speed[0] = 1;
    in.speed[1] = 10;
    inst_model(&in);
    /* Links are uniform, so only the compute term tells the two stage orders
     * apart: device 1 (speed 10) on stage 0 (work 10) gives 1 + 1 = 2 (the
     * stages compute in turn); the other way 10 + 0.1 = 10.1. Both
     * labellings must find it. */
    static const uint16_t groups[2][2] = {{0, 1}, {1, 0}};
    for (size_t k = 0; k < 2; k++) {
        struct dtfm_cost c;
        uint32_t assign[2];
        assert_int_equal(dtfm_cost_partition(in.m, groups[k], &c, assign), CM_OK);
        assert_int_equal(assign[0], 1);
        assert_int_equal(assign[1], 0);
        assert_close(c.compute, 2.0);
        assert_close(c.dp, 0);
        assert_close(c.total, c.pp + 2.0);
        assert_int_equal(dtfm_cost_assignment(in.m, assign, &c), CM_OK);
        assert_close(c.compute, 2.0);
    }
    static const uint32_t slow_first[2] = {0, 1};
    struct dtfm_cost c;
    assert_int_equal(dtfm_cost_assignment(in.m, slow_first, &c), CM_OK);
    assert_close(c.compute, 10.1);
    dtfm_model_free(in.m);

    in.m = NULL;

    /* work and speeds come together, and must make sense */
    in.p.speed = NULL;
    expect_einval(&in.p, "work without speeds");
    in.p.speed = in.speed;
    in.p.stage_work = NULL;
    expect_einval(&in.p, "speeds without work");
    in.p.stage_work = in.work;
    in.work[1] = -1;
    expect_einval(&in.p, "negative work");
    in.work[1] = 1;
    in.speed[1] = 0;
    expect_einval(&in.p, "zero speed");
    inst_free(&in);
}

/* Micro-batches run 1F1B (dtfm.h): 3 stages x 1 replica, two fast links
 * (alpha 10 ms, 8 Mbit/s) and a slow one (0.8 Mbit/s) that the path avoids,
 * c_PP 0.4 MB, M = 4. Per micro-batch one way: e = 0.01 + 3.2e6 / (4 x
 * 8e6) = 0.11 s on each edge of the path. */
static void test_pipelined_by_hand(void **state)
{
    (void)state;
    struct inst in;
    inst_alloc(&in, 3, 1, 1);
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++) {
            in.delay[a * 3 + b] = 0.01;
            in.bw[a * 3 + b] = (a == 0 && b == 2) || (a == 2 && b == 0) ? 0.8e6 : 8e6;
        }
    in.p.act_bytes = 4e5;
    for (size_t j = 0; j < 3; j++)
        in.work[j] = 8;
    static const uint16_t group[3] = {0, 1, 2};
    struct dtfm_cost c, ca;
    uint32_t assign[3];
    /* M = 1: the sequential model, 2 x 0.41 x 2 edges; 3 stages x 8/2 */
    for (size_t d = 0; d < 3; d++)
        in.speed[d] = 2;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, assign), CM_OK);
    assert_int_equal(assign[1], 1);
    assert_close(c.pp, 1.64);
    assert_close(c.compute, 12);
    dtfm_model_free(in.m);
    /* M = 4, compute-bound: c = 8 / (4 x 2) = 1 per micro-batch, 4/3 before
       the last stage: fill 2 x 0.22 + (4/3 + 4/3 + 1), then 3 x 4/3 */
    in.p.micro_batches = 4;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, assign), CM_OK);
    assert_int_equal(assign[1], 1);
    assert_close(c.pp, 0.44);
    assert_close(c.compute, 11.0 / 3.0 + 3 * 4.0 / 3.0);
    assert_close(c.total, c.dp + c.pp + c.compute);
    assert_int_equal(dtfm_cost_assignment(in.m, assign, &ca), CM_OK);
    assert_close(ca.total, c.total);
    dtfm_model_free(in.m);
    /* link-bound: speed 200, c = 0.01 (x 4/3): then 3 x 0.11 in the pipeline */
    for (size_t d = 0; d < 3; d++)
        in.speed[d] = 200;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, assign), CM_OK);
    assert_close(c.pp, 0.44 + 3 * 0.11);
    assert_close(c.compute, 0.01 * (4.0 / 3.0 + 4.0 / 3.0 + 1));
    assert_int_equal(dtfm_cost_assignment(in.m, assign, &ca), CM_OK);
    assert_close(ca.total, c.total);
    /* the slow link in the path, as an assignment is costed as it is:
       e = 0.01 + 3.2e6 / (4 x 0.8e6) = 1.01 on edge 0-2 */
    static const uint32_t slow[3] = {1, 0, 2};
    assert_int_equal(dtfm_cost_assignment(in.m, slow, &ca), CM_OK);
    assert_close(ca.pp, 2 * (0.11 + 1.01) + 3 * 1.01);
    dtfm_model_free(in.m);
    in.m = NULL;
    in.p.micro_batches = DTFM_MAX_MICRO_BATCHES + 1;
    expect_einval(&in.p, "too many micro-batches");
    inst_free(&in);
}

/* With many micro-batches the busiest link counts M - 1 times: 5 stages x
 * 1 replica whose cheapest path (0-2-1-3-4: edges 1, 1, 2, 6 s, sum 10) has
 * a longer longest edge than 3-1-0-2-4 (2, 4, 1, 4: sum 11, longest 4).
 * M = 1 keeps the paper's path; M = 10 (one micro-batch one way: W / 20):
 * 2 x 10/20 + 9 x 6/20 = 3.7 against 2 x 11/20 + 9 x 4/20 = 2.9. The tied
 * embedding adds its exchange between the path's two ends. */
static void test_pipelined_bottleneck_path(void **state)
{
    (void)state;
    static const double W[5][5] = {{0, 4, 1, 6, 10}, {4, 0, 1, 2, 10}, {1, 1, 0, 6, 4},
                                   {6, 2, 6, 0, 6},  {10, 10, 4, 6, 0}};
    struct inst in;
    inst_alloc(&in, 5, 1, 0);
    in.p.act_bytes = 1e6; /* W = 2 x 8e6 bits / beta */
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 5; b++)
            in.bw[a * 5 + b] = a == b ? 1 : 16e6 / W[a][b];
    static const uint16_t group[5] = {0, 1, 2, 3, 4};
    struct dtfm_cost c, ca;
    uint32_t as[5];
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, as), CM_OK);
    assert_close(c.pp, 10);
    dtfm_model_free(in.m);
    in.p.micro_batches = 10;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, as), CM_OK);
    assert_close(c.pp, 2.9);
    static const uint32_t want[5] = {3, 1, 0, 2, 4}, rev[5] = {4, 2, 0, 1, 3};
    assert_true(!memcmp(as, want, sizeof as) || !memcmp(as, rev, sizeof as));
    assert_int_equal(dtfm_cost_assignment(in.m, as, &ca), CM_OK);
    assert_close(ca.total, c.total);
    dtfm_model_free(in.m);
    /* the tied gradient, 1e5 bytes: 2 x 8e5 / beta between the ends (3 and
       4: beta = 16e6 / 6, so 0.6 s), in the pipeline term */
    in.p.tied_bytes = 1e5;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c, as), CM_OK);
    assert_close(c.pp, 2.9 + 0.6);
    assert_int_equal(dtfm_cost_assignment(in.m, as, &ca), CM_OK);
    assert_close(ca.pp, c.pp);
    dtfm_model_free(in.m);
    in.m = NULL;
    in.p.tied_bytes = -1;
    expect_einval(&in.p, "negative tied size");
    inst_free(&in);
}

/* The norms' exchange (norm_exchange): 3 stages x 2 replicas on fast
 * links, one-way delays 10 ms between devices of neighbouring stages and 50
 * ms between the two ends of pipeline 1 (devices 1 and 5): the pipeline
 * term gains the largest one-way delay between two stages of a pipeline,
 * 50 ms, whatever the order; without it, nothing. */
static void test_norm_exchange(void **state)
{
    (void)state;
    struct inst in;
    inst_alloc(&in, 3, 2, 0);
    in.p.act_bytes = 1;
    in.p.grad_bytes = 1;
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 6; b++) {
            in.bw[a * 6 + b] = 8e12;
            in.delay[a * 6 + b] = a == b ? 0 : (a / 2 == b / 2) ? 0.001 : 0.010;
        }
    in.delay[1 * 6 + 5] = in.delay[5 * 6 + 1] = 0.050;
    static const uint16_t group[6] = {0, 0, 1, 1, 2, 2};
    struct dtfm_cost c0, c1, ca;
    uint32_t as[6];
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c0, as), CM_OK);
    dtfm_model_free(in.m);
    in.p.norm_exchange = 1;
    inst_model(&in);
    assert_int_equal(dtfm_cost_partition(in.m, group, &c1, as), CM_OK);
    /* the pipelines pair devices 0/1 with 2/3 and 4/5: 1 and 5 meet in one
       unless the matchings part them; either way the term is the largest
       alpha inside a pipeline of the assignment */
    double want = 0;
    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j < 3; j++)
            for (size_t k = j + 1; k < 3; k++)
                want = fmax(want, in.delay[as[i * 3 + j] * 6 + as[i * 3 + k]]);
    assert_true(want >= 0.010);
    assert_close(c1.pp, c0.pp + want);
    assert_close(c1.total, c0.total + want);
    assert_int_equal(dtfm_cost_assignment(in.m, as, &ca), CM_OK);
    assert_close(ca.pp, c1.pp);
    dtfm_model_free(in.m);
    in.m = NULL;
    inst_free(&in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_by_hand),
        cmocka_unit_test(test_bottleneck_brute_force),
        cmocka_unit_test(test_tsp_exact),
        cmocka_unit_test(test_tsp_heuristic),
        cmocka_unit_test(test_partition_assignment),
        cmocka_unit_test(test_compute_term),
        cmocka_unit_test(test_pipelined_by_hand),
        cmocka_unit_test(test_pipelined_bottleneck_path),
        cmocka_unit_test(test_norm_exchange),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
