/* libFuzzer target for the fast form of a report's request body
 * (coordinator/api_contrib_parse.c: coord_report_envelope), checked against
 * the generic JSON parser the coordinator falls back to: whatever the fast
 * form accepts, jansson must read as an object of exactly the same three
 * strings. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/api_contrib.h"

static int same(json_t *o, const char *key, const char *p, size_t n)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) && json_string_length(v) == n && !memcmp(json_string_value(v), p, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct coord_report_env e;
    if (!coord_report_envelope(data, size, &e))
        return 0;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!o || !json_is_object(o) || json_object_size(o) != 3 ||
        !same(o, "pass", e.pass, e.pass_len) || !same(o, "payload", e.payload, e.payload_len) ||
        !same(o, "sig", e.sig, e.sig_len))
        __builtin_trap();
    json_decref(o);
    return 0;
}
