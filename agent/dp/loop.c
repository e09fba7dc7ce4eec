/* The data-parallel role's training loop (seed 000 §3.1-3.2;
 * docs/collaboration.md): a short driver over the phases of dp.h, each a
 * function returning the next. The accumulation phase is in accum.c, one
 * round in round.c, applying it in apply.c. Also the end of a run
 * (dp_linger) and the progress line. */
#include "agent/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_log.h"

/* How long a peer left behind by a finished collaboration keeps trying to
   fetch the final state from the peers before it turns to the coordinator. */
#define FINISHED_WAIT_S 60.0

static void job_reset(struct dp_job *j)
{
    free(j->mem);
    float *keep = j->accum;
    struct dp_state *s = j->s;
    memset(j, 0, sizeof *j);
    j->accum = keep;
    j->s = s;
}

/* Applies the round in flight (waiting for its thread) and frees its job
 * (on success; on a fatal error the loop ends and frees both jobs). The
 * caller compares l->step with the round's step + 1: a resync moved it
 * elsewhere. */
int dp_finish_inflight(struct dp_loop *l)
{
    int rc = dp_finish_round(l->s, l->inflight, &l->step, &l->last_loss);
    if (rc != CM_OK)
        return rc;
    dp_bet_check(l->inflight, l->step, &l->join_step);
    job_reset(l->inflight);
    l->inflight = NULL;
    return CM_OK;
}

/* A new accumulation: the run's end, the pass, a collaboration that
 * finished without us, the schedule, and the job of the round we
 * accumulate for (the next one while one is averaging). */
static enum dp_phase phase_begin(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    int carry = l->carry;
    l->carry = 0;
    if (dp_interrupted(s))
        return DP_END;
    if (dp_pause_wanted(s))
        return DP_PAUSE;
    int64_t acc_step = l->inflight ? l->inflight->step + 1 : l->step > l->join_step ? l->step : l->join_step;
    if (acc_step >= s->steps) {
        if (!l->inflight)
            return DP_END;
        return (l->rc = dp_finish_inflight(l)) == CM_OK ? DP_BEGIN : DP_STOP;
    }
    peer_rt_renew_pass_if_due(&s->rt);
    if (s->finished_at > 0 && !l->inflight && peer_mono_s() - s->finished_at > FINISHED_WAIT_S) {
        /* The collaboration finished without us and no peer served
           its final state in time: the coordinator's final checkpoint,
           or an error (never the last steps alone). */
        int64_t got = l->step;
        if (peer_rt_catch_up(&s->rt, s->steps, &got) == CM_OK && got >= s->steps) {
            l->step = got;
            dp_update_hash(s, l->step);
            return DP_END;
        }
        fprintf(stderr, "\nerror: the collaboration finished the run (step %lld) while we were at "
                        "step %lld, and neither a peer nor the coordinator could give us its final "
                        "state\n", (long long)s->steps, (long long)l->step);
        l->rc = CM_ESTATE;
        return DP_STOP;
    }
    if (!l->inflight) {
        pthread_mutex_lock(&s->js_mu);
        dp_schedule_upkeep(s, l->sps);
        pthread_mutex_unlock(&s->js_mu);
    }
    peer_rt_serve_state(&s->rt, l->step);
    struct dp_job *j = &l->jobs[l->cur];
    /* A round declined before it averaged anything (see phase_average)
       leaves our gradient sum in the buffer: we go on with it, rather than
       start the step over. Dropped, it had the others count samples we no
       longer held (our record showed them until our next micro-batch), and
       a peer that came back from catching up opened a round on them which
       we joined with one micro-batch: two senders on 512 samples of 2,048
       in test_schedule_follow. */
    double samples = j->samples, loss_sum = j->loss_sum, loss_n = j->loss_n, compute_s = j->compute_s;
    double sop_sum = j->sop_sum, sop_n = j->sop_n, hits = j->hits;
    carry = carry && !l->inflight && j->step == acc_step && samples > 0;
    job_reset(j);
    j->step = acc_step;
    j->pull_only = s->pull_only = dp_step_role(s);
    carry = carry && !j->pull_only;
    if (!carry)
        memset(j->accum, 0, s->tr.model->nparams * sizeof *j->accum);
    memset(&l->a, 0, sizeof l->a);
    l->a.j = j;
    l->a.acc_step = acc_step;
    l->a.low = -1;
    l->a.npresent = 1;
    if (carry) {
        l->a.samples = samples;
        l->a.loss_sum = loss_sum;
        l->a.loss_n = loss_n;
        l->a.compute_s = compute_s;
        l->a.sop_sum = sop_sum;
        l->a.sop_n = sop_n;
        l->a.hits = hits;
    }
    return DP_ACCUMULATE;
}

/* Behind, ahead after a round of our own, or diverged: take the
 * collaboration's state. Ctrl-C comes here too, to finish the round in
 * flight first (its step is ours too). */
static enum dp_phase phase_resync(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    if (l->inflight) {
        int64_t expect = l->inflight->step + 1;
        if ((l->rc = dp_finish_inflight(l)) != CM_OK)
            return DP_STOP;
        a->held = 0; /* it was about the parameters before this round */
        if (!dp_interrupted(s) && l->step == expect && !a->diverged && a->view.max_step <= l->step)
            return DP_BEGIN; /* that was all we were behind by */
    }
    if (dp_interrupted(s))
        return DP_END;
    /* What we accumulated is dropped: the others must not count it, but
       must still see us about while the state comes (dp_still_here), or
       the one compute peer left steps without us. */
    dp_publish_idle(s, a->acc_step);
    /* Ask for the parameters after the collaboration's next step:
       they are served the moment that step is applied, which leaves
       us the whole of the following accumulation to load them and
       join in (the current one is too far along to make). With
       delayed updates the peers' parameters are one step behind
       the round they accumulate for, and the next parameters are
       those of that round. */
    int64_t want = l->step;
    /* a collaboration with a round in flight: its parameters are a
       step behind the round it accumulates for, which is complete
       by the time the next parameters exist; take the current
       parameters and accumulate for that round at once (the round's
       average is then applied to the parameters of its step) */
    int in_flight = a->behind && a->low < 0 && a->going;
    /* one peer ahead does not step alone while we are about: its
       current state, not the one after its next step */
    /* peers ahead that are no majority of the present peers wait
       for us when they run delayed updates (dp_majority_behind) */
    int lone = a->behind && a->low < 0 &&
               (a->ahead_now <= 1 || (s->o.delayed_updates && 2 * a->ahead_now <= a->npresent));
    if (a->behind && a->low >= 0) {
        want = a->low + 1; /* the majority's next step */
    } else if (a->behind) {
        want = (a->view.max_pstep >= 0 ? a->view.max_pstep : a->view.max_step) + (in_flight || lone ? 0 : 1);
        if (want > s->steps)
            want = s->steps;
    }
    if (a->diverged)
        printf("\nour parameters differ from the other peers' at step %lld: fetching their state\n",
               (long long)l->step);
    else if (a->low >= 0)
        printf("\nahead of the collaboration (step %lld > %lld) after a round without it: "
               "fetching its state\n", (long long)l->step, (long long)a->low);
    else
        printf("\nbehind the collaboration (step %lld < %lld): catching up\n", (long long)l->step,
               (long long)a->view.max_step);
    CM_LOGD("join", "%s at acc %lld params %lld: max_step %lld max_pstep %lld ahead %zu at_step %zu "
                    "low %lld: want %lld (in_flight %d held %d lone %d)",
            a->diverged ? "diverged" : a->low >= 0 ? "ahead" : "behind", (long long)a->acc_step,
            (long long)l->step, (long long)a->view.max_step, (long long)a->view.max_pstep, a->ahead_now,
            a->view.at_step, (long long)a->low, (long long)want, in_flight, a->held, lone);
    int64_t got = l->step;
    if (in_flight && want == l->step && a->held) {
        /* we hold the parameters the round in flight applies to
           (we missed its window): accumulate for the round after
           it at once, a state transfer would only cost time */
        if (want + 1 < s->steps)
            l->join_step = want + 1;
    } else if (dp_sync_from_peer(s, want, &got, 0) == CM_OK) {
        l->step = got;
        /* the round after the one in flight (not the highest step
           published: a peer that joined ahead publishes the step
           after its own round) */
        if (in_flight && got == want && want + 1 < s->steps)
            l->join_step = want + 1;
    } else if (peer_rt_catch_up(&s->rt, l->step + 1, &got) == CM_OK && got > l->step) {
        l->step = got;
        dp_update_hash(s, l->step);
    } else {
        sleep(1); /* nobody could serve us yet */
    }
    CM_LOGD("join", "after catching up: params at %lld, join_step %lld", (long long)l->step,
            (long long)l->join_step);
    return DP_BEGIN;
}

/* The accumulation is complete: apply the previous round before this one
 * starts (one step of staleness at most), then average this one, on a
 * thread of its own with delayed updates (the next accumulation goes on
 * meanwhile), else here, and apply it. */
static enum dp_phase phase_average(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    struct dp_acc *a = &l->a;
    struct dp_job *j = a->j;
    if (l->inflight) {
        int64_t expect = l->inflight->step + 1;
        if ((l->rc = dp_finish_inflight(l)) != CM_OK)
            return DP_STOP;
        if (l->step != expect)
            return DP_BEGIN;
    }
    CM_LOGD("join", "round %lld starts: %.0f samples (view %.0f at %zu peers), params at %lld, "
                    "others %zu present %zu join_step %lld",
            (long long)j->step, a->samples, a->view.samples, a->view.at_step, (long long)l->step, j->others,
            j->present, (long long)l->join_step);
    j->samples = a->samples;
    j->loss_sum = a->loss_sum;
    j->loss_n = a->loss_n;
    j->compute_s = a->compute_s;
    j->sop_sum = a->sop_sum;
    j->sop_n = a->sop_n;
    j->hits = a->hits;
    j->sps = l->sps;
    j->finished = s->finished_at > 0;
    if (s->o.delayed_updates && !s->o.aggregate_only &&
        pthread_create(&j->th, NULL, dp_round_thread, j) == 0) {
        j->threaded = 1;
        l->inflight = j;
        l->cur ^= 1;
        return DP_BEGIN;
    }
    dp_run_round(j);
    if ((l->rc = dp_finish_round(s, j, &l->step, &l->last_loss)) != CM_OK)
        return DP_STOP;
    dp_bet_check(j, l->step, &l->join_step);
    /* declined before averaging (round.c, round_members): the buffer still
       holds our gradient sum of this step's parameters */
    l->carry = j->alone && l->step == j->step;
    return DP_BEGIN;
}

int dp_train_loop(struct dp_state *s)
{
    size_t n = s->tr.model->nparams;
    struct dp_loop *l = calloc(1, sizeof *l);
    if (!l)
        return CM_ENOMEM;
    l->s = s;
    l->jobs[0].s = l->jobs[1].s = s;
    l->grad = malloc(n * sizeof *l->grad);
    l->jobs[0].accum = calloc(n, sizeof(float));
    l->jobs[1].accum = calloc(n, sizeof(float));
    l->last_loss = NAN;
    l->step = (int64_t)s->tr.opt->step;
    enum dp_phase ph = l->grad && l->jobs[0].accum && l->jobs[1].accum ? DP_BEGIN : DP_STOP;
    if (ph == DP_STOP)
        l->rc = CM_ENOMEM;
    dp_update_hash(s, l->step);
    while (ph != DP_END && ph != DP_STOP) {
        switch (ph) {
        case DP_BEGIN: ph = phase_begin(l); break;
        case DP_ACCUMULATE: ph = dp_accumulate(l); break;
        case DP_RESYNC: ph = phase_resync(l); break;
        case DP_AVERAGE: ph = phase_average(l); break;
        case DP_PAUSE: ph = dp_pause(l); break;
        default: ph = DP_STOP; break;
        }
    }
    if (ph == DP_END && l->inflight)
        l->rc = dp_finish_round(s, l->inflight, &l->step, &l->last_loss);
    else if (l->inflight && l->inflight->threaded)
        pthread_join(l->inflight->th, NULL);
    printf("\n");
    int rc = l->rc;
    free(l->jobs[0].mem);
    free(l->jobs[1].mem);
    free(l->jobs[0].accum);
    free(l->jobs[1].accum);
    free(l->grad);
    free(l);
    return rc;
}

/* After the last step: peers still behind may need our final state; serve
 * it while any of them shows up (fresh progress below the last step, or a
 * request), for at most a minute. */
#define AUX_LINGER_S 10.0 /* the engine's default linger_ms */
void dp_linger(struct dp_state *s, int64_t step)
{
    if (s->o.aggregate_only) {
        /* the members may still be fetching our part of the last round:
           our engine serves it until they have it or its linger ends, but
           only while we run (without this, every member skipped our part
           of the last step) */
        double t0 = peer_mono_s();
        while (!dp_interrupted(s) && peer_mono_s() - t0 < AUX_LINGER_S)
            usleep(100000);
        return;
    }
    if (!peer_rt_addrs(&s->rt, NULL, NULL))
        return;
    double t0 = peer_mono_s(), quiet_since = t0;
    while (!dp_interrupted(s) && peer_mono_s() - t0 < 60 && peer_mono_s() - quiet_since < 3) {
        dp_publish_progress(s, step, 0, 0, 0);
        peer_rt_serve_state(&s->rt, step);
        struct collab_progress *p = NULL;
        size_t n = 0;
        int busy = peer_net_state_wanted(s->rt.net) >= 0;
        if (dp_read_progress(s, &p, &n) == CM_OK) {
            int64_t now = dp_now(s);
            for (size_t i = 0; i < n; i++)
                busy |= !p[i].aux && p[i].step < step && p[i].t_ms > now - 3000;
        }
        free(p);
        if (busy)
            quiet_since = peer_mono_s();
        usleep(100000);
    }
}

/* The progress line: updated in place (--progress live), or a line per
 * step and at most one per 10 s within a step (lines: for logs). */
void dp_print_line(const struct dp_state *s, long step, double samples, double sps, int pull_only,
                   size_t peers, double loss, double eta)
{
    double target = s->target;
    dp_status_note(s, step, samples, sps, pull_only, peers, loss, eta);
    static long last_step = -1;
    static double last_t;
    if (!s->progress_live) {
        if (step == last_step && peer_mono_s() - last_t < 10)
            return;
        last_step = step;
        last_t = peer_mono_s();
    }
    char etas[32], rate[32], losss[32];
    if (isfinite(eta))
        snprintf(etas, sizeof etas, "%.1fs", eta);
    else
        snprintf(etas, sizeof etas, "?");
    /* a pull-only peer computes nothing: its last rate and loss would mislead */
    if (pull_only)
        snprintf(rate, sizeof rate, "  pull-only (no compute)");
    else
        snprintf(rate, sizeof rate, "%7.1f samples/s", sps);
    if (pull_only || !isfinite(loss))
        snprintf(losss, sizeof losss, "%7s", "-");
    else
        snprintf(losss, sizeof losss, "%7.4f", loss);
    char ex[96];
    dp_experts_line((struct dp_state *)s, ex, sizeof ex, 0);
    printf("%sstep %6ld | samples %8.0f / %.0f | %s | %2zu peers | loss %s | next step in %s%s%s",
           s->progress_live ? "\r" : "", step, samples, target, rate, peers, losss, etas, ex,
           s->progress_live ? "   " : "\n");
    fflush(stdout);
}
