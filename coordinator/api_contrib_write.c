/* The batch writer of contribution reports (group commit). Request threads
 * verify a report's pass and signature themselves, then queue it here (and
 * park their connection: no thread waits); one writer thread takes
 * everything queued, stores it in one transaction (one multi-row statement
 * per table) and calls each job's completion when the commit is durable. While a batch commits the next one gathers,
 * so a busy coordinator commits hundreds of reports per fsync and an idle
 * one commits each report at once.
 *
 * What the transaction does (docs/accounting.md, "Verification"):
 *  1. inserts the reports whose pass is still valid (not revoked, not
 *     expired, bound to this key and run) and whose step is within
 *     COORD_REPORT_STEP_AHEAD of the run's highest corroborated step;
 *     (run, step, peer) already present: nothing (ON CONFLICT DO NOTHING);
 *     a trainer's attestations of expert servers go into the same row
 *     (contrib_reports.experts; sql/011_expert_credit.sql credits them on
 *     read), so they cost no statement of their own;
 *  2. folds what each newly stored report saw of the other members into
 *     contrib_seen (min, max, observers), and stores its exclusions;
 *  3. classifies the reports not inserted: the same payload already stored
 *     (a retry), a different one (a conflict, kept aside), a revoked pass,
 *     or a step out of range.
 * Only reports inserted in step 1 feed step 2, so a retry or a conflicting
 * duplicate can never be counted twice. Keys are sorted before the upsert
 * so concurrent coordinators lock rows in the same order. A batch that
 * fails as a whole is retried report by report, so one bad report never
 * takes the others down with it. */
#include "coordinator/api_contrib.h"
#include "coordinator/db.h"
#include "cm_err.h"
#include "cm_log.h"

#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH_MAX 1024
#define STR_(x) #x
#define STR(x) STR_(x)
#define AHEAD_SQL STR(COORD_REPORT_STEP_AHEAD)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work = PTHREAD_COND_INITIALIZER;
static struct coord_report_job *g_head, *g_tail;
static struct coord_db_pool *g_pool;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_started;

/* --- SQL ---------------------------------------------------------------- */

#define ROWS_COLS                                                                                \
    "i int, pass bigint, run text, step bigint, pk text, round text, grp text, samples float8, " \
    "compute_s float8, loss float8, sps float8, round_ms float8, parts int, pa int, nm int, "    \
    "nx int, payload text, sig text, sha text, params text, experts jsonb, sop_loss float8, "     \
    "mlm_acc float8"

/* Each row finds its pass by primary key (LATERAL ... OFFSET 0 keeps it a
 * per-row index lookup: planned as a join, the pass table was scanned by
 * run and filtered, batch x passes rows, 27 ms of a 47 ms batch of 210 with
 * 1,000 passes); each run's step limit is computed once per batch, not per
 * row. */
COORD_DB_STMT(S_INSERT, 1,
              "WITH u AS MATERIALIZED (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(" ROWS_COLS ")), "
              "v AS MATERIALIZED (SELECT u.*, p.run_id, p.ppk, p.user_id FROM u CROSS JOIN LATERAL "
              "  (SELECT p.run_id, p.peer_public_key AS ppk, p.user_id FROM passes p "
              "   WHERE p.id = u.pass AND p.peer_public_key = decode(u.pk, 'hex') "
              "   AND p.revoked_at IS NULL AND p.expires_at > now() OFFSET 0) p), "
              "lim AS MATERIALIZED (SELECT r.id, r.name, r.status, "
              "  (SELECT max(s.step) FROM contrib_seen s WHERE s.run_id = r.id) AS seen_top, greatest(0, "
              "  (SELECT max(s.step) FROM contrib_seen s WHERE s.run_id = r.id), "
              "  (SELECT max(c.step) FROM checkpoints c WHERE c.run_id = r.id AND c.trusted)) + " AHEAD_SQL " AS top "
              "  FROM runs r WHERE r.id IN (SELECT DISTINCT run_id FROM v)) "
              "INSERT INTO contrib_reports (run_id, step, peer_public_key, user_id, pass_id, round_id, "
              "group_id, samples, compute_s, loss, sps, round_ms, parts, parts_averaged, n_members, "
              "n_excluded, payload, signature, payload_sha256, params_sha256, experts, sop_loss, "
              "mlm_accuracy) "
              "SELECT v.run_id, v.step, v.ppk, v.user_id, v.pass, decode(v.round, 'hex'), "
              "v.grp, v.samples, v.compute_s, v.loss, v.sps, v.round_ms, v.parts, v.pa, v.nm, v.nx, "
              "v.payload, decode(v.sig, 'hex'), decode(v.sha, 'hex'), decode(v.params, 'hex'), v.experts, "
              "v.sop_loss, v.mlm_acc "
              "FROM v JOIN lim ON lim.id = v.run_id AND lim.name = v.run "
              "WHERE v.step <= lim.top AND (lim.status = 'open' OR "
              "  (lim.status = 'finished' AND v.step <= lim.seen_top)) ORDER BY v.run_id, v.step, v.ppk "
              "ON CONFLICT (run_id, step, peer_public_key) DO NOTHING "
              "RETURNING pass_id, step, run_id");

COORD_DB_STMT(S_SEEN, 1,
              "INSERT INTO contrib_seen (run_id, step, round_id, subject, seen_min, seen_max, observers) "
              "SELECT x.run_id, x.step, decode(x.round, 'hex'), decode(x.subject, 'hex'), x.mn, x.mx, x.n "
              "FROM jsonb_to_recordset($1::jsonb) AS x(run_id bigint, step bigint, round text, "
              "subject text, mn float8, mx float8, n int) "
              "ON CONFLICT (run_id, step, subject, round_id) DO UPDATE SET "
              "seen_min = least(contrib_seen.seen_min, EXCLUDED.seen_min), "
              "seen_max = greatest(contrib_seen.seen_max, EXCLUDED.seen_max), "
              "observers = contrib_seen.observers + EXCLUDED.observers");

/* A run's status follows its verified progress: once a claim at its last
 * step (config "steps" - 1: the round that makes the state of the last
 * step) is verified, the run is finished. $1: the batch's run ids. */
COORD_DB_STMT(S_FINISH, 1,
              "UPDATE runs r SET status = 'finished' WHERE r.id = ANY($1::bigint[]) "
              "AND r.status = 'open' AND jsonb_typeof(r.config->'steps') = 'number' "
              /* the index lookup first: the view's check only near the end */
              "AND CASE WHEN (SELECT max(s.step) FROM contrib_seen s WHERE s.run_id = r.id) "
              "  >= (r.config->>'steps')::numeric - 1 "
              "THEN EXISTS (SELECT 1 FROM contrib_claims c WHERE c.run_id = r.id "
              "  AND c.step >= (r.config->>'steps')::numeric - 1 AND c.verified_samples > 0) "
              "ELSE false END");

COORD_DB_STMT(S_EXCL, 1,
              "INSERT INTO contrib_exclusions (run_id, step, subject, reporter, reason) "
              "SELECT x.run_id, x.step, decode(x.subject, 'hex'), decode(x.reporter, 'hex'), x.reason "
              "FROM jsonb_to_recordset($1::jsonb) AS x(run_id bigint, step bigint, subject text, "
              "reporter text, reason text) ON CONFLICT DO NOTHING");

/* For the reports not inserted: what is there already, and is the pass good. */
COORD_DB_STMT(S_CLASSIFY, 1,
              "SELECT u.i, p.id IS NOT NULL, coalesce(p.revoked_at IS NULL AND p.expires_at > now(), "
              "false), r.id IS NOT NULL, c.id IS NOT NULL, "
              "coalesce(c.payload_sha256 = decode(u.sha, 'hex'), false), "
              "coalesce(r.status = 'paused' OR (r.status = 'finished' AND u.step > "
              "  coalesce((SELECT max(s.step) FROM contrib_seen s WHERE s.run_id = r.id), -1)), false) "
              "FROM jsonb_to_recordset($1::jsonb) AS u(" ROWS_COLS ") "
              "LEFT JOIN LATERAL (SELECT p.* FROM passes p WHERE p.id = u.pass "
              "  AND p.peer_public_key = decode(u.pk, 'hex') OFFSET 0) p ON true "
              "LEFT JOIN LATERAL (SELECT r.id, r.status FROM runs r WHERE r.id = p.run_id AND r.name = u.run "
              "  OFFSET 0) r ON true "
              "LEFT JOIN LATERAL (SELECT c.id, c.payload_sha256 FROM contrib_reports c "
              "  WHERE c.run_id = r.id AND c.step = u.step AND c.peer_public_key = p.peer_public_key "
              "  OFFSET 0) c ON true");

COORD_DB_STMT(S_CONFLICT, 1,
              "INSERT INTO contrib_conflicts (run_id, step, peer_public_key, user_id, payload_sha256, "
              "payload, signature) "
              "SELECT p.run_id, u.step, p.peer_public_key, p.user_id, decode(u.sha, 'hex'), u.payload, "
              "decode(u.sig, 'hex') FROM jsonb_to_recordset($1::jsonb) AS u(" ROWS_COLS ") "
              "JOIN passes p ON p.id = u.pass ON CONFLICT DO NOTHING");

/* --- the JSON documents the statements read ------------------------------ */

/* The rows go to PostgreSQL as one JSON array per statement, written
 * straight into a growing buffer: every value is already validated (names,
 * hex, finite numbers; the payload is the client's JSON text, escaped as a
 * string), so a generic JSON library's objects would only cost time. */
struct sb {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_need(struct sb *b, size_t n)
{
    if (b->oom || b->len + n + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
        b->oom = 1;
        return;
    }
    b->p = q;
    b->cap = cap;
}

static void sb_raw(struct sb *b, const char *s, size_t n)
{
    sb_need(b, n);
    if (b->oom)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_lit(struct sb *b, const char *s)
{
    sb_raw(b, s, strlen(s));
}

static void sb_int(struct sb *b, long long v)
{
    char t[32];
    sb_raw(b, t, (size_t)snprintf(t, sizeof t, "%lld", v));
}

/* Finite by construction (the parser refuses anything else); %.17g round-trips. */
static void sb_num(struct sb *b, double v)
{
    char t[40];
    sb_raw(b, t, (size_t)snprintf(t, sizeof t, "%.17g", v));
}

static void sb_hex(struct sb *b, const uint8_t *v, size_t n)
{
    char t[2 * 64 + 1];
    cm_hex_encode(v, n, t);
    sb_raw(b, "\"", 1);
    sb_raw(b, t, 2 * n);
    sb_raw(b, "\"", 1);
}

/* A JSON string of arbitrary bytes without NUL (valid UTF-8 is the
 * caller's: the payload was parsed as JSON, names are ASCII). */
static void sb_str(struct sb *b, const char *s, size_t n)
{
    sb_need(b, 2 * n + 2);
    if (b->oom)
        return;
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            size_t at = (size_t)(o - b->p);
            b->len = at;
            sb_need(b, 6 + 2 * (n - i) + 2); /* \u00XX, then the rest at worst */
            if (b->oom)
                return;
            o = b->p + at;
            o += snprintf(o, 7, "\\u%04x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    b->p[b->len] = '\0';
}

/* One report as a row of ROWS_COLS; i is its index in the batch. */
static void row_text(struct sb *b, size_t i, const struct coord_report_job *j)
{
    const struct coord_report *r = j->rep;
    uint8_t digest[CM_SHA256_LEN];
    cm_sha256(j->payload, j->payload_len, digest);
    sb_lit(b, "{\"i\":");
    sb_int(b, (long long)i);
    sb_lit(b, ",\"pass\":");
    sb_int(b, j->pass_id);
    sb_lit(b, ",\"run\":");
    sb_str(b, r->run, strlen(r->run));
    sb_lit(b, ",\"step\":");
    sb_int(b, r->step);
    sb_lit(b, ",\"pk\":");
    sb_hex(b, r->peer, sizeof r->peer);
    sb_lit(b, ",\"round\":");
    sb_hex(b, r->round, sizeof r->round);
    sb_lit(b, ",\"grp\":");
    sb_str(b, r->group, strlen(r->group));
    sb_lit(b, ",\"samples\":");
    sb_num(b, r->samples);
    sb_lit(b, ",\"compute_s\":");
    sb_num(b, r->compute_s);
    sb_lit(b, ",\"loss\":");
    if (r->has_loss)
        sb_num(b, r->loss);
    else
        sb_lit(b, "null");
    sb_lit(b, ",\"sps\":");
    sb_num(b, r->sps);
    sb_lit(b, ",\"round_ms\":");
    sb_num(b, r->round_ms);
    sb_lit(b, ",\"parts\":");
    sb_int(b, r->parts);
    sb_lit(b, ",\"pa\":");
    sb_int(b, r->parts_averaged);
    sb_lit(b, ",\"nm\":");
    sb_int(b, (long long)r->n_members);
    sb_lit(b, ",\"nx\":");
    sb_int(b, (long long)r->n_excluded);
    sb_lit(b, ",\"payload\":");
    sb_str(b, j->payload, j->payload_len);
    sb_lit(b, ",\"sig\":");
    sb_hex(b, j->sig, sizeof j->sig);
    sb_lit(b, ",\"sha\":");
    sb_hex(b, digest, sizeof digest);
    /* ALBERT's heads (sql/012_albert_heads.sql); absent: NULL */
    if (r->has_sop_loss) {
        sb_lit(b, ",\"sop_loss\":");
        sb_num(b, r->sop_loss);
    }
    if (r->has_mlm_accuracy) {
        sb_lit(b, ",\"mlm_acc\":");
        sb_num(b, r->mlm_accuracy);
    }
    if (r->has_params) {
        sb_lit(b, ",\"params\":");
        sb_hex(b, r->params, sizeof r->params);
    }
    /* The attestations of expert servers, keyed by hex like every key in
     * the database; a report without them writes nothing here (NULL). */
    if (r->n_experts) {
        sb_lit(b, ",\"experts\":{");
        for (size_t e = 0; e < r->n_experts; e++) {
            if (e)
                sb_lit(b, ",");
            sb_hex(b, r->experts[e].pub, sizeof r->experts[e].pub);
            sb_lit(b, ":");
            sb_num(b, r->experts[e].samples);
        }
        sb_lit(b, "}");
    }
    sb_lit(b, "}");
}

/* The rows of jobs[i] for which pick[i] == want (all when pick is NULL). */
static int rows_doc(struct sb *b, struct coord_report_job **jobs, size_t n, const int *pick,
                    int want)
{
    b->len = 0;
    sb_lit(b, "[");
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        if (pick && pick[i] != want)
            continue;
        if (any)
            sb_lit(b, ",");
        row_text(b, i, jobs[i]);
        any = 1;
    }
    sb_lit(b, "]");
    return b->oom ? CM_ENOMEM : CM_OK;
}

/* Runs a one-parameter statement with a JSON document; returns the result or NULL. */
static PGresult *exec_doc(struct coord_db_conn *c, struct coord_db_stmt *s, const struct sb *doc)
{
    if (doc->oom)
        return NULL;
    const char *p[] = {doc->p};
    return coord_db_exec(c, s, p, NULL);
}

struct seen_key {
    int64_t run_id, step;
    uint8_t round[32], subject[32];
    double mn, mx;
    int n;
};

static int seen_cmp(const void *a, const void *b)
{
    const struct seen_key *x = a, *y = b;
    if (x->run_id != y->run_id)
        return x->run_id < y->run_id ? -1 : 1;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    int c = memcmp(x->subject, y->subject, 32);
    return c ? c : memcmp(x->round, y->round, 32);
}

/* Folds the observations of the inserted reports (run_ids[i] > 0) into
 * contrib_seen and stores their exclusions. */
static int fold_observations(struct coord_db_conn *c, struct coord_report_job **jobs, size_t n,
                             const int64_t *run_ids, struct sb *doc)
{
    size_t cap = 0;
    for (size_t i = 0; i < n; i++)
        if (run_ids[i] > 0)
            cap += jobs[i]->rep->n_members;
    struct seen_key *k = cap ? malloc(cap * sizeof *k) : NULL;
    if (cap && !k)
        return CM_ENOMEM;
    size_t nk = 0, nx = 0;
    for (size_t i = 0; i < n; i++) {
        if (run_ids[i] <= 0)
            continue;
        const struct coord_report *r = jobs[i]->rep;
        nx += r->n_excluded;
        for (size_t m = 0; m < r->n_members; m++) {
            if (!memcmp(r->members[m].pub, r->peer, 32))
                continue; /* a peer does not vouch for itself */
            struct seen_key *e = &k[nk++];
            e->run_id = run_ids[i];
            e->step = r->step;
            memcpy(e->round, r->round, 32);
            memcpy(e->subject, r->members[m].pub, 32);
            e->mn = e->mx = r->members[m].samples;
            e->n = 1;
        }
    }
    int rc = CM_OK;
    if (nk) {
        qsort(k, nk, sizeof *k, seen_cmp);
        doc->len = 0;
        sb_lit(doc, "[");
        for (size_t i = 0; i < nk;) {
            struct seen_key acc = k[i];
            size_t j = i + 1;
            for (; j < nk && seen_cmp(&k[j], &acc) == 0; j++) {
                acc.mn = k[j].mn < acc.mn ? k[j].mn : acc.mn;
                acc.mx = k[j].mx > acc.mx ? k[j].mx : acc.mx;
                acc.n++;
            }
            sb_lit(doc, i ? ",{\"run_id\":" : "{\"run_id\":");
            sb_int(doc, acc.run_id);
            sb_lit(doc, ",\"step\":");
            sb_int(doc, acc.step);
            sb_lit(doc, ",\"round\":");
            sb_hex(doc, acc.round, 32);
            sb_lit(doc, ",\"subject\":");
            sb_hex(doc, acc.subject, 32);
            sb_lit(doc, ",\"mn\":");
            sb_num(doc, acc.mn);
            sb_lit(doc, ",\"mx\":");
            sb_num(doc, acc.mx);
            sb_lit(doc, ",\"n\":");
            sb_int(doc, acc.n);
            sb_lit(doc, "}");
            i = j;
        }
        sb_lit(doc, "]");
        PGresult *r = exec_doc(c, &S_SEEN, doc);
        if (!r)
            rc = CM_EDB;
        PQclear(r);
    }
    if (rc == CM_OK && nx) {
        doc->len = 0;
        sb_lit(doc, "[");
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            if (run_ids[i] <= 0)
                continue;
            const struct coord_report *r = jobs[i]->rep;
            for (size_t x = 0; x < r->n_excluded; x++) {
                sb_lit(doc, any ? ",{\"run_id\":" : "{\"run_id\":");
                sb_int(doc, run_ids[i]);
                sb_lit(doc, ",\"step\":");
                sb_int(doc, r->step);
                sb_lit(doc, ",\"subject\":");
                sb_hex(doc, r->excluded[x].pub, 32);
                sb_lit(doc, ",\"reporter\":");
                sb_hex(doc, r->peer, 32);
                sb_lit(doc, ",\"reason\":");
                sb_str(doc, r->excluded[x].reason, strlen(r->excluded[x].reason));
                sb_lit(doc, "}");
                any = 1;
            }
        }
        sb_lit(doc, "]");
        PGresult *r = exec_doc(c, &S_EXCL, doc);
        if (!r)
            rc = CM_EDB;
        PQclear(r);
    }
    free(k);
    return rc;
}

/* Marks the batch's runs finished whose last step is verified (S_FINISH). */
static int finish_runs(struct coord_db_conn *c, const int64_t *run_ids, size_t n, struct sb *doc)
{
    /* a batch holds reports of a few runs: a short list of distinct ids */
    int64_t seen[64];
    size_t ns = 0;
    doc->len = 0;
    sb_lit(doc, "{");
    for (size_t i = 0; i < n; i++) {
        int dup = !run_ids[i];
        for (size_t j = 0; j < ns && !dup; j++)
            dup = seen[j] == run_ids[i];
        if (dup)
            continue;
        if (ns < sizeof seen / sizeof seen[0])
            seen[ns] = run_ids[i];
        sb_lit(doc, ns++ ? "," : "");
        sb_int(doc, run_ids[i]);
    }
    sb_lit(doc, "}");
    if (!ns)
        return CM_OK;
    if (doc->oom)
        return CM_ENOMEM;
    PGresult *r = exec_doc(c, &S_FINISH, doc);
    if (!r)
        return CM_EDB;
    PQclear(r);
    return CM_OK;
}

/* Stores jobs[0..n) in one transaction and sets each result. CM_OK or an
 * error (then nothing of the batch is stored and results are FAILED). */
static int store_batch(struct coord_db_conn *c, struct coord_report_job **jobs, size_t n,
                       struct sb *doc)
{
    int64_t *run_ids = calloc(n, sizeof *run_ids);
    int *kind = calloc(n, sizeof *kind); /* 0 inserted, 1 to classify, 2 conflict */
    if (!run_ids || !kind) {
        free(run_ids);
        free(kind);
        return CM_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        jobs[i]->result = COORD_REPORT_FAILED;
    int rc = CM_EDB;
    PGresult *r = NULL;
    if (rows_doc(doc, jobs, n, NULL, 0) != CM_OK) {
        rc = CM_ENOMEM;
        goto out;
    }
    if (coord_db_cmd(c, "BEGIN") != CM_OK)
        goto out;
    if (!(r = exec_doc(c, &S_INSERT, doc)))
        goto out;
    /* RETURNING (pass_id, step, run_id): a batch holds one report per (pass, step)
     * at most once inserted, so the pair finds its job. */
    for (int t = 0; t < PQntuples(r); t++) {
        long long pass = strtoll(PQgetvalue(r, t, 0), NULL, 10);
        long long step = strtoll(PQgetvalue(r, t, 1), NULL, 10);
        long long run = strtoll(PQgetvalue(r, t, 2), NULL, 10);
        for (size_t i = 0; i < n; i++)
            if (!run_ids[i] && jobs[i]->pass_id == pass && jobs[i]->rep->step == step) {
                run_ids[i] = run;
                break;
            }
    }
    PQclear(r);
    r = NULL;
    if (fold_observations(c, jobs, n, run_ids, doc) != CM_OK || finish_runs(c, run_ids, n, doc) != CM_OK)
        goto out;
    size_t nrest = 0, nconf = 0;
    for (size_t i = 0; i < n; i++) {
        kind[i] = run_ids[i] ? 0 : 1;
        nrest += kind[i];
    }
    int ok = 1;
    if (nrest) {
        ok = rows_doc(doc, jobs, n, kind, 1) == CM_OK && (r = exec_doc(c, &S_CLASSIFY, doc));
        for (int t = 0; ok && t < PQntuples(r); t++) {
            size_t i = (size_t)strtoull(PQgetvalue(r, t, 0), NULL, 10);
            int pass_known = PQgetvalue(r, t, 1)[0] == 't', pass_ok = PQgetvalue(r, t, 2)[0] == 't';
            int run_ok = PQgetvalue(r, t, 3)[0] == 't', exists = PQgetvalue(r, t, 4)[0] == 't';
            int same = PQgetvalue(r, t, 5)[0] == 't', closed = PQgetvalue(r, t, 6)[0] == 't';
            if (i >= n || kind[i] != 1)
                continue;
            if (exists && same) {
                jobs[i]->result = COORD_REPORT_DUPLICATE;
            } else if (exists) {
                jobs[i]->result = COORD_REPORT_CONFLICT;
                kind[i] = 2;
                nconf++;
            } else if (!pass_known || !pass_ok) {
                jobs[i]->result = COORD_REPORT_REVOKED;
            } else if (!run_ok) {
                jobs[i]->result = COORD_REPORT_NO_RUN;
            } else if (closed) {
                jobs[i]->result = COORD_REPORT_RUN_CLOSED;
            } else {
                jobs[i]->result = COORD_REPORT_STEP_RANGE;
            }
        }
        PQclear(r);
        r = NULL;
    }
    if (ok && nconf) {
        ok = rows_doc(doc, jobs, n, kind, 2) == CM_OK && (r = exec_doc(c, &S_CONFLICT, doc));
        PQclear(r);
        r = NULL;
    }
    if (!ok || coord_db_cmd(c, "COMMIT") != CM_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (run_ids[i])
            jobs[i]->result = COORD_REPORT_RECORDED;
    rc = CM_OK;
out:
    if (rc != CM_OK) {
        PQclear(r);
        coord_db_cmd(c, "ROLLBACK");
        for (size_t i = 0; i < n; i++)
            jobs[i]->result = COORD_REPORT_FAILED;
    }
    free(run_ids);
    free(kind);
    return rc;
}

/* Two reports of one batch for the same (run, step, peer): the second waits
 * for the next batch, where it is a retry or a conflict of the first. */
static size_t split_duplicates(struct coord_report_job **jobs, size_t n,
                               struct coord_report_job **later, size_t *nlater)
{
    size_t k = 0;
    *nlater = 0;
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t j = 0; j < k && !dup; j++)
            dup = jobs[j]->rep->step == jobs[i]->rep->step &&
                  !memcmp(jobs[j]->rep->peer, jobs[i]->rep->peer, 32) &&
                  !strcmp(jobs[j]->rep->run, jobs[i]->rep->run);
        if (dup)
            later[(*nlater)++] = jobs[i];
        else
            jobs[k++] = jobs[i];
    }
    return k;
}

static void write_all(struct coord_report_job **jobs, size_t n)
{
    static struct sb doc; /* the writer thread's, kept between batches */
    struct coord_db_conn *c = NULL;
    if (coord_db_acquire(g_pool, &c) != CM_OK) {
        for (size_t i = 0; i < n; i++)
            jobs[i]->result = COORD_REPORT_FAILED;
        return;
    }
    doc.oom = 0;
    struct coord_report_job **later = malloc(n * sizeof *later);
    size_t nlater = 0, k = n;
    if (later)
        k = split_duplicates(jobs, n, later, &nlater);
    if (store_batch(c, jobs, k, &doc) != CM_OK && k > 1) {
        CM_LOGW("contrib", "a batch of %zu reports failed; storing them one by one", k);
        for (size_t i = 0; i < k; i++) {
            doc.oom = 0;
            store_batch(c, &jobs[i], 1, &doc);
        }
    }
    for (size_t i = 0; i < nlater; i++) { /* rare: the same report twice in one batch */
        doc.oom = 0;
        store_batch(c, &later[i], 1, &doc);
    }
    free(later);
    coord_db_release(g_pool, c);
    if (doc.cap > (8u << 20)) { /* do not keep a huge buffer after a huge batch */
        free(doc.p);
        memset(&doc, 0, sizeof doc);
    }
}

static int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *writer_main(void *arg)
{
    (void)arg;
    struct coord_report_job *taken[BATCH_MAX], *jobs[BATCH_MAX];
    for (;;) {
        pthread_mutex_lock(&g_mu);
        while (!g_head)
            pthread_cond_wait(&g_work, &g_mu);
        size_t n = 0;
        while (g_head && n < BATCH_MAX) {
            taken[n++] = g_head;
            g_head = g_head->next;
        }
        if (!g_head)
            g_tail = NULL;
        pthread_mutex_unlock(&g_mu);

        /* Jobs that waited past their deadline are answered FAILED (503,
         * retry) unwritten: their callers' clients have given up or will. */
        int64_t t0 = mono_ns();
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            taken[i]->result = COORD_REPORT_FAILED;
            if (taken[i]->deadline_ns > t0)
                jobs[k++] = taken[i];
        }
        if (k < n)
            CM_LOGW("contrib", "%zu reports waited past their deadline in the queue", n - k);
        if (k)
            write_all(jobs, k);
        CM_LOGD("contrib", "batch of %zu reports stored in %.1f ms", k,
                (double)(mono_ns() - t0) / 1e6);
        for (size_t i = 0; i < n; i++) {
            struct coord_report_job *j = taken[i];
            j->next = NULL;
            j->done(j, j->arg); /* j may be gone after this */
        }
    }
    return NULL;
}

static void start_writer(void)
{
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, writer_main, NULL) == 0)
        g_started = 1;
    else
        CM_LOGE("contrib", "could not start the report writer thread");
    pthread_attr_destroy(&at);
}

int coord_report_submit(struct coord_db_pool *pool, struct coord_report_job *job, int timeout_ms,
                        void (*done)(struct coord_report_job *job, void *arg), void *arg)
{
    job->result = COORD_REPORT_FAILED;
    pthread_mutex_lock(&g_mu);
    if (!g_pool)
        g_pool = pool;
    pthread_mutex_unlock(&g_mu);
    pthread_once(&g_once, start_writer);
    if (!g_started)
        return CM_EINTERNAL;
    job->done = done;
    job->arg = arg;
    job->deadline_ns = mono_ns() + (int64_t)timeout_ms * 1000000;
    job->next = NULL;
    pthread_mutex_lock(&g_mu);
    if (g_tail)
        g_tail->next = job;
    else
        g_head = job;
    g_tail = job;
    pthread_cond_signal(&g_work);
    pthread_mutex_unlock(&g_mu);
    return CM_OK;
}

/* --- the synchronous form ------------------------------------------------- */

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
};

static void wake(struct coord_report_job *job, void *arg)
{
    (void)job;
    struct waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int coord_report_write(struct coord_db_pool *pool, struct coord_report_job *job, int timeout_ms)
{
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int rc = coord_report_submit(pool, job, timeout_ms, wake, &w);
    if (rc != CM_OK)
        return rc;
    /* Bounded: the writer answers every job, FAILED past its deadline, and
     * a batch it has taken is bounded by the statement timeout. */
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return CM_OK;
}
