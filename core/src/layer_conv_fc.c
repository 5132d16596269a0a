/* Layer types with weights: conv (conv2d) and fc (fully connected).
 *
 *   conv  x[N,H,W,C] -> y[N,OH,OW,F], w [F,kh,kw,C/groups], b [1,1,1,F]
 *         OH = (H + 2*pad - (dilation*(kh-1)+1)) / stride + 1
 *   fc    x[N,H,W,C] (read as [N, H*W*C]) -> y[N,1,1,U], w [U,1,1,H*W*C], b [1,1,1,U]
 *
 * Weights are Kaiming normal (fan_in, gain sqrt 2: they feed ReLUs or BN;
 * one rule for every weight, the logits layer included); a conv reading
 * the model input goes to CONV_FIRST, any other to CONV_DEEP. Biases are
 * zeros in the FC_BIAS regions, which hold every bias-like parameter (no
 * weight decay). Backward: bwd_filter (dw, db) always, bwd_data (dx) only
 * when the producer needs its gradient. */
#include "layer-impl.h"

#define FIELD(member) offsetof(bp_layer, member)

static const bp_layer_key key_filters = {
    .key = "filters", .field = "units", .kind = BP_KEY_INT, .offset = FIELD(units),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .required = 1};
static const bp_layer_key key_units = {
    .key = "units", .field = "units", .kind = BP_KEY_INT, .offset = FIELD(units),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .required = 1};
static const bp_layer_key key_dilation = {
    .key = "dilation", .field = "dilation", .kind = BP_KEY_INT, .offset = FIELD(dilation),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .default_value = 1};
static const bp_layer_key key_groups = {
    .key = "groups", .field = "groups", .kind = BP_KEY_INT, .offset = FIELD(groups),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .default_value = 1};

/* ---- shapes ----------------------------------------------------------------- */

/* One sliding window (conv and the pools, layer_pool.c): checks the kernel
 * fits its padded input; (in + 2*pad - extent) / stride + 1. Cannot
 * overflow: every term is at most BP_MODEL_DIM_MAX (2^31). */
bp_status bp_layer_window_shape(bp_layer_compile *c, int64_t dilation) {
  const bp_layer *l = c->layer;
  const bp_shape in = c->in[0];
  int64_t eh = dilation * (l->kernel_h - 1) + 1, ew = dilation * (l->kernel_w - 1) + 1;
  int64_t ph = in.h + 2 * l->pad, pw = in.w + 2 * l->pad;
  if (eh > ph || ew > pw)
    return bp_layer_fail(c, BP_ERR_SHAPE,
                         "%lldx%lld kernel (dilation %lld) is larger than its padded input "
                         "%lldx%lld (pad %lld)",
                         (long long)l->kernel_h, (long long)l->kernel_w, (long long)dilation,
                         (long long)ph, (long long)pw, (long long)l->pad);
  c->out = (bp_shape){in.n, (ph - eh) / l->stride + 1, (pw - ew) / l->stride + 1, in.c};
  if (c->out.h < 1 || c->out.w < 1) /* kept as a guard; the check above implies it */
    return bp_layer_fail(c, BP_ERR_SHAPE, "output extent %lldx%lld is below 1",
                         (long long)c->out.h, (long long)c->out.w);
  return BP_OK;
}

static bp_status conv_shape(bp_layer_compile *c) {
  const bp_layer *l = c->layer;
  const bp_shape in = c->in[0];
  if (in.c % l->groups || l->units % l->groups)
    return bp_layer_fail(c, BP_ERR_SHAPE,
                         "groups %lld must divide both its %lld input channels and its %lld "
                         "filters",
                         (long long)l->groups, (long long)in.c, (long long)l->units);
  bp_status st = bp_layer_window_shape(c, l->dilation);
  c->out.c = l->units;
  return st;
}

static bp_status fc_shape(bp_layer_compile *c) {
  const bp_shape in = c->in[0];
  int64_t flat;
  char a[96];
  if (__builtin_mul_overflow(in.h, in.w, &flat) || __builtin_mul_overflow(flat, in.c, &flat))
    return bp_layer_fail(c, BP_ERR_OVERFLOW, "flattening input %s overflows 64 bits",
                         bp_shape_str(in, a, sizeof a));
  c->out = (bp_shape){in.n, 1, 1, c->layer->units};
  return BP_OK;
}

/* ---- tensors ------------------------------------------------------------------ */

/* w (Kaiming normal), then b (zeros) when the layer has a bias. */
static bp_status weights(bp_layer_compile *c, bp_param_kind kind, bp_shape w) {
  bp_status st = bp_layer_param(c, kind, "w", w, BP_INIT_KAIMING_NORMAL, &c->t->weight);
  if (st == BP_OK && c->layer->bias)
    st = bp_layer_param(c, BP_PARAM_FC_BIAS, "b", (bp_shape){1, 1, 1, c->out.c}, BP_INIT_ZEROS,
                        &c->t->bias);
  return st;
}

static bp_status conv_alloc(bp_layer_compile *c) {
  const bp_layer *l = c->layer;
  const bp_param_kind kind =
      l->inputs[0] == BP_MODEL_INPUT ? BP_PARAM_CONV_FIRST : BP_PARAM_CONV_DEEP;
  return weights(c, kind, (bp_shape){l->units, l->kernel_h, l->kernel_w, c->in[0].c / l->groups});
}

static bp_status fc_alloc(bp_layer_compile *c) {
  const bp_shape in = c->in[0]; /* H*W*C checked by fc_shape */
  return weights(c, BP_PARAM_FC_WEIGHT, (bp_shape){c->layer->units, 1, 1, in.h * in.w * in.c});
}

/* ---- nodes -------------------------------------------------------------------- */

static void conv_attrs(bp_node *n, const bp_layer *l) {
  BP_SET_ATTRS(n, conv2d,
               {(int32_t)l->kernel_h, (int32_t)l->kernel_w, (int32_t)l->stride,
                (int32_t)l->stride, (int32_t)l->pad, (int32_t)l->pad, (int32_t)l->dilation,
                (int32_t)l->dilation, (int32_t)l->groups, l->bias, 0});
}

static void fc_attrs(bp_node *n, const bp_layer *l) { BP_SET_ATTRS(n, fc, {l->bias, 0}); }

/* in: x, w [, b]   out: y */
static void forward(bp_layer_graph *g, const char *op, void (*attrs)(bp_node *, const bp_layer *)) {
  bp_node *n = bp_layer_node(g, op, "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, bp_layer_param_in(g, &g->t->weight));
  if (g->layer->bias) bp_node_in(n, bp_layer_param_in(g, &g->t->bias));
  bp_node_out(n, g->t->out);
  attrs(n, g->layer);
}

/* bwd_filter in: x, dy  out: dw [, db];  bwd_data in: dy, w  out: dx */
static void backward(bp_layer_graph *g, const char *filter_op, const char *data_op,
                     void (*attrs)(bp_node *, const bp_layer *)) {
  bp_node *n = bp_layer_backward_node(g, filter_op, "bwd_filter");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &g->t->weight));
  if (g->layer->bias) bp_layer_grad_out(g, n, bp_layer_param_grad(g, &g->t->bias));
  attrs(n, g->layer);
  if (!bp_layer_input_needs_grad(g, 0)) return;
  n = bp_layer_backward_node(g, data_op, "bwd_data");
  bp_node_in(n, g->t->dout);
  bp_node_in(n, bp_layer_param_in(g, &g->t->weight));
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  attrs(n, g->layer);
}

static void conv_forward(bp_layer_graph *g) { forward(g, "conv2d.fwd", conv_attrs); }
static void fc_forward(bp_layer_graph *g) { forward(g, "fc.fwd", fc_attrs); }
static void conv_backward(bp_layer_graph *g) {
  backward(g, "conv2d.bwd_filter", "conv2d.bwd_data", conv_attrs);
}
static void fc_backward(bp_layer_graph *g) { backward(g, "fc.bwd_filter", "fc.bwd_data", fc_attrs); }

/* ---- descriptors ---------------------------------------------------------------- */

static const bp_layer_key *const conv_keys[] = {&key_filters,  &bp_key_kernel, &bp_key_stride,
                                                &bp_key_pad,   &key_dilation,  &key_groups,
                                                &bp_key_bias};
static const bp_layer_key *const fc_keys[] = {&key_units, &bp_key_bias};

const bp_layer_desc bp_layer_conv = {
    .name = "conv",
    .inputs = 1,
    .keys = conv_keys,
    .key_count = sizeof conv_keys / sizeof conv_keys[0],
    .has_params = 1,
    .decayed_weights = 1,
    .shape = conv_shape,
    .alloc = conv_alloc,
    .forward = conv_forward,
    .backward = conv_backward,
};

const bp_layer_desc bp_layer_fc = {
    .name = "fc",
    .inputs = 1,
    .keys = fc_keys,
    .key_count = sizeof fc_keys / sizeof fc_keys[0],
    .has_params = 1,
    .decayed_weights = 1,
    .shape = fc_shape,
    .alloc = fc_alloc,
    .forward = fc_forward,
    .backward = fc_backward,
};
