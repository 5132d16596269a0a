/* Output paths that would destroy inputs (docs/reliability.md, "Outputs
 * against inputs"): before any work, every output path of a command is
 * resolved (symbolic links followed to their target, as a write through
 * them replaces the target) and compared, by device and inode, with every
 * input and every other output; a missing output is compared by its
 * resolved directory and name, and that directory must exist and be
 * writable. Private to the CLI. */
#ifndef BLUEPRINT_CLI_PATH_GUARD_H
#define BLUEPRINT_CLI_PATH_GUARD_H

typedef enum {
  BP_PATH_INPUT,     /* read: the model file, --resume, a module file */
  BP_PATH_INPUT_DIR, /* read: every regular file in this directory (--data) */
  BP_PATH_OUTPUT,    /* written: --checkpoint, --metrics, --svg */
  BP_PATH_IN_OUT,    /* read, then rewritten: --autotune-cache */
} bp_path_role;

typedef struct bp_path_use {
  const char *path; /* NULL: not given (skipped) */
  const char *what; /* "--checkpoint", "the model file", ... */
  bp_path_role role;
  const char *may_be; /* an output only: the `what` of the one input it may name
                         (--checkpoint may be --resume: the run continues in place) */
} bp_path_use;

/* 0 when no output is an input or another output and every output's
 * directory is there and writable; else one line on stderr ("blueprint
 * <command>: ...") and 2 for a clash (the command line is wrong), 1 for an
 * output directory that is missing or not writable (or no memory).
 * Touches nothing. */
int bp_cli_check_paths(const char *command, const bp_path_use *uses, int count);

#endif
