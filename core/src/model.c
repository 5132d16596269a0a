/* Models in memory: layer type names, defaults, and the structural checks
 * every model passes before it is compiled, whether it came from a file or
 * was built in C. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer-impl.h"
#include "name-index-impl.h"

bp_train_settings bp_train_defaults(void) {
  bp_train_settings t;
  memset(&t, 0, sizeof t);
  t.batch = 128;
  t.eval_batch = 200; /* divides the 10000 test images; sets the feature slots less than a big batch */
  t.train_size = 60000;
  t.epochs = 3;
  t.optimizer = BP_OPT_SGD;
  t.lr = 0.05;
  t.momentum = 0.9;
  t.weight_decay = 5e-4;
  t.schedule = BP_LR_CONSTANT;
  return t;
}

static const char *const schedule_names[] = {"constant", "step", "cosine"};

const char *bp_lr_schedule_name(bp_lr_schedule s) {
  return (int)s >= 0 && s <= BP_LR_COSINE ? schedule_names[s] : "?";
}

int bp_lr_schedule_from_name(const char *name, bp_lr_schedule *out) {
  for (int s = 0; s <= BP_LR_COSINE; s++)
    if (name && strcmp(name, schedule_names[s]) == 0) {
      *out = (bp_lr_schedule)s;
      return 0;
    }
  return -1;
}

int bp_layer_name_valid(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n >= BP_LAYER_NAME_MAX || strcmp(name, BP_MODEL_INPUT_NAME) == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return 0;
  }
  return 1;
}

void bp_model_destroy(bp_model *model) {
  if (!model) return;
  for (int i = 0; i < model->init_count; i++) free(model->inits[i].values);
  free(model->inits);
  free(model->layers);
  free(model);
}

void bp_model_where(const bp_model *m, const bp_layer *l, char *buf, size_t size) {
  /* bounded: a model built in C may leave its strings without a NUL */
  const int path_max = (int)sizeof m->path - 1, name_max = (int)sizeof m->name - 1;
  if (m->path[0] && l && l->line > 0)
    snprintf(buf, size, "%.*s:%d:%d", path_max, m->path, l->line, l->column);
  else if (m->path[0])
    snprintf(buf, size, "%.*s", path_max, m->path);
  else
    snprintf(buf, size, "model '%.*s'", name_max, m->name);
}

/* Fails with "where: layer 'name': <fmt>". */
static bp_status layer_invalid(const bp_model *m, const bp_layer *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bp_status layer_invalid(const bp_model *m, const bp_layer *l, const char *fmt, ...) {
  char where[4200], what[512];
  bp_model_where(m, l, where, sizeof where);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  /* the name may come from C without its NUL: print at most BP_NAME_MAX-1 bytes */
  return bp_fail(BP_ERR_INVALID, "%s: %s layer '%.*s': %s", where,
                 l->type == BP_LAYER_MODULE && !l->module ? "module" : bp_layer_kind(l),
                 BP_NAME_MAX - 1, l->name, what);
}

/* One key's field of layer l against the key's range. */
static bp_status check_key(const bp_model *m, const bp_layer *l, const bp_layer_key *k) {
  const char *p = (const char *)l + k->offset;
  if (k->kind == BP_KEY_NUMBER) {
    float v;
    memcpy(&v, p, sizeof v);
    const int ok = isfinite(v) && (k->lo_open ? v > k->lo : v >= k->lo) &&
                   (k->hi_open ? v < k->hi : v <= k->hi);
    if (!ok)
      return layer_invalid(m, l, "'%s' must be a finite number in %c%g, %g%c, got %g", k->field,
                           k->lo_open ? '(' : '[', k->lo, k->hi, k->hi_open ? ')' : ']',
                           (double)v);
    return BP_OK;
  }
  int64_t values[2];
  const char *names[2] = {k->field, NULL};
  int count = 1;
  if (k->kind == BP_KEY_KERNEL) {
    values[0] = l->kernel_h;
    values[1] = l->kernel_w;
    names[0] = "kernel_h";
    names[1] = "kernel_w";
    count = 2;
  } else if (k->kind == BP_KEY_BOOL) {
    int v;
    memcpy(&v, p, sizeof v);
    values[0] = v;
  } else {
    memcpy(&values[0], p, sizeof values[0]);
  }
  for (int i = 0; i < count; i++)
    if (values[i] < (int64_t)k->lo || values[i] > (int64_t)k->hi)
      return layer_invalid(m, l, "'%s' must be in [%lld, %lld], got %lld", names[i],
                           (long long)k->lo, (long long)k->hi, (long long)values[i]);
  return BP_OK;
}

/* Every key of the layer's type in its range, then the type's own checks. */
static bp_status check_layer_values(const bp_model *m, const bp_layer *l) {
  const bp_layer_desc *d = bp_layer_desc_for(l);
  for (int k = 0; k < d->key_count; k++) {
    bp_status st = check_key(m, l, d->keys[k]);
    if (st != BP_OK) return st;
  }
  char why[256];
  if (d->check && d->check(l, why, sizeof why) != 0) return layer_invalid(m, l, "%s", why);
  return BP_OK;
}

/* Inputs a layer takes: its type's, or its module type's. */
static int layer_inputs(const bp_layer *l) {
  if (l->type == BP_LAYER_MODULE) return l->module ? l->module->layer.num_inputs : 1;
  return bp_layer_desc_for(l)->inputs;
}

static bp_status check_layer_inputs(const bp_model *m, int i) {
  const bp_layer *l = &m->layers[i];
  int want = layer_inputs(l);
  if (l->input_count != want)
    return layer_invalid(m, l, "takes %d input%s, got %d", want, want == 1 ? "" : "s",
                         l->input_count);
  for (int k = 0; k < want; k++) {
    int p = l->inputs[k];
    if (p == BP_MODEL_INPUT) continue;
    if (p < 0 || p >= m->layer_count)
      return layer_invalid(m, l, "input %d refers to layer index %d, which does not exist", k, p);
    if (p >= i)
      return layer_invalid(m, l,
                           "reads layer '%s', which does not come before it (layers are "
                           "listed in the order they run)",
                           m->layers[p].name);
  }
  return BP_OK;
}

static bp_status check_train(const bp_model *m) {
  const bp_train_settings *t = &m->train;
  char where[4200];
  bp_model_where(m, NULL, where, sizeof where);
  const struct {
    const char *name;
    int64_t value;
  } counts[] = {{"batch", t->batch},
                {"eval_batch", t->eval_batch},
                {"train_size", t->train_size},
                {"epochs", t->epochs}};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
    if (counts[k].value < 1)
      return bp_fail(BP_ERR_INVALID, "%s: train: '%s' must be >= 1, got %lld", where,
                     counts[k].name, (long long)counts[k].value);
  if ((int)t->optimizer < BP_OPT_SGD || t->optimizer > BP_OPT_LARS)
    return bp_fail(BP_ERR_INVALID, "%s: train: unknown optimizer %d", where, (int)t->optimizer);
  if (!(t->lr >= 0.0) || !isfinite(t->lr))
    return bp_fail(BP_ERR_INVALID, "%s: train: 'lr' must be a finite number >= 0, got %g", where,
                   t->lr);
  if (!(t->momentum >= 0.0 && t->momentum < 1.0))
    return bp_fail(BP_ERR_INVALID, "%s: train: 'momentum' must be in [0, 1), got %g", where,
                   t->momentum);
  if (!(t->weight_decay >= 0.0) || !isfinite(t->weight_decay))
    return bp_fail(BP_ERR_INVALID, "%s: train: 'weight_decay' must be a finite number >= 0, got %g",
                   where, t->weight_decay);
  if ((int)t->schedule < BP_LR_CONSTANT || t->schedule > BP_LR_COSINE)
    return bp_fail(BP_ERR_INVALID, "%s: train: unknown schedule %d", where, (int)t->schedule);
  if (!(t->warmup_epochs >= 0.0) || !isfinite(t->warmup_epochs))
    return bp_fail(BP_ERR_INVALID,
                   "%s: train: 'warmup_epochs' must be a finite number >= 0, got %g", where,
                   t->warmup_epochs);
  return BP_OK;
}

/* Every layer's type, name (unique: `names` indexes them), values and
 * inputs; softmax_ce only last. */
static bp_status check_layers(const bp_model *m, bp_name_index *names) {
  bp_status st;
  for (int i = 0; i < m->layer_count; i++) {
    const bp_layer *l = &m->layers[i];
    if ((int)l->type < 0 || l->type >= BP_LAYER_TYPE_COUNT)
      return layer_invalid(m, l, "unknown layer type %d", (int)l->type);
    if (strnlen(l->name, BP_NAME_MAX) >= BP_NAME_MAX || !bp_layer_name_valid(l->name))
      return layer_invalid(m, l,
                           "invalid name: use 1 to %d characters of [A-Za-z0-9_-] ('%s' is "
                           "reserved for the model's input)",
                           BP_LAYER_NAME_MAX - 1, BP_MODEL_INPUT_NAME);
    const int j = bp_name_index_add(names, i); /* an earlier layer of this name */
    if (j >= 0) {
      char first[4200];
      bp_model_where(m, &m->layers[j], first, sizeof first);
      return layer_invalid(m, l, "duplicate layer name (first used at %s)", first);
    }
    if ((st = check_layer_values(m, l)) != BP_OK || (st = check_layer_inputs(m, i)) != BP_OK)
      return st;
    if (l->type == BP_LAYER_SOFTMAX_CE && i != m->layer_count - 1)
      return layer_invalid(m, l, "softmax_ce is the loss and must be the last layer");
  }
  return BP_OK;
}

bp_status bp_model_check(const bp_model *m) {
  if (!m) return bp_fail(BP_ERR_INVALID, "model is NULL");
  char where[4200];
  bp_model_where(m, NULL, where, sizeof where);
  if (m->layer_count < 1 || !m->layers)
    return bp_fail(BP_ERR_INVALID, "%s: the model has no layers", where);
  const struct {
    const char *name;
    int64_t value;
  } extents[] = {{"height", m->height},
                 {"width", m->width},
                 {"channels", m->channels},
                 {"classes", m->classes}};
  for (size_t k = 0; k < sizeof extents / sizeof extents[0]; k++)
    if (extents[k].value < 1 || extents[k].value > BP_MODEL_DIM_MAX)
      return bp_fail(BP_ERR_INVALID, "%s: input: '%s' must be in [1, %lld], got %lld", where,
                     extents[k].name, (long long)BP_MODEL_DIM_MAX, (long long)extents[k].value);
  bp_status st = check_train(m);
  if (st != BP_OK) return st;
  bp_name_index names;
  if (bp_name_index_init(&names, m->layers[0].name, sizeof *m->layers, m->layer_count) != 0)
    return bp_fail(BP_ERR_NOMEM, "%s: out of memory checking %d layers", where, m->layer_count);
  st = check_layers(m, &names);
  bp_name_index_free(&names);
  if (st != BP_OK) return st;
  const bp_layer *last = &m->layers[m->layer_count - 1];
  if (last->type != BP_LAYER_SOFTMAX_CE)
    return layer_invalid(m, last, "the last layer must be softmax_ce (the loss), not %s",
                         bp_layer_kind(last));
  return BP_OK;
}
