/* Step logs (`--step-log` of `join` and `train --local`) folded for the
 * collaborative tests: every agent's parameter hash per step must agree,
 * and the loss per step is compared with single-process runs of the same
 * recipe (seed 000 H.5: a collaboration follows single-process training
 * with the same global batch). */
#ifndef CT_STEPS_H
#define CT_STEPS_H

#include <stdint.h>

#define CT_STEPS_MAX 600

struct ct_steps {
    char hash[CT_STEPS_MAX + 1][65]; /* "" = no log had the step */
    double loss_sum[CT_STEPS_MAX + 1], samples[CT_STEPS_MAX + 1]; /* loss x samples, samples */
    int members[CT_STEPS_MAX + 1];   /* most members any log shows for the step's round (join) */
    int full[CT_STEPS_MAX + 1];      /* logs where every part was averaged (agreed == parts > 0) */
    double round_ms[CT_STEPS_MAX + 1]; /* the step's round_ms (the last log folded) */
    double global[CT_STEPS_MAX + 1]; /* samples the step's round averaged (its members' weights), from a
                                        log whose round agreed on every part */
    int64_t t_first, t_last;         /* earliest and latest t_ms of any line */
    double span_s;                   /* (t_last - t_first) / 1000 */
    long margin_min, margin_max;     /* the gatherings' margins (margin_ms), 0 = none seen */
    int mismatches, nan_losses, lines;
};

/* Folds one step-log file into st (lines a killed process left half
 * written are skipped; steps a peer took from another's state, "synced",
 * count for the hash only). A hash that differs from what another log said
 * for the step counts as a mismatch, printed with `who`. Returns the first
 * step the log took part in, or -1 (no file or no such step). */
long ct_steps_fold(const char *path, struct ct_steps *st, const char *who);

/* The collaboration's mean loss per window of `window` steps against the
 * single-process runs' (local[0..nlocal-1]): inside [min - tol, max + tol]
 * of theirs, tol = 2 (max - min) + 0.01, at least warm_tol for windows that
 * end at or before step `warm`. Prints the table; returns the number of
 * windows outside (-1 when a window has no samples in some log). */
int ct_steps_follow(const struct ct_steps *collab, const struct ct_steps *local, int nlocal, long steps,
                    long window, long warm, double warm_tol);

#endif
