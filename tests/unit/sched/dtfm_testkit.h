/* Helpers of the DT-FM scheduler's unit tests (test_dtfm.c: the cost
 * model; test_dtfm_search.c: the search, bad input, edge sizes): the
 * tests' own PRNG, permutations, problem instances and their models. A
 * header of static inline functions, so each test uses what it needs. */
#ifndef DTFM_TESTKIT_H
#define DTFM_TESTKIT_H

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

/* The test's own PRNG (xorshift64*), so that the instances do not change
 * when the library's dtfm_rand does. */
static inline uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static inline double unif(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rnd(s) >> 11) / 9007199254740992.0;
}

static inline void swap32(uint32_t *a, uint32_t *b)
{
    uint32_t t = *a;
    *a = *b;
    *b = t;
}

static inline void shuffle32(uint32_t *a, size_t n, uint64_t *s)
{
    for (size_t i = n; i > 1; i--)
        swap32(&a[i - 1], &a[rnd(s) % i]);
}

static inline void reverse32(uint32_t *a, size_t i, size_t j)
{
    for (; i < j; i++, j--)
        swap32(&a[i], &a[j]);
}

/* Lexicographic next permutation; 0 after the last one. */
static inline int next_perm(uint32_t *a, size_t n)
{
    if (n < 2)
        return 0;
    size_t i = n - 1;
    while (i > 0 && a[i - 1] >= a[i])
        i--;
    if (i == 0)
        return 0;
    size_t j = n - 1;
    while (a[j] <= a[i - 1])
        j--;
    swap32(&a[i - 1], &a[j]);
    reverse32(a, i, n - 1);
    return 1;
}

static inline int is_perm(const uint32_t *a, size_t n)
{
    uint8_t seen[DTFM_MAX_DEVICES] = {0};
    for (size_t i = 0; i < n; i++) {
        if (a[i] >= n || seen[a[i]])
            return 0;
        seen[a[i]] = 1;
    }
    return 1;
}

/* Relative tolerance 1e-9 (absolute below 1 s). */
#define assert_close(got, want)                                                                  \
    do {                                                                                         \
        double g_ = (got), w_ = (want);                                                          \
        if (!(fabs(g_ - w_) <= 1e-9 * fmax(1.0, fabs(w_))))                                      \
            fail_msg("%s = %.17g, expected %.17g", #got, g_, w_);                                \
    } while (0)

/* A problem with its matrices and model. */
struct inst {
    size_t s, r, n;
    double *delay, *bw, *work, *speed;
    struct dtfm_problem p;
    struct dtfm_model *m;
};

static inline void inst_alloc(struct inst *in, size_t s, size_t r, int compute)
{
    memset(in, 0, sizeof *in);
    in->s = s;
    in->r = r;
    in->n = s * r;
    in->delay = calloc(in->n * in->n, sizeof *in->delay);
    in->bw = calloc(in->n * in->n, sizeof *in->bw);
    if (compute) {
        in->work = calloc(s, sizeof *in->work);
        in->speed = calloc(in->n, sizeof *in->speed);
    }
    assert_true(in->delay && in->bw && (!compute || (in->work && in->speed)));
    in->p = (struct dtfm_problem){s, r, in->delay, in->bw, 1e6, 1e8, in->work, in->speed};
}

static inline void inst_model(struct inst *in)
{
    const char *why = NULL;
    int rc = dtfm_model_new(&in->p, &in->m, &why);
    if (rc != CM_OK)
        fail_msg("dtfm_model_new: %d (%s)", rc, why ? why : "?");
}

/* Asymmetric random links (delay 0.1-50 ms, 0.1-10 Gbit/s). With `ties`,
 * values from two-element sets, so that equal pair costs abound. */
static inline void inst_random(struct inst *in, size_t s, size_t r, int compute, int ties, uint64_t *rng)
{
    inst_alloc(in, s, r, compute);
    size_t n = in->n;
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < n; b++) {
            in->delay[a * n + b] = ties ? (rnd(rng) & 1) * 0.01 : unif(rng, 1e-4, 0.05);
            in->bw[a * n + b] = ties ? ((rnd(rng) & 1) + 1) * 1e9 : unif(rng, 1e8, 1e10);
        }
    if (compute) {
        for (size_t j = 0; j < s; j++)
            in->work[j] = unif(rng, 0, 2);
        for (size_t d = 0; d < n; d++)
            in->speed[d] = unif(rng, 0.5, 4);
    }
    inst_model(in);
}

static inline void inst_free(struct inst *in)
{
    dtfm_model_free(in->m);
    free(in->delay);
    free(in->bw);
    free(in->work);
    free(in->speed);
}

/* CM_EINVAL, a message, and no model. */
static inline void expect_einval(const struct dtfm_problem *p, const char *what)
{
    struct dtfm_model *m = (struct dtfm_model *)1;
    const char *why = NULL;
    int rc = dtfm_model_new(p, &m, &why);
    if (rc != CM_EINVAL)
        fail_msg("%s: dtfm_model_new returned %d", what, rc);
    if (!why || !*why)
        fail_msg("%s: no message", what);
    assert_null(m);
}

static inline void random_partition(size_t s, size_t r, uint64_t *rng, uint16_t *group)
{
    uint32_t perm[DTFM_MAX_DEVICES];
    for (size_t d = 0; d < s * r; d++)
        perm[d] = (uint32_t)d;
    shuffle32(perm, s * r, rng);
    for (size_t d = 0; d < s * r; d++)
        group[perm[d]] = (uint16_t)(d / r);
}

#endif
