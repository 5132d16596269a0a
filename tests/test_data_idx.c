/* IDX reader: small files written here (gzip'd and plain) read back exactly,
 * every bad-input case with its status and message, and, with
 * `--fashion-mnist`, the real Fashion-MNIST from the Debian package (exit
 * 77, skipped, where it is not installed). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "blueprint/data.h"

static char tmp_dir[] = "/tmp/bp-data-idx-XXXXXX";

static void make_tmp(void) { ck_assert_ptr_nonnull(mkdtemp(tmp_dir)); }
static void remove_tmp(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

/* tmp_dir/name in a static buffer (one of 16, round robin: copy a path
 * that must outlive the next 15 calls). */
static const char *tmp_path(const char *name) {
  static char paths[16][512];
  static int next;
  char *p = paths[next++ % 16];
  snprintf(p, 512, "%s/%s", tmp_dir, name);
  return p;
}

static void put_be32(uint8_t *b, uint32_t v) {
  b[0] = (uint8_t)(v >> 24);
  b[1] = (uint8_t)(v >> 16);
  b[2] = (uint8_t)(v >> 8);
  b[3] = (uint8_t)v;
}

/* Writes `len` bytes to path, gzip'd when gz. */
static void write_bytes(const char *path, int gz, const uint8_t *bytes, size_t len) {
  if (gz) {
    gzFile f = gzopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (len) ck_assert_int_eq(gzwrite(f, bytes, (unsigned)len), (int)len);
    ck_assert_int_eq(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (len) ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
  }
}

/* An IDX file: magic, dims, then `data_len` bytes of data (which may differ
 * from what the dims promise, to make bad files). */
static void write_idx(const char *path, int gz, uint32_t magic, int ndims, const uint32_t *dims,
                      const uint8_t *data, size_t data_len) {
  size_t header = 4 + 4 * (size_t)ndims;
  uint8_t *b = malloc(header + data_len + 1);
  ck_assert_ptr_nonnull(b);
  put_be32(b, magic);
  for (int i = 0; i < ndims; i++) put_be32(b + 4 + 4 * i, dims[i]);
  if (data_len) memcpy(b + header, data, data_len);
  write_bytes(path, gz, b, header + data_len);
  free(b);
}

/* N images of HxW with pixel (i, y, x) = i*H*W + y*W + x (mod 256), labels i % classes. */
enum { N = 5, H = 3, W = 4 };
static uint8_t pixels[N * H * W], labels[N];
static void make_data(int classes) {
  for (int i = 0; i < N * H * W; i++) pixels[i] = (uint8_t)(i * 7 + 3);
  for (int i = 0; i < N; i++) labels[i] = (uint8_t)(i % classes);
}

static void write_pair(const char *images, const char *labs, int gz) {
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N};
  write_idx(images, gz, 0x803, 3, idims, pixels, sizeof pixels);
  write_idx(labs, gz, 0x801, 1, ldims, labels, sizeof labels);
}

static void assert_same(const bp_dataset *d, int classes) {
  const bp_dataset_info *in = bp_dataset_get_info(d);
  ck_assert_int_eq(in->count, N);
  ck_assert_int_eq(in->height, H);
  ck_assert_int_eq(in->width, W);
  ck_assert_int_eq(in->channels, 1);
  ck_assert_int_eq(in->classes, classes);
  ck_assert_mem_eq(bp_dataset_images(d), pixels, sizeof pixels);
  ck_assert_mem_eq(bp_dataset_labels(d), labels, sizeof labels);
}

/* Loads a pair expecting failure `want` whose message contains `a` and `b`. */
static void expect_fail(const char *images, const char *labs, int classes, bp_status want,
                        const char *a, const char *b) {
  bp_dataset *d = (bp_dataset *)0x1;
  bp_status st = bp_dataset_load_idx(images, labs, classes, &d);
  const char *msg = bp_last_error();
  if (st != want || !strstr(msg, a) || (b && !strstr(msg, b)))
    ck_abort_msg("status %s (want %s), message '%s' (want '%s' and '%s')", bp_status_str(st),
                 bp_status_str(want), msg, a, b ? b : "");
  ck_assert_ptr_eq(d, (bp_dataset *)0x1); /* output untouched */
}

START_TEST(plain_and_gzip_read_back_exactly) {
  make_data(3);
  for (int gz = 0; gz < 2; gz++) {
    const char *im = tmp_path(gz ? "rt-images.gz" : "rt-images");
    const char *lb = tmp_path(gz ? "rt-labels.gz" : "rt-labels");
    write_pair(im, lb, gz);
    bp_dataset *d = NULL;
    ck_assert_int_eq(bp_dataset_load_idx(im, lb, 3, &d), BP_OK);
    assert_same(d, 3);
    bp_dataset_destroy(d);
    ck_assert_int_eq(bp_dataset_load_idx(im, lb, 0, &d), BP_OK); /* classes inferred */
    assert_same(d, 3);
    bp_dataset_destroy(d);
  }
  bp_dataset_destroy(NULL);
}
END_TEST

START_TEST(mnist_directory_takes_gz_or_plain) {
  make_data(10);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/mnist", tmp_dir);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  char im[600], lb[600];
  snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", dir);
  snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", dir);
  write_pair(im, lb, 1);
  snprintf(im, sizeof im, "%s/t10k-images-idx3-ubyte", dir);
  snprintf(lb, sizeof lb, "%s/t10k-labels-idx1-ubyte", dir);
  write_pair(im, lb, 0);
  for (int split = 0; split < 2; split++) {
    bp_dataset *d = NULL;
    ck_assert_int_eq(bp_dataset_load_mnist(dir, (bp_data_split)split, &d), BP_OK);
    assert_same(d, 10);
    bp_dataset_destroy(d);
  }
  /* a directory without the files names the file it looked for */
  char empty[512];
  snprintf(empty, sizeof empty, "%s/empty", tmp_dir);
  ck_assert_int_eq(mkdir(empty, 0700), 0);
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_load_mnist(empty, BP_DATA_TEST, &d), BP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "t10k-images-idx3-ubyte.gz"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "No such file"));
  ck_assert_int_eq(bp_dataset_load_mnist(dir, (bp_data_split)7, &d), BP_ERR_INVALID);
}
END_TEST

START_TEST(four_dimensional_images_carry_channels) {
  uint8_t px[2 * 2 * 3 * 3];
  for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)i;
  const uint8_t lab[2] = {1, 0};
  const uint32_t idims[4] = {2, 2, 3, 3}, ldims[1] = {2};
  write_idx(tmp_path("c3-images"), 0, 0x804, 4, idims, px, sizeof px);
  write_idx(tmp_path("c3-labels"), 0, 0x801, 1, ldims, lab, sizeof lab);
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_load_idx(tmp_path("c3-images"), tmp_path("c3-labels"), 2, &d), BP_OK);
  ck_assert_int_eq(bp_dataset_get_info(d)->channels, 3);
  ck_assert_mem_eq(bp_dataset_images(d), px, sizeof px);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(missing_file_or_directory_is_an_io_error) {
  make_data(3);
  write_pair(tmp_path("ok-images"), tmp_path("ok-labels"), 0);
  expect_fail(tmp_path("nope-images"), tmp_path("ok-labels"), 3, BP_ERR_IO, "nope-images",
              "No such file");
  expect_fail(tmp_path("ok-images"), tmp_path("nope-labels"), 3, BP_ERR_IO, "nope-labels",
              "No such file");
  expect_fail(tmp_dir, tmp_path("ok-labels"), 3, BP_ERR_IO, tmp_dir, "directory");
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_load_idx(NULL, tmp_path("ok-labels"), 3, &d), BP_ERR_INVALID);
  ck_assert_int_eq(bp_dataset_load_idx(tmp_path("ok-images"), tmp_path("ok-labels"), 300, &d),
                   BP_ERR_INVALID);
}
END_TEST

START_TEST(wrong_magic_is_refused) {
  make_data(3);
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N};
  write_pair(tmp_path("wm-images"), tmp_path("wm-labels"), 0);
  /* labels where images belong, and the reverse */
  expect_fail(tmp_path("wm-labels"), tmp_path("wm-labels"), 3, BP_ERR_PARSE, "wm-labels",
              "wrong magic 0x00000801, expected 0x00000803");
  expect_fail(tmp_path("wm-images"), tmp_path("wm-images"), 3, BP_ERR_PARSE, "wm-images",
              "wrong magic 0x00000803, expected 0x00000801");
  /* a non-ubyte type code, gzip'd */
  write_idx(tmp_path("wm-float.gz"), 1, 0x0d03, 3, idims, pixels, sizeof pixels);
  expect_fail(tmp_path("wm-float.gz"), tmp_path("wm-labels"), 3, BP_ERR_PARSE, "wm-float.gz",
              "wrong magic 0x00000d03");
  /* text */
  const char *text = "hello, this is not an IDX file\n";
  write_bytes(tmp_path("wm-text"), 0, (const uint8_t *)text, strlen(text));
  expect_fail(tmp_path("wm-images"), tmp_path("wm-text"), 3, BP_ERR_PARSE, "wm-text",
              "wrong magic");
  (void)ldims;
}
END_TEST

START_TEST(truncated_files_are_refused) {
  make_data(3);
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N};
  write_idx(tmp_path("tr-labels"), 0, 0x801, 1, ldims, labels, sizeof labels);
  for (int gz = 0; gz < 2; gz++) {
    char im[512];
    snprintf(im, sizeof im, "%s", tmp_path(gz ? "tr-images.gz" : "tr-images"));
    /* one image byte short */
    write_idx(im, gz, 0x803, 3, idims, pixels, sizeof pixels - 1);
    expect_fail(im, tmp_path("tr-labels"), 3, BP_ERR_PARSE, im, "is truncated");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "promises 60 data bytes"));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "holds 59"));
    /* the header itself cut */
    write_idx(im, gz, 0x803, 1, idims, NULL, 0); /* magic says 3 dims, 1 written */
    expect_fail(im, tmp_path("tr-labels"), 3, BP_ERR_PARSE, im, "is truncated");
    write_bytes(im, gz, (const uint8_t *)"\0\0", 2);
    expect_fail(im, tmp_path("tr-labels"), 3, BP_ERR_PARSE, im, "4-byte IDX magic");
    write_bytes(im, gz, NULL, 0);
    expect_fail(im, tmp_path("tr-labels"), 3, BP_ERR_PARSE, im, "is truncated");
  }
  /* labels short */
  write_pair(tmp_path("tr2-images"), tmp_path("tr2-labels"), 0);
  write_idx(tmp_path("tr2-labels"), 0, 0x801, 1, ldims, labels, 2);
  expect_fail(tmp_path("tr2-images"), tmp_path("tr2-labels"), 3, BP_ERR_PARSE, "tr2-labels",
              "is truncated");
  /* a gzip stream cut in the middle (the file copied short) */
  static uint8_t big[4 * 64 * 64];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  const uint32_t bdims[3] = {4, 64, 64}, bl[1] = {4};
  write_idx(tmp_path("cut.gz"), 1, 0x803, 3, bdims, big, sizeof big);
  write_idx(tmp_path("cut-labels"), 0, 0x801, 1, bl, labels, 4);
  struct stat sb;
  ck_assert_int_eq(stat(tmp_path("cut.gz"), &sb), 0);
  ck_assert_int_eq(truncate(tmp_path("cut.gz"), sb.st_size / 2), 0);
  expect_fail(tmp_path("cut.gz"), tmp_path("cut-labels"), 3, BP_ERR_PARSE, "cut.gz",
              "is truncated");
  fprintf(stderr, "cut gzip: %s\n", bp_last_error());
}
END_TEST

START_TEST(trailing_and_corrupt_bytes_are_refused) {
  make_data(3);
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N};
  write_idx(tmp_path("tb-labels"), 0, 0x801, 1, ldims, labels, sizeof labels);
  uint8_t more[sizeof pixels + 3];
  memcpy(more, pixels, sizeof pixels);
  write_idx(tmp_path("tb-images"), 0, 0x803, 3, idims, more, sizeof more);
  expect_fail(tmp_path("tb-images"), tmp_path("tb-labels"), 3, BP_ERR_PARSE, "tb-images",
              "trailing bytes");
  /* a gzip file with damaged deflate data or CRC */
  static uint8_t big[4 * 64 * 64];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  const uint32_t bdims[3] = {4, 64, 64}, bl[1] = {4};
  write_idx(tmp_path("bad.gz"), 1, 0x803, 3, bdims, big, sizeof big);
  write_idx(tmp_path("bad-labels"), 0, 0x801, 1, bl, labels, 4);
  FILE *f = fopen(tmp_path("bad.gz"), "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  for (long at = 20; at < size - 8; at += 97) {
    fseek(f, at, SEEK_SET);
    fputc(0x5a, f);
  }
  fclose(f);
  bp_dataset *d = NULL;
  bp_status st = bp_dataset_load_idx(tmp_path("bad.gz"), tmp_path("bad-labels"), 3, &d);
  ck_assert_int_ne(st, BP_OK);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "bad.gz"));
  fprintf(stderr, "corrupt gzip: %s: %s\n", bp_status_str(st), bp_last_error());
}
END_TEST

START_TEST(mislabeled_count_is_refused) {
  make_data(3);
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N - 1};
  write_idx(tmp_path("mc-images"), 1, 0x803, 3, idims, pixels, sizeof pixels);
  write_idx(tmp_path("mc-labels"), 1, 0x801, 1, ldims, labels, N - 1);
  expect_fail(tmp_path("mc-images"), tmp_path("mc-labels"), 3, BP_ERR_SHAPE, "mislabeled count",
              "holds 5 images but");
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "holds 4 labels"));
}
END_TEST

START_TEST(label_out_of_range_is_refused) {
  make_data(3);
  labels[3] = 10;
  write_pair(tmp_path("lr-images"), tmp_path("lr-labels.gz"), 1);
  expect_fail(tmp_path("lr-images"), tmp_path("lr-labels.gz"), 10, BP_ERR_PARSE, "lr-labels.gz",
              "label 10 of sample 3 is out of range [0, 10)");
  /* the same file with classes inferred is fine: 11 classes */
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_load_idx(tmp_path("lr-images"), tmp_path("lr-labels.gz"), 0, &d),
                   BP_OK);
  ck_assert_int_eq(bp_dataset_get_info(d)->classes, 11);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(absurd_dimensions_are_refused_without_allocating) {
  make_data(3);
  const uint32_t ldims[1] = {N};
  write_idx(tmp_path("ab-labels"), 0, 0x801, 1, ldims, labels, sizeof labels);
  const uint32_t overflow[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
  write_idx(tmp_path("ab-images"), 0, 0x803, 3, overflow, pixels, 8);
  expect_fail(tmp_path("ab-images"), tmp_path("ab-labels"), 3, BP_ERR_OVERFLOW, "ab-images",
              "absurd dimensions 4294967295x4294967295x4294967295");
  const uint32_t too_big[3] = {1u << 20, 1u << 20, 2}; /* 2 TiB */
  write_idx(tmp_path("ab-images"), 1, 0x803, 3, too_big, pixels, 8);
  expect_fail(tmp_path("ab-images"), tmp_path("ab-labels"), 3, BP_ERR_OVERFLOW, "ab-images",
              "absurd dimensions");
  const uint32_t zero[3] = {N, 0, W};
  write_idx(tmp_path("ab-images"), 0, 0x803, 3, zero, pixels, 8);
  expect_fail(tmp_path("ab-images"), tmp_path("ab-labels"), 3, BP_ERR_PARSE, "ab-images",
              "dimension 1 of its header is 0");
  /* huge but under the limit: a short file is truncated, nothing big is allocated */
  const uint32_t huge[3] = {1000000, 1000, 1000}, hl[1] = {1000000};
  write_idx(tmp_path("ab-huge.gz"), 1, 0x803, 3, huge, pixels, sizeof pixels);
  write_idx(tmp_path("ab-huge-labels"), 0, 0x801, 1, hl, labels, sizeof labels);
  expect_fail(tmp_path("ab-huge.gz"), tmp_path("ab-huge-labels"), 3, BP_ERR_PARSE, "ab-huge.gz",
              "is truncated");
  const uint32_t channels[4] = {N, H, W, 17};
  write_idx(tmp_path("ab-c17"), 0, 0x804, 4, channels, pixels, 8);
  expect_fail(tmp_path("ab-c17"), tmp_path("ab-labels"), 3, BP_ERR_UNSUPPORTED, "ab-c17",
              "17 channels");
}
END_TEST

START_TEST(mutated_files_never_crash) {
  /* random byte changes and cuts of a valid pair, plain and gzip'd: every
   * load either succeeds with consistent data or fails with a message */
  make_data(3);
  const size_t ilen = 16 + sizeof pixels, llen = 8 + sizeof labels;
  uint8_t good_i[16 + sizeof pixels], good_l[8 + sizeof labels], buf[16 + sizeof pixels];
  put_be32(good_i, 0x803);
  put_be32(good_i + 4, N);
  put_be32(good_i + 8, H);
  put_be32(good_i + 12, W);
  memcpy(good_i + 16, pixels, sizeof pixels);
  put_be32(good_l, 0x801);
  put_be32(good_l + 4, N);
  memcpy(good_l + 8, labels, sizeof labels);
  char im[512], lb[512];
  snprintf(im, sizeof im, "%s", tmp_path("fz-images"));
  snprintf(lb, sizeof lb, "%s", tmp_path("fz-labels"));
  uint32_t x = 777;
  int failures = 0;
  for (int round = 0; round < 400; round++) {
    const int labels_side = round % 2, gz = (round / 2) % 2;
    const uint8_t *good = labels_side ? good_l : good_i;
    size_t len = labels_side ? llen : ilen;
    memcpy(buf, good, len);
    x = x * 1664525u + 1013904223u;
    if (x >> 31) { /* cut */
      len = (x >> 8) % len;
    } else { /* 1..4 bytes changed, mostly in the header */
      for (int k = 0; k < 1 + (int)(x >> 28 & 3); k++) {
        x = x * 1664525u + 1013904223u;
        size_t at = (x >> 20) % (x & 1 ? 16 : len);
        if (at >= len) at = len - 1;
        buf[at] = (uint8_t)(x >> 8);
      }
    }
    write_bytes(labels_side ? lb : im, gz, buf, len);
    write_bytes(labels_side ? im : lb, 0, labels_side ? good_i : good_l,
                labels_side ? ilen : llen);
    bp_dataset *d = NULL;
    bp_clear_error();
    bp_status st = bp_dataset_load_idx(im, lb, 3, &d);
    if (st == BP_OK) {
      const bp_dataset_info *in = bp_dataset_get_info(d);
      ck_assert_int_ge(in->count, 1);
      for (int64_t i = 0; i < in->count; i++) ck_assert_uint_lt(bp_dataset_labels(d)[i], 3);
      bp_dataset_destroy(d);
    } else {
      ck_assert_ptr_null(d);
      ck_assert_int_gt((int)strlen(bp_last_error()), 10);
      ck_assert_ptr_nonnull(strstr(bp_last_error(), labels_side ? "fz-labels" : "fz-images"));
      failures++;
    }
  }
  ck_assert_int_gt(failures, 200);
}
END_TEST

START_TEST(datasets_from_memory_and_subsets) {
  make_data(3);
  bp_dataset_info info = {N, H, W, 1, 3};
  bp_dataset *d = NULL, *s = NULL;
  ck_assert_int_eq(bp_dataset_create(&info, pixels, labels, &d), BP_OK);
  assert_same(d, 3);
  ck_assert_int_eq(bp_dataset_subset(d, 1, 3, &s), BP_OK);
  ck_assert_int_eq(bp_dataset_get_info(s)->count, 3);
  ck_assert_mem_eq(bp_dataset_images(s), pixels + H * W, 3 * H * W);
  ck_assert_mem_eq(bp_dataset_labels(s), labels + 1, 3);
  bp_dataset_destroy(s);
  s = NULL;
  ck_assert_int_eq(bp_dataset_subset(d, 3, 3, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_dataset_subset(d, -1, 1, &s), BP_ERR_INVALID);
  ck_assert_ptr_null(s);
  bp_dataset_destroy(d);
  info.classes = 2; /* label 2 is out of range */
  ck_assert_int_eq(bp_dataset_create(&info, pixels, labels, &d), BP_ERR_INVALID);
  info.classes = 3;
  info.channels = 0;
  ck_assert_int_eq(bp_dataset_create(&info, pixels, labels, &d), BP_ERR_INVALID);
  info.channels = 1;
  info.count = INT64_MAX / 2;
  ck_assert_int_eq(bp_dataset_create(&info, pixels, labels, &d), BP_ERR_OVERFLOW);
}
END_TEST

/* ---- Fashion-MNIST (the Debian package) --------------------------------- */

static void check_split(bp_data_split split, int64_t count, int per_class) {
  bp_dataset *d = NULL;
  bp_status st = bp_dataset_load_mnist(NULL, split, &d);
  if (st != BP_OK) ck_abort_msg("%s: %s", bp_status_str(st), bp_last_error());
  const bp_dataset_info *in = bp_dataset_get_info(d);
  ck_assert_int_eq(in->count, count);
  ck_assert_int_eq(in->height, 28);
  ck_assert_int_eq(in->width, 28);
  ck_assert_int_eq(in->channels, 1);
  ck_assert_int_eq(in->classes, 10);
  int hist[10] = {0};
  const uint8_t *lab = bp_dataset_labels(d);
  for (int64_t i = 0; i < count; i++) {
    ck_assert_uint_lt(lab[i], 10);
    hist[lab[i]]++;
  }
  for (int c = 0; c < 10; c++) ck_assert_int_eq(hist[c], per_class); /* balanced */
  ck_assert_uint_eq(lab[0], 9); /* both splits start with an ankle boot */
  bp_data_norm norm;
  ck_assert_int_eq(bp_dataset_stats(d, &norm), BP_OK);
  printf("Fashion-MNIST %s: %lld images 28x28, mean %.6f std %.6f\n",
         split == BP_DATA_TRAIN ? "train" : "test", (long long)count, (double)norm.mean[0],
         (double)norm.std[0]);
  if (split == BP_DATA_TRAIN) {
    ck_assert_float_eq_tol(norm.mean[0], BP_FASHION_MNIST_MEAN, 1e-4);
    ck_assert_float_eq_tol(norm.std[0], BP_FASHION_MNIST_STD, 1e-4);
  }
  bp_dataset_destroy(d);
}

START_TEST(fashion_mnist_train) { check_split(BP_DATA_TRAIN, 60000, 6000); }
END_TEST

START_TEST(fashion_mnist_test) { check_split(BP_DATA_TEST, 10000, 1000); }
END_TEST

static int run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--fashion-mnist") == 0) {
    struct stat sb;
    if (stat(BP_DATA_DEFAULT_DIR, &sb) != 0) {
      printf("SKIP: %s is missing; install the Debian package dataset-fashion-mnist to run the "
             "Fashion-MNIST test\n",
             BP_DATA_DEFAULT_DIR);
      return 77;
    }
    Suite *s = suite_create("fashion-mnist");
    TCase *tc = tcase_create("fashion-mnist");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, fashion_mnist_train);
    tcase_add_test(tc, fashion_mnist_test);
    suite_add_tcase(s, tc);
    return run(s);
  }
  Suite *s = suite_create("data-idx");
  TCase *tc = tcase_create("idx");
  tcase_set_timeout(tc, 60);
  tcase_add_unchecked_fixture(tc, make_tmp, remove_tmp);
  tcase_add_test(tc, plain_and_gzip_read_back_exactly);
  tcase_add_test(tc, mnist_directory_takes_gz_or_plain);
  tcase_add_test(tc, four_dimensional_images_carry_channels);
  tcase_add_test(tc, missing_file_or_directory_is_an_io_error);
  tcase_add_test(tc, wrong_magic_is_refused);
  tcase_add_test(tc, truncated_files_are_refused);
  tcase_add_test(tc, trailing_and_corrupt_bytes_are_refused);
  tcase_add_test(tc, mislabeled_count_is_refused);
  tcase_add_test(tc, label_out_of_range_is_refused);
  tcase_add_test(tc, absurd_dimensions_are_refused_without_allocating);
  tcase_add_test(tc, mutated_files_never_crash);
  tcase_add_test(tc, datasets_from_memory_and_subsets);
  suite_add_tcase(s, tc);
  return run(s);
}
