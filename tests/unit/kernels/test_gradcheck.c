/* Finite-difference gradient checks on the CPU backend: every op that has a
 * backward, and every model (MLP, GPT, ALBERT with and without layer
 * sharing). Each op is wrapped in a scalar loss L = sum(out * R) with a fixed
 * random R, so dL/dout = R; the analytic gradient of each checked input
 * coordinate must match the central difference (L(x+h) - L(x-h)) / 2h.
 * Models are checked along random directions d over the whole flat
 * parameter buffer: g . d against the difference quotient. */
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
#include "kern_expert.h"
#include "kern_model.h"

static uint64_t g_rng = 12345;

static void randn(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = s * kern_rng_normal(&g_rng);
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* The loss an op check evaluates: runs the op forward on the current inputs
 * and returns sum(out * R). */
typedef double (*loss_fn)(void *ctx);

/* Checks analytic gradient ga of x (n) against central differences on up to
 * 24 coordinates spread over x. */
static void fd_check(const char *what, loss_fn f, void *ctx, float *x, const float *ga, size_t n)
{
    const float h = 1e-2f;
    size_t stride = n > 24 ? n / 24 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = x[i];
        x[i] = keep + h;
        double lp = f(ctx);
        x[i] = keep - h;
        double lm = f(ctx);
        x[i] = keep;
        double num = (lp - lm) / (2.0 * h);
        double tol = 2e-3 + 2e-2 * fabs(num);
        if (fabs(num - ga[i]) > tol) {
            print_error("%s: coordinate %zu: analytic %.6f, numeric %.6f\n", what, i, ga[i], num);
            fail();
        }
    }
}

/* ---- matmul ---- */
enum { MN = 5, MC = 7, MOC = 6 };
struct mm_ctx {
    float inp[MN * MC], w[MOC * MC], b[MOC], out[MN * MOC], R[MN * MOC];
};

static double mm_loss(void *p)
{
    struct mm_ctx *c = p;
    kern_backend_cpu()->matmul_fwd(c->out, c->inp, c->w, c->b, MN, MC, MOC);
    return dot(c->out, c->R, MN * MOC);
}

static void test_matmul(void **state)
{
    (void)state;
    const struct kern_backend *be = kern_backend_cpu();
    struct mm_ctx c;
    randn(c.inp, MN * MC, 1);
    randn(c.w, MOC * MC, 1);
    randn(c.b, MOC, 1);
    randn(c.R, MN * MOC, 1);
    float dinp[MN * MC] = {0}, dw[MOC * MC] = {0}, db[MOC] = {0};
    be->matmul_bwd(dinp, dw, db, c.R, c.inp, c.w, MN, MC, MOC);
    fd_check("matmul dinp", mm_loss, &c, c.inp, dinp, MN * MC);
    fd_check("matmul dw", mm_loss, &c, c.w, dw, MOC * MC);
    fd_check("matmul db", mm_loss, &c, c.b, db, MOC);
    /* accumulation: a second backward doubles the gradients */
    float dw2[MOC * MC];
    memcpy(dw2, dw, sizeof dw);
    be->matmul_bwd(NULL, dw2, NULL, c.R, c.inp, c.w, MN, MC, MOC);
    for (int i = 0; i < MOC * MC; i++)
        assert_float_equal(dw2[i], 2 * dw[i], 1e-4);
}

/* ---- elementwise activations ---- */
enum { AN = 40 };
struct act_ctx {
    int act; /* 0 relu, 1 gelu, 2 tanh */
    float x[AN], out[AN], R[AN];
};

static double act_loss(void *p)
{
    struct act_ctx *c = p;
    if (c->act == 1)
        kern_backend_cpu()->gelu_fwd(c->out, c->x, AN);
    else if (c->act == 2)
        kern_backend_cpu()->tanh_fwd(c->out, c->x, AN);
    else
        kern_backend_cpu()->relu_fwd(c->out, c->x, AN);
    return dot(c->out, c->R, AN);
}

static void test_activations(void **state)
{
    (void)state;
    static const char *const name[] = {"relu", "gelu", "tanh"};
    for (int act = 0; act <= 2; act++) {
        struct act_ctx c = {.act = act};
        randn(c.x, AN, 2);
        /* keep ReLU inputs away from the kink, where differences are undefined */
        for (int i = 0; i < AN; i++)
            if (fabsf(c.x[i]) < 0.05f)
                c.x[i] = 0.3f;
        randn(c.R, AN, 1);
        float dx[AN] = {0};
        if (act == 1)
            kern_backend_cpu()->gelu_bwd(dx, c.x, c.R, AN);
        else if (act == 2)
            kern_backend_cpu()->tanh_bwd(dx, c.x, c.R, AN);
        else
            kern_backend_cpu()->relu_bwd(dx, c.x, c.R, AN);
        fd_check(name[act], act_loss, &c, c.x, dx, AN);
    }
}

/* ---- layernorm ---- */
enum { LN_N = 4, LN_C = 9 };
struct ln_ctx {
    float x[LN_N * LN_C], w[LN_C], b[LN_C], out[LN_N * LN_C], R[LN_N * LN_C], mean[LN_N],
        rstd[LN_N];
};

static double ln_loss(void *p)
{
    struct ln_ctx *c = p;
    kern_backend_cpu()->layernorm_fwd(c->out, c->mean, c->rstd, c->x, c->w, c->b, LN_N, LN_C);
    return dot(c->out, c->R, LN_N * LN_C);
}

static void test_layernorm(void **state)
{
    (void)state;
    struct ln_ctx c;
    randn(c.x, LN_N * LN_C, 1);
    randn(c.w, LN_C, 1);
    randn(c.b, LN_C, 1);
    randn(c.R, LN_N * LN_C, 1);
    ln_loss(&c);
    float dx[LN_N * LN_C] = {0}, dw[LN_C] = {0}, db[LN_C] = {0};
    kern_backend_cpu()->layernorm_bwd(dx, dw, db, c.R, c.x, c.w, c.mean, c.rstd, LN_N, LN_C);
    fd_check("layernorm dx", ln_loss, &c, c.x, dx, LN_N * LN_C);
    fd_check("layernorm dw", ln_loss, &c, c.w, dw, LN_C);
    fd_check("layernorm db", ln_loss, &c, c.b, db, LN_C);
}

/* ---- embedding ---- */
enum { EB = 2, ET = 3, EC = 4, EV = 5 };
struct emb_ctx {
    int tok[EB * ET];
    float wte[EV * EC], wpe[ET * EC], out[EB * ET * EC], R[EB * ET * EC];
};

static double emb_loss(void *p)
{
    struct emb_ctx *c = p;
    kern_backend_cpu()->embed_fwd(c->out, c->tok, c->wte, c->wpe, EB, ET, EC);
    return dot(c->out, c->R, EB * ET * EC);
}

static void test_embedding(void **state)
{
    (void)state;
    struct emb_ctx c = {.tok = {1, 3, 1, 4, 0, 1}};
    randn(c.wte, EV * EC, 1);
    randn(c.wpe, ET * EC, 1);
    randn(c.R, EB * ET * EC, 1);
    float dwte[EV * EC] = {0}, dwpe[ET * EC] = {0};
    kern_backend_cpu()->embed_bwd(dwte, dwpe, c.R, c.tok, EB, ET, EC);
    fd_check("embed dwte", emb_loss, &c, c.wte, dwte, EV * EC);
    fd_check("embed dwpe", emb_loss, &c, c.wpe, dwpe, ET * EC);
}

/* ---- attention ---- */
enum { AB = 2, AT = 4, AC = 6, ANH = 2 };
struct att_ctx {
    int causal;
    float qkv[AB * AT * 3 * AC], out[AB * AT * AC], R[AB * AT * AC];
    float pre[AB * ANH * AT * AT], att[AB * ANH * AT * AT];
};

static double att_loss(void *p)
{
    struct att_ctx *c = p;
    kern_backend_cpu()->attention_fwd(c->out, c->pre, c->att, c->qkv, AB, AT, AC, ANH, c->causal);
    return dot(c->out, c->R, AB * AT * AC);
}

static void test_attention(void **state)
{
    (void)state;
    for (int causal = 0; causal <= 1; causal++) {
        struct att_ctx c = {.causal = causal};
        randn(c.qkv, sizeof c.qkv / sizeof(float), 1);
        randn(c.R, AB * AT * AC, 1);
        att_loss(&c);
        float dqkv[AB * AT * 3 * AC] = {0}, dpre[AB * ANH * AT * AT], datt[AB * ANH * AT * AT];
        kern_backend_cpu()->attention_bwd(dqkv, dpre, datt, c.R, c.qkv, c.att, AB, AT, AC, ANH,
                                          causal);
        fd_check(causal ? "causal attention" : "attention", att_loss, &c, c.qkv, dqkv,
                 sizeof dqkv / sizeof(float));
        if (causal) {
            /* position 0 sees only itself: its output is v at position 0 */
            for (int i = 0; i < AC / ANH; i++)
                assert_float_equal(c.out[i], c.qkv[2 * AC + i], 1e-6);
        }
    }
}

/* ---- cross-entropy ---- */
enum { XN = 4, XV = 5 };
struct xent_ctx {
    int tgt[XN];
    float logits[XN * XV], probs[XN * XV], losses[XN];
};

static double xent_loss(void *p)
{
    struct xent_ctx *c = p;
    kern_backend_cpu()->xent_fwd(c->losses, c->probs, c->logits, c->tgt, XN, XV);
    double s = 0;
    for (int i = 0; i < XN; i++)
        s += c->losses[i];
    return s;
}

static void test_xent(void **state)
{
    (void)state;
    struct xent_ctx c = {.tgt = {2, -1, 0, 4}};
    randn(c.logits, XN * XV, 2);
    xent_loss(&c);
    assert_float_equal(c.losses[1], 0.0f, 0.0f);
    float d[XN * XV] = {0};
    kern_backend_cpu()->xent_bwd(d, c.probs, c.tgt, 1.0f, XN, XV);
    fd_check("xent", xent_loss, &c, c.logits, d, XN * XV);
    for (int v = 0; v < XV; v++)
        assert_float_equal(d[XV + v], 0.0f, 0.0f); /* ignored row */
}

/* ---- models: directional derivative over the flat buffer ---- */

static double model_loss(struct kern_model *m, const struct kern_batch *b)
{
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_eval(m, b, &ev), CM_OK);
    return ev.count ? ev.loss_sum / ev.count : 0.0;
}

static void check_model(const char *what, struct kern_model *m, const struct kern_batch *b)
{
    size_t n = m->nparams;
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *d = malloc(n * sizeof(float)), *q = malloc(n * sizeof(float));
    assert_non_null(p);
    assert_non_null(g);
    assert_non_null(d);
    assert_non_null(q);
    kern_model_zero_grad(m);
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_fwd_bwd(m, b, 1.0f, &ev), CM_OK);
    assert_true(ev.count > 0);
    assert_int_equal(kern_model_get_grads(m, g), CM_OK);
    assert_int_equal(kern_model_get_params(m, p), CM_OK);
    for (int k = 0; k < 3; k++) {
        randn(d, n, 1);
        double dn = sqrt(dot(d, d, n));
        for (size_t i = 0; i < n; i++)
            d[i] /= (float)dn;
        double ana = dot(g, d, n);
        const float h = 2e-3f;
        for (size_t i = 0; i < n; i++)
            q[i] = p[i] + h * d[i];
        kern_model_set_params(m, q);
        double lp = model_loss(m, b);
        for (size_t i = 0; i < n; i++)
            q[i] = p[i] - h * d[i];
        kern_model_set_params(m, q);
        double lm = model_loss(m, b);
        kern_model_set_params(m, p);
        double num = (lp - lm) / (2.0 * h);
        if (fabs(num - ana) > 1e-3 + 3e-2 * fabs(num)) {
            print_error("%s: direction %d: analytic %.6g numeric %.6g\n", what, k, ana, num);
            fail();
        }
    }
    free(p);
    free(g);
    free(d);
    free(q);
}

static void test_mlp_grad(void **state)
{
    (void)state;
    struct kern_mlp_config c = {.in_dim = 12, .nhidden = 2, .hidden = {10, 8}, .nclass = 5};
    struct kern_model *m = NULL;
    assert_int_equal(kern_mlp_new(kern_backend_cpu(), &c, 6, 7, &m), CM_OK);
    assert_int_equal(m->nparams, kern_mlp_param_count(&c));
    float x[6 * 12];
    randn(x, 6 * 12, 1);
    int y[6] = {0, 4, 2, -1, 1, 3};
    struct kern_batch b = {.B = 6, .x = x, .targets = y};
    check_model("mlp", m, &b);
    /* a wrong target is refused and changes nothing */
    int bad[6] = {0, 5, 0, 0, 0, 0};
    struct kern_batch bb = {.B = 6, .x = x, .targets = bad};
    assert_int_equal(kern_model_fwd_bwd(m, &bb, 1.0f, NULL), CM_EINVAL);
    struct kern_batch big = {.B = 7, .x = x, .targets = y};
    assert_int_equal(kern_model_fwd_bwd(m, &big, 1.0f, NULL), CM_EINVAL);
    kern_model_free(m);
}

static void tfm_check(enum kern_model_kind kind, int share, const char *what)
{
    struct kern_tfm_config c = {.kind = kind, .vocab = 11, .max_T = 6, .n_layer = 2, .n_head = 2,
                                .d_model = 8, .d_embed = kind == KERN_MODEL_ALBERT ? 4 : 8,
                                .d_ff = 16, .share_layers = share};
    struct kern_model *m = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &c, 2, 99, &m), CM_OK);
    assert_int_equal(m->nparams, kern_tfm_param_count(&c));
    /* perturb LayerNorm and biases away from their 1/0 init so their
     * gradients are exercised in general position */
    float *p = malloc(m->nparams * sizeof(float));
    kern_model_get_params(m, p);
    for (size_t i = 0; i < m->nparams; i++)
        p[i] += 0.1f * kern_rng_normal(&g_rng);
    kern_model_set_params(m, p);
    free(p);
    int tok[12] = {1, 5, 7, 2, 9, 3, 4, 4, 0, 10, 6, 8};
    int tgt[12];
    for (int i = 0; i < 12; i++)
        tgt[i] = (i % 6 == 5) ? -1 : tok[(i + 1) % 12];
    if (kind == KERN_MODEL_ALBERT)
        for (int i = 0; i < 12; i++)
            tgt[i] = (i % 3 == 0) ? (tok[i] + 1) % 11 : -1;
    struct kern_batch b = {.B = 2, .T = 6, .tokens = tok, .targets = tgt};
    check_model(what, m, &b);
    /* a shorter sequence also works (T <= max_T) */
    struct kern_batch s = {.B = 2, .T = 3, .tokens = tok, .targets = tgt};
    check_model(what, m, &s);
    int badtok[12];
    memcpy(badtok, tok, sizeof tok);
    badtok[4] = 11;
    struct kern_batch bb = {.B = 2, .T = 6, .tokens = badtok, .targets = tgt};
    assert_int_equal(kern_model_fwd_bwd(m, &bb, 1.0f, NULL), CM_EINVAL);
    kern_model_free(m);
}

static void test_gpt_grad(void **state)
{
    (void)state;
    tfm_check(KERN_MODEL_GPT, 0, "gpt");
}

static void test_albert_grad(void **state)
{
    (void)state;
    tfm_check(KERN_MODEL_ALBERT, 1, "albert shared");
    tfm_check(KERN_MODEL_ALBERT, 0, "albert unshared");
}

/* ---- expert block: L = sum(y * R) ---- */
enum { XPN = 3, XPC = 6, XPF = 10 };
struct xp_ctx {
    struct kern_expert *e;
    float x[XPN * XPC], y[XPN * XPC], R[XPN * XPC];
};

static double xp_loss(void *p)
{
    struct xp_ctx *c = p;
    assert_int_equal(kern_expert_forward(c->e, c->x, XPN, c->y), CM_OK);
    return dot(c->y, c->R, XPN * XPC);
}

static void test_expert_grad(void **state)
{
    (void)state;
    struct xp_ctx c;
    assert_int_equal(kern_expert_new(kern_backend_cpu(), XPC, XPF, XPN, 5, &c.e), CM_OK);
    struct kern_model *m = kern_expert_model(c.e);
    randn(c.x, XPN * XPC, 1);
    randn(c.R, XPN * XPC, 1);
    /* general position for LayerNorm and biases */
    float *p = m->params;
    for (size_t i = 0; i < m->nparams; i++)
        p[i] += 0.1f * kern_rng_normal(&g_rng);
    float dx[XPN * XPC];
    kern_model_zero_grad(m);
    assert_int_equal(kern_expert_backward(c.e, c.x, c.R, XPN, dx), CM_OK);
    fd_check("expert dx", xp_loss, &c, c.x, dx, XPN * XPC);
    /* the CPU backend's parameters are host memory: perturb them in place */
    float *g = malloc(m->nparams * sizeof(float));
    assert_non_null(g);
    assert_int_equal(kern_model_get_grads(m, g), CM_OK);
    fd_check("expert params", xp_loss, &c, m->params, g, m->nparams);
    /* a second backward accumulates */
    assert_int_equal(kern_expert_backward(c.e, c.x, c.R, XPN, dx), CM_OK);
    for (size_t i = 0; i < m->nparams; i++)
        assert_float_equal(m->grads[i], 2 * g[i], 1e-4 * (1 + fabsf(g[i])));
    /* garbage from a peer is refused */
    c.x[4] = NAN;
    assert_int_equal(kern_expert_forward(c.e, c.x, XPN, c.y), CM_EINVAL);
    assert_int_equal(kern_expert_forward(c.e, c.R, XPN + 1, c.y), CM_EINVAL);
    free(g);
    kern_expert_free(c.e);
}

int main(void)
{
    kern_cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_activations),
        cmocka_unit_test(test_layernorm),    cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_attention),    cmocka_unit_test(test_xent),
        cmocka_unit_test(test_mlp_grad),     cmocka_unit_test(test_gpt_grad),
        cmocka_unit_test(test_albert_grad),  cmocka_unit_test(test_expert_grad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
