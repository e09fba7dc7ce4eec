/* See ct_pipeline.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ct_pipeline.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "sched/dtfm_payload.h"

long ct_status(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
               const char *body)
{
    struct ct_resp r;
    ct_http(c, method, path, bearer, body, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

static const char *err_field(const struct ct_resp *r, const char *k)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), k));
}

void ct_expect(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
               const char *body, long status, const char *code, const char *says)
{
    struct ct_resp r;
    ct_http(c, method, path, bearer, body, &r);
    const char *cd = err_field(&r, "code"), *m = err_field(&r, "message");
    if (r.status != status || (code && (!cd || strcmp(cd, code) != 0)) ||
        (says && (!m || !strstr(m, says))))
        fail_msg("%s %s %s: expected %ld %s '%s', got %ld %s", method, path, body ? body : "",
                 status, code ? code : "", says ? says : "", r.status, r.body ? r.body : "(none)");
    ct_resp_free(&r);
}

/* Fetches the pipeline and verifies it as a peer would: the signature with
 * a key from GET /api/v1/keys over "crowdtrain-pipeline/1\n" + the payload
 * bytes, before parsing them. */
void ct_pipeline_fetch_verified(const struct ct_coord *c, const char *run, size_t stages, size_t replicas,
                                 struct ct_served *sv)
{
    struct ct_resp k, r;
    char path[128];
    ct_http(c, "GET", "/api/v1/keys", NULL, NULL, &k);
    assert_int_equal(k.status, 200);
    snprintf(path, sizeof path, "/api/v1/runs/%s/pipeline", run);
    ct_http(c, "GET", path, NULL, NULL, &r);
    if (r.status != 200)
        fail_msg("GET pipeline: %ld %s", r.status, r.body ? r.body : "");
    const char *p64 = json_string_value(json_object_get(r.json, "payload"));
    const char *s64 = json_string_value(json_object_get(r.json, "signature"));
    assert_non_null(p64);
    assert_non_null(s64);
    static const char prefix[] = "crowdtrain-pipeline/1\n";
    size_t pl = sizeof prefix - 1, plen = 0, slen = 0;
    uint8_t *msg = malloc(pl + strlen(p64) + 1), sig[CM_ED25519_SIG_LEN];
    memcpy(msg, prefix, pl);
    assert_int_equal(cm_b64url_decode(p64, strlen(p64), msg + pl, strlen(p64), &plen), CM_OK);
    assert_int_equal(cm_b64url_decode(s64, strlen(s64), sig, sizeof sig, &slen), CM_OK);
    assert_int_equal(slen, sizeof sig);
    int verified = 0;
    uint8_t signer[32];
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(k.json, "keys"), i, e) {
        uint8_t pub[32];
        size_t n = 0;
        const char *pk = json_string_value(json_object_get(e, "public_key"));
        if (pk && cm_b64url_decode(pk, strlen(pk), pub, 32, &n) == CM_OK && n == 32 &&
            cm_ed25519_verify(pub, msg, pl + plen, sig) == CM_OK) {
            verified = 1;
            memcpy(signer, pub, sizeof signer);
            /* one flipped byte breaks it */
            msg[pl + plen / 2] ^= 0x20;
            assert_int_not_equal(cm_ed25519_verify(pub, msg, pl + plen, sig), CM_OK);
            msg[pl + plen / 2] ^= 0x20;
        }
    }
    assert_true(verified);
    json_error_t je;
    sv->p = json_loadb((const char *)msg + pl, plen, JSON_REJECT_DUPLICATES, &je);
    if (!sv->p)
        fail_msg("payload: %s", je.text);
    assert_string_equal(json_string_value(json_object_get(sv->p, "format")),
                        "crowdtrain-pipeline/1");
    assert_string_equal(json_string_value(json_object_get(sv->p, "run")), run);
    sv->version = json_integer_value(json_object_get(sv->p, "version"));
    assert_int_equal(sv->version, json_integer_value(json_object_get(r.json, "version")));
    long long now = (long long)time(NULL);
    assert_true(json_integer_value(json_object_get(sv->p, "valid_from")) <= now + 1);
    assert_true(json_integer_value(json_object_get(sv->p, "valid_until")) > now);
    assert_int_equal(json_integer_value(json_object_get(sv->p, "stages")), stages);
    assert_int_equal(json_integer_value(json_object_get(sv->p, "replicas")), replicas);
    sv->solved_now = json_is_true(json_object_get(r.json, "solved_now"));
    /* the agents' verifier and strict decoder (common/sched/dtfm_payload.c)
       accept the served bytes and read what the independent parse above
       reads */
    assert_int_equal(dtfm_payload_verify(signer, msg + pl, plen, sig), CM_OK);
    struct dtfm_payload dp;
    char derr[256];
    if (dtfm_payload_decode((const char *)msg + pl, plen, &dp, derr, sizeof derr) != CM_OK)
        fail_msg("the agents' decoder refused the served payload: %s", derr);
    assert_int_equal(dp.version, sv->version);
    assert_int_equal(dp.stages, stages);
    assert_int_equal(dp.replicas, replicas);
    json_t *rows = json_object_get(sv->p, "assignment");
    assert_int_equal(json_array_size(rows), replicas);
    for (size_t a = 0; a < replicas; a++)
        for (size_t b = 0; b < stages; b++) {
            const char *k64 = json_string_value(json_array_get(json_array_get(rows, a), b));
            uint8_t key[32];
            size_t n = 0, ra = 9, st = 9;
            assert_true(k64 && cm_b64url_decode(k64, strlen(k64), key, sizeof key, &n) == CM_OK && n == 32);
            assert_int_equal(dtfm_payload_find(&dp, key, &ra, &st), CM_OK);
            assert_true(ra == a && st == b);
        }
    assert_int_equal(dp.nspares, json_array_size(json_object_get(sv->p, "spares")));
    dtfm_payload_cleanup(&dp);
    free(msg);
    ct_resp_free(&k);
    ct_resp_free(&r);
}


json_t *ct_pipeline_recipe(const char *data_dir, int layers, int steps, uint64_t seed)
{
    char tr[300], ev[300];
    if (ct_text_manifest(data_dir, "train", 100000, seed, tr, sizeof tr) != 0 ||
        ct_text_manifest(data_dir, "eval", 10000, seed + 1, ev, sizeof ev) != 0)
        return NULL;
    return json_pack("{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i}, s:{s:s, s:f, s:f, s:f},"
                     " s:{s:s, s:i, s:f}, s:i, s:i, s:i, s:i, s:{s:s, s:s, s:i}, s:i}",
                     "model", "type", "gpt", "vocab", 256, "context", 32, "layers", layers, "heads", 2, "d_model",
                     64, "d_ff", 128, "optimizer", "type", "adamw", "lr", 0.005, "weight_decay", 0.01, "clip_norm",
                     0.5, "schedule", "type", "cosine", "warmup_steps", 2, "min_lr_ratio", 0.1, "batch_size", 16,
                     "micro_batch", 4, "steps", steps, "seed", 1, "data", "train", tr, "eval", ev,
                     "shuffle_buffer", 4096, "log_every", 4);
}

int ct_pipeline_create_run(const struct ct_coord *c, const char *org, const char *name, const char *summary,
                           json_t *cfg)
{
    json_t *body = json_pack("{s:s, s:I, s:s, s:o}", "name", name, "target_batch_size", (json_int_t)16,
                             "model_summary", summary, "config", cfg);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    struct ct_resp r;
    ct_http(c, "POST", "/api/v1/runs", org, text, &r);
    free(text);
    long st = r.status;
    if (st != 201)
        fprintf(stderr, "creating run %s: %ld %s\n", name, st, r.body ? r.body : "");
    ct_resp_free(&r);
    return st == 201 ? 0 : -1;
}

int ct_pipeline_backbone(struct ct_pg *pg, struct ct_coord *c, char **org, const char *tag, char *data,
                         size_t cap)
{
    int rc = ct_pg_start(pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_tempdir(tag, data, cap) != 0 ||
        ct_create_user(pg->url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(c, pg->url, NULL, NULL) != 0)
        return -1;
    *org = ct_login(c, "org", "organizer-password");
    return *org ? 0 : -1;
}

void ct_pipeline_train_local(const char *recipe, const char *steplog)
{
    const char *argv[] = {ct_bin("crowdtrain-agent"), "train", "--local", "--config", recipe, "--device", "cpu",
                          "--step-log", steplog, NULL};
    char *out = NULL;
    int rc = ct_run(argv, NULL, &out, 240);
    if (rc != 0)
        fprintf(stderr, "train --local: %s\n", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);
}
