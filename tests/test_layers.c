/* Layer types: the built-in table (core/src/layers.c and layer_*.c) and
 * the types op modules register (host->register_layer) through the
 * registry, the parser, the compiler and the graph build, with the purpose-
 * built modules of tests/modules/layers.c. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"
#include "layer-impl.h"
#include "run_util.h"

/* tests/modules/layers.c built as layers<case>.so */
static const char *module_path(int tm_case) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/layers/layers%d.so", BP_TEST_MODULES, tm_case);
  return path;
}

static bp_registry *registry_with(int tm_case) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_load(r, module_path(tm_case)) == BP_OK, "%s", bp_last_error());
  return r;
}

/* ---- the built-in table ------------------------------------------------------------ */

START_TEST(every_builtin_type_has_one_descriptor) {
  for (int t = 0; t < BP_LAYER_TYPE_COUNT; t++) {
    const bp_layer_desc *d = bp_layer_desc_of((bp_layer_type)t);
    ck_assert_msg(d && d->name && d->shape && d->forward, "type %d lacks a descriptor", t);
    ck_assert_str_eq(bp_layer_type_name((bp_layer_type)t), d->name);
    bp_layer_type back;
    if (t == BP_LAYER_MODULE) { /* never a file's type by itself */
      ck_assert_int_eq(bp_layer_type_from_name(d->name, &back), -1);
      continue;
    }
    ck_assert_int_eq(bp_layer_type_from_name(d->name, &back), 0);
    ck_assert_int_eq(back, t);
    ck_assert(d->inputs == 1 || d->inputs == 2);
    for (int i = 0; i < d->key_count; i++)
      for (int j = 0; j < i; j++) ck_assert_str_ne(d->keys[i]->key, d->keys[j]->key);
  }
  ck_assert_ptr_null(bp_layer_desc_of(BP_LAYER_TYPE_COUNT));
  ck_assert_ptr_null(bp_layer_desc_of((bp_layer_type)-1));
  ck_assert_int_eq(bp_layer_desc_of(BP_LAYER_ADD)->inputs, 2);
  ck_assert(bp_layer_desc_of(BP_LAYER_SOFTMAX_CE)->no_feature);
  ck_assert_int_eq(bp_layer_desc_of(BP_LAYER_CONV)->decayed_weights, 1);
  ck_assert_int_eq(bp_layer_desc_of(BP_LAYER_BATCHNORM)->decayed_weights, 0);
}
END_TEST

START_TEST(defaults_come_from_the_keys) {
  const bp_layer_key *keys[BP_LAYER_KEYS_MAX];
  const int n = bp_layer_all_keys(keys, BP_LAYER_KEYS_MAX);
  ck_assert_int_ge(n, 10); /* filters, units, kernel, stride, pad, dilation, groups, bias, ... */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++) ck_assert_ptr_ne(keys[i], keys[j]);
  bp_layer l;
  bp_layer_set_defaults(&l, BP_LAYER_CONV);
  ck_assert_int_eq(l.kernel_h, 1);
  ck_assert_int_eq(l.stride, 1);
  ck_assert_int_eq(l.pad, 0);
  ck_assert_int_eq(l.dilation, 1);
  ck_assert_int_eq(l.groups, 1);
  ck_assert_int_eq(l.bias, 1);
  ck_assert_float_eq(l.eps, 1e-5f);
  ck_assert_float_eq(l.momentum, 0.1f);
  ck_assert_int_eq(l.input_count, 1);
  bp_layer_set_defaults(&l, BP_LAYER_ADD);
  ck_assert_int_eq(l.input_count, 2);
}
END_TEST

/* ---- registration -------------------------------------------------------------------- */

START_TEST(a_module_registers_a_layer_type) {
  bp_registry *r = registry_with(0);
  ck_assert_int_eq(bp_registry_layer_count(r), 4); /* tl_act, tl_stop, tl_mrelu, tl_save */
  const bp_registered_layer *l = bp_registry_find_layer(r, "tl_act");
  ck_assert_ptr_nonnull(l);
  ck_assert_ptr_eq(l, bp_registry_layer(r, 0));
  ck_assert_ptr_null(bp_registry_find_layer(r, "relu")); /* built-ins are not the registry's */
  ck_assert_str_eq(l->forward->name, "tl.fwd");
  ck_assert_str_eq(l->backward->name, "tl.bwd");
  ck_assert_int_eq(l->layer.num_attrs, 3);
  ck_assert_str_eq(l->attrs[1].key, "gain");
  ck_assert_ptr_eq(l->layer.attrs, l->attrs);
  ck_assert_msg(strstr(l->path, "layers0.so") != NULL, "%s", l->path);
  ck_assert_int_eq(l->layer.num_saved, 0);
  ck_assert_ptr_null(l->saved);
  /* saved tensors are copied with the type (strided by their struct_size) */
  l = bp_registry_find_layer(r, "tl_save");
  ck_assert_ptr_nonnull(l);
  ck_assert_int_eq(l->layer.num_saved, 3);
  ck_assert_ptr_eq(l->layer.saved, l->saved);
  ck_assert_int_eq(l->saved[0].dtype, BP_ABI_DTYPE_FP32);
  ck_assert_int_eq(l->saved[0].per_channel, 1);
  ck_assert_int_eq(l->saved[1].dtype, BP_ABI_DTYPE_INT32);
  ck_assert_int_eq(l->saved[1].channels, 7);
  ck_assert_int_eq(l->saved[2].dtype, BP_ABI_DTYPE_FP16);
  ck_assert_int_eq(l->saved[2].channels, 0);
  bp_registry_destroy(r);
}
END_TEST

/* Loading case tm_case is refused at the register stage, with `needle` in
 * the reason, and leaves no layer type and no op behind. */
static void expect_refused(bp_registry *r, int tm_case, const char *needle) {
  const int layers = bp_registry_layer_count(r), ops = bp_registry_op_count(r);
  ck_assert_int_ne(bp_registry_load(r, module_path(tm_case)), BP_OK);
  const bp_load_record *rec = bp_registry_record(r, bp_registry_record_count(r) - 1);
  ck_assert_int_eq(rec->outcome, BP_LOAD_REFUSED);
  ck_assert_int_eq(rec->stage, BP_LOAD_STAGE_REGISTER);
  ck_assert_msg(strstr(rec->message, needle) != NULL, "case %d: \"%s\" lacks \"%s\"", tm_case,
                rec->message, needle);
  ck_assert_int_eq(bp_registry_layer_count(r), layers);
  ck_assert_int_eq(bp_registry_op_count(r), ops);
}

START_TEST(bad_layer_registrations_are_refused_whole) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  expect_refused(r, 1, "duplicate layer type 'relu': a built-in type");
  expect_refused(r, 2, "forward op 'tl.nothing' is not registered");
  expect_refused(r, 3, "key 'gain' at offset 64 does not fit");
  expect_refused(r, 4, "key 'gain' defaults to 7, outside its range");
  expect_refused(r, 5, "a backward op needs its int32 accumulate flag");
  expect_refused(r, 7,
                 "forward op 'tl.mrelu.fwd' has 1 inputs and 1 outputs; a layer of 1 input and 1 "
                 "saved tensor needs 1 and 2");
  expect_refused(r, 8, "saved tensor 0 has dtype 4 (FP32, FP16, INT8 or INT32)");
  expect_refused(r, 9, "saved tensor 0 is per channel ([1,1,1,C] of the output) but has 3");
  expect_refused(r, 10, "5 saved tensors (0..4, with their list)");
  bp_registry_destroy(r);
}
END_TEST

START_TEST(a_second_module_with_the_same_type_names_both_files) {
  bp_registry *r = registry_with(0);
  char first[4096];
  snprintf(first, sizeof first, "%s", bp_registry_find_layer(r, "tl_act")->path);
  expect_refused(r, 6, "duplicate layer type 'tl_act': already registered by ");
  const bp_load_record *rec = bp_registry_record(r, bp_registry_record_count(r) - 1);
  ck_assert_msg(strstr(rec->message, first) && strstr(rec->message, "layers6.so"), "%s",
                rec->message);
  bp_registry_destroy(r);
}
END_TEST

/* ---- models using a module's type ---------------------------------------------------- */

#define HEAD "input: {height: 4, width: 4, channels: 2, classes: 3}\nlayers:\n"
#define TAIL "  - {type: fc, name: logits, units: 3}\n  - {type: softmax_ce}\n"

/* Parsing `text` with registry r fails with status `want` and every needle. */
static void expect_parse_error(const bp_registry *r, const char *text, const char *n1,
                               const char *n2) {
  bp_model *m = NULL;
  ck_assert_int_eq(bp_model_parse_with_registry(text, strlen(text), "m.yaml", r, &m),
                   BP_ERR_INVALID);
  ck_assert_ptr_null(m);
  const char *e = bp_last_error();
  ck_assert_msg(strchr(e, '\n') == NULL, "not one line: %s", e);
  ck_assert_msg(strstr(e, n1) != NULL, "\"%s\" lacks \"%s\"", e, n1);
  if (n2) ck_assert_msg(strstr(e, n2) != NULL, "\"%s\" lacks \"%s\"", e, n2);
}

START_TEST(a_model_file_uses_a_module_type) {
  bp_registry *r = registry_with(0);
  const char *text = HEAD "  - {type: fc, name: f, units: 4}\n"
                          "  - {type: tl_act, name: act, width: 5, flip: true}\n" TAIL;
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse_with_registry(text, strlen(text), "m.yaml", r, &m) == BP_OK, "%s",
                bp_last_error());
  const bp_layer *l = &m->layers[1];
  ck_assert_int_eq(l->type, BP_LAYER_MODULE);
  ck_assert_ptr_eq(l->module, bp_registry_find_layer(r, "tl_act"));
  int32_t width, flip;
  float gain;
  memcpy(&width, l->attrs + 0, 4);
  memcpy(&gain, l->attrs + 4, 4);
  memcpy(&flip, l->attrs + 8, 4);
  ck_assert_int_eq(width, 5);
  ck_assert_float_eq(gain, 0.5f); /* the default */
  ck_assert_int_eq(flip, 1);
  bp_model_destroy(m);

  /* without the registry the type is unknown, and the message says why */
  expect_parse_error(NULL, text, "m.yaml:4:12: unknown layer type 'tl_act'",
                     "no op modules were loaded");
  bp_registry *bare = NULL;
  ck_assert_int_eq(bp_registry_create(&bare), BP_OK);
  expect_parse_error(bare, text, "unknown layer type 'tl_act'", "no op module is loaded");
  bp_registry_destroy(bare);
  /* keys: type, range, required, unknown; each at its own line:column */
  expect_parse_error(r, HEAD "  - {type: tl_act, width: 5, gain: 3}\n" TAIL,
                     "m.yaml:3:36: 'gain' of tl_act layer 'tl_act0' must be <= 2, got 3", NULL);
  expect_parse_error(r, HEAD "  - {type: tl_act, width: wide}\n" TAIL,
                     "m.yaml:3:27: 'width' of tl_act layer 'tl_act0' must be an integer", NULL);
  expect_parse_error(r, HEAD "  - {type: tl_act, width: 5, flip: 2}\n" TAIL,
                     "m.yaml:3:36:", "must be true or false");
  expect_parse_error(r, HEAD "  - {type: tl_act}\n" TAIL,
                     "m.yaml:3:5: tl_act layer 'tl_act0' is missing required field 'width'", NULL);
  expect_parse_error(r, HEAD "  - {type: tl_act, width: 5, gian: 1}\n" TAIL,
                     "m.yaml:3:30: unknown field 'gian' in tl_act layer 'tl_act0'",
                     "takes: type, name, input, width, gain, flip");
  expect_parse_error(r, HEAD "  - {type: tl_act, width: 5, units: 1}\n" TAIL,
                     "inapplicable field 'units'", NULL);
  bp_registry_destroy(r);
}
END_TEST

/* The node of `op` in segment s of variant 0, or NULL. */
static const bp_node *find_node(const bp_graph *g, bp_segment s, const char *op) {
  for (int k = 0; k < bp_graph_node_count(g, 0, s); k++)
    if (strcmp(bp_graph_node(g, 0, s, k)->op, op) == 0) return bp_graph_node(g, 0, s, k);
  return NULL;
}

static int32_t accumulate_of(const bp_node *n) {
  int32_t a;
  memcpy(&a, n->attrs.bytes + 12, sizeof a); /* tl_attrs.accumulate */
  return a;
}

/* Compiles and builds `text` (world 1); the caller destroys all four. */
static void build(const bp_registry *r, const char *text, bp_model **m, bp_plan **p,
                  bp_graph **g) {
  ck_assert_msg(bp_model_parse_with_registry(text, strlen(text), "m.yaml", r, m) == BP_OK, "%s",
                bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(*m);
  ck_assert_msg(bp_model_compile(*m, &co, p) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = co.batch;
  go.train_size = co.train_size;
  ck_assert_msg(bp_graph_build(*m, *p, &go, g) == BP_OK, "%s", bp_last_error());
}

START_TEST(a_module_layer_compiles_to_its_nodes) {
  bp_registry *r = registry_with(0);
  bp_model *m = NULL;
  bp_plan *p = NULL;
  bp_graph *g = NULL;
  build(r, HEAD "  - {type: fc, name: f, units: 4}\n  - {type: tl_act, name: act, width: 6}\n" TAIL,
        &m, &p, &g);
  /* the output shape is tl.fwd's infer_shape: [N,1,1,width] */
  const int32_t out = bp_plan_find_tensor(p, "act.out"), dout = bp_plan_find_tensor(p, "act.dout");
  ck_assert_int_ge(out, 0);
  ck_assert_int_ge(dout, 0);
  const bp_dtensor *t = bp_plan_tensor(p, 0, out);
  ck_assert_int_eq(t->shape.c, 6);
  ck_assert_int_eq(t->shape.h, 1);
  ck_assert_int_eq(bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "logits.w"))->shape.c, 6);
  /* the record the graph reads holds the same ids */
  const bp_model_tensors *rec = bp_model_tensors_of(p);
  ck_assert_ptr_nonnull(rec);
  ck_assert_int_eq(rec->layers[1].out, out);
  ck_assert_int_eq(rec->layers[1].dout, dout);
  ck_assert_int_eq(rec->layers[0].weight.w, bp_plan_find_tensor(p, "f.w"));
  ck_assert_int_eq(rec->globals.loss, bp_plan_find_tensor(p, "loss"));

  const bp_node *f = find_node(g, BP_SEGMENT_FORWARD, "tl.fwd");
  ck_assert_ptr_nonnull(f);
  ck_assert_str_eq(f->name, "act.fwd");
  ck_assert_int_eq(f->num_inputs, 1);
  ck_assert_int_eq(f->inputs[0].id, rec->layers[0].out);
  ck_assert_int_eq(f->outputs[0].id, out);
  ck_assert_uint_eq(f->attr_size, 16);
  ck_assert_int_eq(accumulate_of(f), 0);
  const bp_node *b = find_node(g, BP_SEGMENT_BACKWARD, "tl.bwd");
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(b->num_inputs, 3); /* x, y, dy */
  ck_assert_int_eq(b->inputs[0].id, rec->layers[0].out);
  ck_assert_int_eq(b->inputs[1].id, out);
  ck_assert_int_eq(b->inputs[2].id, dout);
  ck_assert_int_eq(b->outputs[0].id, rec->layers[0].dout);
  ck_assert_int_eq(accumulate_of(b), 0); /* one writer: overwritten */
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);

  /* two writers of f's gradient slot: the first (relu's, the later layer)
   * overwrites it, the module layer's adds to it, and nothing is zeroed */
  build(r, HEAD "  - {type: fc, name: f, units: 4}\n"
                "  - {type: tl_act, name: act, width: 4}\n"
                "  - {type: relu, name: r, input: f}\n"
                "  - {type: add, name: a, inputs: [act, r]}\n" TAIL,
        &m, &p, &g);
  b = find_node(g, BP_SEGMENT_BACKWARD, "tl.bwd");
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(accumulate_of(b), 1);
  ck_assert_int_eq(find_node(g, BP_SEGMENT_BACKWARD, "relu.bwd")->attrs.elementwise.accumulate, 0);
  ck_assert_ptr_null(find_node(g, BP_SEGMENT_BACKWARD, "range.zero"));
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);

  /* a type without a backward op stops the gradient: nothing upstream of it
   * gets a backward node, and nothing writes its own gradient slot */
  build(r, HEAD "  - {type: fc, name: f, units: 4}\n  - {type: tl_stop, name: s, width: 4}\n" TAIL,
        &m, &p, &g);
  ck_assert_ptr_nonnull(find_node(g, BP_SEGMENT_FORWARD, "tl.fwd"));
  ck_assert_ptr_null(find_node(g, BP_SEGMENT_BACKWARD, "tl.bwd"));
  ck_assert_ptr_null(find_node(g, BP_SEGMENT_BACKWARD, "fc.bwd_data"));
  ck_assert_int_eq(bp_graph_node_count(g, 0, BP_SEGMENT_BACKWARD), 1); /* logits.bwd_filter */
  ck_assert_str_eq(bp_graph_node(g, 0, BP_SEGMENT_BACKWARD, 0)->name, "logits.bwd_filter");
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);

  /* an output shape the op refuses: the compile error names the layer and the reason */
  const char *text = HEAD "  - {type: tl_act, name: act, width: 3}\n" TAIL;
  ck_assert_int_eq(bp_model_parse_with_registry(text, strlen(text), "m.yaml", r, &m), BP_OK);
  bp_compile_options co = bp_compile_options_from_model(m);
  ck_assert_int_eq(bp_model_compile(m, &co, &p), BP_ERR_SHAPE);
  ck_assert_msg(strstr(bp_last_error(), "m.yaml:3:5: layer 'act'") &&
                    strstr(bp_last_error(), "width 3 is not supported"),
                "%s", bp_last_error());
  bp_model_destroy(m);
  bp_registry_destroy(r);
}
END_TEST

/* Tensor `name` of plan p (variant 0) has this shape, dtype and region. */
static int32_t expect_tensor(const bp_plan *p, const char *name, bp_shape shape, bp_dtype dtype,
                             bp_region region) {
  const int32_t id = bp_plan_find_tensor(p, name);
  ck_assert_msg(id >= 0, "no tensor %s", name);
  const bp_dtensor *t = bp_plan_tensor(p, 0, id);
  ck_assert_msg(t->shape.n == shape.n && t->shape.h == shape.h && t->shape.w == shape.w &&
                    t->shape.c == shape.c,
                "%s: [%lld,%lld,%lld,%lld]", name, (long long)t->shape.n, (long long)t->shape.h,
                (long long)t->shape.w, (long long)t->shape.c);
  ck_assert_int_eq(t->dtype, dtype);
  ck_assert_int_eq(t->region, region);
  return id;
}

#define SAVED_MODEL                                                                          \
  "input: {height: 4, width: 4, channels: 2, classes: 3}\n"                                  \
  "layers:\n"                                                                                \
  "  - {type: conv, name: c, filters: 5, kernel: 3, pad: 1}\n"                              \
  "  - {type: tl_mrelu, name: act}\n"                                                       \
  "  - {type: tl_save, name: sv}\n" TAIL "train: {batch: 8}\n"

START_TEST(plugins_lists_saved_tensors) {
  run_result r = RUN("plugins", "--plugin", module_path(0));
  ck_assert_msg(r.status == 0 && strstr(r.out, "saved: int8[N,H,W,C]") &&
                    strstr(r.out, "saved: fp32[C] int32[N,H,W,7] fp16[N,H,W,C]"),
                "status %d: %s", r.status, r.out);
  run_free(&r);
  r = RUN("plugins", "--plugin", module_path(0), "--json");
  ck_assert_msg(r.status == 0 && strstr(r.out, "\"saved\": [{\"dtype\": \"int8\", "
                                               "\"per_channel\": false, \"channels\": 0}]") &&
                    strstr(r.out, "{\"dtype\": \"fp32\", \"per_channel\": true, \"channels\": 0}"),
                "status %d: %s", r.status, r.out);
  run_free(&r);
}
END_TEST

START_TEST(saved_tensors_are_planned_and_wired_into_both_nodes) {
  bp_registry *r = registry_with(0);
  bp_model *m = NULL;
  bp_plan *p = NULL;
  bp_graph *g = NULL;
  build(r, SAVED_MODEL, &m, &p, &g);
  /* the mask where maxpool keeps its argmax; the others by dtype */
  const bp_shape y = {8, 4, 4, 5};
  const int32_t mask = expect_tensor(p, "act.saved0", y, BP_DTYPE_INT8, BP_REGION_S_MASK);
  const int32_t s0 =
      expect_tensor(p, "sv.saved0", (bp_shape){1, 1, 1, 5}, BP_DTYPE_FP32, BP_REGION_F32);
  const int32_t s1 =
      expect_tensor(p, "sv.saved1", (bp_shape){8, 4, 4, 7}, BP_DTYPE_INT32, BP_REGION_T);
  const int32_t s2 = expect_tensor(p, "sv.saved2", y, BP_DTYPE_FP16, BP_REGION_T); /* no AMP */
  ck_assert_int_eq(bp_plan_find_tensor(p, "act.saved1"), -1);
  const bp_model_tensors *rec = bp_model_tensors_of(p);
  ck_assert_int_eq(rec->layers[1].saved_by_module[0], mask);
  ck_assert_int_eq(rec->layers[1].saved_by_module[1], -1);
  ck_assert_int_eq(rec->layers[2].saved_by_module[2], s2);
  /* the forward writes them after y, the backward reads them after dy */
  const bp_node *f = find_node(g, BP_SEGMENT_FORWARD, "tl.mrelu.fwd");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(f->num_outputs, 2);
  ck_assert_int_eq(f->outputs[0].id, rec->layers[1].out);
  ck_assert_int_eq(f->outputs[1].id, mask);
  const bp_node *b = find_node(g, BP_SEGMENT_BACKWARD, "tl.mrelu.bwd");
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(b->num_inputs, 4); /* x, y, dy, mask */
  ck_assert_int_eq(b->inputs[2].id, rec->layers[1].dout);
  ck_assert_int_eq(b->inputs[3].id, mask);
  ck_assert_int_eq(b->outputs[0].id, rec->layers[0].dout);
  f = find_node(g, BP_SEGMENT_FORWARD, "tl.save.fwd");
  b = find_node(g, BP_SEGMENT_BACKWARD, "tl.save.bwd");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(f->num_outputs, 4);
  ck_assert_int_eq(b->num_inputs, 6);
  const int32_t want[3] = {s0, s1, s2};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(f->outputs[1 + k].id, want[k]);
    ck_assert_int_eq(b->inputs[3 + k].id, want[k]);
  }
  bp_graph_destroy(g);
  bp_plan_destroy(p);

  /* under AMP an FP16 saved tensor sits with the FP16 features */
  bp_compile_options co = bp_compile_options_from_model(m);
  co.plan.amp = 1;
  ck_assert_msg(bp_model_compile(m, &co, &p) == BP_OK, "%s", bp_last_error());
  expect_tensor(p, "sv.saved2", y, BP_DTYPE_FP16, BP_REGION_F16);
  expect_tensor(p, "act.saved0", y, BP_DTYPE_INT8, BP_REGION_S_MASK);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  bp_registry_destroy(r);
}
END_TEST

/* Trains `layer` (a relu) in an MLP on toy data; the metrics file in dir. */
static char *train_with(const char *dir, const char *data, const char *layer, const char *tag) {
  char text[1024], name[64];
  snprintf(text, sizeof text,
           "name: mlp\n"
           "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
           "layers:\n"
           "  - {type: fc, name: fc1, units: 32}\n"
           "  - {type: %s, name: act}\n"
           "  - {type: fc, name: fc2, units: 10}\n"
           "  - {type: softmax_ce, name: loss}\n"
           "train: {batch: 32, eval_batch: 64, epochs: 1, optimizer: sgd, lr: 0.05, "
           "momentum: 0.9}\n",
           layer);
  snprintf(name, sizeof name, "%s.yaml", tag);
  char *model = path_in(dir, name);
  write_file(model, text, strlen(text));
  snprintf(name, sizeof name, "%s.jsonl", tag);
  char *metrics = path_in(dir, name);
  run_result rr = RUN("train", model, "--data", data, "--plugin", module_path(0), "--quiet",
                      "--train-limit", "320", "--test-limit", "128", "--metrics", metrics,
                      "--log-every", "1");
  ck_assert_msg(rr.status == 0, "%s: status %d: %s", layer, rr.status, rr.err);
  run_free(&rr);
  free(model);
  return metrics;
}

START_TEST(a_saved_mask_relu_trains_bit_for_bit_like_relu) {
  char *dir = tmp_dir_create(), *data = path_in(dir, "data");
  ck_assert_int_eq(sh("mkdir -p '%s'", data), 0);
  write_toy_mnist(data, 320, 128, 11);
  char *builtin = train_with(dir, data, "relu", "builtin");
  char *module = train_with(dir, data, "tl_mrelu", "module");
  int steps = 0, steps2 = 0;
  jsonl_number(builtin, "step", 0, "train_loss", &steps);
  jsonl_number(module, "step", 0, "train_loss", &steps2);
  ck_assert_int_eq(steps, 10);
  ck_assert_int_eq(steps2, steps);
  /* the losses print with 9 digits, enough to tell two floats apart: one
   * gradient bit off in one step shows in every step after it */
  for (int i = 0; i < steps; i++) {
    const double a = jsonl_number(builtin, "step", i, "train_loss", NULL);
    const double b = jsonl_number(module, "step", i, "train_loss", NULL);
    ck_assert_msg(a == b, "step %d: relu loss %.9g, tl_mrelu loss %.9g", i, a, b);
  }
  ck_assert(jsonl_number(builtin, "step", steps - 1, "train_loss", NULL) <
            jsonl_number(builtin, "step", 0, "train_loss", NULL));
  ck_assert(jsonl_number(builtin, "epoch", 0, "test_accuracy", NULL) ==
            jsonl_number(module, "epoch", 0, "test_accuracy", NULL));
  free(builtin);
  free(module);
  free(data);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(a_plan_of_another_model_is_refused) {
  bp_registry *r = registry_with(0);
  bp_model *m = NULL, *other = NULL;
  bp_plan *p = NULL;
  bp_graph *g = NULL;
  build(r, HEAD "  - {type: tl_act, name: act, width: 2}\n" TAIL, &m, &p, &g);
  bp_graph_destroy(g);
  const char *text = HEAD "  - {type: relu, name: act}\n" TAIL; /* same names, other type */
  ck_assert_int_eq(bp_model_parse(text, strlen(text), "o.yaml", &other), BP_OK);
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = 128;
  go.train_size = 60000;
  ck_assert_int_eq(bp_graph_build(other, p, &go, &g), BP_ERR_STATE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "was it compiled from this model"));
  bp_model_destroy(other);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  bp_registry_destroy(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("layers");
  tcase_add_test(tc, every_builtin_type_has_one_descriptor);
  tcase_add_test(tc, defaults_come_from_the_keys);
  tcase_add_test(tc, a_module_registers_a_layer_type);
  tcase_add_test(tc, bad_layer_registrations_are_refused_whole);
  tcase_add_test(tc, a_second_module_with_the_same_type_names_both_files);
  tcase_add_test(tc, a_module_layer_compiles_to_its_nodes);
  tcase_add_test(tc, a_model_file_uses_a_module_type);
  tcase_add_test(tc, a_plan_of_another_model_is_refused);
  tcase_add_test(tc, saved_tensors_are_planned_and_wired_into_both_nodes);
  tcase_add_test(tc, plugins_lists_saved_tensors);
  tcase_add_test(tc, a_saved_mask_relu_trains_bit_for_bit_like_relu);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
