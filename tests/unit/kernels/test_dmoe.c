/* The DMoE model (kernels/kern_dmoe.h) with local experts on the CPU:
 * finite-difference gradient checks of trunk, gating heads, head and inputs
 * with every expert answering, with experts that fail forward, and with all
 * of a sample's experts failing; an expert's NaN counts as a failure and
 * never reaches the parameters; local experts update on backward only, one
 * call per expert per batch, dead experts are never chosen and injected
 * faults come at the configured rate; a broken expert implementation
 * (uid off the grid, an expert twice for one sample, an error from a call)
 * is an error that changes nothing. The tests drive the model through a
 * wrapper around kern_dmoe_local, the way a networked implementation would
 * plug in. */
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
#include "kern_dmoe.h"
#include "kern_expert.h"
#include "kern_model.h"

static uint64_t g_rng = 4242;

static void randn(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = s * kern_rng_normal(&g_rng);
}

/* ---- a wrapper implementation around the local experts ---- */
struct wrap {
    struct kern_dmoe_experts in;
    uint64_t sel_hash;   /* FNV-1a of the last selection */
    int bad_select;      /* 1: a coordinate off the grid; 2: an expert twice in sample 0 */
    int fwd_error, bwd_error; /* return this from the call */
    int nan_fwd[2], nan_bwd[2]; /* uid whose answer gets a NaN; [0] = -1: none */
    long fwd_calls, bwd_calls, expert_calls;
    int last_nexp, last_nrows, route_ok;
};

static int w_select(void *ctx, const float *s, int B, int d, int M, int k, int *uids)
{
    struct wrap *w = ctx;
    int rc = w->in.select(w->in.ctx, s, B, d, M, k, uids);
    if (rc)
        return rc;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < B * k * d; i++)
        h = (h ^ (uint64_t)(uids[i] + 7)) * 1099511628211ULL;
    w->sel_hash = h;
    if (w->bad_select == 1)
        uids[0] = M;
    if (w->bad_select == 2 && k > 1)
        memcpy(uids + d, uids, sizeof(int) * d);
    return CM_OK;
}

/* Every expert appears once in the route and owns a contiguous row range. */
static int route_valid(const struct kern_dmoe_route *r)
{
    if (r->start[0] != 0 || r->start[r->nexp] != r->nrows)
        return 0;
    for (int e = 0; e < r->nexp; e++) {
        if (r->start[e + 1] <= r->start[e])
            return 0;
        for (int f = 0; f < e; f++)
            if (!memcmp(r->uid + e * r->d, r->uid + f * r->d, sizeof(int) * r->d))
                return 0;
    }
    return 1;
}

static int is_uid(const struct kern_dmoe_route *r, int e, const int *u)
{
    return u[0] >= 0 && !memcmp(r->uid + e * r->d, u, sizeof(int) * r->d);
}

static int w_forward(void *ctx, const struct kern_dmoe_route *r, const float *x, float *y,
                     uint8_t *ok)
{
    struct wrap *w = ctx;
    w->fwd_calls++;
    w->expert_calls += r->nexp;
    w->last_nexp = r->nexp;
    w->last_nrows = r->nrows;
    w->route_ok = route_valid(r);
    if (w->fwd_error)
        return w->fwd_error;
    int rc = w->in.forward(w->in.ctx, r, x, y, ok);
    for (int e = 0; e < r->nexp; e++)
        if (ok[e] && is_uid(r, e, w->nan_fwd))
            y[(size_t)r->start[e] * r->C + 1] = NAN;
    return rc;
}

static int w_backward(void *ctx, const struct kern_dmoe_route *r, const float *x,
                      const float *dy, float *dx, uint8_t *ok)
{
    struct wrap *w = ctx;
    w->bwd_calls++;
    if (w->bwd_error)
        return w->bwd_error;
    int rc = w->in.backward(w->in.ctx, r, x, dy, dx, ok);
    for (int e = 0; e < r->nexp; e++)
        if (ok[e] && is_uid(r, e, w->nan_bwd))
            dx[(size_t)r->start[e] * r->C] = NAN;
    return rc;
}

/* ---- a small model ---- */
enum { B = 6, IN = 10, C = 8, F = 12, GD = 2, GM = 3, K = 3, V = 5 };

struct fix {
    struct kern_dmoe_local *loc;
    struct wrap w;
    struct kern_dmoe_experts ex;
    struct kern_model *m;
    float x[B * IN];
    int y[B];
    struct kern_batch b;
};

static void fix_init(struct fix *f, int frozen, float fail_prob)
{
    memset(f, 0, sizeof *f);
    g_rng = 4242; /* every fixture starts from the same model and batch */
    struct kern_dmoe_local_config lc = {.d = GD, .M = GM, .C = C, .F = F, .max_rows = B,
                                        .fail_prob = fail_prob, .seed = 99};
    kern_optim_config_default(&lc.opt);
    lc.opt.lr = 1e-2f;
    assert_int_equal(kern_dmoe_local_new(kern_backend_cpu(), &lc, &f->loc), CM_OK);
    kern_dmoe_local_set_frozen(f->loc, frozen);
    kern_dmoe_local_experts(f->loc, &f->w.in);
    f->w.nan_fwd[0] = f->w.nan_bwd[0] = -1;
    f->ex = (struct kern_dmoe_experts){&f->w, w_select, w_forward, w_backward};
    struct kern_dmoe_config c = {.in_dim = IN, .ntrunk = 2, .trunk = {12, C}, .grid_d = GD,
                                 .grid_m = GM, .k = K, .nclass = V};
    assert_int_equal(kern_dmoe_new(kern_backend_cpu(), &c, B, 5, &f->ex, &f->m), CM_OK);
    assert_int_equal(f->m->nparams, kern_dmoe_param_count(&c));
    assert_int_equal(kern_dmoe_set_input_grad(f->m, 1), CM_OK);
    /* the gate's bias starts at 0; give it some spread so scores differ
     * between experts by more than the finite-difference step */
    float *p = malloc(sizeof(float) * f->m->nparams);
    assert_non_null(p);
    assert_int_equal(kern_model_get_params(f->m, p), CM_OK);
    const struct kern_tensor *gb = kern_model_tensor(f->m, "gate.bias");
    assert_non_null(gb);
    randn(p + gb->off, gb->numel, 1.0f);
    assert_int_equal(kern_model_set_params(f->m, p), CM_OK);
    free(p);
    randn(f->x, B * IN, 1.0f);
    static const int y[B] = {0, 4, 2, -1, 1, 3};
    memcpy(f->y, y, sizeof y);
    f->b = (struct kern_batch){.B = B, .x = f->x, .targets = f->y};
}

static void fix_cleanup(struct fix *f)
{
    kern_model_free(f->m);
    kern_dmoe_local_free(f->loc);
}

static double mean_loss(struct fix *f, uint64_t *sel)
{
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_eval(f->m, &f->b, &ev), CM_OK);
    assert_true(ev.count > 0);
    *sel = f->w.sel_hash;
    return ev.loss_sum / ev.count;
}

/* Central differences on up to 12 coordinates of x (n), against the
 * analytic ga. A coordinate whose perturbation changes the top-k choice is
 * not differentiable there and is skipped; at most a third may be. */
static void fd_coords(struct fix *f, const char *what, float *x, const float *ga, size_t n,
                      int (*set)(struct fix *, const float *), float *full, const float *base)
{
    const float h = 1e-3f;
    size_t stride = n > 12 ? n / 12 : 1;
    int checked = 0, skipped = 0;
    uint64_t sel0, selp, selm;
    (void)mean_loss(f, &sel0);
    for (size_t i = 0; i < n; i += stride) {
        float keep = x[i];
        x[i] = keep + h;
        if (set)
            assert_int_equal(set(f, full), CM_OK);
        double lp = mean_loss(f, &selp);
        x[i] = keep - h;
        if (set)
            assert_int_equal(set(f, full), CM_OK);
        double lm = mean_loss(f, &selm);
        x[i] = keep;
        if (set)
            assert_int_equal(set(f, base), CM_OK);
        if (selp != sel0 || selm != sel0) {
            skipped++;
            continue;
        }
        checked++;
        double num = (lp - lm) / (2.0 * h);
        if (fabs(num - ga[i]) > 1e-3 + 3e-2 * fabs(num)) {
            print_error("%s: coordinate %zu: analytic %.6f, numeric %.6f\n", what, i, ga[i], num);
            fail();
        }
    }
    if (skipped > checked / 2) {
        print_error("%s: %d of %d coordinates changed the selection\n", what, skipped,
                    skipped + checked);
        fail();
    }
}

static int set_params(struct fix *f, const float *p) { return kern_model_set_params(f->m, p); }

/* Checks every tensor of the model and the inputs against finite
 * differences on the current batch and expert states. */
static void check_grads(struct fix *f, const char *what)
{
    size_t n = f->m->nparams;
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *gx = malloc(sizeof(float) * B * IN), *q = malloc(n * sizeof(float));
    assert_true(p && g && gx && q);
    kern_model_zero_grad(f->m);
    assert_int_equal(kern_model_fwd_bwd(f->m, &f->b, 1.0f, NULL), CM_OK);
    assert_int_equal(kern_model_get_grads(f->m, g), CM_OK);
    assert_int_equal(kern_model_get_params(f->m, p), CM_OK);
    assert_int_equal(kern_dmoe_get_input_grad(f->m, B, gx), CM_OK);
    memcpy(q, p, n * sizeof(float));
    for (int t = 0; t < f->m->ntensors; t++) {
        const struct kern_tensor *tt = &f->m->tensors[t];
        char name[160];
        snprintf(name, sizeof name, "%s: %s", what, tt->name);
        fd_coords(f, name, q + tt->off, g + tt->off, tt->numel, set_params, q, p);
    }
    char name[160];
    snprintf(name, sizeof name, "%s: inputs", what);
    fd_coords(f, name, f->x, gx, B * IN, NULL, NULL, NULL);
    free(p);
    free(g);
    free(gx);
    free(q);
}

static void test_grad_all_answer(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 1, 0.0f);
    check_grads(&f, "all answer");
    struct kern_dmoe_stats st;
    assert_int_equal(kern_dmoe_get_stats(f.m, &st), CM_OK);
    assert_true(st.batches > 0);
    assert_int_equal(st.failed_fwd, 0);
    assert_int_equal(st.failed_bwd, 0);
    assert_int_equal(st.empty, 0);
    assert_int_equal(st.answered, st.slots);
    /* one call per expert per batch, every (sample, slot) routed once */
    assert_true(f.w.route_ok);
    assert_int_equal(f.w.last_nrows, B * K);
    assert_true(f.w.last_nexp <= GM * GM);
    fix_cleanup(&f);
}

static void test_grad_failed_experts(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 1, 0.0f);
    int u1[GD] = {0, 0}, u2[GD] = {2, 1};
    assert_int_equal(kern_dmoe_local_set_state(f.loc, u1, KERN_DMOE_FAILING), CM_OK);
    assert_int_equal(kern_dmoe_local_set_state(f.loc, u2, KERN_DMOE_FAILING), CM_OK);
    check_grads(&f, "two failing");
    struct kern_dmoe_stats st;
    assert_int_equal(kern_dmoe_get_stats(f.m, &st), CM_OK);
    assert_true(st.failed_fwd > 0);
    assert_true(st.answered < st.slots);
    /* every expert failing: each sample passes h through, the gate learns
     * nothing, the trunk and head still get exact gradients */
    for (int a = 0; a < GM; a++)
        for (int b2 = 0; b2 < GM; b2++) {
            int u[GD] = {a, b2};
            assert_int_equal(kern_dmoe_local_set_state(f.loc, u, KERN_DMOE_FAILING), CM_OK);
        }
    check_grads(&f, "all failing");
    float *g = malloc(sizeof(float) * f.m->nparams);
    assert_non_null(g);
    assert_int_equal(kern_model_get_grads(f.m, g), CM_OK);
    const struct kern_tensor *gw = kern_model_tensor(f.m, "gate.weight");
    for (size_t i = 0; i < gw->numel; i++)
        assert_true(g[gw->off + i] == 0.0f);
    assert_int_equal(kern_dmoe_get_stats(f.m, &st), CM_OK);
    assert_true(st.empty >= B);
    free(g);
    fix_cleanup(&f);
}

static void get_grads(struct fix *f, float *g)
{
    kern_model_zero_grad(f->m);
    assert_int_equal(kern_model_fwd_bwd(f->m, &f->b, 1.0f, NULL), CM_OK);
    assert_int_equal(kern_model_get_grads(f->m, g), CM_OK);
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* A NaN in an expert's answer is the same as that expert failing: the
 * gradients equal those of a run where it failed, and stay finite. */
static void test_nan_is_failure(void **state)
{
    (void)state;
    struct fix a, b;
    fix_init(&a, 1, 0.0f);
    fix_init(&b, 1, 0.0f);
    size_t n = a.m->nparams;
    float *ga = malloc(n * sizeof(float)), *gb = malloc(n * sizeof(float));
    assert_true(ga && gb);
    for (int u0 = 0; u0 < GM; u0++) {
        int u[GD] = {u0, 1};
        /* forward NaN against a failing expert */
        memcpy(a.w.nan_fwd, u, sizeof u);
        assert_int_equal(kern_dmoe_local_set_state(b.loc, u, KERN_DMOE_FAILING), CM_OK);
        get_grads(&a, ga);
        get_grads(&b, gb);
        assert_true(all_finite(ga, n));
        assert_memory_equal(ga, gb, n * sizeof(float));
        a.w.nan_fwd[0] = -1;
        /* backward NaN against an expert that fails backward */
        memcpy(a.w.nan_bwd, u, sizeof u);
        assert_int_equal(kern_dmoe_local_set_state(b.loc, u, KERN_DMOE_FAILING_BWD), CM_OK);
        get_grads(&a, ga);
        get_grads(&b, gb);
        assert_true(all_finite(ga, n));
        assert_memory_equal(ga, gb, n * sizeof(float));
        a.w.nan_bwd[0] = -1;
        assert_int_equal(kern_dmoe_local_set_state(b.loc, u, KERN_DMOE_LIVE), CM_OK);
    }
    struct kern_dmoe_stats st;
    assert_int_equal(kern_dmoe_get_stats(a.m, &st), CM_OK);
    assert_true(st.nonfinite > 0);
    /* training with an expert that always answers NaN keeps every parameter
     * finite, the experts' included */
    kern_dmoe_local_set_frozen(a.loc, 0);
    int u[GD] = {1, 1};
    memcpy(a.w.nan_fwd, u, sizeof u);
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    struct kern_optim *opt = NULL;
    assert_int_equal(kern_optim_new(kern_backend_cpu(), &oc, n, &opt), CM_OK);
    for (int s = 0; s < 20; s++) {
        a.w.nan_bwd[0] = s % 2 ? 1 : -1; /* and every other step a NaN backward from (1,0) */
        a.w.nan_bwd[1] = 0;
        kern_model_zero_grad(a.m);
        assert_int_equal(kern_model_fwd_bwd(a.m, &a.b, 1.0f, NULL), CM_OK);
        assert_int_equal(kern_optim_step(opt, a.m, NULL, NULL), CM_OK);
    }
    assert_int_equal(kern_model_get_params(a.m, ga), CM_OK);
    assert_true(all_finite(ga, n));
    for (int u0 = 0; u0 < GM; u0++)
        for (int u1 = 0; u1 < GM; u1++) {
            int uu[GD] = {u0, u1};
            struct kern_model *em = kern_expert_model(kern_dmoe_local_expert(a.loc, uu));
            float *ep = malloc(em->nparams * sizeof(float));
            assert_non_null(ep);
            assert_int_equal(kern_model_get_params(em, ep), CM_OK);
            assert_true(all_finite(ep, em->nparams));
            free(ep);
        }
    kern_optim_free(opt);
    free(ga);
    free(gb);
    fix_cleanup(&a);
    fix_cleanup(&b);
}

static void test_local_experts(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 0, 0.0f);
    int dead[GD] = {1, 2};
    assert_int_equal(kern_dmoe_local_set_state(f.loc, dead, KERN_DMOE_DEAD), CM_OK);
    /* eval: no expert changes */
    struct kern_expert *e00 = NULL;
    long steps_before[GM * GM], total = 0;
    for (int i = 0; i < GM * GM; i++) {
        int u[GD] = {i % GM, i / GM};
        steps_before[i] = kern_dmoe_local_steps(f.loc, u);
        assert_int_equal(steps_before[i], 0);
    }
    int u00[GD] = {0, 0};
    e00 = kern_dmoe_local_expert(f.loc, u00);
    assert_non_null(e00);
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_eval(f.m, &f.b, &ev), CM_OK);
    assert_true(f.w.route_ok);
    long eval_calls = f.w.expert_calls;
    for (int i = 0; i < GM * GM; i++) {
        int u[GD] = {i % GM, i / GM};
        assert_int_equal(kern_dmoe_local_steps(f.loc, u), 0);
    }
    /* training: each expert that was called steps once per batch (one
     * backward call per expert per batch), the dead one never */
    for (int s = 0; s < 5; s++) {
        kern_model_zero_grad(f.m);
        assert_int_equal(kern_model_fwd_bwd(f.m, &f.b, 1.0f, NULL), CM_OK);
        assert_true(f.w.route_ok);
    }
    for (int i = 0; i < GM * GM; i++) {
        int u[GD] = {i % GM, i / GM};
        long st = kern_dmoe_local_steps(f.loc, u);
        assert_true(st >= 0 && st <= 5);
        total += st;
    }
    assert_int_equal(kern_dmoe_local_steps(f.loc, dead), 0);
    assert_true(total > 0);
    assert_int_equal(total, f.w.expert_calls - eval_calls); /* eval's calls had no backward */
    /* off-grid uids and bad knobs are refused */
    int off[GD] = {GM, 0};
    assert_int_equal(kern_dmoe_local_set_state(f.loc, off, KERN_DMOE_DEAD), CM_EINVAL);
    assert_null(kern_dmoe_local_expert(f.loc, off));
    assert_int_equal(kern_dmoe_local_set_fail_prob(f.loc, 1.0f), CM_EINVAL);
    assert_int_equal(kern_dmoe_local_set_fail_prob(f.loc, NAN), CM_EINVAL);
    fix_cleanup(&f);
}

/* With every cell but k live, every sample gets exactly those k; with
 * fewer than k live, the rest of the slots are empty. */
static void test_select_dead(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 1, 0.0f);
    for (int i = 0; i < GM * GM; i++) {
        int u[GD] = {i % GM, i / GM};
        if (i >= 2)
            assert_int_equal(kern_dmoe_local_set_state(f.loc, u, KERN_DMOE_DEAD), CM_OK);
    }
    struct kern_eval ev = {0};
    assert_int_equal(kern_model_eval(f.m, &f.b, &ev), CM_OK);
    assert_int_equal(f.w.last_nexp, 2);
    assert_int_equal(f.w.last_nrows, 2 * B);
    check_grads(&f, "two live cells, k = 3");
    fix_cleanup(&f);
}

static void test_fault_rate(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 1, 0.25f);
    for (int s = 0; s < 1000; s++) {
        struct kern_eval ev = {0};
        assert_int_equal(kern_model_eval(f.m, &f.b, &ev), CM_OK);
        assert_true(ev.loss_sum == ev.loss_sum);
    }
    struct kern_dmoe_stats st;
    assert_int_equal(kern_dmoe_get_stats(f.m, &st), CM_OK);
    double rate = (double)st.failed_fwd / (double)st.calls_fwd;
    print_message("fail_prob 0.25: %ld of %ld calls failed (%.3f)\n", st.failed_fwd,
                  st.calls_fwd, rate);
    assert_true(st.calls_fwd >= 2000);
    assert_true(rate > 0.22 && rate < 0.28);
    fix_cleanup(&f);
}

/* A broken implementation's answer is an error; the gradients and the
 * parameters stay as they were. */
static void test_bad_implementation(void **state)
{
    (void)state;
    struct fix f;
    fix_init(&f, 0, 0.0f);
    size_t n = f.m->nparams;
    float *p0 = malloc(n * sizeof(float)), *p1 = malloc(n * sizeof(float));
    float *g = malloc(n * sizeof(float));
    assert_true(p0 && p1 && g);
    assert_int_equal(kern_model_get_params(f.m, p0), CM_OK);
    struct { int sel, fe, be; } cases[] = {{1, 0, 0}, {2, 0, 0}, {0, CM_ETIMEOUT, 0},
                                           {0, 0, CM_ECONN}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f.w.bad_select = cases[i].sel;
        f.w.fwd_error = cases[i].fe;
        f.w.bwd_error = cases[i].be;
        kern_model_zero_grad(f.m);
        int rc = kern_model_fwd_bwd(f.m, &f.b, 1.0f, NULL);
        int want = cases[i].sel ? CM_EINVAL : cases[i].fe ? cases[i].fe : cases[i].be;
        assert_int_equal(rc, want);
        assert_int_equal(kern_model_get_grads(f.m, g), CM_OK);
        for (size_t j = 0; j < n; j++)
            assert_true(g[j] == 0.0f);
        assert_int_equal(kern_model_get_params(f.m, p1), CM_OK);
        assert_memory_equal(p0, p1, n * sizeof(float));
    }
    f.w.bad_select = f.w.fwd_error = f.w.bwd_error = 0;
    int bad_t[B] = {0, 5, 0, 0, 0, 0};
    struct kern_batch bb = {.B = B, .x = f.x, .targets = bad_t};
    assert_int_equal(kern_model_fwd_bwd(f.m, &bb, 1.0f, NULL), CM_EINVAL);
    struct kern_batch big = {.B = B + 1, .x = f.x, .targets = f.y};
    assert_int_equal(kern_model_fwd_bwd(f.m, &big, 1.0f, NULL), CM_EINVAL);
    /* bad configs */
    struct kern_dmoe_config c = {.in_dim = IN, .ntrunk = 1, .trunk = {C}, .grid_d = 2,
                                 .grid_m = 4, .k = 4, .nclass = V};
    const char *why = NULL;
    assert_int_equal(kern_dmoe_config_check(&c, &why), CM_OK);
    c.k = 0;
    assert_int_equal(kern_dmoe_config_check(&c, &why), CM_EINVAL);
    c.k = 4;
    c.grid_d = 8;
    c.grid_m = 65536;
    assert_int_equal(kern_dmoe_config_check(&c, &why), CM_EINVAL);
    c.grid_d = 2;
    c.grid_m = 4;
    c.ntrunk = 0;
    assert_int_equal(kern_dmoe_config_check(&c, &why), CM_EINVAL);
    struct kern_model *m = NULL;
    c.ntrunk = 1;
    struct kern_dmoe_experts none = {0};
    assert_int_equal(kern_dmoe_new(kern_backend_cpu(), &c, 4, 1, &none, &m), CM_EINVAL);
    assert_null(m);
    free(p0);
    free(p1);
    free(g);
    fix_cleanup(&f);
}

/* kern_dmoe_mem_need against what kern_dmoe_new really allocates on the
 * backend (the GPU start-up check relies on it; the experts are not in it). */
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
    struct kern_dmoe_local *loc = NULL;
    struct kern_dmoe_local_config lc = {.d = 2, .M = 4, .C = 16, .F = 8, .max_rows = 40};
    kern_optim_config_default(&lc.opt);
    assert_int_equal(kern_dmoe_local_new(kern_backend_cpu(), &lc, &loc), CM_OK);
    struct kern_dmoe_experts ex;
    kern_dmoe_local_experts(loc, &ex);
    struct kern_dmoe_config cs[] = {
        {.in_dim = 30, .ntrunk = 1, .trunk = {16}, .grid_d = 2, .grid_m = 4, .k = 2, .nclass = 7},
        {.in_dim = 9, .ntrunk = 3, .trunk = {50, 20, 16}, .grid_d = 2, .grid_m = 4, .k = 4,
         .nclass = 3},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        struct kern_model *m = NULL;
        g_alloc_bytes = 0;
        assert_int_equal(kern_dmoe_new(&counting, &cs[i], 40, 1, &ex, &m), CM_OK);
        struct kern_mem_need n;
        kern_dmoe_mem_need(&cs[i], 40, &n);
        assert_int_equal(n.params + n.grads + n.act, g_alloc_bytes);
        kern_model_free(m);
    }
    kern_dmoe_local_free(loc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_all_answer),
        cmocka_unit_test(test_grad_failed_experts),
        cmocka_unit_test(test_nan_is_failure),
        cmocka_unit_test(test_local_experts),
        cmocka_unit_test(test_select_dead),
        cmocka_unit_test(test_fault_rate),
        cmocka_unit_test(test_bad_implementation),
        cmocka_unit_test(test_mem_need),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
