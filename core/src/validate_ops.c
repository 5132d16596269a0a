/* What validation needs to know about each built-in op (abi/bp_abi_ops.h)
 * beyond its descriptors: the value ranges its inputs must hold (labels
 * below the class count, positive variances, a valid maxpool mask), the
 * outputs it reads before writing (optimizer state, accumulating loss),
 * the outputs it updates in place, where its accumulate flag lives and
 * which input an IN_PLACE kernel's output may be. */
#include <stddef.h>
#include <string.h>

#include "validate-impl.h"

static void set_fill(vc_tensor *t, vc_fill fill, double lo, double hi) {
  if (t->fill != VC_FILL_UNSET) return; /* the case decided */
  t->fill = fill;
  t->lo = lo;
  t->hi = hi;
}

static int is(const vc_case *c, const char *op) { return strcmp(c->op, op) == 0; }
static int prefix(const vc_case *c, const char *p) { return strncmp(c->op, p, strlen(p)) == 0; }

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
  if (is(c, "batchnorm.bwd")) c->accumulate_offset = (int)offsetof(bp_batchnorm_attrs, accumulate);
  if (c->accumulate_offset >= 0 && (uint32_t)c->accumulate_offset + 4 > c->attr_size)
    c->accumulate_offset = -1; /* a block too short to hold the flag */

  if (is(c, "relu.fwd")) c->inplace_in = 0;
  if (is(c, "relu.bwd")) {
    c->inplace_in = 1; /* dx may be dy */
    set_fill(&c->in[0], VC_FILL_RELU_Y, -1, 1);
  }
  if (is(c, "maxpool.bwd") && c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_POOL_MASK, 0, 0);
  if (is(c, "batchnorm.fwd_train") || is(c, "batchnorm.fwd_eval")) {
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_UNIFORM, 0.5, 1.5); /* gamma */
    if (c->num_inputs > 4) set_fill(&c->in[4], VC_FILL_UNIFORM, 0.5, 1.5); /* running var */
  }
  if (is(c, "batchnorm.fwd_train"))
    for (int o = 3; o < 5 && o < c->num_outputs; o++) c->alias[o] = o; /* running stats, in place */
  if (is(c, "batchnorm.bwd")) {
    if (c->num_inputs > 2) set_fill(&c->in[2], VC_FILL_UNIFORM, 0.5, 1.5); /* gamma */
    if (c->num_inputs > 4) set_fill(&c->in[4], VC_FILL_UNIFORM, 0.5, 2.0); /* save_invstd */
  }
  if (is(c, "softmax_ce.fwd_bwd")) {
    if (c->num_inputs > 1) set_fill(&c->in[1], VC_FILL_INT, 0, (double)c->in[0].d.shape[3] - 1);
    set_fill(&c->in[0], VC_FILL_UNIFORM, -3, 3);
    rmw(c, 0, VC_FILL_UNIFORM, 0, 4); /* loss and correct accumulate across steps */
    rmw(c, 1, VC_FILL_INT, 0, 5);
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
