/* The CUDA range kernels (ops/cuda/range*.{c,cu}) against the reference
 * ones, where a GPU exists: every op on random spans (odd lengths, one
 * element, a span longer than one grid's threads), with the skip input
 * set and clear and with run-time scalars the reference refuses, outputs
 * filled with random bits first. The reference runs on host copies, the
 * CUDA kernel on device copies of the same bytes; every output must come
 * back bit for bit the reference's (range.lars: its norms and rates are
 * summed in another order, so within a relative 1e-6 instead), and every
 * input unchanged. Where no GPU is present the suite prints why and exits
 * with 77 (CTest's SKIP_RETURN_CODE).
 *
 * Modules come through the registry from their build paths: the cuda
 * device plugin (allocations, copies, the stream), the reference module
 * and the CUDA op module. CUDA does not survive fork(), so the suite runs
 * without Check's fork. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/status.h"
#include "bp_abi.h"
#include "bp_abi_device.h"
#include "bp_abi_ops.h"

#define SKIP_CODE 77

static bp_registry *registry;
static const bp_abi_device *dev;
static bp_abi_stream *stream;
static uint64_t rng = 0x2545f4914f6cdd1dull;

#define CK_OK(call) ck_assert_msg((call) == BP_ABI_OK, "%s: %s", #call, dev->last_error())

/* ---- random values ------------------------------------------------------------ */

static uint64_t next_u64(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}
static float uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(next_u64() >> 40) / 16777216.0);
}
static float any_float(void) {
  const uint32_t b = (uint32_t)next_u64();
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* ---- spans ------------------------------------------------------------------- */

/* One tensor of a call: its bytes as the call starts (init), the
 * reference's result (ref) and the device's result (got). */
typedef struct span {
  int32_t dtype;
  int64_t n;
  unsigned char *init, *ref, *got;
  void *d; /* device copy */
} span;

static size_t dsize(int32_t dtype) {
  return dtype == BP_ABI_DTYPE_FP16 || dtype == BP_ABI_DTYPE_BF16 ? 2
         : dtype == BP_ABI_DTYPE_INT8                             ? 1
                                                                  : 4;
}
static size_t span_bytes(const span *s) { return (size_t)s->n * dsize(s->dtype); }

static span span_new(int32_t dtype, int64_t n) {
  span s = {dtype, n, NULL, NULL, NULL, NULL};
  const size_t b = span_bytes(&s) + 16;
  s.init = malloc(b);
  s.ref = malloc(b);
  s.got = malloc(b);
  ck_assert(s.init && s.ref && s.got);
  for (size_t i = 0; i < b; i++) s.init[i] = (unsigned char)next_u64(); /* poison */
  return s;
}
static float *f32(span *s) { return (float *)(void *)s->init; }

/* FP32 values: uniform in [lo, hi) */
static span span_f32(int64_t n, float lo, float hi) {
  span s = span_new(BP_ABI_DTYPE_FP32, n);
  for (int64_t i = 0; i < n; i++) f32(&s)[i] = uniform(lo, hi);
  return s;
}
static span scalar(float v) {
  span s = span_new(BP_ABI_DTYPE_FP32, 1);
  f32(&s)[0] = v;
  return s;
}

static void span_free(span *s) {
  free(s->init);
  free(s->ref);
  free(s->got);
  if (s->d) dev->arena_free(0, s->d, span_bytes(s) + 16);
  memset(s, 0, sizeof *s);
}

static bp_abi_tensor tensor_of(const span *s) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = s->dtype;
  t.shape[0] = t.shape[1] = t.shape[2] = 1;
  t.shape[3] = s->n;
  t.padded_c = s->n;
  t.stride[3] = 1;
  t.stride[2] = t.stride[1] = t.stride[0] = s->n;
  t.slot_bytes = span_bytes(s) + 16;
  return t;
}

/* ---- kernels ------------------------------------------------------------------ */

static const bp_abi_kernel *find_kernel(const char *op, const char *impl, const char *device) {
  for (int i = 0; i < bp_registry_kernel_count(registry); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(registry, i)->kernel;
    if (!strcmp(k->op, op) && !strcmp(k->impl, impl) && !strcmp(k->device, device)) return k;
  }
  ck_abort_msg("no %s kernel %s on %s", impl, op, device);
  return NULL;
}

static void host_parallel_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(arg, i);
}

/* One call's arguments; `device` picks the device copies and the stream. */
typedef struct call {
  const char *op;
  span *in[4], *out[4];
  int nin, nout;
  int in_place; /* output 0 is input 0 */
  const void *attrs;
  uint32_t attr_size;
} call;

typedef struct built {
  bp_abi_tensor ti[4], to[4];
  const void *ip[4];
  void *op[4];
  bp_abi_threads threads;
  uint64_t generation;
  char reason[512];
  bp_abi_kernel_args a;
} built;

static void build(built *b, const call *c, int device) {
  memset(b, 0, sizeof *b);
  for (int i = 0; i < c->nin; i++) {
    b->ti[i] = tensor_of(c->in[i]);
    b->ip[i] = device ? c->in[i]->d : (const void *)c->in[i]->ref;
  }
  for (int i = 0; i < c->nout; i++) {
    b->to[i] = tensor_of(c->out[i]);
    b->op[i] = device ? c->out[i]->d : (void *)c->out[i]->ref;
  }
  if (c->in_place) b->op[0] = (void *)(uintptr_t)b->ip[0];
  b->threads = (bp_abi_threads){sizeof(bp_abi_threads), 1, NULL, host_parallel_for};
  b->generation = 1;
  bp_abi_kernel_args *a = &b->a;
  a->struct_size = sizeof *a;
  a->num_inputs = c->nin;
  a->num_outputs = c->nout;
  a->inputs = b->ti;
  a->outputs = b->to;
  a->input_ptrs = b->ip;
  a->output_ptrs = b->op;
  a->attrs = c->attrs;
  a->attr_size = c->attr_size;
  a->attr_version = 1;
  a->stream = device ? dev->stream_native(stream) : NULL;
  a->world_size = 1;
  a->params_generation = &b->generation;
  a->reason = b->reason;
  a->reason_size = sizeof b->reason;
  a->threads = &b->threads;
}

/* Every tensor of the call (inputs first, an in-place output once). */
static int tensors(const call *c, span **all) {
  int k = 0;
  for (int i = 0; i < c->nin; i++) all[k++] = c->in[i];
  for (int i = c->in_place ? 1 : 0; i < c->nout; i++) all[k++] = c->out[i];
  return k;
}

/* Runs the reference on host copies and the CUDA kernel on device copies
 * of the same bytes; afterwards every span's ref and got hold the two
 * results (inputs included, which must not change). */
static void run_both(const call *c) {
  span *all[8];
  const int count = tensors(c, all);
  for (int i = 0; i < count; i++) {
    memcpy(all[i]->ref, all[i]->init, span_bytes(all[i]));
    CK_OK(dev->arena_alloc(0, span_bytes(all[i]) + 16, 256, &all[i]->d));
    CK_OK(dev->copy_h2d(all[i]->d, all[i]->init, span_bytes(all[i]), stream));
  }
  const bp_abi_kernel *ref = find_kernel(c->op, "reference", "cpu");
  const bp_abi_kernel *cu = find_kernel(c->op, "cuda", "cuda");
  built hb, db;
  build(&hb, c, 0);
  build(&db, c, 1);
  char why[512] = "";
  ck_assert_msg(ref->supports(ref->user, &hb.a, why, sizeof why), "%s: reference: %s", c->op, why);
  ck_assert_msg(cu->supports(cu->user, &db.a, why, sizeof why), "%s: cuda: %s", c->op, why);
  (void)ref->run(ref->user, &hb.a); /* may refuse a scalar: its outputs stay */
  void *ws = NULL;
  uint64_t ws_bytes = cu->workspace_size ? cu->workspace_size(cu->user, &db.a) : 0;
  if (ws_bytes) {
    CK_OK(dev->arena_alloc(0, ws_bytes, 256, &ws));
    db.a.workspace = ws;
    db.a.workspace_bytes = ws_bytes;
  }
  const int rc = cu->run(cu->user, &db.a);
  ck_assert_msg(rc == BP_ABI_OK, "%s: cuda run: %d %s", c->op, rc, db.reason);
  for (int i = 0; i < count; i++)
    CK_OK(dev->copy_d2h(all[i]->got, all[i]->d, span_bytes(all[i]), stream));
  CK_OK(dev->stream_synchronize(stream));
  if (ws) dev->arena_free(0, ws, ws_bytes);
  for (int i = 0; i < count; i++) {
    dev->arena_free(0, all[i]->d, span_bytes(all[i]) + 16);
    all[i]->d = NULL;
  }
}

/* Asserts the device's bytes equal the reference's for every tensor. */
static void expect_same_bits(const call *c, int64_t n) {
  span *all[8];
  const int count = tensors(c, all);
  for (int t = 0; t < count; t++) {
    const size_t es = dsize(all[t]->dtype), bytes = span_bytes(all[t]);
    if (memcmp(all[t]->ref, all[t]->got, bytes) == 0) continue;
    for (size_t i = 0; i < bytes; i += es)
      if (memcmp(all[t]->ref + i, all[t]->got + i, es) != 0) {
        uint32_t r = 0, g = 0;
        memcpy(&r, all[t]->ref + i, es);
        memcpy(&g, all[t]->got + i, es);
        ck_abort_msg("%s (n %lld): tensor %d element %zu: reference 0x%x, cuda 0x%x", c->op,
                     (long long)n, t, i / es, r, g);
      }
  }
}

/* range.lars: w, m and norms within a relative 1e-6 (of max(1, |ref|));
 * the inputs bit for bit. */
static void expect_close_lars(const call *c) {
  span *all[8];
  const int count = tensors(c, all);
  for (int t = 0; t < count; t++) {
    if (t < c->nin) {
      ck_assert_msg(memcmp(all[t]->ref, all[t]->got, span_bytes(all[t])) == 0,
                    "range.lars changed input %d", t);
      continue;
    }
    const float *r = (const float *)(void *)all[t]->ref, *g = (const float *)(void *)all[t]->got;
    for (int64_t i = 0; i < all[t]->n; i++) {
      if (memcmp(&r[i], &g[i], sizeof r[i]) == 0) continue;
      const double tol = 1e-6 * fmax(1.0, fabs((double)r[i]));
      ck_assert_msg(fabs((double)r[i] - (double)g[i]) <= tol,
                    "range.lars output %d element %lld: reference %.9g, cuda %.9g", t - c->nin,
                    (long long)i, (double)r[i], (double)g[i]);
    }
  }
}

static void check_bits(call *c, int64_t n) {
  run_both(c);
  expect_same_bits(c, n);
}

/* Span lengths: one element, odd ones around the block, a few grids'
 * worth of blocks, and (big) one longer than the largest grid's threads
 * (65535 * 8 blocks of 256: cuda_grid_for), so the grid-stride loop turns. */
static const int64_t lengths[] = {1, 3, 255, 256, 257, 4099, 1000003};
#define NLENGTHS ((int)(sizeof lengths / sizeof lengths[0]))
#define BIG_SPAN ((int64_t)65535 * 8 * 256 + 1001)

/* ---- tests ------------------------------------------------------------------- */

START_TEST(zero_and_copy_every_dtype) {
  static const int32_t dtypes[] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16, BP_ABI_DTYPE_INT8,
                                   BP_ABI_DTYPE_INT32, BP_ABI_DTYPE_BF16};
  bp_range_attrs a = {0};
  for (int d = 0; d < 5; d++)
    for (int l = 0; l < NLENGTHS; l++) {
      span x = span_new(dtypes[d], lengths[l]);
      call z = {"range.zero", {NULL}, {&x}, 0, 1, 0, &a, sizeof a};
      check_bits(&z, lengths[l]);
      span src = span_new(dtypes[d], lengths[l]), dst = span_new(dtypes[d], lengths[l]);
      call cp = {"range.copy", {&src}, {&dst}, 1, 1, 0, &a, sizeof a};
      check_bits(&cp, lengths[l]);
      span_free(&x);
      span_free(&src);
      span_free(&dst);
    }
}
END_TEST

START_TEST(scale_in_place) {
  for (int l = 0; l < NLENGTHS; l++) {
    bp_range_attrs a = {uniform(-3.0f, 3.0f), 0.0f, 0};
    span x = span_new(BP_ABI_DTYPE_FP32, lengths[l]);
    for (int64_t i = 0; i < x.n; i++) f32(&x)[i] = (i % 7 == 0) ? any_float() : uniform(-4, 4);
    call c = {"range.scale", {&x}, {&x}, 1, 1, 1, &a, sizeof a};
    check_bits(&c, lengths[l]);
    span_free(&x);
  }
}
END_TEST

START_TEST(cast_both_ways_with_every_kind_of_value) {
  bp_range_attrs a = {0};
  for (int l = 0; l < NLENGTHS; l++) {
    span f = span_new(BP_ABI_DTYPE_FP32, lengths[l]), h = span_new(BP_ABI_DTYPE_FP16, lengths[l]);
    for (int64_t i = 0; i < f.n; i++) /* any bits, and values in and around FP16's range */
      f32(&f)[i] = (i & 1) ? any_float() : uniform(-70000.0f, 70000.0f) * (i % 3 ? 1e-6f : 1.0f);
    call narrow = {"range.cast", {&f}, {&h}, 1, 1, 0, &a, sizeof a};
    check_bits(&narrow, lengths[l]);
    span h2 = span_new(BP_ABI_DTYPE_FP16, lengths[l]), f2 = span_new(BP_ABI_DTYPE_FP32, lengths[l]);
    call widen = {"range.cast", {&h2}, {&f2}, 1, 1, 0, &a, sizeof a};
    check_bits(&widen, lengths[l]);
    span_free(&f);
    span_free(&h);
    span_free(&h2);
    span_free(&f2);
  }
  /* every half */
  span h = span_new(BP_ABI_DTYPE_FP16, 65536), f = span_new(BP_ABI_DTYPE_FP32, 65536);
  for (int i = 0; i < 65536; i++) ((uint16_t *)(void *)h.init)[i] = (uint16_t)i;
  call widen = {"range.cast", {&h}, {&f}, 1, 1, 0, &a, sizeof a};
  check_bits(&widen, 65536);
  span_free(&h);
  span_free(&f);
}
END_TEST

START_TEST(ema_with_and_without_skip) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int mode = 0; mode < 3; mode++) { /* no skip input, skip 0, skip 1 */
      bp_range_attrs a = {0.0f, uniform(0.0f, 1.0f), mode > 0};
      span w = span_f32(lengths[l], -2, 2), e = span_f32(lengths[l], -2, 2);
      span skip = scalar(mode == 2 ? 1.0f : 0.0f);
      call c = {"range.ema", {&w, &skip}, {&e}, 1 + (mode > 0), 1, 0, &a, sizeof a};
      check_bits(&c, lengths[l]);
      span_free(&w);
      span_free(&e);
      span_free(&skip);
    }
}
END_TEST

START_TEST(nan_check_fp32_and_fp16) {
  bp_range_attrs a = {0};
  for (int l = 0; l < NLENGTHS; l++)
    for (int dt = 0; dt < 2; dt++)
      for (int mode = 0; mode < 4; mode++) { /* clean; NaN; Inf last; clean, flag already 1 */
        const int64_t n = lengths[l];
        span x = span_new(dt ? BP_ABI_DTYPE_FP16 : BP_ABI_DTYPE_FP32, n);
        for (int64_t i = 0; i < n; i++) {
          if (dt) ((uint16_t *)(void *)x.init)[i] = (uint16_t)(0x3c00u + (next_u64() & 0x3ffu));
          else f32(&x)[i] = uniform(-1e30f, 1e30f);
        }
        const int64_t at = mode == 1 ? (int64_t)(next_u64() % (uint64_t)n) : n - 1;
        if (mode == 1 || mode == 2) {
          if (dt) ((uint16_t *)(void *)x.init)[at] = mode == 1 ? 0xfe01u : 0x7c00u;
          else f32(&x)[at] = mode == 1 ? NAN : -INFINITY;
        }
        span flag = scalar(mode == 3 ? 1.0f : 0.0f);
        call c = {"range.nan_check", {&x}, {&flag}, 1, 1, 0, &a, sizeof a};
        check_bits(&c, n);
        ck_assert_float_eq(((float *)(void *)flag.got)[0], mode == 0 ? 0.0f : 1.0f);
        span_free(&x);
        span_free(&flag);
      }
}
END_TEST

START_TEST(unscale_reads_the_scale_on_the_device) {
  static const float scales[] = {65536.0f, 3.0f, 0.125f, 0.0f, NAN, -1.0f};
  bp_range_attrs a = {0};
  for (int l = 0; l < NLENGTHS; l++)
    for (int s = 0; s < 6; s++) {
      span src = span_new(BP_ABI_DTYPE_FP16, lengths[l]),
           dst = span_new(BP_ABI_DTYPE_FP32, lengths[l]);
      span scale = scalar(scales[s]);
      call c = {"range.unscale", {&src, &scale}, {&dst}, 2, 1, 0, &a, sizeof a};
      check_bits(&c, lengths[l]); /* a refused scale: dst keeps its poison on both */
      span_free(&src);
      span_free(&dst);
      span_free(&scale);
    }
}
END_TEST

START_TEST(loss_scale_every_branch) {
  static const float states[][4] = {{65536, 0, 1, 0}, {65536, 1999, 10, 3}, {0x1.8p127f, 1, 5, 0},
                                    {0, 0, 0, 0},     {1, -1, 0, 0},        {INFINITY, 0, 0, 0},
                                    {1, 0, NAN, 0}};
  static const float founds[] = {0.0f, 1.0f, NAN};
  static const int32_t intervals[] = {0, 1, 2000};
  for (int s = 0; s < 7; s++)
    for (int f = 0; f < 3; f++)
      for (int g = 0; g < 3; g++) {
        bp_loss_scale_attrs a = {2.0f, 0.5f, intervals[g]};
        span found = scalar(founds[f]), o[4];
        for (int k = 0; k < 4; k++) o[k] = scalar(states[s][k]);
        call c = {
            "range.loss_scale", {&found}, {&o[0], &o[1], &o[2], &o[3]}, 1, 4, 0, &a, sizeof a};
        check_bits(&c, 1);
        span_free(&found);
        for (int k = 0; k < 4; k++) span_free(&o[k]);
      }
}
END_TEST

START_TEST(sgd_every_mode_skip_and_bad_lr) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int mode = 0; mode < 16; mode++) {
      bp_optimizer_attrs a;
      memset(&a, 0, sizeof a);
      a.momentum = (mode & 1) ? 0.9f : 0.0f;
      a.weight_decay = (mode & 2) ? 5e-4f : 0.0f;
      a.nesterov = (mode & 4) && (mode & 1);
      a.has_skip = (mode & 8) != 0;
      const float lr = mode == 14 ? INFINITY : uniform(0.001f, 0.5f);
      span grad = span_f32(lengths[l], -1, 1), lrs = scalar(lr), skip = scalar((mode & 5) == 5);
      span w = span_f32(lengths[l], -2, 2), m = span_f32(lengths[l], -1, 1);
      call c = {"range.sgd", {&grad, &lrs, &skip}, {&w, &m}, 2 + a.has_skip, 2, 0, &a, sizeof a};
      check_bits(&c, lengths[l]);
      span_free(&grad);
      span_free(&lrs);
      span_free(&skip);
      span_free(&w);
      span_free(&m);
    }
}
END_TEST

START_TEST(adamw_steps_skip_and_bad_scalars) {
  static const float steps[] = {1.0f, 2.0f, 3.0f, 10.0f, 1000.0f, 123457.0f, 0.5f};
  for (int l = 0; l < NLENGTHS; l++)
    for (int s = 0; s < 7; s++)
      for (int sk = 0; sk < 3; sk++) { /* no skip input, skip 0, skip 1 */
        bp_optimizer_attrs a;
        memset(&a, 0, sizeof a);
        a.weight_decay = (s & 1) ? 0.01f : 0.0f;
        a.beta1 = 0.9f;
        a.beta2 = 0.999f;
        a.eps = 1e-8f;
        a.has_skip = sk > 0;
        span grad = span_f32(lengths[l], -1, 1), lr = scalar(uniform(1e-4f, 1e-2f));
        span step = scalar(steps[s]), skip = scalar(sk == 2 ? 1.0f : 0.0f);
        span w = span_f32(lengths[l], -2, 2), m = span_f32(lengths[l], -0.1f, 0.1f);
        span v = span_f32(lengths[l], 0, 0.01f);
        call c = {"range.adamw", {&grad, &lr, &step, &skip}, {&w, &m, &v}, 3 + a.has_skip, 3, 0, &a,
                  sizeof a};
        check_bits(&c, lengths[l]);
        span_free(&grad);
        span_free(&lr);
        span_free(&step);
        span_free(&skip);
        span_free(&w);
        span_free(&m);
        span_free(&v);
      }
}
END_TEST

START_TEST(lars_segments_skip_and_bad_offsets) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int mode = 0; mode < 6;
         mode++) { /* 0-1 plain, 2 skip 0, 3 skip 1, 4 bad offsets, 5 bad lr */
      const int64_t n = lengths[l];
      const int segs = 1 + (int)(next_u64() % 9);
      bp_optimizer_attrs a;
      memset(&a, 0, sizeof a);
      a.momentum = 0.9f;
      a.weight_decay = (mode & 1) ? 5e-4f : 0.0f;
      a.eta = 0.001f;
      a.has_skip = mode == 2 || mode == 3;
      span seg = span_new(BP_ABI_DTYPE_INT32, segs + 1);
      int32_t *o = (int32_t *)(void *)seg.init;
      o[0] = (int32_t)(next_u64() % 2 && n > 2 ? 1 : 0); /* elements before s_0 stay */
      for (int j = 1; j <= segs; j++) {
        int64_t next = o[j - 1] + (int64_t)(next_u64() % (uint64_t)(n / segs + 2));
        o[j] = (int32_t)(next > n ? n : next); /* empty segments too */
      }
      if (mode == 4) o[segs] = (int32_t)n + 1;
      span grad = span_f32(n, -1, 1), lr = scalar(mode == 5 ? NAN : 0.1f);
      span skip = scalar(mode == 3 ? 1.0f : 0.0f);
      span w = span_f32(n, -2, 2), m = span_f32(n, -0.1f, 0.1f),
           norms = span_new(BP_ABI_DTYPE_FP32, 2 * segs);
      if (mode == 1 && o[1] > o[0]) /* a zero gradient: trust 1 */
        memset(f32(&grad) + o[0], 0, sizeof(float) * (size_t)(o[1] - o[0]));
      call c = {"range.lars", {&grad, &lr, &seg, &skip}, {&w, &m, &norms}, 3 + a.has_skip, 3, 0, &a,
                sizeof a};
      run_both(&c);
      expect_close_lars(&c);
      span_free(&seg);
      span_free(&grad);
      span_free(&lr);
      span_free(&skip);
      span_free(&w);
      span_free(&m);
      span_free(&norms);
    }
}
END_TEST

START_TEST(a_span_longer_than_the_largest_grid) {
  const int64_t n = BIG_SPAN;
  bp_range_attrs ra = {0.5f, 0.0f, 0};
  span x = span_f32(n, -1, 1);
  call sc = {"range.scale", {&x}, {&x}, 1, 1, 1, &ra, sizeof ra};
  check_bits(&sc, n);
  span h = span_new(BP_ABI_DTYPE_FP16, n);
  call cast = {"range.cast", {&x}, {&h}, 1, 1, 0, &ra, sizeof ra};
  check_bits(&cast, n);
  span_free(&h);
  bp_optimizer_attrs a;
  memset(&a, 0, sizeof a);
  a.momentum = 0.9f;
  a.weight_decay = 1e-4f;
  a.nesterov = 1;
  span lr = scalar(0.05f), w = span_f32(n, -1, 1), m = span_f32(n, -1, 1);
  call sgd = {"range.sgd", {&x, &lr}, {&w, &m}, 2, 2, 0, &a, sizeof a};
  check_bits(&sgd, n);
  span_free(&x);
  span_free(&lr);
  span_free(&w);
  span_free(&m);
}
END_TEST

/* The plugin, the device count, then the two op modules; 77 without a GPU. */
int main(void) {
  if (bp_registry_create(&registry) != BP_OK ||
      bp_registry_load(registry, BP_DEVICE_CUDA_PATH) != BP_OK) {
    fprintf(stderr, "loading %s: %s\n", BP_DEVICE_CUDA_PATH, bp_last_error());
    return EXIT_FAILURE;
  }
  dev = bp_registry_find_device(registry, "cuda");
  int count = -1;
  if (!dev || dev->device_count(&count) != BP_ABI_OK || count < 0) {
    fprintf(stderr, "the cuda device plugin did not answer device_count\n");
    bp_registry_destroy(registry);
    return EXIT_FAILURE;
  }
  if (count == 0) {
    printf("SKIP: no CUDA device (%s)\n", dev->last_error());
    bp_registry_destroy(registry);
    return SKIP_CODE;
  }
  if (bp_registry_load(registry, BP_OPS_REFERENCE_PATH) != BP_OK ||
      bp_registry_load(registry, BP_OPS_CUDA_PATH) != BP_OK) {
    fprintf(stderr, "loading the op modules: %s\n", bp_last_error());
    bp_registry_destroy(registry);
    return EXIT_FAILURE;
  }
  if (dev->stream_create(0, BP_ABI_STREAM_COMPUTE, &stream) != BP_ABI_OK) {
    fprintf(stderr, "stream_create: %s\n", dev->last_error());
    bp_registry_destroy(registry);
    return EXIT_FAILURE;
  }
  Suite *suite = suite_create("ops_cuda_range");
  TCase *tc = tcase_create("ops_cuda_range");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, zero_and_copy_every_dtype);
  tcase_add_test(tc, scale_in_place);
  tcase_add_test(tc, cast_both_ways_with_every_kind_of_value);
  tcase_add_test(tc, ema_with_and_without_skip);
  tcase_add_test(tc, nan_check_fp32_and_fp16);
  tcase_add_test(tc, unscale_reads_the_scale_on_the_device);
  tcase_add_test(tc, loss_scale_every_branch);
  tcase_add_test(tc, sgd_every_mode_skip_and_bad_lr);
  tcase_add_test(tc, adamw_steps_skip_and_bad_scalars);
  tcase_add_test(tc, lars_segments_skip_and_bad_offsets);
  tcase_add_test(tc, a_span_longer_than_the_largest_grid);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  dev->stream_destroy(stream);
  bp_registry_destroy(registry);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
