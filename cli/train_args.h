/* The command lines of `blueprint train` and `blueprint eval`: one parser
 * for both (eval takes a subset of train's options). Private to the CLI. */
#ifndef BLUEPRINT_CLI_TRAIN_ARGS_H
#define BLUEPRINT_CLI_TRAIN_ARGS_H

#include "blueprint/train.h"
#include "cli_util.h"

#define BP_CLI_EXIT_RUN 1   /* the model, the data, a kernel or a file failed */
#define BP_CLI_EXIT_USAGE 2 /* the command line is wrong */
#define BP_CLI_EXIT_KERNEL_EXIT 70 /* a kernel called exit() during a step (EX_SOFTWARE) */
#define BP_CLI_MAX_PLUGINS 64

typedef struct bp_cli_train_args {
  const char *command; /* "train" or "eval": names the command in messages */
  const char *model_path;
  bp_train_options options; /* strings borrowed from argv */
  const char *plugins[BP_CLI_MAX_PLUGINS];
  int help;
  int quiet;   /* no progress bar, no kernel table */
  int verbose; /* the kernel of every node too */
  int profile; /* --profile: time every node, print profile_report.h's table */
  int seed_given; /* --seed on the command line (a resume keeps its checkpoint's) */
} bp_cli_train_args;

/* Parses argv (argv[0] is the command). eval: 1 for `blueprint eval`.
 * Returns 0, or -1 after reporting one line on stderr. */
int bp_cli_train_parse(int argc, char **argv, int eval, bp_cli_train_args *out);

#endif
