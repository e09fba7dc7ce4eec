/* Predicates over the peers' progress records (docs/collaboration.md,
 * "What keeps a collaboration together"): who accumulates for which step,
 * who is ahead or behind, whether a round of a step is open or going on.
 * Pure reads of what dp_read_progress returned, except the round checks,
 * which read the step's announcements. The training loop (accum.c)
 * decides with them. */
#include "agent/dp/dp.h"

#include <stdlib.h>
#include <string.h>

/* A member of our last round (s->prev) whose fresh progress still shows
 * that round's step: it is finishing it. */
int dp_lagging_members(const struct dp_state *s, const struct collab_progress *p, size_t n,
                       int64_t acc_step, int64_t now)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i].step >= acc_step || p[i].aux || p[i].t_ms < now - 10000 ||
            !memcmp(p[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
            continue;
        for (size_t k = 0; k < s->n_prev; k++)
            if (!memcmp(s->prev[k], p[i].pub, CM_ED25519_PUB_LEN) && p[i].step == acc_step - 1)
                return 1;
    }
    return 0;
}

/* Peers accumulating for a step: fresh progress (DP_ACTIVE_MS) with samples
 * or a pledge, compute peers only, ourselves excluded. */
size_t dp_others_active(const struct dp_state *s, const struct collab_progress *p, size_t n,
                        int64_t step, int64_t now)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += p[i].step == step && !p[i].aux && p[i].t_ms >= now - DP_ACTIVE_MS &&
             (p[i].samples > 0 || p[i].pledged > 0) && memcmp(p[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    return c;
}

/* Other compute peers with progress in the last DP_PRESENT_MS, at any step. */
size_t dp_others_present(const struct dp_state *s, const struct collab_progress *p, size_t n,
                         int64_t now)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += !p[i].aux && p[i].t_ms >= now - DP_PRESENT_MS && memcmp(p[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    return c;
}

/* Compute peers whose fresh progress shows a step after `step`: *pending
 * those one step ahead whose parameters are still at `step` (delayed
 * updates, seed 000 §3.2: they announced for the round of our step and
 * accumulate for the next one while it averages; a round of a minority is
 * declined and they come back), *firm the others (they applied our step's
 * round). Returns both together. */
size_t dp_peers_ahead(const struct collab_progress *p, size_t n, int64_t step, int64_t now,
                      size_t *firm, size_t *pending)
{
    *firm = *pending = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].step <= step || p[i].aux || p[i].t_ms < now - 30000)
            continue;
        if (p[i].step == step + 1 && p[i].pstep == step)
            (*pending)++;
        else
            (*firm)++;
    }
    return *firm + *pending;
}

/* The odd one out ahead: more peers accumulate for one earlier step than
 * for ours (ourselves counted), none of them a member of our last round
 * (those are finishing it). Then we stepped without the collaboration (a
 * round of our own) and must take its state. Returns that step's peer
 * count (0: not so) and the step in *low. */
size_t dp_majority_below(const struct dp_state *s, const struct collab_progress *p, size_t n,
                         int64_t step, size_t at_step, int64_t now, int64_t *low)
{
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].step >= step || p[i].aux || p[i].t_ms < now - DP_ACTIVE_MS)
            continue;
        size_t c = dp_others_active(s, p, n, p[i].step, now);
        if (c > best) {
            best = c;
            *low = p[i].step;
        }
    }
    if (best <= at_step)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i].step == *low && p[i].t_ms >= now - DP_ACTIVE_MS)
            for (size_t k = 0; k < s->n_prev; k++)
                if (!memcmp(s->prev[k], p[i].pub, CM_ED25519_PUB_LEN))
                    return 0;
    return best;
}

/* Delayed updates (seed 000 §3.2): at least half of the present compute
 * peers (fresh progress in the last DP_PRESENT_MS, at any step, ourselves
 * counted) accumulate for a step before `step`. Then starting our round
 * would run ahead of the collaboration rather than with it. */
int dp_majority_behind(const struct dp_state *s, const struct collab_progress *p, size_t n,
                       int64_t step, int64_t now)
{
    size_t total = 1, below = 0;
    for (size_t i = 0; i < n; i++)
        if (!p[i].aux && p[i].t_ms >= now - DP_PRESENT_MS && memcmp(p[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN)) {
            total++;
            below += p[i].step < step;
        }
    return below > 0 && 2 * below >= total;
}

/* 1 when the round of `step` goes on (collab_round_going: a closed window
 * of its announcements holds more than half of the peers on that step as
 * senders, what its members need not to decline it in round.c, round_members).
 * The peers on it: fresh compute peers accumulating for it, or a step past
 * it with their parameters still at it (they announced). */
int dp_round_going(struct dp_state *s, const struct collab_progress *p, size_t n, int64_t step,
                   int64_t now)
{
    size_t on = 0;
    for (size_t i = 0; i < n; i++)
        on += !p[i].aux && p[i].t_ms >= now - DP_ACTIVE_MS &&
              (p[i].step == step || (p[i].step == step + 1 && p[i].pstep == step));
    size_t na = 0;
    struct collab_announce *a = dp_read_announces(s, step, 0, INT64_MAX, 0, &na);
    int going = a && collab_round_going(a, na, s->o.round_window_ms, dp_gather_margin(s), now, on);
    free(a);
    return going;
}

/* 1 when a fresh compute peer other than us, with a state host, holds
 * parameters of step `pstep` or later (it publishes their hash: its state
 * can be fetched now). */
int dp_pstep_held(const struct dp_state *s, const struct collab_progress *p, size_t n,
                  int64_t pstep)
{
    int64_t now = dp_now(s);
    for (size_t i = 0; i < n; i++)
        if (!p[i].aux && p[i].st[0] && p[i].hash[0] && p[i].pstep >= pstep && p[i].t_ms >= now - DP_ACTIVE_MS &&
            memcmp(p[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
            return 1;
    return 0;
}

/* 1 when another peer's announcement for the round of `step` opens a window
 * we can still make: we then join that round with what we have, so peers
 * whose views of the progress differ (records late over a slow link) do not
 * split into rounds of their own. */
int dp_round_open(struct dp_state *s, int64_t step)
{
    size_t na = 0;
    int64_t mine = dp_now(s) + 20; /* when our announcement would be made */
    struct collab_announce *a = dp_read_announces(s, step, 1, mine, 1, &na);
    if (!a || na == 0) {
        free(a);
        return 0;
    }
    a[na].t_ms = mine;
    memcpy(a[na].pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    na++;
    int64_t close = 0;
    size_t nm = collab_round_members(a, na, s->o.round_window_ms, mine, &close);
    free(a);
    return nm > 1;
}
