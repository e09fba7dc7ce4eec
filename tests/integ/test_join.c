/* ct-timeout: 1200 */
/* Collaborative training end to end (issue 5; seed 000 §3): PostgreSQL, the
 * coordinator and four real `crowdtrain-agent join` processes on loopback
 * train the Fashion-MNIST MLP of examples/fmnist-collab.json together. Done
 * when every agent reaches >= 88.5 % test accuracy with byte-identical
 * exported models (the same averaged gradient and optimizer step
 * everywhere), and the coordinator holds their checkpoints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"

#define NAGENTS 4

/* Under AddressSanitizer the agents run ~3x slower: the sanitizer build runs
 * a short collaboration that checks memory safety and lockstep, and leaves
 * the accuracy target to the normal build. */
#if defined(__SANITIZE_ADDRESS__)
#define SHORT_RUN 1
#else
#define SHORT_RUN 0
#endif
#define STEPS (SHORT_RUN ? 60 : 0) /* 0: the recipe's 500 */

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[NAGENTS][256];
static int g_teardown_failed;

/* The example recipe with its manifests made absolute. */
static char *run_body(const char *name, long steps)
{
    char ex[PATH_MAX], path[PATH_MAX + 64];
    if (!realpath("examples", ex))
        return NULL;
    snprintf(path, sizeof path, "%s/fmnist-collab.json", ex);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg)
        return NULL;
    json_t *data = json_object_get(cfg, "data");
    char tr[PATH_MAX + 64], ev[PATH_MAX + 64];
    snprintf(tr, sizeof tr, "%s/fmnist-train.manifest.json", ex);
    snprintf(ev, sizeof ev, "%s/fmnist-test.manifest.json", ex);
    json_object_set_new(data, "train", json_string(tr));
    json_object_set_new(data, "eval", json_string(ev));
    if (steps)
        json_object_set_new(cfg, "steps", json_integer(steps));
    json_t *body = json_pack("{s:s, s:I, s:s, s:o}", "name", name, "target_batch_size",
                             json_integer_value(json_object_get(cfg, "batch_size")),
                             "model_summary", "MLP 784-256-128-10", "config", cfg);
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return s;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    /* Passes live 90 s, so the agents must renew theirs (at a third left)
       several times during the run, or their peers would refuse them. */
    const char *args[] = {"--pass-ttl", "90", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    char *body = run_body("fmnist-collab", STEPS);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    if (r.status != 201)
        return -1;
    ct_resp_free(&r);
    for (int i = 0; i < NAGENTS; i++) {
        char b[200], path[128], name[16];
        snprintf(name, sizeof name, "vol%d", i);
        snprintf(b, sizeof b, "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"volunteer-pw\"}", name);
        ct_http(&g_c, "POST", "/api/v1/users", g_org, b, &r);
        ct_resp_free(&r);
        snprintf(path, sizeof path, "/api/v1/runs/fmnist-collab/allowlist/%s", name);
        ct_http(&g_c, "PUT", path, g_org, NULL, &r);
        ct_resp_free(&r);
        if (ct_tempdir("agent", g_dirs[i], sizeof g_dirs[i]) != 0)
            return -1;
        const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--ca-cert",
                              g_c.ca, "--username", name, "--password-stdin", "--config-dir", g_dirs[i], NULL};
        char *out = NULL;
        int lrc = ct_run(argv, "volunteer-pw\n", &out, 60);
        free(out);
        if (lrc != 0)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NAGENTS; i++)
        ct_rmrf(g_dirs[i]);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

static double accuracy_of(const char *log)
{
    const char *p = strstr(log, "evaluation at step");
    const char *a = p ? strstr(p, "accuracy ") : NULL;
    return a ? atof(a + 9) : -1;
}

static void test_four_agents_train_together(void **state)
{
    (void)state;
    pid_t pids[NAGENTS];
    char logs[NAGENTS][300];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%s/join.log", g_dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", "fmnist-collab", "--config-dir",
                              g_dirs[i], "--listen-ip", "127.0.0.1", "--device", "cpu",
                              /* loopback: announcements propagate in milliseconds */
                              "--round-window-ms", "150", NULL};
        pids[i] = ct_spawn(argv, logs[i]);
        assert_true(pids[i] > 0);
    }
    int ok = 1;
    for (int i = 0; i < NAGENTS; i++) {
        int st = ct_wait(pids[i], 1100);
        if (st != 0) {
            char *log = ct_read_file(logs[i], NULL);
            fprintf(stderr, "agent %d exited %d:\n%s\n", i, st, log ? log : "");
            free(log);
            ok = 0;
        }
    }
    assert_true(ok);
    double acc[NAGENTS];
    char *model0 = NULL;
    size_t len0 = 0;
    for (int i = 0; i < NAGENTS; i++) {
        char *log = ct_read_file(logs[i], NULL);
        assert_non_null(log);
        acc[i] = accuracy_of(log);
        printf("agent %d: test accuracy %.2f%%\n", i, acc[i]);
        free(log);
        char mp[300];
        snprintf(mp, sizeof mp, "%s/fmnist-collab.safetensors", g_dirs[i]);
        size_t len = 0;
        char *model = ct_read_file(mp, &len);
        assert_non_null(model);
        if (i == 0) {
            model0 = model;
            len0 = len;
        } else {
            assert_int_equal(len, len0);
            /* Lockstep is asserted in the normal build. Under ASan a round can
               miss its deadlines on a loaded machine, and a part that is not
               averaged keeps local values (no outcome agreement yet). */
            if (!SHORT_RUN && memcmp(model, model0, len) != 0)
                fail_msg("agent %d's model differs from agent 0's", i);
            free(model);
        }
    }
    free(model0);
    if (!SHORT_RUN) { /* the run outlived the first pass: it was renewed */
        char *log = ct_read_file(logs[0], NULL);
        assert_non_null(strstr(log, "renewed the access pass"));
        free(log);
    }
    for (int i = 0; i < NAGENTS; i++) {
        if (!SHORT_RUN) {
            assert_true(acc[i] == acc[0]);
            assert_true(acc[i] >= 88.5);
        } else {
            assert_true(acc[i] >= 70.0);
        }
    }
    /* checkpoints were uploaded along the way (every 50 steps, newest 3 kept) */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist-collab/checkpoints", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *list = json_object_get(r.json, "checkpoints");
    assert_true(json_array_size(list) >= 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 0), "step")),
                     SHORT_RUN ? 50 : 500);
    ct_resp_free(&r);
}

/* Waits until a log shows the agent at `step` (its progress line). */
static int wait_for_step(const char *log, long step, int timeout_s)
{
    char needle[32];
    snprintf(needle, sizeof needle, "step %6ld |", step);
    for (int i = 0; i < timeout_s * 10; i++) {
        char *t = ct_read_file(log, NULL);
        int found = t && strstr(t, needle);
        free(t);
        if (found)
            return 1;
        usleep(100000);
    }
    return 0;
}

/* Failures: one agent is killed with SIGKILL and one leaves with Ctrl-C in
 * the middle of the run; the others are not stalled and finish the run.
 * Their parameters are not compared: when an aggregator dies mid-round its
 * part keeps each peer's local values (seed 000, Appendix C), so survivors
 * can differ after such a round. Keeping them identical needs agreement on
 * the round's outcome, which is not built yet (issue 5's chaos criterion). */
static void test_agents_leaving(void **state)
{
    (void)state;
    char *body = run_body("fmnist-leave", 80);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    for (int i = 0; i < NAGENTS; i++) {
        char path[128];
        snprintf(path, sizeof path, "/api/v1/runs/fmnist-leave/allowlist/vol%d", i);
        ct_http(&g_c, "PUT", path, g_org, NULL, &r);
        ct_resp_free(&r);
    }
    pid_t pids[NAGENTS];
    char logs[NAGENTS][300];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%s/leave.log", g_dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", "fmnist-leave", "--config-dir",
                              g_dirs[i], "--listen-ip", "127.0.0.1", "--device", "cpu",
                              "--round-window-ms", "150", "--no-eval", NULL};
        pids[i] = ct_spawn(argv, logs[i]);
    }
    assert_true(wait_for_step(logs[0], 20, 300));
    kill(pids[3], SIGKILL);
    assert_true(wait_for_step(logs[0], 35, 300));
    kill(pids[2], SIGINT);
    assert_int_equal(ct_wait(pids[3], 30), 128 + SIGKILL);
    int st2 = ct_wait(pids[2], 120);
    char *log2 = ct_read_file(logs[2], NULL);
    if (st2 != 0 || !strstr(log2, "left the run"))
        fail_msg("the agent that got Ctrl-C exited %d:\n%s", st2, log2);
    free(log2);
    for (int i = 0; i < 2; i++) {
        int st = ct_wait(pids[i], 600);
        char *log = ct_read_file(logs[i], NULL);
        if (st != 0)
            fail_msg("agent %d exited %d:\n%s", i, st, log);
        free(log);
    }
    /* both survivors reached the last step and exported their model */
    for (int i = 0; i < 2; i++) {
        char mp[512];
        snprintf(mp, sizeof mp, "%.255s/fmnist-leave.safetensors", g_dirs[i]);
        assert_int_equal(access(mp, R_OK), 0);
        assert_true(wait_for_step(logs[i], 79, 1));
    }
    ct_http(&g_c, "GET", "/api/v1/runs/fmnist-leave/checkpoints/latest", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_agents_train_together),
        cmocka_unit_test(test_agents_leaving),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
