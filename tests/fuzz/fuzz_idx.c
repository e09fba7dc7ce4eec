/* libFuzzer target: the shard decoders of common/data/decode.c. The first
 * byte picks the decoder: IDX, llm.c token shard, or gzip (bounded to
 * 1 MiB of output); accepted results must stay inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cm_err.h"
#include "cm_log.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cm_log_set_level((enum cm_log_level) - 1); /* see fuzz_manifest.c */
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0: {
        struct cm_data_idx x;
        if (cm_data_idx_parse(p, n, &x) == CM_OK && x.data + x.count != p + n)
            __builtin_trap();
        break;
    }
    case 1: {
        struct cm_data_tokens t;
        if (cm_data_tokens_parse(p, n, &t) == CM_OK && t.tokens + 2 * t.count != p + n)
            __builtin_trap();
        break;
    }
    default: {
        uint8_t *out = NULL;
        size_t olen = 0;
        if (cm_data_gunzip(p, n, 1 << 20, &out, &olen) == CM_OK) {
            if (olen > (1 << 20))
                __builtin_trap();
            free(out);
        } else if (out) {
            __builtin_trap();
        }
        break;
    }
    }
    return 0;
}
