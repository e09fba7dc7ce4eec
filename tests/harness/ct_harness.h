/* Test harness for integration tests: real services, torn down even when a
 * test fails or the test process dies.
 *
 *  - ct_pg_*: a PostgreSQL cluster in a temp dir on a free loopback port,
 *    run as the unprivileged 'postgres' user when we are root (initdb
 *    refuses root). The server is our child with PR_SET_PDEATHSIG, so it
 *    dies with the test.
 *  - ct_coord_*: the real crowdtrain-coordinator binary against it.
 *  - ct_http: HTTPS requests with libcurl, verifying the coordinator's
 *    self-signed certificate, returning status and parsed JSON.
 *  - ct_run: runs a command with stdin text and captures its output. */
#ifndef CT_HARNESS_H
#define CT_HARNESS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cm_crypto.h"

#define CT_SKIP 77

struct ct_pg {
    char dir[256];
    char url[256];
    int port;
    pid_t pid;
};

/* 0, CT_SKIP when PostgreSQL is not installed, or -1. */
int ct_pg_start(struct ct_pg *pg);
void ct_pg_stop(struct ct_pg *pg);
/* Runs SQL through libpq; returns 0 on success. */
int ct_pg_exec(struct ct_pg *pg, const char *sql);
/* Runs a query returning one integer; returns 0 on success. */
int ct_pg_scalar(struct ct_pg *pg, const char *sql, long *out);

struct ct_coord {
    char dir[256]; /* data dir */
    char url[256]; /* https://127.0.0.1:PORT */
    char ca[300];  /* its certificate, to verify it */
    char log[300];
    pid_t pid;
    int own_dir;
};

/* Starts `crowdtrain-coordinator serve` with a fresh data dir (or `dir` when
 * non-NULL, for restarts) and extra NULL-terminated args; waits until
 * /api/v1/health answers 200 (20 s deadline). */
int ct_coord_start(struct ct_coord *c, const char *db_url, const char *dir,
                   const char *const *extra_args);
/* Sends `sig` (0: none, just wait) and waits up to 15 s (then SIGKILL). Returns the exit status
 * (128+signal when killed by a signal). Keeps the data dir. */
int ct_coord_stop(struct ct_coord *c, int sig);
/* Stops it gracefully if running (SIGTERM) and removes the data dir if the
 * harness made it. Returns -1, after printing the coordinator's log, when it
 * did not exit with status 0 (e.g. a sanitizer report). */
int ct_coord_cleanup(struct ct_coord *c);

struct ct_resp {
    long status;
    json_t *json; /* NULL when the body is not JSON */
    char *body;
    size_t len;
    int curl_error; /* nonzero: no HTTP response at all */
};
/* method GET/POST/PUT/PATCH/DELETE; body may be NULL; bearer may be NULL. */
int ct_http(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
            const char *body, struct ct_resp *out);
int ct_http_raw(const struct ct_coord *c, const char *method, const char *path,
                const char *const *headers, const void *body, size_t body_len,
                struct ct_resp *out);
/* ct_http from the local address src (e.g. "127.0.0.2": all of 127.0.0.0/8
 * is local on Linux), so the coordinator sees another client address. */
int ct_http_from(const struct ct_coord *c, const char *src, const char *method, const char *path,
                 const char *bearer, const char *body, struct ct_resp *out);
void ct_resp_free(struct ct_resp *r);

/* Logs in with a password; returns a heap token or NULL. */
char *ct_login(const struct ct_coord *c, const char *user, const char *password);
/* crowdtrain-coordinator create-user ... with the password on stdin; 0 ok. */
int ct_create_user(const char *db_url, const char *user, const char *role, const char *password);

/* Path of a built binary (build/bin/NAME next to this test's build dir). */
const char *ct_bin(const char *name);
/* Runs argv with stdin_text (may be NULL); captures stdout+stderr into *out
 * (heap, may be NULL); returns the exit status, 128+sig when signalled. */
int ct_run(const char *const *argv, const char *stdin_text, char **out, int timeout_s);
/* Starts argv in the background with stdout+stderr to logpath (dies with
 * the test). Returns the pid or -1. */
pid_t ct_spawn(const char *const *argv, const char *logpath);
/* The same, in the network namespace /var/run/netns/ns (NULL: ours). */
int ct_run_ns(const char *ns, const char *const *argv, const char *stdin_text, char **out, int timeout_s);
pid_t ct_spawn_ns(const char *ns, const char *const *argv, const char *logpath);
/* Waits up to timeout_s for pid (then SIGKILL); exit status or 128+sig. */
int ct_wait(pid_t pid, int timeout_s);
/* Reads a whole file (heap, NUL-terminated) or NULL. */
char *ct_read_file(const char *path, size_t *len);
/* Waits for n agents (ct_wait, timeout_s each) and prints the log of every
 * one that did not exit 0; the number that did not. */
int ct_wait_agents(const pid_t *pids, const char (*logs)[320], int n, int timeout_s);
/* Makes a temp dir /tmp/ct-<tag>-XXXXXX; returns 0. */
int ct_tempdir(const char *tag, char *out, size_t cap);

/* The body of a pass request for `run` signed by `key` as `user`, timed
 * now with a fresh nonce (docs/protocol.md, "Pass requests"), into out
 * (cap >= 256). Each call makes a new request: one body is accepted once.
 * 0 on success. */
int ct_pass_body(const char *run, const char *user, const struct cm_ed25519 *key, char *out, size_t cap);
/* POST /api/v1/runs/{run}/passes with ct_pass_body; returns the status
 * (0 when no request was made), the answer in out (free it). */
long ct_pass_request(const struct ct_coord *c, const char *bearer, const char *run, const char *user,
                     const struct cm_ed25519 *key, struct ct_resp *out);

/* A volunteer account `name` (password "volunteer-pw") made by the
 * organizer `org`, allowlisted on run, and a fresh state directory for it
 * in dir (256 bytes). 0 on success. */
int ct_volunteer_account(const struct ct_coord *c, const char *org, const char *run, const char *name, char *dir);

/* Volunteers for agent tests: creates accounts vol0..vol<n-1> (password
 * "volunteer-pw") as the organizer `org`, allowlists them on `run`, makes a
 * state directory for each (dirs[i], 256 bytes) and logs the agent in there
 * (`crowdtrain-agent login`). 0 on success. */
int ct_volunteers(const struct ct_coord *c, const char *org, const char *run, int n,
                  char (*dirs)[256]);

/* The example Fashion-MNIST recipe (examples/fmnist-collab.json) with its
 * manifests made absolute and, when steps > 0, its "steps" set; NULL when
 * it cannot be read (run from the repository root). */
json_t *ct_fmnist_recipe(long steps);
/* A text-bytes data set for the byte GPT: `len` bytes of a repetitive but
 * not trivial text (the words of test_train_local, drawn from `seed`) in
 * dir/name.txt and its manifest (one file:// shard with its SHA-256) in
 * dir/name.json, whose path goes to mpath (cap bytes). 0 on success. */
int ct_text_manifest(const char *dir, const char *name, size_t len, uint64_t seed, char *mpath, size_t cap);
/* The body of POST /api/v1/runs for a run `name` with that recipe (heap). */
char *ct_run_body(const char *name, json_t *recipe);

/* Median of v[0..n) (sorts v); 0 when n == 0. */
double ct_median(double *v, size_t n);

/* A real checkpoint file (common/ckpt format) of `step` with n parameters
 * and one optimizer buffer derived from seed, written through a file in
 * dir; heap bytes (*len), its SHA-256 in hex, and (params non-NULL) the
 * SHA-256 of its parameters. NULL on failure. */
uint8_t *ct_make_ckpt(const char *dir, uint64_t step, unsigned seed, size_t n, size_t *len,
                      char hex[65], uint8_t params[32]);
void ct_rmrf(const char *dir);

#endif
