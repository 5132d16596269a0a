/* fully connected forward, backward-data and backward-filter through
 * cublasGemmEx. Same contract as ops/reference/fc.c (bp_abi_ops.h):
 *   x  [N, H, W, C]     X [N, F] row-major, F = H*W*C
 *   w  [O, 1, 1, F]     W [O, F]
 *   y  [N, 1, 1, O]     Y [N, O]
 *   b  [1, 1, 1, O]     bias (has_bias)
 *
 * Row-major onto column-major: a row-major M x K matrix with leading
 * dimension ld is the column-major K x M matrix (its transpose) with the
 * same ld, so each product is computed transposed:
 *   forward          Y = X W^T        Y^T (O x N) = W^T[op T] (O x F) * X^T (F x N)
 *                    gemm(T, N, m O, n N, k F, A w ldw, B x ldx, C y ldy)
 *   backward-data    dX = dY W        dX^T (F x N) = W^T (F x O) * dY^T (O x N)
 *                    gemm(N, N, m F, n N, k O, A w ldw, B dy ldy, C dx ldx)
 *   backward-filter  dW = dY^T X      dW^T (F x O) = X^T (F x N) * dY[op T] (N x O)
 *                    gemm(N, T, m F, n O, k N, A x ldx, B dy ldy, C dw ldw)
 * with ld the stride from one row (dimension 0) to the next. A tensor
 * whose row is not one dense run (x with channel padding and H*W > 1, or
 * any channel stride other than 1) is staged through a dense copy in the
 * workspace (ops/shared/cuda_weighted.h); channel padding of y, dy, w, dw
 * or of an x with H = W = 1 only widens ld and is never read or written.
 *
 * Dtypes: all FP32 (CUBLAS_COMPUTE_32F_FAST_TF32, or CUBLAS_COMPUTE_32F
 * under BP_TF32=0) or all FP16 (CUBLAS_COMPUTE_32F: FP32 products and
 * sums, each output rounded to FP16 once). alpha = 1; beta = accumulate
 * in the backward passes (the sum is added in FP32 and rounded once); the
 * forward with a bias first writes the bias into y and runs with beta = 1.
 * db is our own deterministic column sum (shared/cuda_tensor_ops.h).
 *
 * State (prepare): a cuBLAS handle. Every run sets its stream and then its
 * workspace (cublasSetStream resets the workspace to cuBLAS's own pool,
 * which allocates): the last FC_CUBLAS_WORKSPACE bytes of the kernel's
 * workspace. So run() never allocates or synchronizes (except with a
 * NULL stream, a synchronous run): every kernel may be captured in a CUDA
 * graph. cuBLAS gives the same bits for the same call, device and
 * workspace (atomics stay off): every kernel is DETERMINISTIC. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cublas-impl.h"
#include "shared/cuda_tensor_ops.h"
#include "shared/cuda_weighted.h"

/* cuBLAS's own recommendation for Hopper (its default pool there). */
#define FC_CUBLAS_WORKSPACE (UINT64_C(32) << 20)

/* The checked call in plain numbers; zeroed first and free of padding, so
 * two plans compare with memcmp. */
typedef struct fc_plan {
  int32_t pass, fp16, has_bias, accumulate;
  int32_t n, f, o;
  int32_t stage_x, stage_w, stage_y;
  int32_t ldx, ldw, ldy; /* leading dimensions cuBLAS sees (the dense copy's when staged) */
  int32_t tf32;          /* the context's (cublas_user): FP32 GEMMs may run on TF32 */
  ops_cuda_layout x, w, y; /* x / dx, w / dw, y / dy as the call lays them out */
  int64_t b_stride, chunks;
  uint64_t off_x, off_w, off_y, off_part, off_cublas; /* from the aligned workspace base */
  uint64_t bytes; /* the whole workspace, alignment slack included */
} fc_plan;

/* 1 and *ld when every row (dimension 0) of l holds its H*W*C elements as
 * one dense run in NHWC order; ld is the element distance of two rows. */
static int fc_matrix(const ops_cuda_layout *l, int64_t *ld) {
  int64_t inner = 1;
  for (int d = 3; d >= 1; d--) {
    if (l->shape[d] > 1 && l->stride[d] != inner) return 0;
    inner *= l->shape[d];
  }
  *ld = l->shape[0] > 1 ? l->stride[0] : inner;
  return 1;
}

/* The operand of one tensor: in place with its ld, or staged (dense, ld =
 * the row's elements). 1, or 0 with a reason when ld exceeds a BLAS int. */
static int fc_operand(const ops_cuda_layout *l, const char *name, int32_t *staged, int32_t *ld,
                      char *reason, size_t rs) {
  int64_t v = 0;
  *staged = !fc_matrix(l, &v);
  if (*staged) v = l->shape[1] * l->shape[2] * l->shape[3];
  if (v > INT32_MAX)
    return bp_sdk_fail(reason, rs, "%s: leading dimension %lld exceeds cuBLAS's int", name,
                       (long long)v);
  *ld = (int32_t)v;
  return 1;
}

/* ops_fc_check with the pass as a constant (so the compiler sees every
 * role bound). */
static int fc_check(const bp_abi_kernel_args *args, ops_pass pass, ops_fc_geom *g, char *reason,
                    size_t rs) {
  switch (pass) {
    case OPS_PASS_FWD: return ops_fc_check(args, OPS_PASS_FWD, g, reason, rs);
    case OPS_PASS_BWD_DATA: return ops_fc_check(args, OPS_PASS_BWD_DATA, g, reason, rs);
    case OPS_PASS_BWD_FILTER: return ops_fc_check(args, OPS_PASS_BWD_FILTER, g, reason, rs);
  }
  return bp_sdk_fail(reason, rs, "unknown pass %d", (int)pass);
}

/* The pass of a kernel (its user: a cublas_user, cublas-impl.h). */
static ops_pass pass_of(const void *user) { return ((const cublas_user *)user)->pass; }

static int fc_plan_make(const bp_abi_kernel_args *args, const void *user, fc_plan *p,
                        char *reason, size_t rs) {
  const ops_pass pass = pass_of(user);
  memset(p, 0, sizeof *p);
  p->tf32 = ((const cublas_user *)user)->tf32;
  ops_cuda_view v;
  ops_fc_geom g;
  memset(&g, 0, sizeof g); /* filled by the check; zeroed for the compiler */
  if (!ops_cuda_view_make(args, &v, reason, rs) || !fc_check(&v.args, pass, &g, reason, rs))
    return 0;
  if (g.n > INT32_MAX || g.f > INT32_MAX || g.o > INT32_MAX)
    return bp_sdk_fail(reason, rs, "N %lld, H*W*C %lld or outputs %lld exceeds cuBLAS's int",
                       (long long)g.n, (long long)g.f, (long long)g.o);
  p->pass = (int32_t)pass;
  p->fp16 = v.dtype == BP_ABI_DTYPE_FP16;
  p->has_bias = g.has_bias, p->accumulate = pass == OPS_PASS_FWD ? 0 : g.accumulate;
  p->n = (int32_t)g.n, p->f = (int32_t)g.f, p->o = (int32_t)g.o;
  p->x = ops_cuda_layout_of(g.x), p->w = ops_cuda_layout_of(g.w), p->y = ops_cuda_layout_of(g.y);
  p->b_stride = g.b ? g.b->stride[3] : 0;
  if (!fc_operand(&p->x, pass == OPS_PASS_BWD_DATA ? "dx" : "x", &p->stage_x, &p->ldx, reason,
                  rs) ||
      !fc_operand(&p->w, pass == OPS_PASS_BWD_FILTER ? "dw" : "w", &p->stage_w, &p->ldw, reason,
                  rs) ||
      !fc_operand(&p->y, pass == OPS_PASS_FWD ? "y" : "dy", &p->stage_y, &p->ldy, reason, rs))
    return 0;

  const uint64_t esize = p->fp16 ? 2 : 4;
  uint64_t off = 0;
  if (p->stage_x) p->off_x = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->x));
  if (p->stage_w) p->off_w = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->w));
  if (p->stage_y) p->off_y = off, off += ops_cuda_round(esize * (uint64_t)ops_cuda_count(&p->y));
  if (pass == OPS_PASS_BWD_FILTER && p->has_bias) {
    p->chunks = ops_cuda_bias_chunks(g.n);
    p->off_part = off;
    off += ops_cuda_round((uint64_t)p->chunks * (uint64_t)g.o * sizeof(double));
  }
  p->off_cublas = off;
  p->bytes = OPS_CUDA_ALIGN + off + FC_CUBLAS_WORKSPACE;
  return 1;
}

static int fc_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  fc_plan p;
  return fc_plan_make(args, user, &p, reason, rs);
}

static uint64_t fc_workspace_size(void *user, const bp_abi_kernel_args *args) {
  fc_plan p;
  return fc_plan_make(args, user, &p, NULL, 0) ? p.bytes : 0;
}

/* ---- state ------------------------------------------------------------------------------ */

typedef struct fc_state {
  fc_plan p;
  cublasHandle_t handle;
} fc_state;

static void fc_release(void *user, void *state) {
  (void)user;
  fc_state *s = state;
  if (!s) return;
  if (s->handle) cublasDestroy(s->handle);
  free(s);
}

static int cublas_status_error(cublasStatus_t st) {
  return st == CUBLAS_STATUS_ALLOC_FAILED ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

static int fc_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  *state_out = NULL;
  fc_state *s = calloc(1, sizeof *s);
  if (!s) {
    bp_sdk_set_reason(args, "out of memory for the cuBLAS node state");
    return BP_ABI_ERR_NOMEM;
  }
  if (!fc_plan_make(args, user, &s->p, reason, rs)) {
    free(s);
    return BP_ABI_ERR_INVALID;
  }
  cublasStatus_t st = cublasCreate(&s->handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    s->handle = NULL;
    cublas_fail(reason, rs, "cublasCreate", st);
    fc_release(user, s);
    return cublas_status_error(st);
  }
  /* TF32 only where the compute type asks (CUBLAS_COMPUTE_32F_FAST_TF32) */
  st = cublasSetMathMode(s->handle, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublas_fail(reason, rs, "cublasSetMathMode", st);
    fc_release(user, s);
    return cublas_status_error(st);
  }
  *state_out = s;
  return BP_ABI_OK;
}

/* ---- run --------------------------------------------------------------------------------- */

static int cublas_result(const bp_abi_kernel_args *args, const char *what, cublasStatus_t st) {
  if (st == CUBLAS_STATUS_SUCCESS) return BP_ABI_OK;
  cublas_fail(bp_sdk_args_reason(args), bp_sdk_args_reason_size(args), what, st);
  return cublas_status_error(st);
}

#define RUN_TRY(expr)                  \
  do {                                 \
    const int rc_ = (expr);            \
    if (rc_ != BP_ABI_OK) return rc_; \
  } while (0)

/* One GEMM of the plan's dtype and compute type; extents and leading
 * dimensions were checked to fit an int by fc_plan_make. */
static int fc_gemm(const bp_abi_kernel_args *args, const fc_state *s, cublasOperation_t ta,
                   cublasOperation_t tb, int32_t m, int32_t n, int32_t k, const void *a,
                   int32_t lda, const void *b, int32_t ldb, const float *beta, void *c,
                   int32_t ldc) {
  const cudaDataType_t dt = s->p.fp16 ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute = !s->p.fp16 && s->p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                : CUBLAS_COMPUTE_32F;
  const float one = 1.0f;
  return cublas_result(args, "cublasGemmEx",
                       cublasGemmEx(s->handle, ta, tb, m, n, k, &one, a, dt, lda, b, dt, ldb,
                                    beta, c, dt, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

static int fc_run(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  const ops_pass pass = pass_of(user);
  fc_state *s = bp_sdk_args_state(args);
  if (!s) {
    bp_sdk_set_reason(args, "no node state: the host did not call prepare()");
    return BP_ABI_ERR_INVALID;
  }
  fc_plan p;
  if (!fc_plan_make(args, user, &p, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (memcmp(&p, &s->p, sizeof p) != 0) {
    bp_sdk_set_reason(args, "the call's tensors or attributes differ from those prepare() saw");
    return BP_ABI_ERR_INVALID;
  }
  if (!args->workspace || args->workspace_bytes < p.bytes) {
    bp_sdk_set_reason(args, "workspace of %llu bytes, the kernel needs %llu",
                      (unsigned long long)args->workspace_bytes, (unsigned long long)p.bytes);
    return BP_ABI_ERR_INVALID;
  }
  char *base = ops_cuda_workspace_base(args);
  const int esize = p.fp16 ? 2 : 4;
  const float one = 1.0f, zero = 0.0f;
  const float *beta = p.accumulate ? &one : &zero;
  cudaStream_t stream = (cudaStream_t)args->stream;
  /* the stream first: setting it resets the workspace */
  RUN_TRY(cublas_result(args, "cublasSetStream", cublasSetStream(s->handle, stream)));
  RUN_TRY(cublas_result(args, "cublasSetWorkspace",
                        cublasSetWorkspace(s->handle, base + p.off_cublas,
                                           (size_t)FC_CUBLAS_WORKSPACE)));

  switch (pass) {
    case OPS_PASS_FWD: {
      const void *x, *w;
      void *y;
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[0], &p.x, p.stage_x, base + p.off_x,
                                esize, &x));
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[1], &p.w, p.stage_w, base + p.off_w,
                                esize, &w));
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.y, p.stage_y, 0, base + p.off_y,
                                 esize, &y));
      if (p.has_bias) { /* y = bias, then y += X W^T: one rounding */
        const ops_cuda_layout yl = p.stage_y ? ops_cuda_dense_layout(p.y.shape) : p.y;
        RUN_TRY(ops_cuda_result(args, "writing the bias",
                                ops_cuda_copy_strided(args->input_ptrs[2],
                                                      ops_cuda_bias_layout(&yl, p.b_stride), y,
                                                      yl, esize, args->stream)));
        beta = &one;
      }
      RUN_TRY(fc_gemm(args, s, CUBLAS_OP_T, CUBLAS_OP_N, p.o, p.n, p.f, w, p.ldw, x, p.ldx, beta,
                      y, p.ldy));
      RUN_TRY(ops_cuda_unstage_out(args, args->output_ptrs[0], &p.y, p.stage_y, y, esize));
      break;
    }
    case OPS_PASS_BWD_DATA: {
      const void *dy, *w;
      void *dx;
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[0], &p.y, p.stage_y, base + p.off_y,
                                esize, &dy));
      RUN_TRY(ops_cuda_stage_in(args, args->input_ptrs[1], &p.w, p.stage_w, base + p.off_w,
                                esize, &w));
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.x, p.stage_x, p.accumulate,
                                 base + p.off_x, esize, &dx));
      RUN_TRY(fc_gemm(args, s, CUBLAS_OP_N, CUBLAS_OP_N, p.f, p.n, p.o, w, p.ldw, dy, p.ldy, beta,
                      dx, p.ldx));
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
      RUN_TRY(ops_cuda_stage_out(args, args->output_ptrs[0], &p.w, p.stage_w, p.accumulate,
                                 base + p.off_w, esize, &dw));
      RUN_TRY(fc_gemm(args, s, CUBLAS_OP_N, CUBLAS_OP_T, p.f, p.o, p.n, x, p.ldx, dy, p.ldy, beta,
                      dw, p.ldw));
      RUN_TRY(ops_cuda_unstage_out(args, args->output_ptrs[0], &p.w, p.stage_w, dw, esize));
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

/* ---- descriptors ------------------------------------------------------------------------- */

/* Templates: module.c's init_ctx registers copies whose user is the
 * context's cublas_user of the pass. */
#define CUBLAS_KERNEL(op_name)                                                                 \
  {                                                                                           \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "cublas",                  \
    .device = "cuda",                                                                         \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16),      \
    .priority = BP_ABI_PRIORITY_VENDOR,                                                       \
    .flags = BP_ABI_KERNEL_GRAPH_CAPTURABLE | BP_ABI_KERNEL_DETERMINISTIC,                    \
    .supports = fc_supports, .workspace_size = fc_workspace_size, .run = fc_run,              \
    .user = NULL, .prepare = fc_prepare, .release = fc_release                                \
  }
const bp_abi_kernel cublas_fc_fwd = CUBLAS_KERNEL("fc.fwd");
const bp_abi_kernel cublas_fc_bwd_data = CUBLAS_KERNEL("fc.bwd_data");
const bp_abi_kernel cublas_fc_bwd_filter = CUBLAS_KERNEL("fc.bwd_filter");
