/* Settings the test harness gives through the environment, passed to the
 * libraries as options the way the CLI does (cli/env_options.c): the
 * libraries read no environment. Header-only, for any test. */
#ifndef BLUEPRINT_TEST_ENV_H
#define BLUEPRINT_TEST_ENV_H

#include <stdlib.h>

/* BP_THREADS as bp_train_options.threads: ci/test.sh's ThreadSanitizer run
 * sets 1, so GEMM libraries' own threads stay out of the checked runs;
 * 0 (the cores' share) when unset or not in 1..1024. */
static inline int bp_test_threads(void) {
  const char *s = getenv("BP_THREADS");
  char *end = NULL;
  const long v = s && *s ? strtol(s, &end, 10) : 0;
  return end && *end == '\0' && v >= 1 && v <= 1024 ? (int)v : 0;
}

#endif
