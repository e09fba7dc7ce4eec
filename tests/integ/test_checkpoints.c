/* ct-timeout: 180 */
/* Checkpoint upload and download through the real coordinator: streamed PUT
 * with an announced SHA-256, content visible only when complete and
 * matching, retention of the newest N, idempotent re-upload, conflicts, and
 * access rules. A client that disconnects mid-upload leaves nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "ct_harness.h"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol, *g_aud, *g_out;

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    const char *args[] = {"--checkpoint-keep", "2", "--checkpoint-max-mb", "8", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    struct ct_resp r;
    const char *users[][2] = {{"vol", "volunteer"}, {"aud", "auditor"}, {"out", "volunteer"}};
    for (int i = 0; i < 3; i++) {
        char b[200];
        snprintf(b, sizeof b, "{\"username\":\"%s\",\"role\":\"%s\",\"password\":\"pass-word-1\"}", users[i][0], users[i][1]);
        ct_http(&g_c, "POST", "/api/v1/users", g_org, b, &r);
        ct_resp_free(&r);
    }
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, "{\"name\":\"ck\",\"target_batch_size\":64}", &r);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/ck/allowlist/vol", g_org, NULL, &r);
    ct_resp_free(&r);
    g_vol = ct_login(&g_c, "vol", "pass-word-1");
    g_aud = ct_login(&g_c, "aud", "pass-word-1");
    g_out = ct_login(&g_c, "out", "pass-word-1");
    return g_org && g_vol && g_aud && g_out ? 0 : -1;
}

/* cmocka does not count a failed group teardown in its exit status. */
static int g_teardown_failed;

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    free(g_org);
    free(g_vol);
    free(g_aud);
    free(g_out);
    g_teardown_failed = rc != 0;
    return rc;
}

static long put_ckpt(const char *bearer, const char *step, const void *data, size_t len,
                     const char *sha_hex, struct ct_resp *r)
{
    char path[128], auth[256], shah[128];
    snprintf(path, sizeof path, "/api/v1/runs/ck/checkpoints/%s", step);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", sha_hex);
    const char *h[] = {auth, shah, "Content-Type: application/octet-stream", NULL};
    ct_http_raw(&g_c, "PUT", path, h, data, len, r);
    return r->status;
}

static void make_blob(uint8_t *b, size_t n, unsigned seed, char hex[65])
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 9));
    uint8_t h[32];
    cm_sha256(b, n, h);
    cm_hex_encode(h, 32, hex);
}

static int count_files(const char *suffix)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/checkpoints/ck", g_c.dir);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, suffix))
            n++;
    if (d)
        closedir(d);
    return n;
}

static void test_upload_download_retention(void **state)
{
    (void)state;
    size_t n = 3u << 20; /* larger than any single read buffer */
    uint8_t *b = malloc(n);
    char hex[65];
    struct ct_resp r;
    make_blob(b, n, 1, hex);
    assert_int_equal(put_ckpt(g_vol, "100", b, n, hex, &r), 201);
    assert_string_equal(json_string_value(json_object_get(r.json, "sha256")), hex);
    ct_resp_free(&r);
    /* same content again: idempotent */
    assert_int_equal(put_ckpt(g_vol, "100", b, n, hex, &r), 200);
    ct_resp_free(&r);
    /* latest is byte-identical, with its hash and step in headers */
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, n);
    assert_memory_equal(r.body, b, n);
    ct_resp_free(&r);
    /* two more steps: with --checkpoint-keep 2 the oldest goes, file too */
    char hex2[65], hex3[65];
    make_blob(b, n, 2, hex2);
    assert_int_equal(put_ckpt(g_vol, "200", b, n, hex2, &r), 201);
    ct_resp_free(&r);
    make_blob(b, n, 3, hex3);
    assert_int_equal(put_ckpt(g_org, "300", b, n, hex3, &r), 201);
    assert_int_equal(json_array_size(json_object_get(r.json, "pruned")), 1);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints", g_aud, NULL, &r);
    json_t *list = json_object_get(r.json, "checkpoints");
    assert_int_equal(json_array_size(list), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 0), "step")), 300);
    ct_resp_free(&r);
    assert_int_equal(count_files(".ckpt"), 2);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/100", g_vol, NULL, &r);
    assert_int_equal(r.status, 404);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/200", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    uint8_t h[32];
    char got[65];
    cm_sha256(r.body, r.len, h);
    cm_hex_encode(h, 32, got);
    assert_string_equal(got, hex2);
    ct_resp_free(&r);
    /* a different file for a stored step is a conflict */
    make_blob(b, n, 9, hex);
    assert_int_equal(put_ckpt(g_vol, "300", b, n, hex, &r), 409);
    ct_resp_free(&r);
    free(b);
}

static void test_bad_uploads_leave_nothing(void **state)
{
    (void)state;
    uint8_t b[4096];
    char hex[65], wrong[65];
    struct ct_resp r;
    make_blob(b, sizeof b, 5, hex);
    memset(wrong, 'a', 64);
    wrong[64] = 0;
    /* announced hash differs: 422, not listed */
    assert_int_equal(put_ckpt(g_vol, "400", b, sizeof b, wrong, &r), 422);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "400", b, sizeof b, "nothex", &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "-1", b, sizeof b, hex, &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "abc", b, sizeof b, hex, &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "401", b, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", &r), 400);
    ct_resp_free(&r);
    /* roles and allowlist */
    assert_int_equal(put_ckpt(g_aud, "400", b, sizeof b, hex, &r), 403);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_out, "400", b, sizeof b, hex, &r), 403);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt("cts_forgedforgedforgedforged", "400", b, sizeof b, hex, &r), 401);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_out, NULL, &r);
    assert_int_equal(r.status, 403);
    ct_resp_free(&r);
    /* over --checkpoint-max-mb (8 MiB): refused up front */
    size_t big = 9u << 20;
    uint8_t *bb = calloc(1, big);
    assert_int_equal(put_ckpt(g_vol, "402", bb, big, hex, &r), 413);
    ct_resp_free(&r);
    free(bb);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints", g_vol, NULL, &r);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r.json, "checkpoints"), i, e)
        assert_true(json_integer_value(json_object_get(e, "step")) < 400);
    ct_resp_free(&r);
    assert_int_equal(count_files(".upload-"), 0);
}

/* A client that goes away mid-upload: the coordinator discards the partial file. */
struct half {
    size_t sent, total;
};
static size_t half_read(char *buf, size_t sz, size_t n, void *ud)
{
    struct half *h = ud;
    if (h->sent >= h->total / 2)
        return CURL_READFUNC_ABORT;
    size_t len = sz * n < 65536 ? sz * n : 65536;
    memset(buf, 0x5a, len);
    h->sent += len;
    return len;
}

static void test_disconnect_mid_upload(void **state)
{
    (void)state;
    CURL *c = curl_easy_init();
    char url[512], auth[256];
    snprintf(url, sizeof url, "%s/api/v1/runs/ck/checkpoints/500", g_c.url);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_vol);
    struct curl_slist *hl = curl_slist_append(NULL, auth);
    hl = curl_slist_append(hl, "X-Checkpoint-SHA256: 0000000000000000000000000000000000000000000000000000000000000000");
    struct half h = {0, 4u << 20};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CAINFO, g_c.ca);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)h.total);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, half_read);
    curl_easy_setopt(c, CURLOPT_READDATA, &h);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    CURLcode rc = curl_easy_perform(c);
    assert_int_not_equal(rc, CURLE_OK);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    /* the coordinator notices the closed connection and removes the temp file */
    int left = 1;
    for (int i = 0; i < 100 && left; i++) {
        left = count_files(".upload-");
        if (left)
            usleep(50000);
    }
    assert_int_equal(left, 0);
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/500", g_vol, NULL, &r);
    assert_int_equal(r.status, 404);
    ct_resp_free(&r);
    /* and keeps serving */
    ct_http(&g_c, "GET", "/api/v1/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_download_retention),
        cmocka_unit_test(test_bad_uploads_leave_nothing),
        cmocka_unit_test(test_disconnect_mid_upload),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
