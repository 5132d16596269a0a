/* A model file's train: schedule and warmup_epochs drive `blueprint train`
 * as --schedule and --warmup-epochs do, and those options override the
 * file. Each run's per-epoch learning rate (the epoch's last step, metrics
 * JSONL) is checked against bp_schedule_lr, and a file's schedule against
 * the same schedule from the command line, loss for loss. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/train.h"
#include "run_util.h"

/* 64 toy images in batches of 16: 4 steps per epoch, 3 epochs. */
#define BODY                                                \
  "input: {height: 28, width: 28, channels: 1, classes: 10}\n" \
  "layers:\n"                                               \
  "  - {type: fc, units: 10}\n"                             \
  "  - {type: softmax_ce}\n"
#define PLAIN BODY "train: {batch: 16, epochs: 3, lr: 0.1}\n"
#define COSINE BODY "train: {batch: 16, epochs: 3, lr: 0.1, schedule: cosine, warmup_epochs: 1}\n"

static toy_env env;
static char *cosine_model;

static void setup(void) {
  env = toy_env_open(PLAIN, 64, 32, 5);
  cosine_model = path_in(env.dir, "cosine.yaml");
  write_file(cosine_model, COSINE, strlen(COSINE));
}

static void teardown(void) {
  free(cosine_model);
  toy_env_close(&env);
}

/* Trains `model` with the extra options (NULL-terminated, at most 6) and
 * its metrics in `name`.jsonl; the per-epoch lr and train loss (3 epochs). */
static void train(const char *model, const char *name, const char *const *extra, double lr[3],
                  double loss[3]) {
  char file[64];
  snprintf(file, sizeof file, "%s.jsonl", name);
  char *metrics = path_in(env.dir, file);
  const char *argv[20] = {"train", model, "--data", env.data, "--quiet", "--metrics", metrics};
  int n = 7;
  for (int k = 0; extra && extra[k]; k++) argv[n++] = extra[k];
  run_result r = run_exe("blueprint", argv);
  ck_assert_msg(r.status == 0, "%s: status %d: %s", name, r.status, r.err);
  run_free(&r);
  int count = 0;
  for (int e = 0; e < 3; e++) {
    lr[e] = jsonl_number(metrics, "epoch", e, "lr", &count);
    loss[e] = jsonl_number(metrics, "epoch", e, "train_loss", &count);
  }
  ck_assert_int_eq(count, 3);
  free(metrics);
}

/* The lr of the last step of each epoch under `s` (4 steps per epoch). */
static void expected(bp_lr_schedule kind, double warmup, double gamma, double want[3]) {
  const bp_schedule s = {kind, 0.1, gamma, 1, warmup, 4, 3};
  for (int e = 0; e < 3; e++) want[e] = bp_schedule_lr(&s, 4 * e + 3);
}

static void assert_lrs(const char *what, const double got[3], const double want[3]) {
  for (int e = 0; e < 3; e++) /* the metrics print %.9g or so: relative 1e-6 */
    ck_assert_msg(fabs(got[e] - want[e]) <= 1e-6 * want[e], "%s: epoch %d lr %.9g, want %.9g",
                  what, e + 1, got[e], want[e]);
}

START_TEST(the_files_schedule_is_the_command_lines) {
  double lr_file[3], loss_file[3], lr_cli[3], loss_cli[3], want[3];
  train(cosine_model, "file", NULL, lr_file, loss_file);
  expected(BP_LR_COSINE, 1.0, 0.1, want);
  ck_assert(want[1] < 0.1 && want[2] < want[1]); /* the cosine decays: a test that can fail */
  assert_lrs("schedule: cosine, warmup_epochs: 1", lr_file, want);

  const char *const cli[] = {"--schedule", "cosine", "--warmup-epochs", "1", NULL};
  train(env.model, "cli", cli, lr_cli, loss_cli);
  assert_lrs("--schedule cosine --warmup-epochs 1", lr_cli, want);
  for (int e = 0; e < 3; e++) /* the same run, bit for bit */
    ck_assert_msg(loss_file[e] == loss_cli[e], "epoch %d: loss %.17g from the file, %.17g from "
                  "the options", e + 1, loss_file[e], loss_cli[e]);
}
END_TEST

START_TEST(options_override_the_file) {
  double lr[3], loss[3], want[3];
  const char *const step[] = {"--schedule", "step", "--step-gamma", "0.5", NULL};
  train(cosine_model, "step", step, lr, loss); /* the file's warmup stays */
  expected(BP_LR_STEP, 1.0, 0.5, want);
  assert_lrs("--schedule step over the file's cosine", lr, want);

  const char *const nowarm[] = {"--warmup-epochs", "0", NULL};
  train(cosine_model, "nowarm", nowarm, lr, loss);
  expected(BP_LR_COSINE, 0.0, 0.1, want);
  assert_lrs("--warmup-epochs 0 over the file's 1", lr, want);

  train(env.model, "plain", NULL, lr, loss); /* no schedule in the file: constant */
  expected(BP_LR_CONSTANT, 0.0, 0.1, want);
  assert_lrs("no schedule anywhere", lr, want);
}
END_TEST

/* The run's header names the schedule it took from the file. */
START_TEST(the_header_names_the_files_schedule) {
  run_result r = RUN("train", cosine_model, "--data", env.data, "--epochs", "1", "--quiet");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "(cosine, warmup 1 epochs)") != NULL, "%s", r.out);
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model_schedule");
  TCase *tc = tcase_create("model_schedule");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, the_files_schedule_is_the_command_lines);
  tcase_add_test(tc, options_override_the_file);
  tcase_add_test(tc, the_header_names_the_files_schedule);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
