/* The agent's network thread (see net.h). Jobs are queued under a mutex
 * and run on the loop; each completes exactly once (from the operation's
 * callback) and wakes its waiter. A job is reference-counted between the
 * waiter and the loop, so neither frees it under the other. */
#include "agent/peer/net.h"
#include "agent/peer/net_int.h"
#include "agent/peer/state_msg.h"
#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_node.h"
#include "p2p/p2p_probe.h"
#include "p2p/p2p_transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

void peer_records_free(struct peer_record *r, size_t n)
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
    free(j->resp);
    free(j->addrs);
    peer_records_free(j->recs, j->nrecs);
    free(j);
}

static void finish(struct job *j, int rc)
{
    struct peer_net *n = j->net;
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
            struct peer_record *o = &j->recs[j->nrecs];
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

static void req_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                     size_t len)
{
    struct job *j = arg;
    if (status == CM_OK && from && j->no_key)
        memcpy(j->peer_pub, from->pub, CM_ED25519_PUB_LEN);
    if (status == CM_OK && len && (j->resp = malloc(len)) != NULL) {
        memcpy(j->resp, body, len);
        j->resp_len = len;
    } else if (status == CM_OK && len) {
        status = CM_ENOMEM;
    }
    finish(j, status);
}

static void round_done(void *arg, const struct ar_result *res)
{
    struct job *j = arg;
    struct peer_round_summary *s = &j->sum;
    s->status = res->status;
    memcpy(s->round_id, res->round_id, sizeof s->round_id);
    s->averaged_mask = 0;
    for (size_t i = 0; i < res->n_parts && i < AR_MAX_MEMBERS; i++) {
        s->part_off[i] = res->parts[i].offset;
        s->part_len[i] = res->parts[i].len;
        s->part_owner[i] = res->parts[i].aggregator;
        s->part_status[i] = res->parts[i].status;
        if (res->parts[i].averaged)
            s->averaged_mask |= (uint64_t)1 << i;
    }
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

static void run_job(struct peer_net *n, struct job *j)
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
        if (!rc)
            rc = p2p_host_set_token(n->st_host, (const char *)j->value);
        finish(j, rc);
        return;
    case JOB_CALL:
        j->fn(j->fn_arg, n);
        finish(j, CM_OK);
        return;
    case JOB_REQ:
        rc = p2p_request(n->st_host, (const struct sockaddr *)j->addrs, j->no_key ? NULL : j->peer_pub, j->type,
                         j->value, j->len, j->timeout_ms, req_done, j);
        break;
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
    struct peer_net *n = a->data;
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
        if (n->st_host)
            p2p_host_close(n->st_host);
        n->st_host = NULL;
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

/* Request: min_step (8, big-endian) | offset (8) | max bytes (4).
 * Response: ready (1: 1 = snapshot below, 0 = preparing, ask again) |
 * step (8) | total length (8) | SHA-256 of the whole snapshot (32) | bytes. */
static int on_state_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                            const uint8_t *body, size_t len, uint8_t **resp, size_t *resp_len)
{
    struct peer_net *n = arg;
    if (type == PEER_MSG_PROBE) { /* read and dropped: the sender times it */
        if (len > PEER_PROBE_CHUNK)
            return CM_ETOOBIG;
        /* One prober at a time: two probes sharing our link would each read
           a part of it and report a bottleneck that is not there. */
        return p2p_probe_admit(&n->probe, from->pub, p2p_now_ms());
    }
    struct peer_state_req q;
    if (type != PEER_MSG_STATE)
        return n->on_other ? n->on_other(n->on_other_arg, h, from, type, body, len, resp, resp_len)
                           : CM_EPROTO;
    int prc = peer_state_req_parse(body, len, &q);
    if (prc != CM_OK)
        return prc;
    int64_t min_step = q.min_step;
    uint64_t off = q.offset;
    uint32_t max = q.max_len;
    if (max > PEER_STATE_CHUNK)
        max = PEER_STATE_CHUNK;
    pthread_mutex_lock(&n->st_mu);
    int ready = n->st_bytes && n->st_step >= min_step;
    size_t take = 0;
    if (ready && off > n->st_len) {
        pthread_mutex_unlock(&n->st_mu);
        return CM_ERANGE;
    }
    if (ready)
        take = n->st_len - off < max ? n->st_len - off : max;
    else if (n->st_wanted < 0 || min_step < n->st_wanted)
        /* the oldest step asked for: a peer asking for a state far ahead
           (the one after the collaboration's next step, or a lie) must not
           keep those who asked for one we hold waiting */
        n->st_wanted = min_step;
    uint8_t *out = malloc(PEER_STATE_HDR_LEN + take);
    if (!out) {
        pthread_mutex_unlock(&n->st_mu);
        return CM_ENOMEM;
    }
    struct peer_state_resp hd = {0};
    hd.ready = ready;
    hd.step = n->st_step;
    hd.total = n->st_len;
    memcpy(hd.sha, n->st_sha, CM_SHA256_LEN);
    peer_state_resp_header(&hd, out);
    if (take)
        memcpy(out + PEER_STATE_HDR_LEN, n->st_bytes + off, take);
    pthread_mutex_unlock(&n->st_mu);
    *resp = out;
    *resp_len = PEER_STATE_HDR_LEN + take;
    return CM_OK;
}

static void *thread_main(void *arg)
{
    struct peer_net *n = arg;
    const struct peer_net_config *c = n->cfg;
    struct p2p_ctx_config cc = {0};
    cc.loop = &n->loop;
    cc.max_upload_mbps = c->max_upload_mbps;
    cc.max_download_mbps = c->max_download_mbps;
    cc.auth.run = c->run;
    cc.auth.coord_keys = c->coord_keys;
    cc.auth.n_coord_keys = c->n_coord_keys;
    cc.latency_rules = c->latency_rules;
    cc.n_latency_rules = c->n_latency_rules;
    int rc = p2p_ctx_new(&cc, &n->ctx);
    if (!rc && c->latency_ms)
        p2p_ctx_set_latency(n->ctx, c->latency_ms);
    if (!rc) {
        struct dht_config dc = {0};
        dc.key = c->key;
        dc.token = c->token;
        dc.listen_ip = c->listen_ip;
        dc.listen_port = c->dht_port;
        rc = dht_node_new(n->ctx, &dc, &n->dht);
        if (!rc && c->listen_ip)
            n->dht_port = dht_node_port(n->dht);
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
        struct p2p_host_config hc = {0};
        hc.key = c->key;
        hc.token = c->token;
        hc.listen_ip = c->listen_ip;
        hc.max_inbound = 64;
        hc.on_request = on_state_request;
        hc.arg = n;
        rc = p2p_host_new(n->ctx, &hc, &n->st_host);
        if (!rc)
            n->st_port = c->listen_ip ? p2p_host_port(n->st_host) : 0;
    }
    if (!rc) {
        uv_async_init(&n->loop, &n->async, on_async);
        n->async.data = n;
    } else {
        if (n->st_host)
            p2p_host_close(n->st_host);
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

/* Queues a job for the loop; CM_ECLOSED when stopping (the caller still
 * releases it). */
int net__enqueue(struct peer_net *n, struct job *j)
{
    j->net = n;
    j->refs = 2;
    pthread_mutex_lock(&n->mu);
    if (n->stopping) { /* the caller's reference is the only one: release() frees it */
        pthread_mutex_unlock(&n->mu);
        j->refs = 1;
        return CM_ECLOSED;
    }
    j->next = n->jobs;
    n->jobs = j;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->async);
    return CM_OK;
}

/* Waits for a queued job (bounded: its operation has its own deadline). */
int net__wait_job(struct peer_net *n, struct job *j)
{
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

static int submit(struct peer_net *n, struct job *j)
{
    int rc = net__enqueue(n, j);
    return rc ? rc : net__wait_job(n, j);
}

void net__release(struct peer_net *n, struct job *j)
{
    pthread_mutex_lock(&n->mu);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
}

int peer_net_start(const struct peer_net_config *cfg, struct peer_net **out)
{
    struct peer_net *n = calloc(1, sizeof *n);
    if (!n)
        return CM_ENOMEM;
    if (uv_loop_init(&n->loop)) {
        free(n);
        return CM_EIO;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    pthread_mutex_init(&n->st_mu, NULL);
    pthread_mutex_init(&n->relay_mu, NULL);
    n->relay_ar.net = n->relay_st.net = n;
    n->st_wanted = -1;
    n->cfg = cfg;
    n->on_other = cfg->on_other;
    n->on_other_arg = cfg->on_other_arg;
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
    if (cfg->n_bootstrap && peer_net_bootstrap(n, cfg->bootstrap, cfg->n_bootstrap) == CM_ENOMEM) {
        peer_net_stop(n);
        return CM_ENOMEM;
    }
    *out = n;
    return CM_OK;
}

int peer_net_bootstrap(struct peer_net *n, const char *const *addrs, size_t count)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->kind = JOB_BOOT;
    j->addrs = calloc(count ? count : 1, sizeof *j->addrs);
    for (size_t i = 0; j->addrs && i < count; i++)
        if (p2p_addr_parse(addrs[i], &j->addrs[j->naddrs]) == CM_OK)
            j->naddrs++;
        else
            CM_LOGW("join", "ignoring bad bootstrap address '%s'", addrs[i]);
    int rc = submit(n, j);
    net__release(n, j);
    if (rc != CM_OK)
        CM_LOGW("join", "DHT bootstrap: %s (continuing; peers may reach us)", cm_strerror(rc));
    return rc;
}

void peer_net_stop(struct peer_net *n)
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
    pthread_mutex_destroy(&n->st_mu);
    pthread_mutex_destroy(&n->relay_mu);
    free(n->st_bytes);
    free(n);
}

uint16_t peer_net_ar_port(const struct peer_net *n)
{
    return n->ar_port;
}

uint16_t peer_net_dht_port(const struct peer_net *n)
{
    return n->dht_port;
}

int peer_net_put(struct peer_net *n, const char *key, const void *value, size_t len, int64_t ttl_ms)
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
    net__release(n, j);
    return rc;
}

int peer_net_get(struct peer_net *n, const char *key, struct peer_record **out, size_t *count)
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

int peer_net_allreduce(struct peer_net *n, struct ar_round_config *cfg, struct peer_round_summary *out)
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

int peer_net_set_token(struct peer_net *n, const char *token)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j || !(j->value = (uint8_t *)strdup(token))) {
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_TOKEN;
    int rc = submit(n, j);
    net__release(n, j);
    return rc;
}

void peer_net_set_revoked(struct peer_net *n, const char *const *ids, size_t count, int64_t generated_at)
{
    if (n->ctx)
        p2p_auth_set_revoked(p2p_ctx_auth(n->ctx), ids, count, generated_at);
}

uint16_t peer_net_state_port(const struct peer_net *n)
{
    return n->st_port;
}

void peer_net_state_publish(struct peer_net *n, int64_t step, uint8_t *bytes, size_t len)
{
    uint8_t sha[CM_SHA256_LEN];
    cm_sha256(bytes, len, sha);
    pthread_mutex_lock(&n->st_mu);
    free(n->st_bytes);
    n->st_bytes = bytes;
    n->st_len = len;
    n->st_step = step;
    memcpy(n->st_sha, sha, sizeof sha);
    if (n->st_wanted <= step)
        n->st_wanted = -1;
    pthread_mutex_unlock(&n->st_mu);
}

int64_t peer_net_state_wanted(const struct peer_net *n)
{
    pthread_mutex_lock((pthread_mutex_t *)&n->st_mu);
    int64_t w = n->st_wanted;
    pthread_mutex_unlock((pthread_mutex_t *)&n->st_mu);
    return w;
}

/* One request on the state host, blocking; *resp is heap. */
int net__request(struct peer_net *n, const struct sockaddr_storage *addr, const uint8_t *pub,
                       uint32_t type, const uint8_t *body, size_t len, uint32_t timeout_ms,
                       uint8_t **resp, size_t *resp_len)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j || !(j->addrs = malloc(sizeof *j->addrs)) || !(j->value = malloc(len ? len : 1))) {
        if (j)
            free(j->addrs);
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_REQ;
    *j->addrs = *addr;
    memcpy(j->peer_pub, pub, CM_ED25519_PUB_LEN);
    j->type = type;
    j->timeout_ms = timeout_ms;
    if (len)
        memcpy(j->value, body, len);
    j->len = len;
    int rc = submit(n, j);
    pthread_mutex_lock(&n->mu);
    *resp = NULL;
    *resp_len = 0;
    if (rc == CM_OK) {
        *resp = j->resp;
        *resp_len = j->resp_len;
        j->resp = NULL;
    }
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int peer_net_key_of(struct peer_net *n, const char *addr, uint8_t pub[CM_ED25519_PUB_LEN])
{
    struct sockaddr_storage sa;
    if (p2p_addr_parse(addr, &sa) != CM_OK)
        return CM_EINVAL;
    struct job *j = calloc(1, sizeof *j);
    if (!j || !(j->addrs = malloc(sizeof *j->addrs)) || !(j->value = malloc(1))) {
        if (j)
            free(j->addrs);
        free(j);
        return CM_ENOMEM;
    }
    j->kind = JOB_REQ;
    j->no_key = 1;
    *j->addrs = sa;
    j->type = P2P_MSG_PING;
    j->timeout_ms = 5000;
    int rc = submit(n, j);
    pthread_mutex_lock(&n->mu);
    if (rc == CM_OK)
        memcpy(pub, j->peer_pub, CM_ED25519_PUB_LEN);
    job_unref(j);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static int state_request(struct peer_net *n, const struct sockaddr_storage *addr, const uint8_t *pub,
                         int64_t min_step, uint64_t off, uint8_t **resp, size_t *resp_len)
{
    uint8_t req[PEER_STATE_REQ_LEN];
    struct peer_state_req q = {min_step, off, PEER_STATE_CHUNK};
    peer_state_req_encode(&q, req);
    return net__request(n, addr, pub, PEER_MSG_STATE, req, sizeof req, 10000, resp, resp_len);
}

int peer_net_state_fetch(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN],
                         int64_t min_step, const char *dest, int64_t *step_out, uint32_t deadline_ms,
                         uint32_t ready_ms, int (*idle)(void *arg, int moving), void *arg)
{
    struct sockaddr_storage sa;
    if (p2p_addr_parse(addr, &sa) != CM_OK)
        return CM_EINVAL;
    char part[4200];
    if ((size_t)snprintf(part, sizeof part, "%s.part", dest) >= sizeof part)
        return CM_EINVAL;
    int64_t start = p2p_now_ms(), end = start + deadline_ms;
    uint8_t *buf = NULL, sha[CM_SHA256_LEN];
    size_t total = 0, got = 0;
    int64_t step = -1;
    int rc = CM_EBUSY;
    while (p2p_now_ms() < end) {
        uint8_t *r = NULL;
        size_t rl = 0;
        /* between chunks too: a state at a slow peer's rate takes long */
        if (idle && idle(arg, step >= 0)) {
            rc = CM_ECANCELED;
            break;
        }
        rc = state_request(n, &sa, pub, min_step, got, &r, &rl);
        if (rc != CM_OK)
            break;
        struct peer_state_resp sr;
        if (peer_state_resp_parse(r, rl, &sr) != CM_OK) {
            free(r);
            rc = CM_EPROTO;
            break;
        }
        if (!sr.ready) { /* preparing */
            free(r);
            rc = CM_EBUSY;
            if (ready_ms && p2p_now_ms() - start >= ready_ms)
                break;
            usleep(100000);
            continue;
        }
        int64_t rs = sr.step;
        uint64_t rt = sr.total;
        if (rs < min_step) {
            free(r);
            rc = CM_EPROTO;
            break;
        }
        if (step != rs || rt != total || memcmp(sha, sr.sha, CM_SHA256_LEN)) {
            /* a new snapshot (or the first): start over */
            free(buf);
            buf = malloc((size_t)rt);
            if (!buf) {
                free(r);
                rc = CM_ENOMEM;
                break;
            }
            step = rs;
            total = (size_t)rt;
            memcpy(sha, sr.sha, CM_SHA256_LEN);
            if (got != 0) {
                got = 0;
                free(r);
                continue;
            }
        }
        size_t take = sr.len;
        if (take > total - got || (take == 0 && got < total)) {
            free(r);
            rc = CM_EPROTO;
            break;
        }
        memcpy(buf + got, sr.data, take);
        got += take;
        free(r);
        if (got == total) {
            uint8_t h[CM_SHA256_LEN];
            cm_sha256(buf, total, h);
            rc = memcmp(h, sha, sizeof h) ? CM_EBADSIG : CM_OK;
            break;
        }
        rc = CM_ETIMEOUT;
    }
    if (rc == CM_OK) {
        FILE *f = fopen(part, "wb");
        rc = CM_EIO;
        if (f) {
            int ok = fwrite(buf, 1, total, f) == total;
            ok = fflush(f) == 0 && ok;
            ok = fsync(fileno(f)) == 0 && ok;
            ok = fclose(f) == 0 && ok;
            if (ok && rename(part, dest) == 0)
                rc = CM_OK;
            else
                unlink(part);
        }
        *step_out = step;
    }
    free(buf);
    return rc;
}

int peer_net_call(struct peer_net *n, void (*fn)(void *arg, struct peer_net *n), void *arg)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    j->kind = JOB_CALL;
    j->fn = fn;
    j->fn_arg = arg;
    int rc = submit(n, j);
    net__release(n, j);
    return rc;
}

struct rates {
    double up, down;
    int paced;
};

static void set_rates(void *arg, struct peer_net *n)
{
    const struct rates *r = arg;
    if (r->paced)
        p2p_ctx_set_pacing(n->ctx, r->up, r->down);
    else
        p2p_ctx_set_rates(n->ctx, r->up, r->down);
}

int peer_net_set_rates(struct peer_net *n, double up_mbps, double down_mbps)
{
    struct rates r = {up_mbps, down_mbps, 0};
    return peer_net_call(n, set_rates, &r);
}

int peer_net_set_pacing(struct peer_net *n, double up_mbps, double down_mbps)
{
    struct rates r = {up_mbps, down_mbps, 1};
    return peer_net_call(n, set_rates, &r);
}

struct dht_node *peer_net_dht(struct peer_net *n)
{
    return n->dht;
}

struct p2p_host *peer_net_host(struct peer_net *n)
{
    return n->st_host;
}
