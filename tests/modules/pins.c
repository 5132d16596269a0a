/* fc.fwd kernels for the checks of issue 31 that are not autotune's
 * timing (tests/test_validate_pins.c). Built twice:
 *   TM_SLOW (pins/slow.so): fc.fwd/slow, right but slow (it computes every
 *     row SLOW_REPEAT times, as a kernel that never blocks for the cache
 *     might), at BP_ABI_PRIORITY_USER: plain selection prefers it to every
 *     in-tree kernel, and the kernel table must say how much slower it is
 *   else (pins/threads4.so), at BP_ABI_PRIORITY_PORTABLE:
 *     fc.fwd/wide4    rows split over the threads as ceil(N / threads) per
 *                     chunk up to 3 threads, and as N / threads from 4 on (a
 *                     "wide machine" path that forgets the remainder): wrong
 *                     only with 4 or more threads, which check 11 runs at
 *                     whatever the machine's cores
 *     fc.fwd/wide4ok  the fixed twin: ceil(N / threads) at every count
 *
 *   x  [N, H, W, C]  read as [N, F], F = H*W*C
 *   w  [O, 1, 1, F]
 *   b  [1, 1, 1, O]  (has_bias)
 *   y  [N, 1, 1, O]  y[n,o] = b[o] + sum_f x[n,f] * w[o,f] */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "test_module.h"

#define SLOW_REPEAT 8

enum { V_SLOW, V_WIDE4, V_WIDE4OK };
static const int variants[] = {V_SLOW, V_WIDE4, V_WIDE4OK};

static int has_bias(const bp_abi_kernel_args *a) {
  bp_fc_attrs at = {0, 0};
  if (a->attrs && a->attr_size >= sizeof at) memcpy(&at, a->attrs, sizeof at);
  return at.has_bias != 0;
}

static int fc_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  if (a->num_inputs != 2 + has_bias(a) || a->num_outputs != 1) {
    snprintf(reason, size, "wants x, w [, b] and y");
    return 0;
  }
  const bp_abi_tensor *x = &a->inputs[0], *w = &a->inputs[1], *y = &a->outputs[0];
  if (w->shape[0] != y->shape[3] || w->shape[3] != x->shape[1] * x->shape[2] * x->shape[3] ||
      y->shape[0] != x->shape[0]) {
    snprintf(reason, size, "shapes do not fit");
    return 0;
  }
  return 1;
}

/* Element i (logical NHWC order) of FP32 tensor t at p. */
static float get(const bp_abi_tensor *t, const void *p, int64_t i) {
  const int64_t c = i % t->shape[3], w = i / t->shape[3] % t->shape[2];
  const int64_t h = i / (t->shape[3] * t->shape[2]) % t->shape[1];
  const int64_t n = i / (t->shape[3] * t->shape[2] * t->shape[1]);
  return ((const float *)p)[bp_sdk_offset(t, n, h, w, c)];
}

static void row(const bp_abi_kernel_args *a, int64_t n) {
  const bp_abi_tensor *x = &a->inputs[0], *w = &a->inputs[1], *y = &a->outputs[0];
  const int64_t f_count = w->shape[3], o_count = y->shape[3];
  for (int64_t o = 0; o < o_count; o++) {
    double s = has_bias(a) ? get(&a->inputs[2], a->input_ptrs[2], o) : 0.0;
    for (int64_t f = 0; f < f_count; f++)
      s += (double)get(x, a->input_ptrs[0], n * f_count + f) *
           get(w, a->input_ptrs[1], o * f_count + f);
    ((float *)a->output_ptrs[0])[bp_sdk_offset(y, n, 0, 0, o)] = (float)s;
  }
}

typedef struct chunk_job {
  const bp_abi_kernel_args *a;
  int64_t per; /* rows per chunk */
} chunk_job;

static void chunk(void *arg, int64_t i) {
  const chunk_job *j = arg;
  const int64_t rows = j->a->outputs[0].shape[0];
  for (int64_t n = i * j->per; n < (i + 1) * j->per && n < rows; n++) row(j->a, n);
}

static int fc_run(void *user, const bp_abi_kernel_args *a) {
  const int v = *(const int *)user;
  const int64_t rows = a->outputs[0].shape[0];
  if (v == V_SLOW) {
    for (int r = 0; r < SLOW_REPEAT; r++)
      for (int64_t n = 0; n < rows; n++) row(a, n);
    return BP_ABI_OK;
  }
  const int64_t threads = bp_sdk_args_thread_count(a);
  chunk_job j = {a, v == V_WIDE4 && threads >= 4 ? rows / threads
                                                 : (rows + threads - 1) / threads};
  bp_sdk_parallel_for(a, chunk, &j, threads);
  return BP_ABI_OK;
}

#define FC(impl_name, v, prio)                                                                 \
  {                                                                                            \
    .struct_size = sizeof(bp_abi_kernel), .op = "fc.fwd", .impl = impl_name, .device = "cpu",  \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = prio,                           \
    .user = (void *)&variants[v], .supports = fc_supports, .run = fc_run                       \
  }

#ifdef TM_SLOW
static const bp_abi_kernel kernels[] = {FC("slow", V_SLOW, BP_ABI_PRIORITY_USER)};
#define TM_NAME "test-pins-slow"
#else
static const bp_abi_kernel kernels[] = {FC("wide4", V_WIDE4, BP_ABI_PRIORITY_PORTABLE),
                                        FC("wide4ok", V_WIDE4OK, BP_ABI_PRIORITY_PORTABLE)};
#define TM_NAME "test-pins-threads4"
#endif

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE(TM_NAME, init)
