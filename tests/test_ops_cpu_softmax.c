/* softmax_ce.fwd_bwd of the fast CPU module (ops/cpu/softmax_ce.c)
 * against the reference kernel: both loaded through the registry, the same
 * inputs, loss, correct and every dlogits element compared bit for bit (the
 * padding of a padded dlogits untouched).
 *
 * Shapes: one row, one class, the MLP's 128 x 10 (one task), 700 rows
 * (two blocks of rows, the first in two tasks), 1500 classes (three rows
 * per task), padded logits and
 * dlogits; label smoothing 0, 0.1 and 1, a loss scale, no gradient, loss
 * and correct that already hold a sum; logits with ties, a -inf, and large
 * magnitudes. Each run three ways: without threads, through a
 * parallel_for that runs the tasks in reverse order, and on four real
 * threads. Then the error paths (labels outside [0, K), bad loss scales:
 * BP_ABI_ERR_INVALID with every output untouched; bad attributes refused
 * with the reference's reason), the FP16 refusal and the registry's
 * choice. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"
#include "thread_modes.h"

#define FP32 BP_ABI_DTYPE_FP32
#define FP16 BP_ABI_DTYPE_FP16
#define I32 BP_ABI_DTYPE_INT32

static const bp_abi_kernel *kernel_of(const char *impl) {
  ops_registry_with(BP_OPS_CPU_PATH);
  return ops_kernel_impl("softmax_ce.fwd_bwd", impl);
}

/* ---- threads (the modes: thread_modes.h) ---------------------------------- */

/* run() of impl with the threads of `mode`. */
static int run_mode(const char *impl, const ops_call *c, int mode) {
  const bp_abi_kernel *k = kernel_of(impl);
  ops_args a;
  ops_args_make(&a, c, 1);
  a.args.threads = thread_mode_service(mode);
  return k->run(k->user, &a.args);
}

/* ---- one case ----------------------------------------------------------------- */

typedef struct ce_case {
  int64_t n, k, pad;   /* rows, classes, padded channels of logits and dlogits */
  float smoothing, scale; /* scale 0: no loss_scale input */
  int grad;            /* compute_grad */
  int special;         /* ties, a -inf and large logits */
} ce_case;

typedef struct ce_tensors {
  tt z, labels, ls, loss, correct, dz;
} ce_tensors;

static ce_tensors ce_make(const ce_case *c, uint64_t seed) {
  ce_tensors t;
  uint64_t rng = seed;
  t.z = tt_new(FP32, c->n, 1, 1, c->k, c->pad);
  tt_rand(&t.z, &rng, -4.0, 4.0);
  if (c->special) {
    for (int64_t n = 0; n < c->n; n++) {
      const int64_t k0 = n % c->k, k1 = (n * 7 + 3) % c->k;
      if (n % 3 == 0) *tt_f(&t.z, n, 0, 0, k1) = *tt_f(&t.z, n, 0, 0, k0); /* a tie */
      if (n % 5 == 1) *tt_f(&t.z, n, 0, 0, k0) = -INFINITY;
      if (n % 7 == 2) *tt_f(&t.z, n, 0, 0, k1) = 85.0f * (n % 2 ? 1.0f : -1.0f);
    }
  }
  t.labels = tt_new(I32, c->n, 1, 1, 1, 0);
  for (int64_t n = 0; n < c->n; n++)
    *tt_i32(&t.labels, n, 0, 0, 0) = (int32_t)(tt_rand_unit(&rng) * (double)c->k);
  t.ls = tt_new(FP32, 1, 1, 1, 1, 0);
  *tt_at(&t.ls, 0) = c->scale;
  t.loss = tt_new(FP32, 1, 1, 1, 1, 0);
  t.correct = tt_new(FP32, 1, 1, 1, 1, 0);
  *tt_at(&t.loss, 0) = 1.25f; /* both add to what they hold */
  *tt_at(&t.correct, 0) = 3.0f;
  t.dz = tt_new(FP32, c->n, 1, 1, c->k, c->pad);
  return t;
}

static void ce_free(ce_tensors *t) {
  tt_free(&t->z), tt_free(&t->labels), tt_free(&t->ls), tt_free(&t->loss), tt_free(&t->correct);
  tt_free(&t->dz);
}

static ops_call ce_call(ce_tensors *t, const bp_softmax_ce_attrs *a) {
  ops_call c = {"softmax_ce.fwd_bwd", {&t->z, &t->labels, &t->ls}, {&t->loss, &t->correct, &t->dz},
                2 + (a->has_loss_scale != 0), 2 + (a->compute_grad != 0), a, sizeof *a};
  return c;
}

static bp_softmax_ce_attrs ce_attrs(const ce_case *c) {
  bp_softmax_ce_attrs a = {c->smoothing, 1.0f / (float)c->n, c->grad, c->scale > 0.0f};
  return a;
}

static int same_bits(const tt *a, const tt *b) {
  for (int64_t i = 0; i < tt_count(a); i++)
    if (bits_of(*tt_at(a, i)) != bits_of(*tt_at(b, i))) return 0;
  return 1;
}

static void ce_compare(const ce_case *c) {
  const bp_softmax_ce_attrs a = ce_attrs(c);
  ce_tensors ref = ce_make(c, 11 + (uint64_t)c->n * 31 + (uint64_t)c->k);
  ops_call rc = ce_call(&ref, &a);
  char reason[256];
  ck_assert_msg(ops_kernel_supports(kernel_of("cpu"), &rc, reason, sizeof reason) == 1,
                "N %lld K %lld refused: %s", (long long)c->n, (long long)c->k, reason);
  ck_assert_int_eq(run_mode("reference", &rc, NO_THREADS), BP_ABI_OK);
  for (int mode = 0; mode < MODES; mode++) {
    ce_tensors got = ce_make(c, 11 + (uint64_t)c->n * 31 + (uint64_t)c->k);
    ops_call gc = ce_call(&got, &a);
    ck_assert_int_eq(run_mode("cpu", &gc, mode), BP_ABI_OK);
    const char *m = mode_names[mode];
    ck_assert_msg(bits_of(*tt_at(&got.loss, 0)) == bits_of(*tt_at(&ref.loss, 0)),
                  "N %lld K %lld s %g, %s: loss %.9g, reference %.9g", (long long)c->n,
                  (long long)c->k, (double)c->smoothing, m, (double)*tt_at(&got.loss, 0),
                  (double)*tt_at(&ref.loss, 0));
    ck_assert_msg(bits_of(*tt_at(&got.correct, 0)) == bits_of(*tt_at(&ref.correct, 0)),
                  "N %lld K %lld, %s: correct", (long long)c->n, (long long)c->k, m);
    if (c->grad) {
      ck_assert_msg(same_bits(&got.dz, &ref.dz), "N %lld K %lld s %g, %s: dlogits differ",
                    (long long)c->n, (long long)c->k, (double)c->smoothing, m);
      ck_assert_msg(tt_padding_intact(&got.dz), "N %lld K %lld: padding written", (long long)c->n,
                    (long long)c->k);
    }
    ce_free(&got);
  }
  ce_free(&ref);
}

START_TEST(matches_the_reference_bit_for_bit) {
  static const ce_case cases[] = {
      {1, 3, 0, 0.0f, 0.0f, 1, 0},      {1, 1, 0, 0.1f, 0.0f, 1, 0},
      {5, 10, 0, 0.1f, 0.0f, 1, 1},     {128, 10, 0, 0.0f, 0.0f, 1, 0},
      {128, 10, 0, 0.1f, 0.0f, 1, 1},   {128, 10, 0, 1.0f, 0.0f, 1, 0},
      {128, 10, 0, 0.0f, 65536.0f, 1, 1}, {64, 10, 6, 0.1f, 1024.0f, 1, 1},
      {700, 10, 0, 0.05f, 0.0f, 1, 1},  {700, 10, 0, 0.0f, 0.0f, 0, 1},
      {3, 1500, 0, 0.1f, 0.0f, 1, 1},   {33, 7, 1, 0.0f, 0.0f, 1, 1},
      {200, 103, 5, 0.2f, 8.0f, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ce_compare(&cases[i]);
}
END_TEST

/* ---- errors --------------------------------------------------------------------- */

/* run() returns BP_ABI_ERR_INVALID on both kernels and writes nothing. */
static void expect_invalid_untouched(const ce_case *c, int32_t bad_label, float bad_scale) {
  const bp_softmax_ce_attrs a = ce_attrs(c);
  const char *impls[2] = {"reference", "cpu"};
  for (int i = 0; i < 2; i++) {
    ce_tensors t = ce_make(c, 5);
    *tt_at(&t.ls, 0) = bad_scale; /* read only with has_loss_scale */
    if (bad_label != 0) *tt_i32(&t.labels, c->n - 1, 0, 0, 0) = bad_label;
    for (int64_t e = 0; e < tt_count(&t.dz); e++) *tt_at(&t.dz, e) = 7.0f;
    ops_call call = ce_call(&t, &a);
    ck_assert_int_eq(run_mode(impls[i], &call, FOUR_THREADS), BP_ABI_ERR_INVALID);
    ck_assert(*tt_at(&t.loss, 0) == 1.25f && *tt_at(&t.correct, 0) == 3.0f);
    for (int64_t e = 0; e < tt_count(&t.dz); e++) ck_assert(*tt_at(&t.dz, e) == 7.0f);
    ce_free(&t);
  }
}

START_TEST(refuses_bad_labels_and_scales_untouched) {
  const ce_case plain = {130, 10, 0, 0.0f, 0.0f, 1, 0}, scaled = {130, 10, 0, 0.0f, 2.0f, 1, 0};
  expect_invalid_untouched(&plain, 10, 0.0f);
  expect_invalid_untouched(&plain, -1, 0.0f);
  expect_invalid_untouched(&scaled, 0, 0.0f);
  expect_invalid_untouched(&scaled, 0, -2.0f);
  expect_invalid_untouched(&scaled, 0, INFINITY);
  expect_invalid_untouched(&scaled, 0, NAN);
}
END_TEST

/* Bad attributes: refused by both with the same reason. */
START_TEST(refuses_bad_attributes_like_the_reference) {
  const ce_case c = {4, 5, 0, 0.0f, 0.0f, 1, 0};
  ce_tensors t = ce_make(&c, 3);
  bp_softmax_ce_attrs bad[3] = {ce_attrs(&c), ce_attrs(&c), ce_attrs(&c)};
  bad[0].label_smoothing = 1.5f;
  bad[1].grad_scale = INFINITY;
  bad[2].compute_grad = 2;
  for (int i = 0; i < 3; i++) {
    const ops_call call = ce_call(&t, &bad[i]);
    char r_ref[256], r_cpu[256];
    ck_assert_int_eq(ops_kernel_supports(kernel_of("reference"), &call, r_ref, sizeof r_ref), 0);
    ck_assert_int_eq(ops_kernel_supports(kernel_of("cpu"), &call, r_cpu, sizeof r_cpu), 0);
    ck_assert_str_eq(r_cpu, r_ref);
    ck_assert_int_eq(run_mode("cpu", &call, NO_THREADS), BP_ABI_ERR_INVALID);
  }
  ce_free(&t);
}
END_TEST

/* FP16 logits or dlogits go to the reference, with a reason. */
START_TEST(leaves_fp16_to_the_reference) {
  const ce_case c = {8, 10, 0, 0.0f, 0.0f, 1, 0};
  const bp_softmax_ce_attrs a = ce_attrs(&c);
  for (int which = 0; which < 2; which++) {
    ce_tensors t = ce_make(&c, 9);
    tt *half = which == 0 ? &t.z : &t.dz;
    tt_free(half);
    *half = tt_new(FP16, c.n, 1, 1, c.k, 0);
    const ops_call call = ce_call(&t, &a);
    char reason[256];
    ck_assert_int_eq(ops_kernel_supports(kernel_of("cpu"), &call, reason, sizeof reason), 0);
    ck_assert_msg(strstr(reason, "reference kernel serves") != NULL, "reason: %s", reason);
    ck_assert_int_eq(run_mode("cpu", &call, NO_THREADS), BP_ABI_ERR_INVALID);
    ck_assert_str_eq(ops_selected_impl(&call, NULL, NULL, 0), "reference");
    ce_free(&t);
  }
  ce_tensors t = ce_make(&c, 9);
  const ops_call call = ce_call(&t, &a);
  ck_assert_str_eq(ops_selected_impl(&call, NULL, NULL, 0), "cpu");
  ce_free(&t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_cpu_softmax");
  TCase *tc = tcase_create("softmax_ce");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, matches_the_reference_bit_for_bit);
  tcase_add_test(tc, refuses_bad_labels_and_scales_untouched);
  tcase_add_test(tc, refuses_bad_attributes_like_the_reference);
  tcase_add_test(tc, leaves_fp16_to_the_reference);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
