/* Dial-back reachability checks (docs/p2p.md, "Reachability"; issue 17;
 * seed 000_02cc6b5d62a616fc.txt §3.3: peers behind NAT cannot accept
 * connections and must be found out, not assumed).
 *
 * POST /api/v1/runs/{run}/reachability {peer_public_key, ports: [...]}
 *
 * An agent that has just started listening asks: which address do you see
 * me at, and can you reach me there? The coordinator takes the address of
 * the HTTPS connection (what the Internet sees: behind NAT, the router's
 * public address), and its DHT backbone node of the run pings every given
 * port there with a p2p Ping addressed to the peer key. Only the holder of
 * that key can answer (the transport checks the responder's signature), so
 * a port that reaches another host, or another peer of the same host, is
 * unreachable. The check only ever connects to the caller's own address:
 * it cannot be pointed at a third party. */
#include "coordinator/api.h"
#include "coordinator/backbone.h"
#include "coordinator/db.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_json.h"
#include "cm_log.h"
#include "p2p/p2p_transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define REACH_MAX_PORTS 4
#define REACH_TIMEOUT_MS 3000

/* Checks in flight. Each waits up to REACH_TIMEOUT_MS on the network (a
 * home router that drops the dial-back answers nothing), on a thread of its
 * own with its connection parked (coord_req_defer): a server thread waiting
 * there held every other connection it polls, and agents on public hosts
 * learned their reachability 3-4 s late when NAT'ed ones joined beside them
 * (test_hosts). Beyond REACH_MAX_INFLIGHT a caller is told to retry. */
#define REACH_MAX_INFLIGHT 64
static int g_inflight;

struct reach_call {
    char run[CM_NAME_MAX + 1];
    char ip[64];
    char pks[48];
    uint8_t pk[CM_ED25519_PUB_LEN];
    size_t np;
    uint16_t port[REACH_MAX_PORTS];
    struct sockaddr_storage addrs[REACH_MAX_PORTS];
    int rc;
    int st[REACH_MAX_PORTS];
    uint32_t ms[REACH_MAX_PORTS];
    struct coord_deferred *ticket;
};

static void reach_dial(struct reach_call *c)
{
    c->rc = coord_backbone_dialback(c->run, c->addrs, c->np, c->pk, REACH_TIMEOUT_MS, c->st, c->ms);
    __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL);
}

static void *reach_thread(void *arg)
{
    struct reach_call *c = arg;
    struct coord_deferred *t = c->ticket;
    reach_dial(c);
    coord_deferred_done(t); /* c may be gone from here on */
    return NULL;
}

/* On a server thread: the answer from what the dial-back found. */
static void reach_finish(void *ctx, struct coord_req *req, struct coord_resp *resp)
{
    (void)req;
    struct reach_call *c = ctx;
    if (c->rc == CM_ENOTFOUND) {
        snprintf(resp->retry_after, sizeof resp->retry_after, "2");
        coord_resp_error(resp, 503, "no_backbone",
                         "this coordinator runs no DHT node for run '%s' (yet); retry shortly", c->run);
        return;
    }
    if (c->rc != CM_OK) {
        coord_resp_error(resp, 503, "dial_back_failed", "the dial-back did not complete: %s", cm_strerror(c->rc));
        return;
    }
    json_t *arr = json_array();
    int all = 1;
    char summary[160] = "";
    size_t off = 0;
    for (size_t i = 0; i < c->np; i++) {
        json_t *o = json_pack("{s:i, s:b, s:i}", "port", (int)c->port[i], "reachable", c->st[i] == CM_OK, "ms",
                              (int)c->ms[i]);
        if (c->st[i] != CM_OK) {
            all = 0;
            json_object_set_new(o, "error", json_string(cm_strerror(c->st[i])));
        }
        json_array_append_new(arr, o);
        if (off < sizeof summary)
            off += (size_t)snprintf(summary + off, sizeof summary - off, "%s%u %s", i ? ", " : "", c->port[i],
                                    c->st[i] == CM_OK ? "ok" : cm_strerror(c->st[i]));
    }
    CM_LOGI("reach", "run %s: peer %.12s... at %s is %s (%s)", c->run, c->pks, c->ip,
            all ? "reachable" : "not reachable", summary);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:o, s:i}", "observed_ip", c->ip, "reachable", all, "ports",
                              arr, "timeout_ms", REACH_TIMEOUT_MS));
}

void api_reachability_post(struct coord_req *req, struct coord_resp *resp)
{
    static const struct cm_json_field F[] = {
        {"peer_public_key", CM_J_STRING, 1, 43, 43},
        {"ports", CM_J_ARRAY, 1, 1, 0},
    };
    if (!api_name_param(req, resp, 0, "run") || !coord_req_check(req, resp, F, sizeof F / sizeof F[0]))
        return;
    uint8_t pk[CM_ED25519_PUB_LEN];
    const char *pks = json_string_value(json_object_get(req->json, "peer_public_key"));
    size_t kn = 0;
    if (cm_b64url_decode(pks, strlen(pks), pk, sizeof pk, &kn) != CM_OK || kn != sizeof pk) {
        coord_resp_error(resp, 400, "invalid_request",
                         "field 'peer_public_key': base64url (no padding) of a 32-byte Ed25519 public key");
        return;
    }
    json_t *ports = json_object_get(req->json, "ports");
    size_t np = json_array_size(ports);
    if (np < 1 || np > REACH_MAX_PORTS) {
        coord_resp_error(resp, 400, "invalid_request", "field 'ports': 1 to %d ports", REACH_MAX_PORTS);
        return;
    }
    uint16_t port[REACH_MAX_PORTS];
    for (size_t i = 0; i < np; i++) {
        json_t *v = json_array_get(ports, i);
        json_int_t p = json_integer_value(v);
        if (!json_is_integer(v) || p < 1 || p > 65535) {
            coord_resp_error(resp, 400, "invalid_request", "field 'ports[%zu]': an integer in [1, 65535]", i);
            return;
        }
        port[i] = (uint16_t)p;
        for (size_t k = 0; k < i; k++)
            if (port[k] == port[i]) {
                coord_resp_error(resp, 400, "invalid_request", "field 'ports': port %u twice", port[i]);
                return;
            }
    }
    struct reach_call *c = calloc(1, sizeof *c);
    if (!c) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    snprintf(c->run, sizeof c->run, "%s", req->params[0]);
    snprintf(c->pks, sizeof c->pks, "%s", pks);
    memcpy(c->pk, pk, sizeof pk);
    memcpy(c->port, port, sizeof port);
    c->np = np;
    /* announce and dial the address as peers would (api_peer_ip) */
    snprintf(c->ip, sizeof c->ip, "%s", api_peer_ip(req));
    for (size_t i = 0; i < np; i++) {
        char a[96];
        snprintf(a, sizeof a, strchr(c->ip, ':') ? "[%s]:%u" : "%s:%u", c->ip, port[i]);
        if (p2p_addr_parse(a, &c->addrs[i]) != CM_OK) {
            free(c);
            coord_resp_error(resp, 500, "internal", "the connection's address is unknown");
            return;
        }
    }
    char pass_id[24], run_id[24];
    if (!coord_req_db(req, resp) || !api_peer_pass(req, resp, pk, pass_id, run_id)) {
        free(c);
        return;
    }
    /* the database connection goes back to the pool while we wait on the network */
    coord_db_release(req->srv->db, req->db);
    req->db = NULL;
    if (__atomic_add_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL) > REACH_MAX_INFLIGHT) {
        __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL);
        free(c);
        snprintf(resp->retry_after, sizeof resp->retry_after, "1");
        coord_resp_error(resp, 503, "busy", "too many reachability checks at once; retry in a second");
        return;
    }
    c->ticket = coord_req_defer(req, reach_finish, free, c);
    pthread_attr_t at;
    pthread_t th;
    int started = 0;
    if (c->ticket && pthread_attr_init(&at) == 0) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&th, &at, reach_thread, c) == 0;
        pthread_attr_destroy(&at);
    }
    if (c->ticket) {
        if (!started) { /* no thread: answered at once (503) */
            c->rc = CM_ENOMEM;
            __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL);
            coord_deferred_done(c->ticket);
        }
        return;
    }
    /* cannot park the connection: dial here */
    reach_dial(c);
    reach_finish(c, req, resp);
    free(c);
}
