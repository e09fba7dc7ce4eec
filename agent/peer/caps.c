/* Capability reports and the probe thread that measures pairwise
 * throughput for them (docs/schedules.md; seed 000_02cc6b5d62a616fc.txt
 * §3.2). The report format is in caps.h; the runtime's part (when to
 * report, the probe thread's schedule) is peer_rt_report_caps and
 * peer__probe_main below. */
#include "agent/peer/caps.h"
#include "agent/peer/runtime.h"
#include "agent/peer/runtime_int.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"

int peer_caps_report(const struct agent_client *coord, const char *run,
                     const uint8_t peer_pub[CM_ED25519_PUB_LEN], const struct peer_caps *c)
{
    if (!coord || !run || !peer_pub || !c || c->n_pairs > PEER_CAPS_MAX_PAIRS)
        return CM_EINVAL;
    char k64[64], path[160];
    cm_b64url_encode(peer_pub, CM_ED25519_PUB_LEN, k64);
    json_t *pairs = json_array();
    for (size_t i = 0; pairs && i < c->n_pairs; i++) {
        char o64[64];
        cm_b64url_encode(c->pairs[i].pub, CM_ED25519_PUB_LEN, o64);
        json_t *e = json_pack("{s:s}", "peer_public_key", o64);
        if (e && c->pairs[i].mbps > 0)
            json_object_set_new(e, "mbps", json_real(c->pairs[i].mbps));
        if (e && c->pairs[i].rtt_ms > 0)
            json_object_set_new(e, "rtt_ms", json_real(c->pairs[i].rtt_ms));
        json_array_append_new(pairs, e);
    }
    json_t *body = pairs ? json_pack("{s:s, s:f, s:f, s:f, s:b, s:o}", "peer_public_key", k64,
                                     "samples_per_s", c->sps, "upload_mbps", c->up_mbps,
                                     "download_mbps", c->down_mbps, "accepts_inbound",
                                     c->inbound != 0, "pairs", pairs)
                         : NULL;
    if (body && c->reach[0])
        json_object_set_new(body, "reachability", json_string(c->reach));
    unsigned char ab[16];
    if (body && c->addr[0] && (inet_pton(AF_INET, c->addr, ab) == 1 || inet_pton(AF_INET6, c->addr, ab) == 1))
        json_object_set_new(body, "address", json_string(c->addr));
    if (body && c->relay[0])
        json_object_set_new(body, "relay", json_string(c->relay));
    if (body && c->punched > 0)
        json_object_set_new(body, "punched", json_integer(c->punched));
    if (body && c->failing > 0) {
        json_object_set_new(body, "failing_rounds", json_integer(c->failing));
        json_object_set_new(body, "failing_reason", json_string(c->failing_why));
    }
    if (!body)
        return CM_ENOMEM;
    snprintf(path, sizeof path, "/api/v1/runs/%s/capabilities", run);
    struct agent_reply r = {0};
    int rc = agent_request(coord, "POST", path, body, &r);
    json_decref(body);
    if (rc != CM_OK)
        return rc;
    if (r.status != 200) {
        agent_reply_report("capability report", &r);
        rc = r.status == 401 || r.status == 403 ? CM_EAUTH
             : r.status == 404                  ? CM_ENOTFOUND
             : r.status == 409                  ? CM_ESTATE
             : r.status == 400                  ? CM_EINVAL
                                                : CM_EPROTO;
    }
    agent_reply_free(&r);
    return rc;
}

static int moved(double a, double b)
{
    double hi = fmax(fabs(a), fabs(b));
    return hi > 0 && fabs(a - b) > 0.2 * hi;
}

int peer_caps_changed(const struct peer_caps *old, const struct peer_caps *now)
{
    if (!old || !now)
        return 1;
    if (moved(old->sps, now->sps) || moved(old->up_mbps, now->up_mbps) ||
        moved(old->down_mbps, now->down_mbps) || (old->inbound != 0) != (now->inbound != 0) ||
        (old->failing != 0) != (now->failing != 0) || strcmp(old->reach, now->reach) ||
        strcmp(old->relay, now->relay) || old->punched != now->punched || old->n_pairs != now->n_pairs)
        return 1;
    for (size_t i = 0; i < now->n_pairs; i++) {
        size_t j = 0;
        while (j < old->n_pairs && memcmp(old->pairs[j].pub, now->pairs[i].pub, CM_ED25519_PUB_LEN))
            j++;
        if (j == old->n_pairs || moved(old->pairs[j].mbps, now->pairs[i].mbps))
            return 1;
    }
    return 0;
}

/* Capabilities for the schedule: re-reported every minute and when they
 * change materially. Bandwidth is the volunteer's cap; without one,
 * 1 Gbit/s is assumed. Pairwise throughput comes from the probe thread. */
void peer_rt_report_caps(struct peer_rt *rt, double sps, int aux)
{
    double t = peer_mono_s();
    struct peer_caps c = {0};
    c.sps = aux ? 0 : sps;
    c.failing = __atomic_load_n(&rt->failing_rounds, __ATOMIC_RELAXED);
    /* peers reached through a punched hole, or reaching us through one:
       asked of the net's loop (a wait for it, on the training thread) at
       most every 5 s, before any lock is held */
    if (rt->net && t - rt->punched_at >= 5) {
        size_t punched = peer_net_punched(rt->net);
        rt->punched = punched > PEER_CAPS_MAX_PUNCHED ? PEER_CAPS_MAX_PUNCHED : (int)punched;
        rt->punched_at = t;
    }
    c.punched = rt->punched;
    /* measured (the link probe), capped by what the volunteer allows; the
       cap, or 1 Gbit/s, until measured; one lock for what the probe thread
       and the role's failing rounds hand over */
    pthread_mutex_lock(&rt->probe_mu);
    double lu = rt->link_up, ld = rt->link_down;
    if (c.failing)
        snprintf(c.failing_why, sizeof c.failing_why, "%s", rt->failing_why);
    double cu = rt->cfg.max_upload_mbps, cd = rt->cfg.max_download_mbps;
    c.up_mbps = lu > 0 ? (cu > 0 ? fmin(lu, cu) : lu) : cu > 0 ? cu : 1000;
    c.down_mbps = ld > 0 ? (cd > 0 ? fmin(ld, cd) : ld) : cd > 0 ? cd : 1000;
    pthread_mutex_lock(&rt->addr_mu);
    enum peer_reach reach = rt->reach;
    c.inbound = rt->my_addr[0] != 0;
    if (reach == PEER_REACH_RELAYED)
        snprintf(c.relay, sizeof c.relay, "%s", rt->relay);
    pthread_mutex_unlock(&rt->addr_mu);
    snprintf(c.reach, sizeof c.reach, "%s",
             reach == PEER_REACH_DIRECT || reach == PEER_REACH_FLAG_ADDR ? "direct"
             : reach == PEER_REACH_CLIENT || reach == PEER_REACH_FLAG_CLIENT ? "client"
             : reach == PEER_REACH_RELAYED                                   ? "relayed"
                                                                             : "unknown");
    snprintf(c.addr, sizeof c.addr, "%s",
             rt->observed_ip[0] ? rt->observed_ip
             : reach == PEER_REACH_FLAG_ADDR && rt->cfg.advertise_ip ? rt->cfg.advertise_ip : "");
    /* the pairs the probe thread measured last */
    int fresh_pairs = rt->probe_new;
    rt->probe_new = 0;
    c.n_pairs = rt->probe_caps.n_pairs;
    memcpy(c.pairs, rt->probe_caps.pairs, sizeof c.pairs);
    pthread_mutex_unlock(&rt->probe_mu);
    if ((c.sps > 0 || aux) &&
        (rt->caps_at == 0 || t - rt->caps_at > (c.failing ? 15 : 60) ||
         (rt->cfg.caps_every_s > 0 && t - rt->caps_at > rt->cfg.caps_every_s) || fresh_pairs ||
         peer_caps_changed(&rt->caps, &c))) {
        if (peer_caps_report(&rt->coord, rt->cfg.run, rt->key.pub, &c) == CM_OK)
            rt->caps = c;
        rt->caps_at = t;
    }
}

void peer_rt_set_pairs(struct peer_rt *rt, const struct peer_caps *c)
{
    pthread_mutex_lock(&rt->probe_mu);
    int same = rt->probe_caps.n_pairs == c->n_pairs;
    for (size_t i = 0; same && i < c->n_pairs; i++)
        same = !memcmp(rt->probe_caps.pairs[i].pub, c->pairs[i].pub, CM_ED25519_PUB_LEN) &&
               rt->probe_caps.pairs[i].mbps == c->pairs[i].mbps &&
               rt->probe_caps.pairs[i].rtt_ms == c->pairs[i].rtt_ms;
    if (!same) {
        rt->probe_caps.n_pairs = c->n_pairs;
        memcpy(rt->probe_caps.pairs, c->pairs, c->n_pairs * sizeof c->pairs[0]);
        rt->probe_new = 1;
    }
    pthread_mutex_unlock(&rt->probe_mu);
}

/* Pairwise throughput to a sample of peers (up to 3, chosen by
 * SHA-256(our key || theirs), so different peers probe different ones):
 * up to 2 MiB or 2 s (0.5 s in the first pass) of quiet time each over the state hosts, within the volunteer's
 * caps, two 32 KiB messages in flight (peer_net_probe), so a slow link
 * holds little queued behind the probe. Shorter probes (600 ms, best of 3)
 * read slow links high by the token bucket's burst, and the LP then picked
 * another vertex of the same optimum, one that let the slow peers aggregate
 * and took 1.7x its prediction. A thread of its own does it (10-20 s after
 * joining, again 40-60 s later, then every five minutes), so the probes
 * never hold the training loop.
 *
 * A probe reads what the path gives while it runs: when it shares the link
 * with the collaboration's averaging, or with another peer's probe, it reads
 * a fraction of it (tests/integ/test_schedule_follow.c saw 0.6-2.2 Mbit/s on
 * 4 Mbit/s links, the LP then planned around links that were not there and
 * predicted rounds 10-20 % slower than they ran). So a probe counts only
 * the time no round or state transfer of this peer is running
 * (rt->averaging; rounds are synchronous, so mostly nobody's is), a state
 * host serves one prober at a time (busy ones are tried again later), the
 * start is jittered, and each pair is reported at the best of its last
 * PEER_PROBE_KEEP readings: contention comes and goes, a path's bottleneck
 * stays. */
#define PROBE_PEERS 3
#define PROBE_TRIES 4 /* passes over the peers that were busy with another prober */
#define PROBE_BYTES (2048u * 1024u)
#define PROBE_RTT_PINGS 3 /* the smallest of these is the pair's round trip */
#define PROBE_BUDGET_MS 2000    /* of quiet time (see peer_net_probe) */
#define PROBE_FIRST_BUDGET_MS 500 /* while we have no pair (docs/schedules.md) */
#define PROBE_DEADLINE_MS 60000 /* to find that much quiet time */
#define PROBE_EVERY_S 300
#define PROBE_FIRST_S 10 /* 20 left short runs without a pair (test_schedule_follow) */
#define PROBE_SECOND_S 40
#define PROBE_JITTER_S 20

/* Records a reading of the pair to `pub` and returns the pair's best of its
 * last PEER_PROBE_KEEP readings. Probe thread only. */
static double pair_best(struct peer_rt *rt, const uint8_t *pub, double mbps)
{
    size_t i = 0;
    while (i < rt->n_probe_hist && memcmp(rt->probe_hist[i].pub, pub, CM_ED25519_PUB_LEN))
        i++;
    if (i == rt->n_probe_hist) {
        if (i == PEER_CAPS_MAX_PAIRS) /* full: the oldest entry makes room */
            memmove(rt->probe_hist, rt->probe_hist + 1, --i * sizeof rt->probe_hist[0]);
        else
            rt->n_probe_hist++;
        memset(&rt->probe_hist[i], 0, sizeof rt->probe_hist[i]);
        memcpy(rt->probe_hist[i].pub, pub, CM_ED25519_PUB_LEN);
    }
    struct peer_pair_hist *h = &rt->probe_hist[i];
    memmove(h->mbps + 1, h->mbps, (PEER_PROBE_KEEP - 1) * sizeof h->mbps[0]);
    h->mbps[0] = mbps;
    double best = 0;
    for (size_t k = 0; k < PEER_PROBE_KEEP; k++)
        best = fmax(best, h->mbps[k]);
    return best;
}

/* Waits `secs` seconds or until the runtime stops; 1 when it stops. */
static int probe_pause(struct peer_rt *rt, int secs)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += secs;
    pthread_mutex_lock(&rt->probe_mu);
    while (!rt->probe_stop && pthread_cond_timedwait(&rt->probe_cv, &rt->probe_mu, &dl) == 0)
        ;
    int stop = rt->probe_stop;
    pthread_mutex_unlock(&rt->probe_mu);
    return stop;
}

/* Waits ms milliseconds or until the runtime stops; 1 when it stops. */
static int probe_pause_ms(struct peer_rt *rt, int ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    long ns = dl.tv_nsec + (long)ms * 1000000L;
    dl.tv_sec += ns / 1000000000L;
    dl.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&rt->probe_mu);
    while (!rt->probe_stop && pthread_cond_timedwait(&rt->probe_cv, &rt->probe_mu, &dl) == 0)
        ;
    int stop = rt->probe_stop;
    pthread_mutex_unlock(&rt->probe_mu);
    return stop;
}

/* Seconds in [base, base + PROBE_JITTER_S / 2], drawn afresh each time. */
static int probe_wait(int base)
{
    uint8_t r = 0;
    if (cm_random_bytes(&r, 1) != CM_OK)
        r = 0;
    return base + r % (PROBE_JITTER_S / 2 + 1);
}

static void measure_pairs(struct peer_rt *rt, struct peer_caps *c)
{
    c->n_pairs = 0;
    struct peer_info *p = NULL;
    size_t n = 0;
    if (!rt->role.peers || rt->role.peers(rt->role.ctx, &p, &n) != CM_OK)
        return;
    int64_t now = peer_rt_now_ms(rt);
    uint8_t best_h[PROBE_PEERS][CM_SHA256_LEN];
    size_t best[PROBE_PEERS], nb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!p[i].st[0] || p[i].aux || p[i].t_ms < now - 30000 ||
            !memcmp(p[i].pub, rt->key.pub, CM_ED25519_PUB_LEN))
            continue;
        uint8_t buf[2 * CM_ED25519_PUB_LEN], h[CM_SHA256_LEN];
        memcpy(buf, rt->key.pub, CM_ED25519_PUB_LEN);
        memcpy(buf + CM_ED25519_PUB_LEN, p[i].pub, CM_ED25519_PUB_LEN);
        cm_sha256(buf, sizeof buf, h);
        size_t at = nb;
        while (at > 0 && memcmp(h, best_h[at - 1], sizeof h) < 0)
            at--;
        if (at >= PROBE_PEERS)
            continue;
        for (size_t k = (nb < PROBE_PEERS ? nb : PROBE_PEERS - 1); k > at; k--) {
            best[k] = best[k - 1];
            memcpy(best_h[k], best_h[k - 1], sizeof h);
        }
        best[at] = i;
        memcpy(best_h[at], h, sizeof h);
        if (nb < PROBE_PEERS)
            nb++;
    }
    /* A peer busy with another prober is tried again after the others,
       a few seconds later, up to PROBE_TRIES times. */
    uint8_t busy[PROBE_PEERS] = {0};
    /* first readings soon (a bandwidth-bound collaboration has little
       quiet time), then longer ones */
    uint32_t budget = rt->probe_caps.n_pairs ? PROBE_BUDGET_MS : PROBE_FIRST_BUDGET_MS;
    for (int pass = 0; pass < PROBE_TRIES; pass++) {
        size_t again = 0;
        for (size_t k = 0; k < nb && c->n_pairs < PEER_CAPS_MAX_PAIRS; k++) {
            if (pass > 0 && !busy[k])
                continue;
            busy[k] = 0;
            double mbps = 0;
            int rc = peer_net_probe(rt->net, p[best[k]].st, p[best[k]].pub, PROBE_BYTES, budget,
                                    PROBE_DEADLINE_MS, &rt->averaging, &rt->probe_stop, &mbps);
            if (rc == CM_OK && mbps > 0) {
                /* the pair's round trip too (issue 17, "Measured links";
                   the pipeline scheduler's delay, docs/pipelines.md): a few
                   Pings on the connection the probe opened */
                double rtt = 0;
                if (peer_net_rtt(rt->net, p[best[k]].st, p[best[k]].pub, PROBE_RTT_PINGS, &rtt) != CM_OK)
                    rtt = 0;
                memcpy(c->pairs[c->n_pairs].pub, p[best[k]].pub, CM_ED25519_PUB_LEN);
                c->pairs[c->n_pairs].rtt_ms = rtt;
                c->pairs[c->n_pairs++].mbps = pair_best(rt, p[best[k]].pub, mbps);
                /* reported as they come (a probe may wait long for quiet
                   time), unless that would report fewer pairs than before */
                pthread_mutex_lock(&rt->probe_mu);
                if (c->n_pairs >= rt->probe_caps.n_pairs) {
                    rt->probe_caps = *c;
                    rt->probe_new = 1;
                }
                pthread_mutex_unlock(&rt->probe_mu);
            } else if (rc == CM_EBUSY) {
                busy[k] = 1;
                again++;
            }
        }
        if (!again || probe_pause(rt, probe_wait(1))) /* 1-11 s */
            break;
    }
    free(p);
}

/* The link's own upload and download (docs/schedules.md, "Measured
 * links"): probes against the run's DHT backbone node (the coordinator's,
 * normally on a fatter link than any volunteer's), in quiet time only, one
 * prober at a time there (a busy backbone is tried again 0.5-2 s later):
 * by the net stage, before the role moves anything (runtime.c), then by
 * the probe thread every LINK_EVERY_S. The volunteer's --max-*-mbps still
 * cap what is reported. */
#define LINK_BYTES (16u * 1024u * 1024u)
#define LINK_BUDGET_MS 1000
#define LINK_DEADLINE_MS 30000
#define LINK_TRIES 10
#define LINK_EVERY_S 1800

int peer_rt_link_measurable(const struct peer_rt *rt)
{
    if (rt->cfg.max_upload_mbps > 0 && rt->cfg.max_download_mbps > 0)
        return 0; /* the volunteer told us both ways */
    return strcmp(rt->observed_ip, "127.0.0.1") != 0 && strcmp(rt->observed_ip, "::1") != 0;
}

int peer_rt_measure_link(struct peer_rt *rt, uint32_t deadline_ms)
{
    uint8_t pub[CM_ED25519_PUB_LEN];
    double t0 = peer_mono_s();
    int rc = CM_ETIMEOUT;
    /* a direction the volunteer capped is taken at its word: only the
       other one is measured (and reported as 0 here: the cap serves);
       pacing writes the caps under the lock */
    pthread_mutex_lock(&rt->probe_mu);
    int measurable = peer_rt_link_measurable(rt);
    int mup = !(rt->cfg.max_upload_mbps > 0), mdown = !(rt->cfg.max_download_mbps > 0);
    double cap_up = rt->cfg.max_upload_mbps, cap_down = rt->cfg.max_download_mbps;
    pthread_mutex_unlock(&rt->probe_mu);
    if (!measurable)
        return CM_ENOTFOUND;
    for (int t = 0; t < LINK_TRIES && !__atomic_load_n(&rt->probe_stop, __ATOMIC_ACQUIRE) &&
                    !peer_rt_interrupted(rt) && (peer_mono_s() - t0) * 1000 < deadline_ms;
         t++) {
        const char *addr = rt->n_bootstrap ? rt->bootstrap[t % rt->n_bootstrap] : NULL;
        double up = 0, down = 0;
        rc = addr ? peer_net_key_of(rt->net, addr, pub) : CM_ENOTFOUND;
        if (rc == CM_OK && mup)
            rc = peer_net_link_probe(rt->net, addr, pub, 0, LINK_BYTES, LINK_BUDGET_MS, LINK_DEADLINE_MS,
                                     &rt->averaging, &rt->probe_stop, &up);
        if (rc == CM_OK && mdown)
            rc = peer_net_link_probe(rt->net, addr, pub, 1, LINK_BYTES, LINK_BUDGET_MS, LINK_DEADLINE_MS,
                                     &rt->averaging, &rt->probe_stop, &down);
        if (rc == CM_OK && (up > 0 || !mup) && (down > 0 || !mdown)) {
            pthread_mutex_lock(&rt->probe_mu);
            rt->link_up = up;
            rt->link_down = down;
            rt->probe_new = 1;
            pthread_mutex_unlock(&rt->probe_mu);
            double took = peer_mono_s() - t0;
            if (mup && mdown)
                printf("link: upload %.1f Mbit/s, download %.1f Mbit/s (measured against %s in %.1f s)\n", up,
                       down, addr, took);
            else
                printf("link: upload %.1f Mbit/s, download %.1f Mbit/s (%s measured against %s in %.1f s, %s "
                       "your --max-%s-mbps)\n", mup ? up : cap_up, mdown ? down : cap_down,
                       mup ? "upload" : "download", addr, took,
                       mup ? "download" : "upload", mup ? "download" : "upload");
            fflush(stdout);
            return CM_OK;
        }
        if (rc != CM_EBUSY && rc != CM_ETIMEOUT && t >= 2)
            break;
        /* the backbone measures another peer's link: again in 0.5-2 s */
        for (int k = probe_wait(1) % 4 + 1; k > 0 && !peer_rt_interrupted(rt); k--)
            if (probe_pause_ms(rt, 500))
                return CM_ECANCELED;
    }
    if (peer_rt_interrupted(rt))
        return CM_ECANCELED;
    if (rc != CM_ECANCELED)
        fprintf(stderr, "warning: the link could not be measured (%s); reporting %s until it is\n",
                cm_strerror(rc), !mup || !mdown ? "your cap, else 1 Gbit/s" : "1 Gbit/s");
    return rc;
}

void *peer__probe_main(void *arg)
{
    struct peer_rt *rt = arg;
    /* the net stage measured the link (or tried: again in a few seconds);
       then every LINK_EVERY_S. Pairs: 10-20 s after joining, again 40-60 s
       later, then every five minutes. */
    double now = peer_mono_s();
    pthread_mutex_lock(&rt->probe_mu);
    /* a volunteer who declared a cap is taken at their word (measured mid-run,
       with the collaboration's traffic on the link, a 4 Mbit/s download
       read 1.8 and the schedule planned around it) */
    double link_next = !peer_rt_link_measurable(rt) ? INFINITY
                       : now + (rt->link_up > 0 || rt->link_down > 0 ? LINK_EVERY_S : probe_wait(1) % 4 + 2);
    double pairs_next = now + probe_wait(PROBE_FIRST_S);
    int rounds = 0;
    while (!rt->probe_stop) {
        double next = fmin(link_next, pairs_next);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        double wait = next - peer_mono_s();
        if (wait > 0) {
            long ns = dl.tv_nsec + (long)((wait - floor(wait)) * 1e9);
            dl.tv_sec += (time_t)wait + ns / 1000000000L;
            dl.tv_nsec = ns % 1000000000L;
            while (!rt->probe_stop && pthread_cond_timedwait(&rt->probe_cv, &rt->probe_mu, &dl) == 0)
                ;
        }
        if (rt->probe_stop)
            break;
        int measurable = peer_rt_link_measurable(rt); /* pacing sets the caps under the lock */
        pthread_mutex_unlock(&rt->probe_mu);
        if (peer_mono_s() >= link_next && !measurable) {
            link_next = INFINITY; /* paced since (both ways capped) */
        } else if (peer_mono_s() >= link_next) {
            int lr = peer_rt_measure_link(rt, LINK_DEADLINE_MS);
            link_next = peer_mono_s() + (lr == CM_OK ? LINK_EVERY_S : PROBE_EVERY_S);
        }
        struct peer_caps c = {0};
        int pairs = peer_mono_s() >= pairs_next;
        if (pairs)
            measure_pairs(rt, &c);
        pthread_mutex_lock(&rt->probe_mu);
        if (!pairs)
            continue;
        if (c.n_pairs) {
            rt->probe_caps = c;
            rt->probe_new = 1;
        }
        rounds += c.n_pairs > 0;
        pairs_next = peer_mono_s() + probe_wait(!c.n_pairs ? PROBE_FIRST_S : rounds == 1 ? PROBE_SECOND_S
                                                                                       : PROBE_EVERY_S);
    }
    pthread_mutex_unlock(&rt->probe_mu);
    return NULL;
}

void peer_rt_set_failing(struct peer_rt *rt, int rounds, const char *why)
{
    pthread_mutex_lock(&rt->probe_mu);
    snprintf(rt->failing_why, sizeof rt->failing_why, "%s", rounds > 0 && why ? why : "");
    pthread_mutex_unlock(&rt->probe_mu);
    __atomic_store_n(&rt->failing_rounds, rounds > 0 ? rounds : 0, __ATOMIC_RELAXED);
}
