/* Batch normalization pieces shared by the in-tree implementations
 * (ops/reference, ops/cpu): the argument checks, so both accept the same
 * nodes with the same reasons, and the per-channel steps, so both do the
 * very same double operations on the statistics (their outputs are
 * bit-identical; the pixel loops around these are each module's own). The
 * formulas themselves are ops/shared/elem_math.h's (bp_bn_*), which
 * ops/cuda's kernels call too.
 * Header-only (static inline), on the module SDK.
 *
 * Shape legend (bp_abi_ops.h): x, y, dy, dx [N,H,W,C]; gamma, beta,
 * running_mean, running_var, save_mean, save_invstd, dgamma, dbeta
 * [1,1,1,C]. Statistics are per channel over M = N*H*W elements (summed
 * in the order below, "The order of the per-channel sums"):
 *   mean = sum x / M          var = sum (x - mean)^2 / M (biased, normalizes)
 *   invstd = 1 / sqrt(var + eps)
 *   y = gamma * (x - mean) * invstd + beta
 *   running_mean = (1 - momentum)*running_mean + momentum*mean
 *   running_var  = (1 - momentum)*running_var  + momentum*var*M/(M-1) (unbiased) */
#ifndef BP_OPS_SHARED_BATCHNORM_STEPS_H
#define BP_OPS_SHARED_BATCHNORM_STEPS_H

#include <math.h>

#include "bp_abi_sdk.h"
#include "elem_math.h"

#define OPS_BN_BLOCK 64 /* channels per pass over the pixels (the double sums live on the stack) */

/* The order of the per-channel sums (ops/reference and ops/cpu take it
 * alike, so their bits agree for any thread count; ops/cuda has its own).
 * The M = N*H*W pixels, in (n, h, w) order, are cut into chunks of
 * ops_bn_chunk_len(M) pixels (the last one shorter): at most
 * OPS_BN_MAX_CHUNKS chunks of at least OPS_BN_MIN_CHUNK pixels, a
 * function of M alone. Each chunk sums its pixels in order in double,
 * from 0; the chunk sums are then added in chunk order, from 0. So a
 * chunk is a task that can run on any thread, and the statistics need one
 * read of x:
 *   fwd_train sums d = x - K and d*d, K the channel's value at pixel 0
 *   (shifted data: d stays near the deviations from the mean, so the
 *   one-pass variance below keeps its precision, where sum x*x would lose
 *   it to cancellation when |mean| >> stddev);
 *   bwd sums dy and dy * xhat. */
#define OPS_BN_MAX_CHUNKS 32
#define OPS_BN_MIN_CHUNK 1024

static inline int64_t ops_bn_chunk_len(int64_t M) {
  const int64_t len = (M + OPS_BN_MAX_CHUNKS - 1) / OPS_BN_MAX_CHUNKS;
  return len > OPS_BN_MIN_CHUNK ? len : OPS_BN_MIN_CHUNK;
}
static inline int64_t ops_bn_chunk_count(int64_t M) {
  const int64_t len = ops_bn_chunk_len(M);
  return (M + len - 1) / len;
}

/* fwd_train: mean and biased variance of a channel from the shift K and the
 * sums of d = x - K and of d*d over its M pixels. Rounding may leave a
 * constant channel's variance a hair below 0: it is clamped to 0 (a NaN
 * stays NaN). */
static inline void ops_bn_moments(double K, double sum_d, double sum_dd, int64_t M, double *mean,
                                  double *var) {
  const double md = sum_d / (double)M, v = sum_dd / (double)M - md * md;
  *mean = K + md;
  *var = v < 0.0 ? 0.0 : v;
}

typedef enum ops_bn_pass { OPS_BN_TRAIN, OPS_BN_EVAL, OPS_BN_BWD } ops_bn_pass;

/* Counts, dtypes (all FP32), shapes and attributes of a pass:
 *   fwd_train  in: x, gamma, beta, running_mean, running_var
 *              out: y, save_mean, save_invstd, running_mean, running_var
 *   fwd_eval   in: as fwd_train   out: y
 *   bwd        in: x, dy, gamma, save_mean, save_invstd   out: dx, dgamma, dbeta
 * With relu (the batchnorm_relu.* ops: y = relu(BN(x))) the forwards are
 * the same and bwd takes a sixth input, y (x-shaped): the relu output the
 * forward wrote, dy being the gradient w.r.t. it. */
static inline int ops_bn_check_relu(const bp_abi_kernel_args *args, ops_bn_pass pass, int relu,
                                    bp_batchnorm_attrs *a, char *reason, size_t rs) {
  static const char *const train_in[] = {"x", "gamma", "beta", "running_mean", "running_var"};
  static const char *const train_out[] = {"y", "save_mean", "save_invstd", "running_mean (out)",
                                          "running_var (out)"};
  static const char *const bwd_in[] = {"x", "dy", "gamma", "save_mean", "save_invstd", "y"};
  static const char *const bwd_out[] = {"dx", "dgamma", "dbeta"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs)) return 0;
  if (!isfinite(a->eps) || a->eps <= 0.0f)
    return bp_sdk_fail(reason, rs, "eps %g must be finite and > 0", (double)a->eps);
  if (!isfinite(a->momentum) || a->momentum < 0.0f || a->momentum > 1.0f)
    return bp_sdk_fail(reason, rs, "momentum %g must be in [0, 1]", (double)a->momentum);
  if (!bp_sdk_check_flag(a->accumulate, "accumulate", reason, rs)) return 0;
  const int nin = pass == OPS_BN_BWD && relu ? 6 : 5;
  const int nout = pass == OPS_BN_TRAIN ? 5 : pass == OPS_BN_EVAL ? 1 : 3;
  if (!bp_sdk_check_args(args, nin, nout, reason, rs)) return 0;
  const char *const *in_names = pass == OPS_BN_BWD ? bwd_in : train_in;
  const char *const *out_names = pass == OPS_BN_BWD ? bwd_out : train_out;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  for (int i = 0; i < nin + nout; i++) {
    const bp_abi_tensor *t = i < nin ? bp_sdk_input(args, i) : bp_sdk_output(args, i - nin);
    const char *name = i < nin ? in_names[i] : out_names[i - nin];
    if (!bp_sdk_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs)) return 0;
    /* x-shaped: x, dy (bwd input 1), y (bwd input 5), y / dx (output 0); the
     * rest per channel */
    const int full = i == 0 || (pass == OPS_BN_BWD && (i == 1 || i == 5)) || i == nin;
    if (full ? !bp_sdk_check_shape(t, name, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                   reason, rs)
             : !bp_sdk_check_shape(t, name, 1, 1, 1, x->shape[3], reason, rs))
      return 0;
  }
  if (pass == OPS_BN_TRAIN && x->shape[0] * x->shape[1] * x->shape[2] < 2)
    return bp_sdk_fail(reason, rs,
                       "training needs more than one value per channel (N*H*W = 1): the "
                       "unbiased variance is undefined");
  return 1;
}
static inline int ops_bn_check(const bp_abi_kernel_args *args, ops_bn_pass pass,
                               bp_batchnorm_attrs *a, char *reason, size_t rs) {
  return ops_bn_check_relu(args, pass, 0, a, reason, rs);
}

/* Channel c of the [1,1,1,C] input / output i. */
static inline double ops_bn_in(const bp_abi_kernel_args *args, int i, int64_t c) {
  return bp_sdk_input_f32(args, i)[c * bp_sdk_input(args, i)->stride[3]];
}
static inline float *ops_bn_out(const bp_abi_kernel_args *args, int i, int64_t c) {
  return bp_sdk_output_f32(args, i) + c * bp_sdk_output(args, i)->stride[3];
}

/* The per-channel steps, for channels c0 .. c0+nb-1 of a checked call.
 * fwd_train: from the channel statistics (mean, var: ops_bn_moments),
 * writes save_mean, save_invstd and the running statistics and gives the
 * affine scale and shift (y = x * scale + shift in double). */
static inline void ops_bn_train_channels(const bp_abi_kernel_args *args,
                                         const bp_batchnorm_attrs *a, int64_t c0, int64_t nb,
                                         const double *mean, const double *var, double *scale,
                                         double *shift) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const int64_t M = x->shape[0] * x->shape[1] * x->shape[2];
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    const double invstd = bp_bn_invstd(var[j], a->eps);
    scale[j] = bp_bn_gain(ops_bn_in(args, 1, c), invstd);
    shift[j] = bp_bn_shift(ops_bn_in(args, 2, c), mean[j], scale[j]);
    *ops_bn_out(args, 1, c) = (float)mean[j];
    *ops_bn_out(args, 2, c) = (float)invstd;
    const double rm = ops_bn_in(args, 3, c), rv = ops_bn_in(args, 4, c);
    *ops_bn_out(args, 3, c) = bp_bn_running_mean(rm, a->momentum, mean[j]);
    *ops_bn_out(args, 4, c) = bp_bn_running_var(rv, a->momentum, var[j], M);
  }
}

/* fwd_eval: scale and shift from the running statistics. */
static inline void ops_bn_eval_channels(const bp_abi_kernel_args *args,
                                        const bp_batchnorm_attrs *a, int64_t c0, int64_t nb,
                                        double *scale, double *shift) {
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    scale[j] = bp_bn_eval_scale(ops_bn_in(args, 1, c), ops_bn_in(args, 4, c), a->eps);
    shift[j] = bp_bn_shift(ops_bn_in(args, 2, c), ops_bn_in(args, 3, c), scale[j]);
  }
}

/* bwd: the saved statistics of fwd_train (inputs 3 and 4). */
static inline void ops_bn_saved_stats(const bp_abi_kernel_args *args, int64_t c0, int64_t nb,
                                      double *mean, double *invstd) {
  for (int64_t j = 0; j < nb; j++) {
    mean[j] = ops_bn_in(args, 3, c0 + j);
    invstd[j] = ops_bn_in(args, 4, c0 + j);
  }
}

/* bwd: from the sums of dy and dy*xhat, writes dgamma and dbeta (added
 * with accumulate), gives k = gamma * invstd and divides both sums by M. */
static inline void ops_bn_bwd_channels(const bp_abi_kernel_args *args,
                                       const bp_batchnorm_attrs *a, int64_t c0, int64_t nb,
                                       const double *invstd, double *sdy, double *sdyx,
                                       double *k) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const int64_t M = x->shape[0] * x->shape[1] * x->shape[2];
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    float *pg = ops_bn_out(args, 1, c), *pb = ops_bn_out(args, 2, c);
    *pg = bp_bn_param_grad(*pg, sdyx[j], a->accumulate);
    *pb = bp_bn_param_grad(*pb, sdy[j], a->accumulate);
    k[j] = bp_bn_gain(ops_bn_in(args, 2, c), invstd[j]);
    sdy[j] /= (double)M;
    sdyx[j] /= (double)M;
  }
}

#endif
