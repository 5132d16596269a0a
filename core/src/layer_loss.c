/* The loss: softmax_ce, softmax cross-entropy over [N,1,1,classes] logits.
 *
 * Tensors: "<l>.prob" [N,1,1,classes] FP32 (T) and the results "loss" and
 * "correct" [1,1,1,1] (R); no feature of its own. Its one node
 * (softmax_ce.fwd_bwd) runs in LOSS while training, where it also writes
 * dlogits into the logits' gradient slot when they need it, and in EVAL
 * without a gradient (graph.h). */
#include "layer-impl.h"

static const bp_layer_key key_label_smoothing = {
    .key = "label_smoothing", .field = "label_smoothing", .kind = BP_KEY_NUMBER,
    .offset = offsetof(bp_layer, label_smoothing), .lo = 0, .hi = 1, .hi_open = 1};

static bp_status loss_shape(bp_layer_compile *c) {
  const bp_shape in = c->in[0];
  char a[96];
  if (in.h != 1 || in.w != 1 || in.c != c->model->classes)
    return bp_layer_fail(c, BP_ERR_SHAPE,
                         "its input '%s' is %s; softmax_ce needs [N,1,1,%lld] (one score per "
                         "class; add an fc or global_avgpool layer)",
                         bp_layer_producer_name(c->model, c->layer->inputs[0]),
                         bp_shape_str(in, a, sizeof a), (long long)c->model->classes);
  c->out = in;
  return BP_OK;
}

static bp_status loss_alloc(bp_layer_compile *c) {
  char name[BP_NAME_MAX];
  bp_status st;
  const bp_shape scalar = {1, 1, 1, 1};
  if ((st = bp_plan_alloc_temp(c->plan, bp_layer_tensor_name(name, c->layer, "prob"), c->out,
                               BP_DTYPE_FP32, &c->t->prob)) != BP_OK ||
      (st = bp_plan_alloc_result(c->plan, "loss", scalar, &c->globals->loss)) != BP_OK ||
      (st = bp_plan_alloc_result(c->plan, "correct", scalar, &c->globals->correct)) != BP_OK)
    return bp_layer_plan_fail(c, st);
  return BP_OK;
}

/* in: logits, labels   out: loss, correct [, dlogits] */
static void loss_forward(bp_layer_graph *g) {
  const int grad = !g->eval && bp_layer_input_needs_grad(g, 0);
  bp_node *n = bp_layer_node(g, "softmax_ce.fwd_bwd", g->eval ? "eval" : "fwd_bwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, g->globals->label[0]);
  bp_node_out(n, g->globals->loss);
  bp_node_out(n, g->globals->correct);
  if (grad) bp_node_out(n, bp_layer_input_grad(g, 0));
  BP_SET_ATTRS(n, softmax_ce,
               {g->layer->label_smoothing, (float)(1.0 / (double)g->global_batch), grad, 0});
}

static const bp_layer_key *const loss_keys[] = {&key_label_smoothing};

const bp_layer_desc bp_layer_softmax_ce = {
    .name = "softmax_ce",
    .inputs = 1,
    .keys = loss_keys,
    .key_count = sizeof loss_keys / sizeof loss_keys[0],
    .no_feature = 1,
    .shape = loss_shape,
    .alloc = loss_alloc,
    .forward = loss_forward,
};
