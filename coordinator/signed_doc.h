/* Signed, versioned documents a run serves: averaging schedules
 * (api_sched.c) and pipeline assignments (api_pipeline.c). Both keep one
 * row per solve with its version, validity, inputs digest, the exact
 * signed payload and its signature; this is the newest row and the answer
 * that carries it. */
#ifndef COORD_SIGNED_DOC_H
#define COORD_SIGNED_DOC_H

#include "coordinator/api.h"

struct coord_newest {
    int have;
    long long version, created, from, until; /* unix seconds */
    char sha[65];                            /* inputs_sha256 */
    char kid[CM_KID_LEN + 1];
    char *payload; /* owned */
    char sig_hex[2 * CM_ED25519_SIG_LEN + 1];
    double solve_ms;
};

/* Loads the newest row with stmt ($1 = the run's id; columns: version,
 * inputs_sha256, created, valid_from, valid_until (epoch seconds), payload,
 * signature in hex, kid, solve_ms); nw->have = 0 when there is none.
 * Frees what nw held before. */
int coord_newest_load(struct coord_req *req, struct coord_db_stmt *stmt, const char *run_id,
                      struct coord_newest *nw);
void coord_newest_clear(struct coord_newest *nw);

/* 200 {run, version, kid, payload (base64url), signature, valid_from,
 * valid_until, created_at, solve_ms, solved_now, <field>: the payload as
 * JSON, coordinator_public_key when this coordinator signed it}; 500 saying
 * "stored <what> is unreadable" when the row does not decode. */
void coord_newest_respond(struct coord_req *req, struct coord_resp *resp, const struct coord_newest *nw,
                          int fresh, const char *field, const char *what);

/* The SHA-256 (hex) of doc's canonical text (compact, keys sorted, reals
 * to 17 digits): equal inputs, equal digest, so a solve is redone only
 * when what it depends on changed. CM_ENOMEM, or CM_EINVAL for NULL. */
int coord_doc_digest(const json_t *doc, char sha[65]);

#endif
