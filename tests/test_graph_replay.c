/* Steps as graphs (docs/training.md): on the "guarded" test device, whose
 * fake graph capture records the host tasks and copies of a capturing
 * stream and replays them at each launch (tests/modules/guarddev.c), the
 * trainer runs one eager step per (variant, input buffer), captures the
 * next and replays it after. Here: replay trains bit for bit as eager
 * steps and as the cpu device (1 and 2 ranks, FP32 and AMP, the MLP and a
 * model with conv and batch norm, across an epoch's short last step and
 * the evaluations); a replayed step costs one graph launch, no kernel
 * call, no host task and no host synchronization (metric reads aside);
 * checkpoints move between the guarded and the cpu device both ways and
 * the run continues bit for bit; a device without the capture extension,
 * or --no-graph, runs eagerly and says so. Data: small generated sets. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "modules/state_module.h"
#include "run_util.h"
#include "trainer_compare.h"

#if !defined(BP_GUARDED_DIR) || !defined(BP_GUARDED_NOGRAPH_DIR) || !defined(BP_KERNEL_STATE_DIR)
#error "BP_GUARDED_DIR, BP_GUARDED_NOGRAPH_DIR, BP_KERNEL_STATE_DIR: the test modules"
#endif

static const char bn_model[] =
    TOY_BN_MODEL_LAYERS "train: {batch: 8, eval_batch: 8, epochs: 2, lr: 0.02}\n";

/* Discovery plus one guarded device (its own registry: both register the
 * kind "guarded"): 0 with graph capture, 1 without, 2 with capture and the
 * kernel-state test module (a relu.fwd that counts generations, fails on
 * demand). */
static bp_registry *registries[3];

static bp_registry *registry(int which) {
  if (!registries[which]) {
    const char *paths[3][2] = {{BP_GUARDED_DIR, NULL},
                               {BP_GUARDED_NOGRAPH_DIR, NULL},
                               {BP_GUARDED_DIR, BP_KERNEL_STATE_DIR}};
    ck_assert_int_eq(bp_registry_create(&registries[which]), BP_OK);
    ck_assert_msg(bp_registry_discover(registries[which], paths[which], which == 2 ? 2 : 1) ==
                      BP_OK,
                  "%s", bp_last_error());
  }
  return registries[which];
}

/* On registry 0 unless r names one. */
static bp_trainer *make(const char *model, const char *data, const run_opts *r) {
  run_opts o = *r;
  if (!o.registry) o.registry = registry(0);
  return make_trainer(model, data, &o);
}

/* ---- (a) replay equals eager ------------------------------------------------------- */

/* 20 steps (an epoch of 13 with its short last step and its evaluation,
 * then 7) on the guarded device with graphs, eagerly (--no-graph) and on
 * the cpu device: the same reports, state and checkpoint, bit for bit.
 * A cosine lr, so each step's scalars differ. Loop: 1 and 2 ranks, FP32
 * and AMP on the MLP (SGD; AdamW, whose step counter is a scalar too, in
 * loops 1 and 2); then the conv and batch norm model on 1 and 2 ranks. */
START_TEST(graph_replay_trains_bit_for_bit_as_eager_steps) {
  const int ranks = 1 + (_i & 1), amp = _i == 2 || _i == 3, bn = _i >= 4;
  const int adamw = _i == 1 || _i == 2;
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  const char *model = bn ? e.model : e.mlp;
  char *ck[3] = {path_in(e.dir, "graph.ckpt"), path_in(e.dir, "eager.ckpt"),
                 path_in(e.dir, "cpu.ckpt")};
  const run_opts opts[3] = {
      {.device = "guarded", .ranks = ranks, .amp = amp, .adamw = adamw, .stop_after = 20,
       .checkpoint = ck[0]},
      {.device = "guarded", .ranks = ranks, .amp = amp, .adamw = adamw, .no_graph = 1,
       .stop_after = 20, .checkpoint = ck[1]},
      {.device = "cpu", .ranks = ranks, .amp = amp, .adamw = adamw, .stop_after = 20,
       .checkpoint = ck[2]},
  };
  bp_trainer *t[3];
  reports r[3];
  memset(r, 0, sizeof r);
  for (int i = 0; i < 3; i++) {
    t[i] = make(model, e.data, &opts[i]);
    train_all(t[i], &r[i]);
    ck_assert_int_eq(bp_trainer_state(t[i]).global_step, 20);
  }
  ck_assert_int_eq(bp_trainer_graphs(t[0]), 1);
  ck_assert_int_eq(bp_trainer_graphs(t[1]), 0);
  ck_assert_ptr_nonnull(strstr(bp_trainer_graph_note(t[1]), "--no-graph"));
  ck_assert_int_eq(bp_trainer_graphs(t[2]), 0);
  ck_assert_str_eq(bp_trainer_graph_note(t[2]), ""); /* the cpu: nothing to say */
  for (int rank = 0; rank < ranks; rank++) { /* the graphs did run */
    ck_assert_uint_ge(bp_trainer_exec_counts(t[0], rank).graph_launches, 20 - 6);
    ck_assert_uint_eq(bp_trainer_exec_counts(t[1], rank).graph_launches, 0);
  }
  for (int i = 1; i < 3; i++) {
    same_reports(&r[0], &r[i]);
    same_state(t[0], t[i]);
    ck_assert_msg(same_file(ck[0], ck[i]), "the checkpoints differ (%d)", i);
  }
  bp_eval_report ev[3];
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(bp_trainer_evaluate(t[i], &ev[i]) == BP_OK, "%s", bp_last_error());
    if (i) ck_assert(ev[0].loss == ev[i].loss && ev[0].accuracy == ev[i].accuracy);
    bp_trainer_destroy(t[i]);
    free(ck[i]);
  }
  toy_env_close(&e);
}
END_TEST

/* ---- (b) what a replayed step costs ----------------------------------------------- */

static void assert_replayed_epoch(const bp_epoch_report *r, int64_t steps) {
  ck_assert_int_eq(r->steps, steps);
  ck_assert_uint_eq(r->exec.steps, (uint64_t)steps);
  ck_assert_uint_eq(r->exec.graph_launches, (uint64_t)steps); /* one per step */
  ck_assert_uint_eq(r->exec.kernel_calls, 0);
  ck_assert_uint_eq(r->exec.host_tasks, 0);
  ck_assert_uint_eq(r->exec.waits, (uint64_t)steps); /* for the step before the previous */
}

/* The third epoch, every slot captured in the two before: each step is one
 * launch and no synchronization; with --log-every the metric reads are
 * the only ones (a drain of each stream and one read each of loss and
 * correct count on rank 0: four). Both ranks of a 2-rank run alike. */
START_TEST(a_replayed_step_is_one_launch_and_no_host_synchronization) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *metrics = path_in(e.dir, "m.jsonl");
  for (int ranks = 1; ranks <= 2; ranks++) {
    bp_trainer *t = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = ranks,
                                                     .epochs = 3});
    reports r = {0};
    train_all(t, &r);
    ck_assert_int_eq(r.n, 3);
    assert_replayed_epoch(&r.r[2], 13);
    ck_assert_uint_eq(r.r[2].exec.syncs, 0);
    /* the first epoch: three eager warm-ups (train on buffers 0 and 1,
     * train_last), each one host task, waited for */
    ck_assert_uint_eq(r.r[0].exec.graph_launches, 13 - 3);
    ck_assert_uint_ge(r.r[0].exec.syncs, 3);
    if (ranks == 2) { /* rank 1 as rank 0 */
      const bp_exec_counts c = bp_trainer_exec_counts(t, 1), c0 = bp_trainer_exec_counts(t, 0);
      /* 39 steps less the 3 warm-ups; rank 0 also evaluates (its graphs too) */
      ck_assert_uint_eq(c.graph_launches, 39 - 3);
      ck_assert_uint_eq(c.kernel_calls, 0);
      ck_assert_uint_gt(c0.graph_launches, c.graph_launches);
    }
    bp_trainer_destroy(t);
  }
  bp_trainer *t = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 1, .epochs = 3,
                                                   .log_every = 4, .metrics = metrics});
  reports r = {0};
  train_all(t, &r);
  assert_replayed_epoch(&r.r[2], 13);
  /* global steps 27 .. 39: log points at 28, 32 and 36 */
  ck_assert_uint_eq(r.r[2].exec.syncs, 4 * 3);
  int lines = 0;
  const double launches = jsonl_number(metrics, "epoch", 2, "graph_launches_per_step", &lines);
  ck_assert_int_eq(lines, 3);
  ck_assert(launches == 1.0);
  ck_assert(jsonl_number(metrics, "epoch", 2, "kernel_calls_per_step", NULL) == 0.0);
  bp_trainer_destroy(t);
  free(metrics);
  toy_env_close(&e);
}
END_TEST

/* ---- (c) portable checkpoints ------------------------------------------------------ */

/* Stopped after 7 steps on one device, resumed on the other: the end is
 * the cpu device's uninterrupted run, bit for bit (checkpoint file and
 * state). Both ways, FP32 and AMP (loop), the model with batch norm. */
START_TEST(a_checkpoint_moves_between_the_guarded_and_the_cpu_device) {
  const int amp = _i;
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *ck_ref = path_in(e.dir, "ref.ckpt"), *ck_stop = path_in(e.dir, "stop.ckpt"),
       *ck_end = path_in(e.dir, "end.ckpt");
  reports rr = {0};
  bp_trainer *ref = make(e.model, e.data, &(run_opts){.device = "cpu", .ranks = 1, .amp = amp,
                                                       .checkpoint = ck_ref});
  train_all(ref, &rr);
  const char *devices[2][2] = {{"guarded", "cpu"}, {"cpu", "guarded"}};
  for (int way = 0; way < 2; way++) {
    reports r1 = {0}, r2 = {0};
    bp_trainer *a = make(e.model, e.data,
                         &(run_opts){.device = devices[way][0], .ranks = 1, .amp = amp,
                                     .stop_after = 7, .checkpoint = ck_stop});
    train_all(a, &r1);
    ck_assert_int_eq(bp_trainer_state(a).global_step, 7);
    bp_trainer_destroy(a);
    bp_trainer *b = make(e.model, e.data,
                         &(run_opts){.device = devices[way][1], .ranks = 1, .amp = amp,
                                     .checkpoint = ck_end, .resume = ck_stop});
    ck_assert_int_eq(bp_trainer_state(b).global_step, 7);
    train_all(b, &r2);
    same_state(ref, b);
    ck_assert(rr.r[1].test_loss == r2.r[r2.n - 1].test_loss);
    ck_assert_msg(same_file(ck_ref, ck_end), "%s -> %s: the final checkpoints differ",
                  devices[way][0], devices[way][1]);
    bp_trainer_destroy(b);
  }
  bp_trainer_destroy(ref);
  free(ck_ref);
  free(ck_stop);
  free(ck_end);
  toy_env_close(&e);
}
END_TEST

/* ---- kernels inside replayed steps ----------------------------------------------- */

static tm_state_stats *state_stats(void) {
  bp_registry *r = registry(2);
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if (strcmp(k->kernel.op, "relu.fwd") == 0 && strcmp(k->kernel.impl, "stateful") == 0)
      return k->kernel.user;
  }
  ck_abort_msg("no stateful relu.fwd");
  return NULL;
}

/* Replayed steps tell the kernels that the parameters changed exactly as
 * eager steps do (a kernel caching packed weights sees every update); a
 * kernel failing inside a replayed step stops the run with its reason, on
 * 2 ranks (the other rank's graph is not left waiting in its all-reduce). */
START_TEST(replayed_steps_keep_the_kernels_contract) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  tm_state_stats *stats = state_stats();
  int changes[2];
  bp_trainer *t[2];
  for (int graph = 0; graph < 2; graph++) {
    t[graph] = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 2,
                                                .no_graph = !graph, .registry = registry(2),
                                                .kernels = "relu.fwd=stateful"});
    ck_assert_int_eq(bp_trainer_graphs(t[graph]), graph);
    const int before = __atomic_load_n(&stats->generation_changes, __ATOMIC_RELAXED);
    bp_epoch_report r;
    ck_assert_msg(bp_trainer_train_epoch(t[graph], &r) == BP_OK, "%s", bp_last_error());
    changes[graph] = __atomic_load_n(&stats->generation_changes, __ATOMIC_RELAXED) - before;
  }
  ck_assert_int_gt(changes[0], 13);
  ck_assert_int_eq(changes[1], changes[0]);
  bp_trainer_destroy(t[0]);
  /* every slot of "train" is captured now: the next epoch's steps replay */
  stats->fail_run = BP_ABI_ERR_DEVICE;
  bp_epoch_report r;
  ck_assert_int_eq(bp_trainer_train_epoch(t[1], &r), BP_ERR_DEVICE);
  const char *msg = bp_last_error();
  ck_assert_msg(strstr(msg, "(relu.fwd/stateful) failed") && strstr(msg, "went stale"), "%s",
                msg);
  stats->fail_run = 0;
  bp_trainer_destroy(t[1]);
  toy_env_close(&e);
}
END_TEST

/* ---- (d) eager fallback ------------------------------------------------------------- */

/* A device without the capture extension runs every step eagerly, says so
 * once, and trains as the cpu device (one stream: one host task a step). */
START_TEST(a_device_without_graph_capture_runs_eagerly_and_says_so) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  reports rg = {0}, rc = {0};
  bp_trainer *g = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 2,
                                                   .registry = registry(1), .streams = 1});
  bp_trainer *c = make(e.mlp, e.data, &(run_opts){.device = "cpu", .ranks = 2});
  ck_assert_int_eq(bp_trainer_graphs(g), 0);
  ck_assert_msg(strstr(bp_trainer_graph_note(g), "offers no graph capture: steps run eagerly"),
                "%s", bp_trainer_graph_note(g));
  train_all(g, &rg);
  train_all(c, &rc);
  same_reports(&rg, &rc);
  same_state(g, c);
  ck_assert_uint_eq(rg.r[1].exec.graph_launches, 0);
  ck_assert_uint_eq(rg.r[1].exec.host_tasks, 13); /* one task per eager step */
  ck_assert_uint_ge(rg.r[1].exec.syncs, 2 * 13);  /* each waited for */
  bp_trainer_destroy(g);
  bp_trainer_destroy(c);
  toy_env_close(&e);
}
END_TEST

/* The command line: graphs by default, the note with --no-graph, the
 * counts per step after each epoch and in the metrics' epoch lines, and
 * the same results either way. */
START_TEST(blueprint_train_says_how_steps_reach_the_device) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *m[2] = {path_in(e.dir, "graph.jsonl"), path_in(e.dir, "eager.jsonl")};
  run_result r[2];
  r[0] = RUN("train", e.mlp, "--data", e.data, "--epochs", "2", "--train-limit", "100",
             "--batch", "8", "--quiet", "--metrics", m[0], "--plugin", BP_GUARDED_DIR,
             "--device", "guarded");
  r[1] = RUN("train", e.mlp, "--data", e.data, "--epochs", "2", "--train-limit", "100",
             "--batch", "8", "--quiet", "--metrics", m[1], "--plugin", BP_GUARDED_DIR,
             "--device", "guarded", "--no-graph");
  for (int i = 0; i < 2; i++) ck_assert_msg(r[i].status == 0, "%s", r[i].err);
  ck_assert_msg(strstr(r[0].out, "steps run as device graphs"), "%s", r[0].out);
  ck_assert_msg(strstr(r[0].out, "rank 0 per step: 1.00 graph launches, 0.00 kernel calls"),
                "%s", r[0].out); /* the second epoch: every step replayed */
  ck_assert_msg(strstr(r[1].out, "device 'guarded': --no-graph: steps run eagerly"), "%s",
                r[1].out);
  ck_assert(jsonl_number(m[0], "epoch", 1, "graph_launches_per_step", NULL) == 1.0);
  ck_assert(jsonl_number(m[1], "epoch", 1, "graph_launches_per_step", NULL) == 0.0);
  ck_assert(jsonl_number(m[0], "epoch", 1, "syncs_per_step", NULL) == 0.0);
  same_epoch_metrics(m[0], m[1], 1, "with graphs", "eager");
  for (int i = 0; i < 2; i++) {
    run_free(&r[i]);
    free(m[i]);
  }
  toy_env_close(&e);
}
END_TEST

/* A capture the device refuses is ended, said once per slot on stderr, and
 * that slot's steps run eagerly: the run goes on and ends as the eager one. */
START_TEST(a_failed_capture_falls_back_to_eager_steps) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *m[2] = {path_in(e.dir, "failed.jsonl"), path_in(e.dir, "eager.jsonl")};
  setenv("GUARD_CAPTURE_FAIL", "1", 1);
  run_result r0 = RUN("train", e.mlp, "--data", e.data, "--epochs", "2", "--train-limit", "100",
                      "--batch", "8", "--quiet", "--metrics", m[0], "--plugin", BP_GUARDED_DIR,
                      "--device", "guarded");
  unsetenv("GUARD_CAPTURE_FAIL");
  run_result r1 = RUN("train", e.mlp, "--data", e.data, "--epochs", "2", "--train-limit", "100",
                      "--batch", "8", "--quiet", "--metrics", m[1], "--plugin", BP_GUARDED_DIR,
                      "--device", "guarded", "--no-graph");
  ck_assert_msg(r0.status == 0, "%s", r0.err);
  ck_assert_msg(r1.status == 0, "%s", r1.err);
  ck_assert_msg(strstr(r0.err, "the step graph failed, steps of this kind run eagerly") &&
                    strstr(r0.err, "GUARD_CAPTURE_FAIL is set"),
                "%s", r0.err);
  ck_assert(jsonl_number(m[0], "epoch", 1, "graph_launches_per_step", NULL) == 0.0);
  same_epoch_metrics(m[0], m[1], 1, "after failed captures", "eager");
  run_free(&r0);
  run_free(&r1);
  for (int i = 0; i < 2; i++) free(m[i]);
  toy_env_close(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_replay");
  TCase *t = tcase_create("graphs");
  tcase_set_timeout(t, 600);
  tcase_add_loop_test(t, graph_replay_trains_bit_for_bit_as_eager_steps, 0, 6);
  tcase_add_test(t, a_replayed_step_is_one_launch_and_no_host_synchronization);
  tcase_add_loop_test(t, a_checkpoint_moves_between_the_guarded_and_the_cpu_device, 0, 2);
  tcase_add_test(t, replayed_steps_keep_the_kernels_contract);
  tcase_add_test(t, a_device_without_graph_capture_runs_eagerly_and_says_so);
  tcase_add_test(t, blueprint_train_says_how_steps_reach_the_device);
  tcase_add_test(t, a_failed_capture_falls_back_to_eager_steps);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  for (int i = 0; i < 3; i++) bp_registry_destroy(registries[i]);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
