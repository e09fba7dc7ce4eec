/* libmicrohttpd glue for the coordinator (see server.h): TLS, a thread pool
 * with poll, request bodies bounded per route, bearer-session
 * authentication, dispatch by route table, JSON errors, metrics, answers
 * deferred to another thread without holding a server thread (suspend and
 * resume), and a graceful stop that lets in-flight requests finish.
 *
 * Why poll and not epoll: libmicrohttpd 0.9.75 in epoll mode keeps a TLS
 * connection that is still handshaking on its "ready" list, because GnuTLS
 * reads the socket itself and the library never learns it was drained; the
 * worker then calls gnutls_handshake in a busy loop until the client's next
 * flight arrives (measured: 160,000 calls/s, 18 ms of CPU per handshake
 * with 1,000 clients connecting). poll asks the kernel every time. With a
 * few threads and suspended connections left out of the poll set, each poll
 * covers a few hundred sockets at most. */
#include "coordinator/auth.h"
#include "coordinator/http_guard.h"
#include "coordinator/metrics.h"
#include "coordinator/server.h"
#include "coordinator/tls.h"
#include "cm_err.h"
#include "cm_log.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* A deferred answer (coord_req_defer). state goes WAITING -> DONE, or
 * WAITING -> SUSPENDED -> DONE: the connection is suspended before anyone
 * may resume it, and resumed only once it is. refs: the request's and the
 * completer's; the last one out releases ctx. */
enum { DEFER_WAITING, DEFER_SUSPENDED, DEFER_DONE };
struct coord_deferred {
    atomic_int state;
    atomic_int refs;
    struct MHD_Connection *conn;
    struct coord_server *srv;
    coord_finish_fn finish;
    void (*release)(void *ctx);
    void *ctx;
};

struct req_state {
    struct timespec start;
    size_t route; /* index, or nroutes when unmatched */
    int method_mismatch;
    char *body;
    size_t body_len, body_cap;
    int too_big;
    int status;
    const char *params[COORD_MAX_PARAMS];
    char *param_buf;
    int nparams;
    /* the request as handlers see it (streamed and deferred routes keep it
     * across calls) */
    struct coord_req req;
    struct coord_deferred *deferred; /* set by coord_req_defer */
    void *stream_ctx;
    int stream_err;
    int stream_done;
    uint64_t streamed;
    int close; /* answer with Connection: close (the request's framing is not trusted) */
};

static double elapsed_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

void coord_resp_error(struct coord_resp *resp, int status, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_decref(resp->json);
    resp->json = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg);
    resp->status = status;
}

void coord_resp_json(struct coord_resp *resp, int status, json_t *json)
{
    json_decref(resp->json);
    resp->json = json;
    resp->status = status;
}

void coord_resp_raw(struct coord_resp *resp, int status, const char *content_type, const void *data,
                    size_t len)
{
    free(resp->raw);
    resp->raw = malloc(len ? len : 1);
    if (!resp->raw) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    memcpy(resp->raw, data, len);
    resp->raw_len = len;
    resp->content_type = content_type;
    resp->status = status;
}

struct coord_db_conn *coord_req_db(struct coord_req *req, struct coord_resp *resp)
{
    if (req->db)
        return req->db;
    int rc = coord_db_acquire(req->srv->db, &req->db);
    if (rc != CM_OK) {
        req->db = NULL;
        coord_resp_error(resp, 503, "unavailable", "the database is not reachable or busy: %s",
                         cm_strerror(rc));
        snprintf(resp->retry_after, sizeof resp->retry_after, "1");
        return NULL;
    }
    return req->db;
}

const char *coord_req_query(struct coord_req *req, const char *key)
{
    return MHD_lookup_connection_value(req->conn_, MHD_GET_ARGUMENT_KIND, key);
}

const char *coord_req_header(struct coord_req *req, const char *key)
{
    return MHD_lookup_connection_value(req->conn_, MHD_HEADER_KIND, key);
}

int coord_req_check(struct coord_req *req, struct coord_resp *resp, const struct cm_json_field *f,
                    size_t n)
{
    char err[256];
    if (cm_json_check(req->json, f, n, err, sizeof err) != CM_OK) {
        coord_resp_error(resp, 400, "invalid_request", "%s", err);
        return 0;
    }
    return 1;
}

/* --- deferred answers ------------------------------------------------------ */

static void deferred_put(struct coord_deferred *d)
{
    if (atomic_fetch_sub(&d->refs, 1) == 1) {
        if (d->release)
            d->release(d->ctx);
        free(d);
    }
}

struct coord_deferred *coord_req_defer(struct coord_req *req, coord_finish_fn finish,
                                       void (*release)(void *ctx), void *ctx)
{
    if (!req->conn_ || !finish)
        return NULL;
    struct req_state *st = (struct req_state *)((char *)req - offsetof(struct req_state, req));
    if (st->deferred)
        return NULL; /* one deferral per request */
    struct coord_deferred *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    atomic_init(&d->state, DEFER_WAITING);
    atomic_init(&d->refs, 2);
    d->conn = req->conn_;
    d->srv = req->srv;
    d->finish = finish;
    d->release = release;
    d->ctx = ctx;
    st->deferred = d;
    return d;
}

void coord_deferred_done(struct coord_deferred *d)
{
    int expect = DEFER_WAITING;
    if (!atomic_compare_exchange_strong(&d->state, &expect, DEFER_DONE)) {
        /* SUSPENDED: the request side is gone from its thread; wake it.
         * The count drops only once the resume is asked for: shutdown stops
         * the daemon when it reaches 0. */
        atomic_store(&d->state, DEFER_DONE);
        MHD_resume_connection(d->conn);
        atomic_fetch_sub(&d->srv->suspended, 1);
    }
    deferred_put(d);
}

/* After a handler deferred: park the connection until coord_deferred_done.
 * 1: parked; 0: already done, answer now. */
static int deferred_park(struct coord_server *srv, struct coord_deferred *d)
{
    if (atomic_load(&d->state) == DEFER_DONE)
        return 0;
    atomic_fetch_add(&srv->suspended, 1);
    MHD_suspend_connection(d->conn);
    int expect = DEFER_WAITING;
    if (!atomic_compare_exchange_strong(&d->state, &expect, DEFER_SUSPENDED)) {
        /* Done meanwhile (the completer saw WAITING and left the waking to us). */
        MHD_resume_connection(d->conn);
        atomic_fetch_sub(&srv->suspended, 1);
    }
    return 1;
}

/* Matches `path` against "/a/{}/b"; fills params, pointing into `copy`
 * (a buffer of strlen(path) + 1 bytes that it overwrites). */
static int match(const char *pattern, const char *path, size_t plen, char *copy,
                 const char **params, int *np)
{
    memcpy(copy, path, plen + 1);
    const char *p = pattern;
    char *q = copy;
    int n = 0;
    while (*p && *q) {
        if (p[0] == '{' && p[1] == '}') {
            char *end = strchr(q, '/');
            size_t seg = end ? (size_t)(end - q) : strlen(q);
            if (seg == 0 || n >= COORD_MAX_PARAMS)
                break;
            params[n++] = q;
            q += seg;
            if (*q == '/') {
                *q = '\0';
                q++;
                if (p[2] != '/')
                    break;
                p += 3;
            } else {
                p += 2;
            }
            continue;
        }
        if (*p != *q)
            break;
        p++;
        q++;
    }
    if (*p || *q)
        return 0;
    *np = n;
    return 1;
}

static void route_request(struct coord_server *srv, const char *method, const char *url,
                          struct req_state *st)
{
    st->route = srv->nroutes;
    size_t plen = strlen(url);
    char *copy = malloc(plen + 1); /* one per request, kept for the params */
    if (!copy)
        return;
    for (size_t i = 0; i < srv->nroutes; i++) {
        const char *params[COORD_MAX_PARAMS];
        int np = 0;
        if (!match(srv->routes[i].pattern, url, plen, copy, params, &np))
            continue;
        if (strcmp(srv->routes[i].method, method) != 0) {
            st->method_mismatch = 1;
            continue;
        }
        st->route = i;
        st->method_mismatch = 0;
        memcpy(st->params, params, sizeof params);
        st->nparams = np;
        st->param_buf = copy;
        return;
    }
    free(copy);
}

static enum MHD_Result send_resp(struct MHD_Connection *conn, struct coord_server *srv,
                                 struct req_state *st, struct coord_resp *resp)
{
    char *body = NULL;
    size_t len = 0;
    const char *ctype = "application/json";
    if (resp->json) {
        body = json_dumps(resp->json, JSON_COMPACT);
        if (!body) {
            resp->status = 500;
            body = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
        }
        len = body ? strlen(body) : 0;
    } else if (resp->raw) {
        body = resp->raw;
        resp->raw = NULL;
        len = resp->raw_len;
        ctype = resp->content_type ? resp->content_type : "application/octet-stream";
    }
    if (!resp->status)
        resp->status = body || resp->has_fd ? 200 : 204;
    struct MHD_Response *r;
    if (resp->has_fd && !resp->json) {
        r = MHD_create_response_from_fd64(resp->fd_len, resp->fd);
        if (!r)
            close(resp->fd);
        resp->has_fd = 0;
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                resp->content_type ? resp->content_type : "application/octet-stream");
    } else {
        if (resp->has_fd) {
            close(resp->fd);
            resp->has_fd = 0;
        }
        r = MHD_create_response_from_buffer(len, body ? body : (char *)"",
                                            body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (!r) {
            free(body);
            return MHD_NO;
        }
        if (body)
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    }
    int cache_set = 0; /* the dashboard's files say how long they may be cached */
    for (int i = 0; i < 2; i++)
        if (resp->hdr_name[i][0]) {
            MHD_add_response_header(r, resp->hdr_name[i], resp->hdr_value[i]);
            cache_set |= !strcasecmp(resp->hdr_name[i], MHD_HTTP_HEADER_CACHE_CONTROL);
        }
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    /* Every answer is HTTPS: browsers that saw this once refuse plain HTTP
       to this host for a year (and ignore it over an unverified certificate). */
    MHD_add_response_header(r, "Strict-Transport-Security", "max-age=31536000");
    if (!cache_set)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (resp->retry_after[0])
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, resp->retry_after);
    if (resp->location[0])
        MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, resp->location);
    if (atomic_load(&srv->draining) || st->close)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    st->status = resp->status;
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void client_ip(struct MHD_Connection *conn, char *out, size_t cap)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, cap, "unknown");
    if (!ci || !ci->client_addr)
        return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)cap);
}

static void init_req(struct coord_server *srv, struct MHD_Connection *conn, const char *method,
                     const char *url, struct req_state *st, struct coord_req *req)
{
    memset(req, 0, sizeof *req);
    req->srv = srv;
    req->method = method;
    req->path = url;
    memcpy(req->params, st->params, sizeof req->params);
    req->nparams = st->nparams;
    req->conn_ = conn;
    client_ip(conn, req->client_ip, sizeof req->client_ip);
}

/* Authenticates the bearer token when one is sent or the route needs one,
 * and checks the route's roles. 1: go on; 0: resp holds the refusal. */
static int authorize(struct MHD_Connection *conn, const struct coord_route *rt,
                     struct coord_req *req, struct coord_resp *resp)
{
    const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!authz && rt->roles == COORD_PUBLIC)
        return 1;
    if (!coord_auth_bearer(req, resp, authz))
        return 0;
    if (rt->roles != COORD_PUBLIC && !(rt->roles & req->user.role)) {
        coord_resp_error(resp, 403, "forbidden", "the %s role may not do this",
                         coord_role_name(req->user.role));
        return 0;
    }
    return 1;
}

/* Runs the deferred request's finish into resp and lets go of it. */
static void deferred_finish(struct req_state *st, struct coord_resp *resp)
{
    struct coord_deferred *d = st->deferred;
    st->deferred = NULL;
    d->finish(d->ctx, &st->req, resp);
    deferred_put(d);
    if (!resp->status && !resp->json && !resp->raw)
        coord_resp_error(resp, 500, "internal", "the deferred handler gave no answer");
}

/* 1: resp holds the answer; 0: the handler deferred it and the connection
 * is parked until coord_deferred_done. */
static int dispatch(struct coord_server *srv, struct MHD_Connection *conn, const char *method,
                    const char *url, struct req_state *st, struct coord_resp *resp)
{
    if (st->route == srv->nroutes) {
        if (st->method_mismatch)
            coord_resp_error(resp, 405, "method_not_allowed", "%s is not allowed on %s", method, url);
        else
            coord_resp_error(resp, 404, "not_found", "no such endpoint: %s", url);
        return 1;
    }
    const struct coord_route *rt = &srv->routes[st->route];
    if (st->too_big) {
        coord_resp_error(resp, 413, "body_too_large", "the request body exceeds %zu bytes",
                         rt->body_max);
        return 1;
    }
    struct coord_req *req = &st->req;
    init_req(srv, conn, method, url, st, req);
    req->body = st->body;
    req->body_len = st->body_len;

    if (rt->json_body == 2 && st->body_len == 0) {
        req->json = json_object();
    } else if (rt->json_body) {
        char err[256];
        req->json = cm_json_parse_object(st->body ? st->body : "", st->body_len, err, sizeof err);
        if (!req->json) {
            coord_resp_error(resp, 400, "malformed_json", "%s", err);
            return 1;
        }
    } else if (st->body_len && !rt->body_max) {
        coord_resp_error(resp, 400, "unexpected_body", "%s %s takes no request body", method,
                         rt->pattern);
        return 1;
    }

    if (authorize(conn, rt, req, resp))
        rt->handler(req, resp);
    if (req->db) {
        coord_db_release(srv->db, req->db);
        req->db = NULL;
    }
    if (st->deferred) {
        if (deferred_park(srv, st->deferred))
            return 0;
        json_decref(resp->json); /* a deferring handler answers in finish only */
        resp->json = NULL;
        resp->status = 0;
        deferred_finish(st, resp);
    }
    json_decref(req->json);
    req->json = NULL;
    return 1;
}

static enum MHD_Result stream_begin(struct coord_server *srv, struct MHD_Connection *conn,
                                   const char *method, const char *url, struct req_state *st)
{
    const struct coord_route *rt = &srv->routes[st->route];
    struct coord_resp resp = {0};
    init_req(srv, conn, method, url, st, &st->req);
    if (authorize(conn, rt, &st->req, &resp))
        st->stream_ctx = rt->stream->begin(&st->req, &resp);
    /* Never hold a pool connection for the length of an upload. */
    if (st->req.db) {
        coord_db_release(srv->db, st->req.db);
        st->req.db = NULL;
    }
    if (!st->stream_ctx && !resp.status)
        coord_resp_error(&resp, 500, "internal", "could not start the upload");
    if (resp.status) {
        if (st->stream_ctx) {
            rt->stream->abort(st->stream_ctx);
            st->stream_ctx = NULL;
        }
        enum MHD_Result r = send_resp(conn, srv, st, &resp);
        json_decref(resp.json);
        free(resp.raw);
        return r;
    }
    return MHD_YES;
}

static enum MHD_Result stream_continue(struct coord_server *srv, struct MHD_Connection *conn,
                                      const char *upload, size_t *upload_size,
                                      struct req_state *st)
{
    const struct coord_route *rt = &srv->routes[st->route];
    if (st->status || !st->stream_ctx) { /* already refused: discard the rest */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        st->streamed += *upload_size;
        if (!st->stream_err) {
            if (st->streamed > rt->body_max)
                st->stream_err = CM_ETOOBIG;
            else
                st->stream_err = rt->stream->chunk(st->stream_ctx, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    struct coord_resp resp = {0};
    rt->stream->end(st->stream_ctx, &st->req, &resp, st->stream_err);
    st->stream_ctx = NULL;
    if (st->req.db) {
        coord_db_release(srv->db, st->req.db);
        st->req.db = NULL;
    }
    if (!resp.status && !resp.json)
        coord_resp_error(&resp, 500, "internal", "the upload handler gave no answer");
    enum MHD_Result r = send_resp(conn, srv, st, &resp);
    json_decref(resp.json);
    free(resp.raw);
    return r;
}

/* The guard's context for a connection (set when it was opened). */
static struct coord_guard_conn *guard_conn(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

struct framing {
    int content_length, transfer_encoding;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    (void)kind;
    (void)value;
    struct framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH))
        f->content_length++;
    else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING))
        f->transfer_encoding++;
    return MHD_YES;
}

/* Request smuggling: when a request says twice how long its body is, or both
 * with Content-Length and Transfer-Encoding, a proxy in front of us and we
 * may split the stream into requests differently (RFC 9112 §6.3). Such a
 * request is refused and its connection closed. NULL: the framing is clear. */
static const char *framing_error(struct MHD_Connection *conn)
{
    struct framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_framing, &f);
    if (f.content_length > 1)
        return "the request has more than one Content-Length header";
    if (f.content_length && f.transfer_encoding)
        return "the request has both Content-Length and Transfer-Encoding";
    if (f.transfer_encoding > 1)
        return "the request has more than one Transfer-Encoding header";
    return NULL;
}

/* Largest announced oversized body read (and dropped) so that the client
 * gets its 413; above it the answer goes out at once. */
#define DISCARD_MAX (8u << 20)

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    struct coord_server *srv = cls;
    struct req_state *st = *con_cls;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st)
            return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &st->start);
        atomic_fetch_add(&srv->inflight, 1);
        *con_cls = st;
        int bad_url = coord_guard_headers_done(srv->guard, guard_conn(conn));
        const char *framing = framing_error(conn);
        if (bad_url || framing) {
            st->route = srv->nroutes;
            st->close = framing != NULL;
            struct coord_resp resp = {0};
            if (framing)
                coord_resp_error(&resp, 400, "bad_framing", "%s", framing);
            else
                coord_resp_error(&resp, 400, "bad_path",
                                 "the request's path or query holds an escaped control "
                                 "character (%%00-%%1F, %%7F)");
            enum MHD_Result r = send_resp(conn, srv, st, &resp);
            json_decref(resp.json);
            return r;
        }
        route_request(srv, method, url, st);
        /* Refuse an announced oversized body before reading any of it. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        int unexpected = 0;
        if (cl && st->route < srv->nroutes) {
            unsigned long long n = strtoull(cl, NULL, 10);
            if (n > 0 && srv->routes[st->route].body_max == 0)
                unexpected = 1;
            else if (n > srv->routes[st->route].body_max)
                st->too_big = 1;
        }
        /* An oversized body the client is already sending (no "Expect:
           100-continue", which curl asks only above 1 MiB) is read and
           dropped, and the 413 goes out at its end: answering now and
           closing with the body unread makes the client's kernel see a
           reset instead of the answer. Past DISCARD_MAX it is not worth
           reading: answered at once. */
        if (st->too_big && !MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        MHD_HTTP_HEADER_EXPECT) &&
            strtoull(cl, NULL, 10) <= DISCARD_MAX && !atomic_load(&srv->draining))
            return MHD_YES;
        if (!unexpected && !st->too_big && !atomic_load(&srv->draining) &&
            st->route < srv->nroutes && srv->routes[st->route].stream)
            return stream_begin(srv, conn, method, url, st);
        if (unexpected || st->too_big || atomic_load(&srv->draining)) {
            struct coord_resp resp = {0};
            if (unexpected)
                coord_resp_error(&resp, 400, "unexpected_body", "%s %s takes no request body",
                                 method, srv->routes[st->route].pattern);
            else if (st->too_big)
                coord_resp_error(&resp, 413, "body_too_large", "the request body exceeds %zu bytes",
                                 srv->routes[st->route].body_max);
            else
                coord_resp_error(&resp, 503, "shutting_down", "the coordinator is shutting down");
            enum MHD_Result r = send_resp(conn, srv, st, &resp);
            json_decref(resp.json);
            return r;
        }
        return MHD_YES;
    }
    if (st->deferred) { /* resumed: the answer is ready */
        if (atomic_load(&st->deferred->state) != DEFER_DONE)
            return MHD_YES;
        struct coord_resp resp = {0};
        deferred_finish(st, &resp);
        json_decref(st->req.json);
        st->req.json = NULL;
        enum MHD_Result r = send_resp(conn, srv, st, &resp);
        json_decref(resp.json);
        free(resp.raw);
        return r;
    }
    if (st->stream_ctx || (!st->too_big && st->route < srv->nroutes && srv->routes[st->route].stream))
        return stream_continue(srv, conn, upload, upload_size, st);
    if (*upload_size) {
        size_t limit = st->route < srv->nroutes ? srv->routes[st->route].body_max : 0;
        if (!st->too_big && st->body_len + *upload_size > limit)
            st->too_big = 1;
        if (!st->too_big) {
            if (st->body_len + *upload_size + 1 > st->body_cap) {
                size_t ncap = (st->body_len + *upload_size + 1) * 2;
                if (ncap > limit + 1)
                    ncap = limit + 1;
                char *nb = realloc(st->body, ncap);
                if (!nb)
                    return MHD_NO;
                st->body = nb;
                st->body_cap = ncap;
            }
            memcpy(st->body + st->body_len, upload, *upload_size);
            st->body_len += *upload_size;
            st->body[st->body_len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->status) /* already answered (oversized body announced up front) */
        return MHD_YES;
    struct coord_resp resp = {0};
    if (!dispatch(srv, conn, method, url, st, &resp))
        return MHD_YES; /* parked: answered when resumed */
    enum MHD_Result r = send_resp(conn, srv, st, &resp);
    json_decref(resp.json);
    free(resp.raw);
    return r;
}

/* What the metrics count for a request that got no answer: the client's
 * doing (it left, 499, or was too slow, 408) is not a server error. */
static int unanswered_status(enum MHD_RequestTerminationCode toe)
{
    switch (toe) {
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT:
    case MHD_REQUEST_TERMINATED_READ_ERROR: return 499;
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return 408;
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return 503;
    default: return 500;
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct coord_server *srv = cls;
    struct req_state *st = *con_cls;
    if (!st)
        return;
    if (st->stream_ctx) /* the client left mid-upload */
        srv->routes[st->route].stream->abort(st->stream_ctx);
    if (st->req.db)
        coord_db_release(srv->db, st->req.db);
    if (st->deferred) /* closed before the answer was sent (stop, or an error) */
        deferred_put(st->deferred);
    json_decref(st->req.json);
    coord_guard_request_done(srv->guard, guard_conn(conn), st->req.authenticated);
    coord_metrics_observe(srv->metrics, st->route, st->status ? st->status : unanswered_status(toe),
                          elapsed_since(&st->start));
    free(st->body);
    free(st->param_buf);
    free(st);
    *con_cls = NULL;
    atomic_fetch_sub(&srv->inflight, 1);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct coord_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? coord_guard_opened(srv->guard, ci->connect_fd) : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        coord_guard_closed(srv->guard, *socket_context);
        *socket_context = NULL;
    }
}

/* libmicrohttpd's decoder of the URL and query arguments, plus a note when
 * one decodes to a control character: "%00" would otherwise cut a path
 * segment short unseen ("/runs/r1%00xyz" naming run r1). */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *uri)
{
    (void)cls;
    int control;
    size_t n = coord_url_unescape(uri, &control);
    if (control)
        coord_guard_mark_bad_url(guard_conn(conn));
    return n;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    CM_LOGD("http", "%s", msg);
}

static int parse_listen(const char *s, struct sockaddr_in *sa)
{
    const char *colon = strrchr(s, ':');
    if (!colon)
        return CM_EINVAL;
    char host[64];
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof host)
        return CM_EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return CM_EINVAL;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!hl || !strcmp(host, "*"))
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (!strcmp(host, "localhost"))
        sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return CM_EINVAL;
    return CM_OK;
}

int coord_http_start(struct coord_server *srv)
{
    struct sockaddr_in sa;
    if (parse_listen(srv->cfg->listen, &sa) != CM_OK) {
        CM_LOGE("http", "--listen '%s': expected IPV4:PORT (e.g. 0.0.0.0:8443)", srv->cfg->listen);
        return CM_EINVAL;
    }
    /* Suspend/resume: a handler waiting for the report writer's group
     * commit parks its connection instead of holding a thread (server.h,
     * coord_req_defer). */
    const struct coord_config *cfg = srv->cfg;
    struct coord_guard_limits lim = {(double)cfg->header_timeout, (double)cfg->idle_timeout,
                                     cfg->max_connections};
    int rc = coord_guard_new(&lim, srv->metrics, &srv->guard);
    if (rc != CM_OK)
        return rc;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TLS | MHD_USE_ERROR_LOG;
    /* Per-connection memory: libmicrohttpd zeroes the whole pool after every
     * request on a keep-alive connection, so its size is paid per request
     * (256 KiB cost ~8% of the coordinator's CPU serving reports). Bodies
     * are copied out of it; 64 KiB leaves room for headers and reads.
     * The connection timeout is libmicrohttpd's inactivity limit (a stalled
     * body); the absolute deadlines for headers are the guard's. */
    const char *prio = cfg->tls_priorities ? cfg->tls_priorities : COORD_TLS_PRIORITIES_DEFAULT;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_HTTPS_PRIORITIES, prio,
        MHD_OPTION_HTTPS_MEM_KEY, srv->tls_key_pem, MHD_OPTION_HTTPS_MEM_CERT,
        srv->tls_cert_pem, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096, MHD_OPTION_END);
    if (!d) {
        CM_LOGE("http",
                "could not listen on %s (address in use, TLS certificate unusable, or a "
                "--tls-priorities string GnuTLS does not accept: '%s')",
                cfg->listen, prio);
        coord_guard_free(srv->guard);
        srv->guard = NULL;
        return CM_EIO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : ntohs(sa.sin_port);
    srv->daemon = d;
    return CM_OK;
}

void coord_http_stop(struct coord_server *srv, int grace_ms)
{
    if (!srv->daemon)
        return;
    atomic_store(&srv->draining, 1);
    MHD_socket s = MHD_quiesce_daemon(srv->daemon);
    if (s != MHD_INVALID_SOCKET)
        close(s);
    /* In-flight requests finish; idle keep-alive connections are closed by stop. */
    for (int waited = 0; waited < grace_ms && atomic_load(&srv->inflight) > 0; waited += 10)
        usleep(10000);
    if (atomic_load(&srv->inflight) > 0)
        CM_LOGW("http", "stopping with %d requests still in flight after %d ms",
                atomic_load(&srv->inflight), grace_ms);
    /* libmicrohttpd must not be stopped with suspended connections: their
     * answers come from the report writer, whose every wait is bounded by
     * the database timeout. */
    long bound_ms = 4 * srv->cfg->db_timeout_ms + 1000;
    for (long waited = 0; atomic_load(&srv->suspended) > 0; waited += 10) {
        if (waited >= bound_ms && waited < bound_ms + 10)
            CM_LOGE("http", "%d deferred answers still pending after %ld ms; waiting for them",
                    atomic_load(&srv->suspended), bound_ms);
        usleep(10000);
    }
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    coord_guard_free(srv->guard);
    srv->guard = NULL;
}
