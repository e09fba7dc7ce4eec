/* ct-serial: its deadlines and kills are timed */
/* Butterfly all-reduce when members fail (tests/harness/ct_argrp.h: several
 * averaging engines on one loop over real loopback sockets): late and
 * never-starting members, members gone before the round, the deadline, a
 * sender and an aggregator killed mid-round, bad senders (NaN, absurd norm,
 * a lying length) excluded and reported, a hostile aggregator, and the
 * answers for unknown, early and finished rounds (seed
 * 000_02cc6b5d62a616fc.txt, section 3.2; DESIGN.md step 4). */
/* ct-timeout: 180 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ar/ar.h"
#include "ar/ar_codec.h"
#include "ar/ar_msg.h"
#include "cm_err.h"
#include "p2p/p2p_relay.h"
#include "tests/harness/ct_argrp.h"
#include "tests/harness/p2p_testkit.h"

static void test_staggered_start(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 20000, frac, sends, listen, NULL);
    int start[] = {0, 150, 300};
    argrp_run(&g, start, -1, 0, 20000);
    argrp_check_exact(&g, argrp_senders(&g));
    argrp_cleanup(&g);
}

/* A sender that never shows up is dropped after stall_ms; the mean
 * renormalizes over the others. Its part (it aggregates too) is lost. */
static void test_sender_never_starts(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 0};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct argrp g;
    argrp_init(&g, 4, 30000, frac, sends, listen, NULL);
    int start[] = {0, 0, 0, -1};
    argrp_run(&g, start, -1, 0, 20000);
    argrp_check_exact(&g, 0x7);
    for (size_t i = 0; i < 3; i++)
        for (size_t k = 0; k < 3; k++)
            assert_int_equal(g.p[i].parts[k].dropped, 0x8);
    argrp_cleanup(&g);
}

/* Four members, the fourth never there: the three others lost its part
 * (status why, their local values kept), dropped it as a sender, averaged
 * the other three parts exactly over themselves, and were done within
 * max_ms. */
static void check_fourth_lost(struct argrp *g, int why, double max_ms)
{
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g->p[i];
        assert_int_equal(p->res.status, why);
        assert_int_equal(p->res.n_averaged, 3);
        assert_false(p->parts[3].averaged);
        assert_int_equal(p->parts[3].status, why);
        assert_memory_equal(p->buf + p->parts[3].offset, p->orig + p->parts[3].offset,
                            p->parts[3].len * sizeof(float));
        for (size_t k = 0; k < 3; k++) {
            assert_int_equal(p->parts[k].dropped, 0x8);
            for (size_t j = p->parts[k].offset; j < p->parts[k].offset + p->parts[k].len; j++)
                assert_true(argrp_close_to(p->buf[j], argrp_mean_at(g, 0x7, j, NULL), 3e-7));
        }
        assert_true(p->res.ms_total < max_ms);
    }
}

/* An aggregator whose engine lives but never starts the round: its
 * "round unknown" answers do not count as alive, so the others give its
 * part up after stall_ms, not at the deadline. */
static void test_aggregator_never_starts(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct argrp g;
    argrp_init(&g, 4, 30000, frac, sends, listen, NULL);
    int start[] = {0, 0, 0, -1};
    argrp_run(&g, start, -1, 0, 20000);
    check_fourth_lost(&g, CM_ETIMEOUT, 5000); /* deadline is 20 s */
    argrp_cleanup(&g);
}

/* A member that starts later than stall_ms (its previous group round lost
 * a peer) is still waited for when start_wait_ms covers it: its "round
 * unknown" answers keep the others trying, and the aggregators keep its
 * place as a sender. The same start without start_wait_ms drops it. */
static void test_late_start_within_start_wait(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 20000, frac, sends, listen, NULL);
    g.base.start_wait_ms = 4000; /* stall_ms 1500 */
    int start[] = {0, 0, 2500};
    argrp_run(&g, start, -1, 0, 20000);
    argrp_check_exact(&g, argrp_senders(&g));
    argrp_cleanup(&g);

    argrp_init(&g, 3, 20000, frac, sends, listen, NULL);
    argrp_run(&g, start, -1, 0, 20000);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(g.p[i].res.n_averaged, 2);
        assert_false(g.p[i].parts[2].averaged);
        assert_int_equal(g.p[i].parts[0].dropped, 0x4);
    }
    argrp_cleanup(&g);
}

/* Members known gone (cfg.gone, e.g. unreachable in an earlier group round)
 * are not waited for: their parts fail at once with CM_ECONN and they are
 * dropped as senders at once, so the round ends long before stall_ms. */
static void test_gone_members_not_waited_for(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    struct argrp g;
    argrp_init(&g, 4, 30000, frac, sends, listen, NULL);
    g.base.stall_ms = 8000;
    g.base.gone = 0x8;
    int start[] = {0, 0, 0, -1};
    argrp_run(&g, start, -1, 0, 20000);
    check_fourth_lost(&g, CM_ECONN, 4000); /* stall is 8 s */
    argrp_cleanup(&g);
}

/* The round deadline bounds everything, even with a long stall limit:
 * aggregators stop waiting for a silent sender at 4/5 of it, so the other
 * parts are still averaged; the part of an aggregator that never starts is
 * given up at the deadline. */
static void test_deadline(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 20000, frac, sends, listen, NULL);
    g.base.deadline_ms = 800;
    g.base.stall_ms = 30000;
    int start[] = {0, 0, -1};
    int64_t t0 = p2p_now_ms();
    argrp_run(&g, start, -1, 0, 5000);
    int64_t took = p2p_now_ms() - t0;
    assert_true(took >= 750 && took < 3000); /* the missing part waits for the deadline */
    for (size_t i = 0; i < 2; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_int_equal(p->res.status, CM_ETIMEOUT);
        assert_int_equal(p->res.n_averaged, 2);
        assert_false(p->parts[2].averaged);
        assert_int_equal(p->parts[2].status, CM_ETIMEOUT);
        assert_memory_equal(p->buf + p->parts[2].offset, p->orig + p->parts[2].offset,
                            p->parts[2].len * sizeof(float));
        for (size_t j = 0; j < p->parts[2].offset; j++)
            assert_true(argrp_close_to(p->buf[j], argrp_mean_at(&g, 0x3, j, NULL), 3e-7));
    }
    argrp_cleanup(&g);
}

/* A sender (not an aggregator) killed while its slow upload is under way:
 * dropped after stall_ms; chunks it delivered keep it, the others are
 * averaged without it; every chunk is one of the two exact means. */
static void test_sender_killed_mid_round(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 0};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    double mbps[] = {0, 0, 0, 4}; /* 0.5 MB/s: its 3 x 256 KiB take ~1.5 s */
    struct argrp g;
    argrp_init(&g, 4, 196608, frac, sends, listen, mbps);
    argrp_run(&g, NULL, 3, 500, 20000);
    int with = 0, without = 0;
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_equal(p->res.status, 0);
        for (size_t k = 0; k < 3; k++) {
            const struct ar_part_report *pr = &p->parts[k];
            assert_true(pr->averaged);
            assert_int_equal(pr->dropped, 0x8);
            assert_true(pr->weight <= pr->weight_max);
            for (size_t c0 = pr->offset; c0 < pr->offset + pr->len; c0 += 1024) {
                size_t c1 = c0 + 1024 < pr->offset + pr->len ? c0 + 1024 : pr->offset + pr->len;
                int inc = argrp_close_to(p->buf[c0], argrp_mean_at(&g, 0xf, c0, NULL), 3e-7);
                for (size_t j = c0; j < c1; j++)
                    assert_true(argrp_close_to(p->buf[j], argrp_mean_at(&g, inc ? 0xf : 0x7, j, NULL), 3e-7));
                if (i == 0)
                    inc ? with++ : without++;
            }
        }
        argrp_assert_identical(&g, p);
    }
    assert_true(without > 0); /* it really left part-way */
    assert_true(g.p[0].res.ms_total < 10000);
    argrp_cleanup(&g);
}

/* An aggregator killed while it serves (its download is slow): its part
 * stays local on every survivor, the other parts are averaged over the
 * senders heard from. */
/* Each chunk of a part that was not averaged, in place: either exactly
 * the local values or an average the aggregator returned (of the senders
 * in one of the masks), never anything else (nothing non-finite). */
static void check_lost_in_place(const struct argrp *g, const struct argrp_peer *p, size_t off, size_t len,
                                const uint64_t *masks, size_t n_masks, double other)
{
    size_t local = 0;
    for (size_t c = off; c < off + len; c += 1024) {
        size_t end = c + 1024 < off + len ? c + 1024 : off + len;
        if (!memcmp(p->buf + c, p->orig + c, (end - c) * sizeof(float))) {
            local++;
            continue;
        }
        for (size_t j = c; j < end; j++) {
            int ok = other != 0 && p->buf[j] == (float)other;
            for (size_t q = 0; q < n_masks && !ok; q++)
                ok = argrp_close_to(p->buf[j], argrp_mean_at(g, masks[q], j, NULL), 3e-7);
            if (!ok)
                fail_msg("elem %zu of a lost part: %.9g is neither local nor an average", j,
                         p->buf[j]);
        }
    }
    assert_true(local > 0); /* the part was lost before its end */
}

static void run_aggregator_killed(int in_place)
{
    double frac[] = {1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1}, listen[] = {1, 1, 1, 1};
    double mbps[] = {0, 0, 0, 4};
    struct argrp g;
    argrp_in_place = in_place;
    argrp_init(&g, 4, 262144, frac, sends, listen, mbps);
    argrp_in_place = 0;
    argrp_run(&g, NULL, 3, 400, 20000);
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_not_equal(p->res.status, 0);
        assert_int_equal(p->res.n_averaged, 3);
        const struct ar_part_report *lost = &p->parts[3];
        assert_false(lost->averaged);
        assert_int_not_equal(lost->status, 0);
        /* the lost part keeps exactly the local values (in place: chunk by
           chunk, local or the dead aggregator's average) */
        if (in_place)
            check_lost_in_place(&g, p, lost->offset, lost->len, (uint64_t[]){0xf, 0x7}, 2, 0);
        else
            assert_memory_equal(p->buf + lost->offset, p->orig + lost->offset,
                                lost->len * sizeof(float));
        for (size_t k = 0; k < 3; k++) {
            const struct ar_part_report *pr = &p->parts[k];
            assert_true(pr->averaged);
            uint64_t mask = pr->counted | pr->partial;
            assert_int_equal(pr->counted & 0x7, 0x7);
            for (size_t j = pr->offset; j < pr->offset + pr->len; j += 1024) {
                /* each chunk: with or without the dead member */
                int inc = argrp_close_to(p->buf[j], argrp_mean_at(&g, 0xf, j, NULL), 3e-7);
                assert_true(inc ? (mask & 0x8) != 0
                                : argrp_close_to(p->buf[j], argrp_mean_at(&g, 0x7, j, NULL), 3e-7));
            }
        }
        argrp_assert_identical(&g, p);
    }
    argrp_cleanup(&g);
}

/* The in-place flag of a test registered twice (cmocka prestate). */
static int g_staged = 0, g_placed = 1;
static int mode_of(void **s)
{
    return *(const int *)*s;
}

static void test_aggregator_killed(void **s)
{
    run_aggregator_killed(mode_of(s));
}

static void test_bad_senders_excluded(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1, 1, 1};
    int sends[] = {1, 1, 1, 1, 1}, listen[] = {1, 1, 1, 1, 1};
    struct argrp g;
    argrp_init(&g, 5, 25600, frac, sends, listen, NULL);
    /* member 3: a NaN at the start of every part; member 4: an absurd norm. */
    size_t np, off[5], len[5];
    uint32_t own[5];
    assert_int_equal(ar_partition(g.mem, 5, g.n, AR_ALIGN, &np, own, off, len), 0);
    for (size_t k = 0; k < np; k++) {
        g.p[3].buf[off[k]] = NAN;
        for (size_t j = 0; j < 1024; j++)
            g.p[4].buf[off[k] + j] = 1e30f;
    }
    g.base.max_norm = 1e6;
    argrp_run(&g, NULL, -1, 0, 20000);
    /* members 0..2 get the exact mean over themselves; 3 and 4 excluded
     * everywhere, by every aggregator, with their reasons */
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g.p[i];
        int nan_seen = 0, norm_seen = 0;
        for (size_t x = 0; x < p->res.n_excluded; x++) {
            if (p->excl[x].member == 3 && p->excl[x].reason == AR_EXCL_NONFINITE)
                nan_seen++;
            if (p->excl[x].member == 4 && p->excl[x].reason == AR_EXCL_NORM)
                norm_seen++;
        }
        assert_int_equal(nan_seen, 5);
        assert_int_equal(norm_seen, 5);
        for (size_t k = 0; k < 5; k++)
            assert_int_equal(p->parts[k].excluded, 0x18);
    }
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g.p[i];
        for (size_t j = 0; j < g.n; j++)
            assert_true(argrp_close_to(p->buf[j], argrp_mean_at(&g, 0x7, j, NULL), 3e-7));
    }
    argrp_cleanup(&g);
}

/* A NaN in the middle of a part: the sender is excluded and its earlier
 * chunks are taken out of every chunk not yet final; only chunks already
 * final (and maybe returned) keep it, and the report says so (`partial`). */
static void test_nan_mid_part(void **s)
{
    (void)s;
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 3 * 8192, frac, sends, listen, NULL);
    g.base.window = 1; /* chunks in order */
    g.p[2].buf[5 * 1024 + 3] = NAN; /* part 0, chunk 5 */
    /* member 1 starts late, so member 2's chunks 0..5 reach aggregator 0
     * before any of part 0 can be final: all of them are taken out again */
    argrp_run(&g, (int[]){0, 400, 0}, -1, 0, 20000);
    struct argrp_peer *p = &g.p[0];
    assert_int_equal(p->parts[0].excluded, 0x4);
    int with = 0;
    for (size_t c = 0; c < 8; c++) {
        size_t j0 = c * 1024;
        int inc = argrp_close_to(p->buf[j0], argrp_mean_at(&g, 0x7, j0, NULL), 3e-7);
        assert_true(c < 5 || !inc);
        with += inc;
        for (size_t j = j0; j < j0 + 1024; j++)
            assert_true(argrp_close_to(p->buf[j], argrp_mean_at(&g, inc ? 0x7 : 0x3, j, NULL), 3e-7));
    }
    assert_int_equal(with, 0);
    assert_int_equal(p->parts[0].partial, 0);
    assert_int_equal(p->parts[0].counted, 0x3);
    assert_true(p->parts[0].weight == p->parts[0].weight_max);
    /* the other parts: member 2 was fine there */
    assert_int_equal(p->parts[1].counted, 0x7);
    argrp_assert_identical(&g, p);
    argrp_cleanup(&g);
}

/* Every sender turns out bad: a chunk with nobody left in it has no average,
 * so the part is not averaged anywhere (local values kept), reported with
 * CM_ENOTFOUND, and nothing waits for a deadline. */
static void test_all_senders_excluded(void **s)
{
    (void)s;
    double frac[] = {1, 0, 0};
    int sends[] = {0, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 8192, frac, sends, listen, NULL);
    g.base.window = 1;
    g.p[1].buf[3 * 1024] = g.p[1].orig[3 * 1024] = NAN;
    g.p[2].buf[3 * 1024 + 1] = g.p[2].orig[3 * 1024 + 1] = INFINITY;
    argrp_run(&g, (int[]){0, 0, 300}, -1, 0, 20000);
    for (size_t i = 0; i < 3; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_true(p->done);
        assert_int_equal(p->res.status, CM_ENOTFOUND);
        assert_false(p->parts[0].averaged);
        assert_true(p->res.ms_total < 10000);
        if (p->buf)
            assert_memory_equal(p->buf, p->orig, g.n * sizeof(float));
    }
    assert_int_equal(g.p[0].parts[0].excluded, 0x6);
    argrp_cleanup(&g);
}

struct reply {
    int done, status;
};
static void on_reply(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                     size_t len)
{
    struct reply *r = arg;
    (void)from, (void)body, (void)len;
    r->done = 1;
    r->status = status;
}

static int raw_send(struct argrp *g, struct p2p_host *h, size_t to, uint32_t type,
                    const uint8_t *body, size_t len)
{
    struct reply r = {0};
    assert_int_equal(p2p_request(h, (struct sockaddr *)&g->mem[to].addr, g->mem[to].pub, type,
                                 body, len, 3000, on_reply, &r),
                     0);
    int64_t end = p2p_now_ms() + 5000;
    while (!r.done && p2p_now_ms() < end)
        uv_run(&g->loop, UV_RUN_ONCE);
    assert_true(r.done);
    return r.status;
}

/* A member whose chunk lies about its length is excluded (reason "size");
 * unknown rounds are refused as "not started", finished ones as such,
 * strangers as not members. */
static void test_lying_length_and_round_states(void **s)
{
    (void)s;
    double frac[] = {1, 1, 0};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_init(&g, 3, 8192, frac, sends, listen, NULL);
    /* member 2 does not run an engine round: a raw host with its key speaks for it */
    struct p2p_host *raw;
    struct p2p_host_config hc = {.key = &g.p[2].id.key, .token = g.p[2].id.token};
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &raw), 0);
    struct ar_round_config c = g.base;
    uint8_t rid[32];
    assert_int_equal(ar_round_id(&c, rid), 0);
    uint8_t payload[4 * 1024];
    memset(payload, 0, sizeof payload);
    struct ar_data_msg d = {.part = 0, .chunk = 0, .weight = 5, .encoding = AR_COMP_NONE,
                            .count = 1024, .payload = payload, .payload_len = sizeof payload};
    memcpy(d.round, rid, 32);
    uint8_t *body;
    size_t blen;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    /* before member 0 started: "not started", retry later */
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_EBUSY);
    free(body);
    assert_int_equal(argrp_start(&g, 0), 0);
    assert_int_equal(argrp_start(&g, 1), 0);
    d.count = 1000; /* the payload still holds 1024 values: a lie */
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_ERANGE);
    free(body);
    argrp_run(&g, (int[]){0, 0, -1}, -1, 0, 20000);
    struct argrp_peer *p = &g.p[0];
    assert_int_equal(p->parts[0].excluded, 0x4);
    int found = 0;
    for (size_t x = 0; x < p->res.n_excluded; x++)
        found |= p->excl[x].member == 2 && p->excl[x].reason == AR_EXCL_SIZE;
    assert_true(found);
    argrp_check_exact(&g, 0x3);
    /* finished (lingering or forgotten): definite refusal */
    d.count = 1024;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    int st = raw_send(&g, raw, 0, AR_MSG_DATA, body, blen);
    assert_true(st == CM_ESTATE || st == CM_ERANGE);
    /* an unknown round id */
    body[2] ^= 0x55; /* inside the round id bytes */
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_EBUSY);
    free(body);
    /* a stranger (valid token, not a member) */
    struct p2p_tk_peer stranger;
    assert_int_equal(p2p_tk_peer_new(&g.tk, "eve", "99", 3600, &stranger), 0);
    struct p2p_host *eh;
    hc.key = &stranger.key;
    hc.token = stranger.token;
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &eh), 0);
    struct ar_fetch_msg f = {.part = 0, .chunk = 0};
    memcpy(f.round, rid, 32);
    assert_int_equal(ar_fetch_build(&f, &body, &blen), 0);
    st = raw_send(&g, eh, 0, AR_MSG_FETCH, body, blen);
    assert_true(st == CM_EPERM || st == CM_ESTATE);
    free(body);
    p2p_host_close(eh);
    p2p_host_close(raw);
    p2p_tk_peer_cleanup(&stranger);
    argrp_cleanup(&g);
}

/* A hostile aggregator (member 2, a raw host with its key): it accepts
 * chunks and claims every chunk is ready, then returns NaN averages (from
 * chunk nan_from on; 0.5 before). The honest members refuse them: that part
 * stays local (in place: the chunks before hold the valid 0.5), the others
 * are averaged. It also sends a chunk whose count and payload agree but are
 * not what the round's split says: excluded for "size". */
struct fake {
    struct argrp *g;
    size_t off[MAXP], len[MAXP];
    uint32_t own[MAXP];
    int fetches;
    uint32_t nan_from;
};

static int fake_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from,
                           uint32_t type, const uint8_t *body, size_t len, uint8_t **resp,
                           size_t *rlen)
{
    struct fake *f = arg;
    (void)h, (void)from;
    if (type == AR_MSG_DATA) {
        struct ar_data_msg d;
        if (ar_data_parse(body, len, &d))
            return CM_EPARSE;
        ar_data_cleanup(&d);
        return ar_ack_build(1000, resp, rlen) ? CM_ENOMEM : CM_OK;
    }
    if (type != AR_MSG_FETCH)
        return CM_EUNSUPPORTED;
    struct ar_fetch_msg q;
    if (ar_fetch_parse(body, len, &q) || q.part != 2)
        return CM_EINVAL;
    size_t lo = (size_t)q.chunk * 1024, cnt = f->len[2] - lo < 1024 ? f->len[2] - lo : 1024;
    float vals[1024];
    uint8_t enc[4 * 1024];
    for (size_t i = 0; i < cnt; i++)
        vals[i] = i == 7 && q.chunk >= f->nan_from ? NAN : 0.5f;
    ar_codec_encode(AR_COMP_NONE, vals, cnt, enc, sizeof enc);
    struct ar_result_msg r;
    memset(&r, 0, sizeof r);
    memcpy(r.round, q.round, 32);
    r.part = 2;
    r.chunk = q.chunk;
    r.weight = 10;
    r.counted = 0x7;
    r.encoding = AR_COMP_NONE;
    r.count = (uint32_t)cnt;
    r.payload = enc;
    r.payload_len = 4 * cnt;
    f->fetches++;
    return ar_result_build(&r, resp, rlen) ? CM_ENOMEM : CM_OK;
}

static void run_hostile_aggregator(int in_place)
{
    double frac[] = {1, 1, 1};
    int sends[] = {1, 1, 1}, listen[] = {1, 1, 1};
    struct argrp g;
    argrp_in_place = in_place;
    argrp_init(&g, 3, 8192, frac, sends, listen, NULL);
    argrp_in_place = 0;
    argrp_kill(&g, 2); /* its engine goes; a raw host with its key takes the address */
    struct fake f = {.g = &g, .nan_from = in_place ? 1 : 0};
    size_t np;
    assert_int_equal(ar_partition(g.mem, 3, g.n, AR_ALIGN, &np, f.own, f.off, f.len), 0);
    struct p2p_host *raw;
    struct p2p_host_config hc = {.key = &g.p[2].id.key, .token = g.p[2].id.token,
                                 .listen_ip = "127.0.0.1", .on_request = fake_on_request,
                                 .arg = &f};
    assert_int_equal(p2p_host_new(g.p[2].ctx, &hc, &raw), 0);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", p2p_host_port(raw));
    assert_int_equal(p2p_addr_parse(a, &g.mem[2].addr), 0);
    assert_int_equal(argrp_start(&g, 0), 0);
    assert_int_equal(argrp_start(&g, 1), 0);
    /* a consistent but wrong-sized chunk to aggregator 0 */
    uint8_t rid[32];
    assert_int_equal(ar_round_id(&g.base, rid), 0);
    uint8_t payload[4 * 512];
    memset(payload, 0, sizeof payload);
    struct ar_data_msg d = {.part = 0, .chunk = 0, .weight = 5, .encoding = AR_COMP_NONE,
                            .count = 512, .payload = payload, .payload_len = sizeof payload};
    memcpy(d.round, rid, 32);
    uint8_t *body;
    size_t blen;
    assert_int_equal(ar_data_build(&d, &body, &blen), 0);
    assert_int_equal(raw_send(&g, raw, 0, AR_MSG_DATA, body, blen), CM_ERANGE);
    free(body);
    argrp_run(&g, (int[]){0, 0, -1}, -1, 0, 20000);
    assert_true(f.fetches > 0);
    for (size_t i = 0; i < 2; i++) {
        struct argrp_peer *p = &g.p[i];
        assert_int_equal(p->res.status, CM_EPROTO);
        assert_false(p->parts[2].averaged);
        assert_int_equal(p->parts[2].status, CM_EPROTO);
        if (in_place)
            check_lost_in_place(&g, p, f.off[2], f.len[2], NULL, 0, 0.5);
        else
            assert_memory_equal(p->buf + f.off[2], p->orig + f.off[2],
                                f.len[2] * sizeof(float));
        for (size_t j = 0; j < f.off[2]; j++)
            assert_true(argrp_close_to(p->buf[j], argrp_mean_at(&g, 0x3, j, NULL), 3e-7));
    }
    assert_int_equal(g.p[0].parts[0].excluded, 0x4);
    int found = 0;
    for (size_t x = 0; x < g.p[0].res.n_excluded; x++)
        found |= g.p[0].excl[x].member == 2 && g.p[0].excl[x].reason == AR_EXCL_SIZE &&
                 g.p[0].excl[x].part == 0;
    assert_true(found);
    p2p_host_close(raw);
    argrp_cleanup(&g);
}

static void test_hostile_aggregator_and_wrong_size(void **s)
{
    run_hostile_aggregator(mode_of(s));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staggered_start),
        cmocka_unit_test(test_sender_never_starts),
        cmocka_unit_test(test_aggregator_never_starts),
        cmocka_unit_test(test_late_start_within_start_wait),
        cmocka_unit_test(test_gone_members_not_waited_for),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_sender_killed_mid_round),
        cmocka_unit_test_prestate(test_aggregator_killed, &g_staged),
        cmocka_unit_test_prestate(test_aggregator_killed, &g_placed),
        cmocka_unit_test(test_bad_senders_excluded),
        cmocka_unit_test(test_nan_mid_part),
        cmocka_unit_test(test_all_senders_excluded),
        cmocka_unit_test(test_lying_length_and_round_states),
        cmocka_unit_test_prestate(test_hostile_aggregator_and_wrong_size, &g_staged),
        cmocka_unit_test_prestate(test_hostile_aggregator_and_wrong_size, &g_placed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
