/* Pooling reference kernels: max pool and average pool (forward/backward,
 * window kh x kw, stride, zero padding) and global average pool.
 *
 * Shape legend (bp_abi_ops.h):
 *   x    [N, H, W, C]
 *   y    [N, OH, OW, C]    OH = (H + 2*pad_h - kh) / stride_h + 1 (floor)
 *   mask [N, OH, OW, C]    INT8: index ky*kw + kx of the winning tap in its
 *                          window (window coordinates, padding included)
 * Window (oh, ow) covers rows oh*sh - ph + ky, ky < kh, and columns
 * ow*sw - pw + kx, kx < kw; rows and columns outside the input are padding.
 * The kernels require pad < kernel on each side, which keeps at least one
 * in-bounds tap in every window (so a max always exists and the in-bounds
 * count is never 0), and kh*kw <= 127 for max pool (the mask is int8).
 *
 * FP32 (mask INT8), any device strides that nest in NHWC order, padded
 * channels skipped; no alignment beyond the element size; the 16-byte tail
 * never read. Outputs never alias inputs. */
#include <stdint.h>

#include "reference-impl.h"

typedef enum pool_kind { POOL_MAX_FWD, POOL_MAX_BWD, POOL_AVG_FWD, POOL_AVG_BWD } pool_kind;

typedef struct pool_geom {
  const bp_abi_tensor *x, *y, *mask; /* x: dx and y: dy in the backward */
  int64_t n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw;
  int count_include_pad, accumulate;
} pool_geom;

static int pool_check(const bp_abi_kernel_args *args, pool_kind kind, pool_geom *g, char *reason,
                      size_t rs) {
  bp_pool_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (a.kernel_h < 1 || a.kernel_w < 1)
    return ref_fail(reason, rs, "kernel %dx%d: each side must be >= 1", a.kernel_h, a.kernel_w);
  if (a.stride_h < 1 || a.stride_w < 1)
    return ref_fail(reason, rs, "stride %dx%d: each must be >= 1", a.stride_h, a.stride_w);
  if (a.pad_h < 0 || a.pad_w < 0 || a.pad_h >= a.kernel_h || a.pad_w >= a.kernel_w)
    return ref_fail(reason, rs, "padding %dx%d: each must be >= 0 and < the kernel side", a.pad_h,
                    a.pad_w);
  const int is_max = kind == POOL_MAX_FWD || kind == POOL_MAX_BWD;
  if (is_max && (int64_t)a.kernel_h * a.kernel_w > INT8_MAX)
    return ref_fail(reason, rs, "window %dx%d has more than %d taps (the mask is int8)",
                    a.kernel_h, a.kernel_w, INT8_MAX);
  if (!ref_check_flag(a.count_include_pad, "count_include_pad", reason, rs) ||
      !ref_check_flag(a.accumulate, "accumulate", reason, rs))
    return 0;
  const int nin = kind == POOL_MAX_BWD ? 2 : 1, nout = kind == POOL_MAX_FWD ? 2 : 1;
  if (!ref_check_args(args, nin, nout, reason, rs)) return 0;
  const int fwd = kind == POOL_MAX_FWD || kind == POOL_AVG_FWD;
  g->x = fwd ? &args->inputs[0] : &args->outputs[0];
  g->y = fwd ? &args->outputs[0] : &args->inputs[0];
  g->mask = kind == POOL_MAX_FWD ? &args->outputs[1]
            : kind == POOL_MAX_BWD ? &args->inputs[1]
                                   : NULL;
  const char *xname = fwd ? "x" : "dx", *yname = fwd ? "y" : "dy";
  if (!ref_check_tensor(g->x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(g->y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      (g->mask && !ref_check_tensor(g->mask, "mask", BP_ABI_DTYPE_INT8, reason, rs)))
    return 0;
  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w = g->x->shape[2], g->c = g->x->shape[3];
  g->kh = a.kernel_h, g->kw = a.kernel_w, g->sh = a.stride_h, g->sw = a.stride_w;
  g->ph = a.pad_h, g->pw = a.pad_w;
  g->count_include_pad = a.count_include_pad, g->accumulate = a.accumulate;
  if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
    return ref_fail(reason, rs, "padded input %lldx%lld is smaller than the window %lldx%lld",
                    (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw),
                    (long long)g->kh, (long long)g->kw);
  g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
  g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
  if (!ref_check_shape(g->y, yname, g->n, g->oh, g->ow, g->c, reason, rs) ||
      (g->mask && !ref_check_shape(g->mask, "mask", g->n, g->oh, g->ow, g->c, reason, rs)))
    return 0;
  return 1;
}

static int maxpool_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_geom g;
  return pool_check(args, POOL_MAX_FWD, &g, reason, rs);
}
static int maxpool_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_geom g;
  return pool_check(args, POOL_MAX_BWD, &g, reason, rs);
}
static int avgpool_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_geom g;
  return pool_check(args, POOL_AVG_FWD, &g, reason, rs);
}
static int avgpool_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_geom g;
  return pool_check(args, POOL_AVG_BWD, &g, reason, rs);
}

/* In-bounds tap range of one window along one side: taps [k0, k1). */
static void pool_taps(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t extent,
                      int64_t *k0, int64_t *k1) {
  const int64_t start = o * stride - pad;
  *k0 = start < 0 ? -start : 0;
  *k1 = start + kernel > extent ? extent - start : kernel;
}

/* maxpool.fwd
 *   in: x   out: y, mask   (both overwritten; no accumulate in the forward)
 *   y = the largest in-bounds x of the window; padding never wins. Taps are
 *   scanned row-major (ky, then kx) and only a strictly larger value
 *   replaces the current one, so among ties the first tap in that order
 *   wins. A NaN wins over any number (the first NaN), so NaN propagates. */
static int maxpool_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  pool_geom g;
  char reason[REF_REASON_MAX];
  if (!pool_check(args, POOL_MAX_FWD, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0);
  float *y = ref_out(args, 0);
  int8_t *mask = (int8_t *)args->output_ptrs[1];
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        for (int64_t c = 0; c < g.c; c++) {
          float best = 0.0f;
          int64_t arg = -1;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++) {
              const float v = x[ref_off(g.x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c)];
              if (arg < 0 || v > best || (v != v && best == best)) {
                best = v;
                arg = ky * g.kw + kx;
              }
            }
          y[ref_off(g.y, n, oh, ow, c)] = best;
          mask[ref_off(g.mask, n, oh, ow, c)] = (int8_t)arg;
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
  pool_geom g;
  char reason[REF_REASON_MAX];
  if (!pool_check(args, POOL_MAX_BWD, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *dy = ref_in(args, 0);
  const int8_t *mask = (const int8_t *)args->input_ptrs[1];
  float *dx = ref_out(args, 0);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        for (int64_t c = 0; c < g.c; c++) {
          const int64_t m = mask[ref_off(g.mask, n, oh, ow, c)];
          if (m < 0 || m >= g.kh * g.kw || m / g.kw < ky0 || m / g.kw >= ky1 ||
              m % g.kw < kx0 || m % g.kw >= kx1)
            return BP_ABI_ERR_INVALID;
        }
      }
  if (!g.accumulate) ref_zero(g.x, dx);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++)
        for (int64_t c = 0; c < g.c; c++) {
          const int64_t m = mask[ref_off(g.mask, n, oh, ow, c)];
          const int64_t ih = oh * g.sh - g.ph + m / g.kw, iw = ow * g.sw - g.pw + m % g.kw;
          dx[ref_off(g.x, n, ih, iw, c)] += dy[ref_off(g.y, n, oh, ow, c)];
        }
  return BP_ABI_OK;
}

/* Divisor of window (oh, ow): the whole window, or its in-bounds taps. */
static double avg_divisor(const pool_geom *g, int64_t ky0, int64_t ky1, int64_t kx0,
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
  pool_geom g;
  char reason[REF_REASON_MAX];
  if (!pool_check(args, POOL_AVG_FWD, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0);
  float *y = ref_out(args, 0);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        const double div = avg_divisor(&g, ky0, ky1, kx0, kx1);
        for (int64_t c = 0; c < g.c; c++) {
          double sum = 0.0;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++)
              sum += x[ref_off(g.x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c)];
          y[ref_off(g.y, n, oh, ow, c)] = (float)(sum / div);
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
  pool_geom g;
  char reason[REF_REASON_MAX];
  if (!pool_check(args, POOL_AVG_BWD, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *dy = ref_in(args, 0);
  float *dx = ref_out(args, 0);
  if (!g.accumulate) ref_zero(g.x, dx);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        pool_taps(oh, g.sh, g.ph, g.kh, g.h, &ky0, &ky1);
        pool_taps(ow, g.sw, g.pw, g.kw, g.w, &kx0, &kx1);
        const double div = avg_divisor(&g, ky0, ky1, kx0, kx1);
        for (int64_t c = 0; c < g.c; c++) {
          const float share = (float)(dy[ref_off(g.y, n, oh, ow, c)] / div);
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++)
              dx[ref_off(g.x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c)] += share;
        }
      }
  return BP_ABI_OK;
}

/* global_avgpool: x [N,H,W,C] and y [N,1,1,C]; fwd: in x, out y;
 * bwd: in dy (y's shape), out dx (x's shape). */
static int gap_check(const bp_abi_kernel_args *args, int fwd, bp_elementwise_attrs *a,
                     const bp_abi_tensor **x, const bp_abi_tensor **y, char *reason, size_t rs) {
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, a, sizeof *a, reason, rs) ||
      !ref_check_flag(a->accumulate, "accumulate", reason, rs) ||
      !ref_check_args(args, 1, 1, reason, rs))
    return 0;
  *x = fwd ? &args->inputs[0] : &args->outputs[0];
  *y = fwd ? &args->outputs[0] : &args->inputs[0];
  const char *xname = fwd ? "x" : "dx", *yname = fwd ? "y" : "dy";
  if (!ref_check_tensor(*x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(*y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_shape(*y, yname, (*x)->shape[0], 1, 1, (*x)->shape[3], reason, rs))
    return 0;
  return 1;
}

static int gap_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return gap_check(args, 1, &a, &x, &y, reason, rs);
}
static int gap_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return gap_check(args, 0, &a, &x, &y, reason, rs);
}

/* global_avgpool.fwd
 *   in: x [N,H,W,C]   out: y [N,1,1,C] = mean of x over H*W, overwritten.
 *   Summed in double in (h, w) order, rounded once. */
static int gap_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *tx, *ty;
  char reason[REF_REASON_MAX];
  if (!gap_check(args, 1, &a, &tx, &ty, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0);
  float *y = ref_out(args, 0);
  const double count = (double)(tx->shape[1] * tx->shape[2]);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t c = 0; c < tx->shape[3]; c++) {
      double sum = 0.0;
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) sum += x[ref_off(tx, n, h, w, c)];
      y[ref_off(ty, n, 0, 0, c)] = (float)(sum / count);
    }
  return BP_ABI_OK;
}

/* global_avgpool.bwd
 *   in: dy [N,1,1,C]   out: dx [N,H,W,C] (+)= dy / (H*W)
 *   accumulate 0: overwritten, 1: added. */
static int gap_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *tx, *ty;
  char reason[REF_REASON_MAX];
  if (!gap_check(args, 0, &a, &tx, &ty, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *dy = ref_in(args, 0);
  float *dx = ref_out(args, 0);
  const double count = (double)(tx->shape[1] * tx->shape[2]);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t c = 0; c < tx->shape[3]; c++) {
      const float share = (float)(dy[ref_off(ty, n, 0, 0, c)] / count);
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) {
          float *o = dx + ref_off(tx, n, h, w, c);
          *o = a.accumulate ? *o + share : share;
        }
    }
  return BP_ABI_OK;
}

#define POOL_MAX_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8))
const bp_abi_kernel ref_maxpool_fwd =
    REF_KERNEL_DT("maxpool.fwd", maxpool_supports_fwd, maxpool_run_fwd, 0, POOL_MAX_DTYPES);
const bp_abi_kernel ref_maxpool_bwd =
    REF_KERNEL_DT("maxpool.bwd", maxpool_supports_bwd, maxpool_run_bwd, 0, POOL_MAX_DTYPES);
const bp_abi_kernel ref_avgpool_fwd =
    REF_KERNEL("avgpool.fwd", avgpool_supports_fwd, avgpool_run_fwd, 0);
const bp_abi_kernel ref_avgpool_bwd =
    REF_KERNEL("avgpool.bwd", avgpool_supports_bwd, avgpool_run_bwd, 0);
const bp_abi_kernel ref_global_avgpool_fwd =
    REF_KERNEL("global_avgpool.fwd", gap_supports_fwd, gap_run_fwd, 0);
const bp_abi_kernel ref_global_avgpool_bwd =
    REF_KERNEL("global_avgpool.bwd", gap_supports_bwd, gap_run_bwd, 0);
