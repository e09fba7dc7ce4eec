/* ct-timeout: 180 */
/* Integration tests of crowdtrain-coordinator's start and stop: SIGTERM
 * lets a request whose body is still arriving finish (whichever thread the
 * signal lands on), the self-signed certificate names the --public-url host
 * across restarts, and a database with a newer schema is refused. Split
 * from test_coordinator.c (the API's behaviour) by concern. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_passreq.h"
#include "cm_token.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static int g_teardown_failed;

#define VOL_PW "volunteer-password"

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "vol", "volunteer", VOL_PW) != 0)
        return -1;
    return ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    g_teardown_failed = rc != 0;
    return rc;
}

/* A request whose body is still arriving when SIGTERM comes gets its answer. */
struct slow_upload {
    int sent;
    struct ct_resp r;
};

static size_t slow_read(char *buf, size_t sz, size_t n, void *ud)
{
    struct slow_upload *s = ud;
    static const char body[] = "{\"username\":\"vol\",\"password\":\"" VOL_PW "\"}";
    (void)sz;
    (void)n;
    if (s->sent == 0) {
        memcpy(buf, body, 10);
        s->sent = 10;
        return 10;
    }
    if (s->sent == 10) {
        usleep(800000); /* SIGTERM lands while we wait */
        size_t rest = sizeof body - 1 - 10;
        memcpy(buf, body + 10, rest);
        s->sent += (int)rest;
        return rest;
    }
    return 0;
}

#include <curl/curl.h>
static size_t sink(char *d, size_t sz, size_t n, void *ud)
{
    struct ct_resp *r = ud;
    size_t len = sz * n;
    r->body = realloc(r->body, r->len + len + 1);
    memcpy(r->body + r->len, d, len);
    r->len += len;
    r->body[r->len] = 0;
    return len;
}

static void *slow_thread(void *arg)
{
    struct slow_upload *s = arg;
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s/api/v1/session", g_c.url);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CAINFO, g_c.ca);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, slow_read);
    curl_easy_setopt(h, CURLOPT_READDATA, s);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)(sizeof "{\"username\":\"vol\",\"password\":\"" VOL_PW "\"}" - 1));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s->r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    s->r.curl_error = (int)curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &s->r.status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return NULL;
}

static void test_sigterm_finishes_inflight(void **state)
{
    (void)state;
    struct slow_upload s = {0};
    pthread_t th;
    pthread_create(&th, NULL, slow_thread, &s);
    /* wait until the first bytes are sent */
    for (int i = 0; i < 200 && s.sent == 0; i++)
        usleep(10000);
    usleep(200000);
    kill(g_c.pid, SIGTERM);
    pthread_join(th, NULL);
    assert_int_equal(s.r.curl_error, 0);
    assert_int_equal(s.r.status, 201);
    free(s.r.body);
    assert_int_equal(ct_coord_stop(&g_c, 0), 0); /* it exits by itself */
    /* the coordinator comes back for the rest of the suite */
    assert_int_equal(ct_coord_start(&g_c, g_pg.url, g_c.dir, NULL), 0);
}

/* The threads of a process whose signal mask lets SIGTERM through (libraries'
 * threads started before main: OpenBLAS's pool), the main thread excepted:
 * up to `max` thread ids into `tids`. */
static int unblocked_threads(pid_t pid, pid_t *tids, int max)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < max) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid <= 0 || tid == pid)
            continue;
        char path[128], line[256];
        snprintf(path, sizeof path, "%s/%d/status", dir, (int)tid);
        FILE *f = fopen(path, "r");
        unsigned long long blk = ~0ULL;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blk) == 1)
                break;
        if (f)
            fclose(f);
        if (!(blk & (1ULL << (SIGTERM - 1))))
            tids[n++] = tid;
    }
    if (d)
        closedir(d);
    return n;
}

/* SIGTERM stops the coordinator gracefully (exit 0, "SIGTERM received"
 * in its log) whichever thread the kernel hands it to: directed at a
 * library's thread that does not block it, and sent while the coordinator
 * is stopped (SIGSTOP) and continued. Before the fix both killed it by
 * the default action (status 128 + SIGTERM: the first always, the second
 * in 2 of 3 tries of the sanitizer build, and test_agent_login's teardown
 * now and then). */
static int sigterm_lines(void)
{
    char *log = ct_read_file(g_c.log, NULL);
    int n = 0;
    for (const char *p = log; p && (p = strstr(p, "SIGTERM received")) != NULL; p++)
        n++;
    free(log);
    return n;
}

/* Waits for the coordinator to exit after a SIGTERM sent otherwise: 1 when
 * it exited 0 and said why (its log is appended to across restarts). */
static int stopped_gracefully(int lines_before)
{
    int st = ct_coord_stop(&g_c, 0);
    int lines = sigterm_lines();
    if (st != 0 || lines != lines_before + 1) {
        fprintf(stderr, "coordinator: status %d, %d 'SIGTERM received' lines (%d before)\n", st, lines,
                lines_before);
        return 0;
    }
    return 1;
}

static void test_sigterm_on_any_thread(void **state)
{
    (void)state;
    pid_t tids[16];
    int n = unblocked_threads(g_c.pid, tids, 16);
    printf("%d thread(s) of the coordinator let SIGTERM through\n", n);
    if (n > 0) {
        int before = sigterm_lines();
        assert_int_equal(syscall(SYS_tgkill, g_c.pid, tids[0], SIGTERM), 0);
        assert_true(stopped_gracefully(before));
        assert_int_equal(ct_coord_start(&g_c, g_pg.url, g_c.dir, NULL), 0);
    }
    for (int i = 0; i < 3; i++) {
        int before = sigterm_lines();
        assert_int_equal(kill(g_c.pid, SIGSTOP), 0);
        usleep(100000);
        assert_int_equal(kill(g_c.pid, SIGTERM), 0);
        usleep(100000);
        assert_int_equal(kill(g_c.pid, SIGCONT), 0);
        assert_true(stopped_gracefully(before));
        assert_int_equal(ct_coord_start(&g_c, g_pg.url, g_c.dir, NULL), 0);
    }
}

/* The self-signed certificate names the --public-url host (IP or name), so
 * agents elsewhere verify the coordinator at the address they are given; a
 * certificate from an earlier start that does not name a new public host
 * is replaced, one that does is kept. */
static int cert_names(const char *path, const char *host)
{
    char *pem = ct_read_file(path, NULL);
    BIO *b = pem ? BIO_new_mem_buf(pem, -1) : NULL;
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    unsigned char a[16];
    int ip = inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
    int ok = x && (ip ? X509_check_ip_asc(x, host, 0) : X509_check_host(x, host, 0, 0, NULL)) == 1;
    X509_free(x);
    BIO_free(b);
    free(pem);
    return ok;
}

static void test_certificate_names_public_host(void **state)
{
    (void)state;
    struct ct_coord b;
    const char *by_ip[] = {"--public-url", "https://10.1.2.3:8443", NULL};
    assert_int_equal(ct_coord_start(&b, g_pg.url, NULL, by_ip), 0);
    assert_true(cert_names(b.ca, "10.1.2.3"));
    assert_true(cert_names(b.ca, "127.0.0.1"));
    assert_false(cert_names(b.ca, "10.1.2.4"));
    char *first = ct_read_file(b.ca, NULL);
    assert_non_null(first);
    /* same host again: the same certificate (agents keep their pinned copy) */
    assert_int_equal(ct_coord_stop(&b, SIGTERM), 0);
    assert_int_equal(ct_coord_start(&b, g_pg.url, b.dir, by_ip), 0);
    char *again = ct_read_file(b.ca, NULL);
    assert_non_null(again);
    assert_string_equal(first, again);
    /* a new public name: a new certificate that names it (and still loopback) */
    const char *by_name[] = {"--public-url", "https://coord.example.org:8443/", NULL};
    assert_int_equal(ct_coord_stop(&b, SIGTERM), 0);
    assert_int_equal(ct_coord_start(&b, g_pg.url, b.dir, by_name), 0);
    assert_true(cert_names(b.ca, "coord.example.org"));
    assert_false(cert_names(b.ca, "other.example.org"));
    char *log = ct_read_file(b.log, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "does not name coord.example.org"));
    free(log);
    /* IPv6 in brackets */
    const char *by_v6[] = {"--public-url", "https://[2001:db8::7]:8443", NULL};
    assert_int_equal(ct_coord_stop(&b, SIGTERM), 0);
    assert_int_equal(ct_coord_start(&b, g_pg.url, b.dir, by_v6), 0);
    assert_true(cert_names(b.ca, "2001:db8::7"));
    free(first);
    free(again);
    assert_int_equal(ct_coord_cleanup(&b), 0);
}

static void test_refuses_newer_schema(void **state)
{
    (void)state;
    assert_int_equal(ct_pg_exec(&g_pg, "INSERT INTO schema_migrations (version, name, sha256) "
                                       "VALUES (999, '999_future.sql', 'x')"), 0);
    const char *argv[] = {ct_bin("crowdtrain-coordinator"), "migrate", "--database-url", g_pg.url, NULL};
    char *out = NULL;
    int rc = ct_run(argv, NULL, &out, 30);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "newer than this coordinator"));
    free(out);
    struct ct_coord b = {0};
    assert_int_not_equal(ct_coord_start(&b, g_pg.url, NULL, NULL), 0);
    ct_coord_cleanup(&b);
    assert_int_equal(ct_pg_exec(&g_pg, "DELETE FROM schema_migrations WHERE version = 999"), 0);
    /* migrate is idempotent */
    rc = ct_run(argv, NULL, &out, 30);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "0 migrations applied"));
    free(out);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_finishes_inflight),
        cmocka_unit_test(test_sigterm_on_any_thread),
        cmocka_unit_test(test_certificate_names_public_host),
        cmocka_unit_test(test_refuses_newer_schema),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
