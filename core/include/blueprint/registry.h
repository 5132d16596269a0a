/* Registry of op modules and device plugins loaded through the ABI (abi/),
 * and kernel selection for graph nodes.
 *
 * Discovery order (bp_registry_discover): explicit paths, then the
 * directories of BP_PLUGIN_PATH (colon-separated, read with secure_getenv),
 * then the install directory (<prefix>/lib/blueprint/modules), then the
 * directory "blueprint/modules" beside libblueprint.so. Never the current
 * directory; relative entries are refused. Every file ending in ".so" in a
 * directory is a candidate, in name order; an explicit path or a
 * BP_PLUGIN_PATH entry may also name one module file. dlopen(RTLD_NOW | RTLD_LOCAL).
 *
 * Messages modules log through the host go to stderr: errors and warnings,
 * and info / debug ones too when BP_LOG=info / BP_LOG=debug.
 *
 * Threads: loading (create, load, discover, destroy) is single-threaded.
 * Once loading is done, bp_registry_select may run on several threads at
 * once (the autotune cache has its own lock). */
#ifndef BLUEPRINT_REGISTRY_H
#define BLUEPRINT_REGISTRY_H

#include <stdint.h>

#include "blueprint/status.h"
#include "bp_abi.h"
#include "bp_abi_device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_registry bp_registry; /* opaque */

/* Where a load stopped. */
typedef enum bp_load_stage {
  BP_LOAD_STAGE_OPEN = 0, /* dlopen */
  BP_LOAD_STAGE_SYMBOL,   /* dlsym of the entry */
  BP_LOAD_STAGE_VERSION,  /* ABI major/minor checks */
  BP_LOAD_STAGE_INIT,     /* the module's init */
  BP_LOAD_STAGE_REGISTER, /* a registration was refused */
  BP_LOAD_STAGE_DONE,     /* loaded */
} bp_load_stage;

typedef enum bp_load_outcome {
  BP_LOAD_LOADED = 0,
  BP_LOAD_SKIPPED, /* e.g. the same file again, or not a candidate */
  BP_LOAD_REFUSED,
} bp_load_outcome;

/* One load attempt, kept for `blueprint plugins`. Strings are owned by the
 * registry. */
typedef struct bp_load_record {
  const char *path;       /* resolved path */
  bp_load_outcome outcome;
  bp_load_stage stage;
  const char *message;    /* dlerror() text or the reason; "" when loaded */
  const char *name;       /* module name ("" before SYMBOL) */
  const char *version;    /* module version ("") */
  const char *build_id;   /* module build id ("") */
  int abi_major, abi_minor_built, abi_minor_required; /* the module's (-1 unknown) */
  int host_abi_major, host_abi_minor;
} bp_load_record;

/* A registered kernel and the file it came from. */
typedef struct bp_registered_kernel {
  bp_abi_kernel kernel; /* copied, missing fields zeroed */
  const char *path;     /* module file ("<builtin>" for host kernels) */
  const char *build_id;
  int load_index;       /* order of registration; ties break by it */
} bp_registered_kernel;

bp_status bp_registry_create(bp_registry **registry_out);
void bp_registry_destroy(bp_registry *registry); /* calls fini, dlcloses; NULL ok */

/* Loads one module file. A refused module is recorded and returns an error
 * status with the reason; the registry is unchanged. The same file twice is
 * a no-op (recorded as skipped). */
bp_status bp_registry_load(bp_registry *registry, const char *path);
/* Loads the explicit paths (files or directories), then the discovery order
 * above. Refused modules do not stop discovery; returns the first explicit
 * path's error, else BP_OK. */
bp_status bp_registry_discover(bp_registry *registry, const char *const *paths, int path_count);

int bp_registry_record_count(const bp_registry *registry);
const bp_load_record *bp_registry_record(const bp_registry *registry, int index);
int bp_registry_kernel_count(const bp_registry *registry);
const bp_registered_kernel *bp_registry_kernel(const bp_registry *registry, int index);
int bp_registry_op_count(const bp_registry *registry);
const bp_abi_op *bp_registry_op(const bp_registry *registry, int index);
const bp_abi_op *bp_registry_find_op(const bp_registry *registry, const char *name);
int bp_registry_device_count(const bp_registry *registry);
const bp_abi_device *bp_registry_device(const bp_registry *registry, int index);
const bp_abi_device *bp_registry_find_device(const bp_registry *registry, const char *kind);
/* The file that registered op / device `index` ("<builtin>" for the host's
 * own ops). Owned by the registry. */
const char *bp_registry_op_path(const bp_registry *registry, int index);
const char *bp_registry_device_path(const bp_registry *registry, int index);

/* "open", "symbol", ... and "loaded", "skipped", "refused". */
const char *bp_load_stage_name(bp_load_stage stage);
const char *bp_load_outcome_name(bp_load_outcome outcome);

/* A directory bp_registry_discover looked in, in search order. */
typedef struct bp_search_dir {
  const char *path;   /* as searched (absolute) */
  const char *source; /* "explicit", "BP_PLUGIN_PATH", "install", "library" */
  int exists;         /* 1 if it was a readable directory */
} bp_search_dir;
int bp_registry_search_dir_count(const bp_registry *registry);
const bp_search_dir *bp_registry_search_dir(const bp_registry *registry, int index);

/* Selection policy for one node. */
typedef struct bp_select_options {
  /* Pins: "op_glob=impl[,op_glob=impl...]", e.g. "conv2d.fwd=xnnpack,gemm.*=blas".
   * NULL: read BP_KERNELS from the environment. The first matching pin wins;
   * a pinned kernel that does not support the node is an error. */
  const char *pins;
  int autotune;               /* time every supporting kernel, keep the winner */
  const char *autotune_cache; /* cache file path (NULL: no cache) */
  /* (optional) receives one line per candidate saying why it was or was not
   * picked, NUL-terminated and truncated to report_size. */
  char *report;
  size_t report_size;
} bp_select_options;

/* Picks the kernel for `op` on `device` with these args: pins -> kernels
 * whose supports() holds -> autotuned winner -> highest priority -> load
 * order. REFERENCE kernels only when nothing else supports the node. No
 * kernel: BP_ERR_UNSUPPORTED naming the op, the shapes and every
 * candidate's reason.
 *
 * A pin's glob is matched (fnmatch) against the op name, or against
 * "op@device" when it contains '@' ("conv2d.fwd@cuda=cudnn"). args may hold
 * fewer tensors than the op declares (optional trailing ones such as a
 * bias, per abi/bp_abi_ops.h), never more. Every dtype of args' inputs and
 * outputs must be in a kernel's dtype mask. With autotune,
 * args must carry the node's real pointers: every supporting kernel runs
 * on them (outputs, and input 0 of IN_PLACE kernels, are overwritten), timed
 * with the device's events when a device plugin of that kind is
 * registered, else with CLOCK_MONOTONIC. The cache file is text, one line
 * "signature impl build_id" per node signature; a line whose build id is
 * not the loaded module's is tuned again. *kernel_out is borrowed from the
 * registry. */
bp_status bp_registry_select(bp_registry *registry, const char *op, const char *device,
                             const bp_abi_kernel_args *args, const bp_select_options *options,
                             const bp_registered_kernel **kernel_out);

/* The kernel picked for `op` on `device` when every kernel supports the
 * node and nothing is pinned or tuned: the highest priority non-REFERENCE
 * kernel, then load order; a REFERENCE kernel only when there is no other.
 * NULL when no kernel serves the op on that device. */
const bp_registered_kernel *bp_registry_default_kernel(const bp_registry *registry,
                                                       const char *op, const char *device);

#ifdef __cplusplus
}
#endif
#endif
