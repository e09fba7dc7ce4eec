/* The model-independent half of kern_model.h: the generic entry points that
 * dispatch to a model kind, the named-tensor table, parameter transfer,
 * deterministic random numbers and masked-LM corruption. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_internal.h"
#include "kern_model.h"

uint64_t kern_rng_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* splitmix64 adds the same constant to its state on every draw, so skipping
 * n draws is one multiply-add (mod 2^64) and yields the state the n draws
 * would have left. */
void kern__rng_skip(uint64_t *s, uint64_t n) { *s += n * 0x9e3779b97f4a7c15ULL; }

float kern_rng_uniform(uint64_t *s) { return (float)(kern_rng_u64(s) >> 40) / 16777216.0f; }

float kern_rng_normal(uint64_t *s)
{
    float u1 = kern_rng_uniform(s), u2 = kern_rng_uniform(s);
    if (u1 < 1e-7f)
        u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

void kern__init_normal(float *x, size_t n, float std, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = std * kern_rng_normal(rng);
}

void kern__init_uniform(float *x, size_t n, float a, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = a * (2.0f * kern_rng_uniform(rng) - 1.0f);
}

int kern__tensor_add(struct kern__tensor_list *l, const char *name, int decay, size_t *off,
                     int ndim, int d0, int d1, int d2, int d3)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        struct kern_tensor *v = realloc(l->v, sizeof *v * cap);
        if (!v)
            return CM_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    struct kern_tensor *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    int d[4] = {d0, d1, d2, d3};
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = d[i];
        t->numel *= (size_t)d[i];
    }
    t->decay = decay;
    t->off = l->total;
    l->total += t->numel;
    if (off)
        *off = t->off;
    return CM_OK;
}

int kern__model_alloc(struct kern_model *m, struct kern__tensor_list *l)
{
    if (l->total == 0 || l->total > KERN_MAX_PARAMS)
        return CM_ERANGE;
    int rc = m->be->alloc(l->total * sizeof(float), (void **)&m->params);
    if (rc)
        return rc;
    rc = m->be->alloc(l->total * sizeof(float), (void **)&m->grads);
    if (rc)
        return rc;
    m->nparams = l->total;
    m->tensors = l->v;
    m->ntensors = l->n;
    l->v = NULL;
    l->n = l->cap = 0;
    return CM_OK;
}

float *kern__alloc_f(const struct kern_backend *be, size_t n, int *err)
{
    void *p = NULL;
    if (*err)
        return NULL;
    int rc = be->alloc((n ? n : 1) * sizeof(float), &p);
    if (rc)
        *err = rc;
    return p;
}

int *kern__alloc_i(const struct kern_backend *be, size_t n, int *err)
{
    void *p = NULL;
    if (*err)
        return NULL;
    int rc = be->alloc((n ? n : 1) * sizeof(int), &p);
    if (rc)
        *err = rc;
    return p;
}

int kern__score(const struct kern_backend *be, const float *losses_dev, const float *probs_dev,
                const int *targets, int N, int V, struct kern_eval *ev)
{
    float *l = malloc(sizeof(float) * (size_t)N);
    float *p = probs_dev ? malloc(sizeof(float) * (size_t)N * V) : NULL;
    int rc = CM_OK;
    if (!l || (probs_dev && !p)) {
        rc = CM_ENOMEM;
        goto out;
    }
    if ((rc = be->download(l, losses_dev, sizeof(float) * (size_t)N)))
        goto out;
    if (p && (rc = be->download(p, probs_dev, sizeof(float) * (size_t)N * V)))
        goto out;
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0)
            continue;
        ev->loss_sum += l[i];
        ev->count++;
        if (p) {
            const float *r = p + (size_t)i * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (r[v] > r[best])
                    best = v;
            ev->correct += best == targets[i];
        }
    }
out:
    free(l);
    free(p);
    return rc;
}

void kern_model_zero_grad(struct kern_model *m) { m->be->fill(m->grads, 0.0f, m->nparams); }

int kern_model_fwd_bwd(struct kern_model *m, const struct kern_batch *b, float grad_scale,
                       struct kern_eval *ev)
{
    struct kern_eval tmp = {0};
    if (!m || !b)
        return CM_EINVAL;
    return m->ops->run(m, b, 1, grad_scale, ev ? ev : &tmp);
}

int kern_model_eval(struct kern_model *m, const struct kern_batch *b, struct kern_eval *ev)
{
    struct kern_eval tmp = {0};
    if (!m || !b)
        return CM_EINVAL;
    return m->ops->run(m, b, 0, 0.0f, ev ? ev : &tmp);
}

int kern_model_get_params(const struct kern_model *m, float *host)
{
    return m->be->download(host, m->params, m->nparams * sizeof(float));
}

int kern_model_set_params(struct kern_model *m, const float *host)
{
    return m->be->upload(m->params, host, m->nparams * sizeof(float));
}

int kern_model_get_grads(const struct kern_model *m, float *host)
{
    return m->be->download(host, m->grads, m->nparams * sizeof(float));
}

const struct kern_tensor *kern_model_tensor(const struct kern_model *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

void kern_model_free(struct kern_model *m)
{
    if (!m)
        return;
    if (m->ops && m->ops->destroy)
        m->ops->destroy(m);
    m->be->release(m->params);
    m->be->release(m->grads);
    free(m->tensors);
    free(m);
}

void kern_mlm_mask(int *tokens, int *targets, size_t n, float p, int mask_id, int vocab_real,
                   uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        if (kern_rng_uniform(rng) >= p) {
            targets[i] = -1;
            continue;
        }
        targets[i] = tokens[i];
        float r = kern_rng_uniform(rng);
        if (r < 0.8f)
            tokens[i] = mask_id;
        else if (r < 0.9f)
            tokens[i] = (int)(kern_rng_u64(rng) % (uint64_t)vocab_real);
    }
}
