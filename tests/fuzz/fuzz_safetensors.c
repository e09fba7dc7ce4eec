/* libFuzzer target: the strict safetensors parser (cm_st_parse) and the
 * float conversion of every tensor it accepts. Accepted tensors must lie
 * inside the input and tile the data area. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "ckpt/safetensors.h"
#include "cm_err.h"
#include "cm_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cm_log_set_level((enum cm_log_level) - 1); /* see fuzz_manifest.c */
    struct cm_st_file f;
    if (cm_st_parse(data, size, &f) != CM_OK)
        return 0;
    uint64_t covered = 0;
    for (size_t i = 0; i < f.n; i++) {
        const struct cm_st_tensor *t = &f.tensors[i];
        if (t->data < data || t->data + t->nbytes > data + size)
            __builtin_trap();
        covered += t->nbytes;
        float *dst = malloc(t->numel ? t->numel * sizeof(float) : 1);
        if (!dst)
            break;
        int rc = cm_st_read_f32(&f, t->name, t->ndim, t->shape, dst);
        if (rc != CM_OK && rc != CM_EUNSUPPORTED && rc != CM_ENOTFOUND)
            __builtin_trap();
        free(dst);
    }
    if (f.n && covered > size)
        __builtin_trap();
    cm_st_cleanup(&f);
    return 0;
}
