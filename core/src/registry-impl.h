/* Internals shared by the loader (loader.c), the registry (registry.c),
 * staged registration (registry_stage.c), discovery (discover.c), the
 * built-in op table (builtin_ops.c), selection (select.c) and autotuning
 * (autotune.c). Not installed.
 *
 * Invariants (checked where they can break):
 *  1. Everything the registry hands out (ops, kernels, devices, records,
 *     search dirs) is individually allocated and stays at its address until
 *     bp_registry_destroy.
 *  2. A module's items reach the public lists only through bp_stage_commit,
 *     which cannot fail once it starts (capacity is reserved first).
 *  3. Every kernel's op exists in the op list; no two kernels share
 *     (op, impl, device); no two ops share a name; no two devices a kind.
 *  4. Strings inside copied ABI structs point into a module that stays
 *     loaded until destroy; strings in records are the registry's copies. */
#ifndef BLUEPRINT_REGISTRY_IMPL_H
#define BLUEPRINT_REGISTRY_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "blueprint/registry.h"

/* Path shown for what the host registers itself. */
#define BP_BUILTIN_PATH "<builtin>"

/* Largest struct_size the host believes; anything bigger is garbage. */
#define BP_ABI_STRUCT_MAX 65536u

/* Bytes a message buffer holds (reasons, refusals). */
#define BP_REASON_MAX 512

/* Aborts with file and line when an internal invariant breaks (STYLE.md 5). */
#define BP_REG_ASSERT(cond)                                                               \
  do {                                                                                    \
    if (!(cond)) bp_registry_assert_fail(#cond, __FILE__, __LINE__);                      \
  } while (0)
void bp_registry_assert_fail(const char *what, const char *file, int line)
    __attribute__((noreturn));

/* A growable array of owned pointers. */
typedef struct bp_ptr_list {
  void **items;
  int count, cap;
} bp_ptr_list;
/* Makes room for `extra` more items; 0 on success, -1 out of memory. */
int bp_ptr_list_reserve(bp_ptr_list *list, int extra);
/* Appends; 0 on success, -1 out of memory (list unchanged). */
int bp_ptr_list_push(bp_ptr_list *list, void *item);

/* Copies an ABI struct written by a module: zero-fills `dst_size` bytes,
 * then copies min(dst_size, src's struct_size) bytes from src. Returns the
 * writer's struct_size. Fields the writer lacks read as 0/NULL. */
uint32_t bp_abi_copy(void *dst, size_t dst_size, const void *src);
/* Bytes up to the end of `field`: the least struct_size that holds it. */
#define BP_ABI_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

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
} bp_reg_module;

/* One load attempt; `pub` comes first so it converts to bp_load_record. */
typedef struct bp_reg_record {
  bp_load_record pub;   /* strings below are owned through these pointers */
  bp_status status;     /* what bp_registry_load returned for it */
  dev_t dev;            /* identity of the file, when has_id */
  ino_t ino;
  int has_id;
} bp_reg_record;

/* Registrations of the module whose init is running. */
typedef struct bp_stage {
  int active;               /* 1 only while a module's init runs */
  const char *path;         /* that module's path (borrowed) */
  bp_ptr_list ops;          /* bp_reg_op *, owned until commit */
  bp_ptr_list kernels;      /* bp_registered_kernel *, owned until commit */
  bp_ptr_list devices;      /* bp_reg_device *, owned until commit */
  int failed;               /* a registration was refused */
  char reason[BP_REASON_MAX];     /* the first refusal */
  char init_error[BP_REASON_MAX]; /* the last host->error() text */
} bp_stage;

typedef struct bp_autotune_cache bp_autotune_cache; /* autotune.c */

struct bp_registry {
  bp_abi_host host;      /* lent to every module's init; ctx is the registry */
  bp_stage stage;
  bp_ptr_list modules;   /* bp_reg_module *, load order */
  bp_ptr_list records;   /* bp_reg_record *, attempt order */
  bp_ptr_list ops;       /* bp_reg_op *, built-ins first */
  bp_ptr_list kernels;   /* bp_registered_kernel *, registration order */
  bp_ptr_list devices;   /* bp_reg_device * */
  bp_ptr_list dirs;      /* bp_search_dir *, with owned path strings */
  int next_load_index;
  pthread_mutex_t tune_lock; /* guards `tune` */
  bp_autotune_cache *tune;
};

/* ---- loader.c ------------------------------------------------------------ */

/* Opens `path` (resolved, absolute) up to the module's descriptor: dlopen,
 * dlsym of the entry, struct_size sanity, major and minor checks. On
 * success *handle_out and *desc_out are set and rec's module fields filled.
 * On refusal the handle is closed, rec->pub.stage, message and versions say
 * why, and the status is returned. */
bp_status bp_loader_open(const char *path, bp_reg_record *rec, void **handle_out,
                         bp_abi_module *desc_out);

/* ---- registry.c ------------------------------------------------------------ */

/* Sets a record's message (copied). 0 on success, -1 out of memory. */
int bp_record_set_message(bp_reg_record *rec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* strdup that returns NULL for NULL. */
char *bp_strdup(const char *s);
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

/* ---- builtin_ops.c ----------------------------------------------------- */

/* The host's own op kinds, registered at bp_registry_create. */
const bp_abi_op *bp_builtin_ops(int *count_out);

/* ---- autotune.c ----------------------------------------------------------- */

/* Picks the fastest of `cands` (all support args; ordered by preference, so
 * ties keep the earlier one) for args on `device`: a valid cache line
 * wins, else every candidate is timed and the cache rewritten (cache_path
 * NULL: kept in memory only). Writes *winner_out (index into cands) and
 * what it did, one line per candidate, into report (NUL-terminated). */
bp_status bp_autotune_pick(bp_registry *r, const char *op, const char *device,
                           const bp_abi_kernel_args *args, const bp_registered_kernel *const *cands,
                           int n, const char *cache_path, int *winner_out, char *report,
                           size_t report_size);
void bp_autotune_cache_free(bp_autotune_cache *cache); /* NULL is a no-op */

/* Appends printf text to buf (size) after what it holds; truncates. */
void bp_strcatf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));


#endif
