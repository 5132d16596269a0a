/* Argument checks and window geometry of max and average pooling, shared
 * by the in-tree implementations (ops/reference, ops/cpu), so all accept
 * the same nodes with the same reasons and walk the same taps.
 * Header-only (static inline), on the module SDK.
 *
 * Shape legend (bp_abi_ops.h):
 *   x    [N, H, W, C]
 *   y    [N, OH, OW, C]    OH = (H + 2*pad_h - kh) / stride_h + 1 (floor)
 *   mask [N, OH, OW, C]    INT8: index ky*kw + kx of the winning tap in its
 *                          window (window coordinates, padding included)
 * Window (oh, ow) covers rows oh*sh - ph + ky, ky < kh, and columns
 * ow*sw - pw + kx, kx < kw; rows and columns outside the input are padding.
 * The checks require pad < kernel on each side, which keeps at least one
 * in-bounds tap in every window (so a max always exists and the in-bounds
 * count is never 0), and kh*kw <= 127 for max pool (the mask is int8).
 * Global average pooling's check (ops_gap_check) is here too. */
#ifndef BP_OPS_SHARED_POOL_CHECK_H
#define BP_OPS_SHARED_POOL_CHECK_H

#include "bp_abi_sdk.h"
#include "elem_math.h"

typedef enum ops_pool_kind {
  OPS_POOL_MAX_FWD,
  OPS_POOL_MAX_BWD,
  OPS_POOL_AVG_FWD,
  OPS_POOL_AVG_BWD
} ops_pool_kind;

/* The checked geometry of one call; x stands for dx and y for dy in the
 * backward ops. mask is NULL for average pooling. */
typedef struct ops_pool_geom {
  const bp_abi_tensor *x, *y, *mask;
  int64_t n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw;
  int count_include_pad, accumulate;
} ops_pool_geom;

static inline int ops_pool_check(const bp_abi_kernel_args *args, ops_pool_kind kind,
                                 ops_pool_geom *g, char *reason, size_t rs) {
  bp_pool_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (a.kernel_h < 1 || a.kernel_w < 1)
    return bp_sdk_fail(reason, rs, "kernel %dx%d: each side must be >= 1", a.kernel_h,
                       a.kernel_w);
  if (a.stride_h < 1 || a.stride_w < 1)
    return bp_sdk_fail(reason, rs, "stride %dx%d: each must be >= 1", a.stride_h, a.stride_w);
  if (a.pad_h < 0 || a.pad_w < 0 || a.pad_h >= a.kernel_h || a.pad_w >= a.kernel_w)
    return bp_sdk_fail(reason, rs, "padding %dx%d: each must be >= 0 and < the kernel side",
                       a.pad_h, a.pad_w);
  const int is_max = kind == OPS_POOL_MAX_FWD || kind == OPS_POOL_MAX_BWD;
  if (is_max && (int64_t)a.kernel_h * a.kernel_w > INT8_MAX)
    return bp_sdk_fail(reason, rs, "window %dx%d has more than %d taps (the mask is int8)",
                       a.kernel_h, a.kernel_w, INT8_MAX);
  if (!bp_sdk_check_flag(a.count_include_pad, "count_include_pad", reason, rs) ||
      !bp_sdk_check_flag(a.accumulate, "accumulate", reason, rs))
    return 0;
  const int nin = kind == OPS_POOL_MAX_BWD ? 2 : 1, nout = kind == OPS_POOL_MAX_FWD ? 2 : 1;
  if (!bp_sdk_check_args(args, nin, nout, reason, rs)) return 0;
  const int fwd = kind == OPS_POOL_MAX_FWD || kind == OPS_POOL_AVG_FWD;
  g->x = fwd ? bp_sdk_input(args, 0) : bp_sdk_output(args, 0);
  g->y = fwd ? bp_sdk_output(args, 0) : bp_sdk_input(args, 0);
  g->mask = kind == OPS_POOL_MAX_FWD   ? bp_sdk_output(args, 1)
            : kind == OPS_POOL_MAX_BWD ? bp_sdk_input(args, 1)
                                       : NULL;
  const char *xname = fwd ? "x" : "dx", *yname = fwd ? "y" : "dy";
  if (!bp_sdk_check_tensor(g->x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_tensor(g->y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      (g->mask && !bp_sdk_check_tensor(g->mask, "mask", BP_ABI_DTYPE_INT8, reason, rs)))
    return 0;
  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w = g->x->shape[2], g->c = g->x->shape[3];
  g->kh = a.kernel_h, g->kw = a.kernel_w, g->sh = a.stride_h, g->sw = a.stride_w;
  g->ph = a.pad_h, g->pw = a.pad_w;
  g->count_include_pad = a.count_include_pad, g->accumulate = a.accumulate;
  if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
    return bp_sdk_fail(reason, rs, "padded input %lldx%lld is smaller than the window %lldx%lld",
                       (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw),
                       (long long)g->kh, (long long)g->kw);
  g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
  g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
  return bp_sdk_check_shape(g->y, yname, g->n, g->oh, g->ow, g->c, reason, rs) &&
         (!g->mask || bp_sdk_check_shape(g->mask, "mask", g->n, g->oh, g->ow, g->c, reason, rs));
}

/* In-bounds tap range of one window along one side: taps [k0, k1) of the
 * window of output o. */
static inline void ops_pool_taps(int64_t o, int64_t stride, int64_t pad, int64_t kernel,
                                 int64_t extent, int64_t *k0, int64_t *k1) {
  bp_pool_taps(o, stride, pad, kernel, extent, k0, k1); /* shared with ops/cuda */
}

/* 1 when mask value m names an in-bounds tap of its window (taps [ky0,
 * ky1) x [kx0, kx1) of a kh x kw window): what maxpool.bwd checks before it
 * writes anything. */
static inline int ops_pool_mask_ok(int64_t m, int64_t kh, int64_t kw, int64_t ky0, int64_t ky1,
                                   int64_t kx0, int64_t kx1) {
  return m >= 0 && m < kh * kw && m / kw >= ky0 && m / kw < ky1 && m % kw >= kx0 && m % kw < kx1;
}

/* global_avgpool (bp_elementwise_attrs): x [N,H,W,C] and y [N,1,1,C];
 * fwd: in x, out y; bwd: in dy (y's shape), out dx (x's shape). *x and *y
 * are x and y (dx and dy in the backward). */
static inline int ops_gap_check(const bp_abi_kernel_args *args, int fwd,
                                bp_elementwise_attrs *a, const bp_abi_tensor **x,
                                const bp_abi_tensor **y, char *reason, size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs) ||
      !bp_sdk_check_flag(a->accumulate, "accumulate", reason, rs) ||
      !bp_sdk_check_args(args, 1, 1, reason, rs))
    return 0;
  *x = fwd ? bp_sdk_input(args, 0) : bp_sdk_output(args, 0);
  *y = fwd ? bp_sdk_output(args, 0) : bp_sdk_input(args, 0);
  const char *xname = fwd ? "x" : "dx", *yname = fwd ? "y" : "dy";
  if (!bp_sdk_check_tensor(*x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_tensor(*y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_shape(*y, yname, (*x)->shape[0], 1, 1, (*x)->shape[3], reason, rs))
    return 0;
  return 1;
}

#endif
