/* Writing a model and its trained tensors as an ONNX inference graph
 * (model_onnx.h; the graph, its names and its metadata: docs/onnx.md).
 * The messages are ONNX's own schema (libonnx-dev's onnx.proto) compiled
 * by protoc-c; protobuf-c packs them. Every allocation goes through one
 * list freed at the end. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/model_onnx.h"
#include "blueprint/outfile.h"
#include "onnx-impl.h"
#include "onnx.pb-c.h"

#define OPSET 17     /* LayerNormalization's first opset */
#define IR_VERSION 8 /* the IR of opset 17 (ONNX 1.12) */

typedef struct writer {
  void **owned; /* everything malloc'ed for the message, freed together */
  size_t owned_count, owned_cap;
  Onnx__GraphProto *graph;
  int failed;
} writer;

static void *keep(writer *w, void *p) {
  if (!p) {
    w->failed = 1;
    return NULL;
  }
  if (w->owned_count == w->owned_cap) {
    size_t cap = w->owned_cap ? 2 * w->owned_cap : 256;
    void **n = realloc(w->owned, cap * sizeof *n);
    if (!n) {
      free(p);
      w->failed = 1;
      return NULL;
    }
    w->owned = n, w->owned_cap = cap;
  }
  return w->owned[w->owned_count++] = p;
}

static void *alloc(writer *w, size_t bytes) { return keep(w, calloc(1, bytes ? bytes : 1)); }

static char *text(writer *w, const char *s) {
  char *d = alloc(w, strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

/* appends `item` to the array *items of *n (grown through the list) */
static void push(writer *w, void ***items, size_t *n, void *item) {
  void **a = alloc(w, (*n + 1) * sizeof *a);
  if (!a || !item) {
    w->failed = 1;
    return;
  }
  if (*n) memcpy(a, *items, *n * sizeof *a);
  a[(*n)++] = item;
  *items = a;
}

static Onnx__AttributeProto *attr_int(writer *w, const char *name, int64_t v) {
  Onnx__AttributeProto *a = alloc(w, sizeof *a);
  if (!a) return NULL;
  onnx__attribute_proto__init(a);
  a->name = text(w, name);
  a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->has_i = 1, a->i = v;
  return a;
}

static Onnx__AttributeProto *attr_float(writer *w, const char *name, float v) {
  Onnx__AttributeProto *a = alloc(w, sizeof *a);
  if (!a) return NULL;
  onnx__attribute_proto__init(a);
  a->name = text(w, name);
  a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
  a->has_f = 1, a->f = v;
  return a;
}

static Onnx__AttributeProto *attr_ints(writer *w, const char *name, int n, const int64_t *v) {
  Onnx__AttributeProto *a = alloc(w, sizeof *a);
  int64_t *d = alloc(w, (size_t)n * sizeof *d);
  if (!a || !d) return NULL;
  onnx__attribute_proto__init(a);
  a->name = text(w, name);
  a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
  memcpy(d, v, (size_t)n * sizeof *d);
  a->n_ints = (size_t)n, a->ints = d;
  return a;
}

/* A node of `op` reading inputs[0..n_in) and writing `out`. */
static Onnx__NodeProto *node(writer *w, const char *op, const char *name, const char *const *in,
                             int n_in, const char *out) {
  Onnx__NodeProto *n = alloc(w, sizeof *n);
  if (!n) return NULL;
  onnx__node_proto__init(n);
  n->op_type = text(w, op);
  n->name = text(w, name);
  for (int i = 0; i < n_in; i++) push(w, (void ***)&n->input, &n->n_input, text(w, in[i]));
  push(w, (void ***)&n->output, &n->n_output, text(w, out));
  push(w, (void ***)&w->graph->node, &w->graph->n_node, n);
  return n;
}

static void node_attr(writer *w, Onnx__NodeProto *n, Onnx__AttributeProto *a) {
  if (n) push(w, (void ***)&n->attribute, &n->n_attribute, a);
}

/* An FP32 initializer of dims[0..rank), values copied (raw little-endian
 * bytes, as ONNX stores them). */
static void initializer(writer *w, const char *name, int rank, const int64_t *dims,
                        const float *values, uint64_t count) {
  Onnx__TensorProto *t = alloc(w, sizeof *t);
  int64_t *d = alloc(w, (size_t)rank * sizeof *d);
  uint8_t *raw = alloc(w, (size_t)count * sizeof(float));
  if (!t || !d || !raw) return;
  onnx__tensor_proto__init(t);
  t->name = text(w, name);
  if (rank) memcpy(d, dims, (size_t)rank * sizeof *d);
  t->n_dims = (size_t)rank, t->dims = d;
  t->has_data_type = 1, t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  memcpy(raw, values, (size_t)count * sizeof(float)); /* x86-64 and arm64: little-endian */
  t->has_raw_data = 1, t->raw_data.len = (size_t)count * sizeof(float), t->raw_data.data = raw;
  push(w, (void ***)&w->graph->initializer, &w->graph->n_initializer, t);
}

/* A step of a layer's decomposition: a node whose name and one output are
 * "<layer>.<suffix>", or the layer's own name for the last (suffix NULL). */
static Onnx__NodeProto *step(writer *w, const char *op, const bp_layer *l,
                             const char *const *in, int n_in, const char *suffix, char *out,
                             size_t out_size) {
  if (suffix)
    snprintf(out, out_size, "%s.%s", l->name, suffix);
  else
    snprintf(out, out_size, "%s", l->name);
  return node(w, op, out, in, n_in, out);
}

/* A scalar FP32 constant "<layer>.<suffix>" (rank 0). */
static void scalar(writer *w, const bp_layer *l, const char *suffix, float v, char *name,
                   size_t size) {
  snprintf(name, size, "%s.%s", l->name, suffix);
  initializer(w, name, 0, NULL, &v, 1);
}

/* An INT64 vector initializer (Reshape's shape). */
static void int64s(writer *w, const char *name, int n, const int64_t *values) {
  Onnx__TensorProto *t = alloc(w, sizeof *t);
  int64_t *d = alloc(w, sizeof *d);
  uint8_t *raw = alloc(w, (size_t)n * sizeof(int64_t));
  if (!t || !d || !raw) return;
  onnx__tensor_proto__init(t);
  t->name = text(w, name);
  d[0] = n;
  t->n_dims = 1, t->dims = d;
  t->has_data_type = 1, t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
  memcpy(raw, values, (size_t)n * sizeof(int64_t));
  t->has_raw_data = 1, t->raw_data.len = (size_t)n * sizeof(int64_t), t->raw_data.data = raw;
  push(w, (void ***)&w->graph->initializer, &w->graph->n_initializer, t);
}

static void transpose(writer *w, const bp_layer *l, const char *in, const char *suffix,
                      const int64_t perm[4], char *out, size_t size) {
  Onnx__NodeProto *n = step(w, "Transpose", l, (const char *const[]){in}, 1, suffix, out, size);
  node_attr(w, n, attr_ints(w, "perm", 4, perm));
}

/* A graph input or output: FP32 of dims, dim 0 the symbolic batch "N". */
static Onnx__ValueInfoProto *value_info(writer *w, const char *name, int rank,
                                        const int64_t *dims) {
  Onnx__ValueInfoProto *v = alloc(w, sizeof *v);
  Onnx__TypeProto *tp = alloc(w, sizeof *tp);
  Onnx__TypeProto__Tensor *tt = alloc(w, sizeof *tt);
  Onnx__TensorShapeProto *sh = alloc(w, sizeof *sh);
  if (!v || !tp || !tt || !sh) return NULL;
  onnx__value_info_proto__init(v);
  onnx__type_proto__init(tp);
  onnx__type_proto__tensor__init(tt);
  onnx__tensor_shape_proto__init(sh);
  for (int i = 0; i < rank; i++) {
    Onnx__TensorShapeProto__Dimension *d = alloc(w, sizeof *d);
    if (!d) return NULL;
    onnx__tensor_shape_proto__dimension__init(d);
    if (i == 0) {
      d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      d->dim_param = text(w, "N");
    } else {
      d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      d->dim_value = dims[i];
    }
    push(w, (void ***)&sh->dim, &sh->n_dim, d);
  }
  tt->has_elem_type = 1, tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  tt->shape = sh;
  tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  tp->tensor_type = tt;
  v->name = text(w, name);
  v->type = tp;
  return v;
}

static void metadata(writer *w, Onnx__ModelProto *m, const char *key, const char *value) {
  Onnx__StringStringEntryProto *e = alloc(w, sizeof *e);
  if (!e) return;
  onnx__string_string_entry_proto__init(e);
  e->key = text(w, key);
  e->value = text(w, value);
  push(w, (void ***)&m->metadata_props, &m->n_metadata_props, e);
}

/* Reads tensor "<layer>.<suffix>" of `count` values into a kept buffer. */
static float *param(writer *w, bp_onnx_tensor_reader read, void *user, const bp_layer *l,
                    const char *suffix, uint64_t count, bp_status *st) {
  char name[BP_NAME_MAX + 32];
  snprintf(name, sizeof name, "%s.%s", l->name, suffix);
  float *v = alloc(w, (size_t)count * sizeof *v);
  if (!v) return NULL;
  if (*st == BP_OK) *st = read(user, name, v, count);
  return *st == BP_OK ? v : NULL;
}

/* The graph of every layer; `st` carries the first read failure. */
static bp_status build_graph(writer *w, const bp_model *m, const bp_onnx_shape *shapes,
                             bp_onnx_tensor_reader read, void *user) {
  bp_status st = BP_OK;
  for (int i = 0; i < m->layer_count && st == BP_OK && !w->failed; i++) {
    const bp_layer *l = &m->layers[i];
    char in0[BP_NAME_MAX + 16], in1[BP_NAME_MAX], wn[BP_NAME_MAX + 16], bn[BP_NAME_MAX + 16];
    snprintf(in0, sizeof in0, "%s",
             l->inputs[0] == BP_MODEL_INPUT ? "input" : m->layers[l->inputs[0]].name);
    if (l->input_count > 1)
      snprintf(in1, sizeof in1, "%s",
               l->inputs[1] == BP_MODEL_INPUT ? "input" : m->layers[l->inputs[1]].name);
    const bp_onnx_shape in = l->inputs[0] == BP_MODEL_INPUT
                                 ? (bp_onnx_shape){m->channels, m->height, m->width, 4}
                                 : shapes[l->inputs[0]];
    snprintf(wn, sizeof wn, "%s.w", l->name);
    snprintf(bn, sizeof bn, "%s.b", l->name);
    switch (l->type) {
    case BP_LAYER_CONV: {
      const int64_t cg = in.c / l->groups, f = l->units;
      const uint64_t count = (uint64_t)(f * l->kernel_h * l->kernel_w * cg);
      const float *v = param(w, read, user, l, "w", count, &st);
      float *oihw = alloc(w, (size_t)count * sizeof *oihw);
      if (!v || !oihw) break;
      bp_onnx_conv_to_oihw(v, oihw, f, l->kernel_h, l->kernel_w, cg);
      const int64_t dims[4] = {f, cg, l->kernel_h, l->kernel_w};
      initializer(w, wn, 4, dims, oihw, count);
      const char *ins[3] = {in0, wn, bn};
      if (l->bias) {
        const float *b = param(w, read, user, l, "b", (uint64_t)f, &st);
        if (!b) break;
        initializer(w, bn, 1, &f, b, (uint64_t)f);
      }
      Onnx__NodeProto *n = node(w, "Conv", l->name, ins, l->bias ? 3 : 2, l->name);
      const int64_t k[2] = {l->kernel_h, l->kernel_w}, s[2] = {l->stride, l->stride},
                    d[2] = {l->dilation, l->dilation}, p[4] = {l->pad, l->pad, l->pad, l->pad};
      node_attr(w, n, attr_ints(w, "kernel_shape", 2, k));
      node_attr(w, n, attr_ints(w, "strides", 2, s));
      node_attr(w, n, attr_ints(w, "pads", 4, p));
      node_attr(w, n, attr_ints(w, "dilations", 2, d));
      node_attr(w, n, attr_int(w, "group", l->groups));
      break;
    }
    case BP_LAYER_BATCHNORM: {
      static const char *const suffix[4] = {"weight", "bias", "running_mean", "running_var"};
      char names[4][BP_NAME_MAX + 16];
      const char *ins[5] = {in0, names[0], names[1], names[2], names[3]};
      for (int k = 0; k < 4 && st == BP_OK; k++) {
        const float *v = param(w, read, user, l, suffix[k], (uint64_t)in.c, &st);
        snprintf(names[k], sizeof names[k], "%s.%s", l->name, suffix[k]);
        if (v) initializer(w, names[k], 1, &in.c, v, (uint64_t)in.c);
      }
      if (st != BP_OK) break;
      Onnx__NodeProto *n = node(w, "BatchNormalization", l->name, ins, 5, l->name);
      node_attr(w, n, attr_float(w, "epsilon", l->eps));
      node_attr(w, n, attr_float(w, "momentum", 1.0f - l->momentum)); /* ONNX keeps the old share */
      break;
    }
    case BP_LAYER_RELU: node(w, "Relu", l->name, (const char *const[]){in0}, 1, l->name); break;
    case BP_LAYER_MAXPOOL:
    case BP_LAYER_AVGPOOL: {
      const int max = l->type == BP_LAYER_MAXPOOL;
      Onnx__NodeProto *n =
          node(w, max ? "MaxPool" : "AveragePool", l->name, (const char *const[]){in0}, 1, l->name);
      const int64_t k[2] = {l->kernel_h, l->kernel_w}, s[2] = {l->stride, l->stride},
                    p[4] = {l->pad, l->pad, l->pad, l->pad};
      node_attr(w, n, attr_ints(w, "kernel_shape", 2, k));
      node_attr(w, n, attr_ints(w, "strides", 2, s));
      node_attr(w, n, attr_ints(w, "pads", 4, p));
      if (!max) node_attr(w, n, attr_int(w, "count_include_pad", 1)); /* blueprint counts padding */
      break;
    }
    case BP_LAYER_GLOBAL_AVGPOOL:
      node(w, "GlobalAveragePool", l->name, (const char *const[]){in0}, 1, l->name);
      break;
    case BP_LAYER_FC: {
      const int64_t k = in.c * in.h * in.w, u = l->units;
      const uint64_t count = (uint64_t)(u * k);
      const float *v = param(w, read, user, l, "w", count, &st);
      float *nchw = alloc(w, (size_t)count * sizeof *nchw);
      if (!v || !nchw) break;
      bp_onnx_fc_to_nchw(v, nchw, u, in.c, in.h, in.w);
      const int64_t dims[2] = {u, k};
      initializer(w, wn, 2, dims, nchw, count);
      char flat[BP_NAME_MAX + 16];
      const char *a = in0;
      if (in.rank == 4) { /* ONNX's Gemm takes [N, K]: flatten the NCHW map first */
        snprintf(flat, sizeof flat, "%s.flatten", l->name);
        Onnx__NodeProto *f = node(w, "Flatten", flat, (const char *const[]){in0}, 1, flat);
        node_attr(w, f, attr_int(w, "axis", 1));
        a = flat;
      }
      if (l->bias) {
        const float *b = param(w, read, user, l, "b", (uint64_t)u, &st);
        if (!b) break;
        initializer(w, bn, 1, &u, b, (uint64_t)u);
      }
      const char *ins[3] = {a, wn, bn};
      Onnx__NodeProto *n = node(w, "Gemm", l->name, ins, l->bias ? 3 : 2, l->name);
      node_attr(w, n, attr_int(w, "transB", 1));
      break;
    }
    case BP_LAYER_LAYERNORM: { /* over the channels: ONNX's axis must be last, so NHWC around it */
      static const int64_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
      char nhwc[BP_NAME_MAX + 16], norm[BP_NAME_MAX + 16], out[BP_NAME_MAX + 16];
      char gn[BP_NAME_MAX + 16], bsn[BP_NAME_MAX + 16];
      const float *g = param(w, read, user, l, "weight", (uint64_t)in.c, &st);
      const float *b = param(w, read, user, l, "bias", (uint64_t)in.c, &st);
      if (!g || !b) break;
      snprintf(gn, sizeof gn, "%s.weight", l->name);
      snprintf(bsn, sizeof bsn, "%s.bias", l->name);
      initializer(w, gn, 1, &in.c, g, (uint64_t)in.c);
      initializer(w, bsn, 1, &in.c, b, (uint64_t)in.c);
      transpose(w, l, in0, "nhwc", to_nhwc, nhwc, sizeof nhwc);
      Onnx__NodeProto *n = step(w, "LayerNormalization", l, (const char *const[]){nhwc, gn, bsn},
                                3, "norm", norm, sizeof norm);
      node_attr(w, n, attr_int(w, "axis", -1));
      node_attr(w, n, attr_float(w, "epsilon", l->eps));
      transpose(w, l, norm, NULL, to_nchw, out, sizeof out);
      break;
    }
    case BP_LAYER_POS_EMBED: { /* Add of P: blueprint [1, H, W, C], ONNX [1, C, H, W] */
      const uint64_t count = (uint64_t)(in.c * in.h * in.w);
      const float *v = param(w, read, user, l, "weight", count, &st);
      float *chw = alloc(w, (size_t)count * sizeof *chw);
      if (!v || !chw) break;
      bp_onnx_conv_to_oihw(v, chw, 1, in.h, in.w, in.c); /* [1,H,W,C] -> [1,C,H,W] */
      const int64_t dims[4] = {1, in.c, in.h, in.w};
      snprintf(wn, sizeof wn, "%s.weight", l->name);
      initializer(w, wn, 4, dims, chw, count);
      node(w, "Add", l->name, (const char *const[]){in0, wn}, 2, l->name);
      break;
    }
    case BP_LAYER_GELU_TANH: { /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): Gelu's tanh
                                  form is opset 20 */
      char sq[BP_NAME_MAX + 16], cube[BP_NAME_MAX + 16], cs[BP_NAME_MAX + 16],
          inner[BP_NAME_MAX + 16], arg[BP_NAME_MAX + 16], th[BP_NAME_MAX + 16],
          onep[BP_NAME_MAX + 16], half[BP_NAME_MAX + 16], out[BP_NAME_MAX + 16];
      char k_cube[BP_NAME_MAX + 16], k_sqrt[BP_NAME_MAX + 16], k_one[BP_NAME_MAX + 16],
          k_half[BP_NAME_MAX + 16];
      scalar(w, l, "c_cube", BP_ONNX_GELU_CUBE, k_cube, sizeof k_cube);
      scalar(w, l, "c_sqrt_2_pi", BP_ONNX_GELU_SQRT_2_PI, k_sqrt, sizeof k_sqrt);
      scalar(w, l, "c_one", 1.0f, k_one, sizeof k_one);
      scalar(w, l, "c_half", 0.5f, k_half, sizeof k_half);
      step(w, "Mul", l, (const char *const[]){in0, in0}, 2, "square", sq, sizeof sq);
      step(w, "Mul", l, (const char *const[]){sq, in0}, 2, "cube", cube, sizeof cube);
      step(w, "Mul", l, (const char *const[]){cube, k_cube}, 2, "cube_scaled", cs, sizeof cs);
      step(w, "Add", l, (const char *const[]){in0, cs}, 2, "inner", inner, sizeof inner);
      step(w, "Mul", l, (const char *const[]){inner, k_sqrt}, 2, "arg", arg, sizeof arg);
      step(w, "Tanh", l, (const char *const[]){arg}, 1, "tanh", th, sizeof th);
      step(w, "Add", l, (const char *const[]){th, k_one}, 2, "one_plus", onep, sizeof onep);
      step(w, "Mul", l, (const char *const[]){in0, k_half}, 2, "half", half, sizeof half);
      step(w, "Mul", l, (const char *const[]){half, onep}, 2, NULL, out, sizeof out);
      break;
    }
    case BP_LAYER_ATTENTION: { /* [N, 3D, H, W] -> q, k, v [N, heads, dh, T] -> [N, D, H, W] */
      static const int64_t swap[4] = {0, 1, 3, 2};
      const int64_t d = in.c / 3, dh = d / l->heads, t = in.h * in.w;
      char q[BP_NAME_MAX + 16], k[BP_NAME_MAX + 16], v[BP_NAME_MAX + 16];
      char hdt[BP_NAME_MAX + 16], dhw[BP_NAME_MAX + 16], scale[BP_NAME_MAX + 16];
      char q4[BP_NAME_MAX + 16], kt[BP_NAME_MAX + 16], v4[BP_NAME_MAX + 16],
          qt[BP_NAME_MAX + 16], vt[BP_NAME_MAX + 16], sc[BP_NAME_MAX + 16],
          scd[BP_NAME_MAX + 16], msk[BP_NAME_MAX + 16], mskd[BP_NAME_MAX + 16],
          pr[BP_NAME_MAX + 16], ctx[BP_NAME_MAX + 16], ctxt[BP_NAME_MAX + 16],
          out[BP_NAME_MAX + 16];
      snprintf(q, sizeof q, "%s.q", l->name);
      snprintf(k, sizeof k, "%s.k", l->name);
      snprintf(v, sizeof v, "%s.v", l->name);
      char split_name[BP_NAME_MAX + 16];
      snprintf(split_name, sizeof split_name, "%s.split", l->name);
      Onnx__NodeProto *split = node(w, "Split", split_name, (const char *const[]){in0}, 1, q);
      if (split) { /* equal thirds along the channels: [q | k | v] */
        push(w, (void ***)&split->output, &split->n_output, text(w, k));
        push(w, (void ***)&split->output, &split->n_output, text(w, v));
      }
      node_attr(w, split, attr_int(w, "axis", 1));
      snprintf(hdt, sizeof hdt, "%s.shape_heads", l->name);
      snprintf(dhw, sizeof dhw, "%s.shape_out", l->name);
      int64s(w, hdt, 4, (const int64_t[]){0, l->heads, dh, t});
      int64s(w, dhw, 4, (const int64_t[]){0, d, in.h, in.w});
      scalar(w, l, "scale", 1.0f / sqrtf((float)dh), scale, sizeof scale);
      step(w, "Reshape", l, (const char *const[]){q, hdt}, 2, "q_heads", q4, sizeof q4);
      step(w, "Reshape", l, (const char *const[]){k, hdt}, 2, "k_heads", kt, sizeof kt);
      step(w, "Reshape", l, (const char *const[]){v, hdt}, 2, "v_heads", v4, sizeof v4);
      transpose(w, l, q4, "q_tokens", swap, qt, sizeof qt);
      transpose(w, l, v4, "v_tokens", swap, vt, sizeof vt);
      step(w, "MatMul", l, (const char *const[]){qt, kt}, 2, "scores", sc, sizeof sc);
      step(w, "Mul", l, (const char *const[]){sc, scale}, 2, "scaled", scd, sizeof scd);
      const char *logits = scd;
      if (l->causal) { /* keys after the query: -inf, so softmax gives them 0 */
        float *mask = alloc(w, (size_t)(t * t) * sizeof *mask);
        if (!mask) break;
        for (int64_t qi = 0; qi < t; qi++)
          for (int64_t ki = 0; ki < t; ki++) mask[qi * t + ki] = ki > qi ? -INFINITY : 0.0f;
        snprintf(msk, sizeof msk, "%s.mask", l->name);
        initializer(w, msk, 2, (const int64_t[]){t, t}, mask, (uint64_t)(t * t));
        step(w, "Add", l, (const char *const[]){scd, msk}, 2, "masked", mskd, sizeof mskd);
        logits = mskd;
      }
      Onnx__NodeProto *sm =
          step(w, "Softmax", l, (const char *const[]){logits}, 1, "probs", pr, sizeof pr);
      node_attr(w, sm, attr_int(w, "axis", -1));
      step(w, "MatMul", l, (const char *const[]){pr, vt}, 2, "context", ctx, sizeof ctx);
      transpose(w, l, ctx, "context_t", swap, ctxt, sizeof ctxt);
      step(w, "Reshape", l, (const char *const[]){ctxt, dhw}, 2, NULL, out, sizeof out);
      break;
    }
    case BP_LAYER_ADD: node(w, "Add", l->name, (const char *const[]){in0, in1}, 2, l->name); break;
    case BP_LAYER_SOFTMAX_CE: /* the loss: the graph ends at its input, the logits */
      node(w, "Identity", "logits", (const char *const[]){in0}, 1, "logits");
      break;
    default:
      return bp_fail(
          BP_ERR_UNSUPPORTED,
          "model '%s': layer '%s' (%s) has no ONNX export (docs/onnx.md lists what "
          "exports)",
          m->name, l->name,
          l->type == BP_LAYER_MODULE ? "a type from an op module" : bp_layer_type_name(l->type));
    }
  }
  if (st == BP_OK && w->failed) st = bp_fail(BP_ERR_NOMEM, "out of memory building the ONNX graph");
  return st;
}

/* Writes `bytes` to `path` through a temporary renamed over it. */
static bp_status write_file(const char *path, const uint8_t *bytes, size_t size) {
  bp_status st = bp_output_prepare(path, "ONNX file");
  if (st != BP_OK) return st;
  char *target = bp_output_target(path);
  if (!target) return bp_fail(BP_ERR_NOMEM, "out of memory writing %s", path);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", target, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = bp_fail(BP_ERR_IO, "cannot write ONNX file %s: cannot create %s: %s", path, tmp,
                 strerror(errno));
    free(target);
    return st;
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  const int err = done < size ? errno : (fsync(fd) != 0 ? errno : 0);
  if (close(fd) != 0 && !err) errno = EIO;
  if (done < size || err) {
    st = bp_fail(BP_ERR_IO, "cannot write ONNX file %s: %s", path, strerror(err ? err : EIO));
    unlink(tmp);
  } else if (rename(tmp, target) != 0) {
    st = bp_fail(BP_ERR_IO, "cannot write ONNX file %s: cannot rename %s over it: %s", path, tmp,
                 strerror(errno));
    unlink(tmp);
  }
  free(target);
  return st;
}

bp_status bp_onnx_save(const bp_model *m, bp_onnx_tensor_reader read, void *user,
                       const bp_onnx_export_options *o, const char *path) {
  if (!m || !read || !o || !path) return bp_fail(BP_ERR_INVALID, "bp_onnx_save: NULL argument");
  if (o->channels != m->channels || o->channels < 1 || o->channels > BP_ONNX_MAX_CHANNELS)
    return bp_fail(BP_ERR_INVALID, "bp_onnx_save: normalization of %d channels for a model of %lld",
                   o->channels, (long long)m->channels);
  bp_onnx_shape *shapes = calloc((size_t)m->layer_count, sizeof *shapes);
  if (!shapes) return bp_fail(BP_ERR_NOMEM, "out of memory exporting '%s'", m->name);
  int bad = -1;
  if (bp_onnx_model_shapes(m, shapes, &bad) != 0) {
    const bp_layer *l = &m->layers[bad];
    free(shapes);
    return bp_fail(
        BP_ERR_UNSUPPORTED,
        "model '%s': layer '%s' (%s) has no ONNX export "
        "(docs/onnx.md lists what exports)",
        m->name, l->name,
        l->type == BP_LAYER_MODULE ? "a type from an op module" : bp_layer_type_name(l->type));
  }
  writer w = {0};
  Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
  Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
  Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
  Onnx__OperatorSetIdProto *opsets[1] = {&opset};
  w.graph = &graph;
  opset.domain = "", opset.has_version = 1, opset.version = OPSET;
  model.has_ir_version = 1, model.ir_version = IR_VERSION;
  model.n_opset_import = 1, model.opset_import = opsets;
  model.producer_name = "blueprint";
  model.producer_version = BP_ONNX_PRODUCER_VERSION;
  model.graph = &graph;
  graph.name = text(&w, m->name);
  bp_status st = build_graph(&w, m, shapes, read, user);
  if (st == BP_OK) {
    const int64_t in_dims[4] = {0, m->channels, m->height, m->width};
    const int64_t out_dims[2] = {0, m->classes};
    push(&w, (void ***)&graph.input, &graph.n_input, value_info(&w, "input", 4, in_dims));
    push(&w, (void ***)&graph.output, &graph.n_output, value_info(&w, "logits", 2, out_dims));
    char mean[160] = "", std[160] = "", line[512];
    for (int c = 0; c < o->channels; c++) {
      char a[40], b[40];
      snprintf(a, sizeof a, "%s%.9g", c ? "," : "", (double)o->mean[c]);
      snprintf(b, sizeof b, "%s%.9g", c ? "," : "", (double)o->std[c]);
      strcat(mean, a), strcat(std, b);
    }
    snprintf(line, sizeof line,
             "input[n,c,y,x] = (pixel / 255 - mean[c]) / std[c], mean [%s], "
             "std [%s]; output: logits (softmax gives the class probabilities)",
             mean, std);
    metadata(&w, &model, "input_normalization", line);
    metadata(&w, &model, "input_mean", mean);
    metadata(&w, &model, "input_std", std);
    metadata(&w, &model, "input_scale", "1/255");
    metadata(&w, &model, "input_layout", "NCHW");
    if (o->weights) metadata(&w, &model, "weights", o->weights);
    if (o->source) metadata(&w, &model, "source", o->source);
    if (w.failed) st = bp_fail(BP_ERR_NOMEM, "out of memory building the ONNX graph");
  }
  if (st == BP_OK) {
    const size_t size = onnx__model_proto__get_packed_size(&model);
    uint8_t *bytes = malloc(size ? size : 1);
    if (!bytes) {
      st = bp_fail(BP_ERR_NOMEM, "out of memory packing the ONNX file (%zu bytes)", size);
    } else {
      onnx__model_proto__pack(&model, bytes);
      st = write_file(path, bytes, size);
      free(bytes);
    }
  }
  for (size_t i = 0; i < w.owned_count; i++) free(w.owned[i]);
  free(w.owned);
  free(shapes);
  return st;
}
