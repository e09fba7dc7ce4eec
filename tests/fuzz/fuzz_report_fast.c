/* libFuzzer target for the direct read of a report payload in the agents'
 * form (coordinator/api_contrib_parse.c: coord_report_parse_fast), checked
 * against the generic JSON parser it stands in for: whatever the direct
 * read accepts, the generic parser must accept with the identical report. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/api_contrib.h"
#include "cm_err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct coord_report fast, json;
    char err[256];
    if (!coord_report_parse_fast(data, size, &fast))
        return 0;
    if (coord_report_parse_json(data, size, &json, err, sizeof err) != CM_OK)
        __builtin_trap();
    if (memcmp(&fast, &json, sizeof fast) != 0)
        __builtin_trap();
    return 0;
}
