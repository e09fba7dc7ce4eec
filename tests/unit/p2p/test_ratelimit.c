/* ct-serial: measures rates and round trips against the wall clock */
/* Bandwidth caps and emulated latency. The token bucket alone over a simulated clock, then real
 * loopback transfers: a 6 MB stream through a process capped at 16 Mbit/s
 * upload, and one into a process capped at 16 Mbit/s download; the measured
 * rate (all bytes on the wire, envelopes included) must be within 5% of the
 * cap, which is what benchmarks rely on to emulate home connections; and
 * small frames go out ahead of a capped stream's. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_rate.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

/* Sends as fast as r allows for 10 simulated seconds in 1 ms ticks, 3 KB
 * writes at most; the bytes sent. */
static size_t send_10s(struct p2p_rate *r)
{
    uint64_t t = 0;
    size_t sent = 0;
    for (int i = 0; i < 10000; i++) {
        t += 1000000;
        size_t a = p2p_rate_available(r, t);
        if (a) {
            size_t n = a > 3000 ? 3000 : a;
            p2p_rate_consume(r, n);
            sent += n;
        }
    }
    return sent;
}

static void test_bucket(void **state)
{
    (void)state;
    struct p2p_rate r;
    p2p_rate_init(&r, 8.0, 0); /* 1 MB/s, burst 20 KB */
    double rate = (double)send_10s(&r) / 10.0;
    assert_true(fabs(rate - 1e6) / 1e6 < 0.01);
    /* Debt: one big write blocks until paid back. */
    p2p_rate_init(&r, 8.0, 0);
    p2p_rate_consume(&r, 1000000);
    assert_int_equal(p2p_rate_available(&r, 500000000ull), 0);
    assert_true(p2p_rate_wait_ms(&r, 1, 500000000ull) >= 480);
    p2p_rate_init(&r, 0, 0);
    assert_false(p2p_rate_limited(&r));
    assert_int_equal(p2p_rate_wait_ms(&r, 1000000, 0), 0);
}

/* The bucket's size: after an idle second it releases 100 ms of traffic
 * at once (declared caps), or only the short burst a pacing bucket holds,
 * and both keep the exact long-run rate. */
static void test_burst(void **state)
{
    (void)state;
    struct p2p_rate r;
    p2p_rate_init(&r, 8.0, 0); /* 1 MB/s */
    assert_int_equal(p2p_rate_available(&r, 1000000000ull), 100000);
    p2p_rate_init_burst(&r, 8.0, P2P_PACE_BURST_S, 0);
    assert_int_equal(p2p_rate_available(&r, 1000000000ull), 10000);
    p2p_rate_init_burst(&r, 8.0, 0, 0); /* 0: the default */
    assert_int_equal(p2p_rate_available(&r, 1000000000ull), 100000);
    p2p_rate_init_burst(&r, 8.0, P2P_PACE_BURST_S, 0);
    assert_true(fabs((double)send_10s(&r) / 10.0 - 1e6) / 1e6 < 0.01);
}

struct side {
    struct p2p_ctx *ctx;
    struct p2p_host *h;
    struct p2p_tk_peer peer;
    size_t got;
};

static int on_chunk(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint64_t sid,
                    uint64_t off, uint64_t total, const uint8_t *data, size_t len, int last)
{
    struct side *s = arg;
    (void)h, (void)from, (void)sid, (void)off, (void)total, (void)data, (void)last;
    s->got += len;
    return 0;
}

struct done {
    int done, status;
};

static void on_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *b,
                    size_t l)
{
    struct done *d = arg;
    (void)from, (void)b, (void)l;
    d->done = 1;
    d->status = status;
}

/* Streams `len` bytes from a process with caps (up_a, down_a) to one with
 * (up_b, down_b); returns the measured Mbit/s of the capped direction. */
static double transfer(double up_a, double down_b, size_t len)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "caps"), 0);
    struct side a = {0}, b = {0};
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &a.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &b.peer), 0);
    struct p2p_ctx_config ca = {.loop = &loop, .max_upload_mbps = up_a,
                                .auth = p2p_tk_auth_config(&tk)};
    struct p2p_ctx_config cb = {.loop = &loop, .max_download_mbps = down_b,
                                .auth = p2p_tk_auth_config(&tk)};
    assert_int_equal(p2p_ctx_new(&ca, &a.ctx), 0);
    assert_int_equal(p2p_ctx_new(&cb, &b.ctx), 0);
    struct p2p_host_config ha = {.key = &a.peer.key, .token = a.peer.token,
                                 .listen_ip = "127.0.0.1", .arg = &a};
    struct p2p_host_config hb = {.key = &b.peer.key, .token = b.peer.token,
                                 .listen_ip = "127.0.0.1", .on_chunk = on_chunk, .arg = &b};
    assert_int_equal(p2p_host_new(a.ctx, &ha, &a.h), 0);
    assert_int_equal(p2p_host_new(b.ctx, &hb, &b.h), 0);
    uint8_t *data = calloc(1, len);
    char s[64];
    struct sockaddr_storage addr;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(b.h));
    p2p_addr_parse(s, &addr);
    struct done d = {0};
    uint64_t t0 = uv_hrtime();
    assert_int_equal(p2p_stream_send(a.h, (struct sockaddr *)&addr, b.peer.key.pub, 1, data, len,
                                     64 * 1024, 8, 30000, on_done, &d),
                     0);
    while (!d.done)
        uv_run(&loop, UV_RUN_ONCE);
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    assert_int_equal(d.status, 0);
    assert_int_equal(b.got, len);
    struct p2p_stats sa, sb;
    p2p_ctx_stats(a.ctx, &sa);
    p2p_ctx_stats(b.ctx, &sb);
    double bytes = up_a > 0 ? (double)sa.bytes_sent : (double)sb.bytes_received;
    double mbps = bytes * 8 / secs / 1e6;
    printf("transfer: %zu payload bytes, %.0f wire bytes in %.3f s = %.2f Mbit/s\n", len, bytes,
           secs, mbps);
    free(data);
    p2p_host_close(a.h);
    p2p_host_close(b.h);
    p2p_ctx_free(a.ctx);
    p2p_ctx_free(b.ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    p2p_tk_peer_cleanup(&a.peer);
    p2p_tk_peer_cleanup(&b.peer);
    p2p_tk_cleanup(&tk);
    return mbps;
}

/* Emulated latency: with 40 ms one way on each side, a request/response
 * round trip takes at least 80 ms (and not absurdly more). */
static void test_latency(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "lat"), 0);
    struct side a = {0}, b = {0};
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &a.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &b.peer), 0);
    struct p2p_ctx_config cc = {.loop = &loop, .latency_ms = 40, .auth = p2p_tk_auth_config(&tk)};
    assert_int_equal(p2p_ctx_new(&cc, &a.ctx), 0);
    struct p2p_host_config ha = {.key = &a.peer.key, .token = a.peer.token,
                                 .listen_ip = "127.0.0.1"};
    struct p2p_host_config hb = {.key = &b.peer.key, .token = b.peer.token,
                                 .listen_ip = "127.0.0.1"};
    assert_int_equal(p2p_host_new(a.ctx, &ha, &a.h), 0);
    assert_int_equal(p2p_host_new(a.ctx, &hb, &b.h), 0);
    char s[64];
    struct sockaddr_storage addr;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(b.h));
    p2p_addr_parse(s, &addr);
    for (int i = 0; i < 3; i++) {
        struct done d = {0};
        uint64_t t0 = uv_hrtime();
        assert_int_equal(p2p_request(a.h, (struct sockaddr *)&addr, b.peer.key.pub, P2P_MSG_PING,
                                     NULL, 0, 5000, on_done, &d),
                         0);
        while (!d.done)
            uv_run(&loop, UV_RUN_ONCE);
        double ms = (double)(uv_hrtime() - t0) / 1e6;
        printf("latency: round trip %.1f ms with 40 ms each way\n", ms);
        assert_int_equal(d.status, 0);
        assert_true(ms >= 79.0 && ms < 600.0);
    }
    p2p_host_close(a.h);
    p2p_host_close(b.h);
    p2p_ctx_free(a.ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    p2p_tk_peer_cleanup(&a.peer);
    p2p_tk_peer_cleanup(&b.peer);
    p2p_tk_cleanup(&tk);
}

/* Latency toward networks (p2p_latency_rule): rules parse and match, and
 * two delays at once keep the delay queue in due order. */
static void test_latency_rules_parse(void **state)
{
    (void)state;
    struct p2p_latency_rule r[P2P_MAX_LATENCY_RULES];
    size_t n = 0;
    char err[160];
    assert_int_equal(p2p_latency_rules_parse("10.77.0.0/25=40,fd00::/64=5,192.0.2.7=0", r, 8, &n, err,
                                             sizeof err),
                     CM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(r[0].bits, 25);
    assert_int_equal(r[0].ms, 40);
    assert_int_equal(r[2].bits, 32);
    struct sockaddr_storage a;
    assert_int_equal(p2p_addr_parse("10.77.0.127:9", &a), CM_OK);
    assert_int_equal(p2p_latency_rules_match(r, n, (struct sockaddr *)&a), 40);
    assert_int_equal(p2p_addr_parse("10.77.0.128:9", &a), CM_OK);
    assert_int_equal(p2p_latency_rules_match(r, n, (struct sockaddr *)&a), -1);
    assert_int_equal(p2p_addr_parse("[::ffff:10.77.0.3]:9", &a), CM_OK); /* mapped: the IPv4 rule */
    assert_int_equal(p2p_latency_rules_match(r, n, (struct sockaddr *)&a), 40);
    assert_int_equal(p2p_addr_parse("[fd00::1:2]:9", &a), CM_OK);
    assert_int_equal(p2p_latency_rules_match(r, n, (struct sockaddr *)&a), 5);
    assert_int_equal(p2p_addr_parse("192.0.2.7:1", &a), CM_OK);
    assert_int_equal(p2p_latency_rules_match(r, n, (struct sockaddr *)&a), 0);
    static const char *const BAD[] = {"", "10.0.0.0/8", "10.0.0.0/8=", "10.0.0.0/33=1", "10.0.0.0/8=10001",
                                      "10.0.0.0/8=-1", "10.0.0.0/x=1", "nothost/8=1", "10.0.0.0/8=4,",
                                      "1.1.1.1=1,2.2.2.2=1,3.3.3.3=1", "::/129=1", "10.0.0.0/8=1ms"};
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        err[0] = 0;
        assert_int_equal(p2p_latency_rules_parse(BAD[i], r, 2, &n, err, sizeof err), CM_EINVAL);
        assert_true(err[0] != 0);
    }
}

/* One context, two hosts: frames to 127.0.0.2 wait 80 ms, all others 20.
 * A Ping to the far host, then one to the near host: the near one's
 * request is due first though queued second, so its round trip is ~40 ms
 * (20 + the near host's 20 back), not the far one's 80 + 20. */
static void test_latency_rules_order(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "latr"), 0);
    struct side a = {0}, b = {0}, c = {0};
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &a.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &b.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "c", "3", 600, &c.peer), 0);
    struct p2p_latency_rule rules[1];
    size_t nr = 0;
    char err[160];
    assert_int_equal(p2p_latency_rules_parse("127.0.0.2/32=80", rules, 1, &nr, err, sizeof err), CM_OK);
    struct p2p_ctx_config cc = {.loop = &loop, .latency_ms = 20, .latency_rules = rules, .n_latency_rules = nr,
                                .auth = p2p_tk_auth_config(&tk)};
    assert_int_equal(p2p_ctx_new(&cc, &a.ctx), 0);
    struct p2p_host_config ha = {.key = &a.peer.key, .token = a.peer.token, .listen_ip = "127.0.0.1"};
    struct p2p_host_config hb = {.key = &b.peer.key, .token = b.peer.token, .listen_ip = "127.0.0.1"};
    struct p2p_host_config hc = {.key = &c.peer.key, .token = c.peer.token, .listen_ip = "127.0.0.2"};
    assert_int_equal(p2p_host_new(a.ctx, &ha, &a.h), 0);
    assert_int_equal(p2p_host_new(a.ctx, &hb, &b.h), 0);
    assert_int_equal(p2p_host_new(a.ctx, &hc, &c.h), 0);
    char s[64];
    struct sockaddr_storage near, far;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(b.h));
    p2p_addr_parse(s, &near);
    snprintf(s, sizeof s, "127.0.0.2:%u", p2p_host_port(c.h));
    p2p_addr_parse(s, &far);
    for (int i = 0; i < 3; i++) {
        struct done dn = {0}, df = {0};
        uint64_t t0 = uv_hrtime(), t_near = 0, t_far = 0;
        assert_int_equal(p2p_request(a.h, (struct sockaddr *)&far, c.peer.key.pub, P2P_MSG_PING, NULL, 0, 5000,
                                     on_done, &df),
                         0);
        assert_int_equal(p2p_request(a.h, (struct sockaddr *)&near, b.peer.key.pub, P2P_MSG_PING, NULL, 0, 5000,
                                     on_done, &dn),
                         0);
        while (!dn.done || !df.done) {
            uv_run(&loop, UV_RUN_ONCE);
            if (dn.done && !t_near)
                t_near = uv_hrtime();
            if (df.done && !t_far)
                t_far = uv_hrtime();
        }
        double ms_near = (double)(t_near - t0) / 1e6, ms_far = (double)(t_far - t0) / 1e6;
        printf("latency rules: near %.1f ms (20 + 20), far %.1f ms (80 + 20)\n", ms_near, ms_far);
        assert_int_equal(dn.status, 0);
        assert_int_equal(df.status, 0);
        assert_true(ms_near >= 39.0 && ms_near < 90.0);
        assert_true(ms_far >= 99.0 && ms_far < 600.0);
        assert_true(t_near < t_far);
    }
    p2p_host_close(a.h);
    p2p_host_close(b.h);
    p2p_host_close(c.h);
    p2p_ctx_free(a.ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    p2p_tk_peer_cleanup(&a.peer);
    p2p_tk_peer_cleanup(&b.peer);
    p2p_tk_peer_cleanup(&c.peer);
    p2p_tk_cleanup(&tk);
}

static void test_upload_cap(void **state)
{
    (void)state;
    double m = transfer(16.0, 0, 6u << 20);
    assert_true(fabs(m - 16.0) / 16.0 < 0.05);
}

static void test_download_cap(void **state)
{
    (void)state;
    double m = transfer(0, 16.0, 6u << 20);
    assert_true(fabs(m - 16.0) / 16.0 < 0.05);
}

/* Answers any request with an empty body. */
static int on_any(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type, const uint8_t *body,
                  size_t len, uint8_t **resp, size_t *resp_len)
{
    (void)arg, (void)h, (void)from, (void)type, (void)body, (void)len, (void)resp, (void)resp_len;
    return CM_OK;
}

/* Small frames go ahead of bulk ones on a capped upload (p2p_conn.c,
 * URGENT_FRAME): a process capped at 4 Mbit/s streams 1.5 MB (3 s) on one
 * connection and Pings another host meanwhile; each Ping's request leaves
 * at once instead of waiting for the stream's turns at the bucket, so the
 * round trip stays short, and the stream still runs at the cap. Behind the
 * stream the Pings took 0.2-0.9 s (a 4 Mbit/s peer's DHT answers held up
 * its partners' gatherings that long, test_schedule_follow). */
static void test_small_ahead_of_bulk(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "urgent"), 0);
    struct side a = {0}, b = {0}, c = {0};
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &a.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &b.peer), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "c", "3", 600, &c.peer), 0);
    struct p2p_ctx_config ca = {.loop = &loop, .max_upload_mbps = 4, .auth = p2p_tk_auth_config(&tk)};
    struct p2p_ctx_config cb = {.loop = &loop, .auth = p2p_tk_auth_config(&tk)};
    assert_int_equal(p2p_ctx_new(&ca, &a.ctx), 0);
    assert_int_equal(p2p_ctx_new(&cb, &b.ctx), 0);
    struct p2p_host_config ha = {.key = &a.peer.key, .token = a.peer.token, .listen_ip = "127.0.0.1", .arg = &a};
    struct p2p_host_config hb = {.key = &b.peer.key, .token = b.peer.token, .listen_ip = "127.0.0.1",
                                 .on_chunk = on_chunk, .arg = &b};
    struct p2p_host_config hc = {.key = &c.peer.key, .token = c.peer.token, .listen_ip = "127.0.0.1",
                                 .on_request = on_any, .arg = &c};
    /* requests of 1,400 bytes, the size of a DHT answer with a record or
       two: what waited longest, a whole quantum of the bucket */
    static const uint8_t small[1400];
    assert_int_equal(p2p_host_new(a.ctx, &ha, &a.h), 0);
    assert_int_equal(p2p_host_new(b.ctx, &hb, &b.h), 0);
    assert_int_equal(p2p_host_new(b.ctx, &hc, &c.h), 0);
    char s[64];
    struct sockaddr_storage addr_b, addr_c;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(b.h));
    p2p_addr_parse(s, &addr_b);
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(c.h));
    p2p_addr_parse(s, &addr_c);
    /* the Ping's connection first, so its opening is not measured */
    struct done d0 = {0};
    assert_int_equal(p2p_request(a.h, (struct sockaddr *)&addr_c, c.peer.key.pub, P2P_MSG_PING, NULL, 0, 5000,
                                 on_done, &d0),
                     0);
    while (!d0.done)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(d0.status, 0);

    size_t len = 1500u * 1000u;
    uint8_t *data = calloc(1, len);
    struct done d = {0};
    uint64_t t0 = uv_hrtime();
    assert_int_equal(p2p_stream_send(a.h, (struct sockaddr *)&addr_b, b.peer.key.pub, 1, data, len, 64 * 1024, 8,
                                     30000, on_done, &d),
                     0);
    while (!d.done && uv_hrtime() - t0 < 300000000ull)
        uv_run(&loop, UV_RUN_ONCE);
    double worst = 0, rtt[5];
    int np = 0;
    for (int i = 0; i < 5 && !d.done; i++) {
        struct done dp = {0};
        uint64_t p0 = uv_hrtime();
        assert_int_equal(p2p_request(a.h, (struct sockaddr *)&addr_c, c.peer.key.pub, 1000, small, sizeof small,
                                     5000, on_done, &dp),
                         0);
        while (!dp.done)
            uv_run(&loop, UV_RUN_ONCE);
        assert_int_equal(dp.status, 0);
        double ms = (double)(uv_hrtime() - p0) / 1e6;
        worst = ms > worst ? ms : worst;
        rtt[np++] = ms;
        uint64_t w0 = uv_hrtime();
        while (!d.done && uv_hrtime() - w0 < 200000000ull)
            uv_run(&loop, UV_RUN_ONCE);
    }
    while (!d.done)
        uv_run(&loop, UV_RUN_ONCE);
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    assert_int_equal(d.status, 0);
    assert_int_equal(b.got, len);
    struct p2p_stats sa;
    p2p_ctx_stats(a.ctx, &sa);
    double mbps = (double)sa.bytes_sent * 8 / secs / 1e6;
    printf("1,400-byte requests during a 4 Mbit/s upload, round trips (ms):");
    for (int i = 0; i < np; i++)
        printf(" %.1f", rtt[i]);
    printf("; the upload %.2f Mbit/s\n", mbps);
    assert_int_equal(np, 5);
    assert_true(worst < 100);
    assert_true(mbps < 4 * 1.05 && mbps > 4 * 0.9);
    free(data);
    p2p_host_close(a.h);
    p2p_host_close(b.h);
    p2p_host_close(c.h);
    p2p_ctx_free(a.ctx);
    p2p_ctx_free(b.ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    p2p_tk_peer_cleanup(&a.peer);
    p2p_tk_peer_cleanup(&b.peer);
    p2p_tk_peer_cleanup(&c.peer);
    p2p_tk_cleanup(&tk);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_burst),
        cmocka_unit_test(test_latency),
        cmocka_unit_test(test_latency_rules_parse),
        cmocka_unit_test(test_latency_rules_order),
        cmocka_unit_test(test_upload_cap),
        cmocka_unit_test(test_download_cap),
        cmocka_unit_test(test_small_ahead_of_bulk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
