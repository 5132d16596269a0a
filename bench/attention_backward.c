/* attention_backward: the two ways a plan can serve attention's backward,
 * timed on the very loops of ops/reference and ops/cpu
 * (ops/shared/attention_math.h) at the ViT's shape (batch 128, 7x7 = 49
 * tokens, D = 64, 4 heads of 16), one thread:
 *   recompute  the forward saves lse [N,T,heads]; the backward recomputes
 *              each p_tu = exp(q_t.k_u/sqrt(dh) - lse_t) (what the op does)
 *   saved      the forward also writes the probabilities [N,heads,T,T];
 *              the backward reads them
 * (AVX2 loops where the CPU has them.) A and B alternate in every round (both see the same load); it prints the
 * minimum and median of each pass and the bytes each keeps per layer.
 * With OpenBLAS (BENCH_ATTN_CBLAS) it also times the forward as two
 * cblas_sgemm per (sample, head) (S = Q K^T, 49x49x16; Y = P V) around a
 * float softmax, against the loops above, to show whether a GEMM library
 * pays at this size.
 * Usage: bench_attention_backward [rounds] (default 9). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "shared/attention_math.h"
#ifdef BENCH_ATTN_CBLAS
#include <cblas.h>
#include <math.h>
#endif

enum { N = 128, H = 7, W = 7, T = H * W, D = 64, HEADS = 4, DH = D / HEADS };

static float *rand_floats(size_t n, uint64_t *s) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return p;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct bufs {
  float *qkv, *y, *lse, *dy, *dqkv, *probs;
} bufs;

/* every (sample, head) of one pass; keep 0: the recompute way */
#define PASS_BODY                                                                           \
  const double t0 = bench_now();                                                            \
  for (int64_t n = 0; n < N; n++)                                                           \
    for (int64_t j = 0; j < HEADS; j++) {                                                   \
      ops_attn_head h = {0};                                                                \
      const float *base = b->qkv + n * T * 3 * D + j * DH;                                  \
      h.q = base, h.k = base + D, h.v = base + 2 * D, h.ts = 3 * D, h.cs = 1;              \
      h.y = b->y + n * T * D + j * DH, h.yts = D, h.ycs = 1;                                \
      h.lse = b->lse + n * T * HEADS + j, h.lts = HEADS;                                    \
      h.dy = b->dy + n * T * D + j * DH, h.dts = D, h.dcs = 1;                              \
      float *dbase = b->dqkv + n * T * 3 * D + j * DH;                                      \
      h.dq = dbase, h.dk = dbase + D, h.dv = dbase + 2 * D, h.gts = 3 * D, h.gcs = 1;      \
      h.probs = keep ? b->probs + (n * HEADS + j) * T * T : NULL;                           \
      if (bwd) ops_attn_head_bwd(g, &h, scratch);                                           \
      else ops_attn_head_fwd(g, &h, scratch);                                               \
    }                                                                                       \
  return bench_now() - t0;

/* built for AVX2 where the CPU has it, as ops/cpu runs these loops */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static double pass_avx2(const ops_attn_geo *g, const bufs *b,
                                                        int bwd, int keep, double *scratch) {
  PASS_BODY
}
#endif
static double pass_default(const ops_attn_geo *g, const bufs *b, int bwd, int keep,
                           double *scratch) {
  PASS_BODY
}
static double pass(const ops_attn_geo *g, const bufs *b, int bwd, int keep, double *scratch) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return pass_avx2(g, b, bwd, keep, scratch);
#endif
  return pass_default(g, b, bwd, keep, scratch);
}

#ifdef BENCH_ATTN_CBLAS
/* the forward through sgemm: float scores and softmax, lse kept */
static double pass_sgemm(const bufs *b, float *S) {
  const double t0 = bench_now();
  const float scale = 0.25f;
  for (int64_t n = 0; n < N; n++)
    for (int64_t j = 0; j < HEADS; j++) {
      const float *q = b->qkv + n * T * 3 * D + j * DH;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DH, scale, q, 3 * D, q + D,
                  3 * D, 0.0f, S, T);
      for (int t = 0; t < T; t++) {
        float *row = S + t * T, m = -INFINITY, sum = 0.0f;
        for (int u = 0; u < T; u++) m = row[u] > m ? row[u] : m;
        for (int u = 0; u < T; u++) sum += row[u] = expf(row[u] - m);
        const float inv = 1.0f / sum;
        for (int u = 0; u < T; u++) row[u] *= inv;
        b->lse[(n * T + t) * HEADS + j] = m + logf(sum);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DH, T, 1.0f, S, T, q + 2 * D,
                  3 * D, 0.0f, b->y + n * T * D + j * DH, D);
    }
  return bench_now() - t0;
}
#endif

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 9;
  if (rounds < 1 || rounds > 1000) {
    fprintf(stderr, "bench_attention_backward: rounds must be 1..1000\n");
    return 2;
  }
  uint64_t s = 1;
  bufs b = {rand_floats((size_t)N * T * 3 * D, &s), rand_floats((size_t)N * T * D, &s),
            rand_floats((size_t)N * T * HEADS, &s), rand_floats((size_t)N * T * D, &s),
            rand_floats((size_t)N * T * 3 * D, &s), rand_floats((size_t)N * HEADS * T * T, &s)};
  const ops_attn_geo g = {N, T, D, HEADS, DH, W, 0, 0, 0.25};
  double *scratch = malloc(ops_attn_scratch(&g) * sizeof(double));
  double *t[5]; /* fwd recompute, bwd recompute, fwd saved, bwd saved, fwd sgemm */
  int ways = 4;
  double *tg = malloc((size_t)rounds * sizeof(double));
  for (int k = 0; k < 4; k++) t[k] = malloc((size_t)rounds * sizeof(double));
#ifdef BENCH_ATTN_CBLAS
  openblas_set_num_threads(1);
  float *S = malloc((size_t)T * T * sizeof(float));
  ways = 5;
#endif
  for (int r = 0; r < rounds; r++) {
    for (int way = 0; way < 2; way++) {
      const int keep = (r + way) % 2; /* alternate which goes first */
      t[2 * keep][r] = pass(&g, &b, 0, keep, scratch);
      t[2 * keep + 1][r] = pass(&g, &b, 1, keep, scratch);
    }
#ifdef BENCH_ATTN_CBLAS
    tg[r] = pass_sgemm(&b, S);
#endif
  }
  static const char *const names[5] = {"recompute fwd", "recompute bwd", "saved fwd", "saved bwd",
                                       "sgemm fwd"};
  printf("attention N=%d T=%d D=%d heads=%d (dh %d), one thread, %d rounds alternating\n", N, T,
         D, HEADS, DH, rounds);
  for (int k = 0; k < ways; k++) {
    if (k == 4) t[4] = tg;
    qsort(t[k], (size_t)rounds, sizeof(double), cmp);
    printf("  %-14s min %7.2f ms  median %7.2f ms\n", names[k], t[k][0] * 1e3,
           t[k][rounds / 2] * 1e3);
  }
  printf("  kept for the backward per layer: lse %zu bytes, probabilities %zu bytes\n",
         (size_t)N * T * HEADS * sizeof(float), (size_t)N * HEADS * T * T * sizeof(float));
  for (int k = 0; k < 4; k++) free(t[k]);
  free(tg);
#ifdef BENCH_ATTN_CBLAS
  free(S);
#endif
  free(scratch);
  free(b.qkv), free(b.y), free(b.lse), free(b.dy), free(b.dqkv), free(b.probs);
  return 0;
}
