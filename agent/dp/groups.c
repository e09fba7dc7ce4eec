/* Group all-reduce layout (groups.h; seed 000_02cc6b5d62a616fc.txt §3.2,
 * Appendix C). */
#include "agent/dp/groups.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

struct unit {
    int mem[AR_MAX_MEMBERS]; /* member indices */
    size_t size;
    double w;
};

static void single(struct dp_groups *g, size_t n)
{
    memset(g, 0, sizeof *g);
    g->n = n;
    g->rounds = 1;
}

/* Members of t units merged into one (their weights add up). */
static void merge(const struct unit *const *u, size_t t, struct unit *out)
{
    out->size = 0;
    out->w = 0;
    for (size_t i = 0; i < t; i++) {
        memcpy(out->mem + out->size, u[i]->mem, u[i]->size * sizeof *out->mem);
        out->size += u[i]->size;
        out->w += u[i]->w;
    }
}

static void place(struct dp_groups *g, size_t r, int member, int group, int sends, double w)
{
    g->group[r][member] = group;
    g->pos[r][member] = (int)g->size[r][group]++;
    g->sends[r][member] = sends;
    g->weight[r][member] = sends ? w : 0;
}

int dp_groups_plan(size_t n, const int *sends, const int *agg, const double *weight, unsigned m,
                   struct dp_groups *out)
{
    if (n == 0 || n > AR_MAX_MEMBERS)
        return CM_EINVAL;
    single(out, n);
    size_t ns = 0, naggs = 0;
    for (size_t i = 0; i < n; i++)
        if (sends[i]) {
            ns++;
            naggs += !!agg[i];
        }
    if (m < 2 || m >= ns)
        return CM_OK;
    size_t g1 = (ns + m - 1) / m;
    if (naggs < g1)
        return CM_OK;

    struct unit *units = calloc(2 * AR_MAX_MEMBERS, sizeof *units);
    if (!units)
        return CM_ENOMEM;
    struct unit *cur = units, *next = units + AR_MAX_MEMBERS;
    /* round 1: deal the senders, aggregators first, into g1 units */
    int order[AR_MAX_MEMBERS];
    size_t no = 0;
    for (int pass = 1; pass >= 0; pass--)
        for (size_t i = 0; i < n; i++)
            if (sends[i] && !!agg[i] == pass)
                order[no++] = (int)i;
    for (size_t u = 0; u < g1; u++) {
        cur[u].size = 0;
        cur[u].w = 0;
    }
    for (size_t k = 0; k < ns; k++) {
        struct unit *u = &cur[k % g1];
        u->mem[u->size++] = order[k];
        u->w += weight[order[k]];
    }
    for (size_t i = 0; i < n; i++)
        out->group[0][i] = -1;
    for (size_t u = 0; u < g1; u++)
        for (size_t k = 0; k < cur[u].size; k++)
            place(out, 0, cur[u].mem[k], (int)u, 1, weight[cur[u].mem[k]]);
    for (size_t u = 0; u < g1; u++) /* a unit of one has nothing to average yet */
        if (cur[u].size == 1)
            out->group[0][cur[u].mem[0]] = -1;
    out->n_groups[0] = g1;
    size_t nunits = g1, r = 1;

    /* rounds 2..: merge up to m units at a time, in one group each */
    while (nunits > 1) {
        if (r >= DP_GROUPS_MAX_ROUNDS) { /* cannot happen with m >= 2 and n <= 64 */
            free(units);
            single(out, n);
            return CM_OK;
        }
        size_t k = nunits <= m ? 1 : (nunits + m - 1) / m;
        size_t ng = 0;
        for (size_t i = 0; i < n; i++)
            out->group[r][i] = -1;
        for (size_t q = 0; q < k; q++) {
            const struct unit *su[AR_MAX_MEMBERS];
            size_t t = 0;
            for (size_t u = q; u < nunits; u += k)
                su[t++] = &cur[u];
            if (t == 1) { /* sits this round out */
                next[q] = *su[0];
                continue;
            }
            int g = (int)ng++;
            out->size[r][g] = 0;
            /* one sender per unit, in unit order, the others receive; the
               sender rotates over the unit's members from round to round */
            for (size_t i = 0; i < t; i++)
                place(out, r, su[i]->mem[(r - 1) % su[i]->size], g, 1, su[i]->w);
            for (size_t i = 0; i < t; i++)
                for (size_t x = 0; x < su[i]->size; x++)
                    if (x != (r - 1) % su[i]->size)
                        place(out, r, su[i]->mem[x], g, 0, 0);
            merge(su, t, &next[q]);
        }
        out->n_groups[r] = ng;
        struct unit *tmp = cur;
        cur = next;
        next = tmp;
        nunits = k;
        r++;
    }
    free(units);
    /* members that send nothing (pull-only, aggregate-only) join the last
       round, one group of every member, as receivers (and aggregators) */
    for (size_t i = 0; i < n; i++)
        if (!sends[i])
            place(out, r - 1, (int)i, 0, 0, 0);
    out->rounds = r;
    return CM_OK;
}
