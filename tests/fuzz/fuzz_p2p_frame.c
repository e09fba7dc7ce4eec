/* libFuzzer target: the frame splitter p2p_frame_next() over a byte stream: walks every complete frame the input holds.
 * Seeds in tests/fuzz/corpus/p2p_frame/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "p2p/p2p_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p;
    size_t pl, used, off = 0;
    while (off < size && p2p_frame_next(data + off, size - off, &p, &pl, &used) == 0) {
        if (used > size - off || pl + 8 != used)
            abort();
        off += used;
    }
    return 0;
}
