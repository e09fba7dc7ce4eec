/* Backend selection: which backends this build has and which one a run
 * uses. The agent calls kern_backend_pick_for(cfg.device, the model's memory
 * need) with "auto" unless --device says otherwise; CUDA is preferred when
 * the build has it and the GPU passes kern_gpu_check (kern_gpu.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "kern_backend.h"

#ifdef CT_HAVE_CUDA
/* kernels/cuda/kern_cuda.cu */
int kern__cuda_backend(const struct kern_backend **out);
int kern__cuda_build(struct kern_cuda_build *b);
void kern__cuda_facts(struct kern_gpu_facts *f);
void kern__cuda_forget(void);
#endif

int kern_have_cuda_build(void)
{
#ifdef CT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

static void forget_probe(void)
{
#ifdef CT_HAVE_CUDA
    kern__cuda_forget();
#endif
}

int kern_backend_cuda(const struct kern_backend **out)
{
#ifdef CT_HAVE_CUDA
    return kern__cuda_backend(out);
#else
    (void)out;
    return CM_EUNSUPPORTED;
#endif
}

int kern_gpu_facts_gather(struct kern_gpu_facts *f, struct kern_cuda_build *build, int *real,
                          char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    memset(build, 0, sizeof *build);
    *real = 0;
#ifdef CT_HAVE_CUDA
    if (kern__cuda_build(build)) {
        snprintf(err, errlen, "cuda: the build's architecture lists do not parse");
        return CM_EINTERNAL;
    }
#endif
    /* The tests' override (kern_gpu.h): only the facts are invented, the
     * build and the decision are the real ones. */
    const char *fake = getenv("CROWDTRAIN_FAKE_GPU");
    if (fake)
        return kern_gpu_facts_parse(fake, build->toolkit ? build->toolkit : 13000, f, err, errlen);
#ifdef CT_HAVE_CUDA
    kern__cuda_facts(f);
    *real = 1;
#endif
    return CM_OK;
}

int kern_backend_pick_for(const char *name, const struct kern_mem_need *need,
                          const struct kern_backend **out, char *why, size_t whylen)
{
    char msg[512];
    if (!name || !out || !why || !whylen)
        return CM_EINVAL;
    why[0] = 0;
    if (!strcmp(name, "cpu")) {
        *out = kern_backend_cpu();
        return CM_OK;
    }
    int is_auto = !strcmp(name, "auto");
    if (!is_auto && strcmp(name, "cuda")) {
        snprintf(why, whylen, "unknown device '%s' (expected cpu, cuda or auto)", name);
        return CM_EINVAL;
    }
    struct kern_gpu_facts f;
    struct kern_cuda_build b;
    int real;
    int rc = kern_gpu_facts_gather(&f, &b, &real, why, whylen);
    if (rc)
        return rc;
    rc = kern_gpu_check(&f, &b, need, msg, sizeof msg);
    if (rc == CM_OK && (rc = kern_backend_cuda(out)) != CM_OK)
        snprintf(msg, sizeof msg, "cuda: %s could not be initialized (%s; see the error above)",
                 f.name, cm_strerror(rc));
    if (rc == CM_OK) {
        snprintf(why, whylen, "%s", msg);
        CM_LOGI("device", "%s", msg);
        return CM_OK;
    }
    if (real && f.ndev > 0)
        forget_probe();
    snprintf(why, whylen, "%s", msg);
    if (!is_auto)
        return rc;
    *out = kern_backend_cpu();
    /* A machine without a GPU (or a CPU-only build) choosing the CPU is no
     * news; a GPU that is there but cannot be used is. */
    int no_gpu = rc == CM_EUNSUPPORTED || f.driver <= 0 ||
                 (f.ndev <= 0 && f.driver / 1000 >= f.runtime / 1000);
    if (no_gpu)
        CM_LOGI("device", "%s — using the CPU", msg);
    else
        CM_LOGW("device", "%s — using the CPU", msg);
    return CM_OK;
}

int kern_backend_pick(const char *name, const struct kern_backend **out)
{
    char why[512];
    int rc = kern_backend_pick_for(name, NULL, out, why, sizeof why);
    if (rc)
        CM_LOGE("kernels", "--device %s: %s", name ? name : "(null)", why);
    return rc;
}
