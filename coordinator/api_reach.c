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

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define REACH_MAX_PORTS 4
#define REACH_TIMEOUT_MS 3000

/* Checks in flight, at most half the handler threads (others keep serving). */
static int g_inflight;

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
    /* announce and dial the address as peers would (api_peer_ip) */
    const char *ip = api_peer_ip(req);
    struct sockaddr_storage addrs[REACH_MAX_PORTS];
    for (size_t i = 0; i < np; i++) {
        char a[96];
        snprintf(a, sizeof a, strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip, port[i]);
        if (p2p_addr_parse(a, &addrs[i]) != CM_OK) {
            coord_resp_error(resp, 500, "internal", "the connection's address is unknown");
            return;
        }
    }
    char pass_id[24], run_id[24];
    if (!coord_req_db(req, resp) || !api_peer_pass(req, resp, pk, pass_id, run_id))
        return;
    /* the database connection goes back to the pool while we wait on the network */
    coord_db_release(req->srv->db, req->db);
    req->db = NULL;
    long cap = req->srv->cfg->threads / 2 > 0 ? req->srv->cfg->threads / 2 : 1;
    if (__atomic_add_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL) > cap) {
        __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL);
        snprintf(resp->retry_after, sizeof resp->retry_after, "1");
        coord_resp_error(resp, 503, "busy", "too many reachability checks at once; retry in a second");
        return;
    }
    int st[REACH_MAX_PORTS];
    uint32_t ms[REACH_MAX_PORTS];
    int rc = coord_backbone_dialback(req->params[0], addrs, np, pk, REACH_TIMEOUT_MS, st, ms);
    __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_ACQ_REL);
    if (rc == CM_ENOTFOUND) {
        snprintf(resp->retry_after, sizeof resp->retry_after, "2");
        coord_resp_error(resp, 503, "no_backbone",
                         "this coordinator runs no DHT node for run '%s' (yet); retry shortly", req->params[0]);
        return;
    }
    if (rc != CM_OK) {
        coord_resp_error(resp, 503, "dial_back_failed", "the dial-back did not complete: %s", cm_strerror(rc));
        return;
    }
    json_t *arr = json_array();
    int all = 1;
    char summary[160] = "";
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        json_t *o = json_pack("{s:i, s:b, s:i}", "port", (int)port[i], "reachable", st[i] == CM_OK, "ms",
                              (int)ms[i]);
        if (st[i] != CM_OK) {
            all = 0;
            json_object_set_new(o, "error", json_string(cm_strerror(st[i])));
        }
        json_array_append_new(arr, o);
        if (off < sizeof summary)
            off += (size_t)snprintf(summary + off, sizeof summary - off, "%s%u %s", i ? ", " : "", port[i],
                                    st[i] == CM_OK ? "ok" : cm_strerror(st[i]));
    }
    CM_LOGI("reach", "run %s: peer %.12s... at %s is %s (%s)", req->params[0], pks, ip,
            all ? "reachable" : "not reachable", summary);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:b, s:o, s:i}", "observed_ip", ip, "reachable", all, "ports",
                              arr, "timeout_ms", REACH_TIMEOUT_MS));
}
