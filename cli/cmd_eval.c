/* `blueprint eval MODEL --checkpoint FILE ...`: evaluates a checkpoint on
 * the test set and prints its loss and accuracy. The checkpoint is only
 * read, never written.
 *
 * The plan must be the one the checkpoint was written for: pass the same
 * --batch, --eval-batch, --ranks, --optimizer, --ema and --amp as the training run
 * when they differ from the model file's (a mismatch is refused).
 *
 * Exit status: 0 evaluated; 1 the model, the data, the checkpoint or a
 * kernel failed; 2 the command line is wrong. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kernel_report.h"
#include "profile_report.h"
#include "train_args.h"

static const char usage_text[] =
    "usage: blueprint eval MODEL --checkpoint FILE [options]\n"
    "       blueprint eval MODEL.onnx [options]\n"
    "\n"
    "Evaluates the checkpoint FILE of MODEL on the test set of Fashion-MNIST (or\n"
    "of --data DIR) and prints the test loss and accuracy.\n"
    "\n"
    "  --checkpoint FILE   the checkpoint (required but for an ONNX model, which\n"
    "                      otherwise runs its own initializers; only read)\n"
    "  --data DIR          MNIST-format directory (default: Fashion-MNIST), or\n"
    "                      synthetic[:HxWxC[:CLASSES]] (docs/training.md)\n"
    "  --test-limit N      use the first N test images\n"
    "  --batch B, --eval-batch B, --ranks R, --optimizer NAME, --ema, --amp,\n"
    "  --no-reuse          as in the training run, when not the model file's\n"
    "  --device KIND, --devices LIST, --kernels PINS, --trust-pins,\n"
    "  --plugin PATH       as for train\n"
    "  --deterministic, --no-tf32   GPU kernel switches, as for train\n"
    "  --quiet             no kernel table; --verbose: the kernel of every node\n"
    "  --profile           time every node; print each op's and node's share of an\n"
    "                      evaluation batch after the run (docs/profile.md)\n"
    "  -h, --help          print this help\n"
    "\n"
    "Exit status: 0 ok, 1 evaluation failed, 2 bad command line.\n";

int bp_cmd_eval(int argc, char **argv) {
  bp_cli_train_args a;
  if (bp_cli_train_parse(argc, argv, 1, &a) != 0) return BP_CLI_EXIT_USAGE;
  if (a.help) {
    fputs(usage_text, stdout);
    return fflush(stdout) == 0 ? 0 : BP_CLI_EXIT_RUN;
  }
  /* the checkpoint is read as a resume point and never written */
  a.options.resume_path = a.options.checkpoint_path;
  a.options.checkpoint_path = NULL;
  a.options.eval_only = 1;
  bp_trainer *t = NULL;
  bp_eval_report r;
  bp_profile *prof = NULL; /* --profile: outlives the trainer */
  bp_status st = a.profile ? bp_profile_create(NULL, &prof) : BP_OK;
  a.options.profile = prof;
  if (st == BP_OK) st = bp_trainer_create_from_file(a.model_path, &a.options, &t);
  if (st == BP_OK) {
    bp_cli_kernel_notes("eval", t);
    if (!a.quiet || a.verbose) bp_cli_kernel_table(stdout, t, "eval", a.verbose);
    st = bp_trainer_evaluate(t, &r);
  }
  if (st != BP_OK) {
    bp_cli_report("eval", "%s", bp_last_error());
    bp_trainer_destroy(t);
    bp_profile_destroy(prof);
    return BP_CLI_EXIT_RUN;
  }
  const bp_train_state s = bp_trainer_state(t);
  if (a.options.resume_path)
    printf("checkpoint %s: epoch %llu, step %llu of the run\n", a.options.resume_path,
           (unsigned long long)s.epoch, (unsigned long long)s.global_step);
  else
    printf("%s: the ONNX file's initializers\n", a.model_path);
  printf("test loss %.4f  test accuracy %.2f%%  (%lld images, %.1f s)\n", r.loss,
         100.0 * r.accuracy, (long long)r.samples, r.seconds);
  if (prof) bp_cli_profile_report(stdout, prof, "eval");
  bp_trainer_destroy(t);
  bp_profile_destroy(prof);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    bp_cli_report("eval", "cannot write to standard output: %s", strerror(errno));
    return BP_CLI_EXIT_RUN;
  }
  return 0;
}
