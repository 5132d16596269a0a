/* layernorm reference kernels: forward and saved statistics by hand,
 * backward (dx, dgain, dbias) against central finite differences
 * (including more than one 64-channel block, one channel, positions in
 * more than one chunk), accumulate, no aliasing, refusals. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

START_TEST(fwd_by_hand) {
  for (int extra = 0; extra <= 2; extra += 2) {
    /* x [2,1,1,3]: position 0 = {1, 2, 6} (mean 3, biased var 14/3),
     * position 1 = {0, 0, 3} (mean 1, var 2); eps 1e-5;
     * gain = [2, 1, 0.5], bias = [0.5, 0, -1]:
     *   invstd = [0.462909553912, 0.707105013426]
     *   y = (x - mean) * invstd * gain + bias (python, in double) */
    tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 3, extra), g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, extra);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 3, extra + 1);
    tt sm = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 1, extra), si = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 1, 0);
    tt_set(&x, (const float[]){1, 2, 6, 0, 0, 3});
    tt_set(&g, (const float[]){2, 1, 0.5f});
    tt_set(&b, (const float[]){0.5f, 0, -1});
    bp_layernorm_attrs a = {1e-5f, 0};
    ops_call f = {"layernorm.fwd", {&x, &g, &b}, {&y, &sm, &si}, 3, 3, &a, sizeof a};
    ops_run(&f);
    ops_expect_close(&y,
                     (const float[]){-1.35163822f, -0.462909554f, -0.305635669f, -0.914210027f,
                                     -0.707105013f, -0.292894987f},
                     1e-6, "y");
    ops_expect_close(&sm, (const float[]){3, 1}, 0, "save_mean");
    ops_expect_close(&si, (const float[]){0.462909553912f, 0.707105013426f}, 1e-7, "save_invstd");
    /* y over x is refused: no output may alias an input */
    ops_call alias = {"layernorm.fwd", {&x, &g, &b}, {&x, &sm, &si}, 3, 3, &a, sizeof a};
    ck_assert_int_eq(ops_run_raw(&alias), BP_ABI_ERR_INVALID);
    tt *all[] = {&x, &g, &b, &y, &sm, &si};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      ck_assert(tt_padding_intact(all[i]));
      tt_free(all[i]);
    }
  }
}
END_TEST

START_TEST(constant_position_normalizes_to_bias) {
  /* every channel equal: xhat = 0, so y = bias and the gradient of x is 0
   * (var 0: invstd = 1/sqrt(eps), finite) */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0);
  tt sm = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), si = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  tt_set(&x, (const float[]){7, 7, 7, 7});
  tt_set(&g, (const float[]){1, 2, 3, 4});
  tt_set(&b, (const float[]){-1, 0, 1, 2});
  bp_layernorm_attrs a = {1e-4f, 0};
  ops_call f = {"layernorm.fwd", {&x, &g, &b}, {&y, &sm, &si}, 3, 3, &a, sizeof a};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){-1, 0, 1, 2}, 0, "y");
  ops_expect_close(&si, (const float[]){100}, 1e-5, "save_invstd");
  tt *all[] = {&x, &g, &b, &y, &sm, &si};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* ---- backward against finite differences ------------------------------- */

typedef struct ln_case {
  int n, h, w, c;
} ln_case;

static const ln_case cases[] = {
    {4, 3, 2, 5}, {3, 1, 1, 2}, {2, 2, 3, 70}, /* 70 channels: two blocks of 64 */
    {2, 7, 7, 9},                              /* 98 positions: chunks of 16 */
    {3, 2, 2, 1},                              /* one channel: y = bias, dx = 0 */
};

typedef struct ln_ctx {
  ops_call fwd;
  tt *y, *r;
} ln_ctx;

static double ln_loss(void *p) {
  ln_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

static double grad_err(ln_ctx *ctx, tt *param, const tt *analytic) {
  double *num = malloc(sizeof(double) * (size_t)tt_count(param));
  ops_fd_grad(ln_loss, ctx, param, OPS_FD_H, num);
  const double err = ops_grad_err(analytic, num);
  free(num);
  return err;
}

static void check_case(const ln_case *lc, int extra, uint64_t seed) {
  const int N = lc->n, H = lc->h, W = lc->w, C = lc->c;
  tt x = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, extra);
  tt g = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, extra), b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, extra);
  tt sm = tt_new(BP_ABI_DTYPE_FP32, N, H, W, 1, extra), si = tt_new(BP_ABI_DTYPE_FP32, N, H, W, 1, 1);
  tt r = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, extra + 1);
  tt dg = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, extra), db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 2);
  uint64_t rng = seed;
  tt_rand(&x, &rng, -2, 2), tt_rand(&g, &rng, 0.5, 1.5), tt_rand(&b, &rng, -1, 1);
  tt_rand(&r, &rng, -1, 1);
  tt_rand(&dx, &rng, -5, 5), tt_rand(&dg, &rng, -5, 5), tt_rand(&db, &rng, -5, 5);
  bp_layernorm_attrs a = {1e-5f, 0};
  ln_ctx ctx = {{"layernorm.fwd", {&x, &g, &b}, {&y, &sm, &si}, 3, 3, &a, sizeof a}, &y, &r};
  ops_run(&ctx.fwd);
  ops_call bw = {"layernorm.bwd", {&x, &r, &g, &sm, &si}, {&dx, &dg, &db}, 5, 3, &a, sizeof a};
  ops_run(&bw);
  const double ex = grad_err(&ctx, &x, &dx), eg = grad_err(&ctx, &g, &dg), eb = grad_err(&ctx, &b, &db);
  printf("layernorm case %d%s: err dx %.2e dgain %.2e dbias %.2e\n", (int)(lc - cases),
         extra ? " (padded)" : "", ex, eg, eb);
  ck_assert_msg(ex < OPS_FD_TOL && eg < OPS_FD_TOL && eb < OPS_FD_TOL, "dx %.3g dg %.3g db %.3g", ex,
                eg, eb);

  ops_run(&ctx.fwd); /* the statistics of the unperturbed x again */
  tt px = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0);
  tt pg = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 0), pb = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 0);
  tt dx2 = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0);
  tt dg2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 3), db2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, C, 0);
  tt_rand(&px, &rng, -1, 1), tt_rand(&pg, &rng, -1, 1), tt_rand(&pb, &rng, -1, 1);
  tt_copy(&dx2, &px), tt_copy(&dg2, &pg), tt_copy(&db2, &pb);
  bp_layernorm_attrs acc = a;
  acc.accumulate = 1;
  ops_call bw2 = {"layernorm.bwd", {&x, &r, &g, &sm, &si}, {&dx2, &dg2, &db2}, 5, 3, &acc, sizeof acc};
  ops_run(&bw2);
  ops_expect_accumulated(&dx2, &px, &dx, "dx");
  ops_expect_accumulated(&dg2, &pg, &dg, "dgain");
  ops_expect_accumulated(&db2, &pb, &db, "dbias");
  tt *all[] = {&x, &g, &b, &y, &sm, &si, &r, &dx, &dg, &db, &px, &pg, &pb, &dx2, &dg2, &db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert_msg(tt_padding_intact(all[i]), "padding of tensor %d", (int)i);
    tt_free(all[i]);
  }
}

START_TEST(bwd_matches_finite_differences) {
  check_case(&cases[_i], 0, 900 + (uint64_t)_i);
  check_case(&cases[_i], 3, 1000 + (uint64_t)_i);
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 3, 0), c3 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0);
  tt c4 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 3, 0);
  tt s = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 1, 0), sc = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 3, 0);
  tt si = tt_new(BP_ABI_DTYPE_INT32, 2, 2, 2, 1, 0);
  bp_layernorm_attrs a = {1e-5f, 0}, bad = a;
  ops_call ok = {"layernorm.fwd", {&x, &c3, &c3}, {&y, &s, &s}, 3, 3, &a, sizeof a};
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  ops_call c = ok;
  c.attrs = &bad;
  bad.eps = 0;
  ops_expect_refused(&c, "eps");
  bad = a, bad.accumulate = 3;
  ops_expect_refused(&c, "accumulate");
  c = ok, c.in[1] = &c4;
  ops_expect_refused(&c, "gain: shape [1,1,1,4], expected [1,1,1,3]");
  c = ok, c.out[1] = &sc; /* per channel, not per position */
  ops_expect_refused(&c, "save_mean: shape [1,1,1,3], expected [2,2,2,1]");
  c = ok, c.out[2] = &si;
  ops_expect_refused(&c, "save_invstd: dtype int32");
  ops_call b = {"layernorm.bwd", {&x, &y, &c3, &s, &s}, {&y, &c3}, 5, 2, &a, sizeof a};
  ops_expect_refused(&b, "expects 5 inputs and 3 outputs");
  b.nout = 3, b.out[2] = &c4;
  ops_expect_refused(&b, "dbias: shape");
  tt *all[] = {&x, &c3, &c4, &y, &s, &sc, &si};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_layernorm");
  TCase *tc = tcase_create("layernorm");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, fwd_by_hand);
  tcase_add_test(tc, constant_position_normalizes_to_bias);
  tcase_add_loop_test(tc, bwd_matches_finite_differences, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, supports_refuses_with_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
