/* Averaging wire formats: chunk codecs (fp32, fp16, 8-bit blockwise) with
 * round trips and their documented error bounds (ar_codec.h), the
 * partition of the flat buffer (seed 000, Appendix B eq. (6)), round ids,
 * and the message parsers (round trips, lying lengths, truncation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ar/ar.h"
#include "ar/ar_codec.h"
#include "ar/ar_msg.h"
#include "cm_err.h"

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Values over many magnitudes, both signs, some exact zeros. */
static void fill(float *x, size_t n, double lo_exp, double hi_exp)
{
    for (size_t i = 0; i < n; i++) {
        double e = lo_exp + (hi_exp - lo_exp) * urand();
        double v = pow(2.0, e) * (urand() < 0.5 ? -1 : 1);
        x[i] = i % 97 == 0 ? 0.0f : (float)v;
    }
}

static void test_none_exact(void **s)
{
    (void)s;
    enum { N = 1000 };
    float x[N], y[N];
    uint8_t b[4 * N];
    fill(x, N, -140, 120);
    x[3] = NAN;
    x[4] = -INFINITY;
    assert_int_equal(ar_codec_size(AR_COMP_NONE, N), 4 * N);
    assert_int_equal(ar_codec_encode(AR_COMP_NONE, x, N, b, sizeof b), 0);
    assert_int_equal(ar_codec_decode(AR_COMP_NONE, b, sizeof b, N, y), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(b[0], 0); /* x[0] = 0: little-endian bytes */
    assert_int_equal(ar_codec_encode(AR_COMP_NONE, x, N, b, sizeof b - 1), CM_ETOOBIG);
    assert_int_equal(ar_codec_decode(AR_COMP_NONE, b, sizeof b - 1, N, y), CM_EPARSE);
    assert_int_equal(ar_codec_decode(7, b, sizeof b, N, y), CM_EINVAL);
    assert_int_equal(ar_codec_size(7, N), 0);
}

static void test_fp16_known(void **s)
{
    (void)s;
    assert_int_equal(ar_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(ar_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(ar_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ar_f32_to_f16(65520.0f), 0x7c00); /* ties to even: overflow */
    assert_int_equal(ar_f32_to_f16(0x1p-24f), 0x0001);  /* smallest subnormal */
    assert_int_equal(ar_f32_to_f16(0x1p-25f), 0x0000);  /* tie to even zero */
    assert_int_equal(ar_f32_to_f16(0x1.8p-24f), 0x0002); /* tie to even 2 */
    assert_int_equal(ar_f32_to_f16(0x1p-14f), 0x0400);  /* smallest normal */
    assert_int_equal(ar_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie: even mantissa */
    assert_int_equal(ar_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02);
    assert_int_equal(ar_f32_to_f16(INFINITY), 0x7c00);
    assert_true((ar_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (ar_f32_to_f16(NAN) & 0x3ff));
    /* Every binary16 value survives the round trip f16 -> f32 -> f16. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ar_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        assert_int_equal(ar_f32_to_f16(f), h);
    }
    /* Saturation in the encoder (not in the bare conversion). */
    float x[2] = {1e6f, -7e4f}, y[2];
    uint8_t b[4];
    assert_int_equal(ar_codec_encode(AR_COMP_FP16, x, 2, b, 4), 0);
    assert_int_equal(ar_codec_decode(AR_COMP_FP16, b, 4, 2, y), 0);
    assert_true(y[0] == 65504.0f && y[1] == -65504.0f);

    /* The vectorized paths (F16C where the CPU has it) give exactly the
     * scalar conversions: every binary16 value decodes to the same bits,
     * and floats of every magnitude (ties, subnormals, saturation, Inf,
     * NaN) encode to the same codes, in arrays long enough to vectorize. */
    enum { M = 0x10000 };
    uint8_t *hb = malloc(2 * M);
    float *hf = malloc(4 * M), *xf = malloc(4 * M);
    for (uint32_t h = 0; h < M; h++) {
        hb[2 * h] = (uint8_t)h;
        hb[2 * h + 1] = (uint8_t)(h >> 8);
    }
    assert_int_equal(ar_codec_decode(AR_COMP_FP16, hb, 2 * M, M, hf), 0);
    for (uint32_t h = 0; h < M; h++) {
        float want = ar_f16_to_f32((uint16_t)h);
        if (isnan(want))
            assert_true(isnan(hf[h]));
        else
            assert_memory_equal(&hf[h], &want, 4);
    }
    for (uint32_t i = 0; i < M; i++) {
        /* every binary16 value, then the midpoints and neighbours around it */
        float f = ar_f16_to_f32((uint16_t)(i >> 2 | (i & 1) << 15));
        if (i & 2)
            f = nextafterf(f, INFINITY);
        xf[i] = isnan(f) ? f : f * (i % 3 == 0 ? 1.0f : 1.0f + 0x1p-11f);
    }
    xf[5] = 1e30f;
    xf[6] = -65519.0f;
    xf[7] = 65520.0f;
    assert_int_equal(ar_codec_encode(AR_COMP_FP16, xf, M, hb, 2 * M), 0);
    for (uint32_t i = 0; i < M; i++) {
        float v = xf[i];
        if (isfinite(v) && fabsf(v) > 65504.0f)
            v = copysignf(65504.0f, v);
        uint16_t want = ar_f32_to_f16(v), got = (uint16_t)(hb[2 * i] | hb[2 * i + 1] << 8);
        if (isnan(v))
            assert_true((got & 0x7c00) == 0x7c00 && (got & 0x3ff));
        else
            assert_int_equal(got, want);
    }
    free(hb), free(hf), free(xf);
}

static void test_fp16_bound(void **s)
{
    (void)s;
    enum { N = 20000 };
    float *x = malloc(N * 4), *y = malloc(N * 4);
    uint8_t *b = malloc(N * 2);
    fill(x, N, -30, 15.99);
    assert_int_equal(ar_codec_encode(AR_COMP_FP16, x, N, b, N * 2), 0);
    assert_int_equal(ar_codec_decode(AR_COMP_FP16, b, N * 2, N, y), 0);
    double worst_rel = 0;
    for (size_t i = 0; i < N; i++) {
        double ax = fabs(x[i]), err = fabs((double)y[i] - x[i]);
        if (ax >= 0x1p-14) {
            assert_true(err <= 0x1p-11 * ax);
            worst_rel = fmax(worst_rel, err / ax);
        } else {
            assert_true(err <= 0x1p-25);
        }
    }
    assert_true(worst_rel > 0x1p-13); /* the bound is not vacuous: rounding happened */
    free(x), free(y), free(b);
}

static void test_q8_bound(void **s)
{
    (void)s;
    enum { N = 64 * 300 + 17 }; /* a short last block */
    float *x = malloc(N * 4), *y = malloc(N * 4);
    size_t sz = ar_codec_size(AR_COMP_Q8, N);
    assert_int_equal(sz, 4 * 301 + N);
    uint8_t *b = malloc(sz);
    for (int round = 0; round < 3; round++) {
        /* mixed magnitudes inside blocks; round 2: tiny (subnormal) scales */
        if (round == 2)
            fill(x, N, -149, -127);
        else
            fill(x, N, round ? -20 : -3, round ? 10 : 3);
        x[64 * 5] = 0; /* an all-zero block: */
        for (int i = 0; i < 64; i++)
            x[64 * 7 + i] = 0;
        assert_int_equal(ar_codec_encode(AR_COMP_Q8, x, N, b, sz), 0);
        assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz, N, y), 0);
        double worst = 0;
        for (size_t blk = 0; blk < N; blk += 64) {
            size_t k = N - blk < 64 ? N - blk : 64;
            double sc = 0;
            for (size_t i = 0; i < k; i++)
                sc = fmax(sc, fabs(x[blk + i]));
            double bound = sc / 254 + sc * 0x1p-22 + 0x1p-149;
            for (size_t i = 0; i < k; i++) {
                double err = fabs((double)y[blk + i] - x[blk + i]);
                assert_true(err <= bound);
                if (sc > 0)
                    worst = fmax(worst, err / sc);
            }
        }
        for (int i = 0; i < 64; i++)
            assert_true(y[64 * 7 + i] == 0.0f);
        assert_true(worst > 1.0 / 1000); /* quantization error is really there */
    }
    /* Format errors. */
    b[4] = 0x80; /* code -128 */
    assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz, N, y), CM_EPARSE);
    b[4] = 0;
    float nanf_ = NAN;
    memcpy(b + 68, &nanf_, 4); /* scale of block 1 */
    assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz, N, y), CM_ENUMERIC);
    float neg = -1.0f;
    memcpy(b + 68, &neg, 4);
    assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz, N, y), CM_ENUMERIC);
    assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz - 1, N, y), CM_EPARSE);
    /* A non-finite input marks its block. */
    x[100] = INFINITY;
    assert_int_equal(ar_codec_encode(AR_COMP_Q8, x, N, b, sz), 0);
    assert_int_equal(ar_codec_decode(AR_COMP_Q8, b, sz, N, y), CM_ENUMERIC);
    free(x), free(y), free(b);
}

static void test_partition(void **s)
{
    (void)s;
    struct ar_member m[5];
    memset(m, 0, sizeof m);
    size_t np, off[5], len[5];
    uint32_t own[5];
    for (int i = 0; i < 4; i++)
        m[i].fraction = 0.25;
    assert_int_equal(ar_partition(m, 4, 4096, 256, &np, own, off, len), 0);
    assert_int_equal(np, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(own[i], i);
        assert_int_equal(off[i], 1024 * i);
        assert_int_equal(len[i], 1024);
    }
    /* Uneven, with a non-aggregator and a ragged end. */
    m[0].fraction = 1, m[1].fraction = 0, m[2].fraction = 3, m[3].fraction = 4, m[4].fraction = 0;
    size_t n = 100000;
    assert_int_equal(ar_partition(m, 5, n, 256, &np, own, off, len), 0);
    assert_int_equal(np, 3);
    assert_int_equal(own[0], 0);
    assert_int_equal(own[1], 2);
    assert_int_equal(own[2], 3);
    size_t total = 0;
    for (size_t k = 0; k < np; k++) {
        assert_int_equal(off[k], total);
        assert_int_equal(off[k] % 256, 0);
        total += len[k];
    }
    assert_int_equal(total, n);
    assert_true(labs((long)len[0] - (long)(n / 8)) <= 256);
    assert_true(labs((long)len[2] - (long)(n / 2)) <= 256);
    /* Tiny buffer: some parts empty, still a cover. */
    assert_int_equal(ar_partition(m, 5, 300, 256, &np, own, off, len), 0);
    assert_int_equal(len[0] + len[1] + len[2], 300);
    /* Invalid fractions. */
    m[0].fraction = NAN;
    assert_int_equal(ar_partition(m, 5, n, 256, &np, own, off, len), CM_EINVAL);
    m[0].fraction = -1;
    assert_int_equal(ar_partition(m, 5, n, 256, &np, own, off, len), CM_EINVAL);
    for (int i = 0; i < 5; i++)
        m[i].fraction = 0;
    assert_int_equal(ar_partition(m, 5, n, 256, &np, own, off, len), CM_EINVAL);
}

static void test_round_id(void **s)
{
    (void)s;
    struct ar_member m[3];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 3; i++) {
        m[i].pub[0] = (uint8_t)i;
        m[i].fraction = 1;
        m[i].sends = 1;
    }
    struct ar_round_config c = {.step = 7, .group_id = (const uint8_t *)"g1", .group_id_len = 2,
                                .members = m, .n_members = 3, .n = 1000};
    uint8_t a[32], b[32];
    assert_int_equal(ar_round_id(&c, a), 0);
    assert_int_equal(ar_round_id(&c, b), 0);
    assert_memory_equal(a, b, 32);
    m[1].fraction = 1.5; /* another view of the schedule: another round */
    assert_int_equal(ar_round_id(&c, b), 0);
    assert_memory_not_equal(a, b, 32);
    m[1].fraction = 1;
    c.step = 8;
    assert_int_equal(ar_round_id(&c, b), 0);
    assert_memory_not_equal(a, b, 32);
    c.step = 7;
    c.comp = AR_COMP_Q8;
    assert_int_equal(ar_round_id(&c, b), 0);
    assert_memory_not_equal(a, b, 32);
    c.group_id_len = AR_GROUP_ID_MAX + 1;
    assert_int_equal(ar_round_id(&c, b), CM_EINVAL);
}

static void test_messages(void **s)
{
    (void)s;
    uint8_t payload[2 * 100];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)i;
    struct ar_data_msg d = {.part = 3, .chunk = 9, .weight = 12.5, .encoding = AR_COMP_FP16,
                            .count = 100, .payload = payload, .payload_len = sizeof payload};
    memset(d.round, 0xab, 32);
    uint8_t *buf;
    size_t len;
    assert_int_equal(ar_data_build(&d, &buf, &len), 0);
    struct ar_data_msg p;
    assert_int_equal(ar_data_parse(buf, len, &p), 0);
    assert_int_equal(p.part, 3);
    assert_int_equal(p.chunk, 9);
    assert_true(p.weight == 12.5);
    assert_int_equal(p.count, 100);
    assert_int_equal(p.payload_len, sizeof payload);
    assert_memory_equal(p.payload, payload, sizeof payload);
    assert_memory_equal(p.round, d.round, 32);
    ar_data_cleanup(&p);
    /* Every truncation is refused, never read past. */
    for (size_t cut = 0; cut < len; cut++) {
        int rc = ar_data_parse(buf, cut, &p);
        assert_int_not_equal(rc, 0);
    }
    free(buf);
    /* A count that lies about the payload: attributed, refused as a size error. */
    d.count = 101;
    assert_int_equal(ar_data_build(&d, &buf, &len), 0);
    assert_int_equal(ar_data_parse(buf, len, &p), CM_ERANGE);
    assert_true(p.has_round);
    free(buf);
    d.count = 100;
    d.encoding = 9;
    assert_int_equal(ar_data_build(&d, &buf, &len), 0);
    assert_int_equal(ar_data_parse(buf, len, &p), CM_EPARSE);
    free(buf);

    struct ar_fetch_msg f = {.part = 1, .chunk = 2}, fp;
    memset(f.round, 7, 32);
    assert_int_equal(ar_fetch_build(&f, &buf, &len), 0);
    assert_int_equal(ar_fetch_parse(buf, len, &fp), 0);
    assert_memory_equal(&f, &fp, sizeof f);
    assert_int_equal(ar_fetch_parse(buf, len - 1, &fp), CM_EPARSE);
    free(buf);

    struct ar_result_msg r;
    memset(&r, 0, sizeof r);
    memset(r.round, 1, 32);
    r.part = 2;
    r.chunk = 5;
    r.weight = 300;
    r.counted = 0xb;
    r.excluded = 0x4;
    r.n_exclusions = 1;
    r.exclusions[0].member = 2;
    r.exclusions[0].reason = AR_EXCL_NONFINITE;
    r.encoding = AR_COMP_FP16;
    r.count = 100;
    r.payload = payload;
    r.payload_len = sizeof payload;
    assert_int_equal(ar_result_build(&r, &buf, &len), 0);
    struct ar_result_msg rp;
    assert_int_equal(ar_result_parse(buf, len, &rp), 0);
    assert_true(rp.weight == 300);
    assert_int_equal(rp.counted, 0xb);
    assert_int_equal(rp.excluded, 0x4);
    assert_int_equal(rp.n_exclusions, 1);
    assert_int_equal(rp.exclusions[0].member, 2);
    assert_int_equal(rp.exclusions[0].reason, AR_EXCL_NONFINITE);
    assert_memory_equal(rp.payload, payload, sizeof payload);
    ar_result_cleanup(&rp);
    free(buf);
    r.weight = NAN;
    assert_int_equal(ar_result_build(&r, &buf, &len), 0);
    assert_int_equal(ar_result_parse(buf, len, &rp), CM_EPARSE);
    free(buf);
    r.weight = 1;
    r.exclusions[0].reason = 99;
    assert_int_equal(ar_result_build(&r, &buf, &len), 0);
    assert_int_equal(ar_result_parse(buf, len, &rp), CM_EPARSE);
    free(buf);

    /* Acks are never empty: an empty "not yet" body means "round unknown". */
    uint32_t ready = 99;
    assert_int_equal(ar_ack_build(0, &buf, &len), 0);
    assert_true(len > 0);
    assert_int_equal(ar_ack_parse(buf, len, &ready), 0);
    assert_int_equal(ready, 0);
    free(buf);
    assert_int_equal(ar_ack_build(123456, &buf, &len), 0);
    assert_int_equal(ar_ack_parse(buf, len, &ready), 0);
    assert_int_equal(ready, 123456);
    free(buf);
    assert_int_equal(ar_ack_parse((const uint8_t *)"", 0, &ready), CM_EPARSE);
    assert_int_equal(ar_ack_parse((const uint8_t *)"\x08\x05", 2, &ready), CM_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_exact),  cmocka_unit_test(test_fp16_known),
        cmocka_unit_test(test_fp16_bound),  cmocka_unit_test(test_q8_bound),
        cmocka_unit_test(test_partition),   cmocka_unit_test(test_round_id),
        cmocka_unit_test(test_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
