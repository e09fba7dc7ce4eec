/* A decentralized mixture-of-experts classifier (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.1-3.3) and the interface through which it
 * reaches its experts.
 *
 *   x (B,in) -> trunk [Linear -> ReLU] x ntrunk -> h (B,C)
 *            -> DMoE layer: scores s (B,d,M) = gating heads g_0..g_{d-1}(h),
 *               top-k experts per sample by g(h,f) = sum_i s[i][u_i],
 *               z (B,C) = sum over the experts that ANSWERED of
 *                         softmax(g over those experts) * E_f(h)
 *            -> head Linear C -> classes -> softmax cross-entropy.
 *
 * The model's flat params/grads hold only the trunk, the gating heads and
 * the head: what trainers own and average with each other. The experts live
 * behind struct kern_dmoe_experts, which a trainer fills with an
 * implementation: kern_dmoe_local (below: every expert of the grid in this
 * process, for `train --local` and tests) or, later, one that finds experts
 * by beam search over the DHT and calls them over the network.
 *
 * Failure (seed 002 §3.1 "Fault tolerance", §3.2): an expert that does not
 * answer, or answers with a non-finite number, is left out of the mixture
 * and the gate's softmax is renormalised over the experts that did answer.
 * A sample none of whose experts answered passes h through unchanged (the
 * experts are residual blocks y = h + f(h), so this is the empty mixture)
 * and gives the gate no gradient. */
#ifndef KERN_DMOE_H
#define KERN_DMOE_H

#include <stddef.h>
#include <stdint.h>

#include "kern_backend.h"
#include "kern_model.h"
#include "kern_optim.h"

#define KERN_DMOE_MAX_TRUNK 4
#define KERN_DMOE_MAX_D 8   /* grid dimensions */
#define KERN_DMOE_MAX_K 64  /* experts per sample */

struct kern_dmoe_config {
    int in_dim;
    int ntrunk;                        /* 1..KERN_DMOE_MAX_TRUNK */
    int trunk[KERN_DMOE_MAX_TRUNK];    /* widths; C = trunk[ntrunk-1] */
    int grid_d;                        /* d: 1..KERN_DMOE_MAX_D */
    int grid_m;                        /* M: 2..65536; M^d < 2^62 */
    int k;                             /* experts per sample: 1..KERN_DMOE_MAX_K */
    int nclass;
};

/* The routing table of one batch, built by the model from select's choice:
 * the distinct experts of the batch and, for each, the rows routed to it,
 * so an implementation makes ONE call per expert per batch (never one per
 * sample) and may make all of them at once. Rows are stored grouped by
 * expert: expert e owns rows start[e] .. start[e+1]-1 of every (nrows, C)
 * buffer passed with the table. All pointers are borrowed for the call. */
struct kern_dmoe_route {
    int B, k, d, C;
    int nexp;           /* distinct experts chosen for the batch */
    int nrows;          /* start[nexp]: (sample, slot) pairs routed */
    const int *uid;     /* (nexp, d): expert e's grid coordinates */
    const int *start;   /* (nexp + 1) */
    const int *pair;    /* (nrows): sample * k + slot of each row */
};

/* How a model reaches its experts. Inputs and outputs are host memory: they
 * go to and come from the network. ok arrays have one byte per expert of
 * the route. A non-zero return aborts the batch (a broken implementation or
 * arguments, not an expert that failed: that is ok[e] = 0); the model then
 * returns it and changes nothing. */
struct kern_dmoe_experts {
    void *ctx;
    /* uids (B,k,d) = for each sample the k best experts by
     * g(x,f) = sum_i scores[b][i][u_i] (scores (B,d,M)), best first, distinct
     * within a sample; uids[b][j][0] = -1 marks an empty slot (fewer than k
     * experts available). Local: brute force over the live grid cells;
     * networked: beam search over the DHT (seed 002 §3.2, Appendix C). */
    int (*select)(void *ctx, const float *scores, int B, int d, int M, int k, int *uids);
    /* y (nrows,C) = E_e(x rows) for every expert of r; ok[e] = 1 when expert e
     * answered (its y rows are then set), 0 when it failed. */
    int (*forward)(void *ctx, const struct kern_dmoe_route *r, const float *x, float *y,
                   uint8_t *ok);
    /* For the experts with ok[e] = 1 on entry (those that answered forward):
     * sends x rows and dy (nrows,C) = dL/dy, gets dx = dL/dx rows back; the
     * expert updates its own parameters from the gradient (seed 002 §3.3,
     * "Backward"). On return ok[e] = 1 when dx rows of e are set; 0 when it
     * failed (its rows then carry no gradient to the trunk). */
    int (*backward)(void *ctx, const struct kern_dmoe_route *r, const float *x, const float *dy,
                    float *dx, uint8_t *ok);
};

/* Running counts a DMoE model keeps over its batches (training and eval). */
struct kern_dmoe_stats {
    long batches;
    long slots;         /* (sample, slot) pairs with a chosen expert */
    long answered;      /* of those, pairs whose expert answered forward */
    long calls_fwd, failed_fwd;  /* expert calls (one per expert per batch) */
    long calls_bwd, failed_bwd;
    long nonfinite;     /* calls whose answer held a NaN or Inf (counted as failed) */
    long empty;         /* samples with no answered expert */
};

/* CM_EINVAL with a message in *why. */
int kern_dmoe_config_check(const struct kern_dmoe_config *c, const char **why);
size_t kern_dmoe_param_count(const struct kern_dmoe_config *c);
/* As kern_mlp_mem_need, for the model alone (the experts are not in it). */
void kern_dmoe_mem_need(const struct kern_dmoe_config *c, int max_batch, struct kern_mem_need *n);

/* Creates the model; ex is copied, ex->ctx is borrowed and must outlive the
 * model. Parameters initialized from seed. *out owned (kern_model_free). */
int kern_dmoe_new(const struct kern_backend *be, const struct kern_dmoe_config *c, int max_batch,
                  uint64_t seed, const struct kern_dmoe_experts *ex, struct kern_model **out);

/* Copies the model's counts; CM_EINVAL when m is not a DMoE model. */
int kern_dmoe_get_stats(const struct kern_model *m, struct kern_dmoe_stats *st);

/* 1: backward also computes dL/dx of the model's inputs (B,in), read with
 * kern_dmoe_get_input_grad (gradient checks; a DMoE layer stacked on
 * another model). CM_EINVAL when m is not a DMoE model. */
int kern_dmoe_set_input_grad(struct kern_model *m, int on);
/* host (B,in) = dL/dx of the last backward; CM_ESTATE when not enabled. */
int kern_dmoe_get_input_grad(const struct kern_model *m, int B, float *host);

/* ---- local experts: the whole grid in this process ----
 * Each grid cell holds a kern_expert (kern_expert.h) with its own optimizer
 * state, applying its optimizer step on every backward call like a server
 * would (seed 002 §3.3). Fault injection as in seed 002 §4.2: every call
 * (forward or backward) of an expert fails with probability fail_prob. */
struct kern_dmoe_local_config {
    int d, M;                 /* the grid: M^d cells, at most 4096 */
    int C, F;                 /* expert width and hidden width (kern_expert_new) */
    int max_rows;             /* largest batch of rows one expert gets (the model's max_batch) */
    struct kern_optim_config opt; /* each expert's optimizer */
    float fail_prob;          /* [0, 1) */
    uint64_t seed;            /* expert initialization and fault injection */
};

enum kern_dmoe_cell_state {
    KERN_DMOE_LIVE = 0,
    KERN_DMOE_DEAD,     /* not selectable: gone from the DHT */
    KERN_DMOE_FAILING,  /* selectable but never answers: crashed, entry not yet expired */
    KERN_DMOE_FAILING_BWD /* answers forward, fails every backward */
};

struct kern_dmoe_local;

int kern_dmoe_local_config_check(const struct kern_dmoe_local_config *c, const char **why);
int kern_dmoe_local_new(const struct kern_backend *be, const struct kern_dmoe_local_config *c,
                        struct kern_dmoe_local **out);
void kern_dmoe_local_free(struct kern_dmoe_local *l);
/* The interface over l (ctx = l, borrowed). */
void kern_dmoe_local_experts(struct kern_dmoe_local *l, struct kern_dmoe_experts *out);
/* Grid cell of uid (d coordinates) -> state. CM_EINVAL for a uid off the grid. */
int kern_dmoe_local_set_state(struct kern_dmoe_local *l, const int *uid,
                              enum kern_dmoe_cell_state st);
/* CM_EINVAL outside [0, 1). */
int kern_dmoe_local_set_fail_prob(struct kern_dmoe_local *l, float p);
/* 1: backward computes dx but applies no optimizer step and leaves the
 * experts' gradients zero (gradient checks, evaluation-only runs). */
void kern_dmoe_local_set_frozen(struct kern_dmoe_local *l, int frozen);
/* The expert in cell uid (borrowed), NULL off the grid. */
struct kern_expert *kern_dmoe_local_expert(struct kern_dmoe_local *l, const int *uid);
/* Optimizer steps the expert in cell uid has applied; -1 off the grid. */
long kern_dmoe_local_steps(const struct kern_dmoe_local *l, const int *uid);
/* Total parameters of all experts (for the summary line). */
size_t kern_dmoe_local_param_count(const struct kern_dmoe_local *l);

#endif
