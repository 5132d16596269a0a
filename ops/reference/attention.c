/* Multi-head self-attention reference: attention.fwd and attention.bwd
 * (abi/bp_abi_ops.h), one (sample, head) after another on the calling
 * thread. The arithmetic (every sum in double, in index order; the
 * backward recomputes the probabilities from the saved log-sum-exp) and
 * the checks are ops/shared/attention_math.h, which ops/cpu runs on the
 * host's threads with the same bits. FP16 calls go through the FP16
 * adapter (FP32 copies, each output rounded once; lse stays FP32). The
 * workspace is one task's scratch per task (at most OPS_ATTN_MAX_TASKS). */
#include "reference-impl.h"
#include "shared/attention_math.h"

static void ref_attn_task(void *job, int64_t i) { ops_attn_task(job, i); }

static int attn_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_run(args, 0, 0, ref_attn_task, 0);
}
static int attn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_run(args, 1, 0, ref_attn_task, 0);
}

static const ops_fp16_kernel attn_fwd16 = {
    .supports = ops_attn_supports_fwd,
    .workspace_size = ops_attn_workspace_fwd,
    .run = attn_run_fwd,
    .accumulate_offset = OPS_FP16_NO_ACCUMULATE, .convert = ops_fp16_convert_scalar};
static const ops_fp16_kernel attn_bwd16 = {
    .supports = ops_attn_supports_bwd,
    .workspace_size = ops_attn_workspace_bwd,
    .run = attn_run_bwd,
    .accumulate_offset = offsetof(bp_attention_attrs, accumulate),
    .convert = ops_fp16_convert_scalar};
const bp_abi_kernel ref_attention_fwd =
    REF_KERNEL16("attention.fwd", attn_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_attention_bwd =
    REF_KERNEL16("attention.bwd", attn_bwd16, 0, REF_FP16_DTYPES);
