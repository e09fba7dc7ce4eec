/* Following adaptive-averaging schedules on the agent (seed
 * 000_02cc6b5d62a616fc.txt, §3.2; docs/schedules.md): signed schedules fetched,
 * verified and cached, and the plan of one averaging round. The API and
 * its rules are in sched_follow.h.
 *
 * Trust: a schedule is believed only after its Ed25519 signature over the
 * exact payload bytes verified with one of the coordinator keys the agent
 * got with its pass (docs/protocol.md, "Schedules"); the unsigned
 * "schedule" field of the answer is never read. The cache file holds the
 * same payload and signature, so it is verified again when loaded. */
#include "agent/dp/sched_follow.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_crypto.h"
#include "cm_err.h"

struct held {
    struct sched_schedule s;
    char *payload; /* the signed bytes, NUL-terminated (owned) */
    size_t plen;
    uint8_t sig[CM_ED25519_SIG_LEN];
};

struct dp_sched {
    char *dir; /* NULL: no cache */
    char run[SCHED_RUN_MAX + 1];
    uint8_t (*keys)[CM_ED25519_PUB_LEN];
    size_t n_keys;
    struct held v[DP_SCHED_KEEP]; /* newest version first */
    size_t nv;
    char last_why[160]; /* the last failure said on stderr, to say it once */
};

/* ---- holding schedules ---- */

static void held_free(struct held *h)
{
    sched_schedule_cleanup(&h->s);
    free(h->payload);
    memset(h, 0, sizeof *h);
}

static void say_once(struct dp_sched *js, const char *fmt, const char *a, const char *b)
{
    char why[sizeof js->last_why];
    snprintf(why, sizeof why, fmt, a, b);
    if (strcmp(why, js->last_why) != 0) {
        fprintf(stderr, "warning: schedule: %s\n", why);
        snprintf(js->last_why, sizeof js->last_why, "%s", why);
    }
}

/* Verifies payload + signature with one of the keys, then decodes. */
static int verify_decode(const struct dp_sched *js, const char *payload, size_t plen,
                         const uint8_t sig[CM_ED25519_SIG_LEN], struct sched_schedule *s,
                         char *err, size_t cap)
{
    int ok = 0;
    for (size_t k = 0; k < js->n_keys && !ok; k++)
        ok = sched_verify(js->keys[k], payload, plen, sig) == CM_OK;
    if (!ok) {
        snprintf(err, cap, "the signature does not verify with any coordinator key");
        return CM_EBADSIG;
    }
    int rc = sched_schedule_decode(payload, plen, s, err, cap);
    if (rc != CM_OK)
        return CM_EPARSE;
    if (strcmp(s->run, js->run) != 0) {
        snprintf(err, cap, "signed for run '%s', not '%s'", s->run, js->run);
        sched_schedule_cleanup(s);
        return CM_EINVAL;
    }
    if (s->version <= 0) {
        snprintf(err, cap, "version %lld", (long long)s->version);
        sched_schedule_cleanup(s);
        return CM_EPARSE;
    }
    return CM_OK;
}

/* Takes ownership of h (moved in). Keeps the DP_SCHED_KEEP newest. */
static void hold(struct dp_sched *js, struct held *h)
{
    size_t at = 0;
    while (at < js->nv && js->v[at].s.version > h->s.version)
        at++;
    if (at == DP_SCHED_KEEP) { /* older than everything held */
        held_free(h);
        return;
    }
    if (js->nv == DP_SCHED_KEEP)
        held_free(&js->v[--js->nv]);
    memmove(&js->v[at + 1], &js->v[at], (js->nv - at) * sizeof js->v[0]);
    js->v[at] = *h;
    js->nv++;
    memset(h, 0, sizeof *h);
}

static const struct held *find(const struct dp_sched *js, int64_t version)
{
    for (size_t i = 0; i < js->nv; i++)
        if (js->v[i].s.version == version)
            return &js->v[i];
    return NULL;
}

static void cache_name(const struct dp_sched *js, char *out, size_t cap)
{
    snprintf(out, cap, DP_SCHED_FILE_PREFIX "%s.json", js->run);
}

static void persist(struct dp_sched *js)
{
    if (!js->dir)
        return;
    json_t *a = json_array();
    for (size_t i = 0; a && i < js->nv; i++) {
        char *p64 = malloc(cm_b64url_encoded_len(js->v[i].plen) + 1), s64[128];
        if (!p64)
            continue;
        cm_b64url_encode(js->v[i].payload, js->v[i].plen, p64);
        cm_b64url_encode(js->v[i].sig, CM_ED25519_SIG_LEN, s64);
        json_array_append_new(a, json_pack("{s:I, s:s, s:s}", "version",
                                           (json_int_t)js->v[i].s.version, "payload", p64,
                                           "signature", s64));
        free(p64);
    }
    json_t *doc = a ? json_pack("{s:s, s:o}", "run", js->run, "schedules", a) : NULL;
    char name[SCHED_RUN_MAX + 32];
    cache_name(js, name, sizeof name);
    if (!doc || agent_state_write(js->dir, name, doc) != CM_OK)
        say_once(js, "could not write the schedule cache %s/%s", js->dir, name);
    json_decref(doc);
}

/* payload/signature fields (base64url) of an answer or a cache entry. */
static int held_from_json(struct dp_sched *js, const json_t *o, struct held *h, char *err,
                          size_t cap)
{
    memset(h, 0, sizeof *h);
    const char *p64 = json_string_value(json_object_get(o, "payload"));
    const char *s64 = json_string_value(json_object_get(o, "signature"));
    if (!p64 || !s64) {
        snprintf(err, cap, "no payload or signature in the answer");
        return CM_EPARSE;
    }
    size_t l64 = strlen(p64), slen = 0;
    if (l64 > cm_b64url_encoded_len(SCHED_JSON_MAX)) {
        snprintf(err, cap, "payload larger than %u bytes", SCHED_JSON_MAX);
        return CM_ETOOBIG;
    }
    h->payload = malloc(l64 + 1);
    if (!h->payload)
        return CM_ENOMEM;
    if (cm_b64url_decode(p64, l64, (uint8_t *)h->payload, l64, &h->plen) != CM_OK ||
        cm_b64url_decode(s64, strlen(s64), h->sig, sizeof h->sig, &slen) != CM_OK ||
        slen != sizeof h->sig) {
        snprintf(err, cap, "payload or signature is not base64url");
        free(h->payload);
        h->payload = NULL;
        return CM_EPARSE;
    }
    h->payload[h->plen] = 0;
    int rc = verify_decode(js, h->payload, h->plen, h->sig, &h->s, err, cap);
    if (rc != CM_OK) {
        free(h->payload);
        h->payload = NULL;
    }
    return rc;
}

int dp_sched_accept(struct dp_sched *js, const json_t *answer, int64_t now, int check_window)
{
    if (!js || !json_is_object(answer))
        return CM_EINVAL;
    char err[160] = "";
    struct held h;
    int rc = held_from_json(js, answer, &h, err, sizeof err);
    if (rc != CM_OK) {
        say_once(js, "ignored a schedule: %s%s", err, "");
        return rc;
    }
    if (check_window && (h.s.valid_from > now + DP_SCHED_SKEW_S ||
                         h.s.valid_until <= now - DP_SCHED_SKEW_S)) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)h.s.version);
        say_once(js, "ignored schedule version %s: outside its validity window%s", v, "");
        held_free(&h);
        return CM_EEXPIRED;
    }
    if (find(js, h.s.version)) {
        held_free(&h); /* already held (the coordinator signs one payload per version) */
        return CM_OK;
    }
    hold(js, &h);
    persist(js);
    return CM_OK;
}

int dp_sched_open(const char *state_dir, const char *run,
                  const uint8_t (*coord_keys)[CM_ED25519_PUB_LEN], size_t n_keys,
                  struct dp_sched **out)
{
    if (!out || !run || !*run || strlen(run) > SCHED_RUN_MAX || strchr(run, '/') || run[0] == '.' ||
        (n_keys && !coord_keys))
        return CM_EINVAL;
    *out = NULL;
    struct dp_sched *js = calloc(1, sizeof *js);
    if (!js)
        return CM_ENOMEM;
    snprintf(js->run, sizeof js->run, "%s", run);
    if (n_keys) {
        js->keys = malloc(n_keys * sizeof *js->keys);
        if (!js->keys) {
            free(js);
            return CM_ENOMEM;
        }
        memcpy(js->keys, coord_keys, n_keys * sizeof *js->keys);
        js->n_keys = n_keys;
    }
    if (state_dir && !(js->dir = strdup(state_dir))) {
        dp_sched_close(js);
        return CM_ENOMEM;
    }
    if (js->dir) {
        char name[SCHED_RUN_MAX + 32];
        cache_name(js, name, sizeof name);
        json_t *doc = agent_state_read(js->dir, name);
        size_t i;
        json_t *e;
        int dropped = 0;
        json_array_foreach(json_object_get(doc, "schedules"), i, e) {
            char err[160];
            struct held h;
            if (held_from_json(js, e, &h, err, sizeof err) != CM_OK) {
                dropped++; /* e.g. signed by a key this pass no longer lists */
                continue;
            }
            if (find(js, h.s.version))
                held_free(&h);
            else
                hold(js, &h);
        }
        if (dropped)
            fprintf(stderr, "warning: schedule cache %s/%s: %d entries did not verify; ignored\n",
                    js->dir, name, dropped);
        json_decref(doc);
    }
    *out = js;
    return CM_OK;
}

void dp_sched_close(struct dp_sched *js)
{
    if (!js)
        return;
    for (size_t i = 0; i < js->nv; i++)
        held_free(&js->v[i]);
    free(js->keys);
    free(js->dir);
    free(js);
}

static int held_status(const struct dp_sched *js, int64_t now)
{
    if (!js->nv)
        return CM_ENOTFOUND;
    return js->v[0].s.valid_until > now - DP_SCHED_SKEW_S ? CM_OK : CM_EEXPIRED;
}

static int get_answer(struct dp_sched *js, const struct agent_client *coord, const char *path,
                      json_t **out)
{
    struct agent_reply r = {0};
    *out = NULL;
    int rc = agent_request(coord, "GET", path, NULL, &r);
    if (rc != CM_OK) {
        say_once(js, "coordinator unreachable (%s); keeping the last valid schedule%s",
                 cm_strerror(rc), "");
        return rc;
    }
    if (r.status != 200 || !json_is_object(r.json)) {
        const char *msg = json_string_value(
            json_object_get(json_object_get(r.json, "error"), "message"));
        char st[16];
        snprintf(st, sizeof st, "%ld", r.status);
        say_once(js, "coordinator answered %s (%s); keeping the last valid schedule", st,
                 msg ? msg : "no message");
        rc = r.status == 404 ? CM_ENOTFOUND : CM_EPROTO;
        agent_reply_free(&r);
        return rc;
    }
    *out = r.json;
    r.json = NULL;
    agent_reply_free(&r);
    return CM_OK;
}

int dp_sched_refresh(struct dp_sched *js, const struct agent_client *coord)
{
    if (!js || !coord)
        return CM_EINVAL;
    char path[160];
    snprintf(path, sizeof path, "/api/v1/runs/%s/schedule", js->run);
    json_t *a = NULL;
    int64_t now = (int64_t)time(NULL);
    if (get_answer(js, coord, path, &a) == CM_OK) {
        dp_sched_accept(js, a, now, 1);
        json_decref(a);
    }
    return held_status(js, now);
}

int dp_sched_fetch_version(struct dp_sched *js, const struct agent_client *coord,
                           int64_t version)
{
    if (!js || !coord || version <= 0)
        return CM_EINVAL;
    if (find(js, version))
        return CM_OK;
    char path[200];
    snprintf(path, sizeof path, "/api/v1/runs/%s/schedules/%lld", js->run, (long long)version);
    json_t *a = NULL;
    int rc = get_answer(js, coord, path, &a);
    if (rc == CM_OK) {
        rc = dp_sched_accept(js, a, (int64_t)time(NULL), 0);
        json_decref(a);
    }
    if (rc == CM_OK && !find(js, version)) {
        say_once(js, "asked for one version, got another%s%s", "", "");
        rc = CM_EPROTO;
    }
    return rc;
}

int64_t dp_sched_version(const struct dp_sched *js)
{
    return js && js->nv ? js->v[0].s.version : 0;
}

int dp_sched_has_version(const struct dp_sched *js, int64_t version)
{
    return js && version > 0 && find(js, version) != NULL;
}

unsigned dp_sched_group_size(const struct dp_sched *js, int64_t version)
{
    const struct held *h = js && version > 0 ? find(js, version) : NULL;
    return h ? h->s.group_size : 0;
}

const struct sched_schedule *dp_sched_current(const struct dp_sched *js)
{
    return js && js->nv ? &js->v[0].s : NULL;
}

static const struct sched_entry *entry_of(const struct sched_schedule *s, const uint8_t *pub)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (!memcmp(s->peers[i].key, pub, CM_ED25519_PUB_LEN))
            return &s->peers[i];
    return NULL;
}

void dp_sched_role(const struct dp_sched *js, const uint8_t pub[CM_ED25519_PUB_LEN],
                   int inbound, int *compute, int *aggregate)
{
    const struct sched_entry *e = entry_of(dp_sched_current(js), pub);
    if (compute)
        *compute = e ? e->compute : 1;
    if (aggregate)
        *aggregate = inbound && (e ? e->share > 0 : 1);
}

static int even_split(struct ar_member *am, const int *agg_ok, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += agg_ok[i] != 0;
    if (!k)
        return CM_EINVAL;
    for (size_t i = 0; i < n; i++)
        am[i].fraction = agg_ok[i] ? 1.0 / (double)k : 0;
    return CM_OK;
}

/* Whether the address a is at the numeric address ip ("" or none: nothing
 * to check against). An IPv4 address matches its IPv4-mapped IPv6 form. */
static int addr_is(const struct sockaddr_storage *a, const char *ip)
{
    if (!ip || !ip[0])
        return 1;
    unsigned char b[16], m[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (inet_pton(AF_INET, ip, b) == 1) {
        memcpy(m + 12, b, 4);
        if (a->ss_family == AF_INET)
            return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, b, 4);
        return a->ss_family == AF_INET6 && !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, m, 16);
    }
    return inet_pton(AF_INET6, ip, b) == 1 && a->ss_family == AF_INET6 &&
           !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, b, 16);
}

const char *dp_sched_ip_of(const struct dp_sched *js, int64_t version, const uint8_t pub[CM_ED25519_PUB_LEN])
{
    const struct held *h = js && version > 0 ? find(js, version) : NULL;
    const struct sched_entry *e = h ? entry_of(&h->s, pub) : NULL;
    return e ? e->ip : "";
}

int dp_sched_plan_version(const struct dp_sched *js, int64_t version, struct ar_member *am,
                          const int *agg_ok, size_t n)
{
    return dp_sched_plan_checked(js, version, am, agg_ok, n, NULL);
}

int dp_sched_plan_checked(const struct dp_sched *js, int64_t version, struct ar_member *am,
                          const int *agg_ok_in, size_t n, uint64_t *refused)
{
    if (refused)
        *refused = 0;
    if (!am || !agg_ok_in || n == 0 || n > AR_MAX_MEMBERS)
        return CM_EINVAL;
    if (version == 0)
        return even_split(am, agg_ok_in, n);
    const struct held *h = js ? find(js, version) : NULL;
    if (!h)
        return CM_ENOTFOUND;
    /* A member whose announced averaging address is not where the
       schedule says peers reach it (the coordinator saw it elsewhere, or
       it names another relay) aggregates nothing: its part would go to
       whoever holds that address (docs/p2p.md, "Announced addresses").
       Every member decides from the same schedule and announcements. */
    int agg_ok[AR_MAX_MEMBERS];
    const struct sched_entry *ent[AR_MAX_MEMBERS];
    for (size_t i = 0; i < n; i++) {
        const struct sched_entry *e = ent[i] = entry_of(&h->s, am[i].pub);
        agg_ok[i] = agg_ok_in[i] && (!e || addr_is(&am[i].addr, e->ip));
        if (refused && agg_ok_in[i] && !agg_ok[i])
            *refused |= (uint64_t)1 << i;
    }
    /* Integer shares, so every member computes the same sums. */
    uint64_t present = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sched_entry *e = ent[i];
        uint32_t share = e && agg_ok[i] && !e->client_mode ? e->share : 0;
        /* a key listed twice in the round counts once (the first) */
        for (size_t j = 0; j < i && share; j++)
            if (!memcmp(am[j].pub, am[i].pub, CM_ED25519_PUB_LEN))
                share = 0;
        am[i].fraction = (double)share / SCHED_SHARE_TOTAL;
        present += share;
    }
    if (present == 0 || 2 * present < SCHED_SHARE_TOTAL)
        return even_split(am, agg_ok, n);
    return CM_OK;
}

int dp_sched_plan(const struct dp_sched *js, struct ar_member *am, const int *agg_ok,
                  size_t n)
{
    return dp_sched_plan_version(js, dp_sched_version(js), am, agg_ok, n);
}
