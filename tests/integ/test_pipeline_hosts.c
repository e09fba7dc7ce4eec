/* ct-timeout: 300 */
/* Stage agents on hosts of their own (issue 19; network namespaces,
 * tests/harness/ct_net.h; root): two hosts with 20 Mbit/s links (tc tbf)
 * run the two stages of a small pipeline run with the command line a
 * volunteer types, every frame between them held 20 ms (`pipeline
 * --latency-to`). Checks what loopback cannot show:
 *
 *   - pacing (`--pace`, default 0.92; agent/peer/runtime.c): each agent
 *     measured its link, capped its own traffic at 0.92 of it and reported
 *     the capped rates, which the coordinator's first solve used;
 *   - round trips (agent/pipe/rtt.c): the first solve had each agent's
 *     round trip to the other, about 2 x 20 ms (the latency rule, matched by
 *     the other host's address, holds frames both ways), and its pipeline
 *     term counts the delay (2 (alpha + ...) plus the norms' alpha);
 *   - the two stages took every step, the first one's activations went as
 *     fp16 (`pipeline.compression`), and the loss fell. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct_harness.h"
#include "ct_net.h"
#include "ct_pipeline.h"

#define PORT "8443"
#define RUN "gpt-pipe-hosts"
#define STEPS 4
#define MBPS 20.0
#define ONEWAY_MS 20

static struct ct_net g_net;
static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_data[256];
static int g_host[2];

static int setup(void **state)
{
    (void)state;
    if (ct_net_public(&g_net, "coord") != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "stage%d", i);
        if ((g_host[i] = ct_net_public(&g_net, name)) < 0 || ct_net_cap(&g_net, g_host[i], MBPS) != 0)
            return -1;
    }
    if (ct_net_enter(&g_net, 0) != 0 || ct_tempdir("pipehosts", g_data, sizeof g_data) != 0 ||
        ct_pg_start(&g_pg) != 0)
        return -1;
    char url[64];
    snprintf(url, sizeof url, "https://%s:" PORT, g_net.h[0].ip);
    const char *args[] = {"--listen", "0.0.0.0:" PORT, "--public-url", url, "--dht-listen-ip", "0.0.0.0", NULL};
    if (ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0 || !(g_org = ct_login(&g_c, "org", "organizer-password")))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    ct_net_destroy(&g_net);
    if (g_data[0] && !getenv("CT_KEEP_LOGS"))
        ct_rmrf(g_data);
    free(g_org);
    return 0;
}

/* A number the query gives, in thousandths (ct_pg_scalar reads integers). */
static double scalar_f(const char *expr_from)
{
    char sql[1024];
    snprintf(sql, sizeof sql, "SELECT round(1000 * (%s))::bigint", expr_from);
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return (double)v / 1000;
}

static void test_paced_stages_with_delay(void **state)
{
    (void)state;
    json_t *cfg = ct_pipeline_recipe(g_data, 2, STEPS, 5);
    assert_non_null(cfg);
    json_object_set_new(cfg, "pipeline", json_pack("{s:i, s:i, s:f, s:s}", "stages", 2, "replicas", 1,
                                                   "gradient_bytes", 2e5, "compression", "fp16"));
    json_t *body = json_pack("{s:s, s:I, s:s, s:o}", "name", RUN, "target_batch_size", (json_int_t)16,
                             "model_summary", "byte GPT in 2 stages on 2 hosts", "config", cfg);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    ct_expect(&g_c, "POST", "/api/v1/runs", g_org, text, 201, NULL, NULL);
    free(text);
    char url[64], dirs[2][256], logs[2][320], steps[2][320];
    snprintf(url, sizeof url, "https://%s:" PORT, g_net.h[0].ip);
    assert_int_equal(ct_net_volunteers(&g_net, &g_c, g_org, RUN, url, 0, 2, g_host, dirs), 0);
    pid_t pid[2];
    double loss0 = NAN, loss = NAN;
    for (int i = 0; i < 2; i++) {
        char to[64];
        snprintf(to, sizeof to, "%s/32=%d", g_net.h[g_host[1 - i]].ip, ONEWAY_MS);
        snprintf(logs[i], sizeof logs[i], "%.250s/pipeline.log", dirs[i]);
        snprintf(steps[i], sizeof steps[i], "%.250s/pipeline.steps", dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", RUN, "--config-dir", dirs[i],
                              "--device", "cpu", "--step-log", steps[i], "--wait-s", "120", "--latency-to", to,
                              NULL};
        pid[i] = ct_net_spawn(&g_net, g_host[i], argv, logs[i]);
        assert_true(pid[i] > 0);
    }
    for (int i = 0; i < 2; i++) {
        int st = ct_wait(pid[i], 200);
        char *l = ct_read_file(logs[i], NULL);
        if (st != 0)
            fprintf(stderr, "agent %d exited with %d; its log:\n%s\n", i, st, l ? l : "");
        assert_int_equal(st, 0);
        /* it measured its link and paced itself at 0.92 of it */
        const char *link = l ? strstr(l, "link: upload ") : NULL, *pace = l ? strstr(l, "pacing: ") : NULL;
        assert_non_null(link);
        assert_non_null(pace);
        double up = atof(link + strlen("link: upload ")), capped = 0;
        assert_int_equal(sscanf(pace, "pacing: this agent sends at most %lf", &capped), 1);
        printf("agent %d: link %.1f Mbit/s up, paced at %.1f\n", i, up, capped);
        assert_true(up > 0.8 * MBPS && up < 1.1 * MBPS);
        assert_true(fabs(capped - 0.92 * up) < 0.1);
        assert_non_null(strstr(l, "round trips measured to 1 other stage agent"));
        free(l);
        /* every step taken; the first stage sent its activations as fp16
           (4 micro-batches of 4 x 32 x 64 values: 64 kB in fp16, 128 kB in
           fp32, plus the targets, headers and the tied gradient, 256 x 64
           fp32 values: 64 kB), the last one's loss fell */
        FILE *f = fopen(steps[i], "r");
        assert_non_null(f);
        char line[2048];
        int n = 0;
        while (fgets(line, sizeof line, f)) {
            json_t *j = json_loads(line, 0, NULL);
            assert_non_null(j);
            n++;
            long stage = (long)json_integer_value(json_object_get(j, "stage"));
            double kb = json_number_value(json_object_get(j, "sent_kb"));
            if (stage == 0)
                assert_true(kb > 64 + 64 && kb < 64 + 64 + 24);
            if (stage == 1 && json_is_number(json_object_get(j, "loss"))) {
                loss = json_number_value(json_object_get(j, "loss"));
                if (isnan(loss0))
                    loss0 = loss;
            }
            json_decref(j);
        }
        fclose(f);
        assert_int_equal(n, STEPS);
    }
    printf("loss %.4f -> %.4f over %d steps with fp16 activations\n", loss0, loss, STEPS);
    assert_true(isfinite(loss) && loss < loss0 - 0.5);
    /* The first solve's inputs: the paced rates, and each agent's round trip
       to the other (2 x 20 ms held, plus the path) */
#define FIRST "FROM pipelines p JOIN runs r ON r.id = p.run_id"
#define WHERE " WHERE r.name = '" RUN "' AND p.version = 1"
    double up_max = scalar_f("SELECT max((d->>'upload_mbps')::float8) " FIRST
                             ", jsonb_array_elements(p.inputs->'devices') d" WHERE);
    double rtt_min = scalar_f("SELECT min((q->>'rtt_ms')::float8) " FIRST
                              ", jsonb_array_elements(p.inputs->'devices') d, jsonb_array_elements(d->'pairs') q"
                              WHERE);
    double rtt_n = scalar_f("SELECT count(*) " FIRST ", jsonb_array_elements(p.inputs->'devices') d, "
                            "jsonb_array_elements(d->'pairs') q" WHERE " AND q ? 'rtt_ms'");
    double pp = scalar_f("SELECT (p.payload::jsonb->'predicted'->>'pp_s')::float8 " FIRST WHERE);
    printf("first solve: upload at most %.2f Mbit/s, %g round trips, the smallest %.1f ms; pipeline term %.3f s\n",
           up_max, rtt_n, rtt_min, pp);
    assert_true(up_max <= 0.92 * 1.1 * MBPS);
    assert_true(rtt_n == 2);
    assert_true(rtt_min >= 2 * ONEWAY_MS && rtt_min < 2 * ONEWAY_MS + 60);
    /* one hop there and back (2 alpha) and the norms (alpha), at least */
    assert_true(pp >= 3 * ONEWAY_MS / 1e3);
}

int main(void)
{
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        return 77; /* the reason is printed */
    if (rc != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paced_stages_with_delay),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
