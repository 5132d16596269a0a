/* What `train`, `eval` and `predict` print about kernels at start: pin warnings,
 * refused modules on BP_PLUGIN_PATH, and which kernel each op got. Private
 * to the CLI. */
#ifndef BLUEPRINT_CLI_KERNEL_REPORT_H
#define BLUEPRINT_CLI_KERNEL_REPORT_H

#include <stdio.h>

#include "blueprint/exec.h"
#include "blueprint/train.h"

/* On stderr, "blueprint <command>: ..." lines: each pin warning, and one
 * note when modules found through BP_PLUGIN_PATH were refused. */
void bp_cli_kernel_notes(const char *command, const bp_trainer *trainer);

/* On out: a compact table, one line per (op, impl, device) with its node
 * count; with `verbose` also one line per bound node. `variant_prefix`
 * (optional) keeps only variants whose name starts with it ("eval"). */
void bp_cli_kernel_table(FILE *out, const bp_trainer *trainer, const char *variant_prefix,
                         int verbose);

/* On out, "  warning: LINE" for each line of text (the kernel checks'
 * warnings, kernel_checks.h: a priority pick much slower than the
 * default pick); the tables call it after their op rows. */
void bp_cli_kernel_warnings(FILE *out, const char *text);

/* On out, for one segment of one variant of an executor (predict's
 * evaluation pass): the same compact table, "kernels (pins: P):" or
 * "kernels (no pins):" first; with `verbose` also the kernel of every
 * node. */
void bp_cli_exec_kernel_table(FILE *out, const bp_exec *exec, int variant, bp_segment segment,
                              const char *pins, int verbose);

#endif
