/* The data-parallel role's DHT records (docs/collaboration.md; formats in
 * collab.h): our progress, the peers' progress (also handed to the runtime
 * as the run's peers, for state sync and probes), and the announcements
 * that make a round's members (seed 000 §3.1). */
#include "agent/dp/dp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"

int64_t dp_now(const struct dp_state *s)
{
    return peer_rt_now_ms(&s->rt);
}

int dp_interrupted(const struct dp_state *s)
{
    return peer_rt_interrupted(&s->rt);
}

int dp_publish_progress(struct dp_state *s, int64_t step, double samples, double sps,
                        double pledged)
{
    struct collab_progress p = {0};
    p.step = step;
    p.samples = samples;
    p.pledged = pledged;
    p.pstep = (int64_t)s->tr.opt->step;
    if (p.pstep > step)
        p.pstep = step;
    else if (p.pstep < step - 1)
        /* a round of ours averages ahead of our parameters (we joined the
           collaboration with a round in flight, see dp_bet_check): it
           applies to the parameters of step - 1, which the others hold.
           Saying `step` here made peers behind us ask for a state two
           steps past anyone's and wait 90 s per peer for it. */
        p.pstep = step - 1;
    p.sps = sps;
    p.t_ms = dp_now(s);
    char my[PEER_ADDR_MAX], st[PEER_ADDR_MAX];
    /* direct, or through a relay (which may come and go) */
    p.client = !peer_rt_addrs(&s->rt, my, st);
    snprintf(p.addr, sizeof p.addr, "%s", my);
    /* A pull-only peer counts as auxiliary for the others' counting (it
       accumulates nothing, must not hold a round back, and a round of one
       sender beside it is still one sender); it publishes its state host and
       hash like any peer with parameters. */
    p.aux = s->o.aggregate_only || s->pull_only;
    if (s->paused) {
        /* Paused (pause.c): out of every count at once, as an auxiliary
           peer with nothing done or pledged, and no state host or hash (we
           serve no state and are probed by nobody). Without this record our
           last one counted for up to 30 s: our samples toward the target,
           us among the peers accumulating for the step. */
        p.aux = 1;
        p.samples = p.pledged = p.sps = 0;
    } else if (!s->o.aggregate_only) {
        snprintf(p.st, sizeof p.st, "%s", st);
        /* the hash of the parameters it holds (at pstep: with a round in
           flight, one step behind the step it accumulates for) */
        if (s->hash_step == p.pstep)
            snprintf(p.hash, sizeof p.hash, "%.*s", COLLAB_HASH_HEX, s->hash);
    }
    s->pub_step = step;
    s->pub_samples = samples;
    s->pub_sps = sps;
    s->pub_pledged = pledged;
    s->pub_at = peer_mono_s();
    char rec[COLLAB_RECORD_MAX];
    int rc = collab_progress_encode(&p, rec, sizeof rec);
    return rc ? rc : peer_net_put(s->rt.net, s->progress_key, rec, strlen(rec), 60000);
}

int dp_publish_idle(struct dp_state *s, int64_t step)
{
    return dp_publish_progress(s, step, 0, s->pub_sps, 0);
}

/* A peer catching up computes nothing and used to publish nothing until it
 * had the state: a transfer longer than DP_PRESENT_MS (a state of 2.8 MB
 * from a peer with a 2 Mbit/s upload took 12-15 s in test_schedule_follow)
 * took it out of the others' count of compute peers about, and the one
 * left then stepped alone (or with a pull-only peer), ran ahead, and the
 * peer behind chased it with one transfer after another until the run was
 * over. Its record says the step it is at, with nothing accumulated
 * (dp_publish_idle before catching up), so the others wait for it without
 * counting samples it does not hold. */
void dp_still_here(void *ctx)
{
    struct dp_state *s = ctx;
    if (s->pub_at > 0 && peer_mono_s() - s->pub_at >= DP_STILL_HERE_S)
        dp_publish_progress(s, s->pub_step, s->pub_samples, s->pub_sps, s->pub_pledged);
}

int dp_read_progress(struct dp_state *s, struct collab_progress **out, size_t *n)
{
    struct peer_record *r = NULL;
    size_t nr = 0;
    *out = NULL;
    *n = 0;
    int rc = peer_net_get(s->rt.net, s->progress_key, &r, &nr);
    if (rc != CM_OK)
        return rc;
    struct collab_progress *p = calloc(nr ? nr : 1, sizeof *p);
    for (size_t i = 0; p && i < nr; i++)
        if (collab_progress_parse(r[i].value, r[i].len, &p[*n]) == CM_OK) {
            memcpy(p[*n].pub, r[i].author, CM_ED25519_PUB_LEN);
            (*n)++;
        }
    peer_records_free(r, nr);
    *out = p;
    return p ? CM_OK : CM_ENOMEM;
}

/* The run's peers for the runtime (struct peer_role.peers): our progress
 * records carry what state sync and the probes need. Any thread. */
static void to_info(const struct collab_progress *p, struct peer_info *q)
{
    memset(q, 0, sizeof *q);
    memcpy(q->pub, p->pub, CM_ED25519_PUB_LEN);
    snprintf(q->st, sizeof q->st, "%s", p->st);
    q->step = p->step;
    q->pstep = p->pstep;
    snprintf(q->hash, sizeof q->hash, "%s", p->hash);
    q->t_ms = p->t_ms;
    q->aux = p->aux;
}

int dp_peers(void *ctx, struct peer_info **out, size_t *n)
{
    struct collab_progress *p = NULL;
    size_t np = 0;
    *out = NULL;
    *n = 0;
    int rc = dp_read_progress(ctx, &p, &np);
    if (rc != CM_OK)
        return rc;
    struct peer_info *q = calloc(np ? np : 1, sizeof *q);
    if (!q) {
        free(p);
        return CM_ENOMEM;
    }
    for (size_t i = 0; i < np; i++)
        to_info(&p[i], &q[i]);
    free(p);
    *out = q;
    *n = np;
    return CM_OK;
}

/* The records as the runtime's peer_info (*out heap; NULL on ENOMEM), for
 * peer_majority_hash: the loop's divergence check and state sync then
 * agree on the majority by one rule. */
struct peer_info *dp_infos(const struct collab_progress *p, size_t n)
{
    struct peer_info *q = calloc(n ? n : 1, sizeof *q);
    for (size_t i = 0; q && i < n; i++)
        to_info(&p[i], &q[i]);
    return q;
}

/* The announcements of the round of `step` in the DHT (authors' keys in
 * .pub), made no later than until_ms, ours left out when others_only; room
 * for `extra` more entries. NULL (*na 0) when there are none. */
struct collab_announce *dp_read_announces(struct dp_state *s, int64_t step, int others_only,
                                          int64_t until_ms, size_t extra, size_t *na)
{
    char key[160];
    snprintf(key, sizeof key, "%s/round/%lld", s->o.run, (long long)step);
    struct peer_record *r = NULL;
    size_t nr = 0;
    *na = 0;
    if (peer_net_get(s->rt.net, key, &r, &nr) != CM_OK || nr == 0) {
        peer_records_free(r, nr);
        return NULL;
    }
    struct collab_announce *a = calloc(nr + extra, sizeof *a);
    for (size_t i = 0; a && i < nr; i++)
        if (!(others_only && !memcmp(r[i].author, s->rt.key.pub, CM_ED25519_PUB_LEN)) &&
            collab_announce_parse(r[i].value, r[i].len, &a[*na]) == CM_OK && a[*na].t_ms <= until_ms)
            memcpy(a[(*na)++].pub, r[i].author, CM_ED25519_PUB_LEN);
    peer_records_free(r, nr);
    return a;
}

int64_t dp_gather_margin(const struct dp_state *s)
{
    int64_t m = __atomic_load_n(&s->margin_ms, __ATOMIC_ACQUIRE);
    return m > 0 ? m : s->o.gather_margin_ms;
}

void dp_gather_note_put(struct dp_state *s, int64_t ms)
{
    s->put_ms[s->n_puts++ % DP_GATHER_PUTS] = ms;
    int64_t worst = 0;
    for (size_t k = 0; k < DP_GATHER_PUTS && k < s->n_puts; k++)
        worst = s->put_ms[k] > worst ? s->put_ms[k] : worst;
    int64_t m = DP_GATHER_MARGIN_X * worst;
    m = m < s->o.gather_margin_ms ? s->o.gather_margin_ms : m > DP_GATHER_MARGIN_MAX_MS ? DP_GATHER_MARGIN_MAX_MS : m;
    __atomic_store_n(&s->margin_ms, m, __ATOMIC_RELEASE);
}

/* Announces for the round of `step` and gathers its members: our round is
 * the window our announcement falls in (collab_round_members: a window
 * closes window_ms after its first announcement), and the members are read
 * once its close plus a propagation margin has passed, so every peer that
 * reads after that agrees on them. A peer too late for a window opens the
 * next one (round.c declines to step alone while others
 * accumulate). Announcing again for the same step replaces our earlier
 * announcement (newest record per author). */
int dp_gather(struct dp_state *s, int64_t step, double weight, int pull_only, size_t on,
              struct collab_announce **out, size_t *n, int64_t *close_ms)
{
    char key[160], rec[COLLAB_RECORD_MAX];
    snprintf(key, sizeof key, "%s/round/%lld", s->o.run, (long long)step);
    struct collab_announce me = {0};
    memcpy(me.pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    me.weight = s->o.aggregate_only || pull_only ? 0 : weight;
    me.sends = !s->o.aggregate_only && !pull_only;
    me.pull_only = !s->o.aggregate_only && pull_only;
    me.on = on > COLLAB_ON_MAX ? COLLAB_ON_MAX : (int)on;
    char my[PEER_ADDR_MAX];
    me.agg = peer_rt_my_addr(&s->rt, my, &me.relayed);
    me.t_ms = dp_now(s);
    me.sched_version = s->js ? dp_sched_version(s->js) : 0;
    snprintf(me.addr, sizeof me.addr, "%s", my);
    int rc = collab_announce_encode(&me, rec, sizeof rec);
    double put_t0 = peer_mono_s();
    if (rc || (rc = peer_net_put(s->rt.net, key, rec, strlen(rec), 120000)) != CM_OK)
        return rc;
    dp_gather_note_put(s, (int64_t)((peer_mono_s() - put_t0) * 1000) + 1);
    /* one margin for the whole gathering (the margin moves with each put) */
    int64_t margin = dp_gather_margin(s);
    struct collab_announce *a = NULL;
    size_t na = 0;
    int64_t close = me.t_ms + s->o.round_window_ms;
    for (;;) {
        int final = dp_now(s) >= close + margin;
        struct peer_record *r = NULL;
        size_t nr = 0;
        if ((rc = peer_net_get(s->rt.net, key, &r, &nr)) != CM_OK) {
            free(a);
            return rc;
        }
        free(a);
        a = calloc(nr + 1, sizeof *a);
        na = 0;
        for (size_t i = 0; a && i < nr; i++)
            if (collab_announce_parse(r[i].value, r[i].len, &a[na]) == CM_OK) {
                memcpy(a[na].pub, r[i].author, CM_ED25519_PUB_LEN);
                na++;
            }
        peer_records_free(r, nr);
        if (!a)
            return CM_ENOMEM;
        a[na++] = me; /* our own view of ourselves; duplicates collapse */
        na = collab_canonical(a, na);
        struct collab_announce *tmp = malloc(na * sizeof *tmp);
        if (!tmp) {
            free(a);
            return CM_ENOMEM;
        }
        memcpy(tmp, a, na * sizeof *tmp);
        size_t nm = collab_round_members(tmp, na, s->o.round_window_ms, me.t_ms, &close);
        free(tmp);
        if (final && dp_now(s) >= close + margin) {
            na = collab_round_members(a, na, s->o.round_window_ms, me.t_ms, &close);
            break;
        }
        (void)nm;
        if (!s->link_marked && dp_now(s) >= close + margin - DP_PROBE_GUARD_MS) {
            peer_rt_link_busy(&s->rt, 1); /* dp.h, DP_PROBE_GUARD_MS; released by round.c */
            s->link_marked = 1;
        }
        int64_t wait = close + margin - dp_now(s);
        usleep((useconds_t)(wait > 50 ? 50000 : wait > 0 ? wait * 1000 : 1000));
    }
    size_t k = 0;
    while (k < na && memcmp(a[k].pub, me.pub, CM_ED25519_PUB_LEN))
        k++;
    if (k == na) {
        free(a);
        return CM_EBUSY;
    }
    *out = a;
    *n = na;
    *close_ms = close;
    return CM_OK;
}
