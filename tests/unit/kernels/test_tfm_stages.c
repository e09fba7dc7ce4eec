/* Pipeline stages of the GPT model (kern_tfm_stage_new, issue 19) on the CPU
 * backend, against the whole model (kern_tfm_new) with the same config and
 * seed: a split into stages must start from the same parameters, give the
 * same loss when the forward pass is chained through the stages, the same
 * gradients when the backward pass is chained back (with the two copies of
 * the tied embedding wte summed, kern_model.h), and still agree after an
 * update. Splits: 1, 2, 3 and 4 stages, an embedding-only first stage and a
 * head-only last stage. Bad stage ranges and calls are refused.
 *
 * Tolerances: the stages run the same ops in the same order as the whole
 * model on the same inputs (kern_tfm_int.h shares the block code), so on the
 * CPU backend everything but wte's gradient comes out bit for bit today. The
 * whole model accumulates wte's gradient in one buffer (head first, then the
 * embedding's rows one by one) while the pipeline adds two separately
 * accumulated copies: float addition in another order, a few ulp apart.
 * After the update the parameters differ by those ulp, so step 2 differs a
 * little everywhere. The bounds (loss 1e-5 relative; gradients 1e-4 of the
 * tensor's largest entry) are far above float32 rounding on these sizes
 * (about 1e-7 relative) and far below what a wrong layer, a missing residual
 * or a mis-scaled gradient would give (order 1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_model.h"

enum { V = 64, TT = 8, L = 4, C = 32, NH = 4, F = 128, B = 3, SEED = 1234, MAXS = 8 };

static const struct kern_tfm_config CFG = {.kind = KERN_MODEL_GPT, .vocab = V, .max_T = TT,
                                           .n_layer = L, .n_head = NH, .d_model = C,
                                           .d_embed = C, .d_ff = F, .share_layers = 0};

/* A split under test: the stage models and host copies of their
 * parameters and gradients. */
struct pipe {
    int S;
    struct kern_tfm_stage st[MAXS];
    struct kern_model *m[MAXS];
};

static void pipe_new(struct pipe *p, const struct kern_tfm_stage *st, int S)
{
    const char *why = NULL;
    p->S = S;
    memcpy(p->st, st, sizeof *st * S);
    if (kern_tfm_stages_check(&CFG, st, S, &why)) {
        print_error("split refused: %s\n", why);
        fail();
    }
    for (int j = 0; j < S; j++) {
        p->m[j] = NULL;
        assert_int_equal(kern_tfm_stage_new(kern_backend_cpu(), &CFG, &st[j], B, SEED, &p->m[j]),
                         CM_OK);
        assert_int_equal(p->m[j]->kind, KERN_MODEL_GPT_STAGE);
        assert_int_equal(p->m[j]->nparams, kern_tfm_stage_param_count(&CFG, &st[j]));
    }
}

static void pipe_free(struct pipe *p)
{
    for (int j = 0; j < p->S; j++) {
        kern_model_free(p->m[j]);
        p->m[j] = NULL;
    }
}

/* The CPU backend's buffers are host memory: m->params and m->grads are
 * read and written in place. */
static const float *tensor_of(const struct kern_model *m, const float *buf, const char *name,
                              const struct kern_tensor **t)
{
    *t = kern_model_tensor(m, name);
    return *t ? buf + (*t)->off : NULL;
}

/* (a) every stage tensor equals the whole model's tensor of the same name
 * and shape, bit for bit; every tensor of the whole model is somewhere, wte
 * in the first and the last stage. */
static void check_params_equal(const struct kern_model *full, const struct pipe *p)
{
    size_t total = 0;
    for (int j = 0; j < p->S; j++) {
        const struct kern_model *m = p->m[j];
        total += m->nparams;
        for (int i = 0; i < m->ntensors; i++) {
            const struct kern_tensor *mt = &m->tensors[i], *ft;
            const float *fx = tensor_of(full, full->params, mt->name, &ft);
            if (!fx) {
                print_error("stage %d: tensor %s not in the whole model\n", j, mt->name);
                fail();
            }
            assert_int_equal(mt->numel, ft->numel);
            assert_int_equal(mt->ndim, ft->ndim);
            assert_memory_equal(mt->shape, ft->shape, sizeof mt->shape);
            assert_int_equal(mt->decay, ft->decay);
            if (memcmp(m->params + mt->off, fx, mt->numel * sizeof(float))) {
                print_error("stage %d: %s differs from the whole model's\n", j, mt->name);
                fail();
            }
        }
    }
    for (int i = 0; i < full->ntensors; i++) {
        int holders = 0;
        for (int j = 0; j < p->S; j++)
            holders += kern_model_tensor(p->m[j], full->tensors[i].name) != NULL;
        int want = !strcmp(full->tensors[i].name, "wte") && p->S > 1 ? 2 : 1;
        assert_int_equal(holders, want);
    }
    assert_int_equal(total, full->nparams + (p->S > 1 ? (size_t)V * C : 0));
}

/* Copies the whole model's parameters into the stages by name (what loading
 * a checkpoint into a pipeline does). */
static void pipe_load(struct pipe *p, const struct kern_model *full)
{
    for (int j = 0; j < p->S; j++)
        for (int i = 0; i < p->m[j]->ntensors; i++) {
            const struct kern_tensor *mt = &p->m[j]->tensors[i], *ft;
            const float *fx = tensor_of(full, full->params, mt->name, &ft);
            assert_non_null(fx);
            memcpy(p->m[j]->params + mt->off, fx, mt->numel * sizeof(float));
        }
}

/* One training step of the pipeline: zero the gradients, forward through
 * the stages handing the activations on, backward handing their gradients
 * back, then the tied-embedding exchange (the first and last stage add each
 * other's wte gradient). Returns the mean loss. */
static double pipe_step(struct pipe *p, const struct kern_batch *b, float grad_scale)
{
    size_t n = (size_t)b->B * b->T * C;
    float *x[MAXS + 1] = {0}, *dx[MAXS + 1] = {0};
    for (int j = 1; j < p->S; j++) {
        x[j] = malloc(n * sizeof(float));
        dx[j] = malloc(n * sizeof(float));
        assert_non_null(x[j]);
        assert_non_null(dx[j]);
    }
    struct kern_eval ev = {0};
    for (int j = 0; j < p->S; j++) {
        kern_model_zero_grad(p->m[j]);
        /* x[j] is stage j's input, x[j+1] its output; x[0], x[S] are NULL */
        assert_int_equal(kern_tfm_stage_forward(p->m[j], b, x[j], x[j + 1], &ev), CM_OK);
    }
    for (int j = p->S - 1; j >= 0; j--)
        assert_int_equal(kern_tfm_stage_backward(p->m[j], dx[j + 1], grad_scale, dx[j]), CM_OK);
    if (p->S > 1) {
        const struct kern_tensor *t0, *t1;
        float *g0 = (float *)tensor_of(p->m[0], p->m[0]->grads, "wte", &t0);
        float *g1 = (float *)tensor_of(p->m[p->S - 1], p->m[p->S - 1]->grads, "wte", &t1);
        for (size_t i = 0; i < t0->numel; i++)
            g0[i] = g1[i] = g0[i] + g1[i];
    }
    for (int j = 1; j < p->S; j++) {
        free(x[j]);
        free(dx[j]);
    }
    assert_true(ev.count > 0);
    return ev.loss_sum / ev.count;
}

static void check_close(const char *what, double a, double want, double rel)
{
    if (fabs(a - want) > rel * fabs(want)) {
        print_error("%s: %.9g, want %.9g (relative %.2g allowed)\n", what, a, want, rel);
        fail();
    }
}

/* (c) every stage gradient against the whole model's gradient of the same
 * tensor: |diff| <= 1e-4 * (largest |entry| of the whole model's tensor). */
static void check_grads(const struct kern_model *full, const struct pipe *p, const char *when)
{
    for (int j = 0; j < p->S; j++) {
        const struct kern_model *m = p->m[j];
        for (int i = 0; i < m->ntensors; i++) {
            const struct kern_tensor *mt = &m->tensors[i], *ft;
            const float *fg = tensor_of(full, full->grads, mt->name, &ft);
            const float *g = m->grads + mt->off;
            double big = 0, worst = 0;
            for (size_t k = 0; k < mt->numel; k++) {
                big = fmax(big, fabs(fg[k]));
                worst = fmax(worst, fabs((double)g[k] - fg[k]));
            }
            if (!(big > 0) || worst > 1e-4 * big) {
                print_error("%s: stage %d of %d, %s: gradient off by %.3g (largest %.3g)\n", when,
                            j, p->S, mt->name, worst, big);
                fail();
            }
        }
    }
}

/* (d) the same plain SGD step on both, params -= lr * grads, on the host
 * copies; the pipeline's two wte copies get the same (summed) gradient and
 * so stay equal. */
static void sgd(struct kern_model *m, float lr)
{
    for (size_t i = 0; i < m->nparams; i++)
        m->params[i] -= lr * m->grads[i];
}

static void make_batch(int *tok, int *tgt, uint64_t *rng)
{
    for (int i = 0; i < B * TT; i++)
        tok[i] = (int)(kern_rng_u64(rng) % V);
    for (int i = 0; i < B * TT; i++)
        tgt[i] = (i % TT == TT - 1) ? -1 : tok[i + 1]; /* next token; none after the last */
    tgt[2] = -1;                                       /* a masked row inside a sequence */
}

/* Runs one split against the whole model for two steps. */
static void check_split(const struct kern_tfm_stage *st, int S, const char *what)
{
    struct kern_model *full = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &CFG, B, SEED, &full), CM_OK);
    struct pipe p;
    pipe_new(&p, st, S);
    check_params_equal(full, &p);

    /* LayerNorm weights (1) and biases (0) in general position, so their
     * gradients are not special; the stages load the perturbed values */
    uint64_t rng = 99;
    for (size_t i = 0; i < full->nparams; i++)
        full->params[i] += 0.05f * kern_rng_normal(&rng);
    pipe_load(&p, full);

    int tok[B * TT], tgt[B * TT];
    for (int step = 0; step < 2; step++) {
        make_batch(tok, tgt, &rng);
        struct kern_batch b = {.B = B, .T = TT, .tokens = tok, .targets = tgt};
        struct kern_eval ev = {0};
        const float scale = 0.5f; /* grad_scale reaches every stage through dx */
        kern_model_zero_grad(full);
        assert_int_equal(kern_model_fwd_bwd(full, &b, scale, &ev), CM_OK);
        double want = ev.loss_sum / ev.count;
        double got = pipe_step(&p, &b, scale);
        char when[96];
        snprintf(when, sizeof when, "%s step %d", what, step + 1);
        check_close(when, got, want, 1e-5);
        check_grads(full, &p, when);
        sgd(full, 0.1f);
        for (int j = 0; j < S; j++)
            sgd(p.m[j], 0.1f);
        if (S > 1) {
            const struct kern_tensor *t0, *t1;
            const float *w0 = tensor_of(p.m[0], p.m[0]->params, "wte", &t0);
            const float *w1 = tensor_of(p.m[S - 1], p.m[S - 1]->params, "wte", &t1);
            assert_memory_equal(w0, w1, t0->numel * sizeof(float));
        }
    }
    pipe_free(&p);
    kern_model_free(full);
}

static void test_three_stages(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, 2, 1, 0}, {2, 1, 0, 0}, {3, 1, 0, 1}};
    check_split(st, 3, "3 stages");
}

static void test_two_stages_even_split(void **state)
{
    (void)state;
    struct kern_tfm_stage st[2];
    assert_int_equal(kern_tfm_stages_split(&CFG, 2, st), CM_OK);
    const struct kern_tfm_stage want[] = {{0, 2, 1, 0}, {2, 2, 0, 1}};
    assert_memory_equal(st, want, sizeof want);
    check_split(st, 2, "2 stages");
    /* an uneven split gives the extra layers to the first stages */
    struct kern_tfm_stage s3[3];
    assert_int_equal(kern_tfm_stages_split(&CFG, 3, s3), CM_OK);
    const struct kern_tfm_stage w3[] = {{0, 2, 1, 0}, {2, 1, 0, 0}, {3, 1, 0, 1}};
    assert_memory_equal(s3, w3, sizeof w3);
    assert_int_equal(kern_tfm_stages_split(&CFG, 0, s3), CM_EINVAL);
    assert_int_equal(kern_tfm_stages_split(&CFG, L + 1, s3), CM_EINVAL);
}

static void test_four_stages_head_only(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, 1, 1, 0}, {1, 2, 0, 0}, {3, 1, 0, 0}, {4, 0, 0, 1}};
    check_split(st, 4, "4 stages, head only");
}

static void test_embed_only_and_head_only(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, 0, 1, 0}, {0, 4, 0, 0}, {4, 0, 0, 1}};
    check_split(st, 3, "embedding only, all layers, head only");
}

/* One stage holding everything is the whole model: same table, and the
 * generic kern_model_fwd_bwd on it gives the same bits (wte included: its
 * gradient accumulates in one buffer as in the whole model). */
static void test_one_stage_is_whole_model(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, L, 1, 1}};
    check_split(st, 1, "1 stage");
    struct kern_model *full = NULL, *one = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &CFG, B, SEED, &full), CM_OK);
    assert_int_equal(kern_tfm_stage_new(kern_backend_cpu(), &CFG, st, B, SEED, &one), CM_OK);
    assert_int_equal(one->nparams, full->nparams);
    assert_int_equal(one->ntensors, full->ntensors);
    for (int i = 0; i < full->ntensors; i++) {
        assert_string_equal(one->tensors[i].name, full->tensors[i].name);
        assert_int_equal(one->tensors[i].off, full->tensors[i].off);
    }
    uint64_t rng = 5;
    int tok[B * TT], tgt[B * TT];
    make_batch(tok, tgt, &rng);
    struct kern_batch b = {.B = B, .T = TT, .tokens = tok, .targets = tgt};
    struct kern_eval e1 = {0}, e2 = {0};
    assert_int_equal(kern_model_fwd_bwd(full, &b, 1.0f, &e1), CM_OK);
    assert_int_equal(kern_model_fwd_bwd(one, &b, 1.0f, &e2), CM_OK);
    assert_true(e1.loss_sum == e2.loss_sum);
    assert_int_equal(e1.count, e2.count);
    assert_memory_equal(one->grads, full->grads, full->nparams * sizeof(float));
    /* eval counts accuracy as the whole model does */
    memset(&e1, 0, sizeof e1);
    memset(&e2, 0, sizeof e2);
    assert_int_equal(kern_model_eval(full, &b, &e1), CM_OK);
    assert_int_equal(kern_model_eval(one, &b, &e2), CM_OK);
    assert_int_equal(e1.correct, e2.correct);
    assert_true(e1.loss_sum == e2.loss_sum);
    kern_model_free(one);
    kern_model_free(full);
}

/* A batch without any target: no gradient anywhere, zeros handed back. */
static void test_no_targets(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, 2, 1, 0}, {2, 2, 0, 1}};
    struct pipe p;
    pipe_new(&p, st, 2);
    int tok[B * TT], tgt[B * TT];
    uint64_t rng = 3;
    make_batch(tok, tgt, &rng);
    for (int i = 0; i < B * TT; i++)
        tgt[i] = -1;
    struct kern_batch b = {.B = B, .T = TT, .tokens = tok, .targets = tgt};
    float x[B * TT * C], dx[B * TT * C];
    struct kern_eval ev = {0};
    assert_int_equal(kern_tfm_stage_forward(p.m[0], &b, NULL, x, &ev), CM_OK);
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &b, x, NULL, &ev), CM_OK);
    assert_int_equal(ev.count, 0);
    memset(dx, 0xff, sizeof dx);
    assert_int_equal(kern_tfm_stage_backward(p.m[1], NULL, 1.0f, dx), CM_OK);
    for (int i = 0; i < B * TT * C; i++)
        assert_true(dx[i] == 0.0f);
    assert_int_equal(kern_tfm_stage_backward(p.m[0], dx, 1.0f, NULL), CM_OK);
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; i < p.m[j]->nparams; i++)
            assert_true(p.m[j]->grads[i] == 0.0f);
    pipe_free(&p);
}

/* Checks that st is refused for cfg with a message containing word, by the
 * check and by the constructor (which leaves *out alone). */
static void refuse_stage(const struct kern_tfm_config *cfg, struct kern_tfm_stage st,
                         const char *word)
{
    const char *why = NULL;
    assert_int_equal(kern_tfm_stage_check(cfg, &st, &why), CM_EINVAL);
    assert_non_null(why);
    if (!strstr(why, word)) {
        print_error("message \"%s\" does not say \"%s\"\n", why, word);
        fail();
    }
    static struct kern_model marker;
    struct kern_model *m = &marker;
    assert_int_equal(kern_tfm_stage_new(kern_backend_cpu(), cfg, &st, B, SEED, &m), CM_EINVAL);
    assert_ptr_equal(m, &marker);
    assert_int_equal(kern_tfm_stage_param_count(cfg, &st), 0);
}

static void refuse_split(const struct kern_tfm_stage *st, int S, const char *word)
{
    const char *why = NULL;
    assert_int_equal(kern_tfm_stages_check(&CFG, st, S, &why), CM_EINVAL);
    assert_non_null(why);
    if (!strstr(why, word)) {
        print_error("message \"%s\" does not say \"%s\"\n", why, word);
        fail();
    }
}

static void test_bad_stages(void **state)
{
    (void)state;
    refuse_stage(&CFG, (struct kern_tfm_stage){3, 2, 0, 1}, "outside");  /* past n_layer */
    refuse_stage(&CFG, (struct kern_tfm_stage){5, 0, 0, 1}, "outside");
    refuse_stage(&CFG, (struct kern_tfm_stage){-1, 2, 0, 0}, "outside");
    refuse_stage(&CFG, (struct kern_tfm_stage){1, -1, 0, 0}, "outside");
    refuse_stage(&CFG, (struct kern_tfm_stage){1, 0, 0, 0}, "without layers");
    refuse_stage(&CFG, (struct kern_tfm_stage){1, 1, 1, 0}, "start at layer 0");
    refuse_stage(&CFG, (struct kern_tfm_stage){0, 2, 0, 1}, "end at the last");
    refuse_stage(&CFG, (struct kern_tfm_stage){0, 2, 2, 0}, "0 or 1");
    struct kern_tfm_config albert = CFG;
    albert.kind = KERN_MODEL_ALBERT;
    albert.d_embed = 16;
    refuse_stage(&albert, (struct kern_tfm_stage){0, 2, 1, 0}, "gpt only");
    struct kern_tfm_config shared = CFG;
    shared.share_layers = 1;
    refuse_stage(&shared, (struct kern_tfm_stage){0, 2, 1, 0}, "shared layers");
    struct kern_tfm_config broken = CFG;
    broken.n_head = 5; /* does not divide d_model: the config check's own message */
    refuse_stage(&broken, (struct kern_tfm_stage){0, 2, 1, 0}, "n_head");

    const struct kern_tfm_stage overlap[] = {{0, 2, 1, 0}, {1, 3, 0, 1}};
    refuse_split(overlap, 2, "overlap");
    const struct kern_tfm_stage gap[] = {{0, 1, 1, 0}, {2, 2, 0, 1}};
    refuse_split(gap, 2, "gap");
    const struct kern_tfm_stage no_embed[] = {{0, 2, 0, 0}, {2, 2, 0, 1}};
    refuse_split(no_embed, 2, "embedding");
    const struct kern_tfm_stage two_heads[] = {{0, 4, 1, 1}, {4, 0, 0, 1}};
    refuse_split(two_heads, 2, "head");
    const struct kern_tfm_stage short_of_end[] = {{0, 2, 1, 0}, {2, 1, 0, 1}};
    refuse_split(short_of_end, 2, "last layer");
    refuse_split(overlap, 0, "stages");
}

/* Calls that do not fit the stage or the micro-batch are refused and
 * change nothing: the saved micro-batch and the gradients stay. */
static void test_bad_calls(void **state)
{
    (void)state;
    const struct kern_tfm_stage st[] = {{0, 1, 1, 0}, {1, 2, 0, 0}, {3, 1, 0, 1}};
    struct pipe p;
    pipe_new(&p, st, 3);
    int tok[B * TT], tgt[B * TT];
    uint64_t rng = 11;
    make_batch(tok, tgt, &rng);
    struct kern_batch b = {.B = B, .T = TT, .tokens = tok, .targets = tgt};
    static float x1[B * TT * C], x2[B * TT * C], d[B * TT * C];

    /* backward before any forward */
    assert_int_equal(kern_tfm_stage_backward(p.m[1], x1, 1.0f, d), CM_EINVAL);
    /* pointers that do not fit the stage */
    assert_int_equal(kern_tfm_stage_forward(p.m[0], &b, x1, x2, NULL), CM_EINVAL); /* x_in */
    assert_int_equal(kern_tfm_stage_forward(p.m[0], &b, NULL, NULL, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &b, NULL, x2, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_forward(p.m[2], &b, x1, x2, NULL), CM_EINVAL); /* x_out */
    /* sizes and values */
    struct kern_batch big = b;
    big.B = B + 1;
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &big, x1, x2, NULL), CM_EINVAL);
    big = b;
    big.T = TT + 1;
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &big, x1, x2, NULL), CM_EINVAL);
    big.T = 0;
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &big, x1, x2, NULL), CM_EINVAL);
    int badtok[B * TT];
    memcpy(badtok, tok, sizeof tok);
    badtok[5] = V;
    struct kern_batch bt = {.B = B, .T = TT, .tokens = badtok, .targets = tgt};
    assert_int_equal(kern_tfm_stage_forward(p.m[0], &bt, NULL, x1, NULL), CM_EINVAL);
    struct kern_batch nt = {.B = B, .T = TT, .tokens = tok, .targets = NULL};
    assert_int_equal(kern_tfm_stage_forward(p.m[2], &nt, x1, NULL, NULL), CM_EINVAL);

    /* a good forward; a middle stage reads neither tokens nor targets */
    assert_int_equal(kern_tfm_stage_forward(p.m[0], &b, NULL, x1, NULL), CM_OK);
    struct kern_batch only_size = {.B = B, .T = TT};
    assert_int_equal(kern_tfm_stage_forward(p.m[1], &only_size, x1, x2, NULL), CM_OK);
    assert_int_equal(kern_tfm_stage_forward(p.m[2], &b, x2, NULL, NULL), CM_OK);
    /* refused forwards and backwards leave the saved micro-batch alone */
    assert_int_equal(kern_tfm_stage_forward(p.m[2], &big, x2, NULL, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_backward(p.m[2], x1, 1.0f, d), CM_EINVAL);  /* dx_out */
    assert_int_equal(kern_tfm_stage_backward(p.m[2], NULL, 1.0f, NULL), CM_EINVAL); /* dx_in */
    assert_int_equal(kern_tfm_stage_backward(p.m[0], NULL, 1.0f, NULL), CM_EINVAL);
    /* a peer's garbage: non-finite activations or gradients */
    float keep = x2[7];
    x2[7] = NAN;
    assert_int_equal(kern_tfm_stage_forward(p.m[2], &b, x2, NULL, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_backward(p.m[1], x2, 1.0f, x1), CM_EINVAL);
    x2[7] = INFINITY;
    assert_int_equal(kern_tfm_stage_backward(p.m[1], x2, 1.0f, x1), CM_EINVAL);
    x2[7] = keep;
    for (size_t i = 0; i < p.m[1]->nparams; i++)
        assert_true(p.m[1]->grads[i] == 0.0f);
    for (size_t i = 0; i < p.m[2]->nparams; i++)
        assert_true(p.m[2]->grads[i] == 0.0f);
    assert_int_equal(kern_tfm_stage_backward(p.m[2], NULL, 1.0f, d), CM_OK);
    assert_int_equal(kern_tfm_stage_backward(p.m[1], d, 1.0f, x1), CM_OK);
    assert_int_equal(kern_tfm_stage_backward(p.m[0], x1, 1.0f, NULL), CM_OK);

    /* the generic entry points run only a stage that is the whole model */
    assert_int_equal(kern_model_fwd_bwd(p.m[1], &b, 1.0f, NULL), CM_EINVAL);
    assert_int_equal(kern_model_eval(p.m[0], &b, NULL), CM_EINVAL);
    /* stage calls on a model that is not a stage */
    struct kern_model *full = NULL;
    struct kern_tfm_stage got;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &CFG, B, SEED, &full), CM_OK);
    assert_int_equal(kern_tfm_stage_get(full, &got), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_forward(full, &b, NULL, NULL, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_backward(full, NULL, 1.0f, NULL), CM_EINVAL);
    assert_int_equal(kern_tfm_stage_get(p.m[1], &got), CM_OK);
    assert_memory_equal(&got, &st[1], sizeof got);
    kern_model_free(full);
    pipe_free(&p);
}

/* kern_tfm_stage_mem_need against the bytes kern_tfm_stage_new really
 * allocates (what the agent's GPU check sizes a stage with). */
static size_t g_alloc_bytes;
static int counting_alloc(size_t bytes, void **out)
{
    g_alloc_bytes += bytes;
    return kern_backend_cpu()->alloc(bytes, out);
}

static void test_mem_need(void **state)
{
    (void)state;
    struct kern_backend counting = *kern_backend_cpu();
    counting.alloc = counting_alloc;
    const struct kern_tfm_stage st[] = {{0, 0, 1, 0}, {0, 1, 1, 0}, {1, 2, 0, 0},
                                        {3, 1, 0, 1}, {4, 0, 0, 1}, {0, L, 1, 1}};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        struct kern_model *m = NULL;
        struct kern_mem_need n;
        g_alloc_bytes = 0;
        assert_int_equal(kern_tfm_stage_new(&counting, &CFG, &st[i], B, SEED, &m), CM_OK);
        kern_tfm_stage_mem_need(&CFG, &st[i], B, &n);
        assert_int_equal(n.params, m->nparams * sizeof(float));
        assert_int_equal(n.params + n.grads + n.act, g_alloc_bytes);
        assert_true(n.scratch > 0);
        kern_model_free(m);
    }
    /* the stage holding everything needs what the whole model needs */
    struct kern_mem_need whole, one;
    kern_tfm_mem_need(&CFG, B, &whole);
    kern_tfm_stage_mem_need(&CFG, &st[5], B, &one);
    assert_int_equal(one.params, whole.params);
    assert_int_equal(one.act, whole.act);
    struct kern_tfm_stage bad = {1, 1, 1, 0};
    kern_tfm_stage_mem_need(&CFG, &bad, B, &one);
    assert_int_equal(one.params + one.act + one.scratch, 0);
}

int main(void)
{
    kern_cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_stages),
        cmocka_unit_test(test_two_stages_even_split),
        cmocka_unit_test(test_four_stages_head_only),
        cmocka_unit_test(test_embed_only_and_head_only),
        cmocka_unit_test(test_one_stage_is_whole_model),
        cmocka_unit_test(test_no_targets),
        cmocka_unit_test(test_bad_stages),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_mem_need),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
