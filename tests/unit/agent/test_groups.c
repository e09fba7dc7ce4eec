/* Unit tests for agent/dp/groups.c: the group all-reduce layout reaches
 * the exact weighted average on every member for every n and
 * m (simulated: each group averages its senders' values in member order,
 * as the engine's aggregators do), in ceil(log_m n) rounds, with groups of
 * at most m senders, an aggregator in every group, every member in at most
 * one group per round, and one all-reduce where grouping does not apply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dp/groups.h"
#include "cm_err.h"

#define DIM 3

static unsigned ceil_log(size_t n, unsigned m)
{
    unsigned r = 0;
    for (size_t reach = 1; reach < n; reach *= m)
        r++;
    return r;
}

/* Runs the layout on values x (n x DIM) and checks every group and the
 * result; sends: NULL for every member sending. */
static void simulate_s(size_t n, unsigned m, const int *agg, const double *w, int all_agg,
                       const int *sends_in)
{
    int sends[AR_MAX_MEMBERS];
    size_t ns = 0;
    for (size_t i = 0; i < n; i++)
        ns += (sends[i] = sends_in ? sends_in[i] : 1);
    struct dp_groups *g = malloc(sizeof *g);
    assert_non_null(g);
    assert_int_equal(dp_groups_plan(n, sends, agg, w, m, g), CM_OK);
    assert_true(g->rounds >= 2);
    if (all_agg)
        assert_int_equal(g->rounds, ceil_log(ns, m));
    double x[AR_MAX_MEMBERS][DIM], exact[DIM] = {0}, wsum = 0;
    for (size_t i = 0; i < n; i++) {
        for (int d = 0; d < DIM; d++) {
            x[i][d] = sends[i] ? sin((double)(i * DIM + d) * 1.7) * 3 + (double)d : NAN;
            if (sends[i])
                exact[d] += w[i] * x[i][d];
        }
        if (sends[i])
            wsum += w[i];
    }
    for (size_t i = 0; i < n; i++) /* a non-sender is in the last round only */
        if (!sends[i])
            for (size_t r = 0; r < g->rounds; r++)
                assert_true((g->group[r][i] >= 0) == (r + 1 == g->rounds) && !g->sends[r][i]);
    for (int d = 0; d < DIM; d++)
        exact[d] /= wsum;
    for (size_t r = 0; r < g->rounds; r++) {
        double nx[AR_MAX_MEMBERS][DIM];
        memcpy(nx, x, sizeof nx);
        for (size_t grp = 0; grp < g->n_groups[r]; grp++) {
            /* members in position order */
            int mem[AR_MAX_MEMBERS];
            size_t sz = g->size[r][grp], seen = 0, senders = 0, aggs = 0;
            for (size_t i = 0; i < n; i++)
                if (g->group[r][i] == (int)grp) {
                    assert_true(g->pos[r][i] >= 0 && (size_t)g->pos[r][i] < sz);
                    mem[g->pos[r][i]] = (int)i;
                    seen++;
                }
            if (seen == 0) { /* a first-round unit of one sits out */
                assert_int_equal(r, 0);
                assert_int_equal(sz, 1);
                continue;
            }
            assert_int_equal(seen, sz);
            assert_true(sz >= 2);
            double acc[DIM] = {0}, ws = 0;
            for (size_t k = 0; k < sz; k++) {
                int i = mem[k];
                aggs += !!agg[i];
                if (!g->sends[r][i])
                    continue;
                senders++;
                for (int d = 0; d < DIM; d++)
                    acc[d] += g->weight[r][i] * x[i][d];
                ws += g->weight[r][i];
            }
            assert_true(senders >= 1 && senders <= m);
            assert_true(aggs >= 1);
            for (size_t k = 0; k < sz; k++)
                for (int d = 0; d < DIM; d++)
                    nx[mem[k]][d] = acc[d] / ws;
        }
        memcpy(x, nx, sizeof nx);
    }
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < DIM; d++) {
            if (memcmp(&x[i][d], &x[0][d], sizeof(double)) != 0)
                fail_msg("n %zu m %u: member %zu differs from member 0", n, m, i);
            if (fabs(x[i][d] - exact[d]) > 1e-12 * (1 + fabs(exact[d])))
                fail_msg("n %zu m %u: %g, exact %g", n, m, x[i][d], exact[d]);
        }
    free(g);
}

static void simulate(size_t n, unsigned m, const int *agg, const double *w, int all_agg)
{
    simulate_s(n, m, agg, w, all_agg, NULL);
}

static void test_exact_average_everywhere(void **state)
{
    (void)state;
    int agg[AR_MAX_MEMBERS];
    double w[AR_MAX_MEMBERS];
    size_t cases = 0;
    for (size_t n = 3; n <= AR_MAX_MEMBERS; n++)
        for (unsigned m = 2; m < n && m <= 9; m++) {
            for (size_t i = 0; i < n; i++)
                w[i] = 100 + (double)((i * 37) % 11) * 13; /* sample counts */
            for (size_t i = 0; i < n; i++)
                agg[i] = 1;
            simulate(n, m, agg, w, 1);
            /* only every third member accepts connections, when that is enough */
            size_t naggs = 0;
            for (size_t i = 0; i < n; i++)
                naggs += (agg[i] = i % 3 == 1);
            if (naggs >= (n + m - 1) / m)
                simulate(n, m, agg, w, 0);
            /* exactly as many aggregators as first-round units, at the end */
            size_t g1 = (n + m - 1) / m;
            for (size_t i = 0; i < n; i++)
                agg[i] = i >= n - g1;
            simulate(n, m, agg, w, 0);
            cases += 3;
        }
    printf("%zu layouts averaged exactly\n", cases);
}

/* Pull-only and aggregate-only members (no gradient) join the last round
 * and get the exact average there. */
static void test_non_senders_join_the_last_round(void **state)
{
    (void)state;
    int agg[AR_MAX_MEMBERS], sends[AR_MAX_MEMBERS];
    double w[AR_MAX_MEMBERS];
    for (size_t n = 5; n <= 40; n += 5)
        for (unsigned m = 2; m <= 4; m++) {
            size_t ns = 0;
            for (size_t i = 0; i < n; i++) {
                agg[i] = 1;
                w[i] = 50 + (double)i;
                ns += (sends[i] = i % 4 != 3);
            }
            if (m < ns)
                simulate_s(n, m, agg, w, 1, sends);
        }
    /* the demo's shape: four computing peers and an aggregate-only one, m = 2 */
    int s5[5] = {1, 1, 0, 1, 1}, a5[5] = {1, 1, 1, 1, 1};
    double w5[5] = {512, 512, 0, 512, 512};
    struct dp_groups g;
    assert_int_equal(dp_groups_plan(5, s5, a5, w5, 2, &g), CM_OK);
    assert_int_equal(g.rounds, 2);
    assert_int_equal(g.group[0][2], -1);
    assert_int_equal(g.group[1][2], 0);
    assert_int_equal(g.size[1][0], 5);
}

static void test_one_group_when_grouping_does_not_apply(void **state)
{
    (void)state;
    int sends[8] = {1, 1, 1, 1, 1, 1, 1, 1}, agg[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    double w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct dp_groups g;
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 8, &g), CM_OK); /* m = n */
    assert_int_equal(g.rounds, 1);
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 0, &g), CM_OK); /* no schedule */
    assert_int_equal(g.rounds, 1);
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 1, &g), CM_OK);
    assert_int_equal(g.rounds, 1);
    for (int i = 2; i < 8; i++)
        sends[i] = 0; /* two senders: one all-reduce, whatever the receivers */
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 2, &g), CM_OK);
    assert_int_equal(g.rounds, 1);
    for (int i = 2; i < 8; i++)
        sends[i] = 1;
    for (int i = 0; i < 8; i++)
        agg[i] = i < 3; /* 4 first-round units, 3 aggregators */
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 2, &g), CM_OK);
    assert_int_equal(g.rounds, 1);
    agg[3] = 1;
    assert_int_equal(dp_groups_plan(8, sends, agg, w, 2, &g), CM_OK);
    assert_int_equal(g.rounds, 3);
    assert_int_equal(dp_groups_plan(0, sends, agg, w, 2, &g), CM_EINVAL);
    assert_int_equal(dp_groups_plan(AR_MAX_MEMBERS + 1, sends, agg, w, 2, &g), CM_EINVAL);
}

static void test_four_peers_in_pairs(void **state)
{
    (void)state;
    /* the integration test's layout: 4 peers, m = 2 -> pairs, then pairs across */
    int sends[4] = {1, 1, 1, 1}, agg[4] = {1, 1, 1, 1};
    double w[4] = {512, 512, 480, 544};
    struct dp_groups g;
    assert_int_equal(dp_groups_plan(4, sends, agg, w, 2, &g), CM_OK);
    assert_int_equal(g.rounds, 2);
    assert_int_equal(g.n_groups[0], 2);
    assert_int_equal(g.group[0][0], g.group[0][2]); /* dealt: {0, 2} and {1, 3} */
    assert_int_equal(g.group[0][1], g.group[0][3]);
    assert_true(g.group[0][0] != g.group[0][1]);
    assert_int_equal(g.n_groups[1], 1); /* then all four, 0 and 1 sending for their pairs */
    for (int i = 0; i < 4; i++)
        assert_int_equal(g.group[1][i], 0);
    assert_true(g.sends[1][0] && g.sends[1][1] && !g.sends[1][2] && !g.sends[1][3]);
    assert_true(g.weight[1][0] == 992 && g.weight[1][1] == 1056);
    assert_int_equal(g.pos[1][0], 0);
    assert_int_equal(g.pos[1][1], 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_average_everywhere),
        cmocka_unit_test(test_non_senders_join_the_last_round),
        cmocka_unit_test(test_one_group_when_grouping_does_not_apply),
        cmocka_unit_test(test_four_peers_in_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
