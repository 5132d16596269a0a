/* Pooling reference kernels: max pool (mask, ties, padding never wins),
 * average pool (count_include_pad both ways), global average pool; forward
 * by hand, backward against central finite differences, accumulate,
 * refusals. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_ref_util.h"

static bp_pool_attrs pool_attrs(int k, int s, int p, int include_pad, int accumulate) {
  bp_pool_attrs a = {k, k, s, s, p, p, include_pad, accumulate};
  return a;
}

START_TEST(maxpool_by_hand_and_ties) {
  /* x 4x4, 2x2 windows, stride 2:
   *   [ 1 7 | 5 5 ]    window (0,0) = 1 7 / 7 2: max 7, first at tap (0,1) -> mask 1
   *   [ 7 2 | 5 5 ]    window (0,1) = all 5: a tie, the first tap wins -> mask 0
   *   [ 0 0 | 3 9 ]    window (1,0) = 0 0 / 0 -1: mask 0
   *   [ 0 -1| 9 4 ]    window (1,1) = 3 9 / 9 4: 9 at (0,1) first -> mask 1 */
  for (int extra = 0; extra <= 5; extra += 5) {
    tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 4, 4, 1, extra), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, extra);
    tt m = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 1, 7);
    tt_set(&x, (const float[]){1, 7, 5, 5, 7, 2, 5, 5, 0, 0, 3, 9, 0, -1, 9, 4});
    bp_pool_attrs a = pool_attrs(2, 2, 0, 0, 0);
    ops_call f = {"maxpool.fwd", {&x}, {&y, &m}, 1, 2, &a, sizeof a};
    ops_run(&f);
    ops_expect_close(&y, (const float[]){7, 5, 0, 9}, 0, "y");
    const int8_t expect_mask[] = {1, 0, 0, 1};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(*tt_i8(&m, 0, i / 2, i % 2, 0), expect_mask[i]);
    /* backward: dy = [10 20 30 40] lands on the winners only */
    tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 1, 4, 4, 1, extra);
    tt_set(&dy, (const float[]){10, 20, 30, 40});
    tt_rand(&dx, &(uint64_t){5}, -3, 3); /* stale values get overwritten */
    ops_call b = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &a, sizeof a};
    ops_run(&b);
    ops_expect_close(&dx, (const float[]){0, 10, 20, 0, 0, 0, 0, 0, 30, 0, 0, 40, 0, 0, 0, 0}, 0, "dx");
    ck_assert(tt_padding_intact(&y) && tt_padding_intact(&m) && tt_padding_intact(&dx));
    tt_free(&x), tt_free(&y), tt_free(&m), tt_free(&dy), tt_free(&dx);
  }
}
END_TEST

START_TEST(maxpool_padding_never_wins) {
  /* x 3x3 = -1..-9 (all below the zero padding), 2x2 windows, stride 2,
   * pad 1: OH = (3 + 2 - 2)/2 + 1 = 2.
   *   window (0,0): rows -1..0, cols -1..0 -> only x[0,0] = -1 at tap (1,1): mask 3
   *   window (0,1): rows -1..0, cols 1..2 -> -2, -3: -2 at tap (1,0): mask 2
   *   window (1,0): rows 1..2, cols -1..0 -> -4, -7: -4 at tap (0,1): mask 1
   *   window (1,1): rows 1..2, cols 1..2 -> -5 -6 -8 -9: -5 at tap (0,0): mask 0 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 2), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0);
  tt m = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 1, 0);
  tt_set(&x, (const float[]){-1, -2, -3, -4, -5, -6, -7, -8, -9});
  bp_pool_attrs a = pool_attrs(2, 2, 1, 0, 0);
  ops_call f = {"maxpool.fwd", {&x}, {&y, &m}, 1, 2, &a, sizeof a};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){-1, -2, -4, -5}, 0, "y");
  const int8_t expect_mask[] = {3, 2, 1, 0};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(*tt_i8(&m, 0, i / 2, i % 2, 0), expect_mask[i]);
  tt_free(&x), tt_free(&y), tt_free(&m);
}
END_TEST

START_TEST(maxpool_bwd_refuses_bad_mask) {
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0), m = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 1, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 0);
  bp_pool_attrs a = pool_attrs(2, 2, 1, 0, 0);
  ops_call b = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &a, sizeof a};
  for (int i = 0; i < 9; i++) *tt_at(&dx, i) = 42;
  /* window (0,0) only has tap 3 in bounds: mask 0 points into the padding */
  *tt_i8(&m, 0, 0, 0, 0) = 0;
  ck_assert_int_eq(ops_run_raw(&b), BP_ABI_ERR_INVALID);
  *tt_i8(&m, 0, 0, 0, 0) = 3;
  *tt_i8(&m, 0, 1, 1, 0) = 4; /* beyond kh*kw */
  ck_assert_int_eq(ops_run_raw(&b), BP_ABI_ERR_INVALID);
  *tt_i8(&m, 0, 1, 1, 0) = -1;
  ck_assert_int_eq(ops_run_raw(&b), BP_ABI_ERR_INVALID);
  for (int i = 0; i < 9; i++) ck_assert_float_eq(*tt_at(&dx, i), 42.0f); /* untouched */
  tt_free(&dy), tt_free(&m), tt_free(&dx);
}
END_TEST

START_TEST(avgpool_count_include_pad_both_ways) {
  /* x 3x3 = 1..9, 2x2 windows, stride 2, pad 1 (windows as in the max pool
   * case above): in-bounds sums 1, 2+3, 4+7, 5+6+8+9 = 1, 5, 11, 28
   *   count_include_pad 1: / 4        -> 0.25, 1.25, 2.75, 7
   *   count_include_pad 0: / in-bounds -> 1/1, 5/2, 11/2, 28/4 = 1, 2.5, 5.5, 7 */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 3), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 1);
  tt_set(&x, (const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
  bp_pool_attrs inc = pool_attrs(2, 2, 1, 1, 0), exc = pool_attrs(2, 2, 1, 0, 0);
  ops_call f = {"avgpool.fwd", {&x}, {&y}, 1, 1, &inc, sizeof inc};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){0.25f, 1.25f, 2.75f, 7}, 0, "y include pad");
  f.attrs = &exc;
  ops_run(&f);
  ops_expect_close(&y, (const float[]){1, 2.5f, 5.5f, 7}, 0, "y exclude pad");
  /* backward, dy = [4 4 4 8]: each in-bounds tap gets dy / divisor
   *   include pad: 1 1 1 / 1 2 2 / 1 2 2     exclude pad: 4 2 2 / 2 2 2 / 2 2 2 */
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 1, 3, 3, 1, 2);
  tt_set(&dy, (const float[]){4, 4, 4, 8});
  ops_call b = {"avgpool.bwd", {&dy}, {&dx}, 1, 1, &inc, sizeof inc};
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){1, 1, 1, 1, 2, 2, 1, 2, 2}, 0, "dx include pad");
  b.attrs = &exc;
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){4, 2, 2, 2, 2, 2, 2, 2, 2}, 0, "dx exclude pad");
  ck_assert(tt_padding_intact(&y) && tt_padding_intact(&dx));
  tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx);
}
END_TEST

START_TEST(global_avgpool_by_hand) {
  /* x [1,2,2,2]: channel 0 = 1 2 3 4 -> 2.5, channel 1 = 10 20 30 40 -> 25;
   * backward of dy = [4, -8]: every pixel gets [1, -2] */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 2, 1), y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 3);
  tt_set(&x, (const float[]){1, 10, 2, 20, 3, 30, 4, 40});
  bp_elementwise_attrs a = {0}, acc = {1};
  ops_call f = {"global_avgpool.fwd", {&x}, {&y}, 1, 1, &a, sizeof a};
  ops_run(&f);
  ops_expect_close(&y, (const float[]){2.5f, 25}, 0, "y");
  tt dy = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), dx = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 2, 2);
  tt_set(&dy, (const float[]){4, -8});
  ops_call b = {"global_avgpool.bwd", {&dy}, {&dx}, 1, 1, &a, sizeof a};
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){1, -2, 1, -2, 1, -2, 1, -2}, 0, "dx");
  b.attrs = &acc;
  ops_run(&b);
  ops_expect_close(&dx, (const float[]){2, -4, 2, -4, 2, -4, 2, -4}, 0, "dx accumulated");
  ck_assert(tt_padding_intact(&y) && tt_padding_intact(&dx));
  tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx);
}
END_TEST

/* ---- backward against finite differences ------------------------------- */

typedef struct pool_case {
  const char *kind; /* "max", "avg", "avg_inc", "gap" */
  int n, h, w, c, k, s, p;
} pool_case;

static const pool_case cases[] = {
    {"max", 2, 6, 6, 3, 2, 2, 0},  /* the CNN's 2x2 / 2 */
    {"max", 1, 7, 5, 2, 3, 2, 1},  /* odd sizes, overlapping windows, padding */
    {"max", 2, 5, 5, 3, 3, 1, 1},  /* stride 1: every input in several windows */
    {"avg", 2, 7, 6, 3, 3, 2, 1},  /* exclude padding */
    {"avg_inc", 1, 7, 6, 4, 3, 2, 1}, /* include padding */
    {"avg_inc", 2, 5, 5, 2, 2, 1, 1},
    {"avg", 1, 4, 4, 5, 2, 2, 0},
    {"gap", 3, 3, 5, 4, 0, 0, 0},
    {"gap", 1, 1, 1, 7, 0, 0, 0},
};

typedef struct pool_ctx {
  ops_call fwd;
  tt *y, *r;
} pool_ctx;

static double pool_loss(void *p) {
  pool_ctx *ctx = p;
  ops_run(&ctx->fwd);
  return ops_dot(ctx->r, ctx->y);
}

/* Distinct values at least 0.05 apart, so no max tie moves within +-h. */
static void fill_distinct(tt *x, uint64_t *rng) {
  const int64_t n = tt_count(x);
  for (int64_t i = 0; i < n; i++) *tt_at(x, i) = (float)(0.05 * (double)i - 0.025 * (double)n);
  for (int64_t i = n - 1; i > 0; i--) { /* shuffle */
    const int64_t j = (int64_t)(tt_rand_unit(rng) * (double)(i + 1));
    const float t = *tt_at(x, i);
    *tt_at(x, i) = *tt_at(x, j);
    *tt_at(x, j) = t;
  }
}

static void check_case(const pool_case *pc, int extra, uint64_t seed) {
  const int gap = pc->kind[0] == 'g', max = pc->kind[0] == 'm';
  const int oh = gap ? 1 : (pc->h + 2 * pc->p - pc->k) / pc->s + 1;
  const int ow = gap ? 1 : (pc->w + 2 * pc->p - pc->k) / pc->s + 1;
  tt x = tt_new(BP_ABI_DTYPE_FP32, pc->n, pc->h, pc->w, pc->c, extra);
  tt y = tt_new(BP_ABI_DTYPE_FP32, pc->n, oh, ow, pc->c, extra);
  tt m = tt_new(BP_ABI_DTYPE_INT8, pc->n, oh, ow, pc->c, extra ? 8 - pc->c % 8 : 0);
  tt r = tt_new(BP_ABI_DTYPE_FP32, pc->n, oh, ow, pc->c, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, pc->n, pc->h, pc->w, pc->c, extra + 2);
  uint64_t rng = seed;
  fill_distinct(&x, &rng);
  tt_rand(&r, &rng, -1, 1);
  tt_rand(&dx, &rng, -5, 5);
  bp_pool_attrs a = pool_attrs(pc->k, pc->s, pc->p, pc->kind[3] == '_', 0);
  bp_elementwise_attrs ea = {0};
  pool_ctx ctx = {{NULL, {&x}, {&y, &m}, 1, max ? 2 : 1, &a, sizeof a}, &y, &r};
  ops_call b = {NULL, {&r, &m}, {&dx}, max ? 2 : 1, 1, &a, sizeof a};
  if (gap) {
    ctx.fwd.op = "global_avgpool.fwd", b.op = "global_avgpool.bwd";
    ctx.fwd.attrs = b.attrs = &ea, ctx.fwd.attr_size = b.attr_size = sizeof ea;
  } else {
    ctx.fwd.op = max ? "maxpool.fwd" : "avgpool.fwd";
    b.op = max ? "maxpool.bwd" : "avgpool.bwd";
  }
  ops_run(&ctx.fwd); /* the mask for maxpool.bwd */
  ops_run(&b);
  double *num = malloc(sizeof(double) * (size_t)tt_count(&x));
  ops_fd_grad(pool_loss, &ctx, &x, OPS_FD_H, num);
  const double err = ops_grad_err(&dx, num);
  free(num);
  printf("pool case %d (%s)%s: err dx %.2e\n", (int)(pc - cases), pc->kind, extra ? " (padded)" : "", err);
  ck_assert_msg(err < OPS_FD_TOL, "case %d: %.3g", (int)(pc - cases), err);

  /* accumulate adds */
  tt before = tt_new(BP_ABI_DTYPE_FP32, pc->n, pc->h, pc->w, pc->c, 0);
  tt dx2 = tt_new(BP_ABI_DTYPE_FP32, pc->n, pc->h, pc->w, pc->c, extra);
  tt_rand(&before, &rng, -1, 1);
  tt_copy(&dx2, &before);
  bp_pool_attrs acc = a;
  acc.accumulate = 1;
  bp_elementwise_attrs eacc = {1};
  b.out[0] = &dx2;
  if (gap) b.attrs = &eacc;
  else b.attrs = &acc;
  ops_run(&b);
  ops_expect_accumulated(&dx2, &before, &dx, "dx");
  tt *all[] = {&x, &y, &m, &r, &dx, &before, &dx2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert_msg(tt_padding_intact(all[i]), "case %d: padding of tensor %d", (int)(pc - cases), (int)i);
    tt_free(all[i]);
  }
}

START_TEST(bwd_matches_finite_differences) {
  check_case(&cases[_i], 0, 500 + (uint64_t)_i);
  check_case(&cases[_i], 3, 600 + (uint64_t)_i);
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 3, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 3, 0);
  tt m = tt_new(BP_ABI_DTYPE_INT8, 2, 3, 3, 3, 0), mf = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 3, 0);
  tt m2 = tt_new(BP_ABI_DTYPE_INT8, 2, 3, 2, 3, 0);
  bp_pool_attrs a = pool_attrs(2, 2, 0, 0, 0);
  ops_call ok = {"maxpool.fwd", {&x}, {&y, &m}, 1, 2, &a, sizeof a};
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  ops_call c = ok;
  c.out[1] = &mf;
  ops_expect_refused(&c, "mask: dtype fp32, expected int8");
  c = ok, c.out[1] = &m2;
  ops_expect_refused(&c, "mask: shape");
  bp_pool_attrs bad = a;
  c = ok, c.attrs = &bad;
  bad.pad_h = 2; /* pad >= kernel: a window of padding only */
  ops_expect_refused(&c, "padding");
  bad = a, bad.stride_w = 0;
  ops_expect_refused(&c, "stride");
  bad = a, bad.kernel_h = 12, bad.kernel_w = 11; /* 132 taps > int8 */
  ops_expect_refused(&c, "int8");
  bad = a, bad.count_include_pad = 5;
  ops_expect_refused(&c, "count_include_pad");
  bad = a, bad.kernel_h = 8; /* 6 < 8 */
  ops_expect_refused(&c, "smaller than the window");
  ops_call avg = {"avgpool.fwd", {&x}, {&y, &m}, 1, 2, &a, sizeof a};
  ops_expect_refused(&avg, "expects 1 inputs and 1 outputs");
  tt g = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 0);
  ops_call gp = {"global_avgpool.fwd", {&x}, {&g}, 1, 1, NULL, 0};
  ops_expect_refused(&gp, "y: shape [2,1,1,4], expected [2,1,1,3]");
  tt *all[] = {&x, &y, &m, &mf, &m2, &g};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_pool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, maxpool_by_hand_and_ties);
  tcase_add_test(tc, maxpool_padding_never_wins);
  tcase_add_test(tc, maxpool_bwd_refuses_bad_mask);
  tcase_add_test(tc, avgpool_count_include_pad_both_ways);
  tcase_add_test(tc, global_avgpool_by_hand);
  tcase_add_loop_test(tc, bwd_matches_finite_differences, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, supports_refuses_with_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
