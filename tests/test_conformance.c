/* The conformance suite: every non-reference kernel of every in-tree op
 * module against the reference kernel of its op, on every case of the
 * built-in table (validate/src/validate_cases.c), with validate's checks
 * (values within tolerance, every output element written, padding and the
 * tail untouched, accumulate, in place, determinism, no read past
 * slot_bytes), the way ggml's test-backend-ops runs every backend against
 * the CPU. A case a kernel's supports() refuses is reported, not failed;
 * each kernel must pass at least one case. One test per module, each
 * module loaded from its build path beside the reference module. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/validate.h"

static void conforms(const char *path, const char *impl) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  ck_assert_msg(bp_registry_load(r, BP_OPS_REFERENCE_PATH) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(bp_registry_load(r, path) == BP_OK, "%s: %s", path, bp_last_error());
  bp_validate_options o = {.impl = impl, .seed = 1, .isolate = 1};
  bp_validate_report *rep = NULL;
  ck_assert_msg(bp_validate_run(r, &o, &rep) == BP_OK, "%s", bp_last_error());
  int failed = 0;
  for (int i = 0; i < bp_validate_result_count(rep); i++) {
    const bp_validate_result *x = bp_validate_result_get(rep, i);
    if (x->verdict == BP_VALIDATE_FAIL) {
      fprintf(stderr, "FAIL %s/%s case '%s': %s\n", x->op, x->impl, x->case_name, x->detail);
      failed++;
    } else if (x->verdict == BP_VALIDATE_SKIP) {
      printf("  %s/%s case '%s' not supported: %s\n", x->op, x->impl, x->case_name, x->detail);
    }
  }
  /* every kernel of the module: at least one passing case */
  int kernels = 0;
  for (int k = 0; k < bp_registry_kernel_count(r); k++) {
    const bp_registered_kernel *rk = bp_registry_kernel(r, k);
    if (strcmp(rk->kernel.impl, impl) != 0) continue;
    kernels++;
    int passed = 0;
    for (int i = 0; i < bp_validate_result_count(rep); i++) {
      const bp_validate_result *x = bp_validate_result_get(rep, i);
      passed += strcmp(x->op, rk->kernel.op) == 0 && strcmp(x->impl, impl) == 0 &&
                x->verdict == BP_VALIDATE_PASS;
    }
    ck_assert_msg(passed > 0, "%s/%s passed no case", rk->kernel.op, impl);
  }
  const bp_validate_summary s = bp_validate_summarize(rep);
  printf("%s: %d kernels, %d cases: %d passed, %d failed, %d skipped\n", impl, s.kernels, s.cases,
         s.passed, s.failed, s.skipped);
  ck_assert_int_gt(kernels, 0);
  ck_assert_int_eq(failed, 0);
  bp_validate_report_destroy(rep);
  bp_registry_destroy(r);
}

START_TEST(ops_cpu_conforms_to_the_reference) { conforms(BP_OPS_CPU_PATH, "cpu"); }
END_TEST

#ifdef BP_OPS_BLAS_PATH
START_TEST(ops_blas_conforms_to_the_reference) { conforms(BP_OPS_BLAS_PATH, "blas"); }
END_TEST
#endif

#ifdef BP_OPS_DNNL_PATH
START_TEST(ops_dnnl_conforms_to_the_reference) { conforms(BP_OPS_DNNL_PATH, "dnnl"); }
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("conformance");
  TCase *tc = tcase_create("conformance");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, ops_cpu_conforms_to_the_reference);
#ifdef BP_OPS_BLAS_PATH
  tcase_add_test(tc, ops_blas_conforms_to_the_reference);
#endif
#ifdef BP_OPS_DNNL_PATH
  tcase_add_test(tc, ops_dnnl_conforms_to_the_reference);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
