/* Expert declarations on the DHT (common/moe/moe_dht.h): the record codec
 * (round trips, every rejection), the records one server publishes, and
 * real DHT round trips: servers of an in-process swarm declare experts, a
 * trainer node finds the global top k by beam search (in-loop driver),
 * banned servers are avoided, expired declarations are not returned; then
 * the threaded API (dht_node_start): blocking declare, blocking search with
 * and without the cache, moe_dht_find_expert. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "moe/moe_beam.h"
#include "tests/harness/p2p_swarm.h"

static struct moe_rec leaf_rec(int size, const int *idx, int n, const char *addr)
{
    struct moe_rec r;
    memset(&r, 0, sizeof r);
    r.kind = MOE_REC_LEAF;
    r.size = size;
    for (int i = 0; i < n; i++)
        r.child[idx[i] >> 6] |= 1ull << (idx[i] & 63);
    r.count = n;
    snprintf(r.server.addr, sizeof r.server.addr, "%s", addr);
    memset(r.server.pub, 0xab, 32);
    return r;
}

static void test_codec(void **state)
{
    (void)state;
    int idx[] = {0, 5, 63, 64, 1023};
    struct moe_rec r = leaf_rec(1024, idx, 5, "[2001:db8::1]:31337"), back;
    uint8_t buf[MOE_REC_MAX];
    size_t len;
    assert_int_equal(moe_rec_encode(&r, buf, sizeof buf, &len), CM_OK);
    assert_int_equal(len, 6 + 10 + 1 + strlen(r.server.addr) + 32);
    assert_int_equal(moe_rec_decode(buf, len, &back), CM_OK);
    assert_memory_equal(&r, &back, sizeof r);
    /* an inner record: no server part */
    struct moe_rec in = r;
    in.kind = MOE_REC_INNER;
    memset(&in.server, 0, sizeof in.server);
    assert_int_equal(moe_rec_encode(&in, buf, sizeof buf, &len), CM_OK);
    assert_int_equal(len, 16);
    assert_int_equal(moe_rec_decode(buf, len, &back), CM_OK);
    assert_memory_equal(&in, &back, sizeof in);
    /* the largest record fits MOE_REC_MAX */
    struct moe_rec big = leaf_rec(1024, idx, 0, "a");
    memset(big.child, 0xff, sizeof big.child);
    memset(big.server.addr, 'h', MOE_ADDR_MAX - 6);
    memcpy(big.server.addr + MOE_ADDR_MAX - 6, ":65535", 7);
    big.count = 1024;
    assert_int_equal(moe_rec_encode(&big, buf, sizeof buf, &len), CM_OK);
    assert_int_equal(len, MOE_REC_MAX);
    assert_int_equal(moe_rec_decode(buf, len, &back), CM_OK);
    assert_int_equal(back.count, 1024);
    assert_int_equal(moe_rec_encode(&big, buf, MOE_REC_MAX - 1, &len), CM_ETOOBIG);

    /* rejections, each from a valid encoding of r */
    assert_int_equal(moe_rec_encode(&r, buf, sizeof buf, &len), CM_OK);
    uint8_t m[MOE_REC_MAX + 1];
    struct moe_rec keep;
    memset(&keep, 0x5a, sizeof keep);
    back = keep;
#define REJECT(edit, mlen, want)                                                               \
    do {                                                                                       \
        memcpy(m, buf, len);                                                                   \
        edit;                                                                                  \
        assert_int_equal(moe_rec_decode(m, (mlen), &back), (want));                            \
        assert_memory_equal(&back, &keep, sizeof back);                                        \
    } while (0)
    REJECT((void)0, len - 1, CM_EPARSE);                 /* truncated key */
    REJECT(m[len] = 0, len + 1, CM_EPARSE);              /* trailing byte */
    REJECT((void)0, 5, CM_EPARSE);                       /* shorter than a header */
    REJECT(m[0] = 2, len, CM_EVERSION);
    REJECT(m[1] = 3, len, CM_EPARSE);                    /* unknown kind */
    REJECT(m[1] = MOE_REC_INNER, len, CM_EPARSE);        /* inner with a server part */
    REJECT((m[2] = 0, m[3] = 1), len, CM_ERANGE);        /* M = 1 */
    REJECT((m[2] = 4, m[3] = 1), len, CM_ERANGE);        /* M = 1025 */
    REJECT((m[4] = 0, m[5] = 0), len, CM_ERANGE);        /* no suffix */
    REJECT((m[8] = 0, m[9] = 0), len, CM_EPARSE);        /* duplicate 0, 0 */
    REJECT((m[10] = 0, m[11] = 1), len, CM_EPARSE);      /* unsorted 5, 1 */
    REJECT((m[2] = 0, m[3] = 64), len, CM_ERANGE);       /* index 64 >= M */
    REJECT(m[16] = 200, len, CM_EPARSE);                 /* addr_len past the end */
    REJECT(m[17] = 'x', len, CM_EPARSE);                 /* "[" replaced: bad host */
    REJECT(m[17 + 3] = 0, len, CM_EPARSE);               /* NUL inside the address */
    REJECT((void)0, MOE_REC_MAX + 1, CM_ETOOBIG);
#undef REJECT

    /* addresses */
    const char *good[] = {"127.0.0.1:1", "host-a.example:65535", "[::1]:80", "a:9"};
    const char *bad[] = {"127.0.0.1", ":80", "h:0", "h:65536", "h:080", "h:8a", "[::1:80",
                         "h h:80", "h:", "[]:80", "[::g]:80", "h:123456"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        assert_int_equal(moe_addr_check(good[i]), CM_OK);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (moe_addr_check(bad[i]) == CM_OK)
            fail_msg("address \"%s\" accepted", bad[i]);
    struct moe_rec badaddr = leaf_rec(8, idx, 2, "nope");
    assert_int_equal(moe_rec_encode(&badaddr, buf, sizeof buf, &len), CM_EINVAL);
}

static void test_decl_build(void **state)
{
    (void)state;
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 3, 16), CM_OK);
    struct moe_server srv = {.addr = "10.1.2.3:4000"};
    struct moe_uid u[] = {{3, {1, 2, 3}}, {3, {1, 2, 9}}, {3, {1, 4, 0}}, {3, {7, 0, 0}}};
    struct moe_decl d;
    assert_int_equal(moe_decl_build("r", &g, u, 4, &srv, &d), CM_OK);
    /* keys: ffn.1.* ffn.7.* (inner), ffn.1.2.* ffn.1.4.* ffn.7.0.* (leaf) */
    assert_int_equal(d.n, 5);
    const char *keys[] = {"moe.r.ffn.1.*", "moe.r.ffn.7.*", "moe.r.ffn.1.2.*", "moe.r.ffn.1.4.*",
                          "moe.r.ffn.7.0.*"};
    for (int i = 0; i < 5; i++)
        assert_string_equal(d.items[i].key, keys[i]);
    struct moe_rec r;
    assert_int_equal(moe_rec_decode(d.items[0].value, d.items[0].vlen, &r), CM_OK);
    assert_int_equal(r.kind, MOE_REC_INNER);
    assert_int_equal(r.count, 2);
    assert_true(moe_rec_has(&r, 2) && moe_rec_has(&r, 4));
    assert_int_equal(moe_rec_decode(d.items[2].value, d.items[2].vlen, &r), CM_OK);
    assert_int_equal(r.kind, MOE_REC_LEAF);
    assert_true(moe_rec_has(&r, 3) && moe_rec_has(&r, 9) && r.count == 2);
    assert_string_equal(r.server.addr, "10.1.2.3:4000");
    moe_decl_cleanup(&d);
    /* d = 1: the root key only */
    struct moe_grid g1;
    assert_int_equal(moe_grid_init(&g1, "ffn", 1, 16), CM_OK);
    struct moe_uid v[] = {{1, {3}}, {1, {5}}};
    assert_int_equal(moe_decl_build("r", &g1, v, 2, &srv, &d), CM_OK);
    assert_int_equal(d.n, 1);
    assert_string_equal(d.items[0].key, "moe.r.ffn.*");
    moe_decl_cleanup(&d);
    /* bad input builds nothing */
    struct moe_uid dup[] = {{3, {1, 2, 3}}, {3, {1, 2, 3}}};
    d.items = NULL;
    assert_int_equal(moe_decl_build("r", &g, dup, 2, &srv, &d), CM_EINVAL);
    struct moe_uid oor[] = {{3, {1, 2, 16}}};
    assert_int_equal(moe_decl_build("r", &g, oor, 1, &srv, &d), CM_EINVAL);
    struct moe_uid shallow[] = {{2, {1, 2}}};
    assert_int_equal(moe_decl_build("r", &g, shallow, 1, &srv, &d), CM_EINVAL);
    assert_int_equal(moe_decl_build("bad run", &g, u, 1, &srv, &d), CM_EINVAL);
    struct moe_server nosrv = {.addr = "nowhere"};
    assert_int_equal(moe_decl_build("r", &g, u, 1, &nosrv, &d), CM_EINVAL);
    assert_null(d.items);
}

/* ---- a swarm ------------------------------------------------------------- */

#define NODES 24
#define NSERVERS 3
#define RUN "moerun"

struct waiter {
    int done, status;
    size_t keys;
};

static void declared(void *arg, int status, size_t keys)
{
    struct waiter *w = arg;
    w->done = 1;
    w->status = status;
    w->keys = keys;
}

static void searched(void *arg, int status, struct moe_beam *b)
{
    struct waiter *w = arg;
    (void)b;
    w->done = 1;
    w->status = status;
}

struct decl_set {
    struct moe_uid u[64];
    size_t n;
    int64_t expires;
    int banned;
};

static float uid_score(const float *sc, const struct moe_grid *g, const struct moe_uid *u)
{
    float s = 0;
    for (int i = 0; i < u->n; i++)
        s += sc[(size_t)i * (size_t)g->size + u->idx[i]];
    return s;
}

static int lex_less(const struct moe_uid *a, const struct moe_uid *b)
{
    for (int i = 0; i < a->n; i++)
        if (a->idx[i] != b->idx[i])
            return a->idx[i] < b->idx[i];
    return 0;
}

/* The global top k over the declared experts of unbanned, unexpired servers. */
static size_t brute(const struct moe_grid *g, const float *sc, const struct decl_set *ds,
                    int64_t now, int k, struct moe_uid *out)
{
    struct moe_uid all[NSERVERS * 64];
    size_t n = 0;
    for (int s = 0; s < NSERVERS; s++)
        if (!ds[s].banned && ds[s].expires > now)
            for (size_t i = 0; i < ds[s].n; i++) {
                int dup = 0;
                for (size_t j = 0; j < n; j++)
                    dup |= moe_uid_equal(&all[j], &ds[s].u[i]);
                if (!dup)
                    all[n++] = ds[s].u[i];
            }
    for (size_t i = 0; i < n; i++) /* selection sort, best first */
        for (size_t j = i + 1; j < n; j++) {
            float a = uid_score(sc, g, &all[i]), b = uid_score(sc, g, &all[j]);
            if (b > a || (b == a && lex_less(&all[j], &all[i]))) {
                struct moe_uid t = all[i];
                all[i] = all[j];
                all[j] = t;
            }
        }
    size_t m = n < (size_t)k ? n : (size_t)k;
    memcpy(out, all, m * sizeof *out);
    return m;
}

static void search_and_check(struct p2p_swarm *s, const struct moe_grid *g, size_t trainer,
                             struct decl_set *ds, const uint8_t (*pubs)[32])
{
    enum { B = 8, K = 4 };
    float sc[B * 2 * 8];
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++)
        sc[i] = (float)(rand() % 2000 - 1000) / 1000.0f;
    uint8_t ban[NSERVERS][32];
    struct moe_ban bl = {.servers = (const uint8_t(*)[32])ban};
    for (int i = 0; i < NSERVERS; i++)
        if (ds[i].banned)
            memcpy(ban[bl.nservers++], pubs[i], 32);
    struct moe_beam *b;
    /* W = M: the beam holds every live first index, so the result is exact */
    assert_int_equal(moe_beam_new(g, sc, B, K, 8, &bl, &b), CM_OK);
    struct waiter w = {0};
    assert_int_equal(moe_beam_search_async(s->nodes[trainer], RUN, b, 10000, searched, &w), CM_OK);
    assert_int_equal(p2p_swarm_run_until(s, &w.done, 1, 15000), 0);
    assert_int_equal(w.status, CM_OK);
    int64_t now = p2p_now_ms();
    for (size_t i = 0; i < B; i++) {
        struct moe_uid want[K];
        size_t nw = brute(g, sc + i * 16, ds, now, K, want);
        const struct moe_pick *p;
        size_t n = moe_beam_result(b, i, &p);
        assert_int_equal(n, nw);
        for (size_t j = 0; j < n; j++) {
            assert_true(moe_uid_equal(&p[j].uid, &want[j]));
            const struct moe_server *srv = moe_beam_server(b, p[j].server);
            int who = -1;
            for (int q = 0; q < NSERVERS; q++)
                if (!memcmp(srv->pub, pubs[q], 32))
                    who = q;
            assert_true(who >= 0 && !ds[who].banned);
            char want_addr[64];
            snprintf(want_addr, sizeof want_addr, "127.0.0.1:%d", 5000 + who);
            assert_string_equal(srv->addr, want_addr);
        }
    }
    moe_beam_free(b);
}

static void test_swarm(void **state)
{
    (void)state;
    srand(11);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 3000};
    assert_int_equal(p2p_swarm_init(&s, NODES, &o), CM_OK);
    assert_int_equal(p2p_swarm_join(&s, 8), CM_OK);
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 8), CM_OK);
    struct decl_set ds[NSERVERS];
    uint8_t pubs[NSERVERS][32];
    memset(ds, 0, sizeof ds);
    int64_t now = p2p_now_ms();
    for (int sv = 0; sv < NSERVERS; sv++) {
        memcpy(pubs[sv], s.peers[1 + sv].key.pub, 32);
        /* 20 random experts each, overlapping across servers */
        while (ds[sv].n < 20) {
            struct moe_uid u = {.n = 2, .idx = {(uint16_t)(rand() % 8), (uint16_t)(rand() % 8)}};
            int dup = 0;
            for (size_t j = 0; j < ds[sv].n; j++)
                dup |= moe_uid_equal(&u, &ds[sv].u[j]);
            if (!dup)
                ds[sv].u[ds[sv].n++] = u;
        }
        /* server 2's declaration expires soon */
        ds[sv].expires = now + (sv == 2 ? 2500 : 600000);
        struct moe_server srv;
        snprintf(srv.addr, sizeof srv.addr, "127.0.0.1:%d", 5000 + sv);
        memcpy(srv.pub, pubs[sv], 32);
        struct waiter w = {0};
        assert_int_equal(moe_dht_declare_async(s.nodes[1 + sv], RUN, &g, ds[sv].u, ds[sv].n, &srv,
                                               ds[sv].expires, declared, &w),
                         CM_OK);
        assert_int_equal(p2p_swarm_run_until(&s, &w.done, 1, 15000), 0);
        assert_int_equal(w.status, CM_OK);
        assert_true(w.keys >= 1 && w.keys <= 8);
    }
    /* from several trainers */
    for (size_t t = NODES - 3; t < NODES; t++)
        search_and_check(&s, &g, t, ds, (const uint8_t(*)[32])pubs);
    /* a banned server's experts are not used */
    ds[0].banned = 1;
    search_and_check(&s, &g, NODES - 1, ds, (const uint8_t(*)[32])pubs);
    ds[0].banned = 0;
    /* server 2's declaration expires: gone from the results */
    int never = 0;
    p2p_swarm_run_until(&s, &never, 1, (int)(ds[2].expires - p2p_now_ms()) + 200);
    assert_true(p2p_now_ms() > ds[2].expires);
    search_and_check(&s, &g, NODES - 2, ds, (const uint8_t(*)[32])pubs);
    /* Peers that do not answer in time: the search ends at its deadline,
       not the RPCs' (every frame held 2 s). */
    p2p_ctx_set_latency(s.ctx, 2000);
    float sc[2 * 8] = {0};
    struct moe_beam *b;
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 2, NULL, &b), CM_OK);
    struct waiter w = {0};
    int64_t t0 = p2p_now_ms();
    assert_int_equal(moe_beam_search_async(s.nodes[NODES - 1], RUN, b, 300, searched, &w), CM_OK);
    assert_int_equal(p2p_swarm_run_until(&s, &w.done, 1, 5000), 0);
    assert_int_equal(w.status, CM_ETIMEOUT);
    int64_t took = p2p_now_ms() - t0;
    assert_true(took >= 290 && took < 1500);
    moe_beam_free(b); /* lookups still in flight must not touch it */
    int later = 0;
    p2p_swarm_run_until(&s, &later, 1, 2500);
    p2p_ctx_set_latency(s.ctx, 0);
    /* Everyone else gone (refused at once): the search completes quickly
       from what the trainer's own store holds (it is one of the k = 20
       replicas of most keys in a 24-node swarm; declarations live until
       they expire), without waiting for a deadline. */
    for (size_t i = 0; i + 1 < NODES; i++)
        p2p_swarm_kill(&s, i);
    assert_int_equal(moe_beam_new(&g, sc, 1, 2, 2, NULL, &b), CM_OK);
    memset(&w, 0, sizeof w);
    t0 = p2p_now_ms();
    assert_int_equal(moe_beam_search_async(s.nodes[NODES - 1], RUN, b, 5000, searched, &w),
                     CM_OK);
    assert_int_equal(p2p_swarm_run_until(&s, &w.done, 1, 5000), 0);
    assert_int_equal(w.status, CM_OK);
    assert_true(p2p_now_ms() - t0 < 1000);
    assert_true(moe_beam_result(b, 0, NULL) <= 2);
    moe_beam_free(b);
    p2p_swarm_cleanup(&s);
}

/* ---- the threaded API ------------------------------------------------------ */

static void test_threaded(void **state)
{
    (void)state;
    struct p2p_tk tk;
    struct p2p_tk_peer pa, pb;
    assert_int_equal(p2p_tk_init(&tk, RUN), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &pa), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &pb), 0);
    struct dht_config ca = {.key = &pa.key, .token = pa.token, .listen_ip = "127.0.0.1",
                            .ctx = {.auth = p2p_tk_auth_config(&tk)}};
    struct dht_node *a, *b;
    assert_int_equal(dht_node_start(&ca, &a), 0);
    char boot[64];
    snprintf(boot, sizeof boot, "127.0.0.1:%u", dht_node_port(a));
    const char *bl[] = {boot};
    struct dht_config cb = ca;
    cb.key = &pb.key;
    cb.token = pb.token;
    cb.bootstrap = bl;
    cb.n_bootstrap = 1;
    assert_int_equal(dht_node_start(&cb, &b), 0);

    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "att", 3, 4), CM_OK);
    struct moe_uid u[] = {{3, {0, 1, 2}}, {3, {0, 1, 3}}, {3, {2, 0, 0}}, {3, {3, 3, 3}}};
    struct moe_server srv = {.addr = "127.0.0.1:7000"};
    memcpy(srv.pub, pa.key.pub, 32);
    size_t ok = 0;
    assert_int_equal(moe_dht_declare(a, RUN, &g, u, 4, &srv, p2p_now_ms() + 60000, 5000, &ok),
                     CM_OK);
    assert_int_equal(ok, 6); /* att.0.* 2.* 3.* (inner), 0.1.* 2.0.* 3.3.* (leaf) */
    assert_int_equal(moe_dht_declare(a, RUN, &g, u, 4, &srv, p2p_now_ms() - 1, 5000, &ok),
                     CM_EINVAL);

    struct moe_server found[4];
    size_t nf;
    assert_int_equal(moe_dht_find_expert(b, RUN, &g, &u[1], 5000, found, 4, &nf), CM_OK);
    assert_int_equal(nf, 1);
    assert_string_equal(found[0].addr, "127.0.0.1:7000");
    struct moe_uid none = {3, {0, 1, 0}};
    assert_int_equal(moe_dht_find_expert(b, RUN, &g, &none, 5000, found, 4, &nf), CM_ENOTFOUND);

    /* Scores favouring 3.3.3 on two samples, 0.1.2 on one. */
    float sc[3 * 3 * 4] = {0};
    sc[0 * 12 + 0 * 4 + 3] = sc[0 * 12 + 1 * 4 + 3] = sc[0 * 12 + 2 * 4 + 3] = 1;
    sc[1 * 12 + 0 * 4 + 0] = sc[1 * 12 + 1 * 4 + 1] = sc[1 * 12 + 2 * 4 + 2] = 1;
    sc[2 * 12 + 0 * 4 + 3] = 2;
    struct moe_cache *cache;
    assert_int_equal(moe_cache_new(2000, 64, &cache), CM_OK);
    uint64_t miss0 = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct moe_beam *bm;
        assert_int_equal(moe_beam_new(&g, sc, 3, 2, 4, NULL, &bm), CM_OK);
        assert_int_equal(moe_beam_search(b, RUN, bm, 5000, cache), CM_OK);
        const struct moe_pick *p;
        char txt[MOE_UID_TEXT_MAX];
        assert_int_equal(moe_beam_result(bm, 0, &p), 2);
        moe_uid_format(&g, &p[0].uid, txt, sizeof txt);
        assert_string_equal(txt, "att.3.3.3");
        assert_int_equal(moe_beam_result(bm, 1, &p), 2);
        moe_uid_format(&g, &p[0].uid, txt, sizeof txt);
        assert_string_equal(txt, "att.0.1.2");
        assert_int_equal(moe_beam_result(bm, 2, &p), 2);
        moe_uid_format(&g, &p[0].uid, txt, sizeof txt);
        assert_string_equal(txt, "att.3.3.3");
        assert_string_equal(moe_beam_server(bm, p[0].server)->addr, "127.0.0.1:7000");
        struct moe_beam_stats st;
        moe_beam_get_stats(bm, &st);
        moe_beam_free(bm);
        uint64_t hits, misses;
        moe_cache_stats(cache, &hits, &misses);
        if (pass == 0) {
            assert_true(hits == 0 && misses == st.lookups);
            miss0 = misses;
        } else {
            /* the second search: every found key from the cache, only the
               missing one (att.1.*, never cached) looked up again */
            assert_int_equal(hits, st.lookups - st.failed);
            assert_int_equal(misses - miss0, st.failed);
            assert_int_equal(st.failed, 1);
        }
    }
    /* banning the expert: the next best */
    struct moe_ban ban = {.uids = &u[3], .nuids = 1};
    struct moe_beam *bm;
    assert_int_equal(moe_beam_new(&g, sc, 3, 2, 4, &ban, &bm), CM_OK);
    assert_int_equal(moe_beam_search(b, RUN, bm, 5000, cache), CM_OK);
    const struct moe_pick *p;
    size_t n = moe_beam_result(bm, 0, &p);
    for (size_t i = 0; i < n; i++)
        assert_false(moe_uid_equal(&p[i].uid, &u[3]));
    moe_beam_free(bm);
    moe_cache_free(cache);
    dht_node_stop(b);
    dht_node_stop(a);
    p2p_tk_peer_cleanup(&pa);
    p2p_tk_peer_cleanup(&pb);
    p2p_tk_cleanup(&tk);
}

int main(void)
{
    cm_log_set_level(CM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec),
        cmocka_unit_test(test_decl_build),
        cmocka_unit_test(test_swarm),
        cmocka_unit_test(test_threaded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
