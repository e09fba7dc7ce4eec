/* Expert servers' credit in the auditor API (docs/accounting.md, "Expert
 * servers"; seed 002_2b00836ea4b30f79.txt §3.3). Servers send no reports:
 * trainers attest for them, and the view contrib_expert_attestations
 * (sql/011_expert_credit.sql) says what each attestation credits. These
 * helpers add `expert_samples` (verified) and `expert_samples_clipped`
 * (what the caps removed) to the documents that api_contrib_read.c builds
 * from the trainers' reports: every row gets both, and a server owner who
 * never reported gets a row of their own after the reporters. */
#include "coordinator/api.h"
#include "cm_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The owner of a server key in a run: its newest pass there. */
#define OWNER(a)                                                                      \
    "(SELECT p.user_id FROM passes p WHERE p.run_id = " a ".run_id AND "               \
    "p.peer_public_key = " a ".server ORDER BY p.id DESC LIMIT 1)"

/* $1 run, $2 $3 receive time [from, to), $4 $5 steps [from, to] of the
 * attesting reports (the same filters as the reports' totals). */
COORD_DB_STMT(S_X_LIST, 5,
              "SELECT GROUPING(u.username, a.server), u.username, encode(a.server, 'hex'), "
              "coalesce(sum(a.credited), 0), coalesce(sum(a.clipped), 0), "
              "extract(epoch from min(a.received_at))::bigint, "
              "extract(epoch from max(a.received_at))::bigint "
              "FROM contrib_expert_attestations a JOIN users u ON u.id = " OWNER("a") " "
              "WHERE a.run = $1 AND a.known AND a.report_verified "
              "AND ($2::bigint IS NULL OR a.received_at >= to_timestamp($2::bigint)) "
              "AND ($3::bigint IS NULL OR a.received_at < to_timestamp($3::bigint)) "
              "AND ($4::bigint IS NULL OR a.step >= $4::bigint) "
              "AND ($5::bigint IS NULL OR a.step <= $5::bigint) "
              "GROUP BY GROUPING SETS ((u.username, a.server), (u.username), ()) "
              "ORDER BY 1, 4 DESC, 2, 3");

/* $1 user id: their servers' credit per run and per server key. */
COORD_DB_STMT(S_X_ME, 1,
              "SELECT GROUPING(a.server), a.run, encode(a.server, 'hex'), "
              "sum(a.credited), sum(a.clipped), "
              "extract(epoch from min(a.received_at))::bigint, "
              "extract(epoch from max(a.received_at))::bigint "
              "FROM contrib_expert_attestations a "
              "WHERE a.run_id IN (SELECT run_id FROM passes WHERE user_id = $1::bigint) "
              "AND a.known AND a.report_verified AND " OWNER("a") " = $1::bigint "
              "GROUP BY GROUPING SETS ((a.run, a.server), (a.run)) ORDER BY a.run, 1 DESC, 3");

static double dbl(PGresult *r, int i, int c)
{
    return PQgetisnull(r, i, c) ? 0 : strtod(PQgetvalue(r, i, c), NULL);
}

static json_t *time_or_null(PGresult *r, int i, int c)
{
    return PQgetisnull(r, i, c) ? json_null()
                                : json_integer((json_int_t)strtoll(PQgetvalue(r, i, c), NULL, 10));
}

static void key_b64(const char *hex, char out[48])
{
    uint8_t raw[CM_ED25519_PUB_LEN];
    size_t n = 0;
    out[0] = '\0';
    if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) == CM_OK && n == sizeof raw)
        cm_b64url_encode(raw, sizeof raw, out);
}

static void set_credit(json_t *o, PGresult *r, int i)
{
    json_object_set_new(o, "expert_samples", json_real(dbl(r, i, 3)));
    json_object_set_new(o, "expert_samples_clipped", json_real(dbl(r, i, 4)));
}

static void zero_credit(json_t *rows)
{
    size_t i;
    json_t *o;
    json_array_foreach(rows, i, o)
    {
        json_object_set_new(o, "expert_samples", json_real(0));
        json_object_set_new(o, "expert_samples_clipped", json_real(0));
    }
}

/* The row of rows whose field equals value, or NULL. */
static json_t *find(json_t *rows, const char *field, const char *value)
{
    size_t i;
    json_t *o;
    json_array_foreach(rows, i, o)
    {
        const char *v = json_string_value(json_object_get(o, field));
        if (v && !strcmp(v, value))
            return o;
    }
    return NULL;
}

/* A row for a server owner with no reports of their own in the range: the
 * report figures are 0, the times those of the attestations. */
static json_t *server_row(PGresult *r, int i)
{
    json_t *o = json_pack("{s:I, s:I, s:f, s:f, s:f, s:I, s:o, s:o}", "reports", (json_int_t)0,
                          "steps", (json_int_t)0, "claimed_samples", 0.0, "verified_samples", 0.0,
                          "compute_s", 0.0, "flagged_reports", (json_int_t)0, "first_at",
                          time_or_null(r, i, 5), "last_at", time_or_null(r, i, 6));
    set_credit(o, r, i);
    return o;
}

int api_contrib_experts_list(struct coord_req *req, const char *const p[5], json_t *users,
                             json_t *peers, json_t *totals)
{
    zero_credit(users);
    zero_credit(peers);
    json_object_set_new(totals, "expert_samples", json_real(0));
    json_object_set_new(totals, "expert_samples_clipped", json_real(0));
    PGresult *r = coord_db_exec(req->db, &S_X_LIST, p, NULL);
    if (!r)
        return CM_EDB;
    for (int i = 0; i < PQntuples(r); i++) {
        int grouping = atoi(PQgetvalue(r, i, 0));
        const char *user = PQgetvalue(r, i, 1);
        if (grouping == 0) { /* (username, server) */
            char k[48];
            key_b64(PQgetvalue(r, i, 2), k);
            json_t *o = find(peers, "peer_public_key", k);
            if (o) {
                set_credit(o, r, i);
            } else {
                o = server_row(r, i);
                json_object_set_new(o, "peer_public_key", json_string(k));
                json_object_set_new(o, "username", json_string(user));
                json_array_append_new(peers, o);
            }
        } else if (grouping == 1) { /* (username) */
            json_t *o = find(users, "username", user);
            if (o) {
                set_credit(o, r, i);
            } else {
                o = server_row(r, i);
                json_object_set_new(o, "username", json_string(user));
                json_object_set_new(o, "peers", json_integer(0));
                json_array_append_new(users, o);
            }
        } else { /* () */
            set_credit(totals, r, i);
        }
    }
    PQclear(r);
    return CM_OK;
}

/* Inserts o into runs (sorted by "run") and returns it (borrowed). */
static json_t *insert_run(json_t *runs, json_t *o)
{
    const char *name = json_string_value(json_object_get(o, "run"));
    size_t i;
    json_t *x;
    json_array_foreach(runs, i, x)
    {
        if (strcmp(json_string_value(json_object_get(x, "run")), name) > 0)
            break;
    }
    json_array_insert_new(runs, i, o);
    return o;
}

int api_contrib_experts_me(struct coord_req *req, const char *uid, json_t *runs)
{
    size_t i;
    json_t *run;
    json_array_foreach(runs, i, run)
    {
        json_object_set_new(run, "expert_samples", json_real(0));
        json_object_set_new(run, "expert_samples_clipped", json_real(0));
        zero_credit(json_object_get(run, "peers"));
    }
    const char *p[] = {uid};
    PGresult *r = coord_db_exec(req->db, &S_X_ME, p, NULL);
    if (!r)
        return CM_EDB;
    json_t *cur = NULL;
    for (int t = 0; t < PQntuples(r); t++) {
        const char *name = PQgetvalue(r, t, 1);
        if (atoi(PQgetvalue(r, t, 0)) == 1) { /* per run, sorted before its servers */
            cur = find(runs, "run", name);
            if (cur) {
                set_credit(cur, r, t);
            } else {
                cur = server_row(r, t);
                json_object_set_new(cur, "run", json_string(name));
                json_object_set_new(cur, "peers", json_array());
                insert_run(runs, cur);
            }
            continue;
        }
        if (!cur)
            continue;
        char k[48];
        key_b64(PQgetvalue(r, t, 2), k);
        json_t *peers = json_object_get(cur, "peers");
        json_t *o = find(peers, "peer_public_key", k);
        if (o) {
            set_credit(o, r, t);
        } else {
            o = server_row(r, t);
            json_object_set_new(o, "peer_public_key", json_string(k));
            json_array_append_new(peers, o);
        }
    }
    PQclear(r);
    return CM_OK;
}
