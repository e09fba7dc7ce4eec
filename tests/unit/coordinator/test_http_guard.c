/* The coordinator's URL decoder (coordinator/http_guard.c:
 * coord_url_unescape): percent escapes decode as libmicrohttpd's own
 * decoder does, and any escape that decodes to a control character is
 * reported, so a "%00" can no longer cut a path segment short unseen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "coordinator/http_guard.h"

static void check(const char *in, const char *want, size_t want_len, int want_control)
{
    char buf[128];
    strcpy(buf, in);
    int control = -1;
    size_t n = coord_url_unescape(buf, &control);
    assert_int_equal(n, want_len);
    assert_memory_equal(buf, want, want_len);
    assert_int_equal(control, want_control);
}

static void test_decodes(void **state)
{
    (void)state;
    check("/api/v1/runs/r1", "/api/v1/runs/r1", 15, 0);
    check("/runs/r%31", "/runs/r1", 8, 0);
    check("a%20b%2Fc%2fd", "a b/c/d", 7, 0);
    check("%e2%82%ac", "\xe2\x82\xac", 3, 0);
    check("a+b", "a+b", 3, 0); /* '+' is the query parser's business */
    /* malformed escapes stay as they are */
    check("%", "%", 1, 0);
    check("%4", "%4", 2, 0);
    check("%zz%4g", "%zz%4g", 6, 0);
    check("100%", "100%", 4, 0);
}

static void test_reports_control_characters(void **state)
{
    (void)state;
    check("/runs/r1%00xyz", "/runs/r1\0xyz", 12, 1);
    check("r1%0d%0aX", "r1\r\nX", 5, 1);
    check("%1f", "\x1f", 1, 1);
    check("%7F", "\x7f", 1, 1);
    check("%7e%80", "~\x80", 2, 0);
    check("%20", " ", 1, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decodes),
        cmocka_unit_test(test_reports_control_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
