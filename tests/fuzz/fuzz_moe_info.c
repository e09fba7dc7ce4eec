/* libFuzzer target for INFO answers (common/moe/moe_msg.h, type 66): what
 * parses has at most MOE_INFO_MAX_EXPERTS distinct valid uids with bounded
 * widths and non-zero limits, and re-encodes to exactly the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct moe_info in;
    if (moe_info_parse(data, size, &in) != 0)
        return 0;
    if (in.n_experts > MOE_INFO_MAX_EXPERTS || !in.max_batch || !in.max_inflight ||
        !in.max_request)
        __builtin_trap();
    for (uint32_t i = 0; i < in.n_experts; i++) {
        if (!moe_uid_valid(in.experts[i].uid, strlen(in.experts[i].uid)) || !in.experts[i].c ||
            in.experts[i].c > MOE_MAX_C || !in.experts[i].f)
            __builtin_trap();
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(in.experts[i].uid, in.experts[j].uid))
                __builtin_trap();
    }
    uint8_t *b;
    size_t len;
    if (moe_info_build(&in, &b, &len) != 0 || len != size || memcmp(b, data, size) != 0)
        __builtin_trap();
    free(b);
    return 0;
}
