/* Running a rank's segments through its device, and taking its batches
 * (train-impl.h: bp_train_job_*, bp_train_take_batch). */
#include <stdio.h>
#include <string.h>

#include "train-impl.h"

/* The job's segments, in order; after a failure only the collectives (with
 * keep_collectives), so the other ranks are not left waiting in them. */
void bp_train_run_segments(bp_rank_job *job) {
  for (int s = 0; s < job->count; s++) {
    const unsigned bit = 1u << job->segments[s];
    if (__atomic_load_n(&job->failed, __ATOMIC_ACQUIRE) &&
        !(job->keep_collectives && (BP_TRAIN_COLLECTIVE & bit)))
      continue;
    if (job->skip & bit) continue;
    bp_status st = bp_exec_run(job->exec, job->variant, job->segments[s], job->buffer);
    if (st != BP_OK) bp_train_job_failed(job, st);
  }
  if (job->bump_params) bp_exec_params_changed(job->exec); /* after UPDATE, GATHER, EMA */
}

/* The compute stream's task: the whole job, inside the device's reach. */
void bp_train_job_task(void *arg) { bp_train_run_segments(arg); }

/* The job's segments on this thread, their kernel calls counted. */
static void run_here(bp_devio *io, bp_rank_job *job) {
  const uint64_t calls = bp_exec_kernel_calls(job->exec);
  bp_train_run_segments(job);
  io->counts.kernel_calls += bp_exec_kernel_calls(job->exec) - calls;
}

/* The first failure claims the job (tasks of several lanes may fail at
 * once); status and why are read once the job is done. */
void bp_train_job_failed(bp_rank_job *job, bp_status st) {
  if (__atomic_exchange_n(&job->failed, 1, __ATOMIC_ACQ_REL)) return;
  job->status = st;
  snprintf(job->why, sizeof job->why, "%s", bp_last_error());
}

void bp_train_job_start(bp_trainer *t, int k, bp_rank_job *job) {
  bp_train_rank *r = &t->ranks[k];
  job->exec = r->exec;
  job->status = BP_OK;
  job->failed = 0;
  job->why[0] = '\0';
  job->launched = 0;
  bp_devio *io = &r->io;
  if (job->train_step || job->eval_batch) io->counts.steps++;
  if (io->host) { /* the cpu device: the kernels run here, in order */
    run_here(io, job);
    return;
  }
  if (t->graph_mode && (job->train_step || job->eval_batch)) {
    bp_train_graph_start(t, k, job);
    return;
  }
  bp_train_job_enqueue(t, k, job, 1);
}

void bp_train_job_enqueue(bp_trainer *t, int k, bp_rank_job *job, int wait_inputs) {
  bp_devio *io = &t->ranks[k].io;
  bp_status st = wait_inputs ? bp_devio_compute_begin(io, job->buffer) : BP_OK;
  if (st == BP_OK && t->ranks[k].lanes) {
    st = bp_train_lanes_enqueue(t, k, job, NULL);
  } else if (st == BP_OK && io->host_tasks) {
    io->counts.host_tasks++;
    if (io->dev->stream_enqueue_host(io->compute, bp_train_job_task, job) != BP_ABI_OK)
      st = bp_fail(BP_ERR_DEVICE, "device '%s' %d: stream_enqueue_host failed: %s", io->kind,
                   io->device, io->dev->last_error ? io->dev->last_error() : "no reason given");
  } else if (st == BP_OK) {
    /* the kernels enqueue their work on the compute stream, from the
     * rank's thread, whose current device must be the rank's */
    if (io->dev->stream_native) (void)io->dev->stream_native(io->compute);
    run_here(io, job);
  }
  if (st == BP_OK) st = bp_devio_compute_end(io, job->buffer);
  if (st != BP_OK) bp_train_job_failed(job, st);
}

bp_status bp_train_job_finish(bp_trainer *t, int k, bp_rank_job *job) {
  bp_devio *io = &t->ranks[k].io;
  if (!io->host && !job->launched) { /* a launched graph is waited for later */
    /* a failed enqueue leaves nothing of this job to wait for, but the
     * stream is drained all the same before job is reused */
    bp_status st = bp_devio_sync(io);
    if (st == BP_OK) st = bp_train_lanes_clocks(t, k);
    if (st != BP_OK) bp_train_job_failed(job, st);
  }
  return job->status == BP_OK ? BP_OK : bp_fail(job->status, "%s", job->why);
}

bp_status bp_train_job_run(bp_trainer *t, int k, bp_rank_job *job) {
  bp_train_job_start(t, k, job);
  return bp_train_job_finish(t, k, job);
}

bp_status bp_train_take_batch(bp_trainer *t, int k, bp_data_loader *loader, bp_data_batch *out) {
  bp_train_rank *r = &t->ranks[k];
  /* next() hands the held buffer back to the loader: its upload must be done */
  for (int b = 0; b < 2; b++) {
    bp_status st = bp_devio_staging_free(&r->io, b);
    if (st != BP_OK) return st;
  }
  bp_status st = bp_data_loader_next(loader, out);
  if (st != BP_OK || out->done) return st;
  if (t->graph_mode) return BP_OK; /* the step stages and copies its batch itself */
  return bp_devio_upload(&r->io, out->buffer, r->upload[out->buffer], 2);
}
