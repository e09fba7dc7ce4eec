/* The signed schedule on the wire: JSON encoder, a strict bounded decoder
 * (agents read it from the network, so it is a pure function with a fuzz
 * target: tests/fuzz/fuzz_schedule.c), and Ed25519 signatures over the exact
 * payload bytes with a domain-separation prefix. docs/protocol.md,
 * "Schedules", is the contract for these bytes.
 *
 * The signature covers bytes, never a re-serialization: the coordinator
 * signs the payload it encoded, sends it base64url-encoded, and a peer
 * verifies before decoding. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_json.h"
#include "cm_token.h"

#define TIME_MAX 253402300799LL /* 9999-12-31: bounds every timestamp */
#define VERSION_MAX 9007199254740991LL /* 2^53 - 1: exact in every JSON reader */
#define STEPS_MAX 1.0e9

void sched_schedule_cleanup(struct sched_schedule *s)
{
    if (!s)
        return;
    free(s->peers);
    s->peers = NULL;
    s->n = 0;
}

int sched_schedule_encode(const struct sched_schedule *s, char **json_out, size_t *len_out)
{
    if (!s || !json_out || !s->n || !s->peers || s->n > SCHED_MAX_PEERS ||
        !isfinite(s->steps_per_s))
        return CM_EINVAL;
    json_t *peers = json_array();
    if (!peers)
        return CM_ENOMEM;
    for (size_t i = 0; i < s->n; i++) {
        char key[64];
        cm_b64url_encode(s->peers[i].key, CM_ED25519_PUB_LEN, key);
        json_t *o = json_pack("{s:s, s:b, s:b, s:I}", "key", key, "compute", s->peers[i].compute,
                              "client_mode", s->peers[i].client_mode, "share",
                              (json_int_t)s->peers[i].share);
        if (o && s->peers[i].ip[0] && json_object_set_new(o, "ip", json_string(s->peers[i].ip))) {
            json_decref(o);
            o = NULL;
        }
        if (!o || json_array_append_new(peers, o)) {
            json_decref(peers);
            return CM_ENOMEM;
        }
    }
    json_t *root = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:f, s:I, s:o}", "format",
                             SCHED_FORMAT, "run", s->run, "version", (json_int_t)s->version,
                             "issued_at", (json_int_t)s->issued_at, "valid_from",
                             (json_int_t)s->valid_from, "valid_until", (json_int_t)s->valid_until,
                             "kid", s->kid, "group_size", (json_int_t)s->group_size,
                             "steps_per_s", s->steps_per_s, "target_batch_size",
                             (json_int_t)s->target_batch, "peers", peers);
    if (!root)
        return CM_ENOMEM;
    char *txt = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!txt)
        return CM_ENOMEM;
    *json_out = txt;
    if (len_out)
        *len_out = strlen(txt);
    return CM_OK;
}

void sched__seterr(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || !cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

int sched__b64_key(const char *s, uint8_t key[CM_ED25519_PUB_LEN])
{
    size_t n = 0;
    return s && strlen(s) == 43 && cm_b64url_decode(s, 43, key, CM_ED25519_PUB_LEN, &n) == CM_OK &&
           n == CM_ED25519_PUB_LEN;
}

int sched__kid_ok(const char *s)
{
    if (strlen(s) != CM_KID_LEN)
        return 0;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_'))
            return 0;
    return 1;
}

int sched__ip_ok(const char *s)
{
    unsigned char b[16];
    return s && strlen(s) < SCHED_IP_MAX && (inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1);
}

json_t *sched__parse_doc(const char *buf, size_t len, size_t max, const char *what, const char *format,
                         const struct cm_json_field *top, size_t ntop, int *rc, char *err, size_t cap)
{
    *rc = CM_EPARSE;
    if (!buf || len == 0) {
        sched__seterr(err, cap, "empty %s", what);
        return NULL;
    }
    if (len > max) {
        sched__seterr(err, cap, "%s of %zu bytes: at most %zu", what, len, max);
        *rc = CM_ETOOBIG;
        return NULL;
    }
    char jerr[160] = "";
    json_t *root = cm_json_parse_object(buf, len, jerr, sizeof jerr);
    if (!root) {
        sched__seterr(err, cap, "%s is not a JSON object: %s", what, jerr);
        return NULL;
    }
    if (cm_json_check(root, top, ntop, jerr, sizeof jerr) != CM_OK) {
        sched__seterr(err, cap, "%s: %s", what, jerr);
        json_decref(root);
        return NULL;
    }
    if (strcmp(json_string_value(json_object_get(root, "format")), format) != 0) {
        sched__seterr(err, cap, "%s format is not %s", what, format);
        *rc = CM_EVERSION;
        json_decref(root);
        return NULL;
    }
    *rc = CM_OK;
    return root;
}

int sched_schedule_decode(const char *buf, size_t len, struct sched_schedule *out, char *err,
                          size_t cap)
{
    static const struct cm_json_field TOP[] = {
        {"format", CM_J_STRING, 1, 1, 64},
        {"run", CM_J_STRING, 1, 1, SCHED_RUN_MAX},
        {"version", CM_J_INT, 1, 1, VERSION_MAX},
        {"issued_at", CM_J_INT, 1, 0, TIME_MAX},
        {"valid_from", CM_J_INT, 1, 0, TIME_MAX},
        {"valid_until", CM_J_INT, 1, 0, TIME_MAX},
        {"kid", CM_J_STRING, 1, CM_KID_LEN, CM_KID_LEN},
        {"group_size", CM_J_INT, 1, 1, SCHED_MAX_PEERS},
        {"steps_per_s", CM_J_NUMBER, 1, 1, 0},
        {"target_batch_size", CM_J_INT, 1, 1, (int64_t)SCHED_MAX_BATCH},
        {"peers", CM_J_ARRAY, 1, 1, 0},
    };
    static const struct cm_json_field PEER[] = {
        {"key", CM_J_STRING, 1, 43, 43},
        {"compute", CM_J_BOOL, 1, 1, 0},
        {"client_mode", CM_J_BOOL, 1, 1, 0},
        {"share", CM_J_INT, 1, 0, SCHED_SHARE_TOTAL},
        {"ip", CM_J_STRING, 0, 2, SCHED_IP_MAX - 1},
    };
    if (!out) {
        sched__seterr(err, cap, "no output given");
        return CM_EINVAL;
    }
    memset(out, 0, sizeof *out);
    int rc;
    char jerr[160] = "";
    struct sched_entry *peers = NULL;
    json_t *root = sched__parse_doc(buf, len, SCHED_JSON_MAX, "schedule", SCHED_FORMAT, TOP,
                                    sizeof TOP / sizeof TOP[0], &rc, err, cap);
    if (!root)
        return rc;
    rc = CM_EPARSE;
    const char *run = json_string_value(json_object_get(root, "run"));
    const char *kid = json_string_value(json_object_get(root, "kid"));
    if (!cm_name_valid(run) || !sched__kid_ok(kid)) {
        sched__seterr(err, cap, "schedule: bad run name or key id");
        goto fail;
    }
    double steps = json_number_value(json_object_get(root, "steps_per_s"));
    if (!isfinite(steps) || steps < 0 || steps > STEPS_MAX) {
        sched__seterr(err, cap, "schedule: steps_per_s outside [0, %g]", STEPS_MAX);
        goto fail;
    }
    int64_t from = json_integer_value(json_object_get(root, "valid_from"));
    int64_t until = json_integer_value(json_object_get(root, "valid_until"));
    if (until <= from) {
        sched__seterr(err, cap, "schedule: valid_until must be after valid_from");
        goto fail;
    }
    json_t *arr = json_object_get(root, "peers");
    size_t n = json_array_size(arr);
    if (n == 0 || n > SCHED_MAX_PEERS) {
        sched__seterr(err, cap, "schedule: 1..%d peers, got %zu", SCHED_MAX_PEERS, n);
        goto fail;
    }
    int64_t group = json_integer_value(json_object_get(root, "group_size"));
    if ((size_t)group > n) {
        sched__seterr(err, cap, "schedule: group_size %lld exceeds the %zu peers", (long long)group, n);
        goto fail;
    }
    peers = calloc(n, sizeof *peers);
    if (!peers) {
        rc = CM_ENOMEM;
        goto fail;
    }
    uint64_t total = 0;
    size_t computing = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        if (!json_is_object(o) ||
            cm_json_check(o, PEER, sizeof PEER / sizeof PEER[0], jerr, sizeof jerr) != CM_OK) {
            sched__seterr(err, cap, "schedule: peer %zu: %s", i,
                   json_is_object(o) ? jerr : "expected an object");
            goto fail;
        }
        if (!sched__b64_key(json_string_value(json_object_get(o, "key")), peers[i].key)) {
            sched__seterr(err, cap, "schedule: peer %zu: key is not base64url of 32 bytes", i);
            goto fail;
        }
        for (size_t j = 0; j < i; j++)
            if (!memcmp(peers[j].key, peers[i].key, CM_ED25519_PUB_LEN)) {
                sched__seterr(err, cap, "schedule: peers %zu and %zu have the same key", j, i);
                goto fail;
            }
        peers[i].compute = json_is_true(json_object_get(o, "compute"));
        peers[i].client_mode = json_is_true(json_object_get(o, "client_mode"));
        peers[i].share = (uint32_t)json_integer_value(json_object_get(o, "share"));
        const char *ip = json_string_value(json_object_get(o, "ip"));
        if (ip && !sched__ip_ok(ip)) {
            sched__seterr(err, cap, "schedule: peer %zu: ip is not a numeric IPv4 or IPv6 address", i);
            goto fail;
        }
        snprintf(peers[i].ip, sizeof peers[i].ip, "%s", ip ? ip : "");
        if (peers[i].client_mode && peers[i].share) {
            sched__seterr(err, cap, "schedule: peer %zu is in client mode but aggregates", i);
            goto fail;
        }
        total += peers[i].share;
        computing += peers[i].compute != 0;
    }
    if (total != SCHED_SHARE_TOTAL) {
        sched__seterr(err, cap, "schedule: shares sum to %llu, not %u", (unsigned long long)total,
               SCHED_SHARE_TOTAL);
        goto fail;
    }
    if (!computing) {
        sched__seterr(err, cap, "schedule: no peer computes");
        goto fail;
    }
    snprintf(out->run, sizeof out->run, "%s", run);
    snprintf(out->kid, sizeof out->kid, "%s", kid);
    out->version = json_integer_value(json_object_get(root, "version"));
    out->issued_at = json_integer_value(json_object_get(root, "issued_at"));
    out->valid_from = from;
    out->valid_until = until;
    out->group_size = (uint32_t)group;
    out->steps_per_s = steps;
    out->target_batch = json_integer_value(json_object_get(root, "target_batch_size"));
    out->n = n;
    out->peers = peers;
    json_decref(root);
    return CM_OK;
fail:
    free(peers);
    json_decref(root);
    memset(out, 0, sizeof *out);
    return rc;
}

/* Domain separation: a schedule signature can never pass for a signature on
 * anything else the coordinator signs (passes sign "header.payload"). */
static int signed_bytes(const char *prefix, size_t max, const void *payload, size_t len, uint8_t **out,
                        size_t *out_len)
{
    size_t pl = strlen(prefix);
    if (len > max)
        return CM_ETOOBIG;
    uint8_t *b = malloc(pl + len + 1);
    if (!b)
        return CM_ENOMEM;
    memcpy(b, prefix, pl);
    if (len)
        memcpy(b + pl, payload, len);
    *out = b;
    *out_len = pl + len;
    return CM_OK;
}

int sched__sign_prefixed(const struct cm_ed25519 *key, const char *prefix, size_t max, const void *payload,
                         size_t len, uint8_t sig[CM_ED25519_SIG_LEN])
{
    if (!key || !key->has_private || (!payload && len))
        return CM_EINVAL;
    uint8_t *b = NULL;
    size_t n = 0;
    int rc = signed_bytes(prefix, max, payload, len, &b, &n);
    if (rc == CM_OK)
        rc = cm_ed25519_sign(key, b, n, sig);
    free(b);
    return rc;
}

int sched__verify_prefixed(const uint8_t pub[CM_ED25519_PUB_LEN], const char *prefix, size_t max,
                           const void *payload, size_t len, const uint8_t sig[CM_ED25519_SIG_LEN])
{
    if (!pub || !sig || (!payload && len))
        return CM_EINVAL;
    uint8_t *b = NULL;
    size_t n = 0;
    int rc = signed_bytes(prefix, max, payload, len, &b, &n);
    if (rc == CM_OK)
        rc = cm_ed25519_verify(pub, b, n, sig) == CM_OK ? CM_OK : CM_EBADSIG;
    free(b);
    return rc;
}

int sched_sign(const struct cm_ed25519 *key, const void *payload, size_t len,
               uint8_t sig[CM_ED25519_SIG_LEN])
{
    return sched__sign_prefixed(key, SCHED_FORMAT "\n", SCHED_JSON_MAX, payload, len, sig);
}

int sched_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *payload, size_t len,
                 const uint8_t sig[CM_ED25519_SIG_LEN])
{
    return sched__verify_prefixed(pub, SCHED_FORMAT "\n", SCHED_JSON_MAX, payload, len, sig);
}

int sched_schedule_from_solution(const struct sched_problem *p, const struct sched_solution *sol,
                                 struct sched_schedule *out)
{
    if (!p || !sol || !out || sol->n != p->n || !sol->peers)
        return CM_EINVAL;
    struct sched_entry *e = calloc(p->n, sizeof *e);
    if (!e)
        return CM_ENOMEM;
    for (size_t i = 0; i < p->n; i++) {
        memcpy(e[i].key, p->peers[i].key, CM_ED25519_PUB_LEN);
        e[i].compute = sol->peers[i].compute;
        e[i].client_mode = !p->peers[i].inbound;
        e[i].share = sol->peers[i].share;
        snprintf(e[i].ip, sizeof e[i].ip, "%s", p->peers[i].ip);
    }
    free(out->peers);
    out->peers = e;
    out->n = p->n;
    out->steps_per_s = sol->steps_per_s;
    out->target_batch = (int64_t)llround(p->target_batch);
    return CM_OK;
}
