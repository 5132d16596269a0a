/* A hash index of names held in an array of records (layers, ...), so
 * that duplicate checks and look-ups by name are O(1) rather than a scan
 * per name (quadratic for 10,000 layers). Not installed. */
#ifndef BLUEPRINT_NAME_INDEX_IMPL_H
#define BLUEPRINT_NAME_INDEX_IMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct bp_name_index {
  const char *base; /* the name of record i is at base + i * stride */
  size_t stride;
  int32_t *slots;   /* record + 1, 0 empty; cap is a power of two */
  uint32_t cap;
} bp_name_index;

/* An empty index for up to `count` records; 0, or -1 out of memory. */
int bp_name_index_init(bp_name_index *x, const void *names, size_t stride, int count);
/* Adds record i (records are added in increasing order); returns the
 * earlier record of the same name, or -1 when the name is new. */
int bp_name_index_add(bp_name_index *x, int i);
/* The first record added under `name`, or -1. */
int bp_name_index_find(const bp_name_index *x, const char *name);
void bp_name_index_free(bp_name_index *x);

#endif
