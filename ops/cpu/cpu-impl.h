/* Private helpers of the fast CPU op module (ops/cpu/). Nothing here is
 * exported: the module is built with -fvisibility=hidden and only the ABI
 * entry (module.c) is visible.
 *
 * What it holds: vectorized FP32 kernels for the memory-bound ops that
 * dominate a CPU training step besides the GEMMs: range.sgd, range.adamw
 * (optim.c), relu.fwd and relu.bwd (relu.c), maxpool.fwd and maxpool.bwd
 * (pool.c), batchnorm.fwd_train, .fwd_eval and .bwd and their fused
 * batchnorm_relu forms (batchnorm.c; these two vectorized across
 * channels); softmax_ce.fwd_bwd on FP32 (softmax_ce.c: scalar rows, libm's
 * exp and log as the reference calls them); and the span ops of a mixed-precision
 * step, range.zero, range.cast, range.unscale and range.nan_check
 * (range_fp16.c: F16C conversions, spans cut into chunks run on the
 * host's threads); attention.fwd and attention.bwd (attention.c: the
 * reference's loops, ops/shared/attention_math.h, per task of (sample,
 * head) pairs); and the ViT ops gelu_tanh (gelu_tanh.c: scalar, libm's
 * tanh, threaded), layernorm (layernorm.c: vectorized across channels,
 * threaded over positions) and pos_embed (pos_embed.c). Every kernel runs its work in tasks on the host's
 * threads (see "Threads" below). Implementation "cpu", device "cpu",
 * priority 5 (ops/blas uses 10; the reference module is REFERENCE
 * and only serves what nothing else supports), DETERMINISTIC, plus
 * IN_PLACE where the reference kernel has it (relu).
 *
 * Contract: every output is bit-identical to the reference kernel's on the
 * same inputs. Each element goes through the very IEEE float operations of
 * ops/reference (range.c, elementwise.c, pool.c, batchnorm.c), in the same
 * order, with the same scalar factors (formed in double and rounded once,
 * as there); only the
 * loops are different: flat, restrict-qualified, one per mode (weight
 * decay on or off, Nesterov, accumulate, in place) so the compiler
 * vectorizes them. The module is compiled with -O3 -ffp-contract=off (no
 * a*b+c fused into an FMA, which AVX-512 and clang's default contraction
 * would otherwise do) and -fno-math-errno (so sqrtf becomes vsqrtps; the
 * value is the same correctly rounded square root, only errno is not set),
 * never with fast-math. The reference module is compiled with
 * -ffp-contract=off too (ops/reference/CMakeLists.txt), so neither fuses
 * whatever -march CMAKE_C_FLAGS names. The shared per-channel steps of
 * batch norm (ops/shared/batchnorm_steps.h) are compiled into both
 * modules under these flags.
 *   One caveat, which IEEE 754 leaves open: when both operands of one
 * addition are NaNs with different payloads, which payload survives
 * depends on the operand order the compiler picked, here and in the
 * reference alike (clang 14's baseline relu.bwd loop picks the order its
 * scalar reference does not; gcc 12 keeps it); every other NaN (a NaN
 * input meeting a number, or a NaN the arithmetic makes) has the same
 * bits.
 *
 * Arguments: supports() runs the reference kernel's own checks (the module
 * SDK, abi/bp_abi_sdk.h, and ops/shared/range_check.h, elementwise_check.h,
 * pool_check.h and batchnorm_steps.h, which ops/reference uses too), so
 * this module accepts and refuses what the reference does, with the same
 * reasons; then it refuses, with a reason, the layouts its
 * flat loops cannot take: relu tensors whose logical elements are not one
 * dense run (cpu_dense), maxpool and batchnorm tensors (x-shaped ones for
 * batchnorm) whose channels are not contiguous (cpu_channels_contiguous),
 * which the reference then serves. Range spans
 * are always dense ([1,1,1,E], stride 1). run() repeats the checks, then
 * bp_sdk_check_ptrs, with the host's reason buffer, and returns
 * BP_ABI_ERR_INVALID when one fails.
 *
 * ISA dispatch: each inner loop is written once (an always-inline body)
 * and instantiated three times, for AVX-512F, AVX2 and the x86-64 baseline
 * (SSE2) through __attribute__((target(...))); the kernel's context
 * (cpu_user) says which set runs, chosen when a registry loads the module (__builtin_cpu_supports,
 * which also checks that the OS saves the vector state) and lowered by
 * the module option cpu_isa=avx512f|avx2|default (the CLI's BP_CPU_ISA;
 * CTest runs tests/test_ops_cpu.c once
 * per set). Not target_clones: clang 14 gives the resolver of every cloned
 * function default visibility (it lands in the dynamic symbol table beside
 * the ABI entry, and a visibility attribute next to target_clones is an
 * error), and explicit dispatch lets the tests check each set. Other
 * architectures get only the portable loops, vectorized for the baseline
 * ISA. */
#ifndef BP_OPS_CPU_IMPL_H
#define BP_OPS_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "shared/fp16_convert_x86.h"

#define CPU_IMPL "cpu"
#define CPU_DEVICE "cpu"
#define CPU_PRIORITY 5
#define CPU_FLAGS BP_ABI_KERNEL_DETERMINISTIC

/* The instruction sets the loops are built for, lowest first. */
typedef enum cpu_isa_level {
  CPU_ISA_DEFAULT = 0, /* the baseline of the target (SSE2 on x86-64) */
  CPU_ISA_AVX2 = 1,
  CPU_ISA_AVX512F = 2,
} cpu_isa_level;

const char *cpu_isa_name(cpu_isa_level isa);

/* What every kernel of this module receives as `user`: module.c's
 * init_ctx makes one context per registry that loads the module, holding
 * the instruction set chosen for that registry (its cpu_isa option) and
 * the two flavours below, and registers each kernel pointing into it (the
 * FP16 adapter's records are copied into the context too, their inner
 * `user` pointing at these). A NULL user (a static descriptor called
 * directly) runs the baseline loops. */
typedef struct cpu_user {
  cpu_isa_level isa; /* the set the loops run */
  int bn_relu;       /* 1: batchnorm_relu.* (the descriptors' user is cpu_relu_tag) */
} cpu_user;
/* The static descriptors of batchnorm_relu.* carry this as `user`; the
 * module maps it to its context's relu flavour. */
extern const cpu_user cpu_relu_tag;
static inline cpu_isa_level cpu_user_isa(const void *user) {
  return user ? ((const cpu_user *)user)->isa : CPU_ISA_DEFAULT;
}

/* Marks the three instantiations of a loop. */
#if defined(__x86_64__) || defined(__i386__)
#define CPU_HAVE_X86_VARIANTS 1
#define CPU_TARGET_AVX512F __attribute__((target("avx512f")))
#define CPU_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define CPU_HAVE_X86_VARIANTS 0
#endif
#define CPU_INLINE static inline __attribute__((always_inline))

/* CPU_DISPATCH(name, (params), (args)) defines
 * `static void name(cpu_isa_level isa, params)` that runs name##_body(args)
 * (a CPU_INLINE function) compiled for the set `isa` names (the kernel's
 * context's, cpu_user_isa, carried into the tasks by their job):
 * name##_avx512f, name##_avx2 and name##_default are the same loop built
 * three times, each vectorized for its own registers. */
#define CPU_UNPAREN(...) __VA_ARGS__
#if CPU_HAVE_X86_VARIANTS
#define CPU_DISPATCH(name, params, args)                                                     \
  CPU_TARGET_AVX512F static void name##_avx512f params { name##_body args; }               \
  CPU_TARGET_AVX2 static void name##_avx2 params { name##_body args; }                     \
  static void name##_default params { name##_body args; }                                  \
  static void name(cpu_isa_level isa, CPU_UNPAREN params) {                                \
    switch (isa) {                                                                         \
      case CPU_ISA_AVX512F: name##_avx512f args; return;                                   \
      case CPU_ISA_AVX2: name##_avx2 args; return;                                         \
      default: name##_default args; return;                                                \
    }                                                                                      \
  }
#else
#define CPU_DISPATCH(name, params, args)                            \
  static void name(cpu_isa_level isa, CPU_UNPAREN params) {         \
    (void)isa;                                                      \
    name##_body args;                                               \
  }
#endif

/* Threads: a kernel cuts its work into tasks whose bounds depend on the
 * shape only, never on the thread count, and runs them through the host's
 * threads (bp_sdk_parallel_for). Each task writes only its own elements and
 * each sum runs in the order the reference takes too, whatever the thread
 * count: inside one task, or (batch norm's statistics) as partial sums over
 * fixed chunks of pixels, one task each, added in chunk order on the
 * calling thread (ops/shared/batchnorm_steps.h). So every bit is the same
 * for any thread count, and the same as the reference's. A task
 * holds at least CPU_TASK_ELEMS elements of work (tens of microseconds,
 * which dwarf the hand-off); a call with less is one task, run on the
 * calling thread (a batch-1 inference pays nothing). */
#define CPU_TASK_ELEMS ((int64_t)1 << 16)

/* Items per task when one item is item_elems elements: enough for
 * CPU_TASK_ELEMS, at least one. */
static inline int64_t cpu_items_per_task(int64_t item_elems) {
  return item_elems >= CPU_TASK_ELEMS ? 1 : (CPU_TASK_ELEMS + item_elems - 1) / item_elems;
}

/* Task i of `per` items out of `items`: its first item, *end one past its last. */
static inline int64_t cpu_task_items(int64_t i, int64_t per, int64_t items, int64_t *end) {
  const int64_t lo = i * per;
  *end = items - lo < per ? items : lo + per;
  return lo;
}

/* The number of tasks of `per` items out of `items`. */
static inline int64_t cpu_task_count(int64_t items, int64_t per) { return (items + per - 1) / per; }

/* 1 when t's logical elements are one dense run in NHWC order (every
 * dimension of extent > 1 strided by the product of the extents inside
 * it), so element i of the compact order is at ptr + i; else 0 with a
 * reason naming `name`. t went through bp_sdk_check_tensor. */
int cpu_dense(const bp_abi_tensor *t, const char *name, char *reason, size_t reason_size);

/* 1 when t's channels are contiguous (stride[3] 1, or one channel), so
 * channel c of a pixel is at its first channel + c; padded channels and any
 * outer strides allowed. Else 0 with a reason naming `name` (pool.c). */
int cpu_channels_contiguous(const bp_abi_tensor *t, const char *name, char *reason,
                            size_t reason_size);

/* The kernels, one descriptor each (optim.c, relu.c, pool.c, batchnorm.c). */
extern const bp_abi_kernel cpu_range_sgd, cpu_range_adamw, cpu_relu_fwd, cpu_relu_bwd;
/* range_fp16.c: the span ops of a mixed-precision step */
extern const bp_abi_kernel cpu_range_zero, cpu_range_cast, cpu_range_unscale, cpu_range_nan_check;
extern const bp_abi_kernel cpu_maxpool_fwd, cpu_maxpool_bwd;
extern const bp_abi_kernel cpu_batchnorm_fwd_train, cpu_batchnorm_fwd_eval, cpu_batchnorm_bwd;
extern const bp_abi_kernel cpu_batchnorm_relu_fwd_train, cpu_batchnorm_relu_fwd_eval,
    cpu_batchnorm_relu_bwd;
/* softmax_ce.c: FP32 logits, bit-identical to the reference's */
extern const bp_abi_kernel cpu_softmax_ce_fwd_bwd;
/* attention.c: the reference's loops on the host's threads */
extern const bp_abi_kernel cpu_attention_fwd, cpu_attention_bwd;
/* gelu_tanh.c, layernorm.c, pos_embed.c: the ViT ops */
extern const bp_abi_kernel cpu_gelu_tanh_fwd, cpu_gelu_tanh_bwd;
extern const bp_abi_kernel cpu_layernorm_fwd, cpu_layernorm_bwd;
extern const bp_abi_kernel cpu_pos_embed_fwd, cpu_pos_embed_bwd;

/* A descriptor of this module: op name, supports, run, extra flags and the
 * dtypes among the op's tensors (as the reference declares them: FP32,
 * plus INT8 for the maxpool mask). */
#define CPU_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, dtype_mask)                  \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = CPU_IMPL,                \
    .device = CPU_DEVICE, .dtypes = (dtype_mask), .priority = CPU_PRIORITY,                  \
    .flags = CPU_FLAGS | (extra_flags), .supports = (supports_fn), .run = (run_fn)           \
  }
#define CPU_KERNEL(op_name, supports_fn, run_fn, extra_flags)                                 \
  CPU_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32))
#define CPU_POOL_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8))

/* relu, maxpool and batch norm also take FP16 tensors (mixed with FP32
 * and INT8 ones as the reference takes them) through the FP16 adapter
 * (shared/fp16_adapter.h): compact FP32 copies, the FP32 loops above (so
 * padded FP16 features are fine), each FP16 output rounded once; the
 * conversions are F16C loops where the CPU has them
 * (shared/fp16_convert_x86.h), the same bits as the scalar ones. FP32
 * calls go straight to the FP32 kernel. CPU_FP16 / CPU_FP16_ALIAS make the
 * adapter's record (as REF_FP16 in ops/reference), CPU_KERNEL16 the
 * descriptor. */
#define CPU_FP16_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))
#define CPU_FP16_ALIAS(supports_fn, run_fn, acc_offset, n_alias, out0, in0, out1, in1)        \
  {                                                                                          \
    .supports = (supports_fn), .run = (run_fn), .accumulate_offset = (acc_offset),          \
    .alias_count = (n_alias), .alias_out = {(out0), (out1)}, .alias_in = {(in0), (in1)},    \
    .convert = ops_fp16_convert_fast                                                         \
  }
#define CPU_FP16(supports_fn, run_fn, acc_offset) \
  CPU_FP16_ALIAS(supports_fn, run_fn, acc_offset, 0, 0, 0, 0, 0)
#define CPU_KERNEL16(op_name, fp16_kernel, extra_flags, dtype_mask)                           \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = CPU_IMPL,                \
    .device = CPU_DEVICE, .dtypes = (dtype_mask), .priority = CPU_PRIORITY,                  \
    .flags = CPU_FLAGS | (extra_flags), OPS_FP16_FUNCS(&(fp16_kernel))                       \
  }

#endif
