/* Backend selection: which backends this build has and which one a run
 * uses. The agent calls kern_backend_pick("auto") unless --device says
 * otherwise; CUDA is preferred when the build has it and a GPU answers. */
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"
#include "kern_backend.h"

#ifdef CT_HAVE_CUDA
/* kernels/cuda/kern_cuda.cu */
int kern__cuda_backend(const struct kern_backend **out);
#endif

int kern_have_cuda_build(void)
{
#ifdef CT_HAVE_CUDA
    return 1;
#else
    return 0;
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

int kern_backend_pick(const char *name, const struct kern_backend **out)
{
    if (!name || !out)
        return CM_EINVAL;
    if (!strcmp(name, "cpu")) {
        *out = kern_backend_cpu();
        return CM_OK;
    }
    if (!strcmp(name, "cuda")) {
        int rc = kern_backend_cuda(out);
        if (rc == CM_EUNSUPPORTED)
            CM_LOGE("kernels", "--device cuda: this build has no CUDA backend (built with CUDA=0 or no nvcc)");
        else if (rc)
            CM_LOGE("kernels", "--device cuda: no usable GPU: %s", cm_strerror(rc));
        return rc;
    }
    if (!strcmp(name, "auto")) {
        if (kern_backend_cuda(out) == CM_OK)
            return CM_OK;
        *out = kern_backend_cpu();
        return CM_OK;
    }
    CM_LOGE("kernels", "unknown device '%s' (expected cpu, cuda or auto)", name);
    return CM_EINVAL;
}
