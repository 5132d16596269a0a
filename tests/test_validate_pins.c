/* Issue 31 beyond autotune's timing: what a run trusts without timing it,
 * and what validate runs at more threads and through module layers:
 *   - a pinned kernel (--kernels, BP_KERNELS, the model file's kernels)
 *     runs validate's checks on its node's shapes before the run starts:
 *     one that fails stops train, eval and predict in one line naming the
 *     node, the kernel and the reason, nothing written; --trust-pins runs
 *     it; its fixed twin passes (tests/modules/tuning.c);
 *   - a right but slow kernel of a module that does not ship with
 *     blueprint, picked by priority, is reported in the kernel table with
 *     the default pick it beat and the ratio (tests/modules/pins.c, slow);
 *     a run of the shipped modules only reports nothing;
 *   - check 11 runs every case at 1, 2, 3, 4 and twice the cores: a kernel
 *     wrong only with 4 or more threads fails with one thread lent
 *     (pins.c, wide4), its fixed twin passes;
 *   - the gradient check of a module layer with a saved tensor: a backward
 *     that misreads the saved tensor fails, the right one passes
 *     (tests/modules/saved_layer.c);
 *   - validate --model --batch also checks the evaluation batch's nodes. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/validate.h"
#include "run_util.h"

#define TUNING_PATH BP_TEST_MODULES "/tuning/tuning.so"
#define SLOW_PATH BP_TEST_MODULES "/pins/slow.so"
#define THREADS4_PATH BP_TEST_MODULES "/pins/threads4.so"
#define SAVED_PATH BP_TEST_MODULES "/saved_layer/saved_layer.so"

/* fc layers only: every node of fc.fwd is one the pins below decide. */
#define FC_MODEL_LAYERS                                                      \
  "name: tiny\n"                                                             \
  "input: {height: 28, width: 28, channels: 1, classes: 10}\n"               \
  "layers:\n"                                                                \
  "  - {type: fc, name: fc1, units: 16}\n"                                   \
  "  - {type: relu, name: relu1}\n"                                          \
  "  - {type: fc, name: fc2, units: 10}\n"                                   \
  "  - {type: softmax_ce, name: loss, label_smoothing: 0.0}\n"
#define FC_MODEL FC_MODEL_LAYERS "train: {batch: 16, eval_batch: 16, epochs: 1}\n"

#define STALE_WHY "output did not follow new inputs with the same params_generation"

/* ---- pinned kernels ------------------------------------------------------------------ */

START_TEST(a_pinned_kernel_that_fails_the_checks_stops_train_before_it_writes) {
  toy_env e = toy_env_open(FC_MODEL, 48, 16, 5);
  char *metrics = path_in(e.dir, "m.jsonl"), *ckpt = path_in(e.dir, "c.bin");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--plugin", TUNING_PATH, "--kernels",
                       "fc.fwd=stale", "--metrics", metrics, "--checkpoint", ckpt);
  expect_one_line_error(&r, "blueprint train: ", STALE_WHY);
  ck_assert_msg(strstr(r.err, "node 'fc1.fwd'") && strstr(r.err, "fc.fwd/stale/cpu") &&
                    strstr(r.err, "pinned by 'fc.fwd=stale'") && strstr(r.err, "--trust-pins"),
                "%s", r.err);
  size_t size = 0;
  ck_assert_ptr_null(read_file(metrics, &size)); /* nothing written */
  ck_assert_ptr_null(read_file(ckpt, &size));
  run_free(&r);
  /* --trust-pins: the user said so; the run goes on (the cache is right in training) */
  r = RUN_T("train", e.model, "--data", e.data, "--plugin", TUNING_PATH, "--kernels",
            "fc.fwd=stale", "--trust-pins", "--quiet");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  /* the fixed twin passes the same check */
  r = RUN_T("train", e.model, "--data", e.data, "--plugin", TUNING_PATH, "--kernels",
            "fc.fwd=packed", "--checkpoint", ckpt);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "fc.fwd") && strstr(r.out, "packed"), "%s", r.out);
  run_free(&r);
  /* eval and predict check pins too */
  r = RUN_T("eval", e.model, "--checkpoint", ckpt, "--data", e.data, "--plugin", TUNING_PATH,
            "--kernels", "fc.fwd=nogen");
  expect_one_line_error(&r, "blueprint eval: ", "after a params_generation bump");
  run_free(&r);
  r = RUN_T("eval", e.model, "--checkpoint", ckpt, "--data", e.data, "--plugin", TUNING_PATH,
            "--kernels", "fc.fwd=nogen", "--trust-pins", "--quiet");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  char *idx = path_in(e.data, "t10k-images-idx3-ubyte");
  r = RUN_T("predict", e.model, "--checkpoint", ckpt, "--input", idx, "--limit", "2",
            "--plugin", TUNING_PATH, "--kernels", "fc.fwd=stale");
  expect_one_line_error(&r, "blueprint predict: ", STALE_WHY);
  run_free(&r);
  free(idx);
  free(metrics);
  free(ckpt);
  toy_env_close(&e);
}
END_TEST

START_TEST(pins_from_the_environment_and_the_model_file_are_checked_too) {
  toy_env e = toy_env_open(FC_MODEL_LAYERS
                           "train: {batch: 16, eval_batch: 16, epochs: 1, kernels: "
                           "\"fc.fwd=stale\"}\n",
                           48, 16, 5);
  run_result r = RUN_T("train", e.model, "--data", e.data, "--plugin", TUNING_PATH);
  expect_one_line_error(&r, "blueprint train: ", STALE_WHY);
  run_free(&r);
  setenv("BP_KERNELS", "fc.fwd=nogen", 1);
  r = RUN_T("train", e.model, "--data", e.data, "--plugin", TUNING_PATH);
  unsetenv("BP_KERNELS");
  expect_one_line_error(&r, "blueprint train: ", "after a params_generation bump");
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* A pinned kernel that crashes or calls exit() in its check: one line
 * naming it and the node, then the signal, or exit status 70 (never 0). */
START_TEST(a_pinned_kernel_that_crashes_in_its_check_is_named) {
  toy_env e = toy_env_open(FC_MODEL, 48, 16, 5);
  static const struct {
    int k, status;
    const char *what;
  } cases[] = {{1, 128 + SIGSEGV, "SIGSEGV in "},
               {2, 128 + SIGABRT, "SIGABRT in "},
               {3, 70, "exit() called by "}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "hostile/hostile%d.so", cases[i].k);
    char *mod = path_in(BP_TEST_MODULES, name);
    run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--plugin", mod,
                         "--kernels", "relu.fwd=hostile");
    ck_assert_msg(r.status == cases[i].status, "case %d: status %d (stderr: %s)", cases[i].k,
                  r.status, r.err);
    char want[4300];
    snprintf(want, sizeof want,
             "blueprint: %sthe pinned kernel relu.fwd/hostile/cpu (module %s) during its check "
             "on node 'relu1.fwd' (--trust-pins skips the check)\n",
             cases[i].what, mod);
    ck_assert_msg(strstr(r.err, want) != NULL, "want [%s] in [%s]", want, r.err);
    run_free(&r);
    free(mod);
  }
  toy_env_close(&e);
}
END_TEST

/* ---- priority picks ----------------------------------------------------------------- */

START_TEST(a_slow_kernel_picked_by_priority_is_reported_in_the_kernel_table) {
  toy_env e = toy_env_open(FC_MODEL, 48, 16, 5);
  char *metrics = path_in(e.dir, "m.jsonl");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--plugin", SLOW_PATH, "--metrics",
                       metrics);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  size_t size = 0;
  char *text = (char *)read_file(metrics, &size); /* the "kernels" line carries it too */
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(strstr(text, "\"warnings\":[\"fc.fwd: slow (priority 30) was picked by "
                             "priority") != NULL,
                "%.600s", text);
  free(text);
  free(metrics);
  const char *w = strstr(r.out, "  warning: fc.fwd: slow (priority 30) was picked by priority, "
                                "but took ");
  ck_assert_msg(w != NULL, "no warning in the kernel table:\n%s", r.out);
  ck_assert_msg(strstr(w, "x the time of the default pick ") && strstr(w, "on node 'fc") &&
                    strstr(w, "--kernels fc.fwd="),
                "%s", w);
  /* the ratio is printed and at least the threshold */
  const char *took = strstr(w, "but took ") + strlen("but took ");
  ck_assert_msg(strtod(took, NULL) >= 3.0, "%s", w);
  run_free(&r);
  /* the shipped modules only: nothing to report, and nothing timed */
  r = RUN_T("train", e.model, "--data", e.data);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "warning") == NULL, "%s", r.out);
  run_free(&r);
  /* pinned, the slow kernel is the user's choice: checked, passes, not reported */
  r = RUN_T("train", e.model, "--data", e.data, "--plugin", SLOW_PATH, "--kernels",
            "fc.fwd=slow");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "warning") == NULL, "%s", r.out);
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* ---- check 11 at 4 threads and twice the cores ---------------------------------------- */

START_TEST(a_kernel_wrong_only_at_four_threads_fails_with_one_thread_lent) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, THREADS4_PATH}, 2);
  /* one thread lent: before, check 11 ran it at 2 and 3 threads only */
  bp_validate_options o = {.op_glob = "fc.fwd", .seed = 1, .isolate = 1, .threads = 1,
                           .dtype = "fp32"};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  int wide4 = 0, wide4ok = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "wide4ok") == 0) {
      ck_assert_msg(x->verdict != BP_VALIDATE_FAIL, "%s: %s", x->case_name, x->detail);
      wide4ok += x->verdict == BP_VALIDATE_PASS;
    } else if (strcmp(x->impl, "wide4") == 0 && x->verdict == BP_VALIDATE_FAIL) {
      ck_assert_msg(strstr(x->detail, "with 4 threads (the first run had 1; a result that "
                                      "depends on the thread count") != NULL,
                    "%s: %s", x->case_name, x->detail);
      wide4++;
    }
  }
  ck_assert_msg(wide4 > 0, "wide4 was never caught");
  ck_assert_int_ge(wide4ok, 10);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- gradient checks of module layers with saved tensors ------------------------------ */

START_TEST(a_module_layers_backward_misreading_its_saved_tensor_fails_gradcheck) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, SAVED_PATH}, 2);
  bp_validate_options o = {.op_glob = "tsave.*", .seed = 1, .isolate = 1, .gradcheck = 1};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  int squared = 0, right = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strncmp(x->case_name, "gradcheck", 9) != 0) continue;
    ck_assert_msg(strcmp(x->impl, "-") != 0, "a skip row: %s", x->detail);
    if (strcmp(x->impl, "squared") == 0) {
      ck_assert_msg(x->verdict == BP_VALIDATE_FAIL, "%s: %s", x->case_name, x->detail);
      ck_assert_msg(strstr(x->detail, "the gradient of forward input 0 differs from central "
                                      "differences: error ") != NULL,
                    "%s", x->detail);
      squared++;
    } else if (strcmp(x->impl, "right") == 0) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
      right++;
    }
  }
  ck_assert_int_eq(squared, 3); /* one per case of tsave.fwd's infer_shape */
  ck_assert_int_eq(right, 3);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- validate --model --batch ---------------------------------------------------------- */

START_TEST(validate_model_batch_checks_the_evaluation_batch_too) {
  toy_env e = toy_env_open(FC_MODEL_LAYERS "train: {batch: 16, eval_batch: 12, epochs: 1, "
                                           "train_size: 40}\n",
                           8, 8, 5);
  run_result r = RUN_T("validate", "--model", e.model, "--batch", "16", "--impl", "reference",
                       "--op", "fc.fwd");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "@train_last") != NULL, "%s", r.out); /* 40 = 2 * 16 + 8 */
  ck_assert_msg(strstr(r.out, "@eval") != NULL, "%s", r.out);
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("validate_pins");
  TCase *tc = tcase_create("validate_pins");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, a_pinned_kernel_that_fails_the_checks_stops_train_before_it_writes);
  tcase_add_test(tc, pins_from_the_environment_and_the_model_file_are_checked_too);
  tcase_add_test(tc, a_pinned_kernel_that_crashes_in_its_check_is_named);
  tcase_add_test(tc, a_slow_kernel_picked_by_priority_is_reported_in_the_kernel_table);
  tcase_add_test(tc, a_kernel_wrong_only_at_four_threads_fails_with_one_thread_lent);
  tcase_add_test(tc, a_module_layers_backward_misreading_its_saved_tensor_fails_gradcheck);
  tcase_add_test(tc, validate_model_batch_checks_the_evaluation_batch_too);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
