/* The pos_embed layer type: a learned position embedding.
 *
 *   pos_embed  x[N,H,W,C] -> y = x + P, P "<l>.weight" [1,H,W,C] added to
 *              every sample; normal(0, 0.02) (as ViT's position
 *              embedding), seeded by its name like every parameter. P
 *              sits in batch norm's weight region (BN_WEIGHT), the
 *              parameters the optimizers update without weight decay (as
 *              timm's ViT keeps pos_embed out of decay), and is saved in
 *              checkpoints with the other parameters.
 *
 * A token sequence of T = H*W tokens of width C is the NHWC tensor itself
 * (token t = h*W + w), so P holds one embedding per token. Its backward
 * always writes dx, into a sink where the producer is the model's input
 * (bp_layer_input_grad), as batchnorm's does. */
#include "layer-impl.h"

#define POS_EMBED_STD 0.02f

static bp_status pos_embed_shape(bp_layer_compile *c) {
  c->out = c->in[0];
  return BP_OK;
}

static bp_status pos_embed_alloc(bp_layer_compile *c) {
  const bp_shape p = {1, c->out.h, c->out.w, c->out.c};
  return bp_layer_param_init(c, BP_PARAM_BN_WEIGHT, "weight", p,
                             (bp_init){BP_INIT_NORMAL, 0.0f, POS_EMBED_STD, 0}, &c->t->weight);
}

/* in: x, P   out: y */
static void pos_embed_forward(bp_layer_graph *g) {
  bp_node *n = bp_layer_node(g, "pos_embed.fwd", "fwd");
  bp_node_in(n, bp_layer_input(g, 0));
  bp_node_in(n, bp_layer_param_in(g, &g->t->weight));
  bp_node_out(n, g->t->out);
  BP_SET_ATTRS(n, elementwise, {0});
}

/* in: dy   out: dx, dP */
static void pos_embed_backward(bp_layer_graph *g) {
  bp_node *n = bp_layer_backward_node(g, "pos_embed.bwd", "bwd");
  bp_node_in(n, g->t->dout);
  bp_layer_grad_out(g, n, bp_layer_input_grad(g, 0));
  bp_layer_grad_out(g, n, bp_layer_param_grad(g, &g->t->weight));
  BP_SET_ATTRS(n, elementwise, {0});
}

const bp_layer_desc bp_layer_pos_embed = {
    .name = "pos_embed",
    .inputs = 1,
    .has_params = 1,
    .shape = pos_embed_shape,
    .alloc = pos_embed_alloc,
    .forward = pos_embed_forward,
    .backward = pos_embed_backward,
};
