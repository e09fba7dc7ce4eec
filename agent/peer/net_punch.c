/* Hole punching on the agent's net (peer/net.h, "Hole punching";
 * common/p2p/p2p_relay.h; seed 000_02cc6b5d62a616fc.txt §3.3, technique 1):
 * a round member whose averaging address is a relay's port is reached
 * directly once a punch through that relay connected; the relay stays for
 * peers whose NAT does not let a punch through (symmetric NATs). */
#include "agent/peer/net.h"
#include "agent/peer/net_int.h"
#include "p2p/p2p_relay.h"

#include <arpa/inet.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* An address handed to the loop thread, and what came of it. */
struct addr_arg {
    struct sockaddr_storage addr;
    int rc;
};

static void public_ip_fn(void *arg, struct peer_net *n)
{
    struct addr_arg *a = arg;
    a->rc = p2p_host_set_public_ip(ar_engine_host(n->ar), (struct sockaddr *)&a->addr);
    if (!a->rc)
        n->public_ip_set = 1;
}

static void local_ip_fn(void *arg, struct peer_net *n)
{
    struct addr_arg *a = arg;
    a->rc = p2p_host_set_local_ip(ar_engine_host(n->ar), (struct sockaddr *)&a->addr);
}

static int set_ip(struct peer_net *n, const char *ip, void (*fn)(void *, struct peer_net *))
{
    struct addr_arg a = {.rc = CM_EINVAL};
    struct sockaddr_in *a4 = (struct sockaddr_in *)&a.addr;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&a.addr;
    if (ip && inet_pton(AF_INET, ip, &a4->sin_addr) == 1)
        a4->sin_family = AF_INET;
    else if (ip && inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1)
        a6->sin6_family = AF_INET6;
    else
        return CM_EINVAL;
    int rc = peer_net_call(n, fn, &a);
    return rc ? rc : a.rc;
}

int peer_net_set_public_ip(struct peer_net *n, const char *ip)
{
    return set_ip(n, ip, public_ip_fn);
}

int peer_net_set_local_ip(struct peer_net *n, const char *ip)
{
    return set_ip(n, ip, local_ip_fn);
}

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    return !memcmp(a, b, sizeof *a);
}

/* Its slot (under relay_mu), or NULL. */
static struct peer_punch *find(struct peer_net *n, const uint8_t *pub, const struct sockaddr_storage *addr)
{
    for (size_t i = 0; i < PEER_PUNCH_MAX; i++)
        if (n->punch[i].state != PEER_PUNCH_NONE && !memcmp(n->punch[i].pub, pub, CM_ED25519_PUB_LEN) &&
            same_addr(&n->punch[i].addr, addr))
            return &n->punch[i];
    return NULL;
}

/* On the loop thread. */
static void on_punched(void *arg, int status, const struct sockaddr *direct, int64_t ms)
{
    struct peer_punch *p = arg;
    struct peer_net *n = p->net;
    char a[80] = "?", d[80] = "-";
    p2p_addr_format((const struct sockaddr *)&p->addr, a, sizeof a);
    if (direct)
        p2p_addr_format(direct, d, sizeof d);
    pthread_mutex_lock(&n->relay_mu);
    if (status == CM_OK) {
        p->state = PEER_PUNCH_DIRECT;
        p->fails = 0;
    } else {
        p->state = PEER_PUNCH_FAILED;
        p->fails++;
        double wait = PEER_PUNCH_RETRY_S;
        for (int k = 1; k < p->fails && wait < 3600; k++)
            wait *= 2;
        p->retry_at = mono_s() + wait;
    }
    pthread_mutex_unlock(&n->relay_mu);
    if (status == CM_OK)
        CM_LOGI("punch", "direct to the peer relayed at %s (at %s) in %lld ms", a, d, (long long)ms);
    else
        CM_LOGI("punch", "no direct connection to the peer relayed at %s (%s, %lld ms): through the relay",
                a, cm_strerror(status), (long long)ms);
}

struct punch_arg {
    struct peer_punch *p;
};

static void punch_fn(void *arg, struct peer_net *n)
{
    struct punch_arg *a = arg;
    struct peer_punch *p = a->p;
    int rc = n->public_ip_set ? p2p_host_punch(ar_engine_host(n->ar), (struct sockaddr *)&p->addr, p->pub,
                                               PEER_PUNCH_TIMEOUT_MS, on_punched, p)
                              : CM_ESTATE;
    if (rc)
        on_punched(p, rc, NULL, 0);
}

void peer_net_punch(struct peer_net *n, const uint8_t pub[CM_ED25519_PUB_LEN], const char *addr)
{
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    if (!n || p2p_addr_parse(addr, &sa))
        return;
    double now = mono_s();
    pthread_mutex_lock(&n->relay_mu);
    struct peer_punch *p = find(n, pub, &sa);
    if (p && (p->state != PEER_PUNCH_FAILED || now < p->retry_at)) {
        pthread_mutex_unlock(&n->relay_mu);
        return; /* trying, direct, or failed not long ago */
    }
    if (!p) { /* a free slot, else the oldest settled one that is not in flight */
        for (size_t i = 0; i < PEER_PUNCH_MAX && !p; i++)
            if (n->punch[i].state == PEER_PUNCH_NONE)
                p = &n->punch[i];
        for (size_t i = 0; i < PEER_PUNCH_MAX && !p; i++)
            if (n->punch[i].state == PEER_PUNCH_FAILED)
                p = &n->punch[i];
        if (!p) {
            pthread_mutex_unlock(&n->relay_mu);
            return;
        }
        memset(p, 0, sizeof *p);
        p->net = n;
        memcpy(p->pub, pub, CM_ED25519_PUB_LEN);
        p->addr = sa;
    }
    p->state = PEER_PUNCH_TRYING;
    pthread_mutex_unlock(&n->relay_mu);
    struct punch_arg a = {p};
    if (peer_net_call(n, punch_fn, &a) != CM_OK) {
        pthread_mutex_lock(&n->relay_mu);
        p->state = PEER_PUNCH_FAILED;
        p->retry_at = now + PEER_PUNCH_RETRY_S;
        pthread_mutex_unlock(&n->relay_mu);
    }
}

static void alive_fn(void *arg, struct peer_net *n)
{
    struct addr_arg *a = arg;
    a->rc = p2p_host_punched_to(ar_engine_host(n->ar), (struct sockaddr *)&a->addr);
}

int peer_net_punch_state(struct peer_net *n, const uint8_t pub[CM_ED25519_PUB_LEN], const char *addr)
{
    struct addr_arg a = {0}; /* rc: the hole is open */
    if (!n || p2p_addr_parse(addr, &a.addr))
        return PEER_PUNCH_NONE;
    double now = mono_s();
    pthread_mutex_lock(&n->relay_mu);
    struct peer_punch *p = find(n, pub, &a.addr);
    int st = p ? p->state : PEER_PUNCH_NONE;
    /* asked of the loop (a wait on the caller's thread: the training loop)
       at most once a second per hole */
    int check = st == PEER_PUNCH_DIRECT && now - p->checked_at >= 1.0;
    if (check)
        p->checked_at = now;
    pthread_mutex_unlock(&n->relay_mu);
    /* a hole that closed (the peer left, its router forgot the mapping):
       the transport took the relay again; punch anew */
    if (check && peer_net_call(n, alive_fn, &a) == CM_OK && !a.rc) {
        pthread_mutex_lock(&n->relay_mu);
        if ((p = find(n, pub, &a.addr)) && p->state == PEER_PUNCH_DIRECT) {
            p->state = PEER_PUNCH_FAILED; /* the next peer_net_punch tries at once */
            p->retry_at = 0;
        }
        pthread_mutex_unlock(&n->relay_mu);
        st = PEER_PUNCH_NONE;
    }
    return st;
}

static void punched_fn(void *arg, struct peer_net *n)
{
    *(size_t *)arg = p2p_host_punched(ar_engine_host(n->ar));
}

size_t peer_net_punched(struct peer_net *n)
{
    size_t c = 0;
    if (!n || peer_net_call(n, punched_fn, &c) != CM_OK)
        return 0;
    return c;
}
