/* libFuzzer target for ar_ack_parse, the parser a member runs on every
 * answer to a gradient chunk and to a "not yet" fetch (common/ar/ar_msg.h).
 * Invariant: a parsed Ack survives a build/parse round trip. */
#include <stdint.h>
#include <stdlib.h>

#include "ar/ar_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t ready, again;
    if (ar_ack_parse(data, size, &ready) != 0)
        return 0;
    uint8_t *b;
    size_t n;
    if (ar_ack_build(ready, &b, &n) == 0) {
        if (ar_ack_parse(b, n, &again) != 0 || again != ready)
            __builtin_trap();
        free(b);
    }
    return 0;
}
