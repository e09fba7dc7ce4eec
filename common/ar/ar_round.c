/* One averaging round (ar.h): the butterfly all-reduce of seed
 * 000_02cc6b5d62a616fc.txt, section 3.2 ("everyone partitions their local
 * gradients and sends each partition to the corresponding peer ... receiver
 * nodes accumulate the gradients from all senders and return the average";
 * "a reducer can aggregate one chunk of gradients while downloading the next
 * chunk and distributing the previous one"), inside one group (Appendix C),
 * with the failure rules of DESIGN.md step 4.
 *
 * Three roles run concurrently on the loop, all driven by responses and by
 * one timer per round (retries, stalls, deadline):
 *   aggregator  (ar_agg.c) validates each received chunk, sums it weighted
 *               into its part at once, finalizes a chunk when every sender
 *               still in the round delivered it, and serves the average;
 *   sender      streams each remote part to its aggregator, a window of
 *               chunks in flight per aggregator, all aggregators at once;
 *   puller      fetches the averaged chunks of each remote part (those the
 *               aggregator's Acks say are final; otherwise one probe, once
 *               its own copy was acknowledged) into a staging area and
 *               commits the part whole.
 * This file holds the round's lifetime, reports, sender and puller sides,
 * the timer and the start.
 * A request callback holds a reference on the round, so a round that ended
 * is freed only after its last callback. */
#include "p2p/p2p_relay.h"
#include "ar/ar_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"
#include "cm_err.h"
#include "cm_log.h"

#define BIT(i) (1ull << (i))

enum { REQ_DATA, REQ_FETCH };

struct ar__req {
    struct ar_round *r;
    int kind;
    size_t k, c, bytes;
};

static void round_tick(uv_timer_t *t);
static void check_done(struct ar_round *r);

size_t ar__n_chunks(const struct ar_round *r, size_t len)
{
    return len / r->chunk + (len % r->chunk != 0);
}

size_t ar__chunk_len(const struct ar_round *r, size_t k, size_t c)
{
    size_t lo = c * r->chunk, n = r->len[k] - lo;
    return n < r->chunk ? n : r->chunk;
}

/* ---- lifetime ---------------------------------------------------------- */

static void round_free(struct ar_round *r)
{
    free(r->agg.recv);
    free(r->agg.cw);
    free(r->agg.final);
    free(r->agg.served);
    ar__pool_put(r->pool, r->agg.res);
    if (r->agg.undo)
        for (size_t i = 0; i < r->agg.n_chunks * r->n_members; i++)
            ar__agg_undo_free(r, i);
    free(r->agg.undo);
    for (size_t k = 0; k < r->n_parts; k++) {
        free(r->link[k].ost);
        free(r->link[k].ist);
        ar__pool_put(r->pool, r->link[k].stage);
    }
    free(r->scratch);
    free(r->acc);
    free(r->encbuf);
    ar__pool_unref(r->pool);
    free(r);
}

static void timer_closed(uv_handle_t *h)
{
    struct ar_round *r = h->data;
    r->timer_closed = 1;
    if (r->refs == 0)
        round_free(r);
}

/* Drops a callback's reference; returns 1 when the round is dead (and maybe
 * freed): the caller must not touch it then. */
static int unref(struct ar_round *r)
{
    r->refs--;
    if (r->phase != AR__P_DEAD)
        return 0;
    if (r->refs == 0 && r->timer_closed)
        round_free(r);
    return 1;
}

static void release(struct ar_round *r)
{
    if (r->phase == AR__P_DEAD)
        return;
    r->phase = AR__P_DEAD;
    ar__engine_unlink(r->e, r);
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, timer_closed);
}

/* ---- reports ----------------------------------------------------------- */

static void add_excl(struct ar_round *r, uint32_t member, uint32_t part, int reason)
{
    for (size_t i = 0; i < r->n_excl; i++)
        if (r->excl[i].member == member && r->excl[i].part == part)
            return;
    if (r->n_excl < sizeof r->excl / sizeof r->excl[0])
        r->excl[r->n_excl++] = (struct ar_exclusion){member, part, reason};
}

static void fill_reports(struct ar_round *r, int kill_status, int *status, size_t *n_avg)
{
    *status = CM_OK;
    *n_avg = 0;
    for (size_t k = 0; k < r->n_parts; k++) {
        struct ar_part_report *p = &r->reports[k];
        memset(p, 0, sizeof *p);
        p->aggregator = r->owner[k];
        p->offset = r->off[k];
        p->len = r->len[k];
        if ((int)k == r->my_part) {
            const struct ar__agg *a = &r->agg;
            uint64_t all = ~0ull, any = 0;
            double wmin = a->n_chunks ? INFINITY : 0, wmax = 0;
            for (size_t c = 0; c < a->n_chunks; c++) {
                all &= a->recv[c];
                any |= a->recv[c];
                wmin = a->cw[c] < wmin ? a->cw[c] : wmin;
                wmax = a->cw[c] > wmax ? a->cw[c] : wmax;
            }
            p->averaged = ar__own_part_ok(r);
            p->status = p->averaged ? CM_OK
                        : a->n_final != a->n_chunks ? (kill_status ? kill_status : CM_ETIMEOUT)
                                                    : CM_ENOTFOUND;
            p->weight = wmin;
            p->weight_max = wmax;
            p->counted = a->n_chunks ? all : 0;
            p->partial = any & ~p->counted;
            p->dropped = a->dropped;
            p->excluded = a->excluded;
        } else if (r->i_pull) {
            const struct ar__link *L = &r->link[k];
            p->averaged = L->idone && L->istatus == CM_OK;
            p->status = p->averaged ? CM_OK
                        : !L->idone     ? (kill_status ? kill_status : CM_ETIMEOUT)
                                        : L->istatus;
            p->weight = L->n_chunks ? L->wmin : 0;
            p->weight_max = L->wmax;
            p->counted = L->n_chunks ? L->cand : 0;
            p->partial = L->cor & ~p->counted;
            p->dropped = L->dropped;
            p->excluded = L->excluded;
        } else {
            /* An aggregate-only member holds no copy of the other parts. */
            p->status = CM_OK;
            continue;
        }
        if (p->averaged)
            (*n_avg)++;
        else if (*status == CM_OK)
            *status = p->status ? p->status : CM_EINTERNAL;
    }
    if (kill_status)
        *status = kill_status;
}

static void finish(struct ar_round *r, int kill_status)
{
    if (r->done_called)
        return;
    r->done_called = 1;
    struct ar_result res;
    memset(&res, 0, sizeof res);
    fill_reports(r, kill_status, &res.status, &res.n_averaged);
    for (size_t i = 0; i < r->agg.n_excl && r->my_part >= 0; i++)
        add_excl(r, r->agg.excl[i].member, (uint32_t)r->my_part, r->agg.excl[i].reason);
    memcpy(res.round_id, r->id, AR_ROUND_ID_LEN);
    res.n_parts = r->n_parts;
    res.parts = r->reports;
    res.n_excluded = r->n_excl;
    res.excluded = r->excl;
    res.bytes_sent = r->bytes_sent;
    res.bytes_received = r->bytes_received;
    res.chunks_sent = r->chunks_sent;
    res.chunks_received = r->chunks_received;
    res.ms_send = r->ms_send;
    res.ms_reduce = r->ms_reduce;
    res.ms_fetch = r->ms_fetch;
    res.ms_total = (double)(ar__mono_ms() - r->t0);
    r->phase = kill_status ? AR__P_DEAD : AR__P_LINGER;
    r->linger_until = ar__mono_ms() + r->linger_ms;
    /* Only the served results outlive done: the staging areas and chunk
     * states go now (callbacks still to come check odone/idone first). */
    for (size_t k = 0; k < r->n_parts; k++) {
        struct ar__link *L = &r->link[k];
        L->odone = L->idone = 1;
        free(L->ost);
        free(L->ist);
        ar__pool_put(r->pool, L->stage);
        L->ost = L->ist = NULL;
        L->stage = NULL;
    }
    /* My own chunks not yet summed were kept by reference into the buffer:
     * forget them (no chunk is finalized after this point: data, drops and
     * exclusions are only taken while the round runs). */
    if (r->agg.own_borrowed && r->agg.undo)
        for (size_t c = 0; c < r->agg.n_chunks; c++)
            r->agg.undo[c * r->n_members + r->me] = NULL;
    r->agg.own_borrowed = 0;
    free(r->scratch);
    free(r->acc);
    free(r->encbuf);
    r->scratch = NULL;
    r->acc = NULL;
    r->encbuf = NULL;
    r->buf = NULL; /* the caller's again */
    r->done(r->arg, &res);
}

void ar__round_kill(struct ar_round *r, int status)
{
    if (r->phase == AR__P_RUNNING)
        finish(r, status);
    r->phase = AR__P_LINGER; /* so release() runs its full path */
    release(r);
}

void ar_round_cancel(struct ar_round *r)
{
    if (r && r->phase == AR__P_RUNNING)
        ar__round_kill(r, CM_ECLOSED);
}

/* ---- sender side ------------------------------------------------------- */

static void give_up_out(struct ar_round *r, size_t k, int status)
{
    struct ar__link *L = &r->link[k];
    if (L->odone)
        return;
    if (status)
        CM_LOGI("ar", "round %02x%02x%02x%02x part %zu: stop sending to member %u: %s", r->id[0],
                r->id[1], r->id[2], r->id[3], k, r->owner[k],
                cm_strerror(status));
    L->odone = 1;
    L->ostatus = status;
}

static void data_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len);
static void in_pump(struct ar_round *r, size_t k);

/* Learns from an Ack how many leading chunks of part k are final; returns
 * 1 when the body was an Ack (the aggregator runs this round). */
static int take_ack(struct ar_round *r, size_t k, const uint8_t *body, size_t len)
{
    struct ar__link *L = &r->link[k];
    uint32_t ready;
    r->bytes_received += len;
    if (!len || ar_ack_parse(body, len, &ready) != CM_OK || ready > L->n_chunks)
        return 0;
    if (ready > L->iready)
        L->iready = ready;
    return 1;
}

/* How long a link may stay silent: stall_ms, or start_wait_ms while its
 * aggregator answers that it has not started the round yet. */
static int64_t link_patience(const struct ar_round *r, const struct ar__link *L)
{
    return (int64_t)(L->obusy || L->ibusy ? r->start_wait_ms : r->stall_ms);
}

static int send_data(struct ar_round *r, size_t k, size_t c)
{
    struct ar__link *L = &r->link[k];
    size_t cnt = ar__chunk_len(r, k, c);
    const float *src = r->buf + r->off[k] + c * r->chunk;
    const uint8_t *payload = r->encbuf;
    int rc;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (r->comp == AR_COMP_NONE)
        payload = (const uint8_t *)src; /* fp32 little-endian is the wire format */
    else
#endif
    if ((rc = ar_codec_encode(r->comp, src, cnt, r->encbuf, r->enc_chunk)))
        return rc;
    struct ar_data_msg m;
    memset(&m, 0, sizeof m);
    memcpy(m.round, r->id, AR_ROUND_ID_LEN);
    m.part = (uint32_t)k;
    m.chunk = (uint32_t)c;
    m.weight = r->weight;
    m.encoding = (uint32_t)r->comp;
    m.count = (uint32_t)cnt;
    m.payload = payload;
    m.payload_len = ar_codec_size(r->comp, cnt);
    uint8_t *body;
    size_t blen;
    if ((rc = ar_data_build_head(&m, &body, &blen)))
        return rc;
    struct ar__req *q = malloc(sizeof *q);
    if (!q) {
        free(body);
        return CM_ENOMEM;
    }
    *q = (struct ar__req){r, REQ_DATA, k, c, blen + m.payload_len};
    const struct ar_member *mb = &r->members[r->owner[k]];
    /* Gathered straight into the frame; a lost chunk is resent by out_pump. */
    struct p2p_iov iov[2] = {{body, blen}, {payload, m.payload_len}};
    rc = p2p_request_iov(r->e->host, (const struct sockaddr *)&mb->addr, mb->pub, AR_MSG_DATA,
                         iov, 2, r->stall_ms, data_cb, q);
    free(body);
    if (rc) {
        free(q);
        return rc;
    }
    r->refs++;
    L->oflight++;
    L->osent_ms = ar__mono_ms();
    L->ost[c] = AR__C_FLIGHT;
    return CM_OK;
}

static int retryable(int rc)
{
    return rc == CM_EBUSY || rc == CM_ECONN || rc == CM_ETIMEOUT || rc == CM_ECLOSED ||
           rc == CM_EPROTO || rc == CM_EAUTH;
}

static void out_backoff(struct ar__link *L, size_t c)
{
    L->ost[c] = AR__C_RETRY;
    L->oretry_at = ar__mono_ms() + L->obackoff;
    L->obackoff = L->obackoff * 2 > AR__BACKOFF_MAX_MS ? AR__BACKOFF_MAX_MS : L->obackoff * 2;
}

/* Balanced sending. A part's average goes back chunk by chunk, each chunk
 * once every sender delivered it, so a part is only as far along as its
 * slowest sender on it, and the members' downloads of it follow. The
 * windows alone let a sender's links drift apart: links whose acks come
 * back sooner take the upload, one link of a slow sender fell 40 % of its
 * part behind the others, and every member's download of that part idled
 * until the end (bench_table1, setup C: slow peers' downloads stalled for
 * 1.7 s mid-round, the round took 1.45x its bound). So a link sends a new
 * chunk only while it is at most AR__LEAD of its part (plus a window)
 * ahead of the slowest live link, which gets the upload instead: every
 * part then advances at its planned share, as the LP's rates assume
 * (seed 000 §3.2, Appendix B). A link with nothing acknowledged yet (its
 * aggregator has not started the round) or none for AR__LEAD_STALE_MS (it
 * is gone or stuck) holds nobody; retries of lost chunks always go.
 *
 * AR__LEAD was 1/16 at first; 0 (a link at most one window ahead) ends
 * setup C's LP rounds 0.1 s sooner (4.33 -> 4.23 s against a 4.09 s bound,
 * 3 runs each): with 1/16 a slow sender's links finished up to 0.36 s
 * apart, so the last chunks of every part became ready in a burst and the
 * members' downloads, which run no faster than the senders' uploads there,
 * could not catch up. The price is on unbalanced plans: even all-reduce in
 * setup C (fast and slow aggregators with equal parts) went from
 * 8.02-8.09 to 8.03-8.19 s, since holding a sender's links to fast
 * aggregators to the pace of its links to slow ones leaves some of its
 * upload unused. Agents average with the LP's plans, whose parts follow
 * the aggregators' rates. */
#define AR__LEAD 0.0
#define AR__LEAD_STALE_MS 500
static double slowest_link(const struct ar_round *r, int64_t now)
{
    double lo = 2;
    for (size_t j = 0; j < r->n_parts; j++) {
        const struct ar__link *J = &r->link[j];
        if ((int)j == r->my_part || J->odone || J->n_chunks == 0 || J->oacked == 0 ||
            now - J->olast_ms > AR__LEAD_STALE_MS)
            continue;
        double f = (double)J->oacked / (double)J->n_chunks;
        lo = f < lo ? f : lo;
    }
    return lo;
}

static void out_pump(struct ar_round *r, size_t k)
{
    struct ar__link *L = &r->link[k];
    int64_t now = ar__mono_ms();
    L->oheld = 0;
    if (L->odone || now < L->oretry_at)
        return;
    while (L->olow < L->n_chunks && L->ost[L->olow] == AR__C_DONE)
        L->olow++;
    size_t scan = L->olow;
    double lo = -1;
    while (!L->odone && L->oflight < r->window) {
        size_t c = L->n_chunks;
        while (scan < L->onext && L->ost[scan] != AR__C_RETRY)
            scan++;
        if (scan < L->onext) {
            c = scan;
        } else if (L->onext < L->n_chunks) {
            if (lo < 0)
                lo = slowest_link(r, now);
            /* Held, except one chunk per stall_ms / 4 of silence: an
               aggregator drops a sender it hears nothing from for stall_ms
               (a late-starting aggregator can hold a slow sender's other
               links for seconds while its own catches up). */
            if ((double)L->onext >= (lo + AR__LEAD) * (double)L->n_chunks + r->window &&
                (L->oflight > 0 || now - L->osent_ms < (int64_t)r->stall_ms / 4)) {
                L->oheld = 1;
                break;
            }
            c = L->onext++;
        }
        if (c == L->n_chunks)
            break;
        int rc = send_data(r, k, c);
        if (rc) {
            if (!retryable(rc) || r->e->host == NULL) {
                give_up_out(r, k, rc);
            } else {
                out_backoff(L, c);
            }
            break;
        }
    }
}

static void data_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct ar__req *q = arg;
    struct ar_round *r = q->r;
    size_t k = q->k, c = q->c, bytes = q->bytes;
    free(q);
    if (unref(r))
        return;
    struct ar__link *L = &r->link[k];
    L->oflight--;
    if (L->odone)
        goto out;
    int64_t now = ar__mono_ms();
    L->obusy = from && status == CM_EBUSY && !L->oacked;
    if (status == CM_OK && from) {
        take_ack(r, k, body, len);
        L->ost[c] = AR__C_DONE;
        L->olast_ms = now;
        L->obackoff = AR__BACKOFF_MIN_MS;
        r->bytes_sent += bytes;
        r->chunks_sent++;
        if (++L->oacked == L->n_chunks)
            give_up_out(r, k, CM_OK);
        /* this link moving may release the links held for it */
        for (size_t j = 0; j < r->n_parts; j++)
            if (j != k && r->link[j].oheld)
                out_pump(r, j);
    } else if (from && status != CM_EBUSY) {
        give_up_out(r, k, status); /* excluded, dropped, finished: stop */
    } else if (now - L->olast_ms > link_patience(r, L)) {
        give_up_out(r, k, status ? status : CM_ETIMEOUT);
    } else {
        out_backoff(L, c); /* not started there yet, or a transport error */
    }
    if (status && from && status != CM_EBUSY)
        CM_LOGI("ar", "member %u refused chunk %zu of part %zu: %s", r->owner[k], c, k,
                cm_strerror(status));
    out_pump(r, k);
    if (r->i_pull)
        in_pump(r, k);
out:
    check_done(r);
}

/* ---- puller side ------------------------------------------------------- */

static void give_up_in(struct ar_round *r, size_t k, int status)
{
    struct ar__link *L = &r->link[k];
    if (L->idone)
        return;
    if (status)
        CM_LOGI("ar", "round %02x%02x%02x%02x part %zu (member %u) not averaged: %s", r->id[0],
                r->id[1], r->id[2], r->id[3], k, r->owner[k],
                cm_strerror(status));
    L->idone = 1;
    L->istatus = status;
    give_up_out(r, k, L->odone ? L->ostatus : status);
}

static void fetch_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                     size_t len);

static int send_fetch(struct ar_round *r, size_t k, size_t c)
{
    struct ar_fetch_msg m;
    memcpy(m.round, r->id, AR_ROUND_ID_LEN);
    m.part = (uint32_t)k;
    m.chunk = (uint32_t)c;
    uint8_t *body;
    size_t blen;
    int rc = ar_fetch_build(&m, &body, &blen);
    if (rc)
        return rc;
    struct ar__req *q = malloc(sizeof *q);
    if (!q) {
        free(body);
        return CM_ENOMEM;
    }
    *q = (struct ar__req){r, REQ_FETCH, k, c, blen};
    const struct ar_member *mb = &r->members[r->owner[k]];
    rc = p2p_request(r->e->fhost, (const struct sockaddr *)&mb->addr, mb->pub, AR_MSG_FETCH, body,
                     blen, r->stall_ms, fetch_cb, q);
    free(body);
    if (rc) {
        free(q);
        return rc;
    }
    r->refs++;
    r->bytes_sent += blen;
    r->link[k].iflight++;
    r->link[k].ist[c] = AR__C_FLIGHT;
    return CM_OK;
}

static void in_backoff(struct ar__link *L, size_t c)
{
    L->ist[c] = AR__C_RETRY;
    L->iretry_at = ar__mono_ms() + L->ibackoff;
    L->ibackoff = L->ibackoff * 2 > AR__BACKOFF_MAX_MS ? AR__BACKOFF_MAX_MS : L->ibackoff * 2;
}

/* A chunk can be ready only once the aggregator has my own copy of it. */
static int fetchable(const struct ar_round *r, const struct ar__link *L, size_t c)
{
    return !r->i_send || L->odone || L->ost[c] == AR__C_DONE;
}

static void in_pump(struct ar_round *r, size_t k)
{
    struct ar__link *L = &r->link[k];
    if (L->idone || ar__mono_ms() < L->iretry_at)
        return;
    /* Chunks the aggregator said are final: a full window of them. */
    while (L->ilow < L->n_chunks && L->ist[L->ilow] == AR__C_DONE)
        L->ilow++;
    size_t scan = L->ilow;
    while (!L->idone && L->iflight < r->window) {
        size_t c = L->n_chunks;
        while (scan < L->inext && scan < L->iready && L->ist[scan] != AR__C_RETRY)
            scan++;
        if (scan < L->inext && scan < L->iready)
            c = scan++;
        else if (L->inext < L->iready)
            c = L->inext++;
        if (c == L->n_chunks)
            break;
        int rc = send_fetch(r, k, c);
        if (rc) {
            if (!retryable(rc))
                give_up_in(r, k, rc);
            else
                in_backoff(L, c);
            return;
        }
    }
    if (L->idone || L->iflight || L->igot == L->n_chunks || ar__mono_ms() < L->iprobe_at)
        return;
    /* Nothing known to be ready: one probe for the lowest missing chunk, if
     * the aggregator already has my copy of it (earlier it cannot be ready).
     * Its "not yet" answer carries the ready count; probes back off. */
    size_t c = L->ilow;
    while (c < L->inext && L->ist[c] != AR__C_RETRY)
        c++;
    if (c == L->inext) {
        if (L->inext == L->n_chunks)
            return;
        c = L->inext;
    }
    if (!fetchable(r, L, c))
        return;
    if (c == L->inext)
        L->inext++;
    int rc = send_fetch(r, k, c);
    if (rc) {
        if (!retryable(rc))
            give_up_in(r, k, rc);
        else
            in_backoff(L, c);
    }
}

/* 1 when no value is NaN or infinite (one branch-free, vectorizable pass). */
static int all_finite(const float *x, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= !(fabsf(x[i]) <= FLT_MAX);
    return !bad;
}

/* Checks one averaged chunk and stages it (in place: writes it into the
 * buffer, once checked); CM_OK or why the part is lost. */
static int take_result(struct ar_round *r, size_t k, size_t c, const uint8_t *body, size_t len)
{
    struct ar__link *L = &r->link[k];
    struct ar_result_msg m;
    int rc = ar_result_parse(body, len, &m);
    if (rc)
        return CM_EPROTO;
    size_t cnt = ar__chunk_len(r, k, c);
    if (memcmp(m.round, r->id, AR_ROUND_ID_LEN) || m.part != k || m.chunk != c ||
        (int)m.encoding != r->comp || m.count != cnt) {
        ar_result_cleanup(&m);
        return CM_EPROTO;
    }
    /* In place, the chunk is decoded and checked in the chunk-sized scratch
     * (in cache) and only then copied into the buffer. */
    float *dst = r->in_place ? r->scratch : L->stage + c * r->chunk;
    rc = ar_codec_decode(r->comp, m.payload, m.payload_len, cnt, dst);
    /* An aggregator's garbage never reaches the buffer (a branch-free pass:
     * NaN fails the comparison too). */
    if (!rc && !all_finite(dst, cnt))
        rc = CM_ENUMERIC;
    if (!rc && r->in_place)
        memcpy(r->buf + r->off[k] + c * r->chunk, dst, cnt * sizeof *dst);
    if (!rc) {
        /* How far the part is final now: keep fetching without probing. */
        if (m.ready <= L->n_chunks && m.ready > L->iready)
            L->iready = m.ready;
        L->wmin = m.weight < L->wmin ? m.weight : L->wmin;
        L->wmax = m.weight > L->wmax ? m.weight : L->wmax;
        L->cand &= m.counted;
        L->cor |= m.counted;
        L->dropped |= m.dropped;
        L->excluded |= m.excluded;
        for (size_t i = 0; i < m.n_exclusions; i++)
            add_excl(r, m.exclusions[i].member, (uint32_t)k, m.exclusions[i].reason);
        r->chunks_received++;
    }
    ar_result_cleanup(&m);
    return rc ? CM_EPROTO : CM_OK;
}

static void fetch_cb(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                     size_t len)
{
    struct ar__req *q = arg;
    struct ar_round *r = q->r;
    size_t k = q->k, c = q->c;
    free(q);
    if (unref(r))
        return;
    struct ar__link *L = &r->link[k];
    L->iflight--;
    if (L->idone)
        goto out;
    int64_t now = ar__mono_ms();
    /* The aggregator is alive and in this round unless it says it does not
     * know the round (CM_EBUSY without an Ack): then the stall clock runs. */
    if (from && status != CM_EBUSY) {
        L->ilast_ms = now;
        L->ibusy = 0;
    }
    if (status == CM_OK && from) {
        r->bytes_received += len;
        int rc = take_result(r, k, c, body, len);
        if (rc) {
            give_up_in(r, k, rc);
            goto out;
        }
        L->ist[c] = AR__C_DONE;
        L->ibackoff = AR__BACKOFF_MIN_MS;
        if (++L->igot == L->n_chunks) {
            /* The whole part arrived: commit it at once (in place: it is). */
            if (!r->in_place)
                memcpy(r->buf + r->off[k], L->stage, r->len[k] * sizeof(float));
            give_up_in(r, k, CM_OK);
        }
    } else if (from && status == CM_EBUSY) {
        if (take_ack(r, k, body, len)) {
            L->ilast_ms = now;
            L->ibusy = 0;
        } else {
            L->ibusy = !L->igot; /* it does not know the round yet */
        }
        L->ist[c] = AR__C_RETRY;
        L->iprobe_at = now + L->ibackoff;
        L->ibackoff = L->ibackoff * 2 > AR__BACKOFF_MAX_MS ? AR__BACKOFF_MAX_MS : L->ibackoff * 2;
    } else if (from) {
        r->bytes_received += len;
        give_up_in(r, k, status);
    } else if (now - L->ilast_ms > (int64_t)r->stall_ms) {
        give_up_in(r, k, status ? status : CM_ETIMEOUT);
    } else {
        in_backoff(L, c);
    }
    in_pump(r, k);
out:
    check_done(r);
}

/* ---- progress ---------------------------------------------------------- */

static void check_done(struct ar_round *r)
{
    if (r->phase != AR__P_RUNNING)
        return;
    int64_t now = ar__mono_ms();
    int outs = 1, ins = 1;
    for (size_t k = 0; k < r->n_parts; k++) {
        if ((int)k == r->my_part)
            continue;
        if (r->i_send && !r->link[k].odone)
            outs = 0;
        if (r->i_pull && !r->link[k].idone)
            ins = 0;
    }
    if (outs && r->ms_send == 0)
        r->ms_send = (double)(now - r->t0);
    if (ins && r->ms_fetch == 0)
        r->ms_fetch = (double)(now - r->t0);
    if (outs && ins && (r->my_part < 0 || r->agg.n_final == r->agg.n_chunks))
        finish(r, 0);
}

/* Every member that may still fetch (excluded ones may: they get the
 * average without them; dropped ones are presumed gone) has every averaged
 * chunk. */
static int all_served(const struct ar_round *r)
{
    const struct ar__agg *a = &r->agg;
    for (size_t c = 0; c < a->n_chunks; c++)
        if (a->final[c] == 1 && (a->served[c] & a->pullers & ~a->dropped) !=
                                    (a->pullers & ~a->dropped))
            return 0;
    return 1;
}

static void round_tick(uv_timer_t *t)
{
    struct ar_round *r = t->data;
    int64_t now = ar__mono_ms();
    if (r->phase == AR__P_LINGER) {
        if (r->my_part < 0 || now >= r->linger_until || all_served(r))
            release(r);
        return;
    }
    if (r->phase != AR__P_RUNNING)
        return;
    struct ar__agg *a = &r->agg;
    int late = now >= r->deadline_at;
    /* Aggregators stop waiting for senders at 4/5 of the deadline, so the
     * averages still reach the members before it. */
    int late_reduce = now >= r->reduce_deadline_at;
    if (r->my_part >= 0)
        for (size_t s = 0; s < r->n_members; s++)
            if ((a->senders & BIT(s)) && a->snd[s].state == AR__S_ACTIVE && s != r->me &&
                (late_reduce || now - a->snd[s].last_ms >
                                    (int64_t)(a->snd[s].n_recv ? r->stall_ms : r->start_wait_ms)))
                ar__agg_drop(r, (int)s);
    for (size_t k = 0; k < r->n_parts && r->phase == AR__P_RUNNING; k++) {
        if ((int)k == r->my_part)
            continue;
        struct ar__link *L = &r->link[k];
        /* a link held for a slower one is quiet by our choice, not its
           aggregator's (it still sends a chunk every stall_ms / 4, whose
           answer, or lack of one, tells) */
        if (r->i_send && !L->odone &&
            (late || (L->oflight == 0 && !L->oheld &&
                      now - L->olast_ms > link_patience(r, L))))
            give_up_out(r, k, CM_ETIMEOUT);
        if (r->i_pull && !L->idone &&
            (late || (L->iflight == 0 &&
                      now - L->ilast_ms > link_patience(r, L))))
            give_up_in(r, k, CM_ETIMEOUT);
        if (r->i_send)
            out_pump(r, k);
        if (r->i_pull)
            in_pump(r, k);
    }
    check_done(r);
}

/* ---- start ------------------------------------------------------------- */

static int check_config(const struct ar_engine *e, const struct ar_round_config *c)
{
    if (!c->members || c->n_members == 0 || c->n_members > AR_MAX_MEMBERS ||
        c->my_index >= c->n_members || c->n == 0 || c->n > SIZE_MAX / 16 || !c->done ||
        c->group_id_len > AR_GROUP_ID_MAX || (c->group_id_len && !c->group_id))
        return CM_EINVAL;
    if (c->comp != AR_COMP_NONE && c->comp != AR_COMP_FP16 && c->comp != AR_COMP_Q8)
        return CM_EINVAL;
    if (c->chunk_elems &&
        (c->chunk_elems % AR_Q8_BLOCK || c->chunk_elems > AR_CHUNK_MAX ||
         ar_codec_size(c->comp, c->chunk_elems) > AR_PAYLOAD_MAX))
        return CM_EINVAL;
    if (c->max_norm < 0 || c->max_weight < 0 || isnan(c->max_norm) || isnan(c->max_weight))
        return CM_EINVAL;
    if (c->n / ar_chunk_elems(c) >= UINT32_MAX) /* chunk indices travel as uint32 */
        return CM_EINVAL;
    const struct ar_member *me = &c->members[c->my_index];
    if (memcmp(me->pub, e->key->pub, CM_ED25519_PUB_LEN))
        return CM_EINVAL;
    if (me->sends == AR_SENDS_FULL) {
        double mw = c->max_weight > 0 ? c->max_weight : 1e12;
        if (!c->buf || !isfinite(c->weight) || c->weight <= 0 || c->weight > mw)
            return CM_EINVAL;
    } else if (me->sends == AR_SENDS_PULL && !c->buf) {
        return CM_EINVAL; /* where would the average go */
    }
    if (me->fraction > 0 && !e->listening && !p2p_host_relay_active(e->host))
        return CM_EINVAL; /* a client-mode peer cannot be reached to aggregate (unless
                             through a relay, p2p_relay.h) */
    int senders = 0;
    for (size_t i = 0; i < c->n_members; i++) {
        const struct ar_member *m = &c->members[i];
        if (m->sends != AR_SENDS_NONE && m->sends != AR_SENDS_FULL && m->sends != AR_SENDS_PULL)
            return CM_EINVAL;
        senders += m->sends == AR_SENDS_FULL;
        for (size_t j = 0; j < i; j++)
            if (!memcmp(c->members[j].pub, m->pub, CM_ED25519_PUB_LEN))
                return CM_EINVAL;
        if (m->fraction > 0 && i != c->my_index && m->addr.ss_family != AF_INET &&
            m->addr.ss_family != AF_INET6)
            return CM_EINVAL;
    }
    return senders ? CM_OK : CM_EINVAL;
}

static int alloc_round(struct ar_round *r)
{
    r->scratch = malloc(r->chunk * sizeof(float));
    r->encbuf = malloc(r->enc_chunk);
    if (!r->scratch || !r->encbuf)
        return CM_ENOMEM;
    if (r->my_part >= 0 && !(r->acc = malloc(r->chunk * sizeof(double))))
        return CM_ENOMEM;
    if (r->my_part >= 0) {
        struct ar__agg *a = &r->agg;
        size_t nc = a->n_chunks ? a->n_chunks : 1;
        a->recv = calloc(nc, sizeof *a->recv);
        a->cw = calloc(nc, sizeof *a->cw);
        a->final = calloc(nc, 1);
        a->served = calloc(nc, sizeof *a->served);
        a->res = ar__pool_get(r->pool, nc * r->enc_chunk, 0);
        a->undo = calloc(nc * r->n_members, sizeof *a->undo);
        if (!a->recv || !a->cw || !a->final || !a->served || !a->res || !a->undo)
            return CM_ENOMEM;
    }
    for (size_t k = 0; k < r->n_parts; k++) {
        struct ar__link *L = &r->link[k];
        if ((int)k == r->my_part)
            continue;
        size_t nc = L->n_chunks ? L->n_chunks : 1;
        if (r->i_send && !(L->ost = calloc(nc, 1)))
            return CM_ENOMEM;
        if (r->i_pull && (!(L->ist = calloc(nc, 1)) ||
                          (!r->in_place &&
                           !(L->stage = ar__pool_get(r->pool, (r->len[k] ? r->len[k] : 1) *
                                                                      sizeof(float), 0)))))
            return CM_ENOMEM;
    }
    return CM_OK;
}

int ar_round_start(struct ar_engine *e, const struct ar_round_config *cfg, struct ar_round **out)
{
    if (!e || !cfg || !e->host)
        return CM_EINVAL;
    int rc = check_config(e, cfg);
    if (rc)
        return rc;
    struct ar_round *r = calloc(1, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    r->e = e;
    r->pool = e->pool;
    ar__pool_ref(r->pool);
    if ((rc = ar_round_id(cfg, r->id)))
        goto fail;
    if (ar__engine_find(e, r->id) || ar__engine_finished(e, r->id)) {
        rc = CM_EEXISTS;
        goto fail;
    }
    memcpy(r->members, cfg->members, cfg->n_members * sizeof *cfg->members);
    r->n_members = cfg->n_members;
    r->me = cfg->my_index;
    r->step = cfg->step;
    r->i_send = cfg->members[r->me].sends == AR_SENDS_FULL;
    r->i_pull = cfg->members[r->me].sends != AR_SENDS_NONE;
    r->buf = cfg->buf;
    r->n = cfg->n;
    r->weight = cfg->weight;
    r->comp = cfg->comp;
    r->in_place = cfg->in_place != 0;
    r->chunk = ar_chunk_elems(cfg);
    r->deadline_ms = cfg->deadline_ms ? cfg->deadline_ms : 60000;
    r->stall_ms = cfg->stall_ms ? cfg->stall_ms : 5000;
    r->start_wait_ms = cfg->start_wait_ms > r->stall_ms ? cfg->start_wait_ms : r->stall_ms;
    r->linger_ms = cfg->linger_ms ? cfg->linger_ms : 10000;
    r->window = cfg->window ? cfg->window : AR_DEFAULT_WINDOW;
    r->max_norm = cfg->max_norm > 0 ? cfg->max_norm : 1e9;
    r->max_weight = cfg->max_weight > 0 ? cfg->max_weight : 1e12;
    r->enc_chunk = ar_codec_size(r->comp, r->chunk);
    r->done = cfg->done;
    r->arg = cfg->arg;
    if ((rc = ar_partition(r->members, r->n_members, r->n, AR_ALIGN, &r->n_parts, r->owner,
                           r->off, r->len)))
        goto fail;
    r->my_part = -1;
    for (size_t k = 0; k < r->n_parts; k++) {
        struct ar__link *L = &r->link[k];
        L->n_chunks = ar__n_chunks(r, r->len[k]);
        L->wmin = INFINITY;
        L->cand = ~0ull;
        L->obackoff = L->ibackoff = AR__BACKOFF_MIN_MS;
        if (r->owner[k] == r->me)
            r->my_part = (int)k;
    }
    r->t0 = ar__mono_ms();
    r->deadline_at = r->t0 + r->deadline_ms;
    r->reduce_deadline_at = r->t0 + r->deadline_ms / 5 * 4;
    if (r->my_part >= 0) {
        struct ar__agg *a = &r->agg;
        a->part = (size_t)r->my_part;
        a->offset = r->off[a->part];
        a->len = r->len[a->part];
        a->n_chunks = ar__n_chunks(r, a->len);
        for (size_t s = 0; s < r->n_members; s++) {
            a->snd[s].last_ms = r->t0;
            if (r->members[s].sends == AR_SENDS_FULL)
                a->senders |= BIT(s);
            if (r->members[s].sends != AR_SENDS_NONE && s != r->me)
                a->pullers |= BIT(s);
        }
    }
    if ((rc = alloc_round(r)))
        goto fail;
    for (size_t k = 0; k < r->n_parts; k++) {
        struct ar__link *L = &r->link[k];
        L->olast_ms = L->ilast_ms = L->osent_ms = r->t0;
        if (L->n_chunks == 0 && (int)k != r->my_part) /* an empty part: nothing to move */
            L->odone = L->idone = 1;
        if ((int)k != r->my_part && r->owner[k] != r->me && (cfg->gone & BIT(r->owner[k])) &&
            !L->idone) {
            /* its aggregator is known gone: nothing to wait for (the done
               callback must not run inside ar_round_start: flags only) */
            L->odone = L->idone = 1;
            L->ostatus = L->istatus = CM_ECONN;
        }
    }
    uv_timer_init(p2p_ctx_loop(e->ctx), &r->timer);
    r->timer.data = r;
    r->next = e->rounds;
    e->rounds = r;
    /* My own share of my part is summed at once, through the same checks,
     * kept by reference into the buffer (no copy). */
    if (r->my_part >= 0) {
        struct ar__agg *a = &r->agg;
        a->own_borrowed = 1;
        if (r->i_send)
            for (size_t c = 0; c < a->n_chunks && a->snd[r->me].state == AR__S_ACTIVE; c++)
                ar__agg_accept(r, (int)r->me, c, r->buf + a->offset + c * r->chunk,
                               ar__chunk_len(r, a->part, c), r->weight, 0);
        for (size_t m = 0; m < r->n_members; m++)
            if (m != r->me && (cfg->gone & BIT(m)) && (a->senders & BIT(m)))
                ar__agg_drop(r, (int)m);
        if (a->n_chunks == 0)
            ar__agg_complete(r);
        else
            ar__agg_finalize_scan(r);
    }
    /* The first tick (next loop turn) starts the transfers, so done never
     * runs inside this call. */
    uv_timer_start(&r->timer, round_tick, 0, AR__TICK_MS);
    if (out)
        *out = r;
    return CM_OK;
fail:
    round_free(r);
    return rc;
}
