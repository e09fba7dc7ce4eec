/* Group size under failures (seed 000_02cc6b5d62a616fc.txt, §3.2 "Node
 * failures" and Appendix C).
 *
 * Instead of one all-reduce over n peers, averaging runs in groups of m
 * (Group / Moshpit All-Reduce): ceil(log_m n) consecutive rounds reach the
 * exact global average, and a failed peer only spoils its own group's
 * round. Appendix C picks m by minimizing the expected number of iterations
 * to the global average, counting restarts after failures. The seed gives
 * no formula, only the criterion and Figure 7; the model here:
 *
 *  - each peer fails a given round independently with probability p;
 *  - a group of m succeeds when none of its members fails: q = (1 - p)^m;
 *  - a round is repeated until each of its ceil(n/m) groups has succeeded
 *    once, so a round costs E[max of G geometric(q)] iterations;
 *  - E(m) = ceil(log_m n) * E[max of G geometric(q)].
 *
 * With p = 0 this is ceil(log_m n), smallest at m = n (one all-reduce);
 * as p grows the (1 - p)^m term dominates and m falls to 2 (pairwise
 * averaging, D-PSGD-like: special case 4 of §3.2). */
#include "sched/sched.h"

#include <math.h>

#include "cm_err.h"

static unsigned rounds_needed(size_t n, unsigned m)
{
    /* ceil(log_m n) by integer powers, exact where floating logs are not. */
    unsigned r = 0;
    double reach = 1;
    while (reach < (double)n) {
        reach *= m;
        r++;
    }
    return r;
}

/* E[max of g iid geometric(q) variables on {1, 2, ...}]. */
static double expected_max_geometric(size_t g, double q)
{
    if (g <= 1)
        return 1 / q;
    double x = 1 - q; /* failure probability of one group */
    if (x <= 0)
        return 1;
    /* sum_{k >= 0} P(max > k) = sum 1 - (1 - x^k)^g; stop once g x^k is negligible. */
    double kmax = log(1e-16 / (double)g) / log1p(-q); /* log1p: 1 - q rounds to 1 for tiny q */
    if (isfinite(kmax) && kmax <= 2e4) {
        double e = 0, xk = 1;
        for (long k = 0; k <= (long)kmax + 1; k++) {
            e += -expm1((double)g * log1p(-xk)); /* 1 - (1 - x^k)^g, accurate for small x^k */
            xk *= x;
        }
        return e;
    }
    /* q tiny: the geometric is the exponential of rate -log(1 - q) shifted by about one
     * half, and the maximum of g exponentials has mean H_g / rate. */
    double h = 0;
    for (size_t i = 1; i <= g; i++)
        h += 1.0 / (double)i;
    return h / -log1p(-q) + 0.5;
}

double sched_expected_iterations(size_t n, unsigned m, double p_fail)
{
    if (n == 0 || m == 0 || !(p_fail >= 0) || p_fail >= 1)
        return INFINITY;
    if (n == 1)
        return 1 / (1 - p_fail);
    if (m < 2)
        return INFINITY;
    if (m > n)
        m = (unsigned)n;
    double q = pow(1 - p_fail, m);
    if (!(q > 0))
        return INFINITY;
    size_t groups = (n + m - 1) / m;
    return rounds_needed(n, m) * expected_max_geometric(groups, q);
}

int sched_group_size(size_t n, double p_fail, unsigned *m_out, double *expected_out)
{
    if (n == 0 || !m_out || !(p_fail >= 0) || !(p_fail < 1))
        return CM_EINVAL;
    if (n > SCHED_MAX_PEERS * 64)
        return CM_ETOOBIG;
    unsigned best = n == 1 ? 1 : 2;
    double best_e = sched_expected_iterations(n, best, p_fail);
    for (unsigned m = 3; m <= n; m++) {
        double e = sched_expected_iterations(n, m, p_fail);
        if (isfinite(e) && !(e > best_e * (1 + 1e-12))) { /* ties to the larger m: fewer rounds */
            best_e = e;
            best = m;
        }
    }
    *m_out = best;
    if (expected_out)
        *expected_out = best_e;
    return CM_OK;
}
