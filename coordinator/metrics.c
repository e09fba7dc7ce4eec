/* Prometheus metrics for the coordinator (see metrics.h). */
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "coordinator/server.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 408: the client was too slow; 499 (nginx's "client closed request"): it
 * left before the answer. Both are the client's doing, not the server's. */
static const int STATUSES[] = {200, 201, 204, 400, 401, 403, 404, 405, 408, 409,
                               413, 415, 422, 429, 499, 500, 503};
#define NSTATUS (sizeof STATUSES / sizeof STATUSES[0] + 1) /* last: other */
static const double BUCKETS[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define NBUCKET (sizeof BUCKETS / sizeof BUCKETS[0])

struct route_stats {
    atomic_ulong by_status[NSTATUS];
    atomic_ulong buckets[NBUCKET]; /* non-cumulative; summed when rendering */
    atomic_ulong count;
    _Atomic double sum;
};

struct coord_metrics {
    size_t nroutes;
    struct route_stats *r; /* nroutes + 1 */
    atomic_ulong events[COORD_EV__COUNT];
};

static const char *EVENT_NAMES[COORD_EV__COUNT] = {
    "crowdtrain_logins_total{result=\"ok\"}", "crowdtrain_logins_total{result=\"failed\"}",
    "crowdtrain_logins_total{result=\"throttled\"}", "crowdtrain_passes_issued_total",
    "crowdtrain_passes_revoked_total",
    "crowdtrain_reports_total{result=\"recorded\"}", "crowdtrain_reports_total{result=\"duplicate\"}",
    "crowdtrain_reports_total{result=\"conflict\"}", "crowdtrain_reports_total{result=\"rejected\"}",
    "crowdtrain_report_exclusions_total",
    "crowdtrain_connections_closed_total{reason=\"header_timeout\"}",
    "crowdtrain_connections_closed_total{reason=\"idle_timeout\"}",
    "crowdtrain_connections_closed_total{reason=\"evicted\"}",
};

int coord_metrics_new(size_t nroutes, struct coord_metrics **out)
{
    struct coord_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return CM_ENOMEM;
    m->r = calloc(nroutes + 1, sizeof *m->r);
    if (!m->r) {
        free(m);
        return CM_ENOMEM;
    }
    m->nroutes = nroutes;
    *out = m;
    return CM_OK;
}

void coord_metrics_free(struct coord_metrics *m)
{
    if (!m)
        return;
    free(m->r);
    free(m);
}

void coord_metrics_observe(struct coord_metrics *m, size_t route, int status, double seconds)
{
    if (route > m->nroutes)
        route = m->nroutes;
    struct route_stats *s = &m->r[route];
    size_t i = 0;
    while (i < NSTATUS - 1 && STATUSES[i] != status)
        i++;
    atomic_fetch_add(&s->by_status[i], 1);
    size_t b = 0;
    while (b < NBUCKET && seconds > BUCKETS[b])
        b++;
    if (b < NBUCKET)
        atomic_fetch_add(&s->buckets[b], 1);
    atomic_fetch_add(&s->count, 1);
    double old = atomic_load(&s->sum);
    while (!atomic_compare_exchange_weak(&s->sum, &old, old + seconds))
        ;
}

void coord_metrics_event(struct coord_metrics *m, enum coord_event ev)
{
    atomic_fetch_add(&m->events[ev], 1);
}

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

int coord_metrics_render(struct coord_server *srv, char **out, size_t *len)
{
    struct coord_metrics *m = srv->metrics;
    struct sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.p)
        return CM_ENOMEM;
    sb_printf(&b, "# HELP crowdtrain_http_requests_total HTTP requests by route and status.\n"
                  "# TYPE crowdtrain_http_requests_total counter\n");
    for (size_t r = 0; r <= m->nroutes; r++) {
        const char *meth = r < m->nroutes ? srv->routes[r].method : "";
        const char *pat = r < m->nroutes ? srv->routes[r].pattern : "unmatched";
        for (size_t i = 0; i < NSTATUS; i++) {
            unsigned long v = atomic_load(&m->r[r].by_status[i]);
            if (!v)
                continue;
            if (i < NSTATUS - 1)
                sb_printf(&b, "crowdtrain_http_requests_total{method=\"%s\",route=\"%s\",status=\"%d\"} %lu\n",
                          meth, pat, STATUSES[i], v);
            else
                sb_printf(&b, "crowdtrain_http_requests_total{method=\"%s\",route=\"%s\",status=\"other\"} %lu\n",
                          meth, pat, v);
        }
    }
    sb_printf(&b, "# HELP crowdtrain_http_request_duration_seconds Time from first byte of the request to the response being sent.\n"
                  "# TYPE crowdtrain_http_request_duration_seconds histogram\n");
    for (size_t r = 0; r <= m->nroutes; r++) {
        unsigned long count = atomic_load(&m->r[r].count);
        if (!count)
            continue;
        const char *meth = r < m->nroutes ? srv->routes[r].method : "";
        const char *pat = r < m->nroutes ? srv->routes[r].pattern : "unmatched";
        unsigned long cum = 0;
        for (size_t i = 0; i < NBUCKET; i++) {
            cum += atomic_load(&m->r[r].buckets[i]);
            sb_printf(&b, "crowdtrain_http_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"%g\"} %lu\n",
                      meth, pat, BUCKETS[i], cum);
        }
        sb_printf(&b, "crowdtrain_http_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"+Inf\"} %lu\n",
                  meth, pat, count);
        sb_printf(&b, "crowdtrain_http_request_duration_seconds_sum{method=\"%s\",route=\"%s\"} %.6f\n",
                  meth, pat, atomic_load(&m->r[r].sum));
        sb_printf(&b, "crowdtrain_http_request_duration_seconds_count{method=\"%s\",route=\"%s\"} %lu\n",
                  meth, pat, count);
    }
    int size = 0, in_use = 0;
    uint64_t waits = 0, timeouts = 0;
    coord_db_pool_stats(srv->db, &size, &in_use, &waits, &timeouts);
    sb_printf(&b,
              "# HELP crowdtrain_db_pool_connections Database connections in the pool.\n"
              "# TYPE crowdtrain_db_pool_connections gauge\n"
              "crowdtrain_db_pool_connections %d\n"
              "# HELP crowdtrain_db_pool_in_use Database connections borrowed by requests now.\n"
              "# TYPE crowdtrain_db_pool_in_use gauge\n"
              "crowdtrain_db_pool_in_use %d\n"
              "# HELP crowdtrain_db_pool_waits_total Requests that had to wait for a connection.\n"
              "# TYPE crowdtrain_db_pool_waits_total counter\n"
              "crowdtrain_db_pool_waits_total %llu\n"
              "# HELP crowdtrain_db_pool_timeouts_total Requests that gave up waiting for a connection.\n"
              "# TYPE crowdtrain_db_pool_timeouts_total counter\n"
              "crowdtrain_db_pool_timeouts_total %llu\n"
              "# HELP crowdtrain_http_inflight Requests being processed now.\n"
              "# TYPE crowdtrain_http_inflight gauge\n"
              "crowdtrain_http_inflight %d\n",
              size, in_use, (unsigned long long)waits, (unsigned long long)timeouts,
              atomic_load(&srv->inflight));
    sb_printf(&b, "# TYPE crowdtrain_logins_total counter\n");
    for (int e = 0; e < COORD_EV__COUNT; e++) {
        if (e == COORD_EV_PASS_ISSUED)
            sb_printf(&b, "# TYPE crowdtrain_passes_issued_total counter\n");
        if (e == COORD_EV_PASS_REVOKED)
            sb_printf(&b, "# TYPE crowdtrain_passes_revoked_total counter\n");
        if (e == COORD_EV_REPORT_RECORDED)
            sb_printf(&b, "# HELP crowdtrain_reports_total Contribution reports by outcome.\n"
                          "# TYPE crowdtrain_reports_total counter\n");
        if (e == COORD_EV_REPORT_EXCLUSION)
            sb_printf(&b, "# HELP crowdtrain_report_exclusions_total Group members reported as excluded for bad data.\n"
                          "# TYPE crowdtrain_report_exclusions_total counter\n");
        if (e == COORD_EV_CONN_HEADER_TIMEOUT)
            sb_printf(&b, "# HELP crowdtrain_connections_closed_total Connections the server closed: no request "
                          "headers in time, idle past the keep-alive limit, or evicted near the connection cap.\n"
                          "# TYPE crowdtrain_connections_closed_total counter\n");
        sb_printf(&b, "%s %lu\n", EVENT_NAMES[e], atomic_load(&m->events[e]));
    }
    if (b.oom) {
        free(b.p);
        return CM_ENOMEM;
    }
    *out = b.p;
    *len = b.len;
    return CM_OK;
}
