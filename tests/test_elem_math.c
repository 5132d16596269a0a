/* The range ops' per-element formulas of ops/shared/elem_math.h, which the
 * reference, ops/cpu and the CUDA kernels all call: the FP16 conversions
 * against the SDK's (every half, a sweep of floats and the hard cases),
 * the non-finite tests against isfinite, and the update, EMA, unscale and
 * loss-scale rules on hand-computed cases (values chosen so that the FP32
 * results are exact, or compared with the double value they round). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "shared/elem_math.h"

static uint32_t bits(float f) { return bp_sdk_bits_of_float(f); }
static float of_bits(uint32_t b) { return bp_sdk_float_of_bits(b); }

/* ---- FP16 conversions ------------------------------------------------------ */

START_TEST(every_half_widens_and_narrows_like_the_sdk) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float mine = bp_fp16_to_fp32((uint16_t)h), sdk = bp_sdk_fp16_to_fp32((uint16_t)h);
    if (bits(mine) != bits(sdk))
      ck_abort_msg("half 0x%04x widens to 0x%08x, the SDK to 0x%08x", h, bits(mine), bits(sdk));
    const uint16_t back = bp_fp32_to_fp16(mine), sdk_back = bp_sdk_fp32_to_fp16(sdk);
    if (back != sdk_back)
      ck_abort_msg("half 0x%04x round trip gives 0x%04x, the SDK 0x%04x", h, back, sdk_back);
    /* the neighbours of every half: just above and below it, and the
     * midpoints to the next half (ties) */
    const float next = bp_sdk_fp16_to_fp32((uint16_t)(h + 1));
    if ((h & 0x7fffu) < 0x7c00u && ((h + 1) & 0x7fffu) <= 0x7c00u && (h & 0x7fffu) != 0x7fffu) {
      const float mid = (float)(((double)sdk + (double)next) / 2.0);
      const float probes[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 2.0f * mid),
                              nextafterf(sdk, 0.0f), nextafterf(sdk, 2.0f * sdk + 1.0f)};
      for (int k = 0; k < 5; k++)
        if (bp_fp32_to_fp16(probes[k]) != bp_sdk_fp32_to_fp16(probes[k]))
          ck_abort_msg("float 0x%08x narrows to 0x%04x, the SDK to 0x%04x", bits(probes[k]),
                       bp_fp32_to_fp16(probes[k]), bp_sdk_fp32_to_fp16(probes[k]));
    }
  }
}
END_TEST

START_TEST(a_sweep_of_floats_narrows_like_the_sdk) {
  /* every 251st bit pattern (all exponents, signs, NaN payloads), plus
   * every float of the binades around the FP16 range's edges */
  for (uint64_t b = 0; b <= 0xffffffffu; b += 251) {
    const float f = of_bits((uint32_t)b);
    if (bp_fp32_to_fp16(f) != bp_sdk_fp32_to_fp16(f))
      ck_abort_msg("float 0x%08x narrows to 0x%04x, the SDK to 0x%04x", (uint32_t)b,
                   bp_fp32_to_fp16(f), bp_sdk_fp32_to_fp16(f));
    if (bp_fp32_nonfinite(f) != !isfinite(f))
      ck_abort_msg("float 0x%08x: nonfinite %d, isfinite %d", (uint32_t)b, bp_fp32_nonfinite(f),
                   isfinite(f) != 0);
  }
  static const uint32_t ranges[][2] = {{0x33000000u, 0x33800000u},
                                       {0x38000000u, 0x38800001u},
                                       {0x477f0000u, 0x47800001u},
                                       {0x7f800000u, 0x7f800100u},
                                       {0xffbfff00u, 0xffc00100u}};
  for (int r = 0; r < 5; r++)
    for (uint32_t b = ranges[r][0]; b < ranges[r][1]; b++)
      for (uint32_t s = 0; s < 2; s++) {
        const float f = of_bits(b ^ (s << 31));
        if (bp_fp32_to_fp16(f) != bp_sdk_fp32_to_fp16(f))
          ck_abort_msg("float 0x%08x narrows to 0x%04x, the SDK to 0x%04x", bits(f),
                       bp_fp32_to_fp16(f), bp_sdk_fp32_to_fp16(f));
      }
}
END_TEST

START_TEST(hand_picked_conversions) {
  static const struct {
    uint32_t f;
    uint16_t h;
  } cases[] = {
      {0x3f800000u, 0x3c00u}, /* 1 */
      {0x80000000u, 0x8000u}, /* -0 keeps its sign */
      {0x477fe000u, 0x7bffu}, /* 65504, the largest half */
      {0x477fefffu, 0x7bffu}, /* just below 65520 */
      {0x477ff000u, 0x7c00u}, /* 65520 ties to the even Inf */
      {0xff800000u, 0xfc00u}, /* -Inf */
      {0x33800000u, 0x0001u}, /* 2^-24, the smallest subnormal */
      {0x33000000u, 0x0000u}, /* 2^-25 ties to the even 0 */
      {0x33000001u, 0x0001u}, /* just above it rounds up */
      {0x33c00000u, 0x0002u}, /* 1.5 * 2^-24 ties to the even 2 */
      {0x387fc000u, 0x03ffu}, /* the largest subnormal */
      {0x387fe000u, 0x0400u}, /* its midpoint to 2^-14 ties up to the smallest normal */
      {0x3f801000u, 0x3c00u}, /* 1 + 2^-11 ties to the even 1 */
      {0x3f803000u, 0x3c02u}, /* 1 + 3*2^-11 ties to the even 1 + 2^-9 */
      {0x7f800001u, 0x7e00u}, /* a signalling NaN with only low payload bits: quiet NaN */
      {0xffc02000u, 0xfe01u}, /* sign and top payload bits kept */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(bp_fp32_to_fp16(of_bits(cases[i].f)) == cases[i].h,
                  "float 0x%08x: got 0x%04x, expected 0x%04x", cases[i].f,
                  bp_fp32_to_fp16(of_bits(cases[i].f)), cases[i].h);
  ck_assert_uint_eq(bits(bp_fp16_to_fp32(0x0001u)), 0x33800000u); /* subnormal: exact */
  ck_assert_uint_eq(bits(bp_fp16_to_fp32(0x7c01u)), 0x7fc02000u); /* NaN made quiet */
  ck_assert_uint_eq(bits(bp_fp16_to_fp32(0xfc00u)), 0xff800000u);
}
END_TEST

START_TEST(non_finite_halves_are_those_with_all_exponent_bits) {
  for (uint32_t h = 0; h < 0x10000u; h++)
    ck_assert_int_eq(bp_fp16_nonfinite((uint16_t)h), !isfinite(bp_sdk_fp16_to_fp32((uint16_t)h)));
}
END_TEST

/* ---- scalars and skip ------------------------------------------------------- */

START_TEST(skip_and_the_run_time_scalar_rules) {
  ck_assert(!bp_skip_set(0.0f));
  ck_assert(!bp_skip_set(-0.0f));
  ck_assert(bp_skip_set(1.0f));
  ck_assert(bp_skip_set(NAN)); /* a NaN flag skips */
  ck_assert(bp_skip_set(1e-45f));
  ck_assert(bp_lr_ok(-1.0f) && bp_lr_ok(0.0f));
  ck_assert(!bp_lr_ok(INFINITY) && !bp_lr_ok(NAN));
  ck_assert(bp_step_ok(1.0f) && bp_step_ok(1e6f));
  ck_assert(!bp_step_ok(0.999f) && !bp_step_ok(NAN) && !bp_step_ok(INFINITY));
  ck_assert(bp_unscale_scale_ok(65536.0f) && bp_unscale_scale_ok(1e-45f));
  ck_assert(!bp_unscale_scale_ok(0.0f) && !bp_unscale_scale_ok(-2.0f));
  ck_assert(!bp_unscale_scale_ok(INFINITY) && !bp_unscale_scale_ok(NAN));
}
END_TEST

START_TEST(unscale_multiplies_the_widened_value_once) {
  const float inv = bp_unscale_inv(65536.0f);
  ck_assert_uint_eq(bits(inv), 0x37800000u); /* 2^-16, exact */
  ck_assert_uint_eq(bits(bp_unscale(0x3c00u, inv)), 0x37800000u);
  ck_assert_uint_eq(bits(bp_unscale(0xc000u, inv)), 0xb8000000u); /* -2 * 2^-16 */
  ck_assert(isinf(bp_unscale(0x7c00u, inv)));
  ck_assert(isnan(bp_unscale(0x7e00u, inv)));
  /* a scale of 3: inv rounded once, the product rounded once */
  const float third = bp_unscale_inv(3.0f);
  ck_assert_uint_eq(bits(third), bits((float)(1.0 / 3.0)));
  ck_assert_uint_eq(bits(bp_unscale(0x4500u /* 5 */, third)), bits((float)(5.0 * (double)third)));
  ck_assert_uint_eq(bits(bp_scale(3.0f, -0.5f)), bits(-1.5f));
}
END_TEST

START_TEST(ema_forms_one_minus_decay_in_double) {
  ck_assert_uint_eq(bits(bp_one_minus(0.75f)), bits(0.25f));
  ck_assert_uint_eq(bits(bp_one_minus(0.9f)), bits((float)(1.0 - (double)0.9f)));
  ck_assert_uint_eq(bits(bp_one_minus(1.0f)), 0u);
  ck_assert_uint_eq(bits(bp_ema(4.0f, 8.0f, 0.75f, 0.25f)), bits(5.0f)); /* 3 + 2 */
  ck_assert_uint_eq(bits(bp_ema(4.0f, 8.0f, 1.0f, 0.0f)), bits(4.0f));
  ck_assert_uint_eq(bits(bp_ema(4.0f, 8.0f, 0.0f, 1.0f)), bits(8.0f));
}
END_TEST

/* ---- SGD --------------------------------------------------------------------- */

START_TEST(sgd_plain_nesterov_and_weight_decay) {
  /* w = 1, g = 0.5, m = 0.25, lr = 0.5, momentum 0.5, weight_decay 0.25:
   * g' = 0.75, m = 0.125 + 0.75 = 0.875, w = 1 - 0.4375 = 0.5625 */
  float w = 1.0f, m = 0.25f;
  bp_sgd(0.5f, &w, &m, 0.5f, 0.5f, 0.25f, 1, 0);
  ck_assert_float_eq(m, 0.875f);
  ck_assert_float_eq(w, 0.5625f);
  /* Nesterov: u = g' + mu*m = 0.75 + 0.4375 = 1.1875; w = 1 - 0.59375 */
  w = 1.0f, m = 0.25f;
  bp_sgd(0.5f, &w, &m, 0.5f, 0.5f, 0.25f, 1, 1);
  ck_assert_float_eq(m, 0.875f);
  ck_assert_float_eq(w, 0.40625f);
  /* without decay: m = 0.125 + 0.5 = 0.625, w = 1 - 0.3125 */
  w = 1.0f, m = 0.25f;
  bp_sgd(0.5f, &w, &m, 0.5f, 0.5f, 0.25f, 0, 0);
  ck_assert_float_eq(m, 0.625f);
  ck_assert_float_eq(w, 0.6875f);
  /* momentum 0: m holds the last gradient */
  w = 2.0f, m = 9.0f;
  bp_sgd(-1.0f, &w, &m, 0.25f, 0.0f, 0.0f, 0, 0);
  ck_assert_float_eq(m, -1.0f);
  ck_assert_float_eq(w, 2.25f);
  /* the decay switch matters: 0 * Inf is NaN, so an Inf weight with
   * weight_decay 0 must not go through the addition */
  w = INFINITY, m = 0.0f;
  bp_sgd(1.0f, &w, &m, 0.5f, 0.0f, 0.0f, 0, 0);
  ck_assert_float_eq(m, 1.0f);
  w = INFINITY, m = 0.0f;
  bp_sgd(1.0f, &w, &m, 0.5f, 0.0f, 0.0f, 1, 0);
  ck_assert(isnan(m));
}
END_TEST

/* ---- AdamW ------------------------------------------------------------------- */

START_TEST(adamw_factors_and_one_step) {
  /* beta1 0.5, beta2 0.75, lr 0.5, weight_decay 0.5, eps 0.25, step 1:
   * bc1 = 0.5, bc2 = 0.25: decay 0.75, -lr/bc1 = -1, sqrt(bc2) = 0.5 */
  bp_adamw_factors f = bp_adamw_factors_of(0.5f, 1.0f, 0.5f, 0.75f, 0.5f, 0.25f);
  ck_assert_float_eq(f.decay, 0.75f);
  ck_assert_float_eq(f.neg_step_size, -1.0f);
  ck_assert_float_eq(f.bc2_sqrt, 0.5f);
  ck_assert_float_eq(f.c1, 0.5f);
  ck_assert_float_eq(f.c2, 0.25f);
  ck_assert_float_eq(f.b1, 0.5f);
  ck_assert_float_eq(f.b2, 0.75f);
  ck_assert_float_eq(f.eps, 0.25f);
  /* w = 1, m = v = 0, g = 2: m = 1, v = 1, denom = 1/0.5 + 0.25 = 2.25,
   * w = 0.75 + (-1 * 1) / 2.25, each step rounded to float */
  float w = 1.0f, m = 0.0f, v = 0.0f;
  bp_adamw(&f, 2.0f, &w, &m, &v);
  ck_assert_float_eq(m, 1.0f);
  ck_assert_float_eq(v, 1.0f);
  const float q = (float)(-1.0 / 2.25);
  ck_assert_uint_eq(bits(w), bits((float)(0.75 + (double)q)));
  ck_assert(fabs(w - (0.75 - 1.0 / 2.25)) < 1e-7);
  /* step 2: bc1 = 0.75, bc2 = 1 - 0.5625 = 0.4375 (exact in double) */
  f = bp_adamw_factors_of(0.5f, 2.0f, 0.5f, 0.75f, 0.0f, 0.25f);
  ck_assert_float_eq(f.decay, 1.0f);
  ck_assert_uint_eq(bits(f.neg_step_size), bits((float)(-(0.5 / 0.75))));
  ck_assert_uint_eq(bits(f.bc2_sqrt), bits((float)sqrt(0.4375)));
  /* zero padding stays zero: 0 / (sqrt(0) + eps) */
  w = m = v = 0.0f;
  bp_adamw(&f, 0.0f, &w, &m, &v);
  ck_assert_uint_eq(bits(w) | bits(m) | bits(v), 0u);
}
END_TEST

/* ---- LARS -------------------------------------------------------------------- */

START_TEST(lars_rate_step_and_offsets) {
  /* |w| = 3, |g| = 4, eta 0.5, weight_decay 0.25: trust = 1.5 / 4.75 */
  ck_assert_uint_eq(bits(bp_lars_rate(3.0, 4.0, 0.5f, 0.25f, 0.5f)),
                    bits((float)(0.5 * (1.5 / 4.75))));
  ck_assert_float_eq(bp_lars_rate(0.0, 4.0, 0.5f, 0.25f, 0.5f), 0.5f); /* trust 1 */
  ck_assert_float_eq(bp_lars_rate(3.0, 0.0, 0.5f, 0.25f, 0.5f), 0.5f);
  /* w = 1, g = 0.5, m = 0.5, r = 0.5, momentum 0.5, weight_decay 0.5:
   * g' = 1, m = 0.25 + 0.5 = 0.75, w = 0.25 */
  float w = 1.0f, m = 0.5f;
  bp_lars(0.5f, &w, &m, 0.5f, 0.5f, 0.5f, 1);
  ck_assert_float_eq(m, 0.75f);
  ck_assert_float_eq(w, 0.25f);
  w = 1.0f, m = 0.5f;
  bp_lars(0.5f, &w, &m, 0.5f, 0.5f, 0.5f, 0); /* no decay: m = 0.5, w = 0.5 */
  ck_assert_float_eq(m, 0.5f);
  ck_assert_float_eq(w, 0.5f);
  const int32_t ok[] = {0, 2, 2, 5}, back[] = {1, 0}, neg[] = {-1, 2}, past[] = {0, 6};
  for (int j = 0; j < 4; j++) ck_assert(bp_lars_offset_ok(ok, j, 5));
  ck_assert(bp_lars_offset_ok(back, 0, 5) && !bp_lars_offset_ok(back, 1, 5));
  ck_assert(!bp_lars_offset_ok(neg, 0, 5));
  ck_assert(!bp_lars_offset_ok(past, 1, 5));
}
END_TEST

/* ---- loss scale -------------------------------------------------------------- */

START_TEST(loss_scale_rule) {
  /* overflow: backoff, good steps reset, step kept */
  float v[4] = {65536.0f, 7.0f, 10.0f, 2.0f};
  bp_loss_scale_update(1.0f, v, 2.0f, 0.5f, 2000);
  ck_assert(v[0] == 32768.0f && v[1] == 0.0f && v[2] == 10.0f && v[3] == 3.0f);
  /* a NaN flag counts as an overflow */
  bp_loss_scale_update(NAN, v, 2.0f, 0.5f, 2000);
  ck_assert(v[0] == 16384.0f && v[3] == 4.0f);
  /* a good step: step and good steps count */
  bp_loss_scale_update(0.0f, v, 2.0f, 0.5f, 2000);
  ck_assert(v[0] == 16384.0f && v[1] == 1.0f && v[2] == 11.0f && v[3] == 4.0f);
  /* growth at the interval */
  v[1] = 1999.0f;
  bp_loss_scale_update(0.0f, v, 2.0f, 0.5f, 2000);
  ck_assert(v[0] == 32768.0f && v[1] == 0.0f && v[2] == 12.0f);
  /* never grows to Inf */
  float big[4] = {0x1.8p127f, 0.0f, 0.0f, 0.0f};
  bp_loss_scale_update(0.0f, big, 2.0f, 0.5f, 1);
  ck_assert(big[0] == 0x1.8p127f && big[1] == 0.0f && big[2] == 1.0f);
  /* a static scale (growth_interval 0) never changes */
  float st[4] = {128.0f, 0.0f, 0.0f, 0.0f};
  bp_loss_scale_update(1.0f, st, 2.0f, 0.5f, 0);
  ck_assert(st[0] == 128.0f && st[3] == 1.0f);
  bp_loss_scale_update(0.0f, st, 2.0f, 0.5f, 0);
  ck_assert(st[0] == 128.0f && st[1] == 1.0f && st[2] == 1.0f);
  /* the state checks: the first bad value */
  const float fine[4] = {1.0f, 0.0f, 0.0f, 0.0f}, zero_scale[4] = {0.0f, 0.0f, 0.0f, 0.0f},
              neg_good[4] = {1.0f, -1.0f, 0.0f, 0.0f}, nan_step[4] = {1.0f, 0.0f, NAN, 0.0f},
              inf_skipped[4] = {1.0f, 0.0f, 0.0f, INFINITY};
  ck_assert_int_eq(bp_loss_scale_bad(fine), -1);
  ck_assert_int_eq(bp_loss_scale_bad(zero_scale), 0);
  ck_assert_int_eq(bp_loss_scale_bad(neg_good), 1);
  ck_assert_int_eq(bp_loss_scale_bad(nan_step), 2);
  ck_assert_int_eq(bp_loss_scale_bad(inf_skipped), 3);
}
END_TEST

int main(void) {
  Suite *s = suite_create("elem_math");
  TCase *tc = tcase_create("range");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, every_half_widens_and_narrows_like_the_sdk);
  tcase_add_test(tc, a_sweep_of_floats_narrows_like_the_sdk);
  tcase_add_test(tc, hand_picked_conversions);
  tcase_add_test(tc, non_finite_halves_are_those_with_all_exponent_bits);
  tcase_add_test(tc, skip_and_the_run_time_scalar_rules);
  tcase_add_test(tc, unscale_multiplies_the_widened_value_once);
  tcase_add_test(tc, ema_forms_one_minus_decay_in_double);
  tcase_add_test(tc, sgd_plain_nesterov_and_weight_decay);
  tcase_add_test(tc, adamw_factors_and_one_step);
  tcase_add_test(tc, lars_rate_step_and_offsets);
  tcase_add_test(tc, loss_scale_rule);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
