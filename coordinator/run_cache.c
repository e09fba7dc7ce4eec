/* See run_cache.h. */
#include "coordinator/run_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static time_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}

int coord_run_cache_serve(struct coord_run_cache *c, const char *run, struct coord_resp *resp)
{
    time_t now = mono_s();
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < COORD_RUN_CACHE_SLOTS && !hit; i++)
        if (c->slot[i].body && !strcmp(c->slot[i].run, run) && now - c->slot[i].at < c->ttl_s) {
            coord_resp_raw(resp, 200, "application/json", c->slot[i].body, c->slot[i].len);
            hit = 1;
        }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void coord_run_cache_store(struct coord_run_cache *c, const char *run, const json_t *doc)
{
    char *body = json_dumps(doc, JSON_COMPACT);
    if (!body)
        return;
    pthread_mutex_lock(&c->mu);
    int k = 0;
    for (int i = 0; i < COORD_RUN_CACHE_SLOTS; i++) {
        if (!strcmp(c->slot[i].run, run)) {
            k = i;
            break;
        }
        if (c->slot[i].at < c->slot[k].at)
            k = i;
    }
    free(c->slot[k].body);
    snprintf(c->slot[k].run, sizeof c->slot[k].run, "%s", run);
    c->slot[k].at = mono_s();
    c->slot[k].body = body;
    c->slot[k].len = strlen(body);
    pthread_mutex_unlock(&c->mu);
}
