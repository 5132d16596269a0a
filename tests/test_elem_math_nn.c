/* The layer section of ops/shared/elem_math.h (the per-element formulas
 * that ops/reference, ops/cpu and ops/cuda share): special values of each
 * formula, and small batch-norm and softmax-CE passes written only with
 * these formulas that must equal the reference kernels bit for bit (the
 * reference calls the same functions in the same order, so a formula
 * changed on one side only fails here). The GPU run then tests only the
 * indexing around them (tests/test_ops_cuda_nn.c). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref_util.h"
#include "shared/elem_math.h"

START_TEST(relu_keeps_nan_and_negative_zero) {
  ck_assert_uint_eq(bits_of(bp_relu_fwd(-0.0f)), bits_of(-0.0f)); /* -0 < 0 is false */
  ck_assert_uint_eq(bits_of(bp_relu_fwd(-1.5f)), bits_of(0.0f));
  ck_assert_uint_eq(bits_of(bp_relu_fwd(-INFINITY)), bits_of(0.0f));
  ck_assert_float_eq(bp_relu_fwd(2.5f), 2.5f);
  ck_assert(isnan(bp_relu_fwd(NAN)));
  ck_assert_float_eq(bp_relu_bwd(1.0f, -3.0f), -3.0f);
  ck_assert_uint_eq(bits_of(bp_relu_bwd(0.0f, 7.0f)), bits_of(0.0f)); /* y == 0: no gradient */
  ck_assert_uint_eq(bits_of(bp_relu_bwd(-0.0f, 7.0f)), bits_of(0.0f));
  ck_assert_uint_eq(bits_of(bp_relu_bwd(NAN, 7.0f)), bits_of(0.0f));
  ck_assert(isnan(bp_relu_bwd(1.0f, NAN)));
}
END_TEST

START_TEST(pooling_windows_scan_and_averages) {
  ck_assert_int_eq(bp_maxpool_takes(2.0f, 1.0f), 1);
  ck_assert_int_eq(bp_maxpool_takes(1.0f, 1.0f), 0); /* a tie keeps the earlier tap */
  ck_assert_int_eq(bp_maxpool_takes(0.5f, 1.0f), 0);
  ck_assert_int_eq(bp_maxpool_takes(NAN, 1.0f), 1);  /* NaN wins over a number */
  ck_assert_int_eq(bp_maxpool_takes(NAN, NAN), 0);   /* ... the first one */
  ck_assert_int_eq(bp_maxpool_takes(INFINITY, NAN), 0);
  int64_t k0, k1;
  bp_pool_taps(0, 2, 1, 3, 5, &k0, &k1); /* rows -1..1: tap 0 is padding */
  ck_assert_int_eq(k0, 1);
  ck_assert_int_eq(k1, 3);
  bp_pool_taps(2, 2, 1, 3, 5, &k0, &k1); /* rows 3..5: tap 2 is padding */
  ck_assert_int_eq(k0, 0);
  ck_assert_int_eq(k1, 2);
  ck_assert_float_eq(bp_avg_of(1.0, 3.0), (float)(1.0 / 3.0));
  ck_assert_float_eq(bp_avg_of(-7.0, 2.0), -3.5f);
}
END_TEST

START_TEST(batchnorm_formulas_on_known_values) {
  /* var 3, eps 1: invstd 1/2 */
  ck_assert_double_eq(bp_bn_invstd(3.0, 1.0f), 0.5);
  ck_assert_double_eq(bp_bn_gain(3.0, 0.5), 1.5);
  ck_assert_double_eq(bp_bn_shift(1.0, 2.0, 1.5), -2.0);
  ck_assert_double_eq(bp_bn_eval_scale(3.0, 3.0, 1.0f), 1.5);
  ck_assert_float_eq(bp_bn_apply(4.0f, 1.5, -2.0), 4.0f);
  /* momentum 0.5: halfway; the variance unbiased by M/(M-1) = 2 for M = 2 */
  ck_assert_float_eq(bp_bn_running_mean(2.0, 0.5f, 4.0), 3.0f);
  ck_assert_float_eq(bp_bn_running_var(1.0, 0.5f, 1.5, 2), 2.0f);
  ck_assert_float_eq(bp_bn_running_mean(2.0, 0.0f, 4.0), 2.0f); /* momentum 0: unchanged */
  ck_assert_double_eq(bp_bn_xhat(5.0f, 1.0, 0.5), 2.0);
  ck_assert_double_eq(bp_bn_dy_xhat(3.0, 5.0f, 1.0, 0.5), 6.0);
  /* k (dy - mdy - xhat mdyx) = 2 (1 - 0.5 - 2 * 0.25) = 0 */
  ck_assert_float_eq(bp_bn_dx(2.0, 1.0f, 2.0, 0.5, 0.25), 0.0f);
  ck_assert_float_eq(bp_bn_param_grad(1.0f, 2.5, 0), 2.5f);
  ck_assert_float_eq(bp_bn_param_grad(1.0f, 2.5, 1), 3.5f);
}
END_TEST

START_TEST(softmax_ce_formulas_on_known_values) {
  double on, off;
  bp_ce_targets(0.0f, 10, &on, &off);
  ck_assert_double_eq(on, 1.0);
  ck_assert_double_eq(off, 0.0);
  bp_ce_targets(0.5f, 4, &on, &off);
  ck_assert_double_eq(off, 0.125);
  ck_assert_double_eq(on, 0.625); /* the targets sum to 1 */
  ck_assert_double_eq(bp_ce_loss_term(0.5, 3.0, 1.0f), 1.0);
  ck_assert_float_eq(bp_ce_dlogit(0.75, 0.25, 0.5f, 1.0), 0.25f);
  ck_assert_float_eq(bp_ce_dlogit(0.75, 0.25, 0.5f, 1024.0), 256.0f); /* the loss scale */
}
END_TEST

/* ---- the reference kernels, bit for bit ------------------------------------------------- */

enum { BN_N = 3, BN_H = 4, BN_W = 5, BN_C = 7 };

/* batchnorm.fwd_train and .bwd with the formulas only (one channel at a
 * time; the sums in the reference's (n, h, w) order). */
START_TEST(batchnorm_reference_is_the_formulas) {
  uint64_t rng = 11;
  const int64_t M = BN_N * BN_H * BN_W;
  bp_batchnorm_attrs at = {1e-3f, 0.25f, 0};
  tt x = tt_new(BP_ABI_DTYPE_FP32, BN_N, BN_H, BN_W, BN_C, 1);
  tt y = tt_new(BP_ABI_DTYPE_FP32, BN_N, BN_H, BN_W, BN_C, 0);
  tt p[8], dy = tt_new(BP_ABI_DTYPE_FP32, BN_N, BN_H, BN_W, BN_C, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, BN_N, BN_H, BN_W, BN_C, 0);
  for (int i = 0; i < 8; i++) p[i] = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, BN_C, 0);
  /* p: gamma, beta, rm, rv, save_mean, save_invstd, dgamma, dbeta */
  tt_rand(&x, &rng, -2, 3), tt_rand(&dy, &rng, -1, 1);
  tt_rand(&p[0], &rng, 0.5, 1.5), tt_rand(&p[1], &rng, -1, 1);
  tt_rand(&p[2], &rng, -1, 1), tt_rand(&p[3], &rng, 0.5, 2);
  float rm0[BN_C], rv0[BN_C];
  for (int c = 0; c < BN_C; c++)
    rm0[c] = *tt_f(&p[2], 0, 0, 0, c), rv0[c] = *tt_f(&p[3], 0, 0, 0, c);
  ops_call tr = {"batchnorm.fwd_train", {&x, &p[0], &p[1], &p[2], &p[3]},
                 {&y, &p[4], &p[5], &p[2], &p[3]}, 5, 5, &at, sizeof at};
  ops_run(&tr);
  ops_call bw = {"batchnorm.bwd", {&x, &dy, &p[0], &p[4], &p[5]}, {&dx, &p[6], &p[7]}, 5, 3,
                 &at, sizeof at};
  ops_run(&bw);
  for (int c = 0; c < BN_C; c++) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < M; i++) mean += *tt_at(&x, i * BN_C + c);
    mean /= (double)M;
    for (int64_t i = 0; i < M; i++) {
      const double v = *tt_at(&x, i * BN_C + c);
      var += (v - mean) * (v - mean);
    }
    var /= (double)M;
    const double invstd = bp_bn_invstd(var, at.eps);
    const double scale = bp_bn_gain(*tt_f(&p[0], 0, 0, 0, c), invstd);
    const double shift = bp_bn_shift(*tt_f(&p[1], 0, 0, 0, c), mean, scale);
    ck_assert_uint_eq(bits_of(*tt_f(&p[4], 0, 0, 0, c)), bits_of((float)mean));
    ck_assert_uint_eq(bits_of(*tt_f(&p[5], 0, 0, 0, c)), bits_of((float)invstd));
    ck_assert_uint_eq(bits_of(*tt_f(&p[2], 0, 0, 0, c)),
                      bits_of(bp_bn_running_mean(rm0[c], at.momentum, mean)));
    ck_assert_uint_eq(bits_of(*tt_f(&p[3], 0, 0, 0, c)),
                      bits_of(bp_bn_running_var(rv0[c], at.momentum, var, M)));
    for (int64_t i = 0; i < M; i++)
      ck_assert_uint_eq(bits_of(*tt_at(&y, i * BN_C + c)),
                        bits_of(bp_bn_apply(*tt_at(&x, i * BN_C + c), scale, shift)));
    /* the backward from the saved statistics */
    const double sm = *tt_f(&p[4], 0, 0, 0, c), si = *tt_f(&p[5], 0, 0, 0, c);
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t i = 0; i < M; i++) {
      const double g = *tt_at(&dy, i * BN_C + c);
      sdy += g;
      sdyx += bp_bn_dy_xhat(g, *tt_at(&x, i * BN_C + c), sm, si);
    }
    ck_assert_uint_eq(bits_of(*tt_f(&p[6], 0, 0, 0, c)), bits_of(bp_bn_param_grad(0, sdyx, 0)));
    ck_assert_uint_eq(bits_of(*tt_f(&p[7], 0, 0, 0, c)), bits_of(bp_bn_param_grad(0, sdy, 0)));
    const double k = bp_bn_gain(*tt_f(&p[0], 0, 0, 0, c), si);
    for (int64_t i = 0; i < M; i++) {
      const double xhat = bp_bn_xhat(*tt_at(&x, i * BN_C + c), sm, si);
      ck_assert_uint_eq(bits_of(*tt_at(&dx, i * BN_C + c)),
                        bits_of(bp_bn_dx(k, *tt_at(&dy, i * BN_C + c), xhat, sdy / (double)M,
                                         sdyx / (double)M)));
    }
  }
  tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx);
  for (int i = 0; i < 8; i++) tt_free(&p[i]);
}
END_TEST

enum { CE_N = 5, CE_K = 9 };

START_TEST(softmax_ce_reference_is_the_formulas) {
  uint64_t rng = 5;
  bp_softmax_ce_attrs at = {0.2f, 1.0f / CE_N, 1, 1};
  tt z = tt_new(BP_ABI_DTYPE_FP32, CE_N, 1, 1, CE_K, 2);
  tt lab = tt_new(BP_ABI_DTYPE_INT32, CE_N, 1, 1, 1, 0);
  tt ls = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt loss = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt correct = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt dz = tt_new(BP_ABI_DTYPE_FP32, CE_N, 1, 1, CE_K, 0);
  tt_rand(&z, &rng, -4, 4);
  for (int n = 0; n < CE_N; n++) *tt_i32(&lab, n, 0, 0, 0) = (n * 4) % CE_K;
  *tt_f(&ls, 0, 0, 0, 0) = 64.0f;
  ops_call c = {"softmax_ce.fwd_bwd", {&z, &lab, &ls}, {&loss, &correct, &dz}, 3, 3, &at,
                sizeof at};
  ops_run(&c);
  double on, off, total = 0.0;
  bp_ce_targets(at.label_smoothing, CE_K, &on, &off);
  for (int n = 0; n < CE_N; n++) {
    int arg = 0;
    for (int k = 1; k < CE_K; k++)
      if (*tt_f(&z, n, 0, 0, k) > *tt_f(&z, n, 0, 0, arg)) arg = k;
    const double m = *tt_f(&z, n, 0, 0, arg);
    double sum = 0.0, ln = 0.0;
    for (int k = 0; k < CE_K; k++) sum += exp(*tt_f(&z, n, 0, 0, k) - m);
    const double lse = m + log(sum);
    const int y = *tt_i32(&lab, n, 0, 0, 0);
    for (int k = 0; k < CE_K; k++) {
      const double t = k == y ? on : off;
      const float zk = *tt_f(&z, n, 0, 0, k);
      if (t != 0.0) ln += bp_ce_loss_term(t, lse, zk);
      ck_assert_uint_eq(bits_of(*tt_f(&dz, n, 0, 0, k)),
                        bits_of(bp_ce_dlogit(exp(zk - lse), t, at.grad_scale, 64.0)));
    }
    total += ln;
  }
  ck_assert_uint_eq(bits_of(*tt_f(&loss, 0, 0, 0, 0)), bits_of((float)(0.0f + total)));
  tt_free(&z), tt_free(&lab), tt_free(&ls), tt_free(&loss), tt_free(&correct), tt_free(&dz);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("elem_math_nn");
  TCase *tc = tcase_create("elem_math_nn");
  tcase_add_test(tc, relu_keeps_nan_and_negative_zero);
  tcase_add_test(tc, pooling_windows_scan_and_averages);
  tcase_add_test(tc, batchnorm_formulas_on_known_values);
  tcase_add_test(tc, softmax_ce_formulas_on_known_values);
  tcase_add_test(tc, batchnorm_reference_is_the_formulas);
  tcase_add_test(tc, softmax_ce_reference_is_the_formulas);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
