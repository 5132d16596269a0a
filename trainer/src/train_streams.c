/* Streams (train-impl.h: bp_train_lanes_*; docs/training.md, "Streams"):
 * a device rank's job spread over its lanes by the executor's program
 * (exec.h): the side lanes fork from lane 0, each chunk waits for the
 * events of its derived edges, runs, records its own event if a later
 * chunk waits for it, and the side lanes join back into lane 0. Lane 0
 * stays the stream the rest of the trainer orders with (inputs, reads,
 * the step graph's capture), so a job looks to it as one job did before. */
#include <stdio.h>
#include <string.h>

#include "train-impl.h"

typedef struct bp_lanes bp_lanes;

/* A host task's argument: one chunk of a job's program (chunk -1: the
 * job's end, which tells the kernels the parameters changed). */
struct bp_lane_task {
  bp_rank_job *job;
  const bp_exec_program *program;
  int chunk;
};

/* The events of one program (program.event_count), made on first use. */
typedef struct program_events {
  const bp_exec_program *program;
  bp_abi_event **events;
  /* clocks of eager training steps (made on first use): [0] backward's
   * start, [1 + l] its end on compute lane l, [4 + 2c] and [5 + 2c] the
   * start and end of COMM chunk c */
  bp_abi_event **clocks;
  int first_bwd, last_bwd[BP_EXEC_COMPUTE_LANES]; /* chunks, or -1 */
} program_events;

struct bp_lanes {
  const bp_abi_device *dev;
  program_events **programs; /* each allocated on its own: pointers stay valid */
  int count, cap;
  bp_lane_task *eager; /* eager jobs' task arguments (one job in flight) */
  int eager_cap;
  program_events *clocked; /* the eager job whose clocks are to be read, or NULL */
};

int bp_train_streams(const bp_trainer *t) {
  if (!t->dev || (t->dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE) || t->opt.profile) return 1;
  return t->opt.streams > 0 ? t->opt.streams : BP_EXEC_COMPUTE_LANES;
}

bp_status bp_train_lanes_open(bp_trainer *t, bp_train_rank *r) {
  const int streams = bp_train_streams(t);
  if (streams <= 1 || r->io.host) return BP_OK;
  r->lanes = calloc(1, sizeof *r->lanes);
  if (!r->lanes) return bp_fail(BP_ERR_NOMEM, "out of memory for a rank's streams");
  r->lanes->dev = r->io.dev;
  return bp_devio_lanes_open(&r->io, streams);
}

void bp_train_lanes_close(bp_train_rank *r) {
  bp_lanes *l = r->lanes;
  if (!l) return;
  for (int i = 0; i < l->count; i++) {
    program_events *pe = l->programs[i];
    for (int e = 0; pe->events && e < pe->program->event_count; e++)
      if (pe->events[e]) l->dev->event_destroy(pe->events[e]);
    free(pe->events);
    for (int e = 0; pe->clocks && e < 4 + 2 * pe->program->chunk_count; e++)
      if (pe->clocks[e]) l->dev->event_destroy(pe->clocks[e]);
    free(pe->clocks);
    free(pe);
  }
  free(l->programs);
  free(l->eager);
  free(l);
  r->lanes = NULL;
}

static bp_status dev_fail(const bp_devio *io, const char *what) {
  const char *why = io->dev->last_error ? io->dev->last_error() : NULL;
  return bp_fail(BP_ERR_DEVICE, "device '%s' %d: %s failed: %s", io->kind, io->device, what,
                 why && why[0] ? why : "no reason given");
}

#define DEV(io, call, what)                                 \
  do {                                                      \
    if ((call) != BP_ABI_OK) return dev_fail((io), (what)); \
  } while (0)

/* The segments job runs, as a program's mask. */
static unsigned job_mask(const bp_rank_job *job) {
  unsigned mask = 0;
  for (int s = 0; s < job->count; s++) mask |= 1u << job->segments[s];
  return mask & ~job->skip;
}

/* The program of job and its events. */
static bp_status program_of(bp_train_rank *r, const bp_rank_job *job, program_events **out) {
  const bp_exec_program *p = NULL;
  bp_status st = bp_exec_program_get(job->exec, job->variant, job_mask(job), &p);
  if (st != BP_OK) return st;
  bp_lanes *l = r->lanes;
  for (int i = 0; i < l->count; i++)
    if (l->programs[i]->program == p) {
      *out = l->programs[i];
      return BP_OK;
    }
  if (l->count == l->cap) {
    const int cap = l->cap ? 2 * l->cap : 8;
    program_events **grown = realloc(l->programs, (size_t)cap * sizeof *grown);
    if (!grown) return bp_fail(BP_ERR_NOMEM, "out of memory for a program's events");
    l->programs = grown;
    l->cap = cap;
  }
  program_events *pe = calloc(1, sizeof *pe);
  if (!pe) return bp_fail(BP_ERR_NOMEM, "out of memory for a program's events");
  l->programs[l->count++] = pe;
  pe->program = p;
  pe->first_bwd = -1;
  for (int k = 0; k < BP_EXEC_COMPUTE_LANES; k++) pe->last_bwd[k] = -1;
  for (int c = 0; c < p->chunk_count; c++) {
    const bp_exec_chunk *ch = &p->chunks[c];
    if (!(ch->segments & (1u << BP_SEGMENT_BACKWARD))) continue;
    if (pe->first_bwd < 0) pe->first_bwd = c;
    if (ch->lane < BP_EXEC_COMPUTE_LANES) pe->last_bwd[ch->lane] = c;
  }
  pe->events = calloc((size_t)p->event_count + 1, sizeof *pe->events);
  if (!pe->events) return bp_fail(BP_ERR_NOMEM, "out of memory for a program's events");
  for (int e = 0; e < p->event_count; e++)
    DEV(&r->io, r->io.dev->event_create(r->io.device, &pe->events[e]), "event_create");
  *out = pe;
  return BP_OK;
}

/* Whether job's step is timed (eager training steps with collectives on a
 * device that times events), its clocks made. */
static bp_status clocks_of(bp_train_rank *r, const bp_rank_job *job, program_events *pe,
                           int *timed) {
  const bp_exec_program *p = pe->program;
  int comm = 0;
  for (int c = 0; c < p->chunk_count; c++) comm |= (p->chunks[c].segments >> BP_SEGMENT_COMM) & 1;
  *timed = comm && job->train_step && pe->first_bwd >= 0 && r->io.dev->event_elapsed_ms;
  if (!*timed || pe->clocks) return BP_OK;
  const int n = 4 + 2 * p->chunk_count;
  pe->clocks = calloc((size_t)n, sizeof *pe->clocks);
  if (!pe->clocks) return bp_fail(BP_ERR_NOMEM, "out of memory for a step's clocks");
  for (int e = 0; e < n; e++) {
    const int used = e == 0 || (e < 4 && pe->last_bwd[e - 1] >= 0) ||
                     (e >= 4 && (p->chunks[(e - 4) / 2].segments & (1u << BP_SEGMENT_COMM)));
    if (used) DEV(&r->io, r->io.dev->event_create(r->io.device, &pe->clocks[e]), "event_create");
  }
  return BP_OK;
}

bp_status bp_train_lanes_clocks(bp_trainer *t, int k) {
  bp_train_rank *r = &t->ranks[k];
  program_events *pe = r->lanes ? r->lanes->clocked : NULL;
  if (!pe) return BP_OK;
  r->lanes->clocked = NULL;
  const bp_abi_device *d = r->io.dev;
  float ms = 0;
  double end = 0, comm = 0, overlap = 0;
  for (int l = 0; l < BP_EXEC_COMPUTE_LANES; l++) {
    if (pe->last_bwd[l] < 0) continue;
    DEV(&r->io, d->event_elapsed_ms(pe->clocks[0], pe->clocks[1 + l], &ms), "event_elapsed_ms");
    if (ms > end) end = ms;
  }
  for (int c = 0; c < pe->program->chunk_count; c++) {
    if (!(pe->program->chunks[c].segments & (1u << BP_SEGMENT_COMM))) continue;
    float a = 0, b = 0;
    DEV(&r->io, d->event_elapsed_ms(pe->clocks[0], pe->clocks[4 + 2 * c], &a), "event_elapsed_ms");
    DEV(&r->io, d->event_elapsed_ms(pe->clocks[0], pe->clocks[5 + 2 * c], &b), "event_elapsed_ms");
    comm += b > a ? b - a : 0;
    const double lo = a > 0 ? a : 0, hi = b < end ? b : end;
    overlap += hi > lo ? hi - lo : 0;
  }
  r->io.counts.comm_us += (uint64_t)(comm * 1e3 + 0.5);
  r->io.counts.comm_overlap_us += (uint64_t)(overlap * 1e3 + 0.5);
  return BP_OK;
}

bp_status bp_train_lane_tasks(bp_trainer *t, int k, const bp_rank_job *job, bp_lane_task **out) {
  const bp_exec_program *p = NULL;
  bp_status st = bp_exec_program_get(t->ranks[k].exec, job->variant, job_mask(job), &p);
  if (st != BP_OK) return st;
  *out = calloc((size_t)p->chunk_count + 1, sizeof **out);
  return *out ? BP_OK : bp_fail(BP_ERR_NOMEM, "out of memory for a step's host tasks");
}

/* One chunk's nodes in order; after a failure only the collectives (with
 * keep_collectives), as bp_train_run_segments. On the thread that runs
 * the chunk: a lane's host task, or the rank's thread. */
static void run_chunk(const bp_lane_task *task) {
  bp_rank_job *job = task->job;
  const bp_exec_program *p = task->program;
  if (task->chunk < 0) {
    bp_exec_params_changed(job->exec);
    return;
  }
  const bp_exec_chunk *c = &p->chunks[task->chunk];
  for (int e = c->first; e < c->first + c->count; e++) {
    const bp_exec_entry *n = &p->entries[e];
    if (__atomic_load_n(&job->failed, __ATOMIC_ACQUIRE) &&
        !(job->keep_collectives && (BP_TRAIN_COLLECTIVE & (1u << n->segment))))
      continue;
    bp_status st = bp_exec_run_nodes(job->exec, job->variant, (bp_segment)n->segment, n->index, 1,
                                     job->buffer);
    if (st != BP_OK) bp_train_job_failed(job, st);
  }
}

static void lane_task(void *arg) { run_chunk(arg); }

bp_status bp_train_lanes_enqueue(bp_trainer *t, int k, bp_rank_job *job, bp_lane_task *tasks) {
  bp_train_rank *r = &t->ranks[k];
  bp_devio *io = &r->io;
  const bp_abi_device *d = io->dev;
  program_events *pe = NULL;
  bp_status st = program_of(r, job, &pe);
  int timed = 0;
  if (st == BP_OK && !tasks) st = clocks_of(r, job, pe, &timed); /* eager only */
  if (st != BP_OK) return st;
  const bp_exec_program *p = pe->program;
  bp_abi_event **events = pe->events, **clock = pe->clocks;
  if (!tasks && io->host_tasks) {
    bp_lanes *l = r->lanes;
    if (l->eager_cap < p->chunk_count + 1) {
      bp_lane_task *grown = realloc(l->eager, (size_t)(p->chunk_count + 1) * sizeof *grown);
      if (!grown) return bp_fail(BP_ERR_NOMEM, "out of memory for a step's host tasks");
      l->eager = grown;
      l->eager_cap = p->chunk_count + 1;
    }
    tasks = l->eager;
  }
  bp_abi_stream *main = bp_devio_lane(io, BP_EXEC_LANE_MAIN);
  if (!io->host_tasks && d->stream_native) (void)d->stream_native(main); /* the rank's device */
  const unsigned side = p->lanes & ~(1u << BP_EXEC_LANE_MAIN);
  if (side) { /* fork: every side lane starts after lane 0's work so far */
    DEV(io, d->event_record(io->lane_fork, main), "event_record");
    io->counts.events++;
    for (int l = 1; l < BP_EXEC_LANES; l++)
      if (side & (1u << l)) {
        DEV(io, d->stream_wait_event(bp_devio_lane(io, l), io->lane_fork), "stream_wait_event");
        io->counts.events++;
      }
  }
  const uint64_t calls = bp_exec_kernel_calls(job->exec);
  for (int c = 0; c < p->chunk_count; c++) {
    const bp_exec_chunk *ch = &p->chunks[c];
    bp_abi_stream *s = bp_devio_lane(io, ch->lane);
    for (int w = ch->wait_first; w < ch->wait_first + ch->wait_count; w++) {
      DEV(io, d->stream_wait_event(s, events[p->waits[w]]), "stream_wait_event");
      io->counts.events++;
    }
    const int comm = timed && (ch->segments & (1u << BP_SEGMENT_COMM));
    if (timed && c == pe->first_bwd) DEV(io, d->event_record(clock[0], s), "event_record");
    if (comm) DEV(io, d->event_record(clock[4 + 2 * c], s), "event_record");
    if (io->host_tasks) {
      tasks[c] = (bp_lane_task){job, p, c};
      io->counts.host_tasks++;
      DEV(io, d->stream_enqueue_host(s, lane_task, &tasks[c]), "stream_enqueue_host");
    } else {
      run_chunk(&(bp_lane_task){job, p, c}); /* the kernels enqueue on their lanes */
    }
    if (comm) DEV(io, d->event_record(clock[5 + 2 * c], s), "event_record");
    if (timed && ch->lane < BP_EXEC_COMPUTE_LANES && c == pe->last_bwd[ch->lane])
      DEV(io, d->event_record(clock[1 + ch->lane], s), "event_record");
    if (ch->record >= 0) {
      DEV(io, d->event_record(events[ch->record], s), "event_record");
      io->counts.events++;
    }
  }
  if (timed) r->lanes->clocked = pe;
  io->counts.kernel_calls += io->host_tasks ? 0 : bp_exec_kernel_calls(job->exec) - calls;
  for (int l = 1; l < BP_EXEC_LANES; l++) /* join: lane 0 goes on after every side lane */
    if (side & (1u << l)) {
      DEV(io, d->event_record(io->lane_join[l], bp_devio_lane(io, l)), "event_record");
      DEV(io, d->stream_wait_event(main, io->lane_join[l]), "stream_wait_event");
      io->counts.events += 2;
    }
  if (job->bump_params) { /* after UPDATE, GATHER, EMA */
    if (io->host_tasks) {
      tasks[p->chunk_count] = (bp_lane_task){job, p, -1};
      io->counts.host_tasks++;
      DEV(io, d->stream_enqueue_host(main, lane_task, &tasks[p->chunk_count]),
          "stream_enqueue_host");
    } else {
      bp_exec_params_changed(job->exec);
    }
  }
  return BP_OK;
}
