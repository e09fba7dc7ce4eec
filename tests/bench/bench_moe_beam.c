/* Beam search benchmark (`make bench`): the Learning@home measurement of
 * seed 002_2b00836ea4b30f79.txt, section 4.1: "latency of beam search
 * (batch size 64) ... top-4 experts took 317 +- 58 ms for 100 nodes,
 * 528 +- 127 ms for 1,000 nodes and 764 +- 106 ms for 10,000 DHT nodes",
 * over cloud regions with 92.49 ms average round trips.
 *
 * Here: an in-process swarm of N DHT nodes on loopback (real sockets, real
 * signed protocol, one libuv loop, common/dht) with 46 ms of emulated
 * one-way latency on every frame (92 ms round trips). The swarm joins
 * without latency, then servers declare experts, then the latency is turned
 * on. Grid "ffn", 2 dimensions x 32 (1,024 possible uids, as in the seed's
 * two-level grids); 512 experts alive, chosen at random, 32 on each of 16
 * server nodes. Each search: batch 64, k = 4, beam width 4, gating scores
 * drawn at random, from a random node that is not a server, one search at
 * a time, cold (no prefix cache; moe_beam_search_async). Printed: p50 and
 * p99 next to the seed's figure and the ratio p50 / seed (goal <= 0.5),
 * rounds and lookups per search, and whether each sample got 4 experts.
 *
 * Not emulated: TCP handshakes are free on loopback (a WAN adds a round
 * trip for each new connection); the CPU of all N nodes is this process's.
 *
 * CT_BENCH_MOE_SIZES="100 1000" overrides the sizes; CT_BENCH_MOE_SEARCHES
 * the number of searches per size (default 40); CT_BENCH_MOE_LATENCY_MS the
 * one-way latency (0: the CPU cost alone). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "moe/moe_beam.h"
#include "tests/harness/p2p_swarm.h"

#define RUN "bench"
#define DIMS 2
#define SIZE 32
#define SERVERS 16
#define PER_SERVER 32
#define BATCH 64
#define TOPK 4
#define LATENCY_MS 46

static uint32_t latency_ms = LATENCY_MS;

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct waiter {
    int done, status;
    size_t keys;
};

static void declared(void *arg, int status, size_t keys)
{
    struct waiter *w = arg;
    w->done = 1;
    w->status = status;
    w->keys = keys;
}

static void searched(void *arg, int status, struct moe_beam *b)
{
    struct waiter *w = arg;
    (void)b;
    w->done = 1;
    w->status = status;
}

struct one1 {
    int done, hops;
    size_t nrec;
};

static void one_cb(void *arg, const struct dht_result *r)
{
    struct one1 *o = arg;
    o->done = 1;
    o->hops = r->hops;
    o->nrec = r->status == CM_OK ? r->nrec : 0;
}

static float gauss(void)
{
    /* sum of uniforms: close enough to the logits of a linear gate */
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += (float)rand() / (float)RAND_MAX;
    return s - 2.0f;
}

/* What one kind of search measured. */
struct tally {
    double *lat;
    double rounds, lookups, failed;
    int full, errors;
};

/* One search from node, latency into x->lat[q]. */
static void one_search(struct p2p_swarm *s, const struct moe_grid *g, struct dht_node *node,
                       const float *sc, struct tally *x, int q)
{
    uint64_t a = uv_hrtime();
    struct moe_beam *b = NULL;
    struct waiter w = {0};
    int started = 0;
    int rc = moe_beam_new(g, sc, BATCH, TOPK, TOPK, NULL, &b);
    if (rc == CM_OK)
        rc = moe_beam_search_async(node, RUN, b, 10000, searched, &w);
    if (rc == CM_OK) {
        started = 1;
        p2p_swarm_run_until(s, &w.done, 1, 15000);
        rc = w.done ? w.status : CM_ETIMEOUT;
    }
    x->lat[q] = (double)(uv_hrtime() - a) / 1e6;
    if (rc) {
        x->errors++;
    } else {
        struct moe_beam_stats st;
        moe_beam_get_stats(b, &st);
        x->rounds += st.rounds;
        x->lookups += (double)st.lookups;
        x->failed += (double)st.failed;
        int ok = 1;
        for (size_t i = 0; i < BATCH; i++)
            ok &= moe_beam_result(b, i, NULL) == TOPK;
        x->full += ok;
    }
    if (!started || w.done) /* else still in flight: leaked, not freed under it */
        moe_beam_free(b);
}

static int bench_size(size_t n, int searches)
{
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 5000};
    uint64_t t0 = uv_hrtime();
    int rc = p2p_swarm_init(&s, n, &o);
    if (rc) {
        printf("moe beam %6zu nodes: cannot create the swarm: %s\n", n, cm_strerror(rc));
        return 1;
    }
    if ((rc = p2p_swarm_join(&s, 32))) {
        printf("moe beam %6zu nodes: join failed: %s\n", n, cm_strerror(rc));
        p2p_swarm_cleanup(&s);
        return 1;
    }
    double join_s = (double)(uv_hrtime() - t0) / 1e9;
    struct moe_grid g;
    moe_grid_init(&g, "ffn", DIMS, SIZE);
    /* 512 of the 1,024 uids, shuffled, 32 per server */
    static struct moe_uid all[SIZE * SIZE];
    for (int i = 0; i < SIZE * SIZE; i++)
        all[i] = (struct moe_uid){.n = 2, .idx = {(uint16_t)(i / SIZE), (uint16_t)(i % SIZE)}};
    for (int i = SIZE * SIZE - 1; i > 0; i--) {
        int j = rand() % (i + 1);
        struct moe_uid t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    size_t servers = n / 4 < SERVERS ? n / 4 : SERVERS;
    int64_t exp = p2p_now_ms() + 3600000;
    size_t keys = 0;
    int hops1 = 0;
    for (size_t sv = 0; sv < servers; sv++) {
        size_t node = sv * (n / servers);
        struct moe_server srv;
        snprintf(srv.addr, sizeof srv.addr, "127.0.0.1:%u", 20000 + (unsigned)sv);
        memcpy(srv.pub, s.peers[node].key.pub, 32);
        struct waiter w = {0};
        rc = moe_dht_declare_async(s.nodes[node], RUN, &g, &all[sv * PER_SERVER], PER_SERVER,
                                   &srv, exp, declared, &w);
        if (rc == CM_OK && p2p_swarm_run_until(&s, &w.done, 1, 60000))
            rc = CM_ETIMEOUT;
        if (rc == CM_OK)
            rc = w.status;
        if (rc) {
            printf("moe beam %6zu nodes: declaring failed: %s\n", n, cm_strerror(rc));
            p2p_swarm_cleanup(&s);
            return 1;
        }
        keys += w.keys;
    }
    p2p_ctx_set_latency(s.ctx, latency_ms);
    /* The floor: one plain get of one prefix key at a time. */
    double one[20];
    for (int q = 0; q < 20; q++) {
        char key[MOE_KEY_MAX];
        size_t kl;
        struct moe_uid p = {.n = 1, .idx = {(uint16_t)(rand() % SIZE)}};
        moe_key_format(RUN, &g, &p, key, sizeof key, &kl);
        struct one1 w1 = {0};
        uint64_t a = uv_hrtime();
        dht_get_async(s.nodes[(size_t)rand() % n], key, kl, one_cb, &w1);
        p2p_swarm_run_until(&s, &w1.done, 1, 15000);
        one[q] = (double)(uv_hrtime() - a) / 1e6;
        hops1 += w1.hops;
    }
    qsort(one, 20, sizeof *one, cmp_dbl);
    /* What the searches' reads give up for speed (DHT_GET_GRACE: answer
       soon after the first source instead of at the third): a grace read
       of a prefix against a full read of it, from the same node, one after
       the other; complete when both found every entry the other did (the
       entries of a prefix's servers, one record each). */
    int complete = 0;
    for (int q = 0; q < 20; q++) {
        char key[MOE_KEY_MAX];
        size_t kl;
        struct moe_uid p = {.n = 1, .idx = {(uint16_t)(rand() % SIZE)}};
        moe_key_format(RUN, &g, &p, key, sizeof key, &kl);
        struct dht_node *from = s.nodes[(size_t)rand() % n];
        struct one1 wg = {0}, wf = {0};
        dht_get_async_ex(from, key, kl, DHT_GET_GRACE, one_cb, &wg);
        p2p_swarm_run_until(&s, &wg.done, 1, 15000);
        dht_get_async(from, key, kl, one_cb, &wf);
        p2p_swarm_run_until(&s, &wf.done, 1, 15000);
        complete += wg.done && wf.done && wg.nrec == wf.nrec && wf.nrec > 0;
    }
    /* Each trial: a random trainer's first search (cold: its routing table
       as the join left it) and then its next one (new scores, the same
       prefixes: the DHT's holder hints, common/dht/dht_node.c, route it;
       the records are read again). A trainer searches every batch, so the
       second is its steady state. */
    struct tally t[2];
    memset(t, 0, sizeof t);
    for (int k = 0; k < 2; k++)
        t[k].lat = calloc((size_t)searches, sizeof *t[k].lat);
    float *sc = malloc(BATCH * DIMS * SIZE * sizeof *sc);
    for (int q = 0; q < searches; q++) {
        size_t trainer;
        do
            trainer = (size_t)rand() % n;
        while (trainer % (n / servers) == 0 && trainer / (n / servers) < servers);
        for (int k = 0; k < 2; k++) {
            for (size_t i = 0; i < BATCH * DIMS * SIZE; i++)
                sc[i] = gauss();
            one_search(&s, &g, s.nodes[trainer], sc, &t[k], q);
        }
    }
    double paper = n <= 100 ? 317 : n <= 1000 ? 528 : 764;
    int errors = 0;
    for (int k = 0; k < 2; k++) {
        struct tally *x = &t[k];
        qsort(x->lat, (size_t)searches, sizeof *x->lat, cmp_dbl);
        double p50 = x->lat[searches / 2],
               p99 = x->lat[(searches * 99) / 100 < searches ? (searches * 99) / 100 : searches - 1];
        int good = searches - x->errors;
        errors += x->errors;
        printf("moe beam %6zu nodes, %s: top-%d of batch %d, p50 %.0f ms p99 %.0f ms (seed 002 s4.1: "
               "%.0f ms; ratio p50 %.2f, p99 %.2f; goal <= 0.5) | %.2f rounds, %.1f lookups (%.1f "
               "missing) per search, %d/%d searches with %d experts for every sample, %d failed | "
               "one get alone: p50 %.0f ms, %.1f hops; grace reads as complete as full ones: %d/20 | join "
               "%.1f s, %zu servers, %zu keys declared\n",
               n, k ? "next search " : "first search", TOPK, BATCH, p50, p99, paper, p50 / paper,
               p99 / paper, good ? x->rounds / good : 0, good ? x->lookups / good : 0,
               good ? x->failed / good : 0, x->full, searches, TOPK, x->errors, one[10], hops1 / 20.0, complete,
               join_s, servers, keys);
        free(x->lat);
    }
    free(sc);
    p2p_swarm_cleanup(&s);
    return errors ? 1 : 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cm_log_set_level(CM_LOG_ERROR);
    srand(5);
    size_t fds = p2p_swarm_raise_fd_limit();
    const char *env = getenv("CT_BENCH_MOE_SIZES");
    const char *ns = getenv("CT_BENCH_MOE_SEARCHES");
    int searches = ns && atoi(ns) > 0 ? atoi(ns) : 40;
    const char *lt = getenv("CT_BENCH_MOE_LATENCY_MS");
    if (lt)
        latency_ms = (uint32_t)atoi(lt);
    printf("moe beam bench: loopback, one process, %u ms one-way latency, fd limit %zu\n",
           latency_ms, fds);
    char sizes[256];
    snprintf(sizes, sizeof sizes, "%s", env ? env : "100 1000 10000");
    int rc = 0;
    for (char *t = strtok(sizes, " ,"); t; t = strtok(NULL, " ,")) {
        size_t n = (size_t)atol(t);
        if (n < 8) {
            printf("moe beam: %zu nodes: need at least 8\n", n);
            continue;
        }
        if (n + 1024 > fds) {
            printf("moe beam %6zu nodes: skipped, needs more than the %zu file descriptors "
                   "allowed\n",
                   n, fds);
            continue;
        }
        rc |= bench_size(n, searches);
    }
    return rc;
}
