/* Model files built to hurt (models/README.md, "Limits"): deep nesting and
 * huge documents are refused at once, explicit tags are refused, and the
 * largest model allowed parses and compiles in well under a second. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"

static double cpu_seconds(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* Parses text; returns the status, the message in bp_last_error(). */
static bp_status parse(const char *text, size_t n) {
  bp_model *m = NULL;
  bp_status st = bp_model_parse(text, n, "hostile.yaml", &m);
  bp_model_destroy(m);
  return st;
}

START_TEST(nesting_100k_levels_deep_is_refused_at_once) {
  const size_t depth = 100000;
  char *text = malloc(2 * depth + 8);
  ck_assert_ptr_nonnull(text);
  memcpy(text, "a: ", 3);
  memset(text + 3, '[', depth);
  memset(text + 3 + depth, ']', depth);
  text[3 + 2 * depth] = '\0';
  double t0 = cpu_seconds();
  ck_assert_int_eq(parse(text, strlen(text)), BP_ERR_INVALID);
  ck_assert_msg(cpu_seconds() - t0 < 1.0, "took %.2f s", cpu_seconds() - t0);
  ck_assert_msg(strstr(bp_last_error(), "nesting deeper than 64 levels") != NULL, "%s",
                bp_last_error());
  ck_assert_ptr_null(strchr(bp_last_error(), '\n'));
  free(text);
  /* block style too */
  char block[64 * 80 + 64] = "";
  size_t o = 0;
  for (int i = 0; i < 70; i++) o += (size_t)snprintf(block + o, sizeof block - o, "%*sk:\n", i, "");
  ck_assert_int_eq(parse(block, o), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "nesting deeper") != NULL, "%s", bp_last_error());
}
END_TEST

START_TEST(a_document_over_16_mib_is_refused) {
  size_t n = (16u << 20) + 1;
  char *text = malloc(n);
  ck_assert_ptr_nonnull(text);
  memset(text, '#', n); /* one long comment */
  ck_assert_int_eq(parse(text, n), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "larger than 16 MiB") != NULL, "%s", bp_last_error());
  free(text);
}
END_TEST

START_TEST(an_explicit_str_tag_is_refused_like_a_quoted_string) {
  static const char text[] =
      "name: t\n"
      "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
      "layers:\n"
      "  - {type: fc, name: fc, units: !!str 5}\n"
      "  - {type: softmax_ce, name: loss}\n";
  ck_assert_int_eq(parse(text, strlen(text)), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "hostile.yaml:4:") != NULL, "%s", bp_last_error());
  ck_assert_msg(strstr(bp_last_error(), "explicit YAML tag") != NULL, "%s", bp_last_error());
  static const char quoted[] =
      "name: t\n"
      "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
      "layers:\n"
      "  - {type: fc, name: fc, units: \"5\"}\n"
      "  - {type: softmax_ce, name: loss}\n";
  ck_assert_int_eq(parse(quoted, strlen(quoted)), BP_ERR_INVALID);
}
END_TEST

START_TEST(ten_thousand_layers_parse_and_compile_in_under_two_seconds) {
  const int n = 10000;
  size_t cap = (size_t)n * 48 + 512, o = 0;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  o += (size_t)snprintf(text + o, cap - o,
                        "name: big\ninput: {height: 8, width: 8, channels: 1, classes: 10}\n"
                        "layers:\n  - {type: fc, name: fc0, units: 16}\n");
  for (int i = 1; i < n - 2; i++)
    o += (size_t)snprintf(text + o, cap - o, "  - {type: relu, name: r%d}\n", i);
  o += (size_t)snprintf(text + o, cap - o,
                        "  - {type: fc, name: out, units: 10, input: r%d}\n"
                        "  - {type: softmax_ce, name: loss}\ntrain: {batch: 8}\n",
                        n - 3);
  double t0 = cpu_seconds();
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse(text, o, "big.yaml", &m) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(m->layer_count, n);
  bp_compile_options co = bp_compile_options_from_model(m);
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &co, &p) == BP_OK, "%s", bp_last_error());
  double t = cpu_seconds() - t0;
  ck_assert_int_ge(bp_plan_find_tensor(p, "r5000.out"), 0);
  ck_assert_msg(t < 2.0, "10,000 layers took %.2f s of CPU", t);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  /* a duplicate name far down is still found, with the first one's line */
  char *dup = strstr(text, "name: r9000}");
  ck_assert_ptr_nonnull(dup);
  memcpy(dup, "name: r1   }", 12);
  ck_assert_int_eq(parse(text, o), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "duplicate layer name 'r1' (layer 1 at line 5") != NULL,
                "%s", bp_last_error());
  free(text);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostile_models");
  TCase *tc = tcase_create("hostile_models");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, nesting_100k_levels_deep_is_refused_at_once);
  tcase_add_test(tc, a_document_over_16_mib_is_refused);
  tcase_add_test(tc, an_explicit_str_tag_is_refused_like_a_quoted_string);
  tcase_add_test(tc, ten_thousand_layers_parse_and_compile_in_under_two_seconds);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
