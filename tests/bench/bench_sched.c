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

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {8, 16, 64, 256, 512};
    int reps = argc > 1 ? atoi(argv[1]) : 3; /* solves per size below 256 peers */
    if (reps < 1)
        reps = 1;
    printf("%6s %6s %8s %8s %10s %10s %10s %9s %9s %s\n", "peers", "rows", "cols", "iters",
           "solve_ms", "median_ms", "seed_ms", "ratio", "steps/s", "roles");
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        struct sched_peer *pp = calloc(n, sizeof *pp);
        struct sched_link *links = calloc(n * 2, sizeof *links);
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
            if (urand() < 0.3) {
                links[2 * i].to = (uint32_t)((i + 1 + (size_t)(urand() * (n - 1))) % n);
                if (links[2 * i].to == i)
                    links[2 * i].to = (uint32_t)((i + 1) % n);
                links[2 * i].mbps = 20 + 200 * urand();
                pp[i].links = &links[2 * i];
                pp[i].nlinks = 1;
            }
        }
        struct sched_problem p = {pp, n, 4096, 25557032.0 * 32 / 1e6};
        double ms[16];
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
        }
        for (int a = 1; a < nrep; a++)
            for (int b = a; b > 0 && ms[b] < ms[b - 1]; b--) {
                double t = ms[b];
                ms[b] = ms[b - 1];
                ms[b - 1] = t;
            }
        size_t comp = 0, agg = 0;
        for (size_t i = 0; i < n; i++) {
            comp += s.peers[i].compute != 0;
            agg += s.peers[i].share > 0;
        }
        double med = ms[nrep / 2];
        printf("%6zu %6d %8d %8d %10.1f %10.1f %10.1f %9.2f %9.4f %zu compute, %zu aggregate\n",
               n, s.rows, s.cols, s.iterations, ms[0], med, 50.0, med / 50.0, s.steps_per_s,
               comp, agg);
        fflush(stdout);
        sched_solution_cleanup(&s);
        free(pp);
        free(links);
    }
    return 0;
}
