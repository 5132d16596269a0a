/* softmax_ce.fwd_bwd on FP32 logits and dlogits, bit-identical to
 * ops/reference/softmax_ce.c (formulas and contract there):
 *   in:  logits [N,1,1,K], labels [N,1,1,1] INT32, loss_scale [1,1,1,1]
 *        (has_loss_scale)
 *   out: loss, correct [1,1,1,1] (added to), dlogits [N,1,1,K] (compute_grad)
 * Each row takes the reference's very operations in its order: the first
 * largest logit, sum exp(z - max) in double in class order, lse, the loss
 * terms t * (lse - z) in class order, each dlogit from exp(z - lse) through
 * bp_ce_dlogit (ops/shared/elem_math.h), libm's exp and log as there; the
 * row losses are added in row order on the calling thread. What differs is
 * the loop only: no per-element dtype test or stride product, the loss
 * terms and the dlogits in two loops, and rows cut into tasks on the host's
 * threads.
 *
 * Layouts: FP32 logits and dlogits whose classes are adjacent (stride[3]
 * 1; padded channels and any row stride are fine); FP16 (mixed precision)
 * and other strides are refused with a reason, and the reference serves
 * them. The checks are the reference's, with its messages
 * (ops/shared/softmax_ce_check.h, run-time ones included): a label outside [0, K) or a bad
 * loss scale returns BP_ABI_ERR_INVALID before anything is written.
 *
 * Threads: rows in tasks of CE_TASK_ELEMS classes at least (the shape
 * decides the cut), each row's loss and hit kept per row and summed in row
 * order after the tasks, so any thread count gives the same bits. A row
 * costs two exp per class (some 7 ns each), so a task is far fewer
 * elements than CPU_TASK_ELEMS. */
#include <math.h>

#include "cpu-impl.h"
#include "shared/elem_math.h"
#include "shared/softmax_ce_check.h"

/* Classes per task (at least; whole rows): about 2 x 4096 exp calls, some
 * 55 us here, against a hand-off to the host's pool of 10-15 us. The MLP's
 * 128 x 10 in two tasks of 64 rows ran slower on two threads than in one
 * on one (26.6 against 19.0 us, the minimum of 3000 interleaved calls);
 * 1024 x 10 in three tasks ran faster (140 against 157 us). */
#define CE_TASK_ELEMS 4096
/* Rows whose losses are kept at once (a stack array); a larger N runs in
 * blocks of these, in order. */
#define CE_BLOCK_ROWS 512

/* FP32 with adjacent classes, else 0 with a reason. */
static int ce_fast_layout(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  if (t->dtype != BP_ABI_DTYPE_FP32)
    return bp_sdk_fail(reason, rs, "%s: %s; the fast loop takes fp32, the reference kernel "
                       "serves it", name, bp_sdk_dtype_name(t->dtype));
  if (t->shape[3] > 1 && t->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "%s: class stride %lld, not adjacent; the reference kernel "
                       "serves it", name, (long long)t->stride[3]);
  return 1;
}

static int ce_check(const bp_abi_kernel_args *args, bp_softmax_ce_attrs *a, char *reason,
                    size_t rs) {
  return ops_ce_check(args, a, reason, rs) &&
         ce_fast_layout(bp_sdk_input(args, 0), "logits", reason, rs) &&
         (!a->compute_grad || ce_fast_layout(bp_sdk_output(args, 2), "dlogits", reason, rs));
}

static int ce_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_softmax_ce_attrs a;
  return ce_check(args, &a, reason, rs);
}

/* One call: the rows of the current block, and what each row leaves. */
typedef struct ce_job {
  const float *z;
  int64_t zrow, k;                   /* row stride, classes */
  const int32_t *labels;
  int64_t lrow;                      /* label stride */
  float *dz;                         /* NULL without compute_grad */
  int64_t dzrow;
  double on, off, scale;             /* targets, loss scale S */
  float grad_scale;
  int64_t row0, rows, rows_per_task; /* the block */
  double loss[CE_BLOCK_ROWS];        /* per row of the block */
  unsigned char hit[CE_BLOCK_ROWS];
} ce_job;

/* Row n: its loss into j->loss, its hit into j->hit, its dlogits. */
static void ce_row(ce_job *j, int64_t n) {
  const float *z = j->z + n * j->zrow;
  const int64_t k_count = j->k;
  const int32_t y = j->labels[n * j->lrow];
  int64_t arg = 0;
  for (int64_t k = 1; k < k_count; k++)
    if (z[k] > z[arg]) arg = k;
  const double m = z[arg];
  double sum = 0.0;
  for (int64_t k = 0; k < k_count; k++) sum += exp(z[k] - m);
  const double lse = m + log(sum);
  double ln = 0.0;
  if (j->off != 0.0) {
    for (int64_t k = 0; k < k_count; k++) {
      const double t = k == y ? j->on : j->off;
      if (t != 0.0) ln += bp_ce_loss_term(t, lse, z[k]);
    }
  } else if (j->on != 0.0) { /* every other term has t = 0 and is skipped */
    ln += bp_ce_loss_term(j->on, lse, z[y]);
  }
  if (j->dz) {
    float *d = j->dz + n * j->dzrow;
    for (int64_t k = 0; k < k_count; k++)
      d[k] = bp_ce_dlogit(exp(z[k] - lse), k == y ? j->on : j->off, j->grad_scale, j->scale);
  }
  j->loss[n - j->row0] = ln;
  j->hit[n - j->row0] = arg == y;
}

static void ce_task(void *arg, int64_t i) {
  ce_job *j = arg;
  int64_t end;
  const int64_t lo = cpu_task_items(i, j->rows_per_task, j->rows, &end);
  for (int64_t r = lo; r < end; r++) ce_row(j, j->row0 + r);
}

/* softmax_ce.fwd_bwd: see the top of the file. */
static int ce_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_softmax_ce_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ce_check(args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tz = bp_sdk_input(args, 0), *tl = bp_sdk_input(args, 1);
  ce_job j;
  j.z = bp_sdk_input_f32(args, 0);
  j.zrow = tz->stride[0];
  j.k = tz->shape[3];
  j.labels = (const int32_t *)args->input_ptrs[1];
  j.lrow = tl->stride[0];
  const int64_t n_rows = tz->shape[0];
  if (!ops_ce_check_run(args, &a, &j.scale)) return BP_ABI_ERR_INVALID;
  j.dz = a.compute_grad ? bp_sdk_output_f32(args, 2) : NULL;
  j.dzrow = a.compute_grad ? bp_sdk_output(args, 2)->stride[0] : 0;
  bp_ce_targets(a.label_smoothing, j.k, &j.on, &j.off);
  j.grad_scale = a.grad_scale;
  j.rows_per_task = j.k >= CE_TASK_ELEMS ? 1 : (CE_TASK_ELEMS + j.k - 1) / j.k;
  double loss = 0.0, hits = 0.0;
  for (j.row0 = 0; j.row0 < n_rows; j.row0 += CE_BLOCK_ROWS) {
    j.rows = n_rows - j.row0 < CE_BLOCK_ROWS ? n_rows - j.row0 : CE_BLOCK_ROWS;
    bp_sdk_parallel_for(args, ce_task, &j, cpu_task_count(j.rows, j.rows_per_task));
    for (int64_t r = 0; r < j.rows; r++) {
      loss += j.loss[r];
      hits += j.hit[r];
    }
  }
  float *ploss = bp_sdk_output_f32(args, 0), *pcorrect = bp_sdk_output_f32(args, 1);
  *ploss = (float)(*ploss + loss);
  *pcorrect = (float)(*pcorrect + hits);
  return BP_ABI_OK;
}

const bp_abi_kernel cpu_softmax_ce_fwd_bwd =
    CPU_KERNEL_DT("softmax_ce.fwd_bwd", ce_supports, ce_run, 0,
                  BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
