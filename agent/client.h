/* The agent's side of the coordinator REST API: HTTPS requests with
 * libcurl (deadlines, a size limit on answers, the coordinator's
 * certificate pinned with --ca-cert when it is self-signed), and the
 * agent's state directory (peer key, session, passes; all 0600). */
#ifndef AGENT_CLIENT_H
#define AGENT_CLIENT_H

#include <jansson.h>
#include <signal.h>
#include <stdint.h>

#include "cm_crypto.h"

struct agent_client {
    char *url;     /* https://host:port, no trailing slash */
    char *ca_cert; /* NULL: system CAs */
    char *token;   /* bearer session, or NULL */
    /* When set and nonzero (Ctrl-C), a request in flight is abandoned with
       CM_ECANCELED, without a message (a download leaves no file). */
    const volatile sig_atomic_t *cancel;
    /* Whole request, ms; 0: 30 s (the connection gets at most 10 s of it).
       For a request on a hot path that may rather fail than wait. */
    long timeout_ms;
};

struct agent_reply {
    long status;
    json_t *json; /* owned; NULL when the answer was not JSON */
};

/* Performs one request (body may be NULL). Returns CM_OK when an HTTP answer
 * came back (any status), CM_ECONN/CM_ETIMEOUT with a message on stderr, or
 * CM_ECANCELED (see cancel). */
int agent_request(const struct agent_client *c, const char *method, const char *path,
                  json_t *body, struct agent_reply *out);
void agent_reply_free(struct agent_reply *r);
/* Prints "error: <what>: <server message>" for a non-2xx reply. */
void agent_reply_report(const char *what, const struct agent_reply *r);

/* The run's record (GET /api/v1/runs/{run}): *config gets a copy of its
 * config object (the caller decrefs; a JSON null when the run has none) and
 * *target (when not NULL) its target_batch_size. CM_OK; CM_ENOTFOUND after
 * printing the coordinator's answer; or agent_request's error. */
int agent_run_config(const struct agent_client *c, const char *run, json_t **config, double *target);

/* Asks for an access pass for `run` (POST /api/v1/runs/{run}/passes) with a
 * request signed by the peer key `key` as user `username` at Unix time
 * now_s (docs/protocol.md, "Pass requests"). When the coordinator finds the
 * time outside its window (400 stale_request: this machine's clock is off),
 * signs again once with the coordinator's clock (GET /api/v1/time). Returns
 * as agent_request; the answer (any status) is in out. */
int agent_request_pass(const struct agent_client *c, const char *run, const char *username,
                       const struct cm_ed25519 *key, int64_t now_s, struct agent_reply *out);

/* The state directory: --config-dir, else $CROWDTRAIN_CONFIG_DIR, else
 * $XDG_CONFIG_HOME/crowdtrain, else ~/.config/crowdtrain. Created 0700. */
int agent_state_dir(const char *flag, char *out, size_t cap);
/* Writes a JSON file atomically with mode 0600. */
int agent_state_write(const char *dir, const char *name, json_t *j);
/* Reads a JSON object from dir/name (NULL when missing or malformed, with
 * a message on stderr when malformed). */
json_t *agent_state_read(const char *dir, const char *name);

#endif

/* Streams GET path into dest (written to dest.part, fsync'ed, renamed);
 * fills sha_hex from the X-Checkpoint-SHA256 header and verifies the file
 * against it. *status is the HTTP status (404: nothing there). */
int agent_download_file(const struct agent_client *c, const char *path, const char *dest,
                        long *status, char sha_hex[65]);
/* Streams src as the PUT body with "X-Checkpoint-SHA256: sha_hex". */
int agent_upload_file(const struct agent_client *c, const char *path, const char *src,
                      const char *sha_hex, struct agent_reply *out);
/* SHA-256 of a file, as 64 hex digits. */
int agent_file_sha256(const char *path, char hex[65]);
