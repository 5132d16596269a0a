/* fc.fwd kernels for autotune over whole steps (issue 31, item 1): timed
 * alone, the lower-priority kernel beats the default one; inside training
 * steps it may not. All are right (plain FP32 math, any NHWC layout);
 * only their speed differs.
 *   fc.fwd/plain     priority BP_ABI_PRIORITY_USER, so the default: the
 *                    product, then a busy wait of PLAIN_WAIT_US
 *   fc.fwd/stepslow  (TM_SECOND 1) priority USER - 1: the product, and a
 *                    sleep of REPACK_US whenever the parameter generation
 *                    moved since its last run, as a kernel that repacks its
 *                    weights would. Timed alone the generation stands
 *                    still, so it looks fastest; every training step moves
 *                    it, so in steps it is the slowest: autotune over whole
 *                    steps must keep plain
 *   fc.fwd/quick     (TM_SECOND 2) priority USER - 1: the product only,
 *                    faster than plain alone and in steps: kept
 *
 *   x  [N, H, W, C]  read as [N, F], F = H*W*C
 *   w  [O, 1, 1, F]
 *   b  [1, 1, 1, O]  (has_bias)
 *   y  [N, 1, 1, O]  y[n,o] = b[o] + sum_f x[n,f] * w[o,f] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "test_module.h"

#ifndef TM_SECOND
#define TM_SECOND 1
#endif
#define PLAIN_WAIT_US 20000
#define REPACK_US 100000

enum { K_PLAIN, K_STEPSLOW, K_QUICK };
static const int kinds[] = {K_PLAIN, K_STEPSLOW, K_QUICK};

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

static void product(const bp_abi_kernel_args *a) {
  const bp_abi_tensor *x = &a->inputs[0], *w = &a->inputs[1], *y = &a->outputs[0];
  const int64_t f_count = w->shape[3], o_count = y->shape[3];
  for (int64_t n = 0; n < y->shape[0]; n++)
    for (int64_t o = 0; o < o_count; o++) {
      double s = has_bias(a) ? get(&a->inputs[2], a->input_ptrs[2], o) : 0.0;
      for (int64_t f = 0; f < f_count; f++)
        s += (double)get(x, a->input_ptrs[0], n * f_count + f) *
             get(w, a->input_ptrs[1], o * f_count + f);
      ((float *)a->output_ptrs[0])[bp_sdk_offset(y, n, 0, 0, o)] = (float)s;
    }
}

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* stepslow's state: the generation of its last run. */
typedef struct seen {
  int valid;
  uint64_t generation;
} seen;

static int prepare(void *user, const bp_abi_kernel_args *a, void **state) {
  (void)user, (void)a;
  *state = calloc(1, sizeof(seen));
  return *state ? BP_ABI_OK : BP_ABI_ERR_NOMEM;
}

static void release(void *user, void *state) {
  (void)user;
  free(state);
}

static int fc_run(void *user, const bp_abi_kernel_args *a) {
  const int k = *(const int *)user;
  if (k == K_STEPSLOW) {
    seen *s = bp_sdk_args_state(a);
    if (!s) return BP_ABI_ERR_INVALID;
    const uint64_t gen = bp_sdk_args_generation(a);
    if (!s->valid || s->generation != gen) { /* the "repack" */
      const struct timespec nap = {0, REPACK_US * 1000L};
      nanosleep(&nap, NULL);
      s->valid = 1;
      s->generation = gen;
    }
  }
  product(a);
  if (k == K_PLAIN)
    for (const uint64_t t0 = now_us(); now_us() - t0 < PLAIN_WAIT_US;) {
    }
  return BP_ABI_OK;
}

#define FC(impl_name, k, prio, prep)                                                           \
  {                                                                                            \
    .struct_size = sizeof(bp_abi_kernel), .op = "fc.fwd", .impl = impl_name, .device = "cpu",  \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = (prio),                         \
    .user = (void *)&kinds[k], .supports = fc_supports, .run = fc_run,                         \
    .prepare = (prep) ? prepare : NULL, .release = (prep) ? release : NULL                     \
  }

static const bp_abi_kernel kernels[] = {
    FC("plain", K_PLAIN, BP_ABI_PRIORITY_USER, 0),
#if TM_SECOND == 1
    FC("stepslow", K_STEPSLOW, BP_ABI_PRIORITY_USER - 1, 1),
#else
    FC("quick", K_QUICK, BP_ABI_PRIORITY_USER - 1, 0),
#endif
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-stepslow", init)
