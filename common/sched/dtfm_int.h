/* What dtfm_cost.c and dtfm_search.c share (not for other callers). */
#ifndef DTFM_INT_H
#define DTFM_INT_H

#include "sched/dtfm.h"

struct dtfm_model {
    size_t n, stages, replicas;
    double *dp;    /* n x n: 2 (alpha + c_DP / (D_DP beta)), eq. 2's term */
    double *pp;    /* n x n: 2 (alpha + c_PP / beta), eq. 3's term */
    double *work;  /* stages entries, or NULL */
    double *speed; /* n entries, or NULL */
    size_t mb;     /* micro-batches M >= 1 */
    double *pp_mb; /* n x n when mb > 1: alpha + c_PP / (M beta), one micro-batch one way */
    double *tied;  /* n x n when tied_bytes > 0 and stages > 1: 2 (alpha + c_tied / beta) */
    double *alpha; /* n x n when norm_exchange and stages > 1: the pair's one-way delay */
};

/* Eq. 2 for one group of `replicas` devices. */
double dtfm_dp_group(const struct dtfm_model *m, const uint32_t *members);
/* Eq. 3 between two groups of `replicas` devices; with match != NULL,
 * match[k] = the index in b matched with a[k]. */
double dtfm_bottleneck(const struct dtfm_model *m, const uint32_t *a, const uint32_t *b,
                       uint32_t *match);
/* Eq. 4: the cheapest open path through all s nodes of the symmetric s x s
 * weights w; order receives the nodes in path order. */
double dtfm_tsp_open(const double *w, size_t s, uint32_t *order);
/* The compute term for groups (members[g * replicas + k]) in path order
 * `order` (either direction: the cheaper one is used and order reversed
 * to it). 0 without work and speeds. */
double dtfm_compute_term(const struct dtfm_model *m, const uint32_t *members, uint32_t *order);
/* members[g * replicas + k]: the devices of each group in increasing order. */
void dtfm_members(const struct dtfm_model *m, const uint16_t *group, uint32_t *members);

#endif
