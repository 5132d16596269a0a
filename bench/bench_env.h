/* The environment variables the bench programs honour, as the blueprint
 * command does (cli/env_options.c; docs/environment.md): the libraries
 * read none, so each program maps them to options. Header-only. */
#ifndef BLUEPRINT_BENCH_ENV_H
#define BLUEPRINT_BENCH_ENV_H

#include <stdlib.h>
#include <string.h>

#include "blueprint/registry.h"
#include "blueprint/threads.h"

/* BP_THREADS when it is an integer in 1..1024, else 0. */
static inline int bench_env_threads(void) {
  const char *s = getenv("BP_THREADS");
  char *end = NULL;
  const long v = s && *s ? strtol(s, &end, 10) : 0;
  return end && *end == '\0' && v >= 1 && v <= 1024 ? (int)v : 0;
}

/* One rank's threads, as in training: BP_THREADS, else every core. */
static inline int bench_env_rank_threads(void) {
  const int n = bench_env_threads();
  return n > 0 ? n : bp_threads_share(1);
}

/* Registry options from BP_PLUGIN_PATH, BP_KERNELS and BP_LOG. */
static inline bp_registry_options bench_env_registry(void) {
  bp_registry_options o;
  bp_registry_options_init(&o);
  o.search_path = getenv("BP_PLUGIN_PATH");
  o.pins = getenv("BP_KERNELS");
  const char *log = getenv("BP_LOG");
  if (log && strcmp(log, "info") == 0) o.log_level = BP_ABI_LOG_INFO;
  if (log && strcmp(log, "debug") == 0) o.log_level = BP_ABI_LOG_DEBUG;
  return o;
}

#endif
