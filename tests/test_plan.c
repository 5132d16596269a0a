/* MemoryPlan: layout by hand-computed offsets, variants, families, buckets,
 * arenas, and every refused misuse. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/arena.h"

static const bp_init kaiming = {BP_INIT_KAIMING_NORMAL, 0, 0, 1};

/* A small net: fc [10,1,1,784] + bias, one BN over 10, one feature. */
static void alloc_small(bp_plan *p, int64_t batch, bp_param_ids *w, bp_param_ids *b, int32_t *f) {
  ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_WEIGHT, "fc.w", (bp_shape){10, 1, 1, 784},
                                       kaiming, w),
                   BP_OK);
  ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_BIAS, "fc.b", (bp_shape){1, 1, 1, 10},
                                       (bp_init){BP_INIT_ZEROS, 0, 0, 0}, b),
                   BP_OK);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "fc.out", (bp_shape){batch, 1, 1, 10},
                                         bp_plan_get_options(p)->amp ? BP_DTYPE_FP16
                                                                     : BP_DTYPE_FP32,
                                         f),
                   BP_OK);
}

static bp_plan *small_plan(bp_plan_options o, const int64_t *batches, int n) {
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  for (int v = 0; v < n; v++) {
    char name[16];
    snprintf(name, sizeof name, "v%d", v);
    ck_assert_int_eq(bp_plan_begin_variant(p, name, batches[v], 1, 1), BP_OK);
    bp_param_ids w, b;
    int32_t f;
    alloc_small(p, batches[v], &w, &b, &f);
    ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  }
  ck_assert_int_eq(bp_plan_finalize(p), BP_OK);
  return p;
}

START_TEST(sgd_layout_by_hand) {
  const int64_t batches[] = {100, 7};
  bp_plan *p = small_plan((bp_plan_options){0, 0, BP_OPT_SGD}, batches, 2);
  /* fc.w fp32 7840 elems: fp16 15680+16 -> 15872, fp32 31744
   * fc.b fp32 10 elems: 20+16 -> 256, fp32 512
   * fc.out [100,1,1,10] fp32: 2000+16 -> 2048, fp32 4096 (batch 7 is smaller)
   * Layout: W_FC_BIAS fc.b @0 (512), W_FC_WEIGHT fc.w @512 (31744),
   * G_FC_BIAS fc.b.grad @32256, G_FC_WEIGHT @32768, M_FC_BIAS @64512,
   * M_FC_WEIGHT @65024, F32 fc.out @96768 (4096) -> total 100864 */
  int32_t ids[] = {bp_plan_find_tensor(p, "fc.b"), bp_plan_find_tensor(p, "fc.w"),
                   bp_plan_find_tensor(p, "fc.b.grad"), bp_plan_find_tensor(p, "fc.w.grad"),
                   bp_plan_find_tensor(p, "fc.b.m"), bp_plan_find_tensor(p, "fc.w.m"),
                   bp_plan_find_tensor(p, "fc.out")};
  const uint64_t offsets[] = {0, 512, 32256, 32768, 64512, 65024, 96768};
  const uint64_t slots[] = {512, 31744, 512, 31744, 512, 31744, 4096};
  for (int i = 0; i < 7; i++) {
    ck_assert_int_ge(ids[i], 0);
    for (int v = 0; v < 2; v++) {
      const bp_dtensor *t = bp_plan_tensor(p, v, ids[i]);
      ck_assert_uint_eq(t->offset, offsets[i]);
      ck_assert_uint_eq(t->slot_bytes, slots[i]);
    }
  }
  ck_assert_uint_eq(bp_plan_total_bytes(p), 100864u);
  /* the small variant keeps its own shape and strides, and the big slot */
  const bp_dtensor *small = bp_plan_tensor(p, 1, ids[6]);
  ck_assert_int_eq(small->shape.n, 7);
  ck_assert_int_eq(small->dev_stride[0], 10);
  ck_assert_int_eq(bp_plan_find_tensor(p, "fc.w.ema"), -1); /* EMA off */
  ck_assert_int_eq(bp_plan_find_tensor(p, "fc.w.v"), -1);   /* no second moment for SGD */
  ck_assert_int_eq(bp_plan_region_tensor_count(p, BP_REGION_W_FC_WEIGHT), 1);
  bp_span s;
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_W_BN_BIAS, BP_REGION_W_CONV_DEEP, &s), BP_OK);
  ck_assert_uint_eq(s.offset, 0);
  ck_assert_uint_eq(s.bytes, 32256);
  ck_assert_int_eq(bp_plan_check(p), BP_OK);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(amp_ema_adamw_families_mirror_w) {
  const int64_t batches[] = {32};
  bp_plan *p = small_plan((bp_plan_options){1, 1, BP_OPT_ADAMW}, batches, 1);
  bp_span w, a, e, g, g16, m, v;
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_W_BN_BIAS, BP_REGION_W_CONV_DEEP, &w), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_A_BN_BIAS, BP_REGION_A_CONV_DEEP, &a), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_E_BN_BIAS, BP_REGION_E_CONV_DEEP, &e), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_G_BN_BIAS, BP_REGION_G_CONV_DEEP, &g), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_G16_BN_BIAS, BP_REGION_G16_CONV_DEEP, &g16),
                   BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_M_BN_BIAS, BP_REGION_M_CONV_DEEP, &m), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_V_BN_BIAS, BP_REGION_V_CONV_DEEP, &v), BP_OK);
  ck_assert_uint_eq(w.bytes, 2 * a.bytes); /* one cast kernel over the whole span */
  ck_assert_uint_eq(e.bytes, w.bytes);
  ck_assert_uint_eq(g.bytes, w.bytes);
  ck_assert_uint_eq(g16.bytes, a.bytes);
  ck_assert_uint_eq(m.bytes, w.bytes);
  ck_assert_uint_eq(v.bytes, w.bytes);
  /* tensor by tensor: A at half the relative offset of W */
  const bp_dtensor *fw = bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "fc.w"));
  const bp_dtensor *fa = bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "fc.w.fp16"));
  ck_assert_uint_eq(2 * (fa->offset - a.offset), fw->offset - w.offset);
  ck_assert_uint_eq(2 * fa->slot_bytes, fw->slot_bytes);
  ck_assert_int_eq(fa->dtype, BP_DTYPE_FP16);
  /* AMP features live in F16, padded to 8 channels */
  const bp_dtensor *f = bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "fc.out"));
  ck_assert_int_eq(f->region, BP_REGION_F16);
  ck_assert_int_eq(f->padded_c, 16);
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_N).bytes, 0); /* no LARS */
  /* buckets under AMP reduce the FP16 gradients; the deep bucket ends with R */
  bp_span deep, rest;
  ck_assert_int_eq(bp_plan_bucket_span(p, BP_BUCKET_DEEP, &deep), BP_OK);
  ck_assert_int_eq(bp_plan_bucket_span(p, BP_BUCKET_REST, &rest), BP_OK);
  ck_assert_uint_eq(deep.offset, bp_plan_region_span(p, BP_REGION_G16_CONV_DEEP).offset);
  ck_assert_uint_eq(rest.offset, g16.offset);
  ck_assert_int_eq(bp_plan_check(p), BP_OK);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(lars_allocates_norms) {
  const int64_t batches[] = {8};
  bp_plan *p = small_plan((bp_plan_options){0, 0, BP_OPT_LARS}, batches, 1);
  ck_assert_int_eq(bp_plan_region_tensor_count(p, BP_REGION_N), 2);
  ck_assert_int_ge(bp_plan_find_tensor(p, "fc.w.norm"), 0);
  /* without AMP the deep bucket starts at the FP32 deep-conv grads */
  bp_span deep;
  ck_assert_int_eq(bp_plan_bucket_span(p, BP_BUCKET_DEEP, &deep), BP_OK);
  ck_assert_uint_eq(deep.offset, bp_plan_region_span(p, BP_REGION_G_CONV_DEEP).offset);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(every_region_count_comes_from_the_table) {
  int w = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    const bp_region_info *ri = bp_region_get((bp_region)r);
    ck_assert_ptr_nonnull(ri);
    ck_assert_int_eq(bp_region_from_name(ri->name), r);
    if (ri->series == 'W') w++;
  }
  ck_assert_int_eq(w, BP_PARAM_KIND_COUNT);
  ck_assert_ptr_null(bp_region_get(BP_REGION_COUNT));
  ck_assert_int_eq(bp_region_of_param(BP_FAMILY_G, BP_PARAM_CONV_DEEP), BP_REGION_G_CONV_DEEP);
}
END_TEST

START_TEST(misuse_is_refused) {
  bp_plan *p = NULL;
  bp_plan_options o = {0, 0, BP_OPT_SGD};
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  int32_t id;
  ck_assert_int_eq(bp_plan_alloc_temp(p, "t", (bp_shape){1, 1, 1, 1}, BP_DTYPE_FP32, &id),
                   BP_ERR_STATE); /* outside a variant */
  ck_assert_int_eq(bp_plan_finalize(p), BP_ERR_STATE); /* no variant */
  ck_assert_int_eq(bp_plan_begin_variant(p, "train", 0, 1, 1), BP_ERR_INVALID);
  ck_assert_int_eq(bp_plan_begin_variant(p, "train", 4, 1, 1), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "again", 4, 1, 1), BP_ERR_STATE);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "f", (bp_shape){4, 1, 1, 3}, BP_DTYPE_FP16, &id),
                   BP_ERR_STATE); /* F16 is disabled without AMP */
  ck_assert_int_eq(bp_plan_alloc_feature(p, "f", (bp_shape){4, 1, 1, 3}, BP_DTYPE_INT8, &id),
                   BP_ERR_INVALID);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "f", (bp_shape){4, 1, 1, 3}, BP_DTYPE_FP32, &id),
                   BP_OK);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "f", (bp_shape){4, 1, 1, 3}, BP_DTYPE_FP32, &id),
                   BP_ERR_INVALID); /* duplicate name */
  char longname[BP_NAME_MAX + 8];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  ck_assert_int_eq(bp_plan_alloc_temp(p, longname, (bp_shape){1, 1, 1, 1}, BP_DTYPE_FP32, &id),
                   BP_ERR_INVALID);
  ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_WEIGHT, "w", (bp_shape){2, 1, 1, 3}, kaiming,
                                       NULL),
                   BP_OK);
  ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  /* the next variant must repeat the same calls; a parameter may not change */
  ck_assert_int_eq(bp_plan_begin_variant(p, "train", 2, 1, 1), BP_ERR_INVALID); /* same name */
  ck_assert_int_eq(bp_plan_begin_variant(p, "eval", 2, 1, 1), BP_OK);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "g", (bp_shape){2, 1, 1, 3}, BP_DTYPE_FP32, &id),
                   BP_ERR_SHAPE);
  ck_assert_int_eq(bp_plan_alloc_feature(p, "f", (bp_shape){2, 1, 1, 3}, BP_DTYPE_FP32, &id),
                   BP_OK);
  ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_WEIGHT, "w", (bp_shape){2, 1, 1, 4}, kaiming,
                                       NULL),
                   BP_ERR_SHAPE);
  ck_assert(strstr(bp_last_error(), "cannot change across variants") != NULL);
  bp_plan_destroy(p);

  /* a variant that allocates fewer tensors */
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "a", 1, 1, 1), BP_OK);
  ck_assert_int_eq(bp_plan_alloc_temp(p, "t", (bp_shape){1, 1, 1, 1}, BP_DTYPE_FP32, &id), BP_OK);
  ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "b", 1, 1, 1), BP_OK);
  ck_assert_int_eq(bp_plan_end_variant(p), BP_ERR_SHAPE);
  bp_plan_destroy(p);
  bp_plan_destroy(NULL);
}
END_TEST

START_TEST(overflowing_plan_is_refused) {
  bp_plan *p = NULL;
  bp_plan_options o = {0, 0, BP_OPT_SGD};
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  ck_assert_int_eq(bp_plan_begin_variant(p, "huge", 1, 1, 1), BP_OK);
  int32_t id;
  /* each slot fits in 64 bits, their sum does not */
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof name, "t%d", i);
    ck_assert_int_eq(bp_plan_alloc_temp(p, name, (bp_shape){1LL << 30, 1LL << 30, 2, 1},
                                        BP_DTYPE_FP32, &id),
                     BP_OK);
  }
  ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  ck_assert_int_eq(bp_plan_finalize(p), BP_ERR_OVERFLOW);
  ck_assert(strstr(bp_last_error(), "overflows") != NULL);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(arena_pointers_are_base_plus_offset) {
  const int64_t batches[] = {16, 5};
  bp_plan *p = small_plan((bp_plan_options){0, 1, BP_OPT_SGD}, batches, 2);
  bp_arena *a0 = NULL, *a1 = NULL;
  ck_assert_int_eq(bp_arena_create(p, bp_host_allocator(), 0, &a0), BP_OK);
  ck_assert_int_eq(bp_arena_create(p, bp_host_allocator(), 1, &a1), BP_OK);
  ck_assert_uint_eq(bp_arena_bytes(a0), bp_plan_total_bytes(p));
  ck_assert_uint_eq((uintptr_t)bp_arena_base(a0) % 256, 0);
  ck_assert_int_eq(bp_arena_rank(a1), 1);
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *t = bp_plan_tensor(p, 1, id);
    ck_assert_ptr_eq(bp_arena_ptr(a0, t), (char *)bp_arena_base(a0) + t->offset);
    ck_assert_ptr_eq(bp_arena_ptr(a1, t), (char *)bp_arena_base(a1) + t->offset);
    /* the whole slot is writable, tail included */
    memset(bp_arena_ptr(a0, t), 0xab, t->slot_bytes);
  }
  bp_arena_destroy(a0);
  bp_arena_destroy(a1);
  bp_arena_destroy(NULL);
  bp_plan_destroy(p);
}
END_TEST

static void *failing_alloc(void *user, size_t bytes, size_t alignment) {
  (void)user;
  (void)bytes;
  (void)alignment;
  return NULL;
}
static void never_free(void *user, void *ptr, size_t bytes) {
  (void)user;
  (void)ptr;
  (void)bytes;
}

START_TEST(arena_allocator_failure_is_a_status) {
  const int64_t batches[] = {4};
  bp_plan *p = small_plan((bp_plan_options){0, 0, BP_OPT_SGD}, batches, 1);
  const bp_arena_allocator failing = {"failing", failing_alloc, never_free, NULL};
  bp_arena *a = (bp_arena *)0x1;
  ck_assert_int_eq(bp_arena_create(p, &failing, 3, &a), BP_ERR_NOMEM);
  ck_assert_ptr_eq(a, (bp_arena *)0x1); /* output untouched */
  ck_assert(strstr(bp_last_error(), "rank 3") != NULL);
  bp_plan_destroy(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, sgd_layout_by_hand);
  tcase_add_test(tc, amp_ema_adamw_families_mirror_w);
  tcase_add_test(tc, lars_allocates_norms);
  tcase_add_test(tc, every_region_count_comes_from_the_table);
  tcase_add_test(tc, misuse_is_refused);
  tcase_add_test(tc, overflowing_plan_is_refused);
  tcase_add_test(tc, arena_pointers_are_base_plus_offset);
  tcase_add_test(tc, arena_allocator_failure_is_a_status);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
