/* Drivers of the beam search state machine (moe_beam.c) over the DHT:
 * blocking, on a started node, with each round's lookups run at once from
 * worker threads; and in-loop, with dht_get_async, for in-process swarms.
 * Plus the short-lived prefix cache. Seed 002_2b00836ea4b30f79.txt,
 * Appendix C: the lookups are Algorithm 1's ActiveSuffixes(prefix). */
#include "moe/moe_beam.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

/* ---- cache ------------------------------------------------------------------ */

/* Cache keys are the DHT key plus the grid's shape ("moe.r.ffn.3.*#2x32"):
 * two grids of one name with different shapes decode the same key apart. */
#define CACHE_KEY_MAX (MOE_KEY_MAX + 16)

struct cache_ent {
    char key[CACHE_KEY_MAX];
    int64_t until_ms;
    struct moe_entry *e;
    size_t ne;
};

struct moe_cache {
    pthread_mutex_t mu;
    uint32_t ttl_ms;
    size_t max;
    struct cache_ent *ents;
    size_t n;
    uint64_t hits, misses;
};

int moe_cache_new(uint32_t ttl_ms, size_t max_keys, struct moe_cache **out)
{
    if (!out || ttl_ms == 0 || max_keys == 0 || max_keys > 1u << 20)
        return CM_EINVAL;
    struct moe_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->ents = calloc(max_keys, sizeof *c->ents))) {
        free(c);
        return CM_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->ttl_ms = ttl_ms;
    c->max = max_keys;
    *out = c;
    return CM_OK;
}

void moe_cache_free(struct moe_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->ents[i].e);
    free(c->ents);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void moe_cache_stats(struct moe_cache *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}

static void cache_drop(struct moe_cache *c, size_t i)
{
    free(c->ents[i].e);
    c->ents[i] = c->ents[--c->n];
}

/* A copy of the live entries of key: 1 on a hit. */
static int cache_get(struct moe_cache *c, const char *key, int64_t now, struct moe_entry **e,
                     size_t *ne)
{
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->ents[i].key, key))
            continue;
        if (c->ents[i].until_ms <= now) {
            cache_drop(c, i);
            break;
        }
        *e = malloc(c->ents[i].ne * sizeof **e);
        if (*e) {
            memcpy(*e, c->ents[i].e, c->ents[i].ne * sizeof **e);
            *ne = c->ents[i].ne;
            hit = 1;
        }
        break;
    }
    if (hit)
        c->hits++;
    else
        c->misses++;
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(struct moe_cache *c, const char *key, int64_t now,
                      const struct moe_entry *e, size_t ne)
{
    if (!ne)
        return;
    int64_t until = now + c->ttl_ms;
    for (size_t i = 0; i < ne; i++)
        if (e[i].expires_ms < until)
            until = e[i].expires_ms; /* never outlive the declaration */
    struct moe_entry *copy = malloc(ne * sizeof *copy);
    if (!copy)
        return;
    memcpy(copy, e, ne * sizeof *copy);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n;)
        if (!strcmp(c->ents[i].key, key) || c->ents[i].until_ms <= now)
            cache_drop(c, i);
        else
            i++;
    if (c->n == c->max) {
        size_t old = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->ents[i].until_ms < c->ents[old].until_ms)
                old = i;
        cache_drop(c, old);
    }
    struct cache_ent *ce = &c->ents[c->n++];
    snprintf(ce->key, sizeof ce->key, "%s", key);
    ce->until_ms = until;
    ce->e = copy;
    ce->ne = ne;
    pthread_mutex_unlock(&c->mu);
}

/* ---- blocking driver -------------------------------------------------------- */

#define SEARCH_THREADS 64

struct lookup {
    struct moe_uid p;
    char key[MOE_KEY_MAX];
    char ckey[CACHE_KEY_MAX];
    size_t klen;
    int status, cached;
    struct moe_entry *e;
    size_t ne;
};

struct round_job {
    struct dht_node *node;
    const struct moe_grid *g;
    struct lookup *lk;
    size_t n, next;
    int64_t end_ms;
    pthread_mutex_t mu;
};

static void *round_worker(void *arg)
{
    struct round_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->n)
            return NULL;
        struct lookup *l = &j->lk[i];
        if (l->cached)
            continue;
        int64_t left = j->end_ms - p2p_now_ms();
        if (left <= 0) {
            l->status = CM_ETIMEOUT;
            continue;
        }
        struct dht_result r;
        l->status = dht_get_ex(j->node, l->key, l->klen, DHT_GET_GRACE, (uint32_t)left, &r);
        if (l->status == CM_OK) {
            l->status = r.status;
            if (l->status == CM_OK)
                l->status = moe_dht_entries(j->g, &l->p, &r, &l->e, &l->ne, NULL);
            dht_result_cleanup(&r);
        }
    }
}

int moe_beam_search(struct dht_node *node, const char *run, struct moe_beam *b,
                    uint32_t deadline_ms, struct moe_cache *cache)
{
    if (!node || !b || deadline_ms == 0 || moe_run_check(run))
        return CM_EINVAL;
    int64_t end = p2p_now_ms() + deadline_ms;
    const struct moe_grid *g = moe_beam_grid(b);
    int rc = CM_OK;
    while (!moe_beam_done(b) && rc == CM_OK) {
        if (p2p_now_ms() >= end)
            return CM_ETIMEOUT;
        size_t n = moe_beam_nwanted(b);
        struct lookup *lk = calloc(n, sizeof *lk);
        if (!lk)
            return CM_ENOMEM;
        for (size_t i = 0; i < n && rc == CM_OK; i++) {
            lk[i].p = *moe_beam_wanted(b, i);
            rc = moe_key_format(run, g, &lk[i].p, lk[i].key, sizeof lk[i].key, &lk[i].klen);
            snprintf(lk[i].ckey, sizeof lk[i].ckey, "%s#%dx%d", lk[i].key, g->dims, g->size);
            if (rc == CM_OK && cache)
                lk[i].cached = cache_get(cache, lk[i].ckey, p2p_now_ms(), &lk[i].e, &lk[i].ne);
        }
        size_t misses = 0;
        for (size_t i = 0; i < n; i++)
            misses += !lk[i].cached;
        if (rc == CM_OK && misses) {
            struct round_job j = {.node = node, .g = g, .lk = lk, .n = n, .end_ms = end};
            pthread_mutex_init(&j.mu, NULL);
            pthread_t th[SEARCH_THREADS];
            size_t want = misses < SEARCH_THREADS ? misses : SEARCH_THREADS, nt = 0;
            for (; nt < want; nt++)
                if (pthread_create(&th[nt], NULL, round_worker, &j))
                    break;
            if (nt == 0)
                round_worker(&j);
            for (size_t i = 0; i < nt; i++)
                pthread_join(th[i], NULL);
            pthread_mutex_destroy(&j.mu);
        }
        for (size_t i = 0; i < n && rc == CM_OK; i++) {
            if (cache && !lk[i].cached && lk[i].status == CM_OK)
                cache_put(cache, lk[i].ckey, p2p_now_ms(), lk[i].e, lk[i].ne);
            if (lk[i].status == CM_ETIMEOUT && p2p_now_ms() >= end)
                rc = CM_ETIMEOUT;
            else
                rc = moe_beam_feed(b, &lk[i].p, lk[i].status, lk[i].e, lk[i].ne);
        }
        for (size_t i = 0; i < n; i++)
            free(lk[i].e);
        free(lk);
    }
    return rc;
}

/* ---- in-loop driver --------------------------------------------------------- */

struct async_search {
    struct dht_node *node;
    char run[MOE_RUN_MAX + 1];
    struct moe_grid g;
    struct moe_beam *b;
    moe_beam_cb cb;
    void *arg;
    uv_timer_t timer;
    int refs, finished;
};

struct async_get {
    struct async_search *as;
    struct moe_uid p;
};

static void async_unref(struct async_search *as)
{
    if (--as->refs == 0)
        free(as);
}

static void async_timer_closed(uv_handle_t *h)
{
    async_unref(h->data);
}

static void async_finish(struct async_search *as, int status)
{
    if (as->finished)
        return;
    as->finished = 1;
    uv_timer_stop(&as->timer);
    uv_close((uv_handle_t *)&as->timer, async_timer_closed);
    as->cb(as->arg, status, as->b);
}

static void async_timeout(uv_timer_t *t)
{
    async_finish(t->data, CM_ETIMEOUT);
}

static void async_issue(struct async_search *as);

static void async_feed(struct async_search *as, const struct moe_uid *p, int status,
                       const struct moe_entry *e, size_t ne)
{
    if (as->finished || !moe_beam_is_pending(as->b, p))
        return;
    unsigned round = moe_beam_round(as->b);
    int rc = moe_beam_feed(as->b, p, status, e, ne);
    if (rc)
        async_finish(as, rc);
    else if (moe_beam_done(as->b))
        async_finish(as, CM_OK);
    else if (moe_beam_round(as->b) != round)
        async_issue(as);
}

static void async_get_done(void *arg, const struct dht_result *res)
{
    struct async_get *ag = arg;
    struct async_search *as = ag->as;
    struct moe_entry *e = NULL;
    size_t ne = 0;
    int st = res->status;
    if (st == CM_OK)
        st = moe_dht_entries(&as->g, &ag->p, res, &e, &ne, NULL);
    async_feed(as, &ag->p, st, e, ne);
    free(e);
    free(ag);
    async_unref(as);
}

/* Starts every lookup of the current round. */
static void async_issue(struct async_search *as)
{
    size_t n = moe_beam_nwanted(as->b);
    struct moe_uid *ps = malloc((n ? n : 1) * sizeof *ps);
    int *failed = calloc(n ? n : 1, sizeof *failed);
    if (!ps || !failed) {
        free(ps);
        free(failed);
        async_finish(as, CM_ENOMEM);
        return;
    }
    for (size_t i = 0; i < n; i++)
        ps[i] = *moe_beam_wanted(as->b, i);
    as->refs++; /* the callbacks below must not free as under us */
    for (size_t i = 0; i < n; i++) {
        char key[MOE_KEY_MAX];
        size_t kl;
        struct async_get *ag = malloc(sizeof *ag);
        int rc = ag ? moe_key_format(as->run, &as->g, &ps[i], key, sizeof key, &kl) : CM_ENOMEM;
        if (rc == CM_OK) {
            ag->as = as;
            ag->p = ps[i];
            as->refs++;
            rc = dht_get_async_ex(as->node, key, kl, DHT_GET_GRACE, async_get_done, ag);
            if (rc)
                as->refs--;
        }
        if (rc) {
            free(ag);
            failed[i] = rc;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (failed[i])
            async_feed(as, &ps[i], failed[i], NULL, 0);
    free(ps);
    free(failed);
    async_unref(as);
}

int moe_beam_search_async(struct dht_node *node, const char *run, struct moe_beam *b,
                          uint32_t deadline_ms, moe_beam_cb cb, void *arg)
{
    if (!node || !b || !cb || deadline_ms == 0 || moe_run_check(run))
        return CM_EINVAL;
    struct async_search *as = calloc(1, sizeof *as);
    if (!as)
        return CM_ENOMEM;
    as->node = node;
    snprintf(as->run, sizeof as->run, "%s", run);
    as->g = *moe_beam_grid(b);
    as->b = b;
    as->cb = cb;
    as->arg = arg;
    uv_loop_t *loop = p2p_ctx_loop(p2p_host_ctx(dht_node_host(node)));
    uv_timer_init(loop, &as->timer);
    as->timer.data = as;
    as->refs = 2; /* the timer handle, and this call until it returns */
    uv_timer_start(&as->timer, async_timeout, deadline_ms, 0);
    if (moe_beam_done(b))
        async_finish(as, CM_OK);
    else
        async_issue(as);
    async_unref(as);
    return CM_OK;
}
