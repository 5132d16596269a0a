/* `train --profile` (trainer/src/profile*.c, the executor's timing in bind.c,
 * cli/profile_report.c): every node of the train variant is recorded,
 * node times partition the kernel time exactly and nest in the step time,
 * FLOP counts follow the formulas of profile.h, the metrics record parses,
 * and without --profile there is none. No assertion is on speed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/profile.h"
#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "json_mini.h"
#include "run_util.h"
#include "test_env.h"

static toy_env env;

static void setup(void) { env = toy_env_open(TOY_BN_MODEL_LAYERS, 300, 200, 7); }
static void teardown(void) { toy_env_close(&env); }

/* A descriptor whose shape is all bp_profile_op_flops reads. */
static bp_abi_tensor shaped(int64_t n, int64_t h, int64_t w, int64_t c) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.shape[0] = n;
  t.shape[1] = h;
  t.shape[2] = w;
  t.shape[3] = c;
  return t;
}

static uint64_t flops_of(const char *op, bp_abi_tensor in0, bp_abi_tensor in1, bp_abi_tensor out0) {
  const bp_abi_tensor in[2] = {in0, in1}, out[1] = {out0};
  bp_abi_kernel_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.num_inputs = 2;
  a.num_outputs = 1;
  a.inputs = in;
  a.outputs = out;
  return bp_profile_op_flops(op, &a);
}

START_TEST(flop_counts_follow_the_formulas_for_known_shapes) {
  /* conv 3x3, N=8, 28x28x6 -> 14x14x16 (stride 2), groups 2: w [16,3,3,3] */
  const bp_abi_tensor x = shaped(8, 28, 28, 6), w = shaped(16, 3, 3, 3), y = shaped(8, 14, 14, 16);
  const uint64_t conv = UINT64_C(2) * 8 * 14 * 14 * 16 * 3 * 3 * (6 / 2);
  ck_assert_uint_eq(flops_of("conv2d.fwd", x, w, y), conv);
  ck_assert_uint_eq(flops_of("conv2d.bwd_data", y, w, x), conv);   /* dy, w -> dx */
  ck_assert_uint_eq(flops_of("conv2d.bwd_filter", x, y, w), conv); /* x, dy -> dw */
  /* fc: x [32,7,7,64] read as [32, 3136], w [10,1,1,3136] */
  const bp_abi_tensor fx = shaped(32, 7, 7, 64), fw = shaped(10, 1, 1, 3136),
                      fy = shaped(32, 1, 1, 10);
  const uint64_t fc = UINT64_C(2) * 32 * 3136 * 10;
  ck_assert_uint_eq(flops_of("fc.fwd", fx, fw, fy), fc);
  ck_assert_uint_eq(flops_of("fc.bwd_data", fy, fw, fx), fc);
  ck_assert_uint_eq(flops_of("fc.bwd_filter", fx, fy, fw), fc);
  /* other ops are not counted */
  ck_assert_uint_eq(flops_of("relu.fwd", fx, fx, fx), 0);
  ck_assert_uint_eq(flops_of("conv2d.other", x, w, y), 0);
  ck_assert_uint_eq(bp_profile_op_flops("fc.fwd", NULL), 0);
}
END_TEST

static bp_train_options mlp_options(bp_profile *p) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = env.data;
  o.train_limit = 256; /* two steps of the model's batch 128 */
  o.test_limit = 200;  /* one evaluation batch of 200 */
  o.epochs = 1;
  o.profile = p;
  return o;
}

/* The profile node `name` of variant v; fails the test when absent. */
static const bp_profile_node *node_named(const bp_profile *p, int v, const char *name) {
  for (int i = 0; i < bp_profile_node_count(p); i++) {
    const bp_profile_node *n = bp_profile_node_at(p, i);
    if (n->variant == v && strcmp(n->name, name) == 0) return n;
  }
  ck_abort_msg("node %s is not in the profile", name);
  return NULL;
}

START_TEST(a_profiled_run_records_every_train_node_and_its_time_adds_up) {
  bp_profile_options po = {.sgemm_size = 64}; /* a quick yardstick */
  bp_profile *p = NULL;
  ck_assert_int_eq(bp_profile_create(&po, &p), BP_OK);
  bp_train_options o = mlp_options(p);
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(env.mlp, &o, &t) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(bp_trainer_train(t, NULL, NULL), BP_OK);

  const int v = bp_profile_variant_find(p, "train");
  ck_assert_int_ge(v, 0);
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  ck_assert_uint_eq(pv->steps, 2);
  /* every node rank 0 bound in "train" is there, with its kernel */
  int bound = 0;
  for (int i = 0; i < bp_trainer_kernel_use_count(t); i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(t, i);
    if (u->rank != 0 || strcmp(u->variant, "train") != 0) continue;
    const bp_profile_node *n = node_named(p, v, u->node);
    ck_assert_str_eq(bp_segment_name(n->segment), u->segment);
    ck_assert_str_eq(n->op, u->kernel->kernel.op);
    ck_assert_str_eq(n->impl, u->kernel->kernel.impl);
    bound++;
  }
  int listed = 0;
  uint64_t sum = 0;
  for (int i = 0; i < bp_profile_node_count(p); i++) {
    const bp_profile_node *n = bp_profile_node_at(p, i);
    if (n->variant != v) continue;
    listed++;
    sum += n->ns;
    /* forward nodes run once a step; reset runs outside steps, never recorded */
    if (n->segment == BP_SEGMENT_FORWARD) ck_assert_uint_eq(n->calls, pv->steps);
    if (n->segment == BP_SEGMENT_RESET) ck_assert_uint_eq(n->calls, 0);
  }
  ck_assert_int_eq(listed, bound);
  /* invariants 1 and 2 of profile.h: exact, whatever the speed */
  ck_assert_uint_eq(sum, pv->run_ns);
  ck_assert_uint_le(pv->run_ns, pv->step_ns);
  ck_assert_uint_gt(pv->run_ns, 0);
  /* so the shares of the nodes and of "outside kernels" make the step */
  double shares = (double)(pv->step_ns - pv->run_ns) / (double)pv->step_ns;
  for (int i = 0; i < bp_profile_node_count(p); i++)
    if (bp_profile_node_at(p, i)->variant == v)
      shares += (double)bp_profile_node_at(p, i)->ns / (double)pv->step_ns;
  ck_assert_double_eq_tol(shares, 1.0, 1e-9);
  /* the ops table regroups the same time */
  bp_profile_op ops[64];
  const int count = bp_profile_ops(p, v, ops, 64);
  ck_assert_int_gt(count, 0);
  uint64_t op_sum = 0;
  for (int i = 0; i < count; i++) op_sum += ops[i].ns;
  ck_assert_uint_eq(op_sum, sum);
  /* FLOPs of the fc nodes for batch 128 (784-512-512-10) */
  ck_assert_uint_eq(node_named(p, v, "fc1.fwd")->flops, UINT64_C(2) * 128 * 784 * 512);
  ck_assert_uint_eq(node_named(p, v, "fc2.bwd_data")->flops, UINT64_C(2) * 128 * 512 * 512);
  ck_assert_uint_eq(node_named(p, v, "fc3.bwd_filter")->flops, UINT64_C(2) * 128 * 512 * 10);
  ck_assert_uint_eq(node_named(p, v, "relu1.fwd")->flops, 0);
  /* the evaluation after the epoch: one batch of 200 */
  const int e = bp_profile_variant_find(p, "eval");
  ck_assert_int_ge(e, 0);
  ck_assert_uint_eq(bp_profile_variant_at(p, e)->steps, 1);
  ck_assert_uint_eq(node_named(p, e, "fc1.fwd")->flops, UINT64_C(2) * 200 * 784 * 512);
  /* the work behind the SGEMM floor: 3 x the forward FLOPs when training
   * (668,672 weights), the forward alone when evaluating */
  const uint64_t weights = 784 * 512 + 512 * 512 + 512 * 10;
  int trains = -1;
  ck_assert_uint_eq(bp_profile_work_flops(p, v, &trains), UINT64_C(3) * 2 * 128 * weights);
  ck_assert_int_eq(trains, 1);
  ck_assert_uint_eq(bp_profile_work_flops(p, e, &trains), UINT64_C(2) * 200 * weights);
  ck_assert_int_eq(trains, 0);
  ck_assert_uint_eq(bp_profile_work_flops(p, 99, NULL), 0); /* no such variant */
  /* the yardstick ran on the cpu device */
  const bp_profile_sgemm *s = bp_profile_sgemm_rate(p);
  ck_assert_msg(s->measured, "not measured: %s", s->why);
  ck_assert_int_eq(s->m, 64);
  ck_assert_ptr_nonnull(s->impl);
  ck_assert(s->gflops > 0);
  /* the median run is never faster than the fastest */
  ck_assert(s->median_gflops > 0 && s->median_gflops <= s->gflops);
  /* measured before the first step and after the epoch's steps, pooled:
   * the fastest of all runs, at least as fast as the last measurement's */
  ck_assert_int_eq(s->measurements, 2);
  ck_assert_int_ge(s->runs, 2 * 3);
  ck_assert_int_le(s->runs, 2 * BP_PROFILE_SGEMM_MAX_RUNS);
  ck_assert_double_eq_tol(s->gflops, 2.0 * 64 * 64 * 64 / (s->best_seconds * 1e9),
                          1e-12 * s->gflops);
  ck_assert(s->best_seconds * 1e9 <= (double)s->run_ns[0] * (1 + 1e-12));
  /* the share of the SGEMM floor: the work's time at a rate over the mean step */
  const double share = bp_profile_floor_share(p, v, s->gflops);
  ck_assert_double_eq_tol(share,
                          (double)bp_profile_work_flops(p, v, NULL) / s->gflops *
                              (double)pv->steps / (double)pv->step_ns,
                          1e-12 * share);
  ck_assert(share > 0 && bp_profile_floor_share(p, v, s->median_gflops) >= share);
  ck_assert(isnan(bp_profile_floor_share(p, v, 0.0)));
  ck_assert(isnan(bp_profile_floor_share(p, 99, s->gflops)));
  bp_trainer_destroy(t);

  /* a profile holds one executor's nodes: a second trainer is refused */
  bp_trainer *t2 = NULL;
  ck_assert_int_eq(bp_trainer_create_from_file(env.mlp, &o, &t2), BP_ERR_STATE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "attached elsewhere"));
  bp_profile_destroy(p);
}
END_TEST

/* The yardstick pools the runs of every measurement until the pool is
 * full; a profile whose yardstick is switched off never measures. */
START_TEST(the_yardstick_pools_its_measurements_up_to_the_cap) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_load(r, BP_OPS_REFERENCE_PATH) == BP_OK, "%s", bp_last_error());
  bp_threads *pool = NULL;
  ck_assert_int_eq(bp_threads_create(1, &pool), BP_OK);
  bp_profile_options po = {.sgemm_size = 16}; /* a few microseconds a run */
  bp_profile *p = NULL;
  ck_assert_int_eq(bp_profile_create(&po, &p), BP_OK);
  const bp_profile_sgemm *s = bp_profile_sgemm_rate(p);
  ck_assert_int_eq(s->measured, 0);
  int measurements = 0, runs = 0;
  while (runs < BP_PROFILE_SGEMM_POOL) {
    bp_profile_measure_sgemm(p, r, "cpu", bp_threads_abi(pool));
    ck_assert_msg(s->measured, "not measured: %s", s->why);
    ck_assert_int_eq(s->measurements, ++measurements);
    ck_assert_int_gt(s->runs, runs); /* this measurement's runs joined the pool */
    runs = s->runs;
    ck_assert(s->median_gflops > 0 && s->median_gflops <= s->gflops);
    /* no slower than the last measurement's fastest (up to the seconds' rounding) */
    ck_assert(s->best_seconds * 1e9 <= (double)s->run_ns[0] * (1 + 1e-12));
  }
  ck_assert_int_eq(runs, BP_PROFILE_SGEMM_POOL);
  ck_assert_int_gt(measurements, 1);
  const double gflops = s->gflops, median = s->median_gflops;
  bp_profile_measure_sgemm(p, r, "cpu", bp_threads_abi(pool)); /* full: skipped */
  ck_assert_int_eq(s->measurements, measurements);
  ck_assert_int_eq(s->runs, runs);
  ck_assert(s->gflops == gflops && s->median_gflops == median);
  bp_profile_destroy(p);

  po.sgemm_size = -1; /* switched off */
  ck_assert_int_eq(bp_profile_create(&po, &p), BP_OK);
  bp_profile_measure_sgemm(p, r, "cpu", bp_threads_abi(pool));
  s = bp_profile_sgemm_rate(p);
  ck_assert_int_eq(s->measured, 0);
  ck_assert_ptr_nonnull(strstr(s->why, "switched off"));
  bp_profile_destroy(p);
  bp_threads_destroy(pool);
  bp_registry_destroy(r);
}
END_TEST

/* The first line of a JSONL file whose event is `event`, parsed; NULL when none. */
static jm_value *event_line(const char *path, const char *event) {
  size_t size = 0;
  char *text = (char *)read_file(path, &size);
  ck_assert_ptr_nonnull(text);
  char needle[64];
  snprintf(needle, sizeof needle, "{\"event\":\"%s\"", event);
  jm_value *found = NULL;
  for (char *line = text; line && *line && !found;) {
    char *nl = strchr(line, '\n');
    const size_t len = nl ? (size_t)(nl - line) : strlen(line);
    if (strncmp(line, needle, strlen(needle)) == 0) {
      char err[256];
      found = jm_parse(line, len, err, sizeof err);
      ck_assert_msg(found != NULL, "the %s line does not parse: %s", event, err);
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  return found;
}

static uint64_t u64_of(const jm_value *object, const char *key) {
  uint64_t v = 0;
  ck_assert_msg(jm_u64(jm_get(object, key), &v) == 0, "%s is not an integer", key);
  return v;
}

START_TEST(the_metrics_profile_record_parses_and_has_the_fields) {
  char *metrics = path_in(env.dir, "m.jsonl"), *ckpt = path_in(env.dir, "c.bpck");
  run_result r = RUN("train", env.mlp, "--data", env.data, "--epochs", "1", "--train-limit", "256",
                     "--test-limit", "200", "--quiet", "--profile", "--metrics", metrics,
                     "--checkpoint", ckpt);
  ck_assert_msg(r.status == 0, "train failed: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "profile of rank 0"));
  ck_assert_ptr_nonnull(strstr(r.out, "SGEMM yardstick"));
  ck_assert_ptr_nonnull(strstr(r.out, " in 2 measurements, "));
  ck_assert_ptr_nonnull(strstr(r.out, "fc1.fwd"));
  ck_assert_ptr_nonnull(strstr(r.out, "(outside kernels)"));
  ck_assert_ptr_nonnull(strstr(r.out, "SGEMM floor: 513.5 MFLOP of training work a step"));
  run_free(&r);

  jm_value *line = event_line(metrics, "profile");
  ck_assert_msg(line != NULL, "no profile line in the metrics file");
  ck_assert_uint_eq(u64_of(line, "rank"), 0);
  ck_assert_str_eq(jm_get(line, "clock")->text, "CLOCK_MONOTONIC");
  const jm_value *s = jm_get(line, "sgemm");
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(jm_get(s, "measured")->kind, JM_BOOL);
  ck_assert_uint_eq(u64_of(s, "m"), BP_PROFILE_SGEMM_SIZE);
  ck_assert_ptr_nonnull(jm_get(s, "gflops"));
  /* the epoch's profile line follows the yardstick's second measurement */
  if (jm_get(s, "measured")->boolean) ck_assert_uint_eq(u64_of(s, "measurements"), 2);
  const jm_value *variants = jm_get(line, "variants");
  ck_assert_ptr_nonnull(variants);
  const jm_value *train = NULL;
  for (size_t i = 0; i < variants->count; i++)
    if (strcmp(jm_get(jm_at(variants, i), "variant")->text, "train") == 0)
      train = jm_at(variants, i);
  ck_assert_ptr_nonnull(train);
  ck_assert_uint_eq(u64_of(train, "steps"), 2);
  const uint64_t kernel_ns = u64_of(train, "kernel_ns");
  ck_assert_uint_le(kernel_ns, u64_of(train, "step_ns"));
  /* the SGEMM floor: the work, and the share of it the step reaches (the
   * median run's rate is never above the fastest's, so its share is >=) */
  ck_assert_uint_eq(u64_of(train, "work_flops"), UINT64_C(3) * 2 * 128 * 668672);
  ck_assert_int_eq(jm_get(train, "trains")->kind, JM_BOOL);
  ck_assert_int_eq(jm_get(train, "trains")->boolean, 1);
  const jm_value *share = jm_get(train, "floor_share");
  const jm_value *median = jm_get(train, "floor_share_median");
  ck_assert(share && median && share->kind == median->kind);
  if (share->kind == JM_NUMBER) { /* null only when the yardstick was not measured */
    const double best = strtod(share->text, NULL), med = strtod(median->text, NULL);
    ck_assert(best > 0 && med >= best);
  }
  const jm_value *nodes = jm_get(train, "nodes"), *ops = jm_get(train, "ops");
  ck_assert(nodes && nodes->count > 0 && ops && ops->count > 0);
  uint64_t sum = 0;
  int fc1 = 0;
  for (size_t i = 0; i < nodes->count; i++) {
    const jm_value *n = jm_at(nodes, i);
    static const char *const keys[] = {"node", "segment", "op", "impl", "flops_per_call",
                                       "calls", "ns", "share", "mean_ms", "gflops",
                                       "sgemm_ratio"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      ck_assert_msg(jm_get(n, keys[k]) != NULL, "node %zu has no %s", i, keys[k]);
    sum += u64_of(n, "ns");
    if (strcmp(jm_get(n, "node")->text, "fc1.fwd") == 0) {
      fc1 = 1;
      ck_assert_uint_eq(u64_of(n, "flops_per_call"), UINT64_C(2) * 128 * 784 * 512);
      ck_assert_uint_eq(u64_of(n, "calls"), 2);
    }
  }
  ck_assert(fc1);
  ck_assert_uint_eq(sum, kernel_ns); /* profile.h invariant 1, exact in integers */
  for (size_t i = 0; i < ops->count; i++)
    ck_assert(jm_get(jm_at(ops, i), "op") && jm_get(jm_at(ops, i), "flops") &&
              jm_get(jm_at(ops, i), "share"));
  jm_free(line);

  /* eval --profile prints the evaluation batch's table */
  r = RUN("eval", env.mlp, "--data", env.data, "--test-limit", "200", "--checkpoint", ckpt,
          "--quiet", "--profile");
  ck_assert_msg(r.status == 0, "eval failed: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "variant eval: 1 batch,"));
  run_free(&r);
  free(metrics);
  free(ckpt);
}
END_TEST

START_TEST(without_profile_the_metrics_hold_no_profile_record) {
  char *metrics = path_in(env.dir, "m.jsonl");
  run_result r = RUN("train", env.mlp, "--data", env.data, "--epochs", "1", "--train-limit", "256",
                     "--test-limit", "200", "--quiet", "--metrics", metrics);
  ck_assert_msg(r.status == 0, "train failed: %s", r.err);
  ck_assert_ptr_null(strstr(r.out, "profile of rank 0"));
  run_free(&r);
  jm_value *epoch = event_line(metrics, "epoch");
  ck_assert_msg(epoch != NULL, "no epoch line");
  jm_free(epoch);
  ck_assert_ptr_null(event_line(metrics, "profile"));
  free(metrics);
}
END_TEST

START_TEST(help_names_the_profile_option) {
  run_result r = RUN("train", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "--profile"));
  run_free(&r);
  r = RUN("train", env.mlp, "--profile=1");
  ck_assert_int_eq(r.status, 2);
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("profile");
  TCase *tc = tcase_create("profile");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, flop_counts_follow_the_formulas_for_known_shapes);
  tcase_add_test(tc, a_profiled_run_records_every_train_node_and_its_time_adds_up);
  tcase_add_test(tc, the_yardstick_pools_its_measurements_up_to_the_cap);
  tcase_add_test(tc, the_metrics_profile_record_parses_and_has_the_fields);
  tcase_add_test(tc, without_profile_the_metrics_hold_no_profile_record);
  tcase_add_test(tc, help_names_the_profile_option);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
