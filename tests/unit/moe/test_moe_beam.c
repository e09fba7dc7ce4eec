/* The batch beam search state machine (common/moe/moe_beam.h, seed
 * 002_2b00836ea4b30f79.txt Appendix C, Algorithm 1) driven by an in-memory
 * oracle of declared experts: random grids, random live experts on a few
 * servers, random banned experts and servers, random scores.
 *
 * - With a beam as wide as every level's candidates it must equal brute
 *   force (the global top k over all live experts).
 * - With a narrow beam it must equal a plain reference implementation of
 *   Algorithm 1 with perfect knowledge (dead prefixes skipped), and every
 *   result must be live, unbanned, sorted, unique, served by a server that
 *   hosts it.
 * - With lookups failing at random the results are still live and sorted.
 * - Each key is asked once per search; a round's keys are distinct; d = 2
 *   takes one round when the best first indices are alive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "moe/moe_beam.h"

#define NSRV 4

struct oracle {
    struct moe_grid g;
    size_t count;
    uint8_t *host;      /* [count][NSRV]: server s hosts expert x */
    uint8_t *ban_uid;   /* [count] */
    int ban_srv[NSRV];
    struct moe_server srv[NSRV];
    double fail_p;      /* probability a lookup fails */
    size_t asked_cap, nasked;
    struct moe_uid *asked;
};

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static double rnd01(void)
{
    return (double)rnd() / 4294967296.0;
}

static size_t lin(const struct moe_grid *g, const struct moe_uid *u)
{
    size_t x = 0;
    for (int i = 0; i < u->n; i++)
        x = x * (size_t)g->size + u->idx[i];
    return x;
}

static void unlin(const struct moe_grid *g, size_t x, struct moe_uid *u)
{
    u->n = g->dims;
    for (int i = g->dims - 1; i >= 0; i--) {
        u->idx[i] = (uint16_t)(x % (size_t)g->size);
        x /= (size_t)g->size;
    }
}

static int is_prefix(const struct moe_uid *p, const struct moe_uid *u)
{
    for (int i = 0; i < p->n; i++)
        if (p->idx[i] != u->idx[i])
            return 0;
    return 1;
}

/* Expert x is live: some unbanned server hosts it. */
static int live_srv(const struct oracle *o, size_t x, int s)
{
    return o->host[x * NSRV + (size_t)s] && !o->ban_srv[s];
}
static int live(const struct oracle *o, size_t x)
{
    for (int s = 0; s < NSRV; s++)
        if (live_srv(o, x, s))
            return 1;
    return 0;
}

/* A prefix is live: some live expert under it. */
static int prefix_live(const struct oracle *o, const struct moe_uid *p)
{
    for (size_t x = 0; x < o->count; x++) {
        struct moe_uid u;
        unlin(&o->g, x, &u);
        if (is_prefix(p, &u) && live(o, x))
            return 1;
    }
    return 0;
}

/* The DHT's answer for prefix p: one entry per server declaring under it
 * (banned servers too: the DHT does not know they are dead). */
static size_t oracle_entries(const struct oracle *o, const struct moe_uid *p,
                             struct moe_entry *e)
{
    size_t ne = 0;
    for (int s = 0; s < NSRV; s++) {
        struct moe_entry en;
        memset(&en, 0, sizeof en);
        en.rec.kind = p->n == o->g.dims - 1 ? MOE_REC_LEAF : MOE_REC_INNER;
        en.rec.size = o->g.size;
        for (size_t x = 0; x < o->count; x++) {
            struct moe_uid u;
            unlin(&o->g, x, &u);
            if (o->host[x * NSRV + (size_t)s] && is_prefix(p, &u)) {
                int j = u.idx[p->n];
                if (!moe_rec_has(&en.rec, j))
                    en.rec.count++;
                en.rec.child[j >> 6] |= 1ull << (j & 63);
            }
        }
        if (!en.rec.count)
            continue;
        memcpy(en.author, o->srv[s].pub, 32);
        en.expires_ms = 1000 + s;
        if (en.rec.kind == MOE_REC_LEAF)
            en.rec.server = o->srv[s];
        e[ne++] = en;
    }
    return ne;
}

static void oracle_new(struct oracle *o, int d, int m, double p_live, double p_ban_uid)
{
    memset(o, 0, sizeof *o);
    assert_int_equal(moe_grid_init(&o->g, "ffn", d, m), CM_OK);
    o->count = (size_t)moe_grid_count(&o->g);
    o->host = calloc(o->count * NSRV, 1);
    o->ban_uid = calloc(o->count, 1);
    for (size_t x = 0; x < o->count; x++) {
        if (rnd01() < p_live) {
            o->host[x * NSRV + rnd() % NSRV] = 1;
            if (rnd01() < 0.3)
                o->host[x * NSRV + rnd() % NSRV] = 1; /* a replica */
        }
        o->ban_uid[x] = rnd01() < p_ban_uid;
    }
    for (int s = 0; s < NSRV; s++) {
        snprintf(o->srv[s].addr, sizeof o->srv[s].addr, "10.0.0.%d:%d", s + 1, 4000 + s);
        memset(o->srv[s].pub, 0x10 + s, 32);
        o->ban_srv[s] = rnd01() < 0.15;
    }
}

static void oracle_free(struct oracle *o)
{
    free(o->host);
    free(o->ban_uid);
    free(o->asked);
}

static struct moe_beam *run_beam(struct oracle *o, const float *scores, size_t B, int k, int W)
{
    struct moe_uid bu[4096];
    uint8_t bs[NSRV][32];
    struct moe_ban ban = {.uids = bu, .servers = (const uint8_t(*)[32])bs};
    for (size_t x = 0; x < o->count; x++)
        if (o->ban_uid[x])
            unlin(&o->g, x, &bu[ban.nuids++]);
    for (int s = 0; s < NSRV; s++)
        if (o->ban_srv[s])
            memcpy(bs[ban.nservers++], o->srv[s].pub, 32);
    struct moe_beam *b;
    assert_int_equal(moe_beam_new(&o->g, scores, B, k, W, &ban, &b), CM_OK);
    struct moe_entry *e = calloc(NSRV, sizeof *e);
    o->nasked = 0;
    unsigned rounds = 0;
    while (!moe_beam_done(b)) {
        size_t n = moe_beam_nwanted(b);
        assert_true(n > 0);
        rounds++;
        assert_int_equal(moe_beam_round(b), rounds);
        struct moe_uid *ps = malloc(n * sizeof *ps);
        for (size_t i = 0; i < n; i++)
            ps[i] = *moe_beam_wanted(b, i);
        for (size_t i = 0; i < n; i++) {
            /* each key once per search (hence once per round) */
            for (size_t a = 0; a < o->nasked; a++)
                assert_false(moe_uid_equal(&o->asked[a], &ps[i]));
            if (o->nasked == o->asked_cap) {
                o->asked_cap = o->asked_cap ? 2 * o->asked_cap : 64;
                o->asked = realloc(o->asked, o->asked_cap * sizeof *o->asked);
            }
            o->asked[o->nasked++] = ps[i];
            assert_int_equal(moe_prefix_check(&o->g, &ps[i]), CM_OK);
        }
        for (size_t i = 0; i < n; i++) {
            if (o->fail_p > 0 && rnd01() < o->fail_p) {
                assert_int_equal(moe_beam_feed(b, &ps[i], CM_ETIMEOUT, NULL, 0), CM_OK);
                continue;
            }
            size_t ne = oracle_entries(o, &ps[i], e);
            int st = ne ? CM_OK : CM_ENOTFOUND;
            assert_int_equal(moe_beam_feed(b, &ps[i], st, e, ne), CM_OK);
            /* fed twice: refused */
            assert_int_equal(moe_beam_feed(b, &ps[i], st, e, ne), CM_EINVAL);
        }
        free(ps);
    }
    free(e);
    return b;
}

struct scored {
    struct moe_uid u;
    float score;
};

static int scored_cmp(const void *x, const void *y)
{
    const struct scored *a = x, *b = y;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    for (int i = 0; i < a->u.n; i++)
        if (a->u.idx[i] != b->u.idx[i])
            return a->u.idx[i] < b->u.idx[i] ? -1 : 1;
    return 0;
}

static float sum_score(const struct oracle *o, const float *sc, const struct moe_uid *u)
{
    float s = 0;
    for (int i = 0; i < u->n; i++)
        s += sc[(size_t)i * (size_t)o->g.size + u->idx[i]];
    return s;
}

/* The global top k over live, unbanned experts. */
static size_t brute(const struct oracle *o, const float *sc, int k, struct scored *out)
{
    struct scored *all = malloc(o->count * sizeof *all);
    size_t n = 0;
    for (size_t x = 0; x < o->count; x++)
        if (live(o, x) && !o->ban_uid[x]) {
            unlin(&o->g, x, &all[n].u);
            all[n].score = sum_score(o, sc, &all[n].u);
            n++;
        }
    qsort(all, n, sizeof *all, scored_cmp);
    size_t m = n < (size_t)k ? n : (size_t)k;
    memcpy(out, all, m * sizeof *out);
    free(all);
    return m;
}

/* Algorithm 1 with perfect knowledge: at each level the W best live
 * candidates (level 1: all first indices; after: live suffixes). */
static size_t reference(const struct oracle *o, const float *sc, int k, int W, struct scored *out)
{
    int d = o->g.dims;
    struct scored *beam = malloc(sizeof *beam), *cand = NULL;
    size_t nbeam = 1;
    beam[0].u.n = 0;
    beam[0].score = 0;
    for (int lvl = 1; lvl <= d; lvl++) {
        size_t nc = 0;
        cand = malloc(nbeam * (size_t)o->g.size * sizeof *cand);
        for (size_t e = 0; e < nbeam; e++)
            for (int j = 0; j < o->g.size; j++) {
                struct scored c = beam[e];
                c.u.idx[c.u.n++] = (uint16_t)j;
                c.score = beam[e].score + sc[(size_t)(lvl - 1) * (size_t)o->g.size + (size_t)j];
                int ok = lvl == d ? live(o, lin(&o->g, &c.u)) && !o->ban_uid[lin(&o->g, &c.u)]
                                  : prefix_live(o, &c.u);
                if (ok)
                    cand[nc++] = c;
            }
        qsort(cand, nc, sizeof *cand, scored_cmp);
        size_t keep = nc < (size_t)(lvl == d ? k : W) ? nc : (size_t)(lvl == d ? k : W);
        free(beam);
        beam = cand;
        nbeam = keep;
    }
    memcpy(out, beam, nbeam * sizeof *out);
    free(beam);
    return nbeam;
}

static void check_result(const struct oracle *o, struct moe_beam *b, size_t s, const float *sc,
                         int k)
{
    const struct moe_pick *p;
    size_t n = moe_beam_result(b, s, &p);
    assert_true(n <= (size_t)k);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(moe_uid_check(&o->g, &p[i].uid), CM_OK);
        size_t x = lin(&o->g, &p[i].uid);
        assert_false(o->ban_uid[x]);
        const struct moe_server *srv = moe_beam_server(b, p[i].server);
        assert_non_null(srv);
        int si = -1;
        for (int q = 0; q < NSRV; q++)
            if (!memcmp(o->srv[q].pub, srv->pub, 32))
                si = q;
        assert_true(si >= 0);
        assert_true(live_srv(o, x, si)); /* that server hosts it and is not banned */
        assert_string_equal(o->srv[si].addr, srv->addr);
        assert_true(p[i].score == sum_score(o, sc, &p[i].uid));
        if (i) {
            struct scored a = {p[i - 1].uid, p[i - 1].score}, c = {p[i].uid, p[i].score};
            assert_true(scored_cmp(&a, &c) < 0); /* sorted, no duplicates */
        }
    }
}

static void compare(struct moe_beam *b, size_t s, const struct scored *want, size_t nwant)
{
    const struct moe_pick *p;
    size_t n = moe_beam_result(b, s, &p);
    if (n != nwant)
        fail_msg("sample %zu: %zu results, want %zu", s, n, nwant);
    for (size_t i = 0; i < n; i++) {
        if (!moe_uid_equal(&p[i].uid, &want[i].u))
            fail_msg("sample %zu result %zu differs", s, i);
        assert_true(p[i].score == want[i].score);
    }
}

static float *random_scores(const struct moe_grid *g, size_t B)
{
    size_t n = B * (size_t)g->dims * (size_t)g->size;
    float *sc = malloc(n * sizeof *sc);
    for (size_t i = 0; i < n; i++)
        sc[i] = (float)(rnd01() * 2 - 1);
    return sc;
}

/* Wide beams: equal to brute force. */
static void test_wide_equals_brute(void **state)
{
    (void)state;
    const int shapes[][3] = {/* d, M, W >= M^(d-1) */
                             {1, 16, 4}, {1, 64, 8}, {2, 8, 8}, {2, 16, 16}, {3, 4, 16},
                             {3, 5, 25}, {4, 3, 27}};
    int trials = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 25; t++) {
            struct oracle o;
            oracle_new(&o, shapes[sh][0], shapes[sh][1], 0.2 + 0.7 * rnd01(), 0.1 * rnd01());
            size_t B = 1 + rnd() % 6;
            int W = shapes[sh][2];
            int k = 1 + (int)(rnd() % 4);
            if (k > W)
                k = W;
            float *sc = random_scores(&o.g, B);
            struct moe_beam *b = run_beam(&o, sc, B, k, W);
            for (size_t s = 0; s < B; s++) {
                const float *ss = sc + s * (size_t)o.g.dims * (size_t)o.g.size;
                struct scored want[MOE_BEAM_MAX_K];
                size_t nw = brute(&o, ss, k, want);
                compare(b, s, want, nw);
                check_result(&o, b, s, ss, k);
            }
            moe_beam_free(b);
            free(sc);
            oracle_free(&o);
            trials++;
        }
    printf("wide beam == brute force: %d random trials\n", trials);
}

/* Narrow beams: equal to the reference Algorithm 1; results always live. */
static void test_narrow_equals_reference(void **state)
{
    (void)state;
    const int shapes[][2] = {{1, 32}, {2, 16}, {2, 32}, {3, 6}, {3, 8}, {4, 4}};
    int trials = 0, differ_from_brute = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 20; t++) {
            struct oracle o;
            oracle_new(&o, shapes[sh][0], shapes[sh][1], 0.05 + 0.6 * rnd01(), 0.1 * rnd01());
            size_t B = 1 + rnd() % 8;
            int k = 1 + (int)(rnd() % 4);
            int W = k + (int)(rnd() % 3);
            float *sc = random_scores(&o.g, B);
            struct moe_beam *b = run_beam(&o, sc, B, k, W);
            for (size_t s = 0; s < B; s++) {
                const float *ss = sc + s * (size_t)o.g.dims * (size_t)o.g.size;
                struct scored want[MOE_BEAM_MAX_K], glob[MOE_BEAM_MAX_K];
                size_t nw = reference(&o, ss, k, W, want);
                compare(b, s, want, nw);
                check_result(&o, b, s, ss, k);
                size_t ng = brute(&o, ss, k, glob);
                differ_from_brute += ng != nw || (nw && !moe_uid_equal(&glob[0].u, &want[0].u));
            }
            moe_beam_free(b);
            free(sc);
            oracle_free(&o);
            trials++;
        }
    printf("narrow beam == reference: %d trials (%d samples where the beam missed the global "
           "top-k, as a beam may)\n",
           trials, differ_from_brute);
}

/* Lookups failing at random: still only live, unbanned, sorted experts. */
static void test_failures(void **state)
{
    (void)state;
    for (int t = 0; t < 60; t++) {
        struct oracle o;
        oracle_new(&o, 1 + t % 3, 8, 0.5, 0.05);
        o.fail_p = 0.3;
        size_t B = 1 + rnd() % 8;
        float *sc = random_scores(&o.g, B);
        struct moe_beam *b = run_beam(&o, sc, B, 3, 4);
        struct moe_beam_stats st;
        moe_beam_get_stats(b, &st);
        for (size_t s = 0; s < B; s++)
            check_result(&o, b, s, sc + s * (size_t)o.g.dims * (size_t)o.g.size, 3);
        moe_beam_free(b);
        free(sc);
        oracle_free(&o);
    }
}

/* d = 2 with every first index alive: one round, at most B * W keys, the
 * union across the batch. */
static void test_rounds_and_union(void **state)
{
    (void)state;
    struct oracle o;
    oracle_new(&o, 2, 64, 1.0, 0.0);
    for (int s = 0; s < NSRV; s++)
        o.ban_srv[s] = 0;
    size_t B = 64;
    float *sc = random_scores(&o.g, B);
    /* every sample prefers first indices 0..3, the same keys */
    for (size_t s = 0; s < B; s++)
        for (int j = 0; j < 4; j++)
            sc[s * 2 * 64 + (size_t)j] = 5.0f + (float)j;
    struct moe_beam *b = run_beam(&o, sc, B, 4, 4);
    struct moe_beam_stats st;
    moe_beam_get_stats(b, &st);
    assert_int_equal(st.rounds, 1);
    assert_int_equal(st.lookups, 4);
    for (size_t s = 0; s < B; s++) {
        const struct moe_pick *p;
        assert_int_equal(moe_beam_result(b, s, &p), 4);
        assert_true(p[0].uid.idx[0] <= 3);
    }
    moe_beam_free(b);
    free(sc);
    oracle_free(&o);
}

static void test_bad_input(void **state)
{
    (void)state;
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 4), CM_OK);
    float sc[2 * 4] = {0};
    struct moe_beam *b = NULL;
    assert_int_equal(moe_beam_new(&g, sc, 1, 0, 0, NULL, &b), CM_EINVAL);
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 1, NULL, &b), CM_EINVAL);
    assert_int_equal(moe_beam_new(&g, sc, 0, 2, 2, NULL, &b), CM_EINVAL);
    assert_int_equal(moe_beam_new(&g, sc, 1, 65, 65, NULL, &b), CM_EINVAL);
    sc[3] = INFINITY;
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 2, NULL, &b), CM_EINVAL);
    sc[3] = 0;
    struct moe_uid bad = {.n = 2, .idx = {0, 4}};
    struct moe_ban ban = {.uids = &bad, .nuids = 1};
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 2, &ban, &b), CM_EINVAL);
    assert_null(b);
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 2, NULL, &b), CM_OK);
    assert_false(moe_beam_done(b));
    assert_int_equal(moe_beam_nwanted(b), 2);
    struct moe_uid p = *moe_beam_wanted(b, 0), other = {.n = 1, .idx = {3}};
    if (moe_uid_equal(&p, &other))
        other.idx[0] = 2;
    /* not wanted */
    assert_int_equal(moe_beam_feed(b, &other, CM_ENOTFOUND, NULL, 0), CM_EINVAL);
    /* wrong record kind for the depth (length 1 of d = 2 is a leaf) */
    struct moe_entry e;
    memset(&e, 0, sizeof e);
    e.rec.kind = MOE_REC_INNER;
    e.rec.size = 4;
    e.rec.count = 1;
    e.rec.child[0] = 1;
    assert_int_equal(moe_beam_feed(b, &p, CM_OK, &e, 1), CM_EINVAL);
    e.rec.kind = MOE_REC_LEAF;
    e.rec.size = 8;
    assert_int_equal(moe_beam_feed(b, &p, CM_OK, &e, 1), CM_EINVAL);
    assert_true(moe_beam_is_pending(b, &p)); /* unchanged */
    const struct moe_pick *res;
    assert_int_equal(moe_beam_result(b, 0, &res), 0);
    assert_null(res);
    moe_beam_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wide_equals_brute),
        cmocka_unit_test(test_narrow_equals_reference),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_rounds_and_union),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
