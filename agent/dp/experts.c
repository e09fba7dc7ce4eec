/* A DMoE model's remote experts in the data-parallel role (docs/experts.md,
 * "Trainers"): attaching them to the net once it is up, and their figures
 * per step for the progress line and the step log (calls, failures,
 * timeouts, mean latency since the last step's line), and the samples each
 * expert server answered, attested in the contribution report. Seed
 * 002_2b00836ea4b30f79.txt §3.3: the trainer's expert calls. */
#include <stdio.h>
#include <string.h>

#include "agent/dp/dp.h"
#include "agent/moe/remote.h"
#include "agent/peer/report.h"

void dp_experts_attach(struct dp_state *s)
{
    if (!s->tr.remote || !s->rt.net)
        return;
    struct moe_remote_runner rn;
    moe_remote_runner_net(s->rt.net, &rn);
    moe_remote_set_runner(s->tr.remote, &rn);
    const struct kern_dmoe_config *c = &s->tcfg.dmoe;
    printf("experts: remote, found in the DHT of run '%s' (grid %d x %d, top-%d, %ld ms deadline, "
           "%d micro-batches in flight)\n",
           s->o.run, c->grid_d, c->grid_m, c->k, s->o.expert_timeout_ms,
           s->tr.async ? agent_async_max_inflight(s->tr.async) : 1);
}

/* The counts since the last step's line. */
static void since(struct dp_state *s, struct moe_remote_stats *d, double *mean_ms)
{
    struct moe_remote_stats now;
    moe_remote_get_stats(s->tr.remote, &now);
    const struct moe_remote_stats *p = &s->moe_prev;
    *d = (struct moe_remote_stats){
        .searches = now.searches - p->searches,
        .search_failures = now.search_failures - p->search_failures,
        .calls = now.calls - p->calls,
        .failures = now.failures - p->failures,
        .timeouts = now.timeouts - p->timeouts,
        .nonfinite = now.nonfinite - p->nonfinite,
        .bans = now.bans - p->bans,
        .latency_ms = now.latency_ms - p->latency_ms,
        .answered = now.answered - p->answered,
    };
    *mean_ms = d->answered ? d->latency_ms / (double)d->answered : 0;
}

/* " | experts C calls, F failed, L ms" for the progress line; 0 and ""
 * without remote experts. consume: the next line counts from here. */
int dp_experts_line(struct dp_state *s, char *out, size_t cap, int consume)
{
    out[0] = 0;
    if (!s->tr.remote)
        return 0;
    struct moe_remote_stats d;
    double ms;
    since(s, &d, &ms);
    snprintf(out, cap, " | experts %llu calls, %llu failed, %.1f ms", (unsigned long long)d.calls,
             (unsigned long long)d.failures, ms);
    if (consume)
        moe_remote_get_stats(s->tr.remote, &s->moe_prev);
    return 1;
}

/* ,"experts":{...} for a step log line (the counts since the last one). */
int dp_experts_json(struct dp_state *s, char *out, size_t cap)
{
    out[0] = 0;
    if (!s->tr.remote)
        return 0;
    struct moe_remote_stats d;
    double ms;
    since(s, &d, &ms);
    snprintf(out, cap,
             ",\"experts\":{\"calls\":%llu,\"failed\":%llu,\"timeouts\":%llu,\"nonfinite\":%llu,"
             "\"bans\":%llu,\"searches\":%llu,\"search_failed\":%llu,\"mean_ms\":%.2f,"
             "\"dropped_micro_batches\":%ld}",
             (unsigned long long)d.calls, (unsigned long long)d.failures,
             (unsigned long long)d.timeouts, (unsigned long long)d.nonfinite,
             (unsigned long long)d.bans, (unsigned long long)d.searches,
             (unsigned long long)d.search_failures, ms, s->moe_dropped);
    moe_remote_get_stats(s->tr.remote, &s->moe_prev);
    s->moe_dropped = 0;
    return 1;
}

void dp_experts_attest(struct dp_state *s, struct peer_report *rep, double samples)
{
    rep->n_experts = 0;
    if (!s->tr.remote)
        return;
    struct moe_remote_served sv[PEER_REPORT_EXPERTS_MAX];
    /* the coordinator credits at most k x the report's samples */
    double budget = samples > 0 ? samples * (double)s->tcfg.dmoe.k : 0;
    size_t n = moe_remote_take_served(s->tr.remote, sv, PEER_REPORT_EXPERTS_MAX,
                                      budget < 1e15 ? (uint64_t)budget : (uint64_t)1e15);
    for (size_t i = 0; i < n; i++) {
        if (!sv[i].samples || sv[i].samples > 1000000000ull)
            continue; /* nothing to attest; beyond the report's bound (never in practice) */
        memcpy(rep->experts[rep->n_experts].pub, sv[i].pub, 32);
        rep->experts[rep->n_experts++].samples = (double)sv[i].samples;
    }
}
