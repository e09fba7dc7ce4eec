/* libFuzzer target for what the coordinator reads from a pass request body
 * (POST /api/v1/runs/{run}/passes, docs/protocol.md "Pass requests"):
 * cm_json_parse_object, then cm_passreq_from_json (the four fields,
 * canonical base64url, bounded time), then the signed bytes, the weak-key
 * check and the signature check, as api_passes.c runs them. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_json.h"
#include "cm_passreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    json_t *j = cm_json_parse_object((const char *)data, size, err, sizeof err);
    if (!j)
        return 0;
    struct cm_passreq r;
    err[0] = '\0';
    if (cm_passreq_from_json(j, &r, err, sizeof err) == CM_OK) {
        uint8_t msg[CM_PASSREQ_BYTES_MAX];
        size_t n = 0;
        /* every decoded request has signed bytes within the bound */
        if (r.timestamp < 0 || r.timestamp > CM_PASSREQ_TS_MAX ||
            cm_passreq_signed_bytes("fmnist", "alice", &r, msg, sizeof msg, &n) != CM_OK ||
            n >= sizeof msg)
            __builtin_trap();
        /* a round trip through the encoder gives the same request */
        json_t *back = cm_passreq_to_json(&r);
        struct cm_passreq r2;
        if (!back || cm_passreq_from_json(back, &r2, err, sizeof err) != CM_OK || memcmp(&r, &r2, sizeof r))
            __builtin_trap();
        json_decref(back);
        (void)cm_passreq_verify("fmnist", "alice", &r);
    } else if (!err[0]) {
        __builtin_trap(); /* a refusal always explains itself */
    }
    json_decref(j);
    return 0;
}
