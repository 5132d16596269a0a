/* The Winograd convolution module (ops/winograd) against the reference
 * kernels: forward (with and without bias), backward-data and
 * backward-filter (accumulate 0 and 1) on odd sizes (partial 4x4 tiles),
 * batch 1, channel counts that are not multiples of 8 and padded
 * channels; one thread and two give the same bits; a prepared node
 * follows new filters run after run, and a call without one gives the
 * same bits; what it does not serve is refused with a reason and left to
 * the others. `blueprint validate --impl winograd` (tests/CMakeLists.txt)
 * covers the rest of the contract case by case. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/threads.h"
#include "ops_ref_util.h"

/* Winograd's F(4x4,3x3) rounding on inputs in [-1, 1) stays near 1e-6 of
 * the largest output; the bound is validate's FP32 tolerance. */
#define WINO_TOL 1e-4
#define F32 BP_ABI_DTYPE_FP32

static bp_registry *both_modules(void) { return ops_registry_with(BP_OPS_WINOGRAD_PATH); }

/* A prepared node (ops_ref_util.h) of either module; neither wants a
 * workspace for these convolutions. */
static void node_open(ops_node *n, const char *impl, const ops_call *c,
                      const bp_abi_threads *threads) {
  both_modules();
  ops_node_open(n, impl, c, threads);
  ck_assert_msg(!n->ws, "%s/%s wants a workspace", c->op, impl);
}

/* One call of kernel `impl` on `threads` (NULL: one thread). */
static void run_once(const char *impl, const ops_call *c, const bp_abi_threads *threads) {
  ops_node n;
  node_open(&n, impl, c, threads);
  ops_node_run(&n);
  ops_node_close(&n);
}

static bp_conv2d_attrs attrs_of(int has_bias, int accumulate) {
  const bp_conv2d_attrs a = {3, 3, 1, 1, 1, 1, 1, 1, 1, has_bias, accumulate};
  return a;
}

/* A shape: batch, size, channels in and out, channel padding of the
 * activations. */
typedef struct shape {
  int64_t n, h, w, c, k, extra;
} shape;

static const shape shapes[] = {
    {1, 1, 1, 16, 16, 0},   /* one partial tile */
    {1, 5, 7, 16, 24, 0},   /* partial tiles on both edges */
    {2, 9, 13, 20, 17, 3},  /* channels no multiple of 8, padded */
    {1, 6, 3, 33, 40, 0},   /* batch 1, a 4-wide output tail */
    {3, 14, 14, 32, 64, 0}, /* the CNN's conv3 at batch 3 */
    {2, 28, 28, 32, 32, 0}, /* conv2 */
    {1, 8, 8, 64, 64, 5},   /* whole tiles only, padded */
};

/* The call on winograd (on `threads`) into its own output and on the
 * reference into ref: their relative error. */
static double pass_err(const ops_call *c, tt *ref, const bp_abi_threads *threads) {
  ops_call cr = *c;
  cr.out[0] = ref;
  run_once("winograd", c, threads);
  run_once("reference", &cr, NULL);
  return ops_rel_err(c->out[0], ref);
}

/* Every pass of shape p against the reference, on `threads`. */
static void check_shape(const shape *p, uint64_t seed, const bp_abi_threads *threads) {
  uint64_t rng = seed;
  tt x = tt_new(F32, p->n, p->h, p->w, p->c, p->extra);
  tt w = tt_new(F32, p->k, 3, 3, p->c, 0);
  tt b = tt_new(F32, 1, 1, 1, p->k, 0);
  tt y = tt_new(F32, p->n, p->h, p->w, p->k, p->extra);
  tt yr = tt_new(F32, p->n, p->h, p->w, p->k, p->extra);
  tt dy = tt_new(F32, p->n, p->h, p->w, p->k, p->extra);
  tt dx = tt_new(F32, p->n, p->h, p->w, p->c, p->extra);
  tt dxr = tt_new(F32, p->n, p->h, p->w, p->c, p->extra);
  tt dw = tt_new(F32, p->k, 3, 3, p->c, 0);
  tt dwr = tt_new(F32, p->k, 3, 3, p->c, 0);
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
  tt_rand(&dy, &rng, -1, 1);
  const long long id = (long long)p->c * 1000 + p->k; /* names the shape in messages */
  for (int has_bias = 0; has_bias < 2; has_bias++) {
    const bp_conv2d_attrs at = attrs_of(has_bias, 0);
    ops_call c = {"conv2d.fwd", {&x, &w, &b}, {&y}, 2 + has_bias, 1, &at, sizeof at};
    const double e = pass_err(&c, &yr, threads);
    ck_assert_msg(e <= WINO_TOL, "%lld %lldx%lld bias %d: forward error %g", id,
                  (long long)p->h, (long long)p->w, has_bias, e);
    ck_assert(tt_padding_intact(&y));
  }
  /* backward-data, then backward-filter; each overwriting, then adding */
  for (int filter = 0; filter < 2; filter++)
    for (int acc = 0; acc < 2; acc++) {
      const bp_conv2d_attrs at = attrs_of(0, acc);
      tt *out = filter ? &dw : &dx, *ref = filter ? &dwr : &dxr;
      tt_rand(out, &rng, -1, 1);
      tt_copy(ref, out);
      ops_call c = {filter ? "conv2d.bwd_filter" : "conv2d.bwd_data",
                    {filter ? &x : &dy, filter ? &dy : &w}, {out}, 2, 1, &at, sizeof at};
      const double e = pass_err(&c, ref, threads);
      ck_assert_msg(e <= WINO_TOL, "%lld %lldx%lld accumulate %d: backward-%s error %g", id,
                    (long long)p->h, (long long)p->w, acc, filter ? "filter" : "data", e);
      if (!filter) ck_assert(tt_padding_intact(out));
    }
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y), tt_free(&yr);
  tt_free(&dy), tt_free(&dx), tt_free(&dxr), tt_free(&dw), tt_free(&dwr);
}

START_TEST(test_every_pass_matches_the_reference_on_odd_sizes_and_channel_counts) {
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    check_shape(&shapes[i], 7 + i, NULL);
}
END_TEST

START_TEST(test_every_pass_matches_the_reference_on_two_threads) {
  bp_threads *pool = NULL;
  ck_assert_int_eq(bp_threads_create(2, &pool), BP_OK);
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    check_shape(&shapes[i], 70 + i, bp_threads_abi(pool));
  bp_threads_destroy(pool);
}
END_TEST

START_TEST(test_one_thread_and_two_give_the_same_bits) {
  bp_threads *pool = NULL;
  ck_assert_int_eq(bp_threads_create(2, &pool), BP_OK);
  uint64_t rng = 5;
  /* 4 images of 14x14: 64 tiles, several blocks per thread */
  tt x = tt_new(F32, 4, 14, 14, 32, 0), w = tt_new(F32, 48, 3, 3, 32, 0);
  tt b = tt_new(F32, 1, 1, 1, 48, 0);
  tt y1 = tt_new(F32, 4, 14, 14, 48, 0), y2 = tt_new(F32, 4, 14, 14, 48, 0);
  tt dx1 = tt_new(F32, 4, 14, 14, 32, 0), dx2 = tt_new(F32, 4, 14, 14, 32, 0);
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
  const bp_conv2d_attrs fa = attrs_of(1, 0), ba = attrs_of(0, 1);
  ops_call f = {"conv2d.fwd", {&x, &w, &b}, {&y1}, 3, 1, &fa, sizeof fa};
  run_once("winograd", &f, NULL);
  f.out[0] = &y2;
  run_once("winograd", &f, bp_threads_abi(pool));
  ck_assert(ops_same_bits(&y1, &y2));
  /* backward-data from y (as dy), accumulating into equal starts */
  tt_rand(&dx1, &rng, -1, 1);
  tt_copy(&dx2, &dx1);
  ops_call d = {"conv2d.bwd_data", {&y1, &w}, {&dx1}, 2, 1, &ba, sizeof ba};
  run_once("winograd", &d, NULL);
  d.out[0] = &dx2;
  run_once("winograd", &d, bp_threads_abi(pool));
  ck_assert(ops_same_bits(&dx1, &dx2));
  /* backward-filter: 16 images, 256 tiles in eight groups, each summed
   * on its own, then added in group order */
  tt xg = tt_new(F32, 16, 14, 14, 32, 0), dyg = tt_new(F32, 16, 14, 14, 48, 0);
  tt dw1 = tt_new(F32, 48, 3, 3, 32, 0), dw2 = tt_new(F32, 48, 3, 3, 32, 0);
  tt_rand(&xg, &rng, -1, 1), tt_rand(&dyg, &rng, -1, 1);
  const bp_conv2d_attrs ga = attrs_of(0, 0);
  ops_call g = {"conv2d.bwd_filter", {&xg, &dyg}, {&dw1}, 2, 1, &ga, sizeof ga};
  run_once("winograd", &g, NULL);
  g.out[0] = &dw2;
  run_once("winograd", &g, bp_threads_abi(pool));
  ck_assert(ops_same_bits(&dw1, &dw2));
  tt_free(&xg), tt_free(&dyg), tt_free(&dw1), tt_free(&dw2);
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y1), tt_free(&y2), tt_free(&dx1), tt_free(&dx2);
  bp_threads_destroy(pool);
}
END_TEST

START_TEST(test_a_prepared_node_follows_new_filters_run_after_run) {
  uint64_t rng = 9;
  tt x = tt_new(F32, 2, 10, 11, 16, 0), w = tt_new(F32, 24, 3, 3, 16, 0);
  tt y = tt_new(F32, 2, 10, 11, 24, 0), yr = tt_new(F32, 2, 10, 11, 24, 0);
  tt_rand(&x, &rng, -1, 1);
  const bp_conv2d_attrs at = attrs_of(0, 0);
  ops_call c = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, &at, sizeof at};
  ops_call cr = c;
  cr.out[0] = &yr;
  ops_node n;
  node_open(&n, "winograd", &c, NULL);
  for (int r = 0; r < 3; r++) {
    tt_rand(&w, &rng, -1, 1);
    n.generation++;
    ops_node_run(&n);
    run_once("reference", &cr, NULL);
    ck_assert_msg(ops_rel_err(&y, &yr) <= WINO_TOL, "run %d: error %g", r, ops_rel_err(&y, &yr));
  }
  ops_node_close(&n);
  /* a call without a prepared state makes its own: the same bits */
  ops_call c2 = c;
  c2.out[0] = &yr;
  ck_assert_int_eq(ops_kernel_run(n.k, &c2, NULL, 0), BP_ABI_OK);
  ck_assert(ops_same_bits(&y, &yr));
  tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&yr);
}
END_TEST

/* supports() of winograd's forward says no with `needle` in the reason. */
static void expect_refused(const ops_call *c, const char *needle) {
  both_modules();
  const bp_abi_kernel *k = ops_kernel_impl(c->op, "winograd");
  char why[256] = "";
  ck_assert_msg(!ops_kernel_supports(k, c, why, sizeof why), "%s accepted, expected '%s'", c->op,
                needle);
  ck_assert_msg(strstr(why, needle) != NULL, "reason '%s', expected '%s'", why, needle);
}

START_TEST(test_what_it_does_not_serve_is_refused_with_a_reason) {
  both_modules();
  tt x = tt_new(F32, 2, 12, 12, 16, 0), w = tt_new(F32, 16, 3, 3, 16, 0);
  tt y = tt_new(F32, 2, 12, 12, 16, 0);
  ops_call c = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, NULL, 0};
  bp_conv2d_attrs at = attrs_of(0, 0);
  c.attrs = &at, c.attr_size = sizeof at;
  char report[1024] = "";
  ck_assert_msg(strcmp(ops_selected_impl(&c, "", report, sizeof report), "winograd") == 0, "%s",
                report);

  tt y6 = tt_new(F32, 2, 6, 6, 16, 0);
  at.stride_h = at.stride_w = 2, c.out[0] = &y6;
  expect_refused(&c, "stride 1");
  at = attrs_of(0, 0), at.pad_h = at.pad_w = 0;
  tt y10 = tt_new(F32, 2, 10, 10, 16, 0);
  c.out[0] = &y10;
  expect_refused(&c, "padding 1");
  at = attrs_of(0, 0), at.dilation_h = at.dilation_w = 2, at.pad_h = at.pad_w = 2;
  c.out[0] = &y;
  expect_refused(&c, "dilation 1");
  tt w5 = tt_new(F32, 16, 5, 5, 16, 0);
  at = attrs_of(0, 0), at.kernel_h = at.kernel_w = 5, at.pad_h = at.pad_w = 2;
  c.in[1] = &w5;
  expect_refused(&c, "3x3 kernel");
  tt wg = tt_new(F32, 16, 3, 3, 8, 0);
  at = attrs_of(0, 0), at.groups = 2;
  c.in[1] = &wg;
  expect_refused(&c, "one group");

  /* few input channels: oneDNN's direct convolution (or the reference) */
  tt x8 = tt_new(F32, 2, 12, 12, 8, 0), w8 = tt_new(F32, 16, 3, 3, 8, 0);
  at = attrs_of(0, 0);
  ops_call c8 = {"conv2d.fwd", {&x8, &w8}, {&y}, 2, 1, &at, sizeof at};
  expect_refused(&c8, "below 16");
  ck_assert_str_ne(ops_selected_impl(&c8, "", NULL, 0), "winograd");
  tt dy8 = tt_new(F32, 2, 12, 12, 8, 0), w168 = tt_new(F32, 8, 3, 3, 16, 0);
  ops_call b8 = {"conv2d.bwd_data", {&dy8, &w168}, {&x}, 2, 1, &at, sizeof at};
  expect_refused(&b8, "below 16");

  /* channels not contiguous: every other float of a channel-padded x */
  tt xs = tt_new(F32, 2, 12, 12, 16, 16);
  ops_call cs = {"conv2d.fwd", {&xs, &w}, {&y}, 2, 1, &at, sizeof at};
  ops_args a;
  ops_args_make(&a, &cs, 0);
  a.in[0].stride[3] = 2;
  const bp_abi_kernel *k = ops_kernel_impl("conv2d.fwd", "winograd");
  char why[256] = "";
  ck_assert_int_eq(k->supports(k->user, &a.args, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "channel stride 2") != NULL, "reason: %s", why);

  /* backward-filter with a bias: db is left to the others */
  tt db = tt_new(F32, 1, 1, 1, 16, 0), dw = tt_new(F32, 16, 3, 3, 16, 0);
  const bp_conv2d_attrs bias = attrs_of(1, 0);
  ops_call f = {"conv2d.bwd_filter", {&x, &y}, {&dw, &db}, 2, 2, &bias, sizeof bias};
  const bp_abi_kernel *kf = ops_kernel_impl("conv2d.bwd_filter", "winograd");
  ck_assert_int_eq(ops_kernel_supports(kf, &f, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "has_bias") != NULL, "reason: %s", why);
  tt_free(&db), tt_free(&dw);

  tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&y6), tt_free(&y10), tt_free(&w5);
  tt_free(&wg), tt_free(&x8), tt_free(&w8), tt_free(&dy8), tt_free(&w168), tt_free(&xs);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_winograd");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_every_pass_matches_the_reference_on_odd_sizes_and_channel_counts);
  tcase_add_test(tc, test_every_pass_matches_the_reference_on_two_threads);
  tcase_add_test(tc, test_one_thread_and_two_give_the_same_bits);
  tcase_add_test(tc, test_a_prepared_node_follows_new_filters_run_after_run);
  tcase_add_test(tc, test_what_it_does_not_serve_is_refused_with_a_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
