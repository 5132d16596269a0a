/* fully connected reference: forward, backward-data, backward-filter.
 *
 * Shape legend (bp_abi_ops.h):
 *   x  [N, H, W, C]     read as [N, F], F = H*W*C, feature f = (h*W + w)*C + c
 *                       (the logical NHWC order; channel padding skipped)
 *   w  [O, 1, 1, F]     one row of F weights per output
 *   b  [1, 1, 1, O]     bias (has_bias)
 *   y  [N, 1, 1, O]     y[n,o] = b[o] + sum_f x[n,f] * w[o,f]
 *
 * All tensors FP32 with device strides that nest in NHWC order; no
 * alignment beyond 4 bytes; the 16-byte tail is never read. Outputs never
 * alias inputs. */
#include "reference-impl.h"
#include "shared/weighted_check.h"

static int fc_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  ops_fc_geom g;
  return ops_fc_check(args, OPS_PASS_FWD, &g, reason, rs);
}
static int fc_supports_bwd_data(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  ops_fc_geom g;
  return ops_fc_check(args, OPS_PASS_BWD_DATA, &g, reason, rs);
}
static int fc_supports_bwd_filter(void *user, const bp_abi_kernel_args *args, char *reason,
                                  size_t rs) {
  (void)user;
  ops_fc_geom g;
  return ops_fc_check(args, OPS_PASS_BWD_FILTER, &g, reason, rs);
}

/* fc.fwd
 *   in:  x [N,H,W,C], w [O,1,1,F], b [1,1,1,O] (has_bias)   out: y [N,1,1,O]
 *   y is overwritten (no accumulate in the forward). Per (n,o): bias, then
 *   one dot product per (h,w) row of C channels (ref_dot), summed in
 *   double, rounded to float once. */
static int fc_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_fc_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_fc_check(args, OPS_PASS_FWD, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  const float *b = g.has_bias ? bp_sdk_input_f32(args, 2) : NULL;
  float *y = bp_sdk_output_f32(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t o = 0; o < g.o; o++) {
      double acc = b ? (double)b[o * g.b->stride[3]] : 0.0;
      for (int64_t h = 0; h < g.h; h++)
        for (int64_t iw = 0; iw < g.w_; iw++)
          acc += ref_dot(x + bp_sdk_offset(g.x, n, h, iw, 0), xs,
                         w + bp_sdk_offset(g.w, o, 0, 0, (h * g.w_ + iw) * g.c), ws, g.c);
      y[bp_sdk_offset(g.y, n, 0, 0, o)] = (float)acc;
    }
  return BP_ABI_OK;
}

/* fc.bwd_data
 *   in:  dy [N,1,1,O], w [O,1,1,F]   out: dx [N,H,W,C]
 *   dx[n,f] (+)= sum_o dy[n,o] * w[o,f]; accumulate 0: overwritten, 1:
 *   added. Summed in float straight into dx, o ascending. */
static int fc_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_fc_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_fc_check(args, OPS_PASS_BWD_DATA, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  if (!g.accumulate) bp_sdk_fill_f32(g.x, dx, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t o = 0; o < g.o; o++) {
      const float d = dy[bp_sdk_offset(g.y, n, 0, 0, o)];
      for (int64_t h = 0; h < g.h; h++)
        for (int64_t iw = 0; iw < g.w_; iw++)
          ref_axpy(dx + bp_sdk_offset(g.x, n, h, iw, 0), xs, d,
                   w + bp_sdk_offset(g.w, o, 0, 0, (h * g.w_ + iw) * g.c), ws, g.c);
    }
  return BP_ABI_OK;
}

/* fc.bwd_filter
 *   in:  x [N,H,W,C], dy [N,1,1,O]   out: dw [O,1,1,F], db [1,1,1,O] (has_bias)
 *   dw[o,f] (+)= sum_n dy[n,o] * x[n,f]   (float, straight into dw, n ascending)
 *   db[o]   (+)= sum_n dy[n,o]            (double, added once)
 *   accumulate 0: overwritten, 1: added. */
static int fc_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_fc_geom g;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_fc_check(args, OPS_PASS_BWD_FILTER, &g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dw = bp_sdk_output_f32(args, 0), *db = g.has_bias ? bp_sdk_output_f32(args, 1) : NULL;
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  if (!g.accumulate) bp_sdk_fill_f32(g.w, dw, 0.0f);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t o = 0; o < g.o; o++) {
      const float d = dy[bp_sdk_offset(g.y, n, 0, 0, o)];
      for (int64_t h = 0; h < g.h; h++)
        for (int64_t iw = 0; iw < g.w_; iw++)
          ref_axpy(dw + bp_sdk_offset(g.w, o, 0, 0, (h * g.w_ + iw) * g.c), ws, d,
                   x + bp_sdk_offset(g.x, n, h, iw, 0), xs, g.c);
    }
  if (db) {
    for (int64_t o = 0; o < g.o; o++) {
      double sum = 0.0;
      for (int64_t n = 0; n < g.n; n++) sum += dy[bp_sdk_offset(g.y, n, 0, 0, o)];
      float *p = db + o * g.b->stride[3];
      *p = g.accumulate ? (float)(*p + sum) : (float)sum;
    }
  }
  return BP_ABI_OK;
}

#define FC_ACC offsetof(bp_fc_attrs, accumulate)
static const ops_fp16_kernel fc_fwd16 =
    REF_FP16(fc_supports_fwd, fc_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel fc_bwd_data16 =
    REF_FP16(fc_supports_bwd_data, fc_run_bwd_data, FC_ACC);
static const ops_fp16_kernel fc_bwd_filter16 =
    REF_FP16(fc_supports_bwd_filter, fc_run_bwd_filter, FC_ACC);
const bp_abi_kernel ref_fc_fwd = REF_KERNEL16("fc.fwd", fc_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_fc_bwd_data =
    REF_KERNEL16("fc.bwd_data", fc_bwd_data16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_fc_bwd_filter =
    REF_KERNEL16("fc.bwd_filter", fc_bwd_filter16, 0, REF_FP16_DTYPES);
