/* The ViT's float kernels of the GEMM modules (ops/blas/attention.c,
 * gelu_tanh.c; impl GEMM_IMPL: "blas", or "dnnl" with GEMM_DNNL) against
 * the reference kernels, loaded through the registry: not the same bits
 * (float sums, a polynomial exp) but within validate's FP32 tolerance,
 * max |out - ref| / max(1, max |ref|) <= 1e-4 (docs/validate.md).
 *  - attention on the ViT's shapes (7x7 tokens, D = 64, 4 heads; batch 1,
 *    7, 128) and an odd one (3x5 tokens, D = 12, 3 heads, padded qkv
 *    channels), causal on and off, backward with accumulate 0 and 1; and
 *    the same bits whether the heads run in order, reversed or on four
 *    threads (each head is one task);
 *  - gelu_tanh over a dense sweep of [-20, 20] and the extremes (+-0,
 *    subnormals, +-1e30, +-FLT_MAX), each element within 1e-5 of the
 *    reference relative to max(1, |ref|) (the FP16 atol of gelu_tanh);
 *  - the registry picks GEMM_IMPL over the cpu module for both ops, and a
 *    padded gelu_tanh tensor is refused with a reason. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref_util.h"
#include "thread_modes.h"

#ifdef GEMM_DNNL
#define GEMM_IMPL "dnnl"
#else
#define GEMM_IMPL "blas"
#endif
#define FP32 BP_ABI_DTYPE_FP32
#define TOL 1e-4

static void setup(void) { ops_registry_with(BP_OPS_BLAS_PATH); }

static void run_impl(const char *impl, const ops_call *c, int mode) {
  ops_node n;
  ops_node_open(&n, impl, c, thread_mode_service(mode));
  ops_node_run(&n);
  ops_node_close(&n);
}

/* N, H, W, D, heads, extra qkv channels */
static const int64_t attn_shapes[][6] = {
    {1, 7, 7, 64, 4, 0}, {7, 7, 7, 64, 4, 0}, {128, 7, 7, 64, 4, 0}, {3, 3, 5, 12, 3, 5}};
#define ATTN_CASES ((int)(2 * sizeof attn_shapes / sizeof attn_shapes[0]))

static void expect_close(const tt *out, const tt *ref, const char *what, int shape, int causal,
                         int acc) {
  const double err = ops_rel_err(out, ref);
  ck_assert_msg(err <= TOL, "%s: error %g > %g (shape %d, causal %d, accumulate %d)", what, err,
                TOL, shape, causal, acc);
}

START_TEST(attention_matches_reference) {
  const int64_t *s = attn_shapes[_i / 2];
  const int causal = _i % 2;
  const int64_t N = s[0], H = s[1], W = s[2], D = s[3], heads = s[4];
  uint64_t rng = 70 + (uint64_t)_i;
  tt qkv = tt_new(FP32, N, H, W, 3 * D, s[5]), dy = tt_new(FP32, N, H, W, D, 0);
  tt yr = tt_new(FP32, N, H, W, D, 0), yb = tt_new(FP32, N, H, W, D, 0);
  tt lr = tt_new(FP32, N, H, W, heads, 0), lb = tt_new(FP32, N, H, W, heads, 0);
  tt dr = tt_new(FP32, N, H, W, 3 * D, 0), db = tt_new(FP32, N, H, W, 3 * D, 0);
  tt d2 = tt_new(FP32, N, H, W, 3 * D, 0);
  tt_rand(&qkv, &rng, -2, 2), tt_rand(&dy, &rng, -1, 1);
  for (int acc = 0; acc <= 1; acc++) {
    const bp_attention_attrs a = {(int32_t)heads, causal, acc};
    const ops_call fr = {"attention.fwd", {&qkv}, {&yr, &lr}, 1, 2, &a, sizeof a};
    const ops_call fb = {"attention.fwd", {&qkv}, {&yb, &lb}, 1, 2, &a, sizeof a};
    run_impl("reference", &fr, NO_THREADS), run_impl(GEMM_IMPL, &fb, FOUR_THREADS);
    expect_close(&yb, &yr, "attention y", _i / 2, causal, acc);
    expect_close(&lb, &lr, "attention lse", _i / 2, causal, acc);
    /* the backward of each on the same inputs (the reference's y and lse) */
    tt_rand(&dr, &rng, -1, 1), tt_copy(&db, &dr), tt_copy(&d2, &dr);
    const ops_call br = {"attention.bwd", {&qkv, &yr, &lr, &dy}, {&dr}, 4, 1, &a, sizeof a};
    const ops_call bb = {"attention.bwd", {&qkv, &yr, &lr, &dy}, {&db}, 4, 1, &a, sizeof a};
    const ops_call b2 = {"attention.bwd", {&qkv, &yr, &lr, &dy}, {&d2}, 4, 1, &a, sizeof a};
    run_impl("reference", &br, NO_THREADS), run_impl(GEMM_IMPL, &bb, FOUR_THREADS);
    expect_close(&db, &dr, "attention dqkv", _i / 2, causal, acc);
    /* the same bits on any thread split */
    run_impl(GEMM_IMPL, &b2, REVERSE);
    ck_assert_msg(ops_same_bits(&d2, &db), "dqkv depends on the threads (shape %d)", _i / 2);
    run_impl(GEMM_IMPL, &fr, NO_THREADS);
    ck_assert_msg(ops_same_bits(&yr, &yb) && ops_same_bits(&lr, &lb),
                  "y or lse depends on the threads (shape %d)", _i / 2);
    run_impl("reference", &fr, NO_THREADS);
  }
  ck_assert(tt_padding_intact(&qkv));
  tt *all[] = {&qkv, &dy, &yr, &yb, &lr, &lb, &dr, &db, &d2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* x over [-20, 20] in steps of 1e-4, then the extremes */
START_TEST(gelu_tanh_sweep_matches_reference) {
  static const float extremes[] = {0.0f,    -0.0f,   1e-40f,   -1e-40f, FLT_MIN, -FLT_MIN,
                                   1e-20f,  -1e-20f, 1e30f,    -1e30f,  FLT_MAX, -FLT_MAX,
                                   1e6f,    -1e6f,   20.001f,  -20.001f};
  const int64_t sweep = 400001, nx = (int64_t)(sizeof extremes / sizeof extremes[0]);
  const int64_t n = sweep + nx;
  tt x = tt_new(FP32, n, 1, 1, 1, 0), dy = tt_new(FP32, n, 1, 1, 1, 0);
  tt yr = tt_new(FP32, n, 1, 1, 1, 0), yb = tt_new(FP32, n, 1, 1, 1, 0);
  tt dr = tt_new(FP32, n, 1, 1, 1, 0), db = tt_new(FP32, n, 1, 1, 1, 0);
  for (int64_t i = 0; i < sweep; i++) *tt_at(&x, i) = (float)(-20.0 + 1e-4 * (double)i);
  for (int64_t i = 0; i < nx; i++) *tt_at(&x, sweep + i) = extremes[i];
  uint64_t rng = 90;
  tt_rand(&dy, &rng, -1, 1);
  for (int acc = 0; acc <= 1; acc++) {
    bp_elementwise_attrs a = {acc};
    tt_rand(&dr, &rng, -1, 1), tt_copy(&db, &dr);
    const ops_call fr = {"gelu_tanh.fwd", {&x}, {&yr}, 1, 1, &a, sizeof a};
    const ops_call fb = {"gelu_tanh.fwd", {&x}, {&yb}, 1, 1, &a, sizeof a};
    const ops_call br = {"gelu_tanh.bwd", {&x, &dy}, {&dr}, 2, 1, &a, sizeof a};
    const ops_call bb = {"gelu_tanh.bwd", {&x, &dy}, {&db}, 2, 1, &a, sizeof a};
    run_impl("reference", &fr, NO_THREADS), run_impl(GEMM_IMPL, &fb, FOUR_THREADS);
    run_impl("reference", &br, NO_THREADS), run_impl(GEMM_IMPL, &bb, FOUR_THREADS);
    for (int64_t i = 0; i < n; i++) {
      const float xi = *tt_at(&x, i);
      const double ry = *tt_at(&yr, i), by = *tt_at(&yb, i);
      const double rd = *tt_at(&dr, i), bd = *tt_at(&db, i);
      ck_assert_msg(fabs(by - ry) <= 1e-5 * fmax(1.0, fabs(ry)),
                    "gelu_tanh y(%.9g) = %.9g, reference %.9g", (double)xi, by, ry);
      ck_assert_msg(fabs(bd - rd) <= 1e-5 * fmax(1.0, fabs(rd)),
                    "gelu_tanh dx(%.9g) = %.9g, reference %.9g (accumulate %d)", (double)xi, bd,
                    rd, acc);
    }
  }
  tt *all[] = {&x, &dy, &yr, &yb, &dr, &db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* A NaN in gelu_tanh's input or in attention's scores reaches the outputs
 * (as in the reference; AMP's overflow check relies on it). */
START_TEST(nan_reaches_the_outputs) {
  tt x = tt_new(FP32, 1, 1, 1, 8, 0), y = tt_new(FP32, 1, 1, 1, 8, 0);
  tt dy = tt_new(FP32, 1, 1, 1, 8, 0), dx = tt_new(FP32, 1, 1, 1, 8, 0);
  uint64_t rng = 95;
  tt_rand(&x, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1);
  *tt_at(&x, 3) = NAN;
  bp_elementwise_attrs e = {0};
  const ops_call f = {"gelu_tanh.fwd", {&x}, {&y}, 1, 1, &e, sizeof e};
  const ops_call b = {"gelu_tanh.bwd", {&x, &dy}, {&dx}, 2, 1, &e, sizeof e};
  run_impl(GEMM_IMPL, &f, NO_THREADS), run_impl(GEMM_IMPL, &b, NO_THREADS);
  ck_assert(isnan(*tt_at(&y, 3)) && isnan(*tt_at(&dx, 3)));
  ck_assert(!isnan(*tt_at(&y, 2)) && !isnan(*tt_at(&dx, 2)));
  tt qkv = tt_new(FP32, 1, 2, 2, 12, 0), ya = tt_new(FP32, 1, 2, 2, 4, 0);
  tt l = tt_new(FP32, 1, 2, 2, 1, 0);
  tt_rand(&qkv, &rng, -1, 1);
  *tt_f(&qkv, 0, 0, 0, 0) = NAN; /* q of token 0 */
  const bp_attention_attrs a = {1, 0, 0};
  const ops_call fa = {"attention.fwd", {&qkv}, {&ya, &l}, 1, 2, &a, sizeof a};
  run_impl(GEMM_IMPL, &fa, NO_THREADS);
  ck_assert(isnan(*tt_f(&ya, 0, 0, 0, 0)) && isnan(*tt_f(&l, 0, 0, 0, 0)));
  tt *all[] = {&x, &y, &dy, &dx, &qkv, &ya, &l};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* With the cpu module loaded too, the registry prefers GEMM_IMPL (its
 * priority is higher) for both ops; padded gelu_tanh tensors are refused. */
START_TEST(registry_prefers_the_float_kernels) {
  ops_registry_with(BP_OPS_CPU_PATH);
  tt qkv = tt_new(FP32, 2, 7, 7, 192, 0), y = tt_new(FP32, 2, 7, 7, 64, 0);
  tt l = tt_new(FP32, 2, 7, 7, 4, 0), dq = tt_new(FP32, 2, 7, 7, 192, 0);
  const bp_attention_attrs a = {4, 0, 0};
  const ops_call f = {"attention.fwd", {&qkv}, {&y, &l}, 1, 2, &a, sizeof a};
  const ops_call b = {"attention.bwd", {&qkv, &y, &l, &y}, {&dq}, 4, 1, &a, sizeof a};
  char report[512];
  ck_assert_str_eq(ops_selected_impl(&f, NULL, report, sizeof report), GEMM_IMPL);
  ck_assert_str_eq(ops_selected_impl(&b, NULL, report, sizeof report), GEMM_IMPL);
  bp_elementwise_attrs e = {0};
  const ops_call g = {"gelu_tanh.fwd", {&y}, {&y}, 1, 1, &e, sizeof e};
  ck_assert_str_eq(ops_selected_impl(&g, NULL, report, sizeof report), GEMM_IMPL);
  tt xp = tt_new(FP32, 2, 2, 2, 5, 3), yp = tt_new(FP32, 2, 2, 2, 5, 0);
  const ops_call gp = {"gelu_tanh.fwd", {&xp}, {&yp}, 1, 1, &e, sizeof e};
  const bp_abi_kernel *k = ops_kernel_impl("gelu_tanh.fwd", GEMM_IMPL);
  char reason[256] = "";
  ck_assert(!ops_kernel_supports(k, &gp, reason, sizeof reason));
  ck_assert_msg(strstr(reason, "input 0") && strstr(reason, "adjacent"), "%s", reason);
  tt *all[] = {&qkv, &y, &l, &dq, &xp, &yp};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_" GEMM_IMPL "_vit");
  TCase *tc = tcase_create("ops_" GEMM_IMPL "_vit");
  tcase_add_unchecked_fixture(tc, setup, NULL);
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, attention_matches_reference, 0, ATTN_CASES);
  tcase_add_test(tc, gelu_tanh_sweep_matches_reference);
  tcase_add_test(tc, nan_reaches_the_outputs);
  tcase_add_test(tc, registry_prefers_the_float_kernels);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
