/* ct-timeout: 180 */
/* Integration tests of capability reports and signed schedules (seed
 * 000_02cc6b5d62a616fc.txt §3.2; coordinator/api_sched.c): a real
 * PostgreSQL and the real coordinator over HTTPS. Reports need an
 * allowlisted caller holding a valid pass for the peer key, and bad reports
 * change nothing; the served schedule verifies under the published key over
 * the documented bytes, reflects the inputs (a no-compute high-bandwidth
 * peer becomes the parameter server), is re-solved in the background when
 * peers join or leave or figures change, but not more often than the
 * hysteresis allows (5 s after the last solve for a change of peers, 30 s
 * for figures; GETs
 * keep serving the valid schedule meanwhile), is stored with its
 * inputs, result and solve time, and is solved once when two coordinators
 * are asked at the same moment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "sched/sched.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol, *g_out;
static int g_teardown_failed;

#define PW "a-long-password"
#define NPEERS 10
static struct cm_ed25519 g_peer[NPEERS];
static char g_pk[NPEERS][64];

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

static const char *err_code(const struct ct_resp *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static void expect(const char *method, const char *path, const char *bearer, const char *body,
                   long status, const char *code)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    if (r.status != status || (code && (!err_code(&r) || strcmp(err_code(&r), code) != 0)))
        fail_msg("%s %s %s: expected %ld %s, got %ld %s", method, path, body ? body : "", status,
                 code ? code : "", r.status, r.body ? r.body : "(none)");
    ct_resp_free(&r);
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || !(g_org = ct_login(&g_c, "org", PW)))
        return -1;
    const char *users[] = {"vol", "outsider"};
    for (int i = 0; i < 2; i++) {
        char body[200];
        snprintf(body, sizeof body,
                 "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"" PW "\"}", users[i]);
        if (req("POST", "/api/v1/users", g_org, body) != 201)
            return -1;
    }
    if (!(g_vol = ct_login(&g_c, "vol", PW)) || !(g_out = ct_login(&g_c, "outsider", PW)))
        return -1;
    /* ResNet-50 in fp32, as in the seed's Table 1 (bench/dedloc_table1.json). */
    if (req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"resnet\",\"target_batch_size\":4096,\"config\":"
            "{\"model_parameters\":25557032,\"gradient_bits\":32}}") != 201 ||
        req("POST", "/api/v1/runs", g_org, "{\"name\":\"noconf\",\"target_batch_size\":64}") != 201 ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"empty\",\"target_batch_size\":64,\"config\":{\"model_parameters\":1000}}") !=
            201 ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"badgroup\",\"target_batch_size\":64,\"config\":{\"collaboration\":"
            "{\"model_parameters\":1000,\"group_size\":1}}}") != 201 ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"badgroup2\",\"target_batch_size\":64,\"config\":{\"collaboration\":"
            "{\"model_parameters\":1000,\"group_size\":\"two\"}}}") != 201 ||
        req("PUT", "/api/v1/runs/resnet/allowlist/vol", g_org, NULL) != 201)
        return -1;
    for (int i = 0; i < NPEERS; i++) {
        if (cm_ed25519_generate(&g_peer[i]) != CM_OK)
            return -1;
        cm_b64url_encode(g_peer[i].pub, CM_ED25519_PUB_LEN, g_pk[i]);
    }
    /* Passes for all but the last key (the last one tests "no pass"). */
    for (int i = 0; i < NPEERS - 1; i++) {
        char body[1024];
        if (ct_pass_body("resnet", "vol", &g_peer[i], body, sizeof body) != 0 ||
            req("POST", "/api/v1/runs/resnet/passes", g_vol, body) != 201)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NPEERS; i++)
        cm_ed25519_cleanup(&g_peer[i]);
    free(g_org);
    free(g_vol);
    free(g_out);
    g_teardown_failed = rc != 0;
    return rc;
}

static void report(int i, double s, double bw, int inbound, long status)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":%g,\"upload_mbps\":%g,"
             "\"download_mbps\":%g,\"accepts_inbound\":%s}",
             g_pk[i], s, bw, bw, inbound ? "true" : "false");
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body, status, NULL);
}

static long scalar(const char *sql)
{
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return v;
}

static void test_capabilities_checked(void **state)
{
    (void)state;
    char body[2048];
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,"
             "\"download_mbps\":100,\"accepts_inbound\":true}",
             g_pk[0]);
    expect("POST", "/api/v1/runs/resnet/capabilities", NULL, body, 401, NULL);
    expect("POST", "/api/v1/runs/resnet/capabilities", g_out, body, 403, "not_allowlisted");
    expect("POST", "/api/v1/runs/nope/capabilities", g_vol, body, 404, "not_found");
    /* A key the caller holds no pass for. */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,"
             "\"download_mbps\":100,\"accepts_inbound\":true}",
             g_pk[NPEERS - 1]);
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body, 403, "no_pass");
    static const char *bad[] = {
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":-1,"
        "\"download_mbps\":100,\"accepts_inbound\":true}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":0,"
        "\"download_mbps\":100,\"accepts_inbound\":true}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1e300,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":\"fast\",\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"gpu\":\"h100\"}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":\"x\","
        "\"mbps\":5}]}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"mbps\":-5}]}",
        /* a pair's round trip: positive, at most a minute, a number */
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"mbps\":5,\"rtt_ms\":0}]}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"mbps\":5,\"rtt_ms\":60001}]}",
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"mbps\":5,\"rtt_ms\":\"fast\"}]}",
        /* a pair with neither a throughput nor a round trip */
        "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}]}",
        "{\"peer_public_key\":\"short\",\"samples_per_s\":1,\"upload_mbps\":10,"
        "\"download_mbps\":100,\"accepts_inbound\":true%s}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, bad[i], i + 1 == sizeof bad / sizeof bad[0] ? "" : g_pk[0]);
        expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body, 400, "invalid_request");
    }
    /* A pair naming the reporting peer itself. */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
             "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
             "\"%s\",\"mbps\":5}]}",
             g_pk[0], g_pk[0]);
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body, 400, "invalid_request");
    /* Too many pairs. */
    size_t o = (size_t)snprintf(body, sizeof body,
                                "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
                                "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[",
                                g_pk[0]);
    char *big = malloc(16384);
    memcpy(big, body, o);
    for (int i = 0; i <= SCHED_MAX_LINKS; i++)
        o += (size_t)snprintf(big + o, 16384 - o, "%s{\"peer_public_key\":\"%s\",\"mbps\":5}",
                              i ? "," : "", g_pk[1]);
    snprintf(big + o, 16384 - o, "]}");
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, big, 400, "invalid_request");
    free(big);
    /* Nothing of the above was stored. */
    assert_int_equal(scalar("SELECT count(*) FROM capabilities"), 0);
    /* A measured round trip is kept with its pair (the pipeline scheduler's
       delay, docs/pipelines.md); then the report goes, for the tests below. */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":1,\"upload_mbps\":10,"
             "\"download_mbps\":100,\"accepts_inbound\":true,\"pairs\":[{\"peer_public_key\":"
             "\"%s\",\"mbps\":5,\"rtt_ms\":42.5},{\"peer_public_key\":\"%s\",\"mbps\":7},"
             "{\"peer_public_key\":\"%s\",\"rtt_ms\":3.5}]}",
             g_pk[0], g_pk[1], g_pk[2], g_pk[3]);
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body, 200, NULL);
    assert_int_equal(scalar("SELECT (10 * (p->>'rtt_ms')::float8)::bigint FROM capabilities c, "
                            "jsonb_array_elements(c.report->'pairs') p WHERE p ? 'rtt_ms' AND p ? 'mbps'"),
                     425);
    assert_int_equal(scalar("SELECT count(*) FROM capabilities c, jsonb_array_elements(c.report->'pairs') p"), 3);
    assert_int_equal(scalar("SELECT (10 * (p->>'rtt_ms')::float8)::bigint FROM capabilities c, "
                            "jsonb_array_elements(c.report->'pairs') p WHERE NOT p ? 'mbps'"),
                     35);
    assert_int_equal(scalar("WITH d AS (DELETE FROM capabilities RETURNING 1) SELECT count(*) FROM d"), 1);
}

/* Verifies a served schedule as a peer would: signature with a published
 * key over "crowdtrain-schedule/1\n" + payload, then the strict decoder. */
static const char *g_run = "resnet"; /* the run fetch_verified reads */

static void fetch_verified(struct sched_schedule *s, long long *version, int *solved_now)
{
    struct ct_resp k, r;
    ct_http(&g_c, "GET", "/api/v1/keys", NULL, NULL, &k);
    assert_int_equal(k.status, 200);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/schedule", g_run);
    ct_http(&g_c, "GET", path, NULL, NULL, &r);
    if (r.status != 200)
        fail_msg("GET schedule: %ld %s", r.status, r.body ? r.body : "");
    const char *p64 = json_string_value(json_object_get(r.json, "payload"));
    const char *s64 = json_string_value(json_object_get(r.json, "signature"));
    assert_non_null(p64);
    assert_non_null(s64);
    size_t plen = 0, slen = 0;
    char *payload = malloc(strlen(p64) + 1);
    uint8_t sig[CM_ED25519_SIG_LEN];
    assert_int_equal(cm_b64url_decode(p64, strlen(p64), (uint8_t *)payload, strlen(p64), &plen),
                     CM_OK);
    assert_int_equal(cm_b64url_decode(s64, strlen(s64), sig, sizeof sig, &slen), CM_OK);
    assert_int_equal(slen, sizeof sig);
    int verified = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(k.json, "keys"), i, e) {
        uint8_t pub[32];
        size_t n = 0;
        const char *pk = json_string_value(json_object_get(e, "public_key"));
        if (pk && cm_b64url_decode(pk, strlen(pk), pub, 32, &n) == CM_OK && n == 32 &&
            sched_verify(pub, payload, plen, sig) == CM_OK)
            verified = 1;
    }
    assert_true(verified);
    /* Tampering with one byte breaks it. */
    payload[plen / 2] ^= 0x20;
    json_array_foreach(json_object_get(k.json, "keys"), i, e) {
        uint8_t pub[32];
        size_t n = 0;
        const char *pk = json_string_value(json_object_get(e, "public_key"));
        if (pk && cm_b64url_decode(pk, strlen(pk), pub, 32, &n) == CM_OK && n == 32)
            assert_int_equal(sched_verify(pub, payload, plen, sig), CM_EBADSIG);
    }
    payload[plen / 2] ^= 0x20;
    char err[256] = "";
    if (sched_schedule_decode(payload, plen, s, err, sizeof err) != CM_OK)
        fail_msg("decode: %s", err);
    assert_string_equal(s->run, g_run);
    assert_int_equal(s->version, json_integer_value(json_object_get(r.json, "version")));
    assert_true(s->valid_until > s->valid_from);
    *version = s->version;
    *solved_now = json_is_true(json_object_get(r.json, "solved_now"));
    free(payload);
    ct_resp_free(&k);
    ct_resp_free(&r);
}

/* A GET serves the valid schedule it has and re-solves in the background:
 * fetch until the served version is `want` (10 s at most). The GET that
 * queued the solve did not solve it (solved_now false). */
static void fetch_version(struct sched_schedule *s, long long want)
{
    long long v = 0;
    int fresh = 0;
    for (int tries = 0; tries < 100; tries++) {
        fetch_verified(s, &v, &fresh);
        assert_false(fresh);
        if (v == want)
            return;
        sched_schedule_cleanup(s);
        usleep(100 * 1000);
    }
    fail_msg("schedule version %lld was not served within 10 s (last %lld)", want, v);
}

static int index_of(const struct sched_schedule *s, int peer)
{
    for (size_t i = 0; i < s->n; i++)
        if (!memcmp(s->peers[i].key, g_peer[peer].pub, 32))
            return (int)i;
    return -1;
}

static void test_schedule_served_and_resolved(void **state)
{
    (void)state;
    expect("GET", "/api/v1/runs/nope/schedule", NULL, NULL, 404, "not_found");
    expect("GET", "/api/v1/runs/noconf/schedule", NULL, NULL, 409, "run_not_schedulable");
    /* the organizer's group size must be an integer from 2 to SCHED_MAX_PEERS */
    expect("GET", "/api/v1/runs/badgroup/schedule", NULL, NULL, 409, "run_not_schedulable");
    expect("GET", "/api/v1/runs/badgroup2/schedule", NULL, NULL, 409, "run_not_schedulable");
    expect("GET", "/api/v1/runs/empty/schedule", NULL, NULL, 409, "no_peers");
    expect("GET", "/api/v1/runs/resnet/schedule", NULL, NULL, 409, "no_peers");

    /* Seed §3.2 case 2: 7 GPU peers at 1 Gbit/s and one 10 Gbit/s peer without GPU. */
    for (int i = 0; i < 7; i++)
        report(i, 100, 1000, 1, 200);
    report(7, 0, 10000, 1, 200);
    struct sched_schedule s;
    long long v1 = 0, v = 0;
    int fresh = 0;
    fetch_verified(&s, &v1, &fresh);
    assert_true(fresh);
    assert_int_equal(s.n, 8);
    int ps = index_of(&s, 7);
    assert_true(ps >= 0);
    assert_int_equal(s.peers[ps].share, SCHED_SHARE_TOTAL);
    assert_false(s.peers[ps].compute);
    for (int i = 0; i < 7; i++) {
        int at = index_of(&s, i);
        assert_true(at >= 0);
        assert_true(s.peers[at].compute);
        assert_int_equal(s.peers[at].share, 0);
    }
    assert_int_equal(s.group_size, 8); /* no failures in the history: one group */
    assert_int_equal(s.target_batch, 4096);
    sched_schedule_cleanup(&s);

    /* Same inputs (a re-report with the same figures): the same schedule. */
    report(3, 100, 1000, 1, 200);
    fetch_verified(&s, &v, &fresh);
    assert_int_equal(v, v1);
    assert_false(fresh);
    sched_schedule_cleanup(&s);

    /* A new peer joins: within the hysteresis window the last schedule stays. Its
       report has a measured pair and a round trip alone (as pipeline stages report
       them), which is no link for the LP (the inputs below). */
    char body8[1024];
    snprintf(body8, sizeof body8,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":1000,"
             "\"download_mbps\":1000,\"accepts_inbound\":false,\"pairs\":[{\"peer_public_key\":\"%s\","
             "\"rtt_ms\":80},{\"peer_public_key\":\"%s\",\"mbps\":900}]}",
             g_pk[8], g_pk[0], g_pk[1]);
    expect("POST", "/api/v1/runs/resnet/capabilities", g_vol, body8, 200, NULL);
    fetch_verified(&s, &v, &fresh);
    assert_int_equal(v, v1);
    assert_int_equal(s.n, 8);
    sched_schedule_cleanup(&s);
    /* ... and once the window for a change of peers (5 s; 30 s for figures) has passed, the
     * new peer is in (as a client-mode sender), solved in the background: the GET that
     * notices serves the old one meanwhile. */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE schedules SET created_at = created_at - "
                                       "interval '8 seconds'"),
                     0);
    fetch_version(&s, v1 + 1);
    assert_int_equal(s.n, 9);
    int cl = index_of(&s, 8);
    assert_true(cl >= 0);
    assert_true(s.peers[cl].client_mode);
    assert_int_equal(s.peers[cl].share, 0);
    assert_true(s.peers[cl].compute);
    sched_schedule_cleanup(&s);

    /* Stored with inputs, result and solve time: why each peer got its role. */
    assert_int_equal(scalar("SELECT count(*) FROM schedules"), 2);
    assert_int_equal(scalar("SELECT jsonb_array_length(inputs->'peers') FROM schedules "
                            "WHERE version = 2"),
                     9);
    assert_int_equal(scalar("SELECT sum(jsonb_array_length(p->'pairs')) FROM schedules, "
                            "jsonb_array_elements(inputs->'peers') p WHERE version = 2"),
                     1);
    assert_int_equal(scalar("SELECT count(*) FROM schedules WHERE solve_ms > 0 AND "
                            "result->>'steps_per_s' IS NOT NULL AND length(signature) = 64"),
                     2);
    assert_int_equal(scalar("SELECT (r->>'share')::bigint FROM schedules, "
                            "jsonb_array_elements(result->'peers') r WHERE version = 2 AND "
                            "(r->>'compute')::boolean = false"),
                     SCHED_SHARE_TOTAL);

    /* ... and readable over the API by organizers and auditors. */
    struct ct_resp h;
    ct_http(&g_c, "GET", "/api/v1/runs/resnet/schedules", g_org, NULL, &h);
    assert_int_equal(h.status, 200);
    json_t *list = json_object_get(h.json, "schedules");
    assert_int_equal(json_array_size(list), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 0), "version")),
                     v1 + 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 0), "peers")), 9);
    ct_resp_free(&h);
    char hp[96];
    snprintf(hp, sizeof hp, "/api/v1/runs/resnet/schedules/%lld", v1);
    ct_http(&g_c, "GET", hp, g_org, NULL, &h);
    assert_int_equal(h.status, 200);
    assert_int_equal(json_array_size(json_object_get(json_object_get(h.json, "inputs"), "peers")),
                     8);
    json_t *rp = json_object_get(json_object_get(h.json, "result"), "peers");
    int ps_seen = 0;
    size_t ri;
    json_t *re;
    json_array_foreach(rp, ri, re) {
        if (!strcmp(json_string_value(json_object_get(re, "peer_public_key")), g_pk[7])) {
            ps_seen = 1;
            assert_int_equal(json_integer_value(json_object_get(re, "share")), SCHED_SHARE_TOTAL);
            assert_false(json_is_true(json_object_get(re, "compute")));
        }
    }
    assert_true(ps_seen);
    ct_resp_free(&h);
    /* Any caller gets the signed form of a version (agents fetch the one a round uses),
     * without the organizers' inputs and results. */
    const char *who[] = {g_vol, NULL};
    for (int w = 0; w < 2; w++) {
        ct_http(&g_c, "GET", hp, who[w], NULL, &h);
        assert_int_equal(h.status, 200);
        assert_null(json_object_get(h.json, "inputs"));
        assert_null(json_object_get(h.json, "result"));
        assert_int_equal(json_integer_value(json_object_get(h.json, "version")), v1);
        assert_non_null(json_string_value(json_object_get(h.json, "payload")));
        assert_non_null(json_string_value(json_object_get(h.json, "signature")));
        assert_non_null(json_string_value(json_object_get(h.json, "coordinator_public_key")));
        ct_resp_free(&h);
    }
    expect("GET", "/api/v1/runs/resnet/schedules/999", g_org, NULL, 404, "not_found");
    expect("GET", "/api/v1/runs/resnet/schedules/x1", g_org, NULL, 404, "not_found");
    expect("GET", "/api/v1/runs/nope/schedules", g_org, NULL, 404, "not_found");

    /* A figure changes (the same peers): 8 s after the last solve is inside the 30 s
     * window for that, so the schedule stays. */
    report(3, 120, 1000, 1, 200);
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE schedules SET created_at = created_at - "
                                       "interval '8 seconds'"),
                     0);
    for (int k = 0; k < 3; k++) {
        fetch_verified(&s, &v, &fresh);
        assert_int_equal(v, v1 + 1);
        sched_schedule_cleanup(&s);
        usleep(300 * 1000);
    }

    /* The parameter server leaves (its report expires): the GPU peers average among
     * themselves, each aggregating a part. */
    assert_int_equal(ct_pg_exec(&g_pg,
                                "UPDATE capabilities SET reported_at = now() - interval '300 s', "
                                "first_reported_at = now() - interval '400 s', expires_at = now() "
                                "- interval '1 s' WHERE report->>'samples_per_s' = '0.0' OR "
                                "(report->>'samples_per_s')::float = 0"),
                     0);
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE schedules SET created_at = created_at - "
                                       "interval '40 seconds'"),
                     0);
    fetch_version(&s, v1 + 2);
    assert_int_equal(s.n, 8);
    assert_int_equal(index_of(&s, 7), -1);
    for (int i = 0; i < 7; i++)
        assert_true(s.peers[index_of(&s, i)].share > 0);
    sched_schedule_cleanup(&s);
    /* Its return is a departure in the failure history. */
    report(7, 0, 10000, 1, 200);
    assert_int_equal(scalar("SELECT count(*) FROM capability_departures"), 1);

    /* A revoked pass stops reports from that key. */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/resnet/passes", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    const char *pid = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "passes"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "peer_public_key")), g_pk[2]))
            pid = json_string_value(json_object_get(e, "pass_id"));
    assert_non_null(pid);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/resnet/passes/%s/revoke", pid);
    assert_int_equal(req("POST", path, g_org, NULL), 200);
    ct_resp_free(&r);
    report(2, 100, 1000, 1, 403);
}

struct getter {
    const struct ct_coord *c;
    long status;
    long long version;
    int solved_now;
};

static void *get_thread(void *arg)
{
    struct getter *g = arg;
    struct ct_resp r;
    ct_http(g->c, "GET", "/api/v1/runs/resnet/schedule", NULL, NULL, &r);
    g->status = r.status;
    g->version = json_integer_value(json_object_get(r.json, "version"));
    g->solved_now = json_is_true(json_object_get(r.json, "solved_now"));
    ct_resp_free(&r);
    return NULL;
}

/* Two coordinators on one database asked at once after the inputs changed:
 * every GET is answered at once with the valid schedule, both queue a
 * background solve, exactly one solves (the advisory lock), both then serve
 * the same version, and a schedule signed by either verifies with the keys
 * either publishes. */
/* Where peers may reach each peer travels in the schedule ("ip",
 * docs/p2p.md "Announced addresses"): the address the coordinator sees a
 * report come from, whatever the report claims; for a relayed peer its
 * relay's, when the relay is another live peer (or a backbone node). A
 * relay anywhere else makes the peer a client: no part of the gradient
 * goes to an address no live peer has. */
static void addresses_in(const char *run, const char *cfg, int counted)
{
    char path[160], body[1024];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"target_batch_size\":64,\"config\":%s}", run, cfg);
    assert_int_equal(req("POST", "/api/v1/runs", g_org, body), 201);
    snprintf(path, sizeof path, "/api/v1/runs/%s/allowlist/vol", run);
    assert_int_equal(req("PUT", path, g_org, NULL), 201);
    struct cm_ed25519 key[3];
    char pk[3][64];
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", run);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cm_ed25519_generate(&key[i]), CM_OK);
        cm_b64url_encode(key[i].pub, CM_ED25519_PUB_LEN, pk[i]);
        assert_int_equal(ct_pass_body(run, "vol", &key[i], body, sizeof body), 0);
        expect("POST", path, g_vol, body, 201, NULL);
    }
    snprintf(path, sizeof path, "/api/v1/runs/%s/capabilities", run);
    /* 0: direct, claiming to be at another host */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,\"download_mbps\":100,"
             "\"accepts_inbound\":true,\"reachability\":\"direct\",\"address\":\"203.0.113.9\"}",
             pk[0]);
    expect("POST", path, g_vol, body, 200, NULL);
    /* 1: relayed by peer 0 (at the address the coordinator sees peer 0 at) */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,\"download_mbps\":100,"
             "\"accepts_inbound\":true,\"reachability\":\"relayed\",\"relay\":\"127.0.0.1:4100\"}",
             pk[1]);
    expect("POST", path, g_vol, body, 200, NULL);
    /* 2: "relayed" by a host that is no peer of the run */
    snprintf(body, sizeof body,
             "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,\"download_mbps\":100,"
             "\"accepts_inbound\":true,\"reachability\":\"relayed\",\"relay\":\"198.51.100.7:4100\"}",
             pk[2]);
    expect("POST", path, g_vol, body, 200, NULL);
    struct sched_schedule s;
    long long v = 0;
    int fresh = 0;
    g_run = run;
    fetch_verified(&s, &v, &fresh);
    g_run = "resnet";
    assert_int_equal(s.n, 3);
    int at[3] = {-1, -1, -1};
    for (size_t k = 0; k < s.n; k++)
        for (int i = 0; i < 3; i++)
            if (!memcmp(s.peers[k].key, key[i].pub, CM_ED25519_PUB_LEN))
                at[i] = (int)k;
    int a0 = at[0], a1 = at[1], a2 = at[2];
    assert_true(a0 >= 0 && a1 >= 0 && a2 >= 0);
    assert_string_equal(s.peers[a0].ip, "127.0.0.1"); /* not 203.0.113.9 */
    assert_false(s.peers[a0].client_mode);
    assert_string_equal(s.peers[a1].ip, "127.0.0.1");
    assert_false(s.peers[a1].client_mode);
    assert_string_equal(s.peers[a2].ip, "");
    assert_true(s.peers[a2].client_mode);
    assert_int_equal(s.peers[a2].share, 0);
    assert_int_equal(s.peers[a0].share + s.peers[a1].share, SCHED_SHARE_TOTAL);
    sched_schedule_cleanup(&s);
    /* the LP counted peer 1's traffic on peer 0's link (its inputs say so),
       unless the run ignores it, and nothing for peer 2, whose relay is
       nobody's */
    char q[512];
    for (int k = 1; k < 3; k++) {
        snprintf(q, sizeof q,
                 "SELECT count(*) FROM schedules s JOIN runs r ON r.id = s.run_id, "
                 "jsonb_array_elements(s.inputs->'peers') p WHERE r.name = '%s' AND "
                 "p->>'peer_public_key' = '%s' AND p->>'relay_peer' = '%s'",
                 run, pk[k], pk[0]);
        assert_int_equal(scalar(q) > 0, counted && k == 1);
    }
    /* the organizer sees where the coordinator sees each peer */
    struct ct_resp r;
    snprintf(path, sizeof path, "/api/v1/runs/%s/peers", run);
    ct_http(&g_c, "GET", path, g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "peers"), i, e)
        assert_string_equal(json_string_value(json_object_get(e, "address")), "127.0.0.1");
    ct_resp_free(&r);
    for (int k = 0; k < 3; k++)
        cm_ed25519_cleanup(&key[k]);
}

static void test_schedule_addresses(void **state)
{
    (void)state;
    /* the same reports in a run that counts relayed traffic (the default)
       and in one that ignores it (config relay_traffic) */
    const char *runs[2] = {"addrs", "addrs-free"};
    const char *cfgs[2] = {"{\"model_parameters\":1000}", "{\"model_parameters\":1000,\"relay_traffic\":\"ignored\"}"};
    for (int m = 0; m < 2; m++)
        addresses_in(runs[m], cfgs[m], m == 0);
    /* any other value: the run cannot be scheduled, and says why */
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"addrs-bad\",\"target_batch_size\":64,\"config\":"
                         "{\"model_parameters\":1000,\"relay_traffic\":\"sometimes\"}}"),
                     201);
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/addrs-bad/schedule", NULL, NULL, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.body, "relay_traffic"));
    ct_resp_free(&r);
}

static void test_two_coordinators_one_solve(void **state)
{
    (void)state;
    struct ct_coord b;
    assert_int_equal(ct_coord_start(&b, g_pg.url, NULL, NULL), 0);
    long before = scalar("SELECT count(*) FROM schedules");
    long long newest = scalar("SELECT max(version) FROM schedules");
    report(5, 150, 1000, 1, 200); /* a figure changed */
    assert_int_equal(ct_pg_exec(&g_pg, "UPDATE schedules SET created_at = created_at - "
                                       "interval '40 seconds'"),
                     0);
    struct getter g[4] = {{&g_c, 0, 0, 0}, {&b, 0, 0, 0}, {&g_c, 0, 0, 0}, {&b, 0, 0, 0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, get_thread, &g[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(g[i].status, 200);
        assert_true(g[i].version == newest || g[i].version == newest + 1);
        assert_false(g[i].solved_now);
    }
    for (int tries = 0; tries < 100 && scalar("SELECT count(*) FROM schedules") == before; tries++)
        usleep(100 * 1000);
    sleep(1); /* the other coordinator's queued solve has run by now, and found it done */
    assert_int_equal(scalar("SELECT count(*) FROM schedules"), before + 1);
    /* Both coordinators' keys are published on each; the schedule verifies from B too. */
    struct ct_coord saved = g_c;
    g_c = b;
    struct sched_schedule s;
    long long v = 0;
    int fresh = 0;
    fetch_verified(&s, &v, &fresh);
    assert_int_equal(v, newest + 1);
    assert_false(fresh);
    /* Peer 2's pass was revoked (previous test): its live report no longer counts. */
    assert_int_equal(index_of(&s, 2), -1);
    assert_true(index_of(&s, 5) >= 0);
    sched_schedule_cleanup(&s);
    g_c = saved;
    assert_int_equal(ct_coord_cleanup(&b), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capabilities_checked),
        cmocka_unit_test(test_schedule_served_and_resolved),
        cmocka_unit_test(test_schedule_addresses),
        cmocka_unit_test(test_two_coordinators_one_solve),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
