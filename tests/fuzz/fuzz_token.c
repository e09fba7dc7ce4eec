/* libFuzzer target for cm_token_parse, the parser every peer runs on access
 * tokens received from the network (seed 000, Appendix H.4). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm_token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cm_pass_claims c;
    uint8_t sig[CM_ED25519_SIG_LEN];
    size_t signed_len = 0;
    if (cm_token_parse((const char *)data, size, &c, sig, &signed_len) == 0) {
        if (signed_len >= size || !cm_name_valid(c.username) || !cm_name_valid(c.run) ||
            c.expires_at <= c.issued_at)
            __builtin_trap();
    }
    return 0;
}
