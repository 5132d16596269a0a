/* The ViT ops on the device (kernels: nn_vit.cu): gelu_tanh.fwd/.bwd,
 * layernorm.fwd/.bwd and pos_embed.fwd/.bwd. Semantics, shapes and checks
 * are the reference's (ops/reference/elementwise.c, layernorm.c,
 * pos_embed.c; ops/shared/elementwise_check.h, layernorm_steps.h):
 *   gelu_tanh.fwd  in: x                  out: y
 *   gelu_tanh.bwd  in: x, dy              out: dx (accumulate)
 *   layernorm.fwd  in: x, gain, bias      out: y, save_mean, save_invstd (FP32 [N,H,W,1])
 *   layernorm.bwd  in: x, dy, gain, save_mean, save_invstd
 *                  out: dx, dgain, dbias (accumulate)
 *   pos_embed.fwd  in: x, P[1,H,W,C]      out: y = x + P
 *   pos_embed.bwd  in: dy                 out: dx, dP (accumulate)
 * Every x-shaped tensor and gain, bias, P FP32 or FP16 (each its own),
 * NHWC with any device strides that nest; no output aliases an input. */
#include "nn-impl.h"
#include "shared/elementwise_check.h"
#include "shared/layernorm_steps.h"

static int gt_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 1, 1, &a, reason, rs);
}
static int gt_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 2, 1, &a, reason, rs);
}
static int ln_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ops_ln_check(args, OPS_LN_FWD, &a, reason, rs);
}
static int ln_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ops_ln_check(args, OPS_LN_BWD, &a, reason, rs);
}
static int pe_fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_pos_embed_check(args, 0, &a, reason, rs);
}
static int pe_bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_pos_embed_check(args, 1, &a, reason, rs);
}

#define EW_ACC offsetof(bp_elementwise_attrs, accumulate)
static const ops_fp16_kernel gt_fwd16 = CUDA_NN_CHECK16(gt_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gt_bwd16 = CUDA_NN_CHECK16(gt_bwd_check, EW_ACC);
static const ops_fp16_kernel ln_fwd16 = CUDA_NN_CHECK16(ln_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel ln_bwd16 =
    CUDA_NN_CHECK16(ln_bwd_check, offsetof(bp_layernorm_attrs, accumulate));
static const ops_fp16_kernel pe_fwd16 = CUDA_NN_CHECK16(pe_fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel pe_bwd16 = CUDA_NN_CHECK16(pe_bwd_check, EW_ACC);

/* The accumulate flag of a checked element-wise call. */
static int ew_accumulate(const bp_abi_kernel_args *args) {
  bp_elementwise_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return a.accumulate;
}

#define IN(i) cuda_nn_tensor(bp_sdk_input(args, i)), args->input_ptrs[i]
#define OUT(o) cuda_nn_tensor(bp_sdk_output(args, o)), args->output_ptrs[o]
#define IN_CH(i) cuda_nn_channels(bp_sdk_input(args, i), args->input_ptrs[i])
#define OUT_CH(o) cuda_nn_channels(bp_sdk_output(args, o), args->output_ptrs[o])

/* ---- gelu_tanh ------------------------------------------------------------ */

static int gt_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "gelu_tanh.fwd",
                            cuda_nn_gelu_tanh_fwd(args->stream, IN(0), OUT(0)));
}

static int gt_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "gelu_tanh.bwd",
      cuda_nn_gelu_tanh_bwd(args->stream, IN(0), IN(1), OUT(0), ew_accumulate(args)));
}

/* ---- layernorm ------------------------------------------------------------ */

/* Bytes of workspace of a backward call (0 for one the check refuses):
 * the per-chunk dgain/dbias sums. */
static uint64_t ln_workspace_size(void *user, const bp_abi_kernel_args *args) {
  if (!ops_fp16_supports(user, args, NULL, 0)) return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  return cuda_ln_workspace_bytes(ops_ln_chunk_count(x->shape[0] * x->shape[1] * x->shape[2]),
                                 x->shape[3]);
}

static int ln_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  bp_layernorm_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return cuda_launch_result(args, "layernorm.fwd",
                            cuda_nn_ln_fwd(args->stream, IN(0), IN_CH(1), IN_CH(2), OUT(0),
                                           OUT(1), OUT(2), a.eps));
}

static int ln_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args) ||
      !cuda_nn_workspace_ok(args, ln_workspace_size(user, args)))
    return BP_ABI_ERR_INVALID;
  bp_layernorm_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const int64_t M = x->shape[0] * x->shape[1] * x->shape[2];
  return cuda_launch_result(
      args, "layernorm.bwd",
      cuda_nn_ln_bwd(args->stream, IN(0), IN(1), IN_CH(2), IN(3), IN(4), OUT(0), OUT_CH(1),
                     OUT_CH(2), ops_ln_chunk_len(M), ops_ln_chunk_count(M), a.accumulate,
                     args->workspace));
}

/* ---- pos_embed ------------------------------------------------------------ */

static int pe_fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "pos_embed.fwd",
                            cuda_nn_pos_embed_fwd(args->stream, IN(0), IN(1), OUT(0)));
}

static int pe_bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "pos_embed.bwd",
      cuda_nn_pos_embed_bwd(args->stream, IN(0), OUT(0), OUT(1), ew_accumulate(args)));
}

const bp_abi_kernel cuda_gelu_tanh_fwd_kernel =
    CUDA_NN_KERNEL("gelu_tanh.fwd", ops_fp16_supports, NULL, gt_fwd_run, &gt_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_gelu_tanh_bwd_kernel =
    CUDA_NN_KERNEL("gelu_tanh.bwd", ops_fp16_supports, NULL, gt_bwd_run, &gt_bwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_ln_fwd_kernel =
    CUDA_NN_KERNEL("layernorm.fwd", ops_fp16_supports, NULL, ln_fwd_run, &ln_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_ln_bwd_kernel =
    CUDA_NN_KERNEL("layernorm.bwd", ops_fp16_supports, ln_workspace_size, ln_bwd_run, &ln_bwd16,
                   0, CUDA_NN_F16);
const bp_abi_kernel cuda_pos_embed_fwd_kernel =
    CUDA_NN_KERNEL("pos_embed.fwd", ops_fp16_supports, NULL, pe_fwd_run, &pe_fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_pos_embed_bwd_kernel =
    CUDA_NN_KERNEL("pos_embed.bwd", ops_fp16_supports, NULL, pe_bwd_run, &pe_bwd16, 0, CUDA_NN_F16);
