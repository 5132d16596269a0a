/* The yardstick of a profile: the FP32 matrix-product rate of the best
 * fc.fwd kernel on this machine (profile.h: bp_profile_sgemm_measure). A
 * node's GFLOP/s is read against it: near 1 means the node runs as fast as
 * a large square product can. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/profile.h"
#include "profile-impl.h"
#include "validate-impl.h"

#define SGEMM_MIN_RUNS 3
#define SGEMM_BUDGET_NS UINT64_C(250000000) /* stop timing after 0.25 s of runs */

typedef struct sgemm_bench {
  bp_abi_tensor in[2], out[1];
  void *in_ptr[2], *out_ptr[1];
  bp_fc_attrs attrs;
  uint64_t generation;
  char reason[1024];
  bp_abi_kernel_args args;
} sgemm_bench;

/* x [n,1,1,n] times w [n,1,1,n]^T into y [n,1,1,n], no bias. */
static int bench_open(sgemm_bench *b, int64_t n, const bp_abi_threads *threads) {
  memset(b, 0, sizeof *b);
  b->in[0] = vc_tensor_desc(BP_DTYPE_FP32, n, 1, 1, n, n);
  b->in[1] = vc_tensor_desc(BP_DTYPE_FP32, n, 1, 1, n, n);
  b->out[0] = vc_tensor_desc(BP_DTYPE_FP32, n, 1, 1, n, n);
  for (int i = 0; i < 3; i++) {
    const bp_abi_tensor *t = i < 2 ? &b->in[i] : &b->out[0];
    void **p = i < 2 ? &b->in_ptr[i] : &b->out_ptr[0];
    if (t->slot_bytes == 0 || posix_memalign(p, 256, (size_t)t->slot_bytes) != 0) {
      *p = NULL;
      return -1;
    }
    /* small exact values: no denormals, no overflow */
    float *f = *p;
    for (uint64_t e = 0; e < t->slot_bytes / sizeof *f; e++) f[e] = (float)(e % 7) / 64.0f;
  }
  b->attrs = (bp_fc_attrs){.has_bias = 0};
  b->generation = 1;
  bp_abi_kernel_args *a = &b->args;
  a->struct_size = sizeof *a;
  a->num_inputs = 2;
  a->num_outputs = 1;
  a->inputs = b->in;
  a->outputs = b->out;
  a->input_ptrs = (const void *const *)b->in_ptr;
  a->output_ptrs = b->out_ptr;
  a->attrs = &b->attrs;
  a->attr_size = sizeof b->attrs;
  a->attr_version = BP_ABI_ATTR_VERSION;
  a->world_size = 1;
  a->params_generation = &b->generation;
  a->reason = b->reason;
  a->reason_size = sizeof b->reason;
  a->threads = threads;
  return 0;
}

static void bench_close(sgemm_bench *b) {
  free(b->in_ptr[0]);
  free(b->in_ptr[1]);
  free(b->out_ptr[0]);
  free(b->args.workspace);
}

static int by_ns(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

void bp_profile_sgemm_rates(bp_profile_sgemm *s, uint64_t *ns, int count) {
  qsort(ns, (size_t)count, sizeof *ns, by_ns);
  const double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
  const uint64_t best = ns[0], median = ns[count / 2];
  s->runs = count;
  s->best_seconds = (double)best / 1e9;
  s->gflops = flops / (double)best;
  s->median_gflops = flops / (double)median;
}

/* Runs the kernel: one warm-up, then SGEMM_MIN_RUNS.. runs within the
 * budget, their times in out->run_ns and their count in out->runs. 0, or
 * -1 with out->why set. */
static int bench_time(sgemm_bench *b, const bp_registered_kernel *k, bp_profile_sgemm *out) {
  const bp_abi_kernel *kk = &k->kernel;
  if (kk->workspace_size) {
    bp_abi_kernel_args meta = b->args;
    meta.input_ptrs = NULL;
    meta.output_ptrs = NULL;
    meta.params_generation = NULL;
    meta.reason = NULL;
    meta.reason_size = 0;
    const uint64_t need = kk->workspace_size(kk->user, &meta);
    if (need && posix_memalign(&b->args.workspace, 256, (size_t)need) != 0) {
      b->args.workspace = NULL;
      snprintf(out->why, sizeof out->why, "out of memory for a workspace of %llu bytes",
               (unsigned long long)need);
      return -1;
    }
    b->args.workspace_bytes = need;
  }
  void *state = NULL;
  if (kk->prepare && kk->prepare(kk->user, &b->args, &state) != BP_ABI_OK) {
    snprintf(out->why, sizeof out->why, "prepare() of fc.fwd/%.32s failed: %.160s", kk->impl,
             b->reason[0] ? b->reason : "no reason given");
    if (state && kk->release) kk->release(kk->user, state);
    return -1;
  }
  b->args.state = state;
  int rc = kk->run(kk->user, &b->args); /* warm-up: packing, page faults */
  uint64_t spent = 0;
  for (int r = 0; rc == BP_ABI_OK && r < BP_PROFILE_SGEMM_MAX_RUNS &&
                  (r < SGEMM_MIN_RUNS || spent < SGEMM_BUDGET_NS);
       r++) {
    const uint64_t t0 = bp_profile_now_ns();
    rc = kk->run(kk->user, &b->args);
    const uint64_t ns = bp_profile_now_ns() - t0;
    spent += ns;
    out->run_ns[r] = ns;
    out->runs = r + 1;
  }
  if (state && kk->release) kk->release(kk->user, state);
  if (rc != BP_ABI_OK) {
    snprintf(out->why, sizeof out->why, "run() of fc.fwd/%.32s failed: %.160s", kk->impl,
             b->reason[0] ? b->reason : "no reason given");
    return -1;
  }
  return 0;
}

void bp_profile_sgemm_measure(bp_registry *registry, const char *device,
                              const bp_abi_threads *threads, int64_t n, bp_profile_sgemm *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  out->m = out->n = out->k = n;
  out->threads = threads ? threads->count : 1;
  if (!registry || !device || !threads || n <= 0) {
    snprintf(out->why, sizeof out->why, "not measured");
    return;
  }
  if (strcmp(device, "cpu") != 0) { /* its buffers are host memory */
    snprintf(out->why, sizeof out->why, "not measured on the '%s' device (host kernels only)",
             device);
    return;
  }
  sgemm_bench *b = calloc(1, sizeof *b);
  if (!b || bench_open(b, n, threads) != 0) {
    snprintf(out->why, sizeof out->why, "out of memory for a %lld x %lld product", (long long)n,
             (long long)n);
    if (b) bench_close(b);
    free(b);
    return;
  }
  bp_select_options so;
  memset(&so, 0, sizeof so);
  so.pins = ""; /* the registry's own pick, whatever the run pins */
  so.node = "profile sgemm";
  const bp_registered_kernel *k = NULL;
  if (bp_registry_select(registry, "fc.fwd", device, &b->args, &so, &k) != BP_OK) {
    snprintf(out->why, sizeof out->why, "no fc.fwd kernel: %.200s", bp_last_error());
  } else if (bench_time(b, k, out) == 0) {
    out->measured = 1;
    out->measurements = 1;
    out->impl = k->kernel.impl;
    bp_profile_sgemm_rates(out, out->run_ns, out->runs);
    out->why[0] = '\0';
  }
  bench_close(b);
  free(b);
}
