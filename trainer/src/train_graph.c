/* Steps as graphs (train-impl.h: bp_train_graph*; docs/training.md, "Steps
 * as graphs"). On a device with the graph-capture extension a rank's
 * training step (or evaluation batch) of one (variant, input buffer) is
 * recorded once on its streams and replayed: the host's work per step is
 * then a copy of the batch into fixed pinned staging, the step's scalars
 * into fixed pinned slots and one launch.
 *
 * A graph holds everything the step does on the device: the transfer
 * stream forks from the compute stream, copies the batch and the scalars
 * from those fixed addresses into the arena and joins back; then the job's
 * segments (forward to update, cast and loss-scale logic, collectives).
 * With host-task kernels the segments are one host task, replayed as such
 * (its argument, the slot's own job, outlives the graph); else the kernels
 * are called once, on this thread, while the compute stream is captured:
 * they must be flagged BP_ABI_KERNEL_GRAPH_CAPTURABLE.
 *
 * Staging: the loader's buffers are handed back to it at the next take,
 * while the step may not have copied them yet, so the step copies the
 * batch into the fixed staging of its buffer first, on the host. That
 * staging (and the scalar slots) is refilled only after the job before
 * the previous one on the same buffer is done (event consumed[b]): the
 * one wait per step, which never waits for the step in flight. */
#include <stdio.h>
#include <string.h>

#include "train-impl.h"

/* The segments a step graph may run: kernels in them must be capturable
 * (the others run eagerly: RESET, INIT, STATE). */
static int graph_segment(int s) {
  return s != BP_SEGMENT_RESET && s != BP_SEGMENT_INIT && s != BP_SEGMENT_STATE;
}

/* Why steps of a device rank run eagerly; "" when they may run as graphs. */
static void eager_reason(const bp_trainer *t, char *why, size_t size) {
  why[0] = '\0';
  if (t->opt.no_graph) {
    snprintf(why, size, "device '%s': --no-graph: steps run eagerly", t->device);
    return;
  }
  if (t->opt.profile) {
    snprintf(why, size, "device '%s': --profile times every node: steps run eagerly",
             t->device);
    return;
  }
  if (!bp_devio_graph_ext(t->dev)) {
    snprintf(why, size, "device '%s' offers no graph capture: steps run eagerly", t->device);
    return;
  }
  if (t->ranks[0].io.host_tasks) return; /* a step is one host task: replayed as such */
  for (int k = 0; k < t->local; k++)
    for (int v = 0; v < bp_plan_variant_count(t->plan); v++)
      for (int s = 0; s < BP_SEGMENT_COUNT; s++) {
        if (!graph_segment(s)) continue;
        for (int i = 0;; i++) {
          const bp_registered_kernel *kern = bp_exec_kernel(t->ranks[k].exec, v, (bp_segment)s, i);
          if (!kern) break;
          if (kern->kernel.flags & BP_ABI_KERNEL_GRAPH_CAPTURABLE) continue;
          snprintf(why, size,
                   "device '%s': kernel %s/%s of node '%s' is not graph-capturable: steps run "
                   "eagerly",
                   t->device, kern->kernel.op, kern->kernel.impl,
                   bp_exec_node(t->ranks[k].exec, v, (bp_segment)s, i)->name);
          return;
        }
      }
}

bp_status bp_train_graphs_open(bp_trainer *t) {
  t->graph_mode = 0;
  t->graph_note[0] = '\0';
  if (!t->dev || t->ranks[0].io.host) return BP_OK; /* the cpu device: nothing to capture */
  eager_reason(t, t->graph_note, sizeof t->graph_note);
  if (t->graph_note[0]) return BP_OK;
  const int slots = 2 * bp_plan_variant_count(t->plan);
  for (int k = 0; k < t->local; k++) {
    bp_train_rank *r = &t->ranks[k];
    r->graphs = calloc((size_t)slots, sizeof *r->graphs);
    if (!r->graphs) return bp_fail(BP_ERR_NOMEM, "out of memory for the step graphs");
    bp_status st = bp_devio_graph_open(&r->io);
    if (st != BP_OK) return st;
  }
  /* the scalars a training step's graph copies: lr; the step without AMP
   * (under AMP range.loss_scale counts it on the device) */
  t->scalar_count = 0;
  t->scalar_spans[t->scalar_count++] = (bp_span){t->lr->offset, 4};
  if (!t->loss_scale) t->scalar_spans[t->scalar_count++] = (bp_span){t->step->offset, 4};
  t->graph_mode = 1;
  return BP_OK;
}

void bp_train_graphs_close(bp_trainer *t) {
  for (int k = 0; k < BP_TRAIN_MAX_RANKS; k++) {
    bp_train_rank *r = &t->ranks[k];
    if (!r->graphs) continue;
    (void)bp_devio_sync(&r->io); /* no launch may still run */
    for (int i = 0; i < 2 * bp_plan_variant_count(t->plan); i++) {
      if (r->graphs[i].exec) r->io.graph->exec_destroy(r->graphs[i].exec);
      free(r->graphs[i].tasks);
    }
    free(r->graphs);
    r->graphs = NULL;
  }
}

/* A plugin failure of the capture extension as a status. */
static bp_status graph_fail(const bp_devio *io, const char *what) {
  const char *why = io->dev->last_error ? io->dev->last_error() : NULL;
  return bp_fail(BP_ERR_DEVICE, "device '%s' %d: %s failed: %s", io->kind, io->device, what,
                 why && why[0] ? why : "no reason given");
}

/* Records the job's work on the compute stream into a graph (the transfer
 * stream joins through the input copies) and instantiates it into g->exec.
 * The capture is ended whatever fails, so the streams stay usable and the
 * caller can run the step eagerly instead. */
static bp_status capture(bp_trainer *t, int k, bp_step_graph *g, bp_rank_job *job) {
  bp_train_rank *r = &t->ranks[k];
  bp_devio *io = &r->io;
  const bp_abi_device_graph_ext *x = io->graph;
  const int b = job->buffer;
  /* the slot's own job: a captured host task reads it at every launch */
  g->job = *job;
  memcpy(g->segments, job->segments, (size_t)job->count * sizeof *job->segments);
  g->job.segments = g->segments;
  g->skip = job->skip;
  if (io->dev->stream_native) (void)io->dev->stream_native(io->compute); /* the rank's device */
  if (x->capture_begin(io->compute) != BP_ABI_OK) return graph_fail(io, "capture_begin");
  bp_status st = bp_devio_step_inputs(io, b, r->upload[b], 2, t->scalar_spans,
                                      job->train_step ? t->scalar_count : 0);
  if (st == BP_OK) {
    if (r->lanes) { /* the lanes fork from the compute stream and join back */
      g->job.failed = 0;
      st = bp_train_lane_tasks(t, k, &g->job, &g->tasks);
      if (st == BP_OK) st = bp_train_lanes_enqueue(t, k, &g->job, g->tasks);
    } else if (io->host_tasks) {
      io->counts.host_tasks++; /* enqueued once, into the graph */
      if (io->dev->stream_enqueue_host(io->compute, bp_train_job_task, &g->job) != BP_ABI_OK)
        st = graph_fail(io, "stream_enqueue_host");
    } else {
      const uint64_t calls = bp_exec_kernel_calls(g->job.exec);
      bp_train_run_segments(&g->job); /* the kernels enqueue into the capture */
      io->counts.kernel_calls += bp_exec_kernel_calls(g->job.exec) - calls;
      if (g->job.status != BP_OK) st = bp_fail(g->job.status, "%s", g->job.why);
    }
  }
  void *graph = NULL;
  const int ended = x->capture_end(io->compute, &graph);
  if (st == BP_OK && ended != BP_ABI_OK) st = graph_fail(io, "capture_end");
  if (st == BP_OK && x->instantiate(graph, &g->exec) != BP_ABI_OK) {
    st = graph_fail(io, "instantiate");
    g->exec = NULL;
  }
  if (graph) x->graph_destroy(graph);
  return st;
}

void bp_train_graph_start(bp_trainer *t, int k, bp_rank_job *job) {
  bp_train_rank *r = &t->ranks[k];
  bp_devio *io = &r->io;
  const int b = job->buffer;
  bp_step_graph *g = &r->graphs[job->variant * 2 + b];
  job->bump_params = job->train_step; /* UPDATE, GATHER, EMA wrote them (train-impl.h) */
  /* the job before the previous one on b is done: its staging may be refilled */
  bp_status st = bp_devio_stage(io, b, r->upload[b], 2);
  /* a launched graph's failure shows now: the slot's last run is done */
  if (st == BP_OK && g->runs >= 2 && g->job.status != BP_OK)
    st = bp_fail(g->job.status, "%s", g->job.why);
  if (st == BP_OK && job->train_step)
    for (int i = 0; i < t->scalar_count; i++)
      memcpy(bp_devio_step_scalar(io, b, i), t->scalar_values[i], 4);
  if (st != BP_OK) {
    /* a peer's graph may wait in a collective for this rank: with several
     * ranks the graph still runs (its failure is reported all the same) */
    bp_train_job_failed(job, st);
    if (!(job->keep_collectives && g->exec)) return;
  }
  if (g->runs == 1) {
    BP_ASSERT(!g->exec);
    if ((st = capture(t, k, g, job)) == BP_OK) {
      g->runs = 2;
    } else { /* the capture is ended: this slot runs eagerly from now on */
      fprintf(stderr, "blueprint: warning: rank %d, variant '%s', buffer %d: the step graph "
              "failed, steps of this kind run eagerly: %s\n", r->rank,
              bp_plan_variant(t->plan, job->variant)->name, b, bp_last_error());
      g->runs = -1;
      st = BP_OK;
    }
  }
  if (g->runs <= 0) { /* the warm-up (0) or a failed capture (-1): eager, waited for by finish */
    st = bp_devio_step_inputs(io, b, r->upload[b], 2, t->scalar_spans,
                              job->train_step ? t->scalar_count : 0);
    if (st != BP_OK) {
      bp_train_job_failed(job, st);
      return;
    }
    if (g->runs == 0) g->runs = 1;
    bp_train_job_enqueue(t, k, job, 0);
    return;
  }
  BP_ASSERT(g->exec && g->skip == job->skip); /* a rank's skip mask is fixed per variant */
  g->job.status = BP_OK; /* its last run is done (above) */
  g->job.failed = 0;
  g->job.why[0] = '\0';
  if (!io->host_tasks && io->dev->stream_native) /* the rank's device current here */
    (void)io->dev->stream_native(io->compute);
  io->counts.graph_launches++;
  if (io->graph->launch(g->exec, io->compute) != BP_ABI_OK) st = graph_fail(io, "launch");
  job->launched = st == BP_OK;
  if (st == BP_OK) st = bp_devio_compute_end(io, b);
  if (st != BP_OK) bp_train_job_failed(job, st);
}

bp_status bp_train_graphs_check(bp_trainer *t) {
  if (!t->graph_mode) return BP_OK;
  for (int k = 0; k < t->local; k++) {
    bp_train_rank *r = &t->ranks[k];
    bp_status st = bp_devio_sync(&r->io);
    if (st != BP_OK) return st;
    for (int i = 0; i < 2 * bp_plan_variant_count(t->plan); i++) {
      bp_step_graph *g = &r->graphs[i];
      if (g->runs >= 2 && g->job.status != BP_OK) {
        const bp_status failed = g->job.status;
        g->job.status = BP_OK; /* reported once */
        g->job.failed = 0;
        return bp_fail(failed, "%s", g->job.why);
      }
    }
  }
  return BP_OK;
}

int bp_trainer_graphs(const bp_trainer *t) { return t ? t->graph_mode : 0; }

const char *bp_trainer_graph_note(const bp_trainer *t) { return t ? t->graph_note : ""; }

bp_exec_counts bp_trainer_exec_counts(const bp_trainer *t, int rank) {
  bp_exec_counts c;
  memset(&c, 0, sizeof c);
  if (t && rank >= 0 && rank < t->local) c = t->ranks[rank].io.counts;
  return c;
}
