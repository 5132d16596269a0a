/* Batch normalization reference: training forward (batch statistics, with
 * the running statistics updated), evaluation forward (running statistics)
 * and backward (through the batch statistics).
 *
 * Shape legend (bp_abi_ops.h): x, y, dy, dx [N,H,W,C]; gamma, beta,
 * running_mean, running_var, save_mean, save_invstd, dgamma, dbeta
 * [1,1,1,C]. Statistics are per channel over M = N*H*W elements.
 *
 *   mean = sum x / M          var = sum (x - mean)^2 / M (biased, normalizes)
 *   invstd = 1 / sqrt(var + eps)
 *   y = gamma * (x - mean) * invstd + beta
 *   running_mean = (1 - momentum)*running_mean + momentum*mean
 *   running_var  = (1 - momentum)*running_var  + momentum*var*M/(M-1) (unbiased)
 *
 * FP32 tensors with device strides that nest in NHWC order (padded channels
 * skipped); no alignment beyond 4 bytes; the 16-byte tail never read.
 * Statistics are summed in double over the pixels in (n, h, w) order, one
 * block of up to 64 channels at a time (the double sums live on the
 * stack). No output aliases an input, except the running statistics of
 * fwd_train, which may be updated in place (output 3 the very same elements
 * as input 3, output 4 as input 4). */
#include <math.h>

#include "reference-impl.h"

#define BN_BLOCK 64 /* channels per pass over the pixels */

typedef enum bn_pass { BN_TRAIN, BN_EVAL, BN_BWD } bn_pass;

static int bn_check(const bp_abi_kernel_args *args, bn_pass pass, bp_batchnorm_attrs *a,
                    char *reason, size_t rs) {
  static const char *const train_in[] = {"x", "gamma", "beta", "running_mean", "running_var"};
  static const char *const train_out[] = {"y", "save_mean", "save_invstd", "running_mean (out)",
                                          "running_var (out)"};
  static const char *const bwd_in[] = {"x", "dy", "gamma", "save_mean", "save_invstd"};
  static const char *const bwd_out[] = {"dx", "dgamma", "dbeta"};
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, a, sizeof *a, reason, rs)) return 0;
  if (!isfinite(a->eps) || a->eps <= 0.0f)
    return ref_fail(reason, rs, "eps %g must be finite and > 0", (double)a->eps);
  if (!isfinite(a->momentum) || a->momentum < 0.0f || a->momentum > 1.0f)
    return ref_fail(reason, rs, "momentum %g must be in [0, 1]", (double)a->momentum);
  if (!ref_check_flag(a->accumulate, "accumulate", reason, rs)) return 0;
  const int nin = 5, nout = pass == BN_TRAIN ? 5 : pass == BN_EVAL ? 1 : 3;
  if (!ref_check_args(args, nin, nout, reason, rs)) return 0;
  const char *const *in_names = pass == BN_BWD ? bwd_in : train_in;
  const char *const *out_names = pass == BN_BWD ? bwd_out : train_out;
  const bp_abi_tensor *x = &args->inputs[0];
  for (int i = 0; i < nin + nout; i++) {
    const bp_abi_tensor *t = i < nin ? &args->inputs[i] : &args->outputs[i - nin];
    const char *name = i < nin ? in_names[i] : out_names[i - nin];
    if (!ref_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs)) return 0;
    /* x-shaped: x, dy (bwd input 1), y / dx (output 0); the rest per channel */
    const int full = i == 0 || (pass == BN_BWD && i == 1) || i == nin;
    if (full ? !ref_check_shape(t, name, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                reason, rs)
             : !ref_check_shape(t, name, 1, 1, 1, x->shape[3], reason, rs))
      return 0;
  }
  if (pass == BN_TRAIN && x->shape[0] * x->shape[1] * x->shape[2] < 2)
    return ref_fail(reason, rs,
                    "training needs more than one value per channel (N*H*W = 1): the unbiased "
                    "variance is undefined");
  return 1;
}

static int bn_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, BN_TRAIN, &a, reason, rs);
}
static int bn_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, BN_EVAL, &a, reason, rs);
}
static int bn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, BN_BWD, &a, reason, rs);
}

/* Channel c of a [1,1,1,C] tensor. */
static inline float bn_chan(const bp_abi_tensor *t, const float *p, int64_t c) {
  return p[c * t->stride[3]];
}

/* y = x * scale[c] + shift[c] over channels [c0, c0+nb), in double. */
static void bn_apply(const bp_abi_tensor *tx, const float *x, const bp_abi_tensor *ty, float *y,
                     int64_t c0, int64_t nb, const double *scale, const double *shift) {
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++) {
        const float *xr = x + ref_off(tx, n, h, w, c0);
        float *yr = y + ref_off(ty, n, h, w, c0);
        for (int64_t j = 0; j < nb; j++)
          yr[j * ty->stride[3]] = (float)(xr[j * tx->stride[3]] * scale[j] + shift[j]);
      }
}

/* ---- the per-channel steps (reference-impl.h; ops/cpu calls them too) ---- */

void ref_bn_train_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a,
                           int64_t c0, int64_t nb, const double *mean, const double *var,
                           double *scale, double *shift) {
  const bp_abi_tensor *ti = args->inputs, *to = args->outputs;
  const int64_t M = ti[0].shape[0] * ti[0].shape[1] * ti[0].shape[2];
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    const double invstd = 1.0 / sqrt(var[j] + (double)a->eps);
    scale[j] = bn_chan(&ti[1], ref_in(args, 1), c) * invstd;
    shift[j] = bn_chan(&ti[2], ref_in(args, 2), c) - mean[j] * scale[j];
    ref_out(args, 1)[c * to[1].stride[3]] = (float)mean[j];
    ref_out(args, 2)[c * to[2].stride[3]] = (float)invstd;
    const double m = a->momentum;
    const double rm = bn_chan(&ti[3], ref_in(args, 3), c);
    const double rv = bn_chan(&ti[4], ref_in(args, 4), c);
    ref_out(args, 3)[c * to[3].stride[3]] = (float)((1.0 - m) * rm + m * mean[j]);
    ref_out(args, 4)[c * to[4].stride[3]] =
        (float)((1.0 - m) * rv + m * var[j] * (double)M / (double)(M - 1));
  }
}

void ref_bn_eval_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a,
                          int64_t c0, int64_t nb, double *scale, double *shift) {
  const bp_abi_tensor *ti = args->inputs;
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    const double rv = bn_chan(&ti[4], ref_in(args, 4), c);
    scale[j] = bn_chan(&ti[1], ref_in(args, 1), c) / sqrt(rv + (double)a->eps);
    shift[j] = bn_chan(&ti[2], ref_in(args, 2), c) - bn_chan(&ti[3], ref_in(args, 3), c) * scale[j];
  }
}

void ref_bn_saved_stats(const bp_abi_kernel_args *args, int64_t c0, int64_t nb, double *mean,
                        double *invstd) {
  const bp_abi_tensor *ti = args->inputs;
  for (int64_t j = 0; j < nb; j++) {
    mean[j] = bn_chan(&ti[3], ref_in(args, 3), c0 + j);
    invstd[j] = bn_chan(&ti[4], ref_in(args, 4), c0 + j);
  }
}

void ref_bn_bwd_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a, int64_t c0,
                         int64_t nb, const double *invstd, double *sdy, double *sdyx, double *k) {
  const bp_abi_tensor *ti = args->inputs, *to = args->outputs;
  const int64_t M = ti[0].shape[0] * ti[0].shape[1] * ti[0].shape[2];
  float *dgamma = ref_out(args, 1), *dbeta = ref_out(args, 2);
  for (int64_t j = 0; j < nb; j++) {
    const int64_t c = c0 + j;
    float *pg = dgamma + c * to[1].stride[3], *pb = dbeta + c * to[2].stride[3];
    *pg = a->accumulate ? (float)(*pg + sdyx[j]) : (float)sdyx[j];
    *pb = a->accumulate ? (float)(*pb + sdy[j]) : (float)sdy[j];
    k[j] = bn_chan(&ti[2], ref_in(args, 2), c) * invstd[j];
    sdy[j] /= (double)M;
    sdyx[j] /= (double)M;
  }
}

/* batchnorm.fwd_train
 *   in:  x, gamma, beta, running_mean, running_var
 *   out: y, save_mean, save_invstd, running_mean, running_var
 *   y, save_mean and save_invstd are overwritten (no accumulate in the
 *   forward); the running statistics get the momentum update above (read
 *   from inputs 3 and 4, written to outputs 3 and 4, which may be the same
 *   elements). Two passes for the statistics (mean, then squared
 *   deviations), then y. Needs N*H*W >= 2. */
static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char reason[REF_REASON_MAX];
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!bn_check(args, BN_TRAIN, &a, reason, sizeof reason) ||
      !ref_check_ptrs(args, alias_out, alias_in, 2))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ti = args->inputs, *to = args->outputs;
  const float *x = ref_in(args, 0);
  const int64_t C = ti[0].shape[3], M = ti[0].shape[0] * ti[0].shape[1] * ti[0].shape[2];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK] = {0}, var[BN_BLOCK] = {0}, scale[BN_BLOCK], shift[BN_BLOCK];
    for (int pass = 0; pass < 2; pass++) {
      for (int64_t n = 0; n < ti[0].shape[0]; n++)
        for (int64_t h = 0; h < ti[0].shape[1]; h++)
          for (int64_t w = 0; w < ti[0].shape[2]; w++) {
            const float *xr = x + ref_off(&ti[0], n, h, w, c0);
            for (int64_t j = 0; j < nb; j++) {
              const double v = xr[j * ti[0].stride[3]];
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
    ref_bn_train_channels(args, &a, c0, nb, mean, var, scale, shift);
    bn_apply(&ti[0], x, &to[0], ref_out(args, 0), c0, nb, scale, shift);
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
  char reason[REF_REASON_MAX];
  if (!bn_check(args, BN_EVAL, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ti = args->inputs;
  const int64_t C = ti[0].shape[3];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double scale[BN_BLOCK], shift[BN_BLOCK];
    ref_bn_eval_channels(args, &a, c0, nb, scale, shift);
    bn_apply(&ti[0], ref_in(args, 0), &args->outputs[0], ref_out(args, 0), c0, nb, scale, shift);
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
  char reason[REF_REASON_MAX];
  if (!bn_check(args, BN_BWD, &a, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ti = args->inputs, *to = args->outputs;
  const float *x = ref_in(args, 0), *dy = ref_in(args, 1);
  float *dx = ref_out(args, 0);
  const int64_t C = ti[0].shape[3];
  for (int64_t c0 = 0; c0 < C; c0 += BN_BLOCK) {
    const int64_t nb = C - c0 < BN_BLOCK ? C - c0 : BN_BLOCK;
    double mean[BN_BLOCK], invstd[BN_BLOCK], sdy[BN_BLOCK] = {0}, sdyx[BN_BLOCK] = {0};
    double k[BN_BLOCK];
    ref_bn_saved_stats(args, c0, nb, mean, invstd);
    for (int64_t n = 0; n < ti[0].shape[0]; n++)
      for (int64_t h = 0; h < ti[0].shape[1]; h++)
        for (int64_t w = 0; w < ti[0].shape[2]; w++) {
          const float *xr = x + ref_off(&ti[0], n, h, w, c0);
          const float *dyr = dy + ref_off(&ti[1], n, h, w, c0);
          for (int64_t j = 0; j < nb; j++) {
            const double g = dyr[j * ti[1].stride[3]];
            sdy[j] += g;
            sdyx[j] += g * (xr[j * ti[0].stride[3]] - mean[j]) * invstd[j];
          }
        }
    ref_bn_bwd_channels(args, &a, c0, nb, invstd, sdy, sdyx, k);
    for (int64_t n = 0; n < ti[0].shape[0]; n++)
      for (int64_t h = 0; h < ti[0].shape[1]; h++)
        for (int64_t w = 0; w < ti[0].shape[2]; w++) {
          const float *xr = x + ref_off(&ti[0], n, h, w, c0);
          const float *dyr = dy + ref_off(&ti[1], n, h, w, c0);
          float *dxr = dx + ref_off(&to[0], n, h, w, c0);
          for (int64_t j = 0; j < nb; j++) {
            const double xhat = (xr[j * ti[0].stride[3]] - mean[j]) * invstd[j];
            const float g = (float)(k[j] * (dyr[j * ti[1].stride[3]] - sdy[j] - xhat * sdyx[j]));
            float *o = dxr + j * to[0].stride[3];
            *o = a.accumulate ? *o + g : g;
          }
        }
  }
  return BP_ABI_OK;
}

const bp_abi_kernel ref_batchnorm_fwd_train =
    REF_KERNEL("batchnorm.fwd_train", bn_supports_train, bn_run_train, 0);
const bp_abi_kernel ref_batchnorm_fwd_eval =
    REF_KERNEL("batchnorm.fwd_eval", bn_supports_eval, bn_run_eval, 0);
const bp_abi_kernel ref_batchnorm_bwd =
    REF_KERNEL("batchnorm.bwd", bn_supports_bwd, bn_run_bwd, 0);
