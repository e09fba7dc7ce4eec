/* The pure, strict parser of a contribution report's payload
 * (docs/accounting.md, "Reports"; docs/protocol.md, "Contribution reports").
 * Network input: every field typed and bounded, unknown fields refused,
 * numbers finite and in range, member and expert server keys distinct. No I/O, no globals, so
 * tests/fuzz/fuzz_report.c drives it alone. */
#include "coordinator/api_contrib.h"
#include "cm_err.h"
#include "cm_json.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
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

/* The parameter hash is compared as bytes, but written as the agents write
 * it (lowercase), so one hash has one spelling in the signed payload. */
static int hex_lower(const char *s)
{
    for (; *s; s++)
        if (*s >= 'A' && *s <= 'F')
            return 0;
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

/* "experts": {server key: samples}, like "members" (the JSON parser has
 * already refused duplicate keys). */
static int parse_experts(const json_t *m, struct coord_report *r, char *err, size_t cap)
{
    if (json_object_size(m) > COORD_REPORT_EXPERTS_MAX)
        return fail(err, cap, "field 'experts': at most %d entries", COORD_REPORT_EXPERTS_MAX);
    const char *k;
    const json_t *v;
    r->n_experts = 0;
    json_object_foreach((json_t *)m, k, v)
    {
        struct coord_report_expert *e = &r->experts[r->n_experts];
        double x = json_number_value(v);
        if (!key_decode(k, e->pub))
            return fail(err, cap, "field 'experts': keys are base64url 32-byte server public keys");
        if (!json_is_number(v) || !isfinite(x) || x < 0 || x > COORD_REPORT_SAMPLES_MAX)
            return fail(err, cap, "field 'experts': sample counts are numbers from 0 to %g",
                        COORD_REPORT_SAMPLES_MAX);
        e->samples = x;
        r->n_experts++;
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

int coord_report_parse_json(const void *buf, size_t len, struct coord_report *out, char *err,
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
        {"sop_loss", CM_J_NUMBER, 0, 1, 0},
        {"mlm_accuracy", CM_J_NUMBER, 0, 1, 0},
        {"sps", CM_J_NUMBER, 1, 1, 0},
        {"round_ms", CM_J_NUMBER, 1, 1, 0},
        {"parts", CM_J_INT, 1, 0, 4096},
        {"parts_averaged", CM_J_INT, 1, 0, 4096},
        {"params", CM_J_STRING, 0, 64, 64},
        {"members", CM_J_OBJECT, 1, 1, 0},
        {"excluded", CM_J_ARRAY, 1, 1, 0},
        {"t", CM_J_INT, 1, 0, (int64_t)1 << 40},
        {"experts", CM_J_OBJECT, 0, 1, 0},
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
    const json_t *params = json_object_get(j, "params");
    if (params && (cm_hex_decode(json_string_value(params), 64, out->params, sizeof out->params, &n) !=
                       CM_OK || n != 32 || !hex_lower(json_string_value(params)))) {
        rc = fail(err, cap, "payload: 'params' is 64 lowercase hex digits");
        goto out;
    }
    out->has_params = params != NULL;
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
    if (json_object_get(j, "sop_loss")) {
        if ((rc = number(j, "sop_loss", 0, 1e6, &out->sop_loss, err, cap)))
            goto out;
        out->has_sop_loss = 1;
    }
    if (json_object_get(j, "mlm_accuracy")) {
        if ((rc = number(j, "mlm_accuracy", 0, 1, &out->mlm_accuracy, err, cap)))
            goto out;
        out->has_mlm_accuracy = 1;
    }
    if ((rc = parse_members(json_object_get(j, "members"), out, err, cap)) ||
        (rc = parse_excluded(json_object_get(j, "excluded"), out, err, cap)))
        goto out;
    if (json_object_get(j, "experts") &&
        (rc = parse_experts(json_object_get(j, "experts"), out, err, cap)))
        goto out;
out:
    json_decref(j);
    return rc;
}

/* --- the payload in the agents' form, without a generic JSON parse --------
 * Accepts only what the generic parser above accepts, with the same result:
 * every value well-formed, within bounds and valid, strings of printable
 * ASCII without escapes, no duplicate keys, no nulls or booleans. Anything
 * else, including anything invalid, is left to the generic parser (which
 * words the refusal). The generic parse of a 1 KiB payload cost ~9% of the
 * coordinator's CPU per report; tests/fuzz/fuzz_report_fast.c checks that
 * whatever this accepts, the generic parser reads identically. */

struct cur {
    const char *p, *e;
};

static void ws(struct cur *c)
{
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int lit(struct cur *c, char ch)
{
    ws(c);
    if (c->p >= c->e || *c->p != ch)
        return 0;
    c->p++;
    return 1;
}

/* A string of printable ASCII without escapes, copied NUL-terminated into
 * out (cap bytes; longer: not this form). */
static int str(struct cur *c, char *out, size_t cap, size_t *n)
{
    ws(c);
    if (c->p >= c->e || *c->p != '"')
        return 0;
    const char *b = ++c->p;
    while (c->p < c->e && *c->p != '"') {
        unsigned char ch = (unsigned char)*c->p;
        if (ch < 0x20 || ch > 0x7e || ch == '\\')
            return 0;
        c->p++;
    }
    if (c->p >= c->e || (size_t)(c->p - b) >= cap)
        return 0;
    *n = (size_t)(c->p - b);
    memcpy(out, b, *n);
    out[*n] = '\0';
    c->p++;
    return 1;
}

/* A JSON number (RFC 8259 grammar, as jansson reads it): *is_int when it
 * has neither fraction nor exponent (jansson's integer), its value in *d and
 * *i. Out of range (jansson refuses it): not this form. */
static int num(struct cur *c, double *d, long long *i, int *is_int)
{
    ws(c);
    const char *b = c->p, *q = c->p;
    if (q < c->e && *q == '-')
        q++;
    if (q >= c->e || *q < '0' || *q > '9')
        return 0;
    if (*q == '0')
        q++;
    else
        while (q < c->e && *q >= '0' && *q <= '9')
            q++;
    *is_int = 1;
    if (q < c->e && *q == '.') {
        q++;
        if (q >= c->e || *q < '0' || *q > '9')
            return 0;
        while (q < c->e && *q >= '0' && *q <= '9')
            q++;
        *is_int = 0;
    }
    if (q < c->e && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < c->e && (*q == '+' || *q == '-'))
            q++;
        if (q >= c->e || *q < '0' || *q > '9')
            return 0;
        while (q < c->e && *q >= '0' && *q <= '9')
            q++;
        *is_int = 0;
    }
    char t[64];
    if ((size_t)(q - b) >= sizeof t)
        return 0;
    memcpy(t, b, (size_t)(q - b));
    t[q - b] = '\0';
    errno = 0;
    if (*is_int) {
        *i = strtoll(t, NULL, 10);
        *d = (double)*i;
    } else {
        *d = strtod(t, NULL);
        *i = 0;
    }
    if (errno == ERANGE)
        return 0;
    c->p = q;
    return 1;
}

enum {
    K_FORMAT, K_RUN, K_PEER, K_STEP, K_GROUP, K_ROUND, K_SAMPLES, K_COMPUTE, K_LOSS, K_SPS,
    K_ROUND_MS, K_PARTS, K_PA, K_MEMBERS, K_EXCLUDED, K_T, K_PARAMS, K_EXPERTS, K_SOP_LOSS,
    K_MLM_ACC, K_COUNT
};
static const char *const KEYS[K_COUNT] = {
    "format", "run", "peer", "step", "group", "round", "samples", "compute_s",
    "loss", "sps", "round_ms", "parts", "parts_averaged", "members", "excluded", "t", "params",
    "experts", "sop_loss", "mlm_accuracy"};
_Static_assert(K_COUNT <= 32, "the fields seen are bits of an unsigned");
/* the fields a report may leave out */
#define K_OPTIONAL ((1u << K_LOSS) | (1u << K_PARAMS) | (1u << K_EXPERTS) | (1u << K_SOP_LOSS) | \
                    (1u << K_MLM_ACC))

static int in(double x, double lo, double hi)
{
    return isfinite(x) && x >= lo && x <= hi;
}

/* {key: number, ...} with distinct base64url keys and values in [0, 1e9]:
 * "members" and "experts". */
static int fast_samples(struct cur *c, size_t max, struct coord_report_member *out, size_t *n_out)
{
    char keys[COORD_REPORT_MEMBERS_MAX][44];
    size_t n = 0;
    *n_out = 0;
    if (!lit(c, '{'))
        return 0;
    ws(c);
    if (c->p < c->e && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        if (n == max)
            return 0;
        char *k = keys[n];
        size_t kn;
        double d;
        long long i;
        int is_int;
        if (!str(c, k, sizeof keys[0], &kn) || !lit(c, ':') || !num(c, &d, &i, &is_int))
            return 0;
        for (size_t j = 0; j < n; j++)
            if (!strcmp(keys[j], k))
                return 0; /* a duplicate key: the generic parser refuses it */
        struct coord_report_member *m = &out[n];
        if (!key_decode(k, m->pub) || !in(d, 0, COORD_REPORT_SAMPLES_MAX))
            return 0;
        m->samples = d;
        *n_out = ++n;
        if (lit(c, '}'))
            return 1;
        if (!lit(c, ','))
            return 0;
    }
}

static int fast_members(struct cur *c, struct coord_report *r)
{
    return fast_samples(c, COORD_REPORT_MEMBERS_MAX, r->members, &r->n_members);
}

static int fast_experts(struct cur *c, struct coord_report *r)
{
    _Static_assert(COORD_REPORT_EXPERTS_MAX <= COORD_REPORT_MEMBERS_MAX,
                   "fast_samples holds at most COORD_REPORT_MEMBERS_MAX keys");
    struct coord_report_member m[COORD_REPORT_EXPERTS_MAX];
    size_t n = 0;
    if (!fast_samples(c, COORD_REPORT_EXPERTS_MAX, m, &n))
        return 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(r->experts[i].pub, m[i].pub, sizeof m[i].pub);
        r->experts[i].samples = m[i].samples;
    }
    r->n_experts = n;
    return 1;
}

static int fast_excluded(struct cur *c, struct coord_report *r)
{
    if (!lit(c, '['))
        return 0;
    ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 1;
    }
    for (;;) {
        if (r->n_excluded == COORD_REPORT_MEMBERS_MAX || !lit(c, '{'))
            return 0;
        char peer[44] = "", reason[COORD_REPORT_REASON_MAX + 1] = "";
        int have = 0;
        for (int f = 0; f < 2; f++) {
            char k[8], v[44];
            size_t kn, vn;
            if (f && !lit(c, ','))
                return 0;
            if (!str(c, k, sizeof k, &kn) || !lit(c, ':') || !str(c, v, sizeof v, &vn))
                return 0;
            int which = !strcmp(k, "peer") ? 1 : !strcmp(k, "reason") ? 2 : 0;
            if (!which || (have & which))
                return 0;
            have |= which;
            if (which == 1) {
                memcpy(peer, v, vn + 1);
            } else {
                if (vn > COORD_REPORT_REASON_MAX)
                    return 0;
                memcpy(reason, v, vn + 1);
            }
        }
        if (!lit(c, '}'))
            return 0;
        struct coord_report_excl *x = &r->excluded[r->n_excluded];
        if (!key_decode(peer, x->pub) || !reason_valid(reason))
            return 0;
        for (size_t j = 0; j < r->n_excluded; j++)
            if (!memcmp(r->excluded[j].pub, x->pub, CM_ED25519_PUB_LEN))
                return 0;
        memcpy(x->reason, reason, strlen(reason) + 1);
        r->n_excluded++;
        if (lit(c, ']'))
            return 1;
        if (!lit(c, ','))
            return 0;
    }
}

int coord_report_parse_fast(const void *buf, size_t len, struct coord_report *r)
{
    memset(r, 0, sizeof *r);
    if (!buf || len == 0 || len > COORD_REPORT_PAYLOAD_MAX)
        return 0;
    struct cur c = {buf, (const char *)buf + len};
    unsigned seen = 0;
    double num_v[K_COUNT] = {0};
    long long int_v[K_COUNT] = {0};
    if (!lit(&c, '{'))
        return 0;
    for (;;) {
        char key[16], sv[CM_NAME_MAX + 1 > 65 ? CM_NAME_MAX + 1 : 65];
        size_t kn, sn;
        if (!str(&c, key, sizeof key, &kn) || !lit(&c, ':'))
            return 0;
        int k = 0;
        while (k < K_COUNT && strcmp(KEYS[k], key))
            k++;
        if (k == K_COUNT || (seen & (1u << k)))
            return 0;
        seen |= 1u << k;
        int is_int;
        switch (k) {
        case K_FORMAT:
            if (!str(&c, sv, sizeof sv, &sn) || strcmp(sv, COORD_REPORT_FORMAT))
                return 0;
            break;
        case K_RUN:
            if (!str(&c, sv, sizeof sv, &sn) || sn > CM_NAME_MAX || !cm_name_valid(sv))
                return 0;
            memcpy(r->run, sv, sn + 1);
            break;
        case K_PEER:
            if (!str(&c, sv, sizeof sv, &sn) || !key_decode(sv, r->peer))
                return 0;
            break;
        case K_GROUP:
            if (!str(&c, sv, sizeof sv, &sn) || !group_valid(sv))
                return 0;
            memcpy(r->group, sv, sn + 1);
            break;
        case K_ROUND: {
            size_t n = 0;
            if (!str(&c, sv, sizeof sv, &sn) || sn != 64 ||
                cm_hex_decode(sv, 64, r->round, sizeof r->round, &n) != CM_OK || n != 32)
                return 0;
            break;
        }
        case K_PARAMS: {
            size_t n = 0;
            if (!str(&c, sv, sizeof sv, &sn) || sn != 64 || !hex_lower(sv) ||
                cm_hex_decode(sv, 64, r->params, sizeof r->params, &n) != CM_OK || n != 32)
                return 0;
            r->has_params = 1;
            break;
        }
        case K_MEMBERS:
            if (!fast_members(&c, r))
                return 0;
            break;
        case K_EXCLUDED:
            if (!fast_excluded(&c, r))
                return 0;
            break;
        case K_EXPERTS:
            if (!fast_experts(&c, r))
                return 0;
            break;
        case K_STEP:
        case K_PARTS:
        case K_PA:
        case K_T:
            if (!num(&c, &num_v[k], &int_v[k], &is_int) || !is_int)
                return 0;
            break;
        default: /* the plain numbers */
            if (!num(&c, &num_v[k], &int_v[k], &is_int))
                return 0;
            break;
        }
        if (lit(&c, '}'))
            break;
        if (!lit(&c, ','))
            return 0;
    }
    ws(&c);
    if (c.p != c.e || (seen | K_OPTIONAL) != (1u << K_COUNT) - 1)
        return 0;
    if (int_v[K_STEP] < 0 || int_v[K_STEP] > (1LL << 53) || int_v[K_PARTS] < 0 ||
        int_v[K_PARTS] > 4096 || int_v[K_PA] < 0 || int_v[K_PA] > 4096 ||
        int_v[K_PA] > int_v[K_PARTS] || int_v[K_T] < 0 || int_v[K_T] > (1LL << 40))
        return 0;
    if (!in(num_v[K_SAMPLES], 0, COORD_REPORT_SAMPLES_MAX) || !in(num_v[K_COMPUTE], 0, 86400) ||
        !in(num_v[K_SPS], 0, 1e9) || !in(num_v[K_ROUND_MS], 0, 3.6e6))
        return 0;
    if ((seen & (1u << K_LOSS)) && !in(num_v[K_LOSS], 0, 1e6))
        return 0;
    if ((seen & (1u << K_SOP_LOSS)) && !in(num_v[K_SOP_LOSS], 0, 1e6))
        return 0;
    if ((seen & (1u << K_MLM_ACC)) && !in(num_v[K_MLM_ACC], 0, 1))
        return 0;
    r->step = int_v[K_STEP];
    r->t = int_v[K_T];
    r->parts = (int)int_v[K_PARTS];
    r->parts_averaged = (int)int_v[K_PA];
    r->samples = num_v[K_SAMPLES];
    r->compute_s = num_v[K_COMPUTE];
    r->sps = num_v[K_SPS];
    r->round_ms = num_v[K_ROUND_MS];
    if (seen & (1u << K_LOSS)) {
        r->loss = num_v[K_LOSS];
        r->has_loss = 1;
    }
    if (seen & (1u << K_SOP_LOSS)) {
        r->sop_loss = num_v[K_SOP_LOSS];
        r->has_sop_loss = 1;
    }
    if (seen & (1u << K_MLM_ACC)) {
        r->mlm_accuracy = num_v[K_MLM_ACC];
        r->has_mlm_accuracy = 1;
    }
    return 1;
}

int coord_report_parse(const void *buf, size_t len, struct coord_report *out, char *err,
                       size_t cap)
{
    if (coord_report_parse_fast(buf, len, out)) {
        if (err && cap)
            err[0] = '\0';
        return CM_OK;
    }
    return coord_report_parse_json(buf, len, out, err, cap);
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
