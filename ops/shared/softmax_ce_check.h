/* Argument checks of softmax_ce.fwd_bwd, shared by the in-tree
 * implementations (ops/reference, ops/cpu, ops/cuda), so all accept the
 * same nodes with the same reasons. Header-only (static inline), on the
 * module SDK. Shapes (bp_abi_ops.h): logits [N,1,1,K] FP32 or FP16, labels
 * [N,1,1,1] INT32, loss_scale [1,1,1,1] FP32 (has_loss_scale), loss and
 * correct [1,1,1,1] FP32, dlogits [N,1,1,K] FP32 or FP16 (compute_grad).
 * What only run time can see (a label outside [0, K), a bad loss scale):
 * ops_ce_check_run for the kernels that read them on the host; ops/cuda
 * checks them on the device. */
#ifndef BP_OPS_SHARED_SOFTMAX_CE_CHECK_H
#define BP_OPS_SHARED_SOFTMAX_CE_CHECK_H

#include <math.h>

#include "bp_abi_sdk.h"

/* logits and dlogits: FP32 or FP16. */
static inline int ops_ce_float_check(const bp_abi_tensor *t, const char *name, char *reason,
                                     size_t rs) {
  if (t->dtype != BP_ABI_DTYPE_FP32 && t->dtype != BP_ABI_DTYPE_FP16)
    return bp_sdk_fail(reason, rs, "%s: dtype %s, expected fp32 or fp16", name,
                       bp_sdk_dtype_name(t->dtype));
  return bp_sdk_check_tensor(t, name, t->dtype, reason, rs);
}

/* The attributes (into *a), the tensor counts (2 + has_loss_scale inputs,
 * 2 + compute_grad outputs), dtypes and shapes. */
static inline int ops_ce_check(const bp_abi_kernel_args *args, bp_softmax_ce_attrs *a,
                               char *reason, size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs)) return 0;
  if (!isfinite(a->label_smoothing) || a->label_smoothing < 0.0f || a->label_smoothing > 1.0f)
    return bp_sdk_fail(reason, rs, "label_smoothing %g must be in [0, 1]",
                       (double)a->label_smoothing);
  if (!isfinite(a->grad_scale))
    return bp_sdk_fail(reason, rs, "grad_scale %g must be finite", (double)a->grad_scale);
  if (!bp_sdk_check_flag(a->compute_grad, "compute_grad", reason, rs) ||
      !bp_sdk_check_flag(a->has_loss_scale, "has_loss_scale", reason, rs) ||
      !bp_sdk_check_args(args, 2 + a->has_loss_scale, 2 + a->compute_grad, reason, rs))
    return 0;
  const bp_abi_tensor *z = bp_sdk_input(args, 0), *lab = bp_sdk_input(args, 1);
  const bp_abi_tensor *loss = bp_sdk_output(args, 0), *correct = bp_sdk_output(args, 1);
  const bp_abi_tensor *dz = a->compute_grad ? bp_sdk_output(args, 2) : NULL;
  if (!ops_ce_float_check(z, "logits", reason, rs) ||
      !bp_sdk_check_tensor(lab, "labels", BP_ABI_DTYPE_INT32, reason, rs) ||
      !bp_sdk_check_tensor(loss, "loss", BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_tensor(correct, "correct", BP_ABI_DTYPE_FP32, reason, rs) ||
      (a->compute_grad && !ops_ce_float_check(dz, "dlogits", reason, rs)))
    return 0;
  if (a->has_loss_scale) {
    const bp_abi_tensor *ls = bp_sdk_input(args, 2);
    if (!bp_sdk_check_tensor(ls, "loss_scale", BP_ABI_DTYPE_FP32, reason, rs) ||
        !bp_sdk_check_shape(ls, "loss_scale", 1, 1, 1, 1, reason, rs))
      return 0;
  }
  const int64_t n = z->shape[0], k = z->shape[3];
  if (!bp_sdk_check_shape(z, "logits", n, 1, 1, k, reason, rs) ||
      !bp_sdk_check_shape(lab, "labels", n, 1, 1, 1, reason, rs) ||
      !bp_sdk_check_shape(loss, "loss", 1, 1, 1, 1, reason, rs) ||
      !bp_sdk_check_shape(correct, "correct", 1, 1, 1, 1, reason, rs) ||
      (a->compute_grad && !bp_sdk_check_shape(dz, "dlogits", n, 1, 1, k, reason, rs)))
    return 0;
  return 1;
}

/* Run time, after ops_ce_check: every label in [0, K) and, with
 * has_loss_scale, a loss scale finite and > 0, returned in *scale (1.0
 * without). 0 with the reason set (bp_sdk_set_reason) and nothing written
 * otherwise: the kernel returns BP_ABI_ERR_INVALID with every output
 * untouched. */
static inline int ops_ce_check_run(const bp_abi_kernel_args *args, const bp_softmax_ce_attrs *a,
                                   double *scale) {
  const bp_abi_tensor *tz = bp_sdk_input(args, 0), *tl = bp_sdk_input(args, 1);
  const int32_t *labels = (const int32_t *)args->input_ptrs[1];
  const int64_t n_rows = tz->shape[0], k = tz->shape[3];
  for (int64_t n = 0; n < n_rows; n++) {
    const int32_t y = labels[bp_sdk_offset(tl, n, 0, 0, 0)];
    if (y < 0 || y >= k) {
      bp_sdk_set_reason(args, "labels: sample %lld has label %d, outside [0, %lld)", (long long)n,
                        (int)y, (long long)k);
      return 0;
    }
  }
  *scale = 1.0;
  if (a->has_loss_scale) {
    const float ls = *bp_sdk_input_f32(args, 2);
    if (!isfinite(ls) || !(ls > 0.0f)) {
      bp_sdk_set_reason(args, "loss_scale %g must be finite and > 0", (double)ls);
      return 0;
    }
    *scale = ls;
  }
  return 1;
}

#endif
