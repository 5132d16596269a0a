/* Host services a module's init calls (bp_abi_host): registrations are
 * checked and staged here, and reach the registry only through
 * bp_stage_commit, so a module that fails leaves nothing behind. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model-impl.h"
#include "registry-impl.h"

/* Inputs or outputs an op may declare. */
#define BP_OP_IO_MAX 16

static const char *str_or_null(const char *s) { return s ? s : "(null)"; }

/* The registry behind ctx while a module's init runs, else NULL: a
 * module that kept the host table and calls later is refused. */
static bp_registry *staging(void *ctx, const char *what) {
  bp_registry *r = ctx;
  if (!r || !r->stage.active) {
    fprintf(stderr, "blueprint: a module called host->%s outside its init; ignored\n", what);
    return NULL;
  }
  return r;
}

/* Marks the module's registration as failed; the first reason is kept. */
static int refuse(bp_registry *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(bp_registry *r, int code, const char *fmt, ...) {
  if (!r->stage.failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->stage.reason, sizeof r->stage.reason, fmt, ap);
    va_end(ap);
    r->stage.failed = 1;
  }
  return code;
}

static void host_log(void *ctx, int level, const char *message) {
  bp_registry *r = ctx;
  static const char *const names[] = {"error", "warning", "info", "debug"};
  const int max = r ? r->log_level : BP_ABI_LOG_WARN; /* bp_registry_options */
  if (level < BP_ABI_LOG_ERROR || level > max) return;
  fprintf(stderr, "blueprint: %s: %s: %s\n", r && r->stage.active ? r->stage.path : "module",
          names[level], str_or_null(message));
}

/* The value of module option `name` (bp_registry_options), or NULL. */
static const char *host_option(void *ctx, const char *name) {
  const bp_registry *r = ctx;
  const size_t n = name ? strlen(name) : 0;
  for (int i = 0; r && n && i < r->module_option_count; i++)
    if (strncmp(r->module_options[i], name, n) == 0 && r->module_options[i][n] == '=')
      return r->module_options[i] + n + 1;
  return NULL;
}

static void host_error(void *ctx, const char *message) {
  bp_registry *r = staging(ctx, "error");
  if (r) snprintf(r->stage.init_error, sizeof r->stage.init_error, "%s", str_or_null(message));
}

/* Reads struct_size and checks it holds everything up to `min_end`. */
static int struct_size_ok(bp_registry *r, const void *s, size_t min_end, const char *what) {
  uint32_t size;
  memcpy(&size, s, sizeof size);
  if (size < min_end || size > BP_ABI_STRUCT_MAX) {
    refuse(r, BP_ABI_ERR_INVALID, "%s has struct_size %u, outside %zu..%u bytes", what, size,
           min_end, BP_ABI_STRUCT_MAX);
    return 0;
  }
  return 1;
}

/* The op named `name`, committed or staged by this module, or NULL;
 * *path_out says who registered it. */
static const bp_abi_op *find_op(const bp_registry *r, const char *name, const char **path_out) {
  const bp_ptr_list *lists[2] = {&r->ops, &r->stage.ops};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < lists[l]->count; i++) {
      const bp_reg_op *op = lists[l]->items[i];
      if (strcmp(op->op.name, name) == 0) {
        *path_out = op->path;
        return &op->op;
      }
    }
  return NULL;
}

static int host_register_op(void *ctx, const bp_abi_op *op) {
  bp_registry *r = staging(ctx, "register_op");
  if (!r) return BP_ABI_ERR_INVALID;
  if (!op) return refuse(r, BP_ABI_ERR_INVALID, "register_op(NULL)");
  if (!struct_size_ok(r, op, BP_ABI_END(bp_abi_op, num_outputs), "op descriptor"))
    return BP_ABI_ERR_INVALID;
  bp_abi_op o;
  bp_abi_copy(&o, sizeof o, op);
  if (!bp_registry_name_valid(o.name))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "op name '%s' is not valid (1..63 characters of [A-Za-z0-9_.+-])",
                  str_or_null(o.name));
  if (o.num_inputs < 0 || o.num_inputs > BP_OP_IO_MAX || o.num_outputs < 0 ||
      o.num_outputs > BP_OP_IO_MAX || o.num_inputs + o.num_outputs == 0)
    return refuse(r, BP_ABI_ERR_INVALID,
                  "op '%s' declares %d inputs and %d outputs (each 0..%d, not both 0)", o.name,
                  o.num_inputs, o.num_outputs, BP_OP_IO_MAX);
  const char *other = NULL;
  if (find_op(r, o.name, &other))
    return refuse(r, BP_ABI_ERR_DUPLICATE,
                  "duplicate op '%s': already registered by %s, refused from %s", o.name, other,
                  r->stage.path);
  bp_reg_op *staged = malloc(sizeof *staged);
  if (!staged || bp_ptr_list_push(&r->stage.ops, staged) != 0) {
    free(staged);
    return refuse(r, BP_ABI_ERR_NOMEM, "out of memory registering op '%s'", o.name);
  }
  staged->op = o;
  staged->path = r->stage.path;
  return BP_ABI_OK;
}

static int host_register_kernel(void *ctx, const bp_abi_kernel *kernel) {
  bp_registry *r = staging(ctx, "register_kernel");
  if (!r) return BP_ABI_ERR_INVALID;
  if (!kernel) return refuse(r, BP_ABI_ERR_INVALID, "register_kernel(NULL)");
  if (!struct_size_ok(r, kernel, BP_ABI_END(bp_abi_kernel, run), "kernel descriptor"))
    return BP_ABI_ERR_INVALID;
  bp_abi_kernel k;
  bp_abi_copy(&k, sizeof k, kernel);
  const char *op = str_or_null(k.op), *impl = str_or_null(k.impl), *dev = str_or_null(k.device);
  if (!bp_registry_name_valid(k.op) || !bp_registry_name_valid(k.impl) ||
      !bp_registry_name_valid(k.device))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "kernel %s/%s/%s: op, impl and device names must be 1..63 characters of "
                  "[A-Za-z0-9_.+-]",
                  op, impl, dev);
  const char *op_path = NULL;
  if (!find_op(r, k.op, &op_path))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "kernel %s/%s/%s: unknown op '%s' (register the op kind first)", op, impl, dev,
                  op);
  if (k.dtypes == 0)
    return refuse(r, BP_ABI_ERR_INVALID, "kernel %s/%s/%s: empty dtype mask", op, impl, dev);
  if (!k.run) return refuse(r, BP_ABI_ERR_INVALID, "kernel %s/%s/%s: run is NULL", op, impl, dev);
  const bp_ptr_list *lists[2] = {&r->kernels, &r->stage.kernels};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < lists[l]->count; i++) {
      const bp_registered_kernel *o = lists[l]->items[i];
      if (strcmp(o->kernel.op, k.op) == 0 && strcmp(o->kernel.impl, k.impl) == 0 &&
          strcmp(o->kernel.device, k.device) == 0)
        return refuse(r, BP_ABI_ERR_DUPLICATE,
                      "duplicate kernel %s/%s/%s: already registered by %s, refused from %s", op,
                      impl, dev, o->path, r->stage.path);
    }
  bp_registered_kernel *staged = calloc(1, sizeof *staged);
  if (!staged || bp_ptr_list_push(&r->stage.kernels, staged) != 0) {
    free(staged);
    return refuse(r, BP_ABI_ERR_NOMEM, "out of memory registering kernel %s/%s/%s", op, impl,
                  dev);
  }
  staged->kernel = k;
  staged->path = r->stage.path;
  staged->build_id = "";
  staged->load_index = -1; /* set at commit */
  return BP_ABI_OK;
}

/* The device's collective transports (1.6, bp_abi_device.h): checked here,
 * so the trainer may call them without checking again. */
static int transports_ok(bp_registry *r, const bp_abi_device *d) {
  if (d->num_transports == 0) return 1;
  if (d->num_transports < 0 || d->num_transports > BP_ABI_COMM_TRANSPORTS_MAX || !d->transports) {
    refuse(r, BP_ABI_ERR_INVALID, "device '%s': %d collective transports (at most %d, with the array)",
           d->kind, (int)d->num_transports, BP_ABI_COMM_TRANSPORTS_MAX);
    return 0;
  }
  const size_t stride = d->transports->struct_size; /* the first element's (rule 6) */
  for (int32_t i = 0; i < d->num_transports; i++) {
    const void *at = (const char *)d->transports + (size_t)i * stride;
    if (!struct_size_ok(r, at, BP_ABI_END(bp_abi_comm_transport, close), "collective transport"))
      return 0;
    bp_abi_comm_transport t;
    bp_abi_copy(&t, sizeof t, at);
    const uint32_t known = BP_ABI_COMM_SPANS_PROCESSES | BP_ABI_COMM_SPANS_DEVICES |
                           BP_ABI_COMM_SHARES_DEVICE;
    if (!bp_registry_name_valid(t.backend) || !t.open || !t.comm || !t.close || !t.flags ||
        (t.flags & ~known)) {
      refuse(r, BP_ABI_ERR_INVALID,
             "device '%s': collective transport %d needs a backend name, open, comm, close and "
             "flags among BP_ABI_COMM_* (backend '%s', flags 0x%x)",
             d->kind, (int)i, str_or_null(t.backend), (unsigned)t.flags);
      return 0;
    }
  }
  return 1;
}

static int host_register_device(void *ctx, const bp_abi_device *device) {
  bp_registry *r = staging(ctx, "register_device");
  if (!r) return BP_ABI_ERR_INVALID;
  if (!device) return refuse(r, BP_ABI_ERR_INVALID, "register_device(NULL)");
  if (!struct_size_ok(r, device, BP_ABI_END(bp_abi_device, host_free_pinned),
                      "device descriptor"))
    return BP_ABI_ERR_INVALID;
  bp_abi_device d;
  bp_abi_copy(&d, sizeof d, device);
  if (!bp_registry_name_valid(d.kind))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "device kind '%s' is not valid (1..63 characters of [A-Za-z0-9_.+-])",
                  str_or_null(d.kind));
  /* Every function not marked (optional) in bp_abi_device.h. */
  const struct {
    const char *name;
    int set;
  } required[] = {
      {"device_count", d.device_count != NULL},
      {"arena_alloc", d.arena_alloc != NULL},
      {"arena_free", d.arena_free != NULL},
      {"stream_create", d.stream_create != NULL},
      {"stream_destroy", d.stream_destroy != NULL},
      {"stream_synchronize", d.stream_synchronize != NULL},
      {"stream_enqueue_host", d.stream_enqueue_host != NULL},
      {"stream_native", d.stream_native != NULL},
      {"event_create", d.event_create != NULL},
      {"event_destroy", d.event_destroy != NULL},
      {"event_record", d.event_record != NULL},
      {"stream_wait_event", d.stream_wait_event != NULL},
      {"event_synchronize", d.event_synchronize != NULL},
      {"event_elapsed_ms", d.event_elapsed_ms != NULL},
      {"copy_h2d", d.copy_h2d != NULL},
      {"copy_d2h", d.copy_d2h != NULL},
      {"copy_d2d", d.copy_d2d != NULL},
      {"host_alloc_pinned", d.host_alloc_pinned != NULL},
      {"host_free_pinned", d.host_free_pinned != NULL},
  };
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
    if (!required[i].set)
      return refuse(r, BP_ABI_ERR_INVALID, "device '%s': %s is NULL (it is not optional)",
                    d.kind, required[i].name);
  if (!transports_ok(r, &d)) return BP_ABI_ERR_INVALID;
  const bp_ptr_list *lists[2] = {&r->devices, &r->stage.devices};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < lists[l]->count; i++) {
      const bp_reg_device *o = lists[l]->items[i];
      if (strcmp(o->device.kind, d.kind) == 0)
        return refuse(r, BP_ABI_ERR_DUPLICATE,
                      "duplicate device '%s': already registered by %s, refused from %s", d.kind,
                      o->path, r->stage.path);
    }
  bp_reg_device *staged = malloc(sizeof *staged);
  if (!staged || bp_ptr_list_push(&r->stage.devices, staged) != 0) {
    free(staged);
    return refuse(r, BP_ABI_ERR_NOMEM, "out of memory registering device '%s'", d.kind);
  }
  staged->device = d;
  staged->path = r->stage.path;
  return BP_ABI_OK;
}

/* ---- layer types (1.4) ------------------------------------------------------ */

/* The layer type named `type`, committed or staged by this module, or NULL. */
static const bp_registered_layer *find_layer(const bp_registry *r, const char *type) {
  const bp_ptr_list *lists[2] = {&r->layers, &r->stage.layers};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < lists[l]->count; i++) {
      const bp_registered_layer *o = lists[l]->items[i];
      if (strcmp(o->layer.type, type) == 0) return o;
    }
  return NULL;
}

/* Keys every layer has; a module's schema may not use them. */
static int reserved_key(const char *key) {
  return strcmp(key, "type") == 0 || strcmp(key, "name") == 0 || strcmp(key, "input") == 0 ||
         strcmp(key, "inputs") == 0;
}

/* One attribute of layer type `t` (copied into `a`): a valid, unique key,
 * a known type, an aligned int32/float inside the block and clear of the
 * accumulate flag, a range and a default inside it. */
static int check_layer_attr(bp_registry *r, const bp_abi_layer *t, const bp_abi_layer_attr *a,
                            const bp_abi_layer_attr *earlier, int index) {
  const char *type = t->type, *key = str_or_null(a->key);
  if (!bp_layer_name_valid(key) || reserved_key(key))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': attribute %d key '%s' is not valid (1..47 characters of "
                  "[A-Za-z0-9_-]; not type, name, input or inputs)",
                  type, index, key);
  for (int j = 0; j < index; j++)
    if (strcmp(earlier[j].key, key) == 0)
      return refuse(r, BP_ABI_ERR_INVALID, "layer type '%s': key '%s' is declared twice", type,
                    key);
  if (a->type != BP_ABI_LAYER_ATTR_INT && a->type != BP_ABI_LAYER_ATTR_FLOAT &&
      a->type != BP_ABI_LAYER_ATTR_BOOL)
    return refuse(r, BP_ABI_ERR_INVALID, "layer type '%s': key '%s' has unknown type %d", type,
                  key, (int)a->type);
  if (a->offset % 4 != 0 || a->offset > t->attr_size || t->attr_size - a->offset < 4)
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': key '%s' at offset %u does not fit a 4-byte aligned value "
                  "in the %u-byte attribute block",
                  type, key, (unsigned)a->offset, (unsigned)t->attr_size);
  if (t->accumulate_offset != UINT32_MAX && a->offset == t->accumulate_offset)
    return refuse(r, BP_ABI_ERR_INVALID, "layer type '%s': key '%s' overlaps the accumulate flag",
                  type, key);
  double lo = a->type == BP_ABI_LAYER_ATTR_BOOL ? 0.0 : a->min;
  double hi = a->type == BP_ABI_LAYER_ATTR_BOOL ? 1.0 : a->max;
  if (!(lo <= hi) || (a->type == BP_ABI_LAYER_ATTR_INT && (lo < INT32_MIN || hi > INT32_MAX)) ||
      (a->type == BP_ABI_LAYER_ATTR_FLOAT && (lo < -3.4e38 || hi > 3.4e38)))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': key '%s' has the range [%g, %g] (min <= max, inside its "
                  "type)",
                  type, key, a->min, a->max);
  if (!a->required && !(a->default_value >= lo && a->default_value <= hi))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': key '%s' defaults to %g, outside its range [%g, %g]", type,
                  key, a->default_value, lo, hi);
  return BP_ABI_OK;
}

/* The op `name` of layer type `type` must exist (committed or staged by
 * this module) with the tensor counts a layer of `inputs` inputs and
 * `saved` saved tensors needs. */
static const bp_abi_op *layer_op(bp_registry *r, const char *type, const char *role,
                                 const char *name, int inputs, int saved, int want_in,
                                 int want_out) {
  const char *path = NULL;
  const bp_abi_op *op = name ? find_op(r, name, &path) : NULL;
  if (!op) {
    refuse(r, BP_ABI_ERR_INVALID,
           "layer type '%s': %s op '%s' is not registered (register it first, in this module "
           "or an earlier one)",
           type, role, str_or_null(name));
    return NULL;
  }
  if (op->num_inputs != want_in || op->num_outputs != want_out) {
    refuse(r, BP_ABI_ERR_INVALID,
           "layer type '%s': %s op '%s' has %d inputs and %d outputs; a layer of %d input%s "
           "and %d saved tensor%s needs %d and %d",
           type, role, name, op->num_inputs, op->num_outputs, inputs, inputs == 1 ? "" : "s",
           saved, saved == 1 ? "" : "s", want_in, want_out);
    return NULL;
  }
  return op;
}

/* Copies layer type `t`'s saved tensors into out[t->num_saved] (strided,
 * bp_abi_ops.h rule 6) and checks each: a dtype the plan places, a 0/1
 * flag, channels in range (0 per channel). */
static int copy_layer_saved(bp_registry *r, const bp_abi_layer *t, bp_abi_layer_saved *out) {
  const char *type = t->type;
  if (t->num_saved == 0) return BP_ABI_OK;
  uint32_t stride = 0;
  memcpy(&stride, t->saved, sizeof stride);
  if (stride < BP_ABI_END(bp_abi_layer_saved, channels) || stride > BP_ABI_STRUCT_MAX)
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': saved tensor struct_size %u, outside %zu..%u bytes", type,
                  (unsigned)stride, BP_ABI_END(bp_abi_layer_saved, channels), BP_ABI_STRUCT_MAX);
  for (int k = 0; k < t->num_saved; k++) {
    bp_abi_layer_saved *s = &out[k];
    bp_abi_copy(s, sizeof *s, (const char *)t->saved + (size_t)k * stride);
    if (s->dtype != BP_ABI_DTYPE_FP32 && s->dtype != BP_ABI_DTYPE_FP16 &&
        s->dtype != BP_ABI_DTYPE_INT8 && s->dtype != BP_ABI_DTYPE_INT32)
      return refuse(r, BP_ABI_ERR_INVALID,
                    "layer type '%s': saved tensor %d has dtype %d (FP32, FP16, INT8 or INT32)",
                    type, k, (int)s->dtype);
    if (s->per_channel != 0 && s->per_channel != 1)
      return refuse(r, BP_ABI_ERR_INVALID,
                    "layer type '%s': saved tensor %d has per_channel %d (0 or 1)", type, k,
                    (int)s->per_channel);
    if (s->per_channel && s->channels != 0)
      return refuse(r, BP_ABI_ERR_INVALID,
                    "layer type '%s': saved tensor %d is per channel ([1,1,1,C] of the output) "
                    "but has %d channels (must be 0)",
                    type, k, (int)s->channels);
    if (s->channels < 0 || s->channels > BP_ABI_LAYER_SAVED_CHANNELS_MAX)
      return refuse(r, BP_ABI_ERR_INVALID,
                    "layer type '%s': saved tensor %d has %d channels (0 for the output's C, or "
                    "1..%d)",
                    type, k, (int)s->channels, BP_ABI_LAYER_SAVED_CHANNELS_MAX);
  }
  return BP_ABI_OK;
}

static int host_register_layer(void *ctx, const bp_abi_layer *layer) {
  bp_registry *r = staging(ctx, "register_layer");
  if (!r) return BP_ABI_ERR_INVALID;
  if (!layer) return refuse(r, BP_ABI_ERR_INVALID, "register_layer(NULL)");
  if (!struct_size_ok(r, layer, BP_ABI_END(bp_abi_layer, num_attrs), "layer descriptor"))
    return BP_ABI_ERR_INVALID;
  bp_abi_layer t;
  bp_abi_copy(&t, sizeof t, layer);
  const char *type = str_or_null(t.type);
  bp_layer_type builtin;
  if (!bp_layer_name_valid(type))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type name '%s' is not valid (1..47 characters of [A-Za-z0-9_-])", type);
  if (bp_layer_type_from_name(type, &builtin) == 0)
    return refuse(r, BP_ABI_ERR_DUPLICATE,
                  "duplicate layer type '%s': a built-in type of blueprint, refused from %s", type,
                  r->stage.path);
  const bp_registered_layer *other = find_layer(r, type);
  if (other)
    return refuse(r, BP_ABI_ERR_DUPLICATE,
                  "duplicate layer type '%s': already registered by %s, refused from %s", type,
                  other->path, r->stage.path);
  if (t.num_inputs != 1 && t.num_inputs != 2)
    return refuse(r, BP_ABI_ERR_INVALID, "layer type '%s': %d inputs (1 or 2)", type,
                  (int)t.num_inputs);
  if (t.attr_size > BP_ABI_LAYER_ATTR_SIZE_MAX)
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': a %u-byte attribute block (at most %d)", type,
                  (unsigned)t.attr_size, BP_ABI_LAYER_ATTR_SIZE_MAX);
  if (t.num_attrs < 0 || t.num_attrs > BP_ABI_LAYER_ATTRS_MAX || (t.num_attrs > 0 && !t.attrs))
    return refuse(r, BP_ABI_ERR_INVALID, "layer type '%s': %d attributes (0..%d, with their list)",
                  type, (int)t.num_attrs, BP_ABI_LAYER_ATTRS_MAX);
  if (t.num_saved < 0 || t.num_saved > BP_ABI_LAYER_SAVED_MAX || (t.num_saved > 0 && !t.saved))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': %d saved tensors (0..%d, with their list)", type,
                  (int)t.num_saved, BP_ABI_LAYER_SAVED_MAX);
  const int ns = (int)t.num_saved;
  const bp_abi_op *fwd =
      layer_op(r, type, "forward", t.forward_op, t.num_inputs, ns, t.num_inputs, 1 + ns);
  if (!fwd) return BP_ABI_ERR_INVALID;
  const bp_abi_op *bwd = NULL;
  if (t.backward_op) {
    bwd = layer_op(r, type, "backward", t.backward_op, t.num_inputs, ns, t.num_inputs + 2 + ns,
                   t.num_inputs);
    if (!bwd) return BP_ABI_ERR_INVALID;
    if (t.accumulate_offset == UINT32_MAX || t.accumulate_offset % 4 != 0 ||
        t.accumulate_offset > t.attr_size || t.attr_size - t.accumulate_offset < 4)
      return refuse(r, BP_ABI_ERR_INVALID,
                    "layer type '%s': a backward op needs its int32 accumulate flag inside the "
                    "%u-byte attribute block (accumulate_offset %u)",
                    type, (unsigned)t.attr_size, (unsigned)t.accumulate_offset);
  }
  if (fwd->attr_size != t.attr_size || (bwd && bwd->attr_size != t.attr_size))
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': its %u-byte attribute block differs from its ops' (%s %u%s%s)",
                  type, (unsigned)t.attr_size, fwd->name, (unsigned)fwd->attr_size,
                  bwd ? ", " : "", bwd ? bwd->name : "");
  /* one allocation: the copy, then its attributes (bp_abi_ops.h rule 6:
   * strided by the writer's struct_size) */
  const size_t n = (size_t)t.num_attrs;
  bp_registered_layer *staged = calloc(1, sizeof *staged + n * sizeof(bp_abi_layer_attr) +
                                              (size_t)ns * sizeof(bp_abi_layer_saved));
  if (!staged) return refuse(r, BP_ABI_ERR_NOMEM, "out of memory registering layer '%s'", type);
  bp_abi_layer_attr *attrs = (bp_abi_layer_attr *)(staged + 1);
  bp_abi_layer_saved *saved = (bp_abi_layer_saved *)(attrs + n);
  if (copy_layer_saved(r, &t, saved) != BP_ABI_OK) {
    free(staged);
    return BP_ABI_ERR_INVALID;
  }
  uint32_t stride = 0;
  if (n) memcpy(&stride, t.attrs, sizeof stride);
  if (n && (stride < BP_ABI_END(bp_abi_layer_attr, required) || stride > BP_ABI_STRUCT_MAX)) {
    free(staged);
    return refuse(r, BP_ABI_ERR_INVALID,
                  "layer type '%s': attribute struct_size %u, outside %zu..%u bytes", type,
                  (unsigned)stride, BP_ABI_END(bp_abi_layer_attr, required), BP_ABI_STRUCT_MAX);
  }
  for (size_t i = 0; i < n; i++) {
    bp_abi_copy(&attrs[i], sizeof attrs[i], (const char *)t.attrs + i * stride);
    if (check_layer_attr(r, &t, &attrs[i], attrs, (int)i) != BP_ABI_OK) {
      free(staged);
      return BP_ABI_ERR_INVALID;
    }
  }
  if (bp_ptr_list_push(&r->stage.layers, staged) != 0) {
    free(staged);
    return refuse(r, BP_ABI_ERR_NOMEM, "out of memory registering layer '%s'", type);
  }
  staged->layer = t;
  staged->layer.attrs = attrs;
  staged->attrs = attrs;
  staged->layer.saved = ns ? saved : NULL;
  staged->saved = staged->layer.saved;
  staged->forward = fwd;
  staged->backward = bwd;
  staged->path = r->stage.path;
  return BP_ABI_OK;
}

void bp_stage_host_init(bp_registry *r) {
  r->host = (bp_abi_host){
      .struct_size = sizeof(bp_abi_host),
      .abi_major = BP_ABI_MAJOR,
      .abi_minor = BP_ABI_MINOR,
      .ctx = r,
      .log = host_log,
      .error = host_error,
      .register_op = host_register_op,
      .register_kernel = host_register_kernel,
      .register_device = host_register_device,
      .register_layer = host_register_layer,
      .option = host_option,
  };
}

void bp_stage_begin(bp_registry *r, const char *path) {
  BP_ASSERT(!r->stage.active && r->stage.ops.count == 0 && r->stage.kernels.count == 0 &&
                r->stage.devices.count == 0 && r->stage.layers.count == 0);
  r->stage.active = 1;
  r->stage.path = path;
  r->stage.failed = 0;
  r->stage.reason[0] = '\0';
  r->stage.init_error[0] = '\0';
}

bp_status bp_stage_commit(bp_registry *r, const bp_reg_module *module) {
  bp_stage *s = &r->stage;
  if (bp_ptr_list_reserve(&r->ops, s->ops.count) != 0 ||
      bp_ptr_list_reserve(&r->kernels, s->kernels.count) != 0 ||
      bp_ptr_list_reserve(&r->devices, s->devices.count) != 0 ||
      bp_ptr_list_reserve(&r->layers, s->layers.count) != 0)
    return BP_ERR_NOMEM;
  /* From here nothing fails (invariant 2). */
  for (int i = 0; i < s->ops.count; i++) r->ops.items[r->ops.count++] = s->ops.items[i];
  for (int i = 0; i < s->devices.count; i++)
    r->devices.items[r->devices.count++] = s->devices.items[i];
  for (int i = 0; i < s->kernels.count; i++) {
    bp_registered_kernel *k = s->kernels.items[i];
    k->path = module->path;
    k->build_id = module->build_id;
    k->load_index = r->next_load_index++;
    r->kernels.items[r->kernels.count++] = k;
  }
  for (int i = 0; i < s->layers.count; i++) {
    bp_registered_layer *l = s->layers.items[i];
    l->path = module->path;
    r->layers.items[r->layers.count++] = l;
  }
  s->ops.count = s->kernels.count = s->devices.count = s->layers.count = 0;
  return BP_OK;
}

void bp_stage_end(bp_registry *r) {
  bp_stage *s = &r->stage;
  bp_ptr_list *lists[4] = {&s->ops, &s->kernels, &s->devices, &s->layers};
  for (int l = 0; l < 4; l++) {
    for (int i = 0; i < lists[l]->count; i++) free(lists[l]->items[i]);
    free(lists[l]->items);
    lists[l]->items = NULL;
    lists[l]->count = lists[l]->cap = 0;
  }
  s->active = 0;
  s->path = NULL;
}
