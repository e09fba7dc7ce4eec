/* Throughput probes' pure parts (common/p2p/p2p_probe.[ch]; docs/protocol.md,
 * "Link probes"): the PROBE_PULL request's bounds and the one-prober-at-a-
 * time rule the backbone and the state hosts apply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_probe.h"

static void test_pull_parse(void **state)
{
    (void)state;
    uint8_t b[5];
    uint32_t want = 0;
    p2p_probe_pull_encode(P2P_PROBE_CHUNK, b);
    assert_int_equal(p2p_probe_pull_parse(b, 4, &want), CM_OK);
    assert_int_equal(want, P2P_PROBE_CHUNK);
    p2p_probe_pull_encode(1, b);
    assert_int_equal(p2p_probe_pull_parse(b, 4, &want), CM_OK);
    assert_int_equal(want, 1);
    /* out of bounds or malformed: refused, *want untouched */
    want = 77;
    p2p_probe_pull_encode(0, b);
    assert_int_equal(p2p_probe_pull_parse(b, 4, &want), CM_ERANGE);
    p2p_probe_pull_encode(P2P_PROBE_CHUNK + 1, b);
    assert_int_equal(p2p_probe_pull_parse(b, 4, &want), CM_ERANGE);
    memset(b, 0xff, sizeof b);
    assert_int_equal(p2p_probe_pull_parse(b, 4, &want), CM_ERANGE);
    assert_int_equal(p2p_probe_pull_parse(b, 3, &want), CM_EPARSE);
    assert_int_equal(p2p_probe_pull_parse(b, 5, &want), CM_EPARSE);
    assert_int_equal(p2p_probe_pull_parse(NULL, 4, &want), CM_EPARSE);
    assert_int_equal(want, 77);
}

static void test_one_prober_at_a_time(void **state)
{
    (void)state;
    struct p2p_probe_hold h = {0};
    uint8_t a[32], b[32];
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    int64_t t = 1000000;
    assert_int_equal(p2p_probe_admit(&h, a, t), CM_OK);
    assert_int_equal(p2p_probe_admit(&h, a, t + 100), CM_OK);      /* the prober goes on */
    assert_int_equal(p2p_probe_admit(&h, b, t + 200), CM_EBUSY);   /* another waits */
    assert_int_equal(p2p_probe_admit(&h, b, t + 100 + P2P_PROBE_HOLD_MS - 1), CM_EBUSY);
    assert_int_equal(p2p_probe_admit(&h, b, t + 100 + P2P_PROBE_HOLD_MS), CM_OK); /* a fell silent */
    assert_int_equal(p2p_probe_admit(&h, a, t + 100 + P2P_PROBE_HOLD_MS + 10), CM_EBUSY);
}

static void test_slots(void **state)
{
    (void)state;
    struct p2p_probe_hold h = {.slots = 3};
    uint8_t k[5][32];
    for (int i = 0; i < 5; i++)
        memset(k[i], i + 1, 32);
    int64_t t = 5000000;
    for (int i = 0; i < 3; i++)
        assert_int_equal(p2p_probe_admit(&h, k[i], t), CM_OK);
    assert_int_equal(p2p_probe_admit(&h, k[3], t + 10), CM_EBUSY); /* all three held */
    assert_int_equal(p2p_probe_admit(&h, k[1], t + 1000), CM_OK);  /* k1 goes on */
    /* k0 and k2 fell silent: their slots free up, k1's does not */
    assert_int_equal(p2p_probe_admit(&h, k[3], t + P2P_PROBE_HOLD_MS), CM_OK);
    assert_int_equal(p2p_probe_admit(&h, k[4], t + P2P_PROBE_HOLD_MS), CM_OK);
    assert_int_equal(p2p_probe_admit(&h, k[0], t + P2P_PROBE_HOLD_MS + 1), CM_EBUSY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_parse),
        cmocka_unit_test(test_one_prober_at_a_time),
        cmocka_unit_test(test_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
