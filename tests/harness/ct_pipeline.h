/* Pipeline schedules in integration tests (tests/integ/test_pipeline*.c):
 * GET /api/v1/runs/{run}/pipeline fetched and verified as a stage agent
 * does, with cmocka assertions. */
#ifndef CT_PIPELINE_H
#define CT_PIPELINE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ct_harness.h"

struct ct_served {
    long long version;
    int solved_now;
    json_t *p; /* the verified payload, parsed (the caller decrefs) */
};

/* Fetches run's pipeline assignment and verifies it as a peer would: the
 * signature with a key from GET /api/v1/keys over "crowdtrain-pipeline/1\n"
 * + the payload bytes before parsing them (a flipped byte must break it),
 * format, run, version, validity, S and D, and the agents' own verifier and
 * strict decoder on the same bytes. Fails the running test otherwise. */
void ct_pipeline_fetch_verified(const struct ct_coord *c, const char *run, size_t stages, size_t replicas,
                                struct ct_served *sv);

/* The status of one request. */
long ct_status(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
               const char *body);
/* Fails the running test unless the answer has this status, error code
 * (code NULL: any) and a message containing `says` (NULL: any). */
void ct_expect(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
               const char *body, long status, const char *code, const char *says);

/* The pipeline tests' recipe: a byte GPT of `layers` layers (vocab 256,
 * context 32, d_model 64, 2 heads), 4 micro-batches of 4 per step, AdamW
 * with clipping at 0.5 (so the global norm matters), cosine schedule over
 * `steps`, on two text shards written into data_dir ("train", "eval",
 * generated from seed and seed + 1). NULL when a shard cannot be written. */
json_t *ct_pipeline_recipe(const char *data_dir, int layers, int steps, uint64_t seed);
/* What the pipeline tests start from: PostgreSQL (exit(CT_SKIP) when it
 * cannot run here), a data directory ct_tempdir(tag) in data (cap bytes),
 * an organizer "org", the coordinator, *org its session. 0, or -1. */
int ct_pipeline_backbone(struct ct_pg *pg, struct ct_coord *c, char **org, const char *tag, char *data,
                         size_t cap);
/* `crowdtrain-agent train --local` of the recipe file on the CPU, with its
 * step log at steplog; fails the running test unless it exits 0. */
void ct_pipeline_train_local(const char *recipe, const char *steplog);
/* Creates run `name` with config cfg (taken) and a target batch of 16:
 * 0, or -1 (said on stderr). */
int ct_pipeline_create_run(const struct ct_coord *c, const char *org, const char *name, const char *summary,
                           json_t *cfg);

#endif
