/* fc_step: one training step of the MLP (models/mlp.yaml: 784-512-512-10,
 * batch 128, SGD with momentum and weight decay) replayed on buffers laid
 * out as the trainer's arena has them (one span each of weights,
 * gradients and momentum), so every GEMM and the update see the caches a
 * step leaves behind, not a hot loop's. Times each kernel of the step, the
 * minimum and the median over STEPS steps per backend, backends
 * interleaved in blocks (a shared machine drifts).
 *
 * Backends (the GEMMs of ops/blas/fc.c, same layouts):
 *   dnnl-omp   dnnl_sgemm on 2 OpenMP threads (what bp_ops_dnnl does)
 *   blas-2t    OpenBLAS cblas_sgemm on 2 of its threads
 *   mixed      dnnl-omp, but OpenBLAS (2 threads) for the N/N and T/N
 *              GEMMs whose weights-side operand has 512 columns
 *   pool-split every GEMM cut in 2 fixed halves of C, each a 1-thread
 *              dnnl_sgemm, on a condition-variable pool of 2 threads (the
 *              host's bp_abi_threads model); the update in 2 halves too
 *   dnnl-pad   dnnl-omp with ops/blas/fc.c's rule: an operand read down its
 *              columns (N/N's B, T/N's A and B) whose leading dimension is
 *              a multiple of 256 floats copied with a padded one first
 * The update: 1 task on the calling thread (what ops/cpu/optim.c does with
 * a span under 2^20 elements), or ("+u2") equal tasks of at most 131072
 * elements (6 for the MLP) shared by the caller and the pool's worker.
 *   bench_fc_step [MASK [BATCH [THREADS]]]: MASK a bit per backend in the
 *   order above (default all), BATCH (default 128; 64 is a rank's share
 *   with --ranks 2), THREADS the libraries' threads (default 2). */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"

enum { STEPS = 60, BLOCKS = 6, MAX_NB = 128 };
static int NB = 128, omp_threads = 2; /* argv[2], argv[3] */

/* ---- a condition-variable pool of one worker (core/src/threads.c's model:
 * the worker and the caller take indices from one counter; the caller then
 * waits until the worker has checked in) ---- */
static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  unsigned long job;
  int busy, stop;
  void (*fn)(void *, int);
  void *arg;
  int n;
  _Atomic int next;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0,
          0, NULL, NULL, 0, 0};

static void pool_take(void) {
  for (int i; (i = atomic_fetch_add(&pool.next, 1)) < pool.n;) pool.fn(pool.arg, i);
}

static void *pool_main(void *p) {
  (void)p;
  unsigned long seen = 0;
  omp_set_num_threads(1);
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (pool.job == seen && !pool.stop) pthread_cond_wait(&pool.wake, &pool.mu);
    if (pool.stop) break;
    seen = pool.job;
    pthread_mutex_unlock(&pool.mu);
    pool_take();
    pthread_mutex_lock(&pool.mu);
    pool.busy = 0;
    pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* fn(arg, i) for i < n, on the caller and the worker */
static void pool_run(void (*fn)(void *, int), void *arg, int n) {
  pthread_mutex_lock(&pool.mu);
  pool.fn = fn;
  pool.arg = arg;
  pool.n = n;
  atomic_store(&pool.next, 0);
  pool.busy = 1;
  pool.job++;
  pthread_cond_signal(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  pool_take();
  pthread_mutex_lock(&pool.mu);
  while (pool.busy) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
}

/* ---- GEMMs ---- */
typedef struct gemm {
  char ta, tb;
  int m, n, k;
  const float *a;
  int lda;
  const float *b;
  int ldb;
  float beta;
  float *c;
  int ldc;
} gemm;

enum { B_DNNL, B_BLAS, B_MIXED, B_SPLIT, B_PAD, B_COUNT };
static const char *bname[B_COUNT] = {"dnnl-omp", "blas-2t", "mixed", "pool-split", "dnnl-pad"};
static int backend, split_update;

static void dnnl_rows(const gemm *g, int r0, int rows) {
  const float *a = g->ta == 'N' ? g->a + (size_t)r0 * g->lda : g->a + r0;
  dnnl_sgemm(g->ta, g->tb, rows, g->n, g->k, 1.0f, a, g->lda, g->b, g->ldb, g->beta,
             g->c + (size_t)r0 * g->ldc, g->ldc);
}
static void blas(const gemm *g) {
  cblas_sgemm(CblasRowMajor, g->ta == 'T' ? CblasTrans : CblasNoTrans,
              g->tb == 'T' ? CblasTrans : CblasNoTrans, g->m, g->n, g->k, 1.0f, g->a, g->lda,
              g->b, g->ldb, g->beta, g->c, g->ldc);
}
static void split_half(void *p, int i) {
  const gemm *g = p;
  const int half = (g->m / 2 + 7) / 8 * 8;
  if (i == 0) dnnl_rows(g, 0, half);
  else dnnl_rows(g, half, g->m - half);
}
static float pad_a[512 * 1040], pad_b[1024 * 1040];
static int pad_ld(int cols) { return (cols + 15) / 16 * 16 % 256 ? (cols + 15) / 16 * 16 : (cols + 15) / 16 * 16 + 16; }
static const float *pad_copy(float *dst, const float *src, int rows, int cols, int ld, int *ld_out) {
  const int l = pad_ld(cols);
  for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * l, src + (size_t)r * ld, (size_t)cols * sizeof *dst);
  *ld_out = l;
  return dst;
}
static void run_gemm(gemm g) {
  switch (backend) {
    case B_PAD:
      if (g.ta == 'N' && g.tb == 'N' && g.ldb % 256 == 0) g.b = pad_copy(pad_b, g.b, g.k, g.n, g.ldb, &g.ldb);
      if (g.ta == 'T' && g.lda % 256 == 0) g.a = pad_copy(pad_a, g.a, g.k, g.m, g.lda, &g.lda);
      if (g.ta == 'T' && g.ldb % 256 == 0) g.b = pad_copy(pad_b, g.b, g.k, g.n, g.ldb, &g.ldb);
      dnnl_rows(&g, 0, g.m);
      break;
    case B_DNNL: dnnl_rows(&g, 0, g.m); break;
    case B_BLAS: blas(&g); break;
    case B_MIXED:
      if ((g.ta == 'N' && g.tb == 'N' && g.n == 512) || (g.ta == 'T' && g.n == 512 && g.m == 512))
        blas(&g);
      else dnnl_rows(&g, 0, g.m);
      break;
    case B_SPLIT:
      if (g.m >= 32) pool_run(split_half, &g, 2);
      else dnnl_rows(&g, 0, g.m);
      break;
  }
}

/* ---- the step ---- */
static const int F[3] = {784, 512, 512}, O[3] = {512, 512, 10};
static float *wspan, *gspan, *mspan, *wp[3], *bp[3], *gw[3], *gb[3];
static float *act[4], *pre[3], *dpre[3], *dact[3]; /* act[0] = x; pre = fc outputs */
static long nparams;

static void fill_rows(float *y, int rows, int cols, const float *b) {
  for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * cols, b, (size_t)cols * sizeof *y);
}
static void sum_rows(const float *dy, int rows, int cols, float *db) {
  double s[512];
  for (int c = 0; c < cols; c++) s[c] = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) s[c] += dy[(size_t)r * cols + c];
  for (int c = 0; c < cols; c++) db[c] = (float)s[c];
}

typedef struct upd {
  long lo, hi;
} upd;
__attribute__((target("avx2"))) static void sgd_range(long lo, long hi) {
  float *restrict w = wspan, *restrict m = mspan;
  const float *restrict g = gspan;
  const float lr = 0.05f, mu = 0.9f, wd = 5e-4f;
  for (long i = lo; i < hi; i++) {
    const float gg = g[i] + wd * w[i];
    const float buf = mu * m[i] + gg;
    m[i] = buf;
    w[i] = w[i] - lr * buf;
  }
}
/* "+u2": equal tasks of at most UPD_TASK elements */
enum { UPD_TASK = 131072 };
static void sgd_task(void *p, int i) {
  (void)p;
  const long tasks = (nparams + UPD_TASK - 1) / UPD_TASK;
  const long per = ((nparams + tasks - 1) / tasks + 15) / 16 * 16;
  const long lo = i * per, hi = lo + per < nparams ? lo + per : nparams;
  sgd_range(lo, hi);
}

enum { K_FC1F, K_FC2F, K_FC3F, K_FC3B, K_FC2BD, K_FC2BF, K_FC1BF, K_RELU, K_UPD, K_STEP, K_COUNT };
static const char *kname[K_COUNT] = {"fc1.fwd",        "fc2.fwd",        "fc3.fwd",
                                     "fc3.bwd (both)", "fc2.bwd_data",   "fc2.bwd_filter",
                                     "fc1.bwd_filter", "relu (4 passes)", "update",
                                     "step"};
static double tk[K_COUNT];

#define TIMED(k, stmt)              \
  do {                              \
    const double t0_ = bench_now(); \
    stmt;                           \
    tk[k] += bench_now() - t0_;     \
  } while (0)

static void step(void) {
  for (int k = 0; k < K_COUNT; k++) tk[k] = 0;
  const double t0 = bench_now();
  for (int l = 0; l < 3; l++) {
    const int kk = l == 0 ? K_FC1F : l == 1 ? K_FC2F : K_FC3F;
    TIMED(kk, fill_rows(pre[l], NB, O[l], bp[l]);
          run_gemm((gemm){'N', 'T', NB, O[l], F[l], act[l], F[l], wp[l], F[l], 1.0f, pre[l], O[l]}));
    if (l < 2)
      TIMED(K_RELU, for (long i = 0; i < (long)NB * O[l]; i++) act[l + 1][i] =
                        pre[l][i] < 0.0f ? 0.0f : pre[l][i]);
  }
  /* loss gradient: anything small */
  for (int i = 0; i < NB * 10; i++) dpre[2][i] = pre[2][i] * 1e-3f;
  for (int l = 2; l >= 0; l--) {
    const int kf = l == 2 ? K_FC3B : l == 1 ? K_FC2BF : K_FC1BF;
    TIMED(kf, run_gemm((gemm){'T', 'N', O[l], F[l], NB, dpre[l], O[l], act[l], F[l], 0.0f, gw[l], F[l]});
          sum_rows(dpre[l], NB, O[l], gb[l]));
    if (l > 0) {
      const int kd = l == 2 ? K_FC3B : K_FC2BD;
      TIMED(kd, run_gemm((gemm){'N', 'N', NB, F[l], O[l], dpre[l], O[l], wp[l], F[l], 0.0f,
                                dact[l - 1], F[l]}));
      TIMED(K_RELU, for (long i = 0; i < (long)NB * F[l]; i++) dpre[l - 1][i] =
                        act[l][i] > 0.0f ? dact[l - 1][i] : 0.0f);
    }
  }
  const int upd_tasks = (int)((nparams + UPD_TASK - 1) / UPD_TASK);
  TIMED(K_UPD, if (split_update) pool_run(sgd_task, NULL, upd_tasks); else sgd_range(0, nparams));
  tk[K_STEP] = bench_now() - t0;
}

static float *alloc(long n) {
  float *p = aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64);
  if (!p) exit(1);
  for (long i = 0; i < n; i++) p[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  return p;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  /* argv[1]: which backends, a bit each (default all) */
  const int mask = argc > 1 ? atoi(argv[1]) : (1 << B_COUNT) - 1;
  if (argc > 2) NB = atoi(argv[2]);
  if (argc > 3) omp_threads = atoi(argv[3]);
  if (NB < 1 || NB > MAX_NB || omp_threads < 1) {
    fprintf(stderr, "usage: bench_fc_step [MASK [BATCH <= %d [THREADS]]]\n", MAX_NB);
    return 2;
  }
  nparams = 0;
  for (int l = 0; l < 3; l++) nparams += (long)O[l] * F[l] + O[l];
  wspan = alloc(nparams);
  gspan = alloc(nparams);
  mspan = alloc(nparams);
  for (long i = 0; i < nparams; i++) {
    wspan[i] *= 0.05f;
    mspan[i] = 0;
  }
  long off = 0;
  for (int l = 0; l < 3; l++) {
    wp[l] = wspan + off;
    gw[l] = gspan + off;
    off += (long)O[l] * F[l];
    bp[l] = wspan + off;
    gb[l] = gspan + off;
    off += O[l];
  }
  act[0] = alloc((long)NB * 784);
  for (int l = 0; l < 3; l++) {
    pre[l] = alloc((long)NB * O[l]);
    dpre[l] = alloc((long)NB * O[l]);
    act[l + 1] = alloc((long)NB * O[l]);
    dact[l] = alloc((long)NB * F[l + (l < 2)]);
  }
  pthread_t th;
  if (pthread_create(&th, NULL, pool_main, NULL) != 0) return 1;
  static double samples[B_COUNT * 2][K_COUNT][STEPS * BLOCKS];
  int count[B_COUNT * 2] = {0};
  for (int blk = 0; blk < BLOCKS; blk++) {
    for (int v = 0; v < B_COUNT * 2; v++) {
      if (!(mask >> (v / 2) & 1)) continue;
      backend = v / 2;
      split_update = v % 2;
      omp_set_num_threads(backend == B_SPLIT ? 1 : omp_threads);
      openblas_set_num_threads(omp_threads);
      for (int s = 0; s < STEPS + 3; s++) {
        step();
        if (s < 3) continue; /* warm-up */
        for (int k = 0; k < K_COUNT; k++) samples[v][k][count[v]] = tk[k];
        count[v]++;
      }
    }
  }
  printf("per kernel: min / median ms over %d steps (%d blocks interleaved)\n", STEPS * BLOCKS,
         BLOCKS);
  printf("%-16s", "");
  for (int v = 0; v < B_COUNT * 2; v++)
    if (mask >> (v / 2) & 1) printf(" %10s%s", bname[v / 2], v % 2 ? "+u2" : "   ");
  printf("\n");
  for (int k = 0; k < K_COUNT; k++) {
    printf("%-16s", kname[k]);
    for (int v = 0; v < B_COUNT * 2; v++) {
      if (!(mask >> (v / 2) & 1)) continue;
      qsort(samples[v][k], (size_t)count[v], sizeof(double), cmp);
      printf("  %5.3f/%5.3f", samples[v][k][0] * 1e3, samples[v][k][count[v] / 2] * 1e3);
    }
    printf("\n");
  }
  pthread_mutex_lock(&pool.mu);
  pool.stop = 1;
  pthread_cond_signal(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  pthread_join(th, NULL);
  return 0;
}
