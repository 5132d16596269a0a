/* The one place the CLI reads environment variables (env_options.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* secure_getenv */
#endif
#include "env_options.h"

#include <stdlib.h>
#include <string.h>

static bp_cli_env env;
static int env_read;

/* Sets module option `name` to `value` (replacing an earlier value). */
static void set_module_option(const char *name, const char *value) {
  bp_registry_options *r = &env.registry;
  const size_t n = strlen(name);
  int i = 0;
  while (i < r->module_option_count &&
         !(strncmp(env.module_options[i], name, n) == 0 && env.module_options[i][n] == '='))
    i++;
  if (i == BP_CLI_MODULE_OPTIONS) return; /* the four names above: never full */
  snprintf(env.module_options[i], sizeof env.module_options[i], "%s=%s", name, value);
  env.module_option_ptrs[i] = env.module_options[i];
  if (i == r->module_option_count) r->module_option_count++;
  r->module_options = env.module_option_ptrs;
}

/* A module's switch, passed on as module option `name` when set. */
static void module_switch(const char *variable, const char *name) {
  const char *v = getenv(variable);
  if (v) set_module_option(name, v);
}

static void read_env(void) {
  bp_registry_options_init(&env.registry);
  /* a module search path decides what code loads: never taken from a
   * set-user-ID run's caller */
  env.registry.search_path = secure_getenv("BP_PLUGIN_PATH");
  const char *log = getenv("BP_LOG");
  if (log && strcmp(log, "info") == 0) env.registry.log_level = BP_ABI_LOG_INFO;
  if (log && strcmp(log, "debug") == 0) env.registry.log_level = BP_ABI_LOG_DEBUG;
  env.registry.pins = getenv("BP_KERNELS");
  const char *s = getenv("BP_THREADS");
  if (s && *s) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (*end == '\0' && v >= 1 && v <= 1024)
      env.threads = (int)v;
    else
      fprintf(stderr, "blueprint: BP_THREADS='%s' is not an integer in [1, 1024]; ignored\n", s);
  }
  const char *fuse = getenv("BP_FUSE");
  env.no_fuse = fuse && strcmp(fuse, "0") == 0;
  const char *shared = getenv("BP_MPI_SHARED");
  env.no_mpi_shared = shared && strcmp(shared, "0") == 0;
  const char *tf32 = getenv("BP_TF32");
  env.no_tf32 = tf32 && strcmp(tf32, "0") == 0;
  /* op modules' switches: the modules read them at init (ABI 1.6) */
  module_switch("BP_TF32", "tf32");
  module_switch("BP_DETERMINISTIC", "deterministic");
  module_switch("BP_CPU_ISA", "cpu_isa");
  module_switch("BP_DNNL_LIBRARY", "dnnl_library");
}

const bp_cli_env *bp_cli_env_get(void) {
  if (!env_read) { /* the CLI reads it on its one thread, before any trainer */
    read_env();
    env_read = 1;
  }
  return &env;
}

void bp_cli_env_train(bp_train_options *o) {
  const bp_cli_env *e = bp_cli_env_get();
  o->registry_options = &e->registry;
  o->threads = e->threads;
  o->no_fuse = e->no_fuse;
  o->no_mpi_shared = e->no_mpi_shared;
}

void bp_cli_env_validate(bp_validate_options *o) {
  const bp_cli_env *e = bp_cli_env_get();
  o->threads = e->threads;
  o->no_fuse = e->no_fuse;
  o->no_tf32 = e->no_tf32;
}

void bp_cli_env_set_deterministic(void) {
  (void)bp_cli_env_get();
  set_module_option("deterministic", "1");
}

void bp_cli_env_set_no_tf32(void) {
  (void)bp_cli_env_get();
  set_module_option("tf32", "0");
  env.no_tf32 = 1;
}

void bp_cli_env_openmp(void) {
  /* oneDNN's OpenMP threads spin between parallel regions by default. When
   * anything else wants the cores (another rank, another process), a
   * spinning thread holds a core its partner needs, and a team waits at
   * every barrier for a preempted member: measured on the 2-core CI
   * machine under load, CNN training ran 5-10x slower (docs/training.md).
   * Sleeping costs microseconds per GEMM call. A user's own setting wins. */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}

void bp_cli_env_help(FILE *out) {
  fprintf(out,
          "\nenvironment (docs/environment.md):\n"
          "  BP_PLUGIN_PATH     colon-separated absolute module directories or files,\n"
          "                     searched after --plugin (ignored in set-user-ID runs)\n"
          "  BP_KERNELS         default kernel pins op_glob=impl,... (--kernels wins;\n"
          "                     wins over the model file's)\n"
          "  BP_LOG             info or debug: print op modules' messages of that level\n"
          "                     too (default: errors and warnings)\n"
          "  BP_THREADS         kernel threads per rank, 1..1024 (default: the cores\n"
          "                     divided by the ranks on this machine)\n"
          "  BP_FUSE            0: never fuse batchnorm + relu (train, eval, predict,\n"
          "                     plan, validate --model)\n"
          "  BP_MPI_SHARED      0: under mpirun, ranks on one machine exchange MPI\n"
          "                     messages instead of sharing memory\n"
          "  BP_TF32            0: CUDA modules use no TF32 (as --no-tf32); validate\n"
          "                     then holds cuDNN/cuBLAS FP32 outputs to FP32 tolerance\n"
          "                     (module option tf32)\n"
          "  BP_DETERMINISTIC   1: CUDA modules use deterministic algorithms (as\n"
          "                     --deterministic; module option deterministic)\n"
          "  BP_CPU_ISA         avx512f, avx2 or default: lowers the cpu module's\n"
          "                     instruction set (default: the best the CPU has;\n"
          "                     module option cpu_isa)\n"
          "  BP_DNNL_LIBRARY    the oneDNN library file the blas module opens (module\n"
          "                     option dnnl_library)\n"
          "  OPENBLAS_CORETYPE  OpenBLAS's own kernel choice (the blas module keeps a\n"
          "                     user's value)\n"
          "  OMP_WAIT_POLICY    set to PASSIVE unless it or GOMP_SPINCOUNT is set\n");
}
