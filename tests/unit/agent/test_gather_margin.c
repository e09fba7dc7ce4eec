/* Unit tests for the gathering margin (agent/dp/records.c,
 * dp_gather_margin): --gather-margin-ms, raised to 3x the slowest of the
 * last 8 announcements' DHT puts, capped, and back down once slow puts
 * leave the last 8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "agent/dp/dp.h"

static struct dp_state *state(long margin)
{
    struct dp_state *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->o.gather_margin_ms = margin;
    return s;
}

static void test_option_until_measured(void **st)
{
    (void)st;
    struct dp_state *s = state(50);
    assert_int_equal(dp_gather_margin(s), 50);
    dp_gather_note_put(s, 5);
    assert_int_equal(dp_gather_margin(s), 50); /* 15 < 50 */
    free(s);
}

static void test_slow_puts_raise_it(void **st)
{
    (void)st;
    struct dp_state *s = state(50);
    dp_gather_note_put(s, 4);
    dp_gather_note_put(s, 40);
    assert_int_equal(dp_gather_margin(s), 120);
    dp_gather_note_put(s, 10);
    assert_int_equal(dp_gather_margin(s), 120); /* the slowest of the last 8 */
    for (int k = 0; k < DP_GATHER_PUTS - 1; k++)
        dp_gather_note_put(s, 10);
    assert_int_equal(dp_gather_margin(s), 50); /* the 40 ms put left the last 8 */
    dp_gather_note_put(s, 100000);
    assert_int_equal(dp_gather_margin(s), DP_GATHER_MARGIN_MAX_MS);
    free(s);
}

static void test_default_is_floor(void **st)
{
    (void)st;
    struct dp_state *s = state(150);
    for (int k = 0; k < 20; k++)
        dp_gather_note_put(s, 1 + k % 3);
    assert_int_equal(dp_gather_margin(s), 150);
    dp_gather_note_put(s, 51);
    assert_int_equal(dp_gather_margin(s), 153);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_option_until_measured),
        cmocka_unit_test(test_slow_puts_raise_it),
        cmocka_unit_test(test_default_is_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
