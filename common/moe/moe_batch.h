/* The expert server's batching queue (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.3 "Runtime": the server gathers requests of
 * many trainers for the same expert into one batch, so the hardware runs
 * large matrix products instead of one per request).
 *
 * A pure data structure with no threads and no clock of its own: the owner
 * passes the time (ms, any monotonic origin) and locks it if several
 * threads touch it (agent/moe/moe_server.c does). Rules:
 *   - requests are grouped by key (kind, uid): a forward and a backward of
 *     the same expert are different computations and never share a batch;
 *   - within a group, FIFO; a request is never split; a request of more
 *     than max_batch samples is refused at push (CM_ETOOBIG);
 *   - a group is ready when its queued samples fill a batch (the next
 *     request would not fit) or its oldest request has waited max_wait_ms;
 *   - of the ready groups, the one whose oldest request came first is served
 *     first (fairness across uids: the oldest batch first);
 *   - a request whose deadline has passed is dropped by moe_batch_expire,
 *     which hands it back so its caller gets a timeout error.
 * Memory is bounded: at most max_pending requests are held (CM_EBUSY
 * beyond). */
#ifndef MOE_BATCH_H
#define MOE_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe_msg.h"

struct moe_batch_config {
    uint32_t max_batch;   /* samples per batch, >= 1 */
    uint32_t max_wait_ms; /* longest wait of a partial batch (0: none) */
    uint32_t max_pending; /* requests held, all groups together, >= 1 */
};

struct moe_batch_req {
    int kind;                    /* e.g. MOE_MSG_FORWARD / MOE_MSG_BACKWARD */
    char uid[MOE_UID_MAX + 1];
    uint32_t n;                  /* samples */
    int64_t arrival_ms, deadline_ms;
    void *tag;                   /* the owner's request, handed back */
};

/* One batch taken out of the queue: reqs[0..n_reqs) in FIFO order, all of
 * the same kind and uid, samples in total. */
struct moe_batch {
    int kind;
    char uid[MOE_UID_MAX + 1];
    uint32_t samples;
    size_t n_reqs;
    struct moe_batch_req *reqs;  /* owned by the batch: moe_batch_release */
};

struct moe_batch_group;

struct moe_batch_queue {
    struct moe_batch_config cfg;
    struct moe_batch_group *groups; /* one per (kind, uid) with requests */
    size_t pending;                 /* requests held */
};

/* CM_EINVAL for max_batch or max_pending of 0. */
int moe_batch_init(struct moe_batch_queue *q, const struct moe_batch_config *cfg);
/* Frees every request still held (their tags are not touched). */
void moe_batch_cleanup(struct moe_batch_queue *q);

/* Queues a copy of r. CM_EINVAL: invalid uid or n of 0; CM_ETOOBIG: n over
 * max_batch (such a request could never run); CM_EBUSY: max_pending held;
 * CM_ENOMEM. Nothing is queued on error. */
int moe_batch_push(struct moe_batch_queue *q, const struct moe_batch_req *r);

/* Removes every request with deadline_ms <= now_ms and copies up to cap of
 * them to out (FIFO per group); returns how many were removed; call again
 * while it returns cap. */
size_t moe_batch_expire(struct moe_batch_queue *q, int64_t now_ms, struct moe_batch_req *out,
                        size_t cap);

/* Takes the next ready batch (rules above) into *b: 1 when one was taken,
 * 0 when none is ready, CM_ENOMEM. Requests past their deadline are not
 * served: call moe_batch_expire first. */
int moe_batch_next(struct moe_batch_queue *q, int64_t now_ms, struct moe_batch *b);
void moe_batch_release(struct moe_batch *b);

/* Milliseconds from now_ms until a batch becomes ready by waiting or a
 * request expires (0: already; -1: nothing queued). A worker sleeps that
 * long unless a push wakes it. */
int64_t moe_batch_due_ms(const struct moe_batch_queue *q, int64_t now_ms);

/* Requests held. */
size_t moe_batch_pending(const struct moe_batch_queue *q);

#endif
