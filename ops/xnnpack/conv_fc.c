/* conv2d.fwd and fc.fwd through XNNPACK's convolution2d_nhwc and
 * fully_connected_nc operators, FP32 and FP16.
 *
 * XNNPACK packs the weights (and bias) into the operator when it creates
 * it, so the operator is a cache of the parameters: run() re-creates it
 * whenever the rank's parameter generation (args->params_generation)
 * differs from the one it packed at, which the host bumps after every
 * optimizer update, checkpoint load, EMA swap and initialization. A host
 * that passes no generation gets a fresh pack on every run.
 *
 * Layouts: x and y dense NHWC over padded channels (XNNPACK takes a pixel
 * stride, input_pixel_stride / output_pixel_stride = padded_c, and writes
 * exactly the logical channels of each output pixel: rule 2 of
 * bp_abi_ops.h holds). Weights in any layout the checks accept: padded
 * ones are first gathered into a dense copy kept in the node state. fc
 * reads x as [N, H*W*C], so an x with padded channels and H*W > 1 is
 * refused (its features are not adjacent). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shared/weighted_check.h"
#include "xnn-impl.h"

/* ---- shared ---------------------------------------------------------------- */

/* XNNPACK's FP16 GEMMs round the accumulator to FP16 after every step (on
 * x86 too, to match its ARM kernels), so the error grows with the length of
 * the reduction: measured against the FP32 reference it reaches the FP16
 * tolerance of `blueprint validate` (1e-2) at 3136 products (the fc of
 * models/cnn.yaml) and stays under half of it up to 400. FP16 calls with
 * longer reductions are refused; FP32 has no such limit. */
#define XNNP_FP16_MAX_REDUCTION 1024

static int fp16_reduction_ok(int dtype, int64_t length, char *reason, size_t rs) {
  if (dtype != BP_ABI_DTYPE_FP16 || length <= XNNP_FP16_MAX_REDUCTION) return 1;
  return bp_sdk_fail(reason, rs,
                     "FP16 with a reduction of %lld products: XNNPACK's FP16 GEMM accumulates in "
                     "FP16, over %d the error passes the FP16 tolerance",
                     (long long)length, XNNP_FP16_MAX_REDUCTION);
}

/* dtype-generic gather of t's logical elements (NHWC order) into dst. */
static void gather_dense(const bp_abi_tensor *t, const void *src, size_t esize, void *dst) {
  const char *s = src;
  char *d = dst;
  BP_SDK_FOR_EACH_NHWC(t, n, h, w, c) {
    memcpy(d, s + (size_t)bp_sdk_offset(t, n, h, w, c) * esize, esize);
    d += esize;
  }
}

/* 1 when t's logical elements already lie dense in NHWC order. */
static int is_dense(const bp_abi_tensor *t) {
  int64_t want = 1;
  for (int d = 3; d >= 0; d--) {
    if (t->shape[d] > 1 && t->stride[d] != want) return 0;
    want *= t->shape[d];
  }
  return 1;
}

/* Dense views of w (and b): the tensors themselves when dense, else
 * copies in s->dense (w first, then b). */
static int dense_params(xnn_node *s, const bp_abi_kernel_args *args, const bp_abi_tensor *w,
                        const void *wp, const bp_abi_tensor *b, const void *bp, size_t esize,
                        const void **w_out, const void **b_out) {
  *w_out = wp, *b_out = bp;
  const int wd = is_dense(w), bd = !b || is_dense(b);
  if (wd && bd) return BP_ABI_OK;
  const size_t wbytes = (size_t)bp_sdk_count(w) * esize;
  const size_t bytes = wbytes + (b ? (size_t)bp_sdk_count(b) * esize : 0);
  if (s->dense_bytes < bytes) {
    void *p = realloc(s->dense, bytes);
    if (!p) {
      bp_sdk_set_reason(args, "out of memory for a dense copy of the weights");
      return BP_ABI_ERR_NOMEM;
    }
    s->dense = p, s->dense_bytes = bytes;
  }
  if (!wd) gather_dense(w, wp, esize, s->dense), *w_out = s->dense;
  if (!bd) gather_dense(b, bp, esize, (char *)s->dense + wbytes), *b_out = (char *)s->dense + wbytes;
  return BP_ABI_OK;
}

/* 1 when the op holds the current weights; else drops it (to re-create). */
static int pack_current(xnn_node *s, const bp_abi_kernel_args *args) {
  const uint64_t gen = bp_sdk_args_generation(args);
  if (s->op && s->packed && gen != 0 && s->generation == gen) return 1;
  xnn_node_drop_op(s);
  s->generation = gen;
  return 0;
}


/* ---- conv2d.fwd ------------------------------------------------------------------- */

static int conv_check(const bp_abi_kernel_args *args, ops_conv_geom *g, int *dtype, char *reason,
                      size_t rs) {
  xnnp_args_view v;
  *dtype = xnnp_view_as_fp32(args, &v, reason, rs);
  if (*dtype < 0 || !ops_conv_check(&v.args, OPS_PASS_FWD, g, reason, rs)) return 0;
  if (*dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  /* the geometry's tensors point into the view: take the real ones */
  g->x = bp_sdk_input(args, 0), g->w = bp_sdk_input(args, 1), g->y = bp_sdk_output(args, 0);
  g->b = g->has_bias ? bp_sdk_input(args, 2) : NULL;
  if (g->kh > UINT32_MAX || g->sh > UINT32_MAX || g->ph > UINT32_MAX || g->groups > UINT32_MAX)
    return bp_sdk_fail(reason, rs, "attributes exceed XNNPACK's 32-bit range");
  if (!fp16_reduction_ok(*dtype, g->kh * g->kw * g->cg, reason, rs)) return 0;
  return xnnp_standard_nhwc(g->x, "x", reason, rs) && xnnp_standard_nhwc(g->y, "y", reason, rs);
}

static int conv_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  ops_conv_geom g;
  int dtype;
  return conv_check(args, &g, &dtype, reason, rs);
}

static int conv_create(xnn_node *s, const bp_abi_kernel_args *args, const ops_conv_geom *g,
                       int dtype) {
  const size_t esize = bp_sdk_dtype_size(dtype);
  const void *w, *b;
  int rc = dense_params(s, args, g->w, args->input_ptrs[1], g->b,
                        g->b ? args->input_ptrs[2] : NULL, esize, &w, &b);
  if (rc != BP_ABI_OK) return rc;
  enum xnn_status st;
  const uint32_t ph = (uint32_t)g->ph, pw = (uint32_t)g->pw;
  if (dtype == BP_ABI_DTYPE_FP32)
    st = xnn_create_convolution2d_nhwc_f32(
        ph, pw, ph, pw, (uint32_t)g->kh, (uint32_t)g->kw, (uint32_t)g->sh, (uint32_t)g->sw,
        (uint32_t)g->dh, (uint32_t)g->dw, (uint32_t)g->groups, (size_t)g->cg, (size_t)g->kg,
        (size_t)g->x->padded_c, (size_t)g->y->padded_c, w, b, -INFINITY, INFINITY, 0, &s->op);
  else
    st = xnn_create_convolution2d_nhwc_f16(
        ph, pw, ph, pw, (uint32_t)g->kh, (uint32_t)g->kw, (uint32_t)g->sh, (uint32_t)g->sw,
        (uint32_t)g->dh, (uint32_t)g->dw, (uint32_t)g->groups, (size_t)g->cg, (size_t)g->kg,
        (size_t)g->x->padded_c, (size_t)g->y->padded_c, w, b, -INFINITY, INFINITY, 0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "convolution create", st);
  }
  s->packs++;
  return BP_ABI_OK;
}

static int conv_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  (void)user;
  *state_out = NULL;
  ops_conv_geom g;
  int dtype;
  if (!conv_check(args, &g, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s;
  int rc = xnn_node_create(args, &s);
  if (rc != BP_ABI_OK) return rc;
  /* created now so a refusal names the node at bind; the weights are not
   * written yet, so the first run packs again (packed stays 0) */
  if (args->input_ptrs && (rc = conv_create(s, args, &g, dtype)) != BP_ABI_OK) {
    xnn_node_release(NULL, s);
    return rc;
  }
  *state_out = s;
  return BP_ABI_OK;
}

static int conv_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_conv_geom g;
  int dtype;
  if (!conv_check(args, &g, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, bp_sdk_args_reason(args),
                         bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(args, &s, &tmp, NULL);
  if (rc != BP_ABI_OK) return rc;
  if (!pack_current(s, args)) {
    if ((rc = conv_create(s, args, &g, dtype)) != BP_ABI_OK) goto out;
    s->packed = 1;
  }
  const void *x = args->input_ptrs[0];
  void *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, x, NULL, y, NULL, g.n)) {
    const enum xnn_status st =
        dtype == BP_ABI_DTYPE_FP32
            ? xnn_setup_convolution2d_nhwc_f32(s->op, (size_t)g.n, (size_t)g.h, (size_t)g.w_, x,
                                               y, pool)
            : xnn_setup_convolution2d_nhwc_f16(s->op, (size_t)g.n, (size_t)g.h, (size_t)g.w_, x,
                                               y, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "convolution setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "convolution run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_conv2d_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "conv2d.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = XNNP_DTYPES,
    .priority = XNNP_PRIORITY_BELOW_BLAS,
    .flags = XNNP_FLAGS,
    .supports = conv_supports,
    .run = conv_run,
    .prepare = conv_prepare,
    .release = xnn_node_release,
};

/* ---- fc.fwd -------------------------------------------------------------------------- */

typedef struct fc_plan {
  ops_fc_geom g;
  size_t in_stride, out_stride;
} fc_plan;

static int fc_check(const bp_abi_kernel_args *args, fc_plan *p, int *dtype, char *reason,
                    size_t rs) {
  xnnp_args_view v;
  ops_fc_geom *g = &p->g;
  *dtype = xnnp_view_as_fp32(args, &v, reason, rs);
  if (*dtype < 0 || !ops_fc_check(&v.args, OPS_PASS_FWD, g, reason, rs)) return 0;
  if (*dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  g->x = bp_sdk_input(args, 0), g->w = bp_sdk_input(args, 1), g->y = bp_sdk_output(args, 0);
  g->b = g->has_bias ? bp_sdk_input(args, 2) : NULL;
  if (!fp16_reduction_ok(*dtype, g->f, reason, rs)) return 0;
  /* x: N rows of F adjacent features */
  const bp_abi_tensor *x = g->x, *y = g->y;
  if (x->shape[3] > 1 && x->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "x: channels are not contiguous");
  if ((x->shape[1] > 1 || x->shape[2] > 1) &&
      ((x->shape[2] > 1 && x->stride[2] != x->shape[3]) ||
       (x->shape[1] > 1 && x->stride[1] != x->shape[2] * x->shape[3])))
    return bp_sdk_fail(reason, rs,
                       "x: padded channels (%lld of %lld) with H*W = %lld > 1: the features of an "
                       "image are not adjacent",
                       (long long)x->shape[3], (long long)x->padded_c,
                       (long long)(x->shape[1] * x->shape[2]));
  if (y->shape[3] > 1 && y->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "y: channels are not contiguous");
  p->in_stride = g->n > 1 ? (size_t)x->stride[0] : (size_t)g->f;
  p->out_stride = g->n > 1 ? (size_t)y->stride[0] : (size_t)g->o;
  return 1;
}

static int fc_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  fc_plan p;
  int dtype;
  return fc_check(args, &p, &dtype, reason, rs);
}

static int fc_create(xnn_node *s, const bp_abi_kernel_args *args, const fc_plan *p, int dtype) {
  const size_t esize = bp_sdk_dtype_size(dtype);
  const void *w, *b;
  int rc = dense_params(s, args, p->g.w, args->input_ptrs[1], p->g.b,
                        p->g.b ? args->input_ptrs[2] : NULL, esize, &w, &b);
  if (rc != BP_ABI_OK) return rc;
  const enum xnn_status st =
      dtype == BP_ABI_DTYPE_FP32
          ? xnn_create_fully_connected_nc_f32((size_t)p->g.f, (size_t)p->g.o, p->in_stride,
                                              p->out_stride, w, b, -INFINITY, INFINITY, 0,
                                              &s->op)
          : xnn_create_fully_connected_nc_f16((size_t)p->g.f, (size_t)p->g.o, p->in_stride,
                                              p->out_stride, w, b, -INFINITY, INFINITY, 0,
                                              &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "fully-connected create", st);
  }
  s->packs++;
  return BP_ABI_OK;
}

static int fc_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  (void)user;
  *state_out = NULL;
  fc_plan p;
  int dtype;
  if (!fc_check(args, &p, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s;
  int rc = xnn_node_create(args, &s);
  if (rc != BP_ABI_OK) return rc;
  if (args->input_ptrs && (rc = fc_create(s, args, &p, dtype)) != BP_ABI_OK) {
    xnn_node_release(NULL, s);
    return rc;
  }
  *state_out = s;
  return BP_ABI_OK;
}

static int fc_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  fc_plan p;
  int dtype;
  if (!fc_check(args, &p, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, bp_sdk_args_reason(args),
                         bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(args, &s, &tmp, NULL);
  if (rc != BP_ABI_OK) return rc;
  if (!pack_current(s, args)) {
    if ((rc = fc_create(s, args, &p, dtype)) != BP_ABI_OK) goto out;
    s->packed = 1;
  }
  const void *x = args->input_ptrs[0];
  void *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, x, NULL, y, NULL, p.g.n)) {
    const enum xnn_status st =
        dtype == BP_ABI_DTYPE_FP32
            ? xnn_setup_fully_connected_nc_f32(s->op, (size_t)p.g.n, x, y, pool)
            : xnn_setup_fully_connected_nc_f16(s->op, (size_t)p.g.n, x, y, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "fully-connected setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "fully-connected run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_fc_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "fc.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = XNNP_DTYPES,
    .priority = XNNP_PRIORITY_BELOW_BLAS,
    .flags = XNNP_FLAGS,
    .supports = fc_supports,
    .run = fc_run,
    .prepare = fc_prepare,
    .release = xnn_node_release,
};
