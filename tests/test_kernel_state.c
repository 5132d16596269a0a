/* ABI 1.4 on the host side (exec.h): per-node kernel state (prepare once
 * per variant, node and rank; release as often at destroy; run sees it),
 * the parameter generation (bumped by bp_exec_params_changed, every
 * training step and a checkpoint load), the thread service, kernels'
 * failure reasons in the host's message (BP_ABI_ERR_DEVICE as
 * BP_ERR_DEVICE), and a module built against 1.3 that must keep working.
 * The kernels are those of tests/modules/state.c and minor3.c, pinned to
 * relu.fwd. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/autotune.h"
#include "blueprint/arena.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "graph_util.h"
#include "run_util.h"
#include "state_module.h"
#include "test_env.h"

static const char net[] =
    "input: {height: 2, width: 2, channels: 3, classes: 3}\n"
    "layers:\n"
    "  - {type: fc, name: f1, units: 5}\n"
    "  - {type: relu, name: r}\n"
    "  - {type: fc, name: f2, units: 3}\n"
    "  - {type: softmax_ce}\n";

/* The kernels found beside libblueprint.so plus both test modules. */
static bp_registry *open_registry(void) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_discover(r, NULL, 0) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(bp_autotune_install(r), BP_OK);
  const char *names[] = {"state.so", "minor3.so"};
  for (int i = 0; i < 2; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/kernel_state/%s", BP_TEST_MODULES, names[i]);
    ck_assert_msg(bp_registry_load(r, path) == BP_OK, "%s: %s", path, bp_last_error());
  }
  return r;
}

/* The counters of the module whose relu.fwd kernel is `impl`. */
static tm_state_stats *stats_of(const bp_registry *r, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if (strcmp(k->kernel.op, "relu.fwd") == 0 && strcmp(k->kernel.impl, impl) == 0)
      return k->kernel.user;
  }
  ck_abort_msg("no relu.fwd kernel '%s' loaded", impl);
  return NULL;
}

/* A model compiled and built once; any number of ranks bound to it. */
typedef struct rig {
  bp_model *model;
  bp_plan *plan;
  bp_graph *graph;
} rig;

static void open_rig(rig *g, const char *text, int64_t batch) {
  memset(g, 0, sizeof *g);
  graph_util_build(text, "x.yaml", batch, &g->model, &g->plan, &g->graph);
}

static void close_rig(rig *g) { graph_util_free(g->model, g->plan, g->graph); }

/* One rank: its arena and its binding. */
typedef struct rank_rig {
  bp_arena *arena;
  char *base;
  bp_exec *exec;
} rank_rig;

/* Autotune for the next bind_rank (reset by it). */
static int next_autotune;

/* Binds rank `rank` of `world` with `pins` and `threads` (NULL: the
 * executor's own), then fills parameters (seed 7) and a fixed input. */
static bp_status bind_rank(const rig *g, bp_registry *r, const char *pins, int rank, int world,
                           const bp_abi_threads *threads, rank_rig *x) {
  memset(x, 0, sizeof *x);
  ck_assert_int_eq(bp_arena_create(g->plan, bp_host_allocator(), rank, &x->arena), BP_OK);
  x->base = bp_arena_base(x->arena);
  bp_exec_options eo = {.device = "cpu",
                        .pins = pins,
                        .autotune = next_autotune,
                        .rank = rank,
                        .world = world,
                        .threads = threads};
  next_autotune = 0;
  bp_status st = bp_exec_create(g->graph, r, x->base, &eo, &x->exec);
  if (st != BP_OK) return st;
  for (int32_t id = 0; id < bp_plan_tensor_count(g->plan); id++) {
    const bp_dtensor *t = bp_plan_tensor(g->plan, 0, id);
    if (t->init.kind == BP_INIT_NONE || t->dtype != BP_DTYPE_FP32) continue;
    ck_assert_int_eq(bp_dtensor_init_fill(t, 7, (float *)(x->base + t->offset)), BP_OK);
  }
  const bp_dtensor *in = bp_plan_tensor(g->plan, 0, bp_plan_find_tensor(g->plan, "input.a"));
  float *input = (float *)(x->base + in->offset);
  for (uint64_t i = 0; i < bp_dtensor_host_elems(in); i++)
    input[i] = (float)((int)(i * 7 % 11) - 5) / 5.0f; /* both signs */
  int32_t *labels =
      (int32_t *)(x->base + bp_plan_tensor(g->plan, 0, bp_plan_find_tensor(g->plan, "label.a"))->offset);
  for (int i = 0; i < 4; i++) labels[i] = i % 3;
  return BP_OK;
}

static void close_rank(rank_rig *x) {
  bp_exec_destroy(x->exec);
  bp_arena_destroy(x->arena);
  memset(x, 0, sizeof *x);
}

/* msg holds every string of the NULL-terminated needles. */
static void expect_all(const char *msg, const char *const *needles) {
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(msg, needles[i]) != NULL, "message lacks \"%s\": %s", needles[i], msg);
}

static void run_ok(rank_rig *x, bp_segment s) {
  bp_status st = bp_exec_run(x->exec, 0, s, 0);
  ck_assert_msg(st == BP_OK, "%s: %s", bp_segment_name(s), bp_last_error());
}

/* The loss of one forward pass. */
static float loss_of(const rig *g, rank_rig *x) {
  run_ok(x, BP_SEGMENT_RESET);
  run_ok(x, BP_SEGMENT_FORWARD);
  run_ok(x, BP_SEGMENT_LOSS);
  return *(float *)(x->base + bp_plan_tensor(g->plan, 0, bp_plan_find_tensor(g->plan, "loss"))->offset);
}

/* Bound nodes of every variant whose kernel is `impl`. */
static int bound_nodes_of(const rig *g, const bp_exec *exec, const char *impl) {
  int n = 0;
  for (int v = 0; v < bp_plan_variant_count(g->plan); v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int k = 0;; k++) {
        const bp_registered_kernel *rk = bp_exec_kernel(exec, v, (bp_segment)s, k);
        if (!rk) break;
        n += strcmp(rk->kernel.impl, impl) == 0;
      }
  return n;
}

START_TEST(prepare_runs_once_per_node_and_rank_and_release_as_often) {
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  rig g;
  open_rig(&g, net, 4);
  rank_rig x[2];
  for (int k = 0; k < 2; k++)
    ck_assert_msg(bind_rank(&g, r, "relu.fwd=stateful", k, 2, NULL, &x[k]) == BP_OK, "%s",
                  bp_last_error());
  const int nodes = bound_nodes_of(&g, x[0].exec, "stateful");
  ck_assert_int_ge(nodes, 2); /* the train forward and the evaluation's */
  ck_assert_int_eq(bound_nodes_of(&g, x[1].exec, "stateful"), nodes);
  ck_assert_int_eq(s->prepares, 2 * nodes);
  ck_assert_int_eq(s->prepares_by_rank[0], nodes);
  ck_assert_int_eq(s->prepares_by_rank[1], nodes);
  ck_assert_int_eq(s->bad_prepare_args, 0);
  ck_assert_int_eq(s->releases, 0);
  for (int k = 0; k < 2; k++) loss_of(&g, &x[k]);
  ck_assert_int_eq(s->runs_by_rank[0], 1);
  ck_assert_int_eq(s->runs_by_rank[1], 1);
  ck_assert_int_eq(s->bad_run_args, 0); /* each run saw its own state and the services */
  ck_assert_int_eq(s->threads_count, 1); /* no threads given: the executor's own, 1 thread */
  close_rank(&x[0]);
  ck_assert_int_eq(s->releases, nodes);
  close_rank(&x[1]);
  ck_assert_int_eq(s->releases, 2 * nodes);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

/* The stateful kernel (relu through the host's threads) and the 1.3 one
 * give the reference's loss bit for bit. */
START_TEST(stateful_and_1_3_kernels_compute_what_the_reference_does) {
  bp_registry *r = open_registry();
  rig g;
  open_rig(&g, net, 4);
  rank_rig x;
  ck_assert_int_eq(bind_rank(&g, r, "relu.fwd=reference", 0, 1, NULL, &x), BP_OK);
  const float want = loss_of(&g, &x);
  close_rank(&x);

  bp_threads *pool = NULL;
  ck_assert_int_eq(bp_threads_create(3, &pool), BP_OK);
  ck_assert_msg(bind_rank(&g, r, "relu.fwd=stateful", 0, 1, bp_threads_abi(pool), &x) == BP_OK,
                "%s", bp_last_error());
  ck_assert_float_eq(loss_of(&g, &x), want);
  ck_assert_int_eq(stats_of(r, "stateful")->threads_count, 3);
  close_rank(&x);
  bp_threads_destroy(pool);

  /* 1.3: loads, binds without prepare (the poisoned one would abort), runs
   * on the 1.3 fields, and nothing is released at destroy */
  tm_state_stats *old = stats_of(r, "minor3");
  ck_assert_msg(bind_rank(&g, r, "relu.fwd=minor3", 0, 1, NULL, &x) == BP_OK, "%s",
                bp_last_error());
  ck_assert_int_ge(bound_nodes_of(&g, x.exec, "minor3"), 2);
  ck_assert_float_eq(loss_of(&g, &x), want);
  ck_assert_int_eq(old->runs, 1);
  ck_assert_int_eq(old->bad_run_args, 0);
  close_rank(&x);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(params_changed_moves_the_generation_run_sees) {
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  rig g;
  open_rig(&g, net, 4);
  rank_rig x;
  ck_assert_int_eq(bind_rank(&g, r, "relu.fwd=stateful", 0, 1, NULL, &x), BP_OK);
  const uint64_t g0 = bp_exec_params_generation(x.exec);
  ck_assert_uint_ne(g0, 0);
  loss_of(&g, &x);
  ck_assert_int_eq(s->generation_changes, 0); /* as prepared */
  ck_assert_uint_eq(s->last_generation, g0);
  loss_of(&g, &x);
  ck_assert_int_eq(s->generation_changes, 0);
  bp_exec_params_changed(x.exec);
  ck_assert_uint_eq(bp_exec_params_generation(x.exec), g0 + 1);
  loss_of(&g, &x);
  ck_assert_int_eq(s->generation_changes, 1);
  ck_assert_uint_eq(s->last_generation, g0 + 1);
  ck_assert_uint_eq(bp_exec_params_generation(NULL), 0);
  bp_exec_params_changed(NULL); /* a no-op */
  close_rank(&x);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(a_failing_run_names_rank_variant_node_op_impl_and_reason) {
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  rig g;
  open_rig(&g, net, 4);
  rank_rig x;
  ck_assert_int_eq(bind_rank(&g, r, "relu.fwd=stateful", 1, 2, NULL, &x), BP_OK);
  run_ok(&x, BP_SEGMENT_RESET);
  s->fail_run = BP_ABI_ERR_INVALID;
  ck_assert_int_eq(bp_exec_run(x.exec, 0, BP_SEGMENT_FORWARD, 0), BP_ERR_INVALID);
  const char *msg = bp_last_error();
  const char *needles[] = {"rank 1",       "variant 'train'",
                           "node 'r.fwd'", "(relu.fwd/stateful)",
                           "failed: the packed weights went stale at generation", NULL};
  expect_all(msg, needles);
  ck_assert_msg(strchr(msg, '\n') == NULL, "not one line: %s", msg);

  s->fail_run = BP_ABI_ERR_DEVICE;
  ck_assert_int_eq(bp_exec_run(x.exec, 0, BP_SEGMENT_FORWARD, 0), BP_ERR_DEVICE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "went stale"));
  ck_assert_str_eq(bp_status_str(BP_ERR_DEVICE), "device error");

  /* no reason written: the status, and nothing left of the last reason */
  s->fail_silent = 1;
  ck_assert_int_eq(bp_exec_run(x.exec, 0, BP_SEGMENT_FORWARD, 0), BP_ERR_DEVICE);
  msg = bp_last_error();
  ck_assert_msg(strstr(msg, "(relu.fwd/stateful) failed: device error") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "stale") == NULL, "an old reason leaked: %s", msg);

  s->fail_run = 0;
  run_ok(&x, BP_SEGMENT_FORWARD); /* the same binding runs again */
  close_rank(&x);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(a_failing_prepare_is_a_bind_error_with_its_reason) {
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  s->fail_prepare = 1;
  rig g;
  open_rig(&g, net, 4);
  rank_rig x;
  ck_assert_int_eq(bind_rank(&g, r, "relu.fwd=stateful", 0, 1, NULL, &x), BP_ERR_UNSUPPORTED);
  const char *msg = bp_last_error();
  const char *needles[] = {"bind",          "rank 0",
                           "variant '",     "node 'r.fwd'",
                           "(relu.fwd/stateful)", "cannot pack 5 channels", NULL};
  expect_all(msg, needles);
  ck_assert_ptr_null(x.exec);
  ck_assert_int_eq(s->prepares, 1); /* the first failure stops the bind */
  ck_assert_int_eq(s->releases, 0);
  close_rank(&x);

  /* a later node failing: the state made before it is released */
  s->prepares = 0;
  s->fail_prepare = 2;
  ck_assert_int_eq(bind_rank(&g, r, "relu.fwd=stateful", 0, 1, NULL, &x), BP_ERR_UNSUPPORTED);
  ck_assert_int_eq(s->prepares, 2);
  ck_assert_int_eq(s->releases, 1);
  close_rank(&x);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

/* Autotune runs the stateful kernel to time it: with a state of its own,
 * released once timed; the binding then prepares the node's own. */
START_TEST(autotune_times_a_stateful_kernel_with_a_state_of_its_own) {
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  rig g;
  open_rig(&g, net, 4);
  rank_rig x;
  next_autotune = 1;
  ck_assert_msg(bind_rank(&g, r, "", 0, 1, NULL, &x) == BP_OK, "%s", bp_last_error());
  ck_assert_int_gt(s->runs, 0); /* it was timed */
  ck_assert_int_eq(s->bad_run_args, 0);
  ck_assert_int_eq(s->bad_prepare_args, 0);
  const int bound = bound_nodes_of(&g, x.exec, "stateful");
  ck_assert_int_eq(s->prepares - s->releases, bound); /* only the bound nodes' states remain */
  close_rank(&x);
  ck_assert_int_eq(s->releases, s->prepares);
  close_rig(&g);
  bp_registry_destroy(r);
}
END_TEST

/* Counts of the eval node's "repacks" over trainer calls: a step, an
 * evaluation with nothing changed, a checkpoint load. Two ranks as threads,
 * each with its own threads and states. */
START_TEST(trainer_bumps_the_generation_per_step_and_load) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS
                           "train: {batch: 8, eval_batch: 10, epochs: 1, lr: 0.02}\n",
                           32, 20, 3);
  bp_registry *r = open_registry();
  tm_state_stats *s = stats_of(r, "stateful");
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = e.data;
  o.registry = r;
  o.kernels = "relu.fwd=stateful";
  o.trust_pins = 1; /* the pin only picks the kernel; its check's prepare() would count here */
  o.ranks = 2;
  o.seed = 5;
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(e.model, &o, &t) == BP_OK, "%s", bp_last_error());
  ck_assert_int_gt(s->prepares_by_rank[0], 0);
  ck_assert_int_eq(s->prepares_by_rank[1], s->prepares_by_rank[0]);
  bp_epoch_report rep;
  ck_assert_msg(bp_trainer_train_epoch(t, &rep) == BP_OK, "%s", bp_last_error());
  const int steps = (int)bp_trainer_state(t).global_step;
  ck_assert_int_eq(steps, 4);
  ck_assert_int_eq(s->bad_run_args, 0);
  ck_assert_int_gt(s->threads_count, 0);
  /* every step's forward on each rank found the generation moved since its
   * last run (initialization, then each step's update) */
  ck_assert_int_ge(s->generation_changes, 2 * steps);

  bp_eval_report ev;
  ck_assert_msg(bp_trainer_evaluate(t, &ev) == BP_OK, "%s", bp_last_error());
  const int after_eval = s->generation_changes;
  ck_assert_msg(bp_trainer_evaluate(t, &ev) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(s->generation_changes, after_eval); /* nothing changed the parameters */

  char *ckpt = path_in(e.dir, "s.ckpt");
  ck_assert_msg(bp_trainer_save(t, ckpt) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(s->generation_changes, after_eval); /* saving changes nothing */
  ck_assert_msg(bp_trainer_load(t, ckpt) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(bp_trainer_evaluate(t, &ev) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(s->generation_changes, after_eval + 1); /* the eval node, on rank 0 */
  free(ckpt);

  const int prepares = s->prepares;
  bp_trainer_destroy(t);
  ck_assert_int_eq(s->releases, prepares);
  bp_registry_destroy(r);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *su = suite_create("kernel_state");
  TCase *tc = tcase_create("abi14");
  tcase_add_test(tc, prepare_runs_once_per_node_and_rank_and_release_as_often);
  tcase_add_test(tc, stateful_and_1_3_kernels_compute_what_the_reference_does);
  tcase_add_test(tc, params_changed_moves_the_generation_run_sees);
  tcase_add_test(tc, a_failing_run_names_rank_variant_node_op_impl_and_reason);
  tcase_add_test(tc, a_failing_prepare_is_a_bind_error_with_its_reason);
  tcase_add_test(tc, autotune_times_a_stateful_kernel_with_a_state_of_its_own);
  tcase_add_test(tc, trainer_bumps_the_generation_per_step_and_load);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
