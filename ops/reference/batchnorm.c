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
 * Statistics are summed in double in the chunked order of
 * batchnorm_steps.h, one block of up to 64 channels at a time (the double
 * sums live on the stack). No output aliases an input, except the running statistics of
 * fwd_train, which may be updated in place (output 3 the very same elements
 * as input 3, output 4 as input 4).
 *
 * batchnorm_relu.fwd_train, .fwd_eval and .bwd (y = relu(BN(x)), one pass)
 * are the same code with a relu flag: the forwards write
 * bp_relu_fwd(bp_bn_apply(...)); the backward takes the relu output y as
 * input 5 and uses bp_relu_bwd(y, dy) wherever batchnorm.bwd reads dy, the
 * very float an unfused relu.bwd would have stored, so the fused pair's
 * bits equal batchnorm then relu. FP32 only. */
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
static int bnr_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                              size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check_relu(args, OPS_BN_TRAIN, 1, &a, reason, rs);
}
static int bnr_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check_relu(args, OPS_BN_EVAL, 1, &a, reason, rs);
}
static int bnr_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check_relu(args, OPS_BN_BWD, 1, &a, reason, rs);
}

/* y = x * scale[c] + shift[c] over channels [c0, c0+nb), in double
 * (then relu'd, with relu). */
static void bn_apply(const bp_abi_tensor *tx, const float *x, const bp_abi_tensor *ty, float *y,
                     int64_t c0, int64_t nb, const double *scale, const double *shift, int relu) {
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++) {
        const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
        float *yr = y + bp_sdk_offset(ty, n, h, w, c0);
        for (int64_t j = 0; j < nb; j++) {
          const float v = bp_bn_apply(xr[j * tx->stride[3]], scale[j], shift[j]);
          yr[j * ty->stride[3]] = relu ? bp_relu_fwd(v) : v;
        }
      }
}

/* The gradient the normalization sees: dy, or with relu (yr the pixel's
 * relu output, element at yr[off]) relu.bwd's value. */
static float bn_grad(float dy, const float *yr, int64_t off) {
  return yr ? bp_relu_bwd(yr[off], dy) : dy;
}

/* Channel c0 of pixel p (in (n, h, w) order) of t. */
static int64_t bn_at(const bp_abi_tensor *t, int64_t p, int64_t c0) {
  const int64_t H = t->shape[1], W = t->shape[2];
  return bp_sdk_offset(t, p / (H * W), p / W % H, p % W, c0);
}

/* batchnorm.fwd_train
 *   in:  x, gamma, beta, running_mean, running_var
 *   out: y, save_mean, save_invstd, running_mean, running_var
 *   y, save_mean and save_invstd are overwritten (no accumulate in the
 *   forward); the running statistics get the momentum update (batchnorm_steps.h; read
 *   from inputs 3 and 4, written to outputs 3 and 4, which may be the same
 *   elements). One pass for the statistics (the shifted sums of
 *   batchnorm_steps.h, chunk by chunk), then y. Needs N*H*W >= 2. */
static int bn_train(const bp_abi_kernel_args *args, int relu) {
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!ops_bn_check_relu(args, OPS_BN_TRAIN, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 2, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *ty = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  const int64_t len = ops_bn_chunk_len(M);
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double K[BN_BLOCK], sd[BN_BLOCK] = {0}, sdd[BN_BLOCK] = {0}, mean[BN_BLOCK], var[BN_BLOCK];
    double scale[BN_BLOCK], shift[BN_BLOCK];
    for (int64_t j = 0; j < nb; j++) K[j] = x[bn_at(tx, 0, c0) + j * tx->stride[3]];
    for (int64_t p0 = 0; p0 < M; p0 += len) {
      const int64_t p1 = M - p0 < len ? M : p0 + len;
      double cd[BN_BLOCK] = {0}, cdd[BN_BLOCK] = {0};
      for (int64_t p = p0; p < p1; p++) {
        const float *xr = x + bn_at(tx, p, c0);
        for (int64_t j = 0; j < nb; j++) {
          const double d = xr[j * tx->stride[3]] - K[j];
          cd[j] += d;
          cdd[j] += d * d;
        }
      }
      for (int64_t j = 0; j < nb; j++) sd[j] += cd[j], sdd[j] += cdd[j];
    }
    for (int64_t j = 0; j < nb; j++) ops_bn_moments(K[j], sd[j], sdd[j], M, &mean[j], &var[j]);
    ops_bn_train_channels(args, &a, c0, nb, mean, var, scale, shift);
    bn_apply(tx, x, ty, bp_sdk_output_f32(args, 0), c0, nb, scale, shift, relu);
  }
  return BP_ABI_OK;
}

/* batchnorm.fwd_eval
 *   in: x, gamma, beta, running_mean, running_var   out: y (overwritten)
 *   y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta, in
 *   double per element. */
static int bn_eval(const bp_abi_kernel_args *args, int relu) {
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_bn_check_relu(args, OPS_BN_EVAL, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0);
  const int64_t C = tx->shape[3];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double scale[BN_BLOCK], shift[BN_BLOCK];
    ops_bn_eval_channels(args, &a, c0, nb, scale, shift);
    bn_apply(tx, bp_sdk_input_f32(args, 0), bp_sdk_output(args, 0), bp_sdk_output_f32(args, 0),
             c0, nb, scale, shift, relu);
  }
  return BP_ABI_OK;
}

/* batchnorm.bwd (through the batch statistics of fwd_train)
 *   in:  x, dy, gamma, save_mean, save_invstd   out: dx, dgamma, dbeta
 *   xhat = (x - save_mean) * save_invstd
 *   dbeta  (+)= sum dy          dgamma (+)= sum dy * xhat
 *   dx     (+)= gamma * save_invstd * (dy - sum dy / M - xhat * sum(dy*xhat) / M)
 *   accumulate 0: overwritten, 1: added. Sums in double (chunk by chunk,
 *   batchnorm_steps.h); dx in double per
 *   element, rounded once (then added, with accumulate). */
static int bn_bwd(const bp_abi_kernel_args *args, int relu) {
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_bn_check_relu(args, OPS_BN_BWD, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tdy = bp_sdk_input(args, 1);
  const bp_abi_tensor *tdx = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  const bp_abi_tensor *ty = relu ? bp_sdk_input(args, 5) : NULL; /* relu: y */
  const float *y = relu ? bp_sdk_input_f32(args, 5) : NULL;
  float *dx = bp_sdk_output_f32(args, 0);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  const int64_t len = ops_bn_chunk_len(M);
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK], invstd[BN_BLOCK], sdy[BN_BLOCK] = {0}, sdyx[BN_BLOCK] = {0};
    double k[BN_BLOCK];
    ops_bn_saved_stats(args, c0, nb, mean, invstd);
    for (int64_t p0 = 0; p0 < M; p0 += len) {
      const int64_t p1 = M - p0 < len ? M : p0 + len;
      double cdy[BN_BLOCK] = {0}, cdyx[BN_BLOCK] = {0};
      for (int64_t p = p0; p < p1; p++) {
        const float *xr = x + bn_at(tx, p, c0), *dyr = dy + bn_at(tdy, p, c0);
        const float *yr = relu ? y + bn_at(ty, p, c0) : NULL;
        for (int64_t j = 0; j < nb; j++) {
          const double g = bn_grad(dyr[j * tdy->stride[3]], yr, j * (relu ? ty->stride[3] : 0));
          cdy[j] += g;
          cdyx[j] += bp_bn_dy_xhat(g, xr[j * tx->stride[3]], mean[j], invstd[j]);
        }
      }
      for (int64_t j = 0; j < nb; j++) sdy[j] += cdy[j], sdyx[j] += cdyx[j];
    }
    ops_bn_bwd_channels(args, &a, c0, nb, invstd, sdy, sdyx, k);
    for (int64_t n = 0; n < tx->shape[0]; n++)
      for (int64_t h = 0; h < tx->shape[1]; h++)
        for (int64_t w = 0; w < tx->shape[2]; w++) {
          const float *xr = x + bp_sdk_offset(tx, n, h, w, c0);
          const float *dyr = dy + bp_sdk_offset(tdy, n, h, w, c0);
          const float *yr = relu ? y + bp_sdk_offset(ty, n, h, w, c0) : NULL;
          float *dxr = dx + bp_sdk_offset(tdx, n, h, w, c0);
          for (int64_t j = 0; j < nb; j++) {
            const double xhat = bp_bn_xhat(xr[j * tx->stride[3]], mean[j], invstd[j]);
            const float d = bn_grad(dyr[j * tdy->stride[3]], yr, j * (relu ? ty->stride[3] : 0));
            const float g = bp_bn_dx(k[j], d, xhat, sdy[j], sdyx[j]);
            float *o = dxr + j * tdx->stride[3];
            *o = a.accumulate ? *o + g : g;
          }
        }
  }
  return BP_ABI_OK;
}

static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_train(args, 0);
}
static int bn_run_eval(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_eval(args, 0);
}
static int bn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_bwd(args, 0);
}
static int bnr_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_train(args, 1);
}
static int bnr_run_eval(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_eval(args, 1);
}
static int bnr_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return bn_bwd(args, 1);
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
const bp_abi_kernel ref_batchnorm_relu_fwd_train =
    REF_KERNEL("batchnorm_relu.fwd_train", bnr_supports_train, bnr_run_train, 0);
const bp_abi_kernel ref_batchnorm_relu_fwd_eval =
    REF_KERNEL("batchnorm_relu.fwd_eval", bnr_supports_eval, bnr_run_eval, 0);
const bp_abi_kernel ref_batchnorm_relu_bwd =
    REF_KERNEL("batchnorm_relu.bwd", bnr_supports_bwd, bnr_run_bwd, 0);
