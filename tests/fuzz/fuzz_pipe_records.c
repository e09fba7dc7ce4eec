/* libFuzzer target: the stage agents' DHT record values (agent/pipe/records.h),
 * written by other agents. The first byte picks the parser and, for the
 * "ready" record, the stage count; a value taken is printed back and must
 * be the same bytes (the canonical form is the only one accepted). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/records.h"
#include "cm_err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    if (sel & 1) {
        char st[PEER_ADDR_MAX], ar[PEER_ADDR_MAX], again[2 * PEER_ADDR_MAX + 2];
        if (pipe_peers_parse(data, size, st, ar) == CM_OK) {
            int n = snprintf(again, sizeof again, "%s %s", st, ar);
            if (n < 0 || (size_t)n != size || memcmp(again, data, size))
                abort();
        }
    } else {
        int64_t hv, done;
        int hs;
        uint32_t S = 1 + (sel >> 1) % 64;
        if (pipe_ready_parse(data, size, 1 + (sel >> 2), S, &hv, &hs, &done) == CM_OK) {
            char again[96];
            int n = snprintf(again, sizeof again, "%lld %d %lld", (long long)hv, hs, (long long)done);
            if (n < 0 || (size_t)n != size || memcmp(again, data, size) || hs >= (int)S || hv < 0 || done < 0)
                abort();
        }
    }
    return 0;
}
