/* Unit tests for common/cm_crypto.c and common/cm_token.c: codecs, Ed25519
 * round trips, and access-pass tokens accepted only when intact, signed by a
 * known key and within their validity window. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_token.h"

static void test_b64url_roundtrip(void **state)
{
    (void)state;
    uint8_t in[64], out[64];
    char enc[128];
    for (size_t n = 0; n <= sizeof in; n++) {
        for (size_t i = 0; i < n; i++)
            in[i] = (uint8_t)(i * 37 + n);
        cm_b64url_encode(in, n, enc);
        assert_int_equal(strlen(enc), cm_b64url_encoded_len(n));
        size_t got = 0;
        assert_int_equal(cm_b64url_decode(enc, strlen(enc), out, sizeof out, &got), CM_OK);
        assert_int_equal(got, n);
        assert_memory_equal(in, out, n);
    }
    /* RFC 4648 test vector, url alphabet, no padding */
    cm_b64url_encode("foob", 4, enc);
    assert_string_equal(enc, "Zm9vYg");
    size_t got;
    assert_int_equal(cm_b64url_decode("Zm9vYg==", 8, out, sizeof out, &got), CM_EPARSE);
    assert_int_equal(cm_b64url_decode("Zm9vYh", 6, out, sizeof out, &got), CM_EPARSE);
    assert_int_equal(cm_b64url_decode("Zm+v", 4, out, sizeof out, &got), CM_EPARSE);
    assert_int_equal(cm_b64url_decode("Z", 1, out, sizeof out, &got), CM_EPARSE);
    assert_int_equal(cm_b64url_decode("Zm9vYmFy", 8, out, 3, &got), CM_ETOOBIG);
}

static void test_sha256_vector(void **state)
{
    (void)state;
    uint8_t h[32];
    char hex[65];
    cm_sha256("abc", 3, h);
    cm_hex_encode(h, 32, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    struct cm_sha256_ctx c;
    assert_int_equal(cm_sha256_init(&c), CM_OK);
    assert_int_equal(cm_sha256_update(&c, "a", 1), CM_OK);
    assert_int_equal(cm_sha256_update(&c, "bc", 2), CM_OK);
    uint8_t h2[32];
    assert_int_equal(cm_sha256_final(&c, h2), CM_OK);
    assert_memory_equal(h, h2, 32);
}

static void test_ed25519_sign_verify(void **state)
{
    (void)state;
    struct cm_ed25519 k;
    assert_int_equal(cm_ed25519_generate(&k), CM_OK);
    uint8_t sig[64];
    assert_int_equal(cm_ed25519_sign(&k, "hello", 5, sig), CM_OK);
    assert_int_equal(cm_ed25519_verify(k.pub, "hello", 5, sig), CM_OK);
    assert_int_equal(cm_ed25519_verify(k.pub, "hellO", 5, sig), CM_EBADSIG);
    sig[10] ^= 1;
    assert_int_equal(cm_ed25519_verify(k.pub, "hello", 5, sig), CM_EBADSIG);
    cm_ed25519_cleanup(&k);
}

static void test_ed25519_file_mode(void **state)
{
    (void)state;
    char dir[] = "/tmp/ct-test-key-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/key.pem", dir);
    struct cm_ed25519 a, b;
    int created = 0;
    assert_int_equal(cm_ed25519_load_or_create(&a, path, &created), CM_OK);
    assert_int_equal(created, 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(cm_ed25519_load_or_create(&b, path, &created), CM_OK);
    assert_int_equal(created, 0);
    assert_memory_equal(a.pub, b.pub, 32);
    cm_ed25519_cleanup(&b);
    chmod(path, 0644);
    assert_int_equal(cm_ed25519_load(&b, path, 0), CM_EPERM);
    cm_ed25519_cleanup(&a);
    unlink(path);
    rmdir(dir);
}

static void make_claims(struct cm_pass_claims *c, const uint8_t pk[32])
{
    memset(c, 0, sizeof *c);
    strcpy(c->username, "alice");
    strcpy(c->run, "fmnist-1");
    strcpy(c->pass_id, "42");
    memcpy(c->peer_public_key, pk, 32);
    c->issued_at = 1000;
    c->expires_at = 4600;
}

static void test_token_roundtrip_and_checks(void **state)
{
    (void)state;
    struct cm_ed25519 coord, other, peer;
    assert_int_equal(cm_ed25519_generate(&coord), CM_OK);
    assert_int_equal(cm_ed25519_generate(&other), CM_OK);
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    struct cm_pass_claims c, got;
    make_claims(&c, peer.pub);
    char *tok = NULL;
    assert_int_equal(cm_token_sign(&coord, &c, &tok), CM_OK);
    size_t n = strlen(tok);
    uint8_t keys[2][32];
    memcpy(keys[0], other.pub, 32);
    memcpy(keys[1], coord.pub, 32);

    assert_int_equal(cm_token_verify(tok, n, keys, 2, 2000, 30, &got), CM_OK);
    assert_string_equal(got.username, "alice");
    assert_string_equal(got.run, "fmnist-1");
    assert_string_equal(got.pass_id, "42");
    assert_memory_equal(got.peer_public_key, peer.pub, 32);
    assert_int_equal(got.issued_at, 1000);
    assert_int_equal(got.expires_at, 4600);

    /* unknown signer */
    assert_int_equal(cm_token_verify(tok, n, keys, 1, 2000, 30, &got), CM_EBADSIG);
    /* expiry and not-yet-valid, with skew */
    assert_int_equal(cm_token_verify(tok, n, keys, 2, 4629, 30, &got), CM_OK);
    assert_int_equal(cm_token_verify(tok, n, keys, 2, 4630, 30, &got), CM_EEXPIRED);
    assert_int_equal(cm_token_verify(tok, n, keys, 2, 900, 30, &got), CM_EINVAL);

    /* any flipped character breaks it */
    for (size_t i = 0; i < n; i++) {
        char *t = strdup(tok);
        t[i] = t[i] == 'A' ? 'B' : 'A';
        assert_int_not_equal(cm_token_verify(t, n, keys, 2, 2000, 30, &got), CM_OK);
        free(t);
    }
    /* truncations are rejected */
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(cm_token_verify(tok, i, keys, 2, 2000, 30, &got), CM_OK);

    /* a token re-signed by another key with a forged kid does not verify */
    char *forged = NULL;
    assert_int_equal(cm_token_sign(&other, &c, &forged), CM_OK);
    assert_int_equal(cm_token_verify(forged, strlen(forged), keys + 1, 1, 2000, 30, &got),
                     CM_EBADSIG);
    free(forged);
    free(tok);
    cm_ed25519_cleanup(&coord);
    cm_ed25519_cleanup(&other);
    cm_ed25519_cleanup(&peer);
}

static void test_token_rejects_bad_claims(void **state)
{
    (void)state;
    struct cm_ed25519 coord;
    assert_int_equal(cm_ed25519_generate(&coord), CM_OK);
    struct cm_pass_claims c;
    char *tok = NULL;
    make_claims(&c, coord.pub);
    strcpy(c.username, "bad name");
    assert_int_equal(cm_token_sign(&coord, &c, &tok), CM_EINVAL);
    make_claims(&c, coord.pub);
    c.expires_at = c.issued_at;
    assert_int_equal(cm_token_sign(&coord, &c, &tok), CM_EINVAL);
    assert_null(tok);
    cm_ed25519_cleanup(&coord);
}

static void test_names(void **state)
{
    (void)state;
    assert_true(cm_name_valid("alice"));
    assert_true(cm_name_valid("a.b-c_9"));
    assert_false(cm_name_valid(""));
    assert_false(cm_name_valid("-x"));
    assert_false(cm_name_valid(".x"));
    assert_false(cm_name_valid("x'; DROP TABLE users;--"));
    assert_false(cm_name_valid("caf\xc3\xa9"));
    char longname[70];
    memset(longname, 'a', 65);
    longname[65] = 0;
    assert_false(cm_name_valid(longname));
    longname[64] = 0;
    assert_true(cm_name_valid(longname));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64url_roundtrip),
        cmocka_unit_test(test_sha256_vector),
        cmocka_unit_test(test_ed25519_sign_verify),
        cmocka_unit_test(test_ed25519_file_mode),
        cmocka_unit_test(test_token_roundtrip_and_checks),
        cmocka_unit_test(test_token_rejects_bad_claims),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
