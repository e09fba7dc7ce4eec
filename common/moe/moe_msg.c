/* Parsers and builders of the expert-call messages (moe_msg.h; byte layout
 * in docs/protocol.md, "Experts"). Every length read from the wire is
 * bounded before it is used; values are checked finite here so a peer's
 * NaN never reaches an expert (seed 002 §3.3: a server serves many
 * untrusted trainers). */
#include "moe/moe_msg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_bytes.h"
#include "cm_err.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "moe_msg.c copies fp32 wire values (little-endian) with memcpy"
#endif

#define MOE_MAX_F (1u << 20)

int moe_uid_valid(const char *s, size_t len)
{
    if (!s || len == 0 || len > MOE_UID_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

void moe_values_get(float *dst, const uint8_t *src, size_t count)
{
    if (count)
        memcpy(dst, src, count * sizeof(float));
}

int moe_values_finite(const uint8_t *src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float v;
        memcpy(&v, src + 4 * i, sizeof v);
        if (!isfinite(v))
            return 0;
    }
    return 1;
}

/* n and c bounded, n*c values of fp32 exactly filling payload_len. */
static int shape_check(uint32_t n, uint32_t c, size_t payload_len)
{
    if (n == 0 || c == 0 || c > MOE_MAX_C || (uint64_t)n * c > MOE_MAX_VALUES)
        return CM_ERANGE;
    return payload_len == (size_t)n * c * sizeof(float) ? CM_OK : CM_ERANGE;
}

int moe_call_parse(const uint8_t *b, size_t len, struct moe_call *out)
{
    memset(out, 0, sizeof *out);
    if (!b || len < MOE_CALL_HDR_LEN || b[0] != MOE_MSG_VERSION || b[3] != 0)
        return CM_EPARSE;
    size_t ulen = b[2];
    if (len - MOE_CALL_HDR_LEN < ulen || !moe_uid_valid((const char *)b + MOE_CALL_HDR_LEN, ulen))
        return CM_EPARSE;
    if (b[1] != MOE_ENC_FP32)
        return CM_EUNSUPPORTED;
    uint32_t n = (uint32_t)cm_get_be(b + 12, 4), c = (uint32_t)cm_get_be(b + 16, 4);
    const uint8_t *vals = b + MOE_CALL_HDR_LEN + ulen;
    int rc = shape_check(n, c, len - MOE_CALL_HDR_LEN - ulen);
    if (rc)
        return rc;
    if (!moe_values_finite(vals, (size_t)n * c))
        return CM_ENUMERIC;
    memcpy(out->uid, b + MOE_CALL_HDR_LEN, ulen);
    out->uid[ulen] = 0;
    out->forward_id = cm_get_be(b + 4, 8);
    out->n = n;
    out->c = c;
    out->values = vals;
    return CM_OK;
}

int moe_call_build(const struct moe_call *m, uint8_t **out, size_t *out_len)
{
    size_t ulen = strnlen(m->uid, MOE_UID_MAX + 1);
    if (!moe_uid_valid(m->uid, ulen) || !m->values)
        return CM_EINVAL;
    size_t nv = (size_t)m->n * m->c;
    int rc = shape_check(m->n, m->c, nv * sizeof(float));
    if (rc)
        return rc;
    if (!moe_values_finite(m->values, nv))
        return CM_ENUMERIC;
    size_t total = MOE_CALL_HDR_LEN + ulen + nv * sizeof(float);
    uint8_t *p = malloc(total);
    if (!p)
        return CM_ENOMEM;
    p[0] = MOE_MSG_VERSION;
    p[1] = MOE_ENC_FP32;
    p[2] = (uint8_t)ulen;
    p[3] = 0;
    cm_put_be(p + 4, m->forward_id, 8);
    cm_put_be(p + 12, m->n, 4);
    cm_put_be(p + 16, m->c, 4);
    memcpy(p + MOE_CALL_HDR_LEN, m->uid, ulen);
    memcpy(p + MOE_CALL_HDR_LEN + ulen, m->values, nv * sizeof(float));
    *out = p;
    *out_len = total;
    return CM_OK;
}

void moe_result_header(uint32_t n, uint32_t c, uint8_t out[MOE_RESULT_HDR_LEN])
{
    out[0] = MOE_MSG_VERSION;
    out[1] = MOE_ENC_FP32;
    out[2] = out[3] = 0;
    cm_put_be(out + 4, n, 4);
    cm_put_be(out + 8, c, 4);
}

int moe_result_parse(const uint8_t *b, size_t len, struct moe_result *out)
{
    memset(out, 0, sizeof *out);
    if (!b || len < MOE_RESULT_HDR_LEN || b[0] != MOE_MSG_VERSION || b[2] || b[3])
        return CM_EPARSE;
    if (b[1] != MOE_ENC_FP32)
        return CM_EUNSUPPORTED;
    uint32_t n = (uint32_t)cm_get_be(b + 4, 4), c = (uint32_t)cm_get_be(b + 8, 4);
    int rc = shape_check(n, c, len - MOE_RESULT_HDR_LEN);
    if (rc)
        return rc;
    if (!moe_values_finite(b + MOE_RESULT_HDR_LEN, (size_t)n * c))
        return CM_ENUMERIC;
    out->n = n;
    out->c = c;
    out->values = b + MOE_RESULT_HDR_LEN;
    return CM_OK;
}

int moe_result_build(const struct moe_result *m, uint8_t **out, size_t *out_len)
{
    if (!m->values)
        return CM_EINVAL;
    size_t nv = (size_t)m->n * m->c;
    int rc = shape_check(m->n, m->c, nv * sizeof(float));
    if (rc)
        return rc;
    if (!moe_values_finite(m->values, nv))
        return CM_ENUMERIC;
    size_t total = MOE_RESULT_HDR_LEN + nv * sizeof(float);
    uint8_t *p = malloc(total);
    if (!p)
        return CM_ENOMEM;
    moe_result_header(m->n, m->c, p);
    memcpy(p + MOE_RESULT_HDR_LEN, m->values, nv * sizeof(float));
    *out = p;
    *out_len = total;
    return CM_OK;
}

int moe_info_parse(const uint8_t *b, size_t len, struct moe_info *out)
{
    memset(out, 0, sizeof *out);
    if (!b || len < MOE_INFO_HDR_LEN || b[0] != MOE_MSG_VERSION || b[1])
        return CM_EPARSE;
    uint32_t ne = (uint32_t)cm_get_be(b + 2, 2);
    if (ne > MOE_INFO_MAX_EXPERTS)
        return CM_ERANGE;
    out->max_batch = (uint32_t)cm_get_be(b + 4, 4);
    out->max_inflight = (uint32_t)cm_get_be(b + 8, 4);
    out->max_request = (uint32_t)cm_get_be(b + 12, 4);
    if (!out->max_batch || !out->max_inflight || !out->max_request)
        goto range;
    size_t off = MOE_INFO_HDR_LEN;
    for (uint32_t i = 0; i < ne; i++) {
        if (len - off < MOE_INFO_ENTRY_HDR_LEN)
            goto parse;
        const uint8_t *e = b + off;
        size_t ulen = e[0];
        if (e[1] || len - off - MOE_INFO_ENTRY_HDR_LEN < ulen ||
            !moe_uid_valid((const char *)e + MOE_INFO_ENTRY_HDR_LEN, ulen))
            goto parse;
        struct moe_info_expert *x = &out->experts[i];
        x->c = (uint32_t)cm_get_be(e + 2, 4);
        x->f = (uint32_t)cm_get_be(e + 6, 4);
        if (!x->c || x->c > MOE_MAX_C || !x->f || x->f > MOE_MAX_F)
            goto range;
        memcpy(x->uid, e + MOE_INFO_ENTRY_HDR_LEN, ulen);
        x->uid[ulen] = 0;
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(out->experts[j].uid, x->uid))
                goto parse;
        off += MOE_INFO_ENTRY_HDR_LEN + ulen;
    }
    if (off != len)
        goto parse;
    out->n_experts = ne;
    return CM_OK;
parse:
    memset(out, 0, sizeof *out);
    return CM_EPARSE;
range:
    memset(out, 0, sizeof *out);
    return CM_ERANGE;
}

int moe_info_build(const struct moe_info *m, uint8_t **out, size_t *out_len)
{
    if (m->n_experts > MOE_INFO_MAX_EXPERTS)
        return CM_ERANGE;
    if (!m->max_batch || !m->max_inflight || !m->max_request)
        return CM_ERANGE;
    size_t total = MOE_INFO_HDR_LEN;
    for (uint32_t i = 0; i < m->n_experts; i++) {
        const struct moe_info_expert *x = &m->experts[i];
        size_t ulen = strnlen(x->uid, MOE_UID_MAX + 1);
        if (!moe_uid_valid(x->uid, ulen))
            return CM_EINVAL;
        if (!x->c || x->c > MOE_MAX_C || !x->f || x->f > MOE_MAX_F)
            return CM_ERANGE;
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(m->experts[j].uid, x->uid))
                return CM_EINVAL;
        total += MOE_INFO_ENTRY_HDR_LEN + ulen;
    }
    uint8_t *p = malloc(total);
    if (!p)
        return CM_ENOMEM;
    p[0] = MOE_MSG_VERSION;
    p[1] = 0;
    cm_put_be(p + 2, m->n_experts, 2);
    cm_put_be(p + 4, m->max_batch, 4);
    cm_put_be(p + 8, m->max_inflight, 4);
    cm_put_be(p + 12, m->max_request, 4);
    size_t off = MOE_INFO_HDR_LEN;
    for (uint32_t i = 0; i < m->n_experts; i++) {
        const struct moe_info_expert *x = &m->experts[i];
        size_t ulen = strlen(x->uid);
        p[off] = (uint8_t)ulen;
        p[off + 1] = 0;
        cm_put_be(p + off + 2, x->c, 4);
        cm_put_be(p + off + 6, x->f, 4);
        memcpy(p + off + MOE_INFO_ENTRY_HDR_LEN, x->uid, ulen);
        off += MOE_INFO_ENTRY_HDR_LEN + ulen;
    }
    *out = p;
    *out_len = total;
    return CM_OK;
}
