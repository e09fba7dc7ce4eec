/* The newest signed document of a run and the answer that serves it
 * (signed_doc.h). */
#include "coordinator/signed_doc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

void coord_newest_clear(struct coord_newest *nw)
{
    free(nw->payload);
    memset(nw, 0, sizeof *nw);
}

int coord_newest_load(struct coord_req *req, struct coord_db_stmt *stmt, const char *run_id,
                      struct coord_newest *nw)
{
    coord_newest_clear(nw);
    const char *p[] = {run_id};
    PGresult *r = coord_db_exec(req->db, stmt, p, NULL);
    if (!r)
        return CM_EDB;
    if (PQntuples(r) == 1) {
        nw->have = 1;
        nw->version = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        snprintf(nw->sha, sizeof nw->sha, "%s", PQgetvalue(r, 0, 1));
        nw->created = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        nw->from = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
        nw->until = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
        nw->payload = strdup(PQgetvalue(r, 0, 5));
        snprintf(nw->sig_hex, sizeof nw->sig_hex, "%s", PQgetvalue(r, 0, 6));
        snprintf(nw->kid, sizeof nw->kid, "%s", PQgetvalue(r, 0, 7));
        nw->solve_ms = strtod(PQgetvalue(r, 0, 8), NULL);
    }
    PQclear(r);
    return nw->have && !nw->payload ? CM_ENOMEM : CM_OK;
}

void coord_newest_respond(struct coord_req *req, struct coord_resp *resp, const struct coord_newest *nw,
                          int fresh, const char *field, const char *what)
{
    uint8_t sig[CM_ED25519_SIG_LEN];
    size_t n = 0, plen = strlen(nw->payload);
    char sig64[128], pub[64] = "";
    char *p64 = malloc(cm_b64url_encoded_len(plen) + 1);
    json_t *doc = json_loads(nw->payload, 0, NULL);
    if (!p64 || !doc ||
        cm_hex_decode(nw->sig_hex, strlen(nw->sig_hex), sig, sizeof sig, &n) != CM_OK ||
        n != sizeof sig) {
        free(p64);
        json_decref(doc);
        coord_resp_error(resp, 500, "internal", "stored %s is unreadable", what);
        return;
    }
    cm_b64url_encode(nw->payload, plen, p64);
    cm_b64url_encode(sig, sizeof sig, sig64);
    /* The signer's published key; a document signed by another coordinator
       names its kid. */
    if (!strcmp(nw->kid, req->srv->kid))
        cm_b64url_encode(req->srv->signing_key.pub, CM_ED25519_PUB_LEN, pub);
    json_t *o = json_pack("{s:s, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:b, s:o}", "run",
                          req->params[0], "version", (json_int_t)nw->version, "kid", nw->kid,
                          "payload", p64, "signature", sig64, "valid_from",
                          (json_int_t)nw->from, "valid_until", (json_int_t)nw->until,
                          "created_at", (json_int_t)nw->created, "solve_ms", nw->solve_ms,
                          "solved_now", fresh, field, doc);
    free(p64);
    if (o && pub[0])
        json_object_set_new(o, "coordinator_public_key", json_string(pub));
    if (!o) {
        coord_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    coord_resp_json(resp, 200, o);
}

int coord_doc_digest(const json_t *doc, char sha[65])
{
    if (!doc)
        return CM_EINVAL;
    char *txt = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    if (!txt)
        return CM_ENOMEM;
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(txt, strlen(txt), h);
    cm_hex_encode(h, sizeof h, sha);
    free(txt);
    return CM_OK;
}
