/* Internals of the trainer (train.c: life cycle; train_arena.c: filling
 * the arena; train_loop.c: epochs, steps, evaluation; metrics.c: the JSON
 * lines file). Not installed.
 *
 * Invariants of a trainer (kept by train.c and train_loop.c):
 *  1. every rank's arena holds bit-identical parameters and BN statistics
 *     after every step, and bit-identical optimizer state after a
 *     checkpoint's STATE gather (graph.h): the COMM segment's deterministic
 *     reduction makes the gradient sums and BN statistics equal, each
 *     parameter is updated by one function of the same bits (on its owning
 *     rank under a sharded update, then gathered; on every rank otherwise);
 *  2. state.step < steps_per_epoch, and state.epoch <= epochs; state.epoch
 *     == epochs exactly when every epoch is trained;
 *  3. no loader thread outlives the call that started it: a loader fills
 *     the input buffers only while an epoch or an evaluation runs, so the
 *     training and evaluation loaders never write the same buffers at once;
 *  4. the step loop allocates nothing and looks nothing up: variants, ids,
 *     pointers and kernels are resolved at create (the per-rank variants
 *     of a step in rank_steps);
 *  5. every rank takes part in every step, with 0 samples too: a rank's
 *     share of a global batch (data.h's rule) is the batch of the variant
 *     it runs, or 0, and then it runs only the segments that read no
 *     samples (BP_TRAIN_SKIP_EMPTY), so it adds zero gradients to the
 *     all-reduce and applies the same update (invariant 1). */
#ifndef BLUEPRINT_TRAIN_IMPL_H
#define BLUEPRINT_TRAIN_IMPL_H

#include <stdio.h>
#include <stdlib.h>

#include "blueprint/arena.h"
#include "blueprint/comm.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/session.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "device-io-impl.h"
#include "bp_abi_sdk.h"

/* Most ranks a trainer holds (ranks as threads, train_ranks.c). */
#define BP_TRAIN_MAX_RANKS BP_COMM_MAX_WORLD

/* Aborts on a broken internal invariant (a bug, never bad input). */
/* The segments every rank must run, whatever its share: collectives. */
#define BP_TRAIN_COLLECTIVE \
  ((1u << BP_SEGMENT_COMM) | (1u << BP_SEGMENT_GATHER) | (1u << BP_SEGMENT_STATE))
/* The segments a rank with samples skips (bit 1 << segment): its BACKWARD
 * overwrites every gradient it reaches (graph.h), and the others stay 0
 * from the zeroed arena. */
#define BP_TRAIN_SKIP_ACTIVE (1u << BP_SEGMENT_ZERO_GRAD)
/* The segments a rank with no samples in a step skips: those that read or
 * produce per-sample data. It zeroes its gradients instead. Its BN running
 * statistics stay as they were and enter the COMM mean so; its R is
 * unchanged; under AMP its A copy is refreshed by its next CAST. */
#define BP_TRAIN_SKIP_EMPTY                                                              \
  ((1u << BP_SEGMENT_TRANSFER) | (1u << BP_SEGMENT_CAST) | (1u << BP_SEGMENT_FORWARD) | \
   (1u << BP_SEGMENT_LOSS) | (1u << BP_SEGMENT_BACKWARD))

/* One rank's part in a training step: the variant of its share and the
 * segments it skips. */
typedef struct bp_rank_step {
  int variant;    /* plan variant; -1 when the kind of step never occurs */
  unsigned skip;  /* BP_TRAIN_SKIP_ACTIVE, or BP_TRAIN_SKIP_EMPTY when count is 0 */
  int64_t count;  /* its samples (the loader's slice count; checked each step) */
} bp_rank_step;

/* Kinds of training step, the first index of rank_steps. */
enum { BP_STEP_FULL = 0, BP_STEP_LAST = 1 };

/* One rank: its arena and its bound graph. */
typedef struct bp_train_rank {
  int rank;
  const bp_abi_device *dev; /* the trainer's device plugin (NULL: host memory) */
  int device;     /* the device index it runs on (bp_train_options.devices) */
  bp_arena *arena;
  char *base;     /* arena base on the device: the host never dereferences it (io does) */
  bp_devio io;    /* every host access to the arena (device-io-impl.h) */
  bp_span upload[2][2]; /* per input buffer: the image and label slots the open loader fills */
  bp_exec *exec;
  bp_exec *default_exec; /* --autotune, until the steps decide: the default selection
                            (train_autotune.c); NULL otherwise */
  bp_abi_comm comm; /* world > 1: this rank's view of the communicator (kernels see it) */
  bp_threads *threads; /* the threads its kernels get: the rank's share of the cores */
  struct bp_step_graph *graphs; /* graph mode: [variant * 2 + buffer] (train_graph.c) */
  struct bp_lanes *lanes;       /* streams > 1 on a device (train_streams.c), else NULL */
} bp_train_rank;

typedef struct bp_metrics bp_metrics;       /* metrics.c */
typedef struct bp_rank_pool bp_rank_pool;   /* train_ranks.c */

struct bp_trainer {
  bp_train_options opt; /* strings below are the trainer's own copies */
  char *data_dir, *device, *devices, *checkpoint_path, *resume_path, *metrics_path, *kernels, *autotune_cache;
  bp_model *model;                  /* owned copy */
  bp_dataset *train_set, *test_set; /* train_set NULL with eval_only */
  bp_data_norm norm;
  bp_session *session;              /* the plan and graph below are its own */
  const bp_plan *plan;
  const bp_graph *graph;
  bp_registry *registry;
  int own_registry;
  const bp_abi_device *dev;     /* the device plugin, NULL when none provides the kind */
  const char *kernel_kind;      /* the kind of kernels it runs (dev->kernel_kind or device) */
  int device_count;             /* devices of that kind on this machine (1 without a plugin) */
  /* per local rank: through dev on the rank's device, else host memory */
  bp_arena_allocator allocators[BP_TRAIN_MAX_RANKS];
  /* Ranks: `world` in all; this process holds `local` of them, global
   * ranks first_rank .. first_rank + local - 1. Ranks as threads: local =
   * world, first_rank = 0; under mpirun: local = 1, first_rank = the MPI
   * rank (bp_train_multi_process). ranks[], rank_steps[][k] and loaders are
   * indexed by the local index k. */
  int world, local, first_rank;
  bp_comm *comm;       /* local > 1: the threads' communicator */
  bp_abi_comm mpi;     /* under mpirun: this process's MPI communicator */
  bp_comm_kind comm_kind; /* what the kernels' collectives go through (bp_comm_choose) */
  /* comm_kind DEVICE: the device's transport (a copy) and the group its
   * open() made for the local ranks (closed after the execs and graphs) */
  bp_abi_comm_transport transport;
  void *comm_group;
  /* under mpirun: the arena's first bytes that the collectives touch, the
   * part the processes of one machine share (comm.h) */
  size_t shared_bytes;
  bp_mpi_shared *shared;               /* owns the shared arenas' bookkeeping */
  bp_arena_allocator shared_allocator; /* its arenas (arenas keep a pointer to it) */
  bp_rank_pool *pool;  /* local > 1: threads running local ranks 1..local-1 */
  bp_train_rank ranks[BP_TRAIN_MAX_RANKS];
  int v_train, v_eval, v_eval_last; /* variant indices, -1 when absent */
  /* per kind of step (a full global batch B, the epoch's last n % B) and
   * rank: what the rank runs (invariants 4 and 5) */
  bp_rank_step rank_steps[2][BP_TRAIN_MAX_RANKS];
  const bp_dtensor *lr, *step, *loss,
      *correct;                       /* variant 0 descriptors (same offsets everywhere) */
  /* AMP: the loss scaling's S scalars (NULL without AMP; docs/amp.md) */
  const bp_dtensor *loss_scale, *good_steps, *skipped;
  int32_t input_ids[2], label_ids[2]; /* [0] in I_A, [1] in I_B: the loader's two buffers */
  int64_t batch, eval_batch, epochs, steps_per_epoch;
  bp_schedule schedule;
  bp_train_state state;
  bp_metrics *metrics;
  /* kernels (train_kernels.c) */
  char *pins;                   /* owned copy of the pins in effect: t->kernels, BP_KERNELS
                                   or the model's; "" for none */
  bp_pin_source pin_source;
  char warnings[1024];          /* bp_trainer_warnings */
  char *kernel_warnings;        /* bp_trainer_kernel_warnings (NULL: none) */
  bp_kernel_use *kernel_uses;   /* bp_trainer_kernel_use */
  int kernel_use_count;
  int stopped;
  double last_lr;
  /* --autotune over whole steps (train_autotune.c) */
  char *autotune_report;       /* bp_trainer_autotune_report; NULL: empty */
  double autotune_step_ms[2];  /* median step: [0] default, [1] tuned (when confirmed) */
  int autotune_confirmed;      /* the two selections were timed over whole steps */
  int autotune_kept_tuned;     /* the tuned selection runs (else the default one) */
  /* Steps as graphs (train_graph.c): on when the device captures and every
   * kernel qualifies; else the note says why not (on a device only). */
  int graph_mode;
  char graph_note[512];
  /* graph mode: the scalars the host writes before each training step
   * (lr; without AMP the optimizer step) and where they go in the arena */
  bp_span scalar_spans[2];
  int scalar_count;
  unsigned char scalar_values[2][4];
};

/* bp_trainer_save, unless the state holds a NaN or an infinity: then
 * nothing is written and *non_finite_out names the first such tensor
 * (checkpoint-impl.h); NULL when saved. */
bp_status bp_train_save_finite(bp_trainer *t, const char *path, const char **non_finite_out);

/* Whether the run's ranks span processes (mpirun): some ranks live elsewhere. */
static inline int bp_train_multi_process(const bp_trainer *t) { return t->local < t->world; }

/* train_arena.c: fills a rank's arena before the first step: every tensor
 * with an init rule (seeded by options' seed), the graph's constants, then
 * the INIT segment (E = W). */
bp_status bp_train_arena_init(bp_trainer *t, bp_train_rank *r);
/* With a profile: measures its SGEMM yardstick on rank 0's threads (host
 * kernels only), pooled with the earlier measurements (profile.h). The
 * trainer does so before the first step and after each epoch's steps, so
 * the floor of the run is the machine's speed over the run. */
void bp_train_measure_yardstick(bp_trainer *t);
/* Tells every local rank's kernels that the parameters may have changed
 * (bp_exec_params_changed): after initialization, each training step's
 * UPDATE/GATHER (and EMA) segments, and a checkpoint load. Between runs. */
void bp_train_params_changed(bp_trainer *t);
/* Writes the scalars of one step into every rank: lr, and without AMP
 * AdamW's step (under AMP the device counts it: range.loss_scale). */
bp_status bp_train_write_scalars(bp_trainer *t, double lr, int64_t step_from_1);
/* AMP (no-ops without): writes t->state's loss scale, clean-step count,
 * optimizer step (as the next update's, optimizer_steps + 1) and skipped
 * count into the S scalars of every local rank, at start and after a
 * load; reads them back from local rank 0 into t->state (every rank holds
 * the same: train-impl.h invariant 1), between steps. */
bp_status bp_train_write_amp_state(bp_trainer *t);
bp_status bp_train_read_amp_state(bp_trainer *t);
/* Reads loss and correct count: R summed over this process's ranks in rank
 * order, then, with `all_processes` under mpirun, over the processes (a
 * collective: every process must call it at the same point). Results are
 * summed only when read, never all-reduced per step. */
bp_status bp_train_read_results(bp_trainer *t, int all_processes, double *loss_out,
                                double *correct_out);

/* train_autotune.c: with --autotune, times the tuned and the default
 * selection of every rank over whole alternating training steps (the
 * arenas restored after), keeps the tuned one only when faster by
 * BP_AUTOTUNE_STEP_MARGIN, destroys the other and writes the report. Once
 * every rank is bound and initialized, before the first step. */
bp_status bp_train_autotune_confirm(bp_trainer *t);

/* train_run.c: one rank's job, the only way segments run. A job runs the
 * listed segments of `variant` (less those in `skip`) on input buffer
 * `buffer`. Start hands it to the rank's device: in host mode (the cpu
 * device) it runs to the end on the calling thread; with host-task
 * kernels it is one task on the rank's compute stream; else its kernels
 * are called here and enqueue their work on that stream; in graph mode a
 * training step or evaluation batch goes through its step graph
 * (train_graph.c). Finish waits for it and returns its status and reason
 * (bp_fail); a launched step graph is not waited for (launched): its
 * failure shows at bp_train_graphs_check or at its slot's next start. With keep_collectives a
 * failed job still runs its collective segments, so no rank waits forever
 * in an all-reduce. Between start and finish the rank's thread may take
 * the next batch (bp_train_take_batch): the loader and the upload of batch
 * k+1 overlap step k. */
typedef struct bp_rank_job {
  int variant;
  unsigned skip;
  int buffer;
  const bp_segment *segments;
  int count;
  int keep_collectives;
  /* A training step (train_step) or an evaluation batch (eval_batch): in
   * graph mode it runs through the rank's step graph of (variant, buffer)
   * (train_graph.c), a training step with the step's scalars. */
  int train_step, eval_batch;
  /* set by the job */
  bp_exec *exec;
  int launched;    /* start launched a graph: finish does not wait for it */
  int bump_params; /* graph mode: the job tells its kernels the parameters changed after
                      its segments, on the thread that ran them (the host never does
                      while graphs may run) */
  int failed;      /* set (atomically) with the first failure: status and why are
                      then the claimant's (bp_train_job_failed) */
  bp_status status;
  char why[1024];
} bp_rank_job;

/* One step graph of a rank: training steps or evaluation batches of one
 * (variant, input buffer). Its first run is eager (the warm-up: libraries
 * initialize, handles bind), its second is captured and launched, every
 * later one launches the captured graph. A failed capture (ended, said
 * on stderr) leaves the slot eager for good (runs -1). */
typedef struct bp_step_graph {
  int runs;
  void *exec;   /* the instantiated graph, from the second run */
  unsigned skip; /* the skip mask it was captured with (constant per rank and variant) */
  /* the captured host task's argument (host-task kernels): it outlives every launch */
  bp_rank_job job;
  bp_segment segments[BP_SEGMENT_COUNT];
  struct bp_lane_task *tasks; /* streams with host tasks: the captured tasks' arguments */
} bp_step_graph;
void bp_train_job_start(bp_trainer *t, int k, bp_rank_job *job);
bp_status bp_train_job_finish(bp_trainer *t, int k, bp_rank_job *job);
/* Start and finish. */
bp_status bp_train_job_run(bp_trainer *t, int k, bp_rank_job *job);
/* Local rank k's next batch from `loader` (whose buffers are bp_devio_input
 * of its io, slots in ranks[k].upload): hands the held staging back once
 * its upload is done, takes the batch, enqueues its upload. */
bp_status bp_train_take_batch(bp_trainer *t, int k, bp_data_loader *loader, bp_data_batch *out);

/* train_graph.c: steps as graphs (docs/training.md). Open decides the
 * mode once every rank is bound (t->graph_mode, t->graph_note) and makes
 * the graph slots and staging; close destroys the graphs (the streams
 * drained first). Start runs a step or evaluation job in graph mode:
 * stages its inputs and scalars at fixed addresses, then runs it eagerly
 * (a slot's first run), captures and launches it (second) or launches the
 * captured graph; it waits only for the job before the previous one on
 * the same input buffer. Check drains the local ranks' streams and
 * returns the first failure of a launched graph (before results are read). */
bp_status bp_train_graphs_open(bp_trainer *t);
void bp_train_graphs_close(bp_trainer *t);
void bp_train_graph_start(bp_trainer *t, int k, bp_rank_job *job);
bp_status bp_train_graphs_check(bp_trainer *t);
/* train_run.c: the job's segments in order (on the calling thread), then
 * the parameters' generation with bump_params. Enqueue hands a job to the
 * rank's device eagerly (after its input buffer's upload with
 * wait_inputs): one host task, or its kernels called here; records
 * consumed[buffer]. Failed keeps a job's first failure and its reason. */
void bp_train_run_segments(bp_rank_job *job);
void bp_train_job_task(void *job); /* the same as a stream task */
void bp_train_job_enqueue(bp_trainer *t, int k, bp_rank_job *job, int wait_inputs);
void bp_train_job_failed(bp_rank_job *job, bp_status st);

/* train_streams.c: a job on the rank's lanes (streams > 1; docs/training.md,
 * "Streams"). Open makes r->lanes and the rank's lane streams when t's
 * device ranks have more than one compute stream (nothing else). Enqueue hands the job's program (exec.h)
 * to the lanes: the side lanes fork from lane 0, each chunk waits for its
 * derived edges, runs (one host task, or its kernels called here), records
 * its event; the lanes join back into lane 0. `tasks` holds the host
 * tasks' arguments (bp_train_lane_tasks entries) and must outlive them:
 * NULL uses the rank's own (eager jobs, waited for before the next).
 * Tasks is the storage a step graph keeps for its captured tasks. */
typedef struct bp_lane_task bp_lane_task;
bp_status bp_train_lanes_open(bp_trainer *t, bp_train_rank *r);
void bp_train_lanes_close(bp_train_rank *r); /* before its io closes; streams idle */
bp_status bp_train_lanes_enqueue(bp_trainer *t, int k, bp_rank_job *job, bp_lane_task *tasks);
/* Argument storage for the host tasks of job's program; free() it. */
bp_status bp_train_lane_tasks(bp_trainer *t, int k, const bp_rank_job *job, bp_lane_task **out);
/* After an eager job is waited for: reads the clocks of its step (if it
 * was timed) into the rank's comm_us and comm_overlap_us. */
bp_status bp_train_lanes_clocks(bp_trainer *t, int k);
/* The compute streams a device rank of t uses (1..3). */
int bp_train_streams(const bp_trainer *t);

/* train_ranks.c: the one way a job runs on every local rank. Ranks
 * 1..local-1 run on threads of their own (started when local > 1), rank 0
 * on the caller's; with one local rank there is no thread and the job runs
 * inline. A step's segments run on every rank at once, rank k with the
 * variant of ranks[k] and without the segments of its skip mask, as a
 * bp_rank_job (train_run.c): a rank whose compute fails still takes part
 * in every later collective segment of the job, so no rank waits forever
 * in an all-reduce. With `loaders`, each rank takes its next batch from
 * loaders[k] into batches[k] in its own thread (bp_train_take_batch) while
 * its job runs on its device (on the cpu device, after it: an inline
 * loader fills it there, every rank at once). The first failure (lowest
 * rank) is returned with its message. `ranks` ([local]), `segments`,
 * `loaders` and `batches` are borrowed for the call. */
bp_status bp_rank_pool_start(bp_trainer *t);
void bp_rank_pool_stop(bp_trainer *t); /* joins the threads; NULL pool is a no-op */
bp_status bp_rank_pool_run(bp_trainer *t, const bp_rank_step *ranks, const bp_segment *segments,
                           int count, int buffer, bp_data_loader **loaders,
                           bp_data_batch *batches);

/* train_kernels.c: the pins in effect by registry.h's precedence, checked
 * against the registry (errors fail create, warnings are kept); then, once
 * every rank is bound, the table of which kernel each node got. */
bp_status bp_train_pins_resolve(bp_trainer *t);
bp_status bp_train_kernels_collect(bp_trainer *t);

/* metrics.c: one JSON object per line, flushed after each. */
bp_status bp_metrics_open(const char *path, int append, bp_metrics **out);
bp_status bp_metrics_write_epoch(bp_metrics *m, const bp_epoch_report *r);
bp_status bp_metrics_write_step(bp_metrics *m, const bp_train_progress *p);
/* The "kernels" line: pins, warnings and bp_trainer_kernel_use's table. */
bp_status bp_metrics_write_kernels(bp_metrics *m, const bp_trainer *t);
/* The "profile" line: bp_profile_write_json's object (after each epoch line). */
bp_status bp_metrics_write_profile(bp_metrics *m, const bp_profile *p);
void bp_metrics_close(bp_metrics *m); /* NULL is a no-op */

/* Seconds on CLOCK_MONOTONIC. */
double bp_train_now(void);

#endif
