/* libFuzzer target for p2p_probe_pull_parse, which the coordinator's
 * backbone node runs on every P2P_MSG_PROBE_PULL request body a peer sends
 * (docs/protocol.md, "Link probes"). Whatever it accepts must ask for 1 to
 * P2P_PROBE_CHUNK bytes and encode back to the same 4 bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_probe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t want = 0;
    if (p2p_probe_pull_parse(data, size, &want) != CM_OK)
        return 0;
    uint8_t again[4];
    p2p_probe_pull_encode(want, again);
    if (size != 4 || want == 0 || want > P2P_PROBE_CHUNK || memcmp(again, data, 4) != 0)
        __builtin_trap();
    return 0;
}
