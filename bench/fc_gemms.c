/* fc_gemms: the GEMMs of the MLP's fc nodes (models/mlp.yaml, batch 128,
 * and 64 for a rank of --ranks 2), each through several libraries and
 * thread splits, timed min-of-REPS in interleaved rounds (the machine is
 * shared: the minimum over many calls, every variant in every round).
 *
 * Layouts are those of ops/blas/fc.c (row-major):
 *   fwd         Y[N,O]  = X[N,F] * W[O,F]^T      sgemm(N, T, N, O, F)
 *   bwd_data    dX[N,F] = dY[N,O] * W[O,F]        sgemm(N, N, N, F, O)
 *   bwd_filter  dW[O,F] = dY[N,O]^T * X[N,F]      sgemm(T, N, O, F, N)
 * Variants: dnnl_sgemm and OpenBLAS's cblas_sgemm on 1 and 2 of their own
 * threads; "split2": two single-threaded dnnl_sgemm calls on halves of the
 * output (rows for fwd / bwd_data, the O rows of dW for bwd_filter), one
 * on a second pthread woken through a spinning flag, as a host pool with
 * a cheap hand-off would do; oneDNN's matmul primitive (plain layouts,
 * created once) on 2 threads; "padA"/"padB"/"padAB": dnnl_sgemm after
 * copying A / B / both with a leading dimension 16 floats wider; "trA" /
 * "trB": after storing A / B transposed (copies timed with the GEMM).
 * Prints GFLOP/s and ms of each. */
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

enum { REPS = 30, ROUNDS = 8 };

typedef struct gemm {
  char ta, tb;
  int m, n, k;
  const float *a, *b;
  int lda, ldb, ldc;
  float *c;
} gemm;

static void run_dnnl(const gemm *g, int row0, int rows) {
  /* rows [row0, row0 + rows) of C; A's rows (or columns when transposed) */
  const float *a = g->ta == 'N' ? g->a + (size_t)row0 * g->lda : g->a + row0;
  dnnl_sgemm(g->ta, g->tb, rows, g->n, g->k, 1.0f, a, g->lda, g->b, g->ldb, 0.0f,
             g->c + (size_t)row0 * g->ldc, g->ldc);
}

static void run_blas(const gemm *g) {
  cblas_sgemm(CblasRowMajor, g->ta == 'T' ? CblasTrans : CblasNoTrans,
              g->tb == 'T' ? CblasTrans : CblasNoTrans, g->m, g->n, g->k, 1.0f, g->a, g->lda,
              g->b, g->ldb, 0.0f, g->c, g->ldc);
}

/* ---- a second thread, woken by a spinning flag ---- */
static struct {
  _Atomic int go, done, stop;
  const gemm *g;
  int row0, rows;
} helper;

static void *helper_main(void *p) {
  (void)p;
  omp_set_num_threads(1);
  for (;;) {
    while (!atomic_load(&helper.go)) {
      if (atomic_load(&helper.stop)) return NULL;
    }
    atomic_store(&helper.go, 0);
    run_dnnl(helper.g, helper.row0, helper.rows);
    atomic_store(&helper.done, 1);
  }
}

static void run_split2(const gemm *g) {
  const int half = (g->m / 2 + 7) / 8 * 8;
  helper.g = g;
  helper.row0 = half;
  helper.rows = g->m - half;
  atomic_store(&helper.done, 0);
  atomic_store(&helper.go, 1);
  run_dnnl(g, 0, half);
  while (!atomic_load(&helper.done)) {
  }
}

/* ---- oneDNN matmul primitive, plain layouts ---- */
typedef struct mm {
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c;
} mm;

static void check(dnnl_status_t s, const char *what) {
  if (s != dnnl_success) {
    fprintf(stderr, "fc_gemms: %s failed (%d)\n", what, (int)s);
    exit(1);
  }
}

static void mm_create(mm *p, dnnl_engine_t eng, const gemm *g) {
  dnnl_memory_desc_t ad, bd, cd;
  const dnnl_dims_t adims = {g->m, g->k}, bdims = {g->k, g->n}, cdims = {g->m, g->n};
  /* strides of the logical [m,k] / [k,n] views */
  const dnnl_dims_t as = {g->ta == 'N' ? g->lda : 1, g->ta == 'N' ? 1 : g->lda};
  const dnnl_dims_t bs = {g->tb == 'N' ? g->ldb : 1, g->tb == 'N' ? 1 : g->ldb};
  const dnnl_dims_t cs = {g->ldc, 1};
  check(dnnl_memory_desc_init_by_strides(&ad, 2, adims, dnnl_f32, as), "md a");
  check(dnnl_memory_desc_init_by_strides(&bd, 2, bdims, dnnl_f32, bs), "md b");
  check(dnnl_memory_desc_init_by_strides(&cd, 2, cdims, dnnl_f32, cs), "md c");
  dnnl_matmul_desc_t d;
  check(dnnl_matmul_desc_init(&d, &ad, &bd, NULL, &cd), "matmul desc");
  dnnl_primitive_desc_t pd;
  check(dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL), "matmul pd");
  const char *impl = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  printf("    matmul impl: %s\n", impl ? impl : "?");
  check(dnnl_primitive_create(&p->prim, pd), "matmul");
  dnnl_primitive_desc_destroy(pd);
  check(dnnl_memory_create(&p->a, &ad, eng, (void *)g->a), "mem a");
  check(dnnl_memory_create(&p->b, &bd, eng, (void *)g->b), "mem b");
  check(dnnl_memory_create(&p->c, &cd, eng, g->c), "mem c");
}

static void mm_run(const mm *p, dnnl_stream_t s) {
  dnnl_exec_arg_t args[3] = {
      {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
  check(dnnl_primitive_execute(p->prim, s, 3, args), "matmul run");
  dnnl_stream_wait(s);
}

static float *rnd(size_t n) {
  float *p = malloc(n * sizeof *p);
  if (!p) exit(1);
  for (size_t i = 0; i < n; i++) p[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
  return p;
}

enum { V_DNNL1, V_DNNL2, V_BLAS1, V_BLAS2, V_SPLIT2, V_MM2, V_PADA, V_PADB, V_PADAB1, V_PADAB2,
       V_TRA1, V_TRB1, V_TRA2, V_TRB2, V_COUNT };
static const char *vname[V_COUNT] = {"dnnl 1t",  "dnnl 2t",   "blas 1t",  "blas 2t", "split2",
                                     "matmul 2t", "padA 2t",  "padB 2t",  "padAB 1t", "padAB 2t",
                                     "trA 1t",   "trB 1t",    "trA 2t",   "trB 2t"};

/* The operand stored transposed (a copy, included in the time) and its
 * flag flipped: the same product through the library's other packing. */
static float *tr_buf;
static void transpose(float *dst, const float *src, int rows, int cols, int lds) {
  for (int r0 = 0; r0 < rows; r0 += 16)
    for (int c0 = 0; c0 < cols; c0 += 16)
      for (int r = r0; r < r0 + 16 && r < rows; r++)
        for (int c = c0; c < c0 + 16 && c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * lds + c];
}
static void run_tr(const gemm *g, int which) {
  gemm h = *g;
  if (which == 0) {
    const int rows = g->ta == 'N' ? g->m : g->k, cols = g->ta == 'N' ? g->k : g->m;
    transpose(tr_buf, g->a, rows, cols, g->lda);
    h.a = tr_buf;
    h.lda = rows;
    h.ta = g->ta == 'N' ? 'T' : 'N';
  } else {
    const int rows = g->tb == 'N' ? g->k : g->n, cols = g->tb == 'N' ? g->n : g->k;
    transpose(tr_buf, g->b, rows, cols, g->ldb);
    h.b = tr_buf;
    h.ldb = rows;
    h.tb = g->tb == 'N' ? 'T' : 'N';
  }
  run_dnnl(&h, 0, h.m);
}

/* The operand copied with its leading dimension padded by PAD floats
 * (copy included in the time): rows x cols of src (ld) into dst. */
enum { PAD = 16 };
static void copy_rows(float *dst, int ldd, const float *src, int lds, int rows, int cols) {
  for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds, (size_t)cols * sizeof *dst);
}
static float *pad_buf, *pad_buf2;
static void run_pad(const gemm *g, int which) {
  gemm h = *g;
  if (which == 2) { /* both */
    const int ra = g->ta == 'N' ? g->m : g->k, ca = g->ta == 'N' ? g->k : g->m;
    const int rb = g->tb == 'N' ? g->k : g->n, cb = g->tb == 'N' ? g->n : g->k;
    copy_rows(pad_buf, ca + PAD, g->a, g->lda, ra, ca);
    copy_rows(pad_buf2, cb + PAD, g->b, g->ldb, rb, cb);
    h.a = pad_buf, h.lda = ca + PAD, h.b = pad_buf2, h.ldb = cb + PAD;
  } else if (which == 0) {
    const int rows = g->ta == 'N' ? g->m : g->k, cols = g->ta == 'N' ? g->k : g->m;
    copy_rows(pad_buf, cols + PAD, g->a, g->lda, rows, cols);
    h.a = pad_buf;
    h.lda = cols + PAD;
  } else {
    const int rows = g->tb == 'N' ? g->k : g->n, cols = g->tb == 'N' ? g->n : g->k;
    copy_rows(pad_buf, cols + PAD, g->b, g->ldb, rows, cols);
    h.b = pad_buf;
    h.ldb = cols + PAD;
  }
  run_dnnl(&h, 0, h.m);
}

static void bench_shape(const char *name, gemm g, dnnl_engine_t eng, dnnl_stream_t st) {
  const double flop = 2.0 * g.m * g.n * g.k;
  printf("%s: m %d n %d k %d (%c%c), %.1f MFLOP\n", name, g.m, g.n, g.k, g.ta, g.tb, flop * 1e-6);
  mm p;
  omp_set_num_threads(2);
  mm_create(&p, eng, &g);
  double best[V_COUNT];
  for (int v = 0; v < V_COUNT; v++) best[v] = 1e9;
  for (int round = 0; round < ROUNDS; round++) {
    for (int v = 0; v < V_COUNT; v++) {
      if (v == V_DNNL1 || v == V_SPLIT2 || v == V_TRA1 || v == V_TRB1 || v == V_PADAB1)
        omp_set_num_threads(1);
      if (v == V_TRA2 || v == V_TRB2 || v == V_PADAB2) omp_set_num_threads(2);
      if (v == V_DNNL2 || v == V_MM2 || v == V_PADA || v == V_PADB) omp_set_num_threads(2);
      if (v == V_BLAS1) openblas_set_num_threads(1);
      if (v == V_BLAS2) openblas_set_num_threads(2);
      pthread_t th;
      if (v == V_SPLIT2) {
        atomic_store(&helper.stop, 0);
        if (pthread_create(&th, NULL, helper_main, NULL) != 0) exit(1);
      }
      for (int r = 0; r < REPS; r++) {
        const double t0 = bench_now();
        switch (v) {
          case V_DNNL1:
          case V_DNNL2: run_dnnl(&g, 0, g.m); break;
          case V_BLAS1:
          case V_BLAS2: run_blas(&g); break;
          case V_SPLIT2: run_split2(&g); break;
          case V_MM2: mm_run(&p, st); break;
          case V_PADA: run_pad(&g, 0); break;
          case V_PADB: run_pad(&g, 1); break;
          case V_PADAB1:
          case V_PADAB2: run_pad(&g, 2); break;
          case V_TRA1:
          case V_TRA2: run_tr(&g, 0); break;
          case V_TRB1:
          case V_TRB2: run_tr(&g, 1); break;
        }
        const double t = bench_now() - t0;
        if (t < best[v]) best[v] = t;
      }
      if (v == V_SPLIT2) {
        atomic_store(&helper.stop, 1);
        pthread_join(th, NULL);
      }
    }
  }
  for (int v = 0; v < V_COUNT; v++)
    printf("    %-10s %7.3f ms %6.1f GFLOP/s\n", vname[v], best[v] * 1e3, flop / best[v] * 1e-9);
  dnnl_primitive_destroy(p.prim);
  dnnl_memory_destroy(p.a);
  dnnl_memory_destroy(p.b);
  dnnl_memory_destroy(p.c);
}

int main(void) {
  dnnl_engine_t eng;
  dnnl_stream_t st;
  pad_buf = malloc((size_t)1024 * (1024 + PAD) * sizeof *pad_buf);
  pad_buf2 = malloc((size_t)1024 * (1024 + PAD) * sizeof *pad_buf2);
  tr_buf = malloc((size_t)1024 * 1024 * sizeof *tr_buf);
  if (!pad_buf || !pad_buf2 || !tr_buf) return 1;
  check(dnnl_engine_create(&eng, dnnl_cpu, 0), "engine");
  check(dnnl_stream_create(&st, eng, dnnl_stream_default_flags), "stream");
  static const int layers[3][2] = {{784, 512}, {512, 512}, {512, 10}};
  const int batches[2] = {128, 64};
  for (int bi = 0; bi < 2; bi++) {
    const int nb = batches[bi];
    for (int l = 0; l < 3; l++) {
      const int f = layers[l][0], o = layers[l][1];
      float *x = rnd((size_t)nb * f), *w = rnd((size_t)o * f), *y = rnd((size_t)nb * o);
      float *dx = rnd((size_t)nb * f), *dw = rnd((size_t)o * f);
      char name[64];
      snprintf(name, sizeof name, "fc%d.fwd N%d", l + 1, nb);
      bench_shape(name, (gemm){'N', 'T', nb, o, f, x, w, f, f, o, y}, eng, st);
      if (l > 0) {
        snprintf(name, sizeof name, "fc%d.bwd_data N%d", l + 1, nb);
        bench_shape(name, (gemm){'N', 'N', nb, f, o, y, w, o, f, f, dx}, eng, st);
      }
      snprintf(name, sizeof name, "fc%d.bwd_filter N%d", l + 1, nb);
      bench_shape(name, (gemm){'T', 'N', o, f, nb, y, x, o, f, f, dw}, eng, st);
      free(x);
      free(w);
      free(y);
      free(dx);
      free(dw);
    }
  }
  dnnl_stream_destroy(st);
  dnnl_engine_destroy(eng);
  return 0;
}
