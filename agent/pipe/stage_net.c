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
    const struct sockaddr_storage *to;
    const uint8_t *pub;
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
            rc = p2p_request(peer_net_host(n), (const struct sockaddr *)op->to, op->pub, op->type, op->bodies[k],
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

static double mono_s(void)
{
    return peer_mono_s();
}

int pipe_send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                     const int32_t *targets)
{
    uint32_t ntg = m->type == PIPE_MSG_ACT ? m->B * m->T : 0;
    uint32_t n = m->type == PIPE_MSG_NORM ? 1 : pipe_chunks(m->total, ntg);
    if (n == 0)
        return CM_ERANGE;
    struct send_op op = {.n = n, .to = &s->addr[j], .pub = s->keys[j], .type = m->type};
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
            c.values = (const uint8_t *)(values + c.offset);
        }
        rc = pipe_msg_build(&c, &op.bodies[k], &op.lens[k]);
        op.status[k] = CM_EBUSY;
    }
    double end = mono_s() + (double)s->o.stage_timeout_ms / 1000, next_resolve = 0;
    int last = CM_OK;
    while (rc == CM_OK) {
        op.timeout_ms = (uint32_t)fmax(1000, fmin(30000, (end - mono_s()) * 1000));
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
        if (pipe_g_interrupts) {
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
            s->bytes_sent += op.lens[k];
        free(op.bodies[k]);
    }
    free(op.bodies);
    free(op.lens);
    free(op.status);
    pthread_mutex_destroy(&op.mu);
    pthread_cond_destroy(&op.cv);
    if (rc != CM_OK && rc != CM_ECANCELED)
        fprintf(stderr, "error: sending %s of step %lld to stage %u (%s): %s\n",
                m->type == PIPE_MSG_ACT    ? "activations"
                : m->type == PIPE_MSG_GRAD ? "gradients"
                : m->type == PIPE_MSG_TIED ? "the tied embedding's gradient"
                                           : "the gradient norm",
                (long long)m->step + 1, j, s->addr_s[j], cm_strerror(rc));
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
        if (j == s->stage || peer_net_rtt(s->rt.net, s->addr_s[j], s->keys[j], 1, &ms) == CM_OK)
            continue;
        pipe_resolve(s, (int)j); /* it may have started again elsewhere */
        if (peer_net_rtt(s->rt.net, s->addr_s[j], s->keys[j], 1, &ms) == CM_OK)
            continue;
        fprintf(stderr, "error: stage %u (%s) does not answer: it left or its link is down\n", j, s->addr_s[j]);
        gone++;
    }
    return gone;
}

int pipe_take(struct pstage *s, uint32_t type, int64_t step, uint32_t mb, uint32_t from, struct pipe_entry **e)
{
    int rc = pipe_inbox_take(s->inbox, type, step, mb, from, (uint32_t)s->o.stage_timeout_ms, &pipe_g_interrupts,
                             e);
    if (rc == CM_ETIMEOUT) {
        fprintf(stderr, "error: stage %u (%s) sent nothing for %ld ms at step %lld\n", from, s->addr_s[from],
                s->o.stage_timeout_ms, (long long)step + 1);
        if (!name_the_gone(s))
            fprintf(stderr, "error: every stage answers, yet nothing came: a stage is stuck or moved on to "
                            "another assignment\n");
    }
    return rc;
}
