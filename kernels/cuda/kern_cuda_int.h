/* Private to the CUDA backend's .cu files (kern_cuda.cu and the ops split
 * out of it: kern_cuda_optim.cu, kern_cuda_gemm.cu, kern_cuda_xent.cu): the launch helpers they share and
 * the ops kern_cuda.cu's struct kern_backend points at from the other files.
 * Not for the rest of the tree, which sees the backend only through
 * kern_backend.h. Declarations only, no CUDA types, so it also compiles with
 * a plain C compiler. */
#ifndef KERN_CUDA_INT_H
#define KERN_CUDA_INT_H

#include <stddef.h>

/* Blocks of `threads` for a grid-stride loop over n elements: at least one,
 * at most 65535 * 16 (kern_cuda.cu). */
unsigned kern__cuda_blocks_for(size_t n, unsigned threads);

/* Logs and latches a failed launch (cudaGetLastError) once; the backend's
 * next sync/download/upload returns CM_EDEVICE (kern_cuda.cu). */
void kern__cuda_launch_check(const char *what);
#define LAUNCH_CHECK(what) kern__cuda_launch_check(what)

/* Logs and latches a failure of `what` (a cudaError_t as int, or a message)
 * once, like kern__cuda_launch_check (kern_cuda.cu). */
void kern__cuda_note(int cuda_error, const char *what);
void kern__cuda_fail(const char *what, const char *detail);
/* Whether a failure was latched (kern_cuda.cu). */
int kern__cuda_failed(void);

/* Matrix products (kern_cuda_gemm.cu): the cuBLAS handle, the precision of
 * set_precision ("fp32", "tf32", "bf16", "fp16"; CM_EUNSUPPORTED otherwise),
 * and C = alpha op(A) op(B) + beta C in cuBLAS's column-major terms
 * (ta, tb: 1 = transposed), alone or strided-batched. */
int kern__cuda_gemm_init(void);
int kern__cuda_gemm_precision(const char *mode);
void kern__cuda_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc, const char *what);
void kern__cuda_gemm_batched(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                             int lda, long long sa, const float *b, int ldb, long long sb,
                             float beta, float *c, int ldc, long long sc, int batch,
                             const char *what);

/* kern_backend.h's adamw and adam_dir, bit for bit the CPU's
 * (kern_cuda_optim.cu). */
void kern__cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                      float b2, float eps, float wd, int t);
void kern__cuda_adam_dir(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                         float b1, float b2, float eps, float wd, int t);

/* The loss head (kern_cuda_xent.cu): its device counter, allocated with the
 * backend (0, or -1 on failure), and kern_backend.h's xent_fwd, xent_bwd
 * and argmax_hits. */
int kern__cuda_xent_init(void);
void kern__cuda_xent_fwd(float *losses, float *probs, const float *logits, const int *targets,
                         int N, int V);
void kern__cuda_xent_bwd(float *dlogits, const float *probs, const int *targets, float dscale,
                         int N, int V);
long kern__cuda_argmax_hits(const float *probs, const int *targets, int N, int V);

#endif
