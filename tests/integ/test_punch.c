/* ct-timeout: 120 */
/* Hole punching (issue 17; p2p_relay.h, common/p2p/p2p_punch.c) on a test
 * bed of network namespaces (tests/harness/ct_net.h; root needed): a relay
 * on a public host; Y behind a port-preserving ("cone-like") MASQUERADE
 * router and Z behind a --random-fully ("symmetric-like") one, each
 * reachable only through its port at the relay; X behind a third,
 * cone-like router. X punches a hole to Y 20 times (a fresh host each
 * time): at least 18 must connect directly, and a request then reaches Y
 * from X's router's address, not the relay's. To Z the punch fails (the
 * NAT does not keep the announced port) and the request still goes
 * through the relay. W sits behind X's own router: a punch there would
 * need the router to hairpin, so X and W meet on the router's network
 * (both know their address there); the request then reaches W from X's
 * own address, and without that address the punch is refused at once and
 * the relay carries it. Each peer is a process of its own in its
 * namespace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_err.h"
#include "ct_harness.h"
#include "ct_net.h"
#include "p2p/p2p_relay.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

#define RELAY_PORT 31901
#define ATTEMPTS 20

static struct p2p_tk g_tk;
static struct p2p_tk_peer g_r, g_x, g_y, g_z, g_w;
static struct ct_net g_net;
static int g_relay, g_hx, g_hy, g_hz, g_hw, g_rx, g_ry, g_rz;
static uint16_t g_port_y, g_port_z, g_port_w;

struct env {
    uv_loop_t loop;
    struct p2p_ctx *ctx;
    struct p2p_host *h;
    int reserved, done, status;
    struct sockaddr_storage adv;
    char body[64];
    int64_t ms;
};

/* Type 100: answers with the address the request came from. */
static int whence(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type, const uint8_t *body,
                  size_t len, uint8_t **resp, size_t *rlen)
{
    (void)arg, (void)h, (void)body, (void)len;
    if (type != 100)
        return CM_EUNSUPPORTED;
    char a[64];
    inet_ntop(AF_INET, &((const struct sockaddr_in *)&from->addr)->sin_addr, a, sizeof a);
    *rlen = strlen(a);
    *resp = malloc(*rlen + 1);
    memcpy(*resp, a, *rlen);
    return CM_OK;
}

/* Gives h an address (public or local) with setter; nonzero on failure. */
static int set_ip(struct p2p_host *h, const char *ip, int (*setter)(struct p2p_host *, const struct sockaddr *))
{
    struct sockaddr_storage a;
    char s[64];
    snprintf(s, sizeof s, "%s:1", ip);
    return p2p_addr_parse(s, &a) || setter(h, (struct sockaddr *)&a);
}

static void env_init(struct env *e, struct p2p_tk_peer *who, const char *listen_ip, uint16_t port,
                     const char *public_ip, const char *local_ip)
{
    memset(e, 0, sizeof *e);
    uv_loop_init(&e->loop);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&g_tk)};
    if (p2p_ctx_new(&cc, &e->ctx))
        _exit(2);
    struct p2p_host_config hc = {.key = &who->key, .token = who->token, .listen_ip = listen_ip,
                                 .listen_port = port, .on_request = whence, .arg = e};
    if (p2p_host_new(e->ctx, &hc, &e->h))
        _exit(2);
    if ((public_ip && set_ip(e->h, public_ip, p2p_host_set_public_ip)) ||
        (local_ip && set_ip(e->h, local_ip, p2p_host_set_local_ip)))
        _exit(2);
}

static void on_relay(void *arg, int status, const struct sockaddr *adv)
{
    struct env *e = arg;
    e->reserved = status == CM_OK ? 1 : -1;
    if (status == CM_OK)
        memcpy(&e->adv, adv, sizeof(struct sockaddr_in));
}

static void on_punch(void *arg, int status, const struct sockaddr *direct, int64_t ms)
{
    struct env *e = arg;
    (void)direct;
    e->done = 1;
    e->status = status;
    e->ms = ms;
}

static void on_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *body, size_t len)
{
    struct env *e = arg;
    (void)from;
    e->done = 1;
    e->status = status;
    snprintf(e->body, sizeof e->body, "%.*s", (int)(len < 63 ? len : 63), (const char *)body);
}

static void run_until(struct env *e, int *flag)
{
    while (!*flag)
        uv_run(&e->loop, UV_RUN_ONCE);
}

static void relay_main(void)
{
    struct env e;
    env_init(&e, &g_r, "0.0.0.0", RELAY_PORT, NULL, NULL);
    if (p2p_host_relay_enable(e.h, NULL))
        _exit(2);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* A NAT'ed responder: reserves at the relay, tells the parent its port,
 * serves until killed. */
static void responder_main(struct p2p_tk_peer *who, int host, int router, int wfd)
{
    struct env e;
    env_init(&e, who, NULL, 0, g_net.r[router].wan_ip, g_net.h[host].ip);
    char s[64];
    snprintf(s, sizeof s, "%s:%d", g_net.h[g_relay].ip, RELAY_PORT);
    struct sockaddr_storage ra;
    for (int tries = 0; tries < 50 && e.reserved != 1; tries++) {
        e.reserved = 0;
        if (p2p_addr_parse(s, &ra) || p2p_host_relay_use(e.h, (struct sockaddr *)&ra, g_r.key.pub, 2000, on_relay, &e))
            _exit(2);
        while (!e.reserved)
            uv_run(&e.loop, UV_RUN_ONCE);
        if (e.reserved != 1)
            usleep(100000);
    }
    uint16_t port = e.reserved == 1 ? ntohs(((struct sockaddr_in *)&e.adv)->sin_port) : 0;
    if (write(wfd, &port, sizeof port) != (ssize_t)sizeof port)
        _exit(2);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* One punch from a fresh host of X's (knowing its address on its network
 * when `local`), then one request; *from gets the address the responder
 * saw the request come from. */
static int punch_once(uint16_t port, const uint8_t *pub, int local, int64_t *ms, char *from, size_t cap)
{
    struct env e;
    env_init(&e, &g_x, NULL, 0, g_net.r[g_rx].wan_ip, local ? g_net.h[g_hx].ip : NULL);
    char s[64];
    snprintf(s, sizeof s, "%s:%u", g_net.h[g_relay].ip, port);
    struct sockaddr_storage target;
    if (p2p_addr_parse(s, &target) || p2p_host_punch(e.h, (struct sockaddr *)&target, pub, 3000, on_punch, &e))
        return CM_EINVAL;
    run_until(&e, &e.done);
    int punched = e.status;
    *ms = e.ms;
    e.done = 0;
    if (p2p_request(e.h, (struct sockaddr *)&target, pub, 100, (const uint8_t *)"?", 1, 5000, on_resp, &e))
        return CM_EINVAL;
    run_until(&e, &e.done);
    snprintf(from, cap, "%s", e.status == CM_OK ? e.body : "(failed)");
    p2p_host_close(e.h);
    p2p_ctx_free(e.ctx);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    uv_loop_close(&e.loop);
    return punched;
}

/* X: the punches; exits 0 when every check holds. */
static void initiator_main(void)
{
    int ok = 0, direct_seen = 0;
    int64_t ms_sum = 0, ms_max = 0;
    for (int i = 0; i < ATTEMPTS; i++) {
        int64_t ms = 0;
        char from[64];
        int rc = punch_once(g_port_y, g_y.key.pub, 1, &ms, from, sizeof from);
        if (rc == CM_OK) {
            ok++;
            ms_sum += ms;
            ms_max = ms > ms_max ? ms : ms_max;
            direct_seen += !strcmp(from, g_net.r[g_rx].wan_ip);
        } else {
            printf("attempt %d: %s (request answered from %s)\n", i, cm_strerror(rc), from);
        }
    }
    printf("hole punching between two cone-like NATs: %d of %d direct, %d requests then came from X's router "
           "(not the relay); time to connect: mean %.1f ms, worst %lld ms\n",
           ok, ATTEMPTS, direct_seen, ok ? (double)ms_sum / ok : 0.0, (long long)ms_max);
    int64_t ms = 0;
    char from[64];
    int rc = punch_once(g_port_z, g_z.key.pub, 1, &ms, from, sizeof from);
    printf("to the symmetric-like NAT: %s after %lld ms; the request came through %s (the relay is %s)\n",
           rc == CM_OK ? "connected" : cm_strerror(rc), (long long)ms, from, g_net.h[g_relay].ip);
    int pass = ok >= ATTEMPTS * 9 / 10 && direct_seen == ok && rc != CM_OK && !strcmp(from, g_net.h[g_relay].ip);
    /* W, behind X's own router: on the router's network, every time */
    int lan_ok = 0, lan_from = 0;
    for (int i = 0; i < 5; i++) {
        char wf[64];
        int wrc = punch_once(g_port_w, g_w.key.pub, 1, &ms, wf, sizeof wf);
        lan_ok += wrc == CM_OK;
        lan_from += wrc == CM_OK && !strcmp(wf, g_net.h[g_hx].ip);
        if (wrc != CM_OK)
            printf("to W behind the same router, attempt %d: %s\n", i, cm_strerror(wrc));
    }
    printf("to W behind the same router: %d of 5 connected on the router's network, %d requests then came "
           "from X's own address %s\n",
           lan_ok, lan_from, g_net.h[g_hx].ip);
    /* without its address there, X is refused at once and keeps the relay */
    char wf[64];
    int wrc = punch_once(g_port_w, g_w.key.pub, 0, &ms, wf, sizeof wf);
    printf("to W without X's network address: %s after %lld ms; the request came through %s\n",
           wrc == CM_OK ? "connected" : cm_strerror(wrc), (long long)ms, wf);
    pass = pass && lan_ok == 5 && lan_from == 5 && wrc == CM_ECONN && ms < 1000 &&
           !strcmp(wf, g_net.h[g_relay].ip);
    fflush(stdout);
    _exit(pass ? 0 : 1);
}

static pid_t fork_in(int host, int kind, int wfd)
{
    pid_t p = fork();
    if (p == 0) {
        if (ct_net_enter(&g_net, host))
            _exit(2);
        if (kind == 0)
            relay_main();
        else if (kind == 1)
            responder_main(&g_y, g_hy, g_ry, wfd);
        else if (kind == 2)
            responder_main(&g_z, g_hz, g_rz, wfd);
        else if (kind == 3)
            responder_main(&g_w, g_hw, g_rx, wfd);
        else
            initiator_main();
        _exit(0);
    }
    return p;
}

static void test_punch(void **state)
{
    (void)state;
    int py_fd[2], pz_fd[2], pw_fd[2];
    assert_int_equal(pipe(py_fd), 0);
    assert_int_equal(pipe(pz_fd), 0);
    assert_int_equal(pipe(pw_fd), 0);
    pid_t pr = fork_in(g_relay, 0, -1);
    usleep(300000);
    pid_t py = fork_in(g_hy, 1, py_fd[1]), pz = fork_in(g_hz, 2, pz_fd[1]), pw = fork_in(g_hw, 3, pw_fd[1]);
    assert_int_equal(read(py_fd[0], &g_port_y, sizeof g_port_y), (ssize_t)sizeof g_port_y);
    assert_int_equal(read(pz_fd[0], &g_port_z, sizeof g_port_z), (ssize_t)sizeof g_port_z);
    assert_int_equal(read(pw_fd[0], &g_port_w, sizeof g_port_w), (ssize_t)sizeof g_port_w);
    assert_true(g_port_y && g_port_z && g_port_w);
    pid_t px = fork_in(g_hx, 4, -1);
    int st = ct_wait(px, 100);
    kill(py, SIGKILL);
    kill(pz, SIGKILL);
    kill(pw, SIGKILL);
    kill(pr, SIGKILL);
    ct_wait(py, 10);
    ct_wait(pz, 10);
    ct_wait(pw, 10);
    ct_wait(pr, 10);
    for (int i = 0; i < 2; i++) {
        close(py_fd[i]);
        close(pz_fd[i]);
        close(pw_fd[i]);
    }
    assert_int_equal(st, 0);
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc || p2p_tk_init(&g_tk, "punch") || p2p_tk_peer_new(&g_tk, "relay", "1", 3600, &g_r) ||
        p2p_tk_peer_new(&g_tk, "x", "2", 3600, &g_x) || p2p_tk_peer_new(&g_tk, "y", "3", 3600, &g_y) ||
        p2p_tk_peer_new(&g_tk, "z", "4", 3600, &g_z) || p2p_tk_peer_new(&g_tk, "w", "5", 3600, &g_w))
        return -1;
    g_relay = ct_net_public(&g_net, "relay");
    g_rx = ct_net_router(&g_net, 0);
    g_ry = ct_net_router(&g_net, 0);
    g_rz = ct_net_router(&g_net, 1);
    if (g_relay < 0 || g_rx < 0 || g_ry < 0 || g_rz < 0 || ct_net_router_stealth(&g_net, g_rx) ||
        ct_net_router_stealth(&g_net, g_ry) || ct_net_router_stealth(&g_net, g_rz))
        return -1;
    g_hx = ct_net_private(&g_net, "x", g_rx);
    g_hy = ct_net_private(&g_net, "y", g_ry);
    g_hz = ct_net_private(&g_net, "z", g_rz);
    g_hw = ct_net_private(&g_net, "w", g_rx);
    return g_hx < 0 || g_hy < 0 || g_hz < 0 || g_hw < 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    ct_net_destroy(&g_net);
    p2p_tk_peer_cleanup(&g_r);
    p2p_tk_peer_cleanup(&g_x);
    p2p_tk_peer_cleanup(&g_y);
    p2p_tk_peer_cleanup(&g_z);
    p2p_tk_peer_cleanup(&g_w);
    p2p_tk_cleanup(&g_tk);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_punch)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
