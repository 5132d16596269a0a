/* Internals shared by the registry (registry.c), staged registration
 * (registry_stage.c), discovery (discover.c), the built-in op table
 * (op_table.c) and selection (select.c, pins.c). It builds on loader-impl.h (one module file and its load
 * record) and strutil-impl.h (string and list helpers), which include
 * nothing of the registry. Not installed.
 *
 * Invariants (checked where they can break):
 *  1. Everything the registry hands out (ops, kernels, devices, records,
 *     search dirs) is individually allocated and stays at its address until
 *     bp_registry_destroy.
 *  2. A module's items reach the public lists only through bp_stage_commit,
 *     which cannot fail once it starts (capacity is reserved first).
 *  3. Every kernel's op exists in the op list; no two kernels share
 *     (op, impl, device); no two ops share a name; no two devices a kind;
 *     every layer type's ops exist, and no two layer types (nor a layer
 *     type and a built-in one) share a name.
 *  4. Strings inside copied ABI structs point into a module that stays
 *     loaded until destroy; strings in records are the registry's copies. */
#ifndef BLUEPRINT_REGISTRY_IMPL_H
#define BLUEPRINT_REGISTRY_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "blueprint/registry.h"
#include "loader-impl.h"
#include "strutil-impl.h"
#include "bp_abi_sdk.h"

/* Path shown for what the host registers itself. */
#define BP_BUILTIN_PATH "<builtin>"

/* Aborts with file and line when an internal invariant breaks (STYLE.md 5). */

/* An op and the file that registered it. `op` comes first, so a
 * bp_reg_op * is a valid const bp_abi_op *. */
typedef struct bp_reg_op {
  bp_abi_op op;
  const char *path; /* the module's path string, or BP_BUILTIN_PATH */
} bp_reg_op;

typedef struct bp_reg_device {
  bp_abi_device device;
  const char *path;
} bp_reg_device;

/* A module that passed init and stays loaded until destroy. */
typedef struct bp_reg_module {
  void *handle;         /* dlopen handle */
  char *path;           /* resolved path, owned */
  bp_abi_module desc;   /* copied descriptor, missing fields zeroed */
  char *build_id;       /* owned copy ("" when the module gave none) */
  /* 1 when desc.init_ctx ran and returned BP_ABI_OK: the module is then
   * finished with desc.fini_ctx(ctx) (when set), never with desc.fini */
  int has_ctx;
  void *ctx;            /* what init_ctx stored (the module's, opaque) */
} bp_reg_module;

/* Registrations of the module whose init is running. */
typedef struct bp_stage {
  int active;               /* 1 only while a module's init runs */
  const char *path;         /* that module's path (borrowed) */
  bp_ptr_list ops;          /* bp_reg_op *, owned until commit */
  bp_ptr_list kernels;      /* bp_registered_kernel *, owned until commit */
  bp_ptr_list devices;      /* bp_reg_device *, owned until commit */
  bp_ptr_list layers;       /* bp_registered_layer * (one allocation each), owned until commit */
  int failed;               /* a registration was refused */
  char reason[BP_REASON_MAX];     /* the first refusal */
  char init_error[BP_REASON_MAX]; /* the last host->error() text */
} bp_stage;

struct bp_registry {
  bp_abi_host host;      /* lent to every module's init; ctx is the registry */
  bp_stage stage;
  bp_ptr_list modules;   /* bp_reg_module *, load order */
  bp_ptr_list records;   /* bp_reg_record *, attempt order */
  bp_ptr_list ops;       /* bp_reg_op *, built-ins first */
  bp_ptr_list kernels;   /* bp_registered_kernel *, registration order */
  bp_ptr_list devices;   /* bp_reg_device * */
  bp_ptr_list layers;    /* bp_registered_layer * (one allocation each, attrs inside) */
  bp_ptr_list dirs;      /* bp_search_dir *, with owned path strings */
  int next_load_index;
  const char *loading_source; /* bp_registry_discover's current source (a literal), for
                                 records; NULL outside discovery */
  bp_select_tuner tuner; /* bp_registry_set_tuner; pick NULL when none */
  bp_select_checker checker; /* bp_registry_set_checker; pinned NULL when none */
  char *search_path;     /* bp_registry_options, owned copies (NULL: none) */
  char *pins;
  int log_level;
  char **module_options; /* owned "name=value" copies */
  int module_option_count;
};

/* ---- registry.c ------------------------------------------------------------ */

/* Appends a record of a skipped or refused candidate that never reached
 * dlopen (a relative directory, an unreadable path). */
bp_status bp_registry_note(bp_registry *r, const char *path, bp_load_outcome outcome,
                           bp_status status, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* 1 when `name` may name an op, an implementation or a device:
 * 1..63 bytes of [A-Za-z0-9_.+-], beginning with a letter or digit. Such
 * names never contain the separators of pins or of the autotune cache. */
int bp_registry_name_valid(const char *name);

/* Kernels for `op` on `device`, in registration order; returns the count
 * (at most `cap` written). */
int bp_registry_candidates(const bp_registry *r, const char *op, const char *device,
                           const bp_registered_kernel **out, int cap);

/* ---- pins.c ------------------------------------------------------------------ */

/* Longest pin entry ("glob=impl") accepted. */
#define BP_PIN_MAX 256
/* Looks `op` on `device` up in `pins` ("glob=impl,..."). Returns 1 and
 * copies the first matching entry's impl (64 bytes) and text (BP_PIN_MAX),
 * 0 when none matches, -1 with a message in err when an entry is
 * malformed. */
int bp_pins_find(const char *pins, const char *op, const char *device, char *impl, char *text,
                 char *err, size_t err_size);

/* ---- registry_stage.c ---------------------------------------------------- */

/* Fills r->host with the staged registration services. */
void bp_stage_host_init(bp_registry *r);
/* Starts staging for the module at `path` (borrowed until end). */
void bp_stage_begin(bp_registry *r, const char *path);
/* Moves every staged item into the registry. BP_ERR_NOMEM leaves the
 * registry unchanged (the caller discards). */
bp_status bp_stage_commit(bp_registry *r, const bp_reg_module *module);
/* Frees whatever is still staged and ends staging. */
void bp_stage_end(bp_registry *r);

#endif
