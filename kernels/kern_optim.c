/* AdamW, LAMB, clipping and schedules (see kern_optim.h). The elementwise
 * work runs on the backend; this file only walks the tensor table, because
 * weight decay and LAMB's trust ratio are per tensor. LAMB: You et al. 2020,
 * Algorithm 2, with phi = identity: each tensor's Adam update u is rescaled
 * by ||w|| / ||u|| (1 when either norm is 0). */
#include <math.h>
#include <stdlib.h>

#include "cm_err.h"
#include "kern_optim.h"

float kern_sched_lr(const struct kern_optim_config *c, long step)
{
    if (step < c->warmup_steps)
        return c->lr * (float)(step + 1) / (float)c->warmup_steps;
    if (c->sched == KERN_SCHED_CONSTANT)
        return c->lr;
    double frac = (double)(step - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
    if (frac > 1.0)
        frac = 1.0;
    double mult = c->sched == KERN_SCHED_LINEAR ? 1.0 - frac : 0.5 * (1.0 + cos(M_PI * frac));
    double lo = c->min_lr_ratio;
    return (float)(c->lr * (lo + (1.0 - lo) * mult));
}

int kern_optim_new(const struct kern_backend *be, const struct kern_optim_config *c, size_t n,
                   struct kern_optim **out)
{
    const char *why;
    if (!be || !c || !out || n == 0 || kern_optim_config_check(c, &why))
        return CM_EINVAL;
    struct kern_optim *o = calloc(1, sizeof *o);
    if (!o)
        return CM_ENOMEM;
    o->cfg = *c;
    o->be = be;
    o->n = n;
    int rc = be->alloc(n * sizeof(float), (void **)&o->m);
    if (!rc)
        rc = be->alloc(n * sizeof(float), (void **)&o->v);
    if (!rc && c->kind == KERN_OPT_LAMB)
        rc = be->alloc(n * sizeof(float), (void **)&o->u);
    if (rc) {
        kern_optim_free(o);
        return rc;
    }
    *out = o;
    return CM_OK;
}

void kern_optim_free(struct kern_optim *o)
{
    if (!o)
        return;
    o->be->release(o->m);
    o->be->release(o->v);
    o->be->release(o->u);
    free(o);
}

static int step_with(struct kern_optim *o, struct kern_model *m, const double *norm_in, float *grad_norm,
                     float *lr_out)
{
    if (!o || !m || m->nparams != o->n || m->be != o->be)
        return CM_EINVAL;
    if (norm_in && !(*norm_in >= 0.0 && isfinite(*norm_in)))
        return CM_EINVAL;
    const struct kern_backend *be = o->be;
    const struct kern_optim_config *c = &o->cfg;
    if (!be->all_finite(m->grads, m->nparams))
        return CM_ENUMERIC;
    /* sumsq has one summation order on every backend and thread count
     * (kern_backend.h), so the clipping factor and LAMB's ratios below have
     * the same bits on CPU and CUDA peers; the rest is this host code. */
    double norm = norm_in ? *norm_in : sqrt(be->sumsq(m->grads, m->nparams));
    if (grad_norm)
        *grad_norm = (float)norm;
    if (c->clip_norm > 0.0f && norm > c->clip_norm)
        be->scale(m->grads, (float)(c->clip_norm / norm), m->nparams);
    float lr = kern_sched_lr(c, o->step);
    int t = (int)(o->step + 1);
    for (int i = 0; i < m->ntensors; i++) {
        const struct kern_tensor *ts = &m->tensors[i];
        float wd = ts->decay ? c->weight_decay : 0.0f;
        float *p = m->params + ts->off;
        const float *g = m->grads + ts->off;
        float *mm = o->m + ts->off, *vv = o->v + ts->off;
        if (c->kind == KERN_OPT_ADAMW) {
            be->adamw(p, g, mm, vv, ts->numel, lr, c->beta1, c->beta2, c->eps, wd, t);
        } else {
            float *u = o->u + ts->off;
            be->adam_dir(u, p, g, mm, vv, ts->numel, c->beta1, c->beta2, c->eps, wd, t);
            double pn = sqrt(be->sumsq(p, ts->numel));
            double un = sqrt(be->sumsq(u, ts->numel));
            double ratio = (pn > 0.0 && un > 0.0) ? pn / un : 1.0;
            be->axpy(p, (float)(-lr * ratio), u, ts->numel);
        }
    }
    o->step++;
    if (lr_out)
        *lr_out = lr;
    return CM_OK;
}

int kern_optim_step(struct kern_optim *o, struct kern_model *m, float *grad_norm, float *lr_out)
{
    return step_with(o, m, NULL, grad_norm, lr_out);
}

int kern_optim_step_norm(struct kern_optim *o, struct kern_model *m, double norm, float *lr_out)
{
    return step_with(o, m, &norm, NULL, lr_out);
}

void kern_optim_mem_need(const struct kern_optim_config *c, size_t nparams,
                         struct kern_mem_need *n)
{
    n->optim = (c->kind == KERN_OPT_LAMB ? 3 : 2) * nparams * sizeof(float);
}
