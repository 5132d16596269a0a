/* The fast CPU module's memory-bound kernels on the rank's threads
 * (ops/cpu: relu.fwd/.bwd, maxpool.fwd/.bwd, batchnorm.fwd_train,
 * .fwd_eval and .bwd, range.sgd and range.adamw): each call run by the
 * reference module once, then by the cpu module without threads, on host
 * pools (bp_threads) of 1, 2, 3 and 4 threads, and through a parallel_for
 * that runs the tasks in reverse order; every output slot (padding and
 * 16-byte tail included) byte-identical to the reference's every time.
 * The shapes are odd and large enough to be cut into several tasks, which
 * the reverse-order run asserts (so the threaded path is the one tested).
 * CTest runs this suite once per instruction set (BP_CPU_ISA). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/threads.h"
#include "bp_abi_sdk.h"
#include "ops_ref_util.h"

#define FP32 BP_ABI_DTYPE_FP32
#define INT8 BP_ABI_DTYPE_INT8

static const bp_abi_kernel *kernel_of(const char *op, const char *impl) {
  ops_registry_with(BP_OPS_CPU_PATH);
  return ops_kernel_impl(op, impl);
}

/* ---- threads ---------------------------------------------------------------- */

/* Modes: 0 no threads; 1..4 a pool of that many; REVERSE the tasks in
 * reverse order on the calling thread (count 4). */
enum { NO_THREADS = 0, REVERSE = 5, MODES = 6 };

static int64_t reverse_tasks; /* the task count of the last REVERSE run */

static void reverse_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  reverse_tasks = n > reverse_tasks ? n : reverse_tasks;
  for (int64_t i = n - 1; i >= 0; i--) fn(arg, i);
}

static bp_threads *pool_of(int count) {
  static bp_threads *pools[5];
  if (!pools[count]) ck_assert_int_eq(bp_threads_create(count, &pools[count]), BP_OK);
  return pools[count];
}

static int run_mode(const char *impl, const ops_call *c, int mode) {
  const bp_abi_kernel *k = kernel_of(c->op, impl);
  char reason[256];
  if (ops_kernel_supports(k, c, reason, sizeof reason) != 1)
    ck_abort_msg("%s/%s refused: %s", c->op, impl, reason);
  ops_args a;
  ops_args_make(&a, c, 1);
  const bp_abi_threads rev = {sizeof rev, 4, NULL, reverse_for};
  if (mode == REVERSE) a.args.threads = &rev;
  else if (mode != NO_THREADS) a.args.threads = bp_threads_abi(pool_of(mode));
  return k->run(k->user, &a.args);
}

/* The call's distinct tensors (an in-place output is also an input). */
static int distinct_tensors(const ops_call *c, tt **all) {
  int n = 0;
  for (int i = 0; i < c->nin + c->nout; i++) {
    tt *t = i < c->nin ? c->in[i] : c->out[i - c->nin];
    int seen = 0;
    for (int k = 0; k < n; k++) seen |= all[k] == t;
    if (!seen) all[n++] = t;
  }
  return n;
}

/* Runs c with the reference, then with the cpu module in every mode, each
 * run from the same initial bytes of every tensor; every output's slot
 * byte-identical to the reference's. With `several`, the cpu run cut the
 * call into more than one task. */
static void expect_same_in_every_mode(const ops_call *c, const char *what, int several) {
  tt *all[12];
  const int n = distinct_tensors(c, all);
  void *init[12], *want[6];
  for (int i = 0; i < n; i++) {
    init[i] = malloc(all[i]->d.slot_bytes);
    memcpy(init[i], all[i]->data, all[i]->d.slot_bytes);
  }
  ck_assert_int_eq(run_mode("reference", c, NO_THREADS), BP_ABI_OK);
  for (int o = 0; o < c->nout; o++) {
    want[o] = malloc(c->out[o]->d.slot_bytes);
    memcpy(want[o], c->out[o]->data, c->out[o]->d.slot_bytes);
  }
  static const char *const names[] = {"no threads", "1 thread",  "2 threads",
                                      "3 threads",  "4 threads", "reverse order"};
  for (int mode = 0; mode < MODES; mode++) {
    for (int i = 0; i < n; i++) memcpy(all[i]->data, init[i], all[i]->d.slot_bytes);
    reverse_tasks = 0;
    ck_assert_int_eq(run_mode("cpu", c, mode), BP_ABI_OK);
    if (mode == REVERSE && several && reverse_tasks < 2)
      ck_abort_msg("%s: one task only; the shape does not test the threaded path", what);
    for (int o = 0; o < c->nout; o++) {
      const unsigned char *got = c->out[o]->data, *exp = want[o];
      for (uint64_t b = 0; b < c->out[o]->d.slot_bytes; b++)
        if (got[b] != exp[b])
          ck_abort_msg("%s, output %d, %s: byte %llu is %02x, the reference's %02x", what, o,
                       names[mode], (unsigned long long)b, got[b], exp[b]);
    }
  }
  for (int i = 0; i < n; i++) {
    memcpy(all[i]->data, init[i], all[i]->d.slot_bytes);
    free(init[i]);
  }
  for (int o = 0; o < c->nout; o++) free(want[o]);
}

/* Values of every sign with -0.0, +0.0, ties and a few quiet NaNs. */
static void fill(tt *t, uint64_t *rng, int nans) {
  static const float few[] = {-1.0f, 0.0f, -0.0f, 1.0f, 2.0f};
  const int64_t n = tt_count(t);
  for (int64_t i = 0; i < n; i++) {
    const double u = tt_rand_unit(rng);
    float v = (float)(tt_rand_unit(rng) * 4.0 - 2.0);
    if (u < 0.1) v = few[(int)(u * 50.0)];
    else if (nans && u < 0.11) v = float_of(0x7fc00000u | (uint32_t)(u * 1e6));
    *tt_at(t, i) = v;
  }
}

/* ---- relu ---------------------------------------------------------------------------- */

START_TEST(relu_gives_the_same_bits_on_any_thread_count) {
  uint64_t rng = 11;
  const int64_t N = 3, H = 37, W = 29, C = 61; /* 196,359 elements: 3 tasks and a rest */
  tt x = tt_new(FP32, N, H, W, C, 0), y = tt_new(FP32, N, H, W, C, 0);
  tt dy = tt_new(FP32, N, H, W, C, 0), dx = tt_new(FP32, N, H, W, C, 0);
  fill(&x, &rng, 1), fill(&y, &rng, 0), fill(&dy, &rng, 0), fill(&dx, &rng, 0);
  bp_elementwise_attrs a = {0};
  const ops_call f = {"relu.fwd", {&x}, {&y}, 1, 1, &a, sizeof a};
  expect_same_in_every_mode(&f, "relu.fwd", 1);
  const ops_call fi = {"relu.fwd", {&x}, {&x}, 1, 1, &a, sizeof a};
  expect_same_in_every_mode(&fi, "relu.fwd in place", 1);
  for (int acc = 0; acc <= 1; acc++) {
    a.accumulate = acc;
    const ops_call b = {"relu.bwd", {&x, &dy}, {&dx}, 2, 1, &a, sizeof a};
    expect_same_in_every_mode(&b, acc ? "relu.bwd accumulate" : "relu.bwd", 1);
    const ops_call bi = {"relu.bwd", {&x, &dy}, {&dy}, 2, 1, &a, sizeof a};
    expect_same_in_every_mode(&bi, acc ? "relu.bwd in place, accumulate" : "relu.bwd in place",
                              1);
  }
  tt_free(&x), tt_free(&y), tt_free(&dy), tt_free(&dx);
}
END_TEST

/* ---- maxpool ------------------------------------------------------------------------- */

typedef struct pool_case {
  int64_t n, h, w, c, extra_c;
  bp_pool_attrs a;
} pool_case;

static const pool_case pool_cases[] = {
    {7, 41, 37, 21, 0, {3, 3, 1, 1, 1, 1, 0, 0}}, /* overlapping windows: bwd order */
    {5, 33, 31, 19, 3, {2, 2, 2, 2, 0, 0, 0, 0}}, /* padded channels */
    {9, 30, 29, 13, 0, {3, 3, 2, 2, 1, 1, 0, 0}}, /* overlap with padding */
    {1, 97, 89, 11, 1, {2, 3, 1, 2, 1, 0, 0, 0}}, /* one image, many rows */
};
#define POOL_CASES ((int)(sizeof pool_cases / sizeof pool_cases[0]))

START_TEST(maxpool_gives_the_same_bits_on_any_thread_count) {
  const pool_case *pc = &pool_cases[_i];
  bp_pool_attrs a = pc->a;
  const int64_t oh = (pc->h + 2 * a.pad_h - a.kernel_h) / a.stride_h + 1;
  const int64_t ow = (pc->w + 2 * a.pad_w - a.kernel_w) / a.stride_w + 1;
  const int64_t e = pc->extra_c;
  uint64_t rng = 70u + (uint64_t)_i;
  tt x = tt_new(FP32, pc->n, pc->h, pc->w, pc->c, e), y = tt_new(FP32, pc->n, oh, ow, pc->c, e);
  tt m = tt_new(INT8, pc->n, oh, ow, pc->c, e), dy = tt_new(FP32, pc->n, oh, ow, pc->c, e);
  tt dx = tt_new(FP32, pc->n, pc->h, pc->w, pc->c, e);
  fill(&x, &rng, 1), fill(&dy, &rng, 0), fill(&dx, &rng, 0);
  char what[96];
  snprintf(what, sizeof what, "maxpool.fwd case %d", _i);
  const ops_call f = {"maxpool.fwd", {&x}, {&y, &m}, 1, 2, &a, sizeof a};
  expect_same_in_every_mode(&f, what, 1);
  ck_assert_int_eq(run_mode("reference", &f, NO_THREADS), BP_ABI_OK); /* the mask for bwd */
  for (int acc = 0; acc <= 1; acc++) {
    a.accumulate = acc;
    snprintf(what, sizeof what, "maxpool.bwd case %d, accumulate %d", _i, acc);
    const ops_call b = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &a, sizeof a};
    expect_same_in_every_mode(&b, what, pc->n > 1);
  }
  tt_free(&x), tt_free(&y), tt_free(&m), tt_free(&dy), tt_free(&dx);
}
END_TEST

/* A bad mask value in the last image: refused on every thread count, dx untouched. */
START_TEST(maxpool_bwd_refuses_a_bad_mask_on_any_thread_count) {
  bp_pool_attrs a = {2, 2, 2, 2, 0, 0, 0, 0};
  const int64_t N = 9, H = 30, W = 30, C = 24;
  uint64_t rng = 5;
  tt dy = tt_new(FP32, N, H / 2, W / 2, C, 0), m = tt_new(INT8, N, H / 2, W / 2, C, 0);
  tt dx = tt_new(FP32, N, H, W, C, 0);
  fill(&dy, &rng, 0), fill(&dx, &rng, 0);
  *tt_i8(&m, N - 1, H / 2 - 1, W / 2 - 1, C - 1) = 4;
  void *before = malloc(dx.d.slot_bytes);
  memcpy(before, dx.data, dx.d.slot_bytes);
  const ops_call b = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &a, sizeof a};
  for (int mode = 0; mode < MODES; mode++) {
    ck_assert_int_eq(run_mode("cpu", &b, mode), BP_ABI_ERR_INVALID);
    ck_assert(memcmp(dx.data, before, dx.d.slot_bytes) == 0);
  }
  free(before);
  tt_free(&dy), tt_free(&m), tt_free(&dx);
}
END_TEST

/* ---- batchnorm ----------------------------------------------------------------------- */

/* x shapes (N, H, W, C, padded channels): C around the 64-channel block,
 * one wider than the module keeps per-channel factors for (a statistics
 * and an elementwise round per block), and 32 chunks of more than 1024
 * pixels, the last one shorter (the statistics' order, batchnorm_steps.h). */
static const int64_t bn_shapes[][5] = {{6, 23, 29, 70, 2},  {7, 27, 25, 37, 0},
                                       {3, 31, 33, 130, 1}, {128, 14, 14, 17, 0},
                                       {3, 9, 11, 530, 1},  {41, 29, 31, 3, 1}};
#define BN_SHAPES ((int)(sizeof bn_shapes / sizeof bn_shapes[0]))

START_TEST(batchnorm_gives_the_same_bits_on_any_thread_count) {
  const int64_t *s = bn_shapes[_i];
  const int64_t N = s[0], H = s[1], W = s[2], C = s[3], e = s[4];
  uint64_t rng = 300u + (uint64_t)_i;
  tt x = tt_new(FP32, N, H, W, C, e), y = tt_new(FP32, N, H, W, C, e);
  tt dy = tt_new(FP32, N, H, W, C, e), dx = tt_new(FP32, N, H, W, C, e);
  tt g = tt_new(FP32, 1, 1, 1, C, 1), b = tt_new(FP32, 1, 1, 1, C, 0);
  tt rm = tt_new(FP32, 1, 1, 1, C, 0), rv = tt_new(FP32, 1, 1, 1, C, 2);
  tt sm = tt_new(FP32, 1, 1, 1, C, 1), si = tt_new(FP32, 1, 1, 1, C, 0);
  tt rmo = tt_new(FP32, 1, 1, 1, C, 0), rvo = tt_new(FP32, 1, 1, 1, C, 0);
  tt dg = tt_new(FP32, 1, 1, 1, C, 3), db = tt_new(FP32, 1, 1, 1, C, 0);
  fill(&x, &rng, 0), fill(&dy, &rng, 0), fill(&dx, &rng, 0), fill(&b, &rng, 0);
  fill(&rm, &rng, 0), fill(&dg, &rng, 0), fill(&db, &rng, 0);
  tt_rand(&g, &rng, 0.5, 2.0), tt_rand(&rv, &rng, 0.5, 2.0);
  bp_batchnorm_attrs a = {1e-5f, 0.1f, 0};
  char what[96];
  snprintf(what, sizeof what, "batchnorm.fwd_train shape %d", _i);
  const ops_call t = {"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rmo, &rvo},
                      5, 5, &a, sizeof a};
  expect_same_in_every_mode(&t, what, 1);
  snprintf(what, sizeof what, "batchnorm.fwd_train in place, shape %d", _i);
  const ops_call ti = {"batchnorm.fwd_train", {&x, &g, &b, &rm, &rv}, {&y, &sm, &si, &rm, &rv},
                       5, 5, &a, sizeof a};
  expect_same_in_every_mode(&ti, what, 1);
  snprintf(what, sizeof what, "batchnorm.fwd_eval shape %d", _i);
  const ops_call ev = {"batchnorm.fwd_eval", {&x, &g, &b, &rm, &rv}, {&y}, 5, 1, &a, sizeof a};
  expect_same_in_every_mode(&ev, what, 1);
  ck_assert_int_eq(run_mode("reference", &t, NO_THREADS), BP_ABI_OK); /* saved statistics */
  for (int acc = 0; acc <= 1; acc++) {
    a.accumulate = acc;
    snprintf(what, sizeof what, "batchnorm.bwd shape %d, accumulate %d", _i, acc);
    const ops_call bw = {"batchnorm.bwd", {&x, &dy, &g, &sm, &si}, {&dx, &dg, &db}, 5, 3, &a,
                         sizeof a};
    expect_same_in_every_mode(&bw, what, 1);
  }
  tt *all[] = {&x, &y, &dy, &dx, &g, &b, &rm, &rv, &sm, &si, &rmo, &rvo, &dg, &db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* ---- updates ------------------------------------------------------------------------- */

START_TEST(sgd_and_adamw_give_the_same_bits_on_any_thread_count) {
  const int64_t n = 2 * 2 * 65536 + 7; /* two tasks of 2^17 and a rest */
  uint64_t rng = 21;
  tt gr = tt_new(FP32, 1, 1, 1, n, 0), w = tt_new(FP32, 1, 1, 1, n, 0);
  tt m = tt_new(FP32, 1, 1, 1, n, 0), v = tt_new(FP32, 1, 1, 1, n, 0);
  tt lr = tt_new(FP32, 1, 1, 1, 1, 0), step = tt_new(FP32, 1, 1, 1, 1, 0);
  fill(&gr, &rng, 0), fill(&w, &rng, 0), fill(&m, &rng, 0);
  tt_rand(&v, &rng, 0.0, 0.01);
  *tt_at(&lr, 0) = 0.01f, *tt_at(&step, 0) = 7;
  for (int nesterov = 0; nesterov <= 1; nesterov++) {
    bp_optimizer_attrs a = {0.9f, nesterov ? 0.0f : 5e-4f, nesterov, 0.9f, 0.999f, 1e-8f, 0, 0};
    const ops_call s = {"range.sgd", {&gr, &lr}, {&w, &m}, 2, 2, &a, sizeof a};
    expect_same_in_every_mode(&s, nesterov ? "range.sgd nesterov" : "range.sgd decay", 1);
  }
  bp_optimizer_attrs a = {0.9f, 1e-2f, 0, 0.9f, 0.999f, 1e-8f, 0, 0};
  const ops_call ad = {"range.adamw", {&gr, &lr, &step}, {&w, &m, &v}, 3, 3, &a, sizeof a};
  expect_same_in_every_mode(&ad, "range.adamw", 1);
  tt *all[] = {&gr, &w, &m, &v, &lr, &step};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* Small calls stay one task: a batch-1 inference or a small model's
 * update pays no hand-off. */
START_TEST(small_calls_are_one_task) {
  uint64_t rng = 3;
  tt x = tt_new(FP32, 1, 14, 14, 64, 0), y = tt_new(FP32, 1, 14, 14, 64, 0);
  tt m = tt_new(INT8, 1, 7, 7, 64, 0), yp = tt_new(FP32, 1, 7, 7, 64, 0);
  fill(&x, &rng, 0);
  bp_elementwise_attrs ea = {0};
  bp_pool_attrs pa = {2, 2, 2, 2, 0, 0, 0, 0};
  const ops_call r = {"relu.fwd", {&x}, {&y}, 1, 1, &ea, sizeof ea};
  const ops_call p = {"maxpool.fwd", {&x}, {&yp, &m}, 1, 2, &pa, sizeof pa};
  /* an update span of a small model: 10^5 parameters */
  tt g = tt_new(FP32, 1, 1, 1, 100000, 0), w = tt_new(FP32, 1, 1, 1, 100000, 0);
  tt mo = tt_new(FP32, 1, 1, 1, 100000, 0), lr = tt_new(FP32, 1, 1, 1, 1, 0);
  bp_optimizer_attrs oa = {0.9f, 0.0f, 0, 0.9f, 0.999f, 1e-8f, 0, 0};
  const ops_call u = {"range.sgd", {&g, &lr}, {&w, &mo}, 2, 2, &oa, sizeof oa};
  /* a batch-1 batch norm: one chunk of statistics, one elementwise task */
  tt c64[6]; /* gamma, beta, running mean, running var, save_mean, save_invstd */
  for (int i = 0; i < 6; i++) c64[i] = tt_new(FP32, 1, 1, 1, 64, 0);
  tt_rand(&c64[3], &rng, 0.5, 2.0);
  bp_batchnorm_attrs ba = {1e-5f, 0.1f, 0};
  const ops_call bn = {"batchnorm.fwd_eval", {&x, &c64[0], &c64[1], &c64[2], &c64[3]}, {&y}, 5, 1,
                       &ba, sizeof ba};
  const ops_call bt = {"batchnorm.fwd_train", {&x, &c64[0], &c64[1], &c64[2], &c64[3]},
                       {&y, &c64[4], &c64[5], &c64[2], &c64[3]}, 5, 5, &ba, sizeof ba};
  const ops_call *calls[] = {&r, &p, &u, &bn, &bt};
  for (int i = 0; i < 5; i++) {
    reverse_tasks = 0;
    ck_assert_int_eq(run_mode("cpu", calls[i], REVERSE), BP_ABI_OK);
    ck_assert_int_le(reverse_tasks, 1);
  }
  tt_free(&x), tt_free(&y), tt_free(&m), tt_free(&yp);
  tt_free(&g), tt_free(&w), tt_free(&mo), tt_free(&lr);
  for (int i = 0; i < 6; i++) tt_free(&c64[i]);
}
END_TEST

/* The MLP's weight update (668,672 parameters) is shared: 6 tasks of up to
 * 2^17 elements, so both cores take part in it. */
START_TEST(an_mlp_sized_update_is_cut_into_tasks) {
  const int64_t n = 784 * 512 + 512 * 512 + 512 * 10;
  uint64_t rng = 5;
  tt g = tt_new(FP32, 1, 1, 1, n, 0), w = tt_new(FP32, 1, 1, 1, n, 0);
  tt mo = tt_new(FP32, 1, 1, 1, n, 0), lr = tt_new(FP32, 1, 1, 1, 1, 0);
  fill(&g, &rng, 0), fill(&w, &rng, 0);
  *tt_at(&lr, 0) = 0.05f;
  bp_optimizer_attrs oa = {0.9f, 5e-4f, 0, 0.9f, 0.999f, 1e-8f, 0, 0};
  const ops_call u = {"range.sgd", {&g, &lr}, {&w, &mo}, 2, 2, &oa, sizeof oa};
  reverse_tasks = 0;
  ck_assert_int_eq(run_mode("cpu", &u, REVERSE), BP_ABI_OK);
  ck_assert_int_eq(reverse_tasks, (n + (1 << 17) - 1) >> 17);
  ck_assert_int_eq(reverse_tasks, 6);
  tt_free(&g), tt_free(&w), tt_free(&mo), tt_free(&lr);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_cpu_threads");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, relu_gives_the_same_bits_on_any_thread_count);
  tcase_add_loop_test(tc, maxpool_gives_the_same_bits_on_any_thread_count, 0, POOL_CASES);
  tcase_add_test(tc, maxpool_bwd_refuses_a_bad_mask_on_any_thread_count);
  tcase_add_loop_test(tc, batchnorm_gives_the_same_bits_on_any_thread_count, 0, BN_SHAPES);
  tcase_add_test(tc, sgd_and_adamw_give_the_same_bits_on_any_thread_count);
  tcase_add_test(tc, small_calls_are_one_task);
  tcase_add_test(tc, an_mlp_sized_update_is_cut_into_tasks);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
