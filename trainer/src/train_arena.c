/* Filling a rank's arena before the first step, and the few host reads and
 * writes of the step loop (the learning rate, the step counter, R).
 *
 * Every access goes through the rank's io (device-io-impl.h): plain loads
 * and stores on the cpu device, the plugin's copies elsewhere. Every rank
 * is filled from the same rules and the same seed, so the ranks start
 * bit-identical (train-impl.h invariant 1). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train-impl.h"

double bp_train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bp_status bp_train_arena_init(bp_trainer *t, bp_train_rank *r) {
  const bp_plan *p = t->plan;
  const int32_t count = bp_plan_tensor_count(p);
  /* zero first: slot padding must read as 0 (range ops sweep whole spans) */
  bp_status st = bp_devio_zero(&r->io, 0, bp_plan_total_bytes(p));
  if (st != BP_OK) return st;
  uint64_t most = 0;
  for (int32_t id = 0; id < count; id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->init.kind != BP_INIT_NONE && bp_dtensor_host_elems(d) > most)
      most = bp_dtensor_host_elems(d);
  }
  float *buf = most ? malloc((size_t)most * sizeof *buf) : NULL;
  if (most && !buf) return bp_fail(BP_ERR_NOMEM, "out of memory initializing the parameters");
  for (int32_t id = 0; id < count && st == BP_OK; id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->init.kind == BP_INIT_NONE) continue;
    /* the rules draw FP32 values; other dtypes get them converted */
    bp_dtensor f = *d;
    f.dtype = BP_DTYPE_FP32;
    if ((st = bp_dtensor_init_fill(&f, t->state.seed, buf)) == BP_OK)
      st = bp_devio_write_tensor(&r->io, d, buf);
  }
  free(buf);
  /* the model's own initial values (an ONNX file's initializers) replace
   * the rules; the INIT segment below copies them to E and A */
  for (int i = 0; i < t->model->init_count && st == BP_OK; i++) {
    const bp_model_init *v = &t->model->inits[i];
    const int32_t id = bp_plan_find_tensor(p, v->name);
    const bp_dtensor *d = id >= 0 ? bp_plan_tensor(p, 0, id) : NULL;
    if (!d || d->dtype != BP_DTYPE_FP32 || bp_dtensor_host_elems(d) != v->count)
      st = bp_fail(BP_ERR_SHAPE, "model '%s': initial value '%s' (%llu values) fits no FP32 "
                   "tensor of the plan", t->model->name, v->name, (unsigned long long)v->count);
    else
      st = bp_devio_write_tensor(&r->io, d, v->values);
  }
  if (st != BP_OK) return st;
  for (int c = 0; c < bp_graph_constant_count(t->graph) && st == BP_OK; c++) {
    const bp_graph_constant *k = bp_graph_constant_get(t->graph, c);
    const bp_dtensor *d = bp_plan_tensor(p, 0, k->id);
    BP_ASSERT(d && k->bytes <= d->slot_bytes);
    st = bp_devio_write(&r->io, d->offset, k->data, k->bytes);
  }
  if (st != BP_OK) return st;
  static const bp_segment init[] = {BP_SEGMENT_INIT};
  bp_rank_job job = {.variant = t->v_train, .segments = init, .count = 1};
  st = bp_train_job_run(t, r->rank, &job);
  bp_exec_params_changed(r->exec); /* W, A and E were written */
  return st;
}

void bp_train_params_changed(bp_trainer *t) {
  for (int k = 0; k < t->local; k++) bp_exec_params_changed(t->ranks[k].exec);
}

bp_status bp_train_write_scalars(bp_trainer *t, double lr, int64_t step_from_1) {
  const float lr32 = (float)lr, step32 = (float)step_from_1;
  const int32_t step_i = (int32_t)step_from_1;
  const int is_int = t->step->dtype == BP_DTYPE_INT32;
  if (t->graph_mode) { /* each rank's step copies them from its pinned slots (train_graph.c) */
    memcpy(t->scalar_values[0], &lr32, 4);
    memcpy(t->scalar_values[1], is_int ? (const void *)&step_i : &step32, 4);
    return BP_OK;
  }
  bp_status st = BP_OK;
  for (int k = 0; k < t->local && st == BP_OK; k++) {
    bp_devio *io = &t->ranks[k].io;
    st = bp_devio_write_small(io, t->lr->offset, &lr32, sizeof lr32);
    if (st == BP_OK && !t->loss_scale) /* under AMP the device owns the step counter */
      st = bp_devio_write_small(io, t->step->offset, is_int ? (const void *)&step_i : &step32, 4);
  }
  return st;
}

/* The AMP scalars in S, in one order: loss_scale, good_steps, step, skipped.
 * FP32, as range.loss_scale keeps them (bp_abi_ops.h). */
static void amp_scalars(const bp_trainer *t, const bp_dtensor *d[4]) {
  d[0] = t->loss_scale;
  d[1] = t->good_steps;
  d[2] = t->step;
  d[3] = t->skipped;
}

bp_status bp_train_write_amp_state(bp_trainer *t) {
  if (!t->loss_scale) return BP_OK;
  const bp_train_state *s = &t->state;
  /* step: the counter the next update uses (AdamW counts from 1) */
  const float v[4] = {(float)s->loss_scale, (float)s->good_steps,
                      (float)(s->optimizer_steps + 1), (float)s->skipped_steps};
  const bp_dtensor *d[4];
  amp_scalars(t, d);
  bp_status st = BP_OK;
  for (int k = 0; k < t->local && st == BP_OK; k++)
    for (int i = 0; i < 4 && st == BP_OK; i++)
      st = bp_devio_write_small(&t->ranks[k].io, d[i]->offset, &v[i], sizeof v[i]);
  return st;
}

bp_status bp_train_read_amp_state(bp_trainer *t) {
  if (!t->loss_scale) return BP_OK;
  const bp_dtensor *d[4];
  amp_scalars(t, d);
  float v[4];
  for (int i = 0; i < 4; i++) {
    bp_status st = bp_devio_read(&t->ranks[0].io, d[i]->offset, &v[i], sizeof v[i]);
    if (st != BP_OK) return st;
  }
  if (!(v[0] > 0.0f) || !(v[2] >= 1.0f) || !(v[1] >= 0.0f) || !(v[3] >= 0.0f))
    return bp_fail(BP_ERR_STATE,
                   "AMP: S holds loss scale %g, clean steps %g, step %g, skipped %g (a "
                   "range.loss_scale kernel broke its contract?)",
                   (double)v[0], (double)v[1], (double)v[2], (double)v[3]);
  t->state.loss_scale = v[0];
  t->state.good_steps = (uint64_t)v[1];
  t->state.optimizer_steps = (uint64_t)v[2] - 1;
  t->state.skipped_steps = (uint64_t)v[3];
  return BP_OK;
}

bp_status bp_train_read_results(bp_trainer *t, int all_processes, double *loss_out,
                                double *correct_out) {
  double loss = 0, correct = 0;
  bp_status gs = bp_train_graphs_check(t); /* launched graphs done, their failures first */
  if (gs != BP_OK) return gs;
  for (int k = 0; k < t->local; k++) { /* rank order: the same sum on every run */
    float l, c;
    bp_status rs = bp_devio_read(&t->ranks[k].io, t->loss->offset, &l, sizeof l);
    if (rs == BP_OK) rs = bp_devio_read(&t->ranks[k].io, t->correct->offset, &c, sizeof c);
    if (rs != BP_OK) return rs;
    loss += l;
    correct += c;
  }
  double sums[2] = {loss, correct};
  bp_status st = BP_OK;
  if (all_processes && bp_train_multi_process(t)) st = bp_mpi_sum_f64(sums, 2);
  *loss_out = sums[0];
  *correct_out = sums[1];
  return st;
}
