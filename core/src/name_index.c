/* Name look-ups by hash (name-index-impl.h): FNV-1a, open addressing. */
#include "name-index-impl.h"

#include <stdlib.h>
#include <string.h>

static uint32_t hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

int bp_name_index_init(bp_name_index *x, const void *names, size_t stride, int count) {
  uint32_t cap = 16;
  while (cap < 2u * (uint32_t)(count > 0 ? count : 1)) cap *= 2;
  x->base = names;
  x->stride = stride;
  x->cap = cap;
  x->slots = calloc(cap, sizeof *x->slots);
  return x->slots ? 0 : -1;
}

static const char *name_of(const bp_name_index *x, int i) {
  return x->base + (size_t)i * x->stride;
}

int bp_name_index_add(bp_name_index *x, int i) {
  const char *name = name_of(x, i);
  uint32_t k = hash(name) & (x->cap - 1);
  for (; x->slots[k]; k = (k + 1) & (x->cap - 1))
    if (strcmp(name_of(x, x->slots[k] - 1), name) == 0) return x->slots[k] - 1;
  x->slots[k] = i + 1;
  return -1;
}

int bp_name_index_find(const bp_name_index *x, const char *name) {
  for (uint32_t k = hash(name) & (x->cap - 1); x->slots[k]; k = (k + 1) & (x->cap - 1))
    if (strcmp(name_of(x, x->slots[k] - 1), name) == 0) return x->slots[k] - 1;
  return -1;
}

void bp_name_index_free(bp_name_index *x) {
  free(x->slots);
  x->slots = NULL;
}
