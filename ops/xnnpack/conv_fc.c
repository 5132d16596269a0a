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
#include <stdio.h>
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


/* ---- one prepare and run for both operators ----------------------------------------- */

/* A checked call of conv2d.fwd or fc.fwd. */
typedef struct weighted_call {
  ops_conv_geom conv;           /* conv2d.fwd's geometry */
  ops_fc_geom fc;               /* fc.fwd's geometry */
  size_t in_stride, out_stride; /* fc: the image strides of x and y */
  int dtype;
  const bp_abi_tensor *w, *b; /* the call's own tensors (b NULL without bias) */
  int64_t n;                  /* images */
} weighted_call;

/* What differs between the two: the checks and XNNPACK's calls; `what`
 * names XNNPACK's operator in messages. */
typedef struct weighted_op {
  const char *what;
  int (*check)(const bp_abi_kernel_args *args, weighted_call *c, char *reason, size_t rs);
  enum xnn_status (*create)(const weighted_call *c, const void *w, const void *b,
                            xnn_operator_t *op);
  enum xnn_status (*setup)(const weighted_call *c, xnn_operator_t op, const void *x, void *y,
                           pthreadpool_t pool);
} weighted_op;

/* XNNPACK's failure at `step` (create, setup, run) of op's operator. */
static int weighted_fail(const bp_abi_kernel_args *args, const weighted_op *op, const char *step,
                         enum xnn_status st) {
  char what[64];
  snprintf(what, sizeof what, "%s %s", op->what, step);
  return xnnp_fail(args, what, st);
}

/* The operator `c` needs, with the weights (dense) packed into it. */
static int weighted_create(xnn_node *s, const bp_abi_kernel_args *args, const weighted_op *op,
                           const weighted_call *c) {
  const void *w, *b;
  int rc = dense_params(s, args, c->w, args->input_ptrs[1], c->b,
                        c->b ? args->input_ptrs[2] : NULL, bp_sdk_dtype_size(c->dtype), &w, &b);
  if (rc != BP_ABI_OK) return rc;
  const enum xnn_status st = op->create(c, w, b, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return weighted_fail(args, op, "create", st);
  }
  s->packs++;
  return BP_ABI_OK;
}

static int weighted_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  const weighted_op *op = xnnp_inner(user);
  weighted_call c;
  return op->check(args, &c, reason, rs);
}

static int weighted_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  const weighted_op *op = xnnp_inner(user);
  *state_out = NULL;
  weighted_call c;
  if (!op->check(args, &c, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s;
  int rc = xnn_node_create(user, args, &s);
  if (rc != BP_ABI_OK) return rc;
  /* created now so a refusal names the node at bind; the weights are not
   * written yet, so the first run packs again (packed stays 0) */
  if (args->input_ptrs && (rc = weighted_create(s, args, op, &c)) != BP_ABI_OK) {
    xnn_node_release(NULL, s);
    return rc;
  }
  *state_out = s;
  return BP_ABI_OK;
}

static int weighted_run(void *user, const bp_abi_kernel_args *args) {
  const weighted_op *op = xnnp_inner(user);
  weighted_call c;
  if (!op->check(args, &c, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, bp_sdk_args_reason(args),
                         bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, NULL);
  if (rc != BP_ABI_OK) return rc;
  if (!pack_current(s, args)) {
    if ((rc = weighted_create(s, args, op, &c)) != BP_ABI_OK) goto out;
    s->packed = 1;
  }
  const void *x = args->input_ptrs[0];
  void *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, x, NULL, y, NULL, c.n)) {
    const enum xnn_status st = op->setup(&c, s->op, x, y, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = weighted_fail(args, op, "setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = weighted_fail(args, op, "run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

#define WEIGHTED_KERNEL(op_name, weighted)                                                    \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "xnnpack",                \
    .device = "cpu", .dtypes = XNNP_DTYPES, .priority = XNNP_PRIORITY_BELOW_BLAS,            \
    .flags = XNNP_FLAGS, .supports = weighted_supports, .run = weighted_run,                 \
    .prepare = weighted_prepare, .release = xnn_node_release, .user = (void *)&(weighted)    \
  }

/* ---- conv2d.fwd ------------------------------------------------------------------- */

static int conv_check(const bp_abi_kernel_args *args, weighted_call *c, char *reason,
                      size_t rs) {
  xnnp_args_view v;
  ops_conv_geom *g = &c->conv;
  c->dtype = xnnp_view_as_fp32(args, &v, reason, rs);
  if (c->dtype < 0 || !ops_conv_check(&v.args, OPS_PASS_FWD, g, reason, rs)) return 0;
  if (c->dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  /* the geometry's tensors point into the view: take the real ones */
  g->x = bp_sdk_input(args, 0), g->w = bp_sdk_input(args, 1), g->y = bp_sdk_output(args, 0);
  g->b = g->has_bias ? bp_sdk_input(args, 2) : NULL;
  c->w = g->w, c->b = g->b, c->n = g->n;
  if (g->kh > UINT32_MAX || g->sh > UINT32_MAX || g->ph > UINT32_MAX || g->groups > UINT32_MAX)
    return bp_sdk_fail(reason, rs, "attributes exceed XNNPACK's 32-bit range");
  if (!fp16_reduction_ok(c->dtype, g->kh * g->kw * g->cg, reason, rs)) return 0;
  return xnnp_standard_nhwc(g->x, "x", reason, rs) && xnnp_standard_nhwc(g->y, "y", reason, rs);
}

static enum xnn_status conv_create(const weighted_call *c, const void *w, const void *b,
                                   xnn_operator_t *op) {
  const ops_conv_geom *g = &c->conv;
  const uint32_t ph = (uint32_t)g->ph, pw = (uint32_t)g->pw;
  if (c->dtype == BP_ABI_DTYPE_FP32)
    return xnn_create_convolution2d_nhwc_f32(
        ph, pw, ph, pw, (uint32_t)g->kh, (uint32_t)g->kw, (uint32_t)g->sh, (uint32_t)g->sw,
        (uint32_t)g->dh, (uint32_t)g->dw, (uint32_t)g->groups, (size_t)g->cg, (size_t)g->kg,
        (size_t)g->x->padded_c, (size_t)g->y->padded_c, w, b, -INFINITY, INFINITY, 0, op);
  return xnn_create_convolution2d_nhwc_f16(
      ph, pw, ph, pw, (uint32_t)g->kh, (uint32_t)g->kw, (uint32_t)g->sh, (uint32_t)g->sw,
      (uint32_t)g->dh, (uint32_t)g->dw, (uint32_t)g->groups, (size_t)g->cg, (size_t)g->kg,
      (size_t)g->x->padded_c, (size_t)g->y->padded_c, w, b, -INFINITY, INFINITY, 0, op);
}

static enum xnn_status conv_setup(const weighted_call *c, xnn_operator_t op, const void *x,
                                  void *y, pthreadpool_t pool) {
  const ops_conv_geom *g = &c->conv;
  return c->dtype == BP_ABI_DTYPE_FP32
             ? xnn_setup_convolution2d_nhwc_f32(op, (size_t)g->n, (size_t)g->h, (size_t)g->w_,
                                                x, y, pool)
             : xnn_setup_convolution2d_nhwc_f16(op, (size_t)g->n, (size_t)g->h, (size_t)g->w_,
                                                x, y, pool);
}

static const weighted_op conv_op = {"convolution", conv_check, conv_create, conv_setup};
const bp_abi_kernel xnnp_conv2d_fwd = WEIGHTED_KERNEL("conv2d.fwd", conv_op);

/* ---- fc.fwd -------------------------------------------------------------------------- */

static int fc_check(const bp_abi_kernel_args *args, weighted_call *c, char *reason, size_t rs) {
  xnnp_args_view v;
  ops_fc_geom *g = &c->fc;
  c->dtype = xnnp_view_as_fp32(args, &v, reason, rs);
  if (c->dtype < 0 || !ops_fc_check(&v.args, OPS_PASS_FWD, g, reason, rs)) return 0;
  if (c->dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  g->x = bp_sdk_input(args, 0), g->w = bp_sdk_input(args, 1), g->y = bp_sdk_output(args, 0);
  g->b = g->has_bias ? bp_sdk_input(args, 2) : NULL;
  c->w = g->w, c->b = g->b, c->n = g->n;
  if (!fp16_reduction_ok(c->dtype, g->f, reason, rs)) return 0;
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
  c->in_stride = g->n > 1 ? (size_t)x->stride[0] : (size_t)g->f;
  c->out_stride = g->n > 1 ? (size_t)y->stride[0] : (size_t)g->o;
  return 1;
}

static enum xnn_status fc_create(const weighted_call *c, const void *w, const void *b,
                                 xnn_operator_t *op) {
  const size_t f = (size_t)c->fc.f, o = (size_t)c->fc.o;
  return c->dtype == BP_ABI_DTYPE_FP32
             ? xnn_create_fully_connected_nc_f32(f, o, c->in_stride, c->out_stride, w, b,
                                                 -INFINITY, INFINITY, 0, op)
             : xnn_create_fully_connected_nc_f16(f, o, c->in_stride, c->out_stride, w, b,
                                                 -INFINITY, INFINITY, 0, op);
}

static enum xnn_status fc_setup(const weighted_call *c, xnn_operator_t op, const void *x,
                                void *y, pthreadpool_t pool) {
  return c->dtype == BP_ABI_DTYPE_FP32
             ? xnn_setup_fully_connected_nc_f32(op, (size_t)c->n, x, y, pool)
             : xnn_setup_fully_connected_nc_f16(op, (size_t)c->n, x, y, pool);
}

static const weighted_op fc_op = {"fully-connected", fc_check, fc_create, fc_setup};
const bp_abi_kernel xnnp_fc_fwd = WEIGHTED_KERNEL("fc.fwd", fc_op);
