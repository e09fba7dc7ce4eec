/* libFuzzer target for peer_relay_entry_parse, which reads the entries
 * relays put under "<run>/relays" in the DHT (any peer of the run may
 * write one; docs/p2p.md, "Relays in the agent"). Whatever it accepts must
 * keep its promises: a NUL-terminated, non-empty address without spaces,
 * a load within bounds, and the form the bytes had; and ranking what it
 * accepted must not read past the candidates. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "agent/peer/relay_rank.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct peer_relay_cand c[2];
    memset(c, 0, sizeof c);
    if (peer_relay_entry_parse(data, size, &c[0]) != 0)
        return 0;
    size_t al = strnlen(c[0].addr, sizeof c[0].addr);
    if (al == 0 || al >= sizeof c[0].addr || strchr(c[0].addr, ' ') || c[0].load > PEER_RELAY_LOAD_MAX ||
        (c[0].backbone && c[0].load) || al > size)
        __builtin_trap();
    char again[sizeof c[0].addr + 16];
    if (!c[0].backbone) { /* a volunteer's entry formats back to what parses the same */
        peer_relay_entry_format(again, sizeof again, c[0].addr, c[0].load);
        if (peer_relay_entry_parse((const uint8_t *)again, strlen(again), &c[1]) != 0 ||
            strcmp(c[1].addr, c[0].addr) || c[1].load != c[0].load || c[1].backbone)
            __builtin_trap();
    }
    c[0].rtt_ms = 1e9;
    c[1].mbps = 10;
    uint8_t me[CM_ED25519_PUB_LEN] = {1};
    peer_relay_rank(c, 2, me);
    return 0;
}
