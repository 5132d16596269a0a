/* The oneDNN convolution module (ops/onednn) against the reference kernels,
 * through the per-node state a binding keeps: the forward reorders its
 * filters once per parameter generation (and follows every change the host
 * announces); the backward kernels add into their outputs run after run
 * when accumulate is 1; the direct backward-filter (conv_bwf.c) matches the
 * reference on the CNN's and odd shapes with the same bits on any thread
 * count; two threads running their own nodes at once get the bits of one
 * thread; the registry prefers it; padded tensors are refused with a
 * reason. `blueprint validate --impl onednn` (tests/CMakeLists.txt)
 * covers the rest of the contract case by case. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref_util.h"

/* The reference module (ops_ref_util.c) and this one. */
static bp_registry *both_modules(void) { return ops_registry_with(BP_OPS_ONEDNN_PATH); }

/* A prepared node (ops_ref_util.h) of either module; threads: what the
 * host lends (NULL: one thread). */
static void node_open_on(ops_node *n, const char *impl, const ops_call *c,
                         const bp_abi_threads *threads) {
  both_modules();
  ops_node_open(n, impl, c, threads);
}

static void node_open(ops_node *n, const char *impl, const ops_call *c) {
  node_open_on(n, impl, c, NULL);
}

/* One call of the reference kernel. */
static void ref_run(const ops_call *c) {
  ops_node n;
  node_open(&n, "reference", c);
  ops_node_run(&n);
  ops_node_close(&n);
}

/* A 3x3 pad-1 convolution of N=3, 9x8, C=8 -> K=16 (oneDNN's JIT serves
 * it), with bias; accumulate as given. */
#define N 3
#define H 9
#define W 8
#define C 8
#define K 16
static bp_conv2d_attrs attrs_of(int accumulate) {
  const bp_conv2d_attrs a = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, accumulate};
  return a;
}

START_TEST(test_forward_reorders_its_filters_once_per_parameter_generation) {
  uint64_t rng = 11;
  tt x = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0), w = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0), y = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  tt yr = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0), y1 = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
  const bp_conv2d_attrs at = attrs_of(0);
  ops_call c = {"conv2d.fwd", {&x, &w, &b}, {&y}, 3, 1, &at, sizeof at};
  ops_call cr = c;
  cr.out[0] = &yr;
  ops_node n;
  node_open(&n, "onednn", &c);
  ops_node_run(&n);
  ref_run(&cr);
  ck_assert_double_lt(ops_rel_err(&y, &yr), 1e-5);
  tt_copy(&y1, &y);
  /* new filters, same generation: the reordered copy is still what runs */
  tt_rand(&w, &rng, -1, 1);
  ops_node_run(&n);
  ck_assert_msg(ops_same_bits(&y, &y1), "the filters were reordered without a new generation");
  /* the host announces the change: the new filters run */
  n.generation++;
  ops_node_run(&n);
  ref_run(&cr);
  ck_assert_double_lt(ops_rel_err(&y, &yr), 1e-5);
  ck_assert_msg(!ops_same_bits(&y, &y1), "the new generation's filters did not run");
  ops_node_close(&n);
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y), tt_free(&yr), tt_free(&y1);
}
END_TEST

/* out starts at `start`; after `runs` runs with accumulate 1 it must be
 * start + runs * (the reference's overwrite result in `once`). */
static void check_added(const tt *out, const tt *start, const tt *once, int runs) {
  tt want = tt_new(BP_ABI_DTYPE_FP32, out->d.shape[0], out->d.shape[1], out->d.shape[2],
                   out->d.shape[3], 0);
  for (int64_t i = 0; i < tt_count(out); i++)
    *tt_at(&want, i) = *tt_at(start, i) + (float)runs * *tt_at(once, i);
  ck_assert_double_lt(ops_rel_err(out, &want), 1e-5);
  tt_free(&want);
}

START_TEST(test_backward_kernels_add_into_their_outputs_run_after_run) {
  uint64_t rng = 12;
  tt x = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0), w = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  tt dx = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0), dx0 = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0);
  tt dxr = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0);
  tt dw = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0), dw0 = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  tt dwr = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  tt db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0), db0 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0);
  tt dbr = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0);
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1);
  tt_rand(&dx0, &rng, -1, 1), tt_rand(&dw0, &rng, -1, 1), tt_rand(&db0, &rng, -1, 1);
  tt_copy(&dx, &dx0), tt_copy(&dw, &dw0), tt_copy(&db, &db0);
  const bp_conv2d_attrs acc = attrs_of(1), over = attrs_of(0);
  /* the reference's overwrite results */
  ops_call rd = {"conv2d.bwd_data", {&dy, &w}, {&dxr}, 2, 1, &over, sizeof over};
  ops_call rf = {"conv2d.bwd_filter", {&x, &dy}, {&dwr, &dbr}, 2, 2, &over, sizeof over};
  ref_run(&rd), ref_run(&rf);
  ops_call cd = {"conv2d.bwd_data", {&dy, &w}, {&dx}, 2, 1, &acc, sizeof acc};
  ops_call cf = {"conv2d.bwd_filter", {&x, &dy}, {&dw, &db}, 2, 2, &acc, sizeof acc};
  ops_node nd, nf;
  node_open(&nd, "onednn", &cd), node_open(&nf, "onednn", &cf);
  for (int runs = 1; runs <= 3; runs++) {
    ops_node_run(&nd), ops_node_run(&nf);
    nd.generation++, nf.generation++;
    check_added(&dx, &dx0, &dxr, runs);
    check_added(&dw, &dw0, &dwr, runs);
    check_added(&db, &db0, &dbr, runs);
  }
  ops_node_close(&nd), ops_node_close(&nf);
  tt *all[] = {&x, &w, &dy, &dx, &dx0, &dxr, &dw, &dw0, &dwr, &db, &db0, &dbr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* Channel counts that are not multiples of oneDNN's channel blocks (8 or
 * 16), with a bias, strides, 1x1 and dilated cases, one to three threads
 * (the state's scratchpad and the kernels' split depend on it), and every
 * pass with accumulate 0 and 1 against the reference. With ctest's guard
 * page run (tests/CMakeLists.txt: guard_malloc.c preloaded) a write past any
 * buffer the module keeps faults here. */
typedef struct odd_shape {
  int64_t n, h, w, c, k;
  bp_conv2d_attrs at;
} odd_shape;

static void serial_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(arg, i);
}

/* One node of `c` on onednn with `threads`, run `runs` times. */
static void odd_run(const ops_call *c, const bp_abi_threads *threads, int runs) {
  ops_node n;
  node_open_on(&n, "onednn", c, threads);
  for (int r = 0; r < runs; r++) ops_node_run(&n);
  ops_node_close(&n);
}

/* Every pass of shape p on one to three threads against the reference. */
static void odd_check(const odd_shape *p, uint64_t *seed) {
  const bp_abi_threads two = {sizeof two, 2, NULL, serial_for};
  const bp_abi_threads three = {sizeof three, 3, NULL, serial_for};
  const bp_abi_threads *thread_counts[] = {NULL, &two, &three};
  uint64_t rng = (*seed)++;
  const long long i = (long long)p->c * 1000 + p->k; /* names the shape in messages */
  const int strided_1x1 = p->at.kernel_h == 1 && p->at.kernel_w == 1 &&
                          (p->at.stride_h > 1 || p->at.stride_w > 1);
  {
    const bp_conv2d_attrs *a = &p->at;
    const int64_t oh = (p->h + 2 * a->pad_h - a->dilation_h * (a->kernel_h - 1) - 1) / a->stride_h + 1;
    const int64_t ow = (p->w + 2 * a->pad_w - a->dilation_w * (a->kernel_w - 1) - 1) / a->stride_w + 1;
    tt x = tt_new(BP_ABI_DTYPE_FP32, p->n, p->h, p->w, p->c, 0);
    tt w = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0);
    tt dy = tt_new(BP_ABI_DTYPE_FP32, p->n, oh, ow, p->k, 0);
    tt y = tt_new(BP_ABI_DTYPE_FP32, p->n, oh, ow, p->k, 0), yr = tt_new(BP_ABI_DTYPE_FP32, p->n, oh, ow, p->k, 0);
    tt dx = tt_new(BP_ABI_DTYPE_FP32, p->n, p->h, p->w, p->c, 0), dxr = tt_new(BP_ABI_DTYPE_FP32, p->n, p->h, p->w, p->c, 0);
    tt dx0 = tt_new(BP_ABI_DTYPE_FP32, p->n, p->h, p->w, p->c, 0);
    tt dw = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt dwr = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt dw0 = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0), dbr = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0);
    tt db0 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0);
    tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&b, &rng, -1, 1);
    tt_rand(&dy, &rng, -1, 1), tt_rand(&dx0, &rng, -1, 1), tt_rand(&dw0, &rng, -1, 1);
    tt_rand(&db0, &rng, -1, 1);
    bp_conv2d_attrs over = *a, acc = *a;
    acc.accumulate = 1;
    ops_call rf = {"conv2d.fwd", {&x, &w, &b}, {&yr}, 3, 1, &over, sizeof over};
    ops_call rd = {"conv2d.bwd_data", {&dy, &w}, {&dxr}, 2, 1, &over, sizeof over};
    ops_call rb = {"conv2d.bwd_filter", {&x, &dy}, {&dwr, &dbr}, 2, 2, &over, sizeof over};
    ref_run(&rf), ref_run(&rd), ref_run(&rb);
    for (int t = 0; t < 3; t++) {
      ops_call cf = {"conv2d.fwd", {&x, &w, &b}, {&y}, 3, 1, &over, sizeof over};
      odd_run(&cf, thread_counts[t], 2);
      ck_assert_msg(ops_rel_err(&y, &yr) < 1e-5, "C,K %lld, %d threads: forward", i, t + 1);
      for (int accumulate = 0; accumulate < 2; accumulate++) {
        const bp_conv2d_attrs *at = accumulate ? &acc : &over;
        const int runs = accumulate ? 2 : 1;
        tt_copy(&dx, &dx0), tt_copy(&dw, &dw0), tt_copy(&db, &db0);
        ops_call cd = {"conv2d.bwd_data", {&dy, &w}, {&dx}, 2, 1, at, sizeof *at};
        ops_call cb = {"conv2d.bwd_filter", {&x, &dy}, {&dw, &db}, 2, 2, at, sizeof *at};
        odd_run(&cd, thread_counts[t], runs);
        if (accumulate) check_added(&dx, &dx0, &dxr, runs);
        else ck_assert_msg(ops_rel_err(&dx, &dxr) < 1e-5, "C,K %lld, %d threads: dx", i, t + 1);
        if (strided_1x1) { /* the direct kernel serves it; without AVX2 it is refused */
          ops_args r;
          ops_args_make(&r, &cb, 0);
          r.args.threads = thread_counts[t];
          const bp_abi_kernel *k = ops_kernel_impl(cb.op, "onednn");
          char why[256] = "";
          if (!k->supports(k->user, &r.args, why, sizeof why)) {
            ck_assert_msg(strstr(why, "strided 1x1") != NULL, "reason: %s", why);
            continue;
          }
        }
        odd_run(&cb, thread_counts[t], runs);
        if (accumulate) {
          check_added(&dw, &dw0, &dwr, runs);
          check_added(&db, &db0, &dbr, runs);
        } else {
          ck_assert_msg(ops_rel_err(&dw, &dwr) < 1e-5, "C,K %lld, %d threads: dw", i, t + 1);
          ck_assert_msg(ops_rel_err(&db, &dbr) < 1e-5, "C,K %lld, %d threads: db", i, t + 1);
        }
      }
    }
    tt *all[] = {&x, &w, &b, &dy, &y, &yr, &dx, &dxr, &dx0, &dw, &dwr, &dw0, &db, &dbr, &db0};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) tt_free(all[j]);
  }
}

START_TEST(test_odd_channel_counts_match_the_reference_in_every_pass) {
  const odd_shape shapes[] = {
      {2, 7, 5, 3, 5, {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}},
      {2, 9, 8, 4, 20, {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0}},
      {2, 8, 7, 12, 9, {3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 0}},
      {4, 8, 8, 16, 32, {1, 1, 2, 2, 0, 0, 1, 1, 1, 1, 0}}, /* ResNet-8's shortcuts */
      {4, 8, 8, 32, 64, {1, 1, 2, 2, 0, 0, 1, 1, 1, 1, 0}},
  };
  uint64_t seed = 13;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) odd_check(&shapes[i], &seed);
  /* strided 1x1 (a ResNet shortcut), 1-17 input channels: the forward and
   * backward-data on oneDNN; the backward-filter on the direct kernel
   * (oneDNN 2.6's wrote past its scratchpad on one thread and gave wrong
   * filters on two: ops/onednn/conv2d.c) */
  for (int64_t c = 1; c <= 17; c++) {
    const odd_shape p = {3, 6, 6, c, 12, {1, 1, 2, 2, 0, 0, 1, 1, 1, 1, 0}};
    odd_check(&p, &seed);
  }
}
END_TEST

/* The host's threads as a test lends them: two real threads taking the
 * indices in turn, or one thread walking them backwards (the order of the
 * calls is unspecified: neither may change a bit). */
typedef struct pf_job {
  void (*fn)(void *, int64_t);
  void *arg;
  int64_t n;
  atomic_llong next;
} pf_job;

static void *pf_worker(void *p) {
  pf_job *j = p;
  for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->arg, i);
  return NULL;
}

static void threaded_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  pf_job j = {fn, arg, n, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, pf_worker, &j), 0);
  pf_worker(&j);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
}

static void backward_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = n - 1; i >= 0; i--) fn(arg, i);
}

/* The backward-filter of the CNN's convolutions (models/cnn.yaml) and of
 * odd shapes that the direct kernel serves (a workspace says so: oneDNN's
 * backward-filter needs none): against the reference, with accumulate 0
 * and 1, and the same bits on one thread, two threads and a reversed
 * order of the chunks. */
START_TEST(test_direct_backward_filter_matches_the_reference_with_the_bits_of_one_thread) {
  both_modules();
  const bp_abi_threads two = {sizeof two, 2, NULL, threaded_for};
  const bp_abi_threads reversed = {sizeof reversed, 2, NULL, backward_for};
  const bp_abi_threads *thread_counts[] = {NULL, &two, &reversed};
  const odd_shape shapes[] = {
      {20, 28, 28, 32, 32, {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}}, /* conv2 */
      {20, 14, 14, 32, 64, {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}}, /* conv3 */
      {17, 14, 14, 64, 64, {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}}, /* conv4 */
      {6, 28, 28, 1, 32, {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}},   /* conv1: along the filters */
      {3, 9, 7, 5, 40, {3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 0}},     /* rows of 15, 5 vectors of filters */
      {2, 6, 6, 2, 72, {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}},     /* rows of 6, 9 vectors of filters */
      {3, 9, 11, 5, 7, {5, 5, 1, 1, 2, 2, 1, 1, 1, 1, 0}},     /* rows of 25, 7 filters */
      {5, 10, 9, 6, 13, {3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0}},    /* stride 2, padding 2 */
      {2, 6, 7, 40, 3, {1, 3, 1, 1, 0, 1, 1, 1, 1, 1, 0}},     /* 1x3, 3 filters */
      {35, 5, 4, 16, 9, {2, 2, 3, 2, 0, 0, 1, 1, 1, 1, 0}},    /* 12 chunks, the last short */
      {3, 6, 5, 8, 150, {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}},   /* 3 blocks of filters */
  };
  uint64_t rng = 21;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const odd_shape *p = &shapes[si];
    const bp_conv2d_attrs *a = &p->at;
    const int64_t oh = (p->h + 2 * a->pad_h - a->kernel_h) / a->stride_h + 1;
    const int64_t ow = (p->w + 2 * a->pad_w - a->kernel_w) / a->stride_w + 1;
    tt x = tt_new(BP_ABI_DTYPE_FP32, p->n, p->h, p->w, p->c, 0);
    tt dy = tt_new(BP_ABI_DTYPE_FP32, p->n, oh, ow, p->k, 0);
    tt dwr = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt dw0 = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
    tt dbr = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0), db0 = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0);
    tt dw[3], db[3];
    tt_rand(&x, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1), tt_rand(&dw0, &rng, -1, 1);
    tt_rand(&db0, &rng, -1, 1);
    bp_conv2d_attrs over = *a, acc = *a;
    acc.accumulate = 1;
    const int outs = a->has_bias ? 2 : 1; /* the CNN's convolutions have no bias */
    ops_call rb = {"conv2d.bwd_filter", {&x, &dy}, {&dwr, &dbr}, 2, outs, &over, sizeof over};
    ref_run(&rb);
    for (int accumulate = 0; accumulate < 2; accumulate++)
      for (int t = 0; t < 3; t++) {
        dw[t] = tt_new(BP_ABI_DTYPE_FP32, p->k, a->kernel_h, a->kernel_w, p->c, 0);
        db[t] = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, p->k, 0);
        tt_copy(&dw[t], &dw0), tt_copy(&db[t], &db0);
        const bp_conv2d_attrs *at = accumulate ? &acc : &over;
        ops_call cb = {"conv2d.bwd_filter", {&x, &dy}, {&dw[t], &db[t]}, 2, outs, at, sizeof *at};
        ops_node n;
        node_open_on(&n, "onednn", &cb, thread_counts[t]);
        ck_assert_msg(n.a.args.workspace_bytes > 0, "shape %zu: not on the direct kernel", si);
        ops_node_run(&n);
        if (accumulate) ops_node_run(&n);
        ops_node_close(&n);
        if (accumulate) {
          check_added(&dw[t], &dw0, &dwr, 2);
          if (a->has_bias) check_added(&db[t], &db0, &dbr, 2);
        } else {
          ck_assert_msg(ops_rel_err(&dw[t], &dwr) < 1e-5, "shape %zu, threads %d: dw", si, t);
          ck_assert_msg(!a->has_bias || ops_rel_err(&db[t], &dbr) < 1e-5,
                        "shape %zu, threads %d: db", si, t);
        }
        if (t > 0) {
          ck_assert_msg(ops_same_bits(&dw[t], &dw[0]), "shape %zu, threads %d: dw bits", si, t);
          ck_assert_msg(ops_same_bits(&db[t], &db[0]), "shape %zu, threads %d: db bits", si, t);
        }
        if (t == 2)
          for (int j = 0; j < 3; j++) tt_free(&dw[j]), tt_free(&db[j]);
      }
    tt *all[] = {&x, &dy, &dwr, &dw0, &dbr, &db0};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) tt_free(all[j]);
  }
}
END_TEST

/* A rank's work: a forward and a backward-filter node of its own, `reps`
 * times, each its own tensors. */
typedef struct rank_work {
  tt x, w, b, y, dy, dw, db;
  bp_conv2d_attrs at;
} rank_work;

static void work_new(rank_work *r, uint64_t seed) {
  uint64_t rng = seed;
  r->x = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0), r->w = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  r->b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0), r->y = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  r->dy = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  r->dw = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0), r->db = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0);
  tt_rand(&r->x, &rng, -1, 1), tt_rand(&r->w, &rng, -1, 1), tt_rand(&r->b, &rng, -1, 1);
  tt_rand(&r->dy, &rng, -1, 1);
  r->at = attrs_of(0);
}

static void work_free(rank_work *r) {
  tt *all[] = {&r->x, &r->w, &r->b, &r->y, &r->dy, &r->dw, &r->db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}

static void *work_run(void *arg) {
  rank_work *r = arg;
  ops_call cf = {"conv2d.fwd", {&r->x, &r->w, &r->b}, {&r->y}, 3, 1, &r->at, sizeof r->at};
  ops_call cb = {"conv2d.bwd_filter", {&r->x, &r->dy}, {&r->dw, &r->db}, 2, 2, &r->at,
                 sizeof r->at};
  ops_node nf, nb;
  node_open(&nf, "onednn", &cf), node_open(&nb, "onednn", &cb);
  for (int rep = 0; rep < 20; rep++) {
    ops_node_run(&nf), ops_node_run(&nb);
    nf.generation++;
  }
  ops_node_close(&nf), ops_node_close(&nb);
  return NULL;
}

START_TEST(test_two_threads_running_their_own_nodes_get_the_bits_of_one) {
  both_modules(); /* loaded before the threads start */
  rank_work alone[2], together[2];
  for (int i = 0; i < 2; i++) work_new(&alone[i], 100 + (uint64_t)i), work_new(&together[i], 100 + (uint64_t)i);
  work_run(&alone[0]), work_run(&alone[1]);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, work_run, &together[i]), 0);
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 2; i++) {
    ck_assert(ops_same_bits(&alone[i].y, &together[i].y));
    ck_assert(ops_same_bits(&alone[i].dw, &together[i].dw));
    ck_assert(ops_same_bits(&alone[i].db, &together[i].db));
    work_free(&alone[i]), work_free(&together[i]);
  }
}
END_TEST

START_TEST(test_registry_prefers_it_and_padded_tensors_are_refused_with_a_reason) {
  both_modules();
  const bp_conv2d_attrs at = attrs_of(0);
  tt x = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C, 0), w = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, K, 0), y = tt_new(BP_ABI_DTYPE_FP32, N, H, W, K, 0);
  ops_call c = {"conv2d.fwd", {&x, &w, &b}, {&y}, 3, 1, &at, sizeof at};
  ck_assert_str_eq(ops_selected_impl(&c, "", NULL, 0), "onednn");
  tt xp = tt_new(BP_ABI_DTYPE_FP32, N, H, W, C - 3, 3), wp = tt_new(BP_ABI_DTYPE_FP32, K, 3, 3, C - 3, 3);
  ops_call cp = {"conv2d.fwd", {&xp, &wp, &b}, {&y}, 3, 1, &at, sizeof at};
  ops_args a;
  ops_args_make(&a, &cp, 0);
  const bp_abi_kernel *k = ops_kernel_impl("conv2d.fwd", "onednn");
  char why[256] = "";
  ck_assert_int_eq(k->supports(k->user, &a.args, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "padded channels") != NULL, "reason: %s", why);
  ck_assert_str_eq(ops_selected_impl(&cp, "", NULL, 0), "reference");
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y), tt_free(&xp), tt_free(&wp);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_onednn");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_forward_reorders_its_filters_once_per_parameter_generation);
  tcase_add_test(tc, test_backward_kernels_add_into_their_outputs_run_after_run);
  tcase_add_test(tc, test_odd_channel_counts_match_the_reference_in_every_pass);
  tcase_add_test(tc, test_direct_backward_filter_matches_the_reference_with_the_bits_of_one_thread);
  tcase_add_test(tc, test_two_threads_running_their_own_nodes_get_the_bits_of_one);
  tcase_add_test(tc, test_registry_prefers_it_and_padded_tensors_are_refused_with_a_reason);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
