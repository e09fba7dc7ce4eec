/* Applying an averaging round and what follows from it (seed 000 §3.1;
 * docs/collaboration.md): the optimizer step, the parameter hash, the step
 * log, the contribution report and the checkpoint upload; resyncing from a
 * peer when the round went on without us; the role a schedule gives this
 * peer for the next step, and keeping the schedule fresh. */
#include "agent/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/peer/report.h"
#include "agent/train/steplog.h"
#include "cm_err.h"
#include "cm_log.h"

/* The parameter hash of the current state (after a step, a catch-up or a
 * state transfer): published with progress so peers notice divergence. */
void dp_update_hash(struct dp_state *s, int64_t step)
{
    if (s->o.aggregate_only || agent_param_hash(s->tr.model, s->hash) != CM_OK) {
        s->hash_step = -1;
        return;
    }
    s->hash_step = step;
}

/* The runtime's state sync, then what the role keeps about it: the hash,
 * a line, the step log. */
int dp_sync_from_peer(struct dp_state *s, int64_t min_step, int64_t *step, uint32_t wait_ms)
{
    char from[PEER_ADDR_MAX] = "";
    peer_rt_link_busy(&s->rt, 1); /* the hash of what came in too, as before the split */
    int rc = peer_rt_sync_from_peer(&s->rt, min_step, step, wait_ms, from);
    if (rc != CM_OK) {
        peer_rt_link_busy(&s->rt, -1);
        return rc;
    }
    dp_update_hash(s, *step);
    printf("\nfetched the state of step %lld from a peer (%s, hash %.16s)\n", (long long)*step, from,
           s->hash);
    char line[256];
    snprintf(line, sizeof line, "{\"step\":%lld,\"hash\":\"%s\",\"synced\":true,\"t_ms\":%lld}",
             (long long)*step, s->hash, (long long)dp_now(s));
    agent_steplog_write(s->steplog, line);
    peer_rt_link_busy(&s->rt, -1);
    return CM_OK;
}

/* Fetches the state after `step` from a peer (the round went on without
 * us), falling back to the coordinator's newest checkpoint. */
#define JOIN_AHEAD_WAIT_MS 5000 /* for the state of a round that should be done already, plus
                                   three micro-batches (sync_from_peer's wait_ms) */
#define RESYNC_GIVE_UP_S 20.0
int64_t dp_resync_after(struct dp_state *s, int64_t step)
{
    int64_t got = step;
    /* Peers that applied the step hold its state at once; peers still
       finishing the round get a few seconds. A round nobody applied (all
       its members missed parts) leaves nobody to produce the state: every
       member used to wait for it from every other, 90 s each. After
       RESYNC_GIVE_UP_S we go back to our own step, and the behind check
       finds the others if they went on after all. */
    double wait = JOIN_AHEAD_WAIT_MS + 3000 * s->mb_time, t0 = peer_mono_s();
    if (wait > 90000)
        wait = 90000;
    /* the round's samples are gone; we are still about (and say so while
       a state comes: dp_still_here) */
    dp_publish_idle(s, s->pub_at > 0 ? s->pub_step : step);
    for (int tries = 0; tries < 60 && !dp_interrupted(s); tries++) {
        /* this can take a while: the pass must stay valid meanwhile, or
           every peer refuses our requests as "expired token" */
        peer_rt_renew_pass_if_due(&s->rt);
        if (dp_sync_from_peer(s, step + 1, &got, (uint32_t)wait) == CM_OK && got > step)
            return got;
        if (peer_rt_catch_up(&s->rt, step + 1, &got) == CM_OK && got > step) {
            dp_update_hash(s, got);
            return got;
        }
        if (peer_mono_s() - t0 > RESYNC_GIVE_UP_S) {
            fprintf(stderr, "\nwarning: step %lld: no peer went past the step in %.0f s; going on from "
                            "our own state\n", (long long)step, RESYNC_GIVE_UP_S);
            break;
        }
        sleep(1);
    }
    /* none came: our parameters are where the optimizer left them (on the
       join-ahead path a step before the round's) */
    return s->o.aggregate_only ? got : (int64_t)s->tr.opt->step;
}

static int upload_checkpoint(struct dp_state *s, int64_t step)
{
    char err[512], path[256], file[4400], sha[65];
    if (agent_trainer_save(&s->tr, err, sizeof err) != CM_OK) {
        fprintf(stderr, "warning: saving the checkpoint: %s\n", err);
        return CM_EIO;
    }
    snprintf(file, sizeof file, "%s/latest.ckpt", s->rt.rundir);
    if (agent_file_sha256(file, sha) != CM_OK)
        return CM_EIO;
    snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints/%lld", s->o.run, (long long)step);
    struct agent_reply r;
    int rc = agent_upload_file(&s->rt.coord, path, file, sha, &r);
    if (rc == CM_OK && r.status != 201 && r.status != 200) {
        agent_reply_report("uploading the checkpoint", &r);
        rc = CM_EPROTO;
    }
    agent_reply_free(&r);
    if (rc == CM_OK)
        printf("uploaded the checkpoint of step %lld\n", (long long)step);
    return rc;
}

/* The contribution report of a round (queued; sent in the background). */
static void report_round(struct dp_state *s, int64_t step, const uint8_t *rid, double samples,
                         double compute_s, double loss, double sop_loss, double mlm_accuracy,
                         double sps, const struct peer_round_summary *sum,
                         size_t n_parts, uint64_t agreed, const struct collab_announce *mem,
                         const struct ar_member *am, size_t nmem, const char *params_hex)
{
    struct peer_report *r = calloc(1, sizeof *r);
    if (!r)
        return;
    /* the expert servers' samples since the last report: taken (reset) at
       every round, reported or not, so each is attested at most once */
    dp_experts_attest(s, r, samples);
    if (!s->rt.rep || s->o.aggregate_only || !(samples > 0)) { /* nothing contributed */
        free(r);
        return;
    }
    r->step = step;
    snprintf(r->group, sizeof r->group, "all");
    memcpy(r->round_id, rid, sizeof r->round_id);
    r->samples = samples;
    r->compute_s = compute_s;
    r->loss = isfinite(loss) ? loss : 0;
    /* ALBERT's heads: NaN when the model has none (MLP, GPT) or the value
       is not finite; the encoder leaves those out */
    r->has_sop_loss = isfinite(sop_loss);
    r->sop_loss = r->has_sop_loss ? sop_loss : 0;
    r->has_mlm_accuracy = isfinite(mlm_accuracy);
    r->mlm_accuracy = r->has_mlm_accuracy ? mlm_accuracy : 0;
    r->sps = sps;
    r->round_ms = sum->ms_total;
    r->parts = (int)n_parts;
    r->parts_averaged = __builtin_popcountll(agreed);
    /* the parameters after this round: they vouch for the checkpoint of step + 1 */
    size_t hn = 0;
    r->has_params = params_hex && cm_hex_decode(params_hex, 64, r->params, sizeof r->params, &hn) == CM_OK &&
                    hn == sizeof r->params;
    for (size_t i = 0; i < nmem && r->n_members < PEER_REPORT_MEMBERS_MAX; i++)
        if (mem[i].sends) {
            memcpy(r->members[r->n_members].pub, mem[i].pub, 32);
            r->members[r->n_members++].samples = mem[i].weight;
        }
    for (size_t i = 0; i < sum->n_excluded && r->n_excluded < 64; i++) {
        memcpy(r->excluded[r->n_excluded].pub, am[sum->excluded[i]].pub, 32);
        snprintf(r->excluded[r->n_excluded++].reason, sizeof r->excluded[0].reason, "%s",
                 ar_excl_reason_name(sum->excluded_reason[i]));
    }
    peer_reporter_submit(s->rt.rep, r);
    free(r);
}

/* A round that was not a step because nothing was averaged with the
 * others (j->unaveraged, j->unshared): counted, said on the console and in
 * the step log, and from the second in a row handed to the runtime, whose
 * capability reports tell the coordinator (the run's stats and dashboard:
 * "not averaging"). A real step resets it (dp_finish_round). */
static void note_failing(struct dp_state *s, const struct dp_job *j, int64_t step, const char *why)
{
    double now = peer_mono_s();
    if (s->failing && now - s->failing_last > DP_FAILING_FORGET_S)
        s->failing = 0; /* an old failure: this is a new episode */
    s->failing_last = now;
    if (!s->failing++)
        s->failing_since = now;
    snprintf(s->failing_why, sizeof s->failing_why, "%s", why);
    if (s->failing >= 2) {
        fprintf(stderr, "warning: the collaboration is not averaging: %d rounds in a row, %.0f s, averaged "
                        "nothing with the other peers\n", s->failing, peer_mono_s() - s->failing_since);
        peer_rt_set_failing(&s->rt, s->failing, why);
    }
    if (!s->steplog || s->o.aggregate_only)
        return;
    char line[1024], ridhex[17], w[sizeof s->failing_why];
    cm_hex_encode(j->rid, 8, ridhex);
    snprintf(w, sizeof w, "%s", why);
    for (char *c = w; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = '_';
    snprintf(line, sizeof line,
             "{\"step\":%lld,\"averaged\":false,\"members\":%zu,\"parts\":%zu,\"round\":\"%s\","
             "\"failing_rounds\":%d,\"why\":\"%s\",\"t_ms\":%lld}",
             (long long)step, j->nmem, j->n_parts, ridhex, s->failing, w, (long long)dp_now(s));
    agent_steplog_write(s->steplog, line);
}

/* Applies a finished round: the optimizer step, the hash, the step log, the
 * contribution report, the checkpoint. Returns CM_OK and moves *step, or a
 * fatal error. */
int dp_finish_round(struct dp_state *s, struct dp_job *j, int64_t *step, double *last_loss)
{
    struct kern_model *m = s->tr.model;
    size_t n = m->nparams;
    if (j->threaded) {
        double t0 = peer_mono_s();
        pthread_join(j->th, NULL);
        j->t_wait = peer_mono_s() - t0;
        j->threaded = 0;
    }
    CM_LOGD("join", "round %lld done: rc %d missed %d alone %d unshared %d members %zu senders %zu others %zu "
                    "present %zu, params at %lld, waited %.3f s, took %.3f s",
            (long long)j->step, j->rc, j->missed, j->alone, j->unshared, j->nmem, j->senders, j->others, j->present,
            (long long)*step, j->t_wait, j->t_round);
    if (j->rc == CM_EBUSY || j->missed) {
        if (j->rc == CM_EBUSY)
            printf("\nstep %lld: announced after the round closed; catching up\n", (long long)j->step);
        *step = dp_resync_after(s, j->step);
        if (*step <= j->step && j->missed) {
            /* nobody went past the round: it averaged nothing after all */
            snprintf(j->why, sizeof j->why, "no peer applied the round of step %lld (its members saw different "
                     "rounds) and none went past it", (long long)j->step);
            note_failing(s, j, *step, j->why);
        }
        return CM_OK;
    }
    if (j->rc == CM_ESTATE) {
        sleep(1);
        return CM_OK;
    }
    if (j->alone && j->discovering) {
        if (!s->discovery_said)
            printf("\nstep %lld: no other peer seen yet; waiting up to %.0f s for the collaboration "
                   "before stepping alone\n",
                   (long long)j->step, DP_DISCOVERY_S);
        s->discovery_said = 1;
        usleep(200000);
        return CM_OK;
    }
    if (j->alone && j->short_batch) {
        fprintf(stderr, "\nwarning: step %lld: our round had one sender with %.0f of the %.0f samples "
                        "of the batch; not a step\n",
                (long long)j->step, j->global, s->target);
        return CM_OK;
    }
    if (j->alone) {
        fprintf(stderr, "\nwarning: step %lld: our round had %zu sender%s of the %zu peer%s its members "
                        "saw accumulating for the step (%zu other%s about); not stepping without them\n",
                (long long)j->step, j->senders, j->senders == 1 ? "" : "s", j->on, j->on == 1 ? "" : "s",
                j->present, j->present == 1 ? "" : "s");
        usleep(200000);
        return CM_OK;
    }
    if (j->unaveraged) {
        fprintf(stderr, "\nwarning: step %lld: no part of the round was averaged by every member of its %zu "
                        "(%s); not a step\n", (long long)j->step, j->nmem, j->why);
        note_failing(s, j, *step, j->why);
        usleep(200000);
        return CM_OK;
    }
    if (j->unshared) {
        fprintf(stderr, "\nwarning: step %lld: our round (%zu senders) averaged our gradient alone (the "
                        "others declined it or left); not stepping\n",
                (long long)j->step, j->senders);
        char my[PEER_ADDR_MAX];
        peer_rt_addrs(&s->rt, my, NULL);
        snprintf(j->why, sizeof j->why, "our round of %zu senders averaged only our own gradient: the others' "
                 "did not reach us at %s", j->senders, my[0] ? my : "(client mode)");
        note_failing(s, j, *step, j->why);
        return CM_OK;
    }
    if (j->rc != CM_OK)
        return j->rc;
    if (!s->o.aggregate_only && *step > j->step)
        return CM_OK; /* a state fetched meanwhile already holds this round's update */
    int rc;
    if (!s->o.aggregate_only && *step < j->step) {
        /* We joined this round while our parameters were a step behind it
           (a collaboration with delayed updates: see the catch-up below).
           Its average applies to the parameters of its step: take them from
           a peer; if the peer already applied this round, its state holds
           the very same update. */
        int64_t got = *step;
        /* peers publish a wanted state between micro-batches: give them a
           few of ours (plus the save) on top of the base wait */
        double wait = JOIN_AHEAD_WAIT_MS + 3000 * s->mb_time;
        if (wait > 90000)
            wait = 90000;
        if (dp_sync_from_peer(s, j->step, &got, (uint32_t)wait) != CM_OK || got < j->step) {
            /* Nobody holds those parameters: the round in flight we bet on
               was not applied (its members declined it), and every peer
               that bet with us waits for the same missing state. Drop this
               round; the caller goes back to our own step (dp_bet_check)
               and the behind check finds the others if they went on. */
            fprintf(stderr, "\nwarning: step %lld: no peer has the parameters of step %lld that this "
                            "round applies to; dropping it\n", (long long)j->step, (long long)j->step);
            return CM_OK;
        }
        *step = got;
        if (got > j->step)
            return CM_OK; /* the state already includes this round's update */
    }
    if (!s->o.aggregate_only) {
        float gnorm = 0, lr = 0;
        if ((rc = m->be->upload(m->grads, j->accum, n * sizeof *j->accum)) != CM_OK ||
            (rc = agent_trainer_apply(&s->tr, &gnorm, &lr)) != CM_OK)
            return rc;
    } else {
        s->tr.opt->step++; /* the aggregate-only peer follows the step count */
    }
    s->n_prev = 0;
    for (size_t i = 0; i < j->nmem && s->n_prev < AR_MAX_MEMBERS; i++)
        if (j->mem[i].sends)
            memcpy(s->prev[s->n_prev++], j->mem[i].pub, CM_ED25519_PUB_LEN);
    double loss = j->loss_n ? j->loss_sum / j->loss_n : NAN;
    /* the sentence-order loss and the masked-token accuracy, for ALBERT
       only (an MLP's training pass counts hits too, but its reports carry
       no accuracy: the field is the masked LM's) */
    double sop_loss = j->sop_n > 0 ? j->sop_sum / j->sop_n : NAN;
    double mlm_acc = m->kind == KERN_MODEL_ALBERT && j->loss_n > 0 ? j->hits / j->loss_n : NAN;
    *step = j->step + 1;
    dp_update_hash(s, *step);
    report_round(s, j->step, j->rid, j->samples, j->compute_s, loss, sop_loss, mlm_acc, j->sps, &j->sum,
                 j->n_parts, j->agreed, j->mem, j->am, j->nmem, s->hash_step == *step ? s->hash : NULL);
    /* A step with others ends an episode of failed rounds. A step alone
       does not: after rounds with the others failed, nobody averages with
       anybody (the others may be stuck fetching a state nobody has). */
    if (s->failing && j->senders > 1) {
        printf("\nstep %lld: averaged again after %d round%s that averaged nothing\n", (long long)j->step,
               s->failing, s->failing == 1 ? "" : "s");
        s->failing = 0;
        peer_rt_set_failing(&s->rt, 0, NULL);
    }
    if (j->loss_n)
        *last_loss = loss;
    if (s->steplog && !s->o.aggregate_only) {
        char line[1600], ridhex[17], ls[32], ex[320], via[256] = "";
        dp_experts_json(s, ex, sizeof ex);
        /* how the others reached us this step, and whether we aggregated a
           part (through a relay: issue 17) */
        pthread_mutex_lock(&s->rt.addr_mu);
        if (s->rt.reach == PEER_REACH_RELAYED)
            snprintf(via, sizeof via, ",\"reach\":\"relayed\",\"relay\":\"%s\"", s->rt.relay);
        else
            snprintf(via, sizeof via, ",\"reach\":\"%s\"", s->rt.my_addr[0] ? "direct" : "client");
        pthread_mutex_unlock(&s->rt.addr_mu);
        int aggregated = j->me < j->nmem && j->am[j->me].fraction > 0;
        if (j->refused) /* members that announced an address the schedule does not give them */
            snprintf(via + strlen(via), sizeof via - strlen(via), ",\"refused\":%zu", j->refused);
        if (j->relayed_aggs) /* relayed aggregators, and how many we reached through a punched hole */
            snprintf(via + strlen(via), sizeof via - strlen(via), ",\"relayed_aggs\":%zu,\"punched\":%zu",
                     j->relayed_aggs, j->punched);
        cm_hex_encode(j->rid, 8, ridhex);
        if (isfinite(loss))
            snprintf(ls, sizeof ls, "%.6f", loss);
        else
            snprintf(ls, sizeof ls, "null");
        snprintf(line, sizeof line,
                 "{\"step\":%lld,\"hash\":\"%s\",\"loss\":%s,\"samples\":%.0f,\"global_samples\":%.0f,"
                 "\"members\":%zu,\"parts\":%zu,\"agreed\":%d,\"outcomes\":%zu,\"round\":\"%s\","
                 "\"round_ms\":%.1f,\"sent_kb\":%.1f,\"received_kb\":%.1f,\"round_s\":%.3f,\"margin_ms\":%lld,\"compute_s\":%.3f,\"wait_s\":%.3f,\"sched_version\":%lld,"
                 "\"group_rounds\":%zu,\"group_size\":%zu,\"group_senders\":%zu,\"group_last\":%zu"
                 ",\"aggregated\":%s%s%s,\"t_ms\":%lld}",
                 (long long)*step, s->hash, ls, j->samples, j->global, j->nmem, j->n_parts,
                 __builtin_popcountll(j->agreed), j->counted, ridhex, j->sum.ms_total, (double)j->sum.bytes_sent / 1024,
                 (double)j->sum.bytes_received / 1024, j->t_round,
                 (long long)j->margin_ms, j->compute_s, j->t_wait, (long long)j->sched_v, j->group_rounds, j->group_size,
                 j->group_senders, j->group_last, aggregated ? "true" : "false", via, ex, (long long)dp_now(s));
        agent_steplog_write(s->steplog, line);
    }
    /* every K steps, and the run's final state (for peers that finish
       late: the others may be gone by then) */
    if ((*step % s->ckpt_every == 0 || *step == s->steps) && !s->o.aggregate_only &&
        collab_checkpoint_uploader(j->mem, j->nmem, *step) == j->me)
        upload_checkpoint(s, *step);
    return CM_OK;
}

/* After catching up with a round in flight we accumulate for the round
 * after it (join_step) on the parameters before it, betting that the round
 * in flight completes and its state can be fetched. When that round, or
 * ours for join_step, ends without our parameters reaching join_step (it
 * was declined for want of a majority, or went on without us), the bet
 * failed: nobody will produce that state, and waiting for it kept whole
 * collaborations fetching from each other (each wanting a step none had)
 * until their passes expired. Go back to accumulating for our own step. */
void dp_bet_check(const struct dp_job *j, int64_t step, int64_t *join_step)
{
    if (*join_step > step && j->step + 1 >= *join_step) {
        printf("\nstep %lld: the round we joined ahead of our parameters (step %lld) did not bring "
               "them there; accumulating for our own step\n", (long long)j->step, (long long)step);
        *join_step = 0;
    }
}

/* Whether this peer takes the next step pull-only: the newest schedule
 * lists it with compute = false (seed 000 §3.2: the LP's c_i = 0 for a peer
 * whose sending would slow the averaging more than its samples help). It
 * then computes nothing, joins the round with sends = AR_SENDS_PULL, takes
 * the average and applies the step like everyone, so it stays identical and
 * can compute again when a schedule says so. Not while PULL_ONLY_OFF_S runs
 * after no computing peer was seen (the others may be gone and the
 * schedule not re-solved yet): then it computes. */
int dp_step_role(struct dp_state *s)
{
    if (s->o.aggregate_only || !s->js || peer_mono_s() < s->pull_only_off_until)
        return 0;
    int compute = 1;
    pthread_mutex_lock(&s->js_mu);
    dp_sched_role(s->js, s->rt.key.pub, peer_rt_addrs(&s->rt, NULL, NULL), &compute, NULL);
    pthread_mutex_unlock(&s->js_mu);
    if (!compute && !s->pull_only)
        printf("\nthe schedule has this peer average without computing (pull-only)\n");
    else if (compute && s->pull_only)
        printf("\nthe schedule has this peer compute again\n");
    return !compute;
}

/* The schedule the coordinators' backbone nodes announce in the DHT
 * ("<run>/schedule"), for when the coordinator cannot be reached: verified
 * with the coordinator keys like the REST answer. */
void dp_sched_from_dht(struct dp_state *s)
{
    char key[160];
    snprintf(key, sizeof key, "%s/schedule", s->o.run);
    struct peer_record *r = NULL;
    size_t nr = 0;
    if (peer_net_get(s->rt.net, key, &r, &nr) != CM_OK)
        return;
    for (size_t i = 0; i < nr; i++) {
        json_t *o = json_loadb((const char *)r[i].value, r[i].len, JSON_REJECT_DUPLICATES, NULL);
        if (o)
            dp_sched_accept(s->js, o, (int64_t)time(NULL), 1);
        json_decref(o);
    }
    peer_records_free(r, nr);
}

/* Capabilities for the schedule (docs/schedules.md; the runtime reports
 * them, peer_rt_report_caps) and the schedule, refreshed every 30 s. */
void dp_schedule_upkeep(struct dp_state *s, double sps)
{
    if (!s->js)
        return;
    double t = peer_mono_s();
    peer_rt_report_caps(&s->rt, sps, s->o.aggregate_only);
    /* every 30 s once a schedule lists us; every 5 s until then, so a new
       peer's capabilities are put to use soon after the coordinator solves;
       every 2 s while rounds refuse us as an aggregator for announcing an
       address the schedule does not give us yet (a new relay: the
       coordinator solves 2 s after such a change) */
    const struct sched_schedule *cur = dp_sched_current(s->js);
    int listed = 0;
    for (size_t i = 0; cur && i < cur->n && !listed; i++)
        listed = !memcmp(cur->peers[i].key, s->rt.key.pub, CM_ED25519_PUB_LEN);
    int lagging = __atomic_load_n(&s->self_refused, __ATOMIC_RELAXED);
    if (s->sched_at == 0 || t - s->sched_at > (lagging ? 2 : listed ? 30 : 5)) {
        if (dp_sched_refresh(s->js, &s->rt.coord) != CM_OK)
            dp_sched_from_dht(s);
        s->sched_at = t;
    }
}
