/* The batching queue (moe_batch.h): groups keyed by (kind, uid), each a
 * FIFO of requests; a list of groups scanned per decision. A server hosts
 * tens of experts (seed 002 §4 uses a few per server), so a linear scan
 * over groups costs nothing next to one batch of compute. */
#include "moe/moe_batch.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

struct node {
    struct node *next;
    struct moe_batch_req r;
};

struct moe_batch_group {
    struct moe_batch_group *next;
    int kind;
    char uid[MOE_UID_MAX + 1];
    struct node *head, *tail;
    uint64_t samples;
};

int moe_batch_init(struct moe_batch_queue *q, const struct moe_batch_config *cfg)
{
    memset(q, 0, sizeof *q);
    if (!cfg || cfg->max_batch == 0 || cfg->max_pending == 0)
        return CM_EINVAL;
    q->cfg = *cfg;
    return CM_OK;
}

static void group_free(struct moe_batch_group *g)
{
    for (struct node *n = g->head, *nx; n; n = nx) {
        nx = n->next;
        free(n);
    }
    free(g);
}

void moe_batch_cleanup(struct moe_batch_queue *q)
{
    for (struct moe_batch_group *g = q->groups, *nx; g; g = nx) {
        nx = g->next;
        group_free(g);
    }
    q->groups = NULL;
    q->pending = 0;
}

static struct moe_batch_group *group_find(struct moe_batch_queue *q, int kind, const char *uid)
{
    for (struct moe_batch_group *g = q->groups; g; g = g->next)
        if (g->kind == kind && !strcmp(g->uid, uid))
            return g;
    return NULL;
}

static void group_unlink_if_empty(struct moe_batch_queue *q, struct moe_batch_group *g)
{
    if (g->head)
        return;
    for (struct moe_batch_group **pp = &q->groups; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    free(g);
}

int moe_batch_push(struct moe_batch_queue *q, const struct moe_batch_req *r)
{
    size_t ulen = strnlen(r->uid, MOE_UID_MAX + 1);
    if (!moe_uid_valid(r->uid, ulen) || r->n == 0)
        return CM_EINVAL;
    if (r->n > q->cfg.max_batch)
        return CM_ETOOBIG;
    if (q->pending >= q->cfg.max_pending)
        return CM_EBUSY;
    struct node *n = calloc(1, sizeof *n);
    if (!n)
        return CM_ENOMEM;
    n->r = *r;
    struct moe_batch_group *g = group_find(q, r->kind, r->uid);
    if (!g) {
        if (!(g = calloc(1, sizeof *g))) {
            free(n);
            return CM_ENOMEM;
        }
        g->kind = r->kind;
        memcpy(g->uid, r->uid, ulen + 1);
        g->next = q->groups;
        q->groups = g;
    }
    if (g->tail)
        g->tail->next = n;
    else
        g->head = n;
    g->tail = n;
    g->samples += r->n;
    q->pending++;
    return CM_OK;
}

size_t moe_batch_expire(struct moe_batch_queue *q, int64_t now_ms, struct moe_batch_req *out,
                        size_t cap)
{
    size_t k = 0;
    for (struct moe_batch_group *g = q->groups, *gn; g && k < cap; g = gn) {
        gn = g->next;
        struct node **pp = &g->head, *prev = NULL;
        while (*pp && k < cap) {
            struct node *n = *pp;
            if (n->r.deadline_ms > now_ms) {
                prev = n;
                pp = &n->next;
                continue;
            }
            *pp = n->next;
            if (g->tail == n)
                g->tail = prev;
            g->samples -= n->r.n;
            q->pending--;
            out[k++] = n->r;
            free(n);
        }
        group_unlink_if_empty(q, g);
    }
    return k;
}

/* A group is ready when its head requests fill a batch (the next one would
 * not fit, or they are exactly max_batch) or its oldest has waited long
 * enough. */
static int group_ready(const struct moe_batch_queue *q, const struct moe_batch_group *g,
                       int64_t now_ms)
{
    if (g->samples >= q->cfg.max_batch)
        return 1;
    return now_ms - g->head->r.arrival_ms >= (int64_t)q->cfg.max_wait_ms;
}

int moe_batch_next(struct moe_batch_queue *q, int64_t now_ms, struct moe_batch *b)
{
    memset(b, 0, sizeof *b);
    struct moe_batch_group *best = NULL;
    for (struct moe_batch_group *g = q->groups; g; g = g->next)
        if (group_ready(q, g, now_ms) &&
            (!best || g->head->r.arrival_ms < best->head->r.arrival_ms))
            best = g;
    if (!best)
        return 0;
    /* Count the FIFO prefix that fits (never split a request). */
    size_t cnt = 0;
    uint64_t s = 0;
    for (struct node *n = best->head; n && s + n->r.n <= q->cfg.max_batch; n = n->next) {
        s += n->r.n;
        cnt++;
    }
    b->reqs = calloc(cnt, sizeof *b->reqs);
    if (!b->reqs)
        return CM_ENOMEM;
    b->kind = best->kind;
    memcpy(b->uid, best->uid, sizeof b->uid);
    for (size_t i = 0; i < cnt; i++) {
        struct node *n = best->head;
        best->head = n->next;
        b->reqs[i] = n->r;
        free(n);
    }
    if (!best->head)
        best->tail = NULL;
    best->samples -= s;
    q->pending -= cnt;
    b->n_reqs = cnt;
    b->samples = (uint32_t)s;
    group_unlink_if_empty(q, best);
    return 1;
}

void moe_batch_release(struct moe_batch *b)
{
    free(b->reqs);
    b->reqs = NULL;
    b->n_reqs = 0;
}

int64_t moe_batch_due_ms(const struct moe_batch_queue *q, int64_t now_ms)
{
    int64_t due = -1;
    for (const struct moe_batch_group *g = q->groups; g; g = g->next) {
        int64_t t = group_ready(q, g, now_ms) ? 0
                                              : g->head->r.arrival_ms + q->cfg.max_wait_ms - now_ms;
        for (const struct node *n = g->head; n; n = n->next)
            if (n->r.deadline_ms - now_ms < t)
                t = n->r.deadline_ms - now_ms;
        if (t < 0)
            t = 0;
        if (due < 0 || t < due)
            due = t;
    }
    return due;
}

size_t moe_batch_pending(const struct moe_batch_queue *q)
{
    return q->pending;
}
