/* Dataset iterator: shard order, bounded queue, shuffle buffer, consumer.
 *
 * One producer thread per iterator walks the shards in a per-peer random
 * order (a new permutation each epoch, derived from the seed) and has each
 * file downloaded and verified by fetch.c: a shard's examples are released
 * only after its size and SHA-256 match the manifest ("verify-then-release"),
 * or chunk by chunk when the manifest carries chunk hashes (docs/data.md
 * explains both). Verified shards wait in a queue whose memory is bounded by
 * counting live shard buffers (prefetch_shards); the consumer takes examples
 * from the queue into a shuffle buffer of S examples and draws random
 * examples from it, replacing each with the next one to arrive
 * (seed 000_02cc6b5d62a616fc.txt, §3.3 and Appendix H.3).
 *
 * Determinism: the producer is sequential and the queue keeps its order, so
 * the consumer sees the same example sequence whatever the timing; only a
 * shard skipped after a network failure can change it (logged, counted).
 * Nothing waits forever: transfers have connect, low-speed and optional
 * total deadlines, and close() aborts a transfer in progress. */
#include "data/data.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"
#include "data/data_internal.h"
#include "data/spm.h"

/* ---- Random numbers: splitmix64 (enough for shuffling, and seedable) ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    /* The modulo bias is below n / 2^64: negligible for buffer and shard counts. */
    return splitmix64(s) % n;
}

static struct sbuf *sbuf_new(struct cm_data_iter *it)
{
    struct sbuf *sb = calloc(1, sizeof *sb);
    if (!sb)
        return NULL;
    atomic_init(&sb->refs, 1);
    sb->it = it;
    pthread_mutex_lock(&it->mu);
    it->live_shards++;
    pthread_mutex_unlock(&it->mu);
    return sb;
}

static void sbuf_unref(struct sbuf *sb)
{
    if (!sb || atomic_fetch_sub(&sb->refs, 1) != 1)
        return;
    struct cm_data_iter *it = sb->it;
    free(sb->data);
    free(sb->labels);
    free(sb);
    pthread_mutex_lock(&it->mu);
    it->live_shards--;
    pthread_cond_signal(&it->cv_room);
    pthread_mutex_unlock(&it->mu);
}

static void item_free(struct item *t)
{
    if (!t)
        return;
    sbuf_unref(t->sb);
    free(t);
}

void cm_data_options_init(struct cm_data_options *o)
{
    memset(o, 0, sizeof *o);
    o->mode = CM_DATA_TRAIN;
    o->shuffle_size = 10000;
    o->max_shard_bytes = 512ull << 20;
    o->prefetch_shards = 2;
    o->connect_timeout_s = 15;
    o->low_speed_bytes = 1024;
    o->low_speed_time_s = 30;
    o->transfer_timeout_s = 0;
    o->retries = 2;
    o->skip_bad_shards = 1;
}

void cm_data__set_error(struct cm_data_iter *it, const char *fmt, ...)
{
    char msg[sizeof it->st.last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    CM_LOGE("data", "%s: %s", it->m->name, msg);
    pthread_mutex_lock(&it->mu);
    memcpy(it->st.last_error, msg, sizeof msg);
    pthread_mutex_unlock(&it->mu);
}

/* ---- Queue --------------------------------------------------------------- */

/* Never blocks: memory is bounded by the number of live shard buffers (see
 * wait_for_room), and a chunked shard must be able to release examples
 * from inside a transfer without stalling it. Returns -1 when closing (t is
 * freed then). */
static int queue_put(struct cm_data_iter *it, struct item *t)
{
    pthread_mutex_lock(&it->mu);
    if (atomic_load(&it->stop)) {
        pthread_mutex_unlock(&it->mu);
        item_free(t);
        return -1;
    }
    if (it->tail)
        it->tail->next = t;
    else
        it->head = t;
    it->tail = t;
    pthread_cond_signal(&it->cv_get);
    pthread_mutex_unlock(&it->mu);
    return 0;
}

static struct item *queue_get(struct cm_data_iter *it)
{
    pthread_mutex_lock(&it->mu);
    while (!it->head)
        pthread_cond_wait(&it->cv_get, &it->mu);
    struct item *t = it->head;
    it->head = t->next;
    if (!it->head)
        it->tail = NULL;
    pthread_mutex_unlock(&it->mu);
    t->next = NULL;
    return t;
}

static void put_marker(struct cm_data_iter *it, enum item_kind kind, int rc)
{
    struct item *t = calloc(1, sizeof *t);
    if (t) {
        t->kind = kind;
        t->rc = rc;
    } else {
        /* The marker reserved at open time still tells the consumer to stop waiting. */
        CM_LOGE("data", "out of memory in the shard thread");
        t = it->reserve;
        it->reserve = NULL;
    }
    queue_put(it, t);
}

int cm_data__push_examples(struct cm_data_iter *it, struct sbuf *sb, uint32_t shard, uint64_t epoch,
                           uint64_t k0, uint64_t n, const uint8_t *x, const uint8_t *y)
{
    struct item *t = calloc(1, sizeof *t);
    if (!t)
        return CM_ENOMEM;
    atomic_fetch_add(&sb->refs, 1);
    *t = (struct item){.kind = ITEM_SHARD,
                       .shard = shard,
                       .epoch = epoch,
                       .k0 = k0,
                       .n = n,
                       .sb = sb,
                       .x = x,
                       .y = y};
    return queue_put(it, t) == 0 ? CM_OK : CM_ECLOSED;
}

/* ---- Decoding a whole verified shard ------------------------------------ */

static int spm_enc(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n)
{
    return cm_spm_encode(ctx, text, len, ids, cap, n, NULL, 0);
}

/* text-docs: tokenize the shard and build its sentence pairs, different for
 * every epoch (the records go where idx labels would, freed with sb). */
static int decode_docs(struct cm_data_iter *it, struct sbuf *sb, size_t dlen, const char *url,
                       uint32_t shard, uint64_t epoch, uint64_t *n, const uint8_t **x)
{
    struct cm_data_docs d;
    char err[160];
    int rc = cm_data_docs_tokenize(sb->data, dlen, spm_enc, it->spm, &d, err, sizeof err);
    if (rc != CM_OK) {
        cm_data__set_error(it, "%s: %s", url, err);
        return rc;
    }
    struct cm_data_sop_spec sp = {.T = it->o.seq_len, .cls = it->cls, .sep = it->sep, .pad = it->pad};
    uint64_t s = it->seed ^ 0x7e57d0c5ull, e = epoch * 0x100000001b3ull + shard;
    s ^= splitmix64(&e);
    uint16_t *rec = NULL;
    size_t cnt = 0;
    rc = cm_data_sop_build(&d, &sp, s, &rec, &cnt);
    cm_data_docs_free(&d);
    if (rc != CM_OK) {
        cm_data__set_error(it, "%s: building sentence pairs: %s", url, cm_strerror(rc));
        return rc;
    }
    free(sb->labels);
    sb->labels = (uint8_t *)rec;
    *n = cnt;
    *x = sb->labels;
    return CM_OK;
}

/* text-docs: fetches and checks the manifest's tokenizer (producer thread). */
static int load_tokenizer(struct cm_data_iter *it)
{
    const struct cm_data_manifest *m = it->m;
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[200];
    int rc = cm_data__fetch_whole(it, &m->tokenizer, "tokenizer", &buf, &len);
    if (rc != CM_OK)
        return rc;
    rc = cm_spm_load_mem(buf, len, &it->spm, err, sizeof err);
    free(buf);
    if (rc != CM_OK) {
        cm_data__set_error(it, "%s: %s", m->tokenizer.url, err);
        return rc;
    }
    int V = cm_spm_vocab_size(it->spm);
    if ((uint32_t)V != m->vocab_size) {
        cm_data__set_error(it, "%s: the tokenizer has %d pieces, the manifest says vocab_size %u",
                           m->tokenizer.url, V, m->vocab_size);
        return CM_ERANGE;
    }
    const char *names[] = {"[CLS]", "[SEP]", "<pad>"};
    uint16_t *ids[] = {&it->cls, &it->sep, &it->pad};
    for (int i = 0; i < 3; i++) {
        int id = cm_spm_piece_id(it->spm, names[i]);
        if (id < 0) {
            cm_data__set_error(it, "%s: the tokenizer has no %s piece (scripts/train-tokenizer.sh "
                                   "makes one that does)",
                               m->tokenizer.url, names[i]);
            return CM_EPARSE;
        }
        *ids[i] = (uint16_t)id;
    }
    it->mask = cm_spm_piece_id(it->spm, "[MASK]");
    return CM_OK;
}

int cm_data_specials(const struct cm_data_iter *it, struct cm_data_specials *out)
{
    if (!it || !out || it->m->format != CM_DATA_TEXT_DOCS)
        return CM_EINVAL;
    /* the producer sets them before it queues any example; the queue's lock
       orders that before the consumer's first example */
    if (!it->st.examples)
        return CM_ESTATE;
    *out = (struct cm_data_specials){it->cls, it->sep, it->pad, it->mask};
    return CM_OK;
}

static int decode_shard(struct cm_data_iter *it, struct sbuf *sb, size_t dlen, size_t llen,
                        const char *url, const char *lurl, uint32_t shard, uint64_t epoch,
                        uint64_t *n, const uint8_t **x, const uint8_t **y)
{
    const struct cm_data_manifest *m = it->m;
    int rc;
    if (m->format == CM_DATA_TEXT_DOCS) {
        *y = NULL;
        return decode_docs(it, sb, dlen, url, shard, epoch, n, x);
    }
    if (m->format == CM_DATA_IDX_IMAGES) {
        struct cm_data_idx im, lb;
        if ((rc = cm_data_idx_parse(sb->data, dlen, &im)) != CM_OK) {
            cm_data__set_error(it, "%s: not a valid IDX images file", url);
            return rc;
        }
        if ((rc = cm_data_idx_parse(sb->labels, llen, &lb)) != CM_OK) {
            cm_data__set_error(it, "%s: not a valid IDX labels file", lurl);
            return rc;
        }
        if (im.ndim != 3 || im.dims[1] != m->rows || im.dims[2] != m->cols) {
            cm_data__set_error(it, "%s: images are not (N, %u, %u)", url, m->rows, m->cols);
            return CM_EPARSE;
        }
        if (lb.ndim != 1 || lb.dims[0] != im.dims[0]) {
            cm_data__set_error(it, "%s: %u labels for %u images", url, lb.dims[0], im.dims[0]);
            return CM_EPARSE;
        }
        for (uint64_t i = 0; i < lb.count; i++)
            if (lb.data[i] >= m->classes) {
                cm_data__set_error(it, "%s: label %u at %" PRIu64 " is not below classes=%u", lurl,
                                   lb.data[i], i, m->classes);
                return CM_ERANGE;
            }
        *n = im.dims[0];
        *x = im.data;
        *y = lb.data;
        return CM_OK;
    }
    uint64_t ntok;
    if (m->format == CM_DATA_TOKENS_U16) {
        struct cm_data_tokens tk;
        if ((rc = cm_data_tokens_parse(sb->data, dlen, &tk)) != CM_OK) {
            cm_data__set_error(it, "%s: not a valid llm.c token shard", url);
            return rc;
        }
        for (uint64_t i = 0; i < tk.count; i++) {
            unsigned v = tk.tokens[2 * i] | (unsigned)tk.tokens[2 * i + 1] << 8;
            if (v >= m->vocab_size) {
                cm_data__set_error(it, "%s: token %u at %" PRIu64 " is not below vocab_size=%u",
                                   url, v, i, m->vocab_size);
                return CM_ERANGE;
            }
        }
        *x = tk.tokens;
        ntok = tk.count;
    } else {
        *x = sb->data;
        ntok = dlen;
    }
    /* Windows of T+1 tokens at stride T: window k is tokens [kT, kT+T]. */
    size_t T = it->o.seq_len;
    *n = ntok > T ? (ntok - 1) / T : 0;
    *y = NULL;
    return CM_OK;
}

/* Fetches, verifies and queues one shard. *released counts the examples
 * queued (a chunked shard may queue some and then fail). */
static int load_shard(struct cm_data_iter *it, uint32_t idx, uint64_t epoch, uint64_t *released)
{
    const struct cm_data_shard *s = &it->m->shards[idx];
    *released = 0;
    struct sbuf *sb = sbuf_new(it);
    if (!sb)
        return CM_ENOMEM;
    int rc;
    if (s->data.chunk_size) {
        struct chunked ck = {.sb = sb, .shard = idx, .epoch = epoch};
        sb->data = malloc(s->data.size);
        rc = sb->data ? cm_data__fetch_retrying(it, &s->data, "shard", sb->data, &ck) : CM_ENOMEM;
        *released = ck.released;
    } else {
        size_t dlen = 0, llen = 0;
        uint64_t n = 0;
        const uint8_t *x = NULL, *y = NULL;
        rc = cm_data__fetch_whole(it, &s->data, "shard", &sb->data, &dlen);
        if (rc == CM_OK && s->labels.url)
            rc = cm_data__fetch_whole(it, &s->labels, "labels", &sb->labels, &llen);
        if (rc == CM_OK)
            rc = decode_shard(it, sb, dlen, llen, s->data.url, s->labels.url, idx, epoch, &n, &x,
                              &y);
        if (rc == CM_OK && s->examples && s->examples != n) {
            cm_data__set_error(it, "%s: %" PRIu64 " examples, the manifest declares %" PRIu64,
                               s->data.url, n, s->examples);
            rc = CM_EPARSE;
        }
        if (rc == CM_OK && n > 0 &&
            (rc = cm_data__push_examples(it, sb, idx, epoch, 0, n, x, y)) == CM_OK)
            *released = n;
    }
    sbuf_unref(sb);
    return rc;
}

/* ---- Producer thread ---------------------------------------------------- */

/* Bounds memory: at most prefetch_shards shard buffers waiting or in use,
 * plus the one being downloaded. */
static int wait_for_room(struct cm_data_iter *it)
{
    pthread_mutex_lock(&it->mu);
    while (it->live_shards > it->o.prefetch_shards && !atomic_load(&it->stop))
        pthread_cond_wait(&it->cv_room, &it->mu);
    pthread_mutex_unlock(&it->mu);
    return atomic_load(&it->stop) ? -1 : 0;
}

static void shard_order(const struct cm_data_iter *it, uint64_t epoch, uint32_t *order)
{
    size_t n = it->m->n_shards;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    if (it->o.mode == CM_DATA_EVAL)
        return;
    /* Each peer (seed) and each epoch gets its own permutation (seed 000, H.3). */
    uint64_t s = it->seed ^ 0x5eed0fda7aull;
    uint64_t e = epoch;
    s ^= splitmix64(&e);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)rng_below(&s, i + 1);
        uint32_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

static void *producer(void *arg)
{
    struct cm_data_iter *it = arg;
    size_t n = it->m->n_shards;
    uint32_t *order = malloc(n * sizeof *order);
    if (!order) {
        put_marker(it, ITEM_FATAL, CM_ENOMEM);
        return NULL;
    }
    if (it->m->format == CM_DATA_TEXT_DOCS) {
        int rc = load_tokenizer(it);
        if (rc != CM_OK) {
            if (rc != CM_ECLOSED && !atomic_load(&it->stop))
                put_marker(it, ITEM_FATAL, rc);
            free(order);
            return NULL;
        }
    }
    for (uint64_t epoch = 0; !atomic_load(&it->stop); epoch++) {
        shard_order(it, epoch, order);
        uint64_t usable = 0;
        int last_rc = CM_OK;
        for (size_t k = 0; k < n; k++) {
            if (wait_for_room(it) != 0)
                goto out;
            uint64_t got = 0;
            int rc = load_shard(it, order[k], epoch, &got);
            if (rc == CM_ECLOSED || atomic_load(&it->stop))
                goto out;
            usable += got;
            pthread_mutex_lock(&it->mu);
            if (rc == CM_OK)
                it->st.shards_ok++;
            else
                it->st.shards_rejected++;
            pthread_mutex_unlock(&it->mu);
            if (rc != CM_OK) {
                last_rc = rc;
                if (it->o.mode == CM_DATA_EVAL || !it->o.skip_bad_shards) {
                    put_marker(it, ITEM_FATAL, rc);
                    goto out;
                }
                CM_LOGW("data", "%s: skipping shard %u (%s)", it->m->name, order[k],
                        cm_strerror(rc));
            } else if (got == 0) {
                CM_LOGW("data", "%s: shard %u holds no complete example", it->m->name, order[k]);
            }
        }
        if (it->o.mode == CM_DATA_EVAL) {
            put_marker(it, ITEM_END, CM_OK);
            break;
        }
        if (usable == 0) {
            /* An endless loop over shards that yield nothing would hang the trainer. */
            if (last_rc == CM_OK) {
                cm_data__set_error(it,
                                   "no shard holds a complete example (sequence length too long?)");
                last_rc = CM_ERANGE;
            }
            put_marker(it, ITEM_FATAL, last_rc);
            break;
        }
    }
out:
    free(order);
    return NULL;
}

/* ---- Consumer ----------------------------------------------------------- */

/* Copies the next example of the stream into rec; 1 at the end (eval), a
 * negative code on failure. */
static int pull(struct cm_data_iter *it, uint8_t *rec, uint64_t *id, uint32_t *epoch)
{
    while (!it->cur || it->cur_pos >= it->cur->n) {
        item_free(it->cur);
        it->cur = NULL;
        if (it->ended)
            return 1;
        struct item *t = queue_get(it);
        if (t->kind == ITEM_END) {
            item_free(t);
            it->ended = 1;
            return 1;
        }
        if (t->kind == ITEM_FATAL) {
            int rc = t->rc ? t->rc : CM_EIO;
            item_free(t);
            return rc;
        }
        it->cur = t;
        it->cur_pos = 0;
    }
    struct item *t = it->cur;
    uint64_t k = it->cur_pos++;
    *id = (uint64_t)t->shard << 32 | (t->k0 + k);
    *epoch = (uint32_t)t->epoch;
    const uint8_t *p = t->x + k * it->stride;
    if (it->m->format == CM_DATA_IDX_IMAGES) {
        memcpy(rec, p, it->width);
        rec[it->width] = t->y[k];
    } else if (it->m->format == CM_DATA_TEXT_DOCS) {
        memcpy(rec, p, it->rec_bytes); /* T tokens and the label, native uint16 */
    } else {
        uint16_t *r = (uint16_t *)(void *)rec;
        size_t T = it->o.seq_len;
        if (it->m->format == CM_DATA_TEXT_BYTES) {
            for (size_t i = 0; i <= T; i++)
                r[i] = p[i];
        } else {
            for (size_t i = 0; i <= T; i++)
                r[i] = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        }
    }
    return 0;
}

static void emit(struct cm_data_iter *it, const uint8_t *rec, uint64_t id, uint32_t epoch,
                 struct cm_data_batch *b, size_t slot)
{
    size_t w = it->width;
    if (it->m->format == CM_DATA_IDX_IMAGES) {
        if (b->x)
            for (size_t i = 0; i < w; i++)
                b->x[slot * w + i] = it->lut[rec[i]];
        if (b->y)
            b->y[slot] = rec[w];
    } else if (it->m->format == CM_DATA_TEXT_DOCS) {
        const uint16_t *r = (const uint16_t *)(const void *)rec;
        size_t T = w - 1;
        int seg = 0, seps = 0;
        for (size_t i = 0; i < T; i++) {
            if (b->tokens)
                b->tokens[slot * w + i] = r[i];
            if (b->tokens_u16)
                b->tokens_u16[slot * w + i] = r[i];
            if (b->segments)
                b->segments[slot * T + i] = seps < 2 ? seg : 0;
            if (r[i] == it->sep && seps < 2 && ++seps == 1)
                seg = 1;
        }
        if (b->tokens)
            b->tokens[slot * w + T] = it->pad;
        if (b->tokens_u16)
            b->tokens_u16[slot * w + T] = it->pad;
        if (b->sop)
            b->sop[slot] = r[T];
    } else {
        const uint16_t *r = (const uint16_t *)(const void *)rec;
        if (b->tokens)
            for (size_t i = 0; i < w; i++)
                b->tokens[slot * w + i] = r[i];
        if (b->tokens_u16)
            memcpy(b->tokens_u16 + slot * w, r, w * sizeof *r);
    }
    if (b->ids)
        b->ids[slot] = id;
    if (b->epochs)
        b->epochs[slot] = epoch;
}

static void count_out(struct cm_data_iter *it, size_t n, uint32_t last_epoch)
{
    pthread_mutex_lock(&it->mu);
    it->st.examples += n;
    if (n)
        it->st.epoch = last_epoch;
    pthread_mutex_unlock(&it->mu);
}

int cm_data_next_batch(struct cm_data_iter *it, struct cm_data_batch *b)
{
    if (!it || !b)
        return CM_EINVAL;
    b->n = 0;
    if (it->failed)
        return it->failed;
    if (it->deferred)
        return it->failed = it->deferred;
    int idx = it->m->format == CM_DATA_IDX_IMAGES;
    if (idx ? (!b->x && !b->y) : (!b->tokens && !b->tokens_u16))
        return CM_EINVAL;
    uint32_t last_epoch = 0;
    if (it->o.mode == CM_DATA_EVAL) {
        size_t i;
        for (i = 0; i < b->capacity; i++) {
            uint64_t id;
            uint32_t ep;
            int rc = pull(it, it->scratch, &id, &ep);
            if (rc == 1)
                break;
            if (rc < 0) {
                /* Hand out the good examples already copied; fail on the next call. */
                if (i == 0) {
                    count_out(it, 0, last_epoch);
                    return it->failed = rc;
                }
                it->deferred = rc;
                break;
            }
            emit(it, it->scratch, id, ep, b, i);
            last_epoch = ep;
        }
        b->n = i;
        count_out(it, i, last_epoch);
        return CM_OK;
    }
    size_t S = it->o.shuffle_size, R = it->rec_bytes;
    while (!it->buf_filled) {
        size_t k = it->buf_count;
        int rc = pull(it, it->buf + k * R, &it->buf_ids[k], &it->buf_epochs[k]);
        if (rc != 0)
            return it->failed = rc < 0 ? rc : CM_EINTERNAL;
        if (++it->buf_count == S)
            it->buf_filled = 1;
    }
    for (size_t i = 0; i < b->capacity; i++) {
        size_t j = (size_t)rng_below(&it->rng, S);
        emit(it, it->buf + j * R, it->buf_ids[j], it->buf_epochs[j], b, i);
        last_epoch = it->buf_epochs[j];
        /* Replace the drawn example with the next one to arrive (seed 000, §3.3). */
        int rc = pull(it, it->buf + j * R, &it->buf_ids[j], &it->buf_epochs[j]);
        if (rc != 0) {
            count_out(it, i + 1, last_epoch);
            return it->failed = rc < 0 ? rc : CM_EINTERNAL;
        }
    }
    b->n = b->capacity;
    count_out(it, b->n, last_epoch);
    return CM_OK;
}

int cm_data_skip(struct cm_data_iter *it, uint64_t n)
{
    if (!it)
        return CM_EINVAL;
    /* Draw into a small batch of ids only: emit() copies nothing else when
     * the data pointers are NULL, but next_batch wants one of them set. */
    enum { CHUNK = 256 };
    uint64_t ids[CHUNK];
    int32_t y[CHUNK];
    uint16_t *tok = NULL;
    struct cm_data_batch b = {.ids = ids};
    if (it->m->format == CM_DATA_IDX_IMAGES) {
        b.y = y;
    } else {
        tok = malloc(CHUNK * it->width * sizeof *tok);
        if (!tok)
            return CM_ENOMEM;
        b.tokens_u16 = tok;
    }
    int rc = CM_OK;
    while (n > 0) {
        b.capacity = n < CHUNK ? (size_t)n : CHUNK;
        if ((rc = cm_data_next_batch(it, &b)) != CM_OK)
            break;
        if (b.n == 0)
            break; /* eval: the pass ended first */
        n -= b.n;
    }
    free(tok);
    return rc;
}

/* ---- Open / close -------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_ok;
static void curl_init_once(void)
{
    curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

int cm_data_open(const struct cm_data_manifest *m, uint64_t seed, const struct cm_data_options *o,
                 struct cm_data_iter **out)
{
    if (!m || !out || !m->n_shards)
        return CM_EINVAL;
    *out = NULL;
    struct cm_data_options opt;
    if (o)
        opt = *o;
    else
        cm_data_options_init(&opt);
    if (opt.mode != CM_DATA_TRAIN && opt.mode != CM_DATA_EVAL)
        return CM_EINVAL;
    if (m->format != CM_DATA_IDX_IMAGES && (opt.seq_len == 0 || opt.seq_len > (1u << 24))) {
        CM_LOGE("data", "%s: seq_len must be 1..%u for %s", m->name, 1u << 24,
                cm_data_format_name(m->format));
        return CM_EINVAL;
    }
    if (m->format == CM_DATA_TEXT_DOCS && (opt.seq_len < 8 || opt.seq_len > 65536)) {
        CM_LOGE("data", "%s: seq_len must be 8..65536 for text-docs ([CLS] A [SEP] B [SEP])",
                m->name);
        return CM_EINVAL;
    }
    if (opt.mode == CM_DATA_TRAIN && (opt.shuffle_size == 0 || opt.shuffle_size > (1u << 26)))
        return CM_EINVAL;
    if (opt.prefetch_shards == 0)
        opt.prefetch_shards = 1;
    if (opt.max_shard_bytes == 0)
        return CM_EINVAL;
    for (size_t i = 0; i < m->n_shards; i++) {
        const struct cm_data_shard *s = &m->shards[i];
        if (s->data.size > opt.max_shard_bytes ||
            (s->labels.url && s->labels.size > opt.max_shard_bytes)) {
            CM_LOGE("data", "%s: shard %zu (%s) is larger than max_shard_bytes=%" PRIu64, m->name,
                    i, s->data.url, opt.max_shard_bytes);
            return CM_ETOOBIG;
        }
    }
    if (opt.cache_dir) {
        if (strlen(opt.cache_dir) > 4000)
            return CM_EINVAL;
        if (mkdir(opt.cache_dir, 0755) != 0 && errno != EEXIST)
            CM_LOGW("data", "cache directory %s: %s (continuing without)", opt.cache_dir,
                    strerror(errno));
    }
    pthread_once(&curl_once, curl_init_once);
    if (!curl_ok)
        return CM_EINTERNAL;
    struct cm_data_iter *it = calloc(1, sizeof *it);
    if (!it)
        return CM_ENOMEM;
    it->m = m;
    it->o = opt;
    it->seed = seed;
    uint64_t s = seed ^ 0xb0ffe75ull;
    it->rng = splitmix64(&s);
    if (m->format == CM_DATA_IDX_IMAGES) {
        it->width = (size_t)m->rows * m->cols;
        it->stride = it->width;
        it->rec_bytes = it->width + 1;
        for (int v = 0; v < 256; v++)
            it->lut[v] = ((float)v / 255.0f - m->mean) / m->std;
    } else if (m->format == CM_DATA_TEXT_DOCS) {
        it->width = opt.seq_len + 1; /* T tokens, then the sentence-order label */
        it->stride = 2 * it->width;
        it->rec_bytes = 2 * it->width;
    } else {
        it->width = opt.seq_len + 1;
        it->stride = m->format == CM_DATA_TOKENS_U16 ? 2 * opt.seq_len : opt.seq_len;
        it->rec_bytes = 2 * it->width;
    }
    size_t S = opt.mode == CM_DATA_TRAIN ? opt.shuffle_size : 0;
    it->scratch = malloc(it->rec_bytes);
    it->reserve = calloc(1, sizeof *it->reserve);
    if (it->reserve) {
        it->reserve->kind = ITEM_FATAL;
        it->reserve->rc = CM_ENOMEM;
    }
    if (S) {
        it->buf = malloc(S * it->rec_bytes);
        it->buf_ids = malloc(S * sizeof *it->buf_ids);
        it->buf_epochs = malloc(S * sizeof *it->buf_epochs);
    }
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->cv_room, NULL);
    pthread_cond_init(&it->cv_get, NULL);
    if (!it->scratch || !it->reserve || (S && (!it->buf || !it->buf_ids || !it->buf_epochs))) {
        cm_data_close(it);
        return CM_ENOMEM;
    }
    if (pthread_create(&it->thread, NULL, producer, it) != 0) {
        cm_data_close(it);
        return CM_ENOMEM;
    }
    it->thread_started = 1;
    *out = it;
    return CM_OK;
}

int cm_data_open_file(const char *manifest_path, uint64_t seed, const struct cm_data_options *o,
                      struct cm_data_iter **out)
{
    struct cm_data_manifest *m;
    char err[256];
    int rc = cm_data_manifest_load(manifest_path, &m, err, sizeof err);
    if (rc != CM_OK) {
        CM_LOGE("data", "%s", err);
        return rc;
    }
    rc = cm_data_open(m, seed, o, out);
    if (rc != CM_OK) {
        cm_data_manifest_free(m);
        return rc;
    }
    (*out)->owned_m = m;
    return CM_OK;
}

size_t cm_data_example_width(const struct cm_data_iter *it)
{
    return it ? it->width : 0;
}

const struct cm_data_manifest *cm_data_iter_manifest(const struct cm_data_iter *it)
{
    return it ? it->m : NULL;
}

void cm_data_get_stats(struct cm_data_iter *it, struct cm_data_stats *st)
{
    pthread_mutex_lock(&it->mu);
    *st = it->st;
    pthread_mutex_unlock(&it->mu);
}

void cm_data_close(struct cm_data_iter *it)
{
    if (!it)
        return;
    atomic_store(&it->stop, 1);
    pthread_mutex_lock(&it->mu);
    pthread_cond_broadcast(&it->cv_room);
    pthread_cond_broadcast(&it->cv_get);
    pthread_mutex_unlock(&it->mu);
    if (it->thread_started)
        pthread_join(it->thread, NULL);
    while (it->head) {
        struct item *t = it->head;
        it->head = t->next;
        item_free(t);
    }
    item_free(it->cur);
    item_free(it->reserve);
    pthread_cond_destroy(&it->cv_room);
    pthread_cond_destroy(&it->cv_get);
    pthread_mutex_destroy(&it->mu);
    free(it->buf);
    free(it->buf_ids);
    free(it->buf_epochs);
    free(it->scratch);
    cm_spm_free(it->spm);
    cm_data_manifest_free(it->owned_m);
    free(it);
}
