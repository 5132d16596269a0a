/* Reading an ONNX model into the model IR (model_onnx.h): each node
 * becomes a layer (or is folded into one: Flatten, a Reshape to 2-D,
 * Identity, the Add of a MatMul's bias), its initializers the model's
 * initial values in the plan's layout; the decompositions export writes
 * for layernorm, gelu_tanh and attention are read back as one layer each
 * (the patterns below). The op subset: docs/onnx.md. */
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
  int skip; /* nodes after the current one that its pattern consumed */
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
    if (n) memcpy(v, t->raw_data.data, (size_t)n * sizeof *v); /* little-endian, as this host */
  } else if (!t->has_raw_data && t->n_float_data == n) {
    if (n) memcpy(v, t->float_data, (size_t)n * sizeof *v); /* no data pointer when empty */
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
  /* an empty tensor has no data pointer to copy from */
  if (t->has_raw_data && t->raw_data.len == (size_t)n * 8) {
    if (n) memcpy(out, t->raw_data.data, (size_t)n * 8);
  } else if (!t->has_raw_data && t->n_int64_data == (size_t)n) {
    if (n) memcpy(out, t->int64_data, (size_t)n * 8);
  } else {
    return -1;
  }
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

/* A layer of one feature input and its shape (attributes checked by the caller). */
static bp_status unary(reader *r, const Onnx__NodeProto *n, int index, bp_layer_type type) {
  value *x;
  bp_status st = feature(r, n, index, 0, &x);
  if (st != BP_OK) return st;
  bp_layer *l = add_layer(r, n, index, type);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  link_input(l, 0, x);
  r->shapes[r->m->layer_count - 1] = x->shape;
  return output(r, n, index, r->m->layer_count - 1, x->shape);
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
  const int layer = x->layer; /* add_value may move the values x points into */
  value *v = add_value(r, n->output[0]);
  if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file);
  /* a flattened map keeps its [c, h, w] for the fc that reads it */
  v->layer = layer, v->shape = out;
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

/* Add of an initializer [1, C, H, W] to a feature map of that shape: a
 * learned position embedding, P stored [1, H, W, C] in blueprint. */
static bp_status pos_embed(reader *r, const Onnx__NodeProto *n, int index, value *x,
                           const Onnx__TensorProto *p) {
  uint64_t count = 0;
  float *chw = tensor_values(p, &count);
  float *hwc = chw ? malloc((size_t)count * sizeof *hwc) : NULL;
  bp_layer *l = hwc ? add_layer(r, n, index, BP_LAYER_POS_EMBED) : NULL;
  if (!l) {
    const int nomem = chw != NULL;
    free(chw), free(hwc);
    return nomem ? bp_fail(BP_ERR_NOMEM, "out of memory reading %s", r->file)
                 : node_fail(r, BP_ERR_UNSUPPORTED, n, index,
                             "the position embedding is not FP32 data stored in the file");
  }
  bp_onnx_conv_from_oihw(chw, hwc, 1, x->shape.h, x->shape.w, x->shape.c);
  free(chw);
  x->uses++;
  link_input(l, 0, x);
  const int li = r->m->layer_count - 1;
  r->shapes[li] = x->shape;
  bp_status st = add_init(r, l->name, "weight", hwc, count);
  return st != BP_OK ? st : output(r, n, index, li, x->shape);
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
    const int64_t map[4] = {1, x->shape.c, x->shape.h, x->shape.w};
    if (x->shape.rank == 4 && dims_are(b, 4, map)) return pos_embed(r, n, index, x, b);
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

/* ---- the decompositions export writes, read back as one layer each ---- */

/* Nodes start, start+1, ... of the graph matched against one pattern; the
 * first mismatch is the error, naming the node where it broke. */
typedef struct pattern {
  reader *r;
  int start;
  const char *what; /* the pattern, for the message */
  bp_status st;
} pattern;

/* Node start+k, which must be `op` with n_in inputs and an output. */
static const Onnx__NodeProto *pat_node(pattern *p, int k, const char *op, size_t n_in) {
  if (p->st != BP_OK) return NULL;
  const Onnx__GraphProto *g = p->r->g;
  const size_t i = (size_t)p->start + (size_t)k;
  if (i >= g->n_node) {
    p->st = node_fail(p->r, BP_ERR_UNSUPPORTED, g->node[p->start], p->start,
                      "%s: the graph ends where its %s should be", p->what, op);
    return NULL;
  }
  const Onnx__NodeProto *n = g->node[i];
  if (!n->op_type || strcmp(n->op_type, op) != 0 || n->n_input != n_in || n->n_output < 1 ||
      !n->output[0] || !*n->output[0] || (n->domain && *n->domain && strcmp(n->domain, "ai.onnx")))
    p->st = node_fail(p->r, BP_ERR_UNSUPPORTED, n, (int)i,
                      "%s: expected %s with %zu input%s here (blueprint reads this pattern only "
                      "as its export writes it)",
                      p->what, op, n_in, n_in == 1 ? "" : "s");
  return p->st == BP_OK ? n : NULL;
}

static void pat_fail(pattern *p, const Onnx__NodeProto *n, int k, const char *what) {
  if (p->st == BP_OK)
    p->st = node_fail(p->r, BP_ERR_UNSUPPORTED, n, p->start + k, "%s: %s", p->what, what);
}

/* Input j of node k must be the value `name`. */
static void pat_wire(pattern *p, const Onnx__NodeProto *n, int k, size_t j, const char *name) {
  if (p->st != BP_OK || !n) return;
  if (!n->input[j] || strcmp(n->input[j], name) != 0) {
    char what[160];
    snprintf(what, sizeof what, "input %zu must be '%.80s'", j + 1, name);
    pat_fail(p, n, k, what);
  }
}

/* Node k's attributes: only `known`, and `perm` (when given) equal to it. */
static void pat_attrs(pattern *p, const Onnx__NodeProto *n, int k, const char *const *known,
                      const int64_t *perm) {
  if (p->st != BP_OK || !n) return;
  p->st = check_attrs(p->r, n, p->start + k, known);
  if (p->st != BP_OK || !perm) return;
  const Onnx__AttributeProto *a = attr(n, "perm");
  if (!a || a->n_ints != 4 || memcmp(a->ints, perm, 4 * sizeof *perm) != 0) {
    char what[80];
    snprintf(what, sizeof what, "perm must be [%lld, %lld, %lld, %lld]", (long long)perm[0],
             (long long)perm[1], (long long)perm[2], (long long)perm[3]);
    pat_fail(p, n, k, what);
  }
}

/* Input j of node k: an FP32 initializer of `count` values, returned
 * (malloc'ed) when it is; NULL and the error otherwise. */
static float *pat_floats(pattern *p, const Onnx__NodeProto *n, int k, size_t j, uint64_t count,
                         const char *what) {
  if (p->st != BP_OK || !n) return NULL;
  const value *v = n->input[j] ? find(p->r, n->input[j]) : NULL;
  uint64_t got = 0;
  float *f = v && v->layer == -2 ? tensor_values(v->init, &got) : NULL;
  if (!f || got != count) {
    free(f);
    pat_fail(p, n, k, what);
    return NULL;
  }
  return f;
}

/* Input j of node k: the FP32 scalar `want`, bit for bit. */
static void pat_scalar(pattern *p, const Onnx__NodeProto *n, int k, size_t j, float want,
                       const char *what) {
  float *f = pat_floats(p, n, k, j, 1, what);
  if (f && memcmp(f, &want, sizeof want) != 0) pat_fail(p, n, k, what);
  free(f);
}

/* Input j of node k (a Reshape's shape): the INT64 values want[0..4). */
static void pat_shape(pattern *p, const Onnx__NodeProto *n, int k, const int64_t want[4]) {
  if (p->st != BP_OK || !n) return;
  const value *v = n->input[1] ? find(p->r, n->input[1]) : NULL;
  int64_t d[8];
  if (attr_i(n, "allowzero", 0) != 0 || !v || v->layer != -2 || tensor_int64s(v->init, d, 8) != 4 ||
      memcmp(d, want, 4 * sizeof *d) != 0) {
    char what[120];
    snprintf(what, sizeof what, "the shape must be the constant [%lld, %lld, %lld, %lld]",
             (long long)want[0], (long long)want[1], (long long)want[2], (long long)want[3]);
    pat_fail(p, n, k, what);
  }
}

/* The values nodes start .. start+count-2 produce are read only inside the
 * pattern: it runs as one layer, its steps are not there to read. */
static void pat_internal(pattern *p, int count) {
  const Onnx__GraphProto *g = p->r->g;
  for (int k = 0; k + 1 < count && p->st == BP_OK; k++) {
    const Onnx__NodeProto *n = g->node[p->start + k];
    for (size_t o = 0; o < n->n_output && p->st == BP_OK; o++) {
      const char *name = n->output[o];
      if (!name || !*name) continue;
      for (size_t i = 0; i < g->n_node && p->st == BP_OK; i++) {
        if ((int)i >= p->start && (int)i < p->start + count) continue;
        for (size_t j = 0; j < g->node[i]->n_input; j++)
          if (g->node[i]->input[j] && strcmp(g->node[i]->input[j], name) == 0) {
            p->st = node_fail(p->r, BP_ERR_UNSUPPORTED, g->node[i], (int)i,
                              "reads '%.80s', a step inside %s (nodes %d to %d), which blueprint "
                              "runs as one layer",
                              name, p->what, p->start, p->start + count - 1);
            break;
          }
      }
      for (size_t i = 0; i < g->n_output && p->st == BP_OK; i++)
        if (g->output[i]->name && strcmp(g->output[i]->name, name) == 0)
          pat_fail(p, n, k, "its output is a graph output, yet it is a step inside the pattern");
    }
  }
}

/* The pattern of `count` nodes matched: a layer reading x, named after the
 * last node (export names it after the layer), whose output is the layer's. */
static bp_layer *pat_layer(pattern *p, int count, value *x, bp_layer_type type) {
  if (p->st != BP_OK) return NULL;
  const int last = p->start + count - 1;
  bp_layer *l = add_layer(p->r, p->r->g->node[last], last, type);
  if (!l) {
    p->st = bp_fail(BP_ERR_NOMEM, "out of memory reading %s", p->r->file);
    return NULL;
  }
  link_input(l, 0, x);
  return l;
}

static bp_status pat_done(pattern *p, int count, bp_onnx_shape shape) {
  if (p->st != BP_OK) return p->st;
  const int li = p->r->m->layer_count - 1;
  p->r->shapes[li] = shape;
  p->r->skip = count - 1;
  const int last = p->start + count - 1;
  return output(p->r, p->r->g->node[last], last, li, shape);
}

/* The first node's input 0 as a 4-D feature map. */
static value *pat_input(pattern *p, const Onnx__NodeProto *n) {
  value *x = NULL;
  if (p->st == BP_OK && n) p->st = feature(p->r, n, p->start, 0, &x);
  if (p->st == BP_OK && x->shape.rank != 4) {
    pat_fail(p, n, 0, "its input is 2-D (the pattern works on [N, C, H, W] maps)");
    return NULL;
  }
  return p->st == BP_OK ? x : NULL;
}

/* layernorm: Transpose to NHWC, LayerNormalization over the last axis
 * (the channels), Transpose back to NCHW. */
static bp_status layernorm_pattern(reader *r, int index) {
  static const int64_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
  static const char *const known_t[] = {"perm", NULL};
  static const char *const known_ln[] = {"axis", "epsilon", "stash_type", NULL};
  pattern p = {r, index,
               "layer norm (Transpose to NHWC, LayerNormalization over the last axis, Transpose "
               "back)",
               BP_OK};
  const Onnx__NodeProto *t1 = pat_node(&p, 0, "Transpose", 1);
  pat_attrs(&p, t1, 0, known_t, to_nhwc);
  value *x = pat_input(&p, t1);
  const Onnx__NodeProto *ln = pat_node(&p, 1, "LayerNormalization", 3);
  pat_wire(&p, ln, 1, 0, t1 ? t1->output[0] : "");
  pat_attrs(&p, ln, 1, known_ln, NULL);
  if (ln && p.st == BP_OK) {
    const int64_t axis = attr_i(ln, "axis", -1);
    if (axis != -1 && axis != 3) pat_fail(&p, ln, 1, "axis must be the last (-1), the channels");
    if (attr_i(ln, "stash_type", 1) != 1) pat_fail(&p, ln, 1, "stash_type must be 1 (FP32)");
  }
  const uint64_t c = x ? (uint64_t)x->shape.c : 0;
  float *gain = pat_floats(&p, ln, 1, 1, c, "the scale must be an FP32 initializer of C values");
  float *bias = pat_floats(&p, ln, 1, 2, c, "the bias B must be an FP32 initializer of C values");
  const Onnx__NodeProto *t2 = pat_node(&p, 2, "Transpose", 1);
  pat_wire(&p, t2, 2, 0, ln ? ln->output[0] : "");
  pat_attrs(&p, t2, 2, known_t, to_nchw);
  pat_internal(&p, 3);
  bp_layer *l = pat_layer(&p, 3, x, BP_LAYER_LAYERNORM);
  if (!l) {
    free(gain), free(bias);
    return p.st;
  }
  l->eps = attr_f(ln, "epsilon", 1e-5f);
  if ((p.st = add_init(r, l->name, "weight", gain, c)) != BP_OK) {
    free(bias);
    return p.st;
  }
  if ((p.st = add_init(r, l->name, "bias", bias, c)) != BP_OK) return p.st;
  return pat_done(&p, 3, x->shape);
}

/* gelu_tanh: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in the nine
 * Mul, Add and Tanh nodes export writes. */
static bp_status gelu_tanh_pattern(reader *r, int index) {
  static const char *const none[] = {NULL};
  pattern p = {r, index, "GELU's tanh form (x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))",
               BP_OK};
  const Onnx__NodeProto *n[9];
  static const char *const ops[9] = {"Mul", "Mul", "Mul", "Add", "Mul",
                                     "Tanh", "Add", "Mul", "Mul"};
  for (int k = 0; k < 9; k++) {
    n[k] = pat_node(&p, k, ops[k], k == 5 ? 1 : 2);
    pat_attrs(&p, n[k], k, none, NULL);
  }
  if (p.st != BP_OK) return p.st;
  value *x = pat_input(&p, n[0]);
  if (!x) return p.st;
  const char *xs = n[0]->input[0];
  pat_wire(&p, n[0], 0, 1, xs);                   /* x x */
  pat_wire(&p, n[1], 1, 0, n[0]->output[0]);      /* x^2 x */
  pat_wire(&p, n[1], 1, 1, xs);
  pat_wire(&p, n[2], 2, 0, n[1]->output[0]);      /* x^3 0.044715 */
  pat_scalar(&p, n[2], 2, 1, BP_ONNX_GELU_CUBE, "input 2 must be the constant 0.044715");
  pat_wire(&p, n[3], 3, 0, xs);                   /* x + 0.044715 x^3 */
  pat_wire(&p, n[3], 3, 1, n[2]->output[0]);
  pat_wire(&p, n[4], 4, 0, n[3]->output[0]);      /* ... sqrt(2/pi) */
  pat_scalar(&p, n[4], 4, 1, BP_ONNX_GELU_SQRT_2_PI, "input 2 must be the constant sqrt(2/pi)");
  pat_wire(&p, n[5], 5, 0, n[4]->output[0]);      /* tanh */
  pat_wire(&p, n[6], 6, 0, n[5]->output[0]);      /* 1 + tanh */
  pat_scalar(&p, n[6], 6, 1, 1.0f, "input 2 must be the constant 1");
  pat_wire(&p, n[7], 7, 0, xs);                   /* x 0.5 */
  pat_scalar(&p, n[7], 7, 1, 0.5f, "input 2 must be the constant 0.5");
  pat_wire(&p, n[8], 8, 0, n[7]->output[0]);      /* x/2 (1 + tanh) */
  pat_wire(&p, n[8], 8, 1, n[6]->output[0]);
  pat_internal(&p, 9);
  pat_layer(&p, 9, x, BP_LAYER_GELU_TANH);
  return pat_done(&p, 9, x->shape);
}

/* attention over packed [q | k | v] channels: Split into thirds, Reshape
 * each to [N, heads, dh, T], Transpose q and v to [N, heads, T, dh],
 * MatMul q k, Mul by 1/sqrt(dh), (causal: Add the mask), Softmax, MatMul
 * by v, Transpose back, Reshape to [N, D, H, W]. */
static bp_status attention_pattern(reader *r, int index) {
  static const int64_t swap[4] = {0, 1, 3, 2};
  static const char *const none[] = {NULL}, *const axis_only[] = {"axis", NULL},
                           *const perm_only[] = {"perm", NULL},
                           *const reshape[] = {"allowzero", NULL};
  pattern p = {r, index, "attention (Split, Reshape, Transpose, MatMul, Mul, Softmax, MatMul, ...)",
               BP_OK};
  const Onnx__NodeProto *split = pat_node(&p, 0, "Split", 1);
  pat_attrs(&p, split, 0, axis_only, NULL);
  value *x = pat_input(&p, split);
  if (!x) return p.st;
  if (attr_i(split, "axis", 0) != 1 || split->n_output != 3 || !split->output[1] ||
      !split->output[2])
    pat_fail(&p, split, 0, "it must split the channels (axis 1) into three equal parts q, k, v");
  if (x->shape.c % 3) pat_fail(&p, split, 0, "its input's channels are not a multiple of 3");
  const int64_t d = x->shape.c / 3, t = x->shape.h * x->shape.w;
  const Onnx__NodeProto *rq = pat_node(&p, 1, "Reshape", 2), *rk = pat_node(&p, 2, "Reshape", 2),
                        *rv = pat_node(&p, 3, "Reshape", 2);
  if (p.st != BP_OK) return p.st;
  /* the heads: from the first Reshape's shape [0, heads, dh, T] */
  const value *sv = rq->input[1] ? find(r, rq->input[1]) : NULL;
  int64_t hs[8];
  const int64_t heads = sv && sv->layer == -2 && tensor_int64s(sv->init, hs, 8) == 4 && hs[1] > 0
                            ? hs[1]
                            : 0;
  if (!heads || d % heads) {
    pat_fail(&p, rq, 1,
             "the shape must be the constant [0, heads, D/heads, H*W], heads dividing D");
    return p.st;
  }
  const int64_t to_heads[4] = {0, heads, d / heads, t};
  for (int k = 1; k <= 3; k++) {
    const Onnx__NodeProto *rn = k == 1 ? rq : k == 2 ? rk : rv;
    pat_attrs(&p, rn, k, reshape, NULL);
    pat_wire(&p, rn, k, 0, split->output[k - 1]);
    pat_shape(&p, rn, k, to_heads);
  }
  const Onnx__NodeProto *tq = pat_node(&p, 4, "Transpose", 1);
  const Onnx__NodeProto *tv = pat_node(&p, 5, "Transpose", 1);
  pat_attrs(&p, tq, 4, perm_only, swap);
  pat_wire(&p, tq, 4, 0, rq->output[0]);
  pat_attrs(&p, tv, 5, perm_only, swap);
  pat_wire(&p, tv, 5, 0, rv->output[0]);
  const Onnx__NodeProto *qk = pat_node(&p, 6, "MatMul", 2);
  pat_attrs(&p, qk, 6, none, NULL);
  pat_wire(&p, qk, 6, 0, tq ? tq->output[0] : "");
  pat_wire(&p, qk, 6, 1, rk->output[0]);
  const Onnx__NodeProto *sc = pat_node(&p, 7, "Mul", 2);
  pat_attrs(&p, sc, 7, none, NULL);
  pat_wire(&p, sc, 7, 0, qk ? qk->output[0] : "");
  pat_scalar(&p, sc, 7, 1, 1.0f / sqrtf((float)(d / heads)),
             "input 2 must be the constant 1/sqrt(D/heads)");
  if (p.st != BP_OK) return p.st;
  int k = 8;
  const int causal = (size_t)index + 8 < r->g->n_node && r->g->node[index + 8]->op_type &&
                     !strcmp(r->g->node[index + 8]->op_type, "Add");
  const char *logits = sc->output[0];
  if (causal) {
    const Onnx__NodeProto *mk = pat_node(&p, k, "Add", 2);
    pat_attrs(&p, mk, k, none, NULL);
    pat_wire(&p, mk, k, 0, logits);
    float *mask = pat_floats(&p, mk, k, 1, (uint64_t)(t * t),
                             "input 2 must be the causal mask: [T, T] constant, 0 on and below "
                             "the diagonal, -inf above");
    for (int64_t i = 0; mask && i < t * t && p.st == BP_OK; i++)
      if (i % t > i / t ? !(isinf(mask[i]) && mask[i] < 0) : mask[i] != 0.0f)
        pat_fail(&p, mk, k,
                 "input 2 must be the causal mask: [T, T] constant, 0 on and below the "
                 "diagonal, -inf above");
    free(mask);
    if (p.st != BP_OK) return p.st;
    logits = mk->output[0];
    k++;
  }
  const Onnx__NodeProto *sm = pat_node(&p, k, "Softmax", 1);
  pat_attrs(&p, sm, k, axis_only, NULL);
  pat_wire(&p, sm, k, 0, logits);
  if (sm && p.st == BP_OK && attr_i(sm, "axis", -1) != -1 && attr_i(sm, "axis", -1) != 3)
    pat_fail(&p, sm, k, "axis must be the last (-1), the keys");
  k++;
  const Onnx__NodeProto *pv = pat_node(&p, k, "MatMul", 2);
  pat_attrs(&p, pv, k, none, NULL);
  pat_wire(&p, pv, k, 0, sm ? sm->output[0] : "");
  pat_wire(&p, pv, k, 1, tv ? tv->output[0] : "");
  k++;
  const Onnx__NodeProto *tc = pat_node(&p, k, "Transpose", 1);
  pat_attrs(&p, tc, k, perm_only, swap);
  pat_wire(&p, tc, k, 0, pv ? pv->output[0] : "");
  k++;
  const Onnx__NodeProto *ro = pat_node(&p, k, "Reshape", 2);
  pat_attrs(&p, ro, k, reshape, NULL);
  pat_wire(&p, ro, k, 0, tc ? tc->output[0] : "");
  pat_shape(&p, ro, k, (const int64_t[]){0, d, x->shape.h, x->shape.w});
  k++;
  pat_internal(&p, k);
  bp_layer *l = pat_layer(&p, k, x, BP_LAYER_ATTENTION);
  if (l) l->heads = heads, l->causal = causal;
  return pat_done(&p, k, (bp_onnx_shape){d, x->shape.h, x->shape.w, 4});
}

/* Gelu (opset 20): approximate "none" is gelu (erf form), "tanh" gelu_tanh. */
static bp_status gelu(reader *r, const Onnx__NodeProto *n, int index) {
  static const char *const known[] = {"approximate", NULL};
  bp_status st = check_attrs(r, n, index, known);
  if (st != BP_OK) return st;
  const Onnx__AttributeProto *a = attr(n, "approximate");
  bp_layer_type type = BP_LAYER_GELU;
  if (a) {
    const size_t len = a->s.len;
    const char *v = (const char *)a->s.data;
    if (len == 4 && v && !memcmp(v, "tanh", 4))
      type = BP_LAYER_GELU_TANH;
    else if (!(len == 4 && v && !memcmp(v, "none", 4)))
      return node_fail(r, BP_ERR_UNSUPPORTED, n, index, "approximate must be 'none' or 'tanh'");
  }
  return unary(r, n, index, type);
}

static const char supported_ops[] =
    "Conv, BatchNormalization, Relu, MaxPool, AveragePool, GlobalAveragePool, Gemm, MatMul, "
    "Add, Flatten, Reshape, Identity, Gelu; and as blueprint's export writes them: "
    "LayerNormalization, GELU's tanh expression, attention";

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
  if (!strcmp(op, "Gelu")) return gelu(r, n, index);
  /* the decompositions export writes start with these ops */
  if (!strcmp(op, "Transpose") || !strcmp(op, "LayerNormalization"))
    return layernorm_pattern(r, index);
  if (!strcmp(op, "Mul")) return gelu_tanh_pattern(r, index);
  if (!strcmp(op, "Split")) return attention_pattern(r, index);
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
  for (size_t i = 0; i < g->n_node && st == BP_OK; i += 1 + (size_t)r->skip) {
    r->skip = 0;
    st = read_node(r, g->node[i], (int)i);
  }
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
