/* Our models against PyTorch: scripts/make_torch_fixtures.py exported, for
 * a tiny MLP, GPT and ALBERT, the inputs, the initial flat parameters, the
 * logits, the loss, the flat gradient, and the parameters after 3 AdamW and
 * 3 LAMB steps (tests/fixtures/kernels/, one .bin each). Here the CPU backend must
 * reproduce them within float32 tolerances (llm.c's test_gpt2.c habit).
 * Run from the repository root (scripts/run-tests.sh does). */
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
#include "kern_optim.h"

#define FIX_DIR "tests/fixtures/kernels/"
#define MAXT 16

struct fx_tensor {
    char name[64];
    int dtype; /* 0 f32, 1 i32 */
    size_t n;
    void *data;
};

struct fixture {
    int count;
    struct fx_tensor t[MAXT];
};

static uint32_t rd32(FILE *f)
{
    uint8_t b[4];
    assert_int_equal(fread(b, 1, 4, f), 4);
    return b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
}

static void fx_load(const char *name, struct fixture *fx)
{
    char path[256];
    snprintf(path, sizeof path, FIX_DIR "%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_error("cannot open %s (run from the repository root; regenerate with "
                    "/usr/bin/python3 scripts/make_torch_fixtures.py)\n", path);
        fail();
    }
    char magic[4];
    assert_int_equal(fread(magic, 1, 4, f), 4);
    assert_memory_equal(magic, "CTFX", 4);
    assert_int_equal(rd32(f), 1);
    memset(fx, 0, sizeof *fx);
    fx->count = (int)rd32(f);
    assert_true(fx->count <= MAXT);
    for (int i = 0; i < fx->count; i++) {
        struct fx_tensor *t = &fx->t[i];
        uint32_t nl = rd32(f);
        assert_true(nl < sizeof t->name);
        assert_int_equal(fread(t->name, 1, nl, f), nl);
        t->dtype = (int)rd32(f);
        uint32_t nd = rd32(f);
        assert_true(nd >= 1 && nd <= 4);
        t->n = 1;
        for (uint32_t d = 0; d < nd; d++)
            t->n *= rd32(f);
        t->data = malloc(t->n * 4);
        assert_non_null(t->data);
        assert_int_equal(fread(t->data, 4, t->n, f), t->n);
    }
    fclose(f);
}

static void fx_free(struct fixture *fx)
{
    for (int i = 0; i < fx->count; i++)
        free(fx->t[i].data);
}

static const struct fx_tensor *fx_find(const struct fixture *fx, const char *name)
{
    for (int i = 0; i < fx->count; i++)
        if (!strcmp(fx->t[i].name, name))
            return &fx->t[i];
    return NULL;
}

static const struct fx_tensor *fx_get(const struct fixture *fx, const char *name)
{
    const struct fx_tensor *t = fx_find(fx, name);
    if (t)
        return t;
    print_error("fixture has no tensor '%s'\n", name);
    fail();
    return NULL;
}

/* The key third of each attention's qkv bias has a gradient that is zero
 * in exact arithmetic (it adds one constant to every score of a softmax
 * row), so both frameworks hold rounding noise there, and which elements
 * are noise and which exactly zero depends on the CPU's BLAS kernels; Adam
 * turns noise into full-size steps of either sign, and LAMB's per-tensor
 * norm carries them into the rest of the bias. Before each optimizer step
 * this test and the fixture's script (scripts/make_torch_fixtures.py,
 * zero_key_bias_grads) set it to the exact zero. CPU backend: the
 * gradients are host memory. */
static void zero_key_bias_grads(struct kern_model *m)
{
    for (int i = 0; i < m->ntensors; i++) {
        const struct kern_tensor *ts = &m->tensors[i];
        size_t len = strlen(ts->name);
        if (len >= 13 && !strcmp(ts->name + len - 13, "attn.qkv.bias"))
            memset(m->grads + ts->off + ts->numel / 3, 0, ts->numel / 3 * sizeof(float));
    }
}

static void close_enough(const char *what, const float *got, const float *want, size_t n,
                         double atol, double rtol)
{
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) - (atol + rtol * fabs(want[i]));
        if (d > worst) {
            worst = d;
            wi = i;
        }
    }
    if (worst > 0) {
        print_error("%s: element %zu: got %.7g, PyTorch %.7g\n", what, wi, got[wi], want[wi]);
        fail();
    }
}

/* Loss, accuracy and gradient, then 3 optimizer steps of each kind. */
static void check(struct kern_model *m, const struct fixture *fx, const struct kern_batch *b)
{
    const struct fx_tensor *p0 = fx_get(fx, "params"), *g = fx_get(fx, "grads");
    const struct fx_tensor *loss = fx_get(fx, "loss"), *logits = fx_get(fx, "logits");
    assert_int_equal(p0->n, m->nparams);
    assert_int_equal(kern_model_set_params(m, p0->data), CM_OK);
    kern_model_zero_grad(m);
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_fwd_bwd(m, b, 1.0f, &ev), CM_OK);
    double want = ((float *)loss->data)[0];
    /* ALBERT with the sentence-order head: the MLM mean plus the SOP mean */
    double got = ev.loss_sum / ev.count + (ev.sop_count ? ev.sop_loss_sum / ev.sop_count : 0.0);
    const struct fx_tensor *sopl = fx_find(fx, "sop_logits");
    assert_int_equal(ev.sop_count, sopl ? b->B : 0);
    if (fabs(got - want) > 1e-5 * fabs(want)) {
        print_error("loss: got %.7f, PyTorch %.7f\n", got, want);
        fail();
    }
    /* accuracy from PyTorch's logits */
    struct kern_eval ev2 = {0};
    assert_int_equal(kern_model_eval(m, b, &ev2), CM_OK);
    long correct = 0;
    int V = m->nclass;
    size_t rows = logits->n / V;
    for (size_t i = 0; i < rows; i++) {
        if (b->targets[i] < 0)
            continue;
        const float *r = (const float *)logits->data + i * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[best])
                best = v;
        correct += best == b->targets[i];
    }
    assert_int_equal(ev2.correct, correct);
    if (sopl) { /* the sentence-order accuracy from PyTorch's logits */
        long sc = 0;
        for (int i = 0; i < b->B; i++) {
            const float *r = (const float *)sopl->data + 2 * i;
            sc += (r[1] > r[0]) == (b->sop[i] == 1);
        }
        assert_int_equal(ev2.sop_correct, sc);
        assert_int_equal(ev2.sop_count, b->B);
    }
    float *buf = malloc(m->nparams * sizeof(float));
    assert_non_null(buf);
    assert_int_equal(kern_model_get_grads(m, buf), CM_OK);
    close_enough("gradient", buf, g->data, m->nparams, 1e-5, 1e-3);

    const char *names[2] = {"adamw3", "lamb3"};
    for (int k = 0; k < 2; k++) {
        struct kern_optim_config oc;
        kern_optim_config_default(&oc);
        oc.kind = k ? KERN_OPT_LAMB : KERN_OPT_ADAMW;
        oc.lr = 1e-2f;
        oc.weight_decay = 0.01f;
        struct kern_optim *o = NULL;
        assert_int_equal(kern_optim_new(m->be, &oc, m->nparams, &o), CM_OK);
        assert_int_equal(kern_model_set_params(m, p0->data), CM_OK);
        for (int s = 0; s < 3; s++) {
            kern_model_zero_grad(m);
            assert_int_equal(kern_model_fwd_bwd(m, b, 1.0f, NULL), CM_OK);
            zero_key_bias_grads(m);
            assert_int_equal(kern_optim_step(o, m, NULL, NULL), CM_OK);
        }
        assert_int_equal(kern_model_get_params(m, buf), CM_OK);
        close_enough(names[k], buf, fx_get(fx, names[k])->data, m->nparams, 2e-5, 1e-3);
        kern_optim_free(o);
    }
    free(buf);
}

static void test_mlp(void **state)
{
    (void)state;
    struct fixture fx;
    fx_load("mlp.bin", &fx);
    const int *dims = fx_get(&fx, "config")->data;
    struct kern_mlp_config c = {.in_dim = dims[0], .nhidden = 2, .hidden = {dims[1], dims[2]},
                                .nclass = dims[3]};
    struct kern_model *m = NULL;
    assert_int_equal(kern_mlp_new(kern_backend_cpu(), &c, 6, 1, &m), CM_OK);
    struct kern_batch b = {.B = 6, .x = fx_get(&fx, "x")->data, .targets = fx_get(&fx, "y")->data};
    check(m, &fx, &b);
    kern_model_free(m);
    fx_free(&fx);
}

static void tfm(const char *file, enum kern_model_kind kind)
{
    struct fixture fx;
    fx_load(file, &fx);
    const struct fx_tensor *cft = fx_get(&fx, "config");
    const int *cf = cft->data;
    struct kern_tfm_config c = {.kind = kind, .vocab = cf[0], .max_T = cf[1], .n_layer = cf[2],
                                .n_head = cf[3], .d_model = cf[4], .d_embed = cf[5],
                                .d_ff = cf[6], .share_layers = cf[7]};
    if (cft->n >= 10) {
        c.post_ln = cf[8];
        c.sop = cf[9];
    }
    const struct fx_tensor *tok = fx_get(&fx, "tokens");
    struct kern_model *m = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &c, 2, 1, &m), CM_OK);
    struct kern_batch b = {.B = 2, .T = (int)(tok->n / 2), .tokens = tok->data,
                           .targets = fx_get(&fx, "targets")->data};
    if (c.sop) {
        b.segments = fx_get(&fx, "segments")->data;
        b.sop = fx_get(&fx, "sop")->data;
    }
    check(m, &fx, &b);
    kern_model_free(m);
    fx_free(&fx);
}

static void test_gpt(void **state)
{
    (void)state;
    tfm("gpt.bin", KERN_MODEL_GPT);
}

static void test_albert(void **state)
{
    (void)state;
    tfm("albert.bin", KERN_MODEL_ALBERT);
}

/* ALBERT as published: segment embeddings, post-LN, the sentence-order head */
static void test_albert_sop(void **state)
{
    (void)state;
    tfm("albert_sop.bin", KERN_MODEL_ALBERT);
}

int main(void)
{
    kern_cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_albert),
        cmocka_unit_test(test_albert_sop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
