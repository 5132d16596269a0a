/* Graph building: from a model and its compiled plan, the nodes of every
 * segment of every variant (graph.h says what each segment holds).
 *
 * Tensors are the ids compile.c recorded with the plan (layer-impl.h,
 * bp_model_tensors); a plan without that record, or with another model's,
 * is BP_ERR_STATE. What each layer type adds is its descriptor's
 * (layer-impl.h); this file runs them in order and decides accumulation.
 *
 * The backward pass is planned in two steps. First every backward node is
 * generated in run order (layers in reverse) with the gradient slots it
 * writes, parameter gradients included; then the nodes are walked in that
 * order. A node whose slots are all fresh (no earlier node wrote them, and
 * it names each once) overwrites them; the later writers of a slot
 * accumulate onto it. Only a node that writes a fresh slot and also one
 * already written (or one slot twice) must accumulate into the fresh one,
 * which is zeroed right before it. So a step's backward leaves every
 * gradient it reaches fresh without the ZERO_GRAD segment, which only a
 * rank with no samples runs, and with few zero nodes (a fan-out's first
 * writer overwrites instead of adding to zeros: the same values, as 0 + g
 * is g). The zero sits just before that writer, not at the top of the
 * segment, because a "sink" slot (below) may still be read by later
 * backward nodes before it.
 *
 * A layer type from a module without a backward op stops the gradient:
 * layers upstream of it (on that path only) get none, and their backward
 * nodes are left out.
 *
 * Fusion: when the plan was compiled with fuse_bn_relu (FP32 features:
 * never with AMP), a batchnorm whose output has exactly one reader, a relu,
 * runs as one batchnorm_relu node per pass and the relu adds none
 * (layer_norm_act.c); the bits are those of the two unfused nodes
 * (bp_abi_ops.h). The session packs the plan over this same graph.
 *
 * Sinks: batch norm and add always write their data gradients, even where
 * the producer is the model's input, which has no gradient slot. Such a
 * gradient goes into the layer's own ".out": by the time the layer's
 * backward runs, every node that reads that output (its consumers'
 * backward nodes, which come later in the model and so earlier in the
 * backward pass) has run. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/op_table.h"
#include "bp_abi_sdk.h"
#include "graph-impl.h"
#include "layer-impl.h"
#include "liveness-impl.h"

void bp_graph_options_init(bp_graph_options *o) {
  memset(o, 0, sizeof *o);
  o->world = 1;
  o->optimizer.momentum = 0.9f;
  o->optimizer.weight_decay = 5e-4f;
  o->optimizer.beta1 = 0.9f;
  o->optimizer.beta2 = 0.999f;
  o->optimizer.eps = 1e-8f;
  o->optimizer.eta = 0.001f;
  o->ema_decay = 0.999f;
  o->loss_scale = (bp_loss_scale_attrs){2.0f, 0.5f, 2000};
}

/* ---- context ---------------------------------------------------------------- */

/* A backward node before its accumulate flag is known: which outputs are
 * gradient slots (counted), and where its block keeps the flag. */
typedef struct pending {
  bp_node node;
  int slot_outputs[3]; /* output indices that are gradient slots */
  int slot_count;
  size_t accumulate_offset; /* of the int32 flag in node.attrs */
} pending;

typedef struct build_ctx {
  bp_graph *g;
  const bp_model *m;
  const bp_plan *plan;
  int amp, ema;
  const bp_layer_tensors *ids; /* [layer_count] the compiler's record */
  const bp_global_tensors *globals;
  int *needs;     /* [layer_count] a parameter at or upstream: the gradient matters */
  int *reaches;   /* [layer_count] a path to the loss */
  int *flows;     /* [layer_count] the loss's gradient flows back to it */
  int *fuse;      /* [layer_count] batchnorm: the relu fused into it; that relu:
                     FUSED_AWAY; else -1 */
  int32_t input, lr, step, lars_segments, lars_norms; /* from globals: input in I_A */
  int32_t loss_scale, found_inf, good_steps, skipped;  /* AMP's scalars (-1 without) */
  int *written; /* [tensor count] a writer already ran */
  int variant;
  variant_graph *vg;
  bp_segment seg;   /* where forward nodes go */
  pending *pend;    /* backward nodes of the variant, in run order */
  int pend_count, pend_cap;
} build_ctx;

/* The compiler's record of the plan's ids, if it was compiled from this
 * model (same layers, same names and types). */
static bp_status find_record(build_ctx *x) {
  const bp_model_tensors *r = bp_model_tensors_of(x->plan);
  int same = r && r->layer_count == x->m->layer_count;
  for (int i = 0; same && i < r->layer_count; i++)
    same = r->types[i] == x->m->layers[i].type &&
           strncmp(r->names[i], x->m->layers[i].name, BP_NAME_MAX - 1) == 0;
  if (!same)
    return bp_fail(BP_ERR_STATE,
                   "graph of model '%s': the plan %s (was it compiled from this model?)",
                   x->m->name,
                   r ? "holds the tensors of other layers" : "has no record of a model's tensors");
  x->ids = r->layers;
  x->globals = &r->globals;
  const bp_global_tensors *gt = &r->globals;
  x->g->tensors = (bp_graph_tensors){{gt->input[0], gt->input[1]},
                                     {gt->label[0], gt->label[1]},
                                     gt->lr,
                                     gt->loss_scale,
                                     gt->step,
                                     gt->loss,
                                     gt->correct,
                                     gt->found_inf,
                                     gt->good_steps,
                                     gt->skipped};
  x->input = r->globals.input[0];
  x->lr = r->globals.lr;
  x->step = r->globals.step;
  x->lars_segments = r->globals.lars_segments;
  x->lars_norms = r->globals.lars_norms;
  x->loss_scale = gt->loss_scale;
  x->found_inf = gt->found_inf;
  x->good_steps = gt->good_steps;
  x->skipped = gt->skipped;
  if (x->amp && (x->found_inf < 0 || x->good_steps < 0 || x->skipped < 0))
    return bp_fail(BP_ERR_STATE, "graph of model '%s': an AMP plan without its loss-scale scalars",
                   x->m->name);
  return BP_OK;
}

/* Whether a gradient flows back through layer l to its inputs (a module
 * type without a backward op stops it). */
static int passes_grad(const bp_layer *l) {
  const bp_layer_desc *d = bp_layer_desc_for(l);
  return !d->passes_grad || d->passes_grad(l);
}

/* needs[i]: layer i or one upstream (through layers that pass gradients)
 * has parameters: its output gradient matters. reaches[i]: a path leads
 * from layer i to the loss. flows[i]: one that the gradient passes. */
static void analyze(build_ctx *x) {
  const bp_model *m = x->m;
  for (int i = 0; i < m->layer_count; i++) {
    const bp_layer *l = &m->layers[i];
    x->needs[i] = bp_layer_desc_for(l)->has_params;
    for (int k = 0; k < l->input_count; k++)
      if (l->inputs[k] != BP_MODEL_INPUT && x->needs[l->inputs[k]] && passes_grad(l))
        x->needs[i] = 1;
  }
  for (int i = m->layer_count - 1; i >= 0; i--) {
    const bp_layer *l = &m->layers[i];
    if (i == m->layer_count - 1) x->reaches[i] = x->flows[i] = 1;
    if (!x->reaches[i]) continue;
    for (int k = 0; k < l->input_count; k++) {
      if (l->inputs[k] == BP_MODEL_INPUT) continue;
      x->reaches[l->inputs[k]] = 1;
      if (x->flows[i] && passes_grad(l)) x->flows[l->inputs[k]] = 1;
    }
  }
}

#define FUSED_AWAY (-2)

/* Which batchnorm + relu pairs run fused: the relu is the batchnorm's only
 * reader (one input of one layer), so nothing else needs the batchnorm's
 * own output, in any pass. */
static void plan_fusion(build_ctx *x) {
  const bp_model *m = x->m;
  for (int i = 0; i < m->layer_count; i++) x->fuse[i] = -1;
  if (!bp_model_tensors_of(x->plan)->fuse_bn_relu) return;
  for (int i = 0; i < m->layer_count; i++) {
    if (m->layers[i].type != BP_LAYER_BATCHNORM) continue;
    int readers = 0, reader = -1;
    for (int j = 0; j < m->layer_count; j++)
      for (int k = 0; k < m->layers[j].input_count; k++)
        if (m->layers[j].inputs[k] == i) readers++, reader = j;
    if (readers == 1 && m->layers[reader].type == BP_LAYER_RELU) {
      x->fuse[i] = reader;
      x->fuse[reader] = FUSED_AWAY;
    }
  }
}

/* ---- nodes ----------------------------------------------------------------- */

static bp_node *node_add(build_ctx *x, bp_segment seg, const char *op, int layer,
                         const char *what) {
  seg_list *s = &x->vg->segs[seg];
  BP_ASSERT(s->count < s->cap); /* capacity is sized from the layer count */
  bp_node *n = &s->nodes[s->count++];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->layer = layer;
  if (layer >= 0)
    snprintf(n->name, sizeof n->name, "%s.%s", x->m->layers[layer].name, what);
  else
    snprintf(n->name, sizeof n->name, "%s", what);
  return n;
}

void bp_node_in(bp_node *n, int32_t id) {
  BP_ASSERT(n->num_inputs < BP_NODE_MAX_TENSORS && id >= 0);
  n->inputs[n->num_inputs++] = (bp_node_tensor){.id = id, .dtype = BP_DTYPE_FP32, .slot = -1};
}
void bp_node_out(bp_node *n, int32_t id) {
  BP_ASSERT(n->num_outputs < BP_NODE_MAX_TENSORS && id >= 0);
  n->outputs[n->num_outputs++] = (bp_node_tensor){.id = id, .dtype = BP_DTYPE_FP32, .slot = -1};
}

/* A span with what it covers (graph.h, bp_node_tensor); the node that
 * takes it gives its dtype. */
typedef bp_node_tensor span_ref;

static void in_span(bp_node *n, span_ref s, bp_dtype dt) {
  BP_ASSERT(n->num_inputs < BP_NODE_MAX_TENSORS);
  s.dtype = dt;
  n->inputs[n->num_inputs++] = s;
}
static void out_span(bp_node *n, span_ref s, bp_dtype dt) {
  BP_ASSERT(n->num_outputs < BP_NODE_MAX_TENSORS);
  s.dtype = dt;
  n->outputs[n->num_outputs++] = s;
}

#define SET_ATTRS BP_SET_ATTRS

/* The bytes of regions [first, last] of `plan`. */
static bp_span regions_bytes(const bp_plan *plan, bp_region first, bp_region last) {
  bp_span s = {0, 0};
  bp_status st = bp_plan_resolve(plan, first, last, &s);
  BP_ASSERT(st == BP_OK);
  return s;
}

/* The bytes of one tensor's slot in a variant (padding of channels included). */
static bp_span slot_bytes(const bp_plan *plan, int variant, int32_t id) {
  const bp_dtensor *t = bp_plan_tensor(plan, variant, id);
  BP_ASSERT(t != NULL);
  return (bp_span){t->offset, bp_dtensor_device_elems(t) * bp_dtype_size(t->dtype)};
}

static span_ref resolve(const build_ctx *x, bp_region first, bp_region last) {
  return (span_ref){.id = -1, .span = regions_bytes(x->plan, first, last), .slot = -1,
                    .first = first, .last = last};
}

/* Span of parameter kinds [k0, k1] in `family`. */
static span_ref family_span(const build_ctx *x, bp_param_family f, bp_param_kind k0,
                            bp_param_kind k1) {
  return resolve(x, bp_region_of_param(f, k0), bp_region_of_param(f, k1));
}

/* The slot of one tensor in this variant. */
static span_ref tensor_span(const build_ctx *x, int32_t id) {
  return (span_ref){.id = -1, .span = slot_bytes(x->plan, x->variant, id), .slot = id};
}

/* ---- what the layer descriptors build with (layer-impl.h) ------------------------ */

static build_ctx *ctx_of(const bp_layer_graph *g) { return g->impl; }

static bp_layer_graph layer_graph(build_ctx *x, int i, int eval) {
  return (bp_layer_graph){
      .model = x->m,
      .layer = &x->m->layers[i],
      .index = i,
      .t = &x->ids[i],
      .globals = x->globals,
      .eval = eval,
      .global_batch = x->vg->global_batch,
      .fused_relu = x->fuse[i] >= 0 ? &x->ids[x->fuse[i]] : NULL,
      .impl = x,
  };
}

bp_node *bp_layer_node(bp_layer_graph *g, const char *op, const char *what) {
  build_ctx *x = ctx_of(g);
  return node_add(x, x->seg, op, g->index, what);
}

bp_node *bp_layer_backward_node_at(bp_layer_graph *g, const char *op, const char *what,
                                   size_t accumulate_offset) {
  build_ctx *x = ctx_of(g);
  BP_ASSERT(x->pend_count < x->pend_cap && accumulate_offset + 4 <= sizeof(bp_node_attrs));
  pending *p = &x->pend[x->pend_count++];
  memset(p, 0, sizeof *p);
  p->node.op = op;
  p->node.layer = g->index;
  p->accumulate_offset = accumulate_offset;
  snprintf(p->node.name, sizeof p->node.name, "%s.%s", g->layer->name, what);
  return &p->node;
}

bp_node *bp_layer_backward_node(bp_layer_graph *g, const char *op, const char *what) {
  const bp_op_info *info = bp_op_find(op);
  BP_ASSERT(info && info->accumulates);
  return bp_layer_backward_node_at(g, op, what, info->accumulate_offset);
}

void bp_layer_grad_out(bp_layer_graph *g, bp_node *n, int32_t id) {
  build_ctx *x = ctx_of(g);
  pending *p = &x->pend[x->pend_count - 1];
  BP_ASSERT(x->pend_count > 0 && n == &p->node && p->slot_count < 3);
  p->slot_outputs[p->slot_count++] = n->num_outputs;
  bp_node_out(n, id);
}

int32_t bp_layer_input(const bp_layer_graph *g, int k) {
  const build_ctx *x = ctx_of(g);
  const int p = g->layer->inputs[k];
  return p == BP_MODEL_INPUT ? x->input : x->ids[p].out;
}

/* The model's input has no gradient slot: such a gradient goes into the
 * layer's own ".out" (a sink; see the top of this file). */
int32_t bp_layer_input_grad(const bp_layer_graph *g, int k) {
  const build_ctx *x = ctx_of(g);
  const int p = g->layer->inputs[k];
  return p == BP_MODEL_INPUT ? g->t->out : x->ids[p].dout;
}

int bp_layer_input_needs_grad(const bp_layer_graph *g, int k) {
  const build_ctx *x = ctx_of(g);
  const int p = g->layer->inputs[k];
  return p != BP_MODEL_INPUT && x->needs[p];
}

int32_t bp_layer_param_in(const bp_layer_graph *g, const bp_param_ids *p) {
  const build_ctx *x = ctx_of(g);
  if (x->amp) return p->a;
  if (g->eval && x->g->options.eval_ema) return p->e;
  return p->w;
}

int32_t bp_layer_param_grad(const bp_layer_graph *g, const bp_param_ids *p) {
  return ctx_of(g)->amp ? p->g16 : p->g;
}

/* ---- forward and backward ------------------------------------------------------------ */

/* The forward node(s) of layer i into `seg` (training or evaluation mode). */
static void forward_layer(build_ctx *x, bp_segment seg, int i, int eval) {
  if (x->fuse[i] == FUSED_AWAY) return; /* its batchnorm's node writes its output */
  bp_layer_graph g = layer_graph(x, i, eval);
  x->seg = seg;
  bp_layer_desc_for(g.layer)->forward(&g);
}

static void backward_layer(build_ctx *x, int i) {
  if (x->fuse[i] == FUSED_AWAY) return; /* its batchnorm's node reads its gradient */
  bp_layer_graph g = layer_graph(x, i, 0);
  const bp_layer_desc *d = bp_layer_desc_for(g.layer);
  if (d->backward) d->backward(&g);
}

static bp_status build_backward(build_ctx *x) {
  const bp_model *m = x->m;
  x->pend_cap = 3 * m->layer_count + 4;
  x->pend_count = 0;
  x->pend = calloc((size_t)x->pend_cap, sizeof *x->pend);
  if (!x->pend) return bp_fail(BP_ERR_NOMEM, "out of memory building the backward graph");
  for (int i = m->layer_count - 1; i >= 0; i--)
    if (x->needs[i] && x->flows[i]) backward_layer(x, i);
  pending *list = x->pend;
  const int count = x->pend_count;

  const int32_t tensors = bp_plan_tensor_count(x->plan);
  memset(x->written, 0, (size_t)tensors * sizeof *x->written);
  /* the loss node overwrites the logits' slot first (dlogits) */
  const bp_layer *loss = &m->layers[m->layer_count - 1];
  if (loss->inputs[0] != BP_MODEL_INPUT && x->needs[loss->inputs[0]])
    x->written[x->ids[loss->inputs[0]].dout] = 1;

  for (int k = 0; k < count; k++) {
    pending *p = &list[k];
    /* overwrite when every slot of the node is fresh: not written before
     * and named once among its outputs (add(x, x) writes x's twice) */
    int32_t accumulate = 0;
    for (int s = 0; s < p->slot_count; s++) {
      const int32_t id = p->node.outputs[p->slot_outputs[s]].id;
      if (x->written[id]) accumulate = 1;
      for (int r = 0; r < s; r++)
        if (p->node.outputs[p->slot_outputs[r]].id == id) accumulate = 1;
    }
    memcpy((unsigned char *)&p->node.attrs + p->accumulate_offset, &accumulate,
           sizeof accumulate);
    for (int s = 0; s < p->slot_count; s++) {
      const int32_t id = p->node.outputs[p->slot_outputs[s]].id;
      if (x->written[id]) continue;
      x->written[id] = 1;
      if (!accumulate) continue; /* overwritten: no zero needed */
      const bp_dtensor *t = bp_plan_tensor(x->plan, x->variant, id);
      char what[BP_NAME_MAX + 8];
      snprintf(what, sizeof what, "zero %s", t->name);
      bp_node *z = node_add(x, BP_SEGMENT_BACKWARD, "range.zero", -1, what);
      out_span(z, tensor_span(x, id), t->dtype);
      SET_ATTRS(z, range, {0.0f, 0.0f, 0});
    }
    seg_list *b = &x->vg->segs[BP_SEGMENT_BACKWARD];
    BP_ASSERT(b->count < b->cap);
    b->nodes[b->count++] = p->node;
  }
  free(x->pend);
  x->pend = NULL;
  return BP_OK;
}

/* ---- range segments ---------------------------------------------------------- */

static void range_node(build_ctx *x, bp_segment seg, const char *op, const char *name, span_ref in,
                       bp_dtype in_dt, span_ref out, bp_dtype out_dt, float scale, float decay) {
  if (out.span.bytes == 0) return; /* an empty span: nothing to do */
  bp_node *n = node_add(x, seg, op, -1, name);
  if (in.span.bytes) in_span(n, in, in_dt);
  out_span(n, out, out_dt);
  SET_ATTRS(n, range, {scale, decay, 0});
}

/* The gradient buckets of the COMM segment, in the order they are reduced
 * (graph.h): the deep convolutions first, then every other kind. A sharded
 * update chunks each bucket over the ranks. */
typedef struct bucket {
  const char *name;
  bp_param_kind k0, k1;
} bucket;
static const bucket buckets[] = {{"deep conv", BP_PARAM_CONV_DEEP, BP_PARAM_CONV_DEEP},
                                 {"rest", BP_PARAM_BN_BIAS, BP_PARAM_CONV_FIRST}};
#define BUCKET_COUNT ((int)(sizeof buckets / sizeof buckets[0]))

/* One optimizer node over parameter kinds [k0, k1]; sharded over the ranks
 * when `b` is its bucket (NULL: replicated). */
static void update_node(build_ctx *x, const char *name, bp_param_kind k0, bp_param_kind k1,
                        int decayed, const bucket *b) {
  const bp_graph_optimizer *o = &x->g->options.optimizer;
  const bp_optimizer opt = bp_plan_get_options(x->plan)->optimizer;
  const span_ref w = family_span(x, BP_FAMILY_W, k0, k1);
  if (w.span.bytes == 0) return;
  const int lars = opt == BP_OPT_LARS && decayed;
  const char *op = opt == BP_OPT_ADAMW ? "range.adamw" : lars ? "range.lars" : "range.sgd";
  bp_node *n = node_add(x, BP_SEGMENT_UPDATE, op, -1, name);
  in_span(n, family_span(x, BP_FAMILY_G, k0, k1), BP_DTYPE_FP32);
  bp_node_in(n, x->lr);
  if (opt == BP_OPT_ADAMW) bp_node_in(n, x->step);
  if (lars) bp_node_in(n, x->lars_segments);
  out_span(n, w, BP_DTYPE_FP32);
  out_span(n, family_span(x, BP_FAMILY_M, k0, k1), BP_DTYPE_FP32);
  if (opt == BP_OPT_ADAMW) out_span(n, family_span(x, BP_FAMILY_V, k0, k1), BP_DTYPE_FP32);
  if (lars) bp_node_out(n, x->lars_norms);
  SET_ATTRS(n, optimizer,
            {o->momentum, decayed ? o->weight_decay : 0.0f, o->nesterov, o->beta1, o->beta2, o->eps,
             o->eta, x->amp});
  if (x->amp) bp_node_in(n, x->found_inf); /* the trailing skip input */
  if (b) {
    const span_ref whole = family_span(x, BP_FAMILY_W, b->k0, b->k1);
    BP_ASSERT(w.span.offset >= whole.span.offset &&
              w.span.offset + w.span.bytes <= whole.span.offset + whole.span.bytes);
    n->shard_domain = whole.span.bytes / sizeof(float);
    n->shard_first = (w.span.offset - whole.span.offset) / sizeof(float);
  }
}

/* One collective over the span of family f in bucket b. */
static void bucket_node(build_ctx *x, bp_segment seg, const char *op, bp_param_family f,
                        const bucket *b, const char *what) {
  const span_ref span = family_span(x, f, b->k0, b->k1);
  if (span.span.bytes == 0) return;
  char name[64];
  snprintf(name, sizeof name, "%s %s", what, b->name);
  bp_node *n = node_add(x, seg, op, -1, name);
  in_span(n, span, BP_DTYPE_FP32);
  out_span(n, span, BP_DTYPE_FP32);
  if (strcmp(op, "allreduce.all_gather") != 0) SET_ATTRS(n, allreduce, {1.0f});
}

/* COMM, UPDATE, GATHER and STATE (graph.h). AMP replicates the update:
 * the overflow check reads every rank's whole, equal G span. */
static void build_comm_and_update(build_ctx *x) {
  const bp_optimizer opt = bp_plan_get_options(x->plan)->optimizer;
  const int world = x->g->options.world;
  const int sharded =
      world > 1 && !x->g->options.replicate_update && opt != BP_OPT_LARS && !x->amp;
  if (world > 1) {
    for (int k = 0; k < BUCKET_COUNT; k++)
      bucket_node(x, BP_SEGMENT_COMM, sharded ? "allreduce.reduce_scatter" : "allreduce.sum",
                  BP_FAMILY_G, &buckets[k], sharded ? "reduce_scatter G" : "allreduce G");
    const span_ref bn = resolve(x, BP_REGION_B, BP_REGION_B);
    if (bn.span.bytes) {
      bp_node *n = node_add(x, BP_SEGMENT_COMM, "allreduce.sum", -1, "allreduce B (mean)");
      in_span(n, bn, BP_DTYPE_FP32);
      out_span(n, bn, BP_DTYPE_FP32);
      SET_ATTRS(n, allreduce, {1.0f / (float)world});
    }
  }
  if (x->amp) {
    bp_node *n = node_add(x, BP_SEGMENT_UPDATE, "range.nan_check", -1, "nan_check G");
    in_span(n, family_span(x, BP_FAMILY_G, BP_PARAM_BN_BIAS, BP_PARAM_CONV_DEEP), BP_DTYPE_FP32);
    bp_node_out(n, x->found_inf);
    SET_ATTRS(n, range, {0.0f, 0.0f, 0});
  }
  if (!sharded) {
    update_node(x, "update.decay", BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_DEEP, 1, NULL);
    update_node(x, "update.no_decay", BP_PARAM_BN_BIAS, BP_PARAM_FC_BIAS, 0, NULL);
    return;
  }
  const bucket *deep = &buckets[0], *rest = &buckets[1];
  update_node(x, "update.decay deep conv", BP_PARAM_CONV_DEEP, BP_PARAM_CONV_DEEP, 1, deep);
  update_node(x, "update.decay", BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_FIRST, 1, rest);
  update_node(x, "update.no_decay", BP_PARAM_BN_BIAS, BP_PARAM_FC_BIAS, 0, rest);
  for (int k = 0; k < BUCKET_COUNT; k++) {
    bucket_node(x, BP_SEGMENT_GATHER, "allreduce.all_gather", BP_FAMILY_W, &buckets[k],
                "all_gather W");
    bucket_node(x, BP_SEGMENT_STATE, "allreduce.all_gather", BP_FAMILY_M, &buckets[k],
                "all_gather M");
    if (opt == BP_OPT_ADAMW)
      bucket_node(x, BP_SEGMENT_STATE, "allreduce.all_gather", BP_FAMILY_V, &buckets[k],
                  "all_gather V");
  }
}

static void build_train_ranges(build_ctx *x) {
  const bp_param_kind first = BP_PARAM_BN_BIAS, last = BP_PARAM_CONV_DEEP;
  const span_ref none = {.id = -1, .slot = -1};
  const span_ref w = family_span(x, BP_FAMILY_W, first, last);
  const span_ref g = family_span(x, BP_FAMILY_G, first, last);
  if (x->amp) {
    const span_ref a = family_span(x, BP_FAMILY_A, first, last);
    const span_ref g16 = family_span(x, BP_FAMILY_G16, first, last);
    range_node(x, BP_SEGMENT_ZERO_GRAD, "range.zero", "zero_grad", none, BP_DTYPE_FP16, g16,
               BP_DTYPE_FP16, 0.0f, 0.0f);
    range_node(x, BP_SEGMENT_CAST, "range.cast", "cast W->A", w, BP_DTYPE_FP32, a, BP_DTYPE_FP16,
               0.0f, 0.0f);
    bp_node *z = node_add(x, BP_SEGMENT_CAST_GRAD, "range.zero", -1, "zero found_inf");
    bp_node_out(z, x->found_inf);
    SET_ATTRS(z, range, {0.0f, 0.0f, 0});
    if (g16.span.bytes) {
      bp_node *u = node_add(x, BP_SEGMENT_CAST_GRAD, "range.unscale", -1, "unscale G16->G");
      in_span(u, g16, BP_DTYPE_FP16);
      bp_node_in(u, x->loss_scale);
      out_span(u, g, BP_DTYPE_FP32);
      SET_ATTRS(u, range, {0.0f, 0.0f, 0});
    }
  } else {
    range_node(x, BP_SEGMENT_ZERO_GRAD, "range.zero", "zero_grad", none, BP_DTYPE_FP32, g,
               BP_DTYPE_FP32, 0.0f, 0.0f);
  }
  build_comm_and_update(x);
  if (x->ema) {
    const span_ref e = family_span(x, BP_FAMILY_E, first, last);
    range_node(x, BP_SEGMENT_EMA, "range.ema", "ema", w, BP_DTYPE_FP32, e, BP_DTYPE_FP32, 0.0f,
               x->g->options.ema_decay);
    seg_list *ema = &x->vg->segs[BP_SEGMENT_EMA];
    if (x->amp && ema->count > 0) { /* skipped with the update */
      bp_node *n = &ema->nodes[ema->count - 1];
      bp_node_in(n, x->found_inf);
      n->attrs.range.has_skip = 1;
    }
    range_node(x, BP_SEGMENT_INIT, "range.copy", "init E=W", w, BP_DTYPE_FP32, e, BP_DTYPE_FP32,
               0.0f, 0.0f);
  }
  if (x->amp) { /* last: UPDATE read the scale's step counter, EMA the flag */
    bp_node *n = node_add(x, BP_SEGMENT_EMA, "range.loss_scale", -1, "loss_scale");
    bp_node_in(n, x->found_inf);
    bp_node_out(n, x->loss_scale);
    bp_node_out(n, x->good_steps);
    bp_node_out(n, x->step);
    bp_node_out(n, x->skipped);
    n->attrs.loss_scale = x->g->options.loss_scale;
    n->attr_size = sizeof n->attrs.loss_scale;
  }
}

/* ---- LARS segment table -------------------------------------------------------- */

static int cmp_offset(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Element offsets of each weight in the decayed W span, then the span's
 * element count: parameter s owns [seg[s], seg[s+1]) (its slot padding,
 * zero in W and G, included). */
static bp_status build_lars_table(build_ctx *x) {
  const bp_dtensor *t = bp_plan_tensor(x->plan, 0, x->lars_segments);
  const span_ref span = family_span(x, BP_FAMILY_W, BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_DEEP);
  const int64_t s_count = t->shape.c - 1;
  uint64_t *offsets = calloc((size_t)s_count + 1, sizeof *offsets);
  int32_t *table = calloc((size_t)s_count + 1, sizeof *table);
  if (!offsets || !table) {
    free(offsets);
    free(table);
    return bp_fail(BP_ERR_NOMEM, "out of memory building the LARS table");
  }
  int64_t found = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(x->plan); id++) {
    const bp_dtensor *p = bp_plan_tensor(x->plan, 0, id);
    if (p->region < bp_region_of_param(BP_FAMILY_W, BP_PARAM_FC_WEIGHT) ||
        p->region > bp_region_of_param(BP_FAMILY_W, BP_PARAM_CONV_DEEP))
      continue;
    if (found < s_count) offsets[found] = p->offset;
    found++;
  }
  if (found != s_count || span.span.bytes / 4 > (uint64_t)INT32_MAX) {
    free(offsets);
    free(table);
    return bp_fail(BP_ERR_STATE,
                   "LARS: the plan's decayed span holds %lld weights of %llu bytes; "
                   "lars.segments has room for %lld (int32 offsets)",
                   (long long)found, (unsigned long long)span.span.bytes, (long long)s_count);
  }
  qsort(offsets, (size_t)s_count, sizeof *offsets, cmp_offset);
  for (int64_t s = 0; s < s_count; s++) table[s] = (int32_t)((offsets[s] - span.span.offset) / 4);
  table[s_count] = (int32_t)(span.span.bytes / 4);
  free(offsets);
  x->g->constants[0] =
      (bp_graph_constant){x->lars_segments, table, (uint64_t)(s_count + 1) * sizeof *table};
  x->g->constant_count = 1;
  return BP_OK;
}

/* ---- checks ------------------------------------------------------------------ */

static bp_status check_tensor(const build_ctx *x, int v, const bp_node *n,
                              const bp_node_tensor *t) {
  const uint64_t total = bp_plan_total_bytes(x->plan);
  if (t->id >= 0) {
    if (!bp_plan_tensor(x->plan, v, t->id))
      return bp_fail(BP_ERR_STATE, "graph: node '%s' names tensor id %d outside the plan", n->name,
                     (int)t->id);
    return BP_OK;
  }
  const size_t size = bp_dtype_size(t->dtype);
  if (size == 0 || t->span.bytes % size != 0 || t->span.offset > total ||
      t->span.bytes > total - t->span.offset)
    return bp_fail(BP_ERR_STATE,
                   "graph: node '%s' names span [%llu, +%llu) of %s outside the arena of %llu "
                   "bytes or not a whole number of elements",
                   n->name, (unsigned long long)t->span.offset, (unsigned long long)t->span.bytes,
                   bp_dtype_name(t->dtype), (unsigned long long)total);
  return BP_OK;
}

/* Invariants 1, 2 and 4 of graph.h for every node of every variant. */
static bp_status check_graph(const build_ctx *x) {
  for (int v = 0; v < x->g->variant_count; v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
      const seg_list *l = &x->g->variants[v].segs[s];
      for (int k = 0; k < l->count; k++) {
        const bp_node *n = &l->nodes[k];
        bp_status st;
        if (n->num_inputs > BP_NODE_MAX_TENSORS || n->num_outputs > BP_NODE_MAX_TENSORS)
          return bp_fail(BP_ERR_STATE, "graph: node '%s' has too many tensors", n->name);
        for (int i = 0; i < n->num_inputs; i++)
          if ((st = check_tensor(x, v, n, &n->inputs[i])) != BP_OK) return st;
        for (int i = 0; i < n->num_outputs; i++)
          if ((st = check_tensor(x, v, n, &n->outputs[i])) != BP_OK) return st;
        if (n->shard_domain && (n->inputs[0].id >= 0 || n->inputs[0].span.bytes % 4 != 0 ||
                                n->shard_first > n->shard_domain ||
                                n->inputs[0].span.bytes / 4 > n->shard_domain - n->shard_first))
          return bp_fail(BP_ERR_STATE,
                         "graph: sharded node '%s' does not lie inside its bucket of %llu "
                         "elements",
                         n->name, (unsigned long long)n->shard_domain);
        if (strncmp(n->op, "range.", 6) == 0 && strcmp(n->op, "range.zero") != 0) {
          /* the first input span against every output span */
          const bp_node_tensor *a = &n->inputs[0];
          for (int o = 0; o < n->num_outputs; o++) {
            const bp_node_tensor *b = &n->outputs[o];
            if (a->id >= 0 || b->id >= 0) continue;
            const uint64_t lhs = a->span.bytes * bp_dtype_size(b->dtype);
            const uint64_t rhs = b->span.bytes * bp_dtype_size(a->dtype);
            if (lhs != rhs)
              return bp_fail(BP_ERR_STATE,
                             "graph: node '%s' pairs a span of %llu bytes (%s) with one of "
                             "%llu bytes (%s): the element counts differ",
                             n->name, (unsigned long long)a->span.bytes, bp_dtype_name(a->dtype),
                             (unsigned long long)b->span.bytes, bp_dtype_name(b->dtype));
          }
        }
      }
    }
  return BP_OK;
}

/* ---- moving with the plan ------------------------------------------------------- */

bp_status bp_graph_relocate(bp_graph *g) {
  for (int v = 0; v < g->variant_count; v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int k = 0; k < g->variants[v].segs[s].count; k++) {
        bp_node *n = &g->variants[v].segs[s].nodes[k];
        for (int side = 0; side < 2; side++) {
          bp_node_tensor *list = side ? n->outputs : n->inputs;
          for (int i = 0; i < (side ? n->num_outputs : n->num_inputs); i++) {
            bp_node_tensor *t = &list[i];
            if (t->id >= 0) continue; /* a DTensor: its offset is read at bind */
            t->span = t->slot >= 0 ? slot_bytes(g->plan, v, t->slot)
                                   : regions_bytes(g->plan, t->first, t->last);
          }
        }
      }
  const build_ctx x = {.g = g, .m = g->model, .plan = g->plan};
  bp_status st = check_graph(&x);
  return st == BP_OK ? bp_liveness_check_graph(g->plan, g) : st;
}

/* ---- entry points ------------------------------------------------------------- */

static bp_status check_options(const bp_model *m, const bp_plan *plan, const bp_graph_options *o) {
  if (o->world < 1) return bp_fail(BP_ERR_INVALID, "graph: world %d must be >= 1", o->world);
  if (o->global_batch < 1 || o->train_size < 1)
    return bp_fail(BP_ERR_INVALID, "graph: global batch %lld and train size %lld must be >= 1",
                   (long long)o->global_batch, (long long)o->train_size);
  if (o->eval_ema && !bp_plan_get_options(plan)->ema)
    return bp_fail(BP_ERR_INVALID, "graph: evaluation on the EMA copies needs a plan with ema");
  const bp_loss_scale_attrs *ls = &o->loss_scale;
  if (bp_plan_get_options(plan)->amp &&
      (!(ls->growth_factor >= 1.0f && ls->growth_factor <= 65536.0f) ||
       !(ls->backoff_factor > 0.0f && ls->backoff_factor <= 1.0f) || ls->growth_interval < 0 ||
       ls->growth_interval > (1 << 24)))
    return bp_fail(BP_ERR_INVALID,
                   "graph: loss scale growth %g must be in [1, 65536], backoff %g in (0, 1] and "
                   "growth interval %d in [0, 2^24] (counts are FP32 in S)",
                   (double)ls->growth_factor, (double)ls->backoff_factor, (int)ls->growth_interval);
  for (int i = 0; i < m->layer_count; i++) {
    const bp_layer *l = &m->layers[i];
    if (l->type == BP_LAYER_ADD && l->inputs[0] == l->inputs[1])
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "graph: add layer '%s' adds '%s' to itself; its two gradients would be one "
                     "slot (scale that layer instead)",
                     l->name,
                     l->inputs[0] == BP_MODEL_INPUT ? "input" : m->layers[l->inputs[0]].name);
    /* a module's backward reads y: its own ".out" cannot be a gradient sink */
    if (l->type == BP_LAYER_MODULE && l->input_count == 2 && l->module &&
        l->module->layer.backward_op &&
        (l->inputs[0] == l->inputs[1] || l->inputs[0] == BP_MODEL_INPUT ||
         l->inputs[1] == BP_MODEL_INPUT))
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "graph: %s layer '%s' reads %s; a two-input layer from a module needs two "
                     "different layers as inputs (put a layer between)",
                     l->module->layer.type, l->name,
                     l->inputs[0] == l->inputs[1] ? "the same input twice" : "the model's input");
  }
  return BP_OK;
}

/* The samples over all ranks of one step of a variant (graph.h): B for the
 * full-batch variants whatever the rank's share, L = train_size % B for the
 * last batch's, else the variant's batch on every rank. */
static int64_t variant_global_batch(const bp_graph_options *o, const bp_variant_info *vi) {
  if (strcmp(vi->name, "train") == 0 || strcmp(vi->name, "train_small") == 0)
    return o->global_batch;
  if ((strcmp(vi->name, "train_last") == 0 || strcmp(vi->name, "train_last_small") == 0) &&
      o->train_size % o->global_batch != 0)
    return o->train_size % o->global_batch;
  return vi->batch * o->world;
}

static bp_status build_variant(build_ctx *x, int v) {
  const bp_variant_info *vi = bp_plan_variant(x->plan, v);
  variant_graph *vg = &x->g->variants[v];
  x->variant = v;
  x->vg = vg;
  vg->is_eval = strcmp(vi->name, "eval") == 0 || strcmp(vi->name, "eval_last") == 0;
  vg->global_batch = variant_global_batch(&x->g->options, vi);
  const int cap = 4 * x->m->layer_count + 16;
  for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
    vg->segs[s].nodes = calloc((size_t)cap, sizeof(bp_node));
    vg->segs[s].cap = cap;
    if (!vg->segs[s].nodes) return bp_fail(BP_ERR_NOMEM, "out of memory building a graph");
  }
  const span_ref none = {.id = -1, .slot = -1};
  range_node(x, BP_SEGMENT_RESET, "range.zero", "reset results", none, BP_DTYPE_FP32,
             resolve(x, BP_REGION_R, BP_REGION_R), BP_DTYPE_FP32, 0.0f, 0.0f);
  const int last = x->m->layer_count - 1;
  if (vg->is_eval) {
    if (x->amp) {
      const bp_param_kind a = BP_PARAM_BN_BIAS, b = BP_PARAM_CONV_DEEP;
      range_node(x, BP_SEGMENT_CAST, "range.cast",
                 x->g->options.eval_ema ? "cast E->A" : "cast W->A",
                 family_span(x, x->g->options.eval_ema ? BP_FAMILY_E : BP_FAMILY_W, a, b),
                 BP_DTYPE_FP32, family_span(x, BP_FAMILY_A, a, b), BP_DTYPE_FP16, 0.0f, 0.0f);
    }
    for (int i = 0; i <= last; i++)
      if (x->reaches[i]) forward_layer(x, BP_SEGMENT_EVAL, i, 1);
    return BP_OK;
  }
  for (int i = 0; i < last; i++)
    if (x->reaches[i]) forward_layer(x, BP_SEGMENT_FORWARD, i, 0);
  forward_layer(x, BP_SEGMENT_LOSS, last, 0);
  seg_list *loss = &x->vg->segs[BP_SEGMENT_LOSS];
  if (x->amp && loss->count == 1 && strcmp(loss->nodes[0].op, "softmax_ce.fwd_bwd") == 0 &&
      loss->nodes[0].attrs.softmax_ce.compute_grad) {
    /* dlogits = (softmax - target) * grad_scale * S: FP16 gradients keep
     * their small values (docs/amp.md) */
    bp_node *n = &loss->nodes[0];
    BP_ASSERT(n->num_inputs == 2);
    bp_node_in(n, x->loss_scale);
    n->attrs.softmax_ce.has_loss_scale = 1;
  }
  bp_status st = build_backward(x);
  if (st != BP_OK) return st;
  build_train_ranges(x);
  return BP_OK;
}

bp_status bp_graph_build(const bp_model *model, const bp_plan *plan,
                         const bp_graph_options *options, bp_graph **graph_out) {
  if (!model || !plan || !options || !graph_out)
    return bp_fail(BP_ERR_INVALID, "bp_graph_build: NULL argument");
  if (!bp_plan_is_finalized(plan))
    return bp_fail(BP_ERR_STATE, "graph of a plan that is not finalized");
  bp_status st = bp_model_check(model);
  if (st != BP_OK) return st;
  if ((st = check_options(model, plan, options)) != BP_OK) return st;

  build_ctx x;
  memset(&x, 0, sizeof x);
  x.m = model;
  x.plan = plan;
  x.amp = bp_plan_get_options(plan)->amp;
  x.ema = bp_plan_get_options(plan)->ema;
  const int32_t tensors = bp_plan_tensor_count(plan);
  x.g = calloc(1, sizeof *x.g);
  x.needs = calloc((size_t)model->layer_count, sizeof *x.needs);
  x.reaches = calloc((size_t)model->layer_count, sizeof *x.reaches);
  x.flows = calloc((size_t)model->layer_count, sizeof *x.flows);
  x.fuse = calloc((size_t)model->layer_count, sizeof *x.fuse);
  x.written = calloc((size_t)tensors + 1, sizeof *x.written);
  if (x.g) {
    x.g->variant_count = bp_plan_variant_count(plan);
    x.g->variants = calloc((size_t)x.g->variant_count, sizeof *x.g->variants);
  }
  if (!x.g || !x.g->variants || !x.needs || !x.reaches || !x.flows || !x.fuse ||
      !x.written) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory building a graph");
    goto done;
  }
  x.g->model = model;
  x.g->plan = plan;
  x.g->options = *options;

  if ((st = find_record(&x)) != BP_OK) goto done;
  const int lars = bp_plan_get_options(plan)->optimizer == BP_OPT_LARS;
  if (lars && family_span(&x, BP_FAMILY_W, BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_DEEP).span.bytes &&
      (x.lars_segments < 0 || x.lars_norms < 0)) {
    st = bp_fail(BP_ERR_STATE, "graph: a LARS plan without lars.segments / lars.norms");
    goto done;
  }
  analyze(&x);
  plan_fusion(&x);
  for (int v = 0; v < x.g->variant_count; v++)
    if ((st = build_variant(&x, v)) != BP_OK) goto done;
  if (lars && x.lars_segments >= 0 && (st = build_lars_table(&x)) != BP_OK) goto done;
  st = check_graph(&x);
  if (st == BP_OK) st = bp_liveness_check_graph(plan, x.g); /* a packed plan fits this graph */
done:
  free(x.needs);
  free(x.reaches);
  free(x.flows);
  free(x.fuse);
  free(x.written);
  if (st != BP_OK) {
    bp_graph_destroy(x.g);
    return st;
  }
  *graph_out = x.g;
  return BP_OK;
}
