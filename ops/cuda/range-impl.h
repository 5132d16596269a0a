/* ops/cuda range family: the C-linkage launchers of range_kernels.cu,
 * called by range.c after the argument checks. Each enqueues on `stream`
 * (a cudaStream_t; NULL: the default stream) and returns 0 or the
 * cudaError_t of its launch. Spans are plain device pointers with their
 * element count n; scalars (lr, step, scale, found_inf, skip) are device
 * pointers read INSIDE the kernels, so nothing here reads device memory
 * on the host, allocates or synchronizes (every launch may be captured).
 * `skip` is NULL when the op has no skip input; a kernel whose skip holds
 * a nonzero value writes nothing. A scalar the reference would refuse at
 * run time (lr not finite, step < 1, scale not finite and > 0, a
 * loss-scale state out of range, LARS offsets out of order) makes the
 * kernel write nothing too: the outputs stay as the reference's refusal
 * leaves them, but no error can reach the host from the device. */
#ifndef BP_OPS_CUDA_RANGE_IMPL_H
#define BP_OPS_CUDA_RANGE_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LARS's norms: blocks per parameter in the first reduction pass. Fixed
 * (not taken from the device), so the partial sums, and hence the bits of
 * the norms, are the same on every GPU and every run. */
#define CUDA_LARS_PARTS 128

/* LARS's workspace for S parameters: CUDA_LARS_PARTS partial (sum w^2,
 * sum g^2) pairs of doubles per parameter, then S float rates, then one
 * int32 "offsets and lr valid" flag. */
static inline uint64_t cuda_lars_workspace_bytes(int64_t segs) {
  return (uint64_t)segs * CUDA_LARS_PARTS * 2 * sizeof(double) + (uint64_t)segs * sizeof(float) +
         sizeof(int32_t);
}

int cuda_range_zero(void *x, uint64_t bytes, void *stream);
int cuda_range_copy(void *dst, const void *src, uint64_t bytes, void *stream);
int cuda_range_scale(const float *x, float *y, int64_t n, float scale, void *stream);
int cuda_range_narrow(const float *src, uint16_t *dst, int64_t n, void *stream);
int cuda_range_widen(const uint16_t *src, float *dst, int64_t n, void *stream);
int cuda_range_ema(const float *w, float *e, int64_t n, float decay, float one_minus_decay,
                   const float *skip, void *stream);
/* flag = 1 when any element is NaN or +-Inf, else untouched. */
int cuda_range_nan_check(const void *x, int fp16, int64_t n, float *flag, void *stream);
int cuda_range_unscale(const uint16_t *src, const float *scale, float *dst, int64_t n,
                       void *stream);
/* One thread: state[k] points at scale, good_steps, step, skipped. */
int cuda_range_loss_scale(const float *found_inf, float *scale, float *good, float *step,
                          float *skipped, float growth_factor, float backoff_factor,
                          int32_t growth_interval, void *stream);
int cuda_range_sgd(const float *grad, const float *lr, const float *skip, float *w, float *m,
                   int64_t n, float momentum, float weight_decay, int nesterov, void *stream);
int cuda_range_adamw(const float *grad, const float *lr, const float *step, const float *skip,
                     float *w, float *m, float *v, int64_t n, float beta1, float beta2,
                     float weight_decay, float eps, void *stream);
/* Three launches: partial sums, their combination (norms, rates, flag),
 * the update; workspace of cuda_lars_workspace_bytes(segs), 8-aligned. */
int cuda_range_lars(const float *grad, const float *lr, const int32_t *seg, int64_t segs,
                    const float *skip, float *w, float *m, float *norms, int64_t n, float momentum,
                    float weight_decay, float eta, void *workspace, void *stream);

#ifdef __cplusplus
}
#endif

#endif
