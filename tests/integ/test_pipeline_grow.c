/* ct-timeout: 300 */
/* Faster volunteers join a pipeline run while everyone is alive (issue 19:
 * "the coordinator solves ... again when peers join or leave";
 * docs/pipelines.md, "Re-scheduling"): PostgreSQL, the coordinator and
 * `crowdtrain-agent pipeline` processes on loopback, with the command line
 * a volunteer types, on a run of a tiny byte GPT in 2 stages x 2 replicas.
 * Four volunteers declaring 100 samples/s start and train. Two declaring
 * 400 join once the first four trained a few steps: the coordinator
 * re-solves with the four fastest, and the agents move to that assignment
 * between two steps, without any of them failing or waiting for a stage
 * timeout (60 s here): the two newcomers load their stages' state from the
 * agents that held it, two of the first four go on, the other two become
 * spares that serve their state and end with the run.
 *
 * Checked: all six exit 0, none failed a step; the first four said they
 * moved to a newer assignment, two of them ended as spares; the newcomers
 * trained under it; the first step under the new assignment came less than
 * 20 s after the last under the old one; the two replicas of a stage hold
 * the same parameters at every step they both logged under the same
 * assignment (hash); and every step's loss equals `train --local`'s on the
 * same recipe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_pipeline.h"

#define N 6
#define FIRST 4 /* the volunteers that start; the others join */
#define STEPS 12
#define RUN "gpt-pipe-grow"
#define EQ_TOL 1e-5 /* the replicas' gradients are summed in another order */

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[N][256];
static char g_data[256];
static char g_recipe[300];

static int setup(void **state)
{
    (void)state;
    if (ct_pipeline_backbone(&g_pg, &g_c, &g_org, "pipegrow", g_data, sizeof g_data) != 0)
        return -1;
    json_t *cfg = ct_pipeline_recipe(g_data, 2, STEPS, 21); /* tests/harness/ct_pipeline.h */
    if (!cfg)
        return -1;
    snprintf(g_recipe, sizeof g_recipe, "%.250s/local.json", g_data);
    if (json_dump_file(cfg, g_recipe, 0) != 0)
        return -1;
    json_object_set_new(cfg, "pipeline",
                        json_pack("{s:i, s:i, s:i, s:i, s:f}", "stages", 2, "replicas", 2, "min_replicas", 1,
                                  "liveness_s", 10, "gradient_bytes", 1e6));
    if (ct_pipeline_create_run(&g_c, g_org, RUN, "tiny byte GPT in 2 stages x 2 replicas", cfg) != 0)
        return -1;
    return ct_volunteers(&g_c, g_org, RUN, N, g_dirs);
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    if (!getenv("CT_KEEP_LOGS")) {
        for (int i = 0; i < N; i++)
            if (g_dirs[i][0])
                ct_rmrf(g_dirs[i]);
        ct_rmrf(g_data);
    }
    free(g_org);
    return rc;
}

struct slog {
    int n, stage[STEPS + 2], replica[STEPS + 2];
    long long version[STEPS + 2];
    double loss[STEPS + 2], t_ms[STEPS + 2];
    char hash[STEPS + 2][17];
};

/* The newest line of each step (a step begun under the old assignment may
 * be taken again under the new one). */
static int read_slog(const char *path, struct slog *s)
{
    memset(s, 0, sizeof *s);
    for (int k = 0; k < STEPS + 2; k++)
        s->loss[k] = NAN;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        long step = j ? (long)json_integer_value(json_object_get(j, "step")) : 0;
        if (step >= 1 && step <= STEPS) {
            s->n++;
            s->stage[step] = (int)json_integer_value(json_object_get(j, "stage"));
            s->replica[step] = (int)json_integer_value(json_object_get(j, "replica"));
            s->version[step] = json_integer_value(json_object_get(j, "version"));
            s->t_ms[step] = json_number_value(json_object_get(j, "t_ms"));
            json_t *l = json_object_get(j, "loss");
            s->loss[step] = json_is_number(l) ? json_number_value(l) : NAN;
            const char *h = json_string_value(json_object_get(j, "hash"));
            snprintf(s->hash[step], sizeof s->hash[step], "%s", h ? h : "");
        }
        json_decref(j);
    }
    fclose(f);
    return 0;
}

static pid_t spawn_stage(int i, const char *log, const char *steplog)
{
    const char *sps = i < FIRST ? "100" : "400";
    /* 100 ms on every frame: steps slow enough for the newcomers to start
       (and the coordinator to re-solve) before the run ends */
    const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", RUN, "--config-dir", g_dirs[i],
                          "--listen-ip", "127.0.0.1", "--device", "cpu", "--step-log", steplog, "--wait-s", "120",
                          "--stage-timeout-ms", "60000", "--latency-ms", "100", "--samples-per-s", sps, NULL};
    return ct_spawn(argv, log);
}

static void test_grow_while_alive(void **state)
{
    (void)state;
    char logs[N][320], steplogs[N][320];
    pid_t pids[N] = {0};
    for (int i = 0; i < N; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/grow.log", g_dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/grow.steps", g_dirs[i]);
    }
    for (int i = 0; i < FIRST; i++)
        assert_true((pids[i] = spawn_stage(i, logs[i], steplogs[i])) > 0);
    /* the first four train a few steps */
    static struct slog s[N];
    int ready = 0;
    for (int t = 0; t < 900 && ready < FIRST; t++) {
        ready = 0;
        for (int i = 0; i < FIRST; i++)
            ready += read_slog(steplogs[i], &s[i]) == 0 && s[i].n >= 2;
        if (ready < FIRST)
            usleep(100000);
    }
    assert_int_equal(ready, FIRST);
    printf("the first four trained %d steps; two faster volunteers start\n", s[0].n);
    fflush(stdout);
    for (int i = FIRST; i < N; i++)
        assert_true((pids[i] = spawn_stage(i, logs[i], steplogs[i])) > 0);
    for (int i = 0; i < N; i++) {
        int st = ct_wait(pids[i], 240);
        if (st != 0) {
            char *l = ct_read_file(logs[i], NULL);
            fprintf(stderr, "agent %d exited with %d; its log:\n%s\n", i, st, l ? l : "");
            free(l);
        }
        assert_int_equal(st, 0);
    }
    int spares = 0;
    for (int i = 0; i < N; i++) {
        char *l = ct_read_file(logs[i], NULL);
        assert_non_null(l);
        assert_int_equal(read_slog(steplogs[i], &s[i]), 0);
        if (strstr(l, "failed (") || strstr(l, "sent nothing"))
            fail_msg("agent %d failed a step: %s", i, l);
        if (i < FIRST && !strstr(l, "newer assignment"))
            fail_msg("agent %d did not move to the newer assignment: %s", i, l);
        spares += i < FIRST && strstr(l, "while this agent was a spare") != NULL;
        free(l);
    }
    assert_int_equal(spares, 2);
    /* the first two's last step under version 1, and everyone's first
       under a newer one */
    double last_v1 = 0, first_v2 = INFINITY;
    long long v1 = 0, v2 = 0;
    for (int k = 1; k <= STEPS; k++)
        for (int i = 0; i < N; i++) {
            if (!s[i].hash[k][0])
                continue;
            if (!v1 || s[i].version[k] < v1)
                v1 = s[i].version[k];
        }
    for (int k = 1; k <= STEPS; k++)
        for (int i = 0; i < N; i++) {
            if (!s[i].hash[k][0])
                continue;
            if (s[i].version[k] == v1)
                last_v1 = fmax(last_v1, s[i].t_ms[k]);
            else if (s[i].t_ms[k] < first_v2) {
                first_v2 = s[i].t_ms[k];
                v2 = s[i].version[k];
            }
        }
    assert_true(v2 > v1);
    printf("assignment %lld -> %lld: %.1f s from the last step under the first to the first under the newer\n",
           v1, v2, (first_v2 - last_v1) / 1000);
    assert_true(first_v2 - last_v1 < 20000);
    for (int i = FIRST; i < N; i++) { /* the newcomers trained under it */
        int under = 0;
        for (int k = 1; k <= STEPS; k++)
            under += s[i].hash[k][0] && s[i].version[k] > v1;
        printf("newcomer %d: %d steps under assignment %lld\n", i, under, v2);
        assert_true(under >= 1);
    }
    /* two replicas of each stage under the newer assignment: the same
       parameters whenever both logged a step */
    int compared = 0;
    for (int k = 1; k <= STEPS; k++)
        for (int a = 0; a < N; a++)
            for (int b = a + 1; b < N; b++)
                if (s[a].hash[k][0] && s[b].hash[k][0] && s[a].version[k] > v1 &&
                    s[a].version[k] == s[b].version[k] && s[a].stage[k] == s[b].stage[k]) {
                    assert_int_not_equal(s[a].replica[k], s[b].replica[k]);
                    assert_string_equal(s[a].hash[k], s[b].hash[k]);
                    compared++;
                }
    printf("%d steps compared between the replicas of a stage\n", compared);
    assert_true(compared >= 2);
    /* every step's loss: the single process's */
    char local_log[320];
    snprintf(local_log, sizeof local_log, "%.250s/local.steps", g_data);
    ct_pipeline_train_local(g_recipe, local_log);
    static struct slog local;
    assert_int_equal(read_slog(local_log, &local), 0);
    printf("step  version  pipeline  single\n");
    for (int k = 1; k <= STEPS; k++) {
        double loss = NAN, t = -1;
        long long v = 0;
        for (int i = 0; i < N; i++)
            if (isfinite(s[i].loss[k]) && s[i].t_ms[k] > t) {
                loss = s[i].loss[k];
                t = s[i].t_ms[k];
                v = s[i].version[k];
            }
        printf("%4d  %7lld  %.6f  %.6f\n", k, v, loss, local.loss[k]);
        assert_true(isfinite(loss));
        assert_true(fabs(loss - local.loss[k]) <= EQ_TOL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_while_alive),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
