/* The signed pipeline assignment on the wire: see dtfm_payload.h and
 * docs/protocol.md, "Pipeline schedules", the contract for these bytes. */
#include "sched/dtfm_payload.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_json.h"
#include "cm_token.h"
#include "sched/dtfm.h"
#include "sched/sched_internal.h"

#define TIME_MAX 253402300799LL        /* 9999-12-31 */
#define VERSION_MAX 9007199254740991LL /* 2^53 - 1 */
#define BYTES_MAX 1e15                 /* activations or gradients of one stage: a petabyte */
#define SECONDS_MAX 1e12

void dtfm_payload_cleanup(struct dtfm_payload *p)
{
    if (!p)
        return;
    free(p->assign);
    free(p->spares);
    memset(p, 0, sizeof *p);
}

static int num_ok(double v, double max)
{
    return isfinite(v) && v >= 0 && v <= max;
}

static int key_cmp(const void *a, const void *b)
{
    return memcmp(a, b, CM_ED25519_PUB_LEN);
}

/* Every key once over the assignment and the spares (a peer holds one
 * tasklet or is a spare, docs/protocol.md). */
static int keys_unique(const struct dtfm_payload *p)
{
    size_t n = p->stages * p->replicas + p->nspares;
    uint8_t(*all)[CM_ED25519_PUB_LEN] = malloc(n * sizeof *all);
    if (!all)
        return -1;
    memcpy(all, p->assign, p->stages * p->replicas * sizeof *all);
    if (p->nspares)
        memcpy(all + p->stages * p->replicas, p->spares, p->nspares * sizeof *all);
    qsort(all, n, sizeof *all, key_cmp);
    int ok = 1;
    for (size_t i = 1; i < n && ok; i++)
        ok = memcmp(all[i - 1], all[i], CM_ED25519_PUB_LEN) != 0;
    free(all);
    return ok;
}

int dtfm_payload_decode(const char *buf, size_t len, struct dtfm_payload *out, char *err, size_t cap)
{
    static const struct cm_json_field TOP[] = {
        {"format", CM_J_STRING, 1, 1, 64},
        {"run", CM_J_STRING, 1, 1, DTFM_PAYLOAD_RUN_MAX},
        {"version", CM_J_INT, 1, 1, VERSION_MAX},
        {"issued_at", CM_J_INT, 1, 0, TIME_MAX},
        {"valid_from", CM_J_INT, 1, 0, TIME_MAX},
        {"valid_until", CM_J_INT, 1, 0, TIME_MAX},
        {"kid", CM_J_STRING, 1, CM_KID_LEN, CM_KID_LEN},
        {"stages", CM_J_INT, 1, 1, DTFM_MAX_STAGES},
        {"replicas", CM_J_INT, 1, 1, DTFM_MAX_REPLICAS},
        {"activation_bytes", CM_J_NUMBER, 1, 1, 0},
        {"gradient_bytes", CM_J_NUMBER, 1, 1, 0},
        {"assignment", CM_J_ARRAY, 1, 1, 0},
        {"spares", CM_J_ARRAY, 1, 1, 0},
        {"predicted", CM_J_OBJECT, 1, 1, 0},
        {"random_mean_s", CM_J_NUMBER, 1, 1, 0},
    };
    static const struct cm_json_field PRED[] = {
        {"total_s", CM_J_NUMBER, 1, 1, 0},
        {"dp_s", CM_J_NUMBER, 1, 1, 0},
        {"pp_s", CM_J_NUMBER, 1, 1, 0},
        {"compute_s", CM_J_NUMBER, 1, 1, 0},
    };
    if (!out) {
        sched__seterr(err, cap, "no output given");
        return CM_EINVAL;
    }
    memset(out, 0, sizeof *out);
    int rc;
    char jerr[160] = "";
    json_t *root = sched__parse_doc(buf, len, DTFM_PAYLOAD_MAX, "pipeline assignment", DTFM_PAYLOAD_FORMAT, TOP,
                                    sizeof TOP / sizeof TOP[0], &rc, err, cap);
    if (!root)
        return rc;
    rc = CM_EPARSE;
    const char *run = json_string_value(json_object_get(root, "run"));
    const char *kid = json_string_value(json_object_get(root, "kid"));
    if (!cm_name_valid(run) || !sched__kid_ok(kid)) {
        sched__seterr(err, cap, "pipeline assignment: bad run name or key id");
        goto fail;
    }
    snprintf(out->run, sizeof out->run, "%s", run);
    snprintf(out->kid, sizeof out->kid, "%s", kid);
    out->version = json_integer_value(json_object_get(root, "version"));
    out->issued_at = json_integer_value(json_object_get(root, "issued_at"));
    out->valid_from = json_integer_value(json_object_get(root, "valid_from"));
    out->valid_until = json_integer_value(json_object_get(root, "valid_until"));
    if (out->valid_until <= out->valid_from) {
        sched__seterr(err, cap, "pipeline assignment: valid_until must be after valid_from");
        goto fail;
    }
    out->stages = (size_t)json_integer_value(json_object_get(root, "stages"));
    out->replicas = (size_t)json_integer_value(json_object_get(root, "replicas"));
    if (out->stages * out->replicas > DTFM_PAYLOAD_MAX_SLOTS) {
        sched__seterr(err, cap, "pipeline assignment: %zu stages x %zu replicas, at most %u devices", out->stages,
               out->replicas, DTFM_PAYLOAD_MAX_SLOTS);
        goto fail;
    }
    out->act_bytes = json_number_value(json_object_get(root, "activation_bytes"));
    out->grad_bytes = json_number_value(json_object_get(root, "gradient_bytes"));
    out->random_mean_s = json_number_value(json_object_get(root, "random_mean_s"));
    if (!num_ok(out->act_bytes, BYTES_MAX) || !num_ok(out->grad_bytes, BYTES_MAX) ||
        !num_ok(out->random_mean_s, SECONDS_MAX)) {
        sched__seterr(err, cap, "pipeline assignment: activation_bytes, gradient_bytes and random_mean_s must be "
                         "finite, non-negative and in range");
        goto fail;
    }
    json_t *pred = json_object_get(root, "predicted");
    if (cm_json_check(pred, PRED, sizeof PRED / sizeof PRED[0], jerr, sizeof jerr) != CM_OK) {
        sched__seterr(err, cap, "pipeline assignment: predicted: %s", jerr);
        goto fail;
    }
    out->total_s = json_number_value(json_object_get(pred, "total_s"));
    out->dp_s = json_number_value(json_object_get(pred, "dp_s"));
    out->pp_s = json_number_value(json_object_get(pred, "pp_s"));
    out->compute_s = json_number_value(json_object_get(pred, "compute_s"));
    if (!num_ok(out->total_s, SECONDS_MAX) || !num_ok(out->dp_s, SECONDS_MAX) || !num_ok(out->pp_s, SECONDS_MAX) ||
        !num_ok(out->compute_s, SECONDS_MAX)) {
        sched__seterr(err, cap, "pipeline assignment: predicted seconds must be finite, non-negative and in range");
        goto fail;
    }
    json_t *asg = json_object_get(root, "assignment"), *spares = json_object_get(root, "spares");
    if (json_array_size(asg) != out->replicas) {
        sched__seterr(err, cap, "pipeline assignment: %zu rows for %zu replicas", json_array_size(asg), out->replicas);
        goto fail;
    }
    size_t ns = json_array_size(spares);
    if (ns > DTFM_PAYLOAD_MAX_SPARES) {
        sched__seterr(err, cap, "pipeline assignment: %zu spares, at most %u", ns, DTFM_PAYLOAD_MAX_SPARES);
        goto fail;
    }
    out->assign = calloc(out->stages * out->replicas, sizeof *out->assign);
    out->spares = ns ? calloc(ns, sizeof *out->spares) : NULL;
    if (!out->assign || (ns && !out->spares)) {
        sched__seterr(err, cap, "out of memory");
        rc = CM_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < out->replicas; i++) {
        json_t *row = json_array_get(asg, i);
        if (!json_is_array(row) || json_array_size(row) != out->stages) {
            sched__seterr(err, cap, "pipeline assignment: replica %zu: expected an array of %zu keys", i, out->stages);
            goto fail;
        }
        for (size_t j = 0; j < out->stages; j++)
            if (!sched__b64_key(json_string_value(json_array_get(row, j)), out->assign[i * out->stages + j])) {
                sched__seterr(err, cap, "pipeline assignment: replica %zu, stage %zu: not base64url of a 32-byte key", i,
                       j);
                goto fail;
            }
    }
    for (size_t k = 0; k < ns; k++)
        if (!sched__b64_key(json_string_value(json_array_get(spares, k)), out->spares[k])) {
            sched__seterr(err, cap, "pipeline assignment: spare %zu: not base64url of a 32-byte key", k);
            goto fail;
        }
    out->nspares = ns;
    int u = keys_unique(out);
    if (u != 1) {
        sched__seterr(err, cap, u < 0 ? "out of memory" : "pipeline assignment: a peer key appears twice");
        rc = u < 0 ? CM_ENOMEM : CM_EPARSE;
        goto fail;
    }
    json_decref(root);
    return CM_OK;
fail:
    json_decref(root);
    dtfm_payload_cleanup(out);
    return rc;
}

static json_t *key_json(const uint8_t key[CM_ED25519_PUB_LEN])
{
    char b[64];
    cm_b64url_encode(key, CM_ED25519_PUB_LEN, b);
    return json_string(b);
}

int dtfm_payload_encode(const struct dtfm_payload *p, char **json, size_t *len)
{
    if (!p || !json || !len || !p->assign || p->stages < 1 || p->stages > DTFM_MAX_STAGES || p->replicas < 1 ||
        p->replicas > DTFM_MAX_REPLICAS || p->stages * p->replicas > DTFM_PAYLOAD_MAX_SLOTS ||
        p->nspares > DTFM_PAYLOAD_MAX_SPARES || (p->nspares && !p->spares) || p->version < 1 ||
        p->valid_until <= p->valid_from || !cm_name_valid(p->run) || !sched__kid_ok(p->kid))
        return CM_EINVAL;
    *json = NULL;
    *len = 0;
    json_t *asg = json_array(), *spares = json_array();
    for (size_t i = 0; asg && i < p->replicas; i++) {
        json_t *row = json_array();
        for (size_t j = 0; row && j < p->stages; j++)
            json_array_append_new(row, key_json(p->assign[i * p->stages + j]));
        json_array_append_new(asg, row);
    }
    for (size_t k = 0; spares && k < p->nspares; k++)
        json_array_append_new(spares, key_json(p->spares[k]));
    /* the documented order; Jansson keeps insertion order */
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:i, s:i, s:f, s:f, s:o, s:o, "
                          "s:{s:f, s:f, s:f, s:f}, s:f}",
                          "format", DTFM_PAYLOAD_FORMAT, "run", p->run, "version", (json_int_t)p->version,
                          "issued_at", (json_int_t)p->issued_at, "valid_from", (json_int_t)p->valid_from,
                          "valid_until", (json_int_t)p->valid_until, "kid", p->kid, "stages", (int)p->stages,
                          "replicas", (int)p->replicas, "activation_bytes", p->act_bytes, "gradient_bytes",
                          p->grad_bytes, "assignment", asg, "spares", spares, "predicted", "total_s", p->total_s,
                          "dp_s", p->dp_s, "pp_s", p->pp_s, "compute_s", p->compute_s, "random_mean_s",
                          p->random_mean_s);
    char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    if (!txt)
        return CM_ENOMEM;
    *json = txt;
    *len = strlen(txt);
    return CM_OK;
}

int dtfm_payload_find(const struct dtfm_payload *p, const uint8_t key[CM_ED25519_PUB_LEN], size_t *replica,
                      size_t *stage)
{
    for (size_t i = 0; p && p->assign && i < p->stages * p->replicas; i++)
        if (!memcmp(p->assign[i], key, CM_ED25519_PUB_LEN)) {
            *replica = i / p->stages;
            *stage = i % p->stages;
            return CM_OK;
        }
    return CM_ENOTFOUND;
}

int dtfm_payload_sign(const struct cm_ed25519 *key, const void *payload, size_t len,
                      uint8_t sig[CM_ED25519_SIG_LEN])
{
    return sched__sign_prefixed(key, DTFM_PAYLOAD_FORMAT "\n", DTFM_PAYLOAD_MAX, payload, len, sig);
}

int dtfm_payload_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *payload, size_t len,
                        const uint8_t sig[CM_ED25519_SIG_LEN])
{
    return sched__verify_prefixed(pub, DTFM_PAYLOAD_FORMAT "\n", DTFM_PAYLOAD_MAX, payload, len, sig);
}
