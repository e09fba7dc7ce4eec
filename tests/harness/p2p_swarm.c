/* In-process DHT swarm (see p2p_swarm.h). */
#include "tests/harness/p2p_swarm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cm_err.h"
#include "cm_log.h"

size_t p2p_swarm_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return (size_t)rl.rlim_cur;
}

int p2p_swarm_init(struct p2p_swarm *s, size_t n, const struct p2p_swarm_opts *o)
{
    memset(s, 0, sizeof *s);
    size_t fds = p2p_swarm_raise_fd_limit();
    if (fds < n + 256) {
        printf("swarm: %zu nodes need more file descriptors than %zu\n", n, fds);
        return CM_ERANGE;
    }
    uv_loop_init(&s->loop);
    int rc;
    if (o && o->tk) {
        s->tk = o->tk;
    } else {
        if ((rc = p2p_tk_init(&s->own_tk, "swarm")))
            return rc;
        s->tk = &s->own_tk;
    }
    struct p2p_ctx_config cc = {.loop = &s->loop, .auth = p2p_tk_auth_config(s->tk),
                                .max_upload_mbps = o ? o->up_mbps : 0,
                                .max_download_mbps = o ? o->down_mbps : 0,
                                /* one listener per node, the rest for connections */
                                .max_conns = fds - n - 128};
    cc.auth.replay_capacity = 1u << 20;
    cc.auth.token_cache_capacity = 4 * n + 64;
    if ((rc = p2p_ctx_new(&cc, &s->ctx)))
        return rc;
    s->n = n;
    snprintf(s->listen_ip, sizeof s->listen_ip, "%s", o && o->listen_ip ? o->listen_ip : "127.0.0.1");
    s->peers = calloc(n, sizeof *s->peers);
    s->nodes = calloc(n, sizeof *s->nodes);
    s->alive = calloc(n, sizeof *s->alive);
    if (!s->peers || !s->nodes || !s->alive)
        return CM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        char user[64], pid[64];
        const char *pre = o && o->name_prefix ? o->name_prefix : "peer";
        snprintf(user, sizeof user, "%.20s%zu", pre, i);
        snprintf(pid, sizeof pid, "%.20s%zu", pre, i);
        if ((rc = p2p_tk_peer_new(s->tk, user, pid, 3600, &s->peers[i])))
            return rc;
        struct dht_config dc = {.key = &s->peers[i].key, .token = s->peers[i].token,
                                .listen_ip = o && o->listen_ip ? o->listen_ip : "127.0.0.1",
                                .rpc_timeout_ms = o && o->rpc_timeout_ms ? o->rpc_timeout_ms : 2000,
                                .refresh_interval_ms = o ? o->refresh_ms : 0,
                                .republish_interval_ms = o ? o->republish_ms : 0};
        if ((rc = dht_node_new(s->ctx, &dc, &s->nodes[i]))) {
            printf("swarm: node %zu: %s\n", i, cm_strerror(rc));
            return rc;
        }
        s->alive[i] = 1;
    }
    return CM_OK;
}

struct join_state {
    int done, ok;
    struct p2p_swarm *s;
    size_t *failed_idx;
    size_t nfailed;
};

struct join_one {
    struct join_state *j;
    size_t i;
};

static void join_cb(void *arg, const struct dht_result *res)
{
    struct join_one *o = arg;
    struct join_state *j = o->j;
    j->done++;
    if (res->status == CM_OK)
        j->ok++;
    else if (j->failed_idx)
        j->failed_idx[j->nfailed++] = o->i;
    free(o);
}

int p2p_swarm_run_until(struct p2p_swarm *s, const int *counter, int target, int timeout_ms)
{
    uint64_t end = uv_hrtime() / 1000000 + (uint64_t)timeout_ms;
    while (*counter < target && uv_hrtime() / 1000000 < end)
        uv_run(&s->loop, UV_RUN_ONCE);
    return *counter >= target ? 0 : CM_ETIMEOUT;
}

static int join_list(struct p2p_swarm *s, const struct sockaddr_storage *boot, const size_t *idx,
                     size_t n, size_t batch, struct join_state *j)
{
    int started = 0;
    for (size_t k = 0; k < n; k++) {
        struct join_one *o = malloc(sizeof *o);
        if (!o)
            return CM_ENOMEM;
        o->j = j;
        o->i = idx[k];
        if (dht_bootstrap_async(s->nodes[idx[k]], boot, 1, join_cb, o) == CM_OK)
            started++;
        else
            free(o);
        if ((size_t)started - (size_t)j->done >= batch)
            p2p_swarm_run_until(s, &j->done, started - (int)batch / 2, 60000);
    }
    return p2p_swarm_run_until(s, &j->done, started, 120000);
}

/* Joins nodes first..n-1; a node whose join failed tries once more, as an
 * agent retries its bootstrap. */
static int join_from(struct p2p_swarm *s, const struct sockaddr_storage *boot, size_t first,
                     size_t batch)
{
    if (!batch)
        batch = 32;
    size_t n = s->n - first;
    size_t *idx = malloc((n ? n : 1) * sizeof *idx), *failed = malloc((n ? n : 1) * sizeof *idx);
    if (!idx || !failed) {
        free(idx);
        free(failed);
        return CM_ENOMEM;
    }
    for (size_t k = 0; k < n; k++)
        idx[k] = first + k;
    struct join_state j = {.s = s, .failed_idx = failed};
    int rc = join_list(s, boot, idx, n, batch, &j);
    s->join_failures = j.nfailed;
    if (rc == CM_OK && j.nfailed) {
        struct join_state j2 = {.s = s};
        rc = join_list(s, boot, failed, j.nfailed, batch, &j2);
        if (rc == CM_OK && j2.ok != (int)j.nfailed)
            rc = CM_ECONN;
        j.ok += j2.ok;
    }
    if (rc == CM_OK && j.ok != (int)n)
        rc = CM_ECONN;
    free(idx);
    free(failed);
    return rc;
}

int p2p_swarm_join(struct p2p_swarm *s, size_t batch)
{
    struct sockaddr_storage boot;
    char a[80];
    snprintf(a, sizeof a, "%s:%u", s->listen_ip, dht_node_port(s->nodes[0]));
    p2p_addr_parse(a, &boot);
    return join_from(s, &boot, 1, batch);
}

int p2p_swarm_join_addr(struct p2p_swarm *s, const struct sockaddr_storage *boot, size_t batch)
{
    return join_from(s, boot, 0, batch);
}

void p2p_swarm_kill(struct p2p_swarm *s, size_t i)
{
    if (!s->alive[i])
        return;
    dht_node_free(s->nodes[i]);
    s->nodes[i] = NULL;
    s->alive[i] = 0;
}

void p2p_swarm_cleanup(struct p2p_swarm *s)
{
    for (size_t i = 0; i < s->n; i++)
        p2p_swarm_kill(s, i);
    if (s->ctx)
        p2p_ctx_free(s->ctx);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    for (size_t i = 0; i < s->n && s->peers; i++)
        p2p_tk_peer_cleanup(&s->peers[i]);
    free(s->peers);
    free(s->nodes);
    free(s->alive);
    if (s->tk == &s->own_tk)
        p2p_tk_cleanup(&s->own_tk);
}
