/* The pure, strict parser of a contribution report's payload
 * (docs/accounting.md, "Reports"; docs/protocol.md, "Contribution reports").
 * Network input: every field typed and bounded, unknown fields refused,
 * numbers finite and in range, member keys distinct. No I/O, no globals, so
 * tests/fuzz/fuzz_report.c drives it alone. */
#include "coordinator/api_contrib.h"
#include "cm_err.h"
#include "cm_json.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return CM_EPARSE;
}

static int key_decode(const char *s, uint8_t out[CM_ED25519_PUB_LEN])
{
    size_t n = 0;
    return s && strlen(s) == 43 && cm_b64url_decode(s, 43, out, CM_ED25519_PUB_LEN, &n) == CM_OK &&
           n == CM_ED25519_PUB_LEN;
}

/* A finite number in [lo, hi]; JSON integers count as numbers. */
static int number(const json_t *o, const char *name, double lo, double hi, double *out, char *err,
                  size_t cap)
{
    const json_t *v = json_object_get(o, name);
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < lo || x > hi)
        return fail(err, cap, "field '%s': a number from %g to %g", name, lo, hi);
    *out = x;
    return CM_OK;
}

static int group_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > COORD_REPORT_GROUP_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static int reason_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > COORD_REPORT_REASON_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

static int parse_members(const json_t *m, struct coord_report *r, char *err, size_t cap)
{
    if (json_object_size(m) > COORD_REPORT_MEMBERS_MAX)
        return fail(err, cap, "field 'members': at most %d entries", COORD_REPORT_MEMBERS_MAX);
    const char *k;
    const json_t *v;
    r->n_members = 0;
    json_object_foreach((json_t *)m, k, v)
    {
        struct coord_report_member *e = &r->members[r->n_members];
        double x = json_number_value(v);
        if (!key_decode(k, e->pub))
            return fail(err, cap, "field 'members': keys are base64url 32-byte public keys");
        if (!json_is_number(v) || !isfinite(x) || x < 0 || x > COORD_REPORT_SAMPLES_MAX)
            return fail(err, cap, "field 'members': sample counts are numbers from 0 to %g",
                        COORD_REPORT_SAMPLES_MAX);
        e->samples = x;
        r->n_members++; /* keys are distinct: the parser rejects duplicate keys */
    }
    return CM_OK;
}

static int parse_excluded(const json_t *a, struct coord_report *r, char *err, size_t cap)
{
    if (json_array_size(a) > COORD_REPORT_MEMBERS_MAX)
        return fail(err, cap, "field 'excluded': at most %d entries", COORD_REPORT_MEMBERS_MAX);
    static const struct cm_json_field F[] = {
        {"peer", CM_J_STRING, 1, 43, 43},
        {"reason", CM_J_STRING, 1, 1, COORD_REPORT_REASON_MAX},
    };
    size_t i;
    const json_t *e;
    r->n_excluded = 0;
    json_array_foreach(a, i, e)
    {
        char why[200];
        if (!json_is_object(e) || cm_json_check(e, F, 2, why, sizeof why) != CM_OK)
            return fail(err, cap, "field 'excluded': entries are {\"peer\", \"reason\"}");
        struct coord_report_excl *x = &r->excluded[r->n_excluded];
        const char *reason = json_string_value(json_object_get(e, "reason"));
        if (!key_decode(json_string_value(json_object_get(e, "peer")), x->pub) ||
            !reason_valid(reason))
            return fail(err, cap,
                        "field 'excluded': 'peer' is a base64url key, 'reason' 1-%d of [a-z0-9_]",
                        COORD_REPORT_REASON_MAX);
        for (size_t j = 0; j < r->n_excluded; j++)
            if (!memcmp(r->excluded[j].pub, x->pub, CM_ED25519_PUB_LEN))
                return fail(err, cap, "field 'excluded': a peer is listed twice");
        snprintf(x->reason, sizeof x->reason, "%s", reason);
        r->n_excluded++;
    }
    return CM_OK;
}

int coord_report_parse(const void *buf, size_t len, struct coord_report *out, char *err,
                       size_t cap)
{
    static const struct cm_json_field F[] = {
        {"format", CM_J_STRING, 1, 1, 64},
        {"run", CM_J_STRING, 1, 1, CM_NAME_MAX},
        {"peer", CM_J_STRING, 1, 43, 43},
        {"step", CM_J_INT, 1, 0, (int64_t)1 << 53},
        {"group", CM_J_STRING, 1, 1, COORD_REPORT_GROUP_MAX},
        {"round", CM_J_STRING, 1, 64, 64},
        {"samples", CM_J_NUMBER, 1, 1, 0},
        {"compute_s", CM_J_NUMBER, 1, 1, 0},
        {"loss", CM_J_NUMBER, 0, 1, 0},
        {"sps", CM_J_NUMBER, 1, 1, 0},
        {"round_ms", CM_J_NUMBER, 1, 1, 0},
        {"parts", CM_J_INT, 1, 0, 4096},
        {"parts_averaged", CM_J_INT, 1, 0, 4096},
        {"members", CM_J_OBJECT, 1, 1, 0},
        {"excluded", CM_J_ARRAY, 1, 1, 0},
        {"t", CM_J_INT, 1, 0, (int64_t)1 << 40},
    };
    memset(out, 0, sizeof *out);
    if (err && cap)
        err[0] = '\0';
    if (len == 0 || len > COORD_REPORT_PAYLOAD_MAX)
        return fail(err, cap, "payload: 1 to %d bytes", COORD_REPORT_PAYLOAD_MAX);
    char why[256];
    json_t *j = cm_json_parse_object(buf, len, why, sizeof why);
    if (!j)
        return fail(err, cap, "payload: %s", why);
    int rc = CM_OK;
    if (cm_json_check(j, F, sizeof F / sizeof F[0], why, sizeof why) != CM_OK) {
        rc = fail(err, cap, "payload: %s", why);
        goto out;
    }
    if (strcmp(json_string_value(json_object_get(j, "format")), COORD_REPORT_FORMAT) != 0) {
        rc = fail(err, cap, "payload: 'format' must be \"%s\"", COORD_REPORT_FORMAT);
        goto out;
    }
    const char *run = json_string_value(json_object_get(j, "run"));
    const char *group = json_string_value(json_object_get(j, "group"));
    const char *round = json_string_value(json_object_get(j, "round"));
    size_t n = 0;
    if (!cm_name_valid(run)) {
        rc = fail(err, cap, "payload: 'run' is not a valid run name");
        goto out;
    }
    if (!key_decode(json_string_value(json_object_get(j, "peer")), out->peer)) {
        rc = fail(err, cap, "payload: 'peer' is base64url of a 32-byte public key");
        goto out;
    }
    if (!group_valid(group)) {
        rc = fail(err, cap, "payload: 'group' is 1-64 of [A-Za-z0-9_.:-]");
        goto out;
    }
    if (cm_hex_decode(round, 64, out->round, sizeof out->round, &n) != CM_OK || n != 32) {
        rc = fail(err, cap, "payload: 'round' is 64 hex digits");
        goto out;
    }
    snprintf(out->run, sizeof out->run, "%s", run);
    snprintf(out->group, sizeof out->group, "%s", group);
    out->step = json_integer_value(json_object_get(j, "step"));
    out->t = json_integer_value(json_object_get(j, "t"));
    out->parts = (int)json_integer_value(json_object_get(j, "parts"));
    out->parts_averaged = (int)json_integer_value(json_object_get(j, "parts_averaged"));
    if (out->parts_averaged > out->parts) {
        rc = fail(err, cap, "payload: 'parts_averaged' exceeds 'parts'");
        goto out;
    }
    if ((rc = number(j, "samples", 0, COORD_REPORT_SAMPLES_MAX, &out->samples, err, cap)) ||
        (rc = number(j, "compute_s", 0, 86400, &out->compute_s, err, cap)) ||
        (rc = number(j, "sps", 0, 1e9, &out->sps, err, cap)) ||
        (rc = number(j, "round_ms", 0, 3.6e6, &out->round_ms, err, cap)))
        goto out;
    if (json_object_get(j, "loss")) {
        if ((rc = number(j, "loss", 0, 1e6, &out->loss, err, cap)))
            goto out;
        out->has_loss = 1;
    }
    if ((rc = parse_members(json_object_get(j, "members"), out, err, cap)) ||
        (rc = parse_excluded(json_object_get(j, "excluded"), out, err, cap)))
        goto out;
out:
    json_decref(j);
    return rc;
}

/* --- the request envelope (fast form) ------------------------------------- */

static const char *skip_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* '"', bytes 0x20..0x7e other than '"' and '\\', '"'; NULL when not that. */
static const char *plain_string(const char *p, const char *e, const char **s, size_t *n)
{
    if (p >= e || *p != '"')
        return NULL;
    const char *b = ++p;
    while (p < e && *p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c > 0x7e || c == '\\')
            return NULL;
        p++;
    }
    if (p >= e)
        return NULL;
    *s = b;
    *n = (size_t)(p - b);
    return p + 1;
}

static int envelope(const void *buf, size_t len, struct coord_report_env *out)
{
    static const struct {
        const char *name;
        size_t len;
    } K[3] = {{"pass", 4}, {"payload", 7}, {"sig", 3}};
    const char *p = buf, *e = p + len;
    memset(out, 0, sizeof *out);
    if (!buf)
        return 0;
    p = skip_ws(p, e);
    if (p >= e || *p++ != '{')
        return 0;
    unsigned seen = 0;
    for (int k = 0; k < 3; k++) {
        const char *key, *v;
        size_t kn, vn;
        p = skip_ws(p, e);
        if (!(p = plain_string(p, e, &key, &kn)))
            return 0;
        p = skip_ws(p, e);
        if (p >= e || *p++ != ':')
            return 0;
        p = skip_ws(p, e);
        if (!(p = plain_string(p, e, &v, &vn)))
            return 0;
        int f = 0;
        while (f < 3 && !(kn == K[f].len && !memcmp(key, K[f].name, kn)))
            f++;
        if (f == 3 || (seen & (1u << f)))
            return 0;
        seen |= 1u << f;
        if (f == 0) {
            out->pass = v;
            out->pass_len = vn;
        } else if (f == 1) {
            out->payload = v;
            out->payload_len = vn;
        } else {
            out->sig = v;
            out->sig_len = vn;
        }
        p = skip_ws(p, e);
        if (p >= e || *p++ != (k < 2 ? ',' : '}'))
            return 0;
    }
    return skip_ws(p, e) == e;
}

int coord_report_envelope(const void *buf, size_t len, struct coord_report_env *out)
{
    if (envelope(buf, len, out))
        return 1;
    memset(out, 0, sizeof *out);
    return 0;
}
