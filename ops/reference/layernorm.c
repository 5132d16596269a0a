/* Layer normalization reference: forward (statistics per position over its
 * channels, saved for the backward) and backward.
 *
 * Shapes, formulas, the checks and the order of every sum:
 * ops/shared/layernorm_steps.h (shared with ops/cpu, whose results are
 * bit-identical); the per-element formulas are ops/shared/elem_math.h's
 * bp_ln_*. FP32 tensors with device strides that nest in NHWC order
 * (padded channels skipped); no alignment beyond 4 bytes; the 16-byte tail
 * never read. No output aliases an input. FP16 x, y, gain, bias, dy, dx,
 * dgain and dbias through the FP16 adapter; the saved statistics stay
 * FP32. */
#include "reference-impl.h"
#include "shared/layernorm_steps.h"

#define LN_BLOCK 64 /* channels of the parameter-gradient sums per pass (on the stack) */

static int ln_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ops_ln_check(args, OPS_LN_FWD, &a, reason, rs);
}
static int ln_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ops_ln_check(args, OPS_LN_BWD, &a, reason, rs);
}

/* Position p (in (n, h, w) order) of t, channel 0. */
static int64_t ln_at(const bp_abi_tensor *t, int64_t p) {
  const int64_t H = t->shape[1], W = t->shape[2];
  return bp_sdk_offset(t, p / (H * W), p / W % H, p % W, 0);
}

/* layernorm.fwd
 *   in:  x, gain, bias   out: y, save_mean, save_invstd (all overwritten)
 *   Per position: the statistics (ops_ln_stats), then y channel by
 *   channel (bp_ln_xhat, bp_ln_apply with the double mean and invstd);
 *   save_mean and save_invstd are those rounded to float. */
static int ln_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_layernorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ln_check(args, OPS_LN_FWD, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *ty = bp_sdk_output(args, 0);
  const bp_abi_tensor *tg = bp_sdk_input(args, 1), *tb = bp_sdk_input(args, 2);
  const bp_abi_tensor *tm = bp_sdk_output(args, 1), *ts = bp_sdk_output(args, 2);
  const float *x = bp_sdk_input_f32(args, 0), *gain = bp_sdk_input_f32(args, 1);
  const float *bias = bp_sdk_input_f32(args, 2);
  float *y = bp_sdk_output_f32(args, 0), *sm = bp_sdk_output_f32(args, 1);
  float *si = bp_sdk_output_f32(args, 2);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  for (int64_t p = 0; p < M; p++) {
    const float *xr = x + ln_at(tx, p);
    float *yr = y + ln_at(ty, p);
    double mean, invstd;
    ops_ln_stats(xr, tx->stride[3], C, a.eps, &mean, &invstd);
    for (int64_t c = 0; c < C; c++)
      yr[c * ty->stride[3]] = bp_ln_apply(bp_ln_xhat(xr[c * tx->stride[3]], mean, invstd),
                                          gain[c * tg->stride[3]], bias[c * tb->stride[3]]);
    sm[ln_at(tm, p)] = (float)mean;
    si[ln_at(ts, p)] = (float)invstd;
  }
  return BP_ABI_OK;
}

/* layernorm.bwd
 *   in:  x, dy, gain, save_mean, save_invstd   out: dx, dgain, dbias
 *   accumulate 0: overwritten, 1: added (dx in float, as the element-wise
 *   ops; dgain and dbias through bp_bn_param_grad, as batch norm's).
 *   dx per position (ops_ln_bwd_means, bp_ln_dx); then dgain = sum of
 *   dy * xhat and dbias = sum of dy over the positions, in the chunked
 *   order of layernorm_steps.h, LN_BLOCK channels at a time. */
static int ln_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_layernorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ln_check(args, OPS_LN_BWD, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tdy = bp_sdk_input(args, 1);
  const bp_abi_tensor *tg = bp_sdk_input(args, 2), *tm = bp_sdk_input(args, 3);
  const bp_abi_tensor *ts = bp_sdk_input(args, 4), *tdx = bp_sdk_output(args, 0);
  const bp_abi_tensor *tdg = bp_sdk_output(args, 1), *tdb = bp_sdk_output(args, 2);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  const float *gain = bp_sdk_input_f32(args, 2), *sm = bp_sdk_input_f32(args, 3);
  const float *si = bp_sdk_input_f32(args, 4);
  float *dx = bp_sdk_output_f32(args, 0), *dgain = bp_sdk_output_f32(args, 1);
  float *dbias = bp_sdk_output_f32(args, 2);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  const int64_t xs = tx->stride[3], dys = tdy->stride[3], gs = tg->stride[3];
  for (int64_t p = 0; p < M; p++) {
    const float *xr = x + ln_at(tx, p), *dyr = dy + ln_at(tdy, p);
    float *dxr = dx + ln_at(tdx, p);
    const double mean = sm[ln_at(tm, p)], invstd = si[ln_at(ts, p)];
    double mg, mgx;
    ops_ln_bwd_means(xr, xs, dyr, dys, gain, gs, C, mean, invstd, &mg, &mgx);
    for (int64_t c = 0; c < C; c++) {
      const float v = bp_ln_dx(invstd, bp_ln_g(dyr[c * dys], gain[c * gs]), mg,
                               bp_ln_xhat(xr[c * xs], mean, invstd), mgx);
      float *o = dxr + c * tdx->stride[3];
      *o = a.accumulate ? *o + v : v;
    }
  }
  const int64_t len = ops_ln_chunk_len(M);
  for (int64_t c0 = 0; c0 < C; c0 += LN_BLOCK) {
    const int64_t nb = C - c0 < LN_BLOCK ? C - c0 : LN_BLOCK;
    double sdyx[LN_BLOCK] = {0}, sdy[LN_BLOCK] = {0};
    for (int64_t p0 = 0; p0 < M; p0 += len) {
      const int64_t p1 = M - p0 < len ? M : p0 + len;
      double cdyx[LN_BLOCK] = {0}, cdy[LN_BLOCK] = {0};
      for (int64_t p = p0; p < p1; p++) {
        const float *xr = x + ln_at(tx, p) + c0 * xs, *dyr = dy + ln_at(tdy, p) + c0 * dys;
        const double mean = sm[ln_at(tm, p)], invstd = si[ln_at(ts, p)];
        for (int64_t j = 0; j < nb; j++) {
          const double d = dyr[j * dys];
          cdyx[j] += d * bp_ln_xhat(xr[j * xs], mean, invstd);
          cdy[j] += d;
        }
      }
      for (int64_t j = 0; j < nb; j++) sdyx[j] += cdyx[j], sdy[j] += cdy[j];
    }
    for (int64_t j = 0; j < nb; j++) {
      float *pg = dgain + (c0 + j) * tdg->stride[3], *pb = dbias + (c0 + j) * tdb->stride[3];
      *pg = bp_bn_param_grad(*pg, sdyx[j], a.accumulate);
      *pb = bp_bn_param_grad(*pb, sdy[j], a.accumulate);
    }
  }
  return BP_ABI_OK;
}

static const ops_fp16_kernel ln_fwd16 =
    REF_FP16(ln_supports_fwd, ln_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel ln_bwd16 =
    REF_FP16(ln_supports_bwd, ln_run_bwd, offsetof(bp_layernorm_attrs, accumulate));
const bp_abi_kernel ref_layernorm_fwd =
    REF_KERNEL16("layernorm.fwd", ln_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_layernorm_bwd =
    REF_KERNEL16("layernorm.bwd", ln_bwd16, 0, REF_FP16_DTYPES);
