/* Signed envelopes and the receiver's checks (seed 000_02cc6b5d62a616fc.txt,
 * Appendix H.4); see p2p_envelope.h. The parser is pure; the checks keep
 * bounded state (replay ring, token cache) in struct p2p_auth. */
#include "p2p/p2p_envelope.h"
#include "p2p/p2p_frame.h"
#include "p2p/p2p.pb-c.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

static const char SIGN_CONTEXT[17] = "crowdtrain-p2p-v1";

struct p2p_replay_entry {
    uint8_t nonce[P2P_NONCE_LEN];
    int64_t time_ms;
    int32_t next;   /* next entry in the same hash chain, -1 ends */
    uint32_t head;  /* chain index */
};

struct p2p_token_slot {
    int used;
    uint8_t hash[CM_SHA256_LEN];
    struct cm_pass_claims claims;
};

static const char *const REJECT_NAMES[P2P_REJ_COUNT] = {
    "malformed", "bad token", "expired token", "revoked token", "wrong run", "bad signature",
    "wrong recipient", "clock skew", "replayed nonce", "nonce mismatch", "wrong sender",
};

const char *p2p_reject_name(enum p2p_reject r)
{
    return (unsigned)r < P2P_REJ_COUNT ? REJECT_NAMES[r] : "unknown";
}

int p2p_envelope_parse(const uint8_t *buf, size_t len, struct p2p_envelope *env)
{
    memset(env, 0, sizeof *env);
    if (len > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    Ctp2p__Envelope *m = ctp2p__envelope__unpack(NULL, len, buf);
    if (!m)
        return CM_EPARSE;
    size_t tlen = m->access_token ? strlen(m->access_token) : 0;
    if ((m->kind != P2P_KIND_REQUEST && m->kind != P2P_KIND_RESPONSE) || tlen == 0 ||
        tlen > CM_TOKEN_MAX_LEN || (m->recipient_key.len != 0 && m->recipient_key.len != 32) ||
        m->nonce.len != P2P_NONCE_LEN || m->signature.len != CM_ED25519_SIG_LEN ||
        m->listen_port > 65535 || m->body.len > P2P_FRAME_MAX_PAYLOAD || m->status > 0 ||
        m->status < -100000) {
        ctp2p__envelope__free_unpacked(m, NULL);
        return CM_EPARSE;
    }
    env->kind = m->kind;
    env->type = m->type;
    env->request_id = m->request_id;
    env->token = m->access_token;
    env->token_len = tlen;
    env->has_recipient = m->recipient_key.len == 32;
    if (env->has_recipient)
        memcpy(env->recipient, m->recipient_key.data, 32);
    env->time_ms = m->time_ms;
    memcpy(env->nonce, m->nonce.data, P2P_NONCE_LEN);
    env->listen_port = m->listen_port;
    env->status = m->status;
    env->body = m->body.data;
    env->body_len = m->body.len;
    memcpy(env->sig, m->signature.data, CM_ED25519_SIG_LEN);
    env->pb_ = m;
    return CM_OK;
}

void p2p_envelope_cleanup(struct p2p_envelope *env)
{
    if (env->pb_)
        ctp2p__envelope__free_unpacked(env->pb_, NULL);
    env->pb_ = NULL;
}

static uint8_t *put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

void p2p_envelope_signed_bytes(uint32_t kind, uint32_t type, uint64_t request_id, int64_t time_ms,
                               uint32_t listen_port, int32_t status, const uint8_t *recipient,
                               const uint8_t nonce[P2P_NONCE_LEN], const char *token,
                               size_t token_len, const uint8_t *body, size_t body_len,
                               uint8_t out[P2P_SIGNED_LEN])
{
    uint8_t *p = out;
    memcpy(p, SIGN_CONTEXT, sizeof SIGN_CONTEXT);
    p += sizeof SIGN_CONTEXT;
    *p++ = (uint8_t)kind;
    p = put_be(p, type, 4);
    p = put_be(p, request_id, 8);
    p = put_be(p, (uint64_t)time_ms, 8);
    p = put_be(p, listen_port, 4);
    p = put_be(p, (uint32_t)status, 4);
    if (recipient)
        memcpy(p, recipient, 32);
    else
        memset(p, 0, 32);
    p += 32;
    memcpy(p, nonce, P2P_NONCE_LEN);
    p += P2P_NONCE_LEN;
    cm_sha256(token, token_len, p);
    p += 32;
    cm_sha256(body, body_len, p);
}

int p2p_envelope_build(const struct cm_ed25519 *key, const struct p2p_envelope_out *o,
                       uint8_t **out, size_t *out_len)
{
    size_t tlen = o->token ? strlen(o->token) : 0;
    if (tlen == 0 || tlen > CM_TOKEN_MAX_LEN || o->body_len > P2P_FRAME_MAX_PAYLOAD)
        return CM_EINVAL;
    uint8_t tbs[P2P_SIGNED_LEN], sig[CM_ED25519_SIG_LEN];
    p2p_envelope_signed_bytes(o->kind, o->type, o->request_id, o->time_ms, o->listen_port,
                              o->status, o->recipient, o->nonce, o->token, tlen, o->body,
                              o->body_len, tbs);
    int rc = cm_ed25519_sign(key, tbs, sizeof tbs, sig);
    if (rc)
        return rc;
    Ctp2p__Envelope m = CTP2P__ENVELOPE__INIT;
    m.kind = o->kind;
    m.type = o->type;
    m.request_id = o->request_id;
    m.access_token = (char *)o->token;
    if (o->recipient) {
        m.recipient_key.data = (uint8_t *)o->recipient;
        m.recipient_key.len = 32;
    }
    m.time_ms = o->time_ms;
    m.nonce.data = (uint8_t *)o->nonce;
    m.nonce.len = P2P_NONCE_LEN;
    m.listen_port = o->listen_port;
    m.status = o->status;
    m.body.data = (uint8_t *)o->body;
    m.body.len = o->body_len;
    m.signature.data = sig;
    m.signature.len = sizeof sig;
    size_t n = ctp2p__envelope__get_packed_size(&m);
    if (n > P2P_FRAME_MAX_PAYLOAD)
        return CM_ETOOBIG;
    uint8_t *b = malloc(P2P_FRAME_HDR_LEN + n);
    if (!b)
        return CM_ENOMEM;
    p2p_frame_write_hdr(b, n);
    ctp2p__envelope__pack(&m, b + P2P_FRAME_HDR_LEN);
    *out = b;
    *out_len = P2P_FRAME_HDR_LEN + n;
    return CM_OK;
}

/* ---- p2p_auth ---------------------------------------------------------- */

int p2p_auth_init(struct p2p_auth *a, const struct p2p_auth_config *cfg)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->rev_mu, NULL);
    if (!cfg->run || !cm_name_valid(cfg->run) || cfg->n_coord_keys == 0 ||
        cfg->n_coord_keys > P2P_MAX_COORD_KEYS || cfg->skew_ms < 0)
        goto inval;
    strcpy(a->run, cfg->run);
    memcpy(a->coord_keys, cfg->coord_keys, cfg->n_coord_keys * CM_ED25519_PUB_LEN);
    a->n_coord_keys = cfg->n_coord_keys;
    a->skew_ms = cfg->skew_ms ? cfg->skew_ms : P2P_DEFAULT_SKEW_MS;
    a->ring_cap = cfg->replay_capacity ? cfg->replay_capacity : 65536;
    a->n_heads = a->ring_cap * 2;
    a->n_tokens = cfg->token_cache_capacity ? cfg->token_cache_capacity : 4096;
    a->ring = calloc(a->ring_cap, sizeof *a->ring);
    a->heads = malloc(a->n_heads * sizeof *a->heads);
    a->tokens = calloc(a->n_tokens, sizeof *a->tokens);
    if (!a->ring || !a->heads || !a->tokens) {
        p2p_auth_cleanup(a);
        return CM_ENOMEM;
    }
    for (size_t i = 0; i < a->n_heads; i++)
        a->heads[i] = -1;
    a->replay_watermark_ms = INT64_MIN;
    return CM_OK;
inval:
    pthread_mutex_destroy(&a->rev_mu);
    return CM_EINVAL;
}

static void free_revoked(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

void p2p_auth_cleanup(struct p2p_auth *a)
{
    free(a->ring);
    free(a->heads);
    free(a->tokens);
    a->ring = NULL;
    a->heads = NULL;
    a->tokens = NULL;
    free_revoked(a->revoked, a->n_revoked);
    a->revoked = NULL;
    a->n_revoked = 0;
    a->n_tokens = a->ring_cap = 0;
    pthread_mutex_destroy(&a->rev_mu);
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

int p2p_auth_set_revoked(struct p2p_auth *a, const char *const *pass_ids, size_t n,
                         int64_t generated_at)
{
    char **list = n ? calloc(n, sizeof *list) : NULL;
    if (n && !list)
        return CM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!(list[i] = strdup(pass_ids[i]))) {
            free_revoked(list, i);
            return CM_ENOMEM;
        }
    }
    if (n)
        qsort(list, n, sizeof *list, cmp_str);
    pthread_mutex_lock(&a->rev_mu);
    if (generated_at < a->rev_generated_at) {
        pthread_mutex_unlock(&a->rev_mu);
        free_revoked(list, n);
        return CM_OK;
    }
    char **old = a->revoked;
    size_t old_n = a->n_revoked;
    a->revoked = list;
    a->n_revoked = n;
    a->rev_generated_at = generated_at;
    pthread_mutex_unlock(&a->rev_mu);
    free_revoked(old, old_n);
    return CM_OK;
}

int p2p_auth_is_revoked(struct p2p_auth *a, const char *pass_id)
{
    pthread_mutex_lock(&a->rev_mu);
    int hit = a->n_revoked &&
              bsearch(&pass_id, a->revoked, a->n_revoked, sizeof *a->revoked, cmp_str) != NULL;
    pthread_mutex_unlock(&a->rev_mu);
    return hit;
}

void p2p_auth_count(struct p2p_auth *a, enum p2p_reject why, const char *detail)
{
    if ((unsigned)why >= P2P_REJ_COUNT)
        return;
    uint64_t n = __atomic_add_fetch(&a->rejects[why], 1, __ATOMIC_RELAXED);
    /* Every rejection is counted; logging is thinned under floods (first 100
     * of each reason, then every 1000th) so an attacker cannot fill the disk. */
    if (n <= 100 || n % 1000 == 0)
        CM_LOGW("p2p", "rejected message: %s%s%s (%llu so far)", p2p_reject_name(why),
                detail ? ": " : "", detail ? detail : "", (unsigned long long)n);
}

uint64_t p2p_auth_rejects(const struct p2p_auth *a, enum p2p_reject why)
{
    if ((unsigned)why >= P2P_REJ_COUNT)
        return 0;
    return __atomic_load_n(&a->rejects[why], __ATOMIC_RELAXED);
}

static int reject(struct p2p_auth *a, enum p2p_reject r, enum p2p_reject *why, const char *detail,
                  int code)
{
    if (why)
        *why = r;
    p2p_auth_count(a, r, detail);
    return code;
}

int p2p_auth_check_token(struct p2p_auth *a, const char *tok, size_t len, int64_t now_ms,
                         struct cm_pass_claims *claims, enum p2p_reject *why)
{
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(tok, len, h);
    size_t idx = ((size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24) %
                 a->n_tokens;
    struct p2p_token_slot *s = &a->tokens[idx];
    int64_t now_s = now_ms / 1000, skew_s = (a->skew_ms + 999) / 1000;
    if (s->used && !memcmp(s->hash, h, sizeof h)) {
        *claims = s->claims;
        if (now_s >= claims->expires_at + skew_s || claims->issued_at > now_s + skew_s)
            return reject(a, P2P_REJ_EXPIRED, why, claims->pass_id, CM_EEXPIRED);
    } else {
        int rc = cm_token_verify(tok, len, (const uint8_t(*)[CM_ED25519_PUB_LEN])a->coord_keys,
                                 a->n_coord_keys, now_s, skew_s, claims);
        if (rc == CM_EEXPIRED)
            return reject(a, P2P_REJ_EXPIRED, why, claims->pass_id, CM_EEXPIRED);
        if (rc)
            return reject(a, P2P_REJ_TOKEN, why, cm_strerror(rc), CM_EAUTH);
        s->used = 1;
        memcpy(s->hash, h, sizeof h);
        s->claims = *claims;
    }
    if (strcmp(claims->run, a->run))
        return reject(a, P2P_REJ_RUN, why, claims->run, CM_EAUTH);
    if (p2p_auth_is_revoked(a, claims->pass_id))
        return reject(a, P2P_REJ_REVOKED, why, claims->pass_id, CM_EREVOKED);
    return CM_OK;
}

int p2p_auth_check_claims(struct p2p_auth *a, const struct cm_pass_claims *claims, int64_t now_ms,
                          enum p2p_reject *why)
{
    int64_t now_s = now_ms / 1000, skew_s = (a->skew_ms + 999) / 1000;
    if (now_s >= claims->expires_at + skew_s || claims->issued_at > now_s + skew_s)
        return reject(a, P2P_REJ_EXPIRED, why, claims->pass_id, CM_EEXPIRED);
    if (p2p_auth_is_revoked(a, claims->pass_id))
        return reject(a, P2P_REJ_REVOKED, why, claims->pass_id, CM_EREVOKED);
    return CM_OK;
}

static int check_sig(const struct p2p_envelope *env, const uint8_t pub[CM_ED25519_PUB_LEN])
{
    uint8_t tbs[P2P_SIGNED_LEN];
    p2p_envelope_signed_bytes(env->kind, env->type, env->request_id, env->time_ms,
                              env->listen_port, env->status,
                              env->has_recipient ? env->recipient : NULL, env->nonce, env->token,
                              env->token_len, env->body, env->body_len, tbs);
    return cm_ed25519_verify(pub, tbs, sizeof tbs, env->sig);
}

static uint32_t nonce_bucket(const struct p2p_auth *a, const uint8_t nonce[P2P_NONCE_LEN])
{
    uint64_t v;
    memcpy(&v, nonce, sizeof v);
    return (uint32_t)(v % a->n_heads);
}

static int replay_seen(const struct p2p_auth *a, const uint8_t nonce[P2P_NONCE_LEN])
{
    for (int32_t i = a->heads[nonce_bucket(a, nonce)]; i >= 0; i = a->ring[i].next)
        if (!memcmp(a->ring[i].nonce, nonce, P2P_NONCE_LEN))
            return 1;
    return 0;
}

static void replay_insert(struct p2p_auth *a, const uint8_t nonce[P2P_NONCE_LEN], int64_t time_ms)
{
    struct p2p_replay_entry *e = &a->ring[a->ring_pos];
    if (a->ring_len == a->ring_cap) {
        /* Evict the oldest arrival; its time becomes the watermark below
         * which every message is refused, so an evicted nonce can never be
         * replayed (its signed time is at or below the watermark). */
        int32_t *pp = &a->heads[e->head];
        while (*pp >= 0 && *pp != (int32_t)a->ring_pos)
            pp = &a->ring[*pp].next;
        if (*pp >= 0)
            *pp = e->next;
        if (e->time_ms > a->replay_watermark_ms)
            a->replay_watermark_ms = e->time_ms;
    } else {
        a->ring_len++;
    }
    memcpy(e->nonce, nonce, P2P_NONCE_LEN);
    e->time_ms = time_ms;
    e->head = nonce_bucket(a, nonce);
    e->next = a->heads[e->head];
    a->heads[e->head] = (int32_t)a->ring_pos;
    a->ring_pos = (a->ring_pos + 1) % a->ring_cap;
}

int p2p_auth_check_request(struct p2p_auth *a, const struct p2p_envelope *env,
                           const uint8_t self_pub[CM_ED25519_PUB_LEN], int64_t now_ms,
                           struct cm_pass_claims *claims, enum p2p_reject *why)
{
    if (env->kind != P2P_KIND_REQUEST)
        return reject(a, P2P_REJ_MALFORMED, why, "not a request", CM_EPROTO);
    int rc = p2p_auth_check_token(a, env->token, env->token_len, now_ms, claims, why);
    if (rc)
        return rc;
    if (check_sig(env, claims->peer_public_key))
        return reject(a, P2P_REJ_SIGNATURE, why, claims->username, CM_EBADSIG);
    if (env->has_recipient ? !cm_ct_equal(env->recipient, self_pub, 32) : env->type != 1)
        return reject(a, P2P_REJ_RECIPIENT, why, claims->username, CM_EAUTH);
    if (env->time_ms > now_ms + a->skew_ms || env->time_ms < now_ms - a->skew_ms)
        return reject(a, P2P_REJ_SKEW, why, claims->username, CM_EAUTH);
    if (env->time_ms <= a->replay_watermark_ms || replay_seen(a, env->nonce))
        return reject(a, P2P_REJ_REPLAY, why, claims->username, CM_EREPLAY);
    replay_insert(a, env->nonce, env->time_ms);
    return CM_OK;
}

int p2p_auth_check_response(struct p2p_auth *a, const struct p2p_envelope *env,
                            const uint8_t self_pub[CM_ED25519_PUB_LEN],
                            const uint8_t nonce[P2P_NONCE_LEN], const uint8_t *expect_pub,
                            int64_t now_ms, struct cm_pass_claims *claims, enum p2p_reject *why)
{
    if (env->kind != P2P_KIND_RESPONSE)
        return reject(a, P2P_REJ_MALFORMED, why, "not a response", CM_EPROTO);
    int rc = p2p_auth_check_token(a, env->token, env->token_len, now_ms, claims, why);
    if (rc)
        return rc;
    if (check_sig(env, claims->peer_public_key))
        return reject(a, P2P_REJ_SIGNATURE, why, claims->username, CM_EBADSIG);
    if (!cm_ct_equal(env->nonce, nonce, P2P_NONCE_LEN))
        return reject(a, P2P_REJ_NONCE, why, claims->username, CM_EREPLAY);
    if (expect_pub && !cm_ct_equal(claims->peer_public_key, expect_pub, 32))
        return reject(a, P2P_REJ_SENDER, why, claims->username, CM_EAUTH);
    if (!env->has_recipient || !cm_ct_equal(env->recipient, self_pub, 32))
        return reject(a, P2P_REJ_RECIPIENT, why, claims->username, CM_EAUTH);
    return CM_OK;
}
