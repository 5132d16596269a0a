/* Argument checks of the weighted ops (conv2d, fc): shared by the reference
 * kernels and by every module that compiles this file in (ops/blas), so all
 * accept the same nodes with the same reasons. */
#include "reference-impl.h"

/* The tensors of one pass, by role, with their names in messages:
 *   forward          in: x, w, b (has_bias)   out: y
 *   backward-data    in: dy, w                out: dx
 *   backward-filter  in: x, dy                out: dw, db (has_bias)
 * Checks the counts and that every tensor is FP32. */
typedef struct weighted_roles {
  const bp_abi_tensor *x, *w, *b, *y; /* b NULL without bias */
  const char *xname, *wname, *bname, *yname;
} weighted_roles;

static int weighted_bind(const bp_abi_kernel_args *args, ref_pass pass, int has_bias,
                         weighted_roles *r, char *reason, size_t rs) {
  int nin = 2 + (pass == REF_PASS_FWD && has_bias);
  int nout = 1 + (pass == REF_PASS_BWD_FILTER && has_bias);
  if (!ref_check_args(args, nin, nout, reason, rs)) return 0;
  const bp_abi_tensor *in = args->inputs, *out = args->outputs;
  r->b = NULL;
  switch (pass) {
    case REF_PASS_FWD:
      r->x = &in[0], r->w = &in[1], r->y = &out[0];
      if (has_bias) r->b = &in[2];
      break;
    case REF_PASS_BWD_DATA: r->y = &in[0], r->w = &in[1], r->x = &out[0]; break;
    case REF_PASS_BWD_FILTER:
      r->x = &in[0], r->y = &in[1], r->w = &out[0];
      if (has_bias) r->b = &out[1];
      break;
  }
  r->xname = pass == REF_PASS_BWD_DATA ? "dx" : "x";
  r->wname = pass == REF_PASS_BWD_FILTER ? "dw" : "w";
  r->bname = pass == REF_PASS_BWD_FILTER ? "db" : "b";
  r->yname = pass == REF_PASS_FWD ? "y" : "dy";
  return ref_check_tensor(r->x, r->xname, BP_ABI_DTYPE_FP32, reason, rs) &&
         ref_check_tensor(r->w, r->wname, BP_ABI_DTYPE_FP32, reason, rs) &&
         ref_check_tensor(r->y, r->yname, BP_ABI_DTYPE_FP32, reason, rs) &&
         (!r->b || ref_check_tensor(r->b, r->bname, BP_ABI_DTYPE_FP32, reason, rs));
}

int ref_conv_check(const bp_abi_kernel_args *args, ref_pass pass, ref_conv_geom *g, char *reason,
                   size_t rs) {
  bp_conv2d_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (a.kernel_h < 1 || a.kernel_w < 1)
    return ref_fail(reason, rs, "kernel %dx%d: each side must be >= 1", a.kernel_h, a.kernel_w);
  if (a.stride_h < 1 || a.stride_w < 1)
    return ref_fail(reason, rs, "stride %dx%d: each must be >= 1", a.stride_h, a.stride_w);
  if (a.dilation_h < 1 || a.dilation_w < 1)
    return ref_fail(reason, rs, "dilation %dx%d: each must be >= 1", a.dilation_h, a.dilation_w);
  if (a.pad_h < 0 || a.pad_w < 0)
    return ref_fail(reason, rs, "padding %dx%d: each must be >= 0", a.pad_h, a.pad_w);
  if (a.groups < 1) return ref_fail(reason, rs, "groups %d must be >= 1", a.groups);
  if (!ref_check_flag(a.has_bias, "has_bias", reason, rs) ||
      !ref_check_flag(a.accumulate, "accumulate", reason, rs))
    return 0;

  weighted_roles r;
  if (!weighted_bind(args, pass, a.has_bias, &r, reason, rs)) return 0;
  g->x = r.x, g->w = r.w, g->b = r.b, g->y = r.y;
  const char *wname = r.wname, *yname = r.yname, *bname = r.bname;

  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w_ = g->x->shape[2], g->c = g->x->shape[3];
  g->k = g->w->shape[0];
  g->kh = a.kernel_h, g->kw = a.kernel_w, g->sh = a.stride_h, g->sw = a.stride_w;
  g->ph = a.pad_h, g->pw = a.pad_w, g->dh = a.dilation_h, g->dw = a.dilation_w;
  g->groups = a.groups, g->has_bias = a.has_bias, g->accumulate = a.accumulate;
  if (g->c % g->groups != 0 || g->k % g->groups != 0)
    return ref_fail(reason, rs, "groups %d must divide channels %lld and filters %lld", a.groups,
                    (long long)g->c, (long long)g->k);
  g->cg = g->c / g->groups, g->kg = g->k / g->groups;
  int64_t eh = g->dh * (g->kh - 1) + 1, ew = g->dw * (g->kw - 1) + 1;
  int64_t nh = g->h + 2 * g->ph - eh, nw = g->w_ + 2 * g->pw - ew;
  if (nh < 0 || nw < 0)
    return ref_fail(reason, rs,
                    "padded input %lldx%lld is smaller than the dilated kernel %lldx%lld",
                    (long long)(g->h + 2 * g->ph), (long long)(g->w_ + 2 * g->pw),
                    (long long)eh, (long long)ew);
  g->oh = nh / g->sh + 1, g->ow = nw / g->sw + 1;
  if (!ref_check_shape(g->w, wname, g->k, g->kh, g->kw, g->cg, reason, rs) ||
      !ref_check_shape(g->y, yname, g->n, g->oh, g->ow, g->k, reason, rs) ||
      (g->b && !ref_check_shape(g->b, bname, 1, 1, 1, g->k, reason, rs)))
    return 0;
  return 1;
}

int ref_fc_check(const bp_abi_kernel_args *args, ref_pass pass, ref_fc_geom *g, char *reason,
                    size_t rs) {
  bp_fc_attrs a;
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, &a, sizeof a, reason, rs)) return 0;
  if (!ref_check_flag(a.has_bias, "has_bias", reason, rs) ||
      !ref_check_flag(a.accumulate, "accumulate", reason, rs))
    return 0;
  weighted_roles r;
  if (!weighted_bind(args, pass, a.has_bias, &r, reason, rs)) return 0;
  g->x = r.x, g->w = r.w, g->b = r.b, g->y = r.y;
  const char *wname = r.wname, *yname = r.yname, *bname = r.bname;
  g->n = g->x->shape[0], g->h = g->x->shape[1], g->w_ = g->x->shape[2], g->c = g->x->shape[3];
  g->f = g->h * g->w_ * g->c;
  g->o = g->w->shape[0];
  g->has_bias = a.has_bias, g->accumulate = a.accumulate;
  if (!ref_check_shape(g->w, wname, g->o, 1, 1, g->f, reason, rs) ||
      !ref_check_shape(g->y, yname, g->n, 1, 1, g->o, reason, rs) ||
      (g->b && !ref_check_shape(g->b, bname, 1, 1, 1, g->o, reason, rs)))
    return 0;
  return 1;
}
