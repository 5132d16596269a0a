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

#include "bench_util.h"
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

#define F32 BP_ABI_DTYPE_FP32

/* Seconds of one call of n with new parameters (as in training); < 0 when
 * it fails. */
static double call(bench_node *n) {
  n->generation++;
  return bench_node_call(n);
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
  if (!bench_discover("bench_winograd", &r, &pool)) return 1;
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
    bench_buf x, w, y, out[2];
    if (!bench_buf_new(&x, F32, batch, l->hw, l->hw, l->c, &rng) ||
        !bench_buf_new(&w, F32, l->k, 3, 3, l->c, &rng) ||
        !bench_buf_new(&y, F32, batch, l->hw, l->hw, l->k, &rng))
      return 1;
    for (int p = 0; p < 3 && rc == 0; p++) {
      /* fwd: x, w -> y;  bwd_data: dy, w -> dx;  bwd_filter: x, dy -> dw */
      const bench_buf in[2] = {p == 1 ? y : x, p == 2 ? y : w};
      const int64_t on = p == 2 ? l->k : batch, ohw = p == 2 ? 3 : l->hw;
      const int64_t oc = p == 0 ? l->k : l->c;
      bench_node n[2];
      const char *names[2] = {impl_a, impl_b};
      double best[2] = {INFINITY, INFINITY};
      int ok = 1;
      for (int i = 0; i < 2; i++) {
        const bp_abi_kernel *k = bench_find_kernel(r, ops[p], names[i]);
        if (!bench_buf_new(&out[i], F32, on, ohw, ohw, oc, &rng)) return 1;
        if (ok && (!k || !bench_node_open(&n[i], k, in, 2, &out[i], 1, &attrs, sizeof attrs,
                                          threads) ||
                   call(&n[i]) < 0)) {
          fprintf(stderr, "bench_winograd: %s for %s unavailable (%s)\n", names[i], ops[p],
                  k ? n[i].reason : "not loaded");
          if (i == 1) bench_node_close(&n[0]);
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
          const double t = call(&n[i]);
          if (t < 0) bench_node_report(&n[i], "bench_winograd"), rc = 1;
          if (t < best[i]) best[i] = t;
        }
      printf("%-20s %-9s %10.3f %10.3f %8.2f %9.2e\n", l->name, ops[p] + 7, best[0] * 1e3,
             best[1] * 1e3, best[0] / best[1], bench_norm_err(&out[1], &out[0]));
      fflush(stdout);
      for (int i = 0; i < 2; i++) {
        bench_node_close(&n[i]);
        free(out[i].p);
      }
    }
    free(x.p), free(w.p), free(y.p);
  }
  bp_threads_destroy(pool);
  bp_registry_destroy(r);
  return rc;
}
