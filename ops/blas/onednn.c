/* oneDNN as the GEMM provider of bp_ops_dnnl (blas-impl.h): dnnl_sgemm,
 * loaded by the module's init instead of linked, so the module loads (and
 * refuses itself with a reason) whether or not libdnnl is installed.
 *
 * dnnl_sgemm is row-major, 64-bit in its extents, and JIT-compiles its
 * kernels for the CPU it runs on. Debian's oneDNN runs its threads on
 * OpenMP: a GEMM uses as many threads as omp_get_max_threads() says in the
 * calling thread, and every thread (each rank of a process is one) has its
 * own count. So the rank's count (module.c) is applied in each calling
 * thread, before its GEMM, when that thread's count differs; a small GEMM
 * (blas_one_thread, blas-impl.h) runs on the calling thread alone.
 * The module option "dnnl_library" (ABI 1.6; the CLI passes
 * BP_DNNL_LIBRARY) names another oneDNN library file to load (a newer
 * build, say); it must have the same C API and run on OpenMP. */
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas-impl.h"

#define DNNL_SONAME "libdnnl.so.2"

/* Process-wide: a dlopen'ed library's function table. Every registry
 * that loads the module fills it with the same functions unless two
 * registries name different dnnl_library files; then the last init's
 * library serves both (a known limit, docs in abi/README.md). */
static struct {
  dnnl_status_t (*sgemm)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float, const float *,
                         dnnl_dim_t, const float *, dnnl_dim_t, float, float *, dnnl_dim_t);
  const dnnl_version_t *(*version)(void);
  /* OpenMP's, found through oneDNN's own dependencies */
  void (*omp_set_num_threads)(int);
  int (*omp_get_max_threads)(void);
} dnnl_lib;

#define SYMBOL(lib, name, field) \
  blas_symbol(lib, path, name, &dnnl_lib.field, sizeof dnnl_lib.field, reason, size)

int blas_provider_load(const bp_abi_host *host, char *reason, size_t size) {
  const char *path = bp_sdk_host_option(host, "dnnl_library");
  if (!path || !*path) path = DNNL_SONAME;
  /* RTLD_LOCAL: oneDNN's symbols stay out of the process's namespace */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(reason, size, "cannot load oneDNN (apt-get install libdnnl2): %s", dlerror());
    return 0;
  }
  /* never dlclose'd: OpenMP keeps worker threads for the process */
  if (!SYMBOL(lib, "dnnl_sgemm", sgemm) || !SYMBOL(lib, "dnnl_version", version) ||
      !SYMBOL(lib, "omp_set_num_threads", omp_set_num_threads) ||
      !SYMBOL(lib, "omp_get_max_threads", omp_get_max_threads))
    return 0;
  if (dnnl_lib.version()->cpu_runtime != DNNL_RUNTIME_OMP) {
    snprintf(reason, size, "%s runs its CPU threads on runtime %u, not OpenMP", DNNL_SONAME,
             dnnl_lib.version()->cpu_runtime);
    return 0;
  }
  return 1;
}

/* OpenMP's count is per thread: each rank's thread keeps its own. */
void blas_provider_use_threads(int threads) {
  if (threads > 0 && dnnl_lib.omp_get_max_threads() != threads)
    dnnl_lib.omp_set_num_threads(threads); /* this thread's count, from now on */
}

void blas_provider_describe(char *text, size_t size) {
  const dnnl_version_t *v = dnnl_lib.version();
  snprintf(text, size, "oneDNN %d.%d.%d (OpenMP), %d threads", v->major, v->minor, v->patch,
           dnnl_lib.omp_get_max_threads());
}

/* A small GEMM (blas_one_thread) runs with this thread's count set to one
 * and then put back: a thread-local setting, cheap to change. */
int blas_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  const int saved = blas_one_thread(m, n, k) ? dnnl_lib.omp_get_max_threads() : 1;
  if (saved != 1) dnnl_lib.omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_lib.sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f,
                                          a, lda, b, ldb, beta, c, ldc);
  if (saved != 1) dnnl_lib.omp_set_num_threads(saved);
  if (st == dnnl_success) return BP_ABI_OK;
  return st == dnnl_out_of_memory ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_INVALID;
}
