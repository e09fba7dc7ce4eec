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

/* When the log's own round of `step` was taken: the t_ms of its line for
 * that step that is neither synced nor failed; -1 when there is none. */
int64_t ct_steps_time(const char *path, long step);

/* A step log's failed rounds ("averaged": false) and the steps it took,
 * for collaborations that must not learn (test_hosts' lost run). */
struct ct_failed {
    int lines;    /* failed rounds */
    int no_why;   /* of them without a "why" or a "round" */
    int not_run;  /* whose why says the engine did not start the round */
    int repeated; /* whose round id an earlier failed round of the log had (each try of
                     a step is a round of its own; an id of zeros: nothing ran) */
    int stepped;  /* steps of its own (neither failed nor synced) */
    int crowded;  /* of them with another member, or parts not all agreed */
    char first_bad[512]; /* the first line counted in no_why, not_run, repeated or crowded */
};
/* -1 when the file cannot be read or a line is not JSON. */
int ct_steps_failed(const char *path, struct ct_failed *out);

#endif
