/* Contribution-report throughput (issue 6): N simulated agents (default
 * 1,000) in groups of G, each reporting every step to one coordinator on
 * loopback over HTTPS, each with its own keep-alive TLS connection (as the
 * agent's reporter keeps one). Started by tests/bench/bench_reports.sh,
 * which brings up PostgreSQL (default durability: fsync and
 * synchronous_commit on) and the coordinator.
 *
 * Setup (libcurl): a volunteer, a run, N passes through the API. All reports
 * are generated and signed before timing (signing is the agents' cost).
 * The timed phases use a lean epoll + OpenSSL client (below), because the
 * client shares the two cores with the coordinator and PostgreSQL. Then:
 *  1. warm-up: every agent connects (TLS handshake, staggered at 250/s) and
 *     reports once;
 *  2. open loop at RATE reports/s for SECONDS: agent a reports step s at
 *     t0 + s * N / RATE + a / RATE; latency counts from that scheduled time,
 *     so a server that falls behind shows it (no coordinated omission);
 *  3. closed loop: every agent sends its next report as soon as the last is
 *     answered, for SECONDS/2: the most the coordinator sustains.
 * Per phase: 201s per second (open loop: over the sending window, which a
 * server that falls behind stretches; closed loop: over the phase), latency
 * percentiles,
 * timeouts, errors, other statuses, new connections, and the CPU per created
 * report of the coordinator, PostgreSQL (postmaster and backends) and this
 * client, with what other processes used meanwhile (the machine is shared).
 * Then it checks the database: every 201 stored once, verified == claimed
 * (honest groups), and the on-disk size per million reports; and prints the
 * goals (>= 5,000 reports/s sustained, p99 < 100 ms) next to the figures.
 *
 *   bench_reports URL CA DB_URL ORG_PASSWORD [agents] [group] [rate] [seconds]
 *   env BENCH_REPORTS_COORD_PID, BENCH_REPORTS_PG_PID: for the CPU figures */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "agent/peer/report.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_passreq.h"

static const char *g_url, *g_ca;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

struct buf {
    char *p;
    size_t len;
};

static size_t on_data(void *d, size_t sz, size_t n, void *ud)
{
    struct buf *b = ud;
    size_t k = sz * n;
    char *q = realloc(b->p, b->len + k + 1);
    if (!q)
        return 0;
    memcpy(q + b->len, d, k);
    b->p = q;
    b->len += k;
    b->p[b->len] = '\0';
    return k;
}

/* Blocking request for setup; returns status, *out the parsed answer. */
static long api(const char *method, const char *path, const char *bearer, const char *body,
                json_t **out)
{
    CURL *h = curl_easy_init();
    struct buf b = {0};
    char url[512], auth[256];
    snprintf(url, sizeof url, "%s%s", g_url, path);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    if (bearer) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
        hl = curl_slist_append(hl, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CAINFO, g_ca);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    if (body)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (out)
        *out = b.p ? json_loads(b.p, 0, NULL) : NULL;
    free(b.p);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return status;
}

static char *login(const char *user, const char *pw)
{
    char body[256];
    json_t *j = NULL;
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"password\":\"%s\"}", user, pw);
    long st = api("POST", "/api/v1/session", NULL, body, &j);
    if (st != 200 && st != 201) {
        fprintf(stderr, "bench_reports: login %s: HTTP %ld\n", user, st);
        json_decref(j);
        return NULL;
    }
    char *t = strdup(json_string_value(json_object_get(j, "token")));
    json_decref(j);
    return t;
}

/* One simulated agent: its key and pass, and its own keep-alive TLS
 * connection (agent/peer/report.c keeps one too). */
struct agent {
    struct cm_ed25519 key;
    char *token;
    int fd;       /* -1: not connected */
    SSL *ssl;
    int handshaking;
    int events;   /* the epoll interest registered */
    int busy;     /* a request is in flight */
    int next;     /* index of its next report */
    double due, sent; /* scheduled and actual send time of the one in flight */
    char *out;    /* the request being written */
    size_t out_len, out_off, out_cap;
    char in[8192]; /* the answer being read */
    size_t in_len;
};

static int g_n, g_group, g_steps;
static char **g_body; /* [agent * steps + step] */
static double *g_lat;
static size_t g_nlat, g_cap_lat;
static int g_coord_pid, g_pg_pid; /* for CPU accounting; 0 when unknown */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void lat_add(double s)
{
    if (g_nlat == g_cap_lat) {
        g_cap_lat = g_cap_lat ? g_cap_lat * 2 : 65536;
        g_lat = realloc(g_lat, g_cap_lat * sizeof *g_lat);
    }
    g_lat[g_nlat++] = s;
}

/* --- CPU accounting (Linux /proc): seconds of CPU used so far ------------- */

static double clk_tck(void)
{
    static double t;
    if (!t)
        t = (double)sysconf(_SC_CLK_TCK);
    return t;
}

/* utime + stime (+ cutime + cstime: children already reaped) of one process. */
static double proc_cpu(int pid, int with_children, int *ppid)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    const char *p = strrchr(line, ')'); /* the command name may hold spaces */
    if (!p)
        return 0;
    /* fields after the name: state ppid ... utime(14) stime(15) cutime(16) cstime(17) */
    char st;
    int pp;
    unsigned long long ut, stime;
    long long cut, cst;
    if (sscanf(p + 2, "%c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &st, &pp, &ut,
               &stime, &cut, &cst) != 6)
        return 0;
    if (ppid)
        *ppid = pp;
    double t = (double)(ut + stime);
    if (with_children)
        t += (double)(cut + cst);
    return t / clk_tck();
}

/* PostgreSQL: the postmaster with its reaped children, plus its live ones. */
static double pg_cpu(void)
{
    if (!g_pg_pid)
        return 0;
    double t = proc_cpu(g_pg_pid, 1, NULL);
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name), pp = 0;
        if (pid <= 0 || pid == g_pg_pid)
            continue;
        double c = proc_cpu(pid, 0, &pp);
        if (pp == g_pg_pid)
            t += c;
    }
    if (d)
        closedir(d);
    return t;
}

static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Busy CPU seconds of the whole machine (all processes, ours and others'). */
static double machine_cpu(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (!f)
        return 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 4)
        return 0;
    /* user nice system idle iowait irq softirq steal: busy = all but idle and iowait */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / clk_tck();
}

struct cpu_mark {
    double coord, pg, self, machine;
};

static void cpu_mark(struct cpu_mark *m)
{
    m->coord = g_coord_pid ? proc_cpu(g_coord_pid, 0, NULL) : 0;
    m->pg = pg_cpu();
    m->self = self_cpu();
    m->machine = machine_cpu();
}

/* --- phases ----------------------------------------------------------------- */

struct phase_result {
    long answered, created, timeouts, errors, other_status;
    long new_connections;
    double seconds;   /* from the first scheduled send to the last answer */
    double last_send; /* seconds after the start */
    double rate;      /* 201s per second: see phase() */
    double p50, p99, max;
    struct cpu_mark cpu; /* CPU seconds used during the phase */
};

/* --- a lean HTTPS/1.1 client ------------------------------------------------
 * The agents' side of the load, as cheap as it can be while still doing
 * what an agent does: TLS with the server's certificate verified, one
 * keep-alive connection per agent, a real HTTP/1.1 request, the status and
 * the whole answer read. libcurl's multi interface cost ~70-200 us of CPU
 * per request here, on the same two cores as the coordinator and
 * PostgreSQL; this costs a fraction of that. Setup calls still use libcurl. */

static SSL_CTX *g_tls;
static int g_ep = -1;
static struct sockaddr_in g_addr;
static char g_host[64], g_path[128];
static struct phase_result *g_res; /* the phase being run */
static double g_last_send;
static double g_rate;              /* its rate (0: closed loop) */

static int client_init(const char *url)
{
    int port = 0;
    if (sscanf(url, "https://%63[^:/]:%d", g_host, &port) != 2 || port <= 0 || port > 65535)
        return -1;
    memset(&g_addr, 0, sizeof g_addr);
    g_addr.sin_family = AF_INET;
    g_addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, g_host, &g_addr.sin_addr) != 1)
        return -1;
    snprintf(g_path, sizeof g_path, "/api/v1/runs/bench/reports");
    g_tls = SSL_CTX_new(TLS_client_method());
    if (!g_tls || SSL_CTX_load_verify_locations(g_tls, g_ca, NULL) != 1)
        return -1;
    SSL_CTX_set_verify(g_tls, SSL_VERIFY_PEER, NULL);
    g_ep = epoll_create1(EPOLL_CLOEXEC);
    return g_ep < 0 ? -1 : 0;
}

static void interest(struct agent *a, int ev)
{
    if (a->events == ev)
        return;
    struct epoll_event e = {.events = (uint32_t)ev, .data.ptr = a};
    epoll_ctl(g_ep, EPOLL_CTL_MOD, a->fd, &e);
    a->events = ev;
}

static void conn_close(struct agent *a)
{
    if (a->ssl)
        SSL_free(a->ssl);
    if (a->fd >= 0)
        close(a->fd);
    a->ssl = NULL;
    a->fd = -1;
    a->handshaking = 0;
    a->in_len = 0;
}

static int conn_open(struct agent *a)
{
    a->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (a->fd < 0)
        return -1;
    int one = 1;
    setsockopt(a->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(a->fd, (struct sockaddr *)&g_addr, sizeof g_addr) != 0 && errno != EINPROGRESS) {
        conn_close(a);
        return -1;
    }
    a->ssl = SSL_new(g_tls);
    if (!a->ssl || SSL_set_fd(a->ssl, a->fd) != 1 ||
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(a->ssl), g_host) != 1) {
        conn_close(a);
        return -1;
    }
    SSL_set_connect_state(a->ssl);
    a->handshaking = 1;
    a->events = EPOLLIN | EPOLLOUT;
    struct epoll_event e = {.events = (uint32_t)a->events, .data.ptr = a};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, a->fd, &e);
    g_res->new_connections++;
    return 0;
}

/* The request in flight ended: status (0 when it failed: why in kind). */
enum { END_OK, END_TIMEOUT, END_ERROR };
static void finish(struct agent *a, int status, int kind, const char *why)
{
    struct phase_result *res = g_res;
    if (kind == END_TIMEOUT) {
        res->timeouts++;
    } else if (kind == END_ERROR) {
        if (res->errors++ < 3)
            fprintf(stderr, "bench_reports: %s\n", why);
    } else if (status == 201) {
        res->created++;
    } else if (res->other_status++ < 3) {
        fprintf(stderr, "bench_reports: HTTP %d %.*s\n", status, (int)a->in_len, a->in);
    }
    a->busy = 0;
    a->out_len = a->out_off = 0;
    a->in_len = 0;
    lat_add(now_s() - (g_rate > 0 ? a->due : a->sent));
    res->answered++;
}

static void fail(struct agent *a, const char *why)
{
    conn_close(a);
    if (a->busy)
        finish(a, 0, END_ERROR, why);
}

/* The answer in a->in: 1 complete (status set), 0 not yet, -1 malformed. */
static int parse_answer(struct agent *a, int *status)
{
    a->in[a->in_len < sizeof a->in ? a->in_len : sizeof a->in - 1] = '\0';
    char *end = strstr(a->in, "\r\n\r\n");
    if (!end)
        return a->in_len >= sizeof a->in - 1 ? -1 : 0;
    if (strncmp(a->in, "HTTP/1.1 ", 9) != 0)
        return -1;
    *status = atoi(a->in + 9);
    size_t cl = 0;
    for (char *h = strstr(a->in, "\r\n"); h && h < end; h = strstr(h + 2, "\r\n"))
        if (!strncasecmp(h + 2, "Content-Length:", 15))
            cl = strtoul(h + 17, NULL, 10);
    size_t need = (size_t)(end + 4 - a->in) + cl;
    if (need >= sizeof a->in)
        return -1;
    if (a->in_len < need)
        return 0;
    return a->in_len == need ? 1 : -1; /* nothing may follow: one request at a time */
}

/* Moves the agent's connection on: handshake, write, read. */
static void drive(struct agent *a)
{
    if (a->fd < 0)
        return;
    if (a->handshaking) {
        int r = SSL_do_handshake(a->ssl);
        if (r != 1) {
            int e = SSL_get_error(a->ssl, r);
            if (e == SSL_ERROR_WANT_READ)
                interest(a, EPOLLIN);
            else if (e == SSL_ERROR_WANT_WRITE)
                interest(a, EPOLLIN | EPOLLOUT);
            else
                fail(a, "TLS handshake failed");
            return;
        }
        a->handshaking = 0;
    }
    if (a->out_off < a->out_len) {
        ERR_clear_error();
        int r = SSL_write(a->ssl, a->out + a->out_off, (int)(a->out_len - a->out_off));
        if (r > 0) {
            a->out_off += (size_t)r;
        } else {
            int e = SSL_get_error(a->ssl, r);
            if (e == SSL_ERROR_WANT_WRITE)
                interest(a, EPOLLIN | EPOLLOUT);
            else if (e != SSL_ERROR_WANT_READ)
                fail(a, "write failed");
            return;
        }
    }
    interest(a, EPOLLIN);
    for (;;) {
        if (a->in_len >= sizeof a->in - 1) {
            fail(a, "answer too large");
            return;
        }
        ERR_clear_error();
        int r = SSL_read(a->ssl, a->in + a->in_len, (int)(sizeof a->in - 1 - a->in_len));
        if (r <= 0) {
            int e = SSL_get_error(a->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                return;
            fail(a, "the coordinator closed the connection");
            return;
        }
        if (!a->busy) {
            fail(a, "bytes from the coordinator with no request in flight");
            return;
        }
        a->in_len += (size_t)r;
        int status = 0, p = parse_answer(a, &status);
        if (p < 0) {
            fail(a, "malformed answer");
            return;
        }
        if (p > 0) {
            finish(a, status, END_OK, NULL);
            return;
        }
    }
}

static void send_report(struct agent *a, int idx, double due)
{
    const char *body = g_body[idx];
    size_t blen = strlen(body);
    if (a->out_cap < blen + 256) {
        free(a->out);
        a->out_cap = blen + 256;
        a->out = malloc(a->out_cap);
    }
    int h = snprintf(a->out, a->out_cap,
                     "POST %s HTTP/1.1\r\nHost: %s:%u\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     g_path, g_host, (unsigned)ntohs(g_addr.sin_port), blen);
    memcpy(a->out + h, body, blen);
    a->out_len = (size_t)h + blen;
    a->out_off = 0;
    a->in_len = 0;
    a->busy = 1;
    a->due = due;
    a->sent = now_s();
    g_last_send = a->sent;
    if (a->fd < 0 && conn_open(a) != 0) {
        finish(a, 0, END_ERROR, "cannot connect");
        return;
    }
    drive(a);
}

#define REQUEST_TIMEOUT_S 30.0

/* Runs one phase. open: rate > 0 (scheduled), else closed loop. Reports
 * first_step .. first_step + steps - 1 of every agent, or until `seconds`
 * have passed (then waits for the answers in flight). */
static void phase(const char *name, struct agent *ag, int first_step, int steps, double rate,
                  double seconds, struct phase_result *res)
{
    memset(res, 0, sizeof *res);
    g_res = res;
    g_rate = rate;
    g_last_send = 0;
    g_nlat = 0;
    struct cpu_mark c0, c1;
    cpu_mark(&c0);
    double t0 = now_s() + 0.05;
    for (int a = 0; a < g_n; a++)
        ag[a].next = first_step;
    int last = first_step + steps;
    double next_sweep = t0 + 1;
    for (;;) {
        double t = now_s(), soonest = t + 0.01;
        int active = 0;
        for (int a = 0; a < g_n; a++) {
            struct agent *x = &ag[a];
            if (x->busy) {
                active = 1;
                continue;
            }
            if (x->next >= last || t - t0 > seconds)
                continue;
            active = 1;
            double due = rate > 0 ? t0 + (double)(x->next - first_step) * g_n / rate + a / rate : t;
            if (due <= t) {
                send_report(x, a * g_steps + x->next, due);
                x->next++;
            } else if (due < soonest) {
                soonest = due;
            }
        }
        if (!active)
            break;
        if (t >= next_sweep) { /* every wait has a deadline */
            next_sweep = t + 1;
            for (int a = 0; a < g_n; a++)
                if (ag[a].busy && t - ag[a].sent > REQUEST_TIMEOUT_S) {
                    conn_close(&ag[a]);
                    finish(&ag[a], 0, END_TIMEOUT, NULL);
                }
        }
        struct epoll_event ev[256];
        /* Rounded up: a send up to 1 ms late (counted in its latency) rather
         * than a client spinning on the cores the server needs. */
        double wait = soonest - now_s();
        int n = epoll_wait(g_ep, ev, 256, wait > 0 ? (int)ceil(wait * 1e3) : 0);
        for (int i = 0; i < n; i++)
            drive(ev[i].data.ptr);
    }
    res->seconds = now_s() - t0;
    cpu_mark(&c1);
    res->cpu.coord = c1.coord - c0.coord;
    res->cpu.pg = c1.pg - c0.pg;
    res->cpu.self = c1.self - c0.self;
    res->cpu.machine = c1.machine - c0.machine;
    /* Open loop: over the sending window, from the first scheduled send to
     * the last actual one (+ one interval). An agent sends its next report
     * only once the last is answered, so a server that falls behind delays
     * the sends and stretches the window; one that keeps up gets exactly
     * the offered rate (dividing by the time to the last answer would count
     * the last report's latency as lost throughput). Closed loop: over the
     * whole phase. */
    res->last_send = g_last_send - t0;
    if (rate > 0 && res->last_send > 0)
        res->rate = (double)res->created / (res->last_send + 1.0 / rate);
    else
        res->rate = (double)res->created / res->seconds;
    qsort(g_lat, g_nlat, sizeof *g_lat, cmp_d);
    if (g_nlat) {
        res->p50 = g_lat[g_nlat / 2];
        res->p99 = g_lat[(size_t)((double)g_nlat * 0.99)];
        res->max = g_lat[g_nlat - 1];
    }
    printf("%-26s %7ld created, sent over %5.1f s = %6.0f/s  p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms  "
           "timeouts %ld, errors %ld, other status %ld, new connections %ld\n",
           name, res->created, rate > 0 ? res->last_send + 1.0 / rate : res->seconds, res->rate,
           res->p50 * 1e3, res->p99 * 1e3,
           res->max * 1e3, res->timeouts, res->errors, res->other_status, res->new_connections);
    if (res->created) {
        double k = 1e6 / (double)res->created;
        double others = res->cpu.machine - res->cpu.coord - res->cpu.pg - res->cpu.self;
        printf("%-26s CPU per created report: coordinator %.0f us, PostgreSQL %.0f us, "
               "client %.0f us; machine busy %.2f of %ld cores (others %.2f)\n",
               "", res->cpu.coord * k, res->cpu.pg * k, res->cpu.self * k,
               res->cpu.machine / res->seconds, sysconf(_SC_NPROCESSORS_ONLN),
               (others > 0 ? others : 0) / res->seconds);
    }
    fflush(stdout);
}

static long pq_long(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    long v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) ? atol(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_reports URL CA DB_URL ORG_PASSWORD [agents] [group] [rate] "
                        "[seconds]\n");
        return 2;
    }
    g_url = argv[1];
    g_ca = argv[2];
    const char *db = argv[3], *orgpw = argv[4];
    g_n = argc > 5 ? atoi(argv[5]) : 1000;
    g_group = argc > 6 ? atoi(argv[6]) : 8;
    double rate = argc > 7 ? atof(argv[7]) : 5000;
    double secs = argc > 8 ? atof(argv[8]) : 10;
    if (g_n < 2 || g_group < 2 || g_group > 64 || rate <= 0 || secs <= 0)
        return 2;
    const char *e;
    if ((e = getenv("BENCH_REPORTS_COORD_PID")))
        g_coord_pid = atoi(e);
    if ((e = getenv("BENCH_REPORTS_PG_PID")))
        g_pg_pid = atoi(e);
    int open_steps = (int)ceil(rate * secs / g_n);
    g_steps = 1 + open_steps + (int)ceil(rate * secs / g_n) + 2; /* warm-up, open, closed */
    curl_global_init(CURL_GLOBAL_DEFAULT);

    char *org = login("org", orgpw);
    if (!org) {
        fprintf(stderr, "bench_reports: cannot log in as org\n");
        return 1;
    }
    api("POST", "/api/v1/users", org,
        "{\"username\":\"vol\",\"role\":\"volunteer\",\"password\":\"bench-volunteer-pw\"}", NULL);
    api("POST", "/api/v1/runs", org,
        "{\"name\":\"bench\",\"target_batch_size\":4096,\"config\":{\"steps\":100000}}", NULL);
    api("PUT", "/api/v1/runs/bench/allowlist/vol", org, NULL, NULL);
    char *vol = login("vol", "bench-volunteer-pw");
    struct agent *ag = calloc((size_t)g_n, sizeof *ag);
    g_body = calloc((size_t)g_n * (size_t)g_steps, sizeof *g_body);
    if (!vol || !ag || !g_body)
        return 1;
    double ts = now_s();
    for (int a = 0; a < g_n; a++) {
        json_t *j = NULL;
        struct cm_passreq pr;
        cm_ed25519_generate(&ag[a].key);
        json_t *pj = cm_passreq_sign(&ag[a].key, "bench", "vol", (int64_t)time(NULL), &pr) == CM_OK
                         ? cm_passreq_to_json(&pr)
                         : NULL;
        char *body = pj ? json_dumps(pj, JSON_COMPACT) : NULL;
        json_decref(pj);
        long st = body ? api("POST", "/api/v1/runs/bench/passes", vol, body, &j) : 0;
        free(body);
        if (st != 201) {
            fprintf(stderr, "bench_reports: pass %d refused\n", a);
            return 1;
        }
        ag[a].token = strdup(json_string_value(json_object_get(j, "access_token")));
        json_decref(j);
    }
    printf("setup: %d passes in %.1f s\n", g_n, now_s() - ts);
    /* Honest groups of g_group consecutive agents; every member reports all of them. */
    ts = now_s();
    size_t bytes = 0;
    for (int s = 0; s < g_steps; s++) {
        for (int a = 0; a < g_n; a++) {
            int g0 = a / g_group * g_group, gn = g0 + g_group > g_n ? g_n - g0 : g_group;
            struct peer_report r;
            memset(&r, 0, sizeof r);
            r.step = s;
            snprintf(r.group, sizeof r.group, "g%d", g0 / g_group);
            char rid[64];
            snprintf(rid, sizeof rid, "%d/%d", s, g0);
            cm_sha256(rid, strlen(rid), r.round_id);
            r.samples = 32 + (a % 5) * 8;
            r.compute_s = r.samples / 200.0;
            r.loss = 2.5 * exp(-s / 50.0) + 0.01 * (a % 7);
            r.sps = 200;
            r.round_ms = 180 + a % 40;
            r.parts = gn;
            r.parts_averaged = gn;
            r.n_members = (size_t)gn;
            for (int k = 0; k < gn; k++) {
                memcpy(r.members[k].pub, ag[g0 + k].key.pub, 32);
                r.members[k].samples = 32 + ((g0 + k) % 5) * 8;
            }
            char payload[PEER_REPORT_PAYLOAD_MAX + 1];
            size_t len = 0;
            if (peer_report_encode(&r, "bench", ag[a].key.pub, 1763800000 + s, payload,
                                   sizeof payload, &len) != CM_OK ||
                peer_report_sign(&ag[a].key, ag[a].token, payload, len,
                                 &g_body[(size_t)a * g_steps + s]) != CM_OK)
                return 1;
            bytes += strlen(g_body[(size_t)a * g_steps + s]);
        }
    }
    printf("setup: %d reports signed in %.1f s (mean body %zu bytes, groups of %d)\n",
           g_n * g_steps, now_s() - ts, bytes / ((size_t)g_n * g_steps), g_group);

    for (int a = 0; a < g_n; a++)
        ag[a].fd = -1;
    if (client_init(g_url) != 0) {
        fprintf(stderr, "bench_reports: cannot set up the client for %s\n", g_url);
        return 1;
    }
    printf("%d agents (one keep-alive TLS connection each), groups of %d, %ld cores; "
           "PostgreSQL fsync on, synchronous_commit on\n",
           g_n, g_group, sysconf(_SC_NPROCESSORS_ONLN));
    struct phase_result warm, open, closed;
    /* Staggered: each agent's TLS handshake, not a storm of them. */
    phase("warm-up (connect, 1 each)", ag, 0, 1, 250, 60, &warm);
    char name[64];
    snprintf(name, sizeof name, "open loop at %.0f/s", rate);
    phase(name, ag, 1, open_steps, rate, secs + 5, &open);
    phase("closed loop (max)", ag, 1 + open_steps, g_steps - 1 - open_steps, 0, secs / 2, &closed);

    for (int a = 0; a < g_n; a++) {
        conn_close(&ag[a]);
        free(ag[a].out);
    }
    SSL_CTX_free(g_tls);
    close(g_ep);

    PGconn *pg = PQconnectdb(db);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "bench_reports: %s", PQerrorMessage(pg));
        return 1;
    }
    long n = pq_long(pg, "SELECT count(*) FROM contrib_reports");
    long dup = pq_long(pg, "SELECT count(*) - count(DISTINCT (run_id, step, peer_public_key)) "
                           "FROM contrib_reports");
    /* Steps every agent reported (the closed loop stops mid-step). */
    char q[256];
    snprintf(q, sizeof q,
             "SELECT count(*) FROM contrib_claims WHERE verified_samples <> claimed_samples AND "
             "step IN (SELECT step FROM contrib_reports GROUP BY step HAVING count(*) = %d)", g_n);
    long unverified = pq_long(pg, q);
    long size = pq_long(pg, "SELECT pg_total_relation_size('contrib_reports') + "
                            "pg_total_relation_size('contrib_seen') + "
                            "pg_total_relation_size('contrib_exclusions') + "
                            "pg_total_relation_size('contrib_conflicts')");
    double t1 = now_s();
    long tot = pq_long(pg, "SELECT count(*) FROM contrib_user_totals WHERE run = 'bench'");
    double q_ms = (now_s() - t1) * 1e3;
    PQfinish(pg);
    printf("stored %ld reports, %ld duplicates, %ld of complete steps not fully verified (all groups honest)\n", n,
           dup, unverified);
    printf("database size: %.1f MB for %ld reports = %.2f GB per million reports "
           "(contrib_* tables with indexes and TOAST)\n",
           (double)size / 1e6, n, n > 0 ? (double)size / (double)n * 1e6 / 1e9 : 0);
    printf("auditor totals over %ld reports: %.0f ms (%ld user rows)\n", n, q_ms, tot);
    long sent = warm.answered + open.answered + closed.answered;
    long created = warm.created + open.created + closed.created;
    printf("answers: %ld of %ld reports stored, %ld created\n", n, sent, created);
    /* The open loop's rate cannot exceed what it offers: keeping up with an
       offer of 5,000/s measures 4,999.x/s (the window ends one interval
       after the last send). Met: within 0.1 % of 5,000/s. */
    int goal_rate = open.rate >= 5000 * 0.999, goal_p99 = open.p99 < 0.100;
    printf("GOAL sustained >= 5000 reports/s (open loop at %.0f/s): %.0f reports/s = %.2fx  %s\n",
           rate, open.rate, open.rate / 5000, goal_rate ? "met" : "NOT MET");
    printf("GOAL p99 < 100 ms (open loop): %.1f ms = %.2fx  %s\n", open.p99 * 1e3,
           open.p99 * 1e3 / 100, goal_p99 ? "met" : "NOT MET");
    double per = (open.cpu.coord + open.cpu.pg + open.cpu.self) / (open.created ? open.created : 1);
    if (per > 0)
        printf("capacity if the machine were ours: %ld cores / %.0f us per report (coordinator + "
               "PostgreSQL + client, open loop) = %.0f reports/s\n",
               sysconf(_SC_NPROCESSORS_ONLN), per * 1e6,
               (double)sysconf(_SC_NPROCESSORS_ONLN) / per);
    printf("closed loop (1,000 in flight): %.0f reports/s, p99 %.1f ms\n", closed.rate,
           closed.p99 * 1e3);
    /* Correctness: every answered 201 is stored once; nothing failed. */
    int ok = dup == 0 && unverified == 0 && n == created && open.timeouts + open.errors == 0 &&
             open.other_status + closed.other_status + warm.other_status == 0 &&
             closed.timeouts + closed.errors + warm.timeouts + warm.errors == 0;
    if (!ok)
        printf("bench_reports: FAILED a correctness check (see above)\n");
    return ok ? 0 : 1;
}
