/* Option parsing with flags > environment > config file > defaults
 * precedence (see cm_opts.h). Values are applied in that order from lowest
 * to highest, each overwriting the previous. */
#include "cm_opts.h"
#include "cm_err.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int set_value(const struct cm_opt *o, void *cfg, const char *val, const char *src, FILE *err)
{
    char *field = (char *)cfg + o->offset;
    char *end = NULL;
    switch (o->type) {
    case CM_OPT_STR: {
        char *dup = strdup(val);
        if (!dup)
            return CM_ENOMEM;
        free(*(char **)field);
        *(char **)field = dup;
        return CM_OK;
    }
    case CM_OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end) {
            fprintf(err, "error: --%s (from %s): '%s' is not an integer\n", o->name, src, val);
            return CM_EINVAL;
        }
        *(long *)field = v;
        return CM_OK;
    }
    case CM_OPT_DBL: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v)) {
            fprintf(err, "error: --%s (from %s): '%s' is not a number\n", o->name, src, val);
            return CM_EINVAL;
        }
        *(double *)field = v;
        return CM_OK;
    }
    case CM_OPT_BOOL:
        if (!strcmp(val, "1") || !strcasecmp(val, "true") || !strcasecmp(val, "yes")) {
            *(int *)field = 1;
            return CM_OK;
        }
        if (!strcmp(val, "0") || !strcasecmp(val, "false") || !strcasecmp(val, "no")) {
            *(int *)field = 0;
            return CM_OK;
        }
        fprintf(err, "error: --%s (from %s): '%s' is not true/false\n", o->name, src, val);
        return CM_EINVAL;
    }
    return CM_EINVAL;
}

static void env_name(const char *opt, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "CROWDTRAIN_");
    for (const char *p = opt; *p && n + 1 < cap; p++)
        out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    out[n] = '\0';
}

static const struct cm_opt *find(const struct cm_cmd_spec *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->nopts; i++)
        if (strlen(s->opts[i].name) == len && !strncmp(s->opts[i].name, name, len))
            return &s->opts[i];
    return NULL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int load_file(const struct cm_cmd_spec *s, void *cfg, const char *path, FILE *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(err, "error: config file %s: %s\n", path, strerror(errno));
        return CM_EIO;
    }
    char line[4096];
    int lineno = 0, rc = CM_OK;
    while (rc == CM_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *l = trim(line);
        if (!*l || *l == '#')
            continue;
        char *eq = strchr(l, '=');
        if (!eq) {
            fprintf(err, "error: %s:%d: expected 'name = value'\n", path, lineno);
            rc = CM_EPARSE;
            break;
        }
        *eq = '\0';
        char *k = trim(l), *v = trim(eq + 1);
        const struct cm_opt *o = find(s, k, strlen(k));
        if (!o || o->no_env) {
            fprintf(err, "error: %s:%d: unknown option '%s'\n", path, lineno, k);
            rc = CM_EINVAL;
            break;
        }
        char src[512];
        snprintf(src, sizeof src, "%s:%d", path, lineno);
        rc = set_value(o, cfg, v, src, err);
    }
    fclose(f);
    return rc;
}

void cm_opts_help(const struct cm_cmd_spec *s, FILE *out)
{
    fprintf(out, "usage: %s\n\n%s\n\noptions:\n", s->usage, s->about);
    for (size_t i = 0; i < s->nopts; i++) {
        const struct cm_opt *o = &s->opts[i];
        char left[96];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        fprintf(out, "  %-30s %s", left, o->help);
        /* a help text that explains its default itself ("the run's") keeps
           it: the stored value (often 0) would contradict it */
        if (o->def && o->type != CM_OPT_BOOL && !strstr(o->help, "(default"))
            fprintf(out, " (default: %s)", o->def);
        fprintf(out, "\n");
    }
    if (s->allow_config_file)
        fprintf(out, "  %-30s %s\n", "--config FILE",
                "read 'name = value' lines (names as above, without dashes) "
                "(env: CROWDTRAIN_CONFIG)");
    fprintf(out, "  %-30s %s\n", "--help", "show this help");
    fprintf(out, "\nEvery option can also be set in the environment as CROWDTRAIN_<NAME> "
                 "(e.g. --database-url as CROWDTRAIN_DATABASE_URL).\n"
                 "Precedence: command line > environment > config file > default.\n");
}

int cm_opts_parse(const struct cm_cmd_spec *s, void *cfg, int argc, char **argv,
                  char **positional, int *npositional, FILE *err)
{
    int maxpos = npositional ? *npositional : 0, npos = 0, rc;
    const char *config_path = s->allow_config_file ? getenv("CROWDTRAIN_CONFIG") : NULL;

    /* Pass 1: syntax, --help and --config, so the file can be applied before
     * the environment and the flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cm_opts_help(s, stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (npos >= maxpos) {
                fprintf(err, "error: unexpected argument '%s' (see --help)\n", a);
                return CM_EINVAL;
            }
            positional[npos++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        if (s->allow_config_file && nlen == 6 && !strncmp(name, "config", 6)) {
            if (eq)
                config_path = eq + 1;
            else if (i + 1 < argc)
                config_path = argv[++i];
            else {
                fprintf(err, "error: --config needs a value\n");
                return CM_EINVAL;
            }
            continue;
        }
        const struct cm_opt *o = find(s, name, nlen);
        if (!o) {
            fprintf(err, "error: unknown option '--%.*s' (see --help)\n", (int)nlen, name);
            return CM_EINVAL;
        }
        if (o->type == CM_OPT_BOOL && eq) {
            fprintf(err, "error: --%s is a flag and takes no value\n", o->name);
            return CM_EINVAL;
        }
        if (o->type != CM_OPT_BOOL && !eq) {
            if (i + 1 >= argc) {
                fprintf(err, "error: --%s needs a value (%s)\n", o->name,
                        o->metavar ? o->metavar : "value");
                return CM_EINVAL;
            }
            i++;
        }
    }
    if (npositional)
        *npositional = npos;

    for (size_t i = 0; i < s->nopts; i++)
        if (s->opts[i].def && (rc = set_value(&s->opts[i], cfg, s->opts[i].def, "default", err)))
            return rc;
    if (config_path && (rc = load_file(s, cfg, config_path, err)))
        return rc;
    for (size_t i = 0; i < s->nopts; i++) {
        char en[128];
        if (s->opts[i].no_env)
            continue;
        env_name(s->opts[i].name, en, sizeof en);
        const char *v = getenv(en);
        if (v && (rc = set_value(&s->opts[i], cfg, v, en, err)))
            return rc;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            continue;
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        if (s->allow_config_file && nlen == 6 && !strncmp(name, "config", 6)) {
            if (!eq)
                i++;
            continue;
        }
        const struct cm_opt *o = find(s, name, nlen);
        if (o->type == CM_OPT_BOOL) {
            *(int *)((char *)cfg + o->offset) = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : argv[++i];
        if ((rc = set_value(o, cfg, v, "command line", err)))
            return rc;
    }
    return CM_OK;
}

void cm_opts_free(const struct cm_cmd_spec *s, void *cfg)
{
    for (size_t i = 0; i < s->nopts; i++) {
        if (s->opts[i].type == CM_OPT_STR) {
            char **p = (char **)((char *)cfg + s->opts[i].offset);
            free(*p);
            *p = NULL;
        }
    }
}
