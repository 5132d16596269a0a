/* conv2d reference: forward, backward-data, backward-filter, with stride,
 * zero padding, dilation, groups and an optional bias.
 *
 * Shape legend (bp_abi_ops.h):
 *   x  [N, H, W, C]          input
 *   w  [K, kh, kw, C/G]      filters; filter k sees the input channels of its
 *                            group g = k / (K/G): c in [g*C/G, (g+1)*C/G)
 *   b  [1, 1, 1, K]          bias (has_bias)
 *   y  [N, OH, OW, K]        OH = (H + 2*pad_h - (dil_h*(kh-1)+1)) / stride_h + 1
 *
 *   y[n,oh,ow,k] = b[k] + sum_{ky,kx,c} x[n, oh*sh - ph + ky*dh, ow*sw - pw + kx*dw, g*C/G + c]
 *                                       * w[k, ky, kx, c]
 * with x read as 0 outside [0,H) x [0,W) (zero padding).
 *
 * All tensors FP32 with any device strides that nest in NHWC order (padded
 * channels skipped); no alignment beyond 4 bytes; the 16-byte tail is never
 * read. Outputs never alias inputs. */
#include "reference-impl.h"
#include "shared/weighted_check.h"

static int conv_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  ops_conv_geom g;
  return ops_conv_check(args, OPS_PASS_FWD, &g, reason, rs);
}
static int conv_supports_bwd_data(void *user, const bp_abi_kernel_args *args, char *reason,
                                  size_t rs) {
  (void)user;
  ops_conv_geom g;
  return ops_conv_check(args, OPS_PASS_BWD_DATA, &g, reason, rs);
}
static int conv_supports_bwd_filter(void *user, const bp_abi_kernel_args *args, char *reason,
                                    size_t rs) {
  (void)user;
  ops_conv_geom g;
  return ops_conv_check(args, OPS_PASS_BWD_FILTER, &g, reason, rs);
}

/* The output row (or column) o whose tap k lands on input row i:
 * o*stride - pad + k*dil == i. Returns 1 and o when such an o exists in
 * [0, limit), else 0. */
static int conv_tap(int64_t i, int64_t pad, int64_t k, int64_t dil, int64_t stride,
                    int64_t limit, int64_t *o) {
  int64_t t = i + pad - k * dil;
  if (t < 0 || t % stride != 0 || t / stride >= limit) return 0;
  *o = t / stride;
  return 1;
}

/* conv2d.fwd
 *   in:  x [N,H,W,C], w [K,kh,kw,C/G], b [1,1,1,K] (has_bias)   out: y [N,OH,OW,K]
 *   y is overwritten (accumulate is ignored: the forward has no accumulate).
 *   Each output element is one sum: per tap a dot product over the group's
 *   channels (ref_dot: eight float lanes, then double), taps summed in
 *   double, bias first; rounded to float once. */
static int conv_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_conv_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_conv_check(args, OPS_PASS_FWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  const float *b = g.has_bias ? bp_sdk_input_f32(args, 2) : NULL;
  float *y = bp_sdk_output_f32(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++)
        for (int64_t k = 0; k < g.k; k++) {
          const int64_t c0 = k / g.kg * g.cg; /* first input channel of k's group */
          double acc = b ? (double)b[k * g.b->stride[3]] : 0.0;
          for (int64_t ky = 0; ky < g.kh; ky++) {
            const int64_t ih = oh * g.sh - g.ph + ky * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            for (int64_t kx = 0; kx < g.kw; kx++) {
              const int64_t iw = ow * g.sw - g.pw + kx * g.dw;
              if (iw < 0 || iw >= g.w_) continue;
              acc += ref_dot(x + bp_sdk_offset(g.x, n, ih, iw, c0), xs,
                             w + bp_sdk_offset(g.w, k, ky, kx, 0), ws, g.cg);
            }
          }
          y[bp_sdk_offset(g.y, n, oh, ow, k)] = (float)acc;
        }
  return BP_ABI_OK;
}

/* conv2d.bwd_data
 *   in:  dy [N,OH,OW,K], w [K,kh,kw,C/G]   out: dx [N,H,W,C]
 *   dx[n,ih,iw,g*C/G+c] (+)= sum over the taps (ky,kx) that reach (ih,iw)
 *   from an output (oh,ow) and over the group's filters k of
 *   dy[n,oh,ow,k] * w[k,ky,kx,c].
 *   accumulate 0: dx is overwritten; 1: the sum is added to dx. Summed in
 *   float straight into dx, in the fixed order (ky, kx, k, c). */
static int conv_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_conv_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_conv_check(args, OPS_PASS_BWD_DATA, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  if (!g.accumulate) bp_sdk_fill_f32(g.x, dx, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t ih = 0; ih < g.h; ih++)
      for (int64_t iw = 0; iw < g.w_; iw++)
        for (int64_t ky = 0; ky < g.kh; ky++) {
          int64_t oh;
          if (!conv_tap(ih, g.ph, ky, g.dh, g.sh, g.oh, &oh)) continue;
          for (int64_t kx = 0; kx < g.kw; kx++) {
            int64_t ow;
            if (!conv_tap(iw, g.pw, kx, g.dw, g.sw, g.ow, &ow)) continue;
            const float *dyrow = dy + bp_sdk_offset(g.y, n, oh, ow, 0);
            for (int64_t gi = 0, k = 0; gi < g.groups; gi++) {
              float *dxrow = dx + bp_sdk_offset(g.x, n, ih, iw, gi * g.cg);
              for (int64_t kk = 0; kk < g.kg; kk++, k++)
                ref_axpy(dxrow, xs, dyrow[k * g.y->stride[3]], w + bp_sdk_offset(g.w, k, ky, kx, 0),
                         ws, g.cg);
            }
          }
        }
  return BP_ABI_OK;
}

/* conv2d.bwd_filter
 *   in:  x [N,H,W,C], dy [N,OH,OW,K]   out: dw [K,kh,kw,C/G], db [1,1,1,K] (has_bias)
 *   dw[k,ky,kx,c] (+)= sum_{n,oh,ow} dy[n,oh,ow,k] * x[n, ih, iw, g*C/G+c] over in-bounds taps
 *   db[k]         (+)= sum_{n,oh,ow} dy[n,oh,ow,k]
 *   accumulate 0: overwritten; 1: added. dw is summed in float straight
 *   into dw in the order (n, oh, ow, ky, kx, k, c); db in double, added once. */
static int conv_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_conv_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_conv_check(args, OPS_PASS_BWD_FILTER, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dw = bp_sdk_output_f32(args, 0), *db = g.has_bias ? bp_sdk_output_f32(args, 1) : NULL;
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3], ys = g.y->stride[3];
  if (!g.accumulate) bp_sdk_fill_f32(g.w, dw, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        const float *dyrow = dy + bp_sdk_offset(g.y, n, oh, ow, 0);
        for (int64_t ky = 0; ky < g.kh; ky++) {
          const int64_t ih = oh * g.sh - g.ph + ky * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t kx = 0; kx < g.kw; kx++) {
            const int64_t iw = ow * g.sw - g.pw + kx * g.dw;
            if (iw < 0 || iw >= g.w_) continue;
            for (int64_t gi = 0, k = 0; gi < g.groups; gi++) {
              const float *xrow = x + bp_sdk_offset(g.x, n, ih, iw, gi * g.cg);
              for (int64_t kk = 0; kk < g.kg; kk++, k++)
                ref_axpy(dw + bp_sdk_offset(g.w, k, ky, kx, 0), ws, dyrow[k * ys], xrow, xs, g.cg);
            }
          }
        }
      }
  if (db) {
    for (int64_t k = 0; k < g.k; k++) {
      double sum = 0.0;
      for (int64_t n = 0; n < g.n; n++)
        for (int64_t oh = 0; oh < g.oh; oh++)
          for (int64_t ow = 0; ow < g.ow; ow++) sum += dy[bp_sdk_offset(g.y, n, oh, ow, k)];
      float *o = db + k * g.b->stride[3];
      *o = g.accumulate ? (float)(*o + sum) : (float)sum;
    }
  }
  return BP_ABI_OK;
}

#define CONV_ACC offsetof(bp_conv2d_attrs, accumulate)
static const ops_fp16_kernel conv_fwd16 =
    REF_FP16(conv_supports_fwd, conv_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel conv_bwd_data16 =
    REF_FP16(conv_supports_bwd_data, conv_run_bwd_data, CONV_ACC);
static const ops_fp16_kernel conv_bwd_filter16 =
    REF_FP16(conv_supports_bwd_filter, conv_run_bwd_filter, CONV_ACC);
const bp_abi_kernel ref_conv2d_fwd = REF_KERNEL16("conv2d.fwd", conv_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_conv2d_bwd_data =
    REF_KERNEL16("conv2d.bwd_data", conv_bwd_data16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_conv2d_bwd_filter =
    REF_KERNEL16("conv2d.bwd_filter", conv_bwd_filter16, 0, REF_FP16_DTYPES);
