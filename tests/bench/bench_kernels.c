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

/* Seconds per call: the best of 7 rounds of at least 0.1 s each. The
 * machine may be shared; the minimum is the figure least disturbed by
 * other processes. */
#define TIME_IT(expr)                                           \
    ({                                                          \
        expr;                                                   \
        double best_ = 1e30;                                    \
        for (int round_ = 0; round_ < 7; round_++) {            \
            int reps_ = 0;                                      \
            double t0_ = now_s(), el_;                          \
            do {                                                \
                expr;                                           \
                reps_++;                                        \
            } while ((el_ = now_s() - t0_) < 0.1);              \
            if (el_ / reps_ < best_)                            \
                best_ = el_ / reps_;                            \
        }                                                       \
        best_;                                                  \
    })

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    kern_cpu_set_threads(threads);
    const struct kern_backend *be = kern_backend_cpu();
    int P = 2048;
    float *a = buf((size_t)P * P), *b = buf((size_t)P * P), *c = buf((size_t)P * P);
    if (!a || !b || !c)
        return 1;
    double t = TIME_IT(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, P, 1.0f, a, P,
                                   b, P, 0.0f, c, P));
    double peak = 2.0 * P * P * P / t / 1e9;
    printf("OpenBLAS sgemm peak (%dx%dx%d, %d threads): %.1f GFLOP/s\n", P, P, P,
           kern_cpu_threads(), peak);
    struct { const char *what; int N, C, OC; } shapes[] = {
        {"mlp 784->256, batch 128", 128, 784, 256},
        {"mlp 256->128, batch 128", 128, 256, 128},
        {"gpt qkv 128->384, 2048 tokens", 2048, 128, 384},
        {"gpt fc 128->512, 2048 tokens", 2048, 128, 512},
        {"gpt-2 small fc 768->3072, 1024 tokens", 1024, 768, 3072},
    };
    printf("%-40s %12s %12s %9s %14s\n", "shape (N x C -> OC)", "fwd GFLOP/s", "bwd GFLOP/s",
           "of peak", "vs bare sgemm");
    double worst = 1.0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int N = shapes[i].N, C = shapes[i].C, OC = shapes[i].OC;
        float *inp = buf((size_t)N * C), *w = buf((size_t)OC * C), *bias = buf(OC);
        float *out = buf((size_t)N * OC), *dinp = buf((size_t)N * C), *dw = buf((size_t)OC * C);
        float *db = buf(OC);
        if (!inp || !w || !bias || !out || !dinp || !dw || !db)
            return 1;
        double tf = TIME_IT(be->matmul_fwd(out, inp, w, bias, N, C, OC));
        double tb = TIME_IT(be->matmul_bwd(dinp, dw, db, out, inp, w, N, C, OC));
        /* the same products as bare sgemm calls, no bias: our overhead */
        double ts = TIME_IT(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f,
                                        inp, C, w, C, 0.0f, out, OC));
        double ff = 2.0 * N * C * OC / tf / 1e9, fb = 4.0 * N * C * OC / tb / 1e9;
        double fs = 2.0 * N * C * OC / ts / 1e9;
        double frac = (ff + fb) / 2 / peak;
        if (frac < worst)
            worst = frac;
        printf("%-40s %12.1f %12.1f %8.0f%% %13.0f%%\n", shapes[i].what, ff, fb, 100 * frac,
               100 * ff / fs);
        free(inp);
        free(w);
        free(bias);
        free(out);
        free(dinp);
        free(dw);
        free(db);
    }
    printf("matmul throughput: lowest shape at %.0f%% of OpenBLAS sgemm peak\n", 100 * worst);
    free(a);
    free(b);
    free(c);
    return 0;
}
