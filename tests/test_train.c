/* `blueprint train` and `blueprint eval` end to end on Fashion-MNIST
 * subsets: the MLP learns (loss falls, test accuracy far above chance), a
 * short CNN run lowers its loss, evaluation of the checkpoint reproduces
 * the accuracy training printed, and the C example trains. Exits 77 (CTest
 * skip) where the dataset-fashion-mnist package is not installed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_util.h"

static char *model(const char *file) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  char *dir = path_in(src, "models");
  char *p = path_in(dir, file);
  free(dir);
  return p;
}

/* The "<prefix>NN.NN%" the output holds last; "" when none. */
static void last_percent(const char *out, const char *prefix, char *buf, size_t size) {
  buf[0] = '\0';
  for (const char *at = strstr(out, prefix); at; at = strstr(at + 1, prefix)) {
    const char *v = at + strlen(prefix);
    size_t n = strspn(v, "0123456789.");
    if (n && v[n] == '%' && n < size) {
      memcpy(buf, v, n);
      buf[n] = '\0';
    }
  }
}

START_TEST(mlp_learns_and_eval_reproduces) {
  char *dir = tmp_dir_create(), *mlp = model("mlp.yaml");
  char *ck = path_in(dir, "mlp.ckpt"), *metrics = path_in(dir, "mlp.jsonl");
  run_result r =
      RUN("train", mlp, "--train-limit", "6000", "--test-limit", "1000", "--batch", "64",
          "--epochs", "3", "--checkpoint", ck, "--metrics", metrics, "--log-every", "10");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_str_eq(r.err, "");
  /* one line per epoch, then the accuracy */
  ck_assert_ptr_nonnull(strstr(r.out, "epoch 1/3  train loss "));
  ck_assert_ptr_nonnull(strstr(r.out, "epoch 3/3  train loss "));
  char printed[32], evaluated[32];
  last_percent(r.out, "test accuracy ", printed, sizeof printed);
  ck_assert_msg(printed[0], "no test accuracy in: %s", r.out);

  int epochs = 0, steps = 0;
  const double first = jsonl_number(metrics, "step", 0, "train_loss", &steps);
  const double loss1 = jsonl_number(metrics, "epoch", 0, "train_loss", &epochs);
  const double loss3 = jsonl_number(metrics, "epoch", 2, "train_loss", NULL);
  const double acc = jsonl_number(metrics, "epoch", 2, "test_accuracy", NULL);
  ck_assert_int_eq(epochs, 3);
  ck_assert_int_eq(steps, 3 * 94 / 10); /* 94 steps per epoch, a line every 10 */
  ck_assert_msg(loss3 < loss1 && loss1 < first, "loss does not fall: %g (step 10), %g, %g", first,
                loss1, loss3);
  ck_assert_msg(acc > 0.5, "test accuracy %g is not above 50%% (chance: 10%%)", acc);
  ck_assert_double_eq_tol(acc * 100.0, atof(printed), 0.006);
  run_free(&r);

  /* the checkpoint evaluates to the accuracy training printed */
  r = RUN("eval", mlp, "--checkpoint", ck, "--batch", "64", "--test-limit", "1000");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  last_percent(r.out, "test accuracy ", evaluated, sizeof evaluated);
  ck_assert_str_eq(evaluated, printed);
  ck_assert_ptr_nonnull(strstr(r.out, "(1000 images"));
  run_free(&r);
  free(ck);
  free(metrics);
  free(mlp);
  tmp_dir_remove(dir);
}
END_TEST

/* Per-step losses from the running averages of the step lines. */
static void step_losses(const char *metrics, double *loss, int n) {
  double prev_sum = 0.0;
  for (int k = 0; k < n; k++) {
    const double avg = jsonl_number(metrics, "step", k, "train_loss", NULL);
    const double samples = jsonl_number(metrics, "step", k, "samples", NULL);
    loss[k] = avg * samples - prev_sum;
    prev_sum = avg * samples;
  }
}

START_TEST(cnn_short_run_lowers_its_loss) {
  char *dir = tmp_dir_create(), *cnn = model("cnn.yaml");
  char *metrics = path_in(dir, "cnn.jsonl");
  run_result r = RUN("train", cnn, "--train-limit", "640", "--test-limit", "200", "--batch", "32",
                     "--epochs", "1", "--lr", "0.01", "--metrics", metrics, "--log-every", "1");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  int steps = 0;
  jsonl_number(metrics, "step", 0, "train_loss", &steps);
  ck_assert_int_eq(steps, 20);
  double loss[20];
  step_losses(metrics, loss, 20);
  double early = 0, late = 0;
  for (int k = 0; k < 5; k++) early += loss[k], late += loss[15 + k];
  ck_assert_msg(late < early, "the loss of steps 16-20 (%g) is not below that of steps 1-5 (%g)",
                late / 5, early / 5);
  run_free(&r);
  free(metrics);
  free(cnn);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(example_trains_the_mlp) {
  char *mlp = model("mlp.yaml");
  run_result r = run_exe("examples/train_mlp", (const char *const[]){mlp, "3000", "1", NULL});
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "epoch 1/1: train loss "));
  char acc[32];
  last_percent(r.out, "test accuracy ", acc, sizeof acc);
  ck_assert_msg(atof(acc) > 50.0, "test accuracy %s%%: %s", acc, r.out);
  run_free(&r);
  free(mlp);
}
END_TEST

int main(void) {
  if (!have_fashion_mnist()) {
    printf("skipped: the dataset-fashion-mnist package is not installed\n");
    return 77;
  }
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("train");
  tcase_add_test(tc, mlp_learns_and_eval_reproduces);
  tcase_add_test(tc, cnn_short_run_lowers_its_loss);
  tcase_add_test(tc, example_trains_the_mlp);
  tcase_set_timeout(tc, 900);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
