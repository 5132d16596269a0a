/* Registry of op modules and device plugins loaded through the ABI (abi/),
 * and kernel selection for graph nodes.
 *
 * Discovery order (bp_registry_discover): explicit paths, then the
 * directories of the registry's search path (bp_registry_options; the CLI
 * passes BP_PLUGIN_PATH), then the install directory (<prefix>/lib/blueprint/modules), then the
 * directory "blueprint/modules" beside libblueprint.so. Never the current
 * directory; relative entries are refused. Every file ending in ".so" in a
 * directory is a candidate, in name order; an explicit path or a
 * search-path entry may also name one module file. dlopen(RTLD_NOW | RTLD_LOCAL).
 *
 * Messages modules log through the host go to stderr, up to the registry's
 * log level (bp_registry_options; errors and warnings by default).
 *
 * The library reads no environment variable: the caller passes what it
 * wants here (docs/environment.md lists what the CLI reads).
 *
 * Threads: loading (create, load, discover, destroy) is single-threaded.
 * Once loading is done, bp_registry_select may run on several threads at
 * once (a tuner keeps its own lock: bp_select_tuner). */
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
  const char *source;     /* where discovery found it: "explicit", "BP_PLUGIN_PATH",
                             "install", "library" (bp_search_dir); "" from bp_registry_load */
} bp_load_record;

/* A registered kernel and the file it came from. */
typedef struct bp_registered_kernel {
  bp_abi_kernel kernel; /* copied, missing fields zeroed */
  const char *path;     /* module file ("<builtin>" for host kernels) */
  const char *build_id;
  int load_index;       /* order of registration; ties break by it */
} bp_registered_kernel;

/* A layer type a module registered (bp_abi_layer), with the ops it runs. */
typedef struct bp_registered_layer {
  bp_abi_layer layer;             /* copied, missing fields zeroed; layer.attrs is `attrs` */
  const bp_abi_layer_attr *attrs; /* [layer.num_attrs] copies, missing fields zeroed */
  const bp_abi_op *forward;       /* the op layer.forward_op names */
  const bp_abi_op *backward;      /* the op layer.backward_op names, or NULL */
  const char *path;               /* the module file that registered it */
  const bp_abi_layer_saved *saved; /* [layer.num_saved] copies (layer.saved is this), or NULL */
} bp_registered_layer;

/* What a registry is created with. Zeroed and then bp_registry_options_init
 * gives the defaults; strings are copied at create. */
typedef struct bp_registry_options {
  uint32_t struct_size;    /* sizeof(bp_registry_options) */
  const char *search_path; /* colon-separated module directories (or files) searched after
                              discovery's explicit paths; only absolute entries are
                              searched, empty and relative ones are recorded as skipped.
                              Records name it "BP_PLUGIN_PATH". NULL (default): none */
  int log_level;           /* the most verbose module message printed: BP_ABI_LOG_WARN
                              (default), BP_ABI_LOG_INFO or BP_ABI_LOG_DEBUG */
  const char *pins;        /* default pins: below a call's own, above a model file's
                              (bp_registry_resolve_pins); NULL (default): none */
  const char *const *module_options; /* "name=value" strings modules read at init through
                                        bp_abi_host.option (ABI 1.6; the names are
                                        docs/environment.md's); the first of a name wins */
  int module_option_count;
} bp_registry_options;

void bp_registry_options_init(bp_registry_options *options);
/* A registry with the built-in ops and `options` (NULL: the defaults).
 * BP_ERR_INVALID for a log level outside BP_ABI_LOG_ERROR..BP_ABI_LOG_DEBUG,
 * or a module option that is not "name=value" with a non-empty name. */
bp_status bp_registry_create_with(const bp_registry_options *options,
                                  bp_registry **registry_out);
/* bp_registry_create_with(NULL, registry_out). */
bp_status bp_registry_create(bp_registry **registry_out);
/* Changes the log level of bp_registry_options for messages from now on
 * (loading is single-threaded: not while kernels may log).
 * BP_ERR_INVALID for a level outside BP_ABI_LOG_ERROR..BP_ABI_LOG_DEBUG. */
bp_status bp_registry_set_log_level(bp_registry *registry, int level);
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
/* Collective transport `index` of a registered device (ABI 1.6,
 * bp_abi_device.h) in *out, read up to the plugin's struct_size (fields it
 * lacks read as 0): 1, or 0 when out of range. The registry checked every
 * transport when the device registered. */
int bp_registry_device_transport(const bp_abi_device *device, int index,
                                 bp_abi_comm_transport *out);
/* The file that registered op / device `index` ("<builtin>" for the host's
 * own ops). Owned by the registry. */
const char *bp_registry_op_path(const bp_registry *registry, int index);
const char *bp_registry_device_path(const bp_registry *registry, int index);
/* Layer types modules registered, in registration order; borrowed, valid
 * until bp_registry_destroy. find: by YAML type name, NULL if none. */
int bp_registry_layer_count(const bp_registry *registry);
const bp_registered_layer *bp_registry_layer(const bp_registry *registry, int index);
const bp_registered_layer *bp_registry_find_layer(const bp_registry *registry, const char *type);

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

/* Kernel pins: "op_glob=impl[,op_glob=impl...]", e.g.
 * "conv2d.fwd=xnnpack,fc.*=blas", at most 32 entries.
 *
 * Precedence, decided only by bp_registry_resolve_pins: the caller's option
 * (the `--kernels` option, bp_train_options.kernels, bp_exec_options.pins,
 * bp_select_options.pins; "" means no pins) > the registry's default pins
 * (bp_registry_options.pins; the CLI passes BP_KERNELS) > the model file's
 * `train: kernels:`. The first source present
 * is used whole; lists are never merged.
 *
 * Meaning: for each node the first pin whose glob matches wins (fnmatch on
 * the op name, or on "op@device" when the glob holds '@'). A pinned kernel
 * that does not support the node is an error, as is a matching pin whose
 * impl the op lacks on that device.
 *
 * Checks (bp_registry_check_pins, against every registered kernel of
 * every device), never silently ignored:
 *  - a malformed entry: error (BP_ERR_INVALID);
 *  - a glob that matches no op that has a kernel: error (BP_ERR_INVALID);
 *  - an impl that no kernel of the matched ops has: error
 *    (BP_ERR_UNSUPPORTED, naming the impls there are);
 *  - a pin that never applies, because earlier pins with another impl
 *    match every kernel it matches: a warning naming both pins. A later,
 *    broader pin that still applies somewhere ("fc.fwd=blas,fc.*=reference")
 *    is the intended use of "first match wins" and is not warned about. */
typedef enum bp_pin_source {
  BP_PINS_NONE = 0, /* no pins anywhere */
  BP_PINS_OPTION,   /* the caller's option */
  BP_PINS_ENV,      /* the registry's default pins (the CLI's BP_KERNELS) */
  BP_PINS_MODEL,    /* the model file */
} bp_pin_source;

/* The pins in effect by the precedence above: `option` when not NULL, else
 * the registry's default pins when it has some (registry may be NULL: none),
 * else `model` when not NULL or "". Returns "" for no pins, never NULL; the
 * string is borrowed (from the arguments or the registry). *source_out
 * (optional) says which it was. */
const char *bp_registry_resolve_pins(const bp_registry *registry, const char *option,
                                     const char *model, bp_pin_source *source_out);
/* bp_registry_resolve_pins(NULL, option, model, source_out). */
const char *bp_pins_resolve(const char *option, const char *model, bp_pin_source *source_out);
/* "none", "option", "BP_KERNELS", "model file". */
const char *bp_pin_source_name(bp_pin_source source);

/* Checks `pins` against the registered kernels (see above). `source`
 * names where they came from in messages (e.g. "--kernels"). Errors are
 * one line (bp_last_error); warnings, one line each ending in '\n', go to
 * `warnings` (optional; "" when none, truncated to warnings_size). */
bp_status bp_registry_check_pins(const bp_registry *registry, const char *pins,
                                 const char *source, char *warnings, size_t warnings_size);

/* A tuner: what picks among the kernels that support a node when
 * bp_select_options.autotune asks for it. Selection itself never times,
 * forks or writes files; a tuner may (the autotuner, autotune.h, beside
 * validate, does all three). pick receives the candidates that support
 * the node, in preference order, and writes *winner_out (an index into
 * cands, or -1: every candidate failed its checks and the reference
 * kernel runs) and what it did, one line per candidate, into report. */
typedef struct bp_select_tuner {
  void *ctx; /* handed over: destroy(ctx) when replaced or at bp_registry_destroy */
  bp_status (*pick)(void *ctx, bp_registry *registry, const char *op, const char *device,
                    int device_index, const bp_abi_kernel_args *args,
                    const bp_registered_kernel *const *cands, int n, const char *cache_path,
                    const char *node, int *winner_out, char *report, size_t report_size);
  void (*destroy)(void *ctx); /* (optional) */
} bp_select_tuner;

/* Installs `tuner` (copied; NULL removes the one installed), destroying
 * the one it replaces. Not while another thread selects. */
bp_status bp_registry_set_tuner(bp_registry *registry, const bp_select_tuner *tuner);
/* The installed tuner, or NULL. */
const bp_select_tuner *bp_registry_tuner(const bp_registry *registry);

/* A checker: what selection asks about the kernels it picks without
 * timing them (the kernel checks of kernel_checks.h, beside validate, are
 * one). Selection itself never runs kernels; a checker may.
 *   pinned: kernel k was picked for the node by a pin; returns 1 to keep
 *     it, 0 to refuse it (selection then fails with why, one line).
 *   by_priority (optional): kernel pool[0] was picked by priority (nothing
 *     pinned, no autotune) among the m kernels that support the node, in
 *     preference order; the checker may note what it finds (it cannot
 *     change the pick). */
typedef struct bp_select_checker {
  void *ctx; /* handed over: destroy(ctx) when replaced or at bp_registry_destroy */
  int (*pinned)(void *ctx, bp_registry *registry, const char *op, const char *device,
                const bp_abi_kernel_args *args, const bp_registered_kernel *k, const char *node,
                char *why, size_t why_size);
  void (*by_priority)(void *ctx, bp_registry *registry, const char *op, const char *device,
                      const bp_abi_kernel_args *args, const bp_registered_kernel *const *pool,
                      int m, const char *node);
  void (*destroy)(void *ctx); /* (optional) */
} bp_select_checker;

/* Installs `checker` (copied; NULL removes the one installed), destroying
 * the one it replaces. Not while another thread selects. */
bp_status bp_registry_set_checker(bp_registry *registry, const bp_select_checker *checker);
/* The installed checker, or NULL. */
const bp_select_checker *bp_registry_checker(const bp_registry *registry);

/* Selection policy for one node. */
typedef struct bp_select_options {
  /* Pins (see above). NULL: BP_KERNELS from the environment; "": none. */
  const char *pins;
  int autotune;               /* ask the registry's tuner (bp_registry_set_tuner) to pick */
  const char *autotune_cache; /* cache file path (NULL: no cache) */
  /* (optional) receives one line per candidate saying why it was or was not
   * picked, NUL-terminated and truncated to report_size. */
  char *report;
  size_t report_size;
  /* (optional) the node's name, for messages (autotune names the kernels
   * it excludes: "autotune: excluded <op>/<impl> for node '<node>': why") */
  const char *node;
  /* Which device of the node's device plugin autotune times on (its
   * streams, events and workspace); the executor's device_index. */
  int device_index;
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
 * outputs must be in a kernel's dtype mask. With autotune (and the
 * autotuner of autotune.h installed),
 * args must carry the node's real pointers: every supporting kernel runs
 * on them (outputs, and input 0 of IN_PLACE kernels, are overwritten), timed
 * with the device's events when a device plugin of that kind is
 * registered, else with CLOCK_MONOTONIC. Before timing, every candidate
 * runs validate's checks on the node's shapes against the reference kernel
 * (validate.h; in scratch buffers): one that fails is excluded, named in
 * the report and in a warning line on stderr, and never picked; when all
 * fail, the reference kernel is picked. The cache file is text, one line
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
