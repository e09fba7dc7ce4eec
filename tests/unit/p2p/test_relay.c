/* Circuit relays (p2p_relay.h, docs/protocol.md "Relays"): a peer without a
 * listening socket (x) reserves a port at a relay (r) and is reached there
 * by a dialer (d) with the ordinary transport: requests, a 3 MiB stream and
 * a session all arrive from x's key; a request addressed to another key is
 * refused by x; the relay's limits refuse reservations and circuits beyond
 * them (a flood from one address leaves another dialer unaffected); x
 * learns within a second when the relay goes away and can reserve again
 * elsewhere; a relay path that alters or replays bytes gets the connection
 * dropped by the receiving end (counted), and the next request works. Real
 * hosts on loopback, each in a context of its own. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "p2p/p2p_relay.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

#define STREAM_LEN (3u * 1024u * 1024u)

struct env {
    uv_loop_t loop;
    struct p2p_tk tk;
    struct p2p_ctx *cr, *cx, *cd;
    struct p2p_tk_peer r, x, d, y;
    struct p2p_host *hr, *hx, *hd, *hy;
    /* x's reservation */
    int reserved, lost, lost_status;
    struct sockaddr_storage adv;
    /* what x received */
    uint8_t *got;
    size_t got_len;
    int stream_done;
};

struct result {
    int done, status;
    uint8_t pub[32];
    uint8_t body[64];
    size_t len;
};

static void on_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct result *res = arg;
    res->done = 1;
    res->status = status;
    if (from)
        memcpy(res->pub, from->pub, 32);
    res->len = len < sizeof res->body ? len : sizeof res->body;
    if (len)
        memcpy(res->body, body, res->len);
}

/* x's service: type 100 echoes the body. */
static int echo(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    (void)arg, (void)h, (void)from;
    if (type != 100)
        return CM_EUNSUPPORTED;
    *resp = malloc(len ? len : 1);
    memcpy(*resp, body, len);
    *rlen = len;
    return CM_OK;
}

static int on_chunk(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint64_t sid,
                    uint64_t off, uint64_t total, const uint8_t *data, size_t len, int last)
{
    struct env *e = arg;
    (void)h, (void)from, (void)sid;
    if (!e->got)
        e->got = calloc(1, total);
    if (off + len > total)
        return CM_ERANGE;
    memcpy(e->got + off, data, len);
    e->got_len += len;
    if (last)
        e->stream_done = 1;
    return CM_OK;
}

static void on_relay(void *arg, int status, const struct sockaddr *adv)
{
    struct env *e = arg;
    if (status == CM_OK) {
        e->reserved = 1;
        memcpy(&e->adv, adv, adv->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                       : sizeof(struct sockaddr_in6));
    } else {
        e->lost = 1;
        e->lost_status = status;
    }
}

static void run_until(struct env *e, int *flag, int ms)
{
    int64_t end = p2p_now_ms() + ms;
    while (!*flag && p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
}

static void run_ms(struct env *e, int ms)
{
    int never = 0;
    run_until(e, &never, ms);
}

static struct sockaddr_storage host_addr(struct p2p_host *h)
{
    char s[64];
    struct sockaddr_storage a;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(h));
    assert_int_equal(p2p_addr_parse(s, &a), 0);
    return a;
}

static int setup_with(void **state, const struct p2p_relay_limits *lim)
{
    struct env *e = calloc(1, sizeof *e);
    uv_loop_init(&e->loop);
    assert_int_equal(p2p_tk_init(&e->tk, "testrun"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "relay", "1", 3600, &e->r), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "natted", "2", 3600, &e->x), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "dialer", "3", 3600, &e->d), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "other", "4", 3600, &e->y), 0);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk)};
    assert_int_equal(p2p_ctx_new(&cc, &e->cr), 0);
    assert_int_equal(p2p_ctx_new(&cc, &e->cx), 0);
    assert_int_equal(p2p_ctx_new(&cc, &e->cd), 0);
    struct p2p_host_config hr = {.key = &e->r.key, .token = e->r.token, .listen_ip = "127.0.0.1"};
    struct p2p_host_config hx = {.key = &e->x.key, .token = e->x.token, .on_request = echo,
                                 .on_chunk = on_chunk, .arg = e};
    struct p2p_host_config hd = {.key = &e->d.key, .token = e->d.token};
    struct p2p_host_config hy = {.key = &e->y.key, .token = e->y.token, .on_request = echo};
    assert_int_equal(p2p_host_new(e->cr, &hr, &e->hr), 0);
    assert_int_equal(p2p_host_new(e->cx, &hx, &e->hx), 0);
    assert_int_equal(p2p_host_new(e->cd, &hd, &e->hd), 0);
    assert_int_equal(p2p_host_new(e->cx, &hy, &e->hy), 0);
    assert_int_equal(p2p_host_relay_enable(e->hx, NULL), CM_EINVAL); /* does not listen */
    assert_int_equal(p2p_host_relay_enable(e->hr, lim), 0);
    *state = e;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, NULL);
}

static int setup_small(void **state)
{
    struct p2p_relay_limits lim = {.max_reservations = 1, .max_per_ip = 4, .max_pending = 8};
    return setup_with(state, &lim);
}

static int teardown(void **state)
{
    struct env *e = *state;
    struct p2p_host *hs[] = {e->hr, e->hx, e->hd, e->hy};
    for (size_t i = 0; i < 4; i++)
        if (hs[i])
            p2p_host_close(hs[i]);
    p2p_ctx_free(e->cr);
    p2p_ctx_free(e->cx);
    p2p_ctx_free(e->cd);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    p2p_tk_peer_cleanup(&e->r);
    p2p_tk_peer_cleanup(&e->x);
    p2p_tk_peer_cleanup(&e->d);
    p2p_tk_peer_cleanup(&e->y);
    p2p_tk_cleanup(&e->tk);
    free(e->got);
    free(e);
    return 0;
}

static void reserve(struct env *e)
{
    struct sockaddr_storage ra = host_addr(e->hr);
    assert_int_equal(p2p_host_relay_use(e->hx, (struct sockaddr *)&ra, e->r.key.pub, 3000,
                                        on_relay, e),
                     0);
    assert_int_equal(p2p_host_relay_use(e->hx, (struct sockaddr *)&ra, e->r.key.pub, 3000,
                                        on_relay, e),
                     CM_ESTATE); /* one relay at a time */
    run_until(e, &e->reserved, 3000);
    assert_true(e->reserved);
    assert_false(e->lost);
    /* the relay's address with a port of its own */
    assert_int_equal(e->adv.ss_family, AF_INET);
    assert_int_equal(((struct sockaddr_in *)&e->adv)->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    assert_int_not_equal(ntohs(((struct sockaddr_in *)&e->adv)->sin_port), p2p_host_port(e->hr));
}

static void ask(struct env *e, struct p2p_host *from, const uint8_t *to_pub, const char *msg,
                struct result *res)
{
    memset(res, 0, sizeof *res);
    assert_int_equal(p2p_request(from, (struct sockaddr *)&e->adv, to_pub, 100,
                                 (const uint8_t *)msg, strlen(msg), 3000, on_resp, res),
                     0);
    run_until(e, &res->done, 5000);
    assert_true(res->done);
}

static void test_relayed_requests_and_stream(void **state)
{
    struct env *e = *state;
    reserve(e);
    /* eight requests: the connection is upgraded to a session after four,
       negotiated end to end between d and x through the relay */
    for (int i = 0; i < 8; i++) {
        char m[32];
        snprintf(m, sizeof m, "hello %d", i);
        struct result res;
        ask(e, e->hd, e->x.key.pub, m, &res);
        assert_int_equal(res.status, CM_OK);
        assert_memory_equal(res.pub, e->x.key.pub, 32);
        assert_int_equal(res.len, strlen(m));
        assert_memory_equal(res.body, m, strlen(m));
    }
    struct p2p_stats sx, sd;
    p2p_ctx_stats(e->cx, &sx);
    p2p_ctx_stats(e->cd, &sd);
    assert_int_equal(sx.sessions, 1);
    assert_int_equal(sd.sessions, 1);
    assert_int_equal(sd.conns_opened, 1); /* one circuit carried everything */
    /* a stream of 3 MiB, chunk by chunk with a window */
    uint8_t *data = malloc(STREAM_LEN);
    for (size_t i = 0; i < STREAM_LEN; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 13);
    struct result done = {0};
    assert_int_equal(p2p_stream_send(e->hd, (struct sockaddr *)&e->adv, e->x.key.pub, 7, data,
                                     STREAM_LEN, 0, 4, 5000, on_resp, &done),
                     0);
    run_until(e, &done.done, 20000);
    assert_int_equal(done.status, CM_OK);
    assert_true(e->stream_done);
    assert_int_equal(e->got_len, STREAM_LEN);
    assert_memory_equal(e->got, data, STREAM_LEN);
    free(data);
    struct p2p_relay_stats rs, xs;
    p2p_host_relay_stats(e->hr, &rs);
    p2p_host_relay_stats(e->hx, &xs);
    printf("relay: %llu reservation(s), %llu circuit(s), %llu bytes forwarded; x accepted %llu\n",
           (unsigned long long)rs.reservations, (unsigned long long)rs.circuits,
           (unsigned long long)rs.bytes, (unsigned long long)xs.accepted);
    assert_int_equal(rs.reservations, 1);
    assert_int_equal(rs.live_reservations, 1);
    assert_int_equal(rs.circuits, 1);
    assert_int_equal(xs.accepted, 1);
    assert_true(rs.bytes > STREAM_LEN);
    /* the relay never served a request of its own beyond the relay's */
    struct p2p_stats sr;
    p2p_ctx_stats(e->cr, &sr);
    assert_int_equal(sr.drops, 0);
}

static void test_misaddressed(void **state)
{
    struct env *e = *state;
    reserve(e);
    /* a request for the relay's key at x's lent port reaches x, which is
       not the peer asked for: dropped, the request fails */
    struct result res;
    ask(e, e->hd, e->r.key.pub, "for r", &res);
    assert_int_not_equal(res.status, CM_OK);
    assert_true(p2p_auth_rejects(p2p_ctx_auth(e->cx), P2P_REJ_RECIPIENT) >= 1);
    /* and x is still reached there afterwards, on a new circuit */
    ask(e, e->hd, e->x.key.pub, "for x", &res);
    assert_int_equal(res.status, CM_OK);
    assert_memory_equal(res.pub, e->x.key.pub, 32);
}

/* Opens n raw TCP connections from 127.0.0.2 to the port (a flood). */
static void flood(int *fds, int n, uint16_t port)
{
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fds[i] >= 0);
        struct sockaddr_in src = {.sin_family = AF_INET};
        inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
        assert_int_equal(bind(fds[i], (struct sockaddr *)&src, sizeof src), 0);
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
        dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&dst, sizeof dst), 0);
    }
}

static void test_limits_and_flood(void **state)
{
    struct env *e = *state;
    reserve(e);
    /* max_reservations 1: y is refused */
    struct sockaddr_storage ra = host_addr(e->hr);
    int y_reserved = 0;
    struct env ey = {0};
    assert_int_equal(p2p_host_relay_use(e->hy, (struct sockaddr *)&ra, e->r.key.pub, 3000,
                                        on_relay, &ey),
                     0);
    run_until(e, &ey.lost, 3000);
    assert_true(ey.lost);
    assert_int_equal(ey.lost_status, CM_EBUSY);
    assert_false(ey.reserved);
    (void)y_reserved;
    /* 20 connections from one address: 4 (max_per_ip) become circuits */
    int fds[20];
    flood(fds, 20, ntohs(((struct sockaddr_in *)&e->adv)->sin_port));
    run_ms(e, 500);
    struct p2p_relay_stats rs;
    p2p_host_relay_stats(e->hr, &rs);
    printf("flood: %llu circuits, %llu refused\n", (unsigned long long)rs.circuits,
           (unsigned long long)rs.circuits_refused);
    assert_int_equal(rs.circuits, 4);
    assert_int_equal(rs.circuits_refused, 16);
    /* a dialer from another address is not affected */
    struct result res;
    ask(e, e->hd, e->x.key.pub, "still here", &res);
    assert_int_equal(res.status, CM_OK);
    assert_memory_equal(res.body, "still here", 10);
    for (int i = 0; i < 20; i++)
        close(fds[i]);
    run_ms(e, 300);
    p2p_host_relay_stats(e->hr, &rs);
    assert_int_equal(rs.live_circuits, 1); /* d's; the flood's closed */
}

static void test_relay_gone(void **state)
{
    struct env *e = *state;
    reserve(e);
    struct result res;
    ask(e, e->hd, e->x.key.pub, "before", &res);
    assert_int_equal(res.status, CM_OK);
    int64_t t0 = p2p_now_ms();
    p2p_host_close(e->hr);
    e->hr = NULL;
    run_until(e, &e->lost, 5000);
    assert_true(e->lost);
    printf("x learnt that its relay was gone after %lld ms\n", (long long)(p2p_now_ms() - t0));
    assert_true(p2p_now_ms() - t0 < 1000);
    /* another relay: x reserves there and is reached again */
    struct p2p_host_config hr = {.key = &e->y.key, .token = e->y.token, .listen_ip = "127.0.0.1"};
    assert_int_equal(p2p_host_new(e->cr, &hr, &e->hr), 0);
    assert_int_equal(p2p_host_relay_enable(e->hr, NULL), 0);
    struct sockaddr_storage ra = host_addr(e->hr);
    e->reserved = e->lost = 0;
    assert_int_equal(p2p_host_relay_use(e->hx, (struct sockaddr *)&ra, e->y.key.pub, 3000,
                                        on_relay, e),
                     0);
    run_until(e, &e->reserved, 3000);
    assert_true(e->reserved);
    ask(e, e->hd, e->x.key.pub, "after", &res);
    assert_int_equal(res.status, CM_OK);
    assert_memory_equal(res.pub, e->x.key.pub, 32);
}

/* ---- a relay path that tampers: d -> proxy -> lent port -> x ---------- */

struct proxy {
    int lfd;
    uint16_t port, to;
    int mode; /* 1: flip a byte of the second frame d sends; 2: send d's first frame twice */
    pthread_t th;
};

static int read_full(int fd, uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* Forwards one connection both ways; d's frames are read whole (8-byte
 * header with a big-endian length) so the tampering hits a frame. */
static void *proxy_main(void *arg)
{
    struct proxy *p = arg;
    int a = accept(p->lfd, NULL, NULL);
    if (a < 0)
        return NULL;
    int b = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(p->to)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(b, (struct sockaddr *)&dst, sizeof dst)) {
        close(a);
        close(b);
        return NULL;
    }
    int frames = 0;
    static uint8_t buf[400 * 1024];
    for (;;) {
        struct pollfd pf[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        if (poll(pf, 2, 5000) <= 0)
            break;
        if (pf[0].revents) {
            if (read_full(a, buf, 8))
                break;
            uint32_t len = (uint32_t)buf[4] << 24 | (uint32_t)buf[5] << 16 |
                           (uint32_t)buf[6] << 8 | buf[7];
            if (len > sizeof buf - 8 || read_full(a, buf + 8, len))
                break;
            frames++;
            /* the last byte of the body: the envelope ends with the body
               (field 10) and the signature (field 11, 2 + 64 bytes) */
            if (p->mode == 1 && frames == 2 && len > 80)
                buf[8 + len - 67] ^= 0x40;
            if (write(b, buf, 8 + len) != (ssize_t)(8 + len))
                break;
            if (p->mode == 2 && frames == 1 && write(b, buf, 8 + len) != (ssize_t)(8 + len))
                break;
        }
        if (pf[1].revents) {
            ssize_t k = read(b, buf, sizeof buf);
            if (k <= 0 || write(a, buf, (size_t)k) != k)
                break;
        }
    }
    close(a);
    close(b);
    return NULL;
}

static void proxy_start(struct proxy *p, uint16_t to, int mode)
{
    p->to = to;
    p->mode = mode;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(p->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(p->lfd, 4), 0);
    socklen_t l = sizeof a;
    getsockname(p->lfd, (struct sockaddr *)&a, &l);
    p->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&p->th, NULL, proxy_main, p), 0);
}

static void tampered(struct env *e, int mode, enum p2p_reject expect)
{
    reserve(e);
    struct proxy px;
    proxy_start(&px, ntohs(((struct sockaddr_in *)&e->adv)->sin_port), mode);
    struct sockaddr_storage via;
    char s[64];
    snprintf(s, sizeof s, "127.0.0.1:%u", px.port);
    assert_int_equal(p2p_addr_parse(s, &via), 0);
    uint64_t before = p2p_auth_rejects(p2p_ctx_auth(e->cx), expect);
    struct result r1 = {0}, r2 = {0};
    assert_int_equal(p2p_request(e->hd, (struct sockaddr *)&via, e->x.key.pub, 100,
                                 (const uint8_t *)"one", 3, 1500, on_resp, &r1),
                     0);
    assert_int_equal(p2p_request(e->hd, (struct sockaddr *)&via, e->x.key.pub, 100,
                                 (const uint8_t *)"two", 3, 1500, on_resp, &r2),
                     0);
    run_until(e, &r2.done, 5000);
    run_until(e, &r1.done, 5000);
    pthread_join(px.th, NULL);
    close(px.lfd);
    uint64_t after = p2p_auth_rejects(p2p_ctx_auth(e->cx), expect);
    printf("mode %d: first request %s, second %s; x counted %llu rejection(s) (%s)\n", mode,
           cm_strerror(r1.status), cm_strerror(r2.status), (unsigned long long)(after - before),
           p2p_reject_name(expect));
    assert_int_equal(after - before, 1);
    /* nothing altered or replayed was ever served as sent: the tampered
       frame's request did not get an answer */
    assert_int_not_equal(r2.status, CM_OK);
    /* the honest path still works */
    struct result res;
    ask(e, e->hd, e->x.key.pub, "clean", &res);
    assert_int_equal(res.status, CM_OK);
    assert_memory_equal(res.body, "clean", 5);
}

static void test_relay_alters_bytes(void **state)
{
    tampered(*state, 1, P2P_REJ_SIGNATURE);
}

static void test_relay_replays(void **state)
{
    tampered(*state, 2, P2P_REJ_REPLAY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_relayed_requests_and_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misaddressed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_and_flood, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_relay_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_alters_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_replays, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
