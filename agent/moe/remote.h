/* Remote experts: struct kern_dmoe_experts (kernels/kern_dmoe.h) over the
 * network, for a trainer of a DMoE model (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.1-3.3; docs/experts.md "Trainers").
 *
 *   select    batch beam search over the DHT (common/moe/moe_beam.h, the
 *             in-loop driver; seed 002 §3.2, Appendix C Algorithm 1) with a
 *             deadline; servers this trainer banned are left out.
 *   forward   one FORWARD per expert per batch (agent/moe/moe_client.h), all
 *             of the batch's experts in flight at once, each with a deadline.
 *   backward  one BACKWARD per expert that answered forward (same forward
 *             id), all at once, same deadlines.
 *
 * An expert that fails, times out or answers garbage or NaN is marked
 * failed (ok[e] = 0; the model renormalises the gate over the rest, §3.1
 * "Fault tolerance"). Its server is banned with exponential backoff
 * (ban_min_ms doubling up to ban_max_ms), so the next select excludes it at
 * once: a dead expert stops being used within one call, not after its DHT
 * record expires. That is at the first failure that says the server cannot
 * serve it now (no answer, a refused or closed connection, busy, not
 * hosting the expert, a malformed or non-finite answer); a server that
 * answers CM_EINTERNAL (its own failure: seed 002 §4.2's failing calls) is
 * banned only after MOE_REMOTE_STRIKES of them in a row with no answer
 * between: banning at the first one, with 10 % of calls failing, left the
 * trainers calling a fifth of the experts (76,671 calls in a run that made
 * 408,480 without failures). A server that answers again after its ban is
 * forgiven.
 *
 * Threads: select/forward/backward run on the trainer's thread and block
 * until their calls complete or their deadline passes. The network work
 * runs on a loop thread reached through a runner: in production
 * peer_net_call (moe_remote_runner_net); a test that runs the loop on its
 * own thread provides run (call fn at once) and pump (run the loop once). A
 * call still in flight at the deadline counts as a timeout; its late answer
 * is dropped (the buffers it would write belong to the remote, refcounted).
 * Statistics are thread-safe.
 *
 * Asynchronous trainers (several batches in flight, seed 002 §3.3 "a
 * trainer can process hundreds of concurrent batches"; docs/experts.md
 * "Trainers"): each batch in flight uses its own context
 * (moe_remote_add_context), i.e. its own interface, from its own thread;
 * the contexts share the bans, the statistics and the forward ids. With a
 * compute lock set, every select/forward/backward is entered with the lock
 * held and releases it while it waits for the network, so one batch's
 * network wait overlaps the others' compute. Several contexts need a
 * runner without pump (the loop on a thread of its own). */
#ifndef AGENT_MOE_REMOTE_H
#define AGENT_MOE_REMOTE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/dht_node.h"
#include "kern_dmoe.h"
#include "moe/moe_grid.h"
#include "p2p/p2p_transport.h"

struct peer_net;

struct moe_remote_config {
    char run[MOE_RUN_MAX + 1];    /* DHT namespace of the experts (the run) */
    char name[MOE_NAME_MAX + 1];  /* the layer's uid prefix ("ffn") */
    int d, M, k, C;               /* grid (d <= MOE_MAX_DIMS, M <= MOE_MAX_SIZE), experts per sample, width */
    int beam_width;               /* W >= k; 0: k */
    uint32_t timeout_ms;          /* each expert call's deadline */
    uint32_t search_ms;           /* the beam search's deadline */
    uint32_t ban_min_ms, ban_max_ms; /* a failing server's ban: min, doubling to max */
};

#define MOE_REMOTE_STRIKES 3
/* run "", name "ffn", W = k, timeout 2000 ms, search 2000 ms, bans 2 s -> 60 s. */
void moe_remote_config_default(struct moe_remote_config *c);
/* CM_EINVAL with a message in *why. */
int moe_remote_config_check(const struct moe_remote_config *c, const char **why);

/* How the remote reaches the loop thread that owns the DHT node and the p2p
 * host. run(ctx, fn, arg) runs fn on that thread and returns once it has
 * run (non-zero: it did not run). pump NULL: the loop runs on a thread of
 * its own and waits sleep; else the waiting thread is the loop's, and pump
 * runs it once without blocking. */
typedef void (*moe_remote_fn)(void *arg, struct dht_node *dht, struct p2p_host *host);
struct moe_remote_runner {
    void *ctx;
    int (*run)(void *ctx, moe_remote_fn fn, void *arg);
    void (*pump)(void *ctx);
};

struct moe_remote_stats {
    uint64_t searches, search_failures; /* selects; of which the search failed or timed out */
    uint64_t calls;       /* expert calls, forward and backward */
    uint64_t failures;    /* of which failed (all causes: errors, timeouts, NaN, refused) */
    uint64_t timeouts;    /* of which passed their deadline */
    uint64_t nonfinite;   /* of which answered NaN or infinity */
    uint64_t bans;        /* servers banned (each ban counted once) */
    double latency_ms;    /* sum over the calls that answered */
    uint64_t answered;    /* calls - failures */
};

struct moe_remote;

/* Samples one expert server answered for this trainer: rows of BACKWARD
 * calls that succeeded, i.e. of forward+backward pairs completed (a sample
 * routed to two experts of one server counts twice: two expert calls).
 * What a trainer attests in its contribution report (docs/accounting.md,
 * "Expert servers"). Forward-only calls (evaluation) and pairs whose
 * backward failed do not count: the server did not train on them. */
struct moe_remote_served {
    uint8_t pub[32];
    uint64_t samples;
};
/* At most this many distinct servers are counted between two takes (later
 * ones are not counted until the next take). */
#define MOE_REMOTE_SERVED_MAX 4096

int moe_remote_new(const struct moe_remote_config *c, struct moe_remote **out);
/* Runner copied; NULL detaches (select/forward/backward then return
 * CM_ESTATE). Attach and detach only while no call is in progress. */
void moe_remote_set_runner(struct moe_remote *r, const struct moe_remote_runner *rn);
/* The interface over r (ctx = r, borrowed). */
void moe_remote_experts(struct moe_remote *r, struct kern_dmoe_experts *out);
void moe_remote_get_stats(struct moe_remote *r, struct moe_remote_stats *out);
/* Another context (see above): *out is its interface (ctx borrowed, owned
 * by r and freed with it). Call before any call is in progress. */
int moe_remote_add_context(struct moe_remote *r, struct kern_dmoe_experts *out);
/* compute (borrowed, NULL: none) is held by the callers of every context's
 * select/forward/backward; they release it for their network waits. Set
 * before any call is in progress. */
void moe_remote_set_compute_lock(struct moe_remote *r, pthread_mutex_t *compute);
/* Moves the per-server counts since the previous take into out: the `max`
 * largest (ties: by key), largest first; returns how many. At most
 * `budget` samples in all are taken (a report attests at most k x its own
 * samples, docs/accounting.md): when the counts exceed it, each taken
 * count is scaled down and the rest stays for the next take, up to
 * about `budget` more (a micro-batch whose backward finished after the round
 * closed is attested with the next report instead of being clipped).
 * Everything else is reset, the servers beyond `max` included.
 * Thread-safe (calls complete on the loop thread and are counted by the
 * waiting trainer thread under the remote's lock). */
size_t moe_remote_take_served(struct moe_remote *r, struct moe_remote_served *out, size_t max,
                              uint64_t budget);
/* 1 while the server with this key is banned. */
int moe_remote_banned(struct moe_remote *r, const uint8_t pub[32]);
/* The server key of expert uid (d coordinates) in the last select of the
 * first context (moe_remote_experts); CM_ENOTFOUND if not chosen. */
int moe_remote_server_of(struct moe_remote *r, const int *uid, uint8_t pub[32]);
/* Frees r. A call that ran past its wait still holds r until it ends: free
 * r once the loop that ran its calls has stopped or has run past the
 * calls' deadlines. */
void moe_remote_free(struct moe_remote *r);

/* The production runner: peer_net_call on n's loop (borrowed). */
void moe_remote_runner_net(struct peer_net *n, struct moe_remote_runner *out);

#endif
