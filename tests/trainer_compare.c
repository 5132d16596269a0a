/* Comparing two trainers' runs (trainer_compare.h). */
#include "trainer_compare.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/plan.h"

void keep(void *user, const bp_epoch_report *r) {
  reports *k = user;
  if (k->n < 4) k->r[k->n++] = *r;
}

void train_all(bp_trainer *t, reports *k) {
  ck_assert_msg(bp_trainer_train(t, keep, k) == BP_OK, "train: %s", bp_last_error());
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

