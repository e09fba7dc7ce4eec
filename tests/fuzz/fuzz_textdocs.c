/* libFuzzer target: text-docs shards (common/data/docs.c), the bytes a
 * volunteer's agent reads from a dataset server. The first byte picks the
 * window T (8..71); the rest is the shard, split into documents and
 * sentences (UTF-8 checked, each byte one token) and made into ALBERT
 * sentence pairs, whose layout is then checked: [CLS] A [SEP] B [SEP] with
 * both segments non-empty, padding to T, a 0/1 label, every token from the
 * text. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cm_err.h"
#include "cm_log.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int byte_enc(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n)
{
    (void)ctx;
    *n = len;
    if (len > cap)
        return CM_ETOOBIG;
    for (size_t i = 0; i < len; i++)
        ids[i] = (unsigned char)text[i] + 3;
    return CM_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cm_log_set_level((enum cm_log_level) - 1); /* see fuzz_manifest.c */
    if (size < 1)
        return 0;
    size_t T = 8 + data[0] % 64;
    struct cm_data_docs d;
    char err[160];
    if (cm_data_docs_tokenize(data + 1, size - 1, byte_enc, NULL, &d, err, sizeof err) != CM_OK) {
        if (d.tok || d.sent || d.doc)
            __builtin_trap();
        return 0;
    }
    if (d.sent[d.nsent] != d.ntok || (d.ndoc && d.doc[d.ndoc] != d.nsent))
        __builtin_trap();
    struct cm_data_sop_spec sp = {.T = T, .cls = 0, .sep = 1, .pad = 2};
    uint16_t *r = NULL;
    size_t n = 0;
    if (cm_data_sop_build(&d, &sp, size, &r, &n) == CM_OK) {
        for (size_t k = 0; k < n; k++) {
            const uint16_t *e = r + k * (T + 1);
            size_t seps = 0, i = 1, a = 0, b = 0;
            if (e[0] != 0 || e[T] > 1)
                __builtin_trap();
            for (; i < T && seps < 2; i++) {
                if (e[i] == 1)
                    seps++;
                else if (e[i] < 3 || e[i] > 258)
                    __builtin_trap();
                else if (seps == 0)
                    a++;
                else
                    b++;
            }
            if (seps != 2 || a == 0 || b == 0)
                __builtin_trap();
            for (; i < T; i++)
                if (e[i] != 2)
                    __builtin_trap();
        }
        free(r);
    }
    cm_data_docs_free(&d);
    return 0;
}
