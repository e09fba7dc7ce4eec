/* Session frames (common/p2p/p2p_session.h): the MAC refuses every modified,
 * replayed, reordered or misdirected frame; both sides of the X25519
 * exchange derive the same two keys, bound to the transcript; and over real
 * loopback sockets a busy connection switches to session frames, still
 * refuses a revoked pass on every message, and carries a renewed pass. */
/* ct-timeout: 60 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "p2p/p2p_frame.h"
#include "p2p/p2p_session.h"
#include "p2p/p2p_transport.h"
#include "tests/harness/p2p_testkit.h"

static uint8_t *frame_of(struct p2p_mac *m, uint32_t kind, uint64_t id, const char *a,
                         const char *b, size_t *len)
{
    struct p2p_iov iov[2] = {{a, strlen(a)}, {b, strlen(b)}};
    uint8_t *f;
    assert_int_equal(p2p_session_build(m, kind, 33, id, kind == 2 ? -16 : 0, iov, 2, &f, len), 0);
    return f;
}

static void test_frames(void **state)
{
    (void)state;
    uint8_t k[32], k2[32];
    memset(k, 1, sizeof k);
    memset(k2, 2, sizeof k2);
    struct p2p_mac tx, rx, other;
    assert_int_equal(p2p_mac_init(&tx, k), 0);
    assert_int_equal(p2p_mac_init(&rx, k), 0);
    assert_int_equal(p2p_mac_init(&other, k2), 0);

    size_t l0, l1, l2;
    uint8_t *f0 = frame_of(&tx, 1, 7, "hello ", "world", &l0);
    uint8_t *f1 = frame_of(&tx, 2, 8, "", "x", &l1);
    uint8_t *f2 = frame_of(&tx, 1, 9, "abc", "", &l2);
    /* frame header: session flag, exact length */
    struct p2p_frame_hdr h;
    assert_int_equal(p2p_frame_parse_hdr(f0, l0, &h), 0);
    assert_int_equal(h.flags, P2P_FRAME_F_SESSION);
    assert_int_equal(h.length + P2P_FRAME_HDR_LEN, l0);
    struct p2p_session_msg m;
    assert_int_equal(p2p_session_parse(f0 + 8, l0 - 8, &m), 0);
    assert_int_equal(m.kind, 1);
    assert_int_equal(m.type, 33);
    assert_int_equal(m.request_id, 7);
    assert_int_equal(m.status, 0);
    assert_int_equal(m.body_len, 11);
    assert_memory_equal(m.body, "hello world", 11);
    assert_int_equal(p2p_session_parse(f1 + 8, l1 - 8, &m), 0);
    assert_int_equal(m.status, -16);

    /* the wrong key refuses, and consumes nothing */
    assert_int_equal(p2p_mac_verify(&other, f0, l0), CM_EBADSIG);
    /* out of order: frame 1 cannot pass as frame 0 */
    assert_int_equal(p2p_mac_verify(&rx, f1, l1), CM_EBADSIG);
    /* every single-bit change anywhere is refused, and consumes nothing */
    for (size_t i = 0; i < l0; i++) {
        f0[i] ^= 0x10;
        assert_int_equal(p2p_mac_verify(&rx, f0, l0), CM_EBADSIG);
        f0[i] ^= 0x10;
    }
    /* a cut frame is refused */
    assert_int_equal(p2p_mac_verify(&rx, f0, l0 - 1), CM_EBADSIG);
    /* in order: accepted */
    assert_int_equal(p2p_mac_verify(&rx, f0, l0), 0);
    /* replayed: refused (its sequence number is spent) */
    assert_int_equal(p2p_mac_verify(&rx, f0, l0), CM_EBADSIG);
    assert_int_equal(p2p_mac_verify(&rx, f1, l1), 0);
    assert_int_equal(p2p_mac_verify(&rx, f2, l2), 0);

    /* parser bounds */
    uint8_t bad[64] = {0};
    assert_int_equal(p2p_session_parse(bad, 40, &m), CM_EPARSE); /* kind 0 */
    bad[0] = 1;
    assert_int_equal(p2p_session_parse(bad, 40, &m), 0);
    assert_int_equal(m.body_len, 40 - 17 - 16);
    assert_int_equal(p2p_session_parse(bad, 17 + 16, &m), 0); /* empty body */
    assert_int_equal(p2p_session_parse(bad, 17 + 15, &m), CM_EPARSE); /* no room for a tag */
    bad[16] = 1;                                                      /* status +1 */
    assert_int_equal(p2p_session_parse(bad, 40, &m), CM_EPARSE);
    bad[16] = 0;
    bad[0] = 3;
    assert_int_equal(p2p_session_parse(bad, 40, &m), CM_EPARSE);

    free(f0);
    free(f1);
    free(f2);
    p2p_mac_cleanup(&tx);
    p2p_mac_cleanup(&rx);
    p2p_mac_cleanup(&other);
}

/* A frame sealed in pieces (written from where the body lies, no copy) is
 * bit-identical to the one built whole, for pieces of every alignment
 * against GCM's 16-byte blocks, and verifies in sequence with built ones. */
static void test_seal_pieces(void **state)
{
    (void)state;
    uint8_t k[32];
    memset(k, 5, sizeof k);
    struct p2p_mac a, b, rx;
    assert_int_equal(p2p_mac_init(&a, k), 0);
    assert_int_equal(p2p_mac_init(&b, k), 0);
    assert_int_equal(p2p_mac_init(&rx, k), 0);
    uint8_t data[320]; /* the largest case uses 307 bytes */
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 37 + 11);
    const size_t cuts[][3] = {{0, 0, 0}, {1, 0, 0}, {7, 9, 0}, {16, 16, 16}, {3, 0, 290},
                              {15, 17, 33}, {0, 100, 0}, {255, 1, 44}};
    for (size_t t = 0; t < sizeof cuts / sizeof cuts[0]; t++) {
        struct p2p_iov iov[4];
        size_t off = 0, n = 0;
        for (size_t j = 0; j < 3; j++) {
            iov[n++] = (struct p2p_iov){data + off, cuts[t][j]};
            off += cuts[t][j];
        }
        iov[n++] = (struct p2p_iov){data + off, t}; /* a fourth piece of t bytes */
        off += t;
        uint8_t *whole;
        size_t wlen;
        assert_int_equal(p2p_session_build(&a, 1 + (t & 1), 40 + (uint32_t)t, 1000 + t, 0, iov, n,
                                           &whole, &wlen),
                         0);
        uint8_t head[P2P_SESSION_HEAD_LEN], tag[P2P_SESSION_TAG_LEN];
        assert_int_equal(p2p_session_seal(&b, 1 + (t & 1), 40 + (uint32_t)t, 1000 + t, 0, iov, n,
                                          head, tag),
                         0);
        assert_int_equal(wlen, sizeof head + off + sizeof tag);
        assert_memory_equal(whole, head, sizeof head);
        if (off)
            assert_memory_equal(whole + sizeof head, data, off);
        assert_memory_equal(whole + sizeof head + off, tag, sizeof tag);
        assert_int_equal(p2p_mac_verify(&rx, whole, wlen), 0);
        free(whole);
    }
    /* too many pieces, or a spent sequence: refused before anything is made */
    struct p2p_iov many[P2P_SESSION_SEAL_MAX_IOV + 1];
    for (size_t i = 0; i < P2P_SESSION_SEAL_MAX_IOV + 1; i++)
        many[i] = (struct p2p_iov){data, 1};
    uint8_t head[P2P_SESSION_HEAD_LEN], tag[P2P_SESSION_TAG_LEN];
    uint64_t seq = b.seq;
    assert_int_equal(p2p_session_seal(&b, 1, 1, 1, 0, many, P2P_SESSION_SEAL_MAX_IOV + 1, head, tag),
                     CM_EINVAL);
    assert_int_equal(b.seq, seq);
    b.seq = UINT64_MAX;
    assert_int_equal(p2p_session_seal(&b, 1, 1, 1, 0, many, 1, head, tag), CM_ESTATE);
    p2p_mac_cleanup(&a);
    p2p_mac_cleanup(&b);
    p2p_mac_cleanup(&rx);
}

static void test_kx(void **state)
{
    (void)state;
    struct p2p_kx i, r;
    assert_int_equal(p2p_kx_new(&i), 0);
    assert_int_equal(p2p_kx_new(&r), 0);
    uint8_t ipub[32], rpub[32], nonce[16];
    memset(ipub, 0xa, 32);
    memset(rpub, 0xb, 32);
    memset(nonce, 0xc, 16);
    uint8_t a1[32], a2[32], b1[32], b2[32];
    assert_int_equal(p2p_kx_derive(&i, r.pub, ipub, rpub, i.pub, r.pub, nonce, a1, a2), 0);
    assert_int_equal(p2p_kx_derive(&r, i.pub, ipub, rpub, i.pub, r.pub, nonce, b1, b2), 0);
    assert_memory_equal(a1, b1, 32);
    assert_memory_equal(a2, b2, 32);
    assert_memory_not_equal(a1, a2, 32); /* one key per direction */
    /* another transcript (here the nonce) gives other keys */
    nonce[0] ^= 1;
    assert_int_equal(p2p_kx_derive(&i, r.pub, ipub, rpub, i.pub, r.pub, nonce, b1, b2), 0);
    assert_memory_not_equal(a1, b1, 32);
    /* a low-order peer key (all-zero secret) is refused */
    uint8_t zero[32] = {0};
    assert_int_equal(p2p_kx_derive(&i, zero, ipub, rpub, i.pub, zero, nonce, b1, b2), CM_EAUTH);
    p2p_kx_cleanup(&i);
    p2p_kx_cleanup(&r);
}

/* ---- over loopback ------------------------------------------------------- */

struct env {
    uv_loop_t loop;
    struct p2p_tk tk;
    struct p2p_ctx *ca, *cb; /* one ctx (process) per side */
    struct p2p_tk_peer a, b;
    struct p2p_host *ha, *hb;
};

struct result {
    int done, status;
    uint8_t body[64];
    size_t len;
};

static void on_resp(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct result *r = arg;
    (void)from;
    r->done = 1;
    r->status = status;
    r->len = len < sizeof r->body ? len : sizeof r->body;
    if (r->len)
        memcpy(r->body, body, r->len);
}

static int echo(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    (void)arg, (void)h, (void)from, (void)type;
    *resp = malloc(len ? len : 1);
    memcpy(*resp, body, len);
    *rlen = len;
    return CM_OK;
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    uv_loop_init(&e->loop);
    assert_int_equal(p2p_tk_init(&e->tk, "testrun"), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "alice", "1", 3600, &e->a), 0);
    assert_int_equal(p2p_tk_peer_new(&e->tk, "bob", "2", 3600, &e->b), 0);
    struct p2p_ctx_config cc = {.loop = &e->loop, .auth = p2p_tk_auth_config(&e->tk)};
    assert_int_equal(p2p_ctx_new(&cc, &e->ca), 0);
    assert_int_equal(p2p_ctx_new(&cc, &e->cb), 0);
    struct p2p_host_config ha = {.key = &e->a.key, .token = e->a.token, .listen_ip = "127.0.0.1",
                                 .on_request = echo, .arg = e};
    struct p2p_host_config hb = {.key = &e->b.key, .token = e->b.token};
    assert_int_equal(p2p_host_new(e->ca, &ha, &e->ha), 0);
    assert_int_equal(p2p_host_new(e->cb, &hb, &e->hb), 0);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    p2p_host_close(e->ha);
    p2p_host_close(e->hb);
    p2p_ctx_free(e->ca);
    p2p_ctx_free(e->cb);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    p2p_tk_peer_cleanup(&e->a);
    p2p_tk_peer_cleanup(&e->b);
    p2p_tk_cleanup(&e->tk);
    free(e);
    return 0;
}

/* One request from b to a; returns its status and counts b's wire bytes. */
static int request(struct env *e, const char *msg, uint64_t *wire)
{
    char s[64];
    struct sockaddr_storage a;
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(e->ha));
    assert_int_equal(p2p_addr_parse(s, &a), 0);
    struct p2p_stats st0, st1;
    p2p_ctx_stats(e->cb, &st0);
    struct result r = {0};
    int rc = p2p_request(e->hb, (struct sockaddr *)&a, e->a.key.pub, 100, (const uint8_t *)msg,
                         strlen(msg), 3000, on_resp, &r);
    if (rc)
        return rc;
    int64_t end = p2p_now_ms() + 5000;
    while (!r.done && p2p_now_ms() < end)
        uv_run(&e->loop, UV_RUN_ONCE);
    assert_true(r.done);
    p2p_ctx_stats(e->cb, &st1);
    if (wire)
        *wire = st1.bytes_sent - st0.bytes_sent;
    if (r.status == CM_OK) {
        assert_int_equal(r.len, strlen(msg));
        assert_memory_equal(r.body, msg, r.len);
    }
    return r.status;
}

static void test_upgrade(void **state)
{
    struct env *e = *state;
    uint64_t first, last;
    assert_int_equal(request(e, "one", &first), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(request(e, "again", NULL), 0);
    assert_int_equal(request(e, "one", &last), 0);
    struct p2p_stats sa, sb;
    p2p_ctx_stats(e->ca, &sa);
    p2p_ctx_stats(e->cb, &sb);
    assert_int_equal(sa.sessions, 1);
    assert_int_equal(sb.sessions, 1);
    /* the handshake is internal: not a request of the caller's */
    assert_int_equal(sb.requests_sent, 10);
    assert_int_equal(sa.requests_served, 10);
    /* a session frame carries no token, nonce or signature */
    assert_true(first > 300);
    assert_true(last < 80);
}

static void test_revoked_and_renewed(void **state)
{
    struct env *e = *state;
    for (int i = 0; i < 6; i++)
        assert_int_equal(request(e, "warm", NULL), 0);
    struct p2p_stats sa;
    p2p_ctx_stats(e->ca, &sa);
    assert_int_equal(sa.sessions, 1);
    /* b's pass is revoked at a: the next session frame is refused (and the
     * transport's single resend, signed with the same pass, too) */
    struct p2p_auth *au = p2p_ctx_auth(e->ca);
    uint64_t before = p2p_auth_rejects(au, P2P_REJ_REVOKED);
    const char *ids[] = {"2"};
    assert_int_equal(p2p_auth_set_revoked(au, ids, 1, 100), 0);
    assert_int_not_equal(request(e, "revoked", NULL), 0);
    assert_true(p2p_auth_rejects(au, P2P_REJ_REVOKED) > before);

    /* a renewed pass (same key, new pass id) works on new connections and
     * sessions */
    struct cm_pass_claims c = {.version = 1};
    int64_t now = (int64_t)time(NULL);
    c.issued_at = now - 10;
    c.expires_at = now + 600;
    snprintf(c.username, sizeof c.username, "bob");
    snprintf(c.run, sizeof c.run, "testrun");
    snprintf(c.pass_id, sizeof c.pass_id, "2b");
    memcpy(c.peer_public_key, e->b.key.pub, 32);
    char *tok;
    assert_int_equal(cm_token_sign(&e->tk.coord, &c, &tok), 0);
    assert_int_equal(p2p_host_set_token(e->hb, tok), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(request(e, "renewed", NULL), 0);

    /* a renewal on a live session: a's pass changes, b's view of it follows
     * (the next frame from a is signed with the new token), then a's old
     * pass is revoked at b and the session still works */
    snprintf(c.username, sizeof c.username, "alice");
    snprintf(c.pass_id, sizeof c.pass_id, "1b");
    memcpy(c.peer_public_key, e->a.key.pub, 32);
    char *tok_a;
    assert_int_equal(cm_token_sign(&e->tk.coord, &c, &tok_a), 0);
    assert_int_equal(p2p_host_set_token(e->ha, tok_a), 0);
    assert_int_equal(request(e, "after", NULL), 0);
    const char *old_a[] = {"1"};
    assert_int_equal(p2p_auth_set_revoked(p2p_ctx_auth(e->cb), old_a, 1, 100), 0);
    struct p2p_stats sb0, sb1;
    p2p_ctx_stats(e->cb, &sb0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(request(e, "still", NULL), 0);
    p2p_ctx_stats(e->cb, &sb1);
    assert_int_equal(sb1.conns_opened, sb0.conns_opened); /* the same connection */
    free(tok);
    free(tok_a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frames),
        cmocka_unit_test(test_seal_pieces),
        cmocka_unit_test(test_kx),
        cmocka_unit_test_setup_teardown(test_upgrade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoked_and_renewed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
