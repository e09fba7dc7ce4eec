/* Who computes: binary roles for the adaptive-averaging plan (seed
 * 000_02cc6b5d62a616fc.txt, §3.2 problem (1), Appendix B).
 *
 * The relaxation 0 <= c_i <= 1 of Appendix B is not exact: a fractional c_k
 * buys (1 - c_k) M_i of slack in every constraint (4) of peer k, so the
 * optimum of (5) can have several c_k strictly between 0 and 1 and say
 * little about which peers should compute (it may relax a fast peer instead
 * of a slow one, or leave every c_k at 0.96 — nobody computing, as roles).
 * Roles are therefore chosen among binary assignments, each scored exactly.
 *
 * Scoring fixed roles is a small LP. With c fixed, a computing peer k sends
 * to aggregator i at a_ki >= h_i, and sending faster than h_i only uses
 * bandwidth, so a_ki = h_i (and 0 for peers that do not compute) loses
 * nothing. What is left has one column per aggregator:
 *
 *   max H = sum_i h_i
 *   download_i: (computing peers other than i) h_i + [s_i > 0] (H - h_i) <= d_i
 *   upload_i:   [i computes] (H - h_i) + (receivers other than i) h_i <= u_i
 *   link (i,j): [i computes] h_j + [s_j > 0] h_i <= t_ij
 *   0 <= h_i <= M_i
 *   (+ T_q in both rows of the relay of each relayed peer q:
 *    sched__relay_coefs)
 *
 * and the roles' throughput is min(sum_{computing} s / B, sum_i h_i). The
 * unit test checks this value against the full O(n^3) model with the same c
 * fixed, solved by an independent simplex.
 *
 * Search: up to EXACT_ROLES capable peers, every assignment; beyond that,
 * every capable peer computing, the relaxation's c rounded up and down, the
 * k fastest uploaders for k on a geometric grid (a slow sender holds every
 * aggregator back, and two equally slow ones cannot be dropped by single
 * flips), then single-peer flips while they help. Candidates are tried from
 * more computing peers to fewer, and only a strict improvement replaces the
 * best, so ties keep more peers computing. Deterministic throughout. */
#include "sched/sched_internal.h"

#include <glpk.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

#define EXACT_ROLES 8    /* up to this many capable peers: every assignment */
#define LOCAL_PASSES 2   /* passes of single-peer flips */
#define C_ONE 1e-6       /* c_i >= 1 - C_ONE counts as computing */
#define BETTER 1e-9      /* relative improvement that counts */

/* Among the plans of the highest network rate, the one that aggregates least
 * on peers with slow links. The optimum of max sum h_i is often a face, not
 * a point: with measured pair rates, plans where the slow peers aggregate
 * 0 % or 60 % can have the same sum h_i, and GLPK returns whichever vertex
 * its pivots reach first. The model counts rates only; a real round also
 * pays each aggregator's pipeline fill and drain (a chunk must arrive from
 * every sender before its average goes back), which takes n chunk times on
 * its link: negligible on a fast link, a large part of the round on a slow
 * one (tests/integ/test_schedule_follow.c measured rounds at 1.3-1.7x the
 * prediction on such vertices, 1.04x on the one without them). So a second
 * stage keeps sum h_i at its optimum and minimizes sum_i h_i / cap_i, cap_i
 * being the slowest of i's upload, download and measured pairs: a strict
 * preference for fast aggregators that leaves a unique optimum (homogeneous
 * peers' even split) as it is. Warm-started from the first stage's basis. */
/* fatal: a failure loses the plan (logged as an error); otherwise the
 * caller keeps the previous stage's plan (a warning). */
static int simplex_warm(struct sched__ctx *x, glp_prob *lp, const char *what, int fatal)
{
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.meth = GLP_PRIMAL;
    parm.presolve = GLP_OFF;
    int before = glp_get_it_cnt(lp);
    int rc = glp_simplex(lp, &parm);
    if (rc == GLP_EBADB || rc == GLP_ESING || rc == GLP_ECOND) {
        glp_std_basis(lp);
        rc = glp_simplex(lp, &parm);
    }
    x->iters += glp_get_it_cnt(lp) - before;
    if (rc != 0 || glp_get_status(lp) != GLP_OPT) {
        if (fatal)
            CM_LOGE("sched", "GLPK: %s LP failed (code %d, status %d)", what, rc, glp_get_status(lp));
        else
            CM_LOGW("sched", "GLPK: %s LP failed (code %d, status %d); keeping the previous stage's plan",
                    what, rc, glp_get_status(lp));
        return CM_EINTERNAL;
    }
    return CM_OK;
}

static void read_h(const struct sched_problem *p, glp_prob *lp, const int *col, double *h)
{
    for (size_t i = 0; i < p->n; i++)
        h[i] = col[i] ? fmax(0, glp_get_col_prim(lp, col[i])) : 0;
}

/* Fills h with the plan: the third stage's, or the second's when the third
 * fails (it only refines a tie, so a plan of the best rate is never lost). */
static int tie_break(struct sched__ctx *x, glp_prob *lp, const int *col, int H, double net,
                     const unsigned char *on, double *h)
{
    const struct sched_problem *p = x->p;
    size_t n = p->n;
    double capmax = 0;
    for (size_t i = 0; i < n; i++)
        capmax = fmax(capmax, fmax(p->peers[i].up_mbps, p->peers[i].down_mbps));
    glp_set_col_bnds(lp, H, GLP_LO, net, 0); /* no loss at all, not even a tolerance's */
    glp_set_obj_coef(lp, H, 0);
    for (size_t i = 0; i < n; i++) {
        if (!col[i])
            continue;
        double cap = fmin(p->peers[i].up_mbps, p->peers[i].down_mbps);
        glp_set_obj_coef(lp, col[i], capmax / cap);
    }
    glp_set_obj_dir(lp, GLP_MIN);
    int rc = simplex_warm(x, lp, "tie-break", 1);
    if (rc != CM_OK)
        return rc;
    read_h(p, lp, col, h);
    /* Third stage: the second often leaves a face too, among aggregators
       of equal links (setup C of Table 1: eight 1 Gbit/s peers, and GLPK's
       vertex gave five of them 18 % and one 9 %, running their uploads at
       99 % of capacity while two idled). Keeping both optima, minimize the
       largest share of a link the aggregation takes: z >= (load of h_i on
       the link) / capacity for each aggregator's upload and download. Equal
       peers then get equal parts, and every link keeps what slack the plan
       allows, which is what absorbs a real round's uneven pace. */
    double v2 = glp_get_obj_val(lp);
    size_t ncomp = 0, nrecv = 0, nagg = 0;
    for (size_t i = 0; i < n; i++) {
        ncomp += on[i] != 0;
        nrecv += p->peers[i].samples_per_s > 0;
        nagg += col[i] != 0;
    }
    if (nagg < 2)
        return CM_OK;
    double *h2 = malloc(n * sizeof *h2);
    if (!h2)
        return CM_OK; /* keep the second stage's plan */
    memcpy(h2, h, n * sizeof *h2);
    int z = glp_add_cols(lp, 1);
    glp_set_col_bnds(lp, z, GLP_LO, 0, 0);
    int *ind = malloc((n + 2) * sizeof *ind);
    double *val = malloc((n + 2) * sizeof *val);
    if (!ind || !val) {
        free(ind);
        free(val);
        free(h2);
        return CM_OK;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!col[i])
            continue;
        double cap = fmin(p->peers[i].up_mbps, p->peers[i].down_mbps);
        k++;
        ind[k] = col[i];
        val[k] = capmax / cap;
        glp_set_obj_coef(lp, col[i], 0);
    }
    int r = glp_add_rows(lp, 1);
    glp_set_mat_row(lp, r, k, ind, val);
    glp_set_row_bnds(lp, r, GLP_UP, 0, v2 + 1e-9 * fabs(v2) + 1e-12);
    const double G = p->gradient_mbit;
    for (size_t i = 0; i < n; i++) {
        if (!col[i])
            continue;
        int recv_i = p->peers[i].samples_per_s > 0, on_i = on[i] != 0;
        double coef[2] = {(double)ncomp - on_i - recv_i, (double)nrecv - recv_i - on_i};
        double cap[2] = {p->peers[i].down_mbps / G, p->peers[i].up_mbps / G};
        for (int d = 0; d < 2; d++) {
            if (!(coef[d] > 0))
                continue;
            ind[1] = col[i];
            val[1] = coef[d] / cap[d];
            ind[2] = z;
            val[2] = -1;
            r = glp_add_rows(lp, 1);
            glp_set_mat_row(lp, r, 2, ind, val);
            glp_set_row_bnds(lp, r, GLP_UP, 0, 0);
        }
    }
    free(ind);
    free(val);
    glp_set_obj_coef(lp, z, 1);
    if (simplex_warm(x, lp, "balancing", 0) == CM_OK) {
        read_h(p, lp, col, h);
        /* the plan must still reach the rate: a stage that lost it (it
           cannot, up to GLPK's tolerances) is not taken */
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += h[i];
        if (!(sum >= net * (1 - 1e-7)))
            memcpy(h, h2, n * sizeof *h);
    } else {
        memcpy(h, h2, n * sizeof *h);
    }
    free(h2);
    return CM_OK;
}

int sched__roles_eval(struct sched__ctx *x, const unsigned char *on, double *h, double *net)
{
    const struct sched_problem *p = x->p;
    size_t n = p->n, ncomp = 0, nrecv = 0, nagg = 0;
    for (size_t i = 0; i < n; i++) {
        ncomp += on[i] != 0;
        nrecv += p->peers[i].samples_per_s > 0;
        nagg += p->peers[i].inbound != 0;
    }
    int *col = calloc(2 * n, sizeof *col), *T = col ? col + n : NULL; /* T: relayed peers' traffic */
    uint32_t *rl = calloc(2 * n, sizeof *rl); /* who each peer relays for */
    /* rows: H, 2 per peer, measured pairs; at most 2 entries each except H's;
       a relayed peer's row (4) and its entries in its relay's rows (2) */
    size_t cap = (nagg + 1) + 4 * n + 2 * n * SCHED_MAX_LINKS + 6 * n + 1;
    int *ia = malloc((cap + 1) * sizeof *ia), *ja = malloc((cap + 1) * sizeof *ja);
    double *ar = malloc((cap + 1) * sizeof *ar);
    if (!col || !ia || !ja || !ar || !rl) {
        free(col);
        free(ia);
        free(ja);
        free(ar);
        free(rl);
        return CM_ENOMEM;
    }
    sched__relay_lists(p, rl, rl + n);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!p->peers[i].inbound)
            continue;
        col[i] = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, col[i], GLP_DB, 0, x->M[i]);
    }
    /* H = sum_i h_i, so that "every receiver downloads every other part" is two
     * entries per row instead of n. */
    int H = glp_add_cols(lp, 1);
    glp_set_col_bnds(lp, H, GLP_LO, 0, 0);
    glp_set_obj_coef(lp, H, 1);
    size_t nz = 0;
#define PUT(row, c, v) (nz++, ia[nz] = (row), ja[nz] = (c), ar[nz] = (v))
    int row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
    PUT(row, H, 1);
    for (size_t i = 0; i < n; i++)
        if (col[i])
            PUT(row, col[i], -1);
    /* T_q - cH H - cR h_R - cq h_q = 0 for each relayed peer q */
    for (size_t q = 0; q < n; q++) {
        if (!p->peers[q].relay || p->peers[q].relay_direct >= 1)
            continue;
        double cH, cR, cq;
        sched__relay_coefs(p, on, ncomp, nrecv, q, &cH, &cR, &cq);
        T[q] = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, T[q], GLP_LO, 0, 0);
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
        PUT(row, T[q], 1);
        if (cH != 0)
            PUT(row, H, -cH);
        if (cR != 0)
            PUT(row, col[p->peers[q].relay - 1], -cR);
        if (col[q] && cq != 0)
            PUT(row, col[q], -cq);
    }
    for (size_t i = 0; i < n; i++) {
        int recv_i = p->peers[i].samples_per_s > 0, on_i = on[i] != 0;
        const double G = p->gradient_mbit;
        /* download: (ncomp - on_i) h_i + recv_i (H - h_i) */
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, p->peers[i].down_mbps / G);
        if (col[i] && (double)ncomp - on_i - recv_i != 0)
            PUT(row, col[i], (double)ncomp - on_i - recv_i);
        if (recv_i)
            PUT(row, H, 1);
        for (uint32_t k = rl[i]; k; k = rl[n + k - 1]) /* a relay: + the traffic it relays */
            if (T[k - 1])
                PUT(row, T[k - 1], 1 - p->peers[k - 1].relay_direct);
        /* upload: on_i (H - h_i) + (nrecv - recv_i) h_i */
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, p->peers[i].up_mbps / G);
        if (col[i] && (double)nrecv - recv_i - on_i != 0)
            PUT(row, col[i], (double)nrecv - recv_i - on_i);
        if (on_i)
            PUT(row, H, 1);
        for (uint32_t k = rl[i]; k; k = rl[n + k - 1])
            if (T[k - 1])
                PUT(row, T[k - 1], 1 - p->peers[k - 1].relay_direct);
        for (size_t j = 0; j < n; j++) {
            double t = x->tmin[i * n + j];
            int send = on_i && col[j], ret = col[i] && p->peers[j].samples_per_s > 0;
            if (!isfinite(t) || (!send && !ret))
                continue;
            row = glp_add_rows(lp, 1);
            glp_set_row_bnds(lp, row, GLP_UP, 0, t);
            if (send)
                PUT(row, col[j], 1);
            if (ret)
                PUT(row, col[i], 1);
        }
    }
#undef PUT
    glp_load_matrix(lp, (int)nz, ia, ja, ar);
    free(rl);
    free(ia);
    free(ja);
    free(ar);
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.meth = GLP_PRIMAL;
    parm.presolve = GLP_ON;
    int rc = glp_simplex(lp, &parm);
    x->iters += glp_get_it_cnt(lp);
    x->evals++;
    if (rc != 0 || glp_get_status(lp) != GLP_OPT) {
        CM_LOGE("sched", "GLPK: fixed-role LP failed (code %d, status %d)", rc,
                glp_get_status(lp));
        glp_delete_prob(lp);
        free(col);
        return CM_EINTERNAL;
    }
    *net = glp_get_obj_val(lp);
    if (h && *net > 0) {
        if ((rc = tie_break(x, lp, col, H, *net, on, h)) != CM_OK) {
            glp_delete_prob(lp);
            free(col);
            return rc;
        }
    } else if (h) {
        read_h(p, lp, col, h);
    }
    glp_delete_prob(lp);
    free(col);
    return CM_OK;
}

/* The same LP for a sequence of role assignments, warm-started: one GLPK
 * problem whose rows are rewritten for each candidate, re-solved from the
 * previous basis without the presolver. The role search evaluates hundreds
 * of candidates that differ in one or a few peers; a cold build + presolve
 * each costs ~0.7 ms at 256 peers, a warm re-solve a fraction of that. Only
 * the optimum value is used (to compare candidates); the plan of the winner
 * comes from a cold sched__roles_eval, so it does not depend on the path the
 * search took. tests/unit/sched/test_sched_lp.c checks warm against cold. */
struct sched__warm {
    struct sched__ctx *x;
    glp_prob *lp;
    int *col;        /* [n] column of h_i, 0 when i cannot aggregate */
    int H;           /* column of H = sum h */
    int *row_dl;     /* [n] download rows */
    int *row_ul;     /* [n] upload rows */
    int *link_row;   /* [nl] link rows */
    uint32_t *link_i, *link_j; /* [nl] the pair of each link row */
    size_t nl;
    int *T, *row_t;  /* [n] relayed peers' traffic: column and defining row, 0: none */
    uint32_t *rl;    /* [2n] who each peer relays for (sched__relay_lists) */
    int *ind;        /* [n + 4] a row being written (1-based) */
    double *val;
};

void sched__warm_free(struct sched__warm *w)
{
    if (!w)
        return;
    if (w->lp)
        glp_delete_prob(w->lp);
    free(w->col);
    free(w->row_dl);
    free(w->row_ul);
    free(w->link_row);
    free(w->link_i);
    free(w->link_j);
    free(w->T);
    free(w->row_t);
    free(w->rl);
    free(w->ind);
    free(w->val);
    free(w);
}

int sched__warm_new(struct sched__ctx *x, struct sched__warm **out)
{
    const struct sched_problem *p = x->p;
    size_t n = p->n, nl = 0;
    *out = NULL;
    for (size_t i = 0; i < n * n; i++)
        nl += isfinite(x->tmin[i]);
    struct sched__warm *w = calloc(1, sizeof *w);
    if (!w)
        return CM_ENOMEM;
    w->x = x;
    w->col = calloc(n, sizeof *w->col);
    w->row_dl = calloc(n, sizeof *w->row_dl);
    w->row_ul = calloc(n, sizeof *w->row_ul);
    w->link_row = calloc(nl + 1, sizeof *w->link_row);
    w->link_i = calloc(nl + 1, sizeof *w->link_i);
    w->link_j = calloc(nl + 1, sizeof *w->link_j);
    w->T = calloc(n, sizeof *w->T);
    w->row_t = calloc(n, sizeof *w->row_t);
    w->rl = calloc(2 * n, sizeof *w->rl);
    w->ind = calloc(n + 5, sizeof *w->ind);
    w->val = calloc(n + 5, sizeof *w->val);
    int *ind = calloc(n + 2, sizeof *ind);
    double *val = calloc(n + 2, sizeof *val);
    if (!w->col || !w->row_dl || !w->row_ul || !w->link_row || !w->link_i || !w->link_j || !ind ||
        !val || !w->T || !w->row_t || !w->ind || !w->val || !w->rl) {
        free(ind);
        free(val);
        sched__warm_free(w);
        return CM_ENOMEM;
    }
    const double G = p->gradient_mbit;
    w->lp = glp_create_prob();
    glp_set_obj_dir(w->lp, GLP_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!p->peers[i].inbound)
            continue;
        w->col[i] = glp_add_cols(w->lp, 1);
        glp_set_col_bnds(w->lp, w->col[i], GLP_DB, 0, x->M[i]);
    }
    w->H = glp_add_cols(w->lp, 1);
    glp_set_col_bnds(w->lp, w->H, GLP_LO, 0, 0);
    glp_set_obj_coef(w->lp, w->H, 1);
    int row = glp_add_rows(w->lp, 1), len = 0;
    glp_set_row_bnds(w->lp, row, GLP_FX, 0, 0);
    ind[++len] = w->H;
    val[len] = 1;
    for (size_t i = 0; i < n; i++)
        if (w->col[i]) {
            ind[++len] = w->col[i];
            val[len] = -1;
        }
    glp_set_mat_row(w->lp, row, len, ind, val);
    free(ind);
    free(val);
    sched__relay_lists(p, w->rl, w->rl + n);
    for (size_t q = 0; q < n; q++) { /* written per candidate (sched__warm_eval) */
        if (!p->peers[q].relay || p->peers[q].relay_direct >= 1)
            continue;
        w->T[q] = glp_add_cols(w->lp, 1);
        glp_set_col_bnds(w->lp, w->T[q], GLP_LO, 0, 0);
        w->row_t[q] = glp_add_rows(w->lp, 1);
        glp_set_row_bnds(w->lp, w->row_t[q], GLP_FX, 0, 0);
    }
    for (size_t i = 0; i < n; i++) {
        w->row_dl[i] = glp_add_rows(w->lp, 1);
        glp_set_row_bnds(w->lp, w->row_dl[i], GLP_UP, 0, p->peers[i].down_mbps / G);
        w->row_ul[i] = glp_add_rows(w->lp, 1);
        glp_set_row_bnds(w->lp, w->row_ul[i], GLP_UP, 0, p->peers[i].up_mbps / G);
        for (size_t j = 0; j < n; j++) {
            double t = x->tmin[i * n + j];
            if (!isfinite(t))
                continue;
            /* used when i sends to aggregator j or aggregator i returns to j */
            if (!((p->peers[i].samples_per_s > 0 && w->col[j]) ||
                  (w->col[i] && p->peers[j].samples_per_s > 0)))
                continue;
            w->link_row[w->nl] = glp_add_rows(w->lp, 1);
            glp_set_row_bnds(w->lp, w->link_row[w->nl], GLP_UP, 0, t);
            w->link_i[w->nl] = (uint32_t)i;
            w->link_j[w->nl] = (uint32_t)j;
            w->nl++;
        }
    }
    *out = w;
    return CM_OK;
}

/* Two-entry rows; entries with a zero coefficient are left out. A peer's
 * download or upload row (relay_of: 1 + the peer) also gets the traffic of
 * every peer it relays for. */
static void warm_row(struct sched__warm *w, int row, int c1, double v1, int c2, double v2, size_t relay_of)
{
    const struct sched_problem *p = w->x->p;
    int len = 0;
    if (c1 && v1 != 0) {
        w->ind[++len] = c1;
        w->val[len] = v1;
    }
    if (c2 && v2 != 0) {
        w->ind[++len] = c2;
        w->val[len] = v2;
    }
    for (uint32_t k = relay_of ? w->rl[relay_of - 1] : 0; k; k = w->rl[p->n + k - 1])
        if (w->T[k - 1]) {
            w->ind[++len] = w->T[k - 1];
            w->val[len] = 1 - p->peers[k - 1].relay_direct;
        }
    glp_set_mat_row(w->lp, row, len, w->ind, w->val);
}

int sched__warm_eval(struct sched__warm *w, const unsigned char *on, double *net)
{
    struct sched__ctx *x = w->x;
    const struct sched_problem *p = x->p;
    size_t n = p->n, ncomp = 0, nrecv = 0;
    for (size_t i = 0; i < n; i++) {
        ncomp += on[i] != 0;
        nrecv += p->peers[i].samples_per_s > 0;
    }
    /* The rows of sched__roles_eval for these roles. */
    for (size_t i = 0; i < n; i++) {
        int recv_i = p->peers[i].samples_per_s > 0, on_i = on[i] != 0;
        warm_row(w, w->row_dl[i], w->col[i], (double)ncomp - on_i - recv_i, w->H, recv_i, i + 1);
        warm_row(w, w->row_ul[i], w->col[i], (double)nrecv - recv_i - on_i, w->H, on_i, i + 1);
    }
    for (size_t q = 0; q < n; q++) {
        if (!w->T[q])
            continue;
        double cH, cR, cq;
        sched__relay_coefs(p, on, ncomp, nrecv, q, &cH, &cR, &cq);
        int len = 0, cols[3] = {w->H, w->col[p->peers[q].relay - 1], w->col[q]};
        double vals[3] = {-cH, -cR, -cq};
        w->ind[++len] = w->T[q];
        w->val[len] = 1;
        for (int k = 0; k < 3; k++)
            if (cols[k] && vals[k] != 0) {
                w->ind[++len] = cols[k];
                w->val[len] = vals[k];
            }
        glp_set_mat_row(w->lp, w->row_t[q], len, w->ind, w->val);
    }
    for (size_t l = 0; l < w->nl; l++) {
        size_t i = w->link_i[l], j = w->link_j[l];
        int send = on[i] && w->col[j], ret = w->col[i] && p->peers[j].samples_per_s > 0;
        warm_row(w, w->link_row[l], w->col[j], send, w->col[i], ret, 0);
    }
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.meth = GLP_PRIMAL;
    parm.presolve = GLP_OFF;
    int before = glp_get_it_cnt(w->lp);
    int rc = glp_simplex(w->lp, &parm);
    if (rc == GLP_EBADB || rc == GLP_ESING || rc == GLP_ECOND) {
        /* the previous basis does not fit the new rows: start from the slacks */
        glp_std_basis(w->lp);
        rc = glp_simplex(w->lp, &parm);
    }
    x->iters += glp_get_it_cnt(w->lp) - before;
    x->evals++;
    if (rc != 0 || glp_get_status(w->lp) != GLP_OPT) {
        CM_LOGE("sched", "GLPK: fixed-role LP (warm) failed (code %d, status %d)", rc,
                glp_get_status(w->lp));
        return CM_EINTERNAL;
    }
    *net = glp_get_obj_val(w->lp);
    return CM_OK;
}

struct search {
    struct sched__ctx *x;
    struct sched__warm *w;
    size_t n;
    unsigned char *best, *tmp;
    double best_tp, best_net, best_compute;
    int pruned; /* candidates skipped because they cannot beat the best */
};

static int try_roles(struct search *s, const unsigned char *on)
{
    double compute = 0;
    for (size_t i = 0; i < s->n; i++)
        if (on[i])
            compute += s->x->scale_s[i];
    if (!(compute > 0))
        return CM_OK;
    if (compute <= s->best_tp * (1 + BETTER)) {
        s->pruned++;
        return CM_OK; /* cannot beat the best whatever the network does */
    }
    /* Another computing peer only tightens rows (aggregators download one more
     * contribution, it uploads its gradient, its links carry it), so the network
     * rate of a superset of the best's computing peers is at most the best's: when
     * the best is network-bound, no superset can beat it. */
    if (s->best_tp >= 0 && s->best_net <= s->best_compute) {
        size_t i = 0;
        while (i < s->n && (!s->best[i] || on[i]))
            i++;
        if (i == s->n) {
            s->pruned++;
            return CM_OK;
        }
    }
    double net = 0;
    int rc = sched__warm_eval(s->w, on, &net);
    if (rc != CM_OK)
        return rc;
    double tp = fmin(compute, net);
    double need = BETTER;
    if (s->x->p->role_gain > 0 && s->best_tp >= 0) {
        size_t k = 0, kb = 0;
        for (size_t i = 0; i < s->n; i++) {
            k += on[i] != 0;
            kb += s->best[i] != 0;
        }
        if (k < kb)
            need = fmax(need, s->x->p->role_gain);
    }
    if (tp > s->best_tp * (1 + need) + 1e-300) {
        s->best_tp = tp;
        s->best_net = net;
        s->best_compute = compute;
        if (s->best != on)
            memcpy(s->best, on, s->n);
    }
    return CM_OK;
}

static const struct sched_problem *g_sort_p; /* only under sched_lp.c's GLPK mutex */
static int by_upload_desc(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    double ui = g_sort_p->peers[i].up_mbps, uj = g_sort_p->peers[j].up_mbps;
    if (ui != uj)
        return ui > uj ? -1 : 1;
    return i < j ? -1 : 1;
}

int sched__roles_choose(struct sched__ctx *x, const double *c, unsigned char *on_out,
                        double *h_out, double *net_out)
{
    const struct sched_problem *p = x->p;
    size_t n = p->n, nc = 0;
    struct search s = {x, NULL, n, calloc(n, 1), calloc(n, 1), -1, 0, 0, 0};
    size_t *order = calloc(n, sizeof *order);
    int rc = CM_OK;
    if (!s.best || !s.tmp || !order) {
        rc = CM_ENOMEM;
        goto out;
    }
    if ((rc = sched__warm_new(x, &s.w)) != CM_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (p->peers[i].samples_per_s > 0)
            order[nc++] = i;
    g_sort_p = p;
    qsort(order, nc, sizeof *order, by_upload_desc);
    if (p->all_compute) {
        for (size_t k = 0; k < nc; k++)
            s.tmp[order[k]] = 1;
        rc = try_roles(&s, s.tmp);
        goto finish;
    }
    if (nc <= EXACT_ROLES) {
        /* Masks from all-on downwards, so ties keep the first (more peers computing). */
        for (unsigned mask = (1u << nc) - 1; mask > 0 && rc == CM_OK; mask--) {
            memset(s.tmp, 0, n);
            for (size_t k = 0; k < nc; k++)
                s.tmp[order[k]] = (unsigned char)((mask >> (nc - 1 - k)) & 1);
            rc = try_roles(&s, s.tmp);
        }
        goto finish;
    }
    memset(s.tmp, 0, n);
    for (size_t k = 0; k < nc; k++)
        s.tmp[order[k]] = 1;
    if ((rc = try_roles(&s, s.tmp)) != CM_OK)
        goto out;
    for (int up = 1; up >= 0; up--) {
        for (size_t i = 0; i < n; i++)
            s.tmp[i] = p->peers[i].samples_per_s > 0 && (up ? c[i] > C_ONE : c[i] >= 1 - C_ONE);
        if ((rc = try_roles(&s, s.tmp)) != CM_OK)
            goto out;
    }
    for (size_t k = nc - nc / 8; k >= 1; k = k > 1 ? (k * 3) / 4 : 0) {
        memset(s.tmp, 0, n);
        for (size_t j = 0; j < k; j++)
            s.tmp[order[j]] = 1;
        if ((rc = try_roles(&s, s.tmp)) != CM_OK)
            goto out;
    }
    for (int pass = 0, improved = 1; improved && pass < LOCAL_PASSES; pass++) {
        improved = 0;
        for (size_t k = 0; k < nc; k++) {
            memcpy(s.tmp, s.best, n);
            s.tmp[order[k]] ^= 1;
            double before = s.best_tp;
            if ((rc = try_roles(&s, s.tmp)) != CM_OK)
                goto out;
            improved |= s.best_tp > before;
        }
    }
finish:
    if (rc == CM_OK && s.best_tp < 0)
        rc = CM_ESTATE; /* no assignment with a computing peer: excluded by validation */
    if (rc == CM_OK) {
        memcpy(on_out, s.best, n);
        rc = sched__roles_eval(x, s.best, h_out, net_out);
    }
out:
    sched__warm_free(s.w);
    free(s.best);
    free(s.tmp);
    free(order);
    return rc;
}
