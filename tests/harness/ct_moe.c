/* Helpers of the expert integration tests (see ct_moe.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "agent/moe/moe_client.h"
#include "agent/peer/net.h"
#include "agent/peer/runtime.h"
#include "cm_err.h"
#include "ct_moe.h"

#define GRID CT_MOE_GRID
#define C_WIDTH CT_MOE_C

double ct_moe_mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void ct_moe_sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

int ct_moe_setup(struct ct_pg *pg, struct ct_coord *c, const char *pw, char **org, const char *run,
                 json_t *serve)
{
    int rc = ct_pg_start(pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(pg->url, "org", "organizer", pw) != 0 ||
        ct_coord_start(c, pg->url, NULL, NULL) != 0 || !(*org = ct_login(c, "org", pw))) {
        json_decref(serve);
        return -1;
    }
    json_t *recipe = json_load_file("examples/fmnist-dmoe.json", 0, NULL);
    if (!recipe) {
        json_decref(serve);
        return -1;
    }
    json_t *experts = json_object_get(json_object_get(recipe, "model"), "experts");
    json_object_set_new(experts, "serve", serve);
    char *body = ct_run_body(run, recipe);
    json_decref(recipe);
    struct ct_resp r;
    ct_http(c, "POST", "/api/v1/runs", *org, body, &r);
    free(body);
    long st = r.status;
    ct_resp_free(&r);
    return st == 201 ? 0 : -1;
}

pid_t ct_moe_start_server(int i, const char *run, const char *dir, const char *const *extra, char *log,
                          size_t logcap, pid_t *pidp, struct ct_moe_srv *info)
{
    const char *argv[32] = {ct_bin("crowdtrain-agent"), "serve-experts", "--run", run, "--config-dir", dir,
                            "--experts", "8", "--device", "cpu", "--listen-ip", "127.0.0.1"};
    size_t na = 12;
    for (size_t k = 0; extra && extra[k]; k++) {
        assert_true(na < sizeof argv / sizeof argv[0] - 1);
        argv[na++] = extra[k];
    }
    argv[na] = NULL;
    char serving[128];
    snprintf(serving, sizeof serving, "serving 8 experts of run '%s' at ", run);
    snprintf(log, logcap, "%s/serve.log", dir);
    pid_t pid = ct_spawn(argv, log);
    assert_true(pid > 0);
    *pidp = pid;
    double t0 = ct_moe_mono_s();
    for (;;) {
        char *text = ct_read_file(log, NULL);
        char *line = text ? strstr(text, serving) : NULL;
        char *end = line ? strchr(line, '\n') : NULL;
        if (end) {
            *end = 0;
            printf("server %d: %s\n", i, line);
            const char *at = line + strlen(serving);
            assert_int_equal(sscanf(at, "%63s", info->addr), 1);
            char *colon = strstr(line, "s:");
            assert_non_null(colon);
            info->n = 0;
            char *save = NULL;
            for (char *t = strtok_r(colon + 2, " ", &save); t && info->n < 16; t = strtok_r(NULL, " ", &save))
                snprintf(info->uids[info->n++], sizeof info->uids[0], "%s", t);
            free(text);
            assert_int_equal(info->n, 8);
            return pid;
        }
        free(text);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            *pidp = -1;
            char *l = ct_read_file(log, NULL);
            fail_msg("server %d exited during start-up:\n%s", i, l ? l : "");
        }
        if (ct_moe_mono_s() - t0 > 30)
            fail_msg("server %d did not start serving within 30 s", i);
        ct_moe_sleep_ms(100);
    }
}

struct peer_rt *ct_moe_client(const char *run, const char *dir)
{
    struct peer_rt *rt = calloc(1, sizeof *rt);
    assert_non_null(rt);
    struct peer_rt_config cfg = {.run = run, .config_dir = dir, .listen_ip = "127.0.0.1"};
    struct peer_role role = {"test-client", NULL, NULL, NULL, NULL, NULL};
    peer_rt_init(rt, &cfg, &role);
    assert_int_equal(peer_rt_start(rt, PEER_STAGE_NET), CM_OK);
    return rt;
}

void ct_moe_client_free(struct peer_rt *rt)
{
    peer_rt_cleanup(rt);
    free(rt);
}

void ct_moe_read_grid(struct peer_rt *rt, const char *run, const struct moe_grid *g, struct ct_moe_view *v)
{
    memset(v, 0, sizeof *v);
    for (int a = 0; a < GRID; a++) {
        struct moe_uid p = {.n = 1, .idx = {(uint16_t)a}};
        char key[MOE_KEY_MAX];
        assert_int_equal(moe_key_format(run, g, &p, key, sizeof key, NULL), CM_OK);
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

int ct_moe_cell(const char *uid)
{
    int a, b;
    assert_int_equal(sscanf(uid, "ffn.%d.%d", &a, &b), 2);
    return a + GRID * b;
}

int ct_moe_servers_in(const struct ct_moe_view *v, const char *addr)
{
    int n = 0;
    for (int i = 0; i < GRID * GRID; i++)
        n += v->count[i] && !strcmp(v->addr[i], addr);
    return n;
}

struct ct_moe_fwd *ct_moe_fwd_new(void)
{
    struct ct_moe_fwd *f = calloc(1, sizeof *f);
    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    return f;
}

void ct_moe_fwd_free(struct ct_moe_fwd *f)
{
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

/* The answer, on the client's loop: into f, then wakes ct_moe_forward. */
static void fwd_cb(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct ct_moe_fwd *f = arg;
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

/* Sends the request, on the client's loop. */
static void fwd_on_loop(void *arg, struct peer_net *n)
{
    struct ct_moe_fwd *f = arg;
    f->start_rc = (f->backward ? moe_client_backward : moe_client_forward)(
        peer_net_host(n), (struct sockaddr *)&f->sa, f->pub, f->uid, 7, f->x, 2, C_WIDTH, 5000, fwd_cb, f);
}

int ct_moe_forward(struct peer_rt *rt, struct ct_moe_fwd *f)
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

/* The key of the server declaring uid, as its leaf record in run's grid g
 * says. */
static void server_key(struct peer_rt *rt, const char *run, const struct moe_grid *g, const char *uid,
                       uint8_t pub[32])
{
    struct moe_uid u, p;
    assert_int_equal(moe_uid_parse(g, uid, &u), CM_OK);
    moe_uid_prefix(&u, 1, &p);
    char key[MOE_KEY_MAX];
    assert_int_equal(moe_key_format(run, g, &p, key, sizeof key, NULL), CM_OK);
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

void ct_moe_aim(struct peer_rt *rt, const char *run, const struct moe_grid *g, struct ct_moe_fwd *f,
                const char *addr, const char *uid)
{
    char host[64];
    int port;
    memset(&f->sa, 0, sizeof f->sa);
    assert_int_equal(sscanf(addr, "%63[^:]:%d", host, &port), 2);
    struct sockaddr_in *sa4 = (struct sockaddr_in *)&f->sa;
    sa4->sin_family = AF_INET;
    sa4->sin_port = htons((uint16_t)port);
    assert_int_equal(inet_pton(AF_INET, host, &sa4->sin_addr), 1);
    server_key(rt, run, g, uid, f->pub);
    f->uid = uid;
}
