/* batchnorm.fwd_train, batchnorm.fwd_eval and batchnorm.bwd on the device
 * (kernels, launch shapes and the deterministic statistics: nn_bn.cu).
 * Semantics, shapes and checks are the reference's (ops/reference/
 * batchnorm.c, ops/shared/batchnorm_steps.h):
 *   fwd_train  in: x, gamma, beta, running_mean, running_var
 *              out: y, save_mean, save_invstd, running_mean, running_var
 *              (outputs 3 and 4 may be inputs 3 and 4 themselves)
 *   fwd_eval   in: as fwd_train   out: y
 *   bwd        in: x, dy, gamma, save_mean, save_invstd
 *              out: dx, dgamma, dbeta (accumulate)
 * Every tensor FP32 or FP16 (each its own; statistics in double), any
 * device strides that nest, padded channels never read or written. The
 * workspace (workspace_size) holds the per-channel factors and the
 * partial sums. */
#include "nn-impl.h"
#include "shared/batchnorm_steps.h"

static int bn_train_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_TRAIN, &a, reason, rs);
}
static int bn_eval_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_EVAL, &a, reason, rs);
}
static int bn_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return ops_bn_check(args, OPS_BN_BWD, &a, reason, rs);
}

/* fwd_train may update the running statistics in place */
static const ops_fp16_kernel bn_train16 =
    CUDA_NN_CHECK16_ALIAS(bn_train_check, OPS_FP16_NO_ACCUMULATE, 2, 3, 3, 4, 4);
static const ops_fp16_kernel bn_eval16 = CUDA_NN_CHECK16(bn_eval_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel bn_bwd16 =
    CUDA_NN_CHECK16(bn_bwd_check, offsetof(bp_batchnorm_attrs, accumulate));

/* Bytes of workspace of a call (0 for one the check refuses). */
static uint64_t bn_workspace_size(void *user, const bp_abi_kernel_args *args) {
  if (!ops_fp16_supports(user, args, NULL, 0)) return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  return cuda_bn_workspace_bytes(x->shape[0] * x->shape[1] * x->shape[2], x->shape[3]);
}

/* run()'s checks, the attributes and the workspace. */
static int bn_ready(void *user, const bp_abi_kernel_args *args, bp_batchnorm_attrs *a) {
  if (!cuda_nn_run_ok(user, args)) return 0;
  bp_sdk_read_attrs(args, a, sizeof *a, NULL, 0);
  return cuda_nn_workspace_ok(args, bn_workspace_size(user, args));
}

#define IN(i) cuda_nn_tensor(bp_sdk_input(args, i)), args->input_ptrs[i]
#define OUT(o) cuda_nn_tensor(bp_sdk_output(args, o)), args->output_ptrs[o]
#define IN_CH(i) cuda_nn_channels(bp_sdk_input(args, i), args->input_ptrs[i])
#define OUT_CH(o) cuda_nn_channels(bp_sdk_output(args, o), args->output_ptrs[o])

static int bn_train_run(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  if (!bn_ready(user, args, &a)) return BP_ABI_ERR_INVALID;
  const cuda_chan p[8] = {IN_CH(1),  IN_CH(2),  IN_CH(3),  IN_CH(4),
                          OUT_CH(1), OUT_CH(2), OUT_CH(3), OUT_CH(4)};
  return cuda_launch_result(args, "batchnorm.fwd_train",
                            cuda_nn_bn_fwd_train(args->stream, IN(0), OUT(0), p, a.eps,
                                                 a.momentum, args->workspace));
}

static int bn_eval_run(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  if (!bn_ready(user, args, &a)) return BP_ABI_ERR_INVALID;
  const cuda_chan p[4] = {IN_CH(1), IN_CH(2), IN_CH(3), IN_CH(4)};
  return cuda_launch_result(
      args, "batchnorm.fwd_eval",
      cuda_nn_bn_fwd_eval(args->stream, IN(0), OUT(0), p, a.eps, args->workspace));
}

static int bn_bwd_run(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  if (!bn_ready(user, args, &a)) return BP_ABI_ERR_INVALID;
  const cuda_chan p[5] = {IN_CH(2), IN_CH(3), IN_CH(4), OUT_CH(1), OUT_CH(2)};
  return cuda_launch_result(args, "batchnorm.bwd",
                            cuda_nn_bn_bwd(args->stream, IN(0), IN(1), OUT(0), p, a.accumulate,
                                           args->workspace));
}

const bp_abi_kernel cuda_bn_fwd_train_kernel =
    CUDA_NN_KERNEL("batchnorm.fwd_train", ops_fp16_supports, bn_workspace_size, bn_train_run,
                   &bn_train16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_bn_fwd_eval_kernel =
    CUDA_NN_KERNEL("batchnorm.fwd_eval", ops_fp16_supports, bn_workspace_size, bn_eval_run,
                   &bn_eval16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_bn_bwd_kernel =
    CUDA_NN_KERNEL("batchnorm.bwd", ops_fp16_supports, bn_workspace_size, bn_bwd_run, &bn_bwd16,
                   0, CUDA_NN_F16);
