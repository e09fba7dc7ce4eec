/* Progress and round records and the collaboration estimate (see collab.h). */
#include "agent/dp/collab.h"
#include "cm_err.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEP (1LL << 50)
#define MAX_SAMPLES 1e15
#define MAX_SPS 1e9

int collab_progress_encode(const struct collab_progress *p, char *out, size_t cap)
{
    int n = snprintf(out, cap,
                     "{\"v\":1,\"step\":%lld,\"samples\":%.0f,\"sps\":%.3f,\"t\":%lld,\"addr\":\"%s\","
                     "\"client\":%d,\"aux\":%d,\"st\":\"%s\",\"h\":\"%s\",\"pl\":%.0f,\"ps\":%lld}",
                     (long long)p->step, p->samples, p->sps, (long long)p->t_ms, p->addr,
                     p->client ? 1 : 0, p->aux ? 1 : 0, p->st, p->hash, p->pledged,
                     (long long)(p->pstep == p->step - 1 ? p->step - 1 : p->step));
    return n > 0 && (size_t)n < cap ? CM_OK : CM_ETOOBIG;
}

int collab_announce_encode(const struct collab_announce *a, char *out, size_t cap)
{
    char on[32] = "";
    if (a->on > 0)
        snprintf(on, sizeof on, ",\"on\":%d", a->on);
    int n = snprintf(out, cap,
                     "{\"v\":1,\"w\":%.0f,\"addr\":\"%s\",\"agg\":%d,\"sends\":%d,\"t\":%lld,"
                     "\"sv\":%lld%s%s%s}",
                     a->weight, a->addr, a->agg ? 1 : 0, a->sends ? 1 : 0, (long long)a->t_ms,
                     (long long)a->sched_version, a->pull_only && !a->sends ? ",\"po\":1" : "",
                     a->relayed && a->addr[0] ? ",\"rl\":1" : "", on);
    return n > 0 && (size_t)n < cap ? CM_OK : CM_ETOOBIG;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

int collab_outcome_encode(const struct collab_outcome *o, char *out, size_t cap)
{
    char rid[33];
    hex(o->rid, sizeof o->rid, rid);
    int n = snprintf(out, cap, "{\"v\":1,\"rid\":\"%s\",\"mask\":\"%016llx\",\"t\":%lld}", rid,
                     (unsigned long long)o->mask, (long long)o->t_ms);
    return n > 0 && (size_t)n < cap ? CM_OK : CM_ETOOBIG;
}

static json_t *load(const void *buf, size_t len)
{
    if (len == 0 || len > COLLAB_RECORD_MAX)
        return NULL;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j) || json_integer_value(json_object_get(j, "v")) != 1 ||
        !json_is_integer(json_object_get(j, "v"))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int num(json_t *j, const char *k, double lo, double hi, double *out)
{
    json_t *v = json_object_get(j, k);
    if (!json_is_number(v))
        return 0;
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return 0;
    *out = x;
    return 1;
}

static int flag(json_t *j, const char *k, int *out)
{
    json_t *v = json_object_get(j, k);
    if (!json_is_integer(v) || (json_integer_value(v) != 0 && json_integer_value(v) != 1))
        return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

/* "ip:port" or "" (client mode): printable, no quotes, bounded. */
static int addr(json_t *j, const char *key, char out[COLLAB_ADDR_MAX])
{
    json_t *v = json_object_get(j, key);
    if (!json_is_string(v) || json_string_length(v) >= COLLAB_ADDR_MAX)
        return 0;
    const char *s = json_string_value(v);
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F') ||
              *c == '.' || *c == ':' || *c == '[' || *c == ']'))
            return 0;
    snprintf(out, COLLAB_ADDR_MAX, "%s", s);
    return 1;
}

/* Lowercase hex of exactly `digits` digits (or "" when allow_empty) into
 * out (digits + 1 bytes). */
static int hexstr(json_t *j, const char *k, size_t digits, int allow_empty, char *out)
{
    json_t *v = json_object_get(j, k);
    if (!json_is_string(v))
        return 0;
    size_t len = json_string_length(v);
    if (!(len == digits || (allow_empty && len == 0)))
        return 0;
    const char *s = json_string_value(v);
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    memcpy(out, s, len + 1);
    return 1;
}

static uint8_t nib(char c)
{
    return (uint8_t)(c <= '9' ? c - '0' : c - 'a' + 10);
}

static int only_keys(json_t *j, const char *const *keys, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        size_t i = 0;
        while (i < n && strcmp(keys[i], k))
            i++;
        if (i == n)
            return 0;
    }
    return 1;
}

int collab_progress_parse(const void *buf, size_t len, struct collab_progress *out)
{
    static const char *const keys[] = {"v",    "step",   "samples", "sps", "t", "addr",
                                       "client", "aux", "st",      "h",   "pl", "ps"};
    memset(out, 0, sizeof *out);
    json_t *j = load(buf, len);
    if (!j)
        return CM_EPARSE;
    double step = 0, t = 0;
    double ps = -1;
    int ok = only_keys(j, keys, 12) && num(j, "step", 0, (double)MAX_STEP, &step) &&
             step == floor(step) && num(j, "samples", 0, MAX_SAMPLES, &out->samples) &&
             num(j, "sps", 0, MAX_SPS, &out->sps) && num(j, "t", 0, 9e15, &t) &&
             addr(j, "addr", out->addr) && flag(j, "client", &out->client) &&
             flag(j, "aux", &out->aux) &&
             (!json_object_get(j, "st") || addr(j, "st", out->st)) &&
             (!json_object_get(j, "h") || hexstr(j, "h", COLLAB_HASH_HEX, 1, out->hash)) &&
             (!json_object_get(j, "pl") || num(j, "pl", 0, MAX_SAMPLES, &out->pledged)) &&
             (!json_object_get(j, "ps") || (num(j, "ps", 0, (double)MAX_STEP, &ps) && ps == floor(ps)));
    json_decref(j);
    if (!ok)
        return CM_EPARSE;
    out->step = (int64_t)step;
    out->t_ms = (int64_t)t;
    /* a parameter step is the step, or one behind it (a round averaging) */
    out->pstep = ps < 0 ? out->step : (int64_t)ps;
    if (out->pstep > out->step || out->pstep < out->step - 1)
        return CM_EPARSE;
    return CM_OK;
}

int collab_announce_parse(const void *buf, size_t len, struct collab_announce *out)
{
    static const char *const keys[] = {"v", "w", "addr", "agg", "sends", "t", "sv", "po", "rl", "on"};
    memset(out, 0, sizeof *out);
    json_t *j = load(buf, len);
    if (!j)
        return CM_EPARSE;
    double t = 0, sv = 0, on = 0;
    int ok = only_keys(j, keys, 10) && num(j, "w", 0, MAX_SAMPLES, &out->weight) &&
             addr(j, "addr", out->addr) && flag(j, "agg", &out->agg) &&
             flag(j, "sends", &out->sends) && num(j, "t", 0, 9e15, &t) &&
             (!json_object_get(j, "sv") || (num(j, "sv", 0, (double)MAX_STEP, &sv) && sv == floor(sv))) &&
             (!json_object_get(j, "po") || flag(j, "po", &out->pull_only)) &&
             (!json_object_get(j, "rl") || flag(j, "rl", &out->relayed)) &&
             (!json_object_get(j, "on") || (num(j, "on", 1, COLLAB_ON_MAX, &on) && on == floor(on)));
    out->t_ms = (int64_t)t;
    out->sched_version = (int64_t)sv;
    out->on = (int)on;
    json_decref(j);
    /* an aggregator needs an address; a sender needs a weight; a pull-only
       member sends nothing */
    if (!ok || (out->agg && !out->addr[0]) || (out->sends && out->weight <= 0) ||
        (out->pull_only && (out->sends || out->weight != 0)) || (out->relayed && !out->addr[0]))
        return CM_EPARSE;
    return CM_OK;
}

int collab_outcome_parse(const void *buf, size_t len, struct collab_outcome *out)
{
    static const char *const keys[] = {"v", "rid", "mask", "t"};
    memset(out, 0, sizeof *out);
    json_t *j = load(buf, len);
    if (!j)
        return CM_EPARSE;
    char rid[33], mask[17];
    double t = 0;
    int ok = only_keys(j, keys, 4) && hexstr(j, "rid", 32, 0, rid) && hexstr(j, "mask", 16, 0, mask) &&
             num(j, "t", 0, 9e15, &t);
    json_decref(j);
    if (!ok)
        return CM_EPARSE;
    for (size_t i = 0; i < sizeof out->rid; i++)
        out->rid[i] = (uint8_t)(nib(rid[2 * i]) << 4 | nib(rid[2 * i + 1]));
    for (int i = 0; i < 16; i++)
        out->mask = out->mask << 4 | nib(mask[i]);
    out->t_ms = (int64_t)t;
    return CM_OK;
}

size_t collab_outcome_final(const struct collab_outcome *o, size_t n, const uint8_t rid[16],
                            const uint8_t (*members)[CM_ED25519_PUB_LEN], size_t n_members,
                            int64_t window_ms, int64_t margin_ms, int64_t now_ms, uint64_t *mask,
                            int *decided)
{
    /* the first valid outcome per member, in member order */
    const struct collab_outcome *pick[64] = {0};
    size_t seen = 0;
    int64_t first = INT64_MAX;
    if (n_members > 64)
        n_members = 64;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(o[i].rid, rid, sizeof o[i].rid))
            continue;
        for (size_t m = 0; m < n_members; m++)
            if (!memcmp(o[i].pub, members[m], CM_ED25519_PUB_LEN)) {
                if (!pick[m]) {
                    pick[m] = &o[i];
                    seen++;
                    if (o[i].t_ms < first)
                        first = o[i].t_ms;
                }
                break;
            }
    }
    *mask = 0;
    *decided = 0;
    if (!seen)
        return 0;
    int64_t close = first + window_ms;
    uint64_t m_and = ~(uint64_t)0;
    size_t counted = 0;
    for (size_t m = 0; m < n_members; m++)
        if (pick[m] && pick[m]->t_ms <= close) {
            m_and &= pick[m]->mask;
            counted++;
        }
    *mask = m_and;
    *decided = seen == n_members || now_ms >= close + margin_ms;
    return counted;
}

void collab_estimate(const struct collab_progress *p, size_t n, int64_t step, int64_t now_ms,
                     int64_t fresh_ms, double target, struct collab_view *out)
{
    memset(out, 0, sizeof *out);
    out->max_step = step;
    out->max_pstep = -1;
    for (size_t i = 0; i < n; i++) {
        /* tolerate clocks up to fresh_ms ahead of ours */
        if (p[i].t_ms < now_ms - fresh_ms || p[i].t_ms > now_ms + fresh_ms)
            continue;
        out->peers++;
        if (p[i].step > out->max_step)
            out->max_step = p[i].step;
        if (!p[i].aux && p[i].hash[0] && p[i].pstep > out->max_pstep)
            out->max_pstep = p[i].pstep;
        if (p[i].step != step || p[i].aux)
            continue;
        out->at_step++;
        out->samples += p[i].samples;
        out->pledged += p[i].pledged;
        out->sps += p[i].sps;
    }
    if (out->samples >= target)
        out->eta_s = 0;
    else
        out->eta_s = out->sps > 0 ? (target - out->samples) / out->sps : INFINITY;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

size_t collab_round_members(struct collab_announce *a, size_t n, int64_t window_ms, int64_t mine_ms,
                            int64_t *close_ms)
{
    *close_ms = 0;
    if (n == 0)
        return 0;
    int64_t *t = malloc(n * sizeof *t);
    int64_t start;
    if (t) {
        for (size_t i = 0; i < n; i++)
            t[i] = a[i].t_ms;
        qsort(t, n, sizeof *t, cmp_i64);
        /* windows chain: each opens with the first announcement after the
           previous one closed; ours is the one our announcement falls in */
        start = t[0];
        for (size_t i = 1; i < n && t[i] <= mine_ms; i++)
            if (t[i] > start + window_ms)
                start = t[i];
        free(t);
    } else {
        start = a[0].t_ms; /* out of memory: the first window only */
        for (size_t i = 1; i < n; i++)
            if (a[i].t_ms < start)
                start = a[i].t_ms;
    }
    *close_ms = start + window_ms;
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i].t_ms >= start && a[i].t_ms <= *close_ms)
            a[w++] = a[i];
    return w;
}

static int by_time(const void *x, const void *y)
{
    const struct collab_announce *a = *(const struct collab_announce *const *)x;
    const struct collab_announce *b = *(const struct collab_announce *const *)y;
    return (a->t_ms > b->t_ms) - (a->t_ms < b->t_ms);
}

int collab_round_going(const struct collab_announce *a, size_t n, int64_t window_ms, int64_t settle_ms,
                       int64_t now_ms, size_t on)
{
    if (n == 0)
        return 0;
    const struct collab_announce **s = malloc(n * sizeof *s);
    if (!s)
        return 0;
    for (size_t i = 0; i < n; i++)
        s[i] = &a[i];
    qsort(s, n, sizeof *s, by_time);
    int going = 0;
    for (size_t i = 0; i < n && !going;) {
        int64_t close = s[i]->t_ms + window_ms;
        size_t senders = 0, said = 0;
        for (; i < n && s[i]->t_ms <= close; i++) {
            senders += s[i]->sends != 0;
            said = s[i]->on > 0 && (size_t)s[i]->on > said ? (size_t)s[i]->on : said;
        }
        /* the members decide from what they announced (collab_round_on) */
        going = now_ms >= close + settle_ms && 2 * senders > (said ? said : on);
    }
    free(s);
    return going;
}

size_t collab_round_on(const struct collab_announce *a, size_t n)
{
    size_t on = 0;
    for (size_t i = 0; i < n; i++)
        on = a[i].on > 0 && (size_t)a[i].on > on ? (size_t)a[i].on : on;
    return on;
}

static int by_pub(const void *a, const void *b)
{
    return memcmp(((const struct collab_announce *)a)->pub, ((const struct collab_announce *)b)->pub,
                  CM_ED25519_PUB_LEN);
}

size_t collab_canonical(struct collab_announce *a, size_t n)
{
    if (n < 2)
        return n;
    /* keep the first of duplicates: stable order needs an index tiebreak */
    qsort(a, n, sizeof *a, by_pub);
    size_t w = 1;
    for (size_t i = 1; i < n; i++)
        if (memcmp(a[i].pub, a[w - 1].pub, CM_ED25519_PUB_LEN) != 0)
            a[w++] = a[i];
    return w;
}

size_t collab_checkpoint_uploader(const struct collab_announce *a, size_t n, int64_t step)
{
    size_t best = n;
    uint8_t best_h[CM_SHA256_LEN];
    for (size_t i = 0; i < n; i++) {
        if (!a[i].sends)
            continue;
        uint8_t buf[8 + CM_ED25519_PUB_LEN], h[CM_SHA256_LEN];
        for (int b = 0; b < 8; b++)
            buf[b] = (uint8_t)((uint64_t)step >> (56 - 8 * b));
        memcpy(buf + 8, a[i].pub, CM_ED25519_PUB_LEN);
        cm_sha256(buf, sizeof buf, h);
        if (best == n || memcmp(h, best_h, sizeof h) < 0) {
            best = i;
            memcpy(best_h, h, sizeof h);
        }
    }
    return best;
}

void collab_hold_init(struct collab_hold *h, double cap_s)
{
    h->tokens = cap_s;
    h->last = -1;
    h->waiting = 0;
}

int collab_hold_update(struct collab_hold *h, int behind, double now_s, double cap_s, double refill)
{
    double dt = h->last < 0 || now_s < h->last ? 0 : now_s - h->last;
    h->last = now_s;
    /* the time since the last update went as that update decided; a wait
       is polled every few ms, so more than a second since a "wait" means
       the caller went elsewhere (into a round) and waited only a poll */
    if (h->waiting)
        h->tokens -= dt < 1.0 ? dt : 1.0;
    else
        h->tokens += dt * refill;
    if (h->tokens > cap_s)
        h->tokens = cap_s;
    /* below 0 is a debt (a wait overran the bucket), repaid before the
       next wait: clamping it would give away the overrun each time */
    h->waiting = behind && h->tokens > 0;
    return h->waiting;
}
