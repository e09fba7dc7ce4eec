/* DeDLOC's averaging benchmark, Table 1 of seed 000_02cc6b5d62a616fc.txt
 * (§4.1; setups in ../shared/bench/dedloc_table1.json): the time of one
 * averaging round of a ResNet-50-sized fp32 gradient (25,557,032 floats)
 * among the setups' peers with
 *   AR   even all-reduce among the GPU peers (every one aggregates 1/n);
 *   PS   one parameter server aggregating everything: the no-GPU 2.5 Gbit/s
 *        peer in setup D, else the first of the fastest GPU peers;
 *   ours the fractions and roles of the LP (common/sched, sched_solve with
 *        every GPU peer sending, as in the seed's measurement),
 * run by our averaging engine (common/ar) over loopback. Every peer has its
 * own thread, libuv loop, p2p context and keys; its bandwidth is emulated by
 * the context's token-bucket caps (max_upload_mbps / max_download_mbps),
 * as in bench_ar.c.
 *
 * Scaling: the machine running `make bench` has 2 cores for up to 25 peers,
 * and at full scale (4.7 GB through loopback per AR round in setup C) the
 * CPU, not the caps, would set the pace. Every bandwidth and the gradient
 * are therefore divided by the same factor k (default 10, the first
 * argument): transfer times are unchanged (size / rate), so the seconds
 * printed are comparable with the seed's; the factor and the CPU use of
 * each run are printed with the figures. Latency and per-message costs do
 * not scale, so a large k favours nobody but shrinks the gradient to k
 * times fewer chunks.
 *
 * Also printed: the bandwidth-only model of each strategy (what the LP
 * optimizes; fp32, no latency) and the seed's measured seconds where its
 * table is readable. Goals (issue 7): ours no slower than the better of AR
 * and PS in every setup; at least 1.9x faster than AR in setup C.
 *
 *   bench_table1 [K [SETUPS [STRATEGIES [REPS]]]]   e.g. bench_table1 10 CD ar,ours 5
 *
 * Each round runs REPS times (default 3; once when its model time is above
 * LONG_S), the strategies interleaved in a rotating order; the best run
 * is compared (the
 * machine is shared: slower runs measure other people's load), the median
 * is printed too.
 *
 * Every round is checked: every part averaged, all senders bit-identical,
 * sampled elements equal to the exact weighted mean. Exit status 1 when a
 * round is wrong (not when a goal is missed: that is a figure). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ar/ar.h"
#include "cm_err.h"
#include "cm_log.h"
#include "sched/sched.h"
#include "tests/harness/p2p_testkit.h"

#define MAXN 32
#define MAXREP 9
#define LONG_S 20.0 /* rounds longer than this (model) run once */
#define RESNET50_PARAMS 25557032.0
#define G_MBIT (RESNET50_PARAMS * 32 / 1e6) /* fp32 gradient, Mbit */

struct setup {
    const char *name;
    int n1, bw1, n2, bw2, gpu2;
    double pub_ar, pub_ps, pub_ours; /* seconds; < 0 where the seed's table is unreadable */
};

/* ../shared/bench/dedloc_table1.json ("published_seconds"). */
static const struct setup SETUPS[] = {
    {"A", 8, 1000, 0, 0, 1, -1, 4.73, -1},
    {"B", 16, 200, 0, 0, 1, 5.3, 39.6, 5.3},
    {"C", 8, 1000, 16, 200, 1, 5.69, 14.1, 2.96},
    {"D", 16, 200, 1, 2500, 0, -1, 3.22, -1},
};

enum strat { S_AR, S_PS, S_OURS, S_N };
static const char *SNAME[S_N] = {"AR", "PS", "ours"};

struct bpeer {
    size_t idx;
    uv_loop_t loop;
    struct p2p_ctx *ctx;
    struct ar_engine *eng;
    struct p2p_tk_peer id;
    float *buf; /* NULL: sends nothing */
    double weight;
    int done, status;
    size_t n_averaged;
    int warm_done, warm_status;
    float wbuf[256 * MAXN];
    double ms, ms_send, ms_reduce, ms_fetch;
    pthread_t th;
};

struct bench {
    size_t n_peers, n;
    uint32_t chunk; /* elements per chunk (0: the engine's default) */
    struct bpeer p[MAXN];
    struct ar_member mem[MAXN];
    pthread_barrier_t start, stop;
    atomic_int n_done, n_warm;
    struct ar_member wmem[MAXN]; /* the warm-up round: everyone sends and aggregates */
};

static struct bench g_b;
static uint32_t g_chunk;
static unsigned g_window; /* CT_TABLE1_WINDOW, 0: the engine's */

static float grad(size_t p, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)p + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / 8388608.0 - 1.0);
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
}

static void keepalive(uv_timer_t *t)
{
    (void)t;
}

static void on_warm(void *arg, const struct ar_result *r)
{
    struct bpeer *p = arg;
    p->warm_done = 1;
    p->warm_status = r->status;
}

/* Runs the peer's loop until every peer's round is done: *mine is set by
 * this peer's done callback, *count counts the peers done (each peer keeps
 * serving the others' fetches until the last one is). */
static void run_until_all(struct bpeer *p, const int *mine, atomic_int *count, size_t n_peers)
{
    int counted = 0;
    while (atomic_load(count) < (int)n_peers) {
        uv_run(&p->loop, UV_RUN_ONCE);
        if (*mine && !counted) {
            counted = 1;
            atomic_fetch_add(count, 1);
        }
    }
}

/* The seed's figures are means over 100 rounds: connections stay up from
 * one round to the next (as in crowdtrain-agent join, whose engine lives
 * for the whole run). A first, tiny round among everyone opens every
 * connection the measured round uses (senders to aggregators, fetchers to
 * aggregators) and runs the session handshakes, so the measured round
 * starts as a collaboration's later rounds do. */
static int warm_up(struct bpeer *p, struct bench *b)
{
    struct ar_round_config w = {
        .step = 0, .group_id = (const uint8_t *)"table1", .group_id_len = 6, .members = b->wmem,
        .n_members = b->n_peers, .my_index = p->idx, .buf = p->wbuf, .n = 256 * b->n_peers,
        .weight = 1, .comp = AR_COMP_NONE, .deadline_ms = 120000, .stall_ms = 60000,
        .linger_ms = 120000, .done = on_warm, .arg = p};
    int rc = ar_round_start(p->eng, &w, NULL);
    if (rc) {
        atomic_fetch_add(&b->n_warm, 1); /* the others must not wait for us */
        return rc;
    }
    run_until_all(p, &p->warm_done, &b->n_warm, b->n_peers);
    return p->warm_status;
}

static void *peer_main(void *arg)
{
    struct bpeer *p = arg;
    struct bench *b = &g_b;
    uv_timer_t ka;
    uv_timer_init(&p->loop, &ka);
    uv_timer_start(&ka, keepalive, 10, 10);
    int wrc = warm_up(p, b);
    if (wrc)
        fprintf(stderr, "peer %zu: warm-up round: %s\n", p->idx, cm_strerror(wrc));
    struct ar_round_config c = {
        .step = 1, .group_id = (const uint8_t *)"table1", .group_id_len = 6, .members = b->mem,
        .n_members = b->n_peers, .my_index = p->idx, .buf = p->buf, .n = b->n,
        .weight = p->weight, .comp = AR_COMP_NONE, .chunk_elems = b->chunk, .window = g_window,
        .deadline_ms = 900000, .stall_ms = 60000, .linger_ms = 120000,
        .in_place = 1, /* as the agent averages */ .done = on_done, .arg = p};
    pthread_barrier_wait(&b->start);
    int rc = ar_round_start(p->eng, &c, NULL);
    if (rc) {
        fprintf(stderr, "peer %zu: start: %s\n", p->idx, cm_strerror(rc));
        p->done = 1;
        p->status = rc;
    }
    run_until_all(p, &p->done, &b->n_done, b->n_peers);
    pthread_barrier_wait(&b->stop);
    ar_engine_free(p->eng);
    p->eng = NULL;
    uv_timer_stop(&ka);
    uv_close((uv_handle_t *)&ka, NULL);
    p2p_ctx_free(p->ctx);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    uv_loop_close(&p->loop);
    return NULL;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One round among n_peers peers with the given caps (Mbit/s, already
 * scaled), fractions and senders. Returns seconds (max over peers), or -1
 * when the round was wrong. *cpu_frac: CPU seconds / (wall seconds x 2). */
static double run_round(size_t n_peers, size_t n, const double *mbps, const double *fraction,
                        const int *sends, double *cpu_frac)
{
    struct bench *b = &g_b;
    memset(b, 0, sizeof *b);
    b->n_peers = n_peers;
    b->n = n;
    b->chunk = g_chunk;
    struct p2p_tk tk;
    if (p2p_tk_init(&tk, "table1")) {
        fprintf(stderr, "cannot make a coordinator key\n");
        return -1;
    }
    for (size_t i = 0; i < n_peers; i++) {
        struct bpeer *p = &b->p[i];
        p->idx = i;
        char user[16], pid[16], a[64];
        snprintf(user, sizeof user, "peer%zu", i);
        snprintf(pid, sizeof pid, "%zu", i + 1);
        uv_loop_init(&p->loop);
        struct p2p_ctx_config cc = {.loop = &p->loop, .max_upload_mbps = mbps[i],
                                    .max_download_mbps = mbps[i], .auth = p2p_tk_auth_config(&tk)};
        int rc = p2p_tk_peer_new(&tk, user, pid, 3600, &p->id);
        if (!rc)
            rc = p2p_ctx_new(&cc, &p->ctx);
        struct ar_engine_config ec = {.ctx = p->ctx, .key = &p->id.key, .token = p->id.token,
                                      .listen_ip = "127.0.0.1"};
        if (!rc)
            rc = ar_engine_new(&ec, &p->eng);
        if (!rc && sends[i]) {
            p->buf = malloc(n * sizeof(float));
            if (!p->buf)
                rc = CM_ENOMEM;
            for (size_t j = 0; p->buf && j < n; j++)
                p->buf[j] = grad(i, j);
            p->weight = (double)(16 + 8 * i);
        }
        if (rc) {
            fprintf(stderr, "peer %zu: setup failed: %s\n", i, cm_strerror(rc));
            return -1;
        }
        memcpy(b->mem[i].pub, p->id.key.pub, 32);
        b->mem[i].fraction = fraction[i];
        b->mem[i].sends = sends[i];
        snprintf(a, sizeof a, "127.0.0.1:%u", ar_engine_port(p->eng));
        p2p_addr_parse(a, &b->mem[i].addr);
        b->wmem[i] = b->mem[i];
        b->wmem[i].fraction = 1;
        b->wmem[i].sends = AR_SENDS_FULL;
        for (size_t j = 0; j < 256 * n_peers; j++)
            p->wbuf[j] = grad(i, j);
    }
    size_t nparts = 0;
    for (size_t i = 0; i < n_peers; i++)
        nparts += fraction[i] > 0;
    pthread_barrier_init(&b->start, NULL, (unsigned)n_peers);
    pthread_barrier_init(&b->stop, NULL, (unsigned)n_peers);
    double c0 = cpu_s(), w0 = wall_s();
    for (size_t i = 0; i < n_peers; i++)
        pthread_create(&b->p[i].th, NULL, peer_main, &b->p[i]);
    for (size_t i = 0; i < n_peers; i++)
        pthread_join(b->p[i].th, NULL);
    double wall = wall_s() - w0;
    *cpu_frac = (cpu_s() - c0) / (wall * 2);
    pthread_barrier_destroy(&b->start);
    pthread_barrier_destroy(&b->stop);

    int bad = 0;
    double tmax = 0, W = 0;
    size_t first = n_peers;
    for (size_t i = 0; i < n_peers; i++) {
        tmax = fmax(tmax, b->p[i].ms);
        if (!sends[i])
            continue;
        W += b->p[i].weight;
        if (first == n_peers)
            first = i;
        if (b->p[i].status || b->p[i].n_averaged != nparts) {
            fprintf(stderr, "peer %zu: status %s, %zu/%zu parts averaged\n", i,
                    cm_strerror(b->p[i].status), b->p[i].n_averaged, nparts);
            bad = 1;
        } else if (memcmp(b->p[i].buf, b->p[first].buf, n * sizeof(float))) {
            fprintf(stderr, "peer %zu: result differs from peer %zu\n", i, first);
            bad = 1;
        }
    }
    if (getenv("CT_TABLE1_TIMES")) /* where each peer's round went */
        for (size_t i = 0; i < n_peers; i++)
            printf("      peer %2zu %6.0f Mbit/s %s: sent %6.0f ms, reduced %6.0f, fetched %6.0f, done %6.0f\n",
                   i, mbps[i], fraction[i] > 0 ? "agg" : "   ", b->p[i].ms_send, b->p[i].ms_reduce,
                   b->p[i].ms_fetch, b->p[i].ms);
    for (size_t s = 0; !bad && s < 5000; s++) {
        size_t j = (size_t)((double)s / 5000 * (double)n);
        double want = 0;
        for (size_t i = 0; i < n_peers; i++)
            if (sends[i])
                want += b->p[i].weight * grad(i, j);
        want /= W;
        if (fabs(b->p[first].buf[j] - want) > 1e-5) {
            fprintf(stderr, "element %zu: %.7g, exact mean %.7g\n", j, b->p[first].buf[j], want);
            bad = 1;
        }
    }
    for (size_t i = 0; i < n_peers; i++) {
        p2p_tk_peer_cleanup(&b->p[i].id);
        free(b->p[i].buf);
    }
    p2p_tk_cleanup(&tk);
    return bad ? -1 : tmax / 1000;
}

/* Bandwidth-only seconds of a plan (full scale): every sender sends part j
 * to its aggregator, every aggregator returns its part to every other
 * sender; each peer is limited by its own caps (the LP's model). */
static double model_s(size_t np, const double *mbps, const double *fraction, const int *sends)
{
    double fsum = 0, worst = 0;
    size_t nsend = 0;
    for (size_t i = 0; i < np; i++) {
        fsum += fraction[i];
        nsend += sends[i] != 0;
    }
    for (size_t i = 0; i < np; i++) {
        double f = fraction[i] / fsum;
        /* up: my gradient minus my own part, plus my part to every other sender */
        double up = (sends[i] ? 1 - f : 0) + f * (double)(nsend - (sends[i] != 0));
        double down = f * (double)(nsend - (sends[i] != 0)) + (sends[i] ? 1 - f : 0);
        worst = fmax(worst, fmax(up, down) * G_MBIT / mbps[i]);
    }
    return worst;
}

int main(int argc, char **argv)
{
    cm_log_set_level(CM_LOG_WARN);
    double k = argc > 1 ? atof(argv[1]) : 10;
    const char *which = argc > 2 ? argv[2] : "ABCD";
    const char *strats = argc > 3 ? argv[3] : "ar,ps,ours";
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    if (!(k >= 1 && k <= 1000) || reps < 1 || reps > MAXREP) {
        fprintf(stderr, "usage: bench_table1 [K [SETUPS [ar,ps,ours [REPS]]]]  (1 <= K <= 1000, "
                        "1 <= REPS <= %d)\n", MAXREP);
        return 2;
    }
    size_t n = (size_t)llround(RESNET50_PARAMS / k);
    /* Chunks scale with the gradient: the engine's 32,768-float chunks on
       a gradient k times smaller would give each part k times fewer chunks
       than at full scale, and a part's pipeline (send, sum, return chunk by
       chunk) fills and drains in whole chunks: with the 3-6 chunks per part
       left at k = 10, that alone costs AR 20-30 % (seed 000 §3.3: a reducer
       sums one chunk while downloading the next). So every size scales:
       gradient, chunk and (the engine's window being in chunks) the bytes
       in flight; the times stay those of the full-scale round.
       CT_TABLE1_CHUNK=N sets the chunk (elements, a multiple of 256; 0:
       the engine's default, unscaled). */
    const char *ce = getenv("CT_TABLE1_CHUNK");
    long chunk = ce ? atol(ce) : (long)(AR_CHUNK_DEFAULT / k) / 256 * 256;
    if (!ce && chunk < 256)
        chunk = 256;
    if (chunk < 0 || chunk % 256 || chunk > (long)AR_CHUNK_MAX) {
        fprintf(stderr, "CT_TABLE1_CHUNK: a multiple of 256 up to %u, or 0\n", AR_CHUNK_MAX);
        return 2;
    }
    g_chunk = (uint32_t)chunk;
    const char *we = getenv("CT_TABLE1_WINDOW");
    long win = we ? atol(we) : 0;
    if (win < 0 || win > 64) {
        fprintf(stderr, "CT_TABLE1_WINDOW: 0 (the engine's) to 64\n");
        return 2;
    }
    g_window = (unsigned)win;
    printf("seed 000 Table 1: one averaging round of a ResNet-50 fp32 gradient (25,557,032 "
           "floats), our engine over loopback, bandwidth caps per peer.\n"
           "Scaled by k = %g: gradient %zu floats (%.1f MB), every bandwidth / %g; seconds are "
           "unchanged by this scaling (size / rate).\n"
           "model = bandwidth-only bound of the plan (what the LP optimizes). cpu = CPU time / "
           "(wall time x 2 cores) of the run: near 1 would mean CPU-bound.\n"
           "Timings on a shared 2-core machine (other engineers' work running): noisy.\n",
           k, n, (double)n * 4 / 1e6, k);
    printf("Chunks of %u floats (%s; CT_TABLE1_CHUNK sets them).\n\n", g_chunk ? g_chunk : AR_CHUNK_DEFAULT,
           !g_chunk ? "the engine's default, unscaled" : ce ? "CT_TABLE1_CHUNK" : "the engine's 32,768 scaled by k like the gradient");
    printf("%5s %5s %-4s %8s %8s %8s %5s %7s   %s\n", "setup", "peers", "algo", "best_s",
           "median_s", "model_s", "cpu", "seed_s", "[each run, s]  plan");
    double got[4][S_N];
    int bad = 0;
    for (size_t si = 0; si < sizeof SETUPS / sizeof SETUPS[0]; si++) {
        const struct setup *st = &SETUPS[si];
        for (int s = 0; s < S_N; s++)
            got[si][s] = -1;
        if (!strchr(which, st->name[0]))
            continue;
        size_t np = (size_t)(st->n1 + st->n2);
        double mbps[MAXN], scaled[MAXN], fr[S_N][MAXN];
        int gpu[MAXN], sends[S_N][MAXN];
        struct sched_peer pp[MAXN];
        memset(pp, 0, sizeof pp);
        size_t ps = 0;
        for (size_t i = 0; i < np; i++) {
            int second = i >= (size_t)st->n1;
            mbps[i] = second ? st->bw2 : st->bw1;
            scaled[i] = mbps[i] / k;
            gpu[i] = !second || st->gpu2;
            pp[i].key[0] = (uint8_t)(i + 1);
            pp[i].samples_per_s = gpu[i] ? 1e6 : 0; /* compute never binds: averaging only */
            pp[i].up_mbps = pp[i].down_mbps = mbps[i];
            pp[i].inbound = 1;
            /* PS: the no-GPU peer where there is one, else the first of the fastest */
            if ((!gpu[i] && gpu[ps]) || (gpu[i] == gpu[ps] && mbps[i] > mbps[ps]))
                ps = i;
        }
        for (size_t i = 0; i < np; i++) {
            fr[S_AR][i] = gpu[i] ? 1 : 0;
            sends[S_AR][i] = gpu[i];
            fr[S_PS][i] = i == ps ? 1 : 0;
            sends[S_PS][i] = gpu[i];
        }
        struct sched_problem prob = {pp, np, 4096, G_MBIT, 1};
        struct sched_solution sol;
        char err[256];
        if (sched_solve(&prob, &sol, err, sizeof err) != CM_OK) {
            fprintf(stderr, "setup %s: sched_solve: %s\n", st->name, err);
            return 1;
        }
        for (size_t i = 0; i < np; i++) {
            fr[S_OURS][i] = sol.peers[i].fraction;
            sends[S_OURS][i] = sol.peers[i].compute;
        }
        sched_solution_cleanup(&sol);
        /* The round of each strategy: AR among the GPU peers only. */
        size_t m[S_N] = {0};
        double c_mbps[S_N][MAXN], c_full[S_N][MAXN], c_fr[S_N][MAXN], model[S_N];
        int c_sends[S_N][MAXN], on[S_N];
        double t[S_N][MAXREP], cpu[S_N][MAXREP];
        int nt[S_N] = {0};
        for (int s = 0; s < S_N; s++) {
            char lname[8];
            snprintf(lname, sizeof lname, "%s", SNAME[s]);
            for (char *c = lname; *c; c++)
                *c = (char)(*c | 0x20);
            on[s] = strstr(strats, lname) != NULL;
            for (size_t i = 0; i < np; i++) {
                if (s == S_AR && !gpu[i])
                    continue;
                c_mbps[s][m[s]] = scaled[i];
                c_full[s][m[s]] = mbps[i];
                c_fr[s][m[s]] = fr[s][i];
                c_sends[s][m[s]] = sends[s][i];
                m[s]++;
            }
            model[s] = model_s(m[s], c_full[s], c_fr[s], c_sends[s]);
        }
        /* Repetitions interleave the strategies, so load changes on the shared
         * machine hit all of them; rounds longer than LONG_S (model) run once. */
        for (int rep = 0; rep < reps; rep++)
            for (int k2 = 0; k2 < S_N; k2++) {
                int s = (k2 + rep) % S_N; /* rotate the order: none always follows another */
                if (!on[s] || (rep > 0 && model[s] > LONG_S))
                    continue;
                double x = run_round(m[s], n, c_mbps[s], c_fr[s], c_sends[s], &cpu[s][nt[s]]);
                if (x < 0)
                    bad = 1;
                t[s][nt[s]++] = x;
            }
        for (int s = 0; s < S_N; s++) {
            if (!on[s])
                continue;
            double sorted[MAXREP];
            memcpy(sorted, t[s], sizeof(double) * (size_t)nt[s]);
            for (int a2 = 1; a2 < nt[s]; a2++)
                for (int b2 = a2; b2 > 0 && sorted[b2] < sorted[b2 - 1]; b2--) {
                    double tmp = sorted[b2];
                    sorted[b2] = sorted[b2 - 1];
                    sorted[b2 - 1] = tmp;
                }
            double med = sorted[nt[s] / 2], best = sorted[0], cpumax = 0;
            for (int r = 0; r < nt[s]; r++)
                cpumax = fmax(cpumax, cpu[s][r]);
            got[si][s] = best;
            double pub = s == S_AR ? st->pub_ar : s == S_PS ? st->pub_ps : st->pub_ours;
            char pubs[16], plan[200] = "", runs[64] = "";
            snprintf(pubs, sizeof pubs, pub > 0 ? "%.2f" : "-", pub);
            for (int r = 0, o = 0; r < nt[s] && o < (int)sizeof runs - 8; r++)
                o += snprintf(runs + o, sizeof runs - (size_t)o, "%s%.2f", r ? " " : "", t[s][r]);
            if (s == S_OURS) {
                size_t agg = 0, o = 0;
                for (size_t i = 0; i < m[s]; i++)
                    agg += c_fr[s][i] > 0;
                o += (size_t)snprintf(plan, sizeof plan, "%zu aggregators:", agg);
                for (size_t i = 0; i < m[s] && o < sizeof plan - 16; i++)
                    if (c_fr[s][i] > 0.005)
                        o += (size_t)snprintf(plan + o, sizeof plan - o, " %.0f@%.0f%%",
                                              c_full[s][i], 100 * c_fr[s][i]);
            } else if (s == S_PS) {
                snprintf(plan, sizeof plan, "server: a %.0f Mbit/s peer%s", mbps[ps],
                         gpu[ps] ? " (also sends)" : " without GPU");
            } else {
                snprintf(plan, sizeof plan, "%zu GPU peers, 1/%zu each", m[s], m[s]);
            }
            if (s == S_OURS && on[S_AR] && m[S_OURS] == m[S_AR]) {
                int same = 1; /* the same partition as AR (fractions are normalized) */
                for (size_t i = 0; i < m[s]; i++)
                    same &= fabs(c_fr[s][i] - c_fr[s][0]) <= 1e-9 * c_fr[s][0] &&
                            c_sends[s][i] == c_sends[S_AR][i];
                if (same)
                    snprintf(plan, sizeof plan, "the same plan as AR");
            }
            printf("%5s %5zu %-4s %8.2f %8.2f %8.2f %5.2f %7s   [%s]  %s%s\n", st->name, m[s],
                   SNAME[s], best, med, model[s], cpumax, pubs, runs, plan,
                   best < 0 ? "  WRONG" : "");
        }
        fflush(stdout);
    }
    printf("\n%5s %8s %16s %10s   %s\n", "setup", "ours/AR", "ours/min(AR,PS)", "seed o/AR",
           "goal");
    for (size_t si = 0; si < sizeof SETUPS / sizeof SETUPS[0]; si++) {
        const struct setup *st = &SETUPS[si];
        double ar = got[si][S_AR], ps = got[si][S_PS], ours = got[si][S_OURS];
        if (ours <= 0 || (ar <= 0 && ps <= 0))
            continue;
        double best = ar > 0 && ps > 0 ? fmin(ar, ps) : ar > 0 ? ar : ps;
        char r_ar[16] = "-", r_seed[16] = "-", goal[112];
        if (ar > 0)
            snprintf(r_ar, sizeof r_ar, "%.2f", ours / ar);
        if (st->pub_ours > 0 && st->pub_ar > 0)
            snprintf(r_seed, sizeof r_seed, "%.2f", st->pub_ours / st->pub_ar);
        int len = snprintf(goal, sizeof goal, "no slower than the better%s: %s",
                           ar > 0 && ps > 0 ? "" : " (of those run)",
                           ours <= best * 1.05 ? "yes" : "NO");
        if (st->name[0] == 'C' && ar > 0)
            snprintf(goal + len, sizeof goal - (size_t)len, "; AR/ours = %.2f, goal 1.9: %s",
                     ar / ours, ar / ours >= 1.9 ? "yes" : "NO");
        printf("%5s %8s %16.2f %10s   %s\n", st->name, r_ar, ours / best, r_seed, goal);
    }
    printf("(best of the runs compared; \"no slower\" allows 5 %% for timing noise)\n");
    return bad;
}
