/* The layout of an expert's checkpoint and its check (moe_ckpt.h). */
#include "moe/moe_ckpt.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cm_err.h"

uint64_t moe_ckpt_nparams(int C, int F)
{
    if (C < 1 || C > 65536 || F < 1 || F > 65536)
        return 0;
    return 3 * (uint64_t)C + 2 * (uint64_t)C * (uint64_t)F + (uint64_t)F;
}

uint64_t moe_ckpt_max_bytes(int C, int F)
{
    uint64_t n = moe_ckpt_nparams(C, F);
    if (!n)
        return 0;
    /* header, config, parameters, two buffers (u32 name length, name, u64
       count, data), trailer: docs/checkpoints.md */
    return CM_CKPT_HEADER_BYTES + MOE_CKPT_CONFIG_MAX + 4 * n +
           2 * (4 + sizeof MOE_CKPT_OPT_M - 1 + 8 + 4 * n) + CM_CKPT_TRAILER_BYTES;
}

int moe_ckpt_config(const char *uid, int C, int F, char *out, size_t cap)
{
    int w = snprintf(out, cap, "{\"uid\":\"%s\",\"C\":%d,\"F\":%d}", uid, C, F);
    return w < 0 || (size_t)w >= cap || (size_t)w > MOE_CKPT_CONFIG_MAX ? CM_ETOOBIG : CM_OK;
}

static int all_finite(const float *v, uint64_t n, int nonneg)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || (nonneg && v[i] < 0))
            return 0;
    return 1;
}

int moe_ckpt_check(const struct cm_ckpt *c, const char *uid, int C, int F, char *why, size_t cap)
{
    uint64_t n = moe_ckpt_nparams(C, F);
    const struct cm_ckpt_buf *m = cm_ckpt_find(c, MOE_CKPT_OPT_M), *v = cm_ckpt_find(c, MOE_CKPT_OPT_V);
    if (!n || c->n_params != n) {
        snprintf(why, cap, "%llu parameters, the expert block (C %d, F %d) has %llu",
                 (unsigned long long)c->n_params, C, F, (unsigned long long)n);
        return CM_EINVAL;
    }
    if (c->n_opt != 2 || !m || !v || m->count != n || v->count != n) {
        snprintf(why, cap, "the optimizer state must be exactly \"%s\" and \"%s\" of %llu floats each",
                 MOE_CKPT_OPT_M, MOE_CKPT_OPT_V, (unsigned long long)n);
        return CM_EINVAL;
    }
    if (c->rng_len) {
        snprintf(why, cap, "an expert checkpoint carries no RNG state");
        return CM_EINVAL;
    }
    json_error_t je;
    json_t *j = c->config_len ? json_loadb(c->config, c->config_len, JSON_REJECT_DUPLICATES, &je) : NULL;
    json_t *ju = json_object_get(j, "uid"), *jc = json_object_get(j, "C"), *jf = json_object_get(j, "F");
    int ok = json_is_string(ju) && !strcmp(json_string_value(ju), uid) && json_is_integer(jc) &&
             json_integer_value(jc) == C && json_is_integer(jf) && json_integer_value(jf) == F &&
             json_object_size(j) == 3;
    json_decref(j);
    if (!ok) {
        snprintf(why, cap, "its config is not {\"uid\":\"%s\",\"C\":%d,\"F\":%d}", uid, C, F);
        return CM_EINVAL;
    }
    if (!all_finite(c->params, n, 0) || !all_finite(m->data, n, 0) || !all_finite(v->data, n, 1)) {
        snprintf(why, cap, "it holds non-finite values (or a negative second moment)");
        return CM_EINVAL;
    }
    return CM_OK;
}
