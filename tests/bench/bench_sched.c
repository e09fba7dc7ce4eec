/* Solve time of the adaptive-averaging LP (seed 000_02cc6b5d62a616fc.txt,
 * Appendix B) for 8, 16, 64, 256 and 512 heterogeneous peers, as `make bench`
 * runs it. Peers are drawn (fixed seed) from the mix the seed's experiments
 * describe: GPUs with 0.1-1 Gbit/s links, some peers without accelerators,
 * some in client mode, a few measured slow pairs. The reference figure
 * printed next to each solve time is the seed's own (§3.2, footnote 2: the
 * LP "consistently converges in < 50ms" and is called about twice a
 * minute), so ratio = our time / 50 ms; the coordinator re-solves at most
 * every 30 s (coordinator/api_sched.c). Times include the role search
 * (common/sched/sched_roles.c), not only the LP (5). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "sched/sched.h"

#define PAIRS 8 /* measured pair throughputs per peer (t_ij of §3.2) */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* The averaging setups of the seed's Table 1 (bench/dedloc_table1.json,
 * ResNet-50, 25.6 M parameters): the LP's averaging time with every GPU peer
 * sending gradients, next to all-reduce in the same bandwidth-only model and
 * the seconds the seed measured. The model counts fp32 gradients and no
 * latency, protocol or summation cost, so absolute times differ from the
 * seed's (which are below the fp32 bandwidth bound in setup B: it likely
 * sent compressed gradients); the ratio between strategies is what compares
 * (the seed: adaptive averaging 1.9x faster than all-reduce in setup C). */
static void table1(void)
{
    static const struct {
        const char *name;
        int n1, bw1, n2, bw2, gpu2;
        double pub_ar, pub_ps, pub_ours; /* seconds; < 0 where the seed's text is unreadable */
    } set[] = {
        {"A", 8, 1000, 0, 0, 1, -1, 4.73, -1},
        {"B", 16, 200, 0, 0, 1, 5.3, 39.6, 5.3},
        {"C", 8, 1000, 16, 200, 1, 5.69, 14.1, 2.96},
        {"D", 16, 200, 1, 2500, 0, -1, 3.22, -1},
    };
    const double G = 25557032.0 * 32 / 1e6;
    printf("\nseed Table 1 setups (seconds per averaging round; model = bandwidth only)\n");
    printf("%5s %6s %10s %10s %10s %10s %10s %12s %12s\n", "setup", "peers", "model_ar",
           "model_lp", "seed_ar", "seed_ps", "seed_ours", "lp/ar_model", "ours/ar_seed");
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
        size_t n = (size_t)(set[k].n1 + set[k].n2);
        struct sched_peer pp[32];
        memset(pp, 0, sizeof pp);
        double bmin = 1e300;
        size_t ngpu = 0;
        for (size_t i = 0; i < n; i++) {
            int second = i >= (size_t)set[k].n1;
            double bw = second ? set[k].bw2 : set[k].bw1;
            pp[i].key[0] = (uint8_t)(i + 1);
            pp[i].samples_per_s = second && !set[k].gpu2 ? 0 : 1e6; /* compute never binds */
            pp[i].up_mbps = pp[i].down_mbps = bw;
            pp[i].inbound = 1;
            if (pp[i].samples_per_s > 0) {
                bmin = bw < bmin ? bw : bmin;
                ngpu++;
            }
        }
        struct sched_problem p = {pp, n, 4096, G, 1};
        struct sched_solution s;
        char err[256];
        if (sched_solve(&p, &s, err, sizeof err) != CM_OK) {
            printf("%5s: %s\n", set[k].name, err);
            continue;
        }
        /* butterfly all-reduce among the GPU peers: each sends and receives (n-1)/n of G
         * twice, at the slowest peer's bandwidth */
        double ar = 2.0 * (double)(ngpu - 1) / (double)ngpu * G / bmin;
        double lp = 1 / s.network_rate;
        char a[16], b[16], c[16], r[16];
        snprintf(a, sizeof a, set[k].pub_ar > 0 ? "%.2f" : "-", set[k].pub_ar);
        snprintf(b, sizeof b, "%.2f", set[k].pub_ps);
        snprintf(c, sizeof c, set[k].pub_ours > 0 ? "%.2f" : "-", set[k].pub_ours);
        snprintf(r, sizeof r, set[k].pub_ours > 0 && set[k].pub_ar > 0 ? "%.2f" : "-",
                 set[k].pub_ours / set[k].pub_ar);
        printf("%5s %6zu %10.2f %10.2f %10s %10s %10s %12.2f %12s\n", set[k].name, n, ar, lp, a,
               b, c, lp / ar, r);
        sched_solution_cleanup(&s);
    }
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {8, 16, 64, 256, 512};
    int reps = argc > 1 ? atoi(argv[1]) : 3; /* solves per size below 256 peers */
    if (reps < 1)
        reps = 1;
    printf("%6s %6s %8s %6s %8s %8s %9s %10s %10s %8s %7s %9s %s\n", "peers", "rows", "cols",
           "pairs", "iters", "lp_ms", "roles_ms", "min_ms", "median_ms", "seed_ms", "ratio",
           "steps/s", "roles");
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        struct sched_peer *pp = calloc(n, sizeof *pp);
        struct sched_link *links = calloc(n * PAIRS, sizeof *links);
        if (!pp || !links)
            return 1;
        for (size_t i = 0; i < n; i++) {
            pp[i].key[0] = (uint8_t)i;
            pp[i].key[1] = (uint8_t)(i >> 8);
            double r = urand();
            pp[i].samples_per_s = r < 0.15 ? 0 : 20 + 280 * urand();
            double bw = urand() < 0.2 ? 1000 : 100 + 400 * urand();
            pp[i].up_mbps = bw * (0.5 + 0.5 * urand());
            pp[i].down_mbps = bw;
            pp[i].inbound = urand() > 0.2;
            /* measured throughput to PAIRS other peers (agents report a sample of their
             * peers): 20-1000 Mbit/s, so some pairs are slower than either end */
            pp[i].links = &links[PAIRS * i];
            for (size_t l = 0; l < PAIRS && l < n - 1; l++) {
                links[PAIRS * i + l].to = (uint32_t)((i + 1 + l * (n / PAIRS > 1 ? n / PAIRS : 1) +
                                                      (size_t)(urand() * 0.9 * (double)(n / PAIRS))) %
                                                     n);
                if (links[PAIRS * i + l].to == i)
                    links[PAIRS * i + l].to = (uint32_t)((i + 1) % n);
                links[PAIRS * i + l].mbps = 20 + 980 * urand();
                pp[i].nlinks++;
            }
        }
        struct sched_problem p = {pp, n, 4096, 25557032.0 * 32 / 1e6};
        double ms[16], lp_ms[16], roles_ms[16];
        struct sched_solution s = {0};
        int nrep = reps > 16 ? 16 : reps;
        if (n >= 512)
            nrep = 1; /* about 10 s each on a shared 2-core machine */
        for (int k = 0; k < nrep; k++) {
            char err[256];
            sched_solution_cleanup(&s);
            int rc = sched_solve(&p, &s, err, sizeof err);
            if (rc != CM_OK) {
                fprintf(stderr, "bench_sched: %zu peers: %s\n", n, err);
                return 1;
            }
            ms[k] = s.solve_ms;
            lp_ms[k] = s.lp_ms;
            roles_ms[k] = s.roles_ms;
        }
        size_t npairs = 0;
        for (size_t i = 0; i < n; i++)
            npairs += pp[i].nlinks;
        /* sort the runs by total time; the parts are those of the median run */
        for (int a = 1; a < nrep; a++)
            for (int b = a; b > 0 && ms[b] < ms[b - 1]; b--) {
                double t = ms[b], tl = lp_ms[b], tr = roles_ms[b];
                ms[b] = ms[b - 1];
                lp_ms[b] = lp_ms[b - 1];
                roles_ms[b] = roles_ms[b - 1];
                ms[b - 1] = t;
                lp_ms[b - 1] = tl;
                roles_ms[b - 1] = tr;
            }
        size_t comp = 0, agg = 0;
        for (size_t i = 0; i < n; i++) {
            comp += s.peers[i].compute != 0;
            agg += s.peers[i].share > 0;
        }
        double med = ms[nrep / 2];
        printf("%6zu %6d %8d %6zu %8d %8.1f %9.1f %10.1f %10.1f %8.1f %7.2f %9.4f %zu compute, "
               "%zu aggregate\n",
               n, s.rows, s.cols, npairs, s.iterations, lp_ms[nrep / 2], roles_ms[nrep / 2], ms[0],
               med, 50.0, med / 50.0, s.steps_per_s, comp, agg);
        fflush(stdout);
        sched_solution_cleanup(&s);
        free(pp);
        free(links);
    }
    table1();
    return 0;
}
