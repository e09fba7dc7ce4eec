/* Pipeline schedules in integration tests (tests/integ/test_pipeline*.c):
 * GET /api/v1/runs/{run}/pipeline fetched and verified as a stage agent
 * does, with cmocka assertions. */
#ifndef CT_PIPELINE_H
#define CT_PIPELINE_H

#include <jansson.h>
#include <stddef.h>

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

#endif
