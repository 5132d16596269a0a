/* The oneDNN convolution module (bp_ops_onednn.so): its ABI entry (the only
 * exported symbol), the CPU engine every node shares, and OpenMP's thread
 * count.
 *
 * Kernels (conv2d.c): conv2d.fwd, conv2d.bwd_data, conv2d.bwd_filter, FP32,
 * device "cpu", implementation "onednn", priority ODNN_PRIORITY
 * (onednn-impl.h), with per-node state (prepare/release). Flagged
 * DETERMINISTIC as ops/blas "dnnl" is: oneDNN splits a convolution the same
 * way for the same shape, kernel set (its JIT's pick for this CPU) and
 * thread count, and the count is the rank's share the host lends.
 *
 * Threads: Debian's oneDNN runs on OpenMP. A primitive uses as many threads
 * as omp_get_max_threads() says in the calling thread, and every thread
 * (each rank is one) has its own count; so run() applies the rank's count
 * in its thread first. OpenMP's functions are taken from the libgomp that
 * libdnnl itself loaded (no second OpenMP runtime in the process). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "module_register.h"
#include "onednn-impl.h"
#ifdef BP_OPS_ONEDNN_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_ONEDNN_VERSION
#define BP_OPS_ONEDNN_VERSION "0.0.0"
#endif
#ifndef BP_OPS_ONEDNN_BUILD_ID
#define BP_OPS_ONEDNN_BUILD_ID "unknown"
#endif

#define ODNN_MODULE_NAME "ops-onednn"
#define ODNN_SONAME "libdnnl.so.2"

/* Process-wide on purpose, written once (pthread_once) and read-only
 * after: OpenMP's functions belong to the one libgomp of the process, and
 * a oneDNN CPU engine holds no per-run state (each node keeps its own
 * stream and primitives, conv2d.c) while oneDNN's primitive cache is
 * process-wide anyway; the engine is never destroyed, as oneDNN's
 * resources live for the process. Nothing here depends on a registry's
 * options, so the module has no context (abi/README.md). */
static pthread_once_t process_once = PTHREAD_ONCE_INIT;
static char process_error[256]; /* "" when the once-setup succeeded */
static dnnl_engine_t engine;
static void (*omp_set_threads)(int);
static int (*omp_max_threads)(void);

dnnl_engine_t odnn_engine(void) { return engine; }

void odnn_use_threads(int threads) {
  if (omp_max_threads() != threads) omp_set_threads(threads); /* this thread's count */
}

int odnn_error(dnnl_status_t st) {
  return st == dnnl_out_of_memory ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_INVALID;
}

static const bp_abi_kernel *const odnn_kernels[] = {
    &odnn_conv2d_fwd,
    &odnn_conv2d_bwd_data,
    &odnn_conv2d_bwd_filter,
};

static int odnn_fail(const bp_abi_host *host, const char *what) {
  char message[320];
  snprintf(message, sizeof message, "%s: %s", ODNN_MODULE_NAME, what);
  if (host->error) host->error(host->ctx, message);
  return BP_ABI_ERR_UNSUPPORTED;
}

/* OpenMP's thread functions from the runtime libdnnl runs on, and the
 * engine: once per process (process_once); a failure is kept in
 * process_error for every init to report. */
static void odnn_process_setup(void) {
  const dnnl_version_t *v = dnnl_version();
  if (v->cpu_runtime != DNNL_RUNTIME_OMP) {
    snprintf(process_error, sizeof process_error,
             "oneDNN runs its CPU threads on runtime %u, not OpenMP", v->cpu_runtime);
    return;
  }
  /* libdnnl is a dependency of this module: already loaded, so RTLD_NOLOAD
   * finds it; dlsym searches it and its own dependencies (libgomp) */
  void *lib = dlopen(ODNN_SONAME, RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    snprintf(process_error, sizeof process_error, "cannot find the loaded " ODNN_SONAME);
    return;
  }
  *(void **)(void *)&omp_set_threads = dlsym(lib, "omp_set_num_threads");
  *(void **)(void *)&omp_max_threads = dlsym(lib, "omp_get_max_threads");
  dlclose(lib); /* only drops the reference RTLD_NOLOAD added */
  if (!omp_set_threads || !omp_max_threads) {
    snprintf(process_error, sizeof process_error,
             ODNN_SONAME " does not run on OpenMP (no omp_set_num_threads)");
    return;
  }
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
    engine = NULL;
    snprintf(process_error, sizeof process_error, "cannot create a oneDNN CPU engine");
  }
}

static int odnn_init(const bp_abi_host *host) {
  pthread_once(&process_once, odnn_process_setup);
  if (process_error[0]) return odnn_fail(host, process_error);
  const int rc = ops_register_kernels(host, ODNN_MODULE_NAME, odnn_kernels,
                                      sizeof odnn_kernels / sizeof odnn_kernels[0]);
  if (rc == BP_ABI_OK) {
    const dnnl_version_t *v = dnnl_version();
    char message[256];
    snprintf(message, sizeof message, "%s: oneDNN %d.%d.%d (OpenMP), convolution primitives",
             ODNN_MODULE_NAME, v->major, v->minor, v->patch);
    ops_host_log(host, BP_ABI_LOG_INFO, message);
  }
  return rc;
}

static const bp_abi_module odnn_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 4, /* needs per-node state and the parameter generation */
    .name = ODNN_MODULE_NAME,
    .version = BP_OPS_ONEDNN_VERSION,
    .build_id = BP_OPS_ONEDNN_BUILD_ID,
    .init = odnn_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &odnn_module; }
