/* The BLAS op module: its ABI entry (the only exported symbol) and the
 * table of kernels it registers. conv2d and fc, forward and both
 * backwards, FP32, device "cpu", implementation "blas", priority 10,
 * flagged DETERMINISTIC (with a fixed BLAS thread count, blas-impl.h),
 * not REFERENCE: the registry prefers them to the reference kernels
 * wherever their supports() holds, and a pin (BP_KERNELS) overrides that.
 *
 * Threads: OpenBLAS runs every GEMM on its own thread pool. Its size is
 * BP_BLAS_THREADS when that is set (an integer 1..1024, applied once at
 * init with openblas_set_num_threads; it holds for the whole process), else
 * OpenBLAS's default (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, else one per
 * core). With several ranks as threads in one process, BP_BLAS_THREADS=1
 * (or cores / ranks) avoids oversubscription. The count is logged at info
 * level (BP_LOG=info), with OpenBLAS's configuration, the kernel set
 * ("core") in use and who chose it (openblas.c: the CPU's features, unless
 * OPENBLAS_CORETYPE names one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "blas-impl.h"
#include "module_register.h"
#ifdef BP_OPS_BLAS_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_BLAS_VERSION
#define BP_OPS_BLAS_VERSION "0.0.0"
#endif
#ifndef BP_OPS_BLAS_BUILD_ID
#define BP_OPS_BLAS_BUILD_ID "unknown"
#endif

#define BLAS_MAX_THREADS 1024

static const bp_abi_kernel *const blas_kernels[] = {
    &blas_conv2d_fwd, &blas_conv2d_bwd_data, &blas_conv2d_bwd_filter,
    &blas_fc_fwd,     &blas_fc_bwd_data,     &blas_fc_bwd_filter,
};

/* Applies BP_BLAS_THREADS when set; a value that is not an integer in
 * 1..BLAS_MAX_THREADS is reported and ignored (OpenBLAS keeps its
 * default). Then logs the count in use. */
static void blas_threads_init(const bp_abi_host *host) {
  const char *text = getenv("BP_BLAS_THREADS");
  const char *source = "the OpenBLAS default";
  char message[512];
  if (text && *text) {
    char *end = NULL;
    errno = 0;
    const long n = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || n < 1 || n > BLAS_MAX_THREADS) {
      snprintf(message, sizeof message,
               "ops-blas: BP_BLAS_THREADS='%.64s' is not a thread count in 1..%d; keeping the "
               "OpenBLAS default",
               text, BLAS_MAX_THREADS);
      ops_host_log(host, BP_ABI_LOG_WARN, message);
    } else {
      blas_lib.set_num_threads((int)n);
      source = "BP_BLAS_THREADS";
    }
  }
  snprintf(message, sizeof message, "ops-blas: %.120s, core %.32s (%s), %d threads (%s)",
           blas_lib.get_config(), blas_lib.get_corename(), blas_lib.core_source,
           blas_lib.get_num_threads(), source);
  ops_host_log(host, BP_ABI_LOG_INFO, message);
}

static int blas_init(const bp_abi_host *host) {
  char reason[256];
  if (!blas_library_load(reason, sizeof reason)) {
    char message[320];
    snprintf(message, sizeof message, "ops-blas: %s", reason);
    ops_host_log(host, BP_ABI_LOG_ERROR, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  const int rc = ops_register_kernels(host, "ops-blas", blas_kernels,
                                      sizeof blas_kernels / sizeof blas_kernels[0]);
  if (rc == BP_ABI_OK) blas_threads_init(host);
  return rc;
}

static const bp_abi_module blas_module = {
    sizeof(bp_abi_module), BP_ABI_MAJOR,         BP_ABI_MINOR, 0,        0, "ops-blas",
    BP_OPS_BLAS_VERSION,   BP_OPS_BLAS_BUILD_ID, blas_init,    NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &blas_module; }
