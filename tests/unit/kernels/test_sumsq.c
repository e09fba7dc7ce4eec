/* The CPU backend's sum of squares (the optimizer's gradient norm and LAMB's
 * per-tensor norms) in the order kern_backend.h defines: the same bits for 1,
 * 2, 3 and 4 threads, the same bits as a straightforward implementation of
 * that definition written here from its text, and one pinned value, so the
 * order cannot drift on one backend without this test noticing. The CUDA
 * backend is held to the same bits by test_backends (GPU only). The inputs
 * are chosen so that the order matters: a plain running sum gives other bits
 * (checked below), so a test that passed with any order would not pass here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_model.h"
#include "kern_optim.h"

/* The definition, element by element: lane (i - block start) mod LANES of
 * the element's block, lanes combined by halving, blocks added in order. */
static double ref_sumsq(const float *x, size_t n)
{
    double total = 0.0;
    for (size_t start = 0; start < n; start += KERN_SUMSQ_BLOCK) {
        double lane[KERN_SUMSQ_LANES] = {0};
        for (size_t i = start; i < n && i < start + KERN_SUMSQ_BLOCK; i++) {
            double v = x[i];
            double sq = v * v;
            size_t j = (i - start) % KERN_SUMSQ_LANES;
            lane[j] = lane[j] + sq;
        }
        for (int h = KERN_SUMSQ_LANES / 2; h >= 1; h /= 2)
            for (int j = 0; j < h; j++)
                lane[j] = lane[j] + lane[j + h];
        total = total + lane[0];
    }
    return total;
}

static uint64_t lcg = 0x9e3779b97f4a7c15ULL;

static uint32_t next32(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 32);
}

/* Exactly representable values spread over 2^-20 .. 2^20 (so rounding in
 * the sum depends on the order), with zeros, -0, float subnormals and a few
 * large values mixed in. Same bits on every platform: integers scaled by
 * powers of two, no libm. */
static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t r = next32();
        int32_t m = (int32_t)(r >> 8) - (1 << 23); /* 24-bit signed mantissa */
        int e = (int)(next32() % 41) - 20 - 23;
        x[i] = ldexpf((float)m, e);
        if (i % 1009 == 5)
            x[i] = 0.0f;
        if (i % 1013 == 7)
            x[i] = -0.0f;
        if (i % 2003 == 11)
            x[i] = ldexpf((float)(m | 1), -149 - 23 + 20); /* subnormal */
        if (i % 4999 == 13)
            x[i] = ldexpf(1.5f, 22);
    }
}

static int same_bits(double a, double b) { return !memcmp(&a, &b, sizeof a); }

static const size_t sizes[] = {0,     1,      2,           255,   256,   257,
                               4095,  4096,   4097,        12305, 32768, 32769,
                               100003, 262144, (1u << 20) + 12345};

static void test_threads_and_reference(void **state)
{
    (void)state;
    const struct kern_backend *cpu = kern_backend_cpu();
    size_t nmax = sizes[sizeof sizes / sizeof sizes[0] - 1];
    float *x = malloc(nmax * sizeof(float));
    assert_non_null(x);
    fill(x, nmax);
    int naive_differs = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        double want = ref_sumsq(x, n);
        for (int t = 1; t <= 4; t++) {
            kern_cpu_set_threads(t);
            double got = cpu->sumsq(x, n);
            if (!same_bits(got, want))
                fail_msg("n=%zu threads=%d: sumsq %a, definition %a", n, t, got, want);
        }
        /* a second call gives the same bits (no state) */
        assert_true(same_bits(cpu->sumsq(x, n), want));
        double naive = 0.0;
        for (size_t i = 0; i < n; i++)
            naive += (double)x[i] * x[i];
        assert_true(fabs(naive - want) <= 1e-12 * want); /* it is the sum of squares */
        naive_differs += !same_bits(naive, want);
        printf("  n=%-8zu sumsq %a (plain running sum %s)\n", n, want,
               same_bits(naive, want) ? "same" : "differs");
    }
    /* The inputs make the order visible: most sizes over a block give other
     * bits in another order. */
    assert_true(naive_differs >= 5);
    /* The pinned value: any change of the definition, or of fill(), shows
     * here. Computed by ref_sumsq on x86-64 (gcc 12, 2026-11-23). */
    double pin = ref_sumsq(x, 100003);
    printf("  pinned n=100003: %a\n", pin);
    assert_true(same_bits(pin, 0x1.ce3e6bc10446dp+50));
    free(x);
}

/* Whole optimizer steps with clipping active, AdamW and LAMB, at 1 and 4
 * threads: the same parameters to the bit (the gradient norm and LAMB's
 * norms are the only reductions in the step). */
static void test_optimizer_threads(void **state)
{
    (void)state;
    const struct kern_backend *cpu = kern_backend_cpu();
    struct kern_mlp_config mc = {.in_dim = 300, .nhidden = 1, .hidden = {200}, .nclass = 10};
    for (int kind = KERN_OPT_ADAMW; kind <= KERN_OPT_LAMB; kind++) {
        float *params[2] = {NULL, NULL};
        float norms[2][4];
        size_t np = 0;
        for (int r = 0; r < 2; r++) {
            kern_cpu_set_threads(r ? 4 : 1);
            struct kern_model *m = NULL;
            assert_int_equal(kern_mlp_new(cpu, &mc, 4, 9, &m), CM_OK);
            np = m->nparams;
            struct kern_optim_config oc;
            kern_optim_config_default(&oc);
            oc.kind = kind;
            oc.lr = kind == KERN_OPT_LAMB ? 1e-2f : 1e-3f;
            oc.weight_decay = 0.01f;
            oc.clip_norm = 1.0f;
            struct kern_optim *o = NULL;
            assert_int_equal(kern_optim_new(cpu, &oc, np, &o), CM_OK);
            lcg = 12345;
            for (int s = 0; s < 4; s++) {
                fill(m->grads, np);
                assert_int_equal(kern_optim_step(o, m, &norms[r][s], NULL), CM_OK);
                assert_true(norms[r][s] > oc.clip_norm); /* clipping is active */
            }
            params[r] = malloc(np * sizeof(float));
            assert_non_null(params[r]);
            assert_int_equal(kern_model_get_params(m, params[r]), CM_OK);
            kern_optim_free(o);
            kern_model_free(m);
        }
        assert_memory_equal(norms[0], norms[1], sizeof norms[0]);
        assert_memory_equal(params[0], params[1], np * sizeof(float));
        free(params[0]);
        free(params[1]);
    }
    kern_cpu_set_threads(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_and_reference),
        cmocka_unit_test(test_optimizer_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
