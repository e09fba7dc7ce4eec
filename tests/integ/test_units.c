/* ct-timeout: 60 */
/* The systemd units as `make install` writes them (scripts/install.sh,
 * packaging/systemd/): `systemd-analyze verify` accepts both, silently (an
 * unknown or misspelt directive is only a warning there, so any output
 * fails), with their ExecStart binaries installed under a temporary
 * prefix. A unit naming a missing binary must fail the same check, so the
 * tool is shown to look. Skips (77) where systemd-analyze is not installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"

static char g_build[PATH_MAX], g_tmp[PATH_MAX], g_analyze[PATH_MAX];

static int verify(const char *unit, char **out)
{
    const char *argv[] = {g_analyze, "verify", unit, NULL};
    return ct_run(argv, NULL, out, 30);
}

static void test_units_verify(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        char unit[PATH_MAX + 64];
        snprintf(unit, sizeof unit, "%s/units/crowdtrain-%s.service", g_tmp, i ? "agent" : "coordinator");
        char *out = NULL;
        int rc = verify(unit, &out);
        if (rc != 0 || (out && *out))
            fprintf(stderr, "systemd-analyze verify %s: exit %d\n%s\n", unit, rc, out ? out : "");
        assert_int_equal(rc, 0);
        assert_true(!out || !*out);
        free(out);
    }
}

static void test_verify_catches_a_bad_unit(void **state)
{
    (void)state;
    char unit[PATH_MAX + 64], bad[PATH_MAX + 64], cmd[3 * PATH_MAX];
    snprintf(unit, sizeof unit, "%s/units/crowdtrain-agent.service", g_tmp);
    snprintf(bad, sizeof bad, "%s/units/crowdtrain-broken.service", g_tmp);
    snprintf(cmd, sizeof cmd, "sed 's|/bin/crowdtrain-agent |/bin/crowdtrain-missing |' '%s' > '%s'", unit, bad);
    assert_int_equal(system(cmd), 0);
    char *out = NULL;
    int rc = verify(bad, &out);
    assert_int_not_equal(rc, 0);
    assert_true(out && strstr(out, "crowdtrain-missing"));
    free(out);
}

static int setup(void **state)
{
    (void)state;
    const char *cands[] = {"/usr/bin/systemd-analyze", "/bin/systemd-analyze"};
    for (size_t i = 0; i < 2 && !g_analyze[0]; i++)
        if (access(cands[i], X_OK) == 0)
            snprintf(g_analyze, sizeof g_analyze, "%s", cands[i]);
    if (!g_analyze[0]) {
        printf("SKIP: systemd-analyze not installed (apt-get install systemd): units not verified\n");
        exit(77);
    }
    snprintf(g_build, sizeof g_build, "%s", ct_bin("x"));
    *strrchr(g_build, '/') = '\0';
    *strrchr(g_build, '/') = '\0';
    char idx[PATH_MAX + 32];
    snprintf(idx, sizeof idx, "%s/web/dist/index.html", g_build);
    if (access(idx, R_OK) != 0) {
        printf("SKIP: %s is not built (the dashboard needs node and npm: scripts/install-deps.sh)\n", idx);
        exit(77);
    }
    if (ct_tempdir("units", g_tmp, sizeof g_tmp) != 0)
        return -1;
    char pfx[PATH_MAX + 16], etc[PATH_MAX + 16], units[PATH_MAX + 16];
    snprintf(pfx, sizeof pfx, "%s/usr", g_tmp);
    snprintf(etc, sizeof etc, "%s/etc", g_tmp);
    snprintf(units, sizeof units, "%s/units", g_tmp);
    const char *argv[] = {"scripts/install.sh", "--build", g_build, "--prefix", pfx, "--sysconfdir", etc,
                          "--unitdir", units, NULL};
    char *out = NULL;
    int rc = ct_run(argv, NULL, &out, 30);
    if (rc != 0)
        fprintf(stderr, "install.sh: %s\n", out ? out : "");
    free(out);
    return rc == 0 ? 0 : -1;
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
        cmocka_unit_test(test_units_verify),
        cmocka_unit_test(test_verify_catches_a_bad_unit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
