/* The averaging engine (ar.h): owns one p2p host whose request handler
 * dispatches the averaging messages to the running rounds, remembers the ids
 * of finished rounds so late messages get a definite "finished" answer, and
 * holds the pure pieces every member must compute identically: the round id
 * and the split of the flat buffer into parts (seed 000_02cc6b5d62a616fc.txt,
 * Appendix B, eq. (6): each aggregator takes a share proportional to its
 * fraction). The round itself lives in ar_round.c. */
#include "ar/ar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

int64_t ar__mono_ms(void)
{
    return (int64_t)(uv_hrtime() / 1000000);
}

const char *ar_excl_reason_name(int reason)
{
    switch (reason) {
    case AR_EXCL_NONFINITE:
        return "nonfinite";
    case AR_EXCL_NORM:
        return "norm";
    case AR_EXCL_SIZE:
        return "size";
    case AR_EXCL_MALFORMED:
        return "malformed";
    case AR_EXCL_WEIGHT:
        return "weight";
    default:
        return "unknown";
    }
}

/* ---- pure helpers ------------------------------------------------------ */

int ar_partition(const struct ar_member *members, size_t n_members, size_t n, size_t align,
                 size_t *n_parts, uint32_t *owner, size_t *offset, size_t *len)
{
    if (!members || n_members == 0 || n_members > AR_MAX_MEMBERS || align == 0)
        return CM_EINVAL;
    double total = 0;
    size_t last = n_members;
    for (size_t i = 0; i < n_members; i++) {
        double f = members[i].fraction;
        if (!isfinite(f) || f < 0)
            return CM_EINVAL;
        if (f > 0) {
            total += f;
            last = i;
        }
    }
    if (last == n_members || !isfinite(total))
        return CM_EINVAL;
    /* Boundaries are rounded cumulative shares of whole alignment units, so
     * they are monotone, cover every unit exactly once, and give an even
     * split when the fractions are equal. */
    size_t units = n / align + (n % align != 0);
    double cum = 0;
    size_t prev = 0, k = 0;
    for (size_t i = 0; i < n_members; i++) {
        if (!(members[i].fraction > 0))
            continue;
        cum += members[i].fraction;
        size_t b;
        if (i == last) {
            b = units;
        } else {
            double x = floor(cum / total * (double)units + 0.5);
            b = x <= 0 ? 0 : x >= (double)units ? units : (size_t)x;
            if (b < prev)
                b = prev;
        }
        size_t lo = prev * align < n ? prev * align : n;
        size_t hi = b * align < n ? b * align : n;
        owner[k] = (uint32_t)i;
        offset[k] = lo;
        len[k] = hi - lo;
        k++;
        prev = b;
    }
    *n_parts = k;
    return CM_OK;
}

uint32_t ar_chunk_elems(const struct ar_round_config *cfg)
{
    if (cfg->chunk_elems)
        return cfg->chunk_elems;
    return cfg->comp == AR_COMP_Q8     ? AR_CHUNK_DEFAULT_Q8
           : cfg->comp == AR_COMP_FP16 ? AR_CHUNK_DEFAULT_FP16
                                       : AR_CHUNK_DEFAULT;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int ar_round_id(const struct ar_round_config *cfg, uint8_t out[AR_ROUND_ID_LEN])
{
    if (!cfg || !cfg->members || cfg->n_members == 0 || cfg->n_members > AR_MAX_MEMBERS ||
        cfg->group_id_len > AR_GROUP_ID_MAX || (cfg->group_id_len && !cfg->group_id))
        return CM_EINVAL;
    struct cm_sha256_ctx h;
    int rc = cm_sha256_init(&h);
    if (rc)
        return rc;
    uint8_t b[8];
    static const char tag[] = "crowdtrain-ar-v1";
    cm_sha256_update(&h, tag, sizeof tag - 1);
    put_u64(b, cfg->step);
    cm_sha256_update(&h, b, 8);
    put_u64(b, cfg->group_id_len);
    cm_sha256_update(&h, b, 8);
    if (cfg->group_id_len)
        cm_sha256_update(&h, cfg->group_id, cfg->group_id_len);
    put_u64(b, cfg->n);
    cm_sha256_update(&h, b, 8);
    put_u64(b, (uint64_t)cfg->comp);
    cm_sha256_update(&h, b, 8);
    put_u64(b, ar_chunk_elems(cfg));
    cm_sha256_update(&h, b, 8);
    put_u64(b, cfg->n_members);
    cm_sha256_update(&h, b, 8);
    for (size_t i = 0; i < cfg->n_members; i++) {
        uint64_t fb;
        memcpy(&fb, &cfg->members[i].fraction, 8);
        cm_sha256_update(&h, cfg->members[i].pub, CM_ED25519_PUB_LEN);
        put_u64(b, fb);
        cm_sha256_update(&h, b, 8);
        b[0] = (uint8_t)cfg->members[i].sends; /* 0, 1 or 2: ar_round_start refuses others */
        cm_sha256_update(&h, b, 1);
    }
    rc = cm_sha256_final(&h, out);
    cm_sha256_cleanup(&h);
    return rc;
}

/* ---- rounds registry --------------------------------------------------- */

struct ar_round *ar__engine_find(struct ar_engine *e, const uint8_t id[AR_ROUND_ID_LEN])
{
    for (struct ar_round *r = e->rounds; r; r = r->next)
        if (r->phase != AR__P_DEAD && !memcmp(r->id, id, AR_ROUND_ID_LEN))
            return r;
    return NULL;
}

int ar__engine_finished(const struct ar_engine *e, const uint8_t id[AR_ROUND_ID_LEN])
{
    for (size_t i = 0; i < e->fin_len; i++)
        if (!memcmp(e->finished[i], id, AR_ROUND_ID_LEN))
            return 1;
    return 0;
}

void ar__engine_unlink(struct ar_engine *e, struct ar_round *r)
{
    for (struct ar_round **pp = &e->rounds; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    r->next = NULL;
    /* Remembered so that late messages are told the round is over. */
    memcpy(e->finished[e->fin_pos], r->id, AR_ROUND_ID_LEN);
    e->fin_pos = (e->fin_pos + 1) % e->fin_cap;
    if (e->fin_len < e->fin_cap)
        e->fin_len++;
}

int ar__member_of(const struct ar_round *r, const uint8_t pub[CM_ED25519_PUB_LEN])
{
    for (size_t i = 0; i < r->n_members; i++)
        if (!memcmp(r->members[i].pub, pub, CM_ED25519_PUB_LEN))
            return (int)i;
    return -1;
}

/* ---- message dispatch -------------------------------------------------- */

/* Looks up the round of a message: CM_EBUSY when unknown (the sender may be
 * early: it retries until its deadline), CM_ESTATE when finished. */
static int lookup(struct ar_engine *e, const uint8_t id[AR_ROUND_ID_LEN], const uint8_t *pub,
                  struct ar_round **r, int *member)
{
    *r = ar__engine_find(e, id);
    if (!*r)
        return ar__engine_finished(e, id) ? CM_ESTATE : CM_EBUSY;
    *member = ar__member_of(*r, pub);
    return *member < 0 ? CM_EPERM : CM_OK;
}

static int on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                      const uint8_t *body, size_t len, struct p2p_reply *reply)
{
    struct ar_engine *e = arg;
    (void)h;
    struct ar_round *r;
    int member, rc;
    if (type == AR_MSG_DATA) {
        struct ar_data_msg m;
        int prc = ar_data_parse(body, len, &m);
        if (!m.has_round)
            return CM_EPARSE;
        if (!(rc = lookup(e, m.round, from->pub, &r, &member)))
            rc = ar__round_on_data(r, member, &m, prc, len, &reply->body, &reply->len);
        ar_data_cleanup(&m);
        return rc;
    }
    if (type == AR_MSG_FETCH) {
        struct ar_fetch_msg m;
        if (ar_fetch_parse(body, len, &m))
            return CM_EPARSE;
        if ((rc = lookup(e, m.round, from->pub, &r, &member)))
            return rc;
        return ar__round_on_fetch(r, member, &m, len, reply);
    }
    return CM_EUNSUPPORTED;
}

/* ---- engine ------------------------------------------------------------ */

int ar_engine_new(const struct ar_engine_config *cfg, struct ar_engine **out)
{
    if (!cfg || !cfg->ctx || !cfg->key || !cfg->token || !out)
        return CM_EINVAL;
    struct ar_engine *e = calloc(1, sizeof *e);
    if (!e)
        return CM_ENOMEM;
    e->ctx = cfg->ctx;
    e->key = cfg->key;
    e->fin_cap = cfg->finished_memory ? cfg->finished_memory : 256;
    e->finished = calloc(e->fin_cap, sizeof *e->finished);
    e->pool = ar__pool_new();
    if (!e->finished || !e->pool) {
        free(e->finished);
        ar__pool_unref(e->pool);
        free(e);
        return CM_ENOMEM;
    }
    struct p2p_host_config hc = {
        .key = cfg->key, .token = cfg->token, .listen_ip = cfg->listen_ip,
        .listen_port = cfg->listen_port, .advertise_port = cfg->advertise_port,
        .max_inbound = cfg->max_inbound, .on_request_reply = on_request, .arg = e,
    };
    int rc = p2p_host_new(cfg->ctx, &hc, &e->host);
    if (rc) {
        free(e->finished);
        ar__pool_unref(e->pool);
        free(e);
        return rc;
    }
    /* The same identity in client mode for fetching results: the transport
     * keeps one FIFO connection per remote address and host, and an Ack
     * queued behind a window of averaged chunks would stall the sender. */
    hc.listen_ip = NULL;
    hc.listen_port = hc.advertise_port = 0;
    if ((rc = p2p_host_new(cfg->ctx, &hc, &e->fhost))) {
        p2p_host_close(e->host);
        free(e->finished);
        ar__pool_unref(e->pool);
        free(e);
        return rc;
    }
    e->listening = cfg->listen_ip != NULL;
    *out = e;
    return CM_OK;
}

void ar_engine_free(struct ar_engine *e)
{
    if (!e)
        return;
    while (e->rounds)
        ar__round_kill(e->rounds, CM_ECLOSED);
    /* Fails the requests still pending: their callbacks see dead rounds and
     * only drop their references. */
    p2p_host_close(e->fhost);
    p2p_host_close(e->host);
    e->host = e->fhost = NULL;
    free(e->finished);
    ar__pool_unref(e->pool);
    free(e);
}

struct p2p_host *ar_engine_host(struct ar_engine *e)
{
    return e->host;
}

uint16_t ar_engine_port(const struct ar_engine *e)
{
    return p2p_host_port(e->host);
}

int ar_engine_set_token(struct ar_engine *e, const char *token)
{
    int rc = p2p_host_set_token(e->host, token);
    return rc ? rc : p2p_host_set_token(e->fhost, token);
}
