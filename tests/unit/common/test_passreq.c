/* Signed pass requests (common/cm_passreq.c) and the weak-key check
 * (cm_ed25519_pub_check): the exact signed bytes of docs/protocol.md, a
 * signature made by another Ed25519 implementation (Python's
 * `cryptography`), the round trip through the JSON body, what the decoder
 * refuses, and the small-order keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_json.h"
#include "cm_passreq.h"

/* RFC 8032, section 7.1, TEST 1: the public key of secret key 9d61b1...7f60. */
#define RFC_PUB "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
#define NONCE "oKGio6SlpqeoqaqrrK2urw" /* bytes a0 a1 ... af */
/* The same request signed with that secret key by Python's cryptography 48
 * (Ed25519PrivateKey.from_private_bytes(seed).sign(signed bytes)). */
#define RFC_SIG "JpLk8O8oreS5tcnSDl7cABaSJdra9G7iIPeQtl-X7b9NRHkqMTVsdu1jfN6QYBxQfdutZ2uLfRFk_21RlQGMAg"

static void decode(const char *s, uint8_t *out, size_t n)
{
    size_t got = 0;
    assert_int_equal(cm_b64url_decode(s, strlen(s), out, n, &got), CM_OK);
    assert_int_equal(got, n);
}

static void rfc_request(struct cm_passreq *r)
{
    memset(r, 0, sizeof *r);
    decode(RFC_PUB, r->peer_public_key, 32);
    decode(NONCE, r->nonce, 16);
    decode(RFC_SIG, r->signature, 64);
    r->timestamp = 1763800000;
}

static void test_signed_bytes_exact(void **state)
{
    (void)state;
    struct cm_passreq r;
    rfc_request(&r);
    uint8_t buf[CM_PASSREQ_BYTES_MAX];
    size_t n = 0;
    assert_int_equal(cm_passreq_signed_bytes("fmnist", "alice", &r, buf, sizeof buf, &n), CM_OK);
    static const char want[] = "crowdtrain-pass-request/1\nfmnist\nalice\n" RFC_PUB "\n1763800000\n" NONCE;
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(buf, want, n);
    /* the longest names and time still fit the bound */
    char name[65];
    memset(name, 'a', 64);
    name[64] = '\0';
    r.timestamp = CM_PASSREQ_TS_MAX;
    assert_int_equal(cm_passreq_signed_bytes(name, name, &r, buf, sizeof buf, &n), CM_OK);
    assert_true(n < CM_PASSREQ_BYTES_MAX);
    assert_int_equal(cm_passreq_signed_bytes(name, name, &r, buf, n, &n), CM_ETOOBIG);
    /* names that could smuggle a separator, and times out of range, are refused */
    r.timestamp = 1;
    assert_int_equal(cm_passreq_signed_bytes("fm\nnist", "alice", &r, buf, sizeof buf, &n), CM_EINVAL);
    assert_int_equal(cm_passreq_signed_bytes("fmnist", "", &r, buf, sizeof buf, &n), CM_EINVAL);
    r.timestamp = -1;
    assert_int_equal(cm_passreq_signed_bytes("fmnist", "alice", &r, buf, sizeof buf, &n), CM_EINVAL);
    r.timestamp = CM_PASSREQ_TS_MAX + 1;
    assert_int_equal(cm_passreq_signed_bytes("fmnist", "alice", &r, buf, sizeof buf, &n), CM_EINVAL);
}

static void test_known_signature_verifies(void **state)
{
    (void)state;
    struct cm_passreq r;
    rfc_request(&r);
    assert_int_equal(cm_passreq_verify("fmnist", "alice", &r), CM_OK);
    /* each signed field matters */
    assert_int_equal(cm_passreq_verify("fmnist2", "alice", &r), CM_EBADSIG);
    assert_int_equal(cm_passreq_verify("fmnist", "alicf", &r), CM_EBADSIG);
    r.timestamp++;
    assert_int_equal(cm_passreq_verify("fmnist", "alice", &r), CM_EBADSIG);
    r.timestamp--;
    r.nonce[15] ^= 1;
    assert_int_equal(cm_passreq_verify("fmnist", "alice", &r), CM_EBADSIG);
    r.nonce[15] ^= 1;
    r.peer_public_key[0] ^= 1;
    assert_int_not_equal(cm_passreq_verify("fmnist", "alice", &r), CM_OK);
}

static void test_sign_json_roundtrip(void **state)
{
    (void)state;
    struct cm_ed25519 k, other;
    assert_int_equal(cm_ed25519_generate(&k), CM_OK);
    assert_int_equal(cm_ed25519_generate(&other), CM_OK);
    struct cm_passreq a, b;
    assert_int_equal(cm_passreq_sign(&k, "run-1", "vol_2", 1763800123, &a), CM_OK);
    assert_memory_equal(a.peer_public_key, k.pub, 32);
    json_t *j = cm_passreq_to_json(&a);
    assert_non_null(j);
    char err[256] = "";
    assert_int_equal(cm_passreq_from_json(j, &b, err, sizeof err), CM_OK);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(cm_passreq_verify("run-1", "vol_2", &b), CM_OK);
    json_decref(j);
    /* two requests never share a nonce */
    assert_int_equal(cm_passreq_sign(&k, "run-1", "vol_2", 1763800123, &b), CM_OK);
    assert_memory_not_equal(a.nonce, b.nonce, 16);
    /* someone else's key cannot sign for k: the signature is by `other` over k's request */
    uint8_t msg[CM_PASSREQ_BYTES_MAX];
    size_t n = 0;
    assert_int_equal(cm_passreq_signed_bytes("run-1", "vol_2", &a, msg, sizeof msg, &n), CM_OK);
    assert_int_equal(cm_ed25519_sign(&other, msg, n, a.signature), CM_OK);
    assert_int_equal(cm_passreq_verify("run-1", "vol_2", &a), CM_EBADSIG);
    cm_ed25519_cleanup(&k);
    cm_ed25519_cleanup(&other);
}

static int decode_body(const char *text)
{
    char err[256] = "";
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    struct cm_passreq r;
    int rc = cm_passreq_from_json(j, &r, err, sizeof err);
    if (rc != CM_OK)
        assert_true(strlen(err) > 0); /* a refusal always says why */
    json_decref(j);
    return rc;
}

static void test_decoder_refuses(void **state)
{
    (void)state;
#define OK_BODY(pk, ts, nonce, sig) \
    "{\"peer_public_key\":\"" pk "\",\"timestamp\":" ts ",\"nonce\":\"" nonce "\",\"signature\":\"" sig "\"}"
    assert_int_equal(decode_body(OK_BODY(RFC_PUB, "1763800000", NONCE, RFC_SIG)), CM_OK);
    const char *bad[] = {
        "{\"peer_public_key\":\"" RFC_PUB "\"}", /* the unsigned request of before */
        "{}",
        "[]",
        OK_BODY(RFC_PUB, "\"1763800000\"", NONCE, RFC_SIG),
        OK_BODY(RFC_PUB, "-1", NONCE, RFC_SIG),
        OK_BODY(RFC_PUB, "9007199254740993", NONCE, RFC_SIG),
        OK_BODY(RFC_PUB, "1.5", NONCE, RFC_SIG),
        OK_BODY("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURp", "1", NONCE, RFC_SIG), /* non-canonical tail */
        OK_BODY("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHUR", "1", NONCE, RFC_SIG),
        OK_BODY(RFC_PUB, "1", "oKGio6SlpqeoqaqrrK2ur", RFC_SIG),
        OK_BODY(RFC_PUB, "1", "oKGio6SlpqeoqaqrrK2ur=", RFC_SIG),
        OK_BODY(RFC_PUB, "1", NONCE, "JpLk8O8oreS5tcnSDl7cABaSJdra9G7iIPeQtl-X7b9NRHkqMTVsdu1jfN6QYBxQfdutZ2uLfRFk_21RlQGMA"),
        OK_BODY(RFC_PUB, "1", NONCE, "JpLk8O8oreS5tcnSDl7cABaSJdra9G7iIPeQtl+X7b9NRHkqMTVsdu1jfN6QYBxQfdutZ2uLfRFk_21RlQGMAg"),
        "{\"peer_public_key\":\"" RFC_PUB "\",\"timestamp\":1,\"nonce\":\"" NONCE "\",\"signature\":\"" RFC_SIG
        "\",\"username\":\"root\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (decode_body(bad[i]) != CM_EINVAL)
            fail_msg("accepted: %s", bad[i]);
    char err[64];
    struct cm_passreq r;
    assert_int_equal(cm_passreq_from_json(NULL, &r, err, sizeof err), CM_EINVAL);
#undef OK_BODY
}

static void hex32(const char *hex, uint8_t out[32])
{
    size_t n = 0;
    assert_int_equal(cm_hex_decode(hex, 64, out, 32, &n), CM_OK);
    assert_int_equal(n, 32);
}

static void test_weak_keys(void **state)
{
    (void)state;
    /* The eight points of order 1, 2, 4, 8 (encodings computed from the
     * curve equation, each with both sign bits), and non-canonical y = p, p+1. */
    static const char *weak[] = {
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000080",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    };
    uint8_t pk[32];
    for (size_t i = 0; i < sizeof weak / sizeof weak[0]; i++) {
        hex32(weak[i], pk);
        if (cm_ed25519_pub_check(pk) != CM_EINVAL)
            fail_msg("weak key accepted: %s", weak[i]);
    }
    /* The largest canonical y (p - 1 is weak, p - 2 is an ordinary value) and
     * generated keys pass. */
    hex32("ebffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", pk);
    assert_int_equal(cm_ed25519_pub_check(pk), CM_OK);
    for (int i = 0; i < 200; i++) {
        struct cm_ed25519 k;
        assert_int_equal(cm_ed25519_generate(&k), CM_OK);
        assert_int_equal(cm_ed25519_pub_check(k.pub), CM_OK);
        cm_ed25519_cleanup(&k);
    }
    /* A request "signed" for the identity key with R = identity, S = 0 (which
     * satisfies the verification equation for any message) is refused for
     * the key, whatever the signature check says. */
    struct cm_passreq r;
    memset(&r, 0, sizeof r);
    hex32(weak[2], r.peer_public_key);
    r.signature[0] = 1;
    r.timestamp = 1763800000;
    assert_int_equal(cm_passreq_verify("fmnist", "alice", &r), CM_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signed_bytes_exact),
        cmocka_unit_test(test_known_signature_verifies),
        cmocka_unit_test(test_sign_json_roundtrip),
        cmocka_unit_test(test_decoder_refuses),
        cmocka_unit_test(test_weak_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
