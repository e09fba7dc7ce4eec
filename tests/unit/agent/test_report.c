/* Unit tests of the agent's contribution report encoder and signer
 * (agent/peer/report.c; docs/protocol.md, "Contribution reports"): the
 * canonical payload carries every field in range, parses back with the
 * documented names, is refused when out of bounds, and the body's signature
 * verifies over "crowdtrain-report/1\n" || payload under the peer key. The
 * background reporter never blocks: with an unreachable coordinator its
 * queue stays bounded and stop() reports what was left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent/peer/report.h"
#include "cm_err.h"

static void sample(struct peer_report *r)
{
    memset(r, 0, sizeof *r);
    r->step = 41;
    strcpy(r->group, "g0:1");
    for (int i = 0; i < 32; i++)
        r->round_id[i] = (uint8_t)i;
    r->samples = 64;
    r->compute_s = 0.75;
    r->loss = 0.4125;
    r->sps = 85.5;
    r->round_ms = 120.25;
    r->parts = 4;
    r->parts_averaged = 3;
    r->n_members = 2;
    r->members[0].pub[0] = 1;
    r->members[0].samples = 64;
    r->members[1].pub[0] = 2;
    r->members[1].samples = 0.1;
    r->n_excluded = 1;
    r->excluded[0].pub[0] = 3;
    strcpy(r->excluded[0].reason, "nonfinite");
}

static void test_encode_fields(void **state)
{
    (void)state;
    struct peer_report r;
    sample(&r);
    uint8_t pub[32] = {9};
    char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len = 0;
    assert_int_equal(peer_report_encode(&r, "fmnist", pub, 1763800000, buf, sizeof buf, &len),
                     CM_OK);
    assert_int_equal(strlen(buf), len);
    json_error_t e;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "crowdtrain-report/1");
    assert_string_equal(json_string_value(json_object_get(j, "run")), "fmnist");
    char k[48];
    cm_b64url_encode(pub, 32, k);
    assert_string_equal(json_string_value(json_object_get(j, "peer")), k);
    assert_int_equal(json_integer_value(json_object_get(j, "step")), 41);
    assert_string_equal(json_string_value(json_object_get(j, "group")), "g0:1");
    assert_string_equal(json_string_value(json_object_get(j, "round")),
                        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
    assert_true(json_number_value(json_object_get(j, "loss")) == 0.4125);
    assert_true(json_number_value(json_object_get(j, "round_ms")) == 120.25);
    assert_int_equal(json_integer_value(json_object_get(j, "parts_averaged")), 3);
    assert_null(json_object_get(j, "params")); /* only when known */
    assert_null(json_object_get(j, "experts")); /* only with attestations */
    json_t *m = json_object_get(j, "members");
    assert_int_equal(json_object_size(m), 2);
    r.members[1].pub[0] = 2;
    cm_b64url_encode(r.members[1].pub, 32, k);
    /* 17 significant digits: a double survives the trip exactly. */
    assert_true(json_number_value(json_object_get(m, k)) == 0.1);
    json_t *x = json_array_get(json_object_get(j, "excluded"), 0);
    assert_string_equal(json_string_value(json_object_get(x, "reason")), "nonfinite");
    assert_int_equal(json_integer_value(json_object_get(j, "t")), 1763800000);
    json_decref(j);
    /* Encoding is deterministic: the same report gives the same bytes (retries are "already recorded"). */
    char again[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len2 = 0;
    assert_int_equal(peer_report_encode(&r, "fmnist", pub, 1763800000, again, sizeof again, &len2),
                     CM_OK);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, again, len);
    /* the parameter hash after the round, as 64 lowercase hex digits */
    for (int i = 0; i < 32; i++)
        r.params[i] = (uint8_t)(0xa0 + i);
    r.has_params = 1;
    assert_int_equal(peer_report_encode(&r, "fmnist", pub, 1763800000, buf, sizeof buf, &len), CM_OK);
    j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "params")),
                        "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf");
    json_decref(j);
}

/* A trainer's attestations for expert servers (docs/accounting.md, "Expert
 * servers"): after "excluded", before "t", distinct keys, bounded. */
static void test_encode_experts(void **state)
{
    (void)state;
    struct peer_report r;
    sample(&r);
    uint8_t pub[32] = {9};
    char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len = 0;
    r.n_experts = 2;
    r.experts[0].pub[0] = 7;
    r.experts[0].samples = 128;
    r.experts[1].pub[0] = 8;
    r.experts[1].samples = 0.1;
    assert_int_equal(peer_report_encode(&r, "fmnist", pub, 5, buf, sizeof buf, &len), CM_OK);
    json_error_t e;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    assert_non_null(j);
    json_t *x = json_object_get(j, "experts");
    assert_true(json_is_object(x));
    assert_int_equal(json_object_size(x), 2);
    char k[48];
    cm_b64url_encode(r.experts[1].pub, 32, k);
    assert_true(json_number_value(json_object_get(x, k)) == 0.1);
    json_decref(j);
    assert_non_null(strstr(buf, "}],\"experts\":{\""));
    assert_non_null(strstr(buf, "},\"t\":5}"));
    /* out of bounds */
    r.experts[1].samples = -1;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    r.experts[1].samples = NAN;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    r.experts[1].samples = 2e9;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    r.experts[1].samples = 1;
    r.experts[1].pub[0] = 7; /* same server twice */
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    r.n_experts = PEER_REPORT_EXPERTS_MAX + 1;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    /* the largest report fits the payload bound: 64 members, exclusions and servers */
    sample(&r);
    r.n_members = r.n_excluded = r.n_experts = 64;
    for (int i = 0; i < 64; i++) {
        memset(r.members[i].pub, 0xff, 32);
        r.members[i].pub[0] = (uint8_t)i;
        r.members[i].samples = 123456789.123456789;
        memcpy(r.excluded[i].pub, r.members[i].pub, 32);
        strcpy(r.excluded[i].reason, "abcdefghijklmno");
        memcpy(r.experts[i].pub, r.members[i].pub, 32);
        r.experts[i].samples = 987654321.987654321;
    }
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
    assert_true(len <= PEER_REPORT_PAYLOAD_MAX);
}

static void test_encode_refuses_out_of_bounds(void **state)
{
    (void)state;
    uint8_t pub[32] = {9};
    char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len;
    struct peer_report r;
    sample(&r);
    r.samples = -1;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    r.samples = NAN;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    r.members[1].samples = INFINITY;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    r.parts_averaged = 5;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    strcpy(r.group, "bad group");
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    strcpy(r.excluded[0].reason, "Bad");
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    r.members[1].pub[0] = 1; /* same key twice */
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    assert_int_equal(peer_report_encode(&r, "bad run", pub, 1, buf, sizeof buf, &len), CM_EINVAL);
    sample(&r);
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, 100, &len), CM_ETOOBIG);
    /* A diverged loss is left out, the report is kept. */
    sample(&r);
    r.loss = NAN;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
    assert_null(strstr(buf, "\"loss\""));
}

/* ALBERT's heads (issue 20): after "loss", before "sps", only when set,
 * finite and in bounds; a report without them is byte for byte as before. */
static void test_encode_albert_heads(void **state)
{
    (void)state;
    uint8_t pub[32] = {9};
    char plain[PEER_REPORT_PAYLOAD_MAX + 1], buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t plen = 0, len = 0;
    struct peer_report r;
    sample(&r);
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, plain, sizeof plain, &plen), CM_OK);
    assert_null(strstr(plain, "sop_loss"));
    assert_null(strstr(plain, "mlm_accuracy"));
    r.sop_loss = 0.6931;
    r.mlm_accuracy = 0.125; /* values without their flags: still left out */
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
    assert_int_equal(len, plen);
    assert_memory_equal(buf, plain, len);
    r.has_sop_loss = r.has_mlm_accuracy = 1;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
    assert_non_null(strstr(buf, "\"loss\":0.41249999999999998,\"sop_loss\":0.69310000000000005,"
                                "\"mlm_accuracy\":0.125,\"sps\":"));
    json_error_t e;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    assert_non_null(j);
    assert_true(json_number_value(json_object_get(j, "sop_loss")) == 0.6931);
    assert_true(json_number_value(json_object_get(j, "mlm_accuracy")) == 0.125);
    json_decref(j);
    /* each left out on its own when not finite or out of bounds */
    const double bad_sop[] = {NAN, INFINITY, -0.5, 2e6}, bad_acc[] = {NAN, -INFINITY, -0.01, 1.5};
    for (int i = 0; i < 4; i++) {
        r.sop_loss = bad_sop[i];
        r.mlm_accuracy = 1;
        assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
        assert_null(strstr(buf, "sop_loss"));
        assert_non_null(strstr(buf, "\"mlm_accuracy\":1,"));
        r.sop_loss = 0;
        r.mlm_accuracy = bad_acc[i];
        assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
        assert_non_null(strstr(buf, "\"sop_loss\":0,"));
        assert_null(strstr(buf, "mlm_accuracy"));
    }
    /* no samples, no loss of any kind */
    r.mlm_accuracy = 0.5;
    r.samples = 0;
    r.n_members = 0;
    assert_int_equal(peer_report_encode(&r, "r", pub, 1, buf, sizeof buf, &len), CM_OK);
    assert_null(strstr(buf, "loss"));
    assert_null(strstr(buf, "mlm_accuracy"));
}

static void test_sign_verifies(void **state)
{
    (void)state;
    struct cm_ed25519 key;
    assert_int_equal(cm_ed25519_generate(&key), CM_OK);
    struct peer_report r;
    sample(&r);
    char buf[PEER_REPORT_PAYLOAD_MAX + 1];
    size_t len = 0;
    assert_int_equal(peer_report_encode(&r, "fmnist", key.pub, 5, buf, sizeof buf, &len), CM_OK);
    char *body = NULL;
    assert_int_equal(peer_report_sign(&key, "h.p.s", buf, len, &body), CM_OK);
    json_t *b = json_loads(body, JSON_REJECT_DUPLICATES, NULL);
    assert_non_null(b);
    assert_int_equal(json_object_size(b), 3);
    assert_string_equal(json_string_value(json_object_get(b, "pass")), "h.p.s");
    const char *p64 = json_string_value(json_object_get(b, "payload"));
    const char *s64 = json_string_value(json_object_get(b, "sig"));
    uint8_t payload[PEER_REPORT_PAYLOAD_MAX + 32], sig[64];
    size_t pn = 0, sn = 0;
    const char *prefix = "crowdtrain-report/1\n";
    size_t pre = strlen(prefix);
    memcpy(payload, prefix, pre);
    assert_int_equal(cm_b64url_decode(p64, strlen(p64), payload + pre, sizeof payload - pre, &pn),
                     CM_OK);
    assert_int_equal(pn, len);
    assert_memory_equal(payload + pre, buf, len);
    assert_int_equal(cm_b64url_decode(s64, strlen(s64), sig, sizeof sig, &sn), CM_OK);
    assert_int_equal(sn, 64);
    assert_int_equal(cm_ed25519_verify(key.pub, payload, pre + pn, sig), CM_OK);
    payload[pre + 5] ^= 1;
    assert_int_equal(cm_ed25519_verify(key.pub, payload, pre + pn, sig), CM_EBADSIG);
    json_decref(b);
    free(body);
    cm_ed25519_cleanup(&key);
}

static void test_reporter_bounded_and_nonblocking(void **state)
{
    (void)state;
    struct cm_ed25519 key;
    assert_int_equal(cm_ed25519_generate(&key), CM_OK);
    struct peer_reporter *rp = NULL;
    /* Port 1 on loopback: nobody listens, every attempt fails fast and backs off. */
    assert_int_equal(peer_reporter_start("http://127.0.0.1:1", NULL, "r", &key, "h.p.s", &rp),
                     CM_OK);
    struct peer_report r;
    sample(&r);
    for (int i = 0; i < PEER_REPORT_QUEUE_MAX + 10; i++) {
        r.step = i;
        assert_int_equal(peer_reporter_submit(rp, &r), CM_OK);
    }
    r.samples = -5;
    assert_int_equal(peer_reporter_submit(rp, &r), CM_EINVAL);
    struct peer_reporter_stats st;
    peer_reporter_stats(rp, &st);
    assert_int_equal(st.dropped, 10);
    assert_int_equal(st.sent, 0);
    assert_int_equal(peer_reporter_stop(rp, 100), PEER_REPORT_QUEUE_MAX);
    cm_ed25519_cleanup(&key);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_fields),
        cmocka_unit_test(test_encode_experts),
        cmocka_unit_test(test_encode_refuses_out_of_bounds),
        cmocka_unit_test(test_encode_albert_heads),
        cmocka_unit_test(test_sign_verifies),
        cmocka_unit_test(test_reporter_bounded_and_nonblocking),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
