/* Host services a module's init calls (bp_abi_host): registrations are
 * checked and staged here, and reach the registry only through
 * bp_stage_commit, so a module that fails leaves nothing behind. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  const char *env = getenv("BP_LOG");
  int max = BP_ABI_LOG_WARN;
  if (env && strcmp(env, "info") == 0) max = BP_ABI_LOG_INFO;
  if (env && strcmp(env, "debug") == 0) max = BP_ABI_LOG_DEBUG;
  if (level < BP_ABI_LOG_ERROR || level > max) return;
  fprintf(stderr, "blueprint: %s: %s: %s\n", r && r->stage.active ? r->stage.path : "module",
          names[level], str_or_null(message));
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
  };
}

void bp_stage_begin(bp_registry *r, const char *path) {
  BP_REG_ASSERT(!r->stage.active && r->stage.ops.count == 0 && r->stage.kernels.count == 0 &&
                r->stage.devices.count == 0);
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
      bp_ptr_list_reserve(&r->devices, s->devices.count) != 0)
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
  s->ops.count = s->kernels.count = s->devices.count = 0;
  return BP_OK;
}

void bp_stage_end(bp_registry *r) {
  bp_stage *s = &r->stage;
  bp_ptr_list *lists[3] = {&s->ops, &s->kernels, &s->devices};
  for (int l = 0; l < 3; l++) {
    for (int i = 0; i < lists[l]->count; i++) free(lists[l]->items[i]);
    free(lists[l]->items);
    lists[l]->items = NULL;
    lists[l]->count = lists[l]->cap = 0;
  }
  s->active = 0;
  s->path = NULL;
}
