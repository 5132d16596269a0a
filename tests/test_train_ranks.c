/* Ranks as threads (train.h: options.ranks; the all-reduce kernels
 * themselves are tested in test_allreduce): an MLP trained on 2
 * ranks ends within a stated tolerance of 1 rank at the same global batch;
 * with batch norm, all ranks hold bit-identical state after every step and
 * two runs with the same seed are bit-identical. The same with global
 * batches that split unevenly over the ranks, a rank with no sample in the
 * epoch's last step included, and each rank share's variant scaled by the
 * global batch. Data: small generated MNIST-format sets (run_util).
 * Built a second time as test_train_ranks_cuda (BP_TEST_CUDA): the ranks
 * on the cuda device, all on GPU 0 by default (the device-memory
 * collectives; BP_TEST_DEVICES="0,1" puts them on GPUs in turn, NCCL when
 * they differ), TF32 off, every test alike (the CLI one runs on the cpu).
 * Exits 77 without a GPU. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blueprint/comm.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/train.h"
#include "run_util.h"
#include "test_env.h"
#ifdef BP_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- training ----------------------------------------------------------------- */

static const char bn_model[] =
    TOY_BN_MODEL_LAYERS
    "train: {batch: 50, eval_batch: 40, epochs: 2, lr: 0.02}\n";

/* 260 = 5 batches of 50 + one of 10; 4 of 64 + 4 */
static toy_env env_open(void) { return toy_env_open(bn_model, 260, 60, 3); }

/* The rank state compared across ranks: every FP32 tensor of the regions
 * B (BN statistics) through V (optimizer moments); not R (each rank's own
 * loss, summed when read) and not G: under the sharded update (graph.h)
 * each rank holds the gradient sum of its own chunks only. The moments are
 * gathered first (on_step saves a checkpoint). */
static int compared(const bp_dtensor *d) {
  return d->dtype == BP_DTYPE_FP32 && d->region <= BP_REGION_V_CONV_DEEP &&
         d->region != BP_REGION_R &&
         !(d->region >= BP_REGION_G_BN_BIAS && d->region <= BP_REGION_G_CONV_DEEP);
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
  const char *save_path; /* a checkpoint written every step: it gathers the moments */
} step_check;

/* Every step: every rank's state has rank 0's bits. */
static void on_step(void *user, const bp_train_progress *p) {
  step_check *c = user;
  if (!c->t) return;
  ck_assert_msg(bp_trainer_save(c->t, c->save_path) == BP_OK, "%s", bp_last_error());
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

/* The report of the last epoch a run trained (on_epoch of bp_trainer_train). */
static void keep_report(void *user, const bp_epoch_report *r) { *(bp_epoch_report *)user = *r; }

/* Trains `model` on `data` for `epochs` at global batch `batch` over
 * `ranks` ranks, seed 5; with `check`, every step is checked; with `last`,
 * the last epoch's report is written there. */
/* Options of the next train_ex: optimizer (-1: the model's), replicated
 * update, checkpoint file. */
static int next_optimizer = -1, next_replicate;
static const char *next_checkpoint;

static bp_trainer *train_ex(const char *model, const char *data, int ranks, int64_t batch,
                            int64_t epochs, step_check *check, bp_epoch_report *last) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.optimizer = next_optimizer;
  o.replicate_update = next_replicate;
  o.checkpoint_path = next_checkpoint;
  o.data_dir = data;
#ifdef BP_TEST_CUDA
  o.device = "cuda";
  o.devices = getenv("BP_TEST_DEVICES") ? getenv("BP_TEST_DEVICES") : "0";
#endif
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
  st = bp_trainer_train(t, last ? keep_report : NULL, last);
  ck_assert_msg(st == BP_OK, "train, %d ranks: %s", ranks, bp_last_error());
  ck_assert_int_eq(bp_trainer_world(t), ranks);
  return t;
}

static bp_trainer *train(const char *model, const char *data, int ranks, int64_t batch,
                         int64_t epochs, step_check *check) {
  return train_ex(model, data, ranks, batch, epochs, check, NULL);
}

/* The largest difference |a - b| / (1 + |a|) over every FP32 parameter
 * (W regions) of two trainers of the same plan layout; each must have
 * moved from 0 somewhere. */
static double max_param_diff(const bp_trainer *one, const bp_trainer *other, int *params_out) {
  const bp_plan *p = bp_trainer_plan(one);
  double worst = 0;
  int params = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->dtype != BP_DTYPE_FP32 || d->region < BP_REGION_W_BN_BIAS ||
        d->region > BP_REGION_W_CONV_DEEP)
      continue;
    const uint64_t n = bp_dtensor_host_elems(d);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    ck_assert(a && b);
    ck_assert_int_eq(bp_trainer_read_tensor(one, d->name, a, n), BP_OK);
    ck_assert_int_eq(bp_trainer_read_tensor(other, d->name, b, n), BP_OK);
    int moved = 0;
    for (uint64_t i = 0; i < n; i++) {
      const double diff = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)a[i]));
      if (!(diff <= worst)) worst = diff; /* NaN wins */
      moved |= a[i] != 0.0f;
    }
    ck_assert_msg(moved, "%s never moved", d->name);
    params++;
    free(a);
    free(b);
  }
  *params_out = params;
  return worst;
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
  int params = 0;
  const double worst = max_param_diff(one, two, &params);
  ck_assert_int_ge(params, 6); /* fc1..fc3, weights and biases */
  printf("mlp, 1 vs 2 ranks after 10 steps: largest relative difference %.3g\n", worst);
  ck_assert_msg(worst <= 1e-5, "1 vs 2 ranks: largest relative difference %g > 1e-5", worst);
  bp_trainer_destroy(one);
  bp_trainer_destroy(two);
  toy_env_close(&e);
}
END_TEST

/* Batch norm (each rank normalizes its own samples; running statistics
 * averaged): `ranks` ranks at global batch `batch` for 2 epochs (`steps`
 * in all) and 5 ranks at `batch5` for 1 epoch (`steps5`) hold
 * bit-identical state on every rank after every step, and two runs of
 * `ranks` with the same seed end with the same bits. */
static void check_bn_bits(int ranks, int64_t batch, int steps, int64_t batch5, int steps5) {
  toy_env e = env_open();
  char *gathered = path_in(e.dir, "gathered.ckpt");
  step_check c = {NULL, 0, gathered};
  bp_trainer *a = train(e.model, e.data, ranks, batch, 2, &c);
  ck_assert_int_eq(c.steps, steps);
  step_check c5 = {NULL, 0, gathered};
  bp_trainer *five = train(e.model, e.data, 5, batch5, 1, &c5);
  ck_assert_int_eq(c5.steps, steps5);
  bp_trainer_destroy(five);
  bp_trainer *b = train(e.model, e.data, ranks, batch, 2, NULL);
  ck_assert_int_eq(bp_trainer_save(b, gathered), BP_OK); /* b's moments gathered, as a's */
  uint64_t na, nb;
  float *sa = read_state(a, 0, &na), *sb = read_state(b, 0, &nb);
  ck_assert_int_eq(na, nb);
  ck_assert_msg(memcmp(sa, sb, (size_t)na * sizeof *sa) == 0,
                "two %d-rank runs with seed 5 ended with different bits", ranks);
  free(sa);
  free(sb);
  bp_trainer_destroy(a);
  bp_trainer_destroy(b);
  free(gathered);
  toy_env_close(&e);
}

/* Even splits: 2 ranks at batch 50 (25 + 25, the last batch of 10: 5 + 5),
 * 5 ranks at batch 50. */
START_TEST(bn_ranks_bit_identical_every_step) { check_bn_bits(2, 50, 12, 50, 6); }
END_TEST

/* Uneven splits (model.h, data.h): no batch norm, 3 ranks of 22+21+21 at
 * global batch 64 over 194 = 3*64 + 2 images, so each epoch's last batch
 * of 2 runs 1+1+0 (rank 2 takes the step with no sample): the same
 * gradient of the same 64 (or 2) samples as 1 rank, summed in another
 * order. After 2 epochs of 4 steps the parameters agree to within 1e-5 *
 * (1 + |w|) per element (measured: about 5e-8), the last epoch's summed
 * train loss to within 1e-5 relative and its correct count exactly. */
START_TEST(mlp_three_ranks_uneven_match_one) {
  toy_env e = toy_env_open(bn_model, 194, 60, 3);
  bp_epoch_report r1, r3;
  bp_trainer *one = train_ex(e.mlp, e.data, 1, 64, 2, NULL, &r1);
  bp_trainer *three = train_ex(e.mlp, e.data, 3, 64, 2, NULL, &r3);
  ck_assert_int_eq(bp_trainer_state(one).global_step, 8);
  ck_assert_int_eq(bp_trainer_state(three).global_step, 8);
  ck_assert_int_eq(r1.samples, 194);
  ck_assert_int_eq(r3.samples, 194);
  int params = 0;
  const double worst = max_param_diff(one, three, &params);
  ck_assert_int_ge(params, 6); /* fc1..fc3, weights and biases */
  printf("mlp, 1 vs 3 uneven ranks after 8 steps: largest relative difference %.3g\n", worst);
  ck_assert_msg(worst <= 1e-5, "1 vs 3 ranks: largest relative difference %g > 1e-5", worst);
  ck_assert_msg(fabs(r1.train_loss - r3.train_loss) <= 1e-5 * fabs(r1.train_loss),
                "train loss: 1 rank %.9g, 3 ranks %.9g", r1.train_loss, r3.train_loss);
  ck_assert_msg(r1.train_accuracy == r3.train_accuracy, "train accuracy: 1 rank %.9g, 3 ranks %.9g",
                r1.train_accuracy, r3.train_accuracy);
  bp_trainer_destroy(one);
  bp_trainer_destroy(three);
  toy_env_close(&e);
}
END_TEST

/* Batch norm with uneven splits: 3 ranks at batch 50 (17+17+16, the last
 * batch of 10: 4+3+3) and 5 ranks at batch 64 (13+13+13+13+12, the last
 * batch of 4: 1+1+1+1+0, rank 4 idle) hold bit-identical parameters,
 * optimizer state and BN statistics after every step; two 3-rank runs with
 * the same seed end with the same bits. */
START_TEST(bn_uneven_ranks_bit_identical_every_step) { check_bn_bits(3, 50, 12, 64, 5); }
END_TEST

/* graph.h: the sharded update (reduce_scatter, each rank's own chunk
 * updated, all_gather) gives the bits of the replicated one (allreduce.sum,
 * every rank updating everything): after 2 epochs with batch norm, SGD and
 * AdamW, 2 ranks (even) and 3 (uneven, 17+17+16 and 4+3+3), the checkpoints
 * (every parameter, BN statistic, optimizer moment, counter) are equal
 * byte for byte. */
START_TEST(sharded_update_matches_replicated) {
  toy_env e = env_open();
  char *sharded = path_in(e.dir, "sharded.ckpt"), *replicated = path_in(e.dir, "replicated.ckpt");
  static const int optimizers[] = {BP_OPT_SGD, BP_OPT_ADAMW};
  for (int ranks = 2; ranks <= 3; ranks++)
    for (int k = 0; k < 2; k++) {
      next_optimizer = optimizers[k];
      next_checkpoint = sharded;
      next_replicate = 0;
      bp_trainer_destroy(train(e.model, e.data, ranks, 50, 2, NULL));
      next_checkpoint = replicated;
      next_replicate = 1;
      bp_trainer_destroy(train(e.model, e.data, ranks, 50, 2, NULL));
      ck_assert_msg(same_file(sharded, replicated),
                    "%d ranks, optimizer %d: sharded and replicated checkpoints differ", ranks,
                    optimizers[k]);
    }
  next_optimizer = -1;
  next_checkpoint = NULL;
  next_replicate = 0;
  free(sharded);
  free(replicated);
  toy_env_close(&e);
}
END_TEST

/* graph.h: every variant of a rank share scales the loss gradient by 1 /
 * the global batch of its step (B for "train" and "train_small", L for
 * "train_last" and "train_last_small"), never by its own batch times R. */
START_TEST(rank_variants_scale_by_global_batch) {
  bp_model *m = NULL;
  ck_assert_int_eq(bp_model_parse(bn_model, strlen(bn_model), "small.yaml", &m), BP_OK);
  bp_compile_options co = bp_compile_options_from_model(m);
  co.world = 3;
  co.batch = 64;
  co.train_size = 64 * 5 + 44; /* L = 44: 15 + 15 + 14 */
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &co, &p) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.world = 3;
  go.global_batch = 64;
  go.train_size = co.train_size;
  bp_graph *g = NULL;
  ck_assert_msg(bp_graph_build(m, p, &go, &g) == BP_OK, "%s", bp_last_error());
  static const struct {
    const char *name;
    int64_t batch, global;
  } want[] = {{"train", 22, 64}, {"train_small", 21, 64}, {"train_last", 15, 44},
              {"train_last_small", 14, 44}};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    const int v = bp_plan_find_variant(p, want[k].name);
    ck_assert_msg(v >= 0, "no variant '%s'", want[k].name);
    ck_assert_int_eq(bp_plan_variant(p, v)->batch, want[k].batch);
    ck_assert_int_eq(bp_graph_variant_global_batch(g, v), want[k].global);
    ck_assert_int_eq(bp_graph_node_count(g, v, BP_SEGMENT_LOSS), 1);
    const bp_node *n = bp_graph_node(g, v, BP_SEGMENT_LOSS, 0);
    ck_assert_str_eq(n->op, "softmax_ce.fwd_bwd");
    const float scale = (float)(1.0 / (double)want[k].global);
    ck_assert_msg(n->attrs.softmax_ce.grad_scale == scale, "%s: grad_scale %a, want %a",
                  want[k].name, (double)n->attrs.softmax_ce.grad_scale, (double)scale);
    /* the BN running statistics: the mean over the ranks */
    int bn_mean = 0;
    for (int i = 0; i < bp_graph_node_count(g, v, BP_SEGMENT_COMM); i++) {
      const bp_node *c = bp_graph_node(g, v, BP_SEGMENT_COMM, i);
      if (strstr(c->name, "allreduce B")) {
        bn_mean = 1;
        ck_assert(c->attrs.allreduce.scale == 1.0f / 3.0f);
      }
    }
    ck_assert(bn_mean);
  }
  bp_graph_destroy(g);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

/* The command line: --ranks 2 trains and prints the usual lines (and the
 * checkpoint of --replicate-update); eval and resume take its checkpoint
 * with the same --ranks. */
START_TEST(cli_ranks_two) {
  toy_env e = env_open();
  char *ck = path_in(e.dir, "r2.ckpt");
  run_result r =
      RUN("train", e.model, "--data", e.data, "--ranks", "2", "--epochs", "1", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "test accuracy"));
  run_free(&r);
  /* every rank updating everything: the same checkpoint, byte for byte */
  char *ck_rep = path_in(e.dir, "r2-replicated.ckpt");
  r = RUN("train", e.model, "--data", e.data, "--ranks", "2", "--epochs", "1", "--checkpoint",
          ck_rep, "--replicate-update");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert(same_file(ck, ck_rep));
  run_free(&r);
  free(ck_rep);
  r = RUN("eval", e.model, "--data", e.data, "--ranks", "2", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  r = RUN("train", e.model, "--data", e.data, "--ranks", "2", "--epochs", "2", "--resume", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  free(ck);
  /* an uneven split (batch 50: 17+17+16; the last 10: 4+3+3) trains */
  r = RUN("train", e.model, "--data", e.data, "--ranks", "3", "--epochs", "1");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "test accuracy"));
  run_free(&r);
  r = RUN("train", e.model, "--data", e.data, "--ranks", "65", "--epochs", "1");
  expect_one_line_error(&r, "blueprint train: ", "--ranks 65: must be in [1, 64]");
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

int main(void) {
#ifdef BP_TEST_CUDA
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
    return 77;
  }
  setenv("BP_TF32", "0", 1); /* 1 vs 2 ranks compare FP32 sums, not TF32 products */
#endif
  Suite *s = suite_create("train_ranks");
  TCase *tc = tcase_create("train_ranks");
  tcase_add_test(tc, mlp_two_ranks_match_one);
  tcase_add_test(tc, bn_ranks_bit_identical_every_step);
  tcase_add_test(tc, cli_ranks_two);
  tcase_add_test(tc, mlp_three_ranks_uneven_match_one);
  tcase_add_test(tc, bn_uneven_ranks_bit_identical_every_step);
  tcase_add_test(tc, rank_variants_scale_by_global_batch);
  tcase_add_test(tc, sharded_update_matches_replicated);
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
#ifdef BP_TEST_CUDA
  srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork() */
#endif
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
