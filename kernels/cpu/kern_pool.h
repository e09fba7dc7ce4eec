/* The CPU backend's worker threads (internal to kernels/cpu/).
 *
 * Why not OpenMP: libgomp's threads spin after every parallel region, and
 * on a machine whose cores are also busy with other work (a volunteer's
 * desktop, the agent's own data and network threads) that spinning starves
 * the thread that has the real work: measured on 2 cores, the Fashion-MNIST
 * MLP trained at 4,550 samples/s with two OpenMP threads and 37,000 with
 * OMP_WAIT_POLICY=passive. These workers block on a condition variable.
 *
 * Work is split statically into one contiguous slice per thread, so results
 * (reductions included) are the same from run to run for a given thread
 * count. */
#ifndef KERN_POOL_H
#define KERN_POOL_H

#include <stddef.h>

/* Most threads a pool runs (and most slices a parallel call makes). */
#define KERN_POOL_MAX 256

/* Runs on [lo, hi) of the index space; tid in [0, nthreads). */
typedef void (*kern__range_fn)(void *ctx, size_t lo, size_t hi, int tid);

/* Threads to use, 0 = one per online core. Takes effect at the next call. */
void kern__pool_set_threads(int n);
/* Threads the next parallel call will use (>= 1). */
int kern__pool_threads(void);

/* Calls fn on nthreads contiguous slices of [0, n) and returns when all are
 * done; the caller runs slice 0. Serial (one call with tid 0 over [0, n))
 * when n < min_par, when only one thread is configured, when called from
 * inside a slice, or when another thread holds the pool. Returns the number
 * of slices used, so callers can combine per-slice partial results. */
int kern__parallel_for(size_t n, size_t min_par, kern__range_fn fn, void *ctx);

/* The slice of [0, n) that slice tid of nt gets. */
void kern__slice(size_t n, int tid, int nt, size_t *lo, size_t *hi);

#endif
