/* The op interface every model and optimizer in kernels/ is written against.
 *
 * A backend is a struct of function pointers (ggml-backend style), so this
 * header compiles with a plain C compiler whether or not CUDA was built. The
 * CPU backend (kernels/cpu/, OpenBLAS + our worker threads) is the reference; the
 * CUDA backend (kernels/cuda/, cuBLAS + own kernels) is tested against it.
 *
 * Conventions, taken from llm.c: all tensor pointers passed to ops are
 * "device" pointers of the backend (host memory for the CPU backend), row
 * major, float32 unless the name says otherwise. Backward ops ACCUMULATE (+=)
 * into gradient outputs; zeroing is explicit (fill). Shapes are written on
 * every op: N = rows (B*T for sequences), C = input channels, OC = output
 * channels, NH = heads, V = classes / vocabulary. A gradient output pointer
 * documented as optional may be NULL and is then not computed.
 *
 * Ops run asynchronously on backends that can (CUDA): results are visible
 * to the host after download() or sync(). */
#ifndef KERN_BACKEND_H
#define KERN_BACKEND_H

#include <stddef.h>

#include "kern_gpu.h"

enum kern_device { KERN_DEV_CPU = 0, KERN_DEV_CUDA = 1 };

/* The summation order of sumsq (see there): blocks of 4096 elements, 256
 * lanes per block (one CUDA thread per lane, 16 elements each). Changing
 * either changes the bits of every gradient norm, so peers built with
 * different values would split: they belong to what collaborating peers
 * must share, like the wire format. */
#define KERN_SUMSQ_BLOCK 4096
#define KERN_SUMSQ_LANES 256

struct kern_backend {
    const char *name;      /* "cpu" or "cuda" */
    enum kern_device dev;

    /* ---- memory ---- */
    int (*alloc)(size_t bytes, void **out);          /* zero-filled */
    void (*release)(void *p);                        /* NULL is fine */
    int (*upload)(void *dst, const void *host_src, size_t bytes);
    int (*download)(void *host_dst, const void *src, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes); /* device to device */
    int (*sync)(void);
    /* Math mode for matrix products: "fp32" everywhere; CUDA also "tf32",
     * "bf16" and "fp16" (tensor-core products of fp32 tensors, fp32
     * accumulation; parameters, gradients and optimizer state stay fp32, so
     * the fp32 buffers are the master weights). CM_EUNSUPPORTED otherwise. */
    int (*set_precision)(const char *mode);

    /* ---- elementwise: x (n) ---- */
    void (*fill)(float *x, float v, size_t n);
    void (*scale)(float *x, float s, size_t n);
    /* y (n) += a * x (n) */
    void (*axpy)(float *y, float a, const float *x, size_t n);
    /* out (n) = a (n) + b (n); out may alias a or b */
    void (*add)(float *out, const float *a, const float *b, size_t n);
    /* Sum of squares, in double, of x (n); synchronizes. Every backend, at
     * any thread count, returns the same bits (the optimizer's gradient
     * norm and LAMB's trust ratios come from it, and collaborating peers
     * compare parameter hashes), because the order is part of the
     * interface (KERN_SUMSQ_* above):
     *   - each square (double)x[i] * (double)x[i] is exact (24-bit
     *     mantissa squared fits in 53 bits), so only the additions round;
     *   - x is cut into blocks of KERN_SUMSQ_BLOCK elements; block b holds
     *     x[b*BLOCK .. b*BLOCK + BLOCK) (the last one may be short);
     *   - in a block, lane j (0 <= j < KERN_SUMSQ_LANES) starts at +0.0 and
     *     adds the squares of its elements j, j + LANES, j + 2*LANES, ...
     *     (those inside x) one after another, in double;
     *   - the lanes are combined by halving: for h = LANES/2, LANES/4, ..., 1,
     *     lane[j] = lane[j] + lane[j + h] for every j < h; lane[0] is the
     *     block's partial P_b;
     *   - the result is (...((0.0 + P_0) + P_1) + ...) + P_last, in block
     *     order, in double.
     * Round to nearest everywhere, no fused multiply-add where it would
     * round differently (it cannot here: the products are exact). */
    double (*sumsq)(const float *x, size_t n);
    /* 1 when every x (n) is finite; synchronizes */
    int (*all_finite)(const float *x, size_t n);

    /* ---- dense layers ----
     * out (N,OC) = inp (N,C) @ w^T (w is (OC,C)) + bias (OC); bias optional. */
    void (*matmul_fwd)(float *out, const float *inp, const float *w, const float *bias,
                       int N, int C, int OC);
    /* dinp (N,C) += dout (N,OC) @ w (OC,C); dw (OC,C) += dout^T @ inp;
     * dbias (OC) += column sums of dout. dinp and dbias optional. */
    void (*matmul_bwd)(float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);

    /* ---- activations: inp, out, dout, dinp (n) ---- */
    void (*relu_fwd)(float *out, const float *inp, size_t n);
    void (*relu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* GELU, tanh approximation (GPT-2, ALBERT "gelu_new") */
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* tanh (ALBERT's sentence-order pooler); bwd recomputes tanh(inp) */
    void (*tanh_fwd)(float *out, const float *inp, size_t n);
    void (*tanh_bwd)(float *dinp, const float *inp, const float *dout, size_t n);

    /* ---- layer norm over the last axis ----
     * out (N,C) = (inp - mean) * rstd * w (C) + b (C); mean, rstd (N) saved. */
    void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
    /* dinp (N,C), dw (C), db (C) accumulate. */
    void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C);

    /* ---- token + position embedding ----
     * out (B,T,C) = wte[tok[b,t]] (V,C) + wpe[t] (maxT,C). Tokens are checked
     * by the model before they reach the op. */
    void (*embed_fwd)(float *out, const int *tok, const float *wte, const float *wpe,
                      int B, int T, int C);
    /* dwte (V,C) and dwpe (maxT,C) accumulate from dout (B,T,C). */
    void (*embed_bwd)(float *dwte, float *dwpe, const float *dout, const int *tok,
                      int B, int T, int C);

    /* ---- multi-head self-attention core ----
     * qkv (B,T,3C) holds q, k, v side by side; out (B,T,C); preatt and att
     * (B,NH,T,T) are saved for backward. causal=1: position t sees 0..t (GPT);
     * causal=0: every position sees all T (ALBERT encoder). */
    void (*attention_fwd)(float *out, float *preatt, float *att, const float *qkv,
                          int B, int T, int C, int NH, int causal);
    /* dqkv (B,T,3C) accumulates; dpreatt, datt (B,NH,T,T) are scratch that
     * this op overwrites. */
    void (*attention_bwd)(float *dqkv, float *dpreatt, float *datt, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C,
                          int NH, int causal);

    /* ---- softmax cross-entropy ----
     * logits (N,V), targets (N) with -1 = ignored row; probs (N,V) saved;
     * losses (N) = -log p[target] (0 for ignored rows). */
    void (*xent_fwd)(float *losses, float *probs, const float *logits, const int *targets,
                     int N, int V);
    /* dlogits (N,V) += (probs - onehot(target)) * dscale; ignored rows get 0. */
    void (*xent_bwd)(float *dlogits, const float *probs, const int *targets, float dscale,
                     int N, int V);
    /* Argmax hits: how many rows i of probs (N,V) with targets[i] >= 0 have
     * their largest value at column targets[i] (the first largest on ties,
     * as the host's scoring counts). Rows with target -1 are not read, so
     * counting masked-LM positions costs a pass over the masked rows only.
     * Synchronizes; -1 when the backend has failed. Rows holding NaN count
     * as whatever the comparison gives (no promise). */
    long (*argmax_hits)(const float *probs, const int *targets, int N, int V);

    /* ---- optimizer updates over a flat buffer of n parameters ----
     * AdamW (decoupled weight decay, Loshchilov & Hutter), bias-corrected
     * with step t >= 1: p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, int t);
    /* The Adam direction with weight decay, for LAMB: updates m, v and writes
     * u (n) = mhat / (sqrt(vhat) + eps) + wd * p; p is not changed. */
    void (*adam_dir)(float *u, const float *p, const float *g, float *m, float *v, size_t n,
                     float beta1, float beta2, float eps, float wd, int t);
};

/* The CPU backend: always available; borrowed static storage. */
const struct kern_backend *kern_backend_cpu(void);

/* The CUDA backend on device 0. CM_EUNSUPPORTED when this build has no CUDA,
 * CM_EDEVICE when no usable GPU is present. *out is borrowed static storage. */
int kern_backend_cuda(const struct kern_backend **out);

/* 1 when this build includes the CUDA backend. */
int kern_have_cuda_build(void);

/* Picks a backend by name for a run that needs *need on the device (NULL:
 * not known, memory not checked): "cpu"; "cuda"; or "auto", CUDA when the
 * GPU passes kern_gpu_check (kern_gpu.h: this build's architectures against
 * the device's capability, the driver against the runtime, the free memory
 * against need), else the CPU. For "auto" a refusal is logged as one line,
 * "device: <why> — using the CPU", and CM_OK returned with the CPU; for
 * "cuda" it is the error (CM_EUNSUPPORTED, CM_EDEVICE or CM_ENOMEM), nothing
 * is logged and the same one-line reason is left in why. On success why
 * describes the device used (the line is also logged at info level).
 * CM_EINVAL for an unknown name or a malformed CROWDTRAIN_FAKE_GPU (the
 * tests' override of the device facts, kern_gpu_facts_parse). */
int kern_backend_pick_for(const char *name, const struct kern_mem_need *need,
                          const struct kern_backend **out, char *why, size_t whylen);

/* kern_backend_pick_for(name, NULL, ...), logging an explicit "cuda"'s
 * failure as an error. */
int kern_backend_pick(const char *name, const struct kern_backend **out);

/* The facts and build description kern_backend_pick_for decides on:
 * CROWDTRAIN_FAKE_GPU when set, else the CUDA runtime's answers (zeroed,
 * build->have = 0, in a build without CUDA). *real = 1 when a CUDA context
 * may have been created to answer. CM_EINVAL (why in err) for a malformed
 * override. */
int kern_gpu_facts_gather(struct kern_gpu_facts *f, struct kern_cuda_build *build, int *real,
                          char *err, size_t errlen);

/* Threads the CPU backend uses (kernels/cpu/kern_pool.h); 0 = all cores. */
void kern_cpu_set_threads(int n);
int kern_cpu_threads(void);

#endif
