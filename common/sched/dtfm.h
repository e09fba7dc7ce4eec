/* Pipeline-parallel assignment over heterogeneous networks (seed
 * 003_f3537b728458fcc1.txt, "Decentralized Training of Foundation Models in
 * Heterogeneous Environments", DT-FM): which device runs which stage of
 * which pipeline replica, given the devices' pairwise delays and
 * bandwidths.
 *
 * N = stages x replicas devices; tasklet (i, j) is micro-batch group
 * (replica) i at stage j (§2). The search is bi-level (§3.1): it looks for a
 * balanced partition of the devices into one data-parallel group C_j per
 * stage, and a partition's cost already contains the best pipeline
 * structure for it:
 *
 *  - data-parallel cost (§3.2, eq. 2): max over groups of
 *    max_{d in C} sum_{d' in C - d} 2 (alpha_dd' + c_DP / (D_DP beta_dd'));
 *  - pipeline cost (§3.3, eq. 3-4): the coarsened graph's edge between two
 *    groups is their bottleneck perfect matching
 *    min_M max_{(d,d') in M} 2 (alpha_dd' + c_PP / beta_dd'), and the stages'
 *    order is the open-loop travelling-salesman path over those edges
 *    (exact Held-Karp up to DTFM_TSP_EXACT_MAX groups, nearest neighbour and
 *    2-opt above);
 *  - a compute term the paper does not have: with per-stage work and
 *    per-device speeds, the sum over the stages of the slowest replica's
 *    work(stage) / speed(device), the stage being the group's position in
 *    the path (the stages compute in turn when a replica's share of the
 *    step is one micro-batch).
 *
 * total = data-parallel + pipeline + compute.
 *
 * With M = micro_batches > 1 (ours, for the agents' 1F1B schedule, seed 003
 * §3.5: stages work on different micro-batches at once, sending overlaps
 * computing), the order and matchings are chosen as above, and the
 * pipeline and compute terms of that structure become what one
 * micro-batch takes through the whole path and back (fill and drain) plus
 * M - 1 times the busiest resource per micro-batch:
 *    e_k = max over replicas of alpha + c_PP / (M beta)   (edge k, one way)
 *    c_j = max over replicas of work(j) / (M speed) x (4/3 before the last
 *          stage: the agents compute a forward again, fwd:bwd ~ 1:2)
 *    fill = sum_k 2 e_k + sum_j c_j,   b = max(max_k e_k, max_j c_j)
 *    pipeline + compute = fill + (M - 1) b
 * (the (M - 1) b part counted in pipeline when a link is the busiest, in
 * compute otherwise). Each link direction and each stage is its own
 * resource: activations and their gradients cross an edge in opposite
 * directions. M = 1 gives the formulas above (without the 4/3). The stage
 * order is then the better of two paths for this cost: the smallest sum of
 * eq. 3's edges (the paper's) and the smallest longest edge (the busiest
 * link, up to DTFM_TSP_EXACT_MAX stages).
 *
 * With tied_bytes > 0 (ours: a GPT's first and last stage share the token
 * embedding and exchange its gradient each step), the pipeline term also
 * holds the slowest replica's 2 (alpha + c_tied / beta) between its first
 * and last stage. Delays and bandwidths are
 * symmetrized as in §2: ((a_dd' + a_d'd) / 2, (b_dd' + b_d'd) / 2).
 *
 * The search (dtfm_search) is the hybrid genetic algorithm of §3.4 with the
 * paper's local search (fastest intra-group links, four swap candidates per
 * pair of groups, its gain function), or with Kernighan-Lin local search or
 * none (the baselines of its Figure 4); a random assignment is the baseline
 * of its ablation (§4.2). Deterministic for a given seed: no clocks, no
 * global state. Nothing here touches the network or a database. Units: SI
 * (seconds, bytes, bits per second). */
#ifndef DTFM_H
#define DTFM_H

#include <stddef.h>
#include <stdint.h>

#define DTFM_MAX_STAGES 64
#define DTFM_MAX_REPLICAS 64 /* matchings use one 64-bit word per device */
#define DTFM_MAX_DEVICES 1024
#define DTFM_TSP_EXACT_MAX 12 /* Held-Karp: 2^S x S^2 steps */

struct dtfm_problem {
    size_t stages;   /* D_PP >= 1 */
    size_t replicas; /* D_DP >= 1; devices = stages x replicas */
    /* devices x devices, row-major: delay in seconds (alpha) and bandwidth
     * in bits/s (beta) from device d (row) to d' (column). The diagonal is
     * ignored; off the diagonal, delay >= 0 and bandwidth > 0, finite. */
    const double *delay_s;
    const double *bw_bps;
    double act_bytes;  /* c_PP: activations (and their gradients) between adjacent stages */
    double grad_bytes; /* c_DP: one stage's gradients */
    /* Optional (both or neither): work of each stage per step, in any unit,
     * and each device's speed in that unit per second. */
    const double *stage_work; /* stages entries, >= 0 */
    const double *speed;      /* devices entries, > 0 */
    /* Micro-batches each replica cuts its share of the step into, run 1F1B
     * (see above); 0 or 1: one. At most DTFM_MAX_MICRO_BATCHES. */
    size_t micro_batches;
    /* Bytes of the tied embedding's gradient the first and the last stage
     * of each pipeline exchange every step (0: none); adds the slowest
     * replica's 2 (alpha + c_tied / beta) between its ends to the pipeline
     * term. */
    double tied_bytes;
    /* 1: after the averaging, every stage of a pipeline sends a small
     * message (its gradients' squared norm, for clipping by the global
     * norm) to every other and waits for theirs: adds the slowest
     * replica's largest one-way alpha between two of its stages to the
     * pipeline term (ours: the stage agents' step, docs/pipelines.md). */
    int norm_exchange;
};
#define DTFM_MAX_MICRO_BATCHES 1000000

struct dtfm_cost {
    double total, dp, pp, compute; /* seconds */
};

struct dtfm_model; /* the problem's symmetrized pair costs */

/* CM_EINVAL with a message in *why (static text) for a bad problem. */
int dtfm_model_new(const struct dtfm_problem *p, struct dtfm_model **out, const char **why);
void dtfm_model_free(struct dtfm_model *m);
size_t dtfm_devices(const struct dtfm_model *m);
size_t dtfm_stages(const struct dtfm_model *m);
size_t dtfm_replicas(const struct dtfm_model *m);

/* A partition is group[d] in [0, stages) for every device, each group
 * holding exactly `replicas` devices. An assignment is assign[i * stages + j]
 * = the device running replica i's stage j (every device exactly once). */
int dtfm_partition_check(const struct dtfm_model *m, const uint16_t *group);
int dtfm_assignment_check(const struct dtfm_model *m, const uint32_t *assign);

/* The cost of a partition with its best pipeline structure (stage order and
 * matchings); with assign != NULL, the assignment that has that cost. */
int dtfm_cost_partition(const struct dtfm_model *m, const uint16_t *group, struct dtfm_cost *cost,
                        uint32_t *assign);
/* The cost of an assignment as it is: its stages in their order, replica i
 * talking to replica i of the next stage; dp as for its groups. */
int dtfm_cost_assignment(const struct dtfm_model *m, const uint32_t *assign, struct dtfm_cost *cost);

enum dtfm_local {
    DTFM_LOCAL_PAPER, /* §3.4 "Improving Local Search Strategy" */
    DTFM_LOCAL_KL,    /* §3.4 "Existing Local Search Strategy" (Kernighan-Lin gain) */
    DTFM_LOCAL_NONE,  /* genetic algorithm alone */
};

struct dtfm_search_opts {
    uint64_t seed;
    enum dtfm_local local;
    unsigned population;  /* 0: 16 */
    unsigned generations; /* 0: 200 */
    /* A partition to start from (re-scheduling after a change keeps what
     * still holds), or NULL. It is one member of the first population. */
    const uint16_t *warm;
};

struct dtfm_search_stats {
    uint64_t evaluations;  /* full or incremental cost evaluations */
    unsigned improvements; /* generations whose offspring beat the best */
};

/* Best partition found (group, devices entries) and its cost. */
int dtfm_search(const struct dtfm_model *m, const struct dtfm_search_opts *o, uint16_t *group,
                struct dtfm_cost *cost, struct dtfm_search_stats *stats);

/* A uniformly random assignment (the ablation baseline of §4.2); *rng is a
 * splitmix64 state the caller keeps. */
void dtfm_random_assignment(const struct dtfm_model *m, uint64_t *rng, uint32_t *assign);
uint64_t dtfm_rand(uint64_t *rng);

#endif
