/* ct-timeout: 240 */
/* Contribution reports park their connection until the report writer's
 * group commit (coordinator/http.c, coord_req_defer; api_contrib.c): many
 * at once are all answered, each exactly once, and stored once; and a
 * coordinator told to stop while reports are parked answers or refuses
 * every one it read, stores exactly those it answered 201, and exits
 * cleanly (libmicrohttpd must never be stopped with parked connections;
 * under the sanitizers the exit status carries any report). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"

#define PW "a-long-password"
#define NAGENTS 160

static struct ct_pg g_pg;
static struct ct_coord g_c;
static struct cm_ed25519 g_key[NAGENTS];
static char *g_tok[NAGENTS];

static long req(const char *method, const char *path, const char *bearer, const char *body)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long st = r.status;
    ct_resp_free(&r);
    return st;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    char *org = NULL, *vol = NULL;
    /* all NAGENTS agents come from 127.0.0.1: lift the per-address cap */
    const char *one_address[] = {"--max-connections-per-ip", "0", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, one_address) != 0 ||
        !(org = ct_login(&g_c, "org", PW)))
        return -1;
    if (req("POST", "/api/v1/users", org,
            "{\"username\":\"vol\",\"role\":\"volunteer\",\"password\":\"" PW "\"}") != 201 ||
        req("POST", "/api/v1/runs", org, "{\"name\":\"r\",\"target_batch_size\":256}") != 201 ||
        req("PUT", "/api/v1/runs/r/allowlist/vol", org, NULL) != 201 ||
        !(vol = ct_login(&g_c, "vol", PW)))
        return -1;
    for (int i = 0; i < NAGENTS; i++) {
        if (cm_ed25519_generate(&g_key[i]) != CM_OK)
            return -1;
        struct ct_resp r;
        if (ct_pass_request(&g_c, vol, "r", "vol", &g_key[i], &r) == 201)
            g_tok[i] = strdup(json_string_value(json_object_get(r.json, "access_token")));
        ct_resp_free(&r);
        if (!g_tok[i])
            return -1;
    }
    free(org);
    free(vol);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NAGENTS; i++)
        free(g_tok[i]);
    return rc;
}

/* Agent i's signed report for `step` (a group of its own: no members). */
static char *report_body(int i, int step)
{
    char pk[64], payload[512], round[65];
    uint8_t rid[32];
    char seed[32];
    snprintf(seed, sizeof seed, "round-%d-%d", step, i);
    cm_sha256(seed, strlen(seed), rid);
    cm_hex_encode(rid, sizeof rid, round);
    cm_b64url_encode(g_key[i].pub, 32, pk);
    int n = snprintf(payload, sizeof payload,
                     "{\"format\":\"crowdtrain-report/1\",\"run\":\"r\",\"peer\":\"%s\",\"step\":%d,"
                     "\"group\":\"g%d\",\"round\":\"%s\",\"samples\":8,\"compute_s\":0.5,"
                     "\"loss\":1.5,\"sps\":16,\"round_ms\":20,\"parts\":1,\"parts_averaged\":1,"
                     "\"members\":{},\"excluded\":[],\"t\":1763800000}",
                     pk, step, i, round);
    char msg[600], sig64[100], p64[800];
    static const char prefix[] = "crowdtrain-report/1\n";
    memcpy(msg, prefix, sizeof prefix - 1);
    memcpy(msg + sizeof prefix - 1, payload, (size_t)n);
    uint8_t sig[CM_ED25519_SIG_LEN];
    if (cm_ed25519_sign(&g_key[i], msg, sizeof prefix - 1 + (size_t)n, sig) != CM_OK)
        return NULL;
    cm_b64url_encode(sig, sizeof sig, sig64);
    cm_b64url_encode(payload, (size_t)n, p64);
    size_t cap = strlen(g_tok[i]) + strlen(p64) + strlen(sig64) + 64;
    char *body = malloc(cap);
    if (body)
        snprintf(body, cap, "{\"pass\":\"%s\",\"payload\":\"%s\",\"sig\":\"%s\"}", g_tok[i], p64,
                 sig64);
    return body;
}

struct outcome {
    long status[NAGENTS]; /* 0: no answer */
    int answered;
};

static size_t sink(void *p, size_t sz, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return sz * n;
}

/* Sends every agent's report for `step` at once, each on its own
 * connection. stop_after > 0: SIGTERM the coordinator once that many
 * answers are in (the rest are parked, queued or unread then). */
static void send_all(int step, int stop_after, struct outcome *o)
{
    memset(o, 0, sizeof *o);
    CURLM *m = curl_multi_init();
    CURL *h[NAGENTS];
    char *body[NAGENTS];
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    char url[400];
    snprintf(url, sizeof url, "%s/api/v1/runs/r/reports", g_c.url);
    for (int i = 0; i < NAGENTS; i++) {
        body[i] = report_body(i, step);
        assert_non_null(body[i]);
        h[i] = curl_easy_init();
        curl_easy_setopt(h[i], CURLOPT_URL, url);
        curl_easy_setopt(h[i], CURLOPT_CAINFO, g_c.ca);
        curl_easy_setopt(h[i], CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h[i], CURLOPT_POSTFIELDS, body[i]);
        curl_easy_setopt(h[i], CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(h[i], CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(h[i], CURLOPT_FORBID_REUSE, 1L);
        curl_easy_setopt(h[i], CURLOPT_PRIVATE, (char *)(intptr_t)i);
        curl_multi_add_handle(m, h[i]);
    }
    int running = 1, stopped = 0;
    while (running) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            char *pi = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &pi);
            long st = 0;
            if (msg->data.result == CURLE_OK)
                curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &st);
            o->status[(intptr_t)pi] = st;
            o->answered += st != 0;
        }
        if (stop_after > 0 && !stopped && o->answered >= stop_after) {
            kill(g_c.pid, SIGTERM);
            stopped = 1;
        }
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    for (int i = 0; i < NAGENTS; i++) {
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        free(body[i]);
    }
    curl_slist_free_all(hl);
    curl_multi_cleanup(m);
}

static long stored(int step)
{
    char q[160];
    long n = -1;
    snprintf(q, sizeof q, "SELECT count(*) FROM contrib_reports WHERE step = %d", step);
    assert_int_equal(ct_pg_scalar(&g_pg, q, &n), 0);
    return n;
}

static void test_many_parked_all_answered(void **state)
{
    (void)state;
    struct outcome o;
    send_all(0, 0, &o);
    for (int i = 0; i < NAGENTS; i++)
        if (o.status[i] != 201)
            fail_msg("report %d: HTTP %ld, expected 201", i, o.status[i]);
    assert_int_equal(stored(0), NAGENTS);
    /* the same again: retries, each answered, none stored twice */
    send_all(0, 0, &o);
    for (int i = 0; i < NAGENTS; i++)
        if (o.status[i] != 200)
            fail_msg("retry %d: HTTP %ld, expected 200 (already recorded)", i, o.status[i]);
    assert_int_equal(stored(0), NAGENTS);
    /* nothing left in flight */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "inflight")), 1); /* this one */
    ct_resp_free(&r);
}

static void test_stop_while_parked(void **state)
{
    (void)state;
    struct outcome o;
    send_all(1, NAGENTS / 8, &o);
    long created = 0, refused = 0, unanswered = 0;
    for (int i = 0; i < NAGENTS; i++) {
        if (o.status[i] == 201)
            created++;
        else if (o.status[i] == 503)
            refused++;
        else if (o.status[i] == 0)
            unanswered++;
        else
            fail_msg("report %d: HTTP %ld during the stop", i, o.status[i]);
    }
    print_message("stop with reports in flight: %ld created, %ld refused (503), %ld not read\n",
                  created, refused, unanswered);
    assert_true(created >= NAGENTS / 8);
    int st = ct_coord_stop(&g_c, 0);
    assert_int_equal(st, 0);
    /* every 201 is stored, and nothing else */
    assert_int_equal(stored(1), created);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_parked_all_answered),
        cmocka_unit_test(test_stop_while_parked),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
