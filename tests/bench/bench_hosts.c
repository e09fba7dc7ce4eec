/* Volunteers on separate hosts (issue 17; `make bench`): the same
 * collaboration of six agents, with the command line a volunteer types,
 * first on six public hosts, then with four of them behind two home routers
 * (MASQUERADE, one port-preserving, one --random-fully), on a test bed of
 * network namespaces (tests/harness/ct_net.h; root needed).
 *
 * Prints, measured in this run:
 *  - the time from starting `crowdtrain-agent join` to its reachability line
 *    (the coordinator's dial-back: "direct at ..." or "not reachable at ...:
 *    client mode"), median and worst over the agents; goal < 10 s (Petals'
 *    reachability check takes minutes);
 *  - seconds per step of each collaboration over its steps 6..STEPS (median
 *    of the step-to-step times in the step logs), and the NAT run's against
 *    the all-public run's: the reference measured in the same run. NAT'ed
 *    peers aggregate through relays the public ones lend (docs/p2p.md,
 *    "Relays"), so their parts cross a public host's link twice. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_net.h"

#define STEPS 40
#define N 6
#define PORT "8443"

static struct ct_net g_net;
static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static int g_vol;

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One collaboration on hosts[]: returns 0 and fills the reachability times
 * (reach[N]) and the median seconds per step. */
static int collab(const char *run, const int *hosts, double *reach, double *sps)
{
    char dirs[N][256], logs[N][320], steps[N][320], url[64];
    pid_t pid[N];
    json_t *recipe = ct_fmnist_recipe(STEPS);
    char *body = ct_run_body(run, recipe);
    json_decref(recipe);
    struct ct_resp r;
    if (!body || ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r) != 0 || r.status != 201) {
        free(body);
        fprintf(stderr, "creating run %s failed\n", run);
        return -1;
    }
    ct_resp_free(&r);
    free(body);
    snprintf(url, sizeof url, "https://%s:" PORT, g_net.h[0].ip);
    if (ct_net_volunteers(&g_net, &g_c, g_org, run, url, g_vol, N, hosts, dirs) != 0)
        return -1;
    g_vol += N;
    double t0 = mono_s();
    for (int i = 0; i < N; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/join.log", dirs[i]);
        snprintf(steps[i], sizeof steps[i], "%.250s/join.steps", dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", run, "--config-dir", dirs[i],
                              "--device", "cpu", "--no-eval", "--step-log", steps[i], NULL};
        pid[i] = ct_net_spawn(&g_net, hosts[i], argv, logs[i]);
        reach[i] = -1;
    }
    int left = N, st[N];
    for (int i = 0; i < N; i++)
        st[i] = -1;
    while (left > 0 && mono_s() - t0 < 600) {
        for (int i = 0; i < N; i++) {
            if (reach[i] < 0) {
                char *log = ct_read_file(logs[i], NULL);
                if (log && strstr(log, "reachability: "))
                    reach[i] = mono_s() - t0;
                free(log);
            }
            int s = 0;
            if (st[i] < 0 && waitpid(pid[i], &s, WNOHANG) == pid[i]) {
                st[i] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
                left--;
            }
        }
        usleep(50000);
    }
    for (int i = 0; i < N; i++)
        if (st[i] < 0) {
            kill(pid[i], SIGKILL);
            ct_wait(pid[i], 10);
        }
    /* step times from the first agent's step log (all step together) */
    FILE *f = fopen(steps[0], "r");
    double t[STEPS + 2] = {0}, d[STEPS];
    size_t nd = 0;
    char line[2048];
    while (f && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        long s = (long)json_integer_value(json_object_get(j, "step"));
        if (j && json_object_get(j, "hash") && s >= 1 && s <= STEPS)
            t[s] = (double)json_integer_value(json_object_get(j, "t_ms")) / 1000.0;
        json_decref(j);
    }
    if (f)
        fclose(f);
    for (int s = 6; s <= STEPS; s++)
        if (t[s] > 0 && t[s - 1] > 0)
            d[nd++] = t[s] - t[s - 1];
    *sps = ct_median(d, nd);
    int ok = nd >= STEPS / 2;
    for (int i = 0; i < N; i++) {
        ok &= st[i] == 0 && reach[i] > 0;
        if (!getenv("CT_KEEP_LOGS"))
            ct_rmrf(dirs[i]);
    }
    if (!ok)
        fprintf(stderr, "%s: not every agent finished and reported its reachability (%zu step times)\n", run, nd);
    return ok ? 0 : -1;
}

int main(void)
{
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skipped: Fashion-MNIST is not installed\n");
        return 0;
    }
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        return 0; /* the reason is printed */
    int pub[N], nat[N];
    if (rc != 0 || ct_net_public(&g_net, "coord") != 0)
        return 1;
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "pub%d", i);
        if ((pub[i] = ct_net_public(&g_net, name)) < 0)
            return 1;
    }
    int cone = ct_net_router(&g_net, 0), sym = ct_net_router(&g_net, 1);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "nat%d", i);
        nat[i] = i < 2 ? pub[i] : ct_net_private(&g_net, name, i < 4 ? cone : sym);
        if (nat[i] < 0)
            return 1;
    }
    if (ct_net_enter(&g_net, 0) != 0 || ct_pg_start(&g_pg) != 0)
        return 1;
    char public_url[64];
    snprintf(public_url, sizeof public_url, "https://%s:" PORT, g_net.h[0].ip);
    const char *args[] = {"--listen", "0.0.0.0:" PORT, "--public-url", public_url, "--dht-listen-ip", "0.0.0.0",
                          NULL};
    if (ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0 || !(g_org = ct_login(&g_c, "org", "organizer-password")))
        return 1;
    double rp[N], rn[N], sp = 0, sn = 0;
    int ok = collab("bench-public", pub, rp, &sp) == 0 && collab("bench-nat", nat, rn, &sn) == 0;
    if (ok) {
        double all[2 * N];
        memcpy(all, rp, sizeof rp);
        memcpy(all + N, rn, sizeof rn);
        double worst = 0;
        for (int i = 0; i < 2 * N; i++)
            worst = all[i] > worst ? all[i] : worst;
        double nat_only[4] = {rn[2], rn[3], rn[4], rn[5]};
        double nat_med = ct_median(nat_only, 4);
        printf("reachability known after join: median %.2f s, worst %.2f s over %d agents (NAT'ed: median "
               "%.2f s); goal < 10 s\n",
               ct_median(all, 2 * N), worst, 2 * N, nat_med);
        printf("seconds per step, %d agents, Fashion-MNIST MLP, steps 6-%d: all public %.3f s, 2 public + 4 behind "
               "NAT %.3f s, ratio %.2f\n",
               N, STEPS, sp, sn, sp > 0 ? sn / sp : 0);
    }
    int crc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    ct_net_destroy(&g_net);
    free(g_org);
    return ok && crc == 0 ? 0 : 1;
}
