/* `train --local`'s building blocks (agent/train/trainer.h) on the DMoE
 * model of examples/fmnist-dmoe.json, shortened: 200 steps on
 * Fashion-MNIST, with every expert answering and with each expert call
 * failing with probability 0.1 (seed 002_2b00836ea4b30f79.txt §4.2). The
 * training loss must fall and the test accuracy on 2,048 test images pass a
 * lower bar (the full run's figures are in docs/training.md); no parameter
 * may become non-finite. Also: the dmoe config's bad values are refused
 * with the field's name. Run from the repository root; skipped (exit 77)
 * without the dataset-fashion-mnist package. */
/* ct-timeout: 180 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "cm_err.h"
#include "kern_dmoe.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Under AddressSanitizer (~3x slower) the run where every expert answers
 * takes a few steps (memory safety; no call may fail): that the model
 * learns is checked by the normal build and, with failing calls, by the
 * other run, whose 200 steps the failure rate's check needs (~2,500 calls:
 * its +-0.03 is 5 standard deviations). The two runs of 200 steps took
 * 15 s of the sanitizer suite. */
#if defined(__SANITIZE_ADDRESS__)
#define ALL_ANSWER_STEPS 30
#else
#define ALL_ANSWER_STEPS 0 /* the config's 200 */
#endif

/* The example's model and optimizers; %g = fail_prob, %s = extra fields. */
#define DMOE_CFG                                                                              \
    "{\"model\": {\"type\": \"dmoe\", \"inputs\": 784, \"hidden\": [256, 128], "              \
    "\"classes\": 10, \"grid_dims\": 2, \"grid_size\": 4, \"k\": 4, "                         \
    "\"experts\": {\"hidden\": 256, \"optimizer\": {\"lr\": 0.001}, \"fail_prob\": %g}}, "    \
    "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001, \"clip_norm\": 5.0}, "               \
    "\"schedule\": {\"type\": \"linear\", \"warmup_steps\": 20, \"min_lr_ratio\": 0.3}, "     \
    "\"batch_size\": 128, \"steps\": 200, \"seed\": 1, \"device\": \"cpu\", "                 \
    "\"data\": {\"train\": \"fmnist-train.manifest.json\", "                                  \
    "\"eval\": \"fmnist-test.manifest.json\", \"shuffle_buffer\": 10000}, "                   \
    "\"eval\": {\"batches\": 16}%s}"

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* steps: 0 for the config's, else that many with no check of learning */
static void train_short(float fail_prob, double min_acc, long steps)
{
    char text[2048], err[512] = "";
    snprintf(text, sizeof text, DMOE_CFG, (double)fail_prob, "");
    struct agent_train_config cfg;
    if (agent_train_config_parse(text, strlen(text), "examples", &cfg, err, sizeof err)) {
        print_error("config: %s\n", err);
        fail();
    }
    struct agent_trainer t;
    if (agent_trainer_init(&t, &cfg, text, strlen(text), err, sizeof err)) {
        print_error("init: %s\n", err);
        fail();
    }
    assert_int_equal(t.model->kind, KERN_MODEL_DMOE);
    if (steps > 0)
        cfg.steps = steps;
    double first = 0, last = 0;
    for (long s = 0; s < cfg.steps; s++) {
        struct kern_eval ev;
        float gn, lr;
        assert_int_equal(agent_trainer_compute_grads(&t, &ev), CM_OK);
        assert_int_equal(agent_trainer_apply(&t, &gn, &lr), CM_OK);
        double l = ev.loss_sum / ev.count;
        assert_true(isfinite(l));
        if (s < 20)
            first += l / 20;
        if (s >= cfg.steps - 20)
            last += l / 20;
    }
    struct kern_eval ev;
    assert_int_equal(agent_trainer_evaluate(&t, cfg.eval_batches, &ev, err, sizeof err), CM_OK);
    double acc = (double)ev.correct / ev.count;
    struct kern_dmoe_stats st;
    assert_int_equal(kern_dmoe_get_stats(t.model, &st), CM_OK);
    print_message("fail_prob %.2f: training loss %.4f -> %.4f, test accuracy %.2f%% "
                  "(%ld images); expert calls %ld fwd (%ld failed), %ld bwd (%ld failed)\n",
                  (double)fail_prob, first, last, 100 * acc, ev.count, st.calls_fwd,
                  st.failed_fwd, st.calls_bwd, st.failed_bwd);
    assert_int_equal(ev.count, 16 * 128);
    if (steps == 0) {
        assert_true(last < 0.5 * first);
        assert_true(acc >= min_acc);
    }
    if (fail_prob > 0) {
        double rate = (double)st.failed_fwd / st.calls_fwd;
        assert_true(rate > fail_prob - 0.03 && rate < fail_prob + 0.03);
    } else {
        assert_int_equal(st.failed_fwd + st.failed_bwd, 0);
    }
    float *p = malloc(sizeof(float) * t.model->nparams);
    assert_non_null(p);
    assert_int_equal(kern_model_get_params(t.model, p), CM_OK);
    assert_true(all_finite(p, t.model->nparams));
    free(p);
    agent_trainer_cleanup(&t);
}

static void test_train_all_answer(void **state)
{
    (void)state;
    train_short(0.0f, 0.82, ALL_ANSWER_STEPS);
}

static void test_train_failures(void **state)
{
    (void)state;
    train_short(0.1f, 0.82, 0);
}

static void test_bad_dmoe_configs(void **state)
{
    (void)state;
    static const struct { const char *from, *to, *want; } cases[] = {
        {"\"k\": 4", "\"k\": 0", "model.k"},
        {"\"k\": 4", "\"k\": 17", "k"}, /* accepted by the parser: more than the grid holds */
        {"\"grid_size\": 4", "\"grid_size\": 1", "model.grid_size"},
        {"\"hidden\": [256, 128]", "\"hidden\": []", "model.hidden"},
        {"\"hidden\": 256, ", "", "model.experts.hidden"},
        {"\"fail_prob\": 0", "\"fail_prob\": 1", "model.experts.fail_prob"},
        {"\"optimizer\": {\"lr\": 0.001}", "\"optimizer\": {\"lr\": -1}",
         "model.experts.optimizer.lr"},
        {"\"optimizer\": {\"lr\": 0.001}", "\"optimizer\": {\"lx\": 1}",
         "model.experts.optimizer.lx"},
        {"\"grid_dims\": 2, \"grid_size\": 4", "\"grid_dims\": 3, \"grid_size\": 17",
         "model.experts"},
        {"\"k\": 4,", "\"k\": 4, \"depth\": 2,", "model.depth"},
    };
    char base[2048], text[2200], err[512];
    snprintf(base, sizeof base, DMOE_CFG, 0.0, "");
    struct agent_train_config cfg;
    assert_int_equal(agent_train_config_parse(base, strlen(base), "examples", &cfg, err,
                                              sizeof err),
                     CM_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(base, cases[i].from);
        assert_non_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - base), base, cases[i].to,
                 at + strlen(cases[i].from));
        err[0] = 0;
        int rc = agent_train_config_parse(text, strlen(text), "examples", &cfg, err, sizeof err);
        if (i == 1) {
            /* k above the number of experts: empty slots, not an error */
            assert_int_equal(rc, CM_OK);
            continue;
        }
        if (rc != CM_EINVAL || !strstr(err, cases[i].want)) {
            print_error("case %zu: rc %d, message \"%s\", wanted one naming %s\n", i, rc, err,
                        cases[i].want);
            fail();
        }
    }
    /* checkpoints would lose the local experts' state: refused */
    snprintf(text, sizeof text, DMOE_CFG, 0.0, ", \"checkpoint\": {\"dir\": \"/tmp/x\"}");
    assert_int_equal(agent_train_config_parse(text, strlen(text), "examples", &cfg, err,
                                              sizeof err),
                     CM_EINVAL);
    assert_non_null(strstr(err, "checkpoint"));
}

int main(void)
{
    const struct CMUnitTest cfg_tests[] = {cmocka_unit_test(test_bad_dmoe_configs)};
    int rc = cmocka_run_group_tests(cfg_tests, NULL, NULL);
    if (access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skipped: %s missing (install dataset-fashion-mnist)\n", FMNIST_DIR);
        return rc ? rc : 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_all_answer),
        cmocka_unit_test(test_train_failures),
    };
    return rc | cmocka_run_group_tests(tests, NULL, NULL);
}
