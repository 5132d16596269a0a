/* relu, add, gelu, gelu_tanh and pos_embed reference kernels: forward by hand, in place where
 * the op allows it, backward against central finite differences,
 * accumulate, and the refusals of supports() and run(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

static const bp_elementwise_attrs overwrite = {0}, accumulate = {1};

START_TEST(relu_by_hand) {
  /* relu([-2, -0.5, 0, 0.5, 3, -7]) = [0, 0, 0, 0.5, 3, 0]
   * relu.bwd with y from above and dy = [1..6]: dx = dy where y > 0 = [0, 0, 0, 4, 5, 0] */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 1, 3, 1), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 1, 3, 2);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 1, 3, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 1, 3, 3);
  tt_set(&x, (const float[]){-2, -0.5f, 0, 0.5f, 3, -7});
  tt_set(&dy, (const float[]){1, 2, 3, 4, 5, 6});
  ops_call f = {"relu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){0, 0, 0, 0.5f, 3, 0}, 0, "y");
  ops_call b = {"relu.bwd", {&y, &dy}, {&dx}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){0, 0, 0, 4, 5, 0}, 0, "dx");
  /* accumulate: dx += [0, 0, 0, 4, 5, 0] */
  ops_call ba = {"relu.bwd", {&y, &dy}, {&dx}, 2, 1, &accumulate, sizeof accumulate};
  ops_run(&ba);
  ops_expect_close(&dx, (const float[]){0, 0, 0, 8, 10, 0}, 0, "dx accumulated");
  /* in place: y = relu(x) into x itself, then dx = relu'(y) * dy into dy itself */
  ops_call fi = {"relu.fwd", {&x}, {&x}, 1, 1, &overwrite, sizeof overwrite};
  ops_run(&fi);
  ops_expect_close(&x, (const float[]){0, 0, 0, 0.5f, 3, 0}, 0, "x in place");
  ops_call bi = {"relu.bwd", {&y, &dy}, {&dy}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&bi);
  ops_expect_close(&dy, (const float[]){0, 0, 0, 4, 5, 0}, 0, "dy in place");
  tt *all[] = {&x, &y, &dy, &dx};
  for (size_t i = 0; i < 4; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(gelu_by_hand) {
  /* x * Phi(x) and Phi(x) + x * phi(x) at x = -3 .. 4, from erf in double
   * (padded tensors: channel padding untouched) */
  static const float xs[8] = {-3, -1, -0.5f, 0, 0.5f, 1, 2, 4};
  static const float ys[8] = {-0.00404969409f, -0.158655254f, -0.154268769f, 0,
                              0.345731231f,    0.841344746f,  1.95449974f,   3.99987332f};
  static const float slopes[8] = {-0.0119456472f, -0.0833154706f, 0.132504875f, 0.5f,
                                  0.867495125f,   1.08331547f,    1.08523180f,  1.00050365f};
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 3), y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 1);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 2);
  tt_set(&x, xs);
  tt_set(&dy, (const float[]){2, 2, 2, 2, 2, 2, 2, 2});
  ops_call f = {"gelu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  ops_run(&f);
  ops_expect_close(&y, ys, 1e-6, "y");
  float twice[8], thrice[8];
  for (int i = 0; i < 8; i++) twice[i] = 2 * slopes[i], thrice[i] = 4 * slopes[i];
  ops_call b = {"gelu.bwd", {&x, &dy}, {&dx}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&b);
  ops_expect_close(&dx, twice, 1e-6, "dx");
  ops_call ba = {"gelu.bwd", {&x, &dy}, {&dx}, 2, 1, &accumulate, sizeof accumulate};
  ops_run(&ba);
  ops_expect_close(&dx, thrice, 1e-6, "dx accumulated");
  /* neither kernel is IN_PLACE: dx over dy is refused */
  ck_assert_uint_eq(ops_kernel("gelu.fwd")->flags & BP_ABI_KERNEL_IN_PLACE, 0);
  ck_assert_uint_eq(ops_kernel("gelu.bwd")->flags & BP_ABI_KERNEL_IN_PLACE, 0);
  ops_call bi = {"gelu.bwd", {&x, &dy}, {&dy}, 2, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&bi), BP_ABI_ERR_INVALID);
  tt *all[] = {&x, &y, &dy, &dx};
  for (size_t i = 0; i < 4; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(gelu_tanh_by_hand) {
  /* x/2 (1 + tanh u) and its slope at x = -3 .. 4, from tanh in double
   * (the values of PyTorch's GELU(approximate='tanh'); padded tensors) */
  static const float xs[8] = {-3, -1, -0.5f, 0, 0.5f, 1, 2, 4};
  static const float ys[8] = {-0.00363739208f, -0.158808009f, -0.15428599f, 0,
                              0.34571401f,     0.841191991f,  1.95459769f,  3.99992975f};
  static const float slopes[8] = {-0.0115841666f, -0.0829640838f, 0.132630096f, 0.5f,
                                  0.867369904f,   1.08296408f,    1.08609926f,  1.00033512f};
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 3), y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 1);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 2);
  tt_set(&x, xs);
  tt_set(&dy, (const float[]){2, 2, 2, 2, 2, 2, 2, 2});
  ops_call f = {"gelu_tanh.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  ops_run(&f);
  ops_expect_close(&y, ys, 1e-6, "y");
  float twice[8], thrice[8];
  for (int i = 0; i < 8; i++) twice[i] = 2 * slopes[i], thrice[i] = 4 * slopes[i];
  ops_call b = {"gelu_tanh.bwd", {&x, &dy}, {&dx}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&b);
  ops_expect_close(&dx, twice, 1e-6, "dx");
  ops_call ba = {"gelu_tanh.bwd", {&x, &dy}, {&dx}, 2, 1, &accumulate, sizeof accumulate};
  ops_run(&ba);
  ops_expect_close(&dx, thrice, 1e-6, "dx accumulated");
  ck_assert_uint_eq(ops_kernel("gelu_tanh.fwd")->flags & BP_ABI_KERNEL_IN_PLACE, 0);
  ck_assert_uint_eq(ops_kernel("gelu_tanh.bwd")->flags & BP_ABI_KERNEL_IN_PLACE, 0);
  ops_call bi = {"gelu_tanh.bwd", {&x, &dy}, {&dy}, 2, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&bi), BP_ABI_ERR_INVALID);
  tt *all[] = {&x, &y, &dy, &dx};
  for (size_t i = 0; i < 4; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(relu_flags_and_partial_overlap) {
  ck_assert_uint_eq(ops_kernel("relu.fwd")->flags & BP_ABI_KERNEL_IN_PLACE, BP_ABI_KERNEL_IN_PLACE);
  ck_assert_uint_eq(ops_kernel("relu.bwd")->flags & BP_ABI_KERNEL_IN_PLACE, BP_ABI_KERNEL_IN_PLACE);
  ck_assert_uint_eq(ops_kernel("add.fwd")->flags & BP_ABI_KERNEL_IN_PLACE, 0);
  /* y shifted by one element inside x's buffer: a partial overlap is refused */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 8, 0);
  tt y = x;
  y.data = (float *)x.data + 1;
  y.d.slot_bytes -= 4;
  ops_call f = {"relu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&f), BP_ABI_ERR_INVALID);
  /* the same elements with other strides: refused too */
  tt x2 = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 1, 2, 2);
  tt y2 = x2;
  y2.d.stride[1] = 2, y2.d.stride[0] = 4, y2.d.padded_c = 2;
  ops_call f2 = {"relu.fwd", {&x2}, {&y2}, 1, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&f2), BP_ABI_ERR_INVALID);
  tt_free(&x), tt_free(&x2);
}
END_TEST

START_TEST(add_by_hand) {
  /* [1 2 3] + [10 20 30] = [11 22 33]; add.bwd of dy = [1 -2 3] gives
   * da = db = dy, then accumulate doubles them */
  tt a = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 1), b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 2);
  tt_set(&a, (const float[]){1, 2, 3});
  tt_set(&b, (const float[]){10, 20, 30});
  ops_call f = {"add.fwd", {&a, &b}, {&y}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){11, 22, 33}, 0, "y");
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 0), da = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 1);
  tt db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 3, 1, 3);
  tt_set(&dy, (const float[]){1, -2, 3});
  tt_set(&da, (const float[]){100, 100, 100});
  ops_call bw = {"add.bwd", {&dy}, {&da, &db}, 1, 2, &overwrite, sizeof overwrite};
  ops_run(&bw);
  ops_expect_close(&da, (const float[]){1, -2, 3}, 0, "da");
  ops_expect_close(&db, (const float[]){1, -2, 3}, 0, "db");
  ops_call ba = {"add.bwd", {&dy}, {&da, &db}, 1, 2, &accumulate, sizeof accumulate};
  ops_run(&ba);
  ops_expect_close(&da, (const float[]){2, -4, 6}, 0, "da accumulated");
  ops_expect_close(&db, (const float[]){2, -4, 6}, 0, "db accumulated");
  /* add.fwd may not write into an input */
  ops_call fi = {"add.fwd", {&a, &b}, {&a}, 2, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&fi), BP_ABI_ERR_INVALID);
  tt *all[] = {&a, &b, &y, &dy, &da, &db};
  for (size_t i = 0; i < 6; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

/* L = sum r .* relu(x) or sum r .* (a + b) */
typedef struct ew_ctx {
  ops_call fwd;
  tt *y, *r;
} ew_ctx;

static double ew_loss(void *p) {
  ew_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

static double grad_err(ew_ctx *ctx, tt *param, const tt *analytic) {
  double *num = malloc(sizeof(double) * (size_t)tt_count(param));
  ops_fd_grad(ew_loss, ctx, param, OPS_FD_H, num);
  const double err = ops_grad_err(analytic, num);
  free(num);
  return err;
}

START_TEST(pos_embed_by_hand) {
  /* x [2,1,2,2] + P [1,1,2,2]: P added to both samples; dy summed over them */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 2, 2, 1), P = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 2, 3);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 2, 2, 0), dy = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 2, 2, 2);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 2, 2, 1), dP = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 2, 0);
  tt_set(&x, (const float[]){1, 2, 3, 4, -1, -2, -3, -4});
  tt_set(&P, (const float[]){0.5f, -0.25f, 10, 0});
  ops_call f = {"pos_embed.fwd", {&x, &P}, {&y}, 2, 1, &overwrite, sizeof overwrite};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){1.5f, 1.75f, 13, 4, -0.5f, -2.25f, 7, -4}, 0, "y");
  tt_set(&dy, (const float[]){1, 2, 3, 4, 10, 20, 30, 40});
  ops_call b = {"pos_embed.bwd", {&dy}, {&dx, &dP}, 1, 2, &overwrite, sizeof overwrite};
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){1, 2, 3, 4, 10, 20, 30, 40}, 0, "dx");
  ops_expect_close(&dP, (const float[]){11, 22, 33, 44}, 0, "dP");
  ops_call ba = {"pos_embed.bwd", {&dy}, {&dx, &dP}, 1, 2, &accumulate, sizeof accumulate};
  ops_run(&ba);
  ops_expect_close(&dx, (const float[]){2, 4, 6, 8, 20, 40, 60, 80}, 0, "dx accumulated");
  ops_expect_close(&dP, (const float[]){22, 44, 66, 88}, 0, "dP accumulated");
  /* no output may alias an input; P must be [1,H,W,C] */
  ops_call fi = {"pos_embed.fwd", {&x, &P}, {&x}, 2, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&fi), BP_ABI_ERR_INVALID);
  ops_call bi = {"pos_embed.bwd", {&dy}, {&dy, &dP}, 1, 2, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_run_raw(&bi), BP_ABI_ERR_INVALID);
  ops_call wrong = {"pos_embed.fwd", {&x, &y}, {&dx}, 2, 1, &overwrite, sizeof overwrite};
  ops_expect_refused(&wrong, "P: shape [2,1,2,2], expected [1,1,2,2]");
  tt *all[] = {&x, &P, &y, &dy, &dx, &dP};
  for (size_t i = 0; i < 6; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(bwd_matches_finite_differences) {
  static const int shapes[][4] = {{2, 3, 5, 7}, {1, 1, 1, 1}, {3, 4, 1, 9}};
  for (int s = 0; s < 3; s++)
    for (int extra = 0; extra <= 3; extra += 3) {
      const int *sh = shapes[s];
      uint64_t rng = 77 + (uint64_t)(s * 10 + extra);
      tt x = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], extra);
      tt b = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], 1);
      tt y = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], extra);
      tt r = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], 0);
      tt dx = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], extra);
      tt db = tt_new(BP_ABI_DTYPE_FP32, sh[0], sh[1], sh[2], sh[3], 2);
      /* |x| in [0.1, 1): at least 10 steps h from the kink at 0 */
      tt_rand_away(&x, &rng, 0.1, 1), tt_rand(&b, &rng, -1, 1), tt_rand(&r, &rng, -1, 1);

      ew_ctx relu = {{"relu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite}, &y, &r};
      ops_run(&relu.fwd);
      ops_call rb = {"relu.bwd", {&y, &r}, {&dx}, 2, 1, &overwrite, sizeof overwrite};
      ops_run(&rb);
      const double e_relu = grad_err(&relu, &x, &dx);

      ew_ctx add = {{"add.fwd", {&x, &b}, {&y}, 2, 1, &overwrite, sizeof overwrite}, &y, &r};
      ops_call ab = {"add.bwd", {&r}, {&dx, &db}, 1, 2, &overwrite, sizeof overwrite};
      ops_run(&ab);
      const double e_a = grad_err(&add, &x, &dx), e_b = grad_err(&add, &b, &db);

      ew_ctx gelu = {{"gelu.fwd", {&b}, {&y}, 1, 1, &overwrite, sizeof overwrite}, &y, &r};
      ops_call gb = {"gelu.bwd", {&b, &r}, {&db}, 2, 1, &overwrite, sizeof overwrite};
      ops_run(&gb);
      const double e_gelu = grad_err(&gelu, &b, &db);

      ew_ctx gelu_tanh = {{"gelu_tanh.fwd", {&b}, {&y}, 1, 1, &overwrite, sizeof overwrite}, &y, &r};
      ops_call tb = {"gelu_tanh.bwd", {&b, &r}, {&db}, 2, 1, &overwrite, sizeof overwrite};
      ops_run(&tb);
      const double e_gelu_tanh = grad_err(&gelu_tanh, &b, &db);
      printf("elementwise shape %d%s: err relu %.2e add a %.2e b %.2e gelu %.2e gelu_tanh %.2e\n",
             s, extra ? " (padded)" : "", e_relu, e_a, e_b, e_gelu, e_gelu_tanh);
      ck_assert(e_relu < OPS_FD_TOL && e_a < OPS_FD_TOL && e_b < OPS_FD_TOL);
      ck_assert(e_gelu < OPS_FD_TOL && e_gelu_tanh < OPS_FD_TOL);

      /* pos_embed: L = sum r .* (b + P), P one sample of the shape */
      tt P = tt_new(BP_ABI_DTYPE_FP32, 1, sh[1], sh[2], sh[3], extra);
      tt dP = tt_new(BP_ABI_DTYPE_FP32, 1, sh[1], sh[2], sh[3], 1);
      tt_rand(&P, &rng, -1, 1);
      ew_ctx pe = {{"pos_embed.fwd", {&b, &P}, {&y}, 2, 1, &overwrite, sizeof overwrite}, &y, &r};
      ops_call pb = {"pos_embed.bwd", {&r}, {&db, &dP}, 1, 2, &overwrite, sizeof overwrite};
      ops_run(&pb);
      const double e_pe_x = grad_err(&pe, &b, &db), e_pe_p = grad_err(&pe, &P, &dP);
      printf("elementwise shape %d%s: err pos_embed x %.2e P %.2e\n", s, extra ? " (padded)" : "",
             e_pe_x, e_pe_p);
      ck_assert(e_pe_x < OPS_FD_TOL && e_pe_p < OPS_FD_TOL);
      ck_assert(tt_padding_intact(&P) && tt_padding_intact(&dP));
      tt_free(&P);
      tt_free(&dP);
      tt *all[] = {&x, &b, &y, &r, &dx, &db};
      for (size_t i = 0; i < 6; i++) {
        ck_assert(tt_padding_intact(all[i]));
        tt_free(all[i]);
      }
    }
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  tt a = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 4, 0), b = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 4, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 4, 0), odd = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 4, 4, 0);
  tt i8 = tt_new(BP_ABI_DTYPE_INT8, 2, 3, 3, 4, 0);
  ops_call c = {"add.fwd", {&a, &odd}, {&y}, 2, 1, &overwrite, sizeof overwrite};
  ops_expect_refused(&c, "input 1: shape [2,3,4,4], expected [2,3,3,4]");
  c.in[1] = &b, c.out[0] = &i8;
  ops_expect_refused(&c, "output 0: dtype int8, expected fp32");
  const bp_elementwise_attrs bad = {2};
  c.out[0] = &y, c.attrs = &bad;
  ops_expect_refused(&c, "accumulate");
  ops_call r = {"relu.bwd", {&y}, {&a}, 1, 1, &overwrite, sizeof overwrite};
  ops_expect_refused(&r, "expects 2 inputs and 1 outputs");
  ops_call ab = {"add.bwd", {&y}, {&a, &odd}, 1, 2, &overwrite, sizeof overwrite};
  ops_expect_refused(&ab, "output 1: shape");
  /* no attribute block at all: accumulate reads as 0 */
  ops_call none = {"relu.fwd", {&a}, {&y}, 1, 1, NULL, 0};
  ops_run(&none);
  tt *all[] = {&a, &b, &y, &odd, &i8};
  for (size_t i = 0; i < 5; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_elementwise");
  TCase *tc = tcase_create("elementwise");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, relu_by_hand);
  tcase_add_test(tc, gelu_by_hand);
  tcase_add_test(tc, gelu_tanh_by_hand);
  tcase_add_test(tc, pos_embed_by_hand);
  tcase_add_test(tc, relu_flags_and_partial_overlap);
  tcase_add_test(tc, add_by_hand);
  tcase_add_test(tc, bwd_matches_finite_differences);
  tcase_add_test(tc, supports_refuses_with_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
