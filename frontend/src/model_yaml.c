/* Model files: YAML read with libyaml's document API into a bp_model.
 *
 * The format is documented in models/README.md. This file only maps YAML
 * nodes to fields: every value is checked where it is read, so an error
 * names the exact "file:line:column" of the value (or key) at fault, the
 * field and the layer. Structural checks shared with models built in C
 * (bp_model_check) run last as a safety net.
 *
 * Scalars: integers, numbers and booleans must be plain (unquoted) YAML
 * scalars, so `filters: "32"` is refused rather than guessed at; strings
 * may use any style. libyaml marks are 0-based; messages are 1-based. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "blueprint/infile.h"
#include "blueprint/model_yaml.h"

#include "layer-impl.h"
#include "name-index-impl.h"
#include "strutil-impl.h"

#define MODEL_FILE_MAX (16u << 20) /* a model file is small; refuse anything huge */
#define MODEL_DEPTH_MAX 64         /* nested mappings and sequences, at most */

typedef struct parse_ctx {
  const char *file; /* name used in messages (path or display name) */
  const char *text; /* the whole input, for reader-error positions */
  size_t length;
  yaml_document_t *doc;
  bp_model *model;
  const bp_registry *registry; /* module layer types; NULL: built-in only */
  /* per layer: the scalar nodes naming its producers (unresolved) */
  const yaml_node_t *(*refs)[2];
  int *ref_count;
  bp_name_index names; /* layer names read so far */
  int train_only;      /* a settings file beside an ONNX model: only 'train' (model_onnx.h) */
} parse_ctx;

/* ---- messages ---------------------------------------------------------- */

static bp_status fail_at(const parse_ctx *c, const yaml_node_t *node, bp_status st, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
static bp_status fail_at(const parse_ctx *c, const yaml_node_t *node, bp_status st, const char *fmt,
                         ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t line = node ? node->start_mark.line + 1 : 1, col = node ? node->start_mark.column + 1 : 1;
  return bp_fail(st, "%s:%zu:%zu: %s", c->file, line, col, what);
}

/* A short, printable, one-line rendering of a node for messages. */
static const char *node_preview(const yaml_node_t *n, char *buf, size_t size) {
  if (n->type == YAML_MAPPING_NODE) return "a mapping";
  if (n->type == YAML_SEQUENCE_NODE) return "a sequence";
  if (n->type != YAML_SCALAR_NODE) return "nothing";
  const unsigned char *v = n->data.scalar.value;
  size_t len = n->data.scalar.length, max = size > 8 ? size - 8 : 0, o = 0;
  if (len == 0 && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) return "nothing";
  if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE && size > 24) {
    memcpy(buf, "the string ", 11); /* a quoted "32" is text, not a number */
    o = 11;
  }
  buf[o++] = '\'';
  size_t i = 0;
  for (; i < len && o < max; i++) buf[o++] = (v[i] >= 0x20 && v[i] < 0x7f) ? (char)v[i] : '?';
  if (i < len) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o++] = '\'';
  buf[o] = '\0';
  return buf;
}

/* ---- scalar readers: each checks kind, syntax and range ---------------- */

static const char *scalar_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int is_plain_scalar(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         strlen(scalar_text(n)) == n->data.scalar.length;
}

/* `what` names the field and its owner: "'kernel' of conv layer 'conv1'". */
static bp_status read_int(const parse_ctx *c, const yaml_node_t *n, const char *what, int64_t lo,
                          int64_t hi, int64_t *out) {
  char pv[48];
  const char *s = is_plain_scalar(n) ? scalar_text(n) : "";
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0, digits = strspn(s + i, "0123456789");
  if (digits == 0 || s[i + digits] != '\0')
    return fail_at(c, n, BP_ERR_INVALID, "%s must be an integer, got %s", what,
                   node_preview(n, pv, sizeof pv));
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE)
    return fail_at(c, n, BP_ERR_INVALID, "%s: %s does not fit in 64 bits", what,
                   node_preview(n, pv, sizeof pv));
  if (v < lo)
    return fail_at(c, n, BP_ERR_INVALID, "%s must be >= %lld, got %lld", what, (long long)lo, v);
  if (v > hi)
    return fail_at(c, n, BP_ERR_INVALID, "%s must be <= %lld, got %lld", what, (long long)hi, v);
  *out = (int64_t)v;
  return BP_OK;
}

/* Accepted bounds of a number: lo <= x (or lo < x when lo_open), x <= hi
 * (or x < hi when hi_open). */
typedef struct num_range {
  double lo, hi;
  int lo_open, hi_open;
} num_range;

static bp_status read_number(const parse_ctx *c, const yaml_node_t *n, const char *what,
                             num_range r, double *out) {
  char pv[48];
  const char *s = is_plain_scalar(n) ? scalar_text(n) : "";
  /* decimal only: strtod alone would also take hex, "inf" and "nan" */
  int ok =
      s[0] != '\0' && strspn(s, "0123456789+-.eE") == strlen(s) && strpbrk(s, "0123456789") != NULL;
  char *end = NULL;
  double v = ok ? strtod(s, &end) : 0.0;
  if (!ok || *end != '\0')
    return fail_at(c, n, BP_ERR_INVALID, "%s must be a number, got %s", what,
                   node_preview(n, pv, sizeof pv));
  if (!isfinite(v))
    return fail_at(c, n, BP_ERR_INVALID, "%s: %s is out of range", what,
                   node_preview(n, pv, sizeof pv));
  if (r.lo_open ? !(v > r.lo) : !(v >= r.lo))
    return fail_at(c, n, BP_ERR_INVALID, "%s must be %s %g, got %g", what,
                   r.lo_open ? ">" : ">=", r.lo, v);
  if (r.hi_open ? !(v < r.hi) : !(v <= r.hi))
    return fail_at(c, n, BP_ERR_INVALID, "%s must be %s %g, got %g", what,
                   r.hi_open ? "<" : "<=", r.hi, v);
  *out = v;
  return BP_OK;
}

/* YAML 1.2 core booleans. */
static bp_status read_bool(const parse_ctx *c, const yaml_node_t *n, const char *what, int *out) {
  static const char *const yes[] = {"true", "True", "TRUE"}, *const no[] = {"false", "False",
                                                                            "FALSE"};
  if (is_plain_scalar(n)) {
    for (int i = 0; i < 3; i++) {
      if (strcmp(scalar_text(n), yes[i]) == 0) return (*out = 1), BP_OK;
      if (strcmp(scalar_text(n), no[i]) == 0) return (*out = 0), BP_OK;
    }
  }
  char pv[48];
  return fail_at(c, n, BP_ERR_INVALID, "%s must be true or false, got %s", what,
                 node_preview(n, pv, sizeof pv));
}

/* A non-empty string without NUL bytes that fits in `size` bytes. */
static bp_status read_string(const parse_ctx *c, const yaml_node_t *n, const char *what, char *out,
                             size_t size) {
  char pv[48];
  if (n->type != YAML_SCALAR_NODE || n->data.scalar.length == 0 ||
      strlen(scalar_text(n)) != n->data.scalar.length)
    return fail_at(c, n, BP_ERR_INVALID, "%s must be a string, got %s", what,
                   node_preview(n, pv, sizeof pv));
  if (n->data.scalar.length >= size)
    return fail_at(c, n, BP_ERR_INVALID, "%s %s is longer than %zu characters", what,
                   node_preview(n, pv, sizeof pv), size - 1);
  memcpy(out, scalar_text(n), n->data.scalar.length + 1);
  return BP_OK;
}

/* ---- mappings -------------------------------------------------------- */

typedef struct field_iter {
  const yaml_node_pair_t *pair, *end;
} field_iter;

static yaml_node_t *node_at(const parse_ctx *c, int id) {
  return yaml_document_get_node(c->doc, id);
}

/* Every key of mapping `m` must be a string and appear once. No mapping of
 * the format has more than 16 fields: the cap keeps this quadratic check
 * cheap on hostile input. */
static bp_status check_keys(const parse_ctx *c, const yaml_node_t *m, const char *owner) {
  if (m->data.mapping.pairs.top - m->data.mapping.pairs.start > 64)
    return fail_at(c, m, BP_ERR_INVALID, "%s has more than 64 fields", owner);
  for (const yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
       p++) {
    const yaml_node_t *k = node_at(c, p->key);
    char pv[48];
    if (k->type != YAML_SCALAR_NODE || strlen(scalar_text(k)) != k->data.scalar.length)
      return fail_at(c, k, BP_ERR_INVALID, "field names of %s must be words, got %s", owner,
                     node_preview(k, pv, sizeof pv));
    for (const yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++)
      if (strcmp(scalar_text(node_at(c, q->key)), scalar_text(k)) == 0)
        return fail_at(c, k, BP_ERR_INVALID, "duplicate field '%s' in %s", scalar_text(k), owner);
  }
  return BP_OK;
}

/* The value of `key` in mapping `m`, or NULL. Keys are checked strings. */
static const yaml_node_t *map_get(const parse_ctx *c, const yaml_node_t *m, const char *key) {
  for (const yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++)
    if (strcmp(scalar_text(node_at(c, p->key)), key) == 0) return node_at(c, p->value);
  return NULL;
}

static int name_in(const char *name, const char *const *names, int count) {
  for (int i = 0; i < count; i++)
    if (strcmp(name, names[i]) == 0) return i;
  return -1;
}

/* "a, b, c" */
static void join_names(const char *const *names, int count, unsigned mask, char *out, size_t size) {
  size_t o = 0;
  out[0] = '\0';
  for (int i = 0; i < count && o < size; i++) {
    if (!(mask & (1u << i))) continue;
    int n = snprintf(out + o, size - o, "%s%s", o ? ", " : "", names[i]);
    if (n < 0) break;
    o += (size_t)n;
  }
}

static bp_status expect_mapping(const parse_ctx *c, const yaml_node_t *n, const char *what,
                                const char *example) {
  char pv[48];
  if (n->type != YAML_MAPPING_NODE)
    return fail_at(c, n, BP_ERR_INVALID, "%s must be a mapping like %s, got %s", what, example,
                   node_preview(n, pv, sizeof pv));
  return check_keys(c, n, what);
}

/* ---- layers ------------------------------------------------------------ */

/* Keys every layer has; the others are its type's (layer-impl.h). */
static const char *const common_keys[] = {"type", "name", "input", "inputs"};

/* "type, name, input(s), <the type's keys>" */
static void list_keys(const bp_layer_desc *d, const bp_registered_layer *mod, char *out,
                      size_t size) {
  const int inputs = mod ? mod->layer.num_inputs : d->inputs;
  snprintf(out, size, "type, name, %s", inputs == 2 ? "inputs" : "input");
  const int count = mod ? mod->layer.num_attrs : d->key_count;
  for (int i = 0; i < count; i++)
    bp_strcatf(out, size, ", %s", mod ? mod->attrs[i].key : d->keys[i]->key);
}

/* `kernel: 3` or `kernel: [3, 5]` (height, width). */
static bp_status read_kernel(const parse_ctx *c, const yaml_node_t *n, const char *what,
                             const bp_layer_key *k, bp_layer *l) {
  if (n->type == YAML_SEQUENCE_NODE) {
    int count = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count != 2)
      return fail_at(c, n, BP_ERR_INVALID,
                     "%s must be one integer or [height, width], got %d items", what, count);
    bp_status st = read_int(c, node_at(c, n->data.sequence.items.start[0]), what,
                            (int64_t)k->lo, (int64_t)k->hi, &l->kernel_h);
    if (st != BP_OK) return st;
    return read_int(c, node_at(c, n->data.sequence.items.start[1]), what, (int64_t)k->lo,
                    (int64_t)k->hi, &l->kernel_w);
  }
  bp_status st = read_int(c, n, what, (int64_t)k->lo, (int64_t)k->hi, &l->kernel_h);
  l->kernel_w = l->kernel_h;
  return st;
}

/* `input: name` (one producer) or `inputs: [a, b]` (two): the name nodes
 * are kept and resolved once every layer is named. */
static bp_status read_refs(parse_ctx *c, int index, const yaml_node_t *n, int many,
                           const char *what) {
  char pv[48];
  if (!many) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.length == 0)
      return fail_at(c, n, BP_ERR_INVALID, "%s must name one layer (or 'input'), got %s", what,
                     node_preview(n, pv, sizeof pv));
    c->refs[index][0] = n;
    c->ref_count[index] = 1;
    return BP_OK;
  }
  int count = n->type == YAML_SEQUENCE_NODE
                  ? (int)(n->data.sequence.items.top - n->data.sequence.items.start)
                  : -1;
  if (count < 0)
    return fail_at(c, n, BP_ERR_INVALID, "%s must list two layers like [a, b], got %s", what,
                   node_preview(n, pv, sizeof pv));
  if (count != 2)
    return fail_at(c, n, BP_ERR_INVALID, "%s must list two layers like [a, b], got %d item%s",
                   what, count, count == 1 ? "" : "s");
  for (int k = 0; k < 2; k++) {
    const yaml_node_t *item = node_at(c, n->data.sequence.items.start[k]);
    if (item->type != YAML_SCALAR_NODE || item->data.scalar.length == 0)
      return fail_at(c, item, BP_ERR_INVALID, "%s must list layer names, got %s", what,
                     node_preview(item, pv, sizeof pv));
    c->refs[index][k] = item;
  }
  c->ref_count[index] = 2;
  return BP_OK;
}

/* One key of a built-in type into its bp_layer field. */
static bp_status read_key(parse_ctx *c, bp_layer *l, const bp_layer_key *k, const yaml_node_t *v,
                          const char *what) {
  char *field = (char *)l + k->offset;
  switch (k->kind) {
  case BP_KEY_KERNEL: return read_kernel(c, v, what, k, l);
  case BP_KEY_INT: {
    int64_t x;
    bp_status st = read_int(c, v, what, (int64_t)k->lo, (int64_t)k->hi, &x);
    if (st == BP_OK) memcpy(field, &x, sizeof x);
    return st;
  }
  case BP_KEY_BOOL: {
    int x;
    bp_status st = read_bool(c, v, what, &x);
    if (st == BP_OK) memcpy(field, &x, sizeof x);
    return st;
  }
  case BP_KEY_NUMBER: {
    double x;
    bp_status st = read_number(c, v, what, (num_range){k->lo, k->hi, k->lo_open, k->hi_open}, &x);
    if (st != BP_OK) return st;
    const float f = (float)x;
    /* an open bound must still hold once rounded to float (eps > 0) */
    if ((k->lo_open && !(f > k->lo)) || (k->hi_open && !(f < k->hi)))
      return fail_at(c, v, BP_ERR_INVALID, "%s is too %s for a float", what,
                     k->lo_open && !(f > k->lo) ? "small" : "large");
    memcpy(field, &f, sizeof f);
    return BP_OK;
  }
  }
  return BP_OK;
}

/* One key of a module's type into the attribute block (bp_abi_layer_attr). */
static bp_status read_attr(parse_ctx *c, bp_layer *l, const bp_abi_layer_attr *a,
                           const yaml_node_t *v, const char *what) {
  unsigned char *dst = l->attrs + a->offset;
  if (a->type == BP_ABI_LAYER_ATTR_FLOAT) {
    double x;
    bp_status st = read_number(c, v, what, (num_range){a->min, a->max, 0, 0}, &x);
    const float f = (float)x;
    if (st == BP_OK) memcpy(dst, &f, sizeof f);
    return st;
  }
  int32_t i;
  bp_status st;
  if (a->type == BP_ABI_LAYER_ATTR_BOOL) {
    int b;
    st = read_bool(c, v, what, &b);
    i = b;
  } else {
    int64_t x;
    st = read_int(c, v, what, (int64_t)a->min, (int64_t)a->max, &x);
    i = (int32_t)x;
  }
  if (st == BP_OK) memcpy(dst, &i, sizeof i);
  return st;
}

/* The default of a module type's key into the attribute block. */
static void attr_default(bp_layer *l, const bp_abi_layer_attr *a) {
  unsigned char *dst = l->attrs + a->offset;
  if (a->type == BP_ABI_LAYER_ATTR_FLOAT) {
    const float f = (float)a->default_value;
    memcpy(dst, &f, sizeof f);
  } else {
    const int32_t i = (int32_t)a->default_value;
    memcpy(dst, &i, sizeof i);
  }
}

/* "conv, batchnorm, ..." and the module types of the registry. */
static void list_types(const parse_ctx *c, char *out, size_t size) {
  out[0] = '\0';
  for (int t = 0; t < BP_LAYER_TYPE_COUNT; t++)
    if (t != BP_LAYER_MODULE)
      bp_strcatf(out, size, "%s%s", out[0] ? ", " : "", bp_layer_type_name((bp_layer_type)t));
  for (int i = 0; i < bp_registry_layer_count(c->registry); i++)
    bp_strcatf(out, size, ", %s", bp_registry_layer(c->registry, i)->layer.type);
}

/* Why a type is unknown: which modules were searched for it. */
static void modules_searched(const parse_ctx *c, char *out, size_t size) {
  if (!c->registry) {
    snprintf(out, size, "; no op modules were loaded to look for it");
    return;
  }
  out[0] = '\0';
  int loaded = 0;
  for (int i = 0; i < bp_registry_record_count(c->registry); i++) {
    const bp_load_record *r = bp_registry_record(c->registry, i);
    if (r->outcome != BP_LOAD_LOADED) continue;
    const char *base = strrchr(r->path, '/');
    bp_strcatf(out, size, "%s%s", loaded++ ? ", " : "; no loaded op module registers it (",
               base ? base + 1 : r->path);
  }
  if (loaded)
    bp_strcatf(out, size, "); load the module that does with --plugin or BP_PLUGIN_PATH");
  else
    snprintf(out, size, "; no op module is loaded (--plugin, BP_PLUGIN_PATH)");
}

static bp_status read_layer(parse_ctx *c, int index, const yaml_node_t *n) {
  char owner[160], pv[48], list[1024];
  snprintf(owner, sizeof owner, "layer %d", index);
  bp_status st = expect_mapping(c, n, owner, "{type: relu}");
  if (st != BP_OK) return st;
  bp_layer *l = &c->model->layers[index];

  /* type first: it decides which fields the layer takes */
  const yaml_node_t *tn = map_get(c, n, "type");
  bp_layer_type type;
  const bp_registered_layer *mod = NULL;
  list_types(c, list, sizeof list);
  if (!tn) return fail_at(c, n, BP_ERR_INVALID, "%s has no 'type' (one of: %s)", owner, list);
  const int text = tn->type == YAML_SCALAR_NODE && strlen(scalar_text(tn)) == tn->data.scalar.length;
  if (text && bp_layer_type_from_name(scalar_text(tn), &type) == 0) {
    /* built in */
  } else if (text && (mod = bp_registry_find_layer(c->registry, scalar_text(tn))) != NULL) {
    type = BP_LAYER_MODULE;
  } else {
    char searched[768];
    modules_searched(c, searched, sizeof searched);
    return fail_at(c, tn, BP_ERR_INVALID, "unknown layer type %s in %s (expected one of: %s%s)",
                   node_preview(tn, pv, sizeof pv), owner, list, text ? searched : "");
  }
  const bp_layer_desc *d = bp_layer_desc_of(type);
  const char *type_name = mod ? mod->layer.type : d->name;
  bp_layer_set_defaults(l, type);
  l->module = mod;
  if (mod) {
    l->input_count = mod->layer.num_inputs;
    for (int k = 0; k < mod->layer.num_attrs; k++) attr_default(l, &mod->attrs[k]);
  }
  l->line = (int)n->start_mark.line + 1;
  l->column = (int)n->start_mark.column + 1;

  /* then the name, so later messages can use it */
  const yaml_node_t *nn = map_get(c, n, "name");
  if (nn) {
    snprintf(owner, sizeof owner, "'name' of %s layer %d", type_name, index);
    if ((st = read_string(c, nn, owner, l->name, BP_LAYER_NAME_MAX)) != BP_OK) return st;
    if (!bp_layer_name_valid(l->name))
      return fail_at(c, nn, BP_ERR_INVALID,
                     "layer name %s: use letters, digits, '_' and '-' only ('%s' is reserved "
                     "for the model's input)",
                     node_preview(nn, pv, sizeof pv), BP_MODEL_INPUT_NAME);
  } else {
    snprintf(l->name, sizeof l->name, "%s%d", type_name, index);
  }
  const int j = bp_name_index_add(&c->names, index); /* an earlier layer of this name */
  if (j >= 0)
    return fail_at(c, nn ? nn : n, BP_ERR_INVALID,
                   "duplicate layer name '%s' (layer %d at line %d has it%s)", l->name, j,
                   c->model->layers[j].line,
                   nn ? "" : "; this layer is unnamed and got it by default");
  snprintf(owner, sizeof owner, "%s layer '%s'", type_name, l->name);

  /* every other field: the type's keys, each at most once (check_keys) */
  const int inputs = mod ? mod->layer.num_inputs : d->inputs;
  const bp_layer_key *all[BP_LAYER_KEYS_MAX];
  const int all_count = bp_layer_all_keys(all, BP_LAYER_KEYS_MAX);
  unsigned seen = 0; /* bit i: key i of the type */
  int stride_given = 0;
  for (const yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
       p++) {
    const char *key = scalar_text(node_at(c, p->key));
    const yaml_node_t *v = node_at(c, p->value);
    char what[224];
    snprintf(what, sizeof what, "'%s' of %s", key, owner);
    if (strcmp(key, "type") == 0 || strcmp(key, "name") == 0) continue;
    if (strcmp(key, inputs == 2 ? "inputs" : "input") == 0) {
      if ((st = read_refs(c, index, v, inputs == 2, what)) != BP_OK) return st;
      continue;
    }
    int found = -1;
    const int count = mod ? mod->layer.num_attrs : d->key_count;
    for (int i = 0; i < count && found < 0; i++)
      if (strcmp(key, mod ? mod->attrs[i].key : d->keys[i]->key) == 0) found = i;
    if (found < 0) {
      int elsewhere = name_in(key, common_keys, 4) >= 0;
      for (int i = 0; i < all_count && !elsewhere; i++) elsewhere = strcmp(key, all[i]->key) == 0;
      list_keys(d, mod, list, sizeof list);
      return fail_at(c, node_at(c, p->key), BP_ERR_INVALID,
                     "%s field '%s' in %s (a %s layer takes: %s)",
                     elsewhere ? "inapplicable" : "unknown", key, owner, type_name, list);
    }
    st = mod ? read_attr(c, l, &mod->attrs[found], v, what) : read_key(c, l, d->keys[found], v, what);
    if (st != BP_OK) return st;
    seen |= 1u << found;
    if (!mod && d->keys[found] == &bp_key_stride) stride_given = 1;
  }
  if (inputs == 2 && c->ref_count[index] == 0)
    return fail_at(c, n, BP_ERR_INVALID, "%s is missing required field 'inputs'", owner);
  const int count = mod ? mod->layer.num_attrs : d->key_count;
  for (int i = 0; i < count; i++)
    if ((mod ? mod->attrs[i].required : d->keys[i]->required) && !(seen & (1u << i)))
      return fail_at(c, n, BP_ERR_INVALID, "%s is missing required field '%s'", owner,
                     mod ? mod->attrs[i].key : d->keys[i]->key);

  /* a pooling window moves by its own size unless told otherwise */
  if (d->stride_is_kernel && !stride_given) {
    if (l->kernel_h != l->kernel_w)
      return fail_at(c, n, BP_ERR_INVALID, "%s has a %lldx%lld kernel: give its 'stride'", owner,
                     (long long)l->kernel_h, (long long)l->kernel_w);
    l->stride = l->kernel_h;
  }
  return BP_OK;
}

/* Producers by name: "input" is the model's input; a name must belong to an
 * earlier layer. Without `input:` a layer reads the one before it. */
static bp_status resolve_refs(parse_ctx *c) {
  bp_model *m = c->model;
  for (int i = 0; i < m->layer_count; i++) {
    bp_layer *l = &m->layers[i];
    if (c->ref_count[i] == 0) {
      l->inputs[0] = i > 0 ? i - 1 : BP_MODEL_INPUT;
      l->input_count = 1;
      continue;
    }
    l->input_count = c->ref_count[i];
    for (int k = 0; k < c->ref_count[i]; k++) {
      const yaml_node_t *rn = c->refs[i][k];
      const char *ref = scalar_text(rn);
      if (strcmp(ref, BP_MODEL_INPUT_NAME) == 0) {
        l->inputs[k] = BP_MODEL_INPUT;
        continue;
      }
      int j = bp_name_index_find(&c->names, ref);
      if (j < 0) j = m->layer_count;
      char pv[48];
      if (j == m->layer_count)
        return fail_at(c, rn, BP_ERR_INVALID,
                       "unknown input %s for %s layer '%s' (no layer has that name; '%s' is the "
                       "model's input)",
                       node_preview(rn, pv, sizeof pv), bp_layer_kind(l), l->name,
                       BP_MODEL_INPUT_NAME);
      if (j >= i)
        return fail_at(c, rn, BP_ERR_INVALID,
                       "%s layer '%s' reads '%s', which %s; layers are listed in the order "
                       "they run",
                       bp_layer_kind(l), l->name, ref,
                       j == i ? "is itself" : "comes later");
      l->inputs[k] = j;
    }
  }
  return BP_OK;
}

static bp_status read_layers(parse_ctx *c, const yaml_node_t *n) {
  char pv[48];
  if (n->type != YAML_SEQUENCE_NODE)
    return fail_at(
        c, n, BP_ERR_INVALID,
        "'layers' must be a sequence of layers like [{type: fc, units: 10}, ...], got %s",
        node_preview(n, pv, sizeof pv));
  ptrdiff_t count = n->data.sequence.items.top - n->data.sequence.items.start;
  if (count == 0) return fail_at(c, n, BP_ERR_INVALID, "'layers' is empty");
  if (count > BP_MODEL_LAYERS_MAX)
    return fail_at(c, n, BP_ERR_INVALID, "'layers' lists %td layers; at most %d are allowed", count,
                   BP_MODEL_LAYERS_MAX);
  bp_model *m = c->model;
  m->layers = calloc((size_t)count, sizeof *m->layers);
  c->refs = calloc((size_t)count, sizeof *c->refs);
  c->ref_count = calloc((size_t)count, sizeof *c->ref_count);
  if (!m->layers || !c->refs || !c->ref_count ||
      bp_name_index_init(&c->names, m->layers[0].name, sizeof *m->layers, (int)count) != 0)
    return bp_fail(BP_ERR_NOMEM, "%s: out of memory for %td layers", c->file, count);
  for (int i = 0; i < (int)count; i++) {
    m->layer_count = i + 1; /* destroy() frees what was read so far */
    bp_status st = read_layer(c, i, node_at(c, n->data.sequence.items.start[i]));
    if (st != BP_OK) return st;
  }
  return resolve_refs(c);
}

/* ---- top level ----------------------------------------------------------- */

static bp_status read_input(parse_ctx *c, const yaml_node_t *n) {
  static const char *const names[] = {"height", "width", "channels", "classes"};
  bp_status st =
      expect_mapping(c, n, "'input'", "{height: 28, width: 28, channels: 1, classes: 10}");
  if (st != BP_OK) return st;
  int64_t *dst[] = {&c->model->height, &c->model->width, &c->model->channels, &c->model->classes};
  for (const yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
       p++) {
    const yaml_node_t *k = node_at(c, p->key);
    if (name_in(scalar_text(k), names, 4) < 0)
      return fail_at(c, k, BP_ERR_INVALID,
                     "unknown field '%s' in 'input' (it takes: height, width, channels, classes)",
                     scalar_text(k));
  }
  for (int f = 0; f < 4; f++) {
    const yaml_node_t *v = map_get(c, n, names[f]);
    if (!v)
      return fail_at(c, n, BP_ERR_INVALID, "'input' is missing required field '%s'", names[f]);
    char what[64];
    snprintf(what, sizeof what, "'%s' of 'input'", names[f]);
    if ((st = read_int(c, v, what, 1, BP_MODEL_DIM_MAX, dst[f])) != BP_OK) return st;
  }
  return BP_OK;
}

static bp_status read_train(parse_ctx *c, const yaml_node_t *n) {
  enum {
    BATCH,
    EVAL_BATCH,
    TRAIN_SIZE,
    EPOCHS,
    OPTIMIZER,
    LR,
    MOMENTUM,
    WEIGHT_DECAY,
    AMP,
    EMA,
    KERNELS,
    SCHEDULE,
    WARMUP_EPOCHS,
    COUNT
  };
  static const char *const names[COUNT] = {"batch",     "eval_batch", "train_size", "epochs",
                                           "optimizer", "lr",         "momentum",   "weight_decay",
                                           "amp",       "ema",        "kernels",    "schedule",
                                           "warmup_epochs"};
  bp_status st = expect_mapping(c, n, "'train'", "{batch: 128, lr: 0.05}");
  if (st != BP_OK) return st;
  bp_train_settings *t = &c->model->train;
  for (const yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
       p++) {
    const yaml_node_t *k = node_at(c, p->key), *v = node_at(c, p->value);
    int f = name_in(scalar_text(k), names, COUNT);
    char what[64], list[256], opt[16], pv[48];
    if (f < 0) {
      join_names(names, COUNT, (1u << COUNT) - 1u, list, sizeof list);
      return fail_at(c, k, BP_ERR_INVALID, "unknown field '%s' in 'train' (it takes: %s)",
                     scalar_text(k), list);
    }
    snprintf(what, sizeof what, "'%s' of 'train'", names[f]);
    const num_range nonneg = {0.0, INFINITY, 0, 0};
    switch (f) {
    case BATCH: st = read_int(c, v, what, 1, INT64_MAX, &t->batch); break;
    case EVAL_BATCH: st = read_int(c, v, what, 1, INT64_MAX, &t->eval_batch); break;
    case TRAIN_SIZE: st = read_int(c, v, what, 1, INT64_MAX, &t->train_size); break;
    case EPOCHS: st = read_int(c, v, what, 1, INT64_MAX, &t->epochs); break;
    case OPTIMIZER:
      if (v->type != YAML_SCALAR_NODE || v->data.scalar.length >= sizeof opt ||
          bp_optimizer_from_name(scalar_text(v), &t->optimizer) != 0)
        st = fail_at(c, v, BP_ERR_INVALID, "%s must be sgd, adamw or lars, got %s", what,
                     node_preview(v, pv, sizeof pv));
      break;
    case SCHEDULE:
      if (v->type != YAML_SCALAR_NODE || v->data.scalar.length >= sizeof opt ||
          bp_lr_schedule_from_name(scalar_text(v), &t->schedule) != 0)
        st = fail_at(c, v, BP_ERR_INVALID, "%s must be constant, step or cosine, got %s", what,
                     node_preview(v, pv, sizeof pv));
      break;
    case WARMUP_EPOCHS: st = read_number(c, v, what, nonneg, &t->warmup_epochs); break;
    case LR: st = read_number(c, v, what, nonneg, &t->lr); break;
    case MOMENTUM: st = read_number(c, v, what, (num_range){0.0, 1.0, 0, 1}, &t->momentum); break;
    case WEIGHT_DECAY: st = read_number(c, v, what, nonneg, &t->weight_decay); break;
    case AMP: st = read_bool(c, v, what, &t->amp); break;
    case EMA: st = read_bool(c, v, what, &t->ema); break;
    case KERNELS: /* pins, checked where kernels are chosen (registry.h) */
      if (v->type != YAML_SCALAR_NODE || v->data.scalar.length >= sizeof t->kernels ||
          strlen(scalar_text(v)) != v->data.scalar.length)
        st = fail_at(c, v, BP_ERR_INVALID, "%s must be a string of pins (op_glob=impl,...) "
                     "shorter than %zu bytes, got %s", what, sizeof t->kernels,
                     node_preview(v, pv, sizeof pv));
      else
        memcpy(t->kernels, scalar_text(v), v->data.scalar.length + 1);
      break;
    }
    if (st != BP_OK) return st;
  }
  return BP_OK;
}

/* The model's name when the file gives none: the file name without its
 * folder and extension, if that is a valid name. */
static void default_model_name(const char *file, char out[BP_NAME_MAX]) {
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  size_t n = strcspn(base, ".");
  int ok = n > 0 && n < BP_NAME_MAX;
  for (size_t i = 0; ok && i < n; i++)
    ok = (base[i] >= 'a' && base[i] <= 'z') || (base[i] >= 'A' && base[i] <= 'Z') ||
         (base[i] >= '0' && base[i] <= '9') || base[i] == '_' || base[i] == '-';
  if (!ok) {
    base = "model";
    n = 5;
  }
  memcpy(out, base, n);
  out[n] = '\0';
}

static bp_status read_model(parse_ctx *c, const yaml_node_t *root) {
  static const char *const names[] = {"name", "input", "layers", "train"};
  char pv[48];
  if (root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0 &&
      root->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
    return fail_at(c, root, BP_ERR_INVALID,
                   "the document is empty; expected a mapping with 'input' and 'layers'");
  if (root->type != YAML_MAPPING_NODE)
    return fail_at(c, root, BP_ERR_INVALID,
                   "expected a mapping with 'input' and 'layers' at the top level, got %s",
                   node_preview(root, pv, sizeof pv));
  bp_status st = check_keys(c, root, "the model");
  if (st != BP_OK) return st;
  for (const yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
       p++) {
    const yaml_node_t *k = node_at(c, p->key);
    if (name_in(scalar_text(k), names, 4) < 0)
      return fail_at(c, k, BP_ERR_INVALID,
                     "unknown top-level field '%s' (a model takes: name, input, layers, train)",
                     scalar_text(k));
  }
  bp_model *m = c->model;
  const yaml_node_t *v;
  if (c->train_only) { /* training settings beside an ONNX model: nothing else */
    for (const yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
      const yaml_node_t *k = node_at(c, p->key);
      if (strcmp(scalar_text(k), "train") != 0)
        return fail_at(c, k, BP_ERR_INVALID, "field '%s': the settings beside an ONNX model "
                       "take only 'train' (the network is the ONNX file's)", scalar_text(k));
    }
    return (v = map_get(c, root, "train")) ? read_train(c, v) : BP_OK;
  }
  if ((v = map_get(c, root, "name"))) {
    if ((st = read_string(c, v, "'name' of the model", m->name, BP_NAME_MAX)) != BP_OK) return st;
    if (strspn(m->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
        strlen(m->name))
      return fail_at(c, v, BP_ERR_INVALID,
                     "model name %s: use letters, digits, '_', '.' and '-' only",
                     node_preview(v, pv, sizeof pv));
  } else {
    default_model_name(c->file, m->name);
  }
  if (!(v = map_get(c, root, "input")))
    return fail_at(c, root, BP_ERR_INVALID,
                   "missing required field 'input' (like {height: 28, width: 28, channels: 1, "
                   "classes: 10})");
  if ((st = read_input(c, v)) != BP_OK) return st;
  if ((v = map_get(c, root, "train")) && (st = read_train(c, v)) != BP_OK) return st;
  if (!(v = map_get(c, root, "layers")))
    return fail_at(c, root, BP_ERR_INVALID, "missing required field 'layers'");
  if ((st = read_layers(c, v)) != BP_OK) return st;
  return bp_model_check(m); /* what fields alone cannot say (e.g. the loss is last) */
}

/* ---- libyaml errors ------------------------------------------------------ */

/* 1-based line and column of byte `offset` of the input. */
static void offset_position(const parse_ctx *c, size_t offset, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < offset && i < c->length; i++) {
    if (c->text[i] == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

static bp_status yaml_error(const parse_ctx *c, const yaml_parser_t *p) {
  if (p->error == YAML_MEMORY_ERROR)
    return bp_fail(BP_ERR_NOMEM, "%s: out of memory reading YAML", c->file);
  size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
  if (p->error == YAML_READER_ERROR) offset_position(c, p->problem_offset, &line, &col);
  char context[160] = "";
  if (p->context)
    snprintf(context, sizeof context, " (%s at line %zu, column %zu)", p->context,
             (size_t)p->context_mark.line + 1, (size_t)p->context_mark.column + 1);
  return bp_fail(BP_ERR_PARSE, "%s:%zu:%zu: YAML syntax error: %s%s", c->file, line, col,
                 p->problem ? p->problem : "malformed input", context);
}

/* A pass over the events before the document is built: nesting deeper
 * than MODEL_DEPTH_MAX is refused at its first level too many (libyaml's
 * loader takes quadratic time on deep nesting), and so is an explicit tag:
 * `!!str 5` would otherwise read as the plain 5, although quoted values
 * are strings and refused where numbers are expected. */
static bp_status prescan(const parse_ctx *c) {
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p))
    return bp_fail(BP_ERR_NOMEM, "%s: out of memory starting the YAML parser", c->file);
  yaml_parser_set_input_string(&p, (const unsigned char *)c->text, c->length);
  bp_status st = BP_OK;
  int depth = 0;
  for (;;) {
    yaml_event_t e;
    if (!yaml_parser_parse(&p, &e)) {
      st = yaml_error(c, &p);
      break;
    }
    const yaml_event_type_t type = e.type;
    const size_t line = e.start_mark.line + 1, col = e.start_mark.column + 1;
    const char *tag = type == YAML_SCALAR_EVENT             ? (const char *)e.data.scalar.tag
                      : type == YAML_SEQUENCE_START_EVENT ? (const char *)e.data.sequence_start.tag
                      : type == YAML_MAPPING_START_EVENT  ? (const char *)e.data.mapping_start.tag
                                                          : NULL;
    if (tag)
      st = bp_fail(BP_ERR_INVALID,
                   "%s:%zu:%zu: explicit YAML tag '%.64s': a model file takes plain values "
                   "(write 5, not !!str 5)",
                   c->file, line, col, tag);
    else if ((type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) &&
             ++depth > MODEL_DEPTH_MAX)
      st = bp_fail(BP_ERR_INVALID, "%s:%zu:%zu: nesting deeper than %d levels; not a model file",
                   c->file, line, col, MODEL_DEPTH_MAX);
    else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT)
      depth--;
    yaml_event_delete(&e);
    if (st != BP_OK || type == YAML_STREAM_END_EVENT) break;
  }
  yaml_parser_delete(&p);
  return st;
}

/* ---- entry points ------------------------------------------------------ */

bp_status bp_model_parse(const char *text, size_t length, const char *display_name,
                         bp_model **model_out) {
  return bp_model_parse_with_registry(text, length, display_name, NULL, model_out);
}

static bp_status parse_text(const char *text, size_t length, const char *display_name,
                            const bp_registry *registry, int train_only, bp_model **model_out);

bp_status bp_model_parse_with_registry(const char *text, size_t length, const char *display_name,
                                       const bp_registry *registry, bp_model **model_out) {
  return parse_text(text, length, display_name, registry, 0, model_out);
}

bp_status bp_train_settings_parse(const char *text, size_t length, const char *display_name,
                                  bp_train_settings *settings) {
  if (!settings) return bp_fail(BP_ERR_INVALID, "bp_train_settings_parse: NULL argument");
  bp_model *m = NULL;
  bp_status st = parse_text(text, length, display_name, NULL, 1, &m);
  if (st == BP_OK) {
    const bp_train_settings defaults = bp_train_defaults();
    bp_train_settings *t = &m->train;
    /* only what the file sets: the rest stays as the caller had it */
    if (t->batch != defaults.batch) settings->batch = t->batch;
    if (t->eval_batch != defaults.eval_batch) settings->eval_batch = t->eval_batch;
    if (t->train_size != defaults.train_size) settings->train_size = t->train_size;
    if (t->epochs != defaults.epochs) settings->epochs = t->epochs;
    if (t->optimizer != defaults.optimizer) settings->optimizer = t->optimizer;
    if (t->lr != defaults.lr) settings->lr = t->lr;
    if (t->momentum != defaults.momentum) settings->momentum = t->momentum;
    if (t->weight_decay != defaults.weight_decay) settings->weight_decay = t->weight_decay;
    if (t->amp != defaults.amp) settings->amp = t->amp;
    if (t->ema != defaults.ema) settings->ema = t->ema;
    if (t->kernels[0]) memcpy(settings->kernels, t->kernels, sizeof t->kernels);
  }
  bp_model_destroy(m);
  return st;
}

static bp_status parse_text(const char *text, size_t length, const char *display_name,
                            const bp_registry *registry, int train_only, bp_model **model_out) {
  if (!model_out || (!text && length > 0))
    return bp_fail(BP_ERR_INVALID, "bp_model_parse: NULL argument");
  if (length > MODEL_FILE_MAX)
    return bp_fail(BP_ERR_INVALID, "%s: %zu bytes, larger than %u MiB; not a model file",
                   display_name ? display_name : "<memory>", length, MODEL_FILE_MAX >> 20);
  parse_ctx c;
  memset(&c, 0, sizeof c);
  c.registry = registry;
  c.train_only = train_only;
  c.file = display_name ? display_name : "<memory>";
  c.text = text ? text : "";
  c.length = length;
  bp_model *m = calloc(1, sizeof *m);
  if (!m) return bp_fail(BP_ERR_NOMEM, "%s: out of memory for a model", c.file);
  snprintf(m->path, sizeof m->path, "%s", c.file);
  m->train = bp_train_defaults();
  c.model = m;

  yaml_parser_t parser;
  yaml_document_t doc, next;
  if (!yaml_parser_initialize(&parser)) {
    free(m);
    return bp_fail(BP_ERR_NOMEM, "%s: out of memory starting the YAML parser", c.file);
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)c.text, length);
  bp_status st = prescan(&c);
  if (st != BP_OK) {
    /* refused before the document is built */
  } else if (!yaml_parser_load(&parser, &doc)) { /* on failure libyaml frees doc itself */
    st = yaml_error(&c, &parser);
  } else {
    c.doc = &doc;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
      st = bp_fail(BP_ERR_INVALID,
                   "%s:1:1: the file holds no YAML document; expected a mapping with 'input' "
                   "and 'layers'",
                   c.file);
    } else if ((st = read_model(&c, root)) == BP_OK) {
      /* one model per file: a second document is a mistake, not ignored */
      if (!yaml_parser_load(&parser, &next)) {
        st = yaml_error(&c, &parser);
      } else {
        const yaml_node_t *extra = yaml_document_get_root_node(&next);
        if (extra)
          st = fail_at(&c, extra, BP_ERR_INVALID,
                       "a second YAML document; a model file holds exactly one");
        yaml_document_delete(&next);
      }
    }
    yaml_document_delete(&doc);
  }
  yaml_parser_delete(&parser);
  free(c.refs);
  free(c.ref_count);
  bp_name_index_free(&c.names);
  if (st != BP_OK) {
    bp_model_destroy(m);
    return st;
  }
  *model_out = m;
  return BP_OK;
}

bp_status bp_model_load(const char *path, bp_model **model_out) {
  return bp_model_load_with_registry(path, NULL, model_out);
}

bp_status bp_model_load_with_registry(const char *path, const bp_registry *registry,
                                      bp_model **model_out) {
  if (!path || !model_out) return bp_fail(BP_ERR_INVALID, "bp_model_load: NULL argument");
  /* the checked open (infile.h): a FIFO or a device is refused, not read */
  char why[256];
  const int fd = bp_input_open(path, 0, NULL, why, sizeof why);
  if (fd < 0) return bp_fail(BP_ERR_IO, "%s: cannot open: %s", path, why);
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    close(fd);
    return bp_fail(BP_ERR_IO, "%s: cannot open: %s", path, strerror(err));
  }
  size_t size = 0, cap = 4096;
  char *text = malloc(cap);
  bp_status st = BP_OK;
  while (text) {
    size_t got = fread(text + size, 1, cap - size, f);
    size += got;
    if (got == 0 || size < cap) break;
    if (cap >= MODEL_FILE_MAX) {
      st = bp_fail(BP_ERR_IO, "%s: larger than %u MiB; not a model file", path,
                   MODEL_FILE_MAX >> 20);
      break;
    }
    char *grown = realloc(text, cap * 2);
    if (!grown) {
      free(text);
      text = NULL;
      break;
    }
    text = grown;
    cap *= 2;
  }
  if (!text)
    st = bp_fail(BP_ERR_NOMEM, "%s: out of memory reading the file", path);
  else if (st == BP_OK && ferror(f))
    st = bp_fail(BP_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  fclose(f);
  if (st == BP_OK) st = bp_model_parse_with_registry(text, size, path, registry, model_out);
  free(text);
  return st;
}
