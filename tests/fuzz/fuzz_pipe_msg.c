/* libFuzzer target for the pipeline-stage messages a stage reads
 * (common/sched/pipe_msg.h, types 80..83). The first input byte picks the
 * p2p type (80 + byte % 4), the rest is the body. What parses stays inside
 * the input, obeys the item bound, and re-encodes to exactly the body. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched/pipe_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t type = PIPE_MSG_ACT + data[0] % 4;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    struct pipe_msg m;
    if (pipe_msg_parse(type, body, len, &m) != 0)
        return 0;
    size_t items = (size_t)m.ntargets + m.count;
    size_t vsz = pipe_enc_size(m.enc);
    if (m.type != type || items > PIPE_MAX_ITEMS ||
        len != PIPE_HDR_LEN + 4 * (size_t)m.ntargets + vsz * (size_t)m.count ||
        (m.count && m.values + vsz * (size_t)m.count != body + len) ||
        (m.ntargets && m.targets != body + PIPE_HDR_LEN) ||
        (uint64_t)m.offset + m.count > m.total)
        abort();
    uint8_t *b;
    size_t blen;
    if (pipe_msg_build(&m, &b, &blen) != 0 || blen != len || memcmp(b, body, len) != 0)
        abort();
    free(b);
    return 0;
}
