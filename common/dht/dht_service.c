/* A DHT node in its own thread with its own libuv loop (see dht_node.h,
 * "threaded API"): the agent runs one, and `crowdtrain-coordinator serve`
 * runs the backbone node of a run with it. Other threads talk to the node
 * through jobs queued under a mutex and an uv_async_t that wakes the loop;
 * each blocking call waits on a condition variable with its deadline. A job
 * is reference-counted so a caller that gives up at its deadline and the
 * loop that finishes the job later never free it twice. */
#include "dht/dht_node_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"

enum job_type { J_PUT, J_GET, J_BOOT, J_STATS, J_PING };

struct dht__job {
    struct dht__job *next;
    enum job_type type;
    int refs, done, rc;
    uint8_t *key, *subkey, *value;
    size_t klen, sklen, vlen;
    unsigned get_flags; /* J_GET: dht_get_async_ex's flags */
    int64_t expires_ms;
    struct sockaddr_storage *addrs;
    size_t naddrs;
    struct dht_result res;
    struct dht_node_stats st;
    struct p2p_stats net;
    /* J_PING */
    uint8_t pub[32];
    uint32_t ping_timeout_ms;
    int *ping_status;
    uint32_t *ping_ms;
    size_t ping_pending;
    int64_t ping_t0;
    struct dht_node *n;
};

static void job_unref(struct dht__job *j)
{
    if (--j->refs)
        return;
    free(j->key);
    free(j->subkey);
    free(j->value);
    free(j->addrs);
    free(j->ping_status);
    free(j->ping_ms);
    dht_result_cleanup(&j->res);
    free(j);
}

void dht_result_cleanup(struct dht_result *res)
{
    for (size_t i = 0; i < res->nrec; i++)
        dht_record_cleanup(&res->rec[i]);
    free(res->rec);
    free(res->closest);
    memset(res, 0, sizeof *res);
}

/* Deep copy of a callback's result, so it outlives the callback. */
static void result_copy(struct dht_result *dst, const struct dht_result *src)
{
    *dst = *src;
    dst->rec = NULL;
    dst->nrec = 0;
    dst->closest = NULL;
    dst->nclosest = 0;
    if (src->nrec && (dst->rec = calloc(src->nrec, sizeof *dst->rec)))
        for (size_t i = 0; i < src->nrec; i++)
            if (dht_record_copy(&dst->rec[dst->nrec], &src->rec[i]) == CM_OK)
                dst->nrec++;
    if (src->nclosest && (dst->closest = malloc(src->nclosest * sizeof *dst->closest))) {
        memcpy(dst->closest, src->closest, src->nclosest * sizeof *dst->closest);
        dst->nclosest = src->nclosest;
    }
}

static void job_finish(struct dht_node *n, struct dht__job *j, int rc)
{
    pthread_mutex_lock(&n->mu);
    j->rc = rc;
    j->done = 1;
    pthread_cond_broadcast(&n->cv);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
}

struct job_ctx {
    struct dht_node *n;
    struct dht__job *j;
};

static void job_cb(void *arg, const struct dht_result *res)
{
    struct job_ctx *c = arg;
    result_copy(&c->j->res, res);
    job_finish(c->n, c->j, res->status);
    free(c);
}

/* One dial-back ping of a J_PING job answered (or failed). */
struct ping_ctx {
    struct dht__job *j;
    size_t i;
};

static void ping_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                      size_t len)
{
    struct ping_ctx *c = arg;
    struct dht__job *j = c->j;
    (void)from, (void)body, (void)len;
    j->ping_status[c->i] = status;
    j->ping_ms[c->i] = (uint32_t)(p2p_now_ms() - j->ping_t0);
    free(c);
    if (--j->ping_pending == 0)
        job_finish(j->n, j, CM_OK);
}

static void run_ping(struct dht_node *n, struct dht__job *j)
{
    j->n = n;
    j->ping_t0 = p2p_now_ms();
    j->ping_pending = 1; /* held until every request is sent */
    for (size_t i = 0; i < j->naddrs; i++) {
        struct ping_ctx *c = malloc(sizeof *c);
        j->ping_status[i] = CM_ENOMEM;
        if (!c)
            continue;
        c->j = j;
        c->i = i;
        j->ping_pending++;
        int rc = p2p_request(n->host, (struct sockaddr *)&j->addrs[i], j->pub, P2P_MSG_PING, NULL, 0,
                             j->ping_timeout_ms, ping_done, c);
        if (rc) {
            j->ping_pending--;
            j->ping_status[i] = rc;
            free(c);
        }
    }
    if (--j->ping_pending == 0)
        job_finish(n, j, CM_OK);
}

static void run_job(struct dht_node *n, struct dht__job *j)
{
    if (n->stopping || n->closing) {
        job_finish(n, j, CM_ECLOSED);
        return;
    }
    if (j->type == J_STATS) {
        dht_node_get_stats(n, &j->st);
        p2p_ctx_stats(n->ctx, &j->net);
        job_finish(n, j, CM_OK);
        return;
    }
    if (j->type == J_PING) {
        run_ping(n, j);
        return;
    }
    struct job_ctx *c = malloc(sizeof *c);
    if (!c) {
        job_finish(n, j, CM_ENOMEM);
        return;
    }
    c->n = n;
    c->j = j;
    int rc;
    switch (j->type) {
    case J_PUT:
        rc = dht_put_async(n, j->key, j->klen, j->subkey, j->sklen, j->value, j->vlen,
                           j->expires_ms, job_cb, c);
        break;
    case J_GET:
        rc = dht_get_async_ex(n, j->key, j->klen, j->get_flags, job_cb, c);
        break;
    default:
        rc = dht_bootstrap_async(n, j->addrs, j->naddrs, job_cb, c);
        break;
    }
    if (rc) {
        free(c);
        job_finish(n, j, rc);
    }
}

static void async_closed(uv_handle_t *h)
{
    (void)h;
}

static void async_cb(uv_async_t *a)
{
    struct dht_node *n = a->data;
    pthread_mutex_lock(&n->mu);
    struct dht__job *list = n->jobs;
    n->jobs = NULL;
    int stopping = n->stopping;
    pthread_mutex_unlock(&n->mu);
    /* jobs were pushed at the head: run them oldest first */
    struct dht__job *rev = NULL;
    while (list) {
        struct dht__job *x = list->next;
        list->next = rev;
        rev = list;
        list = x;
    }
    while (rev) {
        struct dht__job *x = rev->next;
        run_job(n, rev);
        rev = x;
    }
    if (stopping && !n->closing) {
        struct p2p_ctx *ctx = n->ctx;
        dht_node_free(n); /* pending jobs complete with CM_ECLOSED */
        p2p_ctx_free(ctx);
        uv_close((uv_handle_t *)&n->async, async_closed);
    }
}

struct start {
    const struct dht_config *cfg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, rc;
    struct dht_node *node;
    uv_loop_t *loop;
};

static void *thread_main(void *arg)
{
    struct start *s = arg;
    uv_loop_t *loop = s->loop;
    struct p2p_ctx_config cc = s->cfg->ctx;
    cc.loop = loop;
    struct p2p_ctx *ctx = NULL;
    struct dht_node *n = NULL;
    int rc = p2p_ctx_new(&cc, &ctx);
    if (!rc)
        rc = dht_node_new(ctx, s->cfg, &n);
    if (!rc) {
        n->threaded = 1;
        pthread_mutex_init(&n->mu, NULL);
        pthread_cond_init(&n->cv, NULL);
        uv_async_init(loop, &n->async, async_cb);
        n->async.data = n;
    } else if (ctx) {
        p2p_ctx_free(ctx);
        uv_run(loop, UV_RUN_DEFAULT);
    }
    pthread_mutex_lock(&s->mu);
    s->rc = rc;
    s->node = n;
    s->ready = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return NULL;
    uv_run(loop, UV_RUN_DEFAULT);
    return NULL;
}

static int parse_addrs(const char *const *in, size_t n, struct sockaddr_storage **out)
{
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out)
        return CM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = p2p_addr_parse(in[i], &(*out)[i]);
        if (rc) {
            CM_LOGE("dht", "bad bootstrap address '%s'", in[i]);
            free(*out);
            *out = NULL;
            return rc;
        }
    }
    return CM_OK;
}

static int submit(struct dht_node *n, struct dht__job *j, uint32_t deadline_ms)
{
    if (!n->threaded) {
        j->refs = 1;
        job_unref(j);
        return CM_ESTATE;
    }
    j->refs = 2;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)deadline_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
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
    pthread_mutex_lock(&n->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&n->cv, &n->mu, &ts) == ETIMEDOUT)
            break;
    int rc = j->done ? j->rc : CM_ETIMEOUT;
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static void release(struct dht_node *n, struct dht__job *j)
{
    pthread_mutex_lock(&n->mu);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
}

int dht_node_start(const struct dht_config *cfg, struct dht_node **out)
{
    struct start s = {.cfg = cfg};
    uv_loop_t *loop = malloc(sizeof *loop);
    if (!loop)
        return CM_ENOMEM;
    if (uv_loop_init(loop)) {
        free(loop);
        return CM_EIO;
    }
    s.loop = loop;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, thread_main, &s)) {
        uv_loop_close(loop);
        free(loop);
        return CM_EIO;
    }
    pthread_mutex_lock(&s.mu);
    while (!s.ready)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    if (s.rc) {
        pthread_join(th, NULL);
        uv_loop_close(loop);
        free(loop);
        return s.rc;
    }
    struct dht_node *n = s.node;
    n->thread = th;
    n->uvloop = loop;
    *out = n;
    if (cfg->n_bootstrap) {
        int rc = dht_bootstrap(n, cfg->bootstrap, cfg->n_bootstrap, 30000);
        if (rc)
            CM_LOGW("dht", "bootstrap: %s (others may still join through us)", cm_strerror(rc));
    }
    return CM_OK;
}

void dht_node_stop(struct dht_node *n)
{
    if (!n || !n->threaded)
        return;
    pthread_mutex_lock(&n->mu);
    n->stopping = 1;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->async);
    pthread_join(n->thread, NULL);
    /* Jobs a caller abandoned at its deadline and that never ran. */
    for (struct dht__job *j = n->jobs, *x; j; j = x) {
        x = j->next;
        job_unref(j);
    }
    uv_loop_close(n->uvloop);
    free(n->uvloop);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

int dht_put(struct dht_node *n, const void *key, size_t klen, const void *subkey, size_t sklen,
            const void *value, size_t vlen, int64_t expires_ms, uint32_t deadline_ms, int *stored)
{
    if (!key || !klen || (sklen && !subkey) || (vlen && !value))
        return CM_EINVAL;
    struct dht__job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->type = J_PUT;
    j->key = dup_bytes(key, klen);
    j->subkey = dup_bytes(subkey, sklen);
    j->value = dup_bytes(value, vlen);
    j->klen = klen;
    j->sklen = sklen;
    j->vlen = vlen;
    j->expires_ms = expires_ms;
    if (!j->key || !j->subkey || !j->value) {
        j->refs = 1;
        job_unref(j);
        return CM_ENOMEM;
    }
    int rc = submit(n, j, deadline_ms);
    if (rc == CM_ESTATE || rc == CM_ECLOSED)
        return rc;
    pthread_mutex_lock(&n->mu);
    if (stored)
        *stored = j->done ? j->res.stored : 0;
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int dht_get(struct dht_node *n, const void *key, size_t klen, uint32_t deadline_ms,
            struct dht_result *res)
{
    return dht_get_ex(n, key, klen, 0, deadline_ms, res);
}

int dht_get_ex(struct dht_node *n, const void *key, size_t klen, unsigned flags, uint32_t deadline_ms,
               struct dht_result *res)
{
    memset(res, 0, sizeof *res);
    if (!key || !klen || (flags & ~(unsigned)DHT_GET_GRACE))
        return CM_EINVAL;
    struct dht__job *j = calloc(1, sizeof *j);
    if (!j || !(j->key = dup_bytes(key, klen))) {
        free(j);
        return CM_ENOMEM;
    }
    j->type = J_GET;
    j->klen = klen;
    j->get_flags = flags;
    int rc = submit(n, j, deadline_ms);
    if (rc == CM_ESTATE || rc == CM_ECLOSED)
        return rc;
    pthread_mutex_lock(&n->mu);
    if (j->done && rc == CM_OK) { /* hand the records over (only then: see dht_node.h) */
        *res = j->res;
        memset(&j->res, 0, sizeof j->res);
    }
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int dht_bootstrap(struct dht_node *n, const char *const *addrs, size_t naddrs,
                  uint32_t deadline_ms)
{
    if (!naddrs)
        return CM_EINVAL;
    struct dht__job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    int rc = parse_addrs(addrs, naddrs, &j->addrs);
    if (rc) {
        free(j);
        return rc;
    }
    j->type = J_BOOT;
    j->naddrs = naddrs;
    rc = submit(n, j, deadline_ms);
    if (rc == CM_ESTATE || rc == CM_ECLOSED)
        return rc;
    release(n, j);
    return rc;
}

int dht_stats(struct dht_node *n, struct dht_node_stats *out, struct p2p_stats *net)
{
    struct dht__job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->type = J_STATS;
    int rc = submit(n, j, 5000);
    if (rc == CM_ESTATE || rc == CM_ECLOSED)
        return rc;
    pthread_mutex_lock(&n->mu);
    if (rc == CM_OK) {
        if (out)
            *out = j->st;
        if (net)
            *net = j->net;
    }
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int dht_ping(struct dht_node *n, const struct sockaddr_storage *addrs, size_t naddrs,
             const uint8_t pub[32], uint32_t timeout_ms, int *status, uint32_t *ms)
{
    if (!naddrs || !pub)
        return CM_EINVAL;
    struct dht__job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->addrs = malloc(naddrs * sizeof *addrs);
    j->ping_status = calloc(naddrs, sizeof *j->ping_status);
    j->ping_ms = calloc(naddrs, sizeof *j->ping_ms);
    if (!j->addrs || !j->ping_status || !j->ping_ms) {
        j->refs = 1;
        job_unref(j);
        return CM_ENOMEM;
    }
    memcpy(j->addrs, addrs, naddrs * sizeof *addrs);
    j->naddrs = naddrs;
    memcpy(j->pub, pub, 32);
    j->ping_timeout_ms = timeout_ms;
    j->type = J_PING;
    /* the requests carry their own deadline; the wait adds a margin for the loop */
    int rc = submit(n, j, timeout_ms + 2000);
    if (rc == CM_ESTATE || rc == CM_ECLOSED)
        return rc;
    pthread_mutex_lock(&n->mu);
    if (rc == CM_OK)
        for (size_t i = 0; i < naddrs; i++) {
            status[i] = j->ping_status[i];
            if (ms)
                ms[i] = j->ping_ms[i];
        }
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

struct p2p_ctx *dht_node_ctx(struct dht_node *n)
{
    return n->ctx;
}
