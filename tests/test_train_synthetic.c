/* `blueprint train/eval --data synthetic[:HxWxC:CLASSES]` end to end: a bad
 * value is one line and exit 2 before any work, data that does not fit the
 * model one line and exit 1, and a run on synthetic data trains on the
 * model's shape, the limits apply, two runs give the same bits, and eval
 * reads the same test set. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_util.h"

static char *dir, *mlp;

static void setup(void) {
  dir = tmp_dir_create();
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  mlp = path_in(src, "models/mlp.yaml");
}

static void teardown(void) {
  free(mlp);
  tmp_dir_remove(dir);
}

#define REFUSED(status_want, needle, ...)                                                  \
  do {                                                                                     \
    run_result r_ = RUN(__VA_ARGS__);                                                      \
    expect_one_line_error(&r_, "blueprint ", needle);                                      \
    ck_assert_msg(r_.status == (status_want), "line %d: status %d, want %d: %s", __LINE__, \
                  r_.status, status_want, r_.err);                                         \
    run_free(&r_);                                                                         \
  } while (0)

START_TEST(bad_values_and_misfits_are_one_line) {
  REFUSED(2, "train: --data: data 'synthetic:8x8': the image shape is not HxWxC", "train", mlp,
          "--data", "synthetic:8x8");
  REFUSED(2, "train: --data: data 'synthetic:28x28x1:0': the classes", "train", mlp, "--data",
          "synthetic:28x28x1:0");
  REFUSED(2, "eval: --data: data 'synthetic:x': the image shape", "eval", mlp, "--checkpoint",
          "/nonexistent.ckpt", "--data", "synthetic:x");
  REFUSED(1, "are 8x8x1; model 'mlp' takes 28x28x1", "train", mlp, "--data", "synthetic:8x8x1");
  REFUSED(1, "labels of 'synthetic:28x28x1:11' go up to 10; model 'mlp' has 10 classes", "train",
          mlp, "--data", "synthetic:28x28x1:11");
}
END_TEST

START_TEST(runs_are_repeatable_and_eval_sees_the_same_test_set) {
  char *m1 = path_in(dir, "a.jsonl"), *m2 = path_in(dir, "b.jsonl"), *ck = path_in(dir, "c.ckpt");
  run_result r = RUN("train", mlp, "--data", "synthetic", "--batch", "32", "--train-limit", "96",
                     "--test-limit", "40", "--epochs", "1", "--metrics", m1, "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "model mlp: 96 training and 40 test images, batch 32"), "%s", r.out);
  run_free(&r);
  /* the classes may be fewer than the model's */
  r = RUN("train", mlp, "--data", "synthetic:28x28x1:3", "--batch", "32", "--train-limit", "96",
          "--test-limit", "40", "--epochs", "1", "--metrics", m2);
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  int n = 0;
  const double other = jsonl_number(m2, "epoch", 0, "train_loss", &n);
  r = RUN("train", mlp, "--data", "synthetic", "--batch", "32", "--train-limit", "96",
          "--test-limit", "40", "--epochs", "1", "--metrics", m2);
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  static const char *const keys[] = {"samples", "test_samples", "train_loss", "test_loss",
                                     "test_accuracy"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    const double a = jsonl_number(m1, "epoch", 0, keys[k], &n), b = jsonl_number(m2, "epoch", 0, keys[k], &n);
    ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "%s: %.17g, then %.17g", keys[k], a, b);
  }
  ck_assert(jsonl_number(m1, "epoch", 0, "samples", &n) == 96);
  ck_assert(jsonl_number(m1, "epoch", 0, "test_samples", &n) == 40);
  ck_assert(other != jsonl_number(m1, "epoch", 0, "train_loss", &n)); /* other labels */
  /* eval of the checkpoint on the same synthetic test set: the run's test loss */
  r = RUN("eval", mlp, "--checkpoint", ck, "--data", "synthetic", "--test-limit", "40",
          "--batch", "32");
  ck_assert_msg(r.status == 0, "%s", r.err);
  char want[64];
  snprintf(want, sizeof want, "%.4f", jsonl_number(m1, "epoch", 0, "test_loss", &n));
  ck_assert_msg(strstr(r.out, want) != NULL, "no test loss %s in: %s", want, r.out);
  run_free(&r);
  free(m1);
  free(m2);
  free(ck);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_synthetic");
  TCase *tc = tcase_create("cli");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, bad_values_and_misfits_are_one_line);
  tcase_add_test(tc, runs_are_repeatable_and_eval_sees_the_same_test_set);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
