/* ct-timeout: 120 */
/* crowdtrain-agent login / pass against a real coordinator: the key pair and
 * state files are created with mode 0600, the printed pass is verified, a
 * wrong password and a non-allowlisted run fail with a clear message and
 * leave no pass behind, renewal issues a new pass for the same key, and
 * join refuses each bad option (exit 2, a sentence naming it) before it
 * contacts anything or writes a run directory, and Ctrl-C during join's
 * start-up stops it there, also in the middle of a request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_token.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_create_user(g_pg.url, "vol", "volunteer", "volunteer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || ct_tempdir("agent", g_dir, sizeof g_dir) != 0)
        return -1;
    char *org = ct_login(&g_c, "org", "organizer-password");
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", org, "{\"name\":\"demo\",\"target_batch_size\":256}", &r);
    ct_resp_free(&r);
    ct_http(&g_c, "POST", "/api/v1/runs", org, "{\"name\":\"closed\",\"target_batch_size\":256}", &r);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/demo/allowlist/vol", org, NULL, &r);
    ct_resp_free(&r);
    free(org);
    return 0;
}

/* cmocka does not count a failed group teardown in its exit status. */
static int g_teardown_failed;

static int teardown(void **state)
{
    (void)state;
    kill(g_c.pid, SIGCONT); /* test_ctrl_c_during_start_up stops it */
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    ct_rmrf(g_dir);
    g_teardown_failed = rc != 0;
    return rc;
}

static int agent(const char *stdin_text, char **out, const char *a1, const char *a2, const char *a3,
                 const char *a4)
{
    const char *argv[20] = {ct_bin("crowdtrain-agent")};
    int n = 1;
    const char *extra[] = {a1, a2, a3, a4};
    for (int i = 0; i < 4 && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n++] = "--config-dir";
    argv[n++] = g_dir;
    argv[n] = NULL;
    return ct_run(argv, stdin_text, out, 60);
}

static char *pass_token(void)
{
    char p[400];
    snprintf(p, sizeof p, "%s/pass-demo.json", g_dir);
    json_t *j = json_load_file(p, 0, NULL);
    const char *t = json_string_value(json_object_get(j, "access_token"));
    char *out = t ? strdup(t) : NULL;
    json_decref(j);
    return out;
}

static void test_login_and_pass(void **state)
{
    (void)state;
    char *out = NULL;
    const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--ca-cert", g_c.ca,
                          "--username", "vol", "--password-stdin", "--run", "demo", "--config-dir", g_dir, NULL};
    int rc = ct_run(argv, "volunteer-password\n", &out, 60);
    if (rc != 0)
        fail_msg("login failed: %s", out);
    assert_non_null(strstr(out, "Logged in to"));
    assert_non_null(strstr(out, "pass id"));
    assert_non_null(strstr(out, "signature    valid"));
    free(out);
    const char *files[] = {"peer-ed25519.pem", "session.json", "pass-demo.json"};
    for (int i = 0; i < 3; i++) {
        char p[400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    /* the stored token binds this peer's key and verifies */
    char kp[400];
    snprintf(kp, sizeof kp, "%s/peer-ed25519.pem", g_dir);
    struct cm_ed25519 key;
    assert_int_equal(cm_ed25519_load(&key, kp, 0), CM_OK);
    char *t1 = pass_token();
    assert_non_null(t1);
    struct cm_pass_claims c1;
    uint8_t sig[64];
    size_t sl;
    assert_int_equal(cm_token_parse(t1, strlen(t1), &c1, sig, &sl), CM_OK);
    assert_memory_equal(c1.peer_public_key, key.pub, 32);
    assert_string_equal(c1.username, "vol");

    /* renewal: a new pass id, same key */
    rc = agent(NULL, &out, "pass", "--run", "demo", NULL);
    assert_int_equal(rc, 0);
    free(out);
    char *t2 = pass_token();
    struct cm_pass_claims c2;
    assert_int_equal(cm_token_parse(t2, strlen(t2), &c2, sig, &sl), CM_OK);
    assert_string_not_equal(c1.pass_id, c2.pass_id);
    assert_memory_equal(c2.peer_public_key, key.pub, 32);
    rc = agent(NULL, &out, "pass", "--run", "demo", "--show");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, c2.pass_id));
    free(out);
    free(t1);
    free(t2);
    cm_ed25519_cleanup(&key);
}

static void test_failures_are_clear(void **state)
{
    (void)state;
    char *out = NULL;
    const char *bad[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--ca-cert", g_c.ca,
                         "--username", "vol", "--password-stdin", "--config-dir", g_dir, NULL};
    int rc = ct_run(bad, "not-the-password\n", &out, 60);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "wrong username or password"));
    free(out);
    /* not allowlisted: clear error, no pass file written */
    rc = agent(NULL, &out, "pass", "--run", "closed", NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "not on the allowlist"));
    free(out);
    char p[400];
    snprintf(p, sizeof p, "%s/pass-closed.json", g_dir);
    assert_int_not_equal(access(p, F_OK), 0);
    /* usage errors exit 2 */
    const char *usage[] = {ct_bin("crowdtrain-agent"), "login", "--bogus", NULL};
    rc = ct_run(usage, NULL, &out, 10);
    assert_int_equal(rc, 2);
    free(out);
    /* join: every bad option is refused before anything is contacted or written
       (the volunteer is logged in: the session would be used otherwise) */
    static const char *const bad_join[][2] = {
        {"--compression", "zip"},      {"--device", "tpu"},
        {"--max-upload-mbps", "-3"},   {"--max-download-mbps", "0.01"},
        {"--dht-port", "70000"},       {"--steps", "-1"},
        {"--stall-ms", "5"},           {"--round-window-ms", "0"},
        {"--progress", "fancy"},       {"--gather-margin-ms", "5"},
        {"--gather-margin-ms", "9000"}, {"--pace", "0.3"},
        {"--pace", "1.5"},
    };
    static const char *const why[] = {
        "--compression must be none, fp16 or q8", "--device must be cpu, cuda or auto",
        "0 (no cap) or from 0.1", "0 (no cap) or from 0.1", "from 0 (any) to 65535",
        "0 (the run's) or positive", "--stall-ms must be in", "--round-window-ms >= 10",
        "--progress must be live, lines or auto", "--gather-margin-ms in [10, 5000]",
        "--gather-margin-ms in [10, 5000]", "--pace must be 0 (off) or from 0.5 to 1",
        "--pace must be 0 (off) or from 0.5 to 1",
    };
    for (size_t k = 0; k < sizeof bad_join / sizeof bad_join[0]; k++) {
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", "demo", bad_join[k][0],
                              bad_join[k][1], "--config-dir", g_dir, NULL};
        rc = ct_run(argv, NULL, &out, 10);
        if (rc != 2 || !strstr(out, why[k]))
            fail_msg("join %s %s: exit %d, said: %s", bad_join[k][0], bad_join[k][1], rc, out);
        free(out);
        snprintf(p, sizeof p, "%s/demo", g_dir);
        assert_int_not_equal(access(p, F_OK), 0); /* no run directory */
    }
    /* pipeline: the same, for its own options */
    static const char *const bad_pipe[][2] = {
        {"--max-cpu-percent", "0.5"}, {"--max-cpu-percent", "101"}, {"--samples-per-s", "-1"},
        {"--latency-ms", "20000"},    {"--stage-timeout-ms", "10"},
    };
    static const char *const why_pipe[] = {
        "--max-cpu-percent must be 0 (no limit) or from 1 to 100",
        "--max-cpu-percent must be 0 (no limit) or from 1 to 100", "--samples-per-s must be from 0",
        "--latency-ms must be from 0 to 10000", "--stage-timeout-ms must be from 1000",
    };
    for (size_t k = 0; k < sizeof bad_pipe / sizeof bad_pipe[0]; k++) {
        const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", "demo", bad_pipe[k][0],
                              bad_pipe[k][1], "--config-dir", g_dir, NULL};
        rc = ct_run(argv, NULL, &out, 10);
        if (rc != 2 || !strstr(out, why_pipe[k]))
            fail_msg("pipeline %s %s: exit %d, said: %s", bad_pipe[k][0], bad_pipe[k][1], rc, out);
        free(out);
        snprintf(p, sizeof p, "%s/demo", g_dir);
        assert_int_not_equal(access(p, F_OK), 0);
    }
    /* an untrusted certificate is explained */
    const char *nocert[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--username", "vol",
                            "--password-stdin", "--config-dir", g_dir, NULL};
    rc = ct_run(nocert, "volunteer-password\n", &out, 60);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "--ca-cert"));
    free(out);
}

/* 1 when pid is still running. */
static int alive(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

/* Ctrl-C while join is starting: the coordinator is stopped (SIGSTOP), so
 * the agent sits in its access-pass request, which would wait 30 s for an
 * answer. Ctrl-C must abandon it and leave at once, exit 130, saying so and
 * nothing else (the old agent had no handler yet and died silently). */
static void test_ctrl_c_during_start_up(void **state)
{
    (void)state;
    char log[400];
    snprintf(log, sizeof log, "%s/join-ctrl-c.log", g_dir);
    const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", "demo", "--config-dir", g_dir, NULL};
    assert_int_equal(kill(g_c.pid, SIGSTOP), 0);
    pid_t pid = ct_spawn(argv, log);
    assert_true(pid > 0);
    usleep(1500000);
    assert_true(alive(pid));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(pid, SIGINT);
    int rc = ct_wait(pid, 20);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_int_equal(kill(g_c.pid, SIGCONT), 0);
    char *out = ct_read_file(log, NULL);
    printf("join left %.1f s after Ctrl-C in its pass request: exit %d\n", took, rc);
    if (rc != 130 || !out || !strstr(out, "left during start-up (Ctrl-C)") || strstr(out, "error"))
        fail_msg("join after Ctrl-C in start-up: exit %d, said: %s", rc, out ? out : "");
    free(out);
    assert_true(took < 10); /* not the request's 30 s deadline */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_login_and_pass),
        cmocka_unit_test(test_failures_are_clear),
        cmocka_unit_test(test_ctrl_c_during_start_up),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
