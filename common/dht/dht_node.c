/* Kademlia protocol on one node, on its loop thread (see dht_node.h):
 * iterative lookups with alpha = 3 requests in flight over the k = 20
 * closest candidates (seed 002_2b00836ea4b30f79.txt, Appendix B), the RPC
 * handlers, bucket refresh, republishing and expiry purges. */
#include "dht/dht_node_internal.h"
#include "dht/dht_msg.h"
#include "p2p/p2p_relay.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

#define MAX_CAND (3 * DHT_K)
#define MAX_RESULT_RECORDS 1024
#define MAX_OWN 4096
#define VALUES_MAX_BYTES (256u * 1024u)
/* A get stops asking once this many nodes returned the key's records: the
 * k replicas are written together, so three agreeing sources are enough to
 * merge the newest entries without walking the whole neighbourhood. */
#define VALUE_SOURCES_ENOUGH 3
/* A get with DHT_GET_GRACE answers GRACE_FRAC of the first remote
 * source's round trip after it (at least GRACE_MIN_MS), with the records
 * of every source that answered by then: the requests sent in the same wave
 * as the first source's answer within about the same round trip, and a
 * third source a hop further on does not hold the get for another one. */
#define GRACE_FRAC 0.25
#define GRACE_MIN_MS 5

enum { CAND_NEW, CAND_INFLIGHT, CAND_DONE, CAND_FAILED };
enum lk_kind { LK_NODE, LK_VALUE, LK_STORE };

struct cand {
    struct dht_contact c;
    uint8_t state, hop;
    uint8_t had; /* get: it returned the key's records */
};

struct dht__lookup {
    struct dht__lookup *next, *prev;
    struct dht_node *n;
    enum lk_kind kind;
    uint8_t target[DHT_ID_LEN];
    struct cand cand[MAX_CAND];
    size_t ncand;
    int inflight, contacted, started, finished;
    struct dht_record *recs;
    size_t nrec, caprec;
    int sources, value_hop;
    int need;      /* get: sources that are enough (VALUE_SOURCES_ENOUGH) */
    int delivered; /* get: the callback ran; answers still in flight are drained */
    int grace;     /* get: DHT_GET_GRACE; grace_armed once the first remote source answered */
    int grace_armed, late_holders; /* late_holders: sources that answered after the grace */
    struct dht_record store_rec;
    int has_store_rec, store_inflight, stored, store_phase;
    uv_timer_t start_timer;
    dht_cb cb;
    void *arg;
};

struct rpc_arg {
    struct dht__lookup *lk;
    uint8_t id[DHT_ID_LEN];
    int64_t sent_ms;
};

static void node_maybe_release(struct dht_node *n);

/* ---- helpers ----------------------------------------------------------- */

static int contact_from_peer(const struct p2p_peer *p, struct dht_contact *c)
{
    memset(c, 0, sizeof *c);
    if (!p->listen_port)
        return CM_EINVAL;
    memcpy(c->pub, p->pub, 32);
    dht_id_of_pub(c->pub, c->id);
    return dht_addr_from_sockaddr((const struct sockaddr *)&p->addr, &c->addr);
}

void dht__seen_peer(struct dht_node *n, const struct p2p_peer *p)
{
    struct dht_contact c;
    if (contact_from_peer(p, &c) == CM_OK)
        dht_table_seen(&n->table, &c, p2p_now_ms());
}

static int same_entry(const struct dht_record *a, const struct dht_record *b)
{
    if (a->subkey_len != b->subkey_len)
        return 0;
    if (a->subkey_len == 0)
        return 1;
    return !memcmp(a->author, b->author, 32) && !memcmp(a->subkey, b->subkey, a->subkey_len);
}

/* 1 when the lookup already holds r byte for byte (same entry, expiry,
 * value and signature): that copy was verified, so r needs no second
 * signature check. A get hears the same records from several replicas;
 * checking each once saves most of the verification work of a lookup. */
static int have_verified(const struct dht__lookup *lk, const struct dht_record *r)
{
    for (size_t i = 0; i < lk->nrec; i++) {
        const struct dht_record *h = &lk->recs[i];
        if (h->expires_ms == r->expires_ms && h->value_len == r->value_len &&
            !memcmp(h->sig, r->sig, 64) && !memcmp(h->author, r->author, 32) &&
            same_entry(h, r) &&
            (!r->value_len || !memcmp(h->value, r->value, r->value_len)))
            return 1;
    }
    return 0;
}

/* Merges r into the lookup's results: newest expiration per entry. */
static void merge_record(struct dht__lookup *lk, const struct dht_record *r)
{
    for (size_t i = 0; i < lk->nrec; i++) {
        if (same_entry(&lk->recs[i], r)) {
            if (r->expires_ms > lk->recs[i].expires_ms) {
                struct dht_record c;
                if (dht_record_copy(&c, r) == CM_OK) {
                    dht_record_cleanup(&lk->recs[i]);
                    lk->recs[i] = c;
                }
            }
            return;
        }
    }
    if (lk->nrec >= MAX_RESULT_RECORDS)
        return;
    if (lk->nrec == lk->caprec) {
        size_t nc = lk->caprec ? lk->caprec * 2 : 8;
        struct dht_record *x = realloc(lk->recs, nc * sizeof *x);
        if (!x)
            return;
        lk->recs = x;
        lk->caprec = nc;
    }
    if (dht_record_copy(&lk->recs[lk->nrec], r) == CM_OK)
        lk->nrec++;
}

static void add_cand(struct dht__lookup *lk, const struct dht_contact *c, int hop)
{
    if (!memcmp(c->id, lk->n->id, DHT_ID_LEN))
        return;
    for (size_t i = 0; i < lk->ncand; i++)
        if (!memcmp(lk->cand[i].c.id, c->id, DHT_ID_LEN))
            return;
    if (lk->ncand == MAX_CAND &&
        dht_id_cmp_dist(lk->target, c->id, lk->cand[MAX_CAND - 1].c.id) >= 0)
        return;
    size_t pos = lk->ncand < MAX_CAND ? lk->ncand : MAX_CAND - 1;
    /* never drop a candidate with a request in flight: its answer is
     * matched by id; the farthest such one just stays */
    if (lk->ncand == MAX_CAND && lk->cand[pos].state == CAND_INFLIGHT)
        return;
    while (pos > 0 && dht_id_cmp_dist(lk->target, c->id, lk->cand[pos - 1].c.id) < 0) {
        lk->cand[pos] = lk->cand[pos - 1];
        pos--;
    }
    lk->cand[pos].c = *c;
    lk->cand[pos].state = CAND_NEW;
    lk->cand[pos].had = 0;
    lk->cand[pos].hop = (uint8_t)(hop > 255 ? 255 : hop);
    if (lk->ncand < MAX_CAND)
        lk->ncand++;
}

static struct cand *find_cand(struct dht__lookup *lk, const uint8_t *id)
{
    for (size_t i = 0; i < lk->ncand; i++)
        if (!memcmp(lk->cand[i].c.id, id, DHT_ID_LEN))
            return &lk->cand[i];
    return NULL;
}

/* ---- lookups ----------------------------------------------------------- */

static void lookup_pump(struct dht__lookup *lk);
static void grace_arm(struct dht__lookup *lk, int64_t rtt_ms);

static void lookup_freed(uv_handle_t *h)
{
    struct dht__lookup *lk = h->data;
    struct dht_node *n = lk->n;
    free(lk);
    n->lookup_handles--;
    node_maybe_release(n);
}

/* ---- holder hints ------------------------------------------------------
 * A get walks from our routing table towards the key, one round trip per
 * hop (about two at 1,000 nodes, bench_moe_beam). The nodes that returned
 * the key's records are kept for DHT_HINT_TTL_MS, and the next get of the
 * same key asks them first: they are the key's closest nodes, so they head
 * the candidates and a repeated get (a trainer's beam search reads the same
 * prefixes every batch, docs/experts.md) takes one round trip. The records
 * are read fresh every time; only the route is remembered. A holder that
 * died costs a failed request, and the lookup goes on from the table. */

static struct dht__hint *hint_slot(struct dht_node *n, const uint8_t *key)
{
    size_t h = ((size_t)key[0] << 8 | key[1]) % DHT_HINT_SLOTS;
    return n->hints ? &n->hints[h] : NULL;
}

static void hint_save(struct dht__lookup *lk)
{
    struct dht_node *n = lk->n;
    if (!n->hints && !(n->hints = calloc(DHT_HINT_SLOTS, sizeof *n->hints)))
        return;
    struct dht__hint *h = hint_slot(n, lk->target);
    uint8_t k = 0;
    for (size_t i = 0; i < lk->ncand && k < DHT_HINT_HOLDERS; i++)
        if (lk->cand[i].had)
            h->c[k++] = lk->cand[i].c;
    if (!k)
        return;
    memcpy(h->key, lk->target, DHT_ID_LEN);
    h->n = k;
    h->expires_ms = p2p_now_ms() + DHT_HINT_TTL_MS;
}

static void hint_use(struct dht__lookup *lk)
{
    struct dht__hint *h = hint_slot(lk->n, lk->target);
    if (!h || !h->n || h->expires_ms <= p2p_now_ms() || memcmp(h->key, lk->target, DHT_ID_LEN))
        return;
    for (uint8_t i = 0; i < h->n; i++)
        add_cand(lk, &h->c[i], 1);
}

/* Builds the result and runs the callback; the records are freed after. */
static void lookup_deliver(struct dht__lookup *lk)
{
    struct dht_node *n = lk->n;
    lk->delivered = 1;
    struct dht_result res = {0};
    struct dht_contact closest[DHT_K];
    size_t nc = 0;
    int hops = 0;
    for (size_t i = 0; i < lk->ncand && nc < DHT_K; i++)
        if (lk->cand[i].state == CAND_DONE) {
            if (nc == 0)
                hops = lk->cand[i].hop;
            closest[nc++] = lk->cand[i].c;
        }
    res.contacted = lk->contacted;
    res.closest = closest;
    res.nclosest = nc;
    switch (lk->kind) {
    case LK_NODE:
        res.status = nc ? CM_OK : CM_ECONN;
        res.hops = hops;
        break;
    case LK_VALUE:
        if (lk->nrec && lk->sources > 0)
            hint_save(lk);
        res.status = lk->nrec ? CM_OK : CM_ENOTFOUND;
        res.rec = lk->recs;
        res.nrec = lk->nrec;
        res.hops = lk->nrec ? lk->value_hop : hops;
        break;
    case LK_STORE:
        res.status = lk->stored ? CM_OK : CM_ECONN;
        res.stored = lk->stored;
        res.hops = hops;
        break;
    }
    if (n->closing)
        res.status = CM_ECLOSED;
    n->st.lookups++;
    n->st.lookup_hops += (uint64_t)res.hops;
    if (lk->cb)
        lk->cb(lk->arg, &res);
    for (size_t i = 0; i < lk->nrec; i++)
        dht_record_cleanup(&lk->recs[i]);
    free(lk->recs);
    lk->recs = NULL;
    lk->nrec = lk->caprec = 0;
}

/* Delivers (once) and frees: only when no request refers to it any more. */
static void lookup_finish(struct dht__lookup *lk)
{
    struct dht_node *n = lk->n;
    lk->finished = 1;
    if (!lk->delivered)
        lookup_deliver(lk);
    else if (lk->late_holders)
        hint_save(lk); /* the holders that answered after a grace answer too */
    if (lk->has_store_rec)
        dht_record_cleanup(&lk->store_rec);
    if (lk->prev)
        lk->prev->next = lk->next;
    else
        n->lookups = lk->next;
    if (lk->next)
        lk->next->prev = lk->prev;
    uv_close((uv_handle_t *)&lk->start_timer, lookup_freed);
}

static void store_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                       size_t len)
{
    struct rpc_arg *ra = arg;
    struct dht__lookup *lk = ra->lk;
    struct dht_node *n = lk->n;
    struct dht_msg_store_result sr;
    if (status == CM_OK && dht_msg_parse_store_result(body, len, &sr) == CM_OK && sr.n == 1 &&
        (sr.status[0] == CM_OK || sr.status[0] == CM_ESTATE))
        lk->stored++;
    if (from)
        dht__seen_peer(n, from);
    else if (status != CM_ECLOSED)
        dht_table_failed(&n->table, ra->id);
    free(ra);
    if (--lk->store_inflight == 0)
        lookup_finish(lk);
}

static void store_phase(struct dht__lookup *lk)
{
    struct dht_node *n = lk->n;
    lk->store_phase = 1;
    if (n->closing) {
        lookup_finish(lk);
        return;
    }
    const struct dht_record *rp = &lk->store_rec;
    uint8_t *body;
    size_t blen;
    if (dht_msg_encode_store(&rp, 1, &body, &blen)) {
        lookup_finish(lk);
        return;
    }
    size_t done = 0;
    const struct cand *kth = NULL;
    for (size_t i = 0; i < lk->ncand && done < DHT_K; i++) {
        struct cand *c = &lk->cand[i];
        if (c->state != CAND_DONE)
            continue;
        done++;
        kth = c;
        struct rpc_arg *ra = malloc(sizeof *ra);
        if (!ra)
            break;
        ra->lk = lk;
        memcpy(ra->id, c->c.id, DHT_ID_LEN);
        struct sockaddr_storage sa;
        dht_addr_to_sockaddr(&c->c.addr, &sa);
        if (p2p_request(n->host, (struct sockaddr *)&sa, c->c.pub, P2P_MSG_DHT_STORE, body, blen,
                        n->rpc_timeout_ms, store_done, ra)) {
            free(ra);
            continue;
        }
        n->st.rpcs_sent++;
        lk->store_inflight++;
    }
    free(body);
    /* We keep a copy too when we are among the k closest ourselves (and
     * serve others: a client-mode node's copy would help nobody). */
    if (n->serving && (done < DHT_K || !kth || dht_id_cmp_dist(lk->target, n->id, kth->c.id) < 0))
        if (dht_store_put(&n->store, &lk->store_rec, p2p_now_ms()) == CM_OK)
            lk->stored++;
    if (lk->store_inflight == 0)
        lookup_finish(lk);
}

static void lookup_rpc_done(void *arg, int status, const struct p2p_peer *from,
                            const uint8_t *body, size_t len)
{
    struct rpc_arg *ra = arg;
    struct dht__lookup *lk = ra->lk;
    struct dht_node *n = lk->n;
    struct cand *c = find_cand(lk, ra->id);
    lk->inflight--;
    int hop = c ? c->hop : 1;
    int ok = 0;
    if (status == CM_OK && from && lk->delivered) {
        ok = 1; /* a get that already answered: the node is alive, its records are not needed */
        /* but after a grace answer, whether it holds them: the next get of
           the key asks it first (holder hints, above) */
        struct dht_msg_values v;
        if (lk->grace && lk->kind == LK_VALUE && c && dht_msg_parse_values(body, len, &v) == CM_OK) {
            for (size_t i = 0; i < v.r.n && !c->had; i++)
                c->had = !memcmp(v.r.rec[i].key, lk->target, DHT_ID_LEN);
            lk->late_holders |= c->had;
            dht_msg_values_cleanup(&v);
        }
    } else if (status == CM_OK && from) {
        if (lk->kind == LK_VALUE) {
            struct dht_msg_values v;
            if (dht_msg_parse_values(body, len, &v) == CM_OK) {
                ok = 1;
                int64_t now = p2p_now_ms();
                int found = 0;
                for (size_t i = 0; i < v.r.n; i++) {
                    const struct dht_record *r = &v.r.rec[i];
                    if (memcmp(r->key, lk->target, DHT_ID_LEN) || r->expires_ms <= now ||
                        (!have_verified(lk, r) && dht_record_verify(r)))
                        continue; /* not ours, stale, or forged: ignored */
                    merge_record(lk, r);
                    found = 1;
                }
                if (found) {
                    if (lk->sources == 0 || hop < lk->value_hop)
                        lk->value_hop = hop;
                    lk->sources++;
                    if (c)
                        c->had = 1;
                    if (lk->grace && !lk->grace_armed)
                        grace_arm(lk, now - ra->sent_ms);
                }
                for (size_t i = 0; i < v.nodes.n; i++)
                    add_cand(lk, &v.nodes.c[i], hop + 1);
                dht_msg_values_cleanup(&v);
            }
        } else {
            struct dht_msg_nodes nd;
            if (dht_msg_parse_nodes(body, len, &nd) == CM_OK) {
                ok = 1;
                for (size_t i = 0; i < nd.n; i++)
                    add_cand(lk, &nd.c[i], hop + 1);
            }
        }
    }
    c = find_cand(lk, ra->id); /* add_cand may have moved it */
    if (ok) {
        dht__seen_peer(n, from);
        if (c)
            c->state = CAND_DONE;
    } else {
        n->st.rpcs_failed++;
        if (c)
            c->state = CAND_FAILED;
        if (status != CM_ECLOSED)
            dht_table_failed(&n->table, ra->id);
    }
    free(ra);
    lookup_pump(lk);
}

static void lookup_pump(struct dht__lookup *lk)
{
    struct dht_node *n = lk->n;
    if (lk->finished || lk->store_phase)
        return;
    /* A get answers as soon as it has enough sources: its caller does not
     * wait for the requests still in flight, which are drained (the
     * routing table still learns from them) before the lookup is freed. */
    if (lk->delivered) {
        if (lk->inflight == 0)
            lookup_finish(lk);
        return;
    }
    int enough = lk->kind == LK_VALUE && lk->sources >= lk->need;
    if (enough) {
        lookup_deliver(lk);
        if (lk->inflight == 0)
            lookup_finish(lk);
        return;
    }
    /* Once a get has found the value, it keeps no more requests in flight
     * than sources it still needs: the answers pending are from the same
     * neighbourhood and most likely hold it too. Topping up to alpha after
     * each answer would leave requests in flight when the last source
     * arrives, and the get would wait a whole round trip more for them. */
    int cap = DHT_ALPHA;
    if (lk->kind == LK_VALUE && lk->sources > 0 && lk->need - lk->sources < cap)
        cap = lk->need - lk->sources;
    if (!n->closing && !enough) {
        uint8_t *body = NULL;
        size_t blen = 0;
        size_t considered = 0;
        for (size_t i = 0; i < lk->ncand && lk->inflight < cap; i++) {
            struct cand *c = &lk->cand[i];
            if (c->state == CAND_FAILED)
                continue;
            if (considered++ >= DHT_K)
                break;
            if (c->state != CAND_NEW)
                continue;
            if (!body && dht_msg_encode_find(lk->target, lk->kind == LK_VALUE, &body, &blen))
                break;
            struct rpc_arg *ra = malloc(sizeof *ra);
            if (!ra)
                break;
            ra->lk = lk;
            ra->sent_ms = p2p_now_ms();
            memcpy(ra->id, c->c.id, DHT_ID_LEN);
            struct sockaddr_storage sa;
            dht_addr_to_sockaddr(&c->c.addr, &sa);
            uint32_t type = lk->kind == LK_VALUE ? P2P_MSG_DHT_FIND_VALUE : P2P_MSG_DHT_FIND_NODE;
            if (p2p_request(n->host, (struct sockaddr *)&sa, c->c.pub, type, body, blen,
                            n->rpc_timeout_ms, lookup_rpc_done, ra)) {
                free(ra);
                c->state = CAND_FAILED;
                n->st.rpcs_failed++;
                continue;
            }
            c->state = CAND_INFLIGHT;
            lk->inflight++;
            lk->contacted++;
            n->st.rpcs_sent++;
        }
        free(body);
    }
    if (lk->inflight == 0) {
        if (lk->kind == LK_STORE && !n->closing)
            store_phase(lk);
        else
            lookup_finish(lk);
    }
}

/* The grace after a get's first remote source (DHT_GET_GRACE) ran out:
 * answer with what the sources gave so far. */
static void grace_cb(uv_timer_t *t)
{
    struct dht__lookup *lk = t->data;
    if (lk->finished || lk->delivered)
        return;
    lookup_deliver(lk);
    if (lk->inflight == 0)
        lookup_finish(lk);
}

static void grace_arm(struct dht__lookup *lk, int64_t rtt_ms)
{
    lk->grace_armed = 1;
    int64_t ms = (int64_t)(GRACE_FRAC * (double)rtt_ms);
    /* the start timer fired long ago (a response came): reused */
    uv_timer_start(&lk->start_timer, grace_cb, (uint64_t)(ms < GRACE_MIN_MS ? GRACE_MIN_MS : ms), 0);
}

static void lookup_start_cb(uv_timer_t *t)
{
    struct dht__lookup *lk = t->data;
    lk->started = 1;
    lookup_pump(lk);
}

static int lookup_new(struct dht_node *n, enum lk_kind kind, const uint8_t target[DHT_ID_LEN],
                      dht_cb cb, void *arg, struct dht__lookup **out)
{
    if (n->closing)
        return CM_ECLOSED;
    struct dht__lookup *lk = calloc(1, sizeof *lk);
    if (!lk)
        return CM_ENOMEM;
    lk->n = n;
    lk->kind = kind;
    memcpy(lk->target, target, DHT_ID_LEN);
    lk->cb = cb;
    lk->arg = arg;
    lk->need = VALUE_SOURCES_ENOUGH;
    /* Seed with up to 3k known contacts, not just k: when the k closest we
     * know have all died, the lookup still has live ones to ask (FAILED
     * candidates drop out of the k-window). Contacts that failed their last
     * request are used only when nothing else is known. */
    struct dht_contact *init = malloc(MAX_CAND * sizeof *init);
    if (!init) {
        free(lk);
        return CM_ENOMEM;
    }
    size_t ni = dht_table_closest_ex(&n->table, target, init, MAX_CAND, 1);
    if (ni < DHT_ALPHA)
        ni = dht_table_closest(&n->table, target, init, MAX_CAND);
    for (size_t i = 0; i < ni; i++)
        add_cand(lk, &init[i], 1);
    free(init);
    int bi = dht_id_bucket(n->id, target);
    if (bi >= 0)
        n->table.b[bi].last_lookup_ms = p2p_now_ms();
    /* Start on the next loop turn so callbacks never run inside the call. */
    uv_timer_init(p2p_ctx_loop(n->ctx), &lk->start_timer);
    lk->start_timer.data = lk;
    n->lookup_handles++;
    uv_timer_start(&lk->start_timer, lookup_start_cb, 0, 0);
    lk->next = n->lookups;
    if (n->lookups)
        n->lookups->prev = lk;
    n->lookups = lk;
    if (out)
        *out = lk;
    return CM_OK;
}

int dht_find_node_async(struct dht_node *n, const uint8_t target[DHT_ID_LEN], dht_cb cb,
                        void *arg)
{
    return lookup_new(n, LK_NODE, target, cb, arg, NULL);
}

int dht_get_async(struct dht_node *n, const void *key, size_t klen, dht_cb cb, void *arg)
{
    return dht_get_async_ex(n, key, klen, 0, cb, arg);
}

int dht_get_async_ex(struct dht_node *n, const void *key, size_t klen, unsigned flags, dht_cb cb, void *arg)
{
    if (!key || klen == 0 || (flags & ~(unsigned)DHT_GET_GRACE))
        return CM_EINVAL;
    uint8_t id[DHT_ID_LEN];
    dht_key_id(key, klen, id);
    struct dht__lookup *lk;
    int rc = lookup_new(n, LK_VALUE, id, cb, arg, &lk);
    if (rc)
        return rc;
    hint_use(lk);
    lk->grace = (flags & DHT_GET_GRACE) != 0;
    /* Our own store counts as one source (hop 0). */
    const struct dht_record *mine[DHT_MAX_VALUE_RECORDS];
    size_t m = dht_store_get(&n->store, id, p2p_now_ms(), mine, DHT_MAX_VALUE_RECORDS);
    for (size_t i = 0; i < m; i++)
        merge_record(lk, mine[i]);
    if (m) {
        lk->sources = 1;
        lk->value_hop = 0;
    }
    return CM_OK;
}

static int store_record_async(struct dht_node *n, const struct dht_record *r, dht_cb cb,
                              void *arg)
{
    struct dht__lookup *lk;
    int rc = lookup_new(n, LK_STORE, r->key, cb, arg, &lk);
    if (rc)
        return rc;
    if (dht_record_copy(&lk->store_rec, r)) {
        lk->cb = NULL; /* runs as a plain lookup and finishes silently */
        lk->kind = LK_NODE;
        return CM_ENOMEM;
    }
    lk->has_store_rec = 1;
    return CM_OK;
}

static void own_remember(struct dht_node *n, const struct dht_record *r)
{
    size_t count = 0;
    for (struct dht__own *o = n->own; o; o = o->next, count++)
        if (!memcmp(o->rec.key, r->key, DHT_ID_LEN) && same_entry(&o->rec, r)) {
            struct dht_record c;
            if (dht_record_copy(&c, r) == CM_OK) {
                dht_record_cleanup(&o->rec);
                o->rec = c;
            }
            return;
        }
    if (count >= MAX_OWN)
        return;
    struct dht__own *o = calloc(1, sizeof *o);
    if (!o || dht_record_copy(&o->rec, r)) {
        free(o);
        return;
    }
    o->next = n->own;
    n->own = o;
}

int dht_put_async(struct dht_node *n, const void *key, size_t klen, const void *subkey,
                  size_t sklen, const void *value, size_t vlen, int64_t expires_ms, dht_cb cb,
                  void *arg)
{
    if (!key || klen == 0 || sklen > DHT_MAX_SUBKEY || vlen > DHT_MAX_VALUE ||
        (vlen && !value) || (sklen && !subkey))
        return CM_EINVAL;
    int64_t now = p2p_now_ms();
    if (expires_ms <= now)
        return CM_EEXPIRED;
    if (expires_ms > now + n->store.max_ttl_ms)
        return CM_ERANGE;
    struct dht_record r = {.subkey = (uint8_t *)subkey, .subkey_len = sklen,
                           .value = (uint8_t *)value, .value_len = vlen, .expires_ms = expires_ms};
    dht_key_id(key, klen, r.key);
    int rc = dht_record_sign(&r, n->key);
    if (rc)
        return rc;
    rc = store_record_async(n, &r, cb, arg);
    if (rc == CM_OK)
        own_remember(n, &r);
    return rc;
}

/* ---- serving ----------------------------------------------------------- */

static int on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                      const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct dht_node *n = arg;
    (void)h;
    n->st.rpcs_served++;
    dht__seen_peer(n, from);
    uint8_t target[DHT_ID_LEN];
    struct dht_contact near[DHT_K];
    switch (type) {
    case P2P_MSG_DHT_FIND_NODE: {
        if (dht_msg_parse_find(body, len, target))
            return CM_EPARSE;
        size_t nn = dht_table_closest_ex(&n->table, target, near, DHT_K, 1);
        return dht_msg_encode_nodes(near, nn, resp, rlen);
    }
    case P2P_MSG_DHT_FIND_VALUE: {
        if (dht_msg_parse_find(body, len, target))
            return CM_EPARSE;
        const struct dht_record *rec[DHT_MAX_VALUE_RECORDS];
        size_t nr = dht_store_get(&n->store, target, p2p_now_ms(), rec, DHT_MAX_VALUE_RECORDS);
        size_t nn = dht_table_closest_ex(&n->table, target, near, DHT_K, 1);
        return dht_msg_encode_values(rec, nr, near, nn, VALUES_MAX_BYTES, resp, rlen);
    }
    case P2P_MSG_DHT_STORE: {
        struct dht_msg_records st;
        if (dht_msg_parse_store(body, len, &st))
            return CM_EPARSE;
        int32_t status[DHT_MAX_STORE_RECORDS];
        int64_t now = p2p_now_ms();
        for (size_t i = 0; i < st.n; i++)
            status[i] = dht_record_verify(&st.rec[i]) ? CM_EBADSIG
                                                      : dht_store_put(&n->store, &st.rec[i], now);
        int rc = dht_msg_encode_store_result(status, st.n, resp, rlen);
        dht_msg_records_cleanup(&st);
        return rc;
    }
    default:
        return n->on_other ? n->on_other(n->on_other_arg, h, from, type, body, len, resp, rlen)
                           : CM_EUNSUPPORTED;
    }
}

/* ---- maintenance ------------------------------------------------------- */

void dht_node_refresh_now(struct dht_node *n)
{
    int64_t now = p2p_now_ms();
    for (int i = 0; i < 256; i++) {
        struct dht_bucket *b = &n->table.b[i];
        if (b->n == 0 || now - b->last_lookup_ms < (int64_t)n->refresh_ms)
            continue;
        uint8_t target[DHT_ID_LEN];
        dht_id_random_in_bucket(n->id, i, target);
        if (dht_find_node_async(n, target, NULL, NULL) == CM_OK)
            n->st.refreshes++;
    }
    n->last_refresh_ms = now;
}

void dht_node_republish_now(struct dht_node *n)
{
    int64_t now = p2p_now_ms();
    struct dht__own **pp = &n->own;
    while (*pp) {
        struct dht__own *o = *pp;
        if (o->rec.expires_ms <= now) {
            *pp = o->next;
            dht_record_cleanup(&o->rec);
            free(o);
            continue;
        }
        if (store_record_async(n, &o->rec, NULL, NULL) == CM_OK)
            n->st.republished++;
        pp = &o->next;
    }
    n->last_republish_ms = now;
}

static void node_timer_cb(uv_timer_t *t)
{
    struct dht_node *n = t->data;
    int64_t now = p2p_now_ms();
    if (now - n->last_purge_ms >= 60000 || now - n->last_purge_ms >= (int64_t)n->refresh_ms) {
        dht_store_purge(&n->store, now);
        n->last_purge_ms = now;
    }
    if (now - n->last_refresh_ms >= (int64_t)n->refresh_ms)
        dht_node_refresh_now(n);
    if (now - n->last_republish_ms >= (int64_t)n->republish_ms)
        dht_node_republish_now(n);
}

/* ---- lifecycle --------------------------------------------------------- */

int dht_node_new(struct p2p_ctx *ctx, const struct dht_config *cfg, struct dht_node **out)
{
    if (!ctx || !cfg->key || !cfg->token)
        return CM_EINVAL;
    struct dht_node *n = calloc(1, sizeof *n);
    if (!n)
        return CM_ENOMEM;
    n->ctx = ctx;
    n->key = cfg->key;
    n->serving = cfg->listen_ip != NULL;
    dht_id_of_pub(cfg->key->pub, n->id);
    n->rpc_timeout_ms = cfg->rpc_timeout_ms ? cfg->rpc_timeout_ms : 3000;
    n->on_other = cfg->on_other;
    n->on_other_arg = cfg->on_other_arg;
    n->refresh_ms = cfg->refresh_interval_ms ? cfg->refresh_interval_ms : 15 * 60 * 1000;
    n->republish_ms = cfg->republish_interval_ms ? cfg->republish_interval_ms : 10 * 60 * 1000;
    int64_t now = p2p_now_ms();
    n->last_refresh_ms = n->last_republish_ms = n->last_purge_ms = now;
    dht_table_init(&n->table, n->id, now);
    int rc = dht_store_init(&n->store, cfg->max_records, 0, 0);
    if (rc) {
        free(n);
        return rc;
    }
    struct p2p_host_config hc = {.key = cfg->key, .token = cfg->token,
                                 .listen_ip = cfg->listen_ip, .listen_port = cfg->listen_port,
                                 .advertise_port = cfg->advertise_port, .on_request = on_request,
                                 .arg = n};
    rc = p2p_host_new(ctx, &hc, &n->host);
    if (!rc && cfg->relay && cfg->listen_ip && (rc = p2p_host_relay_enable(n->host, cfg->relay)))
        p2p_host_close(n->host);
    if (rc) {
        dht_store_cleanup(&n->store);
        free(n);
        return rc;
    }
    uint32_t period = n->refresh_ms < n->republish_ms ? n->refresh_ms : n->republish_ms;
    period = period / 4 < 1000 ? 1000 : period / 4 > 15000 ? 15000 : period / 4;
    uv_timer_init(p2p_ctx_loop(ctx), &n->timer);
    n->timer.data = n;
    /* Spread the timers of in-process swarms so they do not fire together. */
    uint32_t jitter;
    cm_random_bytes(&jitter, sizeof jitter);
    uv_timer_start(&n->timer, node_timer_cb, period + jitter % period, period);
    *out = n;
    return CM_OK;
}

static void node_timer_closed(uv_handle_t *h)
{
    struct dht_node *n = h->data;
    n->timer.data = NULL;
    node_maybe_release(n);
}

static void node_maybe_release(struct dht_node *n)
{
    if (!n->closing || n->lookups || n->lookup_handles || n->timer.data)
        return;
    dht_table_cleanup(&n->table);
    dht_store_cleanup(&n->store);
    free(n->hints);
    n->hints = NULL;
    for (struct dht__own *o = n->own, *x; o; o = x) {
        x = o->next;
        dht_record_cleanup(&o->rec);
        free(o);
    }
    n->own = NULL;
    if (!n->threaded)
        free(n);
}

void dht_node_free(struct dht_node *n)
{
    if (!n || n->closing)
        return;
    n->closing = 1;
    /* Fails every request in flight: lookups see CM_ECLOSED and finish. */
    p2p_host_close(n->host);
    n->host = NULL;
    /* Lookups that had not started yet finish now. */
    while (n->lookups) {
        struct dht__lookup *lk = n->lookups;
        uv_timer_stop(&lk->start_timer);
        lookup_finish(lk);
    }
    uv_timer_stop(&n->timer);
    uv_close((uv_handle_t *)&n->timer, node_timer_closed);
}

uint16_t dht_node_port(const struct dht_node *n)
{
    return n->host ? p2p_host_port(n->host) : 0;
}

const uint8_t *dht_node_id(const struct dht_node *n)
{
    return n->id;
}

struct p2p_host *dht_node_host(struct dht_node *n)
{
    return n->host;
}

void dht_node_get_stats(const struct dht_node *n, struct dht_node_stats *out)
{
    *out = n->st;
    out->routing_contacts = n->table.count;
    out->records = n->store.nrecords;
    out->approx_bytes = sizeof *n + dht_table_bytes(&n->table) + dht_store_bytes(&n->store);
}

const struct dht_record *dht_result_plain(const struct dht_result *res)
{
    for (size_t i = 0; i < res->nrec; i++)
        if (res->rec[i].subkey_len == 0)
            return &res->rec[i];
    return NULL;
}
