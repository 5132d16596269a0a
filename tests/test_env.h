/* Settings the test harness gives through the environment, passed to the
 * libraries as options the way the CLI does (cli/env_options.c): the
 * libraries read no environment. Header-only, for any test. */
#ifndef BLUEPRINT_TEST_ENV_H
#define BLUEPRINT_TEST_ENV_H

#include <stdio.h>
#include <stdlib.h>

#include "blueprint/registry.h"

/* BP_THREADS as bp_train_options.threads: ci/test.sh's ThreadSanitizer run
 * sets 1, so GEMM libraries' own threads stay out of the checked runs;
 * 0 (the cores' share) when unset or not in 1..1024. */
static inline int bp_test_threads(void) {
  const char *s = getenv("BP_THREADS");
  char *end = NULL;
  const long v = s && *s ? strtol(s, &end, 10) : 0;
  return end && *end == '\0' && v >= 1 && v <= 1024 ? (int)v : 0;
}

/* Registry options that pass the op modules' switches the harness sets
 * (BP_TF32, BP_DETERMINISTIC, BP_CPU_ISA, BP_DNNL_LIBRARY) as module
 * options (ABI 1.6), as the CLI does. Each call reads them again; the
 * result is valid until the next call. */
static inline const bp_registry_options *bp_test_registry_options(void) {
  static const char *const vars[][2] = {{"BP_TF32", "tf32"},
                                        {"BP_DETERMINISTIC", "deterministic"},
                                        {"BP_CPU_ISA", "cpu_isa"},
                                        {"BP_DNNL_LIBRARY", "dnnl_library"}};
  enum { N = sizeof vars / sizeof vars[0] };
  static bp_registry_options o;
  static char text[N][512];
  static const char *ptrs[N];
  bp_registry_options_init(&o);
  int n = 0;
  for (int i = 0; i < N; i++) {
    const char *v = getenv(vars[i][0]);
    if (!v) continue;
    snprintf(text[n], sizeof text[n], "%s=%s", vars[i][1], v);
    ptrs[n] = text[n];
    n++;
  }
  o.module_options = ptrs;
  o.module_option_count = n;
  return &o;
}

#endif
