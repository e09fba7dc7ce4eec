/* The transformer models: a GPT-style causal decoder and an ALBERT-style
 * bidirectional encoder, sharing one block implementation (pre-LayerNorm,
 * multi-head self-attention, tanh-GELU MLP), after llm.c's train_gpt2.c.
 *
 * GPT: x0 = wte[tok] + wpe[t]; L blocks; LN; logits = x @ wte^T (tied);
 *      target = next token.
 * ALBERT (Lan et al. 2020 §3.1; DeDLOC trains it, seed
 *      000_02cc6b5d62a616fc.txt §4.2-4.3): factorized embedding, e0 =
 *      wte[tok] + wpe[t] in E dims, x0 = e0 @ Wp^T + bp lifts E -> C;
 *      cross-layer sharing: with share_layers one parameter set serves all L
 *      blocks (gradients of every layer accumulate into it); no causal mask;
 *      MLM head: h = LN_E(gelu(x @ Wh^T + bh)); logits = h @ wte^T + bdec.
 *      Targets come from kern_mlm_mask (-1 where no loss).
 *      With sop (ALBERT's sentence-order prediction, Lan et al. 2020 §4.1;
 *      seed 001 trains sahajBERT with it): segment embeddings wtt[seg] join
 *      e0, and a head on each sequence's first position ([CLS]):
 *      pooled = tanh(x[CLS] @ Wpool^T + bpool); sop_logits = pooled @
 *      Wsop^T + bsop (2 classes: in order, swapped); the loss is the MLM
 *      mean plus the SOP mean.
 *      With post_ln (ALBERT as published, on BERT's encoder): e0 goes
 *      through LayerNorm_E before the lift, the blocks are post-LN
 *      (kern_tfm_int.h), there is no final LayerNorm, and every weight
 *      starts N(0, 0.02) (ALBERT's initializer_range). Without it the blocks
 *      are pre-LN, which trains stably without the warm-up post-LN needs.
 *
 * The block (forward, backward, tensor names, initialization) lives here and
 * is shared through kern_tfm_int.h with kern_tfm_stage.c, which runs a range
 * of a GPT model's layers as one pipeline stage.
 *
 * Shapes: B batch, T positions, C model width, E embedding width, F MLP
 * width, NH heads, V vocabulary, N = B*T rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_internal.h"
#include "kern_model.h"
#include "kern_tfm_int.h"

struct tfm {
    struct kern_tfm_config c;
    size_t wte, wpe, projw, projb, lnfw, lnfb, headw, headb, hlnw, hlnb, decb;
    size_t wtt, elnw, elnb, poolw, poolb, sopw, sopb; /* sop, post_ln */
    int nblk;
    struct kern__tfm_blk *blk;
    struct kern__tfm_act *act;
    struct kern__tfm_scratch s;      /* tmp (N,C) and the block backward's scratch */
    float *enc;                      /* (N,E) */
    float *encn, *enc_mean, *enc_rstd; /* post_ln: LN_E(enc) (N,E) (N) (N) */
    float *tte, *zpe, *dzpe;         /* sop: wtt[seg] (N,E); zeros (T,E) and its dump (T,E) */
    float *cls, *pool_pre, *pool, *sop_logits, *sop_probs, *sop_losses; /* sop: (B,C) x3, (B,2) x2, (B) */
    float *dcls, *dpool_pre, *dpool, *dsop_logits;                     /* sop backward */
    int *seg, *sop_tgt;              /* (N) (B) */
    int K;                           /* the sequence head's classes (sop) */
    float *x0;                       /* (N,C) (ALBERT; GPT uses enc) */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *h, *hg, *hn, *hn_mean, *hn_rstd; /* ALBERT head (N,E) */
    float *logits, *probs, *losses;  /* (N,V) (N,V) (N) */
    /* head backward scratch */
    float *dlogits, *dh, *dhg, *denc;
    int *tok, *tgt;
};

static int albert(const struct tfm *t) { return t->c.kind == KERN_MODEL_ALBERT; }

void kern_tfm_mem_need(const struct kern_tfm_config *c, int max_batch, struct kern_mem_need *n)
{
    /* as kern_tfm_new, buffer by buffer */
    size_t N = (size_t)max_batch * c->max_T, C = c->d_model, E = c->d_embed, F = c->d_ff;
    size_t V = c->vocab, att = (size_t)max_batch * c->n_head * c->max_T * c->max_T;
    size_t np = kern_tfm_param_count(c);
    size_t layer = 5 * N * C + 4 * N + 3 * N * C + 2 * att + 2 * N * F; /* struct act */
    size_t act = (size_t)c->n_layer * layer + N * E;                    /* + enc */
    if (c->kind == KERN_MODEL_ALBERT)
        act += N * C + 6 * N * E + 2 * N;               /* x0, h, hg, hn, dh, dhg, denc, hn stats */
    if (c->post_ln)
        act += N * E + 2 * N;                           /* encn, its stats */
    else
        act += N * C + 2 * N;                           /* lnf, its stats */
    size_t ints = 2 * N;                                /* tok, tgt */
    if (c->sop) { /* tte, zpe, dzpe; cls, pool_pre, pool, dcls, dpool_pre, dpool; logits, probs,
                     dlogits of K; losses; seg, sop_tgt */
        size_t Bm = (size_t)max_batch, K = c->seq_classes ? (size_t)c->seq_classes : 2;
        act += N * E + 2 * (size_t)c->max_T * E + 6 * Bm * C + (3 * K + 1) * Bm;
        ints += N + Bm;
    }
    act += 2 * N * V + N;                               /* logits, probs, losses */
    act += 4 * N * C + 3 * N * C + 2 * att + 2 * N * F + N * V; /* tmp .. dlogits */
    memset(n, 0, sizeof *n);
    n->params = n->grads = np * sizeof(float);
    n->act = act * sizeof(float) + ints * sizeof(int);
    /* kern_cuda.cu: attention's permuted copies (7 (B,T,C) buffers in
     * backward), sumsq's partials and all_finite's flag; kern_cuda_gemm.cu */
    n->scratch = 7 * N * C * sizeof(float) + (np / KERN_SUMSQ_BLOCK + 2) * sizeof(double) +
                 sizeof(int) + kern__tfm_gemm_scratch(c, max_batch, 1);
    n->reserve = KERN_GPU_RESERVE;
}

static size_t up8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

size_t kern__tfm_gemm_scratch(const struct kern_tfm_config *c, int max_batch, int head)
{
    size_t N = up8((size_t)max_batch * c->max_T), C = up8(c->d_model), E = up8(c->d_embed);
    size_t F = up8(c->d_ff), V = up8(c->vocab), W = C > E ? C : E;
    /* bf16 copies of the largest product's two operands, every dimension
       rounded up to 8, 128 elements between them (the attention's batched
       products are not copied) */
    size_t ops = N * F + (F + N) * C + F * W;               /* the block's products */
    size_t out = 3 * C > F ? 3 * C : F; /* widest result of a block's product */
    if (head) {
        size_t h = N * V + (V + N) * W;                     /* LM head (decoder) */
        ops = h > ops ? h : ops;
        out = V > out ? V : out;
    }
    size_t bytes = 2 * (ops + 128);
    /* a result with a dimension that is not a multiple of 8 goes through an
       aligned copy */
    if ((head && c->vocab % 8) || c->d_model % 8 || c->d_embed % 8 || c->d_ff % 8 ||
        ((size_t)max_batch * c->max_T) % 8)
        bytes += N * out * sizeof(float);
    return bytes;
}

/* ---- the block, shared with kern_tfm_stage.c (kern_tfm_int.h) ---- */

int kern__tfm_blk_add(struct kern__tensor_list *tl, struct kern__tfm_blk *k, int l, int C, int F)
{
    int rc = 0;
    char n[KERN_TENSOR_NAME_MAX];
#define BADD(suffix, decay, off, nd, a, b)                                   \
    if (!rc) {                                                               \
        snprintf(n, sizeof n, "blocks.%d.%s", l, suffix);                    \
        rc = kern__tensor_add(tl, n, decay, off, nd, a, b, 0, 0);            \
    }
    BADD("ln1.weight", 0, &k->ln1w, 1, C, 0);
    BADD("ln1.bias", 0, &k->ln1b, 1, C, 0);
    BADD("attn.qkv.weight", 1, &k->qkvw, 2, 3 * C, C);
    BADD("attn.qkv.bias", 0, &k->qkvb, 1, 3 * C, 0);
    BADD("attn.proj.weight", 1, &k->projw, 2, C, C);
    BADD("attn.proj.bias", 0, &k->projb, 1, C, 0);
    BADD("ln2.weight", 0, &k->ln2w, 1, C, 0);
    BADD("ln2.bias", 0, &k->ln2b, 1, C, 0);
    BADD("mlp.fc.weight", 1, &k->fcw, 2, F, C);
    BADD("mlp.fc.bias", 0, &k->fcb, 1, F, 0);
    BADD("mlp.proj.weight", 1, &k->fc2w, 2, C, F);
    BADD("mlp.proj.bias", 0, &k->fc2b, 1, C, 0);
#undef BADD
    return rc;
}

void kern__tfm_act_alloc(const struct kern_backend *be, struct kern__tfm_act *a, size_t N, size_t C,
                         size_t F, size_t att, int *err)
{
    a->ln1 = kern__alloc_f(be, N * C, err);
    a->ln1_mean = kern__alloc_f(be, N, err);
    a->ln1_rstd = kern__alloc_f(be, N, err);
    a->qkv = kern__alloc_f(be, N * 3 * C, err);
    a->atty = kern__alloc_f(be, N * C, err);
    a->preatt = kern__alloc_f(be, att, err);
    a->att = kern__alloc_f(be, att, err);
    a->res2 = kern__alloc_f(be, N * C, err);
    a->ln2 = kern__alloc_f(be, N * C, err);
    a->ln2_mean = kern__alloc_f(be, N, err);
    a->ln2_rstd = kern__alloc_f(be, N, err);
    a->fch = kern__alloc_f(be, N * F, err);
    a->fchg = kern__alloc_f(be, N * F, err);
    a->res3 = kern__alloc_f(be, N * C, err);
}

void kern__tfm_act_release(const struct kern_backend *be, struct kern__tfm_act *a)
{
    float *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv,  a->atty, a->preatt, a->att,
                     a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fchg, a->res3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->release(bufs[i]);
}

void kern__tfm_scratch_alloc(const struct kern_backend *be, struct kern__tfm_scratch *s, size_t N,
                             size_t C, size_t F, size_t att, int *err)
{
    s->tmp = kern__alloc_f(be, N * C, err);
    s->dres = kern__alloc_f(be, N * C, err);
    s->dln = kern__alloc_f(be, N * C, err);
    s->datty = kern__alloc_f(be, N * C, err);
    s->dqkv = kern__alloc_f(be, N * 3 * C, err);
    s->dpreatt = kern__alloc_f(be, att, err);
    s->datt = kern__alloc_f(be, att, err);
    s->dfch = kern__alloc_f(be, N * F, err);
    s->dfchg = kern__alloc_f(be, N * F, err);
}

void kern__tfm_scratch_release(const struct kern_backend *be, struct kern__tfm_scratch *s)
{
    float *bufs[] = {s->tmp,     s->dres, s->dln,  s->datty, s->dqkv,
                     s->dpreatt, s->datt, s->dfch, s->dfchg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->release(bufs[i]);
}

void kern__tfm_blk_fwd(const struct kern_backend *be, const float *P, const struct kern__tfm_blk *k,
                       struct kern__tfm_act *a, const float *res, struct kern__tfm_scratch *s,
                       const struct kern__tfm_dims *d)
{
    int N = d->B * d->T, C = d->C, F = d->F;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    if (d->post_ln) {
        be->matmul_fwd(a->qkv, res, P + k->qkvw, P + k->qkvb, N, C, 3 * C);
        be->attention_fwd(a->atty, a->preatt, a->att, a->qkv, d->B, d->T, C, d->NH, d->causal);
        be->matmul_fwd(s->tmp, a->atty, P + k->projw, P + k->projb, N, C, C);
        be->add(a->res2, res, s->tmp, NC);
        be->layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, a->res2, P + k->ln1w, P + k->ln1b, N, C);
        be->matmul_fwd(a->fch, a->ln1, P + k->fcw, P + k->fcb, N, C, F);
        be->gelu_fwd(a->fchg, a->fch, NF);
        be->matmul_fwd(s->tmp, a->fchg, P + k->fc2w, P + k->fc2b, N, F, C);
        be->add(a->ln2, a->ln1, s->tmp, NC);
        be->layernorm_fwd(a->res3, a->ln2_mean, a->ln2_rstd, a->ln2, P + k->ln2w, P + k->ln2b, N, C);
        return;
    }
    be->layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, res, P + k->ln1w, P + k->ln1b, N, C);
    be->matmul_fwd(a->qkv, a->ln1, P + k->qkvw, P + k->qkvb, N, C, 3 * C);
    be->attention_fwd(a->atty, a->preatt, a->att, a->qkv, d->B, d->T, C, d->NH, d->causal);
    be->matmul_fwd(s->tmp, a->atty, P + k->projw, P + k->projb, N, C, C);
    be->add(a->res2, res, s->tmp, NC);
    be->layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, P + k->ln2w, P + k->ln2b, N, C);
    be->matmul_fwd(a->fch, a->ln2, P + k->fcw, P + k->fcb, N, C, F);
    be->gelu_fwd(a->fchg, a->fch, NF);
    be->matmul_fwd(s->tmp, a->fchg, P + k->fc2w, P + k->fc2b, N, F, C);
    be->add(a->res3, a->res2, s->tmp, NC);
}

/* The post-LN block's backward (kern__tfm_blk_fwd): s->dres holds
 * d/d res3 on entry, d/d res on return; s->dln carries d/d ln2, then
 * d/d ln1 (the residual path plus the MLP branch). */
static void blk_bwd_post(const struct kern_backend *be, const float *P, float *G,
                         const struct kern__tfm_blk *k, const struct kern__tfm_act *a,
                         const float *res, struct kern__tfm_scratch *s, const struct kern__tfm_dims *d)
{
    int N = d->B * d->T, C = d->C, F = d->F;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    be->fill(s->dln, 0.0f, NC);
    be->layernorm_bwd(s->dln, G + k->ln2w, G + k->ln2b, s->dres, a->ln2, P + k->ln2w, a->ln2_mean,
                      a->ln2_rstd, N, C);
    be->fill(s->dfchg, 0.0f, NF);
    be->matmul_bwd(s->dfchg, G + k->fc2w, G + k->fc2b, s->dln, a->fchg, P + k->fc2w, N, F, C);
    be->fill(s->dfch, 0.0f, NF);
    be->gelu_bwd(s->dfch, a->fch, s->dfchg, NF);
    be->matmul_bwd(s->dln, G + k->fcw, G + k->fcb, s->dfch, a->ln1, P + k->fcw, N, C, F);
    /* dln = d/d ln1; dres becomes d/d res2 */
    be->fill(s->dres, 0.0f, NC);
    be->layernorm_bwd(s->dres, G + k->ln1w, G + k->ln1b, s->dln, a->res2, P + k->ln1w, a->ln1_mean,
                      a->ln1_rstd, N, C);
    be->fill(s->datty, 0.0f, NC);
    be->matmul_bwd(s->datty, G + k->projw, G + k->projb, s->dres, a->atty, P + k->projw, N, C, C);
    be->fill(s->dqkv, 0.0f, NC * 3);
    be->attention_bwd(s->dqkv, s->dpreatt, s->datt, s->datty, a->qkv, a->att, d->B, d->T, C, d->NH,
                      d->causal);
    /* the residual path's d/d res2 plus the attention branch's */
    be->matmul_bwd(s->dres, G + k->qkvw, G + k->qkvb, s->dqkv, res, P + k->qkvw, N, C, 3 * C);
}

void kern__tfm_blk_bwd(const struct kern_backend *be, const float *P, float *G,
                       const struct kern__tfm_blk *k, const struct kern__tfm_act *a,
                       const float *res, struct kern__tfm_scratch *s,
                       const struct kern__tfm_dims *d)
{
    if (d->post_ln) {
        blk_bwd_post(be, P, G, k, a, res, s, d);
        return;
    }
    int N = d->B * d->T, C = d->C, F = d->F;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    /* dres = d/d res3: flows to res2 unchanged and into the MLP branch */
    be->fill(s->dfchg, 0.0f, NF);
    be->matmul_bwd(s->dfchg, G + k->fc2w, G + k->fc2b, s->dres, a->fchg, P + k->fc2w, N, F, C);
    be->fill(s->dfch, 0.0f, NF);
    be->gelu_bwd(s->dfch, a->fch, s->dfchg, NF);
    be->fill(s->dln, 0.0f, NC);
    be->matmul_bwd(s->dln, G + k->fcw, G + k->fcb, s->dfch, a->ln2, P + k->fcw, N, C, F);
    be->layernorm_bwd(s->dres, G + k->ln2w, G + k->ln2b, s->dln, a->res2, P + k->ln2w, a->ln2_mean,
                      a->ln2_rstd, N, C);
    /* dres = d/d res2 */
    be->fill(s->datty, 0.0f, NC);
    be->matmul_bwd(s->datty, G + k->projw, G + k->projb, s->dres, a->atty, P + k->projw, N, C, C);
    be->fill(s->dqkv, 0.0f, NC * 3);
    be->attention_bwd(s->dqkv, s->dpreatt, s->datt, s->datty, a->qkv, a->att, d->B, d->T, C, d->NH,
                      d->causal);
    be->fill(s->dln, 0.0f, NC);
    be->matmul_bwd(s->dln, G + k->qkvw, G + k->qkvb, s->dqkv, a->ln1, P + k->qkvw, N, C, 3 * C);
    be->layernorm_bwd(s->dres, G + k->ln1w, G + k->ln1b, s->dln, res, P + k->ln1w, a->ln1_mean,
                      a->ln1_rstd, N, C);
    /* dres = d/d res (the block's input) */
}

void kern__tfm_init_tensor(const struct kern_tensor *ts, float *x, const struct kern_tfm_config *c,
                           uint64_t *rng)
{
    /* GPT-2 initialization: N(0, 0.02), residual projections scaled by
     * 1/sqrt(2L); LayerNorm weight 1, biases 0. Post-LN ALBERT: N(0, 0.02)
     * for every weight (its initializer_range), no scaling. */
    float resid = c->post_ln ? 0.02f : 0.02f / sqrtf(2.0f * c->n_layer);
    const char *nm = ts->name;
    size_t ln = strlen(nm);
    int is_bias = ln > 4 && !strcmp(nm + ln - 4, "bias");
    int is_ln = strstr(nm, "ln") != NULL;
    float std = 0.0f;
    if (is_bias || is_ln) {
        if (x)
            for (size_t j = 0; j < ts->numel; j++)
                x[j] = is_bias ? 0.0f : 1.0f;
        return;
    }
    if (strstr(nm, "proj.weight") && strncmp(nm, "emb_", 4))
        std = resid;
    else
        std = 0.02f;
    if (x)
        kern__init_normal(x, ts->numel, std, rng);
    else
        kern__rng_skip(rng, 2 * (uint64_t)ts->numel); /* kern_rng_normal draws twice */
}

/* ---- the whole model ---- */

static void tfm_destroy(struct kern_model *m)
{
    struct tfm *t = m->impl;
    if (!t)
        return;
    const struct kern_backend *be = m->be;
    if (t->act)
        for (int l = 0; l < t->c.n_layer; l++)
            kern__tfm_act_release(be, &t->act[l]);
    kern__tfm_scratch_release(be, &t->s);
    float *bufs[] = {t->enc,     t->x0,      t->lnf,        t->lnf_mean,  t->lnf_rstd,  t->h,
                     t->hg,      t->hn,      t->hn_mean,    t->hn_rstd,   t->logits,    t->probs,
                     t->losses,  t->dlogits, t->dh,         t->dhg,       t->denc,      t->encn,
                     t->enc_mean, t->enc_rstd, t->tte,      t->zpe,       t->dzpe,      t->cls,
                     t->pool_pre, t->pool,   t->sop_logits, t->sop_probs, t->sop_losses, t->dcls,
                     t->dpool_pre, t->dpool, t->dsop_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->release(bufs[i]);
    be->release(t->tok);
    be->release(t->tgt);
    be->release(t->seg);
    be->release(t->sop_tgt);
    free(t->act);
    free(t->blk);
    free(t);
    m->impl = NULL;
}

/* The sentence-order head's forward on the [CLS] rows of x (N,C): loss and
 * accuracy sums into ev (sop_*). */
static int sop_fwd(struct tfm *t, const struct kern_backend *be, const float *P, const float *x,
                   const struct kern_batch *bt, struct kern_eval *ev)
{
    int B = bt->B, T = bt->T, C = t->c.d_model, K = t->K;
    for (int b = 0; b < B; b++)
        be->copy(t->cls + (size_t)b * C, x + (size_t)b * T * C, sizeof(float) * (size_t)C);
    be->matmul_fwd(t->pool_pre, t->cls, P + t->poolw, P + t->poolb, B, C, C);
    be->tanh_fwd(t->pool, t->pool_pre, (size_t)B * C);
    be->matmul_fwd(t->sop_logits, t->pool, P + t->sopw, P + t->sopb, B, C, K);
    be->xent_fwd(t->sop_losses, t->sop_probs, t->sop_logits, t->sop_tgt, B, K);
    struct kern_eval sev = {0};
    int rc = kern__score(be, t->sop_losses, t->sop_probs, bt->sop, B, K, &sev);
    ev->sop_loss_sum += sev.loss_sum;
    ev->sop_count += sev.count;
    ev->sop_correct += sev.correct;
    return rc;
}

/* Its backward: d loss/d x of the [CLS] rows added into dx (N,C). */
static void sop_bwd(struct tfm *t, const struct kern_backend *be, const float *P, float *G, float *dx,
                    int B, int T, float scale)
{
    int C = t->c.d_model, K = t->K;
    be->fill(t->dsop_logits, 0.0f, (size_t)B * K);
    be->xent_bwd(t->dsop_logits, t->sop_probs, t->sop_tgt, scale, B, K);
    be->fill(t->dpool, 0.0f, (size_t)B * C);
    be->matmul_bwd(t->dpool, G + t->sopw, G + t->sopb, t->dsop_logits, t->pool, P + t->sopw, B, C, K);
    be->fill(t->dpool_pre, 0.0f, (size_t)B * C);
    be->tanh_bwd(t->dpool_pre, t->pool_pre, t->dpool, (size_t)B * C);
    be->fill(t->dcls, 0.0f, (size_t)B * C);
    be->matmul_bwd(t->dcls, G + t->poolw, G + t->poolb, t->dpool_pre, t->cls, P + t->poolw, B, C, C);
    for (int b = 0; b < B; b++)
        be->axpy(dx + (size_t)b * T * C, 1.0f, t->dcls + (size_t)b * C, (size_t)C);
}

static int tfm_run(struct kern_model *m, const struct kern_batch *bt, int backward,
                   float grad_scale, struct kern_eval *ev)
{
    struct tfm *t = m->impl;
    const struct kern_backend *be = m->be;
    const struct kern_tfm_config *c = &t->c;
    int B = bt->B, T = bt->T, C = c->d_model, E = c->d_embed, V = c->vocab;
    int L = c->n_layer, sop = c->sop, post = c->post_ln;
    if (B < 1 || B > m->max_batch || T < 1 || T > m->max_T || !bt->tokens || !bt->targets)
        return CM_EINVAL;
    if (sop && (!bt->segments || !bt->sop))
        return CM_EINVAL;
    size_t N = (size_t)B * T;
    int count = 0;
    for (size_t i = 0; i < N; i++) {
        if (bt->tokens[i] < 0 || bt->tokens[i] >= V || bt->targets[i] >= V)
            return CM_EINVAL;
        if (sop && (bt->segments[i] < 0 || bt->segments[i] > 1))
            return CM_EINVAL;
        count += bt->targets[i] >= 0;
    }
    for (int b = 0; sop && b < B; b++)
        if (bt->sop[b] < 0 || bt->sop[b] >= t->K)
            return CM_EINVAL;
    int rc;
    if ((rc = be->upload(t->tok, bt->tokens, sizeof(int) * N)) ||
        (rc = be->upload(t->tgt, bt->targets, sizeof(int) * N)))
        return rc;
    if (sop && ((rc = be->upload(t->seg, bt->segments, sizeof(int) * N)) ||
                (rc = be->upload(t->sop_tgt, bt->sop, sizeof(int) * (size_t)B))))
        return rc;
    const float *P = m->params;
    float *G = m->grads;
    struct kern__tfm_scratch *s = &t->s;
    struct kern__tfm_dims d = {B, T, C, c->d_ff, c->n_head, c->kind == KERN_MODEL_GPT, post};

    /* ---- forward ---- */
    be->embed_fwd(t->enc, t->tok, P + t->wte, P + t->wpe, B, T, E);
    if (sop) { /* + wtt[seg]: the embedding op with positions of zeros */
        be->embed_fwd(t->tte, t->seg, P + t->wtt, t->zpe, B, T, E);
        be->add(t->enc, t->enc, t->tte, N * E);
    }
    const float *x0 = t->enc;
    if (albert(t)) {
        const float *e = t->enc;
        if (post) {
            be->layernorm_fwd(t->encn, t->enc_mean, t->enc_rstd, t->enc, P + t->elnw, P + t->elnb,
                              (int)N, E);
            e = t->encn;
        }
        be->matmul_fwd(t->x0, e, P + t->projw, P + t->projb, (int)N, E, C);
        x0 = t->x0;
    }
    for (int l = 0; l < L; l++) {
        const float *res = l == 0 ? x0 : t->act[l - 1].res3;
        kern__tfm_blk_fwd(be, P, &t->blk[c->share_layers ? 0 : l], &t->act[l], res, s, &d);
    }
    const float *xl = t->act[L - 1].res3;
    const float *top = xl; /* what the heads read: LN_f(xl), or xl itself after post-LN blocks */
    if (!post) {
        be->layernorm_fwd(t->lnf, t->lnf_mean, t->lnf_rstd, xl, P + t->lnfw, P + t->lnfb, (int)N, C);
        top = t->lnf;
    }
    /* the LM head only where a position has a target: a batch without any
       (a sequence task's) skips its N x V products */
    if (count && albert(t)) {
        be->matmul_fwd(t->h, top, P + t->headw, P + t->headb, (int)N, C, E);
        be->gelu_fwd(t->hg, t->h, N * E);
        be->layernorm_fwd(t->hn, t->hn_mean, t->hn_rstd, t->hg, P + t->hlnw, P + t->hlnb, (int)N,
                          E);
        be->matmul_fwd(t->logits, t->hn, P + t->wte, P + t->decb, (int)N, E, V);
    } else if (count) {
        be->matmul_fwd(t->logits, top, P + t->wte, NULL, (int)N, C, V);
    }
    if (count) {
        be->xent_fwd(t->losses, t->probs, t->logits, t->tgt, (int)N, V);
        if ((rc = kern__score(be, t->losses, backward ? NULL : t->probs, bt->targets, (int)N, V, ev)))
            return rc;
        /* Training: ALBERT's masked-token accuracy (the contribution report's
           mlm_accuracy), counted on the device over the masked rows only;
           downloading the (N,V) probabilities as the evaluation does would
           cost more than the step's cross-entropy. */
        if (backward && albert(t)) {
            long hits = be->argmax_hits(t->probs, t->tgt, (int)N, V);
            if (hits < 0)
                return CM_EDEVICE;
            ev->correct += hits;
        }
    }
    if (sop && (rc = sop_fwd(t, be, P, top, bt, ev)))
        return rc;
    if (!backward || (count == 0 && !sop))
        return CM_OK;

    /* ---- backward ---- (loss = the MLM mean over the targets, plus the
       SOP mean over the sequences) */
    be->fill(s->dln, 0.0f, N * C);
    if (count) {
        be->fill(t->dlogits, 0.0f, N * V);
        be->xent_bwd(t->dlogits, t->probs, t->tgt, grad_scale / count, (int)N, V);
    }
    if (count && albert(t)) {
        be->fill(t->dhg, 0.0f, N * E);
        be->fill(t->dh, 0.0f, N * E);
        /* dhg first holds d/d hn, then d/d hg after the head LayerNorm */
        be->matmul_bwd(t->dhg, G + t->wte, G + t->decb, t->dlogits, t->hn, P + t->wte, (int)N,
                       E, V);
        be->fill(t->denc, 0.0f, N * E);
        be->layernorm_bwd(t->denc, G + t->hlnw, G + t->hlnb, t->dhg, t->hg, P + t->hlnw,
                          t->hn_mean, t->hn_rstd, (int)N, E);
        be->gelu_bwd(t->dh, t->h, t->denc, N * E);
        be->matmul_bwd(s->dln, G + t->headw, G + t->headb, t->dh, top, P + t->headw, (int)N,
                       C, E);
    } else if (count) {
        be->matmul_bwd(s->dln, G + t->wte, NULL, t->dlogits, top, P + t->wte, (int)N, C, V);
    }
    if (sop)
        sop_bwd(t, be, P, G, s->dln, B, T, grad_scale / B);
    if (post) {
        be->copy(s->dres, s->dln, sizeof(float) * N * C);
    } else {
        be->fill(s->dres, 0.0f, N * C);
        be->layernorm_bwd(s->dres, G + t->lnfw, G + t->lnfb, s->dln, xl, P + t->lnfw, t->lnf_mean,
                          t->lnf_rstd, (int)N, C);
    }
    for (int l = L - 1; l >= 0; l--) {
        const float *res = l == 0 ? x0 : t->act[l - 1].res3;
        kern__tfm_blk_bwd(be, P, G, &t->blk[c->share_layers ? 0 : l], &t->act[l], res, s, &d);
    }
    const float *denc = s->dres;
    if (albert(t)) {
        be->fill(t->denc, 0.0f, N * E);
        be->matmul_bwd(t->denc, G + t->projw, G + t->projb, s->dres, post ? t->encn : t->enc,
                       P + t->projw, (int)N, E, C);
        denc = t->denc;
        if (post) { /* dh (free by now) receives d/d enc */
            be->fill(t->dh, 0.0f, N * E);
            be->layernorm_bwd(t->dh, G + t->elnw, G + t->elnb, t->denc, t->enc, P + t->elnw,
                              t->enc_mean, t->enc_rstd, (int)N, E);
            denc = t->dh;
        }
    }
    be->embed_bwd(G + t->wte, G + t->wpe, denc, t->tok, B, T, E);
    if (sop) { /* the zero positions' gradient lands in dzpe, unread */
        be->fill(t->dzpe, 0.0f, (size_t)T * E);
        be->embed_bwd(G + t->wtt, t->dzpe, denc, t->seg, B, T, E);
    }
    return CM_OK;
}

static const struct kern_model_ops TFM_OPS = {tfm_run, tfm_destroy};

static int tfm_layout(struct tfm *t, struct kern__tensor_list *tl)
{
    const struct kern_tfm_config *c = &t->c;
    int C = c->d_model, E = c->d_embed, F = c->d_ff, V = c->vocab;
    int rc = 0;
#define ADD(name, decay, off, nd, a, b) \
    if (!rc)                            \
    rc = kern__tensor_add(tl, name, decay, off, nd, a, b, 0, 0)
    ADD("wte", 1, &t->wte, 2, V, E);
    ADD("wpe", 1, &t->wpe, 2, c->max_T, E);
    if (c->sop)
        ADD("wtt", 1, &t->wtt, 2, 2, E);
    if (albert(t) && c->post_ln) {
        ADD("emb_ln.weight", 0, &t->elnw, 1, E, 0);
        ADD("emb_ln.bias", 0, &t->elnb, 1, E, 0);
    }
    if (albert(t)) {
        ADD("emb_proj.weight", 1, &t->projw, 2, C, E);
        ADD("emb_proj.bias", 0, &t->projb, 1, C, 0);
    }
    for (int l = 0; l < t->nblk && !rc; l++)
        rc = kern__tfm_blk_add(tl, &t->blk[l], l, C, F);
    if (!c->post_ln) {
        ADD("ln_f.weight", 0, &t->lnfw, 1, C, 0);
        ADD("ln_f.bias", 0, &t->lnfb, 1, C, 0);
    }
    if (albert(t)) {
        ADD("mlm.dense.weight", 1, &t->headw, 2, E, C);
        ADD("mlm.dense.bias", 0, &t->headb, 1, E, 0);
        ADD("mlm.ln.weight", 0, &t->hlnw, 1, E, 0);
        ADD("mlm.ln.bias", 0, &t->hlnb, 1, E, 0);
        ADD("mlm.decoder.bias", 0, &t->decb, 1, V, 0);
    }
    if (c->sop) {
        ADD("pooler.weight", 1, &t->poolw, 2, C, C);
        ADD("pooler.bias", 0, &t->poolb, 1, C, 0);
        if (c->seq_classes) {
            ADD("classifier.weight", 1, &t->sopw, 2, c->seq_classes, C);
            ADD("classifier.bias", 0, &t->sopb, 1, c->seq_classes, 0);
        } else {
            ADD("sop.weight", 1, &t->sopw, 2, 2, C);
            ADD("sop.bias", 0, &t->sopb, 1, 2, 0);
        }
    }
#undef ADD
    return rc;
}

int kern__tfm_table(const struct kern_tfm_config *c, struct kern__tensor_list *tl)
{
    struct tfm t = {.c = *c, .nblk = c->share_layers ? 1 : c->n_layer, .K = c->seq_classes ? c->seq_classes : 2};
    t.blk = calloc((size_t)t.nblk, sizeof *t.blk);
    if (!t.blk)
        return CM_ENOMEM;
    int rc = tfm_layout(&t, tl);
    free(t.blk);
    return rc;
}

int kern_tfm_new(const struct kern_backend *be, const struct kern_tfm_config *c, int max_batch,
                 uint64_t seed, struct kern_model **out)
{
    const char *why;
    if (!be || !c || !out || max_batch < 1 || max_batch > (1 << 20))
        return CM_EINVAL;
    if (kern_tfm_config_check(c, &why))
        return CM_EINVAL;
    struct kern_model *m = calloc(1, sizeof *m);
    struct tfm *t = calloc(1, sizeof *t);
    struct kern__tensor_list tl = {0};
    float *host = NULL;
    int rc = CM_ENOMEM;
    if (!m || !t) {
        free(t);
        free(m);
        return CM_ENOMEM;
    }
    m->ops = &TFM_OPS;
    m->be = be;
    m->kind = c->kind;
    m->impl = t;
    m->max_batch = max_batch;
    m->max_T = c->max_T;
    m->nclass = c->vocab;
    t->c = *c;
    t->nblk = c->share_layers ? 1 : c->n_layer;
    t->K = c->seq_classes ? c->seq_classes : 2;
    t->blk = calloc((size_t)t->nblk, sizeof *t->blk);
    t->act = calloc((size_t)c->n_layer, sizeof *t->act);
    if (!t->blk || !t->act)
        goto fail;
    if ((rc = tfm_layout(t, &tl)) || (rc = kern__model_alloc(m, &tl)))
        goto fail;
    host = malloc(sizeof(float) * m->nparams);
    if (!host) {
        rc = CM_ENOMEM;
        goto fail;
    }
    uint64_t rng = seed;
    for (int i = 0; i < m->ntensors; i++)
        kern__tfm_init_tensor(&m->tensors[i], host + m->tensors[i].off, c, &rng);
    if ((rc = kern_model_set_params(m, host)))
        goto fail;
    free(host);
    host = NULL;

    size_t N = (size_t)max_batch * c->max_T, C = c->d_model, E = c->d_embed, F = c->d_ff;
    size_t V = c->vocab, att = (size_t)max_batch * c->n_head * c->max_T * c->max_T;
    int err = 0;
    for (int l = 0; l < c->n_layer; l++)
        kern__tfm_act_alloc(be, &t->act[l], N, C, F, att, &err);
    t->enc = kern__alloc_f(be, N * E, &err);
    if (c->kind == KERN_MODEL_ALBERT) {
        t->x0 = kern__alloc_f(be, N * C, &err);
        t->h = kern__alloc_f(be, N * E, &err);
        t->hg = kern__alloc_f(be, N * E, &err);
        t->hn = kern__alloc_f(be, N * E, &err);
        t->hn_mean = kern__alloc_f(be, N, &err);
        t->hn_rstd = kern__alloc_f(be, N, &err);
        t->dh = kern__alloc_f(be, N * E, &err);
        t->dhg = kern__alloc_f(be, N * E, &err);
        t->denc = kern__alloc_f(be, N * E, &err);
    }
    if (c->post_ln) {
        t->encn = kern__alloc_f(be, N * E, &err);
        t->enc_mean = kern__alloc_f(be, N, &err);
        t->enc_rstd = kern__alloc_f(be, N, &err);
    } else {
        t->lnf = kern__alloc_f(be, N * C, &err);
        t->lnf_mean = kern__alloc_f(be, N, &err);
        t->lnf_rstd = kern__alloc_f(be, N, &err);
    }
    if (c->sop) {
        size_t Bm = (size_t)max_batch, TE = (size_t)c->max_T * E;
        t->tte = kern__alloc_f(be, N * E, &err);
        t->zpe = kern__alloc_f(be, TE, &err); /* zero-filled (alloc), never written */
        t->dzpe = kern__alloc_f(be, TE, &err);
        t->cls = kern__alloc_f(be, Bm * C, &err);
        t->pool_pre = kern__alloc_f(be, Bm * C, &err);
        t->pool = kern__alloc_f(be, Bm * C, &err);
        t->sop_logits = kern__alloc_f(be, Bm * t->K, &err);
        t->sop_probs = kern__alloc_f(be, Bm * t->K, &err);
        t->sop_losses = kern__alloc_f(be, Bm, &err);
        t->dcls = kern__alloc_f(be, Bm * C, &err);
        t->dpool_pre = kern__alloc_f(be, Bm * C, &err);
        t->dpool = kern__alloc_f(be, Bm * C, &err);
        t->dsop_logits = kern__alloc_f(be, Bm * t->K, &err);
        t->seg = kern__alloc_i(be, N, &err);
        t->sop_tgt = kern__alloc_i(be, Bm, &err);
    }
    t->logits = kern__alloc_f(be, N * V, &err);
    t->probs = kern__alloc_f(be, N * V, &err);
    t->losses = kern__alloc_f(be, N, &err);
    kern__tfm_scratch_alloc(be, &t->s, N, C, F, att, &err);
    t->dlogits = kern__alloc_f(be, N * V, &err);
    t->tok = kern__alloc_i(be, N, &err);
    t->tgt = kern__alloc_i(be, N, &err);
    if ((rc = err))
        goto fail;
    *out = m;
    return CM_OK;
fail:
    free(host);
    free(tl.v);
    kern_model_free(m);
    return rc;
}
