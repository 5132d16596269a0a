/* The Winograd convolution module (bp_ops_winograd.so): its ABI entry (the
 * only exported symbol). Kernels (conv2d.c): conv2d.fwd, conv2d.bwd_data
 * and conv2d.bwd_filter, FP32, device "cpu", implementation "winograd", priority
 * WINO_PRIORITY, per-node state. The transforms and multiplies are AVX2
 * and FMA code (wino_avx2.c), so init refuses the module, with the
 * reason, on a CPU without them; nothing of that file runs before the
 * check. */
#include <stdio.h>

#include "module_register.h"
#include "winograd-impl.h"
#ifdef BP_OPS_WINOGRAD_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_WINOGRAD_VERSION
#define BP_OPS_WINOGRAD_VERSION "0.0.0"
#endif
#ifndef BP_OPS_WINOGRAD_BUILD_ID
#define BP_OPS_WINOGRAD_BUILD_ID "unknown"
#endif

#define WINO_MODULE_NAME "ops-winograd"

static const bp_abi_kernel *const wino_kernels[] = {
    &wino_conv2d_fwd,
    &wino_conv2d_bwd_data,
    &wino_conv2d_bwd_filter,
};

static int wino_init(const bp_abi_host *host) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    if (host && host->error)
      host->error(host->ctx, WINO_MODULE_NAME ": needs a CPU with AVX2 and FMA (this one lacks "
                             "them); oneDNN or the reference serve the convolutions");
    return BP_ABI_ERR_UNSUPPORTED;
  }
  return ops_register_kernels(host, WINO_MODULE_NAME, wino_kernels,
                              sizeof wino_kernels / sizeof wino_kernels[0]);
}

static const bp_abi_module wino_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 4, /* per-node state and the thread service */
    .name = WINO_MODULE_NAME,
    .version = BP_OPS_WINOGRAD_VERSION,
    .build_id = BP_OPS_WINOGRAD_BUILD_ID,
    .init = wino_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &wino_module; }
