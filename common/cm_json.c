/* Request-body parsing and schema checks (see cm_json.h). */
#include "cm_json.h"
#include "cm_err.h"

#include <stdio.h>
#include <string.h>

#define CM_JSON_MAX_DEPTH 16

static const char *kind_name(enum cm_json_kind k)
{
    switch (k) {
    case CM_J_STRING: return "a string";
    case CM_J_INT: return "an integer";
    case CM_J_BOOL: return "true or false";
    case CM_J_OBJECT: return "an object";
    case CM_J_NUMBER: return "a number";
    case CM_J_ARRAY: return "an array";
    }
    return "a value";
}

static int kind_ok(const json_t *v, enum cm_json_kind k)
{
    switch (k) {
    case CM_J_STRING: return json_is_string(v);
    case CM_J_INT: return json_is_integer(v);
    case CM_J_BOOL: return json_is_boolean(v);
    case CM_J_OBJECT: return json_is_object(v);
    case CM_J_NUMBER: return json_is_number(v);
    case CM_J_ARRAY: return json_is_array(v);
    }
    return 0;
}

int cm_json_check(const json_t *obj, const struct cm_json_field *f, size_t n, char *err, size_t cap)
{
    if (!json_is_object(obj)) {
        snprintf(err, cap, "the body must be a JSON object");
        return CM_EINVAL;
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        size_t i = 0;
        while (i < n && strcmp(f[i].name, key) != 0)
            i++;
        if (i == n) {
            snprintf(err, cap, "unknown field '%.64s'", key);
            return CM_EINVAL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        v = json_object_get(obj, f[i].name);
        if (!v || json_is_null(v)) {
            if (f[i].required) {
                snprintf(err, cap, "missing field '%s'", f[i].name);
                return CM_EINVAL;
            }
            continue;
        }
        if (!kind_ok(v, f[i].kind)) {
            snprintf(err, cap, "field '%s': expected %s", f[i].name, kind_name(f[i].kind));
            return CM_EINVAL;
        }
        if (f[i].min > f[i].max)
            continue;
        if (f[i].kind == CM_J_STRING) {
            size_t len = json_string_length(v);
            if (memchr(json_string_value(v), '\0', len)) {
                snprintf(err, cap, "field '%s': contains a NUL character", f[i].name);
                return CM_EINVAL;
            }
            if ((int64_t)len < f[i].min || (int64_t)len > f[i].max) {
                snprintf(err, cap, "field '%s': length must be %lld..%lld", f[i].name,
                         (long long)f[i].min, (long long)f[i].max);
                return CM_EINVAL;
            }
        } else if (f[i].kind == CM_J_INT) {
            json_int_t x = json_integer_value(v);
            if (x < f[i].min || x > f[i].max) {
                snprintf(err, cap, "field '%s': must be %lld..%lld", f[i].name,
                         (long long)f[i].min, (long long)f[i].max);
                return CM_EINVAL;
            }
        }
    }
    return CM_OK;
}

static int depth_ok(const json_t *v, int depth)
{
    if (depth > CM_JSON_MAX_DEPTH)
        return 0;
    const char *k;
    json_t *c;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, c) if (!depth_ok(c, depth + 1)) return 0;
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, c) if (!depth_ok(c, depth + 1)) return 0;
    }
    return 1;
}

json_t *cm_json_parse_object(const char *buf, size_t len, char *err, size_t cap)
{
    json_error_t e;
    if (len == 0) {
        snprintf(err, cap, "empty body: a JSON object is required");
        return NULL;
    }
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    if (!j) {
        snprintf(err, cap, "malformed JSON at line %d column %d: %s", e.line, e.column, e.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(err, cap, "the body must be a JSON object");
        return NULL;
    }
    if (!depth_ok(j, 0)) {
        json_decref(j);
        snprintf(err, cap, "JSON nested deeper than %d levels", CM_JSON_MAX_DEPTH);
        return NULL;
    }
    return j;
}
