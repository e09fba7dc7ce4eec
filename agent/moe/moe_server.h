/* The expert host core of decentralized mixture-of-experts (Learning@home,
 * seed 002_2b00836ea4b30f79.txt §3.3 "Runtime" and Appendix D): a set of
 * feed-forward experts (kernels/kern_expert.h), each with its own optimizer
 * (kernels/kern_optim.h), served to trainers over the p2p transport with
 * the messages of common/moe/moe_msg.h (types 64..66, docs/protocol.md
 * "Experts"). A later role (`crowdtrain-agent serve-experts`) wraps it with
 * DHT declarations and checkpoints.
 *
 * Threads: requests arrive on the p2p loop thread (moe_server_on_request is
 * a p2p_request_cb); they are checked there, queued in a batching queue
 * (common/moe/moe_batch.h) and computed by one worker thread, which hands
 * finished requests back to the loop (a uv_async) where they are answered
 * (p2p_reply_finish: the transport's deferred replies). All experts compute
 * on that one worker, one batch at a time (the CPU backend parallelizes
 * inside a batch with its own process-wide pool).
 *
 * Forward: outputs y = expert(x). The server keeps x, keyed by (caller key,
 * uid, forward id), for the backward that may follow: at most
 * max_saved_bytes of inputs (the oldest are dropped first) for at most
 * saved_ttl_ms. Backward: the server recomputes the forward from the kept x
 * (gradient checkpointing, seed 002 Appendix D), answers dL/dx, and the
 * kept x is used up. A backward without kept inputs (never seen, already
 * used, dropped, expired) is answered CM_ESTATE.
 *
 * Update rule: after each backward batch the expert's parameter gradient
 * (the sum over the batch's samples of what the callers' dL/dy imply:
 * callers scale their gradients, e.g. by 1/their batch) takes one step of
 * its optimizer, then is zeroed. Updates are asynchronous as in seed 002
 * §3.3: a forward is computed with whatever parameters the expert holds
 * when its batch runs, and a backward may see parameters updated since its
 * forward (the recompute uses the current ones).
 *
 * Answers to FORWARD/BACKWARD (besides the parsers' CM_EPARSE,
 * CM_EUNSUPPORTED, CM_ERANGE, CM_ENUMERIC): CM_ENOTFOUND unknown uid;
 * CM_ERANGE c is not the expert's width, or a backward whose n is not its
 * forward's; CM_ETOOBIG n above max_batch; CM_EBUSY max_inflight requests
 * held; CM_ESTATE no kept inputs; CM_ETIMEOUT the request waited in the
 * queue longer than queue_timeout_ms; CM_ECLOSED the server stopped;
 * CM_EINTERNAL an injected failure (fail_p) or a compute error. A request
 * that fails changes nothing (no kept inputs used up by a refused backward,
 * no parameter update). */
#ifndef AGENT_MOE_SERVER_H
#define AGENT_MOE_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kern_backend.h"
#include "kern_expert.h"
#include "kern_optim.h"
#include "p2p/p2p_transport.h"

struct moe_server_config {
    const struct kern_backend *be; /* borrowed; NULL: the CPU backend */
    uint32_t max_batch;            /* samples per batch and per request */
    uint32_t max_wait_ms;          /* longest wait for a batch to fill */
    uint32_t max_inflight;         /* requests queued, computing or being answered */
    uint32_t queue_timeout_ms;     /* a request not computed within: CM_ETIMEOUT */
    size_t max_saved_bytes;        /* forward inputs kept for backwards */
    uint32_t saved_ttl_ms;         /* how long they are kept */
    struct kern_optim_config optim;/* every expert's optimizer */
    double fail_p;                 /* each call fails with this probability (seed 002 §4.2: 0.1) */
    uint64_t seed;                 /* of the failure injection and the delays */
    /* Latency emulation (seed 002 §4.1: "an artificial delay after
     * computation of each block ... sampled from the exponential
     * distribution"): every answer of a request that reached the worker
     * (computed, failed there or expired in its queue) leaves after an
     * exponentially distributed delay of this mean (0: none), capped at 20
     * means; requests refused on arrival are answered at once. A timer per
     * answer on the loop; no thread sleeps. moe_server_stop answers the
     * held ones at once. At most 600000. */
    uint32_t delay_mean_ms;
};

/* max_batch 256, max_wait_ms 5, max_inflight 4096, queue_timeout_ms 10 s,
 * 256 MiB kept for 60 s, AdamW lr 1e-3, no failures. */
void moe_server_config_default(struct moe_server_config *c);

struct moe_server_stats {
    uint64_t requests;       /* FORWARD and BACKWARD received */
    uint64_t samples;        /* computed */
    uint64_t batches;        /* computed */
    double mean_batch;       /* samples / batches */
    uint64_t failures;       /* answered with an error status (all causes) */
    uint64_t injected;       /* of which injected (fail_p) */
    uint64_t timeouts;       /* of which expired in the queue */
    uint64_t updates;        /* optimizer steps applied */
    uint64_t delayed;        /* answers held back by delay_mean_ms */
    size_t saved_bytes;      /* forward inputs kept now */
};

struct moe_server;

/* loop: the p2p host's loop (borrowed; the server adds one uv_async to it).
 * CM_EINVAL for a bad config (zero limits, fail_p outside [0, 1], an
 * optimizer config kern_optim_config_check refuses). */
int moe_server_new(const struct moe_server_config *cfg, uv_loop_t *loop, struct moe_server **out);
/* Adds an expert of width C, hidden F (kern_expert_new with this seed),
 * before moe_server_start or while it serves (a server taking over an
 * expert whose server left): on the loop thread once started. CM_EINVAL bad
 * uid or shape; CM_EEXISTS; CM_ESTATE once stopped; CM_ERANGE beyond
 * MOE_INFO_MAX_EXPERTS. */
int moe_server_add_expert(struct moe_server *s, const char *uid, int C, int F, uint64_t seed);
/* The expert (borrowed); touch it only while the server is not started or
 * stopped (moe_server_save / _load work while it serves). Loop thread.
 * NULL if unknown. */
struct kern_expert *moe_server_expert(struct moe_server *s, const char *uid);

/* An expert's state for checkpoints (common/moe/moe_ckpt.h): its n
 * parameters and the first and second moments of its optimizer (n floats
 * each, host memory) and its optimizer step. Any thread: both wait for the
 * batch being computed to finish, so a save is a state between two
 * batches, and a load takes effect before the next. CM_ENOTFOUND unknown
 * uid; CM_ERANGE n is not the expert's size; CM_EINVAL a negative step. */
/* n: the expert's parameter count; step (may be NULL): its optimizer steps. */
int moe_server_expert_size(struct moe_server *s, const char *uid, size_t *n, long *step);
int moe_server_save(struct moe_server *s, const char *uid, float *params, float *m, float *v, size_t n,
                    long *step);
int moe_server_load(struct moe_server *s, const char *uid, const float *params, const float *m,
                    const float *v, size_t n, long step);
/* Starts the worker thread. */
int moe_server_start(struct moe_server *s);

/* The p2p request handler (pass s as the host's arg, or call it from the
 * host's own handler): serves MOE_MSG_FORWARD/BACKWARD/INFO, returns
 * CM_EUNSUPPORTED for every other type so a host can chain handlers. Loop
 * thread only. */
int moe_server_on_request(void *s, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                          const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen);

/* Stops the worker (it finishes the batch it computes, at most one batch
 * of time) and answers every request still held: computed ones with their
 * results, the others CM_ECLOSED. Later requests get CM_ECLOSED. Loop
 * thread; idempotent. */
void moe_server_stop(struct moe_server *s);
/* Stops if needed, then frees; the memory goes once the loop has run
 * (libuv closes the async handle), like p2p hosts. */
void moe_server_free(struct moe_server *s);

/* Thread-safe. */
void moe_server_stats(struct moe_server *s, struct moe_server_stats *out);

#endif
