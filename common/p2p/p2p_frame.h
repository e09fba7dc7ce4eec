/* Framing of the peer-to-peer byte stream, separate from any I/O.
 *
 * A connection carries a sequence of frames; each frame is an 8-byte header
 * followed by one serialized Envelope:
 *     'C' 'T' version(1 byte) flags(1 byte) length(4 bytes, big endian)
 * flags is 0 (a signed Envelope follows) or P2P_FRAME_F_SESSION (a session
 * frame, p2p_session.h); other bits are refused.
 * Decoding is a pure function over bytes, so the same code runs on sockets,
 * in unit tests and under libFuzzer (tests/fuzz/fuzz_p2p_frame.c). */
#ifndef P2P_FRAME_H
#define P2P_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define P2P_PROTO_VERSION 1
#define P2P_FRAME_HDR_LEN 8
/* Largest envelope a peer accepts: a 256 KiB stream chunk plus the
 * envelope's own fields, with room to spare. */
#define P2P_FRAME_MAX_PAYLOAD (320u * 1024u)

struct p2p_frame_hdr {
    uint8_t version;
    uint8_t flags;
    uint32_t length; /* payload bytes following the header */
};

/* Parses the header at the start of buf.
 * Returns CM_OK and fills *hdr when a complete header is present,
 * 1 when more bytes are needed (len < 8), CM_EPROTO on a bad magic or
 * unknown flags, CM_EVERSION on an unknown version (hdr->version is set),
 * CM_ETOOBIG when the length exceeds P2P_FRAME_MAX_PAYLOAD. */
int p2p_frame_parse_hdr(const uint8_t *buf, size_t len, struct p2p_frame_hdr *hdr);

/* Splits the next complete frame off buf: on CM_OK *payload points into buf,
 * *payload_len is its length and *consumed the header plus payload. 1 means
 * incomplete (read more), negative codes as above. */
int p2p_frame_next(const uint8_t *buf, size_t len, const uint8_t **payload, size_t *payload_len,
                   size_t *consumed);

/* Writes the header for a payload of `length` bytes (CM_ETOOBIG if over). */
int p2p_frame_write_hdr(uint8_t out[P2P_FRAME_HDR_LEN], size_t length);

#endif
