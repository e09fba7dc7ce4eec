/* libFuzzer target: checkpoint reader (cm_ckpt_parse) and the streaming
 * verifier (cm_ckpt_stream_*) over the same bytes. A checkpoint the parser
 * accepts must have exactly the encoded size of what it parsed, and the
 * streaming verifier, fed in uneven chunks, must accept it too with the
 * same step. */
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "cm_err.h"
#include "cm_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cm_log_set_level((enum cm_log_level) - 1); /* see fuzz_manifest.c */
    struct cm_ckpt c;
    int rc = cm_ckpt_parse(data, size, &c);
    struct cm_ckpt_stream s;
    if (cm_ckpt_stream_init(&s, 1ull << 32) != CM_OK)
        return 0;
    int src = CM_OK;
    size_t off = 0, step = 1;
    while (off < size && src == CM_OK) {
        size_t k = size - off < step ? size - off : step;
        src = cm_ckpt_stream_update(&s, data + off, k);
        off += k;
        step = step * 3 + 1;
    }
    uint64_t st = 0;
    int frc = src == CM_OK ? cm_ckpt_stream_final(&s, NULL, &st) : src;
    cm_ckpt_stream_cleanup(&s);
    if (rc == CM_OK) {
        if (cm_ckpt_encoded_size(&c) != size || frc != CM_OK || st != c.step)
            __builtin_trap();
        cm_ckpt_cleanup(&c);
    }
    return 0;
}
