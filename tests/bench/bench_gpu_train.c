/* Times one training step of the two example recipes on the GPU, in bf16,
 * and reports tokens/s and model FLOPs utilisation (MFU):
 *   bench_gpu_train gpt2-small|albert-large [MICRO_BATCH [STEPS]] [--cpu]
 * gpt2-small has the shapes of examples/gpt2-small.json (AdamW), micro batch
 * 8 by default; albert-large those of examples/albert-large.json (LAMB,
 * masked-LM targets from kern_mlm_mask), micro batch 16. Random tokens;
 * 3 warm-up steps, then STEPS (10) timed steps of zero_grad + forward and
 * backward + optimizer step, the clock read after be->sync() at both ends.
 *
 * The reference measured in the same run (the bench rule) is the backend's
 * own matmul_fwd on one large square product: "of matmul peak" is the step's
 * model TFLOP/s over it. MFU is against BENCH_PEAK_TFLOPS (default 989.4,
 * the H100/H200 SXM dense bf16 datasheet figure). tests/bench/bench_gpu.sh
 * adds PyTorch's step for GPT-2 small (bench_gpu_torch.py) and the ratio.
 *
 * Without a usable GPU it prints "SKIP: <reason>" and exits 77. --cpu runs
 * the same harness on the CPU backend in fp32 (micro batch 1, 1 step and 1
 * warm-up by default, a 2048 product as the reference), to check the
 * harness on a machine without a GPU; its MFU is against the given peak
 * only and means nothing for a CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "kern_model.h"
#include "kern_optim.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "bench_gpu_train: %s failed: %s\n", what, cm_strerror(rc));
    return 1;
}

/* Model FLOPs per token of a training step, as kern_tfm.c computes it:
 *   training = 3 x forward (backward costs two products per forward one);
 *   forward  = 2 x (sum over every matrix product applied of in x out)
 *              + 2 x 2 x T x C per layer for attention (QK^T and AV over the
 *              full T x T matrix, which our kernel computes even when causal).
 * Products per layer application: qkv C->3C, attention projection C->C, MLP
 * C->F and F->C; ALBERT's shared block counts once per application (L
 * times). Heads: GPT's tied LM head C->V; ALBERT's embedding projection
 * E->C, MLM dense C->E and decoder E->V (on every position, as computed).
 * Elementwise ops (LayerNorm, GELU, softmax, embedding, loss, optimizer)
 * are not counted. mm and att receive the forward's two parts. */
static double train_flops_per_token(const struct kern_tfm_config *c, double *mm, double *att)
{
    double C = c->d_model, E = c->d_embed, F = c->d_ff, V = c->vocab;
    double T = c->max_T, L = c->n_layer;
    double macs = L * (3 * C * C + C * C + C * F + F * C);
    if (c->kind == KERN_MODEL_ALBERT)
        macs += E * C + C * E + E * V;
    else
        macs += C * V;
    *mm = 2 * macs;
    *att = 2 * 2 * T * C * L;
    return 3 * (*mm + *att);
}

/* The reference: out (n,n) = inp (n,n) @ w^T (n,n) through be->matmul_fwd on
 * random data, best of `rounds` rounds of `reps` products, in TFLOP/s. */
static int matmul_peak(const struct kern_backend *be, int n, int rounds, int reps, double *tflops)
{
    size_t nn = (size_t)n * n;
    float *host = malloc(nn * sizeof(float)), *a = NULL, *w = NULL, *o = NULL;
    uint64_t rng = 7;
    int rc = CM_ENOMEM;
    if (!host)
        return rc;
    for (size_t i = 0; i < nn; i++)
        host[i] = 2.0f * kern_rng_uniform(&rng) - 1.0f;
    if ((rc = be->alloc(nn * sizeof(float), (void **)&a)) ||
        (rc = be->alloc(nn * sizeof(float), (void **)&w)) ||
        (rc = be->alloc(nn * sizeof(float), (void **)&o)) ||
        (rc = be->upload(a, host, nn * sizeof(float))) ||
        (rc = be->upload(w, host, nn * sizeof(float))))
        goto out;
    double best = 1e30;
    for (int r = 0; r <= rounds && !rc; r++) { /* round 0 warms up */
        if ((rc = be->sync()))
            break;
        double t0 = now_s();
        for (int i = 0; i < reps; i++)
            be->matmul_fwd(o, a, w, NULL, n, n, n);
        if ((rc = be->sync()))
            break;
        double dt = (now_s() - t0) / reps;
        if (r > 0 && dt < best)
            best = dt;
    }
    *tflops = 2.0 * n * n * (double)n / best / 1e12;
out:
    be->release(a);
    be->release(w);
    be->release(o);
    free(host);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int use_cpu = 0, npos = 0, pos[2] = {0, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu"))
            use_cpu = 1;
        else if (!model)
            model = argv[i];
        else if (npos < 2 && atoi(argv[i]) > 0)
            pos[npos++] = atoi(argv[i]);
        else
            model = NULL, i = argc; /* a bad argument: usage below */
    }
    int is_gpt = model && !strcmp(model, "gpt2-small");
    if (!model || (!is_gpt && strcmp(model, "albert-large"))) {
        fprintf(stderr, "usage: bench_gpu_train gpt2-small|albert-large [MICRO_BATCH [STEPS]] "
                        "[--cpu]\n");
        return 2;
    }
    /* examples/gpt2-small.json, examples/albert-large.json */
    struct kern_tfm_config c = {.kind = KERN_MODEL_GPT, .vocab = 50257, .max_T = 1024,
                                .n_layer = 12, .n_head = 12, .d_model = 768, .d_embed = 768,
                                .d_ff = 3072};
    if (!is_gpt)
        c = (struct kern_tfm_config){.kind = KERN_MODEL_ALBERT, .vocab = 30001, .max_T = 512,
                                     .n_layer = 24, .n_head = 16, .d_model = 1024,
                                     .d_embed = 128, .d_ff = 4096, .share_layers = 1};
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.clip_norm = 1.0f;
    if (is_gpt) {
        oc.kind = KERN_OPT_ADAMW;
        oc.lr = 6e-4f;
        oc.beta2 = 0.95f;
        oc.weight_decay = 0.1f;
    } else {
        oc.kind = KERN_OPT_LAMB;
        oc.lr = 1.76e-3f;
        oc.weight_decay = 0.01f;
    }
    int B = npos > 0 ? pos[0] : use_cpu ? 1 : is_gpt ? 8 : 16;
    int steps = npos > 1 ? pos[1] : use_cpu ? 1 : 10, warmup = use_cpu ? 1 : 3;
    double peak = 989.4;
    const char *env = getenv("BENCH_PEAK_TFLOPS");
    if (env && (peak = atof(env)) <= 0) {
        fprintf(stderr, "bench_gpu_train: BENCH_PEAK_TFLOPS=%s is not a positive number\n", env);
        return 2;
    }

    struct kern_mem_need need;
    kern_tfm_mem_need(&c, B, &need);
    kern_optim_mem_need(&oc, kern_tfm_param_count(&c), &need);
    const struct kern_backend *be = kern_backend_cpu();
    char why[512] = "cpu backend (--cpu)";
    int rc;
    if (!use_cpu) {
        rc = kern_backend_pick_for("cuda", &need, &be, why, sizeof why);
        if (rc == CM_EUNSUPPORTED || rc == CM_EDEVICE || rc == CM_ENOMEM) {
            printf("SKIP: %s%s\n", why, rc == CM_ENOMEM ? " (try a smaller MICRO_BATCH)" : "");
            return 77;
        }
        if (rc)
            return fail(why, rc);
    }
    const char *prec = use_cpu ? "fp32" : "bf16";
    if ((rc = be->set_precision(prec)))
        return fail("set_precision", rc);
    struct kern_gpu_facts facts;
    struct kern_cuda_build build;
    int real = 0;
    char err[160];
    if (!use_cpu && kern_gpu_facts_gather(&facts, &build, &real, err, sizeof err) == CM_OK)
        printf("device %s (sm_%d%d, %.1f GiB), products in %s\n", facts.name, facts.cc_major,
               facts.cc_minor, facts.mem_total / 1073741824.0,
               kern_gpu_precision(10 * facts.cc_major + facts.cc_minor, prec));
    printf("backend %s: %s\n", be->name, why);

    double mm_peak = 0;
    int pn = use_cpu ? 2048 : 8192;
    if ((rc = matmul_peak(be, pn, use_cpu ? 1 : 3, use_cpu ? 2 : 10, &mm_peak)))
        return fail("matmul_fwd reference", rc);
    printf("reference matmul_fwd %dx%dx%d (%s): %.3f TFLOP/s\n", pn, pn, pn, prec, mm_peak);

    struct kern_model *m = NULL;
    struct kern_optim *o = NULL;
    if ((rc = kern_tfm_new(be, &c, B, 1, &m)))
        return fail("kern_tfm_new", rc);
    if ((rc = kern_optim_new(be, &oc, m->nparams, &o)))
        return fail("kern_optim_new", rc);
    size_t N = (size_t)B * c.max_T;
    int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    if (!tok || !tgt)
        return fail("malloc", CM_ENOMEM);
    uint64_t rng = 42;
    int V_real = is_gpt ? c.vocab : c.vocab - 1; /* ALBERT: the last id is [MASK] */
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int)(kern_rng_u64(&rng) % (uint64_t)V_real);
        tgt[i] = (int)(kern_rng_u64(&rng) % (uint64_t)V_real);
    }
    if (!is_gpt) /* mask_prob 0.15 as in the example; targets -1 elsewhere */
        kern_mlm_mask(tok, tgt, N, 0.15f, c.vocab - 1, V_real, &rng);
    struct kern_batch b = {.B = B, .T = c.max_T, .tokens = tok, .targets = tgt};

    double t0 = 0, t1;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            if ((rc = be->sync()))
                return fail("sync before the timed steps", rc);
            t0 = now_s();
        }
        kern_model_zero_grad(m);
        if ((rc = kern_model_fwd_bwd(m, &b, 1.0f, NULL)))
            return fail("kern_model_fwd_bwd", rc);
        if ((rc = kern_optim_step(o, m, NULL, NULL)))
            return fail("kern_optim_step", rc);
    }
    if ((rc = be->sync()))
        return fail("sync after the timed steps", rc);
    t1 = now_s();

    double mm, att, fpt = train_flops_per_token(&c, &mm, &att);
    double sec = (t1 - t0) / steps, tps = (double)N / sec, tflops = fpt * tps / 1e12;
    printf("model %s: params %zu, micro batch %d x T %d = %zu tokens/step, optimizer %s\n", model,
           m->nparams, B, c.max_T, N, is_gpt ? "adamw" : "lamb");
    printf("model_flops_per_token %.0f = 3 x forward (%.0f matmul + %.0f attention)\n", fpt, mm,
           att);
    if (is_gpt) {
        const struct kern_tensor *wpe = kern_model_tensor(m, "wpe");
        double Np = (double)m->nparams - (wpe ? (double)wpe->numel : 0);
        double palm = 6 * Np + 12.0 * c.n_layer * c.d_model * c.max_T;
        printf("palm_flops_per_token %.0f = 6N + 12 L C T (N = %.0f params without wpe), "
               "%.3f x ours\n", palm, Np, palm / fpt);
    }
    printf("memory need %.2f GiB (params %.2f, grads %.2f, optimizer %.2f, activations %.2f, "
           "scratch %.2f, reserve %.2f)\n", kern_mem_need_total(&need) / 1073741824.0,
           need.params / 1073741824.0, need.grads / 1073741824.0, need.optim / 1073741824.0,
           need.act / 1073741824.0, need.scratch / 1073741824.0, need.reserve / 1073741824.0);
    if (!use_cpu && kern_gpu_facts_gather(&facts, &build, &real, err, sizeof err) == CM_OK &&
        !facts.fake)
        printf("device memory in use after the steps (total - free): %.2f GiB\n",
               (facts.mem_total - facts.mem_free) / 1073741824.0);
    printf("steps %d (after %d warm-up)\n", steps, warmup);
    printf("ms_per_step %.3f\n", sec * 1e3);
    printf("tokens_per_s %.1f\n", tps);
    printf("model_tflops %.3f\n", tflops);
    printf("mfu %.1f %% of %.1f TFLOP/s (BENCH_PEAK_TFLOPS)\n", 100 * tflops / peak, peak);
    printf("of_matmul_peak %.1f %% of %.3f TFLOP/s measured above\n", 100 * tflops / mm_peak,
           mm_peak);
    kern_optim_free(o);
    kern_model_free(m);
    free(tok);
    free(tgt);
    return 0;
}
