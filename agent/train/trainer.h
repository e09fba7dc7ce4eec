/* The training loop's building blocks, shared by `train --local` and the
 * collaborative agent: compute the gradient of one global batch (micro-batch
 * accumulation into the model's flat gradient buffer), apply one optimizer
 * step, evaluate, save and resume checkpoints. Collaborative training puts
 * the all-reduce of the flat gradient between compute_grads and apply
 * (seed 000_02cc6b5d62a616fc.txt §3, steps 3-5); local training calls them
 * back to back, which makes it the reference the collaboration must match. */
#ifndef AGENT_TRAINER_H
#define AGENT_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "agent/moe/remote.h"
#include "agent/train/async.h"
#include "agent/train/train_config.h"
#include "data/data.h"
#include "kern_backend.h"
#include "kern_dmoe.h"
#include "kern_model.h"
#include "kern_optim.h"

struct agent_trainer {
    struct agent_train_config cfg;
    const char *config_text;        /* borrowed: stored in checkpoints */
    size_t config_len;
    const struct kern_backend *be;  /* borrowed */
    struct kern_model *model;       /* owned */
    struct kern_dmoe_local *experts; /* owned: a DMoE model's in-process experts (train --local) */
    struct moe_remote *remote;      /* owned: or its experts over the network (join); the
                                       caller attaches a runner once the net is up */
    struct agent_async *async;      /* owned: with remote experts, the micro-batches in
                                       flight (agent_trainer_submit / _next) */
    struct kern_optim *opt;         /* owned */
    struct cm_data_manifest *train_manifest; /* owned; outlives train */
    struct cm_data_iter *train;     /* owned */
    /* data.mix (cfg.n_mix > 0): the other training sets, each example drawn
       from set k with probability cfg.mix_weight[k] */
    struct cm_data_manifest *mix_manifest[AGENT_TRAIN_MIX_MAX]; /* owned; [0] unused */
    struct cm_data_iter *mix[AGENT_TRAIN_MIX_MAX];              /* owned but [0] = train */
    uint64_t mix_rng;
    uint64_t mix_drawn[AGENT_TRAIN_MIX_MAX]; /* examples drawn from each set (this process) */
    int *mix_src;                   /* (mb) the set of each example of a mixed micro-batch */
    float *mix_x;                   /* (mb, in_dim) one set's rows of it */
    int32_t *mix_y, *mix_tok, *mix_seg, *mix_sop;
    int data_vocab;                 /* text: token values are < data_vocab */
    int docs;                       /* text-docs data: sentence pairs, the tokenizer's
                                       [MASK] (specials below, from the stream) */
    struct cm_data_specials specials;
    uint8_t tokenizer_sha[32];      /* text-docs: train and eval must share the tokenizer */
    int have_tokenizer;
    double eval_baseline;           /* text-docs: after an evaluation, the share of masked
                                       positions whose target is the eval set's most
                                       frequent token (the unigram baseline's accuracy) */
    /* host batch buffers for one micro-batch */
    float *x;
    int32_t *y;
    int32_t *raw;                   /* (mb, T+1) */
    int *tokens, *targets;
    int32_t *segs, *sop;            /* text-docs: (mb, T) segment ids, (mb) swapped pairs */
    uint64_t mask_rng;
    double samples;                 /* examples consumed since start (this process) */
    int resume_keeps_stream;        /* 1: resume leaves the data stream as it is (a
                                       collaborative peer loading another peer's state
                                       keeps its own data order); 0: restart it */
};

/* Builds backend, model, optimizer and the training data stream from cfg.
 * err gets a message on failure. */
int agent_trainer_init(struct agent_trainer *t, const struct agent_train_config *cfg,
                       const char *config_text, size_t config_len, char *err, size_t errlen);

/* As agent_trainer_init; for a DMoE model, remote (not NULL) makes the
 * experts remote ones (agent/moe/remote.h) with that config, its grid, k
 * and width taken from cfg's model. Ignored for other models. */
int agent_trainer_init_ex(struct agent_trainer *t, const struct agent_train_config *cfg,
                          const char *config_text, size_t config_len,
                          const struct moe_remote_config *remote, char *err, size_t errlen);

/* A pipeline stage's trainer (docs/pipelines.md, "Stage agents"): the
 * model is stage `stage` of cfg's GPT (kern_tfm_stage_new, the same initial
 * parameters as the whole model's), with its optimizer; only a stage with
 * the embedding opens the training data (t->train NULL otherwise). The
 * config text is not kept (stages save no checkpoints yet). */
int agent_trainer_init_stage(struct agent_trainer *t, const struct agent_train_config *cfg,
                             const struct kern_tfm_stage *stage, char *err, size_t errlen);

/* The next micro-batch of the training stream (micro_batch examples; the
 * batch points into t's buffers, valid until the next call), counted in
 * t->samples. CM_ESTATE without a stream; CM_EIO for a short batch. */
int agent_trainer_next_micro(struct agent_trainer *t, struct kern_batch *kb);

/* Starts the training stream again from its beginning (the same order)
 * and reads n micro-batches of it: the position after n micro-batches, as
 * a pipeline's first stage needs after a re-scheduling (docs/pipelines.md,
 * "Re-scheduling"). CM_ESTATE without a stream. */
int agent_trainer_seek_micro(struct agent_trainer *t, uint64_t n, char *err, size_t errlen);

/* grads = gradient of the mean loss over the next batch_size examples
 * (batch_size / micro_batch forward/backward passes). ev gets the sums. */
int agent_trainer_compute_grads(struct agent_trainer *t, struct kern_eval *ev);

/* Asynchronous micro-batches (trainers with remote experts, t->async; seed
 * 002 §3.3, agent/train/async.h). submit reads the next micro-batch of the
 * stream and starts it (gradient scale 1 / (batch_size / micro_batch)), in
 * a context holding the model's parameters as they are when the first of
 * the micro-batches in flight started: change them (apply, resume, load)
 * only with none in flight. CM_EBUSY when max_inflight are in flight.
 * next waits for the oldest; a micro-batch whose fwd/bwd succeeded counts
 * in t->samples (whatever its experts did). CM_ESTATE: t->async is NULL,
 * or (next) none in flight. */
int agent_trainer_submit(struct agent_trainer *t);
int agent_trainer_next(struct agent_trainer *t, struct agent_async_done *d);
/* Micro-batches in flight (0 without t->async). */
int agent_trainer_inflight(const struct agent_trainer *t);

/* One optimizer step from the gradient buffer (global step = t->opt->step). */
int agent_trainer_apply(struct agent_trainer *t, float *grad_norm, float *lr);

/* One pass over the eval set (at most max_batches micro-batches; 0 = all). */
int agent_trainer_evaluate(struct agent_trainer *t, long max_batches, struct kern_eval *ev,
                           char *err, size_t errlen);

/* Writes cfg.ckpt_dir/latest.ckpt atomically (params, adam.m, adam.v, step,
 * RNG, config). */
int agent_trainer_save(struct agent_trainer *t, char *err, size_t errlen);

/* Loads cfg.ckpt_dir/latest.ckpt when it exists: *resumed = 1. A checkpoint
 * of a different model shape is an error and changes nothing. */
int agent_trainer_resume(struct agent_trainer *t, int *resumed, char *err, size_t errlen);

void agent_trainer_cleanup(struct agent_trainer *t);

/* Writes m's parameters to path as safetensors (F32, the model's tensor
 * names and shapes; atomically), with meta_kv's n_meta key/value pairs. */
int agent_model_export(const struct kern_model *m, const char *path, const char *const *meta_kv,
                       size_t n_meta);

/* Loads into m every tensor of the safetensors file at path whose name m
 * has, except those starting with `fresh` (NULL: none), which keep m's
 * values: a pretrained encoder under a new head. Every other tensor of m
 * must be in the file with m's shape (CM_ENOTFOUND / CM_EINVAL naming it in
 * err; m is unchanged then); tensors of the file that m lacks (another
 * head) are counted in *ignored. *loaded: tensors taken from the file. */
int agent_model_import(struct kern_model *m, const char *path, const char *fresh, int *loaded, int *ignored,
                       char *err, size_t errlen);

#endif
