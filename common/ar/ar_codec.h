/* Wire encodings of gradient chunks for the averaging engine (ar.h): pure
 * encode/decode functions, no I/O, so they are unit-tested for round trips
 * and error bounds and fuzzed (tests/fuzz/fuzz_ar_codec.c).
 *
 * Formats (all little-endian; docs/averaging.md, "Compression"):
 *   AR_COMP_NONE  count x fp32.                        size 4*count
 *   AR_COMP_FP16  count x IEEE binary16, round to nearest even; finite
 *                 values beyond +-65504 saturate to +-65504 (as hivemind's
 *                 float16 compression clamps), NaN/Inf stay NaN/Inf.
 *                                                      size 2*count
 *   AR_COMP_Q8    blocks of AR_Q8_BLOCK values (the last may be shorter);
 *                 each block: fp32 scale s = max|x| of the block, then one
 *                 int8 code per value, q = round(x / s * 127) in -127..127
 *                 (-128 is invalid); decoded x' = q * s / 127.
 *                                                      size 4*ceil(count/64) + count
 * Error bounds (tested): NONE exact; FP16 |x'-x| <= 2^-11 |x| for
 * 2^-14 <= |x| <= 65504, <= 2^-25 below; Q8 |x'-x| <= s/254 + s*2^-22 + 2^-149
 * per block (half a quantization step, plus one fp32 rounding). */
#ifndef AR_CODEC_H
#define AR_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "ar/ar.h"

/* Encoded size of `count` values; 0 for an unknown encoding. */
size_t ar_codec_size(int comp, size_t count);

/* Encodes count values into out (cap bytes, at least ar_codec_size).
 * Never fails on values: non-finite inputs produce non-finite output
 * (fp32/fp16 values, Q8 scale) that a receiver rejects. CM_EINVAL on an
 * unknown encoding, CM_ETOOBIG when cap is short. */
int ar_codec_encode(int comp, const float *x, size_t count, uint8_t *out, size_t cap);

/* Decodes exactly `count` values from len bytes. CM_EPARSE when len is not
 * ar_codec_size(comp, count) or a Q8 code is -128, CM_EINVAL on an unknown
 * encoding, CM_ENUMERIC when a Q8 scale is non-finite or negative (out is
 * then unspecified). Non-finite fp32/fp16 values decode as such; the caller
 * validates values. */
int ar_codec_decode(int comp, const uint8_t *in, size_t len, size_t count, float *out);

/* IEEE binary16 conversions (round to nearest even; no saturation here). */
uint16_t ar_f32_to_f16(float f);
float ar_f16_to_f32(uint16_t h);

#endif
