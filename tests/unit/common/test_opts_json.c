/* Unit tests for common/cm_opts.c (flags > environment > config file >
 * defaults) and common/cm_json.c (strict request-body schemas). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_json.h"
#include "cm_opts.h"

struct cfg {
    char *url;
    long threads;
    int verbose;
    double rate;
};

static const struct cm_opt OPTS[] = {
    {"database-url", CM_OPT_STR, offsetof(struct cfg, url), "postgresql://default", "URL", "db", 0},
    {"threads", CM_OPT_INT, offsetof(struct cfg, threads), "4", "N", "threads", 0},
    {"verbose", CM_OPT_BOOL, offsetof(struct cfg, verbose), NULL, NULL, "flag", 0},
    {"rate", CM_OPT_DBL, offsetof(struct cfg, rate), "1.5", "X", "rate", 0},
};
static const struct cm_cmd_spec SPEC = {"t [options]", "about", OPTS, 4, 1};

static int parse(struct cfg *c, int argc, const char **argv)
{
    memset(c, 0, sizeof *c);
    FILE *err = fopen("/dev/null", "w");
    int rc = cm_opts_parse(&SPEC, c, argc, (char **)argv, NULL, NULL, err);
    fclose(err);
    return rc;
}

static void test_precedence(void **state)
{
    (void)state;
    char path[] = "/tmp/ct-opts-XXXXXX";
    int fd = mkstemp(path);
    const char *file = "# comment\n database-url = postgresql://file \nthreads=8\nrate = 2.5\n";
    assert_int_equal(write(fd, file, strlen(file)), (ssize_t)strlen(file));
    close(fd);
    struct cfg c;
    unsetenv("CROWDTRAIN_THREADS");
    unsetenv("CROWDTRAIN_CONFIG");
    const char *a0[] = {"t"};
    assert_int_equal(parse(&c, 1, a0), CM_OK);
    assert_string_equal(c.url, "postgresql://default");
    assert_int_equal(c.threads, 4);
    assert_false(c.verbose);
    cm_opts_free(&SPEC, &c);

    const char *a1[] = {"t", "--config", path};
    assert_int_equal(parse(&c, 3, a1), CM_OK);
    assert_string_equal(c.url, "postgresql://file");
    assert_int_equal(c.threads, 8);
    assert_true(c.rate == 2.5);
    cm_opts_free(&SPEC, &c);

    setenv("CROWDTRAIN_THREADS", "16", 1);
    assert_int_equal(parse(&c, 3, a1), CM_OK);
    assert_int_equal(c.threads, 16); /* env beats file */
    assert_string_equal(c.url, "postgresql://file");
    cm_opts_free(&SPEC, &c);

    const char *a2[] = {"t", "--config", path, "--threads=32", "--verbose", "--database-url", "postgresql://flag"};
    assert_int_equal(parse(&c, 7, a2), CM_OK);
    assert_int_equal(c.threads, 32); /* flag beats env */
    assert_string_equal(c.url, "postgresql://flag");
    assert_true(c.verbose);
    cm_opts_free(&SPEC, &c);

    setenv("CROWDTRAIN_CONFIG", path, 1);
    const char *a3[] = {"t"};
    assert_int_equal(parse(&c, 1, a3), CM_OK);
    assert_string_equal(c.url, "postgresql://file");
    cm_opts_free(&SPEC, &c);
    unsetenv("CROWDTRAIN_CONFIG");
    unsetenv("CROWDTRAIN_THREADS");
    unlink(path);
}

static void test_errors(void **state)
{
    (void)state;
    struct cfg c;
    const char *bad[][3] = {{"t", "--nope", NULL},    {"t", "--threads", "x"}, {"t", "--threads", NULL},
                            {"t", "--verbose=1", NULL}, {"t", "stray", NULL},   {"t", "--rate", "nan"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int argc = bad[i][2] ? 3 : 2;
        assert_true(parse(&c, argc, bad[i]) < 0);
        cm_opts_free(&SPEC, &c);
    }
    setenv("CROWDTRAIN_THREADS", "many", 1);
    const char *a[] = {"t"};
    assert_int_equal(parse(&c, 1, a), CM_EINVAL);
    cm_opts_free(&SPEC, &c);
    unsetenv("CROWDTRAIN_THREADS");
    const char *missing[] = {"t", "--config", "/nonexistent/ct.conf"};
    assert_int_equal(parse(&c, 3, missing), CM_EIO);
    cm_opts_free(&SPEC, &c);
}

/* --help names each option's default, unless its text explains the default
 * itself (an option whose stored 0 means "the run's"). */
static void test_help_defaults(void **state)
{
    (void)state;
    static const struct cm_opt H[] = {
        {"threads", CM_OPT_INT, offsetof(struct cfg, threads), "4", "N", "threads", 0},
        {"rate", CM_OPT_DBL, offsetof(struct cfg, rate), "0", "X", "rate (default: the run's)", 0},
        {"verbose", CM_OPT_BOOL, offsetof(struct cfg, verbose), NULL, NULL, "flag", 0},
    };
    static const struct cm_cmd_spec HS = {"t [options]", "about", H, 3, 0};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cm_opts_help(&HS, f);
    fclose(f);
    assert_non_null(strstr(text, "threads (default: 4)\n"));
    assert_non_null(strstr(text, "rate (default: the run's)\n"));
    assert_null(strstr(text, "(default: 0)"));
    assert_non_null(strstr(text, "flag\n"));
    free(text);
}

static void test_json_schema(void **state)
{
    (void)state;
    static const struct cm_json_field F[] = {
        {"name", CM_J_STRING, 1, 1, 8},
        {"n", CM_J_INT, 0, 1, 10},
        {"cfg", CM_J_OBJECT, 0, 1, 0},
    };
    char err[256];
    struct {
        const char *body;
        int ok;
        const char *msg;
    } cases[] = {
        {"{\"name\":\"abc\"}", 1, NULL},
        {"{\"name\":\"abc\",\"n\":10,\"cfg\":{}}", 1, NULL},
        {"{\"name\":\"abc\",\"n\":null}", 1, NULL},
        {"{\"n\":1}", 0, "missing field 'name'"},
        {"{\"name\":1}", 0, "field 'name': expected a string"},
        {"{\"name\":\"\"}", 0, "length must be 1..8"},
        {"{\"name\":\"123456789\"}", 0, "length must be 1..8"},
        {"{\"name\":\"a\",\"n\":11}", 0, "must be 1..10"},
        {"{\"name\":\"a\",\"n\":1.5}", 0, "expected an integer"},
        {"{\"name\":\"a\",\"zz\":1}", 0, "unknown field 'zz'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = cm_json_parse_object(cases[i].body, strlen(cases[i].body), err, sizeof err);
        assert_non_null(j);
        int rc = cm_json_check(j, F, 3, err, sizeof err);
        if (cases[i].ok)
            assert_int_equal(rc, CM_OK);
        else {
            assert_int_equal(rc, CM_EINVAL);
            if (!strstr(err, cases[i].msg))
                fail_msg("case %zu: message '%s' lacks '%s'", i, err, cases[i].msg);
        }
        json_decref(j);
    }
    /* Jansson refuses \u0000 inside strings, so C string handling stays safe. */
    const char *bad[] = {"{\"name\":\"a\\u0000b\"}", "", "[]", "\"s\"", "{", "{\"a\":1}x", "{\"a\":1,\"a\":2}", "nul"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        assert_null(cm_json_parse_object(bad[i], strlen(bad[i]), err, sizeof err));
        assert_true(strlen(err) > 0);
    }
    char deep[200];
    size_t n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int i = 0; i < 40; i++)
        deep[n++] = '[';
    for (int i = 0; i < 40; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    assert_null(cm_json_parse_object(deep, n, err, sizeof err));
    assert_non_null(strstr(err, "nested"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_help_defaults),
        cmocka_unit_test(test_json_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
