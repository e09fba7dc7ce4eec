/* Matrix-product throughput of the CPU backend against OpenBLAS's own peak,
 * both measured in this run: the peak is cblas_sgemm on a 2048^3 product;
 * then our matmul_fwd (sgemm plus the bias broadcast) and matmul_bwd (two
 * sgemm plus the bias column sums) on the layer shapes of the example
 * models, each reported as GFLOP/s, as a fraction of the peak, and (forward)
 * against a bare sgemm of the same shape, which shows our own overhead apart
 * from how well OpenBLAS does on small matrices.
 *   bench_kernels [threads]      (default: all cores) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kern_backend.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *buf(size_t n)
{
    float *p = malloc(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* Seconds per call of one round: repeats expr for at least 0.05 s. */
#define ROUND(expr)                                             \
    ({                                                          \
        int reps_ = 0;                                          \
        double t0_ = now_s(), el_;                              \
        do {                                                    \
            expr;                                               \
            reps_++;                                            \
        } while ((el_ = now_s() - t0_) < 0.05);                 \
        el_ / reps_;                                            \
    })

#define MIN_INTO(best, t)  \
    do {                   \
        double t_ = (t);   \
        if (t_ < (best))   \
            (best) = t_;   \
    } while (0)

#define ROUNDS 9

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    kern_cpu_set_threads(threads);
    const struct kern_backend *be = kern_backend_cpu();
    int P = 2048;
    float *a = buf((size_t)P * P), *b = buf((size_t)P * P), *c = buf((size_t)P * P);
    if (!a || !b || !c)
        return 1;
    /* The machine may be shared: every figure is the best of ROUNDS rounds,
     * and a shape's rounds interleave our call, the bare sgemm and the peak
     * product, so a burst of outside load hits all three alike. */
    /* Our backend runs OpenBLAS single-threaded inside its own worker-thread
     * slices; the reference calls use OpenBLAS's own threads, as many. */
    int nthr = kern_cpu_threads();
    double t = 1e30;
    openblas_set_num_threads(nthr);
    for (int r = 0; r < 3; r++)
        MIN_INTO(t, ROUND(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, P, 1.0f, a,
                                      P, b, P, 0.0f, c, P)));
    openblas_set_num_threads(1);
    double peak = 2.0 * P * P * P / t / 1e9;
    printf("OpenBLAS sgemm peak (%dx%dx%d, %d threads): %.1f GFLOP/s\n", P, P, P, nthr, peak);
    struct { const char *what; int N, C, OC; } shapes[] = {
        {"mlp 784->256, batch 128", 128, 784, 256},
        {"mlp 256->128, batch 128", 128, 256, 128},
        {"gpt qkv 128->384, 2048 tokens", 2048, 128, 384},
        {"gpt fc 128->512, 2048 tokens", 2048, 128, 512},
        {"gpt-2 small fc 768->3072, 1024 tokens", 1024, 768, 3072},
    };
    enum { NSHAPES = 5 };
    double res_f[NSHAPES], res_b[NSHAPES], res_s[NSHAPES];
    for (int i = 0; i < NSHAPES; i++) {
        int N = shapes[i].N, C = shapes[i].C, OC = shapes[i].OC;
        float *inp = buf((size_t)N * C), *w = buf((size_t)OC * C), *bias = buf(OC);
        float *out = buf((size_t)N * OC), *dinp = buf((size_t)N * C), *dw = buf((size_t)OC * C);
        float *db = buf(OC);
        if (!inp || !w || !bias || !out || !dinp || !dw || !db)
            return 1;
        double tf = 1e30, tb = 1e30, ts = 1e30;
        for (int r = 0; r < ROUNDS; r++) {
            MIN_INTO(tf, ROUND(be->matmul_fwd(out, inp, w, bias, N, C, OC)));
            MIN_INTO(tb, ROUND(be->matmul_bwd(dinp, dw, db, out, inp, w, N, C, OC)));
            /* the same product as a bare multi-threaded sgemm, no bias */
            openblas_set_num_threads(nthr);
            MIN_INTO(ts, ROUND(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                                           1.0f, inp, C, w, C, 0.0f, out, OC)));
            if (r % 3 == 0) /* the peak again, in the same load conditions */
                MIN_INTO(t, ROUND(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, P,
                                              1.0f, a, P, b, P, 0.0f, c, P)));
            openblas_set_num_threads(1);
        }
        peak = 2.0 * P * P * P / t / 1e9;
        res_f[i] = 2.0 * N * C * OC / tf / 1e9;
        res_b[i] = 4.0 * N * C * OC / tb / 1e9;
        res_s[i] = 2.0 * N * C * OC / ts / 1e9;
        free(inp);
        free(w);
        free(bias);
        free(out);
        free(dinp);
        free(dw);
        free(db);
    }
    printf("OpenBLAS sgemm peak, best over the whole run: %.1f GFLOP/s\n", peak);
    printf("%-40s %12s %12s %9s %14s\n", "shape (N x C -> OC)", "fwd GFLOP/s", "bwd GFLOP/s",
           "of peak", "vs bare sgemm");
    double worst = 1e9;
    for (int i = 0; i < NSHAPES; i++) {
        double frac = (res_f[i] + res_b[i]) / 2 / peak;
        if (frac < worst)
            worst = frac;
        printf("%-40s %12.1f %12.1f %8.0f%% %13.0f%%\n", shapes[i].what, res_f[i], res_b[i],
               100 * frac, 100 * res_f[i] / res_s[i]);
    }
    printf("matmul throughput: lowest shape at %.0f%% of OpenBLAS sgemm peak\n", 100 * worst);
    free(a);
    free(b);
    free(c);
    return 0;
}
