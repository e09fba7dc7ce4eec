/* Optimizer pieces: the learning-rate schedule (warm-up, linear and cosine
 * decay on the global step), global-norm clipping, refusal of non-finite
 * gradients without touching the parameters, and config validation; plus
 * the parameter counts of the reference sizes (GPT-2 small, ALBERT-large)
 * without allocating them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_model.h"
#include "kern_optim.h"

static void test_schedule(void **state)
{
    (void)state;
    struct kern_optim_config c;
    kern_optim_config_default(&c);
    c.lr = 1.0f;
    c.warmup_steps = 10;
    c.total_steps = 110;
    c.sched = KERN_SCHED_CONSTANT;
    assert_float_equal(kern_sched_lr(&c, 0), 0.1f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 9), 1.0f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 500), 1.0f, 1e-6);
    c.sched = KERN_SCHED_LINEAR;
    c.min_lr_ratio = 0.0f;
    assert_float_equal(kern_sched_lr(&c, 10), 1.0f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 60), 0.5f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 110), 0.0f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 1000), 0.0f, 1e-6);
    c.sched = KERN_SCHED_COSINE;
    c.min_lr_ratio = 0.1f;
    assert_float_equal(kern_sched_lr(&c, 10), 1.0f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 60), 0.1f + 0.9f * 0.5f, 1e-6);
    assert_float_equal(kern_sched_lr(&c, 110), 0.1f, 1e-6);
    const char *why;
    assert_int_equal(kern_optim_config_check(&c, &why), CM_OK);
    c.total_steps = 10; /* decay needs room after warm-up */
    assert_int_equal(kern_optim_config_check(&c, &why), CM_EINVAL);
    c.total_steps = 110;
    c.lr = -1.0f;
    assert_int_equal(kern_optim_config_check(&c, &why), CM_EINVAL);
    c.lr = 1.0f;
    c.beta2 = 1.0f;
    assert_int_equal(kern_optim_config_check(&c, &why), CM_EINVAL);
}

static struct kern_model *small_mlp(void)
{
    struct kern_mlp_config c = {.in_dim = 4, .nhidden = 1, .hidden = {3}, .nclass = 2};
    struct kern_model *m = NULL;
    assert_int_equal(kern_mlp_new(kern_backend_cpu(), &c, 2, 1, &m), CM_OK);
    return m;
}

static void test_clip_and_nonfinite(void **state)
{
    (void)state;
    struct kern_model *m = small_mlp();
    size_t n = m->nparams;
    struct kern_optim_config c;
    kern_optim_config_default(&c);
    c.clip_norm = 1.0f;
    struct kern_optim *o = NULL;
    assert_int_equal(kern_optim_new(m->be, &c, n, &o), CM_OK);
    /* gradient of norm 10 is scaled to norm 1 before the update */
    for (size_t i = 0; i < n; i++)
        m->grads[i] = 0.0f;
    m->grads[0] = 6.0f;
    m->grads[1] = 8.0f;
    float gn = 0, lr = 0;
    assert_int_equal(kern_optim_step(o, m, &gn, &lr), CM_OK);
    assert_float_equal(gn, 10.0f, 1e-5);
    assert_float_equal(m->grads[0], 0.6f, 1e-6);
    assert_float_equal(m->grads[1], 0.8f, 1e-6);
    assert_int_equal(o->step, 1);
    /* a NaN anywhere: refused, parameters and step unchanged */
    float *before = malloc(n * sizeof(float));
    assert_non_null(before);
    memcpy(before, m->params, n * sizeof(float));
    m->grads[n - 1] = NAN;
    assert_int_equal(kern_optim_step(o, m, NULL, NULL), CM_ENUMERIC);
    assert_memory_equal(before, m->params, n * sizeof(float));
    assert_int_equal(o->step, 1);
    m->grads[n - 1] = INFINITY;
    assert_int_equal(kern_optim_step(o, m, NULL, NULL), CM_ENUMERIC);
    assert_memory_equal(before, m->params, n * sizeof(float));
    /* an optimizer sized for another model is refused */
    struct kern_optim *o2 = NULL;
    assert_int_equal(kern_optim_new(m->be, &c, n + 1, &o2), CM_OK);
    assert_int_equal(kern_optim_step(o2, m, NULL, NULL), CM_EINVAL);
    kern_optim_free(o2);
    free(before);
    kern_optim_free(o);
    kern_model_free(m);
}

/* Weight decay only on tensors marked decay (weights, not biases). */
static void test_decay_mask(void **state)
{
    (void)state;
    struct kern_model *m = small_mlp();
    struct kern_optim_config c;
    kern_optim_config_default(&c);
    c.lr = 0.1f;
    c.weight_decay = 0.5f;
    struct kern_optim *o = NULL;
    assert_int_equal(kern_optim_new(m->be, &c, m->nparams, &o), CM_OK);
    for (size_t i = 0; i < m->nparams; i++) {
        m->params[i] = 1.0f;
        m->grads[i] = 0.0f;
    }
    assert_int_equal(kern_optim_step(o, m, NULL, NULL), CM_OK);
    const struct kern_tensor *w = kern_model_tensor(m, "layers.0.weight");
    const struct kern_tensor *b = kern_model_tensor(m, "layers.0.bias");
    assert_non_null(w);
    assert_non_null(b);
    assert_float_equal(m->params[w->off], 1.0f - 0.1f * 0.5f, 1e-6);
    assert_float_equal(m->params[b->off], 1.0f, 1e-6);
    assert_null(kern_model_tensor(m, "nope"));
    kern_optim_free(o);
    kern_model_free(m);
}

static void test_reference_sizes(void **state)
{
    (void)state;
    const char *why;
    /* GPT-2 small: 124,439,808 parameters with tied embeddings */
    struct kern_tfm_config g = {.kind = KERN_MODEL_GPT, .vocab = 50257, .max_T = 1024,
                                .n_layer = 12, .n_head = 12, .d_model = 768, .d_embed = 768,
                                .d_ff = 3072};
    assert_int_equal(kern_tfm_config_check(&g, &why), CM_OK);
    assert_int_equal(kern_tfm_param_count(&g), 124439808);
    /* ALBERT-large (H 1024, E 128, L 24, shared): Lan et al. Table 1 says
     * 18M, which counts the 1024x1024 pooler and segment embeddings of the
     * sentence-order head we do not build; without them 16,797,360. */
    struct kern_tfm_config a = {.kind = KERN_MODEL_ALBERT, .vocab = 30000, .max_T = 512,
                                .n_layer = 24, .n_head = 16, .d_model = 1024, .d_embed = 128,
                                .d_ff = 4096, .share_layers = 1};
    assert_int_equal(kern_tfm_config_check(&a, &why), CM_OK);
    size_t n = kern_tfm_param_count(&a);
    assert_int_equal(n, 16797360);
    /* without sharing: 23 more blocks of 4C^2 + 2CF + 9C + F = 12,596,224 */
    a.share_layers = 0;
    assert_int_equal(kern_tfm_param_count(&a) - n, (size_t)23 * 12596224);
    /* impossible sizes */
    g.n_head = 7;
    assert_int_equal(kern_tfm_config_check(&g, &why), CM_EINVAL);
    g.n_head = 12;
    g.d_embed = 128; /* GPT ties wte to the output: E must be C */
    assert_int_equal(kern_tfm_config_check(&g, &why), CM_EINVAL);
    g.d_embed = 768;
    g.vocab = 1;
    assert_int_equal(kern_tfm_config_check(&g, &why), CM_EINVAL);
    struct kern_model *m = NULL;
    assert_int_equal(kern_tfm_new(kern_backend_cpu(), &g, 1, 1, &m), CM_EINVAL);
    assert_null(m);
    struct kern_mlp_config bad = {.in_dim = 4, .nhidden = 9, .nclass = 2};
    assert_int_equal(kern_mlp_config_check(&bad, &why), CM_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_clip_and_nonfinite),
        cmocka_unit_test(test_decay_mask),
        cmocka_unit_test(test_reference_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
