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
 * this process may use, or BP_THREADS (core/include/blueprint/threads.h);
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
#include <time.h>

#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

typedef struct shape {
  const char *name;
  int64_t h, w, c, k;
} shape;

/* The CNN's convolutions (conv1..conv4 of models/cnn.yaml). */
static const shape shapes[] = {
    {"conv1 28x28x1->32", 28, 28, 1, 32},
    {"conv2 28x28x32->32", 28, 28, 32, 32},
    {"conv3 14x14x32->64", 14, 14, 32, 64},
    {"conv4 14x14x64->64", 14, 14, 64, 64},
};

/* A compact FP32 tensor and its buffer. */
typedef struct buf {
  bp_abi_tensor d;
  float *p;
} buf;

static int buf_new(buf *b, int64_t n, int64_t h, int64_t w, int64_t c) {
  memset(b, 0, sizeof *b);
  b->d.struct_size = sizeof b->d;
  b->d.dtype = BP_ABI_DTYPE_FP32;
  b->d.shape[0] = n, b->d.shape[1] = h, b->d.shape[2] = w, b->d.shape[3] = c;
  b->d.padded_c = c;
  b->d.stride[3] = 1, b->d.stride[2] = c, b->d.stride[1] = w * c, b->d.stride[0] = h * w * c;
  b->d.slot_bytes = (uint64_t)(n * h * w * c) * sizeof(float) + 16;
  if (posix_memalign((void **)&b->p, 256, (size_t)b->d.slot_bytes) != 0) return 0;
  memset(b->p, 0, (size_t)b->d.slot_bytes);
  return 1;
}

static int64_t buf_count(const buf *b) {
  return b->d.shape[0] * b->d.shape[1] * b->d.shape[2] * b->d.shape[3];
}

static void buf_rand(buf *b, uint64_t *rng) {
  for (int64_t i = 0; i < buf_count(b); i++) {
    *rng = *rng * 6364136223846793005u + 1442695040888963407u;
    b->p[i] = (float)((double)(*rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const bp_abi_kernel *find_kernel(const bp_registry *r, const char *op, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0 && strcmp(k->device, "cpu") == 0)
      return k;
  }
  return NULL;
}

/* One kernel call: args over the given tensors, a workspace of exactly
 * workspace_size() bytes. */
typedef struct call {
  const bp_abi_kernel *k;
  bp_abi_tensor in[2], out[1];
  const void *in_ptrs[2];
  void *out_ptrs[1];
  bp_abi_kernel_args args;
  void *ws;
} call;

static const bp_abi_threads *bench_threads; /* one rank's, lent to every call */

static int call_init(call *c, const bp_abi_kernel *k, const buf *in0, const buf *in1, buf *out,
                     const bp_conv2d_attrs *attrs) {
  memset(c, 0, sizeof *c);
  c->k = k;
  c->in[0] = in0->d, c->in[1] = in1->d, c->out[0] = out->d;
  c->in_ptrs[0] = in0->p, c->in_ptrs[1] = in1->p, c->out_ptrs[0] = out->p;
  c->args.struct_size = sizeof c->args;
  c->args.num_inputs = 2, c->args.num_outputs = 1;
  c->args.inputs = c->in, c->args.outputs = c->out;
  c->args.attrs = attrs, c->args.attr_size = sizeof *attrs;
  c->args.attr_version = BP_ABI_ATTR_VERSION;
  c->args.world_size = 1;
  c->args.threads = bench_threads;
  char reason[256] = "";
  if (k->supports && !k->supports(k->user, &c->args, reason, sizeof reason)) {
    fprintf(stderr, "%s/%s refuses: %s\n", k->op, k->impl, reason);
    return 0;
  }
  const uint64_t need = k->workspace_size ? k->workspace_size(k->user, &c->args) : 0;
  if (need > 0) {
    if (posix_memalign(&c->ws, 256, (size_t)need) != 0) return 0;
    c->args.workspace = c->ws, c->args.workspace_bytes = need;
  }
  c->args.input_ptrs = c->in_ptrs, c->args.output_ptrs = c->out_ptrs;
  return 1;
}

/* Best seconds of one run; < 0 when run() fails. */
static double time_call(call *c, double min_seconds) {
  if (c->k->run(c->k->user, &c->args) != BP_ABI_OK) return -1;
  double best = INFINITY, start = now_s();
  for (int reps = 0; reps < 2 || now_s() - start < min_seconds; reps++) {
    const double t0 = now_s();
    if (c->k->run(c->k->user, &c->args) != BP_ABI_OK) return -1;
    const double t = now_s() - t0;
    if (t < best) best = t;
  }
  return best;
}

static double norm_err(const buf *a, const buf *b) {
  double diff = 0.0, scale = 1.0;
  for (int64_t i = 0; i < buf_count(a); i++) {
    const double d = fabs((double)a->p[i] - b->p[i]);
    if (!(d <= diff)) diff = d;
    if (fabs(b->p[i]) > scale) scale = fabs(b->p[i]);
  }
  return diff / scale;
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

/* One implementation's kernel bound to a call, with its state. */
typedef struct bound {
  call c;
  void *state;
  uint64_t generation;
  char reason[256];
} bound;

static int bound_init(bound *b, const bp_abi_kernel *k, const buf *in0, const buf *in1, buf *out,
                      const bp_conv2d_attrs *attrs) {
  memset(b, 0, sizeof *b);
  if (!call_init(&b->c, k, in0, in1, out, attrs)) return 0;
  b->generation = 1;
  b->c.args.params_generation = &b->generation;
  b->c.args.reason = b->reason, b->c.args.reason_size = sizeof b->reason;
  if (k->prepare && k->prepare(k->user, &b->c.args, &b->state) != BP_ABI_OK) {
    fprintf(stderr, "%s/%s prepare: %s\n", k->op, k->impl, b->reason);
    return 0;
  }
  b->c.args.state = b->state;
  return k->run(k->user, &b->c.args) == BP_ABI_OK; /* warm-up */
}

static void bound_free(bound *b) {
  if (b->state && b->c.k->release) b->c.k->release(b->c.k->user, b->state);
  free(b->c.ws);
}

/* Mean seconds per call over at least `seconds` (at least 2 calls); < 0 on failure. */
static double bound_time(bound *b, double seconds) {
  int calls = 0;
  const double start = now_s();
  double t = 0;
  do {
    b->generation++;
    if (b->c.k->run(b->c.k->user, &b->c.args) != BP_ABI_OK) return -1;
    calls++;
    t = now_s() - start;
  } while (calls < 2 || t < seconds);
  return t / calls;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
  if (bp_registry_create(&r) != BP_OK || bp_registry_discover(r, NULL, 0) != BP_OK ||
      bp_threads_create(bp_threads_share(1), &pool) != BP_OK) {
    fprintf(stderr, "bench_conv_kernels: %s\n", bp_last_error());
    bp_registry_destroy(r);
    return 1;
  }
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
    buf x, w, y;
    if (!buf_new(&x, batch, l->h, l->w, l->c) || !buf_new(&w, l->k, l->kernel, l->kernel, l->c) ||
        !buf_new(&y, batch, oh, ow, l->k)) {
      fprintf(stderr, "bench_conv_kernels: out of memory\n");
      return 1;
    }
    buf_rand(&x, &rng), buf_rand(&w, &rng), buf_rand(&y, &rng);
    for (int p = 0; p < 3 && rc == 0; p++) {
      const buf *in0 = p == 0 ? &x : p == 1 ? &y : &x, *in1 = p == 2 ? &y : &w;
      const buf *like = p == 0 ? &y : p == 1 ? &x : &w;
      buf out[MAX_IMPLS];
      bound b[MAX_IMPLS];
      int ok[MAX_IMPLS] = {0};
      memset(b, 0, sizeof b);
      double t[MAX_IMPLS][64], ratio[MAX_IMPLS][64];
      const int nr = rounds < 64 ? rounds : 64;
      for (int i = 0; i < ni; i++) {
        const bp_abi_kernel *k = find_kernel(r, ops[p], names[i]);
        if (!buf_new(&out[i], like->d.shape[0], like->d.shape[1], like->d.shape[2],
                     like->d.shape[3]))
          return 1;
        ok[i] = k && bound_init(&b[i], k, in0, in1, &out[i], &attrs);
      }
      for (int round = 0; round < nr; round++)
        for (int i = 0; i < ni; i++) {
          t[i][round] = ok[i] ? bound_time(&b[i], seconds / nr) : -1;
          if (t[i][round] < 0) ok[i] = 0;
        }
      printf("%-8s %-11s %-11s", l->model, l->name, ops[p] + 7);
      double med[MAX_IMPLS];
      for (int i = 0; i < ni; i++) {
        for (int round = 0; round < nr && ok[0] && ok[i]; round++)
          ratio[i][round] = t[i][round] / t[0][round];
        med[i] = ok[i] ? median(t[i], nr) * 1e3 : -1;
        if (med[i] < 0) printf(" %10s", "-");
        else printf(" %10.3f", med[i]);
      }
      for (int i = 1; i < ni; i++) {
        if (ok[0] && ok[i]) printf(" %15.2f", median(ratio[i], nr));
        else printf(" %15s", "-");
      }
      printf("\n");
      fflush(stdout);
      for (int i = 0; i < ni; i++) {
        bound_free(&b[i]);
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
  if (bp_threads_create(bp_threads_share(1), &pool) != BP_OK) {
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
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && rc == 0; s++) {
    const shape *sh = &shapes[s];
    const bp_conv2d_attrs attrs = {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    buf x, w, y, out_ref, out_blas;
    int ok = buf_new(&x, batch, sh->h, sh->w, sh->c) && buf_new(&w, sh->k, 3, 3, sh->c) &&
             buf_new(&y, batch, sh->h, sh->w, sh->k);
    if (!ok) {
      fprintf(stderr, "bench_conv_kernels: out of memory\n");
      return 1;
    }
    buf_rand(&x, &rng), buf_rand(&w, &rng), buf_rand(&y, &rng);
    const double flops = 2.0 * (double)batch * (double)(sh->h * sh->w) * (double)sh->k * 9.0 *
                         (double)sh->c;
    for (int p = 0; p < 3 && rc == 0; p++) {
      /* fwd: x, w -> y;  bwd_data: dy, w -> dx;  bwd_filter: x, dy -> dw */
      const buf *in0 = p == 0 ? &x : p == 1 ? &y : &x, *in1 = p == 2 ? &y : &w;
      const buf *like = p == 0 ? &y : p == 1 ? &x : &w;
      if (!buf_new(&out_ref, like->d.shape[0], like->d.shape[1], like->d.shape[2],
                   like->d.shape[3]) ||
          !buf_new(&out_blas, like->d.shape[0], like->d.shape[1], like->d.shape[2],
                   like->d.shape[3])) {
        fprintf(stderr, "bench_conv_kernels: out of memory\n");
        return 1;
      }
      const bp_abi_kernel *kr = find_kernel(r, ops[p], "reference");
      const bp_abi_kernel *kb = find_kernel(r, ops[p], "blas");
      call cr, cb;
      if (!kr || !kb || !call_init(&cr, kr, in0, in1, &out_ref, &attrs) ||
          !call_init(&cb, kb, in0, in1, &out_blas, &attrs)) {
        fprintf(stderr, "bench_conv_kernels: %s: no usable reference and blas kernels\n", ops[p]);
        rc = 1;
        break;
      }
      const double tr = time_call(&cr, seconds), tb = time_call(&cb, seconds);
      if (tr < 0 || tb < 0) {
        fprintf(stderr, "bench_conv_kernels: %s run() failed\n", ops[p]);
        rc = 1;
      } else {
        printf("%-20s %-11s %12.2f %12.2f %7.1fx %9.1e\n", sh->name, ops[p] + 7,
               flops / tr * 1e-9, flops / tb * 1e-9, tr / tb, norm_err(&out_blas, &out_ref));
        fflush(stdout);
      }
      free(cr.ws), free(cb.ws), free(out_ref.p), free(out_blas.p);
    }
    free(x.p), free(w.p), free(y.p);
  }
  bp_registry_destroy(r);
  bp_threads_destroy(pool);
  return rc;
}
