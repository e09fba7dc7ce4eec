/* ct-timeout: 180 */
/* The coordinator's DHT backbone: every open run gets a Kademlia node whose
 * address comes with each pass; two peers with passes from the coordinator
 * bootstrap from it and find each other's values; a revoked pass is refused
 * by the backbone once the coordinator refreshed its revocation list; a run
 * that closes loses its backbone node; the run's newest signed schedule is
 * announced in the DHT, verifiable with the coordinator's key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "dht/dht_node.h"
#include "sched/sched.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol;
static int g_teardown_failed;

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/users", g_org,
            "{\"username\":\"vol\",\"role\":\"volunteer\",\"password\":\"volunteer-pw\"}", &r);
    ct_resp_free(&r);
    ct_http(&g_c, "POST", "/api/v1/runs", g_org,
            "{\"name\":\"swarm\",\"target_batch_size\":64,\"config\":{\"model_parameters\":1000000}}", &r);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/swarm/allowlist/vol", g_org, NULL, &r);
    ct_resp_free(&r);
    g_vol = ct_login(&g_c, "vol", "volunteer-pw");
    return g_org && g_vol ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    free(g_org);
    free(g_vol);
    g_teardown_failed = rc != 0;
    return rc;
}

struct peer {
    struct cm_ed25519 key;
    char *token;
    char pass_id[32];
    char boot[8][128];
    size_t nboot;
    uint8_t coord[8][32];
    size_t ncoord;
    struct dht_node *node;
};

/* A pass for a fresh key, waiting (up to 15 s) until it lists a backbone. */
static void get_pass(struct peer *p)
{
    assert_int_equal(cm_ed25519_generate(&p->key), CM_OK);
    for (int attempt = 0; attempt < 150; attempt++) {
        struct ct_resp r;
        assert_int_equal(ct_pass_request(&g_c, g_vol, "swarm", "vol", &p->key, &r), 201);
        json_t *boot = json_object_get(r.json, "bootstrap");
        if (json_array_size(boot) > 0) {
            p->token = strdup(json_string_value(json_object_get(r.json, "access_token")));
            snprintf(p->pass_id, sizeof p->pass_id, "%s", json_string_value(json_object_get(r.json, "pass_id")));
            size_t i;
            json_t *v;
            json_array_foreach(boot, i, v) if (p->nboot < 8) snprintf(p->boot[p->nboot++], 128, "%s", json_string_value(v));
            json_array_foreach(json_object_get(r.json, "coordinator_keys"), i, v) {
                size_t got = 0;
                const char *s = json_string_value(v);
                if (p->ncoord < 8 && cm_b64url_decode(s, strlen(s), p->coord[p->ncoord], 32, &got) == CM_OK)
                    p->ncoord++;
            }
            ct_resp_free(&r);
            return;
        }
        ct_resp_free(&r);
        usleep(100000);
    }
    fail_msg("no backbone address in the pass");
}

static int start_peer(struct peer *p)
{
    const char *boot[8];
    for (size_t i = 0; i < p->nboot; i++)
        boot[i] = p->boot[i];
    struct dht_config cfg = {0};
    cfg.key = &p->key;
    cfg.token = p->token;
    cfg.listen_ip = "127.0.0.1";
    cfg.ctx.auth.run = "swarm";
    cfg.ctx.auth.coord_keys = (const uint8_t(*)[32])p->coord;
    cfg.ctx.auth.n_coord_keys = p->ncoord;
    cfg.rpc_timeout_ms = 2000;
    int rc = dht_node_start(&cfg, &p->node);
    if (rc != CM_OK)
        return rc;
    return dht_bootstrap(p->node, boot, p->nboot, 10000);
}

static void stop_peer(struct peer *p)
{
    if (p->node)
        dht_node_stop(p->node);
    p->node = NULL;
    free(p->token);
    cm_ed25519_cleanup(&p->key);
}

static void test_peers_meet_through_backbone(void **state)
{
    (void)state;
    struct peer a = {0}, b = {0};
    get_pass(&a);
    get_pass(&b);
    assert_int_equal(start_peer(&a), CM_OK);
    assert_int_equal(start_peer(&b), CM_OK);
    const char *key = "progress.swarm";
    const char *val = "{\"step\":7}";
    int stored = 0;
    int64_t exp = (int64_t)time(NULL) * 1000 + 60000;
    assert_int_equal(dht_put(a.node, key, strlen(key), "a", 1, val, strlen(val), exp, 10000, &stored), CM_OK);
    assert_true(stored >= 1);
    struct dht_result res;
    assert_int_equal(dht_get(b.node, key, strlen(key), 10000, &res), CM_OK);
    assert_true(res.nrec >= 1);
    int found = 0;
    for (size_t i = 0; i < res.nrec; i++)
        found |= res.rec[i].value_len == strlen(val) && !memcmp(res.rec[i].value, val, strlen(val));
    assert_true(found);
    dht_result_cleanup(&res);
    stop_peer(&a);
    stop_peer(&b);
}

static void test_schedule_announced(void **state)
{
    (void)state;
    struct peer a = {0}, b = {0};
    get_pass(&a);
    get_pass(&b);
    char pk[64], body[512];
    struct ct_resp r;
    for (int i = 0; i < 2; i++) {
        cm_b64url_encode(i ? b.key.pub : a.key.pub, 32, pk);
        snprintf(body, sizeof body,
                 "{\"peer_public_key\":\"%s\",\"samples_per_s\":100,\"upload_mbps\":100,"
                 "\"download_mbps\":100,\"accepts_inbound\":true}", pk);
        ct_http(&g_c, "POST", "/api/v1/runs/swarm/capabilities", g_vol, body, &r);
        assert_int_equal(r.status, 200);
        ct_resp_free(&r);
    }
    long version = 0;
    for (int i = 0; i < 150 && version == 0; i++) {
        ct_http(&g_c, "GET", "/api/v1/runs/swarm/schedule", NULL, NULL, &r);
        if (r.status == 200)
            version = (long)json_integer_value(json_object_get(r.json, "version"));
        ct_resp_free(&r);
        if (!version)
            usleep(100000);
    }
    assert_true(version > 0);
    assert_int_equal(start_peer(&b), CM_OK);
    int ok = 0;
    for (int i = 0; i < 30 && !ok; i++) {
        struct dht_result res;
        const char *key = "swarm/schedule";
        if (dht_get(b.node, key, strlen(key), 5000, &res) == CM_OK) {
            for (size_t k = 0; k < res.nrec && !ok; k++) {
                json_t *o = json_loadb((const char *)res.rec[k].value, res.rec[k].value_len, 0, NULL);
                const char *p64 = json_string_value(json_object_get(o, "payload"));
                const char *s64 = json_string_value(json_object_get(o, "signature"));
                static uint8_t payload[SCHED_JSON_MAX];
                uint8_t sig[64];
                size_t plen = 0, slen = 0;
                if (p64 && s64 && json_integer_value(json_object_get(o, "version")) >= version &&
                    cm_b64url_decode(p64, strlen(p64), payload, sizeof payload, &plen) == CM_OK &&
                    cm_b64url_decode(s64, strlen(s64), sig, sizeof sig, &slen) == CM_OK && slen == 64)
                    for (size_t c = 0; c < b.ncoord && !ok; c++)
                        ok = sched_verify(b.coord[c], payload, plen, sig) == CM_OK;
                json_decref(o);
            }
            dht_result_cleanup(&res);
        }
        if (!ok)
            sleep(1);
    }
    assert_true(ok);
    stop_peer(&a);
    stop_peer(&b);
}

static void test_revoked_pass_refused(void **state)
{
    (void)state;
    struct peer c = {0};
    get_pass(&c);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/swarm/passes/%s/revoke", c.pass_id);
    struct ct_resp r;
    ct_http(&g_c, "POST", path, g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
    /* The backbone picks up revocations within its refresh period (5 s). */
    sleep(6);
    assert_int_not_equal(start_peer(&c), CM_OK);
    stop_peer(&c);
}

static void test_closed_run_loses_backbone(void **state)
{
    (void)state;
    struct ct_resp r;
    ct_http(&g_c, "PATCH", "/api/v1/runs/swarm", g_org, "{\"status\":\"finished\"}", &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
    long left = 1;
    for (int i = 0; i < 100 && left; i++) {
        usleep(100000);
        assert_int_equal(ct_pg_scalar(&g_pg, "SELECT count(*) FROM dht_backbones", &left), 0);
    }
    assert_int_equal(left, 0);
    /* and passes can no longer be had for it */
    struct cm_ed25519 k;
    assert_int_equal(cm_ed25519_generate(&k), CM_OK);
    assert_int_equal(ct_pass_request(&g_c, g_vol, "swarm", "vol", &k, &r), 409);
    ct_resp_free(&r);
    cm_ed25519_cleanup(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers_meet_through_backbone),
        cmocka_unit_test(test_schedule_announced),
        cmocka_unit_test(test_revoked_pass_refused),
        cmocka_unit_test(test_closed_run_loses_backbone),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
