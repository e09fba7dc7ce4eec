/* libFuzzer target: dataset manifest parser (common/data/manifest.c).
 * Any input must be rejected cleanly or produce a manifest whose
 * invariants hold (at least one shard, URLs and names set, idx shards
 * paired with labels, chunk hashes covering the file). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Rejections log at error level; a level below "error" silences them so
     * the fuzzer runs at full speed (sanitizer reports still go to stderr). */
    cm_log_set_level((enum cm_log_level) - 1);
    struct cm_data_manifest *m = NULL;
    char err[256];
    int rc = cm_data_manifest_parse((const char *)data, size, &m, err, sizeof err);
    if (rc != CM_OK) {
        if (m || strlen(err) == 0)
            __builtin_trap();
        /* With a base, relative shard URLs resolve; everything else stays strict. */
        if (cm_data_manifest_parse_base((const char *)data, size, "https://h.example/d/", &m, err,
                                        sizeof err) == CM_OK)
            cm_data_manifest_free(m);
        return 0;
    }
    if (!m || m->n_shards == 0 || !m->name)
        __builtin_trap();
    for (size_t i = 0; i < m->n_shards; i++) {
        if (!m->shards[i].data.url || m->shards[i].data.size == 0)
            __builtin_trap();
        if ((m->format == CM_DATA_IDX_IMAGES) != (m->shards[i].labels.url != NULL))
            __builtin_trap();
        const struct cm_data_file *f = &m->shards[i].data;
        if (f->chunk_size &&
            (!f->chunk_sha256 || f->n_chunks == 0 ||
             (uint64_t)f->n_chunks != (f->size + f->chunk_size - 1) / f->chunk_size))
            __builtin_trap();
    }
    cm_data_manifest_free(m);
    /* Accepted without a base means accepted with one (only relative URLs differ). */
    if (cm_data_manifest_parse_base((const char *)data, size, "https://h.example/d/", &m, err,
                                    sizeof err) != CM_OK)
        __builtin_trap();
    cm_data_manifest_free(m);
    return 0;
}
