/* The environment variables the CLI honours, read in one place and mapped
 * to the libraries' options (the libraries read none;
 * docs/environment.md). Private to the CLI. */
#ifndef BLUEPRINT_CLI_ENV_OPTIONS_H
#define BLUEPRINT_CLI_ENV_OPTIONS_H

#include <stdio.h>

#include "blueprint/registry.h"
#include "blueprint/train.h"
#include "blueprint/validate.h"

#define BP_CLI_MODULE_OPTIONS 4 /* tf32, deterministic, cpu_isa, dnnl_library */

typedef struct bp_cli_env {
  bp_registry_options registry; /* BP_PLUGIN_PATH, BP_LOG, BP_KERNELS, module options */
  int threads;                  /* BP_THREADS; 0: unset */
  int no_fuse;                  /* BP_FUSE=0 */
  int no_mpi_shared;            /* BP_MPI_SHARED=0 */
  int no_tf32;                  /* BP_TF32=0 (validate's tolerance) */
  /* module options (ABI 1.6, bp_abi_host.option): "name=value" */
  char module_options[BP_CLI_MODULE_OPTIONS][512];
  const char *module_option_ptrs[BP_CLI_MODULE_OPTIONS];
} bp_cli_env;

/* The variables, read on first use; a malformed value is reported once on
 * stderr and ignored, as if unset. Borrowed, valid until exit. */
const bp_cli_env *bp_cli_env_get(void);

/* Train and eval options from the environment (a command-line option,
 * applied after, wins). */
void bp_cli_env_train(bp_train_options *options);
void bp_cli_env_validate(bp_validate_options *options);

/* The GPU kernel switches --deterministic and --no-tf32: the module
 * options "deterministic" and "tf32" the CUDA modules read at init
 * (ops/shared/cuda_weighted.h), which runs later, when the trainer loads
 * them. They win over BP_DETERMINISTIC and BP_TF32. */
void bp_cli_env_set_deterministic(void);
void bp_cli_env_set_no_tf32(void);

/* OMP_WAIT_POLICY=PASSIVE unless it or GOMP_SPINCOUNT is set: call before
 * any module loads. */
void bp_cli_env_openmp(void);

/* The "environment:" section of `blueprint --help`. */
void bp_cli_env_help(FILE *out);

#endif
