/* The batch beam search state machine (see moe_beam.h): seed
 * 002_2b00836ea4b30f79.txt, Appendix C, Algorithm 1 "SelectExperts", with
 * dead prefixes replaced by the next candidates and the batch's lookups
 * merged into rounds. Pure: no I/O, no clock; the drivers are in
 * moe_beam_dht.c. */
#include "moe/moe_beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

enum { N_UNKNOWN, N_WANTED, N_ALIVE, N_DEAD };

/* What we know of one prefix key. */
struct bnode {
    struct moe_uid p;
    int state;
    uint64_t child[MOE_MAX_SIZE / 64]; /* live suffixes (banned authors left out) */
    int32_t *srv;                      /* leaf: server per suffix, -1 none */
};

struct cand {
    struct moe_uid p;
    float score;
};

struct sample {
    int lvl;            /* length of the prefixes being chosen, 1 .. d */
    int done;
    struct cand *beam;  /* chosen prefixes of length lvl - 1 */
    size_t nbeam;
    struct moe_pick *res;
    size_t nres;
};

struct moe_beam {
    struct moe_grid g;
    size_t batch;
    int k, width;
    float *scores;
    struct moe_uid *ban_uids;
    size_t nban_uids;
    uint8_t (*ban_srv)[32];
    size_t nban_srv;
    /* prefix -> node, open addressing over indices into nodes */
    struct bnode *nodes;
    size_t nnodes, capnodes;
    int32_t *slots;
    size_t nslots;
    struct moe_server *servers;
    size_t nservers, capservers;
    size_t *wanted; /* node indices of this round */
    size_t nwanted, capwanted, pending;
    struct sample *s;
    int done;
    struct moe_beam_stats st;
    struct cand *tmp; /* candidate scratch */
    size_t captmp;
};

/* ---- small helpers -------------------------------------------------------- */

static int uid_cmp(const struct moe_uid *a, const struct moe_uid *b)
{
    int n = a->n < b->n ? a->n : b->n;
    for (int i = 0; i < n; i++)
        if (a->idx[i] != b->idx[i])
            return a->idx[i] < b->idx[i] ? -1 : 1;
    return a->n == b->n ? 0 : a->n < b->n ? -1 : 1;
}

/* Best first: higher score, then the smaller uid. */
static int cand_cmp(const void *x, const void *y)
{
    const struct cand *a = x, *b = y;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return uid_cmp(&a->p, &b->p);
}

static uint64_t uid_hash(const struct moe_uid *u)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)u->n;
    for (int i = 0; i < u->n; i++)
        h = (h ^ u->idx[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static float score_of(const struct moe_beam *b, size_t s, int dim, int j)
{
    return b->scores[(s * (size_t)b->g.dims + (size_t)dim) * (size_t)b->g.size + (size_t)j];
}

static int has(const uint64_t *bits, int i)
{
    return (int)((bits[i >> 6] >> (i & 63)) & 1u);
}

static int banned_uid(const struct moe_beam *b, const struct moe_uid *u)
{
    for (size_t i = 0; i < b->nban_uids; i++)
        if (moe_uid_equal(&b->ban_uids[i], u))
            return 1;
    return 0;
}

static int banned_srv(const struct moe_beam *b, const uint8_t pub[32])
{
    for (size_t i = 0; i < b->nban_srv; i++)
        if (!memcmp(b->ban_srv[i], pub, 32))
            return 1;
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return CM_OK;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return CM_ENOMEM;
    *p = q;
    *cap = c;
    return CM_OK;
}

/* ---- node table ----------------------------------------------------------- */

static int32_t node_find(const struct moe_beam *b, const struct moe_uid *p)
{
    size_t mask = b->nslots - 1;
    for (size_t i = uid_hash(p) & mask;; i = (i + 1) & mask) {
        int32_t v = b->slots[i];
        if (v < 0)
            return -1;
        if (moe_uid_equal(&b->nodes[v].p, p))
            return v;
    }
}

static int rehash(struct moe_beam *b, size_t nslots)
{
    int32_t *s = malloc(nslots * sizeof *s);
    if (!s)
        return CM_ENOMEM;
    for (size_t i = 0; i < nslots; i++)
        s[i] = -1;
    for (size_t n = 0; n < b->nnodes; n++) {
        size_t i = uid_hash(&b->nodes[n].p) & (nslots - 1);
        while (s[i] >= 0)
            i = (i + 1) & (nslots - 1);
        s[i] = (int32_t)n;
    }
    free(b->slots);
    b->slots = s;
    b->nslots = nslots;
    return CM_OK;
}

/* The node of prefix p, created UNKNOWN when new; -1 without memory. */
static int32_t node_get(struct moe_beam *b, const struct moe_uid *p)
{
    int32_t v = node_find(b, p);
    if (v >= 0)
        return v;
    if ((b->nnodes + 1) * 2 > b->nslots && rehash(b, b->nslots * 2))
        return -1;
    if (grow((void **)&b->nodes, &b->capnodes, b->nnodes + 1, sizeof *b->nodes))
        return -1;
    struct bnode *nd = &b->nodes[b->nnodes];
    memset(nd, 0, sizeof *nd);
    nd->p = *p;
    nd->state = N_UNKNOWN;
    size_t i = uid_hash(p) & (b->nslots - 1);
    while (b->slots[i] >= 0)
        i = (i + 1) & (b->nslots - 1);
    b->slots[i] = (int32_t)b->nnodes;
    return (int32_t)b->nnodes++;
}

static int server_index(struct moe_beam *b, const struct moe_server *srv)
{
    for (size_t i = 0; i < b->nservers; i++)
        if (!memcmp(b->servers[i].pub, srv->pub, 32) && !strcmp(b->servers[i].addr, srv->addr))
            return (int)i;
    if (grow((void **)&b->servers, &b->capservers, b->nservers + 1, sizeof *b->servers))
        return -1;
    b->servers[b->nservers] = *srv;
    return (int)b->nservers++;
}

/* ---- one sample's step ---------------------------------------------------- */

/* Candidates of sample s at its level into b->tmp, sorted best first. */
static int candidates(struct moe_beam *b, size_t si, size_t *nout)
{
    struct sample *s = &b->s[si];
    int dim = s->lvl - 1;
    size_t n = 0;
    for (size_t e = 0; e < s->nbeam; e++) {
        const struct cand *pc = &s->beam[e];
        const struct bnode *pn = NULL;
        if (!(s->lvl == 1 && b->g.dims > 1)) {
            int32_t v = node_find(b, &pc->p);
            if (v < 0)
                return CM_EINTERNAL;
            pn = &b->nodes[v];
        }
        for (int j = 0; j < b->g.size; j++) {
            /* Level 1 of a grid with d > 1: every first index is a candidate
               (Algorithm 1's "all 1-prefixes"); else the live suffixes. */
            if (pn && !has(pn->child, j))
                continue;
            if (grow((void **)&b->tmp, &b->captmp, n + 1, sizeof *b->tmp))
                return CM_ENOMEM;
            struct cand *c = &b->tmp[n];
            c->p = pc->p;
            c->p.idx[c->p.n++] = (uint16_t)j;
            c->score = pc->score + score_of(b, si, dim, j);
            if (s->lvl == b->g.dims && banned_uid(b, &c->p))
                continue;
            n++;
        }
    }
    qsort(b->tmp, n, sizeof *b->tmp, cand_cmp);
    *nout = n;
    return CM_OK;
}

static int want(struct moe_beam *b, int32_t v)
{
    if (b->nodes[v].state != N_UNKNOWN)
        return CM_OK;
    if (grow((void **)&b->wanted, &b->capwanted, b->nwanted + 1, sizeof *b->wanted))
        return CM_ENOMEM;
    b->wanted[b->nwanted++] = (size_t)v;
    b->nodes[v].state = N_WANTED;
    b->pending++;
    return CM_OK;
}

/* Advances sample si as far as what is known allows; adds the keys it
 * needs to the round. */
static int sample_step(struct moe_beam *b, size_t si)
{
    struct sample *s = &b->s[si];
    const int d = b->g.dims;
    while (!s->done) {
        if (s->lvl == 1 && d == 1) {
            /* d = 1: the root key is the leaf record of every expert. */
            int32_t v = node_get(b, &s->beam[0].p);
            if (v < 0)
                return CM_ENOMEM;
            if (b->nodes[v].state == N_DEAD) {
                s->done = 1;
                break;
            }
            if (b->nodes[v].state != N_ALIVE)
                return want(b, v);
        }
        size_t nc;
        int rc = candidates(b, si, &nc);
        if (rc)
            return rc;
        if (s->lvl == d) {
            /* The last level: experts, alive by their leaf record. */
            size_t m = 0;
            for (size_t i = 0; i < nc && m < (size_t)b->k; i++) {
                struct moe_uid par;
                moe_uid_prefix(&b->tmp[i].p, d - 1, &par);
                const struct bnode *pn = &b->nodes[node_find(b, &par)];
                int32_t srv = pn->srv ? pn->srv[b->tmp[i].p.idx[d - 1]] : -1;
                if (srv < 0)
                    continue;
                s->res[m++] = (struct moe_pick){.uid = b->tmp[i].p, .score = b->tmp[i].score,
                                                .server = srv};
            }
            s->nres = m;
            s->done = 1;
            break;
        }
        /* W best candidates not known dead; wait for the unknown ones. */
        size_t take = 0, waiting = 0;
        for (size_t i = 0; i < nc && take < (size_t)b->width; i++) {
            int32_t v = node_get(b, &b->tmp[i].p);
            if (v < 0)
                return CM_ENOMEM;
            int st = b->nodes[v].state;
            if (st == N_DEAD)
                continue;
            take++;
            if (st != N_ALIVE) {
                waiting++;
                if ((rc = want(b, v)))
                    return rc;
            }
        }
        if (waiting)
            break;
        /* All alive: they are the beam of this level. */
        size_t m = 0;
        for (size_t i = 0; i < nc && m < take; i++)
            if (b->nodes[node_find(b, &b->tmp[i].p)].state == N_ALIVE)
                s->beam[m++] = b->tmp[i];
        s->nbeam = m;
        s->lvl++;
        if (m == 0) {
            s->done = 1; /* no live prefix at all */
            s->nres = 0;
        }
    }
    return CM_OK;
}

/* Starts the next round: every sample steps; done when nothing is wanted. */
static int advance(struct moe_beam *b)
{
    b->nwanted = 0;
    b->pending = 0;
    for (size_t i = 0; i < b->batch; i++) {
        int rc = sample_step(b, i);
        if (rc)
            return rc;
    }
    if (b->nwanted)
        b->st.rounds++;
    else
        b->done = 1;
    return CM_OK;
}

/* ---- public ---------------------------------------------------------------- */

void moe_beam_free(struct moe_beam *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nnodes; i++)
        free(b->nodes[i].srv);
    if (b->s)
        for (size_t i = 0; i < b->batch; i++) {
            free(b->s[i].beam);
            free(b->s[i].res);
        }
    free(b->s);
    free(b->nodes);
    free(b->slots);
    free(b->servers);
    free(b->wanted);
    free(b->tmp);
    free(b->scores);
    free(b->ban_uids);
    free(b->ban_srv);
    free(b);
}

int moe_beam_new(const struct moe_grid *g, const float *scores, size_t batch, int k, int width,
                 const struct moe_ban *ban, struct moe_beam **out)
{
    if (!out || !scores || moe_grid_check(g))
        return CM_EINVAL;
    if (width == 0)
        width = k;
    if (k < 1 || k > MOE_BEAM_MAX_K || width < k || width > MOE_BEAM_MAX_WIDTH || batch < 1 ||
        batch > MOE_BEAM_MAX_BATCH)
        return CM_EINVAL;
    size_t ns = batch * (size_t)g->dims * (size_t)g->size;
    for (size_t i = 0; i < ns; i++)
        if (!isfinite(scores[i]))
            return CM_EINVAL;
    if (ban) {
        if ((ban->nuids && !ban->uids) || (ban->nservers && !ban->servers))
            return CM_EINVAL;
        for (size_t i = 0; i < ban->nuids; i++)
            if (moe_uid_check(g, &ban->uids[i]))
                return CM_EINVAL;
    }
    struct moe_beam *b = calloc(1, sizeof *b);
    if (!b)
        return CM_ENOMEM;
    b->g = *g;
    b->batch = batch;
    b->k = k;
    b->width = width;
    b->scores = malloc(ns * sizeof *b->scores);
    b->s = calloc(batch, sizeof *b->s);
    int rc = b->scores && b->s ? rehash(b, 64) : CM_ENOMEM;
    if (rc == CM_OK && ban && ban->nuids) {
        b->ban_uids = malloc(ban->nuids * sizeof *b->ban_uids);
        if (b->ban_uids) {
            memcpy(b->ban_uids, ban->uids, ban->nuids * sizeof *b->ban_uids);
            b->nban_uids = ban->nuids;
        } else {
            rc = CM_ENOMEM;
        }
    }
    if (rc == CM_OK && ban && ban->nservers) {
        b->ban_srv = malloc(ban->nservers * 32);
        if (b->ban_srv) {
            memcpy(b->ban_srv, ban->servers, ban->nservers * 32);
            b->nban_srv = ban->nservers;
        } else {
            rc = CM_ENOMEM;
        }
    }
    if (rc) {
        moe_beam_free(b);
        return rc;
    }
    memcpy(b->scores, scores, ns * sizeof *b->scores);
    for (size_t i = 0; i < batch && rc == CM_OK; i++) {
        struct sample *s = &b->s[i];
        s->lvl = 1;
        s->beam = malloc((size_t)width * sizeof *s->beam);
        s->res = malloc((size_t)k * sizeof *s->res);
        if (!s->beam || !s->res)
            rc = CM_ENOMEM;
        else {
            s->beam[0] = (struct cand){.p = {.n = 0}, .score = 0}; /* the root */
            s->nbeam = 1;
        }
    }
    if (rc == CM_OK)
        rc = advance(b);
    if (rc) {
        moe_beam_free(b);
        return rc;
    }
    *out = b;
    return CM_OK;
}

int moe_beam_done(const struct moe_beam *b)
{
    return b->done;
}

unsigned moe_beam_round(const struct moe_beam *b)
{
    return b->st.rounds;
}

size_t moe_beam_nwanted(const struct moe_beam *b)
{
    return b->done ? 0 : b->nwanted;
}

const struct moe_uid *moe_beam_wanted(const struct moe_beam *b, size_t i)
{
    return i < moe_beam_nwanted(b) ? &b->nodes[b->wanted[i]].p : NULL;
}

int moe_beam_is_pending(const struct moe_beam *b, const struct moe_uid *prefix)
{
    if (b->done || !prefix || prefix->n < 0 || prefix->n > MOE_MAX_DIMS)
        return 0;
    int32_t v = node_find(b, prefix);
    return v >= 0 && b->nodes[v].state == N_WANTED;
}

int moe_beam_feed(struct moe_beam *b, const struct moe_uid *prefix, int status,
                  const struct moe_entry *e, size_t ne)
{
    if (!b || !moe_beam_is_pending(b, prefix) || (ne && !e))
        return CM_EINVAL;
    struct bnode *nd = &b->nodes[node_find(b, prefix)];
    int leaf = prefix->n == b->g.dims - 1;
    if (status == CM_OK)
        for (size_t i = 0; i < ne; i++) {
            const struct moe_rec *r = &e[i].rec;
            if (r->size != b->g.size || r->kind != (leaf ? MOE_REC_LEAF : MOE_REC_INNER))
                return CM_EINVAL;
        }
    int32_t *srv = NULL;
    int64_t *best = NULL;
    if (status == CM_OK && leaf && ne) {
        srv = malloc((size_t)b->g.size * sizeof *srv);
        best = malloc((size_t)b->g.size * sizeof *best);
        if (!srv || !best) {
            free(srv);
            free(best);
            return CM_ENOMEM;
        }
        for (int j = 0; j < b->g.size; j++)
            srv[j] = -1;
    }
    uint64_t child[MOE_MAX_SIZE / 64] = {0};
    int any = 0;
    for (size_t i = 0; status == CM_OK && i < ne; i++) {
        const struct moe_rec *r = &e[i].rec;
        if (banned_srv(b, e[i].author) || (leaf && banned_srv(b, r->server.pub)))
            continue;
        int si = -1;
        if (leaf && (si = server_index(b, &r->server)) < 0) {
            free(srv);
            free(best);
            return CM_ENOMEM;
        }
        for (int j = 0; j < b->g.size; j++) {
            if (!has(r->child, j))
                continue;
            if (leaf) {
                /* The freshest declaration of each expert wins. */
                if (srv[j] >= 0 && e[i].expires_ms <= best[j])
                    continue;
                srv[j] = si;
                best[j] = e[i].expires_ms;
            }
            child[j >> 6] |= 1ull << (j & 63);
            any = 1;
        }
    }
    free(best);
    b->st.lookups++;
    b->st.entries += status == CM_OK ? ne : 0;
    if (status != CM_OK)
        b->st.failed++;
    memcpy(nd->child, child, sizeof child);
    nd->srv = srv;
    nd->state = any ? N_ALIVE : N_DEAD;
    if (!any) {
        free(nd->srv);
        nd->srv = NULL;
    }
    if (--b->pending == 0)
        return advance(b);
    return CM_OK;
}

size_t moe_beam_result(const struct moe_beam *b, size_t s, const struct moe_pick **out)
{
    if (!b->done || s >= b->batch) {
        if (out)
            *out = NULL;
        return 0;
    }
    if (out)
        *out = b->s[s].res;
    return b->s[s].nres;
}

const struct moe_server *moe_beam_server(const struct moe_beam *b, int i)
{
    return i >= 0 && (size_t)i < b->nservers ? &b->servers[i] : NULL;
}

void moe_beam_get_stats(const struct moe_beam *b, struct moe_beam_stats *out)
{
    *out = b->st;
}

const struct moe_grid *moe_beam_grid(const struct moe_beam *b)
{
    return &b->g;
}
