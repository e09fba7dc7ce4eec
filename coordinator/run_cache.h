/* A few seconds' memory of a per-run JSON answer that pages poll (the
 * leaderboard, api_web.c; who serves which expert, api_expert_ckpt.c): a
 * hit is served as stored, so polling browsers cost one computation per
 * run per ttl. COORD_RUN_CACHE_SLOTS runs at a time; a new run takes the
 * oldest slot. Any thread. */
#ifndef COORD_RUN_CACHE_H
#define COORD_RUN_CACHE_H

#include <jansson.h>
#include <pthread.h>
#include <time.h>

#include "cm_token.h"
#include "coordinator/server.h"

#define COORD_RUN_CACHE_SLOTS 16

struct coord_run_cache {
    pthread_mutex_t mu;
    int ttl_s;
    struct {
        char run[CM_NAME_MAX + 1];
        time_t at; /* CLOCK_MONOTONIC seconds */
        char *body;
        size_t len;
    } slot[COORD_RUN_CACHE_SLOTS];
};
#define COORD_RUN_CACHE_INIT(ttl) {.mu = PTHREAD_MUTEX_INITIALIZER, .ttl_s = (ttl)}

/* 1 when run's answer is fresh: resp then holds it (200, JSON). */
int coord_run_cache_serve(struct coord_run_cache *c, const char *run, struct coord_resp *resp);
/* Keeps doc (not taken) as run's answer. */
void coord_run_cache_store(struct coord_run_cache *c, const char *run, const json_t *doc);

#endif
