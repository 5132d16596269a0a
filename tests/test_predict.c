/* `blueprint predict` (cli/cmd_predict.c) on a tiny trained
 * checkpoint: its batch-1 predictions give eval's accuracy on the same
 * images, a PGM of one image gives that image's prediction, the JSON is
 * well formed, and bad input (an image of another size, a truncated file,
 * a checkpoint of another model) gets one clear line and exit status 1. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_mini.h"
#include "run_util.h"

#define TRAIN "train: {batch: 32, eval_batch: 50, epochs: 1, optimizer: sgd, lr: 0.05}\n"
#define TEST_IMAGES 100

static toy_env env;
static char *ck, *images, *labels;

/* One training run for every test (the checkpoint is only read). */
static void setup(void) {
  env = toy_env_open(TOY_BN_MODEL_LAYERS TRAIN, 320, TEST_IMAGES, 5);
  ck = path_in(env.dir, "ck.bin");
  images = path_in(env.data, "t10k-images-idx3-ubyte");
  labels = path_in(env.data, "t10k-labels-idx1-ubyte");
  run_result r = RUN("train", env.model, "--data", env.data, "--checkpoint", ck, "--quiet");
  ck_assert_msg(r.status == 0, "train: %s", r.err);
  run_free(&r);
}

static void teardown(void) {
  free(ck);
  free(images);
  free(labels);
  toy_env_close(&env);
}

/* The parsed --json output of predict on `input` (asserts success). */
static jm_value *predict_json(const char *input, const char *top) {
  run_result r = RUN("predict", env.model, "--checkpoint", ck, "--input", input, "--data",
                     env.data, "--json", "--top", top);
  ck_assert_msg(r.status == 0, "predict: %s", r.err);
  char err[128];
  jm_value *v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "predict --json: %s: %s", err, r.out);
  run_free(&r);
  return v;
}

static uint64_t u64_of(const jm_value *v) {
  uint64_t x;
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(jm_u64(v, &x), 0);
  return x;
}

START_TEST(batch_one_predictions_give_evals_accuracy_on_the_same_images) {
  jm_value *v = predict_json(images, "3");
  ck_assert_uint_eq(u64_of(jm_get(v, "images")), TEST_IMAGES);
  ck_assert_uint_eq(u64_of(jm_get(v, "top")), 3);
  const jm_value *preds = jm_get(v, "predictions");
  ck_assert_ptr_nonnull(preds);
  ck_assert_uint_eq(preds->count, TEST_IMAGES);
  size_t size;
  unsigned char *lab = read_file(labels, &size);
  ck_assert_ptr_nonnull(lab);
  ck_assert_uint_eq(size, 8 + TEST_IMAGES);
  int correct = 0;
  for (size_t i = 0; i < preds->count; i++) {
    const jm_value *top = jm_get(jm_at(preds, i), "top");
    ck_assert_ptr_nonnull(top);
    ck_assert_uint_eq(top->count, 3);
    double sum = 0, prev = 2;
    for (size_t t = 0; t < 3; t++) {
      const double p = atof(jm_get(jm_at(top, t), "probability")->text);
      ck_assert(p <= prev && p >= 0); /* most likely first */
      prev = p;
      sum += p;
    }
    ck_assert_double_le(sum, 1 + 1e-5);
    correct += u64_of(jm_get(jm_at(top, 0), "class")) == lab[8 + i];
  }
  free(lab);
  ck_assert_ptr_nonnull(jm_get(jm_get(v, "latency_ms"), "median"));
  jm_free(v);

  run_result r = RUN("eval", env.model, "--checkpoint", ck, "--data", env.data, "--quiet");
  ck_assert_msg(r.status == 0, "eval: %s", r.err);
  const char *p = strstr(r.out, "test accuracy ");
  ck_assert_ptr_nonnull(p);
  double acc;
  ck_assert_int_eq(sscanf(p, "test accuracy %lf%%", &acc), 1);
  run_free(&r);
  ck_assert_msg(fabs(acc - 100.0 * correct / TEST_IMAGES) < 1e-9,
                "eval says %.2f%%, predict got %d of %d right", acc, correct, TEST_IMAGES);
  ck_assert_int_gt(correct, 20); /* it learned something: chance is 10 */
}
END_TEST

START_TEST(a_pgm_image_gets_the_prediction_of_the_same_idx_image) {
  size_t size;
  unsigned char *idx = read_file(images, &size);
  ck_assert_ptr_nonnull(idx);
  char *pgm = path_in(env.dir, "one.pgm");
  unsigned char buf[64 + 784];
  const int head = snprintf((char *)buf, sizeof buf, "P5\n# a comment\n28 28\n255\n");
  memcpy(buf + head, idx + 16, 784);
  write_file(pgm, buf, (size_t)head + 784);
  free(idx);
  jm_value *one = predict_json(pgm, "10"), *all = predict_json(images, "10");
  ck_assert_uint_eq(u64_of(jm_get(one, "images")), 1);
  const jm_value *a = jm_get(jm_at(jm_get(one, "predictions"), 0), "top");
  const jm_value *b = jm_get(jm_at(jm_get(all, "predictions"), 0), "top");
  ck_assert_uint_eq(a->count, 10); /* every class */
  for (size_t t = 0; t < 10; t++) {
    ck_assert_uint_eq(u64_of(jm_get(jm_at(a, t), "class")), u64_of(jm_get(jm_at(b, t), "class")));
    ck_assert_str_eq(jm_get(jm_at(a, t), "probability")->text,
                     jm_get(jm_at(b, t), "probability")->text);
  }
  jm_free(one);
  jm_free(all);

  /* the table */
  run_result r = RUN("predict", env.model, "--checkpoint", ck, "--input", pgm, "--data",
                     env.data, "--top", "2");
  ck_assert_msg(r.status == 0, "predict: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "image  top  class  probability"));
  ck_assert_ptr_nonnull(strstr(r.out, "1 images, one at a time: latency median"));
  run_free(&r);
  free(pgm);
}
END_TEST

START_TEST(bad_input_gets_one_line_and_a_failing_status) {
  char *wrong = path_in(env.dir, "wrong.pgm"), *cut = path_in(env.dir, "cut.idx");
  char *cutpgm = path_in(env.dir, "cut.pgm");
  unsigned char big[64 + 32 * 28];
  const int head = snprintf((char *)big, sizeof big, "P5 32 28 255\n");
  memset(big + head, 7, 32 * 28);
  write_file(wrong, big, (size_t)head + 32 * 28);
  write_file(cutpgm, big, (size_t)head + 100);
  size_t size;
  unsigned char *idx = read_file(images, &size);
  write_file(cut, idx, 16 + 784 * 3 + 5); /* a header promising 100 images */
  free(idx);
  struct {
    const char *model, *input, *needle;
  } bad[] = {
      {env.model, wrong, "images of 28x32x1; model 'small' takes 28x28x1"},
      {env.model, cutpgm, "truncated"},
      {env.model, cut, "truncated"},
      {env.mlp, images, "written for another plan"},
      {env.model, env.dir, NULL}, /* a directory */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    run_result r = RUN("predict", bad[i].model, "--checkpoint", ck, "--input", bad[i].input,
                       "--data", env.data);
    ck_assert_int_eq(r.status, 1);
    expect_one_line_error(&r, "blueprint predict: ", bad[i].needle);
    run_free(&r);
  }
  run_result r = RUN("predict", env.model, "--input", images);
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint predict: ", "--checkpoint");
  run_free(&r);
  r = RUN("predict", env.model, "--checkpoint", ck, "--input", images, "--top", "0");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint predict: ", "--top");
  run_free(&r);
  free(wrong);
  free(cut);
  free(cutpgm);
}
END_TEST

/* --verbose: the kernel table of the evaluation pass first, and the kernel
 * of every node (on stderr with --json, whose stdout stays one object). */
START_TEST(verbose_prints_the_kernel_of_every_node) {
  run_result r = RUN("predict", env.model, "--checkpoint", ck, "--input", images, "--data",
                     env.data, "--limit", "1", "--verbose");
  ck_assert_msg(r.status == 0, "predict: %s", r.err);
  const char *table = strstr(r.out, "kernels (no pins):\n");
  ck_assert_msg(table != NULL, "%s", r.out);
  ck_assert_ptr_nonnull(strstr(table, "conv2d.fwd"));
  const char *nodes = strstr(table, "kernel of each node:\n");
  ck_assert_ptr_nonnull(nodes);
  ck_assert_ptr_nonnull(strstr(nodes, "conv1.fwd "));
  ck_assert_ptr_nonnull(strstr(nodes, "pool1.fwd "));
  ck_assert_ptr_nonnull(strstr(nodes, "/cpu\n"));
  /* before the predictions */
  ck_assert(nodes < strstr(r.out, "image  top  class  probability"));
  run_free(&r);
  r = RUN("predict", env.model, "--checkpoint", ck, "--input", images, "--data", env.data,
          "--limit", "1", "--verbose", "--json");
  ck_assert_msg(r.status == 0, "predict: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.err, "kernel of each node:\n"));
  char err[128];
  jm_value *v = jm_parse(r.out, r.out_len, err, sizeof err);
  ck_assert_msg(v != NULL, "predict --json --verbose: %s: %s", err, r.out);
  jm_free(v);
  run_free(&r);
  /* without --verbose: no table */
  r = RUN("predict", env.model, "--checkpoint", ck, "--input", images, "--data", env.data,
          "--limit", "1");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_null(strstr(r.out, "kernels ("));
  run_free(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("predict");
  TCase *c = tcase_create("core");
  tcase_set_timeout(c, 300);
  tcase_add_unchecked_fixture(c, setup, teardown);
  tcase_add_test(c, batch_one_predictions_give_evals_accuracy_on_the_same_images);
  tcase_add_test(c, a_pgm_image_gets_the_prediction_of_the_same_idx_image);
  tcase_add_test(c, bad_input_gets_one_line_and_a_failing_status);
  tcase_add_test(c, verbose_prints_the_kernel_of_every_node);
  suite_add_tcase(s, c);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
