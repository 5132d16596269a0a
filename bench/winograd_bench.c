/* bench_winograd: ops/winograd beside ops/onednn on the CNN's 3x3
 * convolutions (models/cnn.yaml conv1..conv4, batch 128 by default),
 * forward, backward-data and backward-filter, FP32.
 *
 *   bench_winograd [--batch N] [--reps R] [--impls A,B]
 *
 * Every module is loaded as `blueprint plugins` finds them. Per (layer,
 * pass) each implementation gets a prepared node (prepare(), a parameter
 * generation that moves before every call, as in training), one warm-up
 * call, then R rounds (default 30) in which the implementations run one
 * call each in turn, so load from other processes hits them alike. Printed:
 * each one's minimum milliseconds per call over the rounds (the least
 * disturbed call on a shared machine), the ratio of the minimums (above 1:
 * the first is slower), and max|B - A| / max(1, max|A|) of the outputs.
 * A pass either implementation refuses prints "-" (the reason on stderr).
 * Threads: one rank's, as in training (every core, or BP_THREADS). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

typedef struct layer {
  const char *name;
  int64_t hw, c, k;
} layer;

static const layer layers[] = {
    {"conv1 28x28 1->32", 28, 1, 32},
    {"conv2 28x28 32->32", 28, 32, 32},
    {"conv3 14x14 32->64", 14, 32, 64},
    {"conv4 14x14 64->64", 14, 64, 64},
};

typedef struct buf {
  bp_abi_tensor d;
  float *p;
} buf;

static int buf_new(buf *b, int64_t n, int64_t h, int64_t w, int64_t c, uint64_t *rng) {
  memset(b, 0, sizeof *b);
  b->d.struct_size = sizeof b->d;
  b->d.dtype = BP_ABI_DTYPE_FP32;
  b->d.shape[0] = n, b->d.shape[1] = h, b->d.shape[2] = w, b->d.shape[3] = c;
  b->d.padded_c = c;
  b->d.stride[3] = 1, b->d.stride[2] = c, b->d.stride[1] = w * c, b->d.stride[0] = h * w * c;
  b->d.slot_bytes = (uint64_t)(n * h * w * c) * sizeof(float) + 16;
  if (posix_memalign((void **)&b->p, 256, (size_t)b->d.slot_bytes) != 0) return 0;
  for (int64_t i = 0; i < n * h * w * c; i++) {
    *rng = *rng * 6364136223846793005u + 1442695040888963407u;
    b->p[i] = (float)((double)(*rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One prepared node of an implementation. */
typedef struct node {
  const bp_abi_kernel *k;
  bp_abi_tensor in[2], out[1];
  const void *in_ptrs[2];
  void *out_ptrs[1];
  bp_abi_kernel_args args;
  void *state, *ws;
  uint64_t generation;
  char reason[256];
} node;

static const bp_abi_kernel *find_kernel(const bp_registry *r, const char *op, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0 && strcmp(k->device, "cpu") == 0)
      return k;
  }
  return NULL;
}

static int node_open(node *n, const bp_abi_kernel *k, const buf *in0, const buf *in1, buf *out,
                     const bp_conv2d_attrs *attrs, const bp_abi_threads *threads) {
  memset(n, 0, sizeof *n);
  n->k = k;
  n->in[0] = in0->d, n->in[1] = in1->d, n->out[0] = out->d;
  n->args.struct_size = sizeof n->args;
  n->args.num_inputs = 2, n->args.num_outputs = 1;
  n->args.inputs = n->in, n->args.outputs = n->out;
  n->args.attrs = attrs, n->args.attr_size = sizeof *attrs;
  n->args.attr_version = BP_ABI_ATTR_VERSION;
  n->args.world_size = 1;
  if (k->supports && !k->supports(k->user, &n->args, n->reason, sizeof n->reason)) {
    fprintf(stderr, "%s/%s refuses: %s\n", k->op, k->impl, n->reason);
    return 0;
  }
  const uint64_t need = k->workspace_size ? k->workspace_size(k->user, &n->args) : 0;
  if (need > 0) {
    if (posix_memalign(&n->ws, 256, (size_t)need) != 0) return 0;
    n->args.workspace = n->ws, n->args.workspace_bytes = need;
  }
  n->in_ptrs[0] = in0->p, n->in_ptrs[1] = in1->p, n->out_ptrs[0] = out->p;
  n->args.input_ptrs = n->in_ptrs, n->args.output_ptrs = n->out_ptrs;
  n->args.threads = threads;
  n->generation = 1;
  n->args.params_generation = &n->generation;
  n->args.reason = n->reason, n->args.reason_size = sizeof n->reason;
  if (k->prepare && k->prepare(k->user, &n->args, &n->state) != BP_ABI_OK) {
    fprintf(stderr, "%s/%s prepare: %s\n", k->op, k->impl, n->reason);
    return 0;
  }
  n->args.state = n->state;
  return 1;
}

/* Seconds of one call; < 0 when it fails. */
static double node_call(node *n) {
  n->generation++;
  const double t0 = now_s();
  if (n->k->run(n->k->user, &n->args) != BP_ABI_OK) {
    fprintf(stderr, "%s/%s run: %s\n", n->k->op, n->k->impl, n->reason);
    return -1;
  }
  return now_s() - t0;
}

static void node_close(node *n) {
  if (n->state && n->k->release) n->k->release(n->k->user, n->state);
  free(n->ws);
}

static double norm_err(const buf *a, const buf *b, int64_t count) {
  double diff = 0.0, scale = 1.0;
  for (int64_t i = 0; i < count; i++) {
    const double d = fabs((double)a->p[i] - b->p[i]);
    if (!(d <= diff)) diff = d;
    if (fabs(a->p[i]) > scale) scale = fabs(a->p[i]);
  }
  return diff / scale;
}

int main(int argc, char **argv) {
  int64_t batch = 128;
  int reps = 30;
  char impl_a[32] = "onednn", impl_b[32] = "winograd";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoll(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--impls") == 0 && i + 1 < argc &&
             sscanf(argv[++i], "%31[^,],%31s", impl_a, impl_b) == 2) {
    } else {
      fprintf(stderr, "usage: bench_winograd [--batch N] [--reps R] [--impls A,B]\n");
      return 2;
    }
  }
  if (batch < 1 || reps < 1) return 2;
  bp_registry *r = NULL;
  bp_threads *pool = NULL;
  if (bp_registry_create(&r) != BP_OK || bp_registry_discover(r, NULL, 0) != BP_OK ||
      bp_threads_create(bp_threads_share(1), &pool) != BP_OK) {
    fprintf(stderr, "bench_winograd: %s\n", bp_last_error());
    bp_registry_destroy(r);
    return 1;
  }
  const bp_abi_threads *threads = bp_threads_abi(pool);
  printf("conv2d 3x3 s1 p1, batch %lld, FP32, min ms per call over %d alternating rounds; "
         "threads: %d\n",
         (long long)batch, reps, threads->count);
  printf("%-20s %-9s %10s %10s %8s %9s\n", "layer", "pass", impl_a, impl_b, "ratio", "norm err");
  static const char *const ops[] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter"};
  const bp_conv2d_attrs attrs = {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  uint64_t rng = 42;
  int rc = 0;
  for (size_t li = 0; li < sizeof layers / sizeof layers[0] && rc == 0; li++) {
    const layer *l = &layers[li];
    buf x, w, y, out[2];
    if (!buf_new(&x, batch, l->hw, l->hw, l->c, &rng) || !buf_new(&w, l->k, 3, 3, l->c, &rng) ||
        !buf_new(&y, batch, l->hw, l->hw, l->k, &rng))
      return 1;
    for (int p = 0; p < 3 && rc == 0; p++) {
      /* fwd: x, w -> y;  bwd_data: dy, w -> dx;  bwd_filter: x, dy -> dw */
      const buf *in0 = p == 1 ? &y : &x, *in1 = p == 2 ? &y : &w;
      const int64_t on = p == 2 ? l->k : batch, ohw = p == 2 ? 3 : l->hw;
      const int64_t oc = p == 0 ? l->k : l->c;
      node n[2];
      const char *names[2] = {impl_a, impl_b};
      double best[2] = {INFINITY, INFINITY};
      int ok = 1;
      for (int i = 0; i < 2; i++) {
        const bp_abi_kernel *k = find_kernel(r, ops[p], names[i]);
        if (!buf_new(&out[i], on, ohw, ohw, oc, &rng)) return 1;
        if (ok && (!k || !node_open(&n[i], k, in0, in1, &out[i], &attrs, threads) ||
                   node_call(&n[i]) < 0)) {
          fprintf(stderr, "bench_winograd: %s for %s unavailable (%s)\n", names[i], ops[p],
                  k ? n[i].reason : "not loaded");
          if (i == 1) node_close(&n[0]);
          ok = 0;
        }
      }
      if (!ok) {
        printf("%-20s %-9s %10s %10s\n", l->name, ops[p] + 7, "-", "-");
        free(out[0].p), free(out[1].p);
        continue;
      }
      for (int round = 0; round < reps && rc == 0; round++)
        for (int i = 0; i < 2; i++) {
          const double t = node_call(&n[i]);
          if (t < 0) rc = 1;
          if (t < best[i]) best[i] = t;
        }
      printf("%-20s %-9s %10.3f %10.3f %8.2f %9.2e\n", l->name, ops[p] + 7, best[0] * 1e3,
             best[1] * 1e3, best[0] / best[1], norm_err(&out[0], &out[1], on * ohw * ohw * oc));
      fflush(stdout);
      for (int i = 0; i < 2; i++) {
        node_close(&n[i]);
        free(out[i].p);
      }
    }
    free(x.p), free(w.p), free(y.p);
  }
  bp_threads_destroy(pool);
  bp_registry_destroy(r);
  return rc;
}
