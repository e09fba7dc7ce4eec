/* The MLP classifier: inputs (B,in) -> [Linear -> ReLU] x nhidden -> Linear
 * -> softmax cross-entropy. Fashion-MNIST's model (784-256-128-10, or the
 * published 256-128-100 baseline the design map cites). Parameters follow
 * PyTorch nn.Linear: weight (out,in) then bias (out) per layer, initialized
 * U(-1/sqrt(in), 1/sqrt(in)) like PyTorch's default, in one flat buffer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_internal.h"
#include "kern_model.h"

#define MLP_MAXL (KERN_MLP_MAX_HIDDEN + 1)

struct mlp {
    int nl;                 /* linear layers */
    int width[MLP_MAXL + 1]; /* width[0] = in, width[nl] = classes */
    size_t w_off[MLP_MAXL], b_off[MLP_MAXL];
    /* activations, device: x (B,in); z[l] (B,width[l+1]) pre-activation;
     * a[l] = relu(z[l-1]) (B,width[l]) for l >= 1 */
    float *x, *z[MLP_MAXL], *a[MLP_MAXL];
    float *dz, *da;         /* scratch (B, max width) */
    float *losses, *probs;
    int *targets;
    int maxw;
};

void kern_mlp_mem_need(const struct kern_mlp_config *c, int max_batch, struct kern_mem_need *n)
{
    /* as kern_mlp_new: x, z[l] for every layer, a[l] for the hidden ones,
     * dz and da of the widest layer, losses, probs, targets */
    size_t B = (size_t)max_batch, np = kern_mlp_param_count(c), act = 0, maxw = (size_t)c->in_dim;
    int prev = c->in_dim;
    act += B * (size_t)c->in_dim;
    for (int i = 0; i <= c->nhidden; i++) {
        int w = i < c->nhidden ? c->hidden[i] : c->nclass;
        act += B * (size_t)w;              /* z */
        if (i > 0)
            act += B * (size_t)prev;       /* a */
        if ((size_t)w > maxw)
            maxw = (size_t)w;
        prev = w;
    }
    act += 2 * B * maxw + B + B * (size_t)c->nclass;
    memset(n, 0, sizeof *n);
    n->params = n->grads = np * sizeof(float);
    n->act = act * sizeof(float) + B * sizeof(int);
    n->scratch = (np / KERN_SUMSQ_BLOCK + 2) * sizeof(double) + sizeof(int);
    n->reserve = KERN_GPU_RESERVE;
}

static void mlp_destroy(struct kern_model *m)
{
    struct mlp *p = m->impl;
    if (!p)
        return;
    const struct kern_backend *be = m->be;
    be->release(p->x);
    for (int l = 0; l < p->nl; l++) {
        be->release(p->z[l]);
        be->release(p->a[l]);
    }
    be->release(p->dz);
    be->release(p->da);
    be->release(p->losses);
    be->release(p->probs);
    be->release(p->targets);
    free(p);
    m->impl = NULL;
}

static int mlp_run(struct kern_model *m, const struct kern_batch *b, int backward,
                   float grad_scale, struct kern_eval *ev)
{
    struct mlp *p = m->impl;
    const struct kern_backend *be = m->be;
    int B = b->B, V = m->nclass;
    if (B < 1 || B > m->max_batch || !b->x || !b->targets)
        return CM_EINVAL;
    int count = 0;
    for (int i = 0; i < B; i++) {
        if (b->targets[i] >= V)
            return CM_EINVAL;
        count += b->targets[i] >= 0;
    }
    int rc;
    if ((rc = be->upload(p->x, b->x, sizeof(float) * (size_t)B * m->in_dim)) ||
        (rc = be->upload(p->targets, b->targets, sizeof(int) * (size_t)B)))
        return rc;
    /* forward: z[l] (B,width[l+1]) = in (B,width[l]) @ W_l^T + b_l */
    for (int l = 0; l < p->nl; l++) {
        const float *in = l == 0 ? p->x : p->a[l];
        be->matmul_fwd(p->z[l], in, m->params + p->w_off[l], m->params + p->b_off[l], B,
                       p->width[l], p->width[l + 1]);
        if (l + 1 < p->nl)
            be->relu_fwd(p->a[l + 1], p->z[l], (size_t)B * p->width[l + 1]);
    }
    be->xent_fwd(p->losses, p->probs, p->z[p->nl - 1], p->targets, B, V);
    if ((rc = kern__score(be, p->losses, p->probs, b->targets, B, V, ev)))
        return rc;
    if (!backward || count == 0)
        return CM_OK;
    /* backward: dz holds d loss / d z[l], da d loss / d a[l] */
    be->fill(p->dz, 0.0f, (size_t)B * V);
    be->xent_bwd(p->dz, p->probs, p->targets, grad_scale / count, B, V);
    for (int l = p->nl - 1; l >= 0; l--) {
        const float *in = l == 0 ? p->x : p->a[l];
        float *dgrad_in = NULL;
        if (l > 0) {
            be->fill(p->da, 0.0f, (size_t)B * p->width[l]);
            dgrad_in = p->da;
        }
        be->matmul_bwd(dgrad_in, m->grads + p->w_off[l], m->grads + p->b_off[l], p->dz, in,
                       m->params + p->w_off[l], B, p->width[l], p->width[l + 1]);
        if (l > 0) {
            be->fill(p->dz, 0.0f, (size_t)B * p->width[l]);
            be->relu_bwd(p->dz, p->z[l - 1], p->da, (size_t)B * p->width[l]);
        }
    }
    return CM_OK;
}

static const struct kern_model_ops MLP_OPS = {mlp_run, mlp_destroy};

int kern_mlp_new(const struct kern_backend *be, const struct kern_mlp_config *c, int max_batch,
                 uint64_t seed, struct kern_model **out)
{
    const char *why;
    if (!be || !c || !out || max_batch < 1 || max_batch > (1 << 20))
        return CM_EINVAL;
    if (kern_mlp_config_check(c, &why))
        return CM_EINVAL;
    struct kern_model *m = calloc(1, sizeof *m);
    struct mlp *p = calloc(1, sizeof *p);
    struct kern__tensor_list tl = {0};
    float *host = NULL;
    int rc = CM_ENOMEM;
    if (!m || !p)
        goto fail;
    m->ops = &MLP_OPS;
    m->be = be;
    m->kind = KERN_MODEL_MLP;
    m->impl = p;
    m->max_batch = max_batch;
    m->in_dim = c->in_dim;
    m->nclass = c->nclass;
    p->nl = c->nhidden + 1;
    p->width[0] = c->in_dim;
    for (int i = 0; i < c->nhidden; i++)
        p->width[i + 1] = c->hidden[i];
    p->width[p->nl] = c->nclass;
    p->maxw = 0;
    for (int l = 0; l <= p->nl; l++)
        if (p->width[l] > p->maxw)
            p->maxw = p->width[l];
    for (int l = 0; l < p->nl; l++) {
        char name[KERN_TENSOR_NAME_MAX];
        snprintf(name, sizeof name, "layers.%d.weight", l);
        if ((rc = kern__tensor_add(&tl, name, 1, &p->w_off[l], 2, p->width[l + 1], p->width[l], 0,
                                   0)))
            goto fail;
        snprintf(name, sizeof name, "layers.%d.bias", l);
        if ((rc = kern__tensor_add(&tl, name, 0, &p->b_off[l], 1, p->width[l + 1], 0, 0, 0)))
            goto fail;
    }
    if ((rc = kern__model_alloc(m, &tl)))
        goto fail;
    host = malloc(sizeof(float) * m->nparams);
    if (!host) {
        rc = CM_ENOMEM;
        goto fail;
    }
    uint64_t rng = seed;
    for (int l = 0; l < p->nl; l++) {
        float a = 1.0f / sqrtf((float)p->width[l]);
        kern__init_uniform(host + p->w_off[l], (size_t)p->width[l + 1] * p->width[l], a, &rng);
        kern__init_uniform(host + p->b_off[l], (size_t)p->width[l + 1], a, &rng);
    }
    if ((rc = kern_model_set_params(m, host)))
        goto fail;
    free(host);
    host = NULL;
    int err = 0;
    size_t Bn = (size_t)max_batch;
    p->x = kern__alloc_f(be, Bn * c->in_dim, &err);
    for (int l = 0; l < p->nl; l++) {
        p->z[l] = kern__alloc_f(be, Bn * p->width[l + 1], &err);
        if (l > 0)
            p->a[l] = kern__alloc_f(be, Bn * p->width[l], &err);
    }
    p->dz = kern__alloc_f(be, Bn * p->maxw, &err);
    p->da = kern__alloc_f(be, Bn * p->maxw, &err);
    p->losses = kern__alloc_f(be, Bn, &err);
    p->probs = kern__alloc_f(be, Bn * c->nclass, &err);
    p->targets = kern__alloc_i(be, Bn, &err);
    if ((rc = err))
        goto fail;
    *out = m;
    return CM_OK;
fail:
    free(host);
    free(tl.v);
    if (m)
        kern_model_free(m);
    else
        free(p);
    return rc;
}
