/* DT-FM's search (seed 003_f3537b728458fcc1.txt, §3.4): a hybrid genetic
 * algorithm over balanced partitions, each offspring improved by local
 * search, with the paper's local search or Kernighan-Lin's. */
#include "sched/dtfm_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

#define LS_PASS_SWAPS 32 /* tentative swaps per local-search pass */
#define LS_MAX_PASSES 100
#define COST_EPS 1e-9

uint64_t dtfm_rand(uint64_t *rng)
{
    uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t rand_below(uint64_t *rng, size_t n)
{
    return (size_t)(dtfm_rand(rng) % n);
}

static void shuffle(uint32_t *a, size_t n, uint64_t *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = rand_below(rng, i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

void dtfm_random_assignment(const struct dtfm_model *m, uint64_t *rng, uint32_t *assign)
{
    for (size_t d = 0; d < m->n; d++)
        assign[d] = (uint32_t)d;
    shuffle(assign, m->n, rng);
}

/* One candidate partition with what its cost is made of, so that a swap
 * between two groups recomputes only their data-parallel costs and their
 * rows of the coarsened graph. */
struct cand {
    uint16_t *group;   /* n */
    uint32_t *members; /* stages x replicas */
    uint32_t *pos;     /* n: index of the device in its group's members */
    double *dpg;       /* stages: eq. 2 per group */
    double *w;         /* stages x stages: eq. 3 */
    struct dtfm_cost cost;
};

struct search {
    const struct dtfm_model *m;
    uint64_t rng;
    uint64_t evals;
};

static int cand_alloc(const struct dtfm_model *m, struct cand *c)
{
    size_t s = m->stages;
    c->group = malloc(m->n * sizeof *c->group);
    c->members = malloc(m->n * sizeof *c->members);
    c->pos = malloc(m->n * sizeof *c->pos);
    c->dpg = malloc(s * sizeof *c->dpg);
    c->w = malloc(s * s * sizeof *c->w);
    return c->group && c->members && c->pos && c->dpg && c->w ? CM_OK : CM_ENOMEM;
}

static void cand_free(struct cand *c)
{
    free(c->group);
    free(c->members);
    free(c->pos);
    free(c->dpg);
    free(c->w);
}

static void cand_copy(const struct dtfm_model *m, struct cand *dst, const struct cand *src)
{
    size_t s = m->stages;
    memcpy(dst->group, src->group, m->n * sizeof *dst->group);
    memcpy(dst->members, src->members, m->n * sizeof *dst->members);
    memcpy(dst->pos, src->pos, m->n * sizeof *dst->pos);
    memcpy(dst->dpg, src->dpg, s * sizeof *dst->dpg);
    memcpy(dst->w, src->w, s * s * sizeof *dst->w);
    dst->cost = src->cost;
}

/* The pipeline part from the cached coarsened graph, and the total. */
static void cand_total(struct search *se, struct cand *c)
{
    const struct dtfm_model *m = se->m;
    double dp = 0;
    for (size_t g = 0; g < m->stages; g++)
        if (c->dpg[g] > dp)
            dp = c->dpg[g];
    uint32_t order[DTFM_MAX_STAGES];
    double pp = dtfm_tsp_open(c->w, m->stages, order);
    double comp = dtfm_compute_term(m, c->members, order);
    c->cost = (struct dtfm_cost){dp + pp + comp, dp, pp, comp};
    se->evals++;
}

static void group_rows(struct search *se, struct cand *c, size_t g)
{
    const struct dtfm_model *m = se->m;
    size_t s = m->stages, r = m->replicas;
    c->dpg[g] = dtfm_dp_group(m, c->members + g * r);
    c->w[g * s + g] = 0;
    for (size_t h = 0; h < s; h++)
        if (h != g)
            c->w[g * s + h] = c->w[h * s + g] =
                dtfm_bottleneck(m, c->members + g * r, c->members + h * r, NULL);
}

/* group[] set: everything else from it. */
static void cand_build(struct search *se, struct cand *c)
{
    const struct dtfm_model *m = se->m;
    size_t s = m->stages, r = m->replicas;
    dtfm_members(m, c->group, c->members);
    for (size_t g = 0; g < s; g++)
        for (size_t k = 0; k < r; k++)
            c->pos[c->members[g * r + k]] = (uint32_t)k;
    for (size_t g = 0; g < s; g++) {
        c->dpg[g] = dtfm_dp_group(m, c->members + g * r);
        c->w[g * s + g] = 0;
        for (size_t h = g + 1; h < s; h++)
            c->w[g * s + h] = c->w[h * s + g] =
                dtfm_bottleneck(m, c->members + g * r, c->members + h * r, NULL);
    }
    cand_total(se, c);
}

static void swap_members(const struct dtfm_model *m, struct cand *c, uint32_t d, uint32_t e)
{
    size_t r = m->replicas;
    uint16_t g = c->group[d], h = c->group[e];
    c->members[(size_t)g * r + c->pos[d]] = e;
    c->members[(size_t)h * r + c->pos[e]] = d;
    uint32_t t = c->pos[d];
    c->pos[d] = c->pos[e];
    c->pos[e] = t;
    c->group[d] = h;
    c->group[e] = g;
}

/* Swaps d and e (in different groups) and recomputes the cost. */
static void cand_swap(struct search *se, struct cand *c, uint32_t d, uint32_t e)
{
    uint16_t g = c->group[d], h = c->group[e];
    swap_members(se->m, c, d, e);
    group_rows(se, c, g);
    group_rows(se, c, h);
    cand_total(se, c);
}

struct move {
    double gain;
    uint32_t d, e;
};

/* Best first; ties by device numbers, so that the search stays the same on
 * every machine. */
static int better_move(const struct move *a, const struct move *b)
{
    if (a->gain != b->gain)
        return a->gain > b->gain;
    if (a->d != b->d)
        return a->d < b->d;
    return a->e < b->e;
}

/* The paper's candidates: for each pair of groups, the fastest link inside
 * each (d1-d2, d1'-d2') and the swaps between their ends, with
 * Gain = mean_{x in C_j'} w(d1, x) - w(d1, d2) + mean_{x in C_j} w(d1', x) - w(d1', d2'),
 * w being the pipeline cost of a link (eq. 3's term). Only unlocked devices
 * move; a link counts if one of its ends may. */
static int move_paper(const struct dtfm_model *m, const struct cand *c, const uint8_t *locked,
                      struct move *out)
{
    size_t s = m->stages, r = m->replicas, n = m->n;
    if (r < 2)
        return 0;
    uint32_t fast[DTFM_MAX_STAGES][2];
    int has[DTFM_MAX_STAGES];
    for (size_t g = 0; g < s; g++) {
        const uint32_t *mem = c->members + g * r;
        double best = INFINITY;
        has[g] = 0;
        for (size_t k = 0; k < r; k++)
            for (size_t l = k + 1; l < r; l++) {
                if (locked[mem[k]] && locked[mem[l]])
                    continue;
                double w = m->pp[(size_t)mem[k] * n + mem[l]];
                if (w < best) {
                    best = w;
                    fast[g][0] = mem[k];
                    fast[g][1] = mem[l];
                    has[g] = 1;
                }
            }
    }
    int found = 0;
    for (size_t g = 0; g < s; g++)
        for (size_t h = g + 1; h < s; h++) {
            if (!has[g] || !has[h])
                continue;
            const uint32_t *mg = c->members + g * r, *mh = c->members + h * r;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    uint32_t d = fast[g][a], d2 = fast[g][1 - a];
                    uint32_t e = fast[h][b], e2 = fast[h][1 - b];
                    if (locked[d] || locked[e])
                        continue;
                    double to_h = 0, to_g = 0;
                    for (size_t k = 0; k < r; k++) {
                        to_h += m->pp[(size_t)d * n + mh[k]];
                        to_g += m->pp[(size_t)e * n + mg[k]];
                    }
                    struct move mv = {to_h / (double)r - m->pp[(size_t)d * n + d2] + to_g / (double)r -
                                          m->pp[(size_t)e * n + e2],
                                      d, e};
                    if (!found || better_move(&mv, out))
                        *out = mv;
                    found = 1;
                }
        }
    return found;
}

/* Kernighan-Lin's gain for a swap between C_j and C_j' with affinities
 * a = 1 / (eq. 2's term) (a fast link pulls two devices into one group):
 * (E_d - I_d) + (E_e - I_e) - 2 a(d, e), over all unlocked pairs. */
static int move_kl(const struct dtfm_model *m, const struct cand *c, const uint8_t *locked, struct move *out)
{
    size_t s = m->stages, r = m->replicas, n = m->n;
    double dg[DTFM_MAX_REPLICAS], dh[DTFM_MAX_REPLICAS];
    int found = 0;
    for (size_t g = 0; g < s; g++)
        for (size_t h = g + 1; h < s; h++) {
            const uint32_t *mg = c->members + g * r, *mh = c->members + h * r;
            for (size_t k = 0; k < r; k++) {
                double ext = 0, in = 0;
                for (size_t l = 0; l < r; l++) {
                    ext += 1.0 / m->dp[(size_t)mg[k] * n + mh[l]];
                    if (l != k)
                        in += 1.0 / m->dp[(size_t)mg[k] * n + mg[l]];
                }
                dg[k] = ext - in;
                ext = in = 0;
                for (size_t l = 0; l < r; l++) {
                    ext += 1.0 / m->dp[(size_t)mh[k] * n + mg[l]];
                    if (l != k)
                        in += 1.0 / m->dp[(size_t)mh[k] * n + mh[l]];
                }
                dh[k] = ext - in;
            }
            for (size_t k = 0; k < r; k++)
                for (size_t l = 0; l < r; l++) {
                    if (locked[mg[k]] || locked[mh[l]])
                        continue;
                    struct move mv = {dg[k] + dh[l] - 2.0 / m->dp[(size_t)mg[k] * n + mh[l]], mg[k], mh[l]};
                    if (!found || better_move(&mv, out))
                        *out = mv;
                    found = 1;
                }
        }
    return found;
}

/* Kernighan-Lin's pass structure with either gain: the best-gain swap of
 * devices not moved yet in this pass is made even when it costs more, up
 * to LS_PASS_SWAPS swaps, and the pass keeps the prefix with the lowest
 * true cost; passes repeat while they improve. Walking through worse
 * partitions is what lets a pass leave a local optimum that single
 * improving swaps cannot (three devices that must change groups together). */
static void local_search(struct search *se, struct cand *c, enum dtfm_local kind, struct cand *best)
{
    const struct dtfm_model *m = se->m;
    if (kind == DTFM_LOCAL_NONE)
        return;
    uint8_t locked[DTFM_MAX_DEVICES];
    size_t swaps = m->n / 2 < LS_PASS_SWAPS ? m->n / 2 : LS_PASS_SWAPS;
    /* ours: passes with the paper's gain, and one with Kernighan-Lin's
     * when a paper pass finds nothing (its gain sees fast pipeline links,
     * not groups that are slow inside); it ends when both find nothing */
    int use_kl = kind == DTFM_LOCAL_KL;
    for (int pass = 0; pass < LS_MAX_PASSES; pass++) {
        memset(locked, 0, m->n);
        cand_copy(m, best, c);
        int improved = 0;
        for (size_t k = 0; k < swaps; k++) {
            struct move mv = {0, 0, 0};
            int ok = use_kl ? move_kl(m, c, locked, &mv) : move_paper(m, c, locked, &mv);
            if (!ok)
                break;
            cand_swap(se, c, mv.d, mv.e);
            locked[mv.d] = locked[mv.e] = 1;
            if (c->cost.total < best->cost.total - COST_EPS * (1 + best->cost.total)) {
                cand_copy(m, best, c);
                improved = 1;
            }
        }
        cand_copy(m, c, best);
        if (kind == DTFM_LOCAL_KL) {
            if (!improved)
                return;
        } else if (improved) {
            use_kl = 0;
        } else if (!use_kl) {
            use_kl = 1;
        } else {
            return;
        }
    }
}

static void random_partition(struct search *se, struct cand *c)
{
    const struct dtfm_model *m = se->m;
    uint32_t perm[DTFM_MAX_DEVICES];
    for (size_t d = 0; d < m->n; d++)
        perm[d] = (uint32_t)d;
    shuffle(perm, m->n, &se->rng);
    for (size_t d = 0; d < m->n; d++)
        c->group[perm[d]] = (uint16_t)(d / m->replicas);
}

/* Crossover (§3.4, after [28]): p2's groups relabelled to overlap p1's most
 * (greedy), then starting from p1 each device takes p2's group with
 * probability 1/2, by a swap with a device of that group that p2 places
 * elsewhere (balance is kept). One random swap follows with probability
 * 1/2 so that equal parents still differ. */
static void crossover(struct search *se, const struct cand *p1, const struct cand *p2, struct cand *o)
{
    const struct dtfm_model *m = se->m;
    size_t s = m->stages, r = m->replicas, n = m->n;
    uint32_t overlap[DTFM_MAX_STAGES][DTFM_MAX_STAGES];
    memset(overlap, 0, sizeof overlap);
    for (size_t d = 0; d < n; d++)
        overlap[p2->group[d]][p1->group[d]]++;
    uint16_t relabel[DTFM_MAX_STAGES];
    uint8_t used2[DTFM_MAX_STAGES] = {0}, used1[DTFM_MAX_STAGES] = {0};
    for (size_t round = 0; round < s; round++) {
        size_t bg = 0, bh = 0;
        int found = 0;
        for (size_t g = 0; g < s; g++)
            for (size_t h = 0; h < s; h++)
                if (!used2[g] && !used1[h] && (!found || overlap[g][h] > overlap[bg][bh])) {
                    bg = g;
                    bh = h;
                    found = 1;
                }
        relabel[bg] = (uint16_t)bh;
        used2[bg] = used1[bh] = 1;
    }
    memcpy(o->group, p1->group, n * sizeof *o->group);
    dtfm_members(m, o->group, o->members);
    for (size_t g = 0; g < s; g++)
        for (size_t k = 0; k < r; k++)
            o->pos[o->members[g * r + k]] = (uint32_t)k;
    uint32_t order[DTFM_MAX_DEVICES];
    for (size_t d = 0; d < n; d++)
        order[d] = (uint32_t)d;
    shuffle(order, n, &se->rng);
    for (size_t i = 0; i < n; i++) {
        uint32_t d = order[i];
        uint16_t want = relabel[p2->group[d]];
        if (o->group[d] == want || (dtfm_rand(&se->rng) & 1))
            continue;
        /* a device of group `want` that p2 puts elsewhere, best where d is */
        uint32_t pick = UINT32_MAX;
        for (size_t k = 0; k < r; k++) {
            uint32_t e = o->members[(size_t)want * r + k];
            uint16_t e_wants = relabel[p2->group[e]];
            if (e_wants == want)
                continue;
            if (pick == UINT32_MAX || e_wants == o->group[d])
                pick = e;
            if (e_wants == o->group[d])
                break;
        }
        if (pick != UINT32_MAX)
            swap_members(m, o, d, pick);
    }
    if (s > 1 && (dtfm_rand(&se->rng) & 1)) {
        uint32_t d = (uint32_t)rand_below(&se->rng, n), e;
        do
            e = (uint32_t)rand_below(&se->rng, n);
        while (o->group[e] == o->group[d]);
        swap_members(m, o, d, e);
    }
    cand_build(se, o);
}

/* Two partitions are the same if they group the devices alike, whatever
 * the labels. */
static int same_partition(const struct dtfm_model *m, const struct cand *a, const struct cand *b)
{
    uint16_t map[DTFM_MAX_STAGES];
    for (size_t g = 0; g < m->stages; g++)
        map[g] = UINT16_MAX;
    for (size_t d = 0; d < m->n; d++) {
        uint16_t ga = a->group[d], gb = b->group[d];
        if (map[ga] == UINT16_MAX)
            map[ga] = gb;
        else if (map[ga] != gb)
            return 0;
    }
    return 1;
}

int dtfm_search(const struct dtfm_model *m, const struct dtfm_search_opts *o, uint16_t *group,
                struct dtfm_cost *cost, struct dtfm_search_stats *stats)
{
    if (!m || !o || !group || !cost)
        return CM_EINVAL;
    if (o->warm && dtfm_partition_check(m, o->warm) != CM_OK)
        return CM_EINVAL;
    unsigned pop = o->population ? o->population : 16, gens = o->generations ? o->generations : 200;
    if (pop < 2)
        pop = 2;
    struct search se = {.m = m, .rng = o->seed};
    /* the population, the offspring and the local search's best so far */
    struct cand *c = calloc(pop + 2, sizeof *c);
    int rc = c ? CM_OK : CM_ENOMEM;
    for (unsigned i = 0; rc == CM_OK && i < pop + 2; i++)
        rc = cand_alloc(m, &c[i]);
    unsigned improvements = 0;
    size_t best = 0;
    if (rc == CM_OK) {
        for (unsigned i = 0; i < pop; i++) {
            if (i == 0 && o->warm)
                memcpy(c[i].group, o->warm, m->n * sizeof *c[i].group);
            else
                random_partition(&se, &c[i]);
            cand_build(&se, &c[i]);
            local_search(&se, &c[i], o->local, &c[pop + 1]);
            if (c[i].cost.total < c[best].cost.total)
                best = i;
        }
        struct cand *off = &c[pop];
        for (unsigned gen = 0; gen < gens; gen++) {
            size_t a = rand_below(&se.rng, pop), b = rand_below(&se.rng, pop - 1);
            if (b >= a)
                b++;
            crossover(&se, &c[a], &c[b], off);
            local_search(&se, off, o->local, &c[pop + 1]);
            size_t worst = 0;
            int dup = 0;
            for (size_t i = 0; i < pop; i++) {
                if (c[i].cost.total > c[worst].cost.total)
                    worst = i;
                if (!dup && fabs(c[i].cost.total - off->cost.total) <= COST_EPS * (1 + off->cost.total) &&
                    same_partition(m, &c[i], off))
                    dup = 1;
            }
            if (dup || off->cost.total >= c[worst].cost.total)
                continue;
            if (off->cost.total < c[best].cost.total - COST_EPS * (1 + c[best].cost.total))
                improvements++;
            cand_copy(m, &c[worst], off);
            if (c[worst].cost.total < c[best].cost.total)
                best = worst;
        }
        memcpy(group, c[best].group, m->n * sizeof *group);
        *cost = c[best].cost;
        if (stats)
            *stats = (struct dtfm_search_stats){se.evals, improvements};
    }
    for (unsigned i = 0; c && i < pop + 2; i++)
        cand_free(&c[i]);
    free(c);
    return rc;
}
