/* Loader: one module file, from dlopen up to a descriptor the host can
 * trust (docs/architecture.md, "ABI and discovery"), and the record of the
 * attempt. Registration and init are the registry's. */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elf-check-impl.h"
#include "blueprint/infile.h"
#include "loader-impl.h"
#include "strutil-impl.h"

/* The "" of record fields that have no value; never freed. */
static const char no_text[] = "";

static void free_text(const char *s) {
  if (s && s != no_text) free((char *)s);
}

bp_reg_record *bp_record_new(const char *path) {
  bp_reg_record *rec = calloc(1, sizeof *rec);
  if (!rec) return NULL;
  rec->pub.path = bp_strdup(path);
  if (!rec->pub.path) {
    free(rec);
    return NULL;
  }
  rec->pub.outcome = BP_LOAD_REFUSED;
  rec->pub.stage = BP_LOAD_STAGE_OPEN;
  rec->pub.abi_major = rec->pub.abi_minor_built = rec->pub.abi_minor_required = -1;
  rec->pub.host_abi_major = BP_ABI_MAJOR;
  rec->pub.host_abi_minor = BP_ABI_MINOR;
  rec->status = BP_OK;
  return rec;
}

void bp_record_free(bp_reg_record *rec) {
  if (!rec) return;
  free_text(rec->pub.path);
  free_text(rec->pub.message);
  free_text(rec->pub.name);
  free_text(rec->pub.version);
  free_text(rec->pub.build_id);
  free(rec);
}

int bp_record_set_message(bp_reg_record *rec, const char *fmt, ...) {
  char msg[BP_REASON_MAX * 2];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *copy = bp_strdup(msg);
  if (!copy) return -1;
  free_text(rec->pub.message);
  rec->pub.message = copy;
  return 0;
}

void bp_record_fill_empty(bp_reg_record *rec) {
  if (!rec->pub.message) rec->pub.message = no_text;
  if (!rec->pub.name) rec->pub.name = no_text;
  if (!rec->pub.version) rec->pub.version = no_text;
  if (!rec->pub.build_id) rec->pub.build_id = no_text;
}

uint32_t bp_abi_copy(void *dst, size_t dst_size, const void *src) {
  uint32_t size;
  memcpy(&size, src, sizeof size); /* struct_size heads every ABI struct */
  memset(dst, 0, dst_size);
  memcpy(dst, src, size < dst_size ? size : dst_size);
  return size;
}

/* Refuses at `stage`: records the message, closes the handle. */
static bp_status refuse(bp_reg_record *rec, void *handle, bp_load_stage stage, bp_status status,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bp_status refuse(bp_reg_record *rec, void *handle, bp_load_stage stage, bp_status status,
                        const char *fmt, ...) {
  char msg[BP_REASON_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rec->pub.outcome = BP_LOAD_REFUSED;
  rec->pub.stage = stage;
  rec->status = status;
  bp_record_set_message(rec, "%s", msg);
  if (handle) dlclose(handle);
  return status;
}

/* A module of another major exports bp_abi_module_entry_v<major>; finding
 * one turns "no entry symbol" into a version refusal that names it. */
static int other_major(void *handle) {
  for (int major = 0; major < 32; major++) {
    if (major == BP_ABI_MAJOR) continue;
    char name[64];
    snprintf(name, sizeof name, "bp_abi_module_entry_v%d", major);
    if (dlsym(handle, name)) return major;
  }
  return -1;
}

/* The pre-check before dlopen (elf-check-impl.h): a regular file
 * (bp_input_open: a FIFO is refused instead of waited on) whose ELF
 * headers hold up against its size. */
static bp_status check_file(const char *path, bp_reg_record *rec) {
  char why[BP_REASON_MAX - 64];
  uint64_t size = 0;
  const int fd = bp_input_open(path, 0, &size, why, sizeof why);
  /* not a regular file: EISDIR or EINVAL (infile.h); else open's own errno */
  if (fd < 0 && errno != EISDIR && errno != EINVAL)
    return refuse(rec, NULL, BP_LOAD_STAGE_OPEN, BP_ERR_IO, "cannot open: %s", why);
  const int bad = fd < 0 || bp_elf_check_fd(fd, size, why, sizeof why) != 0;
  if (fd >= 0) close(fd);
  if (bad)
    return refuse(rec, NULL, BP_LOAD_STAGE_OPEN, BP_ERR_IO, /* as dlopen's refusals */
                  "not a loadable module (checked before dlopen): %s", why);
  return BP_OK;
}

bp_status bp_loader_open(const char *path, bp_reg_record *rec, void **handle_out,
                         bp_abi_module *desc_out) {
  if (check_file(path, rec) != BP_OK) return rec->status;
  dlerror(); /* clear a stale message */
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *err = dlerror();
    return refuse(rec, NULL, BP_LOAD_STAGE_OPEN, BP_ERR_IO, "%s", err ? err : "dlopen failed");
  }

  dlerror();
  void *sym = dlsym(handle, BP_ABI_ENTRY_SYMBOL);
  if (!sym) {
    const char *err = dlerror();
    char why[BP_REASON_MAX];
    snprintf(why, sizeof why, "%s", err ? err : "entry symbol is NULL");
    int major = other_major(handle);
    if (major >= 0) {
      rec->pub.abi_major = major;
      return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_UNSUPPORTED,
                    "module is built for ABI major %d (it exports bp_abi_module_entry_v%d); this "
                    "host has ABI %d.%d and loads only major %d",
                    major, major, BP_ABI_MAJOR, BP_ABI_MINOR, BP_ABI_MAJOR);
    }
    return refuse(rec, handle, BP_LOAD_STAGE_SYMBOL, BP_ERR_INVALID,
                  "not a blueprint module: %s", why);
  }
  bp_abi_module_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry); /* POSIX: dlsym's object pointer is the function */
  const bp_abi_module *desc = entry();
  if (!desc)
    return refuse(rec, handle, BP_LOAD_STAGE_SYMBOL, BP_ERR_INVALID,
                  "%s returned NULL instead of a module descriptor", BP_ABI_ENTRY_SYMBOL);

  /* Versions first: a module of another minor may have another size. */
  uint32_t size;
  memcpy(&size, desc, sizeof size);
  if (size < BP_ABI_END(bp_abi_module, abi_minor_required) || size > BP_ABI_STRUCT_MAX)
    return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_INVALID,
                  "module descriptor has struct_size %u, outside %zu..%u bytes", size,
                  BP_ABI_END(bp_abi_module, abi_minor_required), BP_ABI_STRUCT_MAX);
  bp_abi_module d;
  bp_abi_copy(&d, sizeof d, desc);
  rec->pub.abi_major = d.abi_major;
  rec->pub.abi_minor_built = d.abi_minor_built;
  rec->pub.abi_minor_required = d.abi_minor_required;
  if (d.abi_major != BP_ABI_MAJOR)
    return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_UNSUPPORTED,
                  "module is built for ABI %u.%u; this host has ABI %d.%d and loads only major %d",
                  d.abi_major, d.abi_minor_built, BP_ABI_MAJOR, BP_ABI_MINOR, BP_ABI_MAJOR);
  if (d.abi_minor_required > BP_ABI_MINOR)
    return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_UNSUPPORTED,
                  "module requires ABI %u.%u or newer (built with %u.%u); this host has ABI %d.%d",
                  d.abi_major, d.abi_minor_required, d.abi_major, d.abi_minor_built,
                  BP_ABI_MAJOR, BP_ABI_MINOR);
  if (d.abi_minor_required > d.abi_minor_built)
    return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_INVALID,
                  "module requires ABI %u.%u but was built with the older %u.%u",
                  d.abi_major, d.abi_minor_required, d.abi_major, d.abi_minor_built);
  if (size < BP_ABI_END(bp_abi_module, init))
    return refuse(rec, handle, BP_LOAD_STAGE_VERSION, BP_ERR_INVALID,
                  "module descriptor has struct_size %u; ABI %d.0 needs at least %zu (up to init)",
                  size, BP_ABI_MAJOR, BP_ABI_END(bp_abi_module, init));

  /* Names are copied now: a refused module's strings vanish at dlclose. */
  free((char *)rec->pub.name);
  free((char *)rec->pub.version);
  free((char *)rec->pub.build_id);
  rec->pub.name = bp_strdup(d.name ? d.name : "");
  rec->pub.version = bp_strdup(d.version ? d.version : "");
  rec->pub.build_id = bp_strdup(d.build_id ? d.build_id : "");
  if (!rec->pub.name || !rec->pub.version || !rec->pub.build_id)
    return refuse(rec, handle, BP_LOAD_STAGE_SYMBOL, BP_ERR_NOMEM, "out of memory");
  if (!d.name || !d.name[0])
    return refuse(rec, handle, BP_LOAD_STAGE_SYMBOL, BP_ERR_INVALID, "module has no name");
  /* init_ctx (1.6) and fini_ctx read as NULL from a shorter descriptor */
  if (!d.init && !d.init_ctx)
    return refuse(rec, handle, BP_LOAD_STAGE_SYMBOL, BP_ERR_INVALID,
                  "module '%s' has no init function (neither init nor init_ctx)", d.name);

  *handle_out = handle;
  *desc_out = d;
  return BP_OK;
}
