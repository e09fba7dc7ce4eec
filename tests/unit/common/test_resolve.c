/* Unit tests of name resolution with a deadline (common/cm_resolve.c):
 * numeric hosts resolve without a lookup, a name from /etc/hosts resolves,
 * bad input is refused, and a name that cannot resolve comes back within
 * the deadline (not the resolver's own seconds of retries). Many lookups
 * that outlive their callers must not leak or crash (ASan build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_resolve.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void test_numeric(void **state)
{
    (void)state;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    assert_int_equal(cm_resolve("10.1.2.3", "80", &hints, 0, &res), CM_OK);
    assert_non_null(res);
    assert_int_equal(res->ai_family, AF_INET);
    const struct sockaddr_in *a = (const struct sockaddr_in *)res->ai_addr;
    assert_int_equal(ntohs(a->sin_port), 80);
    assert_int_equal(ntohl(a->sin_addr.s_addr), 0x0a010203u);
    freeaddrinfo(res);
    assert_int_equal(cm_resolve("2001:db8::7", NULL, &hints, 0, &res), CM_OK);
    assert_int_equal(res->ai_family, AF_INET6);
    freeaddrinfo(res);
}

static void test_names(void **state)
{
    (void)state;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    assert_int_equal(cm_resolve("localhost", NULL, &hints, 5000, &res), CM_OK);
    const struct sockaddr_in *a = (const struct sockaddr_in *)res->ai_addr;
    assert_int_equal(ntohl(a->sin_addr.s_addr) >> 24, 127);
    freeaddrinfo(res);
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(cm_resolve(longname, NULL, &hints, 1000, &res), CM_EINVAL);
    assert_null(res);
    assert_int_equal(cm_resolve(NULL, NULL, &hints, 1000, &res), CM_EINVAL);
    /* RFC 6761: .invalid never resolves; whatever the resolver does
       (answers at once, or tries servers that do not answer), we answer
       within the deadline */
    double t0 = now_s();
    int rc = cm_resolve("no-such-host.invalid", "443", &hints, 1500, &res);
    double took = now_s() - t0;
    assert_true(rc == CM_ENOTFOUND || rc == CM_ETIMEOUT);
    assert_null(res);
    assert_true(took < 2.5);
}

/* Lookups abandoned at once: each thread frees its own job later. */
static void test_abandoned(void **state)
{
    (void)state;
    struct addrinfo *res = NULL;
    for (int i = 0; i < 50; i++) {
        int rc = cm_resolve("localhost", "80", NULL, 0, &res);
        assert_true(rc == CM_OK || rc == CM_ETIMEOUT);
        if (rc == CM_OK)
            freeaddrinfo(res);
        res = NULL;
    }
    usleep(200000); /* the threads finish (and free) before the process ends */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numeric),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_abandoned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
