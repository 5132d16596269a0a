/* The ImageNet-sized shipped models, models/vgg16bn.yaml and
 * models/resnet18.yaml (224x224x3, 1000 classes): they compile into plans
 * that pass bp_plan_check with and without AMP, hold exactly the known
 * parameter counts (torchvision's ResNet-18; torchvision's VGG16-BN less
 * its 4,224 conv biases, which the model leaves to batch norm), and their
 * layers have the textbook output shapes (7x7/2 stem, 3x3/2 max pool with
 * pad 1, stride-2 stages, 7x7 before the head). Plans only: nothing runs. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"

static bp_model *load_shipped(const char *file) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  char path[4096];
  snprintf(path, sizeof path, "%s/models/%s", src, file);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  return m;
}

static bp_plan *compile(const bp_model *m, int amp) {
  bp_compile_options o = bp_compile_options_from_model(m);
  o.plan.amp = amp;
  bp_plan *p = NULL;
  bp_status st = bp_model_compile(m, &o, &p);
  ck_assert_msg(st == BP_OK, "%s amp %d: %s", m->name, amp, bp_last_error());
  ck_assert_msg(bp_plan_check(p) == BP_OK, "%s amp %d: %s", m->name, amp, bp_last_error());
  return p;
}

/* Elements of every FP32 master weight (family W): the trainable parameters. */
static uint64_t parameter_count(const bp_plan *p) {
  uint64_t n = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *t = bp_plan_tensor(p, 0, id);
    for (int k = 0; k < BP_PARAM_KIND_COUNT; k++)
      if (t->region == bp_region_of_param(BP_FAMILY_W, (bp_param_kind)k))
        n += bp_dtensor_host_elems(t);
  }
  return n;
}

/* Tensor `name` of variant 0 has shape [n, h, w, c]. */
static void expect_shape(const bp_plan *p, const char *name, int64_t n, int64_t h, int64_t w,
                         int64_t c) {
  const int32_t id = bp_plan_find_tensor(p, name);
  ck_assert_msg(id >= 0, "no tensor %s", name);
  const bp_shape s = bp_plan_tensor(p, 0, id)->shape;
  ck_assert_msg(s.n == n && s.h == h && s.w == w && s.c == c,
                "%s is [%lld,%lld,%lld,%lld], want [%lld,%lld,%lld,%lld]", name, (long long)s.n,
                (long long)s.h, (long long)s.w, (long long)s.c, (long long)n, (long long)h,
                (long long)w, (long long)c);
}

static void expect_input(const bp_model *m) {
  ck_assert_int_eq(m->height, 224);
  ck_assert_int_eq(m->width, 224);
  ck_assert_int_eq(m->channels, 3);
  ck_assert_int_eq(m->classes, 1000);
}

START_TEST(vgg16bn_has_138361768_parameters_and_vgg_shapes) {
  bp_model *m = load_shipped("vgg16bn.yaml");
  expect_input(m);
  for (int amp = 0; amp < 2; amp++) {
    bp_plan *p = compile(m, amp);
    const uint64_t params = parameter_count(p);
    printf("vgg16bn amp %d: %" PRIu64 " parameters, arena %" PRIu64 " bytes\n", amp, params,
           bp_plan_total_bytes(p));
    /* 13 convs (no bias) + 13 BN (gamma, beta) + fc 25088-4096-4096-1000 */
    ck_assert_uint_eq(params, 138361768u);
    const int64_t b = m->train.batch;
    ck_assert_int_eq(b, 128);
    expect_shape(p, "conv1_1.out", b, 224, 224, 64);
    expect_shape(p, "pool1.out", b, 112, 112, 64);
    expect_shape(p, "pool2.out", b, 56, 56, 128);
    expect_shape(p, "pool3.out", b, 28, 28, 256);
    expect_shape(p, "pool4.out", b, 14, 14, 512);
    expect_shape(p, "pool5.out", b, 7, 7, 512);
    expect_shape(p, "fc6.w", 4096, 1, 1, 7 * 7 * 512);
    expect_shape(p, "fc8.out", b, 1, 1, 1000);
    bp_plan_destroy(p);
  }
  bp_model_destroy(m);
}
END_TEST

START_TEST(resnet18_has_11689512_parameters_and_resnet_shapes) {
  bp_model *m = load_shipped("resnet18.yaml");
  expect_input(m);
  for (int amp = 0; amp < 2; amp++) {
    bp_plan *p = compile(m, amp);
    const uint64_t params = parameter_count(p);
    printf("resnet18 amp %d: %" PRIu64 " parameters, arena %" PRIu64 " bytes\n", amp, params,
           bp_plan_total_bytes(p));
    ck_assert_uint_eq(params, 11689512u); /* torchvision.models.resnet18() */
    const int64_t b = m->train.batch;
    ck_assert_int_eq(b, 256);
    expect_shape(p, "stem.w", 64, 7, 7, 3);
    expect_shape(p, "stem.out", b, 112, 112, 64);      /* 7x7/2 pad 3 */
    expect_shape(p, "stem_pool.out", b, 56, 56, 64);   /* 3x3/2 pad 1 */
    expect_shape(p, "s1b2_out.out", b, 56, 56, 64);
    expect_shape(p, "s2b1_proj.out", b, 28, 28, 128);  /* 1x1/2 projection */
    expect_shape(p, "s2b2_out.out", b, 28, 28, 128);
    expect_shape(p, "s3b2_out.out", b, 14, 14, 256);
    expect_shape(p, "s4b2_out.out", b, 7, 7, 512);
    expect_shape(p, "pool.out", b, 1, 1, 512);
    expect_shape(p, "fc.w", 1000, 1, 1, 512);
    bp_plan_destroy(p);
  }
  bp_model_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("imagenet_models");
  TCase *tc = tcase_create("plans");
  tcase_add_test(tc, vgg16bn_has_138361768_parameters_and_vgg_shapes);
  tcase_add_test(tc, resnet18_has_11689512_parameters_and_resnet_shapes);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
