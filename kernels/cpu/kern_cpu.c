/* The CPU backend: the reference implementation of every op in
 * kern_backend.h. Matrix products go to OpenBLAS sgemm; the other ops are
 * plain loops the compiler vectorizes, split across cores with OpenMP where
 * the work is large enough to pay for the fork. The layer-norm, attention and
 * GELU loops follow llm.c's train_gpt2.c, which is itself checked against
 * PyTorch; our own fixtures (tests/fixtures/kernels/) check them again.
 *
 * All pointers are host memory. Backward ops accumulate into gradients. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cm_err.h"
#include "kern_backend.h"

/* Below this many elements an elementwise loop runs on one thread. */
#define KERN_CPU_PAR_MIN 32768

static int g_threads;

void kern_cpu_set_threads(int n)
{
    g_threads = n > 0 ? n : 0;
#ifdef _OPENMP
    omp_set_num_threads(g_threads ? g_threads : omp_get_num_procs());
#endif
    /* each OpenMP thread calls a single-threaded sgemm (see cpu_matmul_fwd) */
    openblas_set_num_threads(1);
}

static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_init_once(void) { openblas_set_num_threads(1); }

int kern_cpu_threads(void)
{
#ifdef _OPENMP
    return g_threads ? g_threads : omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- memory ---- */

static int cpu_alloc(size_t bytes, void **out)
{
    /* 64-byte alignment keeps AVX loads aligned; calloc for the zero fill
     * promised by the interface would not align. */
    size_t sz = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p)
        return CM_ENOMEM;
    memset(p, 0, sz ? sz : 64);
    *out = p;
    return CM_OK;
}

static void cpu_release(void *p) { free(p); }

static int cpu_memcpy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
    return CM_OK;
}

static int cpu_sync(void) { return CM_OK; }

static int cpu_set_precision(const char *mode)
{
    return strcmp(mode, "fp32") ? CM_EUNSUPPORTED : CM_OK;
}

/* ---- elementwise ---- */

static void cpu_fill(float *x, float v, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static void cpu_scale(float *x, float s, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void cpu_axpy(float *y, float a, const float *x, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void cpu_add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static double cpu_sumsq(const float *x, size_t n)
{
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static int cpu_all_finite(const float *x, size_t n)
{
    int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        bad |= !isfinite(x[i]);
    return !bad;
}

/* The slice [lo, hi) of n columns that the calling OpenMP thread owns
 * (all of them outside a parallel region). */
static void col_slice(int n, int *lo, int *hi)
{
#ifdef _OPENMP
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    int nt = 1, id = 0;
#endif
    *lo = (int)((long)n * id / nt);
    *hi = (int)((long)n * (id + 1) / nt);
}

/* ---- dense ---- */

/* Matrix products split across the OpenMP threads by hand, each slice one
 * single-threaded OpenBLAS sgemm. One thread pool instead of two: with
 * OpenBLAS's own pthreads next to OpenMP's, the OpenMP threads still
 * spinning after a parallel region take the cores from the OpenBLAS threads
 * of the next product (measured: a 2048x128x384 product ran 5x slower than
 * bare sgemm on 2 cores). Products under KERN_CPU_GEMM_PAR_MIN flops run on
 * one thread. */
#define KERN_CPU_GEMM_PAR_MIN 4e6

/* out (N,OC) = inp (N,C) @ w^T + bias; rows of out split across threads */
static void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC)
{
#pragma omp parallel if (2.0 * N * C * OC > KERN_CPU_GEMM_PAR_MIN)
    {
        int lo, hi;
        col_slice(N, &lo, &hi);
        if (hi > lo) {
            float *o = out + (size_t)lo * OC;
            if (bias)
                for (int i = lo; i < hi; i++)
                    memcpy(out + (size_t)i * OC, bias, sizeof(float) * OC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, OC, C, 1.0f,
                        inp + (size_t)lo * C, C, w, C, bias ? 1.0f : 0.0f, o, OC);
        }
    }
}

/* dinp (N,C) += dout (N,OC) @ w (OC,C): rows of dinp split across threads;
 * dw (OC,C) += dout^T @ inp (N,C) and dbias (OC) += sum_rows dout: rows of
 * dw (columns of dout) split across threads, so no two threads write the
 * same element. */
static void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC)
{
#pragma omp parallel if (4.0 * N * C * OC > KERN_CPU_GEMM_PAR_MIN)
    {
        int lo, hi;
        if (dinp) {
            col_slice(N, &lo, &hi);
            if (hi > lo)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, C, OC, 1.0f,
                            dout + (size_t)lo * OC, OC, w, C, 1.0f, dinp + (size_t)lo * C, C);
        }
        col_slice(OC, &lo, &hi);
        if (hi > lo) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, N, 1.0f, dout + lo,
                        OC, inp, C, 1.0f, dw + (size_t)lo * C, C);
            if (dbias)
                for (int i = 0; i < N; i++) {
                    const float *row = dout + (size_t)i * OC;
                    for (int o = lo; o < hi; o++)
                        dbias[o] += row[o];
                }
        }
    }
}

/* ---- activations ---- */

static void cpu_relu_fwd(float *out, const float *inp, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

static void cpu_relu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static void cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN / 4)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
    }
}

static void cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN / 4)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float th = tanhf(GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local * dout[i];
    }
}

/* ---- layer norm ---- */

static void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
    const float eps = 1e-5f;
#pragma omp parallel for if ((size_t)N * C > KERN_CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

static void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C)
{
    /* dinp rows are independent; dw/db sum over rows, so they are done in a
     * separate pass parallel over channels to avoid write races. */
#pragma omp parallel for if ((size_t)N * C > KERN_CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C;
        const float *x = inp + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float nrm = (x[c] - m) * s;
            float dn = w[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * nrm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            float nrm = (x[c] - m) * s;
            float dn = w[c] * dy[c];
            dx[c] += (dn - dnorm_mean - nrm * dnorm_norm_mean) * s;
        }
    }
#pragma omp parallel if ((size_t)N * C > KERN_CPU_PAR_MIN)
    {
        int lo, hi;
        col_slice(C, &lo, &hi);
        for (int i = 0; i < N; i++) {
            const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float m = mean[i], r = rstd[i];
            for (int c = lo; c < hi; c++) {
                dw[c] += (x[c] - m) * r * dy[c];
                db[c] += dy[c];
            }
        }
    }
}

/* ---- embeddings ---- */

static void cpu_embed_fwd(float *out, const int *tok, const float *wte, const float *wpe, int B,
                          int T, int C)
{
#pragma omp parallel for collapse(2) if ((size_t)B * T * C > KERN_CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok[b * T + t] * C;
            const float *p = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++)
                o[c] = e[c] + p[c];
        }
}

static void cpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int B,
                          int T, int C)
{
    /* Rows of dwte collide when tokens repeat: serial over (b,t). */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *e = dwte + (size_t)tok[b * T + t] * C;
            float *p = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                e[c] += d[c];
                p[c] += d[c];
            }
        }
}

/* ---- attention ---- */

/* qkv (B,T,3C), out (B,T,C), preatt/att (B,NH,T,T) */
static void cpu_attention_fwd(float *out, float *preatt, float *att, const float *qkv, int B,
                              int T, int C, int NH, int causal)
{
    int hs = C / NH;
    float sc = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                int tend = causal ? t + 1 : T;
                float mx = -INFINITY;
                for (int t2 = 0; t2 < tend; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
                    float v = 0.0f;
                    for (int i = 0; i < hs; i++)
                        v += q[i] * k[i];
                    v *= sc;
                    pre[t2] = v;
                    if (v > mx)
                        mx = v;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 < tend; t2++) {
                    float e = expf(pre[t2] - mx);
                    a[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) {
                    if (t2 < tend) {
                        a[t2] *= inv;
                    } else {
                        a[t2] = 0.0f;
                        pre[t2] = 0.0f;
                    }
                }
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0.0f;
                for (int t2 = 0; t2 < tend; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
                    float w = a[t2];
                    for (int i = 0; i < hs; i++)
                        o[i] += w * v[i];
                }
            }
}

static void cpu_attention_bwd(float *dqkv, float *dpreatt, float *datt, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH,
                              int causal)
{
    int hs = C / NH;
    float sc = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    /* Parallel over (b,h): every write of one (b,h) pair stays inside that
     * head's slice of dqkv, so no two threads touch the same element. */
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float *da = datt + (((size_t)b * NH + h) * T + t) * T;
                float *dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                const float *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                int tend = causal ? t + 1 : T;
                for (int t2 = 0; t2 < T; t2++) {
                    da[t2] = 0.0f;
                    dpre[t2] = 0.0f;
                }
                /* out = att @ v */
                for (int t2 = 0; t2 < tend; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
                    float *dv = dqkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += v[i] * dy[i];
                        dv[i] += a[t2] * dy[i];
                    }
                    da[t2] = s;
                }
                /* softmax backward: dpre = a * (da - sum(a * da)) */
                float dot = 0.0f;
                for (int t2 = 0; t2 < tend; t2++)
                    dot += a[t2] * da[t2];
                for (int t2 = 0; t2 < tend; t2++)
                    dpre[t2] = a[t2] * (da[t2] - dot);
                /* pre = q . k * sc */
                for (int t2 = 0; t2 < tend; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
                    float *dk = dqkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
                    float g = dpre[t2] * sc;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += k[i] * g;
                        dk[i] += q[i] * g;
                    }
                }
            }
}

/* ---- cross-entropy ---- */

static void cpu_xent_fwd(float *losses, float *probs, const float *logits, const int *targets,
                         int N, int V)
{
#pragma omp parallel for if ((size_t)N * V > KERN_CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V;
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if (l[v] > mx)
                mx = l[v];
        float s = 0.0f;
        for (int v = 0; v < V; v++) {
            p[v] = expf(l[v] - mx);
            s += p[v];
        }
        float inv = 1.0f / s;
        for (int v = 0; v < V; v++)
            p[v] *= inv;
        int tg = targets[i];
        /* log-sum-exp form: exact even when p[target] underflows */
        losses[i] = tg < 0 ? 0.0f : (logf(s) + mx - l[tg]);
    }
}

static void cpu_xent_bwd(float *dlogits, const float *probs, const int *targets, float dscale,
                         int N, int V)
{
#pragma omp parallel for if ((size_t)N * V > KERN_CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        int tg = targets[i];
        if (tg < 0)
            continue;
        const float *p = probs + (size_t)i * V;
        float *d = dlogits + (size_t)i * V;
        for (int v = 0; v < V; v++)
            d[v] += (p[v] - (v == tg ? 1.0f : 0.0f)) * dscale;
    }
}

/* ---- optimizers ---- */

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float wd, int t)
{
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float mi = beta1 * m[i] + (1.0f - beta1) * g[i];
        float vi = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

static void cpu_adam_dir(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                         float beta1, float beta2, float eps, float wd, int t)
{
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for if (n > KERN_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float mi = beta1 * m[i] + (1.0f - beta1) * g[i];
        float vi = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        u[i] = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i];
    }
}

static const struct kern_backend CPU_BACKEND = {
    .name = "cpu",
    .dev = KERN_DEV_CPU,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .sync = cpu_sync,
    .set_precision = cpu_set_precision,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .sumsq = cpu_sumsq,
    .all_finite = cpu_all_finite,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .xent_fwd = cpu_xent_fwd,
    .xent_bwd = cpu_xent_bwd,
    .adamw = cpu_adamw,
    .adam_dir = cpu_adam_dir,
};

const struct kern_backend *kern_backend_cpu(void)
{
    pthread_once(&g_cpu_once, cpu_init_once);
    return &CPU_BACKEND;
}
