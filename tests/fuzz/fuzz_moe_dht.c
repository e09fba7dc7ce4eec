/* libFuzzer target: the expert record decoder moe_rec_decode()
 * (common/moe/moe_dht.h), with a re-encode that must give back the same
 * bytes for everything it accepts. Seeds in tests/fuzz/corpus/moe_dht/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_dht.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct moe_rec r;
    if (moe_rec_decode(data, size, &r) != 0)
        return 0;
    if (r.count < 1 || r.count > r.size || r.size > MOE_MAX_SIZE)
        abort();
    uint8_t out[MOE_REC_MAX];
    size_t len = 0;
    /* strict decoding: exactly one encoding per record */
    if (moe_rec_encode(&r, out, sizeof out, &len) != 0 || len != size || memcmp(out, data, size))
        abort();
    return 0;
}
