/* softmax_ce reference kernel: loss, correct count (ties), gradient and
 * grad_scale by hand, label smoothing, accumulation of loss and correct,
 * large logits, the gradient against central finite differences of the
 * loss, bad labels and the refusals of supports(); mixed precision: FP16
 * logits and dlogits against the FP32 kernel bit for bit, the loss scale
 * (dlogits only, exactly), bad scales and the refusals. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"

typedef struct ce {
  tt z, lab, loss, correct, dz;
} ce;

static ce ce_new(int n, int k, int extra) {
  ce c = {tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, k, extra), tt_new(BP_ABI_DTYPE_INT32, n, 1, 1, 1, extra),
          tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, extra),
          tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, k, 2 * extra)};
  return c;
}
static void ce_free(ce *c) {
  tt *all[] = {&c->z, &c->lab, &c->loss, &c->correct, &c->dz};
  for (int i = 0; i < 5; i++) {
    ck_assert(tt_padding_intact(all[i]));
    tt_free(all[i]);
  }
}
static ops_call ce_call(ce *c, const bp_softmax_ce_attrs *a) {
  ops_call call = {"softmax_ce.fwd_bwd", {&c->z, &c->lab}, {&c->loss, &c->correct, &c->dz}, 2,
                   2 + a->compute_grad, a, sizeof *a};
  return call;
}

START_TEST(by_hand_with_accumulation) {
  for (int extra = 0; extra <= 3; extra += 3) {
    /* row 0: z = [0 0 0], label 1: softmax 1/3 each, loss ln 3; argmax is a
     *        three-way tie, the first (0) wins -> not correct
     * row 1: z = [0 ln3 0], label 1: softmax [1/5 3/5 1/5], loss -ln(3/5) = ln5 - ln3; correct
     * batch loss = ln 5 = 1.6094379; correct = 1
     * loss and correct start at 10 and 3 (accumulate) -> 11.6094379, 4
     * grad_scale 0.5: dz row 0 = ([1/3 1/3 1/3] - [0 1 0]) * 0.5 = [1/6 -1/3 1/6]
     *                 dz row 1 = ([.2 .6 .2] - [0 1 0]) * 0.5 = [0.1 -0.2 0.1] */
    ce c = ce_new(2, 3, extra);
    tt_set(&c.z, (const float[]){0, 0, 0, 0, 1.0986122887f, 0});
    *tt_i32(&c.lab, 0, 0, 0, 0) = 1, *tt_i32(&c.lab, 1, 0, 0, 0) = 1;
    *tt_at(&c.loss, 0) = 10, *tt_at(&c.correct, 0) = 3;
    bp_softmax_ce_attrs a = {0, 0.5f, 1, 0};
    ops_call call = ce_call(&c, &a);
    ops_run(&call);
    ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 11.6094379f, 2e-6f);
    ck_assert_float_eq(*tt_at(&c.correct, 0), 4.0f);
    ops_expect_close(&c.dz, (const float[]){1.0f / 6, -1.0f / 3, 1.0f / 6, 0.1f, -0.2f, 0.1f}, 1e-7, "dz");
    ce_free(&c);
  }
}
END_TEST

START_TEST(label_smoothing_by_hand) {
  /* s = 0.3, K = 3: target = 0.1 off the label, 0.8 on it
   * row 0: z = [0 0 0], label 1: loss = sum t * ln 3 = ln 3 = 1.0986123
   * row 1: z = [0 ln3 0], label 1: lse = ln 5; loss = 0.1 ln5 + 0.8 (ln5 - ln3) + 0.1 ln5
   *        = ln 5 - 0.8 ln 3 = 0.7305481
   * batch loss = 1.8291604; grad_scale 1:
   * dz row 0 = [1/3 - 0.1, 1/3 - 0.8, 1/3 - 0.1] = [0.2333333 -0.4666667 0.2333333]
   * dz row 1 = [0.2 - 0.1, 0.6 - 0.8, 0.2 - 0.1] = [0.1 -0.2 0.1] */
  ce c = ce_new(2, 3, 1);
  tt_set(&c.z, (const float[]){0, 0, 0, 0, 1.0986122887f, 0});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 1, *tt_i32(&c.lab, 1, 0, 0, 0) = 1;
  bp_softmax_ce_attrs a = {0.3f, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ops_run(&call);
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 1.8291604f, 2e-6f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 1.0f);
  ops_expect_close(&c.dz, (const float[]){0.2333333f, -0.4666667f, 0.2333333f, 0.1f, -0.2f, 0.1f}, 2e-7,
                   "dz");
  ce_free(&c);
}
END_TEST

START_TEST(large_logits_are_stable) {
  /* row 0: [1e4, 0, -1e4], label 0: softmax [1, 0, 0] (exp(-1e4) underflows), loss 0, dz 0
   * row 1: [1e4, 1e4, -1e4], label 2: lse = 1e4 + ln 2, loss = 2e4 + ln 2 = 20000.693;
   *        dz = [0.5, 0.5, -1]; the argmax tie goes to 0, not correct
   * row 2: [-1e4, -1e4, -1e4 + 1], label 2: softmax of [0, 0, 1] shifted: stable too */
  ce c = ce_new(3, 3, 0);
  tt_set(&c.z, (const float[]){1e4f, 0, -1e4f, 1e4f, 1e4f, -1e4f, -1e4f, -1e4f, -1e4f + 1});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 0, *tt_i32(&c.lab, 1, 0, 0, 0) = 2, *tt_i32(&c.lab, 2, 0, 0, 0) = 2;
  bp_softmax_ce_attrs a = {0, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ops_run(&call);
  /* row 2: e = exp(1) = 2.7182818, loss = -ln(e/(2+e)) = ln(2+e) - 1 = 0.5514448;
   * dz = [1/(2+e), 1/(2+e), e/(2+e) - 1] = [0.2119416, 0.2119416, -0.4238831] */
  ck_assert(isfinite(*tt_at(&c.loss, 0)));
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 20000.693f + 0.5514448f, 4e-3f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 2.0f);
  ops_expect_close(&c.dz, (const float[]){0, 0, 0, 0.5f, 0.5f, -1, 0.2119416f, 0.2119416f, -0.4238831f},
                   1e-6, "dz");
  ce_free(&c);
}
END_TEST

START_TEST(without_gradient) {
  /* compute_grad 0: two outputs; correct counts rows whose first max is the label */
  ce c = ce_new(3, 2, 0);
  tt_set(&c.z, (const float[]){5, 5, 1, 2, 3, -1});
  *tt_i32(&c.lab, 0, 0, 0, 0) = 1; /* tie -> 0: miss */
  *tt_i32(&c.lab, 1, 0, 0, 0) = 1; /* hit */
  *tt_i32(&c.lab, 2, 0, 0, 0) = 0; /* hit */
  bp_softmax_ce_attrs a = {0, 1, 0, 0};
  ops_call call = ce_call(&c, &a);
  ck_assert_int_eq(call.nout, 2);
  ops_run(&call);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 2.0f);
  /* ln 2 + ln(1 + e^-1) + ln(1 + e^-4) = 0.6931472 + 0.3132617 + 0.0181499 = 1.0245588 */
  ck_assert_float_eq_tol(*tt_at(&c.loss, 0), 1.0245588f, 2e-6f);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(*tt_at(&c.dz, i), 0.0f); /* untouched */
  ce_free(&c);
}
END_TEST

START_TEST(bad_label_changes_nothing) {
  ce c = ce_new(2, 4, 0);
  *tt_i32(&c.lab, 1, 0, 0, 0) = 4;
  *tt_at(&c.loss, 0) = 7;
  bp_softmax_ce_attrs a = {0, 1, 1, 0};
  ops_call call = ce_call(&c, &a);
  ck_assert_int_eq(ops_run_raw(&call), BP_ABI_ERR_INVALID);
  *tt_i32(&c.lab, 1, 0, 0, 0) = -1;
  ck_assert_int_eq(ops_run_raw(&call), BP_ABI_ERR_INVALID);
  ck_assert_float_eq(*tt_at(&c.loss, 0), 7.0f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 0.0f);
  for (int i = 0; i < 8; i++) ck_assert_float_eq(*tt_at(&c.dz, i), 0.0f);
  ce_free(&c);
}
END_TEST

/* L = grad_scale * loss; the loss output is zeroed before every run */
typedef struct ce_ctx {
  ops_call call;
  ce *c;
  double scale;
} ce_ctx;

static double ce_loss(void *p) {
  ce_ctx *ctx = p;
  *tt_at(&ctx->c->loss, 0) = 0;
  ops_run(&ctx->call);
  return ctx->scale * *tt_at(&ctx->c->loss, 0);
}

START_TEST(gradient_matches_finite_differences) {
  static const int shapes[][2] = {{4, 7}, {1, 2}, {5, 10}, {3, 1}};
  static const float smoothing[] = {0, 0.1f, 0.25f, 0};
  for (int s = 0; s < 4; s++)
    for (int extra = 0; extra <= 3; extra += 3) {
      ce c = ce_new(shapes[s][0], shapes[s][1], extra);
      uint64_t rng = 900 + (uint64_t)(s * 10 + extra);
      tt_rand(&c.z, &rng, -3, 3);
      for (int n = 0; n < shapes[s][0]; n++)
        *tt_i32(&c.lab, n, 0, 0, 0) = (int32_t)(tt_rand_unit(&rng) * shapes[s][1]);
      bp_softmax_ce_attrs a = {smoothing[s], 0.25f, 1, 0};
      ce_ctx ctx = {ce_call(&c, &a), &c, 0.25};
      ops_run(&ctx.call);
      bp_softmax_ce_attrs nograd = a;
      nograd.compute_grad = 0;
      ctx.call.attrs = &nograd, ctx.call.nout = 2;
      double *num = malloc(sizeof(double) * (size_t)tt_count(&c.z));
      ops_fd_grad(ce_loss, &ctx, &c.z, OPS_FD_H, num);
      const double err = ops_grad_err(&c.dz, num);
      free(num);
      printf("softmax_ce shape %d%s: err dlogits %.2e\n", s, extra ? " (padded)" : "", err);
      ck_assert_msg(err < OPS_FD_TOL, "shape %d: %.3g", s, err);
      ce_free(&c);
    }
}
END_TEST

START_TEST(supports_refuses_with_reason) {
  ce c = ce_new(2, 3, 0);
  tt labf = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 1, 0), lab3 = tt_new(BP_ABI_DTYPE_INT32, 3, 1, 1, 1, 0);
  tt loss2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0), dz4 = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 4, 0);
  tt z4 = tt_new(BP_ABI_DTYPE_FP32, 2, 2, 1, 3, 0);
  bp_softmax_ce_attrs a = {0.1f, 0.5f, 1, 0}, bad = a;
  ops_call ok = ce_call(&c, &a), call = ok;
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  call.in[1] = &labf;
  ops_expect_refused(&call, "labels: dtype fp32, expected int32");
  call = ok, call.in[1] = &lab3;
  ops_expect_refused(&call, "labels: shape");
  call = ok, call.out[0] = &loss2;
  ops_expect_refused(&call, "loss: shape");
  call = ok, call.out[2] = &dz4;
  ops_expect_refused(&call, "dlogits: shape");
  call = ok, call.in[0] = &z4;
  ops_expect_refused(&call, "logits: shape");
  call = ok, call.attrs = &bad;
  bad.label_smoothing = 1.5f;
  ops_expect_refused(&call, "label_smoothing");
  bad = a, bad.grad_scale = INFINITY;
  ops_expect_refused(&call, "grad_scale");
  bad = a, bad.compute_grad = 2;
  ops_expect_refused(&call, "compute_grad");
  call = ok, call.nout = 2;
  ops_expect_refused(&call, "expects 2 inputs and 3 outputs");
  ce_free(&c);
  tt_free(&labf), tt_free(&lab3), tt_free(&loss2), tt_free(&dz4), tt_free(&z4);
}
END_TEST

/* ---- mixed precision: FP16 logits and dlogits, the loss scale ------------ */

static uint16_t *h16(const tt *t, int64_t n, int64_t k) {
  return (uint16_t *)t->data + n * t->d.stride[0] + k * t->d.stride[3];
}

/* c's logits rounded to FP16 and back (so FP32 and FP16 see the same values). */
static void round_logits_to_fp16(ce *c) {
  for (int64_t i = 0; i < tt_count(&c->z); i++)
    *tt_at(&c->z, i) = bp_sdk_fp16_to_fp32(bp_sdk_fp32_to_fp16(*tt_at(&c->z, i)));
}

START_TEST(fp16_is_the_fp32_kernel_on_widened_logits) {
  /* FP16 logits: the FP32 kernel on the widened values, bit for bit (loss,
   * correct, an FP32 dlogits); an FP16 dlogits is the FP32 one rounded
   * once. And against FP32 logits that were never rounded: close. */
  static const int shapes[][2] = {{4, 7}, {3, 10}, {1, 1}};
  for (int s = 0; s < 3; s++)
    for (int extra = 0; extra <= 3; extra += 3) {
      const int N = shapes[s][0], K = shapes[s][1];
      ce c = ce_new(N, K, extra), exact = ce_new(N, K, extra);
      uint64_t rng = 4200 + (uint64_t)(s * 10 + extra);
      tt_rand(&exact.z, &rng, -8, 8);
      tt_copy(&c.z, &exact.z);
      round_logits_to_fp16(&c);
      for (int n = 0; n < N; n++)
        *tt_i32(&c.lab, n, 0, 0, 0) = *tt_i32(&exact.lab, n, 0, 0, 0) =
            (int32_t)(tt_rand_unit(&rng) * K);
      tt z16 = tt_new(BP_ABI_DTYPE_FP16, N, 1, 1, K, extra);
      tt dz16 = tt_new(BP_ABI_DTYPE_FP16, N, 1, 1, K, 2 * extra);
      tt dz32 = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, K, extra);
      tt loss = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), correct = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) *h16(&z16, n, k) = bp_sdk_fp32_to_fp16(*tt_f(&c.z, n, 0, 0, k));
      bp_softmax_ce_attrs a = {0.1f, 0.25f, 1, 0};
      ops_call ref = ce_call(&c, &a);
      ops_run(&ref);
      ops_call half = {"softmax_ce.fwd_bwd", {&z16, &c.lab}, {&loss, &correct, &dz16}, 2, 3, &a, sizeof a};
      ops_run(&half);
      ck_assert_uint_eq(bits_of(*tt_at(&loss, 0)), bits_of(*tt_at(&c.loss, 0)));
      ck_assert_uint_eq(bits_of(*tt_at(&correct, 0)), bits_of(*tt_at(&c.correct, 0)));
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
          const uint16_t want = bp_sdk_fp32_to_fp16(*tt_f(&c.dz, n, 0, 0, k));
          ck_assert_msg(*h16(&dz16, n, k) == want, "shape %d (%d,%d): %04x, expected %04x", s, n, k,
                        *h16(&dz16, n, k), want);
        }
      /* FP16 logits, FP32 dlogits */
      *tt_at(&loss, 0) = 0, *tt_at(&correct, 0) = 0;
      half.out[2] = &dz32;
      ops_run(&half);
      for (int64_t i = 0; i < tt_count(&dz32); i++)
        ck_assert_uint_eq(bits_of(*tt_at(&dz32, i)), bits_of(*tt_at(&c.dz, i)));
      /* against the unrounded logits: the logits moved by at most 2^-8 */
      ops_call unrounded = ce_call(&exact, &a);
      ops_run(&unrounded);
      ck_assert_float_eq_tol(*tt_at(&loss, 0), *tt_at(&exact.loss, 0), 2e-2 * N);
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
          ck_assert_float_eq_tol(bp_sdk_fp16_to_fp32(*h16(&dz16, n, k)), *tt_f(&exact.dz, n, 0, 0, k),
                                 5e-3);
      ck_assert(tt_padding_intact(&z16) && tt_padding_intact(&dz16) && tt_padding_intact(&dz32));
      ce_free(&c), ce_free(&exact);
      tt_free(&z16), tt_free(&dz16), tt_free(&dz32), tt_free(&loss), tt_free(&correct);
    }
}
END_TEST

START_TEST(loss_scale_multiplies_dlogits_only) {
  /* S = 1024, a power of two: every FP32 dlogits element exactly 1024
   * times the unscaled one; loss and correct not scaled at all. S = 1:
   * the very bits of has_loss_scale 0. FP16 dlogits with S = 65536: the
   * scaled FP32 value rounded once. */
  const int N = 5, K = 9;
  ce base = ce_new(N, K, 3), sc = ce_new(N, K, 3);
  uint64_t rng = 77;
  tt_rand(&base.z, &rng, -4, 4);
  round_logits_to_fp16(&base);
  tt_copy(&sc.z, &base.z);
  for (int n = 0; n < N; n++)
    *tt_i32(&base.lab, n, 0, 0, 0) = *tt_i32(&sc.lab, n, 0, 0, 0) = (int32_t)(tt_rand_unit(&rng) * K);
  bp_softmax_ce_attrs a = {0.05f, 0.125f, 1, 0}, as = a;
  as.has_loss_scale = 1;
  tt S = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  ops_call cb = ce_call(&base, &a);
  ops_run(&cb);
  ops_call cs = {"softmax_ce.fwd_bwd", {&sc.z, &sc.lab, &S}, {&sc.loss, &sc.correct, &sc.dz}, 3, 3, &as,
                 sizeof as};
  static const float scales[] = {1024.0f, 1.0f};
  for (int t = 0; t < 2; t++) {
    *tt_at(&S, 0) = scales[t];
    *tt_at(&sc.loss, 0) = 0, *tt_at(&sc.correct, 0) = 0;
    ops_run(&cs);
    ck_assert_uint_eq(bits_of(*tt_at(&sc.loss, 0)), bits_of(*tt_at(&base.loss, 0)));
    ck_assert_uint_eq(bits_of(*tt_at(&sc.correct, 0)), bits_of(*tt_at(&base.correct, 0)));
    for (int64_t i = 0; i < tt_count(&sc.dz); i++)
      ck_assert_msg(bits_of(*tt_at(&sc.dz, i)) == bits_of(*tt_at(&base.dz, i) * scales[t]),
                    "S %g element %lld: %a, expected %a", (double)scales[t], (long long)i,
                    (double)*tt_at(&sc.dz, i), (double)(*tt_at(&base.dz, i) * scales[t]));
  }
  tt z16 = tt_new(BP_ABI_DTYPE_FP16, N, 1, 1, K, 0), dz16 = tt_new(BP_ABI_DTYPE_FP16, N, 1, 1, K, 0);
  for (int64_t i = 0; i < tt_count(&z16); i++)
    ((uint16_t *)z16.data)[i] = bp_sdk_fp32_to_fp16(*tt_at(&base.z, i));
  *tt_at(&S, 0) = 65536.0f;
  *tt_at(&sc.loss, 0) = 0, *tt_at(&sc.correct, 0) = 0;
  ops_run(&cs); /* FP32 dlogits scaled by 65536 */
  tt loss = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), correct = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  ops_call ch = {"softmax_ce.fwd_bwd", {&z16, &sc.lab, &S}, {&loss, &correct, &dz16}, 3, 3, &as, sizeof as};
  ops_run(&ch);
  ck_assert_uint_eq(bits_of(*tt_at(&loss, 0)), bits_of(*tt_at(&base.loss, 0)));
  for (int64_t i = 0; i < tt_count(&dz16); i++)
    ck_assert_uint_eq(((uint16_t *)dz16.data)[i], bp_sdk_fp32_to_fp16(*tt_at(&sc.dz, i)));
  ce_free(&base), ce_free(&sc);
  tt_free(&S), tt_free(&z16), tt_free(&dz16), tt_free(&loss), tt_free(&correct);
}
END_TEST

START_TEST(bad_loss_scale_changes_nothing) {
  ce c = ce_new(2, 3, 0);
  tt S = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0);
  *tt_at(&c.loss, 0) = 7;
  bp_softmax_ce_attrs a = {0, 1, 1, 1};
  ops_call call = {"softmax_ce.fwd_bwd", {&c.z, &c.lab, &S}, {&c.loss, &c.correct, &c.dz}, 3, 3, &a,
                   sizeof a};
  const float bad[] = {0.0f, -1.0f, INFINITY, NAN};
  char reason[256];
  for (int b = 0; b < 4; b++) {
    *tt_at(&S, 0) = bad[b];
    ck_assert_int_eq(ops_supports(&call, reason, sizeof reason), 1); /* a run-time value */
    ck_assert_msg(ops_run_raw(&call) == BP_ABI_ERR_INVALID, "loss scale %g accepted", (double)bad[b]);
  }
  ck_assert_float_eq(*tt_at(&c.loss, 0), 7.0f);
  ck_assert_float_eq(*tt_at(&c.correct, 0), 0.0f);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(*tt_at(&c.dz, i), 0.0f);
  ce_free(&c);
  tt_free(&S);
}
END_TEST

START_TEST(mixed_precision_refusals_have_reasons) {
  ce c = ce_new(2, 3, 0);
  tt S = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 1, 0), S2 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 2, 0);
  tt S16 = tt_new(BP_ABI_DTYPE_FP16, 1, 1, 1, 1, 0), zi = tt_new(BP_ABI_DTYPE_INT32, 2, 1, 1, 3, 0);
  tt dz8 = tt_new(BP_ABI_DTYPE_INT8, 2, 1, 1, 3, 0);
  bp_softmax_ce_attrs a = {0, 1, 1, 1};
  ops_call ok = {"softmax_ce.fwd_bwd", {&c.z, &c.lab, &S}, {&c.loss, &c.correct, &c.dz}, 3, 3, &a,
                 sizeof a};
  ops_call call = ok;
  char reason[256];
  ck_assert_int_eq(ops_supports(&ok, reason, sizeof reason), 1);
  call.nin = 2; /* has_loss_scale without the input */
  ops_expect_refused(&call, "expects 3 inputs and 3 outputs, got 2");
  bp_softmax_ce_attrs none = a;
  none.has_loss_scale = 0; /* the input without has_loss_scale */
  call = ok, call.attrs = &none;
  ops_expect_refused(&call, "expects 2 inputs and 3 outputs, got 3");
  bp_softmax_ce_attrs two = a;
  two.has_loss_scale = 2;
  call = ok, call.attrs = &two;
  ops_expect_refused(&call, "attribute has_loss_scale is 2");
  call = ok, call.in[2] = &S16;
  ops_expect_refused(&call, "loss_scale: dtype fp16, expected fp32");
  call = ok, call.in[2] = &S2;
  ops_expect_refused(&call, "loss_scale: shape [1,1,1,2]");
  call = ok, call.in[0] = &zi;
  ops_expect_refused(&call, "logits: dtype int32, expected fp32 or fp16");
  call = ok, call.out[2] = &dz8;
  ops_expect_refused(&call, "dlogits: dtype int8, expected fp32 or fp16");
  ce_free(&c);
  tt_free(&S), tt_free(&S2), tt_free(&S16), tt_free(&zi), tt_free(&dz8);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_softmax_ce");
  TCase *tc = tcase_create("softmax_ce");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, by_hand_with_accumulation);
  tcase_add_test(tc, label_smoothing_by_hand);
  tcase_add_test(tc, large_logits_are_stable);
  tcase_add_test(tc, without_gradient);
  tcase_add_test(tc, bad_label_changes_nothing);
  tcase_add_test(tc, gradient_matches_finite_differences);
  tcase_add_test(tc, supports_refuses_with_reason);
  tcase_add_test(tc, fp16_is_the_fp32_kernel_on_widened_logits);
  tcase_add_test(tc, loss_scale_multiplies_dlogits_only);
  tcase_add_test(tc, bad_loss_scale_changes_nothing);
  tcase_add_test(tc, mixed_precision_refusals_have_reasons);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
