/* The fast form of a report's request body (coordinator/api_contrib_parse.c:
 * coord_report_envelope): it takes exactly the agents' form and leaves
 * everything else to the generic JSON parser, never accepting what that
 * parser would read differently. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "coordinator/api_contrib.h"

static int env(const char *s, struct coord_report_env *e)
{
    return coord_report_envelope(s, strlen(s), e);
}

static void assert_field(const char *p, size_t n, const char *want)
{
    assert_int_equal(n, strlen(want));
    assert_memory_equal(p, want, n);
}

static void test_agent_form(void **state)
{
    (void)state;
    struct coord_report_env e;
    assert_int_equal(env("{\"pass\":\"a.b.c\",\"payload\":\"eyJ4IjoxfQ\",\"sig\":\"QUJD\"}", &e), 1);
    assert_field(e.pass, e.pass_len, "a.b.c");
    assert_field(e.payload, e.payload_len, "eyJ4IjoxfQ");
    assert_field(e.sig, e.sig_len, "QUJD");
    /* any order, JSON whitespace anywhere between tokens */
    assert_int_equal(env(" \r\n{ \"sig\" : \"s\" ,\t\"pass\":\"p\",\"payload\" :\"q\" } \n", &e), 1);
    assert_field(e.pass, e.pass_len, "p");
    assert_field(e.payload, e.payload_len, "q");
    assert_field(e.sig, e.sig_len, "s");
    /* empty strings are its form too (the caller bounds the lengths) */
    assert_int_equal(env("{\"pass\":\"\",\"payload\":\"\",\"sig\":\"\"}", &e), 1);
    assert_int_equal(e.pass_len, 0);
}

static void test_other_forms_left_to_json(void **state)
{
    (void)state;
    static const char *const other[] = {
        "",
        "{}",
        "[]",
        "{\"pass\":\"p\",\"payload\":\"q\"}",                            /* missing */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\",\"x\":\"y\"}",  /* extra */
        "{\"pass\":\"p\",\"pass\":\"q\",\"sig\":\"s\"}",                 /* duplicate */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":1}",                  /* not a string */
        "{\"pass\":\"p\\u0041\",\"payload\":\"q\",\"sig\":\"s\"}",       /* an escape */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\"",               /* unterminated */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\"}x",             /* trailing bytes */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\",}",             /* trailing comma */
        "{\"pass\":\"p\" \"payload\":\"q\",\"sig\":\"s\"}",              /* missing comma */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\xc3\xa9\"}",      /* not ASCII */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\tt\"}",           /* control byte */
        "{\"Pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\"}",              /* other key */
        "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\"}{}",
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        struct coord_report_env e;
        int r = env(other[i], &e);
        if (r != 0)
            fail_msg("accepted: %s", other[i]);
        assert_null(e.pass);
    }
    struct coord_report_env e;
    assert_int_equal(coord_report_envelope(NULL, 0, &e), 0);
    /* an embedded NUL ends nothing early: the length rules */
    static const char nul[] = "{\"pass\":\"p\",\"payload\":\"q\",\"sig\":\"s\"}\0";
    assert_int_equal(coord_report_envelope(nul, sizeof nul - 1, &e), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_form),
        cmocka_unit_test(test_other_forms_left_to_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
