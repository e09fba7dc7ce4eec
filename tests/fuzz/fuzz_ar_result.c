/* libFuzzer target for ar_result_parse, the parser every member runs on the
 * averaged chunks aggregators return (common/ar/ar_msg.h). Invariants:
 * weight finite and >= 0, at most AR_MAX_MEMBERS exclusions with valid
 * members and reasons, payload exactly the encoded size of count, and a
 * build/parse round trip keeps every field. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"
#include "ar/ar_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ar_result_msg m;
    if (ar_result_parse(data, size, &m) != 0)
        return 0;
    if (!isfinite(m.weight) || m.weight < 0 || m.n_exclusions > AR_MAX_MEMBERS ||
        m.payload_len != ar_codec_size((int)m.encoding, m.count))
        __builtin_trap();
    for (size_t i = 0; i < m.n_exclusions; i++)
        if (m.exclusions[i].member >= AR_MAX_MEMBERS || m.exclusions[i].reason < 1 ||
            m.exclusions[i].reason > AR_EXCL_WEIGHT)
            __builtin_trap();
    uint8_t *b;
    size_t n;
    if (ar_result_build(&m, &b, &n) == 0) {
        struct ar_result_msg m2;
        if (ar_result_parse(b, n, &m2) != 0 || m2.count != m.count || m2.weight != m.weight ||
            m2.counted != m.counted || m2.n_exclusions != m.n_exclusions ||
            memcmp(m2.payload, m.payload, m.payload_len))
            __builtin_trap();
        ar_result_cleanup(&m2);
        free(b);
    }
    ar_result_cleanup(&m);
    return 0;
}
