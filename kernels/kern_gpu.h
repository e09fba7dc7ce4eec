/* Whether a GPU can run this build and this model: a pure decision over
 * facts about the device and the build, so every branch is testable without
 * a GPU (tests/unit/kernels/test_gpu_check.c).
 *
 * kern_backend_pick_for (kern_backend.h) gathers the facts from the CUDA
 * runtime (kernels/cuda/kern_cuda.cu), or for tests from the environment
 * variable CROWDTRAIN_FAKE_GPU (kern_gpu_facts_parse below), runs
 * kern_gpu_check and, on "no", falls back to the CPU with its one-line
 * reason (--device auto) or fails with it (--device cuda). */
#ifndef KERN_GPU_H
#define KERN_GPU_H

#include <stddef.h>

/* Architectures are written 10 * major + minor: 75 = sm_75 = compute
 * capability 7.5. CUDA versions as the runtime writes them:
 * 1000 * major + 10 * minor (13000 = CUDA 13.0). */
#define KERN_GPU_MAX_ARCHS 16

/* What the binary holds. */
struct kern_cuda_build {
    int have;                       /* 1: the CUDA backend is built in */
    int nsass;
    int sass[KERN_GPU_MAX_ARCHS];   /* SASS (machine code) architectures, ascending */
    int ptx;                        /* PTX architecture the driver can JIT for newer GPUs; 0 none */
    int toolkit;                    /* CUDA version of the nvcc that built it */
};

/* What the machine has (device 0). */
struct kern_gpu_facts {
    int driver;          /* CUDA version the driver supports; 0 = no driver */
    int runtime;         /* CUDA runtime the binary loaded */
    int ndev;            /* 0 = no usable GPU, error says why */
    char error[160];
    char name[96];
    int cc_major, cc_minor;
    size_t mem_total, mem_free; /* bytes; free as seen after creating our context */
    int image;           /* a kernel of this build loads on it: 1 yes, 0 no, -1 not tried */
    int fake;            /* 1 when the facts came from CROWDTRAIN_FAKE_GPU */
};

/* Device memory a model needs for training, in bytes, by role. Activations
 * are those of one micro-batch (what the model allocates for max_batch);
 * scratch is what the CUDA backend allocates on top (attention's permuted
 * copies, the reduction partials); reserve is a fixed allowance for what we
 * do not allocate ourselves (cuBLAS's handle, workspace and loaded kernels,
 * allocator rounding): KERN_GPU_RESERVE. */
struct kern_mem_need {
    size_t params, grads, optim, act, scratch, reserve;
};
#define KERN_GPU_RESERVE ((size_t)512 << 20)

size_t kern_mem_need_total(const struct kern_mem_need *n);

/* The build's architecture lists as written by kernels/module.mk ("75 80
 * 86"), into b->sass (sorted ascending). CM_EINVAL on anything else. */
int kern_cuda_build_parse(const char *sass_list, int ptx, int toolkit, struct kern_cuda_build *b);

/* 1 when code in build b runs on a device of capability cc (10*major+minor):
 * SASS of the same major and a minor not above the device's, or PTX of an
 * architecture not above it (the driver JITs it). *via_ptx = 1 when only the
 * PTX fits. */
int kern_gpu_arch_runs(const struct kern_cuda_build *b, int cc, int *via_ptx);

/* The decision. need may be NULL (memory not checked). Returns
 *   CM_OK            the GPU can be used; msg describes it (for the log);
 *   CM_EUNSUPPORTED  this build has no CUDA backend;
 *   CM_EDEVICE       no driver, a driver too old for the runtime (or for
 *                    the PTX the device would need), no GPU, an
 *                    architecture the build has no code for;
 *   CM_ENOMEM        less free device memory than need.
 * msg (one line, no newline) says why, naming the device, e.g.
 *   "cuda: NVIDIA GeForce GTX 1080 is sm_61; this build runs sm_75 and newer".
 * The caller adds what it does about it (" — using the CPU"). */
int kern_gpu_check(const struct kern_gpu_facts *f, const struct kern_cuda_build *b,
                   const struct kern_mem_need *need, char *msg, size_t msglen);

/* The matrix-product precision a device runs for the configured one: bf16
 * and tf32 tensor cores came with sm_80, so below that "bf16" and "tf32"
 * run as "fp32" (fp16 tensor cores exist from sm_70). Returns a static
 * string; mode itself when it runs as asked. */
const char *kern_gpu_precision(int cc, const char *mode);

/* The test override, CROWDTRAIN_FAKE_GPU (read only by the tests; never
 * set it in production, the agent then decides on invented facts):
 *   "none"      no GPU (the driver answers, no device);
 *   "nodriver"  no NVIDIA driver;
 *   "NAME,cc=M.m,mem=SIZE[,free=SIZE][,driver=X.Y][,runtime=X.Y]"
 *               a device; SIZE is a number with an optional K, M, G or T
 *               suffix (binary units); free defaults to mem, driver and
 *               runtime to default_runtime.
 * CM_EINVAL with a reason in err for anything else. */
int kern_gpu_facts_parse(const char *spec, int default_runtime, struct kern_gpu_facts *out,
                         char *err, size_t errlen);

#endif
