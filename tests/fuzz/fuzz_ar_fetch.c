/* libFuzzer target for ar_fetch_parse, the parser an aggregator runs on
 * every request for an averaged chunk (common/ar/ar_msg.h). Invariant: a
 * parsed request survives a build/parse round trip unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ar_fetch_msg m, m2;
    if (ar_fetch_parse(data, size, &m) != 0)
        return 0;
    uint8_t *b;
    size_t n;
    if (ar_fetch_build(&m, &b, &n) == 0) {
        if (ar_fetch_parse(b, n, &m2) != 0 || memcmp(&m, &m2, sizeof m))
            __builtin_trap();
        free(b);
    }
    return 0;
}
