/* Sessions (core/include/blueprint/session.h): the one pipeline from a
 * model to bound kernels. Its plan and graph, built once and moved with the
 * packed plan, are exactly what compiling and building the graph again on
 * the packed plan give, for every shipped model under every option that
 * changes the layout or the step; fusion follows the session's registry
 * and pins; bad arguments are refused with a message. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "blueprint/session.h"
#include "run_util.h"

static bp_model *load(const char *path) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  return m;
}

static void same_tensor(const bp_node_tensor *a, const bp_node_tensor *b, const char *node,
                        const char *what) {
  ck_assert_msg(a->id == b->id && a->dtype == b->dtype && a->span.offset == b->span.offset &&
                    a->span.bytes == b->span.bytes,
                "node '%s', %s: id %d span [%llu, +%llu) against id %d span [%llu, +%llu)", node,
                what, (int)a->id, (unsigned long long)a->span.offset,
                (unsigned long long)a->span.bytes, (int)b->id, (unsigned long long)b->span.offset,
                (unsigned long long)b->span.bytes);
}

/* Every node of every segment of every variant: the same op, name, tensors
 * (ids and spans, byte for byte), attributes and shard. */
static int same_graph(const bp_graph *a, const bp_graph *b, int variants) {
  int nodes = 0;
  for (int v = 0; v < variants; v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
      const int count = bp_graph_node_count(a, v, (bp_segment)s);
      ck_assert_int_eq(count, bp_graph_node_count(b, v, (bp_segment)s));
      for (int k = 0; k < count; k++, nodes++) {
        const bp_node *x = bp_graph_node(a, v, (bp_segment)s, k);
        const bp_node *y = bp_graph_node(b, v, (bp_segment)s, k);
        ck_assert_str_eq(x->op, y->op);
        ck_assert_str_eq(x->name, y->name);
        ck_assert_int_eq(x->num_inputs, y->num_inputs);
        ck_assert_int_eq(x->num_outputs, y->num_outputs);
        for (int i = 0; i < x->num_inputs; i++)
          same_tensor(&x->inputs[i], &y->inputs[i], x->name, "input");
        for (int i = 0; i < x->num_outputs; i++)
          same_tensor(&x->outputs[i], &y->outputs[i], x->name, "output");
        ck_assert_uint_eq(x->attr_size, y->attr_size);
        ck_assert_msg(memcmp(&x->attrs, &y->attrs, x->attr_size) == 0, "node '%s': attributes",
                      x->name);
        ck_assert_uint_eq(x->shard_domain, y->shard_domain);
        ck_assert_uint_eq(x->shard_first, y->shard_first);
      }
    }
  return nodes;
}

/* The session against bp_model_compile + bp_graph_build on its plan. */
static void check_against_rebuild(const char *path, const bp_model *m, const bp_session_options *o,
                                  const char *what) {
  bp_session *s = NULL;
  ck_assert_msg(bp_session_create(m, o, &s) == BP_OK, "%s %s: %s", path, what, bp_last_error());
  bp_plan *plan = NULL;
  ck_assert_msg(bp_model_compile(m, &o->compile, &plan) == BP_OK, "%s", bp_last_error());
  const bp_plan *sp = bp_session_plan(s);
  ck_assert_int_eq(bp_plan_is_packed(sp), !o->compile.no_reuse);
  ck_assert_uint_eq(bp_plan_total_bytes(sp), bp_plan_total_bytes(plan));
  ck_assert_int_eq(bp_plan_variant_count(sp), bp_plan_variant_count(plan));
  for (int v = 0; v < bp_plan_variant_count(plan); v++)
    for (int32_t id = 0; id < bp_plan_tensor_count(plan); id++)
      ck_assert_msg(
          bp_plan_tensor(sp, v, id)->offset == bp_plan_tensor(plan, v, id)->offset,
          "%s %s: tensor '%s' at %llu in the session's plan, %llu compiled", path, what,
          bp_plan_tensor(plan, v, id)->name, (unsigned long long)bp_plan_tensor(sp, v, id)->offset,
          (unsigned long long)bp_plan_tensor(plan, v, id)->offset);
  bp_graph_options go = o->graph;
  go.world = o->compile.world > 1 ? o->compile.world : 1;
  go.global_batch = o->compile.batch;
  go.train_size = o->compile.train_size;
  bp_graph *g = NULL;
  ck_assert_msg(bp_graph_build(m, plan, &go, &g) == BP_OK, "%s", bp_last_error());
  ck_assert_int_gt(same_graph(bp_session_graph(s), g, bp_plan_variant_count(plan)), 0);
  bp_graph_destroy(g);
  bp_plan_destroy(plan);
  bp_session_destroy(s);
}

START_TEST(the_graph_built_once_is_the_graph_built_on_the_packed_plan) {
  char **paths = shipped_models();
  for (int i = 0; paths[i]; i++) {
    bp_model *m = load(paths[i]);
    bp_session_options o;
    bp_session_options_init(&o, m);
    o.compile.train_size = 3 * o.compile.batch + 5; /* a last partial batch */
    o.compile.eval_size = o.compile.eval_batch + 3;  /* and an eval_last */
    check_against_rebuild(paths[i], m, &o, "default");
    bp_session_options amp = o;
    amp.compile.plan.amp = 1;
    check_against_rebuild(paths[i], m, &amp, "amp");
    bp_session_options ranks = o;
    ranks.compile.world = 3; /* uneven shares: train_small, sharded buckets */
    check_against_rebuild(paths[i], m, &ranks, "world 3");
    bp_session_options adamw = o;
    adamw.compile.plan.optimizer = BP_OPT_ADAMW;
    adamw.compile.plan.ema = 1;
    adamw.graph.eval_ema = 1;
    adamw.compile.world = 2;
    adamw.graph.replicate_update = 1;
    check_against_rebuild(paths[i], m, &adamw, "adamw ema world 2 replicated");
    bp_session_options lars = o;
    lars.compile.plan.optimizer = BP_OPT_LARS;
    check_against_rebuild(paths[i], m, &lars, "lars");
    bp_session_options unfused = o;
    unfused.compile.fuse_bn_relu = 0;
    check_against_rebuild(paths[i], m, &unfused, "unfused");
    bp_session_options none = o;
    none.compile.no_reuse = 1;
    check_against_rebuild(paths[i], m, &none, "no reuse");
    bp_model_destroy(m);
  }
  shipped_models_free(paths);
}
END_TEST

/* A model whose add accumulates into its second input's gradient (f1's,
 * which f3's backward wrote first) while its first (f2's) is fresh: f2's
 * slot is zeroed before the add's backward. */
static const char zeroing_model[] =
    "name: zeroing\n"
    "input: {height: 4, width: 4, channels: 2, classes: 3}\n"
    "layers:\n"
    "  - {type: fc, name: f1, units: 8}\n"
    "  - {type: fc, name: f2, units: 8}\n"
    "  - {type: add, name: a, inputs: [f2, f1]}\n"
    "  - {type: fc, name: f3, units: 8, input: f1}\n"
    "  - {type: add, name: a2, inputs: [a, f3]}\n"
    "  - {type: relu, name: r}\n"
    "  - {type: fc, name: head, units: 3}\n"
    "  - {type: softmax_ce, name: loss}\n"
    "train: {batch: 16, train_size: 64}\n";

/* A zeroed gradient slot in a packed plan: the session's range.zero covers
 * the slot where packing put it, not where the unpacked plan had it. */
START_TEST(spans_move_with_the_packed_plan) {
  char **paths = shipped_models();
  int moved = 0, zeros = 0;
  for (int i = 0;; i++) {
    bp_model *m = NULL;
    if (paths[i]) m = load(paths[i]);
    else ck_assert_msg(bp_model_parse(zeroing_model, strlen(zeroing_model), "zeroing.yaml", &m) ==
                           BP_OK,
                       "%s", bp_last_error());
    bp_session_options o;
    bp_session_options_init(&o, m);
    bp_session *s = NULL;
    ck_assert_msg(bp_session_create(m, &o, &s) == BP_OK, "%s", bp_last_error());
    bp_session_options u = o;
    u.compile.no_reuse = 1;
    bp_session *unpacked = NULL;
    ck_assert_msg(bp_session_create(m, &u, &unpacked) == BP_OK, "%s", bp_last_error());
    const bp_plan *p = bp_session_plan(s);
    const bp_graph *g = bp_session_graph(s);
    for (int k = 0; k < bp_graph_node_count(g, 0, BP_SEGMENT_BACKWARD); k++) {
      const bp_node *n = bp_graph_node(g, 0, BP_SEGMENT_BACKWARD, k);
      if (strcmp(n->op, "range.zero") != 0) continue;
      const bp_node_tensor *t = &n->outputs[0];
      ck_assert_int_ge(t->slot, 0);
      const bp_dtensor *d = bp_plan_tensor(p, 0, t->slot);
      ck_assert_uint_eq(t->span.offset, d->offset);
      zeros += !paths[i];
      moved += d->offset != bp_plan_tensor(bp_session_plan(unpacked), 0, t->slot)->offset;
    }
    bp_session_destroy(unpacked);
    bp_session_destroy(s);
    bp_model_destroy(m);
    if (!paths[i]) break;
  }
  ck_assert_int_eq(zeros, 1); /* f2's slot */
  ck_assert_int_gt(moved, 0);
  shipped_models_free(paths);
}
END_TEST

static int has_op(const bp_graph *g, const char *op) {
  for (int s = 0; s < BP_SEGMENT_COUNT; s++)
    for (int k = 0; k < bp_graph_node_count(g, 0, (bp_segment)s); k++)
      if (strcmp(bp_graph_node(g, 0, (bp_segment)s, k)->op, op) == 0) return 1;
  return 0;
}

START_TEST(fusion_is_an_option_of_the_session) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  char *path = path_in(src, "models/cnn.yaml");
  bp_model *m = load(path);
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_discover(r, NULL, 0) == BP_OK, "%s", bp_last_error());
  struct {
    int fuse;
    const bp_registry *registry;
    const char *device, *pins;
    int fused;
  } runs[] = {
      {1, NULL, NULL, NULL, 1},             /* no registry: as asked */
      {0, NULL, NULL, NULL, 0},             /* asked not to */
      {1, r, NULL, NULL, 1},                /* the cpu kernels are there */
      {1, r, "nodevice", NULL, 0},          /* none on that device */
      {1, r, "cpu", "relu.*=reference", 0}, /* a pin would be lost */
      {0, r, "cpu", NULL, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    bp_session_options o;
    bp_session_options_init(&o, m);
    o.compile.fuse_bn_relu = runs[k].fuse;
    o.registry = runs[k].registry;
    o.device = runs[k].device;
    o.pins = runs[k].pins;
    bp_session *s = NULL;
    ck_assert_msg(bp_session_create(m, &o, &s) == BP_OK, "%s", bp_last_error());
    ck_assert_msg(bp_session_fused(s) == runs[k].fused, "run %zu", k);
    ck_assert_int_eq(has_op(bp_session_graph(s), "batchnorm_relu.fwd_train"), runs[k].fused);
    ck_assert_int_eq(has_op(bp_session_graph(s), "relu.fwd"), !runs[k].fused);
    bp_session_destroy(s);
  }
  bp_registry_destroy(r);
  bp_model_destroy(m);
  free(path);
}
END_TEST

START_TEST(bad_arguments_are_refused_with_a_message) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  char *path = path_in(src, "models/mlp.yaml");
  bp_model *m = load(path);
  bp_session_options o;
  bp_session_options_init(&o, m);
  bp_session *s = (bp_session *)&o; /* must stay as it is on failure */
  ck_assert_int_eq(bp_session_create(NULL, &o, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_session_create(m, NULL, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_session_create(m, &o, NULL), BP_ERR_INVALID);
  o.compile.batch = 0;
  ck_assert_int_eq(bp_session_create(m, &o, &s), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "batch 0"), "%s", bp_last_error());
  ck_assert_ptr_eq(s, (bp_session *)&o);
  bp_session_options_init(&o, m);
  o.graph.eval_ema = 1; /* evaluation on EMA copies of a plan without them */
  ck_assert_int_eq(bp_session_create(m, &o, &s), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "EMA"), "%s", bp_last_error());
  ck_assert_ptr_eq(bp_session_plan(NULL), NULL);
  ck_assert_ptr_eq(bp_session_graph(NULL), NULL);
  ck_assert_int_eq(bp_session_fused(NULL), 0);
  ck_assert_int_eq(bp_session_bind(NULL, NULL, NULL, NULL, NULL), BP_ERR_INVALID);
  bp_session_destroy(NULL);
  bp_model_destroy(m);
  free(path);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("session");
  TCase *tc = tcase_create("session");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, the_graph_built_once_is_the_graph_built_on_the_packed_plan);
  tcase_add_test(tc, spans_move_with_the_packed_plan);
  tcase_add_test(tc, fusion_is_an_option_of_the_session);
  tcase_add_test(tc, bad_arguments_are_refused_with_a_message);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
