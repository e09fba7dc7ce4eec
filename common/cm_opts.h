/* Command-line options shared by the coordinator and the agent.
 *
 * A command declares a table of options; cm_opts_parse fills a struct from,
 * in increasing precedence: the defaults in the table, a config file
 * ("name = value" lines, '#' comments; given by --config FILE or the
 * command's config environment variable), environment variables
 * (CROWDTRAIN_<NAME>, dashes as underscores), and the command line
 * (--name value or --name=value; flags take no value). --help prints the
 * table. */
#ifndef CM_OPTS_H
#define CM_OPTS_H

#include <stddef.h>
#include <stdio.h>

enum cm_opt_type {
    CM_OPT_STR,  /* char *, heap-allocated, freed by cm_opts_free */
    CM_OPT_INT,  /* long */
    CM_OPT_BOOL, /* int, a flag: present = 1; env/file accept 1/0/true/false */
    CM_OPT_DBL,  /* double */
};

struct cm_opt {
    const char *name; /* without the leading dashes, e.g. "database-url" */
    enum cm_opt_type type;
    size_t offset; /* offsetof(struct your_config, field) */
    const char *def; /* default as text, or NULL */
    const char *metavar; /* e.g. "URL"; NULL for flags */
    const char *help;
    int no_env; /* 1: not settable from environment or file (secrets on stdin) */
};

struct cm_cmd_spec {
    const char *usage; /* "crowdtrain-coordinator serve [options]" */
    const char *about; /* a paragraph shown by --help */
    const struct cm_opt *opts;
    size_t nopts;
    int allow_config_file; /* 1: --config FILE is accepted */
};

/* Returns 0 on success, 1 if --help was printed (caller exits 0), or a
 * negative CM_E* code after printing the problem to `err`. Positional
 * arguments are rejected unless `positional`/`npositional` are given, in
 * which case up to *npositional are returned there (borrowed from argv). */
int cm_opts_parse(const struct cm_cmd_spec *spec, void *cfg, int argc, char **argv,
                  char **positional, int *npositional, FILE *err);
void cm_opts_free(const struct cm_cmd_spec *spec, void *cfg);
void cm_opts_help(const struct cm_cmd_spec *spec, FILE *out);

#endif
