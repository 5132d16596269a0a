/* conv2d reference kernels: forward on hand-computed cases, backward-data
 * and backward-filter against central finite differences (stride, padding,
 * dilation, groups, depthwise, bias on/off, odd sizes, padded channels,
 * accumulate), and the refusals of supports(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

static bp_conv2d_attrs conv_attrs(int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                                  int groups, int bias, int accumulate) {
  bp_conv2d_attrs a = {kh, kw, sh, sw, ph, pw, dh, dw, groups, bias, accumulate};
  return a;
}

static ops_call fwd_call(tt *x, tt *w, tt *b, tt *y, const bp_conv2d_attrs *a) {
  ops_call c = {"conv2d.fwd", {x, w, b}, {y}, a->has_bias ? 3 : 2, 1, a, sizeof *a};
  return c;
}

/* ---- forward by hand ---------------------------------------------------- */

START_TEST(fwd_plain_with_bias) {
  for (int extra = 0; extra <= 3; extra += 3) {
    /* x 3x3 = 1..9, w 2x2 = [1 2; 3 4], bias 0.5, stride 1, no padding:
     * y[0,0] = 1*1 + 2*2 + 3*4 + 4*5 = 37     y[0,1] = 1*2 + 2*3 + 3*5 + 4*6 = 47
     * y[1,0] = 1*4 + 2*5 + 3*7 + 4*8 = 67     y[1,1] = 1*5 + 2*6 + 3*8 + 4*9 = 77
     * plus 0.5 each. */
    tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, extra), w = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, extra);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, extra), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, extra);
    tt_set(&x, (const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
    tt_set(&w, (const float[]){1, 2, 3, 4});
    tt_set(&b, (const float[]){0.5f});
    bp_conv2d_attrs a = conv_attrs(2, 2, 1, 1, 0, 0, 1, 1, 1, 1, 0);
    ops_call c = fwd_call(&x, &w, &b, &y, &a);
    ops_run(&c);
    ops_expect_close(&y, (const float[]){37.5f, 47.5f, 67.5f, 77.5f}, 0, "y");
    ck_assert(tt_padding_intact(&y));
    tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y);
  }
}
END_TEST

START_TEST(fwd_padding_stride2) {
  /* x 3x3 = 1..9, 3x3 kernel of ones, pad 1, stride 2: OH = (3+2-3)/2+1 = 2.
   * Each window keeps its in-bounds 2x2 corner:
   * y[0,0] = 1+2+4+5 = 12   y[0,1] = 2+3+5+6 = 16
   * y[1,0] = 4+5+7+8 = 24   y[1,1] = 5+6+8+9 = 28 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 1), w = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 2);
  tt_set(&x, (const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
  tt_set(&w, (const float[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
  bp_conv2d_attrs a = conv_attrs(3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 0);
  ops_call c = fwd_call(&x, &w, NULL, &y, &a);
  ops_run(&c);
  ops_expect_close(&y, (const float[]){12, 16, 24, 28}, 0, "y");
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

START_TEST(fwd_dilation2) {
  /* x 5x5 with x[r,c] = 5r + c + 1, 2x2 kernel [1 10; 100 1000], dilation 2:
   * effective 3x3, OH = 5 - 3 + 1 = 3. Taps (0,0) (0,2) (2,0) (2,2):
   * y[0,0] = x[0,0] + 10 x[0,2] + 100 x[2,0] + 1000 x[2,2] = 1 + 30 + 1100 + 13000 = 14131
   * y[1,2] = x[1,2] + 10 x[1,4] + 100 x[3,2] + 1000 x[3,4] = 8 + 100 + 1800 + 20000 = 21908
   * y[2,2] = x[2,2] + 10 x[2,4] + 100 x[4,2] + 1000 x[4,4] = 13 + 150 + 2300 + 25000 = 27463 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 5, 5, 1, 3), w = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0);
  for (int i = 0; i < 25; i++) *tt_at(&x, i) = (float)(i + 1);
  tt_set(&w, (const float[]){1, 10, 100, 1000});
  bp_conv2d_attrs a = conv_attrs(2, 2, 1, 1, 0, 0, 2, 2, 1, 0, 0);
  ops_call c = fwd_call(&x, &w, NULL, &y, &a);
  ops_run(&c);
  ck_assert_float_eq(*tt_f(&y, 0, 0, 0, 0), 14131.0f);
  ck_assert_float_eq(*tt_f(&y, 0, 1, 2, 0), 21908.0f);
  ck_assert_float_eq(*tt_f(&y, 0, 2, 2, 0), 27463.0f);
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

START_TEST(fwd_groups_and_depthwise) {
  /* groups 2: x [1,1,1,4] = [1 2 3 4], 4 filters of 2 channels:
   *   group 0 (channels 0,1): f0 = [1 1] -> 3, f1 = [2 0] -> 2
   *   group 1 (channels 2,3): f2 = [1 -1] -> -1, f3 = [0 3] -> 12 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 4), w = tt_new(BP_ABI_DTYPE_FP32, 4, 1, 1, 2, 2);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 1);
  tt_set(&x, (const float[]){1, 2, 3, 4});
  tt_set(&w, (const float[]){1, 1, 2, 0, 1, -1, 0, 3});
  bp_conv2d_attrs a = conv_attrs(1, 1, 1, 1, 0, 0, 1, 1, 2, 0, 0);
  ops_call c = fwd_call(&x, &w, NULL, &y, &a);
  ops_run(&c);
  ops_expect_close(&y, (const float[]){3, 2, -1, 12}, 0, "y");
  tt_free(&x), tt_free(&w), tt_free(&y);

  /* depthwise (groups = C = K = 2), 1x2 input rows, 1x2 kernels, bias:
   * x channel 0 = [1 2], channel 1 = [10 20]; w0 = [1 1], w1 = [1 -1]; b = [0.25 -0.25]
   * y0 = 1 + 2 + 0.25 = 3.25, y1 = 10 - 20 - 0.25 = -10.25 */
  tt xd = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 2, 1), wd = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 2, 1, 0);
  tt bd = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), yd = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0);
  tt_set(&xd, (const float[]){1, 10, 2, 20}); /* NHWC: w=0 (c0,c1), w=1 (c0,c1) */
  tt_set(&wd, (const float[]){1, 1, 1, -1});
  tt_set(&bd, (const float[]){0.25f, -0.25f});
  bp_conv2d_attrs ad = conv_attrs(1, 2, 1, 1, 0, 0, 1, 1, 2, 1, 0);
  ops_call cd = fwd_call(&xd, &wd, &bd, &yd, &ad);
  ops_run(&cd);
  ops_expect_close(&yd, (const float[]){3.25f, -10.25f}, 0, "y depthwise");
  tt_free(&xd), tt_free(&wd), tt_free(&bd), tt_free(&yd);
}
END_TEST

/* ---- backward against finite differences ------------------------------- */

typedef struct conv_case {
  int n, h, w, c, k, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias;
} conv_case;

static const conv_case cases[] = {
    /* n  h  w  c  k kh kw sh sw ph pw dh dw  g bias */
    {2, 5, 4, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  /* same padding, bias */
    {1, 7, 6, 2, 3, 3, 2, 2, 2, 1, 0, 1, 1, 1, 0},  /* odd sizes, stride 2, no bias */
    {2, 7, 7, 4, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2, 1},  /* dilation 2, padding 2, groups 2 */
    {1, 6, 5, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 1},  /* depthwise, stride 2 */
    {2, 5, 5, 2, 6, 1, 1, 2, 2, 0, 0, 1, 1, 2, 0},  /* 1x1, groups 2 with 3 filters each */
    {1, 8, 7, 3, 2, 2, 2, 3, 3, 0, 1, 1, 1, 1, 1},  /* stride 3 > kernel: uncovered inputs */
    {3, 4, 6, 9, 5, 2, 3, 1, 2, 1, 2, 2, 1, 1, 1},  /* 9 channels (8 lanes + tail), mixed */
};

typedef struct conv_ctx {
  ops_call fwd;
  tt *y, *r;
} conv_ctx;

static double conv_loss(void *p) {
  conv_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

static double check_grad(conv_ctx *ctx, tt *param, const tt *analytic) {
  double *num = malloc(sizeof(double) * (size_t)tt_count(param));
  ops_fd_grad(conv_loss, ctx, param, OPS_FD_H, num);
  const double err = ops_grad_err(analytic, num);
  free(num);
  return err;
}

static void check_case(const conv_case *cc, int extra, uint64_t seed) {
  const int oh = (cc->h + 2 * cc->ph - (cc->dh * (cc->kh - 1) + 1)) / cc->sh + 1;
  const int ow = (cc->w + 2 * cc->pw - (cc->dw * (cc->kw - 1) + 1)) / cc->sw + 1;
  const int cg = cc->c / cc->groups;
  tt x = tt_new(BP_ABI_DTYPE_FP32, cc->n, cc->h, cc->w, cc->c, extra);
  tt w = tt_new(BP_ABI_DTYPE_FP32, cc->k, cc->kh, cc->kw, cg, extra);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, cc->k, extra);
  tt y = tt_new(BP_ABI_DTYPE_FP32, cc->n, oh, ow, cc->k, extra);
  tt r = tt_new(BP_ABI_DTYPE_FP32, cc->n, oh, ow, cc->k, 2 * extra);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, cc->n, cc->h, cc->w, cc->c, extra + 1);
  tt dw = tt_new(BP_ABI_DTYPE_FP32, cc->k, cc->kh, cc->kw, cg, extra);
  tt db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, cc->k, extra);
  uint64_t rng = seed;
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
  tt_rand(&r, &rng, -1, 1);
  /* stale values: accumulate = 0 must overwrite them */
  tt_rand(&dx, &rng, -5, 5), tt_rand(&dw, &rng, -5, 5), tt_rand(&db, &rng, -5, 5);

  bp_conv2d_attrs a = conv_attrs(cc->kh, cc->kw, cc->sh, cc->sw, cc->ph, cc->pw, cc->dh, cc->dw,
                                 cc->groups, cc->bias, 0);
  ops_call bd = {"conv2d.bwd_data", {&r, &w}, {&dx}, 2, 1, &a, sizeof a};
  ops_call bf = {"conv2d.bwd_filter", {&x, &r}, {&dw, &db}, 2, cc->bias ? 2 : 1, &a, sizeof a};
  ops_run(&bd);
  ops_run(&bf);

  conv_ctx ctx = {fwd_call(&x, &w, &b, &y, &a), &y, &r};
  const double ex = check_grad(&ctx, &x, &dx), ew = check_grad(&ctx, &w, &dw);
  const double eb = cc->bias ? check_grad(&ctx, &b, &db) : 0.0;
  printf("conv2d case %d%s: err dx %.2e dw %.2e db %.2e\n", (int)(cc - cases),
         extra ? " (padded)" : "", ex, ew, eb);
  ck_assert_msg(ex < OPS_FD_TOL && ew < OPS_FD_TOL && eb < OPS_FD_TOL,
                "case %d: dx %.3g dw %.3g db %.3g", (int)(cc - cases), ex, ew, eb);

  /* accumulate = 1 adds to what is there */
  tt dx2 = tt_new(BP_ABI_DTYPE_FP32, cc->n, cc->h, cc->w, cc->c, extra);
  tt dw2 = tt_new(BP_ABI_DTYPE_FP32, cc->k, cc->kh, cc->kw, cg, 0);
  tt db2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, cc->k, 1);
  tt px = tt_new(BP_ABI_DTYPE_FP32, cc->n, cc->h, cc->w, cc->c, 0);
  tt pw = tt_new(BP_ABI_DTYPE_FP32, cc->k, cc->kh, cc->kw, cg, 0);
  tt pb = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, cc->k, 0);
  tt_rand(&px, &rng, -1, 1), tt_rand(&pw, &rng, -1, 1), tt_rand(&pb, &rng, -1, 1);
  tt_copy(&dx2, &px), tt_copy(&dw2, &pw), tt_copy(&db2, &pb);
  bp_conv2d_attrs acc = a;
  acc.accumulate = 1;
  ops_call bd2 = {"conv2d.bwd_data", {&r, &w}, {&dx2}, 2, 1, &acc, sizeof acc};
  ops_call bf2 = {"conv2d.bwd_filter", {&x, &r}, {&dw2, &db2}, 2, cc->bias ? 2 : 1, &acc, sizeof acc};
  ops_run(&bd2);
  ops_run(&bf2);
  ops_expect_accumulated(&dx2, &px, &dx, "dx");
  ops_expect_accumulated(&dw2, &pw, &dw, "dw");
  if (cc->bias) ops_expect_accumulated(&db2, &pb, &db, "db");

  tt *all[] = {&x, &w, &b, &y, &r, &dx, &dw, &db, &dx2, &dw2, &db2, &px, &pw, &pb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert_msg(tt_padding_intact(all[i]), "case %d: padding of tensor %d written",
                  (int)(cc - cases), (int)i);
    tt_free(all[i]);
  }
}

START_TEST(bwd_matches_finite_differences) {
  check_case(&cases[_i], 0, 1000 + (uint64_t)_i);
  check_case(&cases[_i], 3, 2000 + (uint64_t)_i);
}
END_TEST

START_TEST(bwd_filter_without_bias_has_one_output) {
  /* has_bias 0: bwd_filter writes dw only; a second output is refused */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 2, 0), w = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 2, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 2, 0), dw = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 2, 2, 0);
  uint64_t rng = 7;
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&y, &rng, -1, 1);
  bp_conv2d_attrs a = conv_attrs(2, 2, 1, 1, 0, 0, 1, 1, 1, 0, 0);
  ops_call bf = {"conv2d.bwd_filter", {&x, &y}, {&dw}, 2, 1, &a, sizeof a};
  ops_run(&bf);
  ops_call bf2 = {"conv2d.bwd_filter", {&x, &y}, {&dw, &y}, 2, 2, &a, sizeof a};
  ops_expect_refused(&bf2, "expects 2 inputs and 1 outputs");
  tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&dw);
}
END_TEST

/* ---- refusals ----------------------------------------------------------- */

START_TEST(supports_refuses_with_reason) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 4, 0), w = tt_new(BP_ABI_DTYPE_FP32, 6, 3, 3, 2, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 6, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 6, 0);
  bp_conv2d_attrs a = conv_attrs(3, 3, 1, 1, 1, 1, 1, 1, 2, 1, 0);
  ops_call ok = fwd_call(&x, &w, &b, &y, &a);
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);

  ops_call c = ok;
  bp_conv2d_attrs bad = a;
  bad.stride_h = 0;
  c.attrs = &bad;
  ops_expect_refused(&c, "stride");
  bad = a, bad.dilation_w = 0;
  ops_expect_refused(&c, "dilation");
  bad = a, bad.pad_h = -1;
  ops_expect_refused(&c, "padding");
  bad = a, bad.groups = 3;
  ops_expect_refused(&c, "groups 3 must divide");
  bad = a, bad.groups = 0;
  ops_expect_refused(&c, "groups");
  bad = a, bad.has_bias = 2;
  ops_expect_refused(&c, "has_bias");
  bad = a, bad.accumulate = -1;
  ops_expect_refused(&c, "accumulate");
  bad = a, bad.kernel_h = 2; /* disagrees with w */
  ops_expect_refused(&c, "w: shape");
  bad = a, bad.has_bias = 0; /* three inputs for a bias-less conv */
  ops_expect_refused(&c, "expects 2 inputs");

  c = ok;
  c.attr_size = 0; /* no attributes: kernel 0x0 */
  ops_expect_refused(&c, "kernel");
  c.attrs = NULL, c.attr_size = sizeof a;
  ops_expect_refused(&c, "attribute block");

  tt xi = tt_new(BP_ABI_DTYPE_INT32, 2, 5, 5, 4, 0);
  c = ok, c.in[0] = &xi;
  ops_expect_refused(&c, "x: dtype int32, expected fp32");
  tt y2 = tt_new(BP_ABI_DTYPE_FP32, 2, 4, 5, 6, 0);
  c = ok, c.out[0] = &y2;
  ops_expect_refused(&c, "y: shape [2,4,5,6], expected [2,5,5,6]");
  tt b2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 5, 0);
  c = ok, c.in[2] = &b2;
  ops_expect_refused(&c, "b: shape");
  tt wsmall = tt_new(BP_ABI_DTYPE_FP32, 6, 3, 3, 2, 0);
  wsmall.d.slot_bytes = 100;
  c = ok, c.in[1] = &wsmall;
  ops_expect_refused(&c, "slot_bytes");
  tt xo = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 4, 0);
  xo.d.stride[2] = 2; /* channels 0..3 of pixel w overlap pixel w+1 */
  c = ok, c.in[0] = &xo;
  ops_expect_refused(&c, "overlaps");
  tt xp = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 4, 0);
  xp.d.padded_c = 3;
  c = ok, c.in[0] = &xp;
  ops_expect_refused(&c, "padded_c");
  tt xsmall = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 4, 0), ysmall = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 6, 0);
  bad = a, bad.pad_h = 0, bad.pad_w = 0;
  c = ok, c.in[0] = &xsmall, c.out[0] = &ysmall, c.attrs = &bad;
  ops_expect_refused(&c, "smaller than the dilated kernel");
  c = ok, c.nin = 1;
  ops_expect_refused(&c, "expects 3 inputs");

  tt *all[] = {&x, &w, &b, &y, &xi, &y2, &b2, &wsmall, &xo, &xp, &xsmall, &ysmall};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

START_TEST(run_refuses_bad_pointers) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0), w = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0);
  bp_conv2d_attrs a = conv_attrs(3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0);
  ops_call c = fwd_call(&x, &w, NULL, &y, &a);
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_OK);
  c.out[0] = &x; /* in place: not for conv */
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_ERR_INVALID);
  void *keep = y.data;
  y.data = NULL;
  c.out[0] = &y;
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_ERR_INVALID);
  y.data = (char *)keep + 2; /* misaligned */
  ck_assert_int_eq(ops_run_raw(&c), BP_ABI_ERR_INVALID);
  y.data = keep;
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_conv2d");
  TCase *tc = tcase_create("conv2d");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, fwd_plain_with_bias);
  tcase_add_test(tc, fwd_padding_stride2);
  tcase_add_test(tc, fwd_dilation2);
  tcase_add_test(tc, fwd_groups_and_depthwise);
  tcase_add_loop_test(tc, bwd_matches_finite_differences, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, bwd_filter_without_bias_has_one_output);
  tcase_add_test(tc, supports_refuses_with_reason);
  tcase_add_test(tc, run_refuses_bad_pointers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
