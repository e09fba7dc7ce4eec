/* The feed-forward expert block (see kern_expert.h). Parameters live in a
 * kern_model shell so optimizers, checkpoints and averaging handle an expert
 * like any other model: one flat parameter buffer, one flat gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_expert.h"
#include "kern_internal.h"

struct kern_expert {
    struct kern_model *m;  /* owned: params, grads, tensor table */
    int C, F, max_N;
    size_t lnw, lnb, w1, b1, w2, b2;
    float *x, *ln, *mean, *rstd, *h, *hg, *y;     /* (N,C) (N,C) (N) (N) (N,F) (N,F) (N,C) */
    float *dy, *dhg, *dh, *dln, *dx;
};

static int no_run(struct kern_model *m, const struct kern_batch *b, int backward, float gs,
                  struct kern_eval *ev)
{
    (void)m, (void)b, (void)backward, (void)gs, (void)ev;
    return CM_EUNSUPPORTED; /* an expert has no loss; use kern_expert_forward/backward */
}

static void no_destroy(struct kern_model *m) { (void)m; }

static const struct kern_model_ops EXPERT_OPS = {no_run, no_destroy};

void kern_expert_free(struct kern_expert *e)
{
    if (!e)
        return;
    if (e->m) {
        const struct kern_backend *be = e->m->be;
        float *bufs[] = {e->x, e->ln, e->mean, e->rstd, e->h, e->hg, e->y,
                         e->dy, e->dhg, e->dh, e->dln, e->dx};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            be->release(bufs[i]);
        kern_model_free(e->m);
    }
    free(e);
}

int kern_expert_new(const struct kern_backend *be, int C, int F, int max_N, uint64_t seed,
                    struct kern_expert **out)
{
    if (!be || !out || C < 1 || C > KERN_MAX_DIM || F < 1 || F > KERN_MAX_DIM || max_N < 1 ||
        max_N > (1 << 20))
        return CM_EINVAL;
    struct kern_expert *e = calloc(1, sizeof *e);
    struct kern__tensor_list tl = {0};
    float *host = NULL;
    int rc = CM_ENOMEM;
    if (!e || !(e->m = calloc(1, sizeof *e->m)))
        goto fail;
    e->C = C;
    e->F = F;
    e->max_N = max_N;
    e->m->ops = &EXPERT_OPS;
    e->m->be = be;
    e->m->kind = KERN_MODEL_MLP;
    e->m->max_batch = max_N;
    e->m->in_dim = C;
    if ((rc = kern__tensor_add(&tl, "ln.weight", 0, &e->lnw, 1, C, 0, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "ln.bias", 0, &e->lnb, 1, C, 0, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "fc1.weight", 1, &e->w1, 2, F, C, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "fc1.bias", 0, &e->b1, 1, F, 0, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "fc2.weight", 1, &e->w2, 2, C, F, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "fc2.bias", 0, &e->b2, 1, C, 0, 0, 0)) ||
        (rc = kern__model_alloc(e->m, &tl)))
        goto fail;
    host = calloc(e->m->nparams, sizeof(float));
    if (!host) {
        rc = CM_ENOMEM;
        goto fail;
    }
    uint64_t rng = seed;
    for (int c = 0; c < C; c++)
        host[e->lnw + c] = 1.0f;
    kern__init_uniform(host + e->w1, (size_t)F * C, 1.0f / sqrtf((float)C), &rng);
    kern__init_uniform(host + e->w2, (size_t)C * F, 1.0f / sqrtf((float)F), &rng);
    if ((rc = kern_model_set_params(e->m, host)))
        goto fail;
    free(host);
    host = NULL;
    int err = 0;
    size_t N = (size_t)max_N;
    e->x = kern__alloc_f(be, N * C, &err);
    e->ln = kern__alloc_f(be, N * C, &err);
    e->mean = kern__alloc_f(be, N, &err);
    e->rstd = kern__alloc_f(be, N, &err);
    e->h = kern__alloc_f(be, N * F, &err);
    e->hg = kern__alloc_f(be, N * F, &err);
    e->y = kern__alloc_f(be, N * C, &err);
    e->dy = kern__alloc_f(be, N * C, &err);
    e->dhg = kern__alloc_f(be, N * F, &err);
    e->dh = kern__alloc_f(be, N * F, &err);
    e->dln = kern__alloc_f(be, N * C, &err);
    e->dx = kern__alloc_f(be, N * C, &err);
    if ((rc = err))
        goto fail;
    *out = e;
    return CM_OK;
fail:
    free(host);
    free(tl.v);
    kern_expert_free(e);
    return rc;
}

static int all_finite_host(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Uploads x and runs the forward into e->y (device). */
static int fwd(struct kern_expert *e, const float *x, int N)
{
    const struct kern_backend *be = e->m->be;
    const float *P = e->m->params;
    size_t n = (size_t)N * e->C;
    if (N < 1 || N > e->max_N || !x || !all_finite_host(x, n))
        return CM_EINVAL;
    int rc = be->upload(e->x, x, n * sizeof(float));
    if (rc)
        return rc;
    be->layernorm_fwd(e->ln, e->mean, e->rstd, e->x, P + e->lnw, P + e->lnb, N, e->C);
    be->matmul_fwd(e->h, e->ln, P + e->w1, P + e->b1, N, e->C, e->F);
    be->gelu_fwd(e->hg, e->h, (size_t)N * e->F);
    be->matmul_fwd(e->y, e->hg, P + e->w2, P + e->b2, N, e->F, e->C);
    be->add(e->y, e->y, e->x, n);
    return CM_OK;
}

int kern_expert_forward(struct kern_expert *e, const float *x, int N, float *y)
{
    if (!e || !y)
        return CM_EINVAL;
    int rc = fwd(e, x, N);
    if (rc)
        return rc;
    return e->m->be->download(y, e->y, (size_t)N * e->C * sizeof(float));
}

int kern_expert_backward(struct kern_expert *e, const float *x, const float *dy, int N, float *dx)
{
    if (!e || !dy || !dx)
        return CM_EINVAL;
    size_t n = (size_t)N * e->C, nf = (size_t)N * e->F;
    int rc = fwd(e, x, N);
    if (rc)
        return rc;
    if (!all_finite_host(dy, n))
        return CM_EINVAL;
    const struct kern_backend *be = e->m->be;
    const float *P = e->m->params;
    float *G = e->m->grads;
    if ((rc = be->upload(e->dy, dy, n * sizeof(float))))
        return rc;
    /* residual: dx starts as dy */
    if ((rc = be->copy(e->dx, e->dy, n * sizeof(float))))
        return rc;
    be->fill(e->dhg, 0.0f, nf);
    be->matmul_bwd(e->dhg, G + e->w2, G + e->b2, e->dy, e->hg, P + e->w2, N, e->F, e->C);
    be->fill(e->dh, 0.0f, nf);
    be->gelu_bwd(e->dh, e->h, e->dhg, nf);
    be->fill(e->dln, 0.0f, n);
    be->matmul_bwd(e->dln, G + e->w1, G + e->b1, e->dh, e->ln, P + e->w1, N, e->C, e->F);
    be->layernorm_bwd(e->dx, G + e->lnw, G + e->lnb, e->dln, e->x, P + e->lnw, e->mean, e->rstd,
                      N, e->C);
    return be->download(dx, e->dx, n * sizeof(float));
}

struct kern_model *kern_expert_model(struct kern_expert *e) { return e ? e->m : NULL; }
