/* Unit tests for common/sched/dtfm_payload.c, the signed pipeline
 * assignment agents read (docs/protocol.md, "Pipeline schedules"): the
 * documented example payload decodes to what it says; encode and decode
 * round trip byte for byte; the signature covers the prefixed bytes and a
 * flipped byte or a schedule-prefixed signature fails; a peer finds its
 * tasklet; and the strict decoder refuses malformed input with a sentence,
 * leaving nothing behind. */
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
#include "sched/dtfm_payload.h"
#include "sched/sched.h"

/* docs/protocol.md's example, from tests/integ/test_pipeline.c */
static const char EXAMPLE[] =
    "{\"format\":\"crowdtrain-pipeline/1\",\"run\":\"pipe\",\"version\":1,\"issued_at\":1795720526,"
    "\"valid_from\":1795720526,\"valid_until\":1795721126,\"kid\":\"5v2LqWlgCsRgbiss\",\"stages\":2,"
    "\"replicas\":2,\"activation_bytes\":1000000.0,\"gradient_bytes\":100000000.0,\"assignment\":[["
    "\"YHs9-EzJyPzRgOBlJ3-M73vc1OUMV1OL2nYspZ1JHUQ\",\"8yTxR3pkssq1UN5OgmhHhBVaMIhDqW9Fcud6cv27n8Y\"],["
    "\"sVYx5WurcK_biSCr2vh5XKyZouOt3dFaDh-0iBx3WLM\",\"vDSDkAvtmgukbRyi4QutfMH-5H6K1ENtsx0xk7sHP5A\"]],"
    "\"spares\":[],\"predicted\":{\"total_s\":2.5600000000000005,\"dp_s\":0.80000000000000004,\"pp_s\":"
    "1.6000000000000001,\"compute_s\":0.16},\"random_mean_s\":65.127999999999986}";

static void test_example_decodes(void **state)
{
    (void)state;
    struct dtfm_payload p;
    char err[256] = "";
    assert_int_equal(dtfm_payload_decode(EXAMPLE, strlen(EXAMPLE), &p, err, sizeof err), CM_OK);
    assert_string_equal(p.run, "pipe");
    assert_string_equal(p.kid, "5v2LqWlgCsRgbiss");
    assert_int_equal(p.version, 1);
    assert_int_equal(p.valid_until - p.valid_from, 600);
    assert_int_equal(p.stages, 2);
    assert_int_equal(p.replicas, 2);
    assert_true(p.act_bytes == 1e6 && p.grad_bytes == 1e8);
    assert_true(p.total_s > 2.55 && p.total_s < 2.57 && p.compute_s == 0.16);
    assert_int_equal(p.nspares, 0);
    /* replica 1, stage 0 is "sVYx..." */
    uint8_t key[32];
    size_t n = 0, r = 9, s = 9;
    assert_int_equal(cm_b64url_decode("sVYx5WurcK_biSCr2vh5XKyZouOt3dFaDh-0iBx3WLM", 43, key, 32, &n), CM_OK);
    assert_int_equal(dtfm_payload_find(&p, key, &r, &s), CM_OK);
    assert_true(r == 1 && s == 0);
    key[0] ^= 1;
    assert_int_equal(dtfm_payload_find(&p, key, &r, &s), CM_ENOTFOUND);
    /* what the coordinator wrote, the encoder writes again */
    char *again = NULL;
    size_t len = 0;
    assert_int_equal(dtfm_payload_encode(&p, &again, &len), CM_OK);
    assert_int_equal(len, strlen(EXAMPLE));
    assert_memory_equal(again, EXAMPLE, len);
    free(again);
    dtfm_payload_cleanup(&p);
}

static void make(struct dtfm_payload *p, size_t stages, size_t replicas, size_t spares)
{
    memset(p, 0, sizeof *p);
    snprintf(p->run, sizeof p->run, "gpt-pipe");
    snprintf(p->kid, sizeof p->kid, "AbCdEfGhIjKlMnOp");
    p->version = 3;
    p->issued_at = p->valid_from = 1790000000;
    p->valid_until = 1790000600;
    p->stages = stages;
    p->replicas = replicas;
    p->act_bytes = 4.0 * 1024 * 2048 * 1024;
    p->grad_bytes = 1.5e9;
    p->total_s = 12.25;
    p->dp_s = 3;
    p->pp_s = 9;
    p->compute_s = 0.25;
    p->random_mean_s = 40.5;
    p->assign = calloc(stages * replicas, sizeof *p->assign);
    p->spares = calloc(spares ? spares : 1, sizeof *p->spares);
    assert_non_null(p->assign);
    assert_non_null(p->spares);
    for (size_t k = 0; k < stages * replicas; k++) {
        p->assign[k][0] = (uint8_t)k;
        p->assign[k][1] = (uint8_t)(k >> 8);
        p->assign[k][31] = 0xA5;
    }
    for (size_t k = 0; k < spares; k++) {
        p->spares[k][0] = (uint8_t)k;
        p->spares[k][31] = 0x5A;
    }
    p->nspares = spares;
}

static void test_roundtrip_and_signature(void **state)
{
    (void)state;
    struct dtfm_payload p, q;
    make(&p, 16, 16, 3); /* the 256-device bound */
    char *json = NULL, *again = NULL, err[256];
    size_t len = 0, len2 = 0;
    assert_int_equal(dtfm_payload_encode(&p, &json, &len), CM_OK);
    assert_int_equal(dtfm_payload_decode(json, len, &q, err, sizeof err), CM_OK);
    assert_int_equal(q.stages * q.replicas, 256);
    assert_memory_equal(q.assign, p.assign, 256 * sizeof *p.assign);
    assert_memory_equal(q.spares, p.spares, 3 * sizeof *p.spares);
    assert_int_equal(dtfm_payload_encode(&q, &again, &len2), CM_OK);
    assert_int_equal(len, len2);
    assert_memory_equal(json, again, len);

    struct cm_ed25519 k;
    assert_int_equal(cm_ed25519_generate(&k), CM_OK);
    uint8_t sig[CM_ED25519_SIG_LEN];
    assert_int_equal(dtfm_payload_sign(&k, json, len, sig), CM_OK);
    assert_int_equal(dtfm_payload_verify(k.pub, json, len, sig), CM_OK);
    json[len / 2] ^= 0x01;
    assert_int_equal(dtfm_payload_verify(k.pub, json, len, sig), CM_EBADSIG);
    json[len / 2] ^= 0x01;
    /* an averaging schedule's signature over the same bytes is not one */
    uint8_t ssig[CM_ED25519_SIG_LEN];
    assert_int_equal(sched_sign(&k, json, len, ssig), CM_OK);
    assert_int_equal(dtfm_payload_verify(k.pub, json, len, ssig), CM_EBADSIG);
    assert_int_equal(sched_verify(k.pub, json, len, sig), CM_EBADSIG);
    cm_ed25519_cleanup(&k);
    free(json);
    free(again);
    dtfm_payload_cleanup(&q);
    dtfm_payload_cleanup(&p);
}

/* Replaces the first occurrence of `from` in EXAMPLE by `to`. */
static char *edit(const char *from, const char *to)
{
    const char *at = strstr(EXAMPLE, from);
    assert_non_null(at);
    size_t n = strlen(EXAMPLE) - strlen(from) + strlen(to);
    char *s = malloc(n + 1);
    size_t pre = (size_t)(at - EXAMPLE);
    memcpy(s, EXAMPLE, pre);
    strcpy(s + pre, to);
    strcat(s, at + strlen(from));
    return s;
}

static void refuse(const char *from, const char *to, int want, const char *says)
{
    char *s = edit(from, to);
    struct dtfm_payload p;
    memset(&p, 0x5A, sizeof p);
    char err[256] = "";
    int rc = dtfm_payload_decode(s, strlen(s), &p, err, sizeof err);
    if (rc != want || !strstr(err, says))
        fail_msg("%s -> %s: rc %d (want %d), \"%s\" (want \"%s\")", from, to, rc, want, err, says);
    assert_null(p.assign);
    assert_null(p.spares);
    free(s);
}

static void test_strict_decoder(void **state)
{
    (void)state;
    refuse("crowdtrain-pipeline/1", "crowdtrain-pipeline/2", CM_EVERSION, "format");
    refuse("\"run\":\"pipe\"", "\"run\":\"pi pe\"", CM_EPARSE, "run name");
    refuse("\"version\":1", "\"version\":0", CM_EPARSE, "version");
    refuse("\"version\":1", "\"version\":1.5", CM_EPARSE, "version");
    refuse("\"valid_until\":1795721126", "\"valid_until\":1795720526", CM_EPARSE, "valid_until");
    refuse("\"stages\":2", "\"stages\":65", CM_EPARSE, "stages");
    refuse("\"stages\":2", "\"stages\":3", CM_EPARSE, "expected an array of 3 keys");
    refuse("\"replicas\":2", "\"replicas\":1", CM_EPARSE, "2 rows for 1 replicas");
    refuse("\"activation_bytes\":1000000.0", "\"activation_bytes\":-1.0", CM_EPARSE, "activation_bytes");
    refuse("\"compute_s\":0.16", "\"compute_s\":0.16,\"x\":1", CM_EPARSE, "predicted");
    refuse("\"spares\":[]", "\"spares\":[],\"extra\":true", CM_EPARSE, "extra");
    refuse("\"spares\":[]", "\"spares\":[\"YHs9-EzJyPzRgOBlJ3-M73vc1OUMV1OL2nYspZ1JHUQ\"]", CM_EPARSE, "twice");
    refuse("8yTxR3pkssq1UN5OgmhHhBVaMIhDqW9Fcud6cv27n8Y", "8yTxR3pkssq1UN5OgmhHhBVaMIhDqW9Fcud6cv27n8", CM_EPARSE,
           "replica 0, stage 1");
    refuse("8yTxR3pkssq1UN5OgmhHhBVaMIhDqW9Fcud6cv27n8Y", "8yTxR3pkssq1UN5OgmhHhBVaMIhDqW9Fcud6cv27n8!", CM_EPARSE,
           "replica 0, stage 1");
    refuse("\"kid\":\"5v2LqWlgCsRgbiss\"", "\"kid\":\"5v2LqWlgCsRgbis=\"", CM_EPARSE, "key id");
    refuse("\"run\":\"pipe\"", "\"run\":\"pipe\",\"run\":\"pipe\"", CM_EPARSE, "not a JSON object");
    refuse("}", "}}", CM_EPARSE, "not a JSON object");

    struct dtfm_payload p;
    char err[128];
    assert_int_equal(dtfm_payload_decode(NULL, 0, &p, err, sizeof err), CM_EPARSE);
    assert_int_equal(dtfm_payload_decode("[]", 2, &p, err, sizeof err), CM_EPARSE);
    char *big = malloc(DTFM_PAYLOAD_MAX + 2);
    memset(big, ' ', DTFM_PAYLOAD_MAX + 1);
    assert_int_equal(dtfm_payload_decode(big, DTFM_PAYLOAD_MAX + 1, &p, err, sizeof err), CM_ETOOBIG);
    free(big);
}

static void test_encode_rejects_bad_struct(void **state)
{
    (void)state;
    struct dtfm_payload p;
    char *json = NULL;
    size_t len = 0;
    make(&p, 17, 16, 0); /* 272 devices */
    assert_int_equal(dtfm_payload_encode(&p, &json, &len), CM_EINVAL);
    dtfm_payload_cleanup(&p);
    make(&p, 2, 2, 0);
    p.valid_until = p.valid_from;
    assert_int_equal(dtfm_payload_encode(&p, &json, &len), CM_EINVAL);
    p.valid_until = p.valid_from + 1;
    snprintf(p.run, sizeof p.run, "bad run");
    assert_int_equal(dtfm_payload_encode(&p, &json, &len), CM_EINVAL);
    assert_null(json);
    dtfm_payload_cleanup(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_decodes),
        cmocka_unit_test(test_roundtrip_and_signature),
        cmocka_unit_test(test_strict_decoder),
        cmocka_unit_test(test_encode_rejects_bad_struct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
