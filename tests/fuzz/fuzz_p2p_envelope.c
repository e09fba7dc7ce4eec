/* libFuzzer target: the envelope decoder p2p_envelope_parse(), then the signed-bytes builder over what it decoded.
 * Seeds in tests/fuzz/corpus/p2p_envelope/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "p2p/p2p_envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct p2p_envelope env;
    if (p2p_envelope_parse(data, size, &env) == 0) {
        uint8_t tbs[P2P_SIGNED_LEN];
        if (env.token_len == 0 || env.token_len > 2048 || env.body_len > size)
            abort();
        p2p_envelope_signed_bytes(env.kind, env.type, env.request_id, env.time_ms,
                                  env.listen_port, env.status,
                                  env.has_recipient ? env.recipient : NULL, env.nonce, env.token,
                                  env.token_len, env.body, env.body_len, tbs);
        p2p_envelope_cleanup(&env);
    }
    return 0;
}
