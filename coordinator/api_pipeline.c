/* Pipeline schedules served by the coordinator (seed 003_f3537b728458fcc1.txt
 * §3, DT-FM; issue 19; docs/pipelines.md, docs/protocol.md "Pipeline
 * schedules"): which live peer runs which stage of which pipeline replica.
 *
 *  GET /api/v1/runs/{run}/pipeline  public: the newest signed assignment of
 *      a run whose config has a "pipeline" object. The S x D devices are
 *      chosen from the live capability reports (api_caps.c; with fewer
 *      live, once the run has had an assignment, S x D' for the most
 *      replicas D' >= min_replicas they fill), the pairwise
 *      bandwidths built from them, the partition into per-stage
 *      data-parallel groups searched by common/sched/dtfm (the hybrid
 *      genetic algorithm of seed 003 §3.4, warm-started from the previous
 *      partition), and the best pipeline structure for it (§3.3) becomes
 *      the assignment. It is signed with this coordinator's key, stored in
 *      `pipelines` and served until the inputs change (after a short
 *      hysteresis) or its validity nears its end. With
 *      config.pipeline.search "random" the assignment is instead one
 *      uniformly random assignment of the chosen devices drawn from the
 *      run's seed (the ablation baseline of seed 003 §4.2, so that stage
 *      agents can measure what the search buys on real hosts; issue 19).
 *
 * Solves run in the request (this slice): a few seconds up to 64 devices,
 * but 10-26 s at the 256-device bound even with the shortened search
 * (search_generations); moving them to a background thread as api_sched.c
 * does is the next step. Inputs that only changed their figures wait 30 s
 * before a re-solve, so a big run does not solve on every GET. A
 * transaction-level advisory lock per run makes one coordinator solve;
 * another that finds the lock taken serves what is stored, or asks the
 * caller to retry, rather than holding a database connection through a
 * solve.
 *
 * Also here: the validation of config.pipeline that api_runs.c applies when
 * a run is created or its config replaced. */
#include "coordinator/api.h"
#include "coordinator/signed_doc.h"
#include "cm_err.h"
#include "cm_log.h"
#include "sched/dtfm.h"
#include "sched/dtfm_payload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIPE_VALID_S 600     /* validity window of an assignment */
#define PIPE_REFRESH_S 300   /* re-solve when less validity than this is left */
/* At most one solve per run per this many seconds after the last when the
 * chosen devices changed (a peer that joined waits idle, one that left
 * stalls its pipeline) ... */
#define PIPE_MEMBERS_HYSTERESIS_S 5
/* ... or per this many when only their figures did (throughputs measured
 * again: with many peers they always differ a little, and a large solve
 * costs seconds in the request). As api_sched.c does. */
#define PIPE_HYSTERESIS_S 30
/* The search's generations: dtfm's default (200) up to this many devices;
 * fewer above, so that an in-request solve stays within seconds where it
 * can (a 256-device solve's first generation alone takes seconds). */
#define PIPE_FULL_SEARCH_DEVICES 64
#define PIPE_GENERATIONS 200
#define PIPE_MIN_GENERATIONS 20
#define PIPE_LOCK_CLASS 0x919e1 /* advisory lock class of pipeline solves */
#define PIPE_RANDOM_SAMPLES 20  /* random assignments averaged for the baseline */
#define PIPE_MAX_SPARES DTFM_PAYLOAD_MAX_SPARES /* spares listed in the payload */
#define PIPE_MAX_BYTES 1e15     /* activation_bytes, gradient_bytes: below this (dtfm's bound) */
#define PIPE_MAX_PARAMS 1e12    /* model_parameters */
#define PIPE_MAX_SEED 9007199254740991LL /* 2^53 - 1: exact in every JSON reader */
#define PIPE_ACT_ELEM_BYTES 4   /* activations cross stages in fp32 */

/* ---- config.pipeline ---- */

static int cfg_fail(char *err, size_t cap, const char *fmt, const char *field)
{
    snprintf(err, cap, fmt, field);
    return -1;
}

/* A positive number below hi (NaN and infinities are not JSON, so Jansson
 * never hands them over; the bound keeps products finite). */
static int pos_number(const json_t *v, double hi, double *out)
{
    if (!json_is_number(v))
        return 0;
    double x = json_number_value(v);
    if (!(x > 0) || x >= hi)
        return 0;
    *out = x;
    return 1;
}

/* The model's parameter count, as api_sched.c reads it. */
static int model_parameters(const json_t *config, double *out)
{
    const json_t *v = json_object_get(config, "model_parameters");
    if (!v)
        v = json_object_get(json_object_get(config, "collaboration"), "model_parameters");
    return pos_number(v, PIPE_MAX_PARAMS, out);
}

/* Activations of one sample crossing a stage boundary, from a
 * transformer's shape (agent/train/train_config.c: model.context,
 * model.d_model): every token's hidden vector, in fp32. 0 when not
 * derivable: other models have no single boundary width, their configs
 * must say. */
static double derived_sample_bytes(const json_t *config)
{
    const json_t *m = json_object_get(config, "model");
    const char *type = json_string_value(json_object_get(m, "type"));
    const json_t *ctx = json_object_get(m, "context"), *dm = json_object_get(m, "d_model");
    if (!type || (strcmp(type, "gpt") != 0 && strcmp(type, "albert") != 0) ||
        !json_is_integer(ctx) || !json_is_integer(dm) || json_integer_value(ctx) < 1 ||
        json_integer_value(ctx) > (1 << 20) || json_integer_value(dm) < 1 ||
        json_integer_value(dm) > (1 << 20))
        return 0;
    return (double)json_integer_value(ctx) * (double)json_integer_value(dm) * PIPE_ACT_ELEM_BYTES;
}

/* The tied token embedding's gradient the first and the last stage of a
 * GPT pipeline exchange each step (agent/pipe/stage_step.c): model.vocab x
 * model.d_model fp32 values. 0 for other models, or when not derivable. */
static double derived_tied_bytes(const json_t *config)
{
    const json_t *m = json_object_get(config, "model");
    const char *type = json_string_value(json_object_get(m, "type"));
    const json_t *v = json_object_get(m, "vocab"), *dm = json_object_get(m, "d_model");
    if (!type || strcmp(type, "gpt") != 0 || !json_is_integer(v) || !json_is_integer(dm) ||
        json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24) || json_integer_value(dm) < 1 ||
        json_integer_value(dm) > (1 << 20))
        return 0;
    return (double)json_integer_value(v) * (double)json_integer_value(dm) * PIPE_ACT_ELEM_BYTES;
}

/* The derived activations of one micro-batch with D replicas: the paper's
 * micro-batch i is replica i's share of the step (seed 003 §2: tasklet
 * t_ij is stage j of micro-batch i), ceil(B / D) samples; agents that cut
 * it finer for overlap send the same bytes in total. */
static double derived_activation_bytes(double sample_bytes, double batch, unsigned replicas)
{
    return ceil(batch / replicas) * sample_bytes;
}

struct pipe_cfg {
    unsigned stages;
    /* D' the solve uses: the configured D until pipe_cfg_fit, then
     * min(D, floor(eligible devices / S)) */
    unsigned replicas;
    unsigned max_replicas, min_replicas; /* D (config), min_replicas (default D) */
    double act_bytes, grad_bytes;
    double sample_bytes; /* > 0: activation_bytes is derived, this per sample */
    uint64_t seed;
    const char *search; /* PIPE_SEARCH_DTFM or PIPE_SEARCH_RANDOM (static text) */
    double micro_batch; /* the run's micro_batch (samples), 0 when it has none */
    double tied_bytes;  /* derived_tied_bytes */
};

#define PIPE_SEARCH_DTFM "dtfm"     /* the hybrid genetic algorithm (default) */
#define PIPE_SEARCH_RANDOM "random" /* one uniformly random assignment from the seed */

static int search_random(const struct pipe_cfg *pc)
{
    return !strcmp(pc->search, PIPE_SEARCH_RANDOM);
}

/* 1: a pipeline run, *out filled; 0: no "pipeline" object; -1: invalid,
 * err names the field. batch: the run's target batch size (samples per
 * step), for the derived activation size. */
static int pipe_cfg_parse(const json_t *config, double batch, struct pipe_cfg *out, char *err,
                          size_t cap)
{
    const json_t *p = json_object_get(config, "pipeline");
    if (!p)
        return 0;
    if (!json_is_object(p))
        return cfg_fail(err, cap, "field '%s': an object {\"stages\", \"replicas\", ...}",
                        "config.pipeline");
    memset(out, 0, sizeof *out);
    const json_t *mbj = json_object_get(config, "micro_batch"); /* checked with the training config */
    if (json_is_integer(mbj) && json_integer_value(mbj) > 0)
        out->micro_batch = (double)json_integer_value(mbj);
    out->tied_bytes = derived_tied_bytes(config);
    const json_t *s = json_object_get(p, "stages"), *d = json_object_get(p, "replicas");
    if (!json_is_integer(s) || json_integer_value(s) < 1 ||
        json_integer_value(s) > DTFM_MAX_STAGES)
        return cfg_fail(err, cap, "field '%s': an integer from 1 to 64", "config.pipeline.stages");
    if (!json_is_integer(d) || json_integer_value(d) < 1 ||
        json_integer_value(d) > DTFM_MAX_REPLICAS)
        return cfg_fail(err, cap, "field '%s': an integer from 1 to 64",
                        "config.pipeline.replicas");
    out->stages = (unsigned)json_integer_value(s);
    out->replicas = (unsigned)json_integer_value(d);
    if (out->stages * out->replicas > API_PIPE_MAX_DEVICES) {
        snprintf(err, cap,
                 "fields 'config.pipeline.stages' x 'config.pipeline.replicas': at most %d "
                 "devices (%u x %u asked)",
                 API_PIPE_MAX_DEVICES, out->stages, out->replicas);
        return -1;
    }
    out->max_replicas = out->min_replicas = out->replicas;
    const json_t *mr = json_object_get(p, "min_replicas");
    if (mr) {
        if (!json_is_integer(mr) || json_integer_value(mr) < 1 ||
            json_integer_value(mr) > (json_int_t)out->replicas) {
            snprintf(err, cap,
                     "field 'config.pipeline.min_replicas': an integer from 1 to "
                     "config.pipeline.replicas (%u)",
                     out->replicas);
            return -1;
        }
        out->min_replicas = (unsigned)json_integer_value(mr);
    }
    /* liveness_s: used by the capability reports (api_pipeline_liveness_s) */
    const json_t *lv = json_object_get(p, "liveness_s");
    if (lv && (!json_is_integer(lv) || json_integer_value(lv) < API_PIPE_MIN_LIVENESS_S ||
               json_integer_value(lv) > API_CAP_TTL_S)) {
        snprintf(err, cap, "field 'config.pipeline.liveness_s': an integer from %d to %d",
                 API_PIPE_MIN_LIVENESS_S, API_CAP_TTL_S);
        return -1;
    }
    /* the stage agents' encoding of activations and their gradients
       (agent/pipe/stage.c): a derived activation size halves with fp16 */
    const json_t *co = json_object_get(p, "compression");
    if (co && !(json_is_string(co) &&
                (!strcmp(json_string_value(co), "none") || !strcmp(json_string_value(co), "fp16"))))
        return cfg_fail(err, cap, "field '%s': \"none\" or \"fp16\"", "config.pipeline.compression");
    int fp16 = co && !strcmp(json_string_value(co), "fp16");
    const json_t *a = json_object_get(p, "activation_bytes");
    if (a && !pos_number(a, PIPE_MAX_BYTES, &out->act_bytes))
        return cfg_fail(err, cap, "field '%s': a number in (0, 1e15)",
                        "config.pipeline.activation_bytes");
    if (!a && !(out->sample_bytes = derived_sample_bytes(config)))
        return cfg_fail(err, cap,
                        "field '%s': required unless config.model is a gpt or albert model "
                        "with integer context and d_model",
                        "config.pipeline.activation_bytes");
    if (!a && fp16)
        out->sample_bytes /= 2;
    /* Derived, it grows as replicas drop out: bounded at min_replicas, the
     * largest micro-batch a solve can use. */
    if (!a && derived_activation_bytes(out->sample_bytes, batch, out->min_replicas) >=
                  PIPE_MAX_BYTES)
        return cfg_fail(err, cap,
                        "field '%s': the model's micro-batch activations come to 1e15 bytes or "
                        "more; set it",
                        "config.pipeline.activation_bytes");
    if (!a)
        out->act_bytes = derived_activation_bytes(out->sample_bytes, batch, out->replicas);
    const json_t *g = json_object_get(p, "gradient_bytes");
    double params = 0;
    if (g && !pos_number(g, PIPE_MAX_BYTES, &out->grad_bytes))
        return cfg_fail(err, cap, "field '%s': a number in (0, 1e15)",
                        "config.pipeline.gradient_bytes");
    if (!g) {
        /* One stage's fp32 gradients when the layers are split evenly. */
        if (!model_parameters(config, &params))
            return cfg_fail(err, cap,
                            "field '%s': required unless config.model_parameters (or "
                            "config.collaboration.model_parameters) is a number in [1, 1e12]",
                            "config.pipeline.gradient_bytes");
        out->grad_bytes = params * 4 / out->stages;
    }
    const json_t *sd = json_object_get(p, "seed");
    out->seed = 1;
    if (sd) {
        if (!json_is_integer(sd) || json_integer_value(sd) < 0 ||
            json_integer_value(sd) > PIPE_MAX_SEED)
            return cfg_fail(err, cap, "field '%s': an integer from 0 to 2^53 - 1",
                            "config.pipeline.seed");
        out->seed = (uint64_t)json_integer_value(sd);
    }
    const json_t *se = json_object_get(p, "search");
    out->search = PIPE_SEARCH_DTFM;
    if (se) {
        const char *v = json_string_value(se);
        if (v && !strcmp(v, PIPE_SEARCH_RANDOM))
            out->search = PIPE_SEARCH_RANDOM;
        else if (!v || strcmp(v, PIPE_SEARCH_DTFM) != 0)
            return cfg_fail(err, cap, "field '%s': \"dtfm\" (the default) or \"random\"",
                            "config.pipeline.search");
    }
    return 1;
}

/* Fits the replicas to m eligible devices: D' = min(D, floor(m / S)),
 * and the derived activation size to D' (each of the D' pipelines takes
 * ceil(B / D') samples). 0, pc unchanged, when D' < min_replicas. */
static int pipe_cfg_fit(struct pipe_cfg *pc, size_t m, double batch)
{
    size_t d = m / pc->stages;
    if (d > pc->max_replicas)
        d = pc->max_replicas;
    if (d < pc->min_replicas)
        return 0;
    pc->replicas = (unsigned)d;
    if (pc->sample_bytes > 0)
        pc->act_bytes = derived_activation_bytes(pc->sample_bytes, batch, pc->replicas);
    return 1;
}

int api_pipeline_liveness_s(const json_t *liveness)
{
    return json_is_integer(liveness) && json_integer_value(liveness) >= API_PIPE_MIN_LIVENESS_S &&
                   json_integer_value(liveness) <= API_CAP_TTL_S
               ? (int)json_integer_value(liveness)
               : API_CAP_TTL_S;
}

int api_pipeline_config_check(const json_t *config, long long target_batch, char *err,
                              size_t cap)
{
    struct pipe_cfg c;
    return pipe_cfg_parse(config, target_batch > 0 ? (double)target_batch : 1, &c, err, cap) < 0
               ? CM_EINVAL
               : CM_OK;
}

/* ---- the newest stored assignment ---- */

COORD_DB_STMT(S_RUN, 1, "SELECT id, target_batch_size, config::text FROM runs WHERE name = $1");
/* Live as for averaging schedules (api_sched.c): an unexpired report whose
 * pass is still valid. */
COORD_DB_STMT(S_LIVE, 1,
              "SELECT encode(c.peer_public_key, 'hex'), c.report::text FROM capabilities c "
              "JOIN passes p ON p.id = c.pass_id AND p.revoked_at IS NULL "
              "AND p.expires_at > now() "
              "WHERE c.run_id = $1 AND c.expires_at > now() ORDER BY c.peer_public_key");
COORD_DB_STMT(S_NEWEST, 1,
              "SELECT version, inputs_sha256, extract(epoch from created_at)::bigint, "
              "extract(epoch from valid_from)::bigint, extract(epoch from valid_until)::bigint, "
              "payload, encode(signature, 'hex'), kid, solve_ms FROM pipelines "
              "WHERE run_id = $1 ORDER BY version DESC LIMIT 1");
COORD_DB_STMT(S_TRYLOCK, 2, "SELECT pg_try_advisory_xact_lock($1::int, $2::int)");
COORD_DB_STMT(S_INSERT, 11,
              "INSERT INTO pipelines (run_id, version, kid, valid_from, valid_until, inputs, "
              "inputs_sha256, result, solve_ms, payload, signature, created_at) VALUES ($1, $2, "
              "$3, to_timestamp($4), to_timestamp($5), $6::jsonb, $7, $8::jsonb, $9, $10, "
              "decode($11, 'hex'), to_timestamp($4))");

/* ---- the live inputs ---- */

struct device {
    uint8_t key[CM_ED25519_PUB_LEN];
    char k64[48];
    double samples, up, down;
    json_t *pairs; /* borrowed from the report: [{"peer", "mbps"}] */
};

struct inputs {
    size_t nlive, n, nspare; /* live reports; chosen; eligible but not chosen */
    struct device *dev;      /* nlive: chosen first (by key), then spares */
    json_t **reports;        /* nlive, owned */
    json_t *doc;             /* canonical inputs document */
    char sha[65];
};

static void inputs_free(struct inputs *in)
{
    for (size_t i = 0; in->reports && i < in->nlive; i++)
        json_decref(in->reports[i]);
    free(in->reports);
    free(in->dev);
    json_decref(in->doc);
    memset(in, 0, sizeof *in);
}

/* Who gets a slot first: the fastest, then the lowest key (deterministic). */
static int by_speed(const void *a, const void *b)
{
    const struct device *x = a, *y = b;
    if (x->samples != y->samples)
        return x->samples > y->samples ? -1 : 1;
    return memcmp(x->key, y->key, CM_ED25519_PUB_LEN);
}

static int by_key(const void *a, const void *b)
{
    return memcmp(((const struct device *)a)->key, ((const struct device *)b)->key,
                  CM_ED25519_PUB_LEN);
}

/* Index of key among the chosen devices, or -1. */
static int chosen_index(const struct inputs *in, const uint8_t key[CM_ED25519_PUB_LEN])
{
    for (size_t i = 0; i < in->n; i++)
        if (!memcmp(in->dev[i].key, key, CM_ED25519_PUB_LEN))
            return (int)i;
    return -1;
}

/* Reads the live reports and chooses the devices. Devices that cannot
 * compute (samples_per_s 0, DeDLOC's auxiliary peers) cannot run a stage and
 * are left out. started: the run has a stored assignment, so it may go on
 * with fewer replicas (pipe_cfg_fit). 0 with resp set on failure (409
 * not_enough_peers among them). */
static int inputs_load(struct coord_req *req, struct coord_resp *resp, const char *run_id,
                       struct pipe_cfg *pc, double batch, int started, struct inputs *in)
{
    memset(in, 0, sizeof *in);
    const char *p[] = {run_id};
    PGresult *r = coord_db_exec(req->db, &S_LIVE, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    size_t live = (size_t)PQntuples(r), m = 0;
    in->dev = calloc(live ? live : 1, sizeof *in->dev);
    in->reports = calloc(live ? live : 1, sizeof *in->reports);
    int ok = in->dev && in->reports;
    for (size_t i = 0; ok && i < live; i++) {
        const char *hex = PQgetvalue(r, (int)i, 0);
        json_t *rep = json_loads(PQgetvalue(r, (int)i, 1), 0, NULL);
        struct device *d = &in->dev[m];
        size_t kn = 0;
        if (!rep || cm_hex_decode(hex, strlen(hex), d->key, sizeof d->key, &kn) != CM_OK ||
            kn != sizeof d->key) {
            json_decref(rep);
            ok = 0;
            break;
        }
        in->reports[in->nlive++] = rep;
        d->samples = json_number_value(json_object_get(rep, "samples_per_s"));
        if (!(d->samples > 0))
            continue; /* cannot compute: not eligible */
        d->up = json_number_value(json_object_get(rep, "upload_mbps"));
        d->down = json_number_value(json_object_get(rep, "download_mbps"));
        d->pairs = json_object_get(rep, "pairs");
        cm_b64url_encode(d->key, CM_ED25519_PUB_LEN, d->k64);
        m++;
    }
    PQclear(r);
    if (!ok) {
        inputs_free(in);
        coord_resp_error(resp, 500, "internal", "could not read the capability reports");
        return 0;
    }
    /* Fewer devices than S x D: fewer replicas, down to min_replicas, once
     * the run has started with all D. A first assignment waits for all:
     * agents start as they come, and one solved for the first few would
     * start training only to be re-scheduled moments later. */
    if (!started && pc->min_replicas < pc->max_replicas &&
        m < (size_t)pc->stages * pc->max_replicas) {
        coord_resp_error(resp, 409, "not_enough_peers",
                         "needs %zu devices (%u stages x %u replicas) for its first assignment, "
                         "%zu live (min_replicas %u applies once it has one; %zu live reports, "
                         "%zu of them from peers that cannot compute)",
                         (size_t)pc->stages * pc->max_replicas, pc->stages, pc->max_replicas, m,
                         pc->min_replicas, in->nlive, in->nlive - m);
        inputs_free(in);
        return 0;
    }
    if (!pipe_cfg_fit(pc, m, batch)) {
        coord_resp_error(resp, 409, "not_enough_peers",
                         "needs %zu devices (%u stages x min_replicas %u), %zu live (%u stages "
                         "x %u replicas at most; %zu live reports, %zu of them from peers that "
                         "cannot compute)",
                         (size_t)pc->stages * pc->min_replicas, pc->stages, pc->min_replicas, m,
                         pc->stages, pc->max_replicas, in->nlive, in->nlive - m);
        inputs_free(in);
        return 0;
    }
    size_t need = (size_t)pc->stages * pc->replicas;
    qsort(in->dev, m, sizeof *in->dev, by_speed);
    in->n = need;
    in->nspare = m - need;
    qsort(in->dev, need, sizeof *in->dev, by_key); /* device order = key order */

    /* The canonical document of what the solve depends on: equal documents,
     * equal assignment (dtfm is deterministic per seed). Spares are in by
     * key only, so that the listed spares stay current. "replicas" is D',
     * what the solve uses (the configured D while S x D devices are live),
     * and activation_bytes the size for D': fewer or more replicas is a
     * change of inputs; so is the search ("dtfm" or "random"). */
    json_t *devs = json_array(), *spares = json_array();
    for (size_t i = 0; devs && i < in->n; i++) {
        const struct device *d = &in->dev[i];
        json_t *pairs = json_array(), *e;
        size_t k;
        json_array_foreach(d->pairs, k, e) {
            uint8_t other[CM_ED25519_PUB_LEN];
            const char *o64 = json_string_value(json_object_get(e, "peer"));
            json_t *mbps = json_object_get(e, "mbps"), *rtt = json_object_get(e, "rtt_ms");
            if (api_key_param(o64, other) && chosen_index(in, other) >= 0) {
                json_t *pe = json_pack("{s:s}", "peer", o64);
                if (pe && json_is_number(mbps))
                    json_object_set_new(pe, "mbps", json_real(json_number_value(mbps)));
                if (pe && json_is_number(rtt))
                    json_object_set_new(pe, "rtt_ms", json_real(json_number_value(rtt)));
                json_array_append_new(pairs, pe);
            }
        }
        json_array_append_new(devs, json_pack("{s:s, s:f, s:f, s:f, s:o}", "peer_public_key",
                                              d->k64, "samples_per_s", d->samples,
                                              "upload_mbps", d->up, "download_mbps", d->down,
                                              "pairs", pairs));
    }
    for (size_t i = in->n; spares && i < in->n + in->nspare && i - in->n < PIPE_MAX_SPARES; i++)
        json_array_append_new(spares, json_string(in->dev[i].k64));
    in->doc = json_pack("{s:{s:i, s:i, s:f, s:f, s:I, s:s, s:f}, s:o, s:o}", "run", "stages",
                        (int)pc->stages, "replicas", (int)pc->replicas, "activation_bytes",
                        pc->act_bytes, "gradient_bytes", pc->grad_bytes, "seed",
                        (json_int_t)pc->seed, "search", pc->search, "target_batch_size", batch,
                        "devices", devs, "spares", spares);
    if (coord_doc_digest(in->doc, in->sha) != CM_OK) {
        inputs_free(in);
        coord_resp_error(resp, 500, "internal", "out of memory");
        return 0;
    }
    return 1;
}

/* Whether the newest assignment uses exactly the chosen devices (the
 * same keys in its assignment, in any slots). */
static int same_devices(const struct coord_newest *nw, const struct inputs *in)
{
    json_t *root = nw->have ? json_loads(nw->payload, 0, NULL) : NULL;
    json_t *asg = json_object_get(root, "assignment"), *row;
    size_t i, count = 0;
    int same = json_is_array(asg);
    json_array_foreach(asg, i, row) {
        size_t j;
        json_t *k;
        same = same && json_is_array(row);
        json_array_foreach(row, j, k) {
            uint8_t key[CM_ED25519_PUB_LEN];
            same = same && api_key_param(json_string_value(k), key) && chosen_index(in, key) >= 0;
            count++;
        }
    }
    json_decref(root);
    return same && count == in->n;
}

/* Serve the stored one, or solve again? */
static int newest_good(const struct coord_newest *nw, const struct inputs *in, long long now)
{
    if (!nw->have || nw->until - now < PIPE_REFRESH_S)
        return 0;
    if (!strcmp(nw->sha, in->sha))
        return 1;
    long long wait = same_devices(nw, in) ? PIPE_HYSTERESIS_S : PIPE_MEMBERS_HYSTERESIS_S;
    return now - nw->created < wait; /* inputs changed, but solved moments ago */
}

/* ---- solving ---- */

/* A field of a's measured pair to b ("mbps", or "rtt_ms" the round trip)
 * in a's report, or 0. */
static double measured_field(const struct device *a, const struct device *b, const char *field)
{
    size_t k;
    json_t *e;
    json_array_foreach(a->pairs, k, e) {
        const char *peer = json_string_value(json_object_get(e, "peer"));
        if (peer && !strcmp(peer, b->k64))
            return json_number_value(json_object_get(e, field));
    }
    return 0;
}

static double measured(const struct device *a, const struct device *b)
{
    return measured_field(a, b, "mbps");
}

/* The previous partition (group[d] = stage of chosen device d) when the
 * previous assignment used exactly the chosen devices, so a re-solve keeps
 * what still holds (seed 003 §3.4, the GA's first population). 1 when
 * warm is filled. */
static int warm_from(const struct coord_newest *nw, const struct inputs *in, const struct pipe_cfg *pc,
                     uint16_t *warm)
{
    json_t *root = nw->have ? json_loads(nw->payload, 0, NULL) : NULL;
    json_t *asg = json_object_get(root, "assignment");
    int ok = json_is_array(asg) && json_array_size(asg) == pc->replicas &&
             json_integer_value(json_object_get(root, "stages")) == pc->stages;
    char *seen = calloc(in->n, 1);
    ok = ok && seen;
    for (size_t i = 0; ok && i < pc->replicas; i++) {
        json_t *row = json_array_get(asg, i);
        ok = json_is_array(row) && json_array_size(row) == pc->stages;
        for (size_t j = 0; ok && j < pc->stages; j++) {
            uint8_t k[CM_ED25519_PUB_LEN];
            int d = api_key_param(json_string_value(json_array_get(row, j)), k)
                        ? chosen_index(in, k)
                        : -1;
            ok = d >= 0 && !seen[d];
            if (ok) {
                seen[d] = 1;
                warm[d] = (uint16_t)j;
            }
        }
    }
    free(seen);
    json_decref(root);
    return ok;
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Generations for n devices: the default up to PIPE_FULL_SEARCH_DEVICES,
 * then shrinking with n^2 (a generation's cost grows at least that fast),
 * never below PIPE_MIN_GENERATIONS. Deterministic, so the same inputs and
 * seed still give the same assignment. On this 2-core machine (make
 * bench-like runs of dtfm_search): 64 devices, 200 generations 3-5 s;
 * 128 devices, 50 generations 6-12 s; 256 devices, 20 generations 10-26 s
 * (against 48-122 s with 200), for a cost 2-3 % above the 200-generation
 * one on random bandwidth matrices. */
static unsigned search_generations(size_t n)
{
    if (n <= PIPE_FULL_SEARCH_DEVICES)
        return PIPE_GENERATIONS;
    double g = PIPE_GENERATIONS * (double)PIPE_FULL_SEARCH_DEVICES * PIPE_FULL_SEARCH_DEVICES /
               ((double)n * (double)n);
    return g < PIPE_MIN_GENERATIONS ? PIPE_MIN_GENERATIONS : (unsigned)g;
}

struct solved {
    uint32_t *assign; /* replicas x stages */
    uint16_t *group;
    struct dtfm_cost cost;
    double random_mean_s, solve_ms;
    unsigned generations;
    struct dtfm_search_stats stats;
    int warm;
};

/* Micro-batches per replica and step, as the stage agents cut them: the
 * run's batch / (micro_batch x D'), 1 without a micro_batch (dtfm.h: the
 * agents' 1F1B schedule). */
static size_t micro_batches(const struct pipe_cfg *pc, double batch)
{
    if (pc->micro_batch < 1)
        return 1;
    double m = floor(batch / (pc->micro_batch * (double)pc->replicas));
    return m < 1 ? 1 : m > DTFM_MAX_MICRO_BATCHES ? DTFM_MAX_MICRO_BATCHES : (size_t)m;
}

/* Builds the problem from the chosen devices and solves it. pair (i, j):
 * the throughput either peer measured to the other (i's own measurement
 * first), else min(upload_i, download_j); the delay (alpha) is half the
 * round trip either measured (capability reports' rtt_ms), else 0. */
static int solve(const struct inputs *in, const struct pipe_cfg *pc, double batch,
                 const struct coord_newest *nw, struct solved *out, const char **why)
{
    size_t n = in->n;
    double t0 = mono_ms();
    double *delay = calloc(n * n, sizeof *delay), *bw = calloc(n * n, sizeof *bw);
    double *work = calloc(pc->stages, sizeof *work), *speed = calloc(n, sizeof *speed);
    out->assign = calloc(n, sizeof *out->assign);
    out->group = calloc(n, sizeof *out->group);
    uint16_t *warm = calloc(n, sizeof *warm);
    struct dtfm_model *m = NULL;
    int rc = CM_ENOMEM;
    *why = "out of memory";
    if (!delay || !bw || !work || !speed || !out->assign || !out->group || !warm)
        goto done;
    for (size_t i = 0; i < n; i++) {
        speed[i] = in->dev[i].samples;
        for (size_t j = 0; j < n; j++) {
            if (i == j)
                continue;
            double mb = measured(&in->dev[i], &in->dev[j]);
            if (!(mb > 0))
                mb = measured(&in->dev[j], &in->dev[i]);
            if (!(mb > 0))
                mb = fmin(in->dev[i].up, in->dev[j].down);
            bw[i * n + j] = mb * 1e6;
            /* alpha: half the measured round trip (either side's), else 0 */
            double rtt = measured_field(&in->dev[i], &in->dev[j], "rtt_ms");
            if (!(rtt > 0))
                rtt = measured_field(&in->dev[j], &in->dev[i], "rtt_ms");
            delay[i * n + j] = rtt > 0 ? rtt / 2e3 : 0;
        }
    }
    /* Compute term (dtfm.h): a stage holds 1/S of the layers and each
     * replica B/D samples of the step; samples_per_s is a device's
     * whole-model throughput, so a stage takes B / (D S) / samples_per_s. */
    for (size_t j = 0; j < pc->stages; j++)
        work[j] = batch / ((double)pc->replicas * pc->stages);
    /* the stage agents exchange their gradients' norms every step
       (agent/pipe/stage_step.c, global_norm) */
    struct dtfm_problem prob = {pc->stages, pc->replicas, delay, bw, pc->act_bytes,
                                pc->grad_bytes, work, speed, micro_batches(pc, batch), pc->tied_bytes, 1};
    if ((rc = dtfm_model_new(&prob, &m, why)) != CM_OK)
        goto done;
    if (search_random(pc)) {
        /* search "random": one uniformly random assignment of the chosen
         * devices (the §4.2 baseline's draw, from the run's seed), costed
         * as it is; no search, no warm start. group: its stages. */
        uint64_t rs = pc->seed;
        dtfm_random_assignment(m, &rs, out->assign);
        if ((rc = dtfm_cost_assignment(m, out->assign, &out->cost)) != CM_OK) {
            *why = "the random assignment is invalid";
            goto done;
        }
        for (size_t k = 0; k < n; k++)
            out->group[out->assign[k]] = (uint16_t)(k % pc->stages);
    } else {
        out->warm = warm_from(nw, in, pc, warm) && dtfm_partition_check(m, warm) == CM_OK;
        out->generations = search_generations(n);
        struct dtfm_search_opts o = {pc->seed, DTFM_LOCAL_PAPER, 0, out->generations,
                                     out->warm ? warm : NULL};
        struct dtfm_cost searched;
        if ((rc = dtfm_search(m, &o, out->group, &searched, &out->stats)) != CM_OK ||
            (rc = dtfm_cost_partition(m, out->group, &out->cost, out->assign)) != CM_OK) {
            *why = "the pipeline search failed";
            goto done;
        }
    }
    /* The ablation baseline of seed 003 §4.2, for the organizer's eye. */
    uint64_t rng = pc->seed ^ 0x9e3779b97f4a7c15ULL;
    uint32_t *ra = calloc(n, sizeof *ra);
    double sum = 0;
    if (!ra) {
        rc = CM_ENOMEM;
        *why = "out of memory";
        goto done;
    }
    for (int k = 0; k < PIPE_RANDOM_SAMPLES; k++) {
        struct dtfm_cost c;
        dtfm_random_assignment(m, &rng, ra);
        if (dtfm_cost_assignment(m, ra, &c) == CM_OK)
            sum += c.total;
    }
    out->random_mean_s = sum / PIPE_RANDOM_SAMPLES;
    free(ra);
    rc = CM_OK;
done:
    dtfm_model_free(m);
    free(delay);
    free(bw);
    free(work);
    free(speed);
    free(warm);
    out->solve_ms = mono_ms() - t0;
    return rc;
}

/* The signed payload (docs/protocol.md, "Pipeline schedules"), written by
 * the codec agents decode it with (common/sched/dtfm_payload.c). Peers
 * verify the bytes; they never re-serialize. */
static char *payload_build(const char *run, long long version, long long now, const char *kid,
                           const struct pipe_cfg *pc, const struct inputs *in,
                           const struct solved *sv)
{
    struct dtfm_payload p = {0};
    snprintf(p.run, sizeof p.run, "%s", run);
    snprintf(p.kid, sizeof p.kid, "%s", kid);
    p.version = version;
    p.issued_at = p.valid_from = now;
    p.valid_until = now + PIPE_VALID_S;
    p.stages = pc->stages;
    p.replicas = pc->replicas;
    p.act_bytes = pc->act_bytes;
    p.grad_bytes = pc->grad_bytes;
    p.total_s = sv->cost.total;
    p.dp_s = sv->cost.dp;
    p.pp_s = sv->cost.pp;
    p.compute_s = sv->cost.compute;
    p.random_mean_s = sv->random_mean_s;
    p.nspares = in->nspare < PIPE_MAX_SPARES ? in->nspare : PIPE_MAX_SPARES;
    p.assign = calloc(pc->stages * pc->replicas, sizeof *p.assign);
    p.spares = calloc(p.nspares ? p.nspares : 1, sizeof *p.spares);
    char *txt = NULL;
    size_t len = 0;
    if (p.assign && p.spares) {
        for (size_t k = 0; k < pc->stages * pc->replicas; k++)
            memcpy(p.assign[k], in->dev[sv->assign[k]].key, CM_ED25519_PUB_LEN);
        for (size_t k = 0; k < p.nspares; k++)
            memcpy(p.spares[k], in->dev[in->n + k].key, CM_ED25519_PUB_LEN);
        if (dtfm_payload_encode(&p, &txt, &len) != CM_OK)
            txt = NULL;
    }
    dtfm_payload_cleanup(&p);
    return txt;
}

/* Solves, signs and stores a new assignment; fills nw with it. Runs in the
 * caller's transaction, under the run's advisory lock. */
static int solve_and_store(struct coord_req *req, struct coord_resp *resp, const char *run_id,
                           const struct pipe_cfg *pc, double batch, const struct inputs *in,
                           struct coord_newest *nw)
{
    struct solved sv = {0};
    const char *why = "";
    int rc = solve(in, pc, batch, nw, &sv, &why);
    if (rc != CM_OK) {
        free(sv.assign);
        free(sv.group);
        if (rc == CM_EINVAL)
            coord_resp_error(resp, 409, "cannot_schedule", "no pipeline for these peers: %s", why);
        else
            coord_resp_error(resp, 500, "internal", "the pipeline solver failed: %s", why);
        return 0;
    }
    long long now = (long long)time(NULL), version = nw->have ? nw->version + 1 : 1;
    char *payload = payload_build(req->params[0], version, now, req->srv->kid, pc, in, &sv);
    uint8_t sig[CM_ED25519_SIG_LEN];
    json_t *part = json_array();
    for (size_t d = 0; part && d < in->n; d++)
        json_array_append_new(part, json_integer(sv.group[d]));
    /* search "random": generations, evaluations and improvements 0 */
    json_t *result = json_pack("{s:s, s:o, s:b, s:i, s:I, s:i, s:f, s:f}", "search", pc->search,
                               "partition", part, "warm_start", sv.warm, "generations",
                               (int)sv.generations, "evaluations",
                               (json_int_t)sv.stats.evaluations, "improvements",
                               (int)sv.stats.improvements, "random_mean_s", sv.random_mean_s,
                               "total_s", sv.cost.total);
    char *inputs_txt = json_dumps(in->doc, JSON_COMPACT | JSON_SORT_KEYS);
    char *result_txt = result ? json_dumps(result, JSON_COMPACT) : NULL;
    json_decref(result);
    int ok = payload && inputs_txt && result_txt &&
             dtfm_payload_sign(&req->srv->signing_key, payload, strlen(payload), sig) == CM_OK;
    if (ok) {
        char ver[24], from[24], until[24], ms[32], sighex[2 * CM_ED25519_SIG_LEN + 1];
        snprintf(ver, sizeof ver, "%lld", version);
        snprintf(from, sizeof from, "%lld", now);
        snprintf(until, sizeof until, "%lld", now + PIPE_VALID_S);
        snprintf(ms, sizeof ms, "%.3f", sv.solve_ms);
        cm_hex_encode(sig, sizeof sig, sighex);
        const char *p[] = {run_id, ver, req->srv->kid, from, until, inputs_txt, in->sha,
                           result_txt, ms, payload, sighex};
        PGresult *r = coord_db_exec(req->db, &S_INSERT, p, NULL);
        ok = r != NULL;
        if (r)
            PQclear(r);
        if (ok) {
            free(nw->payload);
            memset(nw, 0, sizeof *nw);
            nw->have = 1;
            nw->version = version;
            nw->created = nw->from = now;
            nw->until = now + PIPE_VALID_S;
            snprintf(nw->sha, sizeof nw->sha, "%s", in->sha);
            snprintf(nw->kid, sizeof nw->kid, "%s", req->srv->kid);
            snprintf(nw->sig_hex, sizeof nw->sig_hex, "%s", sighex);
            nw->solve_ms = sv.solve_ms;
            nw->payload = payload;
            payload = NULL;
            CM_LOGI("pipe", "run %s: pipeline v%lld (search %s), %u x %u devices (of %u "
                    "replicas), %.3f s predicted (random mean %.3f s), %s, %.1f ms",
                    req->params[0], version, pc->search, pc->stages, pc->replicas,
                    pc->max_replicas, sv.cost.total, sv.random_mean_s,
                    sv.warm ? "warm" : "cold", sv.solve_ms);
        }
    }
    free(payload);
    free(inputs_txt);
    free(result_txt);
    free(sv.assign);
    free(sv.group);
    if (!ok)
        coord_resp_error(resp, 500, "internal", "could not sign or store the pipeline schedule");
    return ok;
}

/* ---- GET /pipeline ---- */

void api_pipeline_get(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return;
    PGresult *r = api_run_row(req, resp, &S_RUN);
    if (!r)
        return;
    char run_id[24], err[256] = "";
    snprintf(run_id, sizeof run_id, "%s", PQgetvalue(r, 0, 0));
    double batch = strtod(PQgetvalue(r, 0, 1), NULL);
    json_t *config = json_loads(PQgetvalue(r, 0, 2), 0, NULL);
    PQclear(r);
    struct pipe_cfg pc;
    int kind = pipe_cfg_parse(config, batch, &pc, err, sizeof err);
    json_decref(config);
    if (kind == 0) {
        coord_resp_error(resp, 422, "not_pipeline",
                         "run '%s' is not a pipeline run (its config has no \"pipeline\" object)",
                         req->params[0]);
        return;
    }
    if (kind < 0) { /* a config stored before it was validated */
        coord_resp_error(resp, 409, "invalid_pipeline_config", "run '%s': %s", req->params[0],
                         err);
        return;
    }
    struct inputs in = {0};
    struct coord_newest nw = {0};
    if (coord_newest_load(req, &S_NEWEST, run_id, &nw) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    if (!inputs_load(req, resp, run_id, &pc, batch, nw.have, &in))
        goto out;
    long long now = (long long)time(NULL);
    if (newest_good(&nw, &in, now)) {
        coord_newest_respond(req, resp, &nw, 0, "pipeline", "pipeline schedule");
        goto out;
    }
    /* One solver per run across coordinators. One that finds the lock taken
     * does not wait a solve out on a database connection: it serves the
     * valid assignment it has, or asks the caller to come back. */
    char cls[16], obj[24];
    snprintf(cls, sizeof cls, "%d", PIPE_LOCK_CLASS);
    snprintf(obj, sizeof obj, "%lld", strtoll(run_id, NULL, 10) & 0x7fffffff);
    const char *lp[] = {cls, obj};
    if (coord_db_cmd(req->db, "BEGIN") != CM_OK ||
        !(r = coord_db_exec(req->db, &S_TRYLOCK, lp, NULL))) {
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    int locked = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    if (!locked) {
        coord_db_cmd(req->db, "ROLLBACK");
        if (nw.have && nw.until > now) {
            coord_newest_respond(req, resp, &nw, 0, "pipeline", "pipeline schedule");
        } else {
            snprintf(resp->retry_after, sizeof resp->retry_after, "2");
            coord_resp_error(resp, 503, "solving",
                             "another coordinator is solving run '%s''s pipeline; retry shortly",
                             req->params[0]);
        }
        goto out;
    }
    now = (long long)time(NULL);
    if (coord_newest_load(req, &S_NEWEST, run_id, &nw) != CM_OK) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    int fresh = 0;
    if (!newest_good(&nw, &in, now)) {
        if (!solve_and_store(req, resp, run_id, &pc, batch, &in, &nw)) {
            coord_db_cmd(req->db, "ROLLBACK");
            goto out;
        }
        fresh = 1;
    }
    if (coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not store the pipeline schedule");
        goto out;
    }
    coord_newest_respond(req, resp, &nw, fresh, "pipeline", "pipeline schedule");
out:
    coord_newest_clear(&nw);
    inputs_free(&in);
}
