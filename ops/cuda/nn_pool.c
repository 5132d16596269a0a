/* maxpool, avgpool and global_avgpool (forward and backward) on the device
 * (kernels: nn_pool.cu). Semantics, shapes and checks are the reference's
 * (ops/reference/pool.c, ops/shared/pool_check.h):
 *   maxpool.fwd  in: x         out: y, mask (INT8: tap ky*kw + kx of the max)
 *   maxpool.bwd  in: dy, mask  out: dx (accumulate)
 *   avgpool.fwd  in: x         out: y
 *   avgpool.bwd  in: dy        out: dx (accumulate)
 *   global_avgpool.fwd  in: x [N,H,W,C]   out: y [N,1,1,C]
 *   global_avgpool.bwd  in: dy [N,1,1,C]  out: dx [N,H,W,C] (accumulate)
 * x, y, dy, dx FP32 or FP16 (each its own), any device strides that nest,
 * padded channels never read or written; no output aliases an input.
 * maxpool.bwd cannot refuse a bad mask value at run time as the reference
 * does (that needs a host read): such a value adds nothing (nn_pool.cu). */
#include "nn-impl.h"
#include "shared/pool_check.h"

static int maxpool_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_MAX_FWD, &g, reason, rs);
}
static int maxpool_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_MAX_BWD, &g, reason, rs);
}
static int avgpool_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_AVG_FWD, &g, reason, rs);
}
static int avgpool_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  ops_pool_geom g;
  return ops_pool_check(args, OPS_POOL_AVG_BWD, &g, reason, rs);
}
static int gap_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return ops_gap_check(args, 1, &a, &x, &y, reason, rs);
}
static int gap_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  const bp_abi_tensor *x, *y;
  return ops_gap_check(args, 0, &a, &x, &y, reason, rs);
}

#define POOL_ACC offsetof(bp_pool_attrs, accumulate)
#define GAP_ACC offsetof(bp_elementwise_attrs, accumulate)
static const ops_fp16_kernel maxpool_fwd16 =
    CUDA_NN_CHECK16(maxpool_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel maxpool_bwd16 = CUDA_NN_CHECK16(maxpool_bwd_check, POOL_ACC);
static const ops_fp16_kernel avgpool_fwd16 =
    CUDA_NN_CHECK16(avgpool_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel avgpool_bwd16 = CUDA_NN_CHECK16(avgpool_bwd_check, POOL_ACC);
static const ops_fp16_kernel gap_fwd16 = CUDA_NN_CHECK16(gap_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gap_bwd16 = CUDA_NN_CHECK16(gap_bwd_check, GAP_ACC);

/* The window of a checked call, and its accumulate flag. */
static cuda_pool pool_window(const bp_abi_kernel_args *args, int *accumulate) {
  bp_pool_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  cuda_pool g = {a.kernel_h, a.kernel_w, a.stride_h, a.stride_w,
                 a.pad_h,    a.pad_w,    a.count_include_pad};
  *accumulate = a.accumulate;
  return g;
}

#define IN(i) cuda_nn_tensor(bp_sdk_input(args, i)), args->input_ptrs[i]
#define OUT(o) cuda_nn_tensor(bp_sdk_output(args, o)), args->output_ptrs[o]

static int maxpool_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  int acc;
  const cuda_pool g = pool_window(args, &acc);
  return cuda_launch_result(args, "maxpool.fwd",
                            cuda_nn_maxpool_fwd(args->stream, g, IN(0), OUT(0), OUT(1)));
}

static int maxpool_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  int acc;
  const cuda_pool g = pool_window(args, &acc);
  return cuda_launch_result(args, "maxpool.bwd",
                            cuda_nn_maxpool_bwd(args->stream, g, IN(0), IN(1), OUT(0), acc));
}

static int avgpool_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  int acc;
  const cuda_pool g = pool_window(args, &acc);
  return cuda_launch_result(args, "avgpool.fwd",
                            cuda_nn_avgpool_fwd(args->stream, g, IN(0), OUT(0)));
}

static int avgpool_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  int acc;
  const cuda_pool g = pool_window(args, &acc);
  return cuda_launch_result(args, "avgpool.bwd",
                            cuda_nn_avgpool_bwd(args->stream, g, IN(0), OUT(0), acc));
}

static int gap_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "global_avgpool.fwd",
                            cuda_nn_gap_fwd(args->stream, IN(0), OUT(0)));
}

static int gap_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  bp_elementwise_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return cuda_launch_result(args, "global_avgpool.bwd",
                            cuda_nn_gap_bwd(args->stream, IN(0), OUT(0), a.accumulate));
}

#define POOL_MAX_DTYPES (CUDA_NN_F16 | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8))
const bp_abi_kernel cuda_maxpool_fwd_kernel = CUDA_NN_KERNEL(
    "maxpool.fwd", ops_fp16_supports, NULL, maxpool_fwd_run, &maxpool_fwd16, 0, POOL_MAX_DTYPES);
const bp_abi_kernel cuda_maxpool_bwd_kernel = CUDA_NN_KERNEL(
    "maxpool.bwd", ops_fp16_supports, NULL, maxpool_bwd_run, &maxpool_bwd16, 0, POOL_MAX_DTYPES);
const bp_abi_kernel cuda_avgpool_fwd_kernel = CUDA_NN_KERNEL(
    "avgpool.fwd", ops_fp16_supports, NULL, avgpool_fwd_run, &avgpool_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_avgpool_bwd_kernel = CUDA_NN_KERNEL(
    "avgpool.bwd", ops_fp16_supports, NULL, avgpool_bwd_run, &avgpool_bwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_gap_fwd_kernel = CUDA_NN_KERNEL(
    "global_avgpool.fwd", ops_fp16_supports, NULL, gap_fwd_run, &gap_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_gap_bwd_kernel = CUDA_NN_KERNEL(
    "global_avgpool.bwd", ops_fp16_supports, NULL, gap_bwd_run, &gap_bwd16, 0, CUDA_NN_F16);
