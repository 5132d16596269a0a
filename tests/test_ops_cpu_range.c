/* The span ops of a mixed-precision step in the fast CPU module
 * (ops/cpu/range_fp16.c: range.zero, range.cast, range.unscale,
 * range.nan_check) and the skip input of its range.sgd and range.adamw
 * (ops/cpu/optim.c), against the reference module: both loaded through the
 * registry, the same inputs, every output buffer (its 16-byte tail
 * included) compared byte for byte.
 *
 * Sizes around the 8-wide F16C loop and the 65536-element chunk of the
 * threaded path, at an aligned start and one element off it; data: every
 * FP16 bit pattern, FP32 values of every magnitude with the rounding
 * midpoints of FP16, subnormals, Infs and NaNs (quiet and signalling).
 * Each run three ways: without threads, through a parallel_for that runs
 * the chunks in reverse order, and through one that runs them on four
 * real threads. CTest runs this suite once per instruction set
 * (BP_CPU_ISA: the best one, which uses F16C where the CPU has it, avx2,
 * and default, which converts with the SDK's scalar code). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"
#include "thread_modes.h"

#define FP32 BP_ABI_DTYPE_FP32
#define FP16 BP_ABI_DTYPE_FP16

static const bp_abi_kernel *kernel_of(const char *op, const char *impl) {
  ops_registry_with(BP_OPS_CPU_PATH);
  return ops_kernel_impl(op, impl);
}

/* ---- threads (the modes: thread_modes.h) ---------------------------------- */

/* run() of op/impl with the threads of `mode`; supports() asserted first. */
static int run_mode(const char *impl, const ops_call *c, int mode) {
  const bp_abi_kernel *k = kernel_of(c->op, impl);
  char reason[256];
  if (ops_kernel_supports(k, c, reason, sizeof reason) != 1)
    ck_abort_msg("%s/%s refused: %s", c->op, impl, reason);
  ops_args a;
  ops_args_make(&a, c, 1);
  a.args.threads = thread_mode_service(mode);
  return k->run(k->user, &a.args);
}

/* ---- spans ------------------------------------------------------------------------- */

/* A span [1,1,1,n] of `dtype` starting `offset` elements into its
 * allocation, with tt_new's 16-byte sentinel tail after the n elements. */
typedef struct vec {
  tt t;
  void *base;
} vec;

static vec vec_new(int32_t dtype, int64_t n, int64_t offset) {
  vec v;
  const size_t es = bp_sdk_dtype_size(dtype);
  v.t = tt_new(dtype, 1, 1, 1, n + offset, 0);
  v.base = v.t.data;
  v.t.data = (char *)v.base + (size_t)offset * es;
  v.t.d.shape[3] = v.t.d.padded_c = n;
  v.t.d.stride[2] = v.t.d.stride[1] = v.t.d.stride[0] = n;
  v.t.d.slot_bytes = (uint64_t)n * es + 16;
  return v;
}
static void vec_free(vec *v) {
  v->t.data = v->base;
  tt_free(&v->t);
}
static vec vec_clone(const vec *src, int64_t offset) {
  vec v = vec_new(src->t.d.dtype, src->t.d.shape[3], offset);
  memcpy(v.t.data, src->t.data, src->t.d.slot_bytes);
  return v;
}
static void expect_same_bytes(const vec *a, const vec *b, const char *what) {
  const unsigned char *pa = a->t.data, *pb = b->t.data;
  for (uint64_t i = 0; i < a->t.d.slot_bytes; i++)
    if (pa[i] != pb[i])
      ck_abort_msg("%s: byte %llu is %02x (cpu), %02x (reference)", what, (unsigned long long)i,
                   pa[i], pb[i]);
}

static const int64_t sizes[] = {1, 7, 8, 9, 100, 65536, 65537, 3 * 65536 + 5};
#define SIZES ((int)(sizeof sizes / sizeof sizes[0]))

/* FP32 values of every kind: random magnitudes from 2^-30 to 2^20, FP16
 * rounding midpoints and their neighbours, subnormals, zeros, Infs, NaNs. */
static float mixed_f32(uint64_t *rng, int64_t i) {
  const double u = tt_rand_unit(rng);
  switch (i % 11) {
    case 0: { /* a midpoint between two halves, or a float next to it */
      const uint16_t h = (uint16_t)(tt_rand_unit(rng) * 0x7bff);
      const double lo = bp_sdk_fp16_to_fp32(h), hi = bp_sdk_fp16_to_fp32((uint16_t)(h + 1));
      const float mid = (float)((lo + hi) / 2);
      return u < 0.33 ? mid : u < 0.66 ? nextafterf(mid, 0) : -nextafterf(mid, INFINITY);
    }
    case 1: return (float)((u - 0.5) * 0x1p-20); /* FP16 subnormals and below */
    case 2: return u < 0.5 ? 65520.0f : -65519.0f;
    case 3: return u < 0.25 ? INFINITY : u < 0.5 ? -INFINITY : u < 0.75 ? -0.0f : FLT_MIN / 4;
    case 4: return float_of(u < 0.5 ? 0x7fa00001u : 0xffc12345u); /* signalling, quiet */
    default: return (float)ldexp(u - 0.5, (int)(tt_rand_unit(rng) * 50) - 30);
  }
}

/* ---- cast, unscale --------------------------------------------------------------- */

START_TEST(cast_matches_reference) {
  for (int s = 0; s < SIZES; s++)
    for (int off = 0; off <= 1; off++)
      for (int mode = 0; mode < MODES; mode++) {
        const int64_t n = sizes[s];
        uint64_t rng = 100 + (uint64_t)s;
        vec f = vec_new(FP32, n, off), h = vec_new(FP16, n, off);
        for (int64_t i = 0; i < n; i++) {
          ((float *)f.t.data)[i] = mixed_f32(&rng, i);
          ((uint16_t *)h.t.data)[i] = (uint16_t)(i * 40503 + s); /* every pattern, shuffled */
        }
        vec hc = vec_new(FP16, n, off), hr = vec_clone(&hc, 0);
        vec fc = vec_new(FP32, n, off), fr = vec_clone(&fc, 0);
        const ops_call narrow_c = {"range.cast", {&f.t}, {&hc.t}, 1, 1, NULL, 0};
        const ops_call narrow_r = {"range.cast", {&f.t}, {&hr.t}, 1, 1, NULL, 0};
        const ops_call widen_c = {"range.cast", {&h.t}, {&fc.t}, 1, 1, NULL, 0};
        const ops_call widen_r = {"range.cast", {&h.t}, {&fr.t}, 1, 1, NULL, 0};
        ck_assert_int_eq(run_mode("cpu", &narrow_c, mode), BP_ABI_OK);
        ck_assert_int_eq(run_mode("reference", &narrow_r, NO_THREADS), BP_ABI_OK);
        ck_assert_int_eq(run_mode("cpu", &widen_c, mode), BP_ABI_OK);
        ck_assert_int_eq(run_mode("reference", &widen_r, NO_THREADS), BP_ABI_OK);
        char what[96];
        snprintf(what, sizeof what, "fp32->fp16 n %lld off %d %s", (long long)n, off, mode_names[mode]);
        expect_same_bytes(&hc, &hr, what);
        snprintf(what, sizeof what, "fp16->fp32 n %lld off %d %s", (long long)n, off, mode_names[mode]);
        expect_same_bytes(&fc, &fr, what);
        vec *all[] = {&f, &h, &hc, &hr, &fc, &fr};
        for (int i = 0; i < 6; i++) vec_free(all[i]);
      }
}
END_TEST

START_TEST(unscale_matches_reference) {
  static const float scales[] = {65536.0f, 3.0f, 0.1f, 0x1p-10f};
  for (int s = 0; s < SIZES; s++)
    for (int sc = 0; sc < 4; sc++)
      for (int mode = 0; mode < MODES; mode++) {
        const int64_t n = sizes[s], off = (s + sc) % 2;
        vec h = vec_new(FP16, n, off);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)h.t.data)[i] = (uint16_t)(i * 40503 + 7 * s);
        tt scale = tt_new(FP32, 1, 1, 1, 1, 0);
        *tt_at(&scale, 0) = scales[sc];
        vec fc = vec_new(FP32, n, off), fr = vec_clone(&fc, 1 - off);
        const ops_call cc = {"range.unscale", {&h.t, &scale}, {&fc.t}, 2, 1, NULL, 0};
        const ops_call cr = {"range.unscale", {&h.t, &scale}, {&fr.t}, 2, 1, NULL, 0};
        ck_assert_int_eq(run_mode("cpu", &cc, mode), BP_ABI_OK);
        ck_assert_int_eq(run_mode("reference", &cr, NO_THREADS), BP_ABI_OK);
        char what[96];
        snprintf(what, sizeof what, "unscale n %lld scale %g %s", (long long)n, (double)scales[sc],
                 mode_names[mode]);
        expect_same_bytes(&fc, &fr, what);
        vec_free(&h), vec_free(&fc), vec_free(&fr), tt_free(&scale);
      }
}
END_TEST

/* ---- nan_check, zero ----------------------------------------------------------------- */

START_TEST(nan_check_matches_reference) {
  /* nothing to find, then one Inf or NaN at the first, a middle (a later
   * chunk's) or the last element; the flag starts at 0 or 0.5 (kept when
   * nothing is found) */
  static const uint32_t specials32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u};
  static const uint16_t specials16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01};
  for (int s = 0; s < SIZES; s++)
    for (int dt = 0; dt < 2; dt++)
      for (int where = -1; where < 3; where++)
        for (int mode = 0; mode < MODES; mode++) {
          const int64_t n = sizes[s];
          const int32_t dtype = dt ? FP16 : FP32;
          vec x = vec_new(dtype, n, s % 2);
          uint64_t rng = 300 + (uint64_t)s;
          for (int64_t i = 0; i < n; i++) {
            if (dt) ((uint16_t *)x.t.data)[i] = (uint16_t)(tt_rand_unit(&rng) * 0x7bff) | (i % 2 ? 0x8000 : 0);
            else ((float *)x.t.data)[i] = (float)ldexp(tt_rand_unit(&rng), (int)(i % 200) - 100);
          }
          if (where >= 0) {
            const int64_t at = where == 0 ? 0 : where == 1 ? n / 2 + (n > 65536 ? 65536 / 3 : 0) : n - 1;
            const int k = (int)((s + where) % 4);
            if (dt) ((uint16_t *)x.t.data)[at] = specials16[k];
            else ((float *)x.t.data)[at] = float_of(specials32[k]);
          }
          for (int start = 0; start < 2; start++) {
            tt fc = tt_new(FP32, 1, 1, 1, 1, 0), fr = tt_new(FP32, 1, 1, 1, 1, 0);
            *tt_at(&fc, 0) = *tt_at(&fr, 0) = start ? 0.5f : 0.0f;
            const ops_call cc = {"range.nan_check", {&x.t}, {&fc}, 1, 1, NULL, 0};
            const ops_call cr = {"range.nan_check", {&x.t}, {&fr}, 1, 1, NULL, 0};
            ck_assert_int_eq(run_mode("cpu", &cc, mode), BP_ABI_OK);
            ck_assert_int_eq(run_mode("reference", &cr, NO_THREADS), BP_ABI_OK);
            ck_assert_msg(memcmp(fc.data, fr.data, fc.d.slot_bytes) == 0,
                          "nan_check %s n %lld where %d %s: %g, reference %g", dt ? "fp16" : "fp32",
                          (long long)n, where, mode_names[mode], (double)*tt_at(&fc, 0),
                          (double)*tt_at(&fr, 0));
            ck_assert_float_eq(*tt_at(&fr, 0), where >= 0 ? 1.0f : (start ? 0.5f : 0.0f));
            tt_free(&fc), tt_free(&fr);
          }
          vec_free(&x);
        }
}
END_TEST

START_TEST(zero_matches_reference) {
  static const int32_t dtypes[] = {BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16, BP_ABI_DTYPE_INT8,
                                   BP_ABI_DTYPE_INT32, BP_ABI_DTYPE_BF16};
  for (int s = 0; s < SIZES; s++)
    for (int d = 0; d < 5; d++)
      for (int mode = 0; mode < MODES; mode++) {
        const int64_t n = sizes[s];
        vec xc = vec_new(dtypes[d], n, (s + d) % 2);
        memset(xc.t.data, 0x77, (size_t)n * bp_sdk_dtype_size(dtypes[d]));
        vec xr = vec_clone(&xc, 0);
        const ops_call cc = {"range.zero", {NULL}, {&xc.t}, 0, 1, NULL, 0};
        const ops_call cr = {"range.zero", {NULL}, {&xr.t}, 0, 1, NULL, 0};
        ck_assert_int_eq(run_mode("cpu", &cc, mode), BP_ABI_OK);
        ck_assert_int_eq(run_mode("reference", &cr, NO_THREADS), BP_ABI_OK);
        char what[96];
        snprintf(what, sizeof what, "zero %s n %lld %s", bp_sdk_dtype_name(dtypes[d]), (long long)n,
                 mode_names[mode]);
        expect_same_bytes(&xc, &xr, what);
        vec_free(&xc), vec_free(&xr);
      }
}
END_TEST

/* ---- the skip input of the fast updates ------------------------------------------------ */

START_TEST(sgd_and_adamw_skip_match_reference) {
  /* has_skip with skip 0 gives the reference's bits; skip 1 writes nothing */
  const int64_t n = 1003;
  uint64_t rng = 55;
  vec g = vec_new(FP32, n, 0), w = vec_new(FP32, n, 1), m = vec_new(FP32, n, 0),
      v = vec_new(FP32, n, 0);
  for (int64_t i = 0; i < n; i++) {
    ((float *)g.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5);
    ((float *)w.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5);
    ((float *)m.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5) * 0.1f;
    ((float *)v.t.data)[i] = (float)tt_rand_unit(&rng) * 0.01f;
  }
  tt lr = tt_new(FP32, 1, 1, 1, 1, 0), step = tt_new(FP32, 1, 1, 1, 1, 0);
  tt skip = tt_new(FP32, 1, 1, 1, 1, 0);
  *tt_at(&lr, 0) = 0.01f, *tt_at(&step, 0) = 5;
  bp_optimizer_attrs a = {0.9f, 1e-2f, 1, 0.9f, 0.999f, 1e-8f, 0, 1};
  for (int adam = 0; adam < 2; adam++)
    for (int t = 0; t < 4; t++) {
      *tt_at(&skip, 0) = t % 2 ? 1.0f : 0.0f;
      vec wc = vec_clone(&w, 0), mc = vec_clone(&m, 1), vc = vec_clone(&v, 0);
      vec wr = vec_clone(&w, 1), mr = vec_clone(&m, 0), vr = vec_clone(&v, 1);
      ops_call cc = {"range.sgd", {&g.t, &lr, &skip}, {&wc.t, &mc.t}, 3, 2, &a, sizeof a};
      ops_call cr = {"range.sgd", {&g.t, &lr, &skip}, {&wr.t, &mr.t}, 3, 2, &a, sizeof a};
      if (adam) {
        const ops_call ac = {"range.adamw", {&g.t, &lr, &step, &skip}, {&wc.t, &mc.t, &vc.t}, 4,
                             3, &a, sizeof a};
        const ops_call ar = {"range.adamw", {&g.t, &lr, &step, &skip}, {&wr.t, &mr.t, &vr.t}, 4,
                             3, &a, sizeof a};
        cc = ac, cr = ar;
      }
      ck_assert_int_eq(run_mode("cpu", &cc, NO_THREADS), BP_ABI_OK);
      ck_assert_int_eq(run_mode("reference", &cr, NO_THREADS), BP_ABI_OK);
      expect_same_bytes(&wc, &wr, "w"), expect_same_bytes(&mc, &mr, "m");
      expect_same_bytes(&vc, &vr, "v");
      if (t % 2) expect_same_bytes(&wc, &w, "w (skipped)"), expect_same_bytes(&mc, &m, "m (skipped)");
      else ck_assert(memcmp(wc.t.data, w.t.data, (size_t)n * sizeof(float)) != 0);
      vec *all[] = {&wc, &mc, &vc, &wr, &mr, &vr};
      for (int i = 0; i < 6; i++) vec_free(all[i]);
    }
  vec_free(&g), vec_free(&w), vec_free(&m), vec_free(&v);
  tt_free(&lr), tt_free(&step), tt_free(&skip);
}
END_TEST

/* Spans long enough to be cut into tasks (ops/cpu/optim.c: tasks of
 * 2 * 65536 elements), one element past a task boundary and with a long
 * last task: the same bytes as the reference whatever order or threads
 * run the tasks. */
START_TEST(sgd_and_adamw_tasks_match_reference_on_threads) {
  static const int64_t lens[] = {(1 << 17) + 1, 2 * (1 << 17) + 100003};
  bp_optimizer_attrs a = {0.9f, 5e-4f, 0, 0.9f, 0.999f, 1e-8f, 0, 0};
  tt lr = tt_new(FP32, 1, 1, 1, 1, 0), step = tt_new(FP32, 1, 1, 1, 1, 0);
  *tt_at(&lr, 0) = 0.05f, *tt_at(&step, 0) = 3;
  for (int li = 0; li < 2; li++)
    for (int adam = 0; adam < 2; adam++)
      for (int mode = 0; mode < MODES; mode++) {
        const int64_t n = lens[li], off = (li + mode) % 2;
        uint64_t rng = 91 + (uint64_t)mode;
        vec g = vec_new(FP32, n, off), w = vec_new(FP32, n, off), m = vec_new(FP32, n, off),
            v = vec_new(FP32, n, off);
        for (int64_t i = 0; i < n; i++) {
          ((float *)g.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5);
          ((float *)w.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5);
          ((float *)m.t.data)[i] = (float)(tt_rand_unit(&rng) - 0.5) * 0.1f;
          ((float *)v.t.data)[i] = (float)tt_rand_unit(&rng) * 0.01f;
        }
        vec wc = vec_clone(&w, off), mc = vec_clone(&m, off), vc = vec_clone(&v, off);
        vec wr = vec_clone(&w, 0), mr = vec_clone(&m, 0), vr = vec_clone(&v, 0);
        ops_call cc = {"range.sgd", {&g.t, &lr}, {&wc.t, &mc.t}, 2, 2, &a, sizeof a};
        ops_call cr = {"range.sgd", {&g.t, &lr}, {&wr.t, &mr.t}, 2, 2, &a, sizeof a};
        if (adam) {
          const ops_call ac = {"range.adamw", {&g.t, &lr, &step}, {&wc.t, &mc.t, &vc.t}, 3, 3,
                               &a, sizeof a};
          const ops_call ar = {"range.adamw", {&g.t, &lr, &step}, {&wr.t, &mr.t, &vr.t}, 3, 3,
                               &a, sizeof a};
          cc = ac, cr = ar;
        }
        ck_assert_int_eq(run_mode("cpu", &cc, mode), BP_ABI_OK);
        ck_assert_int_eq(run_mode("reference", &cr, NO_THREADS), BP_ABI_OK);
        char what[96];
        snprintf(what, sizeof what, "%s n %lld %s", adam ? "adamw" : "sgd", (long long)n,
                 mode_names[mode]);
        expect_same_bytes(&wc, &wr, what), expect_same_bytes(&mc, &mr, what);
        expect_same_bytes(&vc, &vr, what);
        vec *all[] = {&g, &w, &m, &v, &wc, &mc, &vc, &wr, &mr, &vr};
        for (int i = 0; i < 10; i++) vec_free(all[i]);
      }
  tt_free(&lr), tt_free(&step);
}
END_TEST

/* ---- descriptors, refusals, selection ------------------------------------------------------ */

START_TEST(descriptors_reasons_and_selection) {
  static const char *const ops[] = {"range.zero", "range.cast", "range.unscale", "range.nan_check"};
  for (int i = 0; i < 4; i++) {
    const bp_abi_kernel *k = kernel_of(ops[i], "cpu"), *r = kernel_of(ops[i], "reference");
    ck_assert_int_eq(k->priority, BP_ABI_PRIORITY_PORTABLE);
    ck_assert_uint_eq(k->dtypes, r->dtypes);
    ck_assert(k->flags & BP_ABI_KERNEL_DETERMINISTIC);
    ck_assert(!(k->flags & BP_ABI_KERNEL_REFERENCE));
  }
  /* bad arguments: the reference's very reasons */
  tt h8 = tt_new(FP16, 1, 1, 1, 8, 0), f8 = tt_new(FP32, 1, 1, 1, 8, 0), f9 = tt_new(FP32, 1, 1, 1, 9, 0);
  tt i8 = tt_new(BP_ABI_DTYPE_INT32, 1, 1, 1, 8, 0), sc = tt_new(FP32, 1, 1, 1, 1, 0);
  const ops_call bad[] = {
      {"range.cast", {&f8}, {&f9}, 1, 1, NULL, 0},
      {"range.cast", {&h8}, {&f9}, 1, 1, NULL, 0},
      {"range.unscale", {&f8, &sc}, {&f8}, 2, 1, NULL, 0},
      {"range.unscale", {&h8, &sc}, {&f9}, 2, 1, NULL, 0},
      {"range.nan_check", {&i8}, {&sc}, 1, 1, NULL, 0},
      {"range.nan_check", {&f8}, {&f9}, 1, 1, NULL, 0},
      {"range.zero", {&f8}, {&f9}, 1, 1, NULL, 0},
  };
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    char rc[256], rr[256];
    ck_assert_int_eq(ops_kernel_supports(kernel_of(bad[b].op, "cpu"), &bad[b], rc, sizeof rc), 0);
    ck_assert_int_eq(ops_kernel_supports(kernel_of(bad[b].op, "reference"), &bad[b], rr, sizeof rr), 0);
    ck_assert_str_eq(rc, rr);
    ck_assert_int_eq(ops_kernel_run(kernel_of(bad[b].op, "cpu"), &bad[b], NULL, 0), BP_ABI_ERR_INVALID);
  }
  /* a bad scale at run time: refused, dst untouched */
  const ops_call un = {"range.unscale", {&h8, &sc}, {&f8}, 2, 1, NULL, 0};
  *tt_at(&sc, 0) = 0.0f;
  ck_assert_int_eq(ops_kernel_run(kernel_of("range.unscale", "cpu"), &un, NULL, 0), BP_ABI_ERR_INVALID);
  for (int i = 0; i < 8; i++) ck_assert_float_eq(*tt_at(&f8, i), 0.0f);
  /* the registry prefers the cpu kernels */
  *tt_at(&sc, 0) = 2.0f;
  ck_assert_str_eq(ops_selected_impl(&un, NULL, NULL, 0), "cpu");
  const ops_call cast = {"range.cast", {&h8}, {&f8}, 1, 1, NULL, 0};
  ck_assert_str_eq(ops_selected_impl(&cast, NULL, NULL, 0), "cpu");
  ck_assert_str_eq(ops_selected_impl(&cast, "range.*@cpu=reference", NULL, 0), "reference");
  tt_free(&h8), tt_free(&f8), tt_free(&f9), tt_free(&i8), tt_free(&sc);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_cpu_range");
  TCase *tc = tcase_create("cpu_range");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, cast_matches_reference);
  tcase_add_test(tc, unscale_matches_reference);
  tcase_add_test(tc, nan_check_matches_reference);
  tcase_add_test(tc, zero_matches_reference);
  tcase_add_test(tc, sgd_and_adamw_skip_match_reference);
  tcase_add_test(tc, sgd_and_adamw_tasks_match_reference_on_threads);
  tcase_add_test(tc, descriptors_reasons_and_selection);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
