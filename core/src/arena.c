/* Arenas: one aligned allocation per rank, addressed by plan offsets. */
#include "blueprint/arena.h"

#include <stdlib.h>
#include <string.h>

struct bp_arena {
  const bp_arena_allocator *allocator;
  void *base;
  size_t bytes;
  int rank;
};

static void *host_alloc(void *user, size_t bytes, size_t alignment) {
  (void)user;
  void *p = NULL;
  /* posix_memalign accepts any size; round to keep aligned_alloc's rule too */
  if (posix_memalign(&p, alignment, bytes ? bytes : alignment) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

static void host_free(void *user, void *ptr, size_t bytes) {
  (void)user;
  (void)bytes;
  free(ptr);
}

const bp_arena_allocator *bp_host_allocator(void) {
  static const bp_arena_allocator host = {"host", host_alloc, host_free, NULL};
  return &host;
}

bp_status bp_arena_create(const bp_plan *plan, const bp_arena_allocator *allocator, int rank,
                          bp_arena **arena_out) {
  if (!plan || !allocator || !arena_out)
    return bp_fail(BP_ERR_INVALID, "bp_arena_create: NULL argument");
  if (!bp_plan_is_finalized(plan))
    return bp_fail(BP_ERR_STATE, "arena of a plan that is not finalized");
  bp_arena *a = calloc(1, sizeof *a);
  if (!a) return bp_fail(BP_ERR_NOMEM, "out of memory creating an arena");
  a->allocator = allocator;
  a->bytes = (size_t)bp_plan_total_bytes(plan);
  a->rank = rank;
  a->base = allocator->alloc(allocator->user, a->bytes, BP_ARENA_ALIGN);
  if (!a->base || ((uintptr_t)a->base % BP_ARENA_ALIGN) != 0) {
    if (a->base) allocator->free(allocator->user, a->base, a->bytes);
    size_t bytes = a->bytes;
    free(a);
    return bp_fail(BP_ERR_NOMEM, "%s allocator could not give rank %d an arena of %zu bytes",
                   allocator->name, rank, bytes);
  }
  *arena_out = a;
  return BP_OK;
}

void bp_arena_destroy(bp_arena *a) {
  if (!a) return;
  a->allocator->free(a->allocator->user, a->base, a->bytes);
  free(a);
}

void *bp_arena_base(const bp_arena *a) { return a->base; }
size_t bp_arena_bytes(const bp_arena *a) { return a->bytes; }
int bp_arena_rank(const bp_arena *a) { return a->rank; }
void *bp_arena_ptr(const bp_arena *a, const bp_dtensor *t) { return (char *)a->base + t->offset; }
