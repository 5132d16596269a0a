/* Private helpers of the reference op module (ops/reference/). Nothing here
 * is exported: the module is built with -fvisibility=hidden and only the
 * ABI entry (module.c) is visible.
 *
 * Conventions shared by every kernel of the module:
 *  - Element (n,h,w,c) of a tensor t lives at ptr + bp_sdk_offset(t, n, h,
 *    w, c), in elements; the strides are the device strides the host
 *    passes, so a padded channel dimension (padded_c > shape[3]) is skipped,
 *    never read and never written (bp_abi_ops.h rule 2), and nothing is
 *    written past the last element (rule 3). No kernel reads the 16-byte
 *    tail. (The range ops of range.c take spans [1,1,1,E] whose E elements
 *    include the padding of every slot inside the span; see there.)
 *  - Every tensor is checked by bp_sdk_check_tensor (abi/bp_abi_sdk.h):
 *    dtype, extents >= 1, strides nesting in NHWC order without overlap,
 *    and the whole logical extent inside slot_bytes. The op checks shared
 *    with the other in-tree modules are in ops/shared/.
 *  - supports() and run() share one check function per op; run() repeats
 *    it with the host's reason buffer (bp_sdk_args_reason) and returns
 *    BP_ABI_ERR_INVALID when it fails, so the host prints why. */
#ifndef BP_OPS_REFERENCE_IMPL_H
#define BP_OPS_REFERENCE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "shared/fp16_adapter.h"

#define REF_IMPL "reference"
#define REF_DEVICE "cpu"
#define REF_FLAGS (BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC)

/* Dot product of n floats a[i*as] . b[i*bs], summed in a fixed order
 * (eight float lanes when both strides are 1, then the tail and the lanes
 * in double), so the result is the same on every run. Inline: it is the
 * inner loop of the conv and fc forwards. */
static inline double ref_dot(const float *a, int64_t as, const float *b, int64_t bs, int64_t n) {
  double sum = 0.0;
  if (as == 1 && bs == 1) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    for (; i < n; i++) sum += (double)a[i] * b[i];
    for (int j = 0; j < 8; j++) sum += lane[j];
    return sum;
  }
  for (int64_t i = 0; i < n; i++) sum += (double)a[i * as] * b[i * bs];
  return sum;
}

/* y[i*ys] += alpha * x[i*xs] for i < n, in float, in index order; y and x
 * never overlap. Inline: the inner loop of the backward passes. */
static inline void ref_axpy(float *restrict y, int64_t ys, float alpha, const float *restrict x,
                            int64_t xs, int64_t n) {
  if (ys == 1 && xs == 1) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return;
  }
  for (int64_t i = 0; i < n; i++) y[i * ys] += alpha * x[i * xs];
}

/* The kernels, one descriptor each (defined in the family files). */
extern const bp_abi_kernel ref_conv2d_fwd, ref_conv2d_bwd_data, ref_conv2d_bwd_filter;
extern const bp_abi_kernel ref_fc_fwd, ref_fc_bwd_data, ref_fc_bwd_filter;
extern const bp_abi_kernel ref_relu_fwd, ref_relu_bwd, ref_add_fwd, ref_add_bwd;
extern const bp_abi_kernel ref_gelu_fwd, ref_gelu_bwd;
/* attention.c */
extern const bp_abi_kernel ref_attention_fwd, ref_attention_bwd;
extern const bp_abi_kernel ref_gelu_tanh_fwd, ref_gelu_tanh_bwd;
extern const bp_abi_kernel ref_layernorm_fwd, ref_layernorm_bwd;
extern const bp_abi_kernel ref_pos_embed_fwd, ref_pos_embed_bwd;
extern const bp_abi_kernel ref_maxpool_fwd, ref_maxpool_bwd, ref_avgpool_fwd, ref_avgpool_bwd;
extern const bp_abi_kernel ref_global_avgpool_fwd, ref_global_avgpool_bwd;
extern const bp_abi_kernel ref_batchnorm_fwd_train, ref_batchnorm_fwd_eval, ref_batchnorm_bwd;
extern const bp_abi_kernel ref_batchnorm_relu_fwd_train, ref_batchnorm_relu_fwd_eval,
    ref_batchnorm_relu_bwd;
extern const bp_abi_kernel ref_softmax_ce_fwd_bwd;
extern const bp_abi_kernel ref_range_zero, ref_range_copy, ref_range_scale, ref_range_cast;
extern const bp_abi_kernel ref_range_ema, ref_range_nan_check, ref_range_unscale;
extern const bp_abi_kernel ref_range_loss_scale;
extern const bp_abi_kernel ref_range_sgd, ref_range_adamw, ref_range_lars;

/* A descriptor of this module: op name, supports, run, extra flags. The
 * dtype mask names every dtype among the op's tensors (the registry
 * requires each to be in it): FP32, plus INT8 for the maxpool mask,
 * INT32 for the softmax_ce labels and the LARS segments, FP16 for the
 * cast, the NaN check, range.unscale and softmax_ce, every dtype for range.zero and range.copy
 * (REF_KERNEL_DT). */
#define REF_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, dtype_mask)                  \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = REF_IMPL,                \
    .device = REF_DEVICE, .dtypes = (dtype_mask), .priority = BP_ABI_PRIORITY_REFERENCE,     \
    .flags = REF_FLAGS | (extra_flags), .supports = (supports_fn), .run = (run_fn)           \
  }
#define REF_KERNEL(op_name, supports_fn, run_fn, extra_flags)                                 \
  REF_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32))

/* The compute ops of the models (conv2d, fc, relu, add, the pools, batch
 * norm) also take FP16 tensors (mixed with FP32 and INT8 ones where the
 * op has them): through the FP16 adapter (shared/fp16_adapter.h), which
 * widens them into FP32 copies, runs the FP32 kernel above on those and
 * rounds each FP16 output once, with the SDK's scalar conversions. FP32
 * calls go straight to the FP32 kernel. REF_FP16(supports, run, offset of
 * the accumulate flag or OPS_FP16_NO_ACCUMULATE) is the adapter's record
 * (REF_FP16_ALIAS adds the op's "may alias" pairs), REF_KERNEL16 the
 * descriptor. */
#define REF_FP16_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))
#define REF_FP16_ALIAS(supports_fn, run_fn, acc_offset, n_alias, out0, in0, out1, in1)        \
  {                                                                                          \
    .supports = (supports_fn), .run = (run_fn), .accumulate_offset = (acc_offset),          \
    .alias_count = (n_alias), .alias_out = {(out0), (out1)}, .alias_in = {(in0), (in1)},    \
    .convert = ops_fp16_convert_scalar                                                       \
  }
#define REF_FP16(supports_fn, run_fn, acc_offset) \
  REF_FP16_ALIAS(supports_fn, run_fn, acc_offset, 0, 0, 0, 0, 0)
#define REF_KERNEL16(op_name, fp16_kernel, extra_flags, dtype_mask)                           \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = REF_IMPL,                \
    .device = REF_DEVICE, .dtypes = (dtype_mask), .priority = BP_ABI_PRIORITY_REFERENCE,     \
    .flags = REF_FLAGS | (extra_flags), OPS_FP16_FUNCS(&(fp16_kernel))                       \
  }

#endif
