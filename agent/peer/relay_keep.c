/* Relays for the peer runtime (docs/p2p.md, "Relays"; seed
 * 000_02cc6b5d62a616fc.txt §3.3, technique 2). A directly reachable agent
 * lends ports on its state host and says so in the DHT (key
 * "<run>/relays", its state host's address, refreshed every 30 s). An
 * unreachable one reserves ports at such an agent and announces those as
 * its addresses, so that it can aggregate and serve its state like any
 * peer; when its relay goes away it takes another (or, with none left,
 * goes back to being a client-mode peer until one appears). A
 * coordinator's backbone node may relay too (--relay-reservations): it is
 * used only after 10 s without a volunteer that takes us. The keeper runs
 * on a thread of its own from the net stage on. */
#include "agent/peer/runtime_int.h"
#include "agent/peer/relay_rank.h"
#include "p2p/p2p_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"
#include "cm_time.h"

#define RELAY_ADVERT_EVERY_S 30
#define RELAY_ADVERT_TTL_MS 90000
#define RELAY_RESERVE_MS 4000
#define RELAY_MAX_TRIES 4
#define RELAY_BACKBONE_AFTER_S 10

static void relay_key(const struct peer_rt *rt, char *key, size_t cap)
{
    snprintf(key, cap, "%s/relays", rt->cfg.run);
}

int peer_rt_addrs(struct peer_rt *rt, char my[PEER_ADDR_MAX], char st[PEER_ADDR_MAX])
{
    pthread_mutex_lock(&rt->addr_mu);
    if (my)
        snprintf(my, PEER_ADDR_MAX, "%s", rt->my_addr);
    if (st)
        snprintf(st, PEER_ADDR_MAX, "%s", rt->st_addr);
    int accepting = rt->my_addr[0] != 0;
    pthread_mutex_unlock(&rt->addr_mu);
    return accepting;
}

int peer_rt_my_addr(struct peer_rt *rt, char my[PEER_ADDR_MAX], int *relayed)
{
    pthread_mutex_lock(&rt->addr_mu);
    snprintf(my, PEER_ADDR_MAX, "%s", rt->my_addr);
    int accepting = rt->my_addr[0] != 0;
    if (relayed)
        *relayed = accepting && rt->reach == PEER_REACH_RELAYED;
    pthread_mutex_unlock(&rt->addr_mu);
    return accepting;
}

void peer__set_addrs(struct peer_rt *rt, const char *my, const char *st)
{
    pthread_mutex_lock(&rt->addr_mu);
    snprintf(rt->my_addr, sizeof rt->my_addr, "%s", my);
    snprintf(rt->st_addr, sizeof rt->st_addr, "%s", st);
    pthread_mutex_unlock(&rt->addr_mu);
}

/* Addresses, reachability and relay change together (a step log or a
   capability report in between would say "direct" for a relayed peer). */
static void set_relayed(struct peer_rt *rt, const char *my, const char *st, const char *relay,
                        const uint8_t *relay_pub)
{
    pthread_mutex_lock(&rt->addr_mu);
    snprintf(rt->my_addr, sizeof rt->my_addr, "%s", my);
    snprintf(rt->st_addr, sizeof rt->st_addr, "%s", st);
    snprintf(rt->relay, sizeof rt->relay, "%s", relay ? relay : "");
    if (relay_pub)
        memcpy(rt->relay_pub, relay_pub, CM_ED25519_PUB_LEN);
    rt->reach = relay ? PEER_REACH_RELAYED : PEER_REACH_CLIENT;
    pthread_mutex_unlock(&rt->addr_mu);
}

static int stopping(struct peer_rt *rt)
{
    pthread_mutex_lock(&rt->relay_mu);
    int s = rt->relay_stop;
    pthread_mutex_unlock(&rt->relay_mu);
    return s || peer_rt_interrupted(rt);
}

/* "a.b.c.d:port" or "[v6]:port": peers' relay offers name no host (a
   name would be resolved here, blocking, on a string anyone can write) */
static int numeric(const char *s)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return 0;
    size_t hl = (size_t)(colon - s);
    const char *h = s;
    if (*s == '[') {
        if (hl < 3 || colon[-1] != ']')
            return 0;
        h++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return 0;
    memcpy(host, h, hl);
    host[hl] = 0;
    unsigned char b[16];
    return inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1;
}

/* The throughput we measured to this peer lately (Mbit/s, 0: unknown). */
static double measured_mbps(struct peer_rt *rt, const uint8_t *pub)
{
    double best = 0;
    pthread_mutex_lock(&rt->probe_mu);
    for (size_t i = 0; i < rt->n_probe_hist; i++)
        if (!memcmp(rt->probe_hist[i].pub, pub, CM_ED25519_PUB_LEN))
            for (int k = 0; k < PEER_PROBE_KEEP; k++)
                if (rt->probe_hist[i].mbps[k] > best)
                    best = rt->probe_hist[i].mbps[k];
    pthread_mutex_unlock(&rt->probe_mu);
    return best;
}

/* Looks for relays and reserves at the best one that takes us. CM_OK with
 * the addresses set, CM_ENOTFOUND when no relay is known, or the last
 * refusal. */
int peer__relay_acquire(struct peer_rt *rt, const uint8_t *avoid, int backbone_ok)
{
    char key[200];
    relay_key(rt, key, sizeof key);
    struct peer_record *recs = NULL;
    size_t n = 0;
    int rc = peer_net_get(rt->net, key, &recs, &n);
    if (rc != CM_OK)
        return rc == CM_ENOTFOUND ? rc : rc;
    struct peer_relay_cand c[32];
    size_t nc = 0;
    for (size_t i = 0; i < n && nc < 32; i++) {
        if (!memcmp(recs[i].author, rt->key.pub, CM_ED25519_PUB_LEN) ||
            (avoid && !memcmp(recs[i].author, avoid, CM_ED25519_PUB_LEN)) ||
            peer_relay_entry_parse(recs[i].value, recs[i].len, &c[nc]) != 0 ||
            (c[nc].backbone && !backbone_ok))
            continue;
        memcpy(c[nc].pub, recs[i].author, CM_ED25519_PUB_LEN);
        if (!c[nc].backbone && !numeric(c[nc].addr))
            continue; /* the coordinator's own entry may name its host; a volunteer's may not */
        struct sockaddr_storage a;
        if (p2p_addr_parse(c[nc].addr, &a) != CM_OK)
            continue;
        p2p_addr_format((struct sockaddr *)&a, c[nc].addr, sizeof c[nc].addr); /* numeric from here on */
        c[nc].mbps = measured_mbps(rt, c[nc].pub);
        c[nc].rtt_ms = 1e9;
        nc++;
    }
    peer_records_free(recs, n);
    if (!nc)
        return CM_ENOTFOUND;
    /* without a throughput measurement, the round trip decides */
    for (size_t i = 0; i < nc && i < 8 && !stopping(rt); i++)
        if (c[i].mbps == 0 && peer_net_rtt(rt->net, c[i].addr, c[i].pub, 2, &c[i].rtt_ms) != CM_OK)
            c[i].rtt_ms = 1e9;
    peer_relay_rank(c, nc, rt->key.pub);
    rc = CM_ENOTFOUND;
    for (size_t i = 0; i < nc && i < RELAY_MAX_TRIES && !stopping(rt); i++) {
        char my[PEER_ADDR_MAX], st[PEER_ADDR_MAX];
        rc = peer_net_relay_use(rt->net, c[i].addr, c[i].pub, RELAY_RESERVE_MS, my, st);
        if (rc == CM_OK) {
            set_relayed(rt, my, st, c[i].addr, c[i].pub);
            return CM_OK;
        }
        fprintf(stderr, "warning: relay %s did not take us: %s\n", c[i].addr, cm_strerror(rc));
    }
    return rc;
}

static int wait_stop(struct peer_rt *rt, double s)
{
    struct timespec until = cm_time_after_ms(CLOCK_REALTIME, (int64_t)(s * 1000));
    pthread_mutex_lock(&rt->relay_mu);
    while (!rt->relay_stop)
        if (pthread_cond_timedwait(&rt->relay_cv, &rt->relay_mu, &until) == ETIMEDOUT)
            break;
    int stop = rt->relay_stop;
    pthread_mutex_unlock(&rt->relay_mu);
    return stop || peer_rt_interrupted(rt);
}

static void *keeper_main(void *arg)
{
    struct peer_rt *rt = arg;
    char key[200];
    relay_key(rt, key, sizeof key);
    double next_advert = 0, next_try = 0, backoff = 1, searching_since = peer_mono_s(), advert_at = 0;
    uint32_t advert_load = 0;
    while (!wait_stop(rt, 0.5)) {
        double now = peer_mono_s();
        if (rt->relay_offer) {
            /* the entry says how many reservations we hold, again as soon
               as that changes (at most every 2 s): agents arriving
               together spread over the relays (relay_rank.h) */
            struct p2p_relay_stats rs;
            peer_net_relay_stats(rt->net, &rs);
            if (now >= next_advert || (rs.live_reservations != advert_load && now >= advert_at + 2)) {
                char st[PEER_ADDR_MAX], val[PEER_ADDR_MAX + 16];
                peer_rt_addrs(rt, NULL, st);
                peer_relay_entry_format(val, sizeof val, st, rs.live_reservations);
                advert_at = now;
                if (st[0] && peer_net_put(rt->net, key, val, strlen(val), RELAY_ADVERT_TTL_MS) == CM_OK) {
                    next_advert = now + RELAY_ADVERT_EVERY_S;
                    advert_load = rs.live_reservations;
                } else {
                    next_advert = now + 2;
                }
            }
            continue;
        }
        pthread_mutex_lock(&rt->addr_mu);
        int relayed = rt->reach == PEER_REACH_RELAYED;
        char relay[PEER_ADDR_MAX];
        uint8_t relay_pub[CM_ED25519_PUB_LEN];
        snprintf(relay, sizeof relay, "%s", rt->relay);
        memcpy(relay_pub, rt->relay_pub, sizeof relay_pub);
        pthread_mutex_unlock(&rt->addr_mu);
        int lost = relayed ? peer_net_relay_lost(rt->net) : 0;
        if (relayed && lost) {
            /* back to client mode until another relay takes us: peers
               stop sending our parts to an address that leads nowhere */
            set_relayed(rt, "", "", NULL, NULL);
            printf("reachability: relay %s lost (%s): client mode until another relay takes us\n", relay,
                   cm_strerror(lost));
            fflush(stdout);
            next_try = 0;
            backoff = 1;
            searching_since = now;
        }
        if (!relayed || lost) {
            if (now < next_try)
                continue;
            /* the coordinator's node only when no volunteer relayed for us
               for a while (volunteers publish their offer as they join) */
            int rc = peer__relay_acquire(rt, lost ? relay_pub : NULL,
                                         now - searching_since >= RELAY_BACKBONE_AFTER_S);
            if (rc == CM_OK) {
                char my[PEER_ADDR_MAX], st[PEER_ADDR_MAX];
                peer_rt_addrs(rt, my, st);
                pthread_mutex_lock(&rt->addr_mu);
                snprintf(relay, sizeof relay, "%s", rt->relay);
                pthread_mutex_unlock(&rt->addr_mu);
                printf("reachability: relayed through %s (averaging at %s, state at %s)\n", relay, my, st);
                fflush(stdout);
                backoff = 1;
            } else {
                next_try = now + backoff;
                backoff = backoff < 8 ? backoff * 2 : 8;
            }
        }
    }
    return NULL;
}

void peer__relay_keeper_start(struct peer_rt *rt)
{
    if (rt->relay_started || !rt->net)
        return;
    int offer = rt->reach == PEER_REACH_DIRECT && !rt->cfg.no_relay;
    int use = (rt->reach == PEER_REACH_CLIENT || rt->reach == PEER_REACH_RELAYED) && !rt->cfg.no_relay;
    if (offer && peer_net_relay_offer(rt->net) != CM_OK) {
        fprintf(stderr, "warning: cannot lend relay ports to unreachable peers\n");
        offer = 0;
    }
    if (!offer && !use)
        return;
    rt->relay_offer = offer;
    rt->relay_stop = 0;
    if (pthread_create(&rt->relay_th, NULL, keeper_main, rt) == 0)
        rt->relay_started = 1;
}

void peer__relay_keeper_stop(struct peer_rt *rt)
{
    if (!rt->relay_started)
        return;
    pthread_mutex_lock(&rt->relay_mu);
    rt->relay_stop = 1;
    pthread_cond_broadcast(&rt->relay_cv);
    pthread_mutex_unlock(&rt->relay_mu);
    pthread_join(rt->relay_th, NULL);
    rt->relay_started = 0;
}
