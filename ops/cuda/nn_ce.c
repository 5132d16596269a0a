/* softmax_ce.fwd_bwd on the device (kernels, launch shapes and what a bad
 * label or loss scale does there: nn_ce.cu). Semantics, shapes and checks
 * are the reference's (ops/reference/softmax_ce.c,
 * ops/shared/softmax_ce_check.h):
 *   in:  logits [N,1,1,K] FP32 or FP16, labels [N,1,1,1] INT32,
 *        loss_scale [1,1,1,1] FP32 (has_loss_scale; read on the device)
 *   out: loss, correct [1,1,1,1] FP32 (added to), dlogits [N,1,1,K] FP32
 *        or FP16 (compute_grad; overwritten)
 * Device strides that nest, padded channels never read or written; no
 * output aliases an input. The workspace holds each sample's loss and
 * hit. */
#include "nn-impl.h"
#include "shared/softmax_ce_check.h"

static int ce_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_softmax_ce_attrs a;
  return ops_ce_check(args, &a, reason, rs);
}

static uint64_t ce_workspace_size(void *user, const bp_abi_kernel_args *args) {
  if (!ce_supports(user, args, NULL, 0)) return 0;
  return cuda_ce_workspace_bytes(bp_sdk_input(args, 0)->shape[0]);
}

static int ce_run(void *user, const bp_abi_kernel_args *args) {
  bp_softmax_ce_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ce_check(args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs) ||
      !cuda_nn_workspace_ok(args, ce_workspace_size(user, args)))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tz = bp_sdk_input(args, 0), *tl = bp_sdk_input(args, 1);
  /* without compute_grad: dlogits is never touched (the descriptor only
   * stands in for the launcher's argument) */
  const cuda_nhwc dz = cuda_nn_tensor(a.compute_grad ? bp_sdk_output(args, 2) : tz);
  return cuda_launch_result(
      args, "softmax_ce.fwd_bwd",
      cuda_nn_softmax_ce(args->stream, cuda_nn_tensor(tz), args->input_ptrs[0],
                         (const int32_t *)args->input_ptrs[1], tl->stride[0],
                         a.has_loss_scale ? (const float *)args->input_ptrs[2] : NULL,
                         (float *)args->output_ptrs[0], (float *)args->output_ptrs[1], dz,
                         a.compute_grad ? args->output_ptrs[2] : NULL, a.label_smoothing,
                         a.grad_scale, args->workspace));
}

const bp_abi_kernel cuda_softmax_ce_kernel =
    CUDA_NN_KERNEL("softmax_ce.fwd_bwd", ce_supports, ce_workspace_size, ce_run, NULL, 0,
                   CUDA_NN_F16 | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
