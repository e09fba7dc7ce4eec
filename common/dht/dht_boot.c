/* Joining a swarm (dht_node.h: dht_bootstrap_async, dht_node_add_contact):
 * split from dht_node.c, whose lookups it uses through the public API. */
#include "dht/dht_node_internal.h"
#include "dht/dht_msg.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

struct boot {
    struct dht_node *n;
    int pending, ok;
    dht_cb cb;
    void *arg;
    struct sockaddr_storage *addrs;
};

/* Joining (Kademlia, section 2.3 of Maymounkov & Mazieres): look up our
 * own id, then fill every bucket farther away than our closest neighbour,
 * so the table knows some nodes in every part of the id space; without
 * this, lookups started from late joiners can stall far from the target in
 * a large swarm. A full lookup per bucket costs about ten times the join
 * itself; one FIND_NODE to the known contact nearest a random id of the
 * bucket gets the same effect (that contact's k closest to the id), and the
 * contacts it returns enter the table (failing ones leave it on first use). */
struct join {
    struct dht_node *n;
    dht_cb cb;
    void *arg;
    int pending;
    struct dht_result res;
};

static void join_finish(struct join *j)
{
    if (j->cb)
        j->cb(j->arg, &j->res);
    free(j);
}

static void join_probe_done(void *arg, int status, const struct p2p_peer *from,
                            const uint8_t *body, size_t len)
{
    struct join *j = arg;
    struct dht_node *n = j->n;
    struct dht_msg_nodes nd;
    if (status == CM_OK && from && dht_msg_parse_nodes(body, len, &nd) == CM_OK) {
        dht__seen_peer(n, from);
        int64_t now = p2p_now_ms();
        for (size_t i = 0; i < nd.n; i++)
            dht_table_seen(&n->table, &nd.c[i], now);
    }
    j->res.contacted++;
    if (--j->pending == 0)
        join_finish(j);
}

static void join_self_done(void *arg, const struct dht_result *res)
{
    struct join *j = arg;
    struct dht_node *n = j->n;
    j->res.status = res->status;
    j->res.hops = res->hops;
    j->res.contacted = res->contacted;
    if (res->status != CM_OK || res->nclosest == 0 || n->closing) {
        join_finish(j);
        return;
    }
    int nearest = dht_id_bucket(n->id, res->closest[0].id);
    j->pending = 1;
    for (int i = nearest + 1; i < 256; i++) {
        uint8_t target[DHT_ID_LEN], *body;
        size_t blen;
        struct dht_contact c;
        dht_id_random_in_bucket(n->id, i, target);
        if (dht_table_closest(&n->table, target, &c, 1) != 1 ||
            dht_msg_encode_find(target, 0, &body, &blen))
            continue;
        struct sockaddr_storage sa;
        dht_addr_to_sockaddr(&c.addr, &sa);
        if (p2p_request(n->host, (struct sockaddr *)&sa, c.pub, P2P_MSG_DHT_FIND_NODE, body, blen,
                        n->rpc_timeout_ms, join_probe_done, j) == CM_OK) {
            j->pending++;
            n->st.rpcs_sent++;
        }
        free(body);
    }
    if (--j->pending == 0)
        join_finish(j);
}

struct boot_ping {
    struct boot *b;
    size_t i;
};

static void boot_ping_done(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                           size_t len)
{
    struct boot_ping *bp = arg;
    struct boot *b = bp->b;
    struct dht_node *n = b->n;
    (void)body, (void)len;
    if (status == CM_OK && from) {
        struct dht_contact c = {0};
        memcpy(c.pub, from->pub, 32);
        dht_id_of_pub(c.pub, c.id);
        dht_addr_from_sockaddr((struct sockaddr *)&b->addrs[bp->i], &c.addr);
        if (dht_table_seen(&n->table, &c, p2p_now_ms()) == CM_OK)
            b->ok++;
    } else {
        char a[80];
        p2p_addr_format((struct sockaddr *)&b->addrs[bp->i], a, sizeof a);
        CM_LOGW("dht", "bootstrap peer %s: %s", a, cm_strerror(status));
    }
    free(bp);
    if (--b->pending)
        return;
    int rc = CM_ECONN;
    struct join *j = NULL;
    if (b->ok && !n->closing && (j = calloc(1, sizeof *j))) {
        j->n = n;
        j->cb = b->cb;
        j->arg = b->arg;
        rc = dht_find_node_async(n, n->id, join_self_done, j);
        if (rc)
            free(j);
    }
    if (rc) {
        struct dht_result res = {.status = n->closing ? CM_ECLOSED : rc};
        if (b->cb)
            b->cb(b->arg, &res);
    }
    free(b->addrs);
    free(b);
}

int dht_bootstrap_async(struct dht_node *n, const struct sockaddr_storage *addrs, size_t naddrs,
                        dht_cb cb, void *arg)
{
    if (naddrs == 0)
        return CM_EINVAL;
    struct boot *b = calloc(1, sizeof *b);
    if (!b || !(b->addrs = malloc(naddrs * sizeof *addrs))) {
        free(b);
        return CM_ENOMEM;
    }
    memcpy(b->addrs, addrs, naddrs * sizeof *addrs);
    b->n = n;
    b->cb = cb;
    b->arg = arg;
    b->pending = 1; /* held until every ping is sent */
    for (size_t i = 0; i < naddrs; i++) {
        struct boot_ping *bp = malloc(sizeof *bp);
        if (!bp)
            break;
        bp->b = b;
        bp->i = i;
        b->pending++;
        if (p2p_request(n->host, (struct sockaddr *)&b->addrs[i], NULL, P2P_MSG_PING, NULL, 0,
                        n->rpc_timeout_ms, boot_ping_done, bp)) {
            b->pending--;
            free(bp);
        }
    }
    if (--b->pending == 0) {
        free(b->addrs);
        free(b);
        return CM_ECONN;
    }
    return CM_OK;
}

int dht_node_add_contact(struct dht_node *n, const uint8_t pub[32], const struct sockaddr *addr)
{
    struct dht_contact c = {0};
    memcpy(c.pub, pub, 32);
    dht_id_of_pub(pub, c.id);
    int rc = dht_addr_from_sockaddr(addr, &c.addr);
    return rc ? rc : dht_table_seen(&n->table, &c, p2p_now_ms());
}

