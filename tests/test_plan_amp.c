/* The plans of mixed precision (AMP) for every shipped model (every .yaml
 * file in models/), with each optimizer and with EMA on and off: the FP32
 * master weights take exactly twice the bytes of their FP16 working copies
 * (W = 2 A, kind by kind), the FP32 gradients twice the FP16 ones
 * (G = 2 G16), every FP16 feature and gradient slot has its channels
 * padded to a multiple of 8 and the FP16 model input to a multiple of 4
 * (docs/validate.md: the layouts validate's AMP twins use), and the tensors
 * AMP keeps FP32 (BN statistics, results, scalars) are FP32. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "run_util.h"

static const bp_region kinds[][4] = {
    /* W, A, G, G16 of each parameter kind */
    {BP_REGION_W_BN_BIAS, BP_REGION_A_BN_BIAS, BP_REGION_G_BN_BIAS, BP_REGION_G16_BN_BIAS},
    {BP_REGION_W_BN_WEIGHT, BP_REGION_A_BN_WEIGHT, BP_REGION_G_BN_WEIGHT,
     BP_REGION_G16_BN_WEIGHT},
    {BP_REGION_W_FC_BIAS, BP_REGION_A_FC_BIAS, BP_REGION_G_FC_BIAS, BP_REGION_G16_FC_BIAS},
    {BP_REGION_W_FC_WEIGHT, BP_REGION_A_FC_WEIGHT, BP_REGION_G_FC_WEIGHT,
     BP_REGION_G16_FC_WEIGHT},
    {BP_REGION_W_CONV_FIRST, BP_REGION_A_CONV_FIRST, BP_REGION_G_CONV_FIRST,
     BP_REGION_G16_CONV_FIRST},
    {BP_REGION_W_CONV_DEEP, BP_REGION_A_CONV_DEEP, BP_REGION_G_CONV_DEEP,
     BP_REGION_G16_CONV_DEEP},
};

static void check_plan(const char *path, const bp_plan *plan, const char *what) {
  uint64_t w = 0, a = 0, g = 0, g16 = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const uint64_t bw = bp_plan_region_span(plan, kinds[k][0]).bytes;
    const uint64_t ba = bp_plan_region_span(plan, kinds[k][1]).bytes;
    const uint64_t bg = bp_plan_region_span(plan, kinds[k][2]).bytes;
    const uint64_t bg16 = bp_plan_region_span(plan, kinds[k][3]).bytes;
    ck_assert_msg(bw == 2 * ba, "%s %s: %s %llu bytes, %s %llu", path, what,
                  bp_region_get(kinds[k][0])->name, (unsigned long long)bw,
                  bp_region_get(kinds[k][1])->name, (unsigned long long)ba);
    ck_assert_msg(bg == 2 * bg16, "%s %s: %s %llu bytes, %s %llu", path, what,
                  bp_region_get(kinds[k][2])->name, (unsigned long long)bg,
                  bp_region_get(kinds[k][3])->name, (unsigned long long)bg16);
    w += bw;
    a += ba;
    g += bg;
    g16 += bg16;
  }
  ck_assert_msg(a > 0 && w == 2 * a && g == 2 * g16, "%s %s: W %llu A %llu G %llu G16 %llu", path,
                what, (unsigned long long)w, (unsigned long long)a, (unsigned long long)g,
                (unsigned long long)g16);
  int features = 0, inputs = 0;
  for (int v = 0; v < bp_plan_variant_count(plan); v++)
    for (int32_t id = 0; id < bp_plan_tensor_count(plan); id++) {
      const bp_dtensor *t = bp_plan_tensor(plan, v, id);
      ck_assert_ptr_nonnull(t);
      switch (t->region) {
        case BP_REGION_F16:
          ck_assert_msg(t->dtype == BP_DTYPE_FP16 && t->padded_c % 8 == 0,
                        "%s %s: %s is %s with padded_c %lld", path, what, t->name,
                        bp_dtype_name(t->dtype), (long long)t->padded_c);
          features++;
          break;
        case BP_REGION_I_A:
        case BP_REGION_I_B:
          if (t->dtype != BP_DTYPE_FP16) break; /* the labels */
          ck_assert_msg(t->padded_c % 4 == 0, "%s %s: input %s has padded_c %lld", path, what,
                        t->name, (long long)t->padded_c);
          inputs++;
          break;
        case BP_REGION_A_BN_BIAS:
        case BP_REGION_A_BN_WEIGHT:
        case BP_REGION_A_FC_BIAS:
        case BP_REGION_A_FC_WEIGHT:
        case BP_REGION_A_CONV_FIRST:
        case BP_REGION_A_CONV_DEEP:
          ck_assert_msg(t->dtype == BP_DTYPE_FP16, "%s %s: %s", path, what, t->name);
          break;
        case BP_REGION_B:
        case BP_REGION_R:
          ck_assert_msg(t->dtype == BP_DTYPE_FP32, "%s %s: %s", path, what, t->name);
          break;
        default: break;
      }
    }
  ck_assert_msg(features > 0, "%s %s: no FP16 feature slot", path, what);
  ck_assert_msg(inputs > 0, "%s %s: the input is not FP16", path, what);
}

START_TEST(amp_plans_of_every_shipped_model_have_twin_sizes_and_fp16_paddings) {
  char **paths = shipped_models(); /* at least three */
  static const bp_optimizer opts[] = {BP_OPT_SGD, BP_OPT_ADAMW, BP_OPT_LARS};
  for (int m = 0; paths[m]; m++) {
    bp_model *model = NULL;
    ck_assert_msg(bp_model_load(paths[m], &model) == BP_OK, "%s: %s", paths[m], bp_last_error());
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
      for (int ema = 0; ema < 2; ema++) {
        bp_compile_options co = bp_compile_options_from_model(model);
        co.plan.amp = 1;
        co.plan.ema = ema;
        co.plan.optimizer = opts[o];
        bp_plan *plan = NULL;
        ck_assert_msg(bp_model_compile(model, &co, &plan) == BP_OK, "%s: %s", paths[m],
                      bp_last_error());
        char what[64];
        snprintf(what, sizeof what, "--amp, %s%s", bp_optimizer_name(opts[o]),
                 ema ? ", ema" : "");
        check_plan(paths[m], plan, what);
        for (size_t k = 0; ema && k < sizeof kinds / sizeof kinds[0]; k++) {
          /* the EMA copies are FP32 twins of W */
          const bp_region e = (bp_region)(BP_REGION_E_BN_BIAS + k);
          ck_assert_uint_eq(bp_plan_region_span(plan, kinds[k][0]).bytes,
                            bp_plan_region_span(plan, e).bytes);
        }
        bp_plan_destroy(plan);
      }
    bp_model_destroy(model);
  }
  shipped_models_free(paths);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan_amp");
  TCase *tc = tcase_create("plan_amp");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, amp_plans_of_every_shipped_model_have_twin_sizes_and_fp16_paddings);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
