/* What validation needs to know about each built-in op (abi/bp_abi_ops.h)
 * beyond its descriptors: the value ranges its inputs must hold (labels
 * below the class count, positive variances, a valid maxpool mask), the
 * outputs it reads before writing (optimizer state, accumulating loss),
 * the outputs it updates in place, where its accumulate flag lives and
 * which input an IN_PLACE kernel's output may be. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "validate-impl.h"

static void set_fill(vc_tensor *t, vc_fill fill, double lo, double hi) {
  if (t->fill != VC_FILL_UNSET) return; /* the case decided */
  t->fill = fill;
  t->lo = lo;
  t->hi = hi;
}

static int starts(const char *op, const char *p) { return strncmp(op, p, strlen(p)) == 0; }
static int is(const vc_case *c, const char *op) { return strcmp(c->op, op) == 0; }
static int prefix(const vc_case *c, const char *p) { return starts(c->op, p); }
/* batchnorm.<pass> or its fused form batchnorm_relu.<pass> */
static int is_bn(const vc_case *c, const char *pass) {
  const char *p = starts(c->op, "batchnorm.")        ? c->op + 10
                  : starts(c->op, "batchnorm_relu.") ? c->op + 15
                                                     : NULL;
  return p && strcmp(p, pass) == 0;
}

/* (1.5) The skip input of range.ema and the optimizers: its index, or -1;
 * *flag_out: the byte offset of has_skip in the op's attribute block. */
static int skip_input(const vc_case *c, size_t *flag_out) {
  *flag_out = is(c, "range.ema") ? offsetof(bp_range_attrs, has_skip)
                                 : offsetof(bp_optimizer_attrs, has_skip);
  return is(c, "range.ema") ? 1 : is(c, "range.sgd") ? 2
         : is(c, "range.adamw") || is(c, "range.lars") ? 3 : -1;
}

/* An output read before written, filled like a parameter. */
static void rmw(vc_case *c, int o, vc_fill fill, double lo, double hi) {
  if (o >= c->num_outputs) return;
  c->rmw[o] = 1;
  set_fill(&c->out[o], fill, lo, hi);
}

void vc_op_complete(vc_case *c) {
  c->accumulate_offset = -1;
  c->inplace_in = -1;
  c->collective = prefix(c, "allreduce.");
  if (is(c, "conv2d.bwd_data") || is(c, "conv2d.bwd_filter"))
    c->accumulate_offset = (int)offsetof(bp_conv2d_attrs, accumulate);
  if (is(c, "fc.bwd_data") || is(c, "fc.bwd_filter"))
    c->accumulate_offset = (int)offsetof(bp_fc_attrs, accumulate);
  if (is(c, "relu.bwd") || is(c, "add.bwd") || is(c, "global_avgpool.bwd"))
    c->accumulate_offset = (int)offsetof(bp_elementwise_attrs, accumulate);
  if (is(c, "maxpool.bwd") || is(c, "avgpool.bwd"))
    c->accumulate_offset = (int)offsetof(bp_pool_attrs, accumulate);
  if (is_bn(c, "bwd")) c->accumulate_offset = (int)offsetof(bp_batchnorm_attrs, accumulate);
  if (c->accumulate_offset >= 0 && (uint32_t)c->accumulate_offset + 4 > c->attr_size)
    c->accumulate_offset = -1; /* a block too short to hold the flag */

  if (is(c, "relu.fwd")) c->inplace_in = 0;
  if (is(c, "relu.bwd")) {
    c->inplace_in = 1; /* dx may be dy */
    set_fill(&c->in[0], VC_FILL_RELU_Y, -1, 1);
  }
  if (is(c, "maxpool.bwd") && c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_POOL_MASK, 0, 0);
  if (is_bn(c, "fwd_train") || is_bn(c, "fwd_eval")) {
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_UNIFORM, 0.5, 1.5); /* gamma */
    if (c->num_inputs > 4) set_fill(&c->in[4], VC_FILL_UNIFORM, 0.5, 1.5); /* running var */
  }
  if (is_bn(c, "fwd_train"))
    for (int o = 3; o < 5 && o < c->num_outputs; o++) c->alias[o] = o; /* running stats, in place */
  if (is_bn(c, "bwd")) {
    if (c->num_inputs > 2) set_fill(&c->in[2], VC_FILL_UNIFORM, 0.5, 1.5); /* gamma */
    if (c->num_inputs > 4) set_fill(&c->in[4], VC_FILL_UNIFORM, 0.5, 2.0); /* save_invstd */
    if (c->num_inputs > 5) set_fill(&c->in[5], VC_FILL_RELU_Y, -1, 1); /* relu output y */
  }
  if (is(c, "softmax_ce.fwd_bwd")) {
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_INT, 0, (double)c->in[0].d.shape[3] - 1);
    set_fill(&c->in[0], VC_FILL_UNIFORM, -3, 3);
    rmw(c, 0, VC_FILL_UNIFORM, 0, 4); /* loss and correct accumulate across steps */
    rmw(c, 1, VC_FILL_INT, 0, 5);
  }
  if (is(c, "softmax_ce.fwd_bwd") && c->num_inputs > 2)
    set_fill(&c->in[2], VC_FILL_CONST, 1024, 0); /* the loss scale */
  if (is(c, "range.unscale")) {
    set_fill(&c->in[0], VC_FILL_UNIFORM, -1000, 1000); /* gradients times the scale */
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_CONST, 65536, 0);
  }
  if (is(c, "range.loss_scale")) { /* scale, good_steps, step, skipped: read and written */
    set_fill(&c->in[0], VC_FILL_CONST, 0, 0);
    static const double start[4] = {65536, 5, 10, 2};
    for (int o = 0; o < 4; o++) rmw(c, o, VC_FILL_CONST, start[o], 0);
  }
  if (is(c, "range.scale") && c->num_outputs > 0) c->alias[0] = 0;
  if (is(c, "range.ema")) rmw(c, 0, VC_FILL_UNIFORM, -1, 1);
  if (is(c, "range.nan_check")) rmw(c, 0, VC_FILL_CONST, 0, 0);
  if (is(c, "range.sgd") || is(c, "range.adamw") || is(c, "range.lars")) {
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_CONST, is(c, "range.adamw") ? 0.01 : 0.1, 0);
    if (is(c, "range.adamw") && c->num_inputs > 2) set_fill(&c->in[2], VC_FILL_CONST, 3, 0);
    if (is(c, "range.lars") && c->num_inputs > 2) set_fill(&c->in[2], VC_FILL_SEGMENTS, 0, 0);
    rmw(c, 0, VC_FILL_UNIFORM, -1, 1);
    rmw(c, 1, VC_FILL_UNIFORM, -0.1, 0.1);
    if (is(c, "range.adamw")) rmw(c, 2, VC_FILL_UNIFORM, 0, 0.01);
  }

  /* (1.5) the skip input; when it skips, every output is data to keep */
  c->skip_in = -1;
  size_t skip_flag;
  const int skip_at = skip_input(c, &skip_flag);
  int32_t has_skip = 0;
  if (skip_at >= 0 && skip_flag + 4 <= c->attr_size) memcpy(&has_skip, c->attrs + skip_flag, 4);
  if (has_skip && c->num_inputs == skip_at + 1) {
    c->skip_in = skip_at;
    set_fill(&c->in[skip_at], VC_FILL_CONST, 0, 0);
    if (c->in[skip_at].fill == VC_FILL_CONST && c->in[skip_at].lo != 0)
      for (int o = 0; o < c->num_outputs; o++) rmw(c, o, VC_FILL_UNIFORM, -1, 1);
  }

  /* everything left open: uniform data, integers in a small range */
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      vc_tensor *t = side ? &c->out[i] : &c->in[i];
      const int integer = t->d.dtype == BP_ABI_DTYPE_INT8 || t->d.dtype == BP_ABI_DTYPE_INT32;
      if (integer) set_fill(t, VC_FILL_INT, -100, 100);
      else set_fill(t, VC_FILL_UNIFORM, -1, 1);
    }
  }
  for (int o = 0; o < c->num_outputs; o++)
    if (c->alias[o] >= c->num_inputs) c->alias[o] = -1;
}

double vc_impl_fp32_tolerance(const char *impl, int no_tf32) {
  /* TF32 keeps 10 mantissa bits: inputs rounded to 2^-11, products to
   * about 1e-3 relative (docs/validate.md) */
  if ((starts(impl, "cudnn") || starts(impl, "cublas")) && !no_tf32) return VC_TF32_TOLERANCE;
  return vc_tolerance(BP_ABI_DTYPE_FP32);
}

void vc_op_fp16_tolerance(const char *op, double *rtol, double *atol) {
  *rtol = 0x1p-11; /* one rounding to nearest FP16 of the FP32 result */
  if (starts(op, "range.") || starts(op, "allreduce.")) {
    *rtol = *atol = 0; /* copies, casts: exact */
  } else if (starts(op, "relu.") || starts(op, "add.") || starts(op, "maxpool.")) {
    *atol = 1e-5; /* a selection or a sum of a few terms */
  } else if (starts(op, "batchnorm.") || starts(op, "softmax_ce.")) {
    *atol = 1e-4; /* FP32 sums in another order */
  } else if (starts(op, "avgpool.") || starts(op, "global_avgpool.")) {
    *atol = 1e-3; /* window sums; XNNPACK's FP16 global pool sums in FP16 */
  } else {
    *atol = 1e-2; /* conv2d, fc (XNNPACK's FP16 GEMMs accumulate in FP16), module ops */
  }
}

/* ---- AMP twins ------------------------------------------------------------------- */

/* Tensors an AMP plan keeps FP32: batch norm statistics, the loss, its
 * count and the loss scale. side 0: input, 1: output. */
static int amp_fp32(const vc_case *c, int side, int i) {
  if (is(c, "batchnorm.fwd_train")) return side ? i >= 1 : i >= 3;
  if (is(c, "batchnorm.fwd_eval") || is(c, "batchnorm.bwd")) return !side && i >= 3;
  if (is(c, "softmax_ce.fwd_bwd")) return side ? i <= 1 : i >= 2;
  return 0;
}

/* Weights, biases, gamma, beta and their gradients: FP16 in the plan's
 * compact parameter layout (the case's padded_c is kept). */
static int amp_param(const vc_case *c, int side, int i) {
  if (prefix(c, "conv2d.") || prefix(c, "fc.")) {
    if (strstr(c->op, ".fwd")) return !side && i >= 1;
    if (strstr(c->op, ".bwd_data")) return !side && i == 1;
    return side; /* bwd_filter: dw, db */
  }
  if (is(c, "batchnorm.bwd")) return side ? i >= 1 : i == 2;
  if (prefix(c, "batchnorm.")) return !side && (i == 1 || i == 2);
  return 0;
}

/* x of a layer that may be the model's first: the input's padding (4). */
static int amp_input(const vc_case *c, int side, int i) {
  return !side && i == 0 &&
         (is(c, "conv2d.fwd") || is(c, "conv2d.bwd_filter") || is(c, "fc.fwd") ||
          is(c, "fc.bwd_filter"));
}

int vc_case_amp(const vc_case *c, vc_case *out) {
  /* the fused batchnorm_relu ops are FP32 only (the graph fuses FP32 features) */
  if (prefix(c, "range.") || prefix(c, "batchnorm_relu.") || c->collective) return 0;
  *out = *c;
  int any = 0;
  for (int side = 0; side < 2; side++) {
    const int n = side ? c->num_outputs : c->num_inputs;
    for (int i = 0; i < n; i++) {
      vc_tensor *t = side ? &out->out[i] : &out->in[i];
      if (t->d.dtype != BP_ABI_DTYPE_FP32 || amp_fp32(c, side, i)) continue;
      const int64_t ch = t->d.shape[3];
      /* a compact input stands for the model's input, padded to 4; a
       * padded one for a feature, padded to 8 like every other */
      const int64_t align = amp_input(c, side, i) && t->d.padded_c == ch ? 4 : 8;
      const int64_t pad = amp_param(c, side, i) ? t->d.padded_c : (ch + align - 1) / align * align;
      t->d = vc_tensor_desc(BP_ABI_DTYPE_FP16, t->d.shape[0], t->d.shape[1], t->d.shape[2], ch,
                            pad);
      any = 1;
    }
  }
  if (any) snprintf(out->name, sizeof out->name, "%.88s fp16", c->name);
  return any;
}

int vc_case_oracle(const vc_case *c, vc_case *out) {
  int changed = 0;
  *out = *c;
  if (!prefix(c, "range.") && !c->collective) changed = vc_case_widen(c, out);
  const int s = c->skip_in;
  if (s >= 0 && s == c->num_inputs - 1 && c->in[s].fill == VC_FILL_CONST && c->in[s].lo == 0) {
    size_t flag;
    (void)skip_input(c, &flag);
    memset(out->attrs + flag, 0, 4);
    out->num_inputs--;
    out->skip_in = -1;
    changed = 1;
  }
  return changed;
}
