/* Pure decoders of the transport's own message bodies (p2p.proto:
 * StreamChunk, Pong, the relay messages), kept apart from the socket code
 * so they can be fuzzed (tests/fuzz/fuzz_p2p_chunk.c, fuzz_p2p_relay.c). */
#ifndef P2P_MSG_H
#define P2P_MSG_H

#include <stddef.h>
#include <stdint.h>

struct p2p_chunk {
    uint64_t stream_id, offset, total_len;
    uint32_t seq;
    int last;
    const uint8_t *data; /* borrowed from the decoder; valid until cleanup */
    size_t len;
    void *pb_;
};

/* Checks data <= P2P_STREAM_CHUNK_MAX and offset + len <= total_len. */
int p2p_chunk_parse(const uint8_t *buf, size_t len, struct p2p_chunk *out);
void p2p_chunk_cleanup(struct p2p_chunk *c);

/* Pong: the address the responder saw (4 or 16 bytes). */
int p2p_pong_parse(const uint8_t *buf, size_t len, uint8_t ip[16], size_t *iplen);

/* Relay messages (docs/protocol.md, "Relays"). Ports are 1..65535,
 * circuit ids nonzero, at most P2P_RELAY_MAX_ANNOUNCE circuits per
 * RelayCircuits; anything else is CM_EPARSE. Encoders return a malloc'd
 * body (*out, *len) or CM_ENOMEM. */
#define P2P_RELAY_MAX_ANNOUNCE 16
int p2p_relay_port_parse(const uint8_t *buf, size_t len, uint16_t *port); /* RelayReserved, RelayWait */
int p2p_relay_port_encode(uint16_t port, uint8_t **out, size_t *len);
int p2p_relay_circuits_parse(const uint8_t *buf, size_t len, uint64_t ids[P2P_RELAY_MAX_ANNOUNCE],
                             size_t *n);
int p2p_relay_circuits_encode(const uint64_t *ids, size_t n, uint8_t **out, size_t *len);
int p2p_relay_accept_parse(const uint8_t *buf, size_t len, uint64_t *circuit);
int p2p_relay_accept_encode(uint64_t circuit, uint8_t **out, size_t *len);

/* PunchOffer: ip 4 or 16 bytes, port 1..65535, local_ip absent (local_iplen
 * 0) or as long as ip; CM_EPARSE otherwise (CM_EINVAL to encode). */
struct p2p_punch_offer {
    uint8_t ip[16];
    size_t iplen;
    uint16_t port;
    uint8_t local_ip[16];
    size_t local_iplen;
};
int p2p_punch_parse(const uint8_t *buf, size_t len, struct p2p_punch_offer *o);
int p2p_punch_encode(const struct p2p_punch_offer *o, uint8_t **out, size_t *len);

#endif
