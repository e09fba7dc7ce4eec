/* Row reductions shared by the CUDA backend's one-block-per-row kernels
 * (layer norm and attention's softmax in kern_cuda.cu, cross-entropy and
 * argmax hits in kern_cuda_xent.cu). CUDA only: included by .cu files. */
#ifndef KERN_CUDA_ROWS_CUH
#define KERN_CUDA_ROWS_CUH

#define ROW_THREADS 256

/* The sum (max) of v over the block; sh holds blockDim.x floats. */
static __device__ __forceinline__ float block_sum(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k)
            sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

static __device__ __forceinline__ float block_max(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + k]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

#endif
