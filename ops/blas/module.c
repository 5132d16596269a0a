/* The BLAS op modules (blas-impl.h: one per GEMM provider): the ABI entry
 * (the only exported symbol) and the table of kernels each registers.
 * conv2d and fc, forward and both backwards, and the ViT's float loops
 * (attention.fwd/.bwd, gelu_tanh.fwd/.bwd: attention.c, gelu_tanh.c), FP32 (FP16 through
 * shared/fp16_adapter.h, blas-impl.h), device "cpu",
 * implementation "blas" (OpenBLAS, priority 10) or "dnnl" (oneDNN,
 * priority 12), flagged DETERMINISTIC (with a fixed thread count,
 * blas-impl.h), not REFERENCE: the registry prefers them to the reference
 * kernels wherever their supports() holds, and a pin (BP_KERNELS)
 * overrides that.
 *
 * Threads: the library runs every GEMM on its own threads. Their count is
 * the one the host lends the calling rank (ABI 1.4, args->threads->count:
 * the rank's share of the cores, threads.h), applied before every run, so
 * ranks never oversubscribe the machine and no environment variable is
 * involved. Where the args carry no thread service (a host older than 1.4,
 * or a caller that passes none) the library keeps its default (OpenBLAS:
 * OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, else one per core; oneDNN:
 * OpenMP's). The library's configuration is logged at info level
 * (BP_LOG=info; openblas.c: the kernel set, "core", in use and who chose
 * it). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "blas-impl.h"
#include "module_register.h"
#ifdef BLAS_MODULE_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BLAS_MODULE_VERSION
#define BLAS_MODULE_VERSION "0.0.0"
#endif
#ifndef BLAS_MODULE_BUILD_ID
#define BLAS_MODULE_BUILD_ID "unknown"
#endif

static const bp_abi_kernel *const blas_kernels[] = {
    &blas_conv2d_fwd, &blas_conv2d_bwd_data, &blas_conv2d_bwd_filter,
    &blas_fc_fwd,     &blas_fc_bwd_data,     &blas_fc_bwd_filter,
    &blas_attention_fwd, &blas_attention_bwd, &blas_gelu_tanh_fwd, &blas_gelu_tanh_bwd,
};
#define BLAS_KERNEL_COUNT (sizeof blas_kernels / sizeof blas_kernels[0])

/* The threads the host lends this call's rank, or 0 (keep the library's
 * count) where the args end before `threads` or carry none. */
static int blas_threads_of(const bp_abi_kernel_args *a) {
  const size_t end = offsetof(bp_abi_kernel_args, threads) + sizeof a->threads;
  if (a->struct_size < end || !a->threads || a->threads->count < 1) return 0;
  return a->threads->count;
}

/* What the module registers: each kernel's descriptor with a run() that
 * first applies the rank's thread count (user, supports() and the rest are
 * the kernel's own). One wrapper per table slot, as run() has no room for
 * the slot. */
#define BLAS_THREADED_RUN(i)                                                  \
  static int blas_threaded_run_##i(void *user, const bp_abi_kernel_args *a) { \
    blas_provider_use_threads(blas_threads_of(a));                            \
    return blas_kernels[i]->run(user, a);                                     \
  }
BLAS_THREADED_RUN(0)
BLAS_THREADED_RUN(1)
BLAS_THREADED_RUN(2)
BLAS_THREADED_RUN(3)
BLAS_THREADED_RUN(4)
BLAS_THREADED_RUN(5)
BLAS_THREADED_RUN(6)
BLAS_THREADED_RUN(7)
BLAS_THREADED_RUN(8)
BLAS_THREADED_RUN(9)
static int (*const blas_threaded_runs[])(void *, const bp_abi_kernel_args *) = {
    blas_threaded_run_0, blas_threaded_run_1, blas_threaded_run_2,
    blas_threaded_run_3, blas_threaded_run_4, blas_threaded_run_5,
    blas_threaded_run_6, blas_threaded_run_7, blas_threaded_run_8,
    blas_threaded_run_9,
};
_Static_assert(sizeof blas_threaded_runs / sizeof blas_threaded_runs[0] == BLAS_KERNEL_COUNT,
               "one threaded run() per kernel");

static int blas_register(const bp_abi_host *host) {
  bp_abi_kernel threaded[BLAS_KERNEL_COUNT];
  const bp_abi_kernel *table[BLAS_KERNEL_COUNT];
  for (size_t i = 0; i < BLAS_KERNEL_COUNT; i++) {
    threaded[i] = *blas_kernels[i];
    threaded[i].run = blas_threaded_runs[i];
    table[i] = &threaded[i];
  }
  return ops_register_kernels(host, BLAS_MODULE_NAME, table, BLAS_KERNEL_COUNT);
}

/* Logs the library in use. */
static void blas_log_library(const bp_abi_host *host) {
  char what[320], message[512];
  blas_provider_describe(what, sizeof what);
  snprintf(message, sizeof message, "%s: %s (threads per call: the rank's share, from the host)",
           BLAS_MODULE_NAME, what);
  ops_host_log(host, BP_ABI_LOG_INFO, message);
}

static int blas_init(const bp_abi_host *host) {
  char reason[256];
  if (!blas_provider_load(host, reason, sizeof reason)) {
    char message[320];
    snprintf(message, sizeof message, "%s: %s", BLAS_MODULE_NAME, reason);
    if (host->error) host->error(host->ctx, message); /* the loader's record says why */
    return BP_ABI_ERR_UNSUPPORTED;
  }
  const int rc = blas_register(host);
  if (rc == BP_ABI_OK) blas_log_library(host);
  return rc;
}

static const bp_abi_module blas_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 0,
    .name = BLAS_MODULE_NAME,
    .version = BLAS_MODULE_VERSION,
    .build_id = BLAS_MODULE_BUILD_ID,
    .init = blas_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &blas_module; }
