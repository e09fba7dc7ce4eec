/* Expert-call codec (common/moe/moe_msg.h, docs/protocol.md "Experts"):
 * round trips of FORWARD/BACKWARD calls, results and INFO, the exact byte
 * layout of a small call, and every rejection: truncation at each length,
 * trailing bytes, versions, encodings, uids, shapes, non-finite values,
 * info limits and duplicates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "moe/moe_msg.h"

static uint8_t *build_call(const char *uid, uint64_t fid, const float *v, uint32_t n, uint32_t c,
                           size_t *len)
{
    struct moe_call m = {.forward_id = fid, .n = n, .c = c, .values = (const uint8_t *)v};
    snprintf(m.uid, sizeof m.uid, "%s", uid);
    uint8_t *b = NULL;
    assert_int_equal(moe_call_build(&m, &b, len), CM_OK);
    return b;
}

static void test_call_round_trip_and_layout(void **state)
{
    (void)state;
    float v[6] = {1, -2, 3.5f, 0, 1e-30f, -1e30f};
    size_t len;
    uint8_t *b = build_call("ffn.3.14", 0x0102030405060708ull, v, 2, 3, &len);
    assert_int_equal(len, MOE_CALL_HDR_LEN + 8 + 6 * 4);
    const uint8_t head[20] = {1, 0, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 2, 0, 0, 0, 3};
    assert_memory_equal(b, head, 20);
    assert_memory_equal(b + 20, "ffn.3.14", 8);
    const uint8_t one[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f, little-endian */
    assert_memory_equal(b + 28, one, 4);
    struct moe_call m;
    assert_int_equal(moe_call_parse(b, len, &m), CM_OK);
    assert_string_equal(m.uid, "ffn.3.14");
    assert_true(m.forward_id == 0x0102030405060708ull);
    assert_int_equal(m.n, 2);
    assert_int_equal(m.c, 3);
    float back[6];
    moe_values_get(back, m.values, 6);
    assert_memory_equal(back, v, sizeof v);
    /* Every truncation and one trailing byte are refused. */
    for (size_t l = 0; l < len; l++)
        assert_int_not_equal(moe_call_parse(b, l, &m), CM_OK);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, b, len);
    longer[len] = 0;
    assert_int_equal(moe_call_parse(longer, len + 1, &m), CM_ERANGE);
    free(longer);
    free(b);
}

static void test_call_rejections(void **state)
{
    (void)state;
    float v[4] = {1, 2, 3, 4};
    size_t len;
    uint8_t *b = build_call("e0", 7, v, 2, 2, &len);
    struct moe_call m;
    uint8_t *t = malloc(len);
#define MUT(off, val, want)                                                                        \
    do {                                                                                           \
        memcpy(t, b, len);                                                                         \
        t[off] = (uint8_t)(val);                                                                   \
        assert_int_equal(moe_call_parse(t, len, &m), want);                                        \
    } while (0)
    MUT(0, 2, CM_EPARSE);          /* version */
    MUT(1, 1, CM_EUNSUPPORTED);    /* encoding */
    MUT(3, 1, CM_EPARSE);          /* reserved */
    MUT(2, 0, CM_EPARSE);          /* empty uid */
    MUT(2, 3, CM_EPARSE);          /* uid swallows a value byte: not a uid char */
    MUT(20, ' ', CM_EPARSE);       /* uid character */
    MUT(20, 0, CM_EPARSE);
    MUT(15, 0, CM_ERANGE);         /* n = 0 */
    MUT(19, 0, CM_ERANGE);         /* c = 0 */
    MUT(15, 3, CM_ERANGE);         /* n lies about the payload */
    MUT(14, 1, CM_ERANGE);         /* n = 258: more than the payload */
    MUT(12, 0xff, CM_ERANGE);      /* n huge */
    MUT(17, 1, CM_ERANGE);         /* c = 65538 > MOE_MAX_C */
    /* NaN and infinities in the values. */
    float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        memcpy(t, b, len);
        memcpy(t + len - 4, &bad[i], 4);
        assert_int_equal(moe_call_parse(t, len, &m), CM_ENUMERIC);
    }
    assert_int_equal(moe_call_parse(NULL, 0, &m), CM_EPARSE);
    free(t);
    free(b);
#undef MUT

    /* Builders refuse what parsers would. */
    struct moe_call c = {.n = 1, .c = 2, .values = (const uint8_t *)v};
    uint8_t *o;
    size_t ol;
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_EINVAL); /* empty uid */
    snprintf(c.uid, sizeof c.uid, "a/b");
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_EINVAL);
    memset(c.uid, 'x', MOE_UID_MAX);
    c.uid[MOE_UID_MAX] = 0;
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_OK); /* 64 bytes is the limit */
    assert_int_equal(moe_call_parse(o, ol, &(struct moe_call){0}), CM_OK);
    free(o);
    c.n = 0;
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_ERANGE);
    c.n = MOE_MAX_VALUES;
    c.c = 2;
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_ERANGE);
    c.n = 1;
    c.c = 1;
    float nan1 = NAN;
    c.values = (const uint8_t *)&nan1;
    assert_int_equal(moe_call_build(&c, &o, &ol), CM_ENUMERIC);
    assert_false(moe_uid_valid("", 0));
    assert_true(moe_uid_valid("ffn.0.1", 7));
    assert_false(moe_uid_valid("ffn 0", 5));
}

static void test_largest_call(void **state)
{
    (void)state;
    /* MOE_MAX_VALUES values exactly: accepted; the largest message fits the
     * transport's frame (320 KiB) with room for the envelope. */
    float *v = calloc(MOE_MAX_VALUES, sizeof(float));
    size_t len;
    uint8_t *b = build_call("big", 1, v, MOE_MAX_VALUES / 512, 512, &len);
    assert_true(len < 320 * 1024 - 4096);
    struct moe_call m;
    assert_int_equal(moe_call_parse(b, len, &m), CM_OK);
    free(b);
    free(v);
}

static void test_result(void **state)
{
    (void)state;
    float v[6] = {0.5f, 1, 2, 3, 4, 5};
    struct moe_result r = {.n = 3, .c = 2, .values = (const uint8_t *)v}, p;
    uint8_t *b;
    size_t len;
    assert_int_equal(moe_result_build(&r, &b, &len), CM_OK);
    assert_int_equal(len, MOE_RESULT_HDR_LEN + 24);
    const uint8_t head[12] = {1, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 2};
    assert_memory_equal(b, head, 12);
    uint8_t hdr[MOE_RESULT_HDR_LEN];
    moe_result_header(3, 2, hdr);
    assert_memory_equal(hdr, head, 12);
    assert_int_equal(moe_result_parse(b, len, &p), CM_OK);
    assert_int_equal(p.n, 3);
    assert_int_equal(p.c, 2);
    assert_memory_equal(p.values, v, 24);
    for (size_t l = 0; l < len; l++)
        assert_int_not_equal(moe_result_parse(b, l, &p), CM_OK);
    b[2] = 1;
    assert_int_equal(moe_result_parse(b, len, &p), CM_EPARSE);
    b[2] = 0;
    b[1] = 2;
    assert_int_equal(moe_result_parse(b, len, &p), CM_EUNSUPPORTED);
    b[1] = 0;
    float inf = INFINITY;
    memcpy(b + 12, &inf, 4);
    assert_int_equal(moe_result_parse(b, len, &p), CM_ENUMERIC);
    free(b);
}

static void test_info(void **state)
{
    (void)state;
    struct moe_info *in = calloc(1, sizeof *in), *out = calloc(1, sizeof *out);
    in->max_batch = 256;
    in->max_inflight = 4096;
    in->max_request = 256;
    in->n_experts = 2;
    snprintf(in->experts[0].uid, sizeof in->experts[0].uid, "ffn.0.0");
    in->experts[0].c = 512;
    in->experts[0].f = 2048;
    snprintf(in->experts[1].uid, sizeof in->experts[1].uid, "ffn.0.1");
    in->experts[1].c = 512;
    in->experts[1].f = 1024;
    uint8_t *b;
    size_t len;
    assert_int_equal(moe_info_build(in, &b, &len), CM_OK);
    assert_int_equal(len, MOE_INFO_HDR_LEN + 2 * (MOE_INFO_ENTRY_HDR_LEN + 7));
    const uint8_t head[16] = {1, 0, 0, 2, 0, 0, 1, 0, 0, 0, 0x10, 0, 0, 0, 1, 0};
    assert_memory_equal(b, head, 16);
    const uint8_t e0[10] = {7, 0, 0, 0, 2, 0, 0, 0, 8, 0};
    assert_memory_equal(b + 16, e0, 10);
    assert_int_equal(moe_info_parse(b, len, out), CM_OK);
    assert_int_equal(out->n_experts, 2);
    assert_string_equal(out->experts[1].uid, "ffn.0.1");
    assert_int_equal(out->experts[1].f, 1024);
    assert_int_equal(out->max_inflight, 4096);
    for (size_t l = 0; l < len; l++)
        assert_int_not_equal(moe_info_parse(b, l, out), CM_OK);
    /* Duplicate uid. */
    size_t second = 16 + MOE_INFO_ENTRY_HDR_LEN + 7 + MOE_INFO_ENTRY_HDR_LEN;
    b[second + 6] = '0';
    assert_int_equal(moe_info_parse(b, len, out), CM_EPARSE);
    b[second + 6] = '1';
    b[16 + 2] = 1; /* c = 2^24 + 512 */
    assert_int_equal(moe_info_parse(b, len, out), CM_ERANGE);
    b[16 + 2] = 0;
    b[7] = 0;
    b[6] = 0; /* max_batch 0 */
    assert_int_equal(moe_info_parse(b, len, out), CM_ERANGE);
    free(b);
    /* An empty server is a valid answer; too many experts is not. */
    in->n_experts = 0;
    assert_int_equal(moe_info_build(in, &b, &len), CM_OK);
    assert_int_equal(moe_info_parse(b, len, out), CM_OK);
    assert_int_equal(out->n_experts, 0);
    b[2] = 0x01; /* 256 + 0 experts announced, none present */
    b[3] = 0x01;
    assert_int_equal(moe_info_parse(b, len, out), CM_ERANGE);
    free(b);
    in->n_experts = MOE_INFO_MAX_EXPERTS + 1;
    assert_int_equal(moe_info_build(in, &b, &len), CM_ERANGE);
    in->n_experts = 2;
    snprintf(in->experts[1].uid, sizeof in->experts[1].uid, "ffn.0.0");
    assert_int_equal(moe_info_build(in, &b, &len), CM_EINVAL);
    free(in);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_round_trip_and_layout),
        cmocka_unit_test(test_call_rejections),
        cmocka_unit_test(test_largest_call),
        cmocka_unit_test(test_result),
        cmocka_unit_test(test_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
