/* libFuzzer target for the expert-call requests a server reads
 * (common/moe/moe_msg.h: FORWARD, type 64; BACKWARD, type 65, has the same
 * layout). What parses stays inside the input, has a valid uid, a bounded
 * shape and finite values, and re-encodes to exactly the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct moe_call m;
    if (moe_call_parse(data, size, &m) != 0)
        return 0;
    size_t nv = (size_t)m.n * m.c;
    if (!m.n || !m.c || nv > MOE_MAX_VALUES || m.c > MOE_MAX_C ||
        !moe_uid_valid(m.uid, strlen(m.uid)) || m.values + nv * 4 != data + size ||
        !moe_values_finite(m.values, nv))
        __builtin_trap();
    uint8_t *b;
    size_t len;
    if (moe_call_build(&m, &b, &len) != 0 || len != size || memcmp(b, data, size) != 0)
        __builtin_trap();
    free(b);
    return 0;
}
