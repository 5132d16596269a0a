/* String and list helpers (strutil-impl.h). */
#include "strutil-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bp_ptr_list_reserve(bp_ptr_list *list, int extra) {
  if (list->count + extra <= list->cap) return 0;
  int cap = list->cap ? list->cap : 8;
  while (cap < list->count + extra) cap *= 2;
  void **items = realloc(list->items, (size_t)cap * sizeof *items);
  if (!items) return -1;
  list->items = items;
  list->cap = cap;
  return 0;
}

int bp_ptr_list_push(bp_ptr_list *list, void *item) {
  if (bp_ptr_list_reserve(list, 1) != 0) return -1;
  list->items[list->count++] = item;
  return 0;
}

char *bp_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void bp_strcatf(char *buf, size_t size, const char *fmt, ...) {
  size_t used = strnlen(buf, size);
  if (used + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, size - used, fmt, ap);
  va_end(ap);
}
