/* Whether a GPU is used, without a GPU: the pure check of kernels/kern_gpu.c
 * on every branch (no CUDA in the build, no driver, a driver older than the
 * runtime, no device, a capability the build has no code for, a device
 * reached only through PTX with a driver too old to compile it, a kernel
 * image that does not load, too little memory, and the GPU accepted), the
 * compatibility rules, the CROWDTRAIN_FAKE_GPU parser, the precision a
 * device runs, and the memory estimate against the bytes the models and
 * optimizers really allocate.
 *
 * Then the same decisions through the real selection path with facts from
 * CROWDTRAIN_FAKE_GPU: kern_backend_pick_for and the `train --local`
 * command under --device auto fall back to the CPU with exactly one line
 * saying why, and under --device cuda fail with that line. In a build
 * without CUDA those paths can only say "this build has no CUDA backend",
 * and the test checks that instead, saying so. On a real GPU (make
 * test-gpu, CT_TEST_REQUIRE_GPU=1) the real facts must select CUDA for a
 * small model and refuse an impossible one for its memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/commands.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "kern_backend.h"
#include "kern_gpu.h"
#include "kern_model.h"
#include "kern_optim.h"

#define GIB ((size_t)1 << 30)

static struct kern_cuda_build default_build(void)
{
    struct kern_cuda_build b;
    assert_int_equal(kern_cuda_build_parse("75 80 86 89 90", 90, 13000, &b), CM_OK);
    return b;
}

static struct kern_gpu_facts gpu(const char *name, int major, int minor, size_t total,
                                 size_t free_b, int driver)
{
    struct kern_gpu_facts f;
    memset(&f, 0, sizeof f);
    snprintf(f.name, sizeof f.name, "%s", name);
    f.ndev = 1;
    f.cc_major = major;
    f.cc_minor = minor;
    f.mem_total = total;
    f.mem_free = free_b;
    f.driver = driver;
    f.runtime = 13000;
    f.image = -1;
    return f;
}

static void expect(const struct kern_gpu_facts *f, const struct kern_cuda_build *b,
                   const struct kern_mem_need *need, int want_rc, const char *want_msg)
{
    char msg[512];
    int rc = kern_gpu_check(f, b, need, msg, sizeof msg);
    print_message("  [%s] -> %d: %s\n", f->name, rc, msg);
    if (rc != want_rc || !strstr(msg, want_msg)) {
        print_error("got %d '%s', expected %d with '%s'\n", rc, msg, want_rc, want_msg);
        fail();
    }
    assert_null(strchr(msg, '\n'));
}

static void test_arch_rules(void **state)
{
    (void)state;
    struct kern_cuda_build b = default_build();
    static const struct { int cc, runs, via_ptx; } t[] = {
        {50, 0, 0}, {61, 0, 0}, {70, 0, 0}, {72, 0, 0}, /* Pascal, V100, Xavier: none */
        {75, 1, 0},                                     /* T4, RTX 20 */
        {80, 1, 0}, {86, 1, 0}, {87, 1, 0},             /* A100, RTX 30, Orin (sm_86 SASS) */
        {89, 1, 0}, {90, 1, 0},                         /* RTX 40 / L4, H100 */
        {100, 1, 1}, {120, 1, 1},                       /* Blackwell: the PTX */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int via = -1, runs = kern_gpu_arch_runs(&b, t[i].cc, &via);
        if (runs != t[i].runs || via != t[i].via_ptx) {
            print_error("cc %d: runs %d via_ptx %d\n", t[i].cc, runs, via);
            fail();
        }
    }
    /* SASS alone never crosses a major: sm_80 code does not run on 9.0 */
    struct kern_cuda_build s;
    assert_int_equal(kern_cuda_build_parse("80", 0, 13000, &s), CM_OK);
    int via;
    assert_int_equal(kern_gpu_arch_runs(&s, 89, &via), 1);
    assert_int_equal(kern_gpu_arch_runs(&s, 90, &via), 0);
    assert_int_equal(kern_gpu_arch_runs(&s, 75, &via), 0);
    /* the parser sorts, and refuses junk */
    assert_int_equal(kern_cuda_build_parse(" 90 70  80", 90, 12040, &s), CM_OK);
    assert_int_equal(s.nsass, 3);
    assert_int_equal(s.sass[0], 70);
    assert_int_equal(s.sass[2], 90);
    assert_int_equal(s.have, 1);
    assert_int_equal(kern_cuda_build_parse("sm_90", 90, 13000, &s), CM_EINVAL);
    assert_int_equal(kern_cuda_build_parse("90,80", 90, 13000, &s), CM_EINVAL);
    assert_int_equal(kern_cuda_build_parse("", 0, 13000, &s), CM_EINVAL);
    assert_int_equal(kern_cuda_build_parse("", 90, 13000, &s), CM_OK); /* PTX only */
}

static void test_check_branches(void **state)
{
    (void)state;
    struct kern_cuda_build b = default_build(), none;
    memset(&none, 0, sizeof none);
    struct kern_mem_need small = {1 << 20, 1 << 20, 2 << 20, 8 << 20, 1 << 20, KERN_GPU_RESERVE};
    struct kern_gpu_facts f;

    f = gpu("NVIDIA H100 80GB HBM3", 9, 0, 80 * GIB, 79 * GIB, 13000);
    expect(&f, &none, &small, CM_EUNSUPPORTED, "cuda: this build has no CUDA backend");

    memset(&f, 0, sizeof f);
    snprintf(f.error, sizeof f.error, "libcuda.so.1 not found");
    f.runtime = 13000;
    expect(&f, &b, &small, CM_EDEVICE, "cuda: no NVIDIA driver found (libcuda.so.1 not found)");

    f = gpu("Tesla T4", 7, 5, 16 * GIB, 15 * GIB, 12020);
    expect(&f, &b, &small, CM_EDEVICE,
           "cuda: the NVIDIA driver supports CUDA 12.2; this build's CUDA 13.0 runtime needs a "
           "driver for CUDA 13 (driver 580 or newer)");
    /* a driver of the same major but an older minor is fine for SASS
     * (minor version compatibility) */
    f = gpu("Tesla T4", 7, 5, 16 * GIB, 15 * GIB, 13000);
    f.runtime = 13010;
    expect(&f, &b, &small, CM_OK, "cuda: Tesla T4 (sm_75,");

    memset(&f, 0, sizeof f);
    f.driver = f.runtime = 13000;
    snprintf(f.error, sizeof f.error, "no CUDA-capable device is detected");
    expect(&f, &b, &small, CM_EDEVICE, "cuda: no GPU found (no CUDA-capable device is detected)");

    f = gpu("NVIDIA GeForce GTX 1080", 6, 1, 8 * GIB, 8 * GIB, 13000);
    expect(&f, &b, &small, CM_EDEVICE,
           "cuda: NVIDIA GeForce GTX 1080 is sm_61; this build runs sm_75 and newer");
    f = gpu("Tesla V100-SXM2-16GB", 7, 0, 16 * GIB, 16 * GIB, 13000);
    expect(&f, &b, &small, CM_EDEVICE, "is sm_70; this build runs sm_75 and newer");
    /* a build without PTX, between its architectures: the list is named */
    struct kern_cuda_build gap;
    assert_int_equal(kern_cuda_build_parse("75 90", 0, 13000, &gap), CM_OK);
    f = gpu("NVIDIA A100-SXM4-40GB", 8, 0, 40 * GIB, 39 * GIB, 13000);
    expect(&f, &gap, &small, CM_EDEVICE, "is sm_80; this build has code for sm_75, sm_90 only");

    /* Blackwell through the PTX: fine with a new driver, refused with one
     * older than the nvcc that wrote the PTX */
    f = gpu("NVIDIA GeForce RTX 5090", 12, 0, 32 * GIB, 31 * GIB, 13000);
    expect(&f, &b, &small, CM_OK, "sm_120 through the PTX");
    b.toolkit = 13020;
    f.runtime = 13020;
    expect(&f, &b, &small, CM_EDEVICE,
           "which this build reaches only through its compute_90 PTX from CUDA 13.2, and the "
           "driver (CUDA 13.0) is too old to compile it: it needs a driver for CUDA 13.2 or newer");
    /* the same old driver is fine for a device that has SASS */
    f = gpu("NVIDIA GeForce RTX 4090", 8, 9, 24 * GIB, 23 * GIB, 13000);
    f.runtime = 13020;
    expect(&f, &b, &small, CM_OK, "(sm_89, 23.0 GiB free of 24.0 GiB, driver CUDA 13.0)");
    b = default_build();

    f = gpu("NVIDIA GeForce RTX 3060", 8, 6, 12 * GIB, 11 * GIB, 13000);
    f.image = 0;
    expect(&f, &b, &small, CM_EDEVICE, "none of this build's GPU code loads on it");

    struct kern_mem_need big = {GIB, GIB, 2 * GIB, 5 * GIB, GIB / 2, KERN_GPU_RESERVE};
    f = gpu("NVIDIA GeForce RTX 3060", 8, 6, 12 * GIB, 9 * GIB, 13000);
    expect(&f, &b, &big, CM_ENOMEM,
           "cuda: NVIDIA GeForce RTX 3060 has 9.0 GiB free of 12.0 GiB; this model needs about "
           "10.0 GiB (parameters 1.00 + gradients 1.00 + optimizer 2.00 + activations 5.00 + "
           "scratch 0.50 + reserve 0.50)");
    f.mem_free = 10 * GIB;
    expect(&f, &b, &big, CM_OK, "the model needs about 10.00 GiB");
    f.mem_free = 10 * GIB - 1;
    expect(&f, &b, &big, CM_ENOMEM, "needs about 10.0 GiB");
    /* without a need, memory is not checked */
    f.mem_free = 0;
    expect(&f, &b, NULL, CM_OK, "cuda: NVIDIA GeForce RTX 3060 (sm_86,");
    f.image = 1;
    f.mem_free = 11 * GIB;
    expect(&f, &b, &small, CM_OK, "cuda: NVIDIA GeForce RTX 3060 (sm_86, 11.0 GiB free");
}

static void test_precision(void **state)
{
    (void)state;
    assert_string_equal(kern_gpu_precision(75, "bf16"), "fp32");
    assert_string_equal(kern_gpu_precision(75, "tf32"), "fp32");
    assert_string_equal(kern_gpu_precision(75, "fp16"), "fp16");
    assert_string_equal(kern_gpu_precision(70, "fp32"), "fp32");
    assert_string_equal(kern_gpu_precision(80, "bf16"), "bf16");
    assert_string_equal(kern_gpu_precision(86, "tf32"), "tf32");
    assert_string_equal(kern_gpu_precision(120, "bf16"), "bf16");
}

static void test_fake_parse(void **state)
{
    (void)state;
    struct kern_gpu_facts f;
    char err[256] = "";
    assert_int_equal(kern_gpu_facts_parse("GeForce GTX 1080,cc=6.1,mem=8G,driver=12.2", 13000,
                                          &f, err, sizeof err),
                     CM_OK);
    assert_string_equal(f.name, "GeForce GTX 1080");
    assert_int_equal(f.cc_major, 6);
    assert_int_equal(f.cc_minor, 1);
    assert_int_equal(f.mem_total, 8 * GIB);
    assert_int_equal(f.mem_free, 8 * GIB);
    assert_int_equal(f.driver, 12020);
    assert_int_equal(f.runtime, 13000);
    assert_int_equal(f.ndev, 1);
    assert_int_equal(f.fake, 1);
    assert_int_equal(f.image, -1);
    assert_int_equal(kern_gpu_facts_parse("X,mem=1.5G,free=512M,cc=8.9,runtime=12.8", 13000, &f,
                                          err, sizeof err),
                     CM_OK);
    assert_int_equal(f.mem_total, 3 * GIB / 2);
    assert_int_equal(f.mem_free, (size_t)512 << 20);
    assert_int_equal(f.driver, 13000);
    assert_int_equal(f.runtime, 12080);
    assert_int_equal(kern_gpu_facts_parse("none", 13000, &f, err, sizeof err), CM_OK);
    assert_int_equal(f.ndev, 0);
    assert_int_equal(f.driver, 13000);
    assert_int_equal(kern_gpu_facts_parse("nodriver", 13000, &f, err, sizeof err), CM_OK);
    assert_int_equal(f.driver, 0);
    static const char *bad[] = {
        "", ",cc=8.0,mem=1G", "X", "X,cc=8.0", "X,mem=1G", "X,cc=8,mem=1G", "X,cc=8.10,mem=1G",
        "X,cc=8.0,mem=1Q", "X,cc=8.0,mem=-1G", "X,cc=8.0,mem=1G,free=2G", "X,cc=8.0,mem=1G,gpu=1",
        "X,cc=8.0,mem=1G,driver=12", "X,cc=8.0,mem=1G,", "X,cc=8.0 ,mem=1G",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (kern_gpu_facts_parse(bad[i], 13000, &f, err, sizeof err) != CM_EINVAL ||
            !strstr(err, "CROWDTRAIN_FAKE_GPU")) {
            print_error("'%s' was accepted (err '%s')\n", bad[i], err);
            fail();
        }
    }
}

/* ---- the estimate against the real allocations ---- */

static size_t g_alloc_bytes;
static struct kern_backend g_counting;

static int counting_alloc(size_t bytes, void **out)
{
    g_alloc_bytes += bytes;
    return kern_backend_cpu()->alloc(bytes, out);
}

static void check_estimate(const char *what, enum kern_opt_kind opt, struct kern_model *m,
                           const struct kern_mem_need *n_in)
{
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.kind = opt;
    oc.total_steps = 10;
    struct kern_mem_need n = *n_in;
    kern_optim_mem_need(&oc, m->nparams, &n);
    struct kern_optim *o = NULL;
    assert_int_equal(kern_optim_new(&g_counting, &oc, m->nparams, &o), CM_OK);
    size_t counted = g_alloc_bytes;
    size_t est = n.params + n.grads + n.optim + n.act;
    print_message("  %s: allocated %zu bytes, estimated %zu (+ scratch %zu + reserve %zu)\n", what,
                  counted, est, n.scratch, n.reserve);
    assert_int_equal(n.params, m->nparams * sizeof(float));
    assert_int_equal(est, counted);
    assert_true(n.scratch > 0);
    assert_int_equal(n.reserve, KERN_GPU_RESERVE);
    kern_optim_free(o);
}

static void test_mem_need_matches_allocations(void **state)
{
    (void)state;
    g_counting = *kern_backend_cpu();
    g_counting.alloc = counting_alloc;
    struct kern_model *m = NULL;
    struct kern_mem_need n;

    struct kern_mlp_config mc = {.in_dim = 784, .nhidden = 2, .hidden = {256, 1000}, .nclass = 10};
    g_alloc_bytes = 0;
    assert_int_equal(kern_mlp_new(&g_counting, &mc, 64, 1, &m), CM_OK);
    kern_mlp_mem_need(&mc, 64, &n);
    check_estimate("mlp, adamw", KERN_OPT_ADAMW, m, &n);
    kern_model_free(m);

    struct kern_tfm_config gc = {.kind = KERN_MODEL_GPT, .vocab = 257, .max_T = 16, .n_layer = 2,
                                 .n_head = 2, .d_model = 32, .d_embed = 32, .d_ff = 64};
    g_alloc_bytes = 0;
    assert_int_equal(kern_tfm_new(&g_counting, &gc, 3, 1, &m), CM_OK);
    kern_tfm_mem_need(&gc, 3, &n);
    check_estimate("gpt, adamw", KERN_OPT_ADAMW, m, &n);
    kern_model_free(m);

    struct kern_tfm_config ac = {.kind = KERN_MODEL_ALBERT, .vocab = 300, .max_T = 12,
                                 .n_layer = 3, .n_head = 4, .d_model = 32, .d_embed = 16,
                                 .d_ff = 48, .share_layers = 1};
    g_alloc_bytes = 0;
    assert_int_equal(kern_tfm_new(&g_counting, &ac, 5, 1, &m), CM_OK);
    kern_tfm_mem_need(&ac, 5, &n);
    check_estimate("albert shared, lamb", KERN_OPT_LAMB, m, &n);
    kern_model_free(m);

    /* ALBERT as published: post-LN, segment embeddings, sentence-order head */
    ac.post_ln = ac.sop = 1;
    g_alloc_bytes = 0;
    assert_int_equal(kern_tfm_new(&g_counting, &ac, 5, 1, &m), CM_OK);
    kern_tfm_mem_need(&ac, 5, &n);
    check_estimate("albert post-LN + SOP, lamb", KERN_OPT_LAMB, m, &n);
    assert_int_equal(m->nparams, kern_tfm_param_count(&ac));
    kern_model_free(m);

    /* the example recipes (examples/gpt2-small.json, micro-batch 16 x 1024
     * tokens, AdamW; examples/albert-large.json, micro-batch 8 x 512, LAMB),
     * for the docs: the estimate only, nothing allocated */
    struct kern_tfm_config g2 = {.kind = KERN_MODEL_GPT, .vocab = 50257, .max_T = 1024,
                                 .n_layer = 12, .n_head = 12, .d_model = 768, .d_embed = 768,
                                 .d_ff = 3072};
    struct kern_tfm_config al = {.kind = KERN_MODEL_ALBERT, .vocab = 30001, .max_T = 512,
                                 .n_layer = 24, .n_head = 16, .d_model = 1024, .d_embed = 128,
                                 .d_ff = 4096, .share_layers = 1};
    struct kern_mem_need n2;
    kern_tfm_mem_need(&al, 8, &n2);
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.kind = KERN_OPT_LAMB;
    kern_optim_mem_need(&oc, n2.params / sizeof(float), &n2);
    kern_tfm_mem_need(&g2, 16, &n);
    oc.kind = KERN_OPT_ADAMW;
    kern_optim_mem_need(&oc, n.params / sizeof(float), &n);
    const struct kern_mem_need *ns[] = {&n, &n2};
    const char *names[] = {"gpt-2 small, micro-batch 16", "albert-large, micro-batch 8"};
    for (int i = 0; i < 2; i++)
        print_message("  %s: %.2f GiB (params %.2f grads %.2f optim %.2f act %.2f scratch %.2f "
                      "reserve %.2f)\n",
                      names[i], kern_mem_need_total(ns[i]) / (double)GIB,
                      ns[i]->params / (double)GIB, ns[i]->grads / (double)GIB,
                      ns[i]->optim / (double)GIB, ns[i]->act / (double)GIB,
                      ns[i]->scratch / (double)GIB, ns[i]->reserve / (double)GIB);
    assert_int_equal(n.params, (size_t)124439808 * 4);
}

/* ---- the selection path with faked facts ---- */

/* Runs fn with stdout and stderr going to files; returns their text
 * (static buffers) in *out and *err. */
static char g_out[16384], g_err[16384];

static void slurp(int fd, char *buf, size_t cap)
{
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
}

struct captured {
    int saved1, saved2, fd1, fd2;
};

static void capture_begin(struct captured *c)
{
    char p1[] = "/tmp/ct-gpu-out-XXXXXX", p2[] = "/tmp/ct-gpu-err-XXXXXX";
    fflush(stdout);
    fflush(stderr);
    c->fd1 = mkstemp(p1);
    c->fd2 = mkstemp(p2);
    assert_true(c->fd1 >= 0 && c->fd2 >= 0);
    unlink(p1);
    unlink(p2);
    c->saved1 = dup(1);
    c->saved2 = dup(2);
    dup2(c->fd1, 1);
    dup2(c->fd2, 2);
}

static void capture_end(struct captured *c)
{
    fflush(stdout);
    fflush(stderr);
    dup2(c->saved1, 1);
    dup2(c->saved2, 2);
    close(c->saved1);
    close(c->saved2);
    slurp(c->fd1, g_out, sizeof g_out);
    slurp(c->fd2, g_err, sizeof g_err);
    close(c->fd1);
    close(c->fd2);
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* The faked devices: each is refused, with this reason. */
static const struct { const char *spec, *reason; int rc; } FAKES[] = {
    {"NVIDIA GeForce GTX 1080,cc=6.1,mem=8G", "cuda: NVIDIA GeForce GTX 1080 is sm_61; this build "
     "runs sm_75 and newer", CM_EDEVICE},
    {"Tesla T4,cc=7.5,mem=16G,driver=12.2", "cuda: the NVIDIA driver supports CUDA 12.2; this "
     "build's CUDA 13.0 runtime needs a driver for CUDA 13", CM_EDEVICE},
    {"Small GPU,cc=8.6,mem=4G,free=200M", "cuda: Small GPU has 0.2 GiB free of 4.0 GiB; this model "
     "needs about", CM_ENOMEM},
    {"none", "cuda: no GPU found (faked: none)", CM_EDEVICE},
    {"nodriver", "cuda: no NVIDIA driver found (faked: nodriver)", CM_EDEVICE},
};
#define NFAKES (sizeof FAKES / sizeof FAKES[0])
#define NO_CUDA_BUILD "cuda: this build has no CUDA backend"

static const char *expected_reason(size_t i)
{
    return kern_have_cuda_build() ? FAKES[i].reason : NO_CUDA_BUILD;
}

static void test_pick_with_fake_facts(void **state)
{
    (void)state;
    if (!kern_have_cuda_build())
        print_message("  this build has no CUDA backend: every faked device must give '%s'\n",
                      NO_CUDA_BUILD);
    struct kern_mem_need need = {1 << 20, 1 << 20, 2 << 20, 8 << 20, 1 << 20, KERN_GPU_RESERVE};
    for (size_t i = 0; i < NFAKES; i++) {
        setenv("CROWDTRAIN_FAKE_GPU", FAKES[i].spec, 1);
        const struct kern_backend *be = NULL;
        char why[512] = "";
        struct captured c;
        capture_begin(&c);
        int rc = kern_backend_pick_for("auto", &need, &be, why, sizeof why);
        capture_end(&c);
        print_message("  auto, %s:\n    %s", FAKES[i].spec, g_err);
        assert_int_equal(rc, CM_OK);
        assert_non_null(be);
        assert_int_equal(be->dev, KERN_DEV_CPU);
        assert_non_null(strstr(why, expected_reason(i)));
        /* one line, the reason and what is done about it */
        assert_int_equal(count_lines_with(g_err, "\n"), 1);
        assert_non_null(strstr(g_err, expected_reason(i)));
        assert_non_null(strstr(g_err, " — using the CPU\n"));

        be = NULL;
        why[0] = 0;
        capture_begin(&c);
        rc = kern_backend_pick_for("cuda", &need, &be, why, sizeof why);
        capture_end(&c);
        print_message("  cuda, %s: rc %d, %s\n", FAKES[i].spec, rc, why);
        assert_int_equal(rc, kern_have_cuda_build() ? FAKES[i].rc : CM_EUNSUPPORTED);
        assert_null(be);
        assert_non_null(strstr(why, expected_reason(i)));
        assert_string_equal(g_err, ""); /* the caller reports it */
    }
    setenv("CROWDTRAIN_FAKE_GPU", "X,cc=8.0", 1);
    const struct kern_backend *be = NULL;
    char why[512] = "";
    assert_int_equal(kern_backend_pick_for("auto", NULL, &be, why, sizeof why), CM_EINVAL);
    assert_non_null(strstr(why, "CROWDTRAIN_FAKE_GPU"));
    unsetenv("CROWDTRAIN_FAKE_GPU");
    assert_int_equal(kern_backend_pick_for("tpu", NULL, &be, why, sizeof why), CM_EINVAL);
    assert_int_equal(kern_backend_pick_for("cpu", NULL, &be, why, sizeof why), CM_OK);
    assert_int_equal(be->dev, KERN_DEV_CPU);
}

/* ---- `crowdtrain-agent train --local` with a faked GPU ---- */

static char g_dir[256];

static void write_file(const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ct-gpucheck-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_tiny_run(void)
{
    char text[8192], man[1024], path[512], hex[65];
    uint8_t h[32];
    size_t n = 0;
    while (n + 40 < sizeof text)
        n += (size_t)snprintf(text + n, sizeof text - n, "the quick brown fox %zu. ", n % 97);
    write_file("train.txt", text, n);
    cm_sha256(text, n, h);
    cm_hex_encode(h, 32, hex);
    snprintf(path, sizeof path, "%s/train.txt", g_dir);
    snprintf(man, sizeof man,
             "{\"name\": \"t\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file://%s\", "
             "\"size\": %zu, \"sha256\": \"%s\"}]}",
             path, n, hex);
    write_file("train.json", man, strlen(man));
    static const char cfg[] =
        "{\"model\": {\"type\": \"gpt\", \"vocab\": 257, \"context\": 16, \"layers\": 1,"
        " \"heads\": 2, \"d_model\": 16, \"d_ff\": 32},"
        " \"batch_size\": 4, \"steps\": 2, \"seed\": 1,"
        " \"data\": {\"train\": \"train.json\", \"shuffle_buffer\": 16}}";
    write_file("run.json", cfg, strlen(cfg));
}

static int run_train(const char *device)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/run.json", g_dir);
    char *argv[] = {"train", "--local", "--config", cfg, "--device", (char *)device, NULL};
    struct captured c;
    capture_begin(&c);
    int rc = agent_cmd_train(6, argv);
    capture_end(&c);
    print_message("  train --device %s (CROWDTRAIN_FAKE_GPU=%s): exit %d\n    stderr: %s\n"
                  "    stdout: %.200s\n",
                  device, getenv("CROWDTRAIN_FAKE_GPU"), rc, g_err, g_out);
    return rc;
}

static void test_train_command_falls_back(void **state)
{
    (void)state;
    write_tiny_run();
    for (size_t i = 0; i < NFAKES; i++) {
        setenv("CROWDTRAIN_FAKE_GPU", FAKES[i].spec, 1);
        assert_int_equal(run_train("auto"), 0);
        assert_int_equal(count_lines_with(g_err, " — using the CPU"), 1);
        assert_non_null(strstr(g_err, expected_reason(i)));
        assert_non_null(strstr(g_out, "cpu backend"));
        /* the memory message names the estimate of this very model */
        if (FAKES[i].rc == CM_ENOMEM && kern_have_cuda_build())
            assert_non_null(strstr(g_err, "(parameters 0.00 + gradients 0.00 + optimizer 0.00"));

        assert_int_equal(run_train("cuda"), 1);
        char want[512];
        snprintf(want, sizeof want, "train: --device cuda: %s", expected_reason(i));
        assert_non_null(strstr(g_err, want));
        assert_null(strstr(g_err, "using the CPU"));
        assert_null(strstr(g_out, "backend"));
    }
    unsetenv("CROWDTRAIN_FAKE_GPU");
}

/* ---- the real facts of this machine ---- */

static void test_real_device(void **state)
{
    (void)state;
    unsetenv("CROWDTRAIN_FAKE_GPU");
    struct kern_gpu_facts f;
    struct kern_cuda_build b;
    int real;
    char err[256] = "";
    assert_int_equal(kern_gpu_facts_gather(&f, &b, &real, err, sizeof err), CM_OK);
    assert_int_equal(b.have, kern_have_cuda_build());
    print_message("  build: %d SASS archs, PTX %d, CUDA %d; driver %d, runtime %d, %d device(s) "
                  "%s (cc %d.%d, %zu of %zu bytes free, image %d)%s%s\n",
                  b.nsass, b.ptx, b.toolkit, f.driver, f.runtime, f.ndev, f.name, f.cc_major,
                  f.cc_minor, f.mem_free, f.mem_total, f.image, f.error[0] ? ": " : "", f.error);
    const char *req = getenv("CT_TEST_REQUIRE_GPU");
    int require = req && !strcmp(req, "1");
    struct kern_mem_need small = {1 << 20, 1 << 20, 2 << 20, 8 << 20, 1 << 20, KERN_GPU_RESERVE};
    struct kern_mem_need huge = small;
    huge.act = (size_t)1 << 50; /* 1 PiB */
    const struct kern_backend *be = NULL;
    char why[512];
    if (require) {
        /* make test-gpu: the GPU must be accepted for a small model, and
         * the real free memory must refuse an impossible one */
        assert_int_equal(kern_backend_pick_for("auto", &small, &be, why, sizeof why), CM_OK);
        print_message("  small model: %s\n", why);
        assert_int_equal(be->dev, KERN_DEV_CUDA);
        assert_non_null(strstr(why, f.name));
        assert_int_equal(f.image, 1);
        assert_int_equal(kern_backend_pick_for("cuda", &huge, &be, why, sizeof why), CM_ENOMEM);
        print_message("  1 PiB model: %s\n", why);
        assert_non_null(strstr(why, "this model needs about"));
        return;
    }
    if (f.ndev > 0 && b.have) {
        print_message("  a GPU is present; its selection is checked by make test-gpu\n");
        return;
    }
    /* no GPU or no driver here: auto falls back with one line */
    struct captured c;
    capture_begin(&c);
    int rc = kern_backend_pick_for("auto", &small, &be, why, sizeof why);
    capture_end(&c);
    print_message("  auto without a GPU: %s", g_err);
    assert_int_equal(rc, CM_OK);
    assert_int_equal(be->dev, KERN_DEV_CPU);
    assert_int_equal(count_lines_with(g_err, "\n"), 1);
    assert_non_null(strstr(g_err, " — using the CPU\n"));
    assert_true(strstr(why, "cuda: no NVIDIA driver found") || strstr(why, "cuda: no GPU found") ||
                strstr(why, NO_CUDA_BUILD));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arch_rules),
        cmocka_unit_test(test_check_branches),
        cmocka_unit_test(test_precision),
        cmocka_unit_test(test_fake_parse),
        cmocka_unit_test(test_mem_need_matches_allocations),
        cmocka_unit_test(test_pick_with_fake_facts),
        cmocka_unit_test(test_train_command_falls_back),
        cmocka_unit_test(test_real_device),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
