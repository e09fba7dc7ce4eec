/* Pipeline-stage codec (common/sched/pipe_msg.h, docs/protocol.md
 * "Pipeline stages"): the exact byte layout of a small ACT, round trips of
 * every type, an activation tensor sent in chunks with the targets in
 * chunk 0 only, and every rejection with its code: truncation at each
 * length, a trailing byte, a type byte that is not the p2p type, header
 * bytes, each field rule of each type, targets below -1, non-finite values
 * and sumsq. Each field rule is checked twice: on bytes written by a raw
 * encoder here (the parser) and on the struct (the builder). The chunk
 * helpers are checked against a brute-force split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "sched/pipe_msg.h"

static const uint32_t TYPES[4] = {PIPE_MSG_ACT, PIPE_MSG_GRAD, PIPE_MSG_TIED, PIPE_MSG_NORM};

/* Zeros: finite values and valid targets for the larger cases. */
static uint8_t zeros[4 * (PIPE_MAX_ITEMS + 1)];

static void put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

/* The body of m as the layout says, without any check: what a careless or
 * hostile peer could send. */
static uint8_t *raw(const struct pipe_msg *m, size_t *len)
{
    size_t tl = 4 * (size_t)m->ntargets, vl = (m->enc == PIPE_ENC_FP16 ? 2 : 4) * (size_t)m->count;
    uint8_t *p = calloc(1, PIPE_HDR_LEN + tl + vl);
    assert_non_null(p);
    uint64_t bits;
    memcpy(&bits, &m->sumsq, 8);
    p[0] = PIPE_MSG_VERSION;
    p[1] = (uint8_t)m->enc;
    p[2] = (uint8_t)m->type;
    put_be(p + 4, (uint64_t)m->step, 8);
    const uint32_t f[11] = {m->replica, m->stage, m->mb,    m->B,     m->T,       m->C,
                            m->total,   m->offset, m->count, m->ntargets, m->flags};
    for (int i = 0; i < 11; i++)
        put_be(p + 12 + 4 * i, f[i], 4);
    put_be(p + 56, bits, 8);
    if (tl)
        memcpy(p + PIPE_HDR_LEN, m->targets, tl);
    if (vl)
        memcpy(p + PIPE_HDR_LEN + tl, m->values, vl);
    *len = PIPE_HDR_LEN + tl + vl;
    return p;
}

/* Parser and builder agree on m: both give `want`; on CM_OK the builder
 * writes the raw bytes and the parser gives back every field. */
#define expect(m, want) expect_at(m, want, __LINE__)
static void expect_at(const struct pipe_msg *m, int want, int line)
{
    size_t len, blen = 0;
    uint8_t *r = raw(m, &len), *b = NULL;
    struct pipe_msg p;
    int prc = pipe_msg_parse(m->type, r, len, &p), brc = pipe_msg_build(m, &b, &blen);
    if (prc != want || brc != want)
        fail_msg("line %d: parse %s, build %s, want %s", line, cm_err_name(prc), cm_err_name(brc),
                 cm_err_name(want));
    if (want == CM_OK) {
        assert_int_equal(blen, len);
        assert_memory_equal(b, r, len);
        assert_int_equal(p.type, m->type);
        assert_true(p.step == m->step);
        assert_int_equal(p.replica, m->replica);
        assert_int_equal(p.stage, m->stage);
        assert_int_equal(p.mb, m->mb);
        assert_int_equal(p.B, m->B);
        assert_int_equal(p.T, m->T);
        assert_int_equal(p.C, m->C);
        assert_int_equal(p.total, m->total);
        assert_int_equal(p.offset, m->offset);
        assert_int_equal(p.count, m->count);
        assert_int_equal(p.ntargets, m->ntargets);
        assert_int_equal(p.flags, m->flags);
        assert_int_equal(p.enc, m->enc);
        assert_memory_equal(&p.sumsq, &m->sumsq, sizeof p.sumsq);
        if (m->ntargets)
            assert_memory_equal(p.targets, m->targets, 4 * (size_t)m->ntargets);
        else
            assert_null(p.targets);
        if (m->count)
            assert_memory_equal(p.values, m->values, pipe_enc_size(m->enc) * (size_t)m->count);
        else
            assert_null(p.values);
    } else {
        assert_null(b);
        /* A refused parse leaves nothing behind. */
        struct pipe_msg zero;
        memset(&zero, 0, sizeof zero);
        assert_memory_equal(&p, &zero, sizeof p);
    }
    free(b);
    free(r);
}

static const int32_t TGT[6] = {0, 5, -1, 7, 3, 50256};
static float VAL[24];

/* ACT of micro-batch 3, (B,T,C) = (2,3,4), whole in one message. */
static struct pipe_msg act(void)
{
    for (int i = 0; i < 24; i++)
        VAL[i] = (float)i * 0.25f - 2.0f;
    return (struct pipe_msg){.type = PIPE_MSG_ACT, .step = 7, .replica = 1, .stage = 2, .mb = 3,
                             .B = 2, .T = 3, .C = 4, .total = 24, .offset = 0, .count = 24,
                             .ntargets = 6, .targets = (const uint8_t *)TGT,
                             .values = (const uint8_t *)VAL};
}

/* fp16 (pipeline.compression): ACT and GRAD carry binary16 values, 2
 * bytes each; they decode within binary16's rounding; TIED and NORM stay
 * fp32; a value fp16 cannot hold is refused before anything is sent, and a
 * non-finite binary16 on the wire is refused by the parser. */
static void test_fp16(void **state)
{
    (void)state;
    static float src[24], back[24];
    static uint8_t half[48];
    for (int i = 0; i < 24; i++)
        src[i] = (float)i * 0.3f - 3.1f;
    assert_int_equal(pipe_f16_encode(src, 24, half), CM_OK);
    struct pipe_msg m = {.type = PIPE_MSG_ACT, .step = 7, .replica = 1, .stage = 2, .mb = 3, .B = 2, .T = 3,
                         .C = 4, .total = 24, .offset = 0, .count = 24, .ntargets = 6,
                         .targets = (const uint8_t *)TGT, .values = half, .enc = PIPE_ENC_FP16};
    expect(&m, CM_OK); /* parse and build agree, 2 bytes a value */
    uint8_t *b = NULL;
    size_t blen = 0;
    assert_int_equal(pipe_msg_build(&m, &b, &blen), CM_OK);
    assert_int_equal(blen, PIPE_HDR_LEN + 4 * 6 + 2 * 24);
    struct pipe_msg p;
    assert_int_equal(pipe_msg_parse(PIPE_MSG_ACT, b, blen, &p), CM_OK);
    pipe_msg_values(&p, back);
    for (int i = 0; i < 24; i++)
        assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) * 0x1p-11f);
    /* a non-finite binary16 on the wire */
    b[PIPE_HDR_LEN + 4 * 6 + 2 * 5 + 1] = 0x7c;
    b[PIPE_HDR_LEN + 4 * 6 + 2 * 5] = 0x00;
    assert_int_equal(pipe_msg_parse(PIPE_MSG_ACT, b, blen, &p), CM_ENUMERIC);
    free(b);
    m.type = PIPE_MSG_GRAD;
    m.ntargets = 0;
    m.targets = NULL;
    expect(&m, CM_OK);
    m.type = PIPE_MSG_TIED; /* the tied sums must stay exact on both ends */
    m.mb = m.B = m.T = m.C = 0;
    expect(&m, CM_ERANGE);
    /* beyond binary16's range, or not finite */
    src[3] = 70000.0f;
    assert_int_equal(pipe_f16_encode(src, 24, half), CM_ENUMERIC);
    src[3] = NAN;
    assert_int_equal(pipe_f16_encode(src, 24, half), CM_ENUMERIC);
    src[3] = 65504.0f;
    assert_int_equal(pipe_f16_encode(src, 24, half), CM_OK);
}

static struct pipe_msg grad(void)
{
    struct pipe_msg m = act();
    m.type = PIPE_MSG_GRAD;
    m.ntargets = 0;
    m.targets = NULL;
    return m;
}

/* 20 values of a 100-value tied-embedding gradient, from value 10. */
static struct pipe_msg tied(void)
{
    struct pipe_msg m = act();
    m.type = PIPE_MSG_TIED;
    m.mb = m.B = m.T = m.C = 0;
    m.total = 100;
    m.offset = 10;
    m.count = 20;
    m.ntargets = 0;
    m.targets = NULL;
    return m;
}

static struct pipe_msg norm(void)
{
    return (struct pipe_msg){.type = PIPE_MSG_NORM, .step = 9, .replica = 3, .stage = 4,
                             .sumsq = 12.5};
}

static struct pipe_msg of_type(uint32_t t)
{
    return t == PIPE_MSG_ACT ? act() : t == PIPE_MSG_GRAD ? grad() : t == PIPE_MSG_TIED ? tied()
                                                                                       : norm();
}

static void test_layout(void **state)
{
    (void)state;
    struct pipe_msg m = act();
    m.step = 0x0102030405060708ll;
    uint8_t *b;
    size_t len;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
    assert_int_equal(len, 64 + 6 * 4 + 24 * 4);
    const uint8_t head[64] = {1, 0, 80, 0, 1, 2, 3, 4, 5, 6, 7, 8, /* version, enc, type, step */
                              0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3,  /* replica, stage, mb */
                              0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4,  /* B, T, C */
                              0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0, 24, /* total, offset, count */
                              0, 0, 0, 6, 0, 0, 0, 0,              /* ntargets, flags */
                              0, 0, 0, 0, 0, 0, 0, 0};             /* sumsq */
    assert_memory_equal(b, head, 64);
    const uint8_t t1[4] = {5, 0, 0, 0}, tm1[4] = {0xff, 0xff, 0xff, 0xff};
    assert_memory_equal(b + 64 + 4, t1, 4);
    assert_memory_equal(b + 64 + 8, tm1, 4);
    const uint8_t v0[4] = {0x00, 0x00, 0x00, 0xc0}; /* -2.0f, little-endian */
    assert_memory_equal(b + 64 + 24, v0, 4);
    free(b);

    /* NORM: sumsq as big-endian binary64 bits (12.5 = 0x4029000000000000). */
    struct pipe_msg n = norm();
    assert_int_equal(pipe_msg_build(&n, &b, &len), CM_OK);
    assert_int_equal(len, 64);
    assert_int_equal(b[2], 83);
    const uint8_t s[8] = {0x40, 0x29, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(b + 56, s, 8);
    free(b);
}

static void test_round_trips(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        struct pipe_msg m = of_type(TYPES[i]);
        expect(&m, CM_OK);
    }
    /* Limits that are allowed. */
    struct pipe_msg m = act();
    m.step = (int64_t)1 << 62;
    m.replica = m.stage = PIPE_MAX_STAGES - 1;
    m.mb = PIPE_MAX_MB - 1;
    expect(&m, CM_OK);
    int32_t t[6] = {-1, -1, 0, INT32_MAX, -1, 1};
    m.targets = (const uint8_t *)t;
    expect(&m, CM_OK);
    m = norm();
    m.sumsq = 0;
    expect(&m, CM_OK);
    m.sumsq = DBL_MAX;
    expect(&m, CM_OK);
    m.sumsq = DBL_TRUE_MIN;
    expect(&m, CM_OK);
    /* The largest dimensions and tensor, sent as their last values. */
    m = grad();
    m.B = PIPE_MAX_DIM;
    m.T = m.C = 1;
    m.total = PIPE_MAX_DIM;
    m.offset = m.total - 24;
    expect(&m, CM_OK);
    m.B = m.T = m.C = 1024;
    m.total = PIPE_MAX_TOTAL;
    m.offset = m.total - 24;
    expect(&m, CM_OK);
    m = tied();
    m.total = PIPE_MAX_TOTAL;
    m.offset = PIPE_MAX_TOTAL - 20;
    expect(&m, CM_OK);
    /* The largest message: PIPE_MAX_ITEMS items, as targets and values or
     * values only; it fits the transport's 320 KiB frame with room for the
     * envelope. */
    m = act();
    m.B = 1;
    m.T = 2;
    m.C = 65535;
    m.total = 2 * 65535;
    m.ntargets = 2;
    m.count = PIPE_MAX_ITEMS - 2;
    m.targets = m.values = zeros;
    expect(&m, CM_OK);
    m = tied();
    m.total = PIPE_MAX_TOTAL;
    m.offset = 0;
    m.count = PIPE_MAX_ITEMS;
    m.values = zeros;
    expect(&m, CM_OK);
    uint8_t *b;
    size_t len;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
    assert_true(len < 320 * 1024 - 4096);
    free(b);
}

/* An activation tensor of (B,T,C) = (4,128,256): 131,072 values and 512
 * targets make 3 chunks; only the first carries the targets. */
static void test_chunked_act(void **state)
{
    (void)state;
    const uint32_t B = 4, T = 128, C = 256, total = B * T * C, nt = B * T;
    float *v = malloc(total * sizeof(float)), *got = calloc(total, sizeof(float));
    int32_t *tg = malloc(nt * sizeof(int32_t));
    for (uint32_t i = 0; i < total; i++)
        v[i] = (float)(i % 977) * 0.5f - 100.0f;
    for (uint32_t i = 0; i < nt; i++)
        tg[i] = i % 7 == 0 ? -1 : (int32_t)(i * 31 % 50257);
    uint32_t n = pipe_chunks(total, nt);
    assert_int_equal(n, 3);
    uint64_t seen = 0;
    for (uint32_t k = 0; k < n; k++) {
        struct pipe_msg m = {.type = PIPE_MSG_ACT, .step = 12, .replica = 0, .stage = 1, .mb = 5,
                             .B = B, .T = T, .C = C, .total = total,
                             .offset = pipe_chunk_offset(k, nt),
                             .count = pipe_chunk_count(k, total, nt)};
        m.ntargets = k == 0 ? nt : 0;
        m.targets = k == 0 ? (const uint8_t *)tg : NULL;
        m.values = (const uint8_t *)(v + m.offset);
        assert_true(m.ntargets + m.count <= PIPE_MAX_ITEMS);
        uint8_t *b;
        size_t len;
        assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
        struct pipe_msg p;
        assert_int_equal(pipe_msg_parse(PIPE_MSG_ACT, b, len, &p), CM_OK);
        assert_int_equal(p.offset, m.offset);
        assert_int_equal(p.count, m.count);
        assert_int_equal(p.ntargets, k == 0 ? nt : 0);
        if (k == 0) {
            assert_int_equal(p.count, PIPE_MAX_ITEMS - nt);
            assert_memory_equal(p.targets, tg, nt * sizeof(int32_t));
        }
        memcpy(got + p.offset, p.values, p.count * sizeof(float));
        seen += p.count;
        free(b);
        /* The targets in another chunk, or chunk 0 without them: refused. */
        struct pipe_msg w = m;
        if (k == 0) {
            w.ntargets = 0;
            w.targets = NULL;
        } else {
            w.ntargets = nt;
            w.targets = (const uint8_t *)tg;
            w.count = m.count < PIPE_MAX_ITEMS - nt ? m.count : PIPE_MAX_ITEMS - nt;
        }
        expect(&w, CM_ERANGE);
    }
    assert_int_equal(seen, total);
    assert_memory_equal(got, v, total * sizeof(float));
    free(v);
    free(got);
    free(tg);
}

static void test_truncation_and_trailing(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        struct pipe_msg m = of_type(TYPES[i]), p;
        uint8_t *b;
        size_t len;
        assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
        for (size_t l = 0; l < len; l++)
            assert_int_equal(pipe_msg_parse(m.type, b, l, &p), CM_EPARSE);
        uint8_t *longer = malloc(len + 1);
        memcpy(longer, b, len);
        longer[len] = 0;
        assert_int_equal(pipe_msg_parse(m.type, longer, len + 1, &p), CM_EPARSE);
        free(longer);
        /* A count or ntargets that lies about the length. */
        uint8_t *t = malloc(len);
        memcpy(t, b, len);
        t[47] ^= 1;
        assert_int_equal(pipe_msg_parse(m.type, t, len, &p), CM_EPARSE);
        memcpy(t, b, len);
        t[51] ^= 1;
        assert_int_equal(pipe_msg_parse(m.type, t, len, &p), CM_EPARSE);
        memcpy(t, b, len);
        t[44] = 0x80; /* count 2^31: the length computation must not wrap */
        assert_int_equal(pipe_msg_parse(m.type, t, len, &p), CM_EPARSE);
        free(t);
        free(b);
    }
    struct pipe_msg p;
    assert_int_equal(pipe_msg_parse(PIPE_MSG_ACT, NULL, 0, &p), CM_EPARSE);
}

static void test_header_rejections(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        struct pipe_msg m = of_type(TYPES[i]), p;
        uint8_t *b;
        size_t len;
        assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
        /* The body's type byte must be the p2p type. */
        for (int j = 0; j < 4; j++)
            assert_int_equal(pipe_msg_parse(TYPES[j], b, len, &p), i == j ? CM_OK : CM_EPARSE);
        assert_int_equal(pipe_msg_parse(79, b, len, &p), CM_EPARSE);
        assert_int_equal(pipe_msg_parse(84, b, len, &p), CM_EPARSE);
        assert_int_equal(pipe_msg_parse(m.type + 256, b, len, &p), CM_EPARSE);
        uint8_t *t = malloc(len);
#define MUT(off, val, want)                                                                        \
    do {                                                                                           \
        memcpy(t, b, len);                                                                         \
        t[off] = (uint8_t)(val);                                                                   \
        assert_int_equal(pipe_msg_parse(m.type, t, len, &p), want);                                \
    } while (0)
        MUT(0, 0, CM_EPARSE);          /* version */
        MUT(0, 2, CM_EPARSE);
        MUT(1, 2, CM_EUNSUPPORTED);    /* encoding (1 is fp16: then the length is wrong) */
        MUT(1, 0xff, CM_EUNSUPPORTED);
        MUT(2, m.type ^ 1, CM_EPARSE); /* type byte */
        MUT(3, 1, CM_EPARSE);          /* reserved */
        for (int k = 52; k < 56; k++) /* flags: only NORM's move bit (the low one) */
            MUT(k, 1, TYPES[i] == PIPE_MSG_NORM && k == 55 ? CM_OK : CM_ERANGE);
#undef MUT
        free(t);
        free(b);
    }
}

/* Each rule of the ACT, once broken, with everything else valid. */
static void test_act_rules(void **state)
{
    (void)state;
    struct pipe_msg m;
#define CASE(edit, want)                                                                           \
    do {                                                                                           \
        m = act();                                                                                 \
        edit;                                                                                      \
        expect(&m, want);                                                                          \
    } while (0)
    CASE(m.step = -1, CM_ERANGE);
    CASE(m.step = ((int64_t)1 << 62) + 1, CM_ERANGE);
    CASE(m.step = INT64_MIN, CM_ERANGE);
    CASE(m.replica = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.replica = UINT32_MAX, CM_ERANGE);
    CASE(m.stage = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.mb = PIPE_MAX_MB, CM_ERANGE);
    CASE((m.B = 0, m.total = 0), CM_ERANGE);
    CASE(m.B = 0, CM_ERANGE);
    CASE(m.T = 0, CM_ERANGE);
    CASE(m.C = 0, CM_ERANGE);
    /* A dimension above PIPE_MAX_DIM with a consistent total, no targets. */
    CASE((m.B = PIPE_MAX_DIM + 1, m.T = m.C = 1, m.total = PIPE_MAX_DIM + 1, m.offset = 24,
          m.ntargets = 0),
         CM_ERANGE);
    CASE((m.C = PIPE_MAX_DIM + 1, m.B = m.T = 1, m.total = PIPE_MAX_DIM + 1, m.offset = 24,
          m.ntargets = 0),
         CM_ERANGE);
    CASE(m.total = 25, CM_ERANGE);   /* B*T*C != total */
    CASE((m.total = 48, m.C = 8), CM_OK); /* a chunk of a larger tensor */
    /* 65536 * 65537 * 1 = 2^32 + 2^16: equals total in 32 bits only. */
    CASE((m.B = 65536, m.T = 65537, m.C = 1, m.total = 65536, m.offset = 65536 - 24,
          m.ntargets = 0),
         CM_ERANGE);
    /* 1024 * 1024 * 1025 > PIPE_MAX_TOTAL, consistent shape. */
    CASE((m.B = 1024, m.T = 1024, m.C = 1025, m.total = 1024u * 1024 * 1025, m.offset = 24,
          m.ntargets = 0),
         CM_ERANGE);
    CASE((m.count = 0, m.values = NULL), CM_ERANGE);
    CASE((m.offset = 1, m.ntargets = 0), CM_ERANGE); /* offset + count > total */
    CASE((m.offset = 0xfffffff0u, m.ntargets = 0), CM_ERANGE); /* ... in 64 bits */
    CASE(m.ntargets = 5, CM_ERANGE);                             /* B*T at offset 0 */
    CASE((m.ntargets = 0, m.targets = NULL), CM_ERANGE);
    CASE((m.offset = 12, m.count = 12), CM_ERANGE);              /* targets past offset 0 */
    CASE((m.offset = 12, m.count = 12, m.ntargets = 0), CM_OK);
    /* ntargets + count > PIPE_MAX_ITEMS. */
    CASE((m.B = 1, m.T = 2, m.C = 65535, m.total = 2 * 65535, m.ntargets = 2,
          m.count = PIPE_MAX_ITEMS - 1, m.targets = m.values = zeros),
         CM_ERANGE);
    CASE((m.B = 1, m.T = 2, m.C = 65535, m.total = 2 * 65535, m.offset = 1, m.ntargets = 0,
          m.count = PIPE_MAX_ITEMS + 1, m.values = zeros),
         CM_ERANGE);
    /* Targets alone past PIPE_MAX_ITEMS: such a micro-batch cannot be sent. */
    CASE((m.B = 256, m.T = 256, m.C = 1, m.total = 65536, m.ntargets = 65536, m.count = 1,
          m.targets = m.values = zeros),
         CM_ERANGE);
    int32_t bad[6] = {0, 1, -2, 3, 4, 5};
    CASE(m.targets = (const uint8_t *)bad, CM_ERANGE);
    bad[2] = INT32_MIN;
    CASE(m.targets = (const uint8_t *)bad, CM_ERANGE);
    CASE(m.sumsq = 1, CM_ERANGE);
    CASE(m.flags = PIPE_FLAG_MOVE, CM_ERANGE);
    CASE(m.sumsq = -1, CM_ERANGE);
    CASE(m.sumsq = NAN, CM_ENUMERIC);
    CASE(m.sumsq = INFINITY, CM_ENUMERIC);
    const float nonfinite[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        float v[24] = {0};
        v[23] = nonfinite[i];
        CASE(m.values = (const uint8_t *)v, CM_ENUMERIC);
        v[23] = 0;
        v[0] = nonfinite[i];
        CASE(m.values = (const uint8_t *)v, CM_ENUMERIC);
    }
#undef CASE
}

static void test_grad_rules(void **state)
{
    (void)state;
    struct pipe_msg m;
#define CASE(edit, want)                                                                           \
    do {                                                                                           \
        m = grad();                                                                                \
        edit;                                                                                      \
        expect(&m, want);                                                                          \
    } while (0)
    CASE((m.ntargets = 6, m.targets = (const uint8_t *)TGT), CM_ERANGE); /* never targets */
    CASE((m.offset = 12, m.count = 12, m.ntargets = 6, m.targets = (const uint8_t *)TGT),
         CM_ERANGE);
    CASE(m.mb = PIPE_MAX_MB, CM_ERANGE);
    CASE(m.B = 0, CM_ERANGE);
    CASE(m.T = 4, CM_ERANGE); /* B*T*C != total */
    CASE(m.total = 0, CM_ERANGE);
    CASE((m.count = 0, m.values = NULL), CM_ERANGE);
    CASE(m.offset = 1, CM_ERANGE);
    CASE(m.stage = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.replica = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.step = -5, CM_ERANGE);
    CASE(m.sumsq = 0.5, CM_ERANGE);
    CASE(m.sumsq = NAN, CM_ENUMERIC);
    float v[24] = {0};
    v[11] = NAN;
    CASE(m.values = (const uint8_t *)v, CM_ENUMERIC);
#undef CASE
}

static void test_tied_rules(void **state)
{
    (void)state;
    struct pipe_msg m;
#define CASE(edit, want)                                                                           \
    do {                                                                                           \
        m = tied();                                                                                \
        edit;                                                                                      \
        expect(&m, want);                                                                          \
    } while (0)
    CASE(m.B = 1, CM_ERANGE);
    CASE(m.T = 1, CM_ERANGE);
    CASE(m.C = 1, CM_ERANGE);
    CASE(m.mb = 1, CM_ERANGE);
    CASE((m.B = 1, m.T = 1, m.C = 100), CM_ERANGE); /* even consistent with total */
    CASE(m.total = 0, CM_ERANGE);
    CASE((m.total = PIPE_MAX_TOTAL + 1, m.offset = PIPE_MAX_TOTAL - 19), CM_ERANGE);
    CASE((m.count = 0, m.values = NULL), CM_ERANGE);
    CASE(m.offset = 81, CM_ERANGE); /* offset + count > total */
    CASE(m.offset = 80, CM_OK);
    CASE((m.offset = 0, m.ntargets = 1, m.targets = (const uint8_t *)TGT), CM_ERANGE);
    CASE((m.total = PIPE_MAX_TOTAL, m.offset = 0, m.count = PIPE_MAX_ITEMS + 1,
          m.values = zeros),
         CM_ERANGE);
    CASE(m.replica = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.stage = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.step = ((int64_t)1 << 62) + 1, CM_ERANGE);
    CASE(m.sumsq = 2, CM_ERANGE);
    CASE(m.sumsq = -INFINITY, CM_ENUMERIC);
    float v[20] = {0};
    v[19] = -INFINITY;
    CASE(m.values = (const uint8_t *)v, CM_ENUMERIC);
#undef CASE
}

static void test_norm_rules(void **state)
{
    (void)state;
    struct pipe_msg m;
    float one = 1;
    int32_t t0 = 0;
#define CASE(edit, want)                                                                           \
    do {                                                                                           \
        m = norm();                                                                                \
        edit;                                                                                      \
        expect(&m, want);                                                                          \
    } while (0)
    CASE(m.mb = 1, CM_ERANGE);
    CASE(m.flags = PIPE_FLAG_MOVE, CM_OK);
    CASE(m.flags = 2, CM_ERANGE);
    CASE(m.B = 1, CM_ERANGE);
    CASE(m.T = 1, CM_ERANGE);
    CASE(m.C = 1, CM_ERANGE);
    CASE(m.total = 1, CM_ERANGE);
    CASE(m.offset = 1, CM_ERANGE);
    CASE((m.total = 1, m.count = 1, m.values = (const uint8_t *)&one), CM_ERANGE);
    CASE((m.count = 1, m.values = (const uint8_t *)&one), CM_ERANGE);
    CASE((m.ntargets = 1, m.targets = (const uint8_t *)&t0), CM_ERANGE);
    CASE(m.replica = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.stage = PIPE_MAX_STAGES, CM_ERANGE);
    CASE(m.step = -1, CM_ERANGE);
    CASE(m.sumsq = -1, CM_ERANGE);
    CASE(m.sumsq = -DBL_TRUE_MIN, CM_ERANGE);
    CASE(m.sumsq = NAN, CM_ENUMERIC);
    CASE(m.sumsq = -NAN, CM_ENUMERIC);
    CASE(m.sumsq = INFINITY, CM_ENUMERIC);
    CASE(m.sumsq = -INFINITY, CM_ENUMERIC);
#undef CASE
    /* A signalling NaN's bits, straight on the wire. */
    m = norm();
    uint8_t *b;
    size_t len;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
    const uint8_t snan[8] = {0x7f, 0xf0, 0, 0, 0, 0, 0, 1};
    memcpy(b + 56, snan, 8);
    struct pipe_msg p;
    assert_int_equal(pipe_msg_parse(PIPE_MSG_NORM, b, len, &p), CM_ENUMERIC);
    free(b);
}

static void test_builder_refusals(void **state)
{
    (void)state;
    uint8_t *b = NULL;
    size_t len = 0;
    struct pipe_msg m = act();
    const uint32_t bad_types[4] = {0, 79, 84, 80 + 256};
    for (int i = 0; i < 4; i++) {
        m.type = bad_types[i];
        assert_int_equal(pipe_msg_build(&m, &b, &len), CM_EINVAL);
    }
    m = act();
    m.targets = NULL;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_EINVAL);
    m = act();
    m.values = NULL;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_EINVAL);
    m = tied();
    m.values = NULL;
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_EINVAL);
    assert_null(b);
    /* NORM needs no pointers. */
    m = norm();
    assert_int_equal(pipe_msg_build(&m, &b, &len), CM_OK);
    free(b);
}

/* The split written out the slow way: chunk 0 takes the targets and fills
 * up with values, every later chunk takes PIPE_MAX_ITEMS values. */
static void check_split(uint32_t total, uint32_t nt)
{
    uint32_t n = pipe_chunks(total, nt);
    if (total == 0 || nt >= PIPE_MAX_ITEMS) {
        assert_int_equal(n, 0);
        assert_int_equal(pipe_chunk_count(0, total, nt), 0);
        return;
    }
    uint64_t left = total, off = 0;
    uint32_t k = 0;
    while (left) {
        uint64_t room = k == 0 ? PIPE_MAX_ITEMS - nt : PIPE_MAX_ITEMS;
        uint64_t c = left < room ? left : room;
        if (pipe_chunk_offset(k, nt) != off || pipe_chunk_count(k, total, nt) != c)
            fail_msg("total %u ntargets %u chunk %u: offset %u count %u, want %llu %llu", total,
                     nt, k, pipe_chunk_offset(k, nt), pipe_chunk_count(k, total, nt),
                     (unsigned long long)off, (unsigned long long)c);
        off += c;
        left -= c;
        k++;
    }
    if (n != k)
        fail_msg("total %u ntargets %u: %u chunks, want %u", total, nt, n, k);
    assert_int_equal((uint64_t)n, ((uint64_t)total + nt + PIPE_MAX_ITEMS - 1) / PIPE_MAX_ITEMS);
    assert_int_equal(pipe_chunk_count(n, total, nt), 0);
    assert_int_equal(pipe_chunk_count(n + 1, total, nt), 0);
    assert_int_equal(pipe_chunk_count(UINT32_MAX, total, nt), 0);
}

static void test_chunk_helpers(void **state)
{
    (void)state;
    const uint32_t nts[] = {0, 1, 6, 512, 4096, PIPE_MAX_ITEMS - 2, PIPE_MAX_ITEMS - 1,
                            PIPE_MAX_ITEMS, PIPE_MAX_ITEMS + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof nts / sizeof nts[0]; i++) {
        uint32_t nt = nts[i], room = nt < PIPE_MAX_ITEMS ? PIPE_MAX_ITEMS - nt : 1;
        const uint32_t totals[] = {0,
                                   1,
                                   2,
                                   room - 1,
                                   room,
                                   room + 1,
                                   room + PIPE_MAX_ITEMS - 1,
                                   room + PIPE_MAX_ITEMS,
                                   room + PIPE_MAX_ITEMS + 1,
                                   PIPE_MAX_ITEMS,
                                   3 * PIPE_MAX_ITEMS + 17,
                                   1000003,
                                   PIPE_MAX_TOTAL,
                                   UINT32_MAX - PIPE_MAX_ITEMS,
                                   UINT32_MAX};
        for (size_t j = 0; j < sizeof totals / sizeof totals[0]; j++)
            check_split(totals[j], nt);
    }
    /* Pseudo-random shapes. */
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 200; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        check_split((uint32_t)(x % (8 * PIPE_MAX_ITEMS)), (uint32_t)(x >> 40) % PIPE_MAX_ITEMS);
    }
    assert_int_equal(pipe_chunk_offset(0, 6), 0);
    assert_int_equal(pipe_chunk_offset(1, 6), PIPE_MAX_ITEMS - 6);
    assert_int_equal(pipe_chunk_offset(UINT32_MAX, 0), UINT32_MAX); /* saturated */
    assert_int_equal(pipe_chunk_offset(3, PIPE_MAX_ITEMS), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_chunked_act),
        cmocka_unit_test(test_truncation_and_trailing),
        cmocka_unit_test(test_header_rejections),
        cmocka_unit_test(test_act_rules),
        cmocka_unit_test(test_grad_rules),
        cmocka_unit_test(test_tied_rules),
        cmocka_unit_test(test_norm_rules),
        cmocka_unit_test(test_builder_refusals),
        cmocka_unit_test(test_chunk_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
