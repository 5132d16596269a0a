/* A model parsed, compiled and its graph built in one call, for the tests
 * that bind executors to it themselves (test_kernel_state.c,
 * test_ops_xnnpack.c). */
#ifndef BP_TESTS_GRAPH_UTIL_H
#define BP_TESTS_GRAPH_UTIL_H

#include <stdint.h>

#include "blueprint/graph.h"

/* Parses `text` (named `name` in messages), compiles it with every batch,
 * eval batch and train size set to `batch`, and builds its graph; fails
 * the test with the library's message on any error. */
void graph_util_build(const char *text, const char *name, int64_t batch, bp_model **model_out,
                      bp_plan **plan_out, bp_graph **graph_out);
/* Destroys what graph_util_build made (NULLs are fine). */
void graph_util_free(bp_model *model, bp_plan *plan, bp_graph *graph);

#endif
