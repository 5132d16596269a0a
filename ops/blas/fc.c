/* fully connected through cblas_sgemm: forward, backward-data,
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
 * refused (its features are not adjacent). No workspace. FP32; no
 * alignment beyond 4 bytes; the 16-byte tail is never read; outputs never
 * alias inputs. */
#include "blas-impl.h"

typedef enum fc_pass { FC_FWD, FC_BWD_DATA, FC_BWD_FILTER } fc_pass;

typedef struct fc_geom {
  const bp_abi_tensor *x, *w, *b, *y; /* dx / dy / dw / db in the backward passes */
  int64_t n, f, o;
  int has_bias, accumulate;
  blas_mat xm, wm, ym; /* [N, F], [O, F], [N, O] */
} fc_geom;

/* The validity checks of the reference (the same messages), then the
 * matrix layouts and the BLAS int range. */
static int fc_check(const bp_abi_kernel_args *args, fc_pass pass, fc_geom *g, char *reason,
                    size_t rs) {
  bp_fc_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (!ref_check_flag(a.has_bias, "has_bias", reason, rs) ||
      !ref_check_flag(a.accumulate, "accumulate", reason, rs))
    return 0;
  int nin = 2, nout = 1;
  if (pass == FC_FWD) nin += a.has_bias;
  if (pass == FC_BWD_FILTER) nout += a.has_bias;
  if (!ref_check_args(args, nin, nout, reason, rs)) return 0;
  const bp_abi_tensor *in = args->inputs, *out = args->outputs;
  g->b = NULL;
  switch (pass) {
    case FC_FWD:
      g->x = &in[0], g->w = &in[1], g->y = &out[0];
      if (a.has_bias) g->b = &in[2];
      break;
    case FC_BWD_DATA: g->y = &in[0], g->w = &in[1], g->x = &out[0]; break;
    case FC_BWD_FILTER:
      g->x = &in[0], g->y = &in[1], g->w = &out[0];
      if (a.has_bias) g->b = &out[1];
      break;
  }
  const char *xname = pass == FC_BWD_DATA ? "dx" : "x";
  const char *wname = pass == FC_BWD_FILTER ? "dw" : "w";
  const char *bname = pass == FC_BWD_FILTER ? "db" : "b";
  const char *yname = pass == FC_FWD ? "y" : "dy";
  if (!ref_check_tensor(g->x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(g->w, wname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(g->y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      (g->b && !ref_check_tensor(g->b, bname, BP_ABI_DTYPE_FP32, reason, rs)))
    return 0;
  g->n = g->x->shape[0];
  g->f = g->x->shape[1] * g->x->shape[2] * g->x->shape[3];
  g->o = g->w->shape[0];
  g->has_bias = a.has_bias, g->accumulate = a.accumulate;
  if (!ref_check_shape(g->w, wname, g->o, 1, 1, g->f, reason, rs) ||
      !ref_check_shape(g->y, yname, g->n, 1, 1, g->o, reason, rs) ||
      (g->b && !ref_check_shape(g->b, bname, 1, 1, 1, g->o, reason, rs)))
    return 0;

  /* ---- this module's own limits ---- */
  if (!blas_view(g->x, 1, xname, "N rows of H*W*C features", &g->xm, reason, rs) ||
      !blas_view(g->w, 1, wname, "O rows of F weights", &g->wm, reason, rs) ||
      !blas_view(g->y, 1, yname, "N rows of O outputs", &g->ym, reason, rs))
    return 0;
  if (!blas_check_int(g->n, "N", reason, rs) || !blas_check_int(g->f, "H*W*C", reason, rs) ||
      !blas_check_int(g->o, "the output count", reason, rs) ||
      !blas_check_int(g->xm.ld, "the image stride of x", reason, rs) ||
      !blas_check_int(g->wm.ld, "the row stride of w", reason, rs) ||
      !blas_check_int(g->ym.ld, "the image stride of y", reason, rs))
    return 0;
  return 1;
}

#define FC_SUPPORTS(fn, pass)                                                               \
  static int fn(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {      \
    (void)user;                                                                             \
    fc_geom g;                                                                              \
    return fc_check(args, pass, &g, reason, rs);                                            \
  }
FC_SUPPORTS(fc_supports_fwd, FC_FWD)
FC_SUPPORTS(fc_supports_bwd_data, FC_BWD_DATA)
FC_SUPPORTS(fc_supports_bwd_filter, FC_BWD_FILTER)

static int fc_check_run(const bp_abi_kernel_args *args, fc_pass pass, fc_geom *g) {
  char reason[REF_REASON_MAX];
  return fc_check(args, pass, g, reason, sizeof reason) && ref_check_ptrs(args, NULL, NULL, 0);
}

/* fc.fwd
 *   in:  x [N,H,W,C], w [O,1,1,F], b [1,1,1,O] (has_bias)   out: y [N,1,1,O]
 *   y is overwritten (no accumulate in the forward). */
static int fc_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, FC_FWD, &g)) return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0), *w = ref_in(args, 1), *b = g.has_bias ? ref_in(args, 2) : NULL;
  float *y = ref_out(args, 0);
  if (b) blas_fill_rows(y, g.ym.ld, g.n, g.o, b, g.b->stride[3]);
  blas_sgemm(0, 1, g.n, g.o, g.f, x, g.xm.ld, w, g.wm.ld, b ? 1.0f : 0.0f, y, g.ym.ld);
  return BP_ABI_OK;
}

/* fc.bwd_data
 *   in:  dy [N,1,1,O], w [O,1,1,F]   out: dx [N,H,W,C]
 *   accumulate 0: overwritten; 1: added. */
static int fc_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, FC_BWD_DATA, &g)) return BP_ABI_ERR_INVALID;
  const float *dy = ref_in(args, 0), *w = ref_in(args, 1);
  float *dx = ref_out(args, 0);
  blas_sgemm(0, 0, g.n, g.f, g.o, dy, g.ym.ld, w, g.wm.ld, g.accumulate ? 1.0f : 0.0f, dx,
             g.xm.ld);
  return BP_ABI_OK;
}

/* fc.bwd_filter
 *   in:  x [N,H,W,C], dy [N,1,1,O]   out: dw [O,1,1,F], db [1,1,1,O] (has_bias)
 *   accumulate 0: overwritten; 1: added. */
static int fc_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_geom g;
  if (!fc_check_run(args, FC_BWD_FILTER, &g)) return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0), *dy = ref_in(args, 1);
  float *dw = ref_out(args, 0), *db = g.has_bias ? ref_out(args, 1) : NULL;
  blas_sgemm(1, 0, g.o, g.f, g.n, dy, g.ym.ld, x, g.xm.ld, g.accumulate ? 1.0f : 0.0f, dw,
             g.wm.ld);
  if (db) blas_sum_rows(dy, g.ym.ld, g.n, g.o, db, g.b->stride[3], g.accumulate);
  return BP_ABI_OK;
}

const bp_abi_kernel blas_fc_fwd = BLAS_KERNEL("fc.fwd", fc_supports_fwd, NULL, fc_run_fwd);
const bp_abi_kernel blas_fc_bwd_data =
    BLAS_KERNEL("fc.bwd_data", fc_supports_bwd_data, NULL, fc_run_bwd_data);
const bp_abi_kernel blas_fc_bwd_filter =
    BLAS_KERNEL("fc.bwd_filter", fc_supports_bwd_filter, NULL, fc_run_bwd_filter);
