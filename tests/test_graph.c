/* Graph building (core/src/graph_build.c): the segments of each variant,
 * one optimizer node per span, accumulation into gradient slots with
 * several writers (resnet8's residual branches), EMA, AMP, LARS and the
 * comm segment of more than one rank. Structure only; test_exec.c runs
 * graphs. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/model_yaml.h"

/* ---- helpers ---------------------------------------------------------- */

static bp_model *load_shipped(const char *file) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  char path[4096];
  snprintf(path, sizeof path, "%s/models/%s", src, file);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  return m;
}

typedef struct rig {
  bp_model *model;
  bp_plan *plan;
  bp_graph *graph;
} rig;

/* Compiles `file` with batch 128 over 1000 images (train_last 104) and
 * eval batch 200 over 500 (eval_last 100), then builds its graph. */
static int rig_replicate; /* bp_graph_options.replicate_update of the next open_rig */
static int rig_no_fuse;   /* 1: the next open_rig keeps batchnorm and relu apart */

static rig open_rig(const char *file, bp_optimizer opt, int amp, int ema, int world) {
  rig r;
  r.model = load_shipped(file);
  bp_compile_options co = bp_compile_options_from_model(r.model);
  co.plan.optimizer = opt;
  co.plan.amp = amp;
  co.plan.ema = ema;
  co.batch = 128;
  co.train_size = 1000;
  co.eval_batch = 200;
  co.eval_size = 500;
  if (rig_no_fuse) co.fuse_bn_relu = 0;
  ck_assert_msg(bp_model_compile(r.model, &co, &r.plan) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.world = world;
  go.global_batch = 128;
  go.train_size = 1000;
  go.eval_ema = ema;
  go.replicate_update = rig_replicate;
  ck_assert_msg(bp_graph_build(r.model, r.plan, &go, &r.graph) == BP_OK, "%s", bp_last_error());
  return r;
}

static void close_rig(rig *r) {
  bp_graph_destroy(r->graph);
  bp_plan_destroy(r->plan);
  bp_model_destroy(r->model);
}

static int variant(const rig *r, const char *name) {
  int v = bp_plan_find_variant(r->plan, name);
  ck_assert_msg(v >= 0, "no variant '%s'", name);
  return v;
}

static int32_t id_of(const rig *r, const char *name) {
  int32_t id = bp_plan_find_tensor(r->plan, name);
  ck_assert_msg(id >= 0, "no tensor '%s'", name);
  return id;
}

/* "op op op" of a segment. */
static void ops_of(const rig *r, int v, bp_segment s, char *buf, size_t size) {
  buf[0] = '\0';
  for (int k = 0; k < bp_graph_node_count(r->graph, v, s); k++) {
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s%s", k ? " " : "", bp_graph_node(r->graph, v, s, k)->op);
  }
}

static void expect_ops(const rig *r, int v, bp_segment s, const char *want) {
  char got[4096];
  ops_of(r, v, s, got, sizeof got);
  ck_assert_msg(strcmp(got, want) == 0, "segment %s: got \"%s\", want \"%s\"", bp_segment_name(s),
                got, want);
}

static bp_span region_span(const rig *r, bp_region a, bp_region b) {
  bp_span s;
  ck_assert_int_eq(bp_plan_resolve(r->plan, a, b, &s), BP_OK);
  return s;
}

static void expect_span(const bp_node_tensor *t, bp_span want, const char *what) {
  ck_assert_msg(t->id == -1 && t->span.offset == want.offset && t->span.bytes == want.bytes,
                "%s: span [%llu,+%llu), want [%llu,+%llu)", what,
                (unsigned long long)t->span.offset, (unsigned long long)t->span.bytes,
                (unsigned long long)want.offset, (unsigned long long)want.bytes);
}

static const bp_node *find_node(const rig *r, int v, bp_segment s, const char *name) {
  for (int k = 0; k < bp_graph_node_count(r->graph, v, s); k++) {
    const bp_node *n = bp_graph_node(r->graph, v, s, k);
    if (strcmp(n->name, name) == 0) return n;
  }
  ck_abort_msg("no node '%s' in segment %s", name, bp_segment_name(s));
  return NULL;
}

static int node_index(const rig *r, int v, bp_segment s, const char *name) {
  for (int k = 0; k < bp_graph_node_count(r->graph, v, s); k++)
    if (strcmp(bp_graph_node(r->graph, v, s, k)->name, name) == 0) return k;
  ck_abort_msg("no node '%s'", name);
  return -1;
}

static int accumulate_of(const bp_node *n) {
  if (!strncmp(n->op, "conv2d.", 7)) return n->attrs.conv2d.accumulate;
  if (!strncmp(n->op, "fc.", 3)) return n->attrs.fc.accumulate;
  if (!strncmp(n->op, "batchnorm", 9)) return n->attrs.batchnorm.accumulate; /* and _relu */
  if (!strncmp(n->op, "maxpool.", 8) || !strncmp(n->op, "avgpool.", 8))
    return n->attrs.pool.accumulate;
  return n->attrs.elementwise.accumulate;
}

/* The two updates: decayed weights and bias-like parameters, each one node
 * over its whole span, with its decay. */
static void expect_updates(const rig *r, int v, const char *op, float decay) {
  ck_assert_int_eq(bp_graph_node_count(r->graph, v, BP_SEGMENT_UPDATE), 2);
  const bp_node *d = find_node(r, v, BP_SEGMENT_UPDATE, "update.decay");
  const bp_node *b = find_node(r, v, BP_SEGMENT_UPDATE, "update.no_decay");
  ck_assert_str_eq(d->op, op);
  expect_span(&d->inputs[0], region_span(r, BP_REGION_G_FC_WEIGHT, BP_REGION_G_CONV_DEEP),
              "G decay");
  expect_span(&d->outputs[0], region_span(r, BP_REGION_W_FC_WEIGHT, BP_REGION_W_CONV_DEEP),
              "W decay");
  expect_span(&d->outputs[1], region_span(r, BP_REGION_M_FC_WEIGHT, BP_REGION_M_CONV_DEEP),
              "M decay");
  expect_span(&b->inputs[0], region_span(r, BP_REGION_G_BN_BIAS, BP_REGION_G_FC_BIAS),
              "G no decay");
  expect_span(&b->outputs[0], region_span(r, BP_REGION_W_BN_BIAS, BP_REGION_W_FC_BIAS),
              "W no decay");
  ck_assert_int_eq(d->inputs[1].id, id_of(r, "lr"));
  ck_assert_float_eq(d->attrs.optimizer.weight_decay, decay);
  ck_assert_float_eq(b->attrs.optimizer.weight_decay, 0.0f);
}

/* A gradient slot: an activation's (F32/F16) or a parameter's (G, G16). */
static int is_slot(const bp_dtensor *t) {
  return t && (t->region == BP_REGION_F32 || t->region == BP_REGION_F16 ||
               (t->region >= BP_REGION_G_BN_BIAS && t->region <= BP_REGION_G16_CONV_DEEP));
}

/* Every gradient slot of the backward segment, parameter gradients
 * included: the first writer of a slot overwrites it, unless the node must
 * accumulate into another of its slots, and then the slot was zeroed just
 * before; every later writer accumulates; nothing is zeroed for a node
 * that overwrites (so a step needs no ZERO_GRAD). Returns how many slots
 * had several writers. */
static int check_slot_writers(const rig *r, int v) {
  const int32_t n = bp_plan_tensor_count(r->plan);
  int *writers = calloc((size_t)n, sizeof *writers), *zeroed = calloc((size_t)n, sizeof *zeroed);
  int *seen = calloc((size_t)n, sizeof *seen);
  const int count = bp_graph_node_count(r->graph, v, BP_SEGMENT_BACKWARD);
  /* the loss node writes the logits' slot first */
  const bp_node *loss = bp_graph_node(r->graph, v, BP_SEGMENT_LOSS, 0);
  if (loss->num_outputs == 3) writers[loss->outputs[2].id]++, seen[loss->outputs[2].id] = 1;
  for (int k = 0; k < count; k++) {
    const bp_node *x = bp_graph_node(r->graph, v, BP_SEGMENT_BACKWARD, k);
    for (int o = 0; o < x->num_outputs; o++) {
      const bp_dtensor *t =
          x->outputs[o].id >= 0 ? bp_plan_tensor(r->plan, v, x->outputs[o].id) : NULL;
      if (is_slot(t)) writers[t->id]++;
    }
  }
  int multi = 0;
  for (int k = 0; k < count; k++) {
    const bp_node *x = bp_graph_node(r->graph, v, BP_SEGMENT_BACKWARD, k);
    if (!strcmp(x->op, "range.zero")) {
      /* find the tensor the span belongs to */
      for (int32_t id = 0; id < n; id++) {
        const bp_dtensor *t = bp_plan_tensor(r->plan, v, id);
        /* packed slots share offsets: the zero names its slot */
        if (t->offset == x->outputs[0].span.offset && is_slot(t) && !strcmp(x->name + 5, t->name)) {
          ck_assert_msg(!seen[id], "slot '%s' zeroed after a writer", t->name);
          zeroed[id] = 1;
        }
      }
      continue;
    }
    for (int o = 0; o < x->num_outputs; o++) {
      const int32_t id = x->outputs[o].id;
      const bp_dtensor *t = id >= 0 ? bp_plan_tensor(r->plan, v, id) : NULL;
      if (!is_slot(t)) continue;
      if (seen[id])
        ck_assert_msg(accumulate_of(x), "node '%s' overwrites slot '%s' written before it",
                      x->name, t->name);
      else if (accumulate_of(x))
        ck_assert_msg(zeroed[id], "slot '%s' accumulated by '%s' without a zero first", t->name,
                      x->name);
      else
        ck_assert_msg(!zeroed[id], "slot '%s' overwritten by '%s' zeroed for nothing", t->name,
                      x->name);
      seen[id] = 1;
    }
  }
  for (int32_t id = 0; id < n; id++) multi += writers[id] > 1;
  free(writers);
  free(zeroed);
  free(seen);
  return multi;
}

/* ---- tests ------------------------------------------------------------ */

START_TEST(mlp_segments) {
  rig r = open_rig("mlp.yaml", BP_OPT_SGD, 0, 0, 1);
  const int tr = variant(&r, "train"), last = variant(&r, "train_last"), ev = variant(&r, "eval"),
            evl = variant(&r, "eval_last");
  ck_assert_int_eq(bp_graph_variant_is_eval(r.graph, tr), 0);
  ck_assert_int_eq(bp_graph_variant_is_eval(r.graph, ev), 1);
  ck_assert_int_eq(bp_graph_variant_is_eval(r.graph, evl), 1);
  ck_assert_int_eq(bp_graph_variant_global_batch(r.graph, tr), 128);
  ck_assert_int_eq(bp_graph_variant_global_batch(r.graph, last), 1000 % 128);

  expect_ops(&r, tr, BP_SEGMENT_TRANSFER, "");
  expect_ops(&r, tr, BP_SEGMENT_ZERO_GRAD, "range.zero");
  expect_span(&bp_graph_node(r.graph, tr, BP_SEGMENT_ZERO_GRAD, 0)->outputs[0],
              region_span(&r, BP_REGION_G_BN_BIAS, BP_REGION_G_CONV_DEEP), "zero_grad");
  expect_ops(&r, tr, BP_SEGMENT_CAST, "");
  expect_ops(&r, tr, BP_SEGMENT_FORWARD, "fc.fwd relu.fwd fc.fwd relu.fwd fc.fwd");
  expect_ops(&r, tr, BP_SEGMENT_LOSS, "softmax_ce.fwd_bwd");
  expect_ops(&r, tr, BP_SEGMENT_BACKWARD,
             "fc.bwd_filter fc.bwd_data relu.bwd fc.bwd_filter fc.bwd_data relu.bwd "
             "fc.bwd_filter");
  expect_ops(&r, tr, BP_SEGMENT_COMM, "");
  expect_ops(&r, tr, BP_SEGMENT_EMA, "");
  expect_ops(&r, tr, BP_SEGMENT_EVAL, "");
  expect_ops(&r, tr, BP_SEGMENT_RESET, "range.zero");
  expect_span(&bp_graph_node(r.graph, tr, BP_SEGMENT_RESET, 0)->outputs[0],
              region_span(&r, BP_REGION_R, BP_REGION_R), "reset");
  expect_updates(&r, tr, "range.sgd", 5e-4f);

  /* the forward reads the input buffer A and each layer's parameters */
  const bp_node *fc1 = find_node(&r, tr, BP_SEGMENT_FORWARD, "fc1.fwd");
  ck_assert_int_eq(fc1->inputs[0].id, id_of(&r, "input.a"));
  ck_assert_int_eq(fc1->inputs[1].id, id_of(&r, "fc1.w"));
  ck_assert_int_eq(fc1->inputs[2].id, id_of(&r, "fc1.b"));
  ck_assert_int_eq(fc1->outputs[0].id, id_of(&r, "fc1.out"));
  /* the loss: label buffer A, R, the logits' slot; grad_scale 1/global batch */
  const bp_node *ce = bp_graph_node(r.graph, tr, BP_SEGMENT_LOSS, 0);
  ck_assert_int_eq(ce->inputs[1].id, id_of(&r, "label.a"));
  ck_assert_int_eq(ce->outputs[0].id, id_of(&r, "loss"));
  ck_assert_int_eq(ce->outputs[1].id, id_of(&r, "correct"));
  ck_assert_int_eq(ce->outputs[2].id, id_of(&r, "fc3.dout"));
  ck_assert_int_eq(ce->attrs.softmax_ce.compute_grad, 1);
  ck_assert_float_eq(ce->attrs.softmax_ce.grad_scale, 1.0f / 128.0f);
  ck_assert_float_eq(bp_graph_node(r.graph, last, BP_SEGMENT_LOSS, 0)->attrs.softmax_ce.grad_scale,
                     1.0f / 104.0f);
  /* gradients of one writer, parameters' and data's, are overwritten
   * (no ZERO_GRAD needed); the first layer has no bwd_data */
  const bp_node *f1 = find_node(&r, tr, BP_SEGMENT_BACKWARD, "fc1.bwd_filter");
  ck_assert_int_eq(f1->outputs[0].id, id_of(&r, "fc1.w.grad"));
  ck_assert_int_eq(f1->outputs[1].id, id_of(&r, "fc1.b.grad"));
  ck_assert_int_eq(f1->attrs.fc.accumulate, 0);
  ck_assert_int_eq(find_node(&r, tr, BP_SEGMENT_BACKWARD, "fc2.bwd_data")->attrs.fc.accumulate, 0);
  ck_assert_int_eq(check_slot_writers(&r, tr), 0);

  /* evaluation: forward and loss without a gradient; nothing else */
  expect_ops(&r, ev, BP_SEGMENT_EVAL, "fc.fwd relu.fwd fc.fwd relu.fwd fc.fwd softmax_ce.fwd_bwd");
  const bp_node *ece = find_node(&r, ev, BP_SEGMENT_EVAL, "loss.eval");
  ck_assert_int_eq(ece->num_outputs, 2);
  ck_assert_int_eq(ece->attrs.softmax_ce.compute_grad, 0);
  for (int s = 0; s < BP_SEGMENT_COUNT; s++)
    if (s != BP_SEGMENT_EVAL && s != BP_SEGMENT_RESET)
      ck_assert_msg(bp_graph_node_count(r.graph, ev, (bp_segment)s) == 0, "eval has %s nodes",
                    bp_segment_name((bp_segment)s));
  ck_assert_int_eq(bp_graph_constant_count(r.graph), 0);
  close_rig(&r);
}
END_TEST

START_TEST(cnn_segments) {
  rig_no_fuse = 1; /* the unfused graph; tests/test_fusion.c checks the fused one */
  rig r = open_rig("cnn.yaml", BP_OPT_SGD, 0, 0, 1);
  rig_no_fuse = 0;
  const int tr = variant(&r, "train"), ev = variant(&r, "eval");
  expect_ops(&r, tr, BP_SEGMENT_FORWARD,
             "conv2d.fwd batchnorm.fwd_train relu.fwd conv2d.fwd batchnorm.fwd_train relu.fwd "
             "maxpool.fwd conv2d.fwd batchnorm.fwd_train relu.fwd conv2d.fwd batchnorm.fwd_train "
             "relu.fwd maxpool.fwd fc.fwd");
  /* conv1 reads the model input: no data gradient for it */
  expect_ops(&r, tr, BP_SEGMENT_BACKWARD,
             "fc.bwd_filter fc.bwd_data maxpool.bwd relu.bwd batchnorm.bwd conv2d.bwd_filter "
             "conv2d.bwd_data relu.bwd batchnorm.bwd conv2d.bwd_filter conv2d.bwd_data "
             "maxpool.bwd relu.bwd batchnorm.bwd conv2d.bwd_filter conv2d.bwd_data relu.bwd "
             "batchnorm.bwd conv2d.bwd_filter");
  const bp_node *bn1 = find_node(&r, tr, BP_SEGMENT_FORWARD, "bn1.fwd");
  ck_assert_int_eq(bn1->num_outputs, 5);
  ck_assert_int_eq(bn1->outputs[3].id, id_of(&r, "bn1.running_mean"));
  ck_assert_int_eq(bn1->inputs[3].id, id_of(&r, "bn1.running_mean"));
  const bp_node *pool = find_node(&r, tr, BP_SEGMENT_FORWARD, "pool1.fwd");
  ck_assert_int_eq(pool->outputs[1].id, id_of(&r, "pool1.mask"));
  ck_assert_int_eq(pool->attrs.pool.kernel_h, 2);
  ck_assert_int_eq(pool->attrs.pool.stride_w, 2);
  const bp_node *c3 = find_node(&r, tr, BP_SEGMENT_FORWARD, "conv3.fwd");
  ck_assert_int_eq(c3->attrs.conv2d.pad_h, 1);
  ck_assert_int_eq(c3->attrs.conv2d.has_bias, 0);
  ck_assert_int_eq(c3->num_inputs, 2);
  expect_ops(&r, ev, BP_SEGMENT_EVAL,
             "conv2d.fwd batchnorm.fwd_eval relu.fwd conv2d.fwd batchnorm.fwd_eval relu.fwd "
             "maxpool.fwd conv2d.fwd batchnorm.fwd_eval relu.fwd conv2d.fwd batchnorm.fwd_eval "
             "relu.fwd maxpool.fwd fc.fwd softmax_ce.fwd_bwd");
  ck_assert_int_eq(find_node(&r, ev, BP_SEGMENT_EVAL, "bn2.fwd")->num_outputs, 1);
  expect_updates(&r, tr, "range.sgd", 5e-4f);
  ck_assert_int_eq(check_slot_writers(&r, tr), 0);
  close_rig(&r);
}
END_TEST

START_TEST(resnet8_accumulates) {
  rig r = open_rig("resnet8.yaml", BP_OPT_SGD, 0, 0, 1);
  const int tr = variant(&r, "train");
  /* stem_relu feeds b1_conv1 and b1_add; b1_out feeds b2_conv1 and
   * b2_proj; b2_out feeds b3_conv1 and b3_proj */
  ck_assert_int_eq(check_slot_writers(&r, tr), 3);
  const bp_segment B = BP_SEGMENT_BACKWARD;
  /* each fan-out's first writer overwrites, the second adds: no zeros */
  const int add1 = node_index(&r, tr, B, "b1_add.bwd");
  const int conv1 = node_index(&r, tr, B, "b1_conv1.bwd_data");
  ck_assert_int_lt(add1, conv1);
  ck_assert_int_eq(find_node(&r, tr, B, "b1_add.bwd")->attrs.elementwise.accumulate, 0);
  ck_assert_int_eq(find_node(&r, tr, B, "b1_conv1.bwd_data")->attrs.conv2d.accumulate, 1);
  ck_assert_int_lt(node_index(&r, tr, B, "b2_proj.bwd_data"),
                   node_index(&r, tr, B, "b2_conv1.bwd_data"));
  ck_assert_int_eq(find_node(&r, tr, B, "b2_proj.bwd_data")->attrs.conv2d.accumulate, 0);
  ck_assert_int_eq(find_node(&r, tr, B, "b2_conv1.bwd_data")->attrs.conv2d.accumulate, 1);
  for (int k = 0; k < bp_graph_node_count(r.graph, tr, B); k++)
    ck_assert_str_ne(bp_graph_node(r.graph, tr, B, k)->op, "range.zero");
  /* a slot of one writer is not zeroed: relu after the add */
  ck_assert_int_eq(find_node(&r, tr, B, "b2_out.bwd")->attrs.elementwise.accumulate, 0);
  /* the add's gradients go into both producers' slots */
  const bp_node *add = find_node(&r, tr, B, "b2_add.bwd");
  ck_assert_int_eq(add->outputs[0].id, id_of(&r, "b2_bn2.dout"));
  ck_assert_int_eq(add->outputs[1].id, id_of(&r, "b2_proj_bn.dout"));
  /* the stem conv reads the model input: its filter gradient comes last, no data gradient */
  const bp_node *lastn = bp_graph_node(r.graph, tr, B, bp_graph_node_count(r.graph, tr, B) - 1);
  ck_assert_str_eq(lastn->name, "stem.bwd_filter");
  expect_updates(&r, tr, "range.sgd", 5e-4f);
  close_rig(&r);
}
END_TEST

START_TEST(optimizers_one_node_per_span) {
  rig r = open_rig("resnet8.yaml", BP_OPT_ADAMW, 0, 0, 1);
  const int tr = variant(&r, "train");
  expect_updates(&r, tr, "range.adamw", 5e-4f);
  const bp_node *d = find_node(&r, tr, BP_SEGMENT_UPDATE, "update.decay");
  ck_assert_int_eq(d->num_inputs, 3);
  ck_assert_int_eq(d->inputs[2].id, id_of(&r, "step"));
  ck_assert_int_eq(d->num_outputs, 3);
  expect_span(&d->outputs[2], region_span(&r, BP_REGION_V_FC_WEIGHT, BP_REGION_V_CONV_DEEP), "V");
  ck_assert_float_eq(d->attrs.optimizer.beta2, 0.999f);
  close_rig(&r);

  r = open_rig("cnn.yaml", BP_OPT_LARS, 0, 0, 1);
  ck_assert_int_eq(bp_graph_node_count(r.graph, 0, BP_SEGMENT_UPDATE), 2);
  d = find_node(&r, 0, BP_SEGMENT_UPDATE, "update.decay");
  ck_assert_str_eq(d->op, "range.lars");
  ck_assert_int_eq(d->inputs[2].id, id_of(&r, "lars.segments"));
  ck_assert_int_eq(d->outputs[2].id, id_of(&r, "lars.norms"));
  ck_assert_str_eq(find_node(&r, 0, BP_SEGMENT_UPDATE, "update.no_decay")->op, "range.sgd");
  /* the segment table: one offset per weight (4 convs + fc), ascending, then the span's end */
  ck_assert_int_eq(bp_graph_constant_count(r.graph), 1);
  const bp_graph_constant *c = bp_graph_constant_get(r.graph, 0);
  ck_assert_int_eq(c->id, id_of(&r, "lars.segments"));
  ck_assert_uint_eq(c->bytes, 6 * sizeof(int32_t));
  const int32_t *seg = c->data;
  const bp_span w = region_span(&r, BP_REGION_W_FC_WEIGHT, BP_REGION_W_CONV_DEEP);
  ck_assert_int_eq(seg[0], 0);
  for (int s = 1; s < 6; s++) ck_assert_int_gt(seg[s], seg[s - 1]);
  ck_assert_int_eq(seg[5], (int32_t)(w.bytes / 4));
  const bp_dtensor *fcw = bp_plan_tensor(r.plan, 0, id_of(&r, "fc.w"));
  ck_assert_int_eq(seg[0], (int32_t)((fcw->offset - w.offset) / 4)); /* FC_WEIGHT comes first */
  close_rig(&r);
}
END_TEST

START_TEST(ema_amp_and_comm) {
  rig r = open_rig("cnn.yaml", BP_OPT_SGD, 0, 1, 1);
  const int tr = variant(&r, "train"), ev = variant(&r, "eval");
  expect_ops(&r, tr, BP_SEGMENT_EMA, "range.ema");
  expect_ops(&r, tr, BP_SEGMENT_INIT, "range.copy");
  const bp_node *e = bp_graph_node(r.graph, tr, BP_SEGMENT_EMA, 0);
  expect_span(&e->inputs[0], region_span(&r, BP_REGION_W_BN_BIAS, BP_REGION_W_CONV_DEEP), "ema W");
  expect_span(&e->outputs[0], region_span(&r, BP_REGION_E_BN_BIAS, BP_REGION_E_CONV_DEEP), "ema E");
  ck_assert_float_eq(e->attrs.range.decay, 0.999f);
  /* evaluation reads the EMA copies; training the master weights */
  ck_assert_int_eq(find_node(&r, ev, BP_SEGMENT_EVAL, "conv1.fwd")->inputs[1].id,
                   id_of(&r, "conv1.w.ema"));
  ck_assert_int_eq(find_node(&r, ev, BP_SEGMENT_EVAL, "bn1.fwd")->inputs[1].id,
                   id_of(&r, "bn1.weight.ema"));
  ck_assert_int_eq(find_node(&r, tr, BP_SEGMENT_FORWARD, "conv1.fwd")->inputs[1].id,
                   id_of(&r, "conv1.w"));
  close_rig(&r);

  r = open_rig("cnn.yaml", BP_OPT_SGD, 1, 0, 1);
  expect_ops(&r, 0, BP_SEGMENT_CAST, "range.cast");
  expect_ops(&r, 0, BP_SEGMENT_CAST_GRAD, "range.zero range.unscale"); /* docs/amp.md */
  expect_span(&bp_graph_node(r.graph, 0, BP_SEGMENT_ZERO_GRAD, 0)->outputs[0],
              region_span(&r, BP_REGION_G16_BN_BIAS, BP_REGION_G16_CONV_DEEP), "zero G16");
  const bp_node *cast = bp_graph_node(r.graph, 0, BP_SEGMENT_CAST, 0);
  ck_assert_int_eq(cast->inputs[0].dtype, BP_DTYPE_FP32);
  ck_assert_int_eq(cast->outputs[0].dtype, BP_DTYPE_FP16);
  ck_assert_uint_eq(cast->inputs[0].span.bytes, 2 * cast->outputs[0].span.bytes);
  ck_assert_int_eq(find_node(&r, 0, BP_SEGMENT_FORWARD, "conv2.fwd")->inputs[1].id,
                   id_of(&r, "conv2.w.fp16"));
  ck_assert_int_eq(find_node(&r, 0, BP_SEGMENT_BACKWARD, "conv2.bwd_filter")->outputs[0].id,
                   id_of(&r, "conv2.w.grad16"));
  expect_ops(&r, variant(&r, "eval"), BP_SEGMENT_CAST, "range.cast");
  close_rig(&r);

  rig_replicate = 1;
  r = open_rig("resnet8.yaml", BP_OPT_SGD, 0, 0, 2);
  rig_replicate = 0;
  expect_ops(&r, 0, BP_SEGMENT_COMM, "allreduce.sum allreduce.sum allreduce.sum");
  expect_ops(&r, 0, BP_SEGMENT_UPDATE, "range.sgd range.sgd");
  expect_ops(&r, 0, BP_SEGMENT_GATHER, "");
  expect_ops(&r, 0, BP_SEGMENT_STATE, "");
  const bp_node *deep = bp_graph_node(r.graph, 0, BP_SEGMENT_COMM, 0);
  expect_span(&deep->inputs[0], region_span(&r, BP_REGION_G_CONV_DEEP, BP_REGION_G_CONV_DEEP),
              "deep bucket");
  const bp_node *bn = bp_graph_node(r.graph, 0, BP_SEGMENT_COMM, 2);
  expect_span(&bn->inputs[0], region_span(&r, BP_REGION_B, BP_REGION_B), "BN bucket");
  ck_assert_float_eq(bn->attrs.allreduce.scale, 0.5f);
  close_rig(&r);
}
END_TEST

/* A node's place in its bucket: the bucket's W span and the node's. */
static void expect_shard(const rig *r, const bp_node *n, bp_param_kind b0, bp_param_kind b1,
                         bp_param_kind k0, bp_param_kind k1) {
  const bp_span bucket = region_span(r, bp_region_of_param(BP_FAMILY_W, b0),
                                     bp_region_of_param(BP_FAMILY_W, b1));
  const bp_span w = region_span(r, bp_region_of_param(BP_FAMILY_W, k0),
                                bp_region_of_param(BP_FAMILY_W, k1));
  expect_span(&n->outputs[0], w, n->name);
  expect_span(&n->inputs[0],
              region_span(r, bp_region_of_param(BP_FAMILY_G, k0), bp_region_of_param(BP_FAMILY_G, k1)),
              n->name);
  ck_assert_uint_eq(n->shard_domain, bucket.bytes / 4);
  ck_assert_uint_eq(n->shard_first, (w.offset - bucket.offset) / 4);
}

/* Several ranks update their own chunks by default (SGD, AdamW):
 * reduce_scatter per gradient bucket, update nodes that carry their place
 * in their bucket, all_gather of W per bucket, and of M and V for a
 * checkpoint. LARS and one rank stay replicated. */
START_TEST(sharded_update) {
  rig r = open_rig("resnet8.yaml", BP_OPT_ADAMW, 0, 0, 2);
  const int tr = variant(&r, "train");
  for (int v = 0; v < bp_plan_variant_count(r.plan); v++) {
    if (bp_graph_variant_is_eval(r.graph, v)) continue;
    expect_ops(&r, v, BP_SEGMENT_COMM,
               "allreduce.reduce_scatter allreduce.reduce_scatter allreduce.sum");
    expect_ops(&r, v, BP_SEGMENT_UPDATE, "range.adamw range.adamw range.adamw");
    expect_ops(&r, v, BP_SEGMENT_GATHER, "allreduce.all_gather allreduce.all_gather");
    expect_ops(&r, v, BP_SEGMENT_STATE, "allreduce.all_gather allreduce.all_gather "
                                        "allreduce.all_gather allreduce.all_gather");
  }
  const bp_param_kind deep = BP_PARAM_CONV_DEEP, bn = BP_PARAM_BN_BIAS;
  const bp_node *rs = bp_graph_node(r.graph, tr, BP_SEGMENT_COMM, 1);
  expect_span(&rs->inputs[0],
              region_span(&r, BP_REGION_G_BN_BIAS, BP_REGION_G_CONV_FIRST), "rest bucket");
  ck_assert_float_eq(rs->attrs.allreduce.scale, 1.0f);
  expect_shard(&r, find_node(&r, tr, BP_SEGMENT_UPDATE, "update.decay deep conv"), deep, deep,
               deep, deep);
  expect_shard(&r, find_node(&r, tr, BP_SEGMENT_UPDATE, "update.decay"), bn,
               BP_PARAM_CONV_FIRST, BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_FIRST);
  expect_shard(&r, find_node(&r, tr, BP_SEGMENT_UPDATE, "update.no_decay"), bn,
               BP_PARAM_CONV_FIRST, bn, BP_PARAM_FC_BIAS);
  ck_assert_float_eq(find_node(&r, tr, BP_SEGMENT_UPDATE, "update.no_decay")
                         ->attrs.optimizer.weight_decay, 0.0f);
  expect_span(&find_node(&r, tr, BP_SEGMENT_GATHER, "all_gather W deep conv")->inputs[0],
              region_span(&r, BP_REGION_W_CONV_DEEP, BP_REGION_W_CONV_DEEP), "gather W deep");
  expect_span(&find_node(&r, tr, BP_SEGMENT_GATHER, "all_gather W rest")->inputs[0],
              region_span(&r, BP_REGION_W_BN_BIAS, BP_REGION_W_CONV_FIRST), "gather W rest");
  expect_span(&find_node(&r, tr, BP_SEGMENT_STATE, "all_gather V rest")->inputs[0],
              region_span(&r, BP_REGION_V_BN_BIAS, BP_REGION_V_CONV_FIRST), "gather V rest");
  close_rig(&r);

  r = open_rig("resnet8.yaml", BP_OPT_LARS, 0, 0, 2); /* trust ratios need whole tensors */
  expect_ops(&r, 0, BP_SEGMENT_COMM, "allreduce.sum allreduce.sum allreduce.sum");
  expect_ops(&r, 0, BP_SEGMENT_GATHER, "");
  ck_assert_uint_eq(bp_graph_node(r.graph, 0, BP_SEGMENT_UPDATE, 0)->shard_domain, 0);
  close_rig(&r);

  r = open_rig("mlp.yaml", BP_OPT_SGD, 0, 0, 1); /* one rank: nothing to shard */
  expect_ops(&r, 0, BP_SEGMENT_COMM, "");
  expect_ops(&r, 0, BP_SEGMENT_UPDATE, "range.sgd range.sgd");
  expect_ops(&r, 0, BP_SEGMENT_STATE, "");
  close_rig(&r);
}
END_TEST

START_TEST(refuses_bad_input) {
  bp_model *m = load_shipped("mlp.yaml");
  bp_compile_options co = bp_compile_options_from_model(m);
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_model_compile(m, &co, &p), BP_OK);
  ck_assert_int_eq(bp_plan_find_variant(p, "eval_last"), -1); /* no eval size: no eval_last */
  bp_graph_options go;
  bp_graph_options_init(&go);
  bp_graph *g = (bp_graph *)(uintptr_t)1;
  ck_assert_int_eq(bp_graph_build(m, p, &go, &g), BP_ERR_INVALID); /* no batch */
  ck_assert_ptr_eq(g, (bp_graph *)(uintptr_t)1);
  go.global_batch = 128;
  go.train_size = 60000;
  go.eval_ema = 1;
  ck_assert_int_eq(bp_graph_build(m, p, &go, &g), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "ema"));
  go.eval_ema = 0;
  /* a plan of another model */
  bp_model *other = load_shipped("cnn.yaml");
  ck_assert_int_eq(bp_graph_build(other, p, &go, &g), BP_ERR_STATE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "was it compiled from this model"));
  /* add of a layer to itself */
  const char *text =
      "input: {height: 2, width: 2, channels: 1, classes: 2}\n"
      "layers:\n"
      "  - {type: fc, name: f, units: 2}\n"
      "  - {type: add, name: a, inputs: [f, f]}\n"
      "  - {type: softmax_ce}\n";
  bp_model *twice = NULL;
  ck_assert_int_eq(bp_model_parse(text, strlen(text), "twice.yaml", &twice), BP_OK);
  bp_compile_options tco = bp_compile_options_from_model(twice);
  bp_plan *tp = NULL;
  ck_assert_int_eq(bp_model_compile(twice, &tco, &tp), BP_OK);
  ck_assert_int_eq(bp_graph_build(twice, tp, &go, &g), BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "adds 'f' to itself"));
  bp_plan_destroy(tp);
  bp_model_destroy(twice);
  bp_model_destroy(other);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  bp_graph_destroy(NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("graph");
  TCase *tc = tcase_create("graph");
  tcase_add_test(tc, mlp_segments);
  tcase_add_test(tc, cnn_segments);
  tcase_add_test(tc, resnet8_accumulates);
  tcase_add_test(tc, optimizers_one_node_per_span);
  tcase_add_test(tc, ema_amp_and_comm);
  tcase_add_test(tc, sharded_update);
  tcase_add_test(tc, refuses_bad_input);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
