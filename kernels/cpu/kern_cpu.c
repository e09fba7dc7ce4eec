/* The CPU backend: the reference implementation of every op in
 * kern_backend.h. Matrix products go to OpenBLAS sgemm; the other ops are
 * plain loops the compiler vectorizes. Work large enough to pay for it is
 * split into one contiguous slice per core on our own worker threads
 * (kern_pool.h says why not OpenMP); OpenBLAS runs single-threaded inside
 * each slice, so there is one thread pool, not two competing ones. The
 * layer-norm, attention and GELU loops follow llm.c's train_gpt2.c, which is
 * itself checked against PyTorch; our fixtures (tests/fixtures/kernels/)
 * check them again.
 *
 * All pointers are host memory. Backward ops accumulate into gradients. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_pool.h"

/* Below this many elements an elementwise loop runs on one thread. */
#define KERN_CPU_PAR_MIN 32768
/* Below this many flops a matrix product runs on one thread. */
#define KERN_CPU_GEMM_PAR_MIN 4000000.0

static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

/* Each slice calls a single-threaded sgemm (see cpu_matmul_fwd). */
static void cpu_init_once(void) { openblas_set_num_threads(1); }

void kern_cpu_set_threads(int n)
{
    pthread_once(&g_cpu_once, cpu_init_once);
    kern__pool_set_threads(n);
}

int kern_cpu_threads(void) { return kern__pool_threads(); }

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

/* Arguments of the simple elementwise ops, shared by their slice functions. */
struct ew {
    float *y;
    const float *a, *b, *c;
    float s;
    double part[KERN_POOL_MAX]; /* per-slice partial results of reductions */
};

static void fill_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] = e->s;
}

static void cpu_fill(float *x, float v, size_t n)
{
    struct ew e = {.y = x, .s = v};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, fill_r, &e);
}

static void scale_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] *= e->s;
}

static void cpu_scale(float *x, float s, size_t n)
{
    struct ew e = {.y = x, .s = s};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, scale_r, &e);
}

static void axpy_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] += e->s * e->a[i];
}

static void cpu_axpy(float *y, float a, const float *x, size_t n)
{
    struct ew e = {.y = y, .s = a, .a = x};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, axpy_r, &e);
}

static void add_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] = e->a[i] + e->b[i];
}

static void cpu_add(float *out, const float *a, const float *b, size_t n)
{
    struct ew e = {.y = out, .a = a, .b = b};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, add_r, &e);
}

/* Sum of squares in the order kern_backend.h defines (KERN_SUMSQ_*), which
 * the CUDA backend follows too: the bits are the same on every backend and
 * for any thread count. Threads split the blocks (never a block), each
 * block's partial goes into an array, and the caller adds the partials in
 * block order. Only additions round (the squares are exact in double), so
 * contraction into FMAs could not change a bit either. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "sumsq needs double arithmetic evaluated in double (FLT_EVAL_METHOD 0)"
#endif
#define SQ_B KERN_SUMSQ_BLOCK
#define SQ_L KERN_SUMSQ_LANES

/* P_b of the len (<= SQ_B) elements at x. */
static double sumsq_block(const float *x, size_t len)
{
    double lane[SQ_L];
    for (int j = 0; j < SQ_L; j++)
        lane[j] = 0.0;
    size_t i = 0;
    for (; i + SQ_L <= len; i += SQ_L) /* whole rows: vectorizes across lanes */
        for (int j = 0; j < SQ_L; j++) {
            double v = x[i + j];
            lane[j] += v * v;
        }
    for (int j = 0; i + (size_t)j < len; j++) {
        double v = x[i + j];
        lane[j] += v * v;
    }
    for (int h = SQ_L / 2; h > 0; h >>= 1)
        for (int j = 0; j < h; j++)
            lane[j] += lane[j + h];
    return lane[0];
}

struct sq {
    const float *x;
    size_t n;
    double *part; /* one per block */
};

/* blocks [lo, hi) */
static void sumsq_r(void *p, size_t lo, size_t hi, int tid)
{
    struct sq *q = p;
    (void)tid;
    for (size_t b = lo; b < hi; b++) {
        size_t off = b * SQ_B, len = q->n - off < SQ_B ? q->n - off : SQ_B;
        q->part[b] = sumsq_block(q->x + off, len);
    }
}

static double cpu_sumsq(const float *x, size_t n)
{
    size_t nb = (n + SQ_B - 1) / SQ_B;
    double s = 0.0;
    double stack[64];
    struct sq q = {.x = x, .n = n, .part = nb <= 64 ? stack : malloc(nb * sizeof(double))};
    if (!q.part) { /* no memory for the partials: the same sum on this thread */
        for (size_t b = 0; b < nb; b++)
            s += sumsq_block(x + b * SQ_B, n - b * SQ_B < SQ_B ? n - b * SQ_B : SQ_B);
        return s;
    }
    kern__parallel_for(nb, KERN_CPU_PAR_MIN / SQ_B, sumsq_r, &q);
    for (size_t b = 0; b < nb; b++) /* block order, whatever the thread count */
        s += q.part[b];
    if (q.part != stack)
        free(q.part);
    return s;
}

static void nonfinite_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    int bad = 0;
    for (size_t i = lo; i < hi; i++)
        bad |= !isfinite(e->a[i]);
    e->part[tid] = bad;
}

static int cpu_all_finite(const float *x, size_t n)
{
    struct ew e = {.a = x};
    int nt = kern__parallel_for(n, KERN_CPU_PAR_MIN, nonfinite_r, &e);
    for (int t = 0; t < nt; t++)
        if (e.part[t] != 0.0)
            return 0;
    return 1;
}

/* ---- dense ---- */

struct mm {
    float *out, *dinp, *dw, *dbias;
    const float *inp, *w, *bias, *dout;
    int N, C, OC;
};

/* out rows [lo, hi) = inp rows @ w^T + bias */
static void mm_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct mm *m = p;
    (void)tid;
    int OC = m->OC, C = m->C;
    if (m->bias)
        for (size_t i = lo; i < hi; i++)
            memcpy(m->out + i * OC, m->bias, sizeof(float) * OC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(hi - lo), OC, C, 1.0f,
                m->inp + lo * C, C, m->w, C, m->bias ? 1.0f : 0.0f, m->out + lo * OC, OC);
}

/* out (N,OC) = inp (N,C) @ w^T + bias; rows split across threads */
static void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC)
{
    struct mm m = {.out = out, .inp = inp, .w = w, .bias = bias, .N = N, .C = C, .OC = OC};
    double flops = 2.0 * N * C * OC;
    kern__parallel_for((size_t)N, flops > KERN_CPU_GEMM_PAR_MIN ? 2 : (size_t)N + 1, mm_fwd_r,
                       &m);
}

/* dinp rows [lo, hi) += dout rows @ w */
static void mm_dinp_r(void *p, size_t lo, size_t hi, int tid)
{
    struct mm *m = p;
    (void)tid;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(hi - lo), m->C, m->OC, 1.0f,
                m->dout + lo * m->OC, m->OC, m->w, m->C, 1.0f, m->dinp + lo * m->C, m->C);
}

/* dw rows [lo, hi) += dout[:, lo:hi]^T @ inp; dbias[lo:hi] += column sums */
static void mm_dw_r(void *p, size_t lo, size_t hi, int tid)
{
    struct mm *m = p;
    (void)tid;
    int OC = m->OC, C = m->C, N = m->N;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(hi - lo), C, N, 1.0f, m->dout + lo,
                OC, m->inp, C, 1.0f, m->dw + lo * C, C);
    if (m->dbias)
        for (int i = 0; i < N; i++) {
            const float *row = m->dout + (size_t)i * OC;
            for (size_t o = lo; o < hi; o++)
                m->dbias[o] += row[o];
        }
}

/* dinp (N,C) += dout (N,OC) @ w (OC,C): rows of dinp split across threads;
 * dw (OC,C) += dout^T @ inp (N,C) and dbias (OC) += sum_rows dout: rows of
 * dw (columns of dout) split, so no two threads write the same element. */
static void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC)
{
    struct mm m = {.dinp = dinp, .dw = dw, .dbias = dbias, .dout = dout, .inp = inp, .w = w,
                   .N = N, .C = C, .OC = OC};
    int par = 2.0 * N * C * OC > KERN_CPU_GEMM_PAR_MIN;
    if (dinp)
        kern__parallel_for((size_t)N, par ? 2 : (size_t)N + 1, mm_dinp_r, &m);
    kern__parallel_for((size_t)OC, par ? 2 : (size_t)OC + 1, mm_dw_r, &m);
}

/* ---- activations ---- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static void relu_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] = e->a[i] > 0.0f ? e->a[i] : 0.0f;
}

static void cpu_relu_fwd(float *out, const float *inp, size_t n)
{
    struct ew e = {.y = out, .a = inp};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, relu_fwd_r, &e);
}

static void relu_bwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] += e->a[i] > 0.0f ? e->b[i] : 0.0f;
}

static void cpu_relu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    struct ew e = {.y = dinp, .a = inp, .b = dout};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, relu_bwd_r, &e);
}

static void gelu_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++) {
        float x = e->a[i];
        float cube = 0.044715f * x * x * x;
        e->y[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
    }
}

static void cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
    struct ew e = {.y = out, .a = inp};
    kern__parallel_for(n, KERN_CPU_PAR_MIN / 4, gelu_fwd_r, &e);
}

static void gelu_bwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++) {
        float x = e->a[i];
        float cube = 0.044715f * x * x * x;
        float th = tanhf(GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        e->y[i] += local * e->b[i];
    }
}

static void cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    struct ew e = {.y = dinp, .a = inp, .b = dout};
    kern__parallel_for(n, KERN_CPU_PAR_MIN / 4, gelu_bwd_r, &e);
}

static void tanh_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++)
        e->y[i] = tanhf(e->a[i]);
}

static void cpu_tanh_fwd(float *out, const float *inp, size_t n)
{
    struct ew e = {.y = out, .a = inp};
    kern__parallel_for(n, KERN_CPU_PAR_MIN / 4, tanh_fwd_r, &e);
}

static void tanh_bwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ew *e = p;
    (void)tid;
    for (size_t i = lo; i < hi; i++) {
        float th = tanhf(e->a[i]);
        e->y[i] += (1.0f - th * th) * e->b[i];
    }
}

static void cpu_tanh_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    struct ew e = {.y = dinp, .a = inp, .b = dout};
    kern__parallel_for(n, KERN_CPU_PAR_MIN / 4, tanh_bwd_r, &e);
}

/* ---- layer norm ---- */

struct ln {
    float *out, *mean, *rstd, *dinp, *dw, *db;
    const float *inp, *w, *b, *dout, *cmean, *crstd;
    int N, C;
};

static void ln_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ln *l = p;
    (void)tid;
    const float eps = 1e-5f;
    int C = l->C;
    for (size_t i = lo; i < hi; i++) {
        const float *x = l->inp + i * C;
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
        float *o = l->out + i * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * l->w[c] + l->b[c];
        l->mean[i] = m;
        l->rstd[i] = s;
    }
}

static void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
    struct ln l = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .w = w, .b = b, .N = N,
                   .C = C};
    kern__parallel_for((size_t)N, KERN_CPU_PAR_MIN / (size_t)C + 1, ln_fwd_r, &l);
}

/* dinp rows [lo, hi) */
static void ln_bwd_x_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ln *l = p;
    (void)tid;
    int C = l->C;
    for (size_t i = lo; i < hi; i++) {
        const float *dy = l->dout + i * C, *x = l->inp + i * C;
        float *dx = l->dinp + i * C;
        float m = l->cmean[i], s = l->crstd[i];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float nrm = (x[c] - m) * s;
            float dn = l->w[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * nrm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            float nrm = (x[c] - m) * s;
            float dn = l->w[c] * dy[c];
            dx[c] += (dn - dnorm_mean - nrm * dnorm_norm_mean) * s;
        }
    }
}

/* dw, db channels [lo, hi): walk all rows, contiguous inner loop */
static void ln_bwd_w_r(void *p, size_t lo, size_t hi, int tid)
{
    struct ln *l = p;
    (void)tid;
    int C = l->C;
    for (int i = 0; i < l->N; i++) {
        const float *dy = l->dout + (size_t)i * C, *x = l->inp + (size_t)i * C;
        float m = l->cmean[i], r = l->crstd[i];
        for (size_t c = lo; c < hi; c++) {
            l->dw[c] += (x[c] - m) * r * dy[c];
            l->db[c] += dy[c];
        }
    }
}

static void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C)
{
    struct ln l = {.dinp = dinp, .dw = dw, .db = db, .dout = dout, .inp = inp, .w = w,
                   .cmean = mean, .crstd = rstd, .N = N, .C = C};
    size_t big = (size_t)N * C > KERN_CPU_PAR_MIN;
    kern__parallel_for((size_t)N, big ? 2 : (size_t)N + 1, ln_bwd_x_r, &l);
    kern__parallel_for((size_t)C, big ? 2 : (size_t)C + 1, ln_bwd_w_r, &l);
}

/* ---- embeddings ---- */

struct emb {
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const int *tok;
    int T, C;
};

/* rows (b*T + t) in [lo, hi) */
static void emb_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct emb *e = p;
    (void)tid;
    int C = e->C;
    for (size_t bt = lo; bt < hi; bt++) {
        float *o = e->out + bt * C;
        const float *te = e->wte + (size_t)e->tok[bt] * C;
        const float *pe = e->wpe + (bt % (size_t)e->T) * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

static void cpu_embed_fwd(float *out, const int *tok, const float *wte, const float *wpe, int B,
                          int T, int C)
{
    struct emb e = {.out = out, .tok = tok, .wte = wte, .wpe = wpe, .T = T, .C = C};
    kern__parallel_for((size_t)B * T, KERN_CPU_PAR_MIN / (size_t)C + 1, emb_fwd_r, &e);
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

struct att {
    float *out, *preatt, *att, *dqkv, *dpreatt, *datt;
    const float *qkv, *catt, *dout;
    int B, T, C, NH, causal;
};

/* forward over flattened (b, t, h) in [lo, hi) */
static void att_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct att *A = p;
    (void)tid;
    int T = A->T, C = A->C, NH = A->NH;
    int hs = C / NH;
    float sc = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    for (size_t idx = lo; idx < hi; idx++) {
        int h = (int)(idx % NH), t = (int)(idx / NH % T), b = (int)(idx / ((size_t)NH * T));
        const float *q = A->qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
        float *pre = A->preatt + (((size_t)b * NH + h) * T + t) * T;
        float *a = A->att + (((size_t)b * NH + h) * T + t) * T;
        int tend = A->causal ? t + 1 : T;
        float mx = -INFINITY;
        for (int t2 = 0; t2 < tend; t2++) {
            const float *k = A->qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
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
        float *o = A->out + ((size_t)b * T + t) * C + (size_t)h * hs;
        for (int i = 0; i < hs; i++)
            o[i] = 0.0f;
        for (int t2 = 0; t2 < tend; t2++) {
            const float *v = A->qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
            float w = a[t2];
            for (int i = 0; i < hs; i++)
                o[i] += w * v[i];
        }
    }
}

/* qkv (B,T,3C), out (B,T,C), preatt/att (B,NH,T,T) */
static void cpu_attention_fwd(float *out, float *preatt, float *att, const float *qkv, int B,
                              int T, int C, int NH, int causal)
{
    struct att A = {.out = out, .preatt = preatt, .att = att, .qkv = qkv, .B = B, .T = T, .C = C,
                    .NH = NH, .causal = causal};
    kern__parallel_for((size_t)B * T * NH, 2, att_fwd_r, &A);
}

/* backward over flattened (b, h) in [lo, hi): every write of one (b,h) pair
 * stays inside that head's slice of dqkv, so slices never collide */
static void att_bwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct att *A = p;
    (void)tid;
    int T = A->T, C = A->C, NH = A->NH;
    int hs = C / NH;
    float sc = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    for (size_t bh = lo; bh < hi; bh++) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        for (int t = 0; t < T; t++) {
            const float *a = A->catt + (((size_t)b * NH + h) * T + t) * T;
            float *da = A->datt + (((size_t)b * NH + h) * T + t) * T;
            float *dpre = A->dpreatt + (((size_t)b * NH + h) * T + t) * T;
            const float *q = A->qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
            float *dq = A->dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
            const float *dy = A->dout + ((size_t)b * T + t) * C + (size_t)h * hs;
            int tend = A->causal ? t + 1 : T;
            for (int t2 = 0; t2 < T; t2++) {
                da[t2] = 0.0f;
                dpre[t2] = 0.0f;
            }
            /* out = att @ v */
            for (int t2 = 0; t2 < tend; t2++) {
                const float *v = A->qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
                float *dv = A->dqkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + 2 * C;
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
                const float *k = A->qkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
                float *dk = A->dqkv + ((size_t)b * T + t2) * C3 + (size_t)h * hs + C;
                float g = dpre[t2] * sc;
                for (int i = 0; i < hs; i++) {
                    dq[i] += k[i] * g;
                    dk[i] += q[i] * g;
                }
            }
        }
    }
}

static void cpu_attention_bwd(float *dqkv, float *dpreatt, float *datt, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH,
                              int causal)
{
    struct att A = {.dqkv = dqkv, .dpreatt = dpreatt, .datt = datt, .dout = dout, .qkv = qkv,
                    .catt = att, .B = B, .T = T, .C = C, .NH = NH, .causal = causal};
    kern__parallel_for((size_t)B * NH, 2, att_bwd_r, &A);
}

/* ---- cross-entropy ---- */

struct xe {
    float *losses, *probs, *dlogits;
    const float *logits, *cprobs;
    const int *targets;
    float dscale;
    int V;
};

static void xent_fwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct xe *x = p;
    (void)tid;
    int V = x->V;
    for (size_t i = lo; i < hi; i++) {
        const float *l = x->logits + i * V;
        float *pr = x->probs + i * V;
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if (l[v] > mx)
                mx = l[v];
        float s = 0.0f;
        for (int v = 0; v < V; v++) {
            pr[v] = expf(l[v] - mx);
            s += pr[v];
        }
        float inv = 1.0f / s;
        for (int v = 0; v < V; v++)
            pr[v] *= inv;
        int tg = x->targets[i];
        /* log-sum-exp form: exact even when p[target] underflows */
        x->losses[i] = tg < 0 ? 0.0f : (logf(s) + mx - l[tg]);
    }
}

static void cpu_xent_fwd(float *losses, float *probs, const float *logits, const int *targets,
                         int N, int V)
{
    struct xe x = {.losses = losses, .probs = probs, .logits = logits, .targets = targets, .V = V};
    kern__parallel_for((size_t)N, KERN_CPU_PAR_MIN / (size_t)V + 1, xent_fwd_r, &x);
}

static void xent_bwd_r(void *p, size_t lo, size_t hi, int tid)
{
    struct xe *x = p;
    (void)tid;
    int V = x->V;
    for (size_t i = lo; i < hi; i++) {
        int tg = x->targets[i];
        if (tg < 0)
            continue;
        const float *pr = x->cprobs + i * V;
        float *d = x->dlogits + i * V;
        for (int v = 0; v < V; v++)
            d[v] += (pr[v] - (v == tg ? 1.0f : 0.0f)) * x->dscale;
    }
}

static void cpu_xent_bwd(float *dlogits, const float *probs, const int *targets, float dscale,
                         int N, int V)
{
    struct xe x = {.dlogits = dlogits, .cprobs = probs, .targets = targets, .dscale = dscale,
                   .V = V};
    kern__parallel_for((size_t)N, KERN_CPU_PAR_MIN / (size_t)V + 1, xent_bwd_r, &x);
}

struct hits {
    const float *probs;
    const int *targets;
    int V;
    long part[KERN_POOL_MAX];
};

static void hits_r(void *p, size_t lo, size_t hi, int tid)
{
    struct hits *x = p;
    long n = 0;
    for (size_t i = lo; i < hi; i++) {
        int tg = x->targets[i];
        if (tg < 0)
            continue;
        /* only the target's rank matters: a hit when no column before it
           is >= it and none after it is above it (the first largest wins);
           branch-free, so the compiler vectorizes the two scans */
        const float *r = x->probs + i * (size_t)x->V;
        float pt = r[tg];
        int above = 0;
        for (int v = 0; v < tg; v++)
            above |= r[v] >= pt;
        for (int v = tg + 1; v < x->V; v++)
            above |= r[v] > pt;
        n += !above;
    }
    x->part[tid] = n;
}

static long cpu_argmax_hits(const float *probs, const int *targets, int N, int V)
{
    struct hits x = {.probs = probs, .targets = targets, .V = V};
    /* rows of V columns, most of them skipped: split as xent does */
    int nt = kern__parallel_for((size_t)N, KERN_CPU_PAR_MIN / (size_t)V + 1, hits_r, &x);
    long n = 0;
    for (int t = 0; t < nt; t++)
        n += x.part[t];
    return n;
}

/* ---- optimizers ---- */

struct opt {
    float *p, *m, *v, *u;
    const float *g, *cp;
    float lr, b1, b2, eps, wd, bc1, bc2;
};

static void adamw_r(void *ctx, size_t lo, size_t hi, int tid)
{
    struct opt *o = ctx;
    (void)tid;
    for (size_t i = lo; i < hi; i++) {
        float g = o->g[i];
        float mi = o->b1 * o->m[i] + (1.0f - o->b1) * g;
        float vi = o->b2 * o->v[i] + (1.0f - o->b2) * g * g;
        o->m[i] = mi;
        o->v[i] = vi;
        float mh = mi / o->bc1, vh = vi / o->bc2;
        o->p[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + o->wd * o->p[i]);
    }
}

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float wd, int t)
{
    struct opt o = {.p = p, .g = g, .m = m, .v = v, .lr = lr, .b1 = beta1, .b2 = beta2,
                    .eps = eps, .wd = wd, .bc1 = 1.0f - powf(beta1, (float)t),
                    .bc2 = 1.0f - powf(beta2, (float)t)};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, adamw_r, &o);
}

static void adam_dir_r(void *ctx, size_t lo, size_t hi, int tid)
{
    struct opt *o = ctx;
    (void)tid;
    for (size_t i = lo; i < hi; i++) {
        float g = o->g[i];
        float mi = o->b1 * o->m[i] + (1.0f - o->b1) * g;
        float vi = o->b2 * o->v[i] + (1.0f - o->b2) * g * g;
        o->m[i] = mi;
        o->v[i] = vi;
        o->u[i] = (mi / o->bc1) / (sqrtf(vi / o->bc2) + o->eps) + o->wd * o->cp[i];
    }
}

static void cpu_adam_dir(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                         float beta1, float beta2, float eps, float wd, int t)
{
    struct opt o = {.u = u, .cp = p, .g = g, .m = m, .v = v, .b1 = beta1, .b2 = beta2,
                    .eps = eps, .wd = wd, .bc1 = 1.0f - powf(beta1, (float)t),
                    .bc2 = 1.0f - powf(beta2, (float)t)};
    kern__parallel_for(n, KERN_CPU_PAR_MIN, adam_dir_r, &o);
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
    .tanh_fwd = cpu_tanh_fwd,
    .tanh_bwd = cpu_tanh_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .xent_fwd = cpu_xent_fwd,
    .xent_bwd = cpu_xent_bwd,
    .argmax_hits = cpu_argmax_hits,
    .adamw = cpu_adamw,
    .adam_dir = cpu_adam_dir,
};

const struct kern_backend *kern_backend_cpu(void)
{
    pthread_once(&g_cpu_once, cpu_init_once);
    return &CPU_BACKEND;
}
