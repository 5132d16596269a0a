/* fc reference kernels: forward by hand (including the NHWC flattening
 * order with padded channels), backward against central finite
 * differences, accumulate, and the refusals of supports(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

START_TEST(fwd_by_hand) {
  for (int extra = 0; extra <= 3; extra += 3) {
    /* x = [[1 2 3], [4 5 6]], w = [[1 0 -1], [0.5 0.5 0.5]], b = [10, -1]
     * y[0] = [1 - 3 + 10, 0.5*6 - 1] = [8, 2]
     * y[1] = [4 - 6 + 10, 0.5*15 - 1] = [8, 6.5] */
    tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 3, extra), w = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 3, extra);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, extra), y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 2, extra);
    tt_set(&x, (const float[]){1, 2, 3, 4, 5, 6});
    tt_set(&w, (const float[]){1, 0, -1, 0.5f, 0.5f, 0.5f});
    tt_set(&b, (const float[]){10, -1});
    bp_fc_attrs a = {1, 0};
    ops_call c = {"fc.fwd", {&x, &w, &b}, {&y}, 3, 1, &a, sizeof a};
    ops_run(&c);
    ops_expect_close(&y, (const float[]){8, 2, 8, 6.5f}, 0, "y");
    ck_assert(tt_padding_intact(&y));
    tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y);
  }
}
END_TEST

START_TEST(fwd_flattens_in_nhwc_order) {
  /* x [1,2,2,2] holds 1..8 in NHWC order, so feature f = (h*W + w)*C + c
   * holds f + 1. Output o picks feature 5 (h=1, w=0, c=1 -> 6) with weight
   * 1 and feature 2 (h=0, w=1, c=0 -> 3) with weight 10: y = 6 + 30 = 36.
   * x's channels are padded (2 of 5), so a wrong flattening reads NaN. */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 2, 3), w = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 8, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt_set(&x, (const float[]){1, 2, 3, 4, 5, 6, 7, 8});
  tt_set(&w, (const float[]){0, 0, 10, 0, 0, 1, 0, 0});
  ck_assert_float_eq(*tt_f(&x, 0, 1, 0, 1), 6.0f);
  bp_fc_attrs a = {0, 0};
  ops_call c = {"fc.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
  ops_run(&c);
  ck_assert_float_eq(*tt_f(&y, 0, 0, 0, 0), 36.0f);
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

typedef struct fc_case {
  int n, h, w, c, o, bias;
} fc_case;

static const fc_case cases[] = {
    {3, 2, 3, 5, 4, 1}, /* spatial input, bias */
    {1, 1, 1, 7, 3, 0}, /* one sample, no bias */
    {5, 3, 3, 2, 6, 1}, /* odd sizes */
    {2, 1, 1, 19, 1, 1}, /* one output, 19 features (8 lanes twice + tail) */
};

typedef struct fc_ctx {
  ops_call fwd;
  tt *y, *r;
} fc_ctx;

static double fc_loss(void *p) {
  fc_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

static double grad_err(fc_ctx *ctx, tt *param, const tt *analytic) {
  double *num = malloc(sizeof(double) * (size_t)tt_count(param));
  ops_fd_grad(fc_loss, ctx, param, OPS_FD_H, num);
  const double err = ops_grad_err(analytic, num);
  free(num);
  return err;
}

static void check_case(const fc_case *fc, int extra, uint64_t seed) {
  const int f = fc->h * fc->w * fc->c;
  tt x = tt_new(BP_ABI_DTYPE_FP32, fc->n, fc->h, fc->w, fc->c, extra);
  tt w = tt_new(BP_ABI_DTYPE_FP32, fc->o, 1, 1, f, extra);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, fc->o, extra);
  tt y = tt_new(BP_ABI_DTYPE_FP32, fc->n, 1, 1, fc->o, extra);
  tt r = tt_new(BP_ABI_DTYPE_FP32, fc->n, 1, 1, fc->o, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, fc->n, fc->h, fc->w, fc->c, 2 * extra);
  tt dw = tt_new(BP_ABI_DTYPE_FP32, fc->o, 1, 1, f, extra);
  tt db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, fc->o, extra);
  uint64_t rng = seed;
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
  tt_rand(&r, &rng, -1, 1);
  tt_rand(&dx, &rng, -5, 5), tt_rand(&dw, &rng, -5, 5), tt_rand(&db, &rng, -5, 5);
  bp_fc_attrs a = {fc->bias, 0};
  ops_call bd = {"fc.bwd_data", {&r, &w}, {&dx}, 2, 1, &a, sizeof a};
  ops_call bf = {"fc.bwd_filter", {&x, &r}, {&dw, &db}, 2, fc->bias ? 2 : 1, &a, sizeof a};
  ops_run(&bd);
  ops_run(&bf);
  fc_ctx ctx = {{"fc.fwd", {&x, &w, &b}, {&y}, fc->bias ? 3 : 2, 1, &a, sizeof a}, &y, &r};
  const double ex = grad_err(&ctx, &x, &dx), ew = grad_err(&ctx, &w, &dw);
  const double eb = fc->bias ? grad_err(&ctx, &b, &db) : 0.0;
  printf("fc case %d%s: err dx %.2e dw %.2e db %.2e\n", (int)(fc - cases), extra ? " (padded)" : "",
         ex, ew, eb);
  ck_assert_msg(ex < OPS_FD_TOL && ew < OPS_FD_TOL && eb < OPS_FD_TOL, "dx %.3g dw %.3g db %.3g",
                ex, ew, eb);

  tt px = tt_new(BP_ABI_DTYPE_FP32, fc->n, fc->h, fc->w, fc->c, 0);
  tt pw = tt_new(BP_ABI_DTYPE_FP32, fc->o, 1, 1, f, 0), pb = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, fc->o, 0);
  tt dx2 = tt_new(BP_ABI_DTYPE_FP32, fc->n, fc->h, fc->w, fc->c, extra);
  tt dw2 = tt_new(BP_ABI_DTYPE_FP32, fc->o, 1, 1, f, 0), db2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, fc->o, 1);
  tt_rand(&px, &rng, -1, 1), tt_rand(&pw, &rng, -1, 1), tt_rand(&pb, &rng, -1, 1);
  tt_copy(&dx2, &px), tt_copy(&dw2, &pw), tt_copy(&db2, &pb);
  bp_fc_attrs acc = {fc->bias, 1};
  ops_call bd2 = {"fc.bwd_data", {&r, &w}, {&dx2}, 2, 1, &acc, sizeof acc};
  ops_call bf2 = {"fc.bwd_filter", {&x, &r}, {&dw2, &db2}, 2, fc->bias ? 2 : 1, &acc, sizeof acc};
  ops_run(&bd2);
  ops_run(&bf2);
  ops_expect_accumulated(&dx2, &px, &dx, "dx");
  ops_expect_accumulated(&dw2, &pw, &dw, "dw");
  if (fc->bias) ops_expect_accumulated(&db2, &pb, &db, "db");

  tt *all[] = {&x, &w, &b, &y, &r, &dx, &dw, &db, &px, &pw, &pb, &dx2, &dw2, &db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert_msg(tt_padding_intact(all[i]), "padding of tensor %d written", (int)i);
    tt_free(all[i]);
  }
}

START_TEST(bwd_matches_finite_differences) {
  check_case(&cases[_i], 0, 300 + (uint64_t)_i);
  check_case(&cases[_i], 3, 400 + (uint64_t)_i);
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 4, 2, 2, 3, 0), w = tt_new(BP_ABI_DTYPE_FP32, 5, 1, 1, 12, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 5, 0), y = tt_new(BP_ABI_DTYPE_FP32, 4, 1, 1, 5, 0);
  bp_fc_attrs a = {1, 0}, bad = {1, 7};
  ops_call ok = {"fc.fwd", {&x, &w, &b}, {&y}, 3, 1, &a, sizeof a};
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  ops_call c = ok;
  c.attrs = &bad;
  ops_expect_refused(&c, "accumulate");
  bad.accumulate = 0, bad.has_bias = 3;
  ops_expect_refused(&c, "has_bias");
  tt w2 = tt_new(BP_ABI_DTYPE_FP32, 5, 1, 1, 11, 0);
  c = ok, c.in[1] = &w2;
  ops_expect_refused(&c, "w: shape [5,1,1,11], expected [5,1,1,12]");
  tt y2 = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 5, 0);
  c = ok, c.out[0] = &y2;
  ops_expect_refused(&c, "y: shape");
  tt bh = tt_new(BP_ABI_DTYPE_INT32, 1, 1, 1, 5, 0); /* FP16 is taken (tests/test_ops_fp16.c) */
  c = ok, c.in[2] = &bh;
  ops_expect_refused(&c, "b: dtype int32");
  /* backward-filter with bias needs db */
  ops_call bf = {"fc.bwd_filter", {&x, &y}, {&w}, 2, 1, &a, sizeof a};
  ops_expect_refused(&bf, "expects 2 inputs and 2 outputs");
  /* backward-data: dx must have x's feature count */
  tt dx = tt_new(BP_ABI_DTYPE_FP32, 4, 2, 2, 2, 0);
  ops_call bd = {"fc.bwd_data", {&y, &w}, {&dx}, 2, 1, &a, sizeof a};
  ops_expect_refused(&bd, "w: shape");
  tt *all[] = {&x, &w, &b, &y, &w2, &y2, &bh, &dx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_fc");
  TCase *tc = tcase_create("fc");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, fwd_by_hand);
  tcase_add_test(tc, fwd_flattens_in_nhwc_order);
  tcase_add_loop_test(tc, bwd_matches_finite_differences, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, supports_refuses_with_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
