/* Models built on the op interface: one generic handle that training code
 * drives the same way whatever the architecture, so `train --local` and the
 * collaborative agent share one code path.
 *
 * Every model keeps its parameters in ONE flat contiguous device buffer and
 * its gradients in another of the same length (DeDLOC averaging splits the
 * flat gradient into parts; seed 000_02cc6b5d62a616fc.txt §3.1). A table of
 * named tensors gives each parameter's offset and shape, for checkpoints,
 * LAMB's per-tensor trust ratios and weight-decay masks.
 *
 * Models:
 *   - MLP classifier (kern_mlp_new): inputs (B,in) -> hidden ReLU layers ->
 *     classes, softmax cross-entropy.
 *   - Transformer (kern_tfm_new): GPT-style causal decoder with tied token
 *     embedding (next-token loss), or ALBERT-style bidirectional encoder with
 *     factorized embeddings (V x E then E -> H projection), cross-layer
 *     parameter sharing and a masked-language-model head (ALBERT, Lan et al.
 *     2020 §3.1, as used by DeDLOC: seed 000_02cc6b5d62a616fc.txt §4.2-4.3).
 *     Both use pre-LayerNorm blocks and tanh-GELU.
 *   - Pipeline stage of a GPT model (kern_tfm_stage_new, below): a range
 *     of its layers, with the embeddings in the first stage and the head
 *     and loss in the last (issue 19; seed 003_f3537b728458fcc1.txt §2).
 *   - Feed-forward expert block (kern_expert.h), for mixture-of-experts.
 *   - DMoE classifier (kern_dmoe.h): MLP trunk, one decentralized
 *     mixture-of-experts layer with product-key gating, classifier head
 *     (seed 002_2b00836ea4b30f79.txt §3.1-3.2). */
#ifndef KERN_MODEL_H
#define KERN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kern_backend.h"

#define KERN_TENSOR_NAME_MAX 64

struct kern_tensor {
    char name[KERN_TENSOR_NAME_MAX];
    size_t off;    /* in floats, into params and grads */
    size_t numel;
    int ndim;
    int shape[4];
    int decay;     /* 1 when weight decay applies (matrices, embeddings) */
};

/* KERN_MODEL_GPT_STAGE: a pipeline stage of a GPT model (kern_tfm_stage_new);
 * never a config's kind. */
enum kern_model_kind {
    KERN_MODEL_MLP = 0,
    KERN_MODEL_GPT,
    KERN_MODEL_ALBERT,
    KERN_MODEL_DMOE,
    KERN_MODEL_GPT_STAGE
};

/* One batch, in host memory. MLP: x (B,in_dim), targets (B), T = 0.
 * Transformers: tokens (B,T), targets (B,T); target -1 = no loss here. */
struct kern_batch {
    int B, T;
    const float *x;
    const int *tokens;
    const int *targets;
    const int *segments; /* ALBERT with sentence_order: (B,T) 0 for [CLS] A [SEP], 1 for B [SEP] */
    const int *sop;      /* ALBERT with sentence_order: (B) 1 when A and B were swapped (with
                            seq_classes: each sequence's label in [0, seq_classes)) */
};

/* Sums over the rows that carry a target. */
struct kern_eval {
    double loss_sum;
    long count;
    long correct;  /* argmax == target: evaluation always; in training (fwd_bwd) the MLP and
                      DMoE classifiers (on the host, from their small outputs) and ALBERT's
                      masked LM (on the device, kern_backend argmax_hits), not GPT */
    /* ALBERT's sentence-order prediction (sentence_order): one row per sequence */
    double sop_loss_sum;
    long sop_count, sop_correct;
};

struct kern_model;

struct kern_model_ops {
    int (*run)(struct kern_model *m, const struct kern_batch *b, int backward, float grad_scale,
               struct kern_eval *ev);
    void (*destroy)(struct kern_model *m);
};

struct kern_model {
    const struct kern_model_ops *ops;
    const struct kern_backend *be;  /* borrowed */
    enum kern_model_kind kind;
    size_t nparams;
    float *params;                  /* device, nparams floats, owned */
    float *grads;                   /* device, nparams floats, owned */
    int ntensors;
    struct kern_tensor *tensors;    /* host, owned */
    int max_batch, max_T;           /* the sizes activations were allocated for */
    int in_dim, nclass;             /* MLP input width; classes or vocabulary */
    void *impl;                     /* owned by the model kind */
};

struct kern_mlp_config {
    int in_dim;
    int nhidden;       /* 0..KERN_MLP_MAX_HIDDEN */
    int hidden[8];
    int nclass;
};
#define KERN_MLP_MAX_HIDDEN 8

struct kern_tfm_config {
    enum kern_model_kind kind; /* KERN_MODEL_GPT or KERN_MODEL_ALBERT */
    int vocab;                 /* V */
    int max_T;                 /* context length */
    int n_layer;               /* L */
    int n_head;                /* NH, divides d_model */
    int d_model;               /* C (H in ALBERT's notation) */
    int d_embed;               /* E; GPT: must equal d_model; ALBERT: any (128 in the paper) */
    int d_ff;                  /* F, usually 4 C */
    int share_layers;          /* 1: one set of block parameters used by all L layers */
    int post_ln;               /* ALBERT: BERT's post-LayerNorm blocks, embedding LayerNorm, no
                                  final LayerNorm, ALBERT's initialization (0: pre-LN) */
    int sop;                   /* ALBERT: segment embeddings and the sentence-order head */
    int seq_classes;           /* with sop: 0 = that head (2 classes, "sop.*"); K >= 2: a head of K
                                  labels instead ("classifier.*"), for fine-tuning on a task */
};

/* Largest sizes accepted, so a config cannot ask for absurd allocations. */
#define KERN_MAX_DIM 65536
#define KERN_MAX_LAYERS 128
#define KERN_MAX_VOCAB 1000000
#define KERN_MAX_PARAMS ((size_t)4 << 30)

/* Checks a config; CM_EINVAL with a message in *why (static or in buf). */
int kern_mlp_config_check(const struct kern_mlp_config *c, const char **why);
int kern_tfm_config_check(const struct kern_tfm_config *c, const char **why);

/* Creates a model with parameters initialized from seed and activations for
 * up to max_batch rows (and max_T positions). *out is owned by the caller;
 * free with kern_model_free. */
int kern_mlp_new(const struct kern_backend *be, const struct kern_mlp_config *c, int max_batch,
                 uint64_t seed, struct kern_model **out);
int kern_tfm_new(const struct kern_backend *be, const struct kern_tfm_config *c, int max_batch,
                 uint64_t seed, struct kern_model **out);

/* Parameter count a config would have, without allocating. */
size_t kern_mlp_param_count(const struct kern_mlp_config *c);
size_t kern_tfm_param_count(const struct kern_tfm_config *c);

/* Device memory a model of this config needs for up to max_batch rows, in
 * bytes, without allocating (kern_gpu.h, struct kern_mem_need): params and
 * grads (one fp32 slab each), act = every buffer kern_*_new allocates for
 * the batch (the same formulas as there; test_gpu_check counts the real
 * allocations against them), scratch = the CUDA backend's own buffers for
 * this model (attention's permuted copies, sumsq's partials), reserve =
 * KERN_GPU_RESERVE. optim is left 0: kern_optim_mem_need adds it. */
void kern_mlp_mem_need(const struct kern_mlp_config *c, int max_batch, struct kern_mem_need *n);
void kern_tfm_mem_need(const struct kern_tfm_config *c, int max_batch, struct kern_mem_need *n);

/* grads = 0 */
void kern_model_zero_grad(struct kern_model *m);

/* Forward and backward on one batch: grads += grad_scale * d(mean loss over
 * the rows with a target)/d(params). ev (optional) receives the sums. A batch
 * with no targets adds nothing. CM_EINVAL for a batch larger than the model
 * was built for or with out-of-range tokens or targets (nothing changes). */
int kern_model_fwd_bwd(struct kern_model *m, const struct kern_batch *b, float grad_scale,
                       struct kern_eval *ev);

/* Forward only: loss and accuracy sums. */
int kern_model_eval(struct kern_model *m, const struct kern_batch *b, struct kern_eval *ev);

/* Copies parameters to or from host memory (nparams floats). */
int kern_model_get_params(const struct kern_model *m, float *host);
int kern_model_set_params(struct kern_model *m, const float *host);
int kern_model_get_grads(const struct kern_model *m, float *host);

/* Looks up a tensor by name; NULL when absent. Borrowed. */
const struct kern_tensor *kern_model_tensor(const struct kern_model *m, const char *name);

void kern_model_free(struct kern_model *m);

/* ---- pipeline stages of a GPT model (issue 19) ----
 *
 * Pipeline parallelism splits the layers of a model into S stages that run
 * on different agents, each handling "a consecutive sequence of layers"
 * (seed 003_f3537b728458fcc1.txt §2); stage j receives activations from
 * stage j-1 in forward and gradients of activations from stage j+1 in
 * backward (§3.5). A stage holds:
 *   - the blocks of layers [first_layer, first_layer + n_layers);
 *   - with has_embed (the first stage, first_layer 0): the token and
 *     position embeddings "wte" and "wpe";
 *   - with has_head (the last stage, ending at n_layer): the final
 *     LayerNorm "ln_f.*" and the output head, which in GPT is the token
 *     embedding again (logits = x @ wte^T): that stage holds its own "wte".
 * Tensor names, shapes and weight-decay flags are those of kern_tfm_new's
 * model, and a stage's table is the whole model's table restricted to what
 * the stage holds, in the same order (checkpoints and LAMB's per-tensor
 * logic work per stage; a single stage with everything is laid out exactly
 * like the whole model).
 *
 * Tied embedding: when the first and the last stage are different models,
 * each holds a copy of "wte" (same name, same initial values). The whole
 * model's gradient of wte is the SUM of the two copies' gradients: after
 * every backward, the two stages must add each other's wte gradient (as
 * Megatron-LM all-reduces the embedding gradient between its first and last
 * pipeline stage) and then apply the identical update to both copies, so
 * they stay equal. The kernels do not do this exchange; the pipeline driver
 * does.
 *
 * Initialization: a stage's parameters EQUAL the same-named tensors of
 * kern_tfm_new(be, c, ., seed) (the draws of the tensors it does not hold
 * are skipped, not omitted), so S stages start exactly where the
 * single-process model starts.
 *
 * Only GPT: ALBERT's cross-layer sharing ties every layer's parameters
 * together (and a GPT config with share_layers is refused for the same
 * reason). */
struct kern_tfm_stage {
    int first_layer; /* 0..n_layer-1, or n_layer for a head-only stage */
    int n_layers;    /* 0 only for a stage with the embedding or the head */
    int has_embed;   /* 1: holds wte, wpe; requires first_layer == 0 */
    int has_head;    /* 1: holds ln_f and wte; requires first_layer + n_layers == n_layer */
};

/* Checks one stage against a config; CM_EINVAL with a static message in
 * *why. */
int kern_tfm_stage_check(const struct kern_tfm_config *c, const struct kern_tfm_stage *st,
                         const char **why);

/* Checks a whole split of S stages (1 <= S): each stage valid, the embedding
 * in stage 0 only, the head in stage S-1 only, and the layer ranges
 * consecutive, without gaps or overlaps, covering [0, n_layer). */
int kern_tfm_stages_check(const struct kern_tfm_config *c, const struct kern_tfm_stage *st, int S,
                          const char **why);

/* Fills st[0..S-1] with an even split of the n_layer layers (the first
 * n_layer % S stages get one more), embedding in the first, head in the
 * last. CM_EINVAL unless 1 <= S <= n_layer and c is a valid GPT config. */
int kern_tfm_stages_split(const struct kern_tfm_config *c, int S, struct kern_tfm_stage *st);

/* Parameters a stage holds, without allocating (0 for an invalid stage). */
size_t kern_tfm_stage_param_count(const struct kern_tfm_config *c, const struct kern_tfm_stage *st);

/* Device memory a stage needs for up to max_batch rows, as kern_tfm_mem_need
 * for the whole model (params, grads, act = every buffer kern_tfm_stage_new
 * allocates, scratch, reserve; optim left 0). All zero for an invalid
 * stage. */
void kern_tfm_stage_mem_need(const struct kern_tfm_config *c, const struct kern_tfm_stage *st,
                             int max_batch, struct kern_mem_need *n);

/* Creates a stage model: parameters as described above, activations for up
 * to max_batch rows of c->max_T positions. m->kind is KERN_MODEL_GPT_STAGE.
 * CM_EINVAL when kern_tfm_stage_check refuses (ask it for the reason).
 * *out is owned by the caller; free with kern_model_free. The generic
 * kern_model_fwd_bwd and kern_model_eval work on a stage that has both the
 * embedding and the head (it is the whole model); on other stages they
 * return CM_EINVAL. */
int kern_tfm_stage_new(const struct kern_backend *be, const struct kern_tfm_config *c,
                       const struct kern_tfm_stage *st, int max_batch, uint64_t seed,
                       struct kern_model **out);

/* The stage of a model made by kern_tfm_stage_new; CM_EINVAL for others. */
int kern_tfm_stage_get(const struct kern_model *m, struct kern_tfm_stage *st);

/* Forward of one micro-batch through a stage. Activations travel as HOST
 * memory (B,T,C) floats, row-major: they cross the network between agents
 * anyway, and the stage keeps its own device copy of x_in for backward.
 *   b:     B and T always; tokens (B,T) when the stage has the embedding;
 *          targets (B,T) (-1 = no loss) when it has the head; the other
 *          fields are not read.
 *   x_in:  the previous stage's output; NULL for the first stage.
 *   x_out: receives this stage's output; NULL for the last stage.
 *   ev:    optional; the last stage adds loss_sum and count (correct is not
 *          counted: that would copy all probabilities to the host), other
 *          stages leave it untouched.
 * Saves what backward needs, overwriting the previous micro-batch's: a
 * stage holds ONE micro-batch in flight, so a schedule runs forward and
 * backward of a micro-batch before the next forward on the same stage (or
 * uses one stage model per micro-batch in flight). CM_EINVAL for sizes
 * above what the model was built for, tokens or targets out of range, a
 * non-finite x_in (a peer's garbage), or a NULL/non-NULL pointer that does
 * not fit the stage; nothing changes then. */
int kern_tfm_stage_forward(struct kern_model *m, const struct kern_batch *b, const float *x_in,
                           float *x_out, struct kern_eval *ev);

/* Backward of the micro-batch of the last forward: grads += d loss/d params,
 * where loss = grad_scale * mean over the rows with a target (as
 * kern_model_fwd_bwd).
 *   dx_out:     (B,T,C) host, d loss / d x_out from the next stage; NULL for
 *               the last stage, which starts from its own loss.
 *   grad_scale: read by the last stage only; the dx_out other stages get
 *               already carries it.
 *   dx_in:      receives d loss / d x_in (B,T,C) host for the previous
 *               stage; NULL for the first stage.
 * A last stage whose batch had no targets adds nothing and sends zeros.
 * CM_EINVAL before any forward, for a non-finite dx_out or for pointers
 * that do not fit the stage (nothing changes). */
int kern_tfm_stage_backward(struct kern_model *m, const float *dx_out, float grad_scale,
                            float *dx_in);

/* Masked-LM corruption for ALBERT (BERT recipe): each position is chosen with
 * probability p (0.15); chosen positions get target = original token and are
 * replaced by mask_id 80%, a random token in [0,vocab_real) 10%, kept 10%;
 * other positions get target -1. Works in place on tokens (n). */
void kern_mlm_mask(int *tokens, int *targets, size_t n, float p, int mask_id, int vocab_real,
                   uint64_t *rng);

/* A small deterministic generator (splitmix64) for initialization and
 * masking: the same seed gives the same model on every machine. */
uint64_t kern_rng_u64(uint64_t *state);
float kern_rng_uniform(uint64_t *state);   /* [0,1) */
float kern_rng_normal(uint64_t *state);    /* N(0,1) */

#endif
