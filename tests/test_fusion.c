/* Batchnorm + relu fusion (bp_compile_options.fuse_bn_relu, graph_build.c,
 * layer_norm_act.c; the batchnorm_relu ops of bp_abi_ops.h): which pairs
 * the graph fuses, when a run may fuse (fuse.c), the arena it saves, and
 * that training fused ends with the very bits of training unfused. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "fuse-impl.h"
#include "run_util.h"

/* bn1 has two readers (r1 and the add): not fused; bn2 only r2: fused. */
static const char resid_model[] =
    "name: resid\n"
    "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
    "layers:\n"
    "  - {type: conv, name: c1, filters: 4, kernel: 3, pad: 1, bias: false}\n"
    "  - {type: batchnorm, name: bn1}\n"
    "  - {type: relu, name: r1}\n"
    "  - {type: add, name: sum, inputs: [bn1, r1]}\n"
    "  - {type: batchnorm, name: bn2}\n"
    "  - {type: relu, name: r2}\n"
    "  - {type: fc, name: fc, units: 10}\n"
    "  - {type: softmax_ce, name: loss}\n";

static char *source_path(const char *rel) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  return path_in(src, rel);
}

static bp_model *parse(const char *text) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse(text, strlen(text), "fusion.yaml", &m) == BP_OK, "%s",
                bp_last_error());
  return m;
}

static bp_model *load(const char *rel) {
  char *path = source_path(rel);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  free(path);
  return m;
}

static bp_plan *compile(const bp_model *m, int fuse, int amp) {
  bp_compile_options o = bp_compile_options_from_model(m);
  o.fuse_bn_relu = fuse;
  o.plan.amp = amp;
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &o, &p) == BP_OK, "%s", bp_last_error());
  return p;
}

static bp_graph *graph_of(const bp_model *m, const bp_plan *p) {
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = m->train.batch;
  go.train_size = m->train.train_size;
  bp_graph *g = NULL;
  ck_assert_msg(bp_graph_build(m, p, &go, &g) == BP_OK, "%s", bp_last_error());
  return g;
}

/* Nodes running `op` in segment s of variant v; with name, only the one of
 * that name. */
static int count(const bp_graph *g, int v, bp_segment s, const char *op, const char *name) {
  int n = 0;
  for (int i = 0; i < bp_graph_node_count(g, v, s); i++) {
    const bp_node *node = bp_graph_node(g, v, s, i);
    if (strcmp(node->op, op) == 0 && (!name || strcmp(node->name, name) == 0)) n++;
  }
  return n;
}

static int eval_variant(const bp_plan *p) { return bp_plan_find_variant(p, "eval"); }

START_TEST(the_cnn_runs_every_batchnorm_fused_with_its_relu) {
  bp_model *m = load("models/cnn.yaml");
  bp_plan *fused = compile(m, 1, 0), *plain = compile(m, 0, 0);
  bp_graph *g = graph_of(m, fused), *u = graph_of(m, plain);
  const int ev = eval_variant(fused);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm_relu.fwd_train", NULL), 4);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm.fwd_train", NULL), 0);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "relu.fwd", NULL), 0);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "batchnorm_relu.bwd", NULL), 4);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "batchnorm.bwd", NULL), 0);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "relu.bwd", NULL), 0);
  ck_assert_int_eq(count(g, ev, BP_SEGMENT_EVAL, "batchnorm_relu.fwd_eval", NULL), 4);
  ck_assert_int_eq(count(g, ev, BP_SEGMENT_EVAL, "relu.fwd", NULL), 0);
  /* two nodes fewer per pair and pass, nothing else changes */
  ck_assert_int_eq(bp_graph_node_count(g, 0, BP_SEGMENT_FORWARD) + 4,
                   bp_graph_node_count(u, 0, BP_SEGMENT_FORWARD));
  ck_assert_int_eq(bp_graph_node_count(g, 0, BP_SEGMENT_BACKWARD) + 4,
                   bp_graph_node_count(u, 0, BP_SEGMENT_BACKWARD));
  ck_assert_int_eq(count(u, 0, BP_SEGMENT_FORWARD, "relu.fwd", NULL), 4);
  ck_assert_int_eq(count(u, 0, BP_SEGMENT_FORWARD, "batchnorm_relu.fwd_train", NULL), 0);
  /* the fused forward writes the relu's output; the backward reads the
   * relu's output and gradient, and writes the conv's gradient */
  const bp_node *f = NULL, *b = NULL;
  for (int i = 0; i < bp_graph_node_count(g, 0, BP_SEGMENT_FORWARD); i++)
    if (strcmp(bp_graph_node(g, 0, BP_SEGMENT_FORWARD, i)->name, "bn1.fwd") == 0)
      f = bp_graph_node(g, 0, BP_SEGMENT_FORWARD, i);
  for (int i = 0; i < bp_graph_node_count(g, 0, BP_SEGMENT_BACKWARD); i++)
    if (strcmp(bp_graph_node(g, 0, BP_SEGMENT_BACKWARD, i)->name, "bn1.bwd") == 0)
      b = bp_graph_node(g, 0, BP_SEGMENT_BACKWARD, i);
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(b);
  ck_assert_str_eq(bp_plan_tensor(fused, 0, f->outputs[0].id)->name, "relu1.out");
  ck_assert_int_eq(b->num_inputs, 6);
  ck_assert_str_eq(bp_plan_tensor(fused, 0, b->inputs[1].id)->name, "relu1.dout");
  ck_assert_str_eq(bp_plan_tensor(fused, 0, b->inputs[5].id)->name, "relu1.out");
  ck_assert_str_eq(bp_plan_tensor(fused, 0, b->outputs[0].id)->name, "conv1.dout");
  /* the batchnorm's own output and gradient are never touched: no live
   * range in any variant, so packing gives them no bytes of their own (the
   * unfused plan already shares theirs: they live for one node each) */
  const char *const untouched[] = {"bn1.out", "bn1.dout", "bn4.out", "bn4.dout"};
  for (int v = 0; v < bp_plan_variant_count(fused); v++)
    for (int k = 0; k < 4; k++) {
      const int32_t id = bp_plan_find_tensor(fused, untouched[k]);
      ck_assert_int_ge(id, 0);
      ck_assert_msg(bp_plan_live_range(fused, v, id).first == -1, "%s is live in '%s'",
                    untouched[k], bp_plan_variant(fused, v)->name);
      if (v == 0) ck_assert_int_ge(bp_plan_live_range(plain, v, id).first, 0); /* "train" */
    }
  printf("cnn arena: %" PRIu64 " bytes fused, %" PRIu64 " unfused (%" PRIu64 " without reuse)\n",
         bp_plan_total_bytes(fused), bp_plan_total_bytes(plain), bp_plan_unpacked_bytes(plain));
  ck_assert_uint_le(bp_plan_total_bytes(fused), bp_plan_total_bytes(plain));
  bp_graph_destroy(g);
  bp_graph_destroy(u);
  bp_plan_destroy(fused);
  bp_plan_destroy(plain);
  bp_model_destroy(m);
}
END_TEST

START_TEST(a_batchnorm_with_another_reader_stays_unfused) {
  bp_model *m = parse(resid_model);
  bp_plan *p = compile(m, 1, 0);
  bp_graph *g = graph_of(m, p);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm.fwd_train", "bn1.fwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "relu.fwd", "r1.fwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "batchnorm.bwd", "bn1.bwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "relu.bwd", "r1.bwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm_relu.fwd_train", "bn2.fwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "relu.fwd", "r2.fwd"), 0);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_BACKWARD, "batchnorm_relu.bwd", "bn2.bwd"), 1);
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  /* resnet8: a batchnorm read by an add (the residual) keeps its own node */
  m = load("models/resnet8.yaml");
  p = compile(m, 1, 0);
  g = graph_of(m, p);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm_relu.fwd_train", "stem_bn.fwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm.fwd_train", "b1_bn2.fwd"), 1);
  ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "relu.fwd", "b1_out.fwd"), 1);
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

START_TEST(amp_and_the_default_keep_batchnorm_and_relu_apart) {
  bp_model *m = load("models/cnn.yaml");
  for (int amp = 0; amp < 2; amp++) {
    bp_plan *p = compile(m, !amp, amp); /* amp with fusion asked for; fp32 without */
    bp_graph *g = graph_of(m, p);
    const int fused = !amp;
    ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "batchnorm_relu.fwd_train", NULL),
                     fused ? 4 : 0);
    ck_assert_int_eq(count(g, 0, BP_SEGMENT_FORWARD, "relu.fwd", NULL), fused ? 0 : 4);
    bp_graph_destroy(g);
    bp_plan_destroy(p);
  }
  /* off by default; BP_FUSE turns it on */
  unsetenv("BP_FUSE");
  ck_assert_int_eq(bp_compile_options_from_model(m).fuse_bn_relu, 0);
  setenv("BP_FUSE", "1", 1);
  ck_assert_int_eq(bp_compile_options_from_model(m).fuse_bn_relu, 1);
  setenv("BP_FUSE", "0", 1);
  ck_assert_int_eq(bp_compile_options_from_model(m).fuse_bn_relu, 0);
  unsetenv("BP_FUSE");
  bp_model_destroy(m);
}
END_TEST

START_TEST(a_run_fuses_only_where_the_kernels_are_and_no_pin_is_lost) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_discover(r, NULL, 0) == BP_OK, "%s", bp_last_error());
  char why[160] = "";
  ck_assert_msg(bp_fuse_bn_relu_allowed(r, "cpu", "", why, sizeof why), "%s", why);
  ck_assert_int_eq(bp_fuse_bn_relu_allowed(r, "nodevice", "", why, sizeof why), 0);
  ck_assert_msg(strstr(why, "no kernel for batchnorm_relu."), "%s", why);
  ck_assert_int_eq(bp_fuse_bn_relu_allowed(r, "cpu", "relu.*=reference", why, sizeof why), 0);
  ck_assert_msg(strstr(why, "a kernel pin names relu.fwd"), "%s", why);
  ck_assert_int_eq(bp_fuse_bn_relu_allowed(r, "cpu", "batchnorm.bwd=cpu", why, sizeof why), 0);
  /* a pin that names the fused ops too is kept */
  ck_assert_msg(bp_fuse_bn_relu_allowed(r, "cpu", "*=reference", why, sizeof why), "%s", why);
  ck_assert_msg(bp_fuse_bn_relu_allowed(r, "cpu", "conv2d.*=reference", why, sizeof why), "%s",
                why);
  /* a pin of everything to an impl without the fused kernels */
  ck_assert_int_eq(bp_fuse_bn_relu_allowed(r, "cpu", "*=nosuchimpl", why, sizeof why), 0);
  ck_assert_msg(strstr(why, "a kernel pin names nosuchimpl, which has no batchnorm_relu."), "%s",
                why);
  bp_registry_destroy(r);
}
END_TEST

/* ---- training: fused and unfused end with the same bits --------------------------- */

static bp_trainer *train(const char *model, const char *data, int fuse, int pin_reference,
                         bp_epoch_report *report) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.data_dir = data;
  o.batch = 32;
  o.eval_batch = 32;
  o.train_limit = 96;
  o.test_limit = 32;
  o.epochs = 1;
  o.seed = 5;
  if (pin_reference) o.kernels = "*=reference";
  if (fuse) setenv("BP_FUSE", "1", 1);
  bp_trainer *t = NULL;
  const bp_status st = bp_trainer_create_from_file(model, &o, &t);
  unsetenv("BP_FUSE");
  ck_assert_msg(st == BP_OK, "%s: %s", model, bp_last_error());
  ck_assert_msg(bp_trainer_train_epoch(t, report) == BP_OK, "%s: %s", model, bp_last_error());
  /* the kernels it ran say whether it fused */
  int fused_nodes = 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(t); i++)
    if (strncmp(bp_trainer_kernel_use(t, i)->kernel->kernel.op, "batchnorm_relu.", 15) == 0)
      fused_nodes++;
  ck_assert_msg(fuse ? fused_nodes > 0 : fused_nodes == 0, "%s: %d fused nodes", model,
                fused_nodes);
  return t;
}

/* Every FP32 tensor outside the feature regions (weights, gradients,
 * momenta, running statistics, results), bit for bit. */
static void assert_same_state(const bp_trainer *a, const bp_trainer *b, const char *what) {
  const bp_plan *p = bp_trainer_plan(a);
  int compared = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->dtype != BP_DTYPE_FP32 || bp_region_is_packed(d->region)) continue;
    const uint64_t n = bp_dtensor_host_elems(d);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    ck_assert_int_eq(bp_trainer_read_tensor(a, d->name, x, n), BP_OK);
    ck_assert_int_eq(bp_trainer_read_tensor(b, d->name, y, n), BP_OK);
    ck_assert_msg(memcmp(x, y, (size_t)n * sizeof *x) == 0, "%s: '%s' differs", what, d->name);
    free(x);
    free(y);
    compared++;
  }
  ck_assert_int_gt(compared, 8);
}

START_TEST(training_fused_ends_with_the_bits_of_training_unfused) {
  toy_env e = toy_env_open("", 96, 32, 13);
  static const char *const models[] = {"models/cnn.yaml", "models/resnet8.yaml"};
  for (int i = 0; i < 2; i++)
    for (int ref = 0; ref < 2; ref++) { /* the cpu module's kernels, then the reference's */
      char *path = source_path(models[i]);
      char what[256];
      snprintf(what, sizeof what, "%s%s", models[i], ref ? " (reference kernels)" : "");
      bp_epoch_report ra, rb;
      bp_trainer *a = train(path, e.data, 1, ref, &ra);
      bp_trainer *b = train(path, e.data, 0, ref, &rb);
      ck_assert_int_ge(ra.steps, 3);
      ck_assert_int_eq(ra.steps, rb.steps);
      ck_assert_msg(memcmp(&ra.train_loss, &rb.train_loss, sizeof ra.train_loss) == 0,
                    "%s: train loss %.9g fused, %.9g unfused", what, ra.train_loss,
                    rb.train_loss);
      ck_assert_msg(memcmp(&ra.test_loss, &rb.test_loss, sizeof ra.test_loss) == 0,
                    "%s: test loss %.9g fused, %.9g unfused", what, ra.test_loss, rb.test_loss);
      assert_same_state(a, b, what);
      printf("%s: same bits fused and unfused (arena %" PRIu64 " vs %" PRIu64 " bytes)\n", what,
             bp_plan_total_bytes(bp_trainer_plan(a)), bp_plan_total_bytes(bp_trainer_plan(b)));
      bp_trainer_destroy(a);
      bp_trainer_destroy(b);
      free(path);
    }
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fusion");
  TCase *tc = tcase_create("graph");
  tcase_add_test(tc, the_cnn_runs_every_batchnorm_fused_with_its_relu);
  tcase_add_test(tc, a_batchnorm_with_another_reader_stays_unfused);
  tcase_add_test(tc, amp_and_the_default_keep_batchnorm_and_relu_apart);
  tcase_add_test(tc, a_run_fuses_only_where_the_kernels_are_and_no_pin_is_lost);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  TCase *train_case = tcase_create("train");
  tcase_add_test(train_case, training_fused_ends_with_the_bits_of_training_unfused);
  tcase_set_timeout(train_case, 600);
  suite_add_tcase(s, train_case);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
