/* ct-timeout: 120 */
/* Expert checkpoints on the real coordinator and PostgreSQL
 * (coordinator/api_expert_ckpt.c; docs/checkpoints.md, "Expert
 * checkpoints"): a dmoe run (examples/fmnist-dmoe.json: 4 x 4 grid "ffn",
 * experts of width 128, hidden 256) and an mlp run.
 *  - a volunteer's upload of ffn.1.2 is stored (201), listed with its step
 *    and uploader, and downloaded byte for byte; the same bytes again are
 *    200; a different one right away is 429 (one per half period);
 *  - refused with their codes, and nothing stored (no row, no file, no
 *    temporary): truncated, wrong shape (refused at the header), a NaN, a
 *    config naming another uid, a wrong announced hash, a uid off the grid,
 *    an mlp run, a caller not on the allowlist;
 *  - two different uploads of one uid by one uploader at once: one is
 *    stored, the other 429 (the limit is checked again under a lock);
 *  - retention: the newest 2 per uid;
 *  - a coordinator killed with SIGKILL and restarted still serves them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "ct_moe.h"
#include "moe/moe_ckpt.h"

#define PW "organizer-password"
#define C_W 128
#define F_W 256

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org, *g_vol, *g_out;
static char g_vdir[256], g_odir[256];

/* An expert checkpoint file's bytes (heap) for uid, written through a
 * file; C, F may differ from the run's, nan puts a NaN in the parameters. */
static uint8_t *make_xckpt(const char *uid, int C, int F, uint64_t step, float base, int nan, size_t *len,
                           char hex[65])
{
    uint64_t n = moe_ckpt_nparams(C, F);
    float *buf = calloc(3 * n, sizeof(float));
    assert_non_null(buf);
    for (uint64_t i = 0; i < n; i++) {
        buf[i] = base + 0.001f * (float)(i % 97);
        buf[n + i] = 0.01f;
        buf[2 * n + i] = 0.0001f;
    }
    if (nan)
        buf[n / 2] = NAN;
    char cfg[MOE_CKPT_CONFIG_MAX + 1], path[512];
    assert_int_equal(moe_ckpt_config(uid, C, F, cfg, sizeof cfg), CM_OK);
    struct cm_ckpt_buf opt[2] = {{MOE_CKPT_OPT_M, buf + n, n}, {MOE_CKPT_OPT_V, buf + 2 * n, n}};
    struct cm_ckpt c = {.step = step, .params = buf, .n_params = n, .opt = opt, .n_opt = 2, .config = cfg,
                        .config_len = (uint32_t)strlen(cfg)};
    uint8_t sha[32];
    snprintf(path, sizeof path, "%s/x.ckpt", g_vdir);
    assert_int_equal(cm_ckpt_write(path, &c, sha), CM_OK);
    free(buf);
    cm_hex_encode(sha, 32, hex);
    uint8_t *b = (uint8_t *)ct_read_file(path, len);
    assert_non_null(b);
    unlink(path);
    return b;
}

static long put_x(const char *bearer, const char *run, const char *uid, const void *data, size_t len,
                  const char *sha_hex, struct ct_resp *r)
{
    char path[160], auth[256], shah[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/experts/%s/checkpoint", run, uid);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", sha_hex);
    const char *h[] = {auth, shah, "Content-Type: application/octet-stream", "Expect: 100-continue", NULL};
    ct_http_raw(&g_c, "PUT", path, h, data, len, r);
    return r->status;
}

static const char *err_code(const struct ct_resp *r)
{
    const char *c = json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
    return c ? c : "";
}

/* Refused with status and code, and the reason printed. */
static void expect_refused(const char *bearer, const char *run, const char *uid, const void *d, size_t len,
                           const char *sha, long status, const char *code)
{
    struct ct_resp r;
    long st = put_x(bearer, run, uid, d, len, sha, &r);
    const char *msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    printf("  %s %s: %ld %s: %s\n", run, uid, st, err_code(&r), msg ? msg : "");
    if (st != status || strcmp(err_code(&r), code))
        fail_msg("expected %ld %s, got %ld %s", status, code, st, err_code(&r));
    ct_resp_free(&r);
}

/* Files in the run's expert directory: checkpoints and temporaries. */
static void count_files(const char *run, int *ckpts, int *tmps)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/checkpoints/%s/experts", g_c.dir, run);
    DIR *d = opendir(dir);
    *ckpts = *tmps = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        *ckpts += strstr(e->d_name, ".ckpt") != NULL;
        *tmps += !strncmp(e->d_name, ".upload-", 8);
    }
    if (d)
        closedir(d);
}

static json_t *list(const char *run)
{
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/experts", run);
    struct ct_resp r;
    ct_http(&g_c, "GET", path, g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *a = json_incref(json_object_get(r.json, "experts"));
    ct_resp_free(&r);
    return a;
}

static void expect_download(const char *uid, const uint8_t *want, size_t len)
{
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/xm/experts/%s/checkpoint", uid);
    struct ct_resp r;
    ct_http(&g_c, "GET", path, g_vol, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, len);
    assert_memory_equal(r.body, want, len);
    ct_resp_free(&r);
}

struct racer {
    const uint8_t *data;
    size_t len;
    const char *sha;
    long status;
};
static void *race(void *arg)
{
    struct racer *r = arg;
    struct ct_resp resp;
    r->status = put_x(g_vol, "xm", "ffn.0.0", r->data, r->len, r->sha, &resp);
    ct_resp_free(&resp);
    return NULL;
}

static void test_expert_checkpoints(void **state)
{
    (void)state;
    size_t len, len2;
    char sha[65], sha2[65];
    struct ct_resp r;
    uint8_t *ok = make_xckpt("ffn.1.2", C_W, F_W, 5, 0.5f, 0, &len, sha);
    assert_true(len <= moe_ckpt_max_bytes(C_W, F_W));
    assert_int_equal(put_x(g_vol, "xm", "ffn.1.2", ok, len, sha, &r), 201);
    assert_int_equal(json_integer_value(json_object_get(r.json, "step")), 5);
    ct_resp_free(&r);
    json_t *a = list("xm");
    assert_int_equal(json_array_size(a), 1);
    json_t *e = json_array_get(a, 0);
    assert_string_equal(json_string_value(json_object_get(e, "uid")), "ffn.1.2");
    assert_string_equal(json_string_value(json_object_get(e, "uploaded_by")), "vol0");
    assert_string_equal(json_string_value(json_object_get(e, "sha256")), sha);
    assert_int_equal(json_integer_value(json_object_get(e, "step")), 5);
    json_decref(a);
    expect_download("ffn.1.2", ok, len);
    /* the same bytes: 200; different ones right away: the rate limit */
    assert_int_equal(put_x(g_vol, "xm", "ffn.1.2", ok, len, sha, &r), 200);
    ct_resp_free(&r);
    uint8_t *next = make_xckpt("ffn.1.2", C_W, F_W, 6, 0.6f, 0, &len2, sha2);
    expect_refused(g_vol, "xm", "ffn.1.2", next, len2, sha2, 429, "too_many_uploads");

    /* refusals, on a uid with nothing stored */
    uint8_t *other = make_xckpt("ffn.2.2", C_W, F_W, 1, 0.1f, 0, &len2, sha2);
    expect_refused(g_vol, "xm", "ffn.2.2", other, len2 - 100, sha2, 422, "invalid_checkpoint");
    expect_refused(g_vol, "xm", "ffn.2.2", other, len2, sha, 422, "checksum_mismatch");
    expect_refused(g_vol, "xm", "ffn.3.3", other, len2, sha2, 422, "wrong_shape"); /* config names ffn.2.2 */
    expect_refused(g_vol, "xm", "ffn.4.0", other, len2, sha2, 404, "unknown_expert");
    expect_refused(g_vol, "xm", "ffn.1", other, len2, sha2, 404, "unknown_expert");
    expect_refused(g_vol, "mlp", "ffn.2.2", other, len2, sha2, 422, "not_dmoe");
    expect_refused(g_out, "xm", "ffn.2.2", other, len2, sha2, 403, "not_allowlisted");
    free(other);
    size_t lw;
    char shw[65];
    uint8_t *wrong = make_xckpt("ffn.2.2", 64, F_W, 1, 0.1f, 0, &lw, shw);
    expect_refused(g_vol, "xm", "ffn.2.2", wrong, lw, shw, 422, "wrong_shape");
    free(wrong);
    uint8_t *nan = make_xckpt("ffn.2.2", C_W, F_W, 1, 0.1f, 1, &lw, shw);
    expect_refused(g_vol, "xm", "ffn.2.2", nan, lw, shw, 422, "wrong_shape");
    free(nan);
    a = list("xm");
    assert_int_equal(json_array_size(a), 1); /* nothing stored */
    json_decref(a);
    /* who serves what (the backbone's DHT): nobody here; the same access rules */
    struct ct_resp sr;
    ct_http(&g_c, "GET", "/api/v1/runs/xm/experts/servers", g_vol, NULL, &sr);
    assert_int_equal(sr.status, 200);
    assert_int_equal(json_array_size(json_object_get(sr.json, "experts")), 0);
    assert_int_equal(json_integer_value(json_object_get(sr.json, "servers")), 0);
    assert_true(json_is_true(json_object_get(sr.json, "complete")));
    ct_resp_free(&sr);
    ct_http(&g_c, "GET", "/api/v1/runs/mlp/experts/servers", g_vol, NULL, &sr);
    assert_int_equal(sr.status, 422);
    assert_string_equal(err_code(&sr), "not_dmoe");
    ct_resp_free(&sr);
    ct_http(&g_c, "GET", "/api/v1/runs/xm/experts/servers", g_out, NULL, &sr);
    assert_int_equal(sr.status, 403);
    ct_resp_free(&sr);
    ct_http(&g_c, "GET", "/api/v1/runs/nosuch/experts/servers", g_vol, NULL, &sr);
    assert_int_equal(sr.status, 404);
    ct_resp_free(&sr);
    int nck, ntmp;
    count_files("xm", &nck, &ntmp);
    assert_int_equal(nck, 1);
    assert_int_equal(ntmp, 0);

    /* two at once */
    struct racer rr[2];
    char rs[2][65];
    uint8_t *rb[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        rb[i] = make_xckpt("ffn.0.0", C_W, F_W, 1 + (uint64_t)i, 0.2f * (float)(i + 1), 0, &rr[i].len, rs[i]);
        rr[i].data = rb[i];
        rr[i].sha = rs[i];
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, race, &rr[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    printf("  two at once: %ld and %ld\n", rr[0].status, rr[1].status);
    assert_true((rr[0].status == 201 && rr[1].status == 429) || (rr[0].status == 429 && rr[1].status == 201));
    count_files("xm", &nck, &ntmp);
    assert_int_equal(nck, 2);
    assert_int_equal(ntmp, 0);
    free(rb[0]);
    free(rb[1]);

    /* retention: three more of ffn.1.2 (one per second: the run's period is 2 s) */
    uint8_t *v[3];
    size_t vl[3];
    char vs[3][65];
    for (int i = 0; i < 3; i++) {
        ct_moe_sleep_ms(1100);
        v[i] = make_xckpt("ffn.1.2", C_W, F_W, 10 + (uint64_t)i, 1.0f + (float)i, 0, &vl[i], vs[i]);
        assert_int_equal(put_x(g_vol, "xm", "ffn.1.2", v[i], vl[i], vs[i], &r), 201);
        ct_resp_free(&r);
    }
    count_files("xm", &nck, &ntmp);
    assert_int_equal(nck, 3); /* ffn.1.2's newest 2, ffn.0.0's one */
    expect_download("ffn.1.2", v[2], vl[2]);

    /* a killed coordinator keeps what it committed */
    char dir[256];
    snprintf(dir, sizeof dir, "%s", g_c.dir);
    assert_int_equal(ct_coord_stop(&g_c, SIGKILL), 128 + SIGKILL);
    assert_int_equal(ct_coord_start(&g_c, g_pg.url, dir, NULL), 0);
    expect_download("ffn.1.2", v[2], vl[2]);
    count_files("xm", &nck, &ntmp);
    assert_int_equal(nck, 3);
    for (int i = 0; i < 3; i++)
        free(v[i]);
    free(ok);
    free(next);
}

static int setup(void **state)
{
    (void)state;
    if (ct_moe_setup(&g_pg, &g_c, PW, &g_org, "xm", json_pack("{s:i}", "checkpoint_every_s", 2)) != 0)
        return -1;
    struct ct_resp r;
    json_t *mlp = ct_fmnist_recipe(20); /* more steps than the recipe's 10 of warm-up */
    char *body = mlp ? ct_run_body("mlp", mlp) : NULL;
    json_decref(mlp);
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    long st = r.status;
    if (st != 201)
        fprintf(stderr, "creating the run mlp: %ld %s\n", st, r.body ? r.body : "");
    ct_resp_free(&r);
    char extra[256] = "";
    int vrc = st != 201 || ct_volunteer_account(&g_c, g_org, "xm", "vol0", g_vdir) != 0 ||
              ct_volunteer_account(&g_c, g_org, "mlp", "vol0", extra) != 0;
    if (extra[0])
        ct_rmrf(extra);
    if (vrc)
        return -1;
    /* "out": a volunteer of the mlp run only */
    if (ct_volunteer_account(&g_c, g_org, "mlp", "out", g_odir) != 0)
        return -1;
    g_vol = ct_login(&g_c, "vol0", "volunteer-pw");
    g_out = ct_login(&g_c, "out", "volunteer-pw");
    return g_vol && g_out ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    if (g_vdir[0])
        ct_rmrf(g_vdir);
    if (g_odir[0])
        ct_rmrf(g_odir);
    free(g_org);
    free(g_vol);
    free(g_out);
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_expert_checkpoints)};
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
