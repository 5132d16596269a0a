/* sgemm_floor: the SGEMM rate a training run can be held against, measured
 * the way the run itself is timed: sustained over seconds, not the fastest
 * single call. A shared, drifting machine makes the two differ by 15-25%
 * (bench/RESULTS.md), and a floor taken from the fastest call charges that
 * noise to the trainer.
 *
 *   bench_sgemm_floor [SECONDS [N [THREADS]]]    (defaults: 3 1024 2)
 *
 * Calls dnnl_sgemm on N x N x N FP32 (the --profile yardstick's shape and
 * library) back to back for SECONDS on THREADS OpenMP threads and prints
 * one line: the sustained rate (all FLOPs / all time), the median call's
 * and the fastest call's, in GFLOP/s. */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_clock.h"

enum { MAX_CALLS = 100000 };

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 3.0;
  const int n = argc > 2 ? atoi(argv[2]) : 1024;
  const int threads = argc > 3 ? atoi(argv[3]) : 2;
  if (seconds <= 0 || n < 16 || n > 8192 || threads < 1) {
    fprintf(stderr, "usage: bench_sgemm_floor [SECONDS>0 [N in 16..8192 [THREADS>=1]]]\n");
    return 2;
  }
  const size_t count = (size_t)n * (size_t)n;
  float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b),
        *c = malloc(count * sizeof *c);
  double *calls = malloc(MAX_CALLS * sizeof *calls);
  if (!a || !b || !c || !calls) {
    fprintf(stderr, "bench_sgemm_floor: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < count; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
  omp_set_num_threads(threads);
  dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* JIT and page faults */
  int done = 0;
  const double start = bench_now();
  double end = start;
  while (done < MAX_CALLS && end - start < seconds) {
    const double t0 = bench_now();
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    end = bench_now();
    calls[done++] = end - t0;
  }
  qsort(calls, (size_t)done, sizeof *calls, by_value);
  const double gflop = 2.0 * n * (double)n * n * 1e-9;
  printf("sgemm %d^3 on %d threads, %d calls in %.1f s: sustained %.1f, median %.1f, fastest "
         "%.1f GFLOP/s\n",
         n, threads, done, end - start, gflop * done / (end - start), gflop / calls[done / 2],
         gflop / calls[0]);
  free(a), free(b), free(c), free(calls);
  return 0;
}
