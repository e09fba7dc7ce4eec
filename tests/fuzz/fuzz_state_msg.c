/* libFuzzer target for the state-transfer messages (agent/peer/state_msg.h):
 * requests a serving peer reads, answers a fetching peer reads. What parses
 * stays inside its bounds and re-encodes to the same header. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "agent/peer/state_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct peer_state_req q, q2;
    if (peer_state_req_parse(data, size, &q) == 0) {
        uint8_t b[PEER_STATE_REQ_LEN];
        peer_state_req_encode(&q, b);
        if (q.min_step < 0 || q.max_len == 0 || peer_state_req_parse(b, sizeof b, &q2) != 0 ||
            q.min_step != q2.min_step || q.offset != q2.offset || q.max_len != q2.max_len ||
            memcmp(b, data, sizeof b) != 0)
            __builtin_trap();
    }
    struct peer_state_resp r;
    if (peer_state_resp_parse(data, size, &r) == 0) {
        if (r.data + r.len != data + size || (r.ready && (r.len > r.total || r.total == 0)) ||
            (!r.ready && r.len))
            __builtin_trap();
        uint8_t h[PEER_STATE_HDR_LEN];
        peer_state_resp_header(&r, h);
        if (r.ready && memcmp(h, data, sizeof h) != 0)
            __builtin_trap();
    }
    return 0;
}
