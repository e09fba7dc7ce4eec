/* Expert server throughput with and without batching (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.3 "Runtime": the server forms batches from
 * many trainers' requests). One process: an expert server (agent/moe/
 * moe_server.h) on a p2p host and K trainers on their own hosts over
 * loopback, each keeping D forward requests of S samples in flight. Two
 * runs of the same expert block on the same machine:
 *   batched   the server gathers requests into batches of up to 256
 *             samples, waiting at most 2 ms for a batch to fill;
 *   unbatched each request is computed on its own as it arrives (max_batch
 *             = S, no wait): one matrix-vector product per sample when S = 1.
 * Prints samples/s of each and their ratio; every answer must be CM_OK.
 *
 *   build/tests/bench/bench_moe_server [seconds per run, default 3]
 * Environment: MOE_BENCH_C, MOE_BENCH_F (block 512 x 2048), MOE_BENCH_K
 * (8 trainers), MOE_BENCH_D (4 in flight), MOE_BENCH_S (1 sample). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/moe/moe_client.h"
#include "agent/moe/moe_server.h"
#include "cm_err.h"
#include "tests/harness/p2p_testkit.h"

#define MAX_K 64

struct bench;

struct trainer {
    struct bench *b;
    struct p2p_host *h;
    struct p2p_tk_peer id;
    uint64_t fid;
};

struct bench {
    uv_loop_t loop;
    struct sockaddr_storage addr;
    uint8_t pub[CM_ED25519_PUB_LEN];
    const float *x;
    uint32_t S, C;
    int measuring, stopping;
    uint64_t samples, errors, inflight;
    int first_error;
};

static int send_one(struct trainer *t);

static void on_answer(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct trainer *t = arg;
    struct bench *b = t->b;
    (void)out, (void)c;
    b->inflight--;
    if (status != CM_OK) {
        if (!b->errors)
            b->first_error = status;
        b->errors++;
        return;
    }
    if (b->measuring)
        b->samples += n;
    if (!b->stopping && send_one(t) != CM_OK)
        b->errors++;
}

static int send_one(struct trainer *t)
{
    struct bench *b = t->b;
    int rc = moe_client_forward(t->h, (struct sockaddr *)&b->addr, b->pub, "ffn.0.0", t->fid++,
                                b->x, b->S, b->C, 30000, on_answer, t);
    if (rc == CM_OK)
        b->inflight++;
    return rc;
}

static void run_for(struct bench *b, double secs)
{
    int64_t end = p2p_now_ms() + (int64_t)(secs * 1000);
    while (p2p_now_ms() < end)
        uv_run(&b->loop, UV_RUN_ONCE);
}

static int envi(const char *name, int def)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : def;
}

/* One run; returns samples/s (negative on failure). */
static double run(const char *label, uint32_t max_batch, uint32_t wait_ms, int C, int F, int K,
                  int D, uint32_t S, double secs, double *mean_batch)
{
    struct bench b = {.S = S, .C = (uint32_t)C};
    struct p2p_tk tk;
    struct p2p_tk_peer sid;
    struct trainer tr[MAX_K];
    struct p2p_ctx *ctx = NULL;
    struct p2p_host *hs = NULL;
    struct moe_server *srv = NULL;
    float *x = malloc((size_t)S * C * sizeof(float));
    for (size_t i = 0; i < (size_t)S * C; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    b.x = x;
    uv_loop_init(&b.loop);
    if (p2p_tk_init(&tk, "moebench") || p2p_tk_peer_new(&tk, "server", "s", 3600, &sid))
        return -1;
    struct p2p_ctx_config cc = {.loop = &b.loop, .auth = p2p_tk_auth_config(&tk)};
    struct moe_server_config cfg;
    moe_server_config_default(&cfg);
    cfg.max_batch = max_batch;
    cfg.max_wait_ms = wait_ms;
    if (p2p_ctx_new(&cc, &ctx) || moe_server_new(&cfg, &b.loop, &srv) ||
        moe_server_add_expert(srv, "ffn.0.0", C, F, 1) || moe_server_start(srv))
        return -1;
    struct p2p_host_config hc = {.key = &sid.key, .token = sid.token, .listen_ip = "127.0.0.1",
                                 .on_request = moe_server_on_request, .arg = srv};
    if (p2p_host_new(ctx, &hc, &hs))
        return -1;
    char s[64];
    snprintf(s, sizeof s, "127.0.0.1:%u", p2p_host_port(hs));
    p2p_addr_parse(s, &b.addr);
    memcpy(b.pub, sid.key.pub, sizeof b.pub);
    for (int k = 0; k < K; k++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", k);
        tr[k].b = &b;
        tr[k].fid = 1;
        if (p2p_tk_peer_new(&tk, name, name, 3600, &tr[k].id))
            return -1;
        struct p2p_host_config h = {.key = &tr[k].id.key, .token = tr[k].id.token};
        if (p2p_host_new(ctx, &h, &tr[k].h))
            return -1;
        for (int d = 0; d < D; d++)
            if (send_one(&tr[k]))
                return -1;
    }
    run_for(&b, 0.5); /* warm-up: connections, sessions, caches */
    struct moe_server_stats st0, st1;
    moe_server_stats(srv, &st0);
    b.measuring = 1;
    int64_t t0 = p2p_now_ms();
    run_for(&b, secs);
    double el = (double)(p2p_now_ms() - t0) / 1000.0;
    b.measuring = 0;
    moe_server_stats(srv, &st1);
    b.stopping = 1;
    int64_t drain = p2p_now_ms() + 30000;
    while (b.inflight && p2p_now_ms() < drain)
        uv_run(&b.loop, UV_RUN_ONCE);
    double sps = (double)b.samples / el;
    uint64_t nb = st1.batches - st0.batches;
    *mean_batch = nb ? (double)(st1.samples - st0.samples) / (double)nb : 0;
    printf("  %-9s max_batch %3u, wait %u ms: %8.0f samples/s, %6.1f samples per batch, "
           "%llu errors\n",
           label, max_batch, wait_ms, sps, *mean_batch, (unsigned long long)b.errors);
    if (b.errors)
        printf("  first error: %s\n", cm_err_name(b.first_error));
    moe_server_stop(srv);
    p2p_host_close(hs);
    for (int k = 0; k < K; k++)
        p2p_host_close(tr[k].h);
    moe_server_free(srv);
    p2p_ctx_free(ctx);
    uv_run(&b.loop, UV_RUN_DEFAULT);
    uv_loop_close(&b.loop);
    for (int k = 0; k < K; k++)
        p2p_tk_peer_cleanup(&tr[k].id);
    p2p_tk_peer_cleanup(&sid);
    p2p_tk_cleanup(&tk);
    free(x);
    return b.errors ? -1 : sps;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    if (secs <= 0)
        secs = 3.0;
    int C = envi("MOE_BENCH_C", 512), F = envi("MOE_BENCH_F", 2048);
    int K = envi("MOE_BENCH_K", 8), D = envi("MOE_BENCH_D", 4);
    uint32_t S = (uint32_t)envi("MOE_BENCH_S", 1);
    if (K > MAX_K || (uint64_t)S * C > MOE_MAX_VALUES || S > 256) {
        fprintf(stderr, "bench_moe_server: K <= %d, S <= 256 and S*C <= %u\n", MAX_K,
                MOE_MAX_VALUES);
        return 2;
    }
    printf("expert server, forward, block C=%d F=%d, %d trainers x %d requests in flight of %u "
           "sample(s), %.1f s per run\n",
           C, F, K, D, S, secs);
    double mb1, mb2;
    double a = run("batched", 256, 2, C, F, K, D, S, secs, &mb1);
    double u = run("unbatched", S, 0, C, F, K, D, S, secs, &mb2);
    if (a <= 0 || u <= 0) {
        printf("bench_moe_server: FAILED\n");
        return 1;
    }
    printf("  batching speed-up: %.2fx (batched / one request per batch)\n", a / u);
    return 0;
}
