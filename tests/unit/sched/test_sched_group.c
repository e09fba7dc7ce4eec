/* Unit tests for common/sched/sched_group.c: the group size of seed
 * 000_02cc6b5d62a616fc.txt Appendix C. Special case 4 of §3.2 (high failure
 * rates -> m = 2), m = n for reliable peers (what the seed saw in all its
 * experiments), the expected-iterations model on values computed by hand,
 * and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "cm_err.h"
#include "sched/sched.h"

static void test_reliable_peers_use_one_group(void **state)
{
    (void)state;
    static const size_t ns[] = {2, 3, 8, 16, 64};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        unsigned m = 0;
        double e = 0;
        assert_int_equal(sched_group_size(ns[k], 0, &m, &e), CM_OK);
        assert_int_equal(m, ns[k]);
        assert_true(fabs(e - 1) < 1e-12);
        assert_int_equal(sched_group_size(ns[k], 1e-4, &m, &e), CM_OK);
        assert_int_equal(m, ns[k]);
    }
    unsigned m = 0;
    assert_int_equal(sched_group_size(1, 0.3, &m, NULL), CM_OK);
    assert_int_equal(m, 1);
}

/* §3.2 case 4: "any collaboration with a sufficiently high failure rate will converge to m=2". */
static void test_high_failure_rates_give_pairs(void **state)
{
    (void)state;
    static const size_t ns[] = {4, 16, 64, 256, 1000};
    static const double ps[] = {0.5, 0.7, 0.9};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ps / sizeof ps[0]; b++) {
            unsigned m = 0;
            assert_int_equal(sched_group_size(ns[a], ps[b], &m, NULL), CM_OK);
            if (m != 2)
                fail_msg("n=%zu p=%g: m=%u, expected 2", ns[a], ps[b], m);
        }
}

/* As failures grow, m never grows (Figure 7 of the seed shows the same trend), and
 * moderate rates pick intermediate sizes: n = 16 at p = 0.3 takes m = 4
 * (2 rounds x 8.1 iterations against 4 rounds x 4.6 for pairs). */
static void test_monotone_in_failure_rate(void **state)
{
    (void)state;
    for (size_t n = 8; n <= 512; n *= 4) {
        unsigned prev = (unsigned)n;
        for (double p = 0; p < 0.6; p += 0.01) {
            unsigned m = 0;
            assert_int_equal(sched_group_size(n, p, &m, NULL), CM_OK);
            if (m > prev)
                fail_msg("n=%zu: m rose from %u to %u at p=%g", n, prev, m, p);
            prev = m;
        }
        assert_int_equal(prev, 2);
    }
    unsigned m = 0;
    assert_int_equal(sched_group_size(16, 0.3, &m, NULL), CM_OK);
    assert_int_equal(m, 4);
}

static void test_expected_iterations_by_hand(void **state)
{
    (void)state;
    /* n = 2, m = 2, p = 0.5: one group succeeds w.p. 1/4: 4 tries expected. */
    assert_true(fabs(sched_expected_iterations(2, 2, 0.5) - 4) < 1e-9);
    /* n = 4, m = 2, p = 0: two rounds. n = 9, m = 3: two rounds. n = 10, m = 3: three. */
    assert_true(fabs(sched_expected_iterations(4, 2, 0) - 2) < 1e-12);
    assert_true(fabs(sched_expected_iterations(9, 3, 0) - 2) < 1e-12);
    assert_true(fabs(sched_expected_iterations(10, 3, 0) - 3) < 1e-12);
    /* n = 4, m = 2, p = 0.5: 2 rounds x E[max of two geometric(1/4)].
     * E[max] = sum_k 1 - (1 - 0.75^k)^2 = 2/q - 1/(1 - (1-q)^2) = 8 - 16/7 = 40/7. */
    assert_true(fabs(sched_expected_iterations(4, 2, 0.5) - 2 * 40.0 / 7) < 1e-9);
    /* The small-q approximation stays within 1% of the exact sum where both apply. */
    double exact = sched_expected_iterations(64, 8, 0.5); /* q = 1/256, 8 groups */
    assert_true(isfinite(exact) && exact > 2 * 256);
    assert_true(isinf(sched_expected_iterations(8, 2, 1.0)));
}

static void test_bad_input(void **state)
{
    (void)state;
    unsigned m = 0;
    assert_int_equal(sched_group_size(0, 0.1, &m, NULL), CM_EINVAL);
    assert_int_equal(sched_group_size(8, NAN, &m, NULL), CM_EINVAL);
    assert_int_equal(sched_group_size(8, -0.1, &m, NULL), CM_EINVAL);
    assert_int_equal(sched_group_size(8, 1.0, &m, NULL), CM_EINVAL);
    assert_int_equal(sched_group_size(8, 0.1, NULL, NULL), CM_EINVAL);
    assert_int_equal(sched_group_size((size_t)SCHED_MAX_PEERS * 64 + 1, 0.1, &m, NULL),
                     CM_ETOOBIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reliable_peers_use_one_group),
        cmocka_unit_test(test_high_failure_rates_give_pairs),
        cmocka_unit_test(test_monotone_in_failure_rate),
        cmocka_unit_test(test_expected_iterations_by_hand),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
