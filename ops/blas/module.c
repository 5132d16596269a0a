/* The BLAS op modules (blas-impl.h: one per GEMM provider): the ABI entry
 * (the only exported symbol) and the table of kernels each registers.
 * conv2d and fc, forward and both backwards, FP32, device "cpu",
 * implementation "blas" (OpenBLAS, priority 10) or "dnnl" (oneDNN,
 * priority 12), flagged DETERMINISTIC (with a fixed thread count,
 * blas-impl.h), not REFERENCE: the registry prefers them to the reference
 * kernels wherever their supports() holds, and a pin (BP_KERNELS)
 * overrides that.
 *
 * Threads: the library runs every GEMM on its own threads. Their count is
 * BP_BLAS_THREADS when that is set (an integer 1..1024, applied once at
 * init; it holds for the whole process and for every calling thread), else
 * the library's default (OpenBLAS: OPENBLAS_NUM_THREADS, OMP_NUM_THREADS,
 * else one per core; oneDNN: OpenMP's, OMP_NUM_THREADS else one per core).
 * With several ranks as threads in one process, BP_BLAS_THREADS=1 (or
 * cores / ranks) avoids oversubscription. The count is logged at info level
 * (BP_LOG=info), with the library's configuration (openblas.c: the kernel
 * set, "core", in use and who chose it). */
#include <errno.h>
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

#define BLAS_MAX_THREADS 1024

static const bp_abi_kernel *const blas_kernels[] = {
    &blas_conv2d_fwd, &blas_conv2d_bwd_data, &blas_conv2d_bwd_filter,
    &blas_fc_fwd,     &blas_fc_bwd_data,     &blas_fc_bwd_filter,
};

/* Applies BP_BLAS_THREADS when set; a value that is not an integer in
 * 1..BLAS_MAX_THREADS is reported and ignored (the library keeps its
 * default). Then logs the library and the count in use. */
static void blas_threads_init(const bp_abi_host *host) {
  const char *text = getenv("BP_BLAS_THREADS");
  const char *source = "the library's default";
  char message[512];
  if (text && *text) {
    char *end = NULL;
    errno = 0;
    const long n = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || n < 1 || n > BLAS_MAX_THREADS) {
      snprintf(message, sizeof message,
               "%s: BP_BLAS_THREADS='%.64s' is not a thread count in 1..%d; keeping the "
               "library's default",
               BLAS_MODULE_NAME, text, BLAS_MAX_THREADS);
      ops_host_log(host, BP_ABI_LOG_WARN, message);
    } else {
      blas_provider_set_threads((int)n);
      source = "BP_BLAS_THREADS";
    }
  }
  char what[320];
  blas_provider_describe(what, sizeof what);
  snprintf(message, sizeof message, "%s: %s (threads: %s)", BLAS_MODULE_NAME, what, source);
  ops_host_log(host, BP_ABI_LOG_INFO, message);
}

static int blas_init(const bp_abi_host *host) {
  char reason[256];
  if (!blas_provider_load(reason, sizeof reason)) {
    char message[320];
    snprintf(message, sizeof message, "%s: %s", BLAS_MODULE_NAME, reason);
    if (host->error) host->error(host->ctx, message); /* the loader's record says why */
    return BP_ABI_ERR_UNSUPPORTED;
  }
  const int rc = ops_register_kernels(host, BLAS_MODULE_NAME, blas_kernels,
                                      sizeof blas_kernels / sizeof blas_kernels[0]);
  if (rc == BP_ABI_OK) blas_threads_init(host);
  return rc;
}

static const bp_abi_module blas_module = {
    sizeof(bp_abi_module), BP_ABI_MAJOR,         BP_ABI_MINOR, 0,        0, BLAS_MODULE_NAME,
    BLAS_MODULE_VERSION,   BLAS_MODULE_BUILD_ID, blas_init,    NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &blas_module; }
