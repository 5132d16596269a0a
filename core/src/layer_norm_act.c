/* Layer types that keep the shape: batchnorm, layernorm, relu, gelu, gelu_tanh
 * and add.
 *
 *   batchnorm  x[N,H,W,C] -> y, over C: gamma "<l>.weight" (ones, BN_WEIGHT),
 *              beta "<l>.bias" (zeros, BN_BIAS), running mean and var (B),
 *              save_mean and save_invstd [1,1,1,C] FP32 features (what the
 *              backward needs from the forward batch statistics)
 *   layernorm  x[N,H,W,C] -> y, per position over its C channels: gain
 *              "<l>.weight" (ones, BN_WEIGHT), bias "<l>.bias" (zeros,
 *              BN_BIAS), so the optimizer treats them as batch norm's (no
 *              weight decay); save_mean and save_invstd [N,H,W,1] FP32
 *              features, written by every forward (train and eval alike)
 *   relu       y = max(x, 0)
 *   gelu       y = x * Phi(x) (erf form); its backward reads x
 *   gelu_tanh  y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); its backward reads x
 *   add        y = a + b, two inputs of one shape (a residual)
 *
 * batchnorm, layernorm and add always write their data gradients, into a sink where
 * the producer is the model's input (bp_layer_input_grad).
 *
 * A batchnorm whose only reader is a relu may run fused with it
 * (g->fused_relu, graph_build.c): batchnorm_relu.fwd_train / .fwd_eval
 * write the relu's ".out" directly, and batchnorm_relu.bwd reads the relu's
 * ".out" and ".dout"; the relu layer adds no node, and the batchnorm's own
 * ".out" and ".dout" are never touched (liveness packing gives them no
 * bytes of their own). */
#include <math.h>

#include "layer-impl.h"

#define FIELD(member) offsetof(bp_layer, member)

/* eps stays > 0 once rounded to float (the parser checks it) */
static const bp_layer_key key_eps = {
    .key = "eps", .field = "eps", .kind = BP_KEY_NUMBER, .offset = FIELD(eps),
    .lo = 0, .hi = 1, .lo_open = 1, .default_value = 1e-5};
static const bp_layer_key key_momentum = {
    .key = "momentum", .field = "momentum", .kind = BP_KEY_NUMBER, .offset = FIELD(momentum),
    .lo = 0, .hi = 1, .default_value = 0.1};

static bp_status same_shape(bp_layer_compile *c) {
  c->out = c->in[0];
  return BP_OK;
}

/* ---- batchnorm ------------------------------------------------------------------- */

static bp_status bn_alloc(bp_layer_compile *c) {
  const bp_shape channel = {1, 1, 1, c->out.c};
  bp_layer_tensors *t = c->t;
  bp_status st;
  if ((st = bp_layer_param(c, BP_PARAM_BN_BIAS, "bias", channel, BP_INIT_ZEROS, &t->bias)) !=
          BP_OK ||
      (st = bp_layer_param(c, BP_PARAM_BN_WEIGHT, "weight", channel, BP_INIT_ONES, &t->weight)) !=
          BP_OK)
    return st;
  if ((st = bp_plan_alloc_bn_stats(c->plan, c->layer->name, c->out.c, t->running)) != BP_OK)
    return bp_layer_plan_fail(c, st);
  if ((st = bp_layer_feature(c, "save_mean", channel, BP_DTYPE_FP32, &t->saved[0])) != BP_OK ||
      (st = bp_layer_feature(c, "save_invstd", channel, BP_DTYPE_FP32, &t->saved[1])) != BP_OK)
    return st;
  return BP_OK;
}

/* train: in x, gamma, beta, running mean, var; out y, save_mean,
 * save_invstd, running mean, var (updated in place). eval: out y. */
static void bn_forward(bp_layer_graph *g) {
  const bp_layer_tensors *t = g->t;
  const bp_layer_tensors *r = g->fused_relu;
  const char *op = r ? (g->eval ? "batchnorm_relu.fwd_eval" : "batchnorm_relu.fwd_train")
                     : (g->eval ? "batchnorm.fwd_eval" : "batchnorm.fwd_train");
  bp_node *n = bp_layer_node(g, op, "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, bp_layer_param_in(g, &t->weight));
  bp_node_in(n, bp_layer_param_in(g, &t->bias));
  bp_node_in(n, t->running[0]);
  bp_node_in(n, t->running[1]);
  bp_node_out(n, r ? r->out : t->out);
  if (!g->eval) {
    bp_node_out(n, t->saved[0]);
    bp_node_out(n, t->saved[1]);
    bp_node_out(n, t->running[0]);
    bp_node_out(n, t->running[1]);
  }
  BP_SET_ATTRS(n, batchnorm, {g->layer->eps, g->layer->momentum, 0});
}

/* in: x, dy, gamma, save_mean, save_invstd (fused: then the relu's y)
 * out: dx, dgamma, dbeta */
static void bn_backward(bp_layer_graph *g) {
  const bp_layer_tensors *t = g->t, *r = g->fused_relu;
  bp_node *n = bp_layer_backward_node(g, r ? "batchnorm_relu.bwd" : "batchnorm.bwd", "bwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, r ? r->dout : t->dout);
  bp_node_in(n, bp_layer_param_in(g, &t->weight));
  bp_node_in(n, t->saved[0]);
  bp_node_in(n, t->saved[1]);
  if (r) bp_node_in(n, r->out);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &t->weight));
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &t->bias));
  BP_SET_ATTRS(n, batchnorm, {g->layer->eps, g->layer->momentum, 0});
}

/* ---- layernorm -------------------------------------------------------------------- */

static bp_status ln_alloc(bp_layer_compile *c) {
  const bp_shape channel = {1, 1, 1, c->out.c}, position = {c->out.n, c->out.h, c->out.w, 1};
  bp_layer_tensors *t = c->t;
  bp_status st;
  if ((st = bp_layer_param(c, BP_PARAM_BN_BIAS, "bias", channel, BP_INIT_ZEROS, &t->bias)) !=
          BP_OK ||
      (st = bp_layer_param(c, BP_PARAM_BN_WEIGHT, "weight", channel, BP_INIT_ONES, &t->weight)) !=
          BP_OK)
    return st;
  if ((st = bp_layer_feature(c, "save_mean", position, BP_DTYPE_FP32, &t->saved[0])) != BP_OK ||
      (st = bp_layer_feature(c, "save_invstd", position, BP_DTYPE_FP32, &t->saved[1])) != BP_OK)
    return st;
  return BP_OK;
}

/* in: x, gain, bias   out: y, save_mean, save_invstd (train and eval) */
static void ln_forward(bp_layer_graph *g) {
  const bp_layer_tensors *t = g->t;
  bp_node *n = bp_layer_node(g, "layernorm.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, bp_layer_param_in(g, &t->weight));
  bp_node_in(n, bp_layer_param_in(g, &t->bias));
  bp_node_out(n, t->out);
  bp_node_out(n, t->saved[0]);
  bp_node_out(n, t->saved[1]);
  BP_SET_ATTRS(n, layernorm, {g->layer->eps, 0});
}

/* in: x, dy, gain, save_mean, save_invstd   out: dx, dgain, dbias */
static void ln_backward(bp_layer_graph *g) {
  const bp_layer_tensors *t = g->t;
  bp_node *n = bp_layer_backward_node(g, "layernorm.bwd", "bwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, t->dout);
  bp_node_in(n, bp_layer_param_in(g, &t->weight));
  bp_node_in(n, t->saved[0]);
  bp_node_in(n, t->saved[1]);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &t->weight));
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &t->bias));
  BP_SET_ATTRS(n, layernorm, {g->layer->eps, 0});
}

/* ---- relu ---------------------------------------------------------------------------- */

static void relu_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "relu.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  BP_SET_ATTRS(n, elementwise, {0});
}

/* in: y, dy   out: dx */
static void relu_backward(bp_layer_graph *g) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, "relu.bwd", "bwd");
  bp_node_in(n, g->t->out);
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  BP_SET_ATTRS(n, elementwise, {0});
}

/* ---- gelu, gelu_tanh ------------------------------------------------------------------ */

/* An activation whose backward needs its input x: fwd (x -> y), bwd (x, dy -> dx). */
static void x_activation_forward(bp_layer_graph *g, const char *op) {
  bp_node *n = bp_layer_node(g, op, "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  BP_SET_ATTRS(n, elementwise, {0});
}

static void x_activation_backward(bp_layer_graph *g, const char *op) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, op, "bwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  BP_SET_ATTRS(n, elementwise, {0});
}

static void gelu_forward(bp_layer_graph *g) { x_activation_forward(g, "gelu.fwd"); }
static void gelu_backward(bp_layer_graph *g) { x_activation_backward(g, "gelu.bwd"); }
static void gelu_tanh_forward(bp_layer_graph *g) { x_activation_forward(g, "gelu_tanh.fwd"); }
static void gelu_tanh_backward(bp_layer_graph *g) { x_activation_backward(g, "gelu_tanh.bwd"); }

/* ---- add ------------------------------------------------------------------------------ */

static bp_status add_shape(bp_layer_compile *c) {
  const bp_shape a = c->in[0], b = c->in[1];
  char sa[96], sb[96];
  if (a.n != b.n || a.h != b.h || a.w != b.w || a.c != b.c)
    return bp_layer_fail(c, BP_ERR_SHAPE, "inputs '%s' %s and '%s' %s must have the same shape",
                         bp_layer_producer_name(c->model, c->layer->inputs[0]),
                         bp_shape_str(a, sa, sizeof sa),
                         bp_layer_producer_name(c->model, c->layer->inputs[1]),
                         bp_shape_str(b, sb, sizeof sb));
  c->out = a;
  return BP_OK;
}

static void add_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "add.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, bp_layer_input(g, 1));
  bp_node_out(n, g->t->out);
  BP_SET_ATTRS(n, elementwise, {0});
}

/* in: dy   out: da, db */
static void add_backward(bp_layer_graph *g) {
  bp_node *n = bp_layer_backward_node(g, "add.bwd", "bwd");
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 1));
  BP_SET_ATTRS(n, elementwise, {0});
}

/* ---- descriptors ------------------------------------------------------------------------ */

static const bp_layer_key *const bn_keys[] = {&key_eps, &key_momentum};

const bp_layer_desc bp_layer_batchnorm = {
    .name = "batchnorm",
    .inputs = 1,
    .keys = bn_keys,
    .key_count = sizeof bn_keys / sizeof bn_keys[0],
    .has_params = 1,
    .shape = same_shape,
    .alloc = bn_alloc,
    .forward = bn_forward,
    .backward = bn_backward,
};

static const bp_layer_key *const ln_keys[] = {&key_eps};

const bp_layer_desc bp_layer_layernorm = {
    .name = "layernorm",
    .inputs = 1,
    .keys = ln_keys,
    .key_count = sizeof ln_keys / sizeof ln_keys[0],
    .has_params = 1,
    .shape = same_shape,
    .alloc = ln_alloc,
    .forward = ln_forward,
    .backward = ln_backward,
};

const bp_layer_desc bp_layer_relu = {
    .name = "relu",
    .inputs = 1,
    .shape = same_shape,
    .forward = relu_forward,
    .backward = relu_backward,
};

const bp_layer_desc bp_layer_gelu = {
    .name = "gelu",
    .inputs = 1,
    .shape = same_shape,
    .forward = gelu_forward,
    .backward = gelu_backward,
};

const bp_layer_desc bp_layer_add = {
    .name = "add",
    .inputs = 2,
    .shape = add_shape,
    .forward = add_forward,
    .backward = add_backward,
};

const bp_layer_desc bp_layer_gelu_tanh = {
    .name = "gelu_tanh",
    .inputs = 1,
    .shape = same_shape,
    .forward = gelu_tanh_forward,
    .backward = gelu_tanh_backward,
};
