/* Contribution reports inside the coordinator (docs/accounting.md; seed
 * 000_02cc6b5d62a616fc.txt §4.3, H.1, H.4): the pure parser of a report's
 * signed payload (fuzzed by tests/fuzz/fuzz_report.c), and the batch writer
 * that stores accepted reports with group commit.
 *
 *   api_contrib_parse.c  coord_report_parse: bytes -> struct coord_report
 *   api_contrib.c        POST .../reports: pass, signature, then the writer
 *   api_contrib_write.c  the writer thread: one transaction per batch
 *   api_contrib_read.c   the auditor, curve and stats endpoints */
#ifndef COORD_API_CONTRIB_H
#define COORD_API_CONTRIB_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"
#include "cm_token.h"

#define COORD_REPORT_FORMAT "crowdtrain-report/1"
#define COORD_REPORT_PAYLOAD_MAX (32 * 1024)
#define COORD_REPORT_MEMBERS_MAX 64
#define COORD_REPORT_GROUP_MAX 64
#define COORD_REPORT_REASON_MAX 15
#define COORD_REPORT_SAMPLES_MAX 1e9
/* Expert servers a trainer attests for in one report (docs/accounting.md,
 * "Expert servers"). */
#define COORD_REPORT_EXPERTS_MAX 64
/* A step further than this beyond the run's highest corroborated step (or
 * newest checkpoint) is refused: it cannot have happened yet. */
#define COORD_REPORT_STEP_AHEAD 1000

struct coord_report_member {
    uint8_t pub[CM_ED25519_PUB_LEN];
    double samples;
};

/* An attestation: samples the expert server with this key answered for the
 * reporter since its previous report. */
struct coord_report_expert {
    uint8_t pub[CM_ED25519_PUB_LEN];
    double samples;
};

struct coord_report_excl {
    uint8_t pub[CM_ED25519_PUB_LEN];
    char reason[COORD_REPORT_REASON_MAX + 1];
};

struct coord_report {
    char run[CM_NAME_MAX + 1];
    uint8_t peer[CM_ED25519_PUB_LEN];
    int64_t step;
    char group[COORD_REPORT_GROUP_MAX + 1];
    uint8_t round[32];
    double samples, compute_s, loss, sps, round_ms;
    int has_loss;
    /* Optional, ALBERT runs (issue 20): the round's sentence-order loss mean
     * (0 .. 1e6) and the share of its masked positions predicted right
     * (0 .. 1). */
    double sop_loss, mlm_accuracy;
    int has_sop_loss, has_mlm_accuracy;
    /* SHA-256 of the reporter's float32 parameters after the round (the
     * state of step + 1): what vouches for a checkpoint (docs/checkpoints.md,
     * "Trust"). Optional: agents before it omit it. */
    uint8_t params[32];
    int has_params;
    int parts, parts_averaged;
    int64_t t;
    size_t n_members;
    struct coord_report_member members[COORD_REPORT_MEMBERS_MAX];
    size_t n_excluded;
    struct coord_report_excl excluded[COORD_REPORT_MEMBERS_MAX];
    /* Optional "experts" (a trainer of a dmoe run): distinct server keys. */
    size_t n_experts;
    struct coord_report_expert experts[COORD_REPORT_EXPERTS_MAX];
};

/* Parses the payload bytes of a report (docs/accounting.md): one JSON
 * object, strict schema, bounded sizes, finite in-range numbers, distinct
 * member and expert server keys. CM_OK, or CM_EPARSE with a sentence for the client in err. */
int coord_report_parse(const void *buf, size_t len, struct coord_report *out, char *err,
                       size_t cap);
/* Its two halves: the agents' form read directly (1: accepted, *out set;
 * 0: not that form or not valid, nothing said), and the generic JSON parse
 * that takes everything else and words every refusal. coord_report_parse
 * tries the first, then the second; both give the same report for what
 * the first accepts (tests/fuzz/fuzz_report_fast.c). */
int coord_report_parse_fast(const void *buf, size_t len, struct coord_report *out);
int coord_report_parse_json(const void *buf, size_t len, struct coord_report *out, char *err,
                            size_t cap);

/* The request body of POST .../reports, {"pass": s, "payload": s, "sig": s},
 * when it takes the form every agent sends: the three fields once each, in
 * any order, JSON whitespace, string values of printable ASCII without
 * escapes (tokens and base64url never need one). 1: *out points into buf;
 * 0: not that form, and the caller parses it as generic JSON instead, which
 * accepts whatever else JSON allows and words the errors. The generic parse
 * of this body (a long string, byte by byte) cost 15% of the coordinator's
 * CPU per report. Pure; tests/fuzz/fuzz_report_envelope.c checks it against
 * the generic parser. */
struct coord_report_env {
    const char *pass, *payload, *sig;
    size_t pass_len, payload_len, sig_len;
};
int coord_report_envelope(const void *buf, size_t len, struct coord_report_env *out);

/* What the writer decided for one report. */
enum coord_report_result {
    COORD_REPORT_RECORDED,
    COORD_REPORT_DUPLICATE,   /* same payload already stored */
    COORD_REPORT_CONFLICT,    /* a different payload for (run, step, peer) exists */
    COORD_REPORT_REVOKED,     /* the pass is revoked, expired or unknown */
    COORD_REPORT_STEP_RANGE,  /* beyond the run's highest corroborated step + ahead */
    COORD_REPORT_RUN_CLOSED,  /* the run is paused, or finished and the step is new */
    COORD_REPORT_NO_RUN,      /* the run (of the pass) does not exist */
    COORD_REPORT_FAILED,      /* database error or deadline: retry */
};

/* One report on its way to the database; the handler owns it until the
 * writer has called `done`. */
struct coord_report_job {
    const struct coord_report *rep;
    const char *payload; /* the exact signed bytes (NUL-terminated JSON text) */
    size_t payload_len;
    uint8_t sig[CM_ED25519_SIG_LEN];
    int64_t pass_id;
    /* filled by the writer */
    enum coord_report_result result;
    /* the writer's own */
    void (*done)(struct coord_report_job *job, void *arg);
    void *arg;
    int64_t deadline_ns; /* CLOCK_MONOTONIC; not taken by then: FAILED unwritten */
    struct coord_report_job *next;
};

struct coord_db_pool;
/* Queues the job for the next batch and returns at once. The writer thread
 * (started on first use; it takes a pooled connection per batch) stores the
 * batch in one transaction and then calls done(job, arg) exactly once, from
 * its own thread, with job->result set: after the commit is durable, or
 * FAILED when the batch failed or the job waited longer than timeout_ms in
 * the queue. Once taken, a batch is bounded by the pool's statement
 * timeout. CM_OK: queued; otherwise done will not be called. */
int coord_report_submit(struct coord_db_pool *pool, struct coord_report_job *job, int timeout_ms,
                        void (*done)(struct coord_report_job *job, void *arg), void *arg);
/* The same, waiting in the calling thread for the result. */
int coord_report_write(struct coord_db_pool *pool, struct coord_report_job *job, int timeout_ms);

#endif
