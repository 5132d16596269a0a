/* bench_memory_ops: this machine's memory bandwidth beside what the
 * memory-bound training kernels achieve.
 *
 *   bench_memory_ops [--reps N] [--impl cpu] [--baseline MODULE.so] [--only OP_PREFIX]
 *                    [--no-stream]
 *
 * Part 1, stream-like: read (a sum of 64-bit words), write (a fill), copy
 * (b = a) and triad (a = b + s * c) over 12.8 MB float arrays (the CNN's
 * 128x28x28x32 feature), on 1 and 2 threads (the host's thread pool, 64
 * tasks), best of N runs. Bytes counted as the loop names them (copy: 2
 * arrays; triad: 3); a store to memory not in cache also reads the line
 * first (write-allocate), which the figures include but do not count.
 *
 * Part 2: every batchnorm, relu and maxpool kernel of the named module on
 * the CNN's shapes at batch 128, on 1 and 2 threads, best of N runs, and
 * the bytes each must move, by the same count: T = one feature tensor,
 *   batchnorm.fwd_train  3T  (x read for the statistics, x read and y
 *                             written by the normalization)
 *   batchnorm.bwd        5T  (x and dy read for the sums; x, dy read and
 *                             dx written by the second pass)
 *   relu.fwd 2T, relu.bwd 3T (y, dy read, dx written)
 *   maxpool.fwd  T + T/4 + T/16 (x; y; the INT8 mask)
 *   maxpool.bwd  T/4 + T/16 + T (dy; mask; dx)
 * A kernel that fuses two of them is credited the same bytes.
 *   batchnorm_relu.fwd_train  3T  (as batchnorm's; the relu costs nothing)
 *   batchnorm_relu.bwd        7T  (batchnorm's and y, the relu output,
 *                                  read by both passes)
 * --baseline loads another build of the module (say, one built from an
 * older commit) into a second registry and times its kernels too, each
 * run alternating with the first's, so a busy machine's drift hits both
 * alike. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

/* ---- stream ---------------------------------------------------------------- */

#define STREAM_N ((int64_t)128 * 28 * 28 * 32)
#define STREAM_TASKS 64

typedef enum stream_kind { S_READ, S_WRITE, S_COPY, S_TRIAD } stream_kind;
static const char *const stream_names[] = {"read", "write", "copy", "triad"};
static const int stream_arrays[] = {1, 1, 2, 3};

typedef struct stream_job {
  stream_kind kind;
  float *a, *b, *c;
  uint64_t sums[STREAM_TASKS];
} stream_job;

static void stream_task(void *p, int64_t i) {
  stream_job *j = p;
  const int64_t per = STREAM_N / STREAM_TASKS, lo = i * per, hi = lo + per;
  float *restrict a = j->a, *restrict b = j->b, *restrict c = j->c;
  switch (j->kind) {
    case S_READ: {
      const uint64_t *w = (const uint64_t *)(a + lo);
      uint64_t s = 0;
      for (int64_t k = 0; k < (hi - lo) / 2; k++) s += w[k];
      j->sums[i] = s;
      break;
    }
    case S_WRITE:
      for (int64_t k = lo; k < hi; k++) a[k] = 1.0f;
      break;
    case S_COPY:
      for (int64_t k = lo; k < hi; k++) b[k] = a[k];
      break;
    case S_TRIAD:
      for (int64_t k = lo; k < hi; k++) a[k] = b[k] + 3.0f * c[k];
      break;
  }
}

static void run_stream(const bp_abi_threads *t, int reps) {
  stream_job j;
  memset(&j, 0, sizeof j);
  const size_t bytes = (size_t)STREAM_N * sizeof(float);
  if (posix_memalign((void **)&j.a, 256, bytes) || posix_memalign((void **)&j.b, 256, bytes) ||
      posix_memalign((void **)&j.c, 256, bytes)) {
    fprintf(stderr, "bench_memory_ops: out of memory\n");
    exit(1);
  }
  for (int64_t k = 0; k < STREAM_N; k++) j.a[k] = j.b[k] = j.c[k] = (float)(k & 255);
  printf("stream, %.1f MB arrays, %d thread(s), best of %d: GB/s\n", (double)bytes / 1e6,
         t->count, reps);
  for (int kind = 0; kind < 4; kind++) {
    j.kind = (stream_kind)kind;
    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
      const double t0 = bench_now();
      t->parallel_for(t->ctx, stream_task, &j, STREAM_TASKS);
      const double dt = bench_now() - t0;
      if (dt < best) best = dt;
    }
    printf("  %-6s %7.2f\n", stream_names[kind], (double)bytes * stream_arrays[kind] / best / 1e9);
  }
  free(j.a), free(j.b), free(j.c);
}

/* ---- kernels --------------------------------------------------------------- */

/* A tensor of a problem: FP32 uniform in [-1, 1), INT8 zeros; out of
 * memory ends the bench. */
static void buf_new(bench_buf *b, int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                    uint64_t *rng) {
  if (!bench_buf_new(b, dtype, n, h, w, c, rng)) {
    fprintf(stderr, "bench_memory_ops: out of memory\n");
    exit(1);
  }
}

/* One op at one shape: its tensors, attributes and the bytes it must move. */
typedef struct problem {
  const char *op;
  bench_buf in[6], out[5];
  int nin, nout;
  bp_batchnorm_attrs bn;
  bp_pool_attrs pool;
  bp_elementwise_attrs ew;
  const void *attrs;
  uint32_t attr_size;
  double bytes;
} problem;

static void problem_new(problem *p, const char *op, int64_t n, int64_t h, int64_t w, int64_t c,
                        uint64_t *rng) {
  memset(p, 0, sizeof *p);
  p->op = op;
  const double T = (double)(n * h * w * c) * 4.0;
  if (strncmp(op, "batchnorm", 9) == 0) {
    const int bwd = strstr(op, ".bwd") != NULL, relu = strstr(op, "_relu.") != NULL;
    p->bn = (bp_batchnorm_attrs){.eps = 1e-5f, .momentum = 0.1f};
    p->attrs = &p->bn, p->attr_size = sizeof p->bn;
    p->nin = bwd && relu ? 6 : 5, p->nout = bwd ? 3 : 5;
    if (p->nin == 6) buf_new(&p->in[5], BP_ABI_DTYPE_FP32, n, h, w, c, rng); /* y */
    buf_new(&p->in[0], BP_ABI_DTYPE_FP32, n, h, w, c, rng);
    for (int i = 1; i < 5; i++)
      buf_new(&p->in[i], BP_ABI_DTYPE_FP32, i == 1 && bwd ? n : 1, i == 1 && bwd ? h : 1,
              i == 1 && bwd ? w : 1, c, rng);
    for (int o = 0; o < p->nout; o++)
      buf_new(&p->out[o], BP_ABI_DTYPE_FP32, o ? 1 : n, o ? 1 : h, o ? 1 : w, c, rng);
    float *var = p->in[4].p; /* save_invstd (bwd) or running_var: > 0 */
    for (int64_t k = 0; k < c; k++) var[k] = 1.0f + fabsf(var[k]);
    p->bytes = bwd ? (relu ? 7 : 5) * T : 3 * T;
  } else if (strncmp(op, "relu", 4) == 0) {
    const int bwd = strcmp(op, "relu.bwd") == 0;
    p->attrs = &p->ew, p->attr_size = sizeof p->ew;
    p->nin = bwd ? 2 : 1, p->nout = 1;
    for (int i = 0; i < p->nin; i++) buf_new(&p->in[i], BP_ABI_DTYPE_FP32, n, h, w, c, rng);
    buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, h, w, c, rng);
    p->bytes = bwd ? 3 * T : 2 * T;
  } else {
    const int bwd = strcmp(op, "maxpool.bwd") == 0;
    p->pool = (bp_pool_attrs){.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    p->attrs = &p->pool, p->attr_size = sizeof p->pool;
    bench_buf x, y, m;
    buf_new(&x, BP_ABI_DTYPE_FP32, n, h, w, c, rng);
    buf_new(&y, BP_ABI_DTYPE_FP32, n, h / 2, w / 2, c, rng);
    buf_new(&m, BP_ABI_DTYPE_INT8, n, h / 2, w / 2, c, rng);
    if (bwd) {
      p->in[0] = y, p->in[1] = m, p->out[0] = x;
      p->nin = 2, p->nout = 1;
    } else {
      p->in[0] = x, p->out[0] = y, p->out[1] = m;
      p->nin = 1, p->nout = 2;
    }
    p->bytes = T + T / 4 + T / 16;
  }
}

static void problem_free(problem *p) {
  for (int i = 0; i < p->nin; i++) free(p->in[i].p);
  for (int o = 0; o < p->nout; o++) free(p->out[o].p);
}

/* Best seconds of k (and of base, when not NULL, alternating with k) on
 * p; < 0 where one refuses or fails. */
static void time_kernels(const bp_abi_kernel *k, const bp_abi_kernel *base, problem *p,
                         const bp_abi_threads *t, int reps, double *sec, double *base_sec) {
  bench_node b[2];
  const bp_abi_kernel *ks[2] = {k, base};
  const int nk = base ? 2 : 1;
  int ok[2] = {0, 0};
  double best[2] = {INFINITY, INFINITY};
  for (int i = 0; i < nk; i++) {
    ok[i] = bench_node_open(&b[i], ks[i], p->in, p->nin, p->out, p->nout, p->attrs,
                            p->attr_size, t);
    if (!ok[i]) bench_node_report(&b[i], "bench_memory_ops");
  }
  for (int r = 0; r <= reps; r++) /* run 0 warms up */
    for (int i = 0; i < nk; i++) {
      const double dt = ok[i] ? bench_node_call(&b[i]) : -1;
      if (ok[i] && dt < 0) bench_node_report(&b[i], "bench_memory_ops"), ok[i] = 0;
      if (ok[i] && r > 0 && dt < best[i]) best[i] = dt;
    }
  *sec = ok[0] ? best[0] : -1;
  *base_sec = nk == 2 && ok[1] ? best[1] : -1;
  for (int i = 0; i < nk; i++) bench_node_close(&b[i]);
}

typedef struct shape {
  const char *layer, *op;
  int64_t h, w, c;
} shape;

static const shape shapes[] = {
    {"bn1,bn2", "batchnorm.fwd_train", 28, 28, 32}, {"bn1,bn2", "batchnorm.bwd", 28, 28, 32},
    {"bn3,bn4", "batchnorm.fwd_train", 14, 14, 64}, {"bn3,bn4", "batchnorm.bwd", 14, 14, 64},
    {"relu1,2", "relu.fwd", 28, 28, 32},            {"relu1,2", "relu.bwd", 28, 28, 32},
    {"relu3,4", "relu.fwd", 14, 14, 64},            {"relu3,4", "relu.bwd", 14, 14, 64},
    {"bn1,2+relu", "batchnorm_relu.fwd_train", 28, 28, 32},
    {"bn1,2+relu", "batchnorm_relu.bwd", 28, 28, 32},
    {"bn3,4+relu", "batchnorm_relu.fwd_train", 14, 14, 64},
    {"bn3,4+relu", "batchnorm_relu.bwd", 14, 14, 64},
    {"pool1", "maxpool.fwd", 28, 28, 32},           {"pool1", "maxpool.bwd", 28, 28, 32},
    {"pool2", "maxpool.fwd", 14, 14, 64},           {"pool2", "maxpool.bwd", 14, 14, 64},
};

int main(int argc, char **argv) {
  int reps = 30;
  const char *impl = "cpu", *baseline = NULL, *only = NULL;
  int stream = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--impl") == 0 && i + 1 < argc)
      impl = argv[++i];
    else if (strcmp(argv[i], "--baseline") == 0 && i + 1 < argc)
      baseline = argv[++i];
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
      only = argv[++i];
    else if (strcmp(argv[i], "--no-stream") == 0)
      stream = 0;
    else {
      fprintf(stderr, "usage: bench_memory_ops [--reps N] [--impl cpu] [--baseline MODULE.so]\n"
                      "                        [--only OP_PREFIX] [--no-stream]\n");
      return 2;
    }
  }
  bp_registry *r = NULL, *rb = NULL;
  bp_threads *pools[2] = {NULL, NULL};
  if (bp_registry_create(&r) != BP_OK || bp_registry_discover(r, NULL, 0) != BP_OK ||
      (baseline && (bp_registry_create(&rb) != BP_OK || bp_registry_load(rb, baseline) != BP_OK)) ||
      bp_threads_create(1, &pools[0]) != BP_OK || bp_threads_create(2, &pools[1]) != BP_OK) {
    fprintf(stderr, "bench_memory_ops: %s\n", bp_last_error());
    return 1;
  }
  for (int t = 0; t < 2 && stream; t++) run_stream(bp_threads_abi(pools[t]), reps);
  printf("kernels (%s), batch 128, best of %d: ms and GB/s of the bytes each must move\n", impl,
         reps);
  printf("  %-8s %-20s %-12s %8s %8s %8s %8s %8s%s\n", "layer", "op", "shape", "MB", "ms 1t",
         "GB/s 1t", "ms 2t", "GB/s 2t",
         baseline ? "   base ms 1t  base ms 2t  (baseline module)" : "");
  uint64_t rng = 7;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const shape *sh = &shapes[s];
    const bp_abi_kernel *k = bench_find_kernel(r, sh->op, impl);
    if (!k || (only && strncmp(sh->op, only, strlen(only)) != 0)) continue;
    problem p;
    problem_new(&p, sh->op, 128, sh->h, sh->w, sh->c, &rng);
    char dims[32];
    snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)sh->h, (long long)sh->w,
             (long long)sh->c);
    printf("  %-8s %-20s %-12s %8.1f", sh->layer, sh->op, dims, p.bytes / 1e6);
    double sec[2], base_sec[2];
    const bp_abi_kernel *kb = rb ? bench_find_kernel(rb, sh->op, impl) : NULL;
    for (int t = 0; t < 2; t++)
      time_kernels(k, kb, &p, bp_threads_abi(pools[t]), reps, &sec[t], &base_sec[t]);
    for (int t = 0; t < 2; t++) {
      if (sec[t] < 0)
        printf(" %8s %8s", "-", "-");
      else
        printf(" %8.3f %8.2f", sec[t] * 1e3, p.bytes / sec[t] / 1e9);
    }
    for (int t = 0; t < 2 && kb; t++) printf(" %11.3f", base_sec[t] * 1e3);
    printf("\n");
    fflush(stdout);
    problem_free(&p);
  }
  bp_threads_destroy(pools[0]);
  bp_threads_destroy(pools[1]);
  bp_registry_destroy(r);
  bp_registry_destroy(rb);
  return 0;
}
