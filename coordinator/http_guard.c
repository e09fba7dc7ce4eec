/* Connection deadlines and eviction for the HTTPS server (see http_guard.h).
 *
 * Every open connection is on one list, in accept order, under one mutex.
 * The reaper wakes every REAP_MS, shuts down the sockets whose deadline has
 * passed, and, while more than 3/4 of the connection cap is open, the oldest
 * connections that are waiting for headers or idle without ever having
 * shown a session. shutdown(2) under the mutex is safe against fd reuse:
 * libmicrohttpd calls coord_guard_closed (which takes the mutex) before it
 * closes the socket. */
#include "coordinator/http_guard.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_time.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define REAP_MS 200

enum { C_HEADERS, C_REQUEST, C_IDLE };

struct coord_guard_conn {
    struct coord_guard_conn *prev, *next;
    int fd;
    int state;
    int authenticated; /* some request on it carried a valid session */
    int served;        /* some request on it was answered */
    int shut;          /* shut down by the reaper, waiting for libmicrohttpd to close it */
    int bad_url;       /* set by the URL decoder for the request being read */
    double deadline;   /* monotonic seconds; 0: none */
};

struct coord_guard {
    struct coord_guard_limits lim;
    struct coord_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct coord_guard_conn *head, *tail;
    long open;
    int stop;
    pthread_t reaper;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void shut(struct coord_guard *g, struct coord_guard_conn *c, enum coord_event ev)
{
    c->shut = 1;
    c->deadline = 0;
    if (shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
        CM_LOGD("http", "shutdown of a connection: errno %d", errno);
    coord_metrics_event(g->metrics, ev);
}

static void reap(struct coord_guard *g)
{
    double t = now_s();
    long high = g->lim.max_connections * 3 / 4;
    long target = g->lim.max_connections * 5 / 8; /* evict down to here: hysteresis */
    long live = 0, headers = 0, idle = 0, evicted = 0;
    for (struct coord_guard_conn *c = g->head; c; c = c->next) {
        if (c->shut)
            continue;
        if (c->deadline > 0 && t >= c->deadline) {
            if (c->state == C_HEADERS)
                headers++;
            else
                idle++;
            shut(g, c, c->state == C_HEADERS ? COORD_EV_CONN_HEADER_TIMEOUT
                                             : COORD_EV_CONN_IDLE_TIMEOUT);
            continue;
        }
        live++;
    }
    /* Near the cap: first the connections that never completed a request,
     * then the idle ones that never showed a session; oldest first in each,
     * so that a flood that keeps its connections open goes before a
     * newcomer that has just connected. A connection busy with a request,
     * or that has shown a valid session, is never evicted. */
    for (int pass = 0; pass < 2 && live > high; pass++)
        for (struct coord_guard_conn *c = g->head; c && live > target; c = c->next) {
            if (c->shut || c->authenticated || c->state == C_REQUEST || (pass == 0 && c->served))
                continue;
            shut(g, c, COORD_EV_CONN_EVICTED);
            live--;
            evicted++;
        }
    if (headers || evicted)
        CM_LOGI("http", "closed %ld connections that sent no request in %.0f s, %ld idle ones, "
                        "evicted %ld (open: %ld of %ld)",
                headers, g->lim.header_timeout_s, idle, evicted, live, g->lim.max_connections);
}

static void *reaper_main(void *arg)
{
    struct coord_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts = cm_time_after_ms(CLOCK_REALTIME, REAP_MS);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->stop)
            reap(g);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int coord_guard_new(const struct coord_guard_limits *lim, struct coord_metrics *metrics,
                    struct coord_guard **out)
{
    struct coord_guard *g = calloc(1, sizeof *g);
    if (!g)
        return CM_ENOMEM;
    g->lim = *lim;
    g->metrics = metrics;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->reaper, NULL, reaper_main, g) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return CM_EIO;
    }
    *out = g;
    return CM_OK;
}

void coord_guard_free(struct coord_guard *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->reaper, NULL);
    while (g->head) { /* none after the daemon stopped; be safe */
        struct coord_guard_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

struct coord_guard_conn *coord_guard_opened(struct coord_guard *g, int fd)
{
    struct coord_guard_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->state = C_HEADERS;
    c->deadline = now_s() + g->lim.header_timeout_s;
    pthread_mutex_lock(&g->mu);
    c->prev = g->tail;
    if (g->tail)
        g->tail->next = c;
    else
        g->head = c;
    g->tail = c;
    g->open++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void coord_guard_closed(struct coord_guard *g, struct coord_guard_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        g->tail = c->prev;
    g->open--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

int coord_guard_headers_done(struct coord_guard *g, struct coord_guard_conn *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&g->mu);
    c->state = C_REQUEST;
    c->deadline = 0;
    int bad = c->bad_url;
    c->bad_url = 0;
    pthread_mutex_unlock(&g->mu);
    return bad;
}

void coord_guard_request_done(struct coord_guard *g, struct coord_guard_conn *c, int authenticated)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    c->state = C_IDLE;
    c->served = 1;
    c->authenticated |= authenticated;
    if (!c->shut)
        c->deadline = now_s() + g->lim.idle_timeout_s;
    pthread_mutex_unlock(&g->mu);
}

void coord_guard_mark_bad_url(struct coord_guard_conn *c)
{
    if (c)
        c->bad_url = 1; /* only the connection's own thread reads or writes it before headers_done */
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

size_t coord_url_unescape(char *s, int *control)
{
    char *w = s;
    *control = 0;
    for (const char *r = s; *r;) {
        int hi, lo;
        unsigned char ch;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0) {
            ch = (unsigned char)(hi * 16 + lo);
            r += 3;
        } else {
            ch = (unsigned char)*r++;
        }
        if (ch < 0x20 || ch == 0x7f)
            *control = 1;
        *w++ = (char)ch;
    }
    *w = '\0';
    return (size_t)(w - s);
}
