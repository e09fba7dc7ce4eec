/* Averaging bandwidth benchmark for `make bench`: N in-process peers, each
 * with its own thread, libuv loop and p2p_ctx capped to B Mbit/s up and down
 * (the caps are per ctx), run one butterfly all-reduce (common/ar/ar.h) of a
 * buffer of S bytes of fp32 gradients over loopback, with equal fractions.
 * The reference is the bandwidth bound of butterfly all-reduce (seed
 * 000_02cc6b5d62a616fc.txt, section 3.2): every peer sends and receives
 * 2 (N-1)/N of the encoded buffer, so t_min = 2 S_enc (N-1) / (N B); the
 * ratio printed is measured time / t_min (1.00 would be a perfect link).
 * Every run is checked: all peers end bit-identical and sampled elements
 * equal the exact mean within the compression's bound.
 *
 *   bench_ar                          the default table (about a minute)
 *   bench_ar N FLOATS MBPS COMP [W]   one run; COMP none|fp16|q8, W chunks in
 *                                     flight per peer (default: the engine's) */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar.h"
#include "cm_err.h"
#include "cm_log.h"
#include "tests/harness/p2p_testkit.h"

#define MAXN 16

struct bpeer {
    size_t idx;
    uv_loop_t loop;
    struct p2p_ctx *ctx;
    struct ar_engine *eng;
    struct p2p_tk_peer id;
    float *buf;
    int done, status;
    size_t n_averaged;
    double ms, ms_send, ms_reduce, ms_fetch;
    uint64_t bytes_sent, bytes_received, wire_sent, wire_received;
    pthread_t th;
};

struct bench {
    size_t n_peers, n;
    int comp;
    unsigned window;
    struct bpeer p[MAXN];
    struct ar_member mem[MAXN];
    pthread_barrier_t start, stop;
    atomic_int n_done;
    int64_t t0;
};

/* Deterministic gradient value of peer p at index i, in [-1, 1). */
static float grad(size_t p, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)p + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / 8388608.0 - 1.0);
}

static double weight_of(size_t p)
{
    return (double)(16 + 8 * p);
}

static void on_done(void *arg, const struct ar_result *r)
{
    struct bpeer *p = arg;
    p->done = 1;
    p->status = r->status;
    p->n_averaged = r->n_averaged;
    p->ms = r->ms_total;
    p->ms_send = r->ms_send;
    p->ms_reduce = r->ms_reduce;
    p->ms_fetch = r->ms_fetch;
    p->bytes_sent = r->bytes_sent;
    p->bytes_received = r->bytes_received;
}

static void keepalive(uv_timer_t *t)
{
    (void)t;
}

static void *peer_main(void *arg)
{
    struct bpeer *p = arg;
    struct bench *b = (struct bench *)((char *)(p - p->idx) - offsetof(struct bench, p));
    uv_timer_t ka;
    uv_timer_init(&p->loop, &ka);
    uv_timer_start(&ka, keepalive, 10, 10);
    struct ar_round_config c = {
        .step = 1, .group_id = (const uint8_t *)"bench", .group_id_len = 5, .members = b->mem,
        .n_members = b->n_peers, .my_index = p->idx, .buf = p->buf, .n = b->n,
        .weight = weight_of(p->idx), .comp = b->comp, .deadline_ms = 600000, .stall_ms = 20000,
        .linger_ms = 60000, .window = b->window, .done = on_done, .arg = p};
    pthread_barrier_wait(&b->start);
    int rc = ar_round_start(p->eng, &c, NULL);
    if (rc) {
        fprintf(stderr, "peer %zu: start: %s\n", p->idx, cm_strerror(rc));
        p->done = 1;
        p->status = rc;
    }
    int counted = 0;
    /* Keep serving until every peer has its result: an aggregator's part
     * is fetched by the others after its own round is done. */
    while (atomic_load(&b->n_done) < (int)b->n_peers) {
        uv_run(&p->loop, UV_RUN_ONCE);
        if (p->done && !counted) {
            counted = 1;
            atomic_fetch_add(&b->n_done, 1);
        }
    }
    pthread_barrier_wait(&b->stop);
    struct p2p_stats st;
    p2p_ctx_stats(p->ctx, &st);
    p->wire_sent = st.bytes_sent;
    p->wire_received = st.bytes_received;
    ar_engine_free(p->eng);
    p->eng = NULL;
    uv_timer_stop(&ka);
    uv_close((uv_handle_t *)&ka, NULL);
    p2p_ctx_free(p->ctx);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    uv_loop_close(&p->loop);
    return NULL;
}

static const char *comp_name(int c)
{
    return c == AR_COMP_FP16 ? "fp16" : c == AR_COMP_Q8 ? "q8" : "none";
}

static unsigned g_window; /* 0: the engine's default */
static int g_verbose;     /* single runs print per-peer phase times */

/* Returns 0 when the run was correct. */
static int run(size_t n_peers, size_t n, double mbps, int comp)
{
    static struct bench b;
    memset(&b, 0, sizeof b);
    b.n_peers = n_peers;
    b.n = n;
    b.comp = comp;
    b.window = g_window;
    struct p2p_tk tk;
    if (p2p_tk_init(&tk, "bench")) {
        fprintf(stderr, "cannot make a coordinator key\n");
        return 1;
    }
    for (size_t i = 0; i < n_peers; i++) {
        struct bpeer *p = &b.p[i];
        p->idx = i;
        char user[16], pid[16], a[64];
        snprintf(user, sizeof user, "peer%zu", i);
        snprintf(pid, sizeof pid, "%zu", i + 1);
        uv_loop_init(&p->loop);
        struct p2p_ctx_config cc = {.loop = &p->loop, .max_upload_mbps = mbps,
                                    .max_download_mbps = mbps, .auth = p2p_tk_auth_config(&tk)};
        int rc = p2p_tk_peer_new(&tk, user, pid, 3600, &p->id);
        if (!rc)
            rc = p2p_ctx_new(&cc, &p->ctx);
        struct ar_engine_config ec = {.ctx = p->ctx, .key = &p->id.key, .token = p->id.token,
                                      .listen_ip = "127.0.0.1"};
        if (!rc)
            rc = ar_engine_new(&ec, &p->eng);
        p->buf = malloc(n * sizeof(float));
        if (rc || !p->buf) {
            fprintf(stderr, "peer %zu: setup failed: %s\n", i, cm_strerror(rc ? rc : CM_ENOMEM));
            return 1;
        }
        for (size_t j = 0; j < n; j++)
            p->buf[j] = grad(i, j);
        memcpy(b.mem[i].pub, p->id.key.pub, 32);
        b.mem[i].fraction = 1;
        b.mem[i].sends = 1;
        snprintf(a, sizeof a, "127.0.0.1:%u", ar_engine_port(p->eng));
        p2p_addr_parse(a, &b.mem[i].addr);
    }
    pthread_barrier_init(&b.start, NULL, (unsigned)n_peers);
    pthread_barrier_init(&b.stop, NULL, (unsigned)n_peers);
    for (size_t i = 0; i < n_peers; i++)
        pthread_create(&b.p[i].th, NULL, peer_main, &b.p[i]);
    for (size_t i = 0; i < n_peers; i++)
        pthread_join(b.p[i].th, NULL);
    pthread_barrier_destroy(&b.start);
    pthread_barrier_destroy(&b.stop);

    /* Correctness: every peer averaged every part, bit-identical buffers,
     * sampled elements within the compression's bound of the exact mean. */
    int bad = 0;
    double tmax = 0, W = 0, worst = 0;
    for (size_t i = 0; i < n_peers; i++) {
        W += weight_of(i);
        if (b.p[i].status || b.p[i].n_averaged != n_peers) {
            fprintf(stderr, "peer %zu: status %s, %zu/%zu parts averaged\n", i,
                    cm_strerror(b.p[i].status), b.p[i].n_averaged, n_peers);
            bad = 1;
        }
        tmax = fmax(tmax, b.p[i].ms);
        if (i && memcmp(b.p[i].buf, b.p[0].buf, n * sizeof(float))) {
            fprintf(stderr, "peer %zu: result differs from peer 0\n", i);
            bad = 1;
        }
    }
    double tol = comp == AR_COMP_NONE ? 1e-6 : comp == AR_COMP_FP16 ? 2e-3 : 2.0 / 127;
    for (size_t s = 0; s < 10000; s++) {
        size_t j = (size_t)((double)s / 10000 * (double)n);
        double want = 0;
        for (size_t i = 0; i < n_peers; i++)
            want += weight_of(i) * grad(i, j);
        want /= W;
        double err = fabs(b.p[0].buf[j] - want);
        worst = fmax(worst, err);
        if (err > tol) {
            fprintf(stderr, "element %zu: %.7g, exact mean %.7g\n", j, b.p[0].buf[j], want);
            bad = 1;
            break;
        }
    }
    double bytes = (double)n * (comp == AR_COMP_NONE ? 4 : comp == AR_COMP_FP16 ? 2 : 1 + 4.0 / AR_Q8_BLOCK);
    double tmin = 2 * bytes * (double)(n_peers - 1) / ((double)n_peers * mbps * 1e6 / 8) * 1000;
    printf("ar N=%zu %5.1f MB fp32 at %.0f Mbit/s, %-4s: all-reduce %7.0f ms, bandwidth bound "
           "%7.0f ms, ratio %.2f  (max |err| %.2g)%s\n",
           n_peers, (double)n * 4 / 1e6, mbps, comp_name(comp), tmax, tmin, tmax / tmin, worst,
           bad ? "  WRONG" : "");
    for (size_t i = 0; g_verbose && i < n_peers; i++)
        printf("  peer %zu: sent %.0f ms, own part reduced %.0f ms, fetched %.0f ms, done %.0f ms; "
               "bodies %.1f MB out %.1f MB in, wire %.1f MB out %.1f MB in\n",
               i, b.p[i].ms_send, b.p[i].ms_reduce, b.p[i].ms_fetch, b.p[i].ms,
               (double)b.p[i].bytes_sent / 1e6, (double)b.p[i].bytes_received / 1e6,
               (double)b.p[i].wire_sent / 1e6, (double)b.p[i].wire_received / 1e6);
    fflush(stdout);
    for (size_t i = 0; i < n_peers; i++) {
        p2p_tk_peer_cleanup(&b.p[i].id);
        free(b.p[i].buf);
    }
    p2p_tk_cleanup(&tk);
    return bad;
}

static int parse_comp(const char *s)
{
    return !strcmp(s, "fp16") ? AR_COMP_FP16 : !strcmp(s, "q8") ? AR_COMP_Q8
                                             : !strcmp(s, "none") ? AR_COMP_NONE : -1;
}

int main(int argc, char **argv)
{
    cm_log_set_level(CM_LOG_WARN);
    if (argc == 6)
        g_window = (unsigned)strtoul(argv[--argc], NULL, 10);
    if (argc == 5) {
        size_t np = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10);
        double mbps = atof(argv[3]);
        int comp = parse_comp(argv[4]);
        if (np < 2 || np > MAXN || n == 0 || !(mbps > 0) || comp < 0) {
            fprintf(stderr, "usage: bench_ar [N FLOATS MBPS none|fp16|q8 [WINDOW]]\n");
            return 2;
        }
        g_verbose = 1;
        return run(np, n, mbps, comp);
    }
    if (argc != 1) {
        fprintf(stderr, "usage: bench_ar [N FLOATS MBPS none|fp16|q8 [WINDOW]]\n");
        return 2;
    }
    /* 25 M floats (100 MB) at 100 Mbit/s, as in the issue, for 4 peers;
     * 12.5 M floats for 8 peers, so the table stays near a minute. */
    int bad = 0;
    bad |= run(4, 25000000, 100, AR_COMP_NONE);
    bad |= run(4, 25000000, 100, AR_COMP_FP16);
    bad |= run(4, 25000000, 100, AR_COMP_Q8);
    bad |= run(8, 12500000, 100, AR_COMP_NONE);
    bad |= run(8, 12500000, 100, AR_COMP_Q8);
    return bad;
}
