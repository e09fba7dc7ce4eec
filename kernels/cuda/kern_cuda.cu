/* The CUDA backend: every op of kern_backend.h on one GPU, cuBLAS for the
 * matrix products and small kernels of our own for the rest. It is tested
 * against the CPU reference (tests/unit/kernels/test_backends.c under
 * `make test-gpu`); the kernels are written for clarity first, after the
 * simple versions in llm.c's dev/cuda/ (one thread per output element or one
 * block per row). The optimizer steps are in kern_cuda_optim.cu,
 * the matrix products in kern_cuda_gemm.cu, cross-entropy and argmax hits
 * in kern_cuda_xent.cu, sharing this file's launch helpers through
 * kern_cuda_int.h (and the row reductions of kern_cuda_rows.cuh).
 *
 * Precision: tensors are fp32 in memory (so parameters, gradients and
 * optimizer state are the fp32 master copies). Matrix products (cuBLAS, in
 * kern_cuda_gemm.cu) follow set_precision: "bf16" rounds both operands to
 * bf16 and multiplies on bf16 tensor cores with fp32 accumulation; "tf32",
 * "fp16" and "fp32" use cuBLAS's compute types on the fp32 operands; below
 * sm_80 (no bf16 or tf32 tensor cores) "bf16" and "tf32" run as plain fp32
 * (kern_gpu_precision).
 *
 * Architectures: built for every one in kernels/module.mk's CUDA_ARCHS plus
 * PTX; the kernels use nothing newer than sm_60 (fp32 and fp64 atomicAdd,
 * the _rn intrinsics), so no path needs a __CUDA_ARCH__ guard. What the
 * build holds and what the device is are reported to kern_gpu_check
 * (kern__cuda_build, kern__cuda_facts, in kern_cuda_facts.cu) before the
 * backend is initialized.
 *
 * Errors: ops are asynchronous and return nothing; a failed launch or cuBLAS
 * call is logged once and latched, and the next sync/download/upload returns
 * CM_EDEVICE. Built only when nvcc is present (kernels/module.mk). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cm_err.h"
#include "cm_log.h"
#include "kern_backend.h"
#include "kern_gpu.h"
}
#include "kern_cuda_int.h"
#include "kern_cuda_rows.cuh"

#if !defined(CT_CUDA_SASS) || !defined(CT_CUDA_PTX)
#error "kernels/module.mk passes the architecture lists as CT_CUDA_SASS and CT_CUDA_PTX"
#endif

static int g_cc; /* device 0's capability, 10 * major + minor */
static int g_failed;
static double *g_red;   /* device scratch for reductions */
static int *g_flag;

static void cuda_note(cudaError_t e, const char *what)
{
    if (e != cudaSuccess && !g_failed) {
        CM_LOGE("cuda", "%s: %s", what, cudaGetErrorString(e));
        g_failed = 1;
    }
}

void kern__cuda_note(int e, const char *what)
{
    cuda_note((cudaError_t)e, what);
}

void kern__cuda_fail(const char *what, const char *detail)
{
    if (!g_failed) {
        CM_LOGE("cuda", "%s: %s", what, detail);
        g_failed = 1;
    }
}

int kern__cuda_failed(void)
{
    return g_failed;
}

void kern__cuda_launch_check(const char *what)
{
    cuda_note(cudaGetLastError(), what);
}

static int status(void)
{
    cuda_note(cudaGetLastError(), "kernel launch");
    return g_failed ? CM_EDEVICE : CM_OK;
}

unsigned kern__cuda_blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

/* ---- memory ---- */

static int cu_alloc(size_t bytes, void **out)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 4);
    if (e != cudaSuccess) {
        CM_LOGE("cuda", "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
        return CM_ENOMEM;
    }
    e = cudaMemset(p, 0, bytes ? bytes : 4);
    if (e != cudaSuccess) {
        cudaFree(p);
        cuda_note(e, "cudaMemset");
        return CM_EDEVICE;
    }
    *out = p;
    return CM_OK;
}

static void cu_release(void *p)
{
    if (p)
        cudaFree(p);
}

static int cu_upload(void *dst, const void *src, size_t bytes)
{
    cuda_note(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
    return status();
}

static int cu_download(void *dst, const void *src, size_t bytes)
{
    cuda_note(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
    return status();
}

static int cu_copy(void *dst, const void *src, size_t bytes)
{
    cuda_note(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
    return status();
}

static int cu_sync(void)
{
    cuda_note(cudaDeviceSynchronize(), "synchronize");
    return status();
}

static int cu_set_precision(const char *asked)
{
    const char *mode = kern_gpu_precision(g_cc, asked);
    if (mode != asked)
        CM_LOGI("cuda", "sm_%d has no %s tensor cores: matrix products run in %s", g_cc, asked,
                mode);
    return kern__cuda_gemm_precision(mode);
}

/* ---- elementwise: x (n) ---- */

__global__ void k_fill(float *x, float v, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

__global__ void k_scale(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

/* Not contracted to an FMA (see "optimizers" below): LAMB's update
 * goes through axpy, so it must round like the CPU's mul-then-add. */
__global__ void k_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

/* Sum of squares in the order kern_backend.h defines for every backend
 * (KERN_SUMSQ_*), so it gives the CPU's bits: one CUDA block of
 * KERN_SUMSQ_LANES threads per KERN_SUMSQ_BLOCK elements, thread j being
 * lane j (its elements j, j + LANES, ... in turn), then the halving tree in
 * shared memory; the partials are added in block order by one thread
 * (k_sum_in_order).
 * Spelled with _rn intrinsics so nothing is contracted or reordered (the
 * squares are exact anyway). No atomics: the same bits on every run. */
__global__ void __launch_bounds__(KERN_SUMSQ_LANES)
k_sumsq_blocks(double *part, const float *x, size_t n)
{
    __shared__ double sh[KERN_SUMSQ_LANES];
    size_t base = (size_t)blockIdx.x * KERN_SUMSQ_BLOCK;
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < KERN_SUMSQ_BLOCK / KERN_SUMSQ_LANES; k++) {
        size_t i = base + (size_t)k * KERN_SUMSQ_LANES + threadIdx.x;
        if (i < n) {
            double v = (double)x[i];
            s = __dadd_rn(s, __dmul_rn(v, v));
        }
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int h = KERN_SUMSQ_LANES / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h)
            sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + h]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = sh[0];
}

/* out = (...(0 + part[0]) + part[1]) + ...: one thread adds in block order
 * (a chain of dependent additions; no other order gives the same bits),
 * the block's other threads stage the partials in shared memory so the
 * chain does not wait on global loads (the whole sumsq of GPT-2 small,
 * 30,381 partials, took 1.58 ms with one thread loading, 0.38 ms so, H100). */
#define SUM_CHUNK 2048
__global__ void __launch_bounds__(256) k_sum_in_order(double *out, const double *part, size_t nb)
{
    __shared__ double sh[SUM_CHUNK];
    double s = 0.0;
    for (size_t c = 0; c < nb; c += SUM_CHUNK) {
        int m = nb - c < SUM_CHUNK ? (int)(nb - c) : SUM_CHUNK;
        for (int i = threadIdx.x; i < m; i += blockDim.x)
            sh[i] = part[c + i];
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll 16
            for (int i = 0; i < m; i++)
                s = __dadd_rn(s, sh[i]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = s;
}

__global__ void k_nonfinite(int *flag, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (!isfinite(x[i]))
            *flag = 1;
}

static void cu_fill(float *x, float v, size_t n)
{
    if (v == 0.0f && !signbit(v)) { /* +0.0f is all zero bytes: the driver's memset is faster */
        cuda_note(cudaMemsetAsync(x, 0, n * sizeof *x), "fill");
        return;
    }
    k_fill<<<kern__cuda_blocks_for(n, 256), 256>>>(x, v, n);
    LAUNCH_CHECK("fill");
}

static void cu_scale(float *x, float s, size_t n)
{
    k_scale<<<kern__cuda_blocks_for(n, 256), 256>>>(x, s, n);
    LAUNCH_CHECK("scale");
}

static void cu_axpy(float *y, float a, const float *x, size_t n)
{
    k_axpy<<<kern__cuda_blocks_for(n, 256), 256>>>(y, a, x, n);
    LAUNCH_CHECK("axpy");
}

static void cu_add(float *out, const float *a, const float *b, size_t n)
{
    k_add<<<kern__cuda_blocks_for(n, 256), 256>>>(out, a, b, n);
    LAUNCH_CHECK("add");
}

/* Partials of cu_sumsq: g_red[0] holds the result, g_red[1..] the blocks'
 * partials; grown on demand, never shrunk. */
static size_t g_red_cap;

static double cu_sumsq(const float *x, size_t n)
{
    size_t nb = (n + KERN_SUMSQ_BLOCK - 1) / KERN_SUMSQ_BLOCK;
    if (nb == 0)
        return g_failed ? NAN : 0.0;
    if (nb > 0x7fffffffu) {
        cuda_note(cudaErrorInvalidValue, "sumsq: too many blocks");
        return NAN;
    }
    if (nb + 1 > g_red_cap) {
        double *p = NULL;
        cudaError_t e = cudaMalloc(&p, (nb + 1) * sizeof(double));
        if (e != cudaSuccess) {
            cuda_note(e, "sumsq: partials");
            return NAN;
        }
        cudaFree(g_red);
        g_red = p;
        g_red_cap = nb + 1;
    }
    double h = 0.0;
    k_sumsq_blocks<<<(unsigned)nb, KERN_SUMSQ_LANES>>>(g_red + 1, x, n);
    LAUNCH_CHECK("sumsq");
    k_sum_in_order<<<1, 256>>>(g_red, g_red + 1, nb);
    LAUNCH_CHECK("sumsq");
    cuda_note(cudaMemcpy(&h, g_red, sizeof h, cudaMemcpyDeviceToHost), "sumsq");
    return g_failed ? NAN : h;
}

static int cu_all_finite(const float *x, size_t n)
{
    int h = 0;
    cuda_note(cudaMemset(g_flag, 0, sizeof(int)), "all_finite");
    k_nonfinite<<<kern__cuda_blocks_for(n, 256), 256>>>(g_flag, x, n);
    LAUNCH_CHECK("all_finite");
    cuda_note(cudaMemcpy(&h, g_flag, sizeof h, cudaMemcpyDeviceToHost), "all_finite");
    return !h && !g_failed;
}

/* ---- dense ---- */

/* out (N,OC) row i = bias */
__global__ void k_bias_rows(float *out, const float *bias, int N, int OC)
{
    size_t n = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % OC];
}

/* Column reductions over N rows (bias and LayerNorm weight gradients).
 * Block (32, 8) covers 32 adjacent columns (coalesced reads); grid.y splits
 * the rows so a (16k x 768) reduction uses the whole GPU rather than 3
 * blocks; the per-block partial sums meet in one atomicAdd per column. */
#define COL_TX 32
#define COL_TY 8

static dim3 col_grid(int N, int C)
{
    int gy = (N + 255) / 256;
    return dim3((C + COL_TX - 1) / COL_TX, gy > 1024 ? 1024 : (gy ? gy : 1));
}

/* dbias (OC) += column sums of dout (N,OC) */
__global__ void k_colsum(float *dbias, const float *dout, int N, int OC)
{
    __shared__ float sh[COL_TY][COL_TX];
    int o = blockIdx.x * COL_TX + threadIdx.x;
    float s = 0.0f;
    if (o < OC)
        for (int i = blockIdx.y * COL_TY + threadIdx.y; i < N; i += gridDim.y * COL_TY)
            s += dout[(size_t)i * OC + o];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        for (int k = 1; k < COL_TY; k++)
            s += sh[k][threadIdx.x];
        atomicAdd(&dbias[o], s);
    }
}

/* Row-major A (M,K) is column-major A^T; the products below are the
 * transposed forms of the row-major formulas in kern_backend.h. */
#define OP_N 0
#define OP_T 1
static void gemm(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc, const char *what)
{
    kern__cuda_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc, what);
}

static void cu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                          int C, int OC)
{
    if (bias) {
        k_bias_rows<<<kern__cuda_blocks_for((size_t)N * OC, 256), 256>>>(out, bias, N, OC);
        LAUNCH_CHECK("bias");
    }
    /* out^T (OC,N) = w (OC,C) . inp^T (C,N) */
    gemm(OP_T, OP_N, OC, N, C, w, C, inp, C, bias ? 1.0f : 0.0f, out, OC,
         "matmul_fwd");
}

static void cu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC)
{
    if (dinp) /* dinp^T (C,N) += w^T (C,OC) . dout^T (OC,N) */
        gemm(OP_N, OP_N, C, N, OC, w, C, dout, OC, 1.0f, dinp, C, "matmul_bwd dinp");
    /* dw^T (C,OC) += inp^T (C,N) . dout (N,OC) */
    gemm(OP_N, OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dw, C, "matmul_bwd dw");
    if (dbias) {
        k_colsum<<<col_grid(N, OC), dim3(COL_TX, COL_TY)>>>(dbias, dout, N, OC);
        LAUNCH_CHECK("matmul_bwd dbias");
    }
}

/* ---- activations ---- */

#define GELU_SCALE 0.7978845608028654f

__global__ void k_relu_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

__global__ void k_relu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float local = 0.5f * (1.0f + th) + x * 0.5f * (1.0f - th * th) * GELU_SCALE *
                                               (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local * dout[i];
    }
}

__global__ void k_tanh_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tanhf(inp[i]);
}

__global__ void k_tanh_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float th = tanhf(inp[i]);
        dinp[i] += (1.0f - th * th) * dout[i];
    }
}

static void cu_relu_fwd(float *out, const float *inp, size_t n)
{
    k_relu_fwd<<<kern__cuda_blocks_for(n, 256), 256>>>(out, inp, n);
    LAUNCH_CHECK("relu_fwd");
}

static void cu_relu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    k_relu_bwd<<<kern__cuda_blocks_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK("relu_bwd");
}

static void cu_gelu_fwd(float *out, const float *inp, size_t n)
{
    k_gelu_fwd<<<kern__cuda_blocks_for(n, 256), 256>>>(out, inp, n);
    LAUNCH_CHECK("gelu_fwd");
}

static void cu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    k_gelu_bwd<<<kern__cuda_blocks_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK("gelu_bwd");
}

static void cu_tanh_fwd(float *out, const float *inp, size_t n)
{
    k_tanh_fwd<<<kern__cuda_blocks_for(n, 256), 256>>>(out, inp, n);
    LAUNCH_CHECK("tanh_fwd");
}

static void cu_tanh_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    k_tanh_bwd<<<kern__cuda_blocks_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK("tanh_bwd");
}

/* ---- layer norm: one block per row ---- */

__global__ void k_ln_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int C)
{
    __shared__ float sh[ROW_THREADS];
    const float *x = inp + (size_t)blockIdx.x * C;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c];
    float m = block_sum(s, sh) / C;
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        v += (x[c] - m) * (x[c] - m);
    float r = rsqrtf(block_sum(v, sh) / C + 1e-5f);
    float *o = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (x[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
}

__global__ void k_ln_bwd_x(float *dinp, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int C)
{
    __shared__ float sh[ROW_THREADS];
    size_t row = blockIdx.x;
    const float *dy = dout + row * C, *x = inp + row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bb = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dn = w[c] * dy[c];
        a += dn;
        bb += dn * (x[c] - m) * r;
    }
    a = block_sum(a, sh) / C;
    bb = block_sum(bb, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float nrm = (x[c] - m) * r;
        dinp[row * C + c] += (w[c] * dy[c] - a - nrm * bb) * r;
    }
}

/* dw, db (C): column reductions laid out like k_colsum */
__global__ void k_ln_bwd_w(float *dw, float *db, const float *dout, const float *inp,
                           const float *mean, const float *rstd, int N, int C)
{
    __shared__ float shw[COL_TY][COL_TX], shb[COL_TY][COL_TX];
    int c = blockIdx.x * COL_TX + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int i = blockIdx.y * COL_TY + threadIdx.y; i < N; i += gridDim.y * COL_TY) {
            float dy = dout[(size_t)i * C + c];
            sw += (inp[(size_t)i * C + c] - mean[i]) * rstd[i] * dy;
            sb += dy;
        }
    shw[threadIdx.y][threadIdx.x] = sw;
    shb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int k = 1; k < COL_TY; k++) {
            sw += shw[k][threadIdx.x];
            sb += shb[k][threadIdx.x];
        }
        atomicAdd(&dw[c], sw);
        atomicAdd(&db[c], sb);
    }
}

static void cu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C)
{
    k_ln_fwd<<<N, ROW_THREADS>>>(out, mean, rstd, inp, w, b, C);
    LAUNCH_CHECK("layernorm_fwd");
}

static void cu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, int N, int C)
{
    k_ln_bwd_x<<<N, ROW_THREADS>>>(dinp, dout, inp, w, mean, rstd, C);
    k_ln_bwd_w<<<col_grid(N, C), dim3(COL_TX, COL_TY)>>>(dw, db, dout, inp, mean, rstd, N, C);
    LAUNCH_CHECK("layernorm_bwd");
}

/* ---- embeddings ---- */

__global__ void k_embed_fwd(float *out, const int *tok, const float *wte, const float *wpe, int T,
                            int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = wte[(size_t)tok[bt] * C + c] + wpe[(size_t)t * C + c];
    }
}

__global__ void k_embed_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int T,
                            int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        atomicAdd(&dwte[(size_t)tok[bt] * C + c], dout[i]);
        atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
    }
}

static void cu_embed_fwd(float *out, const int *tok, const float *wte, const float *wpe, int B,
                         int T, int C)
{
    size_t n = (size_t)B * T * C;
    k_embed_fwd<<<kern__cuda_blocks_for(n, 256), 256>>>(out, tok, wte, wpe, T, C, n);
    LAUNCH_CHECK("embed_fwd");
}

static void cu_embed_bwd(float *dwte, float *dwpe, const float *dout, const int *tok, int B,
                         int T, int C)
{
    size_t n = (size_t)B * T * C;
    k_embed_bwd<<<kern__cuda_blocks_for(n, 256), 256>>>(dwte, dwpe, dout, tok, T, C, n);
    LAUNCH_CHECK("embed_bwd");
}

/* ---- attention ----
 * The products go to cuBLAS as strided batched GEMMs over the B*NH heads,
 * after llm.c's train_gpt2.cu (attention_forward / attention_backward):
 * permute qkv (B,T,3C) into q, k, v (B,NH,T,hs); preatt = q k^T / sqrt(hs);
 * att = softmax (causal mask for GPT); y = att v; unpermute to (B,T,C).
 * Backward runs the same steps in reverse. The permuted copies live in a
 * grow-only scratch buffer owned by the backend. */

static float *g_att_scratch;
static size_t g_att_scratch_n;

/* Returns scratch for n floats, or NULL (error latched). */
static float *att_scratch(size_t n)
{
    if (n <= g_att_scratch_n)
        return g_att_scratch;
    if (g_att_scratch)
        cudaFree(g_att_scratch);
    g_att_scratch = NULL;
    g_att_scratch_n = 0;
    cudaError_t e = cudaMalloc(&g_att_scratch, n * sizeof(float));
    if (e != cudaSuccess) {
        cuda_note(e, "attention scratch");
        g_att_scratch = NULL;
        return NULL;
    }
    g_att_scratch_n = n;
    return g_att_scratch;
}

/* q, k, v (B,NH,T,hs) <- qkv (B,T,3C) */
__global__ void k_permute(float *q, float *k, float *v, const float *qkv, int B, int T, int NH,
                          int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    int C = NH * hs;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % hs);
        int t = (int)(idx / hs % T);
        int h = (int)(idx / ((size_t)hs * T) % NH);
        int b = (int)(idx / ((size_t)hs * T * NH));
        size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + i;
        q[idx] = qkv[src];
        k[idx] = qkv[src + C];
        v[idx] = qkv[src + 2 * C];
    }
}

/* out (B,T,C) <- y (B,NH,T,hs) */
__global__ void k_unpermute(float *out, const float *y, int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    int C = NH * hs;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % hs);
        int t = (int)(idx / hs % T);
        int h = (int)(idx / ((size_t)hs * T) % NH);
        int b = (int)(idx / ((size_t)hs * T * NH));
        out[((size_t)b * T + t) * C + (size_t)h * hs + i] = y[idx];
    }
}

/* dy (B,NH,T,hs) <- dout (B,T,C) */
__global__ void k_permute_dout(float *dy, const float *dout, int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    int C = NH * hs;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % hs);
        int t = (int)(idx / hs % T);
        int h = (int)(idx / ((size_t)hs * T) % NH);
        int b = (int)(idx / ((size_t)hs * T * NH));
        dy[idx] = dout[((size_t)b * T + t) * C + (size_t)h * hs + i];
    }
}

/* dqkv (B,T,3C) += dq, dk, dv (B,NH,T,hs) */
__global__ void k_scatter_dqkv(float *dqkv, const float *dq, const float *dk, const float *dv,
                               int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    int C = NH * hs;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % hs);
        int t = (int)(idx / hs % T);
        int h = (int)(idx / ((size_t)hs * T) % NH);
        int b = (int)(idx / ((size_t)hs * T * NH));
        size_t dst = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + i;
        dqkv[dst] += dq[idx];
        dqkv[dst + C] += dk[idx];
        dqkv[dst + 2 * C] += dv[idx];
    }
}

/* att (rows of T) = softmax(pre) over positions 0..tend-1, 0 beyond; masked
 * pre entries are zeroed too, as on the CPU. One block per row. */
__global__ void k_softmax_rows(float *att, float *pre, int T, int causal)
{
    __shared__ float sh[ROW_THREADS];
    size_t row = blockIdx.x;
    int t = (int)(row % T), tend = causal ? t + 1 : T;
    float *p = pre + row * T, *a = att + row * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < tend; j += blockDim.x)
        mx = fmaxf(mx, p[j]);
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float e = j < tend ? expf(p[j] - mx) : 0.0f;
        a[j] = e;
        s += e;
        if (j >= tend)
            p[j] = 0.0f;
    }
    float inv = 1.0f / block_sum(s, sh);
    for (int j = threadIdx.x; j < tend; j += blockDim.x)
        a[j] *= inv;
}

/* dpre = att * (datt - sum(att * datt)) per row, 0 beyond tend */
__global__ void k_softmax_bwd_rows(float *dpre, const float *datt, const float *att, int T,
                                   int causal)
{
    __shared__ float sh[ROW_THREADS];
    size_t row = blockIdx.x;
    int t = (int)(row % T), tend = causal ? t + 1 : T;
    const float *a = att + row * T, *da = datt + row * T;
    float *dp = dpre + row * T;
    float part = 0.0f;
    for (int j = threadIdx.x; j < tend; j += blockDim.x)
        part += a[j] * da[j];
    float dot = block_sum(part, sh);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        dp[j] = j < tend ? a[j] * (da[j] - dot) : 0.0f;
}

/* C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch (column-major view) */
#define gemm_batched kern__cuda_gemm_batched

static void cu_attention_fwd(float *out, float *preatt, float *att, const float *qkv, int B,
                             int T, int C, int NH, int causal)
{
    int hs = C / NH, BH = B * NH;
    size_t n = (size_t)B * T * C;
    float *buf = att_scratch(4 * n);
    if (!buf)
        return;
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *y = buf + 3 * n;
    long long sT = (long long)T * hs, sTT = (long long)T * T;
    k_permute<<<kern__cuda_blocks_for(n, 256), 256>>>(q, k, v, qkv, B, T, NH, hs);
    /* preatt (T,T) row-major per head = q (T,hs) k^T / sqrt(hs) */
    gemm_batched(OP_T, OP_N, T, T, hs, 1.0f / sqrtf((float)hs), k, hs, sT, q, hs,
                 sT, 0.0f, preatt, T, sTT, BH, "attention q.k");
    k_softmax_rows<<<BH * T, ROW_THREADS>>>(att, preatt, T, causal);
    /* y (T,hs) = att (T,T) v (T,hs) */
    gemm_batched(OP_N, OP_N, hs, T, T, 1.0f, v, hs, sT, att, T, sTT, 0.0f, y, hs,
                 sT, BH, "attention att.v");
    k_unpermute<<<kern__cuda_blocks_for(n, 256), 256>>>(out, y, B, T, NH, hs);
    LAUNCH_CHECK("attention_fwd");
}

static void cu_attention_bwd(float *dqkv, float *dpreatt, float *datt, const float *dout,
                             const float *qkv, const float *att, int B, int T, int C, int NH,
                             int causal)
{
    int hs = C / NH, BH = B * NH;
    size_t n = (size_t)B * T * C;
    float *buf = att_scratch(7 * n);
    if (!buf)
        return;
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *dy = buf + 3 * n;
    float *dq = buf + 4 * n, *dk = buf + 5 * n, *dv = buf + 6 * n;
    long long sT = (long long)T * hs, sTT = (long long)T * T;
    float sc = 1.0f / sqrtf((float)hs);
    k_permute<<<kern__cuda_blocks_for(n, 256), 256>>>(q, k, v, qkv, B, T, NH, hs);
    k_permute_dout<<<kern__cuda_blocks_for(n, 256), 256>>>(dy, dout, B, T, NH, hs);
    /* datt (T,T) = dy (T,hs) v^T */
    gemm_batched(OP_T, OP_N, T, T, hs, 1.0f, v, hs, sT, dy, hs, sT, 0.0f, datt, T,
                 sTT, BH, "attention datt");
    /* dv (T,hs) = att^T (T,T) dy (T,hs) */
    gemm_batched(OP_N, OP_T, hs, T, T, 1.0f, dy, hs, sT, att, T, sTT, 0.0f, dv, hs,
                 sT, BH, "attention dv");
    k_softmax_bwd_rows<<<BH * T, ROW_THREADS>>>(dpreatt, datt, att, T, causal);
    /* dq (T,hs) = dpre (T,T) k (T,hs) / sqrt(hs) */
    gemm_batched(OP_N, OP_N, hs, T, T, sc, k, hs, sT, dpreatt, T, sTT, 0.0f, dq, hs,
                 sT, BH, "attention dq");
    /* dk (T,hs) = dpre^T (T,T) q (T,hs) / sqrt(hs) */
    gemm_batched(OP_N, OP_T, hs, T, T, sc, q, hs, sT, dpreatt, T, sTT, 0.0f, dk, hs,
                 sT, BH, "attention dk");
    k_scatter_dqkv<<<kern__cuda_blocks_for(n, 256), 256>>>(dqkv, dq, dk, dv, B, T, NH, hs);
    LAUNCH_CHECK("attention_bwd");
}

static const struct kern_backend CUDA_BACKEND = {
    "cuda",
    KERN_DEV_CUDA,
    cu_alloc,
    cu_release,
    cu_upload,
    cu_download,
    cu_copy,
    cu_sync,
    cu_set_precision,
    cu_fill,
    cu_scale,
    cu_axpy,
    cu_add,
    cu_sumsq,
    cu_all_finite,
    cu_matmul_fwd,
    cu_matmul_bwd,
    cu_relu_fwd,
    cu_relu_bwd,
    cu_gelu_fwd,
    cu_gelu_bwd,
    cu_tanh_fwd,
    cu_tanh_bwd,
    cu_layernorm_fwd,
    cu_layernorm_bwd,
    cu_embed_fwd,
    cu_embed_bwd,
    cu_attention_fwd,
    cu_attention_bwd,
    kern__cuda_xent_fwd,
    kern__cuda_xent_bwd,
    kern__cuda_argmax_hits,
    kern__cuda_adamw,
    kern__cuda_adam_dir,
};

static int g_state; /* of kern__cuda_backend: 0 untried, 1 ready, <0 failed with that code */

/* Initializes device 0, cuBLAS and the reduction scratch once. */
extern "C" int kern__cuda_backend(const struct kern_backend **out)
{
    if (g_state == 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0) {
            CM_LOGI("cuda", "no usable GPU: %s",
                    e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
            g_state = CM_EDEVICE;
        } else if (cudaSetDevice(0) != cudaSuccess ||
                   kern__cuda_gemm_init() != 0 ||
                   cudaMalloc(&g_red, sizeof(double)) != cudaSuccess ||
                   cudaMalloc(&g_flag, sizeof(int)) != cudaSuccess ||
                   kern__cuda_xent_init() != 0) {
            CM_LOGE("cuda", "initialization failed: %s", cudaGetErrorString(cudaGetLastError()));
            g_state = CM_EDEVICE;
        } else {
            cudaDeviceProp prop;
            if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
                g_cc = prop.major * 10 + prop.minor;
                CM_LOGD("cuda", "device 0: %s (sm_%d%d, %.1f GiB)", prop.name, prop.major,
                        prop.minor, prop.totalGlobalMem / 1073741824.0);
            }
            g_state = 1;
        }
    }
    if (g_state < 0)
        return g_state;
    *out = &CUDA_BACKEND;
    return CM_OK;
}

/* Gives back the context kern__cuda_facts made, when the GPU is not used;
 * never under a backend that is in use. */
extern "C" void kern__cuda_forget(void)
{
    if (g_state == 1)
        return;
    cudaDeviceReset();
    cudaGetLastError();
}
