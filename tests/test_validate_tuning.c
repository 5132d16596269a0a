/* Validate catches the held-out defects of issue 31 ("tuning you can
 * trust", tests/modules/tuning.c and gelu_layer.c), each with its case and
 * its reason named, and passes each defect's fixed twin:
 *   - state across calls (check 10): a kernel that caches its output keyed
 *     on (input pointer, params_generation), one that never repacks its
 *     weights after a generation bump;
 *   - threads (check 11): a chunking error that shows only with 2 or more
 *     threads, caught with one thread lent (BP_THREADS=1);
 *   - batches: an fc.fwd wrong only when N > 8 and N % 8 != 0;
 *   - FP16: an fc.fwd that truncates x and w to 7 mantissa bits;
 *   - gradcheck of a module layer's backward against central differences
 *     of its own forward. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/validate.h"
#include "run_util.h"

#define TUNING_PATH BP_TEST_MODULES "/tuning/tuning.so"
#define GELU_PATH BP_TEST_MODULES "/gelu_layer/gelu_layer.so"

static bp_validate_report *run_validate(bp_registry *r, const char *op, const char *impl,
                                        int threads, const char *dtype) {
  bp_validate_options o = {.op_glob = op, .impl = impl, .seed = 1, .isolate = 1,
                           .threads = threads, .dtype = dtype};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  return rep;
}

/* impl fails at least once, every failure naming its case and saying
 * `needle`; returns the number of failing rows. */
static int expect_caught(const bp_validate_report *rep, const char *impl, const char *needle) {
  int failed = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, impl) != 0 || x->verdict != BP_VALIDATE_FAIL) continue;
    failed++;
    ck_assert(x->case_name[0] != '\0' && strcmp(x->case_name, "-") != 0);
    ck_assert_msg(strstr(x->detail, needle) != NULL, "%s, case '%s': '%s' lacks '%s'", impl,
                  x->case_name, x->detail, needle);
  }
  ck_assert_msg(failed > 0, "%s was never caught", impl);
  return failed;
}

/* impl passes every case it runs (at least `min`). */
static void expect_passes(const bp_validate_report *rep, const char *impl, int min) {
  int passed = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, impl) != 0) continue;
    ck_assert_msg(x->verdict != BP_VALIDATE_FAIL, "%s, case '%s': %s", impl, x->case_name,
                  x->detail);
    passed += x->verdict == BP_VALIDATE_PASS;
  }
  ck_assert_msg(passed >= min, "%s passed %d cases, want at least %d", impl, passed, min);
}

/* ---- state across calls ------------------------------------------------------------- */

START_TEST(a_kernel_caching_its_output_by_input_pointer_and_generation_fails) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, TUNING_PATH}, 2);
  bp_validate_report *rep = run_validate(r, "fc.fwd", NULL, 0, "fp32");
  /* right on every fresh run: only the new inputs on the same buffers show it */
  const int stale = expect_caught(
      rep, "stale",
      "output did not follow new inputs with the same params_generation (the kernel caches "
      "state derived from its data inputs");
  int fc_cases = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++)
    fc_cases += strcmp(bp_validate_result_get(rep, i)->impl, "stale") == 0;
  ck_assert_int_eq(stale, fc_cases); /* every case */
  expect_caught(rep, "nogen",
                "output did not follow new parameters after a params_generation bump");
  /* packing the weights keyed on the generation is right */
  expect_passes(rep, "packed", fc_cases);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

START_TEST(validate_command_names_the_stale_cache) {
  run_result r = RUN("validate", "--plugin", TUNING_PATH, "--impl", "stale", "--dtype", "fp32");
  ck_assert_int_eq(r.status, 1);
  ck_assert_ptr_nonnull(strstr(r.out, "N3 1x1x7->5 bias"));
  ck_assert_ptr_nonnull(
      strstr(r.out, "FAIL: output did not follow new inputs with the same params_generation"));
  run_free(&r);
}
END_TEST

/* ---- batches ---------------------------------------------------------------------- */

/* N of a case named "N<n> ..." (the built-in fc cases). */
static int batch_of(const char *case_name) { return atoi(case_name + 1); }

START_TEST(an_fc_wrong_past_a_block_of_8_fails_on_the_batch_cases) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, TUNING_PATH}, 2);
  bp_validate_report *rep = run_validate(r, "fc.fwd", "tail8", 0, "fp32");
  int failed = 0, batches = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    ck_assert(x->case_name[0] == 'N');
    const int n = batch_of(x->case_name);
    const int wrong = n > 8 && n % 8 != 0;
    batches += strstr(x->case_name, "(batch)") != NULL;
    if (!wrong) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "N=%d, case '%s': %s", n, x->case_name,
                    x->detail);
      continue;
    }
    ck_assert_msg(x->verdict == BP_VALIDATE_FAIL, "N=%d, case '%s' passed", n, x->case_name);
    ck_assert_msg(strstr(x->detail, "differs from the reference: output 0 element (") != NULL,
                  "%s: %s", x->case_name, x->detail);
    failed++;
  }
  /* N = 17 .. 33: every residue mod 16; all but 24 and 32 wrong */
  ck_assert_int_eq(batches, 17);
  ck_assert_int_eq(failed, 15);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* validate --model M --batch B: the plan of batch B (and its last partial
 * batch), where the model's own batch hides the defect */
START_TEST(validate_model_batch_checks_the_runs_real_batch) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS
                           "train: {batch: 16, eval_batch: 8, train_size: 64}\n",
                           1, 1, 1);
  run_result r = RUN("validate", "--plugin", TUNING_PATH, "--impl", "tail8", "--model", e.model);
  ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
  ck_assert_ptr_null(strstr(r.out, "@train_last"));
  run_free(&r);
  /* batch 12: 12 rows per step, and a last batch of 64 % 12 = 4 */
  r = RUN("validate", "--plugin", TUNING_PATH, "--impl", "tail8", "--model", e.model, "--batch",
          "12");
  ck_assert_int_eq(r.status, 1);
  ck_assert_ptr_nonnull(strstr(r.out, "fc.fwd               tail8      cpu    "));
  ck_assert_ptr_nonnull(strstr(r.out, "FAIL: differs from the reference"));
  ck_assert_ptr_nonnull(strstr(r.out, "@train_last"));
  run_free(&r);
  r = RUN("validate", "--batch", "12");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint validate: ", "--batch needs --model");
  run_free(&r);
  r = RUN("validate", "--model", e.model, "--batch", "0");
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint validate: ", "--batch '0' is not a positive integer");
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* ---- threads ----------------------------------------------------------------------- */

/* One thread lent (BP_THREADS=1, or a one-core machine): the first run
 * cannot show a chunking error, check 11's runs at 2 and 3 threads do. */
START_TEST(a_chunking_error_fails_with_one_thread_lent) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, TUNING_PATH}, 2);
  bp_validate_report *rep = run_validate(r, "fc.fwd", NULL, 1, "fp32");
  expect_caught(rep, "chunks",
                " (the first run had 1; a result that depends on the thread count: a race "
                "between threads or a chunking error): ");
  int with2 = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strcmp(x->impl, "chunks") == 0 && x->verdict == BP_VALIDATE_FAIL)
      with2 += strncmp(x->detail, "with 2 threads", 14) == 0;
  }
  ck_assert_int_gt(with2, 0);
  expect_passes(rep, "chunked", 27);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- FP16 -------------------------------------------------------------------------- */

START_TEST(an_fp16_fc_truncating_to_7_mantissa_bits_fails) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, TUNING_PATH}, 2);
  bp_validate_report *rep = run_validate(r, "fc.fwd", NULL, 0, "fp16");
  const int caught = expect_caught(rep, "trunc7", "differs from the reference");
  ck_assert_int_ge(caught, 20); /* nearly every FP16 case */
  expect_passes(rep, "half", 27);
  expect_passes(rep, "reference", 27);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

/* ---- gradient checks of module layers ---------------------------------------------- */

START_TEST(a_module_layers_backward_missing_a_term_fails_gradcheck) {
  bp_registry *r = load_modules((const char *[]){BP_OPS_REFERENCE_PATH, GELU_PATH}, 2);
  bp_validate_options o = {.op_glob = "tgelu.*", .seed = 1, .isolate = 1, .gradcheck = 1};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  int noterm = 0, exact = 0, scale = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (strncmp(x->case_name, "gradcheck", 9) != 0) continue;
    if (strcmp(x->op, "tgelu.bwd") == 0 && strcmp(x->impl, "noterm") == 0) {
      ck_assert_msg(x->verdict == BP_VALIDATE_FAIL, "%s: %s", x->case_name, x->detail);
      ck_assert(strlen(x->case_name) > 10); /* "gradcheck <case>" */
      ck_assert_msg(strstr(x->detail, "the gradient of forward input 0 differs from central "
                                      "differences: error ") != NULL,
                    "%s", x->detail);
      noterm++;
    } else if (strcmp(x->op, "tgelu.bwd") == 0 && strcmp(x->impl, "exact") == 0) {
      ck_assert_msg(x->verdict == BP_VALIDATE_PASS, "%s: %s", x->case_name, x->detail);
      ck_assert(x->error <= 1e-3);
      exact++;
    } else if (strcmp(x->op, "tgelu.scale") == 0) {
      ck_assert_int_eq(x->verdict, BP_VALIDATE_SKIP);
      ck_assert_msg(strstr(x->detail, "no gradient check: tgelu.scale is neither the forward "
                                      "nor the backward op of a layer type") != NULL,
                    "%s", x->detail);
      scale++;
    }
  }
  ck_assert_int_eq(noterm, 3); /* one per case of tgelu.fwd's infer_shape */
  ck_assert_int_eq(exact, 3);
  ck_assert_int_eq(scale, 1);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("validate_tuning");
  TCase *tc = tcase_create("validate_tuning");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, a_kernel_caching_its_output_by_input_pointer_and_generation_fails);
  tcase_add_test(tc, validate_command_names_the_stale_cache);
  tcase_add_test(tc, an_fc_wrong_past_a_block_of_8_fails_on_the_batch_cases);
  tcase_add_test(tc, validate_model_batch_checks_the_runs_real_batch);
  tcase_add_test(tc, a_chunking_error_fails_with_one_thread_lent);
  tcase_add_test(tc, an_fp16_fc_truncating_to_7_mantissa_bits_fails);
  tcase_add_test(tc, a_module_layers_backward_missing_a_term_fails_gradcheck);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
