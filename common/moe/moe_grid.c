/* Expert grid and uid text forms (see moe_grid.h; seed
 * 002_2b00836ea4b30f79.txt, Appendix C). Pure functions, no allocation. */
#include "moe/moe_grid.h"

#include <stdio.h>
#include <string.h>

#include "cm_err.h"

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static int name_check(const char *name)
{
    if (!name)
        return CM_EINVAL;
    size_t n = strnlen(name, MOE_NAME_MAX + 1);
    if (n == 0)
        return CM_EPARSE;
    if (n > MOE_NAME_MAX)
        return CM_ETOOBIG;
    for (size_t i = 0; i < n; i++)
        if (!name_char(name[i]))
            return CM_EPARSE;
    return CM_OK;
}

int moe_run_check(const char *run)
{
    if (!run)
        return CM_EINVAL;
    size_t n = strnlen(run, MOE_RUN_MAX + 1);
    if (n == 0)
        return CM_EPARSE;
    if (n > MOE_RUN_MAX)
        return CM_ETOOBIG;
    for (size_t i = 0; i < n; i++) {
        char c = run[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return CM_EPARSE;
    }
    return CM_OK;
}

int moe_grid_init(struct moe_grid *g, const char *name, int dims, int size)
{
    if (!g)
        return CM_EINVAL;
    int rc = name_check(name);
    if (rc)
        return rc;
    if (dims < 1 || dims > MOE_MAX_DIMS || size < MOE_MIN_SIZE || size > MOE_MAX_SIZE)
        return CM_ERANGE;
    memset(g, 0, sizeof *g);
    memcpy(g->name, name, strlen(name));
    g->dims = dims;
    g->size = size;
    return CM_OK;
}

int moe_grid_check(const struct moe_grid *g)
{
    if (!g || !memchr(g->name, 0, sizeof g->name))
        return CM_EINVAL;
    int rc = name_check(g->name);
    if (rc)
        return rc;
    if (g->dims < 1 || g->dims > MOE_MAX_DIMS || g->size < MOE_MIN_SIZE || g->size > MOE_MAX_SIZE)
        return CM_ERANGE;
    return CM_OK;
}

uint64_t moe_grid_count(const struct moe_grid *g)
{
    uint64_t c = 1;
    for (int i = 0; i < g->dims; i++)
        c *= (uint64_t)g->size;
    return c;
}

static int indices_check(const struct moe_grid *g, const struct moe_uid *u)
{
    for (int i = 0; i < u->n; i++)
        if (u->idx[i] >= g->size)
            return CM_ERANGE;
    return CM_OK;
}

int moe_uid_check(const struct moe_grid *g, const struct moe_uid *u)
{
    if (!g || !u)
        return CM_EINVAL;
    if (u->n != g->dims)
        return CM_ERANGE;
    return indices_check(g, u);
}

int moe_prefix_check(const struct moe_grid *g, const struct moe_uid *u)
{
    if (!g || !u)
        return CM_EINVAL;
    if (u->n < 0 || u->n >= g->dims)
        return CM_ERANGE;
    return indices_check(g, u);
}

int moe_uid_equal(const struct moe_uid *a, const struct moe_uid *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->idx[i] != b->idx[i])
            return 0;
    return 1;
}

void moe_uid_prefix(const struct moe_uid *u, int n, struct moe_uid *out)
{
    struct moe_uid p = {.n = n < u->n ? n : u->n};
    for (int i = 0; i < p.n; i++)
        p.idx[i] = u->idx[i];
    *out = p;
}

/* Writes name, indices and (for a prefix) ".*" after `head`. */
static int format_form(const char *head, const struct moe_grid *g, const struct moe_uid *u,
                       char *out, size_t cap, size_t *len)
{
    int rc = moe_grid_check(g);
    if (rc)
        return rc;
    if (!out || !u)
        return CM_EINVAL;
    if (u->n == g->dims)
        rc = moe_uid_check(g, u);
    else
        rc = moe_prefix_check(g, u);
    if (rc)
        return rc;
    char buf[MOE_KEY_MAX + 8];
    int w = snprintf(buf, sizeof buf, "%s%s", head, g->name);
    for (int i = 0; i < u->n; i++)
        w += snprintf(buf + w, sizeof buf - (size_t)w, ".%u", (unsigned)u->idx[i]);
    if (u->n < g->dims)
        w += snprintf(buf + w, sizeof buf - (size_t)w, ".*");
    if ((size_t)w + 1 > cap)
        return CM_ETOOBIG;
    memcpy(out, buf, (size_t)w + 1);
    if (len)
        *len = (size_t)w;
    return CM_OK;
}

int moe_uid_format(const struct moe_grid *g, const struct moe_uid *u, char *out, size_t cap)
{
    return format_form("", g, u, out, cap, NULL);
}

int moe_key_format(const char *run, const struct moe_grid *g, const struct moe_uid *u, char *out,
                   size_t cap, size_t *len)
{
    int rc = moe_run_check(run);
    if (rc)
        return rc;
    char head[4 + MOE_RUN_MAX + 2];
    snprintf(head, sizeof head, "moe.%s.", run);
    return format_form(head, g, u, out, cap, len);
}

/* Parses "name(.idx)*" then, when want_prefix, ".*"; the whole string. */
static int parse_form(const struct moe_grid *g, const char *s, int want_prefix,
                      struct moe_uid *out)
{
    int rc = moe_grid_check(g);
    if (rc)
        return rc;
    if (!s || !out)
        return CM_EINVAL;
    size_t len = strnlen(s, MOE_UID_TEXT_MAX + 2);
    if (len > MOE_UID_TEXT_MAX)
        return CM_ETOOBIG;
    size_t nl = strlen(g->name);
    if (len < nl || memcmp(s, g->name, nl))
        return CM_EPARSE;
    const char *p = s + nl;
    struct moe_uid u = {0};
    for (;;) {
        if (*p == 0)
            break;
        if (*p != '.')
            return CM_EPARSE;
        p++;
        if (*p == '*') {
            if (!want_prefix || p[1] != 0)
                return CM_EPARSE;
            p++;
            break;
        }
        if (*p < '0' || *p > '9')
            return CM_EPARSE;
        if (*p == '0' && p[1] >= '0' && p[1] <= '9')
            return CM_EPARSE; /* leading zero */
        unsigned v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            if (++digits > 4)
                return CM_ERANGE;
            v = v * 10 + (unsigned)(*p - '0');
            p++;
        }
        if (u.n >= g->dims)
            return CM_ERANGE; /* too many dimensions */
        if (v >= (unsigned)g->size)
            return CM_ERANGE;
        u.idx[u.n++] = (uint16_t)v;
    }
    /* A prefix must end in ".*" (the loop breaks there); an expert must not. */
    int ended_star = len >= 2 && s[len - 1] == '*';
    if (want_prefix) {
        if (!ended_star)
            return CM_EPARSE;
        if (u.n >= g->dims)
            return CM_ERANGE;
    } else if (u.n != g->dims) {
        return CM_ERANGE;
    }
    *out = u;
    return CM_OK;
}

int moe_uid_parse(const struct moe_grid *g, const char *s, struct moe_uid *out)
{
    return parse_form(g, s, 0, out);
}

int moe_prefix_parse(const struct moe_grid *g, const char *s, struct moe_uid *out)
{
    return parse_form(g, s, 1, out);
}
