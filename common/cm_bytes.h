/* Big-endian integers in wire headers (the p2p messages' bodies,
 * docs/protocol.md): one definition for every codec that writes or reads
 * them. */
#ifndef CM_BYTES_H
#define CM_BYTES_H

#include <stdint.h>

/* Writes the low `bytes` bytes of v at p, most significant first. */
static inline void cm_put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

/* Reads `bytes` bytes at p, most significant first. */
static inline uint64_t cm_get_be(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

#endif
