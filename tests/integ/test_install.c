/* ct-timeout: 60 */
/* `make install` (scripts/install.sh) against the real build:
 *  - under a prefix, exactly the expected files: both binaries, every file
 *    of the built dashboard, the examples, both units with that prefix's
 *    paths filled in, both example configurations;
 *  - the installed coordinator finds the installed dashboard by itself
 *    (PREFIX/share/crowdtrain/web, next to its binary) with no --web-dir;
 *  - with a DESTDIR, the files land under it while the units name the
 *    final paths, and an existing configuration is kept;
 *  - the installed agent's `status` says "absent" for a state directory
 *    no agent trained with, and "NOT RUNNING" for a status file whose
 *    writer is gone.
 * The units themselves are checked by systemd-analyze in test_units.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ct_harness.h"

static char g_build[PATH_MAX], g_tmp[PATH_MAX];

/* the build dir: ct_bin gives BUILD/bin/NAME */
static void find_build(void)
{
    snprintf(g_build, sizeof g_build, "%s", ct_bin("x"));
    *strrchr(g_build, '/') = '\0';
    *strrchr(g_build, '/') = '\0';
}

static int install(const char *const *extra, char **out)
{
    const char *argv[24] = {"scripts/install.sh", "--build", g_build};
    size_t n = 3;
    for (size_t i = 0; extra[i] && n < 23; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return ct_run(argv, NULL, out, 30);
}

/* Every regular file under dir, relative, one per line, sorted. */
static void list_files(const char *dir, char *out, size_t cap)
{
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -type f | sed 's|^\\./||' | LC_ALL=C sort", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    pclose(p);
}

/* The files a prefix install must hold, from the build and the tree. */
static void expected_files(const char *prefix_rel, const char *units_rel, const char *etc_rel, char *out,
                           size_t cap)
{
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "{ echo %1$s/bin/crowdtrain-agent; echo %1$s/bin/crowdtrain-coordinator; "
             "for f in '%4$s'/web/dist/*; do echo %1$s/share/crowdtrain/web/$(basename $f); done; "
             "for f in examples/*.json; do echo %1$s/share/crowdtrain/examples/$(basename $f); done; "
             "echo %2$s/crowdtrain-agent.service; echo %2$s/crowdtrain-coordinator.service; "
             "echo %3$s/crowdtrain/agent.conf; echo %3$s/crowdtrain/coordinator.conf; } | LC_ALL=C sort",
             prefix_rel, units_rel, etc_rel, g_build);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    pclose(p);
}

static char *unit_line(const char *unit, const char *key)
{
    size_t len;
    char *text = ct_read_file(unit, &len);
    assert_non_null(text);
    char k[64];
    snprintf(k, sizeof k, "\n%s=", key);
    char *at = strstr(text, k);
    assert_non_null(at);
    at += strlen(k);
    char *v = strndup(at, strcspn(at, "\n"));
    free(text);
    return v;
}

static void test_prefix_install(void **state)
{
    (void)state;
    char pfx[PATH_MAX + 16], etc[PATH_MAX + 16], units[PATH_MAX + 16];
    snprintf(pfx, sizeof pfx, "%s/usr", g_tmp);
    snprintf(etc, sizeof etc, "%s/etc", g_tmp);
    snprintf(units, sizeof units, "%s/units", g_tmp);
    const char *args[] = {"--prefix", pfx, "--sysconfdir", etc, "--unitdir", units, NULL};
    char *out = NULL;
    int rc = install(args, &out);
    if (rc != 0)
        fprintf(stderr, "%s", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);

    static char got[65536], want[65536];
    list_files(g_tmp, got, sizeof got);
    expected_files("usr", "units", "etc", want, sizeof want);
    assert_string_equal(got, want);

    /* the units name this prefix's binaries and configuration */
    char unit[PATH_MAX + 64], exp[3 * PATH_MAX];
    snprintf(unit, sizeof unit, "%s/crowdtrain-coordinator.service", units);
    char *exec = unit_line(unit, "ExecStart");
    snprintf(exp, sizeof exp, "%s/bin/crowdtrain-coordinator serve --config %s/crowdtrain/coordinator.conf", pfx, etc);
    assert_string_equal(exec, exp);
    free(exec);
    snprintf(unit, sizeof unit, "%s/crowdtrain-agent.service", units);
    exec = unit_line(unit, "ExecStart");
    snprintf(exp, sizeof exp,
             "%s/bin/crowdtrain-agent join --config %s/crowdtrain/agent.conf --config-dir "
             "/var/lib/crowdtrain/agent --progress lines", pfx, etc);
    assert_string_equal(exec, exp);
    free(exec);
    char *user = unit_line(unit, "User");
    assert_string_equal(user, "crowdtrain");
    free(user);

    /* the installed coordinator serves the installed dashboard unasked: it
       says so at start, before it looks for its database (none here) */
    char bin[PATH_MAX + 64], data[PATH_MAX + 16], log[PATH_MAX + 16];
    snprintf(bin, sizeof bin, "%s/bin/crowdtrain-coordinator", pfx);
    snprintf(data, sizeof data, "%s/data", g_tmp);
    snprintf(log, sizeof log, "%s/coordinator.log", g_tmp);
    const char *serve[] = {bin, "serve", "--database-url", "postgresql://nobody@127.0.0.1:1/none",
                           "--data-dir", data, "--listen", "127.0.0.1:0", "--dht-port", "-1", NULL};
    pid_t pid = ct_spawn(serve, log);
    assert_true(pid > 0);
    char line[PATH_MAX + 64];
    snprintf(line, sizeof line, "dashboard files from %s/share/crowdtrain/web\n", pfx);
    size_t len = 0;
    char *text = NULL;
    for (int i = 0; i < 100; i++) {
        free(text);
        text = ct_read_file(log, &len);
        if (text && (strstr(text, line) || strstr(text, "no dashboard files")))
            break;
        usleep(50000);
    }
    kill(pid, SIGKILL); /* it would retry the database for 30 s */
    ct_wait(pid, 5);
    if (!text || !strstr(text, line))
        fprintf(stderr, "expected \"%s\" in:\n%s\n", line, text ? text : "");
    assert_true(text && strstr(text, line));
    free(text);
}

static void test_destdir_install(void **state)
{
    (void)state;
    char dest[PATH_MAX + 16];
    snprintf(dest, sizeof dest, "%s/dest", g_tmp);
    const char *args[] = {"--destdir", dest, "--prefix", "/usr/local", NULL};
    char *out = NULL;
    assert_int_equal(install(args, &out), 0);
    free(out);
    static char got[65536], want[65536];
    list_files(dest, got, sizeof got);
    expected_files("usr/local", "usr/local/lib/systemd/system", "etc", want, sizeof want);
    assert_string_equal(got, want);
    char unit[2 * PATH_MAX];
    snprintf(unit, sizeof unit, "%s/usr/local/lib/systemd/system/crowdtrain-agent.service", dest);
    char *exec = unit_line(unit, "ExecStart");
    assert_true(!strncmp(exec, "/usr/local/bin/crowdtrain-agent join --config /etc/crowdtrain/agent.conf ",
                         strlen("/usr/local/bin/crowdtrain-agent join --config /etc/crowdtrain/agent.conf ")));
    free(exec);

    /* a second install keeps the volunteer's configuration */
    char conf[PATH_MAX + 64];
    snprintf(conf, sizeof conf, "%s/etc/crowdtrain/agent.conf", dest);
    FILE *f = fopen(conf, "w");
    assert_non_null(f);
    fputs("run = mine\n", f);
    fclose(f);
    assert_int_equal(install(args, &out), 0);
    assert_non_null(out);
    assert_non_null(strstr(out, "keeping"));
    free(out);
    size_t len;
    char *text = ct_read_file(conf, &len);
    assert_non_null(text);
    assert_string_equal(text, "run = mine\n");
    free(text);
}

static void test_status_command(void **state)
{
    (void)state;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/agent-state", g_tmp);
    assert_int_equal(mkdir(dir, 0700), 0);
    const char *argv[] = {ct_bin("crowdtrain-agent"), "status", "--config-dir", dir, NULL};
    char *out = NULL;
    assert_int_equal(ct_run(argv, NULL, &out, 10), 3);
    assert_true(out && strstr(out, "absent"));
    free(out);

    /* a training agent that died without a final word */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/status.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"version\":1,\"run\":\"fm\",\"state\":\"training\",\"pid\":1073741823,"
               "\"started_ms\":1,\"updated_ms\":%lld,\"step\":3,\"steps\":9,\"peers\":2,"
               "\"samples\":1,\"target\":2,\"samples_per_s\":1,\"loss\":null,\"eta_s\":null,"
               "\"pull_only\":false,\"error\":\"\"}\n", (long long)time(NULL) * 1000);
    fclose(f);
    assert_int_equal(ct_run(argv, NULL, &out, 10), 1);
    assert_true(out && strstr(out, "NOT RUNNING"));
    assert_true(strstr(out, "step:      3 of 9"));
    free(out);
}

static int setup(void **state)
{
    (void)state;
    find_build();
    char idx[PATH_MAX + 32];
    snprintf(idx, sizeof idx, "%s/web/dist/index.html", g_build);
    if (access(idx, R_OK) != 0) {
        printf("SKIP: %s is not built (the dashboard needs node and npm: scripts/install-deps.sh)\n", idx);
        exit(77);
    }
    return ct_tempdir("install", g_tmp, sizeof g_tmp);
}

static int teardown(void **state)
{
    (void)state;
    ct_rmrf(g_tmp);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_install),
        cmocka_unit_test(test_destdir_install),
        cmocka_unit_test(test_status_command),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
