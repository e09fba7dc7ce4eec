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

/* ---- zero-copy protobuf reading ----------------------------------------
 * Data and Result carry the chunks, so they are read in place: the payload
 * points into the received frame instead of being copied by protobuf-c.
 * Same wire format (ar.proto); fields in any order, the last occurrence of a
 * scalar wins, unknown fields are skipped, a known field with another wire
 * type or anything truncated is an error. */

struct pbr {
    const uint8_t *p, *end;
};

static int pb_varint(struct pbr *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return CM_EPARSE;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return CM_OK;
        }
    }
    return CM_EPARSE;
}

static int pb_fixed64(struct pbr *r, uint64_t *v)
{
    if (r->end - r->p < 8)
        return CM_EPARSE;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = x << 8 | r->p[i];
    r->p += 8;
    *v = x;
    return CM_OK;
}

static int pb_bytes(struct pbr *r, const uint8_t **d, size_t *n)
{
    uint64_t l;
    if (pb_varint(r, &l) || l > (uint64_t)(r->end - r->p))
        return CM_EPARSE;
    *d = r->p;
    *n = (size_t)l;
    r->p += l;
    return CM_OK;
}

/* Next field: its number and wire type (0 varint, 1 fixed64, 2 bytes,
 * 5 fixed32); groups (3, 4) are refused. */
static int pb_field(struct pbr *r, uint32_t *num, int *wt)
{
    uint64_t k;
    if (pb_varint(r, &k) || (k >> 3) == 0 || (k >> 3) > 0x1fffffff)
        return CM_EPARSE;
    *num = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    return *wt == 0 || *wt == 1 || *wt == 2 || *wt == 5 ? CM_OK : CM_EPARSE;
}

static int pb_skip(struct pbr *r, int wt)
{
    uint64_t v;
    const uint8_t *d;
    size_t n;
    switch (wt) {
    case 0:
        return pb_varint(r, &v);
    case 1:
        return pb_fixed64(r, &v);
    case 2:
        return pb_bytes(r, &d, &n);
    default:
        if (r->end - r->p < 4)
            return CM_EPARSE;
        r->p += 4;
        return CM_OK;
    }
}

/* Reads a field of the expected wire type into a uint32 (varint, truncated
 * to 32 bits as protobuf does), a uint64 (fixed64) or a double. */
static int pb_u32(struct pbr *r, int wt, uint32_t *out)
{
    uint64_t v;
    if (wt != 0 || pb_varint(r, &v))
        return CM_EPARSE;
    *out = (uint32_t)v;
    return CM_OK;
}

static int pb_f64(struct pbr *r, int wt, uint64_t *out)
{
    return wt != 1 ? CM_EPARSE : pb_fixed64(r, out);
}

static int pb_dbl(struct pbr *r, int wt, double *out)
{
    uint64_t v;
    if (pb_f64(r, wt, &v))
        return CM_EPARSE;
    memcpy(out, &v, sizeof v);
    return CM_OK;
}

static int pb_len(struct pbr *r, int wt, const uint8_t **d, size_t *n)
{
    return wt != 2 ? CM_EPARSE : pb_bytes(r, d, n);
}

int ar_data_parse(const uint8_t *buf, size_t len, struct ar_data_msg *m)
{
    memset(m, 0, sizeof *m);
    struct pbr r = {buf, buf + len};
    const uint8_t *round = NULL, *payload = NULL;
    size_t round_len = 0, payload_len = 0;
    uint32_t part = 0, chunk = 0, enc = 0, count = 0;
    double weight = 0;
    while (r.p < r.end) {
        uint32_t num;
        int wt, rc;
        if (pb_field(&r, &num, &wt))
            return CM_EPARSE;
        switch (num) {
        case 1: rc = pb_len(&r, wt, &round, &round_len); break;
        case 2: rc = pb_u32(&r, wt, &part); break;
        case 3: rc = pb_u32(&r, wt, &chunk); break;
        case 4: rc = pb_dbl(&r, wt, &weight); break;
        case 5: rc = pb_u32(&r, wt, &enc); break;
        case 6: rc = pb_u32(&r, wt, &count); break;
        case 7: rc = pb_len(&r, wt, &payload, &payload_len); break;
        default: rc = pb_skip(&r, wt); break;
        }
        if (rc)
            return CM_EPARSE;
    }
    if (round_len != AR_ROUND_ID_LEN)
        return CM_EPARSE;
    /* From here on the message names a round: the receiver can hold the
     * (authenticated) sender responsible for what is wrong with it. */
    memcpy(m->round, round, AR_ROUND_ID_LEN);
    m->part = part;
    m->chunk = chunk;
    m->has_round = 1;
    if (!enc_ok(enc))
        return CM_EPARSE;
    int rc = shape_ok(enc, count, payload_len);
    if (rc)
        return rc;
    m->weight = weight;
    m->encoding = enc;
    m->count = count;
    m->payload = payload;
    m->payload_len = payload_len;
    return CM_OK;
}

void ar_data_cleanup(struct ar_data_msg *m)
{
    m->pb_ = NULL; /* nothing owned: the payload points into the input */
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

static int parse_exclusion(const uint8_t *d, size_t n, struct ar_exclusion *e)
{
    struct pbr r = {d, d + n};
    uint32_t member = 0, reason = 0;
    while (r.p < r.end) {
        uint32_t num;
        int wt, rc;
        if (pb_field(&r, &num, &wt))
            return CM_EPARSE;
        if (num == 1)
            rc = pb_u32(&r, wt, &member);
        else if (num == 2)
            rc = pb_u32(&r, wt, &reason);
        else
            rc = pb_skip(&r, wt);
        if (rc)
            return CM_EPARSE;
    }
    if (member >= AR_MAX_MEMBERS || reason < AR_EXCL_NONFINITE || reason > AR_EXCL_WEIGHT)
        return CM_EPARSE;
    e->member = member;
    e->reason = (int)reason;
    return CM_OK;
}

int ar_result_parse(const uint8_t *buf, size_t len, struct ar_result_msg *m)
{
    memset(m, 0, sizeof *m);
    struct pbr r = {buf, buf + len};
    const uint8_t *round = NULL, *payload = NULL;
    size_t round_len = 0, payload_len = 0;
    uint32_t part = 0, chunk = 0, enc = 0, count = 0, ready = 0;
    uint64_t counted = 0, dropped = 0, excluded = 0;
    double weight = 0;
    while (r.p < r.end) {
        uint32_t num;
        int wt, rc;
        const uint8_t *d;
        size_t n;
        if (pb_field(&r, &num, &wt))
            return CM_EPARSE;
        switch (num) {
        case 1: rc = pb_len(&r, wt, &round, &round_len); break;
        case 2: rc = pb_u32(&r, wt, &part); break;
        case 3: rc = pb_u32(&r, wt, &chunk); break;
        case 4: rc = pb_dbl(&r, wt, &weight); break;
        case 5: rc = pb_f64(&r, wt, &counted); break;
        case 6: rc = pb_f64(&r, wt, &dropped); break;
        case 7: rc = pb_f64(&r, wt, &excluded); break;
        case 8:
            rc = pb_len(&r, wt, &d, &n);
            if (!rc && m->n_exclusions == AR_MAX_MEMBERS)
                rc = CM_EPARSE;
            if (!rc)
                rc = parse_exclusion(d, n, &m->exclusions[m->n_exclusions++]);
            break;
        case 9: rc = pb_u32(&r, wt, &enc); break;
        case 10: rc = pb_u32(&r, wt, &count); break;
        case 11: rc = pb_len(&r, wt, &payload, &payload_len); break;
        case 12: rc = pb_u32(&r, wt, &ready); break;
        default: rc = pb_skip(&r, wt); break;
        }
        if (rc) {
            memset(m, 0, sizeof *m);
            return CM_EPARSE;
        }
    }
    int rc = CM_EPARSE;
    if (round_len != AR_ROUND_ID_LEN || !enc_ok(enc) || !isfinite(weight) || weight < 0 ||
        (rc = shape_ok(enc, count, payload_len))) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    memcpy(m->round, round, AR_ROUND_ID_LEN);
    m->part = part;
    m->chunk = chunk;
    m->weight = weight;
    m->counted = counted;
    m->dropped = dropped;
    m->excluded = excluded;
    m->encoding = enc;
    m->count = count;
    m->payload = payload;
    m->payload_len = payload_len;
    m->ready = ready;
    return CM_OK;
}

void ar_result_cleanup(struct ar_result_msg *m)
{
    m->pb_ = NULL; /* nothing owned: the payload points into the input */
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

/* Appends the key and length of a bytes field of n bytes. */
static size_t put_bytes_key(uint8_t *p, uint32_t field, size_t n)
{
    size_t k = 0;
    p[k++] = (uint8_t)(field << 3 | 2);
    uint64_t v = n;
    do {
        p[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return k;
}

/* Packs msg (its payload left empty, hence omitted) and the payload's key
 * and length into a fresh buffer: payload is the last field of Data and
 * Result, so head followed by the payload is the whole message. */
static int pack_head(const ProtobufCMessage *msg, uint32_t field, size_t payload_len,
                     uint8_t **out, size_t *out_len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *b = malloc(n + 16);
    if (!b)
        return CM_ENOMEM;
    protobuf_c_message_pack(msg, b);
    if (payload_len)
        n += put_bytes_key(b + n, field, payload_len);
    *out = b;
    *out_len = n;
    return CM_OK;
}

int ar_data_build_head(const struct ar_data_msg *m, uint8_t **out, size_t *out_len)
{
    Ctar__Data d = CTAR__DATA__INIT;
    d.round.data = (uint8_t *)m->round;
    d.round.len = AR_ROUND_ID_LEN;
    d.part = m->part;
    d.chunk = m->chunk;
    d.weight = m->weight;
    d.encoding = m->encoding;
    d.count = m->count;
    return pack_head(&d.base, 7, m->payload_len, out, out_len);
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

static int result_pack(const struct ar_result_msg *m, int head, uint8_t **out, size_t *out_len)
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
    r.ready = m->ready;
    /* The head carries `ready` (field 12) before the payload (11): fields
     * may come in any order on the wire, and the payload must come last. */
    if (head)
        return pack_head(&r.base, 11, m->payload_len, out, out_len);
    r.payload.data = (uint8_t *)m->payload;
    r.payload.len = m->payload_len;
    return pack(&r.base, out, out_len);
}

int ar_result_build(const struct ar_result_msg *m, uint8_t **out, size_t *out_len)
{
    return result_pack(m, 0, out, out_len);
}

int ar_result_build_head(const struct ar_result_msg *m, uint8_t **out, size_t *out_len)
{
    return result_pack(m, 1, out, out_len);
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
