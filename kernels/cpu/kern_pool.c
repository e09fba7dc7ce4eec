/* Worker threads for the CPU backend (see kern_pool.h): a fixed set of
 * pthreads that sleep on a condition variable between jobs; one job at a
 * time, the calling thread taking slice 0. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "cm_log.h"
#include "kern_pool.h"

#define POOL_MAX KERN_POOL_MAX

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_mutex_t job;       /* held by the caller of a parallel job */
    pthread_t tid[POOL_MAX];
    int nworkers;              /* threads started (excluding callers) */
    int want;                  /* configured threads, 0 = cores */
    unsigned long gen;         /* job generation */
    unsigned long start_gen;   /* gen when the current workers were started */
    int pending;               /* workers still running the current job */
    int stop;
    int nt;                    /* slices of the current job */
    size_t n;
    kern__range_fn fn;
    void *ctx;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .work = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER,
       .job = PTHREAD_MUTEX_INITIALIZER};

static __thread int in_slice;

void kern__slice(size_t n, int tid, int nt, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)tid / (size_t)nt;
    *hi = n * (size_t)(tid + 1) / (size_t)nt;
}

static int cores(void)
{
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c < 1 ? 1 : c > POOL_MAX ? POOL_MAX : (int)c;
}

int kern__pool_threads(void)
{
    int w = __atomic_load_n(&P.want, __ATOMIC_RELAXED);
    int t = w > 0 ? w : cores();
    return t > POOL_MAX ? POOL_MAX : t;
}

static void *worker(void *arg)
{
    int id = (int)(size_t)arg; /* 1..nworkers */
    in_slice = 1;
    pthread_mutex_lock(&P.mu);
    /* The generation at creation, not P.gen now: the first job may already
     * have been posted before this thread first took the lock. */
    unsigned long seen = P.start_gen;
    for (;;) {
        while (!P.stop && P.gen == seen)
            pthread_cond_wait(&P.work, &P.mu);
        if (P.stop)
            break;
        seen = P.gen;
        int nt = P.nt;
        kern__range_fn fn = P.fn;
        void *ctx = P.ctx;
        size_t n = P.n;
        pthread_mutex_unlock(&P.mu);
        if (id < nt) {
            size_t lo, hi;
            kern__slice(n, id, nt, &lo, &hi);
            if (hi > lo)
                fn(ctx, lo, hi, id);
        }
        pthread_mutex_lock(&P.mu);
        if (--P.pending == 0)
            pthread_cond_signal(&P.done);
    }
    pthread_mutex_unlock(&P.mu);
    return NULL;
}

/* Stops the workers; called with P.job held. */
static void pool_stop(void)
{
    pthread_mutex_lock(&P.mu);
    P.stop = 1;
    pthread_cond_broadcast(&P.work);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.nworkers; i++)
        pthread_join(P.tid[i], NULL);
    P.nworkers = 0;
    P.stop = 0;
}

/* Starts want-1 workers; called with P.job held. Fewer on failure. */
static void pool_start(int want)
{
    P.start_gen = P.gen; /* only the P.job holder changes gen */
    for (int i = 0; i < want - 1; i++) {
        if (pthread_create(&P.tid[i], NULL, worker, (void *)(size_t)(i + 1))) {
            CM_LOGW("kernels", "cpu: could only start %d of %d worker threads", i, want - 1);
            break;
        }
        P.nworkers++;
    }
}

void kern__pool_set_threads(int n)
{
    __atomic_store_n(&P.want, n > 0 ? (n > POOL_MAX ? POOL_MAX : n) : 0, __ATOMIC_RELAXED);
}

int kern__parallel_for(size_t n, size_t min_par, kern__range_fn fn, void *ctx)
{
    int want = kern__pool_threads();
    if (n == 0)
        return 1;
    if (want <= 1 || n < min_par || in_slice || pthread_mutex_trylock(&P.job)) {
        fn(ctx, 0, n, 0);
        return 1;
    }
    if (P.nworkers != want - 1) {
        pool_stop();
        pool_start(want);
    }
    int nt = P.nworkers + 1;
    if ((size_t)nt > n)
        nt = (int)n;
    pthread_mutex_lock(&P.mu);
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    P.nt = nt;
    P.pending = P.nworkers;
    P.gen++;
    pthread_cond_broadcast(&P.work);
    pthread_mutex_unlock(&P.mu);
    size_t lo, hi;
    kern__slice(n, 0, nt, &lo, &hi);
    in_slice = 1;
    if (hi > lo)
        fn(ctx, lo, hi, 0);
    in_slice = 0;
    pthread_mutex_lock(&P.mu);
    while (P.pending > 0)
        pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.job);
    return nt;
}
