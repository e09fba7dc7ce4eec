/* Contribution reports from the agent (docs/accounting.md; seed
 * 000_02cc6b5d62a616fc.txt §4.3, H.4): after each averaging round the agent
 * reports what it did and what it saw of its group's samples, signed with
 * its peer key, to POST /api/v1/runs/{run}/reports.
 *
 * peer_report_encode/peer_report_sign are pure (unit-tested); the reporter
 * is a background thread with a bounded queue that never blocks training:
 * it posts with libcurl, retrying with backoff on connection errors and 5xx
 * until each report's deadline. */
#ifndef AGENT_PEER_REPORT_H
#define AGENT_PEER_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define PEER_REPORT_MEMBERS_MAX 64
#define PEER_REPORT_EXPERTS_MAX 64
#define PEER_REPORT_PAYLOAD_MAX (32 * 1024)
#define PEER_REPORT_FORMAT "crowdtrain-report/1"

struct peer_report_member {
    uint8_t pub[32];
    double samples;
};
/* A trainer's attestation for an expert server (docs/accounting.md, "Expert
 * servers"): samples whose forward and backward that server answered for
 * this trainer since its previous report. */
struct peer_report_expert {
    uint8_t pub[32];
    double samples; /* 0 .. 1e9 */
};
struct peer_report_excl {
    uint8_t pub[32];
    char reason[16]; /* 1-15 of [a-z0-9_], e.g. "nonfinite", "norm" */
};
struct peer_report {
    int64_t step;
    char group[65];      /* 1-64 of [A-Za-z0-9_.:-] */
    uint8_t round_id[32];
    double samples, compute_s, loss, sps, round_ms; /* loss: mean over samples (ignored when samples == 0 or not finite) */
    /* ALBERT runs (issue 20), each written only when its has_ flag is set,
       samples > 0 and the value is finite and in bounds (otherwise left
       out, like loss): the sentence-order loss's mean over the round's
       sequences (0 .. 1e6, with model.sentence_order), and the share of the
       round's masked positions whose argmax prediction was the target
       (0 .. 1) */
    double sop_loss, mlm_accuracy;
    int has_sop_loss, has_mlm_accuracy;
    int parts, parts_averaged;
    /* SHA-256 of this peer's float32 parameters after applying the round
     * (the state of step + 1), as agent_param_hash computes it; written as
     * "params" when has_params. It vouches for the checkpoint of step + 1
     * (docs/checkpoints.md, "Trust"). */
    uint8_t params[32];
    int has_params;
    size_t n_members;
    struct peer_report_member members[64];
    size_t n_excluded;
    struct peer_report_excl excluded[64];
    /* written as "experts" when n_experts > 0 (a trainer of a dmoe run);
       distinct keys, at most PEER_REPORT_EXPERTS_MAX (keep the largest) */
    size_t n_experts;
    struct peer_report_expert experts[PEER_REPORT_EXPERTS_MAX];
};

/* Writes the canonical payload JSON (fields in the documented order,
 * numbers with 17 significant digits) for `run`, the reporting peer `pub`
 * and time t (Unix s) into out (cap bytes, NUL-terminated); *len gets its
 * length. CM_EINVAL when a field is out of the documented bounds,
 * CM_ETOOBIG when it does not fit. */
int peer_report_encode(const struct peer_report *rep, const char *run, const uint8_t pub[32],
                       int64_t t, char *out, size_t cap, size_t *len);

/* The request body {"pass", "payload", "sig"} for payload bytes signed with
 * key over "crowdtrain-report/1\n" || payload. *out is heap memory. */
int peer_report_sign(const struct cm_ed25519 *key, const char *pass_token, const char *payload,
                     size_t len, char **out);

struct peer_reporter;
/* coordinator URL + CA file (may be NULL) copied; key borrowed (outlives); token copied. */
int peer_reporter_start(const char *url, const char *ca_cert, const char *run,
                        const struct cm_ed25519 *key, const char *pass_token,
                        struct peer_reporter **out);
int peer_reporter_set_token(struct peer_reporter *r, const char *pass_token);
/* Never blocks: queues (bounded; oldest dropped with a warning when full). A background thread
   posts with libcurl (its own handle), retrying with backoff on connection errors / 5xx until a
   per-report deadline. */
int peer_reporter_submit(struct peer_reporter *r, const struct peer_report *rep);
/* Stops, trying to flush for up to flush_ms; returns how many were left unsent. */
size_t peer_reporter_stop(struct peer_reporter *r, int flush_ms);

/* Counters since start (for tests and the console line). */
struct peer_reporter_stats {
    uint64_t sent;     /* answered 200/201 */
    uint64_t refused;  /* answered 4xx (dropped: retrying cannot help) */
    uint64_t dropped;  /* queue full or deadline passed */
    uint64_t retries;
};
void peer_reporter_stats(struct peer_reporter *r, struct peer_reporter_stats *out);

/* Per-report deadline and queue bound (defaults 600 s and 256). */
#define PEER_REPORT_DEADLINE_MS 600000
#define PEER_REPORT_QUEUE_MAX 256

#endif
