/* softmax_ce reference kernel: loss, correct count (ties), gradient and
 * grad_scale by hand, label smoothing, accumulation of loss and correct,
 * large logits, the gradient against central finite differences of the
 * loss, bad labels and the refusals of supports(). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

typedef struct ce {
  tt z, lab, loss, correct, dz;
} ce;

static ce ce_new(int n, int k, int extra) {
  ce c = {tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, k, extra), tt_new(BP_ABI_DTYPE_INT32, n, 1, 1, 1, extra),
          tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, extra),
          tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, k, 2 * extra)};
  return c;
}
static void ce_free(ce *c) {
  tt *all[] = {&c->z, &c->lab, &c->loss, &c->correct, &c->dz};
  for (int i = 0; i < 5; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
static ops_call ce_call(ce *c, const bp_softmax_ce_attrs *a) {
  ops_call call = {"softmax_ce.fwd_bwd", {&c->z, &c->lab}, {&c->loss, &c->correct, &c->dz}, 2,
                   2 + a->compute_grad, a, sizeof *a};
  return call;
}

START_TEST(by_hand_with_accumulation) {
  for (int extra = 0; extra <= 3; extra += 3) {
    /* row 0: z = [0 0 0], label 1: softmax 1/3 each, loss ln 3; argmax is a
     *        three-way tie, the first (0) wins -> not correct
     * row 1: z = [0 ln3 0], label 1: softmax [1/5 3/5 1/5], loss -ln(3/5) = ln5 - ln3; correct
     * batch loss = ln 5 = 1.6094379; correct = 1
     * loss and correct start at 10 and 3 (accumulate) -> 11.6094379, 4
     * grad_scale 0.5: dz row 0 = ([1/3 1/3 1/3] - [0 1 0]) * 0.5 = [1/6 -1/3 1/6]
     *                 dz row 1 = ([.2 .6 .2] - [0 1 0]) * 0.5 = [0.1 -0.2 0.1] */
    ce c = ce_new(2, 3, extra);
    tt_set(&c.z, (const float[]){0, 0, 0, 0, 1.0986122887f, 0});
    *tt_i32(&c.lab, 0, 0, 0, 0) = 1, *tt_i32(&c.lab, 1, 0, 0, 0) = 1;
    *tt_at(&c.loss, 0) = 10, *tt_at(&c.correct, 0) = 3;
    bp_softmax_ce_attrs a = {0, 0.5f, 1, 0};
    ops_call call = ce_call(&c, &a);
    ops_run(&call);
    ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 11.6094379f, 2e-6f);
    ck_assert_float_eq(*tt_at(&c.correct, 0), 4.0f);
    ops_expect_close(&c.dz, (const float[]){1.0f / 6, -1.0f / 3, 1.0f / 6, 0.1f, -0.2f, 0.1f}, 1e-7, "dz");
    ce_free(&c);
  }
}
END_TEST

START_TEST(label_smoothing_by_hand) {
  /* s = 0.3, K = 3: target = 0.1 off the label, 0.8 on it
   * row 0: z = [0 0 0], label 1: loss = sum t * ln 3 = ln 3 = 1.0986123
   * row 1: z = [0 ln3 0], label 1: lse = ln 5; loss = 0.1 ln5 + 0.8 (ln5 - ln3) + 0.1 ln5
   *        = ln 5 - 0.8 ln 3 = 0.7305481
   * batch loss = 1.8291604; grad_scale 1:
   * dz row 0 = [1/3 - 0.1, 1/3 - 0.8, 1/3 - 0.1] = [0.2333333 -0.4666667 0.2333333]
   * dz row 1 = [0.2 - 0.1, 0.6 - 0.8, 0.2 - 0.1] = [0.1 -0.2 0.1] */
  ce c = ce_new(2, 3, 1);
  tt_set(&c.z, (const float[]){0, 0, 0, 0, 1.0986122887f, 0});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 1, *tt_i32(&c.lab, 1, 0, 0, 0) = 1;
  bp_softmax_ce_attrs a = {0.3f, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ops_run(&call);
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 1.8291604f, 2e-6f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 1.0f);
  ops_expect_close(&c.dz, (const float[]){0.2333333f, -0.4666667f, 0.2333333f, 0.1f, -0.2f, 0.1f}, 2e-7,
                   "dz");
  ce_free(&c);
}
END_TEST

START_TEST(large_logits_are_stable) {
  /* row 0: [1e4, 0, -1e4], label 0: softmax [1, 0, 0] (exp(-1e4) underflows), loss 0, dz 0
   * row 1: [1e4, 1e4, -1e4], label 2: lse = 1e4 + ln 2, loss = 2e4 + ln 2 = 20000.693;
   *        dz = [0.5, 0.5, -1]; the argmax tie goes to 0, not correct
   * row 2: [-1e4, -1e4, -1e4 + 1], label 2: softmax of [0, 0, 1] shifted: stable too */
  ce c = ce_new(3, 3, 0);
  tt_set(&c.z, (const float[]){1e4f, 0, -1e4f, 1e4f, 1e4f, -1e4f, -1e4f, -1e4f, -1e4f + 1});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 0, *tt_i32(&c.lab, 1, 0, 0, 0) = 2, *tt_i32(&c.lab, 2, 0, 0, 0) = 2;
  bp_softmax_ce_attrs a = {0, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ops_run(&call);
  /* row 2: e = exp(1) = 2.7182818, loss = -ln(e/(2+e)) = ln(2+e) - 1 = 0.5514448;
   * dz = [1/(2+e), 1/(2+e), e/(2+e) - 1] = [0.2119416, 0.2119416, -0.4238831] */
  ck_assert(isfinite(*tt_at(&c.loss, 0)));
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 20000.693f + 0.5514448f, 4e-3f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 2.0f);
  ops_expect_close(&c.dz, (const float[]){0, 0, 0, 0.5f, 0.5f, -1, 0.2119416f, 0.2119416f, -0.4238831f},
                   1e-6, "dz");
  ce_free(&c);
}
END_TEST

START_TEST(without_gradient) {
  /* compute_grad 0: two outputs; correct counts rows whose first max is the label */
  ce c = ce_new(3, 2, 0);
  tt_set(&c.z, (const float[]){5, 5, 1, 2, 3, -1});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 1; /* tie -> 0: miss */
  *tt_i32(&c.lab, 1, 0, 0, 0) = 1; /* hit */
  *tt_i32(&c.lab, 2, 0, 0, 0) = 0; /* hit */
  bp_softmax_ce_attrs a = {0, 1, 0, 0};
  ops_call call = ce_call(&c, &a);
  ck_assert_int_eq(call.nout, 2);
  ops_run(&call);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 2.0f);
  /* ln 2 + ln(1 + e^-1) + ln(1 + e^-4) = 0.6931472 + 0.3132617 + 0.0181499 = 1.0245588 */
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 1.0245588f, 2e-6f);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(*tt_at(&c.dz, i), 0.0f); /* untouched */
  ce_free(&c);
}
END_TEST

START_TEST(bad_label_changes_nothing) {
  ce c = ce_new(2, 4, 0);
  *tt_i32(&c.lab, 1, 0, 0, 0) = 4;
  *tt_at(&c.loss, 0) = 7;
  bp_softmax_ce_attrs a = {0, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ck_assert_int_eq(ops_run_raw(&call), BP_ABI_ERR_INVALID);
  *tt_i32(&c.lab, 1, 0, 0, 0) = -1;
  ck_assert_int_eq(ops_run_raw(&call), BP_ABI_ERR_INVALID);
  ck_assert_float_eq(*tt_at(&c.loss, 0), 7.0f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 0.0f);
  for (int i = 0; i < 8; i++) ck_assert_float_eq(*tt_at(&c.dz, i), 0.0f);
  ce_free(&c);
}
END_TEST

/* L = grad_scale * loss; the loss output is zeroed before every run */
typedef struct ce_ctx {
  ops_call call;
  ce *c;
  double scale;
} ce_ctx;

static double ce_loss(void *p) {
  ce_ctx *ctx = p;
  *tt_at(&ctx->c->loss, 0) = 0;
  ops_run(&ctx->call);
  return ctx->scale * *tt_at(&ctx->c->loss, 0);
}

START_TEST(gradient_matches_finite_differences) {
  static const int shapes[][2] = {{4, 7}, {1, 2}, {5, 10}, {3, 1}};
  static const float smoothing[] = {0, 0.1f, 0.25f, 0};
  for (int s = 0; s < 4; s++)
    for (int extra = 0; extra <= 3; extra += 3) {
      ce c = ce_new(shapes[s][0], shapes[s][1], extra);
      uint64_t rng = 900 + (uint64_t)(s * 10 + extra);
      tt_rand(&c.z, &rng, -3, 3);
      for (int n = 0; n < shapes[s][0]; n++)
        *tt_i32(&c.lab, n, 0, 0, 0) = (int32_t)(tt_rand_unit(&rng) * shapes[s][1]);
      bp_softmax_ce_attrs a = {smoothing[s], 0.25f, 1, 0};
      ce_ctx ctx = {ce_call(&c, &a), &c, 0.25};
      ops_run(&ctx.call);
      bp_softmax_ce_attrs nograd = a;
      nograd.compute_grad = 0;
      ctx.call.attrs = &nograd, ctx.call.nout = 2;
      double *num = malloc(sizeof(double) * (size_t)tt_count(&c.z));
      ops_fd_grad(ce_loss, &ctx, &c.z, OPS_FD_H, num);
      const double err = ops_grad_err(&c.dz, num);
      free(num);
      printf("softmax_ce shape %d%s: err dlogits %.2e\n", s, extra ? " (padded)" : "", err);
      ck_assert_msg(err < OPS_FD_TOL, "shape %d: %.3g", s, err);
      ce_free(&c);
    }
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  ce c = ce_new(2, 3, 0);
  tt labf = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 1, 0), lab3 = tt_new(BP_ABI_DTYPE_INT32, 3, 1, 1, 1, 0);
  tt loss2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), dz4 = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 0);
  tt z4 = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 1, 3, 0);
  bp_softmax_ce_attrs a = {0.1f, 0.5f, 1, 0}, bad = a;
  ops_call ok = ce_call(&c, &a), call = ok;
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  call.in[1] = &labf;
  ops_expect_refused(&call, "labels: dtype fp32, expected int32");
  call = ok, call.in[1] = &lab3;
  ops_expect_refused(&call, "labels: shape");
  call = ok, call.out[0] = &loss2;
  ops_expect_refused(&call, "loss: shape");
  call = ok, call.out[2] = &dz4;
  ops_expect_refused(&call, "dlogits: shape");
  call = ok, call.in[0] = &z4;
  ops_expect_refused(&call, "logits: shape");
  call = ok, call.attrs = &bad;
  bad.label_smoothing = 1.5f;
  ops_expect_refused(&call, "label_smoothing");
  bad = a, bad.grad_scale = INFINITY;
  ops_expect_refused(&call, "grad_scale");
  bad = a, bad.compute_grad = 2;
  ops_expect_refused(&call, "compute_grad");
  call = ok, call.nout = 2;
  ops_expect_refused(&call, "expects 2 inputs and 3 outputs");
  ce_free(&c);
  tt_free(&labf), tt_free(&lab3), tt_free(&loss2), tt_free(&dz4), tt_free(&z4);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_softmax_ce");
  TCase *tc = tcase_create("softmax_ce");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, by_hand_with_accumulation);
  tcase_add_test(tc, label_smoothing_by_hand);
  tcase_add_test(tc, large_logits_are_stable);
  tcase_add_test(tc, without_gradient);
  tcase_add_test(tc, bad_label_changes_nothing);
  tcase_add_test(tc, gradient_matches_finite_differences);
  tcase_add_test(tc, supports_refuses_with_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
