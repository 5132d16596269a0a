/* Held-out fc.fwd defects of issue 31 ("tuning you can trust"), each right
 * on most of validate's old cases and wrong where a user's run would show
 * it, each beside a fixed twin that must pass every case:
 *   fc.fwd/stale      caches y keyed on (x's pointer, params_generation): right
 *                     in every fresh run and every training step, stale when x's
 *                     data change while the parameters do not (evaluation,
 *                     predict); caught by validate's check 10
 *   fc.fwd/nogen      packs w once and never again: stale after a
 *                     params_generation bump (check 10)
 *   fc.fwd/packed     the fixed twin of both: packs w (transposed) in its state,
 *                     keyed on params_generation, and computes y on every run
 *   fc.fwd/tail8      wrong only when N > 8 and N % 8 != 0: the rows after the
 *                     last full block of 8 read the previous row's x
 *   fc.fwd/chunks     rows split over the threads as N / threads per chunk, so
 *                     with 2 or more threads the last N % threads rows are never
 *                     written (check 11 runs every case at 1 to 4 threads)
 *   fc.fwd/chunked    the fixed twin of both: ceil(N / threads) rows per chunk
 *   fc.fwd/trunc7     FP16: x and w truncated to 7 mantissa bits (as a bf16
 *                     conversion by truncation) before FP32 math; caught by the
 *                     FP16 tolerance of fc
 *   fc.fwd/half       FP16, the fixed twin: FP32 math on the FP16 values, y
 *                     rounded to nearest once
 * Device "cpu", priority BP_ABI_PRIORITY_USER (plain selection would prefer
 * them). Tensors in any NHWC layout the plan makes (bp_sdk_offset).
 *
 *   x  [N, H, W, C]  read as [N, F], F = H*W*C
 *   w  [O, 1, 1, F]
 *   b  [1, 1, 1, O]  (has_bias)
 *   y  [N, 1, 1, O]  y[n,o] = b[o] + sum_f x[n,f] * w[o,f] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "test_module.h"

typedef enum variant {
  V_STALE,
  V_NOGEN,
  V_PACKED,
  V_TAIL8,
  V_CHUNKS,
  V_CHUNKED,
  V_TRUNC7,
  V_HALF,
  V_COUNT
} variant;

static const int variants[V_COUNT] = {V_STALE, V_NOGEN,   V_PACKED, V_TAIL8,
                                      V_CHUNKS, V_CHUNKED, V_TRUNC7, V_HALF};

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

/* Element i (logical NHWC order) of tensor t at p, as float. */
static float get(const bp_abi_tensor *t, const void *p, int64_t i) {
  const int64_t c = i % t->shape[3], w = i / t->shape[3] % t->shape[2];
  const int64_t h = i / (t->shape[3] * t->shape[2]) % t->shape[1];
  const int64_t n = i / (t->shape[3] * t->shape[2] * t->shape[1]);
  const uint64_t at = bp_sdk_offset(t, n, h, w, c);
  if (t->dtype == BP_ABI_DTYPE_FP16) return bp_sdk_fp16_to_fp32(((const uint16_t *)p)[at]);
  return ((const float *)p)[at];
}

/* x or w as trunc7 reads it: 7 mantissa bits, the rest cut off. */
static float trunc7(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  bits &= 0xffff0000u;
  memcpy(&v, &bits, 4);
  return v;
}

static void put(const bp_abi_tensor *y, void *p, int64_t n, int64_t o, double v) {
  const uint64_t at = bp_sdk_offset(y, n, 0, 0, o);
  if (y->dtype == BP_ABI_DTYPE_FP16) ((uint16_t *)p)[at] = bp_sdk_fp32_to_fp16((float)v);
  else ((float *)p)[at] = (float)v;
}

/* y[n, o] for o in [0, O): from x row xn, w (or its transpose wt [F, O]). */
static void row(const bp_abi_kernel_args *a, int64_t n, int64_t xn, const float *wt, int cut) {
  const bp_abi_tensor *x = &a->inputs[0], *w = &a->inputs[1], *y = &a->outputs[0];
  const int64_t f_count = w->shape[3], o_count = y->shape[3];
  for (int64_t o = 0; o < o_count; o++) {
    double s = has_bias(a) ? get(&a->inputs[2], a->input_ptrs[2], o) : 0.0;
    for (int64_t f = 0; f < f_count; f++) {
      float xv = get(x, a->input_ptrs[0], xn * f_count + f);
      float wv = wt ? wt[f * o_count + o] : get(w, a->input_ptrs[1], o * f_count + f);
      if (cut) {
        xv = trunc7(xv);
        wv = trunc7(wv);
      }
      s += (double)xv * wv;
    }
    put(y, a->output_ptrs[0], n, o, s);
  }
}

/* ---- state: the cached y (stale), the packed w (nogen, packed) ------------------- */

typedef struct cache {
  int valid;
  const void *x;       /* stale: the x it cached y for */
  uint64_t generation; /* the generation it cached or packed at */
  float *data;         /* stale: y [N * O]; nogen, packed: w transposed [F * O] */
} cache;

static int prepare(void *user, const bp_abi_kernel_args *a, void **state) {
  const int v = *(const int *)user;
  const int64_t o = a->outputs[0].shape[3];
  const int64_t count = v == V_STALE ? a->outputs[0].shape[0] * o : a->inputs[1].shape[3] * o;
  cache *c = calloc(1, sizeof *c);
  if (!c || !(c->data = malloc((size_t)(count > 0 ? count : 1) * sizeof(float)))) {
    free(c);
    return BP_ABI_ERR_NOMEM;
  }
  *state = c;
  return BP_ABI_OK;
}

static void release(void *user, void *state) {
  (void)user;
  cache *c = state;
  if (c) free(c->data);
  free(c);
}

/* ---- chunks over the threads --------------------------------------------------- */

typedef struct chunk_job {
  const bp_abi_kernel_args *a;
  int64_t per; /* rows per chunk */
} chunk_job;

static void chunk(void *arg, int64_t i) {
  const chunk_job *j = arg;
  const int64_t rows = j->a->outputs[0].shape[0];
  for (int64_t n = i * j->per; n < (i + 1) * j->per && n < rows; n++) row(j->a, n, n, NULL, 0);
}

static int fc_run(void *user, const bp_abi_kernel_args *a) {
  const int v = *(const int *)user;
  const int64_t rows = a->outputs[0].shape[0], o_count = a->outputs[0].shape[3];
  const int64_t f_count = a->inputs[1].shape[3];
  const uint64_t gen = bp_sdk_args_generation(a);
  cache *c = bp_sdk_args_state(a);
  if ((v == V_STALE || v == V_NOGEN || v == V_PACKED) && !c) return BP_ABI_ERR_INVALID;
  if (v == V_STALE) { /* the defect: the generation says nothing about x's data */
    if (c->valid && c->x == a->input_ptrs[0] && c->generation == gen && gen != 0) {
      for (int64_t n = 0; n < rows; n++)
        for (int64_t o = 0; o < o_count; o++)
          put(&a->outputs[0], a->output_ptrs[0], n, o, c->data[n * o_count + o]);
      return BP_ABI_OK;
    }
    for (int64_t n = 0; n < rows; n++) row(a, n, n, NULL, 0);
    for (int64_t n = 0; n < rows; n++)
      for (int64_t o = 0; o < o_count; o++)
        c->data[n * o_count + o] = get(&a->outputs[0], a->output_ptrs[0], n * o_count + o);
    c->valid = 1;
    c->x = a->input_ptrs[0];
    c->generation = gen;
    return BP_ABI_OK;
  }
  if (v == V_NOGEN || v == V_PACKED) {
    const int repack = !c->valid || (v == V_PACKED && (c->generation != gen || gen == 0));
    if (repack) {
      for (int64_t o = 0; o < o_count; o++)
        for (int64_t f = 0; f < f_count; f++)
          c->data[f * o_count + o] = get(&a->inputs[1], a->input_ptrs[1], o * f_count + f);
      c->valid = 1;
      c->generation = gen;
    }
    for (int64_t n = 0; n < rows; n++) row(a, n, n, c->data, 0);
    return BP_ABI_OK;
  }
  if (v == V_CHUNKS || v == V_CHUNKED) {
    const int64_t threads = bp_sdk_args_thread_count(a);
    chunk_job j = {a, v == V_CHUNKS ? rows / threads : (rows + threads - 1) / threads};
    bp_sdk_parallel_for(a, chunk, &j, threads);
    return BP_ABI_OK;
  }
  for (int64_t n = 0; n < rows; n++) {
    const int tail = v == V_TAIL8 && rows > 8 && rows % 8 != 0 && n >= rows / 8 * 8;
    row(a, n, tail ? n - 1 : n, NULL, v == V_TRUNC7);
  }
  return BP_ABI_OK;
}

#define FC(impl_name, v, dtype, prep)                                                          \
  {                                                                                            \
    .struct_size = sizeof(bp_abi_kernel), .op = "fc.fwd", .impl = impl_name, .device = "cpu",  \
    .dtypes = BP_ABI_DTYPE_BIT(dtype), .priority = BP_ABI_PRIORITY_USER,                       \
    .user = (void *)&variants[v], .supports = fc_supports, .run = fc_run,                      \
    .prepare = (prep) ? prepare : NULL, .release = (prep) ? release : NULL                     \
  }

static const bp_abi_kernel kernels[] = {
    FC("stale", V_STALE, BP_ABI_DTYPE_FP32, 1),   FC("nogen", V_NOGEN, BP_ABI_DTYPE_FP32, 1),
    FC("packed", V_PACKED, BP_ABI_DTYPE_FP32, 1), FC("tail8", V_TAIL8, BP_ABI_DTYPE_FP32, 0),
    FC("chunks", V_CHUNKS, BP_ABI_DTYPE_FP32, 0), FC("chunked", V_CHUNKED, BP_ABI_DTYPE_FP32, 0),
    FC("trunc7", V_TRUNC7, BP_ABI_DTYPE_FP16, 0), FC("half", V_HALF, BP_ABI_DTYPE_FP16, 0),
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-tuning", init)
