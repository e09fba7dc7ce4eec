/* The CUDA backend's optimizer steps (kern_backend.h's adamw and adam_dir),
 * split out of kern_cuda.cu, which points its struct kern_backend at them;
 * they share its launch helpers through kern_cuda_int.h. They live apart
 * because they answer to a stricter rule than the other kernels: bit-for-bit
 * agreement with the CPU reference, explained below. Compiled with the same
 * flags as kern_cuda.cu (kernels/module.mk). */
#include <cuda_runtime.h>
#include <math.h>

#include "kern_cuda_int.h"

/* ---- optimizers ----
 * The optimizer step must give the CPU's result bit for bit: in a
 * collaboration every member applies the same averaged gradient and the
 * peers compare parameter hashes after each step (docs/collaboration.md,
 * steps 9 and 11), so a CUDA peer among CPU peers must land on the same
 * bits. nvcc contracts a * b + c into one FMA (one rounding instead of two)
 * by default, and the CPU (C11, -ffp-contract=off, no FMA in the x86-64
 * baseline) rounds the product and the sum separately; so these kernels
 * spell out every operation with the round-to-nearest intrinsics, in the
 * order of adamw_r / adam_dir_r in kernels/cpu/kern_cpu.c. Division and
 * square root are IEEE-exact here as there (__fdiv_rn, __fsqrt_rn). */

/* m, v <- Adam moments; returns the bias-corrected direction m^/(sqrt(v^)+eps) */
__device__ __forceinline__ float adam_moments(float g, float *m, float *v, float b1, float b2,
                                              float eps, float bc1, float bc2)
{
    float mi = __fadd_rn(__fmul_rn(b1, *m), __fmul_rn(1.0f - b1, g));
    float vi = __fadd_rn(__fmul_rn(b2, *v), __fmul_rn(__fmul_rn(1.0f - b2, g), g));
    *m = mi;
    *v = vi;
    float mh = __fdiv_rn(mi, bc1), vh = __fdiv_rn(vi, bc2);
    return __fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), eps));
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = adam_moments(g[i], &m[i], &v[i], b1, b2, eps, bc1, bc2);
        float pi = p[i];
        p[i] = __fsub_rn(pi, __fmul_rn(lr, __fadd_rn(d, __fmul_rn(wd, pi))));
    }
}

__global__ void k_adam_dir(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                           float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = adam_moments(g[i], &m[i], &v[i], b1, b2, eps, bc1, bc2);
        u[i] = __fadd_rn(d, __fmul_rn(wd, p[i]));
    }
}

void kern__cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                      float b2, float eps, float wd, int t)
{
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    k_adamw<<<kern__cuda_blocks_for(n, 256), 256>>>(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
    LAUNCH_CHECK("adamw");
}

void kern__cuda_adam_dir(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                         float b1, float b2, float eps, float wd, int t)
{
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    k_adam_dir<<<kern__cuda_blocks_for(n, 256), 256>>>(u, p, g, m, v, n, b1, b2, eps, wd, bc1, bc2);
    LAUNCH_CHECK("adam_dir");
}
