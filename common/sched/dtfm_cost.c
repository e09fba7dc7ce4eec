/* DT-FM's cost model (seed 003_f3537b728458fcc1.txt, §3.2-3.3) plus a
 * compute term: see dtfm.h for the formulas. */
#include "sched/dtfm_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

int dtfm_model_new(const struct dtfm_problem *p, struct dtfm_model **out, const char **why)
{
    static const char *unused;
    if (!why)
        why = &unused;
    *out = NULL;
    if (!p || p->stages < 1 || p->stages > DTFM_MAX_STAGES) {
        *why = "stages must be 1-64";
        return CM_EINVAL;
    }
    if (p->replicas < 1 || p->replicas > DTFM_MAX_REPLICAS) {
        *why = "replicas must be 1-64";
        return CM_EINVAL;
    }
    size_t n = p->stages * p->replicas;
    if (n > DTFM_MAX_DEVICES) {
        *why = "stages x replicas must be at most 1024 devices";
        return CM_EINVAL;
    }
    if (!p->delay_s || !p->bw_bps) {
        *why = "delay and bandwidth matrices are required";
        return CM_EINVAL;
    }
    if (!(p->act_bytes >= 0 && p->act_bytes < 1e15) || !(p->grad_bytes >= 0 && p->grad_bytes < 1e15)) {
        *why = "activation and gradient sizes must be finite and >= 0";
        return CM_EINVAL;
    }
    if (!(p->tied_bytes >= 0 && p->tied_bytes < 1e15)) {
        *why = "the tied embedding's size must be finite and >= 0";
        return CM_EINVAL;
    }
    if (p->micro_batches > DTFM_MAX_MICRO_BATCHES) {
        *why = "micro-batches must be at most 1,000,000";
        return CM_EINVAL;
    }
    if (!p->stage_work != !p->speed) {
        *why = "stage work and device speeds come together";
        return CM_EINVAL;
    }
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < n; b++) {
            if (a == b)
                continue;
            double dl = p->delay_s[a * n + b], bw = p->bw_bps[a * n + b];
            if (!(dl >= 0 && dl < 1e6)) {
                *why = "a delay is negative, not finite or absurd";
                return CM_EINVAL;
            }
            if (!(bw > 0 && bw < 1e15)) {
                *why = "a bandwidth is not positive and finite";
                return CM_EINVAL;
            }
        }
    if (p->stage_work) {
        for (size_t j = 0; j < p->stages; j++)
            if (!(p->stage_work[j] >= 0 && p->stage_work[j] < 1e300)) {
                *why = "a stage's work is negative or not finite";
                return CM_EINVAL;
            }
        for (size_t d = 0; d < n; d++)
            if (!(p->speed[d] > 0 && p->speed[d] < 1e300)) {
                *why = "a device's speed is not positive and finite";
                return CM_EINVAL;
            }
    }
    struct dtfm_model *m = calloc(1, sizeof *m);
    if (!m)
        return CM_ENOMEM;
    m->n = n;
    m->stages = p->stages;
    m->replicas = p->replicas;
    m->dp = calloc(n * n, sizeof *m->dp);
    m->pp = calloc(n * n, sizeof *m->pp);
    if (p->stage_work) {
        m->work = malloc(p->stages * sizeof *m->work);
        m->speed = malloc(n * sizeof *m->speed);
    }
    m->mb = p->micro_batches > 1 ? p->micro_batches : 1;
    if (m->mb > 1)
        m->pp_mb = calloc(n * n, sizeof *m->pp_mb);
    if (p->tied_bytes > 0 && p->stages > 1)
        m->tied = calloc(n * n, sizeof *m->tied);
    if (p->norm_exchange && p->stages > 1)
        m->alpha = calloc(n * n, sizeof *m->alpha);
    if (!m->dp || !m->pp || (p->stage_work && (!m->work || !m->speed)) || (m->mb > 1 && !m->pp_mb) ||
        (p->tied_bytes > 0 && p->stages > 1 && !m->tied) || (p->norm_exchange && p->stages > 1 && !m->alpha)) {
        dtfm_model_free(m);
        return CM_ENOMEM;
    }
    /* The communication graph of §2: each edge carries the average of the
     * two directions' delay and bandwidth. */
    double dp_bits = 8.0 * p->grad_bytes / (double)p->replicas, pp_bits = 8.0 * p->act_bytes;
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < n; b++) {
            if (a == b)
                continue;
            double alpha = 0.5 * (p->delay_s[a * n + b] + p->delay_s[b * n + a]);
            double beta = 0.5 * (p->bw_bps[a * n + b] + p->bw_bps[b * n + a]);
            m->dp[a * n + b] = 2.0 * (alpha + dp_bits / beta);
            m->pp[a * n + b] = 2.0 * (alpha + pp_bits / beta);
            if (m->pp_mb)
                m->pp_mb[a * n + b] = alpha + pp_bits / ((double)m->mb * beta);
            if (m->tied)
                m->tied[a * n + b] = 2.0 * (alpha + 8.0 * p->tied_bytes / beta);
            if (m->alpha)
                m->alpha[a * n + b] = alpha;
        }
    if (p->stage_work) {
        memcpy(m->work, p->stage_work, p->stages * sizeof *m->work);
        memcpy(m->speed, p->speed, n * sizeof *m->speed);
    }
    *out = m;
    return CM_OK;
}

void dtfm_model_free(struct dtfm_model *m)
{
    if (!m)
        return;
    free(m->dp);
    free(m->pp);
    free(m->work);
    free(m->speed);
    free(m->pp_mb);
    free(m->tied);
    free(m->alpha);
    free(m);
}

size_t dtfm_devices(const struct dtfm_model *m) { return m->n; }
size_t dtfm_stages(const struct dtfm_model *m) { return m->stages; }
size_t dtfm_replicas(const struct dtfm_model *m) { return m->replicas; }

int dtfm_partition_check(const struct dtfm_model *m, const uint16_t *group)
{
    uint32_t count[DTFM_MAX_STAGES] = {0};
    for (size_t d = 0; d < m->n; d++) {
        if (group[d] >= m->stages)
            return CM_EINVAL;
        count[group[d]]++;
    }
    for (size_t g = 0; g < m->stages; g++)
        if (count[g] != m->replicas)
            return CM_EINVAL;
    return CM_OK;
}

int dtfm_assignment_check(const struct dtfm_model *m, const uint32_t *assign)
{
    uint8_t seen[DTFM_MAX_DEVICES] = {0};
    for (size_t t = 0; t < m->n; t++) {
        if (assign[t] >= m->n || seen[assign[t]])
            return CM_EINVAL;
        seen[assign[t]] = 1;
    }
    return CM_OK;
}

void dtfm_members(const struct dtfm_model *m, const uint16_t *group, uint32_t *members)
{
    uint32_t fill[DTFM_MAX_STAGES] = {0};
    for (size_t d = 0; d < m->n; d++) {
        uint16_t g = group[d];
        members[(size_t)g * m->replicas + fill[g]++] = (uint32_t)d;
    }
}

double dtfm_dp_group(const struct dtfm_model *m, const uint32_t *members)
{
    double worst = 0;
    size_t r = m->replicas, n = m->n;
    for (size_t k = 0; k < r; k++) {
        const double *row = m->dp + (size_t)members[k] * n;
        double sum = 0;
        for (size_t l = 0; l < r; l++)
            sum += row[members[l]]; /* the diagonal is 0 */
        if (sum > worst)
            worst = sum;
    }
    return worst;
}

/* Kuhn's augmenting paths on bit sets: adj[k] holds the b-indices a[k] may
 * use. Returns 1 when every a-vertex is matched; mate_b[l] = its a-index. */
static int augment(const uint64_t *adj, size_t k, uint64_t *visited, int *mate_b)
{
    uint64_t cand = adj[k] & ~*visited;
    while (cand) {
        int l = __builtin_ctzll(cand);
        cand &= cand - 1;
        *visited |= 1ull << l;
        if (mate_b[l] < 0 || augment(adj, (size_t)mate_b[l], visited, mate_b)) {
            mate_b[l] = (int)k;
            return 1;
        }
    }
    return 0;
}

static int perfect(const uint64_t *adj, size_t r, int *mate_b)
{
    for (size_t l = 0; l < r; l++)
        mate_b[l] = -1;
    for (size_t k = 0; k < r; k++) {
        uint64_t visited = 0;
        if (!augment(adj, k, &visited, mate_b))
            return 0;
    }
    return 1;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Eq. 3 is a bottleneck assignment: the smallest threshold t such that the
 * edges of weight <= t hold a perfect matching, found by binary search over
 * the sorted weights (Kuhn's algorithm per probe). */
double dtfm_bottleneck(const struct dtfm_model *m, const uint32_t *a, const uint32_t *b,
                       uint32_t *match)
{
    size_t r = m->replicas, n = m->n;
    double w[DTFM_MAX_REPLICAS * DTFM_MAX_REPLICAS];
    double sorted[DTFM_MAX_REPLICAS * DTFM_MAX_REPLICAS];
    for (size_t k = 0; k < r; k++)
        for (size_t l = 0; l < r; l++)
            w[k * r + l] = sorted[k * r + l] = m->pp[(size_t)a[k] * n + b[l]];
    size_t cnt = r * r;
    qsort(sorted, cnt, sizeof *sorted, cmp_double);
    /* Any perfect matching's bottleneck is at least the largest of the rows'
     * and the columns' minima: start the search there. */
    double floor_t = 0;
    for (size_t k = 0; k < r; k++) {
        double rmin = INFINITY, cmin = INFINITY;
        for (size_t l = 0; l < r; l++) {
            if (w[k * r + l] < rmin)
                rmin = w[k * r + l];
            if (w[l * r + k] < cmin)
                cmin = w[l * r + k];
        }
        if (rmin > floor_t)
            floor_t = rmin;
        if (cmin > floor_t)
            floor_t = cmin;
    }
    size_t lo = 0, hi = cnt - 1; /* sorted[hi] always admits a matching */
    while (lo < cnt && sorted[lo] < floor_t)
        lo++;
    uint64_t adj[DTFM_MAX_REPLICAS];
    int mate_b[DTFM_MAX_REPLICAS];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        double t = sorted[mid];
        for (size_t k = 0; k < r; k++) {
            adj[k] = 0;
            for (size_t l = 0; l < r; l++)
                if (w[k * r + l] <= t)
                    adj[k] |= 1ull << l;
        }
        if (perfect(adj, r, mate_b))
            hi = mid;
        else
            lo = mid + 1;
    }
    if (match) {
        double t = sorted[hi];
        for (size_t k = 0; k < r; k++) {
            adj[k] = 0;
            for (size_t l = 0; l < r; l++)
                if (w[k * r + l] <= t)
                    adj[k] |= 1ull << l;
        }
        perfect(adj, r, mate_b);
        for (size_t l = 0; l < r; l++)
            match[mate_b[l]] = (uint32_t)l;
    }
    return sorted[hi];
}

static double path_cost(const double *w, size_t s, const uint32_t *order)
{
    double c = 0;
    for (size_t i = 1; i < s; i++)
        c += w[order[i - 1] * s + order[i]];
    return c;
}

/* Above DTFM_TSP_EXACT_MAX nodes: nearest neighbour from every start, then
 * 2-opt (reversing a segment) until nothing improves. */
static double tsp_heuristic(const double *w, size_t s, uint32_t *order)
{
    uint32_t cur[DTFM_MAX_STAGES];
    double best = INFINITY;
    for (size_t start = 0; start < s; start++) {
        uint8_t used[DTFM_MAX_STAGES] = {0};
        cur[0] = (uint32_t)start;
        used[start] = 1;
        for (size_t i = 1; i < s; i++) {
            size_t pick = s;
            for (size_t v = 0; v < s; v++)
                if (!used[v] && (pick == s || w[cur[i - 1] * s + v] < w[cur[i - 1] * s + pick]))
                    pick = v;
            cur[i] = (uint32_t)pick;
            used[pick] = 1;
        }
        for (int improved = 1; improved;) {
            improved = 0;
            for (size_t i = 0; i + 1 < s; i++)
                for (size_t j = i + 1; j < s; j++) {
                    /* reverse cur[i..j]: the edges (i-1, i) and (j, j+1) change */
                    double before = 0, after = 0;
                    if (i > 0) {
                        before += w[cur[i - 1] * s + cur[i]];
                        after += w[cur[i - 1] * s + cur[j]];
                    }
                    if (j + 1 < s) {
                        before += w[cur[j] * s + cur[j + 1]];
                        after += w[cur[i] * s + cur[j + 1]];
                    }
                    if (after < before - 1e-12) {
                        for (size_t x = i, y = j; x < y; x++, y--) {
                            uint32_t t = cur[x];
                            cur[x] = cur[y];
                            cur[y] = t;
                        }
                        improved = 1;
                    }
                }
        }
        double c = path_cost(w, s, cur);
        if (c < best) {
            best = c;
            memcpy(order, cur, s * sizeof *order);
        }
    }
    return best;
}

/* Held-Karp for open paths: for each (mask, v) the best path visiting the
 * nodes of mask and ending at v, starting anywhere; "best" is the smallest
 * sum of its edges, or with `longest` the smallest longest edge, ties
 * broken by the smaller sum. The best whole path goes into order; *value
 * gets its sum (or longest edge). 0 when out of memory (order untouched).
 * s in 2..DTFM_TSP_EXACT_MAX. */
static int held_karp(const double *w, size_t s, int longest, uint32_t *order, double *value)
{
    size_t full = (size_t)1 << s;
    double *key = calloc(full * s, sizeof *key), *sum = calloc(full * s, sizeof *sum);
    uint8_t *prev = calloc(full * s, 1);
    if (!key || !sum || !prev) {
        free(key);
        free(sum);
        free(prev);
        return 0;
    }
    for (size_t i = 0; i < full * s; i++)
        key[i] = sum[i] = INFINITY;
    for (size_t v = 0; v < s; v++) {
        key[((size_t)1 << v) * s + v] = sum[((size_t)1 << v) * s + v] = 0;
        prev[((size_t)1 << v) * s + v] = (uint8_t)v;
    }
    for (size_t mask = 1; mask < full; mask++)
        for (size_t v = 0; v < s; v++) {
            size_t k = mask * s + v;
            if (!(mask >> v & 1) || key[k] == INFINITY)
                continue;
            for (size_t u = 0; u < s; u++) {
                if (mask >> u & 1)
                    continue;
                size_t nk = (mask | (size_t)1 << u) * s + u;
                double ns = sum[k] + w[v * s + u], nkey = longest ? fmax(key[k], w[v * s + u]) : ns;
                if (nkey < key[nk] || (nkey == key[nk] && ns < sum[nk])) {
                    key[nk] = nkey;
                    sum[nk] = ns;
                    prev[nk] = (uint8_t)v;
                }
            }
        }
    size_t last = 0, f = (full - 1) * s;
    for (size_t v = 1; v < s; v++)
        if (key[f + v] < key[f + last] || (key[f + v] == key[f + last] && sum[f + v] < sum[f + last]))
            last = v;
    *value = key[f + last];
    size_t mask = full - 1;
    for (size_t i = s; i-- > 0;) {
        order[i] = (uint32_t)last;
        size_t p = prev[mask * s + last];
        mask &= ~((size_t)1 << last);
        last = p;
    }
    free(key);
    free(sum);
    free(prev);
    return 1;
}

double dtfm_tsp_open(const double *w, size_t s, uint32_t *order)
{
    if (s == 1) {
        order[0] = 0;
        return 0;
    }
    double total;
    if (s > DTFM_TSP_EXACT_MAX || !held_karp(w, s, 0, order, &total))
        return tsp_heuristic(w, s, order);
    return total;
}

/* With a step's micro-batches one after the other (how the stage agents
 * ran them before 1F1B, docs/pipelines.md): each stage computes in turn, and a
 * stage's replicas wait for the slowest of them (they average before the
 * update). So the step's computing is the sum over the stages of the
 * slowest replica's time. */
static double compute_in_order(const struct dtfm_model *m, const uint32_t *members, const uint32_t *order)
{
    double sum = 0;
    for (size_t j = 0; j < m->stages; j++) {
        const uint32_t *g = members + (size_t)order[j] * m->replicas;
        double worst = 0;
        for (size_t k = 0; k < m->replicas; k++) {
            double t = m->work[j] / m->speed[g[k]];
            if (t > worst)
                worst = t;
        }
        sum += worst;
    }
    return sum;
}

double dtfm_compute_term(const struct dtfm_model *m, const uint32_t *members, uint32_t *order)
{
    if (!m->work)
        return 0;
    double fwd = compute_in_order(m, members, order);
    uint32_t rev[DTFM_MAX_STAGES];
    for (size_t j = 0; j < m->stages; j++)
        rev[j] = order[m->stages - 1 - j];
    double bwd = compute_in_order(m, members, rev);
    if (bwd < fwd) {
        memcpy(order, rev, m->stages * sizeof *order);
        return bwd;
    }
    return fwd;
}

/* The open path through all s <= DTFM_TSP_EXACT_MAX nodes whose longest
 * edge is shortest (ties: the shorter sum); with many micro-batches the
 * busiest link matters more than the sum (dtfm.h). 0 when it cannot (s too
 * large, no memory): order untouched. */
static int bottleneck_path(const double *w, size_t s, uint32_t *order)
{
    double longest;
    return s >= 3 && s <= DTFM_TSP_EXACT_MAX && held_karp(w, s, 1, order, &longest);
}

/* Replica i starts at the i-th device of the first group in `order` and
 * follows the bottleneck matchings along the path. */
static void assign_along(const struct dtfm_model *m, const uint32_t *members, const uint32_t *order,
                         uint32_t *assign)
{
    size_t s = m->stages, r = m->replicas;
    uint32_t cur[DTFM_MAX_REPLICAS], match[DTFM_MAX_REPLICAS];
    for (size_t i = 0; i < r; i++)
        cur[i] = (uint32_t)i; /* index within the current group */
    for (size_t j = 0; j < s; j++) {
        const uint32_t *g = members + (size_t)order[j] * r;
        for (size_t i = 0; i < r; i++)
            assign[i * s + j] = g[cur[i]];
        if (j + 1 < s) {
            dtfm_bottleneck(m, g, members + (size_t)order[j + 1] * r, match);
            for (size_t i = 0; i < r; i++)
                cur[i] = match[cur[i]];
        }
    }
}

/* The tied embedding's exchange between each pipeline's first and last
 * stage (dtfm.h): the slowest replica's 2 (alpha + c_tied / beta). */
static double tied_term(const struct dtfm_model *m, const uint32_t *assign)
{
    size_t s = m->stages;
    if (!m->tied || s < 2)
        return 0;
    double t = 0;
    for (size_t i = 0; i < m->replicas; i++)
        t = fmax(t, m->tied[(size_t)assign[i * s] * m->n + assign[i * s + s - 1]]);
    return t;
}

/* The norms' exchange after the averaging (dtfm.h, norm_exchange): the
 * slowest replica's largest one-way delay between two of its stages. */
static double norm_term(const struct dtfm_model *m, const uint32_t *assign)
{
    size_t s = m->stages;
    if (!m->alpha)
        return 0;
    double t = 0;
    for (size_t i = 0; i < m->replicas; i++)
        for (size_t j = 0; j < s; j++)
            for (size_t k = j + 1; k < s; k++)
                t = fmax(t, m->alpha[(size_t)assign[i * s + j] * m->n + assign[i * s + k]]);
    return t;
}

/* What each pipeline's ends and stages exchange once a step: the tied
 * embedding's gradient and the norms. */
static double ends_term(const struct dtfm_model *m, const uint32_t *assign)
{
    return tied_term(m, assign) + norm_term(m, assign);
}

/* Pipeline and compute terms of an assignment run 1F1B with m->mb > 1
 * micro-batches (dtfm.h), its stages read forward (rev 0: position j is
 * column j) or backward (rev 1: position j is column S - 1 - j). */
static void pipelined(const struct dtfm_model *m, const uint32_t *assign, int rev, double *pp, double *comp)
{
    size_t s = m->stages, r = m->replicas, n = m->n;
    double M = (double)m->mb, sum_e = 0, max_e = 0, sum_c = 0, max_c = 0;
    for (size_t j = 0; j < s; j++) {
        size_t col = rev ? s - 1 - j : j;
        if (m->work) {
            double worst = 0;
            for (size_t i = 0; i < r; i++) {
                double t = m->work[j] / (M * m->speed[assign[i * s + col]]);
                worst = t > worst ? t : worst;
            }
            worst *= j + 1 < s ? 4.0 / 3.0 : 1.0;
            sum_c += worst;
            max_c = worst > max_c ? worst : max_c;
        }
        if (j + 1 < s) {
            size_t nxt = rev ? col - 1 : col + 1;
            double e = 0;
            for (size_t i = 0; i < r; i++) {
                double c = m->pp_mb[(size_t)assign[i * s + col] * n + assign[i * s + nxt]];
                e = c > e ? c : e;
            }
            sum_e += e;
            max_e = e > max_e ? e : max_e;
        }
    }
    *pp = 2 * sum_e;
    *comp = sum_c;
    if (max_e >= max_c)
        *pp += (M - 1) * max_e;
    else
        *comp += (M - 1) * max_c;
}

/* With micro-batches: the better direction of assign's path under 1F1B
 * (assign reversed to it when that is the backward one). */
static void pipelined_best(const struct dtfm_model *m, uint32_t *assign, struct dtfm_cost *cost)
{
    double pf, cf, pb, cb;
    pipelined(m, assign, 0, &pf, &cf);
    pipelined(m, assign, 1, &pb, &cb);
    if (pb + cb < pf + cf) {
        size_t s = m->stages;
        for (size_t i = 0; i < m->replicas; i++)
            for (size_t j = 0; j < s / 2; j++) {
                uint32_t t = assign[i * s + j];
                assign[i * s + j] = assign[i * s + s - 1 - j];
                assign[i * s + s - 1 - j] = t;
            }
        pf = pb;
        cf = cb;
    }
    cost->pp = pf;
    cost->compute = cf;
    cost->total = cost->dp + pf + cf;
}

int dtfm_cost_partition(const struct dtfm_model *m, const uint16_t *group, struct dtfm_cost *cost,
                        uint32_t *assign)
{
    if (dtfm_partition_check(m, group) != CM_OK)
        return CM_EINVAL;
    size_t s = m->stages, r = m->replicas;
    uint32_t *members = malloc(m->n * sizeof *members);
    double *w = malloc(s * s * sizeof *w);
    if (!members || !w) {
        free(members);
        free(w);
        return CM_ENOMEM;
    }
    dtfm_members(m, group, members);
    double dp = 0;
    for (size_t g = 0; g < s; g++) {
        double c = dtfm_dp_group(m, members + g * r);
        if (c > dp)
            dp = c;
    }
    for (size_t g = 0; g < s; g++) {
        w[g * s + g] = 0;
        for (size_t h = g + 1; h < s; h++)
            w[g * s + h] = w[h * s + g] = dtfm_bottleneck(m, members + g * r, members + h * r, NULL);
    }
    uint32_t order[DTFM_MAX_STAGES];
    double pp = dtfm_tsp_open(w, s, order);
    double comp = dtfm_compute_term(m, members, order);
    cost->dp = dp;
    cost->pp = pp;
    cost->compute = comp;
    cost->total = dp + pp + comp;
    uint32_t *own = NULL, *alt = NULL;
    int need = m->mb > 1 || m->tied || m->alpha; /* costs that depend on who talks to whom */
    if ((!assign && need && !(assign = own = malloc(m->n * sizeof *assign))) ||
        (m->mb > 1 && !(alt = malloc(m->n * sizeof *alt)))) {
        free(own);
        free(members);
        free(w);
        return CM_ENOMEM;
    }
    if (assign) {
        assign_along(m, members, order, assign);
        if (m->mb > 1) {
            pipelined_best(m, assign, cost);
            /* with micro-batches the path of the smallest busiest link may
               beat the smallest sum's */
            uint32_t order2[DTFM_MAX_STAGES];
            struct dtfm_cost c2 = {.dp = dp};
            if (bottleneck_path(w, s, order2)) {
                assign_along(m, members, order2, alt);
                pipelined_best(m, alt, &c2);
                if (c2.total + ends_term(m, alt) < cost->total + ends_term(m, assign)) {
                    *cost = c2;
                    memcpy(assign, alt, m->n * sizeof *assign);
                }
            }
        }
        double t = ends_term(m, assign);
        cost->pp += t;
        cost->total += t;
    }
    free(alt);
    free(own);
    free(members);
    free(w);
    return CM_OK;
}

int dtfm_cost_assignment(const struct dtfm_model *m, const uint32_t *assign, struct dtfm_cost *cost)
{
    if (dtfm_assignment_check(m, assign) != CM_OK)
        return CM_EINVAL;
    size_t s = m->stages, r = m->replicas, n = m->n;
    uint32_t members[DTFM_MAX_REPLICAS];
    double dp = 0, pp = 0, comp = 0;
    for (size_t j = 0; j < s; j++) {
        for (size_t i = 0; i < r; i++)
            members[i] = assign[i * s + j];
        double c = dtfm_dp_group(m, members);
        if (c > dp)
            dp = c;
        if (m->work) { /* compute_in_order's rule */
            double worst = 0;
            for (size_t i = 0; i < r; i++) {
                double t = m->work[j] / m->speed[members[i]];
                if (t > worst)
                    worst = t;
            }
            comp += worst;
        }
        if (j + 1 < s) {
            double edge = 0;
            for (size_t i = 0; i < r; i++) {
                double c2 = m->pp[(size_t)assign[i * s + j] * n + assign[i * s + j + 1]];
                if (c2 > edge)
                    edge = c2;
            }
            pp += edge;
        }
    }
    cost->dp = dp;
    cost->pp = pp;
    cost->compute = comp;
    cost->total = dp + pp + comp;
    if (m->mb > 1) /* as it is: forward */
        pipelined(m, assign, 0, &cost->pp, &cost->compute);
    cost->pp += ends_term(m, assign);
    cost->total = dp + cost->pp + cost->compute;
    return CM_OK;
}
