/* The graph object (graph.h) that graph_build.c builds and graph.c reads
 * back: per variant, the nodes of each segment in run order. Not
 * installed. */
#ifndef BLUEPRINT_GRAPH_IMPL_H
#define BLUEPRINT_GRAPH_IMPL_H

#include "blueprint/graph.h"

typedef struct seg_list {
  bp_node *nodes;
  int count, cap;
} seg_list;

typedef struct variant_graph {
  seg_list segs[BP_SEGMENT_COUNT];
  int is_eval;
  int64_t global_batch;
} variant_graph;

struct bp_graph {
  const bp_model *model;
  const bp_plan *plan;
  bp_graph_options options;
  int variant_count;
  variant_graph *variants;
  bp_graph_tensors tensors;      /* from the compiler's record */
  bp_graph_constant constants[1]; /* the LARS segment table, when present */
  int constant_count;
};

/* Moves every span of `graph` to where its plan now lays out what the span
 * covers (bp_node_tensor: a slot or regions), after the plan was laid out
 * again (liveness packing, session.c), and checks the graph against the
 * plan as bp_graph_build does (graph.h invariants; bp_liveness_check_graph).
 * The spans' sizes never change: a layout moves bytes, it does not resize
 * them. */
bp_status bp_graph_relocate(bp_graph *graph);

#endif
