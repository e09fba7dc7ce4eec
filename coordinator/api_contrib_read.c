/* Reading contribution accounting (docs/accounting.md): totals per user and
 * per device for auditors and organizers (JSON or CSV), per-step detail,
 * flagged peers, a volunteer's own totals, and the public learning curve
 * and run health. Everything reads the SQL views of
 * sql/005_contributions.sql, so psql and the API give the same numbers. */
#include "coordinator/api.h"
#include "cm_err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- helpers ----------------------------------------------------------------- */

/* Optional integer query argument in [lo, hi]: 1 and *out (or buf = NULL when
 * absent) on success; 0 with a 400 set when malformed. */
static int q_int(struct coord_req *req, struct coord_resp *resp, const char *key, long long lo,
                 long long hi, char buf[24], const char **out)
{
    const char *v = coord_req_query(req, key);
    *out = NULL;
    if (!v)
        return 1;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        coord_resp_error(resp, 400, "invalid_request", "query '%s': an integer from %lld to %lld",
                         key, lo, hi);
        return 0;
    }
    snprintf(buf, 24, "%lld", x);
    *out = buf;
    return 1;
}

static PGresult *run_query(struct coord_req *req, struct coord_resp *resp, struct coord_db_stmt *s,
                           const char *const *p)
{
    if (!coord_req_db(req, resp))
        return NULL;
    PGresult *r = coord_db_exec(req->db, s, p, NULL);
    if (!r)
        coord_resp_error(resp, 500, "internal", "database error");
    return r;
}

COORD_DB_STMT(S_RUN, 1, "SELECT id, config->'steps' FROM runs WHERE name = $1");

/* 1 when the run exists; sets 404 otherwise. */
static int run_exists(struct coord_req *req, struct coord_resp *resp, long long *total_steps)
{
    if (!api_name_param(req, resp, 0, "run"))
        return 0;
    const char *p[] = {req->params[0]};
    PGresult *r = run_query(req, resp, &S_RUN, p);
    if (!r)
        return 0;
    int ok = PQntuples(r) == 1;
    if (ok && total_steps) {
        const char *v = PQgetvalue(r, 0, 1);
        char *end = NULL;
        long long x = PQgetisnull(r, 0, 1) ? -1 : strtoll(v, &end, 10);
        *total_steps = (end && *end == '\0' && x > 0) ? x : -1;
    }
    PQclear(r);
    if (!ok)
        coord_resp_error(resp, 404, "not_found", "no such run");
    return ok;
}

static double dbl(PGresult *r, int i, int c)
{
    return strtod(PQgetvalue(r, i, c), NULL);
}

static json_int_t lng(PGresult *r, int i, int c)
{
    return (json_int_t)strtoll(PQgetvalue(r, i, c), NULL, 10);
}

static json_t *dbl_or_null(PGresult *r, int i, int c)
{
    return PQgetisnull(r, i, c) ? json_null() : json_real(dbl(r, i, c));
}

/* Hex (from SQL) to base64url (for JSON); "" when malformed. */
static void key_b64(const char *hex, char out[48])
{
    uint8_t raw[CM_ED25519_PUB_LEN];
    size_t n = 0;
    out[0] = '\0';
    if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) == CM_OK && n == sizeof raw)
        cm_b64url_encode(raw, sizeof raw, out);
}

/* A growing text buffer for CSV. */
struct csv {
    char *p;
    size_t len, cap;
    int oom;
};

static void csv_printf(struct csv *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void csv_printf(struct csv *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = (b->cap + (size_t)n + 1) * 2;
        char *q = realloc(b->p, ncap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = ncap;
    }
}

/* RFC 4180 field: quoted when it holds a comma, quote or line break; a
 * leading = + - @ is prefixed with ' so spreadsheets do not run it. */
static void csv_field(struct csv *b, const char *s, int last)
{
    int quote = strpbrk(s, ",\"\r\n") != NULL;
    int guard = strchr("=+-@", s[0]) && s[0];
    if (quote || guard) {
        csv_printf(b, "\"%s", guard ? "'" : "");
        for (const char *c = s; *c; c++)
            csv_printf(b, *c == '"' ? "\"\"" : "%c", *c);
        csv_printf(b, "\"");
    } else {
        csv_printf(b, "%s", s);
    }
    csv_printf(b, last ? "\r\n" : ",");
}

static void csv_value(struct csv *b, json_t *v, int last)
{
    char tmp[64];
    if (json_is_string(v)) {
        csv_field(b, json_string_value(v), last);
        return;
    }
    if (json_is_integer(v))
        snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(tmp, sizeof tmp, "%.17g", json_real_value(v));
    else if (json_is_true(v))
        snprintf(tmp, sizeof tmp, "true");
    else if (json_is_false(v))
        snprintf(tmp, sizeof tmp, "false");
    else
        tmp[0] = '\0';
    csv_field(b, tmp, last);
}

/* Writes rows (objects) as CSV with the given columns. */
static void csv_respond(struct coord_resp *resp, const char *const *cols, size_t ncols,
                        json_t *rows)
{
    struct csv b = {0};
    for (size_t c = 0; c < ncols; c++)
        csv_field(&b, cols[c], c + 1 == ncols);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) for (size_t c = 0; c < ncols; c++)
        csv_value(&b, json_object_get(row, cols[c]), c + 1 == ncols);
    if (b.oom) {
        free(b.p);
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    coord_resp_raw(resp, 200, "text/csv; charset=utf-8", b.p ? b.p : "", b.len);
    free(b.p);
}

static int wants_csv(struct coord_req *req, struct coord_resp *resp, int *csv)
{
    const char *f = coord_req_query(req, "format");
    const char *accept = coord_req_header(req, "Accept");
    if (f && strcmp(f, "csv") != 0 && strcmp(f, "json") != 0) {
        coord_resp_error(resp, 400, "invalid_request", "query 'format': 'json' or 'csv'");
        return 0;
    }
    *csv = f ? !strcmp(f, "csv") : (accept && strstr(accept, "text/csv") != NULL);
    return 1;
}

/* --- totals -------------------------------------------------------------------- */

#define TOTAL_COLS                                                                          \
    "count(*), count(DISTINCT step), sum(claimed_samples), sum(verified_samples), "         \
    "sum(compute_s), count(*) FILTER (WHERE inflated), "                                    \
    "extract(epoch from min(received_at))::bigint, extract(epoch from max(received_at))::bigint"

COORD_DB_STMT(S_TOTALS, 5,
              "SELECT GROUPING(username, peer_public_key), username, encode(peer_public_key, 'hex'), "
              "count(DISTINCT peer_public_key), count(DISTINCT username), " TOTAL_COLS
              " FROM contrib_claims WHERE run = $1 "
              "AND ($2::bigint IS NULL OR received_at >= to_timestamp($2::bigint)) "
              "AND ($3::bigint IS NULL OR received_at < to_timestamp($3::bigint)) "
              "AND ($4::bigint IS NULL OR step >= $4::bigint) "
              "AND ($5::bigint IS NULL OR step <= $5::bigint) "
              "GROUP BY GROUPING SETS ((username, peer_public_key), (username), ()) "
              "ORDER BY 1, 9 DESC, 2, 3");

/* Fills the shared total fields from columns starting at c (TOTAL_COLS). */
static void totals_fill(json_t *o, PGresult *r, int i, int c)
{
    json_object_set_new(o, "reports", json_integer(lng(r, i, c)));
    json_object_set_new(o, "steps", json_integer(lng(r, i, c + 1)));
    json_object_set_new(o, "claimed_samples", json_real(dbl(r, i, c + 2)));
    json_object_set_new(o, "verified_samples", json_real(dbl(r, i, c + 3)));
    json_object_set_new(o, "compute_s", json_real(dbl(r, i, c + 4)));
    json_object_set_new(o, "flagged_reports", json_integer(lng(r, i, c + 5)));
    json_object_set_new(o, "first_at", json_integer(lng(r, i, c + 6)));
    json_object_set_new(o, "last_at", json_integer(lng(r, i, c + 7)));
}

static json_t *param_json(const char *v)
{
    return v ? json_integer(strtoll(v, NULL, 10)) : json_null();
}

void api_contrib_list(struct coord_req *req, struct coord_resp *resp)
{
    char b[4][24];
    const char *from, *to, *sf, *st;
    int csv = 0;
    const char *by = coord_req_query(req, "by");
    if (!wants_csv(req, resp, &csv) || !q_int(req, resp, "from", 0, 1LL << 40, b[0], &from) ||
        !q_int(req, resp, "to", 0, 1LL << 40, b[1], &to) ||
        !q_int(req, resp, "step_from", 0, 1LL << 53, b[2], &sf) ||
        !q_int(req, resp, "step_to", 0, 1LL << 53, b[3], &st))
        return;
    if (by && strcmp(by, "peer") != 0 && strcmp(by, "user") != 0) {
        coord_resp_error(resp, 400, "invalid_request", "query 'by': 'peer' or 'user'");
        return;
    }
    if (!run_exists(req, resp, NULL))
        return;
    const char *p[] = {req->params[0], from, to, sf, st};
    PGresult *r = run_query(req, resp, &S_TOTALS, p);
    if (!r)
        return;
    json_t *users = json_array(), *peers = json_array();
    json_t *totals = json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:I}", "reports",
                               (json_int_t)0, "peers", (json_int_t)0, "users", (json_int_t)0,
                               "steps", (json_int_t)0, "claimed_samples", 0.0, "verified_samples",
                               0.0, "compute_s", 0.0, "flagged_reports", (json_int_t)0);
    for (int i = 0; i < PQntuples(r); i++) {
        int grouping = atoi(PQgetvalue(r, i, 0));
        json_t *o = json_object();
        totals_fill(o, r, i, 5);
        if (grouping == 0) { /* (username, peer) */
            char k[48];
            key_b64(PQgetvalue(r, i, 2), k);
            json_object_set_new(o, "peer_public_key", json_string(k));
            json_object_set_new(o, "username", json_string(PQgetvalue(r, i, 1)));
            json_array_append_new(peers, o);
        } else if (grouping == 1) { /* (username) */
            json_object_set_new(o, "username", json_string(PQgetvalue(r, i, 1)));
            json_object_set_new(o, "peers", json_integer(lng(r, i, 3)));
            json_array_append_new(users, o);
        } else { /* () */
            json_object_del(o, "first_at");
            json_object_del(o, "last_at");
            json_object_set_new(o, "peers", json_integer(lng(r, i, 3)));
            json_object_set_new(o, "users", json_integer(lng(r, i, 4)));
            json_decref(totals);
            totals = o;
        }
    }
    PQclear(r);
    if (api_contrib_experts_list(req, p, users, peers, totals) != CM_OK) {
        json_decref(users);
        json_decref(peers);
        json_decref(totals);
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (csv) {
        static const char *const PEER_COLS[] = {
            "username", "peer_public_key", "reports", "steps", "claimed_samples",
            "verified_samples", "compute_s", "flagged_reports", "first_at", "last_at",
            "expert_samples", "expert_samples_clipped"};
        static const char *const USER_COLS[] = {
            "username", "peers", "reports", "steps", "claimed_samples",
            "verified_samples", "compute_s", "flagged_reports", "first_at", "last_at",
            "expert_samples", "expert_samples_clipped"};
        if (by && !strcmp(by, "user"))
            csv_respond(resp, USER_COLS, 12, users);
        else
            csv_respond(resp, PEER_COLS, 12, peers);
        json_decref(users);
        json_decref(peers);
        json_decref(totals);
        return;
    }
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "run", req->params[0],
                              "from", param_json(from), "to", param_json(to), "step_from",
                              param_json(sf), "step_to", param_json(st), "totals", totals,
                              "users", users, "peers", peers));
}

/* --- per step ------------------------------------------------------------------ */

COORD_DB_STMT(S_STEPS, 6,
              "SELECT step, encode(peer_public_key, 'hex'), username, group_id, encode(round_id, 'hex'), "
              "claimed_samples, verified_samples, observers, seen_min, seen_max, inflated, excluded, "
              "compute_s, loss, sps, round_ms, parts, parts_averaged, "
              "extract(epoch from received_at)::bigint FROM contrib_claims WHERE run = $1 "
              "AND ($2::bigint IS NULL OR step >= $2::bigint) AND ($3::bigint IS NULL OR step <= $3::bigint) "
              "AND ($4::text IS NULL OR username = $4) "
              "AND ($5::text IS NULL OR peer_public_key = decode($5, 'hex')) "
              "ORDER BY step, peer_public_key LIMIT $6::bigint + 1");

void api_contrib_steps(struct coord_req *req, struct coord_resp *resp)
{
    char b[3][24];
    const char *from, *to, *lim;
    int csv = 0;
    if (!wants_csv(req, resp, &csv) || !q_int(req, resp, "from", 0, 1LL << 53, b[0], &from) ||
        !q_int(req, resp, "to", 0, 1LL << 53, b[1], &to) ||
        !q_int(req, resp, "limit", 1, 100000, b[2], &lim))
        return;
    const char *user = coord_req_query(req, "user");
    const char *peer = coord_req_query(req, "peer");
    if (user && !cm_name_valid(user)) {
        coord_resp_error(resp, 400, "invalid_request", "query 'user': a username");
        return;
    }
    char peer_hex[65];
    if (peer) {
        uint8_t raw[CM_ED25519_PUB_LEN];
        size_t n = 0;
        if (cm_b64url_decode(peer, strlen(peer), raw, sizeof raw, &n) != CM_OK || n != sizeof raw) {
            coord_resp_error(resp, 400, "invalid_request", "query 'peer': a base64url public key");
            return;
        }
        cm_hex_encode(raw, sizeof raw, peer_hex);
    }
    if (!run_exists(req, resp, NULL))
        return;
    long long limit = lim ? strtoll(lim, NULL, 10) : 10000;
    char lims[24];
    snprintf(lims, sizeof lims, "%lld", limit);
    const char *p[] = {req->params[0], from, to, user, peer ? peer_hex : NULL, lims};
    PGresult *r = run_query(req, resp, &S_STEPS, p);
    if (!r)
        return;
    json_t *rows = json_array();
    int nt = PQntuples(r);
    for (int i = 0; i < nt && i < limit; i++) {
        char k[48];
        key_b64(PQgetvalue(r, i, 1), k);
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(lng(r, i, 0)));
        json_object_set_new(o, "peer_public_key", json_string(k));
        json_object_set_new(o, "username", json_string(PQgetvalue(r, i, 2)));
        json_object_set_new(o, "group", json_string(PQgetvalue(r, i, 3)));
        json_object_set_new(o, "round", json_string(PQgetvalue(r, i, 4)));
        json_object_set_new(o, "claimed_samples", json_real(dbl(r, i, 5)));
        json_object_set_new(o, "verified_samples", json_real(dbl(r, i, 6)));
        json_object_set_new(o, "observers", json_integer(lng(r, i, 7)));
        json_object_set_new(o, "seen_min", dbl_or_null(r, i, 8));
        json_object_set_new(o, "seen_max", dbl_or_null(r, i, 9));
        json_object_set_new(o, "inflated", json_boolean(PQgetvalue(r, i, 10)[0] == 't'));
        json_object_set_new(o, "excluded", json_boolean(PQgetvalue(r, i, 11)[0] == 't'));
        json_object_set_new(o, "compute_s", json_real(dbl(r, i, 12)));
        json_object_set_new(o, "loss", dbl_or_null(r, i, 13));
        json_object_set_new(o, "sps", json_real(dbl(r, i, 14)));
        json_object_set_new(o, "round_ms", json_real(dbl(r, i, 15)));
        json_object_set_new(o, "parts", json_integer(lng(r, i, 16)));
        json_object_set_new(o, "parts_averaged", json_integer(lng(r, i, 17)));
        json_object_set_new(o, "received_at", json_integer(lng(r, i, 18)));
        json_array_append_new(rows, o);
    }
    PQclear(r);
    if (csv) {
        static const char *const COLS[] = {
            "step", "peer_public_key", "username", "group", "round", "claimed_samples",
            "verified_samples", "observers", "seen_min", "seen_max", "inflated", "excluded",
            "compute_s", "loss", "sps", "round_ms", "parts", "parts_averaged", "received_at"};
        csv_respond(resp, COLS, sizeof COLS / sizeof COLS[0], rows);
        json_decref(rows);
        return;
    }
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:o}", "run", req->params[0], "truncated", nt > limit,
                              "rows", rows));
}

/* --- flags ----------------------------------------------------------------------- */

/* The username bound to a peer key in a run: the newest pass for it. */
#define KEY_USER(k)                                                                           \
    "(SELECT u.username FROM passes p JOIN users u ON u.id = p.user_id WHERE p.run_id = " \
    "(SELECT id FROM rr) AND p.peer_public_key = " k " ORDER BY p.id DESC LIMIT 1)"

/* xa: a trainer's expert attestations that a cap clipped (per report) or
 * that named no pass holder of the run (docs/accounting.md, "Expert
 * servers"). */
COORD_DB_STMT(S_FLAG_PEERS, 1,
              "WITH rr AS (SELECT id FROM runs WHERE name = $1), "
              "ex AS (SELECT subject AS pk, count(*) AS n, count(DISTINCT reporter) AS nb, max(at) AS last "
              "  FROM contrib_exclusions WHERE run_id = (SELECT id FROM rr) GROUP BY subject), "
              "inf AS (SELECT peer_public_key AS pk, count(*) AS n, max(received_at) AS last "
              "  FROM contrib_claims WHERE run_id = (SELECT id FROM rr) AND inflated GROUP BY 1), "
              "cf AS (SELECT peer_public_key AS pk, count(*) AS n, max(received_at) AS last "
              "  FROM contrib_conflicts WHERE run_id = (SELECT id FROM rr) GROUP BY 1), "
              "xa AS (SELECT trainer AS pk, count(DISTINCT report_id) FILTER (WHERE clipped_report) AS nc, "
              "  coalesce(sum(clipped), 0) AS sc, count(*) FILTER (WHERE NOT known) AS ni, "
              "  max(received_at) AS last FROM contrib_expert_attestations "
              "  WHERE run_id = (SELECT id FROM rr) AND (clipped_report OR NOT known) GROUP BY 1), "
              "k AS (SELECT pk FROM ex UNION SELECT pk FROM inf UNION SELECT pk FROM cf "
              "  UNION SELECT pk FROM xa) "
              "SELECT encode(k.pk, 'hex'), " KEY_USER("k.pk") ", coalesce(ex.n, 0), coalesce(ex.nb, 0), "
              "coalesce(inf.n, 0), coalesce(cf.n, 0), "
              "extract(epoch from greatest(ex.last, inf.last, cf.last, xa.last))::bigint, "
              "coalesce(xa.nc, 0), coalesce(xa.sc, 0), coalesce(xa.ni, 0) "
              "FROM k LEFT JOIN ex ON ex.pk = k.pk LEFT JOIN inf ON inf.pk = k.pk "
              "LEFT JOIN cf ON cf.pk = k.pk LEFT JOIN xa ON xa.pk = k.pk "
              "ORDER BY coalesce(ex.n, 0) + coalesce(inf.n, 0) + coalesce(cf.n, 0) "
              "  + coalesce(xa.nc, 0) + coalesce(xa.ni, 0) DESC, 1");

COORD_DB_STMT(S_FLAG_EXCL, 1,
              "WITH rr AS (SELECT id FROM runs WHERE name = $1) "
              "SELECT e.step, encode(e.reporter, 'hex'), " KEY_USER("e.reporter") ", "
              "encode(e.subject, 'hex'), " KEY_USER("e.subject") ", e.reason, "
              "extract(epoch from e.at)::bigint FROM contrib_exclusions e "
              "WHERE e.run_id = (SELECT id FROM rr) ORDER BY e.at DESC, e.step DESC LIMIT 1000");

static json_t *str_or_null(PGresult *r, int i, int c)
{
    return PQgetisnull(r, i, c) ? json_null() : json_string(PQgetvalue(r, i, c));
}

void api_contrib_flags(struct coord_req *req, struct coord_resp *resp)
{
    if (!run_exists(req, resp, NULL))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r = run_query(req, resp, &S_FLAG_PEERS, p);
    if (!r)
        return;
    json_t *peers = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        char k[48];
        key_b64(PQgetvalue(r, i, 0), k);
        json_array_append_new(
            peers, json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I}",
                             "peer_public_key", k, "username", str_or_null(r, i, 1),
                             "excluded_reports", lng(r, i, 2), "excluded_by", lng(r, i, 3),
                             "inflated_claims", lng(r, i, 4), "conflicting_duplicates",
                             lng(r, i, 5), "last_at", lng(r, i, 6), "clipped_expert_reports",
                             lng(r, i, 7), "clipped_expert_samples", dbl(r, i, 8),
                             "ignored_expert_attestations", lng(r, i, 9)));
    }
    PQclear(r);
    if (!(r = run_query(req, resp, &S_FLAG_EXCL, p))) {
        json_decref(peers);
        return;
    }
    json_t *ex = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        char rk[48], sk[48];
        key_b64(PQgetvalue(r, i, 1), rk);
        key_b64(PQgetvalue(r, i, 3), sk);
        json_array_append_new(
            ex, json_pack("{s:I, s:s, s:o, s:s, s:o, s:s, s:I}", "step", lng(r, i, 0), "reporter",
                          rk, "reporter_username", str_or_null(r, i, 2), "peer_public_key", sk,
                          "username", str_or_null(r, i, 4), "reason", PQgetvalue(r, i, 5), "at",
                          lng(r, i, 6)));
    }
    PQclear(r);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:o, s:o}", "run", req->params[0], "peers", peers,
                              "exclusions", ex));
}

/* --- a volunteer's own ------------------------------------------------------------- */

COORD_DB_STMT(S_ME, 1,
              "SELECT GROUPING(peer_public_key), run, encode(peer_public_key, 'hex'), " TOTAL_COLS
              " FROM contrib_claims WHERE user_id = $1 "
              "GROUP BY GROUPING SETS ((run, peer_public_key), (run)) ORDER BY run, 1 DESC, 3");

void api_me_contrib(struct coord_req *req, struct coord_resp *resp)
{
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {uid};
    PGresult *r = run_query(req, resp, &S_ME, p);
    if (!r)
        return;
    json_t *runs = json_array(), *cur = NULL;
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *o = json_object();
        totals_fill(o, r, i, 3);
        if (atoi(PQgetvalue(r, i, 0)) == 1) { /* per run, sorted before its peers */
            json_object_set_new(o, "run", json_string(PQgetvalue(r, i, 1)));
            json_object_set_new(o, "peers", json_array());
            json_array_append_new(runs, o);
            cur = o;
        } else if (cur) {
            char k[48];
            key_b64(PQgetvalue(r, i, 2), k);
            json_object_set_new(o, "peer_public_key", json_string(k));
            json_array_append_new(json_object_get(cur, "peers"), o);
        } else {
            json_decref(o);
        }
    }
    PQclear(r);
    if (api_contrib_experts_me(req, uid, runs) != CM_OK) {
        json_decref(runs);
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:o}", "username", req->user.username, "runs", runs));
}

/* --- learning curve ------------------------------------------------------------------ */

/* Public figures count verified claims only (docs/accounting.md,
 * "Learning curve and health"): one volunteer's unverified report moves
 * neither the curve nor the run's step. */
COORD_DB_STMT(S_CURVE_RANGE, 3,
              "SELECT min(c.step), max(c.step) FROM contrib_claims c "
              "WHERE c.run = $1 AND c.verified_samples > 0 AND ($2::bigint IS NULL OR c.step >= $2::bigint) "
              "AND ($3::bigint IS NULL OR c.step <= $3::bigint)");

COORD_DB_STMT(S_CURVE, 4,
              "WITH s AS (SELECT c.step, "
              "  sum(c.loss * c.verified_samples) FILTER (WHERE c.loss IS NOT NULL) AS ls, "
              "  sum(c.verified_samples) FILTER (WHERE c.loss IS NOT NULL) AS ws, "
              "  sum(c.sop_loss * c.verified_samples) FILTER (WHERE c.sop_loss IS NOT NULL) AS sls, "
              "  sum(c.verified_samples) FILTER (WHERE c.sop_loss IS NOT NULL) AS sws, "
              "  sum(c.mlm_accuracy * c.verified_samples) FILTER (WHERE c.mlm_accuracy IS NOT NULL) AS mas, "
              "  sum(c.verified_samples) FILTER (WHERE c.mlm_accuracy IS NOT NULL) AS mws, "
              "  sum(c.verified_samples) AS samples, count(*) AS peers, min(c.received_at) AS t "
              "  FROM contrib_claims c WHERE c.run = $1 AND c.verified_samples > 0 "
              "  AND c.step BETWEEN $2::bigint AND $3::bigint GROUP BY c.step) "
              "SELECT max(step), sum(ls) / nullif(sum(ws), 0), sum(samples) / count(*), "
              "sum(peers)::float8 / count(*), extract(epoch from min(t))::bigint, count(*), "
              "sum(sls) / nullif(sum(sws), 0), sum(mas) / nullif(sum(mws), 0) "
              "FROM s GROUP BY (step - $2::bigint) / $4::bigint ORDER BY 1");

void api_run_curve(struct coord_req *req, struct coord_resp *resp)
{
    char b[3][24];
    const char *from, *to, *mp;
    if (!q_int(req, resp, "from", 0, 1LL << 53, b[0], &from) ||
        !q_int(req, resp, "to", 0, 1LL << 53, b[1], &to) ||
        !q_int(req, resp, "max_points", 1, 10000, b[2], &mp) || !run_exists(req, resp, NULL))
        return;
    long long max_points = mp ? strtoll(mp, NULL, 10) : 1000;
    const char *p[] = {req->params[0], from, to};
    PGresult *r = run_query(req, resp, &S_CURVE_RANGE, p);
    if (!r)
        return;
    json_t *points = json_array();
    long long bucket = 1, steps = 0;
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        long long lo = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        long long hi = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        PQclear(r);
        bucket = (hi - lo + max_points) / max_points; /* ceil((hi - lo + 1) / max_points) */
        if (bucket < 1)
            bucket = 1;
        char los[24], his[24], bs[24];
        snprintf(los, sizeof los, "%lld", lo);
        snprintf(his, sizeof his, "%lld", hi);
        snprintf(bs, sizeof bs, "%lld", bucket);
        const char *q[] = {req->params[0], los, his, bs};
        if (!(r = run_query(req, resp, &S_CURVE, q))) {
            json_decref(points);
            return;
        }
        for (int i = 0; i < PQntuples(r); i++) {
            /* sop_loss and mlm_accuracy: null for a step whose reports
               had none (models without ALBERT's heads) */
            json_array_append_new(
                points, json_pack("{s:I, s:o, s:o, s:o, s:f, s:f, s:I}", "step", lng(r, i, 0), "loss",
                                  dbl_or_null(r, i, 1), "sop_loss", dbl_or_null(r, i, 6),
                                  "mlm_accuracy", dbl_or_null(r, i, 7), "samples", dbl(r, i, 2),
                                  "peers", dbl(r, i, 3), "t", lng(r, i, 4)));
            steps += lng(r, i, 5);
        }
    }
    PQclear(r);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:I, s:I, s:o}", "run", req->params[0], "steps",
                              (json_int_t)steps, "bucket", (json_int_t)bucket, "points", points));
}

/* --- run health --------------------------------------------------------------------- */

COORD_DB_STMT(S_STATS_TOTALS, 2,
              "SELECT count(*), count(DISTINCT peer_public_key), count(DISTINCT user_id), "
              "coalesce(sum(claimed_samples), 0), coalesce(sum(verified_samples), 0), "
              "coalesce(sum(compute_s), 0), max(step) FILTER (WHERE verified_samples > 0), "
              "count(*) FILTER (WHERE parts_averaged < parts AND verified_samples > 0), "
              "coalesce(sum(verified_samples) FILTER (WHERE received_at >= now() - make_interval(secs => $2::int)), 0), "
              "avg(round_ms) FILTER (WHERE verified_samples > 0 AND received_at >= now() - make_interval(secs => $2::int)), "
              "count(*) FILTER (WHERE parts_averaged < parts AND verified_samples > 0 "
              "  AND received_at >= now() - make_interval(secs => $2::int)) "
              "FROM contrib_claims WHERE run = $1");

/* Live peers (capability reports), those whose rounds keep averaging
   nothing, the most such rounds in a row and one peer's reason. */
COORD_DB_STMT(S_STATS_AVERAGING, 1,
              "SELECT count(*), count(*) FILTER (WHERE (c.report->>'failing_rounds')::bigint > 0), "
              "coalesce(max((c.report->>'failing_rounds')::bigint), 0), "
              "(SELECT x.report->>'failing_reason' FROM capabilities x WHERE x.run_id = r.id AND "
              " x.expires_at > now() AND (x.report->>'failing_rounds')::bigint > 0 "
              " ORDER BY (x.report->>'failing_rounds')::bigint DESC LIMIT 1) "
              "FROM runs r LEFT JOIN capabilities c ON c.run_id = r.id AND c.expires_at > now() "
              "WHERE r.name = $1 GROUP BY r.id");

/* Steps first verified-reported in the window: how many, and the time they span. */
COORD_DB_STMT(S_STATS_RATE, 2,
              "SELECT count(*), extract(epoch from max(t) - min(t)) FROM ("
              "SELECT step, min(received_at) AS t FROM contrib_claims "
              "WHERE run = $1 AND verified_samples > 0 "
              "AND received_at >= now() - make_interval(secs => $2::int) GROUP BY step) s");

COORD_DB_STMT(S_STATS_ACTIVE, 2,
              "SELECT extract(epoch from date_trunc('minute', received_at))::bigint, "
              "count(DISTINCT peer_public_key), count(*), sum(verified_samples) FROM contrib_claims "
              "WHERE run = $1 AND verified_samples > 0 "
              "AND received_at >= now() - make_interval(hours => $2::int) GROUP BY 1 ORDER BY 1");

void api_run_stats(struct coord_req *req, struct coord_resp *resp)
{
    char b[2][24];
    const char *hours, *window;
    long long total_steps = -1;
    if (!q_int(req, resp, "hours", 1, 48, b[0], &hours) ||
        !q_int(req, resp, "window", 10, 86400, b[1], &window) ||
        !run_exists(req, resp, &total_steps))
        return;
    if (!hours)
        hours = "1";
    if (!window)
        window = "300";
    double win = strtod(window, NULL);
    const char *p[] = {req->params[0], window};
    PGresult *r = run_query(req, resp, &S_STATS_TOTALS, p);
    if (!r)
        return;
    json_t *out = json_pack("{s:s, s:I, s:I}", "run", req->params[0], "generated_at",
                            (json_int_t)time(NULL), "window_s", (json_int_t)win);
    json_object_set_new(out, "totals",
                        json_pack("{s:I, s:I, s:I, s:f, s:f, s:f}", "reports", lng(r, 0, 0),
                                  "peers", lng(r, 0, 1), "users", lng(r, 0, 2), "claimed_samples",
                                  dbl(r, 0, 3), "verified_samples", dbl(r, 0, 4), "compute_s",
                                  dbl(r, 0, 5)));
    long long current = PQgetisnull(r, 0, 6) ? -1 : strtoll(PQgetvalue(r, 0, 6), NULL, 10);
    json_object_set_new(out, "current_step", current >= 0 ? json_integer(current) : json_null());
    json_object_set_new(out, "total_steps",
                        total_steps > 0 ? json_integer(total_steps) : json_null());
    json_object_set_new(out, "round_failures",
                        json_pack("{s:I, s:I}", "window", lng(r, 0, 10), "total", lng(r, 0, 7)));
    json_object_set_new(out, "samples_per_s", json_real(dbl(r, 0, 8) / win));
    json_object_set_new(out, "avg_round_ms", dbl_or_null(r, 0, 9));
    PQclear(r);

    if (!(r = run_query(req, resp, &S_STATS_RATE, p))) {
        json_decref(out);
        return;
    }
    long long nsteps = lng(r, 0, 0);
    double span = PQgetisnull(r, 0, 1) ? 0 : dbl(r, 0, 1);
    PQclear(r);
    double sps = nsteps >= 2 && span > 0 ? (double)(nsteps - 1) / span : 0;
    json_object_set_new(out, "steps_per_s", sps > 0 ? json_real(sps) : json_null());
    json_object_set_new(out, "eta_s",
                        sps > 0 && total_steps > 0 && current >= 0
                            ? json_real(fmax(0, (double)(total_steps - current)) / sps)
                            : json_null());

    const char *ap[] = {req->params[0]};
    if (!(r = run_query(req, resp, &S_STATS_AVERAGING, ap))) {
        json_decref(out);
        return;
    }
    long long live = PQntuples(r) ? lng(r, 0, 0) : 0, failing = PQntuples(r) ? lng(r, 0, 1) : 0;
    json_t *avg = json_pack("{s:I, s:I, s:I, s:b}", "live_peers", live, "failing_peers", failing,
                            "failing_rounds", PQntuples(r) ? lng(r, 0, 2) : 0, "not_averaging", failing > 0);
    if (failing > 0 && !PQgetisnull(r, 0, 3))
        json_object_set_new(avg, "reason", json_string(PQgetvalue(r, 0, 3)));
    PQclear(r);
    json_object_set_new(out, "averaging", avg);

    const char *q[] = {req->params[0], hours};
    if (!(r = run_query(req, resp, &S_STATS_ACTIVE, q))) {
        json_decref(out);
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(a, json_pack("{s:I, s:I, s:I, s:f}", "t", lng(r, i, 0), "peers",
                                           lng(r, i, 1), "reports", lng(r, i, 2), "samples",
                                           dbl(r, i, 3)));
    PQclear(r);
    json_object_set_new(out, "active_peers", a);
    coord_resp_json(resp, 200, out);
}
