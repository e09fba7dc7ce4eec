/* The DMoE part of a run's config, as an expert server reads it
 * (`crowdtrain-agent serve-experts`, agent/moe/serve.c; docs/experts.md,
 * "Expert servers"). A run's config is the `train --local` recipe
 * (docs/training.md, "DMoE model") plus the optional "collaboration" object
 * of `join`; the recipe is parsed by agent/train/train_config.c (strict:
 * unknown fields are refused), which also reads "model.experts.serve".
 *
 * What a server takes from it: the grid (layer name = uid prefix, d, M;
 * seed 002 Appendix C), the experts' shape (C: the trunk's last width, F:
 * model.experts.hidden), their optimizer, the initialization seed, and the
 * serving settings. */
#ifndef AGENT_MOE_RUNCFG_H
#define AGENT_MOE_RUNCFG_H

#include <stddef.h>
#include <stdint.h>

#include "agent/train/train_config.h"
#include "moe/moe_grid.h"

struct moe_runcfg {
    struct agent_train_config tc;        /* the whole recipe, parsed */
    struct moe_grid grid;                /* serve.prefix, grid_dims, grid_size */
    int C, F;                            /* expert width (trunk's last), hidden width */
    struct kern_optim_config optim;      /* every expert's optimizer */
    uint64_t seed;                       /* model.experts.seed (default: seed + 1) */
    struct agent_moe_serve_config serve; /* model.experts.serve, defaults filled in */
};

/* Parses a run's config (a JSON object, len bytes). Its "collaboration"
 * object, if any, is not the server's and is set aside. CM_EPARSE /
 * CM_EINVAL with err naming the field; CM_EINVAL also when the model is
 * not "dmoe" or the grid does not fit the DHT's (M <= MOE_MAX_SIZE). *out
 * is written only on CM_OK. */
int moe_runcfg_parse(const char *json, size_t len, struct moe_runcfg *out, char *err, size_t cap);

/* The initialization seed of expert u: every replica of a uid, on any
 * server, starts from the same parameters, and they are those of the same
 * cell in `train --local` (kernels/kern_dmoe_local.c: cell index
 * sum_i u_i M^i). u must be a uid of c->grid. */
uint64_t moe_runcfg_expert_seed(const struct moe_runcfg *c, const struct moe_uid *u);

#endif
