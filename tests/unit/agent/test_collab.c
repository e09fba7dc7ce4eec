/* Unit tests for agent/dp/collab.c: progress and round records round-trip
 * and reject malformed input; the collaboration estimate counts only fresh
 * peers at the step; member lists are canonical; the checkpoint uploader is
 * deterministic and rotates; a round goes on when a settled window holds a
 * majority of senders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "agent/dp/collab.h"
#include "cm_err.h"

static void test_progress_roundtrip(void **state)
{
    (void)state;
    struct collab_progress p = {0}, q;
    p.step = 42;
    p.samples = 1536;
    p.sps = 812.5;
    p.t_ms = 1795346795123LL;
    strcpy(p.addr, "127.0.0.1:4000");
    p.aux = 1;
    char rec[COLLAB_RECORD_MAX];
    assert_int_equal(collab_progress_encode(&p, rec, sizeof rec), CM_OK);
    assert_int_equal(collab_progress_parse(rec, strlen(rec), &q), CM_OK);
    assert_int_equal(q.step, 42);
    assert_true(q.samples == 1536);
    assert_true(fabs(q.sps - 812.5) < 1e-9);
    assert_int_equal(q.t_ms, p.t_ms);
    assert_string_equal(q.addr, "127.0.0.1:4000");
    assert_int_equal(q.aux, 1);
    assert_int_equal(q.client, 0);
}

static void test_progress_rejects(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "{}",
        "[1]",
        "{\"v\":2,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":-1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":1.5,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":1,\"samples\":-3,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":1,\"samples\":1e300,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"<script>\",\"client\":0,\"aux\":0}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":2,\"aux\":0}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0,\"x\":1}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0}",
    };
    struct collab_progress q;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (collab_progress_parse(bad[i], strlen(bad[i]), &q) != CM_EPARSE)
            fail_msg("accepted: %s", bad[i]);
    char big[COLLAB_RECORD_MAX + 10];
    memset(big, ' ', sizeof big);
    assert_int_equal(collab_progress_parse(big, sizeof big, &q), CM_EPARSE);
}

/* Every record of bad[0..n) is refused as an announcement. */
static void announce_refuses(const char *const *bad, size_t n)
{
    struct collab_announce b;
    for (size_t i = 0; i < n; i++)
        if (collab_announce_parse(bad[i], strlen(bad[i]), &b) != CM_EPARSE)
            fail_msg("accepted: %s", bad[i]);
}

static void test_announce(void **state)
{
    (void)state;
    struct collab_announce a = {0}, b;
    a.weight = 128;
    a.t_ms = 1795346795999LL;
    a.agg = 1;
    a.sends = 1;
    strcpy(a.addr, "[::1]:9000");
    char rec[COLLAB_RECORD_MAX];
    assert_int_equal(collab_announce_encode(&a, rec, sizeof rec), CM_OK);
    assert_int_equal(collab_announce_parse(rec, strlen(rec), &b), CM_OK);
    assert_true(b.weight == 128);
    assert_string_equal(b.addr, "[::1]:9000");
    assert_int_equal(b.t_ms, a.t_ms);
    /* an aggregator without an address, a sender without weight */
    const char *bad[] = {"{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":1,\"sends\":1,\"t\":1}",
                         "{\"v\":1,\"w\":0,\"addr\":\"1.2.3.4:5\",\"agg\":1,\"sends\":1,\"t\":1}"};
    announce_refuses(bad, 2);
    const char *aux = "{\"v\":1,\"w\":0,\"addr\":\"1.2.3.4:5\",\"agg\":1,\"sends\":0,\"t\":1}";
    assert_int_equal(collab_announce_parse(aux, strlen(aux), &b), CM_OK);
    const char *no_t = "{\"v\":1,\"w\":0,\"addr\":\"1.2.3.4:5\",\"agg\":1,\"sends\":0}";
    assert_int_equal(collab_announce_parse(no_t, strlen(no_t), &b), CM_EPARSE);
    assert_int_equal(b.pull_only, 0);
    /* a pull-only member: "po":1, sends 0 and no weight */
    struct collab_announce po = {0};
    po.t_ms = 7;
    po.pull_only = 1;
    assert_int_equal(collab_announce_encode(&po, rec, sizeof rec), CM_OK);
    assert_non_null(strstr(rec, "\"po\":1"));
    assert_int_equal(collab_announce_parse(rec, strlen(rec), &b), CM_OK);
    assert_int_equal(b.pull_only, 1);
    assert_int_equal(b.sends, 0);
    const char *bad_po[] = {
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"po\":1}",
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":0,\"t\":1,\"po\":1}",
        "{\"v\":1,\"w\":0,\"addr\":\"\",\"agg\":0,\"sends\":0,\"t\":1,\"po\":2}",
        "{\"v\":1,\"w\":0,\"addr\":\"\",\"agg\":0,\"sends\":0,\"t\":1,\"po\":true}"};
    announce_refuses(bad_po, 4);
    /* a member reached through a relay: "rl":1 (others may punch a hole to
       it); only with an address, 0 or 1 */
    struct collab_announce rl = a;
    rl.relayed = 1;
    assert_int_equal(collab_announce_encode(&rl, rec, sizeof rec), CM_OK);
    assert_non_null(strstr(rec, "\"rl\":1"));
    assert_int_equal(collab_announce_parse(rec, strlen(rec), &b), CM_OK);
    assert_int_equal(b.relayed, 1);
    assert_int_equal(collab_announce_encode(&a, rec, sizeof rec), CM_OK);
    assert_null(strstr(rec, "\"rl\""));
    assert_int_equal(collab_announce_parse(rec, strlen(rec), &b), CM_OK);
    assert_int_equal(b.relayed, 0);
    const char *bad_rl[] = {
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"rl\":1}",
        "{\"v\":1,\"w\":5,\"addr\":\"1.2.3.4:5\",\"agg\":1,\"sends\":1,\"t\":1,\"rl\":2}",
        "{\"v\":1,\"w\":5,\"addr\":\"1.2.3.4:5\",\"agg\":1,\"sends\":1,\"t\":1,\"rl\":\"1\"}"};
    announce_refuses(bad_rl, 3);
    /* the peers its author saw on the step: "on", a whole count from 1,
       absent when 0 */
    assert_null(strstr(rec, "\"on\""));
    assert_int_equal(b.on, 0);
    struct collab_announce on = a;
    on.on = 4;
    assert_int_equal(collab_announce_encode(&on, rec, sizeof rec), CM_OK);
    assert_non_null(strstr(rec, "\"on\":4"));
    assert_int_equal(collab_announce_parse(rec, strlen(rec), &b), CM_OK);
    assert_int_equal(b.on, 4);
    const char *bad_on[] = {
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"on\":0}",
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"on\":-2}",
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"on\":2.5}",
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"on\":\"3\"}",
        "{\"v\":1,\"w\":5,\"addr\":\"\",\"agg\":0,\"sends\":1,\"t\":1,\"on\":1e9}"};
    announce_refuses(bad_on, 5);
}

static void test_estimate(void **state)
{
    (void)state;
    struct collab_progress p[4] = {0};
    int64_t now = 1000000;
    p[0].step = 5, p[0].samples = 100, p[0].sps = 50, p[0].t_ms = now - 100;
    p[1].step = 5, p[1].samples = 200, p[1].sps = 50, p[1].t_ms = now - 200;
    p[2].step = 5, p[2].samples = 999, p[2].sps = 50, p[2].t_ms = now - 60000; /* stale */
    p[3].step = 6, p[3].samples = 10, p[3].sps = 10, p[3].t_ms = now;           /* ahead */
    struct collab_view v;
    collab_estimate(p, 4, 5, now, 15000, 400, &v);
    assert_int_equal(v.peers, 3);
    assert_int_equal(v.at_step, 2);
    assert_true(v.samples == 300);
    assert_int_equal(v.max_step, 6);
    assert_true(fabs(v.eta_s - 1.0) < 1e-9); /* 100 more at 100/s */
    collab_estimate(p, 2, 5, now, 15000, 300, &v);
    assert_true(v.eta_s == 0);
    /* the newest parameters a peer holds: only records with their hash
       count (a peer whose round averages ahead of its parameters publishes
       the step the round applies to, without a hash) */
    struct collab_progress q[3] = {0};
    q[0].step = 8, q[0].pstep = 7, q[0].t_ms = now, strcpy(q[0].hash, "0123456789abcdef");
    q[1].step = 9, q[1].pstep = 8, q[1].t_ms = now; /* joined ahead: no hash */
    q[2].step = 8, q[2].pstep = 8, q[2].t_ms = now, q[2].aux = 1, strcpy(q[2].hash, "0123456789abcdef");
    collab_estimate(q, 3, 8, now, 15000, 400, &v);
    assert_int_equal(v.max_step, 9);
    assert_int_equal(v.max_pstep, 7);
    collab_estimate(q, 0, 8, now, 15000, 400, &v);
    assert_int_equal(v.max_pstep, -1);
}

static void test_canonical_and_uploader(void **state)
{
    (void)state;
    struct collab_announce a[5] = {0};
    for (int i = 0; i < 5; i++) {
        memset(a[i].pub, 0, 32);
        a[i].pub[0] = (uint8_t)(50 - i * 10);
        a[i].sends = 1;
    }
    a[4].pub[0] = a[1].pub[0]; /* duplicate key */
    size_t n = collab_canonical(a, 5);
    assert_int_equal(n, 4);
    for (size_t i = 1; i < n; i++)
        assert_true(memcmp(a[i - 1].pub, a[i].pub, 32) < 0);
    size_t u1 = collab_checkpoint_uploader(a, n, 100);
    assert_true(u1 < n);
    assert_int_equal(collab_checkpoint_uploader(a, n, 100), u1);
    int differs = 0;
    for (int64_t s = 101; s < 120; s++)
        differs |= collab_checkpoint_uploader(a, n, s) != u1;
    assert_true(differs); /* the duty rotates */
    a[u1].sends = 0;      /* aggregate-only peers never upload */
    assert_int_not_equal(collab_checkpoint_uploader(a, n, 100), u1);
    assert_int_equal(collab_checkpoint_uploader(a, 0, 1), 0);
}

static void test_progress_state_and_hash(void **state)
{
    (void)state;
    struct collab_progress p = {0}, q;
    p.step = 7;
    snprintf(p.addr, sizeof p.addr, "127.0.0.1:4000");
    snprintf(p.st, sizeof p.st, "127.0.0.1:4001");
    snprintf(p.hash, sizeof p.hash, "0123456789abcdef");
    char rec[COLLAB_RECORD_MAX];
    assert_int_equal(collab_progress_encode(&p, rec, sizeof rec), CM_OK);
    assert_int_equal(collab_progress_parse(rec, strlen(rec), &q), CM_OK);
    assert_string_equal(q.st, "127.0.0.1:4001");
    assert_string_equal(q.hash, "0123456789abcdef");
    /* older records without them still parse */
    const char *old = "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0}";
    assert_int_equal(collab_progress_parse(old, strlen(old), &q), CM_OK);
    assert_string_equal(q.hash, "");
    const char *bad[] = {
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0,\"h\":\"0123\"}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0,\"h\":\"0123456789ABCDEF\"}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0,\"st\":\"x y\"}",
        "{\"v\":1,\"step\":1,\"samples\":1,\"sps\":1,\"t\":1,\"addr\":\"\",\"client\":0,\"aux\":0,\"st\":5}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(collab_progress_parse(bad[i], strlen(bad[i]), &q), CM_EPARSE);
}

static void test_outcome_records(void **state)
{
    (void)state;
    struct collab_outcome o = {0}, q;
    for (int i = 0; i < 16; i++)
        o.rid[i] = (uint8_t)(i * 17);
    o.mask = 0xfedcba9876543210ULL;
    o.t_ms = 1234;
    char rec[COLLAB_RECORD_MAX];
    assert_int_equal(collab_outcome_encode(&o, rec, sizeof rec), CM_OK);
    assert_int_equal(collab_outcome_parse(rec, strlen(rec), &q), CM_OK);
    assert_memory_equal(q.rid, o.rid, 16);
    assert_true(q.mask == o.mask);
    assert_true(q.t_ms == 1234);
    const char *bad[] = {
        "{\"v\":1,\"rid\":\"00\",\"mask\":\"0000000000000001\",\"t\":1}",
        "{\"v\":1,\"rid\":\"000102030405060708090a0b0c0d0e0f\",\"mask\":1,\"t\":1}",
        "{\"v\":1,\"rid\":\"000102030405060708090a0b0c0d0e0f\",\"mask\":\"000000000000000g\",\"t\":1}",
        "{\"v\":1,\"rid\":\"000102030405060708090a0b0c0d0e0f\",\"mask\":\"0000000000000001\",\"t\":1,\"x\":0}",
        "{\"v\":1,\"rid\":\"000102030405060708090a0b0c0d0e0f\",\"mask\":\"0000000000000001\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(collab_outcome_parse(bad[i], strlen(bad[i]), &q), CM_EPARSE);
}

/* The agreed parts: the AND of the counted outcomes; decided once every
 * member reported or the window closed; other rounds and strangers ignored. */
static void test_outcome_final(void **state)
{
    (void)state;
    uint8_t members[3][CM_ED25519_PUB_LEN] = {{1}, {2}, {3}};
    uint8_t rid[16] = {9}, other[16] = {8};
    struct collab_outcome o[6];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 3; i++) {
        memcpy(o[i].pub, members[i], CM_ED25519_PUB_LEN);
        memcpy(o[i].rid, rid, 16);
        o[i].mask = 0x7;
        o[i].t_ms = 1000 + 10 * i;
    }
    uint64_t mask;
    int decided;
    /* two of three reported, window open: not decided yet */
    assert_int_equal(collab_outcome_final(o, 2, rid, (const uint8_t(*)[32])members, 3, 500, 100, 1100,
                                          &mask, &decided), 2);
    assert_false(decided);
    assert_true(mask == 0x7);
    /* all reported: decided at once */
    o[1].mask = 0x5; /* member 2 missed part 1 */
    assert_int_equal(collab_outcome_final(o, 3, rid, (const uint8_t(*)[32])members, 3, 500, 100, 1100,
                                          &mask, &decided), 3);
    assert_true(decided);
    assert_true(mask == 0x5);
    /* a member that reported after the window is not counted */
    o[1].t_ms = 2000;
    assert_int_equal(collab_outcome_final(o, 3, rid, (const uint8_t(*)[32])members, 3, 500, 100, 2100,
                                          &mask, &decided), 2);
    assert_true(mask == 0x7);
    /* one member silent: decided after close + margin only */
    assert_int_equal(collab_outcome_final(o, 1, rid, (const uint8_t(*)[32])members, 3, 500, 100, 1550,
                                          &mask, &decided), 1);
    assert_false(decided);
    collab_outcome_final(o, 1, rid, (const uint8_t(*)[32])members, 3, 500, 100, 1601, &mask, &decided);
    assert_true(decided);
    /* another round's outcome, a stranger and a duplicate change nothing */
    o[3] = o[0];
    memcpy(o[3].rid, other, 16);
    o[3].mask = 0;
    o[4] = o[2];
    o[4].pub[0] = 77;
    o[4].mask = 0;
    o[5] = o[0];
    o[5].mask = 0; /* duplicate author: the first is kept */
    o[1].t_ms = 1010;
    o[1].mask = 0x7;
    assert_int_equal(collab_outcome_final(o, 6, rid, (const uint8_t(*)[32])members, 3, 500, 100, 1100,
                                          &mask, &decided), 3);
    assert_true(mask == 0x7);
    assert_true(decided);
}

static void test_round_window(void **state)
{
    (void)state;
    struct collab_announce a[4] = {0};
    int64_t t[4] = {1000, 1250, 1300, 1301};
    for (int i = 0; i < 4; i++) {
        a[i].t_ms = t[i];
        a[i].pub[0] = (uint8_t)i;
    }
    int64_t close = 0;
    struct collab_announce keep[4];
    memcpy(keep, a, sizeof keep);
    size_t n = collab_round_members(a, 4, 300, 1250, &close);
    assert_int_equal(close, 1300);
    assert_int_equal(n, 3); /* the announcement 1 ms after the close is out */
    /* ... and opens the next window, its own round */
    memcpy(a, keep, sizeof keep);
    n = collab_round_members(a, 4, 300, 1301, &close);
    assert_int_equal(close, 1601);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].pub[0], 3);
    /* windows chain: 1000 | 1301 1500 1601 | 1602 */
    int64_t t2[5] = {1000, 1301, 1500, 1601, 1602};
    struct collab_announce c[5] = {0};
    for (int i = 0; i < 5; i++) {
        c[i].t_ms = t2[4 - i];
        c[i].pub[0] = (uint8_t)(4 - i);
    }
    n = collab_round_members(c, 5, 300, 1500, &close);
    assert_int_equal(n, 3);
    assert_int_equal(close, 1601);
    n = collab_round_members(c, 3, 300, 1601, &close);
    assert_int_equal(n, 3);
    /* every peer that reads the same records computes the same members,
       whatever order they come in */
    struct collab_announce b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = a[0];
        b[i].t_ms = t[3 - i];
        b[i].pub[0] = (uint8_t)(3 - i);
    }
    n = collab_round_members(b, 4, 300, 1000, &close);
    assert_int_equal(n, 3);
    assert_int_equal(collab_canonical(b, n), 3);
    assert_int_equal(b[0].pub[0], 0);
    assert_int_equal(b[2].pub[0], 2);
}

/* Whether a round goes on without us: a window closed (plus the members'
 * margin) with senders more than half of the peers on the step. */
static void test_round_going(void **state)
{
    (void)state;
    struct collab_announce a[5] = {0};
    int64_t t[5] = {1000, 1100, 1150, 1400, 1420}; /* windows of 300: 1000-1300 | 1400-1700 */
    for (int i = 0; i < 5; i++) {
        a[4 - i].t_ms = t[i]; /* any order */
        a[4 - i].sends = 1;
    }
    /* three senders of four peers, the window closed 1300, settled 1450 */
    assert_false(collab_round_going(a, 5, 300, 150, 1449, 4));
    assert_true(collab_round_going(a, 5, 300, 150, 1450, 4));
    /* three of six is no majority: its members decline it */
    assert_false(collab_round_going(a, 5, 300, 150, 1450, 6));
    /* the second window (two senders) is no majority of four either, and
       has not settled before 1850 */
    assert_false(collab_round_going(a, 2, 300, 150, 5000, 4)); /* a[0..1]: 1420, 1400 */
    assert_true(collab_round_going(a, 2, 300, 150, 5000, 3));
    assert_false(collab_round_going(a, 2, 300, 150, 1849, 3));
    /* members that only aggregate or pull are no senders */
    a[2].sends = a[3].sends = 0; /* 1150, 1100 */
    assert_false(collab_round_going(a, 5, 300, 150, 5000, 4));
    assert_true(collab_round_going(a, 5, 300, 150, 5000, 1));
    assert_false(collab_round_going(a, 0, 300, 150, 5000, 0));
    /* what the members announced decides, not the caller's view: they
       decline the first window (three senders) when one of them saw six
       peers on the step, and go on when they saw at most five */
    a[2].sends = a[3].sends = 1;
    assert_true(collab_round_going(a + 2, 3, 300, 150, 5000, 5)); /* a[2..4]: the first window */
    a[4].on = 6; /* 1000 */
    assert_false(collab_round_going(a + 2, 3, 300, 150, 5000, 1));
    a[4].on = 2;
    a[3].on = 5; /* 1100 */
    assert_true(collab_round_going(a + 2, 3, 300, 150, 5000, 9));
    /* collab_round_on: the highest said, 0 when none said */
    assert_int_equal(collab_round_on(a, 5), 5);
    assert_int_equal(collab_round_on(a, 2), 0);
}

/* Delayed updates' waits for the peers behind: a bucket of 10 s refilled
 * at 0.1 s per second not waiting. Peers flipping between behind and level
 * used to get a fresh 10 s each time. */
static double hold_over(struct collab_hold *h, double t0, double t1, double dt, int (*behind)(double))
{
    double waited = 0;
    for (double t = t0; t < t1; t += dt)
        waited += collab_hold_update(h, behind(t), t, 10.0, 0.1) ? dt : 0;
    return waited;
}
static int always(double t)
{
    (void)t;
    return 1;
}
static int never(double t)
{
    (void)t;
    return 0;
}
static int flipping(double t)
{
    return ((long)t / 2) % 2 == 0; /* behind 2 s, level 2 s */
}
static int once(double t)
{
    return t >= 500 && t < 503;
}

static void test_hold_budget(void **state)
{
    (void)state;
    struct collab_hold h;
    collab_hold_init(&h, 10.0);
    /* 4 s behind, 1 s level, then behind: the rest of the 10 s (plus the
       0.1 s refilled while level), then about a tenth of the time */
    assert_false(collab_hold_update(&h, 0, 100.0, 10.0, 0.1)); /* nobody behind */
    double w = hold_over(&h, 101, 105, 0.05, always);
    assert_true(w > 3.9 && w < 4.1);
    (void)hold_over(&h, 105, 106, 0.05, never);
    w = 0;
    double t = 106, dry = 0;
    for (; t < 115; t += 0.05)
        if (collab_hold_update(&h, 1, t, 10.0, 0.1))
            w += 0.05;
        else if (!dry)
            dry = t;
    assert_true(dry > 112.0 && dry < 112.3);
    assert_true(w > 6.0 && w < 6.5);
    /* an update long after a wait (the caller went into a round) charges
       one poll, not the whole gap */
    collab_hold_init(&h, 10.0);
    assert_true(collab_hold_update(&h, 1, 200.0, 10.0, 0.1));
    assert_true(collab_hold_update(&h, 1, 230.0, 10.0, 0.1));
    assert_true(h.tokens > 8.9);
    /* a peer behind for good: the first 10 s, then about a tenth of the time */
    collab_hold_init(&h, 10.0);
    w = hold_over(&h, 0, 1000, 0.05, always);
    assert_true(w >= 95 && w <= 102);
    /* peers flipping between behind and level: no more than that */
    collab_hold_init(&h, 10.0);
    w = hold_over(&h, 0, 1000, 0.05, flipping);
    assert_true(w >= 10 && w <= 102);
    /* an honest wait of 3 s after a quiet while is waited in full */
    collab_hold_init(&h, 10.0);
    (void)hold_over(&h, 0, 400, 0.05, always); /* the bucket is drained */
    w = hold_over(&h, 400, 600, 0.05, once);   /* 97 s level refill it */
    assert_true(w >= 2.9 && w <= 3.1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_roundtrip),
        cmocka_unit_test(test_progress_rejects),
        cmocka_unit_test(test_announce),
        cmocka_unit_test(test_estimate),
        cmocka_unit_test(test_canonical_and_uploader),
        cmocka_unit_test(test_round_window),
        cmocka_unit_test(test_round_going),
        cmocka_unit_test(test_progress_state_and_hash),
        cmocka_unit_test(test_outcome_records),
        cmocka_unit_test(test_outcome_final),
        cmocka_unit_test(test_hold_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
