/* The agent's network thread (see net.h). Jobs are queued under a mutex
 * and run on the loop; each completes exactly once (from the operation's
 * callback) and wakes its waiter. A job is reference-counted between the
 * waiter and the loop, so neither frees it under the other. */
#include "agent/join/net.h"
#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_node.h"
#include "p2p/p2p_transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define JOB_GRACE_MS 120000 /* an upper bound no operation reaches: they have their own deadlines */

enum job_kind { JOB_PUT, JOB_GET, JOB_ROUND, JOB_BOOT, JOB_TOKEN };

struct job {
    struct job *next;
    enum job_kind kind;
    int refs, done, rc;
    char key[256];
    uint8_t *value;
    size_t len;
    int64_t expires_ms;
    struct sockaddr_storage *addrs;
    size_t naddrs;
    struct join_record *recs;
    size_t nrecs;
    struct ar_round_config round;
    struct join_round_summary sum;
    struct join_net *net;
};

struct join_net {
    uv_loop_t loop;
    uv_async_t async;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *jobs;
    int stopping, ready, start_rc;
    struct p2p_ctx *ctx;
    struct dht_node *dht;
    struct ar_engine *ar;
    uint16_t ar_port;
    const struct join_net_config *cfg; /* during start only */
};

void join_records_free(struct join_record *r, size_t n)
{
    for (size_t i = 0; r && i < n; i++)
        free(r[i].value);
    free(r);
}

static void job_unref(struct job *j)
{
    if (--j->refs)
        return;
    free(j->value);
    free(j->addrs);
    join_records_free(j->recs, j->nrecs);
    free(j);
}

static void finish(struct job *j, int rc)
{
    struct join_net *n = j->net;
    pthread_mutex_lock(&n->mu);
    j->rc = rc;
    j->done = 1;
    pthread_cond_broadcast(&n->cv);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
}

static void dht_done(void *arg, const struct dht_result *res)
{
    struct job *j = arg;
    if (j->kind == JOB_GET && res->status == CM_OK && res->nrec) {
        j->recs = calloc(res->nrec, sizeof *j->recs);
        for (size_t i = 0; j->recs && i < res->nrec; i++) {
            const struct dht_record *r = &res->rec[i];
            struct join_record *o = &j->recs[j->nrecs];
            o->value = malloc(r->value_len ? r->value_len : 1);
            if (!o->value)
                break;
            memcpy(o->value, r->value, r->value_len);
            o->len = r->value_len;
            memcpy(o->author, r->author, CM_ED25519_PUB_LEN);
            j->nrecs++;
        }
    }
    finish(j, res->status);
}

static void round_done(void *arg, const struct ar_result *res)
{
    struct job *j = arg;
    struct join_round_summary *s = &j->sum;
    s->status = res->status;
    s->n_parts = res->n_parts;
    s->n_averaged = res->n_averaged;
    s->weight = -1;
    for (size_t i = 0; i < res->n_parts; i++)
        if (res->parts[i].averaged && (s->weight < 0 || res->parts[i].weight < s->weight))
            s->weight = res->parts[i].weight;
    if (s->weight < 0)
        s->weight = 0;
    for (size_t i = 0; i < res->n_excluded && s->n_excluded < AR_MAX_MEMBERS; i++) {
        s->excluded[s->n_excluded] = res->excluded[i].member;
        s->excluded_reason[s->n_excluded++] = res->excluded[i].reason;
    }
    s->ms_total = res->ms_total;
    s->bytes_sent = res->bytes_sent;
    s->bytes_received = res->bytes_received;
    finish(j, res->status);
}

static void run_job(struct join_net *n, struct job *j)
{
    int rc;
    if (n->stopping) {
        finish(j, CM_ECLOSED);
        return;
    }
    switch (j->kind) {
    case JOB_PUT:
        rc = dht_put_async(n->dht, j->key, strlen(j->key), "p", 1, j->value, j->len, j->expires_ms,
                           dht_done, j);
        break;
    case JOB_GET:
        rc = dht_get_async(n->dht, j->key, strlen(j->key), dht_done, j);
        break;
    case JOB_BOOT:
        rc = dht_bootstrap_async(n->dht, j->addrs, j->naddrs, dht_done, j);
        break;
    case JOB_TOKEN:
        rc = p2p_host_set_token(dht_node_host(n->dht), (const char *)j->value);
        if (!rc)
            rc = ar_engine_set_token(n->ar, (const char *)j->value);
        finish(j, rc);
        return;
    default:
        j->round.done = round_done;
        j->round.arg = j;
        rc = ar_round_start(n->ar, &j->round, NULL);
        break;
    }
    if (rc)
        finish(j, rc);
}

static void on_close(uv_handle_t *h)
{
    (void)h;
}

static void on_async(uv_async_t *a)
{
    struct join_net *n = a->data;
    pthread_mutex_lock(&n->mu);
    struct job *list = n->jobs;
    n->jobs = NULL;
    int stopping = n->stopping;
    pthread_mutex_unlock(&n->mu);
    struct job *rev = NULL;
    while (list) {
        struct job *x = list->next;
        list->next = rev;
        rev = list;
        list = x;
    }
    while (rev) {
        struct job *x = rev->next;
        run_job(n, rev);
        rev = x;
    }
    if (stopping && n->ctx) {
        if (n->ar)
            ar_engine_free(n->ar);
        if (n->dht)
            dht_node_free(n->dht);
        p2p_ctx_free(n->ctx);
        n->ar = NULL;
        n->dht = NULL;
        n->ctx = NULL;
        uv_close((uv_handle_t *)&n->async, on_close);
    }
}

static void *thread_main(void *arg)
{
    struct join_net *n = arg;
    const struct join_net_config *c = n->cfg;
    struct p2p_ctx_config cc = {0};
    cc.loop = &n->loop;
    cc.max_upload_mbps = c->max_upload_mbps;
    cc.max_download_mbps = c->max_download_mbps;
    cc.auth.run = c->run;
    cc.auth.coord_keys = c->coord_keys;
    cc.auth.n_coord_keys = c->n_coord_keys;
    int rc = p2p_ctx_new(&cc, &n->ctx);
    if (!rc) {
        struct dht_config dc = {0};
        dc.key = c->key;
        dc.token = c->token;
        dc.listen_ip = c->listen_ip;
        dc.listen_port = c->dht_port;
        rc = dht_node_new(n->ctx, &dc, &n->dht);
    }
    if (!rc) {
        struct ar_engine_config ac = {0};
        ac.ctx = n->ctx;
        ac.key = c->key;
        ac.token = c->token;
        ac.listen_ip = c->listen_ip;
        ac.listen_port = c->ar_port;
        rc = ar_engine_new(&ac, &n->ar);
        if (!rc)
            n->ar_port = ar_engine_port(n->ar);
    }
    if (!rc) {
        uv_async_init(&n->loop, &n->async, on_async);
        n->async.data = n;
    } else {
        if (n->ar)
            ar_engine_free(n->ar);
        if (n->dht)
            dht_node_free(n->dht);
        if (n->ctx)
            p2p_ctx_free(n->ctx);
        n->ar = NULL;
        n->dht = NULL;
        n->ctx = NULL;
    }
    pthread_mutex_lock(&n->mu);
    n->start_rc = rc;
    n->ready = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    uv_run(&n->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int submit(struct join_net *n, struct job *j)
{
    j->net = n;
    j->refs = 2;
    pthread_mutex_lock(&n->mu);
    if (n->stopping) {
        pthread_mutex_unlock(&n->mu);
        j->refs = 1;
        job_unref(j);
        return CM_ECLOSED;
    }
    j->next = n->jobs;
    n->jobs = j;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->async);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += JOB_GRACE_MS / 1000;
    pthread_mutex_lock(&n->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&n->cv, &n->mu, &ts) == ETIMEDOUT)
            break;
    int rc = j->done ? j->rc : CM_ETIMEOUT;
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static void release(struct join_net *n, struct job *j)
{
    pthread_mutex_lock(&n->mu);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
}

int join_net_start(const struct join_net_config *cfg, struct join_net **out)
{
    struct join_net *n = calloc(1, sizeof *n);
    if (!n)
        return CM_ENOMEM;
    if (uv_loop_init(&n->loop)) {
        free(n);
        return CM_EIO;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    n->cfg = cfg;
    if (pthread_create(&n->th, NULL, thread_main, n)) {
        uv_loop_close(&n->loop);
        free(n);
        return CM_EIO;
    }
    pthread_mutex_lock(&n->mu);
    while (!n->ready)
        pthread_cond_wait(&n->cv, &n->mu);
    pthread_mutex_unlock(&n->mu);
    n->cfg = NULL;
    if (n->start_rc) {
        int rc = n->start_rc;
        pthread_join(n->th, NULL);
        uv_loop_close(&n->loop);
        free(n);
        return rc;
    }
    if (cfg->n_bootstrap) {
        struct job *j = calloc(1, sizeof *j);
        if (!j) {
            join_net_stop(n);
            return CM_ENOMEM;
        }
        j->kind = JOB_BOOT;
        j->addrs = calloc(cfg->n_bootstrap, sizeof *j->addrs);
        for (size_t i = 0; j->addrs && i < cfg->n_bootstrap; i++)
            if (p2p_addr_parse(cfg->bootstrap[i], &j->addrs[j->naddrs]) == CM_OK)
                j->naddrs++;
            else
                CM_LOGW("join", "ignoring bad bootstrap address '%s'", cfg->bootstrap[i]);
        int rc = submit(n, j);
        release(n, j);
        if (rc != CM_OK)
            CM_LOGW("join", "DHT bootstrap: %s (continuing; peers may reach us)", cm_strerror(rc));
    }
    *out = n;
    return CM_OK;
}

void join_net_stop(struct join_net *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->stopping = 1;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->async);
    pthread_join(n->th, NULL);
    for (struct job *j = n->jobs, *x; j; j = x) {
        x = j->next;
        job_unref(j);
    }
    uv_loop_close(&n->loop);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

uint16_t join_net_ar_port(const struct join_net *n)
{
    return n->ar_port;
}

int join_net_put(struct join_net *n, const char *key, const void *value, size_t len, int64_t ttl_ms)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j || strlen(key) >= sizeof j->key || !(j->value = malloc(len ? len : 1))) {
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_PUT;
    snprintf(j->key, sizeof j->key, "%s", key);
    memcpy(j->value, value, len);
    j->len = len;
    j->expires_ms = p2p_now_ms() + ttl_ms;
    int rc = submit(n, j);
    release(n, j);
    return rc;
}

int join_net_get(struct join_net *n, const char *key, struct join_record **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    struct job *j = calloc(1, sizeof *j);
    if (!j || strlen(key) >= sizeof j->key) {
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_GET;
    snprintf(j->key, sizeof j->key, "%s", key);
    int rc = submit(n, j);
    pthread_mutex_lock(&n->mu);
    if (rc == CM_OK) {
        *out = j->recs;
        *count = j->nrecs;
        j->recs = NULL;
        j->nrecs = 0;
    }
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc == CM_ENOTFOUND ? CM_OK : rc;
}

int join_net_allreduce(struct join_net *n, struct ar_round_config *cfg, struct join_round_summary *out)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->kind = JOB_ROUND;
    j->round = *cfg;
    int rc = submit(n, j);
    pthread_mutex_lock(&n->mu);
    *out = j->sum;
    if (!j->done)
        out->status = rc;
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int join_net_set_token(struct join_net *n, const char *token)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j || !(j->value = (uint8_t *)strdup(token))) {
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_TOKEN;
    int rc = submit(n, j);
    release(n, j);
    return rc;
}

void join_net_set_revoked(struct join_net *n, const char *const *ids, size_t count, int64_t generated_at)
{
    if (n->ctx)
        p2p_auth_set_revoked(p2p_ctx_auth(n->ctx), ids, count, generated_at);
}
