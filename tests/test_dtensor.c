/* DTensor rules with values computed by hand (docs/architecture.md). */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "blueprint/dtensor.h"

static uint64_t slot(bp_dtype dt, bp_region r, bp_shape s) {
  uint64_t out = 0;
  ck_assert_int_eq(bp_dtensor_slot_bytes(dt, r, s, &out), BP_OK);
  return out;
}

START_TEST(fc_weight_fp32_and_fp16_twin) {
  bp_shape s = {1024, 1, 1, 784};
  /* 1024*784 = 802816 elems; FP16: 1605632 + 16 -> 1605888; FP32 twice that */
  ck_assert_uint_eq(slot(BP_DTYPE_FP32, BP_REGION_W_FC_WEIGHT, s), 3211776u);
  ck_assert_uint_eq(slot(BP_DTYPE_FP16, BP_REGION_A_FC_WEIGHT, s), 1605888u);
}
END_TEST

START_TEST(int8_mask_pads_c_to_8) {
  bp_dtensor t;
  ck_assert_int_eq(bp_dtensor_make(&t, 0, "mask", (bp_shape){200, 1, 1, 1}, BP_DTYPE_INT8,
                                   BP_REGION_S_MASK, 0, (bp_init){0}),
                   BP_OK);
  ck_assert_int_eq(t.padded_c, 8);
  /* 200*8 = 1600 + 16 = 1616 -> 1792 */
  ck_assert_uint_eq(t.slot_bytes, 1792u);
  ck_assert(!bp_dtensor_is_compact(&t));
}
END_TEST

START_TEST(fp16_feature_c121_pads_to_128) {
  bp_dtensor t;
  ck_assert_int_eq(bp_dtensor_make(&t, 3, "f", (bp_shape){2, 5, 7, 121}, BP_DTYPE_FP16,
                                   BP_REGION_F16, 0, (bp_init){0}),
                   BP_OK);
  ck_assert_int_eq(t.padded_c, 128);
  /* device strides padded, host strides compact */
  ck_assert_int_eq(t.dev_stride[3], 1);
  ck_assert_int_eq(t.dev_stride[2], 128);
  ck_assert_int_eq(t.dev_stride[1], 128 * 7);
  ck_assert_int_eq(t.dev_stride[0], 128 * 7 * 5);
  ck_assert_int_eq(t.host_stride[2], 121);
  ck_assert_int_eq(t.host_stride[1], 121 * 7);
  ck_assert_int_eq(t.host_stride[0], 121 * 7 * 5);
  ck_assert_uint_eq(bp_dtensor_device_elems(&t), 2u * 5 * 7 * 128);
  ck_assert_uint_eq(bp_dtensor_host_elems(&t), 2u * 5 * 7 * 121);
  /* 8960 elems * 2 + 16 = 17936 -> 18176 */
  ck_assert_uint_eq(t.slot_bytes, 18176u);
}
END_TEST

START_TEST(alignment_depends_on_dtype_and_region_only) {
  ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_FP16, BP_REGION_I_A), 4);
  ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_FP16, BP_REGION_I_B), 4);
  ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_FP16, BP_REGION_F16), 8);
  ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_INT8, BP_REGION_S_MASK), 8);
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_FP32, (bp_region)r), 1);
    ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_INT32, (bp_region)r), 1);
    if (r != BP_REGION_I_A && r != BP_REGION_I_B && r != BP_REGION_F16)
      ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_FP16, (bp_region)r), 1);
    if (r != BP_REGION_S_MASK) ck_assert_int_eq(bp_dtensor_alignment(BP_DTYPE_INT8, (bp_region)r), 1);
  }
}
END_TEST

START_TEST(every_slot_is_256_multiple_and_fp32_twice_fp16) {
  /* sweep odd and even shapes in every region where both dtypes align to 1 */
  const bp_region regions[] = {BP_REGION_W_CONV_DEEP, BP_REGION_T, BP_REGION_S_SCALAR};
  for (size_t r = 0; r < sizeof regions / sizeof regions[0]; r++)
    for (int64_t n = 1; n <= 9; n += 4)
      for (int64_t hw = 1; hw <= 13; hw += 3)
        for (int64_t c = 1; c <= 130; c += 7) {
          bp_shape s = {n, hw, hw + 1, c};
          uint64_t s32 = slot(BP_DTYPE_FP32, regions[r], s), s16 = slot(BP_DTYPE_FP16, regions[r], s);
          uint64_t s8 = slot(BP_DTYPE_INT8, regions[r], s), si = slot(BP_DTYPE_INT32, regions[r], s);
          ck_assert_uint_eq(s32 % 256, 0);
          ck_assert_uint_eq(s16 % 256, 0);
          ck_assert_uint_eq(s8 % 256, 0);
          ck_assert_uint_eq(s32, 2 * s16);
          ck_assert_uint_eq(si, s32);
          /* the tail: at least 16 readable bytes past the data */
          uint64_t e = (uint64_t)(n * hw * (hw + 1) * c);
          ck_assert_uint_ge(s16, 2 * e + 16);
          ck_assert_uint_ge(s8, e + 16);
          ck_assert_uint_ge(s32, 4 * e + 16);
        }
}
END_TEST

START_TEST(scalar_is_one_minimal_slot) {
  ck_assert_uint_eq(slot(BP_DTYPE_FP32, BP_REGION_S_SCALAR, (bp_shape){1, 1, 1, 1}), 512u);
  ck_assert_uint_eq(slot(BP_DTYPE_FP16, BP_REGION_S_SCALAR, (bp_shape){1, 1, 1, 1}), 256u);
  /* exactly on a boundary: 120 fp16 elems = 240 + 16 = 256 */
  ck_assert_uint_eq(slot(BP_DTYPE_FP16, BP_REGION_T, (bp_shape){1, 1, 1, 120}), 256u);
  ck_assert_uint_eq(slot(BP_DTYPE_FP16, BP_REGION_T, (bp_shape){1, 1, 1, 121}), 512u);
}
END_TEST

START_TEST(bad_shapes_and_dtypes_are_refused) {
  uint64_t out = 7;
  ck_assert_int_eq(bp_dtensor_slot_bytes(BP_DTYPE_FP32, BP_REGION_T, (bp_shape){0, 1, 1, 1}, &out),
                   BP_ERR_SHAPE);
  ck_assert_int_eq(bp_dtensor_slot_bytes(BP_DTYPE_FP32, BP_REGION_T, (bp_shape){1, -3, 1, 1}, &out),
                   BP_ERR_SHAPE);
  ck_assert_int_eq(bp_dtensor_slot_bytes(BP_DTYPE_BF16, BP_REGION_T, (bp_shape){1, 1, 1, 1}, &out),
                   BP_ERR_UNSUPPORTED);
  ck_assert_int_eq(bp_dtensor_slot_bytes(BP_DTYPE_FP32, BP_REGION_T,
                                         (bp_shape){INT64_MAX / 2, 4, 1, 1}, &out),
                   BP_ERR_OVERFLOW);
  ck_assert_int_eq(bp_dtensor_slot_bytes(BP_DTYPE_FP32, BP_REGION_T,
                                         (bp_shape){1LL << 31, 1LL << 31, 1, 1}, &out),
                   BP_ERR_OVERFLOW);
  ck_assert_uint_eq(out, 7); /* outputs untouched on failure */
  ck_assert_str_ne(bp_last_error(), "");
  bp_dtensor t;
  ck_assert_int_eq(bp_dtensor_make(&t, 0, "x", (bp_shape){4, 1, 1, 100}, BP_DTYPE_FP32,
                                   BP_REGION_T, 256, (bp_init){0}),
                   BP_ERR_INVALID); /* slot smaller than the shape's own */
  ck_assert_int_eq(bp_dtensor_make(&t, 0, "x", (bp_shape){1, 1, 1, 1}, BP_DTYPE_FP32,
                                   BP_REGION_T, 4096, (bp_init){0}),
                   BP_OK);
  ck_assert_uint_eq(t.slot_bytes, 4096); /* explicit (max across variants) slot kept */
}
END_TEST

static double mean_of(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s / (double)n;
}

static double std_of(const float *x, size_t n) {
  double m = mean_of(x, n), s = 0;
  for (size_t i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
  return sqrt(s / (double)n);
}

static float *filled(bp_shape s, bp_init init, uint64_t seed, size_t *n_out) {
  bp_dtensor t;
  ck_assert_int_eq(bp_dtensor_make(&t, 0, "w", s, BP_DTYPE_FP32, BP_REGION_W_CONV_DEEP, 0, init),
                   BP_OK);
  *n_out = bp_dtensor_host_elems(&t);
  float *x = malloc(*n_out * sizeof *x);
  ck_assert_ptr_nonnull(x);
  ck_assert_int_eq(bp_dtensor_init_fill(&t, seed, x), BP_OK);
  return x;
}

START_TEST(init_rules_follow_fans_and_seeds) {
  bp_shape s = {64, 3, 3, 32}; /* fan_in 288, fan_out 576 */
  double fi, fo;
  bp_shape_fans(s, &fi, &fo);
  ck_assert_double_eq(fi, 288.0);
  ck_assert_double_eq(fo, 576.0);
  size_t n;
  float *k = filled(s, (bp_init){BP_INIT_KAIMING_NORMAL, 0, 0, 1}, 42, &n);
  ck_assert_double_eq_tol(std_of(k, n), sqrt(2.0 / 288.0), 0.03 * sqrt(2.0 / 288.0));
  ck_assert_double_eq_tol(mean_of(k, n), 0.0, 0.005);
  float *k2 = filled(s, (bp_init){BP_INIT_KAIMING_NORMAL, 0, 0, 1}, 42, &n);
  ck_assert_mem_eq(k, k2, n * sizeof *k); /* same seeds: same bits */
  float *k3 = filled(s, (bp_init){BP_INIT_KAIMING_NORMAL, 0, 0, 2}, 42, &n);
  ck_assert(k[0] != k3[0] || k[1] != k3[1]); /* another rule seed: other data */
  float *xu = filled(s, (bp_init){BP_INIT_XAVIER_UNIFORM, 0, 0, 1}, 42, &n);
  double bound = sqrt(6.0 / (288.0 + 576.0));
  for (size_t i = 0; i < n; i++) ck_assert(xu[i] >= -bound && xu[i] <= bound);
  ck_assert_double_eq_tol(std_of(xu, n), bound / sqrt(3.0), 0.03 * bound);
  float *c = filled(s, (bp_init){BP_INIT_CONSTANT, 0.25f, 0, 0}, 1, &n);
  for (size_t i = 0; i < n; i++) ck_assert_float_eq(c[i], 0.25f);
  float *z = filled(s, (bp_init){BP_INIT_ONES, 0, 0, 0}, 1, &n);
  for (size_t i = 0; i < n; i++) ck_assert_float_eq(z[i], 1.0f);
  free(k); free(k2); free(k3); free(xu); free(c); free(z);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dtensor");
  TCase *tc = tcase_create("rules");
  tcase_add_test(tc, fc_weight_fp32_and_fp16_twin);
  tcase_add_test(tc, int8_mask_pads_c_to_8);
  tcase_add_test(tc, fp16_feature_c121_pads_to_128);
  tcase_add_test(tc, alignment_depends_on_dtype_and_region_only);
  tcase_add_test(tc, every_slot_is_256_multiple_and_fp32_twice_fp16);
  tcase_add_test(tc, scalar_is_one_minimal_slot);
  tcase_add_test(tc, bad_shapes_and_dtypes_are_refused);
  tcase_add_test(tc, init_rules_follow_fans_and_seeds);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
