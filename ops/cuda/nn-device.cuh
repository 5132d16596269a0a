/* Device helpers of the ops/cuda layer kernels (nn_*.cu): element access
 * through a cuda_nhwc, FP16 loads and stores, the accumulate rule and the
 * grid-stride loop. Only .cu files include this. */
#ifndef BP_OPS_CUDA_NN_DEVICE_CUH
#define BP_OPS_CUDA_NN_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "nn-impl.h"
#include "shared/elem_math.h"

/* Element offset of (n, h, w, c). */
__device__ __forceinline__ int64_t nn_off(const cuda_nhwc *t, int64_t n, int64_t h, int64_t w,
                                          int64_t c) {
  return n * t->s0 + h * t->s1 + w * t->s2 + c * t->s3;
}

/* q = a / b, r = a % b for a >= 0, b >= 1; in 32 bits when both fit (the
 * common case, several times cheaper on the GPU than 64-bit division). */
__device__ __forceinline__ void nn_divmod(int64_t a, int64_t b, int64_t *q, int64_t *r) {
  if (((uint64_t)a | (uint64_t)b) <= 0xffffffffu) {
    const uint32_t ua = (uint32_t)a, ub = (uint32_t)b, uq = ua / ub;
    *q = uq, *r = ua - uq * ub;
  } else {
    *q = a / b, *r = a - *q * b;
  }
}

/* Pixel p of t in (n, h, w) order as (n, h, w). */
__device__ __forceinline__ void nn_pixel(const cuda_nhwc *t, int64_t p, int64_t *n, int64_t *h,
                                         int64_t *w) {
  int64_t q;
  nn_divmod(p, t->w, &q, w);
  nn_divmod(q, t->h, n, h);
}

/* Logical element i of t in compact NHWC order (c fastest) as (n, h, w, c). */
__device__ __forceinline__ void nn_coords(const cuda_nhwc *t, int64_t i, int64_t *n, int64_t *h,
                                          int64_t *w, int64_t *c) {
  int64_t p;
  nn_divmod(i, t->c, &p, c);
  nn_pixel(t, p, n, h, w);
}

__host__ __device__ __forceinline__ int64_t nn_count(const cuda_nhwc *t) {
  return t->n * t->h * t->w * t->c;
}

/* Element i of an FP32 or FP16 array, widened exactly. */
__device__ __forceinline__ float nn_ld(const void *p, int32_t fp16, int64_t i) {
  return fp16 ? __half2float(((const __half *)p)[i]) : ((const float *)p)[i];
}

/* Stores v, rounded once to nearest even for FP16. */
__device__ __forceinline__ void nn_st(void *p, int32_t fp16, int64_t i, float v) {
  if (fp16)
    ((__half *)p)[i] = __float2half_rn(v);
  else
    ((float *)p)[i] = v;
}

/* A backward output: overwritten with the result, or (accumulate) the
 * result added to the old value in FP32 and stored (rounded once for FP16):
 * out = round16(float(out) + result), as the mixed-precision contract and
 * the reference's FP16 adapter do. */
__device__ __forceinline__ void nn_st_acc(void *p, int32_t fp16, int64_t i, float v,
                                          int accumulate) {
  if (accumulate) v = nn_ld(p, fp16, i) + v;
  nn_st(p, fp16, i, v);
}

/* Channel c of a [1,1,1,C] tensor. */
__device__ __forceinline__ float nn_ch_ld(const cuda_chan *t, int64_t c) {
  return nn_ld(t->p, t->fp16, c * t->stride);
}
__device__ __forceinline__ void nn_ch_st(const cuda_chan *t, int64_t c, float v) {
  nn_st(t->p, t->fp16, c * t->stride, v);
}

/* for (i = this thread's first; i < n; i += every thread of the grid) */
#define NN_GRID_LOOP(i, n)                                                                  \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
       i += (int64_t)gridDim.x * blockDim.x)

/* The launch's status (a launch error, e.g. a bad configuration). */
static inline int nn_launched(void) { return (int)cudaGetLastError(); }

/* The workspace from its first CUDA_NN_WS_ALIGN boundary on. */
static inline void *nn_ws_base(void *ws) {
  return (void *)(((uintptr_t)ws + CUDA_NN_WS_ALIGN - 1) & ~(uintptr_t)(CUDA_NN_WS_ALIGN - 1));
}

#endif
