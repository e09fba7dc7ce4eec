/* libFuzzer target for peer_reach_parse, which reads the coordinator's
 * answer to a dial-back check (POST /api/v1/runs/{run}/reachability;
 * docs/p2p.md, "Reachability") before the agent decides what address to
 * announce. Whatever it accepts must satisfy its promises: a numeric
 * observed address, 1..4 nonzero ports, and `reachable` exactly when every
 * port was reached. */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "agent/peer/reach.h"
#include "cm_err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!j)
        return 0;
    struct peer_reach_result r;
    if (peer_reach_parse(j, &r) == CM_OK) {
        unsigned char a[16];
        int all = 1;
        if (r.n < 1 || r.n > PEER_REACH_MAX_PORTS ||
            (inet_pton(AF_INET, r.observed_ip, a) != 1 && inet_pton(AF_INET6, r.observed_ip, a) != 1))
            __builtin_trap();
        for (size_t i = 0; i < r.n; i++) {
            if (r.port[i] == 0 || memchr(r.error[i], 0, sizeof r.error[i]) == NULL)
                __builtin_trap();
            all &= r.ok[i];
        }
        if (all != r.reachable)
            __builtin_trap();
    }
    json_decref(j);
    return 0;
}
