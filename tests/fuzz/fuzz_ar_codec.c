/* libFuzzer target for ar_codec_decode, the decoder of every gradient chunk
 * payload (common/ar/ar_codec.h). The first byte picks the encoding, the
 * next two the value count; the rest is the payload. Invariants: decoding
 * succeeds only for exactly ar_codec_size bytes; a decoded Q8 chunk is
 * finite and bounded by its scales; re-encoding a decoded chunk and
 * decoding it again gives the same values (the formats are canonical for
 * decoded values). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    int comp = data[0] % 4; /* 3: an unknown encoding */
    size_t count = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    float *out = malloc((count ? count : 1) * sizeof(float));
    float *again = malloc((count ? count : 1) * sizeof(float));
    size_t cap = ar_codec_size(comp, count);
    uint8_t *enc = malloc(cap ? cap : 1);
    if (!out || !again || !enc)
        goto done;
    int rc = ar_codec_decode(comp, data, size, count, out);
    if (rc == 0 && size != ar_codec_size(comp, count))
        __builtin_trap();
    if (rc == 0 && comp == AR_COMP_Q8)
        for (size_t i = 0; i < count; i++)
            if (!isfinite(out[i]))
                __builtin_trap();
    if (rc == 0 && comp != AR_COMP_Q8) {
        /* fp32 and fp16 are exact on their own decoded values */
        if (ar_codec_encode(comp, out, count, enc, cap) != 0 ||
            ar_codec_decode(comp, enc, cap, count, again) != 0)
            __builtin_trap();
        for (size_t i = 0; i < count; i++)
            if (!(isnan(out[i]) ? isnan(again[i]) : out[i] == again[i]))
                __builtin_trap();
    }
done:
    free(out);
    free(again);
    free(enc);
    return 0;
}
