/* Softmax cross-entropy reference: loss, correct count and the gradient of
 * the logits in one pass.
 *
 * Shape legend (bp_abi_ops.h):
 *   logits  [N,1,1,K] FP32 or FP16      labels [N,1,1,1] INT32, each in [0, K)
 *   loss_scale [1,1,1,1] FP32 (has_loss_scale: input 2, S below; else S = 1)
 *   loss    [1,1,1,1] FP32      correct [1,1,1,1] FP32 (a count; the R region is FP32)
 *   dlogits [N,1,1,K] FP32 or FP16 (compute_grad; its dtype need not be logits')
 *
 * Per sample, with s = label_smoothing and target t_k = (1-s)*[k == label] + s/K:
 *   lse  = max z + log sum_k exp(z_k - max z)       (stable for any logit size)
 *   loss_n = sum_k t_k * (lse - z_k)
 *   dlogits_k = (exp(z_k - lse) - t_k) * grad_scale * S
 *   hit_n = argmax_k z_k == label (ties: the first largest k wins)
 * loss += sum_n loss_n and correct += sum_n hit_n (both accumulate across
 * steps; the executor zeroes them); dlogits is overwritten. Everything in
 * double; loss and correct are added once per call, never scaled by S.
 * FP16 (mixed precision): an FP16 logit is widened exactly to FP32 first,
 * and an FP16 dlogits element is the FP32 one (the double value rounded
 * to float) rounded once more, to nearest even, by bp_sdk_fp32_to_fp16:
 * the FP16 kernel is the FP32 kernel on the widened logits with its
 * dlogits cast. S = 1 leaves every bit as without has_loss_scale; a
 * power-of-two S scales dlogits exactly while nothing overflows or turns
 * subnormal. S is read at run time and must be finite and > 0.
 *
 * The checks are ops/shared/softmax_ce_check.h and the per-element
 * formulas ops/shared/elem_math.h (both shared with ops/cuda).
 *
 * Device strides that nest in NHWC order; no alignment beyond 4 bytes; the
 * 16-byte tail never read; no output aliases an input. Labels are checked
 * before anything is written: one outside [0, K) (or a bad S) makes run()
 * return BP_ABI_ERR_INVALID with every output untouched. */
#include <math.h>

#include "reference-impl.h"
#include "shared/elem_math.h"
#include "shared/softmax_ce_check.h"

/* Element k of an FP32 or FP16 tensor at p, widened exactly. */
static inline float ce_load(const void *p, int32_t dtype, int64_t k) {
  return dtype == BP_ABI_DTYPE_FP16 ? bp_sdk_fp16_to_fp32(((const uint16_t *)p)[k])
                                    : ((const float *)p)[k];
}

static int ce_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_softmax_ce_attrs a;
  return ops_ce_check(args, &a, reason, rs);
}

/* softmax_ce.fwd_bwd: see the top of the file. */
static int ce_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_softmax_ce_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ce_check(args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tz = bp_sdk_input(args, 0), *tl = bp_sdk_input(args, 1);
  const void *z = args->input_ptrs[0];
  const int32_t zt = tz->dtype;
  const int32_t *labels = (const int32_t *)args->input_ptrs[1];
  const int64_t N = tz->shape[0], K = tz->shape[3], zs = tz->stride[3];
  double S;
  if (!ops_ce_check_run(args, &a, &S)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tg = a.compute_grad ? bp_sdk_output(args, 2) : NULL;
  void *dz = a.compute_grad ? args->output_ptrs[2] : NULL;
  double on, off;
  bp_ce_targets(a.label_smoothing, K, &on, &off);
  double loss = 0.0, hits = 0.0;
  for (int64_t n = 0; n < N; n++) {
    const int64_t row = bp_sdk_offset(tz, n, 0, 0, 0);
    const int32_t y = labels[bp_sdk_offset(tl, n, 0, 0, 0)];
    int64_t arg = 0;
    for (int64_t k = 1; k < K; k++)
      if (ce_load(z, zt, row + k * zs) > ce_load(z, zt, row + arg * zs)) arg = k;
    const double m = ce_load(z, zt, row + arg * zs);
    double sum = 0.0;
    for (int64_t k = 0; k < K; k++) sum += exp(ce_load(z, zt, row + k * zs) - m);
    const double lse = m + log(sum);
    double ln = 0.0;
    for (int64_t k = 0; k < K; k++) {
      const double t = k == y ? on : off;
      const float zk = ce_load(z, zt, row + k * zs);
      if (t != 0.0) ln += bp_ce_loss_term(t, lse, zk); /* a -inf logit off target adds nothing */
      if (!dz) continue;
      const float d = bp_ce_dlogit(exp(zk - lse), t, a.grad_scale, S);
      const int64_t at = bp_sdk_offset(tg, n, 0, 0, k);
      if (tg->dtype == BP_ABI_DTYPE_FP16) ((uint16_t *)dz)[at] = bp_sdk_fp32_to_fp16(d);
      else ((float *)dz)[at] = d;
    }
    loss += ln;
    hits += arg == y;
  }
  float *ploss = bp_sdk_output_f32(args, 0), *pcorrect = bp_sdk_output_f32(args, 1);
  *ploss = (float)(*ploss + loss);
  *pcorrect = (float)(*pcorrect + hits);
  return BP_ABI_OK;
}

const bp_abi_kernel ref_softmax_ce_fwd_bwd =
    REF_KERNEL_DT("softmax_ce.fwd_bwd", ce_supports, ce_run, 0,
                  BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16) |
                      BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
