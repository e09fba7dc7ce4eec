/* The models' and optimizers' configuration checks and parameter counts,
 * apart from the code that runs them: they need no backend, so the
 * coordinator links this file (with agent/train/train_config.c) to refuse a
 * run whose recipe no agent could load, at creation, with the agent's own
 * message. */
#include <math.h>
#include <stddef.h>

#include "cm_err.h"
#include "kern_dmoe.h"
#include "kern_expert.h"
#include "kern_model.h"
#include "kern_optim.h"

/* the local expert grid's size (kern_dmoe_local.c allocates its cells) */
#define LOCAL_MAX_CELLS 4096

/* ---- MLP ---- */

int kern_mlp_config_check(const struct kern_mlp_config *c, const char **why)
{
    if (c->in_dim < 1 || c->in_dim > KERN_MAX_DIM) {
        *why = "mlp: input width must be in 1..65536";
        return CM_EINVAL;
    }
    if (c->nhidden < 0 || c->nhidden > KERN_MLP_MAX_HIDDEN) {
        *why = "mlp: at most 8 hidden layers";
        return CM_EINVAL;
    }
    for (int i = 0; i < c->nhidden; i++)
        if (c->hidden[i] < 1 || c->hidden[i] > KERN_MAX_DIM) {
            *why = "mlp: hidden widths must be in 1..65536";
            return CM_EINVAL;
        }
    if (c->nclass < 2 || c->nclass > KERN_MAX_DIM) {
        *why = "mlp: classes must be in 2..65536";
        return CM_EINVAL;
    }
    if (kern_mlp_param_count(c) > KERN_MAX_PARAMS) {
        *why = "mlp: too many parameters";
        return CM_EINVAL;
    }
    return CM_OK;
}

size_t kern_mlp_param_count(const struct kern_mlp_config *c)
{
    size_t n = 0;
    int prev = c->in_dim;
    for (int i = 0; i <= c->nhidden; i++) {
        int w = i < c->nhidden ? c->hidden[i] : c->nclass;
        n += (size_t)prev * w + w;
        prev = w;
    }
    return n;
}

/* ---- Transformers (GPT, ALBERT) ---- */

int kern_tfm_config_check(const struct kern_tfm_config *c, const char **why)
{
    if (c->kind != KERN_MODEL_GPT && c->kind != KERN_MODEL_ALBERT) {
        *why = "transformer: kind must be gpt or albert";
        return CM_EINVAL;
    }
    if (c->vocab < 2 || c->vocab > KERN_MAX_VOCAB) {
        *why = "transformer: vocab must be in 2..1000000";
        return CM_EINVAL;
    }
    if (c->max_T < 1 || c->max_T > KERN_MAX_DIM) {
        *why = "transformer: context length must be in 1..65536";
        return CM_EINVAL;
    }
    if (c->n_layer < 1 || c->n_layer > KERN_MAX_LAYERS) {
        *why = "transformer: n_layer must be in 1..128";
        return CM_EINVAL;
    }
    if (c->d_model < 1 || c->d_model > KERN_MAX_DIM || c->d_ff < 1 || c->d_ff > KERN_MAX_DIM ||
        c->d_embed < 1 || c->d_embed > KERN_MAX_DIM) {
        *why = "transformer: d_model, d_embed and d_ff must be in 1..65536";
        return CM_EINVAL;
    }
    if (c->n_head < 1 || c->d_model % c->n_head) {
        *why = "transformer: n_head must divide d_model";
        return CM_EINVAL;
    }
    if (c->kind != KERN_MODEL_ALBERT && (c->post_ln || c->sop)) {
        *why = "transformer: post_ln and sentence_order are for albert";
        return CM_EINVAL;
    }
    if (c->seq_classes && (!c->sop || c->seq_classes < 2 || c->seq_classes > 65536)) {
        *why = "transformer: a sequence classifier needs the sentence-order head's pooler and 2..65536 classes";
        return CM_EINVAL;
    }
    if (c->sop && c->max_T < 3) {
        *why = "transformer: sentence_order needs a context of at least 3 ([CLS] A [SEP] B)";
        return CM_EINVAL;
    }
    if (c->kind == KERN_MODEL_GPT && c->d_embed != c->d_model) {
        *why = "transformer: gpt ties embedding and output, so d_embed must equal d_model";
        return CM_EINVAL;
    }
    if (kern_tfm_param_count(c) > KERN_MAX_PARAMS) {
        *why = "transformer: too many parameters";
        return CM_EINVAL;
    }
    return CM_OK;
}

size_t kern_tfm_param_count(const struct kern_tfm_config *c)
{
    size_t C = c->d_model, E = c->d_embed, F = c->d_ff, V = c->vocab;
    size_t blk = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    size_t nb = c->share_layers ? 1 : (size_t)c->n_layer;
    size_t n = V * E + (size_t)c->max_T * E + nb * blk + 2 * C;
    if (c->kind == KERN_MODEL_ALBERT)
        n += C * E + C + E * C + E + 2 * E + V;
    if (c->kind == KERN_MODEL_ALBERT && c->post_ln)
        n += 2 * E - 2 * C; /* the embedding LayerNorm in, the final one out */
    if (c->kind == KERN_MODEL_ALBERT && c->sop) {
        size_t K = c->seq_classes ? (size_t)c->seq_classes : 2;
        n += 2 * E + C * C + C + K * C + K;
    }
    return n;
}

/* ---- Optimizers and schedules ---- */

void kern_optim_config_default(struct kern_optim_config *c)
{
    c->kind = KERN_OPT_ADAMW;
    c->lr = 1e-3f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->weight_decay = 0.0f;
    c->clip_norm = 0.0f;
    c->sched = KERN_SCHED_CONSTANT;
    c->warmup_steps = 0;
    c->total_steps = 0;
    c->min_lr_ratio = 0.0f;
}

int kern_optim_config_check(const struct kern_optim_config *c, const char **why)
{
    if (!(c->lr > 0.0f && c->lr < 10.0f)) {
        *why = "optimizer: lr must be in (0, 10)";
        return CM_EINVAL;
    }
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f)) {
        *why = "optimizer: betas must be in [0, 1)";
        return CM_EINVAL;
    }
    if (!(c->eps > 0.0f && c->eps < 1.0f)) {
        *why = "optimizer: eps must be in (0, 1)";
        return CM_EINVAL;
    }
    if (!(c->weight_decay >= 0.0f && c->weight_decay < 1.0f)) {
        *why = "optimizer: weight_decay must be in [0, 1)";
        return CM_EINVAL;
    }
    if (!(c->clip_norm >= 0.0f) || !isfinite(c->clip_norm)) {
        *why = "optimizer: clip_norm must be >= 0 (0 = off)";
        return CM_EINVAL;
    }
    if (c->warmup_steps < 0 || c->total_steps < 0) {
        *why = "schedule: warmup_steps and total_steps must be >= 0";
        return CM_EINVAL;
    }
    if (c->sched != KERN_SCHED_CONSTANT && c->total_steps <= c->warmup_steps) {
        *why = "schedule: linear/cosine decay needs total_steps > warmup_steps";
        return CM_EINVAL;
    }
    if (!(c->min_lr_ratio >= 0.0f && c->min_lr_ratio <= 1.0f)) {
        *why = "schedule: min_lr_ratio must be in [0, 1]";
        return CM_EINVAL;
    }
    return CM_OK;
}

/* ---- Decentralized mixture of experts ---- */

int kern_dmoe_config_check(const struct kern_dmoe_config *c, const char **why)
{
    if (c->in_dim < 1 || c->in_dim > KERN_MAX_DIM) {
        *why = "dmoe: input width must be in 1..65536";
        return CM_EINVAL;
    }
    if (c->ntrunk < 1 || c->ntrunk > KERN_DMOE_MAX_TRUNK) {
        *why = "dmoe: the trunk has 1..4 layers";
        return CM_EINVAL;
    }
    for (int i = 0; i < c->ntrunk; i++)
        if (c->trunk[i] < 1 || c->trunk[i] > KERN_MAX_DIM) {
            *why = "dmoe: trunk widths must be in 1..65536";
            return CM_EINVAL;
        }
    if (c->grid_d < 1 || c->grid_d > KERN_DMOE_MAX_D || c->grid_m < 2 || c->grid_m > 65536) {
        *why = "dmoe: the grid has 1..8 dimensions of 2..65536 cells";
        return CM_EINVAL;
    }
    double cells = pow((double)c->grid_m, (double)c->grid_d);
    if (cells >= 4611686018427387904.0) { /* 2^62: a flat uid fits in 64 bits */
        *why = "dmoe: grid too large (M^d must be below 2^62)";
        return CM_EINVAL;
    }
    if (c->k < 1 || c->k > KERN_DMOE_MAX_K) {
        *why = "dmoe: k must be in 1..64";
        return CM_EINVAL;
    }
    if (c->nclass < 2 || c->nclass > KERN_MAX_DIM) {
        *why = "dmoe: classes must be in 2..65536";
        return CM_EINVAL;
    }
    if (kern_dmoe_param_count(c) > KERN_MAX_PARAMS) {
        *why = "dmoe: too many parameters";
        return CM_EINVAL;
    }
    return CM_OK;
}

size_t kern_dmoe_param_count(const struct kern_dmoe_config *c)
{
    size_t n = 0, prev = (size_t)c->in_dim, C = (size_t)c->trunk[c->ntrunk - 1];
    for (int i = 0; i < c->ntrunk; i++) {
        n += prev * (size_t)c->trunk[i] + (size_t)c->trunk[i];
        prev = (size_t)c->trunk[i];
    }
    size_t DM = (size_t)c->grid_d * c->grid_m;
    return n + DM * C + DM + (size_t)c->nclass * C + (size_t)c->nclass;
}

/* ---- Experts served in this process ---- */

int kern_dmoe_local_config_check(const struct kern_dmoe_local_config *c, const char **why)
{
    if (c->d < 1 || c->d > KERN_DMOE_MAX_D || c->M < 2 ||
        pow((double)c->M, (double)c->d) > LOCAL_MAX_CELLS) {
        *why = "dmoe experts: the local grid holds at most 4096 experts (M^d)";
        return CM_EINVAL;
    }
    if (c->C < 1 || c->C > KERN_MAX_DIM || c->F < 1 || c->F > KERN_MAX_DIM) {
        *why = "dmoe experts: widths must be in 1..65536";
        return CM_EINVAL;
    }
    if (c->max_rows < 1 || c->max_rows > (1 << 16)) {
        *why = "dmoe experts: max_rows must be in 1..65536";
        return CM_EINVAL;
    }
    if (!(c->fail_prob >= 0.0f && c->fail_prob < 1.0f)) {
        *why = "dmoe experts: fail_prob must be in [0, 1)";
        return CM_EINVAL;
    }
    return kern_optim_config_check(&c->opt, why);
}
