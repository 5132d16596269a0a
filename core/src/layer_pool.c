/* Pooling layer types: maxpool, avgpool (sliding windows) and
 * global_avgpool.
 *
 *   maxpool         x[N,H,W,C] -> y[N,OH,OW,C] (as conv, dilation 1), and
 *                   "<l>.mask" INT8 of y's shape (S_MASK): the argmax
 *   avgpool         the same without a mask; the padding counts, as
 *                   PyTorch's AvgPool2d by default
 *   global_avgpool  x[N,H,W,C] -> y[N,1,1,C]
 *
 * A window moves by its own size unless `stride:` says otherwise; a window
 * lying wholly in the padding would have no input to pool. */
#include <stdio.h>

#include "layer-impl.h"

static int window_check(const bp_layer *l, char *why, size_t why_size) {
  if (2 * l->pad > l->kernel_h || 2 * l->pad > l->kernel_w) {
    snprintf(why, why_size, "pad %lld is more than half of the %lldx%lld kernel",
             (long long)l->pad, (long long)l->kernel_h, (long long)l->kernel_w);
    return -1;
  }
  return 0;
}

static bp_status window_shape(bp_layer_compile *c) { return bp_layer_window_shape(c, 1); }

static bp_status global_shape(bp_layer_compile *c) {
  c->out = (bp_shape){c->in[0].n, 1, 1, c->in[0].c};
  return BP_OK;
}

static bp_status maxpool_alloc(bp_layer_compile *c) {
  char name[BP_NAME_MAX];
  bp_status st = bp_plan_alloc_mask(c->plan, bp_layer_tensor_name(name, c->layer, "mask"), c->out,
                                    &c->t->mask);
  return st == BP_OK ? BP_OK : bp_layer_plan_fail(c, st);
}

static void pool_attrs(bp_node *n, const bp_layer *l) {
  BP_SET_ATTRS(n, pool,
               {(int32_t)l->kernel_h, (int32_t)l->kernel_w, (int32_t)l->stride,
                (int32_t)l->stride, (int32_t)l->pad, (int32_t)l->pad,
                l->type == BP_LAYER_AVGPOOL, 0});
}

/* maxpool.fwd in: x  out: y, mask;  avgpool.fwd in: x  out: y */
static void maxpool_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "maxpool.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  bp_node_out(n, g->t->mask);
  pool_attrs(n, g->layer);
}

static void avgpool_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "avgpool.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  pool_attrs(n, g->layer);
}

static void global_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "global_avgpool.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  BP_SET_ATTRS(n, elementwise, {0});
}

/* maxpool.bwd in: dy, mask  out: dx;  avgpool.bwd, global_avgpool.bwd in: dy  out: dx */
static void maxpool_backward(bp_layer_graph *g) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, "maxpool.bwd", "bwd");
  bp_node_in(n, g->t->dout);
  bp_node_in(n, g->t->mask);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  pool_attrs(n, g->layer);
}

static void avgpool_backward(bp_layer_graph *g) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, "avgpool.bwd", "bwd");
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  pool_attrs(n, g->layer);
}

static void global_backward(bp_layer_graph *g) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, "global_avgpool.bwd", "bwd");
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  BP_SET_ATTRS(n, elementwise, {0});
}

static const bp_layer_key *const window_keys[] = {&bp_key_kernel, &bp_key_stride, &bp_key_pad};

const bp_layer_desc bp_layer_maxpool = {
    .name = "maxpool",
    .inputs = 1,
    .keys = window_keys,
    .key_count = sizeof window_keys / sizeof window_keys[0],
    .stride_is_kernel = 1,
    .check = window_check,
    .shape = window_shape,
    .alloc = maxpool_alloc,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
};

const bp_layer_desc bp_layer_avgpool = {
    .name = "avgpool",
    .inputs = 1,
    .keys = window_keys,
    .key_count = sizeof window_keys / sizeof window_keys[0],
    .stride_is_kernel = 1,
    .check = window_check,
    .shape = window_shape,
    .forward = avgpool_forward,
    .backward = avgpool_backward,
};

const bp_layer_desc bp_layer_global_avgpool = {
    .name = "global_avgpool",
    .inputs = 1,
    .shape = global_shape,
    .forward = global_forward,
    .backward = global_backward,
};
