/* What the transformer files in kernels/ share (not a public header): the
 * pre-LayerNorm block's parameter offsets, saved activations and backward
 * scratch, its forward and backward on the op interface, the naming of its
 * tensors and the GPT-2 initialization rule. kern_tfm.c (the whole model)
 * and kern_tfm_stage.c (a pipeline stage of a GPT model) both run their
 * blocks through these functions, so the two cannot drift apart: a stage
 * computes exactly what the same layers of the whole model compute.
 *
 * Shapes: B batch, T positions, C model width, F MLP width, NH heads,
 * N = B*T rows; att = B*NH*T*T. */
#ifndef KERN_TFM_INT_H
#define KERN_TFM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kern_backend.h"
#include "kern_internal.h"
#include "kern_model.h"

/* Offsets of one block's parameters in the flat buffer. */
struct kern__tfm_blk {
    size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fc2w, fc2b;
};

/* Activations of one layer, saved for backward. */
struct kern__tfm_act {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N,C) (N) (N) */
    float *qkv;                       /* (N,3C) */
    float *atty;                      /* (N,C) */
    float *preatt, *att;              /* (B,NH,T,T) */
    float *res2;                      /* (N,C) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fchg;                /* (N,F) */
    float *res3;                      /* (N,C): the block's output */
};

/* Backward scratch shared by all layers of a model. dres carries the
 * gradient of the residual stream from block to block. */
struct kern__tfm_scratch {
    float *tmp;                       /* (N,C), also used by forward */
    float *dres, *dln, *datty;        /* (N,C) */
    float *dqkv;                      /* (N,3C) */
    float *dpreatt, *datt;            /* (B,NH,T,T) */
    float *dfch, *dfchg;              /* (N,F) */
};

/* The sizes a block runs at. */
struct kern__tfm_dims {
    int B, T, C, F, NH;
    int causal;  /* 1 for GPT */
    int post_ln; /* 1: BERT's post-LN block (ALBERT with post_ln), below */
};

/* Appends the tensors of block l ("blocks.<l>.ln1.weight", ...) to tl and
 * records their offsets in k; CM_ENOMEM on failure. The names are the
 * checkpoint names of the whole model, so a stage's table uses the same. */
/* Bytes the CUDA backend's product scratch (kern_cuda_gemm.cu: bf16 operand
 * copies, an aligned result) reaches for this model or stage (head: whether
 * it computes the LM head), for kern_tfm_mem_need and the stages' estimate. */
size_t kern__tfm_gemm_scratch(const struct kern_tfm_config *c, int max_batch, int head);

int kern__tfm_blk_add(struct kern__tensor_list *tl, struct kern__tfm_blk *k, int l, int C, int F);

/* Allocates (kern__alloc_f, adding to *err) or releases one layer's
 * activations, or the backward scratch, for N rows and att attention
 * scores. Releasing NULLs nothing: the caller frees the struct. */
void kern__tfm_act_alloc(const struct kern_backend *be, struct kern__tfm_act *a, size_t N, size_t C,
                         size_t F, size_t att, int *err);
void kern__tfm_act_release(const struct kern_backend *be, struct kern__tfm_act *a);
void kern__tfm_scratch_alloc(const struct kern_backend *be, struct kern__tfm_scratch *s, size_t N,
                             size_t C, size_t F, size_t att, int *err);
void kern__tfm_scratch_release(const struct kern_backend *be, struct kern__tfm_scratch *s);

/* One pre-LN block forward, after llm.c's gpt2_forward:
 *   res2 = res + proj(attn(LN1(res))); res3 = res2 + fc2(gelu(fc(LN2(res2)))).
 * With d->post_ln, BERT's post-LN block (ALBERT as published, Lan et al.
 * 2020 §3, on BERT's Transformer encoder):
 *   res2 = res + proj(attn(res)); ln1 = LN1(res2);
 *   ln2 = ln1 + fc2(gelu(fc(ln1))); res3 = LN2(ln2)
 * (the act buffers keep their names: ln2 holds the second sum).
 * res (N,C) is the block's input and must stay untouched until the block's
 * backward has run; a->res3 (N,C) receives the output. s->tmp is used. */
void kern__tfm_blk_fwd(const struct kern_backend *be, const float *P, const struct kern__tfm_blk *k,
                       struct kern__tfm_act *a, const float *res, struct kern__tfm_scratch *s,
                       const struct kern__tfm_dims *d);

/* Its backward, after llm.c's gpt2_backward: on entry s->dres (N,C) holds
 * d loss / d res3; on return d loss / d res. The block's parameter
 * gradients accumulate into G at k's offsets. */
void kern__tfm_blk_bwd(const struct kern_backend *be, const float *P, float *G,
                       const struct kern__tfm_blk *k, const struct kern__tfm_act *a,
                       const float *res, struct kern__tfm_scratch *s,
                       const struct kern__tfm_dims *d);

/* The whole model's tensor table for config c (host memory only, nothing
 * allocated on a backend): the order kern_tfm_new lays out and initializes
 * its parameters in. Frees nothing of tl on failure; the caller frees tl->v. */
int kern__tfm_table(const struct kern_tfm_config *c, struct kern__tensor_list *tl);

/* Initialization of one tensor of the whole model's table, by name: biases
 * 0, LayerNorm weights 1, the rest N(0, 0.02), and (GPT-2's rule, for
 * pre-LN models) residual projections N(0, 0.02/sqrt(2L)); post-LN ALBERT
 * keeps 0.02 everywhere (ALBERT's initializer_range). Draws from rng in
 * element order. x = NULL skips the tensor but consumes exactly the draws
 * initializing it would, so a model that holds only some tensors (a
 * pipeline stage) gets the same values as the whole model for the ones it
 * holds. */
void kern__tfm_init_tensor(const struct kern_tensor *ts, float *x, const struct kern_tfm_config *c,
                           uint64_t *rng);

#endif
