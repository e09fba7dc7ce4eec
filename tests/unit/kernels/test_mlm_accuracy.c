/* The masked-token accuracy of training batches (issue 20: the contribution
 * report's mlm_accuracy, docs/training.md "What the dashboard shows"): the
 * CPU backend's argmax_hits against a case counted by hand, and an ALBERT
 * training step (kern_model_fwd_bwd) that counts the same hits as the
 * evaluation of the same batch, which scores on the host from the
 * downloaded probabilities. GPT's training step counts none (its reports
 * carry no accuracy). The CUDA op is compared with this one in
 * test_backends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_model.h"
#include "kern_optim.h"

/* Five rows of four classes:
 *   row 0: argmax 2, target 2          -> hit
 *   row 1: argmax 0, target 3          -> miss
 *   row 2: 0.4 at columns 1 and 3, target 3: the first largest is 1 -> miss
 *   row 3: the same, target 1          -> hit
 *   row 4: argmax 1, target -1 (not masked) -> not counted
 * Two hits. */
static void test_hand_case(void **state)
{
    (void)state;
    const struct kern_backend *be = kern_backend_cpu();
    const float p[5 * 4] = {
        0.1f, 0.2f, 0.6f, 0.1f,
        0.7f, 0.1f, 0.1f, 0.1f,
        0.1f, 0.4f, 0.1f, 0.4f,
        0.1f, 0.4f, 0.1f, 0.4f,
        0.1f, 0.9f, 0.0f, 0.0f,
    };
    const int tg[5] = {2, 3, 3, 1, -1};
    assert_int_equal(be->argmax_hits(p, tg, 5, 4), 2);
    /* every row unmasked: nothing to count */
    const int none[5] = {-1, -1, -1, -1, -1};
    assert_int_equal(be->argmax_hits(p, none, 5, 4), 0);
    /* every row its argmax */
    const int all[5] = {2, 0, 1, 1, 1};
    assert_int_equal(be->argmax_hits(p, all, 5, 4), 5);
}

/* Many threads over many rows give the same count as one. */
static void test_threads(void **state)
{
    (void)state;
    const struct kern_backend *be = kern_backend_cpu();
    enum { N = 4096, V = 64 };
    float *p = malloc(sizeof(float) * N * V);
    int *tg = malloc(sizeof(int) * N);
    uint64_t rng = 3;
    long want = 0;
    for (int i = 0; i < N; i++) {
        for (int v = 0; v < V; v++)
            p[(size_t)i * V + v] = kern_rng_uniform(&rng);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (p[(size_t)i * V + v] > p[(size_t)i * V + best])
                best = v;
        tg[i] = i % 7 == 0 ? -1 : i % 3 ? best : (best + 1) % V;
        want += tg[i] == best;
    }
    kern_cpu_set_threads(1);
    long one = be->argmax_hits(p, tg, N, V);
    kern_cpu_set_threads(4);
    long four = be->argmax_hits(p, tg, N, V);
    kern_cpu_set_threads(0);
    assert_int_equal(one, want);
    assert_int_equal(four, want);
    free(p);
    free(tg);
}

/* A published-style ALBERT (post-LN, sentence order) trained for a few
 * steps so its predictions are not all one token: at each step the training
 * pass's hits equal the evaluation's, on the same batch and parameters. */
static void test_albert_train_counts(void **state)
{
    (void)state;
    const struct kern_backend *be = kern_backend_cpu();
    struct kern_tfm_config c = {.kind = KERN_MODEL_ALBERT, .vocab = 13, .max_T = 8, .n_layer = 2,
                                .n_head = 2, .d_model = 16, .d_embed = 8, .d_ff = 32,
                                .share_layers = 1, .post_ln = 1, .sop = 1};
    struct kern_model *m = NULL;
    struct kern_optim *opt = NULL;
    assert_int_equal(kern_tfm_new(be, &c, 4, 11, &m), CM_OK);
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.kind = KERN_OPT_ADAMW;
    oc.lr = 0.01f;
    assert_int_equal(kern_optim_new(be, &oc, m->nparams, &opt), CM_OK);
    int tok[32], tgt[32], seg[32], sop[4] = {0, 1, 1, 0};
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 5 + i / 8) % 12;
        /* a learnable rule: the target is the token's successor */
        tgt[i] = i % 3 == 1 ? (tok[i] + 1) % 12 : -1;
        seg[i] = (i % 8) >= 4;
    }
    struct kern_batch b = {.B = 4, .T = 8, .tokens = tok, .targets = tgt, .segments = seg,
                           .sop = sop};
    long first = -1, last = -1;
    for (int step = 0; step < 60; step++) {
        struct kern_eval tr = {0}, ev = {0};
        assert_int_equal(kern_model_eval(m, &b, &ev), CM_OK);
        kern_model_zero_grad(m);
        assert_int_equal(kern_model_fwd_bwd(m, &b, 1.0f, &tr), CM_OK);
        assert_int_equal(tr.count, ev.count);
        assert_int_equal(tr.correct, ev.correct);
        assert_int_equal(tr.sop_count, 4);
        if (step == 0)
            first = tr.correct;
        last = tr.correct;
        float gn = 0, lr = 0;
        assert_int_equal(kern_optim_step(opt, m, &gn, &lr), CM_OK);
    }
    printf("albert: %ld of 11 masked tokens right at the first step, %ld at the 60th\n", first, last);
    assert_true(last > first);
    kern_optim_free(opt);
    kern_model_free(m);
}

/* GPT's training pass counts no hits (its report carries no accuracy). */
static void test_gpt_counts_none(void **state)
{
    (void)state;
    struct kern_tfm_config c = {.kind = KERN_MODEL_GPT, .vocab = 13, .max_T = 8, .n_layer = 1,
                                .n_head = 2, .d_model = 8, .d_embed = 8, .d_ff = 16};
    struct kern_model *m = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &c, 2, 5, &m), CM_OK);
    int tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = i % 13;
        tgt[i] = (i + 1) % 13;
    }
    struct kern_batch b = {.B = 2, .T = 8, .tokens = tok, .targets = tgt};
    struct kern_eval tr = {0};
    assert_int_equal(kern_model_fwd_bwd(m, &b, 1.0f, &tr), CM_OK);
    assert_int_equal(tr.count, 16);
    assert_int_equal(tr.correct, 0);
    kern_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_case),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_albert_train_counts),
        cmocka_unit_test(test_gpt_counts_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
