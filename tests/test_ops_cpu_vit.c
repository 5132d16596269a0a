/* The ViT ops of the fast CPU module (ops/cpu/gelu_tanh.c, layernorm.c,
 * pos_embed.c) against the reference kernels: both loaded through the
 * registry, the same inputs, every output compared bit for bit, with
 * accumulate 0 and 1, on the three thread modes of thread_modes.h (in
 * order, reversed, four real threads), so a bit that depends on the task
 * split fails. Shapes: one element, a ViT's 7x7 tokens of 64 and 192
 * channels, channel counts around the eight double lanes (1, 7, 8, 9, 17),
 * enough positions for several layernorm chunks and pos_embed tasks. Then
 * the layouts the fast loops refuse (served by the reference) and the
 * registry's choice of cpu over reference where they do not. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref_util.h"
#include "thread_modes.h"

#define FP32 BP_ABI_DTYPE_FP32

static const int64_t shapes[][4] = {{1, 1, 1, 1},   {2, 7, 7, 64}, {3, 7, 7, 192}, {4, 3, 5, 7},
                                    {2, 4, 4, 8},   {5, 2, 3, 9},  {64, 7, 7, 17}, {2, 1, 1, 1},
                                    {300, 1, 1, 9}};
#define SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void setup(void) { ops_registry_with(BP_OPS_CPU_PATH); }

/* Runs c with impl on the threads of mode. */
static void run_impl(const char *impl, const ops_call *c, int mode) {
  ops_node n;
  ops_node_open(&n, impl, c, thread_mode_service(mode));
  ops_node_run(&n);
  ops_node_close(&n);
}

static tt x_like(const int64_t *s) { return tt_new(FP32, s[0], s[1], s[2], s[3], 0); }

static void expect_same(const tt *cpu, const tt *ref, const char *what, int shape, int mode,
                        int acc) {
  ck_assert_msg(ops_same_bits(cpu, ref), "%s differs from the reference (shape %d, %s, accumulate %d)",
                what, shape, mode_names[mode], acc);
}

START_TEST(gelu_tanh_matches_reference) {
  const int64_t *s = shapes[_i];
  uint64_t rng = 40 + (uint64_t)_i;
  tt x = x_like(s), dy = x_like(s), yr = x_like(s), yc = x_like(s), dr = x_like(s), dc = x_like(s);
  tt_rand(&x, &rng, -6, 6), tt_rand(&dy, &rng, -1, 1);
  for (int mode = 0; mode < MODES; mode++)
    for (int acc = 0; acc <= 1; acc++) {
      bp_elementwise_attrs a = {acc};
      tt_rand(&dr, &rng, -1, 1), tt_copy(&dc, &dr);
      const ops_call fr = {"gelu_tanh.fwd", {&x}, {&yr}, 1, 1, &a, sizeof a};
      const ops_call fc = {"gelu_tanh.fwd", {&x}, {&yc}, 1, 1, &a, sizeof a};
      const ops_call br = {"gelu_tanh.bwd", {&x, &dy}, {&dr}, 2, 1, &a, sizeof a};
      const ops_call bc = {"gelu_tanh.bwd", {&x, &dy}, {&dc}, 2, 1, &a, sizeof a};
      run_impl("reference", &fr, mode), run_impl("cpu", &fc, mode);
      run_impl("reference", &br, mode), run_impl("cpu", &bc, mode);
      expect_same(&yc, &yr, "gelu_tanh y", _i, mode, acc);
      expect_same(&dc, &dr, "gelu_tanh dx", _i, mode, acc);
    }
  tt *all[] = {&x, &dy, &yr, &yc, &dr, &dc};
  for (size_t i = 0; i < 6; i++) tt_free(all[i]);
}
END_TEST

START_TEST(layernorm_matches_reference) {
  const int64_t *s = shapes[_i];
  const int64_t C = s[3];
  uint64_t rng = 50 + (uint64_t)_i;
  /* x-shaped tensors with padded channels; per-position statistics */
  tt x = tt_new(FP32, s[0], s[1], s[2], C, 3), dy = x_like(s);
  tt yr = tt_new(FP32, s[0], s[1], s[2], C, 1), yc = tt_new(FP32, s[0], s[1], s[2], C, 1);
  tt dr = x_like(s), dc = x_like(s);
  tt g = tt_new(FP32, 1, 1, 1, C, 2), b = tt_new(FP32, 1, 1, 1, C, 0);
  tt dgr = tt_new(FP32, 1, 1, 1, C, 0), dgc = tt_new(FP32, 1, 1, 1, C, 0);
  tt dbr = tt_new(FP32, 1, 1, 1, C, 1), dbc = tt_new(FP32, 1, 1, 1, C, 1);
  tt smr = tt_new(FP32, s[0], s[1], s[2], 1, 0), smc = tt_new(FP32, s[0], s[1], s[2], 1, 0);
  tt sir = tt_new(FP32, s[0], s[1], s[2], 1, 0), sic = tt_new(FP32, s[0], s[1], s[2], 1, 0);
  tt_rand(&x, &rng, -3, 5), tt_rand(&dy, &rng, -1, 1);
  tt_rand(&g, &rng, 0.5, 2), tt_rand(&b, &rng, -1, 1);
  for (int mode = 0; mode < MODES; mode++)
    for (int acc = 0; acc <= 1; acc++) {
      bp_layernorm_attrs a = {acc ? 1e-6f : 1e-5f, acc};
      const ops_call fr = {"layernorm.fwd", {&x, &g, &b}, {&yr, &smr, &sir}, 3, 3, &a, sizeof a};
      const ops_call fc = {"layernorm.fwd", {&x, &g, &b}, {&yc, &smc, &sic}, 3, 3, &a, sizeof a};
      run_impl("reference", &fr, mode), run_impl("cpu", &fc, mode);
      expect_same(&yc, &yr, "layernorm y", _i, mode, acc);
      expect_same(&smc, &smr, "layernorm save_mean", _i, mode, acc);
      expect_same(&sic, &sir, "layernorm save_invstd", _i, mode, acc);
      tt_rand(&dr, &rng, -1, 1), tt_copy(&dc, &dr);
      tt_rand(&dgr, &rng, -1, 1), tt_copy(&dgc, &dgr);
      tt_rand(&dbr, &rng, -1, 1), tt_copy(&dbc, &dbr);
      const ops_call br = {"layernorm.bwd", {&x, &dy, &g, &smr, &sir}, {&dr, &dgr, &dbr}, 5, 3,
                           &a, sizeof a};
      const ops_call bc = {"layernorm.bwd", {&x, &dy, &g, &smr, &sir}, {&dc, &dgc, &dbc}, 5, 3,
                           &a, sizeof a};
      run_impl("reference", &br, mode), run_impl("cpu", &bc, mode);
      expect_same(&dc, &dr, "layernorm dx", _i, mode, acc);
      expect_same(&dgc, &dgr, "layernorm dgain", _i, mode, acc);
      expect_same(&dbc, &dbr, "layernorm dbias", _i, mode, acc);
    }
  tt *all[] = {&x, &dy, &yr, &yc, &dr, &dc, &g, &b, &dgr, &dgc, &dbr, &dbc, &smr, &smc, &sir, &sic};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
END_TEST

START_TEST(pos_embed_matches_reference) {
  const int64_t *s = shapes[_i];
  uint64_t rng = 60 + (uint64_t)_i;
  tt x = x_like(s), dy = x_like(s), yr = x_like(s), yc = x_like(s), dr = x_like(s), dc = x_like(s);
  tt P = tt_new(FP32, 1, s[1], s[2], s[3], 0);
  tt dPr = tt_new(FP32, 1, s[1], s[2], s[3], 0), dPc = tt_new(FP32, 1, s[1], s[2], s[3], 0);
  tt_rand(&x, &rng, -3, 3), tt_rand(&dy, &rng, -1, 1), tt_rand(&P, &rng, -0.1, 0.1);
  for (int mode = 0; mode < MODES; mode++)
    for (int acc = 0; acc <= 1; acc++) {
      bp_elementwise_attrs a = {acc};
      tt_rand(&dr, &rng, -1, 1), tt_copy(&dc, &dr);
      tt_rand(&dPr, &rng, -1, 1), tt_copy(&dPc, &dPr);
      const ops_call fr = {"pos_embed.fwd", {&x, &P}, {&yr}, 2, 1, &a, sizeof a};
      const ops_call fc = {"pos_embed.fwd", {&x, &P}, {&yc}, 2, 1, &a, sizeof a};
      const ops_call br = {"pos_embed.bwd", {&dy}, {&dr, &dPr}, 1, 2, &a, sizeof a};
      const ops_call bc = {"pos_embed.bwd", {&dy}, {&dc, &dPc}, 1, 2, &a, sizeof a};
      run_impl("reference", &fr, mode), run_impl("cpu", &fc, mode);
      run_impl("reference", &br, mode), run_impl("cpu", &bc, mode);
      expect_same(&yc, &yr, "pos_embed y", _i, mode, acc);
      expect_same(&dc, &dr, "pos_embed dx", _i, mode, acc);
      expect_same(&dPc, &dPr, "pos_embed dP", _i, mode, acc);
    }
  tt *all[] = {&x, &dy, &yr, &yc, &dr, &dc, &P, &dPr, &dPc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* Padded element-wise tensors go to the reference, with a reason; a dense
 * node gets cpu, and so does a layernorm with padded channels. */
START_TEST(refused_layouts_go_to_the_reference) {
  tt x = tt_new(FP32, 2, 2, 2, 5, 3), y = tt_new(FP32, 2, 2, 2, 5, 0);
  tt P = tt_new(FP32, 1, 2, 2, 5, 0);
  bp_elementwise_attrs a = {0};
  const ops_call gt = {"gelu_tanh.fwd", {&x}, {&y}, 1, 1, &a, sizeof a};
  const ops_call pe = {"pos_embed.fwd", {&x, &P}, {&y}, 2, 1, &a, sizeof a};
  char report[512];
  ck_assert_str_eq(ops_selected_impl(&gt, NULL, report, sizeof report), "reference");
  ck_assert_msg(strstr(report, "not one dense run"), "%s", report);
  ck_assert_str_eq(ops_selected_impl(&pe, NULL, report, sizeof report), "reference");
  tt xd = tt_new(FP32, 2, 2, 2, 5, 0);
  const ops_call dense = {"gelu_tanh.fwd", {&xd}, {&y}, 1, 1, &a, sizeof a};
  ck_assert_str_eq(ops_selected_impl(&dense, NULL, report, sizeof report), "cpu");
  const ops_call ped = {"pos_embed.fwd", {&xd, &P}, {&y}, 2, 1, &a, sizeof a};
  ck_assert_str_eq(ops_selected_impl(&ped, NULL, report, sizeof report), "cpu");
  /* layernorm takes padded channels (x above) */
  tt g = tt_new(FP32, 1, 1, 1, 5, 0), s1 = tt_new(FP32, 2, 2, 2, 1, 0), s2 = tt_new(FP32, 2, 2, 2, 1, 0);
  bp_layernorm_attrs la = {1e-5f, 0};
  const ops_call ln = {"layernorm.fwd", {&x, &g, &g}, {&y, &s1, &s2}, 3, 3, &la, sizeof la};
  ck_assert_str_eq(ops_selected_impl(&ln, NULL, report, sizeof report), "cpu");
  tt *all[] = {&x, &y, &P, &xd, &g, &s1, &s2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_cpu_vit");
  TCase *tc = tcase_create("ops_cpu_vit");
  tcase_add_unchecked_fixture(tc, setup, NULL);
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, gelu_tanh_matches_reference, 0, SHAPES);
  tcase_add_loop_test(tc, layernorm_matches_reference, 0, SHAPES);
  tcase_add_loop_test(tc, pos_embed_matches_reference, 0, SHAPES);
  tcase_add_test(tc, refused_layouts_go_to_the_reference);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
