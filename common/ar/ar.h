/* Averaging engine: butterfly all-reduce of a flat fp32 gradient inside one
 * group of peers over the p2p transport (seed 000_02cc6b5d62a616fc.txt,
 * section 3.2 "Adaptive averaging algorithm", Appendix B eq. (6) for the
 * aggregation fractions, Appendix C for group all-reduce and failures;
 * DESIGN.md "The training protocol", step 4). docs/averaging.md explains the
 * algorithm, the failure behaviour and the wire formats.
 *
 * One round, seen from one member:
 *   - the flat buffer of n floats is cut into one part per aggregator
 *     (members with fraction > 0), sized by the fractions and aligned to
 *     AR_ALIGN elements (ar_partition);
 *   - as a sender (sends = 1) it streams part k, chunk by chunk, to the
 *     aggregator of part k, to all aggregators concurrently;
 *   - as an aggregator it validates and keeps every chunk as it arrives and
 *     finalizes a chunk once every sender still in the round delivered it:
 *     average = sum of the kept chunks weighted by the senders' weights
 *     (sample counts, in double, in member order) / total weight of the
 *     senders counted for that chunk;
 *   - every sender (and every pull-only member, sends = 2) pulls the averaged
 *     chunks of the other parts from their
 *     aggregators (pull, because the transport answers requests at once and
 *     client-mode peers cannot be called) and, once a part is complete,
 *     writes it into its buffer. A part is committed whole or not at all.
 * The aggregator writes into its own buffer exactly the bytes it serves
 * (decoded from the wire encoding), so every member ends with bit-identical
 * averaged parts.
 *
 * Failures (every wait has a deadline): a sender silent for stall_ms, or not
 * finished by the deadline, is dropped and the weights renormalize over the
 * senders heard from; a sender of bad data (non-finite values, chunk norm
 * above max_norm, wrong sizes, inconsistent weight, undecodable payload) is
 * excluded and reported. Every chunk is validated before it is summed, so a
 * bad chunk never enters a sum; on exclusion the sender's earlier chunks are
 * taken out of every chunk not yet final (sum and weight), its later chunks
 * are refused, and only chunks already final (maybe already returned to
 * members) keep it: the report then lists it under `partial`. An aggregator that cannot be reached for stall_ms
 * (or by the deadline) leaves its part un-averaged: the buffer keeps the
 * local values for that part. Data for a round this engine has not started
 * is refused with CM_EBUSY and the sender retries until its stall limit
 * (no buffering); data for a finished round is refused with CM_ESTATE.
 *
 * Threading: everything runs on the loop of the p2p_ctx given to
 * ar_engine_new; the caller runs that loop. No call blocks. */
#ifndef AR_H
#define AR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "cm_crypto.h"
#include "p2p/p2p_transport.h"

#define AR_MAX_MEMBERS 64    /* members of one group (bit masks below) */
/* Chunk messages in flight per link and direction when the round does not
 * say. 4 until 2026-11-28: on 8 namespace hosts at 100 Mbit/s, paced at
 * 0.92, 2 took 15.8-16.1 s and 4 16.2-16.4 s (gloo 15.8), 1 16.1 s, 3 16.2
 * s, 8 16.8 s; unpaced and at 1 Gbit/s 2 was no slower, nor uncapped on
 * loopback or against the transport's buckets (bench_ar) (docs/averaging.md). */
#define AR_DEFAULT_WINDOW 2
#define AR_GROUP_ID_MAX 64   /* bytes of a group id */
#define AR_ROUND_ID_LEN 32   /* SHA-256, see ar_round_id */
#define AR_ALIGN 256         /* part boundaries are multiples of this (elements) */
#define AR_Q8_BLOCK 64       /* values per 8-bit quantization block */
#define AR_PAYLOAD_MAX (256u * 1024u) /* encoded bytes of one chunk: fits one frame */
#define AR_CHUNK_MAX 262144u /* elements of one chunk (with a payload <= AR_PAYLOAD_MAX) */
/* Default elements per chunk: about 128 KiB encoded whatever the encoding
 * (fewer, larger messages when compressed: each costs a signature). */
#define AR_CHUNK_DEFAULT 32768u /* fp32 */
#define AR_CHUNK_DEFAULT_FP16 65536u
#define AR_CHUNK_DEFAULT_Q8 131072u

/* Message types of the averaging protocol: 32..47 are reserved for it
 * (p2p_transport.h uses 1..2 and 16..18; docs/protocol.md, "Averaging"). */
enum ar_msg_type {
    AR_MSG_DATA = 32,  /* sender -> aggregator: one chunk of a part */
    AR_MSG_FETCH = 33, /* member -> aggregator: one averaged chunk, answered with a Result */
};

/* Wire compression of gradient chunks, chosen per run, both directions.
 * Exact formats in docs/averaging.md and ar_codec.h. */
enum ar_comp {
    AR_COMP_NONE = 0, /* fp32 little-endian */
    AR_COMP_FP16 = 1, /* IEEE binary16 little-endian, saturating at +-65504 */
    AR_COMP_Q8 = 2,   /* per block of AR_Q8_BLOCK values: fp32 absmax scale + int8 codes */
};

/* Why an aggregator excluded a sender. */
enum ar_excl_reason {
    AR_EXCL_NONFINITE = 1, /* NaN or Inf in a value or a quantization scale */
    AR_EXCL_NORM = 2,      /* L2 norm of its part above max_norm */
    AR_EXCL_SIZE = 3,      /* element count or payload length not what the round says */
    AR_EXCL_MALFORMED = 4, /* undecodable message, bad code, unknown encoding */
    AR_EXCL_WEIGHT = 5,    /* weight not finite, <= 0, above max_weight, or changed */
};
/* Static name ("nonfinite", "norm", ...); "unknown" for other values. */
const char *ar_excl_reason_name(int reason);

/* ---- engine ------------------------------------------------------------ */

struct ar_engine;
struct ar_round;

struct ar_engine_config {
    struct p2p_ctx *ctx;          /* borrowed; must outlive the engine */
    const struct cm_ed25519 *key; /* borrowed; the peer's key, must outlive the engine */
    const char *token;            /* the peer's access token (copied) */
    const char *listen_ip;        /* NULL: client mode (cannot aggregate) */
    uint16_t listen_port;         /* 0: ephemeral */
    uint16_t advertise_port;      /* port to announce; 0: the bound port */
    uint32_t max_inbound;         /* 0: transport default */
    uint32_t finished_memory;     /* ids of finished rounds remembered; 0: 256 */
};

/* Creates the engine and its own p2p hosts: the listening one (the
 * averaging handlers, chunk sends) and a client-mode one with the same
 * identity for fetching results on separate connections. */
int ar_engine_new(const struct ar_engine_config *cfg, struct ar_engine **out);
/* Cancels every round (their callbacks run before this returns, status
 * CM_ECLOSED), closes both hosts. Memory is released once the loop has run the
 * close callbacks (run the loop afterwards, as for p2p_host_close). */
void ar_engine_free(struct ar_engine *e);
/* The engine's listening host (borrowed), e.g. to learn its port or send PINGs. */
struct p2p_host *ar_engine_host(struct ar_engine *e);
uint16_t ar_engine_port(const struct ar_engine *e);
/* Replaces the token after a pass renewal. */
int ar_engine_set_token(struct ar_engine *e, const char *token);

/* ---- one round --------------------------------------------------------- */

enum { AR_SENDS_NONE = 0, AR_SENDS_FULL = 1, AR_SENDS_PULL = 2 };

struct ar_member {
    uint8_t pub[CM_ED25519_PUB_LEN];
    struct sockaddr_storage addr; /* listen address; used only when fraction > 0 */
    double fraction; /* share of the buffer it aggregates (Appendix B eq. (6));
                        0 for client-mode peers and peers that do not aggregate */
    int sends;       /* AR_SENDS_FULL: contributes a gradient and receives the average;
                        AR_SENDS_PULL: receives the average, contributes nothing
                        (a peer the schedule tells not to compute, which still
                        applies the step); AR_SENDS_NONE: aggregate-only
                        auxiliary peer (sends and receives nothing) */
};

/* Per-part outcome, in part order (parts follow member order among the
 * members with fraction > 0). Masks: bit i = member i. */
struct ar_part_report {
    uint32_t aggregator; /* member index */
    size_t offset, len;  /* elements of the flat buffer */
    int averaged;        /* 1: the buffer holds the group average for the whole part */
    int status;          /* CM_OK, or why not averaged (CM_ETIMEOUT, CM_ECONN, ...) */
    double weight;       /* total weight counted in the lightest chunk (the
                            weight the part was averaged with, when no sender
                            left part-way through) */
    double weight_max;   /* weight of the heaviest chunk: above `weight` when a
                            sender was dropped or excluded part-way through */
    uint64_t counted;    /* senders counted in every chunk */
    uint64_t partial;    /* senders counted in some chunks only */
    uint64_t dropped;    /* senders the aggregator stopped waiting for */
    uint64_t excluded;   /* senders the aggregator excluded for bad data */
};

struct ar_exclusion {
    uint32_t member; /* the excluded sender */
    uint32_t part;   /* the part whose aggregator excluded it */
    int reason;      /* enum ar_excl_reason */
};

/* What the done callback receives; borrowed for the call only. */
struct ar_result {
    int status; /* CM_OK: every part averaged; otherwise the first reason a
                   part was not (the parts say which), or CM_ECLOSED when the
                   round was cancelled (the buffer then holds local values
                   for every part not committed) */
    uint8_t round_id[AR_ROUND_ID_LEN];
    size_t n_parts, n_averaged;
    const struct ar_part_report *parts;
    size_t n_excluded; /* exclusions known here: by this aggregator, and
                          those other aggregators reported with their chunks */
    const struct ar_exclusion *excluded;
    uint64_t bytes_sent, bytes_received; /* message bodies of this round, both
                                            directions, requests and responses */
    uint64_t chunks_sent, chunks_received;
    double ms_send;   /* start -> every own chunk delivered (or given up) */
    double ms_reduce; /* start -> own part finalized (0 when not an aggregator) */
    double ms_fetch;  /* start -> every other part committed or given up */
    double ms_total;  /* start -> done */
};

typedef void (*ar_done_cb)(void *arg, const struct ar_result *res);

struct ar_round_config {
    uint64_t step;                /* run step */
    const uint8_t *group_id;      /* group id bytes (from group formation) */
    size_t group_id_len;          /* 0..AR_GROUP_ID_MAX */
    const struct ar_member *members;
    size_t n_members;             /* 1..AR_MAX_MEMBERS, same order on every member */
    size_t my_index;
    float *buf;                   /* n floats, in/out, borrowed until done runs;
                                     may be NULL for an aggregate-only member */
    size_t n;                     /* elements; same on every member */
    double weight;                /* my sample count (> 0 when I send) */
    enum ar_comp comp;
    uint32_t chunk_elems;         /* 0: the encoding's AR_CHUNK_DEFAULT*; a multiple of
                                     AR_Q8_BLOCK whose encoded size is <= AR_PAYLOAD_MAX */
    uint32_t deadline_ms;         /* whole round; 0: 60000. Aggregators stop
                                     waiting for senders at 4/5 of it */
    uint32_t stall_ms;            /* silence before a peer is given up, and the
                                     timeout of each message; 0: 5000 */
    uint32_t start_wait_ms;       /* how long a member that has not started the round
                                     yet is waited for (it answers "busy"; a sender
                                     never heard from); 0: stall_ms. Group rounds
                                     after the first set more: a member whose
                                     previous group lost a peer starts late */
    uint64_t gone;                /* members known to be gone (bit i: member i; e.g.
                                     found unreachable by an earlier group round of
                                     the same step): their parts are given up at once
                                     (CM_ECONN), and as senders they are dropped at
                                     once. Local: not part of the round id */
    int in_place;                 /* 1: each averaged chunk fetched is validated, then
                                     written straight into buf, instead of staging a
                                     part and writing it whole: saves a pass over the
                                     buffer and (M-1)/M of it in memory. A part that
                                     is then not averaged (parts[k].averaged == 0)
                                     holds local values in some chunks and averaged
                                     ones in others (all validated, finite), which
                                     the caller must not apply (join zeroes such
                                     parts). 0: a part is written whole or not at
                                     all. Local: not part of the round id */
    uint32_t linger_ms;           /* an aggregator keeps serving results this long
                                     after done (or until all fetched); 0: 10000 */
    unsigned window;              /* chunk messages in flight per peer; 0: 2
                                     (AR_DEFAULT_WINDOW) */
    double max_norm;              /* bound on the L2 norm of one received chunk; 0: 1e9 */
    double max_weight;            /* bound on a sender's weight; 0: 1e12 */
    ar_done_cb done;              /* called exactly once, never inside ar_round_start */
    void *arg;
};

/* Elements per chunk a configuration uses (its chunk_elems or the default
 * of its encoding). */
uint32_t ar_chunk_elems(const struct ar_round_config *cfg);

/* Round id: SHA-256 over "crowdtrain-ar-v1", step, group id, n, comp,
 * chunk elements, and every member's public key, fraction and sends flag, so
 * members with a different view of the round never mix data (their
 * messages name a round the others do not know). */
int ar_round_id(const struct ar_round_config *cfg, uint8_t out[AR_ROUND_ID_LEN]);

/* Splits n elements among the members with fraction > 0, in member order,
 * proportionally to their fractions, boundaries aligned to `align` elements
 * (the last part takes the remainder). Writes n_parts = number of
 * aggregators, owner[k] (member index) and offset[k], len[k] for each part
 * (arrays of n_members entries). Pure and deterministic: every member
 * computes the same split. CM_EINVAL on non-finite/negative fractions or
 * when no member aggregates. */
int ar_partition(const struct ar_member *members, size_t n_members, size_t n, size_t align,
                 size_t *n_parts, uint32_t *owner, size_t *offset, size_t *len);

/* Starts a round. Validates the configuration (CM_EINVAL: bad index, n, weight,
 * fractions, an aggregator without an address, myself aggregating on a
 * client-mode engine...; CM_EEXISTS: the same round is running or finished).
 * *out (optional) is a handle valid until done runs. */
int ar_round_start(struct ar_engine *e, const struct ar_round_config *cfg, struct ar_round **out);

/* Cancels a running round: done runs before this returns with CM_ECLOSED;
 * parts already committed stay in the buffer, the others keep local values
 * (with in_place, chunk by chunk). */
void ar_round_cancel(struct ar_round *r);

#endif
