/* Asynchronous micro-batches of a DMoE trainer (async.h; seed
 * 002_2b00836ea4b30f79.txt §3.3). K slots, each a model context with its
 * own host buffers and a worker thread; micro-batch n runs in slot n % K,
 * so completing them in submission order (a ring) frees the slots in that
 * order too and the bound on micro-batches in flight is the ring's size.
 *
 * Slot life: FREE -> RUNNING (submit hands it to its worker) -> DONE (the
 * worker finished) -> FREE (next hands its result to the caller). Under
 * a->mu; the compute runs under a->compute, which the experts' network
 * waits release. */
#include "agent/train/async.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"

enum { SLOT_FREE = 0, SLOT_RUNNING, SLOT_DONE, SLOT_QUIT };

struct slot {
    struct agent_async *a;
    struct kern_model *m;   /* owned: this context's model */
    float *x;               /* (micro_batch, in) */
    int *y;                 /* (micro_batch) */
    float *grad;            /* host (nparams) */
    int B;
    float scale;
    int state;              /* under a->mu */
    int rc;
    struct kern_eval ev;
    uint64_t seq;
    double t_sub, t_done;   /* ms, monotonic */
    pthread_t th;
    int th_ok;
};

struct agent_async {
    struct agent_async_config c;
    pthread_mutex_t compute;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct slot *s;
    int K;
    uint64_t head, tail;    /* submitted, collected: head - tail in flight */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One context's forward and backward, under the compute lock (which the
 * experts drop while they wait for the network). */
static void slot_run(struct slot *s)
{
    struct agent_async *a = s->a;
    struct kern_batch kb = {.B = s->B, .x = s->x, .targets = s->y};
    memset(&s->ev, 0, sizeof s->ev);
    pthread_mutex_lock(&a->compute);
    kern_model_zero_grad(s->m);
    int rc = kern_model_fwd_bwd(s->m, &kb, s->scale, &s->ev);
    if (rc == CM_OK)
        rc = kern_model_get_grads(s->m, s->grad);
    pthread_mutex_unlock(&a->compute);
    s->rc = rc;
}

static void *worker(void *arg)
{
    struct slot *s = arg;
    struct agent_async *a = s->a;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (s->state != SLOT_RUNNING && s->state != SLOT_QUIT)
            pthread_cond_wait(&a->cv, &a->mu);
        if (s->state == SLOT_QUIT)
            break;
        pthread_mutex_unlock(&a->mu);
        slot_run(s);
        pthread_mutex_lock(&a->mu);
        s->t_done = now_ms();
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int agent_async_new(const struct agent_async_config *c, const struct kern_dmoe_experts *ex,
                    struct agent_async **out)
{
    const char *why;
    if (!c || !ex || !out || !c->be || c->max_inflight < 1 || c->max_inflight > AGENT_ASYNC_MAX ||
        c->micro_batch < 1 || kern_dmoe_config_check(&c->dmoe, &why))
        return CM_EINVAL;
    struct agent_async *a = calloc(1, sizeof *a);
    if (!a)
        return CM_ENOMEM;
    a->c = *c;
    a->K = c->max_inflight;
    pthread_mutex_init(&a->compute, NULL);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    int rc = CM_ENOMEM;
    if (!(a->s = calloc((size_t)a->K, sizeof *a->s)))
        goto fail;
    size_t in = (size_t)c->dmoe.in_dim, mb = (size_t)c->micro_batch;
    for (int i = 0; i < a->K; i++) {
        struct slot *s = &a->s[i];
        s->a = a;
        /* the seed does not matter: submit copies the master's parameters */
        if ((rc = kern_dmoe_new(c->be, &c->dmoe, c->micro_batch, 1, &ex[i], &s->m)))
            goto fail;
        rc = CM_ENOMEM;
        s->x = malloc(mb * in * sizeof *s->x);
        s->y = malloc(mb * sizeof *s->y);
        s->grad = malloc(s->m->nparams * sizeof *s->grad);
        if (!s->x || !s->y || !s->grad)
            goto fail;
        if (pthread_create(&s->th, NULL, worker, s)) {
            rc = CM_EINTERNAL;
            goto fail;
        }
        s->th_ok = 1;
    }
    *out = a;
    return CM_OK;
fail:
    agent_async_free(a);
    return rc;
}

pthread_mutex_t *agent_async_lock(struct agent_async *a)
{
    return &a->compute;
}

int agent_async_inflight(const struct agent_async *a)
{
    return (int)(a->head - a->tail);
}

int agent_async_max_inflight(const struct agent_async *a)
{
    return a->K;
}

int agent_async_submit(struct agent_async *a, const struct kern_model *master, const float *x,
                       const int32_t *y, int B, float grad_scale)
{
    if (!master || !x || !y || B < 1 || B > a->c.micro_batch ||
        master->nparams != a->s[0].m->nparams)
        return CM_EINVAL;
    if (a->head - a->tail >= (uint64_t)a->K)
        return CM_EBUSY;
    if (a->head == a->tail) {
        /* nothing in flight, so no worker computes: the contexts take the
           master's parameters (they may have changed since the last ones) */
        size_t bytes = master->nparams * sizeof(float);
        for (int i = 0; i < a->K; i++) {
            int rc = a->c.be->copy(a->s[i].m->params, master->params, bytes);
            if (rc)
                return rc;
        }
    }
    struct slot *s = &a->s[a->head % (uint64_t)a->K];
    size_t in = (size_t)a->c.dmoe.in_dim;
    memcpy(s->x, x, (size_t)B * in * sizeof *s->x);
    for (int i = 0; i < B; i++)
        s->y[i] = y[i];
    s->B = B;
    s->scale = grad_scale;
    s->seq = a->head++;
    s->t_sub = now_ms();
    pthread_mutex_lock(&a->mu);
    s->state = SLOT_RUNNING;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return CM_OK;
}

int agent_async_next(struct agent_async *a, struct agent_async_done *d)
{
    if (a->head == a->tail)
        return CM_ESTATE;
    struct slot *s = &a->s[a->tail % (uint64_t)a->K];
    pthread_mutex_lock(&a->mu);
    while (s->state != SLOT_DONE)
        pthread_cond_wait(&a->cv, &a->mu);
    s->state = SLOT_FREE;
    pthread_mutex_unlock(&a->mu);
    a->tail++;
    *d = (struct agent_async_done){.rc = s->rc,
                                   .B = s->B,
                                   .seq = s->seq,
                                   .grad = s->grad,
                                   .ev = s->ev,
                                   .wait_ms = s->t_done - s->t_sub};
    return CM_OK;
}

void agent_async_free(struct agent_async *a)
{
    if (!a)
        return;
    struct agent_async_done d;
    while (a->s && agent_async_next(a, &d) == CM_OK)
        ;
    for (int i = 0; a->s && i < a->K; i++) {
        struct slot *s = &a->s[i];
        if (s->th_ok) {
            pthread_mutex_lock(&a->mu);
            s->state = SLOT_QUIT;
            pthread_cond_broadcast(&a->cv);
            pthread_mutex_unlock(&a->mu);
            pthread_join(s->th, NULL);
        }
        kern_model_free(s->m);
        free(s->x);
        free(s->y);
        free(s->grad);
    }
    free(a->s);
    pthread_mutex_destroy(&a->compute);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}
