/* The attention layer type: a tiny token model (patch conv -> 1x1 conv to
 * [q|k|v] -> attention -> 1x1 conv -> residual add) compiles, its plan
 * holds the saved "<l>.lse" [N,H,W,heads] FP32 feature with one offset in
 * every variant, it trains a few steps with falling loss (FP32 and AMP),
 * and a bad layer is refused in one line naming file:line:column. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "run_util.h"

#define TINY_HEAD                                                               \
  "name: tiny_attention\n"                                                      \
  "input: {height: 28, width: 28, channels: 1, classes: 10}\n"                  \
  "layers:\n"                                                                   \
  "  - {type: conv, name: patch, filters: 16, kernel: 4, stride: 4}\n"
#define TINY_TAIL                                                               \
  "  - {type: conv, name: proj, filters: 16, kernel: 1}\n"                      \
  "  - {type: add, name: res, inputs: [patch, proj]}\n"                         \
  "  - {type: global_avgpool, name: pool}\n"                                    \
  "  - {type: fc, name: head, units: 10}\n"                                     \
  "  - {type: softmax_ce, name: loss}\n"                                        \
  "train: {batch: 32, eval_batch: 50, optimizer: adamw, lr: 0.003}\n"
#define TINY_MODEL(qkv_filters, attention) \
  TINY_HEAD "  - {type: conv, name: qkv, filters: " qkv_filters ", kernel: 1}\n" attention TINY_TAIL

static const char *const tiny = TINY_MODEL("48", "  - {type: attention, name: attn, heads: 4}\n");

static bp_model *parse(const char *text) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse(text, strlen(text), "x.yaml", &m) == BP_OK, "%s", bp_last_error());
  return m;
}

/* the saved lse: per sample, FP32, heads channels, one offset for every
 * variant (the train batch, its last partial batch, the eval batch) */
START_TEST(plan_holds_lse_in_every_variant) {
  bp_model *m = parse(tiny);
  bp_compile_options o = bp_compile_options_from_model(m);
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &o, &p) == BP_OK, "%s", bp_last_error());
  int32_t id = -1;
  for (int32_t i = 0; i < bp_plan_tensor_count(p); i++)
    if (strcmp(bp_plan_tensor(p, 0, i)->name, "attn.lse") == 0) id = i;
  ck_assert_int_ge(id, 0);
  const bp_dtensor *t0 = bp_plan_tensor(p, 0, id);
  ck_assert_int_eq(t0->dtype, BP_DTYPE_FP32);
  ck_assert_int_eq(t0->shape.h, 7);
  ck_assert_int_eq(t0->shape.w, 7);
  ck_assert_int_eq(t0->shape.c, 4);
  ck_assert_int_ge(bp_plan_variant_count(p), 2);
  for (int v = 1; v < bp_plan_variant_count(p); v++) {
    const bp_dtensor *t = bp_plan_tensor(p, v, id);
    ck_assert_uint_eq(t->offset, t0->offset);
    ck_assert_uint_eq(t->slot_bytes, t0->slot_bytes);
    ck_assert_int_eq(t->shape.c, 4);
  }
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

START_TEST(plans_and_trains) {
  toy_env e = toy_env_open(tiny, 640, 200, 3);
  run_result r = RUN("plan", e.model);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "attn.lse") && strstr(r.out, "[32,7,7,4]"), "%s", r.out);
  run_free(&r);
  for (int amp = 0; amp < 2; amp++) {
    char *metrics = path_in(e.dir, amp ? "amp.jsonl" : "fp32.jsonl");
    r = amp ? RUN("train", e.model, "--data", e.data, "--epochs", "2", "--metrics", metrics,
                  "--log-every", "5", "--amp")
            : RUN("train", e.model, "--data", e.data, "--epochs", "2", "--metrics", metrics,
                  "--log-every", "5");
    ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
    ck_assert_msg(strstr(r.out, "attention.fwd") && strstr(r.out, "attention.bwd"), "%s", r.out);
    int steps = 0;
    const double first = jsonl_number(metrics, "step", 0, "train_loss", &steps);
    const double last = jsonl_number(metrics, "step", steps - 1, "train_loss", NULL);
    ck_assert_int_ge(steps, 4);
    ck_assert_msg(last < first, "amp %d: loss does not fall: %g -> %g", amp, first, last);
    run_free(&r);
    free(metrics);
  }
  toy_env_close(&e);
}
END_TEST

/* one line with the file, line and column of the layer */
static void expect_refused(const char *text, const char *where, const char *needle) {
  toy_env e = toy_env_open(text, 64, 64, 1);
  run_result r = RUN("plan", e.model);
  ck_assert_int_ne(r.status, 0);
  char prefix[4200];
  snprintf(prefix, sizeof prefix, "blueprint plan: %s:%s", e.model, where);
  expect_one_line_error(&r, prefix, needle);
  run_free(&r);
  toy_env_close(&e);
}

START_TEST(bad_layers_are_refused_in_one_line) {
  expect_refused(TINY_MODEL("48", "  - {type: attention, name: attn, heads: 5}\n"), "6:5:",
                 "heads 5 does not divide D = 16");
  expect_refused(TINY_MODEL("47", "  - {type: attention, name: attn, heads: 1}\n"), "6:5:",
                 "has 47 channels, expected a multiple of 3");
  expect_refused(TINY_MODEL("48", "  - {type: attention, name: attn}\n"), "6:5:",
                 "missing required field 'heads'");
  expect_refused(TINY_MODEL("48", "  - {type: attention, name: attn, heads: 0}\n"), "6:",
                 "heads");
  expect_refused(TINY_MODEL("48", "  - {type: attention, name: attn, heads: 4, causal: 2}\n"),
                 "6:", "must be true or false");
}
END_TEST

int main(void) {
  Suite *s = suite_create("layer_attention");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, plan_holds_lse_in_every_variant);
  tcase_add_test(tc, plans_and_trains);
  tcase_add_test(tc, bad_layers_are_refused_in_one_line);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
