/* Internals of the dataset iterator shared by common/data/iter.c (queue,
 * producer, consumer) and common/data/fetch.c (downloading and verifying a
 * shard file). Not part of the public API (data/data.h). */
#ifndef CM_DATA_INTERNAL_H
#define CM_DATA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "data/data.h"

/* The decoded bytes of one shard, shared by the queue items that point into
 * it (a chunked shard is released as several items). The last reference
 * frees it and makes room for the producer to fetch another shard. */
struct sbuf {
    atomic_int refs;
    struct cm_data_iter *it;
    uint8_t *data;           /* decoded data file, or the raw file being filled (chunked) */
    uint8_t *labels;         /* decoded labels file (idx only) */
};

enum item_kind { ITEM_SHARD, ITEM_END, ITEM_FATAL };

struct item {
    enum item_kind kind;
    int rc;                  /* ITEM_FATAL */
    uint32_t shard;          /* index in the manifest */
    uint64_t epoch;
    uint64_t k0;             /* index in the shard of the first example */
    uint64_t n;              /* examples */
    struct sbuf *sb;         /* one reference, ITEM_SHARD only */
    const uint8_t *x;        /* first example: image / bytes / little-endian uint16 tokens */
    const uint8_t *y;        /* first label, idx only */
    struct item *next;
};

struct cm_data_iter {
    const struct cm_data_manifest *m;
    struct cm_data_manifest *owned_m;
    struct cm_data_options o;
    uint64_t seed;
    size_t width;            /* pixels per image, or T+1 tokens per window */
    size_t rec_bytes;        /* bytes per record in the shuffle buffer */
    size_t stride;           /* bytes from one example's start to the next in a shard */
    float lut[256];          /* pixel -> normalized float */

    /* producer/consumer queue */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_room, cv_get;
    struct item *head, *tail;
    unsigned live_shards;    /* shard buffers alive (queued, in use or downloading) */
    atomic_int stop;

    /* stats, under mu */
    struct cm_data_stats st;

    /* consumer state (consumer thread only) */
    struct item *cur;
    uint64_t cur_pos;
    int failed;              /* sticky error */
    int deferred;            /* eval: error to report after the examples before it */
    int ended;               /* eval: END seen */
    uint8_t *buf;            /* shuffle buffer: S records */
    uint64_t *buf_ids;
    uint32_t *buf_epochs;
    size_t buf_count;
    int buf_filled;
    uint64_t rng;            /* shuffle-buffer draws */
    uint8_t *scratch;        /* one record (eval mode) */
    struct item *reserve;    /* an ITEM_FATAL/ENOMEM marker for when malloc fails */

    /* text-docs: the tokenizer (producer thread only) and its special ids */
    struct cm_spm *spm;
    uint16_t cls, sep, pad;
    int mask;                /* -1: the model has no [MASK] */
};

/* Download state of a shard with chunk hashes. */
struct chunked {
    struct sbuf *sb;
    uint32_t shard;
    uint64_t epoch;
    uint32_t verified;       /* chunks verified so far */
    uint64_t released;       /* windows queued so far */
    uint64_t total;          /* windows in the whole shard, once known */
    int header_ok;           /* tokens-u16: header parsed */
};

/* iter.c */
void cm_data__set_error(struct cm_data_iter *it, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Queues examples [k0, k0 + n) of a shard; x and y point at example k0. */
int cm_data__push_examples(struct cm_data_iter *it, struct sbuf *sb, uint32_t shard,
                           uint64_t epoch, uint64_t k0, uint64_t n, const uint8_t *x,
                           const uint8_t *y);

/* fetch.c */
/* Downloads and verifies one file into buf (f->size bytes, caller-owned),
 * releasing examples chunk by chunk when ck is given; retries network
 * failures while nothing of the file has been released. */
int cm_data__fetch_retrying(struct cm_data_iter *it, const struct cm_data_file *f,
                            const char *what, uint8_t *buf, struct chunked *ck);
/* Downloads, verifies and decompresses one whole file into a new buffer. */
int cm_data__fetch_whole(struct cm_data_iter *it, const struct cm_data_file *f,
                         const char *what, uint8_t **out, size_t *out_len);

#endif
