/* fully connected through the provider's SGEMM (blas_sgemm): forward, backward-data,
 * backward-filter. Same contract and results (within float rounding) as
 * ops/reference/fc.c.
 *
 * Shape legend (bp_abi_ops.h):
 *   x  [N, H, W, C]     read as X [N, F], F = H*W*C, feature f = (h*W + w)*C + c
 *   w  [O, 1, 1, F]     W [O, F]
 *   b  [1, 1, 1, O]     bias (has_bias)
 *   y  [N, 1, 1, O]     Y [N, O]
 *
 *   forward          Y  = X * W^T (+ bias)      (rows set to the bias, beta 1)
 *   backward-data    dX (+)= dY * W             (beta = accumulate)
 *   backward-filter  dW (+)= dY^T * X           (beta = accumulate)
 *                    db (+)= column sums of dY  (double, row order, as the reference)
 *
 * Every operand is used in place as a matrix with a leading dimension
 * (blas-impl.h): padded channels of w, dw, y, dy and of an x / dx with
 * H = W = 1 only widen it; an x / dx with padded channels and H*W > 1 is
 * refused (its features are not adjacent). Workspace: the padded copies
 * of fc_geom (backward passes with 1 KiB-multiple leading dimensions, on
 * oneDNN, where m, n and k reach BLAS_PAD_MIN_EXTENT), else none. FP32; no
 * alignment beyond 4 bytes; the 16-byte tail is never read; outputs never
 * alias inputs. */
#include "blas-impl.h"

typedef struct fc_geom {
  ops_fc_geom r; /* the checked geometry (ops/shared/weighted_check.h) */
  blas_mat xm, wm, ym; /* [N, F], [O, F], [N, O] */
  /* operands copied with a padded leading dimension first (blas-impl.h,
   * BLAS_PAD_POW2_LD): w in backward-data, x and dy in backward-filter */
  int pad_x, pad_w, pad_y;
  uint64_t ws_bytes; /* the copies, each 64-byte aligned, + 64 to align the base; or 0 */
} fc_geom;

/* The validity checks of the reference (the same messages), then the
 * matrix layouts and the BLAS int range. */
static int fc_check(const bp_abi_kernel_args *args, ops_pass pass, fc_geom *g, char *reason,
                    size_t rs) {
  if (!ops_fc_check(args, pass, &g->r, reason, rs)) return 0;
  const char *xname = pass == OPS_PASS_BWD_DATA ? "dx" : "x";
  const char *wname = pass == OPS_PASS_BWD_FILTER ? "dw" : "w";
  const char *yname = pass == OPS_PASS_FWD ? "y" : "dy";

  /* ---- this module's own limits ---- */
  if (!blas_view(g->r.x, 1, xname, "N rows of H*W*C features", &g->xm, reason, rs) ||
      !blas_view(g->r.w, 1, wname, "O rows of F weights", &g->wm, reason, rs) ||
      !blas_view(g->r.y, 1, yname, "N rows of O outputs", &g->ym, reason, rs))
    return 0;
  if (!blas_check_int(g->r.n, "N", reason, rs) || !blas_check_int(g->r.f, "H*W*C", reason, rs) ||
      !blas_check_int(g->r.o, "the output count", reason, rs) ||
      !blas_check_int(g->xm.ld, "the image stride of x", reason, rs) ||
      !blas_check_int(g->wm.ld, "the row stride of w", reason, rs) ||
      !blas_check_int(g->ym.ld, "the image stride of y", reason, rs))
    return 0;
  /* the GEMMs: backward-data N x F x O, backward-filter O x F x N */
  const int64_t n = g->r.n, f = g->r.f, o = g->r.o;
  g->pad_w = pass == OPS_PASS_BWD_DATA && blas_needs_pad(g->wm.ld, n, f, o);
  g->pad_x = pass == OPS_PASS_BWD_FILTER && blas_needs_pad(g->xm.ld, o, f, n);
  g->pad_y = pass == OPS_PASS_BWD_FILTER && blas_needs_pad(g->ym.ld, o, f, n);
  g->ws_bytes = (g->pad_w ? blas_padded_bytes(g->r.o, g->r.f) : 0) +
                (g->pad_x ? blas_padded_bytes(g->r.n, g->r.f) : 0) +
                (g->pad_y ? blas_padded_bytes(g->r.n, g->r.o) : 0);
  if (g->ws_bytes) g->ws_bytes += 64;
  return 1;
}

#define FC_SUPPORTS(fn, pass)                                                               \
  static int fn(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {      \
    (void)user;                                                                             \
    fc_geom g;                                                                              \
    return fc_check(args, pass, &g, reason, rs);                                            \
  }
FC_SUPPORTS(fc_supports_fwd, OPS_PASS_FWD)
FC_SUPPORTS(fc_supports_bwd_data, OPS_PASS_BWD_DATA)
FC_SUPPORTS(fc_supports_bwd_filter, OPS_PASS_BWD_FILTER)

#define FC_WORKSPACE(fn, pass)                                                              \
  static uint64_t fn(void *user, const bp_abi_kernel_args *args) {                          \
    (void)user;                                                                             \
    fc_geom g;                                                                              \
    return fc_check(args, pass, &g, NULL, 0) ? g.ws_bytes : 0;                              \
  }
FC_WORKSPACE(fc_workspace_bwd_data, OPS_PASS_BWD_DATA)
FC_WORKSPACE(fc_workspace_bwd_filter, OPS_PASS_BWD_FILTER)

static int fc_check_run(const bp_abi_kernel_args *args, ops_pass pass, fc_geom *g) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  return fc_check(args, pass, g, reason, rs) &&
         bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs) &&
         (g->ws_bytes == 0 || blas_check_workspace(args, g->ws_bytes, reason, rs));
}

/* The workspace's first 64-byte boundary: where the padded copies go. */
static float *fc_ws_base(const bp_abi_kernel_args *args) {
  const uintptr_t p = ((uintptr_t)args->workspace + 63) / 64 * 64;
  return (float *)p;
}

/* When `pad`: the rows x cols matrix at *p (leading dimension *ld) copied
 * to *ws with blas_padded_ld(cols); *p, *ld and *ws then give the copy,
 * its leading dimension and the workspace past it. */
static void fc_pad(int pad, const float **p, int64_t *ld, int64_t rows, int64_t cols,
                   float **ws) {
  if (!pad) return;
  blas_copy_padded(*ws, *p, rows, cols, *ld);
  *p = *ws;
  *ld = blas_padded_ld(cols);
  *ws += blas_padded_bytes(rows, cols) / sizeof(float);
}

/* fc.fwd
 *   in:  x [N,H,W,C], w [O,1,1,F], b [1,1,1,O] (has_bias)   out: y [N,1,1,O]
 *   y is overwritten (no accumulate in the forward). */
static int fc_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, OPS_PASS_FWD, &g)) return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  const float *b = g.r.has_bias ? bp_sdk_input_f32(args, 2) : NULL;
  float *y = bp_sdk_output_f32(args, 0);
  if (b) blas_fill_rows(y, g.ym.ld, g.r.n, g.r.o, b, g.r.b->stride[3]);
  BLAS_TRY(
      blas_sgemm(0, 1, g.r.n, g.r.o, g.r.f, x, g.xm.ld, w, g.wm.ld, b ? 1.0f : 0.0f, y, g.ym.ld));
  return BP_ABI_OK;
}

/* fc.bwd_data
 *   in:  dy [N,1,1,O], w [O,1,1,F]   out: dx [N,H,W,C]
 *   accumulate 0: overwritten; 1: added. */
static int fc_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, OPS_PASS_BWD_DATA, &g)) return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  int64_t ldw = g.wm.ld;
  float *ws = g.ws_bytes ? fc_ws_base(args) : NULL;
  fc_pad(g.pad_w, &w, &ldw, g.r.o, g.r.f, &ws);
  BLAS_TRY(blas_sgemm(0, 0, g.r.n, g.r.f, g.r.o, dy, g.ym.ld, w, ldw,
                      g.r.accumulate ? 1.0f : 0.0f, dx, g.xm.ld));
  return BP_ABI_OK;
}

/* fc.bwd_filter
 *   in:  x [N,H,W,C], dy [N,1,1,O]   out: dw [O,1,1,F], db [1,1,1,O] (has_bias)
 *   accumulate 0: overwritten; 1: added. */
static int fc_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, OPS_PASS_BWD_FILTER, &g)) return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dw = bp_sdk_output_f32(args, 0), *db = g.r.has_bias ? bp_sdk_output_f32(args, 1) : NULL;
  const float *gx = x, *gy = dy; /* the GEMM's operands: in place, or padded copies */
  int64_t ldx = g.xm.ld, ldy = g.ym.ld;
  float *ws = g.ws_bytes ? fc_ws_base(args) : NULL;
  fc_pad(g.pad_y, &gy, &ldy, g.r.n, g.r.o, &ws);
  fc_pad(g.pad_x, &gx, &ldx, g.r.n, g.r.f, &ws);
  BLAS_TRY(blas_sgemm(1, 0, g.r.o, g.r.f, g.r.n, gy, ldy, gx, ldx,
                      g.r.accumulate ? 1.0f : 0.0f, dw, g.wm.ld));
  if (db) blas_sum_rows(dy, g.ym.ld, g.r.n, g.r.o, db, g.r.b->stride[3], g.r.accumulate);
  return BP_ABI_OK;
}

#define FC_ACC offsetof(bp_fc_attrs, accumulate)
static const ops_fp16_kernel fc_fwd16 =
    BLAS_FP16(fc_supports_fwd, NULL, fc_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel fc_bwd_data16 =
    BLAS_FP16(fc_supports_bwd_data, fc_workspace_bwd_data, fc_run_bwd_data, FC_ACC);
static const ops_fp16_kernel fc_bwd_filter16 =
    BLAS_FP16(fc_supports_bwd_filter, fc_workspace_bwd_filter, fc_run_bwd_filter, FC_ACC);
const bp_abi_kernel blas_fc_fwd = BLAS_KERNEL("fc.fwd", fc_fwd16);
const bp_abi_kernel blas_fc_bwd_data = BLAS_KERNEL("fc.bwd_data", fc_bwd_data16);
const bp_abi_kernel blas_fc_bwd_filter = BLAS_KERNEL("fc.bwd_filter", fc_bwd_filter16);
