/* Layer types op modules register (host->register_layer, bp_abi.h): one
 * generic descriptor serves them all, reading the registered type
 * (bp_layer.module) and the attribute block the parser filled from the
 * YAML keys (bp_layer.attrs).
 *
 *   tensors   "<l>.saved<k>" as declared (bp_abi_layer_saved: F32 for
 *             FP32, S_MASK for INT8, F16 for FP16 under AMP, else T), then
 *             "<l>.out", "<l>.dout" of the output shape, feature dtype
 *   forward   forward_op   in: x0 [, x1]                 out: y, saved0 ..
 *   backward  backward_op  in: x0 [, x1], y, dy, saved0 ..  out: dx0 [, dx1]
 *             (accumulate flag at accumulate_offset, graph.h's rules)
 * The output shape is the forward op's infer_shape, or x0's without one. */
#include <stdio.h>
#include <string.h>

#include "layer-impl.h"

/* ---- attribute values --------------------------------------------------------- */

/* The value of attribute a in block `attrs`, as a double. */
static double attr_value(const unsigned char *attrs, const bp_abi_layer_attr *a) {
  if (a->type == BP_ABI_LAYER_ATTR_FLOAT) {
    float f;
    memcpy(&f, attrs + a->offset, sizeof f);
    return f;
  }
  int32_t i;
  memcpy(&i, attrs + a->offset, sizeof i);
  return i;
}

int bp_layer_module_check(const bp_layer *l, char *why, size_t why_size) {
  const bp_registered_layer *t = l->module;
  if (!t) {
    snprintf(why, why_size, "a module layer without its registered type");
    return -1;
  }
  for (int k = 0; k < t->layer.num_attrs; k++) {
    const bp_abi_layer_attr *a = &t->attrs[k];
    const double v = attr_value(l->attrs, a);
    const double lo = a->type == BP_ABI_LAYER_ATTR_BOOL ? 0 : a->min;
    const double hi = a->type == BP_ABI_LAYER_ATTR_BOOL ? 1 : a->max;
    if (!(v >= lo && v <= hi)) {
      snprintf(why, why_size, "'%s' must be in [%g, %g], got %g", a->key, lo, hi, v);
      return -1;
    }
  }
  return 0;
}

/* ---- shape ------------------------------------------------------------------------ */

static bp_abi_tensor abi_tensor(bp_shape s, bp_dtype dtype) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = (int32_t)dtype;
  const int64_t shape[4] = {s.n, s.h, s.w, s.c};
  memcpy(t.shape, shape, sizeof shape);
  t.padded_c = s.c;
  t.stride[3] = 1;
  t.stride[2] = s.c;
  t.stride[1] = s.w * s.c;
  t.stride[0] = s.h * s.w * s.c;
  return t;
}

static bp_status module_shape(bp_layer_compile *c) {
  const bp_registered_layer *t = c->layer->module;
  const bp_abi_op *op = t->forward;
  c->out = c->in[0];
  if (!op->infer_shape) return BP_OK;
  /* outputs y and the saved tensors: the op may describe them all; only
   * y's description is read (the saved ones follow their declarations) */
  bp_abi_tensor in[2], outs[1 + BP_ABI_LAYER_SAVED_MAX];
  for (int k = 0; k < c->layer->input_count; k++) in[k] = abi_tensor(c->in[k], c->fx);
  memset(outs, 0, sizeof outs); /* bp_abi_ops.h rule 7 */
  for (int k = 0; k < 1 + BP_ABI_LAYER_SAVED_MAX; k++) outs[k].struct_size = sizeof outs[k];
  char reason[256] = "";
  if (op->infer_shape(t->layer.attr_size ? c->layer->attrs : NULL, in, outs, reason,
                      sizeof reason) != 0) {
    reason[sizeof reason - 1] = '\0';
    return bp_layer_fail(c, BP_ERR_SHAPE, "%s layer: its op %s (from %s) refuses its input: %s",
                         t->layer.type, op->name, t->path, reason[0] ? reason : "(no reason)");
  }
  const bp_abi_tensor out = outs[0];
  const bp_shape s = {out.shape[0], out.shape[1], out.shape[2], out.shape[3]};
  char a[96];
  if (out.dtype != (int32_t)c->fx || s.n != c->in[0].n || s.h < 1 || s.w < 1 || s.c < 1 ||
      s.h > BP_MODEL_DIM_MAX || s.w > BP_MODEL_DIM_MAX || s.c > BP_MODEL_DIM_MAX)
    return bp_layer_fail(c, BP_ERR_SHAPE,
                         "%s layer: its op %s (from %s) gives output %s of dtype %d; the "
                         "layer needs the batch %lld, extents in [1, %lld] and the feature "
                         "dtype %s",
                         t->layer.type, op->name, t->path, bp_shape_str(s, a, sizeof a),
                         (int)out.dtype, (long long)c->in[0].n, (long long)BP_MODEL_DIM_MAX,
                         bp_dtype_name(c->fx));
  c->out = s;
  return BP_OK;
}

/* ---- saved tensors ---------------------------------------------------------------- */

/* "<l>.saved<k>" for each declared saved tensor, where the built-ins keep
 * theirs: FP32 with the features (as batchnorm's statistics), INT8 with
 * the masks (as maxpool's argmax); FP16 with the FP16 features, which
 * exist only under AMP, else with INT32 in the temporaries. */
static bp_status module_alloc(bp_layer_compile *c) {
  const bp_registered_layer *t = c->layer->module;
  const int f16 = bp_region_enabled(bp_plan_get_options(c->plan), BP_REGION_F16);
  for (int k = 0; k < t->layer.num_saved; k++) {
    const bp_abi_layer_saved *d = &t->saved[k];
    const bp_shape shape = d->per_channel ? (bp_shape){1, 1, 1, c->out.c}
                                          : (bp_shape){c->out.n, c->out.h, c->out.w,
                                                       d->channels ? d->channels : c->out.c};
    const bp_dtype dtype = (bp_dtype)d->dtype;
    char what[16], name[BP_NAME_MAX];
    snprintf(what, sizeof what, "saved%d", k);
    bp_layer_tensor_name(name, c->layer, what);
    int32_t *id = &c->t->saved_by_module[k];
    bp_status st;
    if (dtype == BP_DTYPE_FP32 || (dtype == BP_DTYPE_FP16 && f16))
      st = bp_plan_alloc_feature(c->plan, name, shape, dtype, id);
    else if (dtype == BP_DTYPE_INT8)
      st = bp_plan_alloc_mask(c->plan, name, shape, id);
    else
      st = bp_plan_alloc_temp(c->plan, name, shape, dtype, id);
    if (st != BP_OK) return bp_layer_plan_fail(c, st);
  }
  return BP_OK;
}

/* ---- nodes ----------------------------------------------------------------------- */

/* The layer's attribute block on node n, accumulate 0. */
static void module_attrs(bp_node *n, const bp_layer *l) {
  const bp_abi_layer *t = &l->module->layer;
  memcpy(n->attrs.bytes, l->attrs, t->attr_size);
  n->attr_size = t->attr_size;
  n->attr_version = l->module->forward->attr_version;
  if (t->accumulate_offset != UINT32_MAX) memset(n->attrs.bytes + t->accumulate_offset, 0, 4);
}

static void module_forward(bp_layer_graph *g) {
  const bp_layer *l = g->layer;
  bp_node *n = bp_layer_node(g, l->module->layer.forward_op, "fwd");
  for (int k = 0; k < l->input_count; k++) bp_node_in(n, bp_layer_input(g, k));
  bp_node_out(n, g->t->out);
  for (int k = 0; k < l->module->layer.num_saved; k++) bp_node_out(n, g->t->saved_by_module[k]);
  module_attrs(n, l);
}

static void module_backward(bp_layer_graph *g) {
  const bp_layer *l = g->layer;
  const bp_abi_layer *t = &l->module->layer;
  if (!t->backward_op) return; /* no gradient flows back */
  int needed = 0;
  for (int k = 0; k < l->input_count; k++) needed |= bp_layer_input_needs_grad(g, k);
  if (!needed) return;
  bp_node *n = bp_layer_backward_node_at(g, t->backward_op, "bwd", t->accumulate_offset);
  for (int k = 0; k < l->input_count; k++) bp_node_in(n, bp_layer_input(g, k));
  bp_node_in(n, g->t->out);
  bp_node_in(n, g->t->dout);
  for (int k = 0; k < t->num_saved; k++) bp_node_in(n, g->t->saved_by_module[k]);
  for (int k = 0; k < l->input_count; k++) bp_layer_grad_out(g, n, bp_layer_input_grad(g, k));
  module_attrs(n, l);
  n->attr_version = l->module->backward->attr_version;
}

/* Without a backward op no gradient flows back through the layer. */
static int module_passes_grad(const bp_layer *l) { return l->module->layer.backward_op != NULL; }

static int module_check(const bp_layer *l, char *why, size_t why_size) {
  return bp_layer_module_check(l, why, why_size);
}

/* Its name is never a file's `type:` (bp_layer_type_from_name skips it). */
const bp_layer_desc bp_layer_module = {
    .name = "module",
    .inputs = 1, /* the registered type's num_inputs decides */
    .passes_grad = module_passes_grad,
    .check = module_check,
    .shape = module_shape,
    .alloc = module_alloc,
    .forward = module_forward,
    .backward = module_backward,
};
