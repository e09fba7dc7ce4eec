#include "agent/peer/state_msg.h"
#include "cm_err.h"

#include <string.h>

static void put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

static uint64_t get_be(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

void peer_state_req_encode(const struct peer_state_req *q, uint8_t out[PEER_STATE_REQ_LEN])
{
    put_be(out, (uint64_t)q->min_step, 8);
    put_be(out + 8, q->offset, 8);
    put_be(out + 16, q->max_len, 4);
}

int peer_state_req_parse(const uint8_t *b, size_t len, struct peer_state_req *out)
{
    if (len != PEER_STATE_REQ_LEN)
        return CM_EPROTO;
    out->min_step = (int64_t)get_be(b, 8);
    out->offset = get_be(b + 8, 8);
    out->max_len = (uint32_t)get_be(b + 16, 4);
    return out->min_step < 0 || out->max_len == 0 ? CM_EINVAL : CM_OK;
}

void peer_state_resp_header(const struct peer_state_resp *r, uint8_t out[PEER_STATE_HDR_LEN])
{
    out[0] = (uint8_t)(r->ready ? 1 : 0);
    put_be(out + 1, r->ready ? (uint64_t)r->step : 0, 8);
    put_be(out + 9, r->ready ? r->total : 0, 8);
    if (r->ready)
        memcpy(out + 17, r->sha, CM_SHA256_LEN);
    else
        memset(out + 17, 0, CM_SHA256_LEN);
}

int peer_state_resp_parse(const uint8_t *b, size_t len, struct peer_state_resp *out)
{
    memset(out, 0, sizeof *out);
    if (len < PEER_STATE_HDR_LEN || b[0] > 1)
        return CM_EPROTO;
    out->ready = b[0];
    out->data = b + PEER_STATE_HDR_LEN;
    out->len = len - PEER_STATE_HDR_LEN;
    if (!out->ready)
        return out->len ? CM_EPROTO : CM_OK;
    out->step = (int64_t)get_be(b + 1, 8);
    out->total = get_be(b + 9, 8);
    memcpy(out->sha, b + 17, CM_SHA256_LEN);
    if (out->step < 0 || out->total == 0 || out->total > PEER_STATE_MAX_TOTAL || out->len > out->total)
        return CM_EPROTO;
    return CM_OK;
}
