/* libFuzzer target: the stream chunk and pong decoders (p2p_msg.h).
 * Seeds in tests/fuzz/corpus/p2p_chunk/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "p2p/p2p_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct p2p_chunk c;
    if (p2p_chunk_parse(data, size, &c) == 0) {
        if (c.offset + c.len > c.total_len)
            abort();
        p2p_chunk_cleanup(&c);
    }
    uint8_t ip[16];
    size_t n;
    p2p_pong_parse(data, size, ip, &n);
    return 0;
}
