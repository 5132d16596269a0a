/* gemm_threads: does OpenBLAS scale when two threads of one process call
 * it at once, as two ranks-as-threads do? Times ROUNDS rounds of REPS
 * single-threaded cblas_sgemm calls on the CNN's second conv layer as an
 * im2col GEMM at a rank batch of 64, once on one thread, then on two
 * threads at once (twice the work), and prints the throughput ratio of each
 * round (2.0x: no serialization). Rounds repeat because this machine's
 * single-thread speed itself varies between runs. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { M = 64 * 14 * 14, N = 64, K = 3 * 3 * 32, REPS = 40, ROUNDS = 3 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *work(void *arg) {
  (void)arg;
  float *a = calloc((size_t)M * K, sizeof *a), *b = calloc((size_t)K * N, sizeof *b),
        *c = calloc((size_t)M * N, sizeof *c);
  if (!a || !b || !c) {
    fprintf(stderr, "gemm_threads: out of memory\n");
    exit(1);
  }
  for (int r = 0; r < REPS; r++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
  free(a);
  free(b);
  free(c);
  return NULL;
}

int main(void) {
  openblas_set_num_threads(1); /* one BLAS thread per caller, as BP_THREADS=1 gives a rank */
  for (int round = 1; round <= ROUNDS; round++) {
    double t0 = now();
    work(NULL);
    const double one = now() - t0;
    pthread_t th;
    t0 = now();
    if (pthread_create(&th, NULL, work, NULL) != 0) {
      fprintf(stderr, "gemm_threads: cannot start a thread\n");
      return 1;
    }
    work(NULL);
    pthread_join(th, NULL);
    const double two = now() - t0;
    printf("round %d: 1 thread %.3f s, 2 threads (twice the work) %.3f s: %.2fx throughput\n",
           round, one, two, 2.0 * one / two);
  }
  return 0;
}
