/* Transport message decoders (see p2p_msg.h). */
#include "p2p/p2p_msg.h"
#include "p2p/p2p.pb-c.h"
#include "p2p/p2p_transport.h"

#include <stdlib.h>
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

/* RelayReserved and RelayWait have the same shape: one port. */
int p2p_relay_port_parse(const uint8_t *buf, size_t len, uint16_t *port)
{
    Ctp2p__RelayWait *w = ctp2p__relay_wait__unpack(NULL, len, buf);
    if (!w)
        return CM_EPARSE;
    int rc = w->port >= 1 && w->port <= 65535 ? CM_OK : CM_EPARSE;
    if (rc == CM_OK)
        *port = (uint16_t)w->port;
    ctp2p__relay_wait__free_unpacked(w, NULL);
    return rc;
}

int p2p_relay_port_encode(uint16_t port, uint8_t **out, size_t *len)
{
    Ctp2p__RelayWait w = CTP2P__RELAY_WAIT__INIT;
    w.port = port;
    *len = ctp2p__relay_wait__get_packed_size(&w);
    if (!(*out = malloc(*len ? *len : 1)))
        return CM_ENOMEM;
    ctp2p__relay_wait__pack(&w, *out);
    return CM_OK;
}

int p2p_relay_circuits_parse(const uint8_t *buf, size_t len, uint64_t ids[P2P_RELAY_MAX_ANNOUNCE],
                             size_t *n)
{
    Ctp2p__RelayCircuits *c = ctp2p__relay_circuits__unpack(NULL, len, buf);
    if (!c)
        return CM_EPARSE;
    int rc = c->n_circuits <= P2P_RELAY_MAX_ANNOUNCE ? CM_OK : CM_EPARSE;
    for (size_t i = 0; rc == CM_OK && i < c->n_circuits; i++) {
        if (c->circuits[i] == 0)
            rc = CM_EPARSE;
        else
            ids[i] = c->circuits[i];
    }
    if (rc == CM_OK)
        *n = c->n_circuits;
    ctp2p__relay_circuits__free_unpacked(c, NULL);
    return rc;
}

int p2p_relay_circuits_encode(const uint64_t *ids, size_t n, uint8_t **out, size_t *len)
{
    if (n > P2P_RELAY_MAX_ANNOUNCE)
        return CM_EINVAL;
    Ctp2p__RelayCircuits c = CTP2P__RELAY_CIRCUITS__INIT;
    c.n_circuits = n;
    c.circuits = (uint64_t *)ids;
    *len = ctp2p__relay_circuits__get_packed_size(&c);
    if (!(*out = malloc(*len ? *len : 1)))
        return CM_ENOMEM;
    ctp2p__relay_circuits__pack(&c, *out);
    return CM_OK;
}

int p2p_relay_accept_parse(const uint8_t *buf, size_t len, uint64_t *circuit)
{
    Ctp2p__RelayAccept *a = ctp2p__relay_accept__unpack(NULL, len, buf);
    if (!a)
        return CM_EPARSE;
    int rc = a->circuit ? CM_OK : CM_EPARSE;
    if (rc == CM_OK)
        *circuit = a->circuit;
    ctp2p__relay_accept__free_unpacked(a, NULL);
    return rc;
}

int p2p_relay_accept_encode(uint64_t circuit, uint8_t **out, size_t *len)
{
    Ctp2p__RelayAccept a = CTP2P__RELAY_ACCEPT__INIT;
    a.circuit = circuit;
    *len = ctp2p__relay_accept__get_packed_size(&a);
    if (!(*out = malloc(*len ? *len : 1)))
        return CM_ENOMEM;
    ctp2p__relay_accept__pack(&a, *out);
    return CM_OK;
}

int p2p_punch_parse(const uint8_t *buf, size_t len, struct p2p_punch_offer *out)
{
    memset(out, 0, sizeof *out);
    Ctp2p__PunchOffer *o = ctp2p__punch_offer__unpack(NULL, len, buf);
    if (!o)
        return CM_EPARSE;
    int rc = (o->ip.len == 4 || o->ip.len == 16) && o->port >= 1 && o->port <= 65535 &&
                     (o->local_ip.len == 0 || o->local_ip.len == o->ip.len)
                 ? CM_OK
                 : CM_EPARSE;
    if (rc == CM_OK) {
        memcpy(out->ip, o->ip.data, o->ip.len);
        out->iplen = o->ip.len;
        out->port = (uint16_t)o->port;
        if (o->local_ip.len)
            memcpy(out->local_ip, o->local_ip.data, o->local_ip.len);
        out->local_iplen = o->local_ip.len;
    }
    ctp2p__punch_offer__free_unpacked(o, NULL);
    return rc;
}

int p2p_punch_encode(const struct p2p_punch_offer *in, uint8_t **out, size_t *len)
{
    if ((in->iplen != 4 && in->iplen != 16) || in->port == 0 ||
        (in->local_iplen && in->local_iplen != in->iplen))
        return CM_EINVAL;
    Ctp2p__PunchOffer o = CTP2P__PUNCH_OFFER__INIT;
    o.ip.data = (uint8_t *)in->ip;
    o.ip.len = in->iplen;
    o.port = in->port;
    o.local_ip.data = (uint8_t *)in->local_ip;
    o.local_ip.len = in->local_iplen;
    *len = ctp2p__punch_offer__get_packed_size(&o);
    if (!(*out = malloc(*len ? *len : 1)))
        return CM_ENOMEM;
    ctp2p__punch_offer__pack(&o, *out);
    return CM_OK;
}
