/* Batchnorm + relu fusion (bp_compile_options.fuse_bn_relu, graph_build.c,
 * layer_norm_act.c; the batchnorm_relu ops of bp_abi_ops.h): which pairs
 * the graph fuses, when a run may fuse (fuse.c), the arena it saves, that
 * training fused ends with the very bits of training unfused, and that
 * fused and unfused runs resume from each other's checkpoints. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/checkpoint.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "fuse-impl.h"
#include "run_util.h"
#include "test_env.h"

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

START_TEST(amp_keeps_batchnorm_and_relu_apart_and_bp_fuse_0_opts_out) {
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
  /* on by default, whatever the environment says: only the CLI reads
   * BP_FUSE (the trainer's no_fuse, below) */
  unsetenv("BP_FUSE");
  ck_assert_int_eq(bp_compile_options_from_model(m).fuse_bn_relu, 1);
  setenv("BP_FUSE", "0", 1);
  ck_assert_int_eq(bp_compile_options_from_model(m).fuse_bn_relu, 1);
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

/* One epoch of batch 32 on `train_limit` toy images, 32 test images. */
static bp_train_options toy_options(const char *data, int64_t train_limit, int pin_reference) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = data;
  o.batch = 32;
  o.eval_batch = 32;
  o.train_limit = train_limit;
  o.test_limit = 32;
  o.epochs = 1;
  o.seed = 5;
  if (pin_reference) o.kernels = "*=reference";
  return o;
}

/* A trainer created as BP_FUSE=`fuse` ("1", "0"; NULL: unset) has the CLI
 * create it: "0" is no_fuse. */
static bp_status create(const char *model, const bp_train_options *o, const char *fuse,
                        bp_trainer **out) {
  bp_train_options with = *o;
  with.no_fuse = fuse && strcmp(fuse, "0") == 0;
  return bp_trainer_create_from_file(model, &with, out);
}

/* Nodes bound to a batchnorm_relu kernel: the kernels a trainer runs say
 * whether it fused. */
static int fused_nodes(const bp_trainer *t) {
  int n = 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(t); i++)
    if (strncmp(bp_trainer_kernel_use(t, i)->kernel->kernel.op, "batchnorm_relu.", 15) == 0) n++;
  return n;
}

static bp_trainer *train(const char *model, const char *data, int fuse, int pin_reference,
                         bp_epoch_report *report) {
  const bp_train_options o = toy_options(data, 96, pin_reference);
  bp_trainer *t = NULL;
  const bp_status st = create(model, &o, fuse ? "1" : "0", &t);
  ck_assert_msg(st == BP_OK, "%s: %s", model, bp_last_error());
  ck_assert_msg(bp_trainer_train_epoch(t, report) == BP_OK, "%s: %s", model, bp_last_error());
  ck_assert_msg(fuse ? fused_nodes(t) > 0 : fused_nodes(t) == 0, "%s: %d fused nodes", model,
                fused_nodes(t));
  return t;
}

/* Every FP32 tensor outside the feature regions (weights, gradients,
 * momenta, running statistics and, unless skip_results, results), bit for
 * bit. */
static void assert_same_state_(const bp_trainer *a, const bp_trainer *b, const char *what,
                               int skip_results) {
  const bp_plan *p = bp_trainer_plan(a);
  int compared = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->dtype != BP_DTYPE_FP32 || bp_region_is_packed(d->region)) continue;
    if (skip_results && d->region == BP_REGION_R) continue;
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

static void assert_same_state(const bp_trainer *a, const bp_trainer *b, const char *what) {
  assert_same_state_(a, b, what, 0);
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

/* ---- checkpoints: fused and unfused plans read each other's ------------------------ */

START_TEST(fused_and_unfused_plans_hash_alike) {
  static const char *const models[] = {"models/cnn.yaml", "models/resnet8.yaml"};
  for (int i = 0; i < 2; i++) {
    bp_model *m = load(models[i]);
    for (int amp = 0; amp < 2; amp++) {
      bp_plan *fused = compile(m, 1, amp), *plain = compile(m, 0, amp);
      ck_assert_msg(bp_plan_hash(fused) == bp_plan_hash(plain), "%s, amp %d", models[i], amp);
      ck_assert_uint_eq(bp_checkpoint_file_bytes(fused), bp_checkpoint_file_bytes(plain));
      printf("%s, amp %d: plan hash %016" PRIx64 " fused and unfused (arena %" PRIu64
             " vs %" PRIu64 " bytes)\n",
             models[i], amp, bp_plan_hash(fused), bp_plan_total_bytes(fused),
             bp_plan_total_bytes(plain));
      bp_plan_destroy(fused);
      bp_plan_destroy(plain);
    }
    bp_model_destroy(m);
  }
}
END_TEST

START_TEST(the_default_fuses_on_cpu_and_bp_fuse_0_does_not) {
  toy_env e = toy_env_open("", 64, 32, 7);
  char *cnn = source_path("models/cnn.yaml");
  const bp_train_options o = toy_options(e.data, 64, 0);
  bp_trainer *on = NULL, *off = NULL, *pinned = NULL;
  ck_assert_msg(create(cnn, &o, NULL, &on) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(create(cnn, &o, "0", &off) == BP_OK, "%s", bp_last_error());
  /* the nodes each run bound: with no BP_FUSE, every batchnorm of cnn runs
   * fused with its relu, forward, backward and in every evaluation variant */
  int relu_on = 0, relu_off = 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(on); i++)
    relu_on += strncmp(bp_trainer_kernel_use(on, i)->kernel->kernel.op, "relu.", 5) == 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(off); i++)
    relu_off += strncmp(bp_trainer_kernel_use(off, i)->kernel->kernel.op, "relu.", 5) == 0;
  ck_assert_int_ge(fused_nodes(on), 12); /* 4 pairs: train forward, backward, eval */
  ck_assert_int_eq(relu_on, 0);
  ck_assert_int_eq(fused_nodes(off), 0);
  ck_assert_int_ge(relu_off, 12);
  ck_assert_uint_eq(bp_plan_hash(bp_trainer_plan(on)), bp_plan_hash(bp_trainer_plan(off)));
  /* a pin of the unfused relu is kept: that run does not fuse */
  bp_train_options pin = o;
  pin.kernels = "relu.*=reference";
  ck_assert_msg(create(cnn, &pin, NULL, &pinned) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(fused_nodes(pinned), 0);
  bp_trainer_destroy(on);
  bp_trainer_destroy(off);
  bp_trainer_destroy(pinned);
  free(cnn);
  toy_env_close(&e);
}
END_TEST

/* Trains `model` to the end of the toy epoch (4 steps), BP_FUSE=`fuse`,
 * after a resume from `resume` (NULL: from the start); with `stop`, stops
 * after that many steps and checkpoints to `save`. */
static bp_trainer *run_part(const char *model, const char *data, const char *fuse, int64_t stop,
                            const char *save, const char *resume, bp_epoch_report *r) {
  bp_train_options o = toy_options(data, 128, 0);
  o.stop_after_steps = stop;
  o.checkpoint_path = save;
  o.resume_path = resume;
  bp_trainer *t = NULL;
  ck_assert_msg(create(model, &o, fuse, &t) == BP_OK, "%s: %s", model, bp_last_error());
  ck_assert_msg(strcmp(fuse, "1") == 0 ? fused_nodes(t) > 0 : fused_nodes(t) == 0,
                "%s, BP_FUSE=%s: %d fused nodes", model, fuse, fused_nodes(t));
  ck_assert_msg(bp_trainer_train_epoch(t, r) == BP_OK, "%s: %s", model, bp_last_error());
  return t;
}

/* Two steps fused, a checkpoint, two more unfused (and the other way
 * round) end with the bits of four steps in one run. */
START_TEST(a_checkpoint_resumes_fused_or_unfused_with_the_same_bits) {
  toy_env e = toy_env_open("", 128, 32, 17);
  char *ck = path_in(e.dir, "half.ckpt");
  static const char *const models[] = {"models/cnn.yaml", "models/resnet8.yaml"};
  for (int i = 0; i < 2; i++) {
    char *model = source_path(models[i]);
    bp_epoch_report whole, half, rest;
    bp_trainer *once = run_part(model, e.data, "1", 0, NULL, NULL, &whole);
    ck_assert_int_eq(whole.steps, 4);
    for (int first_fused = 1; first_fused >= 0; first_fused--) {
      const char *first = first_fused ? "1" : "0", *then = first_fused ? "0" : "1";
      char what[256];
      snprintf(what, sizeof what, "%s, BP_FUSE=%s then %s", models[i], first, then);
      bp_trainer *a = run_part(model, e.data, first, 2, ck, NULL, &half);
      ck_assert_int_eq(half.complete, 0);
      ck_assert_int_eq(half.checkpointed, 1);
      bp_trainer_destroy(a);
      bp_trainer *b = run_part(model, e.data, then, 0, NULL, ck, &rest);
      ck_assert_int_eq(rest.steps, 2);
      ck_assert_int_eq(rest.complete, 1);
      ck_assert_msg(memcmp(&rest.test_loss, &whole.test_loss, sizeof rest.test_loss) == 0,
                    "%s: test loss %.9g, %.9g in one run", what, rest.test_loss, whole.test_loss);
      /* the results hold this call's loss sums: two steps, not four */
      assert_same_state_(once, b, what, 1);
      printf("%s: the bits of one run\n", what);
      bp_trainer_destroy(b);
    }
    bp_trainer_destroy(once);
    free(model);
  }
  free(ck);
  toy_env_close(&e);
}
END_TEST

/* Another model's or another optimizer's checkpoint is still refused, with
 * one line that names the file. */
START_TEST(a_checkpoint_of_another_model_or_optimizer_is_refused) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS, 64, 32, 23);
  char *ck = path_in(e.dir, "cnn.ckpt"), *cnn = source_path("models/cnn.yaml");
  bp_epoch_report r;
  bp_trainer *t = run_part(cnn, e.data, "1", 1, ck, NULL, &r);
  bp_trainer_destroy(t);
  bp_train_options o = toy_options(e.data, 64, 0);
  o.resume_path = ck;
  bp_train_options adamw = o;
  adamw.optimizer = BP_OPT_ADAMW;
  const struct {
    const char *model;
    const bp_train_options *o;
    const char *fuse;
  } cases[] = {{e.mlp, &o, "1"}, {e.model, &o, "0"}, {cnn, &adamw, "1"}, {cnn, &adamw, "0"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bp_trainer *x = NULL;
    const bp_status st = create(cases[i].model, cases[i].o, cases[i].fuse, &x);
    const char *msg = bp_last_error();
    ck_assert_msg(st == BP_ERR_SHAPE, "case %zu: %s: %s", i, bp_status_str(st), msg);
    ck_assert_msg(strstr(msg, ck) && strstr(msg, "was written for another plan") &&
                      !strchr(msg, '\n'),
                  "case %zu: %s", i, msg);
    bp_trainer_destroy(x);
  }
  free(ck);
  free(cnn);
  toy_env_close(&e);
}
END_TEST

/* Stdout of a command-line run with BP_FUSE=`fuse` (NULL: unset), without
 * what differs from run to run or file to file: eval's "checkpoint F" line
 * and the time in its "test loss" line, predict's latency line. */
static char *run_with(const char *fuse, const char *const *args) {
  if (fuse) setenv("BP_FUSE", fuse, 1);
  else unsetenv("BP_FUSE");
  run_result r = run_exe("blueprint", args);
  unsetenv("BP_FUSE");
  ck_assert_msg(r.status == 0, "%s %s: %s%s", args[0], args[1], r.out, r.err);
  char *out = malloc(r.out_len + 1), *o = out;
  for (const char *line = r.out; *line;) {
    const char *end = strchr(line, '\n');
    const size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
    const char *paren = strstr(line, "  ("), *latency = strstr(line, "latency");
    if (strncmp(line, "test loss ", 10) == 0 && paren && paren < line + n) {
      memcpy(o, line, (size_t)(paren - line));
      o += paren - line;
      *o++ = '\n';
    } else if (strncmp(line, "checkpoint ", 11) != 0 && !(latency && latency < line + n)) {
      memcpy(o, line, n);
      o += n;
    }
    line += n;
  }
  *o = '\0';
  run_free(&r);
  return out;
}

/* Through the command line: a checkpoint trained with fusion (the default
 * on cpu) and one trained with BP_FUSE=0 evaluate and predict alike either
 * way. */
START_TEST(eval_and_predict_read_a_checkpoint_either_way) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS "train: {batch: 32, eval_batch: 50, epochs: 1}\n",
                           128, 50, 29);
  char *ck[2] = {path_in(e.dir, "fused.ckpt"), path_in(e.dir, "plain.ckpt")};
  char *images = path_in(e.data, "t10k-images-idx3-ubyte");
  char *want_eval = NULL, *want_predict = NULL;
  for (int k = 0; k < 2; k++) {
    free(run_with(k ? "0" : NULL, (const char *const[]){"train", e.model, "--data", e.data,
                                                         "--checkpoint", ck[k], "--quiet", NULL}));
    for (int f = 0; f < 2; f++) {
      const char *fuse = f ? "0" : NULL;
      char *ev = run_with(fuse, (const char *const[]){"eval", e.model, "--checkpoint", ck[k],
                                                      "--data", e.data, "--quiet", NULL});
      char *pr = run_with(fuse, (const char *const[]){"predict", e.model, "--checkpoint", ck[k],
                                                      "--input", images, "--data", e.data, "--top",
                                                      "3", NULL});
      ck_assert_msg(strstr(ev, "test loss "), "%s", ev);
      if (!want_eval) {
        want_eval = ev;
        want_predict = pr;
        continue;
      }
      ck_assert_msg(strcmp(ev, want_eval) == 0, "trained %s, BP_FUSE=%s:\n%s\nwant\n%s",
                    k ? "unfused" : "fused", f ? "0" : "unset", ev, want_eval);
      ck_assert_msg(strcmp(pr, want_predict) == 0, "trained %s, BP_FUSE=%s:\n%s\nwant\n%s",
                    k ? "unfused" : "fused", f ? "0" : "unset", pr, want_predict);
      free(ev);
      free(pr);
    }
  }
  printf("eval and predict alike, fused or not:\n%s", want_eval);
  free(want_eval);
  free(want_predict);
  free(images);
  free(ck[0]);
  free(ck[1]);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fusion");
  TCase *tc = tcase_create("graph");
  tcase_add_test(tc, the_cnn_runs_every_batchnorm_fused_with_its_relu);
  tcase_add_test(tc, a_batchnorm_with_another_reader_stays_unfused);
  tcase_add_test(tc, amp_keeps_batchnorm_and_relu_apart_and_bp_fuse_0_opts_out);
  tcase_add_test(tc, a_run_fuses_only_where_the_kernels_are_and_no_pin_is_lost);
  tcase_add_test(tc, fused_and_unfused_plans_hash_alike);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  TCase *train_case = tcase_create("train");
  tcase_add_test(train_case, training_fused_ends_with_the_bits_of_training_unfused);
  tcase_add_test(train_case, the_default_fuses_on_cpu_and_bp_fuse_0_does_not);
  tcase_add_test(train_case, a_checkpoint_resumes_fused_or_unfused_with_the_same_bits);
  tcase_add_test(train_case, a_checkpoint_of_another_model_or_optimizer_is_refused);
  tcase_add_test(train_case, eval_and_predict_read_a_checkpoint_either_way);
  tcase_set_timeout(train_case, 600);
  suite_add_tcase(s, train_case);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
