/* The BLAS op module (ops/blas/) against the reference module: both loaded
 * through the registry (ops_ref_util.c loads the reference, this file adds
 * the BLAS module to the same registry). Every kernel against the
 * reference on the shape table (odd sizes, strides, padding, dilation,
 * groups, depthwise, 1x1 with and without im2col, the flipped
 * backward-data, the CNN's convolutions, bias, accumulate, padded
 * channels, guard pages after every slot and the workspace) is the
 * conformance suite's job (tests/test_conformance.c, core/src/
 * validate_cases.c); this file checks what is particular to these modules.
 *
 * Error bound where it compares: err = max|blas - ref| / max(1, max|ref|)
 * over the logical elements of an output, and err < BLAS_TOL = 1e-4 (the
 * BLAS kernels sum in float in another order than the reference).
 *
 * Here: the refusals (padded conv filters, padded fc inputs, a short
 * workspace, bad arguments and pointers), chunked im2col, bitwise
 * determinism (two runs; four rank threads calling at once), and selection: bp_registry_select picks "blas" over
 * "reference", pins (BP_KERNELS, select options) override it, and a node
 * the BLAS kernel refuses goes to the reference. Last, the OpenBLAS kernel
 * set the module loads: the CPU's best, unless OPENBLAS_CORETYPE says.
 *
 * Built twice, once per module of ops/blas (blas-impl.h): test_ops_blas
 * for bp_ops_blas.so (OpenBLAS, impl GEMM_IMPL) and, with GEMM_DNNL,
 * test_ops_dnnl for bp_ops_dnnl.so (oneDNN, impl "dnnl", priority 12; no
 * OpenBLAS kernel set). GEMM_IMPL names the impl under test. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ops_ref_util.h"

#define BLAS_TOL 1e-4

#ifdef GEMM_DNNL
#define GEMM_IMPL "dnnl"
#define GEMM_MODULE "ops-dnnl"
#define GEMM_PRIORITY 12
#else
#define GEMM_IMPL "blas"
#define GEMM_MODULE "ops-blas"
#define GEMM_PRIORITY 10
#endif

/* ---- the two modules ------------------------------------------------------ */

/* The reference module (ops_ref_util.c) and this one. */
static bp_registry *both_modules(void) { return ops_registry_with(BP_OPS_BLAS_PATH); }

static const bp_abi_kernel *kernel_of(const char *op, const char *impl) {
  both_modules();
  return ops_kernel_impl(op, impl);
}

/* ---- calling a kernel directly ------------------------------------------- */

static uint64_t k_workspace(const bp_abi_kernel *k, const ops_call *c) {
  ops_args a;
  ops_args_make(&a, c, 0);
  return k->workspace_size ? k->workspace_size(k->user, &a.args) : 0;
}

/* supports() asserted, then run() with exactly workspace_size() bytes. */
static void k_run(const bp_abi_kernel *k, const ops_call *c) {
  char reason[256];
  if (ops_kernel_supports(k, c, reason, sizeof reason) != 1)
    ck_abort_msg("%s/%s refused: %s", c->op, k->impl, reason);
  const uint64_t need = k_workspace(k, c);
  void *ws = need ? malloc((size_t)need) : NULL;
  if (need) ck_assert_ptr_nonnull(ws);
  const int rc = ops_kernel_run(k, c, ws, need);
  free(ws);
  if (rc != BP_ABI_OK) ck_abort_msg("%s/%s run() returned %d", c->op, k->impl, rc);
}

/* Asserts the BLAS kernel refuses with a reason containing `needle`, and
 * that run() returns BP_ABI_ERR_INVALID without aborting. */
static void blas_expect_refused(const ops_call *c, const char *needle) {
  const bp_abi_kernel *k = kernel_of(c->op, GEMM_IMPL);
  char reason[256];
  ck_assert_msg(ops_kernel_supports(k, c, reason, sizeof reason) == 0, "%s accepted, expected refusal (%s)",
                c->op, needle);
  ck_assert_msg(strstr(reason, needle) != NULL, "%s: reason '%s' lacks '%s'", c->op, reason,
                needle);
  ck_assert_int_eq(ops_kernel_run(k, c, NULL, 0), BP_ABI_ERR_INVALID);
}

/* ---- conv2d shapes -------------------------------------------------------- */

typedef struct conv_case {
  int h, w, c, k, kh, kw, sh, sw, ph, pw, dh, dw, groups;
} conv_case;

static bp_conv2d_attrs conv_attrs_of(const conv_case *cc, int bias, int accumulate) {
  bp_conv2d_attrs a = {cc->kh, cc->kw, cc->sh, cc->sw, cc->ph, cc->pw,
                       cc->dh, cc->dw, cc->groups, bias, accumulate};
  return a;
}


/* ---- chunked im2col and determinism -------------------------------------- */

START_TEST(conv_chunks_and_is_deterministic) {
  /* 24x24x20 -> 16, 3x3, padding 1, batch 7: one image's im2col rows are
   * 24*24*180 floats (405 KiB) and its flipped backward-data rows 24*24*144
   * (324 KiB), so with the 1 MiB chunk target the batch runs in chunks of
   * 2 (and 3) images, the last one short. */
  const conv_case cc = {24, 24, 20, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const int n = 7;
  const uint64_t image_bytes[3] = {24u * 24u * 180u * sizeof(float),
                                   24u * 24u * 144u * sizeof(float),
                                   24u * 24u * 180u * sizeof(float)};
  tt x = tt_new(BP_ABI_DTYPE_FP32, n, 24, 24, 20, 0), w = tt_new(BP_ABI_DTYPE_FP32, 16, 3, 3, 20, 0);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, n, 24, 24, 16, 0);
  uint64_t rng = 99;
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1);
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 0, 0);
  tt out[3][3]; /* [pass][reference, blas, blas again] */
  for (int r = 0; r < 3; r++) {
    out[0][r] = tt_new(BP_ABI_DTYPE_FP32, n, 24, 24, 16, 0);
    out[1][r] = tt_new(BP_ABI_DTYPE_FP32, n, 24, 24, 20, 0);
    out[2][r] = tt_new(BP_ABI_DTYPE_FP32, 16, 3, 3, 20, 0);
    const char *impl = r == 0 ? "reference" : GEMM_IMPL;
    const ops_call fwd = {"conv2d.fwd", {&x, &w}, {&out[0][r]}, 2, 1, &a, sizeof a};
    const ops_call bd = {"conv2d.bwd_data", {&dy, &w}, {&out[1][r]}, 2, 1, &a, sizeof a};
    const ops_call bf = {"conv2d.bwd_filter", {&x, &dy}, {&out[2][r]}, 2, 1, &a, sizeof a};
    const ops_call *calls[3] = {&fwd, &bd, &bf};
    for (int p = 0; p < 3; p++) {
      const bp_abi_kernel *k = kernel_of(calls[p]->op, impl);
      if (r == 1) {
        const uint64_t ws = k_workspace(k, calls[p]);
        ck_assert_msg(ws >= image_bytes[p] && ws < (uint64_t)n * image_bytes[p],
                      "%s: workspace %llu bytes: not chunked", calls[p]->op,
                      (unsigned long long)ws);
      }
      k_run(k, calls[p]);
    }
  }
  for (int p = 0; p < 3; p++) {
    const double e = ops_rel_err(&out[p][1], &out[p][0]);
    ck_assert_msg(e < BLAS_TOL, "pass %d: err %.3g", p, e);
    ck_assert_msg(ops_same_bits(&out[p][1], &out[p][2]), "pass %d: two runs differ", p);
    for (int r = 0; r < 3; r++) tt_free(&out[p][r]);
  }
  tt_free(&x), tt_free(&w), tt_free(&dy);
}
END_TEST

/* ---- ranks as threads ----------------------------------------------------- */

/* Ranks are threads of one process, each calling the kernels on its own
 * tensors and workspace at the same time: every thread must get the bits
 * a lone call gets. */
typedef struct rank_job {
  const ops_call *call[2]; /* conv2d.fwd and conv2d.bwd_filter into this rank's outputs */
  int failed;
} rank_job;

static void *rank_main(void *p) {
  rank_job *job = p;
  for (int rep = 0; rep < 3; rep++)
    for (int i = 0; i < 2; i++) {
      const bp_abi_kernel *k = kernel_of(job->call[i]->op, GEMM_IMPL);
      const uint64_t need = k_workspace(k, job->call[i]);
      void *ws = need ? malloc((size_t)need) : NULL;
      if ((need && !ws) || ops_kernel_run(k, job->call[i], ws, need) != BP_ABI_OK) job->failed = 1;
      free(ws);
    }
  return NULL;
}

#define RANKS 4
START_TEST(concurrent_ranks_get_the_same_bits) {
  const conv_case cc = {14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const int n = 5;
  tt x = tt_new(BP_ABI_DTYPE_FP32, n, 14, 14, 32, 0), w = tt_new(BP_ABI_DTYPE_FP32, 64, 3, 3, 32, 0);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, n, 14, 14, 64, 0);
  uint64_t rng = 77;
  tt_rand(&x, &rng, -1, 1), tt_rand(&w, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1);
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 0, 0);
  tt y[RANKS + 1], dw[RANKS + 1];
  ops_call fwd[RANKS + 1], bf[RANKS + 1];
  rank_job jobs[RANKS];
  pthread_t threads[RANKS];
  for (int r = 0; r <= RANKS; r++) {
    y[r] = tt_new(BP_ABI_DTYPE_FP32, n, 14, 14, 64, 0);
    dw[r] = tt_new(BP_ABI_DTYPE_FP32, 64, 3, 3, 32, 0);
    fwd[r] = (ops_call){"conv2d.fwd", {&x, &w}, {&y[r]}, 2, 1, &a, sizeof a};
    bf[r] = (ops_call){"conv2d.bwd_filter", {&x, &dy}, {&dw[r]}, 2, 1, &a, sizeof a};
  }
  k_run(kernel_of("conv2d.fwd", GEMM_IMPL), &fwd[RANKS]); /* the lone call */
  k_run(kernel_of("conv2d.bwd_filter", GEMM_IMPL), &bf[RANKS]);
  for (int r = 0; r < RANKS; r++) {
    jobs[r] = (rank_job){{&fwd[r], &bf[r]}, 0};
    ck_assert_int_eq(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < RANKS; r++) {
    ck_assert_int_eq(pthread_join(threads[r], NULL), 0);
    ck_assert_msg(!jobs[r].failed, "rank %d: a run failed", r);
    ck_assert_msg(ops_same_bits(&y[r], &y[RANKS]), "rank %d: y differs", r);
    ck_assert_msg(ops_same_bits(&dw[r], &dw[RANKS]), "rank %d: dw differs", r);
  }
  for (int r = 0; r <= RANKS; r++) tt_free(&y[r]), tt_free(&dw[r]);
  tt_free(&x), tt_free(&w), tt_free(&dy);
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

START_TEST(conv_refuses_padded_filters) {
  /* a 3x3 filter with padded channels is not one row of 3*3*C values */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 4, 0), w = tt_new(BP_ABI_DTYPE_FP32, 6, 3, 3, 4, 4);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 6, 0);
  const conv_case cc = {5, 5, 4, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 0, 0);
  const ops_call fwd = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
  const ops_call bd = {"conv2d.bwd_data", {&y, &w}, {&x}, 2, 1, &a, sizeof a};
  const ops_call bf = {"conv2d.bwd_filter", {&x, &y}, {&w}, 2, 1, &a, sizeof a};
  blas_expect_refused(&fwd, "w: device strides");
  blas_expect_refused(&bd, "reference kernel serves");
  blas_expect_refused(&bf, "dw: device strides");
  /* the reference serves them */
  ops_run(&fwd);
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

START_TEST(conv_refuses_uneven_rows) {
  /* y's images are not evenly spaced pixel rows: a gap after each image */
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 4, 4, 3, 0), w = tt_new(BP_ABI_DTYPE_FP32, 5, 3, 3, 3, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 3, 4, 4, 5, 0); /* room for the gaps */
  y.d.shape[0] = 2;
  y.d.stride[0] += 7;
  const conv_case cc = {4, 4, 3, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 0, 0);
  const ops_call fwd = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
  blas_expect_refused(&fwd, "y: device strides");
  ops_run(&fwd); /* the reference accepts it */
  /* x read through im2col may have such strides */
  tt x2 = tt_new(BP_ABI_DTYPE_FP32, 3, 4, 4, 3, 0), y2 = tt_new(BP_ABI_DTYPE_FP32, 2, 4, 4, 5, 0);
  x2.d.shape[0] = 2;
  x2.d.stride[0] += 5;
  tt_rand(&x2, &(uint64_t){3}, -1, 1), tt_rand(&w, &(uint64_t){4}, -1, 1);
  const ops_call fwd2 = {"conv2d.fwd", {&x2, &w}, {&y2}, 2, 1, &a, sizeof a};
  tt y3 = tt_new(BP_ABI_DTYPE_FP32, 2, 4, 4, 5, 0);
  const ops_call fwd3 = {"conv2d.fwd", {&x2, &w}, {&y3}, 2, 1, &a, sizeof a};
  k_run(kernel_of("conv2d.fwd", GEMM_IMPL), &fwd2);
  ops_run(&fwd3);
  ck_assert(ops_rel_err(&y2, &y3) < BLAS_TOL);
  /* and so may dx, written by col2im instead of the flipped GEMM, for
   * both accumulate settings */
  for (int acc = 0; acc <= 1; acc++) {
    bp_conv2d_attrs aa = a;
    aa.accumulate = acc;
    tt dx[2];
    for (int i = 0; i < 2; i++) {
      dx[i] = tt_new(BP_ABI_DTYPE_FP32, 3, 4, 4, 3, 0);
      dx[i].d.shape[0] = 2;
      dx[i].d.stride[0] += 5;
      tt_rand(&dx[i], &(uint64_t){5}, -1, 1);
    }
    const ops_call bd0 = {"conv2d.bwd_data", {&y2, &w}, {&dx[0]}, 2, 1, &aa, sizeof aa};
    const ops_call bd1 = {"conv2d.bwd_data", {&y2, &w}, {&dx[1]}, 2, 1, &aa, sizeof aa};
    ops_run(&bd0);
    k_run(kernel_of("conv2d.bwd_data", GEMM_IMPL), &bd1);
    ck_assert_msg(ops_rel_err(&dx[1], &dx[0]) < BLAS_TOL, "col2im dx: err %.3g",
                  ops_rel_err(&dx[1], &dx[0]));
    tt_free(&dx[0]), tt_free(&dx[1]);
  }
  tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&x2), tt_free(&y2), tt_free(&y3);
}
END_TEST

START_TEST(fc_refuses_padded_feature_maps) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 3, 2, 2, 5, 3), w = tt_new(BP_ABI_DTYPE_FP32, 4, 1, 1, 20, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 4, 0);
  const bp_fc_attrs a = {0, 0};
  const ops_call fwd = {"fc.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
  const ops_call bd = {"fc.bwd_data", {&y, &w}, {&x}, 2, 1, &a, sizeof a};
  const ops_call bf = {"fc.bwd_filter", {&x, &y}, {&w}, 2, 1, &a, sizeof a};
  blas_expect_refused(&fwd, "x: device strides");
  blas_expect_refused(&bd, "dx: device strides");
  blas_expect_refused(&bf, "N rows of H*W*C features");
  ops_run(&fwd);
  tt_free(&x), tt_free(&w), tt_free(&y);
}
END_TEST

/* fc's backward passes with 1 KiB-multiple leading dimensions (512 wide):
 * on oneDNN they copy W (backward-data) and x, dy (backward-filter) into
 * the workspace with a padded leading dimension first (blas-impl.h,
 * BLAS_PAD_POW2_LD). The results are the bits of the same kernel on
 * tensors whose channel padding already spaces the rows so (no copy), and
 * match the reference; a short workspace is refused. */
START_TEST(fc_pads_1k_leading_dimensions_with_the_same_bits) {
  enum { N = 64, F = 512, O = 512, PAD = 16 };
  uint64_t rng = 77;
  tt x = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, F, 0), w = tt_new(BP_ABI_DTYPE_FP32, O, 1, 1, F, 0);
  tt dy = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, O, 0);
  tt xp = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, F, PAD), wp = tt_new(BP_ABI_DTYPE_FP32, O, 1, 1, F, PAD);
  tt dyp = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, O, PAD);
  tt_rand(&x, &rng, -1.0, 1.0), tt_rand(&w, &rng, -1.0, 1.0), tt_rand(&dy, &rng, -1.0, 1.0);
  tt_copy(&xp, &x), tt_copy(&wp, &w), tt_copy(&dyp, &dy);
  for (int acc = 0; acc < 2; acc++) {
    const bp_fc_attrs a = {1, acc};
    /* [0] dense (copied on oneDNN), [1] padded (in place), [2] reference */
    tt dx[3], dw[3], db[3];
    for (int i = 0; i < 3; i++) {
      dx[i] = tt_new(BP_ABI_DTYPE_FP32, N, 1, 1, F, i == 1 ? PAD : 0);
      dw[i] = tt_new(BP_ABI_DTYPE_FP32, O, 1, 1, F, i == 1 ? PAD : 0);
      db[i] = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, O, 0);
      uint64_t r2 = 5; /* the same starting values for accumulate */
      tt_rand(&dx[i], &r2, -1.0, 1.0), tt_rand(&dw[i], &r2, -1.0, 1.0), tt_rand(&db[i], &r2, -1.0, 1.0);
    }
    const ops_call bd[3] = {{"fc.bwd_data", {&dy, &w}, {&dx[0]}, 2, 1, &a, sizeof a},
                            {"fc.bwd_data", {&dyp, &wp}, {&dx[1]}, 2, 1, &a, sizeof a},
                            {"fc.bwd_data", {&dy, &w}, {&dx[2]}, 2, 1, &a, sizeof a}};
    const ops_call bf[3] = {{"fc.bwd_filter", {&x, &dy}, {&dw[0], &db[0]}, 2, 2, &a, sizeof a},
                            {"fc.bwd_filter", {&xp, &dyp}, {&dw[1], &db[1]}, 2, 2, &a, sizeof a},
                            {"fc.bwd_filter", {&x, &dy}, {&dw[2], &db[2]}, 2, 2, &a, sizeof a}};
    for (int i = 0; i < 3; i++) {
      const char *impl = i == 2 ? "reference" : GEMM_IMPL;
      k_run(kernel_of("fc.bwd_data", impl), &bd[i]);
      k_run(kernel_of("fc.bwd_filter", impl), &bf[i]);
    }
    const bp_abi_kernel *kd = kernel_of("fc.bwd_data", GEMM_IMPL);
    const bp_abi_kernel *kf = kernel_of("fc.bwd_filter", GEMM_IMPL);
#ifdef GEMM_DNNL
    ck_assert_uint_gt(k_workspace(kd, &bd[0]), (uint64_t)O * F * sizeof(float));
    ck_assert_uint_gt(k_workspace(kf, &bf[0]), (uint64_t)N * (F + O) * sizeof(float));
    const uint64_t need = k_workspace(kd, &bd[0]);
    float *ws = malloc((size_t)need);
    ck_assert_ptr_nonnull(ws);
    ck_assert_int_eq(ops_kernel_run(kd, &bd[0], ws, need - 4), BP_ABI_ERR_INVALID);
    ck_assert_int_eq(ops_kernel_run(kd, &bd[0], NULL, 0), BP_ABI_ERR_INVALID);
    free(ws);
#else
    ck_assert_uint_eq(k_workspace(kd, &bd[0]), 0);
    ck_assert_uint_eq(k_workspace(kf, &bf[0]), 0);
#endif
    ck_assert_uint_eq(k_workspace(kd, &bd[1]), 0); /* padded rows: used in place */
    ck_assert_uint_eq(k_workspace(kf, &bf[1]), 0);
    ck_assert_msg(ops_same_bits(&dx[0], &dx[1]), "fc.bwd_data accumulate %d: copy changed bits", acc);
    ck_assert_msg(ops_same_bits(&dw[0], &dw[1]), "fc.bwd_filter accumulate %d: copy changed bits", acc);
    ck_assert_msg(ops_same_bits(&db[0], &db[1]), "fc.bwd_filter db accumulate %d", acc);
    ck_assert_msg(tt_padding_intact(&dx[1]) && tt_padding_intact(&dw[1]), "padding written");
    ck_assert_msg(ops_rel_err(&dx[0], &dx[2]) <= BLAS_TOL, "dx vs reference: %g", ops_rel_err(&dx[0], &dx[2]));
    ck_assert_msg(ops_rel_err(&dw[0], &dw[2]) <= BLAS_TOL, "dw vs reference: %g", ops_rel_err(&dw[0], &dw[2]));
    ck_assert_msg(ops_rel_err(&db[0], &db[2]) <= BLAS_TOL, "db vs reference: %g", ops_rel_err(&db[0], &db[2]));
    for (int i = 0; i < 3; i++) tt_free(&dx[i]), tt_free(&dw[i]), tt_free(&db[i]);
  }
  tt_free(&x), tt_free(&w), tt_free(&dy), tt_free(&xp), tt_free(&wp), tt_free(&dyp);
}
END_TEST

START_TEST(conv_run_needs_its_workspace) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 3, 0), w = tt_new(BP_ABI_DTYPE_FP32, 4, 3, 3, 3, 0);
  tt y = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 4, 0);
  const conv_case cc = {6, 6, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 0, 0);
  const ops_call fwd = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
  const bp_abi_kernel *k = kernel_of("conv2d.fwd", GEMM_IMPL);
  const uint64_t need = k_workspace(k, &fwd);
  ck_assert_uint_eq(need, 2u * 36u * 27u * sizeof(float)); /* both images' im2col rows */
  float *ws = malloc((size_t)need + 4);
  ck_assert_int_eq(ops_kernel_run(k, &fwd, NULL, 0), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(ops_kernel_run(k, &fwd, ws, need - 4), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(ops_kernel_run(k, &fwd, (char *)ws + 2, need), BP_ABI_ERR_INVALID); /* misaligned */
  ck_assert_int_eq(ops_kernel_run(k, &fwd, x.data, need), BP_ABI_ERR_INVALID); /* overlaps x */
  ck_assert_int_eq(ops_kernel_run(k, &fwd, ws, need), BP_ABI_OK);
  /* 1x1, stride 1, no padding: no workspace */
  const conv_case c1 = {6, 6, 3, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1};
  const bp_conv2d_attrs a1 = conv_attrs_of(&c1, 0, 0);
  tt w1 = tt_new(BP_ABI_DTYPE_FP32, 4, 1, 1, 3, 0);
  const ops_call fwd1 = {"conv2d.fwd", {&x, &w1}, {&y}, 2, 1, &a1, sizeof a1};
  ck_assert_uint_eq(k_workspace(k, &fwd1), 0);
  ck_assert_int_eq(ops_kernel_run(k, &fwd1, NULL, 0), BP_ABI_OK);
  free(ws);
  tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&w1);
}
END_TEST

/* ---- small GEMMs on one thread (oneDNN) ----------------------------------- */

#ifdef GEMM_DNNL
static void serial_for(void *ctx, void (*fn)(void *, int64_t), void *arg, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(arg, i);
}

/* run() as a rank lent `count` threads runs it (module.c applies the count). */
static void k_run_on(const bp_abi_kernel *k, const ops_call *c, int count) {
  const bp_abi_threads th = {sizeof th, count, NULL, serial_for};
  ops_args a;
  ops_args_make(&a, c, 1);
  a.args.threads = &th;
  const uint64_t need = k->workspace_size ? k->workspace_size(k->user, &a.args) : 0;
  void *ws = need ? malloc((size_t)need) : NULL;
  if (need) ck_assert_ptr_nonnull(ws);
  a.args.workspace = ws, a.args.workspace_bytes = need;
  const int rc = k->run(k->user, &a.args);
  free(ws);
  if (rc != BP_ABI_OK) ck_abort_msg("%s/%s on %d threads returned %d", c->op, k->impl, count, rc);
}

/* The MLP's last layer (784-512-512-10) at batch 128 and 64: every GEMM is
 * under BLAS_ONE_THREAD_MACS (ops/blas/blas-impl.h), so it runs on one
 * thread whatever the rank's count and gives the same bits on one, two and
 * three threads. (dnnl_sgemm itself rounds the forward's m n k = 128 10 512,
 * N/T, differently on two threads than on one.) No workspace: with O = 10
 * the padded copies do not pay (BLAS_PAD_MIN_EXTENT), though x's rows are
 * 2 KiB apart. */
START_TEST(small_gemms_get_the_same_bits_on_any_thread_count) {
  enum { F = 512, O = 10, COUNTS = 3 };
  for (int n = 64; n <= 128; n += 64) {
    uint64_t rng = 31 + (uint64_t)n;
    tt x = tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, F, 0), w = tt_new(BP_ABI_DTYPE_FP32, O, 1, 1, F, 0);
    tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, O, 0), dy = tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, O, 0);
    tt_rand(&x, &rng, -1.0, 1.0), tt_rand(&w, &rng, -1.0, 1.0), tt_rand(&b, &rng, -1.0, 1.0);
    tt_rand(&dy, &rng, -1.0, 1.0);
    const bp_fc_attrs a = {1, 0};
    tt y[COUNTS], dx[COUNTS], dw[COUNTS], db[COUNTS];
    for (int t = 0; t < COUNTS; t++) {
      y[t] = tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, O, 0), dx[t] = tt_new(BP_ABI_DTYPE_FP32, n, 1, 1, F, 0);
      dw[t] = tt_new(BP_ABI_DTYPE_FP32, O, 1, 1, F, 0), db[t] = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, O, 0);
      const ops_call fwd = {"fc.fwd", {&x, &w, &b}, {&y[t]}, 3, 1, &a, sizeof a};
      const ops_call bd = {"fc.bwd_data", {&dy, &w}, {&dx[t]}, 2, 1, &a, sizeof a};
      const ops_call bf = {"fc.bwd_filter", {&x, &dy}, {&dw[t], &db[t]}, 2, 2, &a, sizeof a};
      const ops_call *calls[3] = {&fwd, &bd, &bf};
      for (int p = 0; p < 3; p++) {
        const bp_abi_kernel *k = kernel_of(calls[p]->op, GEMM_IMPL);
        ck_assert_uint_eq(k_workspace(k, calls[p]), 0);
        k_run_on(k, calls[p], t + 1);
      }
    }
    for (int t = 1; t < COUNTS; t++) {
      ck_assert_msg(ops_same_bits(&y[t], &y[0]), "N %d: fc.fwd on %d threads", n, t + 1);
      ck_assert_msg(ops_same_bits(&dx[t], &dx[0]), "N %d: fc.bwd_data on %d threads", n, t + 1);
      ck_assert_msg(ops_same_bits(&dw[t], &dw[0]), "N %d: fc.bwd_filter on %d threads", n, t + 1);
    }
    for (int t = 0; t < COUNTS; t++) tt_free(&y[t]), tt_free(&dx[t]), tt_free(&dw[t]), tt_free(&db[t]);
    tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&dy);
  }
}
END_TEST
#endif

START_TEST(blas_refuses_bad_args_like_the_reference) {
  tt x = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 4, 0), w = tt_new(BP_ABI_DTYPE_FP32, 6, 3, 3, 2, 0);
  tt b = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 1, 6, 0), y = tt_new(BP_ABI_DTYPE_FP32, 2, 5, 5, 6, 0);
  const conv_case cc = {5, 5, 4, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2};
  const bp_conv2d_attrs a = conv_attrs_of(&cc, 1, 0);
  const ops_call ok = {"conv2d.fwd", {&x, &w, &b}, {&y}, 3, 1, &a, sizeof a};
  char reason[256];
  ck_assert_int_eq(ops_kernel_supports(kernel_of("conv2d.fwd", GEMM_IMPL), &ok, reason, sizeof reason), 1);
  ops_call c = ok;
  bp_conv2d_attrs bad = a;
  c.attrs = &bad;
  bad.stride_h = 0;
  blas_expect_refused(&c, "stride");
  bad = a, bad.groups = 3;
  blas_expect_refused(&c, "groups 3 must divide");
  bad = a, bad.accumulate = 2;
  blas_expect_refused(&c, "accumulate");
  bad = a, bad.kernel_w = 2;
  blas_expect_refused(&c, "w: shape");
  c = ok, c.attrs = NULL;
  blas_expect_refused(&c, "attribute block");
  tt xi = tt_new(BP_ABI_DTYPE_INT32, 2, 5, 5, 4, 0);
  c = ok, c.in[0] = &xi;
  blas_expect_refused(&c, "x: dtype int32, expected fp32");
  c = ok, c.nin = 2;
  blas_expect_refused(&c, "expects 3 inputs");

  /* pointers: in place, missing, misaligned */
  const bp_abi_kernel *k = kernel_of("conv2d.fwd", GEMM_IMPL);
  const uint64_t need = k_workspace(k, &ok);
  void *ws = malloc((size_t)need);
  ck_assert_int_eq(ops_kernel_run(k, &ok, ws, need), BP_ABI_OK);
  tt ybad = y;
  c = ok, c.out[0] = &ybad;
  ybad.data = x.data; /* overlaps x */
  ck_assert_int_eq(ops_kernel_run(k, &c, ws, need), BP_ABI_ERR_INVALID);
  ybad.data = NULL;
  ck_assert_int_eq(ops_kernel_run(k, &c, ws, need), BP_ABI_ERR_INVALID);
  ybad.data = (char *)y.data + 2;
  ck_assert_int_eq(ops_kernel_run(k, &c, ws, need), BP_ABI_ERR_INVALID);
  free(ws);

  /* fc too */
  tt fx = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 5, 0), fw = tt_new(BP_ABI_DTYPE_FP32, 4, 1, 1, 6, 0);
  tt fy = tt_new(BP_ABI_DTYPE_FP32, 3, 1, 1, 4, 0);
  const bp_fc_attrs fa = {0, 0};
  const ops_call fc = {"fc.fwd", {&fx, &fw}, {&fy}, 2, 1, &fa, sizeof fa};
  blas_expect_refused(&fc, "w: shape");
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y), tt_free(&xi);
  tt_free(&fx), tt_free(&fw), tt_free(&fy);
}
END_TEST

/* ---- descriptors and selection ------------------------------------------- */

static const char *const blas_ops[] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter",
                                       "fc.fwd",     "fc.bwd_data",     "fc.bwd_filter"};

START_TEST(descriptors) {
  for (int i = 0; i < 6; i++) {
    const bp_abi_kernel *k = kernel_of(blas_ops[i], GEMM_IMPL);
    ck_assert_str_eq(k->device, "cpu");
    ck_assert_int_eq(k->priority, GEMM_PRIORITY);
    ck_assert_uint_eq(k->dtypes, BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) |
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16)); /* FP16: the adapter */
    ck_assert(k->flags & BP_ABI_KERNEL_DETERMINISTIC);
    ck_assert(!(k->flags & BP_ABI_KERNEL_REFERENCE));
    ck_assert(!(k->flags & BP_ABI_KERNEL_IN_PLACE));
    ck_assert_ptr_nonnull(k->supports);
    ck_assert_ptr_nonnull(k->run);
    const bp_registered_kernel *d = bp_registry_default_kernel(both_modules(), blas_ops[i], "cpu");
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->kernel.impl, GEMM_IMPL);
  }
  /* the module is recorded as loaded, with a build id */
  const bp_registry *r = both_modules();
  int found = 0;
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (strcmp(rec->name, GEMM_MODULE) != 0) continue;
    found = 1;
    ck_assert_int_eq(rec->outcome, BP_LOAD_LOADED);
    ck_assert_int_eq((int)strlen(rec->build_id), 16);
  }
  ck_assert(found);
}
END_TEST

/* The args of one node of `op` on small compact tensors (no pointers). */
typedef struct node {
  tt t[5];
  int nt;
  ops_call call;
  bp_conv2d_attrs ca;
  bp_fc_attrs fa;
} node;

static void node_make(node *nd, const char *op, int padded_filter) {
  memset(nd, 0, sizeof *nd);
  const int conv = strncmp(op, "conv2d.", 7) == 0;
  const int pass = strstr(op, "bwd_data") ? 1 : strstr(op, "bwd_filter") ? 2 : 0;
  tt *x = &nd->t[0], *w = &nd->t[1], *y = &nd->t[2];
  if (conv) {
    *x = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 3, 0);
    *w = tt_new(BP_ABI_DTYPE_FP32, 4, 3, 3, 3, padded_filter ? 1 : 0);
    *y = tt_new(BP_ABI_DTYPE_FP32, 2, 6, 6, 4, 0);
    const conv_case cc = {6, 6, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    nd->ca = conv_attrs_of(&cc, 0, 0);
    nd->call.attrs = &nd->ca, nd->call.attr_size = sizeof nd->ca;
  } else {
    *x = tt_new(BP_ABI_DTYPE_FP32, 2, 3, 3, 2, 0);
    *w = tt_new(BP_ABI_DTYPE_FP32, 5, 1, 1, 18, 0);
    *y = tt_new(BP_ABI_DTYPE_FP32, 2, 1, 1, 5, 0);
    nd->call.attrs = &nd->fa, nd->call.attr_size = sizeof nd->fa;
  }
  nd->nt = 3;
  nd->call.op = op;
  nd->call.nin = 2, nd->call.nout = 1;
  switch (pass) {
    case 0: nd->call.in[0] = x, nd->call.in[1] = w, nd->call.out[0] = y; break;
    case 1: nd->call.in[0] = y, nd->call.in[1] = w, nd->call.out[0] = x; break;
    default: nd->call.in[0] = x, nd->call.in[1] = y, nd->call.out[0] = w; break;
  }
}

static void node_free(node *nd) {
  for (int i = 0; i < nd->nt; i++) tt_free(&nd->t[i]);
}

/* The impl bp_registry_select picks (pins NULL: the registry's, none here). */
static const char *selected(const char *op, const char *pins, int padded_filter, char *report,
                            size_t report_size) {
  both_modules();
  node nd;
  node_make(&nd, op, padded_filter);
  const char *impl = ops_selected_impl(&nd.call, pins, report, report_size);
  node_free(&nd);
  return impl;
}

START_TEST(select_prefers_blas_and_pins_override) {
  for (int i = 0; i < 6; i++) ck_assert_str_eq(selected(blas_ops[i], NULL, 0, NULL, 0), GEMM_IMPL);

  /* a pin of one op to the reference; the others keep blas */
  static const char *const conv_ref = "conv2d.fwd=reference";
  ck_assert_str_eq(selected("conv2d.fwd", conv_ref, 0, NULL, 0), "reference");
  ck_assert_str_eq(selected("conv2d.bwd_data", conv_ref, 0, NULL, 0), GEMM_IMPL);
  ck_assert_str_eq(selected("fc.fwd", conv_ref, 0, NULL, 0), GEMM_IMPL);
  /* with globs */
  ck_assert_str_eq(selected("fc.bwd_filter", "fc.*=reference", 0, NULL, 0), "reference");
  ck_assert_str_eq(selected("conv2d.fwd", "fc.*=reference", 0, NULL, 0), GEMM_IMPL);
  ck_assert_str_eq(selected("conv2d.bwd_filter", "conv2d.*@cpu=reference", 0, NULL, 0),
                   "reference");

  /* a node the blas kernel refuses goes to the reference, and the report
   * says why */
  char report[2048] = "";
  ck_assert_str_eq(selected("conv2d.fwd", NULL, 1, report, sizeof report), "reference");
  ck_assert_msg(strstr(report, "reference kernel serves") != NULL, "report: %s", report);
}
END_TEST

/* ---- which OpenBLAS kernel set the module loads ---------------------------- */
#ifndef GEMM_DNNL

/* OpenBLAS's name for the kernel set it runs, or NULL when this process
 * had OpenBLAS loaded before the test (CK_FORK=no: the choice was made
 * then). Loads the BLAS module. */
static const char *openblas_core(void) {
  if (dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD)) return NULL;
  both_modules();
  void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(lib != NULL, "the BLAS module did not load OpenBLAS");
  char *(*corename)(void) = NULL;
  void *sym = dlsym(lib, "openblas_get_corename");
  ck_assert_msg(sym != NULL, "no openblas_get_corename");
  memcpy(&corename, &sym, sizeof corename);
  return corename();
}

/* The module names the core from the CPU's features (Debian's OpenBLAS
 * 0.3.21 falls back to Prescott on CPUs newer than it knows) and leaves the
 * environment as it was. */
START_TEST(openblas_core_follows_the_cpu) {
  unsetenv("OPENBLAS_CORETYPE");
  const char *core = openblas_core();
  if (!core) {
    fprintf(stderr, "skipped: OpenBLAS was loaded before this test (CK_FORK=no)\n");
    return;
  }
  __builtin_cpu_init();
  const char *want = NULL;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (want) ck_assert_msg(strcasecmp(core, want) == 0, "core %s, want %s", core, want);
  ck_assert_msg(getenv("OPENBLAS_CORETYPE") == NULL, "OPENBLAS_CORETYPE left set");
}
END_TEST

/* A user's OPENBLAS_CORETYPE wins and stays set. */
START_TEST(openblas_core_from_the_environment) {
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  const char *core = openblas_core();
  if (!core) {
    fprintf(stderr, "skipped: OpenBLAS was loaded before this test (CK_FORK=no)\n");
    return;
  }
  ck_assert_msg(strcasecmp(core, "Prescott") == 0, "core %s, want Prescott", core);
  ck_assert_str_eq(getenv("OPENBLAS_CORETYPE"), "Prescott");
  unsetenv("OPENBLAS_CORETYPE");
}
END_TEST
#endif /* GEMM_DNNL */

#ifdef GEMM_DNNL
/* Without its library the module refuses to load, saying why, and
 * registers nothing (the OpenBLAS or reference kernels then serve). */
START_TEST(dnnl_module_refuses_without_onednn) {
  static const char *const missing[] = {"dnnl_library=/nonexistent/libdnnl.so.2"};
  bp_registry_options ro;
  bp_registry_options_init(&ro);
  ro.module_options = missing;
  ro.module_option_count = 1;
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create_with(&ro, &r), BP_OK);
  ck_assert_int_ne(bp_registry_load(r, BP_OPS_BLAS_PATH), BP_OK);
  ck_assert_msg(strstr(bp_last_error(), "cannot load oneDNN") &&
                    strstr(bp_last_error(), "/nonexistent/libdnnl.so.2"),
                "error: %s", bp_last_error());
  ck_assert_ptr_null(bp_registry_default_kernel(r, "fc.fwd", "cpu"));
  bp_registry_destroy(r);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("ops_" GEMM_IMPL);
  TCase *tc = tcase_create(GEMM_IMPL);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, conv_chunks_and_is_deterministic);
  tcase_add_test(tc, concurrent_ranks_get_the_same_bits);
  tcase_add_test(tc, conv_refuses_padded_filters);
  tcase_add_test(tc, conv_refuses_uneven_rows);
  tcase_add_test(tc, fc_refuses_padded_feature_maps);
  tcase_add_test(tc, conv_run_needs_its_workspace);
  tcase_add_test(tc, fc_pads_1k_leading_dimensions_with_the_same_bits);
#ifdef GEMM_DNNL /* OpenBLAS threads by its own rule (blas-impl.h) */
  tcase_add_test(tc, small_gemms_get_the_same_bits_on_any_thread_count);
#endif
  tcase_add_test(tc, blas_refuses_bad_args_like_the_reference);
  tcase_add_test(tc, descriptors);
  tcase_add_test(tc, select_prefers_blas_and_pins_override);
#ifndef GEMM_DNNL
  tcase_add_test(tc, openblas_core_follows_the_cpu);
  tcase_add_test(tc, openblas_core_from_the_environment);
#else
  tcase_add_test(tc, dnnl_module_refuses_without_onednn);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
