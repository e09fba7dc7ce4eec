/* The DMoE classifier (see kern_dmoe.h): trunk, gating heads and head run
 * on the backend with the usual ops; the mixture itself (routing, the
 * softmax over the experts that answered, the weighted sum, and their
 * backward) runs on the host, because expert inputs and outputs are host
 * memory anyway (they travel over the network) and the per-sample work is
 * k dot products of width C. So the layer needs no op of its own and runs
 * on every backend.
 *
 * Shapes: B samples, C trunk width, d grid dimensions of M cells, DM = d*M
 * gate outputs, k slots per sample, V classes, R <= B*k routed rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_dmoe.h"
#include "kern_internal.h"

#define NT KERN_DMOE_MAX_TRUNK

struct route_ent {
    uint64_t flat; /* sum_i u_i M^i */
    int pair;      /* b * k + slot */
};

struct dmoe {
    struct kern_dmoe_config c;
    struct kern_dmoe_experts ex;
    int nl, C, DM, maxw;
    int width[NT + 1];            /* width[0] = in, width[nl] = C */
    size_t w_off[NT], b_off[NT], gw, gb, hw, hb;
    int input_grad;               /* compute dL/dx into dxin */
    /* device: x (B,in); z[l] (B,width[l+1]) pre-activation; a[l] (B,width[l]) =
     * relu(z[l-1]) for 1 <= l < nl; h (B,C) = relu(z[nl-1]); s (B,DM); mix (B,C);
     * logits, probs (B,V); losses (B); dz, da (B,maxw); ghead (V*C + V) */
    float *x, *z[NT], *a[NT], *h, *s, *mix, *logits, *losses, *probs;
    int *targets;
    float *dlogits, *dmix, *ds, *dh, *dz, *da, *ghead, *dxin;
    /* host */
    float *h_h, *s_h, *mix_h, *dmix_h, *ds_h, *dh_h; /* (B,C) (B,DM) (B,C) (B,C) (B,DM) (B,C) */
    int *uids;                    /* (B,k,d) from select */
    int *r_uid, *r_start, *r_pair; /* (B*k,d) (B*k+1) (B*k): the route's arrays */
    int *row_of;                  /* (B*k): row of a pair, -1 = empty slot */
    int *exp_of;                  /* (B*k): expert of a row */
    struct route_ent *ents;       /* (B*k) */
    float *xin, *yout, *dy, *dx;  /* (B*k, C) */
    float *w;                     /* (B*k): mixture weight of a pair, 0 = left out */
    uint8_t *okf, *okb;           /* (B*k): per expert */
    struct kern_dmoe_stats st;
};

static int maxw_of(const struct kern_dmoe_config *c)
{
    int w = c->in_dim;
    for (int i = 0; i < c->ntrunk; i++)
        if (c->trunk[i] > w)
            w = c->trunk[i];
    return w;
}

void kern_dmoe_mem_need(const struct kern_dmoe_config *c, int max_batch, struct kern_mem_need *n)
{
    /* as kern_dmoe_new's device buffers */
    size_t B = (size_t)max_batch, np = kern_dmoe_param_count(c), act = 0;
    size_t C = (size_t)c->trunk[c->ntrunk - 1], DM = (size_t)c->grid_d * c->grid_m;
    size_t V = (size_t)c->nclass, in = (size_t)c->in_dim;
    act += B * in * 2;                                    /* x, dxin */
    for (int l = 0; l < c->ntrunk; l++) {
        act += B * (size_t)c->trunk[l];                   /* z */
        if (l > 0)
            act += B * (size_t)c->trunk[l - 1];           /* a */
    }
    act += B * C * 4 + B * DM * 2;                        /* h, mix, dmix, dh; s, ds */
    act += B * V * 3 + B;                                 /* logits, probs, dlogits; losses */
    act += 2 * B * (size_t)maxw_of(c) + V * C + V;        /* dz, da; ghead */
    memset(n, 0, sizeof *n);
    n->params = n->grads = np * sizeof(float);
    n->act = act * sizeof(float) + B * sizeof(int);
    n->scratch = (np / KERN_SUMSQ_BLOCK + 2) * sizeof(double) + sizeof(int);
    n->reserve = KERN_GPU_RESERVE;
}

static void dmoe_destroy(struct kern_model *m)
{
    struct dmoe *p = m->impl;
    if (!p)
        return;
    const struct kern_backend *be = m->be;
    for (int l = 0; l < NT; l++) {
        be->release(p->z[l]);
        be->release(p->a[l]);
    }
    float *dev[] = {p->x, p->h, p->s, p->mix, p->logits, p->losses, p->probs, p->dlogits,
                    p->dmix, p->ds, p->dh, p->dz, p->da, p->ghead, p->dxin};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->release(dev[i]);
    be->release(p->targets);
    void *host[] = {p->h_h, p->s_h, p->mix_h, p->dmix_h, p->ds_h, p->dh_h, p->uids, p->r_uid,
                    p->r_start, p->r_pair, p->row_of, p->exp_of, p->ents, p->xin, p->yout,
                    p->dy, p->dx, p->w, p->okf, p->okb};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    free(p);
    m->impl = NULL;
}

static int ent_cmp(const void *a, const void *b)
{
    const struct route_ent *x = a, *y = b;
    if (x->flat != y->flat)
        return x->flat < y->flat ? -1 : 1;
    return x->pair - y->pair;
}

/* Checks select's uids (B,k,d) and groups the chosen (sample, slot) pairs by
 * expert into the route. CM_EINVAL for a coordinate off the grid or an
 * expert chosen twice for one sample. */
static int route_build(struct dmoe *p, int B, struct kern_dmoe_route *r)
{
    int k = p->c.k, d = p->c.grid_d, M = p->c.grid_m, n = 0;
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < k; j++) {
            int pr = b * k + j;
            const int *u = p->uids + (size_t)pr * d;
            p->row_of[pr] = -1;
            if (u[0] == -1)
                continue;
            uint64_t flat = 0, mul = 1;
            for (int i = 0; i < d; i++) {
                if (u[i] < 0 || u[i] >= M)
                    return CM_EINVAL;
                flat += (uint64_t)u[i] * mul;
                mul *= (uint64_t)M;
            }
            for (int q = n - 1; q >= 0 && p->ents[q].pair >= b * k; q--)
                if (p->ents[q].flat == flat)
                    return CM_EINVAL;
            p->ents[n].flat = flat;
            p->ents[n].pair = pr;
            n++;
        }
    }
    qsort(p->ents, (size_t)n, sizeof *p->ents, ent_cmp);
    int ne = 0;
    for (int i = 0; i < n; i++) {
        int pr = p->ents[i].pair;
        if (i == 0 || p->ents[i].flat != p->ents[i - 1].flat) {
            p->r_start[ne] = i;
            memcpy(p->r_uid + (size_t)ne * d, p->uids + (size_t)pr * d, sizeof(int) * d);
            ne++;
        }
        p->exp_of[i] = ne - 1;
        p->r_pair[i] = pr;
        p->row_of[pr] = i;
    }
    p->r_start[ne] = n;
    memset(r, 0, sizeof *r);
    r->B = B;
    r->k = k;
    r->d = d;
    r->C = p->C;
    r->nexp = ne;
    r->nrows = n;
    r->uid = p->r_uid;
    r->start = p->r_start;
    r->pair = p->r_pair;
    return CM_OK;
}

static int finite_rows(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* An expert whose answer holds a NaN or Inf counts as failed: its numbers
 * must never reach the mixture or the gradients. */
static void drop_nonfinite(struct dmoe *p, const struct kern_dmoe_route *r, const float *buf,
                           uint8_t *ok)
{
    for (int e = 0; e < r->nexp; e++) {
        size_t n = (size_t)(r->start[e + 1] - r->start[e]) * p->C;
        if (ok[e] && !finite_rows(buf + (size_t)r->start[e] * p->C, n)) {
            ok[e] = 0;
            p->st.nonfinite++;
        }
    }
}

/* The mixture, seed 002 §3.1-3.2: for sample b the answered slots j get
 * g_j = sum_i s[b][i][u_ij] and w = softmax(g) over them only (renormalised
 * over the experts that answered, §3.2); mix_b = sum_j w_j y_j, or h_b when
 * none answered. */
static void mix_forward(struct dmoe *p, int B)
{
    int k = p->c.k, d = p->c.grid_d, M = p->c.grid_m, C = p->C;
    for (int b = 0; b < B; b++) {
        float g[KERN_DMOE_MAX_K], gmax = -INFINITY;
        int na = 0;
        for (int j = 0; j < k; j++) {
            int pr = b * k + j, row = p->row_of[pr];
            p->w[pr] = 0.0f;
            g[j] = -INFINITY;
            if (row < 0 || !p->okf[p->exp_of[row]])
                continue;
            const int *u = p->uids + (size_t)pr * d;
            float sum = 0.0f;
            for (int i = 0; i < d; i++)
                sum += p->s_h[(size_t)b * p->DM + (size_t)i * M + u[i]];
            g[j] = sum;
            if (sum > gmax)
                gmax = sum;
            na++;
        }
        float *zb = p->mix_h + (size_t)b * C;
        if (na == 0) {
            memcpy(zb, p->h_h + (size_t)b * C, sizeof(float) * C);
            p->st.empty++;
            continue;
        }
        double den = 0.0;
        for (int j = 0; j < k; j++)
            if (g[j] != -INFINITY)
                den += exp((double)(g[j] - gmax));
        memset(zb, 0, sizeof(float) * C);
        for (int j = 0; j < k; j++) {
            if (g[j] == -INFINITY)
                continue;
            int pr = b * k + j;
            float wj = (float)(exp((double)(g[j] - gmax)) / den);
            p->w[pr] = wj;
            const float *y = p->yout + (size_t)p->row_of[pr] * C;
            for (int c = 0; c < C; c++)
                zb[c] += wj * y[c];
        }
    }
}

/* Backward of the mixture given dmix (B,C): dy rows (to the experts) =
 * w_j dmix_b; ds (the gating heads' outputs) gets dL/dg_j =
 * w_j (dmix_b . y_j - sum_l w_l dmix_b . y_l) at each of its d cells; dh
 * gets dmix_b for samples that passed through. */
static void mix_backward(struct dmoe *p, int B)
{
    int k = p->c.k, d = p->c.grid_d, M = p->c.grid_m, C = p->C;
    memset(p->ds_h, 0, sizeof(float) * (size_t)B * p->DM);
    memset(p->dh_h, 0, sizeof(float) * (size_t)B * C);
    for (int b = 0; b < B; b++) {
        const float *dzb = p->dmix_h + (size_t)b * C;
        float dw[KERN_DMOE_MAX_K];
        double mean = 0.0;
        int na = 0;
        for (int j = 0; j < k; j++) {
            int pr = b * k + j, row = p->row_of[pr];
            dw[j] = 0.0f;
            if (row < 0 || !p->okf[p->exp_of[row]])
                continue;
            const float *y = p->yout + (size_t)row * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++)
                dot += (double)dzb[c] * y[c];
            dw[j] = (float)dot;
            mean += (double)p->w[pr] * dot;
            na++;
        }
        if (na == 0) {
            memcpy(p->dh_h + (size_t)b * C, dzb, sizeof(float) * C);
            continue;
        }
        for (int j = 0; j < k; j++) {
            int pr = b * k + j, row = p->row_of[pr];
            if (row < 0 || !p->okf[p->exp_of[row]])
                continue;
            float wj = p->w[pr], dg = (float)(wj * (dw[j] - mean));
            const int *u = p->uids + (size_t)pr * d;
            for (int i = 0; i < d; i++)
                p->ds_h[(size_t)b * p->DM + (size_t)i * M + u[i]] += dg;
            float *dy = p->dy + (size_t)row * C;
            for (int c = 0; c < C; c++)
                dy[c] = wj * dzb[c];
        }
    }
}

static int dmoe_run(struct kern_model *m, const struct kern_batch *b, int backward,
                    float grad_scale, struct kern_eval *ev)
{
    struct dmoe *p = m->impl;
    const struct kern_backend *be = m->be;
    const float *P = m->params;
    float *G = m->grads;
    int B = b->B, V = m->nclass, C = p->C, DM = p->DM, rc;
    if (B < 1 || B > m->max_batch || !b->x || !b->targets)
        return CM_EINVAL;
    int count = 0;
    for (int i = 0; i < B; i++) {
        if (b->targets[i] >= V)
            return CM_EINVAL;
        count += b->targets[i] >= 0;
    }
    if ((rc = be->upload(p->x, b->x, sizeof(float) * (size_t)B * m->in_dim)) ||
        (rc = be->upload(p->targets, b->targets, sizeof(int) * (size_t)B)))
        return rc;
    /* trunk: z[l] (B,width[l+1]) = in (B,width[l]) @ W_l^T + b_l, then ReLU */
    for (int l = 0; l < p->nl; l++) {
        const float *in = l == 0 ? p->x : p->a[l];
        be->matmul_fwd(p->z[l], in, P + p->w_off[l], P + p->b_off[l], B, p->width[l],
                       p->width[l + 1]);
        be->relu_fwd(l + 1 < p->nl ? p->a[l + 1] : p->h, p->z[l], (size_t)B * p->width[l + 1]);
    }
    /* the d gating heads in one product: s (B, d*M), head i in columns
     * i*M .. i*M+M-1 (seed 002 §3.2) */
    be->matmul_fwd(p->s, p->h, P + p->gw, P + p->gb, B, C, DM);
    if ((rc = be->download(p->h_h, p->h, sizeof(float) * (size_t)B * C)) ||
        (rc = be->download(p->s_h, p->s, sizeof(float) * (size_t)B * DM)))
        return rc;
    if (!finite_rows(p->s_h, (size_t)B * DM))
        return CM_ENUMERIC;
    for (size_t i = 0; i < (size_t)B * p->c.k; i++)
        p->uids[i * p->c.grid_d] = -1;
    if ((rc = p->ex.select(p->ex.ctx, p->s_h, B, p->c.grid_d, p->c.grid_m, p->c.k, p->uids)))
        return rc;
    struct kern_dmoe_route r;
    if ((rc = route_build(p, B, &r)))
        return rc;
    for (int i = 0; i < r.nrows; i++)
        memcpy(p->xin + (size_t)i * C, p->h_h + (size_t)(r.pair[i] / r.k) * C,
               sizeof(float) * C);
    memset(p->okf, 0, (size_t)r.nexp);
    if (r.nexp && (rc = p->ex.forward(p->ex.ctx, &r, p->xin, p->yout, p->okf)))
        return rc;
    drop_nonfinite(p, &r, p->yout, p->okf);
    mix_forward(p, B);
    p->st.batches++;
    p->st.slots += r.nrows;
    p->st.calls_fwd += r.nexp;
    for (int e = 0; e < r.nexp; e++) {
        p->st.failed_fwd += !p->okf[e];
        if (p->okf[e])
            p->st.answered += r.start[e + 1] - r.start[e];
    }
    if ((rc = be->upload(p->mix, p->mix_h, sizeof(float) * (size_t)B * C)))
        return rc;
    be->matmul_fwd(p->logits, p->mix, P + p->hw, P + p->hb, B, C, V);
    be->xent_fwd(p->losses, p->probs, p->logits, p->targets, B, V);
    if ((rc = kern__score(be, p->losses, p->probs, b->targets, B, V, ev)))
        return rc;
    if (!backward || count == 0)
        return CM_OK;
    /* head: its gradient goes to scratch first and into G only once the
     * experts' backward has succeeded, so an aborted batch changes nothing */
    be->fill(p->dlogits, 0.0f, (size_t)B * V);
    be->xent_bwd(p->dlogits, p->probs, p->targets, grad_scale / count, B, V);
    be->fill(p->ghead, 0.0f, (size_t)V * C + V);
    be->fill(p->dmix, 0.0f, (size_t)B * C);
    be->matmul_bwd(p->dmix, p->ghead, p->ghead + (size_t)V * C, p->dlogits, p->mix, P + p->hw,
                   B, C, V);
    if ((rc = be->download(p->dmix_h, p->dmix, sizeof(float) * (size_t)B * C)))
        return rc;
    mix_backward(p, B);
    memcpy(p->okb, p->okf, (size_t)r.nexp);
    int nsend = 0;
    for (int e = 0; e < r.nexp; e++)
        nsend += p->okb[e];
    if (nsend && (rc = p->ex.backward(p->ex.ctx, &r, p->xin, p->dy, p->dx, p->okb)))
        return rc;
    for (int e = 0; e < r.nexp; e++)
        p->okb[e] = p->okb[e] && p->okf[e]; /* only experts that answered forward count */
    drop_nonfinite(p, &r, p->dx, p->okb);
    p->st.calls_bwd += nsend;
    for (int e = 0; e < r.nexp; e++) {
        if (!p->okf[e])
            continue;
        p->st.failed_bwd += !p->okb[e];
        if (!p->okb[e])
            continue;
        for (int i = r.start[e]; i < r.start[e + 1]; i++) {
            float *dhb = p->dh_h + (size_t)(r.pair[i] / r.k) * C;
            const float *dx = p->dx + (size_t)i * C;
            for (int c = 0; c < C; c++)
                dhb[c] += dx[c];
        }
    }
    if ((rc = be->upload(p->dh, p->dh_h, sizeof(float) * (size_t)B * C)) ||
        (rc = be->upload(p->ds, p->ds_h, sizeof(float) * (size_t)B * DM)))
        return rc;
    /* hw and hb are adjacent in the flat buffer, like ghead's two parts */
    be->axpy(G + p->hw, 1.0f, p->ghead, (size_t)V * C + V);
    /* gating heads: dh += ds @ Wg */
    be->matmul_bwd(p->dh, G + p->gw, G + p->gb, p->ds, p->h, P + p->gw, B, C, DM);
    /* trunk */
    be->fill(p->dz, 0.0f, (size_t)B * C);
    be->relu_bwd(p->dz, p->z[p->nl - 1], p->dh, (size_t)B * C);
    for (int l = p->nl - 1; l >= 0; l--) {
        const float *in = l == 0 ? p->x : p->a[l];
        float *dgrad_in = NULL;
        if (l > 0) {
            be->fill(p->da, 0.0f, (size_t)B * p->width[l]);
            dgrad_in = p->da;
        } else if (p->input_grad) {
            be->fill(p->dxin, 0.0f, (size_t)B * p->width[0]);
            dgrad_in = p->dxin;
        }
        be->matmul_bwd(dgrad_in, G + p->w_off[l], G + p->b_off[l], p->dz, in, P + p->w_off[l],
                       B, p->width[l], p->width[l + 1]);
        if (l > 0) {
            be->fill(p->dz, 0.0f, (size_t)B * p->width[l]);
            be->relu_bwd(p->dz, p->z[l - 1], p->da, (size_t)B * p->width[l]);
        }
    }
    return CM_OK;
}

static const struct kern_model_ops DMOE_OPS = {dmoe_run, dmoe_destroy};

int kern_dmoe_get_stats(const struct kern_model *m, struct kern_dmoe_stats *st)
{
    if (!m || !st || m->kind != KERN_MODEL_DMOE || !m->impl)
        return CM_EINVAL;
    *st = ((const struct dmoe *)m->impl)->st;
    return CM_OK;
}

int kern_dmoe_set_input_grad(struct kern_model *m, int on)
{
    if (!m || m->kind != KERN_MODEL_DMOE || !m->impl)
        return CM_EINVAL;
    ((struct dmoe *)m->impl)->input_grad = on != 0;
    return CM_OK;
}

int kern_dmoe_get_input_grad(const struct kern_model *m, int B, float *host)
{
    if (!m || !host || m->kind != KERN_MODEL_DMOE || !m->impl || B < 1 || B > m->max_batch)
        return CM_EINVAL;
    const struct dmoe *p = m->impl;
    if (!p->input_grad)
        return CM_ESTATE;
    return m->be->download(host, p->dxin, sizeof(float) * (size_t)B * m->in_dim);
}

static int alloc_host(struct dmoe *p, size_t B)
{
    size_t C = (size_t)p->C, DM = (size_t)p->DM, K = (size_t)p->c.k, d = (size_t)p->c.grid_d;
    size_t R = B * K;
    p->h_h = malloc(sizeof(float) * B * C);
    p->s_h = malloc(sizeof(float) * B * DM);
    p->mix_h = malloc(sizeof(float) * B * C);
    p->dmix_h = malloc(sizeof(float) * B * C);
    p->ds_h = malloc(sizeof(float) * B * DM);
    p->dh_h = malloc(sizeof(float) * B * C);
    p->uids = malloc(sizeof(int) * R * d);
    p->r_uid = malloc(sizeof(int) * R * d);
    p->r_start = malloc(sizeof(int) * (R + 1));
    p->r_pair = malloc(sizeof(int) * R);
    p->row_of = malloc(sizeof(int) * R);
    p->exp_of = malloc(sizeof(int) * R);
    p->ents = malloc(sizeof(struct route_ent) * R);
    p->xin = calloc(R * C, sizeof(float));
    p->yout = calloc(R * C, sizeof(float));
    p->dy = calloc(R * C, sizeof(float));
    p->dx = calloc(R * C, sizeof(float));
    p->w = calloc(R, sizeof(float));
    p->okf = calloc(R, 1);
    p->okb = calloc(R, 1);
    if (!p->h_h || !p->s_h || !p->mix_h || !p->dmix_h || !p->ds_h || !p->dh_h || !p->uids ||
        !p->r_uid || !p->r_start || !p->r_pair || !p->row_of || !p->exp_of || !p->ents ||
        !p->xin || !p->yout || !p->dy || !p->dx || !p->w || !p->okf || !p->okb)
        return CM_ENOMEM;
    return CM_OK;
}

int kern_dmoe_new(const struct kern_backend *be, const struct kern_dmoe_config *c, int max_batch,
                  uint64_t seed, const struct kern_dmoe_experts *ex, struct kern_model **out)
{
    const char *why;
    if (!be || !c || !ex || !ex->select || !ex->forward || !ex->backward || !out ||
        max_batch < 1 || max_batch > (1 << 16))
        return CM_EINVAL;
    if (kern_dmoe_config_check(c, &why))
        return CM_EINVAL;
    struct kern_model *m = calloc(1, sizeof *m);
    struct dmoe *p = calloc(1, sizeof *p);
    struct kern__tensor_list tl = {0};
    float *host = NULL;
    int rc = CM_ENOMEM;
    if (!m || !p)
        goto fail;
    m->ops = &DMOE_OPS;
    m->be = be;
    m->kind = KERN_MODEL_DMOE;
    m->impl = p;
    m->max_batch = max_batch;
    m->in_dim = c->in_dim;
    m->nclass = c->nclass;
    p->c = *c;
    p->ex = *ex;
    p->nl = c->ntrunk;
    p->width[0] = c->in_dim;
    for (int i = 0; i < c->ntrunk; i++)
        p->width[i + 1] = c->trunk[i];
    p->C = c->trunk[c->ntrunk - 1];
    p->DM = c->grid_d * c->grid_m;
    p->maxw = maxw_of(c);
    for (int l = 0; l < p->nl; l++) {
        char name[KERN_TENSOR_NAME_MAX];
        snprintf(name, sizeof name, "trunk.%d.weight", l);
        if ((rc = kern__tensor_add(&tl, name, 1, &p->w_off[l], 2, p->width[l + 1], p->width[l],
                                   0, 0)))
            goto fail;
        snprintf(name, sizeof name, "trunk.%d.bias", l);
        if ((rc = kern__tensor_add(&tl, name, 0, &p->b_off[l], 1, p->width[l + 1], 0, 0, 0)))
            goto fail;
    }
    if ((rc = kern__tensor_add(&tl, "gate.weight", 1, &p->gw, 2, p->DM, p->C, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "gate.bias", 0, &p->gb, 1, p->DM, 0, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "head.weight", 1, &p->hw, 2, c->nclass, p->C, 0, 0)) ||
        (rc = kern__tensor_add(&tl, "head.bias", 0, &p->hb, 1, c->nclass, 0, 0, 0)) ||
        (rc = kern__model_alloc(m, &tl)))
        goto fail;
    host = calloc(m->nparams, sizeof(float));
    if (!host) {
        rc = CM_ENOMEM;
        goto fail;
    }
    /* PyTorch nn.Linear's default U(-1/sqrt(in), 1/sqrt(in)); the gate's bias
     * starts at 0 so no expert is preferred before training */
    uint64_t rng = seed;
    for (int l = 0; l < p->nl; l++) {
        float a = 1.0f / sqrtf((float)p->width[l]);
        kern__init_uniform(host + p->w_off[l], (size_t)p->width[l + 1] * p->width[l], a, &rng);
        kern__init_uniform(host + p->b_off[l], (size_t)p->width[l + 1], a, &rng);
    }
    float a = 1.0f / sqrtf((float)p->C);
    kern__init_uniform(host + p->gw, (size_t)p->DM * p->C, a, &rng);
    kern__init_uniform(host + p->hw, (size_t)c->nclass * p->C, a, &rng);
    kern__init_uniform(host + p->hb, (size_t)c->nclass, a, &rng);
    if ((rc = kern_model_set_params(m, host)))
        goto fail;
    free(host);
    host = NULL;
    int err = 0;
    size_t Bn = (size_t)max_batch, C = (size_t)p->C, DM = (size_t)p->DM, V = (size_t)c->nclass;
    p->x = kern__alloc_f(be, Bn * c->in_dim, &err);
    p->dxin = kern__alloc_f(be, Bn * c->in_dim, &err);
    for (int l = 0; l < p->nl; l++) {
        p->z[l] = kern__alloc_f(be, Bn * p->width[l + 1], &err);
        if (l > 0)
            p->a[l] = kern__alloc_f(be, Bn * p->width[l], &err);
    }
    p->h = kern__alloc_f(be, Bn * C, &err);
    p->mix = kern__alloc_f(be, Bn * C, &err);
    p->dmix = kern__alloc_f(be, Bn * C, &err);
    p->dh = kern__alloc_f(be, Bn * C, &err);
    p->s = kern__alloc_f(be, Bn * DM, &err);
    p->ds = kern__alloc_f(be, Bn * DM, &err);
    p->logits = kern__alloc_f(be, Bn * V, &err);
    p->probs = kern__alloc_f(be, Bn * V, &err);
    p->dlogits = kern__alloc_f(be, Bn * V, &err);
    p->losses = kern__alloc_f(be, Bn, &err);
    p->dz = kern__alloc_f(be, Bn * p->maxw, &err);
    p->da = kern__alloc_f(be, Bn * p->maxw, &err);
    p->ghead = kern__alloc_f(be, V * C + V, &err);
    p->targets = kern__alloc_i(be, Bn, &err);
    if ((rc = err) || (rc = alloc_host(p, Bn)))
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
