/* Learning-rate schedules (trainer/src/schedule.c), by hand-computed values. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "blueprint/train.h"

static bp_schedule make(bp_lr_schedule kind, double warmup) {
  return (bp_schedule){kind, 0.1, 0.5, 2, warmup, 10, 4}; /* 10 steps per epoch, 4 epochs */
}

START_TEST(constant_and_step) {
  bp_schedule s = make(BP_LR_CONSTANT, 0);
  ck_assert_double_eq(bp_schedule_lr(&s, 0), 0.1);
  ck_assert_double_eq(bp_schedule_lr(&s, 39), 0.1);
  s = make(BP_LR_STEP, 0); /* x0.5 every 2 epochs */
  ck_assert_double_eq(bp_schedule_lr(&s, 19), 0.1);
  ck_assert_double_eq(bp_schedule_lr(&s, 20), 0.05);
  ck_assert_double_eq(bp_schedule_lr(&s, 39), 0.05);
  ck_assert_double_eq(bp_schedule_lr(&s, 40), 0.025); /* past the end: the rule goes on */
}
END_TEST

START_TEST(cosine_with_warmup) {
  bp_schedule s = make(BP_LR_COSINE, 0);
  ck_assert_double_eq(bp_schedule_lr(&s, 0), 0.1);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 20), 0.05, 1e-15);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 40), 0.0, 1e-15);
  s = make(BP_LR_COSINE, 1); /* 10 warmup steps, then 30 of cosine */
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 0), 0.01, 1e-15);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 4), 0.05, 1e-15);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 9), 0.1, 1e-15);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 10), 0.1, 1e-15);
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 25), 0.05, 1e-15);
  s = make(BP_LR_STEP, 0.5); /* 5 warmup steps, then the steps of the epochs */
  ck_assert_double_eq_tol(bp_schedule_lr(&s, 1), 0.04, 1e-15);
  ck_assert_double_eq(bp_schedule_lr(&s, 5), 0.1);
  ck_assert_double_eq(bp_schedule_lr(&s, 25), 0.05);
}
END_TEST

/* Extreme counts saturate instead of overflowing (UBSan checks the
 * arithmetic in the sanitizer build); the rate stays finite. */
START_TEST(extreme_counts_do_not_overflow) {
  bp_schedule s = {BP_LR_COSINE, 0.1, 0.5, 1, 1e308, INT64_MAX / 2, INT64_MAX};
  for (int k = BP_LR_CONSTANT; k <= BP_LR_COSINE; k++) {
    s.kind = (bp_lr_schedule)k;
    ck_assert(isfinite(bp_schedule_lr(&s, 0)));
    ck_assert(isfinite(bp_schedule_lr(&s, INT64_MAX)));
  }
  s.warmup_epochs = 0;
  ck_assert(isfinite(bp_schedule_lr(&s, INT64_MAX)));
}
END_TEST

START_TEST(names) {
  bp_lr_schedule k;
  ck_assert_int_eq(bp_lr_schedule_from_name("cosine", &k), 0);
  ck_assert_int_eq(k, BP_LR_COSINE);
  ck_assert_int_eq(bp_lr_schedule_from_name("linear", &k), -1);
  ck_assert_int_eq(bp_lr_schedule_from_name(NULL, &k), -1);
  ck_assert_str_eq(bp_lr_schedule_name(BP_LR_STEP), "step");
  ck_assert_str_eq(bp_lr_schedule_name((bp_lr_schedule)9), "?");
}
END_TEST

int main(void) {
  Suite *s = suite_create("schedule");
  TCase *tc = tcase_create("schedule");
  tcase_add_test(tc, constant_and_step);
  tcase_add_test(tc, cosine_with_warmup);
  tcase_add_test(tc, names);
  tcase_add_test(tc, extreme_counts_do_not_overflow);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
