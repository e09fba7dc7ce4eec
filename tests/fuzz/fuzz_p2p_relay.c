/* libFuzzer target for the relay messages' parsers (p2p_msg.h), which a
 * relay runs on every RELAY_WAIT and RELAY_ACCEPT body and a reserving
 * peer on every RELAY_RESERVE and RELAY_WAIT answer (docs/protocol.md,
 * "Relays"), and both ends of a hole punch on every PUNCH offer ("Hole
 * punching"). Whatever a parser accepts must be within its bounds and
 * encode back to something that parses to the same value. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint16_t port = 0;
    uint8_t *out = NULL;
    size_t olen = 0;
    if (p2p_relay_port_parse(data, size, &port) == CM_OK) {
        if (port == 0 || p2p_relay_port_encode(port, &out, &olen))
            __builtin_trap();
        uint16_t again = 0;
        if (p2p_relay_port_parse(out, olen, &again) || again != port)
            __builtin_trap();
        free(out);
    }
    uint64_t ids[P2P_RELAY_MAX_ANNOUNCE], ids2[P2P_RELAY_MAX_ANNOUNCE];
    size_t n = 0, n2 = 0;
    if (p2p_relay_circuits_parse(data, size, ids, &n) == CM_OK) {
        if (n > P2P_RELAY_MAX_ANNOUNCE)
            __builtin_trap();
        for (size_t i = 0; i < n; i++)
            if (ids[i] == 0)
                __builtin_trap();
        if (p2p_relay_circuits_encode(ids, n, &out, &olen) ||
            p2p_relay_circuits_parse(out, olen, ids2, &n2) || n2 != n ||
            (n && memcmp(ids, ids2, n * sizeof ids[0])))
            __builtin_trap();
        free(out);
    }
    uint64_t id = 0, id2 = 0;
    if (p2p_relay_accept_parse(data, size, &id) == CM_OK) {
        if (id == 0 || p2p_relay_accept_encode(id, &out, &olen) ||
            p2p_relay_accept_parse(out, olen, &id2) || id2 != id)
            __builtin_trap();
        free(out);
    }
    struct p2p_punch_offer po, po2;
    if (p2p_punch_parse(data, size, &po) == CM_OK) {
        if ((po.iplen != 4 && po.iplen != 16) || po.port == 0 ||
            (po.local_iplen && po.local_iplen != po.iplen) || p2p_punch_encode(&po, &out, &olen) ||
            p2p_punch_parse(out, olen, &po2) || po2.iplen != po.iplen || po2.port != po.port ||
            po2.local_iplen != po.local_iplen || memcmp(po.ip, po2.ip, po.iplen) ||
            memcmp(po.local_ip, po2.local_ip, po.local_iplen))
            __builtin_trap();
        free(out);
    }
    return 0;
}
