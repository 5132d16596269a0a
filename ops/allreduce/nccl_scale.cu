/* The one CUDA kernel of the "nccl" collectives (nccl.c): x[i] = x[i] *
 * scale over this rank's chunk after NCCL has summed it, so the result is
 * "sum, then multiply by scale" in FP32 as allreduce-impl.h writes it (NCCL's
 * pre-multiplied sum would round differently). One multiply per element:
 * nothing for the compiler to contract. Grid-stride; launched on the
 * collective's stream; never synchronizes (capturable). */
#include <cuda_runtime.h>

#include "nccl-impl.h"

__global__ void ar_nccl_scale_kernel(float *x, unsigned long long n, float scale) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] = x[i] * scale;
}

extern "C" int ar_nccl_scale(float *x, uint64_t n, float scale, void *stream) {
  if (n == 0) return 0;
  unsigned long long blocks = (n + AR_NCCL_BLOCK - 1) / AR_NCCL_BLOCK;
  if (blocks > AR_NCCL_MAX_BLOCKS) blocks = AR_NCCL_MAX_BLOCKS;
  ar_nccl_scale_kernel<<<(unsigned)blocks, AR_NCCL_BLOCK, 0, (cudaStream_t)stream>>>(
      x, (unsigned long long)n, scale);
  return (int)cudaGetLastError();
}
