/* Reading an ONNX model into the model IR (model_onnx.h): each node
 * becomes a layer (or is folded into one: Flatten, a Reshape to 2-D,
 * Identity, the Add of a MatMul's bias), its initializers the model's
 * initial values in the plan's layout. The op subset: docs/onnx.md. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/infile.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "model-impl.h"
#include "onnx-impl.h"
#include "onnx.pb-c.h"

#define MAX_ONNX_BYTES (UINT64_C(1) << 31) /* protobuf's own limit */

/* What a value of the graph is: a layer's output (or the model input),
 * seen as rank 4 or, after a Flatten, rank 2; or an initializer. */
typedef struct value {
  const char *name; /* borrowed from the message */
  int layer;        /* producer layer index, BP_MODEL_INPUT, or -2: an initializer */
  bp_onnx_shape shape;
  const Onnx__TensorProto *init;
  int uses;         /* nodes that read it so far */
} value;

typedef struct reader {
  const char *file;
  const Onnx__GraphProto *g;
  bp_model *m;
  int layer_cap;
  value *values;
  size_t value_count, value_cap;
  bp_onnx_shape *shapes; /* [layer_cap] */
  int init_cap;
} reader;

static bp_status node_fail(const reader *r, bp_status code, const Onnx__NodeProto *n, int index,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bp_status node_fail(const reader *r, bp_status code, const Onnx__NodeProto *n, int index,
                           const char *fmt, ...) {
  char what[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return bp_fail(code, "%s: node %d '%.100s' (%.60s): %s", r->file, index,
                 n->name && *n->name ? n->name : "(unnamed)", n->op_type ? n->op_type : "?", what);
}

static value *find(reader *r, const char *name) {
  for (size_t i = r->value_count; i-- > 0;)
    if (strcmp(r->values[i].name, name) == 0) return &r->values[i];
  return NULL;
}

static value *add_value(reader *r, const char *name) {
  if (r->value_count == r->value_cap) {
    size_t cap = r->value_cap ? 2 * r->value_cap : 64;
    value *v = realloc(r->values, cap * sizeof *v);
    if (!v) return NULL;
    r->values = v, r->value_cap = cap;
  }
  value *v = &r->values[r->value_count++];
  memset(v, 0, sizeof *v);
  v->name = name;
  return v;
}

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i];
  return NULL;
}

/* Every attribute of n must be in `known` (NULL-terminated). */
static bp_status check_attrs(const reader *r, const Onnx__NodeProto *n, int index,
                             const char *const *known) {
  for (size_t i = 0; i < n->n_attribute; i++) {
    const char *a = n->attribute[i]->name ? n->attribute[i]->name : "";
    int ok = 0;
    for (const char *const *k = known; *k && !ok; k++) ok = strcmp(a, *k) == 0;
    if (!ok) {
      char list[300] = "";
      for (const char *const *k = known; *k; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k == known ? "" : ", ",
                 *k);
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "attribute '%.60s' is not supported (blueprint reads: %s)", a,
                       *list ? list : "none");
    }
  }
  return BP_OK;
}

static int64_t attr_i(const Onnx__NodeProto *n, const char *name, int64_t dflt) {
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_i ? a->i : dflt;
}

static float attr_f(const Onnx__NodeProto *n, const char *name, float dflt) {
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_f ? a->f : dflt;
}

/* A 2-D spatial attribute (kernel_shape, strides, dilations): both values;
 * 0 when absent, -1 when it is not two positive ints. */
static int attr_pair(const Onnx__NodeProto *n, const char *name, int64_t out[2]) {
  const Onnx__AttributeProto *a = attr(n, name);
  if (!a) return 0;
  if (a->n_ints != 2 || a->ints[0] < 1 || a->ints[1] < 1) return -1;
  out[0] = a->ints[0], out[1] = a->ints[1];
  return 1;
}

/* The FP32 values of an initializer (raw_data or float_data); NULL when it
 * is not FP32 or its size does not match its dims. */
static float *tensor_values(const Onnx__TensorProto *t, uint64_t *count) {
  uint64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0 || t->dims[i] > (INT64_C(1) << 32)) return NULL;
    n *= (uint64_t)t->dims[i];
    if (n > (UINT64_C(1) << 32)) return NULL;
  }
  if (!t->has_data_type || t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) return NULL;
  if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) return NULL;
  float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  if (!v) return NULL;
  if (t->has_raw_data && t->raw_data.len == n * sizeof(float)) {
    memcpy(v, t->raw_data.data, (size_t)n * sizeof *v); /* little-endian, as this host */
  } else if (!t->has_raw_data && t->n_float_data == n) {
    memcpy(v, t->float_data, (size_t)n * sizeof *v);
  } else {
    free(v);
    return NULL;
  }
  *count = n;
  return v;
}

/* The int64 values of a shape initializer (Reshape's second input). */
static int tensor_int64s(const Onnx__TensorProto *t, int64_t *out, int max) {
  if (!t->has_data_type || t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || t->n_dims != 1 ||
      t->dims[0] < 0 || t->dims[0] > max)
    return -1;
  const int n = (int)t->dims[0];
  if (t->has_raw_data && t->raw_data.len == (size_t)n * 8)
    memcpy(out, t->raw_data.data, (size_t)n * 8);
  else if (!t->has_raw_data && t->n_int64_data == (size_t)n)
    memcpy(out, t->int64_data, (size_t)n * 8);
  else
    return -1;
  return n;
}

static int dims_are(const Onnx__TensorProto *t, int rank, const int64_t *dims) {
  if ((int)t->n_dims != rank) return 0;
  for (int i = 0; i < rank; i++)
    if (dims[i] >= 0 && t->dims[i] != dims[i]) return 0;
  return 1;
}

static bp_status add_init(reader *r, const char *layer, const char *suffix, float *values,
                          uint64_t count) {
  bp_model *m = r->m;
  if (m->init_count == r->init_cap) {
    int cap = r->init_cap ? 2 * r->init_cap : 32;
    bp_model_init *n = realloc(m->inits, (size_t)cap * sizeof *n);
    if (!n) {
      free(values);
      return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
    }
    m->inits = n, r->init_cap = cap;
  }
  bp_model_init *v = &m->inits[m->init_count++];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s.%s", layer, suffix);
  v->values = values, v->count = count;
  return BP_OK;
}

/* A new layer named after the node (its characters outside [A-Za-z0-9_-]
 * become '_'; "<op><index>" when that leaves nothing or is taken). */
static bp_layer *add_layer(reader *r, const Onnx__NodeProto *n, int index, bp_layer_type type) {
  bp_model *m = r->m;
  if (m->layer_count == r->layer_cap) {
    int cap = r->layer_cap ? 2 * r->layer_cap : 32;
    bp_layer *l = realloc(m->layers, (size_t)cap * sizeof *l);
    bp_onnx_shape *s = realloc(r->shapes, (size_t)cap * sizeof *s);
    if (l) m->layers = l;
    if (s) r->shapes = s;
    if (!l || !s) return NULL;
    r->layer_cap = cap;
  }
  bp_layer *l = &m->layers[m->layer_count];
  memset(l, 0, sizeof *l);
  l->type = type;
  l->kernel_h = l->kernel_w = l->stride = l->dilation = l->groups = 1;
  l->eps = 1e-5f, l->momentum = 0.1f;
  const char *src = n->name && *n->name ? n->name : "";
  size_t k = 0;
  for (const char *p = src; *p && k < 40; p++) {
    const char c = *p;
    const int ok = isalnum((unsigned char)c) || c == '_' || c == '-';
    if (k == 0 && !isalnum((unsigned char)c)) continue; /* "/conv1/Conv" -> "conv1_Conv" */
    l->name[k++] = ok ? c : '_';
  }
  l->name[k] = '\0';
  int taken = k == 0 || strcmp(l->name, "input") == 0;
  for (int i = 0; i < m->layer_count && !taken; i++)
    taken = strcmp(m->layers[i].name, l->name) == 0;
  if (taken) snprintf(l->name, sizeof l->name, "%s%d", bp_layer_type_name(type), index);
  m->layer_count++;
  return l;
}

/* The node's input `i` as a feature map (a layer output or the input). */
static bp_status feature(reader *r, const Onnx__NodeProto *n, int index, size_t i, value **out) {
  if (i >= n->n_input || !n->input[i] || !*n->input[i])
    return node_fail(r, BP_ERR_INVALID, n, index, "input %zu is missing", i + 1);
  value *v = find(r, n->input[i]);
  if (!v)
    return node_fail(r, BP_ERR_INVALID, n, index, "input '%.80s' is produced by no earlier node",
                     n->input[i]);
  if (v->layer == -2)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "input '%.80s' is an initializer where blueprint needs a feature map",
                     n->input[i]);
  v->uses++;
  *out = v;
  return BP_OK;
}

/* The node's input `i` as an initializer; NULL input allowed when optional. */
static bp_status weight(reader *r, const Onnx__NodeProto *n, int index, size_t i,
                        const Onnx__TensorProto **out) {
  *out = NULL;
  if (i >= n->n_input || !n->input[i] || !*n->input[i]) return BP_OK;
  value *v = find(r, n->input[i]);
  if (!v || v->layer != -2)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "input '%.80s' must be an initializer (blueprint trains its own copy of "
                     "each weight)",
                     n->input[i]);
  *out = v->init;
  return BP_OK;
}

static bp_status output(reader *r, const Onnx__NodeProto *n, int index, int layer,
                        bp_onnx_shape shape) {
  if (n->n_output < 1 || !n->output[0] || !*n->output[0])
    return node_fail(r, BP_ERR_INVALID, n, index, "it has no output");
  value *v = add_value(r, n->output[0]);
  if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  v->layer = layer, v->shape = shape;
  return BP_OK;
}

static void link_input(bp_layer *l, int k, const value *v) {
  l->inputs[k] = v->layer;
  if (k + 1 > l->input_count) l->input_count = k + 1;
}

static bp_status conv(reader *r, const Onnx__NodeProto *n, int index) {
  static const char *const known[] = {"kernel_shape", "strides",  "pads", "dilations",
                                      "group",        "auto_pad", NULL};
  bp_status st = check_attrs(r, n, index, known);
  value *x;
  const Onnx__TensorProto *w, *b;
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  if (st == BP_OK) st = weight(r, n, index, 1, &w);
  if (st == BP_OK) st = weight(r, n, index, 2, &b);
  if (st != BP_OK) return st;
  if (!w || w->n_dims != 4)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "the weight must be a 4-D initializer (2-D convolution)");
  if (x->shape.rank != 4)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "its input is not a 4-D feature map");
  const Onnx__AttributeProto *ap = attr(n, "auto_pad");
  if (ap && ap->has_s && !(ap->s.len == 6 && memcmp(ap->s.data, "NOTSET", 6) == 0))
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "auto_pad other than NOTSET (give explicit pads)");
  int64_t k[2] = {w->dims[2], w->dims[3]}, s[2] = {1, 1}, d[2] = {1, 1};
  if (attr_pair(n, "kernel_shape", k) < 0 || k[0] != w->dims[2] || k[1] != w->dims[3])
    return node_fail(r, BP_ERR_INVALID, n, index, "kernel_shape does not match the weight");
  if (attr_pair(n, "strides", s) < 0 || s[0] != s[1])
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "strides must be two equal positive values");
  if (attr_pair(n, "dilations", d) < 0 || d[0] != d[1])
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "dilations must be two equal positive values");
  const Onnx__AttributeProto *pa = attr(n, "pads");
  int64_t pad = 0;
  if (pa) {
    if (pa->n_ints != 4 || pa->ints[0] != pa->ints[1] || pa->ints[0] != pa->ints[2] ||
        pa->ints[0] != pa->ints[3] || pa->ints[0] < 0)
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "pads must be four equal values (symmetric padding)");
    pad = pa->ints[0];
  }
  const int64_t g = attr_i(n, "group", 1), f = w->dims[0], cg = w->dims[1];
  if (g < 1 || cg * g != x->shape.c || f % g != 0)
    return node_fail(
        r, BP_ERR_INVALID, n, index,
        "the weight [%lld, %lld, ...] with group %lld does not fit %lld input channels",
        (long long)f, (long long)cg, (long long)g, (long long)x->shape.c);
  if (b && !dims_are(b, 1, &f))
    return node_fail(r, BP_ERR_INVALID, n, index, "the bias must have %lld values", (long long)f);
  uint64_t count = 0, bcount = 0;
  float *wv = tensor_values(w, &count), *bv = b ? tensor_values(b, &bcount) : NULL;
  float *nhwc = malloc((size_t)count * sizeof *nhwc);
  bp_layer *l = wv && (!b || bv) && nhwc ? add_layer(r, n, index, BP_LAYER_CONV) : NULL;
  if (!l) {
    free(wv), free(bv), free(nhwc);
    return wv && (!b || bv) ? bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file)
                            : node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                                        "its weight or bias is not FP32 data stored in the file");
  }
  link_input(l, 0, x);
  l->units = f, l->kernel_h = k[0], l->kernel_w = k[1], l->stride = s[0], l->pad = pad;
  l->dilation = d[0], l->groups = g, l->bias = b != NULL;
  bp_onnx_conv_from_oihw(wv, nhwc, f, k[0], k[1], cg);
  free(wv);
  const int li = r->m->layer_count - 1;
  bp_onnx_shape out = {f, (x->shape.h + 2 * pad - d[0] * (k[0] - 1) - 1) / s[0] + 1,
                       (x->shape.w + 2 * pad - d[0] * (k[1] - 1) - 1) / s[0] + 1, 4};
  if (out.h < 1 || out.w < 1) {
    free(nhwc), free(bv);
    return node_fail(r, BP_ERR_INVALID, n, index, "the output would be empty");
  }
  r->shapes[li] = out;
  if ((st = add_init(r, l->name, "w", nhwc, count)) != BP_OK) {
    free(bv);
    return st;
  }
  if (bv && (st = add_init(r, l->name, "b", bv, bcount)) != BP_OK) return st;
  return output(r, n, index, li, out);
}

static bp_status batchnorm(reader *r, const Onnx__NodeProto *n, int index) {
  static const char *const known[] = {"epsilon", "momentum", "training_mode", "spatial", NULL};
  bp_status st = check_attrs(r, n, index, known);
  value *x;
  const Onnx__TensorProto *p[4];
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  for (int k = 0; k < 4 && st == BP_OK; k++) {
    st = weight(r, n, index, (size_t)k + 1, &p[k]);
    if (st == BP_OK && (!p[k] || !dims_are(p[k], 1, &x->shape.c)))
      st = node_fail(r, BP_ERR_INVALID, n, index, "input %d must be an initializer of %lld values",
                     k + 2, (long long)x->shape.c);
  }
  if (st != BP_OK) return st;
  if (attr_i(n, "spatial", 1) != 1)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "spatial=0 (per-position statistics)");
  bp_layer *l = add_layer(r, n, index, BP_LAYER_BATCHNORM);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  link_input(l, 0, x);
  l->eps = attr_f(n, "epsilon", 1e-5f);
  l->momentum = 1.0f - attr_f(n, "momentum", 0.9f); /* ONNX keeps the running share */
  const int li = r->m->layer_count - 1;
  r->shapes[li] = x->shape;
  static const char *const suffix[4] = {"weight", "bias", "running_mean", "running_var"};
  for (int k = 0; k < 4; k++) {
    uint64_t count = 0;
    float *v = tensor_values(p[k], &count);
    if (!v)
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "input %d is not FP32 data stored in the file", k + 2);
    if ((st = add_init(r, l->name, suffix[k], v, count)) != BP_OK) return st;
  }
  return output(r, n, index, li, x->shape);
}

static bp_status simple(reader *r, const Onnx__NodeProto *n, int index, bp_layer_type type) {
  static const char *const none[] = {NULL};
  bp_status st = check_attrs(r, n, index, none);
  value *x;
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  if (st != BP_OK) return st;
  if (type == BP_LAYER_GLOBAL_AVGPOOL && x->shape.rank != 4)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "its input is not a 4-D feature map");
  bp_layer *l = add_layer(r, n, index, type);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  link_input(l, 0, x);
  bp_onnx_shape out = x->shape;
  if (type == BP_LAYER_GLOBAL_AVGPOOL) out.h = out.w = 1;
  r->shapes[r->m->layer_count - 1] = out;
  return output(r, n, index, r->m->layer_count - 1, out);
}

static bp_status pool(reader *r, const Onnx__NodeProto *n, int index, int max) {
  static const char *const known_max[] = {"kernel_shape", "strides",   "pads",          "auto_pad",
                                          "ceil_mode",    "dilations", "storage_order", NULL};
  static const char *const known_avg[] = {"kernel_shape", "strides",           "pads", "auto_pad",
                                          "ceil_mode",    "count_include_pad", NULL};
  bp_status st = check_attrs(r, n, index, max ? known_max : known_avg);
  value *x;
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  if (st != BP_OK) return st;
  if (x->shape.rank != 4)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "its input is not a 4-D feature map");
  int64_t k[2], s[2] = {1, 1}, d[2] = {1, 1};
  if (attr_pair(n, "kernel_shape", k) != 1)
    return node_fail(r, BP_ERR_INVALID, n, index, "kernel_shape (two values) is required");
  if (attr_pair(n, "strides", s) < 0 || s[0] != s[1])
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "strides must be two equal positive values");
  if (attr_pair(n, "dilations", d) < 0 || d[0] != 1 || d[1] != 1)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "dilations other than 1");
  if (attr_i(n, "ceil_mode", 0) != 0)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "ceil_mode=1 (blueprint's windows round down)");
  if (attr_i(n, "storage_order", 0) != 0)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "storage_order=1");
  const Onnx__AttributeProto *ap = attr(n, "auto_pad");
  if (ap && ap->has_s && !(ap->s.len == 6 && memcmp(ap->s.data, "NOTSET", 6) == 0))
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "auto_pad other than NOTSET (give explicit pads)");
  const Onnx__AttributeProto *pa = attr(n, "pads");
  int64_t pad = 0;
  if (pa) {
    if (pa->n_ints != 4 || pa->ints[0] != pa->ints[1] || pa->ints[0] != pa->ints[2] ||
        pa->ints[0] != pa->ints[3] || pa->ints[0] < 0)
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "pads must be four equal values (symmetric padding)");
    pad = pa->ints[0];
  }
  if (!max && pad > 0 && attr_i(n, "count_include_pad", 0) != 1)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "count_include_pad=0 with padding (blueprint's avgpool counts the padding)");
  bp_layer *l = add_layer(r, n, index, max ? BP_LAYER_MAXPOOL : BP_LAYER_AVGPOOL);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  link_input(l, 0, x);
  l->kernel_h = k[0], l->kernel_w = k[1], l->stride = s[0], l->pad = pad;
  const bp_onnx_shape out = {x->shape.c, (x->shape.h + 2 * pad - k[0]) / s[0] + 1,
                             (x->shape.w + 2 * pad - k[1]) / s[0] + 1, 4};
  if (out.h < 1 || out.w < 1)
    return node_fail(r, BP_ERR_INVALID, n, index, "the output would be empty");
  r->shapes[r->m->layer_count - 1] = out;
  return output(r, n, index, r->m->layer_count - 1, out);
}

/* Flatten (axis 1), a Reshape to [batch, C*H*W] and Identity produce a
 * view of their input: the same layer, seen as rank 2 (or unchanged). */
static bp_status view(reader *r, const Onnx__NodeProto *n, int index, int flatten) {
  static const char *const known_flatten[] = {"axis", NULL};
  static const char *const known_reshape[] = {"allowzero", NULL};
  static const char *const none[] = {NULL};
  const int reshape = flatten == 2;
  bp_status st = check_attrs(r, n, index,
                             flatten == 1 ? known_flatten
                             : reshape    ? known_reshape
                                          : none);
  value *x;
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  if (st != BP_OK) return st;
  bp_onnx_shape out = x->shape;
  if (flatten == 1) {
    if (attr_i(n, "axis", 1) != 1)
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "axis other than 1 (blueprint flattens all but the batch)");
    out.rank = 2;
  } else if (reshape) {
    const Onnx__TensorProto *shape;
    if ((st = weight(r, n, index, 1, &shape)) != BP_OK) return st;
    int64_t dims[8];
    const int64_t k = x->shape.c * x->shape.h * x->shape.w;
    const int rank = shape ? tensor_int64s(shape, dims, 8) : -1;
    if (rank != 2 || !(dims[1] == k || (dims[1] == -1 && dims[0] != -1)))
      return node_fail(
          r, BP_ERR_UNSUPPORTED, n, index,
          "only a Reshape to [batch, %lld] (flattening all but the batch) is supported",
          (long long)k);
    out.rank = 2;
  }
  if (out.rank == 2 && x->shape.rank == 2) out = x->shape;
  if (n->n_output < 1 || !n->output[0])
    return node_fail(r, BP_ERR_INVALID, n, index, "it has no output");
  value *v = add_value(r, n->output[0]);
  if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  /* a flattened map keeps its [c, h, w] for the fc that reads it */
  v->layer = x->layer, v->shape = out;
  return BP_OK;
}

/* Gemm (alpha = beta = 1, transA 0) or MatMul: a fc layer on a rank-2 view. */
static bp_status fc(reader *r, const Onnx__NodeProto *n, int index, int gemm) {
  static const char *const known_gemm[] = {"alpha", "beta", "transA", "transB", NULL};
  static const char *const none[] = {NULL};
  bp_status st = check_attrs(r, n, index, gemm ? known_gemm : none);
  value *x;
  const Onnx__TensorProto *w, *b = NULL;
  if (st == BP_OK) st = feature(r, n, index, 0, &x);
  if (st == BP_OK) st = weight(r, n, index, 1, &w);
  if (st == BP_OK && gemm) st = weight(r, n, index, 2, &b);
  if (st != BP_OK) return st;
  if (gemm &&
      (attr_f(n, "alpha", 1) != 1 || attr_f(n, "beta", 1) != 1 || attr_i(n, "transA", 0) != 0))
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "alpha or beta other than 1, or transA=1");
  if (x->shape.rank != 2)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "its input is 4-D: flatten it first (Flatten axis=1, or a Reshape to 2-D)");
  const int64_t k = x->shape.c * x->shape.h * x->shape.w;
  const int trans = gemm ? (int)attr_i(n, "transB", 0) : 0;
  if (!w || w->n_dims != 2 || w->dims[trans ? 1 : 0] != k)
    return node_fail(r, BP_ERR_INVALID, n, index,
                     "the weight must be a 2-D initializer with %lld inputs", (long long)k);
  const int64_t u = w->dims[trans ? 0 : 1];
  if (b && !dims_are(b, 1, &u))
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "the bias C must be an initializer of %lld values", (long long)u);
  uint64_t count = 0, bcount = 0;
  float *wv = tensor_values(w, &count), *bv = b ? tensor_values(b, &bcount) : NULL;
  float *uk = malloc((size_t)count * sizeof *uk), *out = malloc((size_t)count * sizeof *out);
  bp_layer *l = wv && (!b || bv) && uk && out ? add_layer(r, n, index, BP_LAYER_FC) : NULL;
  if (!l) {
    const int nomem = wv && (!b || bv);
    free(wv), free(bv), free(uk), free(out);
    return nomem ? bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file)
                 : node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                             "its weight or bias is not FP32 data stored in the file");
  }
  if (trans)
    memcpy(uk, wv, (size_t)count * sizeof *uk);
  else /* [K, U] -> [U, K] */
    for (int64_t i = 0; i < k; i++)
      for (int64_t o = 0; o < u; o++) uk[o * k + i] = wv[i * u + o];
  free(wv);
  bp_onnx_fc_from_nchw(uk, out, u, x->shape.c, x->shape.h, x->shape.w);
  free(uk);
  link_input(l, 0, x);
  l->units = u, l->bias = b != NULL;
  const int li = r->m->layer_count - 1;
  r->shapes[li] = (bp_onnx_shape){u, 1, 1, 2};
  if ((st = add_init(r, l->name, "w", out, count)) != BP_OK) {
    free(bv);
    return st;
  }
  if (bv && (st = add_init(r, l->name, "b", bv, bcount)) != BP_OK) return st;
  return output(r, n, index, li, r->shapes[li]);
}

/* Add: a residual (two feature maps of one shape), or the bias of a
 * MatMul's fc (a feature map and an initializer of its units). */
static bp_status add(reader *r, const Onnx__NodeProto *n, int index) {
  static const char *const none[] = {NULL};
  bp_status st = check_attrs(r, n, index, none);
  if (st != BP_OK) return st;
  if (n->n_input != 2) return node_fail(r, BP_ERR_INVALID, n, index, "it needs two inputs");
  value *a = find(r, n->input[0]), *c = find(r, n->input[1]);
  if (!a || !c)
    return node_fail(r, BP_ERR_INVALID, n, index, "an input is produced by no earlier node");
  if (a->layer == -2 && c->layer == -2)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "both inputs are initializers");
  if (a->layer == -2 || c->layer == -2) {
    value *x = a->layer == -2 ? c : a;
    const Onnx__TensorProto *b = a->layer == -2 ? a->init : c->init;
    bp_layer *l = x->layer >= 0 ? &r->m->layers[x->layer] : NULL;
    const int64_t u = l ? l->units : 0;
    if (!l || l->type != BP_LAYER_FC || l->bias || x->uses != 0 || x->shape.rank != 2 ||
        !(dims_are(b, 1, &u) || dims_are(b, 2, (const int64_t[]){1, u})))
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "an initializer is added only as the bias of the MatMul just before it");
    uint64_t count = 0;
    float *bv = tensor_values(b, &count);
    if (!bv)
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                       "the bias is not FP32 data stored in the file");
    l->bias = 1;
    x->uses++;
    if ((st = add_init(r, l->name, "b", bv, count)) != BP_OK) return st;
    return output(r, n, index, x->layer, x->shape);
  }
  value *x, *y;
  if ((st = feature(r, n, index, 0, &x)) != BP_OK || (st = feature(r, n, index, 1, &y)) != BP_OK)
    return st;
  if (x->shape.c != y->shape.c || x->shape.h != y->shape.h || x->shape.w != y->shape.w ||
      x->shape.rank != y->shape.rank)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "its inputs differ in shape (no broadcasting)");
  bp_layer *l = add_layer(r, n, index, BP_LAYER_ADD);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  link_input(l, 0, x);
  link_input(l, 1, y);
  r->shapes[r->m->layer_count - 1] = x->shape;
  return output(r, n, index, r->m->layer_count - 1, x->shape);
}

static const char supported_ops[] =
    "Conv, BatchNormalization, Relu, MaxPool, AveragePool, GlobalAveragePool, Gemm, MatMul, "
    "Add, Flatten, Reshape, Identity";

static bp_status read_node(reader *r, const Onnx__NodeProto *n, int index) {
  const char *op = n->op_type ? n->op_type : "";
  if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx") != 0)
    return node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                     "domain '%.60s' (blueprint runs the default "
                     "ONNX domain only)",
                     n->domain);
  if (!strcmp(op, "Conv")) return conv(r, n, index);
  if (!strcmp(op, "BatchNormalization")) return batchnorm(r, n, index);
  if (!strcmp(op, "Relu")) return simple(r, n, index, BP_LAYER_RELU);
  if (!strcmp(op, "GlobalAveragePool")) return simple(r, n, index, BP_LAYER_GLOBAL_AVGPOOL);
  if (!strcmp(op, "MaxPool")) return pool(r, n, index, 1);
  if (!strcmp(op, "AveragePool")) return pool(r, n, index, 0);
  if (!strcmp(op, "Flatten")) return view(r, n, index, 1);
  if (!strcmp(op, "Reshape")) return view(r, n, index, 2);
  if (!strcmp(op, "Identity")) return view(r, n, index, 0);
  if (!strcmp(op, "Gemm")) return fc(r, n, index, 1);
  if (!strcmp(op, "MatMul")) return fc(r, n, index, 0);
  if (!strcmp(op, "Add")) return add(r, n, index);
  return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "blueprint has no such op (it runs: %s)",
                   supported_ops);
}

/* The graph's one feature input: [N, C, H, W] FP32 with C, H, W fixed. */
static bp_status read_input(reader *r) {
  const Onnx__GraphProto *g = r->g;
  const Onnx__ValueInfoProto *in = NULL;
  for (size_t i = 0; i < g->n_input; i++) {
    int is_init = 0;
    for (size_t k = 0; k < g->n_initializer && !is_init; k++)
      is_init = g->initializer[k]->name && g->input[i]->name &&
                strcmp(g->initializer[k]->name, g->input[i]->name) == 0;
    if (is_init) continue;
    if (in)
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "%s: the graph has more than one input ('%.80s', "
                     "'%.80s'); blueprint feeds one image tensor",
                     r->file, in->name, g->input[i]->name);
    in = g->input[i];
  }
  if (!in || !in->name) return bp_fail(BP_ERR_INVALID, "%s: the graph has no input", r->file);
  const Onnx__TypeProto *t = in->type;
  const Onnx__TensorShapeProto *s =
      t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
          ? t->tensor_type->shape
          : NULL;
  if (!s || !t->tensor_type->has_elem_type ||
      t->tensor_type->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || s->n_dim != 4)
    return bp_fail(BP_ERR_UNSUPPORTED, "%s: input '%.80s' must be an FP32 tensor [N, C, H, W]",
                   r->file, in->name);
  int64_t d[3];
  for (int i = 1; i < 4; i++) {
    const Onnx__TensorShapeProto__Dimension *x = s->dim[i];
    if (x->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE || x->dim_value < 1 ||
        x->dim_value > 65536)
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "%s: input '%.80s': dimension %d (C, H, W) must be a "
                     "fixed positive size",
                     r->file, in->name, i);
    d[i - 1] = x->dim_value;
  }
  r->m->channels = d[0], r->m->height = d[1], r->m->width = d[2];
  value *v = add_value(r, in->name);
  if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  v->layer = BP_MODEL_INPUT, v->shape = (bp_onnx_shape){d[0], d[1], d[2], 4};
  return BP_OK;
}

static bp_status read_graph(reader *r) {
  const Onnx__GraphProto *g = r->g;
  bp_status st = BP_OK;
  for (size_t i = 0; i < g->n_initializer; i++) {
    if (!g->initializer[i]->name)
      return bp_fail(BP_ERR_INVALID, "%s: an initializer has no name", r->file);
    value *v = add_value(r, g->initializer[i]->name);
    if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
    v->layer = -2, v->init = g->initializer[i];
  }
  if ((st = read_input(r)) != BP_OK) return st;
  for (size_t i = 0; i < g->n_node && st == BP_OK; i++) st = read_node(r, g->node[i], (int)i);
  if (st != BP_OK) return st;
  if (g->n_output != 1 || !g->output[0]->name)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "%s: the graph must have one output, the logits [N, classes] "
                   "(it has %zu)",
                   r->file, g->n_output);
  const value *out = find(r, g->output[0]->name);
  if (!out || out->layer < 0 || out->shape.rank != 2)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "%s: output '%.80s' must be the 2-D output of a layer "
                   "(the logits [N, classes])",
                   r->file, g->output[0]->name);
  bp_model *m = r->m;
  m->classes = out->shape.c;
  /* the loss, on the logits */
  const Onnx__NodeProto loss = {.name = "loss", .op_type = "softmax_ce"};
  bp_layer *l = add_layer(r, &loss, (int)g->n_node, BP_LAYER_SOFTMAX_CE);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  l->inputs[0] = out->layer, l->input_count = 1;
  return BP_OK;
}

bp_status bp_onnx_parse(const void *data, size_t size, const char *display_name,
                        bp_model **model_out) {
  if ((!data && size) || !model_out) return bp_fail(BP_ERR_INVALID, "bp_onnx_parse: NULL argument");
  const char *file = display_name ? display_name : "(memory)";
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, data);
  if (!mp)
    return bp_fail(BP_ERR_PARSE, "%s: not an ONNX model (the protobuf does not parse)", file);
  bp_status st = BP_OK;
  if (!mp->graph) st = bp_fail(BP_ERR_PARSE, "%s: not an ONNX model (no graph)", file);
  for (size_t i = 0; st == BP_OK && i < mp->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
    if ((!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) && o->has_version &&
        (o->version < 7 || o->version > 21))
      st = bp_fail(BP_ERR_UNSUPPORTED, "%s: opset %lld (blueprint reads opsets 7 to 21)", file,
                   (long long)o->version);
  }
  bp_model *m = st == BP_OK ? calloc(1, sizeof *m) : NULL;
  if (st == BP_OK && !m) st = bp_fail(BP_ERR_NOMEM, "out of memory reading %s", file);
  reader r = {.file = file, .g = mp->graph, .m = m};
  if (st == BP_OK) {
    snprintf(m->path, sizeof m->path, "%s", file);
    /* the model's name: the file's base name without extension */
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t k = 0;
    for (; base[k] && base[k] != '.' && k < BP_NAME_MAX - 1; k++)
      m->name[k] = isalnum((unsigned char)base[k]) || base[k] == '-' ? base[k] : '_';
    if (k == 0) snprintf(m->name, sizeof m->name, "model");
    m->train = bp_train_defaults();
    st = read_graph(&r);
  }
  if (st == BP_OK) st = bp_model_check(m);
  free(r.values);
  free(r.shapes);
  onnx__model_proto__free_unpacked(mp, NULL);
  if (st != BP_OK) {
    bp_model_destroy(m);
    return st;
  }
  *model_out = m;
  return BP_OK;
}

bp_status bp_onnx_load(const char *path, bp_model **model_out) {
  if (!path || !model_out) return bp_fail(BP_ERR_INVALID, "bp_onnx_load: NULL argument");
  char *bytes = NULL;
  size_t size = 0;
  bp_status st = bp_input_read_all(path, "ONNX file", MAX_ONNX_BYTES, &bytes, &size);
  if (st != BP_OK) return st;
  st = bp_onnx_parse(bytes, size, path, model_out);
  free(bytes);
  return st;
}

int bp_onnx_available(void) { return 1; }
