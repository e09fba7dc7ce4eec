/* Internal interface between the parts of common/sched/: the LP of
 * sched_lp.c hands the role search of sched_roles.c what both need. Not for
 * use outside common/sched/. */
#ifndef SCHED_INTERNAL_H
#define SCHED_INTERNAL_H

#include <stddef.h>

#include "sched/sched.h"

/* All rates are divided by the gradient size G (steps per second). */
struct sched__ctx {
    const struct sched_problem *p;
    const double *scale_s; /* [n] s_i / B */
    const double *M;       /* [n] upper bound of h_i (aggregators) */
    const double *tmin;    /* [n*n] smallest measured t_ij / G, INFINITY when unmeasured */
    int iters;             /* simplex iterations, accumulated */
    int evals;             /* fixed-role LPs solved */
};

/* Throughput-maximal plan for fixed roles (on[i]: peer i computes): the
 * network rate sum h_i and, when h is non-NULL, each aggregator's h_i.
 * Must run inside sched_solve's GLPK error hook. */
int sched__roles_eval(struct sched__ctx *x, const unsigned char *on, double *h, double *net);

/* The same value as sched__roles_eval, for a sequence of role assignments
 * re-solved warm from the previous basis (the role search). Must run inside
 * sched_solve's GLPK error hook. */
struct sched__warm;
int sched__warm_new(struct sched__ctx *x, struct sched__warm **out);
int sched__warm_eval(struct sched__warm *w, const unsigned char *on, double *net);
void sched__warm_free(struct sched__warm *w);

/* Picks binary roles from the relaxation's c (see sched_roles.c); fills
 * on_out, h_out (the plan for those roles) and *net_out. */
int sched__roles_choose(struct sched__ctx *x, const double *c_relaxed, unsigned char *on_out,
                        double *h_out, double *net_out);

#endif
