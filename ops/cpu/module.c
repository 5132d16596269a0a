/* The fast CPU op module: its ABI entry (the only exported symbol), the
 * table of kernels it registers, and the choice of the instruction set its
 * loops run with (cpu-impl.h). range.sgd, range.adamw, relu.fwd, relu.bwd,
 * maxpool.fwd, maxpool.bwd, batchnorm.fwd_train, batchnorm.fwd_eval and
 * batchnorm.bwd, FP32 (INT8 for the maxpool mask; the last five also
 * FP16, through shared/fp16_adapter.h, cpu-impl.h), batchnorm_relu.fwd_train,
 * .fwd_eval and .bwd (FP32), softmax_ce.fwd_bwd (FP32), and range.zero,
 * range.cast, range.unscale and range.nan_check (the dtypes of the
 * reference's), the ViT ops gelu_tanh.*, layernorm.* and pos_embed.* (FP32,
 * FP16 through the adapter), device
 * "cpu", implementation "cpu", priority 5, flagged DETERMINISTIC (relu
 * also IN_PLACE), not REFERENCE: the registry prefers
 * them to the reference kernels wherever their supports() holds, and a pin
 * (BP_KERNELS, e.g. "relu.*=reference") overrides that.
 *
 * Instruction set: the best of AVX-512F, AVX2 and the baseline that the
 * CPU and the OS support (__builtin_cpu_supports), chosen at init. The
 * host's module option "cpu_isa" (ABI 1.6; the CLI passes BP_CPU_ISA:
 * avx512f, avx2 or default) lowers it; a set above what the machine
 * supports, or an unknown name, is reported and ignored. Every set gives
 * the same bits. The choice is logged at info level (BP_LOG=info).
 *
 * State: none in globals. init_ctx (ABI 1.6) makes one context per
 * registry that loads the module, holding that registry's instruction set;
 * every kernel's user points into it (cpu-impl.h, cpu_user). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"
#include "module_register.h"
#ifdef BP_OPS_CPU_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_CPU_VERSION
#define BP_OPS_CPU_VERSION "0.0.0"
#endif
#ifndef BP_OPS_CPU_BUILD_ID
#define BP_OPS_CPU_BUILD_ID "unknown"
#endif

static const bp_abi_kernel *const cpu_kernels[] = {
    &cpu_range_sgd,
    &cpu_range_adamw,
    &cpu_range_zero,
    &cpu_range_cast,
    &cpu_range_unscale,
    &cpu_range_nan_check,
    &cpu_relu_fwd,
    &cpu_relu_bwd,
    &cpu_maxpool_fwd,
    &cpu_maxpool_bwd,
    &cpu_batchnorm_fwd_train,
    &cpu_batchnorm_fwd_eval,
    &cpu_batchnorm_bwd,
    &cpu_batchnorm_relu_fwd_train,
    &cpu_batchnorm_relu_fwd_eval,
    &cpu_batchnorm_relu_bwd,
    &cpu_softmax_ce_fwd_bwd,
    &cpu_attention_fwd,
    &cpu_attention_bwd,
    /* the ViT ops */
    &cpu_gelu_tanh_fwd,
    &cpu_gelu_tanh_bwd,
    &cpu_layernorm_fwd,
    &cpu_layernorm_bwd,
    &cpu_pos_embed_fwd,
    &cpu_pos_embed_bwd,
};

const cpu_user cpu_relu_tag = {CPU_ISA_DEFAULT, 1};

#define CPU_KERNEL_COUNT (sizeof cpu_kernels / sizeof cpu_kernels[0])

/* One registry's view of the module (init_ctx makes it, fini_ctx frees
 * it): the instruction set chosen from that registry's cpu_isa option,
 * and what the kernels it registered point at. Read-only after init_ctx,
 * so rank threads share it without a lock; two registries with different
 * options each run their own set. */
typedef struct cpu_ctx {
  cpu_user plain; /* every kernel but batchnorm_relu.* */
  cpu_user relu;  /* batchnorm_relu.* */
  ops_fp16_kernel fp16[CPU_KERNEL_COUNT]; /* the FP16 adapter's records, inner user mapped */
} cpu_ctx;

/* The context's counterpart of a static descriptor's user: NULL -> plain,
 * cpu_relu_tag -> relu. */
static void *cpu_map_user(cpu_ctx *ctx, const void *user) {
  return user == &cpu_relu_tag ? (void *)&ctx->relu : (void *)&ctx->plain;
}

const char *cpu_isa_name(cpu_isa_level isa) {
  switch (isa) {
    case CPU_ISA_AVX512F: return "avx512f";
    case CPU_ISA_AVX2: return "avx2";
    default: return "default";
  }
}

/* The best set the CPU and the OS support. */
static cpu_isa_level cpu_isa_detect(void) {
#if CPU_HAVE_X86_VARIANTS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CPU_ISA_AVX512F;
  if (__builtin_cpu_supports("avx2")) return CPU_ISA_AVX2;
#endif
  return CPU_ISA_DEFAULT;
}

/* Detects the set, applies the cpu_isa option (BP_CPU_ISA), logs the outcome. */
static cpu_isa_level cpu_isa_choose(const bp_abi_host *host) {
  const cpu_isa_level detected = cpu_isa_detect();
  cpu_isa_level use = detected;
  const char *source = "detected";
  char message[256];
  const char *text = bp_sdk_host_option(host, "cpu_isa");
  if (text && *text) {
    int asked = -1;
    for (int i = CPU_ISA_DEFAULT; i <= CPU_ISA_AVX512F; i++)
      if (strcmp(text, cpu_isa_name((cpu_isa_level)i)) == 0) asked = i;
    if (asked < 0) {
      snprintf(message, sizeof message,
               "ops-cpu: BP_CPU_ISA='%.64s' is not avx512f, avx2 or default; using %s", text,
               cpu_isa_name(detected));
      ops_host_log(host, BP_ABI_LOG_WARN, message);
    } else if (asked > (int)detected) {
      snprintf(message, sizeof message,
               "ops-cpu: BP_CPU_ISA=%s, but this machine supports up to %s; using %s", text,
               cpu_isa_name(detected), cpu_isa_name(detected));
      ops_host_log(host, BP_ABI_LOG_WARN, message);
    } else {
      use = (cpu_isa_level)asked;
      source = "BP_CPU_ISA";
    }
  }
  snprintf(message, sizeof message, "ops-cpu: %s loops (%s; the machine supports %s)",
           cpu_isa_name(use), source, cpu_isa_name(detected));
  ops_host_log(host, BP_ABI_LOG_INFO, message);
  return use;
}

/* Registers every kernel pointing into a new context. A static
 * descriptor's user is NULL, cpu_relu_tag, or (a kernel routed through the
 * FP16 adapter, CPU_KERNEL16) the adapter's ops_fp16_kernel record: that
 * record is copied into the context with its own user mapped. */
static int cpu_init_ctx(const bp_abi_host *host, void **ctx_out) {
  cpu_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    if (host && host->error) host->error(host->ctx, "ops-cpu: out of memory for the context");
    return BP_ABI_ERR_NOMEM;
  }
  ctx->plain.isa = ctx->relu.isa = cpu_isa_choose(host);
  ctx->relu.bn_relu = 1;
  bp_abi_kernel kernels[CPU_KERNEL_COUNT];
  const bp_abi_kernel *table[CPU_KERNEL_COUNT];
  for (size_t i = 0; i < CPU_KERNEL_COUNT; i++) {
    kernels[i] = *cpu_kernels[i];
    const void *user = cpu_kernels[i]->user;
    if (user && user != &cpu_relu_tag) {
      ctx->fp16[i] = *(const ops_fp16_kernel *)cpu_kernels[i]->user;
      ctx->fp16[i].user = cpu_map_user(ctx, ctx->fp16[i].user);
      kernels[i].user = &ctx->fp16[i];
    } else {
      kernels[i].user = cpu_map_user(ctx, user);
    }
    table[i] = &kernels[i];
  }
  const int rc = ops_register_kernels(host, "ops-cpu", table, CPU_KERNEL_COUNT);
  if (rc != BP_ABI_OK) {
    free(ctx); /* a failed init_ctx frees its own context (bp_abi.h) */
    return rc;
  }
  *ctx_out = ctx;
  return BP_ABI_OK;
}

static void cpu_fini_ctx(void *ctx) { free(ctx); }

/* init_ctx only: the module needs a 1.6 host (the cpu_isa option is 1.6
 * too), so init is NULL. */
static const bp_abi_module cpu_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 6,
    .name = "ops-cpu",
    .version = BP_OPS_CPU_VERSION,
    .build_id = BP_OPS_CPU_BUILD_ID,
    .init_ctx = cpu_init_ctx,
    .fini_ctx = cpu_fini_ctx,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cpu_module; }
