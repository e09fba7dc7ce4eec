/* Pipeline stages of the GPT model (issue 19, first kernel slice): a model
 * holding a consecutive range of a GPT model's layers, plus the embeddings
 * in the first stage and the final LayerNorm, head and loss in the last
 * (seed 003_f3537b728458fcc1.txt §2: "each device handles a consecutive
 * sequence of layers"). Agents chain stages by sending activations forward
 * and their gradients backward (§3.5); kern_model.h describes the API and
 * the tied-embedding rule.
 *
 * The blocks run through kern_tfm.c's block code (kern_tfm_int.h), and the
 * embedding and head use the same ops in the same order as kern_tfm.c's GPT
 * path, so a chain of stages computes what the whole model computes: on the
 * CPU backend the same bits, except for wte's gradient, which the whole
 * model accumulates in one buffer and a pipeline sums from two copies.
 *
 * Shapes: B batch, T positions, C model width, F MLP width, NH heads,
 * V vocabulary, N = B*T rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_internal.h"
#include "kern_model.h"
#include "kern_tfm_int.h"

struct stage {
    struct kern_tfm_config c;
    struct kern_tfm_stage st;
    size_t wte, wpe, lnfw, lnfb;     /* offsets; wte with the embedding or the head */
    struct kern__tfm_blk *blk;       /* st.n_layers */
    struct kern__tfm_act *act;       /* st.n_layers */
    struct kern__tfm_scratch s;
    float *x0;                       /* (N,C): the embedding's output or a copy of x_in */
    float *lnf, *lnf_mean, *lnf_rstd; /* head: (N,C) (N) (N) */
    float *logits, *probs, *losses;  /* head: (N,V) (N,V) (N) */
    float *dlogits;                  /* head: (N,V) */
    int *tok, *tgt;                  /* (N) */
    /* the micro-batch of the last forward, for backward */
    int ready, B, T, count;
};

int kern_tfm_stage_check(const struct kern_tfm_config *c, const struct kern_tfm_stage *st,
                         const char **why)
{
    if (!c || !st) {
        *why = "stage: no config or no stage";
        return CM_EINVAL;
    }
    if (kern_tfm_config_check(c, why))
        return CM_EINVAL;
    if (c->kind != KERN_MODEL_GPT) {
        *why = "stage: pipeline stages are implemented for gpt only";
        return CM_EINVAL;
    }
    if (c->share_layers) {
        *why = "stage: shared layers would tie parameters across stages; not supported";
        return CM_EINVAL;
    }
    if ((st->has_embed != 0 && st->has_embed != 1) || (st->has_head != 0 && st->has_head != 1)) {
        *why = "stage: has_embed and has_head must be 0 or 1";
        return CM_EINVAL;
    }
    if (st->first_layer < 0 || st->n_layers < 0 || st->first_layer > c->n_layer ||
        st->n_layers > c->n_layer - st->first_layer) {
        *why = "stage: layer range outside [0, n_layer)";
        return CM_EINVAL;
    }
    if (st->n_layers == 0 && !st->has_embed && !st->has_head) {
        *why = "stage: a stage without layers must hold the embedding or the head";
        return CM_EINVAL;
    }
    if (st->has_embed && st->first_layer != 0) {
        *why = "stage: the embedding stage must start at layer 0";
        return CM_EINVAL;
    }
    if (st->has_head && st->first_layer + st->n_layers != c->n_layer) {
        *why = "stage: the head stage must end at the last layer";
        return CM_EINVAL;
    }
    return CM_OK;
}

int kern_tfm_stages_check(const struct kern_tfm_config *c, const struct kern_tfm_stage *st, int S,
                          const char **why)
{
    if (!c || !st || S < 1 || S > KERN_MAX_LAYERS + 2) {
        *why = "stages: need 1..130 stages";
        return CM_EINVAL;
    }
    int next = 0;
    for (int j = 0; j < S; j++) {
        if (kern_tfm_stage_check(c, &st[j], why))
            return CM_EINVAL;
        if (st[j].has_embed != (j == 0)) {
            *why = "stages: the embedding belongs to the first stage and no other";
            return CM_EINVAL;
        }
        if (st[j].has_head != (j == S - 1)) {
            *why = "stages: the head belongs to the last stage and no other";
            return CM_EINVAL;
        }
        if (st[j].first_layer != next) {
            *why = st[j].first_layer < next ? "stages: layer ranges overlap"
                                            : "stages: layer ranges leave a gap";
            return CM_EINVAL;
        }
        next += st[j].n_layers;
    }
    /* the last stage's check (has_head) made next == n_layer */
    return CM_OK;
}

int kern_tfm_stages_split(const struct kern_tfm_config *c, int S, struct kern_tfm_stage *st)
{
    const char *why;
    if (!c || !st || kern_tfm_config_check(c, &why) || c->kind != KERN_MODEL_GPT || S < 1 ||
        S > c->n_layer)
        return CM_EINVAL;
    int first = 0;
    for (int j = 0; j < S; j++) {
        int n = c->n_layer / S + (j < c->n_layer % S);
        st[j] = (struct kern_tfm_stage){first, n, j == 0, j == S - 1};
        first += n;
    }
    return CM_OK;
}

/* The stage's table: the whole model's (kern_tfm.c, tfm_layout) restricted
 * to what the stage holds, in the same order. */
static int stage_layout(struct stage *g, struct kern__tensor_list *tl)
{
    const struct kern_tfm_config *c = &g->c;
    const struct kern_tfm_stage *st = &g->st;
    int C = c->d_model, F = c->d_ff, rc = 0;
    if (st->has_embed || st->has_head)
        rc = kern__tensor_add(tl, "wte", 1, &g->wte, 2, c->vocab, C, 0, 0);
    if (!rc && st->has_embed)
        rc = kern__tensor_add(tl, "wpe", 1, &g->wpe, 2, c->max_T, C, 0, 0);
    for (int i = 0; i < st->n_layers && !rc; i++)
        rc = kern__tfm_blk_add(tl, &g->blk[i], st->first_layer + i, C, F);
    if (!rc && st->has_head)
        rc = kern__tensor_add(tl, "ln_f.weight", 0, &g->lnfw, 1, C, 0, 0, 0);
    if (!rc && st->has_head)
        rc = kern__tensor_add(tl, "ln_f.bias", 0, &g->lnfb, 1, C, 0, 0, 0);
    return rc;
}

size_t kern_tfm_stage_param_count(const struct kern_tfm_config *c, const struct kern_tfm_stage *st)
{
    const char *why;
    if (kern_tfm_stage_check(c, st, &why))
        return 0;
    size_t C = c->d_model, F = c->d_ff, V = c->vocab;
    size_t blk = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    size_t n = (size_t)st->n_layers * blk;
    if (st->has_embed || st->has_head)
        n += V * C;
    if (st->has_embed)
        n += (size_t)c->max_T * C;
    if (st->has_head)
        n += 2 * C;
    return n;
}

void kern_tfm_stage_mem_need(const struct kern_tfm_config *c, const struct kern_tfm_stage *st,
                             int max_batch, struct kern_mem_need *n)
{
    memset(n, 0, sizeof *n);
    size_t np = kern_tfm_stage_param_count(c, st);
    if (np == 0 || max_batch < 1)
        return;
    /* as kern_tfm_stage_new, buffer by buffer */
    size_t N = (size_t)max_batch * c->max_T, C = c->d_model, F = c->d_ff, V = c->vocab;
    size_t att = (size_t)max_batch * c->n_head * c->max_T * c->max_T;
    size_t layer = 5 * N * C + 4 * N + 3 * N * C + 2 * att + 2 * N * F; /* kern__tfm_act */
    size_t act = (size_t)st->n_layers * layer;
    act += 4 * N * C + 3 * N * C + 2 * att + 2 * N * F; /* kern__tfm_scratch */
    act += N * C;                                       /* x0 */
    size_t ints = 0;
    if (st->has_embed)
        ints += N;                                      /* tok */
    if (st->has_head) {
        /* lnf, its stats, logits, probs, losses, dlogits */
        act += N * C + 2 * N + 2 * N * V + N + N * V;
        ints += N;                                      /* tgt */
    }
    n->params = n->grads = np * sizeof(float);
    n->act = act * sizeof(float) + ints * sizeof(int);
    /* the CUDA backend's own buffers, as kern_tfm_mem_need */
    n->scratch = 7 * N * C * sizeof(float) + (np / KERN_SUMSQ_BLOCK + 2) * sizeof(double) +
                 sizeof(int) + kern__tfm_gemm_scratch(c, max_batch, st->has_head);
    n->reserve = KERN_GPU_RESERVE;
}

/* Initializes the stage's parameters (host, m->nparams) as kern_tfm_new
 * initializes the whole model: walk the whole model's table in order, fill
 * the tensors this stage holds (looked up by name: both copies of wte get
 * the whole model's wte) and skip the draws of the others. */
static int stage_init(const struct kern_model *m, const struct kern_tfm_config *c, float *host,
                      uint64_t seed)
{
    struct kern__tensor_list full = {0};
    int rc = kern__tfm_table(c, &full);
    if (rc) {
        free(full.v);
        return rc;
    }
    uint64_t rng = seed;
    for (int i = 0; i < full.n; i++) {
        const struct kern_tensor *mine = kern_model_tensor(m, full.v[i].name);
        kern__tfm_init_tensor(&full.v[i], mine ? host + mine->off : NULL, c, &rng);
    }
    free(full.v);
    return CM_OK;
}

static void stage_destroy(struct kern_model *m)
{
    struct stage *g = m->impl;
    if (!g)
        return;
    const struct kern_backend *be = m->be;
    if (g->act)
        for (int i = 0; i < g->st.n_layers; i++)
            kern__tfm_act_release(be, &g->act[i]);
    kern__tfm_scratch_release(be, &g->s);
    float *bufs[] = {g->x0,    g->lnf,   g->lnf_mean, g->lnf_rstd,
                     g->logits, g->probs, g->losses,  g->dlogits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->release(bufs[i]);
    be->release(g->tok);
    be->release(g->tgt);
    free(g->act);
    free(g->blk);
    free(g);
    m->impl = NULL;
}

/* The stage's output (N,C) on the device: the last block's, or the
 * embedding's when the stage has no layers. */
static const float *stage_xl(const struct stage *g)
{
    return g->st.n_layers ? g->act[g->st.n_layers - 1].res3 : g->x0;
}

static const float *stage_res(const struct stage *g, int i)
{
    return i == 0 ? g->x0 : g->act[i - 1].res3;
}

/* Activations and their gradients come from another agent: a NaN or an
 * infinity would spread through every parameter of this stage, so it is
 * refused before anything changes (as kern_expert.c does). */
static int all_finite_host(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static struct stage *stage_of(const struct kern_model *m)
{
    return m && m->kind == KERN_MODEL_GPT_STAGE && m->impl ? m->impl : NULL;
}

int kern_tfm_stage_get(const struct kern_model *m, struct kern_tfm_stage *st)
{
    const struct stage *g = stage_of(m);
    if (!g || !st)
        return CM_EINVAL;
    *st = g->st;
    return CM_OK;
}

/* kern_tfm_stage_forward; acc: also count argmax hits in ev (copies the
 * probabilities to the host; kern_model_eval's path). */
static int stage_forward(struct kern_model *m, const struct kern_batch *b, const float *x_in,
                         float *x_out, struct kern_eval *ev, int acc)
{
    struct stage *g = stage_of(m);
    if (!g || !b)
        return CM_EINVAL;
    const struct kern_backend *be = m->be;
    const struct kern_tfm_config *c = &g->c;
    const struct kern_tfm_stage *st = &g->st;
    int B = b->B, T = b->T, C = c->d_model, V = c->vocab;
    if (B < 1 || B > m->max_batch || T < 1 || T > m->max_T)
        return CM_EINVAL;
    if ((x_in == NULL) != st->has_embed || (x_out == NULL) != st->has_head)
        return CM_EINVAL;
    if ((st->has_embed && !b->tokens) || (st->has_head && !b->targets))
        return CM_EINVAL;
    size_t N = (size_t)B * T;
    if (x_in && !all_finite_host(x_in, N * C))
        return CM_EINVAL;
    int count = 0;
    for (size_t i = 0; i < N; i++) {
        if (st->has_embed && (b->tokens[i] < 0 || b->tokens[i] >= V))
            return CM_EINVAL;
        if (st->has_head) {
            if (b->targets[i] >= V)
                return CM_EINVAL;
            count += b->targets[i] >= 0;
        }
    }
    /* From here the saved micro-batch is being replaced: backward must wait
     * for this forward to finish. */
    g->ready = 0;
    int rc;
    if (st->has_embed && (rc = be->upload(g->tok, b->tokens, sizeof(int) * N)))
        return rc;
    if (st->has_head && (rc = be->upload(g->tgt, b->targets, sizeof(int) * N)))
        return rc;
    const float *P = m->params;
    struct kern__tfm_dims d = {B, T, C, c->d_ff, c->n_head, 1, 0};

    /* kern_tfm.c's GPT forward, restricted to this stage's part */
    if (st->has_embed)
        be->embed_fwd(g->x0, g->tok, P + g->wte, P + g->wpe, B, T, C);
    else if ((rc = be->upload(g->x0, x_in, sizeof(float) * N * C)))
        return rc;
    for (int i = 0; i < st->n_layers; i++)
        kern__tfm_blk_fwd(be, P, &g->blk[i], &g->act[i], stage_res(g, i), &g->s, &d);
    const float *xl = stage_xl(g);
    if (st->has_head) {
        be->layernorm_fwd(g->lnf, g->lnf_mean, g->lnf_rstd, xl, P + g->lnfw, P + g->lnfb, (int)N,
                          C);
        be->matmul_fwd(g->logits, g->lnf, P + g->wte, NULL, (int)N, C, V);
        be->xent_fwd(g->losses, g->probs, g->logits, g->tgt, (int)N, V);
        struct kern_eval tmp = {0};
        rc = kern__score(be, g->losses, acc ? g->probs : NULL, b->targets, (int)N, V,
                         ev ? ev : &tmp);
        if (rc)
            return rc;
    } else if ((rc = be->download(x_out, xl, sizeof(float) * N * C))) {
        return rc;
    }
    g->B = B;
    g->T = T;
    g->count = count;
    g->ready = 1;
    return CM_OK;
}

int kern_tfm_stage_forward(struct kern_model *m, const struct kern_batch *b, const float *x_in,
                           float *x_out, struct kern_eval *ev)
{
    return stage_forward(m, b, x_in, x_out, ev, 0);
}

int kern_tfm_stage_backward(struct kern_model *m, const float *dx_out, float grad_scale,
                            float *dx_in)
{
    struct stage *g = stage_of(m);
    if (!g || !g->ready)
        return CM_EINVAL;
    const struct kern_tfm_stage *st = &g->st;
    if ((dx_out == NULL) != st->has_head || (dx_in == NULL) != st->has_embed)
        return CM_EINVAL;
    const struct kern_backend *be = m->be;
    const struct kern_tfm_config *c = &g->c;
    int B = g->B, T = g->T, C = c->d_model, V = c->vocab;
    size_t N = (size_t)B * T;
    if (dx_out && !all_finite_host(dx_out, N * C))
        return CM_EINVAL;
    const float *P = m->params;
    float *G = m->grads;
    struct kern__tfm_scratch *s = &g->s;
    struct kern__tfm_dims d = {B, T, C, c->d_ff, c->n_head, 1, 0};
    int rc;

    if (st->has_head) {
        if (g->count == 0) {
            /* as kern_tfm.c: no target, no gradient; the earlier stages
             * still wait for one, so they get zeros */
            if (dx_in) {
                be->fill(s->dres, 0.0f, N * C);
                return be->download(dx_in, s->dres, sizeof(float) * N * C);
            }
            return CM_OK;
        }
        /* kern_tfm.c's GPT head backward, same ops in the same order */
        be->fill(g->dlogits, 0.0f, N * V);
        be->xent_bwd(g->dlogits, g->probs, g->tgt, grad_scale / g->count, (int)N, V);
        be->fill(s->dln, 0.0f, N * C);
        be->matmul_bwd(s->dln, G + g->wte, NULL, g->dlogits, g->lnf, P + g->wte, (int)N, C, V);
        be->fill(s->dres, 0.0f, N * C);
        be->layernorm_bwd(s->dres, G + g->lnfw, G + g->lnfb, s->dln, stage_xl(g), P + g->lnfw,
                          g->lnf_mean, g->lnf_rstd, (int)N, C);
    } else if ((rc = be->upload(s->dres, dx_out, sizeof(float) * N * C))) {
        return rc;
    }
    /* s->dres = d loss / d (this stage's output) */
    for (int i = st->n_layers - 1; i >= 0; i--)
        kern__tfm_blk_bwd(be, P, G, &g->blk[i], &g->act[i], stage_res(g, i), s, &d);
    /* s->dres = d loss / d x0 */
    if (st->has_embed) {
        be->embed_bwd(G + g->wte, G + g->wpe, s->dres, g->tok, B, T, C);
        return CM_OK;
    }
    return be->download(dx_in, s->dres, sizeof(float) * N * C);
}

/* kern_model_fwd_bwd / kern_model_eval on a stage: only a stage that is the
 * whole model (embedding and head) can run a batch on its own. */
static int stage_run(struct kern_model *m, const struct kern_batch *b, int backward,
                     float grad_scale, struct kern_eval *ev)
{
    struct stage *g = m->impl;
    if (!g->st.has_embed || !g->st.has_head)
        return CM_EINVAL;
    int rc = stage_forward(m, b, NULL, NULL, ev, !backward);
    if (rc || !backward)
        return rc;
    return kern_tfm_stage_backward(m, NULL, grad_scale, NULL);
}

static const struct kern_model_ops STAGE_OPS = {stage_run, stage_destroy};

int kern_tfm_stage_new(const struct kern_backend *be, const struct kern_tfm_config *c,
                       const struct kern_tfm_stage *st, int max_batch, uint64_t seed,
                       struct kern_model **out)
{
    const char *why;
    if (!be || !c || !st || !out || max_batch < 1 || max_batch > (1 << 20))
        return CM_EINVAL;
    if (kern_tfm_stage_check(c, st, &why))
        return CM_EINVAL;
    struct kern_model *m = calloc(1, sizeof *m);
    struct stage *g = calloc(1, sizeof *g);
    struct kern__tensor_list tl = {0};
    float *host = NULL;
    int rc = CM_ENOMEM;
    if (!m || !g) {
        free(g);
        free(m);
        return CM_ENOMEM;
    }
    m->ops = &STAGE_OPS;
    m->be = be;
    m->kind = KERN_MODEL_GPT_STAGE;
    m->impl = g;
    m->max_batch = max_batch;
    m->max_T = c->max_T;
    m->nclass = c->vocab;
    g->c = *c;
    g->st = *st;
    /* calloc(0) may return NULL: keep one element */
    size_t nl = st->n_layers ? (size_t)st->n_layers : 1;
    g->blk = calloc(nl, sizeof *g->blk);
    g->act = calloc(nl, sizeof *g->act);
    if (!g->blk || !g->act)
        goto fail;
    if ((rc = stage_layout(g, &tl)) || (rc = kern__model_alloc(m, &tl)))
        goto fail;
    host = malloc(sizeof(float) * m->nparams);
    if (!host) {
        rc = CM_ENOMEM;
        goto fail;
    }
    if ((rc = stage_init(m, c, host, seed)) || (rc = kern_model_set_params(m, host)))
        goto fail;
    free(host);
    host = NULL;

    size_t N = (size_t)max_batch * c->max_T, C = c->d_model, F = c->d_ff, V = c->vocab;
    size_t att = (size_t)max_batch * c->n_head * c->max_T * c->max_T;
    int err = 0;
    for (int i = 0; i < st->n_layers; i++)
        kern__tfm_act_alloc(be, &g->act[i], N, C, F, att, &err);
    kern__tfm_scratch_alloc(be, &g->s, N, C, F, att, &err);
    g->x0 = kern__alloc_f(be, N * C, &err);
    if (st->has_embed)
        g->tok = kern__alloc_i(be, N, &err);
    if (st->has_head) {
        g->lnf = kern__alloc_f(be, N * C, &err);
        g->lnf_mean = kern__alloc_f(be, N, &err);
        g->lnf_rstd = kern__alloc_f(be, N, &err);
        g->logits = kern__alloc_f(be, N * V, &err);
        g->probs = kern__alloc_f(be, N * V, &err);
        g->losses = kern__alloc_f(be, N, &err);
        g->dlogits = kern__alloc_f(be, N * V, &err);
        g->tgt = kern__alloc_i(be, N, &err);
    }
    if ((rc = err))
        goto fail;
    *out = m;
    return CM_OK;
fail:
    free(host);
    free(tl.v);
    kern_model_free(m);
    return rc;
}
