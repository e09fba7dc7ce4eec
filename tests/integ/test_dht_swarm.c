/* A swarm of 1,000 DHT nodes in one process on loopback (real sockets, real
 * signed protocol): every stored value is found from a sample of nodes, the
 * mean lookup depth stays within log2(N), and after 30% of the nodes are
 * killed the values stored before are still found. CT_SWARM_N overrides N. */
/* ct-timeout: 300 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "tests/harness/p2p_swarm.h"

#define NKEYS 40
#define SAMPLE 5

struct get_state {
    int done, found, hops_sum, mismatched;
    const char *expect;
};

static void get_cb(void *arg, const struct dht_result *res)
{
    struct get_state *g = arg;
    g->done++;
    const struct dht_record *p = dht_result_plain(res);
    if (res->status == CM_OK && p) {
        if (p->value_len == strlen(g->expect) && !memcmp(p->value, g->expect, p->value_len)) {
            g->found++;
            g->hops_sum += res->hops;
        } else {
            g->mismatched++;
        }
    } else {
        printf("swarm: get %s failed: %s (%d records, %d contacted, %zu closest)\n", g->expect,
               cm_strerror(res->status), (int)res->nrec, res->contacted, res->nclosest);
    }
}

struct put_state {
    int done, ok, min_stored;
};

static void put_cb(void *arg, const struct dht_result *res)
{
    struct put_state *p = arg;
    p->done++;
    if (res->status == CM_OK)
        p->ok++;
    if (res->stored < p->min_stored || p->min_stored == 0)
        p->min_stored = res->stored;
}

static size_t pick_alive(struct p2p_swarm *s)
{
    for (;;) {
        size_t i = (size_t)rand() % s->n;
        if (s->alive[i])
            return i;
    }
}

static char values[NKEYS][32], keys[NKEYS][32];

/* Gets every key from SAMPLE random live nodes; returns found count. */
static int check_all(struct p2p_swarm *s, double *mean_hops)
{
    struct get_state g[NKEYS];
    int started = 0, done_total = 0, found = 0, hops = 0;
    memset(g, 0, sizeof g);
    for (int k = 0; k < NKEYS; k++) {
        g[k].expect = values[k];
        for (int j = 0; j < SAMPLE; j++) {
            assert_int_equal(dht_get_async(s->nodes[pick_alive(s)], keys[k], strlen(keys[k]),
                                           get_cb, &g[k]),
                             0);
            started++;
        }
    }
    for (;;) {
        done_total = 0;
        for (int k = 0; k < NKEYS; k++)
            done_total += g[k].done;
        if (done_total >= started)
            break;
        uv_run(&s->loop, UV_RUN_ONCE);
    }
    for (int k = 0; k < NKEYS; k++) {
        found += g[k].found;
        hops += g[k].hops_sum;
        assert_int_equal(g[k].mismatched, 0);
    }
    *mean_hops = found ? (double)hops / found : 0;
    struct p2p_stats st;
    p2p_ctx_stats(s->ctx, &st);
    printf("swarm: net: %llu requests, %llu ok, %llu timeouts, %llu drops, %llu conns opened, "
           "%llu evicted, %llu refused, %llu retried, %llu waited for a descriptor, %zu open\n",
           (unsigned long long)st.requests_sent, (unsigned long long)st.responses_ok,
           (unsigned long long)st.timeouts, (unsigned long long)st.drops,
           (unsigned long long)st.conns_opened, (unsigned long long)st.conns_evicted,
           (unsigned long long)st.conns_refused, (unsigned long long)st.retries,
           (unsigned long long)st.conns_waited,
           p2p_ctx_conn_count(s->ctx));
    for (int r = 0; r < P2P_REJ_COUNT; r++)
        if (p2p_auth_rejects(p2p_ctx_auth(s->ctx), r))
            printf("swarm: rejected %s: %llu\n", p2p_reject_name(r),
                   (unsigned long long)p2p_auth_rejects(p2p_ctx_auth(s->ctx), r));
    return found;
}

static void test_swarm(void **state)
{
    (void)state;
    const char *env = getenv("CT_SWARM_N");
    size_t n = env ? (size_t)atol(env) : 1000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    srand(12345);
    cm_log_set_level(CM_LOG_ERROR);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.rpc_timeout_ms = 3000};
    uint64_t t0 = uv_hrtime();
    assert_int_equal(p2p_swarm_init(&s, n, &o), 0);
    assert_int_equal(p2p_swarm_join(&s, 32), 0);
    uint64_t t1 = uv_hrtime();
    size_t contacts = 0;
    for (size_t i = 0; i < n; i++) {
        struct dht_node_stats st;
        dht_node_get_stats(s.nodes[i], &st);
        contacts += st.routing_contacts;
    }
    printf("swarm: %zu nodes joined in %.1f s (%zu retried), mean routing contacts %.1f\n", n,
           (double)(t1 - t0) / 1e9, s.join_failures, (double)contacts / n);

    struct put_state p = {0};
    int64_t exp = p2p_now_ms() + 3600 * 1000;
    for (int k = 0; k < NKEYS; k++) {
        snprintf(keys[k], sizeof keys[k], "key-%d", k);
        snprintf(values[k], sizeof values[k], "value-%d-%d", k, rand());
        assert_int_equal(dht_put_async(s.nodes[pick_alive(&s)], keys[k], strlen(keys[k]), NULL, 0,
                                       values[k], strlen(values[k]), exp, put_cb, &p),
                         0);
    }
    assert_int_equal(p2p_swarm_run_until(&s, &p.done, NKEYS, 60000), 0);
    assert_int_equal(p.ok, NKEYS);
    printf("swarm: %d values stored, fewest replicas %d\n", NKEYS, p.min_stored);
    assert_true(p.min_stored >= DHT_K / 2);

    double hops;
    uint64_t t2 = uv_hrtime();
    int found = check_all(&s, &hops);
    uint64_t t3 = uv_hrtime();
    printf("swarm: found %d/%d from random nodes, mean hops %.2f (log2 N = %.2f), %.1f ms per "
           "get\n",
           found, NKEYS * SAMPLE, hops, log2((double)n), (double)(t3 - t2) / 1e6 / (NKEYS * SAMPLE));
    assert_int_equal(found, NKEYS * SAMPLE);
    assert_true(hops <= log2((double)n));

    /* Kill 30% of the nodes, chosen at random (the bootstrap node too). */
    size_t killed = 0;
    while (killed < n * 3 / 10) {
        size_t i = (size_t)rand() % n;
        if (s.alive[i]) {
            p2p_swarm_kill(&s, i);
            killed++;
        }
    }
    uint64_t t4 = uv_hrtime();
    found = check_all(&s, &hops);
    uint64_t t5 = uv_hrtime();
    printf("swarm: after killing %zu nodes: found %d/%d, mean hops %.2f, %.1f ms per get\n",
           killed, found, NKEYS * SAMPLE, hops, (double)(t5 - t4) / 1e6 / (NKEYS * SAMPLE));
    assert_int_equal(found, NKEYS * SAMPLE);
    p2p_swarm_cleanup(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_swarm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
