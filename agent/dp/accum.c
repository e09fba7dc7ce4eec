/* The accumulation phase of the data-parallel loop (seed 000 §3.1:
 * "peers accumulate gradients until the collaboration reaches the target
 * batch size"; docs/collaboration.md): micro-batches into the job's
 * buffer, our progress published around each, and after each a look at
 * the peers' progress that decides what comes next: more micro-batches,
 * the round (AVERAGE), catching up (RESYNC), or a fresh start (BEGIN). */
#include "agent/dp/dp.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"

/* Members of our last round still finishing it are waited for this long. */
#define LAG_WAIT_S 5.0

/* We joined the round in flight ahead of our parameters (we caught up with
 * a round in flight, see dp_bet_check). Its average applies to the
 * parameters of its step, which the others hold from the moment they
 * applied the round before: fetch them now, while the round averages,
 * rather than when it is done. Then it is fetched while the others still
 * accumulate; fetched afterwards, it came when their next round had
 * already gathered without us, and we chased the collaboration's rounds
 * forever. */
static void drain(struct dp_loop *l);

static void prefetch(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    if (!l->inflight || s->o.aggregate_only || l->step >= l->inflight->step || dp_round_done(l->inflight) ||
        peer_mono_s() - a->t_prefetch <= 0.5 || !dp_pstep_held(s, a->seen, a->nseen, l->inflight->step))
        return;
    a->t_prefetch = peer_mono_s();
    drain(l); /* the parameters may change: nothing in flight with the old ones */
    int64_t got = l->step;
    if (dp_sync_from_peer(s, l->inflight->step, &got, 1000) == CM_OK)
        l->step = got;
}

static int finite_batch(const float *g, size_t n, const struct kern_eval *ev)
{
    if (!isfinite(ev->loss_sum))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(g[i]))
            return 0;
    return 1;
}

/* A micro-batch's gradient (in l->grad) into the job's buffer, or dropped
 * when not finite; dt: the time it took (rate estimates, compute time). */
static void take(struct dp_loop *l, const struct kern_eval *ev, double dt)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    size_t n = s->tr.model->nparams;
    float w = (float)s->tcfg.micro_batch;
    if (s->tr.remote && !finite_batch(l->grad, n, ev)) {
        /* a DMoE model drops what its experts' answers could still have
           poisoned (the model leaves out non-finite answers already; this
           guards the step against whatever slipped through): no step with
           NaN, and the next micro-batch goes on */
        s->moe_dropped++;
        fprintf(stderr, "warning: a micro-batch's gradient or loss was not finite: dropped\n");
        return;
    }
    for (size_t i = 0; i < n; i++)
        j->accum[i] += w * l->grad[i];
    a->samples += w;
    a->loss_sum += ev->loss_sum;
    a->loss_n += (double)ev->count;
    a->sop_sum += ev->sop_loss_sum;
    a->sop_n += (double)ev->sop_count;
    a->hits += (double)ev->correct;
    a->compute_s += dt;
    if (dt > 0) {
        /* our rate as the others see it: with the CPU limit's waits (the
           schedules and the estimates of the next step use it) */
        double de = dt + l->paced_s;
        l->sps = l->sps > 0 ? 0.8 * l->sps + 0.2 * (w / de) : w / de;
        l->mb_time = l->mb_time > 0 ? 0.8 * l->mb_time + 0.2 * dt : dt;
        s->mb_time = l->mb_time;
    }
    l->paced_s = 0;
}

/* The oldest asynchronous micro-batch (seed 002 §3.3; agent/train/async.h)
 * into the buffer; dt counts from t0, so with K in flight the rate is
 * samples per second of wall time, not per micro-batch latency. */
static int take_async(struct dp_loop *l, double t0)
{
    struct agent_async_done d;
    int rc = agent_trainer_next(&l->s->tr, &d);
    if (rc == CM_OK)
        rc = d.rc;
    if (rc != CM_OK)
        return rc;
    memcpy(l->grad, d.grad, l->s->tr.model->nparams * sizeof *l->grad);
    take(l, &d.ev, peer_mono_s() - t0);
    return CM_OK;
}

/* Every asynchronous micro-batch in flight into the buffer: before the
 * parameters change and when the accumulation ends (they were pledged, and
 * the contexts' gradients are exact for the parameters of this step). */
static void drain(struct dp_loop *l)
{
    while (agent_trainer_inflight(&l->s->tr) > 0) {
        int rc = take_async(l, peer_mono_s());
        if (rc != CM_OK && l->rc == CM_OK)
            l->rc = rc;
    }
}

/* Asynchronous micro-batches (remote experts): keeps up to max_inflight in
 * flight (fewer once the collaboration's samples, pledges and ours in
 * flight reach the target) and takes the oldest. */
static int micro_batch_async(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    float w = (float)s->tcfg.micro_batch;
    double t0 = peer_mono_s();
    int rc = CM_OK;
    for (;;) {
        int k = agent_trainer_inflight(&s->tr);
        if (k > 0 && a->view.samples + a->view.pledged + (double)k * w >= s->target)
            break;
        if ((rc = agent_trainer_submit(&s->tr)) == CM_EBUSY)
            break;
        if (rc != CM_OK)
            return rc;
    }
    dp_publish_progress(s, a->acc_step, a->samples, l->sps,
                        w * (float)agent_trainer_inflight(&s->tr));
    if ((rc = take_async(l, t0)) != CM_OK)
        return rc;
    dp_publish_progress(s, a->acc_step, a->samples, l->sps,
                        w * (float)agent_trainer_inflight(&s->tr));
    a->t_pub = peer_mono_s();
    return CM_OK;
}

/* One micro-batch into the buffer (or, for a peer that computes nothing or
 * waits, a short pause), with our progress published. */
static int micro_batch(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    /* The volunteer's CPU limit (agent/cpu_limit.h): over budget, wait here
       rather than in one long sleep, so that a round of our step opening
       meanwhile still takes us (observe and misplaced run between naps). */
    int follower = s->o.aggregate_only || j->pull_only; /* computes nothing */
    /* our own samples make the batch (carried over a declined round, see
       phase_begin): wait for the round rather than grow it */
    int full = !follower && a->samples >= s->target;
    double pace = s->cpu.cores > 0 && !follower ? agent_cpu_limit_wait_s(&s->cpu) : 0;
    if (!follower && agent_trainer_inflight(&s->tr) > 0 &&
        (a->hold_since != 0 || a->lag_since != 0 || a->holding || pace > 0 || full))
        return take_async(l, peer_mono_s()); /* ours in flight: take them, not a nap */
    if (follower || full || a->hold_since != 0 || a->lag_since != 0 || a->holding || pace > 0) {
        double nap = follower ? 0.05 : pace > 0 ? (pace < 0.05 ? pace : 0.05) : 0.005;
        usleep((useconds_t)(nap * 1e6));
        if (pace > 0)
            l->paced_s += nap;
        if (peer_mono_s() - a->t_pub > 0.2) {
            dp_publish_progress(s, a->acc_step, a->samples, l->sps, 0);
            a->t_pub = peer_mono_s();
        }
        return CM_OK;
    }
    /* Pledge the micro-batch before computing it: the others then start no
       micro-batch the target does not need (the batch overshoots by about
       one micro-batch, not one per peer); the round is triggered by
       samples done. */
    if (s->tr.async)
        return micro_batch_async(l);
    struct kern_model *m = s->tr.model;
    size_t n = m->nparams;
    float w = (float)s->tcfg.micro_batch;
    dp_publish_progress(s, a->acc_step, a->samples, l->sps, w);
    struct kern_eval ev;
    double t0 = peer_mono_s();
    int rc = agent_trainer_compute_grads(&s->tr, &ev);
    if (rc == CM_OK)
        rc = m->be->download(l->grad, m->grads, n * sizeof *l->grad);
    if (rc != CM_OK)
        return rc;
    take(l, &ev, peer_mono_s() - t0);
    dp_publish_progress(s, a->acc_step, a->samples, l->sps, 0);
    a->t_pub = peer_mono_s();
    return CM_OK;
}

/* Reads the peers' progress into a->seen (our own record from memory: it
 * may not be visible yet), estimates the collaboration's view of our step
 * and prints the progress line. 0 when the records could not be read. */
static int observe(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    free(a->seen);
    free(a->infos);
    a->seen = NULL;
    a->infos = NULL;
    a->nseen = 0;
    if (dp_read_progress(s, &a->seen, &a->nseen) != CM_OK)
        return 0;
    struct collab_progress self = {0};
    memcpy(self.pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    int have_self = 0;
    for (size_t i = 0; i < a->nseen; i++)
        if (!memcmp(a->seen[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN)) {
            struct collab_progress *me = &a->seen[i];
            me->samples = a->samples;
            me->pledged = 0;
            me->step = a->acc_step;
            me->pstep = l->step;
            me->t_ms = dp_now(s);
            me->hash[0] = 0;
            if (s->hash_step == l->step)
                snprintf(me->hash, sizeof me->hash, "%.*s", COLLAB_HASH_HEX, s->hash);
            have_self = 1;
        }
    if (!have_self) {
        struct collab_progress *g = realloc(a->seen, (a->nseen + 1) * sizeof *a->seen);
        if (g) {
            a->seen = g;
            self.step = a->acc_step;
            self.pstep = l->step;
            self.samples = a->samples;
            self.sps = l->sps;
            self.t_ms = dp_now(s);
            self.aux = s->o.aggregate_only || j->pull_only;
            if (s->hash_step == l->step)
                snprintf(self.hash, sizeof self.hash, "%.*s", COLLAB_HASH_HEX, s->hash);
            a->seen[a->nseen++] = self;
        }
    }
    if (!(a->infos = dp_infos(a->seen, a->nseen)))
        return 0; /* no memory: as if the records could not be read */
    a->now = dp_now(s);
    collab_estimate(a->seen, a->nseen, a->acc_step, a->now, 30000, s->target, &a->view);
    if (a->view.max_step >= s->steps && s->finished_at == 0)
        s->finished_at = peer_mono_s();
    dp_print_line(s, (long)a->acc_step, a->view.samples, l->sps, j->pull_only, a->view.peers,
                  a->loss_n ? a->loss_sum / a->loss_n : l->last_loss, a->view.eta_s);
    return 1;
}

/* Where we stand against the collaboration: 1 (stop accumulating) when we
 * are behind it, ahead of it after a round of our own, or our parameters
 * differ from the majority's; sets a->open when a round of our step is
 * gathering and takes us. */
static int misplaced(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    int64_t now = a->now;
    /* A round of our step gathering (its window still takes us): join it,
       whatever the progress records say. With delayed updates the peers
       that announced first already publish the next step; counting them as
       ahead sent the others catching up instead of into the round, which
       then had no majority. */
    a->open = 0;
    int follower = s->o.aggregate_only || j->pull_only; /* joins without samples */
    if ((a->samples > 0 || follower) && peer_mono_s() - a->t_open > 0.02) {
        a->open = dp_round_open(s, a->acc_step);
        a->t_open = peer_mono_s();
    }
    /* Behind: as many peers are ahead of us as accumulate for our step,
       ourselves counted (one peer that ran ahead alone is not the
       collaboration). Peers whose round of our step is in flight (pending)
       count only when someone is past it or they are more than we are: a
       tie's round is declined (2 senders of 4 peers) and they come back to
       our step. Ahead: see dp_majority_below. */
    size_t firm = 0, pending = 0;
    a->ahead_now = dp_peers_ahead(a->seen, a->nseen, a->acc_step, now, &firm, &pending);
    /* Newcomers: at step 0, before any round of ours, a peer that applied a
       round (firm) is the collaboration, however many of us start at step 0
       (they trained nothing yet). Counted as above, four volunteers
       arriving together at a run two peers had trained for a while
       outnumbered them and stepped 0 -> 1 on their own, a fork healed
       only a step later (issue 17: agents behind routers that drop the
       dial-back learn their reachability 3 s after the public ones). Also
       when a round of step 0 is open: it is one of newcomers. */
    int newcomer = a->acc_step == 0 && l->step == 0 && s->n_prev == 0 && firm > 0 && !s->o.aggregate_only;
    if (newcomer ||
        (!a->open && a->view.max_step > a->acc_step && a->ahead_now >= a->view.at_step &&
         (firm > 0 || (pending > a->view.at_step && dp_round_going(s, a->seen, a->nseen, a->acc_step, now))))) {
        /* A round averaging now (its parameters are the newest a peer
           holds) is one to catch up with by joining the round after it
           only when its window held a majority: peers whose rounds were
           then declined also publish the next step for a moment, and
           betting on such a round had every peer wait for parameters
           nobody would have. */
        a->going = a->view.max_pstep >= 0 && a->view.max_pstep < a->view.max_step &&
                   dp_round_going(s, a->seen, a->nseen, a->view.max_pstep, now);
        /* the parameters of the round in flight: we may hold them */
        char maj[COLLAB_HASH_HEX + 1];
        peer_majority_hash(a->infos, a->nseen, l->step, now, maj);
        a->held = s->hash_step == l->step && maj[0] && !strncmp(maj, s->hash, COLLAB_HASH_HEX);
        if (!(a->going && a->held && a->view.max_pstep == l->step && a->acc_step == l->step + 1 &&
              !l->inflight)) {
            a->behind = 1;
            a->npresent = dp_others_present(s, a->seen, a->nseen, now) + 1;
            return 1;
        }
        /* else we accumulate for the round after it already */
    }
    if (!s->o.aggregate_only && !l->inflight &&
        dp_majority_below(s, a->seen, a->nseen, a->acc_step, a->view.at_step, now, &a->low) > 0) {
        a->behind = 1;
        return 1;
    }
    a->low = -1;
    /* Compared at the parameters' step, so it also runs while a round is
       in flight (delayed updates: the parameters are a step behind the
       accumulation, and a split at start-up used to persist because no
       check ever saw two hashes of one step). */
    if (!s->o.aggregate_only && s->hash_step == l->step) {
        char maj[COLLAB_HASH_HEX + 1];
        peer_majority_hash(a->infos, a->nseen, l->step, now, maj);
        if (maj[0] && strncmp(maj, s->hash, COLLAB_HASH_HEX) != 0) {
            a->diverged = 1;
            return 1;
        }
    }
    return 0;
}

/* Whether our round starts now: 1 when the collaboration reached the
 * target (or a round of our step is open), or when a pull-only peer must
 * compute after all (a->restart). */
static int ready(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    int64_t now = a->now;
    int follower = s->o.aggregate_only || j->pull_only;
    j->others = dp_others_active(s, a->seen, a->nseen, a->acc_step, now);
    j->present = dp_others_present(s, a->seen, a->nseen, now);
    if (j->pull_only) {
        if (j->present > 0 || a->view.samples > 0)
            a->po_idle_since = 0;
        else if (a->po_idle_since == 0)
            a->po_idle_since = peer_mono_s();
        else if (peer_mono_s() - a->po_idle_since > DP_PULL_ONLY_IDLE_S) {
            fprintf(stderr, "\nwarning: step %lld: no computing peer for %.0f s; computing "
                            "although the schedule says not to\n",
                    (long long)a->acc_step, DP_PULL_ONLY_IDLE_S);
            s->pull_only_off_until = peer_mono_s() + DP_PULL_ONLY_OFF_S;
            a->restart = 1;
            return 1;
        }
    }
    if (a->open)
        return 1; /* a round of our step is gathering: join it */
    /* With no other peer accumulating for our step (fresh progress with
       samples), our round has one sender, us, and must hold the whole
       batch (round.c declines it otherwise): count our own samples, not a
       view that reaches the target with the samples of a peer gone quiet
       (a record 5-30 s old: it died, or it dropped them to catch up). */
    int solo = j->others == 0 && !follower;
    double done = solo ? a->samples : a->view.samples, pledged = solo ? 0 : a->view.pledged;
    if (done >= s->target && (a->samples > 0 || follower)) {
        /* Members of our last round still finishing it (their progress
           shows its step) are waited for, up to LAG_WAIT_S: a peer quicker
           out of a round must not run the next ones alone while the others
           are a step behind. */
        if (dp_lagging_members(s, a->seen, a->nseen, a->acc_step, now) &&
            (a->lag_since == 0 || peer_mono_s() - a->lag_since < LAG_WAIT_S)) {
            if (a->lag_since == 0)
                a->lag_since = peer_mono_s();
            return 0;
        }
        /* Delayed updates (seed 000 §3.2): the rounds follow each other at
           once (the next accumulation is done when a round ends), so peers
           that fell behind load a state while the next round gathers, and
           a pair that went on without the two others kept them chasing it.
           While at least half of the present peers are behind our step,
           wait for them: they take our current state meanwhile (`lone` in
           the resync) and join this round. The waits come from a bucket of
           DP_HOLD_S that refills at DP_HOLD_REFILL (a dead or lying peer,
           or peers that go back and forth between behind and level, cannot
           hold us up for longer). */
        if (s->o.delayed_updates && !s->o.aggregate_only) {
            int most_behind = dp_majority_behind(s, a->seen, a->nseen, a->acc_step, now);
            int was = s->hold.waiting;
            if (collab_hold_update(&s->hold, most_behind, peer_mono_s(), DP_HOLD_S, DP_HOLD_REFILL)) {
                if (!was && s->hold.tokens >= 1)
                    printf("\nstep %lld: most peers are behind us; waiting up to %.0f s for them\n",
                           (long long)a->acc_step, s->hold.tokens);
                a->holding = 1;
                return 0;
            }
            if (most_behind && a->holding && peer_mono_s() - s->hold_warned > 60) {
                fprintf(stderr, "\nwarning: step %lld: most peers stayed behind us; going on\n",
                        (long long)a->acc_step);
                s->hold_warned = peer_mono_s();
            }
        }
        a->holding = 0;
        return 1;
    }
    /* Micro-batches in flight will reach the target: wait for them rather
       than start another, unless they take far longer than ours do (their
       peer may have died). */
    if (a->samples > 0 && done + pledged >= s->target) {
        if (a->hold_since == 0)
            a->hold_since = peer_mono_s();
        else if (peer_mono_s() - a->hold_since > 1.0 + 3 * l->mb_time)
            a->hold_since = 0;
    } else {
        a->hold_since = 0;
    }
    return 0;
}

enum dp_phase dp_accumulate(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    for (;;) {
        prefetch(l);
        if (l->inflight && dp_round_done(l->inflight)) {
            /* the previous round is averaged: apply it under the
               accumulation (one step of staleness for what came before) */
            int64_t expect = l->inflight->step + 1;
            drain(l); /* ours in flight use the parameters the round replaces */
            if (l->rc != CM_OK || (l->rc = dp_finish_inflight(l)) != CM_OK)
                break;
            if (l->step != expect) { /* resynced: what we accumulated is moot */
                a->restart = 1;
                break;
            }
        }
        if (l->resumed) /* back from a pause: most likely behind; look before computing */
            l->resumed = 0;
        else if ((l->rc = micro_batch(l)) != CM_OK || dp_interrupted(s))
            break;
        if (dp_pause_wanted(s))
            break; /* nothing announced yet: this accumulation is dropped */
        peer_rt_serve_state(&s->rt, l->step);
        if (!observe(l))
            continue;
        if (misplaced(l) || ready(l))
            break;
    }
    drain(l); /* bounded: each call of theirs has its deadline */
    free(a->seen);
    free(a->infos);
    a->seen = NULL;
    a->infos = NULL;
    a->nseen = 0;
    if (l->rc != CM_OK)
        return DP_STOP;
    if (dp_pause_wanted(s) && !dp_interrupted(s))
        return DP_PAUSE;
    if (a->restart)
        return DP_BEGIN;
    if (dp_interrupted(s) || a->behind || a->diverged)
        return DP_RESYNC;
    return DP_AVERAGE;
}
