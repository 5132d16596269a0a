/* Registry: the loaded modules, their ops, kernels and devices, and the
 * record of every load attempt. Invariants are in registry-impl.h. */
#include <errno.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blueprint/op_table.h"
#include "registry-impl.h"
#include "strutil-impl.h"

int bp_registry_name_valid(const char *name) {
  if (!name || !name[0]) return 0;
  size_t n = 0;
  for (const char *p = name; *p; p++, n++) {
    char c = *p;
    int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && (p == name || (c != '_' && c != '.' && c != '+' && c != '-'))) return 0;
  }
  return n <= 63;
}

/* Appends a record (capacity reserved by the caller) with "" for every
 * string nothing was said about. */
static void record_publish(bp_registry *r, bp_reg_record *rec) {
  bp_record_fill_empty(rec);
  if (!rec->pub.source) rec->pub.source = r->loading_source ? r->loading_source : "";
  BP_ASSERT(r->records.count < r->records.cap);
  r->records.items[r->records.count++] = rec;
}

bp_status bp_registry_note(bp_registry *r, const char *path, bp_load_outcome outcome,
                           bp_status status, const char *fmt, ...) {
  char msg[BP_REASON_MAX * 2];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  bp_reg_record *rec = bp_record_new(path);
  if (!rec || bp_ptr_list_reserve(&r->records, 1) != 0 ||
      bp_record_set_message(rec, "%s", msg) != 0) {
    bp_record_free(rec);
    return bp_fail(BP_ERR_NOMEM, "out of memory recording %s", path);
  }
  rec->pub.outcome = outcome;
  rec->status = status;
  record_publish(r, rec);
  if (status == BP_OK) return BP_OK;
  return bp_fail(status, "%s: %s", path, msg);
}

void bp_registry_options_init(bp_registry_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->log_level = BP_ABI_LOG_WARN;
}

bp_status bp_registry_set_log_level(bp_registry *r, int level) {
  if (!r) return bp_fail(BP_ERR_INVALID, "bp_registry_set_log_level: NULL registry");
  if (level < BP_ABI_LOG_ERROR || level > BP_ABI_LOG_DEBUG)
    return bp_fail(BP_ERR_INVALID, "bp_registry_set_log_level: log level %d is outside %d..%d",
                   level, BP_ABI_LOG_ERROR, BP_ABI_LOG_DEBUG);
  r->log_level = level;
  return BP_OK;
}

bp_status bp_registry_create(bp_registry **registry_out) {
  return bp_registry_create_with(NULL, registry_out);
}

bp_status bp_registry_create_with(const bp_registry_options *options,
                                  bp_registry **registry_out) {
  if (!registry_out) return bp_fail(BP_ERR_INVALID, "bp_registry_create: NULL argument");
  bp_registry_options o;
  bp_registry_options_init(&o);
  if (options) { /* read only what the caller's struct holds (abi/README.md, rule 2) */
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > sizeof o * 4)
      return bp_fail(BP_ERR_INVALID, "bp_registry_create: options have struct_size %u",
                     options->struct_size);
    memcpy(&o, options, options->struct_size < sizeof o ? options->struct_size : sizeof o);
  }
  if (o.log_level < BP_ABI_LOG_ERROR || o.log_level > BP_ABI_LOG_DEBUG)
    return bp_fail(BP_ERR_INVALID, "bp_registry_create: log level %d is outside %d..%d",
                   o.log_level, BP_ABI_LOG_ERROR, BP_ABI_LOG_DEBUG);
  bp_registry *r = calloc(1, sizeof *r);
  if (!r) return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
  r->log_level = o.log_level;
  if (o.module_option_count < 0 || (o.module_option_count > 0 && !o.module_options)) {
    free(r);
    return bp_fail(BP_ERR_INVALID, "bp_registry_create: %d module options",
                   o.module_option_count);
  }
  for (int i = 0; i < o.module_option_count; i++) {
    const char *opt = o.module_options[i], *eq = opt ? strchr(opt, '=') : NULL;
    if (!eq || eq == opt) {
      free(r);
      return bp_fail(BP_ERR_INVALID, "bp_registry_create: module option '%s' is not name=value",
                     opt ? opt : "(null)");
    }
  }
  if (o.module_option_count > 0 &&
      !(r->module_options = calloc((size_t)o.module_option_count, sizeof *r->module_options))) {
    free(r);
    return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
  }
  for (int i = 0; i < o.module_option_count; i++, r->module_option_count++)
    if (!(r->module_options[i] = bp_strdup(o.module_options[i]))) {
      bp_registry_destroy(r);
      return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
    }
  r->search_path = o.search_path ? bp_strdup(o.search_path) : NULL;
  r->pins = o.pins ? bp_strdup(o.pins) : NULL;
  if ((o.search_path && !r->search_path) || (o.pins && !r->pins)) {
    bp_registry_destroy(r);
    return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
  }
  bp_stage_host_init(r);
  int count = 0;
  const bp_op_info *builtin = bp_op_table(&count);
  if (bp_ptr_list_reserve(&r->ops, count) != 0) {
    bp_registry_destroy(r);
    return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
  }
  for (int i = 0; i < count; i++) {
    bp_reg_op *op = calloc(1, sizeof *op);
    if (!op) {
      bp_registry_destroy(r);
      return bp_fail(BP_ERR_NOMEM, "out of memory creating a registry");
    }
    op->op = builtin[i].abi;
    op->path = BP_BUILTIN_PATH;
    r->ops.items[r->ops.count++] = op;
  }
  *registry_out = r;
  return BP_OK;
}

/* The module's counterpart of the init that ran: fini_ctx(ctx) after a
 * successful init_ctx, fini after init (bp_abi_module). At most once. */
static void module_finish(bp_reg_module *m) {
  if (m->has_ctx) {
    if (m->desc.fini_ctx) m->desc.fini_ctx(m->ctx);
  } else if (!m->desc.init_ctx && m->desc.fini) {
    m->desc.fini();
  }
  m->has_ctx = 0;
  m->ctx = NULL;
}

static void free_all(bp_ptr_list *list) {
  for (int i = 0; i < list->count; i++) free(list->items[i]);
  free(list->items);
  list->items = NULL;
  list->count = list->cap = 0;
}

void bp_registry_destroy(bp_registry *r) {
  if (!r) return;
  bp_stage_end(r);
  free_all(&r->kernels);
  free_all(&r->ops);
  free_all(&r->devices);
  free_all(&r->layers);
  /* Reverse load order: a later module may rely on an earlier one. */
  for (int i = r->modules.count - 1; i >= 0; i--) {
    bp_reg_module *m = r->modules.items[i];
    module_finish(m);
    dlclose(m->handle);
    free(m->path);
    free(m->build_id);
    free(m);
  }
  free(r->modules.items);
  for (int i = 0; i < r->records.count; i++) bp_record_free(r->records.items[i]);
  free(r->records.items);
  for (int i = 0; i < r->dirs.count; i++) {
    bp_search_dir *d = r->dirs.items[i];
    free((char *)d->path);
    free(d);
  }
  free(r->dirs.items);
  if (r->tuner.destroy) r->tuner.destroy(r->tuner.ctx);
  if (r->checker.destroy) r->checker.destroy(r->checker.ctx);
  free(r->search_path);
  free(r->pins);
  for (int i = 0; i < r->module_option_count; i++) free(r->module_options[i]);
  free(r->module_options);
  free(r);
}

bp_status bp_registry_set_tuner(bp_registry *r, const bp_select_tuner *tuner) {
  if (!r) return bp_fail(BP_ERR_INVALID, "bp_registry_set_tuner: NULL registry");
  if (tuner && !tuner->pick) return bp_fail(BP_ERR_INVALID, "bp_registry_set_tuner: no pick");
  if (r->tuner.destroy) r->tuner.destroy(r->tuner.ctx);
  r->tuner = tuner ? *tuner : (bp_select_tuner){0};
  return BP_OK;
}

const bp_select_tuner *bp_registry_tuner(const bp_registry *r) {
  return r && r->tuner.pick ? &r->tuner : NULL;
}

bp_status bp_registry_set_checker(bp_registry *r, const bp_select_checker *checker) {
  if (!r) return bp_fail(BP_ERR_INVALID, "bp_registry_set_checker: NULL registry");
  if (checker && !checker->pinned)
    return bp_fail(BP_ERR_INVALID, "bp_registry_set_checker: no pinned");
  if (r->checker.destroy) r->checker.destroy(r->checker.ctx);
  r->checker = checker ? *checker : (bp_select_checker){0};
  return BP_OK;
}

const bp_select_checker *bp_registry_checker(const bp_registry *r) {
  return r && r->checker.pinned ? &r->checker : NULL;
}

/* The earlier attempt on the same file (device and inode), or NULL. */
static const bp_reg_record *same_file(const bp_registry *r, dev_t dev, ino_t ino) {
  for (int i = 0; i < r->records.count; i++) {
    const bp_reg_record *rec = r->records.items[i];
    if (rec->has_id && rec->dev == dev && rec->ino == ino && rec->pub.outcome != BP_LOAD_SKIPPED)
      return rec;
  }
  return NULL;
}

/* Runs init with staging on; commits or discards. `rec` gets the outcome;
 * the module is kept (pushed to r->modules) only when it loaded. */
static bp_status init_and_commit(bp_registry *r, bp_reg_record *rec, bp_reg_module *m) {
  bp_stage_begin(r, m->path);
  int rc;
  if (m->desc.init_ctx) { /* 1.6: a context per registry, this one's */
    void *ctx = NULL;
    rc = m->desc.init_ctx(&r->host, &ctx);
    if (rc == BP_ABI_OK) m->has_ctx = 1, m->ctx = ctx; /* ignored on failure */
  } else {
    rc = m->desc.init(&r->host);
  }
  r->stage.active = 0; /* later calls through the host table are refused */
  bp_status st = BP_OK;
  if (r->stage.failed) {
    rec->pub.stage = BP_LOAD_STAGE_REGISTER;
    st = BP_ERR_INVALID;
    bp_record_set_message(rec, "%s", r->stage.reason);
  } else if (rc != BP_ABI_OK) {
    rec->pub.stage = BP_LOAD_STAGE_INIT;
    st = BP_ERR_INVALID;
    bp_record_set_message(rec, "init failed with status %d: %s", rc,
                          r->stage.init_error[0] ? r->stage.init_error : "(no reason given)");
  } else if (bp_stage_commit(r, m) != BP_OK) {
    rec->pub.stage = BP_LOAD_STAGE_REGISTER;
    st = BP_ERR_NOMEM;
    bp_record_set_message(rec, "out of memory registering the module's items");
  }
  bp_stage_end(r);
  if (st != BP_OK) {
    /* init ran, so the module may hold resources: fini (or fini_ctx after a
     * successful init_ctx; none after a failed one) before unloading */
    module_finish(m);
    rec->pub.outcome = BP_LOAD_REFUSED;
    rec->status = st;
    return st;
  }
  r->modules.items[r->modules.count++] = m; /* capacity reserved by the caller */
  rec->pub.outcome = BP_LOAD_LOADED;
  rec->pub.stage = BP_LOAD_STAGE_DONE;
  rec->status = BP_OK;
  return BP_OK;
}

bp_status bp_registry_load(bp_registry *r, const char *path) {
  if (!r || !path) return bp_fail(BP_ERR_INVALID, "bp_registry_load: NULL argument");
  if (r->stage.active)
    return bp_fail(BP_ERR_STATE, "bp_registry_load(%s) called while a module's init runs", path);
  if (bp_ptr_list_reserve(&r->records, 1) != 0 || bp_ptr_list_reserve(&r->modules, 1) != 0)
    return bp_fail(BP_ERR_NOMEM, "out of memory loading %s", path);

  char *real = realpath(path, NULL);
  if (!real)
    return bp_registry_note(r, path, BP_LOAD_REFUSED, BP_ERR_IO, "%s", strerror(errno));
  bp_reg_record *rec = bp_record_new(real);
  if (!rec) {
    free(real);
    return bp_fail(BP_ERR_NOMEM, "out of memory loading %s", path);
  }
  struct stat sb;
  if (stat(real, &sb) != 0) {
    rec->status = BP_ERR_IO;
    bp_record_set_message(rec, "%s", strerror(errno));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    rec->status = BP_ERR_IO;
    bp_record_set_message(rec, "not a regular file");
    goto done;
  }
  rec->dev = sb.st_dev;
  rec->ino = sb.st_ino;
  rec->has_id = 1;
  const bp_reg_record *earlier = same_file(r, sb.st_dev, sb.st_ino);
  if (earlier) {
    rec->has_id = 0; /* the earlier record stays the file's identity */
    rec->pub.outcome = BP_LOAD_SKIPPED;
    rec->pub.stage = earlier->pub.stage;
    rec->status = earlier->status;
    bp_record_set_message(rec, "same file as %s, already %s%s%s", earlier->pub.path,
                          bp_load_outcome_name(earlier->pub.outcome),
                          earlier->status != BP_OK ? ": " : "",
                          earlier->status != BP_OK ? earlier->pub.message : "");
    goto done;
  }

  void *handle = NULL;
  bp_abi_module desc;
  if (bp_loader_open(real, rec, &handle, &desc) != BP_OK) goto done;
  bp_reg_module *m = calloc(1, sizeof *m);
  char *build_id = bp_strdup(desc.build_id ? desc.build_id : "");
  char *mpath = bp_strdup(real);
  if (!m || !build_id || !mpath) {
    free(m);
    free(build_id);
    free(mpath);
    dlclose(handle);
    rec->pub.stage = BP_LOAD_STAGE_INIT;
    rec->status = BP_ERR_NOMEM;
    bp_record_set_message(rec, "out of memory");
    goto done;
  }
  m->handle = handle;
  m->path = mpath;
  m->desc = desc;
  m->build_id = build_id;
  if (init_and_commit(r, rec, m) != BP_OK) {
    dlclose(m->handle);
    free(m->path);
    free(m->build_id);
    free(m);
  }

done:
  free(real);
  bp_status st = rec->status;
  if (st == BP_OK) {
    record_publish(r, rec);
    return BP_OK;
  }
  if (rec->pub.outcome != BP_LOAD_SKIPPED) rec->pub.outcome = BP_LOAD_REFUSED;
  record_publish(r, rec);
  return bp_fail(st, "%s: %s at stage %s: %s", rec->pub.path,
                 bp_load_outcome_name(rec->pub.outcome), bp_load_stage_name(rec->pub.stage),
                 rec->pub.message);
}

const char *bp_load_stage_name(bp_load_stage stage) {
  switch (stage) {
  case BP_LOAD_STAGE_OPEN: return "open";
  case BP_LOAD_STAGE_SYMBOL: return "symbol";
  case BP_LOAD_STAGE_VERSION: return "version";
  case BP_LOAD_STAGE_INIT: return "init";
  case BP_LOAD_STAGE_REGISTER: return "register";
  case BP_LOAD_STAGE_DONE: return "done";
  }
  return "?";
}

const char *bp_load_outcome_name(bp_load_outcome outcome) {
  switch (outcome) {
  case BP_LOAD_LOADED: return "loaded";
  case BP_LOAD_SKIPPED: return "skipped";
  case BP_LOAD_REFUSED: return "refused";
  }
  return "?";
}

/* ---- accessors ------------------------------------------------------------ */

#define BP_LIST_AT(list, index) \
  ((index) >= 0 && (index) < (list).count ? (list).items[(index)] : NULL)

int bp_registry_record_count(const bp_registry *r) { return r ? r->records.count : 0; }
const bp_load_record *bp_registry_record(const bp_registry *r, int index) {
  const bp_reg_record *rec = r ? BP_LIST_AT(r->records, index) : NULL;
  return rec ? &rec->pub : NULL;
}
int bp_registry_kernel_count(const bp_registry *r) { return r ? r->kernels.count : 0; }
const bp_registered_kernel *bp_registry_kernel(const bp_registry *r, int index) {
  return r ? BP_LIST_AT(r->kernels, index) : NULL;
}
int bp_registry_op_count(const bp_registry *r) { return r ? r->ops.count : 0; }
const bp_abi_op *bp_registry_op(const bp_registry *r, int index) {
  const bp_reg_op *op = r ? BP_LIST_AT(r->ops, index) : NULL;
  return op ? &op->op : NULL;
}
const char *bp_registry_op_path(const bp_registry *r, int index) {
  const bp_reg_op *op = r ? BP_LIST_AT(r->ops, index) : NULL;
  return op ? op->path : NULL;
}
const bp_abi_op *bp_registry_find_op(const bp_registry *r, const char *name) {
  if (!r || !name) return NULL;
  for (int i = 0; i < r->ops.count; i++) {
    const bp_reg_op *op = r->ops.items[i];
    if (strcmp(op->op.name, name) == 0) return &op->op;
  }
  return NULL;
}
int bp_registry_device_count(const bp_registry *r) { return r ? r->devices.count : 0; }
const bp_abi_device *bp_registry_device(const bp_registry *r, int index) {
  const bp_reg_device *d = r ? BP_LIST_AT(r->devices, index) : NULL;
  return d ? &d->device : NULL;
}
int bp_registry_device_transport(const bp_abi_device *d, int index, bp_abi_comm_transport *out) {
  if (!d || !out || index < 0 || index >= d->num_transports || !d->transports) return 0;
  const size_t stride = d->transports->struct_size; /* the first element's (bp_abi_ops.h rule 6) */
  bp_abi_copy(out, sizeof *out, (const char *)d->transports + (size_t)index * stride);
  return 1;
}

const char *bp_registry_device_path(const bp_registry *r, int index) {
  const bp_reg_device *d = r ? BP_LIST_AT(r->devices, index) : NULL;
  return d ? d->path : NULL;
}
const bp_abi_device *bp_registry_find_device(const bp_registry *r, const char *kind) {
  if (!r || !kind) return NULL;
  for (int i = 0; i < r->devices.count; i++) {
    const bp_reg_device *d = r->devices.items[i];
    if (strcmp(d->device.kind, kind) == 0) return &d->device;
  }
  return NULL;
}
int bp_registry_layer_count(const bp_registry *r) { return r ? r->layers.count : 0; }
const bp_registered_layer *bp_registry_layer(const bp_registry *r, int index) {
  return r ? BP_LIST_AT(r->layers, index) : NULL;
}
const bp_registered_layer *bp_registry_find_layer(const bp_registry *r, const char *type) {
  if (!r || !type) return NULL;
  for (int i = 0; i < r->layers.count; i++) {
    const bp_registered_layer *l = r->layers.items[i];
    if (strcmp(l->layer.type, type) == 0) return l;
  }
  return NULL;
}
int bp_registry_search_dir_count(const bp_registry *r) { return r ? r->dirs.count : 0; }
const bp_search_dir *bp_registry_search_dir(const bp_registry *r, int index) {
  return r ? BP_LIST_AT(r->dirs, index) : NULL;
}

int bp_registry_candidates(const bp_registry *r, const char *op, const char *device,
                           const bp_registered_kernel **out, int cap) {
  int n = 0;
  for (int i = 0; i < r->kernels.count; i++) {
    const bp_registered_kernel *k = r->kernels.items[i];
    if (strcmp(k->kernel.op, op) != 0 || strcmp(k->kernel.device, device) != 0) continue;
    if (n < cap) out[n] = k;
    n++;
  }
  return n;
}
