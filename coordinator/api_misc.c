/* Health, the coordinator's clock, the OpenAPI document, Prometheus
 * metrics and the coordinators' public signing keys. */
#include "coordinator/api.h"
#include "coordinator/metrics.h"
#include "coordinator/migrate.h"
#include "cm_embed.h"
#include "cm_err.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const struct cm_embedded coord_docs[];
extern const unsigned coord_docs_count;

#ifndef CROWDTRAIN_VERSION
#define CROWDTRAIN_VERSION "0.1.0"
#endif

COORD_DB_STMT(S_PING, 0, "SELECT coalesce(max(version), 0) FROM schema_migrations");

void api_health(struct coord_req *req, struct coord_resp *resp)
{
    struct coord_resp tmp = {0};
    struct coord_db_conn *db = coord_req_db(req, &tmp);
    json_decref(tmp.json);
    PGresult *r = db ? coord_db_exec(db, &S_PING, NULL, NULL) : NULL;
    if (!r) {
        coord_resp_json(resp, 503,
                        json_pack("{s:s, s:s, s:s}", "status", "degraded", "database",
                                  "unreachable", "version", CROWDTRAIN_VERSION));
        return;
    }
    int schema = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:s, s:i, s:s, s:i}", "status", "ok", "database", "ok",
                              "schema_version", schema, "version", CROWDTRAIN_VERSION,
                              "inflight", atomic_load(&req->srv->inflight)));
}

/* The coordinator's clock in ms since the epoch, read when the answer is
 * built (no database): agents measure their offset from it (round trip
 * halved) and time the collaboration's windows with the corrected clock,
 * since a volunteer's clock off by a second would otherwise put its
 * announcements outside every round window (docs/collaboration.md). */
void api_time(struct coord_req *req, struct coord_resp *resp)
{
    (void)req;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    json_int_t ms = (json_int_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
    coord_resp_json(resp, 200, json_pack("{s:I}", "time_ms", ms));
}

void api_openapi(struct coord_req *req, struct coord_resp *resp)
{
    (void)req;
    for (unsigned i = 0; i < coord_docs_count; i++) {
        if (!strcmp(coord_docs[i].name, "openapi.json")) {
            coord_resp_raw(resp, 200, "application/json", coord_docs[i].data, coord_docs[i].len);
            return;
        }
    }
    coord_resp_error(resp, 500, "internal", "the OpenAPI document is missing from this build");
}

void api_metrics(struct coord_req *req, struct coord_resp *resp)
{
    char *text = NULL;
    size_t len = 0;
    if (coord_metrics_render(req->srv, &text, &len) != CM_OK) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    resp->raw = text;
    resp->raw_len = len;
    resp->content_type = "text/plain; version=0.0.4";
    resp->status = 200;
}

COORD_DB_STMT(S_KEYS, 0,
              "SELECT kid, encode(public_key, 'hex'), extract(epoch from created_at)::bigint "
              "FROM signing_keys ORDER BY created_at");

void api_keys(struct coord_req *req, struct coord_resp *resp)
{
    struct coord_db_conn *db = coord_req_db(req, resp);
    if (!db)
        return;
    PGresult *r = coord_db_exec(db, &S_KEYS, NULL, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "could not read the keys");
        return;
    }
    json_t *keys = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        char b64url[64];
        uint8_t raw[CM_ED25519_PUB_LEN];
        size_t n = 0;
        const char *hex = PQgetvalue(r, i, 1);
        if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) != CM_OK || n != sizeof raw)
            continue;
        cm_b64url_encode(raw, sizeof raw, b64url);
        json_array_append_new(
            keys, json_pack("{s:s, s:s, s:s, s:s, s:I, s:b}", "kid", PQgetvalue(r, i, 0), "alg",
                            "EdDSA", "crv", "Ed25519", "public_key", b64url, "created_at",
                            (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10), "current",
                            !strcmp(PQgetvalue(r, i, 0), req->srv->kid)));
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:o, s:s}", "keys", keys, "current_kid", req->srv->kid));
}
