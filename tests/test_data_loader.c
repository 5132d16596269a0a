/* The loader, with its thread and inline (every test but the refusals runs
 * in both modes): every sample of an epoch once, in the permutation's
 * order, buffers alternating A/B; ranks partition each step; a held buffer
 * is never overwritten; resume; clean shutdown in every state; buffers in
 * a real plan's arena (I_A / I_B, FP16 with padded channels). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blueprint/arena.h"
#include "blueprint/data.h"

/* N images of 2x2x1; pixel 0 of image i is i, so a row tells its sample. */
enum { N = 50, HW = 2 };
static const bp_init none = {0, 0, 0, 0};

static bp_dataset *make_dataset(void) {
  uint8_t px[N * HW * HW], lab[N];
  for (int i = 0; i < N; i++) {
    px[i * 4] = (uint8_t)i;
    px[i * 4 + 1] = (uint8_t)(255 - i);
    px[i * 4 + 2] = (uint8_t)(i * 3);
    px[i * 4 + 3] = 7;
    lab[i] = (uint8_t)(i % 10);
  }
  bp_dataset_info info = {N, HW, HW, 1, 10};
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_create(&info, px, lab, &d), BP_OK);
  return d;
}

/* Two host buffers (A, B) of `rows` FP32 images and INT32 labels. */
typedef struct buffers {
  bp_dtensor img[2], lab[2];
  void *x[2], *l[2];
  bp_data_buffer b[2];
} buffers;

static void make_buffers(buffers *bs, int64_t rows) {
  for (int k = 0; k < 2; k++) {
    bp_region r = k ? BP_REGION_I_B : BP_REGION_I_A;
    ck_assert_int_eq(bp_dtensor_make(&bs->img[k], 0, "image", (bp_shape){rows, HW, HW, 1},
                                     BP_DTYPE_FP32, r, 0, none),
                     BP_OK);
    ck_assert_int_eq(bp_dtensor_make(&bs->lab[k], 1, "label", (bp_shape){rows, 1, 1, 1},
                                     BP_DTYPE_INT32, r, 0, none),
                     BP_OK);
    ck_assert_int_eq(posix_memalign(&bs->x[k], 256, bs->img[k].slot_bytes), 0);
    ck_assert_int_eq(posix_memalign(&bs->l[k], 256, bs->lab[k].slot_bytes), 0);
    bs->b[k] = (bp_data_buffer){bs->x[k], &bs->img[k], bs->l[k], &bs->lab[k]};
  }
}

static void free_buffers(buffers *bs) {
  for (int k = 0; k < 2; k++) {
    free(bs->x[k]);
    free(bs->l[k]);
  }
}

/* Checks that the batch's buffer holds exactly its indices' samples. */
static void check_contents(const buffers *bs, const bp_data_batch *b) {
  const float *x = bs->x[b->buffer];
  const int32_t *l = bs->l[b->buffer];
  for (int64_t i = 0; i < b->count; i++) {
    ck_assert_int_eq(lrintf(x[i * 4] * 255.0f), b->indices[i]);
    ck_assert_float_eq(x[i * 4 + 3], 7.0f / 255.0f);
    ck_assert_int_eq(l[i], b->indices[i] % 10);
  }
}

/* The mode of the running test: 0 a loader thread, 1 inline (the loop
 * index of the test, set first thing in it). */
static int fill_inline;

static bp_data_loader_options options(int64_t batch, int world, int rank, int64_t epochs) {
  bp_data_loader_options o;
  memset(&o, 0, sizeof o);
  o.inline_fill = fill_inline;
  o.global_batch = batch;
  o.world = world;
  o.rank = rank;
  o.seed = 1234;
  o.shuffle = 1;
  o.epochs = epochs;
  return o;
}

START_TEST(every_sample_once_in_permutation_order_alternating_buffers) {
  fill_inline = _i;
  for (int drop = 0; drop < 2; drop++) {
    bp_dataset *d = make_dataset();
    buffers bs;
    make_buffers(&bs, 7);
    bp_data_loader_options o = options(7, 1, 0, 3);
    o.drop_last = drop;
    bp_data_loader *ld = NULL;
    ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_OK);
    const int64_t steps = drop ? 7 : 8;
    int64_t perm[N], prev_perm[N];
    int64_t k = 0;
    for (int64_t e = 0; e < 3; e++) {
      ck_assert_int_eq(bp_data_permutation(1234, (uint64_t)e, 1, N, perm), BP_OK);
      if (e > 0) ck_assert_int_ne(memcmp(perm, prev_perm, sizeof perm), 0);
      memcpy(prev_perm, perm, sizeof perm);
      int seen[N] = {0};
      int64_t pos = 0;
      for (int64_t s = 0; s < steps; s++, k++) {
        bp_data_batch b;
        ck_assert_int_eq(bp_data_loader_next(ld, &b), BP_OK);
        ck_assert_int_eq(b.done, 0);
        ck_assert_int_eq(b.buffer, k % 2); /* A, B, A, ... across epochs too */
        ck_assert_int_eq(b.epoch, e);
        ck_assert_int_eq(b.step, s);
        ck_assert_int_eq(b.steps, steps);
        ck_assert_int_eq(b.first, pos);
        ck_assert_int_eq(b.last_in_epoch, s == steps - 1);
        ck_assert_int_eq(b.count, s < 7 ? 7 : 1);
        ck_assert_int_eq(b.global_count, b.count);
        for (int64_t i = 0; i < b.count; i++) {
          ck_assert_int_eq(b.indices[i], perm[pos + i]); /* the permutation's order */
          seen[b.indices[i]]++;
        }
        check_contents(&bs, &b);
        pos += b.count;
      }
      int once = 0;
      for (int i = 0; i < N; i++) {
        ck_assert_int_le(seen[i], 1); /* never twice */
        once += seen[i];
      }
      ck_assert_int_eq(once, drop ? 49 : 50); /* all of them, less the dropped one */
      ck_assert_int_eq(pos, once);
    }
    for (int again = 0; again < 2; again++) { /* done, and stays done */
      bp_data_batch b;
      ck_assert_int_eq(bp_data_loader_next(ld, &b), BP_OK);
      ck_assert_int_eq(b.done, 1);
      ck_assert_int_eq(b.buffer, -1);
      ck_assert_int_eq(b.count, 0);
    }
    bp_data_loader_destroy(ld);
    free_buffers(&bs);
    bp_dataset_destroy(d);
  }
}
END_TEST

START_TEST(ranks_partition_every_step) {
  fill_inline = _i;
  const int worlds[] = {1, 2, 3, 4, 5, 8};
  const int64_t batches[] = {7, 16, 50};
  for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++) {
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
      const int world = worlds[wi];
      const int64_t batch = batches[bi];
      bp_dataset *d = make_dataset();
      buffers bs[8];
      bp_data_loader *ld[8];
      const int64_t cap = bp_data_rank_capacity(batch, world);
      for (int r = 0; r < world; r++) {
        make_buffers(&bs[r], cap);
        bp_data_loader_options o = options(batch, world, r, 2);
        ck_assert_int_eq(bp_data_loader_create(d, &o, bs[r].b, &ld[r]), BP_OK);
      }
      const int64_t steps = bp_data_steps_per_epoch(N, batch, 0);
      for (int64_t e = 0; e < 2; e++) {
        int64_t perm[N];
        ck_assert_int_eq(bp_data_permutation(1234, (uint64_t)e, 1, N, perm), BP_OK);
        int64_t pos = 0;
        for (int64_t s = 0; s < steps; s++) {
          for (int r = 0; r < world; r++) { /* concatenated in rank order = the step */
            bp_data_batch b;
            ck_assert_int_eq(bp_data_loader_next(ld[r], &b), BP_OK);
            ck_assert_int_eq(b.step, s);
            ck_assert_int_eq(b.first, pos);
            ck_assert_int_le(b.count, cap);
            for (int64_t i = 0; i < b.count; i++) ck_assert_int_eq(b.indices[i], perm[pos + i]);
            check_contents(&bs[r], &b);
            pos += b.count;
          }
        }
        ck_assert_int_eq(pos, N);
      }
      for (int r = 0; r < world; r++) {
        bp_data_batch b;
        ck_assert_int_eq(bp_data_loader_next(ld[r], &b), BP_OK);
        ck_assert_int_eq(b.done, 1);
        bp_data_loader_destroy(ld[r]);
        free_buffers(&bs[r]);
      }
      bp_dataset_destroy(d);
    }
  }
}
END_TEST

static void sleep_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

START_TEST(a_held_buffer_is_never_overwritten) {
  fill_inline = _i;
  bp_dataset *d = make_dataset();
  buffers bs;
  make_buffers(&bs, 4);
  bp_data_loader_options o = options(4, 1, 0, 0); /* no end */
  o.augment = (bp_data_augment){1, 1};
  bp_data_loader *ld = NULL;
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_OK);
  for (int k = 0; k < 40; k++) {
    bp_data_batch b;
    ck_assert_int_eq(bp_data_loader_next(ld, &b), BP_OK);
    ck_assert_int_eq(b.buffer, k % 2);
    float snapshot[4 * 4];
    memcpy(snapshot, bs.x[b.buffer], sizeof snapshot);
    int64_t idx[4];
    memcpy(idx, b.indices, (size_t)b.count * sizeof idx[0]);
    if (k % 4 == 0) sleep_ms(5); /* the thread fills the other buffer, then waits */
    ck_assert_mem_eq(bs.x[b.buffer], snapshot, sizeof snapshot);
    ck_assert_mem_eq(b.indices, idx, (size_t)b.count * sizeof idx[0]);
    if (k % 3 == 0) bp_data_loader_release(ld); /* early hand-back is fine too */
  }
  bp_data_loader_destroy(ld); /* the thread is waiting for a buffer: woken, joined */
  free_buffers(&bs);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(resume_at_epoch_and_step_gives_the_same_batches) {
  fill_inline = _i;
  bp_dataset *d = make_dataset();
  buffers full, resumed;
  make_buffers(&full, 6);
  make_buffers(&resumed, 6);
  bp_data_norm norm = {1, {0.3f}, {0.4f}};
  bp_data_loader_options o = options(6, 1, 0, 3);
  o.augment = (bp_data_augment){2, 1};
  o.norm = &norm;
  bp_data_loader *a = NULL, *b = NULL;
  ck_assert_int_eq(bp_data_loader_create(d, &o, full.b, &a), BP_OK);
  norm.mean[0] = 99; /* the loader copied the norm at create */
  o.first_epoch = 1;
  o.first_step = 5;
  o.epochs = 2;
  norm.mean[0] = 0.3f;
  ck_assert_int_eq(bp_data_loader_create(d, &o, resumed.b, &b), BP_OK);
  bp_data_batch ba, bb;
  for (int k = 0; k < 9 + 5; k++) ck_assert_int_eq(bp_data_loader_next(a, &ba), BP_OK);
  for (int k = 0;; k++) {
    ck_assert_int_eq(bp_data_loader_next(a, &ba), BP_OK);
    ck_assert_int_eq(bp_data_loader_next(b, &bb), BP_OK);
    ck_assert_int_eq(ba.done, bb.done);
    if (ba.done) break;
    if (k == 0) {
      ck_assert_int_eq(bb.epoch, 1);
      ck_assert_int_eq(bb.step, 5);
    }
    ck_assert_int_eq(ba.epoch, bb.epoch);
    ck_assert_int_eq(ba.step, bb.step);
    ck_assert_int_eq(ba.count, bb.count);
    ck_assert_mem_eq(ba.indices, bb.indices, (size_t)ba.count * sizeof ba.indices[0]);
    ck_assert_mem_eq(full.x[ba.buffer], resumed.x[bb.buffer], (size_t)ba.count * 16);
    ck_assert_mem_eq(full.l[ba.buffer], resumed.l[bb.buffer], (size_t)ba.count * 4);
  }
  bp_data_loader_destroy(a);
  bp_data_loader_destroy(b);
  free_buffers(&full);
  free_buffers(&resumed);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(destroy_is_clean_in_every_state) {
  fill_inline = _i;
  bp_dataset *d = make_dataset();
  buffers bs;
  make_buffers(&bs, 5);
  for (int consumed = 0; consumed < 4; consumed++) {
    bp_data_loader_options o = options(5, 1, 0, consumed == 3 ? 1 : 0);
    bp_data_loader *ld = NULL;
    ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_OK);
    for (int k = 0; k < consumed; k++) {
      bp_data_batch b;
      ck_assert_int_eq(bp_data_loader_next(ld, &b), BP_OK);
    }
    if (consumed == 2) sleep_ms(2);
    bp_data_loader_destroy(ld);
  }
  bp_data_loader_destroy(NULL);
  bp_data_loader_release(NULL);
  free_buffers(&bs);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(create_refuses_bad_options) {
  bp_dataset *d = make_dataset();
  buffers bs;
  make_buffers(&bs, 4);
  bp_data_loader *ld = (bp_data_loader *)0x1;
  bp_data_loader_options o = options(8, 1, 0, 1); /* needs 8 rows, buffers hold 4 */
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "loader buffer A"));
  o = options(8, 2, 0, 1); /* 2 ranks: 4 rows each, fine */
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_OK);
  bp_data_loader_destroy(ld);
  ld = (bp_data_loader *)0x1;
  o = options(9, 2, 0, 1); /* ceil(9/2) = 5 rows */
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_SHAPE);
  o = options(4, 0, 0, 1);
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o = options(4, 2, 2, 1);
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o = options(0, 1, 0, 1);
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o = options(4, 1, 0, 1);
  o.first_step = 13; /* 13 steps per epoch: 0..12 */
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o.first_step = 0;
  o.augment.crop_pad = -2;
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o.augment.crop_pad = 0;
  bp_data_norm norm = {1, {0}, {0}};
  o.norm = &norm;
  ck_assert_int_eq(bp_data_loader_create(d, &o, bs.b, &ld), BP_ERR_INVALID);
  o.norm = NULL;
  bp_data_buffer same[2] = {bs.b[0], bs.b[0]};
  ck_assert_int_eq(bp_data_loader_create(d, &o, same, &ld), BP_ERR_INVALID);
  ck_assert_ptr_eq(ld, (bp_data_loader *)0x1); /* untouched on every failure */
  bp_dataset *tiny = NULL;
  ck_assert_int_eq(bp_dataset_subset(d, 0, 3, &tiny), BP_OK);
  o.drop_last = 1; /* 3 samples, batch 4: an empty epoch */
  ck_assert_int_eq(bp_data_loader_create(tiny, &o, bs.b, &ld), BP_ERR_INVALID);
  ck_assert_int_eq(bp_data_loader_next(NULL, NULL), BP_ERR_INVALID);
  bp_dataset_destroy(tiny);
  free_buffers(&bs);
  bp_dataset_destroy(d);
}
END_TEST

START_TEST(fills_the_arena_double_buffers_of_a_plan) {
  fill_inline = _i;
  /* a plan with FP16 images (padded 1 -> 4 channels in I_A / I_B) and INT32
   * labels; 3 ranks of global batch 8: per-rank capacity 3 */
  bp_dataset *d = make_dataset();
  const int world = 3;
  const int64_t batch = 8, cap = bp_data_rank_capacity(batch, world);
  bp_plan_options po = {0, 0, BP_OPT_SGD};
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_plan_create(&po, &p), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "train", cap, HW, HW), BP_OK);
  int32_t img[2], lab[2];
  ck_assert_int_eq(bp_plan_alloc_input(p, "image", (bp_shape){cap, HW, HW, 1}, BP_DTYPE_FP16, img),
                   BP_OK);
  ck_assert_int_eq(bp_plan_alloc_input(p, "label", (bp_shape){cap, 1, 1, 1}, BP_DTYPE_INT32, lab),
                   BP_OK);
  ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  ck_assert_int_eq(bp_plan_finalize(p), BP_OK);
  const bp_dtensor *ti[2] = {bp_plan_tensor(p, 0, img[0]), bp_plan_tensor(p, 0, img[1])};
  const bp_dtensor *tl[2] = {bp_plan_tensor(p, 0, lab[0]), bp_plan_tensor(p, 0, lab[1])};
  ck_assert_int_eq(ti[0]->region, BP_REGION_I_A);
  ck_assert_int_eq(ti[1]->region, BP_REGION_I_B);
  ck_assert_int_eq(ti[0]->padded_c, 4);
  bp_arena *arenas[3];
  bp_data_loader *ld[3];
  for (int r = 0; r < world; r++) {
    ck_assert_int_eq(bp_arena_create(p, bp_host_allocator(), r, &arenas[r]), BP_OK);
    bp_data_buffer bufs[2];
    for (int k = 0; k < 2; k++)
      bufs[k] = (bp_data_buffer){bp_arena_ptr(arenas[r], ti[k]), ti[k],
                                 bp_arena_ptr(arenas[r], tl[k]), tl[k]};
    bp_data_loader_options o = options(batch, world, r, 1);
    ck_assert_int_eq(bp_data_loader_create(d, &o, bufs, &ld[r]), BP_OK);
  }
  int64_t perm[N];
  ck_assert_int_eq(bp_data_permutation(1234, 0, 1, N, perm), BP_OK);
  int64_t pos = 0;
  for (int64_t s = 0; s < 7; s++) {
    for (int r = 0; r < world; r++) {
      bp_data_batch b;
      ck_assert_int_eq(bp_data_loader_next(ld[r], &b), BP_OK);
      const uint16_t *x = bp_arena_ptr(arenas[r], ti[b.buffer]);
      const int32_t *l = bp_arena_ptr(arenas[r], tl[b.buffer]);
      for (int64_t i = 0; i < cap; i++) {
        for (int c = 0; c < 4; c++) {
          uint16_t h = x[i * ti[0]->dev_stride[0] + c]; /* pixel (0, 0), channel c */
          if (i < b.count && c == 0)
            ck_assert_uint_eq(h, bp_fp16_from_fp32((float)perm[pos + i] / 255.0f));
          else
            ck_assert_uint_eq(h, 0); /* padded channel or unused row */
        }
        ck_assert_int_eq(l[i], i < b.count ? perm[pos + i] % 10 : 0);
      }
      pos += b.count;
    }
  }
  ck_assert_int_eq(pos, N);
  for (int r = 0; r < world; r++) {
    bp_data_loader_destroy(ld[r]);
    bp_arena_destroy(arenas[r]);
  }
  bp_plan_destroy(p);
  bp_dataset_destroy(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("data-loader");
  TCase *tc = tcase_create("loader");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, every_sample_once_in_permutation_order_alternating_buffers, 0, 2);
  tcase_add_loop_test(tc, ranks_partition_every_step, 0, 2);
  tcase_add_loop_test(tc, a_held_buffer_is_never_overwritten, 0, 2);
  tcase_add_loop_test(tc, resume_at_epoch_and_step_gives_the_same_batches, 0, 2);
  tcase_add_loop_test(tc, destroy_is_clean_in_every_state, 0, 2);
  tcase_add_test(tc, create_refuses_bad_options);
  tcase_add_loop_test(tc, fills_the_arena_double_buffers_of_a_plan, 0, 2);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
