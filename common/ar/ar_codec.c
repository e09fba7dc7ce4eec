/* Gradient chunk encodings of the averaging engine (formats and error
 * bounds in ar_codec.h and docs/averaging.md). The 8-bit format follows the
 * blockwise quantization used for DeDLOC's gradient averaging (seed
 * 000_02cc6b5d62a616fc.txt, section 3.3, "8-bit quantization" of the
 * all-reduce payloads): one absmax scale per block, so one large value only
 * costs precision inside its own block. Quantization runs in fp32 for
 * scales >= 2^-100 and in double below, so a tiny or subnormal scale
 * neither overflows 127/s nor loses the codes. */
#include "ar/ar_codec.h"

#include <math.h>
#include <string.h>

#include "cm_err.h"

/* binary16 conversions with F16C on x86-64 (every CPU with AVX2 has it):
 * the same IEEE round-to-nearest-even as ar_f32_to_f16, 8 values per
 * instruction instead of a branchy scalar loop, which made fp16 rounds cost
 * twice the CPU of fp32 ones. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__BYTE_ORDER__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <immintrin.h>
#define AR_F16C 1

static int have_f16c(void)
{
    static int known = -1;
    if (known < 0)
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    return known;
}

/* Finite values beyond +-65504 saturate (as the scalar path); NaN and
 * infinities are converted as they are. Returns how many values it did. */
__attribute__((target("avx,f16c"))) static size_t f16_encode_f16c(const float *x, size_t count,
                                                                  uint8_t *out)
{
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    const __m256 inf = _mm256_set1_ps(INFINITY);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 c = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
        __m256 nonfinite = _mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_NLT_UQ);
        c = _mm256_blendv_ps(c, v, nonfinite);
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i),
                         _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return i;
}

__attribute__((target("avx,f16c"))) static size_t f16_decode_f16c(const uint8_t *in, size_t count,
                                                                  float *out)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + 2 * i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
}
#endif

size_t ar_codec_size(int comp, size_t count)
{
    switch (comp) {
    case AR_COMP_NONE:
        return 4 * count;
    case AR_COMP_FP16:
        return 2 * count;
    case AR_COMP_Q8:
        return 4 * ((count + AR_Q8_BLOCK - 1) / AR_Q8_BLOCK) + count;
    default:
        return 0;
    }
}

uint16_t ar_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* Inf stays Inf, NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) /* 65520 and above round to Inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself ties to even 0) */
        return sign;
    uint32_t e = ax >> 23;
    if (e < 113) { /* binary16 subnormal: units of 2^-24 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent is the correct rounding */
    return (uint16_t)(sign | h);
}

float ar_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        memcpy(&x, &f, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &x, 4);
    return f;
}

static void put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

static float get_f32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static void q8_encode_block(const float *x, size_t k, uint8_t *out)
{
    float s = 0.0f;
    int bad = 0;
    for (size_t i = 0; i < k; i++) {
        float a = fabsf(x[i]);
        if (!isfinite(a))
            bad = 1;
        else if (a > s)
            s = a;
    }
    if (bad) {
        /* A non-finite scale marks the block; the receiver rejects it. */
        put_f32(out, NAN);
        memset(out + 4, 0, k);
        return;
    }
    put_f32(out, s);
    if (s == 0.0f) {
        memset(out + 4, 0, k);
        return;
    }
    if (s >= 0x1p-100f) {
        /* fp32 is enough here: the product's rounding moves x*127/s by at
         * most 2^-16, well inside the documented bound. */
        float inv = 127.0f / s;
        for (size_t i = 0; i < k; i++) {
            float q = nearbyintf(x[i] * inv);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            out[4 + i] = (uint8_t)(int8_t)q;
        }
        return;
    }
    double inv = 127.0 / (double)s;
    for (size_t i = 0; i < k; i++) {
        long q = lrint((double)x[i] * inv);
        if (q > 127)
            q = 127;
        if (q < -127)
            q = -127;
        out[4 + i] = (uint8_t)(int8_t)q;
    }
}

int ar_codec_encode(int comp, const float *x, size_t count, uint8_t *out, size_t cap)
{
    size_t need = ar_codec_size(comp, count);
    if (comp != AR_COMP_NONE && comp != AR_COMP_FP16 && comp != AR_COMP_Q8)
        return CM_EINVAL;
    if (cap < need)
        return CM_ETOOBIG;
    switch (comp) {
    case AR_COMP_NONE:
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out, x, 4 * count);
#else
        for (size_t i = 0; i < count; i++)
            put_f32(out + 4 * i, x[i]);
#endif
        break;
    case AR_COMP_FP16: {
        size_t i = 0;
#ifdef AR_F16C
        if (have_f16c())
            i = f16_encode_f16c(x, count, out);
#endif
        for (; i < count; i++) {
            float v = x[i];
            if (isfinite(v) && fabsf(v) > 65504.0f)
                v = copysignf(65504.0f, v);
            uint16_t h = ar_f32_to_f16(v);
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
        break;
    }
    default:
        for (size_t b = 0; b < count; b += AR_Q8_BLOCK) {
            size_t k = count - b < AR_Q8_BLOCK ? count - b : AR_Q8_BLOCK;
            q8_encode_block(x + b, k, out);
            out += 4 + k;
        }
        break;
    }
    return CM_OK;
}

int ar_codec_decode(int comp, const uint8_t *in, size_t len, size_t count, float *out)
{
    if (comp != AR_COMP_NONE && comp != AR_COMP_FP16 && comp != AR_COMP_Q8)
        return CM_EINVAL;
    if (count > SIZE_MAX / 8 || len != ar_codec_size(comp, count))
        return CM_EPARSE;
    switch (comp) {
    case AR_COMP_NONE:
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out, in, 4 * count);
#else
        for (size_t i = 0; i < count; i++)
            out[i] = get_f32(in + 4 * i);
#endif
        return CM_OK;
    case AR_COMP_FP16: {
        size_t i = 0;
#ifdef AR_F16C
        if (have_f16c())
            i = f16_decode_f16c(in, count, out);
#endif
        for (; i < count; i++)
            out[i] = ar_f16_to_f32((uint16_t)(in[2 * i] | in[2 * i + 1] << 8));
        return CM_OK;
    }
    default:
        break;
    }
    int rc = CM_OK;
    for (size_t b = 0; b < count; b += AR_Q8_BLOCK) {
        size_t k = count - b < AR_Q8_BLOCK ? count - b : AR_Q8_BLOCK;
        float s = get_f32(in);
        /* A bad code is a format error whatever the scale; a bad scale is a
         * numeric one. Both are reported after the whole input was checked
         * so the classification does not depend on block order. */
        for (size_t i = 0; i < k; i++)
            if (in[4 + i] == 0x80)
                return CM_EPARSE;
        if (!isfinite(s) || s < 0.0f) {
            rc = CM_ENUMERIC;
            memset(out + b, 0, k * sizeof *out);
        } else if (s >= 0x1p-100f) {
            float d = s / 127.0f; /* two fp32 roundings: within the bound */
            for (size_t i = 0; i < k; i++)
                out[b + i] = (float)(int8_t)in[4 + i] * d;
        } else {
            double d = (double)s / 127.0;
            for (size_t i = 0; i < k; i++)
                out[b + i] = (float)((double)(int8_t)in[4 + i] * d);
        }
        in += 4 + k;
    }
    return rc;
}
