/* What a pipeline run's stages are doing, for the dashboard (issue 19: "the
 * assignment (devices x stages), the predicted and measured time per step,
 * and each stage's throughput"; docs/pipelines.md, "Watching the stages";
 * docs/dashboard.md):
 *
 *  GET /api/v1/runs/{run}/pipeline/stages  allowlisted users, organizers,
 *      auditors: the stored assignment (api_pipeline.c) joined with the
 *      stage agents' contribution reports (agent/pipe/stage_step.c: one per
 *      step, group "pipeline.VERSION.REPLICA", round_ms the stage's whole
 *      step, sps its samples/s).
 *
 * Which assignment: the one the agents run. A coordinator solves a new
 * version when the old one has less than 300 s of validity left, even for
 * the same devices, but agents move to a newer version only when they
 * re-schedule; so the version shown is the newest one the run's recent
 * reports name, and the newest stored one while none do (before the first
 * step, or after a re-schedule until the first step of the new version).
 *
 * Every query is bounded: the running version is read from the run's
 * newest PS_SAMPLE reports (by receive time, an index); the per-slot and
 * per-step figures from the reports of the PS_WINDOW steps up to that
 * version's newest step (the unique index on (run, step, peer)), at most
 * PS_WINDOW x 256 rows; the usernames from the run's passes and the
 * verified totals from contrib_peer_totals for the assignment's keys, an
 * aggregate over the run's reports like the leaderboard's. The answer is
 * kept PS_CACHE_S per run, so polling pages cost one computation per run
 * per PS_CACHE_S. */
#include "coordinator/api.h"
#include "coordinator/run_cache.h"
#include "cm_err.h"
#include "sched/dtfm_payload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* In the SQL text below: */
#define PS_SAMPLE "1024" /* newest reports read to find the running version */
#define PS_WINDOW "64"   /* steps of the running version read for the figures */
#define PS_LAST "20"     /* reports (per slot) and steps (per run) the medians take */
#define PS_CACHE_S 5

COORD_DB_STMT(S_PS_RUN, 2,
              "SELECT r.id, EXISTS (SELECT 1 FROM run_allowlist a WHERE a.run_id = r.id "
              "AND a.username = $2), r.config::text FROM runs r WHERE r.name = $1");
/* Devices that could take a slot now: live reports (api_pipeline.c's
 * S_LIVE) of peers that can compute. */
COORD_DB_STMT(S_PS_LIVE, 1,
              "SELECT count(*) FROM capabilities c "
              "JOIN passes p ON p.id = c.pass_id AND p.revoked_at IS NULL AND p.expires_at > now() "
              "WHERE c.run_id = $1 AND c.expires_at > now() "
              "AND jsonb_typeof(c.report->'samples_per_s') = 'number' "
              "AND (c.report->>'samples_per_s')::float8 > 0");
/* The version the newest reports name, and its newest step. */
COORD_DB_STMT(S_PS_RUNNING, 1,
              "SELECT v, max(step) FROM (SELECT step, substring(group_id from "
              "'^pipeline\\.([0-9]{1,15})\\.[0-9]{1,5}$')::bigint AS v FROM contrib_reports "
              "WHERE run_id = $1 ORDER BY received_at DESC LIMIT " PS_SAMPLE ") x "
              "WHERE v IS NOT NULL GROUP BY v ORDER BY v DESC LIMIT 1");
#define PS_ROW_COLS                                                                                \
    "version, payload, extract(epoch from created_at)::bigint, "                                  \
    "extract(epoch from valid_until)::bigint, "                                                    \
    "(SELECT max(version) FROM pipelines WHERE run_id = $1) "
COORD_DB_STMT(S_PS_VERSION, 2,
              "SELECT " PS_ROW_COLS "FROM pipelines WHERE run_id = $1 AND version = $2::bigint");
COORD_DB_STMT(S_PS_NEWEST, 1,
              "SELECT " PS_ROW_COLS "FROM pipelines WHERE run_id = $1 ORDER BY version DESC LIMIT 1");
/* $2: the assignment's keys, hex, as a text[] literal. The owner of the
 * key's newest pass in the run. */
#define PS_KEYS "(SELECT decode(k, 'hex') FROM unnest($2::text[]) k)"
COORD_DB_STMT(S_PS_USERS, 2,
              "SELECT DISTINCT ON (p.peer_public_key) encode(p.peer_public_key, 'hex'), u.username "
              "FROM passes p JOIN users u ON u.id = p.user_id WHERE p.run_id = $1 "
              "AND p.peer_public_key IN " PS_KEYS " ORDER BY p.peer_public_key, p.issued_at DESC");
/* Steps and verified samples of each key in the run, every version
 * (docs/accounting.md, "Pipeline stages"). $1: the run's name. */
COORD_DB_STMT(S_PS_TOTALS, 2,
              "SELECT encode(peer_public_key, 'hex'), sum(steps), sum(verified_samples) "
              "FROM contrib_peer_totals WHERE run = $1 AND peer_public_key IN " PS_KEYS
              " GROUP BY peer_public_key");
/* The reports of the running version's last PS_WINDOW steps by the
 * assignment's keys. $3: "pipeline.VERSION." (LIKE-safe: digits and
 * dots), $4: the version's newest step. */
#define PS_RECENT                                                                                  \
    "SELECT peer_public_key, group_id, step, round_ms, sps FROM contrib_reports "                  \
    "WHERE run_id = $1 AND step > $4::bigint - " PS_WINDOW " AND step <= $4::bigint "             \
    "AND left(group_id, length($3)) = $3 AND peer_public_key IN " PS_KEYS
/* Per (key, group): the newest step, and the medians of the last
 * PS_LAST reports. */
COORD_DB_STMT(S_PS_SLOTS, 4,
              "SELECT encode(peer_public_key, 'hex'), group_id, max(step), count(*), "
              "percentile_cont(0.5) WITHIN GROUP (ORDER BY round_ms), "
              "percentile_cont(0.5) WITHIN GROUP (ORDER BY sps) FROM (SELECT *, row_number() OVER "
              "(PARTITION BY peer_public_key, group_id ORDER BY step DESC) AS n FROM (" PS_RECENT
              ") r) x WHERE n <= " PS_LAST " GROUP BY peer_public_key, group_id LIMIT 1024");
/* The run's step time: per step the slowest stage's round_ms, over the
 * last PS_LAST steps every slot reported ($5: the slots), their median. */
COORD_DB_STMT(S_PS_MEASURED, 5,
              "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY slowest), count(*) FROM "
              "(SELECT step, max(round_ms) AS slowest FROM (" PS_RECENT ") r GROUP BY step "
              "HAVING count(*) >= $5::int ORDER BY step DESC LIMIT " PS_LAST ") s");

static struct coord_run_cache g_stages = COORD_RUN_CACHE_INIT(PS_CACHE_S);

static json_t *num_or_null(PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? json_null() : json_real(strtod(PQgetvalue(r, row, col), NULL));
}

static long long lng(PGresult *r, int row, int col)
{
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* config.pipeline's stages and replicas (validated when the run was
 * stored: api_pipeline_config_check). 1, 0 (no pipeline object), -1. */
static int config_shape(const char *config_text, long long *stages, long long *replicas)
{
    json_t *cfg = json_loads(config_text, 0, NULL);
    json_t *p = json_object_get(cfg, "pipeline");
    int kind = json_is_object(p) ? 1 : 0;
    if (kind) {
        json_t *s = json_object_get(p, "stages"), *d = json_object_get(p, "replicas");
        *stages = json_integer_value(s);
        *replicas = json_integer_value(d);
        if (!json_is_integer(s) || !json_is_integer(d) || *stages < 1 || *replicas < 1 ||
            *stages > API_PIPE_MAX_DEVICES || *replicas > API_PIPE_MAX_DEVICES ||
            *stages * *replicas > API_PIPE_MAX_DEVICES)
            kind = -1;
    }
    json_decref(cfg);
    return kind;
}

/* What one query gave for the slots, by key. */
struct ps_slot {
    char hex[2 * CM_ED25519_PUB_LEN + 1];
    char group[40];
    json_t *username, *steps, *verified;           /* owned */
    json_t *step, *reports, *round_ms, *sps;       /* owned */
    double sps_v;                                  /* < 0: none */
};

static int slot_of(const struct ps_slot *sl, size_t n, const char *hex)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(sl[i].hex, hex))
            return (int)i;
    return -1;
}

static void put(json_t **dst, json_t *v)
{
    json_decref(*dst);
    *dst = v;
}

/* Fills doc's assignment part from the stored row r (one row); 0 with resp
 * set on failure. */
static int assignment_json(struct coord_req *req, struct coord_resp *resp, const char *run_id,
                           PGresult *row, long long running_step, int running, json_t *doc)
{
    struct dtfm_payload p;
    char err[160];
    const char *txt = PQgetvalue(row, 0, 1);
    if (dtfm_payload_decode(txt, strlen(txt), &p, err, sizeof err) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "the stored pipeline assignment is unreadable: %s", err);
        return 0;
    }
    size_t n = p.stages * p.replicas;
    struct ps_slot *sl = calloc(n, sizeof *sl);
    size_t cap = n * (2 * CM_ED25519_PUB_LEN + 1) + 3;
    char *arr = malloc(cap);
    int ok = sl && arr;
    if (ok) {
        size_t o = 0;
        arr[o++] = '{';
        for (size_t k = 0; k < n; k++) {
            cm_hex_encode(p.assign[k], CM_ED25519_PUB_LEN, sl[k].hex);
            snprintf(sl[k].group, sizeof sl[k].group, "pipeline.%lld.%zu", (long long)p.version,
                     k / p.stages);
            o += (size_t)snprintf(arr + o, cap - o, "%s%s", k ? "," : "", sl[k].hex);
            sl[k].sps_v = -1;
        }
        snprintf(arr + o, cap - o, "}");
    }
    char ver[32], hi[32], slots[16];
    snprintf(ver, sizeof ver, "pipeline.%lld.", (long long)p.version);
    snprintf(hi, sizeof hi, "%lld", running_step);
    snprintf(slots, sizeof slots, "%zu", n);
    const char *pk[] = {run_id, arr};
    const char *pt[] = {req->params[0], arr};
    const char *pr[] = {run_id, arr, ver, hi, slots};
    PGresult *r = NULL;
    if (ok && (ok = (r = coord_db_exec(req->db, &S_PS_USERS, pk, NULL)) != NULL))
        for (int i = 0; i < PQntuples(r); i++) {
            int s = slot_of(sl, n, PQgetvalue(r, i, 0));
            if (s >= 0)
                put(&sl[s].username, json_string(PQgetvalue(r, i, 1)));
        }
    PQclear(r);
    r = NULL;
    if (ok && (ok = (r = coord_db_exec(req->db, &S_PS_TOTALS, pt, NULL)) != NULL))
        for (int i = 0; i < PQntuples(r); i++) {
            int s = slot_of(sl, n, PQgetvalue(r, i, 0));
            if (s >= 0) {
                put(&sl[s].steps, json_integer(lng(r, i, 1)));
                put(&sl[s].verified, num_or_null(r, i, 2));
            }
        }
    PQclear(r);
    r = NULL;
    json_t *measured = json_pack("{s:n, s:i}", "step_s", "steps", 0);
    if (ok && running && (ok = (r = coord_db_exec(req->db, &S_PS_SLOTS, pr, NULL)) != NULL))
        for (int i = 0; i < PQntuples(r); i++) {
            int s = slot_of(sl, n, PQgetvalue(r, i, 0));
            /* a key's reports count for its own slot's group only */
            if (s < 0 || strcmp(PQgetvalue(r, i, 1), sl[s].group) != 0)
                continue;
            put(&sl[s].step, json_integer(lng(r, i, 2)));
            put(&sl[s].reports, json_integer(lng(r, i, 3)));
            put(&sl[s].round_ms, num_or_null(r, i, 4));
            put(&sl[s].sps, num_or_null(r, i, 5));
            if (!PQgetisnull(r, i, 5))
                sl[s].sps_v = strtod(PQgetvalue(r, i, 5), NULL);
        }
    PQclear(r);
    r = NULL;
    if (ok && running && (ok = (r = coord_db_exec(req->db, &S_PS_MEASURED, pr, NULL)) != NULL) &&
        PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        json_object_set_new(measured, "step_s", json_real(strtod(PQgetvalue(r, 0, 0), NULL) / 1e3));
        json_object_set_new(measured, "steps", json_integer(lng(r, 0, 1)));
    }
    PQclear(r);
    if (!ok)
        coord_resp_error(resp, 500, "internal", sl && arr ? "database error" : "out of memory");
    json_t *a = json_array(), *tp = json_array();
    for (size_t k = 0; ok && k < n; k++) {
        char k64[48];
        cm_b64url_encode(p.assign[k], CM_ED25519_PUB_LEN, k64);
        json_t *s = json_pack("{s:I, s:I, s:s}", "replica", (json_int_t)(k / p.stages), "stage",
                              (json_int_t)(k % p.stages), "peer_public_key", k64);
        json_object_set_new(s, "username", sl[k].username ? json_incref(sl[k].username) : json_null());
        json_object_set_new(s, "step", sl[k].step ? json_incref(sl[k].step) : json_null());
        json_object_set_new(s, "reports", sl[k].reports ? json_incref(sl[k].reports) : json_integer(0));
        json_object_set_new(s, "round_ms", sl[k].round_ms ? json_incref(sl[k].round_ms) : json_null());
        json_object_set_new(s, "sps", sl[k].sps ? json_incref(sl[k].sps) : json_null());
        json_object_set_new(s, "steps", sl[k].steps ? json_incref(sl[k].steps) : json_integer(0));
        json_object_set_new(s, "verified_samples",
                            sl[k].verified ? json_incref(sl[k].verified) : json_real(0));
        json_array_append_new(a, s);
    }
    /* a stage's throughput: what its replicas process together */
    for (size_t j = 0; ok && j < p.stages; j++) {
        double sum = 0;
        int have = 0;
        for (size_t i = 0; i < p.replicas; i++)
            if (sl[i * p.stages + j].sps_v >= 0) {
                sum += sl[i * p.stages + j].sps_v;
                have++;
            }
        json_array_append_new(tp, json_pack("{s:I, s:o, s:i}", "stage", (json_int_t)j, "sps",
                                            have ? json_real(sum) : json_null(), "replicas", have));
    }
    if (ok) {
        json_object_set_new(doc, "version", json_integer(lng(row, 0, 0)));
        json_object_set_new(doc, "newest_version", json_integer(lng(row, 0, 4)));
        json_object_set_new(doc, "created_at", json_integer(lng(row, 0, 2)));
        json_object_set_new(doc, "valid_until", json_integer(lng(row, 0, 3)));
        json_object_set_new(doc, "stages", json_integer((json_int_t)p.stages));
        json_object_set_new(doc, "replicas", json_integer((json_int_t)p.replicas));
        json_object_set_new(doc, "spares", json_integer((json_int_t)p.nspares));
        json_object_set_new(doc, "predicted",
                            json_pack("{s:f, s:f, s:f, s:f}", "total_s", p.total_s, "dp_s", p.dp_s,
                                      "pp_s", p.pp_s, "compute_s", p.compute_s));
        json_object_set_new(doc, "random_mean_s", json_real(p.random_mean_s));
        json_object_set_new(doc, "measured", json_incref(measured));
        json_object_set_new(doc, "slots", json_incref(a));
        json_object_set_new(doc, "throughput", json_incref(tp));
    }
    json_decref(measured);
    json_decref(a);
    json_decref(tp);
    for (size_t k = 0; sl && k < n; k++) {
        json_decref(sl[k].username);
        json_decref(sl[k].steps);
        json_decref(sl[k].verified);
        json_decref(sl[k].step);
        json_decref(sl[k].reports);
        json_decref(sl[k].round_ms);
        json_decref(sl[k].sps);
    }
    free(sl);
    free(arr);
    dtfm_payload_cleanup(&p);
    return ok;
}

void api_pipeline_stages(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return;
    const char *run = req->params[0];
    const char *p2[] = {run, req->user.username};
    PGresult *r = coord_db_exec(req->db, &S_PS_RUN, p2, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "no such run");
        return;
    }
    char run_id[24];
    snprintf(run_id, sizeof run_id, "%s", PQgetvalue(r, 0, 0));
    int allow = !strcmp(PQgetvalue(r, 0, 1), "t");
    long long S = 0, D = 0;
    int kind = config_shape(PQgetvalue(r, 0, 2), &S, &D);
    PQclear(r);
    /* as GET /experts/servers: the run's participants and its overseers */
    if (!allow && !(req->user.role & (COORD_ROLE_ORGANIZER | COORD_ROLE_AUDITOR))) {
        coord_resp_error(resp, 403, "not_allowlisted", "'%s' is not on the allowlist of run '%s'",
                         req->user.username, run);
        return;
    }
    if (kind == 0) {
        coord_resp_error(resp, 422, "not_pipeline",
                         "run '%s' is not a pipeline run (its config has no \"pipeline\" object)", run);
        return;
    }
    if (kind < 0) {
        coord_resp_error(resp, 409, "invalid_pipeline_config",
                         "run '%s': config.pipeline has no valid stages and replicas", run);
        return;
    }
    if (coord_run_cache_serve(&g_stages, run, resp))
        return;
    const char *p1[] = {run_id};
    long long live = 0, running = -1, running_step = 0;
    if (!(r = coord_db_exec(req->db, &S_PS_LIVE, p1, NULL)))
        goto db_error;
    live = PQntuples(r) == 1 ? lng(r, 0, 0) : 0;
    PQclear(r);
    if (!(r = coord_db_exec(req->db, &S_PS_RUNNING, p1, NULL)))
        goto db_error;
    if (PQntuples(r) == 1) {
        running = lng(r, 0, 0);
        running_step = lng(r, 0, 1);
    }
    PQclear(r);
    r = NULL;
    char ver[24];
    snprintf(ver, sizeof ver, "%lld", running);
    const char *pv[] = {run_id, ver};
    /* the version the agents report under, else the newest stored */
    if (running >= 1 && !(r = coord_db_exec(req->db, &S_PS_VERSION, pv, NULL)))
        goto db_error;
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        running = -1;
        if (!(r = coord_db_exec(req->db, &S_PS_NEWEST, p1, NULL)))
            goto db_error;
    }
    /* Before any assignment: the config's shape, and no figures. */
    json_t *doc = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:n, s:n, s:n, s:n, s:n, s:n, s:n, s:n, "
                            "s:[], s:[]}",
                            "run", run, "generated_at", (json_int_t)time(NULL), "config_stages",
                            (json_int_t)S, "config_replicas", (json_int_t)D, "stages", (json_int_t)S,
                            "replicas", (json_int_t)D, "live_devices", (json_int_t)live, "version",
                            "newest_version", "created_at", "valid_until", "spares", "predicted",
                            "random_mean_s", "measured", "slots", "throughput");
    if (!doc) {
        PQclear(r);
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    int ok = PQntuples(r) != 1 ||
             assignment_json(req, resp, run_id, r, running_step, running >= 1, doc);
    PQclear(r);
    if (!ok) {
        json_decref(doc);
        return;
    }
    coord_run_cache_store(&g_stages, run, doc);
    coord_resp_json(resp, 200, doc);
    return;
db_error:
    coord_resp_error(resp, 500, "internal", "database error");
}
