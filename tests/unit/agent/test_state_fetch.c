/* State transfer between two agents' network sides (agent/peer/net.c;
 * docs/protocol.md, "State transfer"): a real state host and a real fetcher
 * on loopback, each a peer_net with its own key and minted pass.
 *
 * Checked: a state of several chunks arrives whole and SHA-256 checked, is
 * written by rename (no ".part" left); a snapshot replaced during the
 * transfer restarts it and the newer one arrives; a peer that has no such
 * state yet records that someone wants it and, with ready_ms, the fetch
 * gives up in about that time; and the idle callback stops a fetch at once
 * (Ctrl-C), both while the peer prepares the state and between chunks,
 * writing nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/peer/net.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "p2p_testkit.h"

struct fixture {
    struct p2p_tk tk;
    struct p2p_tk_peer host_id, fetch_id;
    struct peer_net_config host_cfg, fetch_cfg;
    struct peer_net *host, *fetcher;
    char addr[64];
    char dir[256], dest[300], part[310];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || p2p_tk_init(&f->tk, "run1") || p2p_tk_peer_new(&f->tk, "h", "1", 600, &f->host_id) ||
        p2p_tk_peer_new(&f->tk, "f", "2", 600, &f->fetch_id))
        return -1;
    struct peer_net_config *c[2] = {&f->host_cfg, &f->fetch_cfg};
    struct p2p_tk_peer *id[2] = {&f->host_id, &f->fetch_id};
    for (int i = 0; i < 2; i++) {
        c[i]->key = &id[i]->key;
        c[i]->token = id[i]->token;
        c[i]->run = "run1";
        c[i]->coord_keys = (const uint8_t(*)[CM_ED25519_PUB_LEN])f->tk.coord_pub;
        c[i]->n_coord_keys = 1;
        c[i]->listen_ip = "127.0.0.1";
    }
    if (peer_net_start(&f->host_cfg, &f->host) || peer_net_start(&f->fetch_cfg, &f->fetcher))
        return -1;
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%u", (unsigned)peer_net_state_port(f->host));
    if (ct_tempdir("state-fetch", f->dir, sizeof f->dir) != 0)
        return -1;
    snprintf(f->dest, sizeof f->dest, "%s/latest.ckpt", f->dir);
    snprintf(f->part, sizeof f->part, "%s.part", f->dest);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    peer_net_stop(f->fetcher);
    peer_net_stop(f->host);
    ct_rmrf(f->dir);
    p2p_tk_peer_cleanup(&f->host_id);
    p2p_tk_peer_cleanup(&f->fetch_id);
    p2p_tk_cleanup(&f->tk);
    free(f);
    return 0;
}

static uint8_t *pattern(size_t len, unsigned seed)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (uint8_t)(x >> 24);
    }
    return b;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* What the idle callback does on its k-th call. */
struct idle_ctl {
    struct fixture *f;
    int calls, stop_at;      /* returns 1 from call stop_at on (0: never) */
    int moving;              /* calls that said the chunks were coming */
    int republish_at;        /* on that call, the host replaces its snapshot */
    uint8_t *newer;          /* its bytes (handed over) */
    size_t newer_len;
};

static int idle_cb(void *arg, int moving)
{
    struct idle_ctl *c = arg;
    c->calls++;
    c->moving += moving != 0;
    if (c->republish_at && c->calls == c->republish_at) {
        peer_net_state_publish(c->f->host, 8, c->newer, c->newer_len);
        c->newer = NULL;
    }
    return c->stop_at && c->calls >= c->stop_at;
}

#define BIG (5u * PEER_STATE_CHUNK + 12345u) /* six chunks, the last short */

static void test_whole_state_arrives(void **state)
{
    struct fixture *f = *state;
    uint8_t *want = pattern(BIG, 1), *copy = malloc(BIG);
    assert_non_null(copy);
    memcpy(copy, want, BIG);
    peer_net_state_publish(f->host, 7, copy, BIG);
    struct idle_ctl c = {.f = f};
    int64_t step = -1;
    assert_int_equal(peer_net_state_fetch(f->fetcher, f->addr, f->host_id.key.pub, 7, f->dest, &step,
                                          20000, 0, idle_cb, &c),
                     CM_OK);
    assert_int_equal(step, 7);
    assert_true(c.calls >= 6); /* once before each chunk */
    assert_int_equal(c.moving, c.calls - 1); /* all but the first: the state was ready */
    size_t len = 0;
    char *got = ct_read_file(f->dest, &len);
    assert_non_null(got);
    assert_int_equal(len, BIG);
    assert_memory_equal(got, want, BIG);
    assert_false(exists(f->part));
    free(got);
    free(want);
}

static void test_newer_snapshot_restarts(void **state)
{
    struct fixture *f = *state;
    uint8_t *old = pattern(BIG, 2), *newer = pattern(BIG + 999, 3), *want = malloc(BIG + 999);
    assert_non_null(want);
    memcpy(want, newer, BIG + 999);
    peer_net_state_publish(f->host, 7, old, BIG);
    /* after two chunks of step 7, the host holds step 8 instead */
    struct idle_ctl c = {.f = f, .republish_at = 3, .newer = newer, .newer_len = BIG + 999};
    int64_t step = -1;
    assert_int_equal(peer_net_state_fetch(f->fetcher, f->addr, f->host_id.key.pub, 7, f->dest, &step,
                                          20000, 0, idle_cb, &c),
                     CM_OK);
    assert_null(c.newer);
    assert_int_equal(step, 8);
    size_t len = 0;
    char *got = ct_read_file(f->dest, &len);
    assert_non_null(got);
    assert_int_equal(len, BIG + 999);
    assert_memory_equal(got, want, BIG + 999);
    free(got);
    free(want);
}

static void test_not_ready_gives_up(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(peer_net_state_wanted(f->host), -1);
    int64_t step = -1;
    double t0 = now_s();
    assert_int_equal(peer_net_state_fetch(f->fetcher, f->addr, f->host_id.key.pub, 3, f->dest, &step,
                                          20000, 600, NULL, NULL),
                     CM_EBUSY);
    double took = now_s() - t0;
    assert_true(took >= 0.55 && took < 5);
    assert_int_equal(peer_net_state_wanted(f->host), 3); /* the host knows someone waits */
    assert_false(exists(f->dest));
    /* a snapshot of that step answers the wish */
    peer_net_state_publish(f->host, 3, pattern(1000, 4), 1000);
    assert_int_equal(peer_net_state_wanted(f->host), -1);
}

static void test_ctrl_c_while_preparing(void **state)
{
    struct fixture *f = *state;
    struct idle_ctl c = {.f = f, .stop_at = 3};
    int64_t step = -1;
    double t0 = now_s();
    /* the peer would get 90 s to prepare the state: Ctrl-C must not wait for it */
    assert_int_equal(peer_net_state_fetch(f->fetcher, f->addr, f->host_id.key.pub, 5, f->dest, &step,
                                          90000, 90000, idle_cb, &c),
                     CM_ECANCELED);
    assert_int_equal(c.calls, 3);
    assert_int_equal(c.moving, 0); /* the peer never had it ready */
    assert_true(now_s() - t0 < 5);
    assert_false(exists(f->dest));
    assert_false(exists(f->part));
}

static void test_ctrl_c_between_chunks(void **state)
{
    struct fixture *f = *state;
    peer_net_state_publish(f->host, 9, pattern(BIG, 5), BIG);
    struct idle_ctl c = {.f = f, .stop_at = 4}; /* after three of the six chunks */
    int64_t step = -1;
    assert_int_equal(peer_net_state_fetch(f->fetcher, f->addr, f->host_id.key.pub, 9, f->dest, &step,
                                          90000, 0, idle_cb, &c),
                     CM_ECANCELED);
    assert_int_equal(c.calls, 4);
    assert_int_equal(c.moving, 3);
    assert_false(exists(f->dest));
    assert_false(exists(f->part));
}

/* peer_net_rtt (issue 17, "Measured links"): the round trip on loopback is
 * short; with a host that delays every frame it sends by 60 ms
 * (peer_net_config.latency_ms, the latency emulation) its Pongs are late by
 * that much, and the measurement sees it. The lower bound is exact (an
 * emulated delay cannot be skipped); the upper ones leave room for a busy
 * machine. */
static void test_round_trip(void **state)
{
    struct fixture *f = *state;
    uint8_t host_pub[CM_ED25519_PUB_LEN];
    memcpy(host_pub, f->host_id.key.pub, CM_ED25519_PUB_LEN);
    double rtt = -1;
    assert_int_equal(peer_net_rtt(f->fetcher, f->addr, host_pub, 3, &rtt), CM_OK);
    printf("loopback round trip %.3f ms\n", rtt);
    assert_true(rtt > 0 && rtt < 1000);
    assert_int_equal(peer_net_rtt(f->fetcher, "not an address", host_pub, 3, &rtt), CM_EINVAL);
    assert_int_equal(peer_net_rtt(f->fetcher, f->addr, host_pub, 0, &rtt), CM_EINVAL);

    struct p2p_tk_peer slow_id;
    assert_int_equal(p2p_tk_peer_new(&f->tk, "s", "3", 600, &slow_id), 0);
    struct peer_net_config sc = f->host_cfg;
    sc.key = &slow_id.key;
    sc.token = slow_id.token;
    sc.latency_ms = 60;
    struct peer_net *slow;
    assert_int_equal(peer_net_start(&sc, &slow), CM_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)peer_net_state_port(slow));
    assert_int_equal(peer_net_rtt(f->fetcher, addr, slow_id.key.pub, 3, &rtt), CM_OK);
    printf("round trip to a host that delays its frames by 60 ms: %.3f ms\n", rtt);
    assert_true(rtt >= 60 && rtt < 1060);
    /* a peer that is not there: an error, no reading */
    peer_net_stop(slow);
    assert_true(peer_net_rtt(f->fetcher, addr, slow_id.key.pub, 1, &rtt) != CM_OK);
    assert_true(rtt == 0);
    p2p_tk_peer_cleanup(&slow_id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_whole_state_arrives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_snapshot_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_ready_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ctrl_c_while_preparing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ctrl_c_between_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
