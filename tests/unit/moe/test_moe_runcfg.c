/* The DMoE part of a run's config for expert servers (agent/moe/moe_runcfg.h)
 * and model.experts.serve in the recipe parser (agent/train/train_config.c):
 * the example recipe with and without a "serve" object and a
 * "collaboration" object; every serve field's bounds; unknown fields and
 * non-dmoe models refused with a message naming the field; the expert seeds
 * (one per uid, the same as train --local's cells). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/moe/moe_runcfg.h"
#include "cm_err.h"

/* examples/fmnist-dmoe.json with model.experts.serve = serve (NULL: none)
   and extra top-level fields merged in (NULL: none). */
static char *recipe(const char *serve, const char *extra)
{
    json_t *r = json_load_file("examples/fmnist-dmoe.json", 0, NULL);
    assert_non_null(r);
    if (serve) {
        json_t *s = json_loads(serve, 0, NULL);
        assert_non_null(s);
        json_object_set_new(json_object_get(json_object_get(r, "model"), "experts"), "serve", s);
    }
    if (extra) {
        json_t *e = json_loads(extra, 0, NULL);
        assert_non_null(e);
        json_object_update(r, e);
        json_decref(e);
    }
    char *t = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    assert_non_null(t);
    return t;
}

static int parse(const char *text, struct moe_runcfg *c, char *err)
{
    err[0] = 0;
    return moe_runcfg_parse(text, strlen(text), c, err, 256);
}

static void test_defaults(void **state)
{
    (void)state;
    char *t = recipe(NULL, "{\"collaboration\": {\"checkpoint_every\": 10}}"), err[256];
    struct moe_runcfg c;
    assert_int_equal(parse(t, &c, err), CM_OK);
    assert_string_equal(c.grid.name, "ffn");
    assert_int_equal(c.grid.dims, 2);
    assert_int_equal(c.grid.size, 4);
    assert_int_equal(c.C, 128);
    assert_int_equal(c.F, 256);
    assert_int_equal(c.seed, 2); /* experts.seed defaults to seed + 1 */
    assert_int_equal(c.serve.max_batch, 256);
    assert_int_equal(c.serve.max_wait_ms, 5);
    assert_int_equal(c.serve.declare_ttl_s, 30);
    assert_int_equal(c.serve.replicas, 1);
    assert_int_equal(c.serve.checkpoint_every_s, 60);
    assert_true(c.optim.lr > 0.0009f && c.optim.lr < 0.0011f);
    free(t);
}

static void test_serve_fields(void **state)
{
    (void)state;
    char *t = recipe("{\"prefix\": \"moe_1\", \"max_batch\": 64, \"max_wait_ms\": 20, "
                     "\"declare_ttl_s\": 9, \"replicas\": 2, \"checkpoint_every_s\": 7}", NULL), err[256];
    struct moe_runcfg c;
    assert_int_equal(parse(t, &c, err), CM_OK);
    assert_string_equal(c.grid.name, "moe_1");
    assert_int_equal(c.serve.max_batch, 64);
    assert_int_equal(c.serve.max_wait_ms, 20);
    assert_int_equal(c.serve.declare_ttl_s, 9);
    assert_int_equal(c.serve.replicas, 2);
    assert_int_equal(c.serve.checkpoint_every_s, 7);
    free(t);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *serve, *extra, *in_err;
    } bad[] = {
        {"{\"port\": 1}", NULL, "model.experts.serve.port: unknown field"},
        {"{\"prefix\": \"Ffn\"}", NULL, "model.experts.serve.prefix"},
        {"{\"prefix\": \"\"}", NULL, "model.experts.serve.prefix"},
        {"{\"prefix\": \"a23456789012345678901234567890123\"}", NULL, "model.experts.serve.prefix"},
        {"{\"prefix\": 3}", NULL, "model.experts.serve.prefix: must be a string"},
        {"{\"max_batch\": 0}", NULL, "model.experts.serve.max_batch"},
        {"{\"max_batch\": 65537}", NULL, "model.experts.serve.max_batch"},
        {"{\"max_wait_ms\": 0}", NULL, "model.experts.serve.max_wait_ms"},
        {"{\"declare_ttl_s\": 2}", NULL, "model.experts.serve.declare_ttl_s"},
        {"{\"replicas\": 0}", NULL, "model.experts.serve.replicas"},
        {"{\"checkpoint_every_s\": 0}", NULL, "model.experts.serve.checkpoint_every_s"},
        {"{\"checkpoint_every_s\": 86401}", NULL, "model.experts.serve.checkpoint_every_s"},
        {"{\"replicas\": 1.5}", NULL, "model.experts.serve.replicas: must be an integer"},
        {"[]", NULL, "model.experts.serve: must be an object"},
        {NULL, "{\"model\": {\"type\": \"mlp\", \"inputs\": 4, \"hidden\": [8], \"classes\": 2}}",
         "not \"dmoe\""},
        {NULL, "{\"bogus\": 1}", "bogus: unknown field"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *t = recipe(bad[i].serve, bad[i].extra), err[256];
        struct moe_runcfg c;
        memset(&c, 0x5a, sizeof c);
        int rc = parse(t, &c, err);
        if (rc == CM_OK || !strstr(err, bad[i].in_err))
            fail_msg("case %zu: rc %d, err \"%s\", expected \"%s\"", i, rc, err, bad[i].in_err);
        assert_int_equal(((unsigned char *)&c)[0], 0x5a); /* nothing written */
        free(t);
    }
    char err[256];
    struct moe_runcfg c;
    assert_int_equal(parse("[1", &c, err), CM_EPARSE);
    assert_int_equal(parse("[]", &c, err), CM_EPARSE);
}

static void test_seeds(void **state)
{
    (void)state;
    char *t = recipe(NULL, NULL), err[256];
    struct moe_runcfg c;
    assert_int_equal(parse(t, &c, err), CM_OK);
    free(t);
    uint64_t seen[16];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            struct moe_uid u = {.n = 2, .idx = {(uint16_t)a, (uint16_t)b}};
            uint64_t s = moe_runcfg_expert_seed(&c, &u);
            /* kern_dmoe_local_new's seed of cell a + 4 b */
            assert_true(s == c.seed * 0x100000001b3ULL + (uint64_t)(a + 4 * b) * 0x9e3779b97f4a7c15ULL);
            for (int k = 0; k < a * 4 + b; k++)
                assert_true(seen[k] != s);
            seen[a * 4 + b] = s;
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_serve_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
