/* The one CUDA kernel of the device-memory "threads" collectives
 * (device_threads.c): rank k's chunk summed in rank order from every
 * rank's span (all on this GPU), then scaled: the float operations of
 * ar_reduce_chunk (allreduce-impl.h) per element, so the bits equal the
 * CPU threads kernel's. Built with --fmad=false (CMakeLists.txt). One
 * thread per element, grid-stride; dst may alias a source (each element is
 * read and written by the same thread). */
#include <cuda_runtime.h>

#include "device_threads-impl.h"

__global__ void ar_dt_reduce_kernel(float *dst, ar_dt_sources sources, int world,
                                    unsigned long long n, float scale) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float acc = sources.src[0][i];
    for (int r = 1; r < world; r++) acc += sources.src[r][i];
    dst[i] = acc * scale;
  }
}

extern "C" int ar_dt_reduce(float *dst, const ar_dt_sources *sources, int world, uint64_t n,
                            float scale, void *stream) {
  if (n == 0) return 0;
  unsigned long long blocks = (n + AR_DT_BLOCK - 1) / AR_DT_BLOCK;
  if (blocks > AR_DT_MAX_BLOCKS) blocks = AR_DT_MAX_BLOCKS;
  ar_dt_reduce_kernel<<<(unsigned)blocks, AR_DT_BLOCK, 0, (cudaStream_t)stream>>>(
      dst, *sources, world, (unsigned long long)n, scale);
  return (int)cudaGetLastError();
}
