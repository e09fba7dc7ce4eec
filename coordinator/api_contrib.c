/* POST /api/v1/runs/{run}/reports: a contribution report from an agent
 * (docs/accounting.md; seed 000_02cc6b5d62a616fc.txt §4.3 and H.4). The
 * caller has no session: it authenticates with its access pass and signs
 * the payload with the pass's peer key. This file checks everything that
 * needs no database — the pass's signature and expiry, the run, the report
 * signature over the exact bytes, the payload schema — then hands the report
 * to the batch writer (api_contrib_write.c) and waits for its commit.
 *
 * Verified passes are cached by the SHA-256 of the token bytes, so an agent
 * reporting every step costs one Ed25519 verification per report (its own
 * signature), not two. Revocation is not cached: the writer's INSERT joins
 * the pass row, so a revoked pass stops counting at once. */
#include "coordinator/api.h"
#include "coordinator/api_contrib.h"
#include "coordinator/metrics.h"
#include "cm_err.h"
#include "cm_log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIGN_PREFIX COORD_REPORT_FORMAT "\n"
#define KEYS_MAX 16
#define KEYS_TTL_S 30
#define PASS_CACHE 16384 /* verified passes kept, by token digest */
#define CLOCK_SKEW_S 60

/* --- coordinator keys (any coordinator of this database may have signed the pass) --- */

static pthread_mutex_t g_keys_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t g_keys[KEYS_MAX][CM_ED25519_PUB_LEN];
static size_t g_nkeys;
static time_t g_keys_at;

COORD_DB_STMT(S_KEYS, 0, "SELECT encode(public_key, 'hex') FROM signing_keys ORDER BY created_at");

/* Refreshes the key list when older than KEYS_TTL_S (force: older than 1 s,
 * for a pass signed by a coordinator that started after the last refresh). */
static void keys_refresh(struct coord_req *req, int force)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&g_keys_mu);
    int stale = g_nkeys == 0 || now - g_keys_at >= (force ? 1 : KEYS_TTL_S);
    pthread_mutex_unlock(&g_keys_mu);
    if (!stale)
        return;
    struct coord_db_conn *c = NULL;
    if (coord_db_acquire(req->srv->db, &c) != CM_OK)
        return;
    PGresult *r = coord_db_exec(c, &S_KEYS, NULL, NULL);
    coord_db_release(req->srv->db, c);
    if (!r)
        return;
    pthread_mutex_lock(&g_keys_mu);
    g_nkeys = 0;
    for (int i = 0; i < PQntuples(r) && g_nkeys < KEYS_MAX; i++) {
        size_t n = 0;
        const char *h = PQgetvalue(r, i, 0);
        if (cm_hex_decode(h, strlen(h), g_keys[g_nkeys], CM_ED25519_PUB_LEN, &n) == CM_OK &&
            n == CM_ED25519_PUB_LEN)
            g_nkeys++;
    }
    g_keys_at = now;
    pthread_mutex_unlock(&g_keys_mu);
    PQclear(r);
}

static int verify_with_keys(const char *tok, size_t len, int64_t now, struct cm_pass_claims *c)
{
    uint8_t keys[KEYS_MAX][CM_ED25519_PUB_LEN];
    pthread_mutex_lock(&g_keys_mu);
    size_t n = g_nkeys;
    memcpy(keys, g_keys, sizeof keys);
    pthread_mutex_unlock(&g_keys_mu);
    return cm_token_verify(tok, len, (const uint8_t(*)[CM_ED25519_PUB_LEN])keys, n, now,
                           CLOCK_SKEW_S, c);
}

/* --- verified-pass cache ---------------------------------------------------- */

struct pass_slot {
    uint8_t digest[CM_SHA256_LEN];
    int used;
    struct cm_pass_claims claims;
};
/* PASS_SETS sets of PASS_WAYS slots: 1,000 agents in 4,096 direct-mapped
 * slots collide often enough (~1 in 8 reports missed the cache, each
 * miss a second Ed25519 verification); 4 ways make that rare. */
#define PASS_WAYS 4
#define PASS_SETS (PASS_CACHE / PASS_WAYS)
static pthread_mutex_t g_pass_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pass_slot g_pass[PASS_SETS][PASS_WAYS];
static unsigned g_pass_next[PASS_SETS]; /* the way replaced next (round robin) */

/* Verifies the pass (signature under a coordinator key, expiry). */
static int pass_verify(struct coord_req *req, const char *tok, size_t len,
                       struct cm_pass_claims *out)
{
    int64_t now = (int64_t)time(NULL);
    uint8_t d[CM_SHA256_LEN];
    cm_sha256(tok, len, d);
    size_t set = ((size_t)d[0] | (size_t)d[1] << 8 | (size_t)d[2] << 16) % PASS_SETS;
    int hit = 0;
    pthread_mutex_lock(&g_pass_mu);
    for (int w = 0; w < PASS_WAYS && !hit; w++) {
        const struct pass_slot *sl = &g_pass[set][w];
        if (sl->used && !memcmp(sl->digest, d, sizeof d)) {
            *out = sl->claims;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&g_pass_mu);
    if (hit)
        return now >= out->expires_at + CLOCK_SKEW_S ? CM_EEXPIRED : CM_OK;

    keys_refresh(req, 0);
    int rc = verify_with_keys(tok, len, now, out);
    if (rc == CM_ENOTFOUND || rc == CM_EBADSIG) { /* maybe a key we have not seen yet */
        keys_refresh(req, 1);
        rc = verify_with_keys(tok, len, now, out);
    }
    if (rc != CM_OK)
        return rc;
    pthread_mutex_lock(&g_pass_mu);
    int w = 0;
    while (w < PASS_WAYS && g_pass[set][w].used && memcmp(g_pass[set][w].digest, d, sizeof d))
        w++;
    if (w == PASS_WAYS) {
        for (w = 0; w < PASS_WAYS && g_pass[set][w].used; w++)
            ;
        if (w == PASS_WAYS)
            w = (int)(g_pass_next[set]++ % PASS_WAYS);
    }
    struct pass_slot *sl = &g_pass[set][w];
    memcpy(sl->digest, d, sizeof d);
    sl->claims = *out;
    sl->used = 1;
    pthread_mutex_unlock(&g_pass_mu);
    return CM_OK;
}

/* --- the handler --------------------------------------------------------- */

static void reject(struct coord_req *req, struct coord_resp *resp, int status, const char *code,
                   const char *msg)
{
    coord_metrics_event(req->srv->metrics, COORD_EV_REPORT_REJECTED);
    coord_resp_error(resp, status, code, "%s", msg);
}

/* One report from verification to the answer: one allocation holding the
 * parsed report, the writer's job and the signed message. */
struct report_call {
    struct coord_report rep;
    struct coord_report_job job;
    int rc; /* of handing the job to the writer */
    char msg[]; /* SIGN_PREFIX || payload bytes || NUL */
};

/* The writer's answer as an HTTP answer (on a server thread). */
static void report_finish(void *ctx, struct coord_req *req, struct coord_resp *resp)
{
    struct report_call *call = ctx;
    const struct coord_report *rep = &call->rep;
    struct coord_metrics *m = req->srv->metrics;
    char err[256];
    json_t *ok = NULL;
    switch (call->rc == CM_OK ? call->job.result : COORD_REPORT_FAILED) {
    case COORD_REPORT_RECORDED:
        coord_metrics_event(m, COORD_EV_REPORT_RECORDED);
        for (size_t i = 0; i < rep->n_excluded; i++)
            coord_metrics_event(m, COORD_EV_REPORT_EXCLUSION);
        ok = json_pack("{s:s, s:s, s:I}", "status", "recorded", "run", rep->run, "step",
                       (json_int_t)rep->step);
        if (ok)
            coord_resp_json(resp, 201, ok);
        else
            coord_resp_error(resp, 500, "internal", "out of memory");
        break;
    case COORD_REPORT_DUPLICATE:
        coord_metrics_event(m, COORD_EV_REPORT_DUPLICATE);
        ok = json_pack("{s:s, s:s, s:I}", "status", "already_recorded", "run", rep->run, "step",
                       (json_int_t)rep->step);
        if (ok)
            coord_resp_json(resp, 200, ok);
        else
            coord_resp_error(resp, 500, "internal", "out of memory");
        break;
    case COORD_REPORT_CONFLICT:
        coord_metrics_event(m, COORD_EV_REPORT_CONFLICT);
        coord_resp_error(resp, 409, "conflicting_report",
                         "a different report for step %lld of this peer was recorded "
                         "before; this one is kept as a conflict and not counted",
                         (long long)rep->step);
        break;
    case COORD_REPORT_REVOKED:
        reject(req, resp, 403, "pass_revoked", "the access pass is revoked or expired");
        break;
    case COORD_REPORT_NO_RUN:
        reject(req, resp, 404, "not_found", "no such run");
        break;
    case COORD_REPORT_STEP_RANGE:
        snprintf(err, sizeof err,
                 "step %lld is more than %d steps beyond the run's highest corroborated step",
                 (long long)rep->step, COORD_REPORT_STEP_AHEAD);
        reject(req, resp, 422, "step_out_of_range", err);
        break;
    case COORD_REPORT_RUN_CLOSED:
        reject(req, resp, 409, "run_not_open",
               "the run is paused, or finished and this step is not one of its own");
        break;
    case COORD_REPORT_FAILED:
    default:
        coord_resp_error(resp, 503, "unavailable", "the report could not be stored now; retry later");
        snprintf(resp->retry_after, sizeof resp->retry_after, "1");
        break;
    }
}

static void report_release(void *ctx)
{
    free(ctx);
}

static void report_stored(struct coord_report_job *job, void *arg)
{
    (void)job;
    coord_deferred_done(arg);
}

/* The body's three strings: the agents' form without a generic JSON
 * parse, anything else through one (which words the errors). 1: *env set
 * (borrowing from the body or from *doc, which the caller releases). */
static int read_envelope(struct coord_req *req, struct coord_resp *resp,
                         struct coord_report_env *env, json_t **doc)
{
    static const struct cm_json_field F[] = {
        {"pass", CM_J_STRING, 1, 1, CM_TOKEN_MAX_LEN},
        {"payload", CM_J_STRING, 1, 1, (COORD_REPORT_PAYLOAD_MAX * 4 + 2) / 3},
        {"sig", CM_J_STRING, 1, 86, 86},
    };
    *doc = NULL;
    if (coord_report_envelope(req->body, req->body_len, env)) {
        const size_t len[3] = {env->pass_len, env->payload_len, env->sig_len};
        int in = 1;
        for (int i = 0; i < 3; i++)
            in &= len[i] >= (size_t)F[i].min && len[i] <= (size_t)F[i].max;
        if (in)
            return 1; /* out of bounds: the generic path words the refusal */
    }
    char err[256];
    *doc = cm_json_parse_object(req->body ? req->body : "", req->body_len, err, sizeof err);
    if (!*doc) {
        reject(req, resp, 400, "malformed_json", err);
        return 0;
    }
    req->json = *doc;
    int ok = coord_req_check(req, resp, F, sizeof F / sizeof F[0]);
    req->json = NULL;
    if (!ok) {
        coord_metrics_event(req->srv->metrics, COORD_EV_REPORT_REJECTED);
        return 0;
    }
    env->pass = json_string_value(json_object_get(*doc, "pass"));
    env->payload = json_string_value(json_object_get(*doc, "payload"));
    env->sig = json_string_value(json_object_get(*doc, "sig"));
    env->pass_len = strlen(env->pass);
    env->payload_len = strlen(env->payload);
    env->sig_len = strlen(env->sig);
    return 1;
}

static void report_post(struct coord_req *req, struct coord_resp *resp,
                        const struct coord_report_env *env);

void api_reports_post(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run"))
        return;
    struct coord_report_env env;
    json_t *doc = NULL;
    if (read_envelope(req, resp, &env, &doc))
        report_post(req, resp, &env);
    json_decref(doc);
}

static void report_post(struct coord_req *req, struct coord_resp *resp,
                        const struct coord_report_env *env)
{
    const char *tok = env->pass, *p64 = env->payload, *s64 = env->sig;
    struct cm_pass_claims claims;
    int rc = pass_verify(req, tok, env->pass_len, &claims);
    if (rc != CM_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "the access pass does not verify: %s", cm_strerror(rc));
        reject(req, resp, 401, "invalid_pass", msg);
        return;
    }
    if (strcmp(claims.run, req->params[0]) != 0) {
        reject(req, resp, 403, "wrong_run", "the access pass is for another run");
        return;
    }
    uint8_t sig[CM_ED25519_SIG_LEN];
    size_t n = 0;
    if (cm_b64url_decode(s64, env->sig_len, sig, sizeof sig, &n) != CM_OK || n != sizeof sig) {
        reject(req, resp, 400, "invalid_request", "field 'sig': base64url of 64 bytes");
        return;
    }
    size_t pre = sizeof SIGN_PREFIX - 1, plen = env->payload_len;
    /* the decoded payload is shorter than its base64 */
    struct report_call *call = malloc(sizeof *call + pre + plen + 1);
    if (!call) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    char *msg = call->msg;
    memcpy(msg, SIGN_PREFIX, pre);
    if (cm_b64url_decode(p64, plen, (uint8_t *)msg + pre, plen, &n) != CM_OK || n == 0) {
        free(call);
        reject(req, resp, 400, "invalid_request", "field 'payload': base64url (no padding)");
        return;
    }
    char *payload = msg + pre;
    size_t payload_len = n;
    payload[payload_len] = '\0';
    if (cm_ed25519_verify(claims.peer_public_key, msg, pre + payload_len, sig) != CM_OK) {
        free(call);
        reject(req, resp, 401, "bad_signature",
               "the report signature does not verify under the pass's peer key");
        return;
    }
    struct coord_report *rep = &call->rep;
    char err[256];
    if (memchr(payload, '\0', payload_len) ||
        coord_report_parse(payload, payload_len, rep, err, sizeof err) != CM_OK) {
        if (memchr(payload, '\0', payload_len))
            snprintf(err, sizeof err, "payload: contains a NUL byte");
        reject(req, resp, 400, "invalid_report", err);
    } else if (strcmp(rep->run, req->params[0]) != 0) {
        reject(req, resp, 403, "wrong_run", "the payload's 'run' is not this run");
    } else if (memcmp(rep->peer, claims.peer_public_key, CM_ED25519_PUB_LEN) != 0) {
        reject(req, resp, 403, "wrong_peer", "the payload's 'peer' is not the pass's key");
    } else {
        memset(&call->job, 0, sizeof call->job);
        call->job.rep = rep;
        call->job.payload = payload;
        call->job.payload_len = payload_len;
        memcpy(call->job.sig, sig, sizeof sig);
        call->job.pass_id = strtoll(claims.pass_id, NULL, 10);
        int timeout_ms = (int)req->srv->cfg->db_timeout_ms;
        /* Park the connection until the batch commits: no server thread waits. */
        struct coord_deferred *d = coord_req_defer(req, report_finish, report_release, call);
        if (d) {
            call->rc = coord_report_submit(req->srv->db, &call->job, timeout_ms, report_stored, d);
            if (call->rc != CM_OK)
                coord_deferred_done(d); /* answered at once: 503 */
            return;
        }
        call->rc = coord_report_write(req->srv->db, &call->job, timeout_ms);
        report_finish(call, req, resp);
    }
    free(call);
}
