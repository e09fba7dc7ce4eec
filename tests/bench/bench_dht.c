/* DHT benchmark (`make bench`): in-process swarms of 100, 1,000 and 10,000
 * nodes on loopback (real sockets, real signed protocol, one libuv loop),
 * and the request rate one node sustains.
 *
 * For each size: join time, lookup latency (median and p99 of gets issued
 * one at a time from random nodes), mean hops, and memory per node (RSS
 * growth over the swarm's creation and join divided by N, and the node's
 * own structures). The Learning@home paper (seed 002_2b00836ea4b30f79.txt,
 * section 4.1) reports 317 / 528 / 764 ms for 100 / 1,000 / 10,000 nodes
 * over a WAN with ~100 ms latency; the loopback figures here have no
 * network latency and are CPU bound (Ed25519 on every message), so the
 * printed ratio is ours / theirs, not a like-for-like comparison.
 *
 * Messages/s: one node in its own thread (dht_node_start) answering
 * FIND_NODE from 4 client hosts with 64 requests in flight each, compared
 * with the bound set by its signature work measured in the same run (one
 * Ed25519 verify and one sign per request).
 *
 * CT_BENCH_DHT_SIZES="100 1000" overrides the sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_msg.h"
#include "tests/harness/p2p_swarm.h"

static size_t rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (size_t)rss * 4;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct one {
    int done, ok, hops;
};

static void one_cb(void *arg, const struct dht_result *r)
{
    struct one *o = arg;
    o->done = 1;
    o->ok = r->status == CM_OK && r->nrec > 0;
    o->hops = r->hops;
}

static int bench_swarm(size_t n)
{
    size_t rss0 = rss_kb();
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 5000};
    uint64_t t0 = uv_hrtime();
    int rc = p2p_swarm_init(&s, n, &o);
    if (rc) {
        printf("dht %6zu nodes: cannot create the swarm: %s\n", n, cm_strerror(rc));
        return 1;
    }
    if ((rc = p2p_swarm_join(&s, 32))) {
        printf("dht %6zu nodes: join failed: %s\n", n, cm_strerror(rc));
        p2p_swarm_cleanup(&s);
        return 1;
    }
    double join_s = (double)(uv_hrtime() - t0) / 1e9;
    if (s.join_failures)
        printf("dht %6zu nodes: %zu joins failed the first time and were retried\n", n,
               s.join_failures);
    size_t rss1 = rss_kb();
    size_t own = 0;
    for (size_t i = 0; i < n; i++) {
        struct dht_node_stats st;
        dht_node_get_stats(s.nodes[i], &st);
        own += st.approx_bytes;
    }
    enum { KEYS = 50, GETS = 300 };
    char keys[KEYS][24];
    int64_t exp = p2p_now_ms() + 3600000;
    for (int k = 0; k < KEYS; k++) {
        struct one p = {0};
        snprintf(keys[k], sizeof keys[k], "bench-%d", k);
        dht_put_async(s.nodes[(size_t)rand() % n], keys[k], strlen(keys[k]), NULL, 0, "v", 1, exp,
                      one_cb, &p);
        while (!p.done)
            uv_run(&s.loop, UV_RUN_ONCE);
    }
    double lat[GETS];
    int found = 0, hops = 0;
    for (int g = 0; g < GETS; g++) {
        struct one r = {0};
        uint64_t a = uv_hrtime();
        dht_get_async(s.nodes[(size_t)rand() % n], keys[g % KEYS], strlen(keys[g % KEYS]), one_cb,
                      &r);
        while (!r.done)
            uv_run(&s.loop, UV_RUN_ONCE);
        lat[g] = (double)(uv_hrtime() - a) / 1e6;
        found += r.ok;
        hops += r.hops;
    }
    qsort(lat, GETS, sizeof *lat, cmp_dbl);
    double med = lat[GETS / 2], p99 = lat[GETS * 99 / 100];
    double paper = n <= 100 ? 317 : n <= 1000 ? 528 : 764;
    printf("dht %6zu nodes: join %.1f s, lookup median %.2f ms p99 %.2f ms (paper, WAN: %.0f ms; "
           "ratio %.4f), mean hops %.2f, found %d/%d, memory/node %.1f KiB RSS (%.1f KiB node "
           "structures)\n",
           n, join_s, med, p99, paper, med / paper, (double)hops / GETS, found, GETS,
           (double)(rss1 - rss0) / n, (double)own / n / 1024.0);
    p2p_swarm_cleanup(&s);
    return found == GETS ? 0 : 1;
}

struct blaster {
    struct p2p_host *h;
    struct sockaddr_storage addr;
    const uint8_t *pub;
    uint8_t *body;
    size_t blen;
    uint64_t done, fail;
    int stop;
    int inflight;
};

static void blast_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *b,
                     size_t l);

static void blast_one(struct blaster *bl)
{
    if (bl->stop)
        return;
    if (p2p_request(bl->h, (struct sockaddr *)&bl->addr, bl->pub, P2P_MSG_DHT_FIND_NODE, bl->body,
                    bl->blen, 10000, blast_cb, bl) == CM_OK)
        bl->inflight++;
}

static void blast_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *b,
                     size_t l)
{
    struct blaster *bl = arg;
    (void)from, (void)b, (void)l;
    bl->inflight--;
    if (status == CM_OK)
        bl->done++;
    else
        bl->fail++;
    blast_one(bl);
}

static int bench_rate(void)
{
    struct p2p_tk tk;
    p2p_tk_init(&tk, "rate");
    struct p2p_tk_peer srv, cl[4];
    p2p_tk_peer_new(&tk, "srv", "s", 3600, &srv);
    struct dht_config cfg = {.key = &srv.key, .token = srv.token, .listen_ip = "127.0.0.1",
                             .ctx = {.auth = p2p_tk_auth_config(&tk)}};
    struct dht_node *node;
    if (dht_node_start(&cfg, &node))
        return 1;
    /* Give the server a routing table worth answering from. */
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct p2p_ctx_config cc = {.loop = &loop, .auth = p2p_tk_auth_config(&tk)};
    struct p2p_ctx *ctx;
    p2p_ctx_new(&cc, &ctx);
    struct blaster bl[4];
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", dht_node_port(node));
    uint8_t target[32];
    cm_random_bytes(target, 32);
    for (int i = 0; i < 4; i++) {
        char u[16];
        snprintf(u, sizeof u, "c%d", i);
        p2p_tk_peer_new(&tk, u, u, 3600, &cl[i]);
        struct p2p_host_config hc = {.key = &cl[i].key, .token = cl[i].token,
                                     .listen_ip = "127.0.0.1"};
        memset(&bl[i], 0, sizeof bl[i]);
        p2p_host_new(ctx, &hc, &bl[i].h);
        p2p_addr_parse(a, &bl[i].addr);
        bl[i].pub = srv.key.pub;
        dht_msg_encode_find(target, 0, &bl[i].body, &bl[i].blen);
    }
    /* crypto bound, measured now */
    uint8_t msg[P2P_SIGNED_LEN] = {0}, sig[64];
    uint64_t c0 = uv_hrtime();
    int reps = 2000;
    for (int i = 0; i < reps; i++)
        cm_ed25519_sign(&srv.key, msg, sizeof msg, sig);
    uint64_t c1 = uv_hrtime();
    for (int i = 0; i < reps; i++)
        cm_ed25519_verify(srv.key.pub, msg, sizeof msg, sig);
    uint64_t c2 = uv_hrtime();
    double t_sign = (double)(c1 - c0) / reps / 1e9, t_verify = (double)(c2 - c1) / reps / 1e9;
    double bound = 1.0 / (t_sign + t_verify);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 64; j++)
            blast_one(&bl[i]);
    uint64_t t0 = uv_hrtime(), warm = t0 + 1000000000ull, end = warm + 4000000000ull;
    uint64_t base = 0;
    int based = 0;
    while (uv_hrtime() < end) {
        uv_run(&loop, UV_RUN_ONCE);
        if (!based && uv_hrtime() >= warm) {
            for (int i = 0; i < 4; i++)
                base += bl[i].done;
            based = 1;
        }
    }
    uint64_t total = 0, fails = 0;
    for (int i = 0; i < 4; i++) {
        total += bl[i].done;
        fails += bl[i].fail;
        bl[i].stop = 1;
    }
    double rate = (double)(total - base) / ((double)(end - warm) / 1e9);
    printf("dht one node: %.0f requests/s answered (FIND_NODE, 4 clients x 64 in flight, %llu "
           "failed); signature bound %.0f/s (sign %.1f us + verify %.1f us); ratio %.2f\n",
           rate, (unsigned long long)fails, bound, t_sign * 1e6, t_verify * 1e6, rate / bound);
    for (int i = 0; i < 4; i++)
        while (bl[i].inflight)
            uv_run(&loop, UV_RUN_ONCE);
    for (int i = 0; i < 4; i++) {
        p2p_host_close(bl[i].h);
        free(bl[i].body);
        p2p_tk_peer_cleanup(&cl[i]);
    }
    p2p_ctx_free(ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    dht_node_stop(node);
    p2p_tk_peer_cleanup(&srv);
    p2p_tk_cleanup(&tk);
    return 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cm_log_set_level(CM_LOG_ERROR);
    srand(7);
    size_t fds = p2p_swarm_raise_fd_limit();
    printf("dht bench: loopback, one process, fd limit %zu\n", fds);
    const char *env = getenv("CT_BENCH_DHT_SIZES");
    char sizes[256];
    snprintf(sizes, sizeof sizes, "%s", env ? env : "100 1000 10000");
    int rc = 0;
    for (char *t = strtok(sizes, " ,"); t; t = strtok(NULL, " ,")) {
        size_t n = (size_t)atol(t);
        if (n < 2)
            continue;
        if (n + 1024 > fds) {
            printf("dht %6zu nodes: skipped, needs more than the %zu file descriptors allowed\n", n,
                   fds);
            continue;
        }
        rc |= bench_swarm(n);
    }
    rc |= bench_rate();
    return rc;
}
