/* libFuzzer target: checkpoint reader (cm_ckpt_parse) and the streaming
 * verifier (cm_ckpt_stream_*) over the same bytes. A checkpoint the parser
 * accepts must have exactly the encoded size of what it parsed; the
 * streaming verifier, fed in uneven chunks, accepts exactly what the parser
 * accepts, with the same step and the SHA-256 of the same parameters. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "cm_crypto.h"
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
    struct cm_ckpt_stream_info info;
    int frc = src == CM_OK ? cm_ckpt_stream_final(&s, &info) : src;
    cm_ckpt_stream_cleanup(&s);
    if ((rc == CM_OK) != (frc == CM_OK))
        __builtin_trap();
    if (rc == CM_OK) {
        uint8_t ph[32];
        cm_sha256(c.params, 4 * c.n_params, ph);
        if (cm_ckpt_encoded_size(&c) != size || info.step != c.step ||
            info.n_params != c.n_params || memcmp(ph, info.params_sha256, 32) != 0)
            __builtin_trap();
        cm_ckpt_cleanup(&c);
    }
    return 0;
}
