/* The expert host core (moe_server.h): request checks and kept forward
 * inputs on the loop thread, batches computed on one worker thread, answers
 * sent back from the loop. Seed 002_2b00836ea4b30f79.txt §3.3 "Runtime":
 * the server batches requests of many trainers per expert and applies
 * updates asynchronously; Appendix D: backward recomputes the forward.
 *
 * Ownership: a job (one request) belongs to the loop thread until it is
 * queued, to the queue/worker (under mu) until it is on the done list, to
 * the loop again when the async callback takes it. The kept-inputs table
 * is touched by the loop thread only. */
#include "agent/moe/moe_server.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"
#include "cm_time.h"
#include "moe/moe_batch.h"
#include "moe/moe_msg.h"

#define SAVED_BUCKETS 1024

struct expert {
    char uid[MOE_UID_MAX + 1];
    int C, F;
    struct kern_expert *e;
    struct kern_optim *opt;
};

struct job {
    struct job *next;           /* done list */
    int kind;                   /* MOE_MSG_FORWARD or MOE_MSG_BACKWARD */
    struct expert *x;
    uint32_t n;
    float *in;                  /* (n,C) inputs: the message's (forward) or the kept ones */
    float *dy;                  /* (n,C) dL/dy (backward) */
    float *out;                 /* (n,C) y or dL/dx */
    int status;
    struct p2p_deferred *reply;
    uint8_t peer[CM_ED25519_PUB_LEN];
    uint64_t fid;
};

/* Inputs of a forward kept for its backward (loop thread only). */
struct saved {
    struct saved *older, *newer; /* age list */
    struct saved *bnext;         /* hash bucket */
    uint8_t peer[CM_ED25519_PUB_LEN];
    uint64_t fid;
    struct expert *x;
    uint32_t n;
    float *in;
    int64_t born_ms;
};

/* An answer held back by the latency emulation (loop thread only). */
struct delayed {
    uv_timer_t timer;
    struct moe_server *s;
    struct job *j;
    struct delayed *prev, *next;
};

struct moe_server {
    struct moe_server_config cfg;
    uv_loop_t *loop;
    uv_async_t async;
    struct expert **experts;     /* stable pointers: jobs and kept inputs hold them */
    size_t n_experts;            /* written on the loop thread under xmu */
    /* Held by the worker while it computes a batch, and by whoever adds an
       expert or saves or loads one: a checkpoint sees the parameters and
       optimizer state between two batches, never in the middle of one. */
    pthread_mutex_t xmu;
    int started, stopped;
    uint64_t rng;

    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;                /* under mu */
    struct moe_batch_queue q;    /* under mu; tags are jobs */
    struct job *done_head, *done_tail; /* under mu */
    size_t inflight;             /* under mu: queued + computing + done not yet answered */
    struct moe_server_stats st;  /* under mu */

    struct delayed *delayed;     /* loop thread: answers waiting for their timer */

    struct saved *bucket[SAVED_BUCKETS];
    struct saved *oldest, *newest;
    size_t saved_bytes;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void moe_server_config_default(struct moe_server_config *c)
{
    memset(c, 0, sizeof *c);
    c->max_batch = 256;
    c->max_wait_ms = 5;
    c->max_inflight = 4096;
    c->queue_timeout_ms = 10000;
    c->max_saved_bytes = (size_t)256 << 20;
    c->saved_ttl_ms = 60000;
    kern_optim_config_default(&c->optim);
}

static void job_free(struct job *j)
{
    if (!j)
        return;
    free(j->in);
    free(j->dy);
    free(j->out);
    free(j);
}

/* ---- kept forward inputs (loop thread) ---------------------------------- */

static size_t saved_hash(const uint8_t *peer, uint64_t fid, const struct expert *x)
{
    uint64_t h = fid * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)x;
    for (int i = 0; i < 8; i++)
        h = (h ^ peer[i]) * 0x100000001b3ull;
    return (size_t)(h % SAVED_BUCKETS);
}

static void saved_remove(struct moe_server *s, struct saved *v)
{
    struct saved **pp = &s->bucket[saved_hash(v->peer, v->fid, v->x)];
    while (*pp != v)
        pp = &(*pp)->bnext;
    *pp = v->bnext;
    if (v->older)
        v->older->newer = v->newer;
    else
        s->oldest = v->newer;
    if (v->newer)
        v->newer->older = v->older;
    else
        s->newest = v->older;
    s->saved_bytes -= (size_t)v->n * v->x->C * sizeof(float);
    free(v->in);
    free(v);
    pthread_mutex_lock(&s->mu);
    s->st.saved_bytes = s->saved_bytes;
    pthread_mutex_unlock(&s->mu);
}

static void saved_sweep(struct moe_server *s, int64_t now)
{
    while (s->oldest && now - s->oldest->born_ms >= (int64_t)s->cfg.saved_ttl_ms)
        saved_remove(s, s->oldest);
}

static struct saved *saved_find(struct moe_server *s, const uint8_t *peer, uint64_t fid,
                                const struct expert *x)
{
    for (struct saved *v = s->bucket[saved_hash(peer, fid, x)]; v; v = v->bnext)
        if (v->fid == fid && v->x == x && !memcmp(v->peer, peer, CM_ED25519_PUB_LEN))
            return v;
    return NULL;
}

/* Keeps a computed forward's inputs (taking j->in); a forward with the
 * same key replaces the one kept; the oldest go beyond the memory bound. */
static void saved_put(struct moe_server *s, struct job *j)
{
    size_t bytes = (size_t)j->n * j->x->C * sizeof(float);
    if (bytes > s->cfg.max_saved_bytes)
        return;
    struct saved *old = saved_find(s, j->peer, j->fid, j->x);
    if (old)
        saved_remove(s, old);
    struct saved *v = calloc(1, sizeof *v);
    if (!v)
        return; /* its backward will get CM_ESTATE */
    while (s->oldest && s->saved_bytes + bytes > s->cfg.max_saved_bytes)
        saved_remove(s, s->oldest);
    memcpy(v->peer, j->peer, CM_ED25519_PUB_LEN);
    v->fid = j->fid;
    v->x = j->x;
    v->n = j->n;
    v->in = j->in;
    j->in = NULL;
    v->born_ms = mono_ms();
    size_t b = saved_hash(v->peer, v->fid, v->x);
    v->bnext = s->bucket[b];
    s->bucket[b] = v;
    v->older = s->newest;
    if (s->newest)
        s->newest->newer = v;
    else
        s->oldest = v;
    s->newest = v;
    s->saved_bytes += bytes;
    pthread_mutex_lock(&s->mu);
    s->st.saved_bytes = s->saved_bytes;
    pthread_mutex_unlock(&s->mu);
}

/* ---- answering (loop thread) -------------------------------------------- */

static void answer(struct moe_server *s, struct job *j)
{
    uint8_t hdr[MOE_RESULT_HDR_LEN];
    struct p2p_iov parts[2];
    size_t np = 0;
    if (j->status == CM_OK) {
        moe_result_header(j->n, (uint32_t)j->x->C, hdr);
        parts[0] = (struct p2p_iov){hdr, sizeof hdr};
        parts[1] = (struct p2p_iov){(const uint8_t *)j->out, (size_t)j->n * j->x->C * sizeof(float)};
        np = 2;
    }
    p2p_reply_finish(j->reply, j->status, parts, np);
    j->reply = NULL;
    if (j->status == CM_OK && j->kind == MOE_MSG_FORWARD)
        saved_put(s, j);
    pthread_mutex_lock(&s->mu);
    s->inflight--;
    if (j->status != CM_OK)
        s->st.failures++;
    if (j->status == CM_ETIMEOUT)
        s->st.timeouts++;
    pthread_mutex_unlock(&s->mu);
    job_free(j);
}

static double next_uniform(struct moe_server *s);

static void delayed_closed(uv_handle_t *h)
{
    free(h->data);
}

/* Answers d's job now and lets its timer go. */
static void delayed_answer(struct delayed *d)
{
    struct moe_server *s = d->s;
    if (d->prev)
        d->prev->next = d->next;
    else
        s->delayed = d->next;
    if (d->next)
        d->next->prev = d->prev;
    uv_timer_stop(&d->timer);
    answer(s, d->j);
    d->timer.data = d;
    uv_close((uv_handle_t *)&d->timer, delayed_closed);
}

static void on_delay(uv_timer_t *t)
{
    delayed_answer(t->data);
}

/* seed 002 §4.1: the emulated network latency of one answer, exponential
 * with mean delay_mean_ms (inverse CDF), capped at 20 means. */
static uint64_t delay_draw(struct moe_server *s)
{
    double m = (double)s->cfg.delay_mean_ms;
    double v = -m * log(1.0 - next_uniform(s)); /* next_uniform < 1 */
    return (uint64_t)(v < 20 * m ? v : 20 * m);
}

/* Answers j now or, with a delay configured and the server running, when
 * its timer fires. */
static void answer_later(struct moe_server *s, struct job *j)
{
    struct delayed *d = s->cfg.delay_mean_ms && !s->stopped ? calloc(1, sizeof *d) : NULL;
    if (!d || uv_timer_init(s->loop, &d->timer)) {
        free(d); /* no memory: answered without the delay */
        answer(s, j);
        return;
    }
    d->s = s;
    d->j = j;
    d->timer.data = d;
    d->next = s->delayed;
    if (s->delayed)
        s->delayed->prev = d;
    s->delayed = d;
    uv_timer_start(&d->timer, on_delay, delay_draw(s), 0);
    pthread_mutex_lock(&s->mu);
    s->st.delayed++;
    pthread_mutex_unlock(&s->mu);
}

static void on_async(uv_async_t *a)
{
    struct moe_server *s = a->data;
    pthread_mutex_lock(&s->mu);
    struct job *j = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (j) {
        struct job *n = j->next;
        answer_later(s, j);
        j = n;
    }
}

/* ---- the worker --------------------------------------------------------- */

static void done_push(struct moe_server *s, struct job *j)
{
    j->next = NULL;
    if (s->done_tail)
        s->done_tail->next = j;
    else
        s->done_head = j;
    s->done_tail = j;
}

/* Gathers the batch's requests into contiguous (S,C) buffers, runs the
 * expert once, scatters the results. Backward: one optimizer step on the
 * batch's summed gradient (the rule in moe_server.h). */
static int compute(struct expert *x, int kind, struct job **jobs, size_t nj,
                   uint32_t S, float *X, float *D, float *Y)
{
    size_t C = (size_t)x->C, off = 0;
    for (size_t i = 0; i < nj; i++) {
        memcpy(X + off * C, jobs[i]->in, jobs[i]->n * C * sizeof(float));
        if (kind == MOE_MSG_BACKWARD)
            memcpy(D + off * C, jobs[i]->dy, jobs[i]->n * C * sizeof(float));
        off += jobs[i]->n;
    }
    int rc;
    if (kind == MOE_MSG_FORWARD) {
        rc = kern_expert_forward(x->e, X, (int)S, Y);
    } else {
        struct kern_model *m = kern_expert_model(x->e);
        kern_model_zero_grad(m);
        rc = kern_expert_backward(x->e, X, D, (int)S, Y);
        if (rc == CM_OK) {
            rc = kern_optim_step(x->opt, m, NULL, NULL);
            kern_model_zero_grad(m);
        }
    }
    if (rc)
        return rc;
    off = 0;
    for (size_t i = 0; i < nj; i++) {
        memcpy(jobs[i]->out, Y + off * C, jobs[i]->n * C * sizeof(float));
        off += jobs[i]->n;
    }
    return CM_OK;
}

static void *worker_main(void *arg)
{
    struct moe_server *s = arg;
    /* batch buffers, grown to the widest expert seen (experts may be
       added while the worker runs) */
    size_t cap = 0;
    float *X = NULL, *D = NULL, *Y = NULL;
    struct job **jobs = malloc(s->cfg.max_batch * sizeof *jobs);
    struct moe_batch_req expired[64];
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        int64_t now = mono_ms();
        size_t ne, woke = 0;
        while ((ne = moe_batch_expire(&s->q, now, expired, 64)) > 0) {
            for (size_t i = 0; i < ne; i++) {
                struct job *j = expired[i].tag;
                j->status = CM_ETIMEOUT;
                done_push(s, j);
            }
            woke = 1;
        }
        if (woke)
            uv_async_send(&s->async);
        struct moe_batch b;
        int got = moe_batch_next(&s->q, now, &b);
        if (got == 1) {
            struct expert *x = ((struct job *)b.reqs[0].tag)->x;
            for (size_t i = 0; i < b.n_reqs; i++)
                jobs[i] = b.reqs[i].tag;
            pthread_mutex_unlock(&s->mu);
            size_t need = (size_t)s->cfg.max_batch * (size_t)x->C;
            if (need > cap) {
                free(X);
                free(D);
                free(Y);
                X = malloc(need * sizeof(float));
                D = malloc(need * sizeof(float));
                Y = malloc(need * sizeof(float));
                cap = X && D && Y ? need : 0;
            }
            pthread_mutex_lock(&s->xmu);
            int rc = cap && jobs ? compute(x, b.kind, jobs, b.n_reqs, b.samples, X, D, Y) : CM_ENOMEM;
            pthread_mutex_unlock(&s->xmu);
            pthread_mutex_lock(&s->mu);
            if (rc)
                CM_LOGW("moe", "batch of %u samples for %s failed: %s", b.samples, b.uid,
                        cm_strerror(rc));
            for (size_t i = 0; i < b.n_reqs; i++) {
                jobs[i]->status = rc ? CM_EINTERNAL : CM_OK;
                done_push(s, jobs[i]);
            }
            s->st.batches++;
            s->st.samples += b.samples;
            if (rc == CM_OK && b.kind == MOE_MSG_BACKWARD)
                s->st.updates++;
            moe_batch_release(&b);
            uv_async_send(&s->async);
            continue;
        }
        int64_t due = moe_batch_due_ms(&s->q, now);
        if (due < 0) {
            pthread_cond_wait(&s->cv, &s->mu);
        } else if (due > 0) {
            struct timespec ts = cm_time_after_ms(CLOCK_REALTIME, due);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(X);
    free(D);
    free(Y);
    free(jobs);
    return NULL;
}

/* ---- setup -------------------------------------------------------------- */

int moe_server_new(const struct moe_server_config *cfg, uv_loop_t *loop, struct moe_server **out)
{
    const char *why = NULL;
    if (!cfg || !loop || !out || !cfg->max_batch || cfg->max_batch > MOE_MAX_VALUES ||
        !cfg->max_inflight || !cfg->queue_timeout_ms || !cfg->saved_ttl_ms ||
        !(cfg->fail_p >= 0 && cfg->fail_p <= 1) || cfg->delay_mean_ms > 600000 ||
        kern_optim_config_check(&cfg->optim, &why))
        return CM_EINVAL;
    struct moe_server *s = calloc(1, sizeof *s);
    if (!s)
        return CM_ENOMEM;
    s->cfg = *cfg;
    if (!s->cfg.be)
        s->cfg.be = kern_backend_cpu();
    s->loop = loop;
    s->rng = cfg->seed ? cfg->seed : 0x853c49e6748fea9bull;
    struct moe_batch_config bc = {.max_batch = cfg->max_batch, .max_wait_ms = cfg->max_wait_ms,
                                  .max_pending = cfg->max_inflight};
    int rc = moe_batch_init(&s->q, &bc);
    if (rc || uv_async_init(loop, &s->async, on_async)) {
        free(s);
        return rc ? rc : CM_EINTERNAL;
    }
    s->async.data = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->xmu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return CM_OK;
}

static struct expert *find_expert(struct moe_server *s, const char *uid)
{
    for (size_t i = 0; i < s->n_experts; i++)
        if (!strcmp(s->experts[i]->uid, uid))
            return s->experts[i];
    return NULL;
}

int moe_server_add_expert(struct moe_server *s, const char *uid, int C, int F, uint64_t seed)
{
    if (!s || !uid || !moe_uid_valid(uid, strnlen(uid, MOE_UID_MAX + 1)) || C < 1 ||
        C > MOE_MAX_C || F < 1 || F > (1 << 20))
        return CM_EINVAL;
    if (s->stopped)
        return CM_ESTATE;
    if (moe_server_expert(s, uid))
        return CM_EEXISTS;
    if (s->n_experts >= MOE_INFO_MAX_EXPERTS)
        return CM_ERANGE;
    if ((uint64_t)s->cfg.max_batch * (uint64_t)C > MOE_MAX_VALUES * 16ull)
        return CM_EINVAL; /* a batch buffer of that size is not what this server is for */
    struct expert *x = calloc(1, sizeof *x);
    if (!x)
        return CM_ENOMEM;
    snprintf(x->uid, sizeof x->uid, "%s", uid);
    x->C = C;
    x->F = F;
    int rc = kern_expert_new(s->cfg.be, C, F, (int)s->cfg.max_batch, seed, &x->e);
    if (!rc) {
        struct kern_model *m = kern_expert_model(x->e);
        rc = kern_optim_new(s->cfg.be, &s->cfg.optim, m->nparams, &x->opt);
    }
    pthread_mutex_lock(&s->xmu);
    struct expert **ne = rc ? NULL : realloc(s->experts, (s->n_experts + 1) * sizeof *ne);
    if (ne) {
        s->experts = ne;
        ne[s->n_experts++] = x;
    }
    pthread_mutex_unlock(&s->xmu);
    if (!ne) {
        kern_optim_free(x->opt);
        kern_expert_free(x->e);
        free(x);
        return rc ? rc : CM_ENOMEM;
    }
    return CM_OK;
}

/* Copies between an expert and host buffers under xmu (between batches). */
static int expert_state(struct moe_server *s, const char *uid, int save, float *params, float *m,
                        float *v, size_t n, long *step)
{
    if (!s || !uid || !params || !m || !v || !step)
        return CM_EINVAL;
    pthread_mutex_lock(&s->xmu);
    struct expert *x = find_expert(s, uid);
    int rc = CM_OK;
    if (!x) {
        rc = CM_ENOTFOUND;
    } else {
        struct kern_model *km = kern_expert_model(x->e);
        const struct kern_backend *be = s->cfg.be;
        size_t bytes = n * sizeof(float);
        if (km->nparams != n || x->opt->n != n) {
            rc = CM_ERANGE;
        } else if (save) {
            rc = be->download(params, km->params, bytes);
            if (!rc)
                rc = be->download(m, x->opt->m, bytes);
            if (!rc)
                rc = be->download(v, x->opt->v, bytes);
            *step = x->opt->step;
        } else if (*step < 0) {
            rc = CM_EINVAL;
        } else {
            rc = be->upload(km->params, params, bytes);
            if (!rc)
                rc = be->upload(x->opt->m, m, bytes);
            if (!rc)
                rc = be->upload(x->opt->v, v, bytes);
            if (!rc)
                x->opt->step = *step;
        }
    }
    pthread_mutex_unlock(&s->xmu);
    return rc;
}

int moe_server_expert_size(struct moe_server *s, const char *uid, size_t *n, long *step)
{
    if (!s || !uid || !n)
        return CM_EINVAL;
    pthread_mutex_lock(&s->xmu);
    struct expert *x = find_expert(s, uid);
    if (x)
        *n = kern_expert_model(x->e)->nparams;
    if (x && step)
        *step = x->opt->step;
    pthread_mutex_unlock(&s->xmu);
    return x ? CM_OK : CM_ENOTFOUND;
}

int moe_server_save(struct moe_server *s, const char *uid, float *params, float *m, float *v, size_t n,
                    long *step)
{
    return expert_state(s, uid, 1, params, m, v, n, step);
}

int moe_server_load(struct moe_server *s, const char *uid, const float *params, const float *m,
                    const float *v, size_t n, long step)
{
    /* expert_state only reads the buffers when loading */
    return expert_state(s, uid, 0, (float *)params, (float *)m, (float *)v, n, &step);
}

struct kern_expert *moe_server_expert(struct moe_server *s, const char *uid)
{
    struct expert *x = s && uid ? find_expert(s, uid) : NULL;
    return x ? x->e : NULL;
}

int moe_server_start(struct moe_server *s)
{
    if (!s || s->started)
        return CM_ESTATE;
    if (pthread_create(&s->worker, NULL, worker_main, s))
        return CM_EINTERNAL;
    s->started = 1;
    return CM_OK;
}

/* ---- requests (loop thread) --------------------------------------------- */

static double next_uniform(struct moe_server *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (double)(s->rng >> 11) / 9007199254740992.0;
}

static int serve_info(struct moe_server *s, size_t len, uint8_t **resp, size_t *rlen)
{
    if (len != 0)
        return CM_EPARSE;
    struct moe_info *in = calloc(1, sizeof *in);
    if (!in)
        return CM_ENOMEM;
    in->max_batch = s->cfg.max_batch;
    in->max_inflight = s->cfg.max_inflight;
    in->max_request = s->cfg.max_batch;
    in->n_experts = (uint32_t)s->n_experts;
    for (size_t i = 0; i < s->n_experts; i++) {
        snprintf(in->experts[i].uid, sizeof in->experts[i].uid, "%s", s->experts[i]->uid);
        in->experts[i].c = (uint32_t)s->experts[i]->C;
        in->experts[i].f = (uint32_t)s->experts[i]->F;
    }
    int rc = moe_info_build(in, resp, rlen);
    free(in);
    return rc;
}

/* Checks a call and makes its job; a backward's kept inputs are found
 * (*kept) but stay in the table until the job is queued. */
static int make_job(struct moe_server *s, const struct p2p_peer *from, uint32_t type,
                    const uint8_t *body, size_t len, struct job **out, struct saved **kept)
{
    struct moe_call m;
    int rc = moe_call_parse(body, len, &m);
    if (rc)
        return rc;
    struct expert *x = find_expert(s, m.uid);
    if (!x)
        return CM_ENOTFOUND;
    if (m.c != (uint32_t)x->C)
        return CM_ERANGE;
    if (m.n > s->cfg.max_batch)
        return CM_ETOOBIG;
    struct saved *v = NULL;
    if (type == MOE_MSG_BACKWARD) {
        saved_sweep(s, mono_ms());
        v = saved_find(s, from->pub, m.forward_id, x);
        if (!v)
            return CM_ESTATE;
        if (v->n != m.n)
            return CM_ERANGE;
    }
    size_t nv = (size_t)m.n * m.c;
    struct job *j = calloc(1, sizeof *j);
    if (!j || !(j->out = malloc(nv * sizeof(float))) ||
        (type == MOE_MSG_FORWARD && !(j->in = malloc(nv * sizeof(float)))) ||
        (type == MOE_MSG_BACKWARD && !(j->dy = malloc(nv * sizeof(float))))) {
        job_free(j);
        return CM_ENOMEM;
    }
    j->kind = (int)type;
    j->x = x;
    j->n = m.n;
    j->fid = m.forward_id;
    memcpy(j->peer, from->pub, CM_ED25519_PUB_LEN);
    moe_values_get(type == MOE_MSG_FORWARD ? j->in : j->dy, m.values, nv);
    *out = j;
    *kept = v;
    return CM_OK;
}

int moe_server_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                          const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct moe_server *s = arg;
    if (type == MOE_MSG_INFO)
        return serve_info(s, len, resp, rlen);
    if (type != MOE_MSG_FORWARD && type != MOE_MSG_BACKWARD)
        return CM_EUNSUPPORTED;
    pthread_mutex_lock(&s->mu);
    s->st.requests++;
    int busy = s->inflight >= s->cfg.max_inflight;
    int closed = s->stopping || !s->started;
    pthread_mutex_unlock(&s->mu);
    int rc = closed ? CM_ECLOSED : busy ? CM_EBUSY : CM_OK;
    int injected = !rc && s->cfg.fail_p > 0 && next_uniform(s) < s->cfg.fail_p;
    if (injected)
        rc = CM_EINTERNAL; /* seed 002 §4.2: experts fail at random */
    struct job *j = NULL;
    struct saved *kept = NULL;
    if (!rc)
        rc = make_job(s, from, type, body, len, &j, &kept);
    if (!rc && !(j->reply = p2p_reply_defer(h)))
        rc = CM_ENOMEM;
    int64_t now = mono_ms();
    struct moe_batch_req r = {.kind = (int)type, .n = j ? j->n : 0, .arrival_ms = now,
                              .deadline_ms = now + s->cfg.queue_timeout_ms, .tag = j};
    pthread_mutex_lock(&s->mu);
    if (!rc) {
        snprintf(r.uid, sizeof r.uid, "%s", j->x->uid);
        if (kept) { /* the kept inputs move to the job (used up) once it is queued */
            j->in = kept->in;
            kept->in = NULL;
        }
        rc = moe_batch_push(&s->q, &r);
        if (!rc) {
            s->inflight++;
            pthread_cond_signal(&s->cv);
        } else if (kept) {
            kept->in = j->in;
            j->in = NULL;
        }
    }
    if (rc) {
        s->st.failures++;
        s->st.injected += (uint64_t)injected;
    }
    pthread_mutex_unlock(&s->mu);
    if (!rc && kept)
        saved_remove(s, kept);
    if (rc && j) {
        if (j->reply)
            p2p_reply_finish(j->reply, rc, NULL, 0);
        job_free(j);
    }
    return rc;
}

void moe_server_stop(struct moe_server *s)
{
    if (!s || s->stopped)
        return;
    s->stopped = 1;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->worker, NULL);
    /* The worker is gone: what it computed is answered, the rest closed. */
    struct moe_batch_req left[64];
    size_t n;
    while ((n = moe_batch_expire(&s->q, INT64_MAX, left, 64)) > 0)
        for (size_t i = 0; i < n; i++) {
            struct job *j = left[i].tag;
            j->status = CM_ECLOSED;
            pthread_mutex_lock(&s->mu);
            done_push(s, j);
            pthread_mutex_unlock(&s->mu);
        }
    on_async(&s->async); /* stopped: answers at once */
    while (s->delayed)
        delayed_answer(s->delayed);
}

static void async_closed(uv_handle_t *h)
{
    struct moe_server *s = h->data;
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->xmu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

void moe_server_free(struct moe_server *s)
{
    if (!s)
        return;
    moe_server_stop(s);
    while (s->oldest)
        saved_remove(s, s->oldest);
    moe_batch_cleanup(&s->q);
    for (size_t i = 0; i < s->n_experts; i++) {
        kern_optim_free(s->experts[i]->opt);
        kern_expert_free(s->experts[i]->e);
        free(s->experts[i]);
    }
    free(s->experts);
    s->experts = NULL;
    uv_close((uv_handle_t *)&s->async, async_closed);
}

void moe_server_stats(struct moe_server *s, struct moe_server_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
    out->mean_batch = out->batches ? (double)out->samples / (double)out->batches : 0;
}
