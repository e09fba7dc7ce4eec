/* The layout of an expert checkpoint and its check (common/moe/moe_ckpt.h):
 * sizes against kernels/kern_expert.c's block and cm_ckpt_encoded_size, and
 * every way a checkpoint can miss the layout refused with a reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "kern_backend.h"
#include "kern_expert.h"
#include "moe/moe_ckpt.h"

#define C 4
#define F 6

struct fx {
    float *buf;
    uint64_t n;
    char cfg[MOE_CKPT_CONFIG_MAX + 1];
    struct cm_ckpt_buf opt[2];
    struct cm_ckpt c;
};

static void fx_init(struct fx *x, const char *uid)
{
    x->n = moe_ckpt_nparams(C, F);
    x->buf = calloc(3 * x->n, sizeof(float));
    assert_non_null(x->buf);
    for (uint64_t i = 0; i < 3 * x->n; i++)
        x->buf[i] = 0.01f * (float)(i % 13);
    assert_int_equal(moe_ckpt_config(uid, C, F, x->cfg, sizeof x->cfg), CM_OK);
    x->opt[0] = (struct cm_ckpt_buf){MOE_CKPT_OPT_M, x->buf + x->n, x->n};
    x->opt[1] = (struct cm_ckpt_buf){MOE_CKPT_OPT_V, x->buf + 2 * x->n, x->n};
    x->c = (struct cm_ckpt){.step = 9, .params = x->buf, .n_params = x->n, .opt = x->opt, .n_opt = 2,
                            .config = x->cfg, .config_len = (uint32_t)strlen(x->cfg)};
}

static void test_sizes(void **state)
{
    (void)state;
    struct kern_expert *e;
    assert_int_equal(kern_expert_new(kern_backend_cpu(), C, F, 2, 1, &e), CM_OK);
    assert_int_equal(kern_expert_model(e)->nparams, moe_ckpt_nparams(C, F));
    kern_expert_free(e);
    assert_int_equal(moe_ckpt_nparams(0, F), 0);
    assert_int_equal(moe_ckpt_nparams(C, 65537), 0);
    assert_int_equal(moe_ckpt_max_bytes(0, 1), 0);
    /* the bound holds the largest config */
    struct fx x;
    fx_init(&x, "ffn.1.2");
    char big[MOE_CKPT_CONFIG_MAX + 1];
    memset(big, 'a', MOE_CKPT_CONFIG_MAX);
    big[MOE_CKPT_CONFIG_MAX] = 0;
    x.c.config = big;
    x.c.config_len = MOE_CKPT_CONFIG_MAX;
    assert_int_equal(cm_ckpt_encoded_size(&x.c), moe_ckpt_max_bytes(C, F));
    free(x.buf);
    char small[16];
    assert_int_equal(moe_ckpt_config("ffn.1.2", C, F, small, sizeof small), CM_ETOOBIG);
}

static void test_check(void **state)
{
    (void)state;
    struct fx x;
    char why[256];
    fx_init(&x, "ffn.1.2");
    assert_int_equal(moe_ckpt_check(&x.c, "ffn.1.2", C, F, why, sizeof why), CM_OK);
    free(x.buf);
    /* one thing wrong at a time, each refused with a reason */
    struct {
        const char *what, *in_why;
    } cases[] = {
        {"other uid", "config"}, {"other shape", "parameters"}, {"one buffer", "optimizer state"},
        {"renamed buffer", "optimizer state"}, {"short buffer", "optimizer state"}, {"rng", "RNG"},
        {"nan param", "non-finite"}, {"inf moment", "non-finite"}, {"negative v", "negative"},
        {"config extra field", "config"}, {"config not json", "config"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fx_init(&x, "ffn.1.2");
        const char *uid = "ffn.1.2";
        int c = C;
        uint8_t rng[4] = {0};
        switch (i) {
        case 0: uid = "ffn.1.3"; break;
        case 1: c = C + 1; break;
        case 2: x.c.n_opt = 1; break;
        case 3: snprintf(x.opt[1].name, sizeof x.opt[1].name, "adam.w"); break;
        case 4: x.opt[0].count--; break;
        case 5: x.c.rng = rng; x.c.rng_len = 4; break;
        case 6: x.buf[3] = NAN; break;
        case 7: x.buf[x.n + 1] = INFINITY; break;
        case 8: x.buf[2 * x.n + 5] = -1e-3f; break;
        case 9: snprintf(x.cfg, sizeof x.cfg, "{\"uid\":\"ffn.1.2\",\"C\":%d,\"F\":%d,\"x\":1}", C, F);
                x.c.config_len = (uint32_t)strlen(x.cfg); break;
        case 10: snprintf(x.cfg, sizeof x.cfg, "uid ffn.1.2"); x.c.config_len = (uint32_t)strlen(x.cfg); break;
        }
        why[0] = 0;
        int rc = moe_ckpt_check(&x.c, uid, c, F, why, sizeof why);
        printf("  %s: %s\n", cases[i].what, why);
        assert_int_equal(rc, CM_EINVAL);
        assert_non_null(strstr(why, cases[i].in_why));
        free(x.buf);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sizes), cmocka_unit_test(test_check)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
