/* Pipeline stages on separate hosts (issue 19, "cost model against
 * reality"; `make bench`; root): 8 hosts in network namespaces
 * (tests/harness/ct_net.h) in two groups, four with 200 Mbit/s links and
 * four with 20 Mbit/s (tc tbf, both ways), run a byte GPT of 4 layers cut
 * into 4 stages x 2 pipelines with `crowdtrain-agent pipeline`, the command
 * line a volunteer types, twice on the same hosts: once on the DT-FM
 * schedule the coordinator searches (seed 003 §3) and once on a random
 * assignment it draws (`pipeline.search: "random"`, seed 003 §4.2's
 * baseline).
 *
 * Prints, measured in this run: for each, the coordinator's predicted
 * seconds per step (the cost model: data-parallel + pipeline + compute,
 * from the agents' measured link rates and speeds) and the measured one
 * (median `step_s` of the last stages' step logs over steps 4..STEPS),
 * their ratio (goal 0.8-1.2), and random's measured time over DT-FM's
 * (goal > 1: the schedule is faster on real links).
 *
 * Two regions (the "two regions"; seed 003 §4.1's case 3 has
 * 11 ms between two data centers, case 4 59-67 ms across the US): hosts
 * fast0, fast1, slow4, slow5 in one, the other four in the other, each
 * region with both link speeds, so that the schedule weighs delay against
 * bandwidth. Frames between regions wait BENCH_PIPE_ONEWAY_MS (default 30:
 * 60 ms round trips) and inside a region INTRA_MS (application-level, `pipeline
 * --latency-ms` and `--latency-to`: netem is not available here); the
 * agents measure the round trips (agent/pipe/rtt.c) and the coordinator's
 * model takes half of each as the link's delay. BENCH_PIPE_ONEWAY_MS=0
 * runs without any delay. The agents pace their traffic at 0.92 of their
 * measured links (`pipeline --pace`, BENCH_PIPE_PACE=0: off). Then each
 * stage's median phases (micro-batches, tied embedding, averaging, norms)
 * show where a step's time went (docs/pipelines.md, "The cost model
 * against real hosts"). */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_net.h"
#include "cm_crypto.h"

#define STEPS 15
#define N 8
#define S 4
#define D 2
#define PORT "8443"
#define FAST_MBPS 200.0
#define SLOW_MBPS 20.0
#define CPU_PERCENT "12.5" /* 100 / N: each host an eighth of the machine */
#define INTRA_MS 2          /* one way inside a region */

/* Region of host i (0..N-1): fast0, fast1, slow4, slow5 are region 0. */
static int region(int i)
{
    return (i % (N / 2)) >= N / 4;
}

static long g_oneway = 30; /* ms between the regions, BENCH_PIPE_ONEWAY_MS */
static double g_pace = 0.92; /* the agents' --pace (BENCH_PIPE_PACE; 0: off) */

static struct ct_net g_net;
static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static int g_vol;
static char g_data[256];

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int write_manifest(const char *name, size_t len, uint64_t seed, char *mpath, size_t cap)
{
    return ct_text_manifest(g_data, name, len, seed, mpath, cap);
}

/* One pipeline run on the 8 hosts: *pred (the coordinator's seconds per
 * step) and *meas (measured). */
/* The served assignment's predicted split: "dp + pp + compute". */
static void predicted_split(const char *run, char *out, size_t cap)
{
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/%s/pipeline", run);
    struct ct_resp r;
    snprintf(out, cap, "?");
    if (ct_http(&g_c, "GET", path, g_org, NULL, &r) == 0 && r.status == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *p = json_object_get(json_object_get(j, "pipeline"), "predicted");
        snprintf(out, cap, "data-parallel %.3f + pipeline %.3f + compute %.3f",
                 json_number_value(json_object_get(p, "dp_s")), json_number_value(json_object_get(p, "pp_s")),
                 json_number_value(json_object_get(p, "compute_s")));
        json_decref(j);
    }
    ct_resp_free(&r);
}

static int pipeline_run(const char *run, const char *search, const int *hosts, double *pred, double *meas)
{
    char tr[300], dirs[N][256], logs[N][320], steps[N][320], url[64];
    if (write_manifest("train", 400000, 11, tr, sizeof tr) != 0)
        return -1;
    /* 4 layers of d_model 128, one per stage: 198,272 parameters in the
       middle stages, 239,232 in the first (token and position embeddings)
       and 231,296 in the last (the tied embedding, the final LayerNorm).
       gradient_bytes is the largest stage's, 957 kB: the model has one c_DP,
       and the slowest data-parallel group sets the term */
    json_t *cfg = json_pack("{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i}, s:{s:s, s:f, s:f}, s:i, s:i, s:i, s:i,"
                            " s:{s:s, s:i}, s:i, s:{s:i, s:i, s:f, s:i, s:s}}",
                            "model", "type", "gpt", "vocab", 256, "context", 64, "layers", 4, "heads", 4,
                            "d_model", 128, "d_ff", 512, "optimizer", "type", "adamw", "lr", 0.003, "clip_norm",
                            1.0, "batch_size", 32, "micro_batch", 4, "steps", STEPS, "seed", 1, "data", "train",
                            tr, "shuffle_buffer", 4096, "log_every", 5, "pipeline", "stages", S, "replicas", D,
                            "gradient_bytes", 956928.0, "seed", 1, "search", search);
    json_t *body = json_pack("{s:s, s:I, s:s, s:o}", "name", run, "target_batch_size", (json_int_t)32,
                             "model_summary", "byte GPT in 4 stages x 2", "config", cfg);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    struct ct_resp r;
    if (!text || ct_http(&g_c, "POST", "/api/v1/runs", g_org, text, &r) != 0 || r.status != 201) {
        fprintf(stderr, "creating run %s failed: %s\n", run, text ? r.body : "");
        free(text);
        return -1;
    }
    ct_resp_free(&r);
    free(text);
    snprintf(url, sizeof url, "https://%s:" PORT, g_net.h[0].ip);
    if (ct_net_volunteers(&g_net, &g_c, g_org, run, url, g_vol, N, hosts, dirs) != 0)
        return -1;
    g_vol += N;
    pid_t pid[N];
    for (int i = 0; i < N; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/pipeline.log", dirs[i]);
        snprintf(steps[i], sizeof steps[i], "%.250s/pipeline.steps", dirs[i]);
        /* the 8 hosts share this machine's cores: each gets an eighth of
           them, as if it had its own small CPU (1F1B has all stages
           computing at once; unlimited, they would slow each other down,
           which no host of a real collaboration does) */
        char to[8 * 40] = "", intra[16];
        size_t o = 0;
        for (int k = 0; k < N && g_oneway > 0; k++)
            if (region(k) != region(i))
                o += (size_t)snprintf(to + o, sizeof to - o, "%s%s/32=%ld", o ? "," : "", g_net.h[hosts[k]].ip,
                                      g_oneway);
        snprintf(intra, sizeof intra, "%d", g_oneway > 0 ? INTRA_MS : 0);
        char pace[16];
        snprintf(pace, sizeof pace, "%.2f", g_pace);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "pipeline", "--run", run, "--config-dir", dirs[i],
                              "--device", "cpu", "--step-log", steps[i], "--wait-s", "300",
                              "--max-cpu-percent", CPU_PERCENT, "--latency-ms", intra, "--pace", pace,
                              g_oneway > 0 ? "--latency-to" : NULL, to, NULL};
        pid[i] = ct_net_spawn(&g_net, hosts[i], argv, logs[i]);
    }
    int st[N], left = N;
    for (int i = 0; i < N; i++)
        st[i] = -1;
    double t0 = mono_s();
    while (left > 0 && mono_s() - t0 < 900) {
        for (int i = 0; i < N; i++) {
            int s = 0;
            if (st[i] < 0 && waitpid(pid[i], &s, WNOHANG) == pid[i]) {
                st[i] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
                left--;
            }
        }
        usleep(100000);
    }
    int ok = 1;
    for (int i = 0; i < N; i++) {
        if (st[i] < 0) {
            kill(pid[i], SIGKILL);
            ct_wait(pid[i], 10);
        }
        if (st[i] != 0) {
            char *l = ct_read_file(logs[i], NULL);
            fprintf(stderr, "%s: agent %d exited with %d:\n%s\n", run, i, st[i], l ? l : "");
            free(l);
            ok = 0;
        }
    }
    /* the prediction (every agent prints it) and the last stages' step
       times; each stage's phases (both replicas, the same steps) */
    double d[2 * STEPS], ph[S][4][2 * STEPS];
    size_t nd = 0, nph[S] = {0};
    static const char *const PH[4] = {"micro_s", "tied_s", "average_s", "norm_s"};
    int where[S][D];
    for (int j = 0; j < S; j++)
        for (int k = 0; k < D; k++)
            where[j][k] = -1;
    *pred = -1;
    for (int i = 0; ok && i < N; i++) {
        char *l = ct_read_file(logs[i], NULL);
        const char *p = l ? strstr(l, "(predicted ") : NULL;
        if (p)
            *pred = atof(p + strlen("(predicted "));
        const char *a = l ? strstr(l, "assignment version 1: stage ") : NULL;
        int sj = -1, sr = -1, ns = 0;
        if (a && sscanf(a, "assignment version 1: stage %d of %d of pipeline %d", &sj, &ns, &sr) == 3 && sj >= 0 &&
            sj < S && sr >= 0 && sr < D)
            where[sj][sr] = i;
        free(l);
        FILE *f = fopen(steps[i], "r");
        char line[2048];
        while (f && fgets(line, sizeof line, f)) {
            json_t *j = json_loads(line, 0, NULL);
            long s = (long)json_integer_value(json_object_get(j, "step"));
            long stage = (long)json_integer_value(json_object_get(j, "stage"));
            if (j && stage == S - 1 && s >= 4 && s <= STEPS && nd < 2 * STEPS)
                d[nd++] = json_number_value(json_object_get(j, "step_s"));
            if (j && stage >= 0 && stage < S && s >= 4 && s <= STEPS && nph[stage] < 2 * STEPS) {
                for (int k = 0; k < 4; k++)
                    ph[stage][k][nph[stage]] = json_number_value(json_object_get(j, PH[k]));
                nph[stage]++;
            }
            json_decref(j);
        }
        if (f)
            fclose(f);
    }
    for (int i = 0; i < N; i++)
        if (!getenv("CT_KEEP_LOGS"))
            ct_rmrf(dirs[i]);
    *meas = ct_median(d, nd);
    /* where a step's time goes: each stage's median phases (stage_step.c:
       its micro-batches 1F1B, the tied embedding's exchange, the averaging
       with its replicas, the norms; each includes waiting for the others) */
    for (int j = 0; ok && j < S; j++) {
        char hs[D][24];
        for (int k = 0; k < D; k++) {
            int i = where[j][k];
            if (i < 0)
                snprintf(hs[k], sizeof hs[k], "?");
            else
                snprintf(hs[k], sizeof hs[k], "%s%d/region %d", i < N / 2 ? "fast" : "slow", i, region(i));
        }
        printf("  %s stage %d (%s, %s): micro-batches %.3f, tied %.3f, averaging %.3f, norms %.3f s (medians)\n",
               run, j, hs[0], hs[1], ct_median(ph[j][0], nph[j]), ct_median(ph[j][1], nph[j]),
               ct_median(ph[j][2], nph[j]), ct_median(ph[j][3], nph[j]));
    }
    if (ok && (nd < STEPS || *pred <= 0)) {
        fprintf(stderr, "%s: %zu step times, prediction %.3f\n", run, nd, *pred);
        ok = 0;
    }
    return ok ? 0 : -1;
}

int main(void)
{
    const char *pc = getenv("BENCH_PIPE_PACE");
    if (pc && !((g_pace = strtod(pc, NULL)) >= 0.5 && g_pace <= 1))
        g_pace = 0;
    const char *ow = getenv("BENCH_PIPE_ONEWAY_MS");
    if (ow && (g_oneway = strtol(ow, NULL, 10)) < 0)
        g_oneway = 0;
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        return 0; /* the reason is printed */
    int hosts[N];
    if (rc != 0 || ct_net_public(&g_net, "coord") != 0 || ct_tempdir("pipebench", g_data, sizeof g_data) != 0)
        return 1;
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "%s%d", i < N / 2 ? "fast" : "slow", i);
        if ((hosts[i] = ct_net_public(&g_net, name)) < 0 ||
            ct_net_cap(&g_net, hosts[i], i < N / 2 ? FAST_MBPS : SLOW_MBPS) != 0)
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
    double pd = 0, md = 0, pr = 0, mr = 0;
    char sd[128], sr[128];
    int ok = pipeline_run("bench-pipe-dtfm", "dtfm", hosts, &pd, &md) == 0 &&
             pipeline_run("bench-pipe-random", "random", hosts, &pr, &mr) == 0;
    predicted_split("bench-pipe-dtfm", sd, sizeof sd);
    predicted_split("bench-pipe-random", sr, sizeof sr);
    if (ok) {
        printf("pipeline on 8 hosts (4 at %.0f Mbit/s, 4 at %.0f; two regions of 2 + 2, %ld ms one way between "
               "them, %d inside; agents pace at %.2f of their links), byte GPT 4 stages x 2 pipelines, steps 4-%d:\n",
               FAST_MBPS, SLOW_MBPS, g_oneway, g_oneway > 0 ? INTRA_MS : 0, g_pace, STEPS);
        printf("  DT-FM schedule:    predicted %.3f s/step (%s), measured %.3f s/step, measured/predicted "
               "%.2f (goal 0.8-1.2)\n", pd, sd, md, md / pd);
        printf("  random assignment: predicted %.3f s/step (%s), measured %.3f s/step, measured/predicted %.2f\n",
               pr, sr, mr, mr / pr);
        printf("  random / DT-FM, measured: %.2fx (predicted %.2fx; goal > 1)\n", mr / md, pr / pd);
    }
    int crc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    ct_net_destroy(&g_net);
    if (!getenv("CT_KEEP_LOGS"))
        ct_rmrf(g_data);
    free(g_org);
    return ok && crc == 0 ? 0 : 1;
}
