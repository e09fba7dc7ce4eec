/* ct-timeout: 180 */
/* Checkpoint upload and download through the real coordinator: streamed PUT
 * with an announced SHA-256, content visible only when complete, matching
 * and a valid checkpoint of the URL's step, retention of the newest N,
 * idempotent re-upload, conflicts, and access rules. Forged uploads (any
 * bytes with their own hash, truncated, wrong magic, another step, a
 * far-future step) change nothing. A client that disconnects mid-upload, a
 * losing concurrent upload and a crash leave nothing on disk. Real agents
 * resume from the checkpoint their reports vouch for, not from a forged one
 * at a higher step (the vouching rule in detail: tests/integ/test_contrib.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
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
    /* the answer to a refusal on the headers comes before the body is sent */
    const char *h[] = {auth, shah, "Content-Type: application/octet-stream", "Expect: 100-continue", NULL};
    ct_http_raw(&g_c, "PUT", path, h, data, len, r);
    return r->status;
}

/* A real checkpoint file (docs/checkpoints.md) of `step` with n parameters
 * and one optimizer buffer, derived from seed; heap, *len bytes, its SHA-256
 * in hex. */
static uint8_t *make_ckpt(uint64_t step, unsigned seed, size_t n, size_t *len, char hex[65])
{
    uint8_t *b = ct_make_ckpt(g_c.dir, step, seed, n, len, hex, NULL);
    assert_non_null(b);
    return b;
}

static void sha_hex(const void *b, size_t n, char hex[65])
{
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
    size_t n = 400000, len; /* 3.2 MB: larger than any single read buffer */
    char hex[65];
    struct ct_resp r;
    /* an organizer's checkpoints are vouched by the organizer */
    uint8_t *b = make_ckpt(100, 1, n, &len, hex);
    assert_int_equal(put_ckpt(g_org, "100", b, len, hex, &r), 201);
    assert_string_equal(json_string_value(json_object_get(r.json, "sha256")), hex);
    assert_true(json_is_true(json_object_get(r.json, "vouched")));
    ct_resp_free(&r);
    /* same content again: idempotent */
    assert_int_equal(put_ckpt(g_org, "100", b, len, hex, &r), 200);
    ct_resp_free(&r);
    /* latest is byte-identical, with its hash and step in headers */
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, len);
    assert_memory_equal(r.body, b, len);
    ct_resp_free(&r);
    free(b);
    /* two more steps: with --checkpoint-keep 2 the oldest goes, file too */
    char hex2[65], hex3[65];
    b = make_ckpt(200, 2, n, &len, hex2);
    assert_int_equal(put_ckpt(g_org, "200", b, len, hex2, &r), 201);
    ct_resp_free(&r);
    free(b);
    b = make_ckpt(300, 3, n, &len, hex3);
    assert_int_equal(put_ckpt(g_org, "300", b, len, hex3, &r), 201);
    assert_int_equal(json_array_size(json_object_get(r.json, "pruned")), 1);
    ct_resp_free(&r);
    free(b);
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
    char got[65];
    sha_hex(r.body, r.len, got);
    assert_string_equal(got, hex2);
    ct_resp_free(&r);
    /* a different file for a step with a vouched checkpoint is a conflict */
    b = make_ckpt(300, 9, 1000, &len, hex);
    assert_int_equal(put_ckpt(g_org, "300", b, len, hex, &r), 409);
    ct_resp_free(&r);
    free(b);
}

/* What is stored for run ck: both listings, the files, the temporaries. */
static char *stored_state(void)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *k = json_object_get(r.json, "candidates");
    json_t *o = json_pack("{s:O, s:O, s:i, s:i}", "checkpoints", json_object_get(r.json, "checkpoints"),
                          "candidates", k ? k : json_null(), "files", count_files(".ckpt"),
                          "temporaries", count_files(".upload-"));
    char *d = json_dumps(o, JSON_SORT_KEYS);
    json_decref(o);
    ct_resp_free(&r);
    return d;
}

static void expect_refused(const char *step, const void *b, size_t len, const char *hex, long status,
                           const char *code)
{
    struct ct_resp r;
    long s = put_ckpt(g_vol, step, b, len, hex, &r);
    const char *c = json_string_value(json_object_get(json_object_get(r.json, "error"), "code"));
    if (s != status || !c || strcmp(c, code) != 0)
        fail_msg("PUT step %s: expected %ld %s, got %ld %s", step, status, code, s,
                 r.body ? r.body : "");
    ct_resp_free(&r);
}

static void test_bad_uploads_leave_nothing(void **state)
{
    (void)state;
    char hex[65], wrong[65];
    struct ct_resp r;
    char *before = stored_state();
    /* issue 22: any bytes with their own SHA-256 */
    const char hello[] = "hello world";
    sha_hex(hello, strlen(hello), hex);
    expect_refused("341", hello, strlen(hello), hex, 422, "invalid_checkpoint");
    size_t len;
    uint8_t *b = make_ckpt(342, 4, 5000, &len, hex);
    /* truncated: the hash announced is the truncated bytes' */
    sha_hex(b, len - 100, hex);
    expect_refused("342", b, len - 100, hex, 422, "invalid_checkpoint");
    /* wrong magic under a valid trailer and hash */
    b[0] = 'X';
    cm_sha256(b, len - 32, b + len - 32);
    sha_hex(b, len, hex);
    expect_refused("342", b, len, hex, 422, "invalid_checkpoint");
    free(b);
    /* sections that do not tile the file (one optimizer buffer too few
       declared) under a valid trailer and hash */
    b = make_ckpt(342, 4, 5000, &len, hex);
    b[40] = 0;
    cm_sha256(b, len - 32, b + len - 32);
    sha_hex(b, len, hex);
    expect_refused("342", b, len, hex, 422, "invalid_checkpoint");
    /* a header that declares more than --checkpoint-max-mb: 413 on the header */
    b[16] = 0;
    b[17] = 0;
    b[18] = 0x90; /* 9 MiB */
    sha_hex(b, len, hex);
    expect_refused("342", b, len, hex, 413, "body_too_large");
    free(b);
    /* the header says step 330, the URL 331 */
    b = make_ckpt(330, 4, 5000, &len, hex);
    expect_refused("331", b, len, hex, 422, "step_mismatch");
    free(b);
    /* a step the run cannot have reached: refused before the body */
    b = make_ckpt(4611686018427387904ull, 4, 5000, &len, hex);
    expect_refused("4611686018427387904", b, len, hex, 422, "step_out_of_range");
    free(b);
    b = make_ckpt(401, 4, 5000, &len, hex); /* the organizer's 300, + 100 */
    expect_refused("401", b, len, hex, 422, "step_out_of_range");
    free(b);
    /* not newer than the vouched step 300: retention would drop it at once */
    b = make_ckpt(250, 4, 5000, &len, hex);
    expect_refused("250", b, len, hex, 409, "stale");
    free(b);
    /* announced hash differs */
    b = make_ckpt(344, 5, 5000, &len, hex);
    memset(wrong, 'a', 64);
    wrong[64] = 0;
    expect_refused("344", b, len, wrong, 422, "checksum_mismatch");
    free(b);
    /* refused on the headers (a small body: the answer comes before it is read) */
    assert_int_equal(put_ckpt(g_vol, "344", hello, strlen(hello), "nothex", &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "-1", hello, strlen(hello), hex, &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "abc", hello, strlen(hello), hex, &r), 400);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_vol, "345", hello, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", &r), 400);
    ct_resp_free(&r);
    /* roles and allowlist */
    assert_int_equal(put_ckpt(g_aud, "344", hello, strlen(hello), hex, &r), 403);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt(g_out, "344", hello, strlen(hello), hex, &r), 403);
    ct_resp_free(&r);
    assert_int_equal(put_ckpt("cts_forgedforgedforgedforged", "344", hello, strlen(hello), hex, &r), 401);
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_out, NULL, &r);
    assert_int_equal(r.status, 403);
    ct_resp_free(&r);
    /* over --checkpoint-max-mb (8 MiB): refused up front */
    size_t big = 9u << 20;
    uint8_t *bb = calloc(1, big);
    assert_int_equal(put_ckpt(g_vol, "346", bb, big, hex, &r), 413);
    ct_resp_free(&r);
    free(bb);
    /* nothing changed: the listing, the files, no temporaries */
    char *after = stored_state();
    assert_string_equal(after, before);
    free(before);
    free(after);
    /* latest is still the organizer's step 300 */
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints", g_vol, NULL, &r);
    json_t *first = json_array_get(json_object_get(r.json, "checkpoints"), 0);
    assert_int_equal(json_integer_value(json_object_get(first, "step")), 300);
    char want[65];
    snprintf(want, sizeof want, "%s", json_string_value(json_object_get(first, "sha256")));
    ct_resp_free(&r);
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    sha_hex(r.body, r.len, hex);
    assert_string_equal(hex, want);
    ct_resp_free(&r);
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
    snprintf(url, sizeof url, "%s/api/v1/runs/ck/checkpoints/350", g_c.url);
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
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/350", g_vol, NULL, &r);
    assert_int_equal(r.status, 404);
    ct_resp_free(&r);
    /* and keeps serving */
    ct_http(&g_c, "GET", "/api/v1/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
}

/* Two uploads of one step by one volunteer at once, different content:
 * one wins, and the loser's file is gone at once (issue 22, finding 6). */
struct racer {
    const uint8_t *b;
    size_t len, sent;
    char hex[65];
    pthread_barrier_t *bar;
    int waited;
    long status;
};

static size_t racer_read(char *buf, size_t sz, size_t n, void *ud)
{
    struct racer *u = ud;
    if (u->sent >= CM_CKPT_HEADER_BYTES && !u->waited) {
        /* both requests are past their checks before either body ends */
        pthread_barrier_wait(u->bar);
        u->waited = 1;
    }
    size_t len = sz * n, left = u->len - u->sent;
    if (u->sent < CM_CKPT_HEADER_BYTES)
        left = CM_CKPT_HEADER_BYTES - u->sent;
    if (len > left)
        len = left;
    memcpy(buf, u->b + u->sent, len);
    u->sent += len;
    return len;
}

static void *racer_run(void *arg)
{
    struct racer *u = arg;
    CURL *c = curl_easy_init();
    char url[512], auth[256], shah[128];
    snprintf(url, sizeof url, "%s/api/v1/runs/ck2/checkpoints/50", g_c.url);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_vol);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", u->hex);
    struct curl_slist *hl = curl_slist_append(NULL, auth);
    hl = curl_slist_append(hl, shah);
    hl = curl_slist_append(hl, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CAINFO, g_c.ca);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)u->len);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, racer_read);
    curl_easy_setopt(c, CURLOPT_READDATA, u);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &u->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return NULL;
}

static int count_files_in(const char *run, const char *suffix)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/checkpoints/%s", g_c.dir, run);
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

static void test_concurrent_loser_removed(void **state)
{
    (void)state;
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, "{\"name\":\"ck2\",\"target_batch_size\":64}", &r);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/ck2/allowlist/vol", g_org, NULL, &r);
    ct_resp_free(&r);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    struct racer u[2];
    uint8_t *b[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&u[i], 0, sizeof u[i]);
        b[i] = make_ckpt(50, 20 + (unsigned)i, 500000, &u[i].len, u[i].hex);
        u[i].b = b[i];
        u[i].bar = &bar;
    }
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, racer_run, &u[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    printf("racers: %ld %ld\n", u[0].status, u[1].status);
    assert_true((u[0].status == 201 && u[1].status == 409) || (u[0].status == 409 && u[1].status == 201));
    /* one file, no temporaries, one row */
    assert_int_equal(count_files_in("ck2", ".ckpt"), 1);
    assert_int_equal(count_files_in("ck2", ".upload-"), 0);
    ct_http(&g_c, "GET", "/api/v1/runs/ck2/checkpoints", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "candidates")), 1);
    ct_resp_free(&r);
    free(b[0]);
    free(b[1]);
}

/* What a crash leaves (a temporary nobody writes, a file no row names) is
 * removed at start-up; stored checkpoints stay and are served. */
static void test_restart_sweeps_leftovers(void **state)
{
    (void)state;
    char path[700];
    int before = count_files(".ckpt");
    assert_true(before >= 1);
    snprintf(path, sizeof path, "%s/checkpoints/ck/.upload-crash1", g_c.dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "partial", 7), 7);
    close(fd);
    snprintf(path, sizeof path, "%s/checkpoints/ck/%064d.ckpt", g_c.dir, 7);
    fd = open(path, O_CREAT | O_WRONLY, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "orphan", 6), 6);
    close(fd);
    assert_int_equal(count_files(".upload-"), 1);
    assert_int_equal(count_files(".ckpt"), before + 1);
    assert_int_equal(ct_coord_stop(&g_c, SIGKILL), 128 + SIGKILL);
    const char *args[] = {"--checkpoint-keep", "2", "--checkpoint-max-mb", "8", NULL};
    char dir[256];
    snprintf(dir, sizeof dir, "%s", g_c.dir);
    assert_int_equal(ct_coord_start(&g_c, g_pg.url, dir, args), 0);
    assert_int_equal(count_files(".upload-"), 0);
    assert_int_equal(count_files(".ckpt"), before);
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/ck/checkpoints/latest", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    ct_resp_free(&r);
}

/* Real agents (issue 22): two volunteers train 10 steps of the
 * Fashion-MNIST MLP and upload checkpoints at 5 and 10, which their signed
 * reports vouch for; a third volunteer uploads a forged checkpoint of step
 * 12 (a copy of the honest state with one parameter changed: a valid file
 * of the right model); a joining agent still resumes from the honest state
 * of step 10. */
static void test_agents_resume_from_honest_state(void **state)
{
    (void)state;
    const char *run = "ckag";
    json_t *cfg = ct_fmnist_recipe(40);
    char *body = ct_run_body(run, cfg);
    json_decref(cfg);
    assert_non_null(body);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    assert_int_equal(r.status, 201);
    ct_resp_free(&r);
    ct_http(&g_c, "PUT", "/api/v1/runs/ckag/allowlist/vol", g_org, NULL, &r);
    ct_resp_free(&r);
    char dirs[3][256], logs[3][400];
    assert_int_equal(ct_volunteers(&g_c, g_org, run, 3, dirs), 0);
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        snprintf(logs[i], sizeof logs[i], "%s/agent.log", dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", run, "--config-dir", dirs[i],
                              "--listen-ip", "127.0.0.1", "--device", "cpu", "--round-window-ms", "400",
                              "--outcome-window-ms", "1000", "--stall-ms", "8000", "--no-eval",
                              "--steps", "10", "--checkpoint-every", "5", NULL};
        if (i == 2)
            break;
        pids[i] = ct_spawn(argv, logs[i]);
        assert_true(pids[i] > 0);
    }
    for (int i = 0; i < 2; i++)
        if (ct_wait(pids[i], 120) != 0) {
            char *log = ct_read_file(logs[i], NULL);
            fail_msg("agent %d: %s", i, log ? log : "");
        }
    /* the honest state of step 10, vouched by both members' reports */
    ct_http(&g_c, "GET", "/api/v1/runs/ckag/checkpoints", g_org, NULL, &r);
    json_t *first = json_array_get(json_object_get(r.json, "checkpoints"), 0);
    assert_int_equal(json_integer_value(json_object_get(first, "step")), 10);
    assert_true(json_integer_value(json_object_get(first, "vouchers")) >= 2);
    char honest[65];
    snprintf(honest, sizeof honest, "%s", json_string_value(json_object_get(first, "sha256")));
    ct_resp_free(&r);
    /* the forgery: the honest file, one parameter changed, step 12 */
    ct_http(&g_c, "GET", "/api/v1/runs/ckag/checkpoints/latest", g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    struct cm_ckpt c;
    assert_int_equal(cm_ckpt_parse((const uint8_t *)r.body, r.len, &c), CM_OK);
    ct_resp_free(&r);
    c.params[0] += 1.0f;
    c.step = 12;
    char path[400], hex[65];
    snprintf(path, sizeof path, "%s/forged.ckpt", g_c.dir);
    uint8_t h[32];
    assert_int_equal(cm_ckpt_write(path, &c, h), CM_OK);
    cm_ckpt_cleanup(&c);
    cm_hex_encode(h, 32, hex);
    size_t len;
    uint8_t *fb = (uint8_t *)ct_read_file(path, &len);
    char auth[256], shah[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_vol);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", hex);
    const char *hd[] = {auth, shah, "Expect: 100-continue", NULL};
    ct_http_raw(&g_c, "PUT", "/api/v1/runs/ckag/checkpoints/12", hd, fb, len, &r);
    assert_int_equal(r.status, 201); /* stored, as a candidate */
    ct_resp_free(&r);
    free(fb);
    unlink(path);
    /* a joining agent catches up from the honest state */
    const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", run, "--config-dir", dirs[2],
                          "--listen-ip", "127.0.0.1", "--device", "cpu", "--round-window-ms", "400",
                          "--outcome-window-ms", "1000", "--stall-ms", "8000", "--no-eval",
                          "--steps", "10", NULL};
    pids[2] = ct_spawn(argv, logs[2]);
    assert_true(pids[2] > 0);
    int st = ct_wait(pids[2], 60);
    char *log = ct_read_file(logs[2], NULL);
    char want[128];
    snprintf(want, sizeof want, "checkpoint at step 10 (sha256 %.16s", honest);
    if (st != 0 || !log || !strstr(log, want))
        fail_msg("joining agent (exit %d), expected \"%s\": %s", st, want, log ? log : "");
    free(log);
    for (int i = 0; i < 3; i++)
        ct_rmrf(dirs[i]);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_download_retention),
        cmocka_unit_test(test_bad_uploads_leave_nothing),
        cmocka_unit_test(test_disconnect_mid_upload),
        cmocka_unit_test(test_concurrent_loser_removed),
        cmocka_unit_test(test_restart_sweeps_leftovers),
        cmocka_unit_test(test_agents_resume_from_honest_state),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
