/* bench_conv_kernels: GFLOP/s of the conv2d kernels of the reference and
 * BLAS op modules on the CNN's convolutions (models/cnn.yaml: 3x3, stride
 * 1, padding 1, no bias), forward, backward-data and backward-filter.
 *
 *   bench_conv_kernels [--batch N] [--seconds S] [--reference PATH] [--blas PATH]
 *
 * Both modules are loaded through the registry (default paths: the build
 * tree's). Each (shape, pass, kernel) runs once to warm up, then repeatedly
 * for at least S seconds (default 1, at least 2 runs); the best run counts.
 * FLOPs of one pass: 2 * N * OH * OW * K * kh * kw * C/groups. The last
 * column is max|blas - reference| / max(1, max|reference|) over the pass's
 * output. The kernels get one rank's threads, as in training: every core
 * this process may use, or BP_THREADS (bench_env.h);
 * the BLAS module applies that count to OpenBLAS (ops/blas/module.c).
 *
 *   bench_conv_kernels --impls A,B[,...] [--batch N] [--rounds R] [--seconds S]
 *
 * compares implementations instead (every module found as `blueprint
 * plugins` finds them is loaded) on the convolutions of models/cnn.yaml and
 * models/resnet8.yaml: per (layer, pass), R rounds (default 7), each
 * running every implementation in turn for S / R seconds (S default 1), so
 * load from other processes hits them alike. Kernels get prepare() /
 * release() and a parameter generation that moves before every run (a
 * training step's weights change every step). Printed: each
 * implementation's median over the rounds of its mean milliseconds per
 * call, and the median over rounds of the per-round ratio B/A (and C/A...):
 * above 1, A is faster. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "cnn_convs.h"
#include "bench_env.h"

#define F32 BP_ABI_DTYPE_FP32

static const bp_abi_threads *bench_threads; /* one rank's, lent to every call */

/* k bound to in0, in1 -> out on the bench's threads; why not on stderr. */
static int node_open(bench_node *n, const bp_abi_kernel *k, const bench_buf *in0,
                     const bench_buf *in1, const bench_buf *out, const bp_conv2d_attrs *attrs) {
  const bench_buf in[2] = {*in0, *in1};
  if (bench_node_open(n, k, in, 2, out, 1, attrs, sizeof *attrs, bench_threads)) return 1;
  bench_node_report(n, "bench_conv_kernels");
  return 0;
}

static void usage(void);

/* ---- --impls: implementations side by side, alternating ---------------------- */

/* A convolution of models/cnn.yaml or models/resnet8.yaml (no bias). */
typedef struct conv_layer {
  const char *model, *name;
  int64_t h, w, c, k, kernel, stride, pad;
} conv_layer;

static const conv_layer conv_layers[] = {
    {"cnn", "conv1", 28, 28, 1, 32, 3, 1, 1},
    {"cnn", "conv2", 28, 28, 32, 32, 3, 1, 1},
    {"cnn", "conv3", 14, 14, 32, 64, 3, 1, 1},
    {"cnn", "conv4", 14, 14, 64, 64, 3, 1, 1},
    {"resnet8", "stem", 28, 28, 1, 16, 3, 1, 1},
    {"resnet8", "b1_conv1,2", 28, 28, 16, 16, 3, 1, 1},
    {"resnet8", "b2_conv1", 28, 28, 16, 32, 3, 2, 1},
    {"resnet8", "b2_conv2", 14, 14, 32, 32, 3, 1, 1},
    {"resnet8", "b2_proj", 28, 28, 16, 32, 1, 2, 0},
    {"resnet8", "b3_conv1", 14, 14, 32, 64, 3, 2, 1},
    {"resnet8", "b3_conv2", 7, 7, 64, 64, 3, 1, 1},
    {"resnet8", "b3_proj", 14, 14, 32, 64, 1, 2, 0},
};

#define MAX_IMPLS 6

/* Mean seconds per call over at least `seconds` (at least 2 calls), the
 * generation moving before each; < 0 on failure. */
static double node_mean(bench_node *n, double seconds) {
  int calls = 0;
  const double start = bench_now();
  double t = 0;
  do {
    n->generation++;
    if (n->k->run(n->k->user, &n->args) != BP_ABI_OK) return -1;
    calls++;
    t = bench_now() - start;
  } while (calls < 2 || t < seconds);
  return t / calls;
}

static int compare_impls(const char *list, int64_t batch, int rounds, double seconds) {
  char names[MAX_IMPLS][32];
  int ni = 0;
  for (const char *s = list; *s && ni < MAX_IMPLS;) {
    const size_t len = strcspn(s, ",");
    snprintf(names[ni++], sizeof names[0], "%.*s", (int)len, s);
    s += len + (s[len] == ',');
  }
  if (ni < 2) {
    usage();
    return 2;
  }
  bp_registry *r = NULL;
  bp_threads *pool = NULL;
  if (!bench_discover("bench_conv_kernels", &r, &pool)) return 1;
  bench_threads = bp_threads_abi(pool);
  printf("conv2d, batch %lld, FP32, ms per call (median of %d alternating rounds); threads: %d\n",
         (long long)batch, rounds, bench_threads->count);
  printf("%-8s %-11s %-11s", "model", "layer", "pass");
  for (int i = 0; i < ni; i++) printf(" %10s", names[i]);
  for (int i = 1; i < ni; i++) printf(" %7.7s/%-7.7s", names[i], names[0]);
  printf("\n");
  static const char *const ops[] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter"};
  uint64_t rng = 42;
  int rc = 0;
  for (size_t li = 0; li < sizeof conv_layers / sizeof conv_layers[0] && rc == 0; li++) {
    const conv_layer *l = &conv_layers[li];
    const int64_t oh = (l->h + 2 * l->pad - l->kernel) / l->stride + 1;
    const int64_t ow = (l->w + 2 * l->pad - l->kernel) / l->stride + 1;
    const bp_conv2d_attrs attrs = {(int32_t)l->kernel, (int32_t)l->kernel, (int32_t)l->stride,
                                   (int32_t)l->stride, (int32_t)l->pad, (int32_t)l->pad,
                                   1, 1, 1, 0, 0};
    bench_buf x, w, y;
    if (!bench_buf_new(&x, F32, batch, l->h, l->w, l->c, &rng) ||
        !bench_buf_new(&w, F32, l->k, l->kernel, l->kernel, l->c, &rng) ||
        !bench_buf_new(&y, F32, batch, oh, ow, l->k, &rng)) {
      fprintf(stderr, "bench_conv_kernels: out of memory\n");
      return 1;
    }
    for (int p = 0; p < 3 && rc == 0; p++) {
      const bench_buf *in0 = p == 0 ? &x : p == 1 ? &y : &x, *in1 = p == 2 ? &y : &w;
      const bench_buf *like = p == 0 ? &y : p == 1 ? &x : &w;
      bench_buf out[MAX_IMPLS];
      bench_node b[MAX_IMPLS];
      int ok[MAX_IMPLS] = {0};
      memset(b, 0, sizeof b);
      double t[MAX_IMPLS][64], ratio[MAX_IMPLS][64];
      const int nr = rounds < 64 ? rounds : 64;
      for (int i = 0; i < ni; i++) {
        const bp_abi_kernel *k = bench_find_kernel(r, ops[p], names[i]);
        if (!bench_buf_new(&out[i], F32, like->d.shape[0], like->d.shape[1], like->d.shape[2],
                           like->d.shape[3], NULL))
          return 1;
        ok[i] = k && node_open(&b[i], k, in0, in1, &out[i], &attrs) &&
                b[i].k->run(b[i].k->user, &b[i].args) == BP_ABI_OK; /* warm-up */
      }
      for (int round = 0; round < nr; round++)
        for (int i = 0; i < ni; i++) {
          t[i][round] = ok[i] ? node_mean(&b[i], seconds / nr) : -1;
          if (t[i][round] < 0) ok[i] = 0;
        }
      printf("%-8s %-11s %-11s", l->model, l->name, ops[p] + 7);
      double med[MAX_IMPLS];
      for (int i = 0; i < ni; i++) {
        for (int round = 0; round < nr && ok[0] && ok[i]; round++)
          ratio[i][round] = t[i][round] / t[0][round];
        med[i] = ok[i] ? bench_median(t[i], nr) * 1e3 : -1;
        if (med[i] < 0) printf(" %10s", "-");
        else printf(" %10.3f", med[i]);
      }
      for (int i = 1; i < ni; i++) {
        if (ok[0] && ok[i]) printf(" %15.2f", bench_median(ratio[i], nr));
        else printf(" %15s", "-");
      }
      printf("\n");
      fflush(stdout);
      for (int i = 0; i < ni; i++) {
        bench_node_close(&b[i]);
        free(out[i].p);
      }
    }
    free(x.p), free(w.p), free(y.p);
  }
  bp_threads_destroy(pool);
  bp_registry_destroy(r);
  return rc;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_conv_kernels [--batch N] [--seconds S] [--reference PATH] [--blas PATH]\n"
          "       bench_conv_kernels --impls A,B[,...] [--batch N] [--rounds R] [--seconds S]\n");
}

int main(int argc, char **argv) {
  int64_t batch = 128;
  double seconds = 1.0;
  const char *ref_path = BP_OPS_REFERENCE_PATH, *blas_path = BP_OPS_BLAS_PATH, *impls = NULL;
  int rounds = 7;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoll(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--reference") == 0 && i + 1 < argc) ref_path = argv[++i];
    else if (strcmp(argv[i], "--blas") == 0 && i + 1 < argc) blas_path = argv[++i];
    else if (strcmp(argv[i], "--impls") == 0 && i + 1 < argc) impls = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else {
      usage();
      return 2;
    }
  }
  if (batch < 1 || !(seconds >= 0) || rounds < 1) {
    usage();
    return 2;
  }
  if (impls) return compare_impls(impls, batch, rounds, seconds);
  bp_registry *r = NULL;
  if (bp_registry_create(&r) != BP_OK || bp_registry_load(r, ref_path) != BP_OK ||
      bp_registry_load(r, blas_path) != BP_OK) {
    fprintf(stderr, "bench_conv_kernels: %s\n", bp_last_error());
    bp_registry_destroy(r);
    return 1;
  }
  bp_threads *pool = NULL;
  if (bp_threads_create(bench_env_rank_threads(), &pool) != BP_OK) {
    fprintf(stderr, "bench_conv_kernels: %s\n", bp_last_error());
    bp_registry_destroy(r);
    return 1;
  }
  bench_threads = bp_threads_abi(pool);
  printf("conv2d 3x3 stride 1 pad 1, batch %lld, FP32; threads: %d\n", (long long)batch,
         bench_threads->count);
  printf("%-20s %-11s %12s %12s %8s %9s\n", "shape", "pass", "ref GFLOP/s", "blas GFLOP/s",
         "speedup", "norm err");

  static const char *const ops[] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter"};
  int rc = 0;
  uint64_t rng = 42;
  for (size_t s = 0; s < CNN_CONVS && rc == 0; s++) {
    const cnn_conv *sh = &cnn_convs[s];
    const bp_conv2d_attrs attrs = {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    bench_buf x, w, y, out_ref, out_blas;
    int ok = bench_buf_new(&x, F32, batch, sh->h, sh->w, sh->c, &rng) &&
             bench_buf_new(&w, F32, sh->k, 3, 3, sh->c, &rng) &&
             bench_buf_new(&y, F32, batch, sh->h, sh->w, sh->k, &rng);
    if (!ok) {
      fprintf(stderr, "bench_conv_kernels: out of memory\n");
      return 1;
    }
    const double flops = 2.0 * (double)batch * (double)(sh->h * sh->w) * (double)sh->k * 9.0 *
                         (double)sh->c;
    for (int p = 0; p < 3 && rc == 0; p++) {
      /* fwd: x, w -> y;  bwd_data: dy, w -> dx;  bwd_filter: x, dy -> dw */
      const bench_buf *in0 = p == 0 ? &x : p == 1 ? &y : &x, *in1 = p == 2 ? &y : &w;
      const bench_buf *like = p == 0 ? &y : p == 1 ? &x : &w;
      if (!bench_buf_new(&out_ref, F32, like->d.shape[0], like->d.shape[1], like->d.shape[2],
                         like->d.shape[3], NULL) ||
          !bench_buf_new(&out_blas, F32, like->d.shape[0], like->d.shape[1], like->d.shape[2],
                         like->d.shape[3], NULL)) {
        fprintf(stderr, "bench_conv_kernels: out of memory\n");
        return 1;
      }
      const bp_abi_kernel *kr = bench_find_kernel(r, ops[p], "reference");
      const bp_abi_kernel *kb = bench_find_kernel(r, ops[p], "blas");
      bench_node cr, cb;
      if (!kr || !kb || !node_open(&cr, kr, in0, in1, &out_ref, &attrs) ||
          !node_open(&cb, kb, in0, in1, &out_blas, &attrs)) {
        fprintf(stderr, "bench_conv_kernels: %s: no usable reference and blas kernels\n", ops[p]);
        rc = 1;
        break;
      }
      const double tr = bench_node_best(&cr, seconds, 0), tb = bench_node_best(&cb, seconds, 0);
      if (tr < 0 || tb < 0) {
        fprintf(stderr, "bench_conv_kernels: %s run() failed\n", ops[p]);
        rc = 1;
      } else {
        printf("%-20s %-11s %12.2f %12.2f %7.1fx %9.1e\n", sh->name, ops[p] + 7,
               flops / tr * 1e-9, flops / tb * 1e-9, tr / tb, bench_norm_err(&out_blas, &out_ref));
        fflush(stdout);
      }
      bench_node_close(&cr), bench_node_close(&cb);
      free(out_ref.p), free(out_blas.p);
    }
    free(x.p), free(w.p), free(y.p);
  }
  bp_registry_destroy(r);
  bp_threads_destroy(pool);
  return rc;
}
