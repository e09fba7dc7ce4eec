/* Expert grid and uid text forms (common/moe/moe_grid.h): grid limits,
 * format/parse round trips over whole grids, DHT key names, and every kind
 * of malformed uid or prefix rejected without touching the output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cm_err.h"
#include "moe/moe_grid.h"

static void test_grid_init(void **state)
{
    (void)state;
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 16), CM_OK);
    assert_string_equal(g.name, "ffn");
    assert_int_equal(g.dims, 2);
    assert_int_equal(g.size, 16);
    assert_int_equal(moe_grid_count(&g), 256);
    assert_int_equal(moe_grid_init(&g, "a_0", 1, 2), CM_OK);
    assert_int_equal(moe_grid_init(&g, "x", 4, 1024), CM_OK);
    assert_int_equal(moe_grid_count(&g), 1ull << 40);
    char n32[33], n33[34];
    memset(n32, 'a', 32);
    n32[32] = 0;
    memset(n33, 'a', 33);
    n33[33] = 0;
    assert_int_equal(moe_grid_init(&g, n32, 2, 4), CM_OK);

    struct moe_grid keep = g;
    assert_int_equal(moe_grid_init(&g, n33, 2, 4), CM_ETOOBIG);
    assert_int_equal(moe_grid_init(&g, "", 2, 4), CM_EPARSE);
    assert_int_equal(moe_grid_init(&g, "Ffn", 2, 4), CM_EPARSE);
    assert_int_equal(moe_grid_init(&g, "ff.n", 2, 4), CM_EPARSE);
    assert_int_equal(moe_grid_init(&g, "ff-n", 2, 4), CM_EPARSE);
    assert_int_equal(moe_grid_init(&g, NULL, 2, 4), CM_EINVAL);
    assert_int_equal(moe_grid_init(&g, "ffn", 0, 4), CM_ERANGE);
    assert_int_equal(moe_grid_init(&g, "ffn", 5, 4), CM_ERANGE);
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 1), CM_ERANGE);
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 1025), CM_ERANGE);
    assert_memory_equal(&g, &keep, sizeof g); /* errors change nothing */

    assert_int_equal(moe_run_check("fmnist-2_b"), CM_OK);
    assert_int_equal(moe_run_check(""), CM_EPARSE);
    assert_int_equal(moe_run_check("a.b"), CM_EPARSE);
    assert_int_equal(moe_run_check("a b"), CM_EPARSE);
    char r65[66];
    memset(r65, 'r', 65);
    r65[65] = 0;
    assert_int_equal(moe_run_check(r65), CM_ETOOBIG);
}

/* Every point and prefix of small grids formats and parses back. */
static void test_round_trip(void **state)
{
    (void)state;
    const int shapes[][2] = {{1, 2}, {1, 1024}, {2, 7}, {3, 5}, {4, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        struct moe_grid g;
        assert_int_equal(moe_grid_init(&g, "layer_1", shapes[s][0], shapes[s][1]), CM_OK);
        uint64_t total = moe_grid_count(&g);
        for (uint64_t x = 0; x < total; x++) {
            struct moe_uid u = {.n = g.dims};
            uint64_t r = x;
            for (int i = g.dims - 1; i >= 0; i--) {
                u.idx[i] = (uint16_t)(r % (uint64_t)g.size);
                r /= (uint64_t)g.size;
            }
            char buf[MOE_UID_TEXT_MAX], key[MOE_KEY_MAX];
            assert_int_equal(moe_uid_format(&g, &u, buf, sizeof buf), CM_OK);
            struct moe_uid v;
            assert_int_equal(moe_uid_parse(&g, buf, &v), CM_OK);
            assert_true(moe_uid_equal(&u, &v));
            assert_int_equal(moe_prefix_parse(&g, buf, &v), CM_EPARSE);
            for (int n = 0; n < g.dims; n++) {
                struct moe_uid p, q;
                moe_uid_prefix(&u, n, &p);
                assert_int_equal(moe_uid_format(&g, &p, buf, sizeof buf), CM_OK);
                assert_int_equal(moe_prefix_parse(&g, buf, &q), CM_OK);
                assert_true(moe_uid_equal(&p, &q));
                assert_int_not_equal(moe_uid_parse(&g, buf, &q), CM_OK);
                size_t kl;
                assert_int_equal(moe_key_format("run-1", &g, &p, key, sizeof key, &kl), CM_OK);
                assert_int_equal(kl, strlen(key));
                char want[MOE_KEY_MAX];
                snprintf(want, sizeof want, "moe.run-1.%s", buf);
                assert_string_equal(key, want);
            }
        }
    }
}

static void test_examples(void **state)
{
    (void)state;
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 3, 256), CM_OK);
    struct moe_uid u = {.n = 3, .idx = {10, 20, 30}}, v;
    char buf[MOE_UID_TEXT_MAX], key[MOE_KEY_MAX];
    assert_int_equal(moe_uid_format(&g, &u, buf, sizeof buf), CM_OK);
    assert_string_equal(buf, "ffn.10.20.30");
    struct moe_uid p = {.n = 2, .idx = {10, 20}};
    assert_int_equal(moe_key_format("fmnist", &g, &p, key, sizeof key, NULL), CM_OK);
    assert_string_equal(key, "moe.fmnist.ffn.10.20.*");
    p.n = 0;
    assert_int_equal(moe_key_format("fmnist", &g, &p, key, sizeof key, NULL), CM_OK);
    assert_string_equal(key, "moe.fmnist.ffn.*");
    assert_int_equal(moe_key_format("fmnist", &g, &u, key, sizeof key, NULL), CM_OK);
    assert_string_equal(key, "moe.fmnist.ffn.10.20.30");
    /* small buffers: an error, never a truncated string */
    assert_int_equal(moe_uid_format(&g, &u, buf, 12), CM_ETOOBIG);
    assert_int_equal(moe_uid_format(&g, &u, buf, 13), CM_OK);
    assert_int_equal(moe_key_format("bad run", &g, &u, key, sizeof key, NULL), CM_EPARSE);
    /* an index out of range or a wrong depth is refused on output too */
    struct moe_uid bad = {.n = 3, .idx = {10, 256, 0}};
    assert_int_equal(moe_uid_format(&g, &bad, buf, sizeof buf), CM_ERANGE);
    bad.n = 4;
    assert_int_equal(moe_uid_format(&g, &bad, buf, sizeof buf), CM_ERANGE);
    assert_int_equal(moe_uid_check(&g, &u), CM_OK);
    assert_int_equal(moe_prefix_check(&g, &u), CM_ERANGE);
    (void)v;
}

static void test_rejections(void **state)
{
    (void)state;
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, 100), CM_OK);
    static const struct {
        const char *s;
        int uid_rc, prefix_rc;
    } cases[] = {
        {"ffn.1.2", CM_OK, CM_EPARSE},
        {"ffn.1.*", CM_EPARSE, CM_OK},
        {"ffn.*", CM_EPARSE, CM_OK},
        {"ffn.01.2", CM_EPARSE, CM_EPARSE},      /* leading zero */
        {"ffn.1.00", CM_EPARSE, CM_EPARSE},
        {"ffn.0.0", CM_OK, CM_EPARSE},
        {"ffn.100.2", CM_ERANGE, CM_ERANGE},     /* index >= M */
        {"ffn.99.99", CM_OK, CM_EPARSE},
        {"ffn.12345.1", CM_ERANGE, CM_ERANGE},   /* too many digits */
        {"ffn.1", CM_ERANGE, CM_EPARSE},         /* too few dimensions */
        {"ffn.1.2.3", CM_ERANGE, CM_ERANGE},     /* too many */
        {"ffn.1.2.*", CM_EPARSE, CM_ERANGE},     /* a prefix as long as a uid */
        {"ffn", CM_ERANGE, CM_EPARSE},
        {"ffn.", CM_EPARSE, CM_EPARSE},
        {"ffn..1", CM_EPARSE, CM_EPARSE},
        {"ffn.1.", CM_EPARSE, CM_EPARSE},
        {"ffn.-1.2", CM_EPARSE, CM_EPARSE},
        {"ffn.+1.2", CM_EPARSE, CM_EPARSE},
        {"ffn. 1.2", CM_EPARSE, CM_EPARSE},
        {"ffn.1.2 ", CM_EPARSE, CM_EPARSE},
        {"ffn.1a.2", CM_EPARSE, CM_EPARSE},
        {"ffn.*.1", CM_EPARSE, CM_EPARSE},
        {"ffn.1.**", CM_EPARSE, CM_EPARSE},
        {"ffnx.1.2", CM_EPARSE, CM_EPARSE},      /* another layer */
        {"ff.1.2", CM_EPARSE, CM_EPARSE},
        {"FFN.1.2", CM_EPARSE, CM_EPARSE},
        {"", CM_EPARSE, CM_EPARSE},
        {"ffn.1.2.3.4.5.6.7.8.9.10.11.12.13.14.15.16.17.18.19.20.21", CM_ETOOBIG, CM_ETOOBIG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct moe_uid u = {.n = 7}, keep = u;
        int rc = moe_uid_parse(&g, cases[i].s, &u);
        if (rc != cases[i].uid_rc)
            fail_msg("uid \"%s\": %s, want %s", cases[i].s, cm_err_name(rc),
                     cm_err_name(cases[i].uid_rc));
        if (rc)
            assert_memory_equal(&u, &keep, sizeof u);
        u = keep;
        rc = moe_prefix_parse(&g, cases[i].s, &u);
        if (rc != cases[i].prefix_rc)
            fail_msg("prefix \"%s\": %s, want %s", cases[i].s, cm_err_name(rc),
                     cm_err_name(cases[i].prefix_rc));
        if (rc)
            assert_memory_equal(&u, &keep, sizeof u);
    }
    struct moe_uid u;
    assert_int_equal(moe_uid_parse(&g, NULL, &u), CM_EINVAL);
    assert_int_equal(moe_uid_parse(NULL, "ffn.1.2", &u), CM_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_init),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
