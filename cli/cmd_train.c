/* `blueprint train MODEL ...`: trains a model on Fashion-MNIST (or --data)
 * through the public C API (train.h) and prints one line per epoch. On a
 * terminal a progress bar is redrawn on one line during the epoch; when
 * standard output is not a terminal only whole lines are written.
 *
 * Exit status: 0 trained (or stopped by --stop-after-steps); 1 the model,
 * the data, a kernel, a checkpoint or a file failed; 2 the command line is
 * wrong. Every failure is one line on stderr, "blueprint train: ...".
 *
 * Ranks share the cores: the trainer lends each rank's kernels cores / R
 * threads (R ranks, or P processes of mpirun on this machine; BP_THREADS
 * overrides; core/include/blueprint/threads.h).
 *
 * Under mpirun (one rank per process) only rank 0 prints; every process
 * reports its own failure on stderr, and a failure after the processes met
 * ends them all (MPI_Abort), so none waits forever in an all-reduce. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blueprint/comm.h"
#include "blueprint/outfile.h"
#include "commands.h"
#include "blueprint/data.h"
#include "blueprint/exec.h"
#include "kernel_report.h"
#include "path_guard.h"
#include "profile_report.h"
#include "train_args.h"

static const char usage_text[] =
    "usage: blueprint train MODEL [options]\n"
    "\n"
    "Trains MODEL (a YAML model file, or an ONNX file starting from its\n"
    "initializers: docs/onnx.md) on Fashion-MNIST (the dataset-fashion-mnist\n"
    "package) or on the MNIST-format files of --data DIR, evaluating on the test\n"
    "set after every epoch. Options override the model file's train: settings.\n"
    "\n"
    "  --data DIR            MNIST-format directory (default: Fashion-MNIST), or\n"
    "                        synthetic[:HxWxC[:CLASSES]]: random images (the\n"
    "                        model's shape; train_size and 10000 test samples)\n"
    "  --epochs N            epochs to train (in all, when resuming)\n"
    "  --batch B             training batch; --eval-batch B: evaluation batch\n"
    "  --ranks R             ranks as threads (1); rank r takes B/R images of a\n"
    "                        batch B, the first B % R ranks one more; under\n"
    "                        `mpirun -np N blueprint train ...` each process is one\n"
    "                        rank of N (no --ranks there)\n"
    "  --replicate-update    with several ranks, every rank updates every parameter\n"
    "                        (default: each its own chunk, then gathered; same bits)\n"
    "  --no-reuse            every feature and gradient slot its own bytes (no\n"
    "                        liveness packing; the same bits, a larger arena)\n"
    "  --no-graph            run every step eagerly, not as a captured device graph\n"
    "                        (debugging; docs/training.md, \"Steps as graphs\")\n"
    "  --streams N           compute streams of a device rank, 1..3 (default 3; 1: one)\n"
    "  --device KIND         device kind a plugin provides: cpu (default), cuda\n"
    "  --devices LIST        device indices the ranks use in turn (0,1); default:\n"
    "                        rank r on device r mod the devices of that kind\n"
    "  --deterministic       GPU: only deterministic cuDNN algorithms\n"
    "                        (BP_DETERMINISTIC=1; docs/training.md)\n"
    "  --no-tf32             GPU: FP32 convolutions and GEMMs without TF32 Tensor\n"
    "                        Cores (BP_TF32=0; TF32 is on by default)\n"
    "  --seed S              run seed: initialization, data order, augmentation (1)\n"
    "  --optimizer NAME      sgd, adamw or lars\n"
    "  --lr X, --momentum X, --weight-decay X, --nesterov\n"
    "  --schedule NAME       constant, step (--step-gamma X, --step-every N epochs)\n"
    "                        or cosine; --warmup-epochs N: linear warmup first\n"
    "                        (both default to the model file's train: settings)\n"
    "  --ema, --ema-decay X  keep an EMA of the weights and evaluate on it\n"
    "  --amp                 mixed precision: FP16 features, gradients and working\n"
    "                        copies, FP32 master weights, dynamic loss scaling\n"
    "                        (docs/amp.md): the scale starts at 65536, halves on an\n"
    "                        overflow (that step's update is skipped) and doubles\n"
    "                        after 2000 clean steps\n"
    "  --loss-scale X        with --amp: a static loss scale X (overflow steps are\n"
    "                        still skipped)\n"
    "  --loss-scale-growth-interval N  with --amp: clean steps per doubling (2000)\n"
    "  --crop-pad N, --flip  augmentation: random crop with N pixels of padding,\n"
    "                        horizontal flip (off by default)\n"
    "  --train-limit N       use the first N training images (and --test-limit N)\n"
    "  --checkpoint FILE     write a checkpoint at the end of every epoch\n"
    "  --resume FILE         continue a run from its checkpoint\n"
    "  --stop-after-steps N  (for testing interruption) checkpoint and stop after N\n"
    "                        steps of the run\n"
    "  --keep-going-nonfinite  go on after the training loss or the state turns NaN or\n"
    "                        infinite (default: stop with an error, exit 1); such\n"
    "                        epochs are never checkpointed, the last finite\n"
    "                        checkpoint stays\n"
    "  --metrics FILE.jsonl  one JSON object per epoch (docs/metrics-jsonl.md)\n"
    "  --log-every N         also a metrics line every N steps\n"
    "  --kernels PINS        pin kernels: op_glob=impl,... (as BP_KERNELS)\n"
    "  --trust-pins          run pinned kernels unchecked (default: each pinned kernel\n"
    "                        is checked against the reference on its node's shapes\n"
    "                        before the run starts; docs/validate.md)\n"
    "  --plugin PATH         load this op module (file or directory) too\n"
    "  --autotune            time the kernels that support a node, keep the fastest,\n"
    "                        then time that selection against the default over whole\n"
    "                        steps and keep the default unless it is slower by 2%;\n"
    "                        prints both on stderr (docs/tuning.md)\n"
    "  --autotune-cache FILE --autotune, reusing and updating the winners (and the\n"
    "                        candidates' times) kept in FILE\n"
    "  --quiet               no progress bar and no kernel table\n"
    "  --verbose             list the kernel of every node at start\n"
    "  --profile             time every node of rank 0 and print, after the run, each\n"
    "                        op's and node's share of the step and the GFLOP/s of\n"
    "                        conv and fc against this machine's SGEMM rate\n"
    "                        (docs/profile.md); with --metrics also a profile line\n"
    "  -h, --help            print this help\n"
    "\n"
    "An output path that names an input of the run (the model, a data file,\n"
    "--resume) or another output is refused before any work (exit 2).\n"
    "SIGINT or SIGTERM stops the run after the current step: the checkpoint is\n"
    "written (with --checkpoint), one line says how to resume, exit 130 or 143;\n"
    "a second signal ends it at once.\n"
    "\n"
    "Exit status: 0 ok, 1 training failed, 2 bad command line, 130/143 stopped by\n"
    "SIGINT/SIGTERM.\n";

typedef struct bar_state {
  int tty;
  double last_draw;
  double loss, accuracy; /* last metrics read */
  int has_metrics;
} bar_state;

static void draw_bar(void *user, const bp_train_progress *p) {
  bar_state *b = user;
  if (p->has_metrics) {
    b->loss = p->loss;
    b->accuracy = p->accuracy;
    b->has_metrics = 1;
  }
  /* redraw at most ten times a second, and on the last step */
  if (p->seconds - b->last_draw < 0.1 && !p->has_metrics && p->step != p->steps) return;
  b->last_draw = p->seconds;
  const int width = 24;
  const int filled = p->steps > 0 ? (int)(width * p->step / p->steps) : 0;
  char bar[32];
  for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
  bar[width] = '\0';
  printf("\repoch %lld/%lld [%s] %lld/%lld", (long long)p->epoch, (long long)p->epochs, bar,
         (long long)p->step, (long long)p->steps);
  if (b->has_metrics) printf("  loss %.4f  acc %.2f%%", b->loss, 100.0 * b->accuracy);
  printf("  %.0f img/s\033[K", p->images_per_second);
  fflush(stdout);
}

static void clear_bar(const bar_state *b) {
  if (b->tty) printf("\r\033[K");
}

static void print_epoch(const bp_epoch_report *r) {
  char amp[128] = "";
  if (r->amp)
    snprintf(amp, sizeof amp, "  loss scale %g (%lld skipped)", r->loss_scale,
             (long long)r->skipped_steps);
  if (r->diverged) /* --keep-going-nonfinite */
    snprintf(amp + strlen(amp), sizeof amp - strlen(amp), "  (non-finite: not checkpointed)");
  if (r->complete) {
    printf(
        "epoch %lld/%lld  train loss %.4f  train acc %.2f%%  test acc %.2f%%  %.0f img/s  "
        "%.1f s%s\n",
        (long long)r->epoch, (long long)r->epochs, r->train_loss, 100.0 * r->train_accuracy,
        100.0 * r->test_accuracy, r->images_per_second, r->seconds, amp);
  } else {
    printf(
        "epoch %lld/%lld  stopped at step %lld  train loss %.4f  train acc %.2f%%  %.0f img/s  "
        "%.1f s%s\n",
        (long long)r->epoch, (long long)r->epochs, (long long)r->steps, r->train_loss,
        100.0 * r->train_accuracy, r->images_per_second, r->seconds, amp);
  }
  fflush(stdout);
}

/* SIGINT / SIGTERM (docs/reliability.md, "Signals"): the first sets the
 * flag the trainer reads before each step; a second ends the process at
 * once, by the signal's default action. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
  if (stop_signal) {
    signal(sig, SIG_DFL); /* async-signal-safe, as raise is */
    raise(sig);
    return;
  }
  stop_signal = sig;
}

static void trap_stop_signals(int on) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_stop_signal : SIG_DFL;
  sa.sa_flags = SA_RESTART; /* reads and writes go on; the flag is read between steps */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* A kernel that crashes (docs/reliability.md, "Kernels that crash"): one
 * line naming it (rank, variant, node, op, impl, module: preformatted at
 * bind, bp_exec_fault_line), then the signal's default action. Only
 * write(2) and async-signal-safe calls here. */
static void on_fatal_signal(int sig) {
  static const char *const names[] = {[SIGSEGV] = "SIGSEGV", [SIGBUS] = "SIGBUS",
                                      [SIGILL] = "SIGILL",   [SIGFPE] = "SIGFPE",
                                      [SIGABRT] = "SIGABRT"};
  const char *name = sig > 0 && sig < (int)(sizeof names / sizeof names[0]) && names[sig]
                         ? names[sig]
                         : "a fatal signal";
  int len = 0;
  const char *line = bp_exec_fault_line(&len);
  if (line) {
    static const char head[] = "blueprint train: ", mid[] = " in a kernel: ";
    ssize_t w = write(STDERR_FILENO, head, sizeof head - 1);
    w = write(STDERR_FILENO, name, strlen(name));
    w = write(STDERR_FILENO, mid, sizeof mid - 1);
    w = write(STDERR_FILENO, line, (size_t)len);
    (void)w;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

/* A kernel that calls exit() during a step: reported, and the process
 * fails (exit status 70) instead of ending as the kernel asked. */
static void exit_during_step(void) {
  int len = 0;
  const char *line = bp_exec_fault_line(&len);
  if (!line) return;
  static const char head[] = "blueprint train: a kernel called exit() during a step: ";
  ssize_t w = write(STDERR_FILENO, head, sizeof head - 1);
  w = write(STDERR_FILENO, line, (size_t)len);
  (void)w;
  _exit(BP_CLI_EXIT_KERNEL_EXIT);
}

static void trap_kernel_faults(void) {
  static int once;
  if (once++) return;
  static char alt[1 << 16]; /* the main thread's stack overflowing still reports */
  stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
  (void)sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) sigaction(sigs[k], &sa, NULL);
  atexit(exit_during_step);
}

/* Every file the run reads or writes, checked against each other before
 * any work (path_guard.h). Returns 0 or the exit status. */
static int check_paths(const bp_cli_train_args *a) {
  const bp_train_options *o = &a->options;
  bp_path_use uses[8 + BP_CLI_MAX_PLUGINS];
  int n = 0;
  uses[n++] = (bp_path_use){a->model_path, "the model file", BP_PATH_INPUT, NULL};
  if (!o->data_dir || !bp_data_is_synthetic(o->data_dir))
    uses[n++] = (bp_path_use){o->data_dir ? o->data_dir : BP_DATA_DEFAULT_DIR, "the data file",
                              BP_PATH_INPUT_DIR, NULL};
  uses[n++] = (bp_path_use){o->resume_path, "--resume", BP_PATH_INPUT, NULL};
  for (int k = 0; k < o->plugin_path_count; k++) {
    struct stat sb;
    const int dir = stat(o->plugin_paths[k], &sb) == 0 && S_ISDIR(sb.st_mode);
    uses[n++] = (bp_path_use){o->plugin_paths[k], "the module file",
                              dir ? BP_PATH_INPUT_DIR : BP_PATH_INPUT, NULL};
  }
  uses[n++] = (bp_path_use){o->checkpoint_path, "--checkpoint", BP_PATH_OUTPUT, "--resume"};
  uses[n++] = (bp_path_use){o->metrics_path, "--metrics", BP_PATH_OUTPUT, NULL};
  uses[n++] = (bp_path_use){o->autotune_cache, "--autotune-cache", BP_PATH_IN_OUT, NULL};
  return bp_cli_check_paths(a->command, uses, n);
}

static int run(bp_cli_train_args *a) {
  bar_state bar = {isatty(STDOUT_FILENO) && !a->quiet, 0.0, NAN, NAN, 0};
  if (bar.tty) {
    a->options.on_progress = draw_bar;
    a->options.progress_user = &bar;
    a->options.progress_interval = 0.5;
  }
  bp_trainer *t = NULL;
  /* refused before any work: a checkpoint that could never be written */
  if (a->options.checkpoint_path && bp_output_check(a->options.checkpoint_path, "checkpoint")) {
    bp_cli_report("train", "%s", bp_last_error());
    return BP_CLI_EXIT_RUN;
  }
  const int clash = check_paths(a);
  if (clash) return clash; /* 2: an output names an input; 1: an unusable directory */
  bp_profile *prof = NULL; /* --profile: outlives the trainer */
  if (a->profile && bp_profile_create(NULL, &prof) != BP_OK) {
    bp_cli_report("train", "%s", bp_last_error());
    return BP_CLI_EXIT_RUN;
  }
  a->options.profile = prof;
  stop_signal = 0;
  a->options.stop_flag = &stop_signal;
  trap_stop_signals(1);
  trap_kernel_faults();
  if (bp_trainer_create_from_file(a->model_path, &a->options, &t) != BP_OK) {
    trap_stop_signals(0);
    bp_cli_report("train", "%s", bp_last_error());
    bp_profile_destroy(prof);
    bp_mpi_abort(BP_CLI_EXIT_RUN);
    return stop_signal ? 128 + stop_signal : BP_CLI_EXIT_RUN;
  }
  /* under mpirun the processes would see a signal at different steps and
   * part in a collective: there the signal ends the process, and mpirun the job */
  if (bp_trainer_local_ranks(t) < bp_trainer_world(t)) {
    trap_stop_signals(0);
    if (stop_signal) raise(stop_signal);
  }
  /* under mpirun only rank 0 speaks; the others' stdout goes nowhere */
  if (bp_trainer_rank(t) != 0 && !freopen("/dev/null", "w", stdout)) {
    bp_cli_report("train", "rank %d: cannot silence standard output: %s", bp_trainer_rank(t),
                  strerror(errno));
    bp_mpi_abort(BP_CLI_EXIT_RUN);
  }
  const bp_model *m = bp_trainer_model(t);
  const bp_train_state s = bp_trainer_state(t);
  printf(
      "model %s: %lld training and %lld test images, batch %lld, %lld steps per epoch, "
      "%lld epochs, %s lr %g (%s",
      m->name, (long long)bp_trainer_train_samples(t), (long long)bp_trainer_test_samples(t),
      (long long)m->train.batch, (long long)bp_trainer_steps_per_epoch(t),
      (long long)bp_trainer_epochs(t), bp_optimizer_name(m->train.optimizer), m->train.lr,
      bp_lr_schedule_name(m->train.schedule));
  if (m->train.warmup_epochs > 0) printf(", warmup %g epochs", m->train.warmup_epochs);
  printf(")");
  if (bp_trainer_transport(t))
    printf(", %d ranks (%s)", bp_trainer_world(t), bp_trainer_transport(t));
  if (a->options.resume_path)
    printf(", resumed at epoch %llu step %llu", (unsigned long long)s.epoch + 1,
           (unsigned long long)s.step);
  printf("\n");
  if (a->options.resume_path && a->seed_given && s.seed != a->options.seed)
    printf("--seed %llu is not used: a resumed run keeps its checkpoint's seed %llu (data "
           "order and augmentation continue as they were)\n",
           (unsigned long long)a->options.seed, (unsigned long long)s.seed);
  if (bp_trainer_graphs(t))
    printf("steps run as device graphs: one eager step, then captured and replayed\n");
  else if (bp_trainer_graph_note(t)[0])
    printf("%s\n", bp_trainer_graph_note(t));
  if (!a->quiet || a->verbose) bp_cli_kernel_table(stdout, t, NULL, a->verbose);
  fflush(stdout);
  if (bp_trainer_rank(t) == 0) bp_cli_kernel_notes("train", t);
  /* what --autotune measured and kept (docs/tuning.md), on stderr beside the notes */
  if (bp_trainer_rank(t) == 0) fputs(bp_trainer_autotune_report(t), stderr);
  int rc = 0;
  double last_test = NAN;
  int64_t diverged = 0; /* --keep-going-nonfinite: the first non-finite epoch */
  int saved = 0;        /* the last epoch of this process wrote the checkpoint */
  if (bp_trainer_done(t))
    printf("nothing to train: the run has done %llu of its %lld epochs (step %llu of the run)\n",
           (unsigned long long)s.epoch, (long long)bp_trainer_epochs(t),
           (unsigned long long)s.global_step);
  while (!bp_trainer_done(t) && !stop_signal) {
    bp_epoch_report r;
    bar.has_metrics = 0;
    bar.last_draw = -1.0;
    bp_status st = bp_trainer_train_epoch(t, &r);
    clear_bar(&bar);
    if (st != BP_OK) {
      fflush(stdout);
      bp_cli_report("train", "%s", bp_last_error());
      bp_mpi_abort(BP_CLI_EXIT_RUN);
      rc = BP_CLI_EXIT_RUN;
      break;
    }
    print_epoch(&r);
    if (r.diverged && !diverged) diverged = r.epoch;
    saved = r.checkpointed;
    /* a device (not the cpu): how rank 0's steps reached it */
    if ((bp_trainer_graphs(t) || bp_trainer_graph_note(t)[0]) && r.exec.steps)
      printf("  rank 0 per step: %.2f graph launches, %.2f kernel calls, %.2f host tasks, "
             "%.2f syncs, %.2f waits, %.2f events\n",
             (double)r.exec.graph_launches / (double)r.exec.steps,
             (double)r.exec.kernel_calls / (double)r.exec.steps,
             (double)r.exec.host_tasks / (double)r.exec.steps,
             (double)r.exec.syncs / (double)r.exec.steps,
             (double)r.exec.waits / (double)r.exec.steps,
             (double)r.exec.events / (double)r.exec.steps);
    if (r.exec.comm_us && r.exec.steps)
      printf("  rank 0 per step: %.3f ms in collectives, %.3f ms of them during backward\n",
             (double)r.exec.comm_us / 1e3 / (double)r.exec.steps,
             (double)r.exec.comm_overlap_us / 1e3 / (double)r.exec.steps);
    if (r.complete) last_test = r.test_accuracy;
  }
  const bp_train_state end = bp_trainer_state(t);
  if (rc == 0 && diverged) { /* it went on as asked; it still failed */
    fflush(stdout);
    bp_cli_report("train",
                  "the training loss or state was non-finite from epoch %lld on (the run "
                  "diverged); those epochs were not checkpointed",
                  (long long)diverged);
    rc = BP_CLI_EXIT_RUN;
  }
  if (rc == 0 && stop_signal && a->options.checkpoint_path && !saved &&
      bp_trainer_save(t, a->options.checkpoint_path) != BP_OK) { /* stopped before a step */
    bp_cli_report("train", "%s", bp_last_error());
    rc = BP_CLI_EXIT_RUN;
  }
  if (rc == 0 && stop_signal) {
    fflush(stdout);
    char resume[600] = "; no --checkpoint was given, so the run cannot be resumed";
    if (a->options.checkpoint_path)
      snprintf(resume, sizeof resume, "; checkpoint '%.256s' holds it: continue with --resume %.256s",
               a->options.checkpoint_path, a->options.checkpoint_path);
    bp_cli_report("train", "stopped by %s at epoch %llu, step %llu (step %llu of the run)%s",
                  stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)end.epoch + 1,
                  (unsigned long long)end.step, (unsigned long long)end.global_step, resume);
    rc = 128 + stop_signal;
  } else if (rc == 0 && end.epoch < (uint64_t)bp_trainer_epochs(t))
    printf("stopped after step %llu of the run (--stop-after-steps); continue with --resume %s\n",
           (unsigned long long)end.global_step, a->options.checkpoint_path);
  else if (rc == 0 && !isnan(last_test))
    printf("test accuracy %.2f%%\n", 100.0 * last_test);
  if (rc == 0 && prof) bp_cli_profile_report(stdout, prof, "train");
  if (fflush(stdout) != 0 || ferror(stdout)) {
    bp_cli_report("train", "cannot write to standard output: %s", strerror(errno));
    rc = BP_CLI_EXIT_RUN;
  }
  bp_trainer_destroy(t);
  bp_profile_destroy(prof);
  trap_stop_signals(0);
  return rc;
}

int bp_cmd_train(int argc, char **argv) {
  bp_cli_train_args a;
  if (bp_cli_train_parse(argc, argv, 0, &a) != 0) return BP_CLI_EXIT_USAGE;
  if (a.help) {
    fputs(usage_text, stdout);
    return fflush(stdout) == 0 ? 0 : BP_CLI_EXIT_RUN;
  }
  return run(&a);
}
