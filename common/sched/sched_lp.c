/* The adaptive-averaging linear program (seed 000_02cc6b5d62a616fc.txt,
 * §3.2 problem (1), Appendix B problem (5) and fractions (6)), built and
 * solved with GLPK.
 *
 * Model, with every rate divided by the gradient size G so that all rates
 * are in "gradients per second" (= optimizer steps per second):
 *
 *   max xi
 *   xi <= sum_i s_i c_i / B                               (compute)
 *   xi <= sum_i h_i                                       (receive)
 *   h_i <= a_ki + (1 - c_k) M_i   for aggregator i, k != i, s_k > 0   (4)
 *   sum_{k!=i} a_ki + [s_i > 0] sum_{j!=i} h_j <= d_i / G  (download)
 *   sum_{j!=i} a_ij + |receivers other than i| h_i <= u_i / G (upload)
 *   a_ij + [s_j > 0] h_i <= t_ij / G  for measured pairs   (links)
 *   + T_q in both rows of q's relay R, for each relayed peer q (below)
 *   0 <= c_i <= 1 (c_i = 0 when s_i = 0), a >= 0, 0 <= h_i <= M_i
 *
 * h_i is the rate at which aggregator i returns its part to every receiver
 * (g_ij = h_i, see below). The O(n^3) family (4), g_ij <= a_ki + (1 - c_k)
 * d_i for all i, j, k, becomes n^2 rows through this one auxiliary variable
 * per aggregator (a_i = min_{k: c_k = 1} a_ki in §3.2): g_ij <= min_k(...)
 * for every j holds iff h_i, bounding all g_ij, does. M_i bounds h_i and is
 * large enough never to bind when c_k = 0 (the condition Appendix B puts on
 * the d_i factor): returns from i to others cannot exceed u_i, and a local
 * return never needs more than the compute rate sum s / B.
 *
 * Two choices the seed leaves open, made here:
 *  - client-mode peers (no inbound connections, §3.3) cannot aggregate:
 *    no a_ki or h_i exist for them ("a_i = 0");
 *  - peers that cannot compute (s_i = 0) neither send gradients nor need
 *    the average: no a_ik and no receive terms for them (Appendix B:
 *    such peers are excluded from the compute and network terms).
 *
 * The solve has two steps. (1) The relaxation (5), GLPK's primal simplex
 * without the presolver (see sched_solve): its optimum xi is reported (an upper bound of
 * problem (1)) and its c guides (2) the choice of binary roles in
 * sched_roles.c, because the relaxation of c is not exact. For the chosen
 * roles the plan is the one with the highest network rate, which is also
 * what makes the choice unique where (5) is not (when compute binds, any
 * fast enough plan is optimal; this one splits homogeneous peers evenly).
 * GLPK's simplex is deterministic, so equal inputs give equal plans.
 *
 * One more deviation from the letter of (5), needed for (6) to describe the
 * optimum: g_ij is one rate g_i per aggregator (h below), the same to every
 * receiver. In (5) a receiver may get more of one part and less of another,
 * which no schedule of fixed parts can realize; with fixed parts, lowering
 * g_ij to min_j g_ij loses nothing, so this costs no throughput of a plan
 * peers can follow, and it makes the model n^2 rather than 2 n^2 columns.
 * tests/unit/sched/test_sched_lp.c checks the optimum against the O(n^3)
 * form with a g_ij per pair, solved by an independent dense simplex. */
#include "sched/sched_internal.h"

#include <glpk.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"


static int num_check(double v, double lo, double hi, int lo_open, const char *what, size_t i,
                     char *err, size_t cap)
{
    if (!isfinite(v)) {
        sched__seterr(err, cap, "peer %zu: %s is not a finite number", i, what);
        return CM_ENUMERIC;
    }
    if (v < lo || (lo_open && v == lo) || v > hi) {
        sched__seterr(err, cap, "peer %zu: %s = %g is outside %s%g, %g]", i, what, v, lo_open ? "(" : "[",
               lo, hi);
        return CM_ERANGE;
    }
    return CM_OK;
}

int sched_problem_check(const struct sched_problem *p, char *err, size_t cap)
{
    if (!p || (p->n && !p->peers)) {
        sched__seterr(err, cap, "no problem given");
        return CM_EINVAL;
    }
    if (p->n == 0) {
        sched__seterr(err, cap, "no peers: a schedule needs at least one");
        return CM_EINVAL;
    }
    if (p->n > SCHED_MAX_PEERS) {
        sched__seterr(err, cap, "%zu peers: at most %d per schedule", p->n, SCHED_MAX_PEERS);
        return CM_ETOOBIG;
    }
    if (!isfinite(p->role_gain) || p->role_gain < 0 || p->role_gain > 10) {
        sched__seterr(err, cap, "role gain %g is outside [0, 10]", p->role_gain);
        return CM_ERANGE;
    }
    if (!isfinite(p->target_batch) || !isfinite(p->gradient_mbit)) {
        sched__seterr(err, cap, "target batch size and gradient size must be finite numbers");
        return CM_ENUMERIC;
    }
    if (p->target_batch < 1 || p->target_batch > SCHED_MAX_BATCH) {
        sched__seterr(err, cap, "target batch size %g is outside [1, %g]", p->target_batch,
               SCHED_MAX_BATCH);
        return CM_ERANGE;
    }
    if (!(p->gradient_mbit > 0) || p->gradient_mbit > SCHED_MAX_GRADIENT_MBIT) {
        sched__seterr(err, cap, "gradient size %g Mbit is outside (0, %g]", p->gradient_mbit,
               SCHED_MAX_GRADIENT_MBIT);
        return CM_ERANGE;
    }
    double total_s = 0;
    int any_inbound = 0;
    for (size_t i = 0; i < p->n; i++) {
        const struct sched_peer *q = &p->peers[i];
        int rc;
        if ((rc = num_check(q->samples_per_s, 0, SCHED_MAX_SAMPLES_PER_S, 0, "samples/s", i, err,
                            cap)) ||
            (rc = num_check(q->up_mbps, 0, SCHED_MAX_MBPS, 1, "upload Mbit/s", i, err, cap)) ||
            (rc = num_check(q->down_mbps, 0, SCHED_MAX_MBPS, 1, "download Mbit/s", i, err, cap)))
            return rc;
        if (q->nlinks > SCHED_MAX_LINKS || (q->nlinks && !q->links)) {
            sched__seterr(err, cap, "peer %zu: %zu pair throughputs, at most %d", i, q->nlinks,
                   SCHED_MAX_LINKS);
            return q->nlinks > SCHED_MAX_LINKS ? CM_ETOOBIG : CM_EINVAL;
        }
        for (size_t l = 0; l < q->nlinks; l++) {
            if (q->links[l].to >= p->n || q->links[l].to == i) {
                sched__seterr(err, cap, "peer %zu: pair throughput to an unknown peer or to itself", i);
                return CM_EINVAL;
            }
            if ((rc = num_check(q->links[l].mbps, 0, SCHED_MAX_MBPS, 1, "pair Mbit/s", i, err,
                                cap)))
                return rc;
        }
        if (!(q->relay_direct >= 0 && q->relay_direct <= 1)) {
            sched__seterr(err, cap, "peer %zu: relay_direct %g is outside [0, 1]", i, q->relay_direct);
            return isfinite(q->relay_direct) ? CM_ERANGE : CM_ENUMERIC;
        }
        if (q->relay && (q->relay > p->n || q->relay - 1 == i || !p->peers[q->relay - 1].inbound ||
                         p->peers[q->relay - 1].relay)) {
            sched__seterr(err, cap, "peer %zu: its relay must be another peer that accepts connections "
                          "and is not relayed itself", i);
            return CM_EINVAL;
        }
        for (size_t j = 0; j < i; j++)
            if (!memcmp(p->peers[j].key, q->key, CM_ED25519_PUB_LEN)) {
                sched__seterr(err, cap, "peers %zu and %zu have the same public key", j, i);
                return CM_EINVAL;
            }
        total_s += q->samples_per_s;
        any_inbound |= q->inbound != 0;
    }
    if (!(total_s > 0)) {
        sched__seterr(err, cap, "no peer can compute gradients (every samples/s is 0)");
        return CM_EINVAL;
    }
    if (!any_inbound) {
        sched__seterr(err, cap, "no peer accepts inbound connections: nobody can aggregate");
        return CM_EINVAL;
    }
    return CM_OK;
}

/* Triplets for glp_load_matrix (1-based; index 0 unused). */
struct trip {
    int *ia, *ja;
    double *ar;
    size_t n, cap;
};

static int trip_add(struct trip *t, int row, int col, double v)
{
    if (t->n + 1 >= t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 4096;
        int *ia = realloc(t->ia, nc * sizeof *ia);
        if (ia)
            t->ia = ia;
        int *ja = realloc(t->ja, nc * sizeof *ja);
        if (ja)
            t->ja = ja;
        double *ar = realloc(t->ar, nc * sizeof *ar);
        if (ar)
            t->ar = ar;
        if (!ia || !ja || !ar)
            return CM_ENOMEM;
        t->cap = nc;
    }
    t->n++;
    t->ia[t->n] = row;
    t->ja[t->n] = col;
    t->ar[t->n] = v;
    return CM_OK;
}

/* GLPK reports errors by printing and then calling the error hook; the hook
 * jumps back to the solve, which frees GLPK's environment (GLPK's
 * documented recovery) instead of letting GLPK abort the process. Output is
 * captured by a terminal hook rather than switched off with
 * glp_term_out(GLP_OFF), because that would also drop the error message we
 * log once. GLPK keeps its environment per thread; a mutex still serializes
 * solves so one large solve does not multiply memory by the thread pool. */
static pthread_mutex_t g_glpk_mu = PTHREAD_MUTEX_INITIALIZER;

struct glpk_ctx {
    jmp_buf jb;
    char msg[256];
    size_t len;
};

static int glpk_term(void *info, const char *s)
{
    struct glpk_ctx *g = info;
    size_t n = strlen(s);
    if (g->len + n >= sizeof g->msg) /* keep the most recent text */
        g->len = 0;
    if (n >= sizeof g->msg)
        n = sizeof g->msg - 1;
    memcpy(g->msg + g->len, s, n);
    g->len += n;
    g->msg[g->len] = 0;
    return 1; /* suppress GLPK's own printing */
}

static void glpk_error(void *info)
{
    struct glpk_ctx *g = info;
    longjmp(g->jb, 1);
}

struct model {
    size_t n;
    int xi;            /* column of xi */
    int *c, *h;        /* [n] columns (h: 0 when not an aggregator) */
    int *a;            /* [n*n] columns a[k*n+i]; 0 = absent */
    double *M;         /* [n] the big-M of (4) per aggregator */
    int row_cmp;       /* xi - sum s c / B <= 0 */
    double *scale_s;   /* [n] s_i / B */
};

static int simplex(glp_prob *lp, int presolve, int *iters)
{
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.meth = GLP_PRIMAL;
    parm.presolve = presolve ? GLP_ON : GLP_OFF;
    int before = glp_get_it_cnt(lp);
    int rc = glp_simplex(lp, &parm);
    *iters += glp_get_it_cnt(lp) - before;
    if (rc != 0) {
        CM_LOGE("sched", "GLPK simplex failed (code %d)", rc);
        return CM_EINTERNAL;
    }
    if (glp_get_status(lp) != GLP_OPT) {
        CM_LOGE("sched", "GLPK found no optimum (status %d)", glp_get_status(lp));
        return CM_EINTERNAL;
    }
    return CM_OK;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Builds (5) into lp. Runs under the GLPK error hook. */
static int build(glp_prob *lp, const struct sched_problem *p, struct model *m, double *tmin)
{
    size_t n = p->n, nrecv = 0;
    const double G = p->gradient_mbit;
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        m->scale_s[i] = p->peers[i].samples_per_s / p->target_batch;
        total += m->scale_s[i];
        nrecv += p->peers[i].samples_per_s > 0;
    }
    glp_set_obj_dir(lp, GLP_MAX);

    /* Columns. */
    m->xi = glp_add_cols(lp, 1);
    glp_set_col_bnds(lp, m->xi, GLP_LO, 0, 0);
    glp_set_obj_coef(lp, m->xi, 1);
    for (size_t i = 0; i < n; i++) {
        m->c[i] = glp_add_cols(lp, 1);
        if (p->peers[i].samples_per_s > 0)
            glp_set_col_bnds(lp, m->c[i], GLP_DB, 0, 1);
        else
            glp_set_col_bnds(lp, m->c[i], GLP_FX, 0, 0);
    }
    for (size_t i = 0; i < n; i++) {
        if (!p->peers[i].inbound)
            continue;
        m->M[i] = fmax(p->peers[i].up_mbps / G, total);
        m->h[i] = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, m->h[i], GLP_DB, 0, m->M[i]);
        for (size_t k = 0; k < n; k++)
            if (k != i && p->peers[k].samples_per_s > 0) {
                m->a[k * n + i] = glp_add_cols(lp, 1);
                glp_set_col_bnds(lp, m->a[k * n + i], GLP_LO, 0, 0);
            }
    }

    struct trip t = {0};
    int rc = CM_OK;
    int *T = calloc(n, sizeof *T); /* columns T_q of relayed peers' traffic, 0: none */
    uint32_t *rl = calloc(2 * n, sizeof *rl); /* who each peer relays for */
    if (!T || !rl) {
        free(T);
        free(rl);
        return CM_ENOMEM;
    }
    sched__relay_lists(p, rl, rl + n);
#define ADD(row, col, v)                                                                         \
    do {                                                                                         \
        if ((rc = trip_add(&t, (row), (col), (v))) != CM_OK)                                     \
            goto out;                                                                            \
    } while (0)
    int row;

    m->row_cmp = row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, GLP_UP, 0, 0);
    ADD(row, m->xi, 1);
    for (size_t i = 0; i < n; i++)
        if (m->scale_s[i] > 0)
            ADD(row, m->c[i], -m->scale_s[i]);

    /* H = sum_i h_i; receive: xi - H <= 0 (every receiver gets every part). H keeps
     * the download rows below at O(n) entries each instead of O(n) more. */
    int H = glp_add_cols(lp, 1);
    glp_set_col_bnds(lp, H, GLP_LO, 0, 0);
    row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
    ADD(row, H, 1);
    for (size_t i = 0; i < n; i++)
        if (m->h[i])
            ADD(row, m->h[i], -1);
    row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, GLP_UP, 0, 0);
    ADD(row, m->xi, 1);
    ADD(row, H, -1);
    /* seed 000, Appendix B, (4) through h_i: h_i - a_ki + M_i c_k <= M_i */
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n && m->h[i]; k++) {
            if (!m->a[k * n + i])
                continue;
            row = glp_add_rows(lp, 1);
            glp_set_row_bnds(lp, row, GLP_UP, 0, m->M[i]);
            ADD(row, m->h[i], 1);
            ADD(row, m->a[k * n + i], -1);
            ADD(row, m->c[k], m->M[i]);
        }
    /* Relayed peers (seed 000 §3.3, technique 2): what peer p sends to or
     * receives from anyone but its relay R crosses R's link twice, in and
     * out. T_p = that traffic: sum_{j != p,R} a_pj + (receivers other than
     * p, R) h_p + sum_{k != p,R} a_kp + [p receives] (H - h_p - h_R); it
     * joins R's download and upload rows below. */
    for (size_t q = 0; q < n; q++) {
        size_t R = p->peers[q].relay ? p->peers[q].relay - 1 : n;
        if (R == n || p->peers[q].relay_direct >= 1)
            continue; /* no relay, or every hole punched */
        int recv_q = p->peers[q].samples_per_s > 0, recv_r = p->peers[R].samples_per_s > 0;
        T[q] = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, T[q], GLP_LO, 0, 0);
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
        ADD(row, T[q], 1);
        for (size_t j = 0; j < n; j++) {
            if (j == q || j == R)
                continue;
            if (m->a[q * n + j])
                ADD(row, m->a[q * n + j], -1);
            if (m->a[j * n + q])
                ADD(row, m->a[j * n + q], -1);
        }
        double chq = (double)nrecv - recv_q - recv_r - recv_q;
        if (m->h[q] && chq != 0)
            ADD(row, m->h[q], -chq);
        if (recv_q) {
            ADD(row, H, -1);
            ADD(row, m->h[R], 1);
        }
    }
    /* download: sum_k a_ki + [i receives] (H - h_i) <= d_i;
     * upload: sum_j a_ij + (receivers other than i) h_i <= u_i;
     * a relay's both: + T_q of every peer q it relays for */
    for (size_t i = 0; i < n; i++) {
        int recv_i = p->peers[i].samples_per_s > 0;
        size_t before = t.n;
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, p->peers[i].down_mbps / G);
        for (size_t k = 0; k < n; k++)
            if (k != i && m->a[k * n + i])
                ADD(row, m->a[k * n + i], 1);
        if (recv_i) {
            ADD(row, H, 1);
            if (m->h[i])
                ADD(row, m->h[i], -1);
        }
        for (uint32_t k = rl[i]; k; k = rl[n + k - 1])
            if (T[k - 1])
                ADD(row, T[k - 1], 1 - p->peers[k - 1].relay_direct);
        if (t.n == before)
            glp_set_row_bnds(lp, row, GLP_FR, 0, 0);
        before = t.n;
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, p->peers[i].up_mbps / G);
        for (size_t j = 0; j < n; j++)
            if (j != i && m->a[i * n + j])
                ADD(row, m->a[i * n + j], 1);
        if (m->h[i] && nrecv - (size_t)recv_i > 0)
            ADD(row, m->h[i], (double)(nrecv - (size_t)recv_i));
        for (uint32_t k = rl[i]; k; k = rl[n + k - 1])
            if (T[k - 1])
                ADD(row, T[k - 1], 1 - p->peers[k - 1].relay_direct);
        if (t.n == before)
            glp_set_row_bnds(lp, row, GLP_FR, 0, 0);
    }
    /* measured pairs: a_ij + [j receives] h_i <= t_ij (the smallest report of a pair) */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            int ret = m->h[i] && p->peers[j].samples_per_s > 0;
            if (!isfinite(tmin[i * n + j]) || (!m->a[i * n + j] && !ret))
                continue;
            row = glp_add_rows(lp, 1);
            glp_set_row_bnds(lp, row, GLP_UP, 0, tmin[i * n + j]);
            if (m->a[i * n + j])
                ADD(row, m->a[i * n + j], 1);
            if (ret)
                ADD(row, m->h[i], 1);
        }
#undef ADD
    glp_load_matrix(lp, (int)t.n, t.ia, t.ja, t.ar);
out:
    free(T);
    free(rl);
    free(t.ia);
    free(t.ja);
    free(t.ar);
    return rc;
}

/* Largest-remainder rounding of fractions to parts of SCHED_SHARE_TOTAL;
 * ties go to the lower index, so the result is deterministic. */
static void shares_round(struct sched_peer_plan *pl, size_t n)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        pl[i].share = (uint32_t)floor(pl[i].fraction * SCHED_SHARE_TOTAL);
        sum += pl[i].share;
    }
    while (sum < SCHED_SHARE_TOTAL) {
        size_t best = n;
        double best_rem = -1;
        for (size_t i = 0; i < n; i++) {
            if (!(pl[i].fraction > 0))
                continue;
            double rem = pl[i].fraction * SCHED_SHARE_TOTAL - pl[i].share;
            if (rem > best_rem) {
                best_rem = rem;
                best = i;
            }
        }
        if (best == n)
            break;
        pl[best].share++;
        sum++;
    }
}

int sched_solve(const struct sched_problem *p, struct sched_solution *out, char *err, size_t cap)
{
    if (!out) {
        sched__seterr(err, cap, "no output given");
        return CM_EINVAL;
    }
    memset(out, 0, sizeof *out);
    int rc = sched_problem_check(p, err, cap);
    if (rc != CM_OK)
        return rc;
    const size_t n = p->n;
    const double G = p->gradient_mbit;
    double t0 = now_ms();

    struct model m = {.n = n};
    m.c = calloc(n, sizeof *m.c);
    m.M = calloc(n, sizeof *m.M);
    m.h = calloc(n, sizeof *m.h);
    m.a = calloc(n * n, sizeof *m.a);
    m.scale_s = calloc(n, sizeof *m.scale_s);
    double *tmin = malloc(n * n * sizeof *tmin);
    double *crelax = calloc(n, sizeof *crelax), *h = calloc(n, sizeof *h), net = 0;
    unsigned char *on = calloc(n, 1);
    out->peers = calloc(n, sizeof *out->peers);
    if (!m.c || !m.M || !m.h || !m.a || !m.scale_s || !tmin || !out->peers || !crelax || !h ||
        !on) {
        rc = CM_ENOMEM;
        sched__seterr(err, cap, "out of memory for %zu peers", n);
        goto done;
    }
    for (size_t i = 0; i < n * n; i++)
        tmin[i] = INFINITY;
    for (size_t i = 0; i < n; i++)
        for (size_t l = 0; l < p->peers[i].nlinks; l++) {
            size_t j = p->peers[i].links[l].to;
            tmin[i * n + j] = fmin(tmin[i * n + j], p->peers[i].links[l].mbps / G);
        }

    pthread_mutex_lock(&g_glpk_mu);
    static __thread struct glpk_ctx gctx; /* static: survives the longjmp */
    gctx.len = 0;
    gctx.msg[0] = 0;
    glp_prob *volatile lp = NULL;
    volatile int iters = 0;
    volatile int stage_rc = CM_OK;
    if (setjmp(gctx.jb)) {
        /* GLPK hit an internal error: everything it allocated goes with its environment. */
        CM_LOGE("sched", "GLPK error: %s", gctx.msg[0] ? gctx.msg : "(no message)");
        glp_free_env();
        pthread_mutex_unlock(&g_glpk_mu);
        rc = CM_EINTERNAL;
        sched__seterr(err, cap, "the LP solver failed");
        goto done;
    }
    glp_term_hook(glpk_term, &gctx);
    glp_error_hook(glpk_error, &gctx);
    lp = glp_create_prob();
    {
        int it = 0;
        double t_lp = now_ms();
        stage_rc = build(lp, p, &m, tmin);
        out->rows = glp_get_num_rows(lp);
        out->cols = glp_get_num_cols(lp);
        if (stage_rc == CM_OK) {
            /* Rates are already in steps/s; one equilibration pass (rounded to powers of 2,
             * so exact) is enough and costs a quarter of GLP_SF_AUTO's iterated geometric
             * scaling (16 vs 63 ms at 256 peers). No presolver: on (5) it removes almost
             * nothing and cost more than the simplex itself (165 ms at 256 peers). */
            glp_scale_prob(lp, GLP_SF_EQ | GLP_SF_2N);
            stage_rc = simplex(lp, 0, &it); /* problem (5) */
        }
        if (stage_rc == CM_OK) {
            out->xi = glp_get_obj_val(lp);
            for (size_t i = 0; i < n; i++)
                crelax[i] = glp_get_col_prim(lp, m.c[i]);
        }
        glp_delete_prob(lp);
        lp = NULL;
        double t_roles = now_ms();
        out->lp_ms = t_roles - t_lp;
        if (stage_rc == CM_OK) {
            struct sched__ctx x = {p, m.scale_s, m.M, tmin, 0, 0};
            stage_rc = sched__roles_choose(&x, crelax, on, h, &net);
            it += x.iters;
        }
        out->roles_ms = now_ms() - t_roles;
        iters = it;
    }
    glp_error_hook(NULL, NULL);
    glp_term_hook(NULL, NULL);
    /* GLPK keeps one environment per thread; the coordinator solves on its
     * HTTP worker threads, so release it (every problem is deleted by now)
     * rather than leak it when a worker thread ends. */
    glp_free_env();
    pthread_mutex_unlock(&g_glpk_mu);
    out->iterations = iters;
    rc = stage_rc;
    if (rc != CM_OK) {
        sched__seterr(err, cap, "the LP solver failed: %s", cm_strerror(rc));
        goto done;
    }

    /* Roles, rates and the fractions of (6). */
    out->n = n;
    size_t nrecv = 0, ncomp = 0;
    double compute = 0, hsum = 0, fsum = 0, fmaxv = 0;
    for (size_t i = 0; i < n; i++) {
        nrecv += p->peers[i].samples_per_s > 0;
        ncomp += on[i] != 0;
        hsum += h[i];
        if (on[i])
            compute += m.scale_s[i];
    }
    for (size_t i = 0; i < n; i++) {
        struct sched_peer_plan *pl = &out->peers[i];
        int recv_i = p->peers[i].samples_per_s > 0;
        pl->c = crelax[i];
        pl->compute = on[i] != 0;
        pl->agg_mbps = h[i] * G;
        pl->recv_mbps = recv_i ? hsum * G : 0;
        /* a computing sender sends h_j to every other aggregator j; aggregator i returns
         * h_i to every other receiver */
        pl->up_used_mbps =
            ((on[i] ? hsum - h[i] : 0) + h[i] * (double)(nrecv - (size_t)recv_i)) * G;
        pl->down_used_mbps =
            (h[i] * (double)(ncomp - (on[i] != 0)) + (recv_i ? hsum - h[i] : 0)) * G;
        /* (6): h_i = min_j g_ij, the rate at which aggregator i returns its part to every
         * receiver */
        pl->fraction = h[i];
        fmaxv = fmax(fmaxv, h[i]);
    }
    for (size_t q = 0; q < n; q++) { /* a relay's link also carries what it relays */
        if (!p->peers[q].relay)
            continue;
        double cH, cR, cq;
        sched__relay_coefs(p, on, ncomp, nrecv, q, &cH, &cR, &cq);
        double tq = fmax(0, cH * hsum + cR * h[p->peers[q].relay - 1] + cq * h[q]) * G *
                    (1 - p->peers[q].relay_direct);
        out->peers[p->peers[q].relay - 1].up_used_mbps += tq;
        out->peers[p->peers[q].relay - 1].down_used_mbps += tq;
    }
    for (size_t i = 0; i < n; i++) {
        /* Solver noise (values within the tolerances of a zero) is not a part. */
        if (out->peers[i].fraction < 1e-6 * fmaxv)
            out->peers[i].fraction = 0;
        fsum += out->peers[i].fraction;
    }
    if (!(fsum > 0)) {
        rc = CM_ESTATE;
        sched__seterr(err, cap, "the optimum averages nothing: no aggregator can reach every peer");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        out->peers[i].fraction /= fsum;
    shares_round(out->peers, n);
    out->compute_rate = compute;
    out->network_rate = hsum;
    out->steps_per_s = fmin(compute, hsum);
    out->solve_ms = now_ms() - t0;

done:
    if (rc != CM_OK) {
        free(out->peers);
        out->peers = NULL;
        out->n = 0;
    }
    free(crelax);
    free(h);
    free(on);
    free(m.c);
    free(m.M);
    free(m.h);
    free(m.a);
    free(m.scale_s);
    free(tmin);
    return rc;
}

void sched_solution_cleanup(struct sched_solution *s)
{
    if (!s)
        return;
    free(s->peers);
    s->peers = NULL;
    s->n = 0;
}
