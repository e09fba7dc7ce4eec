/* Relays on the agent's net (peer/net.h, "Relays"; common/p2p/p2p_relay.h;
 * docs/p2p.md "Relays"): a reachable agent lends ports on its state host;
 * an unreachable one reserves a port for its averaging host and one for
 * its state host at such an agent and announces those. */
#include "agent/peer/net.h"
#include "agent/peer/net_int.h"
#include "p2p/p2p_relay.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"

static void offer_fn(void *arg, struct peer_net *n)
{
    int *rc = arg;
    *rc = n->st_port ? p2p_host_relay_enable(n->st_host, NULL) : CM_EINVAL;
}

int peer_net_relay_offer(struct peer_net *n)
{
    int rc = CM_EINVAL;
    int crc = peer_net_call(n, offer_fn, &rc);
    return crc ? crc : rc;
}

/* One reservation (ar or state host); its callback runs on the loop. */
static void on_relay(void *arg, int status, const struct sockaddr *adv)
{
    struct peer_relay_slot *s = arg;
    pthread_mutex_lock(&s->net->relay_mu);
    if (status == CM_OK) {
        s->reserved = 1;
        p2p_addr_format(adv, s->adv, sizeof s->adv);
    } else {
        s->lost = 1;
        s->status = status;
    }
    pthread_mutex_unlock(&s->net->relay_mu);
}

struct use_arg {
    struct sockaddr_storage relay;
    uint8_t pub[CM_ED25519_PUB_LEN];
    uint32_t timeout_ms;
    int rc;
};

static void drop_fn(void *arg, struct peer_net *n)
{
    (void)arg;
    p2p_host_relay_drop(ar_engine_host(n->ar));
    p2p_host_relay_drop(n->st_host);
}

static void use_fn(void *arg, struct peer_net *n)
{
    struct use_arg *u = arg;
    p2p_host_relay_drop(ar_engine_host(n->ar));
    p2p_host_relay_drop(n->st_host);
    /* the old reservations can report nothing more: fresh slots (here, on
       the loop thread, where their callbacks run) */
    pthread_mutex_lock(&n->relay_mu);
    memset(&n->relay_ar.reserved, 0, sizeof n->relay_ar - offsetof(struct peer_relay_slot, reserved));
    memset(&n->relay_st.reserved, 0, sizeof n->relay_st - offsetof(struct peer_relay_slot, reserved));
    pthread_mutex_unlock(&n->relay_mu);
    u->rc = p2p_host_relay_use(ar_engine_host(n->ar), (struct sockaddr *)&u->relay, u->pub,
                               u->timeout_ms, on_relay, &n->relay_ar);
    if (!u->rc) {
        u->rc = p2p_host_relay_use(n->st_host, (struct sockaddr *)&u->relay, u->pub, u->timeout_ms,
                                   on_relay, &n->relay_st);
        if (u->rc)
            p2p_host_relay_drop(ar_engine_host(n->ar));
    }
}

int peer_net_relay_use(struct peer_net *n, const char *relay, const uint8_t pub[CM_ED25519_PUB_LEN],
                       uint32_t timeout_ms, char ar_adv[PEER_RELAY_ADDR_MAX],
                       char st_adv[PEER_RELAY_ADDR_MAX])
{
    struct use_arg u = {.timeout_ms = timeout_ms};
    if (p2p_addr_parse(relay, &u.relay))
        return CM_EINVAL;
    memcpy(u.pub, pub, CM_ED25519_PUB_LEN);
    int rc = peer_net_call(n, use_fn, &u);
    if (rc || (rc = u.rc))
        return rc;
    /* both answers come within the request deadline */
    struct timespec t0, now, nap = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pthread_mutex_lock(&n->relay_mu);
        int done = n->relay_ar.reserved && n->relay_st.reserved;
        int lost = n->relay_ar.lost ? n->relay_ar.status : n->relay_st.lost ? n->relay_st.status : 0;
        if (done && !lost) {
            snprintf(ar_adv, PEER_RELAY_ADDR_MAX, "%s", n->relay_ar.adv);
            snprintf(st_adv, PEER_RELAY_ADDR_MAX, "%s", n->relay_st.adv);
        }
        pthread_mutex_unlock(&n->relay_mu);
        if (done && !lost)
            return CM_OK;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double ms = (now.tv_sec - t0.tv_sec) * 1e3 + (now.tv_nsec - t0.tv_nsec) / 1e6;
        if (lost || ms > timeout_ms + 1000.0) {
            peer_net_call(n, drop_fn, NULL);
            return lost ? lost : CM_ETIMEOUT;
        }
        nanosleep(&nap, NULL);
    }
}

int peer_net_relay_lost(struct peer_net *n)
{
    pthread_mutex_lock(&n->relay_mu);
    int lost = n->relay_ar.lost ? n->relay_ar.status : n->relay_st.lost ? n->relay_st.status : 0;
    pthread_mutex_unlock(&n->relay_mu);
    return lost;
}

void peer_net_relay_drop(struct peer_net *n)
{
    peer_net_call(n, drop_fn, NULL);
}

static void stats_fn(void *arg, struct peer_net *n)
{
    struct p2p_relay_stats *out = arg, a;
    p2p_host_relay_stats(n->st_host, out);
    p2p_host_relay_stats(ar_engine_host(n->ar), &a);
    out->accepted += a.accepted;
    out->accept_failed += a.accept_failed;
}

void peer_net_relay_stats(struct peer_net *n, struct p2p_relay_stats *out)
{
    memset(out, 0, sizeof *out);
    peer_net_call(n, stats_fn, out);
}
