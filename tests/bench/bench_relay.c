/* Relayed throughput (issue 17; `make bench`): how much of a relay's link a
 * NAT'ed peer gets through a circuit relay (common/p2p/p2p_relay.h).
 *
 * Test bed of network namespaces (tests/harness/ct_net.h; root needed): a
 * relay on a public host whose link is capped with tc tbf (both
 * directions), a sender on another public host (uncapped), a receiver
 * behind a port-preserving MASQUERADE router. The receiver reserves a port
 * at the relay; the sender streams 48 MiB (256 KiB chunks, 8 in flight,
 * every chunk authenticated end to end) to the receiver's relayed address.
 * The same stream straight to the relay host, measured in the same run, is
 * the reference: the best the capped link gives this transport.
 *
 * Prints per cap: the relayed rate, the direct rate, relayed / cap and
 * relayed / direct; goal relayed / cap >= 0.8. Each process is its own
 * namespace's: the three run as forked children. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "ct_harness.h"
#include "ct_net.h"
#include "p2p/p2p_relay.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

#define STREAM_MB 48
#define RELAY_PORT 31900

static struct p2p_tk g_tk;
static struct p2p_tk_peer g_r, g_x, g_d;
static struct ct_net g_net;

struct loop_env {
    uv_loop_t loop;
    struct p2p_ctx *ctx;
    struct p2p_host *h;
    uint64_t got;
    int done, status, reserved;
    struct sockaddr_storage adv;
};

static int on_chunk(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint64_t sid, uint64_t off,
                    uint64_t total, const uint8_t *data, size_t len, int last)
{
    struct loop_env *e = arg;
    (void)h, (void)from, (void)sid, (void)off, (void)total, (void)data, (void)last;
    e->got += len;
    return CM_OK;
}

static void on_relay(void *arg, int status, const struct sockaddr *adv)
{
    struct loop_env *e = arg;
    if (status == CM_OK) {
        e->reserved = 1;
        memcpy(&e->adv, adv, sizeof(struct sockaddr_in));
    } else {
        e->reserved = -1;
    }
}

static void on_sent(void *arg, int status, const struct p2p_peer *from, const uint8_t *body, size_t len)
{
    struct loop_env *e = arg;
    (void)from, (void)body, (void)len;
    e->done = 1;
    e->status = status;
}

static void env_init(struct loop_env *e, struct p2p_tk_peer *who, const char *listen_ip, uint16_t port)
{
    memset(e, 0, sizeof *e);
    uv_loop_init(&e->loop);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&g_tk)};
    if (p2p_ctx_new(&cc, &e->ctx))
        _exit(2);
    struct p2p_host_config hc = {.key = &who->key, .token = who->token, .listen_ip = listen_ip,
                                 .listen_port = port, .on_chunk = on_chunk, .arg = e};
    if (p2p_host_new(e->ctx, &hc, &e->h))
        _exit(2);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The relay: serves until killed. */
static void relay_main(void)
{
    struct loop_env e;
    env_init(&e, &g_r, "0.0.0.0", RELAY_PORT);
    if (p2p_host_relay_enable(e.h, NULL))
        _exit(2);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* The NAT'ed receiver: reserves, tells the parent its address, serves. */
static void receiver_main(int wfd, const char *relay_ip)
{
    struct loop_env e;
    env_init(&e, &g_x, NULL, 0);
    char s[64];
    snprintf(s, sizeof s, "%s:%d", relay_ip, RELAY_PORT);
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
    if (e.reserved != 1)
        _exit(3);
    uint16_t port = ntohs(((struct sockaddr_in *)&e.adv)->sin_port);
    if (write(wfd, &port, sizeof port) != (ssize_t)sizeof port)
        _exit(2);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* The sender: one stream to addr (to key pub), its rate in Mbit/s. */
static double send_stream(const char *addr, const uint8_t *pub)
{
    struct loop_env e;
    env_init(&e, &g_d, NULL, 0);
    size_t n = (size_t)STREAM_MB << 20;
    uint8_t *data = malloc(n);
    if (!data)
        return -1;
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 11);
    struct sockaddr_storage a;
    if (p2p_addr_parse(addr, &a))
        return -1;
    double t0 = now_s();
    if (p2p_stream_send(e.h, (struct sockaddr *)&a, pub, 1, data, n, 256 * 1024, 8, 20000, on_sent, &e))
        return -1;
    while (!e.done)
        uv_run(&e.loop, UV_RUN_ONCE);
    double dt = now_s() - t0;
    free(data);
    p2p_host_close(e.h);
    p2p_ctx_free(e.ctx);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    uv_loop_close(&e.loop);
    return e.status == CM_OK ? (double)n * 8 / dt / 1e6 : -1;
}

static pid_t fork_in(int host, void (*fn)(int, const char *), int arg, const char *s)
{
    pid_t p = fork();
    if (p == 0) {
        if (ct_net_enter(&g_net, host))
            _exit(2);
        fn(arg, s);
        _exit(0);
    }
    return p;
}

static void relay_fn(int a, const char *s)
{
    (void)a, (void)s;
    relay_main();
}

static void receiver_fn(int wfd, const char *relay_ip)
{
    receiver_main(wfd, relay_ip);
}

/* The sender runs in its namespace too; it writes its two rates to wfd. */
static int g_adv_port;
static void sender_fn(int wfd, const char *relay_ip)
{
    char relayed[64], direct[64];
    snprintf(relayed, sizeof relayed, "%s:%d", relay_ip, g_adv_port);
    snprintf(direct, sizeof direct, "%s:%d", relay_ip, RELAY_PORT);
    double r[2];
    r[1] = send_stream(direct, g_r.key.pub); /* the reference first: the link as it is */
    r[0] = send_stream(relayed, g_x.key.pub);
    if (write(wfd, r, sizeof r) != (ssize_t)sizeof r)
        _exit(2);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        return 0;
    if (rc || p2p_tk_init(&g_tk, "bench-relay") || p2p_tk_peer_new(&g_tk, "relay", "1", 3600, &g_r) ||
        p2p_tk_peer_new(&g_tk, "natted", "2", 3600, &g_x) || p2p_tk_peer_new(&g_tk, "sender", "3", 3600, &g_d)) {
        fprintf(stderr, "bench_relay: set-up failed\n");
        ct_net_destroy(&g_net);
        return 1;
    }
    int relay = ct_net_public(&g_net, "relay"), sender = ct_net_public(&g_net, "sender");
    int cone = ct_net_router(&g_net, 0);
    int nat = cone >= 0 ? ct_net_private(&g_net, "natted", cone) : -1;
    if (relay < 0 || sender < 0 || nat < 0) {
        ct_net_destroy(&g_net);
        return 1;
    }
    static const double CAPS[] = {50, 200};
    int fails = 0;
    printf("relayed throughput: %d MiB streams, 256 KiB chunks, 8 in flight, relay host capped (tc tbf)\n",
           STREAM_MB);
    for (size_t k = 0; k < sizeof CAPS / sizeof CAPS[0]; k++) {
        if (ct_net_cap(&g_net, relay, CAPS[k])) {
            fails++;
            break;
        }
        int pfd[2];
        if (pipe(pfd)) {
            fails++;
            break;
        }
        pid_t pr = fork_in(relay, relay_fn, 0, NULL);
        usleep(300000);
        pid_t px = fork_in(nat, receiver_fn, pfd[1], g_net.h[relay].ip);
        uint16_t port = 0;
        if (read(pfd[0], &port, sizeof port) != (ssize_t)sizeof port) {
            fprintf(stderr, "bench_relay: the receiver did not get a relay port\n");
            fails++;
        } else {
            g_adv_port = port;
            pid_t ps = fork_in(sender, sender_fn, pfd[1], g_net.h[relay].ip);
            double r[2] = {-1, -1};
            if (read(pfd[0], r, sizeof r) != (ssize_t)sizeof r || r[0] <= 0 || r[1] <= 0) {
                fprintf(stderr, "bench_relay: a stream failed\n");
                fails++;
            } else {
                printf("cap %4.0f Mbit/s: relayed %7.1f Mbit/s, direct to the relay host %7.1f Mbit/s; "
                       "relayed / cap %.2f (goal >= 0.8), relayed / direct %.2f\n",
                       CAPS[k], r[0], r[1], r[0] / CAPS[k], r[0] / r[1]);
            }
            ct_wait(ps, 30);
        }
        kill(px, SIGKILL);
        kill(pr, SIGKILL);
        ct_wait(px, 10);
        ct_wait(pr, 10);
        close(pfd[0]);
        close(pfd[1]);
    }
    ct_net_destroy(&g_net);
    p2p_tk_peer_cleanup(&g_r);
    p2p_tk_peer_cleanup(&g_x);
    p2p_tk_peer_cleanup(&g_d);
    p2p_tk_cleanup(&g_tk);
    return fails ? 1 : 0;
}
