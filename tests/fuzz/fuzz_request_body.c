/* libFuzzer target for what the coordinator reads from request bodies:
 * cm_json_parse_object (one JSON object, no duplicates, bounded depth) and
 * cm_json_check (typed, bounded fields, unknown fields rejected), with a
 * schema using every field kind the REST handlers use; plus the name and
 * base64url validators applied to path parameters and public keys. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm_crypto.h"
#include "cm_json.h"
#include "cm_token.h"

static const struct cm_json_field FIELDS[] = {
    {"name", CM_J_STRING, 1, 1, 64},
    {"target_batch_size", CM_J_INT, 0, 1, 1000000000},
    {"description", CM_J_STRING, 0, 0, 4096},
    {"config", CM_J_OBJECT, 0, 1, 0},
    {"enabled", CM_J_BOOL, 0, 1, 0},
    {"ratio", CM_J_NUMBER, 0, 1, 0},
    {"list", CM_J_ARRAY, 0, 1, 0},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    json_t *j = cm_json_parse_object((const char *)data, size, err, sizeof err);
    if (j) {
        if (cm_json_check(j, FIELDS, sizeof FIELDS / sizeof FIELDS[0], err, sizeof err) == 0) {
            const char *name = json_string_value(json_object_get(j, "name"));
            (void)cm_name_valid(name);
        }
        json_decref(j);
    } else if (!err[0]) {
        __builtin_trap(); /* a rejection must always explain itself */
    }
    uint8_t key[64];
    size_t n = 0;
    (void)cm_b64url_decode((const char *)data, size, key, sizeof key, &n);
    if (n > sizeof key)
        __builtin_trap();
    return 0;
}
