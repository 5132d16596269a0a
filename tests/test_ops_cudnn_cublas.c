/* The cuDNN conv2d kernels (ops/cudnn) and the cuBLAS fc kernels
 * (ops/cublas) against the reference module, on a GPU. Where no CUDA
 * device exists the test prints why and exits with 77 (CTest's
 * SKIP_RETURN_CODE).
 *
 * Every case runs each pass (fwd, bwd_data, bwd_filter) in FP32 (TF32 off:
 * BP_TF32=0 is set before the modules load, so the tolerance is tight) and
 * in FP16 (looser), with accumulate 0 and 1, on tensors with channel
 * padding and a 16-byte tail holding sentinel bytes. Checked for each run:
 * the logical elements against the reference's, within the dtype's
 * tolerance; every byte outside them (padding, tail) untouched; the inputs
 * untouched; a kernel flagged DETERMINISTIC gives the same bits twice; and
 * a run captured in a CUDA graph and replayed gives the eager run's bits
 * (deterministic kernels) or values within tolerance. CTest runs it twice:
 * as it is, and with BP_DETERMINISTIC=1 (the backward cuDNN kernels then
 * deterministic, flagged so, and held to the same bits).
 *
 * CUDA does not survive fork(), so the suite runs without Check's fork. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "blueprint/registry.h"
#include "blueprint/status.h"
#include "bp_abi_sdk.h"
#include "test_env.h"

#define SKIP_CODE 77
#define MAX_T 4

static bp_registry *registry;
static cudaStream_t stream;

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    const cudaError_t e_ = (call);                                                       \
    ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));           \
  } while (0)

static const bp_abi_kernel *find_kernel(const char *op, const char *impl, const char *device) {
  for (int i = 0; i < bp_registry_kernel_count(registry); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(registry, i)->kernel;
    if (!strcmp(k->op, op) && !strcmp(k->impl, impl) && !strcmp(k->device, device)) return k;
  }
  ck_abort_msg("no %s kernel of %s on %s", op, impl, device);
  return NULL;
}

/* ---- tensors: a host image (sentinel padding) and a device copy ------------------- */

typedef struct tensor {
  bp_abi_tensor d;
  unsigned char *host; /* slot_bytes */
  void *dev;           /* slot_bytes on the GPU */
} tensor;

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static double rng_unit(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static size_t esize(int32_t dtype) { return dtype == BP_ABI_DTYPE_FP16 ? 2 : 4; }

/* [n,h,w,c] with padded_c = c + extra, logical elements random in
 * [-1, 1) (rounded to the dtype), everything else 0xa5 bytes (an FP32 NaN
 * pattern and an FP16 NaN pattern). */
static tensor tensor_new(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                         int64_t extra) {
  tensor t;
  memset(&t, 0, sizeof t);
  t.d.struct_size = sizeof t.d;
  t.d.dtype = dtype;
  t.d.shape[0] = n, t.d.shape[1] = h, t.d.shape[2] = w, t.d.shape[3] = c;
  t.d.padded_c = c + extra;
  t.d.stride[3] = 1, t.d.stride[2] = t.d.padded_c, t.d.stride[1] = w * t.d.padded_c;
  t.d.stride[0] = h * w * t.d.padded_c;
  t.d.slot_bytes = (uint64_t)(n * h * w * t.d.padded_c) * esize(dtype) + 16;
  t.host = malloc(t.d.slot_bytes);
  ck_assert_ptr_nonnull(t.host);
  memset(t.host, 0xa5, t.d.slot_bytes);
  BP_SDK_FOR_EACH_NHWC(&t.d, in, ih, iw, ic) {
    const float v = (float)(2.0 * rng_unit() - 1.0);
    const int64_t e = bp_sdk_offset(&t.d, in, ih, iw, ic);
    if (dtype == BP_ABI_DTYPE_FP16) {
      const uint16_t hv = bp_sdk_fp32_to_fp16(v);
      memcpy(t.host + e * 2, &hv, 2);
    } else {
      memcpy(t.host + e * 4, &v, 4);
    }
  }
  CUDA_OK(cudaMalloc(&t.dev, t.d.slot_bytes));
  CUDA_OK(cudaMemcpy(t.dev, t.host, t.d.slot_bytes, cudaMemcpyHostToDevice));
  return t;
}

static void tensor_free(tensor *t) {
  free(t->host);
  if (t->dev) cudaFree(t->dev);
  memset(t, 0, sizeof *t);
}

static float value_at(const bp_abi_tensor *d, const unsigned char *bytes, int64_t e) {
  if (d->dtype == BP_ABI_DTYPE_FP16) {
    uint16_t h;
    memcpy(&h, bytes + e * 2, 2);
    return bp_sdk_fp16_to_fp32(h);
  }
  float f;
  memcpy(&f, bytes + e * 4, 4);
  return f;
}

/* 1 at every byte of a logical element of d (slot_bytes entries). */
static unsigned char *logical_mask(const bp_abi_tensor *d) {
  unsigned char *m = calloc(d->slot_bytes, 1);
  ck_assert_ptr_nonnull(m);
  const size_t es = esize(d->dtype);
  BP_SDK_FOR_EACH_NHWC(d, in, ih, iw, ic)
  memset(m + bp_sdk_offset(d, in, ih, iw, ic) * (int64_t)es, 1, es);
  return m;
}

/* ---- one call ---------------------------------------------------------------------------- */

static void serial_for(void *ctx, void (*fn)(void *arg, int64_t i), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(arg, i);
}
static const bp_abi_threads one_thread = {sizeof(bp_abi_threads), 1, NULL, serial_for};
static const uint64_t generation = 1;

typedef struct call {
  bp_abi_kernel_args a;
  bp_abi_tensor in[MAX_T], out[MAX_T];
  const void *inp[MAX_T];
  void *outp[MAX_T];
  char reason[512];
} call;

static void call_init(call *c, tensor *const *ins, int nin, tensor *const *outs, int nout,
                      const void *attrs, uint32_t attr_size, int on_device) {
  memset(c, 0, sizeof *c);
  c->a.struct_size = sizeof c->a;
  c->a.num_inputs = nin, c->a.num_outputs = nout;
  for (int i = 0; i < nin; i++)
    c->in[i] = ins[i]->d, c->inp[i] = on_device ? ins[i]->dev : ins[i]->host;
  for (int o = 0; o < nout; o++)
    c->out[o] = outs[o]->d, c->outp[o] = on_device ? outs[o]->dev : outs[o]->host;
  c->a.inputs = c->in, c->a.outputs = c->out;
  c->a.input_ptrs = c->inp, c->a.output_ptrs = c->outp;
  c->a.attrs = attrs, c->a.attr_size = attr_size, c->a.attr_version = BP_ABI_ATTR_VERSION;
  c->a.world_size = 1;
  c->a.params_generation = &generation;
  c->a.reason = c->reason, c->a.reason_size = sizeof c->reason;
  c->a.threads = &one_thread;
}

/* The reference kernel on host copies of the tensors; the outputs' images
 * are replaced by its results. */
static void run_reference(const char *op, tensor *const *ins, int nin, tensor *const *outs,
                          int nout, const void *attrs, uint32_t attr_size) {
  const bp_abi_kernel *k = find_kernel(op, "reference", "cpu");
  call c;
  call_init(&c, ins, nin, outs, nout, attrs, attr_size, 0);
  const uint64_t ws = k->workspace_size ? k->workspace_size(k->user, &c.a) : 0;
  void *w = ws ? malloc(ws) : NULL;
  c.a.workspace = w, c.a.workspace_bytes = ws;
  const int rc = k->run(k->user, &c.a);
  free(w);
  ck_assert_msg(rc == BP_ABI_OK, "reference %s: %s", op, c.reason);
}

/* Which run the GPU kernel makes. */
enum { EAGER, CAPTURED };

/* The GPU kernel with its workspace and state; the outputs' device
 * buffers hold its results afterwards. */
static void run_gpu(const bp_abi_kernel *k, tensor *const *ins, int nin, tensor *const *outs,
                    int nout, const void *attrs, uint32_t attr_size, int how) {
  call c;
  call_init(&c, ins, nin, outs, nout, attrs, attr_size, 1);
  char why[512] = "";
  ck_assert_msg(k->supports(k->user, &c.a, why, sizeof why), "%s/%s refuses: %s", k->op, k->impl,
                why);
  const uint64_t ws = k->workspace_size ? k->workspace_size(k->user, &c.a) : 0;
  void *w = NULL;
  if (ws) CUDA_OK(cudaMalloc(&w, ws));
  c.a.workspace = w, c.a.workspace_bytes = ws;
  c.a.stream = stream;
  void *state = NULL;
  if (k->prepare) ck_assert_msg(k->prepare(k->user, &c.a, &state) == BP_ABI_OK, "%s prepare: %s",
                                k->op, c.reason);
  c.a.state = state;
  if (how == EAGER) {
    ck_assert_msg(k->run(k->user, &c.a) == BP_ABI_OK, "%s/%s run: %s", k->op, k->impl, c.reason);
  } else {
    /* a warm-up run (libraries may load code on first use), then the outputs
     * restored and the captured run replayed */
    ck_assert_msg(k->run(k->user, &c.a) == BP_ABI_OK, "%s/%s run: %s", k->op, k->impl, c.reason);
    CUDA_OK(cudaStreamSynchronize(stream));
    for (int o = 0; o < nout; o++)
      CUDA_OK(cudaMemcpy(outs[o]->dev, outs[o]->host, outs[o]->d.slot_bytes,
                         cudaMemcpyHostToDevice));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = k->run(k->user, &c.a);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ck_assert_msg(rc == BP_ABI_OK, "%s/%s captured run: %s", k->op, k->impl, c.reason);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  if (k->release && state) k->release(k->user, state);
  if (w) CUDA_OK(cudaFree(w));
}

/* Device bytes of t. */
static unsigned char *fetch(const tensor *t) {
  unsigned char *b = malloc(t->d.slot_bytes);
  ck_assert_ptr_nonnull(b);
  CUDA_OK(cudaMemcpy(b, t->dev, t->d.slot_bytes, cudaMemcpyDeviceToHost));
  return b;
}

/* ---- one pass of one case ---------------------------------------------------------------- */

/* GPU results of `out` (device) against the reference's (ref host image,
 * computed from the same initial image `before`): every byte outside the
 * logical elements as before, and each logical element within
 * atol * max|ref| + rtol * |ref|, max over the tensor: a sum of many terms
 * carries an absolute error that scales with the terms, not with the
 * (possibly small) result. FP32 (TF32 off): atol 3e-5, rtol 2e-5 (the
 * reference sums some passes in float in another order; cuDNN may pick a
 * Winograd or FFT algorithm). FP16: atol 2e-3,
 * rtol 4e-3 (both round each output to FP16 once: at most an ulp apart). */
static void compare(const char *what, const tensor *out, const unsigned char *gpu,
                    const unsigned char *ref, const unsigned char *before) {
  const bp_abi_tensor *d = &out->d;
  const int fp16 = d->dtype == BP_ABI_DTYPE_FP16;
  const double rtol = fp16 ? 4e-3 : 2e-5, atol = fp16 ? 2e-3 : 3e-5;
  unsigned char *mask = logical_mask(d);
  for (uint64_t b = 0; b < d->slot_bytes; b++)
    if (!mask[b])
      ck_assert_msg(gpu[b] == before[b], "%s: byte %llu outside the logical elements changed",
                    what, (unsigned long long)b);
  free(mask);
  double scale = 0.0;
  BP_SDK_FOR_EACH_NHWC(d, in, ih, iw, ic) {
    const double r = fabs(value_at(d, ref, bp_sdk_offset(d, in, ih, iw, ic)));
    if (r > scale) scale = r;
  }
  BP_SDK_FOR_EACH_NHWC(d, in, ih, iw, ic) {
    const int64_t e = bp_sdk_offset(d, in, ih, iw, ic);
    const double g = value_at(d, gpu, e), r = value_at(d, ref, e);
    const double tol = atol * (scale > 1.0 ? scale : 1.0) + rtol * fabs(r);
    ck_assert_msg(isfinite(g) && fabs(g - r) <= tol,
                  "%s: element (%lld,%lld,%lld,%lld): gpu %.9g, reference %.9g (tolerance "
                  "%.3g)", what, (long long)in, (long long)ih, (long long)iw, (long long)ic, g, r,
                  tol);
  }
}

/* Runs op on the GPU kernel k and on the reference with the same tensors
 * and compares every output; checks the inputs untouched, repeatability
 * of a DETERMINISTIC kernel, and a captured replay. */
static void check_pass(const bp_abi_kernel *k, const char *name, tensor *const *ins, int nin,
                       tensor *const *outs, int nout, const void *attrs, uint32_t attr_size) {
  char what[256];
  unsigned char *before[MAX_T], *ref[MAX_T], *gpu[MAX_T];
  /* an input may have been an output of the previous pass (y, then dy):
   * its device copy starts as its host image */
  for (int i = 0; i < nin; i++)
    CUDA_OK(cudaMemcpy(ins[i]->dev, ins[i]->host, ins[i]->d.slot_bytes, cudaMemcpyHostToDevice));
  for (int o = 0; o < nout; o++) {
    before[o] = malloc(outs[o]->d.slot_bytes);
    ck_assert_ptr_nonnull(before[o]);
    memcpy(before[o], outs[o]->host, outs[o]->d.slot_bytes);
    CUDA_OK(cudaMemcpy(outs[o]->dev, outs[o]->host, outs[o]->d.slot_bytes,
                       cudaMemcpyHostToDevice));
  }
  run_gpu(k, ins, nin, outs, nout, attrs, attr_size, EAGER);
  for (int o = 0; o < nout; o++) gpu[o] = fetch(outs[o]);
  for (int i = 0; i < nin; i++) {
    unsigned char *now = fetch(ins[i]);
    ck_assert_msg(memcmp(now, ins[i]->host, ins[i]->d.slot_bytes) == 0, "%s %s: input %d changed",
                  k->op, name, i);
    free(now);
  }
  run_reference(k->op, ins, nin, outs, nout, attrs, attr_size); /* host images now the results */
  for (int o = 0; o < nout; o++) {
    ref[o] = malloc(outs[o]->d.slot_bytes);
    ck_assert_ptr_nonnull(ref[o]);
    memcpy(ref[o], outs[o]->host, outs[o]->d.slot_bytes);
    memcpy(outs[o]->host, before[o], outs[o]->d.slot_bytes); /* back to the initial image */
    snprintf(what, sizeof what, "%s/%s %s output %d", k->op, k->impl, name, o);
    compare(what, outs[o], gpu[o], ref[o], before[o]);
  }
  const int deterministic = (k->flags & BP_ABI_KERNEL_DETERMINISTIC) != 0;
  if (deterministic) { /* the same bits again */
    for (int o = 0; o < nout; o++)
      CUDA_OK(cudaMemcpy(outs[o]->dev, before[o], outs[o]->d.slot_bytes,
                         cudaMemcpyHostToDevice));
    run_gpu(k, ins, nin, outs, nout, attrs, attr_size, EAGER);
    for (int o = 0; o < nout; o++) {
      unsigned char *again = fetch(outs[o]);
      ck_assert_msg(memcmp(again, gpu[o], outs[o]->d.slot_bytes) == 0,
                    "%s/%s %s: a DETERMINISTIC kernel gave other bits on a second run", k->op,
                    k->impl, name);
      free(again);
    }
  }
  /* captured in a graph and replayed (run_gpu restores the outputs first) */
  run_gpu(k, ins, nin, outs, nout, attrs, attr_size, CAPTURED);
  for (int o = 0; o < nout; o++) {
    unsigned char *replay = fetch(outs[o]);
    snprintf(what, sizeof what, "%s/%s %s output %d (graph replay)", k->op, k->impl, name, o);
    if (deterministic)
      ck_assert_msg(memcmp(replay, gpu[o], outs[o]->d.slot_bytes) == 0,
                    "%s: other bits than the eager run", what);
    else
      compare(what, outs[o], replay, ref[o], before[o]);
    free(replay);
    free(before[o]), free(ref[o]), free(gpu[o]);
  }
}

/* ---- conv2d ------------------------------------------------------------------------------ */

typedef struct conv_case {
  int64_t n, h, w, c, k;
  int32_t kh, kw, sh, sw, ph, pw, dh, dw, groups, bias;
  int64_t xpad, ypad, wpad, bpad; /* extra channels of x/dx, y/dy, w/dw, b/db */
} conv_case;

static const conv_case conv_cases[] = {
    {2, 7, 6, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},   /* dense, bias */
    {2, 9, 8, 5, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 3, 2, 0, 2},    /* padded x, y, b; stride 2 */
    {1, 8, 8, 8, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1, 0, 0, 0, 0, 0},    /* dilation 2 */
    {2, 6, 6, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1, 0, 0, 0, 0},    /* groups 2 */
    {1, 7, 7, 8, 8, 3, 3, 2, 1, 1, 1, 1, 1, 8, 0, 0, 0, 0, 0},    /* depthwise */
    {2, 5, 5, 6, 10, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 2, 6, 3, 6},   /* 1x1, padded filter */
    {4, 28, 28, 1, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3, 0, 0, 0}, /* CNN's first layer, x 1->4 */
    {2, 14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
};

static void conv_case_run(const conv_case *g, int32_t dtype, int accumulate) {
  const int64_t oh = (g->h + 2 * g->ph - (g->dh * (g->kh - 1) + 1)) / g->sh + 1;
  const int64_t ow = (g->w + 2 * g->pw - (g->dw * (g->kw - 1) + 1)) / g->sw + 1;
  char name[160];
  snprintf(name, sizeof name, "%s acc%d N%lld %lldx%lld C%lld(+%lld) K%lld(+%lld) k%dx%d s%d,%d "
           "p%d,%d d%d,%d g%d bias%d", bp_sdk_dtype_name(dtype), accumulate, (long long)g->n,
           (long long)g->h, (long long)g->w, (long long)g->c, (long long)g->xpad,
           (long long)g->k, (long long)g->ypad, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh,
           g->dw, g->groups, g->bias);
  const bp_conv2d_attrs a = {.kernel_h = g->kh, .kernel_w = g->kw, .stride_h = g->sh,
                             .stride_w = g->sw, .pad_h = g->ph, .pad_w = g->pw,
                             .dilation_h = g->dh, .dilation_w = g->dw, .groups = g->groups,
                             .has_bias = g->bias, .accumulate = accumulate};
  tensor x = tensor_new(dtype, g->n, g->h, g->w, g->c, g->xpad);
  tensor w = tensor_new(dtype, g->k, g->kh, g->kw, g->c / g->groups, g->wpad);
  tensor b = tensor_new(dtype, 1, 1, 1, g->k, g->bpad);
  tensor y = tensor_new(dtype, g->n, oh, ow, g->k, g->ypad);
  tensor *fin[3] = {&x, &w, &b}, *fout[1] = {&y};
  tensor *din[2] = {&y, &w}, *dout[1] = {&x};
  tensor *fiin[2] = {&x, &y}, *fiout[2] = {&w, &b};
  if (!accumulate) /* the forward has no accumulate flag: run it once */
    check_pass(find_kernel("conv2d.fwd", "cudnn", "cuda"), name, fin, 2 + g->bias, fout, 1, &a,
               sizeof a);
  check_pass(find_kernel("conv2d.bwd_data", "cudnn", "cuda"), name, din, 2, dout, 1, &a, sizeof a);
  check_pass(find_kernel("conv2d.bwd_filter", "cudnn", "cuda"), name, fiin, 2, fiout,
             1 + g->bias, &a, sizeof a);
  tensor_free(&x), tensor_free(&w), tensor_free(&b), tensor_free(&y);
}

START_TEST(cudnn_conv2d_matches_the_reference) {
  const int32_t dtypes[2] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16};
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
    for (int d = 0; d < 2; d++)
      for (int acc = 0; acc < 2; acc++) conv_case_run(&conv_cases[i], dtypes[d], acc);
}
END_TEST

/* ---- fc ---------------------------------------------------------------------------------- */

typedef struct fc_case {
  int64_t n, h, w, c, o;
  int32_t bias;
  int64_t xpad, ypad, wpad, bpad;
} fc_case;

static const fc_case fc_cases[] = {
    {3, 1, 1, 7, 5, 1, 0, 0, 0, 0},    {4, 1, 1, 9, 6, 1, 7, 2, 7, 2},  /* padded, H = W = 1 */
    {2, 2, 2, 3, 4, 1, 5, 0, 0, 0},    /* padded x with H*W > 1: staged */
    {1, 1, 1, 300, 129, 1, 0, 0, 0, 0}, {16, 7, 7, 64, 10, 1, 0, 6, 0, 6},
    {7, 2, 5, 3, 1, 0, 1, 7, 0, 0},
};

static void fc_case_run(const fc_case *g, int32_t dtype, int accumulate) {
  char name[160];
  snprintf(name, sizeof name, "%s acc%d N%lld %lldx%lldx%lld(+%lld) -> %lld(+%lld) w+%lld bias%d",
           bp_sdk_dtype_name(dtype), accumulate, (long long)g->n, (long long)g->h,
           (long long)g->w, (long long)g->c, (long long)g->xpad, (long long)g->o,
           (long long)g->ypad, (long long)g->wpad, g->bias);
  const bp_fc_attrs a = {.has_bias = g->bias, .accumulate = accumulate};
  tensor x = tensor_new(dtype, g->n, g->h, g->w, g->c, g->xpad);
  tensor w = tensor_new(dtype, g->o, 1, 1, g->h * g->w * g->c, g->wpad);
  tensor b = tensor_new(dtype, 1, 1, 1, g->o, g->bpad);
  tensor y = tensor_new(dtype, g->n, 1, 1, g->o, g->ypad);
  tensor *fin[3] = {&x, &w, &b}, *fout[1] = {&y};
  tensor *din[2] = {&y, &w}, *dout[1] = {&x};
  tensor *fiin[2] = {&x, &y}, *fiout[2] = {&w, &b};
  if (!accumulate)
    check_pass(find_kernel("fc.fwd", "cublas", "cuda"), name, fin, 2 + g->bias, fout, 1, &a,
               sizeof a);
  check_pass(find_kernel("fc.bwd_data", "cublas", "cuda"), name, din, 2, dout, 1, &a, sizeof a);
  check_pass(find_kernel("fc.bwd_filter", "cublas", "cuda"), name, fiin, 2, fiout, 1 + g->bias,
             &a, sizeof a);
  tensor_free(&x), tensor_free(&w), tensor_free(&b), tensor_free(&y);
}

START_TEST(cublas_fc_matches_the_reference) {
  const int32_t dtypes[2] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16};
  for (size_t i = 0; i < sizeof fc_cases / sizeof fc_cases[0]; i++)
    for (int d = 0; d < 2; d++)
      for (int acc = 0; acc < 2; acc++) fc_case_run(&fc_cases[i], dtypes[d], acc);
}
END_TEST

/* Mixed dtypes and a bad attribute are refused with a reason. */
START_TEST(refusals_say_why) {
  tensor x = tensor_new(BP_ABI_DTYPE_FP16, 2, 1, 1, 4, 0);
  tensor w = tensor_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 4, 0);
  tensor y = tensor_new(BP_ABI_DTYPE_FP16, 2, 1, 1, 3, 0);
  tensor *in[2] = {&x, &w}, *out[1] = {&y};
  const bp_fc_attrs a = {.has_bias = 0, .accumulate = 0};
  call c;
  call_init(&c, in, 2, out, 1, &a, sizeof a, 1);
  const bp_abi_kernel *k = find_kernel("fc.fwd", "cublas", "cuda");
  char why[256] = "";
  ck_assert_int_eq(k->supports(k->user, &c.a, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "mixed dtypes") != NULL, "%s", why);
  tensor w16 = tensor_new(BP_ABI_DTYPE_FP16, 3, 1, 1, 4, 0);
  tensor *in16[2] = {&x, &w16};
  const bp_conv2d_attrs ca = {.kernel_h = 1, .kernel_w = 1, .stride_h = 1, .stride_w = 1,
                              .dilation_h = 1, .dilation_w = 1, .groups = 0};
  call_init(&c, in16, 2, out, 1, &ca, sizeof ca, 1);
  k = find_kernel("conv2d.fwd", "cudnn", "cuda");
  ck_assert_int_eq(k->supports(k->user, &c.a, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "groups 0") != NULL, "%s", why);
  tensor_free(&x), tensor_free(&w), tensor_free(&w16), tensor_free(&y);
}
END_TEST

/* Every kernel is GRAPH_CAPTURABLE; the cuBLAS ones and the cuDNN forward
 * are DETERMINISTIC, the cuDNN backward ones exactly when
 * BP_DETERMINISTIC=1 was set before the module loaded. */
START_TEST(flags_follow_the_switches) {
  const char *env = getenv("BP_DETERMINISTIC");
  const int det = env && strcmp(env, "1") == 0;
  const struct {
    const char *op, *impl;
    int deterministic;
  } want[] = {{"conv2d.fwd", "cudnn", 1},       {"conv2d.bwd_data", "cudnn", det},
              {"conv2d.bwd_filter", "cudnn", det}, {"fc.fwd", "cublas", 1},
              {"fc.bwd_data", "cublas", 1},        {"fc.bwd_filter", "cublas", 1}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const bp_abi_kernel *k = find_kernel(want[i].op, want[i].impl, "cuda");
    ck_assert_msg(k->flags & BP_ABI_KERNEL_GRAPH_CAPTURABLE, "%s", want[i].op);
    ck_assert_msg(!!(k->flags & BP_ABI_KERNEL_DETERMINISTIC) == want[i].deterministic,
                  "%s/%s: deterministic flag %d, want %d", want[i].op, want[i].impl,
                  !!(k->flags & BP_ABI_KERNEL_DETERMINISTIC), want[i].deterministic);
  }
}
END_TEST

static int load(const char *path) {
  if (bp_registry_load(registry, path) != BP_OK) {
    fprintf(stderr, "loading %s: %s\n", path, bp_last_error());
    return -1;
  }
  return 0;
}

int main(void) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n",
           err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices");
    return SKIP_CODE;
  }
  /* FP32 without TF32, so FP32 results are compared tightly */
  setenv("BP_TF32", "0", 1); /* with BP_DETERMINISTIC from CTest: module options */
  if (bp_registry_create_with(bp_test_registry_options(), &registry) != BP_OK || load(BP_OPS_REFERENCE_PATH) != 0 ||
      load(BP_OPS_CUDNN_PATH) != 0 || load(BP_OPS_CUBLAS_PATH) != 0)
    return EXIT_FAILURE;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "cudaStreamCreate failed\n");
    return EXIT_FAILURE;
  }
  Suite *suite = suite_create("ops_cudnn_cublas");
  TCase *tc = tcase_create("gpu");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, cudnn_conv2d_matches_the_reference);
  tcase_add_test(tc, cublas_fc_matches_the_reference);
  tcase_add_test(tc, refusals_say_why);
  tcase_add_test(tc, flags_follow_the_switches);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  cudaStreamDestroy(stream);
  bp_registry_destroy(registry);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
