/* Unit tests for agent/pipe/records.c: the stage agents' DHT record values
 * are taken only in their canonical form, with every field in range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "agent/pipe/records.h"
#include "cm_err.h"

static int peers(const char *v, char *st, char *ar)
{
    return pipe_peers_parse((const uint8_t *)v, strlen(v), st, ar);
}

static int ready(const char *v, int64_t version, uint32_t S, int64_t *hv, int *hs, int64_t *done)
{
    return pipe_ready_parse((const uint8_t *)v, strlen(v), version, S, hv, hs, done);
}

static void test_peers(void **state)
{
    (void)state;
    char st[PEER_ADDR_MAX], ar[PEER_ADDR_MAX];
    assert_int_equal(peers("10.0.0.1:4000 10.0.0.1:4001", st, ar), CM_OK);
    assert_string_equal(st, "10.0.0.1:4000");
    assert_string_equal(ar, "10.0.0.1:4001");
    assert_int_equal(peers("[::1]:4000 [::1]:4001", st, ar), CM_OK);
    static const char *bad[] = {"", " ", "10.0.0.1:4000", "10.0.0.1:4000 ", " 10.0.0.1:4001",
                                "10.0.0.1:4000  10.0.0.1:4001", "10.0.0.1 10.0.0.1:4001", "host:1 10.0.0.1:4001",
                                "10.0.0.1:4000 10.0.0.1:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(peers(bad[i], st, ar), CM_EPARSE);
    uint8_t nul[] = "10.0.0.1:4000 10.0.0.1:4001";
    nul[3] = 0;
    assert_int_equal(pipe_peers_parse(nul, sizeof nul - 1, st, ar), CM_EPARSE);
    char longv[200];
    memset(longv, '1', sizeof longv);
    longv[100] = ' ';
    assert_int_equal(pipe_peers_parse((const uint8_t *)longv, sizeof longv, st, ar), CM_EPARSE);
}

static void test_ready(void **state)
{
    (void)state;
    int64_t hv, done;
    int hs;
    assert_int_equal(ready("3 1 12", 5, 2, &hv, &hs, &done), CM_OK);
    assert_true(hv == 3 && hs == 1 && done == 12);
    assert_int_equal(ready("0 -1 0", 1, 2, &hv, &hs, &done), CM_OK);
    assert_true(hv == 0 && hs == -1 && done == 0);
    static const char *bad[] = {"", "3 1", "3 1 12 ", " 3 1 12", "3  1 12", "+3 1 12", "03 1 12", "3 1 12x",
                                "5 1 12",   /* not below the version it was written for */
                                "-1 1 12", "3 2 12", /* stage outside the run's */
                                "3 -2 12", "3 1 -1", "3 1 99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ready(bad[i], 5, 2, &hv, &hs, &done), CM_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_ready),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
