/* The graph object's accessors and its end (graph.h); graph_build.c
 * builds it. Passes over a graph (liveness, binding) read it through
 * these, so none of them depends on the builder. */
#include <stdlib.h>

#include "graph-impl.h"

static const char *const segment_names[BP_SEGMENT_COUNT] = {
    [BP_SEGMENT_TRANSFER] = "transfer",   [BP_SEGMENT_ZERO_GRAD] = "zero_grad",
    [BP_SEGMENT_CAST] = "cast",           [BP_SEGMENT_FORWARD] = "forward",
    [BP_SEGMENT_LOSS] = "loss",           [BP_SEGMENT_BACKWARD] = "backward",
    [BP_SEGMENT_CAST_GRAD] = "cast_grad", [BP_SEGMENT_COMM] = "comm",
    [BP_SEGMENT_UPDATE] = "update",       [BP_SEGMENT_GATHER] = "gather",
    [BP_SEGMENT_EMA] = "ema",             [BP_SEGMENT_EVAL] = "eval",
    [BP_SEGMENT_RESET] = "reset",         [BP_SEGMENT_INIT] = "init",
    [BP_SEGMENT_STATE] = "state",
};

const char *bp_segment_name(bp_segment s) {
  return (int)s >= 0 && s < BP_SEGMENT_COUNT ? segment_names[s] : "?";
}

void bp_graph_destroy(bp_graph *g) {
  if (!g) return;
  if (g->variants)
    for (int v = 0; v < g->variant_count; v++)
      for (int s = 0; s < BP_SEGMENT_COUNT; s++) free(g->variants[v].segs[s].nodes);
  free(g->variants);
  for (int c = 0; c < g->constant_count; c++) free((void *)g->constants[c].data);
  free(g);
}

const bp_plan *bp_graph_plan(const bp_graph *g) { return g ? g->plan : NULL; }
const bp_graph_options *bp_graph_get_options(const bp_graph *g) { return g ? &g->options : NULL; }

static const variant_graph *variant_of(const bp_graph *g, int v) {
  return g && v >= 0 && v < g->variant_count ? &g->variants[v] : NULL;
}

int bp_graph_variant_is_eval(const bp_graph *g, int v) {
  const variant_graph *vg = variant_of(g, v);
  return vg ? vg->is_eval : 0;
}

int64_t bp_graph_variant_global_batch(const bp_graph *g, int v) {
  const variant_graph *vg = variant_of(g, v);
  return vg ? vg->global_batch : 0;
}

int bp_graph_node_count(const bp_graph *g, int v, bp_segment s) {
  const variant_graph *vg = variant_of(g, v);
  return vg && (int)s >= 0 && s < BP_SEGMENT_COUNT ? vg->segs[s].count : 0;
}

const bp_node *bp_graph_node(const bp_graph *g, int v, bp_segment s, int index) {
  if (index < 0 || index >= bp_graph_node_count(g, v, s)) return NULL;
  return &g->variants[v].segs[s].nodes[index];
}

const bp_graph_tensors *bp_graph_get_tensors(const bp_graph *g) { return g ? &g->tensors : NULL; }

int bp_graph_constant_count(const bp_graph *g) { return g ? g->constant_count : 0; }

const bp_graph_constant *bp_graph_constant_get(const bp_graph *g, int index) {
  return g && index >= 0 && index < g->constant_count ? &g->constants[index] : NULL;
}
