/* The coordinator's own health in Prometheus text format (GET /metrics):
 * requests by route and status, a request-latency histogram per route, and
 * database-pool use. Counters are lock-free atomics updated on every
 * request completion. */
#ifndef COORD_METRICS_H
#define COORD_METRICS_H

#include <stddef.h>

struct coord_server;
struct coord_metrics;

int coord_metrics_new(size_t nroutes, struct coord_metrics **out);
void coord_metrics_free(struct coord_metrics *m);
/* route == nroutes means "no route matched". */
void coord_metrics_observe(struct coord_metrics *m, size_t route, int status, double seconds);
/* Counts named events (login throttled, passes issued...). */
enum coord_event {
    COORD_EV_LOGIN_OK,
    COORD_EV_LOGIN_FAILED,
    COORD_EV_LOGIN_THROTTLED,
    COORD_EV_PASS_ISSUED,
    COORD_EV_PASS_REVOKED,
    COORD_EV_REPORT_RECORDED, /* contribution reports (api_contrib.c) */
    COORD_EV_REPORT_DUPLICATE,
    COORD_EV_REPORT_CONFLICT,
    COORD_EV_REPORT_REJECTED,
    COORD_EV_REPORT_EXCLUSION, /* members excluded for bad data, as reported */
    COORD_EV_CONN_HEADER_TIMEOUT, /* connections closed by the guard (http_guard.h) */
    COORD_EV_CONN_IDLE_TIMEOUT,
    COORD_EV_CONN_EVICTED,
    COORD_EV__COUNT
};
void coord_metrics_event(struct coord_metrics *m, enum coord_event ev);
/* Renders the text exposition; *out is heap memory the caller frees. */
int coord_metrics_render(struct coord_server *srv, char **out, size_t *len);

#endif
