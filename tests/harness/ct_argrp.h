/* A group of averaging engines in one process on one libuv loop, each with
 * its own host and key (tests/unit/ar/test_allreduce*.c): set-up, running
 * rounds with late starts and kills, and the exact weighted mean they must
 * reach (seed 000_02cc6b5d62a616fc.txt, section 3.2). */
#ifndef CT_ARGRP_H
#define CT_ARGRP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ar/ar.h"
#include "tests/harness/p2p_testkit.h"

#define MAXP 8

struct argrp_peer {
    struct p2p_tk_peer id;
    struct p2p_ctx *ctx;
    struct ar_engine *eng;
    struct ar_round *round;
    float *buf, *orig;
    int done, alive, started;
    struct ar_result res;
    struct ar_part_report parts[AR_MAX_MEMBERS];
    struct ar_exclusion excl[256];
};

struct argrp {
    uv_loop_t loop;
    struct p2p_tk tk;
    size_t m, n;
    struct argrp_peer p[MAXP];
    struct ar_member mem[MAXP];
    double w[MAXP];
    struct ar_round_config base;
};

/* Rounds of the group write fetched averages straight into the buffer
 * (ar_round_config.in_place, what the agent uses) instead of staging parts. */
extern int argrp_in_place;

/* argrp_urand's state: set it to repeat the same gradients and weights */
extern uint64_t argrp_rng;
double argrp_urand(void);
void argrp_on_done(void *arg, const struct ar_result *r);
/* A group of m peers. listen[i] = 0: client mode. mbps[i] > 0 caps that
 * peer's upload (and download) to slow it down. */
void argrp_init(struct argrp *g, size_t m, size_t n, const double *frac, const int *sends, const int *listen,
                const double *mbps);
void argrp_kill(struct argrp *g, size_t i);
void argrp_cleanup(struct argrp *g);
int argrp_start(struct argrp *g, size_t i);
/* Starts peer i at start_ms[i] (negative: never), kills peer kill_i at
 * kill_ms, and runs until every live started peer is done. */
void argrp_run(struct argrp *g, const int *start_ms, int kill_i, int kill_ms, int limit_ms);
/* Weighted mean at element j over the senders in mask. */
double argrp_mean_at(const struct argrp *g, uint64_t mask, size_t j, double *wsum);
uint64_t argrp_senders(const struct argrp *g);
int argrp_close_to(double got, double want, double tol_rel);
/* Every live sender ends with the same bytes in the averaged parts. */
void argrp_assert_identical(const struct argrp *g, const struct argrp_peer *ref);
void argrp_check_exact(struct argrp *g, uint64_t mask);

#endif
