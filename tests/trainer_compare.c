/* Making and comparing trainers' runs (trainer_compare.h). */
#include "trainer_compare.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/plan.h"
#include "run_util.h"
#include "test_env.h"

bp_trainer *make_trainer(const char *model, const char *data, const run_opts *r) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.registry = r->registry;
  o.kernels = r->kernels;
  o.device = r->device;
  o.devices = r->devices;
  o.ranks = r->ranks;
  o.amp = r->amp ? 1 : -1;
  o.no_graph = r->no_graph;
  o.streams = r->streams;
  o.data_dir = data;
  o.epochs = r->epochs ? r->epochs : 2;
  o.batch = r->batch ? r->batch : 8;
  o.eval_batch = r->eval_batch ? r->eval_batch : 8;
  o.train_limit = 100;
  o.test_limit = 30;
  o.seed = r->seed ? r->seed : 5;
  if (!r->constant_lr) o.schedule = BP_LR_COSINE;
  if (r->adamw) o.optimizer = BP_OPT_ADAMW;
  o.stop_after_steps = r->stop_after;
  o.log_every = r->log_every;
  o.checkpoint_path = r->checkpoint;
  o.resume_path = r->resume;
  o.metrics_path = r->metrics;
  bp_trainer *t = NULL;
  bp_status st = bp_trainer_create_from_file(model, &o, &t);
  ck_assert_msg(st == BP_OK, "create on %s: %s", r->device, bp_last_error());
  return t;
}

void keep(void *user, const bp_epoch_report *r) {
  reports *k = user;
  if (k->n < 4) k->r[k->n++] = *r;
}

void train_all(bp_trainer *t, reports *k) {
  ck_assert_msg(bp_trainer_train(t, keep, k) == BP_OK, "train: %s", bp_last_error());
}

/* a and b the same number, or both NaN */
static int same_or_nan(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

void same_reports(const reports *a, const reports *b) {
  ck_assert_int_eq(a->n, b->n);
  for (int i = 0; i < a->n; i++) {
    ck_assert_int_eq(a->r[i].samples, b->r[i].samples);
    ck_assert_msg(a->r[i].train_loss == b->r[i].train_loss, "epoch %d: train loss %.9g vs %.9g",
                  i + 1, a->r[i].train_loss, b->r[i].train_loss);
    ck_assert(a->r[i].train_accuracy == b->r[i].train_accuracy);
    ck_assert(isfinite(a->r[i].train_loss));
    ck_assert_msg(same_or_nan(a->r[i].test_loss, b->r[i].test_loss),
                  "epoch %d: test loss %.9g vs %.9g", i + 1, a->r[i].test_loss, b->r[i].test_loss);
    ck_assert(same_or_nan(a->r[i].test_accuracy, b->r[i].test_accuracy));
    ck_assert(a->r[i].loss_scale == b->r[i].loss_scale);
    ck_assert_int_eq(a->r[i].skipped_steps, b->r[i].skipped_steps);
  }
}

void same_epoch_metrics(const char *a, const char *b, int n, const char *a_is, const char *b_is) {
  const char *keys[] = {"train_loss", "test_loss", "test_accuracy"};
  for (int i = 0; i < 3; i++) {
    const double x = jsonl_number(a, "epoch", n, keys[i], NULL);
    const double y = jsonl_number(b, "epoch", n, keys[i], NULL);
    ck_assert_msg(isfinite(x) && x == y, "%s: %g %s, %g %s", keys[i], x, a_is, y, b_is);
  }
}

/* Every FP32 tensor of the state regions (B .. V: BN statistics,
 * parameters, optimizer moments), on every local rank, bit for bit. */
void same_state(bp_trainer *a, bp_trainer *b) {
  const bp_plan *p = bp_trainer_plan(a);
  int compared = 0;
  for (int rank = 0; rank < bp_trainer_local_ranks(a); rank++)
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const bp_dtensor *d = bp_plan_tensor(p, 0, id);
      if (d->dtype != BP_DTYPE_FP32 || d->region > BP_REGION_V_CONV_DEEP ||
          d->region == BP_REGION_R ||
          (d->region >= BP_REGION_G_BN_BIAS && d->region <= BP_REGION_G_CONV_DEEP))
        continue;
      const uint64_t n = bp_dtensor_host_elems(d);
      float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
      ck_assert(x && y);
      ck_assert_msg(bp_trainer_read_rank_tensor(a, rank, d->name, x, n) == BP_OK, "%s",
                    bp_last_error());
      ck_assert_msg(bp_trainer_read_rank_tensor(b, rank, d->name, y, n) == BP_OK, "%s",
                    bp_last_error());
      ck_assert_msg(memcmp(x, y, (size_t)n * sizeof *x) == 0, "rank %d: tensor %s differs", rank,
                    d->name);
      free(x);
      free(y);
      compared++;
    }
  ck_assert_int_ge(compared, 2);
}

