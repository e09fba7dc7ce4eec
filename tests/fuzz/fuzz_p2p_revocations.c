/* libFuzzer target: the revocation-list JSON parser p2p_revocations_parse().
 * Seeds in tests/fuzz/corpus/p2p_revocations/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <string.h>
#include "p2p/p2p_revoke.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct p2p_revocations r;
    if (p2p_revocations_parse((const char *)data, size, "fm", &r) == 0) {
        for (size_t i = 0; i < r.n; i++)
            if (strlen(r.pass_ids[i]) == 0)
                abort();
        p2p_revocations_cleanup(&r);
    }
    return 0;
}
