/* One averaging round of the data-parallel role (seed 000 §3.1-3.2;
 * docs/collaboration.md): gather the round's members from their
 * announcements, plan the parts with the schedule, average (one butterfly
 * all-reduce, or group rounds when the schedule says so), agree on the
 * outcome with the other members, and leave in the job's buffer the
 * gradient every member applies. Runs on the training thread, or on a
 * round thread of its own with --delayed-updates (dp.h). */
#include "agent/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/dp/groups.h"
#include "cm_err.h"
#include "cm_log.h"
#include "p2p/p2p_transport.h"

/* Outcome agreement (docs/collaboration.md): every sender of the round
 * publishes which parts it committed; the parts every counted outcome has
 * are applied by everyone, the others are skipped (zero gradient) for this
 * step, so survivors stay bit-identical even when an aggregator died. */
#define OUTCOME_MARGIN_MS 300
/* 1 when the outcomes name another round id more often than ours (ties:
 * the smaller id wins): then our view of the round's members was not the
 * others', and our update would not be theirs. One vote per author. */
static int odd_round(const struct collab_outcome *o, size_t n, const uint8_t rid[16])
{
    size_t mine = 0, best = 0;
    const uint8_t *best_rid = NULL;
    for (size_t i = 0; i < n; i++) {
        /* another round that averaged nothing was applied by nobody (not a
           step: its members try the step again), so it is no sign that the
           others went on without us */
        if (o[i].mask == 0 && memcmp(o[i].rid, rid, 16) != 0)
            continue;
        int dup = 0;
        for (size_t k = 0; k < i && !dup; k++)
            dup = !memcmp(o[k].pub, o[i].pub, CM_ED25519_PUB_LEN);
        if (dup)
            continue;
        size_t c = 0;
        for (size_t k = 0; k < n; k++) {
            int first = 1;
            for (size_t q = 0; q < k && first; q++)
                first = memcmp(o[q].pub, o[k].pub, CM_ED25519_PUB_LEN) != 0;
            c += first && !memcmp(o[k].rid, o[i].rid, 16);
        }
        if (!memcmp(o[i].rid, rid, 16))
            mine = c;
        else if (c > best || (c == best && best_rid && memcmp(o[i].rid, best_rid, 16) < 0)) {
            best = c;
            best_rid = o[i].rid;
        }
    }
    return best_rid && (best > mine || (best == mine && memcmp(best_rid, rid, 16) < 0));
}

static uint64_t agree_outcome(struct dp_state *s, int64_t step, const uint8_t rid[AR_ROUND_ID_LEN],
                              uint64_t my_mask, const struct ar_member *am, size_t nmem,
                              uint32_t window_ms, size_t *counted, int *odd)
{
    char key[160], rec[COLLAB_RECORD_MAX];
    snprintf(key, sizeof key, "%s/outcome/%lld", s->o.run, (long long)step);
    struct collab_outcome me = {0};
    memcpy(me.pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    memcpy(me.rid, rid, sizeof me.rid);
    me.mask = my_mask;
    me.t_ms = dp_now(s);
    uint8_t senders[AR_MAX_MEMBERS][CM_ED25519_PUB_LEN];
    size_t ns = 0;
    for (size_t i = 0; i < nmem; i++)
        if (am[i].sends)
            memcpy(senders[ns++], am[i].pub, CM_ED25519_PUB_LEN);
    if (collab_outcome_encode(&me, rec, sizeof rec) != CM_OK ||
        peer_net_put(s->rt.net, key, rec, strlen(rec), 120000) != CM_OK)
        fprintf(stderr, "\nwarning: step %lld: could not publish the round's outcome\n", (long long)step);
    int64_t give_up = me.t_ms + window_ms + 4 * OUTCOME_MARGIN_MS + 5000;
    uint64_t mask = my_mask;
    *counted = 0;
    for (;;) {
        struct peer_record *r = NULL;
        size_t nr = 0;
        struct collab_outcome *o = NULL;
        size_t no = 0;
        if (peer_net_get(s->rt.net, key, &r, &nr) == CM_OK && (o = calloc(nr + 1, sizeof *o))) {
            for (size_t i = 0; i < nr; i++)
                if (collab_outcome_parse(r[i].value, r[i].len, &o[no]) == CM_OK) {
                    memcpy(o[no].pub, r[i].author, CM_ED25519_PUB_LEN);
                    no++;
                }
            o[no++] = me; /* our own, even before the DHT shows it */
        }
        peer_records_free(r, nr);
        int decided = 0;
        uint64_t m = my_mask;
        size_t c = o ? collab_outcome_final(o, no, rid, (const uint8_t(*)[CM_ED25519_PUB_LEN])senders,
                                            ns, window_ms, OUTCOME_MARGIN_MS, dp_now(s),
                                            &m, &decided)
                     : 0;
        int is_odd = o ? odd_round(o, no, rid) : 0;
        free(o);
        if (decided || dp_now(s) > give_up) {
            *odd = is_odd;
            if (!decided)
                fprintf(stderr, "\nwarning: step %lld: no agreement on the round's outcome; using ours\n",
                        (long long)step);
            else
                mask = m;
            *counted = c;
            break;
        }
        usleep(20000);
    }
    return mask;
}

/* Says which members the plan refused as aggregators (refused: bit i of
 * am[]): they announced an averaging address other than where the schedule
 * says peers reach them, so their part would go to whoever holds that
 * address (docs/p2p.md, "Announced addresses"). Once a minute per key. */
static void warn_refused(struct dp_state *s, const struct ar_member *am, size_t n, int64_t v, uint64_t refused)
{
    int self = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        self |= (refused >> i & 1) && !memcmp(am[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN);
    __atomic_store_n(&s->self_refused, self, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n && i < 64; i++) {
        if (!(refused >> i & 1))
            continue;
        size_t slot = am[i].pub[0] % DP_REFUSED_SLOTS;
        double now = peer_mono_s();
        if (!memcmp(s->refused_key[slot], am[i].pub, CM_ED25519_PUB_LEN) && now - s->refused_at[slot] < 60)
            continue;
        memcpy(s->refused_key[slot], am[i].pub, CM_ED25519_PUB_LEN);
        s->refused_at[slot] = now;
        char a[80] = "?", pk[64];
        p2p_addr_format((const struct sockaddr *)&am[i].addr, a, sizeof a);
        cm_b64url_encode(am[i].pub, CM_ED25519_PUB_LEN, pk);
        const char *want = dp_sched_ip_of(s->js, v, am[i].pub);
        if (!memcmp(am[i].pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
            fprintf(stderr, "\nwarning: we announce our averaging address as %s, but the coordinator sees us at "
                            "%s: the others give us no part to aggregate (is --advertise-ip right?)\n",
                    a, want);
        else
            fprintf(stderr, "\nwarning: peer %s announces its averaging address as %s, but the coordinator sees "
                            "it at %s: it aggregates no part\n",
                    pk, a, want);
    }
}

/* The round's aggregation fractions: the schedule version the members
 * announced (the highest), fetched when we lack it; an even split among the
 * members that accept connections when there is none. Returns the version
 * used (0: even). */
static int64_t plan_round(struct dp_state *s, const struct collab_announce *mem, struct ar_member *am,
                          size_t nmem, size_t *n_refused, char *eg, size_t egcap)
{
    *n_refused = 0;
    eg[0] = '\0';
    int agg_ok[AR_MAX_MEMBERS];
    int64_t v = 0;
    for (size_t i = 0; i < nmem; i++) {
        agg_ok[i] = am[i].fraction > 0;
        if (mem[i].sched_version > v)
            v = mem[i].sched_version;
    }
    if (v > 0 && s->js && !dp_sched_has_version(s->js, v) &&
        dp_sched_fetch_version(s->js, &s->rt.coord, v) != CM_OK &&
        (dp_sched_from_dht(s), !dp_sched_has_version(s->js, v)))
        fprintf(stderr, "\nwarning: could not get schedule version %lld; averaging with even parts\n",
                (long long)v);
    uint64_t refused = 0;
    int rc = s->js ? dp_sched_plan_checked(s->js, v, am, agg_ok, nmem, &refused) : CM_EINVAL;
    warn_refused(s, am, nmem, v, refused);
    *n_refused = (size_t)__builtin_popcountll(refused);
    if (rc == CM_OK)
        return v;
    if (rc == CM_EINVAL && refused) { /* every aggregator refused: nobody to send parts to */
        size_t first = (size_t)__builtin_ctzll(refused);
        char a[80] = "?";
        p2p_addr_format((const struct sockaddr *)&am[first].addr, a, sizeof a);
        snprintf(eg, egcap, "%s, seen at %s", a, dp_sched_ip_of(s->js, v, am[first].pub));
        for (size_t i = 0; i < nmem; i++)
            am[i].fraction = 0;
        return v;
    }
    *n_refused = 0;
    for (size_t i = 0; i < nmem; i++)
        am[i].fraction = agg_ok[i] ? 1.0 : 0.0;
    return 0;
}

/* Group all-reduce (agent/dp/groups.h; seed 000 §3.2 and Appendix C):
 * the rounds of the layout one after the other, each in our group of that
 * round with its own round id ("g<round>.<group>"). The outcome is kept per
 * block of the gradient (DP_GROUP_BLOCKS equal blocks) rather than per
 * part, since every group cuts its own parts: a block is ours when every
 * round committed the parts over it. The members then agree on the blocks
 * as on parts in one round: a block any member lacks (an aggregator died)
 * is skipped by everyone (zero gradient), so the members stay identical. A
 * sender lost in a round is renormalized away inside its group, whose
 * members all get the same bits; the unit it sent for still carries its
 * announced weight into the next rounds. */
#define DP_GROUP_BLOCKS 64
static uint64_t run_groups(struct dp_job *j, const struct dp_groups *G,
                           const struct ar_round_config *base)
{
    struct dp_state *s = j->s;
    size_t n = base->n, nb = n < DP_GROUP_BLOCKS ? n : DP_GROUP_BLOCKS;
    uint64_t blocks = nb >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << nb) - 1);
    uint64_t gone = 0; /* members (global index) an earlier round found unreachable */
    memset(&j->sum, 0, sizeof j->sum);
    size_t r = 0;
    for (; r < G->rounds && !dp_interrupted(s); r++) {
        int grp = G->group[r][j->me];
        if (grp < 0)
            continue; /* our unit waits for the others' rounds */
        struct ar_member gm[AR_MAX_MEMBERS];
        int agg_ok[AR_MAX_MEMBERS];
        uint32_t glob[AR_MAX_MEMBERS];
        size_t ng = G->size[r][grp], me = ng, nsend = 0;
        for (size_t i = 0; i < j->nmem; i++) {
            if (G->group[r][i] != grp)
                continue;
            size_t k = (size_t)G->pos[r][i];
            gm[k] = j->am[i];
            /* a receiver; pull-only and aggregate-only members keep their role */
            gm[k].sends = G->sends[r][i]                  ? AR_SENDS_FULL
                          : j->am[i].sends == AR_SENDS_FULL ? AR_SENDS_PULL
                                                            : j->am[i].sends;
            agg_ok[k] = j->mem[i].agg && j->am[i].addr.ss_family != 0;
            nsend += G->sends[r][i] != 0;
            glob[k] = (uint32_t)i;
            if (i == j->me)
                me = k;
        }
        pthread_mutex_lock(&s->js_mu);
        uint64_t refused = 0;
        if (!s->js || dp_sched_plan_checked(s->js, j->sched_v, gm, agg_ok, ng, &refused) != CM_OK)
            for (size_t k = 0; k < ng; k++) /* every aggregator refused: none (as plan_round) */
                gm[k].fraction = agg_ok[k] && !refused ? 1.0 : 0.0;
        warn_refused(s, gm, ng, j->sched_v, refused);
        pthread_mutex_unlock(&s->js_mu);
        char gid[64];
        snprintf(gid, sizeof gid, "g%zu.%d@%lld", r + 1, grp, (long long)j->close_ms);
        struct ar_round_config rc = *base;
        rc.group_id = (const uint8_t *)gid;
        rc.group_id_len = strlen(gid);
        rc.members = gm;
        rc.n_members = ng;
        rc.my_index = me;
        rc.weight = G->sends[r][j->me] ? G->weight[r][j->me] : 0;
        /* a member whose earlier group lost a peer starts this round up to a
           stall per earlier round late: wait that long for it (it answers
           "busy"), not only a stall, or its partners give up on it just as
           it arrives */
        rc.start_wait_ms = base->stall_ms * (uint32_t)(r + 1);
        /* and serves its results at least as long (a receiver is not waited for) */
        rc.linger_ms = rc.start_wait_ms > 10000 ? rc.start_wait_ms : 10000;
        /* and an aggregator that did not answer us in an earlier round is
           not waited for again (its part fails at once) */
        rc.gone = 0;
        for (size_t k = 0; k < ng; k++)
            if (gone >> glob[k] & 1)
                rc.gone |= (uint64_t)1 << k;
        struct peer_round_summary sum;
        memset(&sum, 0, sizeof sum);
        uint8_t grid[AR_ROUND_ID_LEN] = {0};
        if (cm_log_enabled(CM_LOG_DEBUG)) /* a SHA-256 per round only for the log line */
            ar_round_id(&rc, grid);
        CM_LOGD("join", "step %lld: group round %s (round %02x%02x%02x%02x): member %zu of %zu "
                        "(%zu senders, %s)%s",
                (long long)j->step, gid, grid[0], grid[1], grid[2], grid[3], me, ng, nsend,
                G->sends[r][j->me] ? "sending" : "receiving",
                rc.gone ? ", skipping members found gone" : "");
        int rc_ar = peer_net_allreduce(s->rt.net, &rc, &sum);
        if (rc_ar != CM_OK && sum.n_parts == 0)
            blocks = 0; /* nothing committed, nothing known */
        for (size_t k = 0; k < sum.n_parts && k < AR_MAX_MEMBERS; k++) {
            if ((sum.averaged_mask >> k & 1) || sum.part_len[k] == 0)
                continue;
            int st = sum.part_status[k];
            if ((st == CM_ETIMEOUT || st == CM_ECONN || st == CM_ECLOSED) &&
                sum.part_owner[k] < ng && sum.part_owner[k] != me)
                gone |= (uint64_t)1 << glob[sum.part_owner[k]];
            size_t lo = sum.part_off[k], hi = sum.part_off[k] + sum.part_len[k];
            for (size_t b = 0; b < nb; b++) /* the blocks that overlap the part */
                if (b * n / nb < hi && (b + 1) * n / nb > lo)
                    blocks &= ~((uint64_t)1 << b);
        }
        for (size_t i = 0; i < sum.n_excluded && j->sum.n_excluded < AR_MAX_MEMBERS; i++)
            if (sum.excluded[i] < ng) {
                j->sum.excluded[j->sum.n_excluded] = glob[sum.excluded[i]];
                j->sum.excluded_reason[j->sum.n_excluded++] = sum.excluded_reason[i];
            }
        j->sum.ms_total += sum.ms_total;
        j->sum.bytes_sent += sum.bytes_sent;
        j->sum.bytes_received += sum.bytes_received;
        if (r == 0)
            j->group_size = ng;
        j->group_last = ng;
        if (nsend > j->group_senders)
            j->group_senders = nsend;
    }
    if (r < G->rounds)
        blocks = 0; /* interrupted (Ctrl-C): our buffer is half averaged */
    j->sum.n_parts = nb;
    for (size_t b = 0; b < nb; b++) {
        j->sum.part_off[b] = b * n / nb;
        j->sum.part_len[b] = (b + 1) * n / nb - b * n / nb;
    }
    j->sum.averaged_mask = blocks;
    return blocks;
}

/* The round's members (gathered from the announcements) as all-reduce
 * members with their parts planned. 0 to go on; 1 when the round ends
 * here (j->rc, or j->alone when it is declined). */
static int round_members(struct dp_job *j)
{
    struct dp_state *s = j->s;
    int follower = s->o.aggregate_only || j->pull_only;
    j->rc = dp_gather(s, j->step, j->samples, j->pull_only, j->others + !follower, &j->mem, &j->nmem,
                      &j->close_ms);
    j->margin_ms = dp_gather_margin(s);
    if (j->rc != CM_OK)
        return 1;
    size_t senders = 0;
    double weight = 0;
    for (size_t i = 0; i < j->nmem; i++) {
        senders += j->mem[i].sends;
        weight += j->mem[i].sends ? j->mem[i].weight : 0;
    }
    j->senders = senders;
    if (senders == 1 && weight + 0.5 < s->target) {
        /* One sender short of the target batch: a step alone on a fraction
           of it. A window is opened by a peer whose view reached the target,
           and the peers that join it bring at least what it saw, except
           where that view was stale: a pull-only or aggregate-only peer that
           read samples the sender no longer holds (it dropped them to catch
           up, or a declined round's with --delayed-updates), or a sender
           that counted a peer gone quiet. Every member sees the same
           announcements (weights included), so every member declines it,
           the pull-only peer too (it used to wait out the round's deadline
           for a sender that never sent). The sender accumulates on with
           what it holds (loop.c, phase_begin). */
        j->global = weight;
        j->alone = j->short_batch = 1;
        return 1;
    }
    /* the peers on the step as the members said (every member reads the
       same announcements: collab_round_on); our own view when none said */
    j->on = collab_round_on(j->mem, j->nmem);
    int said = j->on > 0;
    if (!said)
        j->on = j->others + !follower;
    if ((said || !follower) &&
        (2 * senders <= j->on || (!follower && senders == 1 && (j->present > 0 || j->finished)))) {
        /* Our window holds no majority of the peers accumulating for this
           step (their announcements had not reached us, or ours not them;
           every member, pull-only and aggregate-only ones included, decides
           this alike from the members' announcements), or we would step
           alone while other peers are about (catching up:
           a peer stepping alone meanwhile would keep them chasing it; a
           peer stays about while a state comes to it, records.c,
           dp_still_here), or
           the collaboration already finished the run: stepping would split
           the collaboration. Go
           back to accumulating (with what we hold: loop.c, phase_begin);
           their round, or the next window, takes us in, or the behind
           check finds them a step ahead. */
        j->alone = 1;
        return 1;
    }
    if (!s->o.aggregate_only && !j->pull_only && senders == 1 && j->others == 0 && j->present == 0 &&
        !j->finished && peer_mono_s() - s->joined_at < DP_DISCOVERY_S) {
        j->alone = j->discovering = 1; /* dp.h, DP_DISCOVERY_S */
        return 1;
    }
    if (j->nmem > AR_MAX_MEMBERS)
        j->nmem = AR_MAX_MEMBERS; /* larger collaborations need groups from the schedule */
    struct ar_member *am = j->am;
    size_t naggs = 0;
    char eg[160] = "";
    j->me = j->nmem;
    memset(am, 0, sizeof j->am);
    for (size_t i = 0; i < j->nmem; i++) {
        const struct collab_announce *mi = &j->mem[i];
        memcpy(am[i].pub, mi->pub, CM_ED25519_PUB_LEN);
        am[i].sends = mi->sends ? AR_SENDS_FULL : mi->pull_only ? AR_SENDS_PULL : AR_SENDS_NONE;
        am[i].fraction = mi->agg ? 1.0 : 0.0;
        if (mi->agg && p2p_addr_parse(mi->addr, &am[i].addr) != CM_OK)
            am[i].fraction = 0;
        naggs += am[i].fraction > 0;
        j->global += mi->sends ? mi->weight : 0;
        if (!memcmp(mi->pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
            j->me = i;
    }
    if (naggs) {
        pthread_mutex_lock(&s->js_mu);
        j->sched_v = plan_round(s, j->mem, am, j->nmem, &j->refused, eg, sizeof eg);
        pthread_mutex_unlock(&s->js_mu);
    }
    if (j->me == j->nmem || naggs == 0) {
        fprintf(stderr, "\nwarning: step %lld: no usable round (%zu members, %zu aggregators)\n",
                (long long)j->step, j->nmem, naggs);
        j->rc = CM_ESTATE;
        return 1;
    }
    /* Members reached through a relay: a hole punched in the background
       takes our traffic with them off the relay from the next rounds
       (docs/p2p.md, "Hole punching"); this one goes as planned. Every
       relayed member, not only those aggregating now: the schedule
       counts what a relayed peer's relay carries, and the holes a peer
       has (its reports' `punched`) are what make it worth a part */
    for (size_t i = 0; i < j->nmem; i++) {
        if (i == j->me || !j->mem[i].relayed || !j->mem[i].addr[0])
            continue;
        int st = peer_net_punch_state(s->rt.net, j->mem[i].pub, j->mem[i].addr);
        if (am[i].fraction > 0) {
            j->relayed_aggs++;
            j->punched += st == PEER_PUNCH_DIRECT;
        }
        if (st != PEER_PUNCH_DIRECT)
            peer_net_punch(s->rt.net, j->mem[i].pub, j->mem[i].addr);
    }
    if (j->refused == naggs) {
        /* Every aggregator announced an averaging address where the
           coordinator does not see it (warn_refused said which): no part
           can be averaged, so the round is no step (as one whose
           aggregators cannot be reached, issue 17). */
        snprintf(j->why, sizeof j->why, "every aggregator of the round (%zu) announced an averaging address "
                 "where the coordinator does not see it (%s)", naggs, eg);
        j->unaveraged = 1;
        j->rc = CM_OK;
        return 1;
    }
    return 0;
}

/* Averages j->accum with the members: one all-reduce over all of them, or
 * the schedule's group rounds. Fills j->sum, j->rid, j->n_parts and the
 * parts' offsets and lengths (poff, plen); 1 on an internal error. */
static int round_average(struct dp_job *j, size_t *poff, size_t *plen)
{
    struct dp_state *s = j->s;
    struct ar_member *am = j->am;
    size_t n = s->tr.model->nparams;
    float *accum = j->accum;
    if (j->samples > 0)
        for (size_t i = 0; i < n; i++)
            accum[i] /= (float)j->samples;
    if (s->corrupt && j->samples > 0) /* test hook: behave like a broken or malicious peer */
        for (size_t i = 0; i < n; i += 97)
            accum[i] = s->corrupt == 1 ? NAN : 1e30f;
    struct ar_round_config rcfg = {0};
    rcfg.step = (uint64_t)j->step;
    /* "all@<close>": the window is in the round id. A step tried again by
       the same members with the same plan (a round that averaged nothing is
       not a step) is another round: with "all" alone its id was the last
       try's, which every engine refused as finished (CM_EEXISTS) at once,
       and four agents of test_hosts retried step 2 for 313 s, 459 rounds
       that averaged nothing */
    char allid[40];
    snprintf(allid, sizeof allid, "all@%lld", (long long)j->close_ms);
    rcfg.group_id = (const uint8_t *)allid;
    rcfg.group_id_len = strlen(allid);
    rcfg.members = am;
    rcfg.n_members = j->nmem;
    rcfg.my_index = j->me;
    rcfg.buf = s->o.aggregate_only ? NULL : accum; /* pull-only: zeros in, the average out */
    rcfg.n = n;
    rcfg.weight = s->o.aggregate_only || j->pull_only ? 0 : j->samples;
    rcfg.comp = s->comp;
    rcfg.deadline_ms = (uint32_t)s->o.round_timeout_ms;
    /* generous: on a loaded machine a slow peer must not be mistaken for a
       dead one (the outcome agreement then skips its part for everyone) */
    rcfg.stall_ms = (uint32_t)s->o.stall_ms;
    /* averages straight into accum, no staging copy of the gradient: a part
       not averaged is zeroed in round_verdict (or its blocks skipped) whatever
       it holds */
    rcfg.in_place = 1;
    uint32_t owner[AR_MAX_MEMBERS];
    if (ar_round_id(&rcfg, j->rid) != CM_OK ||
        ar_partition(am, j->nmem, n, AR_ALIGN, &j->n_parts, owner, poff, plen) != CM_OK) {
        j->rc = CM_EINTERNAL;
        return 1;
    }
    /* the schedule's group size (Appendix C): groups of m when it is below
       the members (the round id above, over all members, names the step's
       outcome; each group round has its own) */
    j->group_rounds = 1;
    j->group_size = j->nmem;
    j->group_senders = j->senders;
    j->group_last = j->nmem;
    pthread_mutex_lock(&s->js_mu);
    unsigned gm = j->sched_v > 0 && s->js ? dp_sched_group_size(s->js, j->sched_v) : 0;
    pthread_mutex_unlock(&s->js_mu);
    struct dp_groups *G = gm >= 2 && gm < j->nmem ? malloc(sizeof *G) : NULL;
    if (G) {
        int gs[AR_MAX_MEMBERS], ga[AR_MAX_MEMBERS];
        double gw[AR_MAX_MEMBERS];
        for (size_t i = 0; i < j->nmem; i++) {
            gs[i] = am[i].sends == AR_SENDS_FULL;
            ga[i] = am[i].addr.ss_family != 0;
            gw[i] = j->mem[i].weight;
        }
        if (dp_groups_plan(j->nmem, gs, ga, gw, gm, G) != CM_OK || G->rounds < 2) {
            free(G);
            G = NULL;
        }
    }
    if (G) {
        /* the step's round id says "grouped, m": members that planned one
           all-reduce (or another m) see an odd round, not a mix of part and
           block masks */
        char sgid[64];
        snprintf(sgid, sizeof sgid, "groups/m%u@%lld", gm, (long long)j->close_ms);
        struct ar_round_config idc = rcfg;
        idc.group_id = (const uint8_t *)sgid;
        idc.group_id_len = strlen(sgid);
        if (ar_round_id(&idc, j->rid) != CM_OK) {
            free(G);
            j->rc = CM_EINTERNAL;
            return 1;
        }
        j->group_rounds = G->rounds;
        j->group_senders = 0;
        run_groups(j, G, &rcfg);
        free(G);
        j->n_parts = j->sum.n_parts;
        memcpy(poff, j->sum.part_off, j->n_parts * sizeof *poff);
        memcpy(plen, j->sum.part_len, j->n_parts * sizeof *plen);
    } else {
        int rc = peer_net_allreduce(s->rt.net, &rcfg, &j->sum);
        if (rc != CM_OK && j->sum.n_parts == 0) {
            j->sum.averaged_mask = 0;
            j->ar_rc = rc; /* the engine did not run it: say so, not "part k at member 0" */
        }
    }
    /* one entry per excluded peer (each aggregator of a part reports it) */
    size_t ne = 0;
    for (size_t i = 0; i < j->sum.n_excluded; i++) {
        size_t k = 0;
        while (k < ne && j->sum.excluded[k] != j->sum.excluded[i])
            k++;
        if (k == ne) {
            j->sum.excluded[ne] = j->sum.excluded[i];
            j->sum.excluded_reason[ne++] = j->sum.excluded_reason[i];
        }
    }
    j->sum.n_excluded = ne;
    for (size_t i = 0; i < j->sum.n_excluded; i++) {
        char pk[64];
        cm_b64url_encode(am[j->sum.excluded[i]].pub, CM_ED25519_PUB_LEN, pk);
        fprintf(stderr, "\nwarning: step %lld: peer %s excluded from the round (%s)\n",
                (long long)j->step, pk, ar_excl_reason_name(j->sum.excluded_reason[i]));
    }
    return 0;
}

/* What the round leaves to apply: the parts every member averaged (agreed
 * with the others' outcomes), the others zeroed, or why there is nothing
 * to apply (j->unshared, j->missed). */
static void round_verdict(struct dp_job *j, const size_t *poff, const size_t *plen)
{
    struct dp_state *s = j->s;
    struct ar_member *am = j->am;
    float *accum = j->accum;
    uint64_t all = j->n_parts >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << j->n_parts) - 1);
    uint64_t mine = j->sum.averaged_mask & all;
    j->agreed = mine;
    if (!s->o.aggregate_only && !j->pull_only && j->group_rounds == 1 && j->senders > 1 &&
        j->sum.n_averaged > 0 && j->sum.n_excluded == 0 && j->sum.weight <= j->samples + 0.5) {
        /* Every part we hold averaged only our own gradient: the other
           senders never sent (they declined the round: each member
           decides from its own view of the peers accumulating for the
           step, so one may decline a round another goes on with; or they
           left; a sender excluded for bad data did send). A step with it
           would be a step alone, apart from them.
           Decided before the outcome agreement, so no outcome of ours
           names this round when the step is averaged again. */
        j->unshared = 1;
        return;
    }
    if (!s->o.aggregate_only) {
        int odd = 0;
        /* group rounds: members may finish a stall apart per round after
           the first (a member whose group lost a peer waited for it) */
        uint32_t window = (uint32_t)s->o.outcome_window_ms +
                          (uint32_t)(j->group_rounds - 1) * (uint32_t)s->o.stall_ms;
        j->agreed = agree_outcome(s, j->step, j->rid, mine, am, j->nmem, window, &j->counted, &odd) &
                    all;
        if (odd) {
            fprintf(stderr, "\nwarning: step %lld: the other peers averaged a round with other members "
                            "than we saw; fetching their state\n", (long long)j->step);
            j->missed = 1;
            return;
        }
    }
    if (!s->o.aggregate_only && !j->pull_only && j->agreed == 0 && j->nmem > 1) {
        /* Nothing averaged by every member: stepping would apply a zero
           update and count a step in which the collaboration learnt
           nothing (issue 17: peers that cannot reach each other "trained"
           for 25 steps at chance). Not a step: no update, no report, the
           step is tried again; say which aggregators failed and why. */
        size_t off = 0;
        j->why[0] = '\0';
        if (j->ar_rc != CM_OK)
            snprintf(j->why, sizeof j->why, "the averaging engine did not start the round: %s",
                     cm_strerror(j->ar_rc));
        for (size_t k = 0; j->ar_rc == CM_OK && k < j->n_parts && off < sizeof j->why; k++) {
            char a[80] = "?";
            uint32_t o = j->sum.part_owner[k];
            if (o < j->nmem)
                p2p_addr_format((const struct sockaddr *)&am[o].addr, a, sizeof a);
            int st = j->sum.part_status[k];
            off += (size_t)snprintf(j->why + off, sizeof j->why - off, "%spart %zu at %s: %s", k ? "; " : "", k, a,
                                    st == CM_OK ? "not averaged by every member" : cm_strerror(st));
        }
        j->unaveraged = 1;
        return;
    }
    if (j->agreed != all && !s->o.aggregate_only) /* an aggregate-only peer holds only its part */
        fprintf(stderr, "\nwarning: step %lld: %d of %zu parts averaged by every member; the others "
                        "are skipped this step\n",
                (long long)j->step, __builtin_popcountll(j->agreed), j->n_parts);
    if (j->pull_only && (j->agreed == 0 || j->counted < 2)) {
        /* A pull-only peer has no gradient of its own: a round that averaged
           nothing, or that no other member reported, is not the round the
           computing peers stepped with (our window saw them, theirs had
           closed without us), and a zero update would split us from them.
           Take their state after the step instead. */
        fprintf(stderr, "\nwarning: step %lld: our pull-only round averaged %s; fetching the "
                        "others' state\n", (long long)j->step,
                j->agreed == 0 ? "nothing" : "with no other member reporting");
        j->missed = 1;
        return;
    }
    if (!s->o.aggregate_only && (j->agreed & ~mine)) {
        /* the others averaged a part we could not get: our update would
           differ from theirs, so take their state after the step instead */
        fprintf(stderr, "\nwarning: step %lld: we missed parts the others averaged; fetching their state\n",
                (long long)j->step);
        j->missed = 1;
        return;
    }
    for (size_t k = 0; k < j->n_parts; k++)
        if (!(j->agreed >> k & 1) && !s->o.aggregate_only)
            memset(accum + poff[k], 0, plen[k] * sizeof *accum);
    j->rc = CM_OK;
}

/* Gather, plan, average and agree on the outcome; leaves in j->accum the
 * gradient every member applies (parts not agreed zeroed). */
void dp_run_round(struct dp_job *j)
{
    double t0 = peer_mono_s();
    size_t poff[AR_MAX_MEMBERS], plen[AR_MAX_MEMBERS];
    /* The link is busy for the probes (peer_net_probe) from just before
       the all-reduce (dp_gather marks it DP_PROBE_GUARD_MS before reading
       the members) to the outcome, not during the rest of the gathering:
       its DHT messages are small and go out ahead of a probe's chunks
       (p2p_conn.c, urgent frames), and with rounds back to back the
       gathering is most of the quiet time a bandwidth-bound collaboration
       has (counting it busy, 4 peers measured no pair in 40 steps). */
    struct dp_state *s = j->s;
    if (!round_members(j)) {
        if (!s->link_marked) {
            peer_rt_link_busy(&s->rt, 1);
            s->link_marked = 1;
        }
        if (!round_average(j, poff, plen))
            round_verdict(j, poff, plen);
    }
    if (s->link_marked) {
        peer_rt_link_busy(&s->rt, -1);
        s->link_marked = 0;
    }
    j->t_round = peer_mono_s() - t0;
}

void *dp_round_thread(void *arg)
{
    struct dp_job *j = arg;
    dp_run_round(j);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int dp_round_done(struct dp_job *j)
{
    return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
}
