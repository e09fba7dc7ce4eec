/* State sync (runtime.h): catch-up from the coordinator's newest
 * checkpoint or from a peer, and serving our own state to peers that ask
 * (the state host of peer/net.c; docs/protocol.md "State transfer";
 * docs/collaboration.md for when the data-parallel role uses each). The
 * bytes are the role's: it saves and loads them through struct peer_role;
 * the runtime moves them and picks the peer. */
#include "agent/peer/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

const char *peer_rt_state_path(const struct peer_rt *rt)
{
    return rt->state_path;
}

/* Marks the link busy (+1) or frees it (-1) for the probes: they count
 * only the time no round or state transfer of ours runs (peer_net_probe). */
void peer_rt_link_busy(struct peer_rt *rt, int d)
{
    __atomic_add_fetch(&rt->averaging, d, __ATOMIC_ACQ_REL);
}

/* Loads the coordinator's newest checkpoint when it is ahead of us. */
static int catch_up_inner(struct peer_rt *rt, int64_t min_step, int64_t *step_out)
{
    char path[256], sha[65], err[512];
    if (min_step > 0) {
        /* only a checkpoint past min_step is worth loading: loading an
           older one would put our parameters behind our step */
        snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints", rt->cfg.run);
        struct agent_reply r = {0};
        if (agent_request(&rt->coord, "GET", path, NULL, &r) != CM_OK)
            return CM_ECONN;
        json_t *first = json_array_get(json_object_get(r.json, "checkpoints"), 0);
        int64_t newest = r.status == 200 && first ? json_integer_value(json_object_get(first, "step")) : -1;
        agent_reply_free(&r);
        if (newest < min_step)
            return CM_ENOTFOUND;
    }
    snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints/latest", rt->cfg.run);
    long status = 0;
    int rc = agent_download_file(&rt->coord, path, rt->state_path, &status, sha);
    if (rc != CM_OK)
        return rc;
    if (status == 404)
        return CM_ENOTFOUND;
    if (status != 200) {
        fprintf(stderr, "error: downloading the newest checkpoint: HTTP %ld\n", status);
        return CM_EPROTO;
    }
    err[0] = 0;
    rc = rt->role.load_state(rt->role.ctx, step_out, err, sizeof err);
    if (rc != CM_OK) {
        fprintf(stderr, "error: loading the checkpoint: %s\n", err);
        return rc;
    }
    printf("caught up from the coordinator's checkpoint at step %lld (sha256 %.16s...)\n",
           (long long)*step_out, sha);
    return CM_OK;
}

int peer_rt_catch_up(struct peer_rt *rt, int64_t min_step, int64_t *step)
{
    if (rt->stage < PEER_STAGE_PASS || !rt->role.load_state)
        return CM_ESTATE;
    peer_rt_link_busy(rt, 1);
    int rc = catch_up_inner(rt, min_step, step);
    peer_rt_link_busy(rt, -1);
    return rc;
}

/* Serves our state to a peer that asked for it (a late joiner, or a peer
 * behind or diverged), when we hold the step it wants. */
void peer_rt_serve_state(struct peer_rt *rt, int64_t step)
{
    if (!rt->net || !rt->role.save_state || !peer_rt_addrs(rt, NULL, NULL))
        return;
    int64_t want = peer_net_state_wanted(rt->net);
    if (want < 0 || want > step)
        return;
    char err[512];
    err[0] = 0;
    if (rt->role.save_state(rt->role.ctx, err, sizeof err) != CM_OK) {
        fprintf(stderr, "\nwarning: saving the state for a peer: %s\n", err);
        return;
    }
    FILE *f = fopen(rt->state_path, "rb");
    if (!f)
        return;
    uint8_t *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
        peer_net_state_publish(rt->net, step, buf, (size_t)len);
        buf = NULL;
    }
    free(buf);
    fclose(f);
}

/* The hash most fresh peers whose parameters are at `pstep` hold (ties: the
 * smallest), counting ourselves; "" when nobody published one. */
void peer_majority_hash(const struct peer_info *p, size_t n, int64_t pstep, int64_t now,
                        char out[PEER_HASH_HEX + 1])
{
    size_t best = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].pstep != pstep || !p[i].hash[0] || p[i].aux || p[i].t_ms < now - 30000)
            continue;
        size_t c = 0;
        for (size_t k = 0; k < n; k++)
            c += p[k].pstep == pstep && p[k].t_ms >= now - 30000 && !strcmp(p[k].hash, p[i].hash);
        if (c > best || (c == best && strcmp(p[i].hash, out) < 0)) {
            best = c;
            snprintf(out, PEER_HASH_HEX + 1, "%s", p[i].hash);
        }
    }
}

/* While we wait for a peer's state, others may wait for ours (peers that
 * fell apart at the same step each asked the other): serve it meanwhile.
 * While it comes (moving), the role says that we are still about
 * (role.fetching); not while the peer has yet to make it: a peer asked for
 * the state after its next step must not wait for us in turn.
 * Our state does not change during the wait. Nonzero after Ctrl-C: the
 * fetch stops (a state of 20 MB from a slow peer, or one it prepares for
 * 90 s, would hold us that long). */
static int serve_own_state(void *arg, int moving)
{
    struct peer_rt *rt = arg;
    if (peer_rt_interrupted(rt))
        return 1;
    /* the wait can be long: our pass must stay valid, or every peer
       refuses us as "expired token" once the state is ready */
    peer_rt_renew_pass_if_due(rt);
    if (moving && rt->role.fetching)
        rt->role.fetching(rt->role.ctx);
    int64_t st = rt->role.state_step ? rt->role.state_step(rt->role.ctx) : -1;
    if (st >= 0)
        peer_rt_serve_state(rt, st);
    return 0;
}

/* Fetches the state of a peer at step >= min_step (preferring peers that
 * hold it and the majority hash of their step) and loads it. CM_OK: *step
 * moved. wait_ms (0: 20 s, or 90 s from a peer a step short of it) bounds
 * how long a peer that holds it may take to have it ready, and how long
 * the peers that do not hold it yet may take, together. */
static int sync_inner(struct peer_rt *rt, int64_t min_step, int64_t *step, uint32_t wait_ms, char *from)
{
    struct peer_info *p = NULL;
    size_t n = 0;
    if (rt->role.peers(rt->role.ctx, &p, &n) != CM_OK)
        return CM_ECONN;
    int64_t now = peer_rt_now_ms(rt);
    int rc = CM_ENOTFOUND;
    /* Within each pass, peers that compute come before auxiliary ones: an
       auxiliary peer with a state to serve is a pull-only one, which a
       schedule keeps from sending because its upload is slow (docs/
       schedules.md, "Roles"); a state of 2.8 MB took 12 s from a 2 Mbit/s
       one, and well under one from a peer that computes. */
    size_t *ord = calloc(n ? n : 1, sizeof *ord), no = 0;
    if (!ord) {
        free(p);
        return CM_ENOMEM;
    }
    for (int aux = 0; aux < 2; aux++)
        for (size_t i = 0; i < n; i++)
            if ((p[i].aux != 0) == aux)
                ord[no++] = i;
    /* Pass 0: the peers that hold such a state (they publish the hash of
       parameters at min_step or later) and agree with the majority of
       their step: ready at once. Asking a peer a step short of it first
       cost up to 90 s when that peer was catching up itself. Pass 1 (not
       when wait_ms): the peers that agree with the majority. Pass 2: the
       others, with wait_ms bounding their waits in all. */
    for (int pass = 0; pass < 3 && rc != CM_OK; pass++) {
        if (pass == 1 && wait_ms)
            continue;
        for (size_t k = 0; k < no && rc != CM_OK && !peer_rt_interrupted(rt); k++) {
            size_t i = ord[k];
            if (!p[i].st[0] || p[i].step < min_step - 1 || p[i].t_ms < now - 30000 ||
                !memcmp(p[i].pub, rt->key.pub, CM_ED25519_PUB_LEN))
                continue;
            char maj[PEER_HASH_HEX + 1];
            peer_majority_hash(p, n, p[i].pstep, now, maj);
            int agrees = !strcmp(maj, p[i].hash);
            int holds = p[i].hash[0] && p[i].pstep >= min_step;
            if ((pass == 0 && !(holds && agrees)) || (pass == 1 && !agrees) ||
                (pass == 2 && wait_ms && holds && agrees))
                continue;
            int64_t left = wait_ms ? (int64_t)wait_ms - (peer_rt_now_ms(rt) - now) : 0;
            if (wait_ms && !holds && left <= 0)
                break;
            char err[512];
            int64_t got = -1;
            uint32_t wait = p[i].step >= min_step ? 20000 : 90000;
            /* a peer holds the parameters of its pstep when it publishes
               their hash (one whose round averages ahead of its parameters
               publishes none): it has them ready within wait_ms, or it
               does not say the truth */
            if (wait_ms)
                wait = holds ? wait_ms : (uint32_t)left;
            rc = peer_net_state_fetch(rt->net, p[i].st, p[i].pub, min_step, rt->state_path, &got,
                                      p[i].step >= min_step ? 20000 : 90000, wait, serve_own_state, rt);
            if (rc == CM_ECANCELED)
                break;
            if (rc != CM_OK) {
                fprintf(stderr, "\nwarning: fetching the state of peer at %s: %s\n", p[i].st,
                        cm_strerror(rc));
                continue;
            }
            err[0] = 0;
            if ((rc = rt->role.load_state(rt->role.ctx, step, err, sizeof err)) != CM_OK) {
                fprintf(stderr, "\nwarning: loading a peer's state: %s\n", err);
                continue;
            }
            rt->syncs++;
            if (from)
                snprintf(from, PEER_ADDR_MAX, "%s", p[i].st);
        }
    }
    free(ord);
    free(p);
    return rc;
}

int peer_rt_sync_from_peer(struct peer_rt *rt, int64_t min_step, int64_t *step, uint32_t wait_ms,
                           char *from_addr)
{
    if (!rt->net || !rt->role.peers || !rt->role.load_state)
        return CM_ESTATE;
    peer_rt_link_busy(rt, 1);
    int rc = sync_inner(rt, min_step, step, wait_ms, from_addr);
    peer_rt_link_busy(rt, -1);
    return rc;
}
