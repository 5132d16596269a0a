/* conv2d forward, backward-data and backward-filter through cuDNN's
 * convolution API (cudnnConvolutionForward / BackwardData /
 * BackwardFilter). Same contract as ops/reference/conv2d.c (bp_abi_ops.h):
 *   x  [N, H, W, C]        cuDNN tensor, format NHWC, N x C x H x W
 *   w  [K, kh, kw, C/G]    cuDNN filter, format NHWC, K x C/G x kh x kw
 *   y  [N, OH, OW, K]      cuDNN tensor, format NHWC
 *   b  [1, 1, 1, K]        bias / its gradient (our own kernels)
 * Cross-correlation with the attributes' padding, stride, dilation and
 * groups (cudnnSetConvolutionGroupCount).
 *
 * Dtypes: all FP32, or all FP16 (an AMP plan). FP32: compute FP32; TF32
 * Tensor Cores allowed unless BP_TF32=0 (--no-tf32; CUDNN_FMA_MATH then).
 * FP16: CUDNN_TENSOR_OP_MATH with an FP32 compute type (products and sums
 * in FP32, each output rounded to FP16 once).
 *
 * Layouts: cuDNN sees dense NHWC tensors. A tensor that is not dense
 * (channel padding, as AMP features padded to 8 or the first layer's input
 * padded to 4, or a padded filter) is staged through the workspace: its
 * logical elements are copied into a dense buffer (inputs, and an output
 * that accumulates), and an output is copied back from it; padding is
 * never read or written (rule 2 of bp_abi_ops.h).
 *
 * Accumulate: the forward overwrites y (with a bias, y is first set to the
 * bias and the convolution adds to it: beta = 1, one rounding); the
 * backward passes pass beta = accumulate to cuDNN, so the result is added
 * in FP32 and rounded once. db is our own deterministic column sum
 * (shared/cuda_tensor_ops.h).
 *
 * The algorithm: chosen once per node in prepare() from cuDNN's heuristics
 * (cudnnGetConvolution*Algorithm_v7, best first): the first whose status
 * is success, whose math type fits the settings above, which is
 * deterministic when required (always for the forward, whose algorithms
 * all are; for the backward passes under BP_DETERMINISTIC=1) and whose
 * workspace fits CONV_WORKSPACE_CAP and the plan's workspace.
 * workspace_size() runs the same choice with the module's shared handle,
 * so both agree: the heuristics depend only on the shapes, the settings
 * and the device.
 *
 * Per-node state: a cuDNN handle (its stream set on every run to
 * args->stream), the four descriptors and the algorithm. run() never
 * allocates or synchronizes (except with a NULL stream, which asks for a
 * synchronous run), so every kernel may be captured in a CUDA graph. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cudnn-impl.h"
#include "shared/cuda_tensor_ops.h"
#include "shared/cuda_weighted.h"

/* The most workspace bytes one algorithm may ask for (the plan's
 * workspace is shared by every node, so this bounds it). */
#define CONV_WORKSPACE_CAP (UINT64_C(512) << 20)
#define CONV_MAX_ALGOS 16

/* Everything a call's checked arguments say, in plain numbers (no
 * pointers into the args, so a state can keep a copy). Zeroed before it
 * is filled, so two plans compare with memcmp. */
typedef struct conv_plan {
  int32_t pass; /* ops_pass */
  int32_t tf32, deterministic; /* the context's settings (cudnn_user) */
  int32_t fp16, has_bias, accumulate;
  int32_t n, c, h, w, k, kh, kw, oh, ow, groups, cg;
  int32_t ph, pw, sh, sw, dh, dw;
  int32_t stage_x, stage_w, stage_y; /* not dense: staged through the workspace */
  ops_cuda_layout x, wl, y;          /* x / dx, w / dw, y / dy as the call lays them out */
  int64_t b_stride;                  /* channel stride of b / db */
  int64_t chunks;                    /* bias gradient chunks (bwd_filter with bias) */
  uint64_t off_x, off_w, off_y, off_part, off_algo; /* from the aligned workspace base */
  uint64_t fixed_bytes; /* the workspace without the algorithm's, alignment slack included */
} conv_plan;

static int fits_int(const ops_cuda_layout *l, const char *name, char *reason, size_t rs) {
  if (ops_cuda_count(l) > INT32_MAX)
    return bp_sdk_fail(reason, rs, "%s: %lld elements, cuDNN's convolution API takes at most "
                       "2^31 - 1", name, (long long)ops_cuda_count(l));
  return 1;
}

/* ops_conv_check with the pass as a constant (so the compiler sees every
 * role bound). */
static int conv_check(const bp_abi_kernel_args *args, ops_pass pass, ops_conv_geom *g,
                      char *reason, size_t rs) {
  switch (pass) {
    case OPS_PASS_FWD: return ops_conv_check(args, OPS_PASS_FWD, g, reason, rs);
    case OPS_PASS_BWD_DATA: return ops_conv_check(args, OPS_PASS_BWD_DATA, g, reason, rs);
    case OPS_PASS_BWD_FILTER: return ops_conv_check(args, OPS_PASS_BWD_FILTER, g, reason, rs);
  }
  return bp_sdk_fail(reason, rs, "unknown pass %d", (int)pass);
}

/* The reference's checks (the same reasons), FP16 through the view, then
 * this module's limits and the workspace layout. */
/* The pass of a kernel (its user: a cudnn_user, cudnn-impl.h). */
static ops_pass pass_of(const void *user) { return ((const cudnn_user *)user)->pass; }

static int conv_plan_make(const bp_abi_kernel_args *args, const void *user, conv_plan *p,
                          char *reason, size_t rs) {
  const cudnn_user *u = user;
  const ops_pass pass = u->pass;
  memset(p, 0, sizeof *p);
  p->tf32 = u->ctx->tf32, p->deterministic = u->ctx->deterministic;
  ops_cuda_view v;
  ops_conv_geom g;
  memset(&g, 0, sizeof g); /* filled by the check; zeroed for the compiler */
  if (!ops_cuda_view_make(args, &v, reason, rs) || !conv_check(&v.args, pass, &g, reason, rs))
    return 0;
  p->pass = (int32_t)pass;
  p->fp16 = v.dtype == BP_ABI_DTYPE_FP16;
  p->has_bias = g.has_bias, p->accumulate = pass == OPS_PASS_FWD ? 0 : g.accumulate;
  p->x = ops_cuda_layout_of(g.x), p->wl = ops_cuda_layout_of(g.w), p->y = ops_cuda_layout_of(g.y);
  if (!fits_int(&p->x, pass == OPS_PASS_BWD_DATA ? "dx" : "x", reason, rs) ||
      !fits_int(&p->wl, pass == OPS_PASS_BWD_FILTER ? "dw" : "w", reason, rs) ||
      !fits_int(&p->y, pass == OPS_PASS_FWD ? "y" : "dy", reason, rs))
    return 0;
  /* every extent below fits: each is at most its tensor's element count */
  p->n = (int32_t)g.n, p->c = (int32_t)g.c, p->h = (int32_t)g.h, p->w = (int32_t)g.w_;
  p->k = (int32_t)g.k, p->kh = (int32_t)g.kh, p->kw = (int32_t)g.kw;
  p->oh = (int32_t)g.oh, p->ow = (int32_t)g.ow, p->groups = (int32_t)g.groups;
  p->cg = (int32_t)g.cg;
  p->ph = (int32_t)g.ph, p->pw = (int32_t)g.pw, p->sh = (int32_t)g.sh, p->sw = (int32_t)g.sw;
  p->dh = (int32_t)g.dh, p->dw = (int32_t)g.dw;
  p->b_stride = g.b ? g.b->stride[3] : 0;
  p->stage_x = !ops_cuda_is_dense(&p->x);
  p->stage_w = !ops_cuda_is_dense(&p->wl);
  p->stage_y = !ops_cuda_is_dense(&p->y);

  const uint64_t esize = p->fp16 ? 2 : 4;
  uint64_t off = 0;
  if (p->stage_x) p->off_x = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->x));
  if (p->stage_w) p->off_w = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->wl));
  if (p->stage_y) p->off_y = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->y));
  if (pass == OPS_PASS_BWD_FILTER && p->has_bias) {
    p->chunks = ops_cuda_bias_chunks(g.n * g.oh * g.ow);
    p->off_part = off;
    off += ops_cuda_round((uint64_t)p->chunks * (uint64_t)g.k * sizeof(double));
  }
  p->off_algo = off;
  p->fixed_bytes = OPS_CUDA_ALIGN + off;
  return 1;
}

/* ---- descriptors and the algorithm --------------------------------------------- */

typedef struct conv_descs {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
} conv_descs;

static void descs_free(conv_descs *d) {
  if (d->x) cudnnDestroyTensorDescriptor(d->x);
  if (d->y) cudnnDestroyTensorDescriptor(d->y);
  if (d->w) cudnnDestroyFilterDescriptor(d->w);
  if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
  memset(d, 0, sizeof *d);
}

/* The math type the convolution descriptor starts with (see the top). */
static cudnnMathType_t base_math(const conv_plan *p) {
  if (p->fp16) return CUDNN_TENSOR_OP_MATH;
  return p->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* Whether a candidate's math type keeps the contract: FP32 never converts
 * its inputs to FP16, and without TF32 never uses Tensor Cores. */
static int math_ok(const conv_plan *p, cudnnMathType_t m) {
  if (p->fp16) return 1;
  if (!p->tf32) return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
  return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

/* The math type a candidate runs with: its own, except FP32 without TF32
 * always runs FMA math (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and
 * later; an algorithm cuDNN cannot run so fails its workspace query and
 * is skipped). */
static cudnnMathType_t math_run(const conv_plan *p, cudnnMathType_t m) {
  return !p->fp16 && !p->tf32 ? CUDNN_FMA_MATH : m;
}

#define CONV_TRY(call, what)                                         \
  do {                                                               \
    const cudnnStatus_t st_ = (call);                                \
    if (st_ != CUDNN_STATUS_SUCCESS) {                               \
      descs_free(d);                                                 \
      return cudnn_fail(reason, rs, what, st_);                      \
    }                                                                \
  } while (0)

/* Creates and sets the descriptors of the plan (dense NHWC); 1, or 0 with
 * a reason and nothing owned. */
static int descs_make(const conv_plan *p, conv_descs *d, char *reason, size_t rs) {
  memset(d, 0, sizeof *d);
  const cudnnDataType_t dt = p->fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  CONV_TRY(cudnnCreateTensorDescriptor(&d->x), "cudnnCreateTensorDescriptor");
  CONV_TRY(cudnnCreateTensorDescriptor(&d->y), "cudnnCreateTensorDescriptor");
  CONV_TRY(cudnnCreateFilterDescriptor(&d->w), "cudnnCreateFilterDescriptor");
  CONV_TRY(cudnnCreateConvolutionDescriptor(&d->conv), "cudnnCreateConvolutionDescriptor");
  CONV_TRY(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NHWC, dt, p->n, p->c, p->h, p->w),
           "cudnnSetTensor4dDescriptor (x)");
  CONV_TRY(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NHWC, dt, p->n, p->k, p->oh, p->ow),
           "cudnnSetTensor4dDescriptor (y)");
  CONV_TRY(cudnnSetFilter4dDescriptor(d->w, dt, CUDNN_TENSOR_NHWC, p->k, p->cg, p->kh, p->kw),
           "cudnnSetFilter4dDescriptor");
  CONV_TRY(cudnnSetConvolution2dDescriptor(d->conv, p->ph, p->pw, p->sh, p->sw, p->dh, p->dw,
                                           CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
           "cudnnSetConvolution2dDescriptor");
  CONV_TRY(cudnnSetConvolutionGroupCount(d->conv, p->groups), "cudnnSetConvolutionGroupCount");
  CONV_TRY(cudnnSetConvolutionMathType(d->conv, base_math(p)), "cudnnSetConvolutionMathType");
  int on = 0, oc = 0, oh = 0, ow = 0;
  CONV_TRY(cudnnGetConvolution2dForwardOutputDim(d->conv, d->x, d->w, &on, &oc, &oh, &ow),
           "cudnnGetConvolution2dForwardOutputDim");
  if (on != p->n || oc != p->k || oh != p->oh || ow != p->ow) {
    descs_free(d);
    return bp_sdk_fail(reason, rs, "cuDNN computes the output as %dx%dx%dx%d (NCHW), the op "
                       "as %dx%dx%dx%d", on, oc, oh, ow, p->n, p->k, p->oh, p->ow);
  }
  return 1;
}
#undef CONV_TRY

/* One heuristic result, whichever pass. */
typedef struct conv_candidate {
  int algo;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
} conv_candidate;

#define CONV_COPY_CANDIDATES(perf, got, out)                                                   \
  for (int i_ = 0; i_ < (got); i_++) {                                                         \
    (out)[i_].algo = (int)(perf)[i_].algo, (out)[i_].status = (perf)[i_].status;              \
    (out)[i_].determinism = (perf)[i_].determinism, (out)[i_].math = (perf)[i_].mathType;     \
  }

/* cuDNN's heuristic list for the plan's pass, best first. */
static cudnnStatus_t conv_candidates(cudnnHandle_t h, const conv_plan *p, const conv_descs *d,
                                     conv_candidate *out, int *got) {
  int count = 0;
  cudnnStatus_t st;
  *got = 0;
  switch ((ops_pass)p->pass) {
    case OPS_PASS_FWD: {
      cudnnConvolutionFwdAlgoPerf_t perf[CONV_MAX_ALGOS];
      st = cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count);
      if (st != CUDNN_STATUS_SUCCESS) return st;
      if (count > CONV_MAX_ALGOS) count = CONV_MAX_ALGOS;
      st = cudnnGetConvolutionForwardAlgorithm_v7(h, d->x, d->w, d->conv, d->y, count, got, perf);
      if (st == CUDNN_STATUS_SUCCESS) CONV_COPY_CANDIDATES(perf, *got, out);
      return st;
    }
    case OPS_PASS_BWD_DATA: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CONV_MAX_ALGOS];
      st = cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count);
      if (st != CUDNN_STATUS_SUCCESS) return st;
      if (count > CONV_MAX_ALGOS) count = CONV_MAX_ALGOS;
      st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->y, d->conv, d->x, count, got,
                                                       perf);
      if (st == CUDNN_STATUS_SUCCESS) CONV_COPY_CANDIDATES(perf, *got, out);
      return st;
    }
    case OPS_PASS_BWD_FILTER: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CONV_MAX_ALGOS];
      st = cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count);
      if (st != CUDNN_STATUS_SUCCESS) return st;
      if (count > CONV_MAX_ALGOS) count = CONV_MAX_ALGOS;
      st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->x, d->y, d->conv, d->w, count, got,
                                                         perf);
      if (st == CUDNN_STATUS_SUCCESS) CONV_COPY_CANDIDATES(perf, *got, out);
      return st;
    }
  }
  return CUDNN_STATUS_BAD_PARAM;
}
#undef CONV_COPY_CANDIDATES

/* Workspace bytes of `algo` for the plan's pass with the descriptors'
 * current math type. */
static cudnnStatus_t conv_algo_bytes(cudnnHandle_t h, const conv_plan *p, const conv_descs *d,
                                     int algo, size_t *bytes) {
  switch ((ops_pass)p->pass) {
    case OPS_PASS_FWD:
      return cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y,
                                                     (cudnnConvolutionFwdAlgo_t)algo, bytes);
    case OPS_PASS_BWD_DATA:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, d->w, d->y, d->conv, d->x, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    case OPS_PASS_BWD_FILTER:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, d->x, d->y, d->conv, d->w, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

/* The chosen algorithm, its math type and its workspace bytes. */
typedef struct conv_pick {
  int algo;
  cudnnMathType_t math;
  uint64_t bytes;
} conv_pick;

/* The first heuristic candidate that keeps the rules (top of the file) and
 * needs at most `limit` workspace bytes; leaves the descriptor's math type
 * at the pick's. 1, or 0 with a reason that counts what was refused. */
static int conv_choose(cudnnHandle_t h, const conv_plan *p, conv_descs *d, uint64_t limit,
                       conv_pick *pick, char *reason, size_t rs) {
  conv_candidate cand[CONV_MAX_ALGOS];
  int got = 0;
  const cudnnStatus_t st = conv_candidates(h, p, d, cand, &got);
  if (st != CUDNN_STATUS_SUCCESS) return cudnn_fail(reason, rs, "algorithm heuristics", st);
  const int need_det = p->pass == OPS_PASS_FWD || p->deterministic;
  int unsupported = 0, nondet = 0, math = 0, too_big = 0;
  for (int i = 0; i < got && i < CONV_MAX_ALGOS; i++) {
    const conv_candidate *c = &cand[i];
    if (c->status != CUDNN_STATUS_SUCCESS) {
      unsupported++;
      continue;
    }
    if (need_det && c->determinism != CUDNN_DETERMINISTIC) {
      nondet++;
      continue;
    }
    if (!math_ok(p, c->math)) {
      math++;
      continue;
    }
    size_t bytes = 0;
    const cudnnMathType_t m = math_run(p, c->math);
    if (cudnnSetConvolutionMathType(d->conv, m) != CUDNN_STATUS_SUCCESS ||
        conv_algo_bytes(h, p, d, c->algo, &bytes) != CUDNN_STATUS_SUCCESS) {
      unsupported++;
      continue;
    }
    if ((uint64_t)bytes > limit) {
      too_big++;
      continue;
    }
    pick->algo = c->algo, pick->math = m, pick->bytes = (uint64_t)bytes;
    return 1;
  }
  (void)cudnnSetConvolutionMathType(d->conv, base_math(p));
  return bp_sdk_fail(reason, rs,
                     "cuDNN offers no algorithm for this convolution: of %d candidates %d "
                     "unsupported, %d not deterministic%s, %d of another math type (TF32 %s), "
                     "%d needing more than %llu workspace bytes",
                     got, unsupported, nondet, need_det ? " (required)" : "", math,
                     p->tf32 ? "on" : "off", too_big, (unsigned long long)limit);
}

/* ---- supports, workspace_size ------------------------------------------------------ */

static int conv_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  conv_plan p;
  return conv_plan_make(args, user, &p, reason, rs);
}

typedef struct choose_job {
  const conv_plan *p;
  uint64_t bytes;
} choose_job;

static int choose_with(cudnnHandle_t h, void *arg) {
  choose_job *job = arg;
  conv_descs d;
  conv_pick pick;
  if (!descs_make(job->p, &d, NULL, 0)) return 0;
  const int ok = conv_choose(h, job->p, &d, CONV_WORKSPACE_CAP, &pick, NULL, 0);
  descs_free(&d);
  if (ok) job->bytes = pick.bytes;
  return ok;
}

/* The fixed pieces plus what the algorithm prepare() will pick needs. When
 * no algorithm can be chosen here, prepare() fails with the reason. */
static uint64_t conv_workspace_size(void *user, const bp_abi_kernel_args *args) {
  conv_plan p;
  if (!conv_plan_make(args, user, &p, NULL, 0)) return 0;
  choose_job job = {&p, 0};
  (void)cudnn_with_shared_handle(((const cudnn_user *)user)->ctx, choose_with, &job, NULL, 0);
  return p.fixed_bytes + job.bytes;
}

/* ---- state ---------------------------------------------------------------------------- */

typedef struct conv_state {
  conv_plan p;
  cudnnHandle_t handle;
  conv_descs d;
  conv_pick pick;
} conv_state;

static void conv_release(void *user, void *state) {
  (void)user;
  conv_state *s = state;
  if (!s) return;
  descs_free(&s->d);
  if (s->handle) cudnnDestroy(s->handle);
  free(s);
}

static int conv_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  *state_out = NULL;
  conv_state *s = calloc(1, sizeof *s);
  if (!s) {
    bp_sdk_set_reason(args, "out of memory for the cuDNN node state");
    return BP_ABI_ERR_NOMEM;
  }
  if (!conv_plan_make(args, user, &s->p, reason, rs)) {
    free(s);
    return BP_ABI_ERR_INVALID;
  }
  const cudnnStatus_t st = cudnnCreate(&s->handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    s->handle = NULL;
    cudnn_fail(reason, rs, "cudnnCreate", st);
    conv_release(user, s);
    return st == CUDNN_STATUS_ALLOC_FAILED ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
  }
  /* the plan's workspace may be smaller than the cap: never pick beyond it */
  uint64_t limit = args->workspace && args->workspace_bytes > s->p.fixed_bytes
                       ? args->workspace_bytes - s->p.fixed_bytes
                       : 0;
  if (limit > CONV_WORKSPACE_CAP) limit = CONV_WORKSPACE_CAP;
  if (!descs_make(&s->p, &s->d, reason, rs) ||
      !conv_choose(s->handle, &s->p, &s->d, limit, &s->pick, reason, rs)) {
    conv_release(user, s);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  *state_out = s;
  return BP_ABI_OK;
}

/* ---- run ------------------------------------------------------------------------------- */

static int cudnn_result(const bp_abi_kernel_args *args, const char *what, cudnnStatus_t st) {
  if (st == CUDNN_STATUS_SUCCESS) return BP_ABI_OK;
  cudnn_fail(bp_sdk_args_reason(args), bp_sdk_args_reason_size(args), what, st);
  return st == CUDNN_STATUS_ALLOC_FAILED ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

#define RUN_TRY(expr)                  \
  do {                                 \
    const int rc_ = (expr);            \
    if (rc_ != BP_ABI_OK) return rc_; \
  } while (0)

static int conv_run(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  const ops_pass pass = pass_of(user);
  conv_state *s = bp_sdk_args_state(args);
  if (!s) {
    bp_sdk_set_reason(args, "no node state: the host did not call prepare()");
    return BP_ABI_ERR_INVALID;
  }
  conv_plan p;
  if (!conv_plan_make(args, user, &p, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (memcmp(&p, &s->p, sizeof p) != 0) {
    bp_sdk_set_reason(args, "the call's tensors or attributes differ from those prepare() saw");
    return BP_ABI_ERR_INVALID;
  }
  const uint64_t need = p.fixed_bytes + s->pick.bytes;
  if (!args->workspace || args->workspace_bytes < need) {
    bp_sdk_set_reason(args, "workspace of %llu bytes, the chosen algorithm needs %llu",
                      (unsigned long long)args->workspace_bytes, (unsigned long long)need);
    return BP_ABI_ERR_INVALID;
  }
  char *base = ops_cuda_workspace_base(args);
  void *algo_ws = s->pick.bytes ? base + p.off_algo : NULL;
  const size_t algo_bytes = (size_t)s->pick.bytes;
  const int esize = p.fp16 ? 2 : 4;
  const float one = 1.0f, zero = 0.0f;
  const float *beta = p.accumulate ? &one : &zero;
  cudaStream_t stream = (cudaStream_t)args->stream;
  RUN_TRY(cudnn_result(args, "cudnnSetStream", cudnnSetStream(s->handle, stream)));

  switch (pass) {
    case OPS_PASS_FWD: {
      const void *x, *w;
      void *y;
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[0], &p.x, p.stage_x, base + p.off_x,
                                esize, &x));
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[1], &p.wl, p.stage_w, base + p.off_w,
                                esize, &w));
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.y, p.stage_y, 0, base + p.off_y,
                                 esize, &y));
      if (p.has_bias) { /* y = bias, then y += conv: one rounding */
        const ops_cuda_layout yl = p.stage_y ? ops_cuda_dense_layout(p.y.shape) : p.y;
        RUN_TRY(ops_cuda_result(args, "writing the bias",
                                ops_cuda_copy_strided(args->input_ptrs[2],
                                                      ops_cuda_bias_layout(&yl, p.b_stride), y,
                                                      yl, esize, args->stream)));
        beta = &one;
      }
      RUN_TRY(cudnn_result(args, "cudnnConvolutionForward",
                           cudnnConvolutionForward(s->handle, &one, s->d.x, x, s->d.w, w,
                                                   s->d.conv,
                                                   (cudnnConvolutionFwdAlgo_t)s->pick.algo,
                                                   algo_ws, algo_bytes, beta, s->d.y, y)));
      RUN_TRY(ops_cuda_unstage_out(args, args->output_ptrs[0], &p.y, p.stage_y, y, esize));
      break;
    }
    case OPS_PASS_BWD_DATA: {
      const void *dy, *w;
      void *dx;
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[0], &p.y, p.stage_y, base + p.off_y,
                                esize, &dy));
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[1], &p.wl, p.stage_w, base + p.off_w,
                                esize, &w));
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.x, p.stage_x, p.accumulate,
                                 base + p.off_x, esize, &dx));
      RUN_TRY(cudnn_result(args, "cudnnConvolutionBackwardData",
                           cudnnConvolutionBackwardData(
                               s->handle, &one, s->d.w, w, s->d.y, dy, s->d.conv,
                               (cudnnConvolutionBwdDataAlgo_t)s->pick.algo, algo_ws, algo_bytes,
                               beta, s->d.x, dx)));
      RUN_TRY(ops_cuda_unstage_out(args, args->output_ptrs[0], &p.x, p.stage_x, dx, esize));
      break;
    }
    case OPS_PASS_BWD_FILTER: {
      const void *x, *dy;
      void *dw;
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[0], &p.x, p.stage_x, base + p.off_x,
                                esize, &x));
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[1], &p.y, p.stage_y, base + p.off_y,
                                esize, &dy));
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.wl, p.stage_w, p.accumulate,
                                 base + p.off_w, esize, &dw));
      RUN_TRY(cudnn_result(args, "cudnnConvolutionBackwardFilter",
                           cudnnConvolutionBackwardFilter(
                               s->handle, &one, s->d.x, x, s->d.y, dy, s->d.conv,
                               (cudnnConvolutionBwdFilterAlgo_t)s->pick.algo, algo_ws,
                               algo_bytes, beta, s->d.w, dw)));
      RUN_TRY(ops_cuda_unstage_out(args, args->output_ptrs[0], &p.wl, p.stage_w, dw, esize));
      if (p.has_bias) /* from the call's own dy (any strides) */
        RUN_TRY(ops_cuda_result(args, "the bias gradient",
                                ops_cuda_bias_grad(args->input_ptrs[1], p.y, args->output_ptrs[1],
                                                   p.b_stride, p.fp16, p.accumulate,
                                                   (double *)(void *)(base + p.off_part),
                                                   p.chunks, args->stream)));
      break;
    }
  }
  /* a NULL stream asks for a synchronous run */
  if (!stream)
    RUN_TRY(ops_cuda_result(args, "cudaStreamSynchronize", (int)cudaStreamSynchronize(NULL)));
  return BP_ABI_OK;
}
#undef RUN_TRY

/* ---- descriptors ------------------------------------------------------------------------ */

/* Forward algorithms are always chosen deterministic (all of cuDNN's are);
 * module.c's init_ctx adds DETERMINISTIC to the backward ones under
 * BP_DETERMINISTIC=1 (in its registered copies) and points user at the
 * context's cudnn_user of the pass (the user below is the pass alone). */
#define CUDNN_KERNEL(op_name, pass, extra_flags)                                              \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "cudnn", .device = "cuda", \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16),     \
    .priority = BP_ABI_PRIORITY_VENDOR,                                                      \
    .flags = BP_ABI_KERNEL_GRAPH_CAPTURABLE | (extra_flags), .supports = conv_supports,       \
    .workspace_size = conv_workspace_size, .run = conv_run, .user = NULL,                    \
    .prepare = conv_prepare, .release = conv_release                                         \
  }
const bp_abi_kernel cudnn_conv2d_fwd =
    CUDNN_KERNEL("conv2d.fwd", OPS_PASS_FWD, BP_ABI_KERNEL_DETERMINISTIC);
const bp_abi_kernel cudnn_conv2d_bwd_data = CUDNN_KERNEL("conv2d.bwd_data", OPS_PASS_BWD_DATA, 0);
const bp_abi_kernel cudnn_conv2d_bwd_filter =
    CUDNN_KERNEL("conv2d.bwd_filter", OPS_PASS_BWD_FILTER, 0);
