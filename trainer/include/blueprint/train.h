/* Training and evaluation: the public C API of a training run.
 *
 * Life cycle: bp_train_options_init -> set what differs -> bp_trainer_create
 * (or _create_from_file) -> bp_trainer_train_epoch until bp_trainer_done
 * (or bp_trainer_train for all epochs) -> bp_trainer_destroy. A trainer
 * loads the data, compiles the model into a plan (variants "train",
 * "train_last", "eval", "eval_last" as the data sizes need, and with
 * ranks "train_small", "train_last_small": model.h), builds the
 * graph (graph.h), allocates one arena per rank, binds the graph to it
 * (exec.h; every kernel from op modules through the registry), fills the
 * parameters by their init rules and, with resume_path, loads a checkpoint.
 *
 * One epoch: R (loss, correct count) is zeroed; a loader thread fills the
 * input buffers I_A/I_B one batch ahead (data.h; with several ranks each
 * rank fills its own next batch in its thread after its step, an inline
 * loader); each step writes the
 * scheduled learning rate into the S-region "lr" scalar and runs the
 * segments of the "train" variant (the last, shorter batch: "train_last";
 * with ranks, each rank the variant of its share);
 * R is read at the end of the epoch (and every log_every steps); then the
 * test set runs through "eval"/"eval_last", and with checkpoint_path the
 * state is saved.
 *
 * Determinism: the same options (seed included) give bit-identical
 * parameters on every run: initialization, data order, augmentation and
 * every kernel flagged DETERMINISTIC depend on counters only. An
 * interrupted run resumed from its checkpoint ends bit-identical to an
 * uninterrupted one (the data order is a function of seed, epoch and step;
 * the schedule of epoch and step; AdamW's step counter of the global step,
 * under AMP of the updates applied, which the checkpoint keeps).
 *
 * Mixed precision (amp; docs/amp.md): FP16 features and gradients, FP32
 * master weights, dynamic loss scaling decided on the device: a step whose
 * gradients overflow changes no weight, moment, EMA copy or step count,
 * and halves the scale. The loss scale and its counters live in the S
 * scalars; the host writes them at create and after a load, and reads them
 * at every epoch's end (bp_epoch_report) and at every save, never inside a
 * step. AMP always replicates the update over the ranks.
 *
 * Weight decay: SGD couples it (added to the gradient, as PyTorch's SGD);
 * AdamW decouples it (w -= lr*wd*w, as PyTorch's AdamW); LARS adds it to the
 * gradient inside the trust ratio. Biases and batch-norm parameters get no
 * decay (graph.h).
 *
 * Ranks (options.ranks = R > 1): R ranks as threads of this process, each
 * with its own arena and bound graph (same plan, same offsets). Each global
 * batch B is split over the ranks by data.h's rule (B / R samples each,
 * the first B mod R ranks one more; the epoch's last batch alike, a rank
 * of 0 samples still taking the step), each share running its variant of
 * the plan (model.h: "train", "train_small", "train_last",
 * "train_last_small"); the gradients are summed
 * over the ranks in rank order per all-reduce bucket (ops/allreduce), the
 * BN running statistics averaged, so every rank ends each step with
 * bit-identical parameters and BN statistics; by default each rank updates
 * only its own chunk of the parameters, which are then gathered (graph.h,
 * "sharded update"; replicate_update turns that off, with the same bits),
 * so the gradients and optimizer moments a rank holds are current only in
 * its own chunks until a save gathers the moments; loss and correct counts
 * are summed over the ranks when read. Evaluation runs on rank 0. Checkpoints hold rank 0's state and the
 * plan of one rank's batch, so they resume with the same rank count.
 *
 * Under mpirun (the launcher's environment says N > 1 processes; comm.h)
 * each process is one rank of N, rank and world from MPI: the same plan,
 * shares and variants as N threads, the all-reduce kernel "mpi" doing the
 * same float operations as "threads", so the runs end with the same bits.
 * Each process evaluates the whole test set itself (same state, same
 * report, no communication); only rank 0 writes checkpoints and metrics.
 * options.ranks > 1 under mpirun is refused (one rank per process).
 *
 * Threads: a trainer is used from one thread at a time. Errors: every call
 * returns a status and leaves one line in bp_last_error(). */
#ifndef BLUEPRINT_TRAIN_H
#define BLUEPRINT_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "blueprint/checkpoint.h"
#include "blueprint/data.h"
#include "blueprint/exec.h"
#include "blueprint/model.h"
#include "blueprint/profile.h"
#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A run's learning-rate schedule; its kind (bp_lr_schedule) is in model.h,
 * since a model file's train: settings may name it. */
typedef struct bp_schedule {
  bp_lr_schedule kind;
  double lr;               /* base learning rate */
  double gamma;            /* step: factor per drop */
  int64_t step_epochs;     /* step: epochs between drops (>= 1) */
  double warmup_epochs;    /* linear warmup: step t < W = round(warmup_epochs * steps_per_epoch)
                              runs lr * (t + 1) / W; then the schedule, over the steps left */
  int64_t steps_per_epoch; /* >= 1 */
  int64_t epochs;          /* >= 1 */
} bp_schedule;

/* The learning rate of step t of the run, t = epoch * steps_per_epoch +
 * step in the epoch (from 0). A pure function of its arguments. */
double bp_schedule_lr(const bp_schedule *schedule, int64_t t);

/* What a progress callback receives, every step. */
typedef struct bp_train_progress {
  int64_t epoch, epochs; /* epoch from 1, of epochs */
  int64_t step, steps;   /* steps done in this epoch, of steps per epoch */
  int64_t global_step;   /* steps done since the start of the run */
  int64_t samples;       /* training samples of this epoch so far */
  double seconds;        /* since the epoch started */
  double images_per_second;
  double lr;             /* of the last step */
  int has_metrics;       /* 1 when R was read for this call: loss and accuracy set */
  double loss, accuracy; /* running averages of the epoch (accuracy in [0, 1]) */
} bp_train_progress;

/* One epoch, as bp_trainer_train_epoch reports it. */
typedef struct bp_epoch_report {
  int64_t epoch, epochs;           /* from 1, of epochs */
  int64_t steps, samples;          /* trained in this call (fewer after a resume or a stop) */
  int64_t global_step;             /* steps done since the start of the run */
  double train_loss;               /* mean per sample */
  double train_accuracy;           /* in [0, 1] */
  double test_loss, test_accuracy; /* NaN when the epoch stopped before its evaluation */
  int64_t test_samples;
  double images_per_second; /* training samples / training seconds */
  double train_seconds, eval_seconds;
  double seconds;   /* the whole call */
  double lr;        /* of the epoch's last step */
  int complete;     /* 0: stopped mid-epoch (stop_after_steps) */
  int checkpointed; /* 1: written to checkpoint_path */
  int amp;               /* 1: mixed precision; the two fields below are its */
  double loss_scale;     /* AMP: the loss scale after the epoch's last step (1 without AMP) */
  int64_t skipped_steps; /* AMP: steps of this call skipped on overflow (0 without AMP) */
  /* How local rank 0 ran this call's training steps (bp_exec_counts; its
   * metric reads at log points included, the epoch's end excluded). */
  bp_exec_counts exec;
  int diverged; /* 1: the training loss or the state was non-finite (only with
                   keep_going_nonfinite: else the call fails); not checkpointed */
} bp_epoch_report;

typedef struct bp_eval_report {
  int64_t samples;
  double loss, accuracy; /* mean per sample; in [0, 1] */
  double seconds;
} bp_eval_report;

/* Stated ranges of the options below (bp_trainer_create refuses values
 * outside them, naming the range; `blueprint train` does so per option). */
#define BP_TRAIN_MAX_EPOCHS 1000000   /* epochs, step_epochs, warmup_epochs */
#define BP_TRAIN_MAX_RATE 1e6         /* lr, weight_decay, step_gamma, lars_eta */
#define BP_TRAIN_MAX_COUNT (INT64_C(1) << 40) /* limits, batches, log_every, stop_after_steps */
#define BP_TRAIN_MAX_CROP_PAD 1024
/* AMP loss scaling (docs/amp.md): the first scale of a dynamic run, and the
 * ranges of loss_scale and loss_scale_growth_interval. The counts live in
 * FP32 scalars, exact to 2^24. */
#define BP_TRAIN_INITIAL_LOSS_SCALE 65536.0
#define BP_TRAIN_DEFAULT_GROWTH_INTERVAL 2000
#define BP_TRAIN_MIN_LOSS_SCALE 0x1p-24
#define BP_TRAIN_MAX_LOSS_SCALE 0x1p64
#define BP_TRAIN_MAX_GROWTH_INTERVAL (1 << 24)

typedef struct bp_train_options {
  /* data */
  const char *data_dir;    /* MNIST-format directory; NULL: Fashion-MNIST (BP_DATA_DEFAULT_DIR) */
  int64_t train_limit;     /* use the first N training images; 0: all */
  int64_t test_limit;      /* use the first N test images; 0: all */
  bp_data_augment augment; /* random crop padding, flip; off by default */
  /* run */
  uint64_t seed;             /* default 1 */
  int64_t epochs;            /* 0: the model's */
  int64_t batch, eval_batch; /* 0: the model's */
  int ranks;                 /* ranks as threads of this process (default 1); any
                                global batch splits over them (see the top) */
  int replicate_update;      /* 1: with several ranks, every rank updates every
                                parameter; 0 (default): each updates its own chunk
                                and the parameters are gathered (graph.h: same bits,
                                half the update per rank at 2 ranks; LARS always
                                replicates) */
  const char *device;        /* a device kind a plugin provides: "cpu" (default), "cuda" */
  const char *devices;       /* device indices the ranks use in turn, "0,1"; NULL: global
                                rank r runs on device r mod the devices of that kind */
  /* optimizer; negative values and -1 mean "the model's" */
  int optimizer; /* -1 or a bp_optimizer */
  double lr, momentum, weight_decay;
  int nesterov;             /* sgd: 0 */
  double beta1, beta2, eps; /* adamw: 0.9, 0.999, 1e-8 */
  double lars_eta;          /* lars: 0.001 */
  /* schedule (bp_schedule); schedule and warmup_epochs: -1 (default) means
     the model's train: settings (constant, 0 when the file names none) */
  int schedule;            /* -1 or a bp_lr_schedule */
  double step_gamma;       /* 0.1 */
  int64_t step_epochs;     /* 1 */
  double warmup_epochs;    /* -1 or >= 0 */
  /* switches; -1: the model's */
  int amp, ema;
  int no_reuse;     /* 1: no liveness packing of the feature slots (bp_compile_options) */
  double ema_decay; /* 0.999 */
  int eval_ema;     /* -1: evaluate on the EMA copies when ema is on */
  /* AMP loss scaling (docs/amp.md); refused without AMP */
  double loss_scale; /* 0 (default): dynamic, from BP_TRAIN_INITIAL_LOSS_SCALE, halved on
                        overflow, doubled after loss_scale_growth_interval clean steps;
                        > 0: static at this value (overflow steps are still skipped) */
  int64_t loss_scale_growth_interval; /* dynamic: clean steps per doubling; 0: 2000 */
  /* files; NULL: none */
  const char *checkpoint_path; /* written at the end of every epoch (and at a stop) */
  const char *resume_path;     /* loaded at create; the run continues from its counters */
  const char *metrics_path;    /* JSON lines, docs/metrics-jsonl.md; appended to on resume */
  int64_t log_every;           /* a metrics line (and progress metrics) every N steps; 0: off */
  int64_t stop_after_steps;    /* testing interruption: checkpoint and stop after N steps of
                                  the run (global); 0: off */
  /* kernels */
  const char *kernels; /* pins "op_glob=impl,..."; NULL: the registry's default pins,
                          else the model file's train: kernels (registry.h: pin
                          precedence) */
  int autotune;
  const char *autotune_cache;
  bp_registry *registry;           /* borrowed, loaded; NULL: the trainer discovers modules */
  const char *const *plugin_paths; /* more module files or directories (discovery) */
  int plugin_path_count;
  /* reporting */
  void (*on_progress)(void *user, const bp_train_progress *progress); /* (optional) */
  void *progress_user;
  double progress_interval; /* seconds between reads of R for on_progress; 0: only at
                               log_every steps */
  int eval_only;            /* 1: load only the test set (bp_trainer_evaluate) */
  int streams;              /* compute streams of a device rank, 1..3 (docs/training.md,
                               "Streams"); 0: 3. 1: one compute stream, as before streams
                               (with --profile always 1). The cpu device has none */
  int no_graph;             /* 1: run every step eagerly, never as a captured step graph
                               (docs/training.md, "Steps as graphs"); debugging */
  bp_profile *profile;      /* (optional) a fresh profile (profile.h), borrowed, outliving
                               the trainer: rank 0's nodes are timed in every training step
                               and evaluation batch, the SGEMM yardstick is measured at
                               create, and with metrics_path a "profile" line follows each
                               epoch line; NULL: off, no clock read */
  /* The library reads no environment variable; these carry what the CLI
   * reads (docs/environment.md). Their zero values are the defaults. */
  const bp_registry_options *registry_options; /* (optional) borrowed: the module search
                                                  path, log level, default pins and module
                                                  options of the registry the trainer
                                                  discovers (ignored with `registry`);
                                                  NULL: defaults */
  int threads;       /* threads per rank for kernels, 1..1024; 0: the cores this process
                        may use divided by the ranks sharing this machine (threads.h) */
  int no_fuse;       /* 1: never fuse batchnorm + relu; 0: where the device and pins
                        allow it (model.h, bp_fuse_bn_relu_allowed) */
  int no_mpi_shared; /* 1: under mpirun, collectives travel as MPI messages even between
                        processes of one machine (comm.h); 0: shared memory there */
  /* Divergence and interruption (docs/reliability.md). */
  int keep_going_nonfinite; /* 0 (default): a non-finite training loss, or non-finite state
                               about to be checkpointed, ends the run with BP_ERR_DIVERGED
                               before the save; 1: the run goes on, but no epoch whose loss
                               or state is non-finite is checkpointed (the last finite
                               checkpoint stays; checkpointed: false) */
  const volatile sig_atomic_t *stop_flag; /* (optional) borrowed, e.g. set by a signal
                               handler: when non-zero before a training step, the epoch
                               stops there as stop_after_steps would (the state is
                               checkpointed, bp_trainer_done turns 1); one process only
                               (under mpirun the processes would stop at different steps) */
  /* Kernel checks at bind (kernel_checks.h, docs/validate.md "Pinned kernels"). */
  int trust_pins; /* 1: pinned kernels run unchecked; 0 (default): each pinned kernel runs
                     validate's checks on its node's shapes before the run starts, and one
                     that fails ends create with an error naming node, kernel and reason */
} bp_train_options;

/* The defaults above. */
void bp_train_options_init(bp_train_options *options);

typedef struct bp_trainer bp_trainer; /* opaque */

/* Everything up to the first step (see the top). `model` and `options` are
 * borrowed for the call (the trainer keeps copies). Errors are one line:
 * BP_ERR_INVALID (options), BP_ERR_IO / BP_ERR_PARSE (data or checkpoint
 * files), BP_ERR_SHAPE (a checkpoint of another plan), BP_ERR_UNSUPPORTED (a
 * node no kernel supports on the device, naming the op; a device without
 * kernels), BP_ERR_DEVICE (the device plugin failed). */
bp_status bp_trainer_create(const bp_model *model, const bp_train_options *options,
                            bp_trainer **trainer_out);
/* The same from a model file. The op modules are loaded first (options'
 * registry, else discovery with its plugin paths, kept by the trainer), so
 * the file may use layer types they register (model.h). */
bp_status bp_trainer_create_from_file(const char *model_path, const bp_train_options *options,
                                      bp_trainer **trainer_out);
void bp_trainer_destroy(bp_trainer *trainer); /* NULL is a no-op */

/* 1 when every epoch is trained or the run stopped (stop_after_steps). */
int bp_trainer_done(const bp_trainer *trainer);

/* Trains the current epoch from where the run stands, evaluates, and
 * writes the checkpoint. BP_ERR_STATE when done. */
bp_status bp_trainer_train_epoch(bp_trainer *trainer, bp_epoch_report *report_out);

/* Every epoch left; on_epoch (optional) after each. */
bp_status bp_trainer_train(bp_trainer *trainer,
                           void (*on_epoch)(void *user, const bp_epoch_report *report), void *user);

/* Runs the test set through the evaluation variants. */
bp_status bp_trainer_evaluate(bp_trainer *trainer, bp_eval_report *report_out);

/* Checkpoints (checkpoint.h): the state of rank 0 and the run's counters.
 * Save first gathers the optimizer moments of a sharded update onto every
 * rank (a collective: under mpirun every process calls it, and only rank 0
 * writes); load reads the file on every process. */
bp_status bp_trainer_save(bp_trainer *trainer, const char *path);
bp_status bp_trainer_load(bp_trainer *trainer, const char *path);

const bp_model *bp_trainer_model(const bp_trainer *trainer);
const bp_plan *bp_trainer_plan(const bp_trainer *trainer);
bp_train_state bp_trainer_state(const bp_trainer *trainer);
int64_t bp_trainer_steps_per_epoch(const bp_trainer *trainer);
int64_t bp_trainer_epochs(const bp_trainer *trainer);
/* Images per epoch (0 with eval_only) and in the test set, limits applied. */
int64_t bp_trainer_train_samples(const bp_trainer *trainer);
int64_t bp_trainer_test_samples(const bp_trainer *trainer);

/* Steps as graphs (docs/training.md): 1 when this trainer's training
 * steps and evaluation batches run as captured device graphs, replayed;
 * 0 when they run eagerly. The note says why they run eagerly on a device
 * that is not host memory ("" when they run as graphs or on the cpu). */
int bp_trainer_graphs(const bp_trainer *trainer);
const char *bp_trainer_graph_note(const bp_trainer *trainer);
/* The counts of local rank `rank` since create (zeros for a bad rank). */
bp_exec_counts bp_trainer_exec_counts(const bp_trainer *trainer, int rank);

/* Copies `count` values of FP32 tensor `name` (e.g. "fc1.w") of rank 0 into
 * dst, compact NHWC. BP_ERR_INVALID when the name is unknown, the tensor
 * is not FP32 or count is not its element count. */
bp_status bp_trainer_read_tensor(const bp_trainer *trainer, const char *name, float *dst,
                                 uint64_t count);
/* The same of this process's rank `rank` (0 <= rank <
 * bp_trainer_local_ranks: every rank with --ranks, only its own under
 * mpirun). */
bp_status bp_trainer_read_rank_tensor(const bp_trainer *trainer, int rank, const char *name,
                                      float *dst, uint64_t count);
/* Writes `count` compact NHWC FP32 values from src into tensor `name` of
 * every rank this process holds (they stay equal), converted to the
 * tensor's dtype, and tells the kernels the parameters changed. Between
 * steps. The same errors as read. */
bp_status bp_trainer_write_tensor(bp_trainer *trainer, const char *name, const float *src,
                                  uint64_t count);
/* Ranks of the run: options' ranks, or the process count under mpirun. */
int bp_trainer_world(const bp_trainer *trainer);
/* The global rank of this process's first rank: 0 with ranks as threads,
 * the MPI rank under mpirun (only rank 0 writes checkpoints and metrics,
 * and the command line prints only there). */
int bp_trainer_rank(const bp_trainer *trainer);
/* Ranks this process holds: the world with ranks as threads, 1 under mpirun. */
int bp_trainer_local_ranks(const bp_trainer *trainer);
/* How the ranks reach each other: "threads" (ranks as threads), "mpi
 * shared memory" (mpirun, every process on one machine, the collectives'
 * part of the arenas shared), "mpi messages" (mpirun otherwise), or the
 * backend of the device's collective transport in use (e.g. "nccl" for
 * ranks on CUDA GPUs, one per GPU); NULL with one rank. */
const char *bp_trainer_transport(const bp_trainer *trainer);

/* Which kernel a bound node got. Strings and the kernel are borrowed from
 * the trainer (plan, graph, registry) and live as long as it does. */
typedef struct bp_kernel_use {
  int rank;                           /* global rank of this binding */
  const char *variant;                /* plan variant: "train", "eval", ... */
  const char *segment;                /* bp_segment_name: "forward", ... */
  const char *node;                   /* graph node name */
  const bp_registered_kernel *kernel; /* op, impl, device; path is its module */
} bp_kernel_use;
/* Every node this process's first rank bound, in variant, segment and node
 * order, then each node another rank of this process bound with another
 * kernel (autotune times each rank on its own) or that the first rank did
 * not bind (sharded nodes). Fixed at create. */
int bp_trainer_kernel_use_count(const bp_trainer *trainer);
const bp_kernel_use *bp_trainer_kernel_use(const bp_trainer *trainer, int index);
/* The pins in effect ("" for none) and where they came from (optional). */
const char *bp_trainer_pins(const bp_trainer *trainer, bp_pin_source *source_out);
/* Warnings found at create (a pin that never applies), one line each
 * ending in '\n'; "" when none. The trainer does not print them. */
const char *bp_trainer_warnings(const bp_trainer *trainer);
/* Warnings about the kernels bound at create: a kernel picked by priority
 * from a module that does not ship with blueprint that took at least
 * BP_KERNEL_CHECKS_SLOW times as long as the default pick on a node
 * (kernel_checks.h), one line each ending in '\n'; "" when none. */
const char *bp_trainer_kernel_warnings(const bp_trainer *trainer);
/* With autotune (options.autotune): what it decided at create, lines
 * beginning "autotune: " (docs/tuning.md): per node of a training step the
 * default and the tuned kernel with their times inside the steps and the
 * candidates' times alone, then "autotune: step: X ms tuned vs Y ms
 * default (...): keeping the ... kernels"; "" without autotune. The
 * trainer does not print it. */
const char *bp_trainer_autotune_report(const bp_trainer *trainer);
/* The registry the kernels came from (borrowed; load records for
 * `blueprint plugins`-style reports). */
const bp_registry *bp_trainer_registry(const bp_trainer *trainer);

#ifdef __cplusplus
}
#endif
#endif
