/* Messages to and from the other stages of a pipeline (stage_int.h; the
 * bytes: common/sched/pipe_msg.h, docs/protocol.md "Pipeline stages"). */
#include "agent/pipe/stage_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"

#define SEND_TRIES_MS 200 /* pause before sending refused chunks again */
#define PIPE_MOVED_WAIT_S 5.0 /* waiting this long, pipe_wait_any looks at the served assignment */

/* ---- the net's loop thread ---- */

int pipe_stage_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                          const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    (void)h;
    (void)resp;
    (void)rlen;
    struct pstage *s = arg;
    if (type < PIPE_MSG_ACT || type > PIPE_MSG_NORM)
        return CM_EUNSUPPORTED;
    struct pipe_inbox *ib = __atomic_load_n(&s->inbox, __ATOMIC_ACQUIRE);
    if (!ib)
        return CM_EBUSY; /* not started yet: the sender tries again */
    struct pipe_msg m;
    int rc = pipe_msg_parse(type, body, len, &m);
    return rc != CM_OK ? rc : pipe_inbox_put(ib, from->pub, &m);
}

/* Sending: every chunk of one tensor as a request at once, then the role's
 * thread waits for all the answers. */
struct send_op {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t pending;
    int *status; /* per chunk */
    uint8_t **bodies;
    size_t *lens;
    size_t n;
    struct sockaddr_storage to; /* copied under addr_mu before each attempt */
    uint8_t pub[CM_ED25519_PUB_LEN];
    uint32_t type, timeout_ms;
    int start_rc;
};

struct send_arg {
    struct send_op *op;
    size_t k;
};

static void send_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body, size_t len)
{
    (void)from;
    (void)body;
    (void)len;
    struct send_arg *a = arg;
    struct send_op *op = a->op;
    pthread_mutex_lock(&op->mu);
    op->status[a->k] = status;
    if (--op->pending == 0)
        pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
    free(a);
}

static void send_on_loop(void *arg, struct peer_net *n)
{
    struct send_op *op = arg;
    for (size_t k = 0; k < op->n; k++) {
        if (op->status[k] == CM_OK)
            continue;
        struct send_arg *a = malloc(sizeof *a);
        int rc = a ? CM_OK : CM_ENOMEM;
        if (a) {
            a->op = op;
            a->k = k;
            rc = p2p_request(peer_net_host(n), (const struct sockaddr *)&op->to, op->pub, op->type, op->bodies[k],
                             op->lens[k], op->timeout_ms, send_done, a);
            if (rc)
                free(a);
        }
        pthread_mutex_lock(&op->mu);
        if (rc == CM_OK)
            op->pending++;
        else
            op->status[k] = rc;
        pthread_mutex_unlock(&op->mu);
    }
}

static int name_the_gone(struct pstage *s);
static int send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                       const int32_t *targets, const int *cancel);

/* Stage j's message address as text, read under addr_mu. */
static void addr_of(struct pstage *s, uint32_t j, char out[PEER_ADDR_MAX])
{
    pthread_mutex_lock(&s->addr_mu);
    snprintf(out, PEER_ADDR_MAX, "%s", s->addr_s[j]);
    pthread_mutex_unlock(&s->addr_mu);
}

static double mono_s(void)
{
    return peer_mono_s();
}

int pipe_send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                     const int32_t *targets)
{
    return send_tensor(s, j, m, values, targets, NULL);
}

/* pipe_send_tensor, also given up between two tries once *cancel (read
 * atomically; NULL: never) is nonzero. */
static int send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                       const int32_t *targets, const int *cancel)
{
    uint32_t ntg = m->type == PIPE_MSG_ACT ? m->B * m->T : 0;
    uint32_t n = m->type == PIPE_MSG_NORM ? 1 : pipe_chunks(m->total, ntg);
    if (n == 0)
        return CM_ERANGE;
    /* activations and their gradients in the run's encoding (fp16: half
       the bytes; the receiver decodes) */
    uint8_t *half = NULL;
    if ((m->type == PIPE_MSG_ACT || m->type == PIPE_MSG_GRAD) && s->act_enc == PIPE_ENC_FP16) {
        if (!(half = malloc(2 * (size_t)m->total)))
            return CM_ENOMEM;
        if (pipe_f16_encode(values, m->total, half) != CM_OK) {
            fprintf(stderr, "error: step %lld: %s of micro-batch %u beyond fp16's range (65504); the run's "
                            "pipeline.compression \"fp16\" cannot carry them\n", (long long)m->step + 1,
                    m->type == PIPE_MSG_ACT ? "activations" : "gradients", m->mb);
            free(half);
            return CM_ENUMERIC;
        }
    }
    struct send_op op = {.n = n, .type = m->type};
    char to_s[PEER_ADDR_MAX] = "";
    pthread_mutex_init(&op.mu, NULL);
    pthread_cond_init(&op.cv, NULL);
    op.status = malloc(n * sizeof *op.status);
    op.bodies = calloc(n, sizeof *op.bodies);
    op.lens = calloc(n, sizeof *op.lens);
    int rc = op.status && op.bodies && op.lens ? CM_OK : CM_ENOMEM;
    for (uint32_t k = 0; rc == CM_OK && k < n; k++) {
        struct pipe_msg c = *m;
        if (m->type != PIPE_MSG_NORM) {
            c.offset = pipe_chunk_offset(k, ntg);
            c.count = pipe_chunk_count(k, m->total, ntg);
            c.ntargets = k == 0 ? ntg : 0;
            c.targets = c.ntargets ? (const uint8_t *)targets : NULL;
            c.values = half ? half + 2 * (size_t)c.offset : (const uint8_t *)(values + c.offset);
            c.enc = half ? PIPE_ENC_FP16 : PIPE_ENC_FP32;
        }
        rc = pipe_msg_build(&c, &op.bodies[k], &op.lens[k]);
        op.status[k] = CM_EBUSY;
    }
    double end = mono_s() + (double)s->o.stage_timeout_ms / 1000, next_resolve = 0;
    int last = CM_OK;
    while (rc == CM_OK) {
        op.timeout_ms = (uint32_t)fmax(1000, fmin(30000, (end - mono_s()) * 1000));
        pthread_mutex_lock(&s->addr_mu); /* pipe_resolve may move it */
        op.to = s->addr[j];
        memcpy(op.pub, s->keys[j], CM_ED25519_PUB_LEN);
        snprintf(to_s, sizeof to_s, "%s", s->addr_s[j]);
        pthread_mutex_unlock(&s->addr_mu);
        if ((rc = peer_net_call(s->rt.net, send_on_loop, &op)) != CM_OK)
            break;
        pthread_mutex_lock(&op.mu);
        while (op.pending)
            pthread_cond_wait(&op.cv, &op.mu);
        pthread_mutex_unlock(&op.mu);
        size_t left = 0;
        for (size_t k = 0; k < n; k++)
            if (op.status[k] != CM_OK) {
                left++;
                last = op.status[k];
                if (last == CM_EAUTH || last == CM_ERANGE || last == CM_EPARSE || last == CM_ENUMERIC ||
                    last == CM_EUNSUPPORTED)
                    rc = last; /* refused for what it is: sending again changes nothing */
            }
        if (!left || rc != CM_OK)
            break;
        if (pipe_g_interrupts || (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE))) {
            rc = CM_ECANCELED;
            break;
        }
        if (mono_s() >= end) {
            rc = last == CM_OK ? CM_ETIMEOUT : last;
            break;
        }
        usleep(SEND_TRIES_MS * 1000);
        /* not there: it may have started again elsewhere (a refusal, CM_EBUSY,
           says it is there but not ready) */
        if (last != CM_EBUSY && mono_s() >= next_resolve) {
            pipe_resolve(s, (int)j);
            next_resolve = mono_s() + 1.0;
        }
    }
    for (size_t k = 0; op.bodies && k < n; k++) {
        if (rc == CM_OK)
            __atomic_fetch_add(&s->bytes_sent, (uint64_t)op.lens[k], __ATOMIC_RELAXED);
        free(op.bodies[k]);
    }
    free(op.bodies);
    free(op.lens);
    free(op.status);
    free(half);
    pthread_mutex_destroy(&op.mu);
    pthread_cond_destroy(&op.cv);
    if (rc != CM_OK && rc != CM_ECANCELED)
        fprintf(stderr, "error: sending %s of step %lld to stage %u (%s): %s\n",
                m->type == PIPE_MSG_ACT    ? "activations"
                : m->type == PIPE_MSG_GRAD ? "gradients"
                : m->type == PIPE_MSG_TIED ? "the tied embedding's gradient"
                                           : "the gradient norm",
                (long long)m->step + 1, j, to_s, cm_strerror(rc));
    if (rc == CM_ETIMEOUT || rc == CM_ECONN || rc == CM_ECLOSED)
        name_the_gone(s);
    return rc;
}

/* After a wait that timed out: which stages of the pipeline do not answer
 * a Ping (those that left), said on stderr; the number of them. */
static int name_the_gone(struct pstage *s)
{
    int gone = 0;
    for (uint32_t j = 0; j < s->S; j++) {
        double ms;
        char a[PEER_ADDR_MAX];
        if (j == s->stage)
            continue;
        addr_of(s, j, a);
        if (peer_net_rtt(s->rt.net, a, s->keys[j], 1, &ms) == CM_OK)
            continue;
        pipe_resolve(s, (int)j); /* it may have started again elsewhere */
        addr_of(s, j, a);
        if (peer_net_rtt(s->rt.net, a, s->keys[j], 1, &ms) == CM_OK)
            continue;
        fprintf(stderr, "error: stage %u (%s) does not answer: it left or its link is down\n", j, a);
        gone++;
    }
    return gone;
}

/* After a wait for stages from[0..n-1] timed out: who sent nothing, and
 * who does not answer. */
static void said_nothing(struct pstage *s, const uint32_t *from, size_t n, int64_t step)
{
    for (size_t k = 0; k < n; k++) {
        char a[PEER_ADDR_MAX];
        addr_of(s, from[k], a);
        fprintf(stderr, "error: stage %u (%s) sent nothing for %ld ms at step %lld\n", from[k], a,
                s->o.stage_timeout_ms, (long long)step + 1);
    }
    if (!name_the_gone(s))
        fprintf(stderr, "error: every stage answers, yet nothing came: a stage is stuck or moved on to "
                        "another assignment\n");
}

int pipe_take(struct pstage *s, uint32_t type, int64_t step, uint32_t mb, uint32_t from, struct pipe_entry **e)
{
    struct pipe_want w = {type, step, mb, from};
    size_t which;
    int rc = pipe_wait_any(s, &w, 1, NULL, 0, &which); /* says why on a timeout */
    return rc != CM_OK ? rc : pipe_inbox_take(s->inbox, type, step, mb, from, 0, &pipe_g_interrupts, e);
}

/* ---- senders ---- */

struct send_item {
    struct send_item *next;
    struct pipe_msg m;
    float *values;
    int32_t *targets;
};

struct pipe_sender {
    struct pstage *s;
    uint32_t to;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct send_item *head, *tail;
    int busy, stop, err;
};

static void item_free(struct send_item *it)
{
    free(it->values);
    free(it->targets);
    free(it);
}

static void *sender_main(void *arg)
{
    struct pipe_sender *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop)
            break;
        struct send_item *it = q->head;
        q->head = it->next;
        if (!q->head)
            q->tail = NULL;
        q->busy = 1;
        int failed = q->err != CM_OK;
        pthread_mutex_unlock(&q->mu);
        int rc = failed ? CM_OK : send_tensor(q->s, q->to, &it->m, it->values, it->targets, &q->stop);
        item_free(it);
        pthread_mutex_lock(&q->mu);
        if (rc != CM_OK && q->err == CM_OK)
            q->err = rc;
        q->busy = 0;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int pipe_sender_start(struct pstage *s, uint32_t to, struct pipe_sender **out)
{
    struct pipe_sender *q = calloc(1, sizeof *q);
    if (!q)
        return CM_ENOMEM;
    q->s = s;
    q->to = to;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->th, NULL, sender_main, q) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        free(q);
        return CM_ENOMEM;
    }
    *out = q;
    return CM_OK;
}

int pipe_sender_push(struct pipe_sender *q, const struct pipe_msg *m, const float *values, const int32_t *targets)
{
    size_t nv = m->type == PIPE_MSG_NORM ? 0 : m->total, nt = m->type == PIPE_MSG_ACT ? (size_t)m->B * m->T : 0;
    struct send_item *it = calloc(1, sizeof *it);
    if (!it || (nv && !(it->values = malloc(nv * sizeof(float)))) ||
        (nt && !(it->targets = malloc(nt * sizeof(int32_t))))) {
        if (it)
            item_free(it);
        return CM_ENOMEM;
    }
    it->m = *m;
    if (nv)
        memcpy(it->values, values, nv * sizeof(float));
    if (nt)
        memcpy(it->targets, targets, nt * sizeof(int32_t));
    pthread_mutex_lock(&q->mu);
    int rc = q->err;
    if (rc == CM_OK) {
        if (q->tail)
            q->tail->next = it;
        else
            q->head = it;
        q->tail = it;
        it = NULL;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    if (it)
        item_free(it);
    return rc;
}

int pipe_sender_error(struct pipe_sender *q)
{
    pthread_mutex_lock(&q->mu);
    int rc = q->err;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int pipe_sender_flush(struct pipe_sender *q)
{
    pthread_mutex_lock(&q->mu);
    while ((q->head || q->busy) && q->err == CM_OK)
        pthread_cond_wait(&q->cv, &q->mu);
    int rc = q->err;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

void pipe_sender_stop(struct pipe_sender *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    __atomic_store_n(&q->stop, 1, __ATOMIC_RELEASE); /* a send in progress gives up at its next try */
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    while (q->head) {
        struct send_item *it = q->head;
        q->head = it->next;
        item_free(it);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

int pipe_wait_any(struct pstage *s, const struct pipe_want *w, size_t n, struct pipe_sender *const *senders,
                  size_t ns, size_t *which)
{
    double start = mono_s(), end = start + (double)s->o.stage_timeout_ms / 1000;
    for (;;) {
        for (size_t k = 0; k < ns; k++) {
            int err = senders[k] ? pipe_sender_error(senders[k]) : CM_OK;
            if (err != CM_OK)
                return err; /* said on stderr by the sender */
        }
        double left = end - mono_s();
        if (left <= 0)
            break;

        /* slices of 200 ms: a sender's failure ends the wait soon */
        int rc = pipe_inbox_wait_any(s->inbox, w, n, (uint32_t)fmin(200, ceil(left * 1000)), &pipe_g_interrupts,
                                     which);
        if (rc != CM_ETIMEOUT)
            return rc;
        /* nothing for a while: a stage agent may have left (the
           coordinator re-solves once its report expires, without it).
           Only then: between live agents the move is agreed within a step
           (stage_step.c), and leaving a step the others go on with would
           make them wait for us. */
        if (mono_s() - start >= PIPE_MOVED_WAIT_S && pipe_newer_assignment(s, 1)) {
            printf("the coordinator serves a newer assignment: leaving step %lld\n",
                   (long long)(n ? w[0].step + 1 : 0));
            fflush(stdout);
            return CM_EVERSION;
        }
    }
    uint32_t from[8];
    size_t nf = 0;
    for (size_t k = 0; k < n && nf < 8; k++)
        from[nf++] = w[k].stage;
    said_nothing(s, from, nf, n ? w[0].step : 0);
    return CM_ETIMEOUT;
}
