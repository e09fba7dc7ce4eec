/* The DMoE part of a run's config for expert servers (moe_runcfg.h). The
 * recipe itself is parsed once, by agent/train/train_config.c; this file
 * only checks that it is a dmoe model whose grid the DHT records can hold
 * and lifts out what a server needs. */
#include "agent/moe/moe_runcfg.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

int moe_runcfg_parse(const char *json, size_t len, struct moe_runcfg *out, char *err, size_t cap)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        snprintf(err, cap, "the run's config is not a JSON object%s%s", root ? "" : ": ",
                 root ? "" : je.text);
        json_decref(root);
        return CM_EPARSE;
    }
    /* join's settings (agent/dp/join.c), not the recipe's */
    json_object_del(root, "collaboration");
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return CM_ENOMEM;
    struct moe_runcfg *c = calloc(1, sizeof *c);
    if (!c) {
        free(text);
        return CM_ENOMEM;
    }
    int rc = agent_train_config_parse(text, strlen(text), NULL, &c->tc, err, cap);
    free(text);
    if (rc != CM_OK)
        goto out;
    rc = CM_EINVAL;
    if (c->tc.kind != KERN_MODEL_DMOE) {
        snprintf(err, cap, "model.type: the run's model is not \"dmoe\": it has no experts to serve");
        goto out;
    }
    if (c->tc.dmoe.grid_m > MOE_MAX_SIZE || c->tc.dmoe.grid_d > MOE_MAX_DIMS) {
        snprintf(err, cap, "model.grid_size: expert servers declare grids of at most %d per dimension "
                 "and %d dimensions on the DHT", MOE_MAX_SIZE, MOE_MAX_DIMS);
        goto out;
    }
    if (moe_grid_init(&c->grid, c->tc.serve.prefix, c->tc.dmoe.grid_d, c->tc.dmoe.grid_m) != CM_OK) {
        snprintf(err, cap, "model.experts.serve.prefix: not a valid layer name for a %dx%d grid",
                 c->tc.dmoe.grid_d, c->tc.dmoe.grid_m);
        goto out;
    }
    c->C = c->tc.experts.C;
    c->F = c->tc.experts.F;
    c->optim = c->tc.experts.opt;
    c->seed = c->tc.experts.seed;
    c->serve = c->tc.serve;
    *out = *c;
    rc = CM_OK;
out:
    free(c);
    return rc;
}

uint64_t moe_runcfg_expert_seed(const struct moe_runcfg *c, const struct moe_uid *u)
{
    /* the formula of kern_dmoe_local_new, so a served expert starts as the
       same cell does in train --local */
    uint64_t idx = 0, mul = 1;
    for (int i = 0; i < c->grid.dims && i < u->n; i++) {
        idx += (uint64_t)u->idx[i] * mul;
        mul *= (uint64_t)c->grid.size;
    }
    return c->seed * 0x100000001b3ULL + idx * 0x9e3779b97f4a7c15ULL;
}
