/* Autotune over whole steps (trainer/src/train_autotune.c, docs/tuning.md):
 * the trainer times the tuned selection against the default one over
 * whole training steps and keeps the default unless the tuned one is
 * faster. The fc.fwd kernels of tests/modules/stepslow.c make the outcome
 * plain without timing assertions: "stepslow" is the fastest alone and
 * sleeps 100 ms in every step (the default "plain" waits 20 ms), "quick" is
 * faster in both. The registry holds only the reference, cpu, device and
 * allreduce modules and one of those, so no library kernel competes. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/autotune.h"
#include "blueprint/train.h"
#include "run_util.h"
#include "test_env.h"

static bp_registry *open_registry(const char *module) {
  char paths[5][1024];
  const char *names[] = {"bp_ops_reference.so", "bp_ops_cpu.so", "bp_device_cpu.so",
                         "bp_ops_allreduce.so"};
  for (int i = 0; i < 4; i++) snprintf(paths[i], sizeof paths[i], "%s/%s", BP_OPS_DIR, names[i]);
  snprintf(paths[4], sizeof paths[4], "%s/stepslow/%s", BP_TEST_MODULES, module);
  const char *list[5] = {paths[0], paths[1], paths[2], paths[3], paths[4]};
  return load_modules(list, 5);
}

/* What one run gives: the fc.fwd kernel it bound, its losses, its report. */
typedef struct run_out {
  char fc_impl[64];
  double train_loss, test_loss;
  char report[8192];
} run_out;

static run_out train_once(const toy_env *e, const char *module, int autotune, const char *pins) {
  bp_registry *r = open_registry(module);
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads();
  o.registry_options = bp_test_registry_options();
  o.data_dir = e->data;
  o.registry = r;
  o.autotune = autotune;
  o.kernels = pins;
  o.seed = 3;
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(e->model, &o, &t) == BP_OK, "%s", bp_last_error());
  run_out out;
  memset(&out, 0, sizeof out);
  snprintf(out.report, sizeof out.report, "%s", bp_trainer_autotune_report(t));
  for (int i = 0; i < bp_trainer_kernel_use_count(t); i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(t, i);
    if (strcmp(u->kernel->kernel.op, "fc.fwd") != 0) continue;
    if (out.fc_impl[0]) /* every fc.fwd node of every variant: one selection */
      ck_assert_msg(strcmp(u->kernel->kernel.impl, out.fc_impl) == 0,
                    "variant %s node %s: %s, before: %s; report:\n%s", u->variant, u->node,
                    u->kernel->kernel.impl, out.fc_impl, out.report);
    snprintf(out.fc_impl, sizeof out.fc_impl, "%s", u->kernel->kernel.impl);
  }
  bp_epoch_report rep;
  ck_assert_msg(bp_trainer_train_epoch(t, &rep) == BP_OK, "%s", bp_last_error());
  out.train_loss = rep.train_loss;
  out.test_loss = rep.test_loss;
  bp_trainer_destroy(t);
  bp_registry_destroy(r);
  return out;
}

static toy_env open_env(void) {
  return toy_env_open(TOY_BN_MODEL_LAYERS
                      "train: {batch: 8, eval_batch: 10, epochs: 1, lr: 0.02}\n",
                      32, 20, 7);
}

/* The pure decision: the default stays unless the tuned step is faster by
 * more than the margin; NaN and non-positive times keep the default. */
START_TEST(the_default_stays_unless_the_tuned_step_is_faster_by_the_margin) {
  ck_assert_int_eq(bp_autotune_keep_tuned(9.0, 10.0, 0.02), 1);
  ck_assert_int_eq(bp_autotune_keep_tuned(9.79, 10.0, 0.02), 1);
  ck_assert_int_eq(bp_autotune_keep_tuned(9.81, 10.0, 0.02), 0); /* within the margin */
  ck_assert_int_eq(bp_autotune_keep_tuned(10.0, 10.0, 0.02), 0);
  ck_assert_int_eq(bp_autotune_keep_tuned(25.0, 4.9, 0.02), 0); /* issue 31's MLP */
  ck_assert_int_eq(bp_autotune_keep_tuned(10.0, 10.0, 0.0), 0);  /* a tie keeps the default */
  ck_assert_int_eq(bp_autotune_keep_tuned(NAN, 10.0, 0.02), 0);
  ck_assert_int_eq(bp_autotune_keep_tuned(5.0, NAN, 0.02), 0);
  ck_assert_int_eq(bp_autotune_keep_tuned(0.0, 10.0, 0.02), 0);
  ck_assert_int_eq(bp_autotune_keep_tuned(5.0, -1.0, 0.02), 0);
}
END_TEST

/* stepslow wins alone (autotune's per-node pick), loses in steps: the run
 * keeps plain, reports both, and trains to the plain run's bits. */
START_TEST(a_kernel_fast_alone_and_slow_in_steps_never_replaces_the_default) {
  toy_env e = open_env();
  const run_out tuned = train_once(&e, "stepslow.so", 1, NULL);
  ck_assert_msg(strcmp(tuned.fc_impl, "plain") == 0, "%s; report:\n%s", tuned.fc_impl, tuned.report);
  ck_assert_msg(strstr(tuned.report, "plain") && strstr(tuned.report, "stepslow") &&
                    strstr(tuned.report, "stepslow="),
                "report:\n%s", tuned.report);
  ck_assert_msg(strstr(tuned.report, "keeping the default kernels") != NULL, "report:\n%s",
                tuned.report);
  ck_assert_msg(strstr(tuned.report, "autotune: step: ") != NULL, "report:\n%s", tuned.report);
  const run_out plain = train_once(&e, "stepslow.so", 0, NULL);
  ck_assert_str_eq(plain.fc_impl, "plain");
  ck_assert_str_eq(plain.report, ""); /* no autotune, no report */
  /* the timing steps left nothing behind: the same bits */
  ck_assert_msg(tuned.train_loss == plain.train_loss, "train loss %.17g vs %.17g",
                tuned.train_loss, plain.train_loss);
  ck_assert_msg(tuned.test_loss == plain.test_loss, "test loss %.17g vs %.17g", tuned.test_loss,
                plain.test_loss);
  toy_env_close(&e);
}
END_TEST

/* quick is faster alone and in steps: kept, and the run trains to the bits
 * of a run pinned to it without autotune. */
START_TEST(a_kernel_faster_in_steps_is_kept_with_the_pinned_runs_bits) {
  toy_env e = open_env();
  const run_out tuned = train_once(&e, "stepquick.so", 1, NULL);
  ck_assert_msg(strcmp(tuned.fc_impl, "quick") == 0, "%s; report:\n%s", tuned.fc_impl, tuned.report);
  ck_assert_msg(strstr(tuned.report, "keeping the tuned kernels") != NULL, "report:\n%s",
                tuned.report);
  const run_out pinned = train_once(&e, "stepquick.so", 0, "fc.fwd=quick");
  ck_assert_str_eq(pinned.fc_impl, "quick");
  ck_assert_msg(tuned.train_loss == pinned.train_loss, "train loss %.17g vs %.17g",
                tuned.train_loss, pinned.train_loss);
  ck_assert_msg(tuned.test_loss == pinned.test_loss, "test loss %.17g vs %.17g",
                tuned.test_loss, pinned.test_loss);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *su = suite_create("autotune_steps");
  TCase *tc = tcase_create("whole_steps");
  tcase_add_test(tc, the_default_stays_unless_the_tuned_step_is_faster_by_the_margin);
  tcase_add_test(tc, a_kernel_fast_alone_and_slow_in_steps_never_replaces_the_default);
  tcase_add_test(tc, a_kernel_faster_in_steps_is_kept_with_the_pinned_runs_bits);
  tcase_set_timeout(tc, 600);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
