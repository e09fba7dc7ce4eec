/* Local experts for the DMoE model (kern_dmoe.h): every cell of the grid
 * holds a kern_expert and its own optimizer in this process. It plays the
 * part that expert servers play in Learning@home (seed
 * 002_2b00836ea4b30f79.txt §3.3, "Runtime"): forward has no side effects;
 * backward recomputes the forward (gradient checkpointing), returns dL/dx
 * and applies the expert's optimizer step to the gradient it just got.
 *
 * Selection is brute force over the grid's live cells (the DHT's beam
 * search, seed 002 Appendix C, finds the same top-k when every expert is
 * announced). Fault injection follows seed 002 §4.2: each call of an expert
 * fails with probability fail_prob, drawn from a generator seeded by the
 * config, so a run is reproducible. Cells can also be dead (never chosen)
 * or failing (chosen, never answer). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_dmoe.h"
#include "kern_expert.h"


struct cell {
    struct kern_expert *e;
    struct kern_optim *opt;
    enum kern_dmoe_cell_state state;
};

struct kern_dmoe_local {
    struct kern_dmoe_local_config c;
    const struct kern_backend *be;
    int ncells;
    struct cell *cells;
    uint64_t rng;
    int frozen;
};

void kern_dmoe_local_free(struct kern_dmoe_local *l)
{
    if (!l)
        return;
    for (int i = 0; l->cells && i < l->ncells; i++) {
        kern_optim_free(l->cells[i].opt);
        kern_expert_free(l->cells[i].e);
    }
    free(l->cells);
    free(l);
}

int kern_dmoe_local_new(const struct kern_backend *be, const struct kern_dmoe_local_config *c,
                        struct kern_dmoe_local **out)
{
    const char *why;
    if (!be || !c || !out || kern_dmoe_local_config_check(c, &why))
        return CM_EINVAL;
    struct kern_dmoe_local *l = calloc(1, sizeof *l);
    if (!l)
        return CM_ENOMEM;
    l->c = *c;
    l->be = be;
    l->ncells = 1;
    for (int i = 0; i < c->d; i++)
        l->ncells *= c->M;
    l->rng = c->seed ^ 0x6661756c74ULL; /* the fault stream, apart from initialization */
    l->cells = calloc((size_t)l->ncells, sizeof *l->cells);
    int rc = CM_ENOMEM;
    if (!l->cells)
        goto fail;
    for (int i = 0; i < l->ncells; i++) {
        struct cell *x = &l->cells[i];
        uint64_t s = c->seed * 0x100000001b3ULL + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
        if ((rc = kern_expert_new(be, c->C, c->F, c->max_rows, s, &x->e)) ||
            (rc = kern_optim_new(be, &c->opt, kern_expert_model(x->e)->nparams, &x->opt)))
            goto fail;
    }
    *out = l;
    return CM_OK;
fail:
    kern_dmoe_local_free(l);
    return rc;
}

/* Flat cell index of uid (sum_i u_i M^i), -1 off the grid. */
static int cell_of(const struct kern_dmoe_local *l, const int *uid)
{
    int idx = 0, mul = 1;
    for (int i = 0; i < l->c.d; i++) {
        if (uid[i] < 0 || uid[i] >= l->c.M)
            return -1;
        idx += uid[i] * mul;
        mul *= l->c.M;
    }
    return idx;
}

static int fault(struct kern_dmoe_local *l)
{
    return l->c.fail_prob > 0.0f && kern_rng_uniform(&l->rng) < l->c.fail_prob;
}

/* Top-k over the live cells by g(x,f) = sum_i scores[b][i][u_i] (seed 002
 * §3.2), best first; ties go to the lower cell index. */
static int local_select(void *ctx, const float *scores, int B, int d, int M, int k, int *uids)
{
    struct kern_dmoe_local *l = ctx;
    if (d != l->c.d || M != l->c.M || k < 1 || k > KERN_DMOE_MAX_K || B < 1)
        return CM_EINVAL;
    for (int b = 0; b < B; b++) {
        const float *s = scores + (size_t)b * d * M;
        float best[KERN_DMOE_MAX_K];
        int bidx[KERN_DMOE_MAX_K], n = 0;
        int u[KERN_DMOE_MAX_D] = {0};
        for (int idx = 0; idx < l->ncells; idx++) {
            if (idx > 0) /* odometer: u = digits of idx in base M, u[0] fastest */
                for (int i = 0; i < d && ++u[i] == M; i++)
                    u[i] = 0;
            if (l->cells[idx].state == KERN_DMOE_DEAD)
                continue;
            float g = 0.0f;
            for (int i = 0; i < d; i++)
                g += s[(size_t)i * M + u[i]];
            if (n == k && !(g > best[k - 1]))
                continue;
            int pos = n < k ? n++ : k - 1;
            while (pos > 0 && g > best[pos - 1]) {
                best[pos] = best[pos - 1];
                bidx[pos] = bidx[pos - 1];
                pos--;
            }
            best[pos] = g;
            bidx[pos] = idx;
        }
        for (int j = 0; j < k; j++) {
            int *out = uids + ((size_t)b * k + j) * d;
            if (j >= n) {
                for (int i = 0; i < d; i++)
                    out[i] = -1;
                continue;
            }
            for (int i = 0, v = bidx[j]; i < d; i++, v /= M)
                out[i] = v % M;
        }
    }
    return CM_OK;
}

static int local_forward(void *ctx, const struct kern_dmoe_route *r, const float *x, float *y,
                         uint8_t *ok)
{
    struct kern_dmoe_local *l = ctx;
    if (r->d != l->c.d || r->C != l->c.C)
        return CM_EINVAL;
    for (int e = 0; e < r->nexp; e++) {
        int idx = cell_of(l, r->uid + (size_t)e * r->d), n = r->start[e + 1] - r->start[e];
        size_t off = (size_t)r->start[e] * r->C;
        ok[e] = 0;
        if (idx < 0 || l->cells[idx].state == KERN_DMOE_DEAD ||
            l->cells[idx].state == KERN_DMOE_FAILING || fault(l))
            continue;
        ok[e] = kern_expert_forward(l->cells[idx].e, x + off, n, y + off) == CM_OK;
    }
    return CM_OK;
}

static int local_backward(void *ctx, const struct kern_dmoe_route *r, const float *x,
                          const float *dy, float *dx, uint8_t *ok)
{
    struct kern_dmoe_local *l = ctx;
    if (r->d != l->c.d || r->C != l->c.C)
        return CM_EINVAL;
    for (int e = 0; e < r->nexp; e++) {
        if (!ok[e])
            continue;
        int idx = cell_of(l, r->uid + (size_t)e * r->d), n = r->start[e + 1] - r->start[e];
        size_t off = (size_t)r->start[e] * r->C;
        ok[e] = 0;
        if (idx < 0 || l->cells[idx].state != KERN_DMOE_LIVE || fault(l))
            continue;
        struct cell *c = &l->cells[idx];
        struct kern_model *em = kern_expert_model(c->e);
        kern_model_zero_grad(em);
        if (kern_expert_backward(c->e, x + off, dy + off, n, dx + off) != CM_OK)
            continue;
        ok[e] = 1;
        /* the server's update (seed 002 §3.3): a non-finite gradient is
         * refused by the optimizer and changes nothing */
        if (!l->frozen)
            (void)kern_optim_step(c->opt, em, NULL, NULL);
        kern_model_zero_grad(em);
    }
    return CM_OK;
}

void kern_dmoe_local_experts(struct kern_dmoe_local *l, struct kern_dmoe_experts *out)
{
    out->ctx = l;
    out->select = local_select;
    out->forward = local_forward;
    out->backward = local_backward;
}

int kern_dmoe_local_set_state(struct kern_dmoe_local *l, const int *uid,
                              enum kern_dmoe_cell_state st)
{
    int idx = l && uid ? cell_of(l, uid) : -1;
    if (idx < 0 || st < KERN_DMOE_LIVE || st > KERN_DMOE_FAILING_BWD)
        return CM_EINVAL;
    l->cells[idx].state = st;
    return CM_OK;
}

int kern_dmoe_local_set_fail_prob(struct kern_dmoe_local *l, float p)
{
    if (!l || !(p >= 0.0f && p < 1.0f))
        return CM_EINVAL;
    l->c.fail_prob = p;
    return CM_OK;
}

void kern_dmoe_local_set_frozen(struct kern_dmoe_local *l, int frozen)
{
    if (l)
        l->frozen = frozen != 0;
}

struct kern_expert *kern_dmoe_local_expert(struct kern_dmoe_local *l, const int *uid)
{
    int idx = l && uid ? cell_of(l, uid) : -1;
    return idx < 0 ? NULL : l->cells[idx].e;
}

long kern_dmoe_local_steps(const struct kern_dmoe_local *l, const int *uid)
{
    int idx = l && uid ? cell_of(l, uid) : -1;
    return idx < 0 ? -1 : l->cells[idx].opt->step;
}

size_t kern_dmoe_local_param_count(const struct kern_dmoe_local *l)
{
    return l ? (size_t)l->ncells * kern_expert_model(l->cells[0].e)->nparams : 0;
}
