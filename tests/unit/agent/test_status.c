/* Unit tests for agent/status.c, the file behind `crowdtrain-agent status`:
 * what the writer writes reads back; writes are throttled but a new step
 * or a final state is written at once; the file is replaced whole (no
 * temporary left behind) and readable by others (0644); the last error is
 * remembered after the trouble ends; and the summary says when the file is
 * stale or its writer gone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/status.h"
#include "cm_err.h"

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ct-status-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void read_view(struct agent_status_view *v)
{
    char path[128], buf[16384];
    snprintf(path, sizeof path, "%s/%s", g_dir, AGENT_STATUS_FILE);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(agent_status_parse(buf, n, v), CM_OK);
}

static void test_write_read_throttle(void **state)
{
    (void)state;
    struct agent_status st = {"fmnist", "training", 7, 500, 1024, 2048, 812.5, 3, 0.4321, 2.5, 0,
                              "", 0};
    agent_status_write(g_dir, &st, 0);
    struct agent_status_view v;
    read_view(&v);
    assert_string_equal(v.run, "fmnist");
    assert_string_equal(v.state, "training");
    assert_int_equal(v.step, 7);
    assert_int_equal(v.steps, 500);
    assert_int_equal(v.peers, 3);
    assert_true(fabs(v.loss - 0.4321) < 1e-9);
    assert_true(fabs(v.samples - 1024) < 1e-9 && fabs(v.target - 2048) < 1e-9);
    assert_int_equal(v.pid, (long)getpid());
    assert_int_equal(v.last_error_ms, 0);

    /* same step within the interval: skipped; a new step: written at once */
    st.peers = 9;
    agent_status_write(g_dir, &st, 0);
    read_view(&v);
    assert_int_equal(v.peers, 3);
    st.step = 8;
    st.loss = NAN; /* no loss yet: null, not a broken file */
    st.error = "no part averaged: aggregator 2 unreachable";
    agent_status_write(g_dir, &st, 0);
    read_view(&v);
    assert_int_equal(v.step, 8);
    assert_int_equal(v.peers, 9);
    assert_true(isnan(v.loss));
    assert_string_equal(v.last_error, "no part averaged: aggregator 2 unreachable");
    assert_true(v.last_error_ms > 0);

    /* the trouble is over: the last error stays, with its time */
    st.step = 9;
    st.error = "";
    agent_status_write(g_dir, &st, 0);
    read_view(&v);
    assert_string_equal(v.last_error, "no part averaged: aggregator 2 unreachable");

    /* a final state is forced through, at the last written step (-1) */
    struct agent_status fin = {"fmnist", "finished", -1, 500, NAN, 2048, NAN, 0, NAN, NAN, 0, "", 0};
    agent_status_write(g_dir, &fin, 1);
    read_view(&v);
    assert_string_equal(v.state, "finished");
    assert_int_equal(v.step, 9);
    assert_int_equal(v.exit_status, 0);

    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, AGENT_STATUS_FILE);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0644);
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            files++;
    closedir(d);
    assert_int_equal(files, 1); /* no temporary left */
}

static void test_parse_rejects(void **state)
{
    (void)state;
    struct agent_status_view v;
    const char *bad[] = {"", "[]", "{\"version\":2,\"state\":\"training\",\"updated_ms\":1,\"pid\":1}",
                         "{\"version\":1,\"updated_ms\":1,\"pid\":1}", "{\"version\":1,\"state\":\"x\"",
                         "{\"version\":1,\"state\":\"training\",\"updated_ms\":\"1\",\"pid\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(agent_status_parse(bad[i], strlen(bad[i]), &v), CM_EPARSE);
}

/* agent_status_print into a buffer; returns its verdict */
static int summary(const struct agent_status_view *v, int64_t now, enum agent_status_alive alive,
                   char *out, size_t cap)
{
    FILE *f = fmemopen(out, cap, "w");
    assert_non_null(f);
    int r = agent_status_print(f, "/x/status.json", v, now, alive);
    fclose(f);
    return r;
}

static void test_summary(void **state)
{
    (void)state;
    const char *js = "{\"version\":1,\"run\":\"fm\",\"state\":\"training\",\"pid\":4242,"
                     "\"started_ms\":1000000,\"updated_ms\":2000000,\"step\":12,\"steps\":50,"
                     "\"samples\":512,\"target\":2048,\"samples_per_s\":100,\"peers\":4,"
                     "\"loss\":0.5,\"eta_s\":null,\"pull_only\":false,\"error\":\"\"}";
    struct agent_status_view v;
    assert_int_equal(agent_status_parse(js, strlen(js), &v), CM_OK);
    char out[4096];
    assert_int_equal(summary(&v, 2000000 + 5000, AGENT_ALIVE_YES, out, sizeof out), 0);
    assert_non_null(strstr(out, "running (pid 4242"));
    assert_non_null(strstr(out, "step:      12 of 50, samples 512 of 2048 (25%)"));
    assert_non_null(strstr(out, "peers:     4"));
    assert_non_null(strstr(out, "last error: none"));
    assert_null(strstr(out, "warning"));
    /* stale: said, and not "training" for scripts */
    assert_int_equal(summary(&v, 2000000 + AGENT_STATUS_STALE_MS + 1000, AGENT_ALIVE_YES, out, sizeof out), 1);
    assert_non_null(strstr(out, "no update for more than"));
    /* its writer gone without a final state */
    assert_int_equal(summary(&v, 2000000 + 5000, AGENT_ALIVE_NO, out, sizeof out), 1);
    assert_non_null(strstr(out, "NOT RUNNING"));
}

/* A paused agent (crowdtrain-agent pause): alive and well for scripts,
 * says so and how to go on, no exit status in its file; its writer gone
 * without a final word is "NOT RUNNING" as for a training one. */
static void test_summary_paused(void **state)
{
    (void)state;
    const char *js = "{\"version\":1,\"run\":\"fm\",\"state\":\"paused\",\"pid\":4242,"
                     "\"started_ms\":1000000,\"updated_ms\":2000000,\"step\":12,\"steps\":50,"
                     "\"samples\":null,\"target\":2048,\"samples_per_s\":0,\"peers\":3,"
                     "\"loss\":null,\"eta_s\":null,\"pull_only\":false,\"error\":\"\"}";
    struct agent_status_view v;
    assert_int_equal(agent_status_parse(js, strlen(js), &v), CM_OK);
    char out[4096];
    assert_int_equal(summary(&v, 2000000 + 5000, AGENT_ALIVE_YES, out, sizeof out), 0);
    assert_non_null(strstr(out, "state:     paused"));
    assert_non_null(strstr(out, "crowdtrain-agent resume"));
    assert_non_null(strstr(out, "step:      12 of 50\n"));
    assert_null(strstr(out, "exit status"));
    assert_null(strstr(out, "speed:"));
    assert_int_equal(summary(&v, 2000000 + AGENT_STATUS_STALE_MS + 1000, AGENT_ALIVE_YES, out, sizeof out), 1);
    assert_non_null(strstr(out, "no update for more than"));
    assert_int_equal(summary(&v, 2000000 + 5000, AGENT_ALIVE_NO, out, sizeof out), 1);
    assert_non_null(strstr(out, "NOT RUNNING"));
}

static void test_write_paused(void **state)
{
    (void)state;
    struct agent_status st = {"fmnist", "paused", 7, 500, NAN, 2048, 0, 3, NAN, NAN, 0, "", 0};
    agent_status_write(g_dir, &st, 0);
    char path[128], buf[16384];
    snprintf(path, sizeof path, "%s/%s", g_dir, AGENT_STATUS_FILE);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_null(strstr(buf, "exit_status")); /* not a final state */
    struct agent_status_view v;
    read_view(&v);
    assert_string_equal(v.state, "paused");
    assert_int_equal(v.step, 7);
}

static void test_pid_alive(void **state)
{
    (void)state;
    /* this test binary is not named crowdtrain-agent: a reused pid */
    assert_int_equal(agent_status_pid_alive((long)getpid()), AGENT_ALIVE_NO);
    assert_int_equal(agent_status_pid_alive(0), AGENT_ALIVE_NO);
    assert_int_equal(agent_status_pid_alive(0x3fffffff), AGENT_ALIVE_NO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_read_throttle, setup, teardown),
        cmocka_unit_test(test_parse_rejects),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_summary_paused),
        cmocka_unit_test_setup_teardown(test_write_paused, setup, teardown),
        cmocka_unit_test(test_pid_alive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
