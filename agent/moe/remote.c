/* Remote experts (remote.h): the networked struct kern_dmoe_experts of a
 * DMoE trainer. Seed 002_2b00836ea4b30f79.txt §3.1 (fault tolerance: a
 * failed expert is left out of the mixture), §3.2 and Appendix C (the beam
 * search over the DHT picks the experts), §3.3 (the trainer sends its batch
 * to each chosen expert and later the gradients of its outputs).
 *
 * Each select/forward/backward is one "op": a heap object shared by the
 * trainer thread (which waits for it) and the loop thread (whose callbacks
 * complete it). It is refcounted, so a call answering after the trainer
 * gave up at its deadline finds the op still there, sees it abandoned and
 * writes nothing. */
#include "agent/moe/remote.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/moe/moe_client.h"
#include "agent/peer/net.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_time.h"
#include "moe/moe_beam.h"
#include "moe/moe_msg.h"

/* A wait lasts the calls' deadline plus this: moe_client completes every
 * call at the latest at its deadline, the grace covers the loop's delay. */
#define GRACE_MS 500
#define MAX_SERVERS 1024

struct server {
    struct moe_server s;
    struct sockaddr_storage addr;
    int addr_ok;
};

struct ban {
    uint8_t pub[32];
    int fails;        /* bans in a row */
    int strikes;      /* CM_EINTERNAL answers in a row (MOE_REMOTE_STRIKES) */
    int64_t until;    /* banned before this (p2p_now_ms) */
};

struct chosen {
    uint64_t code;    /* the expert's grid index */
    int srv;          /* into r->srv */
};

/* A context: the state of one batch between its select and its backward.
 * One per batch in flight (an asynchronous trainer has several); the bans,
 * the statistics and the forward ids are the remote's. */
struct rctx {
    struct moe_remote *r;
    /* the last select: its servers and chosen experts (sorted by code) */
    struct server *srv;
    size_t nsrv, capsrv;
    struct chosen *ch;
    size_t nch, capch;
    uint64_t fid;     /* forward id of this context's last forward batch */
};

struct moe_remote {
    struct moe_remote_config c;
    struct moe_grid g;
    struct moe_remote_runner rn;
    int has_rn;
    pthread_mutex_t mu;
    struct moe_remote_stats st;
    struct ban *bans;
    size_t nbans, capbans;
    uint64_t fid;     /* the last forward id handed out (under mu) */
    struct moe_remote_served *served; /* since the last take (under mu), unsorted */
    size_t nserved, capserved;
    struct rctx main; /* moe_remote_experts */
    struct rctx **more; /* moe_remote_add_context, owned */
    size_t nmore;
    pthread_mutex_t *compute; /* borrowed: released while waiting for the network */
};

struct op;

struct call {
    struct op *op;
    int e;
    int64_t t0;
};

struct op {
    struct moe_remote *r;
    pthread_cond_t cv;  /* its waiter's: one per op, so an answer wakes only the batch
                           it belongs to (an asynchronous trainer has many waiting) */
    struct rctx *x;    /* the batch's context */
    int refs;          /* the waiter, and each call in flight (under r->mu) */
    int pending;
    int abandoned;
    int bwd;
    /* expert calls */
    const struct kern_dmoe_route *route;
    const float *in;
    float *out;
    uint8_t *want;     /* (nexp): 1 call this expert, 2 its call ended, 3 it could not
                          start (our side: a too large batch, memory; no ban) */
    int *status;       /* (nexp) */
    double *lat;       /* (nexp) ms */
    struct call *calls;
    /* select */
    struct moe_beam *beam;
};

/* ---- configuration ----------------------------------------------------- */

void moe_remote_config_default(struct moe_remote_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "ffn");
    c->timeout_ms = 2000;
    c->search_ms = 2000;
    c->ban_min_ms = 2000;
    c->ban_max_ms = 60000;
}

int moe_remote_config_check(const struct moe_remote_config *c, const char **why)
{
    struct moe_grid g;
    const char *w = NULL;
    if (moe_run_check(c->run))
        w = "run: 1..64 of [A-Za-z0-9_-]";
    else if (moe_grid_init(&g, c->name, c->d, c->M))
        w = "grid: name [a-z0-9_]{1,32}, 1..4 dimensions of 2..1024 indices";
    else if (c->k < 1 || c->k > MOE_BEAM_MAX_K)
        w = "k: 1..64";
    else if (c->beam_width && (c->beam_width < c->k || c->beam_width > MOE_BEAM_MAX_WIDTH))
        w = "beam width: k..1024 (0: k)";
    else if (c->C < 1 || c->C > MOE_MAX_C)
        w = "C: 1..16384";
    else if (c->timeout_ms < 1 || c->timeout_ms > 600000 || c->search_ms < 1 || c->search_ms > 600000)
        w = "timeouts: 1 ms .. 10 min";
    else if (c->ban_min_ms < 1 || c->ban_max_ms < c->ban_min_ms)
        w = "bans: min >= 1 ms, max >= min";
    if (why)
        *why = w;
    return w ? CM_EINVAL : CM_OK;
}

int moe_remote_new(const struct moe_remote_config *c, struct moe_remote **out)
{
    if (!c || !out || moe_remote_config_check(c, NULL))
        return CM_EINVAL;
    struct moe_remote *r = calloc(1, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    r->c = *c;
    if (!r->c.beam_width)
        r->c.beam_width = c->k;
    moe_grid_init(&r->g, c->name, c->d, c->M);
    pthread_mutex_init(&r->mu, NULL);
    r->main.r = r;
    *out = r;
    return CM_OK;
}

void moe_remote_set_runner(struct moe_remote *r, const struct moe_remote_runner *rn)
{
    pthread_mutex_lock(&r->mu);
    r->has_rn = rn != NULL;
    if (rn)
        r->rn = *rn;
    pthread_mutex_unlock(&r->mu);
}

void moe_remote_get_stats(struct moe_remote *r, struct moe_remote_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

static void rctx_cleanup(struct rctx *x)
{
    free(x->srv);
    free(x->ch);
}

void moe_remote_free(struct moe_remote *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    rctx_cleanup(&r->main);
    for (size_t i = 0; i < r->nmore; i++) {
        rctx_cleanup(r->more[i]);
        free(r->more[i]);
    }
    free(r->more);
    free(r->bans);
    free(r->served);
    free(r);
}

/* Counts n samples answered by server pub; r->mu held. */
static void served_add(struct moe_remote *r, const uint8_t pub[32], uint64_t n)
{
    for (size_t i = 0; i < r->nserved; i++)
        if (!memcmp(r->served[i].pub, pub, 32)) {
            r->served[i].samples += n;
            return;
        }
    if (r->nserved == r->capserved) {
        size_t cap = r->capserved ? 2 * r->capserved : 16;
        if (cap > MOE_REMOTE_SERVED_MAX)
            cap = MOE_REMOTE_SERVED_MAX;
        struct moe_remote_served *q =
            r->nserved < cap ? realloc(r->served, cap * sizeof *q) : NULL;
        if (!q)
            return; /* full (or no memory): not counted until the next take */
        r->served = q;
        r->capserved = cap;
    }
    memcpy(r->served[r->nserved].pub, pub, 32);
    r->served[r->nserved++].samples = n;
}

static int served_cmp(const void *a, const void *b)
{
    const struct moe_remote_served *x = a, *y = b;
    if (x->samples != y->samples)
        return x->samples > y->samples ? -1 : 1;
    return memcmp(x->pub, y->pub, 32);
}

size_t moe_remote_take_served(struct moe_remote *r, struct moe_remote_served *out, size_t max,
                              uint64_t budget)
{
    pthread_mutex_lock(&r->mu);
    qsort(r->served, r->nserved, sizeof *r->served, served_cmp);
    size_t n = r->nserved < max ? r->nserved : max;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += r->served[i].samples;
    /* scaled down proportionally when over the budget (floor: never above) */
    double f = sum > budget ? (double)budget / (double)sum : 1.0;
    size_t kept = 0;
    /* the rest is at most budget plus the floors' rounding (< 1 per server) */
    uint64_t carry = 0, carry_max = budget > UINT64_MAX - n ? UINT64_MAX : budget + n;
    for (size_t i = 0; i < n; i++) {
        struct moe_remote_served *e = &r->served[i];
        uint64_t take = f < 1.0 ? (uint64_t)((double)e->samples * f) : e->samples;
        if (take > e->samples)
            take = e->samples;
        out[i] = *e;
        out[i].samples = take;
        uint64_t rest = e->samples - take;
        if (rest && carry < carry_max) {
            if (rest > carry_max - carry)
                rest = carry_max - carry;
            carry += rest;
            r->served[kept] = *e;
            r->served[kept++].samples = rest;
        }
    }
    r->nserved = kept;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void moe_remote_set_compute_lock(struct moe_remote *r, pthread_mutex_t *compute)
{
    r->compute = compute;
}

/* The network waits of a batch let the other batches compute: the caller
 * holds the compute lock around the model's work, and the remote drops it
 * for the time it waits (never while holding r->mu: the lock order is
 * compute, then mu). */
static void compute_release(struct moe_remote *r)
{
    if (r->compute)
        pthread_mutex_unlock(r->compute);
}

static void compute_take(struct moe_remote *r)
{
    if (r->compute)
        pthread_mutex_lock(r->compute);
}

/* ---- bans (under r->mu) ---------------------------------------------- */

static struct ban *ban_find(struct moe_remote *r, const uint8_t pub[32])
{
    for (size_t i = 0; i < r->nbans; i++)
        if (!memcmp(r->bans[i].pub, pub, 32))
            return &r->bans[i];
    return NULL;
}

int moe_remote_banned(struct moe_remote *r, const uint8_t pub[32])
{
    pthread_mutex_lock(&r->mu);
    struct ban *b = ban_find(r, pub);
    int on = b && b->until > p2p_now_ms();
    pthread_mutex_unlock(&r->mu);
    return on;
}

/* A failed call with status st: ban its server for ban_min << (bans in a
 * row), at most ban_max, unless the server answered CM_EINTERNAL fewer
 * than MOE_REMOTE_STRIKES times in a row (remote.h). Several failures of
 * one server in one batch are one ban. */
static void ban_server(struct moe_remote *r, const uint8_t pub[32], int st, int64_t now)
{
    struct ban *b = ban_find(r, pub);
    if (!b) {
        if (r->nbans == r->capbans) {
            size_t cap = r->capbans ? 2 * r->capbans : 8;
            struct ban *nb = realloc(r->bans, cap * sizeof *nb);
            if (!nb)
                return;
            r->bans = nb;
            r->capbans = cap;
        }
        b = &r->bans[r->nbans++];
        memset(b, 0, sizeof *b);
        memcpy(b->pub, pub, 32);
    }
    if (b->until > now)
        return;
    if (st == CM_EINTERNAL && ++b->strikes < MOE_REMOTE_STRIKES)
        return;
    b->strikes = 0;
    uint64_t ms = r->c.ban_min_ms;
    for (int i = 0; i < b->fails && ms < r->c.ban_max_ms; i++)
        ms *= 2;
    if (ms > r->c.ban_max_ms)
        ms = r->c.ban_max_ms;
    b->fails++;
    b->until = now + (int64_t)ms;
    r->st.bans++;
    char pk[16];
    for (int i = 0; i < 6; i++)
        snprintf(pk + 2 * i, 3, "%02x", pub[i]);
    CM_LOGW("moe", "expert server %s... failed: banned for %llu ms", pk, (unsigned long long)ms);
}

/* An answer: the server is forgiven once its ban is over. */
static void unban_server(struct moe_remote *r, const uint8_t pub[32], int64_t now)
{
    struct ban *b = ban_find(r, pub);
    if (b)
        b->strikes = 0;
    if (b && b->until <= now)
        b->fails = 0;
}

/* ---- ops ------------------------------------------------------------------ */

/* A zeroed op with its condition variable; NULL without memory. */
static struct op *op_new(void)
{
    struct op *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&op->cv, &ca);
    pthread_condattr_destroy(&ca);
    return op;
}

static void op_free(struct op *op)
{
    pthread_cond_destroy(&op->cv);
    moe_beam_free(op->beam);
    free(op->want);
    free(op->status);
    free(op->lat);
    free(op->calls);
    free(op);
}

/* Drops one reference (r->mu held); 1 when op was freed. */
static int op_unref(struct op *op)
{
    if (--op->refs)
        return 0;
    op_free(op);
    return 1;
}

/* Waits for op's pending calls or the deadline; r->mu held. */
static void op_wait(struct moe_remote *r, struct op *op, int64_t deadline)
{
    while (op->pending) {
        int64_t now = p2p_now_ms();
        if (now >= deadline)
            break;
        if (r->rn.pump) {
            pthread_mutex_unlock(&r->mu);
            r->rn.pump(r->rn.ctx);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        struct timespec ts = cm_time_after_ms(CLOCK_MONOTONIC, deadline - now);
        pthread_cond_timedwait(&op->cv, &r->mu, &ts);
    }
}

/* ---- select: the beam search (seed 002 §3.2, Appendix C) ---------------- */

static void search_done(void *arg, int status, struct moe_beam *b)
{
    (void)b;
    struct op *op = arg;
    struct moe_remote *r = op->r;
    pthread_mutex_lock(&r->mu);
    op->status[0] = status;
    op->pending = 0;
    pthread_cond_signal(&op->cv);
    op_unref(op);
    pthread_mutex_unlock(&r->mu);
}

static void search_start(void *arg, struct dht_node *dht, struct p2p_host *host)
{
    (void)host;
    struct op *op = arg;
    struct moe_remote *r = op->r;
    int rc = moe_beam_search_async(dht, r->c.run, op->beam, r->c.search_ms, search_done, op);
    if (rc) {
        pthread_mutex_lock(&r->mu);
        op->status[0] = rc;
        op->pending = 0;
        op_unref(op);
        pthread_mutex_unlock(&r->mu);
    }
}

static uint64_t uid_code(const struct moe_remote *r, const int *u)
{
    uint64_t c = 0;
    for (int i = 0; i < r->c.d; i++)
        c = c * (uint64_t)r->c.M + (uint64_t)u[i];
    return c;
}

static int chosen_cmp(const void *a, const void *b)
{
    uint64_t x = ((const struct chosen *)a)->code, y = ((const struct chosen *)b)->code;
    return x < y ? -1 : x > y;
}

/* Index into r->srv of server s, added when new; -1 when full. */
static int server_index(struct rctx *r, const struct moe_server *s)
{
    for (size_t i = 0; i < r->nsrv; i++)
        if (!memcmp(r->srv[i].s.pub, s->pub, 32) && !strcmp(r->srv[i].s.addr, s->addr))
            return (int)i;
    if (r->nsrv == MAX_SERVERS)
        return -1;
    if (r->nsrv == r->capsrv) {
        size_t cap = r->capsrv ? 2 * r->capsrv : 16;
        struct server *n = realloc(r->srv, cap * sizeof *n);
        if (!n)
            return -1;
        r->srv = n;
        r->capsrv = cap;
    }
    struct server *v = &r->srv[r->nsrv];
    v->s = *s;
    v->addr_ok = p2p_addr_parse(s->addr, &v->addr) == CM_OK;
    return (int)r->nsrv++;
}

/* Keeps the experts the search chose for sample rows and their servers. */
static int take_results(struct rctx *r, const struct moe_beam *b, int B, int k, int *uids)
{
    int d = r->r->c.d;
    r->nsrv = 0;
    r->nch = 0;
    size_t need = (size_t)B * k;
    if (need > r->capch) {
        struct chosen *n = realloc(r->ch, need * sizeof *n);
        if (!n)
            return CM_ENOMEM;
        r->ch = n;
        r->capch = need;
    }
    for (int s = 0; s < B; s++) {
        const struct moe_pick *p = NULL;
        size_t np = b ? moe_beam_result(b, (size_t)s, &p) : 0;
        int j = 0;
        for (size_t i = 0; i < np && j < k; i++) {
            int si = server_index(r, moe_beam_server(b, p[i].server));
            if (si < 0 || !r->srv[si].addr_ok)
                continue;
            int *u = uids + ((size_t)s * k + j) * d;
            for (int t = 0; t < d; t++)
                u[t] = p[i].uid.idx[t];
            r->ch[r->nch++] = (struct chosen){.code = uid_code(r->r, u), .srv = si};
            j++;
        }
        for (; j < k; j++)
            uids[((size_t)s * k + j) * d] = -1;
    }
    /* one entry per expert: the first server seen for it */
    qsort(r->ch, r->nch, sizeof *r->ch, chosen_cmp);
    size_t w = 0;
    for (size_t i = 0; i < r->nch; i++)
        if (!w || r->ch[w - 1].code != r->ch[i].code)
            r->ch[w++] = r->ch[i];
    r->nch = w;
    return CM_OK;
}

static int remote_select(void *ctx, const float *scores, int B, int d, int M, int k, int *uids)
{
    struct rctx *x = ctx;
    struct moe_remote *r = x->r;
    if (d != r->c.d || M != r->c.M || k > r->c.beam_width || B < 1)
        return CM_EINVAL;
    if (!r->has_rn)
        return CM_ESTATE;
    /* the ban set: servers banned now (seed 002 §3.1: stop using a dead expert at once) */
    int64_t now = p2p_now_ms();
    pthread_mutex_lock(&r->mu);
    uint8_t(*banned)[32] = malloc((r->nbans ? r->nbans : 1) * 32);
    size_t nb = 0;
    for (size_t i = 0; banned && i < r->nbans; i++)
        if (r->bans[i].until > now)
            memcpy(banned[nb++], r->bans[i].pub, 32);
    pthread_mutex_unlock(&r->mu);
    if (!banned)
        return CM_ENOMEM;
    struct moe_ban ban = {.servers = (const uint8_t(*)[32])banned, .nservers = nb};
    struct op *op = op_new();
    int *status = calloc(1, sizeof *status);
    if (!op || !status) {
        free(banned);
        if (op)
            op_free(op);
        free(status);
        return CM_ENOMEM;
    }
    op->r = r;
    op->x = x;
    op->status = status;
    int rc = moe_beam_new(&r->g, scores, (size_t)B, k, r->c.beam_width, &ban, &op->beam);
    free(banned);
    if (rc) {
        op_free(op);
        return rc;
    }
    op->refs = 2; /* this thread, the search */
    op->pending = 1;
    if ((rc = r->rn.run(r->rn.ctx, search_start, op))) {
        op->refs = 1;
        op->pending = 0;
        op_free(op);
        return rc;
    }
    compute_release(r);
    pthread_mutex_lock(&r->mu);
    op_wait(r, op, p2p_now_ms() + r->c.search_ms + GRACE_MS);
    int ok = !op->pending && op->status[0] == CM_OK;
    r->st.searches++;
    if (!ok) {
        /* the samples go without experts this batch (the empty mixture) */
        r->st.search_failures++;
        CM_LOGW("moe", "expert search failed: %s",
                cm_strerror(op->pending ? CM_ETIMEOUT : op->status[0]));
    }
    rc = take_results(x, ok ? op->beam : NULL, B, k, uids);
    if (op->pending)
        op->abandoned = 1;
    op_unref(op);
    pthread_mutex_unlock(&r->mu);
    compute_take(r);
    return rc;
}

int moe_remote_server_of(struct moe_remote *r, const int *uid, uint8_t pub[32])
{
    pthread_mutex_lock(&r->mu);
    struct chosen key = {.code = uid_code(r, uid)};
    const struct rctx *x = &r->main;
    const struct chosen *c = bsearch(&key, x->ch, x->nch, sizeof *x->ch, chosen_cmp);
    if (c)
        memcpy(pub, x->srv[c->srv].s.pub, 32);
    pthread_mutex_unlock(&r->mu);
    return c ? CM_OK : CM_ENOTFOUND;
}

/* ---- forward and backward (seed 002 §3.3) -------------------------------- */

static void call_done(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct call *k = arg;
    struct op *op = k->op;
    struct moe_remote *r = op->r;
    pthread_mutex_lock(&r->mu);
    op->status[k->e] = status;
    op->want[k->e] = 2;
    op->lat[k->e] = (double)(p2p_now_ms() - k->t0);
    if (!op->abandoned && status == CM_OK) {
        size_t off = (size_t)op->route->start[k->e] * (size_t)op->route->C;
        memcpy(op->out + off, out, (size_t)n * c * sizeof(float));
    }
    op->pending--;
    pthread_cond_signal(&op->cv);
    op_unref(op);
    pthread_mutex_unlock(&r->mu);
}

static void calls_start(void *arg, struct dht_node *dht, struct p2p_host *host)
{
    (void)dht;
    struct op *op = arg;
    struct moe_remote *r = op->r;
    struct rctx *x = op->x;
    const struct kern_dmoe_route *rt = op->route;
    uint64_t fid = x->fid;
    for (int e = 0; e < rt->nexp; e++) {
        if (!op->want[e])
            continue;
        struct call *k = &op->calls[e];
        const int *u = rt->uid + (size_t)e * rt->d;
        struct moe_uid mu = {.n = rt->d};
        for (int t = 0; t < rt->d; t++)
            mu.idx[t] = (uint16_t)u[t];
        char name[MOE_UID_TEXT_MAX];
        struct chosen key = {.code = uid_code(r, u)};
        pthread_mutex_lock(&r->mu);
        const struct chosen *c = bsearch(&key, x->ch, x->nch, sizeof *x->ch, chosen_cmp);
        struct server sv;
        if (c)
            sv = x->srv[c->srv];
        pthread_mutex_unlock(&r->mu);
        int rc = c ? moe_uid_format(&r->g, &mu, name, sizeof name) : CM_ENOTFOUND;
        uint32_t n = (uint32_t)(rt->start[e + 1] - rt->start[e]);
        const float *v = op->in + (size_t)rt->start[e] * rt->C;
        k->op = op;
        k->e = e;
        k->t0 = p2p_now_ms();
        if (rc == CM_OK)
            rc = op->bwd ? moe_client_backward(host, (struct sockaddr *)&sv.addr, sv.s.pub, name,
                                               fid, v, n, (uint32_t)rt->C, r->c.timeout_ms,
                                               call_done, k)
                         : moe_client_forward(host, (struct sockaddr *)&sv.addr, sv.s.pub, name,
                                              fid, v, n, (uint32_t)rt->C, r->c.timeout_ms,
                                              call_done, k);
        pthread_mutex_lock(&r->mu);
        if (rc == CM_OK) {
            op->refs++;
        } else {
            op->status[e] = rc;
            op->want[e] = 3;
            op->pending--;
        }
        pthread_mutex_unlock(&r->mu);
    }
}

/* Calls every expert with want[e] at once and waits (both directions). */
static int run_calls(struct rctx *x, const struct kern_dmoe_route *rt, int bwd,
                     const float *in, float *out, uint8_t *ok)
{
    struct moe_remote *r = x->r;
    if (!r->has_rn)
        return CM_ESTATE;
    if (rt->d != r->c.d || rt->C != r->c.C || rt->nexp < 0)
        return CM_EINVAL;
    if (rt->nexp == 0)
        return CM_OK;
    struct op *op = op_new();
    int rc = CM_ENOMEM;
    if (!op)
        return rc;
    op->r = r;
    op->x = x;
    op->bwd = bwd;
    op->route = rt;
    op->in = in;
    op->out = out;
    size_t ne = (size_t)rt->nexp;
    op->want = calloc(ne, 1);
    op->status = calloc(ne, sizeof *op->status);
    op->lat = calloc(ne, sizeof *op->lat);
    op->calls = calloc(ne, sizeof *op->calls);
    if (!op->want || !op->status || !op->lat || !op->calls) {
        op_free(op);
        return rc;
    }
    for (size_t e = 0; e < ne; e++) {
        op->want[e] = bwd ? ok[e] : 1;
        op->pending += op->want[e];
        ok[e] = 0;
    }
    op->refs = 1;
    if ((rc = r->rn.run(r->rn.ctx, calls_start, op))) {
        op_free(op);
        return rc;
    }
    compute_release(r);
    pthread_mutex_lock(&r->mu);
    op_wait(r, op, p2p_now_ms() + r->c.timeout_ms + GRACE_MS);
    op->abandoned = 1; /* late answers write nothing */
    int64_t now = p2p_now_ms();
    for (size_t e = 0; e < ne; e++) {
        if (!op->want[e])
            continue;
        /* a call still in flight at the deadline timed out */
        int st = op->want[e] >= 2 ? op->status[e] : CM_ETIMEOUT;
        r->st.calls++;
        struct chosen key = {.code = uid_code(r, rt->uid + e * (size_t)rt->d)};
        const struct chosen *c = bsearch(&key, x->ch, x->nch, sizeof *x->ch, chosen_cmp);
        if (st == CM_OK) {
            ok[e] = 1;
            r->st.answered++;
            r->st.latency_ms += op->lat[e];
            if (c)
                unban_server(r, x->srv[c->srv].s.pub, now);
            /* credit: a completed forward+backward pair, one per row */
            if (c && bwd)
                served_add(r, x->srv[c->srv].s.pub, (uint64_t)(rt->start[e + 1] - rt->start[e]));
            continue;
        }
        r->st.failures++;
        r->st.timeouts += st == CM_ETIMEOUT;
        r->st.nonfinite += st == CM_ENUMERIC;
        if (c && op->want[e] != 3)
            ban_server(r, x->srv[c->srv].s.pub, st, now);
    }
    op_unref(op);
    pthread_mutex_unlock(&r->mu);
    compute_take(r);
    return CM_OK;
}

static int remote_forward(void *ctx, const struct kern_dmoe_route *rt, const float *x, float *y,
                          uint8_t *ok)
{
    struct rctx *c = ctx;
    /* the backward of this batch names it (the server keeps x under it);
       unique over the remote's contexts */
    pthread_mutex_lock(&c->r->mu);
    c->fid = ++c->r->fid;
    pthread_mutex_unlock(&c->r->mu);
    return run_calls(c, rt, 0, x, y, ok);
}

static int remote_backward(void *ctx, const struct kern_dmoe_route *rt, const float *x,
                           const float *dy, float *dx, uint8_t *ok)
{
    (void)x; /* the server kept x from the forward (seed 002 Appendix D) */
    return run_calls(ctx, rt, 1, dy, dx, ok);
}

static void rctx_experts(struct rctx *x, struct kern_dmoe_experts *out)
{
    *out = (struct kern_dmoe_experts){.ctx = x,
                                      .select = remote_select,
                                      .forward = remote_forward,
                                      .backward = remote_backward};
}

void moe_remote_experts(struct moe_remote *r, struct kern_dmoe_experts *out)
{
    rctx_experts(&r->main, out);
}

int moe_remote_add_context(struct moe_remote *r, struct kern_dmoe_experts *out)
{
    struct rctx *x = calloc(1, sizeof *x);
    struct rctx **more = x ? realloc(r->more, (r->nmore + 1) * sizeof *more) : NULL;
    if (!more) {
        free(x);
        return CM_ENOMEM;
    }
    r->more = more;
    x->r = r;
    r->more[r->nmore++] = x;
    rctx_experts(x, out);
    return CM_OK;
}

/* ---- the production runner ------------------------------------------------ */

struct net_job {
    moe_remote_fn fn;
    void *arg;
};

static void net_job_run(void *arg, struct peer_net *n)
{
    struct net_job *j = arg;
    j->fn(j->arg, peer_net_dht(n), peer_net_host(n));
}

static int net_run(void *ctx, moe_remote_fn fn, void *arg)
{
    struct net_job j = {.fn = fn, .arg = arg};
    return peer_net_call(ctx, net_job_run, &j);
}

void moe_remote_runner_net(struct peer_net *n, struct moe_remote_runner *out)
{
    *out = (struct moe_remote_runner){.ctx = n, .run = net_run, .pump = NULL};
}
