/* libFuzzer target for dtfm_payload_decode, the parser every agent runs on
 * the pipeline assignment it receives from a coordinator (seed 003 §2-3;
 * docs/protocol.md, "Pipeline schedules"). Whatever it accepts must satisfy
 * the decoder's promises and survive an encode/decode round trip. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched/dtfm.h"
#include "sched/dtfm_payload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dtfm_payload p;
    char err[256];
    if (dtfm_payload_decode((const char *)data, size, &p, err, sizeof err) != 0)
        return 0;
    if (p.stages < 1 || p.stages > DTFM_MAX_STAGES || p.replicas < 1 || p.replicas > DTFM_MAX_REPLICAS ||
        p.stages * p.replicas > DTFM_PAYLOAD_MAX_SLOTS || !p.assign || p.nspares > DTFM_PAYLOAD_MAX_SPARES ||
        p.valid_until <= p.valid_from || p.version < 1)
        __builtin_trap();
    for (size_t k = 0; k < p.stages * p.replicas; k++) {
        size_t r = 0, s = 0;
        if (dtfm_payload_find(&p, p.assign[k], &r, &s) != 0 || r * p.stages + s != k)
            __builtin_trap(); /* every key once */
    }
    char *json = NULL;
    size_t len = 0;
    struct dtfm_payload again;
    if (dtfm_payload_encode(&p, &json, &len) != 0 ||
        dtfm_payload_decode(json, len, &again, err, sizeof err) != 0 || again.stages != p.stages ||
        again.replicas != p.replicas || again.nspares != p.nspares || again.version != p.version ||
        memcmp(again.assign, p.assign, p.stages * p.replicas * sizeof *p.assign) != 0)
        __builtin_trap();
    free(json);
    dtfm_payload_cleanup(&again);
    dtfm_payload_cleanup(&p);
    return 0;
}
