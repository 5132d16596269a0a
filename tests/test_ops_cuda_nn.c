/* The CUDA layer kernels (ops/cuda nn family: relu, add, the pools, batch
 * norm, softmax-CE) against the CPU reference kernels, on random NHWC
 * inputs with odd shapes and padded channels, FP32 and FP16, accumulate
 * off and on. Each case runs the reference on the host and the cuda
 * kernel on the device on the same bytes (channel padding holding
 * sentinels, outputs poisoned with NaN unless they accumulate), then
 * compares every output with a stated normalized tolerance,
 *   max |cuda - reference| / max |reference|   (both NaN counts as equal)
 * and checks that the channel padding and the 16-byte tail of every
 * tensor came back untouched. Tolerances: 0 where the kernel does the
 * reference's very operations in the reference's order (relu, add, max
 * pooling and its mask, average pooling, global average pooling); 1e-5
 * for FP32 batch norm and softmax-CE (sums in another order); 4e-3 for FP16
 * outputs of those (one FP16 rounding of a value that differs in its last
 * FP32 bits can move it by one FP16 ulp, 2^-10 relative); 1e-4 for the
 * FP32 batch-norm dx, which cancels; the ViT ops (gelu_tanh, layernorm,
 * pos_embed) as stated at their test. Every call is also run a second
 * time, captured in a CUDA graph and replayed, and must give the same bits
 * (determinism, capturability).
 *
 * Where no CUDA device is present the test prints why and exits 77
 * (CTest's SKIP_RETURN_CODE). CUDA does not survive fork(), so the suite
 * runs without Check's fork. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"

#define SKIP_CODE 77
#define MAX_T 8

static cudaStream_t stream;

#define CUDA_OK(call)                                                                          \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                \
  } while (0)

/* ---- tensors of any dtype ------------------------------------------------ */

static int64_t offset_of(const tt *t, int64_t i) {
  const int64_t c = i % t->d.shape[3];
  i /= t->d.shape[3];
  const int64_t w = i % t->d.shape[2];
  i /= t->d.shape[2];
  const int64_t h = i % t->d.shape[1];
  return i / t->d.shape[1] * t->d.stride[0] + h * t->d.stride[1] + w * t->d.stride[2] +
         c * t->d.stride[3];
}

/* Logical element i (compact NHWC order) as a double. */
static double get(const tt *t, int64_t i) {
  const int64_t o = offset_of(t, i);
  switch (t->d.dtype) {
    case BP_ABI_DTYPE_FP32: return ((const float *)t->data)[o];
    case BP_ABI_DTYPE_FP16: return bp_sdk_fp16_to_fp32(((const uint16_t *)t->data)[o]);
    case BP_ABI_DTYPE_INT8: return ((const int8_t *)t->data)[o];
    default: return ((const int32_t *)t->data)[o];
  }
}

static void set(tt *t, int64_t i, double v) {
  const int64_t o = offset_of(t, i);
  switch (t->d.dtype) {
    case BP_ABI_DTYPE_FP32: ((float *)t->data)[o] = (float)v; break;
    case BP_ABI_DTYPE_FP16: ((uint16_t *)t->data)[o] = bp_sdk_fp32_to_fp16((float)v); break;
    case BP_ABI_DTYPE_INT8: ((int8_t *)t->data)[o] = (int8_t)v; break;
    default: ((int32_t *)t->data)[o] = (int32_t)v; break;
  }
}

static uint64_t rng = 0x5eed0c0dau;

static void fill(tt *t, double lo, double hi) {
  for (int64_t i = 0; i < tt_count(t); i++) set(t, i, lo + (hi - lo) * tt_rand_unit(&rng));
}

/* Every logical element NaN: an output the kernel must write. */
static void poison(tt *t) {
  for (int64_t i = 0; i < tt_count(t); i++) set(t, i, NAN);
}

static tt make(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c, int64_t extra) {
  return tt_new(dtype, n, h, w, c, extra);
}

static tt clone(const tt *t) {
  tt c = *t;
  c.data = malloc(t->d.slot_bytes);
  ck_assert_ptr_nonnull(c.data);
  memcpy(c.data, t->data, t->d.slot_bytes);
  return c;
}

/* ---- one call on both sides ---------------------------------------------- */

typedef struct nn_call {
  const char *op;
  tt *in[MAX_T], *out[MAX_T]; /* an output may be an input (in place) */
  int nin, nout;
  const void *attrs;
  uint32_t attr_size;
} nn_call;

/* The distinct tensors of a call. */
typedef struct nn_set {
  tt *t[2 * MAX_T];
  int count;
} nn_set;

static int set_index(nn_set *s, tt *t) {
  for (int i = 0; i < s->count; i++)
    if (s->t[i] == t) return i;
  s->t[s->count] = t;
  return s->count++;
}

/* The index of t, a tensor of the call, in its distinct set. */
static int set_find(const nn_set *s, const tt *t) {
  for (int i = 0; i < s->count; i++)
    if (s->t[i] == t) return i;
  ck_abort_msg("tensor not in the call's set");
  return 0;
}

static nn_set distinct(const nn_call *c) {
  nn_set s = {{0}, 0};
  for (int i = 0; i < c->nin; i++) set_index(&s, c->in[i]);
  for (int o = 0; o < c->nout; o++) set_index(&s, c->out[o]);
  return s;
}

static const bp_abi_kernel *cuda_kernel(const char *op) {
  const bp_registry *r = ops_registry_with(BP_OPS_CUDA_PATH);
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->device, "cuda") == 0 && strcmp(k->impl, "cuda") == 0)
      return k;
  }
  ck_abort_msg("no cuda kernel for %s", op);
  return NULL;
}

/* The args of the call over the given tensors (by distinct index). */
static void make_args(ops_args *a, const nn_call *c, const nn_set *s, tt *const *view) {
  ops_call oc;
  memset(&oc, 0, sizeof oc);
  oc.op = c->op, oc.nin = c->nin, oc.nout = c->nout, oc.attrs = c->attrs;
  oc.attr_size = c->attr_size;
  for (int i = 0; i < c->nin; i++) oc.in[i] = view[set_find(s, c->in[i])];
  for (int o = 0; o < c->nout; o++) oc.out[o] = view[set_find(s, c->out[o])];
  ops_args_make(a, &oc, 1);
}

/* The reference on host copies of the call's tensors; ref[k] gets the
 * copy of distinct tensor k (the caller frees them). */
static void run_reference(const nn_call *c, nn_set *s, tt *ref) {
  tt *view[2 * MAX_T] = {0};
  for (int k = 0; k < s->count; k++) ref[k] = clone(s->t[k]), view[k] = &ref[k];
  const bp_abi_kernel *k = ops_kernel(c->op);
  ops_args a;
  make_args(&a, c, s, view);
  char reason[256] = "";
  ck_assert_msg(k->supports(k->user, &a.args, reason, sizeof reason), "reference refuses %s: %s",
                c->op, reason);
  const uint64_t ws_bytes = k->workspace_size ? k->workspace_size(k->user, &a.args) : 0;
  void *ws = ws_bytes ? malloc(ws_bytes) : NULL;
  a.args.workspace = ws, a.args.workspace_bytes = ws_bytes;
  a.args.reason = reason, a.args.reason_size = sizeof reason;
  ck_assert_msg(k->run(k->user, &a.args) == BP_ABI_OK, "reference %s: %s", c->op, reason);
  free(ws);
}

/* The cuda kernel on device copies; got[k] gets distinct tensor k back.
 * With `capture`, run() is captured into a CUDA graph (no allocation, no
 * synchronization and no host read may happen inside) and the graph is
 * launched instead. */
static void run_cuda(const nn_call *c, nn_set *s, tt *got, int capture) {
  tt dev[2 * MAX_T], *view[2 * MAX_T] = {0};
  for (int k = 0; k < s->count; k++) {
    dev[k] = *s->t[k];
    CUDA_OK(cudaMalloc(&dev[k].data, s->t[k]->d.slot_bytes));
    CUDA_OK(cudaMemcpy(dev[k].data, s->t[k]->data, s->t[k]->d.slot_bytes,
                       cudaMemcpyHostToDevice));
    view[k] = &dev[k];
  }
  const bp_abi_kernel *k = cuda_kernel(c->op);
  ops_args a;
  make_args(&a, c, s, view);
  char reason[256] = "";
  ck_assert_msg(k->supports(k->user, &a.args, reason, sizeof reason), "cuda refuses %s: %s",
                c->op, reason);
  const uint64_t ws_bytes = k->workspace_size ? k->workspace_size(k->user, &a.args) : 0;
  void *ws = NULL;
  if (ws_bytes) CUDA_OK(cudaMalloc(&ws, ws_bytes));
  a.args.workspace = ws, a.args.workspace_bytes = ws_bytes;
  a.args.stream = (void *)stream;
  a.args.reason = reason, a.args.reason_size = sizeof reason;
  if (capture) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = k->run(k->user, &a.args);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ck_assert_msg(rc == BP_ABI_OK, "cuda %s (captured): %s", c->op, reason);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  } else {
    ck_assert_msg(k->run(k->user, &a.args) == BP_ABI_OK, "cuda %s: %s", c->op, reason);
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  for (int q = 0; q < s->count; q++) {
    got[q] = clone(s->t[q]);
    CUDA_OK(cudaMemcpy(got[q].data, dev[q].data, s->t[q]->d.slot_bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(dev[q].data));
  }
  if (ws) CUDA_OK(cudaFree(ws));
}

/* max |a - b| / max |b| over the logical elements (0 when equal). */
static double norm_err(const tt *a, const tt *b) {
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < tt_count(b); i++) {
    const double x = get(a, i), y = get(b, i);
    if (isnan(x) && isnan(y)) continue;
    const double d = fabs(x - y);
    if (!(d <= diff)) diff = d; /* a NaN on one side sticks */
    if (fabs(y) > scale) scale = fabs(y);
  }
  return diff == 0.0 ? 0.0 : diff / (scale > 0.0 ? scale : 1e-30);
}

/* Runs the call on both sides and compares output o within tol[o]; then
 * runs the cuda kernel again, captured in a CUDA graph and replayed, and
 * asserts the same bits (deterministic and capturable). */
static void check_call(const char *what, const nn_call *c, const double *tol) {
  nn_set s = distinct(c);
  tt ref[2 * MAX_T], got[2 * MAX_T];
  run_reference(c, &s, ref);
  run_cuda(c, &s, got, 0);
  for (int o = 0; o < c->nout; o++) {
    const int k = set_index(&s, c->out[o]);
    const double e = norm_err(&got[k], &ref[k]);
    ck_assert_msg(e <= tol[o], "%s: %s output %d: normalized error %g > %g", what, c->op, o, e,
                  tol[o]);
  }
  for (int k = 0; k < s.count; k++)
    ck_assert_msg(tt_padding_intact(&got[k]), "%s: %s wrote channel padding or the tail", what,
                  c->op);
  tt again[2 * MAX_T];
  run_cuda(c, &s, again, 1);
  for (int o = 0; o < c->nout; o++) {
    const int k = set_index(&s, c->out[o]);
    ck_assert_msg(memcmp(again[k].data, got[k].data, got[k].d.slot_bytes) == 0,
                  "%s: %s output %d differs in the graph replay", what, c->op, o);
  }
  for (int k = 0; k < s.count; k++) tt_free(&again[k]);
  for (int k = 0; k < s.count; k++) tt_free(&ref[k]), tt_free(&got[k]);
}

static const int32_t dtypes[2] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16};

/* ---- relu, add ----------------------------------------------------------- */

START_TEST(relu_and_add_match_the_reference) {
  for (int d = 0; d < 2; d++)
    for (int acc = 0; acc < 2; acc++) {
      const int32_t dt = dtypes[d];
      bp_elementwise_attrs at = {acc};
      const double exact[2] = {0, 0};
      tt x = make(dt, 3, 5, 7, 13, 3), y = make(dt, 3, 5, 7, 13, 5);
      tt dy = make(dt, 3, 5, 7, 13, 0), dx = make(dt, 3, 5, 7, 13, 2);
      fill(&x, -2, 2), fill(&dy, -1, 1);
      poison(&y);
      nn_call fwd = {"relu.fwd", {&x}, {&y}, 1, 1, &at, sizeof at};
      check_call("relu.fwd", &fwd, exact);
      nn_call fwd_in_place = {"relu.fwd", {&x}, {&x}, 1, 1, &at, sizeof at};
      check_call("relu.fwd in place", &fwd_in_place, exact);
      fill(&y, -1, 1);
      if (acc) fill(&dx, -1, 1);
      else poison(&dx);
      nn_call bwd = {"relu.bwd", {&y, &dy}, {&dx}, 2, 1, &at, sizeof at};
      check_call("relu.bwd", &bwd, exact);
      nn_call bwd_in_place = {"relu.bwd", {&y, &dy}, {&dy}, 2, 1, &at, sizeof at};
      check_call("relu.bwd in place", &bwd_in_place, exact);
      /* add: b with its own padding and dtype mixed in */
      tt b = make(dt, 3, 5, 7, 13, 1), da = make(dt, 3, 5, 7, 13, 4);
      fill(&b, -3, 3);
      poison(&y);
      nn_call add = {"add.fwd", {&x, &b}, {&y}, 2, 1, &at, sizeof at};
      check_call("add.fwd", &add, exact);
      if (acc) fill(&da, -1, 1), fill(&dx, -1, 1);
      else poison(&da), poison(&dx);
      nn_call add_bwd = {"add.bwd", {&dy}, {&da, &dx}, 1, 2, &at, sizeof at};
      check_call("add.bwd", &add_bwd, exact);
      tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx), tt_free(&b), tt_free(&da);
    }
}
END_TEST

/* ---- pooling ------------------------------------------------------------- */

typedef struct pool_shape {
  int kh, kw, sh, sw, ph, pw;
} pool_shape;

static const pool_shape pools[] = {
    {2, 2, 2, 2, 0, 0}, /* the VGG pool */
    {3, 3, 2, 2, 1, 1}, /* the ResNet stem pool: overlapping windows */
    {3, 2, 1, 1, 1, 0}, /* stride 1: every element under several windows */
};

START_TEST(pooling_matches_the_reference) {
  const int64_t N = 2, H = 9, W = 11, C = 13;
  const double exact[2] = {0, 0};
  for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++)
    for (int d = 0; d < 2; d++)
      for (int acc = 0; acc < 2; acc++) {
        const pool_shape *ps = &pools[p];
        const int32_t dt = dtypes[d];
        const int64_t OH = (H + 2 * ps->ph - ps->kh) / ps->sh + 1;
        const int64_t OW = (W + 2 * ps->pw - ps->kw) / ps->sw + 1;
        bp_pool_attrs at = {ps->kh, ps->kw, ps->sh, ps->sw, ps->ph, ps->pw, 0, acc};
        tt x = make(dt, N, H, W, C, 3), y = make(dt, N, OH, OW, C, 3);
        tt mask = make(BP_ABI_DTYPE_INT8, N, OH, OW, C, 5), dy = make(dt, N, OH, OW, C, 0);
        tt dx = make(dt, N, H, W, C, 1);
        /* few distinct values, so ties happen and the first tap must win */
        for (int64_t i = 0; i < tt_count(&x); i++) set(&x, i, floor(8 * tt_rand_unit(&rng)) - 4);
        fill(&dy, -1, 1);
        poison(&y);
        for (int64_t i = 0; i < tt_count(&mask); i++) set(&mask, i, -7);
        nn_call mf = {"maxpool.fwd", {&x}, {&y, &mask}, 1, 2, &at, sizeof at};
        check_call("maxpool.fwd", &mf, exact);
        /* a valid mask for the backward: the reference's */
        {
          nn_set s = distinct(&mf);
          tt ref[2 * MAX_T];
          run_reference(&mf, &s, ref);
          memcpy(mask.data, ref[set_index(&s, &mask)].data, mask.d.slot_bytes);
          for (int k = 0; k < s.count; k++) tt_free(&ref[k]);
        }
        if (acc) fill(&dx, -1, 1);
        else poison(&dx);
        nn_call mb = {"maxpool.bwd", {&dy, &mask}, {&dx}, 2, 1, &at, sizeof at};
        check_call("maxpool.bwd", &mb, exact);
        for (int inc = 0; inc < 2; inc++) {
          at.count_include_pad = inc;
          fill(&x, -2, 2);
          poison(&y);
          nn_call af = {"avgpool.fwd", {&x}, {&y}, 1, 1, &at, sizeof at};
          check_call("avgpool.fwd", &af, exact);
          if (acc) fill(&dx, -1, 1);
          else poison(&dx);
          nn_call ab = {"avgpool.bwd", {&dy}, {&dx}, 1, 1, &at, sizeof at};
          check_call("avgpool.bwd", &ab, exact);
        }
        tt_free(&x), tt_free(&y), tt_free(&mask), tt_free(&dy), tt_free(&dx);
      }
}
END_TEST

START_TEST(global_avgpool_matches_the_reference) {
  const double exact[1] = {0};
  for (int d = 0; d < 2; d++)
    for (int acc = 0; acc < 2; acc++) {
      const int32_t dt = dtypes[d];
      bp_elementwise_attrs at = {acc};
      tt x = make(dt, 5, 7, 9, 67, 5), y = make(dt, 5, 1, 1, 67, 3);
      tt dy = make(dt, 5, 1, 1, 67, 0), dx = make(dt, 5, 7, 9, 67, 1);
      fill(&x, -2, 2), fill(&dy, -1, 1);
      poison(&y);
      nn_call f = {"global_avgpool.fwd", {&x}, {&y}, 1, 1, &at, sizeof at};
      check_call("global_avgpool.fwd", &f, exact);
      if (acc) fill(&dx, -1, 1);
      else poison(&dx);
      nn_call b = {"global_avgpool.bwd", {&dy}, {&dx}, 1, 1, &at, sizeof at};
      check_call("global_avgpool.bwd", &b, exact);
      tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx);
    }
}
END_TEST

/* A call with an FP16 tensor goes through the reference's FP16 adapter,
 * which adds the whole result to an accumulating FP32 output once: an
 * FP16 dy with an FP32 dx must give those bits, not the all-FP32
 * reference's one-addition-per-window order. */
START_TEST(pooling_backward_with_fp16_dy_and_fp32_dx_adds_as_the_reference) {
  const int64_t N = 2, H = 9, W = 11, C = 13;
  const double exact[1] = {0};
  for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++) {
    const pool_shape *ps = &pools[p];
    const int64_t OH = (H + 2 * ps->ph - ps->kh) / ps->sh + 1;
    const int64_t OW = (W + 2 * ps->pw - ps->kw) / ps->sw + 1;
    bp_pool_attrs at = {ps->kh, ps->kw, ps->sh, ps->sw, ps->ph, ps->pw, 1, 1};
    tt dy = make(BP_ABI_DTYPE_FP16, N, OH, OW, C, 0);
    tt dx = make(BP_ABI_DTYPE_FP32, N, H, W, C, 1);
    fill(&dy, -1, 1), fill(&dx, -1, 1);
    nn_call ab = {"avgpool.bwd", {&dy}, {&dx}, 1, 1, &at, sizeof at};
    check_call("avgpool.bwd (fp16 dy, fp32 dx)", &ab, exact);
    tt_free(&dy), tt_free(&dx);
  }
}
END_TEST

/* ---- batch norm ---------------------------------------------------------- */

/* FP32 features and parameters, or the AMP layout: FP16 features (x, y,
 * dy, dx), FP32 parameters and statistics. Two shapes: small and odd, and
 * one with many pixels (several slices of the statistics). */
START_TEST(batchnorm_matches_the_reference) {
  static const int64_t shapes[2][4] = {{3, 5, 7, 37}, {16, 33, 31, 70}};
  for (int sh = 0; sh < 2; sh++)
    for (int d = 0; d < 2; d++)
      for (int acc = 0; acc < 2; acc++) {
        const int32_t dt = dtypes[d], f32 = BP_ABI_DTYPE_FP32;
        const int64_t N = shapes[sh][0], H = shapes[sh][1], W = shapes[sh][2], C = shapes[sh][3];
        const double tf = dt == BP_ABI_DTYPE_FP16 ? 4e-3 : 1e-5;
        bp_batchnorm_attrs at = {1e-5f, 0.1f, acc};
        tt x = make(dt, N, H, W, C, 3), y = make(dt, N, H, W, C, 1);
        tt gamma = make(f32, 1, 1, 1, C, 0), beta = make(f32, 1, 1, 1, C, 2);
        tt rm = make(f32, 1, 1, 1, C, 1), rv = make(f32, 1, 1, 1, C, 0);
        tt sm = make(f32, 1, 1, 1, C, 3), si = make(f32, 1, 1, 1, C, 0);
        fill(&x, -3, 5), fill(&gamma, 0.5, 1.5), fill(&beta, -1, 1);
        fill(&rm, -0.5, 0.5), fill(&rv, 0.5, 2);
        poison(&y), poison(&sm), poison(&si);
        /* running statistics updated in place (outputs 3, 4 = inputs 3, 4) */
        nn_call tr = {"batchnorm.fwd_train", {&x, &gamma, &beta, &rm, &rv},
                      {&y, &sm, &si, &rm, &rv}, 5, 5, &at, sizeof at};
        const double ttol[5] = {tf, 1e-5, 1e-5, 1e-5, 1e-5};
        check_call("batchnorm.fwd_train", &tr, ttol);
        poison(&y);
        nn_call ev = {"batchnorm.fwd_eval", {&x, &gamma, &beta, &rm, &rv}, {&y}, 5, 1, &at,
                      sizeof at};
        const double etol[1] = {tf};
        check_call("batchnorm.fwd_eval", &ev, etol);
        /* the backward through the reference's saved statistics */
        {
          nn_set s = distinct(&tr);
          tt ref[2 * MAX_T];
          run_reference(&tr, &s, ref);
          memcpy(sm.data, ref[set_index(&s, &sm)].data, sm.d.slot_bytes);
          memcpy(si.data, ref[set_index(&s, &si)].data, si.d.slot_bytes);
          for (int k = 0; k < s.count; k++) tt_free(&ref[k]);
        }
        tt dy = make(dt, N, H, W, C, 0), dx = make(dt, N, H, W, C, 2);
        tt dg = make(f32, 1, 1, 1, C, 1), db = make(f32, 1, 1, 1, C, 0);
        fill(&dy, -1, 1);
        if (acc) fill(&dx, -1, 1), fill(&dg, -1, 1), fill(&db, -1, 1);
        else poison(&dx), poison(&dg), poison(&db);
        nn_call bw = {"batchnorm.bwd", {&x, &dy, &gamma, &sm, &si}, {&dx, &dg, &db}, 5, 3, &at,
                      sizeof at};
        /* dx cancels (dy - mean dy - xhat * mean dy*xhat): compared to its
         * largest element, a few FP32 ulps of the sums */
        const double btol[3] = {dt == BP_ABI_DTYPE_FP16 ? 4e-3 : 1e-4, 1e-5, 1e-5};
        check_call("batchnorm.bwd", &bw, btol);
        tt_free(&x), tt_free(&y), tt_free(&gamma), tt_free(&beta), tt_free(&rm), tt_free(&rv);
        tt_free(&sm), tt_free(&si), tt_free(&dy), tt_free(&dx), tt_free(&dg), tt_free(&db);
      }
}
END_TEST

/* ---- softmax cross-entropy ----------------------------------------------- */

START_TEST(softmax_ce_matches_the_reference) {
  static const int64_t shapes[2][2] = {{37, 10}, {19, 1001}};
  for (int sh = 0; sh < 2; sh++)
    for (int d = 0; d < 2; d++)
      for (int scaled = 0; scaled < 2; scaled++) {
        const int32_t dt = dtypes[d], f32 = BP_ABI_DTYPE_FP32;
        const int64_t N = shapes[sh][0], K = shapes[sh][1];
        bp_softmax_ce_attrs at = {0.1f, 1.0f / (float)N, 1, scaled};
        tt z = make(dt, N, 1, 1, K, 3), lab = make(BP_ABI_DTYPE_INT32, N, 1, 1, 1, 0);
        tt ls = make(f32, 1, 1, 1, 1, 0), loss = make(f32, 1, 1, 1, 1, 0);
        tt correct = make(f32, 1, 1, 1, 1, 0), dz = make(dt, N, 1, 1, K, 1);
        fill(&z, -6, 6);
        for (int64_t n = 0; n < N; n++) set(&lab, n, floor((double)K * tt_rand_unit(&rng)));
        set(&ls, 0, 1024.0);
        set(&loss, 0, 1.5), set(&correct, 0, 2.0); /* both accumulate */
        poison(&dz);
        nn_call c = {"softmax_ce.fwd_bwd", {&z, &lab, &ls}, {&loss, &correct, &dz},
                     2 + scaled, 3, &at, sizeof at};
        const double tol[3] = {1e-5, 0, dt == BP_ABI_DTYPE_FP16 ? 4e-3 : 1e-5};
        check_call("softmax_ce.fwd_bwd", &c, tol);
        /* without the gradient: dlogits untouched */
        at.compute_grad = 0;
        nn_call f = {"softmax_ce.fwd_bwd", {&z, &lab, &ls}, {&loss, &correct}, 2 + scaled, 2, &at,
                     sizeof at};
        check_call("softmax_ce.fwd_bwd (no grad)", &f, tol);
        tt_free(&z), tt_free(&lab), tt_free(&ls), tt_free(&loss), tt_free(&correct);
        tt_free(&dz);
      }
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

/* The cuda kernels refuse what the reference refuses, with its reason. */
/* ---- the ViT ops: gelu_tanh, layernorm, pos_embed ---------------------------- */

/* gelu_tanh: CUDA's double tanh is within 2 ulp of libm's, so a float may
 * differ in its last bit (1e-6); layernorm's and pos_embed's sums run in
 * the reference's order with the same double operations. FP16: 4e-3 (one
 * FP16 ulp, where a last FP32 bit or an accumulate rounded in another
 * order moves the rounding). */
START_TEST(vit_ops_match_the_reference) {
  static const int64_t shapes[][4] = {{2, 7, 7, 64}, {3, 2, 5, 13}, {64, 7, 7, 9}, {1, 1, 1, 1}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int d = 0; d < 2; d++)
      for (int acc = 0; acc < 2; acc++) {
        const double t = d ? 4e-3 : 1e-6, close[3] = {t, t, t};
        const int64_t *sh = shapes[si];
        const int32_t dt = dtypes[d];
        bp_elementwise_attrs at = {acc};
        tt x = make(dt, sh[0], sh[1], sh[2], sh[3], 3), y = make(dt, sh[0], sh[1], sh[2], sh[3], 1);
        tt dy = make(dt, sh[0], sh[1], sh[2], sh[3], 0), dx = make(dt, sh[0], sh[1], sh[2], sh[3], 2);
        fill(&x, -4, 4), fill(&dy, -1, 1);
        poison(&y);
        nn_call gf = {"gelu_tanh.fwd", {&x}, {&y}, 1, 1, &at, sizeof at};
        check_call("gelu_tanh.fwd", &gf, close);
        if (acc) fill(&dx, -1, 1);
        else poison(&dx);
        nn_call gb = {"gelu_tanh.bwd", {&x, &dy}, {&dx}, 2, 1, &at, sizeof at};
        check_call("gelu_tanh.bwd", &gb, close);
        /* pos_embed: P [1,H,W,C] */
        tt P = make(dt, 1, sh[1], sh[2], sh[3], 1), dP = make(dt, 1, sh[1], sh[2], sh[3], 0);
        fill(&P, -0.1, 0.1);
        poison(&y);
        nn_call pf = {"pos_embed.fwd", {&x, &P}, {&y}, 2, 1, &at, sizeof at};
        check_call("pos_embed.fwd", &pf, close);
        if (acc) fill(&dx, -1, 1), fill(&dP, -1, 1);
        else poison(&dx), poison(&dP);
        nn_call pb = {"pos_embed.bwd", {&dy}, {&dx, &dP}, 1, 2, &at, sizeof at};
        check_call("pos_embed.bwd", &pb, close);
        /* layernorm: gain, bias per channel; FP32 statistics per position */
        bp_layernorm_attrs la = {1e-5f, acc};
        tt g = make(dt, 1, 1, 1, sh[3], 0), b = make(dt, 1, 1, 1, sh[3], 2);
        tt sm = make(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], 1, 0);
        tt sv = make(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], 1, 0);
        tt dg = make(dt, 1, 1, 1, sh[3], 1), db = make(dt, 1, 1, 1, sh[3], 0);
        fill(&g, 0.5, 1.5), fill(&b, -1, 1);
        poison(&y), poison(&sm), poison(&sv);
        nn_call lf = {"layernorm.fwd", {&x, &g, &b}, {&y, &sm, &sv}, 3, 3, &la, sizeof la};
        check_call("layernorm.fwd", &lf, close);
        fill(&sm, -0.5, 0.5), fill(&sv, 0.5, 2);
        if (acc) fill(&dx, -1, 1), fill(&dg, -1, 1), fill(&db, -1, 1);
        else poison(&dx), poison(&dg), poison(&db);
        nn_call lb = {"layernorm.bwd", {&x, &dy, &g, &sm, &sv}, {&dx, &dg, &db}, 5, 3, &la,
                      sizeof la};
        check_call("layernorm.bwd", &lb, close);
        tt *all[] = {&x, &y, &dy, &dx, &P, &dP, &g, &b, &sm, &sv, &dg, &db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
      }
}
END_TEST

START_TEST(refusals_match_the_reference) {
  bp_pool_attrs bad = {2, 2, 2, 2, 2, 0, 0, 0}; /* pad == kernel */
  tt x = make(BP_ABI_DTYPE_FP32, 1, 4, 4, 3, 0), y = make(BP_ABI_DTYPE_FP32, 1, 3, 2, 3, 0);
  nn_call c = {"avgpool.fwd", {&x}, {&y}, 1, 1, &bad, sizeof bad};
  nn_set s = distinct(&c);
  tt *view[2 * MAX_T] = {0};
  for (int k = 0; k < s.count; k++) view[k] = s.t[k];
  ops_args a;
  make_args(&a, &c, &s, view);
  char r1[256] = "", r2[256] = "";
  const bp_abi_kernel *ref = ops_kernel(c.op), *cu = cuda_kernel(c.op);
  ck_assert_int_eq(ref->supports(ref->user, &a.args, r1, sizeof r1), 0);
  ck_assert_int_eq(cu->supports(cu->user, &a.args, r2, sizeof r2), 0);
  ck_assert_str_eq(r1, r2);
  tt_free(&x), tt_free(&y);
}
END_TEST

int main(void) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
    return SKIP_CODE;
  }
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    fprintf(stderr, "cudaStreamCreate failed\n");
    return EXIT_FAILURE;
  }
  Suite *suite = suite_create("ops_cuda_nn");
  TCase *tc = tcase_create("ops_cuda_nn");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, relu_and_add_match_the_reference);
  tcase_add_test(tc, pooling_matches_the_reference);
  tcase_add_test(tc, global_avgpool_matches_the_reference);
  tcase_add_test(tc, pooling_backward_with_fp16_dy_and_fp32_dx_adds_as_the_reference);
  tcase_add_test(tc, batchnorm_matches_the_reference);
  tcase_add_test(tc, softmax_ce_matches_the_reference);
  tcase_add_test(tc, vit_ops_match_the_reference);
  tcase_add_test(tc, refusals_match_the_reference);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  cudaStreamDestroy(stream);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
