/* OpenBLAS, loaded by the module's init instead of linked (blas-impl.h).
 *
 * OpenBLAS picks its kernel set ("core") once, when it loads, from the CPU
 * models it knows. Debian 12's 0.3.21 does not know recent Xeons (Sapphire
 * and Emerald Rapids report a generic model) and falls back to its Prescott
 * kernels, which run our SGEMMs 2.5x slower than its SkylakeX ones on the
 * same CPU. Loading the library here lets the module name the core from
 * the CPU's own feature bits first: OPENBLAS_CORETYPE is set for the
 * duration of the dlopen (OpenBLAS reads it while loading) and removed
 * again, so the process environment is left as it was. A user's own
 * OPENBLAS_CORETYPE is never touched, and a process that has OpenBLAS
 * loaded already keeps the core it has. */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas-impl.h"

#define OPENBLAS_SONAME "libopenblas.so.0"

/* The OpenBLAS functions the module calls, and who chose its core.
 * Process-wide on purpose: a dlopen'ed library's function table (one
 * OpenBLAS per process; its core is chosen by the process's first load),
 * the same for every registry. */
static struct {
  void (*sgemm)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint,
                blasint, float, const float *, blasint, const float *, blasint, float, float *,
                blasint);
  void (*set_num_threads)(int);
  int (*get_num_threads)(void);
  char *(*get_config)(void);
  char *(*get_corename)(void);
  char core_source[64]; /* for the log */
} blas_lib;

/* The most capable OpenBLAS x86-64 kernel family this CPU (and its OS, for
 * the AVX-512 and AVX register state) can run, or NULL to leave the choice
 * to OpenBLAS. Both families' SGEMMs are the ones OpenBLAS itself uses on
 * the CPUs it recognizes with these features. */
static const char *coretype_for_cpu(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

#define SYMBOL(lib, name, field) \
  blas_symbol(lib, OPENBLAS_SONAME, name, &blas_lib.field, sizeof blas_lib.field, reason, size)

int blas_provider_load(const bp_abi_host *host, char *reason, size_t size) {
  (void)host; /* OPENBLAS_CORETYPE is OpenBLAS's own variable, read by OpenBLAS */
  void *lib = dlopen(OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  snprintf(blas_lib.core_source, sizeof blas_lib.core_source, "%s",
           lib ? "OpenBLAS was loaded already" : "OpenBLAS's own choice");
  if (!lib) {
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *pick = user && *user ? NULL : coretype_for_cpu();
    if (user && *user) snprintf(blas_lib.core_source, sizeof blas_lib.core_source,
                                "OPENBLAS_CORETYPE");
    if (pick) {
      setenv("OPENBLAS_CORETYPE", pick, 1);
      snprintf(blas_lib.core_source, sizeof blas_lib.core_source, "the CPU's features");
    }
    lib = dlopen(OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (pick) unsetenv("OPENBLAS_CORETYPE");
  }
  if (!lib) {
    snprintf(reason, size, "cannot load %s: %s", OPENBLAS_SONAME, dlerror());
    return 0;
  }
  /* never dlclose'd: OpenBLAS keeps worker threads for the process */
  return SYMBOL(lib, "cblas_sgemm", sgemm) &&
         SYMBOL(lib, "openblas_set_num_threads", set_num_threads) &&
         SYMBOL(lib, "openblas_get_num_threads", get_num_threads) &&
         SYMBOL(lib, "openblas_get_config", get_config) &&
         SYMBOL(lib, "openblas_get_corename", get_corename);
}

/* OpenBLAS's count is one for the process; every rank of a process asks
 * for the same share, so it is set once and then only read. */
void blas_provider_use_threads(int threads) {
  if (threads > 0 && blas_lib.get_num_threads() != threads) blas_lib.set_num_threads(threads);
}

void blas_provider_describe(char *text, size_t size) {
  snprintf(text, size, "%.120s, core %.32s (%s), %d threads", blas_lib.get_config(),
           blas_lib.get_corename(), blas_lib.core_source, blas_lib.get_num_threads());
}

int blas_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  blas_lib.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                 trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, a,
                 (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
  return BP_ABI_OK; /* cblas reports nothing: bad arguments were refused in supports() */
}
