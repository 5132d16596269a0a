/* Multi-head self-attention on the host's threads: attention.fwd and
 * attention.bwd (abi/bp_abi_ops.h). The (sample, head) pairs are cut into
 * at most OPS_ATTN_MAX_TASKS tasks (a function of the shape only) run by
 * bp_sdk_parallel_for, each head through the very loops of the reference
 * (ops/shared/attention_math.h: sums in double, in index order), so every
 * output is bit-identical to ops/reference's for any thread count
 * (cpu-impl.h's contract), each task instantiated for AVX-512F, AVX2 and
 * the baseline (CPU_DISPATCH). At T = 49, dh = 16 a head's GEMMs are
 * 49x49x16: small enough that the row loops over copies in double (which
 * vectorize across keys or channels without changing a sum's order) and
 * libm's exp, not a GEMM library, set the pace. FP16 calls go through the FP16 adapter
 * with its F16C conversions; lse stays FP32. */
#include "cpu-impl.h"
#include "shared/attention_math.h"

/* a task's heads, built for the set the kernel's context chose (every set
 * gives the same bits: no FMA contraction, -ffp-contract=off) */
CPU_INLINE void cpu_attn_heads_body(void *job, int64_t i) { ops_attn_task(job, i); }
CPU_DISPATCH(cpu_attn_heads, (void *job, int64_t i), (job, i))
static void cpu_attn_task(void *job, int64_t i) {
  cpu_attn_heads((cpu_isa_level)((const ops_attn_job *)job)->isa, job, i);
}

static int attn_run_fwd(void *user, const bp_abi_kernel_args *args) {
  return ops_attn_run(args, 0, 1, cpu_attn_task, (int)cpu_user_isa(user));
}
static int attn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  return ops_attn_run(args, 1, 1, cpu_attn_task, (int)cpu_user_isa(user));
}

static const ops_fp16_kernel attn_fwd16 = {
    .supports = ops_attn_supports_fwd,
    .workspace_size = ops_attn_workspace_fwd,
    .run = attn_run_fwd,
    .accumulate_offset = OPS_FP16_NO_ACCUMULATE, .convert = ops_fp16_convert_fast};
static const ops_fp16_kernel attn_bwd16 = {
    .supports = ops_attn_supports_bwd,
    .workspace_size = ops_attn_workspace_bwd,
    .run = attn_run_bwd,
    .accumulate_offset = offsetof(bp_attention_attrs, accumulate),
    .convert = ops_fp16_convert_fast};
const bp_abi_kernel cpu_attention_fwd =
    CPU_KERNEL16("attention.fwd", attn_fwd16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_attention_bwd =
    CPU_KERNEL16("attention.bwd", attn_bwd16, 0, CPU_FP16_DTYPES);
