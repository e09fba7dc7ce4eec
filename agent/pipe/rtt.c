/* Round trips between stage agents, for the pipeline scheduler's delay
 * (docs/pipelines.md, "Round trips"; seed 003_f3537b728458fcc1.txt §2:
 * every link has a delay alpha and a bandwidth beta, and alpha enters both
 * the data-parallel cost, eq. 2, and the pipeline cost, eq. 3).
 *
 * Stage agents run no probe thread (its throughput probes need quiet time,
 * which a pipeline's links seldom have); the coordinator takes a pair's
 * bandwidth from the links' measured rates (min of upload and download).
 * What it cannot guess is the delay, so each stage agent Pings every other
 * agent that announced itself on the run's DHT ("RUN/pipe/peers") and
 * reports the pair's round trip (a capability report pair with rtt_ms and
 * no mbps). A reading is the smallest of PIPE_RTT_PINGS Pings, and the
 * reported round trip is the smallest reading so far: during the steps a
 * Ping waits behind activations, and queueing is not the path's delay. It
 * is rounded to two significant digits, so that jitter does not change
 * the coordinator's inputs (each change is a re-solve).
 *
 * Before its first capability report an agent waits (up to
 * PIPE_RTT_FIRST_WAIT_S) until it has a round trip to S x D - 1 others, so
 * that the first assignment, solved once S x D agents reported, already
 * has every pair's delay from one side at least. */
#include "agent/pipe/stage_int.h"
#include "agent/pipe/records.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"

#define PIPE_RTT_PINGS 3
#define PIPE_RTT_EVERY_S 60.0   /* all peers measured again */
#define PIPE_RTT_RETRY_S 30.0   /* a peer that did not answer (its record may outlive it by
                                   120 s, and each try waits PEER_RTT_TIMEOUT_MS) */

static double round2(double ms)
{
    if (!(ms > 0))
        return 0;
    double mag = pow(10, floor(log10(ms)) - 1);
    return round(ms / mag) * mag;
}

static struct pipe_rtt_peer *find(struct pstage *s, const uint8_t *pub)
{
    for (size_t i = 0; i < s->n_rtt; i++)
        if (!memcmp(s->rtt[i].pub, pub, CM_ED25519_PUB_LEN))
            return &s->rtt[i];
    return NULL;
}

int pipe_rtt_tick(struct pstage *s)
{
    char key[160];
    snprintf(key, sizeof key, PIPE_PEERS_KEY_FMT, s->o.run);
    struct peer_record *r = NULL;
    size_t nr = 0;
    if (peer_net_get(s->rt.net, key, &r, &nr) != CM_OK)
        return -1;
    double now = peer_mono_s();
    int known = 0;
    struct peer_caps c = {0};
    for (size_t i = 0; i < nr; i++) {
        char st[PEER_ADDR_MAX], ar[PEER_ADDR_MAX];
        if (!memcmp(r[i].author, s->rt.key.pub, CM_ED25519_PUB_LEN) ||
            pipe_peers_parse(r[i].value, r[i].len, st, ar) != CM_OK)
            continue;
        struct pipe_rtt_peer *p = find(s, r[i].author);
        if (!p && s->n_rtt < PEER_CAPS_MAX_PAIRS) {
            p = &s->rtt[s->n_rtt++];
            memset(p, 0, sizeof *p);
            memcpy(p->pub, r[i].author, CM_ED25519_PUB_LEN);
        }
        if (!p)
            continue; /* more agents than a report holds pairs: the first ones */
        if (now >= p->next) {
            double ms = 0;
            if (peer_net_rtt(s->rt.net, st, r[i].author, PIPE_RTT_PINGS, &ms) == CM_OK && ms > 0) {
                p->best_ms = p->best_ms > 0 ? fmin(p->best_ms, ms) : ms;
                p->next = now + PIPE_RTT_EVERY_S;
            } else {
                p->next = now + PIPE_RTT_RETRY_S;
            }
        }
        /* reported while its record lives (an agent gone for good drops out) */
        if (p->best_ms > 0 && c.n_pairs < PEER_CAPS_MAX_PAIRS) {
            memcpy(c.pairs[c.n_pairs].pub, p->pub, CM_ED25519_PUB_LEN);
            c.pairs[c.n_pairs++].rtt_ms = round2(p->best_ms);
            known++;
        }
    }
    peer_records_free(r, nr);
    peer_rt_set_pairs(&s->rt, &c);
    return known;
}

int pipe_rtt_first(struct pstage *s)
{
    int want = (int)(s->S * s->D_cfg) - 1, known = 0;
    double until = peer_mono_s() + PIPE_RTT_FIRST_WAIT_S;
    for (;;) {
        known = pipe_rtt_tick(s);
        if (known >= want || pipe_g_interrupts || peer_mono_s() >= until)
            break;
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
    }
    printf("round trips measured to %d other stage agent%s%s\n", known < 0 ? 0 : known, known == 1 ? "" : "s",
           known < want ? " (fewer than the run's stages x replicas - 1; more as they come)" : "");
    fflush(stdout);
    return known;
}
