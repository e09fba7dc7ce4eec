/* Parsers and builders of the averaging messages (ar_msg.h) over the
 * protobuf-c code generated from common/ar/ar.proto. Every field read from
 * the wire is bounded here, before the engine sees it. */
#include "ar/ar_msg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar.pb-c.h"
#include "ar/ar_codec.h"
#include "cm_err.h"

static int enc_ok(uint32_t e)
{
    return e == AR_COMP_NONE || e == AR_COMP_FP16 || e == AR_COMP_Q8;
}

/* Shape of an encoded chunk: the count is bounded, the payload length must
 * be exactly what count values take. */
static int shape_ok(uint32_t enc, uint32_t count, size_t payload_len)
{
    if (count == 0 || count > AR_CHUNK_MAX || payload_len > AR_PAYLOAD_MAX)
        return CM_ERANGE;
    return payload_len == ar_codec_size((int)enc, count) ? CM_OK : CM_ERANGE;
}

int ar_data_parse(const uint8_t *buf, size_t len, struct ar_data_msg *m)
{
    memset(m, 0, sizeof *m);
    Ctar__Data *d = ctar__data__unpack(NULL, len, buf);
    if (!d)
        return CM_EPARSE;
    int rc = CM_EPARSE;
    if (d->round.len != AR_ROUND_ID_LEN)
        goto fail;
    /* From here on the message names a round: the receiver can hold the
     * (authenticated) sender responsible for what is wrong with it. */
    memcpy(m->round, d->round.data, AR_ROUND_ID_LEN);
    m->part = d->part;
    m->chunk = d->chunk;
    m->has_round = 1;
    if (!enc_ok(d->encoding))
        goto fail;
    if ((rc = shape_ok(d->encoding, d->count, d->payload.len)))
        goto fail;
    m->weight = d->weight;
    m->encoding = d->encoding;
    m->count = d->count;
    m->payload = d->payload.data;
    m->payload_len = d->payload.len;
    m->pb_ = d;
    return CM_OK;
fail:
    ctar__data__free_unpacked(d, NULL);
    return rc;
}

void ar_data_cleanup(struct ar_data_msg *m)
{
    if (m->pb_)
        ctar__data__free_unpacked(m->pb_, NULL);
    m->pb_ = NULL;
}

int ar_fetch_parse(const uint8_t *buf, size_t len, struct ar_fetch_msg *m)
{
    memset(m, 0, sizeof *m);
    Ctar__Fetch *f = ctar__fetch__unpack(NULL, len, buf);
    if (!f)
        return CM_EPARSE;
    int rc = CM_EPARSE;
    if (f->round.len == AR_ROUND_ID_LEN) {
        memcpy(m->round, f->round.data, AR_ROUND_ID_LEN);
        m->part = f->part;
        m->chunk = f->chunk;
        rc = CM_OK;
    }
    ctar__fetch__free_unpacked(f, NULL);
    return rc;
}

int ar_result_parse(const uint8_t *buf, size_t len, struct ar_result_msg *m)
{
    memset(m, 0, sizeof *m);
    Ctar__Result *r = ctar__result__unpack(NULL, len, buf);
    if (!r)
        return CM_EPARSE;
    int rc = CM_EPARSE;
    if (r->round.len != AR_ROUND_ID_LEN || !enc_ok(r->encoding) || !isfinite(r->weight) ||
        r->weight < 0 || r->n_exclusions > AR_MAX_MEMBERS)
        goto fail;
    for (size_t i = 0; i < r->n_exclusions; i++) {
        if (r->exclusions[i]->member >= AR_MAX_MEMBERS || r->exclusions[i]->reason < AR_EXCL_NONFINITE ||
            r->exclusions[i]->reason > AR_EXCL_WEIGHT)
            goto fail;
        m->exclusions[i].member = r->exclusions[i]->member;
        m->exclusions[i].reason = (int)r->exclusions[i]->reason;
    }
    if ((rc = shape_ok(r->encoding, r->count, r->payload.len)))
        goto fail;
    memcpy(m->round, r->round.data, AR_ROUND_ID_LEN);
    m->part = r->part;
    m->chunk = r->chunk;
    m->weight = r->weight;
    m->counted = r->counted;
    m->dropped = r->dropped;
    m->excluded = r->excluded;
    m->n_exclusions = r->n_exclusions;
    m->encoding = r->encoding;
    m->count = r->count;
    m->payload = r->payload.data;
    m->payload_len = r->payload.len;
    m->pb_ = r;
    return CM_OK;
fail:
    ctar__result__free_unpacked(r, NULL);
    return rc;
}

void ar_result_cleanup(struct ar_result_msg *m)
{
    if (m->pb_)
        ctar__result__free_unpacked(m->pb_, NULL);
    m->pb_ = NULL;
}

/* Packs any generated message into a fresh heap buffer. */
static int pack(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return CM_ENOMEM;
    protobuf_c_message_pack(msg, b);
    *out = b;
    *out_len = n;
    return CM_OK;
}

int ar_data_build(const struct ar_data_msg *m, uint8_t **out, size_t *out_len)
{
    Ctar__Data d = CTAR__DATA__INIT;
    d.round.data = (uint8_t *)m->round;
    d.round.len = AR_ROUND_ID_LEN;
    d.part = m->part;
    d.chunk = m->chunk;
    d.weight = m->weight;
    d.encoding = m->encoding;
    d.count = m->count;
    d.payload.data = (uint8_t *)m->payload;
    d.payload.len = m->payload_len;
    return pack(&d.base, out, out_len);
}

int ar_fetch_build(const struct ar_fetch_msg *m, uint8_t **out, size_t *out_len)
{
    Ctar__Fetch f = CTAR__FETCH__INIT;
    f.round.data = (uint8_t *)m->round;
    f.round.len = AR_ROUND_ID_LEN;
    f.part = m->part;
    f.chunk = m->chunk;
    return pack(&f.base, out, out_len);
}

int ar_result_build(const struct ar_result_msg *m, uint8_t **out, size_t *out_len)
{
    if (m->n_exclusions > AR_MAX_MEMBERS)
        return CM_EINVAL;
    Ctar__Result r = CTAR__RESULT__INIT;
    Ctar__Exclusion ex[AR_MAX_MEMBERS];
    Ctar__Exclusion *exp[AR_MAX_MEMBERS];
    for (size_t i = 0; i < m->n_exclusions; i++) {
        ctar__exclusion__init(&ex[i]);
        ex[i].member = m->exclusions[i].member;
        ex[i].reason = (uint32_t)m->exclusions[i].reason;
        exp[i] = &ex[i];
    }
    r.round.data = (uint8_t *)m->round;
    r.round.len = AR_ROUND_ID_LEN;
    r.part = m->part;
    r.chunk = m->chunk;
    r.weight = m->weight;
    r.counted = m->counted;
    r.dropped = m->dropped;
    r.excluded = m->excluded;
    r.n_exclusions = m->n_exclusions;
    r.exclusions = exp;
    r.encoding = m->encoding;
    r.count = m->count;
    r.payload.data = (uint8_t *)m->payload;
    r.payload.len = m->payload_len;
    return pack(&r.base, out, out_len);
}

int ar_ack_parse(const uint8_t *buf, size_t len, uint32_t *ready)
{
    Ctar__Ack *a = ctar__ack__unpack(NULL, len, buf);
    if (!a)
        return CM_EPARSE;
    int rc = a->in_round ? CM_OK : CM_EPARSE;
    *ready = a->ready;
    ctar__ack__free_unpacked(a, NULL);
    return rc;
}

int ar_ack_build(uint32_t ready, uint8_t **out, size_t *out_len)
{
    Ctar__Ack a = CTAR__ACK__INIT;
    a.ready = ready;
    a.in_round = 1;
    return pack(&a.base, out, out_len);
}
