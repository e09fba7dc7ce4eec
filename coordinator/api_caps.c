/* Capability reports and the run's live peers (docs/schedules.md, "The
 * coordinator"; docs/p2p.md, "Reachability"):
 *
 *  POST /api/v1/runs/{run}/capabilities  an agent reports what its peer can
 *      do: samples/s, measured (or declared) upload/download Mbit/s,
 *      measured throughput to some peers, whether it accepts inbound
 *      connections, how peers reach it and rounds that averaged nothing.
 *      The caller must be allowlisted and hold an unrevoked, unexpired pass
 *      for the peer key in that run. A report lives API_CAP_TTL_S seconds,
 *      or a pipeline run's config.pipeline.liveness_s (api_pipeline.c), so
 *      that a dead stage agent drops out of its assignment sooner; the
 *      response says which (report_ttl_s); agents re-report within it. A
 *      report queues its run for the background solver (api_sched.c).
 *  GET  /api/v1/runs/{run}/peers  organizers and auditors: the live reports. */
#include "coordinator/api.h"
#include "cm_err.h"
#include "sched/sched.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A measured round trip above this is a bad report (a minute). */
#define API_CAP_MAX_RTT_MS 60000.0

static int num_field(json_t *o, const char *k, double lo, double hi, int lo_open, double *out,
                     struct coord_resp *resp, const char *where)
{
    json_t *v = json_object_get(o, k);
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
        coord_resp_error(resp, 400, "invalid_request", "%s'%s': a number in %s%g, %g]", where, k,
                         lo_open ? "(" : "[", lo, hi);
        return 0;
    }
    *out = x;
    return 1;
}

int api_key_param(const char *s, uint8_t key[CM_ED25519_PUB_LEN])
{
    size_t n = 0;
    return s && cm_b64url_decode(s, strlen(s), key, CM_ED25519_PUB_LEN, &n) == CM_OK &&
           n == CM_ED25519_PUB_LEN;
}

/* config.pipeline.liveness_s of the run, when its config has one (jsonb
 * text; NULL otherwise). */
COORD_DB_STMT(S_CAP_LIVENESS, 1,
              "SELECT config->'pipeline'->'liveness_s' FROM runs WHERE id = $1");
COORD_DB_STMT(S_CAP_OLD, 2,
              "SELECT 1 FROM capabilities WHERE run_id = $1 AND peer_public_key = $2 "
              "AND expires_at <= now() FOR UPDATE");
COORD_DB_STMT(S_CAP_DEPART, 2,
              "INSERT INTO capability_departures (run_id, peer_public_key, joined_at, left_at) "
              "SELECT run_id, peer_public_key, first_reported_at, expires_at FROM capabilities "
              "WHERE run_id = $1 AND peer_public_key = $2 ON CONFLICT DO NOTHING");
COORD_DB_STMT(S_CAP_UPSERT, 6,
              "INSERT INTO capabilities (run_id, peer_public_key, user_id, pass_id, report, "
              "first_reported_at, reported_at, expires_at) "
              "VALUES ($1, $2, $3, $4, $5::jsonb, now(), now(), now() + make_interval(secs => $6)) "
              "ON CONFLICT (run_id, peer_public_key) DO UPDATE SET user_id = EXCLUDED.user_id, "
              "pass_id = EXCLUDED.pass_id, report = EXCLUDED.report, reported_at = now(), "
              "expires_at = EXCLUDED.expires_at, first_reported_at = CASE WHEN "
              "capabilities.expires_at <= now() THEN now() ELSE capabilities.first_reported_at END "
              "RETURNING extract(epoch from expires_at)::bigint");

/* "1.2.3.4:5" or "[v6]:5": numeric only (the coordinator resolves no name
   a peer sends), port 1..65535. */
static int numeric_ip_port(const char *s)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || colon[1] == 0)
        return 0;
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (*s == '[') {
        if (hl < 3 || colon[-1] != ']')
            return 0;
        h = s + 1;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return 0;
    memcpy(host, h, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    unsigned char ab[16];
    if (*end || port < 1 || port > 65535 || colon[1] == '-' || colon[1] == '+')
        return 0;
    return *s == '[' ? inet_pton(AF_INET6, host, ab) == 1 : inet_pton(AF_INET, host, ab) == 1;
}

const char *api_peer_ip(const struct coord_req *req)
{
    const char *ip = req->client_ip;
    if (!strncasecmp(ip, "::ffff:", 7) && strchr(ip + 7, '.'))
        ip += 7;
    return ip;
}

void api_capabilities_post(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"peer_public_key", CM_J_STRING, 1, 43, 43},
        {"samples_per_s", CM_J_NUMBER, 1, 1, 0},
        {"upload_mbps", CM_J_NUMBER, 1, 1, 0},
        {"download_mbps", CM_J_NUMBER, 1, 1, 0},
        {"accepts_inbound", CM_J_BOOL, 1, 1, 0},
        {"pairs", CM_J_ARRAY, 0, 1, 0},
        {"failing_rounds", CM_J_INT, 0, 0, 1000000000},
        {"failing_reason", CM_J_STRING, 0, 0, 320},
        {"reachability", CM_J_STRING, 0, 1, 16},
        {"address", CM_J_STRING, 0, 1, 64},
        {"relay", CM_J_STRING, 0, 1, 64},
        {"punched", CM_J_INT, 0, 0, 4096},
    };
    static const struct cm_json_field PAIR[] = {
        {"peer_public_key", CM_J_STRING, 1, 43, 43},
        {"mbps", CM_J_NUMBER, 0, 1, 0},
        {"rtt_ms", CM_J_NUMBER, 0, 1, 0},
    };
    if (!api_name_param(req, resp, 0, "run") ||
        !coord_req_check(req, resp, F, sizeof F / sizeof F[0]))
        return;
    uint8_t pk[CM_ED25519_PUB_LEN];
    if (!api_key_param(json_string_value(json_object_get(req->json, "peer_public_key")), pk)) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'peer_public_key': base64url (no padding) of a 32-byte Ed25519 "
                         "public key");
        return;
    }
    double s, up, down;
    if (!num_field(req->json, "samples_per_s", 0, SCHED_MAX_SAMPLES_PER_S, 0, &s, resp, "field ") ||
        !num_field(req->json, "upload_mbps", 0, SCHED_MAX_MBPS, 1, &up, resp, "field ") ||
        !num_field(req->json, "download_mbps", 0, SCHED_MAX_MBPS, 1, &down, resp, "field "))
        return;
    json_t *pairs_in = json_object_get(req->json, "pairs");
    json_t *pairs = json_array();
    size_t i;
    json_t *e;
    if (json_array_size(pairs_in) > SCHED_MAX_LINKS) {
        json_decref(pairs);
        coord_resp_error(resp, 400, "invalid_request", "field 'pairs': at most %d entries",
                         SCHED_MAX_LINKS);
        return;
    }
    json_array_foreach(pairs_in, i, e) {
        char err[160], where[48];
        uint8_t other[CM_ED25519_PUB_LEN];
        double mbps;
        snprintf(where, sizeof where, "pairs[%zu].", i);
        if (!json_is_object(e) || cm_json_check(e, PAIR, sizeof PAIR / sizeof PAIR[0], err, sizeof err) != CM_OK) {
            coord_resp_error(resp, 400, "invalid_request", "%s %s", where,
                             json_is_object(e) ? err : "expected an object");
            json_decref(pairs);
            return;
        }
        const char *ok = json_string_value(json_object_get(e, "peer_public_key"));
        if (!api_key_param(ok, other) || !memcmp(other, pk, sizeof pk)) {
            coord_resp_error(resp, 400, "invalid_request",
                             "%speer_public_key: another peer's base64url public key", where);
            json_decref(pairs);
            return;
        }
        /* the measured throughput, the round trip, or both (pipeline
           stages measure round trips only: docs/pipelines.md) */
        if (!json_object_get(e, "mbps") && !json_object_get(e, "rtt_ms")) {
            coord_resp_error(resp, 400, "invalid_request", "pairs[%zu]: 'mbps', 'rtt_ms' or both", i);
            json_decref(pairs);
            return;
        }
        if (json_object_get(e, "mbps") && !num_field(e, "mbps", 0, SCHED_MAX_MBPS, 1, &mbps, resp, where)) {
            json_decref(pairs);
            return;
        }
        json_t *pe = json_pack("{s:s}", "peer", ok);
        if (json_object_get(e, "mbps"))
            json_object_set_new(pe, "mbps", json_real(mbps));
        double rtt;
        if (json_object_get(e, "rtt_ms") &&
            !num_field(e, "rtt_ms", 0, API_CAP_MAX_RTT_MS, 1, &rtt, resp, where)) {
            json_decref(pe);
            json_decref(pairs);
            return;
        }
        if (json_object_get(e, "rtt_ms"))
            json_object_set_new(pe, "rtt_ms", json_real(rtt));
        json_array_append_new(pairs, pe);
    }
    json_t *report = json_pack("{s:f, s:f, s:f, s:b, s:o}", "samples_per_s", s, "upload_mbps", up,
                               "download_mbps", down, "accepts_inbound",
                               json_is_true(json_object_get(req->json, "accepts_inbound")),
                               "pairs", pairs);
    /* how peers reach it (docs/p2p.md, "Reachability"), for the organizer's
       peers page */
    const char *reach = json_string_value(json_object_get(req->json, "reachability"));
    const char *addr = json_string_value(json_object_get(req->json, "address"));
    const char *relay = json_string_value(json_object_get(req->json, "relay"));
    static const char *const REACH[] = {"direct", "client", "relayed", "unknown"};
    int reach_ok = !reach;
    for (size_t k = 0; reach && k < sizeof REACH / sizeof *REACH; k++)
        reach_ok |= !strcmp(reach, REACH[k]);
    unsigned char ab[16];
    int relay_ok = !relay || (reach && !strcmp(reach, "relayed") && numeric_ip_port(relay));
    if (!reach_ok || !relay_ok ||
        (addr && inet_pton(AF_INET, addr, ab) != 1 && inet_pton(AF_INET6, addr, ab) != 1)) {
        json_decref(report);
        coord_resp_error(resp, 400, "invalid_request",
                         !reach_ok   ? "field 'reachability': direct, client, relayed or unknown"
                         : !relay_ok ? "field 'relay': the relay's numeric address, ip:port, with "
                                       "reachability 'relayed'"
                                     : "field 'address': an IPv4 or IPv6 address");
        return;
    }
    if (report && relay)
        json_object_set_new(report, "relay", json_string(relay));
    if (report && reach)
        json_object_set_new(report, "reachability", json_string(reach));
    /* peers it reaches, or that reach it, through punched holes (docs/p2p.md,
       "Hole punching") */
    json_int_t punched = json_integer_value(json_object_get(req->json, "punched"));
    if (report && punched > 0)
        json_object_set_new(report, "punched", json_integer(punched));
    /* where peers reach it: the address its reports come from, as the
       coordinator sees it (the agent's own "address" says the same when
       it is honest, and is checked above only as input); with its relay's
       address this is what the schedule gives peers to check announced
       averaging addresses against (api_sched.c, docs/p2p.md "Announced
       addresses") */
    (void)addr;
    unsigned char sb[16];
    const char *seen = api_peer_ip(req);
    if (report && (inet_pton(AF_INET, seen, sb) == 1 || inet_pton(AF_INET6, seen, sb) == 1))
        json_object_set_new(report, "address", json_string(seen));
    /* a peer whose rounds keep averaging nothing says so (the run's stats) */
    json_int_t failing = json_integer_value(json_object_get(req->json, "failing_rounds"));
    if (report && failing > 0) {
        const char *why = json_string_value(json_object_get(req->json, "failing_reason"));
        json_object_set_new(report, "failing_rounds", json_integer(failing));
        json_object_set_new(report, "failing_reason", json_string(why ? why : ""));
    }
    char *report_txt = report ? json_dumps(report, JSON_COMPACT | JSON_SORT_KEYS |
                                                       JSON_REAL_PRECISION(17))
                              : NULL;
    json_decref(report);
    if (!report_txt) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    if (!coord_req_db(req, resp)) {
        free(report_txt);
        return;
    }
    char uid[24], pass_id[24], run_id[24], ttl[16];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    if (!api_peer_pass(req, resp, pk, pass_id, run_id)) {
        free(report_txt);
        return;
    }
    /* A pipeline run's reports live config.pipeline.liveness_s. */
    int ttl_s = API_CAP_TTL_S;
    const char *lp[] = {run_id};
    PGresult *r = coord_db_exec(req->db, &S_CAP_LIVENESS, lp, NULL);
    if (!r) {
        free(report_txt);
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        json_t *lv = json_loads(PQgetvalue(r, 0, 0), JSON_DECODE_ANY, NULL);
        ttl_s = api_pipeline_liveness_s(lv);
        json_decref(lv);
    }
    PQclear(r);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    if (coord_db_cmd(req->db, "BEGIN") != CM_OK) {
        free(report_txt);
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    /* A peer whose report had expired left and came back: record the departure. */
    const char *op[] = {run_id, (const char *)pk};
    const int olens[] = {0, CM_ED25519_PUB_LEN}, ofmts[] = {0, 1};
    r = coord_db_exec_bin(req->db, &S_CAP_OLD, op, olens, ofmts, NULL);
    int ok = r != NULL;
    if (r && PQntuples(r) == 1) {
        PQclear(r);
        r = coord_db_exec_bin(req->db, &S_CAP_DEPART, op, olens, ofmts, NULL);
        ok = r != NULL;
    }
    if (r)
        PQclear(r);
    const char *up_p[] = {run_id, (const char *)pk, uid, pass_id, report_txt, ttl};
    const int ulens[] = {0, CM_ED25519_PUB_LEN, 0, 0, 0, 0}, ufmts[] = {0, 1, 0, 0, 0, 0};
    r = ok ? coord_db_exec_bin(req->db, &S_CAP_UPSERT, up_p, ulens, ufmts, NULL) : NULL;
    free(report_txt);
    if (!r || PQntuples(r) != 1 || coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        if (r)
            PQclear(r);
        coord_resp_error(resp, 500, "internal", "could not store the report");
        return;
    }
    long long exp = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    /* Joins and changed figures are solved in the background, a burst of them once. */
    api_sched_enqueue(req->srv, req->params[0], API_SETTLE_MS);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:s, s:I, s:i}", "run", req->params[0], "peer_public_key",
                              json_string_value(json_object_get(req->json, "peer_public_key")),
                              "expires_at", (json_int_t)exp, "report_ttl_s", ttl_s));
}

COORD_DB_STMT(S_LIVE_PEERS, 1,
              "SELECT translate(rtrim(encode(c.peer_public_key, 'base64'), '='), '+/', '-_'), u.username, "
              "c.report::text, extract(epoch from c.first_reported_at)::bigint, "
              "extract(epoch from c.reported_at)::bigint FROM capabilities c JOIN runs r ON r.id = c.run_id "
              "JOIN users u ON u.id = c.user_id WHERE r.name = $1 AND c.expires_at > now() "
              "ORDER BY u.username, c.peer_public_key");

void api_peers_list(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return;
    if (!api_run_known(req, resp))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_LIVE_PEERS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *rep = json_loads(PQgetvalue(r, i, 2), 0, NULL);
        json_t *o = json_pack("{s:s, s:s, s:I, s:I}", "peer_public_key", PQgetvalue(r, i, 0), "username",
                              PQgetvalue(r, i, 1), "first_reported_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "reported_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10));
        static const char *const KEEP[] = {"samples_per_s", "upload_mbps", "download_mbps", "accepts_inbound",
                                           "reachability", "address", "relay", "punched", "failing_rounds",
                                           "failing_reason"};
        for (size_t k = 0; rep && o && k < sizeof KEEP / sizeof *KEEP; k++) {
            json_t *v = json_object_get(rep, KEEP[k]);
            if (v)
                json_object_set(o, KEEP[k], v);
        }
        json_decref(rep);
        json_array_append_new(a, o);
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "run", req->params[0], "peers", a));
}
