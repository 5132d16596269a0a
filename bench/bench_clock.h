/* The benches' clock: seconds on CLOCK_MONOTONIC. Header only, so that the
 * benches that link only BLAS or oneDNN (fc_gemms.c, fc_step.c) share it
 * with those built on blueprint (bench_util.h). */
#ifndef BP_BENCH_CLOCK_H
#define BP_BENCH_CLOCK_H

#include <time.h>

static inline double bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#endif
