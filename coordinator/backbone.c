/* DHT backbone nodes run by the coordinator, one per open run (see
 * backbone.h). The manager thread has its own database connection, so it
 * never competes with request handlers for the pool. */
#include "coordinator/backbone.h"
#include "cm_err.h"
#include "cm_log.h"
#include "dht/dht_node.h"
#include "dht/dht_types.h"
#include "moe/moe_dht.h"
#include "p2p/p2p_probe.h"
#include "p2p/p2p_relay.h"

#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BB_PERIOD_S 5
#define BB_TOKEN_TTL_S (7L * 24 * 3600)
#define BB_RENEW_BEFORE_S (24L * 3600)
#define BB_FRESH_S 30 /* a backbone row older than this is not handed out */
#define BB_PORT_TRIES 100

struct bb_node {
    int64_t run_id;
    char run[CM_NAME_MAX + 1];
    struct dht_node *node;
    int64_t token_exp;
    char address[300];
    int64_t sched_version; /* newest schedule announced in the DHT */
    int64_t sched_put_at;  /* when (Unix s), to refresh it before it expires */
    int64_t relay_put_at;  /* when it last said it relays (Unix s; --relay-reservations) */
    struct p2p_probe_hold probe; /* throughput probes: one prober at a time (node's loop) */
    struct bb_node *next;
};

struct coord_backbone {
    struct coord_server *srv;
    struct cm_ed25519 key;
    char listen_ip[64];
    char advertise[256];
    long port_base; /* 0: ephemeral */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, poked;
    PGconn *pg;
    /* Changed by the manager only, under the write lock; request handlers
       hold the read lock while they use a node (dial-back). */
    pthread_rwlock_t nodes_lock;
    struct bb_node *nodes;
};

static PGresult *q(PGconn *pg, const char *sql, int n, const char *const *params)
{
    PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        CM_LOGW("backbone", "%s", PQerrorMessage(pg));
        PQclear(r);
        return NULL;
    }
    return r;
}

static int coord_keys(PGconn *pg, uint8_t keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN], size_t *n)
{
    PGresult *r = q(pg, "SELECT encode(public_key, 'hex') FROM signing_keys ORDER BY created_at DESC", 0, NULL);
    if (!r)
        return CM_EDB;
    *n = 0;
    for (int i = 0; i < PQntuples(r) && *n < P2P_MAX_COORD_KEYS; i++) {
        size_t got = 0;
        const char *h = PQgetvalue(r, i, 0);
        if (cm_hex_decode(h, strlen(h), keys[*n], CM_ED25519_PUB_LEN, &got) == CM_OK &&
            got == CM_ED25519_PUB_LEN)
            (*n)++;
    }
    PQclear(r);
    return *n ? CM_OK : CM_ENOTFOUND;
}

/* Throughput probes (p2p/p2p_probe.h; docs/schedules.md, "Measured
 * links"): agents measure their link's upload and download against the
 * backbone node, which usually sits on a fatter link than any volunteer's.
 * --probe-slots probers at a time (a burst of joins queues for fewer
 * seconds; more would share, and read less than, our link); on the node's
 * loop. */
static int on_probe(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type, const uint8_t *body,
                    size_t len, uint8_t **resp, size_t *rlen)
{
    struct bb_node *bn = arg;
    (void)h;
    if (type == P2P_MSG_PROBE) {
        if (len == 0 || len > P2P_PROBE_CHUNK)
            return CM_ETOOBIG;
        return p2p_probe_admit(&bn->probe, from->pub, p2p_now_ms());
    }
    if (type == P2P_MSG_PROBE_PULL) {
        uint32_t want = 0;
        int rc = p2p_probe_pull_parse(body, len, &want);
        if (rc == CM_OK)
            rc = p2p_probe_admit(&bn->probe, from->pub, p2p_now_ms());
        if (rc != CM_OK)
            return rc;
        if (!(*resp = calloc(1, want)))
            return CM_ENOMEM;
        *rlen = want;
        return CM_OK;
    }
    return CM_EUNSUPPORTED;
}

static int start_node(struct coord_backbone *b, int64_t run_id, const char *run, struct bb_node **out)
{
    struct coord_server *srv = b->srv;
    uint8_t keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t nkeys = 0;
    int rc = coord_keys(b->pg, keys, &nkeys);
    if (rc != CM_OK)
        return rc;
    struct cm_pass_claims c = {0};
    snprintf(c.username, sizeof c.username, "_coordinator");
    snprintf(c.run, sizeof c.run, "%s", run);
    snprintf(c.pass_id, sizeof c.pass_id, "bb-%s-%lld", srv->kid, (long long)run_id);
    memcpy(c.peer_public_key, b->key.pub, CM_ED25519_PUB_LEN);
    c.issued_at = (int64_t)time(NULL);
    c.expires_at = c.issued_at + BB_TOKEN_TTL_S;
    char *tok = NULL;
    if ((rc = cm_token_sign(&srv->signing_key, &c, &tok)) != CM_OK)
        return rc;

    /* Other coordinators' backbone nodes of this run, to join one DHT. */
    char rid[24];
    snprintf(rid, sizeof rid, "%lld", (long long)run_id);
    const char *p[] = {rid, srv->kid};
    PGresult *r = q(b->pg,
                    "SELECT address FROM dht_backbones WHERE run_id = $1 AND kid <> $2 AND "
                    "updated_at > now() - make_interval(secs => 30)",
                    2, p);
    const char *boot[16];
    size_t nboot = 0;
    for (int i = 0; r && i < PQntuples(r) && nboot < 16; i++)
        boot[nboot++] = PQgetvalue(r, i, 0);

    struct bb_node *bn = calloc(1, sizeof *bn);
    if (!bn) {
        PQclear(r);
        free(tok);
        return CM_ENOMEM;
    }
    struct dht_config cfg = {0};
    cfg.on_other = on_probe;
    cfg.on_other_arg = bn;
    bn->probe.slots = (unsigned)b->srv->cfg->probe_slots;
    cfg.key = &b->key;
    cfg.token = tok;
    cfg.listen_ip = b->listen_ip;
    cfg.ctx.auth.run = run;
    cfg.ctx.auth.coord_keys = (const uint8_t(*)[CM_ED25519_PUB_LEN])keys;
    cfg.ctx.auth.n_coord_keys = nkeys;
    cfg.bootstrap = boot;
    cfg.n_bootstrap = nboot;
    /* --relay-reservations: unreachable agents may borrow ports here (two
       each), when no reachable volunteer relays for them (docs/p2p.md,
       "Relays"); the agents rank this relay after every volunteer */
    struct p2p_relay_limits relay = {.max_reservations = (uint32_t)srv->cfg->relay_reservations,
                                     .max_per_peer = 2,
                                     .max_circuits = 8 * (uint32_t)srv->cfg->relay_reservations};
    if (srv->cfg->relay_reservations > 0)
        cfg.relay = &relay;
    struct dht_node *node = NULL;
    for (int i = 0; i < (b->port_base ? BB_PORT_TRIES : 1); i++) {
        cfg.listen_port = b->port_base ? (uint16_t)(b->port_base + i) : 0;
        if (b->port_base + i > 65535)
            break;
        rc = dht_node_start(&cfg, &node);
        if (rc == CM_OK)
            break;
    }
    PQclear(r);
    free(tok);
    if (rc != CM_OK) {
        CM_LOGE("backbone", "could not start the DHT node of run %s: %s", run, cm_strerror(rc));
        free(bn);
        return rc;
    }
    bn->run_id = run_id;
    snprintf(bn->run, sizeof bn->run, "%s", run);
    bn->node = node;
    bn->token_exp = c.expires_at;
    snprintf(bn->address, sizeof bn->address, strchr(b->advertise, ':') ? "[%s]:%u" : "%s:%u",
             b->advertise, dht_node_port(node));
    CM_LOGI("backbone", "DHT node of run %s listening, advertised as %s", run, bn->address);
    *out = bn;
    return CM_OK;
}

static void announce_schedule(struct coord_backbone *b, struct bb_node *n, const char *rid);
static void announce_relay(struct coord_backbone *b, struct bb_node *n);

static void publish(struct coord_backbone *b, struct bb_node *n)
{
    char rid[24], pub[2 * CM_ED25519_PUB_LEN + 1];
    snprintf(rid, sizeof rid, "%lld", (long long)n->run_id);
    cm_hex_encode(b->key.pub, CM_ED25519_PUB_LEN, pub);
    const char *p[] = {rid, b->srv->kid, n->address, pub};
    PGresult *r = q(b->pg,
                    "INSERT INTO dht_backbones (run_id, kid, address, public_key) "
                    "VALUES ($1, $2, $3, decode($4, 'hex')) ON CONFLICT (run_id, kid) DO UPDATE "
                    "SET address = EXCLUDED.address, public_key = EXCLUDED.public_key, updated_at = now()",
                    4, p);
    PQclear(r);
    /* The run's revocation list, for this node's receivers. */
    r = q(b->pg,
          "SELECT id::text FROM passes WHERE run_id = $1 AND revoked_at IS NOT NULL AND expires_at > now()",
          1, p);
    if (!r)
        return;
    size_t cnt = (size_t)PQntuples(r);
    const char **ids = calloc(cnt ? cnt : 1, sizeof *ids);
    if (ids) {
        for (size_t i = 0; i < cnt; i++)
            ids[i] = PQgetvalue(r, (int)i, 0);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p2p_auth_set_revoked(p2p_ctx_auth(dht_node_ctx(n->node)), ids, cnt,
                             (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
        free(ids);
    }
    PQclear(r);
    announce_schedule(b, n, rid);
    announce_relay(b, n);
}

/* Announces the run's newest signed schedule in the DHT under
 * "<run>/schedule" (docs/schedules.md): agents that cannot reach the
 * coordinator still learn it; they verify its signature as for the REST
 * answer. Re-put when a new version appears and every few minutes. */
#define BB_SCHED_TTL_S 600
static void announce_schedule(struct coord_backbone *b, struct bb_node *n, const char *rid)
{
    const char *p[] = {rid};
    PGresult *r = q(b->pg,
                    "SELECT version, payload, encode(signature, 'hex') FROM schedules WHERE run_id = $1 "
                    "ORDER BY version DESC LIMIT 1",
                    1, p);
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        return;
    }
    int64_t version = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    int64_t now = (int64_t)time(NULL);
    if (version == n->sched_version && now - n->sched_put_at < BB_SCHED_TTL_S / 3) {
        PQclear(r);
        return;
    }
    const char *payload = PQgetvalue(r, 0, 1), *sig_hex = PQgetvalue(r, 0, 2);
    size_t plen = strlen(payload), slen = 0;
    uint8_t sig[CM_ED25519_SIG_LEN];
    char *p64 = malloc(cm_b64url_encoded_len(plen) + 1), sig64[128];
    char *value = NULL;
    if (p64 && cm_hex_decode(sig_hex, strlen(sig_hex), sig, sizeof sig, &slen) == CM_OK &&
        slen == sizeof sig) {
        cm_b64url_encode(payload, plen, p64);
        cm_b64url_encode(sig, sizeof sig, sig64);
        json_t *o = json_pack("{s:s, s:I, s:s, s:s}", "run", n->run, "version", (json_int_t)version,
                              "payload", p64, "signature", sig64);
        value = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    free(p64);
    PQclear(r);
    char key[CM_NAME_MAX + 16];
    snprintf(key, sizeof key, "%s/schedule", n->run);
    int stored = 0;
    if (value && strlen(value) <= DHT_MAX_VALUE &&
        dht_put(n->node, key, strlen(key), "s", 1, value, strlen(value),
                p2p_now_ms() + BB_SCHED_TTL_S * 1000LL, 3000, &stored) == CM_OK) {
        n->sched_version = version;
        n->sched_put_at = now;
    } else if (value && strlen(value) > DHT_MAX_VALUE) {
        CM_LOGW("backbone", "schedule %lld of run %s is too large for the DHT (%zu bytes)",
                (long long)version, n->run, strlen(value));
        n->sched_version = version; /* do not retry every period */
        n->sched_put_at = now;
    }
    free(value);
}

/* With --relay-reservations, the node says in the DHT that it relays:
 * "<run>/relays", its address and the word "backbone" (agents use
 * volunteers first), every 30 s, living 90 s. */
static void announce_relay(struct coord_backbone *b, struct bb_node *n)
{
    int64_t now = (int64_t)time(NULL);
    if (b->srv->cfg->relay_reservations <= 0 || now - n->relay_put_at < 30)
        return;
    char key[CM_NAME_MAX + 16], value[340];
    snprintf(key, sizeof key, "%s/relays", n->run);
    snprintf(value, sizeof value, "%s backbone", n->address);
    int stored = 0;
    if (dht_put(n->node, key, strlen(key), "p", 1, value, strlen(value), p2p_now_ms() + 90000, 3000,
                &stored) == CM_OK)
        n->relay_put_at = now;
}

static void unpublish(struct coord_backbone *b, struct bb_node *n)
{
    char rid[24];
    snprintf(rid, sizeof rid, "%lld", (long long)n->run_id);
    const char *p[] = {rid, b->srv->kid};
    PQclear(q(b->pg, "DELETE FROM dht_backbones WHERE run_id = $1 AND kid = $2", 2, p));
}

static void sync_nodes(struct coord_backbone *b)
{
    if (PQstatus(b->pg) != CONNECTION_OK)
        PQreset(b->pg);
    PGresult *r = q(b->pg, "SELECT id, name FROM runs WHERE status = 'open' ORDER BY id", 0, NULL);
    if (!r)
        return;
    int64_t now = (int64_t)time(NULL);
    /* stop nodes of runs that closed, and nodes whose token needs renewing */
    for (struct bb_node **pp = &b->nodes; *pp;) {
        struct bb_node *n = *pp;
        int open = 0;
        for (int i = 0; i < PQntuples(r); i++)
            open |= strtoll(PQgetvalue(r, i, 0), NULL, 10) == n->run_id;
        if (open && n->token_exp - now > BB_RENEW_BEFORE_S) {
            pp = &n->next;
            continue;
        }
        CM_LOGI("backbone", "stopping the DHT node of run %s (%s)", n->run,
                open ? "renewing its token" : "run no longer open");
        pthread_rwlock_wrlock(&b->nodes_lock);
        *pp = n->next;
        pthread_rwlock_unlock(&b->nodes_lock);
        unpublish(b, n);
        dht_node_stop(n->node);
        free(n);
    }
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        struct bb_node *n = b->nodes;
        while (n && n->run_id != id)
            n = n->next;
        if (n)
            continue;
        if (start_node(b, id, PQgetvalue(r, i, 1), &n) == CM_OK) {
            pthread_rwlock_wrlock(&b->nodes_lock);
            n->next = b->nodes;
            b->nodes = n;
            pthread_rwlock_unlock(&b->nodes_lock);
        }
    }
    PQclear(r);
    for (struct bb_node *n = b->nodes; n; n = n->next)
        publish(b, n);
}

static void *manager(void *arg)
{
    struct coord_backbone *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->stop) {
        pthread_mutex_unlock(&b->mu);
        sync_nodes(b);
        pthread_mutex_lock(&b->mu);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += BB_PERIOD_S;
        while (!b->stop && !b->poked && pthread_cond_timedwait(&b->cv, &b->mu, &dl) != ETIMEDOUT)
            ;
        b->poked = 0;
    }
    pthread_mutex_unlock(&b->mu);
    pthread_rwlock_wrlock(&b->nodes_lock);
    struct bb_node *list = b->nodes;
    b->nodes = NULL;
    pthread_rwlock_unlock(&b->nodes_lock);
    for (struct bb_node *n = list, *x; n; n = x) {
        x = n->next;
        unpublish(b, n);
        dht_node_stop(n->node);
        free(n);
    }
    return NULL;
}

/* The process's manager, so request handlers can wake it when a run opens. */
static struct coord_backbone *g_backbone;

void coord_backbone_poke(void)
{
    struct coord_backbone *b = g_backbone;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->poked = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int coord_backbone_dialback(const char *run, const struct sockaddr_storage *addrs, size_t naddrs,
                            const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms, int *status,
                            uint32_t *ms)
{
    struct coord_backbone *b = g_backbone;
    if (!b)
        return CM_ENOTFOUND;
    pthread_rwlock_rdlock(&b->nodes_lock);
    struct bb_node *n = b->nodes;
    while (n && strcmp(n->run, run) != 0)
        n = n->next;
    int rc = n ? dht_ping(n->node, addrs, naddrs, pub, timeout_ms, status, ms) : CM_ENOTFOUND;
    pthread_rwlock_unlock(&b->nodes_lock);
    return rc;
}

/* One leaf key's declarations appended to ex, uid by uid in grid order:
 * {"uid", "servers": [...]}. */
static void moe_leaf(struct dht_node *node, const char *run, const struct moe_grid *g, const struct moe_uid *pre,
                     uint32_t deadline_ms, int64_t now_ms, json_t *ex, int *failed)
{
    struct moe_entry *e = NULL;
    size_t n = 0;
    int rc = moe_dht_get_prefix(node, run, g, pre, deadline_ms, &e, &n);
    if (rc != CM_OK && rc != CM_ENOTFOUND) {
        (*failed)++;
        return;
    }
    for (int i = 0; i < g->size; i++) {
        json_t *list = NULL;
        for (size_t k = 0; k < n; k++) {
            if (e[k].rec.kind != MOE_REC_LEAF || !moe_rec_has(&e[k].rec, i))
                continue;
            char peer[64];
            cm_b64url_encode(e[k].rec.server.pub, 32, peer);
            int64_t left = (e[k].expires_ms - now_ms + 999) / 1000;
            if (!list)
                list = json_array();
            json_array_append_new(list, json_pack("{s:s, s:s, s:I}", "addr", e[k].rec.server.addr, "peer", peer,
                                                  "expires_in_s", (json_int_t)(left > 0 ? left : 0)));
        }
        struct moe_uid u = *pre;
        u.idx[u.n++] = (uint16_t)i;
        char uid[MOE_UID_TEXT_MAX];
        if (list && moe_uid_format(g, &u, uid, sizeof uid) == CM_OK)
            json_array_append_new(ex, json_pack("{s:s, s:o}", "uid", uid, "servers", list));
        else
            json_decref(list);
    }
    free(e);
}

int coord_backbone_moe_servers(const char *run, const struct moe_grid *g, uint32_t deadline_ms, json_t **out,
                               int *complete)
{
    *out = NULL;
    *complete = 0;
    struct coord_backbone *b = g_backbone;
    if (!b)
        return CM_ENOTFOUND;
    /* the leaf keys: every prefix of dims - 1 indices */
    long nkeys = 1;
    for (int d = 0; d + 1 < g->dims; d++)
        nkeys *= g->size;
    if (nkeys > COORD_MOE_MAX_LEAVES)
        return CM_ERANGE;
    json_t *ex = json_array();
    if (!ex)
        return CM_ENOMEM;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t0 = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    int failed = 0, rc = CM_OK;
    long done = 0;
    pthread_rwlock_rdlock(&b->nodes_lock);
    struct bb_node *n = b->nodes;
    while (n && strcmp(n->run, run) != 0)
        n = n->next;
    if (!n)
        rc = CM_ENOTFOUND;
    for (long k = 0; n && k < nkeys; k++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double left_ms = deadline_ms - ((double)ts.tv_sec + ts.tv_nsec / 1e9 - t0) * 1000;
        if (left_ms < 50)
            break;
        struct moe_uid pre = {0};
        long r = k;
        for (int d = g->dims - 2; d >= 0; d--, r /= g->size)
            pre.idx[d] = (uint16_t)(r % g->size);
        pre.n = g->dims - 1;
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        moe_leaf(n->node, run, g, &pre, (uint32_t)(left_ms < 2000 ? left_ms : 2000),
                 (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000, ex, &failed);
        done++;
    }
    pthread_rwlock_unlock(&b->nodes_lock);
    if (rc != CM_OK) {
        json_decref(ex);
        return rc;
    }
    *complete = done == nkeys && !failed;
    *out = ex;
    return CM_OK;
}

int coord_backbone_start(struct coord_server *srv, struct coord_backbone **out)
{
    const struct coord_config *cfg = srv->cfg;
    *out = NULL;
    if (cfg->dht_port < 0)
        return CM_OK;
    struct coord_backbone *b = calloc(1, sizeof *b);
    if (!b)
        return CM_ENOMEM;
    b->srv = srv;
    b->port_base = cfg->dht_port;
    snprintf(b->listen_ip, sizeof b->listen_ip, "%s", cfg->dht_listen_ip);
    snprintf(b->advertise, sizeof b->advertise, "%s", cfg->dht_advertise);
    char keypath[4200];
    snprintf(keypath, sizeof keypath, "%s/dht-ed25519.pem", cfg->data_dir);
    int rc = cm_ed25519_load_or_create(&b->key, keypath, NULL);
    if (rc == CM_OK)
        rc = coord_db_connect(cfg->database_url, 30000, &b->pg);
    if (rc != CM_OK) {
        cm_ed25519_cleanup(&b->key);
        free(b);
        return rc;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_rwlock_init(&b->nodes_lock, NULL);
    /* The first pass runs here, so nodes exist before the API serves passes. */
    sync_nodes(b);
    if (pthread_create(&b->th, NULL, manager, b) != 0) {
        PQfinish(b->pg);
        cm_ed25519_cleanup(&b->key);
        free(b);
        return CM_EIO;
    }
    *out = b;
    g_backbone = b;
    return CM_OK;
}

void coord_backbone_stop(struct coord_backbone *b)
{
    if (!b)
        return;
    g_backbone = NULL;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL);
    PQfinish(b->pg);
    cm_ed25519_cleanup(&b->key);
    pthread_rwlock_destroy(&b->nodes_lock);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

/* A tiny per-run cache of the bootstrap list, so pass issuance stays one
 * statement in the common case. */
#define BOOT_CACHE_SLOTS 64
#define BOOT_CACHE_S 2
struct boot_slot {
    char run[CM_NAME_MAX + 1];
    json_t *list;
    time_t at;
};
static struct boot_slot g_boot[BOOT_CACHE_SLOTS];
static pthread_mutex_t g_boot_mu = PTHREAD_MUTEX_INITIALIZER;

COORD_DB_STMT(S_BOOT, 1,
              "SELECT b.address FROM dht_backbones b JOIN runs r ON r.id = b.run_id "
              "WHERE r.name = $1 AND b.updated_at > now() - make_interval(secs => 30) "
              "ORDER BY b.kid");

json_t *coord_backbone_bootstrap(struct coord_req *req)
{
    const char *run = req->params[0];
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(run, strlen(run), h);
    struct boot_slot *s = &g_boot[h[0] % BOOT_CACHE_SLOTS];
    time_t now = time(NULL);
    pthread_mutex_lock(&g_boot_mu);
    if (s->list && !strcmp(s->run, run) && now - s->at < BOOT_CACHE_S) {
        json_t *out = json_deep_copy(s->list);
        pthread_mutex_unlock(&g_boot_mu);
        return out;
    }
    pthread_mutex_unlock(&g_boot_mu);
    json_t *a = json_array();
    const char *p[] = {run};
    PGresult *r = req->db ? coord_db_exec(req->db, &S_BOOT, p, NULL) : NULL;
    for (int i = 0; r && i < PQntuples(r); i++)
        json_array_append_new(a, json_string(PQgetvalue(r, i, 0)));
    PQclear(r);
    pthread_mutex_lock(&g_boot_mu);
    json_decref(s->list);
    s->list = json_deep_copy(a);
    snprintf(s->run, sizeof s->run, "%s", run);
    s->at = now;
    pthread_mutex_unlock(&g_boot_mu);
    return a;
}
