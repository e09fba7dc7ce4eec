/* Times our CPU training step (forward, backward, AdamW) on random data:
 *   bench_train_step mlp|gpt|albert THREADS STEPS
 * prints "ms_per_step <float>". The models and batch sizes are the ones
 * tests/bench/bench_train_torch.py builds in PyTorch, so the two numbers are
 * comparable (tests/bench/bench_train.sh prints the ratio). */
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

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_train_step mlp|gpt|albert THREADS STEPS\n");
        return 2;
    }
    int threads = atoi(argv[2]), steps = atoi(argv[3]);
    kern_cpu_set_threads(threads);
    const struct kern_backend *be = kern_backend_cpu();
    struct kern_model *m = NULL;
    struct kern_batch b = {0};
    uint64_t rng = 42;
    int rc;
    float *x = NULL;
    int *y = NULL, *tok = NULL, *seg = NULL, *sop = NULL;
    if (!strcmp(argv[1], "mlp")) {
        /* 784-256-128-10, batch 128 (examples/fmnist-mlp.json) */
        struct kern_mlp_config c = {.in_dim = 784, .nhidden = 2, .hidden = {256, 128}, .nclass = 10};
        rc = kern_mlp_new(be, &c, 128, 1, &m);
        x = malloc(sizeof(float) * 128 * 784);
        y = malloc(sizeof(int) * 128);
        if (rc || !x || !y)
            return 1;
        for (int i = 0; i < 128 * 784; i++)
            x[i] = kern_rng_normal(&rng);
        for (int i = 0; i < 128; i++)
            y[i] = (int)(kern_rng_u64(&rng) % 10);
        b = (struct kern_batch){.B = 128, .x = x, .targets = y};
    } else if (!strcmp(argv[1], "albert")) {
        /* examples/albert-tiny-brown.json: V 8000, T 128, 4 shared post-LN layers, C 256,
           E 64, F 1024, segment embeddings and the sentence-order head, batch 16 (one
           micro-batch); masked-LM targets on 15 % of the positions, a pair label each */
        struct kern_tfm_config c = {.kind = KERN_MODEL_ALBERT, .vocab = 8000, .max_T = 128,
                                    .n_layer = 4, .n_head = 4, .d_model = 256, .d_embed = 64,
                                    .d_ff = 1024, .share_layers = 1, .post_ln = 1, .sop = 1};
        rc = kern_tfm_new(be, &c, 16, 1, &m);
        tok = malloc(sizeof(int) * 16 * 128);
        y = malloc(sizeof(int) * 16 * 128);
        seg = malloc(sizeof(int) * 16 * 128);
        sop = malloc(sizeof(int) * 16);
        if (rc || !tok || !y || !seg || !sop)
            return 1;
        for (int i = 0; i < 16 * 128; i++) {
            tok[i] = (int)(kern_rng_u64(&rng) % 8000);
            y[i] = kern_rng_u64(&rng) % 100 < 15 ? (int)(kern_rng_u64(&rng) % 8000) : -1;
            seg[i] = i % 128 >= 64;
        }
        for (int i = 0; i < 16; i++)
            sop[i] = i % 2;
        b = (struct kern_batch){.B = 16, .T = 128, .tokens = tok, .targets = y, .segments = seg, .sop = sop};
    } else {
        /* examples/tiny-gpt-bytes.json: V 256, T 64, L 2, C 128, batch 32 */
        struct kern_tfm_config c = {.kind = KERN_MODEL_GPT, .vocab = 256, .max_T = 64,
                                    .n_layer = 2, .n_head = 4, .d_model = 128, .d_embed = 128,
                                    .d_ff = 512};
        rc = kern_tfm_new(be, &c, 32, 1, &m);
        tok = malloc(sizeof(int) * 32 * 64);
        y = malloc(sizeof(int) * 32 * 64);
        if (rc || !tok || !y)
            return 1;
        for (int i = 0; i < 32 * 64; i++) {
            tok[i] = (int)(kern_rng_u64(&rng) % 256);
            y[i] = (int)(kern_rng_u64(&rng) % 256);
        }
        b = (struct kern_batch){.B = 32, .T = 64, .tokens = tok, .targets = y};
    }
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    struct kern_optim *o = NULL;
    if (kern_optim_new(be, &oc, m->nparams, &o))
        return 1;
    double t0 = 0;
    for (int s = 0; s < steps + 3; s++) {
        if (s == 3)
            t0 = now_s(); /* 3 warm-up steps */
        kern_model_zero_grad(m);
        if (kern_model_fwd_bwd(m, &b, 1.0f, NULL) || kern_optim_step(o, m, NULL, NULL))
            return 1;
    }
    printf("ms_per_step %.3f\n", (now_s() - t0) / steps * 1e3);
    kern_optim_free(o);
    kern_model_free(m);
    free(x);
    free(y);
    free(tok);
    free(seg);
    free(sop);
    return 0;
}
