/* libFuzzer target: a text-docs manifest's tokenizer, the SentencePiece
 * model bytes an agent fetches from a dataset server (common/data/spm.h,
 * over Debian's libsentencepiece). A model that loads must encode and
 * decode a fixed text without failing in a way the caller cannot see:
 * ids in range, decode accepting them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "data/spm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cm_spm *sp = NULL;
    char err[200];
    if (cm_spm_load_mem(data, size, &sp, err, sizeof err) != CM_OK) {
        if (sp)
            __builtin_trap();
        return 0;
    }
    const char *text = "The jury said, \"Caf\xc3\xa9 au lait\" 42 times.";
    int32_t ids[256];
    size_t n = 0;
    int V = cm_spm_vocab_size(sp);
    if (V <= 0)
        __builtin_trap();
    if (cm_spm_encode(sp, text, strlen(text), ids, 256, &n, err, sizeof err) == CM_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= V)
                __builtin_trap();
        char *back = NULL;
        size_t blen = 0;
        if (cm_spm_decode(sp, ids, n, &back, &blen, err, sizeof err) == CM_OK)
            free(back);
        else if (back)
            __builtin_trap();
    }
    cm_spm_free(sp);
    return 0;
}
