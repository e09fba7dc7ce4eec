/* Internal state of the averaging engine, shared by ar_engine.c (engine,
 * host, message dispatch, partition, round ids) and ar_round.c (one round:
 * aggregator, sender and puller sides). Not part of the public API. */
#ifndef AR_INTERNAL_H
#define AR_INTERNAL_H

#include <stdint.h>
#include <uv.h>

#include "ar/ar.h"
#include "ar/ar_msg.h"

#define AR__TICK_MS 5
#define AR__BACKOFF_MIN_MS 5
#define AR__BACKOFF_MAX_MS 50

/* Chunk states on the sender (out) and puller (in) sides. */
enum { AR__C_PENDING = 0, AR__C_FLIGHT, AR__C_DONE, AR__C_RETRY };
/* Sender states as the aggregator sees them. */
enum { AR__S_ACTIVE = 0, AR__S_DONE, AR__S_DROPPED, AR__S_EXCLUDED };
/* Round phases. */
enum { AR__P_RUNNING = 0, AR__P_LINGER, AR__P_DEAD };

struct ar__sender {
    int state;
    int reason;
    int has_weight;
    double weight;
    size_t n_recv;
    int64_t last_ms;
};

/* My part, when I aggregate. */
struct ar__agg {
    size_t part, offset, len, n_chunks, n_final;
    size_t final_prefix; /* leading chunks that are final (told to members in Acks) */
    uint64_t *recv;     /* per chunk: senders summed in */
    double *cw;         /* per chunk: their total weight */
    uint8_t *final;     /* per chunk: 0 open, 1 averaged, 2 failed (no sender heard) */
    uint64_t *served;   /* per chunk: members that fetched it */
    uint8_t *res;       /* encoded averaged chunks, chunk c at c * enc_chunk */
    float **undo;       /* [c * n_members + s]: sender s's validated chunk c,
                           kept until c is final and summed then (so an
                           excluded sender is taken out by dropping it);
                           others' are chunk buffers of the pool
                           (ar__pool_chunk_get, r->chunk floats) */
    int own_borrowed;   /* my own entries point into r->buf (not copied, never
                           freed); cleared when the buffer goes back to the
                           caller */
    uint64_t senders, pullers, dropped, excluded;
    struct ar__sender snd[AR_MAX_MEMBERS];
    size_t n_excl;
    struct ar_exclusion excl[AR_MAX_MEMBERS];
};

/* A remote part: my sending of it (out) and my fetching of its average (in). */
struct ar__link {
    size_t n_chunks;
    /* out */
    uint8_t *ost;
    size_t onext, oacked;
    unsigned oflight;
    int odone, ostatus;
    int64_t oretry_at, olast_ms;
    uint32_t obackoff;
    int oheld; /* ahead of the slowest link: waits for it (out_pump) */
    int obusy, ibusy; /* the last answer said the aggregator has not started the
                         round: it gets start_wait_ms, not stall_ms */
    int64_t osent_ms; /* last chunk sent on this link (a held link still sends
                         one every stall_ms / 4, or its aggregator drops us) */
    /* in */
    uint8_t *ist;
    float *stage;
    size_t inext, igot;
    size_t iready; /* leading chunks the aggregator said are final */
    unsigned iflight;
    int idone, istatus;
    size_t ilow, olow; /* lowest chunk not yet done, each side */
    int64_t iretry_at, iprobe_at, ilast_ms;
    uint32_t ibackoff;
    double wmin, wmax;
    uint64_t cand, cor, dropped, excluded;
};

struct ar_round {
    struct ar_engine *e;
    struct ar__pool *pool; /* the engine's (a reference: rounds may outlive it) */
    struct ar_round *next;
    uint8_t id[AR_ROUND_ID_LEN];
    uint64_t step;
    int phase, timer_closed, done_called;
    unsigned refs; /* request callbacks still to come */
    struct ar_member members[AR_MAX_MEMBERS];
    size_t n_members, me;
    int i_send, i_pull;
    int in_place; /* fetched chunks go straight into buf (ar_round_config.in_place) */
    float *buf;
    size_t n;
    double weight, max_norm, max_weight;
    int comp;
    uint32_t chunk, deadline_ms, stall_ms, linger_ms;
    uint32_t start_wait_ms; /* patience with a member that has not started yet */
    unsigned window;
    size_t enc_chunk; /* encoded bytes of one full chunk */
    size_t n_parts;
    uint32_t owner[AR_MAX_MEMBERS];
    size_t off[AR_MAX_MEMBERS], len[AR_MAX_MEMBERS];
    int my_part; /* -1: I do not aggregate */
    struct ar__agg agg;
    struct ar__link link[AR_MAX_MEMBERS];
    float *scratch; /* chunk floats, for encoding averages */
    double *acc;    /* chunk doubles: the weighted sum of one chunk */
    uint8_t *encbuf; /* enc_chunk bytes, for encoding */
    int64_t t0, deadline_at, reduce_deadline_at, linger_until;
    double ms_send, ms_reduce, ms_fetch;
    uint64_t bytes_sent, bytes_received, chunks_sent, chunks_received;
    struct ar_part_report reports[AR_MAX_MEMBERS];
    size_t n_excl;
    struct ar_exclusion excl[AR_MAX_MEMBERS * 4];
    uv_timer_t timer;
    ar_done_cb done;
    void *arg;
};

/* Large arrays kept from one round to the next (ar_pool.c). The engine
 * holds one reference, each round one; blocks are kept only while the
 * engine lives. */
#define AR__POOL_SLOTS 8
/* Chunk buffers kept for reuse (the aggregator's copy of each received
 * chunk): at most this many and this many bytes, all of one size. glibc
 * serves a 128 KiB request with mmap and returns it with munmap, so a fresh
 * buffer per chunk cost a munmap and 32 page faults per received chunk. */
#define AR__POOL_SPARES 64
#define AR__POOL_SPARE_BYTES (8u << 20)
struct blk;
struct ar__pool {
    unsigned refs;
    struct blk *slot[AR__POOL_SLOTS];
    void *spare[AR__POOL_SPARES];
    size_t n_spare, spare_bytes;
};

struct ar__pool *ar__pool_new(void);
void ar__pool_ref(struct ar__pool *pl);
void ar__pool_unref(struct ar__pool *pl);
/* bytes of memory (zeroed if zero), from the pool or fresh; NULL when out
 * of memory. Give it back with ar__pool_put (NULL is ignored). */
void *ar__pool_get(struct ar__pool *pl, size_t bytes, int zero);
void ar__pool_put(struct ar__pool *pl, void *p);
/* A buffer of bytes (uninitialized): a kept one of that size, or fresh;
 * NULL when out of memory. Give it back with ar__pool_chunk_put with the
 * same size (NULL is ignored). */
void *ar__pool_chunk_get(struct ar__pool *pl, size_t bytes);
void ar__pool_chunk_put(struct ar__pool *pl, void *p, size_t bytes);

struct ar_engine {
    struct p2p_ctx *ctx;
    struct ar__pool *pool;
    struct p2p_host *host;  /* listener, chunk sends, serving */
    struct p2p_host *fhost; /* fetches only: their own connections, so big
                               results never queue ahead of chunk Acks */
    const struct cm_ed25519 *key;
    int listening;
    struct ar_round *rounds;
    uint8_t (*finished)[AR_ROUND_ID_LEN];
    size_t fin_cap, fin_len, fin_pos;
};

int64_t ar__mono_ms(void);
struct ar_round *ar__engine_find(struct ar_engine *e, const uint8_t id[AR_ROUND_ID_LEN]);
int ar__engine_finished(const struct ar_engine *e, const uint8_t id[AR_ROUND_ID_LEN]);
void ar__engine_unlink(struct ar_engine *e, struct ar_round *r);
int ar__member_of(const struct ar_round *r, const uint8_t pub[CM_ED25519_PUB_LEN]);

/* Request handlers of a round (ar_round.c); `sender` is the member index of
 * the authenticated peer. */
/* m was parsed with status parse_rc; on failure only m->part/chunk (from
 * has_round) are meaningful. body_len counts the received bytes. */
int ar__round_on_data(struct ar_round *r, int sender, const struct ar_data_msg *m, int parse_rc,
                      size_t body_len, uint8_t **resp, size_t *rlen);
int ar__round_on_fetch(struct ar_round *r, int member, const struct ar_fetch_msg *m,
                       size_t body_len, struct p2p_reply *reply);
/* Chunk geometry: chunks in a part of len elements, elements of chunk c of
 * part k. */
size_t ar__n_chunks(const struct ar_round *r, size_t len);
size_t ar__chunk_len(const struct ar_round *r, size_t k, size_t c);

/* Aggregator side (ar_agg.c). */
int ar__agg_accept(struct ar_round *r, int s, size_t c, float *x, size_t cnt, double w, int owned);
void ar__agg_complete(struct ar_round *r);
void ar__agg_finalize_scan(struct ar_round *r);
void ar__agg_drop(struct ar_round *r, int s);
/* Releases undo entry i (c * n_members + s) to the pool, unless it is my
 * own, borrowed from the buffer. */
void ar__agg_undo_free(struct ar_round *r, size_t i);
int ar__own_part_ok(const struct ar_round *r);

/* Ends a round at once (engine shutdown or cancel): done runs with status. */
void ar__round_kill(struct ar_round *r, int status);

#endif
