/* Filling a rank's arena before the first step, and the few host reads and
 * writes of the step loop (the learning rate, the step counter, R).
 *
 * On the cpu device the arena is host memory, so these are plain loads and
 * stores at base + offset. Every rank is filled from the same rules and the
 * same seed, so the ranks start bit-identical (train-impl.h invariant 1). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train-impl.h"

double bp_train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes compact host values `src` (host_elems of t) into the arena with
 * the device strides, converting FP32 to the tensor's dtype. */
static void store(char *base, const bp_dtensor *t, const float *src) {
  const int64_t c = t->shape.c;
  uint64_t k = 0;
  for (int64_t n = 0; n < t->shape.n; n++)
    for (int64_t h = 0; h < t->shape.h; h++)
      for (int64_t w = 0; w < t->shape.w; w++) {
        const int64_t row = n * t->dev_stride[0] + h * t->dev_stride[1] + w * t->dev_stride[2];
        for (int64_t i = 0; i < c; i++, k++) {
          const int64_t e = row + i * t->dev_stride[3];
          switch (t->dtype) {
          case BP_DTYPE_FP32: ((float *)(base + t->offset))[e] = src[k]; break;
          case BP_DTYPE_FP16:
            ((uint16_t *)(base + t->offset))[e] = bp_fp16_from_fp32(src[k]);
            break;
          case BP_DTYPE_INT32: ((int32_t *)(base + t->offset))[e] = (int32_t)src[k]; break;
          case BP_DTYPE_INT8: ((int8_t *)(base + t->offset))[e] = (int8_t)src[k]; break;
          default: TRAIN_ASSERT(0); /* the plan refuses other dtypes */
          }
        }
      }
}

bp_status bp_train_arena_init(bp_trainer *t, bp_train_rank *r) {
  const bp_plan *p = t->plan;
  const int32_t count = bp_plan_tensor_count(p);
  /* zero first: slot padding must read as 0 (range ops sweep whole spans) */
  memset(r->base, 0, (size_t)bp_plan_total_bytes(p));
  uint64_t most = 0;
  for (int32_t id = 0; id < count; id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->init.kind != BP_INIT_NONE && bp_dtensor_host_elems(d) > most)
      most = bp_dtensor_host_elems(d);
  }
  float *buf = most ? malloc((size_t)most * sizeof *buf) : NULL;
  if (most && !buf) return bp_fail(BP_ERR_NOMEM, "out of memory initializing the parameters");
  bp_status st = BP_OK;
  for (int32_t id = 0; id < count && st == BP_OK; id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->init.kind == BP_INIT_NONE) continue;
    /* the rules draw FP32 values; other dtypes get them converted */
    bp_dtensor f = *d;
    f.dtype = BP_DTYPE_FP32;
    if ((st = bp_dtensor_init_fill(&f, t->state.seed, buf)) == BP_OK) store(r->base, d, buf);
  }
  free(buf);
  if (st != BP_OK) return st;
  for (int c = 0; c < bp_graph_constant_count(t->graph); c++) {
    const bp_graph_constant *k = bp_graph_constant_get(t->graph, c);
    const bp_dtensor *d = bp_plan_tensor(p, 0, k->id);
    TRAIN_ASSERT(d && k->bytes <= d->slot_bytes);
    memcpy(r->base + d->offset, k->data, (size_t)k->bytes);
  }
  st = bp_exec_run(r->exec, t->v_train, BP_SEGMENT_INIT, 0);
  bp_exec_params_changed(r->exec); /* W, A and E were written */
  return st;
}

void bp_train_params_changed(bp_trainer *t) {
  for (int k = 0; k < t->local; k++) bp_exec_params_changed(t->ranks[k].exec);
}

void bp_train_write_scalars(bp_trainer *t, double lr, int64_t step_from_1) {
  for (int k = 0; k < t->local; k++) {
    char *base = t->ranks[k].base;
    *(float *)(base + t->lr->offset) = (float)lr;
    if (t->step->dtype == BP_DTYPE_INT32)
      *(int32_t *)(base + t->step->offset) = (int32_t)step_from_1;
    else
      *(float *)(base + t->step->offset) = (float)step_from_1;
  }
}

bp_status bp_train_read_results(const bp_trainer *t, int all_processes, double *loss_out,
                                double *correct_out) {
  double loss = 0, correct = 0;
  for (int k = 0; k < t->local; k++) { /* rank order: the same sum on every run */
    const char *base = t->ranks[k].base;
    loss += *(const float *)(base + t->loss->offset);
    correct += *(const float *)(base + t->correct->offset);
  }
  double sums[2] = {loss, correct};
  bp_status st = BP_OK;
  if (all_processes && bp_train_multi_process(t)) st = bp_mpi_sum_f64(sums, 2);
  *loss_out = sums[0];
  *correct_out = sums[1];
  return st;
}
