/* The expert host core and its client (agent/moe/moe_server.h,
 * moe_client.h) over real p2p hosts on loopback in one process: trainers
 * call forward and backward on served experts and get what
 * kern_expert_forward/backward compute directly (batched together, one
 * optimizer step per backward batch); backward without (or after) its
 * forward, unknown uid, wrong width, oversize and non-finite requests get
 * their errors and change nothing; kept inputs expire and are bounded;
 * failure injection; latency emulation (exponential delays of the answers,
 * seed 002 §4.1); a server stopped mid-batch or closed answers within the
 * caller's deadline; a lying server's answers are refused. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/moe/moe_client.h"
#include "agent/moe/moe_server.h"
#include "cm_err.h"
#include "kern_expert.h"
#include "kern_optim.h"
#include "moe/moe_msg.h"
#include "tests/harness/p2p_testkit.h"

#define C 8
#define F 16
#define SEED0 11
#define MAXB 16

struct env {
    uv_loop_t loop;
    struct p2p_tk tk;
    struct p2p_ctx *ctx;
    struct p2p_tk_peer ps, p1, p2;
    struct p2p_host *hs, *h1, *h2;
    struct moe_server *srv;
    struct sockaddr_storage addr;
};

struct res {
    int done, status;
    uint32_t n, c;
    float out[MAXB * C];
    int64_t at_ms;
};

static void on_res(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct res *r = arg;
    r->done = 1;
    r->status = status;
    r->n = n;
    r->c = c;
    r->at_ms = p2p_now_ms();
    if (status == CM_OK)
        memcpy(r->out, out, (size_t)n * c * sizeof(float));
}

static void run_until(struct env *e, int *flag, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (!*flag && p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
}

static void run_ms(struct env *e, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
}

static void env_start(struct env *e, const struct moe_server_config *cfg)
{
    uv_loop_init(&e->loop);
    assert_int_equal(p2p_tk_init(&e->tk, "moerun"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "server", "1", 3600, &e->ps), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "t1", "2", 3600, &e->p1), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "t2", "3", 3600, &e->p2), 0);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk)};
    assert_int_equal(p2p_ctx_new(&cc, &e->ctx), 0);
    assert_int_equal(moe_server_new(cfg, &e->loop, &e->srv), 0);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.0.0", C, F, SEED0), 0);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.0.1", C, F, SEED0 + 1), 0);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.0.1", C, F, 1), CM_EEXISTS);
    assert_int_equal(moe_server_add_expert(e->srv, "a b", C, F, 1), CM_EINVAL);
    assert_int_equal(moe_server_start(e->srv), 0);
    struct p2p_host_config hs = {.key = &e->ps.key, .token = e->ps.token, .listen_ip = "127.0.0.1",
                                 .on_request = moe_server_on_request, .arg = e->srv};
    struct p2p_host_config h1 = {.key = &e->p1.key, .token = e->p1.token};
    struct p2p_host_config h2 = {.key = &e->p2.key, .token = e->p2.token};
    assert_int_equal(p2p_host_new(e->ctx, &hs, &e->hs), 0);
    assert_int_equal(p2p_host_new(e->ctx, &h1, &e->h1), 0);
    assert_int_equal(p2p_host_new(e->ctx, &h2, &e->h2), 0);
    char s[64];
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(e->hs));
    assert_int_equal(p2p_addr_parse(s, &e->addr), 0);
}

static struct env *env_new(double fail_p, uint32_t wait_ms, size_t saved, uint32_t ttl)
{
    struct env *e = calloc(1, sizeof *e);
    struct moe_server_config cfg;
    moe_server_config_default(&cfg);
    cfg.max_batch = MAXB;
    cfg.max_wait_ms = wait_ms;
    cfg.fail_p = fail_p;
    cfg.optim.lr = 0.01f;
    if (saved)
        cfg.max_saved_bytes = saved;
    if (ttl)
        cfg.saved_ttl_ms = ttl;
    env_start(e, &cfg);
    return e;
}

static int teardown(void **state)
{
    struct env *e = *state;
    moe_server_stop(e->srv);
    if (e->hs)
        p2p_host_close(e->hs);
    p2p_host_close(e->h1);
    p2p_host_close(e->h2);
    moe_server_free(e->srv);
    p2p_ctx_free(e->ctx);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    p2p_tk_peer_cleanup(&e->ps);
    p2p_tk_peer_cleanup(&e->p1);
    p2p_tk_peer_cleanup(&e->p2);
    p2p_tk_cleanup(&e->tk);
    free(e);
    return 0;
}

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static void assert_close(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > 1e-5f * (1.0f + fabsf(b[i]))) {
            print_error("value %zu: %.8g vs %.8g\n", i, (double)a[i], (double)b[i]);
            fail();
        }
}

static int fwd(struct env *e, struct p2p_host *h, const char *uid, uint64_t fid, const float *x,
               uint32_t n, uint32_t c, struct res *r)
{
    memset(r, 0, sizeof *r);
    return moe_client_forward(h, (struct sockaddr *)&e->addr, e->ps.key.pub, uid, fid, x, n, c,
                              5000, on_res, r);
}

static int bwd(struct env *e, struct p2p_host *h, const char *uid, uint64_t fid, const float *dy,
               uint32_t n, struct res *r)
{
    memset(r, 0, sizeof *r);
    return moe_client_backward(h, (struct sockaddr *)&e->addr, e->ps.key.pub, uid, fid, dy, n, C,
                               5000, on_res, r);
}

static int wait_status(struct env *e, struct res *r)
{
    run_until(e, &r->done, 8000);
    assert_true(r->done);
    return r->status;
}

/* Two trainers, one batch each way; outputs, input gradients and the
 * update match the expert computed directly. */
static void test_matches_direct(void **state)
{
    struct env *e = *state = env_new(0, 300, 0, 0);
    struct kern_expert *ref;
    assert_int_equal(kern_expert_new(kern_backend_cpu(), C, F, MAXB, SEED0, &ref), 0);
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.lr = 0.01f;
    struct kern_optim *opt;
    assert_int_equal(kern_optim_new(kern_backend_cpu(), &oc, kern_expert_model(ref)->nparams, &opt),
                     0);
    float x[8 * C], dy[8 * C], y[8 * C], dx[8 * C];
    fill(x, sizeof x / 4, 1);
    fill(dy, sizeof dy / 4, 2);
    struct res r1, r2;
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 42, x, 3, C, &r1), 0);
    assert_int_equal(fwd(e, e->h2, "ffn.0.0", 42, x + 3 * C, 5, C, &r2), 0); /* same fid, other caller */
    assert_int_equal(wait_status(e, &r1), CM_OK);
    assert_int_equal(wait_status(e, &r2), CM_OK);
    assert_int_equal(kern_expert_forward(ref, x, 8, y), 0);
    assert_close(r1.out, y, 3 * C);
    assert_close(r2.out, y + 3 * C, 5 * C);
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.requests, 2);
    assert_int_equal(st.batches, 1); /* both trainers in one batch */
    assert_int_equal(st.samples, 8);
    assert_true(st.mean_batch == 8.0);
    assert_int_equal(st.saved_bytes, 8 * C * sizeof(float));

    /* Backward of both: dL/dx from the recomputed forward, one step. */
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 42, dy, 3, &r1), 0);
    assert_int_equal(bwd(e, e->h2, "ffn.0.0", 42, dy + 3 * C, 5, &r2), 0);
    assert_int_equal(wait_status(e, &r1), CM_OK);
    assert_int_equal(wait_status(e, &r2), CM_OK);
    struct kern_model *m = kern_expert_model(ref);
    kern_model_zero_grad(m);
    assert_int_equal(kern_expert_backward(ref, x, dy, 8, dx), 0);
    assert_close(r1.out, dx, 3 * C);
    assert_close(r2.out, dx + 3 * C, 5 * C);
    assert_int_equal(kern_optim_step(opt, m, NULL, NULL), 0);
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.batches, 2);
    assert_int_equal(st.updates, 1);
    assert_int_equal(st.saved_bytes, 0); /* used up */

    /* The update took: a forward now gives the stepped expert's outputs,
     * which differ from the first ones. */
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 43, x, 3, C, &r1), 0);
    assert_int_equal(wait_status(e, &r1), CM_OK);
    float y2[3 * C];
    assert_int_equal(kern_expert_forward(ref, x, 3, y2), 0);
    assert_close(r1.out, y2, 3 * C);
    int differs = 0;
    for (int i = 0; i < 3 * C; i++)
        differs |= fabsf(y2[i] - y[i]) > 1e-6f;
    assert_true(differs);
    /* The other expert was not touched (its own seed, no update). */
    struct kern_expert *ref1;
    assert_int_equal(kern_expert_new(kern_backend_cpu(), C, F, MAXB, SEED0 + 1, &ref1), 0);
    float y3[2 * C], out[2 * C];
    assert_int_equal(kern_expert_forward(ref1, x, 2, y3), 0);
    assert_int_equal(moe_client_forward_sync(e->h2, (struct sockaddr *)&e->addr, e->ps.key.pub,
                                             "ffn.0.1", 1, x, 2, C, 5000, out),
                     CM_OK);
    assert_close(out, y3, 2 * C);
    kern_expert_free(ref1);
    kern_optim_free(opt);
    kern_expert_free(ref);
}

static void test_backward_errors(void **state)
{
    struct env *e = *state = env_new(0, 1, 0, 0);
    float x[4 * C], dy[4 * C];
    fill(x, sizeof x / 4, 3);
    fill(dy, sizeof dy / 4, 4);
    struct res r;
    /* Never seen. */
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 7, dy, 4, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 7, x, 4, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    /* Another caller's forward id, another expert, another n: refused, and
     * the kept inputs stay for the right backward. */
    assert_int_equal(bwd(e, e->h2, "ffn.0.0", 7, dy, 4, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    assert_int_equal(bwd(e, e->h1, "ffn.0.1", 7, dy, 4, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 7, dy, 3, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ERANGE);
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.updates, 0);
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 7, dy, 4, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    /* Used up. */
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 7, dy, 4, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.updates, 1);
    assert_int_equal(st.failures, 5);
}

struct raw {
    int done, status;
};

static void raw_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                   size_t len)
{
    struct raw *w = arg;
    (void)from, (void)body, (void)len;
    w->done = 1;
    w->status = status;
}

static void test_request_errors(void **state)
{
    struct env *e = *state = env_new(0, 1, 0, 0);
    float x[(MAXB + 1) * 16];
    fill(x, sizeof x / 4, 5);
    struct res r;
    assert_int_equal(fwd(e, e->h1, "ffn.9.9", 1, x, 2, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ENOTFOUND);
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 2, 16, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ERANGE);
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, MAXB + 1, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_ETOOBIG);
    /* Refused locally: bad uid, zero n, NaN. */
    assert_int_equal(fwd(e, e->h1, "ffn 0", 1, x, 2, C, &r), CM_EINVAL);
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 0, C, &r), CM_EINVAL);
    x[3] = NAN;
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 2, C, &r), CM_ENUMERIC);
    /* The same garbage sent raw: the server answers with the parser's
     * status. */
    fill(x, sizeof x / 4, 5);
    struct moe_call m = {.forward_id = 1, .n = 2, .c = C, .values = (const uint8_t *)x};
    snprintf(m.uid, sizeof m.uid, "ffn.0.0");
    uint8_t *b;
    size_t len;
    assert_int_equal(moe_call_build(&m, &b, &len), 0);
    float nan1 = NAN;
    memcpy(b + len - 4, &nan1, 4);
    struct {
        size_t len;
        int want;
    } cases[] = {{len, CM_ENUMERIC}, {len - 1, CM_ERANGE}, {10, CM_EPARSE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct raw w = {0};
        assert_int_equal(p2p_request(e->h1, (struct sockaddr *)&e->addr, e->ps.key.pub,
                                     MOE_MSG_FORWARD, b, cases[i].len, 5000, raw_cb, &w),
                         0);
        run_until(e, &w.done, 5000);
        assert_int_equal(w.status, cases[i].want);
    }
    free(b);
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.batches, 0); /* nothing was computed */
    assert_int_equal(st.failures, 6);
    /* Info. */
    struct moe_info in;
    assert_int_equal(moe_client_info_sync(e->h2, (struct sockaddr *)&e->addr, e->ps.key.pub, 5000,
                                          &in),
                     CM_OK);
    assert_int_equal(in.n_experts, 2);
    assert_string_equal(in.experts[0].uid, "ffn.0.0");
    assert_int_equal(in.experts[1].c, C);
    assert_int_equal(in.experts[1].f, F);
    assert_int_equal(in.max_batch, MAXB);
}

static void test_kept_inputs_bounded(void **state)
{
    /* Room for one forward of 4 samples; kept 300 ms. */
    struct env *e = *state = env_new(0, 1, 4 * C * sizeof(float), 300);
    float x[4 * C];
    fill(x, sizeof x / 4, 6);
    struct res r;
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 4, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 2, x, 4, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 1, x, 4, &r), 0); /* dropped for 2 */
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    run_ms(e, 400);
    assert_int_equal(bwd(e, e->h1, "ffn.0.0", 2, x, 4, &r), 0); /* expired */
    assert_int_equal(wait_status(e, &r), CM_ESTATE);
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.saved_bytes, 0);
    assert_int_equal(st.updates, 0);
}

static void test_failure_injection(void **state)
{
    struct env *e = *state = env_new(0.5, 0, 0, 0);
    float x[C];
    fill(x, C, 7);
    int ok = 0, failed = 0;
    for (int i = 0; i < 200; i++) {
        struct res r;
        assert_int_equal(fwd(e, e->h1, "ffn.0.0", (uint64_t)i, x, 1, C, &r), 0);
        int s = wait_status(e, &r);
        if (s == CM_OK)
            ok++;
        else if (s == CM_EINTERNAL)
            failed++;
        else
            fail_msg("unexpected status %d", s);
    }
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.injected, (uint64_t)failed);
    assert_int_equal(ok + failed, 200);
    assert_true(failed > 60 && failed < 140); /* p = 0.5 over 200 calls */
}

static struct env *env_delay(uint32_t mean_ms)
{
    struct env *e = calloc(1, sizeof *e);
    struct moe_server_config cfg;
    moe_server_config_default(&cfg);
    cfg.max_batch = MAXB;
    cfg.max_wait_ms = 0;
    cfg.delay_mean_ms = mean_ms;
    env_start(e, &cfg);
    return e;
}

/* seed 002 §4.1: every answer waits an exponential delay; forwards and the
 * backwards that follow them still work; stop answers held ones at once. */
static void test_delay(void **state)
{
    struct moe_server_config bad;
    moe_server_config_default(&bad);
    bad.delay_mean_ms = 600001;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct moe_server *srv = NULL;
    assert_int_equal(moe_server_new(&bad, &loop, &srv), CM_EINVAL);
    uv_loop_close(&loop);

    struct env *e = *state = env_delay(40);
    float x[C], dy[C];
    fill(x, C, 9);
    fill(dy, C, 10);
    double sum = 0;
    int fast = 0, slow = 0;
    for (int i = 0; i < 40; i++) {
        struct res r;
        int64_t t0 = p2p_now_ms();
        assert_int_equal(fwd(e, e->h1, "ffn.0.0", (uint64_t)i, x, 1, C, &r), 0);
        assert_int_equal(wait_status(e, &r), CM_OK);
        double ms = (double)(r.at_ms - t0);
        sum += ms;
        fast += ms < 20;
        slow += ms > 60;
        if (i % 8 == 0) { /* the backward finds the inputs its delayed forward kept */
            assert_int_equal(bwd(e, e->h1, "ffn.0.0", (uint64_t)i, dy, 1, &r), 0);
            assert_int_equal(wait_status(e, &r), CM_OK);
        }
    }
    printf("delay mean 40 ms: answers in %.1f ms on average, %d under 20 ms, %d over 60 ms\n",
           sum / 40, fast, slow);
    assert_true(sum / 40 > 25 && sum / 40 < 90);
    assert_true(fast > 0 && slow > 0); /* spread like an exponential, not a constant */
    struct moe_server_stats st;
    moe_server_stats(e->srv, &st);
    assert_int_equal(st.delayed, 45);
    teardown(state);

    /* a mean of 10 minutes: the answer is held until the server stops */
    e = *state = env_delay(600000);
    struct res r;
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 1, C, &r), 0);
    run_ms(e, 300);
    assert_false(r.done);
    int64_t t0 = p2p_now_ms();
    moe_server_stop(e->srv);
    run_until(e, &r.done, 3000);
    assert_int_equal(r.status, CM_OK);
    assert_true(r.at_ms - t0 < 1000);
}

static void test_stopped_mid_batch(void **state)
{
    /* A batch that waits 5 s to fill. */
    struct env *e = *state = env_new(0, 5000, 0, 0);
    float x[2 * C];
    fill(x, sizeof x / 4, 8);
    struct res r1, r2;
    memset(&r1, 0, sizeof r1);
    int64_t t0 = p2p_now_ms();
    assert_int_equal(moe_client_forward(e->h1, (struct sockaddr *)&e->addr, e->ps.key.pub,
                                        "ffn.0.0", 1, x, 2, C, 300, on_res, &r1),
                     0);
    run_until(e, &r1.done, 3000);
    assert_int_equal(r1.status, CM_ETIMEOUT); /* our deadline, not the server's wait */
    assert_true(r1.at_ms - t0 < 1500);
    /* Stopped with a request queued: the caller hears CM_ECLOSED at once. */
    assert_int_equal(fwd(e, e->h2, "ffn.0.0", 2, x, 2, C, &r2), 0);
    run_ms(e, 100);
    assert_false(r2.done);
    t0 = p2p_now_ms();
    moe_server_stop(e->srv);
    run_until(e, &r2.done, 3000);
    assert_int_equal(r2.status, CM_ECLOSED);
    assert_true(r2.at_ms - t0 < 1000);
    assert_int_equal(fwd(e, e->h2, "ffn.0.0", 3, x, 2, C, &r2), 0);
    assert_int_equal(wait_status(e, &r2), CM_ECLOSED);
}

static void test_host_closed_mid_batch(void **state)
{
    struct env *e = *state = env_new(0, 5000, 0, 0);
    float x[2 * C];
    fill(x, sizeof x / 4, 9);
    struct res r;
    assert_int_equal(fwd(e, e->h1, "ffn.0.0", 1, x, 2, C, &r), 0);
    run_ms(e, 100);
    int64_t t0 = p2p_now_ms();
    p2p_host_close(e->hs); /* the server's network goes while the batch waits */
    e->hs = NULL;
    run_until(e, &r.done, 3000);
    assert_true(r.done);
    assert_true(r.status == CM_ECLOSED || r.status == CM_ECONN);
    assert_true(r.at_ms - t0 < 1000);
}

/* A server that lies: answers of another shape, with NaN, or garbage. */
static int liar(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    int *mode = arg;
    (void)h, (void)from, (void)body, (void)len;
    if (type != MOE_MSG_FORWARD)
        return CM_EUNSUPPORTED;
    float v[3 * C] = {0};
    struct moe_result r = {.n = *mode == 0 ? 3 : 2, .c = C, .values = (const uint8_t *)v};
    int rc = moe_result_build(&r, resp, rlen);
    if (*mode == 1)
        memset(*resp + MOE_RESULT_HDR_LEN, 0xff, 4); /* a NaN */
    if (*mode == 2)
        (*resp)[0] = 9;
    return rc;
}

/* Experts added while serving (takeover), and their state saved and loaded
 * between batches (expert checkpoints, moe_ckpt.h). */
static void test_add_save_load(void **state)
{
    struct env *e = *state = env_new(0, 1, 0, 0);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.1.0", C, F, SEED0 + 7), CM_OK);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.1.0", C, F, 1), CM_EEXISTS);
    float x[2 * C], dy[2 * C], y0[2 * C], y1[2 * C];
    fill(x, 2 * C, 1);
    fill(dy, 2 * C, 2);
    struct res r;
    assert_int_equal(fwd(e, e->h1, "ffn.1.0", 1, x, 2, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    memcpy(y0, r.out, sizeof y0);
    size_t n = 0;
    long step = -1;
    assert_int_equal(moe_server_expert_size(e->srv, "ffn.1.0", &n, &step), CM_OK);
    assert_int_equal(n, 3 * C + 2 * C * F + F);
    assert_int_equal(step, 0);
    float *buf = malloc(3 * n * sizeof(float));
    assert_non_null(buf);
    assert_int_equal(moe_server_save(e->srv, "ffn.1.0", buf, buf + n, buf + 2 * n, n, &step), CM_OK);
    assert_int_equal(moe_server_save(e->srv, "ffn.1.0", buf, buf + n, buf + 2 * n, n - 1, &step), CM_ERANGE);
    assert_int_equal(moe_server_save(e->srv, "ffn.9.9", buf, buf + n, buf + 2 * n, n, &step), CM_ENOTFOUND);
    /* one update moves it */
    assert_int_equal(bwd(e, e->h1, "ffn.1.0", 1, dy, 2, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    assert_int_equal(fwd(e, e->h1, "ffn.1.0", 2, x, 2, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    memcpy(y1, r.out, sizeof y1);
    assert_memory_not_equal(y0, y1, sizeof y0);
    assert_int_equal(moe_server_expert_size(e->srv, "ffn.1.0", &n, &step), CM_OK);
    assert_int_equal(step, 1);
    /* loading the saved state brings the output and the step back */
    assert_int_equal(moe_server_load(e->srv, "ffn.1.0", buf, buf + n, buf + 2 * n, n, -1), CM_EINVAL);
    assert_int_equal(moe_server_load(e->srv, "ffn.1.0", buf, buf + n, buf + 2 * n, n, 0), CM_OK);
    assert_int_equal(fwd(e, e->h1, "ffn.1.0", 3, x, 2, C, &r), 0);
    assert_int_equal(wait_status(e, &r), CM_OK);
    assert_memory_equal(r.out, y0, sizeof y0);
    assert_int_equal(moe_server_expert_size(e->srv, "ffn.1.0", &n, &step), CM_OK);
    assert_int_equal(step, 0);
    free(buf);
    moe_server_stop(e->srv);
    assert_int_equal(moe_server_add_expert(e->srv, "ffn.1.1", C, F, 1), CM_ESTATE);
}

static void test_client_refuses_lies(void **state)
{
    struct env *e = *state = env_new(0, 1, 0, 0);
    int mode = 0;
    struct p2p_host *bad;
    struct p2p_host_config hc = {.key = &e->ps.key, .token = e->ps.token, .listen_ip = "127.0.0.1",
                                 .on_request = liar, .arg = &mode};
    assert_int_equal(p2p_host_new(e->ctx, &hc, &bad), 0);
    char s[64];
    struct sockaddr_storage a;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(bad));
    assert_int_equal(p2p_addr_parse(s, &a), 0);
    float x[2 * C], out[2 * C];
    fill(x, sizeof x / 4, 10);
    const int want[3] = {CM_EPROTO, CM_ENUMERIC, CM_EPARSE};
    for (mode = 0; mode < 3; mode++)
        assert_int_equal(moe_client_forward_sync(e->h1, (struct sockaddr *)&a, e->ps.key.pub,
                                                 "ffn.0.0", 1, x, 2, C, 3000, out),
                         want[mode]);
    p2p_host_close(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_matches_direct, teardown),
        cmocka_unit_test_teardown(test_backward_errors, teardown),
        cmocka_unit_test_teardown(test_request_errors, teardown),
        cmocka_unit_test_teardown(test_kept_inputs_bounded, teardown),
        cmocka_unit_test_teardown(test_failure_injection, teardown),
        cmocka_unit_test_teardown(test_delay, teardown),
        cmocka_unit_test_teardown(test_stopped_mid_batch, teardown),
        cmocka_unit_test_teardown(test_host_closed_mid_batch, teardown),
        cmocka_unit_test_teardown(test_client_refuses_lies, teardown),
        cmocka_unit_test_teardown(test_add_save_load, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
