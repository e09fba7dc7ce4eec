/* libFuzzer target for ar_data_parse, the parser an aggregator runs on every
 * gradient chunk a peer sends (common/ar/ar_msg.h). Invariants: a parsed
 * chunk's payload is exactly the encoded size of its count, and the parsed
 * fields survive a build/parse round trip; a decoded payload never writes
 * past count values. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"
#include "ar/ar_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ar_data_msg m;
    if (ar_data_parse(data, size, &m) != 0)
        return 0;
    if (m.count == 0 || m.count > AR_CHUNK_MAX || m.payload_len > AR_PAYLOAD_MAX ||
        m.payload_len != ar_codec_size((int)m.encoding, m.count))
        __builtin_trap();
    float *out = malloc(m.count * sizeof(float));
    if (out) {
        ar_codec_decode((int)m.encoding, m.payload, m.payload_len, m.count, out);
        free(out);
    }
    uint8_t *b;
    size_t n;
    if (ar_data_build(&m, &b, &n) == 0) {
        struct ar_data_msg m2;
        if (ar_data_parse(b, n, &m2) != 0 || m2.count != m.count || m2.part != m.part ||
            m2.chunk != m.chunk || memcmp(m2.round, m.round, AR_ROUND_ID_LEN) ||
            memcmp(m2.payload, m.payload, m.payload_len))
            __builtin_trap();
        ar_data_cleanup(&m2);
        free(b);
    }
    ar_data_cleanup(&m);
    return 0;
}
