/* Asynchronous micro-batches of a DMoE trainer (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.3 "Trainer": "a trainer can process hundreds
 * of concurrent batches"; docs/experts.md "Trainers"). Up to K micro-batches
 * are in flight at once, each in its own model context (a kern_dmoe model
 * with its own activations and gradient buffer) on a worker thread of its
 * own, so the network waits of one (beam search, expert forward and
 * backward) overlap the compute of the others. The compute itself is
 * serialised by one lock (the backend is not reentrant): a worker holds it
 * around the model's work and the experts' implementation drops it while it
 * waits for the network (moe_remote_set_compute_lock).
 *
 * No staleness for what the trainer owns: the contexts' parameters are
 * copied from the master model whenever a micro-batch starts with none in
 * flight, and the caller changes the master's parameters only with none in
 * flight (drain with agent_async_next first). Micro-batches complete in
 * submission order (agent_async_next returns the oldest), so summing their
 * gradients gives exactly what running them one after another gives, bit
 * for bit, when the experts answer deterministically. The experts
 * themselves update on their servers at each backward, asynchronously, as
 * in §3.3.
 *
 * Threads: submit, next and free from one thread (the trainer's). */
#ifndef AGENT_TRAIN_ASYNC_H
#define AGENT_TRAIN_ASYNC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kern_backend.h"
#include "kern_dmoe.h"
#include "kern_model.h"

#define AGENT_ASYNC_MAX 256 /* micro-batches in flight at most */

struct agent_async_config {
    const struct kern_backend *be;   /* borrowed */
    struct kern_dmoe_config dmoe;    /* the master model's config */
    int micro_batch;                 /* rows per micro-batch (the contexts' max batch) */
    int max_inflight;                /* K: 1..AGENT_ASYNC_MAX */
};

/* A finished micro-batch. */
struct agent_async_done {
    int rc;              /* kern_model_fwd_bwd's result (or the gradient's download) */
    int B;               /* its rows */
    uint64_t seq;        /* 0, 1, ...: its place in submission order */
    const float *grad;   /* host (nparams): grad_scale * d(mean loss)/d(params); borrowed
                            until the next agent_async_next or agent_async_free */
    struct kern_eval ev;
    double wait_ms;      /* time between its submission and its completion */
};

struct agent_async;

/* ex: K experts interfaces, one per context (each used by one thread at a
 * time; their ctx borrowed, must outlive a). CM_EINVAL for a bad config. */
int agent_async_new(const struct agent_async_config *c, const struct kern_dmoe_experts *ex,
                    struct agent_async **out);
/* The compute lock (to hand to the experts' implementation). */
pthread_mutex_t *agent_async_lock(struct agent_async *a);
int agent_async_inflight(const struct agent_async *a);
int agent_async_max_inflight(const struct agent_async *a);

/* Starts a micro-batch: x (B,in) and y (B) are copied, grads of the
 * context = grad_scale * the gradient. With none in flight, first copies
 * master's parameters (nparams must match) to every context. CM_EBUSY when
 * K are in flight (agent_async_next first), CM_EINVAL bad B or master. */
int agent_async_submit(struct agent_async *a, const struct kern_model *master, const float *x,
                       const int32_t *y, int B, float grad_scale);

/* Waits for the oldest micro-batch in flight and fills d. CM_ESTATE when
 * none is in flight. */
int agent_async_next(struct agent_async *a, struct agent_async_done *d);

/* Waits for the micro-batches in flight (their results are dropped), stops
 * the workers, frees a. */
void agent_async_free(struct agent_async *a);

#endif
