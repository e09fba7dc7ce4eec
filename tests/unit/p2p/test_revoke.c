/* The revocation list: the pure parser (good documents, every malformed
 * shape, another run's list), and the libcurl fetch against a tiny local
 * HTTP server (libmicrohttpd): a good list is installed into p2p_auth, an
 * error status, a wrong run or a server slower than the deadline leave the
 * previous list in place. */
/* ct-timeout: 60 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "p2p/p2p_revoke.h"
#include "tests/harness/p2p_testkit.h"

static void test_parse(void **state)
{
    (void)state;
    struct p2p_revocations r;
    const char *good = "{\"run\":\"fm\",\"generated_at\":100,\"revoked\":["
                       "{\"pass_id\":\"17\",\"revoked_at\":90,\"expires_at\":200},"
                       "{\"pass_id\":\"abc\",\"revoked_at\":91,\"expires_at\":300}]}";
    assert_int_equal(p2p_revocations_parse(good, strlen(good), "fm", &r), 0);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.pass_ids[0], "17");
    assert_int_equal(r.generated_at, 100);
    p2p_revocations_cleanup(&r);
    assert_int_equal(p2p_revocations_parse(good, strlen(good), "other", &r), CM_EAUTH);
    const char *bad[] = {
        "",
        "[]",
        "{\"run\":\"fm\",\"generated_at\":1}",
        "{\"run\":\"fm\",\"generated_at\":\"1\",\"revoked\":[]}",
        "{\"run\":\"fm\",\"generated_at\":1,\"revoked\":[{\"pass_id\":17,\"revoked_at\":1,"
        "\"expires_at\":2}]}",
        "{\"run\":\"fm\",\"generated_at\":1,\"revoked\":[{\"pass_id\":\"\",\"revoked_at\":1,"
        "\"expires_at\":2}]}",
        "{\"run\":\"fm\",\"generated_at\":1,\"revoked\":[{\"pass_id\":\"1\"}]}",
        "{\"run\":\"fm\",\"generated_at\":1,\"revoked\":[{\"pass_id\":"
        "\"0123456789012345678901234567890123456789x\",\"revoked_at\":1,\"expires_at\":2}]}",
        "{\"run\":\"fm\",\"run\":\"fm\",\"generated_at\":1,\"revoked\":[]}",
        "{\"run\":\"fm\",\"generated_at\":1,\"revoked\":[]} trailing",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_not_equal(p2p_revocations_parse(bad[i], strlen(bad[i]), "fm", &r), 0);
        assert_int_equal(r.n, 0);
    }
}

struct srv {
    int status, delay_ms;
    const char *body;
    int hits;
};

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    struct srv *s = cls;
    (void)method, (void)version, (void)upload, (void)upload_size, (void)con_cls;
    s->hits++;
    if (s->delay_ms)
        usleep((useconds_t)s->delay_ms * 1000);
    const char *body = strcmp(url, "/api/v1/runs/fm/revocations") ? "{}" : s->body;
    int st = strcmp(url, "/api/v1/runs/fm/revocations") ? 404 : s->status;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)st, r);
    MHD_destroy_response(r);
    return ret;
}

static void test_fetch(void **state)
{
    (void)state;
    struct srv s = {.status = 200,
                    .body = "{\"run\":\"fm\",\"generated_at\":100,\"revoked\":["
                            "{\"pass_id\":\"7\",\"revoked_at\":90,\"expires_at\":4000000000}]}"};
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                                            handler, &s, MHD_OPTION_END);
    assert_non_null(d);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/", info->port);
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "fm"), 0);
    struct p2p_auth_config ac = p2p_tk_auth_config(&tk);
    struct p2p_auth auth;
    assert_int_equal(p2p_auth_init(&auth, &ac), 0);
    struct p2p_revoke_config rc = {.coordinator_url = url, .run = "fm", .timeout_ms = 2000};
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), 0);
    assert_true(p2p_auth_is_revoked(&auth, "7"));
    assert_false(p2p_auth_is_revoked(&auth, "8"));

    /* Failures keep the list in place. */
    s.status = 500;
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), CM_EPROTO);
    assert_true(p2p_auth_is_revoked(&auth, "7"));
    s.status = 200;
    struct p2p_revoke_config other = rc;
    other.run = "zz"; /* 404 from the server */
    assert_int_equal(p2p_revoke_fetch(&auth, &other), CM_EPROTO);
    s.body = "{\"run\":\"other\",\"generated_at\":200,\"revoked\":[]}";
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), CM_EAUTH);
    assert_true(p2p_auth_is_revoked(&auth, "7"));
    s.body = "{\"run\":\"fm\",\"generated_at\":300,\"revoked\":[]}";
    s.delay_ms = 1500;
    rc.timeout_ms = 300;
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), CM_ETIMEOUT);
    assert_true(p2p_auth_is_revoked(&auth, "7"));
    /* An older list than the one in place is ignored. */
    s.delay_ms = 0;
    rc.timeout_ms = 2000;
    s.body = "{\"run\":\"fm\",\"generated_at\":50,\"revoked\":[]}";
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), 0);
    assert_true(p2p_auth_is_revoked(&auth, "7"));
    /* The refresher installs a newer (empty) list and keeps polling. */
    s.body = "{\"run\":\"fm\",\"generated_at\":400,\"revoked\":[]}";
    rc.interval_s = 1;
    struct p2p_revoke_refresher *r;
    int hits0 = s.hits;
    assert_int_equal(p2p_revoke_refresher_start(&auth, &rc, &r), 0);
    assert_false(p2p_auth_is_revoked(&auth, "7"));
    usleep(1300 * 1000);
    p2p_revoke_refresher_stop(r);
    assert_true(s.hits >= hits0 + 2);
    /* Nothing listens here: a connection error. */
    rc.coordinator_url = "http://127.0.0.1:1";
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), CM_ECONN);
    p2p_auth_cleanup(&auth);
    p2p_tk_cleanup(&tk);
    MHD_stop_daemon(d);
}

/* Over real TLS (openssl s_server with a throwaway self-signed certificate
 * for 127.0.0.1): the list is fetched when the certificate is pinned with
 * ca_file, and refused (CM_EAUTH, list unchanged) without it. */
static void test_fetch_tls(void **state)
{
    (void)state;
    char dir[] = "/tmp/ct-revoke-tls-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout key.pem -out cert.pem -days 1 -subj /CN=127.0.0.1 "
             "-addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 && mkdir -p api/v1/runs/fm && "
             "printf '%%s' '{\"run\":\"fm\",\"generated_at\":5,\"revoked\":[{\"pass_id\":"
             "\"tls1\",\"revoked_at\":1,\"expires_at\":4000000000}]}' > api/v1/runs/fm/revocations",
             dir);
    if (system(cmd) != 0) {
        printf("tls: cannot make a certificate with the openssl tool, part skipped\n");
        return;
    }
    struct p2p_tk tk;
    assert_int_equal(p2p_tk_init(&tk, "fm"), 0);
    struct p2p_auth_config ac = p2p_tk_auth_config(&tk);
    struct p2p_auth auth;
    assert_int_equal(p2p_auth_init(&auth, &ac), 0);
    char url[64], ca[256];
    snprintf(ca, sizeof ca, "%s/cert.pem", dir);
    struct p2p_revoke_config rc = {.coordinator_url = url, .run = "fm", .timeout_ms = 3000};
    rc.ca_file = ca;
    int rc_fetch = CM_ECONN;
    pid_t pid = -1;
    /* s_server on a free port (bind to 0, read it, close, hand it over):
       until it answers, while it runs (20 s: it starts slowly on a loaded
       machine); one that exited (the port was taken meanwhile) is started
       again on another port, 3 times at most */
    for (int attempt = 0; attempt < 3 && rc_fetch == CM_ECONN; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        getsockname(fd, (struct sockaddr *)&sa, &sl);
        int port = ntohs(sa.sin_port);
        close(fd);
        pid = fork();
        if (pid == 0) {
            if (chdir(dir) == 0) {
                char ps[16];
                snprintf(ps, sizeof ps, "%d", port);
                int devnull = open("/dev/null", O_WRONLY);
                dup2(devnull, 1);
                dup2(devnull, 2);
                execlp("openssl", "openssl", "s_server", "-quiet", "-accept", ps, "-cert", "cert.pem",
                       "-key", "key.pem", "-WWW", (char *)NULL);
            }
            _exit(127);
        }
        snprintf(url, sizeof url, "https://127.0.0.1:%d", port);
        for (int i = 0; i < 200 && (rc_fetch = p2p_revoke_fetch(&auth, &rc)) == CM_ECONN; i++) {
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                pid = -1;
                break;
            }
            usleep(100 * 1000);
        }
    }
    assert_int_equal(rc_fetch, 0);
    assert_true(p2p_auth_is_revoked(&auth, "tls1"));
    assert_int_equal(p2p_auth_set_revoked(&auth, NULL, 0, 6), 0);
    rc.ca_file = NULL; /* system CAs do not know this certificate */
    assert_int_equal(p2p_revoke_fetch(&auth, &rc), CM_EAUTH);
    assert_false(p2p_auth_is_revoked(&auth, "tls1"));
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    p2p_auth_cleanup(&auth);
    p2p_tk_cleanup(&tk);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parse), cmocka_unit_test(test_fetch),
                                       cmocka_unit_test(test_fetch_tls)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
