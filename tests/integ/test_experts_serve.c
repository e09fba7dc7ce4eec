/* ct-timeout: 180 */
/* `crowdtrain-agent serve-experts` (agent/moe/serve.c; docs/experts.md,
 * "Expert servers") against a real PostgreSQL, the real coordinator and the
 * run's DHT backbone, on loopback. A dmoe run (examples/fmnist-dmoe.json,
 * 4 x 4 grid, declarations living 3 s); two servers started one after the
 * other with --experts 8:
 *  - the DHT's leaf records say that each of the 16 uids is declared by
 *    exactly one server, at the address and with the uids its start-up line
 *    names: the second filled the first's gaps (seed 002 Appendix C records);
 *  - a FORWARD to one of their experts from a client holding a real pass
 *    (a peer runtime in this process) answers (N, C) finite values; an
 *    unknown uid is answered CM_ENOTFOUND;
 *  - after SIGKILL of one server its declarations are gone from reads
 *    within their 3 s expiry (plus a second of slack), the other's stay;
 *  - after SIGINT of the other it exits 0 and its declarations are gone
 *    from the very next read (withdrawn, not expired). */
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
#define TTL_S 3
#define C_WIDTH CT_MOE_C

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[3][256];
static char g_logs[2][512];
static pid_t g_pid[2] = {-1, -1};

static pid_t start_server(int i, struct ct_moe_srv *info)
{
    const char *extra[] = {"--status-every", "1", NULL};
    return ct_moe_start_server(i, RUN, g_dirs[i], extra, g_logs[i], sizeof g_logs[i], &g_pid[i], info);
}

/* The coordinator's view (GET /runs/{run}/experts/servers, read from its
 * backbone node): the same servers as v for every uid, in grid order,
 * nuids of them with a server, nservers distinct servers. */
static void check_servers_page(const struct ct_moe_view *v, int nuids, int nservers)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/" RUN "/experts/servers", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(json_is_true(json_object_get(r.json, "complete")));
    assert_int_equal(json_integer_value(json_object_get(r.json, "servers")), nservers);
    assert_int_equal(json_integer_value(json_object_get(r.json, "grid_size")), GRID);
    json_t *ex = json_object_get(r.json, "experts");
    assert_int_equal(json_array_size(ex), nuids);
    int last = -1, seen = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ex, i, e) {
        int cell = ct_moe_cell(json_string_value(json_object_get(e, "uid")));
        int a = cell % GRID, b = cell / GRID; /* "ffn.a.b": grid order is a, then b */
        assert_true(a * GRID + b > last);
        last = a * GRID + b;
        json_t *s = json_object_get(e, "servers");
        assert_int_equal(json_array_size(s), v->count[cell]);
        const char *addr = json_string_value(json_object_get(json_array_get(s, 0), "addr"));
        assert_non_null(addr);
        assert_string_equal(addr, v->addr[cell]);
        json_int_t left = json_integer_value(json_object_get(json_array_get(s, 0), "expires_in_s"));
        assert_true(left >= 1 && left <= TTL_S);
        seen++;
    }
    assert_int_equal(seen, nuids);
    ct_resp_free(&r);
    printf("[the coordinator's experts page: %d uids, %d servers]\n", nuids, nservers);
}

static void test_serve_experts(void **state)
{
    (void)state;
    double t0 = ct_moe_mono_s();
    struct ct_moe_srv s0, s1;
    start_server(0, &s0);
    printf("[server 0 up after %.1f s]\n", ct_moe_mono_s() - t0);
    start_server(1, &s1);
    printf("[server 1 up after %.1f s]\n", ct_moe_mono_s() - t0);

    /* the test's client: a peer of the run with a real pass */
    struct peer_rt *rt = ct_moe_client(RUN, g_dirs[2]);
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, GRID), CM_OK);

    /* every uid declared by exactly one server, the one that says so */
    struct ct_moe_view v;
    ct_moe_read_grid(rt, RUN, &g, &v);
    for (int i = 0; i < GRID * GRID; i++)
        assert_int_equal(v.count[i], 1);
    for (int k = 0; k < 8; k++) {
        assert_string_equal(v.addr[ct_moe_cell(s0.uids[k])], s0.addr);
        assert_string_equal(v.addr[ct_moe_cell(s1.uids[k])], s1.addr);
    }
    assert_string_not_equal(s0.addr, s1.addr);
    check_servers_page(&v, 16, 2);

    /* a forward to one of server 1's experts */
    struct ct_moe_fwd *f = ct_moe_fwd_new();
    ct_moe_aim(rt, RUN, &g, f, s1.addr, s1.uids[0]);
    for (int i = 0; i < 2 * C_WIDTH; i++)
        f->x[i] = (float)sin(0.37 * i);
    assert_int_equal(ct_moe_forward(rt, f), CM_OK);
    assert_int_equal(f->n, 2);
    assert_int_equal(f->c, C_WIDTH);
    double norm = 0;
    for (int i = 0; i < 2 * C_WIDTH; i++) {
        assert_true(isfinite(f->y[i]));
        norm += fabs(f->y[i] - f->x[i]);
    }
    assert_true(norm > 0); /* the expert computed something */
    f->uid = s0.uids[0]; /* server 0's expert, asked of server 1 */
    assert_int_equal(ct_moe_forward(rt, f), CM_ENOTFOUND);

    /* SIGKILL server 0: its declarations expire (TTL_S) */
    double tk = ct_moe_mono_s();
    kill(g_pid[0], SIGKILL);
    assert_int_equal(ct_wait(g_pid[0], 10), 128 + SIGKILL);
    g_pid[0] = -1;
    double gone = -1;
    while (ct_moe_mono_s() - tk < TTL_S + 3) {
        ct_moe_read_grid(rt, RUN, &g, &v);
        if (ct_moe_servers_in(&v, s0.addr) == 0) {
            gone = ct_moe_mono_s() - tk;
            break;
        }
        ct_moe_sleep_ms(200);
    }
    printf("[server 0's declarations gone %.1f s after SIGKILL]\n", gone);
    assert_true(gone >= 0 && gone <= TTL_S + 1.0);
    assert_int_equal(ct_moe_servers_in(&v, s1.addr), 8); /* server 1 re-declares: its stay */
    ct_moe_sleep_ms(3100); /* the coordinator's page caches its read 3 s */
    check_servers_page(&v, 8, 1);

    /* SIGINT server 1: it withdraws at once and exits 0 */
    kill(g_pid[1], SIGINT);
    int st = ct_wait(g_pid[1], 15);
    g_pid[1] = -1;
    char *log = ct_read_file(g_logs[1], NULL);
    printf("%s", log ? log : "");
    assert_int_equal(st, 0);
    /* one key per first index among its uids (d = 2: the leaf prefixes
       "ffn.i.*"); which indices it took depends on the random tie-breaks */
    int first[16] = {0}, nkeys = 0;
    for (int k = 0; k < s1.n; k++) {
        int i0 = atoi(s1.uids[k] + 4); /* "ffn.<i0>.<i1>" */
        assert_true(i0 >= 0 && i0 < 16);
        nkeys += !first[i0];
        first[i0] = 1;
    }
    char want[96];
    snprintf(want, sizeof want, "withdrew the declarations: %d of %d keys replaced\n", nkeys, nkeys);
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, "status: 8 experts"));
    assert_non_null(strstr(log, "stopped: 8 experts"));
    free(log);
    ct_moe_read_grid(rt, RUN, &g, &v);
    assert_int_equal(ct_moe_servers_in(&v, s1.addr), 0);
    assert_true(v.tombstones >= nkeys); /* its entry under every key it declared */
    printf("[whole test %.1f s]\n", ct_moe_mono_s() - t0);

    ct_moe_client_free(rt);
    ct_moe_fwd_free(f);
}

static int setup(void **state)
{
    (void)state;
    json_t *serve = json_pack("{s:s, s:i}", "prefix", "ffn", "declare_ttl_s", TTL_S);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_serve_experts)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
