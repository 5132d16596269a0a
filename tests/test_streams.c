/* Streams (docs/training.md, "Streams"): a device rank's step spread over
 * three compute streams and an update stream, ordered by events derived
 * from the plan's byte ranges. On the "guarded" test device with its
 * adversary (GUARD_SCHEDULE, tests/modules/guarddev.c: each device runs
 * the tasks the host enqueued in an order of its choosing, only keeping
 * each stream's order and its waits), so that a missing edge shows in the
 * bits. Here: multi-stream graphs and eager steps train bit for bit as one
 * stream and as the cpu device (MLP 1 and 2 ranks, AMP, AdamW, the model
 * with conv and batch norm on 1 and 2 ranks, the CNN with its liveness-
 * packed feature slots); leaving out any one derived wait is caught; the
 * counters per step are exact; the overlap of the collectives with
 * backward is measured; the fake capture refuses an unjoined stream
 * as CUDA does and replays the streams it was captured with. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "bp_abi_device.h"
#include "exec-test.h"
#include "modules/guarddev.h"
#include "run_util.h"
#include "trainer_compare.h"

#ifndef BP_GUARDED_DIR
#error "BP_GUARDED_DIR: the guarded test device"
#endif

static const char bn_model[] =
    TOY_BN_MODEL_LAYERS "train: {batch: 8, eval_batch: 8, epochs: 2, lr: 0.02}\n";

static bp_registry *reg;

static bp_registry *registry(void) {
  if (!reg) {
    const char *paths[1] = {BP_GUARDED_DIR};
    ck_assert_int_eq(bp_registry_create(&reg), BP_OK);
    ck_assert_msg(bp_registry_discover(reg, paths, 1) == BP_OK, "%s", bp_last_error());
  }
  return reg;
}

/* On the guarded device's registry. */
static bp_trainer *make(const char *model, const char *data, const run_opts *r) {
  run_opts o = *r;
  o.registry = registry();
  return make_trainer(model, data, &o);
}

/* The trainer's streams are made at create: the adversary is chosen then. */
static bp_trainer *make_scheduled(const char *schedule, const char *model, const char *data,
                                  const run_opts *r) {
  if (schedule)
    setenv("GUARD_SCHEDULE", schedule, 1);
  else
    unsetenv("GUARD_SCHEDULE");
  bp_trainer *t = make(model, data, r);
  unsetenv("GUARD_SCHEDULE");
  return t;
}

/* The shipped models/cnn.yaml beside models/mlp.yaml. */
static char *cnn_path(const toy_env *e) {
  char *p = malloc(strlen(e->mlp) + 8);
  ck_assert_ptr_nonnull(p);
  strcpy(p, e->mlp);
  char *slash = strrchr(p, '/');
  strcpy(slash ? slash + 1 : p, "cnn.yaml");
  return p;
}

/* ---- (a) bit for bit ------------------------------------------------------------------ */

typedef struct scase {
  const char *what;
  int model; /* 0: MLP, 1: conv + batch norm, 2: the CNN */
  int ranks, amp, adamw;
} scase;

static const scase cases[] = {
    {"MLP, 1 rank", 0, 1, 0, 0},           {"MLP, 2 ranks", 0, 2, 0, 0},
    {"MLP, AMP", 0, 1, 1, 0},              {"MLP, AdamW, AMP, 2 ranks", 0, 2, 1, 1},
    {"conv + BN, 1 rank", 1, 1, 0, 0},     {"conv + BN, 2 ranks", 1, 2, 0, 0},
    {"conv + BN, AMP, 2 ranks", 1, 2, 1, 0}, {"CNN (liveness-packed slots)", 2, 1, 0, 1},
};

/* 20 steps (an epoch of 13, its evaluation, 7 more) four ways: step graphs
 * with three streams under the "latest" adversary, eager steps with three
 * streams under a seeded one, one stream, and the cpu device: the same
 * reports, state and checkpoint, bit for bit. */
START_TEST(multi_stream_steps_train_bit_for_bit_as_one_stream_and_the_cpu) {
  const scase *c = &cases[_i];
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *cnn = cnn_path(&e);
  const char *model = c->model == 0 ? e.mlp : c->model == 1 ? e.model : cnn;
  char *ck[4] = {path_in(e.dir, "graph.ckpt"), path_in(e.dir, "eager.ckpt"),
                 path_in(e.dir, "one.ckpt"), path_in(e.dir, "cpu.ckpt")};
  const char *schedule[4] = {"latest", "7", NULL, NULL};
  const run_opts opts[4] = {
      {.device = "guarded", .ranks = c->ranks, .amp = c->amp, .adamw = c->adamw, .streams = 3,
       .stop_after = 20, .checkpoint = ck[0]},
      {.device = "guarded", .ranks = c->ranks, .amp = c->amp, .adamw = c->adamw, .streams = 3,
       .no_graph = 1, .stop_after = 20, .checkpoint = ck[1]},
      {.device = "guarded", .ranks = c->ranks, .amp = c->amp, .adamw = c->adamw, .streams = 1,
       .stop_after = 20, .checkpoint = ck[2]},
      {.device = "cpu", .ranks = c->ranks, .amp = c->amp, .adamw = c->adamw, .stop_after = 20,
       .checkpoint = ck[3]},
  };
  bp_trainer *t[4];
  reports r[4];
  memset(r, 0, sizeof r);
  for (int i = 0; i < 4; i++) {
    t[i] = make_scheduled(schedule[i], model, e.data, &opts[i]);
    train_all(t[i], &r[i]);
    ck_assert_int_eq(bp_trainer_state(t[i]).global_step, 20);
  }
  ck_assert_int_eq(bp_trainer_graphs(t[0]), 1);
  for (int rank = 0; rank < c->ranks; rank++) {
    ck_assert_uint_gt(bp_trainer_exec_counts(t[0], rank).graph_launches, 0);
    ck_assert_uint_gt(bp_trainer_exec_counts(t[1], rank).events, 0); /* streams did run */
    ck_assert_uint_eq(bp_trainer_exec_counts(t[2], rank).events, 0);
  }
  for (int i = 1; i < 4; i++) {
    ck_assert_msg(r[0].n == r[i].n, "%s: run %d", c->what, i);
    same_reports(&r[0], &r[i]);
    same_state(t[0], t[i]);
    ck_assert_msg(same_file(ck[0], ck[i]), "%s: the checkpoints differ (%d)", c->what, i);
  }
  for (int i = 0; i < 4; i++) {
    bp_trainer_destroy(t[i]);
    free(ck[i]);
  }
  free(cnn);
  toy_env_close(&e);
}
END_TEST

/* ---- (b) a missing edge is caught ---------------------------------------------------- */

/* The conv + batch norm model on 1 rank derives four waits per training
 * step (docs/training.md). Leaving out any one of them (bp_exec_test_drop_wait,
 * exec-test.h) under the "latest" adversary changes the bits of the training
 * loss, eagerly and replayed; with all of them the run equals the cpu's. */
START_TEST(leaving_out_any_derived_wait_changes_the_bits) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  reports ref = {0};
  bp_trainer *cpu = make(e.model, e.data, &(run_opts){.device = "cpu", .ranks = 1, .epochs = 1});
  train_all(cpu, &ref);
  bp_trainer_destroy(cpu);
  for (int drop = -1; drop < 4; drop++) {
    bp_exec_test_drop_wait(drop);
    for (int graph = 0; graph < 2; graph++) {
      reports r = {0};
      bp_trainer *t = make_scheduled("latest", e.model, e.data,
                                     &(run_opts){.device = "guarded", .ranks = 1, .epochs = 1,
                                                 .streams = 3, .no_graph = !graph});
      train_all(t, &r);
      ck_assert_int_eq(bp_trainer_graphs(t), graph);
      if (drop < 0)
        same_reports(&ref, &r);
      else
        ck_assert_msg(r.r[0].train_loss != ref.r[0].train_loss,
                      "wait %d left out (%s): the loss is still %.9g", drop,
                      graph ? "graph" : "eager", r.r[0].train_loss);
      bp_trainer_destroy(t);
    }
  }
  bp_exec_test_drop_wait(-1);
  toy_env_close(&e);
}
END_TEST

/* ---- (c) counters ---------------------------------------------------------------------- */

static guard_stats stats_now(void) {
  const bp_abi_device *d = bp_registry_find_device(registry(), "guarded");
  ck_assert_ptr_nonnull(d);
  const bp_abi_ext_header *e = d->extensions;
  while (e && e->type != GUARD_EXT_TYPE) e = e->next;
  ck_assert_ptr_nonnull(e);
  guard_stats s;
  ((const guard_ext *)(const void *)e)->read_stats(&s);
  return s;
}

/* The MLP's training step on 1 rank, eagerly: 8 chunks (one host task
 * each) and 17 events: the fork (a mark on stream 0, the weight-gradient
 * and update streams wait on it: 3), five waits and five marks of derived
 * edges, the join (a mark on each side stream, stream 0 waits: 4). One
 * stream: one host task, no event. Replayed (third epoch): one launch, no
 * host task, no event, no synchronization; every capture legal (joined). */
START_TEST(counters_per_step_are_exact) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  const int streams[2] = {3, 1};
  const uint64_t tasks[2] = {8, 1}, events[2] = {17, 0};
  for (int i = 0; i < 2; i++) {
    bp_trainer *t = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 1,
                                                     .epochs = 1, .no_graph = 1,
                                                     .streams = streams[i]});
    reports r = {0};
    train_all(t, &r);
    ck_assert_uint_eq(r.r[0].exec.steps, 13);
    ck_assert_uint_eq(r.r[0].exec.host_tasks, 13 * tasks[i]);
    ck_assert_uint_eq(r.r[0].exec.events, 13 * events[i]);
    ck_assert_uint_eq(r.r[0].exec.graph_launches, 0);
    bp_trainer_destroy(t);
  }
  const guard_stats before = stats_now();
  bp_trainer *t = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 1, .epochs = 3,
                                                   .streams = 3});
  reports r = {0};
  train_all(t, &r);
  const guard_stats after = stats_now();
  ck_assert_uint_eq(after.capture_errors, before.capture_errors);
  ck_assert_uint_ge(after.captures - before.captures, 3); /* train 0 and 1, train_last */
  const bp_exec_counts c = r.r[2].exec;
  ck_assert_uint_eq(c.steps, 13);
  ck_assert_uint_eq(c.graph_launches, 13);
  ck_assert_uint_eq(c.host_tasks, 0);
  ck_assert_uint_eq(c.events, 0);
  ck_assert_uint_eq(c.kernel_calls, 0);
  ck_assert_uint_eq(c.syncs, 0);
  ck_assert_uint_eq(c.waits, 13);
  bp_trainer_destroy(t);
  toy_env_close(&e);
}
END_TEST

/* Eager training steps with collectives (MLP, 2 ranks) measure the time
 * the update stream spends in them and the part inside backward: present
 * and sane (0 <= overlap <= comm), in the report and the metrics' epoch
 * line; nothing with one stream or when steps replay as graphs. */
START_TEST(the_overlap_of_collectives_with_backward_is_measured) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  char *m = path_in(e.dir, "m.jsonl");
  for (int i = 0; i < 3; i++) {
    bp_trainer *t = make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 2,
                                                     .epochs = 1, .no_graph = i != 2,
                                                     .streams = i == 1 ? 1 : 3,
                                                     .metrics = i == 0 ? m : NULL});
    reports r = {0};
    train_all(t, &r);
    const bp_exec_counts c = r.r[0].exec;
    if (i == 0) {
      ck_assert_uint_gt(c.comm_us, 0);
      ck_assert_uint_le(c.comm_overlap_us, c.comm_us);
      const double comm = jsonl_number(m, "epoch", 0, "comm_ms_per_step", NULL);
      const double overlap = jsonl_number(m, "epoch", 0, "comm_overlap_ms_per_step", NULL);
      ck_assert_msg(comm > 0 && overlap >= 0 && overlap <= comm, "comm %g, overlap %g", comm,
                    overlap);
    } else if (i == 1) {
      ck_assert_uint_eq(c.comm_us, 0);
    } else {
      ck_assert_uint_eq(bp_trainer_graphs(t), 1);
      ck_assert_uint_lt(c.comm_us, 1000000); /* only the three eager warm-ups are timed */
    }
    bp_trainer_destroy(t);
  }
  free(m);
  toy_env_close(&e);
}
END_TEST

/* ---- (d) the fake capture keeps CUDA's rules --------------------------------------------- */

static void add_one(void *arg) { (*(int *)arg)++; }

/* A stream that joined a capture (it waited on an event recorded in it)
 * and was not joined back fails capture_end, as CUDA does; joined back,
 * the graph replays the work of both streams at each launch. */
START_TEST(the_fake_capture_wants_every_forked_stream_joined_back) {
  const bp_abi_device *d = bp_registry_find_device(registry(), "guarded");
  ck_assert_ptr_nonnull(d);
  const bp_abi_ext_header *h = d->extensions;
  while (h && h->type != BP_ABI_EXT_GRAPH_CAPTURE) h = h->next;
  ck_assert_ptr_nonnull(h);
  const bp_abi_device_graph_ext *g = (const bp_abi_device_graph_ext *)(const void *)h;
  bp_abi_stream *s0, *s1;
  bp_abi_event *fork, *join;
  ck_assert_int_eq(d->stream_create(0, BP_ABI_STREAM_COMPUTE, &s0), BP_ABI_OK);
  ck_assert_int_eq(d->stream_create(0, BP_ABI_STREAM_COMPUTE, &s1), BP_ABI_OK);
  ck_assert_int_eq(d->event_create(0, &fork), BP_ABI_OK);
  ck_assert_int_eq(d->event_create(0, &join), BP_ABI_OK);
  static int ran[2];
  for (int joined = 0; joined < 2; joined++) {
    void *graph = NULL;
    ck_assert_int_eq(g->capture_begin(s0), BP_ABI_OK);
    ck_assert_int_eq(d->event_record(fork, s0), BP_ABI_OK);
    ck_assert_int_eq(d->stream_wait_event(s1, fork), BP_ABI_OK);
    ck_assert_int_eq(d->stream_enqueue_host(s1, add_one, &ran[1]), BP_ABI_OK);
    ck_assert_int_eq(d->stream_enqueue_host(s0, add_one, &ran[0]), BP_ABI_OK);
    if (joined) {
      ck_assert_int_eq(d->event_record(join, s1), BP_ABI_OK);
      ck_assert_int_eq(d->stream_wait_event(s0, join), BP_ABI_OK);
    }
    const int rc = g->capture_end(s0, &graph);
    if (!joined) {
      ck_assert_int_ne(rc, BP_ABI_OK);
      ck_assert_msg(strstr(d->last_error(), "not joined back"), "%s", d->last_error());
      continue;
    }
    ck_assert_msg(rc == BP_ABI_OK, "%s", d->last_error());
    void *exec = NULL;
    ck_assert_int_eq(g->instantiate(graph, &exec), BP_ABI_OK);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(g->launch(exec, s0), BP_ABI_OK);
    ck_assert_int_eq(d->stream_synchronize(s0), BP_ABI_OK);
    ck_assert_int_eq(ran[0], 3); /* nothing ran while capturing */
    ck_assert_int_eq(ran[1], 3);
    g->exec_destroy(exec);
    g->graph_destroy(graph);
  }
  ck_assert_int_eq(d->stream_synchronize(s1), BP_ABI_OK);
  d->event_destroy(fork);
  d->event_destroy(join);
  d->stream_destroy(s0);
  d->stream_destroy(s1);
}
END_TEST

/* --streams: in range on the command line, and 1 prints no events. */
START_TEST(blueprint_train_takes_streams) {
  toy_env e = toy_env_open(bn_model, 100, 30, 11);
  run_result bad = RUN("train", e.mlp, "--data", e.data, "--streams", "4", "--plugin",
                       BP_GUARDED_DIR, "--device", "guarded");
  ck_assert_int_ne(bad.status, 0);
  ck_assert_msg(strstr(bad.err, "--streams 4: must be in [1, 3]"), "%s", bad.err);
  run_free(&bad);
  run_result r = RUN("train", e.mlp, "--data", e.data, "--epochs", "1", "--train-limit", "100",
                     "--batch", "8", "--no-graph", "--streams", "1", "--plugin", BP_GUARDED_DIR,
                     "--device", "guarded");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "1.00 host tasks, 3.00 syncs, 0.00 waits, 0.00 events"), "%s",
                r.out);
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* Under ThreadSanitizer (ci/test.sh thread) the bit-for-bit loop runs its
 * 2-rank MLP and conv + BN cases only: the others add time, not threads. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

static Suite *suite(void) {
  Suite *s = suite_create("streams");
  TCase *t = tcase_create("streams");
  tcase_set_timeout(t, 900);
#ifdef UNDER_TSAN
  tcase_add_loop_test(t, multi_stream_steps_train_bit_for_bit_as_one_stream_and_the_cpu, 1, 2);
  tcase_add_loop_test(t, multi_stream_steps_train_bit_for_bit_as_one_stream_and_the_cpu, 5, 6);
#else
  tcase_add_loop_test(t, multi_stream_steps_train_bit_for_bit_as_one_stream_and_the_cpu, 0,
                      (int)(sizeof cases / sizeof cases[0]));
#endif
  tcase_add_test(t, leaving_out_any_derived_wait_changes_the_bits);
  tcase_add_test(t, counters_per_step_are_exact);
  tcase_add_test(t, the_overlap_of_collectives_with_backward_is_measured);
  tcase_add_test(t, the_fake_capture_wants_every_forked_stream_joined_back);
  tcase_add_test(t, blueprint_train_takes_streams);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  bp_registry_destroy(reg);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
