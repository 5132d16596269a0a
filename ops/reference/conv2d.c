/* conv2d reference: forward, backward-data, backward-filter, with stride,
 * zero padding, dilation, groups and an optional bias.
 *
 * Shape legend (bp_abi_ops.h):
 *   x  [N, H, W, C]          input
 *   w  [K, kh, kw, C/G]      filters; filter k sees the input channels of its
 *                            group g = k / (K/G): c in [g*C/G, (g+1)*C/G)
 *   b  [1, 1, 1, K]          bias (has_bias)
 *   y  [N, OH, OW, K]        OH = (H + 2*pad_h - (dil_h*(kh-1)+1)) / stride_h + 1
 *
 *   y[n,oh,ow,k] = b[k] + sum_{ky,kx,c} x[n, oh*sh - ph + ky*dh, ow*sw - pw + kx*dw, g*C/G + c]
 *                                       * w[k, ky, kx, c]
 * with x read as 0 outside [0,H) x [0,W) (zero padding).
 *
 * All tensors FP32 with any device strides that nest in NHWC order (padded
 * channels skipped); no alignment beyond 4 bytes; the 16-byte tail is never
 * read. Outputs never alias inputs. */
#include "reference-impl.h"

typedef enum conv_pass { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } conv_pass;

/* Everything a pass needs, checked. */
typedef struct conv_geom {
  const bp_abi_tensor *x, *w, *b, *y; /* y stands for dy in the backward passes */
  int64_t n, h, w_, c, k, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups, cg, kg;
  int has_bias, accumulate;
} conv_geom;

static int conv_check(const bp_abi_kernel_args *args, conv_pass pass, conv_geom *g, char *reason,
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

  int nin = 2, nout = 1;
  if (pass == CONV_FWD) nin += a.has_bias;
  if (pass == CONV_BWD_FILTER) nout += a.has_bias;
  if (!ref_check_args(args, nin, nout, reason, rs)) return 0;
  const bp_abi_tensor *in = args->inputs, *out = args->outputs;
  const char *yname = pass == CONV_FWD ? "y" : "dy";
  g->b = NULL;
  switch (pass) {
    case CONV_FWD:
      g->x = &in[0], g->w = &in[1], g->y = &out[0];
      if (a.has_bias) g->b = &in[2];
      break;
    case CONV_BWD_DATA: g->y = &in[0], g->w = &in[1], g->x = &out[0]; break;
    case CONV_BWD_FILTER:
      g->x = &in[0], g->y = &in[1], g->w = &out[0];
      if (a.has_bias) g->b = &out[1];
      break;
  }
  const char *xname = pass == CONV_BWD_DATA ? "dx" : "x";
  const char *wname = pass == CONV_BWD_FILTER ? "dw" : "w";
  const char *bname = pass == CONV_BWD_FILTER ? "db" : "b";
  if (!ref_check_tensor(g->x, xname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(g->w, wname, BP_ABI_DTYPE_FP32, reason, rs) ||
      !ref_check_tensor(g->y, yname, BP_ABI_DTYPE_FP32, reason, rs) ||
      (g->b && !ref_check_tensor(g->b, bname, BP_ABI_DTYPE_FP32, reason, rs)))
    return 0;

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

static int conv_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  conv_geom g;
  return conv_check(args, CONV_FWD, &g, reason, rs);
}
static int conv_supports_bwd_data(void *user, const bp_abi_kernel_args *args, char *reason,
                                  size_t rs) {
  (void)user;
  conv_geom g;
  return conv_check(args, CONV_BWD_DATA, &g, reason, rs);
}
static int conv_supports_bwd_filter(void *user, const bp_abi_kernel_args *args, char *reason,
                                    size_t rs) {
  (void)user;
  conv_geom g;
  return conv_check(args, CONV_BWD_FILTER, &g, reason, rs);
}

/* The output row (or column) o whose tap k lands on input row i:
 * o*stride - pad + k*dil == i. Returns 1 and o when such an o exists in
 * [0, limit), else 0. */
static int conv_tap(int64_t i, int64_t pad, int64_t k, int64_t dil, int64_t stride,
                    int64_t limit, int64_t *o) {
  int64_t t = i + pad - k * dil;
  if (t < 0 || t % stride != 0 || t / stride >= limit) return 0;
  *o = t / stride;
  return 1;
}

/* conv2d.fwd
 *   in:  x [N,H,W,C], w [K,kh,kw,C/G], b [1,1,1,K] (has_bias)   out: y [N,OH,OW,K]
 *   y is overwritten (accumulate is ignored: the forward has no accumulate).
 *   Each output element is one sum: per tap a dot product over the group's
 *   channels (ref_dot: eight float lanes, then double), taps summed in
 *   double, bias first; rounded to float once. */
static int conv_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  char reason[REF_REASON_MAX];
  if (!conv_check(args, CONV_FWD, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0), *w = ref_in(args, 1), *b = g.has_bias ? ref_in(args, 2) : NULL;
  float *y = ref_out(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++)
        for (int64_t k = 0; k < g.k; k++) {
          const int64_t c0 = k / g.kg * g.cg; /* first input channel of k's group */
          double acc = b ? (double)b[k * g.b->stride[3]] : 0.0;
          for (int64_t ky = 0; ky < g.kh; ky++) {
            const int64_t ih = oh * g.sh - g.ph + ky * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            for (int64_t kx = 0; kx < g.kw; kx++) {
              const int64_t iw = ow * g.sw - g.pw + kx * g.dw;
              if (iw < 0 || iw >= g.w_) continue;
              acc += ref_dot(x + ref_off(g.x, n, ih, iw, c0), xs, w + ref_off(g.w, k, ky, kx, 0),
                             ws, g.cg);
            }
          }
          y[ref_off(g.y, n, oh, ow, k)] = (float)acc;
        }
  return BP_ABI_OK;
}

/* conv2d.bwd_data
 *   in:  dy [N,OH,OW,K], w [K,kh,kw,C/G]   out: dx [N,H,W,C]
 *   dx[n,ih,iw,g*C/G+c] (+)= sum over the taps (ky,kx) that reach (ih,iw)
 *   from an output (oh,ow) and over the group's filters k of
 *   dy[n,oh,ow,k] * w[k,ky,kx,c].
 *   accumulate 0: dx is overwritten; 1: the sum is added to dx. Summed in
 *   float straight into dx, in the fixed order (ky, kx, k, c). */
static int conv_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  char reason[REF_REASON_MAX];
  if (!conv_check(args, CONV_BWD_DATA, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *dy = ref_in(args, 0), *w = ref_in(args, 1);
  float *dx = ref_out(args, 0);
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3];
  if (!g.accumulate) ref_zero(g.x, dx);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t ih = 0; ih < g.h; ih++)
      for (int64_t iw = 0; iw < g.w_; iw++)
        for (int64_t ky = 0; ky < g.kh; ky++) {
          int64_t oh;
          if (!conv_tap(ih, g.ph, ky, g.dh, g.sh, g.oh, &oh)) continue;
          for (int64_t kx = 0; kx < g.kw; kx++) {
            int64_t ow;
            if (!conv_tap(iw, g.pw, kx, g.dw, g.sw, g.ow, &ow)) continue;
            const float *dyrow = dy + ref_off(g.y, n, oh, ow, 0);
            for (int64_t gi = 0, k = 0; gi < g.groups; gi++) {
              float *dxrow = dx + ref_off(g.x, n, ih, iw, gi * g.cg);
              for (int64_t kk = 0; kk < g.kg; kk++, k++)
                ref_axpy(dxrow, xs, dyrow[k * g.y->stride[3]], w + ref_off(g.w, k, ky, kx, 0), ws,
                         g.cg);
            }
          }
        }
  return BP_ABI_OK;
}

/* conv2d.bwd_filter
 *   in:  x [N,H,W,C], dy [N,OH,OW,K]   out: dw [K,kh,kw,C/G], db [1,1,1,K] (has_bias)
 *   dw[k,ky,kx,c] (+)= sum_{n,oh,ow} dy[n,oh,ow,k] * x[n, ih, iw, g*C/G+c] over in-bounds taps
 *   db[k]         (+)= sum_{n,oh,ow} dy[n,oh,ow,k]
 *   accumulate 0: overwritten; 1: added. dw is summed in float straight
 *   into dw in the order (n, oh, ow, ky, kx, k, c); db in double, added once. */
static int conv_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  char reason[REF_REASON_MAX];
  if (!conv_check(args, CONV_BWD_FILTER, &g, reason, sizeof reason) ||
      !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const float *x = ref_in(args, 0), *dy = ref_in(args, 1);
  float *dw = ref_out(args, 0), *db = g.has_bias ? ref_out(args, 1) : NULL;
  const int64_t xs = g.x->stride[3], ws = g.w->stride[3], ys = g.y->stride[3];
  if (!g.accumulate) ref_zero(g.w, dw);
  for (int64_t n = 0; n < g.n; n++)
    for (int64_t oh = 0; oh < g.oh; oh++)
      for (int64_t ow = 0; ow < g.ow; ow++) {
        const float *dyrow = dy + ref_off(g.y, n, oh, ow, 0);
        for (int64_t ky = 0; ky < g.kh; ky++) {
          const int64_t ih = oh * g.sh - g.ph + ky * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t kx = 0; kx < g.kw; kx++) {
            const int64_t iw = ow * g.sw - g.pw + kx * g.dw;
            if (iw < 0 || iw >= g.w_) continue;
            for (int64_t gi = 0, k = 0; gi < g.groups; gi++) {
              const float *xrow = x + ref_off(g.x, n, ih, iw, gi * g.cg);
              for (int64_t kk = 0; kk < g.kg; kk++, k++)
                ref_axpy(dw + ref_off(g.w, k, ky, kx, 0), ws, dyrow[k * ys], xrow, xs, g.cg);
            }
          }
        }
      }
  if (db) {
    for (int64_t k = 0; k < g.k; k++) {
      double sum = 0.0;
      for (int64_t n = 0; n < g.n; n++)
        for (int64_t oh = 0; oh < g.oh; oh++)
          for (int64_t ow = 0; ow < g.ow; ow++) sum += dy[ref_off(g.y, n, oh, ow, k)];
      float *o = db + k * g.b->stride[3];
      *o = g.accumulate ? (float)(*o + sum) : (float)sum;
    }
  }
  return BP_ABI_OK;
}

const bp_abi_kernel ref_conv2d_fwd = REF_KERNEL("conv2d.fwd", conv_supports_fwd, conv_run_fwd, 0);
const bp_abi_kernel ref_conv2d_bwd_data =
    REF_KERNEL("conv2d.bwd_data", conv_supports_bwd_data, conv_run_bwd_data, 0);
const bp_abi_kernel ref_conv2d_bwd_filter =
    REF_KERNEL("conv2d.bwd_filter", conv_supports_bwd_filter, conv_run_bwd_filter, 0);
