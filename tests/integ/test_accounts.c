/* ct-timeout: 180 */
/* Integration tests of login throttling and account administration (issue
 * 22, findings 3 and 7) against the real coordinator and PostgreSQL.
 * Requests come from chosen loopback addresses (127.0.0.0/8 is all local on
 * Linux; the client socket is bound to 127.0.0.N), so "another address" is a
 * real other client address to the coordinator:
 *  - wrong passwords from one address do not lock the owner out of another;
 *  - the per-username budget over all addresses spares known addresses;
 *  - 40 parallel wrong passwords get exactly the limit through;
 *  - a disabled account's sessions and passes stop at once, and the command
 *    line enables it again;
 *  - password change (old password required) ends the other sessions;
 *  - a user ends their other sessions, an organizer all of someone's;
 *  - usernames are unique ignoring case, and migration 006 keeps accounts
 *    that already differ only by case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h> /* curl_global_init */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;

#define ORG_PW "organizer-password"
#define PW "volunteer-password"
#define LIMIT 10 /* --login-max-failures (the default) */

/* ct_http from the local address src (127.0.0.N); the status. */
static long http_from(const char *src, const char *method, const char *path, const char *bearer,
                      const char *body, struct ct_resp *out)
{
    ct_http_from(&g_c, src, method, path, bearer, body, out);
    return out->status;
}

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

/* POST /api/v1/session from src; the status, and the token (heap) when 201. */
static long login_from(const char *src, const char *user, const char *pw, char **token)
{
    char body[256];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"password\":\"%s\"}", user, pw);
    struct ct_resp r;
    long s = http_from(src, "POST", "/api/v1/session", NULL, body, &r);
    if (token) {
        const char *t = json_string_value(json_object_get(r.json, "token"));
        *token = s == 201 && t ? strdup(t) : NULL;
    }
    if (s == 429)
        assert_string_equal(err_code(&r), "throttled");
    ct_resp_free(&r);
    return s;
}

static void make_user(const char *name)
{
    char body[256];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"%s\"}",
             name, PW);
    assert_int_equal(req("POST", "/api/v1/users", g_org, body), 201);
}

static long scalar(const char *sql)
{
    long v = -1;
    assert_int_equal(ct_pg_scalar(&g_pg, sql, &v), 0);
    return v;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", ORG_PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", ORG_PW);
    if (!g_org)
        return -1;
    return req("POST", "/api/v1/runs", g_org, "{\"name\":\"acct\",\"target_batch_size\":64}") == 201
               ? 0
               : -1;
}

static int g_teardown_failed;

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

/* Finding 3: ten wrong passwords from A used to lock the account for
 * everyone for the whole window. */
static void test_guesses_from_one_address_spare_another(void **state)
{
    (void)state;
    make_user("victim");
    for (int i = 0; i < LIMIT; i++)
        assert_int_equal(login_from("127.0.0.2", "victim", "wrong-guess", NULL), 401);
    /* A is stopped, even with the right password */
    assert_int_equal(login_from("127.0.0.2", "victim", PW, NULL), 429);
    /* the owner, from an address the account never used, is not */
    char *t = NULL;
    assert_int_equal(login_from("127.0.0.3", "victim", PW, &t), 201);
    assert_non_null(t);
    free(t);
    /* the failures are counted under the address they came from */
    assert_int_equal(scalar("SELECT count(*) FROM login_failures WHERE username = 'victim' "
                            "AND client_ip = '127.0.0.2'"),
                     LIMIT);
}

/* The budget per username over all addresses (10 x the limit) stops a
 * guesser with many addresses from new addresses, but an address the owner
 * has logged in from stays open. */
static void test_username_budget_spares_known_addresses(void **state)
{
    (void)state;
    make_user("spread");
    char *t = NULL;
    assert_int_equal(login_from("127.0.0.4", "spread", PW, &t), 201); /* a known address */
    free(t);
    /* 100 recent failures from 100 other addresses: the guesses of a botnet */
    assert_int_equal(ct_pg_exec(&g_pg, "INSERT INTO login_failures (username, client_ip) "
                                       "SELECT 'spread', '10.9.0.' || g FROM generate_series(1, 100) g"),
                     0);
    assert_int_equal(login_from("127.0.0.5", "spread", PW, NULL), 429);
    assert_int_equal(login_from("127.0.0.4", "spread", PW, &t), 201);
    free(t);
    /* a wrong password from the known address still counts there */
    assert_int_equal(login_from("127.0.0.4", "spread", "wrong-guess", NULL), 401);
}

struct guess {
    long status;
};

static void *guess_thread(void *arg)
{
    struct guess *g = arg;
    g->status = login_from("127.0.0.6", "parallel", "wrong-guess", NULL);
    return NULL;
}

/* Finding 7: 15 of 40 parallel guesses got through a limit of 10, since the
 * count was read before and written after the argon2id check. */
static void test_parallel_guesses_stop_at_the_limit(void **state)
{
    (void)state;
    make_user("parallel");
    enum { N = 40 };
    pthread_t th[N];
    struct guess g[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, guess_thread, &g[i]), 0);
    int wrong = 0, throttled = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        wrong += g[i].status == 401;
        throttled += g[i].status == 429;
    }
    printf("40 parallel wrong passwords: %d checked (401), %d throttled (429)\n", wrong, throttled);
    assert_int_equal(wrong + throttled, N);
    assert_int_equal(wrong, LIMIT);
    assert_int_equal(scalar("SELECT count(*) FROM login_failures WHERE username = 'parallel'"), LIMIT);
}

/* A pass as POST /passes makes it (a row the coordinator signed a token
 * for); made in SQL so this test does not depend on how passes are asked for. */
static long make_pass(const char *user)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO passes (run_id, user_id, peer_public_key, kid, issued_at, expires_at) "
             "SELECT r.id, u.id, sha256(u.username::bytea), (SELECT kid FROM signing_keys LIMIT 1), "
             "now(), now() + interval '1 day' FROM runs r, users u "
             "WHERE r.name = 'acct' AND u.username = '%s' RETURNING id",
             user);
    return scalar(sql);
}

static int revocation_listed(long pass_id)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/acct/revocations", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    char id[24];
    snprintf(id, sizeof id, "%ld", pass_id);
    int found = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "revoked"), i, e) {
        if (!strcmp(json_string_value(json_object_get(e, "pass_id")), id))
            found = 1;
    }
    ct_resp_free(&r);
    return found;
}

static void test_disabled_account_stops_at_once(void **state)
{
    (void)state;
    make_user("leaver");
    assert_int_equal(req("PUT", "/api/v1/runs/acct/allowlist/leaver", g_org, NULL), 201);
    char *s1 = ct_login(&g_c, "leaver", PW), *s2 = ct_login(&g_c, "leaver", PW);
    assert_non_null(s1);
    assert_non_null(s2);
    long pass = make_pass("leaver");
    assert_true(pass > 0);
    /* both sessions are in this coordinator's session cache now */
    assert_int_equal(req("GET", "/api/v1/me", s1, NULL), 200);
    assert_int_equal(req("GET", "/api/v1/me", s2, NULL), 200);
    assert_false(revocation_listed(pass));

    /* an organizer cannot lock themselves out */
    assert_int_equal(req("PATCH", "/api/v1/users/org", g_org, "{\"disabled\":true}"), 409);
    /* volunteers cannot disable anyone */
    assert_int_equal(req("PATCH", "/api/v1/users/org", s1, "{\"disabled\":true}"), 403);
    assert_int_equal(req("PATCH", "/api/v1/users/nobody", g_org, "{\"disabled\":true}"), 404);

    struct ct_resp r;
    ct_http(&g_c, "PATCH", "/api/v1/users/leaver", g_org, "{\"disabled\":true}", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "sessions_ended")), 2);
    assert_int_equal(json_integer_value(json_object_get(r.json, "passes_revoked")), 1);
    assert_true(json_is_true(json_object_get(r.json, "changed")));
    ct_resp_free(&r);
    /* at once: no waiting out the session cache */
    assert_int_equal(req("GET", "/api/v1/me", s1, NULL), 401);
    assert_int_equal(req("GET", "/api/v1/me", s2, NULL), 401);
    assert_int_equal(req("POST", "/api/v1/runs/acct/passes", s1,
                         "{\"peer_public_key\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}"),
                     401);
    assert_true(revocation_listed(pass));
    assert_int_equal(scalar("SELECT count(*) FROM passes WHERE user_id = (SELECT id FROM users "
                            "WHERE username = 'leaver') AND revoked_at IS NULL"),
                     0);
    assert_int_equal(login_from("127.0.0.7", "leaver", PW, NULL), 401);
    assert_int_equal(scalar("SELECT count(*) FROM audit_log WHERE action = 'user.disable' "
                            "AND target = 'leaver' AND actor = 'org'"),
                     1);
    /* the listing shows it */
    ct_http(&g_c, "GET", "/api/v1/users", g_org, NULL, &r);
    size_t i;
    json_t *u;
    int seen = 0;
    json_array_foreach(json_object_get(r.json, "users"), i, u) {
        if (!strcmp(json_string_value(json_object_get(u, "username")), "leaver")) {
            seen = 1;
            assert_true(json_is_true(json_object_get(u, "disabled")));
        }
    }
    assert_true(seen);
    ct_resp_free(&r);

    /* the command line lets it in again; its passes stay revoked */
    const char *argv[] = {ct_bin("crowdtrain-coordinator"), "enable-user", "--database-url", g_pg.url,
                          "--username", "leaver", NULL};
    char *out = NULL;
    assert_int_equal(ct_run(argv, NULL, &out, 60), 0);
    free(out);
    char *s3 = NULL;
    assert_int_equal(login_from("127.0.0.7", "leaver", PW, &s3), 201);
    assert_int_equal(req("GET", "/api/v1/me", s3, NULL), 200);
    assert_true(revocation_listed(pass));
    /* and disables it again, ending the new session */
    const char *argv2[] = {ct_bin("crowdtrain-coordinator"), "disable-user", "--database-url",
                           g_pg.url, "--username", "leaver", NULL};
    assert_int_equal(ct_run(argv2, NULL, &out, 60), 0);
    free(out);
    /* Another process disabled it, so this coordinator may still hold s3 in
     * its session cache (at most 5 s): then the pass statement itself
     * refuses. Either way no pass. */
    struct cm_ed25519 key;
    assert_int_equal(cm_ed25519_generate(&key), CM_OK);
    ct_pass_request(&g_c, s3, "acct", "leaver", &key, &r);
    cm_ed25519_cleanup(&key);
    if (r.status != 401) {
        assert_int_equal(r.status, 403);
        assert_string_equal(err_code(&r), "account_disabled");
    }
    ct_resp_free(&r);
    /* a write never takes the session from the cache */
    assert_int_equal(req("DELETE", "/api/v1/session", s3, NULL), 401);
    free(s1);
    free(s2);
    free(s3);
}

static void test_password_change(void **state)
{
    (void)state;
    make_user("changer");
    char *s1 = ct_login(&g_c, "changer", PW), *s2 = ct_login(&g_c, "changer", PW);
    assert_non_null(s1);
    assert_non_null(s2);
    assert_int_equal(req("GET", "/api/v1/me", s2, NULL), 200);
    struct ct_resp r;
    ct_http(&g_c, "PUT", "/api/v1/me/password", s1,
            "{\"old_password\":\"not-the-password\",\"new_password\":\"a-new-password\"}", &r);
    assert_int_equal(r.status, 403);
    assert_string_equal(err_code(&r), "wrong_password");
    ct_resp_free(&r);
    /* a wrong old password counts as a failed login from the caller's address */
    assert_int_equal(scalar("SELECT count(*) FROM login_failures WHERE username = 'changer'"), 1);
    /* too short */
    assert_int_equal(req("PUT", "/api/v1/me/password", s1,
                         "{\"old_password\":\"" PW "\",\"new_password\":\"short\"}"),
                     400);
    ct_http(&g_c, "PUT", "/api/v1/me/password", s1,
            "{\"old_password\":\"" PW "\",\"new_password\":\"a-new-password\"}", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "sessions_ended")), 1);
    ct_resp_free(&r);
    assert_int_equal(req("GET", "/api/v1/me", s1, NULL), 200);
    assert_int_equal(req("GET", "/api/v1/me", s2, NULL), 401);
    assert_int_equal(login_from("127.0.0.8", "changer", PW, NULL), 401);
    char *s3 = NULL;
    assert_int_equal(login_from("127.0.0.8", "changer", "a-new-password", &s3), 201);
    assert_int_equal(scalar("SELECT count(*) FROM audit_log WHERE action = 'user.password' "
                            "AND target = 'changer'"),
                     1);
    free(s1);
    free(s2);
    free(s3);
}

static void test_end_sessions(void **state)
{
    (void)state;
    make_user("roamer");
    char *s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = ct_login(&g_c, "roamer", PW);
        assert_non_null(s[i]);
        assert_int_equal(req("GET", "/api/v1/me", s[i], NULL), 200);
    }
    struct ct_resp r;
    ct_http(&g_c, "DELETE", "/api/v1/me/sessions", s[0], NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "sessions_ended")), 2);
    ct_resp_free(&r);
    assert_int_equal(req("GET", "/api/v1/me", s[0], NULL), 200);
    assert_int_equal(req("GET", "/api/v1/me", s[1], NULL), 401);
    assert_int_equal(req("GET", "/api/v1/me", s[2], NULL), 401);
    /* an organizer logs someone out everywhere; only organizers may */
    assert_int_equal(req("DELETE", "/api/v1/users/roamer/sessions", s[0], NULL), 403);
    ct_http(&g_c, "DELETE", "/api/v1/users/roamer/sessions", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "sessions_ended")), 1);
    ct_resp_free(&r);
    assert_int_equal(req("GET", "/api/v1/me", s[0], NULL), 401);
    for (int i = 0; i < 3; i++)
        free(s[i]);
}

static void test_usernames_unique_ignoring_case(void **state)
{
    (void)state;
    make_user("Casey");
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/users", g_org,
            "{\"username\":\"casey\",\"role\":\"volunteer\",\"password\":\"" PW "\"}", &r);
    assert_int_equal(r.status, 409);
    assert_string_equal(err_code(&r), "exists");
    ct_resp_free(&r);
    assert_int_equal(ct_create_user(g_pg.url, "CASEY", "volunteer", PW) != 0, 1);
    assert_int_equal(scalar("SELECT count(*) FROM users WHERE lower(username) = 'casey'"), 1);
}

/* Migration 006 on a database that already holds accounts differing only by
 * case: it applies, keeps both (each logs in as before), and refuses a
 * third. Simulated by undoing 006 and re-applying it. */
static void test_migration_keeps_case_duplicates(void **state)
{
    (void)state;
    assert_int_equal(ct_pg_exec(&g_pg,
                                "BEGIN;"
                                "DROP FUNCTION login_attempt(text, text, bigint, bigint, bigint, bigint);"
                                "DROP TABLE login_known;"
                                "DROP INDEX users_username_ci;"
                                "ALTER TABLE users DROP COLUMN case_dup;"
                                "DELETE FROM schema_migrations WHERE version = 6;"
                                "INSERT INTO users (username, role, password_hash) "
                                "SELECT 'DUPE', role, password_hash FROM users WHERE username = 'changer';"
                                "INSERT INTO users (username, role, password_hash) "
                                "SELECT 'dupe', role, password_hash FROM users WHERE username = 'Casey';"
                                "COMMIT;"),
                     0);
    const char *argv[] = {ct_bin("crowdtrain-coordinator"), "migrate", "--database-url", g_pg.url, NULL};
    char *out = NULL;
    int rc = ct_run(argv, NULL, &out, 60);
    if (rc != 0)
        fprintf(stderr, "migrate: %s\n", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);
    assert_int_equal(scalar("SELECT case_dup FROM users WHERE username = 'DUPE'"), 0);
    assert_int_equal(scalar("SELECT case_dup FROM users WHERE username = 'dupe'"), 1);
    char *t = NULL;
    assert_int_equal(login_from("127.0.0.9", "DUPE", "a-new-password", &t), 201);
    free(t);
    assert_int_equal(login_from("127.0.0.9", "dupe", PW, &t), 201);
    free(t);
    assert_int_equal(req("POST", "/api/v1/users", g_org,
                         "{\"username\":\"Dupe\",\"role\":\"volunteer\",\"password\":\"" PW "\"}"),
                     409);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guesses_from_one_address_spare_another),
        cmocka_unit_test(test_username_budget_spares_known_addresses),
        cmocka_unit_test(test_parallel_guesses_stop_at_the_limit),
        cmocka_unit_test(test_disabled_account_stops_at_once),
        cmocka_unit_test(test_password_change),
        cmocka_unit_test(test_end_sessions),
        cmocka_unit_test(test_usernames_unique_ignoring_case),
        cmocka_unit_test(test_migration_keeps_case_duplicates),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
