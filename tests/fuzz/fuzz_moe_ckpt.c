/* libFuzzer target: an expert checkpoint as a server downloads it or the
 * coordinator reads back an upload (common/moe/moe_ckpt.h): cm_ckpt_parse,
 * then moe_ckpt_check against a small expert (C 2, F 3, uid "ffn.1.0").
 * What the check accepts has exactly that layout and only finite values. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "cm_err.h"
#include "cm_log.h"
#include "moe/moe_ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cm_log_set_level((enum cm_log_level) - 1); /* see fuzz_manifest.c */
    struct cm_ckpt c;
    if (cm_ckpt_parse(data, size, &c) != CM_OK)
        return 0;
    char why[256];
    if (moe_ckpt_check(&c, "ffn.1.0", 2, 3, why, sizeof why) == CM_OK) {
        const struct cm_ckpt_buf *m = cm_ckpt_find(&c, MOE_CKPT_OPT_M), *v = cm_ckpt_find(&c, MOE_CKPT_OPT_V);
        if (c.n_params != moe_ckpt_nparams(2, 3) || !m || !v || m->count != c.n_params ||
            v->count != c.n_params || c.rng_len)
            __builtin_trap();
        for (uint64_t i = 0; i < c.n_params; i++)
            if (!isfinite(c.params[i]) || !isfinite(m->data[i]) || !(v->data[i] >= 0) || isinf(v->data[i]))
                __builtin_trap();
    } else if (!why[0]) {
        __builtin_trap(); /* a refusal always says why */
    }
    cm_ckpt_cleanup(&c);
    return 0;
}
