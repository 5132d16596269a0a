/* Synthetic data (data.h): the --data value's parser and its one-line
 * errors, samples as a pure function of (split, index) whatever the
 * subset, batch or order that fills them, the fill equal to that of the
 * same bytes stored in a dataset, the exact statistics of uniform bytes,
 * and bp_dataset_open's defaults from the model. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/data.h"

static const bp_dataset_info model_shape = {.count = 300, .height = 6, .width = 5, .channels = 3,
                                            .classes = 1000};

static bp_dataset *synth(bp_data_split split) {
  bp_dataset *d = NULL;
  ck_assert_msg(bp_dataset_synthetic(&model_shape, split, &d) == BP_OK, "%s", bp_last_error());
  return d;
}

/* ---- parsing ---------------------------------------------------------------- */

START_TEST(valid_values_parse) {
  bp_data_synthetic_spec s;
  ck_assert(bp_data_is_synthetic("synthetic"));
  ck_assert(bp_data_is_synthetic("synthetic:1x1x1"));
  ck_assert(!bp_data_is_synthetic("synthetics"));
  ck_assert(!bp_data_is_synthetic("./synthetic"));
  ck_assert(!bp_data_is_synthetic(NULL));
  ck_assert_int_eq(bp_data_synthetic_parse("synthetic", &s), BP_OK);
  ck_assert(s.height == 0 && s.width == 0 && s.channels == 0 && s.classes == 0);
  ck_assert_int_eq(bp_data_synthetic_parse("synthetic:224x112x3", &s), BP_OK);
  ck_assert(s.height == 224 && s.width == 112 && s.channels == 3 && s.classes == 0);
  ck_assert_int_eq(bp_data_synthetic_parse("synthetic:224x224x3:1000", &s), BP_OK);
  ck_assert(s.height == 224 && s.width == 224 && s.channels == 3 && s.classes == 1000);
  ck_assert_int_eq(bp_data_synthetic_parse("synthetic:65536x1x16:2147483647", &s), BP_OK);
  ck_assert(s.height == 65536 && s.channels == 16 && s.classes == 2147483647);
}
END_TEST

START_TEST(bad_values_fail_with_one_line) {
  static const struct {
    const char *value, *needle;
  } cases[] = {
      {"synthetic:", "image shape"},
      {"synthetic:8x8", "image shape"},
      {"synthetic:8x8x", "image shape"},
      {"synthetic:0x8x1", "image shape"},
      {"synthetic:8x65537x1", "image shape"},
      {"synthetic:8x8x17", "image shape"},
      {"synthetic:8x8x0", "image shape"},
      {"synthetic:-8x8x1", "image shape"},
      {"synthetic:8 x8x1", "image shape"},
      {"synthetic:99999999999x8x1", "image shape"},
      {"synthetic:8x8x1:", "classes"},
      {"synthetic:8x8x1:0", "classes"},
      {"synthetic:8x8x1:2147483648", "classes"},
      {"synthetic:8x8x1:5x", "classes"},
      {"synthetic:8x8x1:5:3", "classes"},
      {"synthetic:8x8x1x2", "unexpected 'x2'"},
      {"synthetics", "not synthetic data"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    bp_data_synthetic_spec s = {7, 7, 7, 7};
    ck_assert_int_eq(bp_data_synthetic_parse(cases[k].value, &s), BP_ERR_INVALID);
    const char *msg = bp_last_error();
    ck_assert_msg(strchr(msg, '\n') == NULL, "%s: not one line: %s", cases[k].value, msg);
    ck_assert_msg(strstr(msg, cases[k].needle) != NULL, "%s: no '%s' in: %s", cases[k].value,
                  cases[k].needle, msg);
    ck_assert_msg(strstr(msg, "synthetic:HxWxC:CLASSES") != NULL, "%s: no form in: %s",
                  cases[k].value, msg);
    ck_assert(s.height == 7 && s.classes == 7); /* untouched on failure */
  }
}
END_TEST

/* ---- samples ---------------------------------------------------------------- */

START_TEST(samples_are_a_function_of_split_and_index) {
  bp_dataset *a = synth(BP_DATA_TRAIN), *b = synth(BP_DATA_TRAIN), *t = synth(BP_DATA_TEST);
  ck_assert_ptr_null(bp_dataset_images(a));
  ck_assert_ptr_null(bp_dataset_labels(a));
  enum { N = 6 * 5 * 3 };
  uint8_t x[N], y[N];
  int32_t lx, ly;
  int differ = 0;
  for (int64_t i = 0; i < model_shape.count; i++) {
    ck_assert_int_eq(bp_dataset_sample(a, i, x, &lx), BP_OK);
    ck_assert_int_eq(bp_dataset_sample(b, i, y, &ly), BP_OK);
    ck_assert_mem_eq(x, y, N);
    ck_assert_int_eq(lx, ly);
    ck_assert(lx >= 0 && lx < 1000);
    ck_assert_int_eq(bp_dataset_sample(t, i, y, &ly), BP_OK);
    differ += memcmp(x, y, N) != 0;
  }
  ck_assert_int_eq(differ, model_shape.count); /* the test split is other data */
  /* sample 0, pinned: the bytes of draw 0 of stream (train, 0), least
   * significant first, and its label of 1000 classes (a change here changes
   * every synthetic run's data) */
  ck_assert_int_eq(bp_dataset_sample(a, 0, x, &lx), BP_OK);
  char hex[2 * 8 + 1];
  for (int k = 0; k < 8; k++) snprintf(hex + 2 * k, 3, "%02x", x[k]);
  ck_assert_str_eq(hex, "b60f371bc9c70319"); /* computed apart from this code, in Python */
  ck_assert_int_eq(lx, 608);
  /* a subset keeps every sample's bits */
  bp_dataset *s = NULL;
  ck_assert_int_eq(bp_dataset_subset(a, 17, 40, &s), BP_OK);
  ck_assert_int_eq(bp_dataset_get_info(s)->count, 40);
  for (int64_t i = 0; i < 40; i++) {
    ck_assert_int_eq(bp_dataset_sample(a, 17 + i, x, &lx), BP_OK);
    ck_assert_int_eq(bp_dataset_sample(s, i, y, &ly), BP_OK);
    ck_assert_mem_eq(x, y, N);
    ck_assert_int_eq(lx, ly);
  }
  ck_assert_int_eq(bp_dataset_sample(s, 40, x, &lx), BP_ERR_INVALID);
  ck_assert_int_eq(bp_dataset_sample(a, -1, x, &lx), BP_ERR_INVALID);
  bp_dataset_destroy(s);
  bp_dataset_destroy(a);
  bp_dataset_destroy(b);
  bp_dataset_destroy(t);
}
END_TEST

/* Bytes and labels look uniform: every byte value and every class of a
 * 10-class set occurs, the mean byte is near 127.5. */
START_TEST(bytes_and_labels_are_uniform) {
  bp_dataset_info info = {.count = 2000, .height = 8, .width = 8, .channels = 2, .classes = 10};
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_synthetic(&info, BP_DATA_TRAIN, &d), BP_OK);
  uint64_t bytes[256] = {0}, labels[10] = {0}, sum = 0, n = 0;
  uint8_t x[128];
  for (int64_t i = 0; i < info.count; i++) {
    int32_t l = -1;
    ck_assert_int_eq(bp_dataset_sample(d, i, x, &l), BP_OK);
    ck_assert(l >= 0 && l < 10);
    labels[l]++;
    for (int k = 0; k < 128; k++) bytes[x[k]]++, sum += x[k], n++;
  }
  for (int v = 0; v < 256; v++) ck_assert_uint_gt(bytes[v], 0);
  for (int c = 0; c < 10; c++) ck_assert_uint_gt(labels[c], 100); /* ~200 each */
  const double mean = (double)sum / (double)n;
  ck_assert_msg(fabs(mean - 127.5) < 1.0, "mean byte %g", mean);
  bp_data_norm norm;
  ck_assert_int_eq(bp_dataset_stats(d, &norm), BP_OK);
  ck_assert_int_eq(norm.channels, 2);
  for (int c = 0; c < 2; c++) {
    ck_assert(norm.mean[c] == 0.5f);
    ck_assert(norm.std[c] == (float)(sqrt(65535.0 / 12.0) / 255.0));
  }
  bp_dataset_destroy(d);
}
END_TEST

/* ---- filling ----------------------------------------------------------------- */

static bp_dtensor image_desc(bp_dtype dtype, int64_t n, int64_t padded_c) {
  bp_dtensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "input");
  t.dtype = dtype;
  t.shape = (bp_shape){n, model_shape.height, model_shape.width, model_shape.channels};
  t.padded_c = padded_c;
  t.dev_stride[3] = 1;
  t.dev_stride[2] = padded_c;
  t.dev_stride[1] = padded_c * model_shape.width;
  t.dev_stride[0] = padded_c * model_shape.width * model_shape.height;
  t.slot_bytes = (uint64_t)(n * t.dev_stride[0]) * bp_dtype_size(dtype);
  return t;
}

static bp_dtensor label_desc(int64_t n) {
  bp_dtensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "label");
  t.dtype = BP_DTYPE_INT32;
  t.shape = (bp_shape){n, 1, 1, 1};
  t.padded_c = 1;
  t.dev_stride[0] = t.dev_stride[1] = t.dev_stride[2] = t.dev_stride[3] = 1;
  t.slot_bytes = (uint64_t)n * 4;
  return t;
}

/* A batch of synthetic samples fills exactly as the same bytes stored in a
 * dataset (FP32 and FP16, padded channels, an unused row, normalization,
 * crop and flip, which are keyed by the sample index in both); rows filled
 * one call at a time give the same bytes. */
START_TEST(fill_equals_the_fill_of_stored_bytes) {
  const bp_dataset_info info = {.count = 300, .height = 6, .width = 5, .channels = 3,
                                .classes = 200}; /* stored labels are bytes */
  enum { ROWS = 5, N = 6 * 5 * 3 };
  bp_dataset *d = NULL, *s = NULL;
  ck_assert_int_eq(bp_dataset_synthetic(&info, BP_DATA_TRAIN, &d), BP_OK);
  uint8_t *stored = malloc((size_t)info.count * N), stored_labels[300];
  for (int64_t i = 0; i < info.count; i++) {
    int32_t l;
    ck_assert_int_eq(bp_dataset_sample(d, i, stored + i * N, &l), BP_OK);
    stored_labels[i] = (uint8_t)l;
  }
  ck_assert_int_eq(bp_dataset_create(&info, stored, stored_labels, &s), BP_OK);
  const int64_t idx[ROWS] = {299, 0, 17, 42, 150};
  bp_data_norm norm;
  ck_assert_int_eq(bp_dataset_stats(d, &norm), BP_OK);
  const bp_data_fill_options fo = {&norm, {1, 1}, 5, 2};
  for (int fp16 = 0; fp16 < 2; fp16++) {
    const bp_dtype dt = fp16 ? BP_DTYPE_FP16 : BP_DTYPE_FP32;
    const bp_dtensor it = image_desc(dt, ROWS + 1, 4), lt = label_desc(ROWS + 1);
    const bp_dtensor one = image_desc(dt, 1, 4), lone = label_desc(1);
    const size_t ib = (size_t)it.slot_bytes, row = (size_t)one.slot_bytes;
    uint8_t *a = malloc(ib), *b = malloc(ib), *c = calloc(1, ib);
    int32_t la[ROWS + 1], lb[ROWS + 1], lc[ROWS + 1] = {0};
    memset(a, 0xAB, ib);
    memset(b, 0xCD, ib);
    ck_assert_msg(bp_data_fill(d, idx, ROWS, &fo, &it, a, &lt, la) == BP_OK, "%s", bp_last_error());
    ck_assert_msg(bp_data_fill(s, idx, ROWS, &fo, &it, b, &lt, lb) == BP_OK, "%s", bp_last_error());
    ck_assert_msg(memcmp(a, b, ib) == 0, "fp16 %d: the synthetic fill is not the stored one", fp16);
    ck_assert_mem_eq(la, lb, sizeof la);
    ck_assert_int_eq(la[ROWS], 0);
    for (int r = 0; r < ROWS; r++) /* one row per call, last row first */
      ck_assert_int_eq(bp_data_fill(d, &idx[ROWS - 1 - r], 1, &fo, &one,
                                    c + (size_t)(ROWS - 1 - r) * row, &lone, &lc[ROWS - 1 - r]),
                       BP_OK);
    ck_assert_msg(memcmp(a, c, ib) == 0, "fp16 %d: rows depend on the batch", fp16);
    ck_assert_mem_eq(la, lc, sizeof la);
    free(a);
    free(b);
    free(c);
  }
  free(stored);
  bp_dataset_destroy(s);
  bp_dataset_destroy(d);
}
END_TEST

/* ---- opening --------------------------------------------------------------------- */

START_TEST(open_takes_the_models_shape_unless_the_value_gives_one) {
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_open("synthetic", BP_DATA_TRAIN, &model_shape, &d), BP_OK);
  const bp_dataset_info *i = bp_dataset_get_info(d);
  ck_assert(i->count == 300 && i->height == 6 && i->width == 5 && i->channels == 3 &&
            i->classes == 1000);
  bp_dataset_destroy(d);
  ck_assert_int_eq(bp_dataset_open("synthetic", BP_DATA_TEST, &model_shape, &d), BP_OK);
  ck_assert_int_eq(bp_dataset_get_info(d)->count, BP_DATA_SYNTHETIC_TEST_COUNT);
  bp_dataset_destroy(d);
  ck_assert_int_eq(bp_dataset_open("synthetic:9x7x1:4", BP_DATA_TRAIN, &model_shape, &d), BP_OK);
  i = bp_dataset_get_info(d);
  ck_assert(i->count == 300 && i->height == 9 && i->width == 7 && i->channels == 1 &&
            i->classes == 4);
  bp_dataset_destroy(d);
  d = (bp_dataset *)(uintptr_t)1;
  ck_assert_int_eq(bp_dataset_open("synthetic:9x7", BP_DATA_TRAIN, &model_shape, &d),
                   BP_ERR_INVALID);
  ck_assert(d == (bp_dataset *)(uintptr_t)1);
  /* anything else is a directory */
  ck_assert_int_eq(bp_dataset_open("/nonexistent-dir", BP_DATA_TRAIN, &model_shape, &d),
                   BP_ERR_IO);
}
END_TEST

int main(void) {
  Suite *s = suite_create("data_synthetic");
  TCase *tc = tcase_create("synthetic");
  tcase_add_test(tc, valid_values_parse);
  tcase_add_test(tc, bad_values_fail_with_one_line);
  tcase_add_test(tc, samples_are_a_function_of_split_and_index);
  tcase_add_test(tc, bytes_and_labels_are_uniform);
  tcase_add_test(tc, fill_equals_the_fill_of_stored_bytes);
  tcase_add_test(tc, open_takes_the_models_shape_unless_the_value_gives_one);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
