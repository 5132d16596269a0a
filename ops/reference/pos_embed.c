/* Learned position embedding reference: y = x + P, P [1,H,W,C] added to
 * every sample, and its backward (dx = dy, dP = the sum of dy over the
 * samples).
 *
 * FP32 tensors with device strides that nest in NHWC order (padded
 * channels skipped, never written); the 16-byte tail never read. No output
 * aliases an input. FP16 through the FP16 adapter. The checks are
 * ops/shared/elementwise_check.h's (ops_pos_embed_check). */
#include "reference-impl.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

static int pe_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_pos_embed_check(args, 0, &a, reason, rs);
}
static int pe_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_pos_embed_check(args, 1, &a, reason, rs);
}

/* pos_embed.fwd
 *   in: x, P   out: y = x + P (one float addition per element), overwritten. */
static int pe_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pos_embed_check(args, 0, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tp = bp_sdk_input(args, 1);
  const bp_abi_tensor *ty = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *P = bp_sdk_input_f32(args, 1);
  float *y = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++)
          y[bp_sdk_offset(ty, n, h, w, c)] =
              x[bp_sdk_offset(tx, n, h, w, c)] + P[bp_sdk_offset(tp, 0, h, w, c)];
  return BP_ABI_OK;
}

/* pos_embed.bwd
 *   in: dy   out: dx = dy, dP = sum over n of dy (in double, samples in
 *   order from 0, rounded once)
 *   accumulate 0: overwritten; 1: dx += dy in float, dP through
 *   bp_bn_param_grad (the old value plus the double sum, rounded once). */
static int pe_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_pos_embed_check(args, 1, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tdy = bp_sdk_input(args, 0), *tdx = bp_sdk_output(args, 0);
  const bp_abi_tensor *tdp = bp_sdk_output(args, 1);
  const float *dy = bp_sdk_input_f32(args, 0);
  float *dx = bp_sdk_output_f32(args, 0), *dP = bp_sdk_output_f32(args, 1);
  for (int64_t h = 0; h < tdy->shape[1]; h++)
    for (int64_t w = 0; w < tdy->shape[2]; w++)
      for (int64_t c = 0; c < tdy->shape[3]; c++) {
        double sum = 0.0;
        for (int64_t n = 0; n < tdy->shape[0]; n++) {
          const float g = dy[bp_sdk_offset(tdy, n, h, w, c)];
          float *o = dx + bp_sdk_offset(tdx, n, h, w, c);
          *o = a.accumulate ? *o + g : g;
          sum += g;
        }
        float *p = dP + bp_sdk_offset(tdp, 0, h, w, c);
        *p = bp_bn_param_grad(*p, sum, a.accumulate);
      }
  return BP_ABI_OK;
}

static const ops_fp16_kernel pe_fwd16 =
    REF_FP16(pe_supports_fwd, pe_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel pe_bwd16 =
    REF_FP16(pe_supports_bwd, pe_run_bwd, offsetof(bp_elementwise_attrs, accumulate));
const bp_abi_kernel ref_pos_embed_fwd =
    REF_KERNEL16("pos_embed.fwd", pe_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_pos_embed_bwd =
    REF_KERNEL16("pos_embed.bwd", pe_bwd16, 0, REF_FP16_DTYPES);
