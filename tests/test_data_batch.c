/* Batches: permutations, shards, augmentation draws, FP16 rounding, and the
 * fill into strided tensors (padded channels, hand-built strides), checked
 * against values computed here element by element. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/data.h"

/* ---- permutation -------------------------------------------------------- */

static int64_t *perm_of(uint64_t seed, uint64_t epoch, int64_t n) {
  int64_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(bp_data_permutation(seed, epoch, 1, n, p), BP_OK);
  return p;
}

START_TEST(permutation_is_a_permutation) {
  const int64_t sizes[] = {0, 1, 2, 3, 10, 1000, 60000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    int64_t n = sizes[s];
    int64_t *p = perm_of(7, 3, n);
    char *seen = calloc((size_t)(n ? n : 1), 1);
    for (int64_t i = 0; i < n; i++) {
      ck_assert_int_ge(p[i], 0);
      ck_assert_int_lt(p[i], n);
      ck_assert_int_eq(seen[p[i]], 0);
      seen[p[i]] = 1;
    }
    free(seen);
    free(p);
  }
  int64_t id[5];
  ck_assert_int_eq(bp_data_permutation(1, 2, 0, 5, id), BP_OK); /* no shuffle: identity */
  for (int i = 0; i < 5; i++) ck_assert_int_eq(id[i], i);
  ck_assert_int_eq(bp_data_permutation(1, 2, 1, -1, id), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_permutation(1, 2, 1, 3, NULL), BP_ERR_INVALID);
}
END_TEST

START_TEST(permutation_is_fixed_by_seed_and_epoch) {
  const int64_t n = 1000;
  int64_t *a = perm_of(42, 0, n), *b = perm_of(42, 0, n), *c = perm_of(42, 1, n),
          *d = perm_of(43, 0, n);
  ck_assert_mem_eq(a, b, (size_t)n * sizeof *a);                 /* same seed, same epoch */
  ck_assert_int_ne(memcmp(a, c, (size_t)n * sizeof *a), 0);      /* a new one every epoch */
  ck_assert_int_ne(memcmp(a, d, (size_t)n * sizeof *a), 0);      /* and for every seed */
  int fixed = 0;
  for (int64_t i = 0; i < n; i++) fixed += a[i] == i;
  ck_assert_int_lt(fixed, 10); /* about one fixed point expected */
  free(a);
  free(b);
  free(c);
  free(d);
  /* pinned: the algorithm (SplitMix64 + Fisher-Yates) is part of the
   * contract; a run on another machine or build sees the same order */
  int64_t p[10];
  ck_assert_int_eq(bp_data_permutation(42, 0, 1, 10, p), BP_OK);
  printf("permutation(seed 42, epoch 0, n 10) =");
  for (int i = 0; i < 10; i++) printf(" %lld", (long long)p[i]);
  printf("\n");
  const int64_t pinned[10] = {3, 0, 1, 9, 4, 6, 5, 8, 2, 7}; /* also from a Python model */
  ck_assert_mem_eq(p, pinned, sizeof p);
}
END_TEST

START_TEST(permutation_is_uniform) {
  /* all 6 orders of 3 items over 60000 epochs: 10000 each, sd ~91 */
  int count[6] = {0};
  for (uint64_t e = 0; e < 60000; e++) {
    int64_t p[3];
    ck_assert_int_eq(bp_data_permutation(5, e, 1, 3, p), BP_OK);
    int code = (int)(p[0] * 2 + (p[1] > p[2]));
    count[code]++;
  }
  for (int k = 0; k < 6; k++) {
    ck_assert_int_gt(count[k], 10000 - 500);
    ck_assert_int_lt(count[k], 10000 + 500);
  }
  /* each position takes each value equally often (n = 10, 20000 epochs) */
  int pos[10][10] = {{0}};
  for (uint64_t e = 0; e < 20000; e++) {
    int64_t p[10];
    ck_assert_int_eq(bp_data_permutation(9, e, 1, 10, p), BP_OK);
    for (int i = 0; i < 10; i++) pos[i][p[i]]++;
  }
  for (int i = 0; i < 10; i++)
    for (int v = 0; v < 10; v++) {
      ck_assert_int_gt(pos[i][v], 2000 - 250);
      ck_assert_int_lt(pos[i][v], 2000 + 250);
    }
}
END_TEST

/* ---- sharding ----------------------------------------------------------- */

START_TEST(shards_cover_a_batch_exactly_once) {
  for (int world = 1; world <= 8; world++) {
    for (int64_t count = 0; count <= 50; count++) {
      int64_t next = 0;
      for (int r = 0; r < world; r++) {
        int64_t off = -1, cnt = -1;
        ck_assert_int_eq(bp_data_shard(count, world, r, &off, &cnt), BP_OK);
        ck_assert_int_eq(off, next); /* adjacent, in rank order */
        /* the first count % world ranks take one more */
        ck_assert_int_eq(cnt, count / world + (r < count % world ? 1 : 0));
        ck_assert_int_le(cnt, bp_data_rank_capacity(count ? count : 1, world));
        next += cnt;
      }
      ck_assert_int_eq(next, count);
    }
  }
  int64_t off, cnt;
  ck_assert_int_eq(bp_data_shard(5, 0, 0, &off, &cnt), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_shard(5, 2, 2, &off, &cnt), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_shard(-1, 2, 0, &off, &cnt), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_rank_capacity(64, 3), 22);
  ck_assert_int_eq(bp_data_rank_capacity(64, 4), 16);
  ck_assert_int_eq(bp_data_rank_capacity(0, 4), 0);
}
END_TEST

START_TEST(step_slices_cover_an_epoch_exactly_once) {
  const int64_t sizes[] = {1, 7, 50, 64, 65};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int64_t n = sizes[s];
    for (int64_t batch = 1; batch <= 17; batch++) {
      for (int drop = 0; drop < 2; drop++) {
        const int64_t steps = bp_data_steps_per_epoch(n, batch, drop);
        ck_assert_int_eq(steps, drop ? n / batch : (n + batch - 1) / batch);
        for (int world = 1; world <= 8; world++) {
          int64_t covered = 0;
          for (int64_t step = 0; step < steps; step++) {
            int64_t next = step * batch;
            for (int r = 0; r < world; r++) {
              bp_data_slice sl;
              ck_assert_int_eq(bp_data_step_slice(n, batch, drop, step, world, r, &sl), BP_OK);
              ck_assert_int_eq(sl.first, next);
              ck_assert_int_le(sl.count, bp_data_rank_capacity(batch, world));
              ck_assert_int_eq(sl.global_count, step < n / batch ? batch : n % batch);
              next += sl.count;
            }
            ck_assert_int_eq(next, step * batch + (step < n / batch ? batch : n % batch));
            covered = next;
          }
          ck_assert_int_eq(covered, drop ? n / batch * batch : n);
          bp_data_slice sl;
          ck_assert_int_eq(bp_data_step_slice(n, batch, drop, steps, world, 0, &sl),
                           BP_ERR_INVALID);
        }
      }
    }
  }
  ck_assert_int_eq(bp_data_steps_per_epoch(5, 8, 1), 0);
  /* the documented example: 50 samples, B 16, 8 ranks: last batch of 2 */
  bp_data_slice sl;
  ck_assert_int_eq(bp_data_step_slice(50, 16, 0, 3, 8, 1, &sl), BP_OK);
  ck_assert_int_eq(sl.first, 49);
  ck_assert_int_eq(sl.count, 1);
  ck_assert_int_eq(bp_data_step_slice(50, 16, 0, 3, 8, 2, &sl), BP_OK);
  ck_assert_int_eq(sl.count, 0);
}
END_TEST

/* ---- augmentation draws ------------------------------------------------- */

START_TEST(augmentation_draws_are_deterministic_and_uniform) {
  const bp_data_augment aug = {2, 1};
  int hist_dy[5] = {0}, hist_dx[5] = {0}, flips = 0, differ = 0;
  for (int64_t i = 0; i < 5000; i++) {
    bp_data_augment_draw a, b, c;
    bp_data_augment_params(11, 4, i, &aug, &a);
    bp_data_augment_params(11, 4, i, &aug, &b);
    ck_assert_mem_eq(&a, &b, sizeof a);
    ck_assert_int_ge(a.dy, -2);
    ck_assert_int_le(a.dy, 2);
    ck_assert_int_ge(a.dx, -2);
    ck_assert_int_le(a.dx, 2);
    hist_dy[a.dy + 2]++;
    hist_dx[a.dx + 2]++;
    flips += a.flip;
    bp_data_augment_params(11, 5, i, &aug, &c); /* next epoch */
    differ += memcmp(&a, &c, sizeof a) != 0;
    /* the crop does not depend on whether flips are on, nor the reverse */
    const bp_data_augment crop_only = {2, 0}, flip_only = {0, 1};
    bp_data_augment_params(11, 4, i, &crop_only, &c);
    ck_assert_int_eq(c.dy, a.dy);
    ck_assert_int_eq(c.dx, a.dx);
    ck_assert_int_eq(c.flip, 0);
    bp_data_augment_params(11, 4, i, &flip_only, &c);
    ck_assert_int_eq(c.flip, a.flip);
    ck_assert_int_eq(c.dy, 0);
  }
  for (int k = 0; k < 5; k++) {
    ck_assert_int_gt(hist_dy[k], 1000 - 150);
    ck_assert_int_lt(hist_dy[k], 1000 + 150);
    ck_assert_int_gt(hist_dx[k], 1000 - 150);
    ck_assert_int_lt(hist_dx[k], 1000 + 150);
  }
  ck_assert_int_gt(flips, 2500 - 200);
  ck_assert_int_lt(flips, 2500 + 200);
  ck_assert_int_gt(differ, 4500);
  bp_data_augment_draw z = {9, 9, 9};
  bp_data_augment_params(1, 1, 1, NULL, &z);
  ck_assert_int_eq(z.dy | z.dx | z.flip, 0);
}
END_TEST

/* ---- FP16 --------------------------------------------------------------- */

static int is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

START_TEST(fp16_is_exact_on_every_representable_value) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = bp_fp16_to_fp32((uint16_t)h);
    uint16_t back = bp_fp16_from_fp32(f);
    if (is_nan16((uint16_t)h)) {
      ck_assert(isnan(f));
      ck_assert(is_nan16(back));
      ck_assert_uint_eq(back & 0x8000, h & 0x8000);
    } else {
      ck_assert_uint_eq(back, h);
    }
  }
  /* a few values by hand */
  ck_assert_float_eq(bp_fp16_to_fp32(0x3c00), 1.0f);
  ck_assert_float_eq(bp_fp16_to_fp32(0xc000), -2.0f);
  ck_assert_float_eq(bp_fp16_to_fp32(0x7bff), 65504.0f);
  ck_assert_float_eq(bp_fp16_to_fp32(0x0001), ldexpf(1.0f, -24));
  ck_assert_float_eq(bp_fp16_to_fp32(0x03ff), ldexpf(1023.0f, -24));
  ck_assert_float_eq(bp_fp16_to_fp32(0x0400), ldexpf(1.0f, -14));
  ck_assert(isinf(bp_fp16_to_fp32(0x7c00)));
}
END_TEST

START_TEST(fp16_rounds_to_nearest_even) {
  /* between every two adjacent finite halves of either sign: the midpoint
   * (exact in float) goes to the even one, anything off it to the nearer */
  for (uint32_t h = 0; h < 0x7bff; h++) {
    for (int neg = 0; neg < 2; neg++) {
      const uint16_t sign = neg ? 0x8000 : 0;
      const uint16_t lo = (uint16_t)(h | sign), hi = (uint16_t)((h + 1) | sign);
      const float a = bp_fp16_to_fp32(lo), b = bp_fp16_to_fp32(hi);
      const float mid = (a + b) / 2;
      ck_assert(mid != a && mid != b);
      ck_assert_uint_eq(bp_fp16_from_fp32(mid), (h & 1) ? hi : lo);
      ck_assert_uint_eq(bp_fp16_from_fp32(nextafterf(mid, b)), hi);
      ck_assert_uint_eq(bp_fp16_from_fp32(nextafterf(mid, a)), lo);
    }
  }
  /* overflow: 65520 is the midpoint between 65504 and 2^16 (odd 0x7bff) */
  ck_assert_uint_eq(bp_fp16_from_fp32(65519.996f), 0x7bff);
  ck_assert_uint_eq(bp_fp16_from_fp32(65520.0f), 0x7c00);
  ck_assert_uint_eq(bp_fp16_from_fp32(-65520.0f), 0xfc00);
  ck_assert_uint_eq(bp_fp16_from_fp32(1e10f), 0x7c00);
  ck_assert_uint_eq(bp_fp16_from_fp32(-INFINITY), 0xfc00);
  ck_assert(is_nan16(bp_fp16_from_fp32(NAN)));
  /* underflow: 2^-25 is the midpoint between 0 and the smallest subnormal */
  ck_assert_uint_eq(bp_fp16_from_fp32(ldexpf(1.0f, -25)), 0x0000);
  ck_assert_uint_eq(bp_fp16_from_fp32(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
  ck_assert_uint_eq(bp_fp16_from_fp32(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp: to even */
  ck_assert_uint_eq(bp_fp16_from_fp32(ldexpf(3.0f, -26)), 0x0001); /* 0.75 ulp */
  ck_assert_uint_eq(bp_fp16_from_fp32(1e-30f), 0x0000);
  ck_assert_uint_eq(bp_fp16_from_fp32(-1e-30f), 0x8000);
  ck_assert_uint_eq(bp_fp16_from_fp32(-0.0f), 0x8000);
  ck_assert_uint_eq(bp_fp16_from_fp32(ldexpf(1.0f, -140)), 0x0000); /* a float subnormal */
  /* the largest subnormal rounds up into the smallest normal */
  ck_assert_uint_eq(bp_fp16_from_fp32(nextafterf(ldexpf(1.0f, -14), 0.0f)), 0x0400);
#ifdef __FLT16_MAX__
  /* against the compiler's own conversion where it has _Float16 */
  uint32_t x = 12345;
  for (int i = 0; i < 1000000; i++) {
    x = x * 1664525u + 1013904223u;
    float f;
    uint32_t bits = x;
    memcpy(&f, &bits, sizeof f);
    if (isnan(f)) continue;
    _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, sizeof want);
    ck_assert_uint_eq(bp_fp16_from_fp32(f), want);
  }
#endif
}
END_TEST

/* ---- batch filling ------------------------------------------------------ */

enum { N = 6, H = 5, W = 7 };

/* N images HxWxc: pixel (i, y, x, ch) = (i*31 + y*7 + x*3 + ch*50) mod 256;
 * labels 9 - i. */
static bp_dataset *make_dataset(int c) {
  uint8_t *px = malloc((size_t)N * H * W * (size_t)c);
  uint8_t lab[N];
  for (int i = 0; i < N; i++) {
    lab[i] = (uint8_t)(9 - i);
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++)
        for (int ch = 0; ch < c; ch++)
          px[((i * H + y) * W + x) * c + ch] = (uint8_t)(i * 31 + y * 7 + x * 3 + ch * 50);
  }
  bp_dataset_info info = {N, H, W, c, 10};
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_create(&info, px, lab, &d), BP_OK);
  free(px);
  return d;
}

static uint8_t pixel(const bp_dataset *d, int64_t i, int64_t y, int64_t x, int64_t ch) {
  const bp_dataset_info *in = bp_dataset_get_info(d);
  return bp_dataset_images(d)[((i * in->height + y) * in->width + x) * in->channels + ch];
}

/* What element (y, x, ch) of sample `index` must be, computed the slow way. */
static float expected(const bp_dataset *d, int64_t index, int64_t y, int64_t x, int64_t ch,
                      const bp_data_fill_options *o) {
  bp_data_augment_draw dr;
  bp_data_augment_params(o->seed, o->epoch, index, &o->augment, &dr);
  int64_t sy = y + dr.dy, sx = (dr.flip ? W - 1 - x : x) + dr.dx;
  uint8_t p = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? pixel(d, index, sy, sx, ch) : 0;
  float v = (float)p / 255.0f;
  if (o->norm) v = (v - o->norm->mean[ch]) / o->norm->std[ch];
  return v;
}

static void *alloc_slot(const bp_dtensor *t, uint8_t fill) {
  void *p = NULL;
  ck_assert_int_eq(posix_memalign(&p, 256, t->slot_bytes), 0);
  memset(p, fill, t->slot_bytes);
  return p;
}

START_TEST(fill_fp32_matches_hand_computed_values) {
  bp_dataset *d = make_dataset(1);
  bp_dtensor img, lab;
  ck_assert_int_eq(bp_dtensor_make(&img, 0, "image", (bp_shape){4, H, W, 1}, BP_DTYPE_FP32,
                                   BP_REGION_I_A, 0, (bp_init){0, 0, 0, 0}),
                   BP_OK);
  ck_assert_int_eq(bp_dtensor_make(&lab, 1, "label", (bp_shape){4, 1, 1, 1}, BP_DTYPE_INT32,
                                   BP_REGION_I_A, 0, (bp_init){0, 0, 0, 0}),
                   BP_OK);
  float *x = alloc_slot(&img, 0xab);
  int32_t *l = alloc_slot(&lab, 0xab);
  const bp_data_norm norm = {1, {0.5f}, {0.25f}};
  const bp_data_fill_options o = {&norm, {0, 0}, 1, 0};
  const int64_t idx[3] = {2, 0, 5};
  ck_assert_int_eq(bp_data_fill(d, idx, 3, &o, &img, x, &lab, l), BP_OK);
  for (int i = 0; i < 4; i++) {
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++) {
        float got = x[i * H * W + y * W + xx];
        if (i < 3) {
          float want = ((float)pixel(d, idx[i], y, xx, 0) / 255.0f - 0.5f) / 0.25f;
          ck_assert_float_eq(got, want);
        } else {
          ck_assert_float_eq(got, 0.0f); /* an unused row is zeroed */
        }
      }
    ck_assert_int_eq(l[i], i < 3 ? 9 - idx[i] : 0);
  }
  /* the tail past the tensor is untouched */
  ck_assert_uint_eq(((uint8_t *)x)[4 * H * W * 4], 0xab);
  /* no normalization: p / 255 */
  ck_assert_int_eq(bp_data_fill(d, idx, 1, NULL, &img, x, NULL, NULL), BP_OK);
  ck_assert_float_eq(x[1], (float)pixel(d, 2, 0, 1, 0) / 255.0f);
  free(x);
  free(l);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(fill_fp16_writes_padded_channels) {
  /* FP16 in I_A pads 3 channels to 4 (docs/architecture.md, "DTensor rules") */
  bp_dataset *d = make_dataset(3);
  bp_dtensor img;
  ck_assert_int_eq(bp_dtensor_make(&img, 0, "image", (bp_shape){2, H, W, 3}, BP_DTYPE_FP16,
                                   BP_REGION_I_B, 0, (bp_init){0, 0, 0, 0}),
                   BP_OK);
  ck_assert_int_eq(img.padded_c, 4);
  ck_assert_int_eq(img.dev_stride[2], 4);
  uint16_t *x = alloc_slot(&img, 0xcd);
  const bp_data_norm norm = {3, {0.1f, 0.2f, 0.3f}, {0.5f, 0.6f, 0.7f}};
  const bp_data_fill_options o = {&norm, {1, 1}, 99, 3};
  const int64_t idx[2] = {4, 1};
  ck_assert_int_eq(bp_data_fill(d, idx, 2, &o, &img, x, NULL, NULL), BP_OK);
  for (int i = 0; i < 2; i++)
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++)
        for (int c = 0; c < 4; c++) {
          uint16_t got = x[i * img.dev_stride[0] + y * img.dev_stride[1] + xx * 4 + c];
          uint16_t want = c < 3 ? bp_fp16_from_fp32(expected(d, idx[i], y, xx, c, &o)) : 0;
          ck_assert_uint_eq(got, want);
        }
  ck_assert_uint_eq(x[2 * H * W * 4], 0xcdcd); /* tail untouched */
  free(x);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(fill_honours_hand_built_strides) {
  /* FP32 with 2 channels padded to 5 and gaps between rows and images */
  bp_dataset *d = make_dataset(2);
  bp_dtensor img;
  memset(&img, 0, sizeof img);
  snprintf(img.name, sizeof img.name, "strided");
  img.shape = (bp_shape){3, H, W, 2};
  img.dtype = BP_DTYPE_FP32;
  img.region = BP_REGION_T;
  img.padded_c = 5;
  img.dev_stride[3] = 1;
  img.dev_stride[2] = 5;
  img.dev_stride[1] = 5 * W + 3;
  img.dev_stride[0] = (5 * W + 3) * H + 11;
  const int64_t elems = 2 * img.dev_stride[0] + (H - 1) * img.dev_stride[1] + (W - 1) * 5 + 5;
  img.slot_bytes = (uint64_t)elems * 4;
  float *x = malloc((size_t)elems * 4 + 64);
  memset(x, 0xee, (size_t)elems * 4 + 64);
  const bp_data_fill_options o = {NULL, {2, 0}, 5, 1};
  const int64_t idx[3] = {3, 3, 0};
  ck_assert_int_eq(bp_data_fill(d, idx, 3, &o, &img, x, NULL, NULL), BP_OK);
  char *written = calloc((size_t)elems, 1);
  for (int i = 0; i < 3; i++)
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++)
        for (int c = 0; c < 5; c++) {
          int64_t e = i * img.dev_stride[0] + y * img.dev_stride[1] + xx * 5 + c;
          written[e] = 1;
          ck_assert_float_eq(x[e], c < 2 ? expected(d, idx[i], y, xx, c, &o) : 0.0f);
        }
  uint32_t gap;
  for (int64_t e = 0; e < elems + 16; e++) { /* gaps and the tail keep their bytes */
    if (e < elems && written[e]) continue;
    memcpy(&gap, &x[e], 4);
    ck_assert_uint_eq(gap, 0xeeeeeeee);
  }
  /* the same sample at two rows is the same data: augmentation depends on
   * the sample index, not on the row */
  ck_assert_mem_eq(x, x + img.dev_stride[0], (size_t)(H * img.dev_stride[1] - 3) * 4);
  free(written);
  free(x);
  bp_dataset_destroy(d);
}
END_TEST

typedef struct fill_job {
  const bp_dataset *d;
  const int64_t *idx;
  int64_t count;
  const bp_data_fill_options *o;
  const bp_dtensor *t;
  void *out;
  bp_status st;
} fill_job;

static void *fill_thread(void *arg) {
  fill_job *j = arg;
  j->st = bp_data_fill(j->d, j->idx, j->count, j->o, j->t, j->out, NULL, NULL);
  return NULL;
}

START_TEST(augmented_fill_does_not_depend_on_threads_or_position) {
  bp_dataset *d = make_dataset(1);
  bp_dtensor img;
  ck_assert_int_eq(bp_dtensor_make(&img, 0, "image", (bp_shape){N, H, W, 1}, BP_DTYPE_FP32,
                                   BP_REGION_I_A, 0, (bp_init){0, 0, 0, 0}),
                   BP_OK);
  const bp_data_fill_options o = {NULL, {3, 1}, 2024, 7};
  const int64_t all[N] = {5, 4, 3, 2, 1, 0};
  float *whole = alloc_slot(&img, 0);
  ck_assert_int_eq(bp_data_fill(d, all, N, &o, &img, whole, NULL, NULL), BP_OK);
  for (int i = 0; i < N; i++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++)
        ck_assert_float_eq(whole[(i * H + y) * W + x], expected(d, all[i], y, x, 0, &o));
  /* four threads, each the samples in another order into its own buffer */
  int64_t orders[4][N];
  float *outs[4];
  fill_job jobs[4];
  pthread_t th[4];
  for (int t = 0; t < 4; t++) {
    for (int i = 0; i < N; i++) orders[t][i] = all[(i + t) % N];
    outs[t] = alloc_slot(&img, 0);
    jobs[t] = (fill_job){d, orders[t], N, &o, &img, outs[t], BP_ERR_STATE};
    ck_assert_int_eq(pthread_create(&th[t], NULL, fill_thread, &jobs[t]), 0);
  }
  for (int t = 0; t < 4; t++) {
    ck_assert_int_eq(pthread_join(th[t], NULL), 0);
    ck_assert_int_eq(jobs[t].st, BP_OK);
    for (int i = 0; i < N; i++) /* sample all[(i+t)%N] at row i == row (i+t)%N of whole */
      ck_assert_mem_eq(outs[t] + i * H * W, whole + ((i + t) % N) * H * W, H * W * 4);
    free(outs[t]);
  }
  /* another epoch crops differently somewhere */
  const bp_data_fill_options o2 = {NULL, {3, 1}, 2024, 8};
  float *other = alloc_slot(&img, 0);
  ck_assert_int_eq(bp_data_fill(d, all, N, &o2, &img, other, NULL, NULL), BP_OK);
  ck_assert_int_ne(memcmp(other, whole, N * H * W * 4), 0);
  free(other);
  free(whole);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(fill_refuses_bad_arguments_before_writing) {
  bp_dataset *d = make_dataset(1);
  bp_dtensor img, lab, small, i8;
  const bp_init none = {0, 0, 0, 0};
  ck_assert_int_eq(bp_dtensor_make(&img, 0, "image", (bp_shape){2, H, W, 1}, BP_DTYPE_FP32,
                                   BP_REGION_I_A, 0, none), BP_OK);
  ck_assert_int_eq(bp_dtensor_make(&lab, 1, "label", (bp_shape){2, 1, 1, 1}, BP_DTYPE_INT32,
                                   BP_REGION_I_A, 0, none), BP_OK);
  ck_assert_int_eq(bp_dtensor_make(&small, 2, "small", (bp_shape){2, H, W - 1, 1}, BP_DTYPE_FP32,
                                   BP_REGION_I_A, 0, none), BP_OK);
  ck_assert_int_eq(bp_dtensor_make(&i8, 3, "bytes", (bp_shape){2, H, W, 1}, BP_DTYPE_INT8,
                                   BP_REGION_I_A, 0, none), BP_OK);
  float *x = alloc_slot(&img, 0x77);
  int32_t *l = alloc_slot(&lab, 0x77);
  const int64_t ok[2] = {0, 1}, bad[2] = {0, N};
  ck_assert_int_eq(bp_data_fill(d, bad, 2, NULL, &img, x, &lab, l), BP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "sample index 6 (row 1)"));
  ck_assert_int_eq(bp_data_fill(d, ok, 3, NULL, &img, x, &lab, l), BP_ERR_SHAPE); /* 3 > n */
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &small, x, &lab, l), BP_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "small"));
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &i8, x, &lab, l), BP_ERR_UNSUPPORTED);
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &img, x, &img, l), BP_ERR_UNSUPPORTED);
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &img, x, &lab, NULL), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &img, x, &lab, x), BP_ERR_INVALID); /* overlap */
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &img, (char *)x + 2, NULL, NULL), BP_ERR_INVALID);
  bp_dtensor tight = img;
  tight.slot_bytes = 2 * H * W * 4 - 4; /* one element short */
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &tight, x, NULL, NULL), BP_ERR_SHAPE);
  bp_dtensor alias = img;
  alias.dev_stride[2] = 0;
  ck_assert_int_eq(bp_data_fill(d, ok, 2, NULL, &alias, x, NULL, NULL), BP_ERR_SHAPE);
  bp_data_norm norm = {2, {0, 0}, {1, 1}};
  bp_data_fill_options o = {&norm, {0, 0}, 0, 0};
  ck_assert_int_eq(bp_data_fill(d, ok, 2, &o, &img, x, NULL, NULL), BP_ERR_SHAPE);
  norm.channels = 1;
  norm.std[0] = 0;
  ck_assert_int_eq(bp_data_fill(d, ok, 2, &o, &img, x, NULL, NULL), BP_ERR_INVALID);
  norm.std[0] = NAN;
  ck_assert_int_eq(bp_data_fill(d, ok, 2, &o, &img, x, NULL, NULL), BP_ERR_INVALID);
  o.norm = NULL;
  o.augment.crop_pad = -1;
  ck_assert_int_eq(bp_data_fill(d, ok, 2, &o, &img, x, NULL, NULL), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_fill(NULL, ok, 2, NULL, &img, x, NULL, NULL), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_fill(d, NULL, 2, NULL, &img, x, NULL, NULL), BP_ERR_INVALID);
  /* nothing was written by any refused call */
  for (size_t i = 0; i < img.slot_bytes; i++) ck_assert_uint_eq(((uint8_t *)x)[i], 0x77);
  for (size_t i = 0; i < lab.slot_bytes; i++) ck_assert_uint_eq(((uint8_t *)l)[i], 0x77);
  free(x);
  free(l);
  bp_dataset_destroy(d);
}
END_TEST

/* ---- the fill against a per-pixel reference, byte for byte ---------------
 * bp_data_fill has fast paths (whole rows as one lookup loop, crop and flip
 * split into runs) beside its generic per-element loop. Every combination
 * below is filled twice into buffers pre-set to the same sentinel bytes: by
 * bp_data_fill and by the plain loop here (augmentation draws recomputed
 * from the documented SplitMix64 streams, values from the documented
 * formula); the whole buffers, gaps, padded channels and tail included,
 * must be identical. */

#define REF_GOLDEN 0x9E3779B97F4A7C15ULL

static uint64_t ref_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static uint64_t ref_hash(uint64_t x) { return ref_mix(x + REF_GOLDEN); }

/* key = h(h(h(h(seed) ^ domain) ^ a) ^ b); draw k = mix(key + (k + 1) * GOLDEN) */
static uint64_t ref_key(uint64_t seed, uint64_t domain, uint64_t a, uint64_t b) {
  return ref_hash(ref_hash(ref_hash(ref_hash(seed) ^ domain) ^ a) ^ b);
}

/* uniform in [0, n) from draws *k, *k + 1, ...: reject below 2^64 mod n */
static uint64_t ref_below(uint64_t key, uint64_t *k, uint64_t n) {
  for (;;) {
    uint64_t x = ref_mix(key + (++*k) * REF_GOLDEN);
    if (x >= (0 - n) % n) return x % n;
  }
}

static bp_data_augment_draw ref_augment(uint64_t seed, uint64_t epoch, int64_t index,
                                        const bp_data_augment *a) {
  bp_data_augment_draw d = {0, 0, 0};
  if (a->crop_pad > 0) {
    const uint64_t key = ref_key(seed, 2, epoch, (uint64_t)index), n = 2 * (uint64_t)a->crop_pad + 1;
    uint64_t k = 0;
    d.dy = (int)ref_below(key, &k, n) - a->crop_pad;
    d.dx = (int)ref_below(key, &k, n) - a->crop_pad;
  }
  if (a->flip) d.flip = (int)(ref_mix(ref_key(seed, 3, epoch, (uint64_t)index) + REF_GOLDEN) >> 63);
  return d;
}

/* The fill of `t` (FP32 or FP16, any strides) written one element at a time:
 * out(i, y, x, c) = value of in(idx[i], y + dy, x' + dx, c), x' = flip ? W-1-x : x,
 * byte 0 outside the image, 0 in channels >= C and in rows >= count. */
static void ref_fill(const uint8_t *px, int64_t h, int64_t w, int c, const int64_t *idx,
                     int64_t count, const bp_data_fill_options *o, const bp_dtensor *t,
                     uint8_t *buf) {
  const int64_t *s = t->dev_stride;
  const size_t es = t->dtype == BP_DTYPE_FP16 ? 2 : 4;
  for (int64_t i = 0; i < t->shape.n; i++) {
    bp_data_augment_draw d = {0, 0, 0};
    if (i < count) d = ref_augment(o->seed, o->epoch, idx[i], &o->augment);
    for (int64_t y = 0; y < h; y++)
      for (int64_t x = 0; x < w; x++)
        for (int64_t ch = 0; ch < t->padded_c; ch++) {
          float v = 0.0f;
          if (i < count && ch < c) {
            const int64_t sy = y + d.dy, sx = (d.flip ? w - 1 - x : x) + d.dx;
            const uint8_t p =
                sy >= 0 && sy < h && sx >= 0 && sx < w ? px[((idx[i] * h + sy) * w + sx) * c + ch] : 0;
            v = (float)p / 255.0f;
            if (o->norm) v = (v - o->norm->mean[ch]) / o->norm->std[ch];
          }
          uint8_t *e = buf + (size_t)(i * s[0] + y * s[1] + x * s[2] + ch * s[3]) * es;
          if (es == 2) {
            const uint16_t hv = bp_fp16_from_fp32(v);
            memcpy(e, &hv, 2);
          } else {
            memcpy(e, &v, 4);
          }
        }
  }
}

/* Output layouts: padded channels (extra), channel stride s3, extra
 * elements after each pixel (pixel gap), row and image gaps. */
typedef struct ref_layout {
  int extra_c, s3, pixel_gap, row_gap, image_gap;
} ref_layout;

START_TEST(fill_fast_paths_match_a_per_pixel_reference) {
  static const ref_layout layouts[] = {
      {0, 1, 0, 0, 0},  /* compact: a whole sample is one run */
      {0, 1, 0, 3, 5},  /* compact pixels, gaps between rows and images */
      {3, 1, 0, 0, 0},  /* padded channels (1 -> 4 as FP16 in I_A) */
      {1, 1, 0, 1, 7},  /* padded channels and gaps */
      {5, 1, 0, 0, 2},  /* many padded channels */
      {0, 2, 0, 0, 0},  /* channels not adjacent: the generic loop */
      {1, 1, 1, 2, 1},  /* pixels not adjacent: the generic loop */
  };
  static const int64_t sizes[][2] = {{5, 7}, {28, 28}, {3, 1}, {1, 9}, {6, 2}};
  static const int pads[] = {0, 1, 2, 3, 4, 7, 9, 30};
  enum { IMAGES = 9, ROWS = 8 };
  const bp_data_norm norms[3] = {{1, {0.2860f}, {0.3530f}},
                                 {2, {0.1f, -0.7f}, {0.5f, 3.0f}},
                                 {3, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}};
  uint32_t lcg = 2463534242u;
  int64_t fills = 0, shifted = 0, flipped = 0;
  for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++) {
    const int64_t h = sizes[sz][0], w = sizes[sz][1];
    for (int c = 1; c <= 3; c++) {
      /* random bytes, with runs of 0 and 255 */
      const size_t bytes = (size_t)(IMAGES * h * w * c);
      uint8_t *px = malloc(bytes);
      uint8_t lab[IMAGES];
      for (size_t k = 0; k < bytes; k++) {
        lcg = lcg * 1664525u + 1013904223u;
        px[k] = (uint8_t)(k % 37 < 3 ? 0 : k % 41 < 2 ? 255 : lcg >> 24);
      }
      for (int k = 0; k < IMAGES; k++) lab[k] = (uint8_t)k;
      bp_dataset_info info = {IMAGES, h, w, c, IMAGES};
      bp_dataset *d = NULL;
      ck_assert_int_eq(bp_dataset_create(&info, px, lab, &d), BP_OK);
      for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        const ref_layout *L = &layouts[li];
        for (int fp16 = 0; fp16 < 2; fp16++) {
          bp_dtensor t;
          memset(&t, 0, sizeof t);
          snprintf(t.name, sizeof t.name, "ref");
          t.shape = (bp_shape){ROWS, h, w, c};
          t.dtype = fp16 ? BP_DTYPE_FP16 : BP_DTYPE_FP32;
          t.region = BP_REGION_T;
          t.padded_c = c + L->extra_c;
          t.dev_stride[3] = L->s3;
          t.dev_stride[2] = t.padded_c * L->s3 + L->pixel_gap;
          t.dev_stride[1] = w * t.dev_stride[2] + L->row_gap;
          t.dev_stride[0] = h * t.dev_stride[1] + L->image_gap;
          const size_t es = fp16 ? 2 : 4;
          const int64_t extent = (ROWS - 1) * t.dev_stride[0] + (h - 1) * t.dev_stride[1] +
                                 (w - 1) * t.dev_stride[2] + (t.padded_c - 1) * L->s3 + 1;
          t.slot_bytes = (uint64_t)extent * es;
          const size_t total = (size_t)t.slot_bytes + 64; /* and a tail never written */
          uint8_t *got = malloc(total), *want = malloc(total);
          for (size_t pi = 0; pi < sizeof pads / sizeof pads[0]; pi++) {
            for (int flip = 0; flip < 2; flip++) {
              const uint8_t sentinel = (uint8_t)(0xa5 + fills);
              memset(got, sentinel, total);
              memset(want, sentinel, total);
              int64_t idx[ROWS];
              for (int k = 0; k < ROWS; k++) {
                lcg = lcg * 1664525u + 1013904223u;
                idx[k] = (lcg >> 8) % IMAGES;
              }
              const int64_t count = ROWS - (int64_t)(fills % 3); /* some unused rows */
              const bp_data_fill_options o = {fills % 4 == 3 ? NULL : &norms[c - 1],
                                              {pads[pi], flip},
                                              (uint64_t)fills * 7919u + 1,
                                              (uint64_t)(fills % 5)};
              bp_status st = bp_data_fill(d, idx, count, &o, &t, got, NULL, NULL);
              if (st != BP_OK) ck_abort_msg("fill refused: %s", bp_last_error());
              ref_fill(px, h, w, c, idx, count, &o, &t, want);
              if (memcmp(got, want, total) != 0) {
                size_t k = 0;
                while (got[k] == want[k]) k++;
                ck_abort_msg("%lldx%lldx%d padded %lld strides [%lld,%lld,%lld,%lld] %s, crop %d "
                             "flip %d seed %llu: byte %zu (element %zu) is %02x, want %02x",
                             (long long)h, (long long)w, c, (long long)t.padded_c,
                             (long long)t.dev_stride[0], (long long)t.dev_stride[1],
                             (long long)t.dev_stride[2], (long long)t.dev_stride[3],
                             fp16 ? "fp16" : "fp32", pads[pi], flip,
                             (unsigned long long)o.seed, k, k / es, got[k], want[k]);
              }
              for (int64_t k = 0; k < count; k++) {
                bp_data_augment_draw dr = ref_augment(o.seed, o.epoch, idx[k], &o.augment);
                shifted += dr.dx != 0 || dr.dy != 0;
                flipped += dr.flip;
              }
              fills++;
            }
          }
          free(got);
          free(want);
        }
      }
      bp_dataset_destroy(d);
      free(px);
    }
  }
  printf("fast-path reference: %lld fills, %lld samples shifted, %lld flipped\n",
         (long long)fills, (long long)shifted, (long long)flipped);
  ck_assert_int_gt(shifted, fills);
  ck_assert_int_gt(flipped, fills);
}
END_TEST

START_TEST(augmentation_draws_follow_the_documented_streams) {
  /* bp_data_augment_params against SplitMix64 written out here */
  const int pads[] = {0, 1, 2, 4, 17, 65535};
  for (size_t pi = 0; pi < sizeof pads / sizeof pads[0]; pi++)
    for (int flip = 0; flip < 2; flip++)
      for (uint64_t seed = 0; seed < 3; seed++)
        for (uint64_t epoch = 0; epoch < 3; epoch++)
          for (int64_t i = 0; i < 500; i++) {
            const bp_data_augment a = {pads[pi], flip};
            const int64_t index = i * 977 + (int64_t)seed;
            bp_data_augment_draw got, want = ref_augment(seed, epoch, index, &a);
            bp_data_augment_params(seed, epoch, index, &a, &got);
            if (memcmp(&got, &want, sizeof got) != 0)
              ck_abort_msg("pad %d flip %d seed %llu epoch %llu index %lld: (%d,%d,%d), want "
                           "(%d,%d,%d)",
                           pads[pi], flip, (unsigned long long)seed, (unsigned long long)epoch,
                           (long long)index, got.dy, got.dx, got.flip, want.dy, want.dx,
                           want.flip);
          }
}
END_TEST

START_TEST(stats_are_exact_per_channel) {
  /* channel 0 takes 0 and 255 equally: mean 0.5, std 0.5; channel 1 is 51
   * everywhere: mean 0.2, std reported as 1 (constant) */
  uint8_t px[4 * 2];
  const uint8_t lab[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; i++) {
    px[2 * i] = i % 2 ? 255 : 0;
    px[2 * i + 1] = 51;
  }
  bp_dataset_info info = {4, 1, 1, 2, 1};
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_create(&info, px, lab, &d), BP_OK);
  bp_data_norm n;
  ck_assert_int_eq(bp_dataset_stats(d, &n), BP_OK);
  ck_assert_int_eq(n.channels, 2);
  ck_assert_float_eq_tol(n.mean[0], 0.5f, 1e-7);
  ck_assert_float_eq_tol(n.std[0], 0.5f, 1e-7);
  ck_assert_float_eq_tol(n.mean[1], 0.2f, 1e-7);
  ck_assert_float_eq(n.std[1], 1.0f);
  ck_assert_int_eq(bp_dataset_stats(NULL, &n), BP_ERR_INVALID);
  bp_dataset_destroy(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("data-batch");
  TCase *tc = tcase_create("batch");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, permutation_is_a_permutation);
  tcase_add_test(tc, permutation_is_fixed_by_seed_and_epoch);
  tcase_add_test(tc, permutation_is_uniform);
  tcase_add_test(tc, shards_cover_a_batch_exactly_once);
  tcase_add_test(tc, step_slices_cover_an_epoch_exactly_once);
  tcase_add_test(tc, augmentation_draws_are_deterministic_and_uniform);
  tcase_add_test(tc, fp16_is_exact_on_every_representable_value);
  tcase_add_test(tc, fp16_rounds_to_nearest_even);
  tcase_add_test(tc, fill_fp32_matches_hand_computed_values);
  tcase_add_test(tc, fill_fp16_writes_padded_channels);
  tcase_add_test(tc, fill_honours_hand_built_strides);
  tcase_add_test(tc, augmented_fill_does_not_depend_on_threads_or_position);
  tcase_add_test(tc, fill_refuses_bad_arguments_before_writing);
  tcase_add_test(tc, fill_fast_paths_match_a_per_pixel_reference);
  tcase_add_test(tc, augmentation_draws_follow_the_documented_streams);
  tcase_add_test(tc, stats_are_exact_per_channel);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
