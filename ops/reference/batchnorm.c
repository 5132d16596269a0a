/* Batch normalization reference: training forward (batch statistics, with
 * the running statistics updated), evaluation forward (running statistics)
 * and backward (through the batch statistics).
 *
 * Shapes, formulas, the checks and the per-channel steps:
 * ops/shared/batchnorm_steps.h (shared with ops/cpu, whose results are
 * bit-identical).
 *
 * FP32 tensors with device strides that nest in NHWC order (padded channels
 * skipped); no alignment beyond 4 bytes; the 16-byte tail never read.
 * Statistics are summed in double over the pixels in (n, h, w) order, one
 * block of up to 64 channels at a time (the double sums live on the
 * stack). No output aliases an input, except the running statistics of
 * fwd_train, which may be updated in place (output 3 the very same elements
 * as input 3, output 4 as input 4). */
#include "reference-impl.h"
#include "shared/batchnorm_steps.h"

#define BN_BLOCK OPS_BN_BLOCK

static int bn_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_TRAIN, &a, reason, rs);
}
static int bn_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_EVAL, &a, reason, rs);
}
static int bn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_BWD, &a, reason, rs);
}

/* y = x * scale[c] + shift[c] over channels [c0, c0+nb), in double. */
static void bn_apply(const bp_abi_tensor *tx, const float *x, const bp_abi_tensor *ty, float *y,
                     int64_t c0, int64_t nb, const double *scale, const double *shift) {
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++) {
        const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
        float *yr = y + bp_sdk_offset(ty, n, h, w, c0);
        for (int64_t j = 0; j < nb; j++)
          yr[j * ty->stride[3]] = bp_bn_apply(xr[j * tx->stride[3]], scale[j], shift[j]);
      }
}

/* batchnorm.fwd_train
 *   in:  x, gamma, beta, running_mean, running_var
 *   out: y, save_mean, save_invstd, running_mean, running_var
 *   y, save_mean and save_invstd are overwritten (no accumulate in the
 *   forward); the running statistics get the momentum update (batchnorm_steps.h; read
 *   from inputs 3 and 4, written to outputs 3 and 4, which may be the same
 *   elements). Two passes for the statistics (mean, then squared
 *   deviations), then y. Needs N*H*W >= 2. */
static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!ops_bn_check(args, OPS_BN_TRAIN, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 2, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *ty = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK] = {0}, var[BN_BLOCK] = {0}, scale[BN_BLOCK], shift[BN_BLOCK];
    for (int pass = 0; pass < 2; pass++) {
      for (int64_t n = 0; n < tx->shape[0]; n++)
        for (int64_t h = 0; h < tx->shape[1]; h++)
          for (int64_t w = 0; w < tx->shape[2]; w++) {
            const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
            for (int64_t j = 0; j < nb; j++) {
              const double v = xr[j * tx->stride[3]];
              if (pass == 0)
                mean[j] += v;
              else
                var[j] += (v - mean[j]) * (v - mean[j]);
            }
          }
      for (int64_t j = 0; j < nb; j++) {
        if (pass == 0)
          mean[j] /= (double)M;
        else
          var[j] /= (double)M;
      }
    }
    ops_bn_train_channels(args, &a, c0, nb, mean, var, scale, shift);
    bn_apply(tx, x, ty, bp_sdk_output_f32(args, 0), c0, nb, scale, shift);
  }
  return BP_ABI_OK;
}

/* batchnorm.fwd_eval
 *   in: x, gamma, beta, running_mean, running_var   out: y (overwritten)
 *   y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta, in
 *   double per element. */
static int bn_run_eval(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_bn_check(args, OPS_BN_EVAL, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0);
  const int64_t C = tx->shape[3];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double scale[BN_BLOCK], shift[BN_BLOCK];
    ops_bn_eval_channels(args, &a, c0, nb, scale, shift);
    bn_apply(tx, bp_sdk_input_f32(args, 0), bp_sdk_output(args, 0), bp_sdk_output_f32(args, 0),
             c0, nb, scale, shift);
  }
  return BP_ABI_OK;
}

/* batchnorm.bwd (through the batch statistics of fwd_train)
 *   in:  x, dy, gamma, save_mean, save_invstd   out: dx, dgamma, dbeta
 *   xhat = (x - save_mean) * save_invstd
 *   dbeta  (+)= sum dy          dgamma (+)= sum dy * xhat
 *   dx     (+)= gamma * save_invstd * (dy - sum dy / M - xhat * sum(dy*xhat) / M)
 *   accumulate 0: overwritten, 1: added. Sums in double; dx in double per
 *   element, rounded once (then added, with accumulate). */
static int bn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_bn_check(args, OPS_BN_BWD, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tdy = bp_sdk_input(args, 1);
  const bp_abi_tensor *tdx = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  const int64_t C = tx->shape[3];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK], invstd[BN_BLOCK], sdy[BN_BLOCK] = {0}, sdyx[BN_BLOCK] = {0};
    double k[BN_BLOCK];
    ops_bn_saved_stats(args, c0, nb, mean, invstd);
    for (int64_t n = 0; n < tx->shape[0]; n++)
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) {
          const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
          const float *dyr = dy + bp_sdk_offset(tdy, n, h, w, c0);
          for (int64_t j = 0; j < nb; j++) {
            const double g = dyr[j * tdy->stride[3]];
            sdy[j] += g;
            sdyx[j] += bp_bn_dy_xhat(g, xr[j * tx->stride[3]], mean[j], invstd[j]);
          }
        }
    ops_bn_bwd_channels(args, &a, c0, nb, invstd, sdy, sdyx, k);
    for (int64_t n = 0; n < tx->shape[0]; n++)
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) {
          const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
          const float *dyr = dy + bp_sdk_offset(tdy, n, h, w, c0);
          float *dxr = dx + bp_sdk_offset(tdx, n, h, w, c0);
          for (int64_t j = 0; j < nb; j++) {
            const double xhat = bp_bn_xhat(xr[j * tx->stride[3]], mean[j], invstd[j]);
            const float g = bp_bn_dx(k[j], dyr[j * tdy->stride[3]], xhat, sdy[j], sdyx[j]);
            float *o = dxr + j * tdx->stride[3];
            *o = a.accumulate ? *o + g : g;
          }
        }
  }
  return BP_ABI_OK;
}

/* fwd_train may update the running statistics in place (outputs 3, 4 the
 * very same elements as inputs 3, 4) */
static const ops_fp16_kernel bn_train16 =
    REF_FP16_ALIAS(bn_supports_train, bn_run_train, OPS_FP16_NO_ACCUMULATE, 2, 3, 3, 4, 4);
static const ops_fp16_kernel bn_eval16 =
    REF_FP16(bn_supports_eval, bn_run_eval, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel bn_bwd16 =
    REF_FP16(bn_supports_bwd, bn_run_bwd, offsetof(bp_batchnorm_attrs, accumulate));
const bp_abi_kernel ref_batchnorm_fwd_train =
    REF_KERNEL16("batchnorm.fwd_train", bn_train16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_batchnorm_fwd_eval =
    REF_KERNEL16("batchnorm.fwd_eval", bn_eval16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_batchnorm_bwd =
    REF_KERNEL16("batchnorm.bwd", bn_bwd16, 0, REF_FP16_DTYPES);
