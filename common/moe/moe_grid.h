/* The expert grid of a decentralized mixture-of-experts layer and the text
 * forms of expert uids (seed 002_2b00836ea4b30f79.txt, section 3.2 and
 * Appendix C): a layer is named (the uid prefix, [a-z0-9_]{1,32}), has d
 * dimensions (1..4) and M indices per dimension (2..1024); an expert is a
 * point of that grid, written "ffn.3.17", and a prefix of length n < d is
 * written "ffn.3.*" (n = 0: "ffn.*").
 *
 * DHT key names add the run: "moe.<run>.<prefix form>", for example
 * "moe.fmnist.ffn.3.*" (docs/experts.md, "Grid and uids"). Run names are
 * [A-Za-z0-9_-]{1,64}.
 *
 * Everything here is pure and strict: parsing accepts exactly what
 * formatting produces (no leading zeros, no signs, no spaces, indices in
 * range, exactly the grid's number of dimensions) and rejects the rest with
 * CM_EPARSE (malformed text), CM_ERANGE (an index or a size out of range) or
 * CM_ETOOBIG (overlong text / output buffer too small). */
#ifndef MOE_GRID_H
#define MOE_GRID_H

#include <stddef.h>
#include <stdint.h>

#define MOE_MAX_DIMS 4
#define MOE_MIN_SIZE 2
#define MOE_MAX_SIZE 1024
#define MOE_NAME_MAX 32
#define MOE_RUN_MAX 64
/* "name" + 4 x ".1023" + NUL */
#define MOE_UID_TEXT_MAX (MOE_NAME_MAX + MOE_MAX_DIMS * 5 + 1)
/* "moe." + run + "." + uid or prefix form (".*") + NUL */
#define MOE_KEY_MAX (4 + MOE_RUN_MAX + 1 + MOE_NAME_MAX + MOE_MAX_DIMS * 5 + 2 + 1)

struct moe_grid {
    char name[MOE_NAME_MAX + 1];
    int dims; /* d */
    int size; /* M, the same along every dimension */
};

/* A grid point (n == dims: an expert) or a prefix (0 <= n < dims). */
struct moe_uid {
    int n;
    uint16_t idx[MOE_MAX_DIMS];
};

/* CM_EPARSE for a bad name, CM_ERANGE for dims or size out of range;
 * *g is left untouched on error. */
int moe_grid_init(struct moe_grid *g, const char *name, int dims, int size);
/* CM_OK when the grid is well formed (as moe_grid_init would make it). */
int moe_grid_check(const struct moe_grid *g);
/* Number of experts on the grid (M^d). */
uint64_t moe_grid_count(const struct moe_grid *g);
int moe_run_check(const char *run);

/* CM_OK when u is an expert (n == dims) of g with every index < size. */
int moe_uid_check(const struct moe_grid *g, const struct moe_uid *u);
/* CM_OK when u is a prefix (0 <= n < dims) of g. */
int moe_prefix_check(const struct moe_grid *g, const struct moe_uid *u);
/* 1 when a and b are the same point or prefix. */
int moe_uid_equal(const struct moe_uid *a, const struct moe_uid *b);
/* The first n indices of u (n <= u->n). */
void moe_uid_prefix(const struct moe_uid *u, int n, struct moe_uid *out);

/* "ffn.3.17" for an expert, "ffn.3.*" for a prefix; NUL terminated. */
int moe_uid_format(const struct moe_grid *g, const struct moe_uid *u, char *out, size_t cap);
/* Parses exactly one expert uid of g (the whole string). */
int moe_uid_parse(const struct moe_grid *g, const char *s, struct moe_uid *out);
/* Parses exactly one prefix form of g ("ffn.*", "ffn.3.*", ...). */
int moe_prefix_parse(const struct moe_grid *g, const char *s, struct moe_uid *out);

/* DHT key of a prefix or an expert: "moe.<run>.<form>". *len (may be NULL)
 * gets the length without the NUL. */
int moe_key_format(const char *run, const struct moe_grid *g, const struct moe_uid *u, char *out,
                   size_t cap, size_t *len);

#endif
