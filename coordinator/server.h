/* The coordinator's request model: a route table of {method, path pattern,
 * handler, allowed roles, body limit}, and handlers that see a plain
 * struct coord_req and fill a struct coord_resp — never libmicrohttpd types,
 * so each handler can be read (and tested) on its own.
 *
 * http.c owns the libmicrohttpd daemon: TLS, the thread pool, body limits,
 * authentication of bearer sessions, metrics, graceful shutdown. */
#ifndef COORD_SERVER_H
#define COORD_SERVER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"
#include "cm_json.h"
#include "cm_token.h"
#include "coordinator/config.h"
#include "coordinator/db.h"

enum coord_role {
    COORD_ROLE_VOLUNTEER = 1u << 0,
    COORD_ROLE_AUDITOR = 1u << 1,
    COORD_ROLE_ORGANIZER = 1u << 2,
};
#define COORD_ROLES_ANY (COORD_ROLE_VOLUNTEER | COORD_ROLE_AUDITOR | COORD_ROLE_ORGANIZER)
#define COORD_ROLES_READ_ADMIN (COORD_ROLE_AUDITOR | COORD_ROLE_ORGANIZER)
#define COORD_PUBLIC 0u

/* Parses "organizer|auditor|volunteer"; 0 when unknown. */
unsigned coord_role_parse(const char *s);
const char *coord_role_name(unsigned role);

struct coord_user {
    int64_t id;
    char username[CM_NAME_MAX + 1];
    unsigned role;
};

struct coord_server;

#define COORD_MAX_PARAMS 4
struct coord_req {
    struct coord_server *srv;
    const char *method;
    const char *path;
    const char *params[COORD_MAX_PARAMS]; /* the {} segments of the route, in order */
    int nparams;
    const char *body;
    size_t body_len;
    json_t *json; /* parsed body for routes that take JSON; borrowed */
    int authenticated;
    struct coord_user user;
    char client_ip[64];
    struct coord_db_conn *db; /* borrowed for the request; see coord_req_db */
    void *conn_;              /* opaque: the transport's connection */
};

struct coord_resp {
    int status;
    json_t *json;      /* owned; serialized as the body when set */
    char *raw;         /* owned; body when json is NULL */
    size_t raw_len;
    const char *content_type; /* static string; default application/json */
    char retry_after[16];     /* Retry-After header value when set */
    char location[256];       /* Location header when set */
    char hdr_name[2][40];     /* up to two extra headers */
    char hdr_value[2][160];
    int has_fd;               /* body is the file `fd` (taken over and closed), fd_len bytes */
    int fd;
    uint64_t fd_len;
};

/* Routes whose body is too large to hold in memory (checkpoints) stream it:
 * begin runs as soon as the headers are in and the caller is authenticated
 * (so nothing is read from a caller who may not upload); chunk receives the
 * body piece by piece; end answers. abort runs instead of end when the client
 * goes away mid-upload, and must leave nothing behind. */
struct coord_stream_ops {
    void *(*begin)(struct coord_req *req, struct coord_resp *resp);
    int (*chunk)(void *ctx, const char *data, size_t len);
    void (*end)(void *ctx, struct coord_req *req, struct coord_resp *resp, int chunk_err);
    void (*abort)(void *ctx);
};

typedef void (*coord_handler)(struct coord_req *req, struct coord_resp *resp);

struct coord_route {
    const char *method;
    const char *pattern; /* "/api/v1/runs/{}/allowlist/{}" */
    coord_handler handler;
    unsigned roles;   /* COORD_PUBLIC or a mask of roles allowed */
    size_t body_max;  /* 0: no body accepted */
    int json_body;    /* 1: body must be a JSON object (parsed into req->json);
                         2: the same, but an empty body counts as {} */
    const struct coord_stream_ops *stream; /* non-NULL: streamed body, up to body_max */
};

/* Sets an error response {"error": {"code", "message"}}. */
void coord_resp_error(struct coord_resp *resp, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Takes ownership of `json`. */
void coord_resp_json(struct coord_resp *resp, int status, json_t *json);
/* Copies `len` bytes as the body. */
void coord_resp_raw(struct coord_resp *resp, int status, const char *content_type,
                    const void *data, size_t len);

/* Borrows a database connection for the rest of the request; on failure
 * sets a 503 response and returns NULL. */
struct coord_db_conn *coord_req_db(struct coord_req *req, struct coord_resp *resp);
/* Answering later. A handler that waits for another thread (the report
 * writer's group commit) must not hold a server thread meanwhile: it calls
 * coord_req_defer, hands the returned ticket to that thread, leaves resp
 * empty and returns. The connection is parked (no thread, not polled) until
 * the other thread calls coord_deferred_done(ticket), exactly once; then
 * finish(ctx, req, resp) runs on a server thread and fills the answer.
 * release(ctx) runs once neither side needs ctx any more (after finish, or
 * when the connection closed first). NULL: cannot defer (out of memory, or
 * no transport to park): answer synchronously instead. */
typedef void (*coord_finish_fn)(void *ctx, struct coord_req *req, struct coord_resp *resp);
struct coord_deferred;
struct coord_deferred *coord_req_defer(struct coord_req *req, coord_finish_fn finish,
                                       void (*release)(void *ctx), void *ctx);
/* Any thread; wakes the parked connection. The ticket is gone afterwards. */
void coord_deferred_done(struct coord_deferred *ticket);

/* Query-string argument, or NULL. Header value, or NULL. */
const char *coord_req_query(struct coord_req *req, const char *key);
const char *coord_req_header(struct coord_req *req, const char *key);
/* Validates req->json against fields; on failure sets a 400 and returns 0. */
int coord_req_check(struct coord_req *req, struct coord_resp *resp,
                    const struct cm_json_field *fields, size_t n);

/* The coordinator's shared state. */
struct coord_server {
    struct coord_config *cfg;
    struct coord_db_pool *db;
    struct cm_ed25519 signing_key;
    char kid[CM_KID_LEN + 1];
    char *tls_cert_pem, *tls_key_pem;
    const struct coord_route *routes;
    size_t nroutes;
    void *daemon; /* struct MHD_Daemon * */
    uint16_t port;
    atomic_int draining;
    atomic_int inflight;
    atomic_int suspended; /* connections parked by coord_req_defer */
    struct coord_metrics *metrics;
    struct coord_cache *runs_cache;
    struct coord_guard *guard; /* connection deadlines and eviction (http_guard.h) */
};

int coord_http_start(struct coord_server *srv);
/* Stops accepting, lets in-flight requests finish (up to grace_ms), stops. */
void coord_http_stop(struct coord_server *srv, int grace_ms);

/* Route table (routes.c). */
extern const struct coord_route coord_routes[];
extern const size_t coord_nroutes;

#endif
