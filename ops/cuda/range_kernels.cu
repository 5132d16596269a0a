/* ops/cuda: the range family's kernels and launchers (range-impl.h).
 *
 * Launch shape: block CUDA_BLOCK (256) threads, grid cuda_grid_for(n)
 * (one thread per element, at most 65535 * 8 blocks), each kernel a
 * grid-stride loop over the span's n elements, one launch per span;
 * range.loss_scale is one thread; range.lars is three launches (below).
 * range.zero and range.copy are cudaMemsetAsync / cudaMemcpyAsync
 * (device to device) of the span's bytes: one memset or copy node in a
 * captured graph.
 *
 * Bits: every element goes through the reference's own formula
 * (ops/shared/elem_math.h) in FP32, and this file is compiled with
 * --fmad=false (ops/cuda/CMakeLists.txt), so no multiply-add is
 * contracted and the device rounds each operation as the CPU does;
 * division and sqrtf are IEEE (no fast math). No thread reads an element
 * another thread writes, so the element kernels are deterministic; the
 * only cross-thread results are nan_check's flag (every writer stores
 * 1.0f) and LARS's norms (a fixed reduction tree, below).
 *
 * Scalars are read on the device: skip first (nonzero: the kernel
 * returns before reading anything else), then lr, step or scale, which
 * must pass the reference's run-time checks (bp_lr_ok, bp_step_ok,
 * bp_unscale_scale_ok), else the kernel writes nothing. */
#include <cuda_runtime.h>

#include "cuda-impl.h"
#include "range-impl.h"
#include "shared/elem_math.h"

/* i over [0, n), grid-stride, in 64 bits. */
#define RANGE_LOOP(i, n)                                                                           \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
       i += (int64_t)gridDim.x * blockDim.x)

static __device__ int range_skipped(const float *skip) { return skip && bp_skip_set(*skip); }

/* ---- element kernels ------------------------------------------------------ */

__global__ void range_scale_k(const float *x, float *y, int64_t n, float scale) {
  RANGE_LOOP(i, n) y[i] = bp_scale(x[i], scale); /* y may be x: read before write */
}

__global__ void range_narrow_k(const float *src, uint16_t *dst, int64_t n) {
  RANGE_LOOP(i, n) dst[i] = bp_fp32_to_fp16(src[i]);
}

__global__ void range_widen_k(const uint16_t *src, float *dst, int64_t n) {
  RANGE_LOOP(i, n) dst[i] = bp_fp16_to_fp32(src[i]);
}

__global__ void range_ema_k(const float *w, float *e, int64_t n, float d, float one_minus_d,
                            const float *skip) {
  if (range_skipped(skip)) return;
  RANGE_LOOP(i, n) e[i] = bp_ema(e[i], w[i], d, one_minus_d);
}

/* Every thread ORs its elements; a block with a hit has thread 0 store
 * 1.0f (all stores are the same value, so their order does not matter).
 * No early return: every thread reaches __syncthreads_or. */
__global__ void range_nan_check_k(const void *x, int fp16, int64_t n, float *flag) {
  int any = 0;
  if (fp16) {
    const uint16_t *h = (const uint16_t *)x;
    RANGE_LOOP(i, n) any |= bp_fp16_nonfinite(h[i]);
  } else {
    const float *f = (const float *)x;
    RANGE_LOOP(i, n) any |= bp_fp32_nonfinite(f[i]);
  }
  if (__syncthreads_or(any) && threadIdx.x == 0) *flag = 1.0f;
}

__global__ void range_unscale_k(const uint16_t *src, const float *scale, float *dst, int64_t n) {
  const float s = *scale;
  if (!bp_unscale_scale_ok(s)) return;
  const float inv = bp_unscale_inv(s);
  RANGE_LOOP(i, n) dst[i] = bp_unscale(src[i], inv);
}

/* One thread: the whole state is four scalars. */
__global__ void range_loss_scale_k(const float *found_inf, float *scale, float *good, float *step,
                                   float *skipped, float growth_factor, float backoff_factor,
                                   int32_t growth_interval) {
  float v[4] = {*scale, *good, *step, *skipped};
  if (bp_loss_scale_bad(v) >= 0) return;
  bp_loss_scale_update(*found_inf, v, growth_factor, backoff_factor, growth_interval);
  *scale = v[0];
  *good = v[1];
  *step = v[2];
  *skipped = v[3];
}

__global__ void range_sgd_k(const float *grad, const float *lr_in, const float *skip, float *w,
                            float *m, int64_t n, float mu, float wd, int decay, int nesterov) {
  if (range_skipped(skip)) return;
  const float lr = *lr_in;
  if (!bp_lr_ok(lr)) return;
  RANGE_LOOP(i, n) bp_sgd(grad[i], &w[i], &m[i], lr, mu, wd, decay, nesterov);
}

/* Thread 0 of each block forms the step's factors from lr and step (the
 * reference's double operations) into shared memory; the block's threads
 * then read them. `go` is the same in every thread of the block, so the
 * early return after the barrier is uniform. */
__global__ void range_adamw_k(const float *grad, const float *lr_in, const float *step_in,
                              const float *skip, float *w, float *m, float *v, int64_t n,
                              float beta1, float beta2, float wd, float eps) {
  __shared__ bp_adamw_factors shared_f;
  __shared__ int go;
  if (threadIdx.x == 0) {
    go = 0;
    if (!range_skipped(skip)) {
      const float lr = *lr_in, step = *step_in;
      if (bp_lr_ok(lr) && bp_step_ok(step)) {
        shared_f = bp_adamw_factors_of(lr, step, beta1, beta2, wd, eps);
        go = 1;
      }
    }
  }
  __syncthreads();
  if (!go) return;
  const bp_adamw_factors f = shared_f;
  RANGE_LOOP(i, n) bp_adamw(&f, grad[i], &w[i], &m[i], &v[i]);
}

/* ---- LARS ------------------------------------------------------------------ */

/* Pass 1, grid (CUDA_LARS_PARTS, min(S, 65535)), block CUDA_BLOCK: block
 * (p, y) sums, for each parameter j = y, y + gridDim.y, ..., the squares
 * of w and grad over elements lo + p*256 + t + k*(CUDA_LARS_PARTS*256) of
 * [lo, hi), each thread in element order in double (the products of
 * floats are exact in double), then the block's 256 sums by a fixed tree
 * in shared memory; the pair goes to part[(j*PARTS + p)*2 + {0,1}].
 * Offsets out of range give 0 sums (pass 2 refuses them anyway). */
__global__ void range_lars_partials_k(const float *grad, const float *w, const int32_t *seg,
                                      int64_t segs, int64_t n, const float *skip, double *part) {
  __shared__ double sw[CUDA_BLOCK], sg[CUDA_BLOCK];
  if (range_skipped(skip)) return; /* the same value for every thread */
  const unsigned t = threadIdx.x;
  for (int64_t j = blockIdx.y; j < segs; j += gridDim.y) {
    const int64_t lo = seg[j], hi = seg[j + 1];
    double ww = 0.0, gg = 0.0;
    if (lo >= 0 && lo <= hi && hi <= n)
      for (int64_t i = lo + (int64_t)blockIdx.x * CUDA_BLOCK + t; i < hi;
           i += (int64_t)CUDA_LARS_PARTS * CUDA_BLOCK) {
        const double wi = w[i], gi = grad[i];
        ww += wi * wi;
        gg += gi * gi;
      }
    sw[t] = ww;
    sg[t] = gg;
    __syncthreads();
    for (unsigned s = CUDA_BLOCK / 2; s > 0; s >>= 1) {
      if (t < s) {
        sw[t] += sw[t + s];
        sg[t] += sg[t + s];
      }
      __syncthreads();
    }
    if (t == 0) {
      part[(j * CUDA_LARS_PARTS + blockIdx.x) * 2] = sw[0];
      part[(j * CUDA_LARS_PARTS + blockIdx.x) * 2 + 1] = sg[0];
    }
    __syncthreads(); /* sw, sg are reused by the next parameter */
  }
}

/* Pass 2, one block of CUDA_BLOCK threads: checks lr and every offset
 * (bp_lars_offset_ok) and writes the verdict to *ok; when valid, thread t
 * combines the partial pairs of parameters t, t + 256, ... in order
 * p = 0, 1, ..., PARTS-1, writes norms[2j] = |w_j|, norms[2j+1] = |g_j|
 * and the rate r_j (bp_lars_rate). */
__global__ void range_lars_combine_k(const float *lr_in, const int32_t *seg, int64_t segs,
                                     int64_t n, const float *skip, const double *part, float *norms,
                                     float *rate, int32_t *ok, float eta, float wd) {
  if (range_skipped(skip)) return;
  const float lr = *lr_in;
  int bad = !bp_lr_ok(lr);
  for (int64_t j = threadIdx.x; j <= segs; j += blockDim.x)
    if (!bp_lars_offset_ok(seg, j, n)) bad = 1;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) *ok = !bad;
  if (bad) return;
  for (int64_t j = threadIdx.x; j < segs; j += blockDim.x) {
    double ww = 0.0, gg = 0.0;
    for (int p = 0; p < CUDA_LARS_PARTS; p++) {
      ww += part[(j * CUDA_LARS_PARTS + p) * 2];
      gg += part[(j * CUDA_LARS_PARTS + p) * 2 + 1];
    }
    const double wn = sqrt(ww), gn = sqrt(gg);
    norms[2 * j] = (float)wn;
    norms[2 * j + 1] = (float)gn;
    rate[j] = bp_lars_rate(wn, gn, eta, wd, lr);
  }
}

/* Pass 3, grid (x, min(S, 65535)), block CUDA_BLOCK: parameter j's
 * elements, grid-stride over the x blocks, at rate r_j; nothing when
 * skipped or when pass 2 found the scalars invalid. */
__global__ void range_lars_update_k(const float *grad, const int32_t *seg, int64_t segs,
                                    const float *skip, const float *rate, const int32_t *ok,
                                    float *w, float *m, float mu, float wd, int decay) {
  if (range_skipped(skip) || !*ok) return;
  for (int64_t j = blockIdx.y; j < segs; j += gridDim.y) {
    const int64_t lo = seg[j], hi = seg[j + 1];
    const float r = rate[j];
    for (int64_t i = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi;
         i += (int64_t)gridDim.x * blockDim.x)
      bp_lars(grad[i], &w[i], &m[i], r, mu, wd, decay);
  }
}

/* ---- launchers --------------------------------------------------------------- */

#define RANGE_STREAM(s) ((cudaStream_t)(s))
#define RANGE_GRID(n) dim3(cuda_grid_for(n)), dim3(CUDA_BLOCK)

extern "C" int cuda_range_zero(void *x, uint64_t bytes, void *stream) {
  if (bytes == 0) return 0;
  return (int)cudaMemsetAsync(x, 0, (size_t)bytes, RANGE_STREAM(stream));
}

extern "C" int cuda_range_copy(void *dst, const void *src, uint64_t bytes, void *stream) {
  if (bytes == 0) return 0;
  return (int)cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice,
                              RANGE_STREAM(stream));
}

extern "C" int cuda_range_scale(const float *x, float *y, int64_t n, float scale, void *stream) {
  if (n <= 0) return 0;
  range_scale_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(x, y, n, scale);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_narrow(const float *src, uint16_t *dst, int64_t n, void *stream) {
  if (n <= 0) return 0;
  range_narrow_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(src, dst, n);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_widen(const uint16_t *src, float *dst, int64_t n, void *stream) {
  if (n <= 0) return 0;
  range_widen_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(src, dst, n);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_ema(const float *w, float *e, int64_t n, float decay,
                              float one_minus_decay, const float *skip, void *stream) {
  if (n <= 0) return 0;
  range_ema_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(w, e, n, decay, one_minus_decay, skip);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_nan_check(const void *x, int fp16, int64_t n, float *flag, void *stream) {
  if (n <= 0) return 0;
  range_nan_check_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(x, fp16, n, flag);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_unscale(const uint16_t *src, const float *scale, float *dst, int64_t n,
                                  void *stream) {
  if (n <= 0) return 0;
  range_unscale_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(src, scale, dst, n);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_loss_scale(const float *found_inf, float *scale, float *good, float *step,
                                     float *skipped, float growth_factor, float backoff_factor,
                                     int32_t growth_interval, void *stream) {
  range_loss_scale_k<<<1, 1, 0, RANGE_STREAM(stream)>>>(
      found_inf, scale, good, step, skipped, growth_factor, backoff_factor, growth_interval);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_sgd(const float *grad, const float *lr, const float *skip, float *w,
                              float *m, int64_t n, float momentum, float weight_decay, int nesterov,
                              void *stream) {
  if (n <= 0) return 0;
  range_sgd_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(
      grad, lr, skip, w, m, n, momentum, weight_decay, weight_decay != 0.0f, nesterov);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_adamw(const float *grad, const float *lr, const float *step,
                                const float *skip, float *w, float *m, float *v, int64_t n,
                                float beta1, float beta2, float weight_decay, float eps,
                                void *stream) {
  if (n <= 0) return 0;
  range_adamw_k<<<RANGE_GRID(n), 0, RANGE_STREAM(stream)>>>(grad, lr, step, skip, w, m, v, n, beta1,
                                                            beta2, weight_decay, eps);
  return (int)cudaGetLastError();
}

extern "C" int cuda_range_lars(const float *grad, const float *lr, const int32_t *seg, int64_t segs,
                               const float *skip, float *w, float *m, float *norms, int64_t n,
                               float momentum, float weight_decay, float eta, void *workspace,
                               void *stream) {
  if (segs <= 0) return 0;
  double *part = (double *)workspace;
  float *rate = (float *)(part + segs * CUDA_LARS_PARTS * 2);
  int32_t *ok = (int32_t *)(rate + segs);
  const unsigned gy = segs < 65535 ? (unsigned)segs : 65535u;
  unsigned gx = cuda_grid_for(n);
  if (gx > 512) gx = 512; /* elementwise: any x gives the same bits */
  cudaStream_t s = RANGE_STREAM(stream);
  range_lars_partials_k<<<dim3(CUDA_LARS_PARTS, gy), dim3(CUDA_BLOCK), 0, s>>>(grad, w, seg, segs,
                                                                               n, skip, part);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  range_lars_combine_k<<<1, CUDA_BLOCK, 0, s>>>(lr, seg, segs, n, skip, part, norms, rate, ok, eta,
                                                weight_decay);
  err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  range_lars_update_k<<<dim3(gx, gy), dim3(CUDA_BLOCK), 0, s>>>(
      grad, seg, segs, skip, rate, ok, w, m, momentum, weight_decay, weight_decay != 0.0f);
  return (int)cudaGetLastError();
}
