/* Arena: one allocation per rank of the plan's total size. The pointer of a
 * tensor on a rank is base + offset; nothing else is allocated per step. */
#ifndef BLUEPRINT_ARENA_H
#define BLUEPRINT_ARENA_H

#include <stddef.h>

#include "blueprint/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ARENA_ALIGN 256

/* Where arena memory comes from. Device plugins provide their own (the ABI
 * issue); bp_host_allocator() serves plain host memory. */
typedef struct bp_arena_allocator {
  const char *name; /* "host", "cuda", ... */
  /* Returns `bytes` bytes aligned to `alignment` or NULL. */
  void *(*alloc)(void *user, size_t bytes, size_t alignment);
  /* Frees a block `alloc` returned; never called with NULL. */
  void (*free)(void *user, void *ptr, size_t bytes);
  void *user;       /* passed through, borrowed */
} bp_arena_allocator;

/* 256-byte aligned host memory, zero-filled. */
const bp_arena_allocator *bp_host_allocator(void);

typedef struct bp_arena bp_arena; /* opaque */

/* Allocates the arena of `plan` (finalized) for `rank` through `allocator`
 * (borrowed; must outlive the arena). */
bp_status bp_arena_create(const bp_plan *plan, const bp_arena_allocator *allocator, int rank,
                          bp_arena **arena_out);
void bp_arena_destroy(bp_arena *arena); /* NULL is a no-op */

void *bp_arena_base(const bp_arena *arena);
size_t bp_arena_bytes(const bp_arena *arena);
int bp_arena_rank(const bp_arena *arena);
/* base + t->offset. */
void *bp_arena_ptr(const bp_arena *arena, const bp_dtensor *t);

#ifdef __cplusplus
}
#endif
#endif
