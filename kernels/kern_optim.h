/* Optimizers over a model's flat parameter buffer: AdamW and LAMB, global
 * gradient-norm clipping, and a learning-rate schedule (linear warm-up, then
 * constant, linear or cosine decay) keyed to the GLOBAL step, so every peer
 * of a collaborative run applies the same step to the same averaged gradient
 * (seed 000_02cc6b5d62a616fc.txt §3, step 5; §4.2 trains ALBERT with LAMB).
 *
 * Optimizer state (first and second moments) lives in two more flat device
 * buffers the length of the parameters: fp32 master state on every backend. */
#ifndef KERN_OPTIM_H
#define KERN_OPTIM_H

#include "kern_model.h"

enum kern_opt_kind { KERN_OPT_ADAMW = 0, KERN_OPT_LAMB };
enum kern_sched_kind { KERN_SCHED_CONSTANT = 0, KERN_SCHED_LINEAR, KERN_SCHED_COSINE };

struct kern_optim_config {
    enum kern_opt_kind kind;
    float lr;            /* peak learning rate */
    float beta1, beta2, eps;
    float weight_decay;  /* decoupled; only tensors with decay = 1 */
    float clip_norm;     /* global L2 norm bound; 0 = no clipping */
    enum kern_sched_kind sched;
    long warmup_steps;   /* linear 0 -> lr over these steps */
    long total_steps;    /* decay reaches min_lr_ratio * lr here */
    float min_lr_ratio;
};

struct kern_optim {
    struct kern_optim_config cfg;
    const struct kern_backend *be; /* borrowed */
    size_t n;
    float *m, *v;        /* device, n floats each, owned */
    float *u;            /* LAMB update scratch, device, owned (NULL for AdamW) */
    long step;           /* steps applied so far (the global step) */
};

/* Defaults: AdamW, lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 0, no clipping,
 * constant schedule. */
void kern_optim_config_default(struct kern_optim_config *c);
/* CM_EINVAL with a message in *why for out-of-range values. */
int kern_optim_config_check(const struct kern_optim_config *c, const char **why);

/* Learning rate for global step s (0-based). */
float kern_sched_lr(const struct kern_optim_config *c, long step);

int kern_optim_new(const struct kern_backend *be, const struct kern_optim_config *c, size_t n,
                   struct kern_optim **out);
void kern_optim_free(struct kern_optim *o);
/* Sets n->optim to the bytes kern_optim_new allocates for nparams
 * parameters: m and v (AdamW), plus the direction u (LAMB), fp32. */
void kern_optim_mem_need(const struct kern_optim_config *c, size_t nparams,
                         struct kern_mem_need *n);

/* One update of m's parameters from m's gradients: clip, then AdamW or LAMB
 * at kern_sched_lr(step); step++. Gradients that are not all finite give
 * CM_ENUMERIC and change nothing. grad_norm (before clipping) and lr
 * (optional) report what was done. Gradients are left as they are (scaled
 * when clipped); the caller zeroes them. */
int kern_optim_step(struct kern_optim *o, struct kern_model *m, float *grad_norm, float *lr);
/* The same with the gradients' global L2 norm given (clipping uses it
 * instead of m's own): a pipeline stage holds part of the model, and
 * clipping must see the whole model's norm (docs/pipelines.md). CM_EINVAL
 * for a norm that is negative or not finite. */
int kern_optim_step_norm(struct kern_optim *o, struct kern_model *m, double norm, float *lr);

#endif
