/* Unit tests of relay entries and relay choice (agent/peer/relay_rank.c;
 * docs/p2p.md, "Relays in the agent"): entries parse in their three forms
 * and nothing else; a relay that holds fewer reservations, or that we
 * measured faster, comes first; the backbone comes last; and agents that
 * see the same equal relays (they arrived together) spread over them
 * instead of all taking the first one, which is what happened before (in
 * a test_hosts run three of four NAT'ed agents used one relay). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "agent/peer/relay_rank.h"

static int parse(const char *v, struct peer_relay_cand *c)
{
    memset(c, 0, sizeof *c);
    return peer_relay_entry_parse((const uint8_t *)v, strlen(v), c);
}

static void test_entries(void **state)
{
    (void)state;
    struct peer_relay_cand c;
    assert_int_equal(parse("10.0.0.5:4100", &c), 0);
    assert_string_equal(c.addr, "10.0.0.5:4100");
    assert_int_equal(c.load, 0);
    assert_false(c.backbone);
    assert_int_equal(parse("10.0.0.5:4100 n=3", &c), 0);
    assert_string_equal(c.addr, "10.0.0.5:4100");
    assert_int_equal(c.load, 3);
    assert_int_equal(parse("coord.example.org:7000 backbone", &c), 0);
    assert_string_equal(c.addr, "coord.example.org:7000");
    assert_true(c.backbone);
    char buf[96];
    peer_relay_entry_format(buf, sizeof buf, "[2001:db8::1]:4100", 65535);
    assert_string_equal(buf, "[2001:db8::1]:4100 n=65535");
    assert_int_equal(parse(buf, &c), 0);
    assert_int_equal(c.load, 65535);
    const char *bad[] = {"", " n=1", "10.0.0.5:4100 n=", "10.0.0.5:4100 n=65536", "10.0.0.5:4100 n=-1",
                         "10.0.0.5:4100 n=1x", "10.0.0.5:4100 relay", "10.0.0.5:4100 n=1 backbone",
                         "10.0.0.5:4100 n=0000001", " backbone"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (parse(bad[i], &c) == 0)
            fail_msg("accepted \"%s\"", bad[i]);
    uint8_t nul[] = {'1', ':', '2', 0, 'x'};
    assert_int_equal(peer_relay_entry_parse(nul, sizeof nul, &c), -1);
    char longv[200];
    memset(longv, '1', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    assert_int_equal(parse(longv, &c), -1);
}

static void cand(struct peer_relay_cand *c, uint8_t id, double mbps, double rtt, unsigned load, int backbone)
{
    memset(c, 0, sizeof *c);
    c->pub[0] = id;
    c->pub[31] = 0x77;
    c->mbps = mbps;
    c->rtt_ms = rtt;
    c->load = load;
    c->backbone = backbone;
}

static void test_order(void **state)
{
    (void)state;
    uint8_t me[32] = {9};
    struct peer_relay_cand c[5];
    cand(&c[0], 1, 0, 1e9, 0, 1);  /* the backbone */
    cand(&c[1], 2, 0, 3.0, 0, 0);  /* round trip only, idle */
    cand(&c[2], 3, 0, 3.1, 4, 0);  /* the same round trip, four clients */
    cand(&c[3], 4, 50, 1e9, 0, 0); /* measured */
    cand(&c[4], 5, 200, 1e9, 3, 0); /* measured faster, but three clients: 50 each */
    peer_relay_rank(c, 5, me);
    /* measured first (the two are equal per client: the hash decides which),
       then the idle round trip, the busy one, the backbone */
    assert_true((c[0].pub[0] == 4 && c[1].pub[0] == 5) || (c[0].pub[0] == 5 && c[1].pub[0] == 4));
    assert_int_equal(c[2].pub[0], 2);
    assert_int_equal(c[3].pub[0], 3);
    assert_int_equal(c[4].pub[0], 1);
    /* a faster relay per client wins outright */
    cand(&c[0], 4, 50, 1e9, 0, 0);
    cand(&c[1], 5, 200, 1e9, 1, 0);
    peer_relay_rank(c, 2, me);
    assert_int_equal(c[0].pub[0], 5);
    /* noise in the measurements does not decide: 3.0 vs 3.3 ms is a tie,
       broken the same way on every call */
    cand(&c[0], 2, 0, 3.0, 0, 0);
    cand(&c[1], 3, 0, 3.3, 0, 0);
    peer_relay_rank(c, 2, me);
    uint8_t first = c[0].pub[0];
    cand(&c[0], 3, 0, 3.3, 0, 0);
    cand(&c[1], 2, 0, 3.0, 0, 0);
    peer_relay_rank(c, 2, me);
    assert_int_equal(c[0].pub[0], first);
}

/* 64 agents see the same two idle relays: each takes its first choice. */
static void test_spread(void **state)
{
    (void)state;
    int first[2] = {0, 0};
    for (int a = 0; a < 64; a++) {
        uint8_t me[32] = {0};
        me[0] = (uint8_t)a;
        me[1] = 0x3c;
        struct peer_relay_cand c[2];
        cand(&c[0], 1, 0, 2.0, 0, 0);
        cand(&c[1], 2, 0, 2.2, 0, 0);
        peer_relay_rank(c, 2, me);
        first[c[0].pub[0] - 1]++;
    }
    printf("64 agents, two equal relays: %d and %d first choices\n", first[0], first[1]);
    assert_true(first[0] >= 16 && first[1] >= 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_spread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
