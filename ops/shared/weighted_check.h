/* Argument checks of the weighted ops (conv2d, fc), shared by every
 * in-tree implementation (ops/reference, ops/blas), so all accept the same
 * nodes with the same reasons; a module refuses its own extra layouts
 * after these pass. Header-only (static inline), on the module SDK.
 *
 * The tensors of one pass, by role, with their names in reasons:
 *   forward          in: x, w, b (has_bias)   out: y
 *   backward-data    in: dy, w                out: dx
 *   backward-filter  in: x, dy                out: dw, db (has_bias)
 * Every tensor FP32 and valid (bp_sdk_check_tensor), the shapes of
 * bp_abi_ops.h, the attributes in range (a flag such as accumulate is 0 or
 * 1 in every pass; the forward passes then ignore accumulate, rule 4 of
 * bp_abi_ops.h). */
#ifndef BP_OPS_SHARED_WEIGHTED_CHECK_H
#define BP_OPS_SHARED_WEIGHTED_CHECK_H

#include "bp_abi_sdk.h"

typedef enum ops_pass { OPS_PASS_FWD, OPS_PASS_BWD_DATA, OPS_PASS_BWD_FILTER } ops_pass;

/* The tensors of a pass by role (b NULL without bias) and their names. */
typedef struct ops_weighted_roles {
  const bp_abi_tensor *x, *w, *b, *y;
  const char *xname, *wname, *bname, *yname;
} ops_weighted_roles;

/* Checks the flags of the attributes (0 or 1) and the tensor counts of
 * the pass, binds the roles and checks that every tensor is a valid FP32
 * one. */
static inline int ops_weighted_bind(const bp_abi_kernel_args *args, ops_pass pass, int has_bias,
                                    int accumulate, ops_weighted_roles *r, char *reason,
                                    size_t rs) {
  if (!bp_sdk_check_flag(has_bias, "has_bias", reason, rs) ||
      !bp_sdk_check_flag(accumulate, "accumulate", reason, rs))
    return 0;
  const int nin = 2 + (pass == OPS_PASS_FWD && has_bias);
  const int nout = 1 + (pass == OPS_PASS_BWD_FILTER && has_bias);
  if (!bp_sdk_check_args(args, nin, nout, reason, rs)) return 0;
  r->b = NULL;
  switch (pass) {
    case OPS_PASS_FWD:
      r->x = bp_sdk_input(args, 0), r->w = bp_sdk_input(args, 1), r->y = bp_sdk_output(args, 0);
      if (has_bias) r->b = bp_sdk_input(args, 2);
      break;
    case OPS_PASS_BWD_DATA:
      r->y = bp_sdk_input(args, 0), r->w = bp_sdk_input(args, 1), r->x = bp_sdk_output(args, 0);
      break;
    case OPS_PASS_BWD_FILTER:
      r->x = bp_sdk_input(args, 0), r->y = bp_sdk_input(args, 1), r->w = bp_sdk_output(args, 0);
      if (has_bias) r->b = bp_sdk_output(args, 1);
      break;
  }
  r->xname = pass == OPS_PASS_BWD_DATA ? "dx" : "x";
  r->wname = pass == OPS_PASS_BWD_FILTER ? "dw" : "w";
  r->bname = pass == OPS_PASS_BWD_FILTER ? "db" : "b";
  r->yname = pass == OPS_PASS_FWD ? "y" : "dy";
  return bp_sdk_check_tensor(r->x, r->xname, BP_ABI_DTYPE_FP32, reason, rs) &&
         bp_sdk_check_tensor(r->w, r->wname, BP_ABI_DTYPE_FP32, reason, rs) &&
         bp_sdk_check_tensor(r->y, r->yname, BP_ABI_DTYPE_FP32, reason, rs) &&
         (!r->b || bp_sdk_check_tensor(r->b, r->bname, BP_ABI_DTYPE_FP32, reason, rs));
}

/* conv2d: everything a pass needs, checked. y stands for dy in the
 * backward passes (and x for dx, w for dw, b for db). */
typedef struct ops_conv_geom {
  const bp_abi_tensor *x, *w, *b, *y;
  int64_t n, h, w_, c, k, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups, cg, kg; /* cg, kg: channels, filters per group */
  int has_bias, accumulate;
} ops_conv_geom;

static inline int ops_conv_check(const bp_abi_kernel_args *args, ops_pass pass, ops_conv_geom *g,
                                 char *reason, size_t rs) {
  bp_conv2d_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (a.kernel_h < 1 || a.kernel_w < 1)
    return bp_sdk_fail(reason, rs, "kernel %dx%d: each side must be >= 1", a.kernel_h,
                       a.kernel_w);
  if (a.stride_h < 1 || a.stride_w < 1)
    return bp_sdk_fail(reason, rs, "stride %dx%d: each must be >= 1", a.stride_h, a.stride_w);
  if (a.dilation_h < 1 || a.dilation_w < 1)
    return bp_sdk_fail(reason, rs, "dilation %dx%d: each must be >= 1", a.dilation_h,
                       a.dilation_w);
  if (a.pad_h < 0 || a.pad_w < 0)
    return bp_sdk_fail(reason, rs, "padding %dx%d: each must be >= 0", a.pad_h, a.pad_w);
  if (a.groups < 1) return bp_sdk_fail(reason, rs, "groups %d must be >= 1", a.groups);

  ops_weighted_roles r;
  if (!ops_weighted_bind(args, pass, a.has_bias, a.accumulate, &r, reason, rs)) return 0;
  g->x = r.x, g->w = r.w, g->b = r.b, g->y = r.y;
  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w_ = g->x->shape[2], g->c = g->x->shape[3];
  g->k = g->w->shape[0];
  g->kh = a.kernel_h, g->kw = a.kernel_w, g->sh = a.stride_h, g->sw = a.stride_w;
  g->ph = a.pad_h, g->pw = a.pad_w, g->dh = a.dilation_h, g->dw = a.dilation_w;
  g->groups = a.groups, g->has_bias = a.has_bias, g->accumulate = a.accumulate;
  if (g->c % g->groups != 0 || g->k % g->groups != 0)
    return bp_sdk_fail(reason, rs, "groups %d must divide channels %lld and filters %lld",
                       a.groups, (long long)g->c, (long long)g->k);
  g->cg = g->c / g->groups, g->kg = g->k / g->groups;
  const int64_t eh = g->dh * (g->kh - 1) + 1, ew = g->dw * (g->kw - 1) + 1;
  const int64_t nh = g->h + 2 * g->ph - eh, nw = g->w_ + 2 * g->pw - ew;
  if (nh < 0 || nw < 0)
    return bp_sdk_fail(reason, rs,
                       "padded input %lldx%lld is smaller than the dilated kernel %lldx%lld",
                       (long long)(g->h + 2 * g->ph), (long long)(g->w_ + 2 * g->pw),
                       (long long)eh, (long long)ew);
  g->oh = nh / g->sh + 1, g->ow = nw / g->sw + 1;
  return bp_sdk_check_shape(g->w, r.wname, g->k, g->kh, g->kw, g->cg, reason, rs) &&
         bp_sdk_check_shape(g->y, r.yname, g->n, g->oh, g->ow, g->k, reason, rs) &&
         (!g->b || bp_sdk_check_shape(g->b, r.bname, 1, 1, 1, g->k, reason, rs));
}

/* fc: x read as [N, F], F = H*W*C; y stands for dy in the backward passes. */
typedef struct ops_fc_geom {
  const bp_abi_tensor *x, *w, *b, *y;
  int64_t n, h, w_, c, f, o;
  int has_bias, accumulate;
} ops_fc_geom;

static inline int ops_fc_check(const bp_abi_kernel_args *args, ops_pass pass, ops_fc_geom *g,
                               char *reason, size_t rs) {
  bp_fc_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  ops_weighted_roles r;
  if (!ops_weighted_bind(args, pass, a.has_bias, a.accumulate, &r, reason, rs)) return 0;
  g->x = r.x, g->w = r.w, g->b = r.b, g->y = r.y;
  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w_ = g->x->shape[2], g->c = g->x->shape[3];
  g->f = g->h * g->w_ * g->c;
  g->o = g->w->shape[0];
  g->has_bias = a.has_bias, g->accumulate = a.accumulate;
  return bp_sdk_check_shape(g->w, r.wname, g->o, 1, 1, g->f, reason, rs) &&
         bp_sdk_check_shape(g->y, r.yname, g->n, 1, 1, g->o, reason, rs) &&
         (!g->b || bp_sdk_check_shape(g->b, r.bname, 1, 1, 1, g->o, reason, rs));
}

#endif
