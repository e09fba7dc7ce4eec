/* Unit tests for agent/pipe/inbox.c, the pipeline stage's inbox: chunks of
 * a tensor assembled in any order (repeats harmless), taken only when
 * complete; only the assigned peer of a neighbouring stage may send
 * activations or gradients, only the other end the tied gradient, any
 * other stage a norm, nobody between two assignments (CM_EBUSY, and what
 * was held is dropped); steps outside [current, current + 1] are refused
 * (CM_EBUSY ahead, ignored behind) and earlier steps dropped; limits on
 * entries and bytes; a wait times out and stops on an interrupt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/inbox.h"
#include "cm_err.h"

#define S 3

static uint8_t g_keys[S][CM_ED25519_PUB_LEN];

static struct pipe_inbox *inbox_for(uint32_t mine, size_t entries, size_t bytes)
{
    for (int j = 0; j < S; j++)
        memset(g_keys[j], 0x10 + j, CM_ED25519_PUB_LEN);
    struct pipe_inbox *ib = NULL;
    assert_int_equal(pipe_inbox_new(entries, bytes, &ib), CM_OK);
    pipe_inbox_set_peers(ib, (const uint8_t(*)[CM_ED25519_PUB_LEN])g_keys, S, 0, mine);
    pipe_inbox_set_step(ib, 5);
    return ib;
}

/* Chunk k of an ACT of shape (B,T,C) from stage `from`, values v[i] = i. */
static struct pipe_msg act_chunk(uint32_t from, int64_t step, uint32_t B, uint32_t T, uint32_t C, uint32_t k,
                                 const float *v, const int32_t *tg)
{
    uint32_t total = B * T * C, ntg = B * T;
    struct pipe_msg m = {.type = PIPE_MSG_ACT, .step = step, .stage = from, .B = B, .T = T, .C = C,
                         .total = total};
    m.offset = pipe_chunk_offset(k, ntg);
    m.count = pipe_chunk_count(k, total, ntg);
    m.ntargets = k == 0 ? ntg : 0;
    m.targets = m.ntargets ? (const uint8_t *)tg : NULL;
    m.values = (const uint8_t *)(v + m.offset);
    return m;
}

static void test_chunks_any_order(void **state)
{
    (void)state;
    const uint32_t B = 4, T = 64, C = 600; /* 153,600 values + 256 targets: 3 chunks */
    uint32_t total = B * T * C;
    float *v = malloc(total * sizeof *v);
    int32_t tg[4 * 64];
    for (uint32_t i = 0; i < total; i++)
        v[i] = (float)i;
    for (int i = 0; i < 256; i++)
        tg[i] = i % 7 - 1;
    struct pipe_inbox *ib = inbox_for(1, 8, 1u << 24);
    uint32_t n = pipe_chunks(total, B * T);
    assert_int_equal(n, 3);
    struct pipe_entry *e = NULL;
    /* last chunk first, a repeat, then the others */
    struct pipe_msg m = act_chunk(0, 5, B, T, C, 2, v, tg);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_ACT, 5, 0, 0, 50, NULL, &e), CM_ETIMEOUT);
    m = act_chunk(0, 5, B, T, C, 0, v, tg);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_ACT, 5, 0, 0, 50, NULL, &e), CM_ETIMEOUT);
    m = act_chunk(0, 5, B, T, C, 1, v, tg);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_ACT, 5, 0, 0, 50, NULL, &e), CM_OK);
    assert_int_equal(e->total, total);
    assert_memory_equal(e->values, v, total * sizeof *v);
    assert_memory_equal(e->targets, tg, sizeof tg);
    pipe_entry_free(e);
    /* taken: a late repeat of a chunk starts a new tensor, never completes a taken one */
    m = act_chunk(0, 5, B, T, C, 2, v, tg);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_ACT, 5, 0, 0, 20, NULL, &e), CM_ETIMEOUT);
    /* a chunk that does not fit: wrong offset, wrong count, targets where none go */
    m = act_chunk(0, 5, B, T, C, 1, v, tg);
    m.mb = 1;
    m.offset += 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_ERANGE);
    m = act_chunk(0, 5, B, T, C, 1, v, tg);
    m.mb = 1;
    m.count -= 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_ERANGE);
    m = act_chunk(0, 5, B, T, C, 0, v, tg);
    m.mb = 2;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    m.C = C + 1; /* the same tensor with another shape */
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_ERANGE);
    pipe_inbox_free(ib);
    free(v);
}

static void test_who_may_send(void **state)
{
    (void)state;
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tg[2] = {1, -1};
    struct pipe_inbox *ib = inbox_for(1, 16, 1u << 20);
    struct pipe_msg act = act_chunk(0, 5, 1, 2, 4, 0, v, tg);
    uint8_t stranger[CM_ED25519_PUB_LEN];
    memset(stranger, 0x77, sizeof stranger);
    assert_int_equal(pipe_inbox_put(ib, stranger, &act), CM_EAUTH);   /* not the assigned peer */
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &act), CM_EAUTH);  /* another stage's key */
    act.replica = 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &act), CM_EAUTH);  /* another pipeline */
    act.replica = 0;
    act.stage = 2;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &act), CM_EAUTH);  /* activations from behind */
    struct pipe_msg grad = {.type = PIPE_MSG_GRAD, .step = 5, .stage = 0, .B = 1, .T = 2, .C = 4, .total = 8,
                            .count = 8, .values = (const uint8_t *)v};
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &grad), CM_EAUTH); /* gradients from ahead */
    grad.stage = 2;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &grad), CM_OK);
    struct pipe_msg tied = {.type = PIPE_MSG_TIED, .step = 5, .stage = 0, .total = 8, .count = 8,
                            .values = (const uint8_t *)v};
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &tied), CM_EAUTH); /* a middle stage has no wte */
    struct pipe_msg norm = {.type = PIPE_MSG_NORM, .step = 5, .stage = 2, .sumsq = 2.5};
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &norm), CM_OK);
    struct pipe_entry *e = NULL;
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_NORM, 5, 0, 2, 50, NULL, &e), CM_OK);
    assert_true(e->sumsq == 2.5);
    pipe_entry_free(e);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 5, 0, 2, 50, NULL, &e), CM_OK);
    assert_memory_equal(e->values, v, sizeof v);
    pipe_entry_free(e);
    pipe_inbox_free(ib);
    /* the first and the last stage exchange the tied gradient */
    ib = inbox_for(0, 16, 1u << 20);
    tied.stage = 2;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &tied), CM_OK);
    tied.stage = 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[1], &tied), CM_EAUTH);
    pipe_inbox_free(ib);
}

static void test_steps_and_limits(void **state)
{
    (void)state;
    float v[8] = {0};
    struct pipe_inbox *ib = inbox_for(1, 3, 200);
    struct pipe_msg g = {.type = PIPE_MSG_GRAD, .step = 7, .stage = 2, .B = 1, .T = 2, .C = 4, .total = 8,
                         .count = 8, .values = (const uint8_t *)v};
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_EBUSY); /* two steps ahead */
    g.step = 4;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);    /* behind: ignored */
    struct pipe_entry *e = NULL;
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 4, 0, 2, 20, NULL, &e), CM_ETIMEOUT);
    g.step = 6;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);    /* the next step */
    g.mb = 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);
    g.mb = 2;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);    /* 3 entries of 33 bytes */
    g.mb = 3;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_EBUSY); /* entries full */
    pipe_inbox_set_step(ib, 7);                                     /* step 6's are dropped */
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 6, 0, 2, 20, NULL, &e), CM_ETIMEOUT);
    g.step = 7;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);
    struct pipe_msg big = g;
    big.mb = 4;
    big.C = 40;
    big.total = 80;
    big.count = 8;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &big), CM_EBUSY); /* bytes full (80 x 4 > 200) */
    /* between two assignments: everything held is dropped, senders are told to try again */
    pipe_inbox_set_peers(ib, NULL, 0, 0, 0);
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_EBUSY);
    pipe_inbox_set_peers(ib, (const uint8_t(*)[CM_ED25519_PUB_LEN])g_keys, S, 0, 1);
    g.mb = 5;
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 7, 3, 2, 20, NULL, &e), CM_ETIMEOUT); /* dropped */
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 7, 5, 2, 20, NULL, &e), CM_OK);
    pipe_entry_free(e);
    /* an interrupted wait */
    static volatile sig_atomic_t stop = 1;
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 7, 9, 2, 5000, &stop, &e), CM_ECANCELED);
    pipe_inbox_free(ib);
}

/* wait_any (the 1F1B loop's wait): the first complete one of the wants,
 * left in the inbox; incomplete tensors do not count; a deadline. */
static void test_wait_any(void **state)
{
    (void)state;
    const uint32_t B = 1, T = 2, C = 3;
    float v[6] = {1, 2, 3, 4, 5, 6};
    int32_t tg[2] = {0, 1};
    struct pipe_inbox *ib = inbox_for(1, 8, 1u << 20);
    struct pipe_want w[2] = {{PIPE_MSG_GRAD, 5, 0, 2}, {PIPE_MSG_ACT, 5, 1, 0}};
    size_t which = 9;
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 0, NULL, &which), CM_ETIMEOUT);
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 30, NULL, &which), CM_ETIMEOUT);
    /* an ACT of another micro-batch: not wanted */
    struct pipe_msg m = act_chunk(0, 5, B, T, C, 0, v, tg);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 0, NULL, &which), CM_ETIMEOUT);
    m.mb = 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 0, NULL, &which), CM_OK);
    assert_int_equal(which, 1);
    /* a gradient from the next stage too: the first want wins */
    struct pipe_msg g = {.type = PIPE_MSG_GRAD, .step = 5, .stage = 2, .B = B, .T = T, .C = C, .total = 6,
                         .count = 6, .values = (const uint8_t *)v};
    assert_int_equal(pipe_inbox_put(ib, g_keys[2], &g), CM_OK);
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 0, NULL, &which), CM_OK);
    assert_int_equal(which, 0);
    /* still held: taken now */
    struct pipe_entry *e = NULL;
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_GRAD, 5, 0, 2, 0, NULL, &e), CM_OK);
    assert_memory_equal(e->values, v, sizeof v);
    pipe_entry_free(e);
    assert_int_equal(pipe_inbox_wait_any(ib, w, 2, 0, NULL, &which), CM_OK);
    assert_int_equal(which, 1);
    volatile sig_atomic_t stop = 1;
    assert_int_equal(pipe_inbox_wait_any(ib, w, 1, 1000, &stop, &which), CM_ECANCELED);
    /* a norm's flags come with it */
    struct pipe_msg nm = {.type = PIPE_MSG_NORM, .step = 5, .stage = 0, .flags = PIPE_FLAG_MOVE, .sumsq = 2.5};
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &nm), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_NORM, 5, 0, 0, 0, NULL, &e), CM_OK);
    assert_int_equal(e->flags, PIPE_FLAG_MOVE);
    assert_true(e->sumsq == 2.5);
    pipe_entry_free(e);
    /* a chunk of a tensor already taken, sent again (its answer was lost):
       a repeat, not a new tensor that would hold room until the step ends */
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_ACT, 5, 1, 0, 0, NULL, &e), CM_OK);
    pipe_entry_free(e);
    m.mb = 1;
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &m), CM_OK);
    assert_int_equal(pipe_inbox_wait_any(ib, &w[1], 1, 0, NULL, &which), CM_ETIMEOUT);
    assert_int_equal(pipe_inbox_put(ib, g_keys[0], &nm), CM_OK);
    assert_int_equal(pipe_inbox_take(ib, PIPE_MSG_NORM, 5, 0, 0, 0, NULL, &e), CM_ETIMEOUT);
    pipe_inbox_free(ib);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_any_order),
        cmocka_unit_test(test_who_may_send),
        cmocka_unit_test(test_steps_and_limits),
        cmocka_unit_test(test_wait_any),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
