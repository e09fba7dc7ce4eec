/* Frame header codec (see p2p_frame.h). Pure functions: no allocation, no
 * I/O, every length bounded before use. */
#include "p2p/p2p_frame.h"
#include "p2p/p2p_session.h"
#include "cm_err.h"

int p2p_frame_parse_hdr(const uint8_t *buf, size_t len, struct p2p_frame_hdr *hdr)
{
    if (len < P2P_FRAME_HDR_LEN)
        return 1;
    if (buf[0] != 'C' || buf[1] != 'T')
        return CM_EPROTO;
    hdr->version = buf[2];
    hdr->flags = buf[3];
    hdr->length = (uint32_t)buf[4] << 24 | (uint32_t)buf[5] << 16 | (uint32_t)buf[6] << 8 | buf[7];
    if (hdr->version != P2P_PROTO_VERSION)
        return CM_EVERSION;
    if (hdr->flags & ~P2P_FRAME_F_SESSION)
        return CM_EPROTO;
    if (hdr->length > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    return CM_OK;
}

int p2p_frame_next(const uint8_t *buf, size_t len, const uint8_t **payload, size_t *payload_len,
                   size_t *consumed)
{
    struct p2p_frame_hdr h;
    int rc = p2p_frame_parse_hdr(buf, len, &h);
    if (rc != CM_OK)
        return rc;
    if (len - P2P_FRAME_HDR_LEN < h.length)
        return 1;
    *payload = buf + P2P_FRAME_HDR_LEN;
    *payload_len = h.length;
    *consumed = P2P_FRAME_HDR_LEN + (size_t)h.length;
    return CM_OK;
}

int p2p_frame_write_hdr(uint8_t out[P2P_FRAME_HDR_LEN], size_t length)
{
    if (length > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    out[0] = 'C';
    out[1] = 'T';
    out[2] = P2P_PROTO_VERSION;
    out[3] = 0;
    out[4] = (uint8_t)(length >> 24);
    out[5] = (uint8_t)(length >> 16);
    out[6] = (uint8_t)(length >> 8);
    out[7] = (uint8_t)length;
    return CM_OK;
}
