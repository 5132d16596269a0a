/* Sessions (session.h): compile, build the graph once, pack the plan over
 * that graph, then bind. bp_model_compile, for callers that want the plan
 * alone (blueprint plan), runs the same passes and drops the graph. */
#include "blueprint/session.h"

#include <stdio.h>
#include <stdlib.h>

#include "compile-impl.h"
#include "graph-impl.h"
#include "layer-impl.h"
#include "liveness-impl.h"

struct bp_session {
  bp_plan *plan;
  bp_graph *graph;
};

/* The graph options a plan compiled with `co` is built with: the step's
 * ranks, batch and epoch are the compiler's. */
static bp_graph_options graph_options_for(const bp_compile_options *co, bp_graph_options go) {
  go.world = co->world > 1 ? co->world : 1;
  go.global_batch = co->batch;
  go.train_size = co->train_size;
  return go;
}

/* Liveness packing (liveness.c) of the F regions of `plan`, finalized and
 * not yet packed, over `graph`, built on it: each F tensor's live range
 * over the step's node order, and tensors whose ranges never overlap (in
 * any variant) the same bytes (bp_plan_pack). A plan of more than
 * BP_LIVENESS_MAX_TENSORS feature and gradient slots is left unpacked. */
static bp_status pack(const bp_model *model, bp_plan *plan, const bp_graph *graph) {
  int32_t packed = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(plan); id++)
    packed += bp_region_is_packed(bp_plan_tensor(plan, 0, id)->region);
  if (packed > BP_LIVENESS_MAX_TENSORS) return BP_OK; /* quadratic packing: left as it is */
  const bp_model_tensors *rec = bp_model_tensors_of(plan);
  const bp_layer *loss = &model->layers[model->layer_count - 1];
  const int32_t logits =
      loss->input_count > 0 && loss->inputs[0] != BP_MODEL_INPUT ? rec->layers[loss->inputs[0]].out
                                                                 : -1;
  bp_live_range *live = NULL;
  uint64_t *rel = NULL;
  bp_status st;
  if ((st = bp_liveness_ranges(plan, graph, logits, &live)) == BP_OK &&
      (st = bp_liveness_offsets(plan, live, &rel)) == BP_OK)
    st = bp_plan_pack(plan, rel, live);
  free(live);
  free(rel);
  return st;
}

void bp_session_options_init(bp_session_options *o, const bp_model *model) {
  *o = (bp_session_options){.compile = bp_compile_options_from_model(model)};
  bp_graph_options_init(&o->graph);
}

bp_status bp_session_create(const bp_model *model, const bp_session_options *o,
                            bp_session **session_out) {
  if (!model || !o || !session_out)
    return bp_fail(BP_ERR_INVALID, "bp_session_create: NULL argument");
  bp_compile_options co = o->compile;
  char why[160]; /* fused only where the run's kernels allow it */
  if (co.fuse_bn_relu && o->registry)
    co.fuse_bn_relu = bp_fuse_bn_relu_allowed(o->registry, o->device ? o->device : "cpu",
                                              o->pins, why, sizeof why);
  bp_session *s = calloc(1, sizeof *s);
  if (!s) return bp_fail(BP_ERR_NOMEM, "out of memory creating a session");
  const bp_graph_options go = graph_options_for(&co, o->graph);
  bp_status st = bp_compile_plan(model, &co, &s->plan);
  if (st == BP_OK) st = bp_graph_build(model, s->plan, &go, &s->graph);
  if (st == BP_OK && !co.no_reuse) {
    st = pack(model, s->plan, s->graph);
    if (st == BP_OK && bp_plan_is_packed(s->plan)) st = bp_graph_relocate(s->graph);
    if (st != BP_OK) st = bp_compile_layout_fail(model, st);
  }
  if (st != BP_OK) {
    bp_session_destroy(s);
    return st;
  }
  *session_out = s;
  return BP_OK;
}

void bp_session_destroy(bp_session *s) {
  if (!s) return;
  bp_graph_destroy(s->graph); /* before the plan it reads */
  bp_plan_destroy(s->plan);
  free(s);
}

const bp_plan *bp_session_plan(const bp_session *s) { return s ? s->plan : NULL; }
const bp_graph *bp_session_graph(const bp_session *s) { return s ? s->graph : NULL; }

int bp_session_fused(const bp_session *s) {
  const bp_model_tensors *rec = s ? bp_model_tensors_of(s->plan) : NULL;
  return rec && rec->fuse_bn_relu;
}

bp_status bp_session_bind(const bp_session *s, bp_registry *registry, void *arena_base,
                          const bp_exec_options *options, bp_exec **exec_out) {
  if (!s) return bp_fail(BP_ERR_INVALID, "bp_session_bind: NULL session");
  return bp_exec_create(s->graph, registry, arena_base, options, exec_out);
}

/* The plan alone: the session's passes, its graph dropped. A model whose
 * graph cannot be built keeps its plan unpacked (the graph, built by the
 * caller, reports why); running out of memory fails. */
bp_status bp_model_compile(const bp_model *model, const bp_compile_options *options,
                           bp_plan **plan_out) {
  if (!model || !options || !plan_out)
    return bp_fail(BP_ERR_INVALID, "bp_model_compile: NULL argument");
  bp_plan *plan = NULL;
  bp_status st = bp_compile_plan(model, options, &plan);
  if (st != BP_OK || options->no_reuse) goto done;
  bp_graph_options defaults;
  bp_graph_options_init(&defaults);
  const bp_graph_options go = graph_options_for(options, defaults);
  bp_graph *graph = NULL;
  st = bp_graph_build(model, plan, &go, &graph);
  if (st != BP_OK && st != BP_ERR_NOMEM) {
    bp_clear_error(); /* left unpacked: the caller's own graph build reports it */
    st = BP_OK;
  } else if (st == BP_OK) {
    st = pack(model, plan, graph);
    bp_graph_destroy(graph);
  }
  if (st != BP_OK) st = bp_compile_layout_fail(model, st);
done:
  if (st != BP_OK) {
    bp_plan_destroy(plan);
    return st;
  }
  *plan_out = plan;
  return BP_OK;
}
