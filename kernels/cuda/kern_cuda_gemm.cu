/* The CUDA backend's matrix products (cuBLAS), split out of kern_cuda.cu.
 *
 * Precision (set_precision): "fp32", "tf32" and "fp16" hand cuBLAS our fp32
 * operands with CUBLAS_COMPUTE_32F, _FAST_TF32 or _FAST_16F. "bf16" rounds
 * both operands to bf16 here (round to nearest even, the CPU's and PyTorch's
 * conversion) and multiplies them in bf16 with fp32 accumulation and an fp32
 * result (CUBLAS_COMPUTE_32F, A and B CUDA_R_16BF). The older way,
 * CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands, let cuBLAS choose: on an
 * H200 it ran every product as a TF32 kernel (sm90_xmma_gemm_f32f32_tf32f32,
 * ~390 TFLOP/s on an 8192^3 product) instead of bf16 (~790); docs/kernels.md,
 * "On a GPU: the bf16 training step".
 *
 * Alignment: cuBLAS's fast kernels want each operand's contiguous extent
 * a multiple of 16 bytes. The bf16 copies have every dimension rounded up to
 * 8 (zero padding), and a result that is not so (the LM head's 50,257
 * logits per row) is computed into an aligned scratch and copied into place
 * (cudaMemcpy2DAsync); before, the head's three products ran as sm75/sm80
 * align1 kernels, 11-15 ms of a 73-84 ms GPT-2 small step on an H200.
 * The attention's batched products keep fp32 operands (below).
 *
 * The scratch buffers grow to the largest product seen and stay (their size
 * is in kern_tfm_mem_need's scratch). Everything runs on the default stream,
 * in order with the other ops. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cm_err.h"
}
#include "kern_cuda_int.h"

static cublasHandle_t g_blas;
static cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F_FAST_16BF;
static int g_bf16;                 /* operands rounded to bf16 here */
static __nv_bfloat16 *g_ops;       /* bf16 copies of both operands */
static size_t g_ops_n;             /* its size in elements */
static float *g_cpad;              /* an aligned result */
static size_t g_cpad_n;

int kern__cuda_gemm_init(void)
{
    return cublasCreate(&g_blas) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

int kern__cuda_gemm_precision(const char *mode)
{
    g_bf16 = 0;
    if (!strcmp(mode, "fp32"))
        g_compute = CUBLAS_COMPUTE_32F;
    else if (!strcmp(mode, "tf32"))
        g_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    else if (!strcmp(mode, "bf16")) {
        /* CT_CUDA_BF16_OPERANDS=0: the older way (fp32 operands, cuBLAS's
           CUBLAS_COMPUTE_32F_FAST_16BF), to compare the two in one run */
        const char *env = getenv("CT_CUDA_BF16_OPERANDS");
        g_bf16 = !(env && !strcmp(env, "0"));
        g_compute = g_bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
    }
    else if (!strcmp(mode, "fp16"))
        g_compute = CUBLAS_COMPUTE_32F_FAST_16F;
    else
        return CM_EUNSUPPORTED;
    return CM_OK;
}

static void blas_note(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) {
        char detail[48];
        snprintf(detail, sizeof detail, "cuBLAS status %d", (int)s);
        kern__cuda_fail(what, detail);
    }
}

/* Grows a scratch buffer to n elements of `size` bytes; NULL (latched) when
 * the GPU has no room. cudaFree and cudaMalloc synchronize, so the old
 * buffer is no longer in use. */
static void *grow(void **buf, size_t *cap, size_t n, size_t size, const char *what)
{
    if (n <= *cap)
        return *buf;
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    if (cudaMalloc(buf, n * size) != cudaSuccess) {
        cudaGetLastError();
        *buf = NULL;
        kern__cuda_fail(what, "cudaMalloc failed (out of GPU memory)");
        return NULL;
    }
    *cap = n;
    return *buf;
}

static size_t up8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

/* d[i] = bf16(s[i]), four at a time when s is 16-byte aligned and n % 4 == 0 */
__global__ void k_bf16_flat(__nv_bfloat16 *d, const float *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16_rn(s[i]);
}

__global__ void k_bf16_flat4(__nv_bfloat162 *d, const float4 *s, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = s[i];
        d[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        d[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

/* d (drows x dcols, column-major, leading dimension drows) <- s (rows x
 * cols, leading dimension lds), zeros where s has no element */
__global__ void k_bf16_pad(__nv_bfloat16 *d, size_t drows, size_t dcols, const float *s,
                           size_t lds, size_t rows, size_t cols)
{
    for (size_t c = blockIdx.x; c < dcols; c += gridDim.x)
        for (size_t r = threadIdx.x; r < drows; r += blockDim.x)
            d[c * drows + r] = c < cols && r < rows ? __float2bfloat16_rn(s[c * lds + r])
                                                    : __float2bfloat16_rn(0.0f);
}

/* The stored rows x cols (column-major, leading dimension lds) of an operand
 * into d as drows x dcols (drows >= rows, dcols >= cols), zero-padded. */
static void to_bf16(__nv_bfloat16 *d, size_t drows, size_t dcols, const float *s, size_t lds,
                    size_t rows, size_t cols, const char *what)
{
    size_t n = rows * cols;
    if (drows == rows && dcols == cols && lds == rows) {
        if (n % 4 == 0 && (uintptr_t)s % 16 == 0)
            k_bf16_flat4<<<kern__cuda_blocks_for(n / 4, 256), 256>>>((__nv_bfloat162 *)d,
                                                                    (const float4 *)s, n / 4);
        else
            k_bf16_flat<<<kern__cuda_blocks_for(n, 256), 256>>>(d, s, n);
    } else {
        k_bf16_pad<<<(unsigned)(dcols < (1u << 20) ? dcols : (1u << 20)), 256>>>(d, drows, dcols, s,
                                                                               lds, rows, cols);
    }
    LAUNCH_CHECK(what);
}

void kern__cuda_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc, const char *what)
{
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!g_bf16 || m <= 0 || n <= 0 || k <= 0) {
        blas_note(cublasGemmEx(g_blas, oa, ob, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F,
                               ldb, &beta, c, CUDA_R_32F, ldc, g_compute, CUBLAS_GEMM_DEFAULT),
                  what);
        return;
    }
    /* Every dimension rounded up to 8 (the operands' padding is zero, so
       the padded k adds nothing; the padded rows and columns of the result
       are dropped): cuBLAS's fast kernels want each operand's contiguous
       extent a multiple of 16 bytes. op(A) is m x k, op(B) k x n; stored
       column-major A is m x k (ta = 0) or k x m, B k x n or n x k. */
    size_t m8 = up8((size_t)m), n8 = up8((size_t)n), k8 = up8((size_t)k);
    size_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    size_t ar8 = ta ? k8 : m8, ac8 = ta ? m8 : k8, br8 = tb ? n8 : k8, bc8 = tb ? k8 : n8;
    size_t offb = (ar8 * ac8 + 127) & ~(size_t)127; /* 256-byte aligned */
    __nv_bfloat16 *sa = (__nv_bfloat16 *)grow((void **)&g_ops, &g_ops_n, offb + br8 * bc8,
                                              sizeof *g_ops, what);
    if (!sa)
        return;
    __nv_bfloat16 *sb = sa + offb;
    to_bf16(sa, ar8, ac8, a, (size_t)lda, ar, ac, what);
    to_bf16(sb, br8, bc8, b, (size_t)ldb, br, bc, what);
    float *cc = c;
    size_t lc = (size_t)ldc;
    if (m8 != (size_t)m || n8 != (size_t)n || ldc % 4) {
        lc = m8;
        if (!(cc = (float *)grow((void **)&g_cpad, &g_cpad_n, m8 * n8, sizeof *g_cpad, what)))
            return;
        if (beta != 0.0f)
            kern__cuda_note(cudaMemcpy2DAsync(cc, lc * 4, c, (size_t)ldc * 4, (size_t)m * 4, n,
                                              cudaMemcpyDeviceToDevice), what);
    }
    blas_note(cublasGemmEx(g_blas, oa, ob, (int)m8, (int)n8, (int)k8, &alpha, sa, CUDA_R_16BF,
                           (int)ar8, sb, CUDA_R_16BF, (int)br8, &beta, cc, CUDA_R_32F, (int)lc,
                           g_compute, CUBLAS_GEMM_DEFAULT),
              what);
    if (cc != c)
        kern__cuda_note(cudaMemcpy2DAsync(c, (size_t)ldc * 4, cc, lc * 4, (size_t)m * 4, n,
                                          cudaMemcpyDeviceToDevice), what);
}

/* The attention's products: fp32 operands (converting its T x T matrices
 * to bf16 would cost a read and a write of each, as much as the product's
 * own read: on an H200 that made the GPT-2 small step slower), so under
 * "bf16" cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF decides. */
void kern__cuda_gemm_batched(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                             int lda, long long sa, const float *b, int ldb, long long sb,
                             float beta, float *c, int ldc, long long sc, int batch,
                             const char *what)
{
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    blas_note(cublasGemmStridedBatchedEx(g_blas, oa, ob, m, n, k, &alpha, a, CUDA_R_32F, lda, sa,
                                         b, CUDA_R_32F, ldb, sb, &beta, c, CUDA_R_32F, ldc, sc,
                                         batch,
                                         g_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : g_compute,
                                         CUBLAS_GEMM_DEFAULT),
              what);
}
