/* attention.fwd / attention.bwd: the reference against a case worked by
 * hand and against a naive implementation written here from the spec
 * (causal and not, heads 1 and 4, T = 49), its backward against central
 * finite differences, accumulate, the cpu kernel bit for bit against the
 * reference at T = 49, and the refusals (channels not 3D, heads not
 * dividing D). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_ref_util.h"

/* run() of `impl`'s kernel with its workspace, on the calling thread */
static void run_impl(const char *impl, const ops_call *c) {
  ops_node n;
  ops_node_open(&n, impl, c, NULL);
  ops_node_run(&n);
  ops_node_close(&n);
}

/* The spec, naively: for each (n, head, t) the softmax over keys of
 * q.k/sqrt(dh), then the weighted sum of v; in double. */
static void naive_forward(const tt *qkv, int64_t heads, int causal, double *y, double *lse) {
  const int64_t N = qkv->d.shape[0], H = qkv->d.shape[1], W = qkv->d.shape[2];
  const int64_t T = H * W, D = qkv->d.shape[3] / 3, dh = D / heads;
  double *s = malloc(sizeof(double) * (size_t)T);
  for (int64_t n = 0; n < N; n++)
    for (int64_t j = 0; j < heads; j++)
      for (int64_t t = 0; t < T; t++) {
        double m = -INFINITY;
        for (int64_t u = 0; u < T; u++) {
          s[u] = -INFINITY;
          if (causal && u > t) continue;
          double dot = 0;
          for (int64_t c = 0; c < dh; c++)
            dot += (double)*tt_f(qkv, n, t / W, t % W, j * dh + c) *
                   *tt_f(qkv, n, u / W, u % W, D + j * dh + c);
          s[u] = dot / sqrt((double)dh);
          m = fmax(m, s[u]);
        }
        double z = 0;
        for (int64_t u = 0; u < T; u++) z += exp(s[u] - m);
        lse[(n * T + t) * heads + j] = m + log(z);
        for (int64_t c = 0; c < dh; c++) {
          double acc = 0;
          for (int64_t u = 0; u < T; u++)
            acc += exp(s[u] - m) / z * *tt_f(qkv, n, u / W, u % W, 2 * D + j * dh + c);
          y[(n * T + t) * D + j * dh + c] = acc;
        }
      }
  free(s);
}

START_TEST(by_hand) {
  /* one sample, two tokens, D = 2, one head: q0 = k0 = [1, 0], q1 = k1 =
   * [0, 1], v0 = [1, 2], v1 = [3, 4]; s = I / sqrt 2, so row t gives
   * weight p = e^a / (e^a + 1) (a = 1/sqrt 2) to key t and 1 - p to the
   * other; causal: token 0 sees itself only (y0 = v0, lse0 = a) */
  const double a = 1.0 / sqrt(2.0), p = exp(a) / (exp(a) + 1.0), lse = log(exp(a) + 1.0);
  for (int causal = 0; causal < 2; causal++) {
    tt qkv = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 6, 2), y = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 2, 1);
    tt l = tt_new(BP_ABI_DTYPE_FP32, 1, 1, 2, 1, 0);
    tt_set(&qkv, (const float[]){1, 0, 1, 0, 1, 2, 0, 1, 0, 1, 3, 4});
    const bp_attention_attrs at = {1, causal, 0};
    ops_call f = {"attention.fwd", {&qkv}, {&y, &l}, 1, 2, &at, sizeof at};
    run_impl("reference", &f);
    const float y0[2] = {causal ? 1.0f : (float)(p * 1 + (1 - p) * 3),
                         causal ? 2.0f : (float)(p * 2 + (1 - p) * 4)};
    const float y1[2] = {(float)((1 - p) * 1 + p * 3), (float)((1 - p) * 2 + p * 4)};
    ops_expect_close(&y, (const float[]){y0[0], y0[1], y1[0], y1[1]}, 1e-6, "y");
    ops_expect_close(&l, (const float[]){causal ? (float)a : (float)lse, (float)lse}, 1e-6, "lse");
    ck_assert(tt_padding_intact(&y) && tt_padding_intact(&qkv));
    tt_free(&qkv), tt_free(&y), tt_free(&l);
  }
}
END_TEST

/* against the naive spec at T = 49 (7x7), heads 1 and 4, causal or not */
START_TEST(matches_the_spec) {
  uint64_t rng = 11;
  for (int v = 0; v < 4; v++) {
    const int64_t heads = v < 2 ? 1 : 4, N = 3, D = 16;
    const int causal = v % 2;
    tt qkv = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, 3 * D, 3);
    tt y = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, D, 0), l = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, heads, 1);
    tt_rand(&qkv, &rng, -2, 2);
    const bp_attention_attrs at = {(int32_t)heads, causal, 0};
    ops_call f = {"attention.fwd", {&qkv}, {&y, &l}, 1, 2, &at, sizeof at};
    run_impl("reference", &f);
    double *ey = malloc(sizeof(double) * (size_t)tt_count(&y));
    double *el = malloc(sizeof(double) * (size_t)tt_count(&l));
    naive_forward(&qkv, heads, causal, ey, el);
    for (int64_t i = 0; i < tt_count(&y); i++)
      ck_assert_msg(fabs(*tt_at(&y, i) - ey[i]) <= 1e-6 * (1 + fabs(ey[i])),
                    "heads %lld causal %d y[%lld] %g, expected %g", (long long)heads, causal,
                    (long long)i, (double)*tt_at(&y, i), ey[i]);
    for (int64_t i = 0; i < tt_count(&l); i++)
      ck_assert(fabs(*tt_at(&l, i) - el[i]) <= 1e-6 * (1 + fabs(el[i])));
    ck_assert(tt_padding_intact(&qkv) && tt_padding_intact(&l));
    free(ey), free(el);
    tt_free(&qkv), tt_free(&y), tt_free(&l);
  }
}
END_TEST

/* ---- backward ------------------------------------------------------------- */

typedef struct fd_ctx {
  tt *qkv, *y, *l, *r;
  bp_attention_attrs at;
} fd_ctx;

static double fd_loss(void *p) {
  fd_ctx *c = p;
  ops_call f = {"attention.fwd", {c->qkv}, {c->y, c->l}, 1, 2, &c->at, sizeof c->at};
  run_impl("reference", &f);
  return ops_dot(c->r, c->y);
}

START_TEST(backward_matches_differences) {
  uint64_t rng = 5;
  for (int v = 0; v < 4; v++) {
    const int64_t heads = v < 2 ? 1 : 4, N = 2, D = 8;
    const bp_attention_attrs at = {(int32_t)heads, v % 2, 0};
    tt qkv = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, 3 * D, 2);
    tt y = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, D, 0), l = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, heads, 0);
    tt r = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, D, 1), dq = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, 3 * D, 1);
    tt_rand(&qkv, &rng, -1, 1);
    tt_rand(&r, &rng, -1, 1);
    fd_ctx c = {&qkv, &y, &l, &r, at};
    double *num = malloc(sizeof(double) * (size_t)tt_count(&qkv));
    ops_fd_grad(fd_loss, &c, &qkv, OPS_FD_H, num);
    fd_loss(&c); /* y and lse of the unperturbed qkv */
    ops_call b = {"attention.bwd", {&qkv, &y, &l, &r}, {&dq}, 4, 1, &at, sizeof at};
    run_impl("reference", &b);
    const double err = ops_grad_err(&dq, num);
    ck_assert_msg(err <= OPS_FD_TOL, "heads %lld causal %d: error %g", (long long)heads, v % 2,
                  err);
    ck_assert(tt_padding_intact(&dq));
    /* accumulate: dqkv += the same gradient */
    tt before = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, 3 * D, 0), acc = tt_new(BP_ABI_DTYPE_FP32, N, 2, 3, 3 * D, 0);
    tt_rand(&acc, &rng, -1, 1);
    tt_copy(&before, &acc);
    const bp_attention_attrs add = {(int32_t)heads, v % 2, 1};
    ops_call ba = {"attention.bwd", {&qkv, &y, &l, &r}, {&acc}, 4, 1, &add, sizeof add};
    run_impl("reference", &ba);
    ops_expect_accumulated(&acc, &before, &dq, "dqkv accumulated");
    free(num);
    tt *all[] = {&qkv, &y, &l, &r, &dq, &before, &acc};
    for (size_t i = 0; i < 7; i++) tt_free(all[i]);
  }
}
END_TEST

/* the cpu kernels give the reference's bits at the ViT's shape */
START_TEST(cpu_matches_reference_bits) {
  ops_registry_with(BP_OPS_CPU_PATH);
  uint64_t rng = 3;
  for (int causal = 0; causal < 2; causal++) {
    const int64_t N = 5, D = 64, heads = 4;
    const bp_attention_attrs at = {(int32_t)heads, causal, 0}, acc = {(int32_t)heads, causal, 1};
    tt qkv = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, 3 * D, 0), dy = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, D, 0);
    tt y[2], l[2], dq[2];
    tt_rand(&qkv, &rng, -2, 2);
    tt_rand(&dy, &rng, -1, 1);
    const char *impl[2] = {"reference", "cpu"};
    for (int k = 0; k < 2; k++) {
      y[k] = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, D, 0);
      l[k] = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, heads, 0);
      dq[k] = tt_new(BP_ABI_DTYPE_FP32, N, 7, 7, 3 * D, 0);
      ops_call f = {"attention.fwd", {&qkv}, {&y[k], &l[k]}, 1, 2, &at, sizeof at};
      run_impl(impl[k], &f);
      ops_call b = {"attention.bwd", {&qkv, &y[k], &l[k], &dy}, {&dq[k]}, 4, 1, &at, sizeof at};
      run_impl(impl[k], &b);
      ops_call ba = {"attention.bwd", {&qkv, &y[k], &l[k], &dy}, {&dq[k]}, 4, 1, &acc, sizeof acc};
      run_impl(impl[k], &ba);
    }
    ck_assert(ops_same_bits(&y[0], &y[1]));
    ck_assert(ops_same_bits(&l[0], &l[1]));
    ck_assert(ops_same_bits(&dq[0], &dq[1]));
    for (int k = 0; k < 2; k++) tt_free(&y[k]), tt_free(&l[k]), tt_free(&dq[k]);
    tt_free(&qkv), tt_free(&dy);
  }
}
END_TEST

START_TEST(refusals) {
  tt q = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 10, 0), y = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 3, 0);
  tt l = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 1, 0);
  const bp_attention_attrs one = {1, 0, 0};
  ops_call c = {"attention.fwd", {&q}, {&y, &l}, 1, 2, &one, sizeof one};
  ops_expect_refused(&c, "expected a multiple of 3");
  tt q2 = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 12, 0), y2 = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 4, 0);
  tt l3 = tt_new(BP_ABI_DTYPE_FP32, 1, 2, 2, 3, 0);
  const bp_attention_attrs three = {3, 0, 0}, bad_causal = {1, 2, 0};
  ops_call c2 = {"attention.fwd", {&q2}, {&y2, &l3}, 1, 2, &three, sizeof three};
  ops_expect_refused(&c2, "expected a divisor of D = 4");
  ops_call c3 = {"attention.fwd", {&q2}, {&y2, &l}, 1, 2, &bad_causal, sizeof bad_causal};
  ops_expect_refused(&c3, "causal");
  ops_call c4 = {"attention.fwd", {&q2}, {&y2, &l3}, 1, 2, &one, sizeof one};
  ops_expect_refused(&c4, "lse: shape");
  tt *all[] = {&q, &y, &l, &q2, &y2, &l3};
  for (size_t i = 0; i < 6; i++) tt_free(all[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_attention");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, by_hand);
  tcase_add_test(tc, matches_the_spec);
  tcase_add_test(tc, backward_matches_differences);
  tcase_add_test(tc, cpu_matches_reference_bits);
  tcase_add_test(tc, refusals);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
