/* The loader (loader.c): one module file from dlopen up to a descriptor
 * the host can trust, and the record of that attempt. It knows nothing of
 * the registry (registry-impl.h builds on it, never the other way), so the
 * loader, the registry and autotuning include no header in a circle. Not
 * installed. */
#ifndef BLUEPRINT_LOADER_IMPL_H
#define BLUEPRINT_LOADER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "blueprint/registry.h"

/* Largest struct_size the host believes; anything bigger is garbage. */
#define BP_ABI_STRUCT_MAX 65536u

/* Bytes a message buffer holds (reasons, refusals). */
#define BP_REASON_MAX 512

/* Copies an ABI struct written by a module: zero-fills `dst_size` bytes,
 * then copies min(dst_size, src's struct_size) bytes from src. Returns the
 * writer's struct_size. Fields the writer lacks read as 0/NULL. */
uint32_t bp_abi_copy(void *dst, size_t dst_size, const void *src);
/* Bytes up to the end of `field`: the least struct_size that holds it. */
#define BP_ABI_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* One load attempt; `pub` comes first so it converts to bp_load_record. */
typedef struct bp_reg_record {
  bp_load_record pub;   /* strings below are owned through these pointers */
  bp_status status;     /* what bp_registry_load returned for it */
  dev_t dev;            /* identity of the file, when has_id */
  ino_t ino;
  int has_id;
} bp_reg_record;

/* A record for `path` with nothing known yet (refused at OPEN, versions
 * unknown). NULL when out of memory. */
bp_reg_record *bp_record_new(const char *path);
/* Frees the record and the strings it owns; NULL is a no-op. */
void bp_record_free(bp_reg_record *rec);
/* Sets a record's message (copied). 0 on success, -1 out of memory. */
int bp_record_set_message(bp_reg_record *rec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Points every string nothing was said about at "" (before publishing). */
void bp_record_fill_empty(bp_reg_record *rec);

/* Opens `path` (resolved, absolute) up to the module's descriptor: dlopen,
 * dlsym of the entry, struct_size sanity, major and minor checks. On
 * success *handle_out and *desc_out are set and rec's module fields filled.
 * On refusal the handle is closed, rec->pub.stage, message and versions say
 * why, and the status is returned. */
bp_status bp_loader_open(const char *path, bp_reg_record *rec, void **handle_out,
                         bp_abi_module *desc_out);

#endif
