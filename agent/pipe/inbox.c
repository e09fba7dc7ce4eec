/* The stage agent's inbox (inbox.h): chunks assembled into tensors under
 * one mutex; the stage's thread waits on a condition variable. */
#include "agent/pipe/inbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_time.h"

struct slot {
    struct slot *next;
    struct pipe_entry e;
    uint32_t ntargets, nchunks, got;
    uint8_t *seen; /* per chunk */
    size_t bytes;
};

/* A tensor already handed over (a chunk of it repeated later, because its
 * answer was lost, is a repeat, not the start of a new tensor). */
struct taken {
    uint32_t type, mb, stage;
    int64_t step;
};
#define INBOX_TAKEN_MAX 512 /* a ring: the newest handed over */

struct pipe_inbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct taken taken[INBOX_TAKEN_MAX];
    size_t n_taken, next_taken;
    struct slot *slots;
    size_t n, max_n, bytes, max_bytes;
    int64_t step;
    uint8_t keys[PIPE_MAX_STAGES][CM_ED25519_PUB_LEN];
    uint32_t S, replica, mine;
};

void pipe_entry_free(struct pipe_entry *e)
{
    if (!e)
        return;
    free(e->values);
    free(e->targets);
    free(e);
}

int pipe_inbox_new(size_t max_entries, size_t max_bytes, struct pipe_inbox **out)
{
    if (!out || !max_entries || !max_bytes)
        return CM_EINVAL;
    struct pipe_inbox *ib = calloc(1, sizeof *ib);
    if (!ib)
        return CM_ENOMEM;
    pthread_mutex_init(&ib->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ib->cv, &ca);
    pthread_condattr_destroy(&ca);
    ib->max_n = max_entries;
    ib->max_bytes = max_bytes;
    *out = ib;
    return CM_OK;
}

static void slot_free(struct pipe_inbox *ib, struct slot *s)
{
    ib->n--;
    ib->bytes -= s->bytes;
    free(s->e.values);
    free(s->e.targets);
    free(s->seen);
    free(s);
}

void pipe_inbox_free(struct pipe_inbox *ib)
{
    if (!ib)
        return;
    while (ib->slots) {
        struct slot *s = ib->slots;
        ib->slots = s->next;
        slot_free(ib, s);
    }
    pthread_mutex_destroy(&ib->mu);
    pthread_cond_destroy(&ib->cv);
    free(ib);
}

void pipe_inbox_set_peers(struct pipe_inbox *ib, const uint8_t (*keys)[CM_ED25519_PUB_LEN], uint32_t S,
                          uint32_t replica, uint32_t mine)
{
    pthread_mutex_lock(&ib->mu);
    while (ib->slots) { /* what the old peers sent is of no use with new ones */
        struct slot *sl = ib->slots;
        ib->slots = sl->next;
        slot_free(ib, sl);
    }
    ib->S = keys && S <= PIPE_MAX_STAGES ? S : 0;
    if (ib->S)
        memcpy(ib->keys, keys, (size_t)ib->S * CM_ED25519_PUB_LEN);
    ib->replica = replica;
    ib->mine = mine;
    ib->n_taken = ib->next_taken = 0;
    pthread_mutex_unlock(&ib->mu);
}

/* Under ib->mu: whether (type, step, mb, stage) was handed over already. */
static int was_taken(const struct pipe_inbox *ib, uint32_t type, int64_t step, uint32_t mb, uint32_t stage)
{
    for (size_t i = 0; i < ib->n_taken; i++) {
        const struct taken *t = &ib->taken[i];
        if (t->type == type && t->step == step && t->mb == mb && t->stage == stage)
            return 1;
    }
    return 0;
}

void pipe_inbox_set_step(struct pipe_inbox *ib, int64_t step)
{
    pthread_mutex_lock(&ib->mu);
    ib->step = step;
    for (struct slot **p = &ib->slots; *p;) {
        struct slot *s = *p;
        if (s->e.step < step) {
            *p = s->next;
            slot_free(ib, s);
        } else {
            p = &s->next;
        }
    }
    pthread_mutex_unlock(&ib->mu);
}

/* Whether stage `from` may send a message of this type to stage `mine`. */
static int direction_ok(const struct pipe_inbox *ib, uint32_t type, uint32_t from)
{
    uint32_t last = ib->S - 1;
    switch (type) {
    case PIPE_MSG_ACT:
        return ib->mine > 0 && from == ib->mine - 1;
    case PIPE_MSG_GRAD:
        return ib->mine < last && from == ib->mine + 1;
    case PIPE_MSG_TIED:
        return last > 0 && ((ib->mine == 0 && from == last) || (ib->mine == last && from == 0));
    case PIPE_MSG_NORM:
        return from != ib->mine;
    default:
        return 0;
    }
}

static struct slot *find(struct pipe_inbox *ib, uint32_t type, int64_t step, uint32_t mb, uint32_t stage)
{
    for (struct slot *s = ib->slots; s; s = s->next)
        if (s->e.type == type && s->e.step == step && s->e.mb == mb && s->e.stage == stage)
            return s;
    return NULL;
}

static int slot_new(struct pipe_inbox *ib, const struct pipe_msg *m, struct slot **out)
{
    uint32_t ntargets = m->type == PIPE_MSG_ACT ? m->B * m->T : 0;
    uint32_t nchunks = m->type == PIPE_MSG_NORM ? 0 : pipe_chunks(m->total, ntargets);
    if (m->type != PIPE_MSG_NORM && nchunks == 0)
        return CM_ERANGE;
    size_t bytes = ((size_t)m->total + ntargets) * 4 + nchunks;
    if (ib->n >= ib->max_n || ib->bytes + bytes > ib->max_bytes)
        return CM_EBUSY;
    struct slot *s = calloc(1, sizeof *s);
    if (!s)
        return CM_ENOMEM;
    s->e.type = m->type;
    s->e.step = m->step;
    s->e.stage = m->stage;
    s->e.mb = m->mb;
    s->e.B = m->B;
    s->e.T = m->T;
    s->e.C = m->C;
    s->e.total = m->total;
    s->e.sumsq = m->sumsq;
    s->ntargets = ntargets;
    s->nchunks = nchunks;
    if ((m->total && !(s->e.values = malloc((size_t)m->total * sizeof(float)))) ||
        (ntargets && !(s->e.targets = malloc((size_t)ntargets * sizeof(int32_t)))) ||
        (nchunks && !(s->seen = calloc(nchunks, 1)))) {
        free(s->e.values);
        free(s->e.targets);
        free(s);
        return CM_ENOMEM;
    }
    s->bytes = bytes;
    s->next = ib->slots;
    ib->slots = s;
    ib->n++;
    ib->bytes += bytes;
    *out = s;
    return CM_OK;
}

/* The chunk of a tensor that starts at `offset`, or -1. */
static long chunk_of(const struct slot *s, uint32_t offset)
{
    if (offset == 0)
        return 0;
    if (s->nchunks < 2)
        return -1;
    uint32_t first = pipe_chunk_offset(1, s->ntargets);
    if (offset < first || (offset - first) % PIPE_MAX_ITEMS)
        return -1;
    uint32_t k = 1 + (offset - first) / PIPE_MAX_ITEMS;
    return k < s->nchunks ? (long)k : -1;
}

int pipe_inbox_put(struct pipe_inbox *ib, const uint8_t from[CM_ED25519_PUB_LEN], const struct pipe_msg *m)
{
    pthread_mutex_lock(&ib->mu);
    int rc = CM_OK;
    struct slot *s = NULL;
    if (ib->S == 0) { /* between two assignments: the sender tries again */
        rc = CM_EBUSY;
        goto out;
    }
    if (m->stage >= ib->S || m->replica != ib->replica ||
        memcmp(ib->keys[m->stage], from, CM_ED25519_PUB_LEN) || !direction_ok(ib, m->type, m->stage)) {
        rc = CM_EAUTH;
        goto out;
    }
    if (m->step < ib->step) /* a repeat of something already taken */
        goto out;
    if (m->step > ib->step + 1) {
        rc = CM_EBUSY;
        goto out;
    }
    if (was_taken(ib, m->type, m->step, m->mb, m->stage)) /* a chunk sent again after its answer was lost */
        goto out;
    s = find(ib, m->type, m->step, m->mb, m->stage);
    if (!s && (rc = slot_new(ib, m, &s)) != CM_OK)
        goto out;
    if (m->type == PIPE_MSG_NORM) {
        s->e.sumsq = m->sumsq;
        s->e.flags = m->flags;
        pthread_cond_broadcast(&ib->cv);
        goto out;
    }
    long k = chunk_of(s, m->offset);
    if (s->e.B != m->B || s->e.T != m->T || s->e.C != m->C || s->e.total != m->total || k < 0 ||
        m->count != pipe_chunk_count((uint32_t)k, s->e.total, s->ntargets) ||
        m->ntargets != (k == 0 ? s->ntargets : 0)) {
        rc = CM_ERANGE;
        goto out;
    }
    if (s->seen[k])
        goto out;
    pipe_msg_values(m, s->e.values + m->offset); /* fp32, or fp16 decoded */
    if (m->ntargets)
        memcpy(s->e.targets, m->targets, (size_t)m->ntargets * sizeof(int32_t));
    s->seen[k] = 1;
    if (++s->got == s->nchunks)
        pthread_cond_broadcast(&ib->cv);
out:
    pthread_mutex_unlock(&ib->mu);
    return rc;
}

static int complete(const struct slot *s)
{
    return s->e.type == PIPE_MSG_NORM || s->got == s->nchunks;
}

/* The held complete message (type, step, mb, from `stage`): its link, or a
 * link to NULL. Under ib->mu. */
static struct slot **find_complete(struct pipe_inbox *ib, uint32_t type, int64_t step, uint32_t mb,
                                   uint32_t stage)
{
    struct slot **p = &ib->slots;
    while (*p && !((*p)->e.type == type && (*p)->e.step == step && (*p)->e.mb == mb && (*p)->e.stage == stage &&
                   complete(*p)))
        p = &(*p)->next;
    return p;
}

static struct timespec deadline_after(uint32_t ms)
{
    return cm_time_after_ms(CLOCK_MONOTONIC, ms);
}

/* Under ib->mu: CM_ECANCELED once *interrupted, CM_ETIMEOUT at `end`, else
 * waits for a put (at most 100 ms, to look at *interrupted again): CM_OK. */
static int wait_slice(struct pipe_inbox *ib, const struct timespec *end, const volatile sig_atomic_t *interrupted)
{
    if (interrupted && *interrupted)
        return CM_ECANCELED;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > end->tv_sec || (now.tv_sec == end->tv_sec && now.tv_nsec >= end->tv_nsec))
        return CM_ETIMEOUT;
    struct timespec wake = now;
    wake.tv_nsec += 100000000L;
    if (wake.tv_nsec >= 1000000000L) {
        wake.tv_sec++;
        wake.tv_nsec -= 1000000000L;
    }
    if (wake.tv_sec > end->tv_sec || (wake.tv_sec == end->tv_sec && wake.tv_nsec > end->tv_nsec))
        wake = *end;
    (void)pthread_cond_timedwait(&ib->cv, &ib->mu, &wake);
    return CM_OK;
}

int pipe_inbox_take(struct pipe_inbox *ib, uint32_t type, int64_t step, uint32_t mb, uint32_t stage,
                    uint32_t timeout_ms, const volatile sig_atomic_t *interrupted, struct pipe_entry **out)
{
    struct timespec end = deadline_after(timeout_ms);
    pthread_mutex_lock(&ib->mu);
    int rc;
    for (;;) {
        struct slot **p = find_complete(ib, type, step, mb, stage);
        if (*p) {
            struct slot *s = *p;
            struct pipe_entry *e = malloc(sizeof *e);
            if (!e) {
                rc = CM_ENOMEM;
                break;
            }
            *e = s->e;
            s->e.values = NULL;
            s->e.targets = NULL;
            *p = s->next;
            slot_free(ib, s);
            ib->taken[ib->next_taken] = (struct taken){e->type, e->mb, e->stage, e->step};
            ib->next_taken = (ib->next_taken + 1) % INBOX_TAKEN_MAX;
            if (ib->n_taken < INBOX_TAKEN_MAX)
                ib->n_taken++;
            *out = e;
            rc = CM_OK;
            break;
        }
        if ((rc = wait_slice(ib, &end, interrupted)) != CM_OK)
            break;
    }
    pthread_mutex_unlock(&ib->mu);
    return rc;
}

int pipe_inbox_wait_any(struct pipe_inbox *ib, const struct pipe_want *w, size_t n, uint32_t timeout_ms,
                        const volatile sig_atomic_t *interrupted, size_t *which)
{
    struct timespec end = deadline_after(timeout_ms);
    pthread_mutex_lock(&ib->mu);
    int rc;
    for (;;) {
        size_t k = 0;
        while (k < n && !*find_complete(ib, w[k].type, w[k].step, w[k].mb, w[k].stage))
            k++;
        if (k < n) {
            *which = k;
            rc = CM_OK;
            break;
        }
        if ((rc = wait_slice(ib, &end, interrupted)) != CM_OK)
            break;
    }
    pthread_mutex_unlock(&ib->mu);
    return rc;
}
