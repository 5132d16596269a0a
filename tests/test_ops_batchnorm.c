/* batchnorm reference kernels: training forward and running statistics by
 * hand (unbiased variance, momentum, in place or not), evaluation from the
 * running statistics, backward against central finite differences
 * (including more than one 64-channel block), accumulate, refusals. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

START_TEST(train_and_running_stats_by_hand) {
  for (int extra = 0; extra <= 2; extra += 2) {
    /* x [2,1,1,2]: channel 0 = {1, 3}, channel 1 = {2, 6}; eps 1e-5, momentum 0.1
     *   mean = [2, 4]; biased var = [1, 4]; unbiased (M/(M-1) = 2) = [2, 8]
     *   invstd = 1/sqrt(var + 1e-5) = [0.999995000037, 0.499999375001]
     *   gamma = [2, 1], beta = [0.5, 0]:
     *   y = gamma*(x - mean)*invstd + beta
     *     = [2*(-1)*0.999995 + 0.5, 1*(-2)*0.4999994, 2*(1)*0.999995 + 0.5, 1*(2)*0.4999994]
     *     = [-1.49999, -0.9999988, 2.49999, 0.9999988]
     *   running_mean [0, 1] -> 0.9*[0, 1] + 0.1*[2, 4] = [0.2, 1.3]
     *   running_var  [1, 1] -> 0.9*[1, 1] + 0.1*[2, 8] = [1.1, 1.7] */
    tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 2, extra), g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, extra);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), rm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, extra);
    tt rv = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 1), y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 2, extra);
    tt sm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, extra), si = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0);
    tt_set(&x, (const float[]){1, 2, 3, 6});
    tt_set(&g, (const float[]){2, 1});
    tt_set(&b, (const float[]){0.5f, 0});
    tt_set(&rm, (const float[]){0, 1});
    tt_set(&rv, (const float[]){1, 1});
    bp_batchnorm_attrs a = {1e-5f, 0.1f, 0};
    /* running statistics updated in place: outputs 3, 4 are inputs 3, 4 */
    ops_call f = {"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rm, &rv}, 5, 5, &a, sizeof a};
    ops_run(&f);
    ops_expect_close(&y, (const float[]){-1.49999f, -0.9999988f, 2.49999f, 0.9999988f}, 2e-6, "y");
    ops_expect_close(&sm, (const float[]){2, 4}, 0, "save_mean");
    ops_expect_close(&si, (const float[]){0.999995000037f, 0.499999375001f}, 1e-7, "save_invstd");
    ops_expect_close(&rm, (const float[]){0.2f, 1.3f}, 1e-7, "running_mean");
    ops_expect_close(&rv, (const float[]){1.1f, 1.7f}, 1e-7, "running_var");

    /* evaluation uses the running statistics:
     *   y = gamma*(x - rm)/sqrt(rv + 1e-5) + beta
     *     = [2*0.8/sqrt(1.10001) + 0.5, 0.7/sqrt(1.70001), 2*2.8/sqrt(1.10001) + 0.5, 4.7/sqrt(1.70001)]
     *     = [2.02553321, 0.536873913, 5.83936623, 3.60472485] */
    ops_call e = {"batchnorm.fwd_eval", {&x, &g, &b, &rm, &rv}, {&y}, 5, 1, &a, sizeof a};
    ops_run(&e);
    ops_expect_close(&y, (const float[]){2.02553321f, 0.536873913f, 5.83936623f, 3.60472485f}, 2e-6,
                     "y eval");

    /* separate output buffers for the running statistics: inputs stay */
    tt rm2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), rv2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 3);
    ops_call f2 = {"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rm2, &rv2}, 5, 5, &a, sizeof a};
    ops_run(&f2);
    /* 0.9*[0.2, 1.3] + 0.1*[2, 4] = [0.38, 1.57]; 0.9*[1.1, 1.7] + 0.1*[2, 8] = [1.19, 2.33] */
    ops_expect_close(&rm2, (const float[]){0.38f, 1.57f}, 1e-6, "running_mean (separate)");
    ops_expect_close(&rv2, (const float[]){1.19f, 2.33f}, 1e-6, "running_var (separate)");
    ops_expect_close(&rm, (const float[]){0.2f, 1.3f}, 1e-7, "running_mean input kept");
    tt *all[] = {&x, &g, &b, &rm, &rv, &y, &sm, &si, &rm2, &rv2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      ck_assert(tt_padding_intact(all[i]));
      tt_free(all[i]);
    }
  }
}
END_TEST

START_TEST(momentum_edges) {
  /* momentum 0 keeps the running statistics, 1 replaces them by the batch's */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 1, 0), g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), rm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt rv = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), y = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 1, 0);
  tt sm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), si = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt_set(&x, (const float[]){1, 2, 6}); /* mean 3, squared deviations 4+1+9 = 14, unbiased 7 */
  *tt_at(&g, 0) = 1, *tt_at(&rm, 0) = 5, *tt_at(&rv, 0) = 9;
  bp_batchnorm_attrs keep = {1e-3f, 0, 0}, take = {1e-3f, 1, 0};
  ops_call f = {"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rm, &rv}, 5, 5, &keep, sizeof keep};
  ops_run(&f);
  ck_assert_float_eq(*tt_at(&rm, 0), 5.0f);
  ck_assert_float_eq(*tt_at(&rv, 0), 9.0f);
  f.attrs = &take;
  ops_run(&f);
  ck_assert_float_eq(*tt_at(&rm, 0), 3.0f);
  ck_assert_float_eq(*tt_at(&rv, 0), 7.0f);
  tt *all[] = {&x, &g, &b, &rm, &rv, &y, &sm, &si};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* ---- backward against finite differences ------------------------------- */

typedef struct bn_case {
  int n, h, w, c;
} bn_case;

static const bn_case cases[] = {
    {4, 3, 2, 5}, {3, 1, 1, 2}, {2, 5, 3, 70}, /* 70 channels: two blocks of 64 */
    {1, 3, 5, 1},
};

typedef struct bn_ctx {
  ops_call fwd;
  tt *y, *r;
} bn_ctx;

static double bn_loss(void *p) {
  bn_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

static double grad_err(bn_ctx *ctx, tt *param, const tt *analytic) {
  double *num = malloc(sizeof(double) * (size_t)tt_count(param));
  ops_fd_grad(bn_loss, ctx, param, OPS_FD_H, num);
  const double err = ops_grad_err(analytic, num);
  free(num);
  return err;
}

static void check_case(const bn_case *bc, int extra, uint64_t seed) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, extra);
  tt g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, extra), b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0);
  tt rm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0), rv = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, extra);
  tt sm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, extra), si = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 1);
  tt r = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, extra + 1);
  tt dg = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, extra), db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 2);
  uint64_t rng = seed;
  tt_rand(&x, &rng, -2, 2), tt_rand(&g, &rng, 0.5, 1.5), tt_rand(&b, &rng, -1, 1);
  tt_rand(&r, &rng, -1, 1), tt_rand(&rv, &rng, 0.5, 1);
  tt_rand(&dx, &rng, -5, 5), tt_rand(&dg, &rng, -5, 5), tt_rand(&db, &rng, -5, 5);
  bp_batchnorm_attrs a = {1e-5f, 0.1f, 0};
  bn_ctx ctx = {{"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rm, &rv}, 5, 5, &a, sizeof a},
                &y, &r};
  ops_run(&ctx.fwd);
  ops_call bw = {"batchnorm.bwd", {&x, &r, &g, &sm, &si}, {&dx, &dg, &db}, 5, 3, &a, sizeof a};
  ops_run(&bw);
  const double ex = grad_err(&ctx, &x, &dx), eg = grad_err(&ctx, &g, &dg), eb = grad_err(&ctx, &b, &db);
  printf("batchnorm case %d%s: err dx %.2e dgamma %.2e dbeta %.2e\n", (int)(bc - cases),
         extra ? " (padded)" : "", ex, eg, eb);
  ck_assert_msg(ex < OPS_FD_TOL && eg < OPS_FD_TOL && eb < OPS_FD_TOL, "dx %.3g dg %.3g db %.3g", ex, eg, eb);

  ops_run(&ctx.fwd); /* save_mean/invstd of the unperturbed x again */
  tt px = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, 0);
  tt pg = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0), pb = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0);
  tt dx2 = tt_new(BP_ABI_DTYPE_FP32, bc->n, bc->h, bc->w, bc->c, 0);
  tt dg2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 3), db2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, bc->c, 0);
  tt_rand(&px, &rng, -1, 1), tt_rand(&pg, &rng, -1, 1), tt_rand(&pb, &rng, -1, 1);
  tt_copy(&dx2, &px), tt_copy(&dg2, &pg), tt_copy(&db2, &pb);
  bp_batchnorm_attrs acc = a;
  acc.accumulate = 1;
  ops_call bw2 = {"batchnorm.bwd", {&x, &r, &g, &sm, &si}, {&dx2, &dg2, &db2}, 5, 3, &acc, sizeof acc};
  ops_run(&bw2);
  ops_expect_accumulated(&dx2, &px, &dx, "dx");
  ops_expect_accumulated(&dg2, &pg, &dg, "dgamma");
  ops_expect_accumulated(&db2, &pb, &db, "dbeta");
  tt *all[] = {&x, &g, &b, &rm, &rv, &y, &sm, &si, &r, &dx, &dg, &db, &px, &pg, &pb, &dx2, &dg2, &db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert_msg(tt_padding_intact(all[i]), "padding of tensor %d", (int)i);
    tt_free(all[i]);
  }
}

START_TEST(bwd_matches_finite_differences) {
  check_case(&cases[_i], 0, 700 + (uint64_t)_i);
  check_case(&cases[_i], 3, 800 + (uint64_t)_i);
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 3, 0), c3 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0);
  tt c4 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 3, 0);
  tt one = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0), ci = tt_new(BP_ABI_DTYPE_INT32, 1, 1, 1, 3, 0);
  tt s1 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0), s2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0);
  bp_batchnorm_attrs a = {1e-5f, 0.1f, 0}, bad = a;
  ops_call ok = {"batchnorm.fwd_train", {&x, &c3, &c3, &s1, &s2}, {&y, &c3, &c3, &s1, &s2}, 5, 5, &a, sizeof a};
  /* (c3 as both input and output is fine for supports, which sees no pointers) */
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  ops_call c = ok;
  c.attrs = &bad;
  bad.eps = 0;
  ops_expect_refused(&c, "eps");
  bad = a, bad.momentum = 1.5f;
  ops_expect_refused(&c, "momentum");
  bad = a, bad.accumulate = 3;
  ops_expect_refused(&c, "accumulate");
  c = ok, c.in[1] = &c4;
  ops_expect_refused(&c, "gamma: shape [1,1,1,4], expected [1,1,1,3]");
  c = ok, c.out[1] = &ci;
  ops_expect_refused(&c, "save_mean: dtype int32");
  c = ok, c.in[0] = &one, c.out[0] = &one; /* N*H*W = 1 */
  ops_expect_refused(&c, "more than one value per channel");
  ops_call e = {"batchnorm.fwd_eval", {&one, &c3, &c3, &s1, &s2}, {&y}, 5, 1, &a, sizeof a};
  ops_expect_refused(&e, "y: shape");
  ops_call b = {"batchnorm.bwd", {&x, &y, &c3, &s1, &s2}, {&y, &c3}, 5, 2, &a, sizeof a};
  ops_expect_refused(&b, "expects 5 inputs and 3 outputs");
  tt *all[] = {&x, &c3, &c4, &y, &one, &ci, &s1, &s2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

START_TEST(eval_with_one_value_is_fine) {
  /* evaluation needs no batch statistics: N*H*W = 1 works.
   * x = 3, rm = 1, rv = 4, gamma 2, beta -1: 2*(3-1)/sqrt(4 + 1e-5) - 1 = 0.9999975 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), rm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt rv = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  *tt_at(&x, 0) = 3, *tt_at(&g, 0) = 2, *tt_at(&b, 0) = -1, *tt_at(&rm, 0) = 1, *tt_at(&rv, 0) = 4;
  bp_batchnorm_attrs a = {1e-5f, 0.1f, 0};
  ops_call e = {"batchnorm.fwd_eval", {&x, &g, &b, &rm, &rv}, {&y}, 5, 1, &a, sizeof a};
  ops_run(&e);
  ops_expect_close(&y, (const float[]){0.9999975f}, 1e-7, "y");
  tt *all[] = {&x, &g, &b, &rm, &rv, &y};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_batchnorm");
  TCase *tc = tcase_create("batchnorm");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, train_and_running_stats_by_hand);
  tcase_add_test(tc, momentum_edges);
  tcase_add_loop_test(tc, bwd_matches_finite_differences, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, supports_refuses_with_reason);
  tcase_add_test(tc, eval_with_one_value_is_fine);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
