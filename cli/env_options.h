/* The environment variables the CLI honours, read in one place and mapped
 * to the libraries' options (the libraries read none;
 * docs/environment.md). Private to the CLI. */
#ifndef BLUEPRINT_CLI_ENV_OPTIONS_H
#define BLUEPRINT_CLI_ENV_OPTIONS_H

#include <stdio.h>

#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "blueprint/validate.h"

typedef struct bp_cli_env {
  bp_registry_options registry; /* BP_PLUGIN_PATH, BP_LOG, BP_KERNELS */
  int threads;                  /* BP_THREADS; 0: unset */
  int no_fuse;                  /* BP_FUSE=0 */
  int no_mpi_shared;            /* BP_MPI_SHARED=0 */
  int no_tf32;                  /* BP_TF32=0 (validate's tolerance) */
} bp_cli_env;

/* The variables, read on first use; a malformed value is reported once on
 * stderr and ignored, as if unset. Borrowed, valid until exit. */
const bp_cli_env *bp_cli_env_get(void);

/* Train and eval options from the environment (a command-line option,
 * applied after, wins). */
void bp_cli_env_train(bp_train_options *options);
void bp_cli_env_validate(bp_validate_options *options);

/* The GPU kernel switches --deterministic and --no-tf32: op modules read
 * BP_DETERMINISTIC and BP_TF32 at init (ops/shared/cuda_weighted.h), which
 * runs later, when the trainer loads them; this sets them for that. */
void bp_cli_env_set_deterministic(void);
void bp_cli_env_set_no_tf32(void);

/* The "environment:" section of `blueprint --help`. */
void bp_cli_env_help(FILE *out);

#endif
