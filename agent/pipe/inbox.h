/* What a pipeline stage agent is sent (docs/pipelines.md, "Stage agents";
 * the messages: common/sched/pipe_msg.h): activations, their gradients, the
 * tied embedding's gradient and gradient norms, put by the net's loop
 * thread as they arrive (in chunks, assembled here) and taken by the
 * stage's thread, which waits for each with a deadline.
 *
 * Bounded: only messages of the stage's current step and the next one are
 * taken (a sender is never further ahead: stage j cannot finish step s+1
 * before its successor sent the gradients of s+1), only from the peer the
 * assignment names for the sender's stage, at most max_entries tensors and
 * max_bytes of values at a time; anything else is refused, changing
 * nothing. Thread-safe. */
#ifndef AGENT_PIPE_INBOX_H
#define AGENT_PIPE_INBOX_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"
#include "sched/pipe_msg.h"

struct pipe_inbox;

/* A complete tensor (or a norm), owned by the taker: pipe_entry_free. */
struct pipe_entry {
    uint32_t type, stage, mb, B, T, C, total;
    int64_t step;
    float *values;    /* total values (NULL for NORM) */
    int32_t *targets; /* ACT: B*T targets; otherwise NULL */
    double sumsq;     /* NORM */
    uint32_t flags;   /* NORM: its flags (PIPE_FLAG_MOVE) */
};
void pipe_entry_free(struct pipe_entry *e);

int pipe_inbox_new(size_t max_entries, size_t max_bytes, struct pipe_inbox **out);
void pipe_inbox_free(struct pipe_inbox *ib);

/* The peers allowed to send as stage j of our pipeline (keys[j], j < S), and
 * our own stage (messages must come from a neighbour for ACT and GRAD, from
 * the other end for TIED, from any other stage for NORM). Drops everything
 * held. keys NULL: between two assignments, every message gets CM_EBUSY
 * (its sender tries again). */
void pipe_inbox_set_peers(struct pipe_inbox *ib, const uint8_t (*keys)[CM_ED25519_PUB_LEN], uint32_t S,
                          uint32_t replica, uint32_t mine);
/* The step the stage works on: entries of earlier steps are dropped, steps
 * `step` and `step + 1` are taken. */
void pipe_inbox_set_step(struct pipe_inbox *ib, int64_t step);

/* From the loop thread: one parsed message from `from`. CM_OK (taken, or a
 * repeat of a chunk already taken), CM_EBUSY (a step not taken yet, or full:
 * the sender retries; also while no peers are set), CM_EAUTH (not the peer of that stage, or a stage
 * that may not send this to us), CM_ERANGE (a chunk that does not fit the
 * tensor it belongs to, or the wrong way round), CM_ENOMEM. */
int pipe_inbox_put(struct pipe_inbox *ib, const uint8_t from[CM_ED25519_PUB_LEN], const struct pipe_msg *m);

/* Waits up to timeout_ms for the complete message (type, step, mb, from
 * stage `stage`) and hands it over. CM_ETIMEOUT, or CM_ECANCELED once
 * *interrupted (checked every 100 ms) is nonzero. */
int pipe_inbox_take(struct pipe_inbox *ib, uint32_t type, int64_t step, uint32_t mb, uint32_t stage,
                    uint32_t timeout_ms, const volatile sig_atomic_t *interrupted, struct pipe_entry **out);

/* What pipe_inbox_wait_any waits for: a complete message (type, step, mb)
 * from stage `stage`. */
struct pipe_want {
    uint32_t type;
    int64_t step;
    uint32_t mb, stage;
};

/* Waits up to timeout_ms until one of w[0..n-1] is complete (the first of
 * them in w's order, in *which; it stays held: pipe_inbox_take hands it
 * over). CM_ETIMEOUT, or CM_ECANCELED once *interrupted (checked every
 * 100 ms) is nonzero. n = 0 waits until either. */
int pipe_inbox_wait_any(struct pipe_inbox *ib, const struct pipe_want *w, size_t n, uint32_t timeout_ms,
                        const volatile sig_atomic_t *interrupted, size_t *which);

#endif
