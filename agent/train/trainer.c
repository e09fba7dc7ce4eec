/* The training loop's building blocks (see trainer.h): wires the data
 * stream (common/data), a model and an optimizer (kernels/) and checkpoint
 * files (common/ckpt). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agent/train/trainer.h"
#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "cm_err.h"
#include "cm_log.h"

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* 1 for the image classifiers (MLP, DMoE), which read idx-images. */
static int images(const struct agent_train_config *c)
{
    return c->kind == KERN_MODEL_MLP || c->kind == KERN_MODEL_DMOE;
}

static int in_dim(const struct agent_train_config *c)
{
    return c->kind == KERN_MODEL_DMOE ? c->dmoe.in_dim : c->mlp.in_dim;
}

/* Checks that the data fits the model: image size and classes for the MLP
 * and DMoE classifiers, token range for the transformers. */
static int check_data(struct agent_trainer *t, const struct cm_data_manifest *m, const char *what,
                      char *err, size_t errlen)
{
    if (images(&t->cfg)) {
        int dmoe = t->cfg.kind == KERN_MODEL_DMOE;
        int nclass = dmoe ? t->cfg.dmoe.nclass : t->cfg.mlp.nclass;
        if (m->format != CM_DATA_IDX_IMAGES)
            return fail(err, errlen, CM_EINVAL, "%s: an %s needs idx-images data, not %s", what,
                        dmoe ? "dmoe" : "mlp", cm_data_format_name(m->format));
        if ((size_t)m->rows * m->cols != (size_t)in_dim(&t->cfg))
            return fail(err, errlen, CM_EINVAL,
                        "%s: images have %u x %u = %u pixels, model.inputs is %d", what, m->rows,
                        m->cols, m->rows * m->cols, in_dim(&t->cfg));
        if ((int)m->classes > nclass)
            return fail(err, errlen, CM_EINVAL, "%s: %u classes, model.classes is %d", what,
                        m->classes, nclass);
        return CM_OK;
    }
    if (m->format == CM_DATA_IDX_IMAGES)
        return fail(err, errlen, CM_EINVAL, "%s: a transformer needs text or token data", what);
    t->docs = m->format == CM_DATA_TEXT_DOCS;
    if (t->docs && t->cfg.kind != KERN_MODEL_ALBERT)
        return fail(err, errlen, CM_EINVAL,
                    "%s: text-docs data (sentence pairs) is for albert, not gpt", what);
    if (!t->docs && t->cfg.tfm.sop)
        return fail(err, errlen, CM_EINVAL,
                    "%s: model.sentence_order needs sentence pairs (text-docs data), not %s", what,
                    cm_data_format_name(m->format));
    if (t->docs && t->have_tokenizer &&
        memcmp(t->tokenizer_sha, m->tokenizer.sha256, sizeof t->tokenizer_sha) != 0)
        return fail(err, errlen, CM_EINVAL,
                    "%s: its tokenizer is not the training data's (the same ids must mean the "
                    "same pieces)", what);
    if (t->docs && !t->have_tokenizer) {
        memcpy(t->tokenizer_sha, m->tokenizer.sha256, sizeof t->tokenizer_sha);
        t->have_tokenizer = 1;
    }
    int dv = m->format == CM_DATA_TEXT_BYTES ? 256 : (int)m->vocab_size;
    /* text-docs: the tokenizer has its own [MASK] */
    int need = dv + (t->cfg.kind == KERN_MODEL_ALBERT && !t->docs ? 1 : 0);
    if (t->cfg.tfm.vocab < need)
        return fail(err, errlen, CM_EINVAL,
                    "%s: tokens go up to %d%s, so model.vocab must be at least %d", what, dv - 1,
                    t->cfg.kind == KERN_MODEL_ALBERT ? " plus the [MASK] token" : "", need);
    t->data_vocab = dv;
    return CM_OK;
}

/* Loads and checks a manifest, then opens a stream over it. *man is owned
 * by the caller and must outlive the iterator. */
static int open_data(struct agent_trainer *t, const char *path, const char *what,
                     enum cm_data_mode mode, uint64_t seed, struct cm_data_manifest **man,
                     struct cm_data_iter **it, char *err, size_t errlen)
{
    char merr[256] = "";
    int rc = cm_data_manifest_load(path, man, merr, sizeof merr);
    if (rc)
        return fail(err, errlen, rc, "%s: %s: %s", what, path, merr);
    if ((rc = check_data(t, *man, what, err, errlen)))
        return rc;
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.mode = mode;
    o.shuffle_size = (size_t)t->cfg.shuffle_buffer;
    if (!images(&t->cfg))
        o.seq_len = (size_t)t->cfg.tfm.max_T;
    rc = cm_data_open(*man, seed, &o, it);
    if (rc)
        return fail(err, errlen, rc, "%s: %s: %s", what, path, cm_strerror(rc));
    return CM_OK;
}

static int open_train(struct agent_trainer *t, uint64_t seed, char *err, size_t errlen);

int agent_trainer_init(struct agent_trainer *t, const struct agent_train_config *cfg,
                       const char *config_text, size_t config_len, char *err, size_t errlen)
{
    return agent_trainer_init_ex(t, cfg, config_text, config_len, NULL, err, errlen);
}

/* The experts of a DMoE model: remote ones (join: seed 002 §3.3, trainers
 * call experts hosted by others) or the whole grid in this process. */
static int dmoe_experts(struct agent_trainer *t, const struct moe_remote_config *remote,
                        struct kern_dmoe_experts *ex, char *err, size_t errlen)
{
    const struct agent_train_config *cfg = &t->cfg;
    int rc;
    if (!remote) {
        if ((rc = kern_dmoe_local_new(t->be, &cfg->experts, &t->experts)))
            return fail(err, errlen, rc, "experts: %s", cm_strerror(rc));
        kern_dmoe_local_experts(t->experts, ex);
        return CM_OK;
    }
    struct moe_remote_config rc_ = *remote;
    rc_.d = cfg->dmoe.grid_d;
    rc_.M = cfg->dmoe.grid_m;
    rc_.k = cfg->dmoe.k;
    rc_.C = cfg->dmoe.trunk[cfg->dmoe.ntrunk - 1];
    const char *why = NULL;
    if (moe_remote_config_check(&rc_, &why))
        return fail(err, errlen, CM_EINVAL, "remote experts: %s", why);
    if ((rc = moe_remote_new(&rc_, &t->remote)))
        return fail(err, errlen, rc, "remote experts: %s", cm_strerror(rc));
    moe_remote_experts(t->remote, ex);
    return CM_OK;
}

/* Remote experts: max_inflight model contexts, each with its own context
 * of the remote (its last select and forward id), all under the async
 * engine's compute lock, which the remote drops while it waits. */
static int async_new(struct agent_trainer *t, char *err, size_t errlen)
{
    int K = t->cfg.max_inflight > 0 ? t->cfg.max_inflight : 1;
    struct kern_dmoe_experts ex[AGENT_ASYNC_MAX];
    int rc = CM_OK;
    for (int i = 0; i < K && rc == CM_OK; i++)
        rc = moe_remote_add_context(t->remote, &ex[i]);
    struct agent_async_config ac = {.be = t->be, .dmoe = t->cfg.dmoe,
                                    .micro_batch = t->cfg.micro_batch, .max_inflight = K};
    if (rc == CM_OK)
        rc = agent_async_new(&ac, ex, &t->async);
    if (rc)
        return fail(err, errlen, rc, "asynchronous trainer (%d micro-batches in flight): %s", K,
                    cm_strerror(rc));
    moe_remote_set_compute_lock(t->remote, agent_async_lock(t->async));
    return CM_OK;
}

static int init_any(struct agent_trainer *t, const struct agent_train_config *cfg, const char *config_text,
                    size_t config_len, const struct moe_remote_config *remote,
                    const struct kern_tfm_stage *stage, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->config_text = config_text;
    t->config_len = config_len;
    t->mask_rng = cfg->seed ^ 0x6d61736bULL;
    kern_cpu_set_threads(cfg->threads);
    /* What the GPU must hold (kern_gpu.h): the model's slabs and activations
     * for one micro-batch, the optimizer's state, the backend's scratch. */
    struct kern_mem_need need;
    if (cfg->kind == KERN_MODEL_MLP)
        kern_mlp_mem_need(&cfg->mlp, cfg->micro_batch, &need);
    else if (cfg->kind == KERN_MODEL_DMOE)
        kern_dmoe_mem_need(&cfg->dmoe, cfg->micro_batch, &need);
    else if (stage)
        kern_tfm_stage_mem_need(&cfg->tfm, stage, cfg->micro_batch, &need);
    else
        kern_tfm_mem_need(&cfg->tfm, cfg->micro_batch, &need);
    kern_optim_mem_need(&cfg->opt, need.params / sizeof(float), &need);
    if (cfg->kind == KERN_MODEL_DMOE && remote) {
        /* the asynchronous trainer's contexts: a model each (async.h) */
        size_t k = (size_t)(cfg->max_inflight > 0 ? cfg->max_inflight : 1);
        need.act += k * (need.params + need.grads + need.act);
    }
    char why[512];
    int rc = kern_backend_pick_for(cfg->device, &need, &t->be, why, sizeof why);
    if (rc)
        return fail(err, errlen, rc, "--device %s: %s", cfg->device, why);
    if (t->be->dev != KERN_DEV_CPU && (rc = t->be->set_precision(cfg->precision)))
        return fail(err, errlen, rc, "precision %s: %s", cfg->precision, cm_strerror(rc));
    int mb = cfg->micro_batch;
    if (cfg->kind == KERN_MODEL_MLP) {
        rc = kern_mlp_new(t->be, &cfg->mlp, mb, cfg->seed, &t->model);
    } else if (cfg->kind == KERN_MODEL_DMOE) {
        struct kern_dmoe_experts ex;
        if ((rc = dmoe_experts(t, remote, &ex, err, errlen)))
            return rc;
        rc = kern_dmoe_new(t->be, &cfg->dmoe, mb, cfg->seed, &ex, &t->model);
        if (rc == CM_OK && t->remote && (rc = async_new(t, err, errlen)))
            return rc;
    } else if (stage) {
        const char *why_stage = NULL;
        if (cfg->kind != KERN_MODEL_GPT || kern_tfm_stage_check(&cfg->tfm, stage, &why_stage) != CM_OK)
            return fail(err, errlen, CM_EINVAL, "pipeline stage: %s",
                        why_stage ? why_stage : "only a gpt model runs as pipeline stages");
        rc = kern_tfm_stage_new(t->be, &cfg->tfm, stage, mb, cfg->seed, &t->model);
    } else
        rc = kern_tfm_new(t->be, &cfg->tfm, mb, cfg->seed, &t->model);
    if (rc)
        return fail(err, errlen, rc, "model: %s", cm_strerror(rc));
    if ((rc = kern_optim_new(t->be, &cfg->opt, t->model->nparams, &t->opt)))
        return fail(err, errlen, rc, "optimizer: %s", cm_strerror(rc));
    if (stage && !stage->has_embed)
        return CM_OK; /* the first stage reads the data; the others get activations */
    if ((rc = open_train(t, cfg->data_seed ? cfg->data_seed : cfg->seed, err, errlen)))
        return rc;
    if (cfg->n_mix) {
        size_t T = images(cfg) ? 0 : (size_t)cfg->tfm.max_T, D = images(cfg) ? (size_t)in_dim(cfg) : 0;
        t->mix_src = malloc(sizeof(int) * (size_t)mb);
        t->mix_x = D ? malloc(sizeof(float) * (size_t)mb * D) : NULL;
        t->mix_y = D ? malloc(sizeof(int32_t) * (size_t)mb) : NULL;
        t->mix_tok = D ? NULL : malloc(sizeof(int32_t) * (size_t)mb * (T + 1));
        t->mix_seg = D ? NULL : malloc(sizeof(int32_t) * (size_t)mb * T);
        t->mix_sop = D ? NULL : malloc(sizeof(int32_t) * (size_t)mb);
        if (!t->mix_src || (D && (!t->mix_x || !t->mix_y)) || (!D && (!t->mix_tok || !t->mix_seg || !t->mix_sop)))
            return fail(err, errlen, CM_ENOMEM, "out of memory");
    }
    if (images(cfg)) {
        t->x = malloc(sizeof(float) * (size_t)mb * in_dim(cfg));
        t->y = malloc(sizeof(int32_t) * (size_t)mb);
        if (!t->x || !t->y)
            return fail(err, errlen, CM_ENOMEM, "out of memory");
    } else {
        size_t T = (size_t)cfg->tfm.max_T;
        t->raw = malloc(sizeof(int32_t) * (size_t)mb * (T + 1));
        t->tokens = malloc(sizeof(int) * (size_t)mb * T);
        t->targets = malloc(sizeof(int) * (size_t)mb * T);
        t->segs = malloc(sizeof(int32_t) * (size_t)mb * T);
        t->sop = malloc(sizeof(int32_t) * (size_t)mb);
        if (!t->raw || !t->tokens || !t->targets || !t->segs || !t->sop)
            return fail(err, errlen, CM_ENOMEM, "out of memory");
    }
    return CM_OK;
}

/* The training stream: data.train, and with data.mix the other sets (each
 * its own seed), which must be of data.train's format. */
static int open_train(struct agent_trainer *t, uint64_t seed, char *err, size_t errlen)
{
    int rc = open_data(t, t->cfg.train_manifest, "data.train", CM_DATA_TRAIN, seed, &t->train_manifest,
                       &t->train, err, errlen);
    t->mix[0] = t->train;
    t->mix_rng = seed ^ 0x6d6978ULL;
    for (int k = 1; rc == CM_OK && k <= t->cfg.n_mix; k++) {
        char what[32];
        snprintf(what, sizeof what, "data.mix[%d]", k - 1);
        rc = open_data(t, t->cfg.mix_manifest[k], what, CM_DATA_TRAIN, seed + 0x9E3779B97F4A7C15ULL * (uint64_t)k,
                       &t->mix_manifest[k], &t->mix[k], err, errlen);
        if (rc == CM_OK && t->mix_manifest[k]->format != t->train_manifest->format)
            rc = fail(err, errlen, CM_EINVAL, "%s: %s data, data.train is %s (mixed sets must be of one format)",
                      what, cm_data_format_name(t->mix_manifest[k]->format),
                      cm_data_format_name(t->train_manifest->format));
    }
    return rc;
}

static void close_train(struct agent_trainer *t)
{
    for (int k = 1; k < AGENT_TRAIN_MIX_MAX; k++) {
        cm_data_close(t->mix[k]);
        cm_data_manifest_free(t->mix_manifest[k]);
        t->mix[k] = NULL;
        t->mix_manifest[k] = NULL;
    }
    cm_data_close(t->train);
    cm_data_manifest_free(t->train_manifest);
    t->train = t->mix[0] = NULL;
    t->train_manifest = NULL;
}

/* A micro-batch of the mixed sets (out's buffers, out->capacity examples):
 * each example's set drawn with the weights, each set's examples fetched in
 * one call and put in their places (seed 000 §4.3: "the training process
 * iteratively samples examples from one or the other dataset"). */
static int mixed_next(struct agent_trainer *t, struct cm_data_batch *out)
{
    size_t B = out->capacity, T = (size_t)t->cfg.tfm.max_T, D = images(&t->cfg) ? (size_t)in_dim(&t->cfg) : 0;
    size_t cnt[AGENT_TRAIN_MIX_MAX] = {0};
    for (size_t i = 0; i < B; i++) {
        double u = (double)(kern_rng_u64(&t->mix_rng) >> 11) * 0x1p-53, acc = 0;
        int k = 0;
        while (k < t->cfg.n_mix && u >= (acc += t->cfg.mix_weight[k]))
            k++;
        t->mix_src[i] = k;
        cnt[k]++;
    }
    for (int k = 0; k <= t->cfg.n_mix; k++) {
        if (!cnt[k])
            continue;
        struct cm_data_batch db = {.capacity = cnt[k]};
        if (out->x) {
            db.x = t->mix_x;
            db.y = t->mix_y;
        } else {
            db.tokens = t->mix_tok;
            db.segments = out->segments ? t->mix_seg : NULL;
            db.sop = out->sop ? t->mix_sop : NULL;
        }
        int rc = cm_data_next_batch(t->mix[k], &db);
        if (rc || db.n != cnt[k]) {
            struct cm_data_stats st;
            cm_data_get_stats(t->mix[k], &st);
            CM_LOGE("train", "%s: %s", k ? t->cfg.mix_manifest[k] : t->cfg.train_manifest,
                    rc ? st.last_error : "a short batch");
            return rc ? rc : CM_EIO;
        }
        t->mix_drawn[k] += cnt[k];
        for (size_t i = 0, r = 0; i < B; i++) {
            if (t->mix_src[i] != k)
                continue;
            if (out->x) {
                memcpy(out->x + i * D, t->mix_x + r * D, D * sizeof *out->x);
                out->y[i] = t->mix_y[r];
            } else {
                memcpy(out->tokens + i * (T + 1), t->mix_tok + r * (T + 1), (T + 1) * sizeof *out->tokens);
                if (out->segments)
                    memcpy(out->segments + i * T, t->mix_seg + r * T, T * sizeof *out->segments);
                if (out->sop)
                    out->sop[i] = t->mix_sop[r];
            }
            r++;
        }
    }
    out->n = B;
    return CM_OK;
}

int agent_trainer_init_ex(struct agent_trainer *t, const struct agent_train_config *cfg,
                          const char *config_text, size_t config_len,
                          const struct moe_remote_config *remote, char *err, size_t errlen)
{
    return init_any(t, cfg, config_text, config_len, remote, NULL, err, errlen);
}

int agent_trainer_init_stage(struct agent_trainer *t, const struct agent_train_config *cfg,
                             const struct kern_tfm_stage *stage, char *err, size_t errlen)
{
    return init_any(t, cfg, NULL, 0, NULL, stage, err, errlen);
}

/* BERT's masking of sentence pairs (text-docs): each position that is not
 * [CLS], [SEP] or padding is chosen with probability p; a chosen one keeps
 * its token as the target and becomes [MASK] 80 % of the time, a random
 * token 10 %, itself 10 % (kern_mlm_mask's rule, specials left alone). */
static void mask_pairs(int *tok, int *tgt, size_t n, float p, const struct cm_data_specials *s,
                       int vocab, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        int v = tok[i];
        tgt[i] = -1;
        if (v == s->cls || v == s->sep || v == s->pad || kern_rng_uniform(rng) >= p)
            continue;
        tgt[i] = v;
        float r = kern_rng_uniform(rng);
        if (r < 0.8f)
            tok[i] = s->mask;
        else if (r < 0.9f)
            tok[i] = (int)(kern_rng_u64(rng) % (uint64_t)vocab);
    }
}

/* Turns n (T+1)-token windows into model inputs and targets: next-token
 * pairs for GPT, masked positions for ALBERT. */
static void make_lm_batch(struct agent_trainer *t, size_t n, uint64_t *rng)
{
    size_t T = (size_t)t->cfg.tfm.max_T;
    if (t->docs) { /* a sentence pair in the first T tokens */
        for (size_t b = 0; b < n; b++)
            memcpy(t->tokens + b * T, t->raw + b * (T + 1), T * sizeof *t->tokens);
        mask_pairs(t->tokens, t->targets, n * T, t->cfg.mask_prob, &t->specials, t->data_vocab,
                   rng);
        return;
    }
    for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < T; i++) {
            t->tokens[b * T + i] = t->raw[b * (T + 1) + i];
            t->targets[b * T + i] = t->raw[b * (T + 1) + i + 1];
        }
    if (t->cfg.kind == KERN_MODEL_ALBERT)
        kern_mlm_mask(t->tokens, t->targets, n * T, t->cfg.mask_prob, t->data_vocab,
                      t->data_vocab, rng);
}

static int next_batch(struct agent_trainer *t, struct cm_data_iter *it, uint64_t *rng,
                      struct kern_batch *kb)
{
    struct cm_data_batch db = {.capacity = (size_t)t->cfg.micro_batch};
    if (images(&t->cfg)) {
        db.x = t->x;
        db.y = t->y;
    } else {
        db.tokens = t->raw;
        if (t->docs) {
            db.segments = t->segs;
            db.sop = t->sop;
        }
    }
    int rc = it == t->train && t->cfg.n_mix ? mixed_next(t, &db) : cm_data_next_batch(it, &db);
    if (rc)
        return rc;
    if (t->docs && db.n > 0 && t->specials.mask <= 0) {
        if ((rc = cm_data_specials(it, &t->specials)))
            return rc;
        if (t->specials.mask < 0) {
            CM_LOGE("train", "the tokenizer has no [MASK] piece (scripts/train-tokenizer.sh "
                             "makes one that does)");
            return CM_EINVAL;
        }
    }
    memset(kb, 0, sizeof *kb);
    kb->B = (int)db.n;
    if (db.n == 0)
        return CM_OK;
    if (images(&t->cfg)) {
        kb->x = t->x;
        kb->targets = t->y;
    } else {
        make_lm_batch(t, db.n, rng);
        kb->T = t->cfg.tfm.max_T;
        kb->tokens = t->tokens;
        kb->targets = t->targets;
        if (t->cfg.tfm.sop) {
            kb->segments = t->segs;
            kb->sop = t->sop;
        }
    }
    return CM_OK;
}

int agent_trainer_compute_grads(struct agent_trainer *t, struct kern_eval *ev)
{
    int nmicro = t->cfg.batch_size / t->cfg.micro_batch;
    kern_model_zero_grad(t->model);
    memset(ev, 0, sizeof *ev);
    for (int i = 0; i < nmicro; i++) {
        struct kern_batch kb;
        int rc = next_batch(t, t->train, &t->mask_rng, &kb);
        if (rc) {
            struct cm_data_stats st;
            cm_data_get_stats(t->train, &st);
            CM_LOGE("train", "training data: %s (%s)", cm_strerror(rc), st.last_error);
            return rc;
        }
        if (kb.B != t->cfg.micro_batch)
            return CM_EIO;
        if ((rc = kern_model_fwd_bwd(t->model, &kb, 1.0f / nmicro, ev)))
            return rc;
        t->samples += kb.B;
    }
    return CM_OK;
}

int agent_trainer_next_micro(struct agent_trainer *t, struct kern_batch *kb)
{
    if (!t->train)
        return CM_ESTATE;
    int rc = next_batch(t, t->train, &t->mask_rng, kb);
    if (rc) {
        struct cm_data_stats st;
        cm_data_get_stats(t->train, &st);
        CM_LOGE("train", "training data: %s (%s)", cm_strerror(rc), st.last_error);
        return rc;
    }
    if (kb->B != t->cfg.micro_batch)
        return CM_EIO;
    t->samples += kb->B;
    return CM_OK;
}

int agent_trainer_seek_micro(struct agent_trainer *t, uint64_t n, char *err, size_t errlen)
{
    if (!t->train)
        return CM_ESTATE;
    close_train(t);
    t->mask_rng = t->cfg.seed ^ 0x6d61736bULL;
    int rc = open_train(t, t->cfg.data_seed ? t->cfg.data_seed : t->cfg.seed, err, errlen);
    for (uint64_t i = 0; rc == CM_OK && i < n; i++) {
        struct kern_batch kb;
        if ((rc = agent_trainer_next_micro(t, &kb)) != CM_OK)
            fail(err, errlen, rc, "data.train: micro-batch %llu of %llu: %s", (unsigned long long)i + 1,
                 (unsigned long long)n, cm_strerror(rc));
    }
    return rc;
}

int agent_trainer_submit(struct agent_trainer *t)
{
    if (!t->async)
        return CM_ESTATE;
    if (agent_async_inflight(t->async) >= agent_async_max_inflight(t->async))
        return CM_EBUSY;
    struct kern_batch kb;
    int rc = next_batch(t, t->train, &t->mask_rng, &kb);
    if (rc) {
        struct cm_data_stats st;
        cm_data_get_stats(t->train, &st);
        CM_LOGE("train", "training data: %s (%s)", cm_strerror(rc), st.last_error);
        return rc;
    }
    if (kb.B != t->cfg.micro_batch)
        return CM_EIO;
    int nmicro = t->cfg.batch_size / t->cfg.micro_batch;
    return agent_async_submit(t->async, t->model, kb.x, kb.targets, kb.B, 1.0f / nmicro);
}

int agent_trainer_next(struct agent_trainer *t, struct agent_async_done *d)
{
    if (!t->async)
        return CM_ESTATE;
    int rc = agent_async_next(t->async, d);
    if (rc == CM_OK && d->rc == CM_OK)
        t->samples += d->B;
    return rc;
}

int agent_trainer_inflight(const struct agent_trainer *t)
{
    return t->async ? agent_async_inflight(t->async) : 0;
}

int agent_trainer_apply(struct agent_trainer *t, float *grad_norm, float *lr)
{
    return kern_optim_step(t->opt, t->model, grad_norm, lr);
}

int agent_trainer_evaluate(struct agent_trainer *t, long max_batches, struct kern_eval *ev,
                           char *err, size_t errlen)
{
    struct cm_data_iter *it = NULL;
    struct cm_data_manifest *man = NULL;
    long *hist = NULL;
    memset(ev, 0, sizeof *ev);
    if (!*t->cfg.eval_manifest)
        return fail(err, errlen, CM_EINVAL, "no eval set configured");
    int rc = open_data(t, t->cfg.eval_manifest, "data.eval", CM_DATA_EVAL, 0, &man, &it, err,
                       errlen);
    if (rc)
        goto out;
    /* a fixed masking stream, so successive evaluations see the same corruption */
    uint64_t rng = 0x65766131ULL;
    /* text-docs: how often each token is a masked position's target */
    hist = t->docs ? calloc((size_t)t->data_vocab, sizeof *hist) : NULL;
    if (t->docs && !hist) {
        rc = fail(err, errlen, CM_ENOMEM, "out of memory");
        goto out;
    }
    for (long n = 0; !max_batches || n < max_batches; n++) {
        struct kern_batch kb;
        if ((rc = next_batch(t, it, &rng, &kb))) {
            struct cm_data_stats st;
            cm_data_get_stats(it, &st);
            rc = fail(err, errlen, rc, "eval data: %s (%s)", cm_strerror(rc), st.last_error);
            goto out;
        }
        if (kb.B == 0)
            break;
        for (size_t i = 0; hist && i < (size_t)kb.B * (size_t)kb.T; i++)
            if (kb.targets[i] >= 0 && kb.targets[i] < t->data_vocab)
                hist[kb.targets[i]]++;
        if ((rc = kern_model_eval(t->model, &kb, ev))) {
            rc = fail(err, errlen, rc, "eval: %s", cm_strerror(rc));
            goto out;
        }
    }
    if (hist) {
        long best = 0, total = 0;
        for (int v = 0; v < t->data_vocab; v++) {
            total += hist[v];
            if (hist[v] > best)
                best = hist[v];
        }
        t->eval_baseline = total ? (double)best / (double)total : 0.0;
    }
out:
    free(hist);
    cm_data_close(it);
    cm_data_manifest_free(man);
    return rc;
}

static int ckpt_path(const struct agent_trainer *t, char *out, size_t n)
{
    int k = snprintf(out, n, "%s/latest.ckpt", t->cfg.ckpt_dir);
    return (k < 0 || (size_t)k >= n) ? CM_EINVAL : CM_OK;
}

int agent_trainer_save(struct agent_trainer *t, char *err, size_t errlen)
{
    char path[AGENT_TRAIN_PATH_MAX + 32];
    if (!*t->cfg.ckpt_dir || ckpt_path(t, path, sizeof path))
        return fail(err, errlen, CM_EINVAL, "no checkpoint directory");
    if (mkdir(t->cfg.ckpt_dir, 0755) && errno != EEXIST)
        return fail(err, errlen, CM_EIO, "%s: %s", t->cfg.ckpt_dir, strerror(errno));
    size_t n = t->model->nparams;
    float *p = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float));
    float *v = malloc(n * sizeof(float));
    int rc = CM_ENOMEM;
    if (!p || !m || !v)
        goto out;
    if ((rc = kern_model_get_params(t->model, p)) ||
        (rc = t->be->download(m, t->opt->m, n * sizeof(float))) ||
        (rc = t->be->download(v, t->opt->v, n * sizeof(float))))
        goto out;
    struct cm_ckpt_buf bufs[2] = {{.name = "adam.m", .data = m, .count = n},
                                  {.name = "adam.v", .data = v, .count = n}};
    struct cm_ckpt c = {.step = (uint64_t)t->opt->step,
                        .params = p,
                        .n_params = n,
                        .opt = bufs,
                        .n_opt = 2,
                        .rng = (uint8_t *)&t->mask_rng,
                        .rng_len = sizeof t->mask_rng,
                        .config = (char *)t->config_text,
                        .config_len = (uint32_t)t->config_len};
    rc = cm_ckpt_write(path, &c, NULL);
out:
    free(p);
    free(m);
    free(v);
    if (rc)
        return fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    return CM_OK;
}

int agent_trainer_resume(struct agent_trainer *t, int *resumed, char *err, size_t errlen)
{
    char path[AGENT_TRAIN_PATH_MAX + 32];
    struct stat sb;
    *resumed = 0;
    if (!*t->cfg.ckpt_dir || ckpt_path(t, path, sizeof path) || stat(path, &sb))
        return CM_OK;
    struct cm_ckpt c;
    int rc = cm_ckpt_read(path, &c);
    if (rc)
        return fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    size_t n = t->model->nparams;
    const struct cm_ckpt_buf *m = cm_ckpt_find(&c, "adam.m"), *v = cm_ckpt_find(&c, "adam.v");
    if (c.n_params != n || !m || !v || m->count != n || v->count != n) {
        rc = fail(err, errlen, CM_EINVAL,
                  "%s: holds %llu parameters, this model has %zu (different config?)", path,
                  (unsigned long long)c.n_params, n);
        goto out;
    }
    if ((rc = kern_model_set_params(t->model, c.params)) ||
        (rc = t->be->upload(t->opt->m, m->data, n * sizeof(float))) ||
        (rc = t->be->upload(t->opt->v, v->data, n * sizeof(float)))) {
        rc = fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
        goto out;
    }
    t->opt->step = (long)c.step;
    if (c.rng_len == sizeof t->mask_rng)
        memcpy(&t->mask_rng, c.rng, sizeof t->mask_rng);
    *resumed = 1;
    if (t->resume_keeps_stream)
        goto out;
    /* The stream restarts in a fresh order rather than replaying the
     * examples the first run already consumed. */
    close_train(t);
    rc = open_train(t, (t->cfg.data_seed ? t->cfg.data_seed : t->cfg.seed) + c.step, err, errlen);
out:
    cm_ckpt_cleanup(&c);
    return rc;
}

void agent_trainer_cleanup(struct agent_trainer *t)
{
    close_train(t);
    free(t->mix_src);
    free(t->mix_x);
    free(t->mix_y);
    free(t->mix_tok);
    free(t->mix_seg);
    free(t->mix_sop);
    kern_optim_free(t->opt);
    agent_async_free(t->async); /* waits for the micro-batches in flight (deadlines) */
    kern_model_free(t->model);
    kern_dmoe_local_free(t->experts);
    moe_remote_free(t->remote); /* after the net stopped: see moe_remote_free */
    free(t->x);
    free(t->y);
    free(t->raw);
    free(t->tokens);
    free(t->segs);
    free(t->sop);
    free(t->targets);
    memset(t, 0, sizeof *t);
}

int agent_model_export(const struct kern_model *m, const char *path, const char *const *meta_kv,
                       size_t n_meta)
{
    float *host = malloc(m->nparams * sizeof *host);
    struct cm_st_export *t = calloc((size_t)m->ntensors, sizeof *t);
    int rc = CM_ENOMEM;
    if (host && t && (rc = m->be->download(host, m->params, m->nparams * sizeof *host)) == CM_OK) {
        for (int i = 0; i < m->ntensors; i++) {
            t[i].name = m->tensors[i].name;
            t[i].ndim = (uint32_t)m->tensors[i].ndim;
            for (int d = 0; d < m->tensors[i].ndim; d++)
                t[i].shape[d] = (uint64_t)m->tensors[i].shape[d];
            t[i].data = host + m->tensors[i].off;
        }
        rc = cm_st_write(path, t, (size_t)m->ntensors, meta_kv, n_meta);
    }
    free(host);
    free(t);
    return rc;
}

int agent_model_import(struct kern_model *m, const char *path, const char *fresh, int *loaded, int *ignored,
                       char *err, size_t errlen)
{
    struct cm_st_file f;
    *loaded = *ignored = 0;
    int rc = cm_st_load(path, (uint64_t)16 << 30, &f);
    if (rc)
        return fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    float *host = malloc(m->nparams * sizeof *host);
    if (!host || (rc = kern_model_get_params(m, host)) != CM_OK) {
        cm_st_cleanup(&f);
        free(host);
        return fail(err, errlen, host ? rc : CM_ENOMEM, "%s: %s", path, cm_strerror(host ? rc : CM_ENOMEM));
    }
    for (int i = 0; i < m->ntensors && rc == CM_OK; i++) {
        const struct kern_tensor *ts = &m->tensors[i];
        if (fresh && !strncmp(ts->name, fresh, strlen(fresh)))
            continue;
        uint64_t shape[CM_ST_MAX_DIMS];
        for (int d = 0; d < ts->ndim; d++)
            shape[d] = (uint64_t)ts->shape[d];
        rc = cm_st_read_f32(&f, ts->name, (uint32_t)ts->ndim, shape, host + ts->off);
        if (rc == CM_ENOTFOUND)
            fail(err, errlen, rc, "%s has no tensor %s (not this model's: compare the configs)", path, ts->name);
        else if (rc)
            fail(err, errlen, rc, "%s: tensor %s: %s (not this model's shape?)", path, ts->name, cm_strerror(rc));
        else
            ++*loaded;
    }
    for (size_t k = 0; rc == CM_OK && k < f.n; k++)
        *ignored += kern_model_tensor(m, f.tensors[k].name) == NULL;
    if (rc == CM_OK && (rc = kern_model_set_params(m, host)) != CM_OK)
        fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    cm_st_cleanup(&f);
    free(host);
    return rc;
}
