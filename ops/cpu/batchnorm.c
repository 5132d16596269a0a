/* batchnorm.fwd_train, batchnorm.fwd_eval and batchnorm.bwd, vectorized
 * across channels; bit-identical to bn_run_train, bn_run_eval and
 * bn_run_bwd of ops/reference/batchnorm.c (formulas and shapes there).
 *
 * The reference already walks the pixels in (n, h, w) order with the
 * channels of a block of up to 64 innermost, summing in double per
 * channel; here that channel loop runs over contiguous memory, so each
 * SIMD lane is one channel and every per-channel sum still takes its
 * pixels in the reference's order. Every per-element formula is the
 * reference's, with the same double and float operations in the same
 * order (no contraction: -ffp-contract=off); the per-channel scalars
 * (sqrt, running statistics, dgamma and dbeta) are the reference's own
 * functions (ops_bn_*, ops/shared/batchnorm_steps.h), and so are the checks.
 *
 * Layouts: any strides the reference takes, provided the x-shaped tensors
 * (x, y, dy, dx) have contiguous channels (stride[3] 1, padded channels
 * allowed; or C 1); others are refused with a reason and the reference
 * serves them. The [1,1,1,C] tensors may have any channel stride. No
 * x-shaped output overlaps an input (bp_sdk_check_ptrs), hence restrict; the
 * running statistics (which may be updated in place) are only touched by
 * the scalar code. */
#include "cpu-impl.h"
#include "shared/batchnorm_steps.h"

#define BN_BLOCK OPS_BN_BLOCK /* channels per pass over the pixels, as in the reference */

/* The pixels of the x-shaped tensors: extents and the strides of up to
 * three of them (a: x, b: y or dy, c: dx). */
typedef struct bn_pixels {
  int64_t n, h, w;
  const bp_abi_tensor *a, *b, *c;
} bn_pixels;

/* The reference's checks (the same reasons), then contiguous channels in
 * the x-shaped tensors. */
static int bn_check(const bp_abi_kernel_args *args, ops_bn_pass pass, bp_batchnorm_attrs *a,
                    char *reason, size_t rs) {
  if (!ops_bn_check(args, pass, a, reason, rs) ||
      !cpu_channels_contiguous(bp_sdk_input(args, 0), "x", reason, rs))
    return 0;
  if (pass == OPS_BN_BWD && !cpu_channels_contiguous(bp_sdk_input(args, 1), "dy", reason, rs))
    return 0;
  return cpu_channels_contiguous(bp_sdk_output(args, 0), pass == OPS_BN_BWD ? "dx" : "y", reason,
                                 rs);
}

/* ---- loops ---------------------------------------------------------------- */

/* Pass 0 of the statistics: sum[j] += x over the pixels. */
CPU_INLINE void bn_sum_loop_body(const bn_pixels *p, const float *restrict x, int64_t nb,
                                 double *restrict sum) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) sum[j] += (double)xr[j];
      }
}
CPU_DISPATCH(bn_sum_loop,
             (const bn_pixels *p, const float *restrict x, int64_t nb, double *restrict sum),
             (p, x, nb, sum))

/* Pass 1: var[j] += (x - mean)^2, as the reference writes it. */
CPU_INLINE void bn_sqdev_loop_body(const bn_pixels *p, const float *restrict x, int64_t nb,
                                   const double *restrict mean, double *restrict var) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) {
          const double v = xr[j];
          var[j] += (v - mean[j]) * (v - mean[j]);
        }
      }
}
CPU_DISPATCH(bn_sqdev_loop,
             (const bn_pixels *p, const float *restrict x, int64_t nb,
              const double *restrict mean, double *restrict var),
             (p, x, nb, mean, var))

/* y = x * scale + shift in double, rounded once (the reference's bn_apply). */
CPU_INLINE void bn_apply_loop_body(const bn_pixels *p, const float *restrict x,
                                   float *restrict y, int64_t nb, const double *restrict scale,
                                   const double *restrict shift) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        float *yr = y + bp_sdk_offset(p->b, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) yr[j] = (float)(xr[j] * scale[j] + shift[j]);
      }
}
CPU_DISPATCH(bn_apply_loop,
             (const bn_pixels *p, const float *restrict x, float *restrict y, int64_t nb,
              const double *restrict scale, const double *restrict shift),
             (p, x, y, nb, scale, shift))

/* The backward's sums: sdy += dy, sdyx += dy * (x - mean) * invstd. */
CPU_INLINE void bn_bwd_sums_loop_body(const bn_pixels *p, const float *restrict x,
                                      const float *restrict dy, int64_t nb,
                                      const double *restrict mean, const double *restrict invstd,
                                      double *restrict sdy, double *restrict sdyx) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        const float *dyr = dy + bp_sdk_offset(p->b, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) {
          const double g = dyr[j];
          sdy[j] += g;
          sdyx[j] += g * (xr[j] - mean[j]) * invstd[j];
        }
      }
}
CPU_DISPATCH(bn_bwd_sums_loop,
             (const bn_pixels *p, const float *restrict x, const float *restrict dy, int64_t nb,
              const double *restrict mean, const double *restrict invstd, double *restrict sdy,
              double *restrict sdyx),
             (p, x, dy, nb, mean, invstd, sdy, sdyx))

/* dx (+)= (float)(k * (dy - sdy/M - xhat * sdyx/M)); one loop per mode. */
CPU_INLINE void bn_bwd_dx_mode(const bn_pixels *p, const float *restrict x,
                               const float *restrict dy, float *restrict dx, int64_t nb,
                               const double *restrict mean, const double *restrict invstd,
                               const double *restrict k, const double *restrict sdy,
                               const double *restrict sdyx, int accumulate) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        const float *dyr = dy + bp_sdk_offset(p->b, n, h, w, 0);
        float *dxr = dx + bp_sdk_offset(p->c, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) {
          const double xhat = (xr[j] - mean[j]) * invstd[j];
          const float g = (float)(k[j] * (dyr[j] - sdy[j] - xhat * sdyx[j]));
          dxr[j] = accumulate ? dxr[j] + g : g;
        }
      }
}
CPU_INLINE void bn_bwd_dx_loop_body(const bn_pixels *p, const float *restrict x,
                                    const float *restrict dy, float *restrict dx, int64_t nb,
                                    const double *restrict mean, const double *restrict invstd,
                                    const double *restrict k, const double *restrict sdy,
                                    const double *restrict sdyx, int accumulate) {
  if (accumulate) bn_bwd_dx_mode(p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, 1);
  else bn_bwd_dx_mode(p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, 0);
}
CPU_DISPATCH(bn_bwd_dx_loop,
             (const bn_pixels *p, const float *restrict x, const float *restrict dy,
              float *restrict dx, int64_t nb, const double *restrict mean,
              const double *restrict invstd, const double *restrict k,
              const double *restrict sdy, const double *restrict sdyx, int accumulate),
             (p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, accumulate))

/* ---- kernels ---------------------------------------------------------------- */

static int bn_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_TRAIN, &a, reason, rs);
}
static int bn_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_EVAL, &a, reason, rs);
}
static int bn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_BWD, &a, reason, rs);
}

/* batchnorm.fwd_train  in: x, gamma, beta, running_mean, running_var
 *                      out: y, save_mean, save_invstd, running_mean, running_var
 * (outputs 3 and 4 may be inputs 3 and 4 themselves). */
static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!bn_check(args, OPS_BN_TRAIN, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 2, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0);
  const float *x = bp_sdk_input_f32(args, 0);
  const int64_t C = tx->shape[3], M = tx->shape[0] * tx->shape[1] * tx->shape[2];
  const bn_pixels px = {tx->shape[0], tx->shape[1], tx->shape[2], tx, bp_sdk_output(args, 0), NULL};
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK] = {0}, var[BN_BLOCK] = {0}, scale[BN_BLOCK], shift[BN_BLOCK];
    bn_sum_loop(&px, x + c0, nb, mean);
    for (int64_t j = 0; j < nb; j++) mean[j] /= (double)M;
    bn_sqdev_loop(&px, x + c0, nb, mean, var);
    for (int64_t j = 0; j < nb; j++) var[j] /= (double)M;
    ops_bn_train_channels(args, &a, c0, nb, mean, var, scale, shift); /* the reference's own */
    bn_apply_loop(&px, x + c0, bp_sdk_output_f32(args, 0) + c0, nb, scale, shift);
  }
  return BP_ABI_OK;
}

/* batchnorm.fwd_eval  in: x, gamma, beta, running_mean, running_var   out: y. */
static int bn_run_eval(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_EVAL, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0);
  const int64_t C = tx->shape[3];
  const bn_pixels px = {tx->shape[0], tx->shape[1], tx->shape[2], tx, bp_sdk_output(args, 0), NULL};
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double scale[BN_BLOCK], shift[BN_BLOCK];
    ops_bn_eval_channels(args, &a, c0, nb, scale, shift);
    bn_apply_loop(&px, bp_sdk_input_f32(args, 0) + c0, bp_sdk_output_f32(args, 0) + c0, nb, scale,
                  shift);
  }
  return BP_ABI_OK;
}

/* batchnorm.bwd  in: x, dy, gamma, save_mean, save_invstd
 *                out: dx, dgamma, dbeta (accumulate 0: overwritten, 1: added). */
static int bn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_BWD, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  const int64_t C = tx->shape[3];
  const bn_pixels px = {tx->shape[0], tx->shape[1], tx->shape[2], tx, bp_sdk_input(args, 1),
                        bp_sdk_output(args, 0)};
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK], invstd[BN_BLOCK], sdy[BN_BLOCK] = {0}, sdyx[BN_BLOCK] = {0};
    double k[BN_BLOCK];
    ops_bn_saved_stats(args, c0, nb, mean, invstd);
    bn_bwd_sums_loop(&px, x + c0, dy + c0, nb, mean, invstd, sdy, sdyx);
    ops_bn_bwd_channels(args, &a, c0, nb, invstd, sdy, sdyx, k); /* the reference's own */
    bn_bwd_dx_loop(&px, x + c0, dy + c0, dx + c0, nb, mean, invstd, k, sdy, sdyx, a.accumulate);
  }
  return BP_ABI_OK;
}

/* FP16 through the adapter; fwd_train may update the running statistics
 * in place (outputs 3, 4 the very same elements as inputs 3, 4) */
static const ops_fp16_kernel bn_train16 =
    CPU_FP16_ALIAS(bn_supports_train, bn_run_train, OPS_FP16_NO_ACCUMULATE, 2, 3, 3, 4, 4);
static const ops_fp16_kernel bn_eval16 =
    CPU_FP16(bn_supports_eval, bn_run_eval, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel bn_bwd16 =
    CPU_FP16(bn_supports_bwd, bn_run_bwd, offsetof(bp_batchnorm_attrs, accumulate));
const bp_abi_kernel cpu_batchnorm_fwd_train =
    CPU_KERNEL16("batchnorm.fwd_train", bn_train16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_batchnorm_fwd_eval =
    CPU_KERNEL16("batchnorm.fwd_eval", bn_eval16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_batchnorm_bwd = CPU_KERNEL16("batchnorm.bwd", bn_bwd16, 0, CPU_FP16_DTYPES);
