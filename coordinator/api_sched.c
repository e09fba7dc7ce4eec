/* Adaptive-averaging schedules served by the coordinator (seed
 * 000_02cc6b5d62a616fc.txt §3.2, Appendix B and C; docs/schedules.md),
 * solved from the live capability reports (api_caps.c).
 *
 *  GET  /api/v1/runs/{run}/schedule      the newest valid signed schedule.
 *      When the live reports differ from those the newest schedule was
 *      solved from (peers joined, left or changed) and that solve is older
 *      than HYSTERESIS_S (MEMBERS_HYSTERESIS_S when the set of peers
 *      changed), or the schedule nears the end of its validity, a
 *      new one is solved (common/sched/), signed with this coordinator's
 *      key and stored with its inputs, result and solve time: by the
 *      background solver thread while a valid schedule exists (the GET
 *      serves that one), in the request only when there is none. A
 *      transaction-level advisory lock per run makes one coordinator solve
 *      while the others wait and then find its result.
 *  GET  /api/v1/runs/{run}/schedules            organizers and auditors:
 *      past schedules.
 *  GET  /api/v1/runs/{run}/schedules/{version}  public: one version, signed
 *      (agents fetch the version the other members of a round use);
 *      organizers and auditors also get the inputs and per-peer results it
 *      was solved from.
 *
 * The signed bytes are documented in docs/protocol.md ("Schedules"). */
#include "coordinator/api.h"
#include "coordinator/backbone.h"
#include "coordinator/signed_doc.h"
#include "coordinator/auth.h"
#include "cm_err.h"
#include "cm_resolve.h"
#include "cm_log.h"
#include "sched/sched.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HYSTERESIS_S 30       /* at most one solve per run per this many seconds... */
#define MEMBERS_HYSTERESIS_S 5 /* ...or this many when peers joined or left */
#define IP_HYSTERESIS_S 2      /* ...or this many when only where one is reached changed */
#define VALID_S 600           /* validity window of a schedule */
#define REFRESH_S 300         /* re-solve when less validity than this is left */
#define FAIL_WINDOW_S 3600    /* history used to estimate the failure rate */
#define FAIL_MIN_PEER_S 600.0 /* less observed peer time than this: assume no failures */
#define SCHED_LOCK_CLASS 0x5c4ed /* advisory lock class of schedule solves */
#define DEFAULT_GRADIENT_BITS 32
/* Solves run in the background, except a run's first (make bench: about
 * 0.2-0.5 s at 256 peers, 2-3 s at 512 on a shared 2-core machine). Beyond
 * this many live peers the endpoint refuses clearly. */
#define COORD_SCHED_MAX_PEERS 256

/* ---- GET /schedule ---- */

COORD_DB_STMT(S_RUN, 1,
              "SELECT id, target_batch_size, coalesce(config->>'model_parameters', "
              "config->'collaboration'->>'model_parameters', ''), "
              "coalesce(config->>'gradient_bits', config->'collaboration'->>'gradient_bits', "
              "CASE config->'collaboration'->>'compression' WHEN 'fp16' THEN '16' "
              "WHEN 'q8' THEN '8' ELSE '' END), "
              "coalesce(config->'collaboration'->>'compute_roles', config->>'compute_roles', 'all'), "
              "coalesce(config->'collaboration'->>'group_size', config->>'group_size', ''), "
              "coalesce(config->'collaboration'->>'relay_traffic', config->>'relay_traffic', 'counted') "
              "FROM runs WHERE name = $1");
/* Live: the report has not expired and the pass it came with is still valid
 * (a revoked peer drops out of the next schedule). */
COORD_DB_STMT(S_LIVE, 1,
              "SELECT encode(c.peer_public_key, 'hex'), c.report::text FROM capabilities c "
              "JOIN passes p ON p.id = c.pass_id AND p.revoked_at IS NULL "
              "AND p.expires_at > now() "
              "WHERE c.run_id = $1 AND c.expires_at > now() ORDER BY c.peer_public_key");
COORD_DB_STMT(S_NEWEST, 1,
              "SELECT version, inputs_sha256, extract(epoch from created_at)::bigint, "
              "extract(epoch from valid_from)::bigint, extract(epoch from valid_until)::bigint, "
              "payload, encode(signature, 'hex'), kid, solve_ms FROM schedules "
              "WHERE run_id = $1 ORDER BY version DESC LIMIT 1");
COORD_DB_STMT(S_LOCK, 2, "SELECT pg_advisory_xact_lock($1::int, $2::int)");
/* Failure history (Appendix C): departures and observed peer-seconds in the window. */
COORD_DB_STMT(S_HISTORY, 2,
              "SELECT (SELECT count(*) FROM capability_departures WHERE run_id = $1 "
              "AND left_at > now() - make_interval(secs => $2)) + "
              "(SELECT count(*) FROM capabilities WHERE run_id = $1 AND expires_at <= now() "
              "AND expires_at > now() - make_interval(secs => $2)), "
              "coalesce((SELECT sum(extract(epoch from least(expires_at, now()) - "
              "greatest(first_reported_at, now() - make_interval(secs => $2)))) FROM capabilities "
              "WHERE run_id = $1 AND expires_at > now() - make_interval(secs => $2)), 0) + "
              "coalesce((SELECT sum(extract(epoch from left_at - greatest(joined_at, now() - "
              "make_interval(secs => $2)))) FROM capability_departures WHERE run_id = $1 "
              "AND left_at > now() - make_interval(secs => $2)), 0)");
COORD_DB_STMT(S_INSERT, 12,
              "INSERT INTO schedules (run_id, version, kid, valid_from, valid_until, inputs, "
              "inputs_sha256, result, solve_ms, payload, signature, created_at) VALUES ($1, $2, $3, "
              "to_timestamp($4), to_timestamp($5), $6::jsonb, $7, $8::jsonb, $9, $10, "
              "decode($11, 'hex'), to_timestamp($12))");

/* The solver's inputs, read from the live reports, ordered by peer key so
 * that equal inputs give an equal problem (and an equal digest). */
struct inputs {
    size_t n;
    struct sched_peer *peers;
    struct sched_link *links; /* n * SCHED_MAX_LINKS */
    json_t *doc;              /* canonical inputs document */
    char sha[65];
};

static void inputs_free(struct inputs *in)
{
    free(in->peers);
    free(in->links);
    json_decref(in->doc);
    memset(in, 0, sizeof *in);
}

static int find_key(const struct sched_peer *peers, size_t n, const uint8_t key[32])
{
    size_t lo = 0, hi = n; /* peers are sorted by key (bytea order = memcmp order) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = memcmp(peers[mid].key, key, CM_ED25519_PUB_LEN);
        if (!c)
            return (int)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Seconds after the newest schedule's solve before changed inputs are
 * solved again. A peer that joined sends even parts (a slow one holds every
 * round to its link) and a peer that left is waited for until the schedule
 * says otherwise, so a change of the set of peers (the newest payload lists
 * them by key) waits MEMBERS_HYSTERESIS_S, a change of where one is
 * reached (its "ip": another relay, rare) IP_HYSTERESIS_S: every member
 * refuses it as an aggregator until a schedule has it, and a NAT'ed
 * agent whose relay died rounds with only refused aggregators failed for
 * 5-10 s (test_hosts' relay kill under the sanitizers: 6 rounds); changed
 * figures of the same peers (throughputs measured again) HYSTERESIS_S. */
static long long hysteresis_s(const struct coord_newest *nw, const struct inputs *in)
{
    json_t *root = nw->payload ? json_loads(nw->payload, 0, NULL) : NULL;
    json_t *arr = json_object_get(root, "peers");
    int changed = !json_is_array(arr) || json_array_size(arr) != in->n, moved = 0;
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        uint8_t k[CM_ED25519_PUB_LEN];
        if (changed)
            break;
        int at = api_key_param(json_string_value(json_object_get(e, "key")), k) ? find_key(in->peers, in->n, k) : -1;
        /* a peer reached elsewhere (another relay) is refused as an
           aggregator by every member until the schedule says so */
        const char *ip = json_string_value(json_object_get(e, "ip"));
        changed = at < 0;
        moved |= !changed && strcmp(ip ? ip : "", in->peers[at].ip) != 0;
    }
    json_decref(root);
    return changed ? MEMBERS_HYSTERESIS_S : moved ? IP_HYSTERESIS_S : HYSTERESIS_S;
}

/* Serve it as is, or solve again? in: the live inputs (NULL or none: there
 * is nothing to solve from). */
static int newest_good(const struct coord_newest *nw, const struct inputs *in, long long now)
{
    if (!nw->have || nw->until - now < REFRESH_S)
        return 0;
    if (!in || !in->n || !strcmp(nw->sha, in->sha))
        return 1;
    return now - nw->created < hysteresis_s(nw, in); /* inputs changed, but solved moments ago */
}

/* The host part of "host:port" or "[ip6]:port" into h (brackets dropped);
 * 0 when there is none or it does not fit. */
static int host_part(const char *hp, char *h, size_t cap)
{
    const char *colon = hp ? strrchr(hp, ':') : NULL;
    size_t n = colon ? (size_t)(colon - hp) : 0;
    if (!colon || n == 0 || n >= cap)
        return 0;
    if (hp[0] == '[' && n > 2 && hp[n - 1] == ']') {
        hp++;
        n -= 2;
    }
    memcpy(h, hp, n);
    h[n] = '\0';
    return 1;
}

/* The numeric address in "ip:port" or "[ip6]:port" into out (binary, *fam);
 * 0 when it is none. */
static int host_of(const char *hp, unsigned char out[16], int *fam)
{
    char h[SCHED_IP_MAX + 2];
    if (!host_part(hp, h, sizeof h))
        return 0;
    *fam = strchr(h, ':') ? AF_INET6 : AF_INET;
    return inet_pton(*fam, h, out) == 1;
}

/* Whether the backbone address hp ("host:port", the host maybe a name, as
 * --dht-advertise says) is at the numeric address rb of family fam. */
static int backbone_is(const char *hp, int fam, const unsigned char *rb)
{
    unsigned char ob[16];
    int of = 0;
    if (host_of(hp, ob, &of))
        return of == fam && !memcmp(ob, rb, fam == AF_INET ? 4 : 16);
    char h[256];
    if (!host_part(hp, h, sizeof h))
        return 0;
    struct addrinfo hints = {.ai_family = fam, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (cm_resolve(h, NULL, &hints, 2000, &res) != CM_OK) /* a slow DNS server holds no solve */
        return 0;
    int same = 0;
    for (struct addrinfo *ai = res; ai && !same; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET && fam == AF_INET)
            same = !memcmp(&((struct sockaddr_in *)ai->ai_addr)->sin_addr, rb, 4);
        else if (ai->ai_family == AF_INET6 && fam == AF_INET6)
            same = !memcmp(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, rb, 16);
    }
    freeaddrinfo(res);
    return same;
}

/* Where peers may reach each live peer (sched_peer.ip; docs/p2p.md,
 * "Announced addresses"): the address the coordinator saw its reports come
 * from, or, when it reports being relayed, its relay's address. A relay
 * must be another live peer of the run (at the address the coordinator
 * sees it at) or one of the run's backbone nodes; a peer that names any
 * other is treated as one that accepts no connections (it gets no part),
 * so a report cannot point the run's traffic at a third party. */
static void reach_ips(struct coord_req *req, struct inputs *in, json_t **reports, size_t n, int relay_counted)
{
    json_t *boot = NULL;
    for (size_t i = 0; i < n; i++) {
        struct sched_peer *q = &in->peers[i];
        const char *addr = json_string_value(json_object_get(reports[i], "address"));
        const char *reach = json_string_value(json_object_get(reports[i], "reachability"));
        const char *relay = json_string_value(json_object_get(reports[i], "relay"));
        q->ip[0] = '\0';
        if (!reach || strcmp(reach, "relayed") != 0 || !relay) {
            if (addr && strlen(addr) < sizeof q->ip)
                snprintf(q->ip, sizeof q->ip, "%s", addr);
            continue;
        }
        unsigned char rb[16], ob[16];
        int rf = 0, of = 0, known = 0;
        if (host_of(relay, rb, &rf)) {
            for (size_t k = 0; k < n && !q->relay && !(known && !relay_counted); k++) {
                const char *a = json_string_value(json_object_get(reports[k], "address"));
                const char *kr = json_string_value(json_object_get(reports[k], "reachability"));
                of = a && strchr(a, ':') ? AF_INET6 : AF_INET;
                int at = k != i && a && of == rf && inet_pton(of, a, ob) == 1 &&
                         !memcmp(ob, rb, rf == AF_INET ? 4 : 16);
                known |= at;
                /* the LP counts its traffic on that peer's link, twice
                   (sched_peer.relay), if that peer relays as the LP
                   knows relays: accepting, and not relayed itself (peers
                   behind one router share an address: the one that
                   qualifies) */
                if (relay_counted && at && in->peers[k].inbound && !(kr && !strcmp(kr, "relayed")))
                    q->relay = (uint32_t)k + 1;
            }
            /* what its punched holes carry instead: its share of the
               others (all but it and its relay) it reports holes with */
            if (q->relay) {
                double holes = (double)json_integer_value(json_object_get(reports[i], "punched"));
                double others = n > 2 ? (double)(n - 2) : 1;
                q->relay_direct = holes <= 0 ? 0 : holes >= others ? 1 : holes / others;
            }
            if (!known && !boot)
                boot = coord_backbone_bootstrap(req);
            size_t b;
            json_t *e;
            json_array_foreach(boot, b, e) {
                if (!known)
                    known = backbone_is(json_string_value(e), rf, rb);
            }
        }
        if (known) {
            inet_ntop(rf, rb, q->ip, sizeof q->ip);
        } else {
            CM_LOGW("sched", "run %s: a peer reports a relay at %s, which is no live peer's or backbone's "
                             "address: it gets no part",
                    req->params[0], relay);
            q->inbound = 0;
        }
    }
    json_decref(boot);
}

static int inputs_load(struct coord_req *req, const char *run_id, json_t *params,
                       struct inputs *in, struct coord_resp *resp)
{
    memset(in, 0, sizeof *in);
    const char *p[] = {run_id};
    PGresult *r = coord_db_exec(req->db, &S_LIVE, p, NULL);
    if (!r) {
        json_decref(params);
        coord_resp_error(resp, 500, "internal", "database error");
        return 0;
    }
    size_t n = (size_t)PQntuples(r);
    in->n = n;
    in->peers = calloc(n ? n : 1, sizeof *in->peers);
    in->links = calloc((n ? n : 1) * SCHED_MAX_LINKS, sizeof *in->links);
    json_t *list = json_array();
    json_t **reports = calloc(n ? n : 1, sizeof *reports);
    int ok = in->peers && in->links && list && reports;
    for (size_t i = 0; ok && i < n; i++) {
        const char *hex = PQgetvalue(r, (int)i, 0);
        size_t kn = 0;
        reports[i] = json_loads(PQgetvalue(r, (int)i, 1), 0, NULL);
        struct sched_peer *q = &in->peers[i];
        if (cm_hex_decode(hex, strlen(hex), q->key, sizeof q->key, &kn) != CM_OK ||
            kn != sizeof q->key || !reports[i]) {
            ok = 0;
            break;
        }
        q->samples_per_s = json_number_value(json_object_get(reports[i], "samples_per_s"));
        q->up_mbps = json_number_value(json_object_get(reports[i], "upload_mbps"));
        q->down_mbps = json_number_value(json_object_get(reports[i], "download_mbps"));
        q->inbound = json_is_true(json_object_get(reports[i], "accepts_inbound"));
        q->links = &in->links[i * SCHED_MAX_LINKS];
    }
    PQclear(r);
    if (ok)
        reach_ips(req, in, reports, n, !json_object_get(params, "relay_traffic"));
    /* Pairs name peers by key; those not live now are dropped. */
    for (size_t i = 0; ok && i < n; i++) {
        char k64[64];
        cm_b64url_encode(in->peers[i].key, CM_ED25519_PUB_LEN, k64);
        json_t *pairs = json_array(), *e;
        size_t j;
        json_array_foreach(json_object_get(reports[i], "pairs"), j, e) {
            uint8_t other[32];
            const char *ok64 = json_string_value(json_object_get(e, "peer"));
            int at = api_key_param(ok64, other) ? find_key(in->peers, n, other) : -1;
            /* a round trip alone (a pipeline stage's) is no link for the LP */
            if (at < 0 || (size_t)at == i || in->peers[i].nlinks >= SCHED_MAX_LINKS ||
                !json_is_number(json_object_get(e, "mbps")))
                continue;
            struct sched_link *l = &in->links[i * SCHED_MAX_LINKS + in->peers[i].nlinks++];
            l->to = (uint32_t)at;
            l->mbps = json_number_value(json_object_get(e, "mbps"));
            json_array_append_new(pairs, json_pack("{s:s, s:f}", "peer", ok64, "mbps", l->mbps));
        }
        json_t *pe = json_pack("{s:s, s:f, s:f, s:f, s:b, s:o}", "peer_public_key", k64, "samples_per_s",
                               in->peers[i].samples_per_s, "upload_mbps", in->peers[i].up_mbps,
                               "download_mbps", in->peers[i].down_mbps, "accepts_inbound",
                               in->peers[i].inbound, "pairs", pairs);
        if (pe && in->peers[i].ip[0])
            json_object_set_new(pe, "ip", json_string(in->peers[i].ip));
        if (pe && in->peers[i].relay) { /* its traffic crosses that peer's link twice */
            char r64[64];
            cm_b64url_encode(in->peers[in->peers[i].relay - 1].key, CM_ED25519_PUB_LEN, r64);
            json_object_set_new(pe, "relay_peer", json_string(r64));
            json_object_set_new(pe, "relay_direct", json_real(in->peers[i].relay_direct));
        }
        json_array_append_new(list, pe);
    }
    for (size_t i = 0; reports && i < n; i++)
        json_decref(reports[i]);
    free(reports);
    if (!ok) {
        json_decref(list);
        json_decref(params);
        inputs_free(in);
        coord_resp_error(resp, 500, "internal", "could not read the capability reports");
        return 0;
    }
    in->doc = json_pack("{s:o, s:o}", "run", params, "peers", list);
    if (coord_doc_digest(in->doc, in->sha) != CM_OK) {
        inputs_free(in);
        coord_resp_error(resp, 500, "internal", "out of memory");
        return 0;
    }
    return 1;
}

/* Per-round failure probability of a peer from the run's history: the
 * departure rate (departures per observed peer-second) times the duration
 * of one averaging round of the new plan, p = 1 - exp(-rate x round). */
static double failure_estimate(struct coord_req *req, const char *run_id, double round_s,
                               json_t **why)
{
    char win[16];
    snprintf(win, sizeof win, "%d", FAIL_WINDOW_S);
    const char *p[] = {run_id, win};
    PGresult *r = coord_db_exec(req->db, &S_HISTORY, p, NULL);
    double departures = 0, peer_s = 0, pf = 0;
    if (r && PQntuples(r) == 1) {
        departures = strtod(PQgetvalue(r, 0, 0), NULL);
        peer_s = strtod(PQgetvalue(r, 0, 1), NULL);
    }
    if (r)
        PQclear(r);
    if (peer_s >= FAIL_MIN_PEER_S && departures > 0 && isfinite(round_s))
        pf = -expm1(-departures / peer_s * round_s);
    if (!(pf >= 0))
        pf = 0;
    if (pf > 0.999)
        pf = 0.999;
    *why = json_pack("{s:f, s:f, s:i, s:f, s:f}", "departures", departures, "observed_peer_s",
                     peer_s, "window_s", FAIL_WINDOW_S, "round_s", isfinite(round_s) ? round_s : 0,
                     "p_fail_per_round", pf);
    return pf;
}

static json_t *result_doc(const struct inputs *in, const struct sched_solution *sol, unsigned m,
                          double expected, json_t *failure)
{
    json_t *peers = json_array();
    for (size_t i = 0; i < sol->n; i++) {
        char k64[64];
        const struct sched_peer_plan *pl = &sol->peers[i];
        cm_b64url_encode(in->peers[i].key, CM_ED25519_PUB_LEN, k64);
        json_array_append_new(
            peers, json_pack("{s:s, s:f, s:b, s:f, s:I, s:f, s:f, s:f, s:f}", "peer_public_key",
                             k64, "c", pl->c, "compute", pl->compute, "fraction", pl->fraction,
                             "share", (json_int_t)pl->share, "aggregation_mbps", pl->agg_mbps,
                             "receive_mbps", pl->recv_mbps, "upload_used_mbps", pl->up_used_mbps,
                             "download_used_mbps", pl->down_used_mbps));
    }
    return json_pack("{s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:f, s:O, s:o}", "xi_relaxed",
                     sol->xi, "steps_per_s", sol->steps_per_s, "compute_rate", sol->compute_rate,
                     "network_rate", sol->network_rate, "iterations", sol->iterations, "rows",
                     sol->rows, "cols", sol->cols, "group_size", (int)m,
                     "expected_averaging_iterations", expected, "failure", failure, "peers",
                     peers);
}

/* Solves, signs and stores a new schedule; fills nw with it. Runs in the
 * caller's transaction, under the run's advisory lock. */
static int solve_and_store(struct coord_req *req, struct coord_resp *resp, const char *run_id,
                           const struct inputs *in, double batch, double grad_mbit, int lp_roles,
                           unsigned fixed_m,
                           struct coord_newest *nw)
{
    if (in->n > COORD_SCHED_MAX_PEERS) {
        coord_resp_error(resp, 409, "too_many_peers",
                         "%zu live peers; this coordinator solves schedules for at most %d",
                         in->n, COORD_SCHED_MAX_PEERS);
        return 0;
    }
    /* Who computes (docs/schedules.md, "Roles"). By default every peer that
     * can: the LP's objective, min(compute rate, network rate), counts
     * accumulation and averaging as overlapped, while join without
     * --delayed-updates does one after the other, so the LP would stop
     * peers whose samples the step then waits for (on the demo's CPU peers,
     * network-bound in the model, it keeps one peer of four computing).
     * With config.collaboration.compute_roles = "lp" the role search
     * decides, and a peer stops computing only for SCHED_ROLE_GAIN more
     * steps/s: with any strict gain it stopped three of four peers of
     * tests/integ/test_schedule_follow.c for less than 0.1 %, a side effect
     * of noisy pair measurements. */
    struct sched_problem prob = {in->peers, in->n, batch, grad_mbit, .all_compute = !lp_roles,
                                 .role_gain = lp_roles ? SCHED_ROLE_GAIN : 0};
    struct sched_solution sol;
    char err[256] = "";
    int rc = sched_solve(&prob, &sol, err, sizeof err);
    if (rc != CM_OK) {
        if (rc == CM_EINTERNAL || rc == CM_ENOMEM)
            coord_resp_error(resp, 500, "internal", "the schedule solver failed");
        else
            coord_resp_error(resp, 409, "cannot_schedule", "no schedule for these peers: %s",
                             err);
        return 0;
    }
    json_t *failure = NULL;
    double pf = failure_estimate(req, run_id, 1 / sol.network_rate, &failure);
    unsigned m = 1;
    double expected = 1;
    sched_group_size(in->n, pf, &m, &expected);
    if (fixed_m) { /* the organizer's config.collaboration.group_size */
        m = fixed_m < in->n ? fixed_m : (unsigned)in->n;
        expected = sched_expected_iterations(in->n, m, pf);
        if (failure)
            json_object_set_new(failure, "group_size_fixed", json_integer(fixed_m));
    }

    long long now = (long long)time(NULL);
    struct sched_schedule s = {0};
    rc = sched_schedule_from_solution(&prob, &sol, &s);
    snprintf(s.run, sizeof s.run, "%s", req->params[0]);
    snprintf(s.kid, sizeof s.kid, "%s", req->srv->kid);
    s.version = nw->have ? nw->version + 1 : 1;
    s.issued_at = now;
    s.valid_from = now;
    s.valid_until = now + VALID_S;
    s.group_size = m;
    char *payload = NULL;
    size_t plen = 0;
    uint8_t sig[CM_ED25519_SIG_LEN];
    if (rc == CM_OK)
        rc = sched_schedule_encode(&s, &payload, &plen);
    if (rc == CM_OK)
        rc = sched_sign(&req->srv->signing_key, payload, plen, sig);
    json_t *inputs = json_deep_copy(in->doc);
    if (inputs && failure)
        json_object_set(inputs, "failure", failure);
    json_t *result = result_doc(in, &sol, m, expected, failure);
    json_decref(failure);
    char *inputs_txt = inputs ? json_dumps(inputs, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *result_txt = result ? json_dumps(result, JSON_COMPACT) : NULL;
    json_decref(inputs);
    json_decref(result);
    double solve_ms = sol.solve_ms;
    sched_solution_cleanup(&sol);
    sched_schedule_cleanup(&s);
    int ok = 0;
    if (rc == CM_OK && inputs_txt && result_txt) {
        char ver[24], from[24], until[24], ms[32], sighex[2 * CM_ED25519_SIG_LEN + 1];
        snprintf(ver, sizeof ver, "%lld", (long long)(nw->have ? nw->version + 1 : 1));
        snprintf(from, sizeof from, "%lld", now);
        snprintf(until, sizeof until, "%lld", now + VALID_S);
        snprintf(ms, sizeof ms, "%.3f", solve_ms);
        cm_hex_encode(sig, sizeof sig, sighex);
        const char *p[] = {run_id, ver, req->srv->kid, from, until, inputs_txt, in->sha,
                           result_txt, ms, payload, sighex, from};
        PGresult *r = coord_db_exec(req->db, &S_INSERT, p, NULL);
        ok = r != NULL;
        if (r)
            PQclear(r);
        if (ok) {
            free(nw->payload);
            memset(nw, 0, sizeof *nw);
            nw->have = 1;
            nw->version = strtoll(ver, NULL, 10);
            nw->created = now;
            nw->from = now;
            nw->until = now + VALID_S;
            snprintf(nw->sha, sizeof nw->sha, "%s", in->sha);
            snprintf(nw->kid, sizeof nw->kid, "%s", req->srv->kid);
            snprintf(nw->sig_hex, sizeof nw->sig_hex, "%s", sighex);
            nw->solve_ms = solve_ms;
            nw->payload = payload;
            payload = NULL;
            CM_LOGI("sched", "run %s: schedule v%lld for %zu peers, m=%u, %.1f ms",
                    req->params[0], nw->version, in->n, m, solve_ms);
        }
    }
    free(payload);
    free(inputs_txt);
    free(result_txt);
    if (!ok)
        coord_resp_error(resp, 500, "internal", "could not sign or store the schedule");
    return ok;
}

/* ---- the background solver ----
 *
 * A GET never waits for a re-solve while a valid schedule exists: it serves
 * that one and queues the run here; a detached thread per coordinator
 * process solves queued runs (under the same per-run advisory lock, so with
 * several coordinators one solves and the others find its result). Only
 * when a run has no valid schedule at all (its first, or after every one
 * expired) does the GET solve itself, since it has nothing else to serve.
 * Capability reports queue their run too, API_SETTLE_MS later, so a burst of
 * joins is solved once; a change that arrives inside the hysteresis window
 * is queued for the moment the window ends. */
#define SOLVE_QUEUE_MAX 256

struct solve_job {
    char run[SCHED_RUN_MAX + 1];
    double due_ms; /* CLOCK_MONOTONIC */
};

static pthread_mutex_t g_sq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_sq_cv;
static pthread_once_t g_sq_once = PTHREAD_ONCE_INIT;
static struct solve_job g_sq[SOLVE_QUEUE_MAX];
static size_t g_sq_n;
static struct coord_server *g_sq_srv;
static int g_sq_started;

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void schedule_resolve(struct coord_req *req, struct coord_resp *resp, int background);

static void *solver_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_sq_mu);
        struct solve_job job;
        for (;;) {
            size_t best = g_sq_n;
            for (size_t i = 0; i < g_sq_n; i++)
                if (best == g_sq_n || g_sq[i].due_ms < g_sq[best].due_ms)
                    best = i;
            double now = mono_ms();
            if (best < g_sq_n && g_sq[best].due_ms <= now) {
                job = g_sq[best];
                g_sq[best] = g_sq[--g_sq_n];
                break;
            }
            if (best == g_sq_n) {
                pthread_cond_wait(&g_sq_cv, &g_sq_mu);
            } else {
                double due = g_sq[best].due_ms;
                struct timespec ts = {(time_t)(due / 1e3), (long)(fmod(due, 1e3) * 1e6)};
                pthread_cond_timedwait(&g_sq_cv, &g_sq_mu, &ts);
            }
        }
        struct coord_server *srv = g_sq_srv;
        pthread_mutex_unlock(&g_sq_mu);
        if (atomic_load(&srv->draining))
            continue;
        struct coord_req req;
        struct coord_resp resp;
        memset(&req, 0, sizeof req);
        memset(&resp, 0, sizeof resp);
        req.srv = srv;
        req.method = "SOLVE";
        req.path = job.run;
        req.params[0] = job.run;
        req.nparams = 1;
        schedule_resolve(&req, &resp, 1);
        if (resp.status >= 500)
            CM_LOGW("sched", "run %s: background solve: %s", job.run,
                    json_string_value(json_object_get(json_object_get(resp.json, "error"),
                                                      "message")));
        if (req.db)
            coord_db_release(srv->db, req.db);
        json_decref(resp.json);
        free(resp.raw);
    }
    return NULL;
}

static void solver_start(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_sq_cv, &a);
    pthread_condattr_destroy(&a);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, solver_main, NULL) == 0)
        g_sq_started = 1;
    else
        CM_LOGE("sched", "could not start the schedule solver thread; solving in requests");
    pthread_attr_destroy(&at);
}

/* Queues a solve of `run` in delay_ms (an earlier request for the run wins).
 * 0 when there is no solver thread (the caller solves itself). */
int api_sched_enqueue(struct coord_server *srv, const char *run, double delay_ms)
{
    pthread_mutex_lock(&g_sq_mu);
    if (!g_sq_srv)
        g_sq_srv = srv;
    pthread_mutex_unlock(&g_sq_mu);
    pthread_once(&g_sq_once, solver_start);
    if (!g_sq_started)
        return 0;
    double due = mono_ms() + delay_ms;
    pthread_mutex_lock(&g_sq_mu);
    size_t i = 0;
    while (i < g_sq_n && strcmp(g_sq[i].run, run) != 0)
        i++;
    if (i < g_sq_n) {
        if (due < g_sq[i].due_ms)
            g_sq[i].due_ms = due;
    } else if (g_sq_n < SOLVE_QUEUE_MAX) {
        snprintf(g_sq[g_sq_n].run, sizeof g_sq[g_sq_n].run, "%s", run);
        g_sq[g_sq_n++].due_ms = due;
    } /* a full queue drops the request: the next report or GET queues it again */
    pthread_cond_signal(&g_sq_cv);
    pthread_mutex_unlock(&g_sq_mu);
    return 1;
}

/* GET (background = 0): serve the newest schedule, solving here only when
 * there is no valid one. Background: solve when the newest is not good for
 * the live inputs; no answer (resp only carries errors). */
static void schedule_resolve(struct coord_req *req, struct coord_resp *resp, int background)
{
    if ((!background && !api_name_param(req, resp, 0, "run")) || !coord_req_db(req, resp))
        return;
    PGresult *r = api_run_row(req, resp, &S_RUN);
    if (!r)
        return;
    char run_id[24];
    snprintf(run_id, sizeof run_id, "%s", PQgetvalue(r, 0, 0));
    double batch = strtod(PQgetvalue(r, 0, 1), NULL);
    char *end = NULL;
    const char *mp = PQgetvalue(r, 0, 2), *gb = PQgetvalue(r, 0, 3);
    double params = strtod(mp, &end);
    int params_ok = *mp && end && !*end && params >= 1 && params <= 1e12;
    double bits = DEFAULT_GRADIENT_BITS;
    if (*gb) {
        bits = strtod(gb, &end);
        params_ok = params_ok && end && !*end && (bits == 8 || bits == 16 || bits == 32);
    }
    const char *roles = PQgetvalue(r, 0, 4);
    int lp_roles = !strcmp(roles, "lp");
    params_ok = params_ok && (lp_roles || !strcmp(roles, "all"));
    const char *gs = PQgetvalue(r, 0, 5);
    unsigned fixed_m = 0;
    if (*gs) {
        long v = strtol(gs, &end, 10);
        params_ok = params_ok && end && !*end && v >= 2 && v <= SCHED_MAX_PEERS;
        fixed_m = v >= 2 && v <= SCHED_MAX_PEERS ? (unsigned)v : 0;
    }
    const char *rt_mode = PQgetvalue(r, 0, 6);
    int relay_counted = strcmp(rt_mode, "ignored") != 0;
    params_ok = params_ok && (!strcmp(rt_mode, "counted") || !relay_counted);
    PQclear(r);

    struct coord_newest nw = {0};
    struct inputs in = {0};
    long long now = (long long)time(NULL);
    if (coord_newest_load(req, &S_NEWEST, run_id, &nw) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int valid = nw.have && nw.until > now;
    if (!params_ok) {
        if (background)
            ;
        else if (valid)
            coord_newest_respond(req, resp, &nw, 0, "schedule", "schedule");
        else
            coord_resp_error(resp, 409, "run_not_schedulable",
                             "run '%s' needs config.collaboration.model_parameters (a "
                             "positive integer; or config.model_parameters) and optionally "
                             "gradient_bits (8, 16 or 32), compute_roles (\"all\" or "
                             "\"lp\"), group_size (an integer from 2 to %d) and relay_traffic "
                             "(\"counted\" or \"ignored\") to be scheduled",
                             req->params[0], SCHED_MAX_PEERS);
        coord_newest_clear(&nw);
        return;
    }
    json_t *run_doc = json_pack("{s:s, s:f, s:f, s:f, s:s}", "name", req->params[0],
                                "target_batch_size", batch, "model_parameters", params,
                                "gradient_bits", bits, "compute_roles", lp_roles ? "lp" : "all");
    if (run_doc && fixed_m)
        json_object_set_new(run_doc, "group_size", json_integer(fixed_m));
    if (run_doc && !relay_counted)
        json_object_set_new(run_doc, "relay_traffic", json_string("ignored"));
    if (!inputs_load(req, run_id, run_doc, &in, resp)) {
        coord_newest_clear(&nw);
        return;
    }
    if (newest_good(&nw, &in, now) || (!in.n && valid)) {
        /* Inputs changed inside the hysteresis window: solve when it ends. */
        if (in.n && strcmp(nw.sha, in.sha) != 0)
            api_sched_enqueue(req->srv, req->params[0],
                          1e3 * (double)(nw.created + hysteresis_s(&nw, &in) - now) + 100);
        if (!background)
            coord_newest_respond(req, resp, &nw, 0, "schedule", "schedule");
        goto out;
    }
    if (!in.n) {
        if (!background)
            coord_resp_error(resp, 409, "no_peers",
                             "no peer of run '%s' has reported its capabilities in the last %d s",
                             req->params[0], API_CAP_TTL_S);
        goto out;
    }
    /* Stale but still valid: serve it, solve in the background. */
    if (!background && valid && api_sched_enqueue(req->srv, req->params[0], 0)) {
        coord_newest_respond(req, resp, &nw, 0, "schedule", "schedule");
        goto out;
    }
    /* One solver per run across coordinators: wait for the lock, then look again. */
    char cls[16];
    snprintf(cls, sizeof cls, "%d", SCHED_LOCK_CLASS);
    char obj[24];
    snprintf(obj, sizeof obj, "%lld", strtoll(run_id, NULL, 10) & 0x7fffffff);
    const char *lp[] = {cls, obj};
    if (coord_db_cmd(req->db, "BEGIN") != CM_OK ||
        !(r = coord_db_exec(req->db, &S_LOCK, lp, NULL))) {
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    PQclear(r);
    now = (long long)time(NULL);
    if (coord_newest_load(req, &S_NEWEST, run_id, &nw) != CM_OK) {
        coord_db_cmd(req->db, "ROLLBACK");
        coord_resp_error(resp, 500, "internal", "database error");
        goto out;
    }
    int fresh = 0;
    if (!newest_good(&nw, &in, now)) {
        if (!solve_and_store(req, resp, run_id, &in, batch, params * bits / 1e6, lp_roles, fixed_m,
                             &nw)) {
            coord_db_cmd(req->db, "ROLLBACK");
            goto out;
        }
        fresh = 1;
    }
    if (coord_db_cmd(req->db, "COMMIT") != CM_OK) {
        coord_resp_error(resp, 500, "internal", "could not store the schedule");
        goto out;
    }
    if (!background)
        coord_newest_respond(req, resp, &nw, fresh, "schedule", "schedule");
out:
    coord_newest_clear(&nw);
    inputs_free(&in);
}

void api_schedule_get(struct coord_req *req, struct coord_resp *resp)
{
    schedule_resolve(req, resp, 0);
}

/* ---- organizers and auditors: why did a peer get its role ---- */

COORD_DB_STMT(S_HIST_LIST, 1,
              "SELECT s.version, s.kid, extract(epoch from s.created_at)::bigint, "
              "extract(epoch from s.valid_from)::bigint, extract(epoch from s.valid_until)::bigint, "
              "s.solve_ms, jsonb_array_length(s.result->'peers'), "
              "(s.result->>'group_size')::int, (s.result->>'steps_per_s')::float8, "
              "s.inputs_sha256 FROM schedules s JOIN runs r ON r.id = s.run_id "
              "WHERE r.name = $1 ORDER BY s.version DESC LIMIT 100");
COORD_DB_STMT(S_HIST_ONE, 2,
              "SELECT s.kid, extract(epoch from s.created_at)::bigint, "
              "extract(epoch from s.valid_from)::bigint, extract(epoch from s.valid_until)::bigint, "
              "s.solve_ms, s.inputs::text, s.result::text, s.payload, encode(s.signature, 'hex') "
              "FROM schedules s JOIN runs r ON r.id = s.run_id "
              "WHERE r.name = $1 AND s.version = $2");

void api_schedules_list(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || !coord_req_db(req, resp))
        return;
    if (!api_run_known(req, resp))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r;
    if (!(r = coord_db_exec(req->db, &S_HIST_LIST, p, NULL))) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(
            a, json_pack("{s:I, s:s, s:I, s:I, s:I, s:f, s:i, s:i, s:f, s:s}", "version",
                         (json_int_t)strtoll(PQgetvalue(r, i, 0), NULL, 10), "kid",
                         PQgetvalue(r, i, 1), "created_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10), "valid_from",
                         (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "valid_until",
                         (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "solve_ms",
                         strtod(PQgetvalue(r, i, 5), NULL), "peers", atoi(PQgetvalue(r, i, 6)),
                         "group_size", atoi(PQgetvalue(r, i, 7)), "steps_per_s",
                         strtod(PQgetvalue(r, i, 8), NULL), "inputs_sha256",
                         PQgetvalue(r, i, 9)));
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "run", req->params[0], "schedules", a));
}

void api_schedules_get(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run"))
        return;
    char *end = NULL;
    long long v = req->nparams > 1 ? strtoll(req->params[1], &end, 10) : 0;
    if (v <= 0 || !end || *end) {
        coord_resp_error(resp, 404, "not_found", "no such schedule version");
        return;
    }
    if (!coord_req_db(req, resp))
        return;
    char vs[24];
    snprintf(vs, sizeof vs, "%lld", v);
    const char *p[] = {req->params[0], vs};
    PGresult *r = coord_db_exec(req->db, &S_HIST_ONE, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        coord_resp_error(resp, 404, "not_found", "run '%s' has no schedule version %lld",
                         req->params[0], v);
        return;
    }
    json_t *inputs = json_loads(PQgetvalue(r, 0, 5), 0, NULL);
    json_t *result = json_loads(PQgetvalue(r, 0, 6), 0, NULL);
    const char *payload = PQgetvalue(r, 0, 7), *sighex = PQgetvalue(r, 0, 8);
    size_t plen = strlen(payload), n = 0;
    char *p64 = malloc(cm_b64url_encoded_len(plen) + 1), sig64[128];
    uint8_t sig[CM_ED25519_SIG_LEN];
    if (!inputs || !result || !p64 ||
        cm_hex_decode(sighex, strlen(sighex), sig, sizeof sig, &n) != CM_OK || n != sizeof sig) {
        json_decref(inputs);
        json_decref(result);
        free(p64);
        PQclear(r);
        coord_resp_error(resp, 500, "internal", "stored schedule is unreadable");
        return;
    }
    cm_b64url_encode(payload, plen, p64);
    cm_b64url_encode(sig, sizeof sig, sig64);
    json_t *o = json_pack("{s:s, s:I, s:s, s:I, s:I, s:I, s:f, s:s, s:s}", "run",
                          req->params[0], "version", (json_int_t)v, "kid", PQgetvalue(r, 0, 0),
                          "created_at", (json_int_t)strtoll(PQgetvalue(r, 0, 1), NULL, 10),
                          "valid_from", (json_int_t)strtoll(PQgetvalue(r, 0, 2), NULL, 10),
                          "valid_until", (json_int_t)strtoll(PQgetvalue(r, 0, 3), NULL, 10),
                          "solve_ms", strtod(PQgetvalue(r, 0, 4), NULL), "payload", p64,
                          "signature", sig64);
    /* The organizers' inputs (every peer's reports) and the solver's working figures are
     * not public; the signed payload is (it is what GET /schedule serves). */
    if (o && (req->user.role & COORD_ROLES_READ_ADMIN)) {
        json_object_set(o, "inputs", inputs);
        json_object_set(o, "result", result);
    }
    if (o && !strcmp(PQgetvalue(r, 0, 0), req->srv->kid)) {
        char pub[64];
        cm_b64url_encode(req->srv->signing_key.pub, CM_ED25519_PUB_LEN, pub);
        json_object_set_new(o, "coordinator_public_key", json_string(pub));
    }
    json_decref(inputs);
    json_decref(result);
    free(p64);
    PQclear(r);
    if (!o) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    coord_resp_json(resp, 200, o);
}
