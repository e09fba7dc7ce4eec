/* Connection limits for the coordinator's HTTPS server, enforced beside
 * libmicrohttpd: a deadline for a new connection's TLS handshake and first
 * request headers, a deadline for the next request on an idle keep-alive
 * connection, and eviction of connections that have not (yet) shown a valid
 * session when the server nears its connection cap, so that a flood of idle
 * or slow connections leaves room for the volunteers already working
 * (docs/architecture.md, "Threat model").
 *
 * libmicrohttpd's own timeout is an inactivity timeout: a client sending
 * one header byte every few seconds resets it for ever. The guard keeps the
 * absolute deadlines: a reaper thread shuts down (shutdown(2), never close)
 * the sockets that missed theirs, and libmicrohttpd, seeing the end of the
 * stream, closes them as usual. The guard never sees libmicrohttpd's types:
 * http.c calls the hooks below from its callbacks. */
#ifndef COORD_HTTP_GUARD_H
#define COORD_HTTP_GUARD_H

#include <stddef.h>

struct coord_metrics;
struct coord_guard;
struct coord_guard_conn; /* one per open connection; the socket context */

struct coord_guard_limits {
    double header_timeout_s; /* accept -> first request's headers, TLS handshake included */
    double idle_timeout_s;   /* end of a request -> the next request's headers */
    long max_connections;    /* the server's cap; eviction starts at 3/4 of it */
};

int coord_guard_new(const struct coord_guard_limits *lim, struct coord_metrics *metrics,
                    struct coord_guard **out);
/* Stops the reaper; call after the HTTP daemon has stopped (all connections closed). */
void coord_guard_free(struct coord_guard *g);

/* A connection was accepted (fd: its socket). Returns the context to keep
 * with it, NULL when out of memory (the connection then has no deadline). */
struct coord_guard_conn *coord_guard_opened(struct coord_guard *g, int fd);
/* The connection is being closed; its socket is still open. */
void coord_guard_closed(struct coord_guard *g, struct coord_guard_conn *c);
/* A request's headers are complete: no deadline until it ends. Returns 1 when
 * the request's URL held an escaped control character (see mark_bad_url). */
int coord_guard_headers_done(struct coord_guard *g, struct coord_guard_conn *c);
/* The request ended; authenticated: it carried a valid session, which keeps
 * the connection out of eviction for as long as it stays open. */
void coord_guard_request_done(struct coord_guard *g, struct coord_guard_conn *c, int authenticated);
/* The URL decoder met %00-%1F or %7F in the request being read. */
void coord_guard_mark_bad_url(struct coord_guard_conn *c);

/* Percent-decodes `s` in place like libmicrohttpd does ('+' is left as is).
 * Returns the decoded length; *control is set when a decoded byte is a
 * control character (< 0x20 or 0x7F). Pure; exposed for tests. */
size_t coord_url_unescape(char *s, int *control);

#endif
