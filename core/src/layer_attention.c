/* The attention layer type: multi-head self-attention over tokens.
 *
 *   attention  qkv[N,H,W,3D] -> y[N,H,W,D]   (T = H*W tokens, token h*W + w)
 *              keys: heads (required, divides D), causal (default false)
 *              saved: "<l>.lse" [N,H,W,heads] FP32, the log-sum-exp of each
 *              token's scores per head, written by the forward and read by
 *              the backward
 *
 * Each position's channels are [q | k | v] (a 1x1 conv with 3D filters
 * makes them); head j uses channels j*dh.. of each, dh = D/heads, and
 * writes channels j*dh.. of y (abi/bp_abi_ops.h, attention.fwd). The
 * backward recomputes the [T,T] probabilities of every head from q, k and
 * lse instead of keeping them: the plan holds heads floats per token
 * instead of heads*T (docs/plan.md, "Attention"). lse is a feature of the
 * F region like batch norm's saved statistics, so liveness packing frees
 * its bytes after the backward, and it is per sample, so every variant
 * (the last partial batch, the eval batch) keeps its offset with a slot
 * sized for the largest. Its backward also reads y, the layer's own
 * output (D_t = dy_t . y_t). */
#include "layer-impl.h"

#define FIELD(member) offsetof(bp_layer, member)

static const bp_layer_key key_heads = {
    .key = "heads", .field = "heads", .kind = BP_KEY_INT, .offset = FIELD(heads),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .default_value = 1, .required = 1};
static const bp_layer_key key_causal = {
    .key = "causal", .field = "causal", .kind = BP_KEY_BOOL, .offset = FIELD(causal),
    .lo = 0, .hi = 1, .default_value = 0};

static bp_status attn_shape(bp_layer_compile *c) {
  const bp_shape in = c->in[0];
  const int64_t heads = c->layer->heads;
  char s[96];
  if (in.c % 3 != 0)
    return bp_layer_fail(c, BP_ERR_SHAPE,
                         "input '%s' %s has %lld channels, expected a multiple of 3 "
                         "([q | k | v] of width D each)",
                         bp_layer_producer_name(c->model, c->layer->inputs[0]),
                         bp_shape_str(in, s, sizeof s), (long long)in.c);
  if (heads < 1 || (in.c / 3) % heads != 0)
    return bp_layer_fail(c, BP_ERR_SHAPE, "heads %lld does not divide D = %lld (input %s / 3)",
                         (long long)heads, (long long)(in.c / 3), bp_shape_str(in, s, sizeof s));
  c->out = in;
  c->out.c = in.c / 3;
  return BP_OK;
}

static bp_status attn_alloc(bp_layer_compile *c) {
  const bp_shape lse = {c->out.n, c->out.h, c->out.w, c->layer->heads};
  return bp_layer_feature(c, "lse", lse, BP_DTYPE_FP32, &c->t->saved[0]);
}

static void attn_attrs(bp_node *n, const bp_layer *l) {
  BP_SET_ATTRS(n, attention, {(int32_t)l->heads, l->causal ? 1 : 0, 0});
}

/* in: qkv   out: y, lse */
static void attn_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "attention.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_out(n, g->t->out);
  bp_node_out(n, g->t->saved[0]);
  attn_attrs(n, g->layer);
}

/* in: qkv, y, lse, dy   out: dqkv */
static void attn_backward(bp_layer_graph *g) {
  if (!bp_layer_input_needs_grad(g, 0)) return;
  bp_node *n = bp_layer_backward_node(g, "attention.bwd", "bwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, g->t->out);
  bp_node_in(n, g->t->saved[0]);
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  attn_attrs(n, g->layer);
}

static const bp_layer_key *const attn_keys[] = {&key_heads, &key_causal};

const bp_layer_desc bp_layer_attention = {
    .name = "attention",
    .inputs = 1,
    .keys = attn_keys,
    .key_count = sizeof attn_keys / sizeof attn_keys[0],
    .shape = attn_shape,
    .alloc = attn_alloc,
    .forward = attn_forward,
    .backward = attn_backward,
};
