/* DHT nodes over loopback sockets: the threaded API (dht_node_start, the
 * blocking put/get from other threads, bootstrap by address), dictionary
 * values written by several peers, a forged record refused by STORE,
 * republishing after every holder of a record died, and timer-driven bucket
 * refresh. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_msg.h"
#include "dht/dht_node_internal.h"
#include "tests/harness/p2p_swarm.h"

static void test_threaded(void **state)
{
    (void)state;
    struct p2p_tk tk;
    struct p2p_tk_peer pa, pb, pc;
    assert_int_equal(p2p_tk_init(&tk, "run1"), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "a", "1", 600, &pa), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "b", "2", 600, &pb), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "c", "3", 600, &pc), 0);
    struct dht_config ca = {.key = &pa.key, .token = pa.token, .listen_ip = "127.0.0.1",
                            .ctx = {.auth = p2p_tk_auth_config(&tk)}};
    struct dht_node *a, *b, *c;
    assert_int_equal(dht_node_start(&ca, &a), 0);
    char boot[64];
    snprintf(boot, sizeof boot, "127.0.0.1:%u", dht_node_port(a));
    const char *bl[] = {boot};
    struct dht_config cb = ca, cc = ca;
    cb.key = &pb.key;
    cb.token = pb.token;
    cb.bootstrap = bl;
    cb.n_bootstrap = 1;
    cc.key = &pc.key;
    cc.token = pc.token;
    cc.bootstrap = bl;
    cc.n_bootstrap = 1;
    assert_int_equal(dht_node_start(&cb, &b), 0);
    assert_int_equal(dht_node_start(&cc, &c), 0);

    int64_t exp = p2p_now_ms() + 60000;
    int stored = 0;
    assert_int_equal(dht_put(b, "model", 5, NULL, 0, "v1", 2, exp, 5000, &stored), 0);
    assert_true(stored >= 2);
    assert_int_equal(dht_put(b, "progress", 8, "b", 1, "step=3", 6, exp, 5000, &stored), 0);
    assert_int_equal(dht_put(c, "progress", 8, "c", 1, "step=4", 6, exp, 5000, &stored), 0);
    /* c writing subkey "b" makes its own entry; b's stays b's. */
    assert_int_equal(dht_put(c, "progress", 8, "b", 1, "fake", 4, exp, 5000, &stored), 0);

    struct dht_result r;
    assert_int_equal(dht_get(a, "model", 5, 5000, &r), 0);
    const struct dht_record *p = dht_result_plain(&r);
    assert_non_null(p);
    assert_int_equal(p->value_len, 2);
    assert_memory_equal(p->value, "v1", 2);
    dht_result_cleanup(&r);

    assert_int_equal(dht_get(a, "progress", 8, 5000, &r), 0);
    assert_int_equal(r.nrec, 3);
    int ok_b = 0;
    for (size_t i = 0; i < r.nrec; i++)
        if (!memcmp(r.rec[i].author, pb.key.pub, 32)) {
            assert_memory_equal(r.rec[i].subkey, "b", 1);
            assert_memory_equal(r.rec[i].value, "step=3", 6);
            ok_b = 1;
        }
    assert_true(ok_b);
    dht_result_cleanup(&r);

    assert_int_equal(dht_get(c, "absent", 6, 5000, &r), CM_ENOTFOUND);
    dht_result_cleanup(&r);
    /* newest wins: b replaces the plain value with a later expiration */
    assert_int_equal(dht_put(c, "model", 5, NULL, 0, "v2", 2, exp + 1000, 5000, &stored), 0);
    assert_int_equal(dht_get(b, "model", 5, 5000, &r), 0);
    assert_memory_equal(dht_result_plain(&r)->value, "v2", 2);
    dht_result_cleanup(&r);
    /* bad input changes nothing */
    assert_int_equal(dht_put(b, "model", 5, NULL, 0, "x", 1, p2p_now_ms() - 1, 5000, NULL),
                     CM_EEXPIRED);
    assert_int_equal(dht_put(b, NULL, 0, NULL, 0, "x", 1, exp, 5000, NULL), CM_EINVAL);
    struct dht_node_stats st;
    struct p2p_stats net;
    assert_int_equal(dht_stats(a, &st, &net), 0);
    assert_true(st.rpcs_served > 0 && net.requests_served > 0);

    dht_node_stop(c);
    dht_node_stop(b);
    dht_node_stop(a);
    p2p_tk_peer_cleanup(&pa);
    p2p_tk_peer_cleanup(&pb);
    p2p_tk_peer_cleanup(&pc);
    p2p_tk_cleanup(&tk);
}

struct done {
    int n, status, stored;
    int32_t store_status;
    const char *expect;
    int found;
};

static void on_done(void *arg, const struct dht_result *res)
{
    struct done *d = arg;
    d->n++;
    d->status = res->status;
    d->stored = res->stored;
    const struct dht_record *p = dht_result_plain(res);
    if (d->expect && p && p->value_len == strlen(d->expect) &&
        !memcmp(p->value, d->expect, p->value_len))
        d->found++;
}

static void on_store_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *b,
                          size_t len)
{
    struct done *d = arg;
    (void)from;
    struct dht_msg_store_result sr;
    d->status = status;
    if (status == 0 && dht_msg_parse_store_result(b, len, &sr) == 0 && sr.n == 1)
        d->store_status = sr.status[0];
    d->n++;
}

static void test_forged_record(void **state)
{
    (void)state;
    cm_log_set_level(CM_LOG_ERROR);
    struct p2p_swarm s;
    assert_int_equal(p2p_swarm_init(&s, 8, NULL), 0);
    assert_int_equal(p2p_swarm_join(&s, 8), 0);
    struct done d = {0};
    int64_t exp = p2p_now_ms() + 60000;
    assert_int_equal(dht_put_async(s.nodes[1], "cfg", 3, NULL, 0, "good", 4, exp, on_done, &d), 0);
    assert_int_equal(p2p_swarm_run_until(&s, &d.n, 1, 10000), 0);
    /* Node 2 forges a record in node 1's name with a later expiration. */
    struct dht_record r = {.value = (uint8_t *)"evil", .value_len = 4, .expires_ms = exp + 5000};
    dht_key_id("cfg", 3, r.key);
    assert_int_equal(dht_record_sign(&r, &s.peers[2].key), 0);
    memcpy(r.author, s.peers[1].key.pub, 32);
    const struct dht_record *rp = &r;
    uint8_t *body;
    size_t blen;
    assert_int_equal(dht_msg_encode_store(&rp, 1, &body, &blen), 0);
    struct sockaddr_storage sa;
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", dht_node_port(s.nodes[3]));
    p2p_addr_parse(a, &sa);
    struct done sd = {0};
    assert_int_equal(p2p_request(dht_node_host(s.nodes[2]), (struct sockaddr *)&sa,
                                 s.peers[3].key.pub, P2P_MSG_DHT_STORE, body, blen, 3000,
                                 on_store_resp, &sd),
                     0);
    free(body);
    assert_int_equal(p2p_swarm_run_until(&s, &sd.n, 1, 5000), 0);
    assert_int_equal(sd.status, 0);
    assert_int_equal(sd.store_status, CM_EBADSIG);
    struct done g = {.expect = "good"};
    assert_int_equal(dht_get_async(s.nodes[5], "cfg", 3, on_done, &g), 0);
    assert_int_equal(p2p_swarm_run_until(&s, &g.n, 1, 10000), 0);
    assert_int_equal(g.found, 1);
    p2p_swarm_cleanup(&s);
}

static int holds(struct dht_node *n, const char *key)
{
    uint8_t id[32];
    const struct dht_record *out[4];
    dht_key_id(key, strlen(key), id);
    return dht_store_get(&n->store, id, p2p_now_ms(), out, 4) > 0;
}

/* Runs the loop until no live node has a lookup in progress. */
static void run_until_idle(struct p2p_swarm *s, int timeout_ms)
{
    uint64_t end = uv_hrtime() / 1000000 + (uint64_t)timeout_ms;
    for (;;) {
        int busy = 0;
        for (size_t i = 0; i < s->n && !busy; i++)
            busy = s->alive[i] && s->nodes[i]->lookups;
        if (!busy || uv_hrtime() / 1000000 > end)
            return;
        uv_run(&s->loop, UV_RUN_ONCE);
    }
}

static void test_republish(void **state)
{
    (void)state;
    cm_log_set_level(CM_LOG_ERROR);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 2000};
    size_t n = 60;
    assert_int_equal(p2p_swarm_init(&s, n, &o), 0);
    assert_int_equal(p2p_swarm_join(&s, 16), 0);
    struct done d = {0};
    int64_t exp = p2p_now_ms() + 600000;
    assert_int_equal(dht_put_async(s.nodes[7], "ckpt", 4, NULL, 0, "hash", 4, exp, on_done, &d),
                     0);
    assert_int_equal(p2p_swarm_run_until(&s, &d.n, 1, 10000), 0);
    assert_true(d.stored >= DHT_K);
    /* Every holder but the publisher dies. */
    size_t killed = 0;
    for (size_t i = 0; i < n; i++)
        if (i != 7 && holds(s.nodes[i], "ckpt")) {
            p2p_swarm_kill(&s, i);
            killed++;
        }
    assert_true(killed >= DHT_K - 1);
    /* One round of bucket refreshes finds the dead contacts; then the
     * publisher's republish puts the record on the new closest nodes. */
    for (size_t i = 0; i < n; i++)
        if (s.alive[i])
            dht_node_refresh_now(s.nodes[i]);
    run_until_idle(&s, 30000);
    dht_node_republish_now(s.nodes[7]);
    run_until_idle(&s, 30000);
    size_t holders = 0;
    for (size_t i = 0; i < n; i++)
        if (s.alive[i] && i != 7 && holds(s.nodes[i], "ckpt"))
            holders++;
    printf("republish: %zu new holders after killing %zu\n", holders, killed);
    assert_true(holders >= 10);
    struct done g = {.expect = "hash"};
    for (size_t i = 0, asked = 0; i < n && asked < 5; i++)
        if (s.alive[i] && i != 7) {
            assert_int_equal(dht_get_async(s.nodes[i], "ckpt", 4, on_done, &g), 0);
            asked++;
        }
    assert_int_equal(p2p_swarm_run_until(&s, &g.n, 5, 10000), 0);
    assert_int_equal(g.found, 5);
    p2p_swarm_cleanup(&s);
}

static void test_refresh_timer(void **state)
{
    (void)state;
    cm_log_set_level(CM_LOG_ERROR);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.refresh_ms = 1000, .republish_ms = 1000};
    size_t n = 8;
    assert_int_equal(p2p_swarm_init(&s, n, &o), 0);
    assert_int_equal(p2p_swarm_join(&s, 8), 0);
    struct done d = {0};
    assert_int_equal(dht_put_async(s.nodes[1], "k", 1, NULL, 0, "v", 1, p2p_now_ms() + 60000,
                                   on_done, &d),
                     0);
    int dummy = 0;
    p2p_swarm_run_until(&s, &dummy, 1, 3500);
    uint64_t refreshes = 0, republished = 0;
    for (size_t i = 0; i < n; i++) {
        struct dht_node_stats st;
        dht_node_get_stats(s.nodes[i], &st);
        refreshes += st.refreshes;
        republished += st.republished;
    }
    assert_true(refreshes > 0);
    assert_true(republished > 0);
    p2p_swarm_cleanup(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threaded),
        cmocka_unit_test(test_forged_record),
        cmocka_unit_test(test_republish),
        cmocka_unit_test(test_refresh_timer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
