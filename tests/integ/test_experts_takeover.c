/* ct-timeout: 120 */
/* Expert takeover (agent/moe/serve.c, --max-experts; docs/experts.md,
 * "Checkpoints and takeover"; issue 18) against a real PostgreSQL, the real
 * coordinator and DHT, on loopback. A dmoe run (examples/fmnist-dmoe.json,
 * 4 x 4 grid) with declarations living TTL_S and checkpoints every CKPT_S:
 *  - server A serves 8 experts and uploads their checkpoints; one of them
 *    is trained one step by a BACKWARD from this test, and A's next
 *    checkpoint of it has step 1;
 *  - server B serves the other 8 with --max-experts 16;
 *  - A is killed with SIGKILL: within two refresh periods (2 x TTL_S) the
 *    DHT shows B declaring all 16, B's log says it took each of A's uids
 *    over from its checkpoint (step and file hash as the coordinator lists
 *    them), and a FORWARD to B of the trained expert returns exactly what A
 *    returned after the update for the same input;
 *  - B stops on SIGINT with exit status 0 and all 16 experts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "ct_harness.h"
#include "ct_moe.h"

#define PW "organizer-password"
#define RUN "moe"
#define GRID CT_MOE_GRID
#define TTL_S 6
#define CKPT_S 2
#define C_WIDTH CT_MOE_C

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[3][256];
static char g_logs[2][512];
static pid_t g_pid[2] = {-1, -1};

/* Server i; B (1) with room for 16 experts. */
static pid_t start_server(int i, struct ct_moe_srv *info)
{
    const char *extra[] = {"--status-every", "5", i == 1 ? "--max-experts" : NULL, "16", NULL};
    return ct_moe_start_server(i, RUN, g_dirs[i], extra, g_logs[i], sizeof g_logs[i], &g_pid[i], info);
}

/* The coordinator's newest checkpoint of uid: its step (-1 none) and sha256. */
static long ckpt_of(const char *uid, char sha[65])
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/" RUN "/experts", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    long step = -1;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "experts"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "uid")), uid)) {
            step = (long)json_integer_value(json_object_get(e, "step"));
            snprintf(sha, 65, "%s", json_string_value(json_object_get(e, "sha256")));
        }
    ct_resp_free(&r);
    return step;
}

static void test_takeover(void **state)
{
    (void)state;
    double t0 = ct_moe_mono_s();
    struct ct_moe_srv a, b;
    start_server(0, &a);
    printf("[server A up after %.1f s]\n", ct_moe_mono_s() - t0);

    struct peer_rt *rt = ct_moe_client(RUN, g_dirs[2]);
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, GRID), CM_OK);

    /* train one of A's experts one step (a backward), and see its output move */
    struct ct_moe_fwd *f = ct_moe_fwd_new();
    const char *u0 = a.uids[0];
    float y0[2 * C_WIDTH], y1[2 * C_WIDTH], x[2 * C_WIDTH];
    for (int i = 0; i < 2 * C_WIDTH; i++)
        x[i] = (float)sin(0.37 * i);
    ct_moe_aim(rt, RUN, &g, f, a.addr, u0);
    memcpy(f->x, x, sizeof x);
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    memcpy(y0, f->y, sizeof y0);
    for (int i = 0; i < 2 * C_WIDTH; i++)
        f->x[i] = 0.5f * (float)cos(0.11 * i); /* dL/dy */
    f->backward = 1;
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    f->backward = 0;
    memcpy(f->x, x, sizeof x);
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    memcpy(y1, f->y, sizeof y1);
    assert_memory_not_equal(y0, y1, sizeof y0); /* the update changed the expert */

    /* A uploads the trained state within its checkpoint period */
    char sha[65] = "";
    double tw = ct_moe_mono_s();
    while (ckpt_of(u0, sha) < 1 && ct_moe_mono_s() - tw < CKPT_S + 5)
        ct_moe_sleep_ms(200);
    assert_int_equal(ckpt_of(u0, sha), 1);
    for (int k = 0; k < 8; k++) {
        char s2[65];
        assert_true(ckpt_of(a.uids[k], s2) >= 0); /* every one of A's experts has one */
    }
    printf("[A's checkpoints on the coordinator after %.1f s; %s at step 1: %.16s...]\n", ct_moe_mono_s() - t0,
           u0, sha);

    /* B: the other 8, room for 16 */
    start_server(1, &b);
    printf("[server B up after %.1f s]\n", ct_moe_mono_s() - t0);
    struct ct_moe_view v;
    ct_moe_read_grid(rt, RUN, &g, &v);
    assert_int_equal(ct_moe_servers_in(&v, b.addr), 8);

    /* SIGKILL A: B declares A's uids within two refresh periods */
    double tk = ct_moe_mono_s();
    kill(g_pid[0], SIGKILL);
    assert_int_equal(ct_wait(g_pid[0], 10), 128 + SIGKILL);
    g_pid[0] = -1;
    double taken = -1;
    while (ct_moe_mono_s() - tk < 2 * TTL_S + 4) {
        ct_moe_read_grid(rt, RUN, &g, &v);
        int all = 1;
        for (int k = 0; k < 8 && all; k++)
            all = v.count[ct_moe_cell(a.uids[k])] == 1 && !strcmp(v.addr[ct_moe_cell(a.uids[k])], b.addr);
        if (all && ct_moe_servers_in(&v, b.addr) == 16) {
            taken = ct_moe_mono_s() - tk;
            break;
        }
        ct_moe_sleep_ms(200);
    }
    char *log = ct_read_file(g_logs[1], NULL);
    printf("[B declares A's 8 experts %.1f s after SIGKILL (refresh period %d s)]\n%s", taken, TTL_S,
           log ? log : "");
    assert_true(taken >= 0 && taken <= 2 * TTL_S);
    /* from A's checkpoints: B's line names the step and file the coordinator has */
    char want[160];
    snprintf(want, sizeof want, "took over %s from its checkpoint of step 1 (sha256 %.16s", u0, sha);
    assert_non_null(strstr(log, want));
    for (int k = 1; k < 8; k++) {
        snprintf(want, sizeof want, "took over %s from its checkpoint of step 0", a.uids[k]);
        assert_non_null(strstr(log, want));
    }
    free(log);

    /* B answers A's expert with A's trained parameters: the same output */
    ct_moe_aim(rt, RUN, &g, f, b.addr, u0);
    memcpy(f->x, x, sizeof x);
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    assert_memory_equal(f->y, y1, sizeof y1);
    ct_moe_aim(rt, RUN, &g, f, b.addr, a.uids[7]);
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    /* B stops cleanly with the adopted experts (exit 0: under the
       sanitizers also no report) */
    kill(g_pid[1], SIGINT);
    int st = ct_wait(g_pid[1], 20);
    g_pid[1] = -1;
    log = ct_read_file(g_logs[1], NULL);
    if (st != 0 || !log || !strstr(log, "stopped: 16 experts"))
        fail_msg("server B exited %d:\n%s", st, log ? log : "");
    free(log);
    printf("[whole test %.1f s]\n", ct_moe_mono_s() - t0);

    ct_moe_client_free(rt);
    ct_moe_fwd_free(f);
}

static int setup(void **state)
{
    (void)state;
    json_t *serve = json_pack("{s:s, s:i, s:i}", "prefix", "ffn", "declare_ttl_s", TTL_S, "checkpoint_every_s",
                              CKPT_S);
    if (ct_moe_setup(&g_pg, &g_c, PW, &g_org, RUN, serve) != 0 ||
        ct_volunteers(&g_c, g_org, RUN, 3, g_dirs) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        if (g_pid[i] > 0) {
            kill(g_pid[i], SIGKILL);
            ct_wait(g_pid[i], 5);
        }
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < 3; i++)
        if (g_dirs[i][0])
            ct_rmrf(g_dirs[i]);
    free(g_org);
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_takeover)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
