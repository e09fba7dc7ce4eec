/* Unit tests for common/sched/sched_json.c: schedule round trip from a
 * solution, Ed25519 signature over the documented bytes (docs/protocol.md,
 * "Schedules"), tampering detected, equal inputs giving byte-identical
 * payloads, and the strict decoder rejecting malformed network input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "sched/sched.h"

static void make_schedule(struct sched_schedule *s, size_t n)
{
    struct sched_peer pp[8];
    memset(pp, 0, sizeof pp);
    for (size_t i = 0; i < n; i++) {
        pp[i].key[0] = (uint8_t)(i + 1);
        pp[i].samples_per_s = i == n - 1 ? 0 : 100;
        pp[i].up_mbps = pp[i].down_mbps = i == n - 1 ? 10000 : 1000;
        pp[i].inbound = 1;
        if (i == 1) /* the address peers reach it at travels with its entry */
            snprintf(pp[i].ip, sizeof pp[i].ip, "10.77.0.12");
        if (i == 2)
            snprintf(pp[i].ip, sizeof pp[i].ip, "2001:db8::7");
    }
    struct sched_problem p = {pp, n, 4096, 817.8};
    struct sched_solution sol;
    char err[200];
    assert_int_equal(sched_solve(&p, &sol, err, sizeof err), CM_OK);
    memset(s, 0, sizeof *s);
    assert_int_equal(sched_schedule_from_solution(&p, &sol, s), CM_OK);
    sched_solution_cleanup(&sol);
    snprintf(s->run, sizeof s->run, "demo-run");
    snprintf(s->kid, sizeof s->kid, "AbCdEfGhIjKlMnOp");
    s->version = 7;
    s->issued_at = 1790000000;
    s->valid_from = 1790000000;
    s->valid_until = 1790000600;
    s->group_size = (uint32_t)n;
}

static void test_roundtrip_and_signature(void **state)
{
    (void)state;
    struct sched_schedule s, d, s2;
    make_schedule(&s, 5);
    make_schedule(&s2, 5);
    char *json = NULL, *json2 = NULL;
    size_t len = 0, len2 = 0;
    assert_int_equal(sched_schedule_encode(&s, &json, &len), CM_OK);
    assert_int_equal(sched_schedule_encode(&s2, &json2, &len2), CM_OK);
    /* Equal inputs, equal bytes: every coordinator signs the same payload. */
    assert_int_equal(len, len2);
    assert_memory_equal(json, json2, len);
    char err[200] = "";
    int rc = sched_schedule_decode(json, len, &d, err, sizeof err);
    if (rc != CM_OK)
        fail_msg("decode: %s", err);
    assert_string_equal(d.run, "demo-run");
    assert_string_equal(d.kid, s.kid);
    assert_int_equal(d.version, 7);
    assert_int_equal(d.valid_until, 1790000600);
    assert_int_equal(d.n, 5);
    assert_int_equal(d.group_size, 5);
    assert_int_equal(d.target_batch, 4096);
    assert_memory_equal(&d.steps_per_s, &s.steps_per_s, sizeof(double));
    for (size_t i = 0; i < 5; i++) {
        assert_memory_equal(d.peers[i].key, s.peers[i].key, CM_ED25519_PUB_LEN);
        assert_int_equal(d.peers[i].share, s.peers[i].share);
        assert_int_equal(d.peers[i].compute, s.peers[i].compute);
        assert_string_equal(d.peers[i].ip, s.peers[i].ip);
    }
    assert_string_equal(d.peers[1].ip, "10.77.0.12");
    assert_string_equal(d.peers[2].ip, "2001:db8::7");
    assert_string_equal(d.peers[0].ip, ""); /* none said: no "ip" field */
    assert_null(strstr(json, "\"ip\":\"\""));
    /* The no-compute 10 Gbit/s peer is the parameter server. */
    assert_int_equal(d.peers[4].share, SCHED_SHARE_TOTAL);
    assert_false(d.peers[4].compute);

    struct cm_ed25519 key, other;
    assert_int_equal(cm_ed25519_generate(&key), CM_OK);
    assert_int_equal(cm_ed25519_generate(&other), CM_OK);
    uint8_t sig[CM_ED25519_SIG_LEN];
    assert_int_equal(sched_sign(&key, json, len, sig), CM_OK);
    assert_int_equal(sched_verify(key.pub, json, len, sig), CM_OK);
    assert_int_equal(sched_verify(other.pub, json, len, sig), CM_EBADSIG);
    /* The signature is over the prefix plus the payload, not the payload alone. */
    uint8_t raw[CM_ED25519_SIG_LEN];
    assert_int_equal(cm_ed25519_sign(&key, json, len, raw), CM_OK);
    assert_int_equal(sched_verify(key.pub, json, len, raw), CM_EBADSIG);
    size_t plen = strlen(SCHED_FORMAT "\n");
    char *signed_bytes = malloc(plen + len);
    memcpy(signed_bytes, SCHED_FORMAT "\n", plen);
    memcpy(signed_bytes + plen, json, len);
    assert_int_equal(cm_ed25519_verify(key.pub, signed_bytes, plen + len, sig), CM_OK);
    free(signed_bytes);
    for (size_t i = 0; i < len; i += 7) {
        json[i] ^= 1;
        assert_int_equal(sched_verify(key.pub, json, len, sig), CM_EBADSIG);
        json[i] ^= 1;
    }
    struct cm_ed25519 pubonly;
    assert_int_equal(cm_ed25519_from_public(&pubonly, key.pub), CM_OK);
    assert_int_equal(sched_sign(&pubonly, json, len, sig), CM_EINVAL);
    cm_ed25519_cleanup(&pubonly);
    cm_ed25519_cleanup(&key);
    cm_ed25519_cleanup(&other);
    free(json);
    free(json2);
    sched_schedule_cleanup(&s);
    sched_schedule_cleanup(&s2);
    sched_schedule_cleanup(&d);
}

#define K1 "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define K2 "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define HEAD                                                                                     \
    "{\"format\":\"crowdtrain-schedule/1\",\"run\":\"r1\",\"version\":1,\"issued_at\":10,"     \
    "\"valid_from\":10,\"valid_until\":20,\"kid\":\"AbCdEfGhIjKlMnOp\",\"group_size\":1,"       \
    "\"steps_per_s\":0.5,\"target_batch_size\":64,"

static void expect_reject(const char *json, int code, const char *needle)
{
    struct sched_schedule d;
    char err[256] = "";
    int rc = sched_schedule_decode(json, strlen(json), &d, err, sizeof err);
    if (rc != code)
        fail_msg("%s\n expected %s, got %s (%s)", json, cm_err_name(code), cm_err_name(rc), err);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
    assert_null(d.peers);
}

static void test_strict_decoder(void **state)
{
    (void)state;
    const char *good = HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                            "\"share\":600000000},{\"key\":\"" K2 "\",\"compute\":true,"
                            "\"client_mode\":false,\"share\":400000000}]}";
    struct sched_schedule d;
    char err[256] = "";
    if (sched_schedule_decode(good, strlen(good), &d, err, sizeof err) != CM_OK)
        fail_msg("good schedule rejected: %s", err);
    assert_int_equal(d.peers[1].key[0], 2);
    sched_schedule_cleanup(&d);

    const char *with_ip = HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                               "\"share\":600000000,\"ip\":\"::1\"},{\"key\":\"" K2 "\",\"compute\":true,"
                               "\"client_mode\":false,\"share\":400000000,\"ip\":\"192.0.2.4\"}]}";
    if (sched_schedule_decode(with_ip, strlen(with_ip), &d, err, sizeof err) != CM_OK)
        fail_msg("schedule with addresses rejected: %s", err);
    assert_string_equal(d.peers[0].ip, "::1");
    assert_string_equal(d.peers[1].ip, "192.0.2.4");
    sched_schedule_cleanup(&d);
    /* an address is numeric, without a port, IPv4 or IPv6 */
    static const char *const BAD_IPS[] = {"\"example.org\"", "\"10.0.0.1:80\"", "\"10.0.0.256\"",
                                          "\"[::1]\"", "\"\"", "17",
                                          "\"1111:2222:3333:4444:5555:6666:123.123.123.123:65535\""};
    for (size_t i = 0; i < sizeof BAD_IPS / sizeof *BAD_IPS; i++) {
        char bad[1024];
        snprintf(bad, sizeof bad,
                 HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                      "\"share\":1000000000,\"ip\":%s}]}",
                 BAD_IPS[i]);
        struct sched_schedule b;
        char e2[256] = "";
        if (sched_schedule_decode(bad, strlen(bad), &b, e2, sizeof e2) != CM_EPARSE)
            fail_msg("accepted ip %s", BAD_IPS[i]);
        assert_non_null(strstr(e2, "ip"));
        assert_null(b.peers);
    }

    expect_reject("", CM_EPARSE, "empty");
    expect_reject("[1]", CM_EPARSE, "JSON object");
    expect_reject(HEAD "\"peers\":[]}", CM_EPARSE, "1..");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":999999999}]}",
                  CM_EPARSE, "sum");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":1000000000,\"x\":1}]}",
                  CM_EPARSE, "unknown field");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":500000000},{\"key\":\"" K1 "\",\"compute\":true,"
                       "\"client_mode\":false,\"share\":500000000}]}",
                  CM_EPARSE, "same key");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":false,\"client_mode\":false,"
                       "\"share\":1000000000}]}",
                  CM_EPARSE, "no peer computes");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":true,"
                       "\"share\":1000000000}]}",
                  CM_EPARSE, "client mode");
    expect_reject(HEAD "\"peers\":[{\"key\":\"AQ\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":1000000000}]}",
                  CM_EPARSE, "length");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":-1}]}",
                  CM_EPARSE, "share");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"run\":\"r1\",\"version\":1,"
                  "\"issued_at\":10,\"valid_from\":10,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":2,\"steps_per_s\":0.5,"
                  "\"target_batch_size\":64,\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,"
                  "\"client_mode\":false,\"share\":1000000000}]}",
                  CM_EPARSE, "group_size");
    expect_reject(HEAD "\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,\"client_mode\":false,"
                       "\"share\":1000000000}]}x",
                  CM_EPARSE, "JSON");
    expect_reject("{\"format\":\"crowdtrain-schedule/2\",\"run\":\"r1\",\"version\":1,"
                  "\"issued_at\":10,\"valid_from\":10,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":1,\"steps_per_s\":0.5,"
                  "\"target_batch_size\":64,\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,"
                  "\"client_mode\":false,\"share\":1000000000}]}",
                  CM_EVERSION, "format");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"run\":\"r1\",\"version\":1,"
                  "\"issued_at\":10,\"valid_from\":20,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":1,\"steps_per_s\":0.5,"
                  "\"target_batch_size\":64,\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,"
                  "\"client_mode\":false,\"share\":1000000000}]}",
                  CM_EPARSE, "valid_until");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"run\":\"../x\",\"version\":1,"
                  "\"issued_at\":10,\"valid_from\":10,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":1,\"steps_per_s\":0.5,"
                  "\"target_batch_size\":64,\"peers\":[]}",
                  CM_EPARSE, "run name");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"format\":\"crowdtrain-schedule/1\"}",
                  CM_EPARSE, "JSON object");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"run\":\"r1\",\"version\":1,"
                  "\"issued_at\":10,\"valid_from\":10,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":1,\"steps_per_s\":1e300,"
                  "\"target_batch_size\":64,\"peers\":[{\"key\":\"" K1 "\",\"compute\":true,"
                  "\"client_mode\":false,\"share\":1000000000}]}",
                  CM_EPARSE, "steps_per_s");
    expect_reject("{\"format\":\"crowdtrain-schedule/1\",\"run\":\"r1\",\"version\":0,"
                  "\"issued_at\":10,\"valid_from\":10,\"valid_until\":20,\"kid\":"
                  "\"AbCdEfGhIjKlMnOp\",\"group_size\":1,\"steps_per_s\":1,"
                  "\"target_batch_size\":64,\"peers\":[]}",
                  CM_EPARSE, "version");

    /* Bounded: more than SCHED_JSON_MAX bytes is refused before parsing. */
    size_t big = SCHED_JSON_MAX + 1;
    char *buf = malloc(big);
    memset(buf, ' ', big);
    buf[0] = '{';
    assert_int_equal(sched_schedule_decode(buf, big, &d, err, sizeof err), CM_ETOOBIG);
    free(buf);
    /* Too many peers. */
    size_t cap = 128 * (SCHED_MAX_PEERS + 2) + 512, o = 0;
    buf = malloc(cap);
    o += (size_t)snprintf(buf + o, cap - o, HEAD "\"peers\":[");
    for (int i = 0; i <= SCHED_MAX_PEERS; i++) {
        uint8_t k[32] = {(uint8_t)i, (uint8_t)(i >> 8), 7};
        char b64[64];
        cm_b64url_encode(k, 32, b64);
        o += (size_t)snprintf(buf + o, cap - o,
                              "%s{\"key\":\"%s\",\"compute\":true,\"client_mode\":false,"
                              "\"share\":%d}",
                              i ? "," : "", b64, i == 0 ? 1000000000 : 0);
    }
    snprintf(buf + o, cap - o, "]}");
    expect_reject(buf, CM_EPARSE, "peers");
    free(buf);
}

static void test_encode_rejects_bad_struct(void **state)
{
    (void)state;
    struct sched_schedule s = {0};
    char *json = NULL;
    assert_int_equal(sched_schedule_encode(&s, &json, NULL), CM_EINVAL);
    make_schedule(&s, 3);
    s.steps_per_s = NAN;
    assert_int_equal(sched_schedule_encode(&s, &json, NULL), CM_EINVAL);
    assert_null(json);
    sched_schedule_cleanup(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_signature),
        cmocka_unit_test(test_strict_decoder),
        cmocka_unit_test(test_encode_rejects_bad_struct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
