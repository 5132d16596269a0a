/* Small device helpers the vendor-library modules (ops/cudnn, ops/cublas)
 * share around their library calls: strided copies (staging a tensor
 * through a dense buffer, broadcasting a bias) and the bias gradient.
 * Declarations for C and CUDA; the kernels and C-linkage launchers are in
 * cuda_tensor_ops.cuh, which each module compiles once in a .cu file of
 * its own (the symbols stay hidden inside the module).
 *
 * Launchers enqueue on `stream` (a cudaStream_t; NULL is the legacy
 * default stream), never allocate, never synchronize and never read device
 * memory on the host, so they may be captured in a CUDA graph. Each
 * returns 0 or the cudaError_t of its launch. Every sum has a fixed order
 * that depends only on the shapes: the results are deterministic. */
#ifndef BP_OPS_SHARED_CUDA_TENSOR_OPS_H
#define BP_OPS_SHARED_CUDA_TENSOR_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The logical extent of an NHWC tensor and its element strides (a
 * bp_abi_tensor's shape[] and stride[]). A stride may be 0: every index of
 * that dimension reads the same element (a bias broadcast over rows). */
typedef struct ops_cuda_layout {
  int64_t shape[4];
  int64_t stride[4];
} ops_cuda_layout;

/* The dense NHWC layout of `shape` (no channel padding). */
static inline ops_cuda_layout ops_cuda_dense_layout(const int64_t shape[4]) {
  ops_cuda_layout l;
  for (int d = 0; d < 4; d++) l.shape[d] = shape[d];
  l.stride[3] = 1;
  l.stride[2] = shape[3];
  l.stride[1] = shape[2] * shape[3];
  l.stride[0] = shape[1] * shape[2] * shape[3];
  return l;
}

/* Rows per block-row of the bias gradient and the most block-rows: the
 * split of the N*H*W rows depends only on the row count. */
#define OPS_CUDA_BIAS_ROWS_PER_CHUNK 256
#define OPS_CUDA_BIAS_MAX_CHUNKS 1024

/* Chunks the bias gradient splits `rows` rows into (>= 1); its scratch
 * holds chunks * channels doubles. */
static inline int64_t ops_cuda_bias_chunks(int64_t rows) {
  int64_t chunks = (rows + OPS_CUDA_BIAS_ROWS_PER_CHUNK - 1) / OPS_CUDA_BIAS_ROWS_PER_CHUNK;
  if (chunks < 1) chunks = 1;
  if (chunks > OPS_CUDA_BIAS_MAX_CHUNKS) chunks = OPS_CUDA_BIAS_MAX_CHUNKS;
  return chunks;
}

/* dst[n,h,w,c] = src[n,h,w,c] for every logical element of dst_layout's
 * shape (src_layout's shape is ignored; its strides address the source),
 * elements of elem_bytes (2: FP16, 4: FP32) copied as bits. Channel
 * padding of dst is never written. */
int ops_cuda_copy_strided(const void *src, ops_cuda_layout src_layout, void *dst,
                          ops_cuda_layout dst_layout, int elem_bytes, void *stream);

/* db[k * db_stride] (+)= sum over the rows (n, h, w) of dy[n,h,w,k], for
 * k < dy.shape[3]. The rows are split into ops_cuda_bias_chunks(N*H*W)
 * chunks; each thread sums its rows in double in row order, a block adds
 * its 8 row lanes in order, and a second kernel adds the chunks in order
 * (partials: chunks * K doubles of scratch). The double sum is rounded to
 * float once; FP32: db = (float)sum, or (float)(db + sum) with accumulate;
 * FP16 (fp16 = 1, dy and db FP16): db = round16((float)sum), or
 * round16(float(db) + (float)sum) with accumulate, as the reference's FP16
 * path computes it. */
int ops_cuda_bias_grad(const void *dy, ops_cuda_layout dy_layout, void *db, int64_t db_stride,
                       int fp16, int accumulate, double *partials, int64_t chunks, void *stream);

#ifdef __cplusplus
}
#endif

#endif
