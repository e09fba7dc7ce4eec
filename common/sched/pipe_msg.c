/* Parsers and builders of the pipeline-stage messages (pipe_msg.h; byte
 * layout in docs/protocol.md, "Pipeline stages"). DT-FM (seed 003 §2,
 * §3.5) moves activations, their gradients, the tied embedding's gradient
 * and gradient norms between stages held by different volunteers, so every
 * body comes from a peer we do not trust: each length is bounded before it
 * is used, shapes are checked against the total in 64-bit arithmetic, and
 * values are checked finite here so a peer's NaN never reaches a stage's
 * kernels. The builders run the same checks, so nothing unparseable is
 * sent. */
#include "sched/pipe_msg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"
#include "cm_bytes.h"
#include "cm_err.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pipe_msg.c copies int32 targets and fp32 values (little-endian on the wire) with memcpy"
#endif

#define PIPE_STEP_MAX ((int64_t)1 << 62)

static int type_valid(uint32_t type)
{
    return type >= PIPE_MSG_ACT && type <= PIPE_MSG_NORM;
}

static int dim_valid(uint32_t d)
{
    return d >= 1 && d <= PIPE_MAX_DIM;
}

/* Every field rule of pipe_msg.h for an already valid type; the payload
 * itself (targets, values) is checked by the callers. */
static int fields_check(const struct pipe_msg *m)
{
    if (m->enc != PIPE_ENC_FP32 && m->enc != PIPE_ENC_FP16)
        return CM_EUNSUPPORTED;
    if (m->enc == PIPE_ENC_FP16 && m->type != PIPE_MSG_ACT && m->type != PIPE_MSG_GRAD)
        return CM_ERANGE;
    if (m->step < 0 || m->step > PIPE_STEP_MAX || m->replica >= PIPE_MAX_STAGES ||
        m->stage >= PIPE_MAX_STAGES || (uint64_t)m->ntargets + m->count > PIPE_MAX_ITEMS)
        return CM_ERANGE;
    if (!isfinite(m->sumsq))
        return CM_ENUMERIC;
    if (m->type == PIPE_MSG_NORM) {
        if (m->mb || (m->flags & ~PIPE_FLAG_MOVE) || m->B || m->T || m->C || m->total || m->offset ||
            m->count || m->ntargets || m->sumsq < 0)
            return CM_ERANGE;
        return CM_OK;
    }
    if (m->flags || m->sumsq != 0 || m->total == 0 || m->total > PIPE_MAX_TOTAL || m->count == 0 ||
        (uint64_t)m->offset + m->count > m->total)
        return CM_ERANGE;
    if (m->type == PIPE_MSG_TIED)
        return m->mb || m->B || m->T || m->C || m->ntargets ? CM_ERANGE : CM_OK;
    /* ACT, GRAD: each dimension <= 2^20, so the product fits 64 bits. */
    if (m->mb >= PIPE_MAX_MB || !dim_valid(m->B) || !dim_valid(m->T) || !dim_valid(m->C) ||
        (uint64_t)m->B * m->T * m->C != m->total)
        return CM_ERANGE;
    /* The loss needs the targets once per micro-batch: with the first chunk
     * of its activations, never with gradients. */
    uint64_t want = m->type == PIPE_MSG_ACT && m->offset == 0 ? (uint64_t)m->B * m->T : 0;
    return m->ntargets == want ? CM_OK : CM_ERANGE;
}

static int targets_valid(const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t t;
        memcpy(&t, src + 4 * i, sizeof t);
        if (t < -1)
            return 0;
    }
    return 1;
}

size_t pipe_enc_size(uint32_t enc)
{
    return enc == PIPE_ENC_FP16 ? 2 : 4;
}

/* A binary16 with an all-ones exponent is an infinity or a NaN. */
static int f16_finite(uint16_t h)
{
    return (h & 0x7c00u) != 0x7c00u;
}

static int values_finite(const uint8_t *src, size_t n, uint32_t enc)
{
    for (size_t i = 0; i < n; i++) {
        if (enc == PIPE_ENC_FP16) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            if (!f16_finite(h))
                return 0;
            continue;
        }
        float v;
        memcpy(&v, src + 4 * i, sizeof v);
        if (!isfinite(v))
            return 0;
    }
    return 1;
}

void pipe_msg_values(const struct pipe_msg *m, float *dst)
{
    if (m->enc != PIPE_ENC_FP16) {
        memcpy(dst, m->values, (size_t)m->count * sizeof(float));
        return;
    }
    /* the averaging's fp16 decoder (F16C where the CPU has it); the
       length was checked by the parser */
    ar_codec_decode(AR_COMP_FP16, m->values, 2 * (size_t)m->count, m->count, dst);
}

int pipe_f16_encode(const float *src, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = ar_f32_to_f16(src[i]);
        if (!f16_finite(h)) /* not finite, or beyond 65504 */
            return CM_ENUMERIC;
        memcpy(dst + 2 * i, &h, sizeof h);
    }
    return CM_OK;
}

int pipe_msg_parse(uint32_t type, const uint8_t *b, size_t len, struct pipe_msg *out)
{
    memset(out, 0, sizeof *out);
    if (!b || len < PIPE_HDR_LEN || !type_valid(type) || b[0] != PIPE_MSG_VERSION ||
        b[2] != type || b[3])
        return CM_EPARSE;
    if (b[1] != PIPE_ENC_FP32 && b[1] != PIPE_ENC_FP16)
        return CM_EUNSUPPORTED;
    uint64_t step = cm_get_be(b + 4, 8), bits = cm_get_be(b + 56, 8);
    struct pipe_msg m = {
        .type = type,
        .replica = (uint32_t)cm_get_be(b + 12, 4),
        .stage = (uint32_t)cm_get_be(b + 16, 4),
        .mb = (uint32_t)cm_get_be(b + 20, 4),
        .B = (uint32_t)cm_get_be(b + 24, 4),
        .T = (uint32_t)cm_get_be(b + 28, 4),
        .C = (uint32_t)cm_get_be(b + 32, 4),
        .total = (uint32_t)cm_get_be(b + 36, 4),
        .offset = (uint32_t)cm_get_be(b + 40, 4),
        .count = (uint32_t)cm_get_be(b + 44, 4),
        .ntargets = (uint32_t)cm_get_be(b + 48, 4),
        .flags = (uint32_t)cm_get_be(b + 52, 4),
        .enc = b[1],
    };
    /* Both counts are below 2^32: no overflow in 64 bits. */
    if ((uint64_t)len != PIPE_HDR_LEN + 4 * (uint64_t)m.ntargets + pipe_enc_size(m.enc) * (uint64_t)m.count)
        return CM_EPARSE;
    if (step > (uint64_t)PIPE_STEP_MAX)
        return CM_ERANGE;
    m.step = (int64_t)step;
    memcpy(&m.sumsq, &bits, sizeof m.sumsq);
    int rc = fields_check(&m);
    if (rc)
        return rc;
    const uint8_t *targets = b + PIPE_HDR_LEN, *values = targets + 4 * (size_t)m.ntargets;
    if (!targets_valid(targets, m.ntargets))
        return CM_ERANGE;
    if (!values_finite(values, m.count, m.enc))
        return CM_ENUMERIC;
    m.targets = m.ntargets ? targets : NULL;
    m.values = m.count ? values : NULL;
    *out = m;
    return CM_OK;
}

int pipe_msg_build(const struct pipe_msg *m, uint8_t **out, size_t *out_len)
{
    if (!m || !out || !out_len || !type_valid(m->type))
        return CM_EINVAL;
    int rc = fields_check(m);
    if (rc)
        return rc;
    if ((m->ntargets && !m->targets) || (m->count && !m->values))
        return CM_EINVAL;
    if (m->ntargets && !targets_valid(m->targets, m->ntargets))
        return CM_ERANGE;
    if (m->count && !values_finite(m->values, m->count, m->enc))
        return CM_ENUMERIC;
    size_t tlen = 4 * (size_t)m->ntargets, vlen = pipe_enc_size(m->enc) * (size_t)m->count;
    size_t total = PIPE_HDR_LEN + tlen + vlen;
    uint8_t *p = malloc(total);
    if (!p)
        return CM_ENOMEM;
    uint64_t bits;
    memcpy(&bits, &m->sumsq, sizeof bits);
    p[0] = PIPE_MSG_VERSION;
    p[1] = (uint8_t)m->enc;
    p[2] = (uint8_t)m->type;
    p[3] = 0;
    cm_put_be(p + 4, (uint64_t)m->step, 8);
    cm_put_be(p + 12, m->replica, 4);
    cm_put_be(p + 16, m->stage, 4);
    cm_put_be(p + 20, m->mb, 4);
    cm_put_be(p + 24, m->B, 4);
    cm_put_be(p + 28, m->T, 4);
    cm_put_be(p + 32, m->C, 4);
    cm_put_be(p + 36, m->total, 4);
    cm_put_be(p + 40, m->offset, 4);
    cm_put_be(p + 44, m->count, 4);
    cm_put_be(p + 48, m->ntargets, 4);
    cm_put_be(p + 52, m->flags, 4);
    cm_put_be(p + 56, bits, 8);
    if (tlen)
        memcpy(p + PIPE_HDR_LEN, m->targets, tlen);
    if (vlen)
        memcpy(p + PIPE_HDR_LEN + tlen, m->values, vlen);
    *out = p;
    *out_len = total;
    return CM_OK;
}

uint32_t pipe_chunks(uint32_t total, uint32_t ntargets)
{
    if (total == 0 || ntargets >= PIPE_MAX_ITEMS)
        return 0;
    return (uint32_t)(((uint64_t)total + ntargets + PIPE_MAX_ITEMS - 1) / PIPE_MAX_ITEMS);
}

uint32_t pipe_chunk_offset(uint32_t k, uint32_t ntargets)
{
    if (k == 0 || ntargets >= PIPE_MAX_ITEMS)
        return 0;
    uint64_t off = (uint64_t)(PIPE_MAX_ITEMS - ntargets) + (uint64_t)(k - 1) * PIPE_MAX_ITEMS;
    return off > UINT32_MAX ? UINT32_MAX : (uint32_t)off;
}

uint32_t pipe_chunk_count(uint32_t k, uint32_t total, uint32_t ntargets)
{
    if (k >= pipe_chunks(total, ntargets))
        return 0;
    /* k < pipe_chunks() puts the offset below total. */
    uint32_t off = pipe_chunk_offset(k, ntargets);
    uint32_t room = k == 0 ? PIPE_MAX_ITEMS - ntargets : PIPE_MAX_ITEMS;
    return total - off < room ? total - off : room;
}
