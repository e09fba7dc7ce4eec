/* libFuzzer target: the session frame parser (p2p_session_parse) over a
 * frame payload, and the MAC check over the same bytes as a whole frame
 * (bounds, never a read past the input). Seeds in
 * tests/fuzz/corpus/p2p_session/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "p2p/p2p_frame.h"
#include "p2p/p2p_session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct p2p_session_msg m;
    if (p2p_session_parse(data, size, &m) == 0) {
        if (m.kind != 1 && m.kind != 2)
            abort();
        if (m.status > 0 || m.body < data ||
            m.body + m.body_len + P2P_SESSION_TAG_LEN != data + size ||
            m.tag != data + size - P2P_SESSION_TAG_LEN)
            abort();
    }
    static struct p2p_mac mac;
    static int ready;
    if (!ready) {
        uint8_t key[P2P_SESSION_KEY_LEN] = {7};
        if (p2p_mac_init(&mac, key))
            abort();
        ready = 1;
    }
    uint64_t seq = mac.seq;
    if (p2p_mac_verify(&mac, data, size) == 0 && mac.seq != seq + 1)
        abort();
    return 0;
}
