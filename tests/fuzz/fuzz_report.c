/* libFuzzer target for the contribution report payload parser
 * (coordinator/api_contrib_parse.c: coord_report_parse), the bytes an agent
 * signs and the coordinator parses after checking the signature. Every
 * rejection must explain itself; every accepted report must be within the
 * documented bounds, and carries a parameter hash (and ALBERT's sop_loss
 * and mlm_accuracy) only when it said one, and at most 64 distinct expert
 * server attestations. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/api_contrib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct coord_report r;
    char err[256];
    if (coord_report_parse(data, size, &r, err, sizeof err) != 0) {
        if (!err[0])
            __builtin_trap();
        return 0;
    }
    if (r.n_members > COORD_REPORT_MEMBERS_MAX || r.n_excluded > COORD_REPORT_MEMBERS_MAX ||
        !(r.samples >= 0 && r.samples <= COORD_REPORT_SAMPLES_MAX) || r.step < 0 ||
        r.parts_averaged > r.parts || !isfinite(r.compute_s) || strlen(r.group) == 0 ||
        (r.has_params != 0 && r.has_params != 1))
        __builtin_trap();
    /* ALBERT's heads: in bounds when said, zero when not */
    if ((r.has_sop_loss && !(r.sop_loss >= 0 && r.sop_loss <= 1e6)) ||
        (r.has_mlm_accuracy && !(r.mlm_accuracy >= 0 && r.mlm_accuracy <= 1)) ||
        (!r.has_sop_loss && r.sop_loss != 0) || (!r.has_mlm_accuracy && r.mlm_accuracy != 0))
        __builtin_trap();
    static const uint8_t zero[32];
    if (!r.has_params && memcmp(r.params, zero, sizeof zero) != 0)
        __builtin_trap();
    for (size_t i = 0; i < r.n_members; i++)
        if (!(r.members[i].samples >= 0 && r.members[i].samples <= COORD_REPORT_SAMPLES_MAX))
            __builtin_trap();
    /* expert server attestations: bounded, in range, distinct keys */
    if (r.n_experts > COORD_REPORT_EXPERTS_MAX)
        __builtin_trap();
    for (size_t i = 0; i < r.n_experts; i++) {
        if (!(r.experts[i].samples >= 0 && r.experts[i].samples <= COORD_REPORT_SAMPLES_MAX))
            __builtin_trap();
        for (size_t j = 0; j < i; j++)
            if (!memcmp(r.experts[i].pub, r.experts[j].pub, 32))
                __builtin_trap();
    }
    return 0;
}
