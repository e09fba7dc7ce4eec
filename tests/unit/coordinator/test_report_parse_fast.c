/* The direct read of a report payload in the agents' form
 * (coordinator/api_contrib_parse.c: coord_report_parse_fast) gives the same
 * report as the generic JSON parser for what it accepts, and leaves
 * everything unusual or invalid to it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "coordinator/api_contrib.h"
#include "cm_err.h"

#define K1 "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define K2 "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define K3 "AwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define ROUND "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define HEAD "{\"format\":\"crowdtrain-report/1\",\"run\":\"r1\",\"peer\":\"" K1 "\","
#define REST                                                                                      \
    "\"group\":\"g0\",\"round\":\"" ROUND "\",\"samples\":64,\"compute_s\":0.5,\"sps\":128,"   \
    "\"round_ms\":150,\"parts\":4,\"parts_averaged\":4,"

static struct coord_report g_fast, g_json;

static int fast(const char *s)
{
    return coord_report_parse_fast(s, strlen(s), &g_fast);
}

static void same_as_json(const char *s)
{
    char err[256];
    if (!fast(s))
        fail_msg("not taken directly: %s", s);
    assert_int_equal(coord_report_parse_json(s, strlen(s), &g_json, err, sizeof err), CM_OK);
    assert_memory_equal(&g_fast, &g_json, sizeof g_fast);
}

static void test_agent_forms(void **state)
{
    (void)state;
    same_as_json(HEAD "\"step\":12," REST "\"loss\":0.41,\"members\":{\"" K1 "\":64,\"" K2
                      "\":32},\"excluded\":[{\"peer\":\"" K3 "\",\"reason\":\"nonfinite\"}],"
                      "\"t\":1763800000}");
    assert_int_equal(g_fast.step, 12);
    assert_int_equal(g_fast.n_members, 2);
    assert_int_equal(g_fast.n_excluded, 1);
    assert_string_equal(g_fast.excluded[0].reason, "nonfinite");
    assert_true(g_fast.has_loss);
    /* no loss, empty members and exclusions, whitespace, other order, exponents */
    same_as_json(" { \"t\" : 0 ,\n\"excluded\" : [ ] , \"members\" : { } , " REST
                 "\"step\":9007199254740992,\"peer\":\"" K1 "\",\"run\":\"r1\","
                 "\"format\":\"crowdtrain-report/1\" } ");
    assert_false(g_fast.has_loss);
    same_as_json(HEAD "\"step\":-0," REST "\"loss\":1E-3,\"members\":{\"" K2 "\":1.5e2},"
                      "\"excluded\":[],\"t\":1}");
    assert_false(g_fast.has_params);
    /* the parameter hash after the round (docs/checkpoints.md, "Trust") */
    same_as_json(HEAD "\"step\":3," REST "\"params\":\"" ROUND "\",\"members\":{},\"excluded\":[],"
                      "\"t\":1}");
    assert_true(g_fast.has_params);
    assert_int_equal(g_fast.params[0], 0x00);
    assert_int_equal(g_fast.params[1], 0x11);
    assert_int_equal(g_fast.params[31], 0xff);
    /* a trainer's attestations for expert servers (docs/accounting.md, "Expert servers") */
    same_as_json(HEAD "\"step\":4," REST "\"members\":{},\"excluded\":[],\"experts\":{\"" K2
                      "\":128,\"" K3 "\":0.5},\"t\":1}");
    assert_int_equal(g_fast.n_experts, 2);
    assert_int_equal(g_fast.experts[0].pub[0], 2);
    assert_true(g_fast.experts[0].samples == 128 && g_fast.experts[1].samples == 0.5);
    same_as_json(HEAD "\"experts\":{},\"step\":4," REST "\"members\":{},\"excluded\":[],\"t\":1}");
    assert_int_equal(g_fast.n_experts, 0);
    /* ALBERT's heads (issue 20): where the agent writes them, elsewhere, one
       without the other, bounds' edges, integers */
    same_as_json(HEAD "\"step\":5," REST "\"loss\":6.5,\"sop_loss\":0.69310000000000005,"
                      "\"mlm_accuracy\":0.125,\"members\":{},\"excluded\":[],\"t\":1}");
    assert_true(g_fast.has_sop_loss && g_fast.has_mlm_accuracy);
    assert_true(g_fast.sop_loss == 0.6931 && g_fast.mlm_accuracy == 0.125);
    same_as_json(HEAD "\"mlm_accuracy\":1,\"step\":5," REST "\"members\":{},\"excluded\":[],"
                      "\"sop_loss\":1e6,\"t\":1}");
    assert_true(g_fast.sop_loss == 1e6 && g_fast.mlm_accuracy == 1);
    same_as_json(HEAD "\"step\":5," REST "\"mlm_accuracy\":0,\"members\":{},\"excluded\":[],\"t\":1}");
    assert_true(g_fast.has_mlm_accuracy && !g_fast.has_sop_loss);
    same_as_json(HEAD "\"step\":5," REST "\"sop_loss\":-0.0,\"members\":{},\"excluded\":[],\"t\":1}");
    assert_true(g_fast.has_sop_loss && !g_fast.has_mlm_accuracy);
    same_as_json(HEAD "\"step\":5," REST "\"members\":{},\"excluded\":[],\"t\":1}");
    assert_false(g_fast.has_sop_loss || g_fast.has_mlm_accuracy);
}

/* Out of bounds or of the wrong type: refused by both, the message naming
 * the field. */
static void test_albert_heads_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "\"sop_loss\":-0.5",     "\"sop_loss\":1.5e6",     "\"sop_loss\":null",
        "\"sop_loss\":\"0.7\"",  "\"sop_loss\":true",      "\"sop_loss\":[0.7]",
        "\"mlm_accuracy\":-0.01", "\"mlm_accuracy\":1.0001",
        "\"mlm_accuracy\":2",    "\"mlm_accuracy\":null",  "\"mlm_accuracy\":\"0.5\"",
        "\"mlm_accuracy\":{}",   "\"mlm_accuracy\":false",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char s[1024], err[256];
        snprintf(s, sizeof s, HEAD "\"step\":1," REST "%s,\"members\":{},\"excluded\":[],\"t\":1}",
                 bad[i]);
        if (fast(s))
            fail_msg("taken directly: %s", s);
        assert_int_equal(coord_report_parse(s, strlen(s), &g_json, err, sizeof err), CM_EPARSE);
        const char *field = strstr(bad[i], "sop_loss") ? "sop_loss" : "mlm_accuracy";
        if (!strstr(err, field))
            fail_msg("%s: '%s' does not name %s", bad[i], err, field);
    }
    /* the JSON reader's own refusals: twice, and beyond a double */
    char s[1024], err[256];
    snprintf(s, sizeof s, HEAD "\"step\":1," REST "\"sop_loss\":1,\"sop_loss\":1,\"members\":{},"
                          "\"excluded\":[],\"t\":1}");
    assert_false(fast(s));
    assert_int_equal(coord_report_parse(s, strlen(s), &g_json, err, sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "duplicate"));
    snprintf(s, sizeof s, HEAD "\"step\":1," REST "\"sop_loss\":1e400,\"members\":{},"
                          "\"excluded\":[],\"t\":1}");
    assert_false(fast(s));
    assert_int_equal(coord_report_parse(s, strlen(s), &g_json, err, sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "overflow"));
}

static void test_left_to_json(void **state)
{
    (void)state;
    static const char *const other[] = {
        /* invalid: the generic parser words the refusal */
        HEAD "\"step\":1.0," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":-1," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":9007199254740993," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":99999999999999999999," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"loss\":null,\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"loss\":2e6,\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{\"" K2 "\":1,\"" K2 "\":2},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[{\"peer\":\"" K3 "\"}],\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"t\":1,\"x\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"t\":1,\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[]}",
        HEAD "\"step\":01," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"params\":\"00\",\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"params\":\"00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff\","
             "\"members\":{},\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"params\":\"" ROUND "\",\"params\":\"" ROUND "\",\"members\":{},"
             "\"excluded\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"t\":1}x",
        /* malformed attestations (indices 16-21) */
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":[],\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":{\"x\":1},\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":{\"" K2 "\":-1},\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":{\"" K2 "\":2e9},\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":{\"" K2 "\":\"1\"},\"t\":1}",
        HEAD "\"step\":1," REST "\"members\":{},\"excluded\":[],\"experts\":{\"" K2 "\":1,\"" K2
             "\":1},\"t\":1}",
        /* valid JSON, but not the agents' form: escapes, non-ASCII */
        "{\"format\":\"crowdtrain-report\\u002f1\",\"run\":\"r1\",\"peer\":\"" K1 "\","
        "\"step\":1," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        "{\"format\":\"crowdtrain-report/1\",\"run\":\"r\xc3\xa9\",\"peer\":\"" K1 "\","
        "\"step\":1," REST "\"members\":{},\"excluded\":[],\"t\":1}",
        "",
        "[]",
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (fast(other[i]))
            fail_msg("taken directly: %s", other[i]);
    /* the escaped form is still a valid report, through the generic parser */
    char err[256];
    assert_int_equal(coord_report_parse(other[22], strlen(other[22]), &g_json, err, sizeof err),
                     CM_OK);
    assert_int_equal(coord_report_parse(other[0], strlen(other[0]), &g_json, err, sizeof err),
                     CM_EPARSE);
    for (size_t i = 12; i <= 14; i++) /* the malformed parameter hashes */
        assert_int_equal(coord_report_parse(other[i], strlen(other[i]), &g_json, err, sizeof err),
                         CM_EPARSE);
    assert_true(err[0] != '\0');
    for (size_t i = 16; i <= 21; i++) { /* refused, and the message names the field */
        assert_int_equal(coord_report_parse(other[i], strlen(other[i]), &g_json, err, sizeof err),
                         CM_EPARSE);
        /* a duplicate key is the JSON reader's refusal: "duplicate object key" */
        if (!strstr(err, i == 21 ? "duplicate" : "experts"))
            fail_msg("%s: '%s'", other[i], err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_forms),
        cmocka_unit_test(test_left_to_json),
        cmocka_unit_test(test_albert_heads_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
