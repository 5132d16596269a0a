/* Epochs, steps and evaluation (train.h). The step loop runs pre-bound
 * segments as jobs of the ranks (train_run.c) and reaches the arena only
 * through the ranks' io: the scalars it writes (lr, step; under AMP only
 * lr), the batches it uploads and R when it reads metrics (train-impl.h
 * invariant 4). Under AMP the loss scale and the step counters are read
 * from S once per epoch, never inside a step. */
#include <math.h>
#include <string.h>

#include "train-impl.h"

/* The segments of one training step, in run order (graph.h). */
static const bp_segment step_segments[] = {
    BP_SEGMENT_TRANSFER,  BP_SEGMENT_ZERO_GRAD, BP_SEGMENT_CAST,   BP_SEGMENT_FORWARD,
    BP_SEGMENT_LOSS,      BP_SEGMENT_BACKWARD,  BP_SEGMENT_CAST_GRAD, BP_SEGMENT_COMM,
    BP_SEGMENT_UPDATE,    BP_SEGMENT_GATHER,    BP_SEGMENT_EMA,
};

/* One segment of `variant` on every local rank (the rank pool's path). */
static bp_status run_all_ranks(bp_trainer *t, int variant, bp_segment segment, int buffer) {
  bp_rank_step all[BP_TRAIN_MAX_RANKS];
  for (int k = 0; k < t->local; k++) all[k] = (bp_rank_step){variant, 0, 0};
  return bp_rank_pool_run(t, all, &segment, 1, buffer, NULL, NULL);
}

/* A loader over `data` into the buffers of local rank k, taking the share
 * of rank `rank` of `world`, shaped as `variant` says. */
static bp_status open_loader(bp_trainer *t, const bp_dataset *data, int variant,
                             int64_t global_batch, int train, int k, int rank, int world,
                             bp_data_loader **out) {
  /* the loader fills the host side of the rank's input buffers (the arena
   * itself on the cpu device, pinned staging elsewhere), laid out as the
   * regions I_A and I_B; take_batch uploads the two slots */
  bp_data_buffer buffers[2];
  bp_train_rank *r = &t->ranks[k];
  for (int b = 0; b < 2; b++) {
    const bp_dtensor *img = bp_plan_tensor(t->plan, variant, t->input_ids[b]);
    const bp_dtensor *lab = bp_plan_tensor(t->plan, variant, t->label_ids[b]);
    char *host = (char *)bp_devio_input(&r->io, b) - r->io.input[b].offset;
    buffers[b] = (bp_data_buffer){host + img->offset, img, host + lab->offset, lab};
    r->upload[b][0] = (bp_span){img->offset, img->slot_bytes};
    r->upload[b][1] = (bp_span){lab->offset, lab->slot_bytes};
  }
  bp_data_loader_options lo;
  memset(&lo, 0, sizeof lo);
  lo.global_batch = global_batch;
  lo.world = world;
  lo.rank = rank;
  lo.seed = t->state.seed;
  lo.shuffle = train;
  lo.norm = &t->norm;
  if (train) {
    lo.augment = t->opt.augment;
    lo.first_epoch = (int64_t)t->state.epoch;
    lo.first_step = (int64_t)t->state.step;
    /* with several ranks every core runs one: a prefetch thread would only
     * preempt a rank, and its peers would wait for it */
    lo.inline_fill = t->world > 1;
  }
  lo.epochs = 1;
  return bp_data_loader_create(data, &lo, buffers, out);
}

/* What every rank runs in a step of `global_count` samples (invariant 5). */
static const bp_rank_step *rank_steps_of(const bp_trainer *t, int64_t global_count) {
  return t->rank_steps[global_count == t->batch ? BP_STEP_FULL : BP_STEP_LAST];
}

/* Checks that the batches the ranks took for one step agree (the same
 * step everywhere, each rank's share the one its variant was compiled for)
 * and returns rank 0's in *b. */
static void agree_batches(const bp_trainer *t, const bp_data_batch *bk, bp_data_batch *b) {
  *b = bk[0];
  const bp_rank_step *rs = b->done ? NULL : rank_steps_of(t, b->global_count);
  for (int k = 0; k < t->local; k++) {
    BP_ASSERT(bk[k].done == b->done &&
                 (b->done || (bk[k].step == b->step && bk[k].epoch == b->epoch &&
                              bk[k].buffer == b->buffer && bk[k].global_count == b->global_count)));
    BP_ASSERT(b->done || bk[k].count == rs[k].count);
  }
}

/* The next batch of every rank's loader, taken by this thread. */
static bp_status next_batch(bp_trainer *t, bp_data_loader **loaders, bp_data_batch *b) {
  bp_data_batch bk[BP_TRAIN_MAX_RANKS];
  for (int k = 0; k < t->local; k++) {
    bp_status st = bp_train_take_batch(t, k, loaders[k], &bk[k]);
    if (st != BP_OK) return st;
  }
  agree_batches(t, bk, b);
  return BP_OK;
}

/* Runs the step of batch *b on every rank, then takes the next batch into
 * *next: with several ranks each rank takes its own in its thread, so
 * their inline loaders fill the batches side by side. */
static bp_status run_step(bp_trainer *t, const bp_data_batch *b, bp_data_loader **loaders,
                          bp_data_batch *next) {
  const bp_rank_step *rs = rank_steps_of(t, b->global_count);
  BP_ASSERT(rs[0].variant >= 0); /* a short batch exists only when train_last was compiled */
  bp_profile *prof = t->opt.profile; /* rank 0's step, as rank 0 runs it */
  if (prof) bp_profile_step_begin(prof, rs[0].variant);
  const int64_t tstep = (int64_t)t->state.epoch * t->steps_per_epoch + b->step;
  t->last_lr = bp_schedule_lr(&t->schedule, tstep);
  bp_status ws = bp_train_write_scalars(t, t->last_lr, (int64_t)t->state.global_step + 1);
  if (ws != BP_OK) {
    if (prof) bp_profile_step_end(prof);
    return ws;
  }
  const int count = (int)(sizeof step_segments / sizeof step_segments[0]);
  bp_data_batch bk[BP_TRAIN_MAX_RANKS];
  bp_status st = bp_rank_pool_run(t, rs, step_segments, count, b->buffer, loaders, bk);
  /* UPDATE, GATHER and EMA wrote them; the ranks are idle (in graph mode
   * the step's job tells its kernels itself: graphs may still run) */
  if (!t->graph_mode) bp_train_params_changed(t);
  if (st == BP_OK) agree_batches(t, bk, next);
  if (prof) bp_profile_step_end(prof);
  return st;
}

static int stop_reached(const bp_trainer *t) {
  return t->opt.stop_after_steps && t->state.global_step >= (uint64_t)t->opt.stop_after_steps;
}

/* The failure of a run whose training loss turned non-finite: names where
 * (`where` "at step": the step just done; "by step": within the epoch so
 * far) and what stays. */
static bp_status diverged(const bp_trainer *t, double loss, const char *where) {
  char kept[160] = "";
  if (t->checkpoint_path)
    snprintf(kept, sizeof kept, "; checkpoint '%.96s' is left as it was", t->checkpoint_path);
  return bp_fail(BP_ERR_DIVERGED,
                 "the training loss is %s %s %llu of the run (epoch %llu, step %llu of %lld): the "
                 "run diverged (a lower --lr?); stopping%s",
                 isnan(loss) ? "NaN" : "infinite", where,
                 (unsigned long long)t->state.global_step, (unsigned long long)t->state.epoch + 1,
                 (unsigned long long)t->state.step, (long long)t->steps_per_epoch, kept);
}

/* Calls on_progress and writes a step line, reading R when metrics are due.
 * Under mpirun the read is a collective, so only the step count and the
 * options decide it, never the clock or the rank (only rank 0 has the
 * metrics file open). */
static bp_status report_step(bp_trainer *t, int64_t samples, double t0, double *last_read) {
  const double now = bp_train_now();
  const int log_due = t->opt.log_every && t->metrics_path &&
                      t->state.global_step % (uint64_t)t->opt.log_every == 0;
  const int bar_due = !bp_train_multi_process(t) && t->opt.progress_interval > 0 &&
                      now - *last_read >= t->opt.progress_interval;
  if (!t->opt.on_progress && !log_due) return BP_OK;
  bp_train_progress p;
  memset(&p, 0, sizeof p);
  p.epoch = (int64_t)t->state.epoch + 1;
  p.epochs = t->epochs;
  p.step = (int64_t)t->state.step;
  p.steps = t->steps_per_epoch;
  p.global_step = (int64_t)t->state.global_step;
  p.samples = samples;
  p.seconds = now - t0;
  p.images_per_second = p.seconds > 0 ? (double)samples / p.seconds : 0.0;
  p.lr = t->last_lr;
  p.loss = p.accuracy = NAN;
  if (log_due || bar_due) {
    double loss, correct;
    bp_status st = bp_train_read_results(t, 1, &loss, &correct);
    if (st != BP_OK) return st;
    p.has_metrics = 1;
    p.loss = loss / (double)samples;
    p.accuracy = correct / (double)samples;
    *last_read = now;
  }
  /* without AMP a non-finite loss never heals (under AMP an overflow step
   * is skipped, and only the epoch's end can tell: bp_trainer_train_epoch) */
  if (p.has_metrics && !t->loss_scale && !t->opt.keep_going_nonfinite && !isfinite(p.loss))
    return diverged(t, p.loss, "at step");
  if (log_due && t->metrics) {
    bp_status st = bp_metrics_write_step(t->metrics, &p);
    if (st != BP_OK) return st;
  }
  if (t->opt.on_progress) t->opt.on_progress(t->opt.progress_user, &p);
  return BP_OK;
}

/* Ends a diverged epoch whose failure is recorded (bp_last_error): the run
 * stops, the epoch's metrics line is written (without "checkpointed"), and
 * that failure is returned. */
static bp_status stop_diverged(bp_trainer *t, bp_epoch_report *out, double t0) {
  char why[2048];
  snprintf(why, sizeof why, "%s", bp_last_error()); /* the metrics write may record another */
  t->stopped = 1;
  out->seconds = bp_train_now() - t0;
  bp_status st;
  if (t->metrics && (st = bp_metrics_write_epoch(t->metrics, out)) != BP_OK) return st;
  return bp_fail(BP_ERR_DIVERGED, "%s", why);
}

bp_status bp_trainer_train_epoch(bp_trainer *t, bp_epoch_report *out) {
  if (!t || !out) return bp_fail(BP_ERR_INVALID, "bp_trainer_train_epoch: NULL argument");
  if (!t->train_set)
    return bp_fail(BP_ERR_STATE,
                   "this trainer was created to evaluate only; it has no training data");
  if (bp_trainer_done(t))
    return bp_fail(BP_ERR_STATE, "the run is done (epoch %llu of %lld, step %llu)",
                   (unsigned long long)t->state.epoch, (long long)t->epochs,
                   (unsigned long long)t->state.global_step);
  memset(out, 0, sizeof *out);
  out->epoch = (int64_t)t->state.epoch + 1;
  out->epochs = t->epochs;
  out->test_loss = out->test_accuracy = NAN;
  const double t0 = bp_train_now();
  double last_read = t0;
  const uint64_t skipped_before = t->state.skipped_steps; /* current: read at every epoch's end */
  bp_status st = run_all_ranks(t, t->v_train, BP_SEGMENT_RESET, 0);
  bp_data_loader *loaders[BP_TRAIN_MAX_RANKS] = {NULL};
  for (int k = 0; k < t->local && st == BP_OK; k++)
    st = open_loader(t, t->train_set, t->v_train, t->batch, 1, k, t->first_rank + k, t->world,
                     &loaders[k]);
  int stopped = 0;
  bp_data_batch b;
  const bp_exec_counts counts0 = t->ranks[0].io.counts; /* the steps' own from here */
  if (st == BP_OK) st = next_batch(t, loaders, &b);
  while (st == BP_OK && !b.done) {
    BP_ASSERT(b.epoch == (int64_t)t->state.epoch && b.step == (int64_t)t->state.step);
    if (t->opt.stop_flag && *t->opt.stop_flag) { /* a signal: stop before this step */
      stopped = 1;
      break;
    }
    bp_data_batch next;
    if ((st = run_step(t, &b, loaders, &next)) != BP_OK) break;
    t->state.step++;
    t->state.global_step++;
    out->steps++;
    out->samples += b.global_count;
    if ((st = report_step(t, out->samples, t0, &last_read)) != BP_OK) break;
    if (stop_reached(t) && !b.last_in_epoch) {
      stopped = 1;
      break;
    }
    b = next;
  }
  for (int k = 0; k < t->local; k++)
    bp_data_loader_destroy(loaders[k]); /* invariant 3: no loader outlives the epoch */
  if (st != BP_OK) {
    char why[2048];
    snprintf(why, sizeof why, "%s", bp_last_error());
    (void)bp_train_graphs_check(t); /* no launched graph outlives the epoch either */
    return bp_fail(st, "%s", why);
  }
  const bp_exec_counts c = t->ranks[0].io.counts; /* the steps' own, before the epoch's end */
  out->exec = (bp_exec_counts){c.steps - counts0.steps,
                               c.graph_launches - counts0.graph_launches,
                               c.kernel_calls - counts0.kernel_calls,
                               c.host_tasks - counts0.host_tasks,
                               c.syncs - counts0.syncs,
                               c.waits - counts0.waits,
                               c.events - counts0.events,
                               c.comm_us - counts0.comm_us,
                               c.comm_overlap_us - counts0.comm_overlap_us};
  out->train_seconds = bp_train_now() - t0;
  bp_train_measure_yardstick(t); /* the machine's speed after the steps too */
  double loss, correct;
  if ((st = bp_train_read_results(t, 1, &loss, &correct)) != BP_OK) return st;
  const double n = out->samples > 0 ? (double)out->samples : NAN;
  out->train_loss = loss / n;
  out->train_accuracy = correct / n;
  out->images_per_second = out->train_seconds > 0 ? (double)out->samples / out->train_seconds : 0;
  out->lr = t->last_lr;
  out->global_step = (int64_t)t->state.global_step;
  if ((st = bp_train_read_amp_state(t)) != BP_OK) return st; /* the device's counters */
  out->amp = t->loss_scale != NULL;
  out->loss_scale = t->state.loss_scale;
  out->skipped_steps = (int64_t)(t->state.skipped_steps - skipped_before);
  /* a non-finite loss: without AMP at once; under AMP only when every step
   * of the epoch overflowed (skipped steps are AMP's normal course) */
  out->diverged = out->steps > 0 && !isfinite(out->train_loss) &&
                  (!out->amp || out->skipped_steps >= out->steps);
  if (out->diverged && !t->opt.keep_going_nonfinite) {
    diverged(t, out->train_loss, "by step");
    return stop_diverged(t, out, t0);
  }
  if (!stopped) { /* invariant 2: a finished epoch moves the counters on */
    t->state.epoch++;
    t->state.step = 0;
    bp_eval_report e;
    const double e0 = bp_train_now();
    if ((st = bp_trainer_evaluate(t, &e)) != BP_OK) return st;
    out->eval_seconds = bp_train_now() - e0;
    out->test_loss = e.loss;
    out->test_accuracy = e.accuracy;
    out->test_samples = e.samples;
    out->complete = 1;
  }
  if (stopped || stop_reached(t)) t->stopped = 1;
  if (t->checkpoint_path && !out->diverged) {
    const char *bad = NULL; /* never a non-finite state over a loadable checkpoint */
    if ((st = bp_train_save_finite(t, t->checkpoint_path, &bad)) != BP_OK) return st;
    out->checkpointed = !bad;
    if (bad) {
      out->diverged = 1;
      if (!t->opt.keep_going_nonfinite) {
        bp_fail(BP_ERR_DIVERGED,
                "'%s' holds non-finite values after step %llu of the run (epoch %lld): the run "
                "diverged (a lower --lr?); stopping; checkpoint '%.96s' is left as it was",
                bad, (unsigned long long)t->state.global_step, (long long)out->epoch,
                t->checkpoint_path);
        return stop_diverged(t, out, t0);
      }
    }
  }
  out->seconds = bp_train_now() - t0;
  if (t->metrics && (st = bp_metrics_write_epoch(t->metrics, out)) != BP_OK) return st;
  if (t->metrics && t->opt.profile && /* the profile so far, after each epoch line */
      (st = bp_metrics_write_profile(t->metrics, t->opt.profile)) != BP_OK)
    return st;
  return BP_OK;
}

bp_status bp_trainer_train(bp_trainer *t, void (*on_epoch)(void *user, const bp_epoch_report *r),
                           void *user) {
  if (!t) return bp_fail(BP_ERR_INVALID, "bp_trainer_train: NULL trainer");
  while (!bp_trainer_done(t)) {
    bp_epoch_report r;
    bp_status st = bp_trainer_train_epoch(t, &r);
    if (st != BP_OK) return st;
    if (on_epoch) on_epoch(user, &r);
  }
  return BP_OK;
}

bp_status bp_trainer_evaluate(bp_trainer *t, bp_eval_report *out) {
  if (!t || !out) return bp_fail(BP_ERR_INVALID, "bp_trainer_evaluate: NULL argument");
  memset(out, 0, sizeof *out);
  const double t0 = bp_train_now();
  /* local rank 0 evaluates alone (every rank holds the same state); R of
   * the others is zeroed so the sum over ranks is rank 0's. Under mpirun
   * every process does so: no communication, the same report everywhere */
  bp_status st = run_all_ranks(t, t->v_eval, BP_SEGMENT_RESET, 0);
  static const bp_segment cast[] = {BP_SEGMENT_CAST};
  static const bp_segment batch_segments[] = {BP_SEGMENT_TRANSFER, BP_SEGMENT_EVAL};
  bp_rank_job job = {.variant = t->v_eval, .segments = cast, .count = 1};
  if (st == BP_OK) st = bp_train_job_run(t, 0, &job);
  bp_data_loader *loader = NULL;
  if (st == BP_OK)
    st = open_loader(t, t->test_set, t->v_eval, t->eval_batch, 0, 0, 0, 1, &loader);
  bp_data_batch b;
  if (st == BP_OK) st = bp_train_take_batch(t, 0, loader, &b);
  while (st == BP_OK && !b.done) {
    const int v = b.global_count == t->eval_batch ? t->v_eval : t->v_eval_last;
    BP_ASSERT(v >= 0); /* a short batch exists only when eval_last was compiled */
    job = (bp_rank_job){.variant = v,
                        .buffer = b.buffer,
                        .segments = batch_segments,
                        .count = 2,
                        .eval_batch = 1};
    if (t->opt.profile) bp_profile_step_begin(t->opt.profile, v);
    bp_train_job_start(t, 0, &job);
    bp_data_batch next; /* taken while the batch runs */
    const bp_status taken = bp_train_take_batch(t, 0, loader, &next);
    char why[sizeof job.why];
    if (taken != BP_OK) snprintf(why, sizeof why, "%s", bp_last_error());
    st = bp_train_job_finish(t, 0, &job);
    if (t->opt.profile) bp_profile_step_end(t->opt.profile);
    if (st != BP_OK) break;
    if (taken != BP_OK) {
      st = bp_fail(taken, "%s", why);
      break;
    }
    out->samples += b.global_count;
    b = next;
  }
  bp_data_loader_destroy(loader);
  if (st != BP_OK) {
    char why[2048];
    snprintf(why, sizeof why, "%s", bp_last_error());
    (void)bp_train_graphs_check(t); /* no launched graph outlives the evaluation */
    return bp_fail(st, "%s", why);
  }
  double loss, correct;
  if ((st = bp_train_read_results(t, 0, &loss, &correct)) != BP_OK) return st;
  const double n = out->samples > 0 ? (double)out->samples : NAN;
  out->loss = loss / n;
  out->accuracy = correct / n;
  out->seconds = bp_train_now() - t0;
  return BP_OK;
}
