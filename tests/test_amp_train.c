/* Mixed precision training (docs/amp.md): the step's range nodes in the
 * graph (structure), then end-to-end runs on small generated MNIST-format
 * sets: a gradient overflow skips exactly its step (weights, moments, EMA
 * and the optimizer step count untouched, the scale halved, training goes
 * on), on one rank of two too, with both ranks skipping and staying
 * bit-identical; the scale grows by GradScaler's rule; a static scale
 * stays; a run stopped mid-epoch and resumed ends with the bytes of an
 * uninterrupted one; mpirun processes end with the bytes of threads; bad
 * option values are refused with one line.
 *
 * The overflow comes from tests/modules/inf_grad.c: a USER-priority FP16
 * relu.bwd that writes +Inf into one gradient element at the (step, rank)
 * pairs listed in BP_TEST_INF_GRAD. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/checkpoint.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/train.h"
#include "run_util.h"
#include "test_env.h"

#define INF_GRAD_MODULE BP_TEST_MODULES "/inf_grad/inf_grad.so"

/* conv, batch norm, relu (the module's op), pooling, fc: 6 steps of 20 per
 * epoch, split evenly over 1 or 2 ranks (one variant: one counter per node
 * in the module) */
static const char bn_model[] =
    TOY_BN_MODEL_LAYERS
    "train: {batch: 20, eval_batch: 40, epochs: 2, lr: 0.02}\n";

static toy_env env_open(void) { return toy_env_open(bn_model, 120, 40, 11); }

/* ---- graph structure ------------------------------------------------------------- */

typedef struct rig {
  bp_model *model;
  bp_plan *plan;
  bp_graph *graph;
} rig;

static rig open_rig(int amp, int world, bp_optimizer opt) {
  rig r;
  char path[4096];
  snprintf(path, sizeof path, "%s/models/cnn.yaml", getenv("BP_SOURCE_DIR"));
  ck_assert_msg(bp_model_load(path, &r.model) == BP_OK, "%s", bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(r.model);
  co.plan.amp = amp;
  co.plan.ema = 1;
  co.plan.optimizer = opt;
  co.batch = 64;
  co.train_size = 640;
  co.eval_batch = 100;
  co.world = world;
  ck_assert_msg(bp_model_compile(r.model, &co, &r.plan) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.world = world;
  go.global_batch = 64;
  go.train_size = 640;
  ck_assert_msg(bp_graph_build(r.model, r.plan, &go, &r.graph) == BP_OK, "%s", bp_last_error());
  return r;
}

static void close_rig(rig *r) {
  bp_graph_destroy(r->graph);
  bp_plan_destroy(r->plan);
  bp_model_destroy(r->model);
}

static void expect_ops(const rig *r, int v, bp_segment s, const char *want) {
  char got[1024] = "";
  for (int k = 0; k < bp_graph_node_count(r->graph, v, s); k++) {
    const size_t n = strlen(got);
    snprintf(got + n, sizeof got - n, "%s%s", k ? " " : "", bp_graph_node(r->graph, v, s, k)->op);
  }
  ck_assert_msg(strcmp(got, want) == 0, "segment %s: got \"%s\", want \"%s\"", bp_segment_name(s),
                got, want);
}

static bp_span span_of(const rig *r, bp_region a, bp_region b) {
  bp_span s;
  ck_assert_int_eq(bp_plan_resolve(r->plan, a, b, &s), BP_OK);
  return s;
}

static void expect_span(const bp_node_tensor *t, bp_span want, bp_dtype dtype, const char *what) {
  ck_assert_msg(t->id == -1 && t->span.offset == want.offset && t->span.bytes == want.bytes &&
                    t->dtype == dtype,
                "%s: span [%llu,+%llu) %s, want [%llu,+%llu) %s", what,
                (unsigned long long)t->span.offset, (unsigned long long)t->span.bytes,
                bp_dtype_name(t->dtype), (unsigned long long)want.offset,
                (unsigned long long)want.bytes, bp_dtype_name(dtype));
}

/* Under AMP on 2 ranks: the loss takes S; CAST_GRAD zeroes the flag and
 * unscales G16 into G; COMM sums whole spans (no sharding, no gathers); the
 * NaN check over all of G comes first in UPDATE; every update and the EMA
 * skip on the flag; the loss-scale node ends the step. */
START_TEST(amp_step_nodes_in_data_flow_order) {
  rig r = open_rig(1, 2, BP_OPT_ADAMW);
  const bp_graph_tensors *ids = bp_graph_get_tensors(r.graph);
  ck_assert_int_ge(ids->found_inf, 0);
  ck_assert_int_eq(ids->found_inf, bp_plan_find_tensor(r.plan, "found_inf"));
  ck_assert_int_eq(ids->good_steps, bp_plan_find_tensor(r.plan, "good_steps"));
  ck_assert_int_eq(ids->skipped, bp_plan_find_tensor(r.plan, "skipped"));
  const bp_span g = span_of(&r, BP_REGION_G_BN_BIAS, BP_REGION_G_CONV_DEEP);
  const bp_span g16 = span_of(&r, BP_REGION_G16_BN_BIAS, BP_REGION_G16_CONV_DEEP);
  const int tr = bp_plan_find_variant(r.plan, "train"), ev = bp_plan_find_variant(r.plan, "eval");

  const bp_node *loss = bp_graph_node(r.graph, tr, BP_SEGMENT_LOSS, 0);
  ck_assert_int_eq(loss->num_inputs, 3);
  ck_assert_int_eq(loss->inputs[2].id, ids->loss_scale);
  ck_assert_int_eq(loss->attrs.softmax_ce.has_loss_scale, 1);
  const bp_node *eval_loss =
      bp_graph_node(r.graph, ev, BP_SEGMENT_EVAL, bp_graph_node_count(r.graph, ev, BP_SEGMENT_EVAL) - 1);
  ck_assert_str_eq(eval_loss->op, "softmax_ce.fwd_bwd");
  ck_assert_int_eq(eval_loss->num_inputs, 2);
  ck_assert_int_eq(eval_loss->attrs.softmax_ce.has_loss_scale, 0);

  expect_ops(&r, tr, BP_SEGMENT_CAST_GRAD, "range.zero range.unscale");
  const bp_node *zero = bp_graph_node(r.graph, tr, BP_SEGMENT_CAST_GRAD, 0);
  ck_assert_int_eq(zero->outputs[0].id, ids->found_inf);
  const bp_node *un = bp_graph_node(r.graph, tr, BP_SEGMENT_CAST_GRAD, 1);
  expect_span(&un->inputs[0], g16, BP_DTYPE_FP16, "unscale in");
  ck_assert_int_eq(un->inputs[1].id, ids->loss_scale);
  expect_span(&un->outputs[0], g, BP_DTYPE_FP32, "unscale out");

  expect_ops(&r, tr, BP_SEGMENT_COMM, "allreduce.sum allreduce.sum allreduce.sum");
  expect_ops(&r, tr, BP_SEGMENT_GATHER, "");
  expect_ops(&r, tr, BP_SEGMENT_STATE, "");
  expect_ops(&r, tr, BP_SEGMENT_UPDATE, "range.nan_check range.adamw range.adamw");
  const bp_node *check = bp_graph_node(r.graph, tr, BP_SEGMENT_UPDATE, 0);
  expect_span(&check->inputs[0], g, BP_DTYPE_FP32, "nan_check");
  ck_assert_int_eq(check->outputs[0].id, ids->found_inf);
  for (int k = 1; k < 3; k++) {
    const bp_node *u = bp_graph_node(r.graph, tr, BP_SEGMENT_UPDATE, k);
    ck_assert_int_eq(u->attrs.optimizer.has_skip, 1);
    ck_assert_int_eq(u->num_inputs, 4); /* grad, lr, step, skip */
    ck_assert_int_eq(u->inputs[2].id, ids->step);
    ck_assert_int_eq(u->inputs[3].id, ids->found_inf);
    ck_assert_uint_eq(u->shard_domain, 0); /* replicated */
  }
  expect_ops(&r, tr, BP_SEGMENT_EMA, "range.ema range.loss_scale");
  const bp_node *ema = bp_graph_node(r.graph, tr, BP_SEGMENT_EMA, 0);
  ck_assert_int_eq(ema->attrs.range.has_skip, 1);
  ck_assert_int_eq(ema->inputs[1].id, ids->found_inf);
  const bp_node *ls = bp_graph_node(r.graph, tr, BP_SEGMENT_EMA, 1);
  ck_assert_int_eq(ls->num_inputs, 1);
  ck_assert_int_eq(ls->inputs[0].id, ids->found_inf);
  ck_assert_int_eq(ls->num_outputs, 4);
  const int32_t outs[4] = {ids->loss_scale, ids->good_steps, ids->step, ids->skipped};
  for (int k = 0; k < 4; k++) ck_assert_int_eq(ls->outputs[k].id, outs[k]);
  ck_assert_uint_eq(ls->attr_size, sizeof(bp_loss_scale_attrs));
  ck_assert_float_eq(ls->attrs.loss_scale.growth_factor, 2.0f);
  ck_assert_float_eq(ls->attrs.loss_scale.backoff_factor, 0.5f);
  ck_assert_int_eq(ls->attrs.loss_scale.growth_interval, 2000);
  close_rig(&r);

  /* SGD on one rank: the same nodes, the skip input after lr */
  r = open_rig(1, 1, BP_OPT_SGD);
  ids = bp_graph_get_tensors(r.graph);
  expect_ops(&r, 0, BP_SEGMENT_COMM, "");
  expect_ops(&r, 0, BP_SEGMENT_UPDATE, "range.nan_check range.sgd range.sgd");
  const bp_node *u = bp_graph_node(r.graph, 0, BP_SEGMENT_UPDATE, 1);
  ck_assert_int_eq(u->num_inputs, 3);
  ck_assert_int_eq(u->inputs[2].id, ids->found_inf);
  close_rig(&r);
}
END_TEST

/* Without AMP nothing changes: no loss-scale scalars, no skip inputs, the
 * sharded update; and bad loss-scale attributes are refused at build. */
START_TEST(plans_without_amp_keep_their_tensors_and_nodes) {
  rig r = open_rig(0, 2, BP_OPT_ADAMW);
  ck_assert_int_eq(bp_plan_find_tensor(r.plan, "found_inf"), -1);
  ck_assert_int_eq(bp_plan_find_tensor(r.plan, "good_steps"), -1);
  ck_assert_int_eq(bp_plan_find_tensor(r.plan, "skipped"), -1);
  ck_assert_int_eq(bp_graph_get_tensors(r.graph)->found_inf, -1);
  expect_ops(&r, 0, BP_SEGMENT_CAST_GRAD, "");
  expect_ops(&r, 0, BP_SEGMENT_EMA, "range.ema");
  ck_assert_str_eq(bp_graph_node(r.graph, 0, BP_SEGMENT_COMM, 0)->op, "allreduce.reduce_scatter");
  for (int k = 0; k < bp_graph_node_count(r.graph, 0, BP_SEGMENT_UPDATE); k++)
    ck_assert_int_eq(bp_graph_node(r.graph, 0, BP_SEGMENT_UPDATE, k)->attrs.optimizer.has_skip, 0);
  ck_assert_int_eq(bp_graph_node(r.graph, 0, BP_SEGMENT_LOSS, 0)->num_inputs, 2);
  close_rig(&r);

  r = open_rig(1, 1, BP_OPT_SGD);
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = 64;
  go.train_size = 640;
  go.loss_scale.backoff_factor = 2.0f;
  bp_graph *g = NULL;
  ck_assert_int_eq(bp_graph_build(r.model, r.plan, &go, &g), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "backoff"));
  ck_assert_ptr_null(g);
  close_rig(&r);
}
END_TEST

/* ---- runs through the C API ---------------------------------------------------------- */

#define MAX_STEPS 24
#define MAX_RANKS 2

/* What a step leaves on a rank: the state a skipped step must not touch
 * (W, E, M, V, concatenated) and the S scalars. */
typedef struct snapshot {
  float *state;
  uint64_t count;
  float scale, good, step, skipped;
} snapshot;

typedef struct recorder {
  bp_trainer *t;
  int steps;
  snapshot at[MAX_STEPS + 1][MAX_RANKS]; /* [global step][rank]; [0]: before the first */
} recorder;

static int kept(const bp_dtensor *d) {
  return d->dtype == BP_DTYPE_FP32 &&
         ((d->region >= BP_REGION_W_BN_BIAS && d->region <= BP_REGION_E_CONV_DEEP) ||
          (d->region >= BP_REGION_M_BN_BIAS && d->region <= BP_REGION_V_CONV_DEEP));
}

static float scalar(const bp_trainer *t, int rank, const char *name) {
  float v = NAN;
  ck_assert_msg(bp_trainer_read_rank_tensor(t, rank, name, &v, 1) == BP_OK, "%s",
                bp_last_error());
  return v;
}

static snapshot take(const bp_trainer *t, int rank) {
  const bp_plan *p = bp_trainer_plan(t);
  snapshot s = {NULL, 0, 0, 0, 0, 0};
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++)
    if (kept(bp_plan_tensor(p, 0, id))) s.count += bp_dtensor_host_elems(bp_plan_tensor(p, 0, id));
  s.state = malloc((size_t)s.count * sizeof *s.state);
  ck_assert_ptr_nonnull(s.state);
  uint64_t at = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (!kept(d)) continue;
    const uint64_t n = bp_dtensor_host_elems(d);
    ck_assert_int_eq(bp_trainer_read_rank_tensor(t, rank, d->name, s.state + at, n), BP_OK);
    at += n;
  }
  s.scale = scalar(t, rank, "loss_scale");
  s.good = scalar(t, rank, "good_steps");
  s.step = scalar(t, rank, "step");
  s.skipped = scalar(t, rank, "skipped");
  return s;
}

static int same_state(const snapshot *a, const snapshot *b) {
  return a->count == b->count && memcmp(a->state, b->state, a->count * sizeof *a->state) == 0;
}

static int same_snapshot(const snapshot *a, const snapshot *b) {
  return same_state(a, b) && memcmp(&a->scale, &b->scale, 4) == 0 &&
         memcmp(&a->good, &b->good, 4) == 0 && memcmp(&a->step, &b->step, 4) == 0 &&
         memcmp(&a->skipped, &b->skipped, 4) == 0;
}

static void record_step(void *user, const bp_train_progress *p) {
  recorder *r = user;
  ck_assert_int_le(p->global_step, MAX_STEPS);
  for (int k = 0; k < bp_trainer_local_ranks(r->t); k++)
    r->at[p->global_step][k] = take(r->t, k);
  r->steps = (int)p->global_step;
}

static void recorder_free(recorder *r) {
  for (int s = 0; s <= MAX_STEPS; s++)
    for (int k = 0; k < MAX_RANKS; k++) free(r->at[s][k].state);
  free(r);
}

/* Options of the runs below; `inf` goes to BP_TEST_INF_GRAD ("" for none). */
typedef struct run_spec {
  int ranks, epochs;
  double loss_scale;
  int64_t growth_interval;
  const char *inf;
} run_spec;

/* Trains `model` with AMP, AdamW and EMA as `spec` says, recording every
 * step; the returned recorder holds the trainer's last report in *last. */
static recorder *train_recorded(const toy_env *e, run_spec spec, bp_epoch_report *last) {
  setenv("BP_TEST_INF_GRAD", spec.inf, 1);
  static const char *const plugins[] = {INF_GRAD_MODULE};
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = e->data;
  o.amp = 1;
  o.ema = 1;
  o.optimizer = BP_OPT_ADAMW;
  o.lr = 0.002;
  o.ranks = spec.ranks;
  o.epochs = spec.epochs;
  o.loss_scale = spec.loss_scale;
  o.loss_scale_growth_interval = spec.growth_interval;
  o.plugin_paths = plugins;
  o.plugin_path_count = 1;
  recorder *r = calloc(1, sizeof *r);
  ck_assert_ptr_nonnull(r);
  o.on_progress = record_step;
  o.progress_user = r;
  ck_assert_msg(bp_trainer_create_from_file(e->model, &o, &r->t) == BP_OK, "%s", bp_last_error());
  for (int k = 0; k < spec.ranks; k++) r->at[0][k] = take(r->t, k);
  /* the module's kernel runs the relu's backward */
  int ours = 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(r->t); i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(r->t, i);
    ours += strcmp(u->kernel->kernel.impl, "inf_grad") == 0 && strcmp(u->node, "relu1.bwd") == 0;
  }
  ck_assert_msg(ours > 0, "relu1.bwd did not get the inf_grad kernel");
  while (!bp_trainer_done(r->t))
    ck_assert_msg(bp_trainer_train_epoch(r->t, last) == BP_OK, "%s", bp_last_error());
  unsetenv("BP_TEST_INF_GRAD");
  return r;
}

/* Step `k` overflowed: it left every kept tensor and the step count as they
 * were, counted one skip, reset the clean steps and halved the scale (or
 * kept a static one). */
static void expect_skipped(const recorder *r, int k, int rank, int dynamic) {
  const snapshot *b = &r->at[k - 1][rank], *a = &r->at[k][rank];
  ck_assert_msg(same_state(a, b), "rank %d: step %d overflowed but changed W, E, M or V", rank, k);
  ck_assert_float_eq(a->step, b->step);
  ck_assert_float_eq(a->skipped, b->skipped + 1.0f);
  ck_assert_float_eq(a->good, 0.0f);
  ck_assert_float_eq(a->scale, dynamic ? b->scale * 0.5f : b->scale);
}

/* Some clean step after `k` updated the state: training goes on. */
static void expect_continues(const recorder *r, int k) {
  int updated = 0;
  for (int s = k + 1; s <= r->steps && !updated; s++)
    if (r->at[s][0].skipped == r->at[s - 1][0].skipped) {
      ck_assert_msg(!same_state(&r->at[s][0], &r->at[s - 1][0]), "clean step %d changed nothing",
                    s);
      ck_assert_float_eq(r->at[s][0].step, r->at[s - 1][0].step + 1.0f);
      updated = 1;
    }
  ck_assert_msg(updated, "no clean step after the overflow at step %d", k);
}

START_TEST(overflow_skips_exactly_its_step) {
  toy_env e = env_open();
  bp_epoch_report last;
  recorder *r = train_recorded(&e, (run_spec){1, 2, 0, 0, "5:0"}, &last);
  ck_assert_int_eq(r->steps, 12);
  ck_assert_float_eq(r->at[0][0].scale, 65536.0f); /* GradScaler's first scale */
  ck_assert_float_eq(r->at[0][0].step, 1.0f);      /* the first update's */
  expect_skipped(r, 5, 0, 1);
  expect_continues(r, 5);
  /* the counters the trainer reports and would checkpoint */
  const bp_train_state s = bp_trainer_state(r->t);
  const snapshot *end = &r->at[12][0];
  ck_assert_uint_eq(s.skipped_steps, (uint64_t)end->skipped);
  ck_assert_uint_eq(s.optimizer_steps + 1, (uint64_t)end->step);
  ck_assert_uint_eq(s.optimizer_steps + s.skipped_steps, 12);
  ck_assert_double_eq(s.loss_scale, end->scale);
  ck_assert_int_eq(last.amp, 1);
  ck_assert_double_eq(last.loss_scale, end->scale);
  ck_assert_int_eq(last.skipped_steps, (int64_t)(end->skipped - r->at[6][0].skipped));
  bp_trainer_destroy(r->t);
  recorder_free(r);
  toy_env_close(&e);
}
END_TEST

/* The Inf on rank 1 only: the all-reduce spreads it, so both ranks see the
 * overflow and skip, and stay bit-identical after every step. */
START_TEST(overflow_on_one_rank_skips_on_both) {
  toy_env e = env_open();
  bp_epoch_report last;
  recorder *r = train_recorded(&e, (run_spec){2, 1, 0, 0, "4:1"}, &last);
  ck_assert_int_eq(r->steps, 6);
  for (int s = 0; s <= 6; s++)
    ck_assert_msg(same_snapshot(&r->at[s][1], &r->at[s][0]),
                  "after step %d rank 1 differs from rank 0", s);
  expect_skipped(r, 4, 0, 1);
  expect_skipped(r, 4, 1, 1);
  expect_continues(r, 4);
  bp_trainer_destroy(r->t);
  recorder_free(r);
  toy_env_close(&e);
}
END_TEST

/* GradScaler's rule, step by step, with a growth interval of 3: an overflow
 * halves and resets, 3 clean steps in a row double. The scale must both
 * shrink and grow within the run. */
START_TEST(scale_grows_after_interval_clean_steps) {
  toy_env e = env_open();
  bp_epoch_report last;
  recorder *r = train_recorded(&e, (run_spec){1, 3, 0, 3, "2:0"}, &last);
  ck_assert_int_eq(r->steps, 18);
  int grew = 0, shrank = 0;
  for (int s = 1; s <= r->steps; s++) {
    const snapshot *b = &r->at[s - 1][0], *a = &r->at[s][0];
    if (a->skipped != b->skipped) {
      expect_skipped(r, s, 0, 1);
      shrank++;
      continue;
    }
    ck_assert_float_eq(a->step, b->step + 1.0f);
    if (b->good + 1.0f >= 3.0f) {
      ck_assert_msg(a->scale == 2.0f * b->scale && a->good == 0.0f,
                    "step %d: the 3rd clean step gave scale %g (was %g), clean %g", s,
                    (double)a->scale, (double)b->scale, (double)a->good);
      grew++;
    } else {
      ck_assert_msg(a->scale == b->scale && a->good == b->good + 1.0f,
                    "step %d: scale %g (was %g), clean %g (was %g)", s, (double)a->scale,
                    (double)b->scale, (double)a->good, (double)b->good);
    }
  }
  ck_assert_int_ge(shrank, 1);
  ck_assert_msg(grew >= 1, "the scale never grew in %d steps", r->steps);
  ck_assert_float_eq(r->at[2][0].scale, 32768.0f); /* the injected overflow at step 2 */
  bp_trainer_destroy(r->t);
  recorder_free(r);
  toy_env_close(&e);
}
END_TEST

/* --loss-scale X: the scale never moves, overflow steps are still skipped. */
START_TEST(static_scale_stays_and_still_skips) {
  toy_env e = env_open();
  bp_epoch_report last;
  recorder *r = train_recorded(&e, (run_spec){1, 1, 512.0, 0, "3:0"}, &last);
  for (int s = 0; s <= r->steps; s++) ck_assert_float_eq(r->at[s][0].scale, 512.0f);
  expect_skipped(r, 3, 0, 0);
  expect_continues(r, 3);
  ck_assert_double_eq(last.loss_scale, 512.0);
  bp_trainer_destroy(r->t);
  recorder_free(r);
  toy_env_close(&e);
}
END_TEST

/* ---- the command line ------------------------------------------------------------------ */

/* Uninterrupted vs stopped at `stop` (mid-epoch) and resumed: the same
 * checkpoint bytes, the loss-scaling counters in the header included. */
static void check_resume(const toy_env *e, const char *const *extra, int stop) {
  char *full = path_in(e->dir, "full.ckpt"), *part = path_in(e->dir, "part.ckpt");
  char stop_text[16];
  snprintf(stop_text, sizeof stop_text, "%d", stop);
  for (int pass = 0; pass < 3; pass++) {
    const char *args[40] = {"train", e->model, "--data", e->data, "--epochs", "2", "--amp",
                            "--checkpoint", pass == 0 ? full : part};
    int n = 9;
    for (int k = 0; extra[k]; k++) args[n++] = extra[k];
    if (pass == 1) args[n++] = "--stop-after-steps", args[n++] = stop_text;
    if (pass == 2) args[n++] = "--resume", args[n++] = part;
    args[n] = NULL;
    run_result r = run_exe("blueprint", args);
    ck_assert_msg(r.status == 0, "pass %d: status %d: %s", pass, r.status, r.err);
    ck_assert_msg(strstr(r.out, "loss scale") != NULL, "no loss scale on the epoch line: %s", r.out);
    run_free(&r);
  }
  ck_assert_msg(same_file(full, part),
                "stopped at step %d and resumed, the AMP run ends with other bytes", stop);
  bp_checkpoint_info info;
  ck_assert_msg(bp_checkpoint_read_info(full, &info) == BP_OK, "%s", bp_last_error());
  ck_assert_uint_eq(info.state.global_step, 12);
  ck_assert_uint_eq(info.state.optimizer_steps + info.state.skipped_steps, 12);
  ck_assert_msg(info.state.skipped_steps >= 1, "no overflow in the run: the test shows nothing");
  free(full);
  free(part);
}

START_TEST(resume_mid_epoch_is_bitwise) {
  toy_env e = env_open();
  /* growth every 2 clean steps: the counters change on both sides of the stop */
  const char *adamw[] = {"--optimizer", "adamw", "--lr", "0.002", "--ema",
                         "--loss-scale-growth-interval", "2", NULL};
  check_resume(&e, adamw, 4);
  const char *ranks[] = {"--ranks", "2", "--nesterov", "--loss-scale-growth-interval", "3", NULL};
  check_resume(&e, ranks, 8);
  toy_env_close(&e);
}
END_TEST

#define REFUSED(status_want, needle, ...)                                                   \
  do {                                                                                      \
    run_result r_ = RUN("train", __VA_ARGS__);                                              \
    expect_one_line_error(&r_, "blueprint train: ", needle);                                \
    ck_assert_msg(r_.status == (status_want), "line %d: status %d, want %d: %s", __LINE__, \
                  r_.status, status_want, r_.err);                                          \
    run_free(&r_);                                                                          \
  } while (0)

START_TEST(bad_loss_scale_options_are_refused) {
  toy_env e = env_open();
  const char *m = e.model, *d = e.data;
  REFUSED(2, "--loss-scale", m, "--data", d, "--amp", "--loss-scale", "0");
  REFUSED(2, "--loss-scale", m, "--data", d, "--amp", "--loss-scale", "-4");
  REFUSED(2, "--loss-scale", m, "--data", d, "--amp", "--loss-scale", "big");
  REFUSED(2, "--loss-scale", m, "--data", d, "--amp", "--loss-scale", "inf");
  REFUSED(2, "--loss-scale", m, "--data", d, "--amp", "--loss-scale", "1e30");
  REFUSED(2, "--loss-scale-growth-interval", m, "--data", d, "--amp",
          "--loss-scale-growth-interval", "0");
  REFUSED(2, "--loss-scale-growth-interval", m, "--data", d, "--amp",
          "--loss-scale-growth-interval", "16777217");
  REFUSED(2, "--loss-scale-growth-interval", m, "--data", d, "--amp",
          "--loss-scale-growth-interval", "1.5");
  REFUSED(2, "never grows", m, "--data", d, "--amp", "--loss-scale", "64",
          "--loss-scale-growth-interval", "10");
  REFUSED(1, "mixed precision only", m, "--data", d, "--loss-scale-growth-interval", "10");
  /* the C API's own checks */
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = d;
  o.amp = 1;
  bp_trainer *t = NULL;
  const double scales[] = {NAN, INFINITY, -1.0, 1e-30, 1e30};
  for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
    o.loss_scale = scales[k];
    ck_assert_int_eq(bp_trainer_create_from_file(m, &o, &t), BP_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "loss scale"));
  }
  o.loss_scale = 0;
  o.loss_scale_growth_interval = -1;
  ck_assert_int_eq(bp_trainer_create_from_file(m, &o, &t), BP_ERR_INVALID);
  o.loss_scale_growth_interval = (1 << 24) + 1;
  ck_assert_int_eq(bp_trainer_create_from_file(m, &o, &t), BP_ERR_INVALID);
  ck_assert_ptr_null(t);
  toy_env_close(&e);
}
END_TEST

/* mpirun -np 2 against --ranks 2, an overflow on rank 1 in both: the same
 * checkpoint bytes. Skips (with a note) without mpirun or MPI. */
START_TEST(mpirun_processes_match_threads_with_overflow) {
#ifndef BP_TEST_WITH_MPI
  printf("note: built without MPI: the mpirun comparison is skipped\n");
  return;
#else
  if (!mpirun_ready()) return;
  toy_env e = env_open();
  char *ck_threads = path_in(e.dir, "threads.ckpt"), *ck_mpi = path_in(e.dir, "mpi.ckpt");
  char exe[4096];
  snprintf(exe, sizeof exe, "%s/blueprint", getenv("BP_BINARY_DIR"));
  setenv("BP_TEST_INF_GRAD", "3:1", 1);
  const char *threads[] = {exe, "train", e.model, "--data", e.data, "--amp", "--ranks", "2",
                           "--plugin", INF_GRAD_MODULE, "--checkpoint", ck_threads, NULL};
  run_result t = run_argv(threads);
  ck_assert_msg(t.status == 0, "--ranks 2: %s", t.err);
  const char *mpi[] = {"mpirun", "--timeout", "120", "--oversubscribe", "-np", "2", exe, "train",
                       e.model, "--data", e.data, "--amp", "--plugin", INF_GRAD_MODULE,
                       "--checkpoint", ck_mpi, NULL};
  const char *old = getenv("ASAN_OPTIONS"); /* Open MPI's allocations outlive it */
  char *saved = old ? strdup(old) : NULL, asan[1024];
  snprintf(asan, sizeof asan, "%s%sdetect_leaks=0", old ? old : "", old && *old ? ":" : "");
  setenv("ASAN_OPTIONS", asan, 1);
  run_result m = run_argv(mpi);
  if (saved) setenv("ASAN_OPTIONS", saved, 1);
  else unsetenv("ASAN_OPTIONS");
  free(saved);
  unsetenv("BP_TEST_INF_GRAD");
  ck_assert_msg(m.status == 0, "mpirun -np 2: status %d\n%s\n%s", m.status, m.out, m.err);
  ck_assert_msg(same_file(ck_threads, ck_mpi),
                "mpirun -np 2 and --ranks 2 ended with different AMP checkpoints");
  bp_checkpoint_info info;
  ck_assert_msg(bp_checkpoint_read_info(ck_mpi, &info) == BP_OK, "%s", bp_last_error());
  ck_assert_uint_ge(info.state.skipped_steps, 1);
  run_free(&t);
  run_free(&m);
  free(ck_threads);
  free(ck_mpi);
  toy_env_close(&e);
#endif
}
END_TEST

int main(void) {
  setenv("BP_THREADS", "1", 0); /* threads and processes: one thread per rank in both */
  Suite *s = suite_create("amp_train");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, amp_step_nodes_in_data_flow_order);
  tcase_add_test(tc, plans_without_amp_keep_their_tensors_and_nodes);
  tcase_add_test(tc, overflow_skips_exactly_its_step);
  tcase_add_test(tc, overflow_on_one_rank_skips_on_both);
  tcase_add_test(tc, scale_grows_after_interval_clean_steps);
  tcase_add_test(tc, static_scale_stays_and_still_skips);
  tcase_add_test(tc, resume_mid_epoch_is_bitwise);
  tcase_add_test(tc, bad_loss_scale_options_are_refused);
  tcase_add_test(tc, mpirun_processes_match_threads_with_overflow);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
