/* The training config of `crowdtrain-agent train --local --config FILE`
 * (and later of a collaborative run): one JSON object describing the model,
 * optimizer, schedule, batch, data and checkpoints. docs/training.md has the
 * schema; examples/ has working files.
 *
 * Parsing is strict: an unknown field, a wrong type or an impossible size is
 * an error naming the field, and nothing else happens (no file is created
 * or overwritten before the whole config has been accepted). */
#ifndef AGENT_TRAIN_CONFIG_H
#define AGENT_TRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kern_dmoe.h"
#include "kern_model.h"
#include "kern_optim.h"

#define AGENT_TRAIN_PATH_MAX 1024
#define AGENT_TRAIN_MIX_MAX 8      /* data.train plus at most 7 sets in data.mix */

/* model.experts.serve: how `crowdtrain-agent serve-experts` hosts the
 * experts of a dmoe run (agent/moe/moe_runcfg.h, docs/experts.md "Expert
 * servers"); train --local reads and ignores it. */
struct agent_moe_serve_config {
    char prefix[33];   /* the grid's layer name, the uid prefix ([a-z0-9_]{1,32}) */
    int max_batch;     /* samples per batch and per request */
    int max_wait_ms;   /* longest wait for a batch to fill */
    int declare_ttl_s; /* expiry of the DHT declarations (re-declared every third) */
    int replicas;      /* servers wanted per expert (--experts picks below it first;
                          --max-experts adopts uids below it) */
    int checkpoint_every_s; /* each hosted expert is uploaded to the coordinator this often */
};

struct agent_train_config {
    enum kern_model_kind kind;
    struct kern_mlp_config mlp;     /* kind == MLP */
    struct kern_tfm_config tfm;     /* kind == GPT or ALBERT */
    struct kern_dmoe_config dmoe;   /* kind == DMOE */
    struct kern_dmoe_local_config experts; /* kind == DMOE: the in-process experts of
                                       train --local (C from dmoe, max_rows = micro_batch) */
    struct agent_moe_serve_config serve; /* kind == DMOE: model.experts.serve */
    int max_inflight;               /* kind == DMOE: model.experts.max_inflight_batches, the
                                       micro-batches a trainer with remote experts keeps in
                                       flight (agent/train/async.h); train --local: 1 */
    float mask_prob;                /* ALBERT masked-LM rate (0.15) */
    struct kern_optim_config opt;   /* total_steps = steps */
    int batch_size;                 /* examples per optimizer step */
    int micro_batch;                /* examples per forward/backward (divides batch_size) */
    long steps;
    uint64_t seed;
    char device[8];                 /* auto, cpu, cuda */
    char precision[8];              /* fp32, tf32, bf16, fp16 (CUDA matmuls) */
    int threads;                    /* CPU threads, 0 = all */
    char train_manifest[AGENT_TRAIN_PATH_MAX];
    /* data.mix: more training sets, each example drawn from set k with
       probability mix_weight[k] (seed 000 §4.3 mixes Wikipedia and OSCAR);
       set 0 is train_manifest, weighted 1 - the others' weights */
    int n_mix;                      /* sets in data.mix (0: train_manifest alone) */
    char mix_manifest[AGENT_TRAIN_MIX_MAX][AGENT_TRAIN_PATH_MAX]; /* [0] unused */
    double mix_weight[AGENT_TRAIN_MIX_MAX];
    char eval_manifest[AGENT_TRAIN_PATH_MAX]; /* "" = no evaluation */
    long shuffle_buffer;
    long eval_batches;              /* 0 = the whole eval set */
    int eval_at_start;
    long eval_every;                /* 0 = only at the end */
    long log_every;
    char ckpt_dir[AGENT_TRAIN_PATH_MAX]; /* "" = no checkpoints */
    long ckpt_every;
    int resume;                     /* continue from ckpt_dir/latest.ckpt when present */
    uint64_t data_seed;             /* not from JSON: the data order's seed; 0 = seed.
                                       Collaborative peers share `seed` (identical
                                       initial weights) but each streams its own order. */
};

/* Parses config text. Relative paths (manifests, checkpoint dir) are taken
 * relative to base_dir (the config file's directory; NULL = as given).
 * CM_EPARSE / CM_EINVAL with a message naming the field in err. */
int agent_train_config_parse(const char *json, size_t len, const char *base_dir,
                             struct agent_train_config *out, char *err, size_t errlen);

/* Reads FILE (at most 1 MiB) and parses it. */
int agent_train_config_load(const char *path, struct agent_train_config *out, char *err,
                            size_t errlen);

#endif
