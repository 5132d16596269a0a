/* The kernels and launchers declared in cuda_tensor_ops.h. A module that
 * uses them includes this file in exactly one of its .cu files.
 *
 * Launch configuration:
 *  - strided copy: 1-D grid-stride loop, OPS_CUDA_TPB threads per block,
 *    at most OPS_CUDA_MAX_BLOCKS blocks; thread i handles logical elements
 *    i, i + grid size, ... (NHWC order, c fastest, so a warp touches
 *    adjacent channels).
 *  - bias gradient, pass 1: block (32, 8), grid (ceil(K / 32), chunks).
 *    threadIdx.x is the channel within a group of 32 (adjacent channels:
 *    coalesced), threadIdx.y one of 8 row lanes; lane y of chunk j sums
 *    rows j*rpc + y, j*rpc + y + 8, ... below min((j+1)*rpc, rows) in
 *    double (rpc = ceil(rows / chunks)), the 8 lanes meet in shared memory
 *    (8 x 32 doubles, 2 KiB) and lane 0 adds them in order into
 *    partials[j * K + k]. Every thread reaches the one __syncthreads.
 *  - bias gradient, pass 2: 1-D grid-stride over K; thread k adds the
 *    chunks' partials in chunk order and writes db[k]. */
#ifndef BP_OPS_SHARED_CUDA_TENSOR_OPS_CUH
#define BP_OPS_SHARED_CUDA_TENSOR_OPS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_tensor_ops.h"

#define OPS_CUDA_TPB 256
#define OPS_CUDA_MAX_BLOCKS (65535 * 8)
#define OPS_CUDA_BIAS_CH 32   /* channels per block (threadIdx.x) */
#define OPS_CUDA_BIAS_LANES 8 /* row lanes per block (threadIdx.y) */

static unsigned ops_cuda_blocks(int64_t n) {
  int64_t blocks = (n + OPS_CUDA_TPB - 1) / OPS_CUDA_TPB;
  if (blocks < 1) blocks = 1;
  if (blocks > OPS_CUDA_MAX_BLOCKS) blocks = OPS_CUDA_MAX_BLOCKS;
  return (unsigned)blocks;
}

/* Element offset of (n, h, w, c) in the ops_cuda_layout l. */
#define OPS_CUDA_OFFSET(l, n, h, w, c) \
  ((n) * (l).stride[0] + (h) * (l).stride[1] + (w) * (l).stride[2] + (c) * (l).stride[3])

/* One strided copy kernel per element width (bits are copied, never
 * converted). */
#define OPS_CUDA_COPY_KERNEL(name, type)                                                      \
  static __global__ void name(const type *src, ops_cuda_layout s, type *dst, ops_cuda_layout d, \
                              int64_t count) {                                                \
    const int64_t step = (int64_t)gridDim.x * blockDim.x;                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {   \
      int64_t r = i;                                                                          \
      const int64_t c = r % d.shape[3];                                                       \
      r /= d.shape[3];                                                                        \
      const int64_t w = r % d.shape[2];                                                       \
      r /= d.shape[2];                                                                        \
      const int64_t h = r % d.shape[1];                                                       \
      const int64_t n = r / d.shape[1];                                                       \
      dst[OPS_CUDA_OFFSET(d, n, h, w, c)] = src[OPS_CUDA_OFFSET(s, n, h, w, c)];              \
    }                                                                                         \
  }
OPS_CUDA_COPY_KERNEL(ops_cuda_copy_u16, uint16_t)
OPS_CUDA_COPY_KERNEL(ops_cuda_copy_u32, uint32_t)

extern "C" int ops_cuda_copy_strided(const void *src, ops_cuda_layout src_layout, void *dst,
                                     ops_cuda_layout dst_layout, int elem_bytes, void *stream) {
  const int64_t count =
      dst_layout.shape[0] * dst_layout.shape[1] * dst_layout.shape[2] * dst_layout.shape[3];
  if (count <= 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  const unsigned blocks = ops_cuda_blocks(count);
  if (elem_bytes == 2)
    ops_cuda_copy_u16<<<blocks, OPS_CUDA_TPB, 0, s>>>((const uint16_t *)src, src_layout,
                                                      (uint16_t *)dst, dst_layout, count);
  else if (elem_bytes == 4)
    ops_cuda_copy_u32<<<blocks, OPS_CUDA_TPB, 0, s>>>((const uint32_t *)src, src_layout,
                                                      (uint32_t *)dst, dst_layout, count);
  else
    return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

static __global__ void ops_cuda_bias_partials(const void *dy, ops_cuda_layout l, int fp16,
                                              int64_t rows, int64_t rows_per_chunk,
                                              double *partials) {
  __shared__ double lane[OPS_CUDA_BIAS_LANES][OPS_CUDA_BIAS_CH];
  const int64_t k_count = l.shape[3];
  const int64_t k = (int64_t)blockIdx.x * OPS_CUDA_BIAS_CH + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  double sum = 0.0;
  if (k < k_count) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += OPS_CUDA_BIAS_LANES) {
      int64_t q = r;
      const int64_t w = q % l.shape[2];
      q /= l.shape[2];
      const int64_t h = q % l.shape[1];
      const int64_t n = q / l.shape[1];
      const int64_t off = OPS_CUDA_OFFSET(l, n, h, w, k);
      sum += fp16 ? (double)__half2float(((const __half *)dy)[off])
                  : (double)((const float *)dy)[off];
    }
  }
  lane[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && k < k_count) {
    double total = 0.0;
    for (int j = 0; j < OPS_CUDA_BIAS_LANES; j++) total += lane[j][threadIdx.x];
    partials[(int64_t)blockIdx.y * k_count + k] = total;
  }
}

static __global__ void ops_cuda_bias_finish(const double *partials, int64_t chunks,
                                            int64_t k_count, void *db, int64_t db_stride,
                                            int fp16, int accumulate) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < k_count; k += step) {
    double sum = 0.0;
    for (int64_t j = 0; j < chunks; j++) sum += partials[j * k_count + k];
    if (fp16) {
      __half *p = (__half *)db + k * db_stride;
      const float r = (float)sum;
      *p = __float2half_rn(accumulate ? __half2float(*p) + r : r);
    } else {
      float *p = (float *)db + k * db_stride;
      *p = accumulate ? (float)((double)*p + sum) : (float)sum;
    }
  }
}

extern "C" int ops_cuda_bias_grad(const void *dy, ops_cuda_layout dy_layout, void *db,
                                  int64_t db_stride, int fp16, int accumulate, double *partials,
                                  int64_t chunks, void *stream) {
  const int64_t rows = dy_layout.shape[0] * dy_layout.shape[1] * dy_layout.shape[2];
  const int64_t k_count = dy_layout.shape[3];
  if (rows <= 0 || k_count <= 0 || chunks < 1 || chunks > OPS_CUDA_BIAS_MAX_CHUNKS)
    return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 block(OPS_CUDA_BIAS_CH, OPS_CUDA_BIAS_LANES);
  const dim3 grid((unsigned)((k_count + OPS_CUDA_BIAS_CH - 1) / OPS_CUDA_BIAS_CH),
                  (unsigned)chunks);
  ops_cuda_bias_partials<<<grid, block, 0, s>>>(dy, dy_layout, fp16, rows, rows_per_chunk,
                                                partials);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  ops_cuda_bias_finish<<<ops_cuda_blocks(k_count), OPS_CUDA_TPB, 0, s>>>(
      partials, chunks, k_count, db, db_stride, fp16, accumulate);
  return (int)cudaGetLastError();
}

#endif
