/* Pure decoders of the transport's own message bodies (p2p.proto:
 * StreamChunk, Pong), kept apart from the socket code so they can be fuzzed
 * (tests/fuzz/fuzz_p2p_chunk.c). */
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

#endif
