/* Group all-reduce: averaging a step's gradient in groups of m instead of
 * one all-reduce over every member (seed 000_02cc6b5d62a616fc.txt, §3.2
 * "Node failures" and Appendix C: ceil(log_m n) rounds of groups of m reach
 * the exact average, and a failure only spoils its own group's round).
 * The coordinator picks m (common/sched/sched_group.c) and puts it in the
 * schedule; docs/collaboration.md, "Groups", says how agents run it.
 *
 * The layout is a merge tree over *units*: sets of members that hold the
 * same values (bit for bit) and carry the weight of the samples behind them.
 *  - Round 1: the members are dealt into ceil(n/m) units of at most m
 *    (aggregators dealt first, so every unit has one); each unit averages
 *    (a unit of one has nothing to average and sits out).
 *  - Round r > 1: the units are dealt into super-units of at most m units,
 *    each averaging in one group: one member of every unit sends, with its
 *    unit's weight, in unit order (the sender rotates over the unit's
 *    members from round to round), and every other member of the
 *    super-unit receives (AR_SENDS_PULL) and may aggregate. So a group has
 *    at most m senders, and a sender lost in any round is renormalized
 *    away inside its one group: all its members still get the same bits,
 *    and the failure spoils that group's average only (seed 000 §3.2,
 *    "Node failures": a failed participant "will only affect his
 *    immediate group"). A super-unit of one unit sits the
 *    round out.
 *  - Rounds go on until one unit is left: every member then holds the
 *    global average weighted by sample counts, for any n, not only powers
 *    of m (the incomplete grids of Moshpit averaging would leave members
 *    with different values, which collaborative training cannot have).
 *
 * Pure and deterministic: every member computes the same layout from the
 * same member list. */
#ifndef AGENT_DP_GROUPS_H
#define AGENT_DP_GROUPS_H

#include <stddef.h>

#include "ar/ar.h"

#define DP_GROUPS_MAX_ROUNDS 8 /* ceil(log2 AR_MAX_MEMBERS) = 6 is the most with m >= 2 */

struct dp_groups {
    size_t n;      /* members */
    size_t rounds; /* 1: no grouping, one all-reduce over every member */
    /* per round r < rounds and member i (rounds >= 2 only): */
    int group[DP_GROUPS_MAX_ROUNDS][AR_MAX_MEMBERS]; /* -1: sits this round out */
    int pos[DP_GROUPS_MAX_ROUNDS][AR_MAX_MEMBERS];   /* index in its group's member list */
    int sends[DP_GROUPS_MAX_ROUNDS][AR_MAX_MEMBERS]; /* 1: sends for its unit; 0: receives */
    double weight[DP_GROUPS_MAX_ROUNDS][AR_MAX_MEMBERS]; /* its unit's weight when it sends */
    size_t size[DP_GROUPS_MAX_ROUNDS][AR_MAX_MEMBERS];   /* members of group g in round r */
    size_t n_groups[DP_GROUPS_MAX_ROUNDS];
};

/* Lays out the rounds for n members (canonical order) with group size m.
 * sends[i]: member i contributes a gradient (AR_SENDS_FULL); agg[i]: it
 * accepts connections and may aggregate; weight[i]: its sample count.
 * Members that do not send (pull-only and aggregate-only peers) sit every
 * round out but the last, whose one group holds every member: there they
 * receive the average, and aggregate when agg[i]. One all-reduce
 * (out->rounds = 1) when m < 2, m >= the senders, or the senders hold
 * fewer aggregators than first-round units. CM_EINVAL on n = 0 or
 * n > AR_MAX_MEMBERS. */
int dp_groups_plan(size_t n, const int *sends, const int *agg, const double *weight, unsigned m,
                     struct dp_groups *out);

#endif
