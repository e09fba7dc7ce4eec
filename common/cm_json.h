/* Strict validation of JSON request bodies (Jansson): each field named with
 * its type, whether it is required and its bounds; unknown fields are
 * rejected so a typo never silently becomes a default. A pure function over
 * a parsed object, used by every REST handler and fuzzed with them. */
#ifndef CM_JSON_H
#define CM_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum cm_json_kind { CM_J_STRING, CM_J_INT, CM_J_BOOL, CM_J_OBJECT, CM_J_NUMBER, CM_J_ARRAY };

struct cm_json_field {
    const char *name;
    enum cm_json_kind kind;
    int required;
    int64_t min, max; /* string length bounds, or integer bounds; ignored when min > max */
};

/* CM_OK, or CM_EINVAL with a sentence for the client in err
 * ("field 'name': expected a string"). `obj` must be a JSON object. */
int cm_json_check(const json_t *obj, const struct cm_json_field *fields, size_t n, char *err,
                  size_t cap);

/* Parses a request body: must be one JSON object, no duplicate keys, no
 * trailing garbage, at most max_depth nesting. NULL with err filled when not. */
json_t *cm_json_parse_object(const char *buf, size_t len, char *err, size_t cap);

#endif
