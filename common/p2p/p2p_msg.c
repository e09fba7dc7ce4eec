/* Transport message decoders (see p2p_msg.h). */
#include "p2p/p2p_msg.h"
#include "p2p/p2p.pb-c.h"
#include "p2p/p2p_transport.h"

#include <string.h>

#include "cm_err.h"

int p2p_chunk_parse(const uint8_t *buf, size_t len, struct p2p_chunk *out)
{
    memset(out, 0, sizeof *out);
    Ctp2p__StreamChunk *ch = ctp2p__stream_chunk__unpack(NULL, len, buf);
    if (!ch)
        return CM_EPARSE;
    if (ch->data.len > P2P_STREAM_CHUNK_MAX || ch->offset > ch->total_len ||
        ch->data.len > ch->total_len - ch->offset) {
        ctp2p__stream_chunk__free_unpacked(ch, NULL);
        return CM_EPARSE;
    }
    out->stream_id = ch->stream_id;
    out->offset = ch->offset;
    out->total_len = ch->total_len;
    out->seq = ch->seq;
    out->last = ch->last;
    out->data = ch->data.data;
    out->len = ch->data.len;
    out->pb_ = ch;
    return CM_OK;
}

void p2p_chunk_cleanup(struct p2p_chunk *c)
{
    if (c->pb_)
        ctp2p__stream_chunk__free_unpacked(c->pb_, NULL);
    c->pb_ = NULL;
}

int p2p_pong_parse(const uint8_t *buf, size_t len, uint8_t ip[16], size_t *iplen)
{
    Ctp2p__Pong *p = ctp2p__pong__unpack(NULL, len, buf);
    if (!p)
        return CM_EPARSE;
    int rc = p->observed_ip.len == 4 || p->observed_ip.len == 16 ? CM_OK : CM_EPARSE;
    if (rc == CM_OK) {
        memcpy(ip, p->observed_ip.data, p->observed_ip.len);
        *iplen = p->observed_ip.len;
    }
    ctp2p__pong__free_unpacked(p, NULL);
    return rc;
}
