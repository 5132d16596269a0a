/* relu.fwd, relu.bwd, add.fwd and add.bwd on the device (kernels:
 * nn_ew.cu). Semantics, shapes and checks are the reference's
 * (ops/reference/elementwise.c, ops/shared/elementwise_check.h):
 *   relu.fwd  in: x        out: y (may be x)    y = x < 0 ? 0 : x
 *   relu.bwd  in: y, dy    out: dx (may be dy)  dx (+)= y > 0 ? dy : 0
 *   add.fwd   in: a, b     out: y = a + b
 *   add.bwd   in: dy       out: da, db          da (+)= dy, db (+)= dy
 * Every tensor FP32 or FP16 (each its own), NHWC with any device strides
 * that nest (padded channels never read or written); the 16-byte tail
 * never touched. accumulate 1 adds into the outputs (FP16: rounded once
 * after the FP32 addition). */
#include "nn-impl.h"
#include "shared/elementwise_check.h"

static int relu_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 1, 1, &a, reason, rs);
}
static int two_in_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 2, 1, &a, reason, rs);
}
static int add_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 1, 2, &a, reason, rs);
}

#define EW_ACC offsetof(bp_elementwise_attrs, accumulate)
/* the "may alias" pairs: relu.fwd y with x, relu.bwd dx with dy */
static const ops_fp16_kernel relu_fwd16 =
    CUDA_NN_CHECK16_ALIAS(relu_fwd_check, OPS_FP16_NO_ACCUMULATE, 1, 0, 0, 0, 0);
static const ops_fp16_kernel relu_bwd16 =
    CUDA_NN_CHECK16_ALIAS(two_in_check, EW_ACC, 1, 0, 1, 0, 0);
static const ops_fp16_kernel add_fwd16 = CUDA_NN_CHECK16(two_in_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel add_bwd16 = CUDA_NN_CHECK16(add_bwd_check, EW_ACC);

/* The accumulate flag of a checked call. */
static int ew_accumulate(const bp_abi_kernel_args *args) {
  bp_elementwise_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return a.accumulate;
}

#define IN(i) cuda_nn_tensor(bp_sdk_input(args, i)), args->input_ptrs[i]
#define OUT(o) cuda_nn_tensor(bp_sdk_output(args, o)), args->output_ptrs[o]

static int relu_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "relu.fwd", cuda_nn_relu_fwd(args->stream, IN(0), OUT(0)));
}

static int relu_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "relu.bwd", cuda_nn_relu_bwd(args->stream, IN(0), IN(1), OUT(0), ew_accumulate(args)));
}

static int add_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "add.fwd", cuda_nn_add_fwd(args->stream, IN(0), IN(1), OUT(0)));
}

static int add_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "add.bwd", cuda_nn_add_bwd(args->stream, IN(0), OUT(0), OUT(1), ew_accumulate(args)));
}

const bp_abi_kernel cuda_relu_fwd_kernel =
    CUDA_NN_KERNEL("relu.fwd", ops_fp16_supports, NULL, relu_fwd_run, &relu_fwd16,
                   BP_ABI_KERNEL_IN_PLACE, CUDA_NN_F16);
const bp_abi_kernel cuda_relu_bwd_kernel =
    CUDA_NN_KERNEL("relu.bwd", ops_fp16_supports, NULL, relu_bwd_run, &relu_bwd16,
                   BP_ABI_KERNEL_IN_PLACE, CUDA_NN_F16);
const bp_abi_kernel cuda_add_fwd_kernel =
    CUDA_NN_KERNEL("add.fwd", ops_fp16_supports, NULL, add_fwd_run, &add_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_add_bwd_kernel =
    CUDA_NN_KERNEL("add.bwd", ops_fp16_supports, NULL, add_bwd_run, &add_bwd16, 0, CUDA_NN_F16);
