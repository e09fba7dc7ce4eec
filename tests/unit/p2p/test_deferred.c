/* Deferred replies (p2p_reply_defer / p2p_reply_finish, p2p_transport.h):
 * a handler takes over its answer and sends it later from the loop; the
 * answer arrives with the right status and body, several deferred answers
 * on one connection go back out of order, an answer owed to a connection
 * that closed is dropped with CM_ECLOSED, and a connection owing answers is
 * not closed as idle. Real hosts on loopback. */
/* ct-timeout: 60 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

struct env {
    uv_loop_t loop;
    struct p2p_tk tk;
    struct p2p_ctx *ctx;
    struct p2p_tk_peer a, b;
    struct p2p_host *ha, *hb;
    struct p2p_deferred *held[4];
    size_t n_held;
};

struct result {
    int done, status;
    uint8_t body[64];
    size_t len;
};

static void on_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct result *r = arg;
    (void)from;
    r->done = 1;
    r->status = status;
    r->len = len < sizeof r->body ? len : sizeof r->body;
    if (len)
        memcpy(r->body, body, r->len);
}

/* Type 100 is deferred (the returned status and body are ignored); type
 * 101 answers at once. */
static int handler(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                   const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct env *e = arg;
    (void)from, (void)body, (void)len;
    if (type == 101)
        return CM_OK;
    if (type != 100)
        return CM_EUNSUPPORTED;
    struct p2p_deferred *d = p2p_reply_defer(h);
    assert_non_null(d);
    assert_ptr_equal(p2p_reply_defer(h), d); /* same handle within one call */
    e->held[e->n_held++] = d;
    *resp = malloc(3); /* ignored and freed by the transport */
    memcpy(*resp, "bad", 3);
    *rlen = 3;
    return CM_EINVAL;
}

static void run_ms(struct env *e, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
}

static void run_until(struct env *e, int *flag, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (!*flag && p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    uv_loop_init(&e->loop);
    assert_int_equal(p2p_tk_init(&e->tk, "testrun"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "alice", "1", 3600, &e->a), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "bob", "2", 3600, &e->b), 0);
    struct p2p_ctx_config cc = {.loop = &e->loop, .idle_timeout_ms = 300,
                                .auth = p2p_tk_auth_config(&e->tk)};
    assert_int_equal(p2p_ctx_new(&cc, &e->ctx), 0);
    struct p2p_host_config ha = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = handler, .arg = e};
    struct p2p_host_config hb = {.key = &e->b.key, .token = e->b.token};
    assert_int_equal(p2p_host_new(e->ctx, &ha, &e->ha), 0);
    assert_int_equal(p2p_host_new(e->ctx, &hb, &e->hb), 0);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    if (e->ha)
        p2p_host_close(e->ha);
    if (e->hb)
        p2p_host_close(e->hb);
    p2p_ctx_free(e->ctx);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    p2p_tk_peer_cleanup(&e->a);
    p2p_tk_peer_cleanup(&e->b);
    p2p_tk_cleanup(&e->tk);
    free(e);
    return 0;
}

static void send_req(struct env *e, uint32_t type, struct result *r, uint32_t timeout_ms)
{
    char s[64];
    struct sockaddr_storage a;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(e->ha));
    assert_int_equal(p2p_addr_parse(s, &a), 0);
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, type,
                                 (const uint8_t *)"x", 1, timeout_ms, on_resp, r),
                     0);
}

static void test_later_and_out_of_order(void **state)
{
    struct env *e = *state;
    assert_null(p2p_reply_defer(e->ha)); /* not inside a handler */
    struct result r1 = {0}, r2 = {0}, r3 = {0};
    send_req(e, 100, &r1, 5000);
    send_req(e, 100, &r2, 5000);
    run_ms(e, 700); /* longer than the idle timeout: answers are owed */
    assert_int_equal(e->n_held, 2);
    assert_false(r1.done);
    assert_false(r2.done);
    /* Answers go back in the other order, one with an error status. */
    struct p2p_iov parts[2] = {{(const uint8_t *)"ab", 2}, {(const uint8_t *)"cd", 2}};
    assert_int_equal(p2p_reply_finish(e->held[1], CM_OK, parts, 2), 0);
    assert_int_equal(p2p_reply_finish(e->held[0], CM_ERANGE, NULL, 0), 0);
    run_until(e, &r1.done, 3000);
    run_until(e, &r2.done, 3000);
    assert_int_equal(r1.status, CM_ERANGE);
    assert_int_equal(r2.status, CM_OK);
    assert_int_equal(r2.len, 4);
    assert_memory_equal(r2.body, "abcd", 4);
    /* A handler that answers at once still does. */
    send_req(e, 101, &r3, 5000);
    run_until(e, &r3.done, 3000);
    assert_int_equal(r3.status, CM_OK);
    struct p2p_stats st;
    p2p_ctx_stats(e->ctx, &st);
    assert_int_equal(st.conns_opened, 1); /* not closed as idle while owing */
}

static void test_requester_gone(void **state)
{
    struct env *e = *state;
    struct result r = {0};
    send_req(e, 100, &r, 5000);
    run_ms(e, 200);
    assert_int_equal(e->n_held, 1);
    p2p_host_close(e->hb); /* the requester goes away: its request fails now */
    e->hb = NULL;
    assert_true(r.done);
    assert_int_equal(r.status, CM_ECLOSED);
    run_ms(e, 200); /* the server side sees the connection close */
    assert_int_equal(p2p_reply_finish(e->held[0], CM_OK, NULL, 0), CM_ECLOSED);
    assert_int_equal(p2p_reply_finish(NULL, CM_OK, NULL, 0), CM_EINVAL);
}

static void test_server_closes(void **state)
{
    struct env *e = *state;
    struct result r = {0};
    send_req(e, 100, &r, 5000);
    run_ms(e, 200);
    assert_int_equal(e->n_held, 1);
    p2p_host_close(e->ha); /* the server closes owing an answer */
    e->ha = NULL;
    run_until(e, &r.done, 3000);
    assert_true(r.done);
    assert_int_not_equal(r.status, CM_OK);
    assert_int_equal(p2p_reply_finish(e->held[0], CM_OK, NULL, 0), CM_ECLOSED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_later_and_out_of_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requester_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_closes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
