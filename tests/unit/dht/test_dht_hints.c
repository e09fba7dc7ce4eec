/* Holder hints (common/dht/dht_node.c): a get of a key this node read
 * before asks the nodes that returned it last time first, so a repeated get
 * (a trainer's beam search reads the same expert prefixes every batch,
 * docs/experts.md) takes one round trip instead of a walk; the records are
 * still read fresh, and a holder that died does not stop the get. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_node.h"
#include "tests/harness/p2p_swarm.h"

#define NODES 300
#define KEYS 12

struct got {
    int done, status, hops, contacted;
    char value[64];
    uint8_t holder[DHT_ID_LEN]; /* one node that answered (closest[0]) */
};

static void got_cb(void *arg, const struct dht_result *res)
{
    struct got *g = arg;
    g->status = res->status;
    g->hops = res->hops;
    g->contacted = res->contacted;
    const struct dht_record *r = dht_result_plain(res);
    if (r && r->value_len < sizeof g->value) {
        memcpy(g->value, r->value, r->value_len);
        g->value[r->value_len] = '\0';
    }
    if (res->nclosest)
        memcpy(g->holder, res->closest[0].id, DHT_ID_LEN);
    g->done = 1;
}

static void put_cb(void *arg, const struct dht_result *res)
{
    struct got *g = arg;
    g->status = res->status;
    g->done = 1;
}

static void get(struct p2p_swarm *s, size_t node, const char *key, struct got *g)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(dht_get_async(s->nodes[node], key, strlen(key), got_cb, g), CM_OK);
    assert_int_equal(p2p_swarm_run_until(s, &g->done, 1, 15000), 0);
}

static void test_repeated_get_asks_the_holders(void **state)
{
    (void)state;
    srand(3);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 2000};
    assert_int_equal(p2p_swarm_init(&s, NODES, &o), CM_OK);
    assert_int_equal(p2p_swarm_join(&s, 16), CM_OK);
    char key[KEYS][32], val[KEYS][32];
    for (int i = 0; i < KEYS; i++) {
        snprintf(key[i], sizeof key[i], "hint-key-%d", i);
        snprintf(val[i], sizeof val[i], "value-%d", i);
        struct got p = {0};
        assert_int_equal(dht_put_async(s.nodes[1], key[i], strlen(key[i]), NULL, 0, val[i],
                                       strlen(val[i]), p2p_now_ms() + 600000, put_cb, &p),
                         CM_OK);
        assert_int_equal(p2p_swarm_run_until(&s, &p.done, 1, 15000), 0);
        assert_int_equal(p.status, CM_OK);
    }
    /* Each key read twice by its own reader: the first walks from the
       reader's table, the second asks the three holders of the first. */
    int first_contacted = 0, walked = 0;
    size_t reader0 = 0; /* key 0's reader: it does not hold key 0 */
    for (int i = 0; i < KEYS; i++) {
        /* a reader that does not hold the key itself (its own store would
           answer at hop 0, with no request) */
        size_t reader = 2 + (size_t)i * 23 % (NODES - 2);
        struct got a, b;
        for (get(&s, reader, key[i], &a); a.hops == 0; get(&s, reader, key[i], &a))
            reader = 2 + (reader + 1) % (NODES - 2);
        if (i == 0)
            reader0 = reader;
        assert_int_equal(a.status, CM_OK);
        assert_string_equal(a.value, val[i]);
        first_contacted += a.contacted;
        walked += a.hops > 1;
        get(&s, reader, key[i], &b);
        assert_int_equal(b.status, CM_OK);
        assert_string_equal(b.value, val[i]);
        assert_int_equal(b.hops, 1);
        assert_int_equal(b.contacted, 3); /* the holders, and nobody else */
    }
    printf("first gets: %d contacted for %d keys, %d needed more than one hop; second gets: 3 each\n",
           first_contacted, KEYS, walked);
    /* Without hints the second gets would cost about what the first did:
       the test means something only if the first ones asked more. */
    assert_true(first_contacted > 3 * KEYS);

    /* A newer value is read, not remembered: the hint is a route only. */
    struct got p = {0};
    assert_int_equal(dht_put_async(s.nodes[1], key[0], strlen(key[0]), NULL, 0, "newer", 5,
                                   p2p_now_ms() + 900000, put_cb, &p),
                     CM_OK);
    assert_int_equal(p2p_swarm_run_until(&s, &p.done, 1, 15000), 0);
    struct got c;
    get(&s, reader0, key[0], &c);
    assert_int_equal(c.status, CM_OK);
    assert_string_equal(c.value, "newer");

    /* A holder that died: the get still finds the key (from the others and
       the table) and costs at most the failed request. */
    get(&s, reader0, key[0], &c);
    size_t dead = NODES;
    for (size_t i = 0; i < NODES; i++)
        if (!memcmp(dht_node_id(s.nodes[i]), c.holder, DHT_ID_LEN))
            dead = i;
    assert_true(dead < NODES && dead != reader0);
    p2p_swarm_kill(&s, dead);
    struct got d;
    get(&s, reader0, key[0], &d);
    assert_int_equal(d.status, CM_OK);
    assert_string_equal(d.value, "newer");
    assert_true(d.contacted > 3);
    p2p_swarm_cleanup(&s);
}

int main(void)
{
    cm_log_set_level(CM_LOG_ERROR);
    p2p_swarm_raise_fd_limit();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeated_get_asks_the_holders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
