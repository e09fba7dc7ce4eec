/* Asynchronous micro-batches of a DMoE trainer (agent/train/async.h; seed
 * 002_2b00836ea4b30f79.txt §3.3): frozen in-process experts (deterministic
 * answers) behind a wrapper that emulates a network wait on every select,
 * forward and backward by dropping the compute lock and sleeping, as the
 * remote experts do (agent/moe/remote.h):
 *   - equivalence: K = 1 and K = 4 micro-batches in flight give the same
 *     summed gradient and loss, bit for bit, as running them one after
 *     another on the master model;
 *   - the bound: never more than K micro-batches wait at once, and K do;
 *   - the point of it: with a 15 ms wait per call, K = 4 takes well under
 *     K = 1's time;
 *   - parameters: a micro-batch started with none in flight uses the
 *     master's current parameters;
 *   - bad input: CM_EBUSY past the bound, CM_ESTATE with none in flight,
 *     CM_EINVAL for a bad batch, nothing started. */
/* ct-timeout: 60 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/train/async.h"
#include "cm_err.h"
#include "kern_dmoe.h"

#define IN 12
#define NCLS 4
#define MB 8
#define NMB 16

struct wrap {
    struct kern_dmoe_experts local;
    pthread_mutex_t *compute; /* NULL: no lock to drop */
    int delay_ms;
    pthread_mutex_t mu;
    int waiting, max_waiting;
};

/* An emulated network wait: drop the compute lock, sleep, take it back. */
static void net_wait(struct wrap *w)
{
    if (!w->delay_ms)
        return;
    if (w->compute)
        pthread_mutex_unlock(w->compute);
    pthread_mutex_lock(&w->mu);
    if (++w->waiting > w->max_waiting)
        w->max_waiting = w->waiting;
    pthread_mutex_unlock(&w->mu);
    usleep((useconds_t)w->delay_ms * 1000);
    pthread_mutex_lock(&w->mu);
    w->waiting--;
    pthread_mutex_unlock(&w->mu);
    if (w->compute)
        pthread_mutex_lock(w->compute);
}

static int w_select(void *ctx, const float *scores, int B, int d, int M, int k, int *uids)
{
    struct wrap *w = ctx;
    net_wait(w);
    return w->local.select(w->local.ctx, scores, B, d, M, k, uids);
}

static int w_forward(void *ctx, const struct kern_dmoe_route *r, const float *x, float *y,
                     uint8_t *ok)
{
    struct wrap *w = ctx;
    net_wait(w);
    return w->local.forward(w->local.ctx, r, x, y, ok);
}

static int w_backward(void *ctx, const struct kern_dmoe_route *r, const float *x, const float *dy,
                      float *dx, uint8_t *ok)
{
    struct wrap *w = ctx;
    net_wait(w);
    return w->local.backward(w->local.ctx, r, x, dy, dx, ok);
}

struct env {
    struct kern_dmoe_config mc;
    struct kern_dmoe_local *loc;
    struct wrap w;
    struct kern_dmoe_experts ex;
    struct kern_model *master;
    float x[NMB][MB * IN];
    int32_t y[NMB][MB];
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    e->mc = (struct kern_dmoe_config){.in_dim = IN, .ntrunk = 1, .trunk = {8}, .grid_d = 2,
                                      .grid_m = 4, .k = 2, .nclass = NCLS};
    const struct kern_backend *be = kern_backend_cpu();
    struct kern_dmoe_local_config lc = {.d = 2, .M = 4, .C = 8, .F = 16, .max_rows = MB, .seed = 3};
    kern_optim_config_default(&lc.opt);
    assert_int_equal(kern_dmoe_local_new(be, &lc, &e->loc), CM_OK);
    kern_dmoe_local_set_frozen(e->loc, 1); /* deterministic answers: no updates */
    kern_dmoe_local_experts(e->loc, &e->w.local);
    pthread_mutex_init(&e->w.mu, NULL);
    e->ex = (struct kern_dmoe_experts){.ctx = &e->w, .select = w_select, .forward = w_forward,
                                       .backward = w_backward};
    assert_int_equal(kern_dmoe_new(be, &e->mc, MB, 11, &e->ex, &e->master), CM_OK);
    uint64_t r = 0x1234567;
    for (int b = 0; b < NMB; b++)
        for (int i = 0; i < MB; i++) {
            for (int j = 0; j < IN; j++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                e->x[b][i * IN + j] = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
            }
            e->y[b][i] = (int32_t)((b * 7 + i * 3) % NCLS);
        }
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    kern_model_free(e->master);
    kern_dmoe_local_free(e->loc);
    pthread_mutex_destroy(&e->w.mu);
    free(e);
    return 0;
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The reference: the micro-batches one after another on the master. */
static void sequential(struct env *e, float *sum, double *loss)
{
    size_t n = e->master->nparams;
    float *g = malloc(n * sizeof *g);
    memset(sum, 0, n * sizeof *sum);
    *loss = 0;
    e->w.compute = NULL;
    for (int b = 0; b < NMB; b++) {
        struct kern_batch kb = {.B = MB, .x = e->x[b], .targets = e->y[b]};
        struct kern_eval ev = {0};
        kern_model_zero_grad(e->master);
        assert_int_equal(kern_model_fwd_bwd(e->master, &kb, 0.5f, &ev), CM_OK);
        assert_int_equal(kern_model_get_grads(e->master, g), CM_OK);
        for (size_t i = 0; i < n; i++)
            sum[i] += g[i];
        *loss += ev.loss_sum;
    }
    free(g);
}

/* The micro-batches through K contexts, at most K in flight; the sums in
 * completion order (which is submission order). Returns the wall time. */
static double asynchronous(struct env *e, int K, float *sum, double *loss)
{
    struct kern_dmoe_experts ex[AGENT_ASYNC_MAX];
    for (int i = 0; i < K; i++)
        ex[i] = e->ex;
    struct agent_async_config c = {.be = kern_backend_cpu(), .dmoe = e->mc, .micro_batch = MB,
                                   .max_inflight = K};
    struct agent_async *a;
    assert_int_equal(agent_async_new(&c, ex, &a), CM_OK);
    e->w.compute = agent_async_lock(a);
    e->w.max_waiting = 0;
    size_t n = e->master->nparams;
    memset(sum, 0, n * sizeof *sum);
    *loss = 0;
    double t0 = mono_ms();
    int sub = 0;
    uint64_t want = 0;
    while (sub < NMB || agent_async_inflight(a) > 0) {
        while (sub < NMB && agent_async_inflight(a) < K) {
            assert_int_equal(agent_async_submit(a, e->master, e->x[sub], e->y[sub], MB, 0.5f), CM_OK);
            sub++;
        }
        if (sub < NMB) /* full: the bound refuses one more */
            assert_int_equal(agent_async_submit(a, e->master, e->x[sub], e->y[sub], MB, 0.5f),
                             CM_EBUSY);
        struct agent_async_done d;
        assert_int_equal(agent_async_next(a, &d), CM_OK);
        assert_int_equal(d.rc, CM_OK);
        assert_int_equal(d.B, MB);
        assert_true(d.seq == want);
        want++;
        for (size_t i = 0; i < n; i++)
            sum[i] += d.grad[i];
        *loss += d.ev.loss_sum;
    }
    double dt = mono_ms() - t0;
    struct agent_async_done d;
    assert_int_equal(agent_async_next(a, &d), CM_ESTATE);
    agent_async_free(a);
    e->w.compute = NULL;
    return dt;
}

static void test_equivalence(void **state)
{
    struct env *e = *state;
    size_t n = e->master->nparams;
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    double lref, lgot;
    e->w.delay_ms = 0;
    sequential(e, ref, &lref);
    int nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += ref[i] != 0;
    assert_true(nonzero > (int)n / 4); /* a real gradient, not zeros */
    e->w.delay_ms = 2; /* the waits interleave the contexts */
    for (int K = 1; K <= 4; K += 3) {
        asynchronous(e, K, got, &lgot);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&ref[i], &got[i], sizeof *got) != 0;
        if (diff)
            fprintf(stderr, "K=%d: %zu of %zu gradient entries differ\n", K, diff, n);
        assert_int_equal(diff, 0);
        assert_true(lgot == lref);
    }
    free(ref);
    free(got);
}

static void test_bound_and_overlap(void **state)
{
    struct env *e = *state;
    size_t n = e->master->nparams;
    float *got = malloc(n * sizeof *got);
    double loss;
    e->w.delay_ms = 15;
    double t1 = asynchronous(e, 1, got, &loss);
    assert_int_equal(e->w.max_waiting, 1);
    double t4 = asynchronous(e, 4, got, &loss);
    fprintf(stderr, "15 ms per call, %d micro-batches: K=1 %.0f ms, K=4 %.0f ms (%.2fx)\n", NMB,
            t1, t4, t1 / t4);
    assert_int_equal(e->w.max_waiting, 4); /* reached, never passed */
    assert_true(t4 < 0.6 * t1);
    e->w.delay_ms = 0;
    free(got);
}

/* A micro-batch started with none in flight uses the master's parameters
 * as they are then; bad input changes nothing. */
static void test_params_and_errors(void **state)
{
    struct env *e = *state;
    size_t n = e->master->nparams;
    struct kern_dmoe_experts ex[2] = {e->ex, e->ex};
    struct agent_async_config c = {.be = kern_backend_cpu(), .dmoe = e->mc, .micro_batch = MB,
                                   .max_inflight = 2};
    struct agent_async *a;
    struct agent_async_config bad = c;
    bad.max_inflight = 0;
    assert_int_equal(agent_async_new(&bad, ex, &a), CM_EINVAL);
    bad.max_inflight = AGENT_ASYNC_MAX + 1;
    assert_int_equal(agent_async_new(&bad, ex, &a), CM_EINVAL);
    assert_int_equal(agent_async_new(&c, ex, &a), CM_OK);
    e->w.compute = agent_async_lock(a);
    e->w.delay_ms = 0;
    struct agent_async_done d;
    assert_int_equal(agent_async_next(a, &d), CM_ESTATE);
    assert_int_equal(agent_async_submit(a, e->master, e->x[0], e->y[0], MB + 1, 1), CM_EINVAL);
    assert_int_equal(agent_async_submit(a, e->master, e->x[0], e->y[0], 0, 1), CM_EINVAL);
    assert_int_equal(agent_async_inflight(a), 0);

    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    assert_int_equal(kern_model_get_params(e->master, p), CM_OK);
    for (size_t i = 0; i < n; i++)
        p[i] *= 0.5f;
    assert_int_equal(kern_model_set_params(e->master, p), CM_OK);
    struct kern_batch kb = {.B = MB, .x = e->x[3], .targets = e->y[3]};
    struct kern_eval ev = {0};
    e->w.compute = NULL;
    kern_model_zero_grad(e->master);
    assert_int_equal(kern_model_fwd_bwd(e->master, &kb, 1, &ev), CM_OK);
    assert_int_equal(kern_model_get_grads(e->master, g), CM_OK);
    e->w.compute = agent_async_lock(a);
    assert_int_equal(agent_async_submit(a, e->master, e->x[3], e->y[3], MB, 1), CM_OK);
    assert_int_equal(agent_async_next(a, &d), CM_OK);
    assert_int_equal(d.rc, CM_OK);
    assert_memory_equal(d.grad, g, n * sizeof *g);
    assert_true(d.ev.loss_sum == ev.loss_sum);
    agent_async_free(a);
    e->w.compute = NULL;
    for (size_t i = 0; i < n; i++)
        p[i] *= 2.0f; /* exact: back to the setup's parameters */
    assert_int_equal(kern_model_set_params(e->master, p), CM_OK);
    free(p);
    free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equivalence),
        cmocka_unit_test(test_bound_and_overlap),
        cmocka_unit_test(test_params_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
