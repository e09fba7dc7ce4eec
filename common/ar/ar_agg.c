/* The aggregator side of a round (ar.h, ar_round.c): validates each chunk a
 * sender delivers and keeps it, finalizes a chunk when every sender still in
 * the round delivered it (average = sum of the kept chunks weighted by the
 * senders' sample counts, in double precision and member order, / weight of
 * the senders counted), encodes it once and serves it to the members (seed
 * 000_02cc6b5d62a616fc.txt, section 3.2: "receiver nodes accumulate the
 * gradients from all senders and return the average"; DESIGN.md, "Security":
 * gradients are checked before use, a sender of garbage is dropped and
 * reported). */
#include "ar/ar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"
#include "cm_err.h"
#include "cm_log.h"

#define BIT(i) (1ull << (i))

/* The per-element loops of the aggregator, vectorized by the compiler
 * (-O3, see module.mk), with an AVX2 clone on x86-64 chosen at load time:
 * the same operations in the same order per element, so the results are
 * bit-identical whichever runs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AR_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define AR_KERNEL
#endif

/* acc = w x (first) or acc += w x, in double. */
AR_KERNEL static void acc_add(double *restrict acc, const float *restrict x, double w, size_t n,
                              int first)
{
    if (first)
        for (size_t i = 0; i < n; i++)
            acc[i] = w * (double)x[i];
    else
        for (size_t i = 0; i < n; i++)
            acc[i] += w * (double)x[i];
}

/* out = acc / w rounded to fp32. */
AR_KERNEL static void acc_div(float *restrict out, const double *restrict acc, double w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(acc[i] / w);
}

/* Sum of squares in double, eight partial sums (a fixed order, so the same
 * value on every CPU); non-finite iff some value is. */
AR_KERNEL static double sum_sq(const float *x, size_t n)
{
    double acc[8] = {0}, ss = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            acc[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    for (size_t j = 0; j < 8; j++)
        ss += acc[j];
    return ss;
}

int ar__own_part_ok(const struct ar_round *r)
{
    const struct ar__agg *a = &r->agg;
    if (a->n_final != a->n_chunks)
        return 0;
    for (size_t c = 0; c < a->n_chunks; c++)
        if (a->final[c] != 1)
            return 0;
    return 1;
}

static int excl_status(int reason)
{
    switch (reason) {
    case AR_EXCL_NONFINITE:
    case AR_EXCL_NORM:
        return CM_ENUMERIC;
    case AR_EXCL_SIZE:
        return CM_ERANGE;
    case AR_EXCL_WEIGHT:
        return CM_EINVAL;
    default:
        return CM_EPARSE;
    }
}

/* Excludes sender s from my part and answers with the matching status. */
static int exclude(struct ar_round *r, int s, int reason)
{
    struct ar__agg *a = &r->agg;
    struct ar__sender *sd = &a->snd[s];
    if (sd->state != AR__S_EXCLUDED) {
        CM_LOGW("ar", "step %llu part %zu: member %d excluded (%s)", (unsigned long long)r->step,
                a->part, s, ar_excl_reason_name(reason));
        sd->state = AR__S_EXCLUDED;
        sd->reason = reason;
        a->excluded |= BIT(s);
        /* Its contribution leaves every chunk not yet final (those already
         * returned to members cannot be taken back): nothing is summed
         * before a chunk is final, so dropping its copy is enough. */
        for (size_t c = 0; c < a->n_chunks; c++) {
            if (a->final[c] || !(a->recv[c] & BIT(s)))
                continue;
            a->recv[c] &= ~BIT(s);
            ar__agg_undo_free(r, c * r->n_members + (size_t)s);
            /* The weight is recounted from who is left, not subtracted, so
             * a chunk nobody is left in has exactly zero weight. */
            a->cw[c] = 0;
            for (size_t m = 0; m < r->n_members; m++)
                if (a->recv[c] & BIT(m))
                    a->cw[c] += a->snd[m].weight;
        }
        if (a->n_excl < AR_MAX_MEMBERS)
            a->excl[a->n_excl++] = (struct ar_exclusion){(uint32_t)s, (uint32_t)a->part, reason};
        ar__agg_finalize_scan(r);
    }
    return excl_status(reason);
}

void ar__agg_drop(struct ar_round *r, int s)
{
    struct ar__agg *a = &r->agg;
    if (a->snd[s].state != AR__S_ACTIVE)
        return;
    CM_LOGI("ar", "round %02x%02x%02x%02x part %zu: sender %d dropped (silent or late)", r->id[0],
            r->id[1], r->id[2], r->id[3], a->part, s);
    a->snd[s].state = AR__S_DROPPED;
    a->dropped |= BIT(s);
    ar__agg_finalize_scan(r);
}

/* The whole part is final: the owner's own buffer gets exactly the bytes
 * the others fetch, so every member ends bit-identical (in place, each
 * chunk got them when it became final). */
void ar__agg_complete(struct ar_round *r)
{
    struct ar__agg *a = &r->agg;
    r->ms_reduce = (double)(ar__mono_ms() - r->t0);
    if (!r->buf || r->in_place || !ar__own_part_ok(r))
        return;
    for (size_t c = 0; c < a->n_chunks; c++) {
        size_t cnt = ar__chunk_len(r, a->part, c);
        ar_codec_decode(r->comp, a->res + c * r->enc_chunk, ar_codec_size(r->comp, cnt), cnt,
                        r->buf + a->offset + c * r->chunk);
    }
}

static void finalize_chunk(struct ar_round *r, size_t c)
{
    struct ar__agg *a = &r->agg;
    if (a->final[c])
        return;
    for (size_t s = 0; s < r->n_members; s++)
        if ((a->senders & BIT(s)) && a->snd[s].state == AR__S_ACTIVE && !(a->recv[c] & BIT(s)))
            return; /* still waiting for s */
    size_t cnt = ar__chunk_len(r, a->part, c);
    double w = a->cw[c];
    if (!(w > 0)) {
        a->final[c] = 2; /* nobody's gradient arrived for this chunk */
    } else {
        /* Weighted sum in double, in member order (the same result whatever
         * the arrival order), over a chunk-sized accumulator that stays in
         * cache. */
        double *acc = r->acc;
        int first = 1;
        for (size_t s = 0; s < r->n_members; s++) {
            if (!(a->recv[c] & BIT(s)))
                continue;
            acc_add(acc, a->undo[c * r->n_members + s], a->snd[s].weight, cnt, first);
            first = 0;
        }
        float *avg = r->scratch;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (r->comp == AR_COMP_NONE) /* fp32 is its own encoding: write it in place */
            avg = (float *)(void *)(a->res + c * r->enc_chunk);
#endif
        acc_div(avg, acc, w, cnt);
        if (avg == r->scratch)
            ar_codec_encode(r->comp, r->scratch, cnt, a->res + c * r->enc_chunk, r->enc_chunk);
        a->final[c] = 1;
        /* In place, my buffer gets the chunk's served bytes now, while they
         * are in cache (my own contribution to it, kept by reference into
         * the buffer, was summed above and is let go below). */
        if (r->in_place && r->buf)
            ar_codec_decode(r->comp, a->res + c * r->enc_chunk, ar_codec_size(r->comp, cnt), cnt,
                            r->buf + a->offset + c * r->chunk);
    }
    for (size_t m = 0; m < r->n_members; m++)
        ar__agg_undo_free(r, c * r->n_members + m);
    while (a->final_prefix < a->n_chunks && a->final[a->final_prefix])
        a->final_prefix++;
    if (++a->n_final == a->n_chunks)
        ar__agg_complete(r);
}

void ar__agg_finalize_scan(struct ar_round *r)
{
    for (size_t c = 0; c < r->agg.n_chunks; c++)
        finalize_chunk(r, c);
}

static int accept_check(struct ar_round *r, int s, const float *x, size_t cnt, double w);

void ar__agg_undo_free(struct ar_round *r, size_t i)
{
    struct ar__agg *a = &r->agg;
    if (!(a->own_borrowed && i % r->n_members == r->me))
        ar__pool_chunk_put(r->pool, a->undo[i], r->chunk * sizeof(float));
    a->undo[i] = NULL;
}

/* Validates one chunk of sender s, then keeps it for the chunk's sum: a
 * bad chunk never enters a sum. When owned, x is a chunk buffer of the pool
 * (ar__pool_chunk_get, r->chunk floats) and becomes the round's (given back
 * here when refused); otherwise (my own chunks, with a->own_borrowed) it is
 * kept by reference: it lies in r->buf, which nothing writes before the
 * part is final or the round finishes (ar__agg_complete runs once every
 * chunk is final, when no entry is left; in place, a chunk of the buffer
 * is written once that chunk is summed; finish() forgets the references,
 * and nothing is finalized after it). */
int ar__agg_accept(struct ar_round *r, int s, size_t c, float *x, size_t cnt, double w, int owned)
{
    struct ar__agg *a = &r->agg;
    struct ar__sender *sd = &a->snd[s];
    int rc = accept_check(r, s, x, cnt, w);
    if (rc) {
        if (owned)
            ar__pool_chunk_put(r->pool, x, r->chunk * sizeof(float));
        return rc;
    }
    float *keep = x;
    if (!owned && !(a->own_borrowed && s == (int)r->me)) {
        if (!(keep = ar__pool_chunk_get(r->pool, r->chunk * sizeof(float))))
            return CM_EBUSY; /* not kept: the sender retries */
        memcpy(keep, x, cnt * sizeof *keep);
    }
    a->undo[c * r->n_members + (size_t)s] = keep;
    a->recv[c] |= BIT(s);
    a->cw[c] += w;
    sd->last_ms = ar__mono_ms();
    if (++sd->n_recv == a->n_chunks)
        sd->state = AR__S_DONE;
    finalize_chunk(r, c);
    return CM_OK;
}

/* The sender's weight and the chunk's values; excludes s when they fail. */
static int accept_check(struct ar_round *r, int s, const float *x, size_t cnt, double w)
{
    struct ar__sender *sd = &r->agg.snd[s];
    if (!sd->has_weight) {
        if (!isfinite(w) || w <= 0 || w > r->max_weight)
            return exclude(r, s, AR_EXCL_WEIGHT);
        sd->has_weight = 1;
        sd->weight = w;
    } else if (w != sd->weight) {
        return exclude(r, s, AR_EXCL_WEIGHT);
    }
    /* Squared norm in double, in one branch-free (vectorizable) pass: a NaN
     * or infinity anywhere makes it non-finite, and finite floats cannot
     * overflow it (at most 2^18 values of at most 2^256 each). */
    double ss = sum_sq(x, cnt);
    if (!isfinite(ss))
        return exclude(r, s, AR_EXCL_NONFINITE);
    if (!(sqrt(ss) <= r->max_norm))
        return exclude(r, s, AR_EXCL_NORM);
    return CM_OK;
}

static int on_data(struct ar_round *r, int s, const struct ar_data_msg *m, int prc);

/* Accepted chunks are answered with an Ack telling how far the part is
 * final, so the sender fetches those chunks without polling. */
int ar__round_on_data(struct ar_round *r, int s, const struct ar_data_msg *m, int prc,
                      size_t body_len, uint8_t **resp, size_t *rlen)
{
    r->bytes_received += body_len;
    int rc = on_data(r, s, m, prc);
    if (rc == CM_OK && ar_ack_build((uint32_t)r->agg.final_prefix, resp, rlen) == CM_OK)
        r->bytes_sent += *rlen;
    return rc;
}

static int on_data(struct ar_round *r, int s, const struct ar_data_msg *m, int prc)
{
    struct ar__agg *a = &r->agg;
    if (r->phase != AR__P_RUNNING)
        return CM_ESTATE;
    if (r->my_part < 0 || m->part != (uint32_t)r->my_part)
        return CM_EINVAL;
    if (!(a->senders & BIT(s)) || s == (int)r->me)
        return CM_EPERM;
    struct ar__sender *sd = &a->snd[s];
    if (sd->state == AR__S_EXCLUDED)
        return excl_status(sd->reason);
    if (sd->state == AR__S_DROPPED)
        return CM_ETIMEOUT;
    if (prc)
        return exclude(r, s, prc == CM_ERANGE ? AR_EXCL_SIZE : AR_EXCL_MALFORMED);
    if (m->chunk >= a->n_chunks || m->count != ar__chunk_len(r, a->part, m->chunk))
        return exclude(r, s, AR_EXCL_SIZE);
    if ((int)m->encoding != r->comp)
        return exclude(r, s, AR_EXCL_MALFORMED);
    if (a->recv[m->chunk] & BIT(s))
        return CM_OK; /* a retry after a lost answer: already summed */
    if (a->final[m->chunk])
        return CM_ESTATE;
    /* Decoded straight into the copy the aggregator keeps until the chunk
     * is final. */
    /* m->count <= r->chunk (checked above against the chunk's length) */
    float *x = ar__pool_chunk_get(r->pool, r->chunk * sizeof *x);
    if (!x)
        return CM_EBUSY; /* not kept: the sender retries */
    int drc = ar_codec_decode(r->comp, m->payload, m->payload_len, m->count, x);
    if (drc) {
        ar__pool_chunk_put(r->pool, x, r->chunk * sizeof *x);
        return exclude(r, s, drc == CM_ENUMERIC ? AR_EXCL_NONFINITE : AR_EXCL_MALFORMED);
    }
    r->chunks_received++;
    return ar__agg_accept(r, s, m->chunk, x, m->count, m->weight, 1);
}

int ar__round_on_fetch(struct ar_round *r, int member, const struct ar_fetch_msg *m,
                       size_t body_len, struct p2p_reply *reply)
{
    uint8_t **resp = &reply->body;
    size_t *rlen = &reply->len;
    struct ar__agg *a = &r->agg;
    r->bytes_received += body_len;
    if (r->phase == AR__P_DEAD)
        return CM_ESTATE;
    if (r->my_part < 0 || m->part != (uint32_t)r->my_part || m->chunk >= a->n_chunks)
        return CM_EINVAL;
    size_t c = m->chunk;
    if (a->final[c] == 0) {
        /* not averaged yet: ask again; the Ack says what is */
        if (ar_ack_build((uint32_t)a->final_prefix, resp, rlen) == CM_OK)
            r->bytes_sent += *rlen;
        return CM_EBUSY;
    }
    if (a->final[c] == 2)
        return CM_ENOTFOUND;
    struct ar_result_msg out;
    memset(&out, 0, sizeof out);
    memcpy(out.round, r->id, AR_ROUND_ID_LEN);
    out.part = (uint32_t)a->part;
    out.chunk = (uint32_t)c;
    out.weight = a->cw[c];
    out.counted = a->recv[c];
    out.dropped = a->dropped;
    out.excluded = a->excluded;
    out.n_exclusions = a->n_excl;
    memcpy(out.exclusions, a->excl, a->n_excl * sizeof a->excl[0]);
    out.encoding = (uint32_t)r->comp;
    out.count = (uint32_t)ar__chunk_len(r, a->part, c);
    out.payload = a->res + c * r->enc_chunk;
    out.payload_len = ar_codec_size(r->comp, out.count);
    out.ready = (uint32_t)a->final_prefix;
    /* The averaged chunk goes from a->res straight into the frame. */
    int rc = ar_result_build_head(&out, resp, rlen);
    if (rc)
        return rc;
    reply->tail = out.payload;
    reply->tail_len = out.payload_len;
    a->served[c] |= BIT(member);
    r->bytes_sent += *rlen + out.payload_len;
    r->chunks_sent++;
    return CM_OK;
}
