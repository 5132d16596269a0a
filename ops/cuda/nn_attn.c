/* attention.fwd and attention.bwd on the device (kernels, launch shapes
 * and the order of their sums: nn_attn.cu). Semantics, shapes and checks
 * are the reference's (ops/reference/attention.c,
 * ops/shared/attention_math.h), FP16 qkv, y, dy and dqkv included (lse
 * stays FP32), plus two limits of these kernels, refused with a reason so
 * the node goes elsewhere: dh <= CUDA_ATTN_MAX_DH and the head's operands
 * within CUDA_ATTN_MAX_SHARED bytes of shared memory (T * dh <= 3072 for
 * the backward). The arithmetic is float, so results match the
 * reference's within validate's FP32 tolerance, not bit for bit. No
 * workspace. */
#include "nn-impl.h"
#include "shared/attention_math.h"

static int attn_limits(const ops_attn_geo *g, int bwd, char *reason, size_t rs) {
  if (g->dh > CUDA_ATTN_MAX_DH)
    return bp_sdk_fail(reason, rs, "cuda attention: head width dh = %lld exceeds %d",
                       (long long)g->dh, CUDA_ATTN_MAX_DH);
  const size_t shared = bwd ? cuda_attn_bwd_shared(g->T, g->dh) : cuda_attn_fwd_shared(g->T, g->dh);
  if (shared > CUDA_ATTN_MAX_SHARED)
    return bp_sdk_fail(reason, rs,
                       "cuda attention: %lld tokens of width %lld need %zu bytes of shared "
                       "memory, more than %u",
                       (long long)g->T, (long long)g->dh, shared, CUDA_ATTN_MAX_SHARED);
  return 1;
}

static int fwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  ops_attn_geo g;
  return ops_attn_check(args, 0, &g, reason, rs) && attn_limits(&g, 0, reason, rs);
}
static int bwd_check(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  ops_attn_geo g;
  return ops_attn_check(args, 1, &g, reason, rs) && attn_limits(&g, 1, reason, rs);
}

static const ops_fp16_kernel fwd16 = CUDA_NN_CHECK16(fwd_check, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel bwd16 =
    CUDA_NN_CHECK16(bwd_check, offsetof(bp_attention_attrs, accumulate));

#define T_IN(i) cuda_nn_tensor(bp_sdk_input(args, i))
#define T_OUT(o) cuda_nn_tensor(bp_sdk_output(args, o))

static int fwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  bp_attention_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return cuda_launch_result(
      args, "attention.fwd",
      cuda_nn_attention_fwd(args->stream, T_IN(0), args->input_ptrs[0], T_OUT(0),
                            args->output_ptrs[0], T_OUT(1), (float *)args->output_ptrs[1],
                            a.heads, a.causal));
}

static int bwd_run(void *user, const bp_abi_kernel_args *args) {
  if (!cuda_nn_run_ok(user, args)) return BP_ABI_ERR_INVALID;
  bp_attention_attrs a;
  bp_sdk_read_attrs(args, &a, sizeof a, NULL, 0);
  return cuda_launch_result(
      args, "attention.bwd",
      cuda_nn_attention_bwd(args->stream, T_IN(0), args->input_ptrs[0], T_IN(1),
                            args->input_ptrs[1], T_IN(2), (const float *)args->input_ptrs[2],
                            T_IN(3), args->input_ptrs[3], T_OUT(0), args->output_ptrs[0],
                            a.heads, a.causal, a.accumulate));
}

const bp_abi_kernel cuda_attention_fwd_kernel =
    CUDA_NN_KERNEL("attention.fwd", ops_fp16_supports, NULL, fwd_run, &fwd16, 0, CUDA_NN_F16);
const bp_abi_kernel cuda_attention_bwd_kernel =
    CUDA_NN_KERNEL("attention.bwd", ops_fp16_supports, NULL, bwd_run, &bwd16, 0, CUDA_NN_F16);
