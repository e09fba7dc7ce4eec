/* All-reduce benchmark against PyTorch's gloo for `make bench` (issue 5, the
 * DeDLOC benchmark of seed 000_02cc6b5d62a616fc.txt, section 4.1: ResNet-50's
 * 25.6 M parameters averaged among volunteers).
 *
 * N local agents, each a separate process with its own libuv loop, p2p ctx
 * and averaging engine (common/ar/ar.h), listening on 127.0.0.1, run the
 * butterfly all-reduce of 25.6 M fp32 values with equal fractions; the same
 * run starts tests/bench/bench_allreduce_gloo.py, which times
 * torch.distributed's all_reduce (backend gloo, N processes on loopback) on
 * the same data. Both report the median over a few rounds after a warm-up
 * round; a round's time is the slowest peer's (ours: from the start command
 * sent to every peer to the last peer's result; gloo: after a barrier, the
 * max over ranks).
 *
 * Then every peer's p2p ctx is capped to the same bandwidth u up and down
 * (the transport's token buckets) and the time is compared with the
 * bandwidth bound of butterfly all-reduce: each peer sends and receives
 * 2 (N-1)/N of the encoded buffer, t_min = 2 (N-1)/N * P * bytes / u.
 *
 * Every round is verified: every peer's buffer must equal the exact weighted
 * average (computed in double by the driver before the run, rounded to fp32)
 * within the encoding's tolerance, and all peers must be bit-identical (a
 * 64-bit hash of each buffer). gloo's output is checked the same way by the
 * script against the same expected values. A wrong answer fails the bench.
 *
 *   bench_allreduce_gloo                     the table (4 and 8 peers), then
 *                                            the hosts table (root)
 *   bench_allreduce_gloo --hosts             only the hosts table: 8 agents
 *                                            on 8 network namespaces capped
 *                                            at 1 Gbit/s and 100 Mbit/s (tc
 *                                            tbf), against gloo there (issue 17)
 *   bench_allreduce_gloo N FLOATS MBPS COMP [REPS]
 *                                            one configuration of ours
 *                                            (MBPS 0: uncapped), no gloo
 * Environment: BENCH_AR_NO_GLOO=1 skips gloo (the table says so);
 * BENCH_AR_HOSTS_MBPS=M runs the hosts table at that one cap;
 * BENCH_AR_VERBOSE=1 prints each peer's phase times of every round;
 * BENCH_AR_PACE=F: the hosts table's paced runs at F x the cap (default
 * 0.92, as `join --pace 0.92`; 0 skips them);
 * BENCH_AR_WINDOW=W sets the chunks in flight per link (default AR_DEFAULT_WINDOW, 2);
 * BENCH_PYTHON names the interpreter that has torch (default /usr/bin/python3,
 * Debian's python3-torch). */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ar/ar.h"
#include "cm_err.h"
#include "cm_log.h"
#include "tests/harness/ct_harness.h"
#include "tests/harness/ct_net.h"
#include "tests/harness/p2p_testkit.h"

#define MAXN 16
#define GLOO_SCRIPT "tests/bench/bench_allreduce_gloo.py"
#define PYTHON_DEFAULT "/usr/bin/python3"

/* ---- data, identical in bench_allreduce_gloo.py ------------------------- */

/* Gradient of peer p at index i, in [-1, 1): a splitmix-style hash. */
static float grad(size_t p, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)p + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / 8388608.0 - 1.0);
}

/* Sample count of peer p: unequal, so the weighting is checked too. */
static double weight_of(size_t p)
{
    return (double)(16 + 8 * p);
}

static double tol_of(int comp)
{
    /* fp32: the average of values in [-1, 1) is exact in double and rounded
     * once to fp32 (<= 2^-24) by us, gloo sums in fp32 (n roundings); fp16:
     * twice the binary16 bound (sender's encoding and the returned average). */
    return comp == AR_COMP_NONE ? 1e-6 : comp == AR_COMP_FP16 ? 2e-3 : 2.0 / 127;
}

static const char *comp_name(int c)
{
    return c == AR_COMP_FP16 ? "fp16" : c == AR_COMP_Q8 ? "q8" : "fp32";
}

static double enc_bytes(int comp)
{
    return comp == AR_COMP_NONE ? 4 : comp == AR_COMP_FP16 ? 2 : 1 + 4.0 / AR_Q8_BLOCK;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- control messages between the driver and its peers ------------------ */

enum { CMD_ROUND = 1, CMD_VERIFY, CMD_QUIT };

struct cmd {
    int op;
    int comp;
    uint64_t step;
    double mbps;
    int paced; /* mbps as `join --pace` sets it (p2p_ctx_set_pacing) */
};

struct reply {
    int status;
    size_t n_averaged;
    double ms;       /* ar_result.ms_total (peer-local) */
    double ms_send, ms_reduce, ms_fetch; /* ar_result phase times */
    double max_err;  /* CMD_VERIFY: max |buf - expected| */
    uint64_t hash;   /* CMD_VERIFY: FNV-1a of the buffer */
    uint64_t wire_sent, wire_received;
    double cpu_ms;   /* CMD_VERIFY: CPU time (user + system) of the last round */
    double sys_ms;   /* CMD_VERIFY: its system (kernel) part */
    long faults;     /* CMD_VERIFY: minor page faults during the last round */
};

struct hello {
    uint16_t port;
};

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* ---- one peer process ---------------------------------------------------- */

/* The throwaway coordinator key that minted every peer's pass; the peer
 * processes inherit it. */
static struct p2p_tk g_tk;

struct peer {
    size_t idx, n_peers, n;
    int rd, wr; /* control pipe ends */
    uv_loop_t loop;
    uv_poll_t ctl;
    struct p2p_ctx *ctx;
    struct ar_engine *eng;
    struct p2p_tk_peer *id;
    struct ar_member *mem;
    float *grad0, *buf;
    const float *expected;
    const char *ip; /* where it listens: 127.0.0.1, or its host's address */
    int quit, in_round;
    double cpu0; /* CPU ms at the start of the round */
    double sys0; /* system CPU ms at the start of the round */
    long flt0;   /* minor faults at the start of the round */
};

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static double sys_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_stime.tv_sec * 1e3 + (double)ru.ru_stime.tv_usec / 1e3;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static void on_done(void *arg, const struct ar_result *r)
{
    struct peer *p = arg;
    struct reply rep = {.status = r->status, .n_averaged = r->n_averaged, .ms = r->ms_total,
                        .ms_send = r->ms_send, .ms_reduce = r->ms_reduce,
                        .ms_fetch = r->ms_fetch};
    p->in_round = 0;
    if (write_all(p->wr, &rep, sizeof rep))
        p->quit = 1;
}

static void verify(struct peer *p, int comp, struct reply *rep)
{
    double tol = tol_of(comp), worst = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t bad = 0;
    for (size_t i = 0; i < p->n; i++) {
        double e = fabs((double)p->buf[i] - (double)p->expected[i]);
        if (!(e <= tol))
            bad++;
        if (e > worst || e != e)
            worst = e != e ? INFINITY : e;
        uint32_t u;
        memcpy(&u, &p->buf[i], 4);
        h = (h ^ u) * 0x100000001b3ull;
    }
    rep->status = bad ? CM_EINTERNAL : CM_OK;
    rep->max_err = worst;
    rep->hash = h;
    struct p2p_stats st;
    p2p_ctx_stats(p->ctx, &st);
    rep->wire_sent = st.bytes_sent;
    rep->wire_received = st.bytes_received;
}

static void on_ctl(uv_poll_t *h, int status, int events)
{
    struct peer *p = h->data;
    (void)events;
    struct cmd c;
    if (status < 0 || read_all(p->rd, &c, sizeof c) || c.op == CMD_QUIT) {
        p->quit = 1;
        return;
    }
    if (c.op == CMD_VERIFY) {
        struct reply rep = {.cpu_ms = cpu_ms() - p->cpu0, .sys_ms = sys_ms() - p->sys0,
                            .faults = minflt() - p->flt0};
        verify(p, c.comp, &rep);
        if (write_all(p->wr, &rep, sizeof rep))
            p->quit = 1;
        return;
    }
    /* CMD_ROUND: fresh gradient, the run's caps, start. */
    memcpy(p->buf, p->grad0, p->n * sizeof(float));
    if (c.paced)
        p2p_ctx_set_pacing(p->ctx, c.mbps, c.mbps);
    else
        p2p_ctx_set_rates(p->ctx, c.mbps, c.mbps);
    struct ar_round_config rc = {
        .step = c.step, .group_id = (const uint8_t *)"bench", .group_id_len = 5,
        .members = p->mem, .n_members = p->n_peers, .my_index = p->idx, .buf = p->buf,
        .n = p->n, .weight = weight_of(p->idx), .comp = c.comp, .deadline_ms = 600000,
        .stall_ms = 20000, .linger_ms = 60000, .in_place = 1, /* as the agent averages */
        .done = on_done, .arg = p};
    if (getenv("BENCH_AR_WINDOW")) /* chunks in flight per link (the engine's default: AR_DEFAULT_WINDOW) */
        rc.window = (unsigned)atoi(getenv("BENCH_AR_WINDOW"));
    p->in_round = 1;
    p->cpu0 = cpu_ms();
    p->sys0 = sys_ms();
    p->flt0 = minflt();
    int rc_ = ar_round_start(p->eng, &rc, NULL);
    if (rc_) {
        struct reply rep = {.status = rc_};
        p->in_round = 0;
        if (write_all(p->wr, &rep, sizeof rep))
            p->quit = 1;
    }
}

static void wake(uv_timer_t *t)
{
    (void)t;
}

static int peer_main(struct peer *p)
{
    uv_loop_init(&p->loop);
    struct p2p_ctx_config cc = {.loop = &p->loop, .auth = p2p_tk_auth_config(&g_tk)};
    int rc = p2p_ctx_new(&cc, &p->ctx);
    struct ar_engine_config ec = {.ctx = p->ctx, .key = &p->id->key, .token = p->id->token,
                                  .listen_ip = p->ip};
    if (!rc)
        rc = ar_engine_new(&ec, &p->eng);
    p->grad0 = malloc(p->n * sizeof(float));
    p->buf = malloc(p->n * sizeof(float));
    if (rc || !p->grad0 || !p->buf) {
        fprintf(stderr, "peer %zu: setup failed: %s\n", p->idx, cm_strerror(rc ? rc : CM_ENOMEM));
        return 1;
    }
    for (size_t i = 0; i < p->n; i++)
        p->grad0[i] = grad(p->idx, i);
    memcpy(p->buf, p->grad0, p->n * sizeof(float)); /* touch the pages before timing */
    struct hello hl = {.port = ar_engine_port(p->eng)};
    if (write_all(p->wr, &hl, sizeof hl) ||
        read_all(p->rd, p->mem, p->n_peers * sizeof *p->mem))
        return 1;
    uv_poll_init(&p->loop, &p->ctl, p->rd);
    p->ctl.data = p;
    uv_poll_start(&p->ctl, UV_READABLE, on_ctl);
    uv_timer_t t;
    uv_timer_init(&p->loop, &t);
    uv_timer_start(&t, wake, 100, 100);
    while (!p->quit)
        uv_run(&p->loop, UV_RUN_ONCE);
    uv_poll_stop(&p->ctl);
    uv_close((uv_handle_t *)&p->ctl, NULL);
    uv_timer_stop(&t);
    uv_close((uv_handle_t *)&t, NULL);
    ar_engine_free(p->eng);
    p2p_ctx_free(p->ctx);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    uv_loop_close(&p->loop);
    free(p->grad0);
    free(p->buf);
    return 0;
}

/* ---- the driver ---------------------------------------------------------- */

struct swarm {
    size_t n_peers, n;
    pid_t pid[MAXN];
    int to[MAXN], from[MAXN];
    struct ar_member mem[MAXN];
    struct p2p_tk_peer id[MAXN];
};

static void swarm_stop(struct swarm *s)
{
    struct cmd c = {.op = CMD_QUIT};
    for (size_t i = 0; i < s->n_peers; i++) {
        if (s->to[i] >= 0) {
            write_all(s->to[i], &c, sizeof c);
            close(s->to[i]);
            s->to[i] = -1;
        }
        if (s->from[i] >= 0)
            close(s->from[i]);
        s->from[i] = -1;
    }
    for (size_t i = 0; i < s->n_peers; i++) {
        if (s->pid[i] > 0)
            waitpid(s->pid[i], NULL, 0);
        s->pid[i] = 0;
        p2p_tk_peer_cleanup(&s->id[i]);
    }
}

/* The hosts mode: peer i runs on host g_host[i] of g_net (set by
 * hosts_table; g_on_hosts 0: every peer on loopback). */
static struct ct_net g_net;
static int g_host[MAXN], g_on_hosts;

static const char *peer_ip(size_t i)
{
    return g_on_hosts ? g_net.h[g_host[i]].ip : "127.0.0.1";
}

static int swarm_start(struct swarm *s, size_t n_peers, size_t n, const float *expected)
{
    memset(s, 0, sizeof *s);
    s->n_peers = n_peers;
    s->n = n;
    for (size_t i = 0; i < MAXN; i++)
        s->to[i] = s->from[i] = -1;
    for (size_t i = 0; i < n_peers; i++) {
        char user[32], pid[32];
        snprintf(user, sizeof user, "peer%zu", i);
        snprintf(pid, sizeof pid, "%zu", i + 1);
        if (p2p_tk_peer_new(&g_tk, user, pid, 3600, &s->id[i]))
            return -1;
    }
    fflush(NULL);
    for (size_t i = 0; i < n_peers; i++) {
        int down[2], up[2];
        if (pipe(down) || pipe(up))
            return -1;
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            close(down[1]);
            close(up[0]);
            for (size_t j = 0; j < i; j++) {
                close(s->to[j]);
                close(s->from[j]);
            }
            struct peer p = {.idx = i, .n_peers = n_peers, .n = n, .rd = down[0], .wr = up[1],
                             .id = &s->id[i], .mem = s->mem, .expected = expected, .ip = peer_ip(i)};
            /* on its own host (before any thread: setns moves one) */
            if (g_on_hosts && ct_net_enter(&g_net, g_host[i]) != 0)
                _exit(1);
            _exit(peer_main(&p));
        }
        close(down[0]);
        close(up[1]);
        s->pid[i] = pid;
        s->to[i] = down[1];
        s->from[i] = up[0];
    }
    for (size_t i = 0; i < n_peers; i++) {
        struct hello hl;
        if (read_all(s->from[i], &hl, sizeof hl))
            return -1;
        char a[64];
        snprintf(a, sizeof a, "%s:%u", peer_ip(i), hl.port);
        memcpy(s->mem[i].pub, s->id[i].key.pub, 32);
        s->mem[i].fraction = 1;
        s->mem[i].sends = 1;
        p2p_addr_parse(a, &s->mem[i].addr);
    }
    for (size_t i = 0; i < n_peers; i++)
        if (write_all(s->to[i], s->mem, n_peers * sizeof *s->mem))
            return -1;
    return 0;
}

static uint64_t g_step;

/* One timed round, then verification. Returns the round time in ms, or -1
 * when the round failed or its result is wrong. */
static long g_faults; /* page faults of all peers in the last round */
static double g_sys;  /* system (kernel) CPU ms of all peers in the last round */
static int g_verbose; /* single runs print each peer's phase times */

static int g_paced; /* the next rounds' caps pace (p2p_ctx_set_pacing) */
static double swarm_round(struct swarm *s, int comp, double mbps, double *max_err,
                          uint64_t *wire_out, double *cpu_out)
{
    struct cmd c = {.op = CMD_ROUND, .comp = comp, .step = ++g_step, .mbps = mbps, .paced = g_paced};
    double t0 = now_ms();
    for (size_t i = 0; i < s->n_peers; i++)
        if (write_all(s->to[i], &c, sizeof c))
            return -1;
    int bad = 0;
    for (size_t i = 0; i < s->n_peers; i++) {
        struct reply r;
        if (read_all(s->from[i], &r, sizeof r))
            return -1;
        if (g_verbose)
            printf("  peer %zu: own chunks delivered %.0f ms, own part averaged %.0f ms, "
                   "other parts fetched %.0f ms, done %.0f ms\n",
                   i, r.ms_send, r.ms_reduce, r.ms_fetch, r.ms);
        if (r.status || r.n_averaged != s->n_peers) {
            fprintf(stderr, "peer %zu: round failed: %s, %zu/%zu parts averaged\n", i,
                    cm_strerror(r.status), r.n_averaged, s->n_peers);
            bad = 1;
        }
    }
    double ms = now_ms() - t0;
    c.op = CMD_VERIFY;
    for (size_t i = 0; i < s->n_peers; i++)
        if (write_all(s->to[i], &c, sizeof c))
            return -1;
    uint64_t h0 = 0, wire = 0;
    double cpu = 0;
    *max_err = 0;
    g_faults = 0;
    g_sys = 0;
    for (size_t i = 0; i < s->n_peers; i++) {
        struct reply r;
        if (read_all(s->from[i], &r, sizeof r))
            return -1;
        if (r.status) {
            fprintf(stderr, "peer %zu: result differs from the exact average (max |err| %.3g)\n",
                    i, r.max_err);
            bad = 1;
        }
        if (i == 0)
            h0 = r.hash;
        else if (r.hash != h0) {
            fprintf(stderr, "peer %zu: result not bit-identical to peer 0's\n", i);
            bad = 1;
        }
        if (r.max_err > *max_err)
            *max_err = r.max_err;
        wire = r.wire_sent > wire ? r.wire_sent : wire;
        cpu += r.cpu_ms;
        g_faults += r.faults;
        g_sys += r.sys_ms;
    }
    if (wire_out)
        *wire_out = wire;
    if (cpu_out)
        *cpu_out = cpu;
    return bad ? -1 : ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of reps rounds after warm_up rounds; -1 on any failure. */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Median time of reps rounds after warm_up rounds (and the median CPU time
 * of all peers together in *cpu_ms, its system part in *sys_ms); -1 on any
 * failure. */
static double measure(struct swarm *s, int comp, double mbps, int warm_up, int reps,
                      double *max_err, double *cpu_ms, double *sys_ms)
{
    double t[32], c[32], y[32], err, cpu = 0;
    *max_err = 0;
    for (int i = 0; i < warm_up + reps; i++) {
        double ms = swarm_round(s, comp, mbps, &err, NULL, &cpu);
        if (ms < 0)
            return -1;
        if (err > *max_err)
            *max_err = err;
        if (i >= warm_up) {
            t[i - warm_up] = ms;
            c[i - warm_up] = cpu;
            y[i - warm_up] = g_sys;
        }
    }
    *cpu_ms = median(c, reps);
    *sys_ms = median(y, reps);
    return median(t, reps);
}

/* Expected weighted average in double, rounded to fp32, in memory the peer
 * processes inherit. */
static float *expected_new(size_t n_peers, size_t n)
{
    float *e = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (e == MAP_FAILED)
        return NULL;
    double W = 0;
    for (size_t p = 0; p < n_peers; p++)
        W += weight_of(p);
    for (size_t i = 0; i < n; i++) {
        double v = 0;
        for (size_t p = 0; p < n_peers; p++)
            v += weight_of(p) * grad(p, i);
        e[i] = (float)(v / W);
    }
    return e;
}

/* Runs the gloo script; returns its median ms or -1. It reads the expected
 * values from a file and checks every rank's output against them. */
/* The expected values into a new file at path (a mkstemp template) for
 * the gloo script; -1 with why when it cannot. */
static int write_expected(const float *expected, size_t n, char *path, char *why, size_t why_len)
{
    int fd = mkstemp(path);
    if (fd < 0 || write_all(fd, expected, n * sizeof(float))) {
        snprintf(why, why_len, "cannot write the expected values");
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        return -1;
    }
    close(fd);
    return 0;
}

static double run_gloo(size_t n_peers, size_t n, int reps, const float *expected, double *max_err,
                       double *cpu_ms, double *sys_ms, int *failed, char *why,
                       size_t why_len)
{
    *failed = 0;
    if (getenv("BENCH_AR_NO_GLOO")) {
        snprintf(why, why_len, "skipped (BENCH_AR_NO_GLOO set)");
        return -1;
    }
    const char *python = getenv("BENCH_PYTHON") ? getenv("BENCH_PYTHON") : PYTHON_DEFAULT;
    if (access(python, X_OK) || access(GLOO_SCRIPT, R_OK)) {
        snprintf(why, why_len, "skipped (%s or %s missing)", python, GLOO_SCRIPT);
        return -1;
    }
    char path[] = "/tmp/bench_allreduce_gloo_XXXXXX";
    if (write_expected(expected, n, path, why, why_len))
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%.500s %s --world %zu --floats %zu --reps %d --expected %s 2>&1",
             python, GLOO_SCRIPT, n_peers, n, reps, path);
    fflush(NULL);
    FILE *f = popen(cmd, "r");
    double ms = -1;
    char line[512];
    snprintf(why, why_len, "the gloo script printed no result");
    while (f && fgets(line, sizeof line, f)) {
        double m, e, c, y;
        if (sscanf(line, "gloo median_ms=%lf max_err=%lf cpu_ms=%lf sys_ms=%lf", &m, &e, &c,
                   &y) == 4) {
            ms = m;
            *max_err = e;
            *cpu_ms = c;
            *sys_ms = y;
        } else if (!strncmp(line, "gloo skip: ", 11)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(why, why_len, "skipped (%.150s)", line + 11);
        } else {
            fputs(line, stderr);
        }
    }
    int st = f ? pclose(f) : -1;
    unlink(path);
    if (st != 0) { /* a rank failed or gloo's result was wrong: the bench fails */
        snprintf(why, why_len, "FAILED (exit status %d, see above)", st);
        *failed = 1;
        ms = -1;
    }
    return ms;
}

/* gloo on the hosts: rank r runs alone on host g_host[r] (the script's
 * --rank mode, GLOO_SOCKET_IFNAME=eth0), rank 0's host holds the
 * rendezvous. Same result line and checks as run_gloo. */
static double run_gloo_hosts(size_t n_peers, size_t n, int reps, const float *expected, double *max_err,
                             double *cpu_ms, int *failed, char *why, size_t why_len)
{
    *failed = 0;
    const char *python = getenv("BENCH_PYTHON") ? getenv("BENCH_PYTHON") : PYTHON_DEFAULT;
    if (getenv("BENCH_AR_NO_GLOO") || access(python, X_OK) || access(GLOO_SCRIPT, R_OK)) {
        snprintf(why, why_len, "skipped (BENCH_AR_NO_GLOO, or %s or %s missing)", python, GLOO_SCRIPT);
        return -1;
    }
    char path[] = "/tmp/bench_allreduce_gloo_XXXXXX";
    if (write_expected(expected, n, path, why, why_len))
        return -1;
    setenv("GLOO_SOCKET_IFNAME", "eth0", 1);
    char world[16], floats[24], nreps[16], logs[MAXN][64], rank[MAXN][16];
    snprintf(world, sizeof world, "%zu", n_peers);
    snprintf(floats, sizeof floats, "%zu", n);
    snprintf(nreps, sizeof nreps, "%d", reps);
    pid_t pid[MAXN];
    for (size_t r = 0; r < n_peers; r++) {
        snprintf(logs[r], sizeof logs[r], "%s.rank%zu", path, r);
        snprintf(rank[r], sizeof rank[r], "%zu", r);
        const char *argv[] = {python, GLOO_SCRIPT, "--world", world, "--floats", floats, "--reps", nreps,
                              "--expected", path, "--rank", rank[r], "--master", peer_ip(0), "--port", "29517",
                              NULL};
        pid[r] = ct_net_spawn(&g_net, g_host[r], argv, logs[r]);
    }
    int st_all = 0;
    for (size_t r = 0; r < n_peers; r++)
        st_all |= pid[r] <= 0 || ct_wait(pid[r], 900) != 0;
    double ms = -1;
    snprintf(why, why_len, "the gloo script printed no result");
    for (size_t r = 0; r < n_peers; r++) {
        char *out = ct_read_file(logs[r], NULL);
        for (char *line = out; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            double m, e, c, y;
            if (sscanf(line, "gloo median_ms=%lf max_err=%lf cpu_ms=%lf sys_ms=%lf", &m, &e, &c, &y) == 4) {
                ms = m;
                *max_err = e;
                *cpu_ms = c;
            } else if (!strncmp(line, "gloo skip: ", 11)) {
                snprintf(why, why_len, "skipped (%.150s)", line + 11);
            } else if (*line && strncmp(line, "gloo rounds_ms=", 15)) {
                fprintf(stderr, "gloo rank %zu: %s\n", r, line);
            }
            line = nl ? nl + 1 : NULL;
        }
        free(out);
        unlink(logs[r]);
    }
    unlink(path);
    if (st_all) { /* a rank failed or gloo's result was wrong: the bench fails */
        snprintf(why, why_len, "FAILED (a rank exited non-zero, see above)");
        *failed = 1;
        ms = -1;
    }
    return ms;
}

/* Issue 17 (make bench (c)): 8 agents on 8 hosts of the namespace test bed
 * (tests/harness/ct_net.h), each host's link capped with tc tbf at 1 Gbit/s
 * and then 100 Mbit/s up and down, against gloo's all_reduce on the same
 * hosts and caps. Our transport signs and checks every message; gloo
 * authenticates nothing. */
static int hosts_table(size_t floats)
{
    if (geteuid() != 0) {
        printf("on hosts: skipped (needs root for network namespaces)\n");
        return 0;
    }
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP) {
        printf("on hosts: skipped (no network namespaces here)\n");
        return 0;
    }
    const size_t np = 8;
    for (size_t i = 0; rc == 0 && i < np; i++) {
        char name[16];
        snprintf(name, sizeof name, "ar%zu", i);
        g_host[i] = ct_net_public(&g_net, name);
        rc = g_host[i] < 0;
    }
    if (rc) {
        fprintf(stderr, "cannot make the test bed\n");
        ct_net_destroy(&g_net);
        return 1;
    }
    g_on_hosts = 1;
    int bad = 0;
    float *exp = expected_new(np, floats);
    printf("all-reduce of %zu fp32 values (%.1f MB) among %zu agents on %zu hosts (network namespaces, each "
           "link capped with tc tbf), against PyTorch gloo's all_reduce on the same hosts and caps\n",
           floats, (double)floats * 4 / 1e6, np, np);
    double CAPS[2] = {1000, 100};
    int ncaps = 2;
    g_verbose = getenv("BENCH_AR_VERBOSE") != NULL;
    if (getenv("BENCH_AR_HOSTS_MBPS")) { /* one cap only (investigating) */
        CAPS[0] = atof(getenv("BENCH_AR_HOSTS_MBPS"));
        ncaps = CAPS[0] > 0 ? 1 : 2;
    }
    for (int k = 0; k < ncaps && exp && !bad; k++) {
        for (size_t i = 0; i < np; i++)
            bad |= ct_net_cap(&g_net, g_host[i], CAPS[k]) != 0;
        struct swarm s;
        if (bad || swarm_start(&s, np, floats, exp)) {
            fprintf(stderr, "cannot start %zu peers on the hosts\n", np);
            bad = 1;
            break;
        }
        int reps = CAPS[k] >= 1000 ? 3 : 1;
        double err = 0, cpu = 0, sys = 0, eg = 0, cg = 0, perr = 0, pcpu = 0;
        /* then paced as `join --pace F` does: the transport's token buckets
           (short ones: p2p_ctx_set_pacing) at F x the link's rate both ways,
           so that no queue forms in the link's buffer (BENCH_AR_PACE=F,
           default 0.92; 0: not measured) */
        double pf = getenv("BENCH_AR_PACE") ? atof(getenv("BENCH_AR_PACE")) : 0.92;
        double ours = measure(&s, AR_COMP_NONE, 0, 1, reps, &err, &cpu, &sys);
        g_paced = 1;
        double paced = ours >= 0 && pf > 0 ? measure(&s, AR_COMP_NONE, pf * CAPS[k], 1, reps, &perr, &pcpu, &sys) : -2;
        g_paced = 0;
        swarm_stop(&s);
        char why[256] = "";
        int gfail = 0;
        double tg = run_gloo_hosts(np, floats, reps, exp, &eg, &cg, &gfail, why, sizeof why);
        double tmin = 2.0 * (double)(np - 1) / (double)np * (double)floats * 4 / (CAPS[k] * 1e6 / 8) * 1000;
        bad |= ours < 0 || gfail || paced == -1;
        printf("N=%zu hosts at %.0f Mbit/s  ours fp32 %6.0f ms (CPU %6.0f ms, max |err| %.2g, bound %.0f ms: %.3f)%s\n",
               np, CAPS[k], ours, cpu, err, tmin, ours / tmin, ours < 0 ? "  WRONG" : "");
        if (paced != -2)
            printf("N=%zu hosts at %.0f Mbit/s  ours fp32 paced at %.2f %6.0f ms (CPU %6.0f ms, max |err| %.2g, bound: "
                   "%.3f)%s\n", np, CAPS[k], pf, paced, pcpu, perr, paced / tmin, paced < 0 ? "  WRONG" : "");
        if (tg >= 0)
            printf("N=%zu hosts at %.0f Mbit/s  gloo fp32 %6.0f ms (CPU %6.0f ms, max |err| %.2g); ours/gloo %.2f%s%s\n",
                   np, CAPS[k], tg, cg, eg, ours / tg,
                   ours >= 0 && ours <= tg ? "  (goal: <= 1, met)" : "  (goal: <= 1)",
                   paced >= 0 ? (paced <= tg ? "; paced: met" : "; paced: not met") : "");
        if (tg >= 0 && paced >= 0)
            printf("N=%zu hosts at %.0f Mbit/s  ours paced / gloo %.2f\n", np, CAPS[k], paced / tg);
        else
            printf("N=%zu hosts at %.0f Mbit/s  gloo %s\n", np, CAPS[k], why);
        fflush(stdout);
    }
    if (exp)
        munmap(exp, floats * sizeof(float));
    g_on_hosts = 0;
    ct_net_destroy(&g_net);
    return bad;
}

static int table(size_t floats, int reps, double cap)
{
    int bad = 0;
    size_t sizes[2] = {4, 8};
    printf("all-reduce of %zu fp32 values (%.1f MB) among N local agent processes on loopback; "
           "time of a round = slowest peer, median of %d rounds after 1 warm-up; CPU = user + "
           "system time of all peers (or ranks) in that round\n",
           floats, (double)floats * 4 / 1e6, reps);
    for (size_t k = 0; k < 2; k++) {
        size_t np = sizes[k];
        float *exp = expected_new(np, floats);
        struct swarm s;
        if (!exp || swarm_start(&s, np, floats, exp)) {
            fprintf(stderr, "cannot start %zu peers\n", np);
            return 1;
        }
        double e32, e16, eg = 0, c32 = 0, c16 = 0, cg = 0, y32 = 0, y16 = 0, yg = 0;
        double t32 = measure(&s, AR_COMP_NONE, 0, 1, reps, &e32, &c32, &y32);
        double t16 = measure(&s, AR_COMP_FP16, 0, 1, reps, &e16, &c16, &y16);
        char why[256] = "";
        int gloo_failed;
        double tg =
            run_gloo(np, floats, reps, exp, &eg, &cg, &yg, &gloo_failed, why, sizeof why);
        if (t32 < 0 || t16 < 0 || gloo_failed)
            bad = 1;
        printf("N=%zu uncapped  ours fp32 %6.0f ms, CPU %6.0f ms (system %4.0f) (max |err| %.2g)%s\n",
               np, t32, c32, y32, e32, t32 < 0 ? "  WRONG" : "");
        if (tg >= 0) {
            printf("N=%zu uncapped  gloo fp32 %6.0f ms, CPU %6.0f ms (system %4.0f) (max |err| %.2g)\n",
                   np, tg, cg, yg, eg);
            printf("N=%zu uncapped  ours/gloo fp32: time %.2f, CPU %.2f%s\n", np, t32 / tg,
                   c32 / cg, t32 <= tg ? "  (goal: time <= 1, met)" : "  (goal: time <= 1)");
        } else {
            printf("N=%zu uncapped  gloo %s\n", np, why);
        }
        printf("N=%zu uncapped  ours fp16 %6.0f ms, CPU %6.0f ms (max |err| %.2g)%s", np, t16,
               c16, e16, t16 < 0 ? "  WRONG" : "");
        if (tg >= 0)
            printf(", ours fp16 / gloo fp32: time %.2f", t16 / tg);
        printf("\n");
        int comps[2] = {AR_COMP_NONE, AR_COMP_FP16};
        for (int j = 0; j < 2; j++) {
            double err, cpu = 0, sys = 0;
            double ms = measure(&s, comps[j], cap, 0, 1, &err, &cpu, &sys);
            double tmin = 2.0 * (double)(np - 1) / (double)np * (double)floats *
                          enc_bytes(comps[j]) / (cap * 1e6 / 8) * 1000;
            if (ms < 0)
                bad = 1;
            printf("N=%zu capped %.0f Mbit/s up+down, ours %s %6.0f ms, bound 2(N-1)/N*P*bytes/u "
                   "%6.0f ms, ratio %.3f%s (max |err| %.2g)\n",
                   np, cap, comp_name(comps[j]), ms, tmin, ms / tmin,
                   ms < 0              ? "  WRONG"
                   : ms / tmin <= 1.1 ? "  (goal <= 1.1, met)"
                                      : "  (goal <= 1.1)",
                   err);
        }
        fflush(stdout);
        swarm_stop(&s);
        munmap(exp, floats * sizeof(float));
    }
    return bad;
}

int main(int argc, char **argv)
{
    cm_log_set_level(CM_LOG_WARN);
    signal(SIGPIPE, SIG_IGN);
    if (p2p_tk_init(&g_tk, "bench")) {
        fprintf(stderr, "cannot make a coordinator key\n");
        return 1;
    }
    int rc;
    if (argc == 5 || argc == 6) {
        size_t np = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10);
        double mbps = atof(argv[3]);
        int comp = !strcmp(argv[4], "fp16") ? AR_COMP_FP16 : !strcmp(argv[4], "q8") ? AR_COMP_Q8
                   : !strcmp(argv[4], "fp32") || !strcmp(argv[4], "none") ? AR_COMP_NONE : -1;
        int reps = argc == 6 ? atoi(argv[5]) : 3;
        if (np < 2 || np > MAXN || n == 0 || mbps < 0 || comp < 0 || reps < 1 || reps > 30) {
            fprintf(stderr, "usage: bench_allreduce_gloo [N FLOATS MBPS fp32|fp16|q8 [REPS]]\n");
            return 2;
        }
        g_verbose = getenv("BENCH_AR_VERBOSE") != NULL;
        float *exp = expected_new(np, n);
        struct swarm s;
        if (!exp || swarm_start(&s, np, n, exp)) {
            fprintf(stderr, "cannot start %zu peers\n", np);
            return 1;
        }
        double t[32], err, cpu;
        uint64_t wire = 0;
        rc = 0;
        for (int i = 0; i < reps; i++) {
            t[i] = swarm_round(&s, comp, mbps, &err, &wire, &cpu);
            if (t[i] < 0)
                rc = 1;
            printf("N=%zu %s %s: round %d %.0f ms, CPU of all peers %.0f ms (system %.0f) = %.2f "
                   "ns per byte of the buffer, %ld page faults (max |err| %.2g)\n",
                   np, comp_name(comp), mbps > 0 ? argv[3] : "uncapped", i, t[i], cpu, g_sys,
                   cpu * 1e6 / ((double)n * 4), g_faults, err);
        }
        if (mbps > 0) {
            double tmin = 2.0 * (double)(np - 1) / (double)np * (double)n * enc_bytes(comp) /
                          (mbps * 1e6 / 8) * 1000;
            printf("bound %.0f ms, ratio of the last round %.3f\n", tmin, t[reps - 1] / tmin);
        }
        swarm_stop(&s);
        munmap(exp, n * sizeof(float));
    } else if (argc == 1) {
        rc = table(25600000, 3, 100);
        rc |= hosts_table(25600000);
    } else if (argc == 2 && !strcmp(argv[1], "--hosts")) {
        rc = hosts_table(25600000);
    } else {
        fprintf(stderr, "usage: bench_allreduce_gloo [--hosts | N FLOATS MBPS fp32|fp16|q8 [REPS]]\n");
        rc = 2;
    }
    p2p_tk_cleanup(&g_tk);
    return rc;
}
