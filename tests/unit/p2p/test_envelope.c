/* Signed envelopes without sockets: round trip of build/parse, every bound
 * of the parser, each rejection of p2p_auth_check_request/response driven on
 * its own, the replay cache's bounded memory (eviction raises a watermark so
 * an evicted nonce still cannot be replayed), the verified-token cache, and
 * frame header parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"
#include "p2p/p2p_envelope.h"
#include "p2p/p2p_frame.h"
#include "tests/harness/p2p_testkit.h"

struct env {
    struct p2p_tk tk;
    struct p2p_tk_peer a, b;
    struct p2p_auth auth;
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    cm_log_set_level(CM_LOG_ERROR);
    assert_int_equal(p2p_tk_init(&e->tk, "r"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "a", "1", 600, &e->a), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "b", "2", 600, &e->b), 0);
    struct p2p_auth_config ac = p2p_tk_auth_config(&e->tk);
    ac.replay_capacity = 4;
    assert_int_equal(p2p_auth_init(&e->auth, &ac), 0);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    p2p_auth_cleanup(&e->auth);
    p2p_tk_peer_cleanup(&e->a);
    p2p_tk_peer_cleanup(&e->b);
    p2p_tk_cleanup(&e->tk);
    free(e);
    return 0;
}

/* Builds a frame from a to b and parses its payload into env. */
static void make(struct env *e, struct p2p_tk_peer *from, const char *token, uint32_t kind,
                 const uint8_t *recipient, int64_t t, const uint8_t nonce[16],
                 struct p2p_envelope *out)
{
    struct p2p_envelope_out o = {.kind = kind, .type = 16, .request_id = 77, .token = token,
                                 .recipient = recipient, .time_ms = t, .listen_port = 4242,
                                 .body = (const uint8_t *)"body", .body_len = 4};
    memcpy(o.nonce, nonce, 16);
    uint8_t *f;
    size_t len;
    assert_int_equal(p2p_envelope_build(&from->key, &o, &f, &len), 0);
    const uint8_t *p;
    size_t pl, used;
    assert_int_equal(p2p_frame_next(f, len, &p, &pl, &used), 0);
    assert_int_equal(used, len);
    assert_int_equal(p2p_envelope_parse(p, pl, out), 0);
    free(f);
    (void)e;
}

static void test_roundtrip(void **state)
{
    struct env *e = *state;
    uint8_t nonce[16] = {1, 2, 3};
    struct p2p_envelope env;
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, 12345, nonce, &env);
    assert_int_equal(env.kind, P2P_KIND_REQUEST);
    assert_int_equal(env.type, 16);
    assert_int_equal(env.request_id, 77);
    assert_int_equal(env.time_ms, 12345);
    assert_int_equal(env.listen_port, 4242);
    assert_int_equal(env.body_len, 4);
    assert_memory_equal(env.body, "body", 4);
    assert_memory_equal(env.recipient, e->b.key.pub, 32);
    assert_memory_equal(env.nonce, nonce, 16);
    assert_int_equal(env.token_len, strlen(e->a.token));
    p2p_envelope_cleanup(&env);
}

static void test_parser_bounds(void **state)
{
    (void)state;
    struct p2p_envelope env;
    /* kind 3 (field 1 = 3) and nothing else */
    const uint8_t k3[] = {0x08, 0x03};
    assert_int_equal(p2p_envelope_parse(k3, sizeof k3, &env), CM_EPARSE);
    /* truncated varint */
    const uint8_t tr[] = {0x08};
    assert_int_equal(p2p_envelope_parse(tr, sizeof tr, &env), CM_EPARSE);
    /* a length that lies (claims 100 bytes of token, has 2) */
    const uint8_t lie[] = {0x08, 0x01, 0x22, 100, 'a', 'b'};
    assert_int_equal(p2p_envelope_parse(lie, sizeof lie, &env), CM_EPARSE);
    assert_int_equal(p2p_envelope_parse(NULL, 0, &env), CM_EPARSE);
    /* frame headers */
    struct p2p_frame_hdr h;
    uint8_t hdr[8];
    assert_int_equal(p2p_frame_write_hdr(hdr, 10), 0);
    assert_int_equal(p2p_frame_parse_hdr(hdr, 7, &h), 1);
    assert_int_equal(p2p_frame_parse_hdr(hdr, 8, &h), 0);
    assert_int_equal(h.length, 10);
    const uint8_t *p;
    size_t pl, used;
    uint8_t buf[18] = {0};
    memcpy(buf, hdr, 8);
    assert_int_equal(p2p_frame_next(buf, 17, &p, &pl, &used), 1);
    assert_int_equal(p2p_frame_next(buf, 18, &p, &pl, &used), 0);
    assert_int_equal(used, 18);
    assert_int_equal(p2p_frame_write_hdr(hdr, P2P_FRAME_MAX_PAYLOAD + 1), CM_ETOOBIG);
    hdr[2] = 2;
    assert_int_equal(p2p_frame_parse_hdr(hdr, 8, &h), CM_EVERSION);
}

static void test_request_checks(void **state)
{
    struct env *e = *state;
    struct p2p_auth *au = &e->auth;
    struct cm_pass_claims cl;
    enum p2p_reject why;
    struct p2p_envelope env;
    uint8_t n1[16];
    int64_t now = (int64_t)time(NULL) * 1000;

    cm_random_bytes(n1, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now, n1, &env);
    assert_int_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), 0);
    assert_string_equal(cl.username, "a");
    /* same nonce again */
    assert_int_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), CM_EREPLAY);
    assert_int_equal(why, P2P_REJ_REPLAY);
    /* addressed to someone else */
    assert_int_not_equal(p2p_auth_check_request(au, &env, e->a.key.pub, now, &cl, &why), 0);
    assert_int_equal(why, P2P_REJ_RECIPIENT);
    p2p_envelope_cleanup(&env);

    /* skew both ways */
    cm_random_bytes(n1, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now + 61000, n1, &env);
    assert_int_not_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), 0);
    assert_int_equal(why, P2P_REJ_SKEW);
    p2p_envelope_cleanup(&env);
    /* b's token with a's key: signature under b's key fails */
    cm_random_bytes(n1, 16);
    make(e, &e->a, e->b.token, P2P_KIND_REQUEST, e->b.key.pub, now, n1, &env);
    assert_int_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), CM_EBADSIG);
    assert_int_equal(why, P2P_REJ_SIGNATURE);
    p2p_envelope_cleanup(&env);
    /* a non-PING without a recipient */
    cm_random_bytes(n1, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, NULL, now, n1, &env);
    assert_int_not_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), 0);
    assert_int_equal(why, P2P_REJ_RECIPIENT);
    p2p_envelope_cleanup(&env);
    /* token expiry is checked at the receiver's time, also when cached */
    cm_random_bytes(n1, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now + 3600000, n1, &env);
    assert_int_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now + 3600000, &cl, &why),
                     CM_EEXPIRED);
    assert_int_equal(why, P2P_REJ_EXPIRED);
    p2p_envelope_cleanup(&env);
    /* a response is not a request */
    cm_random_bytes(n1, 16);
    make(e, &e->a, e->a.token, P2P_KIND_RESPONSE, e->b.key.pub, now, n1, &env);
    assert_int_not_equal(p2p_auth_check_request(au, &env, e->b.key.pub, now, &cl, &why), 0);
    p2p_envelope_cleanup(&env);
    assert_true(p2p_auth_rejects(au, P2P_REJ_REPLAY) == 1);
    assert_true(p2p_auth_rejects(au, P2P_REJ_SIGNATURE) == 1);
}

static void test_replay_watermark(void **state)
{
    struct env *e = *state;
    struct cm_pass_claims cl;
    enum p2p_reject why;
    int64_t now = (int64_t)time(NULL) * 1000;
    struct p2p_envelope first, env;
    uint8_t n0[16], n[16];
    cm_random_bytes(n0, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now, n0, &first);
    assert_int_equal(p2p_auth_check_request(&e->auth, &first, e->b.key.pub, now, &cl, &why), 0);
    /* Capacity is 4: four more nonces evict the first one. */
    for (int i = 1; i <= 4; i++) {
        cm_random_bytes(n, 16);
        make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now + i, n, &env);
        assert_int_equal(p2p_auth_check_request(&e->auth, &env, e->b.key.pub, now, &cl, &why), 0);
        p2p_envelope_cleanup(&env);
    }
    /* The evicted nonce is still refused, through the watermark. */
    assert_int_equal(p2p_auth_check_request(&e->auth, &first, e->b.key.pub, now, &cl, &why),
                     CM_EREPLAY);
    p2p_envelope_cleanup(&first);
    /* Newer messages pass. */
    cm_random_bytes(n, 16);
    make(e, &e->a, e->a.token, P2P_KIND_REQUEST, e->b.key.pub, now + 10, n, &env);
    assert_int_equal(p2p_auth_check_request(&e->auth, &env, e->b.key.pub, now, &cl, &why), 0);
    p2p_envelope_cleanup(&env);
}

static void test_response_checks(void **state)
{
    struct env *e = *state;
    struct cm_pass_claims cl;
    enum p2p_reject why;
    int64_t now = (int64_t)time(NULL) * 1000;
    uint8_t nonce[16], other[16];
    cm_random_bytes(nonce, 16);
    cm_random_bytes(other, 16);
    struct p2p_envelope env;
    /* b answers a's request */
    make(e, &e->b, e->b.token, P2P_KIND_RESPONSE, e->a.key.pub, now, nonce, &env);
    assert_int_equal(p2p_auth_check_response(&e->auth, &env, e->a.key.pub, nonce, e->b.key.pub,
                                             now, &cl, &why),
                     0);
    assert_int_not_equal(p2p_auth_check_response(&e->auth, &env, e->a.key.pub, other,
                                                 e->b.key.pub, now, &cl, &why),
                         0);
    assert_int_equal(why, P2P_REJ_NONCE);
    assert_int_not_equal(p2p_auth_check_response(&e->auth, &env, e->a.key.pub, nonce,
                                                 e->a.key.pub, now, &cl, &why),
                         0);
    assert_int_equal(why, P2P_REJ_SENDER);
    assert_int_not_equal(p2p_auth_check_response(&e->auth, &env, e->b.key.pub, nonce,
                                                 e->b.key.pub, now, &cl, &why),
                         0);
    assert_int_equal(why, P2P_REJ_RECIPIENT);
    /* revoked responder */
    const char *ids[] = {"2"};
    assert_int_equal(p2p_auth_set_revoked(&e->auth, ids, 1, 1), 0);
    assert_int_equal(p2p_auth_check_response(&e->auth, &env, e->a.key.pub, nonce, e->b.key.pub,
                                             now, &cl, &why),
                     CM_EREVOKED);
    p2p_envelope_cleanup(&env);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parser_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_watermark, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_checks, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
