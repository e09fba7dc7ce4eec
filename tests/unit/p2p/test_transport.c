/* Transport and signed-envelope tests over real loopback sockets: requests
 * and responses between two hosts, deadlines, streams, and every rejection
 * of seed 000 Appendix H.4 (forged, replayed, expired, revoked, misaddressed,
 * wrong run, clock skew) plus bad framing, each sent as raw bytes by a
 * hostile client; after each, the server must still serve an honest peer. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "p2p/p2p_frame.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

struct env {
    uv_loop_t loop;
    struct p2p_tk tk;
    struct p2p_ctx *ctx;
    struct p2p_tk_peer a, b, evil;
    struct p2p_host *ha, *hb;
    size_t chunks_bytes;
    int last_seen;
};

struct result {
    int done, status;
    uint8_t body[256];
    size_t len;
    uint8_t from[32];
};

static void on_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct result *r = arg;
    r->done = 1;
    r->status = status;
    r->len = len < sizeof r->body ? len : sizeof r->body;
    if (len)
        memcpy(r->body, body, r->len);
    if (from)
        memcpy(r->from, from->pub, 32);
}

/* Echo handler: type 100 echoes the body reversed; others unsupported. */
static int echo(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    (void)arg, (void)h, (void)from;
    if (type != 100)
        return CM_EUNSUPPORTED;
    *resp = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i++)
        (*resp)[i] = body[len - 1 - i];
    *rlen = len;
    return CM_OK;
}

static int on_chunk(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint64_t sid,
                    uint64_t off, uint64_t total, const uint8_t *data, size_t len, int last)
{
    struct env *e = arg;
    (void)h, (void)from, (void)sid, (void)total, (void)last;
    for (size_t i = 0; i < len; i++)
        if (data[i] != (uint8_t)((off + i) * 7))
            return CM_ECHECKSUM;
    e->chunks_bytes += len;
    return CM_OK;
}

static void run_until(struct env *e, int *flag, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (!*flag && p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_ONCE);
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    uv_loop_init(&e->loop);
    assert_int_equal(p2p_tk_init(&e->tk, "testrun"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "alice", "1", 3600, &e->a), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "bob", "2", 3600, &e->b), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "mallory", "3", 3600, &e->evil), 0);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk)};
    assert_int_equal(p2p_ctx_new(&cc, &e->ctx), 0);
    struct p2p_host_config ha = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = echo, .on_chunk = on_chunk, .arg = e};
    struct p2p_host_config hb = ha;
    hb.key = &e->b.key;
    hb.token = e->b.token;
    assert_int_equal(p2p_host_new(e->ctx, &ha, &e->ha), 0);
    assert_int_equal(p2p_host_new(e->ctx, &hb, &e->hb), 0);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    p2p_host_close(e->ha);
    p2p_host_close(e->hb);
    p2p_ctx_free(e->ctx);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    p2p_tk_peer_cleanup(&e->a);
    p2p_tk_peer_cleanup(&e->b);
    p2p_tk_peer_cleanup(&e->evil);
    p2p_tk_cleanup(&e->tk);
    free(e);
    return 0;
}

static void addr_of(struct p2p_host *h, struct sockaddr_storage *a)
{
    char s[64];
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(h));
    assert_int_equal(p2p_addr_parse(s, a), 0);
}

/* An honest request from b to a; returns its status. */
static int honest_echo(struct env *e)
{
    struct sockaddr_storage a;
    addr_of(e->ha, &a);
    struct result r = {0};
    const uint8_t msg[] = "hello";
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 100, msg, 5, 3000,
                                 on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_true(r.done);
    if (r.status == 0) {
        assert_int_equal(r.len, 5);
        assert_memory_equal(r.body, "olleh", 5);
        assert_memory_equal(r.from, e->a.key.pub, 32);
    }
    return r.status;
}

static void test_request_response(void **state)
{
    struct env *e = *state;
    assert_int_equal(honest_echo(e), 0);
    assert_int_equal(honest_echo(e), 0);
    struct p2p_stats st;
    p2p_ctx_stats(e->ctx, &st);
    assert_int_equal(st.conns_opened, 1); /* the connection was reused */

    /* Unknown type: a signed error status, the connection stays. */
    struct sockaddr_storage a;
    addr_of(e->ha, &a);
    struct result r = {0};
    assert_int_equal(
        p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 77, NULL, 0, 3000, on_resp, &r), 0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, CM_EUNSUPPORTED);

    /* PING without a key: key discovery for bootstrap addresses. */
    memset(&r, 0, sizeof r);
    assert_int_equal(
        p2p_request(e->hb, (struct sockaddr *)&a, NULL, P2P_MSG_PING, NULL, 0, 3000, on_resp, &r),
        0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, 0);
    assert_memory_equal(r.from, e->a.key.pub, 32);
    /* Non-PING without a key is refused locally. */
    assert_int_equal(
        p2p_request(e->hb, (struct sockaddr *)&a, NULL, 100, NULL, 0, 3000, on_resp, &r),
        CM_EINVAL);

    /* Asking a with b's... key expectation wrong: response from a wrong sender. */
    memset(&r, 0, sizeof r);
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->evil.key.pub, P2P_MSG_PING, NULL,
                                 0, 3000, on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_true(r.done);
    assert_int_not_equal(r.status, 0); /* a rejects: we named mallory as recipient */
    assert_int_equal(honest_echo(e), 0);
}

static void test_deadline(void **state)
{
    struct env *e = *state;
    /* A socket that accepts connections (kernel backlog) but never answers. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(s, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(s, (struct sockaddr *)&sa, &sl);
    struct result r = {0};
    int64_t t0 = p2p_now_ms();
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&sa, e->a.key.pub, 100, NULL, 0, 300,
                                 on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    int64_t dt = p2p_now_ms() - t0;
    assert_int_equal(r.status, CM_ETIMEOUT);
    assert_true(dt >= 290 && dt < 2000);
    close(s);
    /* A refused connection fails fast. */
    memset(&r, 0, sizeof r);
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&sa, e->a.key.pub, 100, NULL, 0, 3000,
                                 on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, CM_ECONN);
}

static void on_stream_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *b,
                           size_t l)
{
    (void)from, (void)b, (void)l;
    on_resp(arg, status, NULL, NULL, 0);
}

static void test_stream(void **state)
{
    struct env *e = *state;
    size_t n = 3 * 1024 * 1024 + 123;
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 7);
    struct sockaddr_storage a;
    addr_of(e->ha, &a);
    struct result r = {0};
    assert_int_equal(p2p_stream_send(e->hb, (struct sockaddr *)&a, e->a.key.pub, 42, data, n,
                                     128 * 1024, 4, 5000, on_stream_done, &r),
                     0);
    run_until(e, &r.done, 20000);
    assert_int_equal(r.status, 0);
    assert_int_equal(e->chunks_bytes, n);
    free(data);
}

/* ---- hostile raw client ------------------------------------------------ */

/* Sends raw bytes to a and waits for either a response frame (returns its
 * length) or the connection being closed by a (returns -1). */
static int raw_exchange(struct env *e, const uint8_t *buf, size_t len, uint8_t *out, size_t cap)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(p2p_host_port(e->ha))};
    assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof sa), 0);
    if (len)
        assert_int_equal(send(s, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    size_t got = 0;
    int64_t end = p2p_now_ms() + 3000;
    int result = -2;
    while (p2p_now_ms() < end) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        ssize_t n = recv(s, out + got, cap - got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            result = -1;
            break;
        }
        if (n > 0) {
            got += (size_t)n;
            const uint8_t *p;
            size_t pl, used;
            if (p2p_frame_next(out, got, &p, &pl, &used) == 0) {
                result = (int)got;
                break;
            }
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    close(s);
    for (int i = 0; i < 20; i++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    return result;
}

static uint8_t *build(struct p2p_tk_peer *who, const char *token, const uint8_t *recipient,
                      int64_t t, const uint8_t nonce[16], size_t *len)
{
    struct p2p_envelope_out o = {.kind = P2P_KIND_REQUEST, .type = P2P_MSG_PING,
                                 .request_id = 9, .token = token, .recipient = recipient,
                                 .time_ms = t};
    memcpy(o.nonce, nonce, 16);
    uint8_t *f;
    assert_int_equal(p2p_envelope_build(&who->key, &o, &f, len), 0);
    return f;
}

static void expect_rejected(struct env *e, uint8_t *frame, size_t len, enum p2p_reject why)
{
    struct p2p_auth *au = p2p_ctx_auth(e->ctx);
    uint64_t before = p2p_auth_rejects(au, why);
    uint8_t out[4096];
    assert_int_equal(raw_exchange(e, frame, len, out, sizeof out), -1);
    assert_int_equal(p2p_auth_rejects(au, why), before + 1);
    free(frame);
    assert_int_equal(honest_echo(e), 0);
}

static void test_rejections(void **state)
{
    struct env *e = *state;
    uint8_t nonce[16], out[4096];
    size_t len;
    int64_t now = p2p_now_ms();

    /* An honest raw request is answered; the same bytes again are a replay. */
    cm_random_bytes(nonce, 16);
    uint8_t *t, *ok = build(&e->evil, e->evil.token, e->a.key.pub, now, nonce, &len);
    assert_true(raw_exchange(e, ok, len, out, sizeof out) > 0);
    expect_rejected(e, ok, len, P2P_REJ_REPLAY);

    /* Forged: mallory signs with her key but presents alice's token. */
    cm_random_bytes(nonce, 16);
    t = build(&e->evil, e->b.token, e->a.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_SIGNATURE);
    /* Tampered signature byte. */
    cm_random_bytes(nonce, 16);
    t = build(&e->evil, e->evil.token, e->a.key.pub, now, nonce, &len);
    t[len - 70] ^= 1; /* inside the signature field */
    expect_rejected(e, t, len, P2P_REJ_SIGNATURE);
    /* Misaddressed: recipient is bob, sent to alice. */
    cm_random_bytes(nonce, 16);
    t = build(&e->evil, e->evil.token, e->b.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_RECIPIENT);
    /* Clock skew beyond the window (60 s). */
    cm_random_bytes(nonce, 16);
    t = build(&e->evil, e->evil.token, e->a.key.pub, now - 120000, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_SKEW);
    /* Expired token. */
    struct p2p_tk_peer old;
    int64_t s = (int64_t)time(NULL);
    assert_int_equal(p2p_tk_peer_new_ex(&e->tk, "old", "4", e->tk.run, s - 7200, s - 3600, &old), 0);
    cm_random_bytes(nonce, 16);
    t = build(&old, old.token, e->a.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_EXPIRED);
    p2p_tk_peer_cleanup(&old);
    /* Token for another run. */
    struct p2p_tk_peer other;
    assert_int_equal(p2p_tk_peer_new_ex(&e->tk, "other", "5", "otherrun", s - 60, s + 600, &other),
                     0);
    cm_random_bytes(nonce, 16);
    t = build(&other, other.token, e->a.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_RUN);
    p2p_tk_peer_cleanup(&other);
    /* Token signed by a key that is not the coordinator's. */
    struct p2p_tk rogue;
    struct p2p_tk_peer fake;
    assert_int_equal(p2p_tk_init(&rogue, "testrun"), 0);
    assert_int_equal(p2p_tk_peer_new(&rogue, "fake", "6", 600, &fake), 0);
    cm_random_bytes(nonce, 16);
    t = build(&fake, fake.token, e->a.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_TOKEN);
    p2p_tk_peer_cleanup(&fake);
    p2p_tk_cleanup(&rogue);
    /* Revoked: mallory's pass id "3" goes on the list. */
    const char *ids[] = {"3"};
    assert_int_equal(p2p_auth_set_revoked(p2p_ctx_auth(e->ctx), ids, 1, 100), 0);
    cm_random_bytes(nonce, 16);
    t = build(&e->evil, e->evil.token, e->a.key.pub, now, nonce, &len);
    expect_rejected(e, t, len, P2P_REJ_REVOKED);
    assert_int_equal(p2p_auth_set_revoked(p2p_ctx_auth(e->ctx), NULL, 0, 101), 0);
}

static void test_bad_frames(void **state)
{
    struct env *e = *state;
    uint8_t out[4096];
    struct {
        const char *name;
        uint8_t bytes[16];
        size_t len;
    } cases[] = {
        {"bad magic", {'X', 'T', 1, 0, 0, 0, 0, 4, 1, 2, 3, 4}, 12},
        {"unknown version", {'C', 'T', 9, 0, 0, 0, 0, 1, 0}, 9},
        {"oversized", {'C', 'T', 1, 0, 0x7f, 0xff, 0xff, 0xff}, 8},
        {"garbage payload", {'C', 'T', 1, 0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff}, 12},
        {"flags set", {'C', 'T', 1, 1, 0, 0, 0, 0}, 8},
    };
    struct p2p_auth *au = p2p_ctx_auth(e->ctx);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t before = p2p_auth_rejects(au, P2P_REJ_MALFORMED);
        assert_int_equal(raw_exchange(e, cases[i].bytes, cases[i].len, out, sizeof out), -1);
        assert_int_equal(p2p_auth_rejects(au, P2P_REJ_MALFORMED), before + 1);
        assert_int_equal(honest_echo(e), 0);
    }
    /* A valid request followed by garbage: answered, then dropped. */
    uint8_t nonce[16];
    size_t len;
    cm_random_bytes(nonce, 16);
    uint8_t *f = build(&e->evil, e->evil.token, e->a.key.pub, p2p_now_ms(), nonce, &len);
    f = realloc(f, len + 5);
    memcpy(f + len, "junk!", 5);
    uint64_t before = p2p_auth_rejects(au, P2P_REJ_MALFORMED);
    assert_true(raw_exchange(e, f, len + 5, out, sizeof out) > 0);
    free(f);
    assert_int_equal(honest_echo(e), 0);
    (void)before;
}

static void test_flood(void **state)
{
    struct env *e = *state;
    /* 600 connections, over the host's inbound cap of 512, half of them
     * idle and half stuck in a frame: the server keeps answering honest
     * peers (idle ones make room for newcomers). */
    enum { NF = 600 };
    int fds[NF];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(p2p_host_port(e->ha))};
    for (int i = 0; i < NF; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
        /* half of them start a frame and never finish it */
        if (i % 2)
            send(fds[i], "CT\1\0\0\0\1\0", 8, MSG_NOSIGNAL);
        uv_run(&e->loop, UV_RUN_NOWAIT);
    }
    for (int i = 0; i < 50; i++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(honest_echo(e), 0);
    struct p2p_stats st;
    p2p_ctx_stats(e->ctx, &st);
    assert_true(st.conns_evicted > 0);
    for (int i = 0; i < NF; i++)
        close(fds[i]);
    for (int i = 0; i < 50; i++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(honest_echo(e), 0);
}

/* A started frame that never completes and an idle connection are both
 * closed by the server's sweep (timeouts shortened here). */
static void test_slow_and_idle(void **state)
{
    struct env *e = *state;
    struct p2p_ctx *ctx;
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk),
                                .idle_timeout_ms = 300, .frame_timeout_ms = 300};
    assert_int_equal(p2p_ctx_new(&cc, &ctx), 0);
    struct p2p_host *h;
    struct p2p_host_config hc = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = echo, .arg = e};
    assert_int_equal(p2p_host_new(ctx, &hc, &h), 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(p2p_host_port(h))};
    int slow = socket(AF_INET, SOCK_STREAM, 0), idle = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(slow, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(connect(idle, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(send(slow, "CT\1\0\0\0\0\x20", 8, MSG_NOSIGNAL), 8);
    uint64_t before = p2p_auth_rejects(p2p_ctx_auth(ctx), P2P_REJ_MALFORMED);
    int64_t end = p2p_now_ms() + 3000;
    int closed_slow = 0, closed_idle = 0;
    char b[16];
    while (p2p_now_ms() < end && !(closed_slow && closed_idle)) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        if (!closed_slow && recv(slow, b, sizeof b, MSG_DONTWAIT) == 0)
            closed_slow = 1;
        if (!closed_idle && recv(idle, b, sizeof b, MSG_DONTWAIT) == 0)
            closed_idle = 1;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    assert_true(closed_slow);
    assert_true(closed_idle);
    assert_int_equal(p2p_auth_rejects(p2p_ctx_auth(ctx), P2P_REJ_MALFORMED), before + 1);
    close(slow);
    close(idle);
    p2p_host_close(h);
    p2p_ctx_free(ctx);
}

/* A peer that sends requests and never reads the answers: once the
 * answers queued for it exceed max_conn_queue the server stops reading that
 * connection (its memory stays bounded) and keeps serving others. */
static void test_backpressure(void **state)
{
    struct env *e = *state;
    struct p2p_ctx *ctx;
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk),
                                .max_conn_queue = 64 * 1024};
    assert_int_equal(p2p_ctx_new(&cc, &ctx), 0);
    struct p2p_host *h;
    struct p2p_host_config hc = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = echo, .arg = e};
    assert_int_equal(p2p_host_new(ctx, &hc, &h), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(p2p_host_port(h))};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    /* type-100 echo requests with 2 KiB bodies, never reading the answers */
    static uint8_t body[2048];
    struct p2p_envelope_out o = {.kind = P2P_KIND_REQUEST, .type = 100, .token = e->evil.token,
                                 .recipient = e->a.key.pub, .body = body, .body_len = sizeof body};
    int sent = 0, blocked = 0;
    int64_t end = p2p_now_ms() + 10000;
    while (!blocked && p2p_now_ms() < end && sent < 20000) {
        o.request_id = (uint64_t)sent;
        o.time_ms = p2p_now_ms();
        cm_random_bytes(o.nonce, 16);
        uint8_t *f;
        size_t len, off = 0;
        assert_int_equal(p2p_envelope_build(&e->evil.key, &o, &f, &len), 0);
        int64_t stall = p2p_now_ms() + 1000;
        while (off < len) {
            ssize_t n = send(fd, f + off, len - off, MSG_NOSIGNAL);
            if (n > 0) {
                off += (size_t)n;
                continue;
            }
            uv_run(&e->loop, UV_RUN_NOWAIT);
            if (p2p_now_ms() > stall) { /* the server stopped reading us */
                blocked = 1;
                break;
            }
        }
        free(f);
        sent++;
        uv_run(&e->loop, UV_RUN_NOWAIT);
    }
    struct p2p_stats st;
    p2p_ctx_stats(ctx, &st);
    printf("backpressure: %d requests sent before the server stopped reading, %llu pauses\n",
           sent, (unsigned long long)st.backpressure_pauses);
    assert_true(blocked);
    assert_true(st.backpressure_pauses >= 1);
    /* Others are still served, by this same host. */
    struct sockaddr_storage a;
    char as[64];
    snprintf(as, sizeof as, "127.0.0.1:%u", p2p_host_port(h));
    p2p_addr_parse(as, &a);
    struct result r = {0};
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 100,
                                 (const uint8_t *)"ab", 2, 3000, on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, 0);
    close(fd);
    p2p_host_close(h);
    p2p_ctx_free(ctx);
}

/* Partial frames of all connections together are bounded: senders that
 * start large frames and stall are dropped once the bound is reached. */
static void test_rx_memory_bound(void **state)
{
    struct env *e = *state;
    struct p2p_ctx *ctx;
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk),
                                .max_rx_buffered = 150 * 1024};
    assert_int_equal(p2p_ctx_new(&cc, &ctx), 0);
    struct p2p_host *h;
    struct p2p_host_config hc = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = echo, .arg = e};
    assert_int_equal(p2p_host_new(ctx, &hc, &h), 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(p2p_host_port(h))};
    static uint8_t chunk[60 * 1024];
    /* header announcing 300 KiB, then 60 KiB of it */
    const uint8_t hdr[8] = {'C', 'T', 1, 0, 0x00, 0x04, 0xb0, 0x00};
    int fds[6];
    for (int i = 0; i < 6; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
        assert_int_equal(send(fds[i], hdr, 8, MSG_NOSIGNAL), 8);
        assert_int_equal(send(fds[i], chunk, sizeof chunk, MSG_NOSIGNAL), (ssize_t)sizeof chunk);
        for (int k = 0; k < 50; k++)
            uv_run(&e->loop, UV_RUN_NOWAIT);
    }
    for (int k = 0; k < 200; k++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_true(p2p_auth_rejects(p2p_ctx_auth(ctx), P2P_REJ_MALFORMED) >= 3);
    for (int i = 0; i < 6; i++)
        close(fds[i]);
    /* honest peers are still served */
    struct sockaddr_storage a;
    char as[64];
    snprintf(as, sizeof as, "127.0.0.1:%u", p2p_host_port(h));
    p2p_addr_parse(as, &a);
    struct result r = {0};
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 100,
                                 (const uint8_t *)"ab", 2, 3000, on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, 0);
    p2p_host_close(h);
    p2p_ctx_free(ctx);
}

/* The same exchange over IPv6 loopback, when the machine has it. */
static void test_ipv6(void **state)
{
    struct env *e = *state;
    struct p2p_host *h6;
    struct p2p_host_config hc = {.key = &e->a.key, .token = e->a.token, .listen_ip = "::1",
                                 .on_request = echo, .arg = e};
    if (p2p_host_new(e->ctx, &hc, &h6) != 0) {
        printf("ipv6: no ::1 on this machine, part skipped\n");
        return;
    }
    char as[64];
    struct sockaddr_storage a;
    snprintf(as, sizeof as, "[::1]:%u", p2p_host_port(h6));
    assert_int_equal(p2p_addr_parse(as, &a), 0);
    struct result r = {0};
    assert_int_equal(p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 100,
                                 (const uint8_t *)"v6", 2, 3000, on_resp, &r),
                     0);
    run_until(e, &r.done, 5000);
    assert_int_equal(r.status, 0);
    assert_memory_equal(r.body, "6v", 2);
    p2p_host_close(h6);
}

static void test_addresses(void **state)
{
    (void)state;
    struct sockaddr_storage a;
    char out[80];
    assert_int_equal(p2p_addr_parse("127.0.0.1:4000", &a), 0);
    p2p_addr_format((struct sockaddr *)&a, out, sizeof out);
    assert_string_equal(out, "127.0.0.1:4000");
    assert_int_equal(p2p_addr_parse("[::1]:65535", &a), 0);
    p2p_addr_format((struct sockaddr *)&a, out, sizeof out);
    assert_string_equal(out, "[::1]:65535");
    assert_int_equal(p2p_addr_parse("localhost:80", &a), 0);
    const char *bad[] = {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                         "127.0.0.1:80x", ":80", "[::1:80", "[::1]80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_not_equal(p2p_addr_parse(bad[i], &a), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flood, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_and_idle, setup, teardown),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test_setup_teardown(test_ipv6, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rx_memory_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backpressure, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
