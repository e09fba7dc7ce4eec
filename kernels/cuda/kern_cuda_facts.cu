/* What the CUDA build holds and what device 0 is, for kern_gpu_check
 * (kernels/kern_gpu.h), asked before the backend in kern_cuda.cu is
 * initialized: the architectures this object was compiled for, the driver
 * and runtime versions, the device's capability and memory, and whether a
 * kernel of this build loads on it. Compiled with the same architecture
 * flags as kern_cuda.cu (kernels/module.mk), so k_probe loads exactly where
 * the backend's kernels do. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cm_err.h"
#include "kern_gpu.h"
}

#if !defined(CT_CUDA_SASS) || !defined(CT_CUDA_PTX)
#error "kernels/module.mk passes the architecture lists as CT_CUDA_SASS and CT_CUDA_PTX"
#endif

/* Never launched: its loadability is the question. */
__global__ void k_probe(float *x)
{
    if (x)
        x[threadIdx.x] = 0.0f;
}

/* What this object was built for (kernels/module.mk). */
extern "C" int kern__cuda_build(struct kern_cuda_build *b)
{
    return kern_cuda_build_parse(CT_CUDA_SASS, CT_CUDA_PTX, CUDART_VERSION, b);
}

/* Facts about device 0 for kern_gpu_check. Creates the primary context (so
 * the free memory is what is left beside it), checks that a kernel of this
 * build loads, and clears the error that leaves on a device it does not. */
extern "C" void kern__cuda_facts(struct kern_gpu_facts *f)
{
    memset(f, 0, sizeof *f);
    f->image = -1;
    cudaError_t e = cudaDriverGetVersion(&f->driver);
    if (e != cudaSuccess || f->driver <= 0) {
        f->driver = 0;
        snprintf(f->error, sizeof f->error, "%s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "libcuda.so.1 not found");
    }
    cudaRuntimeGetVersion(&f->runtime);
    if (!f->driver)
        return;
    e = cudaGetDeviceCount(&f->ndev);
    if (e != cudaSuccess || f->ndev <= 0) {
        f->ndev = 0;
        snprintf(f->error, sizeof f->error, "%s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA devices");
        cudaGetLastError();
        return;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        f->ndev = 0;
        snprintf(f->error, sizeof f->error, "device 0: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }
    snprintf(f->name, sizeof f->name, "%.*s", (int)sizeof f->name - 1, prop.name);
    f->cc_major = prop.major;
    f->cc_minor = prop.minor;
    f->mem_total = prop.totalGlobalMem;
    f->mem_free = prop.totalGlobalMem;
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        f->mem_free = fr;
        f->mem_total = tot;
    }
    cudaFuncAttributes a;
    e = cudaFuncGetAttributes(&a, k_probe);
    if (e == cudaSuccess)
        f->image = 1;
    else if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
        f->image = 0;
    cudaGetLastError();
}

