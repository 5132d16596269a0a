/* The blueprint command: dispatches to one subcommand (docs/architecture.md,
 * "Command line"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi.h"
#include "commands.h"
#include "env_options.h"

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} commands[] = {
    {"plan", bp_cmd_plan, "lay out a model's memory plan and print it"},
    {"plugins", bp_cmd_plugins, "list op modules, kernels and which kernel each op gets"},
    {"train", bp_cmd_train, "train a model on Fashion-MNIST (or MNIST-format data)"},
    {"eval", bp_cmd_eval, "evaluate a checkpoint on the test set"},
    {"validate", bp_cmd_validate, "check every kernel against the reference kernel of its op"},
    {"predict", bp_cmd_predict, "classify images with a trained checkpoint, one at a time"},
    {"export", bp_cmd_export, "write a trained checkpoint as an ONNX inference graph"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: blueprint COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\n'blueprint COMMAND --help' describes one command; 'blueprint --version'\n"
               "prints the version and the module ABI. Which kernel runs each node:\n"
               "'blueprint train --autotune' (times them in whole steps, keeps the default\n"
               "unless faster; docs/tuning.md), --kernels pins, 'blueprint validate'.\n");
  bp_cli_env_help(out);
}

int main(int argc, char **argv) {
  bp_cli_env_openmp(); /* before any module loads */
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("blueprint %s (module ABI %d.%d)\n", BP_VERSION, BP_ABI_MAJOR, BP_ABI_MINOR);
    return fflush(stdout) == 0 ? 0 : 1;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "blueprint: unknown command '%s' (try 'blueprint --help')\n", argv[1]);
  return 2;
}
