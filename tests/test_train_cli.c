/* Bad input to `blueprint train` and `blueprint eval`: each is refused with
 * exactly one line on stderr ("blueprint train: ..."), a non-zero exit
 * status (2 for the command line, 1 for files, data, devices and kernels)
 * and never a crash. Runs on a small generated data set. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json_mini.h"
#include "run_util.h"

static char *dir, *data, *mlp;

static void setup(void) {
  dir = tmp_dir_create();
  data = path_in(dir, "data");
  ck_assert_int_eq(mkdir(data, 0700), 0);
  write_toy_mnist(data, 64, 32, 3);
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  mlp = path_in(src, "models/mlp.yaml");
}

static void teardown(void) {
  free(data);
  free(mlp);
  tmp_dir_remove(dir);
}

#define REFUSED(status_want, prefix, needle, ...)                                          \
  do {                                                                                     \
    run_result r_ = RUN(__VA_ARGS__);                                                      \
    expect_one_line_error(&r_, prefix, needle);                                            \
    ck_assert_msg(r_.status == (status_want), "line %d: status %d, want %d: %s", __LINE__, \
                  r_.status, status_want, r_.err);                                         \
    run_free(&r_);                                                                         \
  } while (0)

#define T "blueprint train: "
#define E "blueprint eval: "

START_TEST(command_line_errors) {
  REFUSED(2, T, "no model file given", "train");
  REFUSED(2, T, "'abc' is not an integer in [1, 1000000]", "train", mlp, "--epochs", "abc");
  REFUSED(2, T, "--epochs: '0' is not an integer in [1, 1000000]", "train", mlp, "--epochs", "0");
  /* every numeric option has a stated range, and the message states it */
  REFUSED(2, T, "--epochs: '9223372036854775807' is out of range [1, 1000000]", "train", mlp,
          "--epochs", "9223372036854775807");
  REFUSED(2, T, "--lr: '1e308' is out of range [0, 1000000]", "train", mlp, "--lr", "1e308");
  REFUSED(2, T, "--warmup-epochs: '1e308' is out of range [0, 1000000]", "train", mlp,
          "--warmup-epochs", "1e308");
  REFUSED(2, T, "--step-gamma: '2e6' is out of range [0, 1000000]", "train", mlp, "--step-gamma",
          "2e6");
  REFUSED(2, T, "--crop-pad: '5000' is out of range [0, 1024]", "train", mlp, "--crop-pad", "5000");
  REFUSED(2, T, "--batch: '9999999999999' is out of range [1, 1099511627776]", "train", mlp,
          "--batch", "9999999999999");
  REFUSED(2, T, "--batch: '1.5'", "train", mlp, "--batch", "1.5");
  REFUSED(2, T, "--lr: '-1' is not a number in [0, 1000000]", "train", mlp, "--lr", "-1");
  REFUSED(2, T, "--lr: 'nan'", "train", mlp, "--lr", "nan");
  REFUSED(2, T, "--momentum: '1'", "train", mlp, "--momentum", "1");
  REFUSED(2, T, "--ranks: '0' is not a positive integer", "train", mlp, "--ranks", "0");
  REFUSED(2, T, "--ranks 65: must be in [1, 64]", "train", mlp, "--ranks", "65");
  REFUSED(2, T, "unknown schedule 'linear'", "train", mlp, "--schedule", "linear");
  REFUSED(2, T, "unknown optimizer 'sgdd'", "train", mlp, "--optimizer=sgdd");
  REFUSED(2, T, "--devices: 'a'", "train", mlp, "--devices", "a");
  REFUSED(2, T, "unknown option '--bogus'", "train", mlp, "--bogus");
  REFUSED(2, T, "option '--epochs' needs a value", "train", mlp, "--epochs");
  REFUSED(2, T, "option '--flip' takes no value", "train", mlp, "--flip=1");
  REFUSED(2, T, "unexpected argument", "train", mlp, mlp);
  REFUSED(2, T, "--stop-after-steps needs --checkpoint", "train", mlp, "--stop-after-steps", "3");
  REFUSED(2, T, "--seed: '-3'", "train", mlp, "--seed", "-3");
  REFUSED(2, E, "--checkpoint FILE is required", "eval", mlp);
  REFUSED(2, E, "unknown option '--resume'", "eval", mlp, "--resume", "x");
  REFUSED(2, E, "unknown option '--epochs'", "eval", mlp, "--epochs", "2");
}
END_TEST

START_TEST(run_time_errors) {
  REFUSED(1, T, "/nonexistent/model.yaml", "train", "/nonexistent/model.yaml");
  REFUSED(1, T, "/nonexistent/data", "train", mlp, "--data", "/nonexistent/data");
  REFUSED(1, T, "device 'cuda'", "train", mlp, "--data", data, "--device", "cuda");
  REFUSED(1, T, "unknown device 'tpu'", "train", mlp, "--data", data, "--device", "tpu");
  REFUSED(1, T, "names no registered kernel 'nosuch'", "train", mlp, "--data", data, "--kernels",
          "fc.fwd=nosuch");
  REFUSED(1, T, "not OP_GLOB=IMPL", "train", mlp, "--data", data, "--kernels", "garbage");
  /* loss scaling without mixed precision (the model could have turned it on) */
  REFUSED(1, T, "mixed precision only", "train", mlp, "--data", data, "--loss-scale", "8");
  char *bad = path_in(dir, "bad.yaml");
  FILE *f = fopen(bad, "w");
  ck_assert_ptr_nonnull(f);
  fputs(
      "input: {height: 28, width: 28, channels: 1, classes: 10}\nlayers:\n"
      "  - {type: fc, units: 0}\n  - {type: softmax_ce}\n",
      f);
  fclose(f);
  REFUSED(1, T, "bad.yaml:3", "train", bad, "--data", data);
  char *metrics = path_in(dir, "no/such/dir/m.jsonl");
  REFUSED(1, T, "no/such/dir/m.jsonl", "train", mlp, "--data", data, "--metrics", metrics);
  REFUSED(1, E, "/nonexistent.ckpt", "eval", mlp, "--data", data, "--checkpoint",
          "/nonexistent.ckpt");
  /* pins in the model file; --kernels overrides them */
  char *pinned = path_in(dir, "pinned.yaml");
  f = fopen(pinned, "w");
  ck_assert_ptr_nonnull(f);
  fputs(
      "input: {height: 28, width: 28, channels: 1, classes: 10}\nlayers:\n"
      "  - {type: fc, units: 10}\n  - {type: softmax_ce}\n"
      "train: {kernels: \"fc.*=nosuch\"}\n",
      f);
  fclose(f);
  REFUSED(1, T, "names no registered kernel 'nosuch'", "train", pinned, "--data", data);
  run_result r = RUN("train", pinned, "--data", data, "--epochs", "1", "--kernels", "*=reference");
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  free(pinned);
  free(bad);
  free(metrics);
}
END_TEST

START_TEST(help_and_success) {
  run_result r = RUN("train", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "usage: blueprint train MODEL"));
  ck_assert_ptr_nonnull(strstr(r.out, "--stop-after-steps"));
  run_free(&r);
  r = RUN("eval", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "usage: blueprint eval MODEL --checkpoint FILE"));
  run_free(&r);
  /* output that is not a terminal: whole lines only, no progress bar */
  r = RUN("train", mlp, "--data", data, "--epochs", "1", "--batch", "32");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_ptr_null(strchr(r.out, '\r'));
  ck_assert_ptr_nonnull(strstr(r.out, "model mlp: 64 training and 32 test images, batch 32"));
  ck_assert_ptr_nonnull(strstr(r.out, "epoch 1/1  train loss "));
  ck_assert_ptr_nonnull(strstr(r.out, "\ntest accuracy "));
  run_free(&r);
}
END_TEST

START_TEST(help_prints_options_as_written) {
  run_result r = RUN("train", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_msg(strstr(r.out, "the first B % R ranks one more") != NULL, "%s", r.out);
  ck_assert_msg(strstr(r.out, "%%") == NULL, "a printf escape printed literally:\n%s", r.out);
  ck_assert_ptr_nonnull(strstr(r.out, "--verbose"));
  run_free(&r);
  r = RUN("eval", "--help");
  ck_assert_int_eq(r.status, 0);
  ck_assert_ptr_null(strstr(r.out, "%%"));
  ck_assert_ptr_nonnull(strstr(r.out, "--verbose"));
  run_free(&r);
}
END_TEST

/* The GPU kernel switches (read by the CUDA op modules through the
 * environment) are flags of train and eval, listed in both helps; on the
 * CPU they change nothing. */
START_TEST(gpu_kernel_switches_are_flags) {
  REFUSED(2, T, "option '--no-tf32' takes no value", "train", mlp, "--no-tf32=0");
  REFUSED(2, E, "option '--deterministic' takes no value", "eval", mlp, "--deterministic=1");
  run_result r = RUN("train", mlp, "--data", data, "--epochs", "1", "--batch", "32",
                     "--deterministic", "--no-tf32");
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  const char *const cmds[2] = {"train", "eval"};
  for (int i = 0; i < 2; i++) {
    r = RUN(cmds[i], "--help");
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(strstr(r.out, "--deterministic") && strstr(r.out, "--no-tf32"), "%s", r.out);
    run_free(&r);
  }
}
END_TEST

/* The string member `key` of object o ("" when absent or not a string). */
static const char *str_of(const jm_value *o, const char *key) {
  const jm_value *v = jm_get(o, key);
  return v && v->kind == JM_STRING ? v->text : "";
}

START_TEST(kernel_report_in_table_metrics_and_eval) {
  char *metrics = path_in(dir, "k.jsonl"), *ckpt = path_in(dir, "k.ckpt");
  run_result r = RUN("train", mlp, "--data", data, "--epochs", "1", "--batch", "32", "--metrics",
                     metrics, "--checkpoint", ckpt, "--kernels", "fc.*=reference");
  ck_assert_msg(r.status == 0, "%s", r.err);
  /* the table: one line per (op, impl, device) with its node count */
  ck_assert_msg(strstr(r.out, "kernels (pins from --kernels: fc.*=reference):\n") != NULL, "%s",
                r.out);
  ck_assert_msg(strstr(r.out, "  fc.fwd ") && strstr(r.out, " reference ") &&
                    strstr(r.out, " nodes") && !strstr(r.out, "kernel of each node"),
                "%s", r.out);
  run_free(&r);

  /* the metrics file starts with the kernels line, whatever the printing */
  size_t size = 0;
  char *text = (char *)read_file(metrics, &size);
  ck_assert_ptr_nonnull(text);
  char *nl = strchr(text, '\n');
  ck_assert_ptr_nonnull(nl);
  char err[256];
  jm_value *k = jm_parse(text, (size_t)(nl - text), err, sizeof err);
  ck_assert_msg(k != NULL, "%s: %.200s", err, text);
  ck_assert_str_eq(str_of(k, "event"), "kernels");
  ck_assert_str_eq(str_of(k, "device"), "cpu");
  ck_assert_str_eq(str_of(k, "pins"), "fc.*=reference");
  ck_assert_str_eq(str_of(k, "pins_source"), "option");
  ck_assert_int_eq(jm_get(k, "autotune")->kind, JM_BOOL);
  ck_assert_uint_eq(jm_get(k, "warnings")->count, 0);
  const jm_value *nodes = jm_get(k, "nodes"), *ops = jm_get(k, "ops");
  ck_assert(nodes && nodes->kind == JM_ARRAY && nodes->count > 4);
  int fc = 0, forward = 0;
  for (size_t i = 0; i < nodes->count; i++) {
    const jm_value *n = jm_at(nodes, i);
    static const char *const keys[] = {"variant", "segment", "node", "op", "impl", "device"};
    for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++)
      ck_assert_msg(str_of(n, keys[j])[0], "node %zu lacks %s", i, keys[j]);
    ck_assert_ptr_nonnull(jm_get(n, "rank"));
    if (!strncmp(str_of(n, "op"), "fc.", 3)) {
      ck_assert_str_eq(str_of(n, "impl"), "reference");
      fc++;
    }
    forward += !strcmp(str_of(n, "variant"), "train") && !strcmp(str_of(n, "segment"), "forward");
  }
  ck_assert_int_gt(fc, 0);
  ck_assert_int_gt(forward, 0);
  uint64_t total = 0;
  for (size_t i = 0; i < ops->count; i++) {
    uint64_t c = 0;
    ck_assert_int_eq(jm_u64(jm_get(jm_at(ops, i), "nodes"), &c), 0);
    ck_assert_str_ne(str_of(jm_at(ops, i), "module"), "");
    total += c;
  }
  ck_assert_uint_eq(total, nodes->count);
  jm_free(k);
  ck_assert_ptr_nonnull(strstr(nl, "\"event\":\"epoch\"")); /* the other lines follow */
  free(text);

  /* --verbose: every node; --quiet: no table; eval: only its variants */
  r = RUN("eval", mlp, "--data", data, "--batch", "32", "--checkpoint", ckpt, "--verbose");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "kernels (no pins):\n") && strstr(r.out, "kernel of each node:\n") &&
                    strstr(r.out, " eval/eval ") && !strstr(r.out, "train/") &&
                    !strstr(r.out, ".bwd"),
                "%s", r.out);
  run_free(&r);
  r = RUN("eval", mlp, "--data", data, "--batch", "32", "--checkpoint", ckpt, "--quiet");
  ck_assert_msg(r.status == 0 && !strstr(r.out, "kernels ("), "%s%s", r.out, r.err);
  run_free(&r);
  free(metrics);
  free(ckpt);
}
END_TEST

START_TEST(dead_pins_and_refused_modules_are_mentioned) {
  char *metrics = path_in(dir, "w.jsonl");
  /* relu.fwd=cpu can never apply: relu.*=reference is matched first */
  run_result r = RUN("train", mlp, "--data", data, "--epochs", "1", "--quiet", "--metrics",
                     metrics, "--kernels", "relu.*=reference,relu.fwd=cpu");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.err, "blueprint train: warning: pin 'relu.fwd=cpu' (--kernels) never "
                              "applies") &&
                    strstr(r.err, "'relu.*=reference'"),
                "%s", r.err);
  run_free(&r);
  size_t size = 0;
  char *text = (char *)read_file(metrics, &size);
  ck_assert_ptr_nonnull(strstr(text, "\"warnings\":[\"pin 'relu.fwd=cpu' (--kernels) never"));
  free(text);
  free(metrics);
  /* a module found through BP_PLUGIN_PATH that is refused: one note */
  char path[1024];
  snprintf(path, sizeof path, "%s/refused", BP_TEST_MODULES);
  setenv("BP_PLUGIN_PATH", path, 1);
  r = RUN("train", mlp, "--data", data, "--epochs", "1", "--quiet");
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.err, "blueprint train: note: 1 module on BP_PLUGIN_PATH was refused; "
                              "see `blueprint plugins`\n") != NULL,
                "%s", r.err);
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_cli");
  TCase *tc = tcase_create("train_cli");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, command_line_errors);
  tcase_add_test(tc, run_time_errors);
  tcase_add_test(tc, help_and_success);
  tcase_add_test(tc, help_prints_options_as_written);
  tcase_add_test(tc, gpu_kernel_switches_are_flags);
  tcase_add_test(tc, kernel_report_in_table_metrics_and_eval);
  tcase_add_test(tc, dead_pins_and_refused_modules_are_mentioned);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
