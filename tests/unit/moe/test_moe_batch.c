/* The expert server's batching queue (common/moe/moe_batch.h, seed 002
 * §3.3): FIFO order per uid, requests never split, size limits, partial
 * batches released by max_wait, deadlines, fairness across many uids
 * (oldest batch first), the memory bound, and due times for the worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cm_err.h"
#include "moe/moe_batch.h"

static int push(struct moe_batch_queue *q, int kind, const char *uid, uint32_t n, int64_t t,
                int64_t deadline, intptr_t tag)
{
    struct moe_batch_req r = {.kind = kind, .n = n, .arrival_ms = t, .deadline_ms = deadline,
                              .tag = (void *)tag};
    snprintf(r.uid, sizeof r.uid, "%s", uid);
    return moe_batch_push(q, &r);
}

static void init(struct moe_batch_queue *q, uint32_t max_batch, uint32_t wait, uint32_t pending)
{
    struct moe_batch_config c = {.max_batch = max_batch, .max_wait_ms = wait,
                                 .max_pending = pending};
    assert_int_equal(moe_batch_init(q, &c), CM_OK);
}

static void test_config_and_limits(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    struct moe_batch_config c = {.max_batch = 0, .max_pending = 4};
    assert_int_equal(moe_batch_init(&q, &c), CM_EINVAL);
    c = (struct moe_batch_config){.max_batch = 4, .max_pending = 0};
    assert_int_equal(moe_batch_init(&q, &c), CM_EINVAL);
    init(&q, 8, 10, 3);
    assert_int_equal(push(&q, 1, "e", 9, 0, 100, 1), CM_ETOOBIG); /* can never run */
    assert_int_equal(push(&q, 1, "e", 0, 0, 100, 1), CM_EINVAL);
    assert_int_equal(push(&q, 1, "bad uid", 1, 0, 100, 1), CM_EINVAL);
    assert_int_equal(push(&q, 1, "", 1, 0, 100, 1), CM_EINVAL);
    assert_int_equal(moe_batch_pending(&q), 0);
    assert_int_equal(push(&q, 1, "e", 8, 0, 100, 1), CM_OK); /* exactly max_batch */
    assert_int_equal(push(&q, 1, "f", 1, 0, 100, 2), CM_OK);
    assert_int_equal(push(&q, 1, "g", 1, 0, 100, 3), CM_OK);
    assert_int_equal(push(&q, 1, "h", 1, 0, 100, 4), CM_EBUSY); /* max_pending */
    assert_int_equal(moe_batch_pending(&q), 3);
    moe_batch_cleanup(&q);
}

static void test_fifo_never_split(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 10, 1000, 100);
    /* 4 + 4 + 4: the third does not fit in a batch of 10 and is not split. */
    assert_int_equal(push(&q, 1, "e", 4, 0, 10000, 1), 0);
    assert_int_equal(push(&q, 1, "e", 4, 1, 10000, 2), 0);
    struct moe_batch b;
    assert_int_equal(moe_batch_next(&q, 2, &b), 0); /* 8 < 10 and young: wait */
    assert_int_equal(push(&q, 1, "e", 4, 2, 10000, 3), 0);
    assert_int_equal(moe_batch_next(&q, 3, &b), 1); /* full: the next would not fit */
    assert_int_equal(b.n_reqs, 2);
    assert_int_equal(b.samples, 8);
    assert_ptr_equal(b.reqs[0].tag, (void *)1);
    assert_ptr_equal(b.reqs[1].tag, (void *)2);
    assert_string_equal(b.uid, "e");
    moe_batch_release(&b);
    assert_int_equal(moe_batch_next(&q, 4, &b), 0); /* 4 alone waits */
    /* Partial batch once the oldest waited max_wait. */
    assert_int_equal(moe_batch_next(&q, 2 + 999, &b), 0);
    assert_int_equal(moe_batch_next(&q, 2 + 1000, &b), 1);
    assert_int_equal(b.n_reqs, 1);
    assert_ptr_equal(b.reqs[0].tag, (void *)3);
    moe_batch_release(&b);
    assert_int_equal(moe_batch_pending(&q), 0);
    assert_int_equal(moe_batch_due_ms(&q, 5000), -1);
    /* Exactly max_batch in one request is ready at once. */
    assert_int_equal(push(&q, 1, "e", 10, 6000, 10000, 4), 0);
    assert_int_equal(moe_batch_due_ms(&q, 6000), 0);
    assert_int_equal(moe_batch_next(&q, 6000, &b), 1);
    assert_int_equal(b.samples, 10);
    moe_batch_release(&b);
    moe_batch_cleanup(&q);
}

static void test_kinds_separate(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 4, 0, 100);
    /* A forward (kind 64) and a backward (65) of one uid never share. */
    assert_int_equal(push(&q, 64, "e", 1, 0, 100, 1), 0);
    assert_int_equal(push(&q, 65, "e", 1, 1, 100, 2), 0);
    assert_int_equal(push(&q, 64, "e", 1, 2, 100, 3), 0);
    struct moe_batch b;
    assert_int_equal(moe_batch_next(&q, 3, &b), 1); /* wait 0: ready at once */
    assert_int_equal(b.kind, 64);
    assert_int_equal(b.n_reqs, 2);
    assert_ptr_equal(b.reqs[1].tag, (void *)3);
    moe_batch_release(&b);
    assert_int_equal(moe_batch_next(&q, 3, &b), 1);
    assert_int_equal(b.kind, 65);
    assert_int_equal(b.n_reqs, 1);
    moe_batch_release(&b);
    moe_batch_cleanup(&q);
}

static void test_deadlines(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 100, 50, 100);
    assert_int_equal(push(&q, 1, "a", 1, 0, 30, 1), 0);
    assert_int_equal(push(&q, 1, "a", 1, 1, 500, 2), 0);
    assert_int_equal(push(&q, 1, "b", 1, 2, 20, 3), 0);
    assert_int_equal(push(&q, 1, "a", 1, 3, 25, 4), 0);
    /* The earliest event is b's deadline at 20. */
    assert_int_equal(moe_batch_due_ms(&q, 10), 10);
    struct moe_batch_req out[2];
    assert_int_equal(moe_batch_expire(&q, 19, out, 2), 0);
    assert_int_equal(moe_batch_expire(&q, 30, out, 2), 2); /* cap 2 of 3 expired */
    assert_int_equal(moe_batch_expire(&q, 30, out + 1, 1), 1);
    assert_int_equal(moe_batch_pending(&q), 1);
    /* Only request 2 is left, and its batch is released at 1 + 50. */
    assert_int_equal(moe_batch_due_ms(&q, 30), 21);
    struct moe_batch b;
    assert_int_equal(moe_batch_next(&q, 51, &b), 1);
    assert_int_equal(b.n_reqs, 1);
    assert_ptr_equal(b.reqs[0].tag, (void *)2);
    moe_batch_release(&b);
    moe_batch_cleanup(&q);
}

static void test_expire_returns_each_once(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 100, 50, 100);
    for (int i = 0; i < 5; i++)
        assert_int_equal(push(&q, 1, i % 2 ? "a" : "b", 1, i, 10, i + 1), 0);
    struct moe_batch_req out[8];
    int seen[6] = {0};
    size_t n, total = 0;
    while ((n = moe_batch_expire(&q, 10, out, 2)) > 0) {
        for (size_t i = 0; i < n; i++)
            seen[(intptr_t)out[i].tag]++;
        total += n;
    }
    assert_int_equal(total, 5);
    for (int i = 1; i <= 5; i++)
        assert_int_equal(seen[i], 1);
    assert_int_equal(moe_batch_pending(&q), 0);
    assert_null(q.groups); /* empty groups are freed */
    moe_batch_cleanup(&q);
}

static void test_fairness_many_uids(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 4, 5, 10000);
    /* 64 uids, requests arriving round-robin; uid k's first at time k. */
    char uid[16];
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 64; k++) {
            snprintf(uid, sizeof uid, "ffn.%d", k);
            assert_int_equal(push(&q, 1, uid, 1, round * 64 + k, 100000, k), 0);
        }
    /* At t = 1000 every group has waited: batches come oldest first, one per
     * uid, each with its 3 requests in order. */
    struct moe_batch b;
    for (int k = 0; k < 64; k++) {
        assert_int_equal(moe_batch_next(&q, 1000, &b), 1);
        snprintf(uid, sizeof uid, "ffn.%d", k);
        assert_string_equal(b.uid, uid);
        assert_int_equal(b.n_reqs, 3);
        assert_true(b.reqs[0].arrival_ms < b.reqs[1].arrival_ms);
        assert_true(b.reqs[1].arrival_ms < b.reqs[2].arrival_ms);
        moe_batch_release(&b);
    }
    assert_int_equal(moe_batch_next(&q, 1000, &b), 0);
    /* A full group beats an older group that still waits... */
    assert_int_equal(push(&q, 1, "old", 1, 2000, 100000, 1), 0);
    assert_int_equal(push(&q, 1, "busy", 4, 2001, 100000, 2), 0);
    assert_int_equal(moe_batch_next(&q, 2002, &b), 1);
    assert_string_equal(b.uid, "busy");
    moe_batch_release(&b);
    /* ...and of two ready groups the older comes first. */
    assert_int_equal(push(&q, 1, "busy", 4, 2003, 100000, 3), 0);
    assert_int_equal(moe_batch_next(&q, 2010, &b), 1);
    assert_string_equal(b.uid, "old");
    moe_batch_release(&b);
    moe_batch_cleanup(&q);
}

static void test_cleanup_frees_held(void **state)
{
    (void)state;
    struct moe_batch_queue q;
    init(&q, 8, 10, 100);
    for (int i = 0; i < 20; i++)
        assert_int_equal(push(&q, i % 3, "e", 1 + i % 8, i, 1000, i), 0);
    moe_batch_cleanup(&q); /* the leak checker of the sanitizer build verifies */
    assert_int_equal(moe_batch_pending(&q), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_and_limits),
        cmocka_unit_test(test_fifo_never_split),
        cmocka_unit_test(test_kinds_separate),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_expire_returns_each_once),
        cmocka_unit_test(test_fairness_many_uids),
        cmocka_unit_test(test_cleanup_frees_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
