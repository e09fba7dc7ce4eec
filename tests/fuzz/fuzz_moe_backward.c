/* libFuzzer target for the answers a trainer reads to its expert calls
 * (common/moe/moe_msg.h: the result of FORWARD, type 64, and of BACKWARD,
 * type 65: dL/dx). What parses has a bounded shape, finite values that end
 * the input, and re-encodes to exactly the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct moe_result r;
    if (moe_result_parse(data, size, &r) != 0)
        return 0;
    size_t nv = (size_t)r.n * r.c;
    if (!r.n || !r.c || nv > MOE_MAX_VALUES || r.c > MOE_MAX_C ||
        r.values + nv * 4 != data + size || !moe_values_finite(r.values, nv))
        __builtin_trap();
    uint8_t *b;
    size_t len;
    if (moe_result_build(&r, &b, &len) != 0 || len != size || memcmp(b, data, size) != 0)
        __builtin_trap();
    free(b);
    return 0;
}
