/* The agent's contribution reporter (see report.h; docs/accounting.md and
 * docs/protocol.md, "Contribution reports"). Training calls
 * peer_reporter_submit after each round; the payload is encoded and signed
 * there (cheap: one Ed25519 signature) and queued. A background thread
 * posts the queue in order with one keep-alive libcurl handle, building the
 * body with the newest pass at send time so a renewed pass is used for
 * retries. Connection errors, 408, 429 and 5xx are retried with exponential
 * backoff until the report's deadline; other answers end the report (a 409
 * means a different report for that step was stored before). */
#include "agent/peer/report.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_token.h"
#include "cm_time.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIGN_PREFIX PEER_REPORT_FORMAT "\n"

/* --- encoding ------------------------------------------------------------- */

struct w {
    char *p;
    size_t cap, len;
    int over;
};

static void put(struct w *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct w *w, const char *fmt, ...)
{
    if (w->over)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->p + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= w->cap - w->len) {
        w->over = 1;
        return;
    }
    w->len += (size_t)n;
}

static int in(double x, double lo, double hi)
{
    return isfinite(x) && x >= lo && x <= hi;
}

static int group_ok(const char *g)
{
    size_t n = strnlen(g, 65);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = g[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static int reason_ok(const char *s)
{
    size_t n = strnlen(s, 16);
    if (n == 0 || n > 15)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

int peer_report_encode(const struct peer_report *r, const char *run, const uint8_t pub[32],
                       int64_t t, char *out, size_t cap, size_t *len)
{
    if (!cm_name_valid(run) || r->step < 0 || r->step > ((int64_t)1 << 53) || !group_ok(r->group) ||
        !in(r->samples, 0, 1e9) || !in(r->compute_s, 0, 86400) || !in(r->sps, 0, 1e9) ||
        !in(r->round_ms, 0, 3.6e6) || r->parts < 0 || r->parts > 4096 || r->parts_averaged < 0 ||
        r->parts_averaged > r->parts || r->n_members > PEER_REPORT_MEMBERS_MAX ||
        r->n_excluded > PEER_REPORT_MEMBERS_MAX || r->n_experts > PEER_REPORT_EXPERTS_MAX || t < 0)
        return CM_EINVAL;
    for (size_t i = 0; i < r->n_members; i++) {
        if (!in(r->members[i].samples, 0, 1e9))
            return CM_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (!memcmp(r->members[i].pub, r->members[j].pub, 32))
                return CM_EINVAL;
    }
    for (size_t i = 0; i < r->n_excluded; i++) {
        if (!reason_ok(r->excluded[i].reason))
            return CM_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (!memcmp(r->excluded[i].pub, r->excluded[j].pub, 32))
                return CM_EINVAL;
    }
    for (size_t i = 0; i < r->n_experts; i++) {
        if (!in(r->experts[i].samples, 0, 1e9))
            return CM_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (!memcmp(r->experts[i].pub, r->experts[j].pub, 32))
                return CM_EINVAL;
    }
    char k[48], round[65];
    struct w w = {out, cap, 0, 0};
    cm_b64url_encode(pub, 32, k);
    cm_hex_encode(r->round_id, 32, round);
    put(&w, "{\"format\":\"%s\",\"run\":\"%s\",\"peer\":\"%s\",\"step\":%lld,\"group\":\"%s\","
            "\"round\":\"%s\",\"samples\":%.17g,\"compute_s\":%.17g,",
        PEER_REPORT_FORMAT, run, k, (long long)r->step, r->group, round, r->samples, r->compute_s);
    /* A loss is only meaningful over samples; a diverged (huge or NaN) loss is left out
     * rather than losing the report. */
    if (r->samples > 0 && in(r->loss, 0, 1e6))
        put(&w, "\"loss\":%.17g,", r->loss);
    /* Optional, like params: coordinators before them refuse the fields, so
     * a report of a model without those heads is byte for byte what it was. */
    if (r->has_sop_loss && r->samples > 0 && in(r->sop_loss, 0, 1e6))
        put(&w, "\"sop_loss\":%.17g,", r->sop_loss);
    if (r->has_mlm_accuracy && r->samples > 0 && in(r->mlm_accuracy, 0, 1))
        put(&w, "\"mlm_accuracy\":%.17g,", r->mlm_accuracy);
    put(&w, "\"sps\":%.17g,\"round_ms\":%.17g,\"parts\":%d,\"parts_averaged\":%d,",
        r->sps, r->round_ms, r->parts, r->parts_averaged);
    if (r->has_params) {
        char ph[65];
        cm_hex_encode(r->params, 32, ph);
        put(&w, "\"params\":\"%s\",", ph);
    }
    put(&w, "\"members\":{");
    for (size_t i = 0; i < r->n_members; i++) {
        cm_b64url_encode(r->members[i].pub, 32, k);
        put(&w, "%s\"%s\":%.17g", i ? "," : "", k, r->members[i].samples);
    }
    put(&w, "},\"excluded\":[");
    for (size_t i = 0; i < r->n_excluded; i++) {
        cm_b64url_encode(r->excluded[i].pub, 32, k);
        put(&w, "%s{\"peer\":\"%s\",\"reason\":\"%.15s\"}", i ? "," : "", k, r->excluded[i].reason);
    }
    put(&w, "]");
    /* Optional: coordinators before it refuse the field, so it is written
     * only when there is something to attest. */
    if (r->n_experts) {
        put(&w, ",\"experts\":{");
        for (size_t i = 0; i < r->n_experts; i++) {
            cm_b64url_encode(r->experts[i].pub, 32, k);
            put(&w, "%s\"%s\":%.17g", i ? "," : "", k, r->experts[i].samples);
        }
        put(&w, "}");
    }
    put(&w, ",\"t\":%lld}", (long long)t);
    if (w.over || w.len > PEER_REPORT_PAYLOAD_MAX)
        return CM_ETOOBIG;
    *len = w.len;
    return CM_OK;
}

static int sign_payload(const struct cm_ed25519 *key, const char *payload, size_t len,
                        uint8_t sig[CM_ED25519_SIG_LEN])
{
    size_t pre = sizeof SIGN_PREFIX - 1;
    char *msg = malloc(pre + len);
    if (!msg)
        return CM_ENOMEM;
    memcpy(msg, SIGN_PREFIX, pre);
    memcpy(msg + pre, payload, len);
    int rc = cm_ed25519_sign(key, msg, pre + len, sig);
    free(msg);
    return rc;
}

static char *body_json(const char *pass, const char *payload, size_t len,
                       const uint8_t sig[CM_ED25519_SIG_LEN])
{
    char *p64 = malloc(cm_b64url_encoded_len(len) + 1);
    char s64[100];
    if (!p64)
        return NULL;
    cm_b64url_encode(payload, len, p64);
    cm_b64url_encode(sig, CM_ED25519_SIG_LEN, s64);
    json_t *o = json_pack("{s:s, s:s, s:s}", "pass", pass, "payload", p64, "sig", s64);
    free(p64);
    char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return out;
}

int peer_report_sign(const struct cm_ed25519 *key, const char *pass_token, const char *payload,
                     size_t len, char **out)
{
    uint8_t sig[CM_ED25519_SIG_LEN];
    *out = NULL;
    int rc = sign_payload(key, payload, len, sig);
    if (rc != CM_OK)
        return rc;
    *out = body_json(pass_token, payload, len, sig);
    return *out ? CM_OK : CM_ENOMEM;
}

/* --- the reporter ------------------------------------------------------------ */

struct pending {
    char *payload;
    size_t len;
    int64_t step;
    uint8_t sig[CM_ED25519_SIG_LEN];
    int64_t deadline_ms;
};

struct peer_reporter {
    char *url; /* https://host:port/api/v1/runs/<run>/reports */
    char *ca_cert;
    char run[CM_NAME_MAX + 1];
    const struct cm_ed25519 *key;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *token;
    struct pending q[PEER_REPORT_QUEUE_MAX];
    size_t head, count;
    int stopping;
    int64_t flush_deadline_ms;
    struct peer_reporter_stats st;
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void deadline_ts(int64_t ms_from_now, struct timespec *ts)
{
    *ts = cm_time_after_ms(CLOCK_MONOTONIC, ms_from_now);
}

struct answer_buf {
    char buf[512];
    size_t len;
};

/* Keeps the first bytes of the answer (the error message) for the log. */
static size_t keep_answer(void *p, size_t sz, size_t n, void *ud)
{
    struct answer_buf *b = ud;
    size_t k = sz * n, room = sizeof b->buf - 1 - b->len;
    size_t c = k < room ? k : room;
    memcpy(b->buf + b->len, p, c);
    b->len += c;
    b->buf[b->len] = '\0';
    return k;
}

/* One POST; returns the HTTP status, or 0 when no answer came. */
static long post_once(struct peer_reporter *r, CURL *h, const char *body, long timeout_ms,
                      char *answer, size_t cap)
{
    struct answer_buf b = {{0}, 0};
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, r->url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep_answer);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 10000 ? timeout_ms : 10000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https,http");
    if (r->ca_cert)
        curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_cert);
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(answer, cap, "%s", curl_easy_strerror(rc));
    if (status)
        snprintf(answer, cap, "%s", b.buf);
    curl_slist_free_all(hl);
    return status;
}

static void *reporter_main(void *arg)
{
    struct peer_reporter *r = arg;
    CURL *h = curl_easy_init();
    int64_t backoff = 0, next_try = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        int64_t now = now_ms();
        if (r->stopping && (r->count == 0 || now >= r->flush_deadline_ms))
            break;
        if (r->count == 0 || now < next_try) {
            int64_t wait = r->count == 0 ? 1000 : next_try - now;
            if (r->stopping && r->flush_deadline_ms - now < wait)
                wait = r->flush_deadline_ms - now;
            struct timespec ts;
            deadline_ts(wait > 0 ? wait : 1, &ts);
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            continue;
        }
        struct pending *p = &r->q[r->head];
        if (now >= p->deadline_ms || !h) {
            CM_LOGW("report", "giving up on the report of step %lld (deadline passed)",
                    (long long)p->step);
            r->st.dropped++;
            free(p->payload);
            r->head = (r->head + 1) % PEER_REPORT_QUEUE_MAX;
            r->count--;
            continue;
        }
        char *body = body_json(r->token, p->payload, p->len, p->sig);
        int64_t step = p->step;
        int64_t limit = p->deadline_ms - now;
        if (r->stopping && r->flush_deadline_ms - now < limit)
            limit = r->flush_deadline_ms - now;
        if (limit > 15000)
            limit = 15000;
        pthread_mutex_unlock(&r->mu);
        char answer[512] = "";
        long status = body ? post_once(r, h, body, limit > 1 ? (long)limit : 1L, answer,
                                       sizeof answer)
                           : 0;
        free(body);
        pthread_mutex_lock(&r->mu);
        int retry = status == 0 || status == 408 || status == 429 || status >= 500;
        if (retry) {
            r->st.retries++;
            backoff = backoff ? backoff * 2 : 500;
            if (backoff > 30000)
                backoff = 30000;
            next_try = now_ms() + backoff;
            CM_LOGD("report", "step %lld: %s%ld %s; retrying in %lld ms", (long long)step,
                    status ? "HTTP " : "", status, answer, (long long)backoff);
            continue;
        }
        backoff = 0;
        if (status == 200 || status == 201) {
            r->st.sent++;
        } else {
            r->st.refused++;
            CM_LOGW("report", "the coordinator refused the report of step %lld: HTTP %ld %s",
                    (long long)step, status, answer);
        }
        /* The head is still the report just sent: submit only appends, and a full queue
         * drops from the head only while nothing is in flight (see submit). */
        free(r->q[r->head].payload);
        r->head = (r->head + 1) % PEER_REPORT_QUEUE_MAX;
        r->count--;
    }
    pthread_mutex_unlock(&r->mu);
    curl_easy_cleanup(h);
    return NULL;
}

int peer_reporter_start(const char *url, const char *ca_cert, const char *run,
                        const struct cm_ed25519 *key, const char *pass_token,
                        struct peer_reporter **out)
{
    *out = NULL;
    if (!url || !run || !cm_name_valid(run) || !key || !key->has_private || !pass_token)
        return CM_EINVAL;
    struct peer_reporter *r = calloc(1, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    size_t n = strlen(url) + strlen(run) + 64;
    r->url = malloc(n);
    r->ca_cert = ca_cert ? strdup(ca_cert) : NULL;
    r->token = strdup(pass_token);
    if (!r->url || (ca_cert && !r->ca_cert) || !r->token)
        goto fail;
    size_t ul = strlen(url);
    while (ul && url[ul - 1] == '/')
        ul--;
    snprintf(r->url, n, "%.*s/api/v1/runs/%s/reports", (int)ul, url, run);
    snprintf(r->run, sizeof r->run, "%s", run);
    r->key = key;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &a);
    pthread_condattr_destroy(&a);
    if (pthread_create(&r->thread, NULL, reporter_main, r) != 0) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        goto fail;
    }
    *out = r;
    return CM_OK;
fail:
    free(r->url);
    free(r->ca_cert);
    free(r->token);
    free(r);
    return CM_ENOMEM;
}

int peer_reporter_set_token(struct peer_reporter *r, const char *pass_token)
{
    char *t = pass_token ? strdup(pass_token) : NULL;
    if (!t)
        return pass_token ? CM_ENOMEM : CM_EINVAL;
    pthread_mutex_lock(&r->mu);
    free(r->token);
    r->token = t;
    pthread_mutex_unlock(&r->mu);
    return CM_OK;
}

int peer_reporter_submit(struct peer_reporter *r, const struct peer_report *rep)
{
    char *buf = malloc(PEER_REPORT_PAYLOAD_MAX + 1);
    if (!buf)
        return CM_ENOMEM;
    size_t len = 0;
    int rc = peer_report_encode(rep, r->run, r->key->pub, (int64_t)time(NULL), buf,
                                PEER_REPORT_PAYLOAD_MAX + 1, &len);
    struct pending p = {buf, len, rep->step, {0}, now_ms() + PEER_REPORT_DEADLINE_MS};
    if (rc == CM_OK)
        rc = sign_payload(r->key, buf, len, p.sig);
    if (rc != CM_OK) {
        CM_LOGW("report", "not reporting step %lld: %s", (long long)rep->step, cm_strerror(rc));
        free(buf);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    if (r->count == PEER_REPORT_QUEUE_MAX) {
        /* Drop the oldest queued report that is not being sent: index 1 when the head
         * may be in flight. */
        size_t victim = (r->head + 1) % PEER_REPORT_QUEUE_MAX;
        CM_LOGW("report", "report queue full: dropping the report of step %lld",
                (long long)r->q[victim].step);
        free(r->q[victim].payload);
        for (size_t i = 1; i + 1 < r->count; i++)
            r->q[(r->head + i) % PEER_REPORT_QUEUE_MAX] = r->q[(r->head + i + 1) % PEER_REPORT_QUEUE_MAX];
        r->count--;
        r->st.dropped++;
    }
    r->q[(r->head + r->count) % PEER_REPORT_QUEUE_MAX] = p;
    r->count++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return CM_OK;
}

void peer_reporter_stats(struct peer_reporter *r, struct peer_reporter_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

size_t peer_reporter_stop(struct peer_reporter *r, int flush_ms)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    r->flush_deadline_ms = now_ms() + (flush_ms > 0 ? flush_ms : 0);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    size_t left = r->count;
    for (size_t i = 0; i < r->count; i++)
        free(r->q[(r->head + i) % PEER_REPORT_QUEUE_MAX].payload);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r->url);
    free(r->ca_cert);
    free(r->token);
    free(r);
    return left;
}
