/* The device seam: the trainer reaches arena memory only through the device
 * plugin. Proven on the "guarded" test device (tests/modules/guarddev.c),
 * whose arenas are PROT_NONE outside the plugin's own copies and stream
 * tasks and which runs the cpu kernels: a host load or store of an arena
 * anywhere else is a SIGSEGV. On it, training (the MLP, the CNN, a model
 * with batch norm), evaluation, checkpoint, resume and read-tensor work and
 * match the cpu device bit for bit, on 1 rank and on 2; the batches travel
 * through pinned staging and the transfer stream, and the compute stream
 * waits for them on events. Ranks on it reach each other through the
 * device's own collective transport (ABI 1.6), which the trainer chooses
 * by its flags; a transport that fails to open fails the run with its
 * reason; a 1.5 build of the device (no transports) still loads, and its
 * ranks use the host's threads communicator where the host reaches its
 * memory, or are refused with one line where it does not. Data: small
 * generated MNIST-format sets. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "modules/guarddev.h"
#include "modules/state_module.h"
#include "run_util.h"
#include "trainer_compare.h"
#include "test_env.h"

#ifndef BP_GUARDED_DIR
#error "BP_GUARDED_DIR: the directory of the guarded test device"
#endif

static bp_registry *registry; /* discovery plus the guarded device, shared by every trainer */

static void registry_open(void) {
  if (registry) return;
  const char *paths[] = {BP_GUARDED_DIR};
  ck_assert_int_eq(bp_registry_create(&registry), BP_OK);
  ck_assert_msg(bp_registry_discover(registry, paths, 1) == BP_OK, "%s", bp_last_error());
  ck_assert_ptr_nonnull(bp_registry_find_device(registry, "guarded"));
}

static const bp_abi_device *guarded(void) {
  registry_open();
  return bp_registry_find_device(registry, "guarded");
}

static const guard_ext *ext_of(const bp_abi_device *d) {
  const bp_abi_ext_header *e = d->extensions;
  while (e && e->type != GUARD_EXT_TYPE) e = e->next;
  ck_assert_ptr_nonnull(e);
  return (const guard_ext *)(const void *)e;
}

static guard_stats stats_of(const bp_abi_device *d) {
  guard_stats s;
  ext_of(d)->read_stats(&s);
  return s;
}

static guard_stats stats_now(void) { return stats_of(guarded()); }

/* ---- the guard itself ------------------------------------------------------------ */

static void touch(void *arg) { *(volatile float *)arg = 2.0f; }

/* Inside a stream task the arena is reachable; afterwards the copy back
 * shows the task's store. */
START_TEST(a_stream_task_reaches_the_arena_and_a_copy_reads_it) {
  const bp_abi_device *d = guarded();
  void *arena = NULL;
  bp_abi_stream *s = NULL;
  ck_assert_int_eq(d->arena_alloc(1, 4096, 256, &arena), BP_ABI_OK);
  ck_assert_int_eq(d->stream_create(1, BP_ABI_STREAM_COMPUTE, &s), BP_ABI_OK);
  ck_assert_int_eq(d->stream_enqueue_host(s, touch, arena), BP_ABI_OK);
  float back = 0;
  ck_assert_int_eq(d->copy_d2h(&back, arena, sizeof back, s), BP_ABI_OK);
  ck_assert_int_eq(d->stream_synchronize(s), BP_ABI_OK);
  ck_assert(back == 2.0f);
  d->stream_destroy(s);
  d->arena_free(1, arena, 4096);
}
END_TEST

/* Runs fn in a child process and asserts that it died of a memory fault:
 * SIGSEGV, or under a sanitizer, which turns the fault into its report,
 * SIGABRT (abort_on_error) or exit status 66 (ThreadSanitizer's). A child
 * that returns exits 0, and fails the test. */
static void expect_fault(void (*fn)(void), const char *what) {
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  const int faulted = (WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV ||
                                               WTERMSIG(status) == SIGABRT)) ||
                      (WIFEXITED(status) && WEXITSTATUS(status) == 66);
  ck_assert_msg(faulted, "%s: no fault (status %#x)", what, (unsigned)status);
}

static void store_outside(void) {
  const bp_abi_device *d = guarded();
  void *arena = NULL;
  if (d->arena_alloc(0, 4096, 256, &arena) != BP_ABI_OK) _exit(3);
  touch(arena);
}

/* Outside the plugin's work a host store is a fault: the test can fail. */
START_TEST(a_host_store_into_the_arena_faults) { expect_fault(store_outside, "a host store"); }
END_TEST

/* The same device claiming host access: the trainer then fills the arena
 * with its own stores, and the first one faults. The guard catches what
 * the seam must avoid. */
static toy_env host_env;

static void create_on_lying_device(void) {
  const char *paths[] = {BP_GUARDED_HOST_DIR};
  bp_registry *r = NULL;
  if (bp_registry_create(&r) != BP_OK || bp_registry_discover(r, paths, 1) != BP_OK) _exit(3);
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.registry = r;
  o.device = "guarded";
  o.data_dir = host_env.data;
  bp_trainer *t = NULL;
  bp_trainer_create_from_file(host_env.model, &o, &t);
  fprintf(stderr, "created: %s\n", bp_last_error());
}

START_TEST(the_host_path_on_a_guarded_arena_faults) {
  host_env = toy_env_open(TOY_BN_MODEL_LAYERS "train: {batch: 8, eval_batch: 8, epochs: 1}\n",
                          16, 8, 1);
  expect_fault(create_on_lying_device, "the trainer's host path");
  toy_env_close(&host_env);
}
END_TEST

/* ---- training --------------------------------------------------------------------- */

static const char bn_model[] =
    TOY_BN_MODEL_LAYERS "train: {batch: 24, eval_batch: 20, epochs: 2, lr: 0.02}\n";

/* Every trainer here: the guarded device's registry, evaluation batches of
 * 20, seed 3, a constant learning rate. Runs whose copies and tasks a test
 * counts take no_graph: eager steps (test_graph_replay counts graphs). */
static bp_trainer *make(const char *model, const char *data, const run_opts *r) {
  registry_open();
  run_opts o = *r;
  o.registry = registry;
  o.eval_batch = 20;
  o.seed = 3;
  o.constant_lr = 1;
  return make_trainer(model, data, &o);
}

/* Every epoch here ends with its evaluation: the test figures are numbers. */
static void same_evaluated_reports(const reports *a, const reports *b) {
  same_reports(a, b);
  for (int i = 0; i < a->n; i++)
    ck_assert(!isnan(a->r[i].test_loss) && !isnan(a->r[i].test_accuracy));
}

/* `model` trained on cpu and on guarded with `ranks` ranks: the same
 * reports, the same state, the same evaluation, the same checkpoint file. */
static void check_model(const char *model, int ranks, int64_t batch) {
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  char *ck_cpu = path_in(e.dir, "cpu.ckpt"), *ck_dev = path_in(e.dir, "guarded.ckpt");
  const char *m = model ? model : e.model;
  if (strcmp(m, "mlp") == 0) m = e.mlp;
  const guard_stats before = stats_now();
  reports rc = {0}, rg = {0};
  bp_trainer *c = make(m, e.data, &(run_opts){.device = "cpu", .ranks = ranks, .batch = batch,
                                              .checkpoint = ck_cpu});
  bp_trainer *g = make(m, e.data, &(run_opts){.device = "guarded", .ranks = ranks, .batch = batch,
                                              .checkpoint = ck_dev, .no_graph = 1});
  train_all(c, &rc);
  train_all(g, &rg);
  ck_assert_int_eq(rc.n, 2);
  same_evaluated_reports(&rc, &rg);
  same_state(c, g);
  bp_eval_report ec, eg;
  ck_assert_int_eq(bp_trainer_evaluate(c, &ec), BP_OK);
  ck_assert_msg(bp_trainer_evaluate(g, &eg) == BP_OK, "%s", bp_last_error());
  ck_assert(ec.loss == eg.loss && ec.accuracy == eg.accuracy && ec.samples == eg.samples);
  ck_assert_msg(same_file(ck_cpu, ck_dev), "the checkpoints differ");
  /* the batches went through the transfer stream and compute waited on them */
  const guard_stats after = stats_now();
  const uint64_t steps = (uint64_t)bp_trainer_state(g).global_step;
  ck_assert_uint_ge(after.h2d_transfer - before.h2d_transfer, 2 * steps * (uint64_t)ranks);
  ck_assert_uint_ge(after.compute_waits_on_transfer - before.compute_waits_on_transfer,
                    steps * (uint64_t)ranks);
  ck_assert_uint_ge(after.compute_host_tasks - before.compute_host_tasks, steps * (uint64_t)ranks);
  ck_assert_uint_eq(after.h2d_other, before.h2d_other); /* every upload on a transfer stream */
  /* ranks: the device's own transport made the communicator, once */
  ck_assert_uint_eq(after.comm_opens - before.comm_opens, ranks > 1 ? 1 : 0);
  if (ranks > 1) ck_assert_str_eq(bp_trainer_transport(g), "threads");
  bp_trainer_destroy(c);
  bp_trainer_destroy(g);
  ck_assert_uint_eq(stats_now().arenas, before.arenas); /* every arena freed */
  ck_assert_uint_eq(stats_now().comm_closes - before.comm_closes, ranks > 1 ? 1 : 0);
  free(ck_cpu);
  free(ck_dev);
  toy_env_close(&e);
}

START_TEST(the_mlp_trains_on_the_guarded_device_as_on_cpu) { check_model("mlp", 1, 16); }
END_TEST

START_TEST(batch_norm_trains_on_the_guarded_device_as_on_cpu) { check_model(NULL, 1, 24); }
END_TEST

START_TEST(two_ranks_train_on_the_guarded_device_as_on_cpu) {
  check_model(NULL, 2, 24);
  check_model("mlp", 2, 16);
}
END_TEST

START_TEST(the_cnn_trains_on_the_guarded_device_as_on_cpu) {
  char *cnn = NULL;
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_ptr_nonnull(src);
  cnn = malloc(strlen(src) + 32);
  sprintf(cnn, "%s/models/cnn.yaml", src);
  check_model(cnn, 1, 16);
  free(cnn);
}
END_TEST

/* Write-tensor and read-tensor round trip through the device, on every
 * rank, and the written weights take part in the next evaluation as on cpu. */
START_TEST(a_written_tensor_reads_back_and_counts_as_on_cpu) {
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  bp_trainer *t[2];
  bp_eval_report r[2];
  const char *dev[2] = {"cpu", "guarded"};
  for (int i = 0; i < 2; i++) {
    t[i] = make(e.model, e.data, &(run_opts){.device = dev[i], .ranks = 2, .batch = 24});
    const bp_plan *p = bp_trainer_plan(t[i]);
    const bp_dtensor *d = bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "fc.w"));
    ck_assert_ptr_nonnull(d);
    const uint64_t n = bp_dtensor_host_elems(d);
    float *w = malloc((size_t)n * sizeof *w), *back = malloc((size_t)n * sizeof *back);
    ck_assert(w && back);
    for (uint64_t k = 0; k < n; k++) w[k] = (float)((k * 37) % 101) / 1000.0f - 0.05f;
    ck_assert_msg(bp_trainer_write_tensor(t[i], "fc.w", w, n) == BP_OK, "%s", bp_last_error());
    for (int rank = 0; rank < 2; rank++) {
      ck_assert_int_eq(bp_trainer_read_rank_tensor(t[i], rank, "fc.w", back, n), BP_OK);
      ck_assert(memcmp(w, back, (size_t)n * sizeof *w) == 0);
    }
    ck_assert_int_eq(bp_trainer_write_tensor(t[i], "fc.w", w, n - 1), BP_ERR_INVALID);
    ck_assert_msg(bp_trainer_evaluate(t[i], &r[i]) == BP_OK, "%s", bp_last_error());
    free(w);
    free(back);
  }
  ck_assert(r[0].loss == r[1].loss && r[0].accuracy == r[1].accuracy);
  bp_trainer_destroy(t[0]);
  bp_trainer_destroy(t[1]);
  toy_env_close(&e);
}
END_TEST

/* Double buffering: while step k runs, batch k+1 is taken from the loader
 * (which filled its pinned staging meanwhile) and copied into the idle
 * input buffer on the transfer stream, while the step is in flight on the
 * compute stream. Every compute task sleeps 50 ms first
 * (GUARD_COMPUTE_DELAY_MS), so that a slow machine cannot finish a step
 * before the host has taken the next batch. */
START_TEST(the_next_batch_is_uploaded_while_the_step_runs) {
  setenv("GUARD_COMPUTE_DELAY_MS", "50", 1); /* this test's process only */
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  const guard_stats before = stats_now();
  reports r = {0};
  bp_trainer *g =
      make(e.mlp, e.data, &(run_opts){.device = "guarded", .ranks = 1, .batch = 16, .no_graph = 1});
  train_all(g, &r);
  const guard_stats after = stats_now();
  const uint64_t steps = (uint64_t)bp_trainer_state(g).global_step;
  const uint64_t overlapped = after.uploads_during_compute - before.uploads_during_compute;
  printf("%llu input copies ran while the step before them ran, over %llu training steps\n",
         (unsigned long long)overlapped, (unsigned long long)steps);
  /* two copies (images, labels) a batch, and every step but each epoch's
   * last has a next batch (an evaluation's batches too); uploads ordered
   * after the steps would make 0 */
  ck_assert_uint_ge(overlapped, 2 * (steps - 2));
  bp_trainer_destroy(g);
  toy_env_close(&e);
}
END_TEST

/* Stopped after 3 steps, checkpointed and resumed on the guarded device
 * (1 rank, then 2): the end state is the cpu device's uninterrupted run's. */
START_TEST(a_resumed_run_on_the_guarded_device_ends_as_on_cpu) {
  const int ranks = _i + 1;
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  char *ck = path_in(e.dir, "stop.ckpt"), *ck_cpu = path_in(e.dir, "cpu.ckpt"),
       *ck_end = path_in(e.dir, "end.ckpt");
  reports rc = {0}, r1 = {0}, r2 = {0};
  /* both ends checkpointed: on 2 ranks that gathers the moments (graph.h) */
  bp_trainer *c = make(e.model, e.data, &(run_opts){.device = "cpu", .ranks = ranks, .batch = 24,
                                                     .checkpoint = ck_cpu});
  train_all(c, &rc);
  bp_trainer *g = make(e.model, e.data, &(run_opts){.device = "guarded", .ranks = ranks,
                                                     .batch = 24, .stop_after = 3, .checkpoint = ck});
  train_all(g, &r1);
  ck_assert_int_eq(bp_trainer_state(g).global_step, 3);
  bp_trainer_destroy(g);
  g = make(e.model, e.data, &(run_opts){.device = "guarded", .ranks = ranks, .batch = 24,
                                         .checkpoint = ck_end, .resume = ck});
  ck_assert_int_eq(bp_trainer_state(g).global_step, 3);
  train_all(g, &r2);
  same_state(c, g);
  ck_assert(rc.r[1].test_loss == r2.r[r2.n - 1].test_loss);
  ck_assert_msg(same_file(ck_cpu, ck_end), "the final checkpoints differ");
  bp_trainer_destroy(c);
  bp_trainer_destroy(g);
  free(ck);
  free(ck_cpu);
  free(ck_end);
  toy_env_close(&e);
}
END_TEST

/* Ranks map to devices; a list names them; a bad list is refused. */
START_TEST(a_devices_list_maps_ranks_and_a_bad_one_is_refused) {
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  reports a = {0}, b = {0};
  bp_trainer *one = make(e.model, e.data, &(run_opts){.device = "guarded", .ranks = 2,
                                                       .batch = 24, .devices = "1,0"});
  bp_trainer *two =
      make(e.model, e.data, &(run_opts){.device = "guarded", .ranks = 2, .batch = 24});
  train_all(one, &a);
  train_all(two, &b);
  same_evaluated_reports(&a, &b);
  bp_trainer_destroy(one);
  bp_trainer_destroy(two);
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.registry = registry;
  o.device = "guarded";
  o.devices = "0,7";
  o.data_dir = e.data;
  bp_trainer *t = NULL;
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "devices '0,7'"));
  o.devices = NULL;
  o.device = "nosuch";
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "unknown device 'nosuch'"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "guarded"));
  o.device = "guarded";
  o.autotune = 1;
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "autotune"));
  toy_env_close(&e);
}
END_TEST

/* A kernel's failure inside the device's stream task reaches the caller
 * with its status and reason, and on 2 ranks stops both (no rank is left
 * waiting in the all-reduce). The kernel: tests/modules/state.c, pinned. */
START_TEST(a_kernel_failure_on_the_device_keeps_its_reason) {
  const char *paths[] = {BP_GUARDED_DIR, BP_KERNEL_STATE_DIR};
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_discover(r, paths, 2) == BP_OK, "%s", bp_last_error());
  tm_state_stats *stats = NULL;
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_registered_kernel *k = bp_registry_kernel(r, i);
    if (strcmp(k->kernel.op, "relu.fwd") == 0 && strcmp(k->kernel.impl, "stateful") == 0)
      stats = k->kernel.user;
  }
  ck_assert_ptr_nonnull(stats);
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.registry = r;
  o.device = "guarded";
  o.ranks = 2;
  o.data_dir = e.data;
  o.train_limit = 48;
  o.kernels = "relu.fwd=stateful";
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(e.mlp, &o, &t) == BP_OK, "%s", bp_last_error());
  stats->fail_run = BP_ABI_ERR_DEVICE;
  bp_epoch_report rep;
  ck_assert_int_eq(bp_trainer_train_epoch(t, &rep), BP_ERR_DEVICE);
  const char *msg = bp_last_error();
  ck_assert_msg(strstr(msg, "rank 0") && strstr(msg, "(relu.fwd/stateful) failed") &&
                    strstr(msg, "went stale"),
                "%s", msg);
  stats->fail_run = 0;
  bp_trainer_destroy(t);
  bp_registry_destroy(r);
  toy_env_close(&e);
}
END_TEST

/* A transport whose open fails: the trainer is not made, and the error is
 * one line naming the device, the transport and the plugin's reason. */
START_TEST(a_transport_that_fails_to_open_fails_the_run_with_its_reason) {
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  bp_train_options o;
  bp_train_options_init(&o);
  registry_open();
  o.registry = registry;
  o.device = "guarded";
  o.ranks = 2;
  o.data_dir = e.data;
  o.train_limit = 48;
  const guard_stats before = stats_now();
  ext_of(guarded())->fail_comm_open(1);
  bp_trainer *t = NULL;
  const bp_status st = bp_trainer_create_from_file(e.mlp, &o, &t);
  ext_of(guarded())->fail_comm_open(0);
  ck_assert_int_eq(st, BP_ERR_DEVICE);
  ck_assert_ptr_null(t);
  ck_assert_str_eq(bp_last_error(),
                   "device 'guarded': its collective transport 'threads' did not open for 2 "
                   "rank(s) of 2: guarded: opening refused (the test asked for it)");
  ck_assert_uint_eq(stats_now().arenas, before.arenas); /* nothing left behind */
  ck_assert_uint_eq(stats_now().comm_opens, before.comm_opens);
  /* it opens again */
  ck_assert_msg(bp_trainer_create_from_file(e.mlp, &o, &t) == BP_OK, "%s", bp_last_error());
  bp_trainer_destroy(t);
  toy_env_close(&e);
}
END_TEST

/* A device plugin built against ABI 1.5 (its bp_abi_device ends before the
 * transports) loads and reads as offering none: its 2 ranks train through
 * the host's own threads communicator (its kernels are host tasks, so the
 * host's collectives reach its memory) to the cpu device's bits; the same
 * device without host flags is refused on 2 ranks, in one line. */
START_TEST(a_1_5_device_plugin_loads_and_its_ranks_use_the_host_or_are_refused) {
  const char *paths[] = {BP_GUARDED15_DIR};
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_discover(r, paths, 1) == BP_OK, "%s", bp_last_error());
  const bp_abi_device *d = bp_registry_find_device(r, "guarded15");
  ck_assert_ptr_nonnull(d);
  ck_assert_ptr_null(d->transports);
  ck_assert_int_eq(d->num_transports, 0);
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  char *ck_cpu = path_in(e.dir, "cpu.ckpt"), *ck_dev = path_in(e.dir, "g15.ckpt");
  run_opts base = {.ranks = 2, .batch = 24, .eval_batch = 20, .seed = 3, .constant_lr = 1};
  run_opts oc = base, og = base;
  oc.device = "cpu", oc.checkpoint = ck_cpu, oc.registry = r;
  og.device = "guarded15", og.checkpoint = ck_dev, og.registry = r, og.no_graph = 1;
  bp_trainer *c = make_trainer(e.model, e.data, &oc), *g = make_trainer(e.model, e.data, &og);
  ck_assert_str_eq(bp_trainer_transport(g), "threads");
  reports rc = {0}, rg = {0};
  train_all(c, &rc);
  train_all(g, &rg);
  same_evaluated_reports(&rc, &rg);
  same_state(c, g);
  ck_assert_msg(same_file(ck_cpu, ck_dev), "the checkpoints differ");
  ck_assert_uint_eq(stats_of(d).comm_opens, 0);
  bp_trainer_destroy(c);
  bp_trainer_destroy(g);
  bp_train_options o;
  bp_train_options_init(&o);
  o.registry = r;
  o.device = "guarded15_opaque";
  o.ranks = 2;
  o.data_dir = e.data;
  o.train_limit = 48;
  bp_trainer *t = NULL;
  ck_assert_int_eq(bp_trainer_create_from_file(e.mlp, &o, &t), BP_ERR_UNSUPPORTED);
  ck_assert_ptr_null(t);
  ck_assert_str_eq(bp_last_error(),
                   "2 ranks run on distinct 'guarded15_opaque' devices: device 'guarded15_opaque' "
                   "offers no collective transport and the host cannot reach its memory: run at "
                   "most 2 ranks (this machine's devices), or give --devices with distinct "
                   "devices or one device for all");
  free(ck_cpu);
  free(ck_dev);
  toy_env_close(&e);
  bp_registry_destroy(r);
}
END_TEST

/* The command line reaches the device through --plugin and --device, and
 * prints what the cpu device prints, timings aside. */
START_TEST(blueprint_train_runs_on_the_guarded_device) {
  toy_env e = toy_env_open(bn_model, 100, 30, 7);
  char *m_cpu = path_in(e.dir, "cpu.jsonl"), *m_dev = path_in(e.dir, "guarded.jsonl");
  run_result c = RUN("train", e.model, "--data", e.data, "--epochs", "1", "--train-limit", "60",
                     "--quiet", "--metrics", m_cpu, "--ranks", "2");
  ck_assert_msg(c.status == 0, "%s", c.err);
  run_result g = RUN("train", e.model, "--data", e.data, "--epochs", "1", "--train-limit", "60",
                     "--quiet", "--metrics", m_dev, "--ranks", "2", "--plugin", BP_GUARDED_DIR,
                     "--device", "guarded", "--devices", "1,0");
  ck_assert_msg(g.status == 0, "%s", g.err);
  same_epoch_metrics(m_cpu, m_dev, 0, "on cpu", "on guarded");
  run_free(&c);
  run_free(&g);
  free(m_cpu);
  free(m_dev);
  toy_env_close(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("device_seam");
  TCase *g = tcase_create("guard");
  tcase_add_test(g, a_stream_task_reaches_the_arena_and_a_copy_reads_it);
  tcase_add_test(g, a_host_store_into_the_arena_faults);
  tcase_add_test(g, the_host_path_on_a_guarded_arena_faults);
  suite_add_tcase(s, g);
  TCase *t = tcase_create("train");
  tcase_set_timeout(t, 600);
  tcase_add_test(t, the_mlp_trains_on_the_guarded_device_as_on_cpu);
  tcase_add_test(t, batch_norm_trains_on_the_guarded_device_as_on_cpu);
  tcase_add_test(t, two_ranks_train_on_the_guarded_device_as_on_cpu);
  tcase_add_test(t, the_cnn_trains_on_the_guarded_device_as_on_cpu);
  tcase_add_loop_test(t, a_resumed_run_on_the_guarded_device_ends_as_on_cpu, 0, 2);
  tcase_add_test(t, the_next_batch_is_uploaded_while_the_step_runs);
  tcase_add_test(t, a_written_tensor_reads_back_and_counts_as_on_cpu);
  tcase_add_test(t, a_devices_list_maps_ranks_and_a_bad_one_is_refused);
  tcase_add_test(t, blueprint_train_runs_on_the_guarded_device);
  tcase_add_test(t, a_kernel_failure_on_the_device_keeps_its_reason);
  tcase_add_test(t, a_transport_that_fails_to_open_fails_the_run_with_its_reason);
  tcase_add_test(t, a_1_5_device_plugin_loads_and_its_ranks_use_the_host_or_are_refused);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
