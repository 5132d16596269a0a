/* Pooling reference kernels: max pool and average pool (forward/backward,
 * window kh x kw, stride, zero padding) and global average pool.
 *
 * Shapes, windows and the checks: ops/shared/pool_check.h (shared with
 * ops/cpu and ops/cuda); the per-element formulas: ops/shared/elem_math.h.
 *
 * FP32 (mask INT8), any device strides that nest in NHWC order, padded
 * channels skipped; no alignment beyond the element size; the 16-byte tail
 * never read. Outputs never alias inputs. */
#include <stdint.h>

#include "reference-impl.h"
#include "shared/elem_math.h"
#include "shared/pool_check.h"

static int maxpool_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_MAX_FWD, &g, reason, rs);
}
static int maxpool_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_MAX_BWD, &g, reason, rs);
}
static int avgpool_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_AVG_FWD, &g, reason, rs);
}
static int avgpool_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_AVG_BWD, &g, reason, rs);
}

/* maxpool.fwd
 *   in: x   out: y, mask   (both overwritten; no accumulate in the forward)
 *   y = the largest in-bounds x of the window; padding never wins. Taps are
 *   scanned row-major (ky, then kx) and only a strictly larger value
 *   replaces the current one, so among ties the first tap in that order
 *   wins. A NaN wins over any number (the first NaN), so NaN propagates. */
static int maxpool_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_pool_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pool_check(args, OPS_POOL_MAX_FWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  int8_t *mask = (int8_t *)args->output_ptrs[1];
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        ops_pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        ops_pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        for (int64_t c = 0; c < g.c; c++) {
          float best = 0.0f;
          int64_t arg = -1;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++) {
              const int64_t ih = oh * g.sh - g.ph + ky, iw = ow * g.sw - g.pw + kx;
              const float v = x[bp_sdk_offset(g.x, n, ih, iw, c)];
              if (arg < 0 || bp_maxpool_takes(v, best)) {
                best = v;
                arg = ky * g.kw + kx;
              }
            }
          y[bp_sdk_offset(g.y, n, oh, ow, c)] = best;
          mask[bp_sdk_offset(g.mask, n, oh, ow, c)] = (int8_t)arg;
        }
      }
  return BP_ABI_OK;
}

/* maxpool.bwd
 *   in: dy, mask (from maxpool.fwd)   out: dx
 *   dx[window tap mask] (+)= dy for every output; accumulate 0: dx is
 *   overwritten (zero, then the scatter), 1: added. Windows that overlap
 *   (stride < kernel) add in output order (n, oh, ow). Every mask value is
 *   checked first (in [0, kh*kw) and on an in-bounds tap); a bad one makes
 *   run() return BP_ABI_ERR_INVALID before dx is touched. */
static int maxpool_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_pool_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pool_check(args, OPS_POOL_MAX_BWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0);
  const int8_t *mask = (const int8_t *)args->input_ptrs[1];
  float *dx = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        ops_pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        ops_pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        for (int64_t c = 0; c < g.c; c++) {
          const int64_t m = mask[bp_sdk_offset(g.mask, n, oh, ow, c)];
          if (!ops_pool_mask_ok(m, g.kh, g.kw, ky0, ky1, kx0, kx1)) {
            bp_sdk_set_reason(args, "mask: %lld at [%lld,%lld,%lld,%lld] is no in-bounds tap of "
                              "its %lldx%lld window",
                              (long long)m, (long long)n, (long long)oh, (long long)ow,
                              (long long)c, (long long)g.kh, (long long)g.kw);
            return BP_ABI_ERR_INVALID;
          }
        }
      }
  if (!g.accumulate) bp_sdk_fill_f32(g.x, dx, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++)
        for (int64_t c = 0; c < g.c; c++) {
          const int64_t m = mask[bp_sdk_offset(g.mask, n, oh, ow, c)];
          const int64_t ih = oh * g.sh - g.ph + m / g.kw, iw = ow * g.sw - g.pw + m % g.kw;
          dx[bp_sdk_offset(g.x, n, ih, iw, c)] += dy[bp_sdk_offset(g.y, n, oh, ow, c)];
        }
  return BP_ABI_OK;
}

/* Divisor of window (oh, ow): the whole window, or its in-bounds taps. */
static double avg_divisor(const ops_pool_geom *g, int64_t ky0, int64_t ky1, int64_t kx0,
                          int64_t kx1) {
  return g->count_include_pad ? (double)(g->kh * g->kw) : (double)((ky1 - ky0) * (kx1 - kx0));
}

/* avgpool.fwd
 *   in: x   out: y (overwritten; no accumulate in the forward)
 *   y = (sum of the in-bounds x of the window) / divisor, divisor kh*kw
 *   when count_include_pad (padding counts as zeros), else the number of
 *   in-bounds taps. Summed in double, rounded once. */
static int avgpool_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_pool_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pool_check(args, OPS_POOL_AVG_FWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        ops_pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        ops_pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        const double div = avg_divisor(&g, ky0, ky1, kx0, kx1);
        for (int64_t c = 0; c < g.c; c++) {
          double sum = 0.0;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++)
              sum += x[bp_sdk_offset(g.x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c)];
          y[bp_sdk_offset(g.y, n, oh, ow, c)] = bp_avg_of(sum, div);
        }
      }
  return BP_ABI_OK;
}

/* avgpool.bwd
 *   in: dy   out: dx
 *   every in-bounds tap of window (oh, ow) gets dy / divisor (as in the
 *   forward); accumulate 0: dx overwritten (zero, then the scatter), 1:
 *   added. Overlapping windows add in output order (n, oh, ow), in float. */
static int avgpool_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_pool_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pool_check(args, OPS_POOL_AVG_BWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0);
  float *dx = bp_sdk_output_f32(args, 0);
  if (!g.accumulate) bp_sdk_fill_f32(g.x, dx, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        ops_pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        ops_pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        const double div = avg_divisor(&g, ky0, ky1, kx0, kx1);
        for (int64_t c = 0; c < g.c; c++) {
          const float share = bp_avg_of(dy[bp_sdk_offset(g.y, n, oh, ow, c)], div);
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++)
              dx[bp_sdk_offset(g.x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c)] += share;
        }
      }
  return BP_ABI_OK;
}

static int gap_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return ops_gap_check(args, 1, &a, &x, &y, reason, rs);
}
static int gap_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return ops_gap_check(args, 0, &a, &x, &y, reason, rs);
}

/* global_avgpool.fwd
 *   in: x [N,H,W,C]   out: y [N,1,1,C] = mean of x over H*W, overwritten.
 *   Summed in double in (h, w) order, rounded once. */
static int gap_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *tx = NULL, *ty = NULL;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_gap_check(args, 1, &a, &tx, &ty, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  const double count = (double)(tx->shape[1] * tx->shape[2]);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t c = 0; c < tx->shape[3]; c++) {
      double sum = 0.0;
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) sum += x[bp_sdk_offset(tx, n, h, w, c)];
      y[bp_sdk_offset(ty, n, 0, 0, c)] = bp_avg_of(sum, count);
    }
  return BP_ABI_OK;
}

/* global_avgpool.bwd
 *   in: dy [N,1,1,C]   out: dx [N,H,W,C] (+)= dy / (H*W)
 *   accumulate 0: overwritten, 1: added. */
static int gap_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *tx = NULL, *ty = NULL;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_gap_check(args, 0, &a, &tx, &ty, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0);
  float *dx = bp_sdk_output_f32(args, 0);
  const double count = (double)(tx->shape[1] * tx->shape[2]);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t c = 0; c < tx->shape[3]; c++) {
      const float share = bp_avg_of(dy[bp_sdk_offset(ty, n, 0, 0, c)], count);
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) {
          float *o = dx + bp_sdk_offset(tx, n, h, w, c);
          *o = a.accumulate ? *o + share : share;
        }
    }
  return BP_ABI_OK;
}

#define POOL_MAX_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8))
#define POOL_ACC offsetof(bp_pool_attrs, accumulate)
#define GAP_ACC offsetof(bp_elementwise_attrs, accumulate)
static const ops_fp16_kernel maxpool_fwd16 =
    REF_FP16(maxpool_supports_fwd, maxpool_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel maxpool_bwd16 =
    REF_FP16(maxpool_supports_bwd, maxpool_run_bwd, POOL_ACC);
static const ops_fp16_kernel avgpool_fwd16 =
    REF_FP16(avgpool_supports_fwd, avgpool_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel avgpool_bwd16 =
    REF_FP16(avgpool_supports_bwd, avgpool_run_bwd, POOL_ACC);
static const ops_fp16_kernel gap_fwd16 =
    REF_FP16(gap_supports_fwd, gap_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gap_bwd16 = REF_FP16(gap_supports_bwd, gap_run_bwd, GAP_ACC);
const bp_abi_kernel ref_maxpool_fwd =
    REF_KERNEL16("maxpool.fwd", maxpool_fwd16, 0, POOL_MAX_DTYPES | REF_FP16_DTYPES);
const bp_abi_kernel ref_maxpool_bwd =
    REF_KERNEL16("maxpool.bwd", maxpool_bwd16, 0, POOL_MAX_DTYPES | REF_FP16_DTYPES);
const bp_abi_kernel ref_avgpool_fwd =
    REF_KERNEL16("avgpool.fwd", avgpool_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_avgpool_bwd =
    REF_KERNEL16("avgpool.bwd", avgpool_bwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_global_avgpool_fwd =
    REF_KERNEL16("global_avgpool.fwd", gap_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_global_avgpool_bwd =
    REF_KERNEL16("global_avgpool.bwd", gap_bwd16, 0, REF_FP16_DTYPES);
