/* ct-timeout: 120 */
/* Login through an external identity provider. The test runs a small
 * userinfo endpoint on loopback (libmicrohttpd, plain HTTP): it answers
 * {"sub", "preferred_username"} for known bearer tokens and 401 otherwise.
 * The coordinator asks it who a token belongs to, maps the subject to an
 * account (creating a volunteer on first login), and the allowlist still
 * decides who gets a pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static struct MHD_Daemon *g_idp;
static atomic_int g_idp_calls;

static enum MHD_Result idp_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls)
{
    (void)cls; (void)version; (void)upload; (void)upload_size; (void)con_cls; (void)method;
    atomic_fetch_add(&g_idp_calls, 1);
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *body = NULL;
    unsigned status = 401;
    if (strcmp(url, "/userinfo") == 0 && auth) {
        if (!strcmp(auth, "Bearer good-alice")) {
            body = "{\"sub\":\"1001\",\"preferred_username\":\"alice\",\"email\":\"a@example.org\"}";
            status = 200;
        } else if (!strcmp(auth, "Bearer good-bob")) {
            body = "{\"sub\":2002,\"login\":\"bob\"}";
            status = 200;
        } else if (!strcmp(auth, "Bearer impostor-org")) {
            /* a provider account whose username collides with a local organizer */
            body = "{\"sub\":\"666\",\"preferred_username\":\"org\"}";
            status = 200;
        } else if (!strcmp(auth, "Bearer garbage")) {
            body = "not json";
            status = 200;
        }
    }
    if (!body)
        body = "{\"error\":\"invalid_token\"}";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0)
        return -1;
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    g_idp = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, idp_handler, NULL,
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&lo, MHD_OPTION_END);
    if (!g_idp)
        return -1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(g_idp, MHD_DAEMON_INFO_BIND_PORT);
    static char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/userinfo", di->port);
    if (ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0)
        return -1;
    const char *args[] = {"--idp-name", "testid", "--idp-userinfo-url", url, NULL};
    return ct_coord_start(&g_c, g_pg.url, NULL, args);
}

/* cmocka does not count a failed group teardown in its exit status. */
static int g_teardown_failed;

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    if (g_idp)
        MHD_stop_daemon(g_idp);
    ct_pg_stop(&g_pg);
    g_teardown_failed = rc != 0;
    return rc;
}

static char *provider_login(const char *token, long *status)
{
    char body[256];
    snprintf(body, sizeof body, "{\"provider\":\"testid\",\"token\":\"%s\"}", token);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/session", NULL, body, &r);
    *status = r.status;
    const char *t = json_string_value(json_object_get(r.json, "token"));
    char *out = r.status == 201 && t ? strdup(t) : NULL;
    ct_resp_free(&r);
    return out;
}

static long provider_login_from(const char *src, const char *token)
{
    char body[256];
    snprintf(body, sizeof body, "{\"provider\":\"testid\",\"token\":\"%s\"}", token);
    struct ct_resp r;
    ct_http_from(&g_c, src, "POST", "/api/v1/session", NULL, body, &r);
    long st = r.status;
    ct_resp_free(&r);
    return st;
}

static void test_provider_login_maps_to_account(void **state)
{
    (void)state;
    long st;
    int calls = atomic_load(&g_idp_calls);
    char *t = provider_login("good-alice", &st);
    assert_int_equal(st, 201);
    assert_non_null(t);
    assert_true(atomic_load(&g_idp_calls) > calls); /* the provider was asked */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/me", t, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(json_string_value(json_object_get(r.json, "username")), "alice");
    assert_string_equal(json_string_value(json_object_get(r.json, "role")), "volunteer");
    json_int_t id1 = json_integer_value(json_object_get(r.json, "id"));
    ct_resp_free(&r);
    /* a second login maps to the same account */
    char *t2 = provider_login("good-alice", &st);
    assert_non_null(t2);
    ct_http(&g_c, "GET", "/api/v1/me", t2, NULL, &r);
    assert_int_equal(json_integer_value(json_object_get(r.json, "id")), id1);
    ct_resp_free(&r);
    /* integer subjects and other username claims work too */
    char *t3 = provider_login("good-bob", &st);
    assert_int_equal(st, 201);

    /* the allowlist still decides: no pass until an organizer adds alice */
    char *org = ct_login(&g_c, "org", "organizer-password");
    assert_non_null(org);
    ct_http(&g_c, "POST", "/api/v1/runs", org, "{\"name\":\"r1\",\"target_batch_size\":32}", &r);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    struct cm_ed25519 peer;
    assert_int_equal(cm_ed25519_generate(&peer), CM_OK);
    assert_int_equal(ct_pass_request(&g_c, t, "r1", "alice", &peer, &r), 403);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/r1/allowlist/alice", org, NULL, &r);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    assert_int_equal(ct_pass_request(&g_c, t, "r1", "alice", &peer, &r), 201);
    assert_string_equal(json_string_value(json_object_get(r.json, "username")), "alice");
    ct_resp_free(&r);
    /* the provisioning was audited */
    ct_http(&g_c, "GET", "/api/v1/audit", org, NULL, &r);
    int seen = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "entries"), i, e)
        seen |= !strcmp(json_string_value(json_object_get(e, "action")), "user.provision");
    assert_true(seen);
    ct_resp_free(&r);
    cm_ed25519_cleanup(&peer);
    free(t);
    free(t2);
    free(t3);
    free(org);
}

static void test_provider_rejections(void **state)
{
    (void)state;
    long st;
    char *t = provider_login("stolen-token", &st);
    assert_null(t);
    assert_int_equal(st, 401);
    /* an unusable answer from the provider is a 502, not a login */
    t = provider_login("garbage", &st);
    assert_null(t);
    assert_int_equal(st, 502);
    /* a provider username that is a local account cannot take it over */
    t = provider_login("impostor-org", &st);
    assert_null(t);
    assert_int_equal(st, 409);
    /* an unknown provider name */
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/session", NULL, "{\"provider\":\"other\",\"token\":\"good-alice\"}", &r);
    assert_int_equal(r.status, 400);
    ct_resp_free(&r);
}

/* Bad tokens are throttled per address: ten from one address used to stop
 * every provider login from everywhere (they were counted under the
 * provider's name), for the whole window. */
static void test_bad_tokens_spare_other_addresses(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++)
        assert_int_equal(provider_login_from("127.0.0.2", "stolen-token"), 401);
    assert_int_equal(provider_login_from("127.0.0.2", "good-alice"), 429);
    assert_int_equal(provider_login_from("127.0.0.3", "good-alice"), 201);
    assert_int_equal(provider_login_from("127.0.0.3", "good-bob"), 201);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_provider_login_maps_to_account),
        cmocka_unit_test(test_provider_rejections),
        cmocka_unit_test(test_bad_tokens_spare_other_addresses),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
