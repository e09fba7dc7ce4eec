/* DT-FM's scheduler on the five network scenarios of seed
 * 003_f3537b728458fcc1.txt §4.1 (tests/fixtures/dtfm_scenarios.json, a copy
 * of ../shared/bench/dtfm_scenarios.json): 64 devices, 8 stages x 8
 * replicas, GPT3-XL's activation and gradient sizes. For each scenario, the
 * predicted cost (common/sched/dtfm.h) of
 *   - a random assignment (mean of 100; the ablation of §4.2),
 *   - the genetic algorithm with no local search,
 *   - the genetic algorithm with Kernighan-Lin local search (Figure 4's baseline),
 *   - ours: the genetic algorithm with the paper's local search,
 * with the search times on this machine, and the same search run again with
 * the same seed (it must give the same partition). Published: the
 * scheduler's end-to-end speed-up over random assignment is up to 2.7x (case
 * 5), and its local search beats Kernighan-Lin's. Goals (issue 19): >= 2.7x
 * over random in case 5, never worse than GA + KL, <= 10 s per search.
 * Exit status 1 when a goal is not met.
 *
 * Units: delays in the file are ms, bandwidths Gbit/s, sizes GB (1e9 bytes).
 * The device layouts follow the "groups" texts: case 1, 8 instances of 8
 * GPUs; case 2, 8 instances of 4 GPUs (devices 0-31) and 32 standalone
 * GPUs; case 3, devices 0-31 in Ohio and 32-63 in Virginia; cases 4 and 5,
 * consecutive blocks per region in the order listed. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "sched/dtfm.h"

#define N 64
#define STAGES 8
#define REPLICAS 8
#define RANDOM_SAMPLES 100
#define GOAL_RATIO 2.7
#define GOAL_SECONDS 10.0

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Region (or machine) of each device, and the region names of cases 4-5. */
static int layout(int cs, const char *groups, int *region, char names[8][32], int *nregions)
{
    *nregions = 0;
    for (int d = 0; d < N; d++) {
        switch (cs) {
        case 1: region[d] = d / 8; break;
        case 2: region[d] = d < 32 ? d / 4 : 8 + (d - 32); break;
        case 3: region[d] = d / 32; break;
        default: region[d] = -1;
        }
    }
    if (cs <= 3)
        return 0;
    const char *colon = strchr(groups, ':');
    if (!colon)
        return -1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", colon + 1);
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t && *nregions < 8; t = strtok_r(NULL, ", ", &save))
        snprintf(names[(*nregions)++], 32, "%s", t);
    if (*nregions < 2 || N % *nregions)
        return -1;
    int per = N / *nregions;
    for (int d = 0; d < N; d++)
        region[d] = d / per;
    return 0;
}

static int region_of(char names[8][32], int nregions, const char *name, size_t len)
{
    for (int r = 0; r < nregions; r++)
        if (strlen(names[r]) == len && !strncmp(names[r], name, len))
            return r;
    return -1;
}

static int build(json_t *sc, double *delay, double *bw, double *act, double *grad)
{
    int cs = (int)json_integer_value(json_object_get(sc, "case"));
    const char *groups = json_string_value(json_object_get(sc, "groups"));
    int region[N], nregions;
    char names[8][32];
    if (!groups || layout(cs, groups, region, names, &nregions) != 0)
        return -1;
    json_t *intra = json_object_get(sc, "intra"), *inter = json_object_get(sc, "inter");
    json_t *pairs = json_object_get(sc, "inter_pairs");
    double id = json_number_value(json_object_get(intra, "delay")) / 1e3;
    double ib = json_number_value(json_object_get(intra, "bandwidth")) * 1e9;
    double rd[8][8], rb[8][8];
    if (pairs) {
        const char *key;
        json_t *v;
        json_object_foreach(pairs, key, v)
        {
            const char *dash = strchr(key, '-');
            if (!dash || json_array_size(v) != 2)
                return -1;
            int a = region_of(names, nregions, key, (size_t)(dash - key));
            int b = region_of(names, nregions, dash + 1, strlen(dash + 1));
            if (a < 0 || b < 0)
                return -1;
            rd[a][b] = rd[b][a] = json_number_value(json_array_get(v, 0)) / 1e3;
            rb[a][b] = rb[b][a] = json_number_value(json_array_get(v, 1)) * 1e9;
        }
    } else if (!inter) {
        return -1;
    }
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            double dl, bb;
            if (region[a] == region[b]) {
                dl = id;
                bb = ib;
            } else if (pairs) {
                dl = rd[region[a]][region[b]];
                bb = rb[region[a]][region[b]];
            } else {
                dl = json_number_value(json_object_get(inter, "delay")) / 1e3;
                bb = json_number_value(json_object_get(inter, "bandwidth")) * 1e9;
            }
            delay[a * N + b] = dl;
            bw[a * N + b] = bb;
        }
    *act = json_number_value(json_object_get(sc, "activation_GB")) * 1e9;
    *grad = json_number_value(json_object_get(sc, "gradient_GB")) * 1e9;
    return cs;
}

static double search(const struct dtfm_model *m, enum dtfm_local local, uint64_t seed, unsigned gens,
                     uint16_t *group, struct dtfm_cost *cost, double *secs)
{
    struct dtfm_search_opts o = {.seed = seed, .local = local, .generations = gens};
    struct dtfm_search_stats st;
    double t0 = now_s();
    if (dtfm_search(m, &o, group, cost, &st) != CM_OK) {
        fprintf(stderr, "bench_dtfm: search failed\n");
        exit(1);
    }
    *secs = now_s() - t0;
    return cost->total;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/fixtures/dtfm_scenarios.json";
    unsigned gens = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        fprintf(stderr, "bench_dtfm: %s: %s (line %d)\n", path, err.text, err.line);
        return 1;
    }
    json_t *scs = json_object_get(root, "scenarios");
    static double delay[N * N], bw[N * N];
    int failed = 0;
    printf("DT-FM scheduler (seed 003 §3.4): predicted seconds per step of communication, %d devices = %d stages x %d replicas\n",
           N, STAGES, REPLICAS);
    printf("%-4s %-28s %9s %9s %9s %9s %8s %8s %8s %10s %6s\n", "case", "scenario", "random", "GA", "GA+KL",
           "ours", "rand/us", "KL/us", "t_us_s", "t_KL_s", "same");
    double ratio5 = 0;
    for (size_t k = 0; k < json_array_size(scs); k++) {
        json_t *sc = json_array_get(scs, k);
        double act, grad;
        int cs = build(sc, delay, bw, &act, &grad);
        if (cs < 0) {
            fprintf(stderr, "bench_dtfm: scenario %zu: unreadable\n", k);
            return 1;
        }
        struct dtfm_problem p = {STAGES, REPLICAS, delay, bw, act, grad, NULL, NULL};
        struct dtfm_model *m;
        const char *why;
        if (dtfm_model_new(&p, &m, &why) != CM_OK) {
            fprintf(stderr, "bench_dtfm: case %d: %s\n", cs, why);
            return 1;
        }
        uint64_t rng = 0x5eed0000u + (uint64_t)cs;
        uint32_t assign[N];
        double rsum = 0;
        for (int i = 0; i < RANDOM_SAMPLES; i++) {
            struct dtfm_cost c;
            dtfm_random_assignment(m, &rng, assign);
            dtfm_cost_assignment(m, assign, &c);
            rsum += c.total;
        }
        double rnd = rsum / RANDOM_SAMPLES;
        uint16_t g_none[N], g_kl[N], g_us[N], g_again[N];
        struct dtfm_cost c_none, c_kl, c_us, c_again;
        double t_none, t_kl, t_us, t_again;
        uint64_t seed = 42 + (uint64_t)cs;
        search(m, DTFM_LOCAL_NONE, seed, gens, g_none, &c_none, &t_none);
        search(m, DTFM_LOCAL_KL, seed, gens, g_kl, &c_kl, &t_kl);
        search(m, DTFM_LOCAL_PAPER, seed, gens, g_us, &c_us, &t_us);
        search(m, DTFM_LOCAL_PAPER, seed, gens, g_again, &c_again, &t_again);
        int same = !memcmp(g_us, g_again, sizeof g_us) && c_us.total == c_again.total;
        /* the assignment agents would get has the partition's cost */
        struct dtfm_cost c_assign;
        dtfm_cost_partition(m, g_us, &c_us, assign);
        dtfm_cost_assignment(m, assign, &c_assign);
        printf("%-4d %-28.28s %9.2f %9.2f %9.2f %9.2f %7.2fx %7.3fx %8.2f %10.2f %6s\n", cs,
               json_string_value(json_object_get(sc, "name")), rnd, c_none.total, c_kl.total, c_us.total,
               rnd / c_us.total, c_kl.total / c_us.total, t_us, t_kl, same ? "yes" : "NO");
        printf("     ours: data-parallel %.2f s + pipeline %.2f s; its assignment costs %.2f s as assigned\n",
               c_us.dp, c_us.pp, c_assign.total);
        if (!same || fabs(c_assign.total - c_us.total) > 1e-9 * c_us.total)
            failed = 1;
        if (c_us.total > c_kl.total * (1 + 1e-9) || t_us > GOAL_SECONDS)
            failed = 1;
        if (cs == 5)
            ratio5 = rnd / c_us.total;
        dtfm_model_free(m);
    }
    json_decref(root);
    printf("published (seed 003 §4.2): up to 2.7x faster than random assignment end to end (case 5); "
           "its local search beats Kernighan-Lin's (Figure 4)\n");
    printf("goal: case 5 random/ours %.2fx (>= %.1fx) %s; ours <= GA+KL in every case, <= %.0f s per search, "
           "same result for the same seed: %s\n",
           ratio5, GOAL_RATIO, ratio5 >= GOAL_RATIO ? "met" : "NOT met", GOAL_SECONDS,
           failed ? "NOT met" : "met");
    return failed || ratio5 < GOAL_RATIO;
}
