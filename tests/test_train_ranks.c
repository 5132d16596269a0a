/* Ranks as threads (train.h: options.ranks, comm.h): the deterministic
 * all-reduce gives every rank the bits of a reference sum in rank order,
 * for world sizes 1..8 and spans of 1 element to 4 MB; an MLP trained on 2
 * ranks ends within a stated tolerance of 1 rank at the same global batch;
 * with batch norm, all ranks hold bit-identical state after every step and
 * two runs with the same seed are bit-identical. Data: small generated
 * MNIST-format sets (run_util). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blueprint/comm.h"
#include "blueprint/plan.h"
#include "blueprint/train.h"
#include "run_util.h"

/* ---- all-reduce ------------------------------------------------------------ */

/* A value of rank r, element i: varied magnitudes and signs, so the sum's
 * rounding depends on its order. */
static float value_of(int r, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const float m = (float)(x & 0xFFFFFF) / (float)0x1000000 - 0.5f; /* [-0.5, 0.5) */
  const int e = (int)((x >> 24) % 24) - 12;
  return ldexpf(m, e);
}

typedef struct ar_job {
  bp_comm *comm;
  int rank;
  float *data;
  uint64_t count;
  float scale;
  int repeats;
} ar_job;

static void *ar_thread(void *arg) {
  ar_job *j = arg;
  for (int k = 0; k < j->repeats; k++) {
    if (k > 0) /* the next round starts from the rank's values again */
      for (uint64_t i = 0; i < j->count; i++) j->data[i] = value_of(j->rank, i);
    bp_comm_barrier(j->comm);
    bp_comm_allreduce_f32(j->comm, j->rank, j->data, j->count, j->scale);
  }
  return NULL;
}

static void check_allreduce(int world, uint64_t count, float scale) {
  bp_comm *comm = NULL;
  ck_assert_int_eq(bp_comm_create(world, &comm), BP_OK);
  ck_assert_int_eq(bp_comm_world(comm), world);
  float *bufs[8];
  ar_job jobs[8];
  pthread_t th[8];
  for (int r = 0; r < world; r++) {
    bufs[r] = malloc((size_t)(count ? count : 1) * sizeof(float));
    ck_assert_ptr_nonnull(bufs[r]);
    for (uint64_t i = 0; i < count; i++) bufs[r][i] = value_of(r, i);
    jobs[r] = (ar_job){comm, r, bufs[r], count, scale, 2};
  }
  for (int r = 1; r < world; r++)
    ck_assert_int_eq(pthread_create(&th[r], NULL, ar_thread, &jobs[r]), 0);
  ar_thread(&jobs[0]);
  for (int r = 1; r < world; r++) pthread_join(th[r], NULL);
  for (uint64_t i = 0; i < count; i++) {
    float s = value_of(0, i);
    for (int r = 1; r < world; r++) s += value_of(r, i);
    s *= scale;
    for (int r = 0; r < world; r++)
      if (memcmp(&bufs[r][i], &s, sizeof s) != 0)
        ck_abort_msg("world %d, count %llu: rank %d element %llu is %a, the reference %a", world,
                     (unsigned long long)count, r, (unsigned long long)i, (double)bufs[r][i],
                     (double)s);
  }
  for (int r = 0; r < world; r++) free(bufs[r]);
  bp_comm_destroy(comm);
}

START_TEST(allreduce_matches_rank_order_sum) {
  /* odd sizes, sizes below the world, a region-sized span, 4 MB */
  const uint64_t small[] = {0, 1, 2, 3, 7, 8, 9, 255, 256, 1023, 1025, 4097, 65537};
  for (int world = 1; world <= 8; world++) {
    for (size_t k = 0; k < sizeof small / sizeof small[0]; k++)
      check_allreduce(world, small[k], k % 2 ? 1.0f : 1.0f / (float)world);
    if (world == 1 || world == 2 || world == 3 || world == 8)
      check_allreduce(world, (1u << 20) + 3, 1.0f); /* 4 MB and 12 bytes */
  }
}
END_TEST

START_TEST(comm_refuses_bad_worlds) {
  bp_comm *c = NULL;
  ck_assert_int_eq(bp_comm_create(0, &c), BP_ERR_INVALID);
  ck_assert_int_eq(bp_comm_create(BP_COMM_MAX_WORLD + 1, &c), BP_ERR_INVALID);
  ck_assert_ptr_null(c);
  bp_comm_destroy(NULL);
}
END_TEST

/* ---- training ----------------------------------------------------------------- */

static const char bn_model[] =
    "name: small\n"
    "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
    "layers:\n"
    "  - {type: conv, name: conv1, filters: 4, kernel: 3, pad: 1, bias: false}\n"
    "  - {type: batchnorm, name: bn1}\n"
    "  - {type: relu, name: relu1}\n"
    "  - {type: maxpool, name: pool1, kernel: 2}\n"
    "  - {type: fc, name: fc, units: 10}\n"
    "  - {type: softmax_ce, name: loss, label_smoothing: 0.1}\n"
    "train: {batch: 50, eval_batch: 40, epochs: 2, lr: 0.02}\n";

/* 260 = 5 batches of 50 + one of 10; 4 of 64 + 4 */
static toy_env env_open(void) { return toy_env_open(bn_model, 260, 60, 3); }

/* The rank state compared across ranks: every FP32 tensor of the regions
 * B (BN statistics) through V (optimizer moments), gradients included;
 * not R (each rank's own loss, summed when read). */
static int compared(const bp_dtensor *d) {
  return d->dtype == BP_DTYPE_FP32 && d->region <= BP_REGION_V_CONV_DEEP &&
         d->region != BP_REGION_R;
}

/* All compared tensors of `rank`, concatenated (malloc'ed); *n_out floats. */
static float *read_state(const bp_trainer *t, int rank, uint64_t *n_out) {
  const bp_plan *p = bp_trainer_plan(t);
  uint64_t n = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (compared(d)) n += bp_dtensor_host_elems(d);
  }
  float *all = malloc((size_t)(n ? n : 1) * sizeof *all);
  ck_assert_ptr_nonnull(all);
  uint64_t at = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (!compared(d)) continue;
    const uint64_t k = bp_dtensor_host_elems(d);
    ck_assert_int_eq(bp_trainer_read_rank_tensor(t, rank, d->name, all + at, k), BP_OK);
    at += k;
  }
  *n_out = n;
  return all;
}

typedef struct step_check {
  bp_trainer *t;
  int steps;
} step_check;

/* Every step: every rank's state has rank 0's bits. */
static void on_step(void *user, const bp_train_progress *p) {
  step_check *c = user;
  (void)p;
  if (!c->t) return;
  uint64_t n0, n;
  float *s0 = read_state(c->t, 0, &n0);
  for (int r = 1; r < bp_trainer_world(c->t); r++) {
    float *s = read_state(c->t, r, &n);
    ck_assert_int_eq(n, n0);
    ck_assert_msg(memcmp(s, s0, (size_t)n * sizeof *s) == 0,
                  "after global step %lld rank %d differs from rank 0", (long long)p->global_step,
                  r);
    free(s);
  }
  free(s0);
  c->steps++;
}

static bp_trainer *train(const char *model, const char *data, int ranks, int64_t batch,
                         int64_t epochs, step_check *check) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.data_dir = data;
  o.ranks = ranks;
  o.batch = batch;
  o.epochs = epochs;
  o.seed = 5;
  o.test_limit = 40;
  if (check) {
    o.on_progress = on_step;
    o.progress_user = check;
  }
  bp_trainer *t = NULL;
  bp_status st = bp_trainer_create_from_file(model, &o, &t);
  ck_assert_msg(st == BP_OK, "create, %d ranks: %s", ranks, bp_last_error());
  if (check) check->t = t;
  st = bp_trainer_train(t, NULL, NULL);
  ck_assert_msg(st == BP_OK, "train, %d ranks: %s", ranks, bp_last_error());
  ck_assert_int_eq(bp_trainer_world(t), ranks);
  return t;
}

/* No batch norm: 2 ranks of 32 compute the gradient of the same 64 samples
 * as 1 rank of 64, summed in another order; after 2 epochs of 5 steps (the
 * last batch 4 samples, 2 per rank) the parameters agree to within
 * 1e-5 * (1 + |w|) per element (measured: about 4e-8). */
START_TEST(mlp_two_ranks_match_one) {
  toy_env e = env_open();
  bp_trainer *one = train(e.mlp, e.data, 1, 64, 2, NULL);
  bp_trainer *two = train(e.mlp, e.data, 2, 64, 2, NULL);
  ck_assert_int_eq(bp_trainer_state(one).global_step, 10);
  ck_assert_int_eq(bp_trainer_state(two).global_step, 10);
  const bp_plan *p1 = bp_trainer_plan(one);
  int weights = 0;
  double worst = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p1); id++) {
    const bp_dtensor *d = bp_plan_tensor(p1, 0, id);
    if (d->dtype != BP_DTYPE_FP32 || d->region < BP_REGION_W_BN_BIAS ||
        d->region > BP_REGION_W_CONV_DEEP)
      continue;
    const uint64_t n = bp_dtensor_host_elems(d);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    ck_assert_int_eq(bp_trainer_read_tensor(one, d->name, a, n), BP_OK);
    ck_assert_int_eq(bp_trainer_read_tensor(two, d->name, b, n), BP_OK);
    int moved = 0;
    for (uint64_t i = 0; i < n; i++) {
      const double diff = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)a[i]));
      if (diff > worst) worst = diff;
      ck_assert_msg(diff <= 1e-5, "%s[%llu]: 1 rank %.9g, 2 ranks %.9g", d->name,
                    (unsigned long long)i, (double)a[i], (double)b[i]);
      moved |= a[i] != 0.0f;
    }
    ck_assert(moved);
    weights++;
    free(a);
    free(b);
  }
  ck_assert_int_ge(weights, 6); /* fc1..fc3, weights and biases */
  printf("mlp, 1 vs 2 ranks after 10 steps: largest relative difference %.3g\n", worst);
  bp_trainer_destroy(one);
  bp_trainer_destroy(two);
  toy_env_close(&e);
}
END_TEST

/* Batch norm (each rank normalizes its own samples; running statistics
 * averaged): all ranks bit-identical after every step, for 2 and 5 ranks;
 * the same seed twice gives the same bits. */
START_TEST(bn_ranks_bit_identical_every_step) {
  toy_env e = env_open();
  step_check c = {NULL, 0};
  bp_trainer *a = train(e.model, e.data, 2, 50, 2, &c);
  ck_assert_int_eq(c.steps, 12);
  step_check c5 = {NULL, 0};
  bp_trainer *five = train(e.model, e.data, 5, 50, 1, &c5);
  ck_assert_int_eq(c5.steps, 6);
  bp_trainer_destroy(five);
  bp_trainer *b = train(e.model, e.data, 2, 50, 2, NULL);
  uint64_t na, nb;
  float *sa = read_state(a, 0, &na), *sb = read_state(b, 0, &nb);
  ck_assert_int_eq(na, nb);
  ck_assert_msg(memcmp(sa, sb, (size_t)na * sizeof *sa) == 0,
                "two 2-rank runs with seed 5 ended with different bits");
  free(sa);
  free(sb);
  bp_trainer_destroy(a);
  bp_trainer_destroy(b);
  toy_env_close(&e);
}
END_TEST

/* The command line: --ranks 2 trains and prints the usual lines; eval and
 * resume take its checkpoint with the same --ranks. */
START_TEST(cli_ranks_two) {
  toy_env e = env_open();
  char *ck = path_in(e.dir, "r2.ckpt");
  run_result r =
      RUN("train", e.model, "--data", e.data, "--ranks", "2", "--epochs", "1", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "test accuracy"));
  run_free(&r);
  r = RUN("eval", e.model, "--data", e.data, "--ranks", "2", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  r = RUN("train", e.model, "--data", e.data, "--ranks", "2", "--epochs", "2", "--resume", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  free(ck);
  r = RUN("train", e.model, "--data", e.data, "--ranks", "3", "--epochs", "1");
  expect_one_line_error(&r, "blueprint train: ", "must both divide by the rank count");
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_ranks");
  TCase *tc = tcase_create("train_ranks");
  tcase_add_test(tc, allreduce_matches_rank_order_sum);
  tcase_add_test(tc, comm_refuses_bad_worlds);
  tcase_add_test(tc, mlp_two_ranks_match_one);
  tcase_add_test(tc, bn_ranks_bit_identical_every_step);
  tcase_add_test(tc, cli_ranks_two);
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
