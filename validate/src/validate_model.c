/* Cases from a model (validate --model FILE): the model's plan compiled
 * with its own training settings, unfused and (unless options.no_fuse) with
 * batchnorm + relu fused, and the graphs built with the default graph
 * options; every node of every variant becomes a case with the node's
 * descriptors (DTensors and spans, as the executor passes them), its
 * attributes and its aliasing (an output that is one of its inputs), once
 * per distinct (op, descriptors, attributes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/dtype.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/session.h"
#include "validate-impl.h"

/* The node tensor as the executor describes it (bind.c). */
static void describe(const bp_plan *plan, int v, const bp_node_tensor *nt, bp_abi_tensor *d,
                     uint64_t *offset) {
  if (nt->id >= 0) {
    const bp_dtensor *t = bp_plan_tensor(plan, v, nt->id);
    *d = vc_tensor_desc((int32_t)t->dtype, t->shape.n, t->shape.h, t->shape.w, t->shape.c,
                        t->padded_c);
    d->slot_bytes = t->slot_bytes;
    *offset = t->offset;
  } else {
    *d = vc_span_desc((int32_t)nt->dtype, (int64_t)(nt->span.bytes / bp_dtype_size(nt->dtype)));
    *offset = nt->span.offset;
  }
}

static int same_case(const vc_case *a, const vc_case *b) {
  if (strcmp(a->op, b->op) != 0 || a->num_inputs != b->num_inputs ||
      a->num_outputs != b->num_outputs || a->attr_size != b->attr_size ||
      memcmp(a->attrs, b->attrs, a->attr_size) != 0 || memcmp(a->alias, b->alias, sizeof a->alias))
    return 0;
  for (int i = 0; i < a->num_inputs; i++)
    if (memcmp(&a->in[i].d, &b->in[i].d, sizeof a->in[i].d) != 0) return 0;
  for (int o = 0; o < a->num_outputs; o++)
    if (memcmp(&a->out[o].d, &b->out[o].d, sizeof a->out[o].d) != 0) return 0;
  return 1;
}

/* Appends the distinct cases of `model`'s graph compiled with `co` to
 * *cases_io (*count_io of *cap_io used; grown with realloc). */
static bp_status add_cases(const bp_registry *r, const char *path, const bp_model *model,
                           const bp_compile_options co, vc_case **cases_io, int *count_io,
                           int *cap_io) {
  bp_session *session = NULL;
  vc_case *cases = *cases_io;
  int count = *count_io, cap = *cap_io;
  bp_session_options so;
  bp_session_options_init(&so, model);
  so.compile = co;
  bp_status st = bp_session_create(model, &so, &session);
  if (st != BP_OK) goto done;
  const bp_plan *plan = bp_session_plan(session);
  const bp_graph *graph = bp_session_graph(session);
  for (int v = 0; v < bp_plan_variant_count(plan); v++)
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int k = 0; k < bp_graph_node_count(graph, v, (bp_segment)s); k++) {
        const bp_node *n = bp_graph_node(graph, v, (bp_segment)s, k);
        if (count == cap) {
          cap = cap ? 2 * cap : 64;
          vc_case *grown = realloc(cases, (size_t)cap * sizeof *grown);
          if (!grown) {
            st = bp_fail(BP_ERR_NOMEM, "out of memory collecting the cases of %s", path);
            goto done;
          }
          cases = grown;
        }
        vc_case *c = &cases[count];
        vc_case_init(c, n->op); /* n->op: static storage (graph.h) */
        snprintf(c->name, sizeof c->name, "%.60s%s%.30s", n->name, v ? " @" : "",
                 v ? bp_plan_variant(plan, v)->name : "");
        c->num_inputs = n->num_inputs;
        c->num_outputs = n->num_outputs;
        uint64_t in_off[VC_MAX];
        for (int i = 0; i < n->num_inputs; i++)
          describe(plan, v, &n->inputs[i], &c->in[i].d, &in_off[i]);
        for (int o = 0; o < n->num_outputs; o++) {
          uint64_t off;
          describe(plan, v, &n->outputs[o], &c->out[o].d, &off);
          for (int i = 0; i < n->num_inputs; i++)
            if (in_off[i] == off) c->alias[o] = i;
        }
        c->attr_size = n->attr_size < sizeof c->attrs ? n->attr_size : (uint32_t)sizeof c->attrs;
        memcpy(c->attrs, &n->attrs, c->attr_size);
        vc_op_complete(c);
        vc_layer_complete(r, c, 0);
        int seen = 0;
        for (int j = 0; j < count && !seen; j++) seen = same_case(&cases[j], c);
        if (!seen) count++;
      }
done:
  *cases_io = cases;
  *count_io = count;
  *cap_io = cap;
  bp_session_destroy(session);
  return st;
}

bp_status vc_model_cases(const bp_registry *r, const char *path, int fuse_too, int64_t batch,
                         vc_case **cases_out, int *count_out) {
  bp_model *model = NULL;
  vc_case *cases = NULL;
  int count = 0, cap = 0;
  bp_status st = bp_model_load_with_registry(path, r, &model); /* module layer types too */
  if (st != BP_OK) goto done;
  /* the unfused graph, and the fused one where fusion is on: a run takes
   * either, by its device and pins (bp_fuse_bn_relu_allowed, model.h) */
  bp_compile_options co = bp_compile_options_from_model(model);
  if (batch > 0) co.batch = batch; /* validate --batch: its variants, its last partial batch */
  const int fusion = co.fuse_bn_relu && fuse_too;
  for (int fuse = 0; fuse <= fusion && st == BP_OK; fuse++) {
    co.fuse_bn_relu = fuse;
    st = add_cases(r, path, model, co, &cases, &count, &cap);
  }
  if (st != BP_OK) goto done;
  *cases_out = cases;
  *count_out = count;
  cases = NULL;
done:
  free(cases);
  bp_model_destroy(model);
  return st;
}
