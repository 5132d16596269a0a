/* The fast CPU op module: its ABI entry (the only exported symbol), the
 * table of kernels it registers, and the choice of the instruction set its
 * loops run with (cpu-impl.h). range.sgd, range.adamw, relu.fwd, relu.bwd,
 * maxpool.fwd, maxpool.bwd, batchnorm.fwd_train, batchnorm.fwd_eval and
 * batchnorm.bwd, FP32 (INT8 for the maxpool mask; the last five also
 * FP16, through shared/fp16_adapter.h, cpu-impl.h), batchnorm_relu.fwd_train,
 * .fwd_eval and .bwd (FP32), softmax_ce.fwd_bwd (FP32), and range.zero,
 * range.cast, range.unscale and range.nan_check (the dtypes of the
 * reference's), device
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
 * the same bits. The choice is logged at info level (BP_LOG=info). */
#include <stdatomic.h>
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
};

/* Written at init, read by every run (possibly from several rank threads,
 * and a second registry loading the module re-runs init): atomic. */
static atomic_int cpu_isa_in_use = CPU_ISA_DEFAULT;

cpu_isa_level cpu_isa(void) {
  return (cpu_isa_level)atomic_load_explicit(&cpu_isa_in_use, memory_order_relaxed);
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
static void cpu_isa_init(const bp_abi_host *host) {
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
  atomic_store_explicit(&cpu_isa_in_use, (int)use, memory_order_relaxed);
  snprintf(message, sizeof message, "ops-cpu: %s loops (%s; the machine supports %s)",
           cpu_isa_name(use), source, cpu_isa_name(detected));
  ops_host_log(host, BP_ABI_LOG_INFO, message);
}

static int cpu_init(const bp_abi_host *host) {
  const int rc = ops_register_kernels(host, "ops-cpu", cpu_kernels,
                                      sizeof cpu_kernels / sizeof cpu_kernels[0]);
  if (rc == BP_ABI_OK) cpu_isa_init(host);
  return rc;
}

static const bp_abi_module cpu_module = {
    sizeof(bp_abi_module), BP_ABI_MAJOR,        BP_ABI_MINOR, 0,        0, "ops-cpu",
    BP_OPS_CPU_VERSION,    BP_OPS_CPU_BUILD_ID, cpu_init,     NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cpu_module; }
