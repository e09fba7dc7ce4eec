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

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/moe/moe_client.h"
#include "agent/peer/net.h"
#include "agent/peer/runtime.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "moe/moe_dht.h"

#define PW "organizer-password"
#define RUN "moe"
#define GRID 4
#define TTL_S 6
#define CKPT_S 2
#define C_WIDTH 128 /* the recipe's trunk ends at 128: the experts' width */

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[3][256];
static char g_logs[2][512];
static pid_t g_pid[2] = {-1, -1};

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* What a server's start-up line says: its address and uids. */
struct srv_info {
    char addr[MOE_ADDR_MAX + 1];
    char uids[16][16];
    int n;
};

static pid_t start_server(int i, struct srv_info *info)
{
    const char *argv[] = {ct_bin("crowdtrain-agent"), "serve-experts", "--run", RUN, "--config-dir", g_dirs[i],
                          "--experts", "8", "--device", "cpu", "--listen-ip", "127.0.0.1",
                          "--status-every", "5", i == 1 ? "--max-experts" : NULL, "16", NULL};
    snprintf(g_logs[i], sizeof g_logs[i], "%s/serve.log", g_dirs[i]);
    pid_t pid = ct_spawn(argv, g_logs[i]);
    assert_true(pid > 0);
    g_pid[i] = pid;
    double t0 = mono_s();
    for (;;) {
        char *log = ct_read_file(g_logs[i], NULL);
        char *line = log ? strstr(log, "serving 8 experts of run '" RUN "' at ") : NULL;
        char *end = line ? strchr(line, '\n') : NULL;
        if (end) {
            *end = 0;
            printf("server %d: %s\n", i, line);
            const char *at = line + strlen("serving 8 experts of run '" RUN "' at ");
            assert_int_equal(sscanf(at, "%63s", info->addr), 1);
            char *colon = strstr(line, "s:");
            assert_non_null(colon);
            info->n = 0;
            char *save = NULL;
            for (char *t = strtok_r(colon + 2, " ", &save); t && info->n < 16; t = strtok_r(NULL, " ", &save))
                snprintf(info->uids[info->n++], sizeof info->uids[0], "%s", t);
            free(log);
            assert_int_equal(info->n, 8);
            return pid;
        }
        free(log);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            g_pid[i] = -1;
            char *l = ct_read_file(g_logs[i], NULL);
            fail_msg("server %d exited during start-up:\n%s", i, l ? l : "");
        }
        if (mono_s() - t0 > 30)
            fail_msg("server %d did not start serving within 30 s", i);
        sleep_ms(100);
    }
}

/* Reads every leaf key of the grid; decl[uid] gets the address that
 * declares it ("" none) and count[uid] how many servers do. */
struct view {
    char addr[GRID * GRID][MOE_ADDR_MAX + 1];
    int count[GRID * GRID];
    int tombstones;
};

static void read_grid(struct peer_rt *rt, const struct moe_grid *g, struct view *v)
{
    memset(v, 0, sizeof *v);
    for (int a = 0; a < GRID; a++) {
        struct moe_uid p = {.n = 1, .idx = {(uint16_t)a}};
        char key[MOE_KEY_MAX];
        assert_int_equal(moe_key_format(RUN, g, &p, key, sizeof key, NULL), CM_OK);
        struct peer_record *r = NULL;
        size_t n = 0;
        assert_int_equal(peer_net_get(rt->net, key, &r, &n), CM_OK);
        for (size_t i = 0; i < n; i++) {
            struct moe_rec rec;
            if (moe_rec_decode(r[i].value, r[i].len, &rec) != CM_OK) {
                v->tombstones++;
                continue;
            }
            assert_int_equal(rec.kind, MOE_REC_LEAF);
            assert_memory_equal(rec.server.pub, r[i].author, 32);
            for (int b = 0; b < GRID; b++)
                if (moe_rec_has(&rec, b)) {
                    v->count[a + GRID * b]++;
                    snprintf(v->addr[a + GRID * b], sizeof v->addr[0], "%s", rec.server.addr);
                }
        }
        peer_records_free(r, n);
    }
}

/* uid "ffn.a.b" -> the cell a + 4 b */
static int cell(const char *uid)
{
    int a, b;
    assert_int_equal(sscanf(uid, "ffn.%d.%d", &a, &b), 2);
    return a + GRID * b;
}

static int servers_in(const struct view *v, const char *addr)
{
    int n = 0;
    for (int i = 0; i < GRID * GRID; i++)
        n += v->count[i] && !strcmp(v->addr[i], addr);
    return n;
}

/* A forward from the client's host (on its loop, through peer_net_call). */
struct fwd {
    struct sockaddr_storage sa;
    uint8_t pub[32];
    const char *uid;
    float x[2 * C_WIDTH], y[2 * C_WIDTH];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status, start_rc, backward;
    uint32_t n, c;
};
static void fwd_cb(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct fwd *f = arg;
    pthread_mutex_lock(&f->mu);
    f->status = status;
    f->n = n;
    f->c = c;
    if (status == CM_OK && n * c <= 2 * C_WIDTH)
        memcpy(f->y, out, (size_t)n * c * sizeof *out);
    f->done = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}
static void fwd_on_loop(void *arg, struct peer_net *n)
{
    struct fwd *f = arg;
    f->start_rc = (f->backward ? moe_client_backward : moe_client_forward)(
        peer_net_host(n), (struct sockaddr *)&f->sa, f->pub, f->uid, 7, f->x, 2, C_WIDTH, 5000, fwd_cb, f);
}
static int forward(struct peer_rt *rt, struct fwd *f)
{
    f->done = 0;
    assert_int_equal(peer_net_call(rt->net, fwd_on_loop, f), CM_OK);
    if (f->start_rc != CM_OK)
        return f->start_rc;
    pthread_mutex_lock(&f->mu);
    while (!f->done)
        pthread_cond_wait(&f->cv, &f->mu); /* the client's deadline (5 s) bounds it */
    pthread_mutex_unlock(&f->mu);
    return f->status;
}

/* The key of the server at addr, as its leaf record declares it. */
static void server_key(struct peer_rt *rt, const struct moe_grid *g, const char *uid, uint8_t pub[32])
{
    struct moe_uid u, p;
    assert_int_equal(moe_uid_parse(g, uid, &u), CM_OK);
    moe_uid_prefix(&u, 1, &p);
    char key[MOE_KEY_MAX];
    assert_int_equal(moe_key_format(RUN, g, &p, key, sizeof key, NULL), CM_OK);
    struct peer_record *r = NULL;
    size_t n = 0;
    assert_int_equal(peer_net_get(rt->net, key, &r, &n), CM_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        struct moe_rec rec;
        if (moe_rec_decode(r[i].value, r[i].len, &rec) == CM_OK && moe_rec_has(&rec, u.idx[1])) {
            memcpy(pub, rec.server.pub, 32);
            found = 1;
        }
    }
    peer_records_free(r, n);
    assert_true(found);
}

/* The forward's target: addr of the server declaring uid and its key. */
static void aim(struct peer_rt *rt, const struct moe_grid *g, struct fwd *f, const char *addr, const char *uid)
{
    char host[64];
    int port;
    memset(&f->sa, 0, sizeof f->sa);
    assert_int_equal(sscanf(addr, "%63[^:]:%d", host, &port), 2);
    struct sockaddr_in *sa4 = (struct sockaddr_in *)&f->sa;
    sa4->sin_family = AF_INET;
    sa4->sin_port = htons((uint16_t)port);
    assert_int_equal(inet_pton(AF_INET, host, &sa4->sin_addr), 1);
    server_key(rt, g, uid, f->pub);
    f->uid = uid;
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
    double t0 = mono_s();
    struct srv_info a, b;
    start_server(0, &a);
    printf("[server A up after %.1f s]\n", mono_s() - t0);

    struct peer_rt *rt = calloc(1, sizeof *rt);
    assert_non_null(rt);
    struct peer_rt_config cfg = {.run = RUN, .config_dir = g_dirs[2], .listen_ip = "127.0.0.1"};
    struct peer_role role = {"test-client", NULL, NULL, NULL, NULL, NULL};
    peer_rt_init(rt, &cfg, &role);
    assert_int_equal(peer_rt_start(rt, PEER_STAGE_NET), CM_OK);
    struct moe_grid g;
    assert_int_equal(moe_grid_init(&g, "ffn", 2, GRID), CM_OK);

    /* train one of A's experts one step (a backward), and see its output move */
    struct fwd *f = calloc(1, sizeof *f);
    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    const char *u0 = a.uids[0];
    float y0[2 * C_WIDTH], y1[2 * C_WIDTH], x[2 * C_WIDTH];
    for (int i = 0; i < 2 * C_WIDTH; i++)
        x[i] = (float)sin(0.37 * i);
    aim(rt, &g, f, a.addr, u0);
    memcpy(f->x, x, sizeof x);
    assert_int_equal(forward(rt, f), CM_OK);
    memcpy(y0, f->y, sizeof y0);
    for (int i = 0; i < 2 * C_WIDTH; i++)
        f->x[i] = 0.5f * (float)cos(0.11 * i); /* dL/dy */
    f->backward = 1;
    assert_int_equal(forward(rt, f), CM_OK);
    f->backward = 0;
    memcpy(f->x, x, sizeof x);
    assert_int_equal(forward(rt, f), CM_OK);
    memcpy(y1, f->y, sizeof y1);
    assert_memory_not_equal(y0, y1, sizeof y0); /* the update changed the expert */

    /* A uploads the trained state within its checkpoint period */
    char sha[65] = "";
    double tw = mono_s();
    while (ckpt_of(u0, sha) < 1 && mono_s() - tw < CKPT_S + 5)
        sleep_ms(200);
    assert_int_equal(ckpt_of(u0, sha), 1);
    for (int k = 0; k < 8; k++) {
        char s2[65];
        assert_true(ckpt_of(a.uids[k], s2) >= 0); /* every one of A's experts has one */
    }
    printf("[A's checkpoints on the coordinator after %.1f s; %s at step 1: %.16s...]\n", mono_s() - t0, u0, sha);

    /* B: the other 8, room for 16 */
    start_server(1, &b);
    printf("[server B up after %.1f s]\n", mono_s() - t0);
    struct view v;
    read_grid(rt, &g, &v);
    assert_int_equal(servers_in(&v, b.addr), 8);

    /* SIGKILL A: B declares A's uids within two refresh periods */
    double tk = mono_s();
    kill(g_pid[0], SIGKILL);
    assert_int_equal(ct_wait(g_pid[0], 10), 128 + SIGKILL);
    g_pid[0] = -1;
    double taken = -1;
    while (mono_s() - tk < 2 * TTL_S + 4) {
        read_grid(rt, &g, &v);
        int all = 1;
        for (int k = 0; k < 8 && all; k++)
            all = v.count[cell(a.uids[k])] == 1 && !strcmp(v.addr[cell(a.uids[k])], b.addr);
        if (all && servers_in(&v, b.addr) == 16) {
            taken = mono_s() - tk;
            break;
        }
        sleep_ms(200);
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
    aim(rt, &g, f, b.addr, u0);
    memcpy(f->x, x, sizeof x);
    assert_int_equal(forward(rt, f), CM_OK);
    assert_memory_equal(f->y, y1, sizeof y1);
    aim(rt, &g, f, b.addr, a.uids[7]);
    assert_int_equal(forward(rt, f), CM_OK);
    /* B stops cleanly with the adopted experts (exit 0: under the
       sanitizers also no report) */
    kill(g_pid[1], SIGINT);
    int st = ct_wait(g_pid[1], 20);
    g_pid[1] = -1;
    log = ct_read_file(g_logs[1], NULL);
    if (st != 0 || !log || !strstr(log, "stopped: 16 experts"))
        fail_msg("server B exited %d:\n%s", st, log ? log : "");
    free(log);
    printf("[whole test %.1f s]\n", mono_s() - t0);

    peer_rt_cleanup(rt);
    free(rt);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || !(g_org = ct_login(&g_c, "org", PW)))
        return -1;
    json_t *recipe = json_load_file("examples/fmnist-dmoe.json", 0, NULL);
    if (!recipe)
        return -1;
    json_t *experts = json_object_get(json_object_get(recipe, "model"), "experts");
    json_object_set_new(experts, "serve", json_pack("{s:s, s:i, s:i}", "prefix", "ffn", "declare_ttl_s", TTL_S,
                                                       "checkpoint_every_s", CKPT_S));
    char *body = ct_run_body(RUN, recipe);
    json_decref(recipe);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    long st = r.status;
    ct_resp_free(&r);
    if (st != 201 || ct_volunteers(&g_c, g_org, RUN, 3, g_dirs) != 0)
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
